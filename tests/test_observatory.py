"""The loop-conformance observatory: ``looplab fidelity`` over asyncio loops x
interpreters, each cell compared with CPython's asyncio on the same interpreter, and
``--repro`` writing a standalone script.

The in-process tests are fast. The cross-interpreter test builds at most one
environment (for one interpreter other than this one, in the user's cache, where a
second session finds it again) and runs a handful of probes; it skips with the reason
when no other interpreter is found. A missing loop package is a skip, never a crash.
"""
from __future__ import annotations

import ast
import asyncio
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.host import envs
from bench.errors import ExitCode, UsageError
from bench.fidelity import observatory
from bench.fidelity.registry import PROBES
from bench import runtimes

measure = importlib.import_module("bench.fidelity.measure")

REPO = Path(__file__).resolve().parent.parent
HAVE_UVLOOP = importlib.util.find_spec("uvloop") is not None
HAVE_RLOOP = importlib.util.find_spec("rloop") is not None
needs_uvloop = pytest.mark.skipif(not HAVE_UVLOOP, reason="uvloop is not installed here")
needs_rloop = pytest.mark.skipif(not HAVE_RLOOP, reason="rloop is not installed here")
LOOP_PROBES = [n for n in measure.select_probes(None) if n.startswith("lp_")]


def _looplab(args, timeout=300, env=None):
    return subprocess.run([sys.executable, "-m", "bench", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO, env=env)


def _with_fakeloops():
    """The environment in which ``loop=fakeloops:FACTORY`` imports (tests/fakeloops.py)."""
    here = str(REPO / "tests")
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (here, os.environ.get("PYTHONPATH")) if p))


def test_at_least_300_probes_each_loop_probe_classified():
    from bench.fidelity.promises import Promise
    assert len(PROBES) >= 300
    assert len(LOOP_PROBES) >= 250
    for n in LOOP_PROBES:
        doc = PROBES[n].documented
        assert doc is None or isinstance(doc, Promise), n
        assert PROBES[n].standalone, n
    assert sum(PROBES[n].documented is not None for n in LOOP_PROBES) >= 120
    # a twin names a real probe, and that probe's repro goes through the twin
    for n in LOOP_PROBES:
        for old in PROBES[n].twin_of:
            assert old in PROBES and observatory.repro_probe(old) == n
    # the themes issue 37 asks for each have probes
    for theme in ("lp_debug_", "lp_ctx_", "lp_dgram_", "lp_proc_", "lp_pipe_", "lp_tls_",
                  "lp_signal_", "lp_sock_recv_cancel", "lp_shutdown_default_executor"):
        assert sum(n.startswith(theme) for n in LOOP_PROBES) >= 1, theme


def test_the_tool_counts_the_probes():
    r = _looplab(["fidelity", "--list"], timeout=120)
    assert r.returncode == 0, r.stderr[-800:]
    m = re.search(r"^(\d+) probes: (\d+) on our kernels .* (\d+) loop-conformance probes "
                  r"\(lp_\*: (\d+) documented, (\d+) de-facto\)$", r.stdout, re.M)
    assert m and int(m[1]) == len(PROBES) and int(m[3]) == len(LOOP_PROBES)
    assert int(m[4]) == sum(PROBES[n].documented is not None for n in LOOP_PROBES)
    # a documented probe is listed with its quote
    assert "according to the event loop's internal monotonic clock" in r.stdout


@pytest.fixture(scope="module")
def reference_twice():
    """Every loop probe on CPython's asyncio (the reference), twice."""
    names = list(LOOP_PROBES)
    return measure.collect(["asyncio-streams"], names), measure.collect(["asyncio-streams"], names)


@pytest.mark.timeout(600)
def test_loop_probes_run_clean_and_stable_on_the_reference(reference_twice):
    first, second = (r["asyncio-streams"] for r in reference_twice)
    errors = {n: rec["error"] for n, rec in first.items() if "error" in rec}
    assert errors == {}
    unstable = [n for n in first if not measure.same(first[n].get("obs"), second[n].get("obs"))]
    assert unstable == []
    for n, rec in first.items():
        text = json.dumps(rec["obs"])
        assert len(text) < 600, n
        assert not re.search(r"0x[0-9a-f]{6,}|line \d+|File \"", text), n


@pytest.mark.parametrize("spec, ref", [
    ("asyncio-streams:loop=rloop", "asyncio-streams"),
    ("asyncio-protocol@3.12:loop=rloop", "asyncio-protocol@3.12"),
    ("asyncio-streams@3.13:loop=uvloop", "asyncio-streams@3.13"),   # the uvloop-streams alias
    ("asyncio-streams@3.12:eager=true", "asyncio-streams@3.12"),
    ("asyncio-streams@3.12", None),
    ("hybrid@3.12", None),
])
def test_a_loop_cell_is_compared_with_asyncio_on_the_same_interpreter(spec, ref):
    assert measure.grid_reference(runtimes.parse(spec)) == ref


def test_every_loop_probe_has_a_standalone_repro_within_the_line_limit():
    for n in LOOP_PROBES:
        text = observatory.reproduction(n, "asyncio-streams:loop=uvloop", {"k": 1}, {"k": 2},
                                        {"python": "3.12.1", "loop": "uvloop",
                                         "loop_version": "0.23.0"})
        assert len(text.splitlines()) <= observatory.REPRO_MAX_LINES, n
        assert "bench" not in text and "looplab" not in text.split('"""')[-1], n
        header = text.split('"""')[1]
        assert "upstream: " in header and ("asyncio docs 3.12.1 (" in header
                                           or "de-facto: " in header), n
        compile(text, n, "exec")


def _names(tree):
    """(the _-prefixed names a script reads, the names it defines or binds)."""
    read, bound = set(), set(dir(__builtins__))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load) and node.id.startswith("_"):
                read.add(node.id)
            else:
                bound.add(node.id)
    return read, bound


def test_every_helper_a_repro_calls_is_in_it_with_the_helpers_it_calls():
    # the probes call helpers that call helpers (loopproc: _signalled -> _sleeper ->
    # _spawn -> _create -> _raised); the script must carry the whole chain
    for n in LOOP_PROBES:
        read, bound = _names(ast.parse(observatory.reproduction(n, "asyncio-streams")))
        assert read <= bound, (n, sorted(read - bound))


def test_a_repro_whose_helpers_call_helpers_runs_alone_and_prints_the_probe(tmp_path):
    name = "lp_proc_terminate"
    text = observatory.reproduction(name, "asyncio-streams")
    for helper in ("_signalled", "_sleeper", "_spawn", "_create", "_reap", "_raised"):
        assert f"def {helper}(" in text, helper
    script = tmp_path / f"{name}.py"
    script.write_text(text)
    out = _run_script(script)
    assert out.returncode == 0, out.stderr[-800:]
    probe = observatory._probes()[name].fn
    assert out.stdout.strip() == str(asyncio.run(probe(asyncio)))


def _run_script(path, timeout=60):
    # no PYTHONPATH: the script needs only the loop's package
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=path.parent)


@needs_uvloop
def test_repro_verb_writes_a_script_that_shows_the_divergence(tmp_path):
    r = _looplab(["fidelity", "--repro", "cb_call_soon_vs_call_later_zero",
                  "--runtime", "asyncio-protocol:loop=uvloop", "--out", str(tmp_path)])
    assert r.returncode == 0, r.stderr[-1500:]
    (script,) = tmp_path.glob("lp_call_later_zero_order-*.py")
    text = script.read_text()
    assert len(text.splitlines()) <= 30 and "import uvloop" in text
    out = _run_script(script)
    assert out.returncode == 0, out.stderr[-800:]
    seen = out.stdout.strip()
    # the header holds both observations; the script prints the loop's again
    assert "uvloop" in text.splitlines()[2] and seen.replace("'", '"').replace(" ", "") \
        in text.replace(" ", "")
    asyncio_twin = tmp_path / "asyncio_version.py"
    asyncio_twin.write_text(text.replace("import uvloop\n", "").replace(
        "uvloop.Loop", "asyncio.new_event_loop"))
    assert _run_script(asyncio_twin).stdout.strip() != seen


def test_repro_refuses_a_helper_probe_without_twin_in_one_line():
    r = _looplab(["fidelity", "--repro", "cb_extra_info", "--runtime", "asyncio-protocol"])
    assert r.returncode == ExitCode.USAGE and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "standalone" in r.stderr
    r = _looplab(["fidelity", "--repro", "lp_debug_flag"])
    assert r.returncode == ExitCode.USAGE and "--runtime" in r.stderr


def test_repro_refuses_a_probe_that_shows_no_difference(tmp_path):
    """Issue 37: --repro on a probe that agrees wrote two identical outputs and exited 0."""
    env = _with_fakeloops()
    spec = "asyncio-streams:loop=fakeloops:late_zero"
    r = _looplab(["fidelity", "--repro", "lp_call_soon_order", "--runtime", spec,
                  "--out", str(tmp_path)], env=env)
    assert r.returncode == ExitCode.FAILED and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "shows no difference" in r.stderr
    assert list(tmp_path.iterdir()) == [] and r.stdout == ""
    # where it differs, the script is written, with the promise and the upstream line
    r = _looplab(["fidelity", "--repro", "lp_call_later_zero_order", "--runtime", spec], env=env)
    assert r.returncode == 0, r.stderr[-800:]
    assert "de-facto: no sentence of the asyncio docs promises this" in r.stdout
    assert "upstream: not searched" in r.stdout and "import fakeloops" in r.stdout
    assert "lp_call_later_zero_order on " in r.stderr and "de-facto" in r.stderr
    # CPython's asyncio itself has no reference to differ from: a usage error
    r = _looplab(["fidelity", "--repro", "lp_call_soon_order", "--runtime", "asyncio-streams"])
    assert r.returncode == ExitCode.USAGE and "the reference" in r.stderr


def test_a_worker_that_dies_costs_one_probe_not_the_rest(monkeypatch):
    """uvloop aborts on connect_read_pipe() of a regular file; the probes after it still run."""
    monkeypatch.setenv("PYTHONPATH", _with_fakeloops()["PYTHONPATH"])
    names = ["lp_pipe_read", "lp_call_soon_order", "lp_pipe_read_regular_file", "lp_call_at_order"]
    res = measure.collect(["asyncio-streams:loop=fakeloops:dying"], names)
    recs = res["asyncio-streams:loop=fakeloops:dying"]
    assert "killed by SIGKILL" in recs["lp_pipe_read"]["error"]
    assert "while this probe ran" in recs["lp_pipe_read"]["error"]
    assert recs["lp_call_soon_order"]["obs"] == {"order": [0, 1, 2, 3, 4]}
    assert "killed by SIGKILL" in recs["lp_pipe_read_regular_file"]["error"]
    assert recs["lp_call_at_order"]["obs"] == {"order": [0.01, 0.02, 0.03]}


def test_a_worker_stuck_past_its_probe_alarm_is_killed_and_the_rest_run(monkeypatch):
    """A loop blocked in C code never sees the worker's per-probe alarm: the parent kills
    the worker after a stall, charges that probe, and runs the rest in a fresh one."""
    monkeypatch.setenv("PYTHONPATH", _with_fakeloops()["PYTHONPATH"])
    names = ["lp_signal_handler_delivery", "lp_call_soon_order"]
    res = measure.collect(["asyncio-streams:loop=fakeloops:stuck"], names, stall=3.0)
    recs = res["asyncio-streams:loop=fakeloops:stuck"]
    assert "gave no result for 3 s and was killed" in recs["lp_signal_handler_delivery"]["error"]
    assert recs["lp_call_soon_order"]["obs"] == {"order": [0, 1, 2, 3, 4]}


@needs_uvloop
def test_asking_about_one_loop_prints_only_that_loop():
    """Issue 35: --runtimes asyncio-streams:loop=uvloop printed our hybrid kernel first."""
    assert measure.select_runtimes("asyncio-streams:loop=uvloop")[0] == ["asyncio-streams",
                                                                        "uvloop-streams"]
    assert measure.select_runtimes("uvloop-protocol@3.12")[0] == ["asyncio-protocol@3.12",
                                                                 "uvloop-protocol@3.12"]
    r = _looplab(["fidelity", "--runtimes", "asyncio-streams:loop=uvloop", "--probes",
                  "lp_call_soon_order,lp_call_later_zero_order"])
    assert r.returncode == 0, r.stderr[-800:]
    assert "hybrid" not in r.stdout and "uvloop-streams vs asyncio-streams" in r.stdout
    assert "thread: uvloop#482" in r.stdout        # the upstream line beside the divergence
    # a kernel still brings its references
    assert measure.select_runtimes("hybrid")[0][:2] == ["hybrid", "asyncio-streams"]


@needs_rloop
def test_a_loop_on_this_interpreter_gets_divergences_and_repros(tmp_path):
    probes = "lp_call_later_zero_order,lp_debug_flag,lp_write_buffer_limits"
    r = _looplab(["fidelity", "--runtimes", "asyncio-streams:loop=rloop", "--probes", probes,
                  "--out", str(tmp_path)])
    assert r.returncode == 0, r.stderr[-1500:]
    block = json.loads((tmp_path / "fidelity.json").read_text())["fidelity_probes"]
    grid = block["grid"]
    cell = next(c for c in grid["cells"] if c["loop"] == "rloop")
    assert cell["reference"] == "asyncio-streams" and cell["compared"] == 3
    assert cell["loop_version"] and cell["python"] == ".".join(map(str, sys.version_info[:3]))
    div = {d["probe"] for d in grid["divergences"] if d["verdict"] == "divergent"}
    # every divergence has its standalone reproduction, which runs and prints
    for d in div:
        (script,) = (tmp_path / "repro").glob(f"{d}-*.py")
        assert _run_script(script).returncode == 0
    assert grid["classes"]["lp_debug_flag"] in ("documented", "divergent")
    md = (tmp_path / "fidelity.md").read_text()
    assert "The observatory" in md and "rloop" in md
    assert "<table>" in (tmp_path / "fidelity.html").read_text()


def test_an_unknown_spec_is_one_line():
    with pytest.raises(UsageError):
        measure.select_runtimes("curio:loop=rloop")
    with pytest.raises(UsageError):
        measure.select_runtimes("nosuch@3.12")


# ---------------------------------------------------------------------------
# Across interpreters: a handful of probes on this Python and one other

def _other():
    here = sys.version_info[:2]
    least = envs._minimum()[1]
    for want in ((3, 13), (3, 12), (3, 11)):
        for it in envs.found():
            v = envs._vtuple(it.version)
            if v[:2] == want and v[:2] != here and v >= least:
                return it
    return None


@pytest.fixture(scope="session")
def grid_run():
    """Three probes on CPython's asyncio, here and on one other interpreter (one
    environment, in the user's cache so a later session reuses it)."""
    other = _other()
    if other is None:
        pytest.skip("no second interpreter >= looplab's minimum was found")
    spec = f"asyncio-streams@{'.'.join(other.version.split('.')[:2])}"
    names = "lp_server_wait_closed_open_client,lp_server_close_clients,lp_eager_start"
    results, rows, names, block = measure.measure(f"asyncio-streams,{spec}", names)
    observatory.add_grid(results, rows, names, block)
    return other, spec, results, block


def test_a_probe_that_changed_between_interpreters_is_shown(grid_run):
    other, spec, results, block = grid_run
    here = sys.version_info[:2]
    there = envs._vtuple(other.version)[:2]
    assert {c["python"] for c in block["grid"]["cells"]} == {
        ".".join(map(str, sys.version_info[:3])), other.version}
    changed = {c["probe"]: c["by_python"] for c in block["grid"]["changed"]}
    # 3.12 made Server.wait_closed() wait for the connections (cpython 104344, 113538)
    if (here < (3, 12)) != (there < (3, 12)):
        assert "lp_server_wait_closed_open_client" in changed
        assert "lp_eager_start" in changed
        old = changed["lp_server_wait_closed_open_client"][
            other.version if there < (3, 12) else ".".join(map(str, sys.version_info[:3]))]
        assert json.loads(old) == {"wait_closed": None}        # returned at once
    # 3.13 added Server.close_clients()
    if (here < (3, 13)) != (there < (3, 13)):
        assert "lp_server_close_clients" in changed
    assert results[spec]["lp_eager_start"]["obs"]


# ---------------------------------------------------------------------------
# Shards across the axes merge into the report of one run

@needs_uvloop
def test_shards_across_the_loop_axis_merge_into_one_run(tmp_path):
    specs = "asyncio-streams,asyncio-streams:loop=uvloop,asyncio-protocol:loop=uvloop"
    common = ["run", "--scenarios", "S1", "--variants", "naive", "--runtimes", specs,
              "--preset", "tiny"]
    outs = []
    for shard in ("1/2", "2/2"):
        out = tmp_path / shard.replace("/", "of")
        r = _looplab([*common, "--shard", shard, "--out", str(out)])
        assert r.returncode in (0, 1), r.stderr[-1500:]
        outs.append(str(out / "results.json"))
    merged = tmp_path / "merged.json"
    r = _looplab(["merge", *outs, "-o", str(merged)])
    assert r.returncode == 0, r.stderr[-1500:]
    cells = json.loads(merged.read_text())["cells"]
    listed = _looplab(["list", "cells", "--scenarios", "S1", "--variants", "naive",
                       "--runtimes", specs])
    assert sorted(c["runtime"] for c in cells) == sorted(
        runtimes.parse(s).spec for s in ("asyncio-streams", "asyncio-streams:loop=uvloop",
                                         "asyncio-protocol:loop=uvloop"))
    assert listed.returncode == 0 and all(c["runtime"] in listed.stdout for c in cells)


def test_the_pytest_fixture_skips_a_runtime_bound_to_another_interpreter():
    from bench.verbs import pytest_plugin
    here = ".".join(map(str, sys.version_info[:2]))
    assert pytest_plugin._other_interpreter(runtimes.parse(f"asyncio-streams@{here}")) is None
    assert pytest_plugin._other_interpreter(runtimes.parse("asyncio-streams")) is None
    why = pytest_plugin._other_interpreter(runtimes.parse("asyncio-streams@3.99"))
    assert why and "3.99" in why and "this process" in why
    with pytest.raises(pytest.skip.Exception):
        pytest_plugin.runtime_or_skip("asyncio-streams@3.99")


def test_report_rows_group_by_loop_then_interpreter():
    from bench.report.htmldoc import Runtimes, axis_key
    specs = ["asyncio-streams@3.13:loop=rloop", "asyncio-streams@3.12", "asyncio-streams",
             "asyncio-streams@3.11:loop=rloop", "asyncio-streams@3.13", "hybrid"]
    assert sorted(specs, key=axis_key) == [
        "asyncio-streams", "asyncio-streams@3.12", "asyncio-streams@3.13",
        "asyncio-streams@3.11:loop=rloop", "asyncio-streams@3.13:loop=rloop", "hybrid"]
    # what a results document says of each runtime (rendering reads only the document)
    cells = [{"id": s, "runtime": s, "style": "stream", "ours": s == "hybrid"} for s in specs]
    described = {"hybrid": {"compared_with": ["asyncio-streams"]}}
    # our kernel first, then its reference's cells, grouped by loop, then interpreter
    assert Runtimes(cells, described).ordered(specs) == ["hybrid", *sorted(specs[:5], key=axis_key)]
