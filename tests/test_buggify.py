"""The seam's fault points (BUGGIFY): each point's effect on a plain simulated
socket, that they change nothing unless given, their draws under a seed, and
an explored schedule with a buggify choice that replays exactly.

Every world here is small and bounded in virtual time; no real socket.
"""
from __future__ import annotations

import errno
import socket

import pytest

from kernels import choice
from kernels.simnet import BUGGIFY_POINTS, READ, WRITE, World

pytestmark = pytest.mark.timeout(120)

A = ("127.0.0.1", 9100)


class Fire:
    """A chooser that fires every fault point it is asked about (and takes the
    default everywhere else); it counts what it was asked."""

    def __init__(self, fire=True, every=1):
        self.fire = fire
        self.every = every
        self.asked = []

    def choose(self, kind, n):
        self.asked.append(kind)
        if kind != choice.BUGGIFY or not self.fire:
            return 0
        return 1 if self.asked.count(kind) % self.every == 0 else 0


def pair(world):
    """A connected (client, server) pair of the program's sockets, non-blocking,
    and a poller."""
    io = world.io()
    ls = io.socket()
    ls.setblocking(False)
    ls.bind(A)
    ls.listen(8)
    c = io.socket()
    c.setblocking(False)
    assert c.connect_ex(A) == errno.EINPROGRESS
    world.run(until=world.now + 0.01)
    s, _ = ls.accept()
    s.setblocking(False)
    ls.close()
    return c, s, io.poller()


def fired(world):
    return [v for _, kind, _, _, v in world.log if kind == "buggify"]


# -- each point on a plain socket ---------------------------------------------

def test_short_write_takes_fewer_bytes_than_it_could_but_at_least_one():
    w = World(0, buggify=["short-write"])
    w.install_chooser(Fire())
    c, s, _ = pair(w)
    assert c.send(b"x" * 1000) == 500          # the buffer had room for all of it
    assert c.send(b"ab") == 1
    assert c.send(b"z") == 1                   # one byte cannot be short: not a site
    assert fired(w) == ["short-write", "short-write"]
    w.run(until=w.now + 0.01)
    assert s.recv(4096) == b"x" * 500 + b"a" + b"z"
    plain = World(0)
    c, s, _ = pair(plain)
    assert c.send(b"x" * 1000) == 1000


def test_short_read_returns_fewer_bytes_than_are_there():
    w = World(0, buggify=["short-read"])
    w.install_chooser(Fire())
    c, s, _ = pair(w)
    c.send(b"0123456789")
    w.run(until=w.now + 0.01)
    assert s.recv(4096) == b"01234"
    assert s.recv(4096) == b"56"
    assert s.recv(4096) == b"7"
    assert s.recv(4096) == b"8"
    assert s.recv(4096) == b"9"               # the last byte: not a site
    assert fired(w) == ["short-read"] * 4


def test_spurious_readiness_then_eagain_on_recv_send_and_accept():
    w = World(0, buggify=["spurious-ready"])
    w.install_chooser(Fire())
    c, s, poller = pair(w)
    poller.register(c.fileno(), READ)
    assert poller.wait(0) == [(c.fileno(), READ)]      # nothing to read
    with pytest.raises(BlockingIOError):
        c.recv(100)
    # at most one spurious wake-up per virtual instant: the retry meets the truth
    assert poller.wait(0) == []
    # a full send buffer: reported writable anyway, and the send says EAGAIN
    poller.modify(c.fileno(), WRITE)
    with pytest.raises(BlockingIOError):
        for _ in range(1000):
            c.send(b"y" * 65536)
    w.run(until=w.now + 1e-6)
    assert poller.wait(0) == [(c.fileno(), WRITE)]
    with pytest.raises(BlockingIOError):
        c.send(b"y")
    # a listener with no connection waiting (accept(2), NOTES)
    io = w.io()
    ls = io.socket()
    ls.setblocking(False)
    ls.bind(("127.0.0.1", 9101))
    ls.listen(1)
    p2 = io.poller()
    p2.register(ls.fileno(), READ)
    w.run(until=w.now + 1e-6)
    assert p2.wait(0) == [(ls.fileno(), READ)]
    with pytest.raises(BlockingIOError):
        ls.accept()
    assert fired(w) == ["spurious-ready"] * 3
    # the same polls without the point: nothing is ready
    plain = World(0)
    c, s, poller = pair(plain)
    poller.register(c.fileno(), READ)
    assert poller.wait(0) == []


def test_spurious_readiness_adds_to_what_a_poll_reports():
    w = World(0, buggify=["spurious-ready"])
    w.install_chooser(Fire())
    c, s, poller = pair(w)
    poller.register(c.fileno(), READ | WRITE)
    # writable for real, readable spuriously: one event with both bits
    assert poller.wait(0) == [(c.fileno(), READ | WRITE)]


def test_late_fin_is_reported_one_poll_later_though_recv_sees_it():
    w = World(0, buggify=["late-notify"])
    w.install_chooser(Fire())
    c, s, poller = pair(w)
    poller.register(c.fileno(), READ | WRITE)
    s.close()                                   # a FIN
    w.run(until=w.now + 0.01)
    assert fired(w) == ["late-notify"]
    assert poller.wait(0) == [(c.fileno(), WRITE)]          # as before the FIN
    assert c.recv(100) == b""                   # the FIN is there
    assert poller.wait(0) == [(c.fileno(), READ | WRITE)]    # one poll later
    plain = World(0)
    c, s, poller = pair(plain)
    poller.register(c.fileno(), READ | WRITE)
    s.close()
    plain.run(until=plain.now + 0.01)
    assert poller.wait(0) == [(c.fileno(), READ | WRITE)]


def test_late_reset_hides_the_error_for_one_poll_and_never_blocks_a_wait():
    w = World(0, buggify=["late-notify"])
    w.install_chooser(Fire())
    c, s, poller = pair(w)
    poller.register(c.fileno(), READ)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
    s.close()                                   # an RST
    # a poll that would otherwise block for ever: the late error still ends it,
    # at the same virtual instant, within this one wait
    t0 = w.now
    assert poller.wait(None) == [(c.fileno(), READ | WRITE)]
    assert w.now - t0 < 0.001
    assert fired(w) == ["late-notify"]
    with pytest.raises(ConnectionResetError):
        c.recv(100)


def test_trio_on_the_world_meets_every_point_and_moves_every_byte():
    """trio waits through its clock, not a poller: the spurious wake-up is
    woken there (``SimClock``), and its retry loop waits again."""
    trio = pytest.importorskip("trio")
    from bench import peers
    from bench.peers.sim import play
    from protocols import simports
    world = World(0, buggify=list(BUGGIFY_POINTS))
    world.install_chooser(Fire())
    sink = play(world, peers.sink(rate_Bps=1_000_000), listen=("127.0.0.1", 9001))
    source = play(world, peers.source(rate_Bps=1_000_000, duration_s=0.5),
                  connect=("127.0.0.1", 9002), at=0.2)

    async def main():
        out = await trio.open_tcp_stream("127.0.0.1", 9001)
        await out.send_all(b"x" * 300_000)
        await out.aclose()
        (listener,) = await trio.open_tcp_listeners(9002, host="127.0.0.1")
        conn = await listener.accept()
        got = 0
        while data := await conn.receive_some(65536):
            got += len(data)
        await conn.aclose()
        await listener.aclose()
        return got

    got = simports.run_trio(world.io(), main)
    assert sink.result()["received_bytes"] == 300_000
    assert got == source.result()["sent_bytes"] > 0
    for point in ("short-write", "short-read", "spurious-ready", "late-notify"):
        assert world.buggify_fired.get(point), (point, world.buggify_fired)


# -- off by default; draws under a seed ------------------------------------------

def _traffic(world):
    """A small exchange with a close at the end; the world's digest after it."""
    c, s, poller = pair(world)
    poller.register(s.fileno(), READ)
    sent = 0
    for _ in range(20):
        sent += c.send(b"m" * 3000)
        poller.wait(0.001)
        try:
            s.recv(2000)
        except BlockingIOError:
            pass
    c.close()
    for _ in range(50):
        poller.wait(0.001)
        try:
            if s.recv(65536) == b"":
                break
        except (BlockingIOError, ConnectionError):
            pass
    return world.digest()


def test_off_by_default_and_unfired_points_change_nothing():
    base = _traffic(World(3, jitter_s=2e-6))
    assert _traffic(World(3, jitter_s=2e-6, buggify=None)) == base
    assert _traffic(World(3, jitter_s=2e-6, buggify=[])) == base
    # every point given, every site asked and answered "behave": the same universe
    w = World(3, jitter_s=2e-6, buggify=list(BUGGIFY_POINTS))
    never = Fire(fire=False)
    w.install_chooser(never)
    plain = World(3, jitter_s=2e-6)
    plain.install_chooser(Fire(fire=False))
    assert _traffic(w) == _traffic(plain)
    assert choice.BUGGIFY in never.asked         # the sites were reached
    fire = World(3, jitter_s=2e-6, buggify=list(BUGGIFY_POINTS))
    fire.install_chooser(Fire())
    assert _traffic(fire) != base


def test_a_seed_enables_each_point_once_and_fires_it_at_a_quarter_of_its_sites():
    enabled = [World(seed, buggify=list(BUGGIFY_POINTS)).buggify_on for seed in range(400)]
    for point in BUGGIFY_POINTS:
        share = sum(point in on for on in enabled) / len(enabled)
        assert 0.15 < share < 0.35, (point, share)
    # the same seed, the same points; and the firings follow the seed too
    seed = next(s for s, on in enumerate(enabled) if "short-write" in on)
    runs = []
    for _ in range(2):
        w = World(seed, buggify=["short-write"])
        c, s, _ = pair(w)
        runs.append([c.send(b"q" * 100) for _ in range(200)])
        assert w.buggify_on == {"short-write"}
    assert runs[0] == runs[1]
    short = [n for n in runs[0] if n < 100]
    assert short and min(short) >= 1
    assert 0.1 < len(short) / 200 < 0.45


def test_bad_buggify_values_are_one_line_errors():
    for bad in ("short-write", ["nope"], [1], 3):
        with pytest.raises(ValueError, match="buggify"):
            World(0, buggify=bad)
    # one spelling: the universe round-trips
    w = World(0, buggify=("late-notify", "short-write", "short-write"))
    assert w.params["buggify"] == ["short-write", "late-notify"]
    assert World.from_universe(w.universe()).universe() == w.universe()


# -- exploration -------------------------------------------------------------------

def test_buggify_is_legal_on_every_runtime_only_when_asked():
    from bench.explore.search import legal_kinds
    for rt in ("callback", "hybrid", "coro", "asyncio-protocol", "trio", "curio"):
        assert choice.BUGGIFY not in legal_kinds(rt)
        assert choice.BUGGIFY in legal_kinds(rt, buggify=True)


def test_explored_buggify_choice_replays_exactly():
    from bench.explore import exploration as runner, targets
    t = targets.resolve("cpython-23812")
    r = runner.explore(t, "callback", "fixed", "random", 3, buggify=list(BUGGIFY_POINTS),
                       do_shrink=False)
    assert "buggify" in r["legal"]
    # a schedule that fires the first buggify site, replayed from its document
    rec, res = runner._run(t, "callback", "fixed", frozenset(r["legal"]), {})
    steps = [i for i, (kind, _, _) in enumerate(rec.points) if kind == choice.BUGGIFY]
    assert steps, "the program reached no fault point's site"
    devs = {steps[0]: 1}
    rec, res = runner._run(t, "callback", "fixed", frozenset(r["legal"]), devs)
    doc = runner.schedule_doc(t, "callback", "fixed", frozenset(r["legal"]), devs, rec, res,
                              "random", True, False)
    assert doc["buggify"] == list(BUGGIFY_POINTS)
    t2 = targets.resolve("cpython-23812")
    again = runner.replay(doc, t2)
    assert again["exact"], again
    # without the fault points the same deviations are other choices: not exact
    doc2 = dict(doc)
    del doc2["buggify"]
    assert not runner.replay(doc2, targets.resolve("cpython-23812"))["same_points"]


# -- the command line ------------------------------------------------------------------

def _looplab(tmp_path, *args):
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


def test_cli_buggify_usage_mistakes_are_one_line_exit_2(tmp_path):
    for args in (["run", "--net", "sim", "--buggify", "--scenarios", "S3"],
                 ["run", "--net", "sim", "--seeds", "2", "--buggify", "nope", "--scenarios", "S3"],
                 ["explore", "S3", "--buggify", "short-write,bogus"]):
        r = _looplab(tmp_path, *args)
        assert r.returncode == 2, (args, r.stderr)
        assert "Traceback" not in r.stderr
        assert "buggify" in r.stderr or "fault point" in r.stderr, r.stderr


def test_cli_seeds_with_buggify_find_the_drain_loss_and_replay_it(tmp_path):
    """Short writes make S3's ``drain`` race lose bytes at the tiny preset, where
    the seeds alone never do; the failing universe carries its fault points and
    replays to the same loss."""
    import json
    common = ["--scenarios", "S3", "--variants", "drain", "--runtimes", "callback",
              "--preset", "tiny"]
    r = _looplab(tmp_path, "run", "--net", "sim", "--seeds", "60", *common, "--out", "plain")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "no_loss=NO" not in r.stdout
    r = _looplab(tmp_path, "run", "--net", "sim", "--seeds", "60", "--buggify", "short-write",
                 *common, "--out", "ex")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "no_loss=NO" in r.stdout and "fault points enabled: short-write" in r.stdout
    path = tmp_path / "ex" / "failing-S3_callback_drain_tiny_sim.json"
    u = json.loads(path.read_text())
    assert u["net"]["params"]["buggify"] == ["short-write"]
    r = _looplab(tmp_path, "run", "--replay", str(path), "--out", "again")
    assert r.returncode in (0, 1), r.stderr[-2000:]
    cells = json.loads((tmp_path / "again" / "results.json").read_text())["cells"]
    assert cells[0]["verdicts"]["no_loss"] is False
    assert cells[0]["metrics"]["buggify_fired"] > 0


# -- a finding: coro's send_all waited after every short write -----------------------

def test_coro_send_all_retries_a_short_write_before_it_waits():
    """A short write is not a full buffer (POSIX allows one at any time), so
    ``send_all`` sends the rest at once and waits only for EAGAIN. It used to
    wait for writability after every short write: the task blocked although
    the socket had room, and an expired deadline (delivered when a task
    blocks) failed a send that needed no wait -- trio-1626's bug, on coro,
    whose card says an expired deadline never fails a send that does not
    block."""
    from bench.explore import search, targets
    t = targets.resolve("trio-1626")
    t.buggify = ["short-write"]
    legal = search.legal_kinds("coro", buggify=True)
    rec = search.Recorder(legal, lambda step, kind, n: 1 if kind == choice.BUGGIFY else 0)
    r = t.run("coro", "naive", rec)
    assert any(c for kind, _, c in rec.points if kind == choice.BUGGIFY), "no short write"
    assert r.outcome == "bug_shown=NO", r.outcome
    # trio's rule is the same with or without short writes: every send is a checkpoint
    r = t.run("coro:io_schedule_point=true,deadline_check=at-checkpoint", "naive",
              search.Recorder(legal, lambda step, kind, n: 1 if kind == choice.BUGGIFY else 0))
    assert r.outcome == "bug_shown=yes", r.outcome
