"""``looplab bench goals``: which goals are judged on instruction counts and which on
timed rounds, how each is judged, the opcode breakdown beside the counted ones, and
the verb's refusals. Everything runs on synthetic cells and counts except one real
count under callgrind at tiny sizes (skipped without valgrind)."""
from __future__ import annotations

import argparse
import json
import re

import pytest

from bench import results, runtimes
from bench.errors import ExitCode, UsageError
from bench.perf import goals, icount, opcodes
from bench.results.tables import fmt_seconds
from bench.verbs import benchmark as benchverb
from bench import cli as looplab_cli

pytestmark = pytest.mark.timeout(120)

FLOOR = goals.FLOOR


def _echo(rt, rps, cpu=None, system=None):
    samples = {"requests_per_s": rps}
    if cpu is not None:
        samples["server_cpu_per_request_s"] = cpu
    if system is not None:
        samples["server_system_cpu_per_request_s"] = system
        samples["server_user_cpu_per_request_s"] = [t - s for t, s in zip(cpu, system)]
    cell = results.new_cell("echo", rt, "naive", {"message_bytes": 1024, "connections": 10},
                            samples=samples)
    cell["details"] = {"rounds": list(range(len(rps)))}
    return cell


def _micro_cell(rt, op, vals):
    cell = results.new_cell("micro", rt, op, {}, samples={"ops_per_s": vals})
    cell["details"] = {"rounds": list(range(len(vals)))}
    return cell


def _row(rows, subject, reference, kind="echo", python=None):
    return next(r for r in rows if (r["subject"], r["reference"], r["kind"], r["python"])
                == (subject, reference, kind, python))


def _bench_args(argv):
    parser = argparse.ArgumentParser(prog="looplab")
    benchverb.add_parser(parser.add_subparsers(dest="verb"))
    return parser.parse_args(["bench", *argv])


# ---------------------------------------------------------------------------
# which goals, judged how

def test_the_kernel_goals_are_judged_on_instructions_and_the_goals_that_settle_stay_timed():
    counted = {(g.kind, g.subject, g.reference): g.target for g in goals.GOALS if g.counted}
    assert counted == {("echo", "asyncio-streams:loop=looplab", "uvloop-streams"): 1.2,
                       ("echo", "asyncio-protocol:loop=looplab", "uvloop-protocol"): 1.6,
                       ("echo", "callback", "uvloop-protocol"): 1.6,
                       ("echo", "coro", "uvloop-streams"): 0.85,
                       ("spawn_join", "coro", FLOOR): 1.8}
    timed = {(g.kind, g.subject, g.reference, g.judged_on) for g in goals.GOALS if not g.counted}
    assert timed == {("echo", "coro", "curio", "server CPU/req"), ("echo", "coro", "trio", "server CPU/req"),
                     ("echo", "hybrid", "asyncio-streams", "req/s"), ("yield", "coro", "curio", "ops/s"),
                     ("pingpong", "coro", "curio", "ops/s")}
    # our loop's goals are declared on the runtime whose kernel it is
    callback = runtimes.get("callback")
    assert {g.subject for g in callback.goals} == {None, "asyncio-streams:loop=looplab",
                                                   "asyncio-protocol:loop=looplab"}
    # the timed rounds still measure every counted goal's runtimes (the CPU ratios
    # beside them), but not the floor, which is only counted
    assert {"asyncio-streams:loop=looplab", "uvloop-streams", "uvloop-protocol"} <= set(
        goals.GOAL_ECHO_RUNTIMES)
    assert FLOOR not in goals.GOAL_MICRO_RUNTIMES and ("spawn_join", "curio") in goals.GOAL_MICRO_UNITS
    text = _row(goals.evaluate_goals([]), "coro", FLOOR, "spawn_join")["goal"]
    assert text == "coro instructions per spawn+join <= 1.8x floor"


# ---------------------------------------------------------------------------
# goals judged on instructions

def _counted_cells():
    # In the timed rounds ours is cheaper than every reference in CPU: information only.
    return [_echo("callback", [100] * 3, cpu=[4e-6] * 3, system=[3e-6] * 3),
            _echo("uvloop-protocol", [100] * 3, cpu=[8e-6] * 3, system=[5e-6] * 3),
            _echo("asyncio-streams:loop=looplab", [100] * 3, cpu=[8e-6, 8e-6, 9e-6]),
            _echo("uvloop-streams", [100] * 3, cpu=[10e-6] * 3),
            _echo("coro", [100] * 3, cpu=[5e-6] * 3),
            _micro_cell("coro", "spawn_join", [300.0] * 3), _micro_cell("curio", "spawn_join", [30.0] * 3)]


_COUNTS = {("echo", "callback"): 8_000, ("echo", "uvloop-protocol"): 5_000,
           ("echo", "asyncio-streams:loop=looplab"): 30_000, ("echo", "uvloop-streams"): 23_000,
           ("echo", "coro"): "error (coro): callgrind failed",
           ("echo", "asyncio-protocol:loop=looplab"): 7_500,
           ("spawn_join", "coro"): 14_000, ("spawn_join", FLOOR): 8_000}


def test_a_goal_judged_on_instructions_is_met_or_not_on_its_counts_alone():
    rows = goals.evaluate_goals(_counted_cells())
    counted = [r for r in rows if r["judged_on"] == goals.INSTRUCTIONS]
    # before the counts: not measured, whatever the CPU ratios say
    assert {r["status"] for r in counted} == {"not measured"}
    goals.attach_instructions(rows, _COUNTS)
    callback = _row(rows, "callback", "uvloop-protocol")
    assert callback["counts"] == {"subject": 8_000, "reference": 5_000}
    assert callback["ratio"] == pytest.approx(1.6) and callback["status"] == "met"  # at the target
    assert callback["cost"]["cpu"]["ratio"] == pytest.approx(0.5)     # ours over theirs, information
    assert callback["cost"]["user"]["ratio"] == pytest.approx(1 / 3)
    loop = _row(rows, "asyncio-streams:loop=looplab", "uvloop-streams")
    assert loop["ratio"] == pytest.approx(30 / 23) and loop["status"] == "not met (9% over)"
    assert loop["cost"]["cpu"]["ratio"] < 1          # cheaper in the timed rounds: still not met
    # a count that failed, or one side missing or zero: not measured, never met
    coro = _row(rows, "coro", "uvloop-streams")
    assert coro["status"] == "not measured" and coro["ratio"] is None
    assert coro["cost"]["cpu"]["ratio"] == pytest.approx(0.5)
    assert _row(rows, "asyncio-protocol:loop=looplab", "uvloop-protocol")["status"] == "met"
    goals.attach_instructions(rows, {**_COUNTS, ("echo", "uvloop-protocol"): 0})
    assert _row(rows, "callback", "uvloop-protocol")["status"] == "not measured"
    assert _row(rows, "asyncio-protocol:loop=looplab", "uvloop-protocol")["status"] == "not measured"
    goals.attach_instructions(rows, _COUNTS)
    spawn = _row(rows, "coro", FLOOR, "spawn_join")
    assert spawn["ratio"] == pytest.approx(1.75) and spawn["status"] == "met"
    # the floor has no timed run: the time per operation against curio is beside it
    assert spawn["beside"]["curio"]["ratio"] == pytest.approx(0.1)
    # the timed goals are left as they were
    assert _row(rows, "coro", "curio")["status"] == "not measured" and "counts" not in _row(
        rows, "coro", "curio")
    table = goals.instruction_table(rows)
    line = next(ln for ln in table.splitlines() if ln.startswith("callback "))
    assert re.search(r"8,000 +5,000 +1\.60 +met +0\.50 \(0\.50-0\.50\) +0\.33", line)
    assert "not met (9% over)" in table and "curio: time/op 0.10" in table
    assert "coro instructions per echo request <= 0.85x uvloop-streams" in table
    assert "hybrid" not in table                     # the timed goals have their own table
    assert "error (coro): callgrind failed" in goals.count_problems(rows)
    assert "hybrid echo 1 KiB x 10 conns >= 1x asyncio-streams" in goals.goals_table(rows)
    assert "instructions per" not in goals.goals_table(rows)


def test_repeated_echo_counts_are_judged_on_the_median_paired_ratio_with_its_range():
    rows = goals.evaluate_goals(_counted_cells())
    counts = {**_COUNTS, ("echo", "callback"): [8_100, 7_900, 8_300],
              ("echo", "uvloop-protocol"): [5_000, 5_000, 5_000],
              ("echo", "asyncio-protocol:loop=looplab"): [7_000, 7_100, 7_200]}
    goals.attach_instructions(rows, counts)
    callback = _row(rows, "callback", "uvloop-protocol")
    assert callback["counts"] == {"subject": 8_100, "reference": 5_000}       # the medians
    assert callback["repeats"]["subject"] == [8_100, 7_900, 8_300]
    assert (callback["ratio"], callback["min"], callback["max"]) == pytest.approx((1.62, 1.58, 1.66))
    assert callback["n"] == 3 and callback["status"] == "not met (1% over) (borderline)"
    loop = _row(rows, "asyncio-protocol:loop=looplab", "uvloop-protocol")
    assert loop["status"] == "met" and loop["max"] == pytest.approx(1.44)     # all under it
    line = next(ln for ln in goals.instruction_table(rows).splitlines() if ln.startswith("callback "))
    assert re.search(r"8,100 +5,000 +1\.62 \(1\.58-1\.66\) +not met \(1% over\) \(borderline\)", line)
    # one repeat missing its count: the goal is not measured, never judged on the rest
    goals.attach_instructions(rows, {**counts, ("echo", "callback"): [8_100, "error (x)", 8_000]})
    assert _row(rows, "callback", "uvloop-protocol")["status"] == "not measured"
    note = goals.counting_note(goals.counting_config([None], False))
    assert f"taken {goals.ICOUNT_ECHO_REPEAT} times" in note and "median of the paired" in note


def test_each_goal_judged_on_instructions_shows_its_opcode_breakdown():
    rows = goals.evaluate_goals(_counted_cells())
    goals.attach_instructions(rows, _COUNTS)
    ours = {"functions": [["callback/loop.py:Loop.run_forever", 74.0],
                          ["callback/transports.py:SocketTransport.write", 72.0]],
            "other": 60.0, "total": 206.0, "python": "3.11.7"}
    theirs = {"functions": [["protocols/callback.py:Echo.data_received", 14.0]], "other": 26.0,
              "total": 40.0, "python": "3.11.7"}
    goals.attach_opcodes(rows, {("echo", "callback"): ours, ("echo", "uvloop-protocol"): theirs,
                                ("echo", "uvloop-streams"): theirs,
                                ("echo", "coro"): "error (coro): tracing failed"})
    assert _row(rows, "callback", "uvloop-protocol")["opcodes"] == {"subject": ours,
                                                                  "reference": theirs}
    tables = goals.breakdown_tables(rows)
    text = next(t for t in tables if t.startswith("callback instructions per echo request"))
    lines = text.splitlines()
    assert "Python opcodes per request by function" in lines[0]
    assert lines[1].split() == ["callback:", "function", "opcodes", "uvloop-protocol:", "function",
                                "opcodes"]
    assert re.search(r"callback/loop\.py:Loop\.run_forever +74\.0 +protocols/callback\.py:Echo"
                     r"\.data_received +14\.0", text)
    assert re.search(r"\(the other functions\) +60\.0 +\(the other functions\) +26\.0", text)
    assert re.search(r"total +206\.0 +total +40\.0", text)
    # one side missing: its column says why, the other side is still shown
    coro = next(t for t in tables if t.startswith("coro instructions per echo request"))
    assert coro.splitlines()[3].split()[0] == "error" and "uvloop-streams: function" in coro
    assert re.search(r"total +40\.0$", coro)
    md = goals.breakdown_tables(rows, markdown=True)[0]
    assert md.startswith("**callback instructions") and "| callback/loop.py:Loop.run_forever | 74.0 |" in md


def test_echo_counts_are_repeated_in_rounds_and_micro_counts_taken_once_as_benchmarked(monkeypatch):
    counted = []

    def fake_echo(spec, conns, size, requests, out_dir, extra=(), pause=0.0):
        counted.append(("echo", spec, requests))
        return [(10_000 if spec.startswith("callback") else 12_000) * requests], "x"

    def fake_micro(op, spec, n, out_dir, extra=()):
        counted.append((op, spec, n))
        return [(1_000 if spec.startswith("coro") else 600) * n * icount.ops_per_n(op)], "x"
    monkeypatch.setattr(icount, "instructions", fake_echo)
    monkeypatch.setattr(icount, "micro_instructions", fake_micro)
    monkeypatch.setattr(goals, "split_available", lambda rts: (list(rts), {}))
    counts = goals.count_instructions(progress=lambda m: None)
    assert counts[("echo", "callback")] == [10_000] * goals.ICOUNT_ECHO_REPEAT
    assert counts[("spawn_join", FLOOR)] == 600
    # an echo runtime twice (small and large) a round, every runtime once a round before
    # the next round starts; a micro one twice in all. References and our loop served
    # as the timed goals serve them, the floor as itself; nothing of the timed goals
    runs = [(k, s) for k, s, _ in counted]
    assert all(runs.count(r) == (2 * goals.ICOUNT_ECHO_REPEAT if r[0] == "echo" else 2)
               for r in runs)
    echo = [s for k, s in runs if k == "echo"]
    assert echo[:len(echo) // 3] == echo[len(echo) // 3:2 * len(echo) // 3]     # in rounds
    assert {s for _, s in runs} == {"callback", "uvloop-protocol:instrument=false", "uvloop-streams:instrument=false",
                          "asyncio-streams:instrument=false,loop=looplab",
                          "asyncio-protocol:instrument=false,loop=looplab", "coro", FLOOR}
    assert {(k, n) for k, s, n in counted if k == "spawn_join"} == {("spawn_join", 300),
                                                                     ("spawn_join", 1500)}
    # per interpreter: the floor on that interpreter too
    counted.clear()
    counts = goals.count_instructions(("3.13",), progress=lambda m: None,
                                      goals=[g for g in goals.GOALS if g.kind == "spawn_join"],
                                      micro=(10, 40))
    assert sorted(counts) == [("spawn_join", "coro@3.13"), ("spawn_join", "floor@3.13")]
    assert {n for _, _, n in counted} == {10, 40}


def test_a_runtime_whose_count_fails_is_an_error_in_its_cell_not_the_run(monkeypatch):
    def broken(*a, **k):
        raise ValueError("")                      # no message at all: its type stands in

    monkeypatch.setattr(icount, "instructions", broken)
    monkeypatch.setattr(icount, "micro_instructions", broken)
    monkeypatch.setattr(goals, "split_available",
                        lambda rts: ([rt for rt in rts if rt.id != "uvloop-streams"],
                                     {rt.spec: "no uvloop" for rt in rts if rt.id == "uvloop-streams"}))
    counts = goals.count_instructions(progress=lambda m: None)
    assert counts[("echo", "callback")] == "error (callback): ValueError"
    assert counts[("echo", "uvloop-streams")] == "unavailable (uvloop-streams): no uvloop"
    rows = goals.evaluate_goals([])
    goals.attach_instructions(rows, counts)
    assert {r["status"] for r in rows if r["judged_on"] == goals.INSTRUCTIONS} == {"not measured"}


def test_opcodes_are_broken_down_once_per_counted_runtime_and_a_failure_stays_in_its_cell(monkeypatch):
    asked = []

    def fake(kind, spec, top, *sizes):
        asked.append((kind, spec))
        if spec == "coro":
            raise RuntimeError("the echo client failed")
        return {"functions": [["f", 1.0]], "other": 0.0, "total": 1.0, "python": "3.11.7"}
    monkeypatch.setattr(opcodes, "breakdown", fake)
    monkeypatch.setattr(goals, "split_available", lambda rts: (list(rts), {}))
    out = goals.count_opcodes(progress=lambda m: None)
    assert len(asked) == len(set(asked)) and ("spawn_join", FLOOR) in asked
    assert ("echo", "asyncio-protocol:loop=looplab") in asked
    assert out[("echo", "coro")] == "error (coro): the echo client failed"
    assert out[("echo", "callback")]["total"] == 1.0


def test_the_opcode_tool_counts_the_floor_for_spawn_join_only(capsys):
    assert opcodes.main(["--micro", "yield", FLOOR]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "spawn_join only" in err
    assert opcodes.main(["--micro", "spawn_join", FLOOR, "--json", "--small", "5",
                         "--large", "15"]) == 0
    data = json.loads(capsys.readouterr().out)
    names = [name for name, _ in data["functions"]]
    assert "perf/nokernel.py:_spawn" in names and "perf/nokernel.py:_join" in names
    assert data["total"] == pytest.approx(sum(n for _, n in data["functions"]) + data["other"])


def test_the_echo_floor_serves_the_echo_app_until_interrupted():
    # the yardstick `icount floor` counts: the shared echo app, every byte back in
    # order on every connection, a closed client forgotten, exit 0 on Ctrl-C
    import signal
    import socket
    import subprocess
    import sys

    from bench.host import procs
    proc = subprocess.Popen([sys.executable, "-m", "bench.perf.nokernel", "echo"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=procs.child_env())
    try:
        m = re.match(r"listening on (127\.0\.0\.1):(\d+)", proc.stdout.readline())
        assert m, proc.stderr.read()
        addr = (m.group(1), int(m.group(2)))
        a, b = (socket.create_connection(addr, timeout=10) for _ in range(2))
        with a, b:
            for i in range(20):
                for s, tag in ((a, b"a"), (b, b"b")):
                    s.sendall(tag * (100 + i))
                for s, tag in ((a, b"a"), (b, b"b")):
                    got = b""
                    while len(got) < 100 + i:
                        chunk = s.recv(4096)
                        assert chunk, "the floor closed a connection"
                        got += chunk
                    assert got == tag * (100 + i)
            a.close()
            b.sendall(b"still here")
            assert b.recv(100) == b"still here"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


# ---------------------------------------------------------------------------
# timed goals

def test_echo_goals_split_server_cpu_into_user_and_system():
    # curio 10 us a request (6 of them system), coro 8 us (6 system): 1.25x in CPU,
    # 2x in user time alone; the goal is judged on the first, shows both.
    cells = [_echo("curio", [100] * 3, cpu=[10e-6] * 3, system=[6e-6] * 3),
             _echo("coro", [100] * 3, cpu=[8e-6] * 3, system=[6e-6] * 3)]
    row = _row(goals.evaluate_goals(cells), "coro", "curio")
    assert row["ratio"] == pytest.approx(1.25) and row["status"] == "met"
    assert row["user"]["ratio"] == pytest.approx(2.0)
    table = goals.goals_table([row])
    assert "user CPU/req ratio" in table and "2.00" in table
    assert row["user_budget"]["user_s"] == pytest.approx(10e-6 / 1.25 - 6e-6)
    assert goals.budget_lines([row]) == []             # met: nothing to explain


def test_a_cpu_goal_not_met_says_what_user_time_it_would_need():
    ref = _echo("curio", [100] * 3, cpu=[10e-6] * 3, system=[6e-6] * 3)
    slow = _echo("coro", [100] * 3, cpu=[9.5e-6] * 3, system=[6e-6] * 3)
    row = _row(goals.evaluate_goals([ref, slow]), "coro", "curio")
    assert row["status"].startswith("not met")
    [line] = goals.budget_lines([row])
    need = 10e-6 / 1.25 - 6e-6
    assert line.endswith(f"coro's user time must be at most {fmt_seconds(need)} per request "
                         f"(it is {fmt_seconds(3.5e-6)}; round by round, the median excess is "
                         f"{fmt_seconds(3.5e-6 - need)})")
    assert f"curio spends {fmt_seconds(4e-6)} user + {fmt_seconds(6e-6)}" in line
    # not judged (an interrupted run): no line
    assert goals.budget_lines(goals.unjudged_if_interrupted([row], True)) == []
    # a system time over the whole allowance: no user time could meet it
    heavy = _echo("coro", [100] * 3, cpu=[12e-6] * 3, system=[9e-6] * 3)
    row = _row(goals.evaluate_goals([ref, heavy]), "coro", "curio")
    assert goals.budget_lines([row])[0].endswith("coro's system time alone is over what the "
                                                 "goal allows")
    # per round, so the budget's sign follows the judged median: one round far under
    # the goal does not turn a goal met in two rounds of three into "over"
    mixed = _echo("coro", [100] * 3, cpu=[7.5e-6, 7.5e-6, 20e-6], system=[6e-6] * 3)
    row = _row(goals.evaluate_goals([ref, mixed]), "coro", "curio")
    assert row["status"].startswith("met") and row["user_budget"]["over_s"] < 0
    # cells without the split (older results files): no budget, no line
    old = [_echo("curio", [100] * 3, cpu=[10e-6] * 3), _echo("coro", [100] * 3, cpu=[9e-6] * 3)]
    assert all("user_budget" not in r for r in goals.evaluate_goals(old))


def test_timed_goals_are_judged_on_their_paired_rounds_with_the_runtimes_beside(monkeypatch):
    cells = [_echo("curio", [100, 100, 100], cpu=[10e-6] * 3),
             _echo("coro", [50, 60, 70], cpu=[10e-6 / 1.3, 10e-6 / 1.25, 10e-6 / 1.1]),
             _echo("trio", [100, 100, 100], cpu=[15e-6] * 3),
             _echo("hybrid", [120, 90, 110]), _echo("asyncio-streams", [100] * 3),
             _micro_cell("coro", "yield", [300, 300, 300]), _micro_cell("curio", "yield", [100, 100, 100])]
    rows = goals.evaluate_goals(cells)
    curio = _row(rows, "coro", "curio")
    assert curio["judged_on"] == "server CPU/req" and curio["ratio"] == pytest.approx(1.25)
    assert curio["min"] == pytest.approx(1.1) and curio["status"] == "met (borderline)"
    assert curio["rate"]["ratio"] == pytest.approx(0.6)          # req/s, beside it
    hybrid = _row(rows, "hybrid", "asyncio-streams")
    assert hybrid["judged_on"] == "req/s" and hybrid["ratio"] == pytest.approx(1.1)
    assert hybrid["status"] == "met (borderline)"
    assert _row(rows, "coro", "trio")["status"].startswith("not met (gap")
    assert _row(rows, "coro", "curio", "yield")["ratio"] == pytest.approx(3.0)
    assert _row(rows, "coro", "curio", "pingpong")["status"] == "not measured"
    # a runtime beside a timed goal: measured in the same rounds, on the same metric,
    # never judged
    extra = goals.Goal("echo", "coro", "curio", 1.25, "echo", "server CPU/req", beside=("trio",))
    monkeypatch.setattr(goals, "GOALS", [extra])
    [row] = goals.evaluate_goals(cells)
    assert row["beside"]["trio"]["ratio"] == pytest.approx(1.5 * 1.25)
    assert "trio: 1.87 (1.65-1.95)" in goals.goals_table([row])


def test_goals_are_judged_per_interpreter_against_the_same_interpreter():
    # coro@3.12 is 3x curio@3.12 and coro@3.13 2x curio@3.13; a cell or a count of
    # another interpreter never stands in for a missing one.
    cells = [_micro_cell("coro@3.12", "yield", [300, 300]), _micro_cell("curio@3.12", "yield", [100, 100]),
             _micro_cell("coro@3.13", "yield", [200, 200]), _micro_cell("curio@3.13", "yield", [100, 100]),
             _micro_cell("coro@3.13", "pingpong", [10, 10]), _micro_cell("curio", "pingpong", [1, 1])]
    rows = goals.evaluate_goals(cells, ("3.12", "3.13"))
    assert _row(rows, "coro", "curio", "yield", "3.12")["ratio"] == pytest.approx(3.0)
    assert _row(rows, "coro", "curio", "yield", "3.13")["ratio"] == pytest.approx(2.0)
    assert _row(rows, "coro", "curio", "pingpong", "3.13")["status"] == "not measured"
    goals.attach_instructions(rows, {("spawn_join", "coro@3.13"): 16_000,
                                     ("spawn_join", "floor@3.13"): 8_000,
                                     ("spawn_join", "coro"): 1_000, ("spawn_join", FLOOR): 1_000})
    assert _row(rows, "coro", FLOOR, "spawn_join", "3.13")["status"] == "not met (11% over)"
    assert _row(rows, "coro", FLOOR, "spawn_join", "3.12")["status"] == "not measured"
    table = goals.goals_table(rows)
    assert table.splitlines()[0].startswith("python") and "3.13" in table
    assert goals.instruction_table(rows).splitlines()[0].startswith("python")
    specs = [rt.spec for rt in goals.goal_runtimes(("3.12",))]
    assert specs[:2] == ["callback@3.12", "uvloop-protocol@3.12"]
    assert "asyncio-streams@3.12:loop=looplab" in specs      # the pin goes before the options


def test_goals_echo_tables_compare_each_interpreter_with_its_own_baseline():
    # With --python the echo cells are pinned (asyncio-protocol@3.13): the ratio table
    # is one per interpreter against that interpreter's baseline, never across them.
    cells = [_echo("asyncio-protocol@3.12", [100, 100]), _echo("callback@3.12", [150, 150]),
             _echo("asyncio-protocol@3.13", [100, 100]), _echo("callback@3.13", [300, 300])]
    t312, t313 = benchverb._echo_tables_by_python(cells, ("3.12", "3.13"))
    assert "relative to asyncio-protocol@3.12" in t312 and "not measured" not in t312
    assert "1.50" in t312 and "3.00" not in t312 and "@3.13" not in t312
    assert "relative to asyncio-protocol@3.13" in t313 and "3.00" in t313
    assert runtimes.on_interpreter("coro:spawn=eager", "3.13") == "coro@3.13:spawn=eager"
    assert runtimes.on_interpreter("coro", None) == "coro"


# ---------------------------------------------------------------------------
# the verb

def test_goals_refuse_an_interpreter_that_is_not_here(capsys):
    assert looplab_cli.main(["bench", "goals", "--python", "1.9", "--repeat", "1"]) == ExitCode.USAGE
    assert "no Python 1.9" in capsys.readouterr().err


@pytest.fixture
def measured(monkeypatch):
    """The verb's measurements replaced: timed rounds from ``_counted_cells`` (plus a
    timed goal met), counts from ``_COUNTS``; ``calls`` records what ran."""
    calls = []

    def fake_goals(repeat, *a, **kw):
        calls.append("timed")
        cells = _counted_cells() + [_micro_cell("coro", "yield", [300.0] * repeat),
                                    _micro_cell("curio", "yield", [100.0] * repeat)]
        return cells, goals.evaluate_goals(cells), {}

    def fake_counts(pythons, progress):
        calls.append("counted")
        return _COUNTS

    def fake_opcodes(pythons, progress):
        calls.append("opcodes")
        return {("echo", "callback"): {"functions": [["callback/loop.py:Loop.run_forever", 74.0]],
                                       "other": 1.0, "total": 75.0, "python": "3.11.7"},
                ("echo", "uvloop-protocol"): {"functions": [["protocols/cores.py:EchoCore.receive", 17.0]],
                                              "other": 23.0, "total": 40.0, "python": "3.11.7"}}
    monkeypatch.setattr(benchverb, "run_goals", fake_goals)
    monkeypatch.setattr(benchverb, "count_instructions", fake_counts)
    monkeypatch.setattr(benchverb, "count_opcodes", fake_opcodes)
    monkeypatch.setattr(benchverb, "load_client", lambda kind: (None, "python (test)"))
    monkeypatch.setattr(benchverb, "icount_missing", lambda: None)
    return calls


def test_the_verb_judges_on_counts_and_shows_the_breakdown_everywhere(measured, tmp_path, capsys):
    out = tmp_path / "g"
    args = _bench_args(["goals", "--instructions", "--repeat", "2", "--out", str(out)])
    assert args.func(args) == ExitCode.OK
    assert measured == ["timed", "counted", "opcodes"]
    printed = capsys.readouterr().out
    md = (out / "bench.md").read_text()
    page = (out / "report.html").read_text()
    for text in (printed, md, page):
        assert "callback/loop.py:Loop.run_forever" in text and "protocols/cores.py:EchoCore.receive" in text
        assert "not met (9% over)" in text and "callgrind" in text
        assert "2,000 and 10,000" in text                 # how the counts were taken
    assert "### Goals judged on instructions" in md and "### Timed goals" in md
    doc = results.load_json(str(out / "results.json"))
    row = _row(doc["goals"], "callback", "uvloop-protocol")
    assert row["status"] == "met" and row["counts"] == {"subject": 8000, "reference": 5000}
    assert row["opcodes"]["reference"]["total"] == 40.0
    how = doc["config"]["instructions"]
    assert how["echo"] == list(goals.ICOUNT_ECHO) and how["micro"] == list(goals.ICOUNT_MICRO)
    assert list(how["interpreters"]) == ["looplab's"] and how["opcodes"]["top"] == goals.OPCODES_TOP
    # --fail: a goal not met, or not measured, fails the run
    args = _bench_args(["goals", "--repeat", "2", "--fail", "--out", str(tmp_path / "h")])
    assert args.func(args) == ExitCode.FAILED


def test_without_valgrind_goals_exit_3_before_measuring_unless_only_cpu_is_asked(
        measured, monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(benchverb, "icount_missing", lambda: "valgrind is not on PATH")
    for argv in (["goals"], ["goals", "--instructions"]):
        args = _bench_args([*argv, "--repeat", "1", "--out", str(tmp_path / "g")])
        assert args.func(args) == ExitCode.ENVIRONMENT
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "cannot count instructions: valgrind is not on PATH" in err
    assert measured == [] and not (tmp_path / "g").exists()     # refused before any folder is made
    args = _bench_args(["goals", "--cpu-only", "--repeat", "2", "--out", str(tmp_path / "g")])
    assert args.func(args) == ExitCode.OK
    assert measured == ["timed"]                                  # nothing counted
    printed = capsys.readouterr().out
    line = next(ln for ln in printed.splitlines() if ln.startswith("callback "))
    assert "not measured" in line and "0.50" in line              # the CPU ratio, as information
    assert "--cpu-only: no instructions were counted" in printed
    doc = results.load_json(str(tmp_path / "g" / "results.json"))
    assert doc["config"]["cpu_only"] is True and doc["config"]["instructions"] is None
    assert _row(doc["goals"], "coro", "curio", "yield")["status"] == "met"
    with pytest.raises(UsageError, match="--cpu-only leaves out"):
        args = _bench_args(["goals", "--cpu-only", "--instructions", "--out", str(tmp_path / "x")])
        args.func(args)
    assert not (tmp_path / "x").exists()


def test_the_load_average_a_run_states_is_the_one_before_it_measured(monkeypatch, tmp_path):
    # The benchmark loads both CPUs itself, so a load average read after it says
    # nothing about the machine it ran on ("load under 0.5, stated").
    loads = iter([[0.2, 0.3, 0.4], [1.9, 1.5, 1.2], [1.9, 1.5, 1.2], [1.9, 1.5, 1.2]])
    monkeypatch.setattr(results.document.os, "getloadavg", lambda: tuple(next(loads)))

    def fake_goals(repeat, *a, **kw):
        cells = [_echo("curio", [100] * repeat, cpu=[10e-6] * repeat),
                 _echo("coro", [100] * repeat, cpu=[9e-6] * repeat)]
        results.document.os.getloadavg()         # the benchmark's own load
        return cells, goals.evaluate_goals(cells), {}
    monkeypatch.setattr(benchverb, "run_goals", fake_goals)
    monkeypatch.setattr(benchverb, "load_client", lambda kind: (None, "python (test)"))
    args = _bench_args(["goals", "--cpu-only", "--repeat", "2", "--out", str(tmp_path / "g")])
    assert args.func(args) == ExitCode.OK
    assert results.load_json(str(tmp_path / "g" / "results.json"))["env"]["loadavg"] == [0.2, 0.3, 0.4]
    assert "load average at start: [0.2, 0.3, 0.4]" in (tmp_path / "g" / "bench.md").read_text()


def test_goals_print_what_a_cpu_goal_not_met_leaves_for_user_time(monkeypatch, tmp_path, capsys):
    def fake_goals(repeat, *a, **kw):
        cells = [_echo("curio", [100] * repeat, cpu=[10e-6] * repeat, system=[6e-6] * repeat),
                 _echo("coro", [100] * repeat, cpu=[9.5e-6] * repeat, system=[6e-6] * repeat)]
        return cells, goals.evaluate_goals(cells), {}
    monkeypatch.setattr(benchverb, "run_goals", fake_goals)
    monkeypatch.setattr(benchverb, "load_client", lambda kind: (None, "python (test)"))
    args = _bench_args(["goals", "--cpu-only", "--repeat", "2", "--out", str(tmp_path / "g")])
    assert args.func(args) == ExitCode.OK
    line = (f"coro's user time must be at most {fmt_seconds(10e-6 / 1.25 - 6e-6)} per request "
            f"(it is {fmt_seconds(3.5e-6)};")
    assert line in capsys.readouterr().out
    assert line in (tmp_path / "g" / "bench.md").read_text()


# ---------------------------------------------------------------------------
# one real count

@pytest.mark.timeout(900)
def test_a_real_count_judges_the_spawn_join_goal_against_the_floor():
    missing = goals.icount_missing()
    if missing:
        pytest.skip(missing)
    spawn = [g for g in goals.GOALS if g.counted and g.kind == "spawn_join"]
    counts = goals.count_instructions(progress=lambda m: None, goals=spawn, micro=(10, 40))
    breakdowns = goals.count_opcodes(progress=lambda m: None, goals=spawn)
    rows = goals.evaluate_goals([])
    goals.attach_instructions(rows, counts)
    goals.attach_opcodes(rows, breakdowns)
    row = _row(rows, "coro", FLOOR, "spawn_join")
    ours, floor = row["counts"]["subject"], row["counts"]["reference"]
    assert isinstance(ours, float) and isinstance(floor, float), row["counts"]
    # a kernel adds to what the API alone costs; both are thousands of instructions
    assert 1_000 < floor < ours < 100_000
    assert row["ratio"] == pytest.approx(ours / floor)
    assert row["status"] != "not measured"
    assert (row["status"] == "met") == (row["ratio"] <= row["target"])
    names = [n for n, _ in row["opcodes"]["reference"]["functions"]]
    assert "perf/nokernel.py:_spawn" in names
    assert row["opcodes"]["subject"]["total"] > row["opcodes"]["reference"]["total"]
