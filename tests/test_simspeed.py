"""What makes simulated cells cheap must not change what they compute.

The poller asks an fd for its readiness only when something marked it
(``SimPoller._look``), roles skip a poke when nothing changed since their last
turn (``SimPeer._poked``), a sim cell's garbage collector walks only the
cell's own objects (``programs.own_garbage``) and the programs share one zero
payload. Each shortcut rests on an invariant; these tests check the
invariants, not the speed (no wall-clock assertions anywhere).
"""
from __future__ import annotations

import gc
import json
import warnings

import pytest

from bench import peers
from bench.scenarios import programs
from bench.run import seeds
from bench import run as matrix
from bench.peers.sim import play
from kernels import simnet
from kernels.simnet import READ, WRITE, World

pytestmark = pytest.mark.timeout(300)

WALL = ("cell_wall_s", "cell_cpu_s")


@pytest.fixture
def verified_polls(monkeypatch):
    """Every wait's answer is checked against a full scan of the fds."""
    monkeypatch.setattr(simnet.SimPoller, "verify_skips", True)


def _sim_cells(sids, runtimes, preset="tiny"):
    cells = matrix.plan(sids, runtimes, None, preset)
    for c in cells:
        c.params["net"] = "sim"
    return cells


def test_the_poller_never_misses_readiness_in_any_scenario(verified_polls):
    """Every scenario and variant at the tiny preset on our kernels and on
    asyncio (SimSelector), plus faulted and jittered universes: a skipped look
    that a full scan would have answered differently raises AssertionError,
    which the cell records as an error."""
    cells = _sim_cells("S1,S3,S5,S6,S7,S8", "callback,hybrid,coro,asyncio-protocol")
    plain = [(c, matrix.run_cell(c)) for c in cells]
    assert [(c.id, r["errors"]) for c, r in plain if r["errors"]] == []
    faulted = [(seed, c, matrix.run_cell(seeds.seed_cell(c, seed, faults=3)))
               for seed in range(2) for c in cells if c.scenario in ("S1", "S3", "S6")]
    assert len(plain) + len(faulted) > 60
    for seed, c, r in faulted:     # a fault may end a cell in an error; a missed fd may not
        assert not any("AssertionError" in e for e in r["errors"]), (c.id, seed, r["errors"])


def test_verify_skips_catches_a_change_made_without_changed(verified_polls):
    """The check itself can fail: data slipped into a receive buffer behind
    the world's back is seen by the full scan and not by the look."""
    world = World(seed=1)
    io = world.io()
    a, b = io.socketpair()
    poller = io.poller()
    poller.register(b.fileno(), READ)
    assert poller.wait(0.01) == []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(simnet.SimSocket, "_changed", lambda self: None)   # the invariant, broken
        a.send(b"x")
        with pytest.raises(AssertionError, match="without _changed"):
            poller.wait(0.01)


def test_a_wait_after_a_partial_look_reports_what_a_full_scan_finds_in_readiness_order():
    world = World(seed=1)
    io = world.io()
    (a1, b1), (a2, b2) = io.socketpair(), io.socketpair()
    poller = io.poller()
    poller.register(b2.fileno(), READ)
    poller.register(b1.fileno(), READ)
    poller.register(a1.fileno(), WRITE)
    assert poller.wait(0.01) == [(a1.fileno(), WRITE)]
    a1.send(b"one")
    a2.send(b"two")
    world.run(until=world.now + 0.01)     # delivered; the poller has not looked since
    got = poller.wait(0)
    # a1 is back at the head (reported, still writable), then b1 and b2 as "one"
    # and "two" arrived, whatever the order they were registered in
    assert got == [(a1.fileno(), WRITE), (b1.fileno(), READ), (b2.fileno(), READ)]
    assert sorted(got) == sorted(poller.ready())


def test_a_waker_wakes_a_poller_that_saw_nothing():
    world = World(seed=1)
    io = world.io()
    waker = io.waker()
    poller = io.poller()
    poller.register(waker.fileno(), READ)
    world.call_at(0.5, waker.wake)
    assert poller.wait(None) == [(waker.fileno(), READ)]
    assert world.now == 0.5
    waker.drain()
    assert poller.wait(0.1) == []


def test_a_peer_socket_keeps_its_watcher_and_the_poller_still_sees_it():
    world = World(seed=1)
    sink = play(world, peers.sink(), listen=("127.0.0.1", 9001))
    io = world.io()
    c = io.socket()
    c.setblocking(False)
    c.connect_ex(("127.0.0.1", 9001))
    world.run(until=0.01)
    peer_sock = sink.sock
    watcher = peer_sock._watcher
    poller = io.poller()
    poller.register(peer_sock.fileno(), WRITE)
    assert peer_sock._watcher == watcher          # the peer still hears its socket
    assert poller.wait(0.01) == [(peer_sock.fileno(), WRITE)]


def test_roles_skipping_idle_pokes_give_the_same_results_as_acting_on_each():
    """``SimPeer._poked`` skips a poke when nothing changed since the role's
    last turn; acting on every poke instead must change nothing."""
    from bench.peers import sim as simpeers
    cells = _sim_cells("S1,S3,S5,S6", "callback")

    def results():
        out = []
        for c in cells:
            r = matrix.run_cell(c)
            for name in WALL:
                r["metrics"].pop(name)
                r["samples"].pop(name)
            r.pop("load", None)      # the machine's load averages while the cell ran
            out.append(json.dumps(r, sort_keys=True))
        return out
    skipping = results()
    always = simpeers.SimPeer._poked

    def act_every_time(self):
        self._act()
    simpeers.SimPeer._poked = act_every_time
    try:
        acting = results()
    finally:
        simpeers.SimPeer._poked = always
    assert skipping == acting


def _reader_world(act_every_poke: bool, **sink):
    """A source role at 3 MB/s into a sink role with ``sink`` fields, to the end."""
    from bench import peers
    from bench.scenarios import simulated as simcells
    from bench.peers import sim as simpeers
    cell = simcells.SimCell(simcells.new_world(3, jitter_s=3e-5))
    cfg = peers.check_role({**peers.sink(**sink), "deferred": True}, 10.0)
    role = simpeers.make_role(cell, cfg)
    role.listen(cell.address())
    play(cell.world, peers.source(rate_Bps=3_000_000, frame_bytes=32768, duration_s=2.0,
                                  finish="close"), connect=role.address(), stage=cell)
    if act_every_poke:
        role._poked = role._act
    cell.world.run(until=12.0)
    return json.dumps(role.result(), sort_keys=True)


@pytest.mark.parametrize("sink", [
    {"rate_Bps": 1_000_000, "stall_at_s": 0.4, "stall_s": 0.3, "start_after_s": 0.2},
    {"rate_Bps": 700_000, "stall_at_s": 0.05, "stall_s": 1.0},
    {"start_after_s": 0.5, "recv_bytes": 4096},
])
def test_a_resting_reader_gives_what_a_reader_acting_on_every_poke_gives(sink):
    """Rate buckets, a stall and a late start: the pokes a resting role skips
    (``SimPeer._rest_until``) would have changed nothing, timers included."""
    assert _reader_world(False, **sink) == _reader_world(True, **sink)


def test_a_programs_own_garbage_reports_inside_its_capture():
    """Under ``own_garbage`` the capture's collection still finds a cycle the
    program made, and its destructor's warning lands among the lines."""
    class Cyclic:
        def __init__(self):
            self.me = self

        def __del__(self):
            warnings.warn("unclosed cyclic thing", ResourceWarning)

    with programs.own_garbage():
        with programs.capture_output() as captured:
            Cyclic()
    assert any("unclosed cyclic thing" in line for line in captured.lines), captured.lines
    assert gc.get_freeze_count() == 0              # everything unfrozen again


def test_own_garbage_nests_and_unfreezes_once():
    with programs.own_garbage(collect=True):
        frozen = gc.get_freeze_count()
        assert frozen > 0
        with programs.own_garbage():
            assert gc.get_freeze_count() == frozen
        assert gc.get_freeze_count() == frozen
    assert gc.get_freeze_count() == 0


def test_keeping_freed_memory_is_asked_once_and_says_whether_it_took():
    from bench.scenarios import simulated as simcells
    first = simcells.keep_freed_memory()
    assert isinstance(first, bool)
    assert simcells.keep_freed_memory() is first


def test_programs_share_one_zero_payload_per_size():
    a = programs._zeros(1000)
    assert a == bytes(1000) and programs._zeros(1000) is a
    b = programs._zeros(10)
    assert b == bytes(10) and programs._zeros(1000) == bytes(1000)


def test_a_sim_cell_reports_its_cpu_time_and_drops_it_with_the_wall_clock():
    cell = _sim_cells("S3", "coro")[0]
    r = matrix.run_cell(cell)
    assert not r["errors"], r["errors"]
    cpu = r["samples"]["cell_cpu_s"]
    assert len(cpu) == 1 and cpu[0] >= 0 and r["metrics"]["cell_cpu_s"] == cpu[0]
    assert set(WALL) <= set(r["samples"]) and "sim_s" in r["samples"]
    assert set(WALL) == set(seeds.WALL_CLOCK)
    assert gc.get_freeze_count() == 0


def test_simshare_splits_a_cells_cpu_between_the_world_and_the_program(capsys):
    """``python -m bench.perf.simshare``: the world's share is part of the
    cell's CPU, some of it (the peers act only inside the world), and the
    wrapped entry points are put back afterwards, also when a cell raises."""
    from bench.perf import simshare

    def entry_points():
        return ([simnet.SimPoller.wait, World._run_due]
                + [getattr(simnet.SimSocket, n) for n in simshare.SOCKET_CALLS])
    before = entry_points()
    [row] = simshare.shares(matrix.plan("S6", "coro", "disconnect", "tiny"))
    assert entry_points() == before
    assert row["id"] == "S6/coro/disconnect/tiny/sim" and row["sim_s"] > 0.5
    assert 0 < row["world_cpu_s"] < row["cell_cpu_s"]
    with pytest.raises(ZeroDivisionError):
        with simshare.timed_seam():
            assert entry_points() != before
            1 / 0
    assert entry_points() == before
    # a cell on another interpreter runs out of the wrappers' reach: not split
    assert simshare.shares(matrix.plan("S6", "coro@3.99", "block", "tiny")) == []
    assert simshare.main(["--scenarios", "S6", "--runtimes", "coro", "--variants",
                          "block", "--preset", "tiny"]) == 0
    out = capsys.readouterr().out
    assert "S6/coro/block/tiny/sim" in out and " 1 cell; " in out
    assert simshare.main(["--scenarios", "S99"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("simshare: ") and err.count("\n") == 1
