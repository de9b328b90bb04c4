"""The measurement peers' roles: what each one does on its blocking socket.

Runs inside the peer process (``bench/peerproc.py``), one thread per role.
``_Run`` is one role's life -- config, clock and deadline, sockets, counters,
result -- and owns the error mapping (a peer reset is ``_Ended("reset")``, the
deadline ``_Ended("timeout")``); the role functions (``_sink``, ``_source``,
...) are written against its few primitives. ``_ROLE_FUNCS`` maps each role
in ``bench.peerspec.ROLES`` to its function. What the roles report is
described in ``bench/peers.py``.

Sockets run with a short timeout (``_TICK``) so a role can notice its
deadline, never with ``sendall``: roles send with a loop of ``send()`` calls,
so ``sent_bytes`` is always what the OS accepted, to the byte.
"""
from __future__ import annotations

import math
import select
import socket
import struct
import threading
import time

from bench.peerspec import ROLES

_TICK = 0.05                 # socket timeout and series sampling period


# ---------------------------------------------------------------------------
# The child side: one _Run per role, in its own thread.

class _Ended(Exception):
    """The stream ended (``how``: "eof", "reset", "timeout"); unwinds a role."""

    def __init__(self, how: str):
        super().__init__(how)
        self.how = how


_RESETS = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


class _Run:
    """One role's life: its config, its clock and deadline, its sockets, its
    counters and its result. The role functions below are written against
    these few primitives, which own the error mapping: a peer reset is
    ``_Ended("reset")`` wherever it surfaces, the role's deadline is
    ``_Ended("timeout")``, and counts stay exact across both."""

    def __init__(self, cfg: dict, emit):
        self.cfg = cfg
        self.name = cfg["name"]
        self.emit = emit
        self.began = time.monotonic()
        self.deadline = self.began + cfg["max_s"]
        self.t0: float | None = None        # when the connection was established
        self.sent = 0
        self.received = 0
        self.tracked = "received"           # which counter the series follows
        self.series: list[list] = []
        self._warm: tuple | None = None     # (t, received) when warmup_s had passed
        self._last_in: tuple | None = None  # (t, received) at the last byte in
        self._next_sample = 0.0
        self.socks: list[socket.socket] = []
        self.result: dict = {"name": self.name, "role": cfg["role"], "ended": None,
                             "connected": False}

    # -- connection -----------------------------------------------------------

    def _socket(self) -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socks.append(s)
        size = self.cfg["sockbuf"]
        if size:
            # Before listen/connect: the window scale is fixed in the handshake,
            # and an accepted socket inherits the listener's buffers.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)
        return s

    def open(self) -> socket.socket:
        """Listen and accept one connection, or connect; start the role's clock."""
        cfg = self.cfg
        s = self._socket()
        if cfg["listen"] is not None:
            host, port = cfg["listen"]
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
                s.listen(1)
            except OSError as e:
                raise OSError(e.errno, f"listen on {host}:{port}: {e.strerror or e}") from None
            addr = s.getsockname()[:2]
            self.result["listen"] = list(addr)
            self.emit({"event": "listening", "name": self.name, "addr": list(addr)})
            s.settimeout(_TICK)
            while True:
                try:
                    conn, _ = s.accept()
                    break
                except socket.timeout:
                    if time.monotonic() >= self.deadline:
                        raise _Ended("timeout") from None
            self.close(s)
            s = conn
            self.socks.append(s)
        else:
            host, port = cfg["connect"]
            s.settimeout(max(0.001, min(self.deadline - time.monotonic(), 10.0)))
            try:
                s.connect((host, port))
            except OSError as e:
                raise OSError(e.errno, f"connect to {host}:{port}: {e.strerror or e}") from None
        s.settimeout(_TICK)
        self.t0 = time.monotonic()
        self._next_sample = self.t0
        self.result.update(
            connected=True, connected_at=self.t0, connected_after_s=self.t0 - self.began,
            peer=list(s.getpeername()[:2]),
            sockbuf_effective=[s.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF),
                               s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)])
        return s

    def close(self, s: socket.socket, reset: bool = False) -> None:
        """Close ``s``; with ``reset`` the close sends an RST (SO_LINGER 0)."""
        if s in self.socks:
            self.socks.remove(s)
        try:
            if reset:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        s.close()

    def close_all(self) -> None:
        for s in list(self.socks):
            self.close(s)

    # -- time -----------------------------------------------------------------

    def sample(self, now: float, force: bool = False) -> None:
        """Add [t, counter] to the series if ~50 ms passed (or ``force``)."""
        if now >= self._next_sample or force:
            self.series.append([round(now - self.t0, 4), getattr(self, self.tracked)])
            self._next_sample = now + _TICK

    def sleep_until(self, t: float) -> None:
        """Sleep until monotonic ``t``, sampling meanwhile; ``_Ended("timeout")``
        if the role's deadline comes first."""
        while True:
            now = time.monotonic()
            if now >= t:
                return
            if now >= self.deadline:
                raise _Ended("timeout")
            if self.t0 is not None:
                self.sample(now)
            time.sleep(min(t - now, self.deadline - now, _TICK))

    # -- data -------------------------------------------------------------

    def count_in(self, n: int, now: float) -> None:
        """Count ``n`` bytes received at ``now`` (series, warm-up rate).

        The warm-up mark is taken *after* counting the read that crosses it,
        so the rate spans whole read-to-read intervals: marking before would
        count k reads over k-1 intervals and overstate a paced reader's rate
        by one read per window (6 % for 64 KiB reads at 1 MB/s over 1 s)."""
        self.received += n
        if self._warm is None and now - self.t0 >= self.cfg.get("warmup_s", math.inf):
            self._warm = (now, self.received)
        self._last_in = (now, self.received)
        self.sample(now)

    def rate_in_after_warmup(self) -> float | None:
        """Bytes/s received from ``warmup_s`` after connecting to the last
        byte; None if nothing came after the warm-up."""
        if self._warm is None or self._last_in[0] <= self._warm[0]:
            return None
        return (self._last_in[1] - self._warm[1]) / (self._last_in[0] - self._warm[0])

    def recv_into(self, s: socket.socket, view, until: float | None = None) -> int | None:
        """Block until some bytes arrive: their count, 0 at EOF, None once
        ``until`` passed (if before the deadline). Reset and the deadline raise
        ``_Ended``."""
        cut = until is not None and until < self.deadline
        limit = until if cut else self.deadline
        while True:
            # Checked before every call, not only when idle: a peer that keeps
            # sending would otherwise keep a reader past its bounds.
            if time.monotonic() >= limit:
                if cut:
                    return None
                raise _Ended("timeout")
            try:
                return s.recv_into(view)
            except socket.timeout:
                self.sample(time.monotonic())
            except _RESETS:
                raise _Ended("reset") from None

    def send_all(self, s: socket.socket, data, sample: bool = True) -> None:
        """Like ``sendall``, but ``self.sent`` counts every byte the OS took,
        also when the deadline (``_Ended("timeout")``) or a reset cuts it.
        ``sample=False`` for a sender beside a thread that owns the series."""
        view = memoryview(data)
        n, done = len(view), 0
        while done < n:
            if time.monotonic() >= self.deadline:
                raise _Ended("timeout")
            try:
                k = s.send(view[done:])
            except socket.timeout:
                if sample:
                    self.sample(time.monotonic())
                continue
            except _RESETS:
                raise _Ended("reset") from None
            done += k
            self.sent += k

    def hold(self, s: socket.socket, until: float) -> str | None:
        """Keep the connection open without reading a byte until ``until``.

        Returns None when held to the end, "eof"/"reset" when the peer ended
        the connection first. POLLRDHUP reports the peer's FIN without
        consuming data, so holding never opens the receive window; the FIN
        itself only arrives once everything before it fits, which is the
        truth of a client that never reads. Deadline: ``_Ended("timeout")``.
        """
        cut = until > self.deadline
        limit = self.deadline if cut else until
        rdhup = getattr(select, "POLLRDHUP", 0)
        poller = select.poll()
        poller.register(s, rdhup | select.POLLERR | select.POLLHUP)
        while True:
            now = time.monotonic()
            if now >= limit:
                if cut:
                    raise _Ended("timeout")
                return None
            self.sample(now)
            events = poller.poll(min(limit - now, _TICK) * 1000)
            if events:
                if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    return "reset"
                mask = events[0][1]
                if mask & (rdhup | select.POLLHUP):
                    return "eof"
                if mask & select.POLLERR:
                    return "reset"


def _unread_bytes(s: socket.socket) -> int | None:
    """Bytes waiting unread in ``s``'s receive queue (Linux FIONREAD), or None."""
    try:
        import fcntl
        import termios
        return struct.unpack("i", fcntl.ioctl(s.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]
    except (ImportError, OSError, AttributeError):
        return None


class _Bucket:
    """Token bucket for reads: on average ``rate`` bytes/s, and at most
    ``burst`` bytes of credit saved while the reader was waiting for data (a
    sink must not make up for an idle second in one gulp)."""
    __slots__ = ("per_byte", "burst_s", "due")

    def __init__(self, rate: float, burst: int, now: float):
        self.per_byte = 1.0 / rate
        self.burst_s = burst / rate
        self.due = now

    def charge(self, n: int, now: float) -> None:
        due = self.due
        if due < now - self.burst_s:
            due = now - self.burst_s
        self.due = due + n * self.per_byte


# -- the roles ------------------------------------------------------------
#
# Each role function fills run.result with its own fields; the common ones
# (counters, series, ended) are filled by _play around it. A role sets
# result["ended"] where it knows; an _Ended raised through it sets it too.

def _sink(run: _Run) -> None:
    """Read and count until EOF, reset or ``max_s``.

    Shaping, all optional: ``start_after_s`` (read nothing until then: a
    stalled reader), ``stall_at_s``+``stall_s`` (a pause at a time),
    ``pause_at_bytes``+``pause_s`` (a pause once that much has arrived),
    ``rate_Bps`` (token bucket, one ``recv_bytes`` read of burst). With
    ``frame_bytes`` the stream is decoded as frames no longer than that
    (``protocols.cores.SinkCore``; ``verify`` checks every payload byte).
    Reports ``eof_after_s`` (connect to EOF), ``eof_at`` (its monotonic
    time), ``rate_after_warmup_Bps`` (received, from ``warmup_s`` after
    connecting to the last byte), ``pauses`` [[from_s, to_s, bytes_before,
    why]], and with frames ``frames_count``, ``out_of_order_count``,
    ``missing_count``, ``duplicate_count``, ``max_latency_s``,
    ``p50_latency_s``, ``last_seq``, ``latency_series`` [[t_s, max latency in
    that ~50 ms]] and ``frame_error`` if the stream broke the framing (bytes
    are still counted). ``close_with_reset`` closes with an RST whatever the
    ending.

    Hazards: a pause starts between reads, so up to one ``recv_bytes`` read
    may land past ``pause_at_bytes`` and a stall may begin up to ~50 ms late.
    Latency is measured when the read returns: a sink slower than its source
    shows the queue in front of it as latency, which is the point.
    """
    cfg, res = run.cfg, run.result
    res.update(eof_after_s=None, eof_at=None, rate_after_warmup_Bps=None, pauses=[])
    core = None
    if cfg["frame_bytes"] is not None:
        from protocols.cores import ProtocolError, SinkCore
        core = SinkCore(cfg["frame_bytes"], verify=cfg["verify"])
    buf = memoryview(bytearray(cfg["recv_bytes"]))
    s = run.open()
    t0 = run.t0
    bucket = _Bucket(cfg["rate_Bps"], cfg["recv_bytes"], t0) if cfg["rate_Bps"] else None
    stall_from = t0 + cfg["stall_at_s"] if cfg["stall_s"] else math.inf
    stall_to = stall_from + cfg["stall_s"]
    pause_at = cfg["pause_at_bytes"]

    def pause(until, why):
        began = time.monotonic()
        at = run.received
        run.sleep_until(until)
        res["pauses"].append([round(began - t0, 4), round(time.monotonic() - t0, 4), at, why])

    try:
        if cfg["start_after_s"]:
            pause(t0 + cfg["start_after_s"], "start_after_s")
        while True:
            now = time.monotonic()
            if stall_from <= now < stall_to:
                pause(stall_to, "stall_s")
                stall_from = math.inf
            if pause_at is not None and run.received >= pause_at:
                pause(now + cfg["pause_s"], "pause_at_bytes")
                pause_at = None
            if bucket is not None and bucket.due > now:
                run.sleep_until(bucket.due)
            # A pending stall bounds the wait: a recv blocked across the
            # stall's start would otherwise read in the middle of it.
            n = run.recv_into(s, buf, stall_from)
            if n is None:
                continue
            now = time.monotonic()
            if n == 0:
                res.update(ended="eof", eof_at=now, eof_after_s=now - t0)
                if core is not None and "frame_error" not in res:
                    try:
                        core.eof()
                    except ProtocolError as e:
                        res["frame_error"] = str(e)
                break
            run.count_in(n, now)
            if bucket is not None:
                bucket.charge(n, now)
            if core is not None and "frame_error" not in res:
                try:
                    core.receive(buf[:n], now)
                except ProtocolError as e:
                    # The decoder stays failed: from here on we count bytes only.
                    # Frames completed in this chunk before the bad byte ride on
                    # the error; SinkCore does not add them (guarded so that it
                    # may start to without double counting).
                    res["frame_error"] = str(e)
                    if core.stats.count < core.decoder.frames_count:
                        for frame in e.partial:
                            core.stats.add(frame, now)
    finally:
        res["rate_after_warmup_Bps"] = run.rate_in_after_warmup()
        if core is not None:
            stats = core.stats
            res.update(stats.summary())
            res["latency_series"] = _window_max(stats.latency_times, stats.latencies, t0)
        if cfg["close_with_reset"]:
            run.close(s, reset=True)


def _window_max(times, values, t0) -> list[list]:
    """[[t, max value in that ~50 ms window], ...] from time-ordered samples."""
    out: list[list] = []
    end = -math.inf
    for t, v in zip(times, values):
        if t >= end:
            out.append([round(t - t0, 4), v])
            end = t + _TICK
        elif v > out[-1][1]:
            out[-1][1] = v
    return out


def _source(run: _Run) -> None:
    """Send frames (``protocols.cores.SourceCore``: numbered from 0, stamped
    with ``time.monotonic()`` just before the send) at ``rate_Bps`` for
    ``duration_s`` and/or up to ``total_bytes`` (a shorter last frame), then
    ``finish``: "close", "reset" (RST), or "shutdown" (SHUT_WR, then wait up to
    ``eof_wait_s`` for the other side's EOF: ``peer_eof``).

    ``frames_sent`` counts frames handed to the socket (the last one may be
    partial if a reset or ``max_s`` cut it; ``sent_bytes`` is exact).
    A frame goes whole, blocking: backpressure shows as a lower achieved rate
    (``rate_Bps`` over the whole send, ``rate_after_warmup_Bps`` after
    ``warmup_s``) and as ``send_blocked_s``, never as a burst afterwards (the
    bucket saves at most two frames of credit). A frame started before
    ``duration_s`` is finished, so the peer never sees a truncated frame
    unless ``max_s`` or a reset cuts it.
    """
    from protocols.cores import SourceCore
    cfg, res = run.cfg, run.result
    run.tracked = "sent"
    res.update(finish=cfg["finish"], frames_sent=0, rate_Bps=None, rate_after_warmup_Bps=None,
               send_blocked_s=0.0, sending_s=None, peer_eof=None)
    core = SourceCore(cfg["frame_bytes"], cfg["total_bytes"], cfg["rate_Bps"])
    s = run.open()
    t0 = run.t0
    stop_at = t0 + cfg["duration_s"] if cfg["duration_s"] is not None else math.inf
    # Rate after warm-up: between two send *completions* (cumulative bytes the
    # OS had taken by then), so whole frame intervals are counted, never one
    # frame more than the span it took.
    warm_at = t0 + cfg["warmup_s"]
    warm_mark = last_done = None
    blocked = 0.0
    ended_sending = None
    try:
        while not core.done:
            now = time.monotonic()
            if now >= stop_at:
                break
            frame = core.next_chunk(now)
            if frame is None:
                run.sleep_until(min(now + core.wait_s(now), stop_at))
                continue
            run.send_all(s, frame)
            after = time.monotonic()
            blocked += after - now
            last_done = (after, run.sent)
            if warm_mark is None and after >= warm_at:
                warm_mark = last_done
            run.sample(after)
    except _Ended as e:
        ended_sending = e.how
    finally:
        t_end = time.monotonic()
        res["frames_sent"] = core.frames_sent
        res["send_blocked_s"] = blocked
        res["sending_s"] = t_end - t0
        if t_end > t0:
            res["rate_Bps"] = run.sent / (t_end - t0)
        if warm_mark is not None and last_done[0] > warm_mark[0]:
            res["rate_after_warmup_Bps"] = ((last_done[1] - warm_mark[1])
                                            / (last_done[0] - warm_mark[0]))
    if ended_sending is not None:
        raise _Ended(ended_sending)
    finish = cfg["finish"]
    if finish == "close":
        run.close(s)
        res["ended"] = "closed"
    elif finish == "reset":
        run.close(s, reset=True)
        res["ended"] = "reset_sent"
    else:
        try:
            s.shutdown(socket.SHUT_WR)
        except OSError:
            raise _Ended("reset") from None
        # Wait for the other side's EOF, discarding (but counting) what comes.
        buf = memoryview(bytearray(cfg["recv_bytes"]))
        until = time.monotonic() + cfg["eof_wait_s"]
        while True:
            n = run.recv_into(s, buf, until)
            if n is None:
                res.update(ended="timeout", peer_eof=False)
                return
            if n == 0:
                res.update(ended="eof", peer_eof=True)
                return
            run.received += n


def _pipeline_client(run: _Run) -> None:
    """Send ``count`` requests b"REQ i\\n" back to back, never read a byte,
    hold the connection ``hold_s`` (ending early if the server closes or
    resets), then close -- with the responses unread, so the close is an RST,
    as for the real clients of Twisted ticket 8868. Reports ``requests_sent``
    and ``unread_bytes`` (what the server got into our receive queue)."""
    cfg, res = run.cfg, run.result
    run.tracked = "sent"
    res.update(requests_sent=0, unread_bytes=None)
    s = run.open()
    try:
        # One send per request: each is on the wire as soon as the OS takes
        # it (Nagle may still coalesce them; the server must cope either way).
        for i in range(cfg["count"]):
            run.send_all(s, b"REQ %d\n" % i)
            res["requests_sent"] = i + 1
        how = run.hold(s, time.monotonic() + cfg["hold_s"])
        res["ended"] = how or "closed"
    finally:
        res["unread_bytes"] = _unread_bytes(s)


def _push_client(run: _Run) -> None:
    """Connect and stay ``duration_s``: ``mode="healthy"`` reads everything as
    fast as it comes, ``"stalled"`` never reads (``unread_bytes`` at the end).
    Ends early on the server's EOF or reset."""
    cfg, res = run.cfg, run.result
    res.update(mode=cfg["mode"], unread_bytes=None)
    s = run.open()
    until = run.t0 + cfg["duration_s"]
    if cfg["mode"] == "stalled":
        try:
            res["ended"] = run.hold(s, until) or "closed"
        finally:
            res["unread_bytes"] = _unread_bytes(s)
        return
    buf = memoryview(bytearray(cfg["recv_bytes"]))
    while True:
        n = run.recv_into(s, buf, until)
        if n is None:
            res["ended"] = "closed"
            return
        if n == 0:
            res["ended"] = "eof"
            return
        run.count_in(n, time.monotonic())


_PERIOD = 251   # the echo pattern: byte i of the stream is i % 251 (prime: never aligns)


def _echo_client(run: _Run) -> None:
    """Send ``total_bytes`` of a deterministic pattern in ``chunk_bytes``
    pieces while a second thread reads the echo and checks it byte for byte;
    then SHUT_WR (``shutdown``) and wait up to ``eof_wait_s`` for the server's
    EOF. Reports ``ok`` (everything came back, unchanged) and ``mismatch_at``
    (stream offset of the first wrong byte, or None)."""
    cfg, res = run.cfg, run.result
    total, chunk = cfg["total_bytes"], cfg["chunk_bytes"]
    pattern = memoryview(bytes(i % _PERIOD
                               for i in range(_PERIOD + max(chunk, cfg["recv_bytes"]))))
    res.update(ok=False, mismatch_at=None)
    s = run.open()
    read_end: list[str] = []

    def read_echo():
        # Runs beside the sender: an echo server that only writes back what
        # it can send would deadlock a client that sends everything first.
        buf = memoryview(bytearray(cfg["recv_bytes"]))
        until = None
        try:
            while True:
                n = run.recv_into(s, buf, until)
                if n is None:
                    read_end.append("closed")
                    return
                if n == 0:
                    read_end.append("eof")
                    return
                if res["mismatch_at"] is None:
                    phase = run.received % _PERIOD
                    if buf[:n] != pattern[phase:phase + n]:
                        bad = next(i for i in range(n) if buf[i] != pattern[phase + i])
                        res["mismatch_at"] = run.received + bad
                run.count_in(n, time.monotonic())
                if run.received >= total and until is None:
                    until = time.monotonic() + cfg["eof_wait_s"]
        except _Ended as e:
            read_end.append(e.how)

    reader = threading.Thread(target=read_echo, name=f"peer-{run.name}-echo", daemon=True)
    reader.start()
    try:
        done = 0
        while done < total:
            n = min(chunk, total - done)
            phase = done % _PERIOD
            run.send_all(s, pattern[phase:phase + n], sample=False)
            done += n
        if cfg["shutdown"]:
            try:
                s.shutdown(socket.SHUT_WR)
            except OSError:
                pass
    except _Ended:
        pass     # the reader sees the same reset or deadline and says so
    finally:
        reader.join(max(0.0, run.deadline - time.monotonic()) + 2 * _TICK + 1.0)
    res["ended"] = read_end[0] if read_end else "timeout"
    res["ok"] = (res["mismatch_at"] is None and run.sent == total and run.received == total)


def _reset_peer(run: _Run) -> None:
    """Read exactly ``after_bytes`` (leaving the rest unread) and/or for
    ``after_s``, then close with SO_LINGER 0: an RST mid-stream. With neither,
    reset at once. Reports ``reset_sent`` and ``reset_after_s``."""
    cfg, res = run.cfg, run.result
    res.update(reset_sent=False, reset_after_s=None)
    after_bytes, after_s = cfg["after_bytes"], cfg["after_s"]
    buf = memoryview(bytearray(cfg["recv_bytes"]))
    s = run.open()
    until = run.t0 + after_s if after_s is not None else None
    try:
        while after_bytes is not None or after_s is not None:
            want = len(buf)
            if after_bytes is not None:
                want = min(want, after_bytes - run.received)
                if want <= 0:
                    break
            n = run.recv_into(s, buf[:want], until)
            if n is None:
                break
            if n == 0:
                res["ended"] = "eof"
                break
            run.count_in(n, time.monotonic())
    except _Ended as e:
        res["ended"] = e.how
    # Whatever happened, the plan is an RST: SO_LINGER 0, then close.
    res["reset_after_s"] = time.monotonic() - run.t0
    run.close(s, reset=True)
    res["reset_sent"] = True
    if res["ended"] is None:
        res["ended"] = "reset_sent"


def _reader(run: _Run) -> None:
    """The S3/S7/S8 ground truth: wait ``start_after_s``, then read everything
    until EOF, at most ``rate_Bps`` (a slow reader) if set. ``eof_after_s`` is
    from the first byte read to EOF (from the start of reading if nothing
    came); also ``first_byte_after_s`` and ``eof_after_connect_s`` from the
    connection, ``eof_at`` (monotonic, comparable with other processes' clocks
    on Linux) and ``rate_after_warmup_Bps`` as for the sink."""
    cfg, res = run.cfg, run.result
    res.update(eof_after_s=None, eof_after_connect_s=None, eof_at=None, first_byte_after_s=None,
               rate_after_warmup_Bps=None)
    buf = memoryview(bytearray(cfg["recv_bytes"]))
    s = run.open()
    t0 = run.t0
    bucket = _Bucket(cfg["rate_Bps"], cfg["recv_bytes"], t0) if cfg["rate_Bps"] else None
    try:
        run.sleep_until(t0 + cfg["start_after_s"])
        reading_from = time.monotonic()
        first = None
        while True:
            if bucket is not None and bucket.due > time.monotonic():
                run.sleep_until(bucket.due)
            n = run.recv_into(s, buf)
            now = time.monotonic()
            if n == 0:
                res.update(ended="eof", eof_at=now, eof_after_connect_s=now - t0,
                           eof_after_s=now - (first if first is not None else reading_from))
                return
            if first is None:
                first = now
                res["first_byte_after_s"] = now - t0
            run.count_in(n, now)
            if bucket is not None:
                bucket.charge(n, now)
    finally:
        res["rate_after_warmup_Bps"] = run.rate_in_after_warmup()


_ROLE_FUNCS = {"sink": _sink, "source": _source, "pipeline_client": _pipeline_client,
               "push_client": _push_client, "echo_client": _echo_client,
               "reset_peer": _reset_peer, "reader": _reader}
assert set(_ROLE_FUNCS) == set(ROLES)
