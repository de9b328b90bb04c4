"""The runtime registry: register, parse, discovery and unavailability.

Runtimes registered here are throwaway (``_register`` removes them after the
test). Discovery through entry points and the environment variable happens at
import time, so those tests run a fresh interpreter on a tiny module written to
``tmp_path`` (bounded by a timeout).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bench import runtimes
from bench.runtimes import Difference, RuntimeInfo, UsageError

REPO = Path(__file__).resolve().parent.parent
SUBPROCESS_S = 60


@pytest.fixture
def registered():
    """Register throwaway runtimes; each is removed after the test."""
    ids = []

    def register(info):
        info = runtimes.register(info)
        ids.append(info.id)
        return info
    yield register
    for rid in ids:
        runtimes.unregister(rid)


def _coro_like(rid: str, **kw) -> RuntimeInfo:
    return RuntimeInfo(rid, "task", "protocols.ports:CoroPort", runtimes.get("coro").options, **kw)


def test_the_nine_builtins_are_registered_with_their_facts():
    builtin = {rid: info for rid, info in runtimes.RUNTIMES.items() if info.origin == "builtin"}
    assert list(builtin) == ["callback", "hybrid", "coro", "asyncio-protocol", "asyncio-streams",
                             "uvloop-protocol", "uvloop-streams", "curio", "trio"]
    assert [rid for rid, info in builtin.items() if info.ours] == ["callback", "hybrid", "coro"]
    assert runtimes.get("coro").primary_reference == "curio"
    assert runtimes.get("trio").primary_reference is None
    for info in builtin.values():
        assert info.options.names(), info.id
        for ref in info.compared_with:
            assert runtimes.get(ref).style == info.style


def test_register_adds_a_runtime_that_parses_and_runs(registered):
    info = registered(_coro_like("mine", summary="coro under another name"))
    assert info.origin == f"module {__name__}"          # who called register()
    rt = runtimes.parse("mine:spawn=eager")
    assert rt.spec == "mine:spawn=eager" and rt.style == "task" and not rt.ours

    async def main(port):
        await port.sleep(0)
        return port.runtime.id
    with rt.open() as port:
        assert port.run(main) == "mine"
    assert "mine" in [r.id for r in runtimes.parse_list("all")]


def test_a_clash_with_an_existing_id_is_one_usage_error(registered):
    with pytest.raises(UsageError, match=r"runtime 'coro' is already registered \(from builtin\)"):
        runtimes.register(_coro_like("coro"))
    registered(_coro_like("twice"))
    with pytest.raises(UsageError, match="already registered"):
        runtimes.register(_coro_like("twice"))


@pytest.mark.parametrize("kw, words", [
    (dict(id="a:b"), "id 'a:b'"),
    (dict(style="push"), "style 'push'"),
    (dict(port="protocols.ports.CoroPort"), "package.module:Class"),
    (dict(options={"spawn": "lazy"}), "Schema"),
    (dict(probe_side="bench.fidelity.coro.CoroSide"), "probe_side"),
    (dict(tracing="trace=true"), "tracing must be"),
    (dict(tracing=runtimes.Tracing(port="nocolon")), "tracing port"),
    (dict(tasks="protocols.trio_curio_ports.trio_tasks"), "package.module:function"),
])
def test_register_refuses_a_malformed_runtime(kw, words):
    fields = dict(id="bad", style="task", port="protocols.ports:CoroPort",
                  options=runtimes.get("coro").options)
    fields.update(kw)
    with pytest.raises(UsageError, match=re.escape(words)):
        runtimes.register(RuntimeInfo(**fields))
    assert "bad" not in runtimes.RUNTIMES and "a:b" not in runtimes.RUNTIMES


@pytest.mark.parametrize("spec, words", [
    ("callback:high_water=lots", "runtime callback: bad value 'lots' for option high_water: must be"),
    ("coro:nosuch=1", "runtime coro: unknown option 'nosuch'; valid options: io_schedule_point,"),
    ("hybrid:spawn", "runtime hybrid: option 'spawn' needs a value"),
    ("callback:low_water=10,high_water=5", "runtime callback: low_water (10) must not exceed"),
    ("trio:instrument=maybe", "runtime trio: bad value 'maybe' for option instrument"),
])
def test_a_bad_option_is_one_usage_error_line_naming_the_runtime(spec, words):
    with pytest.raises(UsageError) as info:
        runtimes.parse(spec)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(words), message


def test_option_errors_name_the_runtime_not_the_schema_it_borrowed(registered):
    registered(_coro_like("borrowed"))
    with pytest.raises(UsageError, match=r"^runtime borrowed: bad value 'x' for option cancel"):
        runtimes.parse("borrowed:cancel=x")


def test_the_water_mark_rule_lives_in_the_schema():
    assert runtimes.parse("callback:high_water=1000").options["low_water"] == 250
    assert runtimes.parse("hybrid:low_water=20000").options["high_water"] == 80000
    assert runtimes.parse("callback:low_water=100").options["high_water"] == 65536


def test_an_unknown_runtime_lists_the_valid_ones():
    with pytest.raises(UsageError) as info:
        runtimes.parse("nosuch:x=1")
    assert str(info.value) == ("unknown runtime 'nosuch'; valid runtimes: "
                               + ", ".join(runtimes.RUNTIMES))


def test_primary_reference_is_only_for_default_options():
    assert runtimes.parse("hybrid").primary_reference == "asyncio-streams"
    assert runtimes.parse("hybrid:spawn=eager").primary_reference is None
    assert runtimes.parse("asyncio-streams").primary_reference is None


def test_a_runtime_whose_port_does_not_import_is_unavailable_with_the_reason(registered):
    registered(RuntimeInfo("ghost", "task", "looplab_no_such_module:Port",
                           runtimes.get("trio").options))
    registered(RuntimeInfo("needy", "task", "protocols.ports:CoroPort",
                           runtimes.get("coro").options, requires=("looplab_no_such_lib",)))
    registered(RuntimeInfo("typo", "task", "protocols.ports:NoSuchPort",
                           runtimes.get("coro").options))
    ok, missing = runtimes.available_runtimes(runtimes.parse_list("ghost,needy,typo,coro"))
    assert [rt.id for rt in ok] == ["coro"]
    assert "looplab_no_such_module" in missing["ghost"] and "ModuleNotFoundError" in missing["ghost"]
    assert missing["needy"].startswith("looplab_no_such_lib is not importable")
    assert "NoSuchPort" in missing["typo"]
    with pytest.raises(runtimes.Unavailable, match="runtime ghost is unavailable"):
        runtimes.parse("ghost").open()


def test_declared_differences_are_data_on_the_runtime(registered):
    info = registered(_coro_like("differs", differences={
        "send_after_eof": ("BrokenPipeError", "no closed state")}))
    assert info.difference("send_after_eof") == Difference("BrokenPipeError", "no closed state")
    assert info.difference("reset_send") is None


# ---------------------------------------------------------------------------
# Discovery: load_plugins in this process, entry points and the environment in a fresh one.

_PLUGIN = '''
from bench import runtimes
from bench.runtimes import RuntimeInfo
runtimes.register(RuntimeInfo("{rid}", "task", "protocols.ports:CoroPort",
                              runtimes.get("coro").options, summary="from a plugin"))
'''


def test_load_plugins_imports_each_module_once(tmp_path, monkeypatch, registered):
    (tmp_path / "looplab_tiny_plugin.py").write_text(_PLUGIN.format(rid="tiny-plugin"))
    (tmp_path / "looplab_broken_plugin.py").write_text("raise RuntimeError('half-written')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        loaded = runtimes.load_plugins("looplab_tiny_plugin")
        assert runtimes.get("tiny-plugin").origin == "module looplab_tiny_plugin"
        assert loaded[-1] == "looplab_tiny_plugin" and runtimes.plugin_modules() == loaded
        assert runtimes.load_plugins(["looplab_tiny_plugin"]) == loaded      # no second import
        with pytest.raises(UsageError) as info:
            runtimes.load_plugins(["looplab_broken_plugin"])
        assert str(info.value) == ("runtime module 'looplab_broken_plugin' does not import: "
                                   "RuntimeError: half-written")
        assert "looplab_broken_plugin" not in runtimes.plugin_modules()
    finally:
        runtimes.unregister("tiny-plugin")
        runtimes.registry._loaded_modules.remove("looplab_tiny_plugin")
        for name in ("looplab_tiny_plugin", "looplab_broken_plugin"):
            sys.modules.pop(name, None)


def _fresh_python(code: str, tmp_path: Path, ok: bool = True, **env) -> str:
    environ = {k: v for k, v in os.environ.items() if k != runtimes.ENV_VAR}
    environ.update(env)
    environ["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(REPO)])
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=environ,
                          capture_output=True, text=True, timeout=SUBPROCESS_S, cwd=tmp_path)
    assert (proc.returncode == 0) == ok, proc.stderr
    return proc.stdout + proc.stderr


_SHOW = """
from bench import runtimes
from bench.errors import UsageError
try:
    for rid, info in runtimes.RUNTIMES.items():
        if info.origin != "builtin":
            print(rid, "|", info.origin, "|", runtimes.parse(rid).unavailable_reason())
except UsageError as exc:
    raise SystemExit(f"looplab: {exc}")
print("modules:", runtimes.plugin_modules())
"""


def test_the_environment_variable_loads_modules_and_a_broken_one_is_a_usage_error(tmp_path):
    """One rule for a module the user names, in the variable or with --runtime-module:
    one that does not import stops the command with one line naming it."""
    (tmp_path / "envkernel.py").write_text(_PLUGIN.format(rid="env-kernel"))
    (tmp_path / "envbroken.py").write_text("import looplab_no_such_dependency\n")
    out = _fresh_python(_SHOW, tmp_path, LOOPLAB_RUNTIME_MODULES="envkernel")
    assert "env-kernel | module envkernel | None" in out
    assert "modules: ['envkernel']" in out
    out = _fresh_python(_SHOW, tmp_path, ok=False, LOOPLAB_RUNTIME_MODULES="envkernel, envbroken")
    assert out.strip() == ("looplab: runtime module (from LOOPLAB_RUNTIME_MODULES) 'envbroken' "
                           "does not import: ModuleNotFoundError: No module named "
                           "'looplab_no_such_dependency'")


def _entry_points(tmp_path, lines: str):
    dist = tmp_path / "epkernel-1.0.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: epkernel\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[looplab.runtimes]\n" + lines)


def test_an_entry_point_registers_by_module_or_by_callable(tmp_path):
    (tmp_path / "epkernel.py").write_text(_PLUGIN.format(rid="ep-module") + textwrap.dedent('''
        def more():
            return RuntimeInfo("ep-callable", "task", "looplab_missing_port:Port",
                               runtimes.get("coro").options)
        def broken():
            raise RuntimeError("cannot register")
        '''))
    _entry_points(tmp_path, "mod = epkernel\nfn = epkernel:more\n")
    out = _fresh_python(_SHOW, tmp_path)
    assert "ep-module | entry point mod (epkernel) | None" in out
    assert re.search(r"ep-callable \| entry point fn \(epkernel\) \| port "
                     r"looplab_missing_port:Port does not load \(ModuleNotFoundError", out), out
    assert "modules: []" in out
    _entry_points(tmp_path, "mod = epkernel\nbad = epkernel:broken\n")
    out = _fresh_python(_SHOW, tmp_path, ok=False)
    assert out.strip() == "looplab: entry point bad (epkernel): RuntimeError: cannot register"


def test_no_runtime_id_dispatch_outside_the_runtime_definitions():
    """Behaviour hangs off RuntimeInfo attributes and port classes, never off
    comparing a runtime's id with a literal."""
    pattern = re.compile(r"rid ==|runtime\.id ==|\.id in \(|rid\.startswith|\.id\.startswith")
    hits = []
    for path in sorted((REPO / "protocols").rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                hits.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert hits == []


def test_registration_points_one_way():
    """bench.runtimes never imports bench.runtimes.builtin: the package imports the
    built-ins, which register through the registry like a plugin does."""
    import ast
    import pathlib
    source = pathlib.Path(runtimes.__file__).read_text()
    assert "bench.runtimes.builtin" not in {
        getattr(n, "module", None) for n in ast.walk(ast.parse(source))} | {
        c.value for c in ast.walk(ast.parse(source)) if isinstance(c, ast.Constant)}
    assert runtimes.get("coro").origin == "builtin"
    # comparison tables put each runtime that names references right before them
    order = runtimes.ordered()
    first = runtimes.get(order[0])
    assert order[1:1 + len(first.compared_with)] == list(first.compared_with)
    assert sorted(order) == sorted(r for r, i in runtimes.RUNTIMES.items() if i.variant_of is None)


def test_a_spec_is_parsed_once_and_travels_to_the_cell_as_data(monkeypatch, tmp_path):
    """looplab run parses --runtimes once; the cell's process gets the parsed runtime as
    data (``Runtime.to_data``) and rebuilds it without parsing text."""
    import json
    from bench import cli
    from bench.host import procs
    from bench.runtimes import spec as specmod
    parsed, launched = [], []
    real_parse, real_spawn = specmod.parse, procs.spawn

    def counting_parse(text):
        parsed.append(text)
        return real_parse(text)

    def recording_spawn(cmd, *a, **kw):
        if "bench.scenarios.appside" in cmd:
            launched.append(json.loads(cmd[cmd.index("bench.scenarios.appside") + 1]))
        return real_spawn(cmd, *a, **kw)
    monkeypatch.setattr(specmod, "parse", counting_parse)
    monkeypatch.setattr(procs, "spawn", recording_spawn)
    from bench.report import render     # no plot: matplotlib keeps its font file open
    monkeypatch.setattr(render, "plot", lambda doc, out_dir: [])
    rc = cli.main(["run", "--scenarios", "S3", "--variants", "naive", "--runtimes",
                   "callback:high_water=32KiB", "--preset", "tiny", "--out", str(tmp_path / "o")])
    assert rc == 0
    assert parsed == ["callback:high_water=32KiB"]
    assert launched and all(spec["runtime"] == {"id": "callback", "options": launched[0]["runtime"]["options"],
                                                "interpreter": None, "loop_options": {}, "pins": []}
                            for spec in launched)
    assert launched[0]["runtime"]["options"]["high_water"] == 32 * 1024
    rebuilt = runtimes.from_data(launched[0]["runtime"])
    assert rebuilt.spec == real_parse("callback:high_water=32KiB").spec
    assert parsed == ["callback:high_water=32KiB"]        # from_data parsed nothing


def test_a_kernel_written_against_the_first_release_paths_still_registers(tmp_path):
    """protocols.runtimes was the registry's first home: a plugin importing it runs
    unchanged, whichever way looplab loads it."""
    (tmp_path / "oldkernel.py").write_text(textwrap.dedent('''
        from protocols import runtimes
        from protocols.runtimes import RuntimeInfo, register
        register(RuntimeInfo("old-kernel", "task", "protocols.ports:CoroPort",
                             runtimes.get("coro").options, summary="first-release paths"))
        '''))
    out = _fresh_python(_SHOW, tmp_path, LOOPLAB_RUNTIME_MODULES="oldkernel")
    assert "old-kernel | module oldkernel | None" in out
