"""Schedule exploration: the kernels' choice points, the legality model, the
strategies, shrinking, replay and the liveness phase (small budgets)."""
from __future__ import annotations

import asyncio
import json

import pytest

from bench import cli
from bench.errors import UsageError
from bench.explore import bugs, exploration as runner, search, targets, verb
from kernels import choice, io as kio, simnet


class Script:
    """A chooser that answers from a list per kind and logs every question."""

    def __init__(self, **answers):
        self.answers = {k.replace("_", "-"): list(v) for k, v in answers.items()}
        self.asked = []

    def choose(self, kind, n):
        self.asked.append((kind, n))
        q = self.answers.get(kind)
        return q.pop(0) if q else 0


def _world(chooser=None):
    w = simnet.World(0, log=False)
    if chooser is not None:
        w.install_chooser(chooser)
    return w


# ---------------------------------------------------------------------------
# choice points in the kernels

def test_real_io_carries_no_chooser_and_the_loop_asks_nobody():
    from kernels.callback.loop import Loop
    assert getattr(kio.REAL, "chooser", None) is None
    with Loop() as loop:
        assert loop._chooser is None
    assert _world().io().chooser is None


def test_permute_takes_each_choice_among_those_left():
    picks = iter([2, 0])
    assert choice.permute(lambda k, n: next(picks), "ready", ["a", "b", "c"]) == ["c", "a", "b"]
    assert choice.permute(lambda k, n: 0, "ready", [1, 2, 3]) == [1, 2, 3]


def test_callback_loop_orders_ready_callbacks_and_timer_ties_as_chosen():
    from kernels.callback.loop import Loop
    script = Script(ready=[2], timer_tie=[1])
    world = _world(script)
    ran = []
    loop = Loop(io=world.io())
    try:
        for name in "abc":
            loop.call_soon(ran.append, name)
        loop.call_at(1.0, ran.append, "t1")
        loop.call_at(1.0, ran.append, "t2")
        loop.call_at(1.0, loop.stop)
        loop.run_forever()
    finally:
        loop.close()
    assert ran[:3] == ["c", "a", "b"]
    # the tie of three timers: index 1 first ("t2"), then the rest in order
    assert ran[3:] == ["t2", "t1"]
    assert ("ready", 3) in script.asked and ("timer-tie", 3) in script.asked


def _two_readable(world, io, loop, ran):
    socks = []
    for name in ("x", "y"):
        app, peer = io.socketpair()
        app.setblocking(False)
        socks += [app, peer]
        loop.add_reader(app.fileno(), lambda s=app, n=name: (ran.append(n), s.recv(10)))
        world.call_at(0.5, peer.send, b"!")
    return socks


def test_callback_loop_reorders_one_polls_io_events():
    from kernels.callback.loop import Loop
    for answer, want in ((0, ["x", "y"]), (1, ["y", "x"])):
        script = Script(io_order=[answer])
        world = _world(script)
        io = world.io()
        ran = []
        loop = Loop(io=io)
        socks = _two_readable(world, io, loop, ran)
        loop.call_at(0.6, loop.stop)
        try:
            loop.run_forever()
        finally:
            loop.close()
            for s in socks:
                s.close()
        assert ran == want
        assert ("io-order", 2) in script.asked


def test_coro_kernel_steps_the_ready_task_the_chooser_picks():
    from kernels.coro import Kernel, sleep, spawn

    def run(chooser):
        order = []

        async def worker(name):
            await sleep(0)
            order.append(name)

        async def top():
            tasks = [await spawn(worker, n) for n in "abc"]
            for t in tasks:
                await t.join()
        world = _world(chooser)
        Kernel(io=world.io()).run(top)
        return order

    assert run(None) == ["a", "b", "c"]
    script = Script(ready=[2, 0, 2, 0])
    chosen = run(script)
    assert sorted(chosen) == ["a", "b", "c"] and chosen != ["a", "b", "c"]
    assert any(k == "ready" for k, _ in script.asked)


def test_asyncio_selector_loop_on_the_sim_orders_timer_ties_as_chosen():
    from protocols import simports
    script = Script(timer_tie=[1])
    world = _world(script)
    loop = simports.SimSelectorEventLoop(world.io())
    ran = []
    try:
        loop.call_at(1.0, ran.append, "first")
        loop.call_at(1.0, ran.append, "second")
        loop.call_at(1.5, loop.stop)
        loop.run_forever()
    finally:
        loop.close()
    assert ran == ["second", "first"]


def test_world_network_choices_are_none_or_the_most():
    script = Script(net=[1, 0])
    w = _world(script)
    assert w._rng.random() > 0.99 and w._rng.random() == 0.0


# ---------------------------------------------------------------------------
# legality, strategies, shrinking, replay, liveness

def test_legality_follows_each_runtimes_contract():
    cb = search.legal_kinds("callback", net=False)
    assert choice.READY not in cb and choice.TIMER_TIE not in cb and choice.IO_ORDER in cb
    assert choice.TIMER_TIE in search.legal_kinds("asyncio-protocol", net=False)
    assert choice.READY in search.legal_kinds("coro", net=False)
    assert choice.READY in search.legal_kinds("callback", net=False, portability=True)
    assert choice.NET in search.legal_kinds("trio")
    rec = search.Recorder(cb, lambda step, kind, n: 1)
    assert rec.choose(choice.READY, 3) == 0 and rec.points == []     # illegal: not a point
    assert rec.choose(choice.IO_ORDER, 2) == 1 and rec.points == [("io-order", 2, 1)]


def test_strategy_parsing_refuses_bad_text():
    assert isinstance(search.parse_strategy("pct:d=3"), search.PCT)
    for bad in ("pct:d=0", "delays:x", "bfs", "pct:3"):
        with pytest.raises(ValueError):
            search.parse_strategy(bad)


def test_delay_bounding_enumerates_each_schedule_once():
    # a fake target: three binary choice points, failing only for {1: 1, 2: 1}
    class Fake(targets.Target):
        name = "fake"

        def run(self, runtime, variant, chooser):
            got = [chooser.choose(choice.IO_ORDER, 2) for _ in range(3)]
            return targets.RunResult(got == [0, 1, 1], "bad" if got == [0, 1, 1] else "ok")
    seen = []
    s = search.DelayBounded(1)
    while (decide := s.next()) is not None:
        rec = search.Recorder(search.legal_kinds("callback"), decide)
        r = Fake().run("callback", "naive", rec)
        seen.append(tuple(rec.deviations().items()))
        s.done(rec, r.failed)
    assert len(seen) == len(set(seen)) == 4 and s.exhausted
    r1 = runner.explore(Fake(), "callback", "naive", "delays:1", 100)
    assert not r1["found"] and r1["proved"] == "proved: no failing schedule within 1 delay (4 schedules)"
    r2 = runner.explore(Fake(), "callback", "naive", "delays:2", 100)
    assert r2["found"] and r2["shrunk_deviations"] == 2 and r2["replay_exact"]


@pytest.mark.parametrize("bug", sorted(bugs.PROGRAMS))
def test_each_program_bug_is_found_shrunk_replayed_and_its_fix_proved(bug):
    t = targets.resolve(bug)
    for rt in ("asyncio", "callback"):
        found = runner.explore(t, rt, "naive", "delays:1", 200)
        fixed = runner.explore(t, rt, "fixed", "delays:2", 2000)
        assert fixed["proved"].startswith("proved: no failing schedule within 2 delays (")
        if bug == "cpython-86296" and rt == "callback":
            # two timers due together: our callback kernel promises scheduling order
            assert not found["found"] and found["proved"]
            assert runner.explore(t, rt, "naive", "delays:1", 200, portability=True)["found"]
            continue
        assert found["found"] and found["shrunk_deviations"] <= 2 and found["replay_exact"]
        assert found["first_failure"] > 1          # the default order passes


def test_a_hang_is_a_liveness_violation_with_the_tasks_and_where_they_wait():
    r = runner.explore(targets.resolve("cpython-27585"), "asyncio", "naive", "delays:1", 100)
    assert r["liveness"] and r["outcome"].startswith("hang")
    assert any("user" in line for line in r["pending"])


def test_a_zoo_hang_is_a_liveness_violation_with_its_schedule_and_the_fix_is_not(tmp_path):
    # uvicorn-336: the writer parked in drain() is never released after the disconnect
    t = targets.resolve("uvicorn-336")
    r = runner.explore(t, "callback", "naive", "delays:1", 50)
    assert r["found"] and r["liveness"] and r["outcome"].startswith("hang: ")
    assert any("drain()" in line for line in r["pending"]) and r["replay_exact"]
    fixed = runner.explore(t, "callback", "fixed", "delays:1", 200)
    assert not fixed["found"] and fixed["proved"]
    # hybrid's drain() is released by the loss: no hang there
    assert not runner.explore(t, "hybrid", "naive", "delays:0", 5)["found"]


def test_zoo_prefix_names_the_entry_a_program_shares_its_id_with():
    assert isinstance(targets.resolve("cpython-86296"), targets.ProgramTarget)
    t = targets.resolve("zoo:cpython-86296")
    assert isinstance(t, targets.CellTarget) and t.name == "zoo:cpython-86296"
    assert t.applies("asyncio-streams") is None
    assert runner.explore(t, "asyncio-streams", "naive", "delays:0", 5)["found"]
    with pytest.raises(UsageError):
        targets.resolve("zoo:S3")


def test_the_zoos_cancellation_entries_on_the_simulated_network_are_in_the_benchmark():
    from bench.zoo import registry
    cancel = [e.id for e in registry.ENTRIES.values() if not e.sim_skip()
              and any(getattr(fn, "__module__", "") == "bench.zoo.cancel"
                      for fn in e.scenario.programs.values())]
    assert len(cancel) >= 5
    for eid in cancel:
        tid = f"zoo:{eid}" if eid in bugs.PROGRAMS else eid
        assert tid in bugs.BENCHMARK
        assert isinstance(targets.resolve(tid), targets.CellTarget)


def test_pct_prints_its_guarantee_from_the_measured_k_and_n():
    r = runner.explore(targets.resolve("cpython-23812"), "asyncio", "naive", "pct:d=2", 300)
    info = r["strategy_info"]
    assert info["k"] > 0 and info["guarantee"] == pytest.approx(1 / (info["n"] * info["k"]))
    assert r["found"]


def test_cell_targets_run_zoo_entries_with_the_chooser_installed():
    t = targets.resolve("trio-1626")
    flipped = "coro:io_schedule_point=true,deadline_check=at-checkpoint"
    assert runner.explore(t, flipped, "naive", "random", 5)["first_failure"] == 1
    assert runner.explore(t, "coro", "naive", "delays:0", 5)["proved"]
    assert t.applies("callback")


def test_cli_writes_a_schedule_that_replays_exactly(tmp_path, capsys):
    out = tmp_path / "ex"
    rc = cli.main(["explore", "cpython-23812", "--runtimes", "asyncio", "--strategy",
                   "delays:1", "--out", str(out)])
    assert rc == 1
    doc = json.loads((out / "failing-cpython-23812_asyncio_naive.json").read_text())
    assert doc["model"] == runner.SCHEDULE_MODEL and doc["code"] and doc["delays"] == 1
    capsys.readouterr()
    assert cli.main(["explore", "--replay", str(out / "failing-cpython-23812_asyncio_naive.json")]) == 0
    assert "exact: yes" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["explore", "S99"], ["explore", "S3", "--strategy", "dfs"],
                                  ["explore"], ["explore", "--replay", "/nonexistent.json"]])
def test_cli_usage_mistakes_are_one_line_and_exit_2(argv, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("looplab: ")


def test_shards_split_the_budget_and_merge_back():
    units = [{"strategy": "random", "budget": 100, "seed": 0},
             {"strategy": "delays:1", "budget": 100, "seed": 0}]
    shards = verb._shard(units, 4)
    assert sum(s["budget"] for s in shards if s["unit"] == 0) >= 100
    assert len({s["seed"] for s in shards if s["unit"] == 0}) > 1
    # a delays:D unit is dealt out in parts of its space, not seeds
    parts = [s for s in shards if s["unit"] == 1]
    assert [p["shard"] for p in parts] == [(0, 2), (1, 2)]
    assert {p["seed"] for p in parts} == {0} and {p["budget"] for p in parts} == {100}
    results = [{"schedules": 10, "wall_s": 1.0, "cpu_s": 1.0, "found": False}] * len(shards)
    merged = verb._merge(shards, results)
    # each part re-ran the default schedule, which counts once
    assert len(merged) == 2 and [m["schedules"] for m in merged] == [20, 19]


def test_an_error_out_of_a_programs_world_is_an_error_outcome_not_a_pass():
    # A world event that raises (a peer script's send to a closed socket, say)
    # comes out of run_forever; it must be reported, never read as "ok".
    class Boom(bugs.Context):
        def __init__(self, world, io, messages=(b"stop", b"item")):
            super().__init__(world, io, messages)

            def boom():
                raise BrokenPipeError(32, "a peer's send to a closed socket")
            world.call_at(0.5, boom)

    async def program(ctx):
        await asyncio.sleep(1)

    bug = bugs.Bug("boom", "a world event raises", "", "", program, program, context=Boom)
    r = targets.ProgramTarget(bug).run("asyncio", "naive", search.Recorder(search.legal_kinds("asyncio")))
    assert r.failed and r.outcome.startswith("error: BrokenPipeError")
