"""The simulated network: its TCP semantics, the seam-shaped SimIO, determinism
and replay, and S1's shape end to end with a hand-written relay.

Ground truth comes from the simulated peers (bytes counted at the source and
the sink), never from the relay under test. Nothing here touches a real socket
or sleeps; every loop is bounded in count and in virtual time.
"""
from __future__ import annotations

import errno
import json
import math
import selectors
import socket
import struct
import time
from collections import deque

import pytest

from bench import peers
from bench.peers.sim import play
from kernels.simnet import FD_BASE, READ, WRITE, SimDeadlock, SimSelector, SimStopped, World

pytestmark = pytest.mark.timeout(60)

A = ("127.0.0.1", 9000)
B = ("127.0.0.1", 9001)


# -- helpers -----------------------------------------------------------------

# The peers are the bench's roles (bench.peers) played in the world by
# bench.peers.sim. A framed sink (frame_bytes, verify) checks every byte the
# framed source sent and times every frame from its stamp at the source.
FRAMED = {"frame_bytes": 32768, "verify": True}


def reads(role):
    """Every read ``role`` makes from now on, as [(virtual time, bytes read so
    far)] (its report samples only every 50 ms)."""
    log = []
    core = role.core
    on_data = core.on_data

    def counted(data, now):
        on_data(data, now)
        log.append((now, core.received))
    core.on_data = counted
    return log


def intact(sink) -> bool:
    """Every frame of the source arrived, whole, in order, once."""
    r = sink.result()
    return ("frame_error" not in r and r["missing_count"] == 0 and r["duplicate_count"] == 0
            and r["out_of_order_count"] == 0)


def pair(world, **kw):
    """A connected (client, server) pair through a listener, both non-blocking."""
    io = world.io()
    ls = io.socket()
    ls.setblocking(False)
    ls.bind(A)
    ls.listen(8)
    c = io.socket()
    c.setblocking(False)
    assert c.connect_ex(A) == errno.EINPROGRESS
    poller = io.poller()
    poller.register(ls.fileno(), READ)
    assert poller.wait(1.0) == [(ls.fileno(), READ)]
    s, addr = ls.accept()
    s.setblocking(False)
    assert addr == c.getsockname()
    poller.unregister(ls.fileno())
    ls.close()
    poller.register(c.fileno(), WRITE)
    assert poller.wait(1.0) == [(c.fileno(), WRITE)]
    assert c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
    poller.close()
    return c, s


def settle(world, t=0.1):
    """Let the network deliver everything it can within ``t`` virtual seconds."""
    world.run(until=world.now + t)


def drain(sock, limit=100):
    out = bytearray()
    for _ in range(limit):
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            break
        if not data:
            break
        out += data
    return bytes(out)


# -- S1's shape: source 3 MB/s -> relay -> sink 1 MB/s, 10 simulated seconds ------

def run_relay(world, bounded, duration=10.0):
    """A tiny non-blocking one-way relay on ``SimIO.poller().wait()``.
    Naive: read whenever readable, queue without bound. Bounded: stop reading
    while anything is queued (its send buffer is full). Returns the user
    buffer sampled every 0.5 s and its peak."""
    io = world.io()
    sink = play(world, peers.sink(rate_Bps=1_000_000, **FRAMED), listen=B)
    ls = io.socket()
    ls.setblocking(False)
    ls.bind(A)
    ls.listen(1)
    source = play(world, peers.source(rate_Bps=3_000_000, duration_s=duration), connect=A)
    poller = io.poller()
    poller.register(ls.fileno(), READ)
    src = dst = None
    queue, queued = deque(), 0           # the relay's user-space buffer
    connected = src_eof = False
    peak, samples, next_sample = 0, [], 0.5
    for _ in range(1_000_000):
        if io.time() >= duration:
            break
        for fd, mask in poller.wait(duration - io.time()):
            if fd == ls.fileno():
                src, _ = ls.accept()
                src.setblocking(False)
                poller.unregister(fd)
                ls.close()
                poller.register(src.fileno(), 0)
                dst = io.socket()
                dst.setblocking(False)
                dst.connect_ex(B)
                poller.register(dst.fileno(), WRITE)
            elif src is not None and fd == src.fileno() and mask & READ:
                data = src.recv(65536)
                if data:
                    queue.append(data)
                    queued += len(data)
                else:
                    src_eof = True
            elif dst is not None and fd == dst.fileno() and not connected:
                assert dst.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
                connected = True
        while connected and queue:
            head = queue[0]
            try:
                n = dst.send(head)
            except BlockingIOError:
                break
            queued -= n
            if n == len(head):
                queue.popleft()
            else:
                queue[0] = head[n:]
                break
        if connected:
            poller.modify(src.fileno(), READ if not src_eof and not (bounded and queue) else 0)
            poller.modify(dst.fileno(), WRITE if queue else 0)
        peak = max(peak, queued)
        while io.time() >= next_sample:
            samples.append((next_sample, queued))
            next_sample += 0.5
    else:
        pytest.fail("relay loop did not reach the end of the simulated run")
    poller.close()
    return {"source": source, "sink": sink, "peak": peak, "samples": samples,
            "src": src, "dst": dst}


def test_s1_naive_relay_grows_2MBps_and_bounded_stays_one_read():
    results = {}
    for bounded in (False, True):
        world = World(1)
        t, cpu = time.perf_counter(), time.process_time()
        r = run_relay(world, bounded)
        wall, cpu = time.perf_counter() - t, time.process_time() - cpu
        results[bounded] = r
        # Measured, never asserted: how much faster than real time this ran.
        print(f"S1 {'bounded' if bounded else 'naive'}: 10 simulated s in {wall:.3f} s wall "
              f"({10 / wall:.0f} simulated s per wall s; CPU {cpu:.3f} s), "
              f"{len(world.log)} logged events")
    naive, bounded = results[False], results[True]
    # the naive relay's buffer grows at source rate minus sink rate: about +2 MB/s
    t2, q2 = next(s for s in naive["samples"] if s[0] >= 2.0)
    t10, q10 = naive["samples"][-1]
    slope = (q10 - q2) / (t10 - t2)
    assert 1.8e6 < slope < 2.2e6, slope
    assert naive["source"].core.sent > 29e6          # the source was never held back
    # the bounded one never holds more than one read, and the source is held to
    # the sink's rate (the two 64 KiB buffer pairs on each hop are the slack)
    assert bounded["peak"] <= 65536
    src_rate = bounded["source"].core.sent / 10.0
    assert 0.9e6 < src_rate < 1.2e6, src_rate
    for r in (naive, bounded):
        sink = r["sink"].result()
        assert 9.5e6 < sink["received_bytes"] < 10.5e6
        assert intact(r["sink"])               # every byte in order, none lost or doubled
    # queue delay at the sink, from the frames' stamps at the source: ~20 s
    # naive, well under 1 s bounded
    naive_delay = naive["sink"].result()["max_latency_s"]
    bounded_delay = bounded["sink"].result()["max_latency_s"]
    assert 5.0 < naive_delay
    assert bounded_delay < 1.0


def run_s1_universe(universe):
    world = World.from_universe(universe)
    r = run_relay(world, bounded=True, duration=5.0)
    return world, (r["source"].result(), r["sink"].result(), r["peak"], r["samples"])


def test_same_seed_same_universe_identical_log_and_results():
    u = World(7, jitter_s=0.0005, random_faults=3, fault_horizon_s=5.0).universe()
    assert json.loads(json.dumps(u)) == u
    w1, r1 = run_s1_universe(u)
    w2, r2 = run_s1_universe(json.loads(json.dumps(u)))
    assert w1.log == w2.log and w1.digest() == w2.digest()
    assert r1 == r2
    assert w1.universe() == w2.universe() == u
    assert len(w1.log) > 100


def test_different_seed_with_random_faults_differs():
    u7 = World(7, jitter_s=0.0005, random_faults=3, fault_horizon_s=5.0).universe()
    u8 = World(8, jitter_s=0.0005, random_faults=3, fault_horizon_s=5.0).universe()
    assert u7["faults"] != u8["faults"]
    w7, _ = run_s1_universe(u7)
    w8, _ = run_s1_universe(u8)
    assert w7.digest() != w8.digest()
    assert [e for e in w7.log if e[1].startswith("fault")] != \
           [e for e in w8.log if e[1].startswith("fault")]


def test_jitter_alone_changes_timing_with_the_seed():
    logs = []
    for seed in (1, 2):
        w = World(seed, jitter_s=0.001)
        run_relay(w, bounded=True, duration=1.0)
        logs.append([e[0] for e in w.log if e[1] == "deliver"])
    assert logs[0] != logs[1]


def test_universe_rejects_bad_input_with_one_line():
    with pytest.raises(ValueError, match="unknown parameter 'latency'"):
        World(0, latency=1)
    with pytest.raises(ValueError, match="bad value -1 for sndbuf"):
        World(0, sndbuf=-1)
    with pytest.raises(ValueError, match="bad fault kind 'explode'"):
        World(0, faults=[{"at": 1, "kind": "explode"}])
    with pytest.raises(ValueError, match="not a simnet universe"):
        World.from_universe({"seed": 1})


# -- TCP semantics -----------------------------------------------------------------

def test_partial_writes_fill_both_buffers_then_block():
    world = World(0)
    c, s = pair(world)
    assert c.send(b"x" * 100_000) == 65536           # the send buffer's capacity
    with pytest.raises(BlockingIOError):
        c.send(b"x")
    settle(world)
    # the peer's receive buffer took 64 KiB; acked bytes freed ours
    assert s.unread_bytes == 65536
    assert c.send(b"y" * 100_000) == 65536
    settle(world)
    with pytest.raises(BlockingIOError):
        c.send(b"z")
    assert c.queued_bytes == 65536 and s.unread_bytes == 65536
    # not writable until half the queued bytes are free (Linux's wake rule)
    poller = world.io().poller()
    poller.register(c.fileno(), WRITE)
    assert poller.wait(0) == []
    assert len(s.recv(40_000)) == 40_000
    settle(world)
    assert poller.wait(0) == [(c.fileno(), WRITE)]
    assert c.send(b"w" * 100_000) == 40_000          # a partial write: what fits
    poller.close()
    assert len(drain(s)) > 0


def test_half_close_delivers_then_eof_and_the_other_direction_works():
    world = World(0)
    c, s = pair(world)
    assert c.send(b"request") == 7
    c.shutdown(socket.SHUT_WR)
    with pytest.raises(BrokenPipeError):
        c.send(b"more")
    settle(world)
    assert s.recv(100) == b"request"
    assert s.recv(100) == b""                         # EOF after the data
    assert s.recv(100) == b""
    assert s.send(b"response") == 8                  # the other direction still works
    s.close()
    settle(world)
    assert c.recv(100) == b"response"
    assert c.recv(100) == b""


def test_close_with_unread_data_resets_and_peer_recv_raises():
    world = World(0)
    c, s = pair(world)
    c.send(b"hello")
    settle(world)
    s.send(b"reply-1")
    s.close()                     # "hello" was never read: an RST, not a FIN (trio 412)
    settle(world)
    assert ("close-rst" in [e[1] for e in world.log])
    assert c.recv(100) == b"reply-1"                 # what had arrived is still readable...
    with pytest.raises(ConnectionResetError):        # ...then the reset, once
        c.recv(100)
    assert c.recv(100) == b""
    with pytest.raises(BrokenPipeError):
        c.send(b"x")


def test_send_after_the_closed_peer_resets_raises_broken_pipe():
    """The RST comes after the peer's FIN (CLOSE_WAIT): EPIPE, as Linux gives."""
    world = World(0)
    c, s = pair(world)
    s.close()                     # nothing unread: a FIN
    settle(world)
    assert c.recv(10) == b""
    assert c.send(b"late") == 4   # the closed peer answers this data with an RST
    settle(world)
    with pytest.raises(BrokenPipeError):
        c.send(b"x")
    with pytest.raises(BrokenPipeError):
        c.send(b"x")


def test_so_linger_zero_close_resets_and_so_error_reports_it_once():
    world = World(0)
    c, s = pair(world)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()
    settle(world)
    assert c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == errno.ECONNRESET
    assert c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
    assert c.recv(10) == b""


def test_connect_refused_reports_through_so_error():
    world = World(0)
    io = world.io()
    c = io.socket()
    c.setblocking(False)
    with pytest.raises(BlockingIOError):
        c.connect(("127.0.0.1", 1))
    poller = io.poller()
    poller.register(c.fileno(), WRITE)
    assert poller.wait(1.0) == [(c.fileno(), READ | WRITE)]
    assert c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == errno.ECONNREFUSED
    assert world.now == pytest.approx(2 * world.params["latency_s"])
    poller.close()
    c.close()


def test_listen_backlog_drops_syns_beyond_backlog_plus_one_and_they_retry():
    world = World(0)
    io = world.io()
    ls = io.socket()
    ls.setblocking(False)
    ls.bind(A)
    ls.listen(1)
    clients = [io.socket() for _ in range(3)]
    for c in clients:
        c.setblocking(False)
        c.connect_ex(A)
    settle(world, 0.5)
    states = [c._state for c in clients]
    assert [c.getpeername() for c in clients[:2]] == [A, A]   # backlog + 1 queued
    with pytest.raises(OSError):
        clients[2].getpeername()
    assert ("syn-drop", 2) in [(e[1], e[2]) for e in world.log]
    ls.accept()[0].close()
    settle(world, 2.0)                                 # the SYN is retried after 1 s
    assert clients[2].getpeername() == A
    assert states[:2] == [clients[0]._state] * 2
    for c in clients:
        c.close()
    ls.close()


def test_accept_would_block_and_blocking_mode_is_refused_loudly():
    from kernels.simnet import SimBlockingError
    world = World(0)
    ls = world.io().socket()
    ls.bind(A)
    ls.listen(1)
    with pytest.raises(SimBlockingError):
        ls.accept()
    ls.setblocking(False)
    with pytest.raises(BlockingIOError):
        ls.accept()
    assert ls.fileno() >= FD_BASE
    ls.close()
    assert ls.fileno() == -1


def test_latency_and_bandwidth_set_the_transfer_time():
    world = World(0, latency_s=0.01, bandwidth_Bps=1_000_000)
    sink = play(world, peers.sink(), listen=B)
    play(world, peers.source(total_bytes=1_000_000), connect=B)
    world.run(until=5.0)
    r = sink.result()
    assert r["received_bytes"] == 1_000_000 and r["ended"] == "eof"
    # handshake (2 latencies) + 1 s on the wire + the last one-way latency,
    # plus the window round trips the 64 KiB buffers impose
    assert 1.0 < r["eof_at"] < 1.5


# -- the seam's shape ----------------------------------------------------------------

def test_wait_advances_the_clock_and_never_blocks():
    world = World(0)
    io = world.io()
    poller = io.poller()
    waker = io.waker()
    poller.register(waker.fileno(), READ)
    t = time.perf_counter()
    assert poller.wait(3600.0) == []
    assert io.time() == 3600.0
    assert time.perf_counter() - t < 5.0       # a sanity bound, not a speed claim
    world.call_later(2.0, waker.wake)
    assert poller.wait(None) == [(waker.fileno(), READ)]
    assert io.time() == 3602.0
    assert waker.drain() == b"\0" and waker.signal_fd() is None
    assert poller.wait(0) == []
    with pytest.raises(SimDeadlock):
        poller.wait(None)
    with pytest.raises(FileExistsError):
        poller.register(waker.fileno(), READ)
    poller.unregister(waker.fileno())
    with pytest.raises(OSError):
        poller.unregister(waker.fileno())
    with pytest.raises(OSError):
        poller.register(3, READ)               # a real fd is not in this world
    waker.close()
    poller.close()


def test_socketpair_getaddrinfo_and_read_check():
    world = World(0)
    io = world.io()
    a, b = io.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    check = io.read_check(b)
    assert not check(0)
    a.send(b"ping")
    settle(world)
    assert check(0)
    assert b.recv_into(buf := bytearray(10)) == 4 and buf[:4] == b"ping"
    assert io.getaddrinfo("localhost", 80)[0][4] == ("127.0.0.1", 80)
    with pytest.raises(socket.gaierror):
        io.getaddrinfo("example.invalid", 80)
    assert a.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) == 65536
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    assert a.send(b"x" * 10_000) == 4096
    a.close()
    b.close()


def test_selectors_selector_over_the_world():
    world = World(0)
    io = world.io()
    a, b = io.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    sel = SimSelector(world)
    assert isinstance(sel, selectors.BaseSelector)
    key = sel.register(b, selectors.EVENT_READ, data="b")
    sel.register(a, selectors.EVENT_WRITE)
    assert sel.get_key(b) is key
    ready = sel.select(0)
    assert [(k.fileobj, ev) for k, ev in ready] == [(a, selectors.EVENT_WRITE)]
    sel.unregister(a)
    world.call_later(0.5, a.send, b"hi")
    ready = sel.select(None)
    assert [(k.data, ev) for k, ev in ready] == [("b", selectors.EVENT_READ)]
    assert world.now == pytest.approx(0.5 + world.params["latency_s"])
    sel.close()
    a.close()
    b.close()


# -- faults --------------------------------------------------------------------------

def stream_world(faults, **params):
    world = World(0, faults=faults, **params)
    sink = play(world, peers.sink(rate_Bps=1_000_000, **FRAMED), listen=B)
    source = play(world, peers.source(rate_Bps=1_000_000, duration_s=4.0), connect=B)
    sink.reads = reads(sink)
    world.run(until=5.0)
    return world, source, sink


def test_planned_stall_pauses_the_reader_then_it_catches_up():
    world, source, sink = stream_world([{"at": 1.0, "kind": "stall", "conn": 0,
                                         "side": "server", "duration_s": 1.0}])
    times = [t for t, _ in sink.reads]
    gaps = [t2 - t1 for t1, t2 in zip(times, times[1:])]
    assert max(gaps) > 0.9
    assert sink.result()["ended"] == "eof" and intact(sink)


def test_planned_reset_surfaces_at_both_ends():
    world, source, sink = stream_world([{"at": 1.0, "kind": "reset", "conn": 0}])
    assert sink.result()["ended"] == "reset"
    assert source.result()["ended"] == "reset"
    assert sink.core.received < 1.2e6


def test_vanish_stops_all_traffic_without_a_fin():
    world, source, sink = stream_world([{"at": 1.0, "kind": "vanish", "conn": 0,
                                         "side": "server"}])
    assert sink.core.received < 1.2e6
    assert sink.ended is None                      # no EOF and no reset ever came
    assert source.core.sent < 1.2e6 + 2 * 65536    # held by the closed window


def test_slow_reader_fault_limits_the_rate():
    world, source, sink = stream_world([{"at": 0.5, "kind": "slow", "conn": 0, "side": "server",
                                         "duration_s": 2.0, "rate_Bps": 100_000}])
    during = [n for t, n in sink.reads if 0.6 <= t <= 2.5]
    assert (during[-1] - during[0]) / 1.9 < 150_000


def test_fault_on_a_missing_connection_is_logged_not_fatal():
    world, _, sink = stream_world([{"at": 0.5, "kind": "reset", "conn": 5}])
    assert ("fault-missed", 5) in [(e[1], e[2]) for e in world.log]
    assert sink.result()["ended"] == "eof"


# -- peers ---------------------------------------------------------------------------

def test_stalled_and_delayed_readers():
    world = World(0)
    stalled = play(world, peers.sink("stalled", start_after_s=50.0), listen=A)
    delayed = play(world, peers.sink("delayed", start_after_s=2.0), listen=B)
    delayed_reads = reads(delayed)
    s1 = play(world, peers.source(total_bytes=1_000_000), connect=A)
    play(world, peers.source(total_bytes=100_000), connect=B)
    world.run(until=3.0)
    assert stalled.core.received == 0
    # both buffers (four whole 32 KiB frames), then stuck
    assert s1.core.sent == 2 * 65536 and s1.ended is None
    assert delayed.core.received == 100_000 and delayed_reads[0][0] >= 2.0


def test_pipelining_client_floods_a_server_that_does_not_read():
    world = World(0)
    io = world.io()
    ls = io.socket()
    ls.setblocking(False)
    ls.bind(A)
    ls.listen(1)
    client = play(world, peers.pipeline_client(count=20_000, hold_s=5.0), connect=A)
    world.run(until=1.0)
    conn, _ = ls.accept()
    # The role's requests are b"REQ i\n", so they grow with i (the old test
    # peer sent 100-byte ones): the whole requests that fit in both buffers.
    fits = took = 0
    while took + len(b"REQ %d\n" % fits) <= 2 * 65536:
        took += len(b"REQ %d\n" % fits)
        fits += 1
    assert client.core.result["requests_sent"] == fits
    assert conn.unread_bytes == 65536
    conn.close()
    ls.close()


def test_resetting_peer_after_bytes():
    world = World(0)
    io = world.io()
    ls = io.socket()
    ls.setblocking(False)
    ls.bind(A)
    ls.listen(1)
    peer = play(world, peers.reset_peer(after_bytes=1000), connect=A)
    world.run(until=0.1)
    conn, _ = ls.accept()
    conn.setblocking(False)
    assert conn.send(b"y" * 2000) == 2000
    world.run(until=0.2)
    r = peer.result()
    # exactly after_bytes read, the rest left unread: the close is an RST (the
    # role sends nothing first; the old test peer sent 10 bytes before it)
    assert r["ended"] == "reset_sent" and r["reset_sent"] and r["received_bytes"] == 1000
    with pytest.raises(ConnectionResetError):
        conn.recv(100)
    conn.close()
    ls.close()


def test_frame_latency_grows_behind_a_slower_reader():
    world = World(0)
    sink = play(world, peers.sink(rate_Bps=100_000, **FRAMED), listen=B)
    play(world, peers.source(rate_Bps=200_000, duration_s=2.0), connect=B)
    world.run(until=3.0)
    delays = sink.result()["latency_series"]
    assert delays and all(d >= 0 for _, d in delays)
    assert delays[-1][1] > delays[0][1]           # the reader is slower: the queue grows
    assert not math.isnan(delays[-1][1])


def test_a_participant_spinning_at_one_instant_is_an_error_not_a_hang(monkeypatch):
    from kernels.simnet import constants
    monkeypatch.setattr(constants, "MAX_EVENTS_AT_ONE_TIME", 1000)
    world = World(0)

    def spin():
        world.call_later(0, spin)
    world.call_later(1.0, spin)
    with pytest.raises(RuntimeError, match="livelock"):
        world.run(until=2.0)


def test_polling_an_always_ready_fd_forever_is_an_error_not_a_hang(monkeypatch):
    from kernels.simnet import constants
    monkeypatch.setattr(constants, "MAX_EVENTS_AT_ONE_TIME", 1000)
    world = World(0)
    a, b = world.io().socketpair()
    poller = world.io().poller()
    poller.register(a.fileno(), WRITE)          # writable, and nobody ever writes
    with pytest.raises(RuntimeError, match="livelock"):
        for _ in range(2000):
            poller.wait(1.0)
    poller.close()


def test_a_universe_replays_identically_in_another_process():
    import os
    import subprocess
    import sys
    u = World(11, jitter_s=0.0005, random_faults=2, fault_horizon_s=2.0).universe()
    program = (
        "import json, sys\n"
        "sys.path[:0] = [sys.argv[1], sys.argv[1] + '/tests']\n"
        "from kernels.simnet import World\n"
        "import test_simnet as t\n"
        "w = World.from_universe(json.loads(sys.argv[2]))\n"
        "t.run_relay(w, bounded=True, duration=2.0)\n"
        "print(w.digest())\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", program, root, json.dumps(u)], env=env,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    here = World.from_universe(u)
    run_relay(here, bounded=True, duration=2.0)
    assert out.stdout.strip() == here.digest()


def test_closing_a_listener_resets_connections_it_never_accepted():
    world = World(0)
    io = world.io()
    ls = io.socket()
    ls.setblocking(False)
    ls.bind(A)
    ls.listen(4)
    c = io.socket()
    c.setblocking(False)
    c.connect_ex(A)
    settle(world)
    assert c.getpeername() == A
    ls.close()
    settle(world)
    with pytest.raises(ConnectionResetError):
        c.recv(10)
    # the address is free again
    ls2 = io.socket()
    ls2.bind(A)
    ls2.close()
    c.close()


def test_peek_recv_into_with_nbytes_and_eof_hidden_during_a_stall():
    world = World(0, faults=[{"at": 0.05, "kind": "stall", "conn": 0, "side": "server",
                              "duration_s": 1.0}])
    c, s = pair(world)
    c.send(b"abcdef")
    c.shutdown(socket.SHUT_WR)
    settle(world, 0.01)
    assert s.recv(3, socket.MSG_PEEK) == b"abc"
    buf = bytearray(10)
    assert s.recv_into(buf, 2) == 2 and buf[:2] == b"ab"
    world.run(until=0.5)                       # stalled: data and EOF are there but hidden
    with pytest.raises(BlockingIOError):
        s.recv(10)
    poller = world.io().poller()
    poller.register(s.fileno(), READ)
    assert poller.wait(None) == [(s.fileno(), READ)]
    assert world.now == pytest.approx(1.05)    # readable exactly when the stall ends
    assert s.recv(10) == b"cdef"
    assert s.recv(10) == b""
    poller.close()


def test_asyncio_selector_loop_and_transports_run_on_simselector():
    """asyncio's own loop, transports and (absent) flow control over the
    simulated network: the naive callback relay of S1 buffers the difference
    between source and sink in its transport, as on real sockets. The loop
    subclass swaps asyncio's self-pipe and clock (private hooks, CPython 3.11)."""
    import asyncio

    duration = 3.0
    world = World(1)

    class SimLoop(asyncio.SelectorEventLoop):
        def __init__(self):
            super().__init__(SimSelector(world))

        def _make_self_pipe(self):
            self._waker = world.io().waker()
            self._ssock = self._csock = None
            self._internal_fds += 1
            self._add_reader(self._waker.fileno(), self._waker.drain)

        def _close_self_pipe(self):
            self._remove_reader(self._waker.fileno())
            self._waker.close()
            self._internal_fds -= 1

        def _write_to_self(self):
            self._waker.wake()

        def time(self):
            return world.now

    sink = play(world, peers.sink(rate_Bps=1_000_000, **FRAMED), listen=B)
    source = play(world, peers.source(rate_Bps=3_000_000, duration_s=duration), connect=A)
    peak = [0]

    class Relay(asyncio.Protocol):
        def connection_made(self, transport):
            self.out, self.pending = None, []
            asyncio.get_running_loop().create_task(self.dial())

        async def dial(self):
            s = world.socket()
            s.setblocking(False)
            s.connect_ex(B)
            self.out, _ = await asyncio.get_running_loop().create_connection(
                asyncio.Protocol, sock=s)
            for data in self.pending:
                self.out.write(data)

        def data_received(self, data):
            if self.out is None:
                self.pending.append(data)
                return
            self.out.write(data)          # naive: no pause_reading on high water
            peak[0] = max(peak[0], self.out.get_write_buffer_size())

    async def main():
        ls = world.socket()
        ls.setblocking(False)
        ls.bind(A)
        ls.listen(1)
        server = await asyncio.get_running_loop().create_server(Relay, sock=ls)
        await asyncio.sleep(duration)
        server.close()

    loop = SimLoop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    assert world.now == pytest.approx(duration)
    assert 0.8 * 2e6 * duration < peak[0] < 1.1 * 2e6 * duration
    assert source.core.sent > 0.95 * 3e6 * duration
    assert intact(sink) and sink.core.received > 0.9e6 * duration


def test_send_after_a_refused_connect_raises_the_refusal_once():
    world = World(0)
    c = world.io().socket()
    c.setblocking(False)
    c.connect_ex(("127.0.0.1", 1))
    settle(world)
    with pytest.raises(ConnectionRefusedError):
        c.send(b"x")
    with pytest.raises(OSError) as info:
        c.send(b"x")
    assert info.value.errno == errno.ENOTCONN
    c.close()


def test_the_docs_first_run_snippet():
    import pathlib
    doc = pathlib.Path(__file__).resolve().parent.parent / "docs" / "simnet.md"
    text = doc.read_text()
    snippet = text.split("```python\n", 1)[1].split("```", 1)[0]
    scope = {}
    exec(snippet, scope)
    assert scope["events"] == [(scope["ls"].fileno(), READ)]
    assert 0 < scope["io"].time() < 1.0


# ---------------------------------------------------------------------------
# What the scenario cells need: owners and process exit, CPU time, Linux's doubling

def test_exit_process_closes_only_that_programs_sockets_as_the_os_would():
    world = World(3)
    sink = play(world, peers.sink(), listen=("127.0.0.1", 9100))
    app = world.io("app")
    s = app.socket()
    s.setblocking(False)
    s.connect_ex(("127.0.0.1", 9100))
    world.run(until=0.01)
    assert s.send(b"x" * 1000) == 1000
    other = world.io("other").socket()
    assert world.exit_process("app") == 1
    world.run(until=0.02)
    assert sink.result()["received_bytes"] == 1000 and sink.ended == "eof"
    assert other.fileno() >= FD_BASE          # another owner's socket stays open
    other.close()


def test_cpu_per_wait_charges_time_to_every_wait_from_the_seed():
    def waits(seed, cpu):
        world = World(seed, cpu_per_wait_s=cpu)
        poller = world.io().poller()
        times = []
        for _ in range(5):
            poller.wait(0)
            times.append(world.now)
        poller.close()
        return times
    assert waits(1, 0.0) == [0.0] * 5
    charged = waits(1, 1e-4)
    assert all(b > a for a, b in zip([0.0] + charged, charged))
    assert charged[-1] < 5 * 2e-4
    assert charged == waits(1, 1e-4) and charged != waits(2, 1e-4)


def test_sockbuf_scale_doubles_what_setsockopt_asks_for_as_linux_does():
    import socket as s
    world = World(0, sockbuf_scale=2)
    sock = world.io().socket()
    sock.setsockopt(s.SOL_SOCKET, s.SO_SNDBUF, 65536)
    sock.setsockopt(s.SOL_SOCKET, s.SO_RCVBUF, 4096)
    assert sock.getsockopt(s.SOL_SOCKET, s.SO_SNDBUF) == 131072
    assert sock.getsockopt(s.SOL_SOCKET, s.SO_RCVBUF) == 8192
    sock.close()
    with pytest.raises(ValueError, match="sockbuf_scale"):
        World(0, sockbuf_scale=0)


# -- accounting="linux": skbs, truesize and Linux's window ---------------------
#
# The expected numbers are worked out here from the rules the model follows
# (tcp_sendmsg, tcp_select_initial_window, __tcp_select_window, ...), not
# copied from a run.

OVER = 832          # the model's default truesize overhead per skb
MSS = 65483         # loopback's segment size, the model's default


def lx_world(**kw):
    return World(0, accounting="linux", sockbuf_scale=2, **kw)


def pinned_pair(world, size=65536):
    """``pair`` with SO_SNDBUF/SO_RCVBUF pinned before listen and connect, as
    the scenarios pin them (the first windows are fixed in the handshake)."""
    io = world.io()
    ls = io.socket()
    c = io.socket()
    for sock in (ls, c):
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)
    ls.bind(A)
    ls.listen(1)
    c.connect_ex(A)
    settle(world, 0.01)
    s, _ = ls.accept()
    s.setblocking(False)
    ls.close()
    return c, s


def win_from_space(space, ratio):
    return space * ratio >> 8


def ratio_of(n):
    """The receiver's payload-to-truesize ratio (x256) for an n-byte segment."""
    return (n << 8) // (n + OVER)


def skbs_taken(wmem, sndbuf, goal, tail, n):
    """tcp_sendmsg: fill the unsent tail skb up to ``goal``, then add skbs of
    ``goal`` for as long as the queued memory is below SO_SNDBUF."""
    taken = min(goal - tail, n) if tail else 0
    wmem += taken
    while taken < n and wmem < sndbuf:
        copy = min(goal, n - taken)
        wmem += copy + OVER
        taken += copy
    return taken, wmem


def writable(world, sock):
    p = world.io().poller()
    p.register(sock.fileno(), WRITE)
    try:
        return bool(p.wait(0))
    finally:
        p.close()


def first_phase(world, c, s):
    """A writer fills a pinned pair whose reader has not started; returns the
    numbers the rules predict for it."""
    buf = 2 * 65536
    syn = min(65535, win_from_space(buf, 128) // MSS * MSS)     # the SYN-ACK's window
    g0 = syn // 2                                               # half the peer's window
    n0, _ = skbs_taken(0, buf, g0, 0, 10**6)
    # the first segment measured: the window is what the rest of the buffer
    # allows at its payload ratio, rounded up to the window scale's 2 bytes
    w1 = win_from_space(buf - (g0 + OVER), ratio_of(g0))
    w1 += w1 % 2
    return buf, g0, n0, w1


def test_linux_sends_take_whole_skbs_sized_by_half_the_peer_window():
    world = lx_world()
    c, s = pinned_pair(world)
    buf, g0, n0, w1 = first_phase(world, c, s)
    assert c.send(bytes(10**6)) == n0 == 4 * g0       # one send overshoots SO_SNDBUF
    assert not writable(world, c)
    settle(world)                                     # the ACKs, the delayed one too
    # the sender filled exactly the window the first ACK offered ...
    assert s.unread_bytes == g0 + w1
    tail = n0 - (g0 + w1)
    assert c.queued_bytes == tail
    assert writable(world, c)
    # ... and now cuts skbs at half the largest window seen, topping up the tail first
    g1 = w1 // 2
    n1, wmem = skbs_taken(tail + OVER, buf, g1, tail, 10**6)
    assert c.send(bytes(10**6)) == n1
    assert buf - wmem < wmem >> 1 and not writable(world, c)
    c.close()
    s.close()



def test_linux_send_from_a_bytearray_leaves_it_resizable_and_the_bytes_intact():
    """The model reads a send's bytes through a view (no copy per slice); the
    view is let go before send returns, also when the send would block, so a
    transport may grow or cut its buffer after it, as real sockets allow."""
    world = lx_world()
    c, s = pinned_pair(world)
    data = bytearray(i % 251 for i in range(300_000))
    expect = bytes(data)
    sent = c.send(data)
    assert 0 < sent < len(data)
    del data[:sent]                  # BufferError if a view were still held
    try:
        c.send(data)                 # full: would block
    except BlockingIOError as exc:
        blocked = exc                # kept with its traceback, as a handler may keep it
    else:
        pytest.fail("a full socket took more bytes")
    data += b"tail"
    assert blocked.__traceback__ is not None
    got = bytearray()
    while len(got) < sent:
        settle(world)
        got += s.recv(1 << 20)
    assert bytes(got) == expect[:sent]
    c.close()
    s.close()

def test_linux_acks_the_first_segment_at_once_and_the_rest_after_the_delayed_ack():
    world = lx_world()
    c, s = pinned_pair(world)
    buf, g0, n0, w1 = first_phase(world, c, s)
    c.send(bytes(10**6))
    # one quick ACK: a 65,483-byte window holds rcv_wnd // (2 * rcv_mss) = 1 segment pair
    settle(world, 0.001)
    assert c.queued_bytes == n0 - g0
    settle(world, 0.038)
    assert c.queued_bytes == n0 - g0                  # still waiting for the delayed ACK
    settle(world, 0.003)                              # 40 ms after the data came
    assert c.queued_bytes == n0 - (g0 + w1)


def test_linux_a_read_frees_whole_skbs_only_and_the_window_reopens_by_the_rules():
    world = lx_world()
    c, s = pinned_pair(world)
    buf, g0, n0, w1 = first_phase(world, c, s)
    c.send(bytes(10**6))
    settle(world)
    c.send(bytes(10**6))
    settle(world)
    held = s.unread_bytes                             # segments g0, g0 and w1 - g0
    assert held == g0 + w1
    # a part of the first skb: no memory comes free, so no window either
    assert len(s.recv(100)) == 100
    settle(world)
    assert s.unread_bytes == held - 100
    # the rest of it: one skb freed, but the free space is under a segment (SWS avoidance)
    assert len(s.recv(g0 - 100)) == g0 - 100
    settle(world)
    assert s.unread_bytes == held - g0
    # the second skb: now the window is what the memory left allows
    assert len(s.recv(g0)) == g0
    last = w1 - g0
    window = win_from_space(buf - (last + OVER), ratio_of(last))
    window += window % 2
    assert window < w1 - 1                            # under rcv_ssthresh: not capped
    settle(world)
    assert s.unread_bytes == last + window            # the sender filled it at once


def test_wake_s_delays_a_program_that_waited_not_one_that_was_busy():
    world = World(0, wake_s=1e-3, latency_s=50e-6)
    c, s = pair(world)
    p = world.io().poller()
    p.register(s.fileno(), READ)
    t0 = world.now
    world.call_at(t0 + 0.5, c.send, b"x")
    assert p.wait(None) == [(s.fileno(), READ)]       # it asked, found nothing, slept
    assert world.now == pytest.approx(t0 + 0.5 + 50e-6 + 1e-3)
    assert s.recv(10) == b"x"
    world.call_at(world.now + 0.1, c.send, b"y")
    world.run(until=world.now + 0.2)                  # busy elsewhere: it did not ask
    t1 = world.now
    assert p.wait(None) == [(s.fileno(), READ)] and world.now == t1
    # a peer is a sleeping process too: it reads wake_s after the data lands
    sink = play(world, peers.sink(), listen=B)
    sink_reads = reads(sink)
    c2 = world.io().socket()
    c2.setblocking(False)
    c2.connect_ex(B)
    settle(world, 0.1)
    t2 = world.now
    c2.send(b"z" * 10)
    settle(world, 0.1)
    assert [t for t, _ in sink_reads] == [pytest.approx(t2 + 50e-6 + 1e-3)]
    with pytest.raises(ValueError, match="wake_s"):
        World(0, wake_s=-1)


def test_accounting_is_checked_and_recorded_in_the_universe():
    with pytest.raises(ValueError, match="accounting"):
        World(0, accounting="bsd")
    with pytest.raises(ValueError, match="skb_overhead"):
        World(0, skb_overhead=-1)
    u = lx_world().universe()
    assert u["params"]["accounting"] == "linux" and u["params"]["skb_overhead"] == OVER
    assert World.from_universe(u).params == u["params"]


# -- faults and endings that must agree with poll (issue 23) -------------------

@pytest.mark.parametrize("gate", [
    {"kind": "stall", "duration_s": 5.0},
    {"kind": "slow", "duration_s": 5.0, "rate_Bps": 16384},
])
def test_an_rst_during_a_stall_or_slow_fault_is_reported_by_recv_as_poll_reports_it(gate):
    """poll says error as soon as the RST lands; recv must then raise the error
    (Linux reports a pending error before anything else), not "try again" --
    a reader that trusts poll would otherwise spin for ever."""
    world = World(0, faults=[{"at": 0.01, "conn": 0, "side": "server", **gate},
                             {"at": 0.02, "kind": "reset", "conn": 0, "side": "server"}])
    c, s = pair(world)
    c.send(b"x" * 1000)
    settle(world, 0.05)
    poller = world.io().poller()
    poller.register(s.fileno(), READ)
    assert poller.wait(0) == [(s.fileno(), READ | WRITE)]      # error or hang-up
    if gate["kind"] == "slow":
        s.recv(65536)                     # a slowed reader still gets its first slice
    with pytest.raises(ConnectionResetError):
        while True:
            s.recv(65536)                 # what had arrived, then the error; never EAGAIN


def test_an_rst_after_the_peers_fin_is_epipe_as_on_linux():
    """Linux (tcp_reset): an RST that reaches a socket in CLOSE_WAIT -- the peer's
    FIN already arrived -- is EPIPE, not ECONNRESET: recv returns EOF, send and
    SO_ERROR report EPIPE (checked on loopback, Linux 6.18)."""
    world = World(0)
    c, s = pair(world)
    s.shutdown(socket.SHUT_WR)
    settle(world)
    assert c.peer_eof
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()
    settle(world)
    assert c.peer_reset
    assert c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == errno.EPIPE
    c2, s2 = pair(World(1))
    s2.shutdown(socket.SHUT_WR)
    settle(s2._world)
    s2.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s2.close()
    settle(s2._world)
    assert c2.recv(10) == b""
    with pytest.raises(BrokenPipeError):
        c2.send(b"x")
    with pytest.raises(BrokenPipeError):
        c2.send(b"x")


def test_a_stopped_world_raises_at_its_next_step_and_every_one_after():
    world = World(0)

    def tick():
        world.call_later(0.001, tick)     # time moves: no livelock, just never done
    world.call_later(0, tick)
    world.call_later(0.5, world.stop, "a signal")
    with pytest.raises(SimStopped, match="a signal"):
        world.run()
    assert 0.5 <= world.now < 0.51
    with pytest.raises(SimStopped):
        world.io().poller().wait(0.1)


def test_the_watchdog_ends_a_world_that_runs_too_long_in_wall_time():
    world = World(0)
    world.watchdog(0.2)

    def tick():
        world.call_later(1e-6, tick)
    world.call_later(0, tick)
    t = time.monotonic()
    with pytest.raises(SimStopped, match="watchdog"):
        world.run()
    assert time.monotonic() - t < 5.0


def test_sendmsg_gathers_its_buffers_in_order_as_one_send():
    # asyncio's selector transport writes its buffer with sendmsg on 3.12+
    world = World(0)
    c, s = pair(world)
    assert c.sendmsg([b"GET ", memoryview(b"/x"), bytearray(b" HTTP")]) == 11
    settle(world)
    assert s.recv(100) == b"GET /x HTTP"
    with pytest.raises(OSError):
        c.sendmsg([b"x"], [(socket.SOL_SOCKET, 1, b"")])    # no ancillary data
