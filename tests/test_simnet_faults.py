"""The simulated network's wire faults (loss, clog, partition) on a plain socket
pair, their validation, and the shrinking of a failing schedule's times and
parameters (bench.run.seeds.shrink).

Every run is in virtual time: a few hundred events, no sleeping, no real socket.
"""
from __future__ import annotations

import errno

import pytest

from bench.run import seeds as simruns
from kernels.simnet import READ, WRITE, World
from kernels.simnet.constants import RTO_MIN_S

pytestmark = pytest.mark.timeout(60)

A = ("127.0.0.1", 9000)
LAT = 50e-6          # the world's default one-way latency


def pairs(world, n=1):
    """``n`` connected (client, server) pairs through one listener, in connect
    order (connection i is pair i)."""
    io = world.io()
    ls = io.socket()
    ls.setblocking(False)
    ls.bind(A)
    ls.listen(8)
    out = []
    for _ in range(n):
        c = io.socket()
        c.setblocking(False)
        assert c.connect_ex(A) == errno.EINPROGRESS
        world.run(until=world.now + 4 * LAT)
        s, _ = ls.accept()
        s.setblocking(False)
        out.append((c, s))
    ls.close()
    return out


def deliveries(world, conn=None):
    return [(t, n) for t, kind, c, side, n in world.log
            if kind == "deliver" and (conn is None or c == conn)]


def drain(sock, world, until):
    """Everything ``sock`` receives until virtual time ``until``."""
    got = bytearray()
    while world.now < until:
        world.run(until=min(until, world.now + 0.01))
        while True:
            try:
                chunk = sock.recv(1 << 20)
            except BlockingIOError:
                break
            if not chunk:
                break
            got += chunk
    return bytes(got)


# -- loss -----------------------------------------------------------------------

def test_a_lost_segment_is_retransmitted_after_the_rto_doubling():
    # p=1 from 1 ms for 0.5 s: the try at t0 and the one at t0+0.2 are lost,
    # the one at t0+0.2+0.4 is outside the window and gets through
    w = World(1, faults=[{"at": 0.001, "kind": "loss", "conn": 0, "side": "server",
                          "duration_s": 0.5, "p": 1.0}])
    (c, s), = pairs(w)
    w.run(until=0.001)
    t0 = w.now
    assert s.send(b"x" * 1000) == 1000
    w.run(until=2.0)
    assert [e[4] for e in w.log if e[1] == "loss"] == [1, 2]
    (t, n), = deliveries(w, 0)
    assert n == 1000
    assert t == pytest.approx(t0 + RTO_MIN_S + 2 * RTO_MIN_S + LAT, abs=1e-9)
    assert c.recv(5000) == b"x" * 1000


def test_loss_delays_but_delivers_every_byte_in_order_and_the_writer_blocks():
    data = bytes(range(256)) * 800                       # 204,800 bytes
    w = World(3, mss=4096, faults=[{"at": 0.001, "kind": "loss", "conn": 0,
                                    "side": "server", "duration_s": 1.0, "p": 0.5}])
    (c, s), = pairs(w)
    w.run(until=0.001)
    sent = 0
    blocked = 0
    got = bytearray()
    while len(got) < len(data) and w.now < 60:
        try:
            sent += s.send(data[sent:]) if sent < len(data) else 0
        except BlockingIOError:
            blocked += 1
        w.run(until=w.now + 0.05)
        try:
            got += c.recv(1 << 20)
        except BlockingIOError:
            pass
    assert bytes(got) == data
    losses = [e for e in w.log if e[1] == "loss"]
    assert losses, "p=0.5 over a second lost nothing"
    assert blocked, "the writer never found its send buffer full while segments were lost"


def test_loss_draws_replay_exactly_from_the_universe():
    def run(world):
        (c, s), = pairs(world)
        world.run(until=0.001)
        s.send(b"y" * 60000)
        drain(c, world, 3.0)
        return world.digest()
    w = World(9, mss=2000, faults=[{"at": 0.001, "kind": "loss", "conn": 0, "side": "server",
                                    "duration_s": 0.8, "p": 0.3}])
    first = run(w)
    assert any(e[1] == "loss" for e in w.log)
    assert run(World.from_universe(w.universe())) == first


# -- partition and clog -------------------------------------------------------------

def test_partition_holds_both_directions_then_delivers():
    w = World(1, faults=[{"at": 0.01, "kind": "partition", "conn": 0, "duration_s": 0.3}])
    (c, s), = pairs(w)
    w.run(until=0.02)
    s.send(b"a" * 100)
    c.send(b"b" * 50)
    w.run(until=0.2)
    assert c.unread_bytes == 0 and s.unread_bytes == 0          # held, not dropped
    assert s.queued_bytes == 100                                # no ACK crossed either
    w.run(until=0.31 + 0.001)
    assert c.recv(1000) == b"a" * 100 and s.recv(1000) == b"b" * 50
    assert [t for t, _ in deliveries(w, 0)] == [pytest.approx(0.31)] * 2
    w.run(until=0.32)
    assert s.queued_bytes == 0                                  # the ACK came after the end


def test_clog_then_unclog_in_reverse_order_delivers_each_link_in_order():
    # conn 0 clogged at 0.01, conn 1 at 0.02; after 0.1 s conn 1 unclogs
    # (0.12), then conn 0 (0.13)
    w = World(1, faults=[{"at": 0.01, "kind": "clog", "conns": [0, 1], "step_s": 0.01,
                          "duration_s": 0.1, "side": "server"}])
    (c0, s0), (c1, s1) = pairs(w, 2)
    w.run(until=0.025)
    for i in range(3):
        s0.send(bytes([i]) * 10)
        s1.send(bytes([10 + i]) * 10)
        w.run(until=w.now + 0.001)
    w.run(until=0.2)
    d0, d1 = deliveries(w, 0), deliveries(w, 1)
    assert [t for t, _ in d1] == [pytest.approx(0.12)] * 3
    assert [t for t, _ in d0] == [pytest.approx(0.13)] * 3
    assert c0.recv(100) == b"".join(bytes([i]) * 10 for i in range(3))
    assert c1.recv(100) == b"".join(bytes([10 + i]) * 10 for i in range(3))
    # side "server": the client's segments were never held
    c0.send(b"z")
    w.run(until=w.now + 3 * LAT)
    assert s0.recv(10) == b"z"


def test_a_clog_before_the_connection_exists_is_missed_and_logged():
    w = World(1, faults=[{"at": 0.0, "kind": "clog", "conns": [0], "duration_s": 0.1}])
    pairs(w)
    assert ("fault-missed", 0) in [(e[1], e[2]) for e in w.log]


# -- drawing and validation ---------------------------------------------------------

def test_the_new_kinds_are_drawn_only_when_asked_and_old_seeds_keep_their_schedules():
    classic = World(7, random_faults=6, fault_horizon_s=5.0).faults
    assert {f["kind"] for f in classic} <= {"stall", "slow", "reset", "vanish"}
    assert World(7, random_faults=6, fault_horizon_s=5.0,
                 fault_kinds=["stall", "slow", "reset", "vanish"]).faults == classic
    drawn = World(7, random_faults=12, fault_horizon_s=5.0,
                  fault_kinds=["loss", "clog", "partition"]).faults
    assert {f["kind"] for f in drawn} == {"loss", "clog", "partition"}
    u = World(7, random_faults=12, fault_horizon_s=5.0,
              fault_kinds=["loss", "clog", "partition"]).universe()
    assert World.from_universe(u).faults == drawn


@pytest.mark.parametrize("fault, message", [
    ({"at": 0, "kind": "loss", "duration_s": 1}, "probability p"),
    ({"at": 0, "kind": "loss", "duration_s": 1, "p": 1.5}, "probability p"),
    ({"at": 0, "kind": "loss", "p": 0.5}, "duration_s > 0"),
    ({"at": 0, "kind": "partition", "duration_s": 1, "side": "client"}, "both directions"),
    ({"at": 0, "kind": "clog", "duration_s": 1}, "'conns'"),
    ({"at": 0, "kind": "clog", "duration_s": 1, "conns": [0, 0]}, "distinct"),
    ({"at": 0, "kind": "clog", "duration_s": 1, "conns": [0], "conn": 0}, "not 'conn'"),
    ({"at": 0, "kind": "clog", "duration_s": 1, "conns": [0], "step_s": -1}, "step_s"),
    ({"at": 0, "kind": "partition", "duration_s": 1, "p": 0.5}, "unknown fault field 'p'"),
])
def test_bad_fault_fields_are_one_clear_line(fault, message):
    with pytest.raises(ValueError, match=message) as exc:
        World(0, faults=[fault])
    assert "\n" not in str(exc.value)


def test_bad_fault_kinds_parameter_is_rejected():
    with pytest.raises(ValueError, match="fault_kinds"):
        World(0, fault_kinds=["loss", "flood"])
    with pytest.raises(ValueError, match="fault_kinds"):
        World(0, fault_kinds="loss")


# -- shrinking times and parameters --------------------------------------------------

def _held_late(u) -> bool:
    """The 'failure' of the shrink tests: a partition of conn 0 still holds
    a segment sent at 0.05 s past 0.2 s. Runs the world as the universe says."""
    w = World.from_universe(u["net"])
    (c, s), = pairs(w)
    w.run(until=0.05)
    s.send(b"q" * 10)
    w.run(until=0.2)
    return c.unread_bytes == 0


def test_shrink_moves_a_fault_earlier_and_makes_it_smaller():
    big = {"at": 0.04, "kind": "partition", "conn": 0, "side": "both", "duration_s": 0.8}
    noise = {"at": 0.03, "kind": "loss", "conn": 0, "side": "client", "duration_s": 0.5,
             "p": 0.2}
    u = {"net": World(0, faults=[noise, big]).universe()}
    assert _held_late(u)
    calls = []

    def still_fails(u2):
        calls.append(1)
        return _held_late(u2)
    shrunk, runs = simruns.shrink(None, u, still_fails)
    assert runs == len(calls) <= 2 + simruns.SHRINK_FIELD_RUNS
    (f,) = shrunk["net"]["faults"]
    assert f["kind"] == "partition"
    assert f["at"] < big["at"] and f["duration_s"] < big["duration_s"]
    # still long enough: it must cover 0.05 .. 0.2 from its (earlier) start
    assert f["at"] + f["duration_s"] >= 0.2
    assert _held_late(shrunk)
    # the shrunk universe replays exactly
    def digest(net):
        w = World.from_universe(net)
        (c, s), = pairs(w)
        w.run(until=0.05)
        s.send(b"q" * 10)
        w.run(until=1.0)
        return w.digest()
    assert digest(shrunk["net"]) == digest(World.from_universe(shrunk["net"]).universe())


def test_shrink_lowers_a_loss_probability_and_respects_its_budget():
    # "fails" while p >= 0.3: bisection from 1.0 toward 0 stops above it
    u = {"net": World(0, faults=[{"at": 0.5, "kind": "loss", "conn": 0, "duration_s": 1.0,
                                  "p": 1.0}]).universe()}
    shrunk, runs = simruns.shrink(None, u, lambda u2: bool(u2["net"]["faults"]) and
                                  u2["net"]["faults"][0]["p"] >= 0.3)
    f = shrunk["net"]["faults"][0]
    assert 0.3 <= f["p"] < 0.5
    assert f["at"] < 0.5 / 8 and f["duration_s"] < 1.0 / 8       # 4 halvings each
    _, few = simruns.shrink(None, u, lambda u2: bool(u2["net"]["faults"]), max_field_runs=2)
    assert few == 1 + 2


# -- the run verb: --fault-kinds --------------------------------------------------

def _cli(*argv):
    from bench.cli import main
    return main(list(argv))


def test_fault_kinds_draws_the_wire_faults_and_the_failing_universe_replays(tmp_path):
    import json
    out = tmp_path / "ex"
    assert _cli("run", "--net", "sim", "--seeds", "4", "--faults", "2", "--fault-kinds",
                "partition,clog", "--scenarios", "S6", "--runtimes", "callback", "--variants",
                "block", "--preset", "tiny", "--out", str(out)) == 0
    ex = json.loads((out / "explore.json").read_text())["explorations"][0]
    assert ex["net"]["fault_kinds"] == ["partition", "clog"]
    f = ex["failing"]                    # block never serves the healthy client
    assert {x["kind"] for x in f["universe"]["net"]["faults"]} <= {"partition", "clog"}
    assert f["universe"]["net"]["faults"]
    assert f["replayed_outcome"] == f["outcome"]


@pytest.mark.parametrize("argv, says", [
    (("--faults", "1", "--fault-kinds", "loss,flood"), "unknown fault kind 'flood'"),
    (("--fault-kinds", "loss"), "give it with --faults"),
])
def test_bad_fault_kinds_are_one_line_and_exit_2(tmp_path, capsys, argv, says):
    try:
        code = _cli("run", "--net", "sim", "--seeds", "2", *argv, "--scenarios", "S3",
                    "--runtimes", "callback", "--variants", "naive", "--preset", "tiny",
                    "--out", str(tmp_path / "o"))
    except SystemExit as exc:            # argparse's own exit for a bad value
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert says in err, err
    assert not (tmp_path / "o" / "explore.json").exists()


def test_under_an_explorer_each_lost_try_is_a_choice_and_none_means_delivered():
    class Always:
        def __init__(self, pick):
            self.pick, self.asked = pick, []

        def choose(self, kind, n):
            self.asked.append(kind)
            return self.pick

    for pick, lost in ((0, 0), (1, 2)):      # 1: every try inside the window is lost
        w = World(1, faults=[{"at": 0.001, "kind": "loss", "conn": 0, "side": "server",
                              "duration_s": 0.5, "p": 0.5}])
        chooser = Always(pick)
        w.install_chooser(chooser)
        (c, s), = pairs(w)
        w.run(until=0.001)
        s.send(b"x" * 100)
        w.run(until=2.0)
        assert len([e for e in w.log if e[1] == "loss"]) == lost
        assert "net" in chooser.asked
        assert c.recv(1000) == b"x" * 100
