"""The measurement peers (bench/peers/) against tiny blocking servers and
clients written here -- never against a looplab kernel: the peers are the
ground truth, so they are checked against something simpler than themselves.

Every socket here has a timeout and every loop a bound in count and time; the
autouse leak check (conftest.py) proves each PeerProcess is reaped and closed.
"""
from __future__ import annotations

import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

from bench.peers import PeerError, PeerProcess, PeerTimeout, check_spec
from protocols.cores import FrameDecoder, encode_frame

KiB = 1024
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------------------
# Tiny blocking helpers

class Server:
    """Accept one connection on 127.0.0.1 and run ``handler(conn)`` in a
    thread; ``join()`` returns what it returned (or re-raises what it raised)."""

    def __init__(self, handler, sockbuf: int | None = 65536):
        self.handler = handler
        self.sock = socket.socket()
        if sockbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sockbuf)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, sockbuf)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1)
        self.addr = self.sock.getsockname()
        self.value = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="test-server")

    def __enter__(self):
        self.thread.start()
        return self

    def _run(self):
        try:
            self.sock.settimeout(10)
            conn, _ = self.sock.accept()
            with conn:
                conn.settimeout(10)
                self.value = self.handler(conn)
        except BaseException as e:  # reported by join()
            self.error = e

    def join(self):
        self.thread.join(15)
        assert not self.thread.is_alive(), "test server thread hung"
        if self.error is not None:
            raise self.error
        return self.value

    def __exit__(self, *exc):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)   # wakes a pending accept()
        except OSError:
            pass
        self.sock.close()
        self.thread.join(15)


def read_all(conn, limit_s: float = 10.0) -> bytes:
    """Everything until EOF (bounded)."""
    chunks, deadline = [], time.monotonic() + limit_s
    while time.monotonic() < deadline:
        data = conn.recv(65536)
        if not data:
            return b"".join(chunks)
        chunks.append(data)
    raise AssertionError("no EOF within the bound")


def connect(addr, sockbuf: int | None = 65536) -> socket.socket:
    c = socket.socket()
    if sockbuf:
        c.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sockbuf)
        c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, sockbuf)
    c.settimeout(10)
    c.connect(addr)
    return c


def close_with_reset(c: socket.socket) -> None:
    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    c.close()


def data(n: int) -> bytes:
    return bytes(i * 7 % 256 for i in range(n))


def monotone(series) -> bool:
    return all(a[0] <= b[0] and a[1] <= b[1] for a, b in zip(series, series[1:]))


# ---------------------------------------------------------------------------
# Spec checking: bad input is a clear error before any process exists

@pytest.mark.parametrize("spec, exc, words", [
    ("sink", TypeError, "list of role dicts"),
    ([], ValueError, "at least one role"),
    ([{"role": "sinq", "listen": "127.0.0.1:0"}], ValueError, "valid roles: sink"),
    ([{"role": "sink", "listen": "127.0.0.1:0", "rate": 5}], ValueError, "no field 'rate'"),
    ([{"role": "sink", "listen": "127.0.0.1:0", "rate_Bps": "fast"}], TypeError, "rate_Bps"),
    ([{"role": "sink", "listen": "127.0.0.1:0", "rate_Bps": -1}], ValueError, "rate_Bps"),
    ([{"role": "sink", "listen": "127.0.0.1:0", "sockbuf": True}], TypeError, "sockbuf"),
    ([{"role": "sink", "listen": "localhost"}], ValueError, "HOST:PORT"),
    ([{"role": "sink", "listen": ("127.0.0.1", 70000)}], ValueError, "0..65535"),
    ([{"role": "sink"}], ValueError, "needs listen"),
    ([{"role": "sink", "listen": "127.0.0.1:0", "connect": "127.0.0.1:1"}], ValueError,
     "not both"),
    ([{"role": "sink", "listen": "127.0.0.1:0", "frame_bytes": 10}], ValueError, ">= 24"),
    ([{"role": "sink", "listen": "127.0.0.1:0", "pause_at_bytes": 10}], ValueError, "pause_s"),
    ([{"role": "source", "connect": "127.0.0.1:1"}], ValueError, "duration_s or total_bytes"),
    ([{"role": "source", "connect": "127.0.0.1:1", "total_bytes": 32768 + 10}], ValueError,
     "10-byte frame"),
    ([{"role": "source", "connect": "127.0.0.1:1", "duration_s": 1, "finish": "slam"}],
     ValueError, "'shutdown', 'close', 'reset'"),
    ([{"role": "pipeline_client", "connect": "127.0.0.1:1"}], ValueError, "needs count"),
    ([{"role": "push_client", "connect": "127.0.0.1:1", "mode": "lazy", "duration_s": 1}],
     ValueError, "'healthy', 'stalled'"),
    ([{"name": "x", "role": "reader", "listen": "127.0.0.1:0"},
      {"name": "x", "role": "sink", "listen": "127.0.0.1:0"}], ValueError, "unique"),
])
def test_bad_spec_is_a_clear_error(spec, exc, words):
    with pytest.raises(exc, match=words):
        PeerProcess(spec)


def test_spec_is_normalized_and_deferred_roles_may_wait_for_their_endpoint():
    roles = check_spec([{"role": "source", "deferred": True, "duration_s": 1},
                        {"role": "sink", "listen": ("127.0.0.1", 0), "max_s": 2}],
                       default_max_s=7)
    source, sink = roles
    assert source["name"] == "source" and source["connect"] is None
    assert source["max_s"] == 7.0 and source["frame_bytes"] == 32768
    assert sink["listen"] == ["127.0.0.1", 0] and sink["max_s"] == 2.0
    json.dumps(roles)   # what goes to the child must be JSON


# ---------------------------------------------------------------------------
# sink

def test_sink_counts_bytes_exactly_and_sees_eof():
    payload = data(1_234_567)
    with PeerProcess([{"role": "sink", "listen": "127.0.0.1:0", "max_s": 10}], timeout_s=15) as p:
        c = connect(p.address("sink"))
        # Uneven pieces: the count must not depend on how the bytes were cut.
        i, step = 0, 1
        while i < len(payload):
            c.sendall(payload[i:i + step])
            i += step
            step = step * 3 % 100_003 + 1
        c.close()
        r = p.result("sink")
    assert r["ended"] == "eof"
    assert r["received_bytes"] == len(payload)
    assert r["series"][-1][1] == len(payload) and monotone(r["series"])
    assert r["eof_after_s"] is not None and r["eof_after_s"] >= 0
    assert r["sockbuf_effective"][0] > 0 and "error" not in r
    assert p.stderr == ""


def test_sink_counts_frames_order_loss_duplicates_and_latency():
    spec = [{"name": "framed", "role": "sink", "listen": "127.0.0.1:0", "frame_bytes": 1000,
             "verify": True, "max_s": 10},
            {"name": "truncated", "role": "sink", "listen": "127.0.0.1:0", "frame_bytes": 1000,
             "max_s": 10}]
    with PeerProcess(spec, timeout_s=15) as p:
        c = connect(p.address("framed"))
        now = time.monotonic()
        # 0 1 2 2(dup) 5 (3 and 4 missing) 3 (late: fills one) 6 (sent 0.5 s ago)
        for seq, ts in [(0, now), (1, now), (2, now), (2, now), (5, now), (3, now),
                        (6, now - 0.5)]:
            c.sendall(encode_frame(seq, ts, 1000))
        c.close()
        t = connect(p.address("truncated"))
        t.sendall(encode_frame(0, now, 1000) + encode_frame(1, now, 1000)[:300])
        t.close()
        framed, truncated = p.result("framed"), p.result("truncated")
    assert framed["ended"] == "eof" and "frame_error" not in framed
    assert framed["frames_count"] == 7 and framed["received_bytes"] == 7000
    assert framed["duplicate_count"] == 1
    assert framed["out_of_order_count"] == 1
    assert framed["missing_count"] == 1          # seq 4 never came
    assert framed["last_seq"] == 6
    assert framed["max_latency_s"] >= 0.5
    assert 0 <= framed["p50_latency_s"] < 0.5
    assert framed["latency_series"] and max(v for _, v in framed["latency_series"]) >= 0.5
    assert truncated["frames_count"] == 1 and truncated["received_bytes"] == 1300
    assert "truncated frame" in truncated["frame_error"]


def test_sink_garbage_is_a_frame_error_but_bytes_are_still_counted():
    with PeerProcess([{"role": "sink", "listen": "127.0.0.1:0", "frame_bytes": 100,
                       "max_s": 10}], timeout_s=15) as p:
        c = connect(p.address("sink"))
        c.sendall(encode_frame(0, time.monotonic(), 100) + b"NOPE" + bytes(5000))
        c.close()
        r = p.result("sink")
    assert r["ended"] == "eof" and r["received_bytes"] == 5104
    assert r["frames_count"] == 1 and "bad magic" in r["frame_error"]


def test_sink_tells_reset_from_eof():
    with PeerProcess([{"role": "sink", "listen": "127.0.0.1:0", "max_s": 10}], timeout_s=15) as p:
        c = connect(p.address("sink"))
        c.sendall(data(100 * KiB))
        time.sleep(0.1)
        close_with_reset(c)
        r = p.result("sink")
    assert r["ended"] == "reset"
    assert r["received_bytes"] <= 100 * KiB and r["eof_after_s"] is None


def test_sink_max_s_is_a_hard_bound_and_close_with_reset_sends_rst():
    with PeerProcess([{"role": "sink", "listen": "127.0.0.1:0", "max_s": 0.5,
                       "close_with_reset": True}], timeout_s=10) as p:
        c = connect(p.address("sink"))
        with c:
            c.sendall(b"hello")
            with pytest.raises(ConnectionResetError):   # an RST, not a FIN (b"")
                c.recv(10)
        r = p.result("sink")
    assert r["ended"] == "timeout" and r["received_bytes"] == 5
    assert 0.4 <= r["ran_s"] < 5


def test_sink_that_nobody_connects_to_times_out():
    with PeerProcess([{"role": "sink", "listen": "127.0.0.1:0", "max_s": 0.3}], timeout_s=10) as p:
        p.address("sink")
        r = p.result("sink")
    assert r["ended"] == "timeout" and r["connected"] is False and r["received_bytes"] == 0


def test_stalled_sink_makes_a_blocking_sender_stall_then_gets_everything():
    total = 3_000_000
    spec = [{"role": "sink", "listen": "127.0.0.1:0", "sockbuf": 65536, "start_after_s": 1.0,
             "max_s": 10}]
    payload = memoryview(bytes(total))
    with PeerProcess(spec, timeout_s=15) as p:
        c = connect(p.address("sink"))
        c.setblocking(False)
        # t0 is at connect: the sink's clock starts at accept, which is later.
        sent, progress, t0 = 0, [], time.monotonic()
        while sent < total and time.monotonic() - t0 < 8:
            try:
                sent += c.send(payload[sent:sent + 65536])
            except BlockingIOError:
                select.select([], [c], [], 0.05)
            progress.append((time.monotonic() - t0, sent))
        c.close()
        r = p.result("sink")

    def sent_at(t):
        return max([s for when, s in progress if when <= t], default=0)
    # While the sink does not read, the sender makes no progress at all: the
    # socket buffers (a few hundred KiB with 64 KiB requested) are full.
    assert sent_at(0.8) - sent_at(0.4) <= 16 * KiB
    assert sent_at(0.8) < total // 3
    assert sent == total                       # and it resumes once the sink reads
    assert r["ended"] == "eof" and r["received_bytes"] == total
    assert r["pauses"][0][3] == "start_after_s" and r["pauses"][0][1] >= 1.0
    assert all(b == 0 for t, b in r["series"] if t < 0.95)


def test_sink_rate_limit_paces_reading():
    n, rate = 1_000_000, 1_000_000
    spec = [{"role": "sink", "listen": "127.0.0.1:0", "sockbuf": 65536, "rate_Bps": rate,
             "recv_bytes": 65536, "warmup_s": 0.3, "max_s": 10}]
    with PeerProcess(spec, timeout_s=15) as p:
        c = connect(p.address("sink"))
        with c:
            c.sendall(data(n))
        r = p.result("sink")
    assert r["received_bytes"] == n and r["ended"] == "eof"
    # A token bucket with one read of burst: never faster than that, and (with
    # a generous margin for a noisy machine) not much slower.
    assert r["eof_after_s"] >= (n - 65536) / rate * 0.97
    assert r["eof_after_s"] < 2.0 * n / rate
    assert 0.7 * rate <= r["rate_after_warmup_Bps"] <= 1.3 * rate


def test_sink_pauses_at_bytes_or_at_a_time_then_resumes():
    spec = [{"name": "bytes", "role": "sink", "listen": "127.0.0.1:0",
             "pause_at_bytes": 100_000, "pause_s": 0.4, "max_s": 10},
            {"name": "time", "role": "sink", "listen": "127.0.0.1:0",
             "stall_at_s": 0.2, "stall_s": 0.4, "max_s": 10}]
    with PeerProcess(spec, timeout_s=15) as p:
        c = connect(p.address("bytes"))
        with c:
            c.sendall(data(300_000))
        t = connect(p.address("time"))
        with t:
            t.sendall(b"early")
            time.sleep(0.3)                 # arrives during the stall
            t.sendall(b"late")
        by_bytes, by_time = p.result("bytes"), p.result("time")
    assert by_bytes["received_bytes"] == 300_000 and by_bytes["ended"] == "eof"
    (began, ended, at, why), = by_bytes["pauses"]
    assert why == "pause_at_bytes" and 100_000 <= at < 300_000
    assert ended - began >= 0.39 and by_bytes["eof_after_s"] >= 0.39
    assert by_time["received_bytes"] == 9 and by_time["ended"] == "eof"
    (began, ended, at, why), = by_time["pauses"]
    assert why == "stall_s" and began >= 0.2 and ended - began >= 0.35
    assert at == 5                          # "late" was only read after the stall


# ---------------------------------------------------------------------------
# source

def _frames_server(conn):
    """Read to EOF, decoding (and verifying) frames; return (bytes, seqs, lengths)."""
    dec, got, seqs, lengths = FrameDecoder(verify=True), 0, [], []
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            dec.eof()
            return got, seqs, lengths
        got += len(chunk)
        for f in dec.feed(chunk):
            seqs.append(f.seq)
            lengths.append(f.length)


def test_source_sends_frames_at_the_requested_rate():
    rate = 1_000_000
    with Server(_frames_server) as srv:
        spec = [{"role": "source", "connect": srv.addr, "rate_Bps": rate, "frame_bytes": 16384,
                 "duration_s": 1.0, "warmup_s": 0.3, "sockbuf": 65536, "max_s": 10}]
        with PeerProcess(spec, timeout_s=15) as p:
            r = p.result("source")
        got, seqs, _ = srv.join()
    assert r["ended"] == "closed" and "error" not in r
    assert got == r["sent_bytes"]                    # every byte the source counted arrived
    assert seqs == list(range(r["frames_sent"]))     # numbered from 0, in order, none lost
    assert 0.7 * rate <= r["sent_bytes"] <= 1.3 * rate
    assert 0.7 * rate <= r["rate_after_warmup_Bps"] <= 1.3 * rate
    assert monotone(r["series"]) and r["series"][-1][1] == r["sent_bytes"]


def test_source_total_bytes_with_short_last_frame_and_shutdown_waits_for_eof():
    total = 5 * 10_000 + 1234
    with Server(_frames_server) as srv:
        spec = [{"role": "source", "connect": srv.addr, "frame_bytes": 10_000,
                 "total_bytes": total, "finish": "shutdown", "max_s": 10}]
        with PeerProcess(spec, timeout_s=15) as p:
            r = p.result("source")
        got, seqs, lengths = srv.join()   # the server closes after our EOF: the source's EOF
    assert got == total == r["sent_bytes"]
    assert lengths == [10_000] * 5 + [1234] and seqs == list(range(6))
    assert r["ended"] == "eof" and r["peer_eof"] is True


def test_source_shutdown_gives_up_waiting_for_eof_after_eof_wait_s():
    def server(conn):
        conn.settimeout(5)
        got = read_all(conn)          # the source's EOF; we never close in return
        time.sleep(0.6)
        return len(got)
    with Server(server) as srv:
        spec = [{"role": "source", "connect": srv.addr, "frame_bytes": 1000,
                 "total_bytes": 3000, "finish": "shutdown", "eof_wait_s": 0.3, "max_s": 10}]
        with PeerProcess(spec, timeout_s=15) as p:
            r = p.result("source")
        assert srv.join() == 3000
    assert r["ended"] == "timeout" and r["peer_eof"] is False


def test_source_finish_reset_sends_rst():
    def server(conn):
        time.sleep(0.3)       # let the source finish (and reset) before we read
        try:
            read_all(conn)
        except ConnectionResetError:
            return "reset"
        return "eof"
    with Server(server) as srv:
        spec = [{"role": "source", "connect": srv.addr, "frame_bytes": 1000,
                 "total_bytes": 5000, "finish": "reset", "max_s": 10}]
        with PeerProcess(spec, timeout_s=15) as p:
            r = p.result("source")
        assert srv.join() == "reset"
    assert r["ended"] == "reset_sent" and r["sent_bytes"] == 5000


def test_source_sees_the_peer_reset_while_sending():
    def server(conn):
        conn.recv(1000)
        close_with_reset(conn)
    with Server(server) as srv:
        spec = [{"role": "source", "connect": srv.addr, "frame_bytes": 16384,
                 "duration_s": 5.0, "max_s": 10}]
        with PeerProcess(spec, timeout_s=15) as p:
            r = p.result("source")
        srv.join()
    assert r["ended"] == "reset" and "error" not in r
    assert r["ran_s"] < 4.0                        # it stopped at the reset, not at duration_s


def test_refused_connection_is_a_result_not_a_traceback():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()                                      # nobody listens there now
    spec = [{"role": "source", "connect": ("127.0.0.1", port), "duration_s": 1, "max_s": 5},
            {"role": "echo_client", "connect": ("127.0.0.1", port), "total_bytes": 10,
             "max_s": 5}]
    with PeerProcess(spec, timeout_s=10) as p:
        res = p.results()
        assert p.stderr == ""
    for r in res.values():
        assert r["ended"] == "error" and "refused" in r["error"].lower()
        assert f"127.0.0.1:{port}" in r["error"]
        assert r["connected"] is False


# ---------------------------------------------------------------------------
# clients: pipeline, push, echo, reset

def test_pipeline_client_sends_count_requests_and_never_reads():
    count = 300
    pushed = []

    def server(conn):
        buf = b""
        while buf.count(b"\n") < count:
            chunk = conn.recv(65536)
            if not chunk:
                break
            buf += chunk
        # Answer into a client that never reads: push until the buffers are full.
        conn.setblocking(False)
        total, t_end = 0, time.monotonic() + 0.3
        while time.monotonic() < t_end:
            try:
                total += conn.send(bytes(65536))
            except BlockingIOError:
                time.sleep(0.01)
        pushed.append(total)
        conn.settimeout(5)
        try:
            read_all(conn)           # until the client closes
        except ConnectionResetError:
            pass                     # it closes with our data unread: that is an RST
        return buf
    with Server(server) as srv:
        spec = [{"role": "pipeline_client", "connect": srv.addr, "count": count, "hold_s": 0.6,
                 "sockbuf": 65536, "max_s": 10}]
        with PeerProcess(spec, timeout_s=15) as p:
            r = p.result("pipeline_client")
        got = srv.join()
    assert got == b"".join(b"REQ %d\n" % i for i in range(count))
    assert r["requests_sent"] == count and r["sent_bytes"] == len(got)
    assert r["ended"] == "closed" and r["received_bytes"] == 0
    assert 0 < r["unread_bytes"] <= pushed[0]


def test_pipeline_client_hold_ends_when_the_server_closes():
    def server(conn):
        conn.recv(100)
        time.sleep(0.1)
        conn.shutdown(socket.SHUT_WR)
        read_all(conn)
    with Server(server) as srv:
        spec = [{"role": "pipeline_client", "connect": srv.addr, "count": 3, "hold_s": 5.0,
                 "max_s": 10}]
        with PeerProcess(spec, timeout_s=15) as p:
            r = p.result("pipeline_client")
        srv.join()
    assert r["ended"] == "eof" and r["requests_sent"] == 3
    assert r["ran_s"] < 4.0


def test_push_clients_healthy_reads_everything_stalled_reads_nothing():
    def healthy_server(conn):
        conn.sendall(data(1_000_000))
        return "sent"

    stalled_pushed = []

    def stalled_server(conn):
        conn.setblocking(False)
        total, t_end = 0, time.monotonic() + 0.3
        while time.monotonic() < t_end:
            try:
                total += conn.send(bytes(65536))
            except BlockingIOError:
                time.sleep(0.01)
        stalled_pushed.append(total)
        conn.settimeout(5)
        try:
            return read_all(conn)
        except ConnectionResetError:   # closed with unread data
            return b""
    with Server(healthy_server) as hs, Server(stalled_server) as ss:
        spec = [{"name": "healthy", "role": "push_client", "connect": hs.addr,
                 "mode": "healthy", "duration_s": 5.0, "sockbuf": 65536, "max_s": 10},
                {"name": "stalled", "role": "push_client", "connect": ss.addr,
                 "mode": "stalled", "duration_s": 0.6, "sockbuf": 65536, "max_s": 10}]
        with PeerProcess(spec, timeout_s=15) as p:
            res = p.results()
        hs.join(), ss.join()
    healthy, stalled = res["healthy"], res["stalled"]
    assert healthy["received_bytes"] == 1_000_000 and healthy["ended"] == "eof"
    assert stalled["received_bytes"] == 0 and stalled["ended"] == "closed"
    assert 0 < stalled["unread_bytes"] <= stalled_pushed[0]
    assert stalled_pushed[0] < 1_000_000    # the stall reached the server as backpressure


def _echo_server(corrupt_at=None):
    def server(conn):
        seen = 0
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                conn.shutdown(socket.SHUT_WR)
                return seen
            if corrupt_at is not None and seen <= corrupt_at < seen + len(chunk):
                k = corrupt_at - seen
                chunk = chunk[:k] + bytes([chunk[k] ^ 0xFF]) + chunk[k + 1:]
            seen += len(chunk)
            conn.sendall(chunk)
    return server


@pytest.mark.parametrize("corrupt_at", [None, 70_001])
def test_echo_client_verifies_byte_exact(corrupt_at):
    total = 1_000_000
    with Server(_echo_server(corrupt_at)) as srv:
        spec = [{"role": "echo_client", "connect": srv.addr, "total_bytes": total,
                 "chunk_bytes": 10_000, "sockbuf": 65536, "max_s": 10}]
        with PeerProcess(spec, timeout_s=15) as p:
            r = p.result("echo_client")
        assert srv.join() == total
    assert r["sent_bytes"] == r["received_bytes"] == total
    assert r["ended"] == "eof"
    assert r["ok"] is (corrupt_at is None)
    assert r["mismatch_at"] == corrupt_at


def test_reset_peer_reads_exactly_after_bytes_then_resets():
    def server(conn):
        try:
            for _ in range(200):
                conn.sendall(bytes(65536))
        except (ConnectionResetError, BrokenPipeError):
            return "reset"
        return "not reset"
    with Server(server) as srv:
        spec = [{"role": "reset_peer", "connect": srv.addr, "after_bytes": 100_000,
                 "max_s": 10}]
        with PeerProcess(spec, timeout_s=15) as p:
            r = p.result("reset_peer")
        assert srv.join() == "reset"
    assert r["received_bytes"] == 100_000
    assert r["reset_sent"] is True and r["ended"] == "reset_sent"


def test_reset_peer_after_s_listening():
    with PeerProcess([{"role": "reset_peer", "listen": "127.0.0.1:0", "after_s": 0.3,
                       "max_s": 10}], timeout_s=15) as p:
        c = connect(p.address("reset_peer"))
        with c:
            c.sendall(b"x" * 1000)
            with pytest.raises(ConnectionResetError):
                c.recv(10)
        r = p.result("reset_peer")
    assert r["received_bytes"] == 1000 and r["reset_after_s"] >= 0.3


# ---------------------------------------------------------------------------
# reader (S3/S7/S8 ground truth)

def test_reader_counts_to_eof_and_times_eof_from_the_first_byte():
    with PeerProcess([{"role": "reader", "listen": "127.0.0.1:0", "start_after_s": 0.3,
                       "max_s": 10}], timeout_s=15) as p:
        addr = p.address("reader")
        t_connect = time.monotonic()
        c = connect(addr)
        c.sendall(data(200_000))
        time.sleep(0.6)
        t_close = time.monotonic()
        c.close()
        r = p.result("reader")
    assert r["ended"] == "eof" and r["received_bytes"] == 200_000
    assert r["first_byte_after_s"] >= 0.3          # it really waited before reading
    assert r["eof_after_connect_s"] >= 0.55        # EOF only after we closed
    assert r["eof_after_s"] == pytest.approx(r["eof_after_connect_s"] - r["first_byte_after_s"])
    # Absolute monotonic times, comparable with this process's clock (Linux).
    assert r["eof_at"] - r["connected_at"] == pytest.approx(r["eof_after_connect_s"])
    assert t_connect - 0.05 <= r["connected_at"] and r["eof_at"] >= t_close


def test_reader_rate_limit_makes_a_slow_reader():
    n, rate = 300_000, 500_000
    with PeerProcess([{"role": "reader", "listen": "127.0.0.1:0", "rate_Bps": rate,
                       "recv_bytes": 16384, "sockbuf": 65536, "max_s": 10}], timeout_s=15) as p:
        c = connect(p.address("reader"))
        with c:
            c.sendall(data(n))
        r = p.result("reader")
    assert r["ended"] == "eof" and r["received_bytes"] == n
    assert r["eof_after_connect_s"] >= (n - 16384) / rate * 0.97


# ---------------------------------------------------------------------------
# the process: deferred roles, waits, and always ending the child

def test_deferred_role_and_source_to_sink_in_one_process():
    spec = [{"name": "sink", "role": "sink", "listen": "127.0.0.1:0", "frame_bytes": 8192,
             "sockbuf": 65536, "max_s": 10},
            {"name": "source", "role": "source", "connect": None, "frame_bytes": 8192,
             "total_bytes": 8192 * 40, "rate_Bps": 2_000_000, "deferred": True, "max_s": 10}]
    with PeerProcess(spec, timeout_s=15) as p:
        with pytest.raises(ValueError, match="not started"):
            p.address("source")
        with pytest.raises(PeerError, match="never started"):
            p.results()
        p.start("source", connect=p.address("sink"))
        with pytest.raises(ValueError, match="already started"):
            p.start("source")
        res = p.results()
    sink, source = res["sink"], res["source"]
    assert source["sent_bytes"] == sink["received_bytes"] == 8192 * 40
    assert sink["frames_count"] == source["frames_sent"] == 40
    assert sink["missing_count"] == sink["out_of_order_count"] == 0
    assert sink["ended"] == "eof" and source["ended"] == "closed"


def test_misuse_of_the_parent_api_is_a_clear_error():
    spec = [{"role": "sink", "listen": "127.0.0.1:0", "max_s": 5},
            {"role": "echo_client", "deferred": True, "max_s": 5}]
    with PeerProcess(spec, timeout_s=10) as p:
        with pytest.raises(ValueError, match="no role named 'nope'"):
            p.address("nope")
        with pytest.raises(ValueError, match="not deferred"):
            p.start("sink")
        with pytest.raises(ValueError, match="needs total_bytes"):
            p.start("echo_client", connect=p.address("sink"))
        with pytest.raises(ValueError, match="no field 'colour'"):
            p.start("echo_client", colour="red")
        with pytest.raises(PeerTimeout, match="result of role 'sink'"):
            p.result("sink", timeout=0.2)
    with pytest.raises(RuntimeError, match="not running"):
        PeerProcess(spec).address("sink")


def test_leaving_the_block_with_roles_running_ends_the_child():
    spec = [{"role": "sink", "listen": "127.0.0.1:0", "max_s": 60},
            {"role": "reader", "listen": "127.0.0.1:0", "max_s": 60}]
    t0 = time.monotonic()
    with PeerProcess(spec, timeout_s=60) as p:
        c = connect(p.address("sink"))     # a live connection in the child, too
        pid = p.pid
        with pytest.raises(PeerTimeout, match="still running: sink, reader"):
            p.results(timeout=0.2)
    c.close()
    assert p.returncode is not None        # reaped
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert time.monotonic() - t0 < 10      # not waiting for max_s


def test_an_exception_or_ctrl_c_in_the_block_ends_the_child():
    spec = [{"role": "reader", "listen": "127.0.0.1:0", "max_s": 60}]
    with pytest.raises(KeyboardInterrupt):
        with PeerProcess(spec, timeout_s=60) as p:
            p.address("reader")
            raise KeyboardInterrupt
    assert p.returncode is not None


def test_a_child_that_dies_makes_waits_fail_fast():
    spec = [{"role": "reader", "listen": "127.0.0.1:0", "max_s": 60}]
    with PeerProcess(spec, timeout_s=60) as p:
        p.address("reader")
        os.kill(p.pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(PeerError, match="exited"):
            p.results()
        assert time.monotonic() - t0 < 5


def test_the_child_speaks_json_lines_on_its_own():
    env = dict(os.environ, PYTHONPATH=ROOT)
    bad = subprocess.run([sys.executable, "-m", "bench.peers", '[{"role": "nope"}]'],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "unknown role" in json.loads(bad.stdout)["error"]
    assert bad.stderr == ""

    proc = subprocess.Popen([sys.executable, "-m", "bench.peers", "-"], cwd=ROOT, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        proc.stdin.write(json.dumps({"timeout_s": 10, "roles": [
            {"role": "reader", "listen": "127.0.0.1:0", "max_s": 5}]}) + "\n")
        proc.stdin.flush()
        listening = json.loads(proc.stdout.readline())
        assert listening["event"] == "listening" and listening["name"] == "reader"
        with connect(tuple(listening["addr"])) as c:
            c.sendall(b"abc")
        result = json.loads(proc.stdout.readline())
        assert result["event"] == "result" and result["result"]["received_bytes"] == 3
        assert json.loads(proc.stdout.readline()) == {"event": "done"}
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdin.close()
        proc.stdout.close()


def test_public_roles_build_specs_that_check():
    from bench import peers
    at = ("127.0.0.1", 9)
    spec = [peers.sink(rate_Bps=1_000_000), peers.source(connect=at, duration_s=1.0),
            peers.reader("r2", start_after_s=0.5), peers.pipeline_client(connect=at, count=3),
            peers.push_client("h", connect=at, mode="healthy", duration_s=1.0),
            peers.echo_client("e", connect=at, total_bytes=10),
            peers.reset_peer(connect=at, after_s=0.1)]
    from bench.peers.roles import BUILTIN
    assert {r["role"] for r in spec} == {cls.role for cls in BUILTIN} <= set(peers.ROLES)
    assert spec[0]["listen"] == "127.0.0.1:0"          # listening roles default to a free port
    checked = check_spec(spec)
    assert [r["name"] for r in checked] == ["sink", "source", "r2", "client", "h", "e", "reset"]
    assert checked[2]["start_after_s"] == 0.5
    with pytest.raises(ValueError, match="valid roles"):
        peers.role("nope")
