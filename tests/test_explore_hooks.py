"""Exploration reaching trio and curio (trio's batch order drawn by the chooser,
one select's events ordered by the simulated selector), and the cancellation
programs whose cancellation point is left to the scheduler (small budgets)."""
from __future__ import annotations

import sys

import pytest

from bench.explore import bugs, exploration, search, targets
from kernels import choice, simnet


from test_explore import Script     # the chooser that answers from a list per kind


def test_legality_now_reaches_trio_and_curio():
    trio = search.legal_kinds("trio", net=False)
    curio = search.legal_kinds("curio", net=False)
    assert trio == {choice.READY}
    # curio promises a FIFO ready queue; only the order of one select's events is open
    assert curio == {choice.IO_ORDER}


def _ready_pair(world):
    io = world.io()
    pairs = [io.socketpair() for _ in range(3)]
    sel = world.selector()
    for app, peer in pairs:
        app.setblocking(False)
        sel.register(app, 1)
        peer.send(b"x")
    return sel, pairs


def test_the_simulated_selector_orders_one_selects_events_when_asked():
    w = simnet.World(0, log=False)
    sel, pairs = _ready_pair(w)
    default = [k.fd for k, _ in sel.select(1.0)]
    assert len(default) == 3
    assert default == sorted(default)           # readiness order (the sends), nobody asked
    sel.close()

    w = simnet.World(0, log=False)
    script = Script(io_order=[2, 0])
    w.install_chooser(script)
    sel, pairs = _ready_pair(w)
    got = [k.fd for k, _ in sel.select(1.0)]
    assert got == [default[2], default[0], default[1]]
    assert script.asked == [("io-order", 3), ("io-order", 2)]
    # a loop that orders the events itself opts out, so it is not asked twice
    script.asked.clear()
    sel.orders_events = False
    sel.select(1.0)
    assert script.asked == []
    sel.close()


def test_asyncios_sim_loop_orders_its_events_once():
    from protocols import simports
    w = simnet.World(0, log=False)
    w.install_chooser(Script())
    loop = simports.SimSelectorEventLoop(w.io())
    try:
        assert loop._selector.orders_events is False
    finally:
        loop.close()


def test_a_trio_cell_makes_ready_choices_and_replays_exactly():
    pytest.importorskip("trio")
    core = sys.modules.get("trio._core._run") or pytest.importorskip("trio._core._run")
    before = (core._r, core._ALLOW_DETERMINISTIC_SCHEDULING)
    t = targets.resolve("zoo:httpcore-830")
    legal = search.legal_kinds("trio")
    rec = search.Recorder(legal)
    r = t.run("trio", "fixed", rec)
    assert not r.failed, r.outcome
    ready = [k for k, (kind, n, _) in enumerate(rec.points) if kind == choice.READY]
    assert ready, rec.points
    # trio's generator and flag are put back after the run
    assert (core._r, core._ALLOW_DETERMINISTIC_SCHEDULING) == before
    devs = {ready[0]: 1}
    rec2, r2 = exploration._run(t, "trio", "fixed", legal, devs)
    assert rec2.points[ready[0]] == (choice.READY, rec.points[ready[0]][1], 1)
    doc = exploration.schedule_doc(t, "trio", "fixed", legal, devs, rec2, r2, "delays:1", True, False)
    again = exploration.replay(doc, t)
    assert again["exact"] and again["same_points"]


NEW = ("cpython-102780", "redis-py-2624", "httpcore-830")


@pytest.mark.parametrize("bug_id", NEW)
def test_the_cancellation_programs_fail_only_off_the_default_order(bug_id):
    t = targets.resolve(bug_id)
    assert isinstance(t, targets.ProgramTarget) and bug_id in bugs.BENCHMARK
    assert "zoo:" + bug_id in bugs.BENCHMARK            # the zoo entry of the same bug
    for rt in t.runtimes:
        rec = search.Recorder(search.legal_kinds(rt))
        assert not t.run(rt, "naive", rec).failed            # the default order passes
        found = exploration.explore(t, rt, "naive", "delays:1", 100)
        assert found["found"] and found["shrunk_deviations"] == 1 and found["replay_exact"]
        assert found["outcome"].startswith("violated:")


@pytest.mark.parametrize("bug_id", NEW)
def test_the_fixed_cancellation_programs_are_proved_within_two_delays(bug_id):
    t = targets.resolve(bug_id)
    r = exploration.explore(t, "asyncio", "fixed", "delays:2", 600)
    assert r.get("proved", "").startswith("proved: no failing schedule within 2 delays"), r


@pytest.mark.parametrize("answers, woken", [([], ["a", "b"]), ([1], ["b", "a"])])
def test_curio_wakes_the_tasks_of_one_select_in_the_chosen_order(answers, woken):
    curio = pytest.importorskip("curio")
    from protocols import simports
    w = simnet.World(0, log=False)
    script = Script(io_order=answers)
    w.install_chooser(script)
    io = w.io()
    (a, pa), (b, pb) = io.socketpair(), io.socketpair()
    order = []

    async def reader(name, sock):
        await curio.traps._read_wait(sock)
        order.append(name)

    async def main():
        tasks = [await curio.spawn(reader, "a", a), await curio.spawn(reader, "b", b)]
        w.call_at(0.5, pa.send, b"x")
        w.call_at(0.5, pb.send, b"x")       # both readable in one select
        for t in tasks:
            await t.join()

    with simports.curio_kernel(io) as kernel:
        kernel.run(main)
    for s in (a, pa, b, pb):
        s.close()
    assert order == woken
    assert ("io-order", 2) in script.asked
