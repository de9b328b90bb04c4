"""The in-model test peers: sans-IO participants that count the truth.

``Peer`` owns one connection's end in a ``World`` and acts when its socket
changes or its timer fires; ``Source``, ``Sink`` (and its ``StalledReader`` and
``DelayedReader`` settings), ``PipeliningClient`` and ``ResettingPeer`` count
every byte and timestamp it with the virtual clock, independent of the program
under test. A peer hears its socket through the socket's ``_watcher`` hook
(called after every change, see ``SimSocket._changed``).
"""
from __future__ import annotations

import bisect
import math
import socket as _socket
import struct

__all__ = ["Peer", "Source", "Sink", "StalledReader", "DelayedReader", "PipeliningClient",
           "ResettingPeer", "queue_delays"]


class Peer:
    """A participant that owns one connection's end. ``listen(addr)`` accepts the
    first connection there; ``connect(addr)`` dials out. Acts when its socket
    changes or its timer fires; ``result()`` reports what it saw."""

    def __init__(self, world, name):
        self.world = world
        self.name = name
        self.sock = None
        self._lsock = None
        self._timer = None
        self._timer_at = math.inf
        self.t0 = None
        self.ended = None          # "eof" | "reset" | "closed" | "vanished" | ...
        self.ended_at = None

    def listen(self, address, backlog=1):
        s = self.world.socket()
        s.setblocking(False)
        s.bind(address)
        s.listen(backlog)
        s._watcher = self._on_listen
        self._lsock = s
        return self

    def address(self):
        return (self._lsock or self.sock).getsockname()

    def connect(self, address, at=0.0):
        def dial():
            s = self.world.socket()
            s.setblocking(False)
            s.connect_ex(address)
            self._attach(s)
        self.world.call_at(at, dial)
        return self

    def _on_listen(self):
        try:
            s, _ = self._lsock.accept()
        except BlockingIOError:
            return
        s.setblocking(False)
        self._lsock.close()
        self._lsock = None
        self._attach(s)

    def _attach(self, s):
        self.sock = s
        self.t0 = self.world.now
        s._watcher = self._act
        self._start()
        s._changed()

    def _start(self):
        pass

    def _wake_at(self, t):
        if self._timer is not None and self._timer_at <= t:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = t
        self._timer = self.world.call_at(t, self._on_timer)

    def _on_timer(self):
        self._timer = None
        self._timer_at = math.inf
        if self.sock is not None and self.ended is None:
            self._act()

    def _end(self, how):
        if self.ended is None:
            self.ended = how
            self.ended_at = self.world.now
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

    def result(self) -> dict:
        return {"name": self.name, "ended": self.ended, "ended_at_s": self.ended_at}


class _Bucket:
    """Rate limiter as a due time: each ``charge(n)`` moves it n/rate later;
    at most ``burst`` bytes of unused credit are kept."""
    __slots__ = ("per_byte", "burst_s", "due")

    def __init__(self, rate, burst, now):
        self.per_byte = 1.0 / rate
        self.burst_s = burst / rate
        self.due = now

    def charge(self, n, now):
        due = self.due
        if due < now - self.burst_s:
            due = now - self.burst_s
        self.due = due + n * self.per_byte


_PATTERN_PERIOD = 251     # a prime: a shifted or dropped byte never lines up again
_PATTERN = bytes(range(_PATTERN_PERIOD)) * (1 + (4 << 20) // _PATTERN_PERIOD)


def _pattern(offset, n):
    """The source's bytes ``offset .. offset+n`` (n up to 4 MiB)."""
    start = offset % _PATTERN_PERIOD
    return _PATTERN[start:start + n]


class Source(Peer):
    """Sends a byte pattern in ``frame_bytes`` frames at ``rate_Bps`` (None:
    as fast as the socket takes them) for ``duration_s`` and/or up to
    ``total_bytes``, then ``finish``es: "shutdown" (SHUT_WR), "close" or
    "reset". A frame goes whole before the next starts, so backpressure shows
    as a lower achieved rate; the bucket saves at most two frames of credit.
    ``frames`` records (first byte offset, virtual time) of every frame, which
    ``queue_delays`` uses as ground truth."""

    def __init__(self, world, *, rate_Bps=None, frame_bytes=32768, duration_s=None,
                 total_bytes=None, finish="shutdown", name="source"):
        super().__init__(world, name)
        if finish not in ("shutdown", "close", "reset"):
            raise ValueError(f"simnet: bad finish {finish!r}; valid: shutdown, close, reset")
        self.rate = rate_Bps
        self.frame_bytes = frame_bytes
        self.duration_s = duration_s
        self.total_bytes = total_bytes
        self.finish = finish
        self.sent = 0
        self.frame_offsets = []
        self.frame_times = []
        self._left = 0                 # bytes of the current frame still to send
        self._bucket = None

    def _start(self):
        if self.rate:
            self._bucket = _Bucket(self.rate, 2 * self.frame_bytes, self.world.now)

    def _act(self):
        if self.ended is not None or self.sock is None:
            return
        s = self.sock
        now = self.world.now
        while True:
            if self._left:
                try:
                    n = s.send(_pattern(self.sent, self._left))
                except BlockingIOError:
                    return
                except OSError as e:
                    self._end("reset" if isinstance(e, (ConnectionResetError, BrokenPipeError))
                              else f"error:{e.errno}")
                    return
                self.sent += n
                self._left -= n
                if self._left:
                    continue
            done_time = self.duration_s is not None and now >= self.t0 + self.duration_s
            done_bytes = self.total_bytes is not None and self.sent >= self.total_bytes
            if done_time or done_bytes:
                self._finish()
                return
            if self._bucket is not None and self._bucket.due > now:
                wake = self._bucket.due
                if self.duration_s is not None:
                    wake = min(wake, self.t0 + self.duration_s)
                self._wake_at(wake)
                return
            size = self.frame_bytes
            if self.total_bytes is not None:
                size = min(size, self.total_bytes - self.sent)
            self.frame_offsets.append(self.sent)
            self.frame_times.append(now)
            if self._bucket is not None:
                self._bucket.charge(size, now)
            self._left = size

    def _finish(self):
        s = self.sock
        try:
            if self.finish == "shutdown":
                s.shutdown(_socket.SHUT_WR)
            elif self.finish == "reset":
                s.setsockopt(_socket.SOL_SOCKET, _socket.SO_LINGER, struct.pack("ii", 1, 0))
                s.close()
            else:
                s.close()
        except OSError:
            pass
        self._end({"shutdown": "shutdown", "close": "closed", "reset": "reset_sent"}[self.finish])

    def result(self):
        r = super().result()
        span = (self.ended_at if self.ended_at is not None else self.world.now) - (self.t0 or 0)
        r.update(sent_bytes=self.sent, frames=len(self.frame_offsets),
                 rate_Bps=self.sent / span if span > 0 else None)
        return r


class Sink(Peer):
    """Reads and counts until EOF or reset: ``recv_bytes`` a read, at most
    ``rate_Bps`` (token bucket, one read of burst). ``start_after_s`` reads
    nothing until then; ``stall_at_s`` + ``stall_s`` pauses once. ``verify``
    checks every byte against the ``Source`` pattern. ``arrivals`` holds
    (time, total bytes read) after every read. ``close_with_reset`` ends with
    an RST."""

    def __init__(self, world, *, rate_Bps=None, recv_bytes=65536, start_after_s=0.0,
                 stall_at_s=None, stall_s=0.0, verify=True, close_with_reset=False,
                 name="sink"):
        super().__init__(world, name)
        self.rate = rate_Bps
        self.recv_bytes = recv_bytes
        self.start_after_s = start_after_s
        self.stall_at_s = stall_at_s
        self.stall_s = stall_s
        self.verify = verify
        self.close_with_reset = close_with_reset
        self.received = 0
        self.arrival_times = []
        self.arrival_totals = []
        self.corrupt_at = None
        self._bucket = None

    def _start(self):
        if self.rate:
            self._bucket = _Bucket(self.rate, self.recv_bytes, self.world.now)

    def _act(self):
        if self.ended is not None or self.sock is None:
            return
        s = self.sock
        while True:
            now = self.world.now
            # absolute times: the timer fires at exactly these, and now - t0
            # may round just below the interval
            start = self.t0 + self.start_after_s
            if now < start:
                if start != math.inf:
                    self._wake_at(start)
                return
            if self.stall_at_s is not None:
                stall_from = self.t0 + self.stall_at_s
                stall_to = stall_from + self.stall_s
                if stall_from <= now < stall_to:
                    self._wake_at(stall_to)
                    return
            if self._bucket is not None and self._bucket.due > now:
                self._wake_at(self._bucket.due)
                return
            try:
                data = s.recv(self.recv_bytes)
            except BlockingIOError:
                return
            except ConnectionResetError:
                self._end("reset")
                return
            except OSError as e:
                self._end(f"error:{e.errno}")
                return
            if not data:
                self._end("eof")
                if self.close_with_reset:
                    s.setsockopt(_socket.SOL_SOCKET, _socket.SO_LINGER, struct.pack("ii", 1, 0))
                s.close()
                return
            n = len(data)
            if self.verify and self.corrupt_at is None and data != _pattern(self.received, n):
                self.corrupt_at = self.received
            self.received += n
            self.arrival_times.append(now)
            self.arrival_totals.append(self.received)
            if self._bucket is not None:
                self._bucket.charge(n, now)

    def result(self):
        r = super().result()
        r.update(received_bytes=self.received, reads=len(self.arrival_times),
                 corrupt_at=self.corrupt_at)
        return r


class StalledReader(Sink):
    """Accepts or connects and never reads."""

    def __init__(self, world, name="stalled", **kw):
        super().__init__(world, start_after_s=math.inf, name=name, **kw)


class DelayedReader(Sink):
    """Reads nothing for ``delay_s``, then like a ``Sink``."""

    def __init__(self, world, delay_s, name="delayed", **kw):
        super().__init__(world, start_after_s=delay_s, name=name, **kw)


class PipeliningClient(Peer):
    """Sends ``count`` requests of ``request`` bytes back to back and, unless
    ``read``, never reads a response (Twisted 8868's flood). Counts requests the
    socket took whole and bytes of responses read."""

    def __init__(self, world, *, request=b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", count=1000,
                 read=False, name="pipeliner"):
        super().__init__(world, name)
        self.request = bytes(request)
        self.count = count
        self.read = read
        self.sent = 0
        self.requests_sent = 0
        self.received = 0
        self._out = memoryview(self.request * count)

    def _act(self):
        if self.ended is not None or self.sock is None:
            return
        s = self.sock
        while self.sent < len(self._out):
            try:
                n = s.send(self._out[self.sent:])
            except BlockingIOError:
                break
            except OSError:
                self._end("reset")
                return
            self.sent += n
        self.requests_sent = self.sent // len(self.request)
        while self.read:
            try:
                data = s.recv(65536)
            except BlockingIOError:
                break
            except OSError:
                self._end("reset")
                return
            if not data:
                self._end("eof")
                return
            self.received += len(data)

    def result(self):
        r = super().result()
        r.update(sent_bytes=self.sent, requests_sent=self.requests_sent,
                 received_bytes=self.received)
        return r


class ResettingPeer(Peer):
    """Sends ``send_bytes`` of pattern, reads whatever comes, and resets the
    connection (SO_LINGER 0, close: an RST) ``after_s`` after it starts or once
    it has read ``after_bytes``."""

    def __init__(self, world, *, after_s=None, after_bytes=None, send_bytes=0, name="resetter"):
        super().__init__(world, name)
        if after_s is None and after_bytes is None:
            raise ValueError("simnet: ResettingPeer needs after_s or after_bytes")
        self.after_s = after_s
        self.after_bytes = after_bytes
        self.send_bytes = send_bytes
        self.sent = 0
        self.received = 0

    def _act(self):
        if self.ended is not None or self.sock is None:
            return
        s = self.sock
        now = self.world.now
        if self.after_s is not None and now >= self.t0 + self.after_s:
            return self._reset()
        if self.after_s is not None:
            self._wake_at(self.t0 + self.after_s)
        while self.sent < self.send_bytes:
            try:
                n = s.send(_pattern(self.sent, min(65536, self.send_bytes - self.sent)))
            except BlockingIOError:
                break
            except OSError:
                self._end("reset")
                return
            self.sent += n
        while True:
            try:
                data = s.recv(65536)
            except BlockingIOError:
                break
            except OSError:
                self._end("reset")
                return
            if not data:
                break
            self.received += len(data)
            if self.after_bytes is not None and self.received >= self.after_bytes:
                return self._reset()

    def _reset(self):
        self.sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()
        self._end("reset_sent")

    def result(self):
        r = super().result()
        r.update(sent_bytes=self.sent, received_bytes=self.received)
        return r


def queue_delays(source, sink) -> list:
    """[(time, delay)] per sink read: how long the last byte of that read
    waited since its frame was stamped at the source."""
    offsets = source.frame_offsets
    times = source.frame_times
    out = []
    for t, total in zip(sink.arrival_times, sink.arrival_totals):
        i = bisect.bisect_right(offsets, total - 1) - 1
        if i >= 0:
            out.append((t, t - times[i]))
    return out
