"""The in-world peers of a simulated cell (``looplab run --net sim``).

Each ``SimRole`` plays one ``bench.peers`` role spec (sink, source, reader,
pipeline_client, push_client, echo_client, reset_peer) as a ``kernels.simnet.Peer`` and reports
in the real role's vocabulary, with virtual times where the real ones report
``time.monotonic()``. ``make_role(cell, cfg)`` builds one for a
``bench.simcells.SimCell``; the cell and world plumbing stay in ``bench.simcells``.
"""
from __future__ import annotations

import math
import socket as _socket
import struct

from kernels import simnet

__all__ = ["SimRole", "make_role", "simnet_bucket"]

_TICK = 0.05                        # the real peers' series period
_READ_OR_ERR = simnet.READ | simnet._ERR


class SimRole(simnet.Peer):
    """One ``bench.peers`` role spec played in the world, reporting what the
    real role reports. Subclasses implement ``_act``."""

    tracked = "received"

    def __init__(self, cell, cfg: dict):
        super().__init__(cell.world, cfg["name"])
        self.cell = cell
        self.cfg = cfg
        self.began = cell.world.now
        self.sent = 0
        self.received = 0
        self.series: list = []
        self._next_sample = 0.0
        self._warm = None
        self._last_in = None
        self.res: dict = {"name": cfg["name"], "role": cfg["role"], "ended": None,
                          "connected": False}
        cell.roles[cfg["name"]] = self
        self._deadline = cell.world.call_at(self.began + cfg["max_s"], self._timeout)
        self._idle_gen = -1
        self._rest_until = -1.0       # waiting for time alone until then (see _poked)

    # the role's life -----------------------------------------------------------

    def _attach(self, s):
        size = self.cfg.get("sockbuf")
        if size:
            s.setsockopt(_socket.SOL_SOCKET, _socket.SO_SNDBUF, size)
            s.setsockopt(_socket.SOL_SOCKET, _socket.SO_RCVBUF, size)
        now = self.world.now
        self._next_sample = now
        self.res.update(connected=True, connected_at=now, connected_after_s=now - self.began,
                        sockbuf_effective=[s.sndbuf, s.rcvbuf])
        super()._attach(s)
        s._watcher = self._poked

    def _poked(self):
        """The socket changed (the world's poke). Two pokes would find nothing
        to do, and are not passed on to ``_act``:

        * A role's ``_act`` runs until it has nothing to do right now, and its
          own reads and sends poke it again at once: if nothing in the world
          changed since it finished (``world._gen``, bumped by every change of
          readiness), that poke finds the same nothing at the same instant.
        * A role resting until ``_rest_until`` -- waiting for its rate bucket,
          a stall or its start, with a timer set for then -- ignores its
          socket until then: ``_act`` would only set the same timer again."""
        world = self.world
        if world.now < self._rest_until:
            return
        if world._gen != self._idle_gen:
            self._act()
            self._idle_gen = world._gen

    def _on_timer(self):
        super()._on_timer()
        self._idle_gen = self.world._gen

    def listen(self, address, backlog=1):
        super().listen(address, backlog)
        size = self.cfg.get("sockbuf")
        if size:     # accepted sockets inherit the listener's buffers
            self._lsock.setsockopt(_socket.SOL_SOCKET, _socket.SO_SNDBUF, size)
            self._lsock.setsockopt(_socket.SOL_SOCKET, _socket.SO_RCVBUF, size)
        self.res["listen"] = list(address)
        return self

    def _timeout(self):
        if self.ended is None:
            self._finish("timeout")

    def _finish(self, how, reset=False):
        """End the role: close its sockets (an RST with ``reset``) and report."""
        for s in (self.sock, self._lsock):
            if s is not None:
                try:
                    if reset:
                        s.setsockopt(_socket.SOL_SOCKET, _socket.SO_LINGER, struct.pack("ii", 1, 0))
                    s.close()
                except OSError:
                    pass
        self._lsock = None
        if self.res["ended"] is None:
            self.res["ended"] = how
        self._end(how)

    def _end(self, how):
        first = self.ended is None
        super()._end(how)
        if first:
            self._deadline.cancel()
            if self.sock is not None:
                self.sock._watcher = None
            self.cell.role_ended(self)

    # counting ----------------------------------------------------------------

    def sample(self, now, force=False):
        if self.t0 is not None and (now >= self._next_sample or force):
            self.series.append([round(now - self.t0, 4), getattr(self, self.tracked)])
            self._next_sample = now + _TICK

    def count_in(self, n, now):
        self.received += n
        if self._warm is None and now - self.t0 >= self.cfg.get("warmup_s", math.inf):
            self._warm = (now, self.received)
        self._last_in = (now, self.received)
        self.sample(now)

    def rate_in_after_warmup(self):
        if self._warm is None or self._last_in[0] <= self._warm[0]:
            return None
        return (self._last_in[1] - self._warm[1]) / (self._last_in[0] - self._warm[0])

    def result(self) -> dict:
        res = dict(self.res)
        now = self.ended_at if self.ended_at is not None else self.world.now
        if self.t0 is not None:
            self.sample(now, force=True)
        if res["ended"] is None:
            res["ended"] = "closed"
        res.update(sent_bytes=self.sent, received_bytes=self.received, ran_s=now - self.began,
                   series=self.series)
        return res

    # helpers for subclasses ---------------------------------------------------

    def _send(self, data):
        """``send`` with the real role's error mapping: the bytes taken, 0 when
        the socket is full, None once an error ended the role."""
        try:
            return self.sock.send(data)
        except BlockingIOError:
            return 0
        except (ConnectionResetError, BrokenPipeError):
            self._finish("reset")
        except OSError as e:
            self.res["error"] = f"{e.strerror} [errno {e.errno}]"
            self._finish("error")
        return None

    def _recv(self, n, ask=True):
        """``recv`` with the real role's error mapping: data, b"" at EOF, None
        when nothing is there; a reset ends the role. ``ask``: look at the
        socket's readiness first instead of letting recv raise
        BlockingIOError -- a role reads until that answer after every
        delivery, and the exception cost more than the read. (Not worth it
        for the first read after a delivery, which finds data.)"""
        sock = self.sock
        # _raw_events, not _events: asking must not count as waiting (wake_s)
        if ask and not sock._raw_events() & _READ_OR_ERR:
            return None
        try:
            return sock.recv(n)
        except BlockingIOError:
            return None
        except (ConnectionResetError, BrokenPipeError):
            self._finish("reset")
            return None
        except OSError as e:
            self.res["error"] = f"{e.strerror} [errno {e.errno}]"
            self._finish("error")
            return None


class _Reading(SimRole):
    """sink, reader and a healthy push_client: read and count until EOF, a
    reset, ``until`` (push_client's duration) or ``max_s``."""

    def __init__(self, cell, cfg, until_s=None):
        super().__init__(cell, cfg)
        self.until_s = until_s
        self._bucket = None
        self.first = None
        self.reading_from = None
        self.latencies = []           # (t, latency) of completed frames
        self._frame_i = 0
        self._stall_from = math.inf
        self._stall_to = math.inf

    def _start(self):
        cfg, now = self.cfg, self.world.now
        if cfg.get("rate_Bps"):
            self._bucket = simnet_bucket(cfg["rate_Bps"], cfg["recv_bytes"], now)
        if cfg.get("stall_s"):
            self._stall_from = now + cfg["stall_at_s"]
            self._stall_to = self._stall_from + cfg["stall_s"]
        if self.until_s is not None:
            self.world.call_at(now + self.until_s, self._until)

    def _until(self):
        if self.ended is None:
            self._finish("closed")

    def _act(self):
        if self.ended is not None or self.sock is None:
            return
        cfg = self.cfg
        start = self.t0 + (cfg.get("start_after_s") or 0.0)
        recv_bytes = cfg["recv_bytes"]
        framed = cfg.get("frame_bytes")
        now = self.world.now          # no time passes inside a role's turn
        ask = False
        self._rest_until = -1.0
        while self.ended is None:
            if now < start:
                self._wake_at(start)
                self._rest_until = start
                return
            if self.reading_from is None:
                self.reading_from = now
            if self._stall_from <= now < self._stall_to:
                self._wake_at(self._stall_to)
                self._rest_until = self._stall_to
                return
            if self._bucket is not None and self._bucket.due > now:
                due = self._bucket.due
                self._wake_at(due)
                # a stall that begins first changes what the next turn does
                self._rest_until = due if self._stall_from <= now else min(due, self._stall_from)
                return
            data = self._recv(recv_bytes, ask)
            ask = True
            if data is None:
                return
            if not data:
                self._eof(now)
                return
            n = len(data)
            if self.first is None:
                self.first = now
                self.res["first_byte_after_s"] = now - self.t0
            before = self.received
            self.count_in(n, now)
            if self._bucket is not None:
                self._bucket.charge(n, now)
            if framed and self.cell.frames is not None:
                self._frames_done(before, self.received, now)

    def _frames_done(self, before, total, now):
        """Latency of every frame whose last byte arrived in this read (the
        source stamped each frame when it began sending it)."""
        offsets, times = self.cell.frames
        i = self._frame_i
        while i + 1 < len(offsets) and offsets[i + 1] <= total:
            self.latencies.append((now, now - times[i]))
            i += 1
        self._frame_i = i

    def _eof(self, now):
        role = self.cfg["role"]
        self.res.update(eof_at=now, eof_after_s=now - self.t0)
        if role == "reader":
            self.res.update(eof_after_connect_s=now - self.t0,
                            eof_after_s=now - (self.first if self.first is not None
                                               else self.reading_from))
        self._finish("eof", reset=bool(self.cfg.get("close_with_reset")))

    def result(self):
        res = super().result()
        role = self.cfg["role"]
        if role in ("sink", "reader"):
            res.setdefault("eof_at", None)
            res.setdefault("eof_after_s", None)
            res["rate_after_warmup_Bps"] = self.rate_in_after_warmup()
        if role == "reader":
            res.setdefault("eof_after_connect_s", None)
            res.setdefault("first_byte_after_s", None)
        if role == "push_client":
            res["mode"] = "healthy"
        if self.latencies:
            lat = [v for _, v in self.latencies]
            res.update(frames_count=len(lat), max_latency_s=max(lat),
                       p50_latency_s=sorted(lat)[len(lat) // 2],
                       latency_series=_window_max(self.latencies, self.t0))
        elif role == "sink" and self.cfg.get("frame_bytes"):
            res.update(frames_count=0, max_latency_s=None, latency_series=[])
        return res


_PATTERN_VIEW = memoryview(simnet._PATTERN)


def _pattern(offset, n):
    """``simnet._pattern`` as a view: the socket copies what it takes, and a
    frame the socket takes in parts is not copied again for every part."""
    start = offset % simnet._PATTERN_PERIOD
    return _PATTERN_VIEW[start:start + n]


def simnet_bucket(rate, burst, now):
    return simnet._Bucket(rate, burst, now)


def _window_max(samples, t0) -> list:
    out: list = []
    end = -math.inf
    for t, v in samples:
        if t >= end:
            out.append([round(t - t0, 4), v])
            end = t + _TICK
        elif v > out[-1][1]:
            out[-1][1] = v
    return out


class _Source(SimRole):
    """source: frames of ``frame_bytes`` at ``rate_Bps`` for ``duration_s`` and/or
    ``total_bytes``, then ``finish`` (close, reset, or shutdown)."""

    tracked = "sent"

    def __init__(self, cell, cfg):
        super().__init__(cell, cfg)
        self.offsets, self.times = [], []
        if cell.frames is None:
            cell.frames = (self.offsets, self.times)
        self._left = 0
        self._bucket = None
        self._warm_mark = None
        self._last_done = None
        self.frames_sent = 0
        self._eof_wait = False

    def _start(self):
        cfg = self.cfg
        if cfg.get("rate_Bps"):
            self._bucket = simnet_bucket(cfg["rate_Bps"], 2 * cfg["frame_bytes"], self.world.now)

    def _eof_timeout(self):
        if self.ended is None:
            self.res["peer_eof"] = False
            self._finish("timeout")

    def _act(self):
        if self.ended is not None or self.sock is None:
            return
        cfg = self.cfg
        now = self.world.now
        self._rest_until = -1.0
        while self._eof_wait and self.ended is None:
            data = self._recv(cfg["recv_bytes"])
            if data is None:
                return
            if not data:
                self.res["peer_eof"] = True
                return self._finish("eof")
            self.received += len(data)
        while self.ended is None:
            if self._left:
                n = self._send(_pattern(self.sent, min(self._left, 4 << 20)))
                if not n:
                    return
                self.sent += n
                self._left -= n
                if self._left:
                    continue
                self._last_done = (now, self.sent)
                if self._warm_mark is None and now >= self.t0 + cfg["warmup_s"]:
                    self._warm_mark = self._last_done
                self.sample(now)
            dur, total = cfg.get("duration_s"), cfg.get("total_bytes")
            if (dur is not None and now >= self.t0 + dur) or (total is not None and self.sent >= total):
                return self._done()
            if self._bucket is not None and self._bucket.due > now:
                wake = self._bucket.due
                if dur is not None:
                    wake = min(wake, self.t0 + dur)
                self._wake_at(wake)
                self._rest_until = wake
                return
            size = cfg["frame_bytes"]
            if total is not None:
                size = min(size, total - self.sent)
            self.offsets.append(self.sent)
            self.times.append(now)
            self.frames_sent += 1
            if self._bucket is not None:
                self._bucket.charge(size, now)
            self._left = size

    def _done(self):
        finish = self.cfg["finish"]
        now = self.world.now
        self.res["sending_s"] = now - self.t0
        if finish == "shutdown":
            try:
                self.sock.shutdown(_socket.SHUT_WR)
            except OSError:
                return self._finish("reset")
            # then wait up to eof_wait_s for the other side's EOF, counting what comes
            self._eof_wait = True
            self.world.call_at(now + self.cfg["eof_wait_s"], self._eof_timeout)
            return self._act()
        self._finish("reset_sent" if finish == "reset" else "closed", reset=finish == "reset")

    def result(self):
        res = super().result()
        span = (self.ended_at or self.world.now) - (self.t0 or 0)
        res.setdefault("peer_eof", None)
        res.update(finish=self.cfg["finish"], frames_sent=self.frames_sent,
                   rate_Bps=self.sent / span if self.t0 is not None and span > 0 else None,
                   rate_after_warmup_Bps=None)
        w, d = self._warm_mark, self._last_done
        if w is not None and d[0] > w[0]:
            res["rate_after_warmup_Bps"] = (d[1] - w[1]) / (d[0] - w[0])
        return res


class _Holding(SimRole):
    """pipeline_client (send ``count`` requests, never read, hold ``hold_s``) and
    a stalled push_client (never read, hold ``duration_s``): then close, which
    is an RST when responses sit unread. Ends early if the server ends first."""

    tracked = "sent"

    def __init__(self, cell, cfg, hold_s, requests=0):
        super().__init__(cell, cfg)
        self.hold_s = hold_s
        self.out = b"".join(b"REQ %d\n" % i for i in range(requests))
        self.requests = requests
        self.hold_until = None

    def _act(self):
        if self.ended is not None or self.sock is None:
            return
        s = self.sock
        while self.sent < len(self.out):
            try:
                n = s.send(self.out[self.sent:])
            except BlockingIOError:
                return
            except OSError:
                return self._finish("reset")
            self.sent += n
        if self.hold_until is None:
            self.hold_until = self.world.now + self.hold_s
            self.world.call_at(self.hold_until, self._held)
        if s.peer_reset:
            self._finish("reset")
        elif s.peer_eof:
            self._finish("eof")

    def _held(self):
        if self.ended is None:
            self._finish("closed")

    def _finish(self, how, reset=False):
        if self.sock is not None and self.res.get("unread_bytes") is None:
            self.res["unread_bytes"] = self.sock.unread_bytes
        super()._finish(how, reset)

    def result(self):
        res = super().result()
        res.setdefault("unread_bytes", None)
        if self.cfg["role"] == "pipeline_client":
            res["requests_sent"] = _requests_in(self.out, self.sent)
        else:
            res["mode"] = "stalled"
        return res


def _requests_in(out: bytes, sent: int) -> int:
    return out.count(b"\n", 0, sent)


class _Resetting(SimRole):
    """reset_peer: read until ``after_bytes`` or ``after_s``, then reset."""

    def _start(self):
        if self.cfg.get("after_s") is not None:
            self.world.call_at(self.world.now + self.cfg["after_s"], self._reset)

    def _reset(self):
        if self.ended is None:
            self._finish("reset_sent", reset=True)

    def _act(self):
        while self.ended is None and self.sock is not None:
            data = self._recv(self.cfg["recv_bytes"])
            if data is None:
                return
            if not data:
                return self._finish("eof")
            self.count_in(len(data), self.world.now)
            after = self.cfg.get("after_bytes")
            if after is not None and self.received >= after:
                return self._reset()


_ECHO_PERIOD = 251    # the real echo_client's pattern: byte i of the stream is i % 251


class _Echoing(SimRole):
    """echo_client: send ``total_bytes`` of the echo pattern in ``chunk_bytes``
    pieces while reading the echo back and checking it byte for byte; then SHUT_WR
    (``shutdown``) and wait up to ``eof_wait_s`` after the last byte for the
    server's EOF. Reports ``ok`` and ``mismatch_at`` as the real role does."""

    def __init__(self, cell, cfg):
        super().__init__(cell, cfg)
        size = _ECHO_PERIOD + max(cfg["chunk_bytes"], cfg["recv_bytes"])
        self.pattern = memoryview(bytes(i % _ECHO_PERIOD for i in range(size)))
        self.res.update(ok=False, mismatch_at=None)
        self._shut = False
        self._eof_by = None

    def _act(self):
        if self.ended is not None or self.sock is None:
            return
        cfg, s = self.cfg, self.sock
        total = cfg["total_bytes"]
        while self.sent < total:
            phase = self.sent % _ECHO_PERIOD
            n = self._send(self.pattern[phase:phase + min(cfg["chunk_bytes"], total - self.sent)])
            if n is None:
                return
            if not n:
                break
            self.sent += n
        if self.sent >= total and cfg["shutdown"] and not self._shut:
            self._shut = True
            try:
                s.shutdown(_socket.SHUT_WR)
            except OSError:
                pass
        while self.ended is None:
            data = self._recv(cfg["recv_bytes"])
            if data is None:
                return
            if not data:
                return self._finish("eof")
            now = self.world.now
            if self.res["mismatch_at"] is None:
                phase = self.received % _ECHO_PERIOD
                if data != self.pattern[phase:phase + len(data)]:
                    bad = next(i for i in range(len(data)) if data[i] != self.pattern[phase + i])
                    self.res["mismatch_at"] = self.received + bad
            self.count_in(len(data), now)
            if self.received >= total and self._eof_by is None:
                self._eof_by = self.world.call_at(now + cfg["eof_wait_s"], self._no_eof)

    def _no_eof(self):
        if self.ended is None:
            self._finish("closed")

    def result(self):
        res = super().result()
        total = self.cfg["total_bytes"]
        res["ok"] = res["mismatch_at"] is None and self.sent == total and self.received == total
        return res


def make_role(cell, cfg: dict) -> SimRole:
    kind = cfg["role"]
    if kind in ("sink", "reader"):
        return _Reading(cell, cfg)
    if kind == "source":
        return _Source(cell, cfg)
    if kind == "pipeline_client":
        return _Holding(cell, cfg, cfg["hold_s"], requests=cfg["count"])
    if kind == "push_client":
        if cfg["mode"] == "stalled":
            return _Holding(cell, cfg, cfg["duration_s"])
        return _Reading(cell, cfg, until_s=cfg["duration_s"])
    if kind == "reset_peer":
        return _Resetting(cell, cfg)
    if kind == "echo_client":
        return _Echoing(cell, cfg)
    raise ValueError(f"the simulated network has no {kind!r} peer yet")
