"""The two axes of a runtime spec: the interpreter (``@3.12``, ``@/path``) and the
asyncio loop (``loop=NAME``, ``loop=MODULE:FACTORY``, ``loop.NAME=VALUE``, ``eager``).

The grammar tests are in-process and fast. A user's loop is a ``SelectorEventLoop``
subclass written here, imported through PYTHONPATH by ``looplab run``. Building an
environment takes ~20 s, so one session-scoped fixture builds at most one (for an
interpreter other than this one, in a temporary cache) and every environment test
reuses it; it skips with the reason when no other interpreter is found.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bench.host import envs
from bench import runtimes
from bench.runtimes import UsageError

REPO = Path(__file__).resolve().parent.parent
RUN_S = 240

USER_LOOP = '''
import asyncio, os

class MarkingLoop(asyncio.SelectorEventLoop):
    """A user's loop: asyncio's selector loop that notes each time it is made."""

def new_loop(mark=None, tag="none"):
    if mark:
        with open(mark, "a") as f:
            f.write(f"{os.getpid()} {tag}\\n")
    return MarkingLoop()

def not_a_loop():
    return object.__new__(type("Half", (), {"close": lambda self: None}))
'''


def _looplab(args, env=None, timeout=RUN_S):
    return subprocess.run([sys.executable, "-m", "bench", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=env)


@pytest.fixture
def user_loop(tmp_path, monkeypatch):
    (tmp_path / "userloop_mod.py").write_text(USER_LOOP)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("userloop_mod", None)


# ---------------------------------------------------------------------------
# The grammar

@pytest.mark.parametrize("spec, canonical, interp, loop_opts", [
    ("asyncio-streams@3.12", "asyncio-streams@3.12", "3.12", {}),
    ("trio@3.12:instrument=false", "trio@3.12:instrument=false", "3.12", {}),
    ("coro@3.13.0:spawn=eager", "coro@3.13.0:spawn=eager", "3.13.0", {}),
    ("asyncio-protocol:loop=rloop", "asyncio-protocol:loop=rloop", None, {}),
    ("asyncio-streams:loop=pkg.mod:make,loop.size=3,loop.debug=true",
     "asyncio-streams:loop=pkg.mod:make,loop.debug=true,loop.size=3", None, {"size": 3, "debug": True}),
    ("asyncio-streams@/usr/bin/python3:eager=true", "asyncio-streams@/usr/bin/python3:eager=true",
     "/usr/bin/python3", {}),
])
def test_spec_grammar_round_trips(spec, canonical, interp, loop_opts):
    rt = runtimes.parse(spec)
    assert (rt.spec, rt.interpreter, rt.loop_options) == (canonical, interp, loop_opts)
    assert runtimes.parse(rt.spec).spec == rt.spec


def test_uvloop_runtimes_are_the_loop_option():
    assert runtimes.parse("asyncio-streams:loop=uvloop").spec == "uvloop-streams"
    assert runtimes.parse("asyncio-protocol@3.12:loop=uvloop,instrument=false").spec == \
        "uvloop-protocol@3.12:instrument=false"


def test_list_splits_runtimes_with_interpreters_and_loop_factories():
    text = "asyncio-streams@3.11,trio@3.12:instrument=false,asyncio-streams:loop=m:f,loop.a=b,coro"
    assert [rt.spec for rt in runtimes.parse_list(text)] == [
        "asyncio-streams@3.11", "trio@3.12:instrument=false", "asyncio-streams:loop=m:f,loop.a=b", "coro"]


@pytest.mark.parametrize("spec, words", [
    ("trio@", "needs an interpreter"),
    ("trio@3", "bad interpreter"),
    ("trio:loop=uvloop", "unknown option 'loop'"),
    ("coro:loop.x=1", "takes no loop"),
    ("asyncio-streams:loop=not a loop", "MODULE:FACTORY"),
    ("asyncio-streams:loop.=1", "loop.NAME=VALUE"),
])
def test_bad_specs_are_one_line(spec, words):
    with pytest.raises(UsageError) as info:
        runtimes.parse(spec)
    assert words in str(info.value) and "\n" not in str(info.value)


# ---------------------------------------------------------------------------
# Loops

def test_a_loop_that_cannot_carry_the_port_is_unavailable_with_the_reason(user_loop):
    assert runtimes.parse("asyncio-streams:loop=userloop_mod:new_loop").unavailable_reason() is None
    half = runtimes.parse("asyncio-streams:loop=userloop_mod:not_a_loop").unavailable_reason()
    assert "cannot carry asyncio's ports" in half and "create_server" in half
    bad_kw = runtimes.parse("asyncio-streams:loop=userloop_mod:new_loop,loop.nope=1").unavailable_reason()
    assert "nope" in bad_kw
    missing = runtimes.parse("asyncio-protocol:loop=no_such_loop_mod:make").unavailable_reason()
    assert "no_such_loop_mod" in missing


def test_a_non_selector_loop_is_declared_real_network_only(user_loop):
    assert runtimes.parse("asyncio-streams").real_network_only() is None
    why = runtimes.parse("asyncio-streams:loop=userloop_mod:new_loop").real_network_only()
    assert "simulated network" in why
    # another interpreter is no reason: its simulated cell runs in that interpreter
    assert runtimes.parse("asyncio-streams@3.12").real_network_only() is None


def test_eager_tasks_run_before_create_task_returns_or_are_refused():
    rt = runtimes.parse("asyncio-streams:eager=true")
    if sys.version_info < (3, 12):
        assert "3.12" in rt.unavailable_reason()
        with pytest.raises(UsageError, match="eager=true needs Python 3.12"):
            envs.prepare([rt])
        return
    port = rt.open()
    ran = []

    async def main():
        import asyncio

        async def child():
            ran.append("child")
        task = asyncio.get_running_loop().create_task(child())
        ran.append("returned")
        await task
    port.run(main)
    assert ran == ["child", "returned"]


def test_a_users_loop_runs_through_run_with_its_keywords(tmp_path):
    (tmp_path / "userloop_mod.py").write_text(USER_LOOP)
    mark = tmp_path / "made.txt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    spec = f"asyncio-streams:loop=userloop_mod:new_loop,loop.mark={mark},loop.tag=t7"
    out = tmp_path / "out"
    r = _looplab(["run", "--scenarios", "S1", "--variants", "naive", "--runtimes", spec,
                  "--preset", "tiny", "--out", str(out)], env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    (cell,) = json.loads((out / "results.json").read_text())["cells"]
    assert cell["runtime"] == spec and not cell["errors"]
    assert cell["environment"]["loop"]["name"] == "userloop_mod:new_loop"
    assert cell["environment"]["interpreter"]["version"] == ".".join(map(str, sys.version_info[:3]))
    made = mark.read_text().split()
    # made by the describe process and by the cell process, each with the keyword
    assert made.count("t7") >= 2 and len(set(made[::2])) >= 2


# ---------------------------------------------------------------------------
# Interpreters

def test_no_such_interpreter_lists_the_ones_found():
    with pytest.raises(UsageError) as info:
        envs.find("2.1")
    msg = str(info.value)
    assert msg.startswith("no Python 2.1 found") and "found:" in msg
    for it in envs.found():
        assert it.version in msg
    with pytest.raises(UsageError, match="no Python interpreter at"):
        envs.find("/no/such/python")


def test_an_interpreter_below_the_minimum_is_refused():
    text, least = envs._minimum()
    old = [it for it in envs.found() if envs._vtuple(it.version) < least]
    if not old:
        pytest.skip(f"no interpreter older than looplab's minimum ({text}) on this machine")
    with pytest.raises(UsageError, match="below looplab's minimum"):
        envs.find(old[0].path)


def test_found_interpreters_answer_with_their_own_version():
    here = ".".join(map(str, sys.version_info[:3]))
    assert any(it.version == here for it in envs.found()) or \
        envs.find(sys.executable).version == here


# ---------------------------------------------------------------------------
# Environments (one build per session, in a temporary cache)

def _other_interpreter():
    here = sys.version_info[:2]
    least = envs._minimum()[1]
    for it in envs.found():
        v = envs._vtuple(it.version)
        if v[:2] != here and v >= least:
            return it
    return None


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """(runtime, env) for asyncio-streams on another interpreter, built once."""
    other = _other_interpreter()
    if other is None:
        pytest.skip("no interpreter other than this one (>= looplab's minimum) was found")
    cache = tmp_path_factory.mktemp("cache")
    saved = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(cache)
    try:
        rt = runtimes.parse(f"asyncio-streams@{other.version}")
        yield rt, envs.ensure(rt), cache
    finally:
        envs.clear()
        if saved is None:
            os.environ.pop("XDG_CACHE_HOME", None)
        else:
            os.environ["XDG_CACHE_HOME"] = saved


def test_an_environment_is_built_complete_and_reused(built):
    rt, env, cache = built
    assert os.path.isfile(os.path.join(env.dir, envs.MARKER))
    root = envs.cache_root()
    assert root.startswith(str(cache))
    assert not [n for n in os.listdir(root) if n.startswith(".building-")]
    envs._envs.clear()                       # a fresh lookup finds it on disk, builds nothing
    again = envs.ensure(rt)
    assert again.dir == env.dir
    assert envs.interpreter_for(rt) == env.python
    assert [e["name"] for e in envs.cached()] == [os.path.basename(env.dir)]


def test_a_cell_records_its_interpreter_and_loop(built, tmp_path):
    rt, env, cache = built
    envv = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    out = tmp_path / "out"
    r = _looplab(["run", "--scenarios", "S1", "--variants", "naive", "--runtimes", rt.spec,
                  "--preset", "tiny", "--out", str(out)], env=envv)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "building" not in r.stderr            # reused, not rebuilt
    (cell,) = json.loads((out / "results.json").read_text())["cells"]
    assert cell["runtime"] == rt.spec and not cell["errors"]
    got = cell["environment"]
    assert got["interpreter"]["version"] == env.interpreter.version
    assert got["interpreter"]["path"] == env.python
    assert got["loop"] == {"name": "asyncio", "target": "asyncio:SelectorEventLoop",
                           "version": env.interpreter.version}
    assert "looplab" in got["libraries"]


def test_a_simulated_cell_runs_in_its_own_interpreter(built, tmp_path):
    # The world lives in one process, so a sim cell bound to another
    # interpreter runs there as a whole and its result comes back here.
    rt, env, cache = built
    envv = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    out = tmp_path / "out"
    r = _looplab(["run", "--net", "sim", "--scenarios", "S3", "--variants", "drain",
                  "--runtimes", f"{rt.spec},asyncio-streams", "--preset", "tiny",
                  "--out", str(out)], env=envv)
    assert r.returncode in (0, 1), r.stderr[-2000:]
    cells = {c["runtime"]: c for c in json.loads((out / "results.json").read_text())["cells"]}
    there, here = cells[rt.spec], cells["asyncio-streams"]
    assert not there.get("skipped") and not there["errors"], there
    assert there["net"] == "sim" and there["universe"]["net"] == here["universe"]["net"]
    assert there["universe"]["runtime"] == rt.spec        # its replay runs there again
    assert there["environment"]["interpreter"]["version"] == env.interpreter.version
    assert set(there["verdicts"]) == set(here["verdicts"]) and there["metrics"]["sim_s"] > 0


def test_a_failing_build_is_one_line_and_leaves_nothing(built, tmp_path):
    rt, env, cache = built
    empty = tmp_path / "not-a-project"
    empty.mkdir()
    with pytest.raises(UsageError) as info:
        envs.build(env.interpreter, (str(empty),))
    assert "failed to build: pip:" in str(info.value) and "\n" not in str(info.value)
    assert [e["name"] for e in envs.cached()] == [os.path.basename(env.dir)]
    assert not [n for n in os.listdir(envs.cache_root()) if n.startswith(".building-")]


def test_env_verb_lists_and_clears(built, tmp_path):
    rt, env, cache = built
    envv = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    r = _looplab(["env", "list"], env=envv, timeout=60)
    assert r.returncode == 0 and os.path.basename(env.dir) in r.stdout
    assert env.interpreter.version in r.stdout
    fake = Path(envs.cache_root()) / "py0.0-fake"
    fake.mkdir()
    (fake / envs.MARKER).write_text(json.dumps({"python": "0.0", "interpreter": "x"}))
    assert envs.clear(["py0.0-fake"]) == ["py0.0-fake"] and not fake.exists()
    assert os.path.isdir(env.dir)
    r = _looplab(["env", "build"], env=envv, timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------------------
# looplab's own loop (kernels.callback.new_event_loop) as a runtime

LOOPLAB_LOOP = ("asyncio-protocol:loop=looplab", "asyncio-streams:loop=looplab")
# Every verdict a sim cell of asyncio's ports gives (S4's probes need the real network).
SIM_SCENARIOS = "S1,S2,S3,S5,S6,S7,S8"


def _sim_results(sids, specs, variants=None) -> dict:
    """{(scenario, variant, runtime spec): result} of tiny cells on the simulated network."""
    from bench import run as scenarios
    out = {}
    for cell in scenarios.plan(sids, ",".join(specs), variants, "tiny"):
        cell.params["net"] = "sim"
        r = scenarios.run_cell(cell)
        assert not r["errors"] and not r.get("skipped"), (cell.id, r["errors"], r.get("skipped"))
        out[(cell.scenario, cell.variant, cell.runtime)] = r
    return out


def test_the_looplab_loop_reaches_the_simulated_network_through_its_seam():
    from kernels.callback import AioLoop
    from kernels.simnet import World
    from protocols import ports
    for spec in LOOPLAB_LOOP:
        assert runtimes.parse(spec).real_network_only() is None
    assert "simulated network" in runtimes.parse("asyncio-streams:loop=rloop").real_network_only()
    world = World(3)
    with ports.using_io(world.io()):
        port = runtimes.parse("asyncio-protocol:loop=looplab,loop.write=defer").open()
    try:
        assert isinstance(port.loop, AioLoop) and port.loop._io.world is world
        assert port.loop.options["write"] == "defer"
    finally:
        port.close()
    port = runtimes.parse("asyncio-protocol:loop=looplab").open()      # the real network
    try:
        assert isinstance(port.loop, AioLoop) and getattr(port.loop._io, "world", None) is None
    finally:
        port.close()


@pytest.mark.timeout(240)
def test_scenario_verdicts_on_the_looplab_loop_equal_asyncios():
    """S1-S3, S5-S8, every variant, on the simulated network: asyncio's ports on
    our loop give the verdicts they give on CPython's loop."""
    got = _sim_results(SIM_SCENARIOS, ("asyncio-protocol", "asyncio-streams") + LOOPLAB_LOOP)
    compared = 0
    for (sid, variant, spec), r in got.items():
        if ":loop=looplab" not in spec:
            continue
        ref = got[(sid, variant, spec.partition(":")[0])]
        assert r["verdicts"] and r["verdicts"] == ref["verdicts"], (sid, variant, spec)
        compared += 1
    assert compared >= 25 and {k[0] for k in got} == set(SIM_SCENARIOS.split(","))


# The S1 columns a write-buffer knob can move. (written_while_paused_bytes is left
# out: the port's transport proxy and the kernel's probe count the write that
# crosses high water on different sides of it.)
_S1_COLUMNS = ("peak_user_buffer_bytes", "pause_writing_count", "delivered_bytes",
               "queue_delay_s")


@pytest.mark.timeout(180)
def test_a_loop_knob_changes_what_it_changes_on_the_callback_kernel():
    """``loop.write=defer`` and ``loop.high_water=0`` on asyncio's Protocol port over
    our loop move S1's columns exactly as ``write=defer`` and ``high_water=0`` move
    them on the callback kernel: the same program on the same transports, in one
    simulated universe, gives the same numbers."""
    flips = ("", "write=defer", "high_water=0")
    specs = [f"callback:{f}" if f else "callback" for f in flips] + \
        [f"asyncio-protocol:loop=looplab,loop.{f}" if f else "asyncio-protocol:loop=looplab"
         for f in flips]
    got = _sim_results("S1", specs)
    for variant in ("naive", "fixed"):
        def cols(spec):
            rt = runtimes.parse(spec)
            m = got[("S1", variant, rt.spec)]["metrics"]
            return {k: m[k] for k in _S1_COLUMNS}
        base_ours, base_loop = cols(specs[0]), cols(specs[3])
        assert base_ours == base_loop, variant
        for ours, loop in zip(specs[1:3], specs[4:]):
            assert cols(loop) == cols(ours), (variant, loop)
    # ... and the knobs do move them (else the comparison above proves nothing)
    fixed = {s: got[("S1", "fixed", runtimes.parse(s).spec)]["metrics"] for s in specs[3:]}
    assert fixed[specs[5]]["peak_user_buffer_bytes"] < fixed[specs[3]]["peak_user_buffer_bytes"] / 2
    assert fixed[specs[5]]["pause_writing_count"] > fixed[specs[3]]["pause_writing_count"]
    assert fixed[specs[4]]["pause_writing_count"] != fixed[specs[3]]["pause_writing_count"]


def test_a_loop_option_flips_the_declared_fingerprint_as_on_the_callback_kernel(monkeypatch):
    from dataclasses import replace
    from protocols.fingerprint import Fingerprint
    plain = runtimes.parse("asyncio-streams").declared_fingerprint()
    assert runtimes.parse("asyncio-streams:loop=looplab,loop.write=defer").declared_fingerprint() \
        == plain
    bad = runtimes.parse("asyncio-streams:loop=looplab,loop.nope=1").declared_fingerprint()[1]
    assert bad and "nope" in bad[0]
    # a flip the callback kernel declared would flip the loop's row too
    cb = runtimes.RUNTIMES["callback"]
    fp = Fingerprint(cb.fingerprint.row, {"write=defer": {"closed_after_one_yield": False}},
                     cb.fingerprint.neutral - {"write"})
    monkeypatch.setitem(runtimes.RUNTIMES, "callback", replace(cb, fingerprint=fp))
    row, problems = runtimes.parse("asyncio-streams:loop=looplab,loop.write=defer").declared_fingerprint()
    assert row == {**plain[0], "closed_after_one_yield": False} and problems == []
    row, problems = runtimes.parse("asyncio-streams:loop=looplab,loop.high_water=0").declared_fingerprint()
    assert row == plain[0] and problems == []


@pytest.mark.timeout(RUN_S)
def test_looplab_loop_s4_on_the_real_network_matches_and_defer_buffers_the_whole_write(tmp_path):
    """The one real-network check: S4's probes on both ports over our loop match the
    declared asyncio rows, and ``loop.write=defer`` leaves the whole 1 MB write in
    user space, as ``write=defer`` does on the callback kernel."""
    specs = ",".join(LOOPLAB_LOOP + ("asyncio-protocol:loop=looplab,loop.write=defer",
                                     "callback:write=defer"))
    r = _looplab(["run", "--scenarios", "S4", "--runtimes", specs, "--preset", "tiny",
                  "--jobs", "1", "--out", str(tmp_path / "out")])
    assert r.returncode == 0, r.stderr[-2000:]
    cells = {c["runtime"]: c for c in json.loads((tmp_path / "out" / "results.json").read_text())["cells"]}
    for spec in LOOPLAB_LOOP:
        assert cells[spec]["verdicts"] == {"matches_declared": True}, cells[spec]["notes"]
        assert 0 < cells[spec]["metrics"]["user_buffered_after_write_bytes"] < 1_000_000
    deferred = cells["asyncio-protocol:loop=looplab,loop.write=defer"]["metrics"]
    assert deferred["user_buffered_after_write_bytes"] == \
        cells["callback:write=defer"]["metrics"]["user_buffered_after_write_bytes"] == 1_000_000


@pytest.mark.timeout(RUN_S)
def test_fidelity_compares_the_looplab_loop_with_asyncios_own_loop():
    """``looplab fidelity --runtimes asyncio-protocol:loop=looplab``: each probe on
    our loop against asyncio's selector loop, its primary reference, on the same
    interpreter; the write-after-close warnings reach asyncio's logger on both."""
    from bench import fidelity
    _, rows, _, _ = fidelity.measure("asyncio-protocol:loop=looplab", "cb_write_after_*")
    # a loop cell is compared with CPython's asyncio on the same interpreter, as every
    # cell of the observatory's grid is (its rows inform; they are not a kernel's gate)
    pairs = {(r["ours"], r["reference"]) for r in rows}
    assert pairs == {("asyncio-protocol:loop=looplab", "asyncio-protocol")}
    verdicts = {r["probe"]: r["verdict"] for r in rows}
    assert len(verdicts) >= 3 and verdicts["cb_write_after_close_empty"] == "agree"
    # where our loop differs from CPython's, it is the callback kernel's own declared
    # transport difference (the loop's transports are that kernel's)
    from bench import runtimes as rtmod
    declared = set(rtmod.get("callback").probe_differences)
    assert all(v in ("agree", "declared") or p in declared for p, v in verdicts.items()), verdicts
    with pytest.raises(UsageError, match="unknown option 'nope'"):
        fidelity.select_runtimes("asyncio-streams:nope=1,trio:x=1")


@pytest.mark.timeout(RUN_S)
def test_the_protocol_port_on_the_looplab_loop_is_traced_by_the_loop(tmp_path):
    out = tmp_path / "t.json"
    r = _looplab(["trace", "S1", "--runtime", "asyncio-protocol:loop=looplab", "--preset", "tiny",
                  "--out", str(out)])
    assert r.returncode == 0, r.stderr[-2000:]
    events = json.loads(out.read_text())["traceEvents"]
    names = {e["name"] for e in events}
    # the kernel's transport events: its buffer counter and the close
    assert {"user_buffer_bytes", "close_completed"} <= names, names


def test_a_loop_that_refuses_set_protocol_still_reaches_the_apps_protocol():
    """rloop 0.5 raises NotImplementedError from set_protocol(): uninstrumented
    (what the bench runs), the port's pass-through protocol forwards every call."""
    from types import SimpleNamespace

    from protocols.asyncio_ports import _Tracked

    class Transport:
        def set_protocol(self, protocol):
            raise NotImplementedError("TCPTransport protocol cannot be changed")

    class App:
        def __init__(self):
            self.got = []

        def connection_made(self, transport):
            self.got.append(("made", transport))

        def data_received(self, data):
            self.got.append(("data", data))

    app, transport = App(), Transport()
    tracked = _Tracked(app, SimpleNamespace(_transports={}))
    tracked.connection_made(transport)
    tracked.data_received(b"ping")
    assert app.got == [("made", transport), ("data", b"ping")]


@pytest.mark.timeout(RUN_S)
def test_a_users_loop_runs_through_fidelity_against_asyncio_on_the_same_interpreter(tmp_path):
    """``looplab fidelity`` on a loop named only as MODULE:FACTORY from the user's
    PYTHONPATH: its probe worker makes the loop with its keywords, and every probe is
    compared with CPython's own loop."""
    (tmp_path / "userloop_mod.py").write_text(USER_LOOP)
    mark = tmp_path / "made.txt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    spec = f"asyncio-streams:loop=userloop_mod:new_loop,loop.mark={mark},loop.tag=f1"
    r = _looplab(["fidelity", "--runtimes", spec, "--probes", "lp_call_*",
                  "--json", str(tmp_path / "f.json")], env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    # a SelectorEventLoop subclass agrees with asyncio on every probe it ran
    m = re.search(re.escape(spec) + r" vs asyncio-streams \(loop conformance\): (\d+)/(\d+) agree",
                  r.stdout)
    assert m and int(m.group(1)) == int(m.group(2)) >= 3, r.stdout[-2000:]
    made = mark.read_text().split()
    assert made.count("f1") >= 1


def test_seeds_and_explore_on_another_interpreter_say_to_run_looplab_there():
    # A pinned sim cell runs in its interpreter in the default universe only:
    # what varies the universe (explore, --seeds) says so instead of running.
    from bench.explore import targets
    why = targets.resolve("S3:drain").applies("asyncio-streams@3.12")
    assert why and "run looplab itself with it" in why
    assert targets.resolve("S3:drain").applies("asyncio-streams") is None
