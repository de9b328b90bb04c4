"""Micro-benchmarks (via pytest-benchmark), the echo benchmark's machinery and the
``looplab bench`` command line.

With plain ``pytest`` (``--benchmark-disable`` in pyproject) every micro-benchmark runs
once, as a correctness test: the port is built in ``setup`` (outside the timed region) and
the test checks that every operation really happened. ``pytest --benchmark-enable
tests/test_bench.py`` times them. No test asserts wall-clock performance.
"""
from __future__ import annotations

import argparse
import ast
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import tomllib

import pytest

from bench import results
from bench.perf import echo, loadgen, machine, micro
from bench.verbs import benchmark as benchverb
from bench import cli as looplab_cli
from bench.errors import ExitCode, UsageError
from bench import runtimes

pytestmark = pytest.mark.timeout(120)

MICRO_N = {"spawn_join": 200, "yield": 300, "pingpong": 100, "timers": 200,
           "chained_spawn": 200, "yield_many": 5, "many_timers": 200}
CASES = [(op, rid) for op in micro.MICRO_OPS for rid, info in runtimes.RUNTIMES.items()
         if info.style in micro.MICRO_STYLES[op]]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUBS = ("matrix", "goals", "micro", "idle", "curve")


@pytest.fixture(autouse=True, scope="module")
def _uvloop_signal_pipe():
    """libuv opens a signal pipe once per process, the first time a loop installs a
    signal handler (asyncio.Runner does, for SIGINT); it stays open for good. Open it
    before the per-test leak check takes its baseline, so it isn't counted as a leak."""
    try:
        import asyncio

        import uvloop
    except ImportError:
        yield
        return

    async def nothing():
        pass
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(nothing())
    yield


def _available(spec: str):
    rt = runtimes.parse(spec)
    reason = machine.unavailable(rt)
    if reason:
        pytest.skip(f"{spec}: {reason}")
    return rt


# ---------------------------------------------------------------------------
# micro-benchmark bodies, run once each

@pytest.mark.parametrize("op, spec", CASES, ids=[f"{op}-{rid}" for op, rid in CASES])
def test_micro(benchmark, op, spec):
    rt = _available(spec)
    made = []

    def setup():
        m = micro.Micro(op, rt, MICRO_N[op])     # the kernel is built here, not timed
        made.append(m)
        return (m,), {}

    benchmark.group = op
    try:
        res = benchmark.pedantic(lambda m: m.run(), setup=setup, teardown=lambda m: m.close(),
                                 rounds=5 if benchmark.enabled else 1)
    finally:
        for m in made:
            m.close()
    assert res.error is None, res
    assert res.ops == made[-1].expected
    assert res.elapsed_s > 0
    benchmark.extra_info["ops_per_s"] = res.ops_per_s


def test_micro_builds_the_port_before_the_timed_run():
    with micro.Micro("pingpong", "asyncio-streams", 10) as m:
        assert m.port is not None and m.listener is not None
        assert m.listener.getsockname()[1] > 0
        res = m.run()
        assert res.ops == 10
        with pytest.raises(RuntimeError, match="runs once"):
            m.run()
    assert m.port is None and m.listener is None


def test_micro_timers_use_seeded_delays_up_to_one_ms():
    a = micro.Micro("timers", "asyncio-protocol", 50, seed=3)
    b = micro.Micro("timers", "asyncio-protocol", 50, seed=3)
    try:
        assert a.delays == b.delays
        assert all(0 <= d <= 0.001 for d in a.delays)
    finally:
        a.close()
        b.close()


def test_micro_many_timers_are_staggered_latest_first():
    with micro.Micro("many_timers", "coro", 40) as m:
        assert m.delays == sorted(m.delays, reverse=True) and len(set(m.delays)) == 40
        assert m.delays[0] == 0.001 and m.delays[-1] > 0
        assert m.expected == 40


def test_micro_yield_many_counts_every_yield_of_every_task():
    with micro.Micro("yield_many", "coro", 3) as m:
        assert m.expected == 3 * micro.YIELD_MANY_TASKS
        assert m.run().ops == m.expected


def test_micro_rejects_bad_input():
    with pytest.raises(ValueError, match="unknown micro-benchmark"):
        micro.Micro("nap", "trio", 10)
    with pytest.raises(ValueError, match="positive int"):
        micro.Micro("yield", "trio", 0)
    with pytest.raises(ValueError, match="does not apply"):
        micro.Micro("spawn_join", "asyncio-protocol", 10)
    with pytest.raises(ValueError, match="does not apply"):
        micro.Micro("chained_spawn", "callback", 10)
    with pytest.raises(runtimes.UsageError):
        micro.Micro("yield", "nonesuch", 10)


def test_bench_runtime_turns_reference_instrumentation_off():
    assert machine.bench_runtime(runtimes.parse("trio")).spec == "trio:instrument=false"
    assert machine.bench_runtime(runtimes.parse("asyncio-protocol")).options["instrument"] is False
    assert machine.bench_runtime(runtimes.parse("coro")).spec == "coro"


# ---------------------------------------------------------------------------
# ratio tables and goals, on synthetic cells

def _echo(rt, rps, rounds=None, m=1024, c=10, cpu=None, system=None):
    samples = {"requests_per_s": rps}
    if cpu is not None:
        samples["server_cpu_per_request_s"] = cpu
    if system is not None:
        samples["server_system_cpu_per_request_s"] = system
        samples["server_user_cpu_per_request_s"] = [t - s for t, s in zip(cpu, system)]
    cell = results.new_cell("echo", rt, "naive", {"message_bytes": m, "connections": c},
                            samples=samples)
    cell["details"] = {"rounds": rounds if rounds is not None else list(range(len(rps)))}
    return cell


def test_ratio_table_pairs_rounds_and_takes_geometric_mean():
    cells = [_echo("asyncio-protocol", [100, 200, 100]), _echo("callback", [150, 200, 110]),
             _echo("asyncio-protocol", [10, 10, 10], m=10240), _echo("callback", [40, 40, 40], m=10240)]
    t = echo.ratio_table(cells, "asyncio-protocol")
    row = t["ratios"]["1 KiB x 10"]["callback"]
    assert row["ratio"] == pytest.approx(150 / 100)
    assert sorted(row["paired"]) == pytest.approx([1.0, 1.1, 1.5])
    assert t["geomean"]["callback"] == pytest.approx((1.5 * 4.0) ** 0.5)
    assert t["geomean"]["asyncio-protocol"] == pytest.approx(1.0)


def test_the_cpu_ratio_table_reads_the_baseline_over_each_runtime_so_above_one_is_cheaper():
    base = _echo("uvloop-streams", [100] * 3, cpu=[10e-6, 12e-6, 9e-6])
    coro = _echo("coro", [100] * 3, cpu=[8e-6, 12e-6, 7.5e-6])
    t = echo.ratio_table([base, coro], "uvloop-streams", "server_cpu_per_request_s", cost=True)
    row = t["ratios"]["1 KiB x 10"]["coro"]
    assert row["ratio"] == pytest.approx(10e-6 / 8e-6)              # medians: 10 over 8
    assert sorted(row["paired"]) == pytest.approx([1.0, 1.2, 1.25])
    text = echo.echo_tables([base, coro], "uvloop-streams")
    assert "server CPU per request relative to uvloop-streams" in text
    cpu_part = text.split("server CPU per request relative to")[1]
    assert "1.25 (1.00-1.25)" in cpu_part.split("absolute numbers")[0]
    # a runtime whose CPU per request came out 0 has no ratio, and the table still renders
    idle = _echo("trio", [100] * 3, cpu=[0.0] * 3)
    t = echo.ratio_table([base, coro, idle], "uvloop-streams", "server_cpu_per_request_s", cost=True)
    assert "trio" not in t["ratios"]["1 KiB x 10"]
    assert "trio" in echo.echo_tables([base, coro, idle], "uvloop-streams")


def test_paired_ratios_skip_rounds_missing_on_one_side():
    base = _echo("asyncio-protocol", [100, 100, 100], rounds=[0, 1, 2])
    other = _echo("callback", [300, 120], rounds=[0, 2])      # round 1 failed
    assert sorted(echo.paired(other, base, "requests_per_s")) == [1.2, 3.0]


def test_echo_tables_render_without_baseline():
    text = echo.echo_tables([_echo("trio", [1.0, 2.0])], "asyncio-protocol")
    assert "baseline asyncio-protocol was not measured" in text


def test_echo_tables_show_server_cpu_per_request_beside_req_per_s():
    text = echo.echo_tables([_echo("trio", [1000.0], cpu=[23.7e-6])], "trio")
    header = next(line for line in text.splitlines() if line.startswith("runtime"))
    assert header.index("req/s") < header.index("server CPU/req")
    assert "23.7 µs" in text


# ---------------------------------------------------------------------------
# the command line: options, help, output paths, atomic writes

def _parser():
    parser = argparse.ArgumentParser(prog="looplab")
    sub = parser.add_subparsers(dest="verb")
    benchverb.add_parser(sub)
    return parser


def _bench_args(argv):
    return _parser().parse_args(["bench", *argv])


@pytest.fixture
def nothing_starts(monkeypatch):
    """Any attempt to start a process (server, client, compiler, worker) fails the test."""
    started = []

    def popen(*args, **kwargs):
        started.append(args[0] if args else kwargs.get("args"))
        raise AssertionError(f"a process was started: {started[-1]}")
    monkeypatch.setattr(subprocess, "Popen", popen)
    return started


def _help(capsys, argv) -> str:
    with pytest.raises(SystemExit) as info:
        _bench_args([*argv, "--help"])
    assert info.value.code == 0
    return capsys.readouterr().out


def test_each_sub_command_has_its_own_help_and_options(capsys):
    helps = {s: _help(capsys, [s]) for s in SUBS}
    assert len(set(helps.values())) == len(SUBS)
    own = {"matrix": {"--preset", "--sizes", "--sockbuf", "--baseline", "--client"},
           "goals": {"--fail", "--min-time", "--client"},
           "micro": {"--ops", "--min-time"},
           "idle": {"--connections"},
           "curve": {"--size", "--concurrency", "--sockbuf"}}
    foreign = {"matrix": {"--fail", "--ops", "--connections"},
               "goals": {"--preset", "--runtimes", "--sizes", "--ops", "--sockbuf"},
               "micro": {"--preset", "--client", "--sockbuf", "--fail", "--connections"},
               "idle": {"--preset", "--client", "--ops", "--fail", "--sockbuf"},
               "curve": {"--preset", "--ops", "--fail", "--connections"}}
    for s, text in helps.items():
        flags = {w.strip("[],") for w in text.split() if w.startswith(("--", "[--"))}
        assert own[s] <= flags, s
        assert not (foreign[s] & flags), s
    top = _help(capsys, [])
    assert all(s in top for s in SUBS) and "--preset quick" in top


@pytest.mark.parametrize("argv, message", [
    (["--sizes", "1KiB,big"], "bad sizes"),
    (["--concurrency", "0"], "bad concurrency"),
    (["--preset", "huge"], "unknown preset"),
    (["--repeat", "0"], "--repeat must be >= 1"),
    (["matrix", "--repeat", "0"], "--repeat must be >= 1"),
    (["--duration", "-1"], "--duration"),
    (["--seconds", "inf"], "--duration must be a finite number > 0"),
    (["matrix", "--warmup", "nan"], "--warmup"),
    (["matrix", "--sockbuf", "-1"], "--sockbuf must be >= 0"),
    (["curve", "--sockbuf", "-1"], "--sockbuf must be >= 0"),
    (["curve", "--concurrency", "10,0"], "bad concurrency"),
    (["curve", "--size", "1KiB,2KiB"], "one message size"),
    (["--shard", "3/2", "--runtimes", "asyncio-protocol"], "bad shard"),
    (["--runtimes", "nonesuch"], "valid runtimes"),
    (["--baseline", "nonesuch"], "valid runtimes"),
    (["goals", "--repeat", "0"], "--repeat must be >= 1"),
    (["goals", "--min-time", "0"], "--min-time"),
    (["goals", "--warmup", "-1"], "--warmup"),
    (["micro", "--ops", "nap", "--runtimes", "trio"], "unknown micro-benchmark"),
    (["micro", "--repeat", "0"], "--repeat"),
    (["micro", "--runtimes", "nonesuch"], "valid runtimes"),
    (["idle", "--connections", "0"], "--connections must be >= 1"),
    (["idle", "--repeat", "0"], "--repeat"),
    (["--preset", "full", "goals"], "before `goals` would be ignored"),
])
def test_bad_values_are_usage_errors_before_anything_starts(argv, message, nothing_starts, tmp_path):
    args = _bench_args([*argv, "--out", str(tmp_path / "out")] if argv[-1] != "goals" else argv)
    with pytest.raises(UsageError, match=message):
        args.func(args)
    assert nothing_starts == [] and list(tmp_path.iterdir()) == []


def _bad_outputs(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    out = [("--json", str(tmp_path), "is a folder"), ("--out", str(a_file), "is not a folder"),
           ("--json", str(a_file / "x.json"), "cannot write there")]
    if os.path.isdir("/proc/self"):
        out += [("--out", "/proc/x", "cannot write there"),
                ("--json", "/proc/x/results.json", "cannot write there")]
    return out


@pytest.mark.parametrize("sub", [[], ["matrix"], ["goals"], ["micro"], ["idle"], ["curve"]])
def test_bad_output_paths_exit_2_before_measuring(sub, nothing_starts, tmp_path, capsys,
                                                  monkeypatch, tmp_path_factory):
    # a machine whose cache holds no compiled C client yet: the paths are checked
    # before the client is built (building it starts the compiler); goals needs
    # valgrind before anything (exit 3 without it): here it is there
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("empty-cache")))
    monkeypatch.setattr(benchverb, "icount_missing", lambda: None)
    for option, path, message in _bad_outputs(tmp_path):
        before = sorted(os.listdir(tmp_path))
        rc = looplab_cli.main(["bench", *sub, option, path])
        err = capsys.readouterr().err
        assert rc == ExitCode.USAGE, (option, path, err)
        assert message in err and err.count("\n") == 1 and err.startswith("looplab: ")
        assert sorted(os.listdir(tmp_path)) == before
    assert nothing_starts == []


def test_bare_bench_with_the_old_flags_runs_matrix(monkeypatch):
    seen = {}

    def fake_echo_run(args, mode, title, sizes, concurrency, preset=None):
        seen.update(mode=mode, sizes=sizes, concurrency=concurrency, repeat=args.repeat,
                    duration=args.duration, preset=preset)
        return ExitCode.OK
    monkeypatch.setattr(benchverb, "_echo_run", fake_echo_run)
    for argv in (["--preset", "quick"], ["matrix", "--preset", "quick"], ["echo"]):
        args = _bench_args(argv)
        assert args.func(args) == ExitCode.OK
        assert seen == {"mode": "matrix", "sizes": [1024], "concurrency": [10], "repeat": 3,
                        "duration": 2.0, "preset": "quick"}
    args = _bench_args(["--preset", "full", "--repeat", "2", "--seconds", "0.5"])
    args.func(args)
    assert seen["sizes"] == [1024, 10240, 102400] and seen["repeat"] == 2 and seen["duration"] == 0.5


def test_no_available_runtime_is_an_environment_error(monkeypatch, nothing_starts, capsys):
    monkeypatch.setattr(benchverb, "split_available", lambda rts: ([], {"trio": "not installed"}))
    for argv in (["--runtimes", "trio"], ["micro", "--runtimes", "trio"],
                 ["idle", "--runtimes", "trio"]):
        args = _bench_args(argv)
        assert args.func(args) == ExitCode.ENVIRONMENT
        assert "none of the requested runtimes is available" in capsys.readouterr().err
    assert nothing_starts == []


def test_without_a_compiler_the_python_client_stands_in_and_says_why(monkeypatch, nothing_starts):
    monkeypatch.setattr(loadgen.shutil, "which", lambda name: None)
    prefix, desc = loadgen.load_client("auto")
    assert prefix is None and "python" in desc and "no C compiler found" in desc
    with pytest.raises(machine.MeasureError, match="no C compiler"):
        loadgen.load_client("c")
    with pytest.raises(UsageError, match="choose auto, c, python"):
        loadgen.load_client("rust")


def test_size_lists_accept_units():
    assert benchverb.parse_int_list("1KiB,10k,100 KiB,512,1MiB", "sizes", allow_size=True) == \
        [1024, 10240, 102400, 512, 1 << 20]


def test_atomic_write_replaces_whole_files_and_leaves_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "sub" / "results.json"
    benchverb.write_atomic(str(path), "first\n")
    assert path.read_text() == "first\n"
    mask = os.umask(0o022)
    os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask      # as open() would make it

    def refuse(src, dst):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError):
        benchverb.write_atomic(str(path), b"second\n")
    monkeypatch.undo()
    assert path.read_text() == "first\n"
    assert os.listdir(path.parent) == ["results.json"]


def test_a_run_writes_json_csv_and_markdown_atomically(monkeypatch, tmp_path, capsys):
    """The whole matrix path with the measurement replaced by synthetic cells."""
    def fake_matrix(units, duration, warmup, repeat, client, pinned, progress=None, sockbuf=None):
        return [_echo(rt.spec, [100.0 * (i + 1)] * repeat, cpu=[1e-5] * repeat)
                for i, (rt, _m, _c) in enumerate(units)]
    monkeypatch.setattr(benchverb, "run_echo_matrix", fake_matrix)
    monkeypatch.setattr(benchverb, "load_client", lambda kind: (None, "python (test)"))
    out, js = tmp_path / "report", tmp_path / "one.json"
    args = _bench_args(["--runtimes", "asyncio-protocol,trio", "--repeat", "2",
                        "--out", str(out), "--json", str(js)])
    assert args.func(args) == ExitCode.OK
    assert sorted(os.listdir(out)) == ["bench.md", "report.html", "results.csv", "results.json"]
    doc = results.load_json(str(js))
    assert [c["runtime"] for c in doc["cells"]] == ["asyncio-protocol", "trio"]
    assert doc["config"]["mode"] == "matrix" and doc["env"]["load_client"] == "python (test)"
    assert "allocator_env" in doc["env"]
    assert results.load_json(str(out / "results.json"))["cells"] == doc["cells"]
    assert "requests_per_s" in (out / "results.csv").read_text()
    assert "2.00" in capsys.readouterr().out          # trio's ratio to the baseline
    assert sorted(os.listdir(tmp_path)) == ["one.json", "report"]


def test_an_interrupted_matrix_keeps_the_finished_measurements(monkeypatch):
    calls = []

    def fake_measure(rt, *a, **kw):
        calls.append(rt.spec)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return {"requests_per_s": 100.0, "server_cpu_per_request_s": 1e-5, "loadavg": 0.1,
                "latency_p99_s": 1e-4,
                "noisy": False, "client_saturated": False}
    monkeypatch.setattr(echo, "measure_echo", fake_measure)
    rts = runtimes.parse_list("asyncio-protocol,trio")
    with pytest.raises(machine.Interrupted) as info:
        echo.run_echo_matrix(echo.echo_units(rts, [1024], [10]), 1.0, 0.0, 3,
                             client=(None, "test"), progress=lambda m: None)
    assert [(c["runtime"], c["repeats"]) for c in info.value.cells] == [("asyncio-protocol", 1)]


def test_an_interrupted_run_writes_what_it_has_and_exits_130(monkeypatch, tmp_path, capsys):
    def interrupted(units, *a, **kw):
        raise machine.Interrupted([_echo(units[0][0].spec, [100.0])])
    monkeypatch.setattr(benchverb, "run_echo_matrix", interrupted)
    monkeypatch.setattr(benchverb, "load_client", lambda kind: (None, "python (test)"))
    js = tmp_path / "r.json"
    args = _bench_args(["--runtimes", "asyncio-protocol,trio", "--json", str(js)])
    assert args.func(args) == ExitCode.INTERRUPTED
    doc = results.load_json(str(js))
    assert doc["config"]["interrupted"] is True and len(doc["cells"]) == 1
    assert f"kept in {js}" in capsys.readouterr().err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stop_signals_interrupt_only_while_measuring(sig):
    before = signal.getsignal(sig)
    with pytest.raises(KeyboardInterrupt):
        with machine.stop_on_signals():
            os.kill(os.getpid(), sig)
            time.sleep(5)           # the signal arrives long before this ends
    assert signal.getsignal(sig) is before
    machine.check_stop()            # outside a run, nothing is pending


def test_a_stop_signal_whose_exception_was_swallowed_still_stops_the_run():
    with machine.stop_on_signals():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        except KeyboardInterrupt:
            pass                    # what Python does to it inside an at-fork handler
        with pytest.raises(KeyboardInterrupt):
            machine.check_stop()


def test_echo_units_shard_into_disjoint_covering_slices():
    rts = runtimes.parse_list("asyncio-protocol,trio,curio")
    full = echo.echo_units(rts, [1, 2], [1, 10])
    parts = [echo.echo_units(rts, [1, 2], [1, 10], f"{i}/3") for i in (1, 2, 3)]
    key = lambda u: (u[0].spec, u[1], u[2])  # noqa: E731
    assert sorted(map(key, full)) == sorted(key(u) for p in parts for u in p)
    assert len(full) == 12


# ---------------------------------------------------------------------------
# packaging and module structure

def test_the_c_client_is_package_data():
    source = loadgen.client_source()
    assert b"epoll_wait" in source and b"int main" in source
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        config = tomllib.load(f)
    assert "perf/echo_client.c" in config["tool"]["setuptools"]["package-data"]["bench"]


_MODULES = ("perf.machine", "perf.loadgen", "perf.echo", "perf.micro", "perf.goals", "verbs.benchmark")
_LAZY_OK = {"curio", "matplotlib", "matplotlib.pyplot"}    # optional libraries


def _imports(module: str):
    with open(os.path.join(ROOT, "bench", *module.split(".")) + ".py") as f:
        tree = ast.parse(f.read())
    top = {n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield node in top, [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node in top, [node.module] + [f"{node.module}.{a.name}" for a in node.names]


def test_bench_modules_import_in_one_direction_and_only_optional_libraries_lazily():
    order = {f"bench.{m}": i for i, m in enumerate(_MODULES)}
    for i, module in enumerate(_MODULES):
        for at_top, names in _imports(module):
            if not at_top:
                assert set(names) <= _LAZY_OK, (module, names)
            for name in names:
                assert name != "bench.cli", (module, name)
                if name in order:
                    assert order[name] < i, f"bench.{module} imports {name}: a cycle"
        with open(os.path.join(ROOT, "bench", *module.split(".")) + ".py") as f:
            assert sum(1 for _ in f) <= 700, module


# ---------------------------------------------------------------------------
# end to end: real server processes and load clients (small and short)

@pytest.mark.timeout(60)
def test_python_load_client_measures_a_real_server():
    rt = _available("asyncio-protocol")
    s = echo.measure_echo(rt, 1024, 3, duration=0.5, warmup=0.2,
                          client=loadgen.load_client("python"))
    assert s["requests_per_s"] > 0
    assert s["throughput_Bps"] == pytest.approx(s["requests_per_s"] * 1024)
    assert 0 < s["latency_p50_s"] <= s["latency_p99_s"]
    assert s["server_cpu_fraction"] >= 0 and "other_cpu_fraction" in s
    assert s["server_user_cpu_per_request_s"] >= 0 and s["server_system_cpu_per_request_s"] >= 0


@pytest.mark.timeout(120)
@pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler")
def test_c_load_client_matrix_makes_cells_with_samples():
    client = loadgen.load_client("c")
    assert client[0] is not None and os.access(client[0][0], os.X_OK)
    rts = [_available("asyncio-protocol"), _available("trio")]
    cells = echo.run_echo_matrix(echo.echo_units(rts, [100 * 1024], [2]), duration=0.4,
                                 warmup=0.2, repeat=2, client=client, progress=lambda m: None)
    assert [c["runtime"] for c in cells] == ["asyncio-protocol", "trio"]
    for cell in cells:
        assert cell["errors"] == []
        assert cell["repeats"] == 2 and len(cell["samples"]["requests_per_s"]) == 2
        assert cell["details"]["rounds"] == [0, 1]
        assert cell["metrics"]["requests_per_s"] > 0
        assert cell["metrics"]["server_cpu_per_request_s"] > 0
        assert cell["id"] == f"echo/{cell['runtime']}/naive/connections=2,message_bytes=102400"
        assert cell["details"]["server_runtime"].endswith("instrument=false")


@pytest.mark.timeout(60)
def test_a_server_that_cannot_start_is_a_measure_error():
    bad = loadgen.ServerProcess("asyncio-protocol:high_water=1", start_timeout_s=20)
    with pytest.raises(machine.MeasureError, match="did not start") as info:
        bad.start()
    assert "unknown option 'high_water'" in str(info.value)   # the server's stderr, quoted
    assert bad.proc.poll() is not None


def test_the_server_command_pins_socket_buffers_only_when_asked():
    assert "--sockbuf" not in loadgen.ServerProcess("coro").command()
    assert loadgen.ServerProcess("coro", sockbuf=65536).command()[-2:] == ["--sockbuf", "65536"]


def _marked_processes(mark: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if mark.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


@pytest.mark.timeout(90)
@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
def test_sigterm_mid_run_keeps_finished_cells_and_stops_every_process(tmp_path):
    _available("asyncio-protocol")
    mark = f"LOOPLAB_TEST_{secrets.token_hex(6)}"
    js = tmp_path / "r.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench", "bench", "--runtimes", "asyncio-protocol",
         "--repeat", "20", "--seconds", "0.5", "--warmup", "0.1", "--client", "python",
         "--json", str(js)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        cwd=ROOT, env={**os.environ, mark: "1"})
    try:
        for line in proc.stderr:
            if line.startswith("[1/20]"):
                break
        proc.send_signal(signal.SIGTERM)
        err = proc.stderr.read()
        rc = proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
    assert rc == ExitCode.INTERRUPTED, err
    assert "interrupted" in err
    cells = results.load_json(str(js))["cells"]
    assert cells[0]["repeats"] >= 1
    deadline = time.monotonic() + 10            # the Python client's workers end on their own
    while _marked_processes(mark) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _marked_processes(mark) == []
    assert os.listdir(tmp_path) == ["r.json"]


@pytest.mark.timeout(60)
def test_idle_connections_report_memory_per_connection():
    rt = _available("asyncio-protocol")
    s = echo.measure_idle(rt, 60, progress=lambda m: None, batch=25)
    assert s["connections_count"] == 60
    assert s["server_rss_after_bytes"] > 0
    assert s["rss_per_connection_bytes"] == pytest.approx(
        (s["server_rss_after_bytes"] - s["server_rss_before_bytes"]) / 60)


def test_the_spawn_join_floor_runs_every_operation():
    # bench.perf.nokernel is the yardstick the spawn+join goal is read against
    # (docs/benchmarking.md): it must do the n spawn+joins it is counted for.
    from bench.perf import nokernel as floor
    assert floor.run(7) == 7
    assert floor.run(0) == 0


def test_icount_says_when_a_reference_is_counted_with_its_measuring_proxy(capsys):
    from bench.perf import icount
    for spec in ("uvloop-protocol", "callback", "uvloop-protocol:instrument=false", "nope"):
        icount._say_if_instrumented(spec)
    err = capsys.readouterr().err.splitlines()
    assert err == ["note: uvloop-protocol is counted with its measuring proxy on; the "
                   "benchmarks serve uvloop-protocol:instrument=false"]


def test_syscalls_without_perf_or_with_a_bad_spec_is_one_line_and_nothing_started(monkeypatch, capsys):
    from bench.perf import syscalls
    started = []
    monkeypatch.setattr(syscalls, "count", lambda *a, **k: started.append(a))
    assert syscalls.main(["nope"]) == 2
    monkeypatch.setattr(syscalls.shutil, "which", lambda name: None)
    assert syscalls.main(["coro"]) == 3
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "unknown runtime 'nope'" in err[0] and "perf is not on PATH" in err[1]
    assert started == []


def test_syscalls_counts_the_poll_that_read_ready_saves():
    # Under the lock-step load client the next request has not arrived when the echo
    # handler reads again: coro (curio's rule) asks poll() first, read=ready waits for
    # the loop's poller and makes one system call per request less.
    from bench.perf import syscalls
    from bench.perf.loadgen import load_client
    reason = syscalls.unavailable()
    if reason:
        pytest.skip(reason)
    client = load_client("auto")
    tried = syscalls.count("coro", 2, 256, 0.5, client)["per_request"]
    ready = syscalls.count("coro:read=ready", 2, 256, 0.5, client)["per_request"]
    assert tried.get("poll", 0) > 0.5 and ready.get("poll", 0) < 0.1
    assert 0.9 < tried["recvfrom"] < 1.2 and 0.9 < ready["recvfrom"] < 1.2
    assert tried["all"] - ready["all"] > 0.5


def test_opcodes_charges_each_echo_request_and_each_spawn_join_to_its_functions():
    # Counted, not timed: coro's read and send paths and its run loop show up per
    # request, and callback's transport instead; spawn+join charges the kernel's
    # spawn and in-place join.
    from bench.perf import opcodes
    coro = opcodes.echo_opcodes("coro", requests=40, conns=2)
    names = {name for (_, name) in coro}
    assert {"SocketStream.receive_some", "SocketStream.send_all"} <= names
    assert any(name.endswith("run_loop") for name in names)
    assert 100 < sum(coro.values()) < 5000
    callback = opcodes.echo_opcodes("callback", requests=40, conns=2)
    assert "SocketStream.receive_some" not in {name for (_, name) in callback}
    assert 20 < sum(callback.values()) < sum(coro.values())
    spawn = opcodes.micro_opcodes("spawn_join", "coro", small=50, large=150)
    assert any(name.endswith("build_scheduler.<locals>.join") for (_, name) in spawn)
    assert 50 < sum(spawn.values()) < 2000
    assert "total" in opcodes.table(spawn, 3)[-1]


def test_opcodes_refuses_bad_input_in_one_line(capsys):
    from bench.perf import opcodes
    assert opcodes.main(["nope"]) == 2
    assert opcodes.main(["coro@3.13"]) == 2
    assert opcodes.main(["--micro", "dance", "coro"]) == 2
    assert opcodes.main(["coro", "--small", "5", "--large", "5"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 4 and all(line.startswith("python -m bench.perf.opcodes: ") for line in err)
    assert "this interpreter only" in err[1] and "unknown micro-benchmark" in err[2]
