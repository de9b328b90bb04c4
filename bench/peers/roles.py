"""The built-in peer roles, each one sans-IO core (``bench.peers.core.Role``).

Every role here is the only implementation of itself: the peer process runs it
on blocking sockets (``bench/peers/real.py``), a simulated cell runs it in the
world (``bench/peers/sim.py``). docs/peers.md describes what each one reports,
with units. ``BUILTIN`` lists them; ``bench/peers/spec.py`` registers them.
"""
from __future__ import annotations

import math

from bench.peers.core import (
    REQUIRED, TICK_S, Bucket, Duplex, Hold, Recv, Role, Send, Shutdown, Sleep,
)

__all__ = ["Sink", "Source", "Reader", "PipelineClient", "PushClient", "EchoClient",
           "ResetPeer", "BUILTIN", "ECHO_PERIOD"]

_FRAME_HEADER_BYTES = 24     # protocols.cores.FRAME_HEADER_BYTES, checked without importing it
ECHO_PERIOD = 251            # the echo pattern: byte i is i % 251 (a prime: never aligns)


def _window_max(times, values, t0) -> list[list]:
    """[[t, max value in the window], ...] from time-ordered samples: a window
    opens at the first sample after the previous one closed and lasts 50 ms."""
    out: list[list] = []
    end = -math.inf
    for t, v in zip(times, values):
        if t >= end:
            out.append([round(t - t0, 4), v])
            end = t + TICK_S
        elif v > out[-1][1]:
            out[-1][1] = v
    return out


class Sink(Role):
    """Read and count until EOF, reset or ``max_s``.

    Shaping, all optional: ``start_after_s`` (read nothing until then: a
    stalled reader), ``stall_at_s``+``stall_s`` (a pause at a time),
    ``pause_at_bytes``+``pause_s`` (a pause once that much has arrived),
    ``rate_Bps`` (token bucket, one ``recv_bytes`` read of burst). With
    ``frame_bytes`` the stream is decoded as frames no longer than that
    (``protocols.cores.SinkCore``; ``verify`` checks every payload byte).
    ``close_with_reset`` closes with an RST whatever the ending.

    Hazards: a pause starts between reads, so up to one ``recv_bytes`` read
    may land past ``pause_at_bytes``. Latency is measured when the read
    returns: a sink slower than its source shows the queue in front of it as
    latency, which is the point.
    """
    role = "sink"
    listens = True
    fields = {"rate_Bps": None, "recv_bytes": 65536, "frame_bytes": None, "verify": False,
              "start_after_s": 0.0, "stall_at_s": 0.0, "stall_s": 0.0,
              "pause_at_bytes": None, "pause_s": 0.0, "close_with_reset": False,
              "warmup_s": 1.0}

    @classmethod
    def check(cls, cfg):
        if cfg["pause_at_bytes"] is not None and not cfg["pause_s"] > 0:
            raise ValueError(f"role {cfg['name']!r}: pause_at_bytes needs pause_s > 0")

    def setup(self):
        self.result.update(eof_after_s=None, eof_at=None, rate_after_warmup_Bps=None, pauses=[])
        self.core = None
        if self.cfg["frame_bytes"] is not None:
            from protocols.cores import SinkCore
            self.core = SinkCore(self.cfg["frame_bytes"], verify=self.cfg["verify"])
        self._bucket = None
        self._pause = None            # (began, bytes before, why, until) of the pause under way
        self._opened = False

    def start(self, now):
        cfg = self.cfg
        if cfg["rate_Bps"]:
            self._bucket = Bucket(cfg["rate_Bps"], cfg["recv_bytes"], now)
        self._stall_from = now + cfg["stall_at_s"] if cfg["stall_s"] else math.inf
        self._stall_to = self._stall_from + cfg["stall_s"]
        self._pause_at = cfg["pause_at_bytes"]

    def _pause_until(self, until, why, now):
        self._pause = (now, self.received, why, until)
        return Sleep(until)

    def step(self, now):
        cfg = self.cfg
        if self._pause is not None:
            began, at, why, until = self._pause
            if now < until:
                return Sleep(until)
            self.result["pauses"].append([round(began - self.t0, 4), round(now - self.t0, 4),
                                          at, why])
            self._pause = None
        if not self._opened:
            self._opened = True
            if cfg["start_after_s"]:
                return self._pause_until(self.t0 + cfg["start_after_s"], "start_after_s", now)
        if self._stall_from <= now:
            self._stall_from = math.inf
            if now < self._stall_to:
                return self._pause_until(self._stall_to, "stall_s", now)
        if self._pause_at is not None and self.received >= self._pause_at:
            self._pause_at = None
            return self._pause_until(now + cfg["pause_s"], "pause_at_bytes", now)
        if self._bucket is not None and self._bucket.due > now:
            return Sleep(self._bucket.due)
        # A pending stall bounds the wait: a read blocked across the stall's
        # start would otherwise read in the middle of it.
        until = self._stall_from if self._stall_from < math.inf else None
        return Recv(cfg["recv_bytes"], until)

    def on_data(self, data, now):
        self.count_in(len(data), now)
        if self._bucket is not None:
            self._bucket.charge(len(data), now)
        core = self.core
        if core is not None and "frame_error" not in self.result:
            from protocols.cores import ProtocolError
            try:
                core.receive(data, now)
            except ProtocolError as e:
                # The decoder stays failed: from here on we count bytes only.
                # Frames completed in this chunk before the bad byte ride on
                # the error; SinkCore does not add them (guarded so that it
                # may start to without double counting).
                self.result["frame_error"] = str(e)
                if core.stats.count < core.decoder.frames_count:
                    for frame in e.partial:
                        core.stats.add(frame, now)

    def on_eof(self, now):
        self.result.update(eof_at=now, eof_after_s=now - self.t0)
        if self.core is not None and "frame_error" not in self.result:
            from protocols.cores import ProtocolError
            try:
                self.core.eof()
            except ProtocolError as e:
                self.result["frame_error"] = str(e)
        self.end("eof")

    def end(self, how, reset=False):
        super().end(how, reset or self.cfg["close_with_reset"])

    def finish(self, now):
        self.result["rate_after_warmup_Bps"] = self.rate_in_after_warmup()
        if self.core is not None and self.t0 is not None:
            stats = self.core.stats
            self.result.update(stats.summary())
            self.result["latency_series"] = _window_max(stats.latency_times, stats.latencies,
                                                        self.t0)


class Reader(Role):
    """The S3/S7/S8 ground truth: wait ``start_after_s``, then read everything
    until EOF, at most ``rate_Bps`` (a slow reader) if set."""
    role = "reader"
    listens = True
    fields = {"start_after_s": 0.0, "recv_bytes": 65536, "rate_Bps": None, "warmup_s": 1.0}

    def setup(self):
        self.result.update(eof_after_s=None, eof_after_connect_s=None, eof_at=None,
                           first_byte_after_s=None, rate_after_warmup_Bps=None)
        self._bucket = None
        self._reading_from = None
        self._first = None

    def start(self, now):
        if self.cfg["rate_Bps"]:
            self._bucket = Bucket(self.cfg["rate_Bps"], self.cfg["recv_bytes"], now)

    def step(self, now):
        if self._reading_from is None:
            start = self.t0 + self.cfg["start_after_s"]
            if now < start:
                return Sleep(start)
            self._reading_from = now
        if self._bucket is not None and self._bucket.due > now:
            return Sleep(self._bucket.due)
        return Recv(self.cfg["recv_bytes"])

    def on_data(self, data, now):
        if self._first is None:
            self._first = now
            self.result["first_byte_after_s"] = now - self.t0
        self.count_in(len(data), now)
        if self._bucket is not None:
            self._bucket.charge(len(data), now)

    def on_eof(self, now):
        since = self._first if self._first is not None else self._reading_from
        self.result.update(eof_at=now, eof_after_connect_s=now - self.t0,
                           eof_after_s=now - since)
        self.end("eof")

    def finish(self, now):
        self.result["rate_after_warmup_Bps"] = self.rate_in_after_warmup()


class Source(Role):
    """Send frames (``protocols.cores.SourceCore``: numbered from 0, stamped
    with the time the frame is made, just before its first byte is sent) at
    ``rate_Bps`` for ``duration_s`` and/or up to ``total_bytes`` (a shorter
    last frame), then ``finish``: "close", "reset" (RST), or "shutdown"
    (SHUT_WR, then wait up to ``eof_wait_s`` for the other side's EOF).

    A frame goes whole before the next is made: backpressure shows as a lower
    achieved rate and as ``send_blocked_s``, never as a burst afterwards (the
    bucket saves at most two frames of credit). A frame started before
    ``duration_s`` is finished, so the peer never sees a truncated frame
    unless ``max_s`` or a reset cuts it.
    """
    role = "source"
    tracked = "sent"
    fields = {"rate_Bps": None, "frame_bytes": 32768, "duration_s": None, "total_bytes": None,
              "finish": "close", "eof_wait_s": 5.0, "warmup_s": 1.0, "recv_bytes": 65536}

    @classmethod
    def check(cls, cfg):
        name = cfg["name"]
        if cfg["duration_s"] is None and cfg["total_bytes"] is None:
            raise ValueError(f"role {name!r}: a source needs duration_s or total_bytes")
        total, frame = cfg["total_bytes"], cfg["frame_bytes"]
        if frame is None:
            raise ValueError(f"role {name!r}: a source needs frame_bytes")
        if total is not None and 0 < total % frame < _FRAME_HEADER_BYTES:
            raise ValueError(f"role {name!r}: total_bytes={total} would end with a "
                             f"{total % frame}-byte frame, shorter than the "
                             f"{_FRAME_HEADER_BYTES}-byte frame header")

    def setup(self):
        from protocols.cores import SourceCore
        cfg = self.cfg
        self.result.update(finish=cfg["finish"], frames_sent=0, rate_Bps=None,
                           rate_after_warmup_Bps=None, send_blocked_s=0.0, sending_s=None,
                           peer_eof=None)
        self.core = SourceCore(cfg["frame_bytes"], cfg["total_bytes"], cfg["rate_Bps"])
        self._out = None              # the rest of the frame being sent
        self._out_began = 0.0
        self._blocked = 0.0
        self._warm_mark = self._last_done = None
        self._sending = True
        self._eof_until = None        # waiting for the peer's EOF until then

    def start(self, now):
        dur = self.cfg["duration_s"]
        self._stop_at = now + dur if dur is not None else math.inf

    def step(self, now):
        if self._eof_until is not None:
            if now >= self._eof_until:
                self.result["peer_eof"] = False
                self.end("timeout")
                return self.next(now)
            return Recv(self.cfg["recv_bytes"], self._eof_until)
        if self._out:
            return Send(self._out)
        core = self.core
        if not core.done and now < self._stop_at:
            frame = core.next_chunk(now)
            if frame is None:
                return Sleep(min(now + core.wait_s(now), self._stop_at))
            self._out = memoryview(frame)
            self._out_began = now
            return Send(self._out)
        self._sending_over(now)
        finish = self.cfg["finish"]
        if finish == "close":
            self.end("closed")
        elif finish == "reset":
            self.end("reset_sent", reset=True)
        else:
            # Then wait for the other side's EOF, discarding (but counting) what comes.
            self._eof_until = now + self.cfg["eof_wait_s"]
            return Shutdown()
        return self.next(now)

    def on_sent(self, n, now):
        self.sent += n
        self._out = self._out[n:]
        if not self._out:
            # Rate after warm-up: between two send *completions* (cumulative
            # bytes the OS had taken by then), so whole frame intervals are
            # counted, never one frame more than the span it took.
            self._blocked += now - self._out_began
            self._last_done = (now, self.sent)
            if self._warm_mark is None and now >= self.t0 + self.cfg["warmup_s"]:
                self._warm_mark = self._last_done
            self.sample(now)

    def on_data(self, data, now):
        self.received += len(data)

    def on_eof(self, now):
        self.result["peer_eof"] = True
        self.end("eof")

    def _sending_over(self, now):
        if not self._sending or self.t0 is None:
            return
        self._sending = False
        res = self.result
        res["frames_sent"] = self.core.frames_sent
        res["send_blocked_s"] = self._blocked
        res["sending_s"] = now - self.t0
        if now > self.t0:
            res["rate_Bps"] = self.sent / (now - self.t0)
        w, d = self._warm_mark, self._last_done
        if w is not None and d[0] > w[0]:
            res["rate_after_warmup_Bps"] = (d[1] - w[1]) / (d[0] - w[0])

    def finish(self, now):
        self._sending_over(now)


class PipelineClient(Role):
    """Send ``count`` requests b"REQ i\\n" back to back (one send each), never
    read a byte, hold the connection ``hold_s`` (ending early if the server
    closes or resets), then close -- with the responses unread, so the close
    is an RST, as for the real clients of Twisted ticket 8868."""
    role = "pipeline_client"
    tracked = "sent"
    wants_unread = True
    fields = {"count": REQUIRED, "hold_s": 1.0}

    def setup(self):
        self.result.update(requests_sent=0, unread_bytes=None)
        self._out = None
        self._hold_until = None

    def step(self, now):
        if self._out:
            return Send(self._out)
        done = self.result["requests_sent"]
        if done < self.cfg["count"]:
            self._out = memoryview(b"REQ %d\n" % done)
            return Send(self._out)
        if self._hold_until is None:
            self._hold_until = now + self.cfg["hold_s"]
        if now >= self._hold_until:
            self.end("closed")
            return self.next(now)
        return Hold(self._hold_until)

    def on_sent(self, n, now):
        self.sent += n
        self._out = self._out[n:]
        if not self._out:
            self.result["requests_sent"] += 1


class PushClient(Role):
    """A push subscriber connected for ``duration_s``: ``mode="healthy"`` reads
    everything as fast as it comes, ``"stalled"`` never reads. Ends early on
    the server's EOF or reset."""
    role = "push_client"
    fields = {"mode": REQUIRED, "duration_s": REQUIRED, "recv_bytes": 65536}

    def setup(self):
        self.result.update(mode=self.cfg["mode"], unread_bytes=None)
        self.wants_unread = self.cfg["mode"] == "stalled"

    def step(self, now):
        until = self.t0 + self.cfg["duration_s"]
        if now >= until:
            self.end("closed")
            return self.next(now)
        if self.cfg["mode"] == "stalled":
            return Hold(until)
        return Recv(self.cfg["recv_bytes"], until)


def _echo_pattern(size: int) -> bytes:
    """``size`` bytes of the echo pattern (byte i is i % ECHO_PERIOD), made by
    repeating one period: a byte at a time took milliseconds, more than a
    short simulated cell's whole run."""
    return (bytes(range(ECHO_PERIOD)) * (size // ECHO_PERIOD + 1))[:size]


class EchoClient(Role):
    """Send ``total_bytes`` of a deterministic pattern (byte i is i % 251) in
    ``chunk_bytes`` pieces while reading the echo and checking it byte for
    byte; then SHUT_WR (``shutdown``) and, once every byte came back, wait up
    to ``eof_wait_s`` for the server's EOF."""
    role = "echo_client"
    fields = {"total_bytes": REQUIRED, "chunk_bytes": 16384, "recv_bytes": 65536,
              "shutdown": True, "eof_wait_s": 0.5}

    def setup(self):
        cfg = self.cfg
        size = ECHO_PERIOD + max(cfg["chunk_bytes"], cfg["recv_bytes"])
        self.pattern = memoryview(_echo_pattern(size))
        self.result.update(ok=False, mismatch_at=None)
        self._out = None
        self._shut = False
        self._eof_by = None

    def step(self, now):
        cfg = self.cfg
        if self._eof_by is not None and now >= self._eof_by:
            self.end("closed")
            return self.next(now)
        total = cfg["total_bytes"]
        if self.sent < total:
            if not self._out:
                phase = self.sent % ECHO_PERIOD
                n = min(cfg["chunk_bytes"], total - self.sent)
                self._out = self.pattern[phase:phase + n]
            return Duplex(self._out, cfg["recv_bytes"])
        if cfg["shutdown"] and not self._shut:
            self._shut = True
            return Shutdown()
        return Recv(cfg["recv_bytes"], self._eof_by)

    def on_sent(self, n, now):
        self.sent += n
        self._out = self._out[n:]

    def on_data(self, data, now):
        if self.result["mismatch_at"] is None:
            phase = self.received % ECHO_PERIOD
            want = self.pattern[phase:phase + len(data)]
            if data != want:
                bad = next(i for i in range(len(data)) if data[i] != want[i])
                self.result["mismatch_at"] = self.received + bad
        self.count_in(len(data), now)
        if self.received >= self.cfg["total_bytes"] and self._eof_by is None:
            self._eof_by = now + self.cfg["eof_wait_s"]

    def on_shutdown_failed(self, now):
        pass       # the reads see the same reset and say so

    def finish(self, now):
        total = self.cfg["total_bytes"]
        self.result["ok"] = (self.result["mismatch_at"] is None and self.sent == total
                             and self.received == total)


class ResetPeer(Role):
    """Read exactly ``after_bytes`` (leaving the rest unread) and/or for
    ``after_s``, then close with SO_LINGER 0: an RST mid-stream. With neither,
    reset at once. However the reading ends (EOF, the peer's reset, ``max_s``)
    the plan is an RST, and ``reset_after_s`` says when it was sent."""
    role = "reset_peer"
    fields = {"after_bytes": None, "after_s": None, "recv_bytes": 65536}

    def setup(self):
        self.result.update(reset_sent=False, reset_after_s=None)

    def _reset(self, now):
        self.result.update(reset_after_s=now - self.t0, reset_sent=True)
        self.end("reset_sent", reset=True)
        return self.next(now)

    def step(self, now):
        after_bytes, after_s = self.cfg["after_bytes"], self.cfg["after_s"]
        if after_bytes is None and after_s is None:
            return self._reset(now)
        until = self.t0 + after_s if after_s is not None else None
        if until is not None and now >= until:
            return self._reset(now)
        want = self.cfg["recv_bytes"]
        if after_bytes is not None:
            want = min(want, after_bytes - self.received)
            if want <= 0:
                return self._reset(now)
        return Recv(want, until)

    def _ended_early(self, how, now):
        if self.t0 is None:
            self.end(how)
            return
        if self.result["ended"] is None:
            self.result["ended"] = how
        self._reset(now)

    def on_eof(self, now):
        self._ended_early("eof", now)

    def on_reset(self, now):
        self._ended_early("reset", now)

    def on_timeout(self, now):
        self._ended_early("timeout", now)


BUILTIN = (Sink, Source, Reader, PipelineClient, PushClient, EchoClient, ResetPeer)
