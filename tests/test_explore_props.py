"""Declared properties (always, eventually, sometimes), the failing schedule's
trace beside the nearest passing one, and where a deadlocked cell's tasks
wait (``looplab explore``; small programs and budgets)."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re

import pytest

from bench import cli
from bench.scenarios import properties as props
from bench.explore import bugs, checks, exploration, search, targets
from bench.scenarios.api import Scenario, always, eventually, observe, sometimes
from kernels import simnet


def _here() -> str:
    """This file as the task lines show it (relative to the current folder)."""
    return os.path.relpath(__file__)


def _program(bug_id, **changes):
    """A copy of one of the benchmark programs with other declarations."""
    return dataclasses.replace(bugs.PROGRAMS[bug_id], id=f"{bug_id}-test", **changes)


def test_a_target_without_declarations_keeps_the_plain_recorder():
    t = targets.ProgramTarget(_program("cpython-23812", properties=()))
    legal = search.legal_kinds("asyncio")
    assert type(exploration.recorder(t, "asyncio", "naive", legal, None)) is search.Recorder
    declared = targets.resolve("cpython-23812")
    assert isinstance(exploration.recorder(declared, "asyncio", "naive", legal, None), checks.Watched)


def test_observe_costs_nothing_and_keeps_nothing_when_nobody_watches():
    props.watch(None)
    props.STATE.clear()
    observe(x=1)
    assert props.STATE == {}


def test_an_always_violated_is_a_failure_with_its_schedule_and_replays(tmp_path):
    # the fixed queue program never fails by itself; the property does, in the race window
    t = targets.ProgramTarget(_program("cpython-23812", properties=(
        always("no cancellation in the window", lambda s: not s.app.get("cancel_in_window")),)))
    r = exploration.explore(t, "asyncio", "fixed", "delays:1", 100)
    assert r["found"] and r["outcome"] == "violated: always no cancellation in the window"
    assert r["first_failure"] > 1                  # the default order does not reach it
    assert r["target_outcome"] == "ok" and r["violation_at"] == pytest.approx(bugs.AT, abs=1e-3)
    assert r["shrunk_deviations"] == 1 and r["replay_exact"]
    doc = r["schedule"]
    assert doc["properties"] == [["always", "no cancellation in the window"]]
    again = exploration.replay(json.loads(json.dumps(doc)), t)
    assert again["exact"] and again["outcome"] == r["outcome"]


def test_an_eventually_is_violated_at_its_deadline_and_holds_when_met():
    late = _program("cpython-86296", properties=(
        eventually("the worker has stopped", lambda s: "worker" in s.app and s.app["worker"].done(),
                   within_s=bugs.AT + 0.5),))
    r = exploration.explore(targets.ProgramTarget(late), "asyncio", "naive", "delays:1", 100)
    assert r["found"] and r["outcome"] == "violated: eventually the worker has stopped: not by t=1.5s"
    # checked at the deadline itself (a world event), not at the next choice point
    assert r["violation_at"] == pytest.approx(bugs.AT + 0.5)
    assert r["target_outcome"].startswith("hang") and r["liveness"]
    ok = exploration.explore(targets.ProgramTarget(late), "asyncio", "fixed", "delays:1", 100)
    assert not ok["found"] and ok["proved"]
    never = _program("cpython-86296", properties=(
        eventually("never", lambda s: False, within_s=100.0),))
    r2 = exploration.explore(targets.ProgramTarget(never), "asyncio", "fixed", "delays:0", 5)
    assert r2["outcome"] == "violated: eventually never: the run ended first"


def test_a_sometimes_never_reached_is_vacuous_and_no_proof(monkeypatch, capsys):
    bug = _program("cpython-23812", properties=(
        sometimes("the window", lambda s: s.app.get("cancel_in_window")),
        sometimes("a state no schedule reaches", lambda s: s.app.get("nowhere"))))
    r = exploration.explore(targets.ProgramTarget(bug), "asyncio", "fixed", "delays:1", 100)
    assert not r["found"] and "proved" not in r
    assert r["not_proved"].startswith("not a proof: no failing schedule within 1 delay")
    n = r["schedules"]
    assert r["properties"]["vacuous"] == [
        f"vacuous: a state no schedule reaches never reached in {n} schedules"]
    assert 1 < r["properties"]["reached"]["the window"] <= n
    # the command line: exit status 1, the line printed
    monkeypatch.setitem(bugs.PROGRAMS, bug.id, bug)
    assert cli.main(["explore", bug.id, "--runtimes", "asyncio", "--variant", "fixed",
                     "--strategy", "delays:1"]) == 1
    out = capsys.readouterr().out
    assert "vacuous: a state no schedule reaches never reached in" in out
    assert "not a proof" in out


def test_shards_merge_what_each_reached():
    shards = [{"unit": 0}, {"unit": 0}]
    declared = [["sometimes", "a"], ["sometimes", "b"]]
    results = [{"schedules": 3, "wall_s": 1, "cpu_s": 1, "found": False,
                "properties": {"declared": declared, "reached": {"a": 2}, "vacuous": ["b"]}},
               {"schedules": 4, "wall_s": 1, "cpu_s": 1, "found": False,
                "properties": {"declared": declared, "reached": {"b": 1}, "vacuous": ["a"]}}]
    from bench.explore import verb
    m = verb._merge(shards, results)[0]
    assert m["properties"]["reached"] == {"a": 2, "b": 1} and m["properties"]["vacuous"] == []


def test_a_predicate_that_raises_is_an_error_of_the_run():
    bug = _program("cpython-23812", properties=(always("broken", lambda s: s.app["missing"]),))
    r = exploration.explore(targets.ProgramTarget(bug), "asyncio", "fixed", "delays:0", 5,
                       do_shrink=False)
    assert r["found"] and r["outcome"].startswith("error: property predicate raised KeyError")


def test_the_trace_names_the_first_differing_choice_beside_the_nearest_passing_run(tmp_path):
    r = exploration.explore(targets.resolve("cpython-23812"), "asyncio", "naive", "delays:1", 100)
    tr = r["schedule"]["trace"]
    step, choice = r["schedule"]["deviations"][0][:2]
    assert tr["first_difference"] == step
    fail, ok = tr["failing"]["choices"], tr["passing"]["choices"]
    assert fail[step][:3] == ["io-order", 2, choice] and ok[step][:3] == ["io-order", 2, 0]
    assert fail[:step] == ok[:step]              # the same up to there, labels included
    # what each picked: the connection (role, peer) and the task its readiness wakes,
    # never a bare fd number
    for lab in (fail[step][3], ok[step][3]):
        assert lab.startswith("read ") and "peer 127.0.0.1:" in lab and "-> task on_" in lab, lab
        assert "fd " not in lab
    assert fail[step][3] != ok[step][3]
    assert tr["passing"]["outcome"] == "ok" and tr["failing"]["outcome"] == r["outcome"]
    assert any(line.startswith(f"  >> step {step}: io-order {choice}/2") for line in tr["lines"])
    # the command line writes both runs into the replay file
    out = tmp_path / "ex"
    assert cli.main(["explore", "cpython-23812", "--runtimes", "asyncio", "--strategy",
                     "delays:1", "--out", str(out)]) == 1
    doc = json.loads((out / "failing-cpython-23812_asyncio_naive.json").read_text())
    assert doc["trace"]["first_difference"] == step and doc["trace"]["passing"]["choices"]


def test_coro_ready_choices_are_labelled_by_task():
    from kernels.coro import Kernel, sleep, spawn
    world = simnet.World(0, log=False)
    rec = checks.Watched(search.legal_kinds("coro", net=False), lambda step, kind, n: n - 1,
                         trace=True)
    world.install_chooser(rec)

    async def worker(name):
        await sleep(0)

    async def top():
        tasks = [await spawn(worker, n) for n in "ab"]
        for t in tasks:
            await t.join()
    with Kernel(io=world.io()) as k:
        k.run(top)
    labels = [lab for (kind, _, _), lab in zip(rec.points, rec.labels) if kind == "ready"]
    assert labels and all("worker" in lab or "top" in lab for lab in labels)


def test_a_deadlocked_worlds_tasks_are_listed_with_where_they_wait():
    # coro: a task waits for bytes that never come
    from kernels.coro import Kernel, spawn
    world = simnet.World(0, log=False)
    got = []
    world.on_deadlock = lambda: got.extend(checks.running_tasks())
    io = world.io()
    a, b = io.socketpair()

    async def reader():
        from kernels.coro import read_wait
        await read_wait(a)

    async def top():
        t = await spawn(reader)
        await t.join()
    with pytest.raises(simnet.SimDeadlock):
        with Kernel(io=io) as k:
            k.run(top)
    line = reader.__code__.co_firstlineno + 2
    assert any(g.startswith("coro task") and "reader: waits at " in g
               and g.endswith(f"test_explore_props.py:{line} in reader") for g in got), got
    a.close()
    b.close()
    # asyncio's selector loop on the world: a task waits on a future nobody sets
    from protocols import simports
    world2 = simnet.World(0, log=False)
    got2 = []
    world2.on_deadlock = lambda: got2.extend(checks.running_tasks())
    loop = simports.SimSelectorEventLoop(world2.io())

    async def parked():
        await loop.create_future()
    try:
        with pytest.raises(simnet.SimDeadlock):
            loop.run_until_complete(parked())
    finally:
        for t in asyncio.all_tasks(loop):
            t.cancel()
        loop.close()
    # the task's name and coroutine, and the user's file:line, not asyncio's future
    assert len(got2) == 1 and re.fullmatch(
        rf"Task-\d+ \(parked\): waits at \S*test_explore_props.py:"
        rf"{parked.__code__.co_firstlineno + 1} in parked", got2[0]), got2


def test_s3_declares_properties_a_cell_checks():
    t = targets.resolve("S3:drain")
    kinds = {p.kind for p in t.properties}
    assert kinds == {"always", "sometimes"}
    r = exploration.explore(t, "callback", "drain", "random", 2)
    assert not r["found"] and r["properties"]["reached"] == {"the drain waiter is parked": 1}
    # the drain waiter is declared for the callback and stream ports only
    assert [p.name for p in checks.declared(t, "drain", "coro")] == \
        ["bytes delivered <= bytes written"]
    assert [p.name for p in checks.declared(t, "fixed", "callback")] == \
        ["bytes delivered <= bytes written"]


def test_a_scenario_checks_its_declarations():
    base = dict(id="P1", title="t", summary="s", run=lambda ctx: None,
                metrics=[__import__("bench.scenarios.api", fromlist=["Metric"]).Metric("x_bytes")],
                verdicts={"ok": "ok"}, presets={"tiny": {}})
    assert Scenario(**base, properties=(always("a", lambda s: True),)).problems() == []
    bad = Scenario(**base, properties=(
        eventually("late", lambda s: True, within_s=0),
        sometimes("other", lambda s: True, variants=("nope",)),
        "not a property"))
    problems = bad.problems()
    assert any("within_s" in p for p in problems)
    assert any("variant 'nope'" in p for p in problems)
    assert any("always/eventually/sometimes" in p for p in problems)


def test_a_cells_properties_read_its_peers():
    t = targets.resolve("S3")
    t.properties = (always("nothing arrives", lambda s: s.received("reader") == 0),)
    r = exploration.explore(t, "callback", "fixed", "delays:0", 3)
    assert r["found"] and r["outcome"] == "violated: always nothing arrives"
    assert r["violation_at"] >= t.params["start_after_s"] and r["replay_exact"]
    eof = lambda s: s.ended("reader") == "eof"     # noqa: E731
    t.properties = (eventually("EOF", eof, within_s=0.1),)
    r = exploration.explore(t, "callback", "fixed", "delays:0", 3, do_shrink=False)
    assert r["outcome"] == "violated: eventually EOF: not by t=0.1s"
    t.properties = (eventually("EOF", eof, within_s=lambda p: p["max_s"]),)
    assert not exploration.explore(t, "callback", "fixed", "delays:0", 3)["found"]
    t.properties = (always("a typo", lambda s: s.received("raeder") >= 0),)
    r = exploration.explore(t, "callback", "fixed", "delays:0", 3, do_shrink=False)
    assert r["outcome"].startswith("error: property predicate raised LookupError: no peer 'raeder'")


USER_SCENARIO = '''
from bench import peers
from bench.scenarios.api import Metric, Scenario, always, observe, run_program, sometimes


async def send(port, host, tcp_port, n):
    stream = await port.open_tcp_stream(host, tcp_port)
    observe(written_bytes=n)
    await stream.send_all(b"x" * n)
    await stream.aclose()


def program(job):
    port = job.runtime.open()
    try:
        port.run(send, *job.peer("reader"), job.params["total_bytes"])
    finally:
        port.close()
    return {"written_bytes": job.params["total_bytes"]}


def run(ctx):
    ran = run_program(ctx, peers=[peers.reader(max_s=10)], max_s=10)
    got = ran.peers["reader"]["received_bytes"]
    return ({"delivered_bytes": got}, {"all_arrived": got == ran.app["written_bytes"]}, [])


SCENARIO = Scenario(
    id="UPROPS", title="user send and close", run=run, programs={"task": program},
    styles=("task",), summary="Sends then closes. Does every byte arrive?",
    metrics=[Metric("delivered_bytes", "higher", "delivered")],
    verdicts={"all_arrived": "the reader got every byte written"},
    presets={"tiny": {"total_bytes": 100_000}},
    properties=(
        always("delivered <= written",
               lambda s: s.received("reader") <= s.app.get("written_bytes", 0)),
        sometimes("the reader has half", lambda s: s.received("reader") >= 50_000),
        sometimes("the reader has twice", lambda s: s.received("reader") >= 200_000)))
'''


def test_a_users_scenario_file_declares_properties_explore_checks(tmp_path, capsys):
    path = tmp_path / "user_props.py"
    path.write_text(USER_SCENARIO)
    out = tmp_path / "ex"
    rc = cli.main(["explore", "UPROPS", "--scenario-file", str(path), "--runtimes", "coro",
                   "--strategy", "delays:0", "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 1, text                   # one sometimes is never reached: vacuous
    assert "sometimes the reader has half: reached (schedule 1)" in text
    assert "vacuous: the reader has twice never reached in 1 schedules" in text
    assert "not a proof: no failing schedule within 0 delays (1 schedules)" in text
    doc = json.loads((out / "explore.json").read_text())["explorations"][0]
    assert doc["properties"]["reached"] == {"the reader has half": 1}


def test_a_zoo_entry_declares_a_sometimes_its_fix_reaches():
    t = targets.resolve("uvicorn-336")
    r = exploration.explore(t, "callback", "fixed", "delays:1", 200)
    assert r["proved"] and r["properties"]["reached"] == {
        "the writer is parked when the connection is lost": 1}
    # declared for the callback port only: nothing to reach on a stream port
    assert checks.declared(t, "fixed", "asyncio-streams") == ()


def test_trio_tasks_are_listed_at_a_deadlock_with_their_own_frame():
    """A deadlock on trio (seen by its simulated clock; on curio, by the
    simulated poller under its kernel, below) lists each task where its own code
    waits, not the library's trap."""
    trio = pytest.importorskip("trio")
    from protocols import simports
    world = simnet.World(0, log=False)
    got = []
    world.on_deadlock = lambda: got.extend(checks.running_tasks())

    async def stuck():
        await trio.sleep_forever()

    async def main():
        async with trio.open_nursery() as n:
            n.start_soon(stuck)
    with pytest.raises(simnet.SimDeadlock):
        simports.run_trio(world.io(), main)
    line = stuck.__code__.co_firstlineno + 1
    assert any(g.startswith("trio task") and
               g.endswith(f".stuck: waits at {_here()}:{line} in stuck") for g in got), got
    # the root task (looplab's wrapper around main) waits in the user's main
    assert any(g.startswith("trio task") and f"waits at {_here()}:" in g and g.endswith(" in main")
               for g in got), got
    assert len(got) == 2 and not any(g.split()[2].startswith("<") for g in got)  # no system task


def test_curio_tasks_are_listed_at_a_deadlock_with_their_own_frame():
    curio = pytest.importorskip("curio")
    from protocols import ports
    from bench import runtimes
    world2 = simnet.World(0, log=False)
    got2 = []
    world2.on_deadlock = lambda: got2.extend(checks.running_tasks())
    with ports.using_io(world2.io()):
        port = runtimes.parse("curio").open()

    async def waiter(port):
        await curio.Event().wait()
    try:
        with pytest.raises(simnet.SimDeadlock):
            port.run(waiter)
    finally:
        port.close()
    line = waiter.__code__.co_firstlineno + 1
    assert any(g.startswith("curio task") and g.endswith(f"waits at {_here()}:{line} in waiter")
               for g in got2), got2
    assert checks.running_tasks() == []          # nothing runs here now


def test_a_runtime_whose_task_lister_fails_is_named_and_the_rest_still_listed(monkeypatch):
    from dataclasses import replace

    from bench import runtimes
    broken = replace(runtimes.get("coro"), id="lister-breaks", tasks="nosuch.module:tasks",
                     requires=())
    monkeypatch.setitem(runtimes.RUNTIMES, broken.id, broken)
    lines = checks._declared_tasks()
    assert [ln for ln in lines if ln.startswith("lister-breaks")] == [
        "lister-breaks: its tasks could not be listed (ModuleNotFoundError: No module named 'nosuch')"]
