"""Micro-benchmarks (via pytest-benchmark) and the echo benchmark's machinery.

With plain ``pytest`` (``--benchmark-disable`` in pyproject) every micro-benchmark runs
once, as a correctness test: the port is built in ``setup`` (outside the timed region) and
the test checks that every operation really happened. ``pytest --benchmark-enable
tests/test_bench.py`` times them. No test asserts wall-clock performance.
"""
from __future__ import annotations

import argparse
import os
import shutil

import pytest

from bench import perf, results
from bench.cli import Usage
from protocols import runtimes

MICRO_N = {"spawn_join": 200, "yield": 300, "pingpong": 100, "timers": 200}
CASES = [(op, rid) for op in perf.MICRO_OPS for rid, info in runtimes.RUNTIMES.items()
         if info.style in perf._MICRO_STYLES[op]]


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
    reason = perf.unavailable(rt)
    if reason:
        pytest.skip(f"{spec}: {reason}")
    return rt


@pytest.mark.parametrize("op, spec", CASES, ids=[f"{op}-{rid}" for op, rid in CASES])
def test_micro(benchmark, op, spec):
    rt = _available(spec)
    made = []

    def setup():
        m = perf.Micro(op, rt, MICRO_N[op])     # the kernel is built here, not timed
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
    with perf.Micro("pingpong", "asyncio-streams", 10) as m:
        assert m.port is not None and m.listener is not None
        assert m.listener.getsockname()[1] > 0
        res = m.run()
        assert res.ops == 10
        with pytest.raises(RuntimeError, match="runs once"):
            m.run()
    assert m.port is None and m.listener is None


def test_micro_timers_use_seeded_delays_up_to_one_ms():
    a = perf.Micro("timers", "asyncio-protocol", 50, seed=3)
    b = perf.Micro("timers", "asyncio-protocol", 50, seed=3)
    try:
        assert a.delays == b.delays
        assert all(0 <= d <= 0.001 for d in a.delays)
    finally:
        a.close()
        b.close()


def test_micro_rejects_bad_input():
    with pytest.raises(ValueError, match="unknown micro-benchmark"):
        perf.Micro("nap", "trio", 10)
    with pytest.raises(ValueError, match="positive int"):
        perf.Micro("yield", "trio", 0)
    with pytest.raises(ValueError, match="does not apply"):
        perf.Micro("spawn_join", "asyncio-protocol", 10)
    with pytest.raises(runtimes.UsageError):
        perf.Micro("yield", "nonesuch", 10)


def test_bench_runtime_turns_reference_instrumentation_off():
    assert perf.bench_runtime(runtimes.parse("trio")).spec == "trio:instrument=false"
    assert perf.bench_runtime(runtimes.parse("asyncio-protocol")).options["instrument"] is False
    assert perf.bench_runtime(runtimes.parse("coro")).spec == "coro"


# ---------------------------------------------------------------------------
# ratio tables and goals, on synthetic cells

def _echo(rt, rps, rounds=None, m=1024, c=10):
    cell = results.new_cell("echo", rt, "naive", {"message_bytes": m, "connections": c},
                            samples={"requests_per_s": rps})
    cell["details"] = {"rounds": rounds if rounds is not None else list(range(len(rps)))}
    return cell


def test_ratio_table_pairs_rounds_and_takes_geometric_mean():
    cells = [_echo("asyncio-protocol", [100, 200, 100]), _echo("callback", [150, 200, 110]),
             _echo("asyncio-protocol", [10, 10, 10], m=10240), _echo("callback", [40, 40, 40], m=10240)]
    t = perf.ratio_table(cells, "asyncio-protocol")
    row = t["ratios"]["1 KiB x 10"]["callback"]
    assert row["ratio"] == pytest.approx(150 / 100)
    assert sorted(row["paired"]) == pytest.approx([1.0, 1.1, 1.5])
    assert t["geomean"]["callback"] == pytest.approx((1.5 * 4.0) ** 0.5)
    assert t["geomean"]["asyncio-protocol"] == pytest.approx(1.0)


def test_paired_ratios_skip_rounds_missing_on_one_side():
    base = _echo("asyncio-protocol", [100, 100, 100], rounds=[0, 1, 2])
    other = _echo("callback", [300, 120], rounds=[0, 2])      # round 1 failed
    assert sorted(perf._paired(other, base, "requests_per_s")) == [1.2, 3.0]


def test_echo_tables_render_without_baseline():
    text = perf.echo_tables([_echo("trio", [1.0, 2.0])], "asyncio-protocol")
    assert "baseline asyncio-protocol was not measured" in text


def test_goals_are_met_not_met_or_borderline():
    def micro(rt, op, vals):
        cell = results.new_cell("micro", rt, op, {}, samples={"ops_per_s": vals})
        cell["details"] = {"rounds": list(range(len(vals)))}
        return cell
    cells = [_echo("callback", [120, 120, 120]), _echo("asyncio-protocol", [100, 100, 100]),
             _echo("coro", [100, 130, 130]), _echo("curio", [100, 100, 100]),
             micro("coro", "yield", [300, 300, 300]), micro("curio", "yield", [100, 100, 100])]
    rows = {(r["kind"], r["subject"], r["reference"]): r for r in perf.evaluate_goals(cells)}
    assert rows[("echo", "callback", "asyncio-protocol")]["status"] == "met"
    assert rows[("echo", "callback", "asyncio-protocol")]["ratio"] == pytest.approx(1.2)
    coro_curio = rows[("echo", "coro", "curio")]
    assert coro_curio["status"] == "met (borderline)" and coro_curio["min"] == pytest.approx(1.0)
    assert rows[("echo", "coro", "trio")]["status"] == "not measured"
    assert rows[("yield", "coro", "curio")]["ratio"] == pytest.approx(3.0)
    assert rows[("spawn_join", "coro", "curio")]["status"] == "not measured"
    assert "callback echo 1 KiB x 10 conns >= 1.1x asyncio-protocol" in perf.goals_table(list(rows.values()))


# ---------------------------------------------------------------------------
# the command line's input checking

def _bench_args(argv):
    parser = argparse.ArgumentParser(prog="looplab")
    sub = parser.add_subparsers(dest="verb")
    perf.register(sub)
    return parser.parse_args(["bench", *argv])


@pytest.mark.parametrize("argv, message", [
    (["--sizes", "1KiB,big"], "bad sizes"),
    (["--concurrency", "0"], "bad concurrency"),
    (["--preset", "huge"], "unknown preset"),
    (["--repeat", "0"], "--repeat"),
    (["--duration", "-1"], "--duration"),
    (["--shard", "3/2", "--runtimes", "asyncio-protocol"], "bad shard"),
    (["--micro", "--ops", "nap", "--runtimes", "trio"], "unknown micro-benchmark"),
])
def test_bench_usage_errors(argv, message):
    args = _bench_args(argv)
    with pytest.raises(Usage, match=message):
        args.fn(args)


def test_bench_unknown_runtime_is_a_usage_error():
    args = _bench_args(["--runtimes", "nonesuch", "--duration", "0.1"])
    with pytest.raises(runtimes.UsageError, match="valid runtimes"):
        args.fn(args)


def test_size_lists_accept_units():
    assert perf._parse_int_list("1KiB,10k,100 KiB,512,1MiB", "sizes", allow_size=True) == \
        [1024, 10240, 102400, 512, 1 << 20]


def test_echo_units_shard_into_disjoint_covering_slices():
    rts = runtimes.parse_list("asyncio-protocol,trio,curio")
    full = perf.echo_units(rts, [1, 2], [1, 10])
    parts = [perf.echo_units(rts, [1, 2], [1, 10], f"{i}/3") for i in (1, 2, 3)]
    key = lambda u: (u[0].spec, u[1], u[2])  # noqa: E731
    assert sorted(map(key, full)) == sorted(key(u) for p in parts for u in p)
    assert len(full) == 12


# ---------------------------------------------------------------------------
# end to end: real server processes and load clients (small and short)

def test_python_load_client_measures_a_real_server():
    rt = _available("asyncio-protocol")
    s = perf.measure_echo(rt, 1024, 3, duration=0.5, warmup=0.2,
                          client=perf.load_client("python"))
    assert s["requests_per_s"] > 0
    assert s["throughput_Bps"] == pytest.approx(s["requests_per_s"] * 1024)
    assert 0 < s["latency_p50_s"] <= s["latency_p99_s"]
    assert s["server_cpu_fraction"] >= 0 and "other_cpu_fraction" in s


@pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler")
def test_c_load_client_matrix_makes_cells_with_samples():
    client = perf.load_client("c")
    assert client[0] is not None and os.access(client[0][0], os.X_OK)
    rts = [_available("asyncio-protocol"), _available("trio")]
    cells = perf.run_echo_matrix(perf.echo_units(rts, [100 * 1024], [2]), duration=0.4,
                                 warmup=0.2, repeat=2, client=client, progress=lambda m: None)
    assert [c["runtime"] for c in cells] == ["asyncio-protocol", "trio"]
    for cell in cells:
        assert cell["errors"] == []
        assert cell["repeats"] == 2 and len(cell["samples"]["requests_per_s"]) == 2
        assert cell["details"]["rounds"] == [0, 1]
        assert cell["metrics"]["requests_per_s"] > 0
        assert cell["id"] == f"echo/{cell['runtime']}/naive/connections=2,message_bytes=102400"
        assert cell["details"]["server_runtime"].endswith("instrument=false")


def test_a_server_that_cannot_start_is_a_measure_error():
    bad = perf.ServerProcess("asyncio-protocol:high_water=1", start_timeout_s=20)
    with pytest.raises(perf.MeasureError, match="did not start") as info:
        bad.start()
    assert "unknown option 'high_water'" in str(info.value)   # the server's stderr, quoted
    assert bad.proc.poll() is not None


def test_idle_connections_report_memory_per_connection():
    rt = _available("asyncio-protocol")
    s = perf.measure_idle(rt, 60, progress=lambda m: None, batch=25)
    assert s["connections_count"] == 60
    assert s["server_rss_after_bytes"] > 0
    assert s["rss_per_connection_bytes"] == pytest.approx(
        (s["server_rss_after_bytes"] - s["server_rss_before_bytes"]) / 60)
