"""Sans-IO protocol cores: every looplab app as a pure state machine.

A *core* is the part of a protocol that decides; a *driver* is the part that
does. Cores take bytes and events in and give actions (or bytes) back. They
never touch a socket, never read a clock, never import a kernel: the time, when
a core needs it, arrives as the float argument ``now``. That buys three things:

* one core runs unchanged under every driver -- callback, stream and task ports,
  on our kernels and on asyncio, uvloop, trio and curio -- so when two runtimes
  behave differently the difference is in the kernel and the driver, never in
  the protocol logic;
* a core is tested exhaustively without I/O (hypothesis feeds it any chunking of
  any bytes, a simulated clock replaces sleeping);
* the peers (``bench/peers/``, blocking sockets in another process) use the
  same framing code to check what the kernel under test delivered.

The contract every core keeps, in the style of h11:

* **Chunking never matters.** The same byte stream split anywhere gives the same
  outcome: the same frames, responses, relayed bytes and the same error.
* **Bad peer input raises ProtocolError** (a ValueError) whose message says what
  was wrong and at which byte offset of the stream. A core that raised stays
  failed: the connection is broken, the driver closes it. Results decoded in the
  same call before the bad byte ride on the exception as ``.partial`` so nothing
  good is lost to the error.
* **Driver mistakes raise** TypeError (not bytes), ValueError (bad argument) or
  RuntimeError (a call in the wrong state, e.g. data after EOF) -- never a
  silent misbehaviour.
* **Actions are small frozen classes** (``Send("b", data)``, ``Close("a")``,
  ...; see ``protocols/actions.py``). Cores return lists of them and never expect a
  reply except through their own event methods. A driver ``match``es on the
  class and raises ``UnknownAction`` for one it doesn't know: an action
  silently skipped is a decision silently overruled.

What lives where:

``protocols/actions.py``
    the action classes (``Send``, ``Close``, ...) and ``UnknownAction``;
``protocols/framing.py``
    ``ProtocolError``, ``encode_frame`` / ``FrameDecoder`` / ``FrameStats``:
    fixed-size frames carrying a sequence number and a send timestamp, for
    latency, order and loss measurements;
this module
    ``EchoCore``, ``SinkCore``, ``SourceCore`` (token bucket), ``ProxyCore``
    (one-way and two-way with half-close, optional relay limit),
    ``ReqRespCore`` (pipelined request lines), ``PushCore`` (broadcast with a
    per-client overload policy).

Cores count what they see in plain attributes; the kernels' probes
(``kernels/probe.py``) count what the kernels see. The two are compared, never
merged.
"""
from __future__ import annotations

import math

from protocols.actions import (
    Action, Block, Close, Disconnect, Done, Drop, Enqueue, PauseReading, ResumeReading, Send,
    SendEof, UnknownAction,
)
from protocols.framing import (
    FRAME_HEADER_BYTES, FRAME_MAGIC, Frame, FrameDecoder, FrameStats, ProtocolError,
    _MAX_U32, _MAX_U64, _as_bytes_view, _encode, _owned_bytes, encode_frame, frame_payload,
)

__all__ = [
    "ProtocolError", "Action", "Send", "SendEof", "Close", "PauseReading", "ResumeReading",
    "Done", "Enqueue", "Block", "Drop", "Disconnect", "UnknownAction",
    "FRAME_MAGIC", "FRAME_HEADER_BYTES", "Frame", "encode_frame", "frame_payload",
    "FrameDecoder", "FrameStats",
    "EchoCore", "SinkCore", "SourceCore", "ProxyCore", "ReqRespCore", "PushCore",
]


# ---------------------------------------------------------------------------
# Echo, sink, source
#
# The simplest cores, kept as classes anyway so every app has the same shape
# (a driver holds one core per connection and feeds it) and so their counters
# sit where the drivers of the other apps expect them.

def _check_now(now, last: float | None, who: str) -> float:
    if isinstance(now, bool) or not isinstance(now, (int, float)) or not math.isfinite(now):
        raise TypeError(f"{who}: now must be a finite float (seconds), got {now!r}")
    if last is not None and now < last:
        raise ValueError(f"{who}: now went backwards ({now} < {last}); pass a monotonic clock")
    return float(now)


def _check_size(value, name: str, minimum: int, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


class EchoCore:
    """Echo server: every byte received is sent back, in order.

    Event ``receive(data)`` returns the bytes to send: ``data`` itself when it
    is ``bytes``, else a copy (drivers may reuse their read buffers).
    ``received_bytes`` counts them. The core has no flow control of its own --
    what an echo server does when the client stops reading is exactly what the
    drivers and kernels are compared on.
    """

    def __init__(self):
        self.received_bytes = 0

    def receive(self, data) -> bytes:
        data = _owned_bytes(data)
        self.received_bytes += len(data)
        return data


class SinkCore:
    """Counting sink: ``receive(data, now)``, then ``eof()``.

    Counts ``received_bytes``. With ``frame_bytes`` it also decodes the stream
    into frames no longer than ``frame_bytes`` (a source ending on a total that
    is not a whole number of frames sends a shorter last frame) and feeds them
    to ``stats`` (a FrameStats) at ``now`` -- only then is ``now`` used, and it
    must be a float. Framing errors and a stream that ends mid-frame raise
    ProtocolError (``verify=True`` also checks every payload byte).
    ``eof_seen`` turns True at ``eof()``.
    Hazard: ``now`` is when the *driver* got the bytes, so a kernel that sits on
    data shows up as latency -- which is the point.
    """

    def __init__(self, frame_bytes: int | None = None, verify: bool = False):
        _check_size(frame_bytes, "frame_bytes", FRAME_HEADER_BYTES, optional=True)
        self.frame_bytes = frame_bytes
        self.received_bytes = 0
        self.eof_seen = False
        self.decoder = None if frame_bytes is None else FrameDecoder(frame_bytes, verify)
        self.stats = None if frame_bytes is None else FrameStats()

    def receive(self, data, now: float) -> None:
        if self.eof_seen:
            raise RuntimeError("SinkCore.receive() after eof()")
        view = _as_bytes_view(data)
        self.received_bytes += len(view)
        if self.decoder is not None:
            now = _check_now(now, None, "SinkCore.receive")
            add = self.stats.add
            for frame in self.decoder.feed(view):
                add(frame, now)

    def eof(self) -> None:
        self.eof_seen = True
        if self.decoder is not None:
            self.decoder.eof()


class SourceCore:
    """Frame source with the token bucket inside the core.

    ``next_chunk(now)`` returns the next frame (``frame_bytes`` long, numbered
    from 0, stamped with ``now``) when the bucket allows it, else None;
    ``wait_s(now)`` says how long until it will (0.0 when ready now, ``inf``
    once ``done``). ``done`` turns True when ``total_bytes`` have been handed
    out; with ``total_bytes=None`` the source never ends. When ``total_bytes``
    is not a whole number of frames the last frame is shorter (and must still
    hold a header, else ValueError at construction).

    The bucket is kept as a "theoretical arrival time" (GCRA): frame k is due
    at ``t0 + k * frame_bytes / rate_Bps`` and may leave early by at most the
    burst tolerance. ``burst_bytes`` (default two frames) is how much unused
    credit an idle or blocked source may save. Two frames means a driver whose
    timer wakes late by up to one frame interval still reaches the full rate,
    while a source stalled by backpressure for seconds does not catch up in a
    burst afterwards: backpressure shows as a lower achieved rate, as with the
    peers. The bucket starts holding one frame, so the first frame goes at the
    first call. Over a span T starting at the first frame, a source polled at
    every ``wait_s`` emits ``floor(T * rate_Bps / frame_bytes) + 1`` frames.
    With ``rate_Bps=None`` there is no limit.

    Time comes only from ``now`` (never read here) and must not go backwards.
    Counters: ``frames_sent`` (also the next seq), ``sent_bytes``.
    """

    # A due time within a nanosecond counts as reached: a driver that sleeps
    # exactly wait_s() may wake at a float one ulp early, and must not be told
    # to sleep 1e-16 s forever.
    _EPSILON_S = 1e-9

    def __init__(self, frame_bytes: int, total_bytes: int | None = None,
                 rate_Bps: float | None = None, burst_bytes: int | None = None):
        _check_size(frame_bytes, "frame_bytes", FRAME_HEADER_BYTES)
        if frame_bytes > _MAX_U32:
            raise ValueError(f"frame_bytes must fit the u32 length field, got {frame_bytes}")
        _check_size(total_bytes, "total_bytes", 0, optional=True)
        if total_bytes is not None and 0 < total_bytes % frame_bytes < FRAME_HEADER_BYTES:
            raise ValueError(f"total_bytes={total_bytes} would end with a {total_bytes % frame_bytes}"
                             f"-byte frame, shorter than the {FRAME_HEADER_BYTES}-byte header")
        if rate_Bps is not None:
            if isinstance(rate_Bps, bool) or not isinstance(rate_Bps, (int, float)):
                raise TypeError(f"rate_Bps must be a number or None, got {rate_Bps!r}")
            if not (rate_Bps > 0 and math.isfinite(rate_Bps)):
                raise ValueError(f"rate_Bps must be positive and finite, got {rate_Bps}")
        if burst_bytes is None:
            burst_bytes = 2 * frame_bytes
        _check_size(burst_bytes, "burst_bytes", frame_bytes)
        self.frame_bytes = frame_bytes
        self.total_bytes = total_bytes
        self.rate_Bps = rate_Bps
        self.burst_bytes = burst_bytes
        self.frames_sent = 0
        self.sent_bytes = 0
        self.done = total_bytes == 0
        self._interval = None if rate_Bps is None else frame_bytes / rate_Bps
        self._tolerance = None if rate_Bps is None else (burst_bytes - frame_bytes) / rate_Bps
        self._tat: float | None = None       # theoretical arrival time of the next frame
        self._last_now: float | None = None

    def _allowed_at(self, now: float) -> float:
        if self._tat is None:                # first call: bucket holds one frame
            self._tat = now + self._tolerance
        return self._tat - self._tolerance

    def wait_s(self, now: float) -> float:
        """Seconds until ``next_chunk`` will return a frame (0.0: now)."""
        now = self._last_now = _check_now(now, self._last_now, "SourceCore.wait_s")
        if self.done:
            return math.inf
        if self._interval is None:
            return 0.0
        wait = self._allowed_at(now) - now
        return wait if wait > self._EPSILON_S else 0.0

    def next_chunk(self, now: float) -> bytes | None:
        """The next frame if the bucket allows it at ``now``, else None."""
        now = self._last_now = _check_now(now, self._last_now, "SourceCore.next_chunk")
        if self.done:
            return None
        if self.frames_sent > _MAX_U64:
            raise ValueError("SourceCore: sequence numbers exhausted (2**64 frames)")
        if self._interval is not None:
            if self._allowed_at(now) - now > self._EPSILON_S:
                return None
            self._tat = max(self._tat, now) + self._interval
        size = self.frame_bytes
        if self.total_bytes is not None:
            size = min(size, self.total_bytes - self.sent_bytes)
        frame = _encode(self.frames_sent, now, size)
        self.frames_sent += 1
        self.sent_bytes += size
        if self.total_bytes is not None and self.sent_bytes >= self.total_bytes:
            self.done = True
        return frame


# ---------------------------------------------------------------------------
# Proxy
#
# The 2016 post's program, and its two-way generalisation. The core owns the
# decisions the post's three versions got wrong or right: what to do at EOF,
# when to stop reading. It does not own buffers -- the driver and the kernel do,
# and how much they hold is what we measure. So flow control is expressed in
# what the driver *reports*: how many bytes are still pending toward a side.

_SIDES = ("a", "b")
_OTHER = {"a": "b", "b": "a"}


class ProxyCore:
    """Relay between side "a" (the client) and side "b" (the upstream).

    Events (each returns a list of actions):
      ``data(side, data)``      bytes read from ``side``;
      ``eof(side)``             ``side`` half-closed (read returned EOF);
      ``closed(side, error)``   ``side`` is gone (reset, error, or closed);
                                ``error`` is the exception or None;
      ``sent(side, n)``         n more bytes toward ``side`` reached the OS;
      ``buffered(side, n)``     n bytes toward ``side`` are pending right now
                                (e.g. ``transport.get_write_buffer_size()``);
      ``write_paused(side)`` / ``write_resumed(side)``
                                the port asks to stop / may go on writing
                                toward ``side`` (asyncio's pause_writing).
    Actions: ``Send(side, data)``, ``SendEof(side)``, ``Close(side, abort)``,
    ``PauseReading(side)``, ``ResumeReading(side)``, ``Done()``.

    One-way (``two_way=False``, the post's proxy): only a -> b is relayed; bytes
    read from b are not relayed but counted in ``ignored_bytes``. EOF on a
    closes both sides and ends the proxy: ``Close a, Close b, Done``. Whether
    the bytes still buffered toward b survive that is up to the driver (the
    post's bug 3), not the core. EOF on b is passed on (``SendEof a``): the
    client learns the upstream has finished while a -> b may go on.

    Two-way: both directions relay. EOF on one side is passed on as
    ``SendEof`` to the other while the opposite direction keeps flowing
    (half-close); once both directions have seen EOF both sides are closed and
    the proxy is done.

    Either mode: the two sides are one unit. ``closed(side, error)`` before the
    proxy is done closes the other side (``abort=True`` when there was an
    error: no orderly end to pass on) and ends it (``error`` is kept in
    ``.error``). A side that never came to exist (upstream connect failed) is
    reported as ``closed("b", exc)``. After ``Done()`` every event is accepted
    and answered with no actions -- drivers often have reads or completions in
    flight when they act on a close.

    Flow control, two sources, one rule: reading from a side pauses while any
    reason holds it and resumes when none does.
    * ``follow_pause=True`` (the "fixed" proxies): ``write_paused(toward)``
      pauses reading the side whose bytes fill ``toward``. ``False`` (naive)
      ignores it and the port buffers without bound -- the post's bug 1, kept
      as a decision so the naive variant stays measurable.
    * Relay limit (``relay_limit_bytes``): the core keeps ``pending[side]``, the
      bytes it asked to send toward a side minus those the driver reported sent
      (never below zero), or the figure last given by ``buffered``. Only a
      driver *report* is checked, never the emission of a send: when pending
      toward a side exceeds the limit the core pauses reading the other side
      (``relay_limit_triggers`` += 1); when it drains to half the limit or
      less, it resumes. A task-port driver reports ``sent`` after ``send_all``
      returns, so pending is back to zero at every report and the limit never
      triggers: there, backpressure comes from blocking. That zero is a result.
    A side already at EOF is never paused.

    Hazards: events after the side's EOF other than ``closed``/``sent``/
    ``buffered``/``write_*`` are driver bugs (RuntimeError); sides are exactly
    "a" and "b".
    """

    def __init__(self, two_way: bool = False, relay_limit_bytes: int | None = None,
                 follow_pause: bool = True):
        _check_size(relay_limit_bytes, "relay_limit_bytes", 0, optional=True)
        self.two_way = bool(two_way)
        self.follow_pause = bool(follow_pause)
        self.relay_limit_bytes = relay_limit_bytes
        self.relay_limit_triggers = 0
        self.relayed_bytes = {"a": 0, "b": 0}   # read from side, sent to the other
        self.ignored_bytes = 0
        self.pending = {"a": 0, "b": 0}         # toward side, not yet reported sent
        self.eof_seen = {"a": False, "b": False}
        self.paused = {"a": False, "b": False}  # reading paused on side
        self._holds = {"a": set(), "b": set()}  # why reading side is paused
        self.done = False
        self.error: BaseException | None = None

    @staticmethod
    def _side(side) -> str:
        if side not in _SIDES:
            raise ValueError(f"side must be 'a' or 'b', got {side!r}")
        return side

    def _finish(self, actions: list) -> list:
        actions += [Close("a"), Close("b"), Done()]
        self.done = True
        return actions

    def data(self, side, data) -> list:
        side = self._side(side)
        data = _owned_bytes(data)
        if self.done:
            return []
        if self.eof_seen[side]:
            raise RuntimeError(f"ProxyCore.data({side!r}) after eof({side!r})")
        n = len(data)
        if not n:
            return []
        if side == "b" and not self.two_way:
            self.ignored_bytes += n
            return []
        other = _OTHER[side]
        self.relayed_bytes[side] += n
        self.pending[other] += n
        return [Send(other, data)]

    def eof(self, side) -> list:
        side = self._side(side)
        if self.done:
            return []
        if self.eof_seen[side]:
            raise RuntimeError(f"ProxyCore.eof({side!r}) twice")
        self.eof_seen[side] = True
        if not self.two_way:
            return self._finish([]) if side == "a" else [SendEof("a")]
        actions = [SendEof(_OTHER[side])]
        if self.eof_seen[_OTHER[side]]:
            self._finish(actions)
        return actions

    def closed(self, side, error: BaseException | None = None) -> list:
        side = self._side(side)
        if self.done:
            return []
        self.error = error
        self.done = True
        return [Close(_OTHER[side], abort=error is not None), Done()]

    def sent(self, side, n: int) -> list:
        side = self._side(side)
        _check_size(n, "n", 0)
        self.pending[side] = max(0, self.pending[side] - n)
        return self._check_limit(side)

    def buffered(self, side, n: int) -> list:
        side = self._side(side)
        _check_size(n, "n", 0)
        self.pending[side] = n
        return self._check_limit(side)

    def write_paused(self, side) -> list:
        side = self._side(side)
        if not self.follow_pause:
            return []
        return self._hold(_OTHER[side], "port", True)

    def write_resumed(self, side) -> list:
        side = self._side(side)
        if not self.follow_pause:
            return []
        return self._hold(_OTHER[side], "port", False)

    def _hold(self, source: str, reason: str, on: bool) -> list:
        """Add or remove one reason to keep ``source`` paused; act on the edge."""
        if self.done:
            return []
        holds = self._holds[source]
        if on:
            if self.eof_seen[source]:
                return []
            holds.add(reason)
        else:
            holds.discard(reason)
        if holds and not self.paused[source]:
            self.paused[source] = True
            return [PauseReading(source)]
        if not holds and self.paused[source]:
            self.paused[source] = False
            # A side that reached EOF while paused has nothing left to read.
            return [] if self.eof_seen[source] else [ResumeReading(source)]
        return []

    def _check_limit(self, toward: str) -> list:
        limit = self.relay_limit_bytes
        if limit is None or self.done:
            return []
        source = _OTHER[toward]        # the side whose bytes fill `toward`
        pending = self.pending[toward]
        held = "limit" in self._holds[source]
        if not held and pending > limit and not self.eof_seen[source]:
            self.relay_limit_triggers += 1
            return self._hold(source, "limit", True)
        if held and pending <= limit // 2:
            return self._hold(source, "limit", False)
        return []


# ---------------------------------------------------------------------------
# Request/response
#
# The shape of the HTTP pipelining floods (Twisted ticket 8868): tiny requests
# in, big responses out, as many requests per read as the client cares to
# pipeline. The core answers every complete request at once; whether the
# driver writes the answers into an unbounded buffer or waits for each is the
# experiment.

class ReqRespCore:
    """Pipelined line protocol: requests ``b"REQ <anything>\\n"``, each answered
    with exactly ``response_bytes`` bytes: ``b"RESP <seq> <response_bytes>\\n"``
    then ``.`` filler.

    ``receive(data)`` returns one response per request completed by ``data``
    (any number per chunk, split anywhere); ``eof()`` raises ProtocolError if
    the stream ended inside a request line. ``requests_count`` counts requests
    answered (seq starts at 0).

    Errors (ProtocolError, with the line's start offset): a line that doesn't
    start with ``b"REQ "`` (checked as soon as 4 bytes, or a shorter whole line,
    are in), a line longer than ``max_request_bytes`` including its newline
    (checked as soon as that many bytes have come without a newline -- so a
    client can never make the core buffer more than ``max_request_bytes``: the
    read-ahead bug C3 is bounded here). After an error the core stays failed.
    """

    def __init__(self, response_bytes: int, max_request_bytes: int = 1024):
        _check_size(response_bytes, "response_bytes", 1)
        _check_size(max_request_bytes, "max_request_bytes", 5)   # b"REQ \n"
        longest_header = len(b"RESP %d %d\n" % (_MAX_U64, response_bytes))
        if response_bytes < longest_header:
            raise ValueError(f"response_bytes must be >= {longest_header} to hold the "
                             f"response header, got {response_bytes}")
        self.response_bytes = response_bytes
        self.max_request_bytes = max_request_bytes
        self.requests_count = 0
        self.offset = 0                   # stream bytes consumed
        self._line = bytearray()          # the current, incomplete request line
        self._body = b"." * response_bytes
        self._failed: ProtocolError | None = None
        self._eof = False

    def _check_line(self, line, complete: bool, start: int, done: int) -> None:
        if (len(line) >= 4 or complete) and line[:4] != b"REQ ":
            self._failed = ProtocolError(
                f"request at byte offset {start} does not start with b'REQ ' "
                f"(got {bytes(line[:4])!r})", start, done)
            raise self._failed
        if len(line) > self.max_request_bytes or (not complete and len(line) >= self.max_request_bytes):
            self._failed = ProtocolError(
                f"request line at byte offset {start} is longer than "
                f"max_request_bytes={self.max_request_bytes}", start, done)
            raise self._failed

    def respond(self) -> bytes:
        """The next response, in request order (after ``requests()``)."""
        header = b"RESP %d %d\n" % (self.requests_count, self.response_bytes)
        self.requests_count += 1
        return header + self._body[len(header):]

    def receive(self, data) -> list[bytes]:
        """Parse ``data`` and answer every request it completed at once."""
        try:
            n = self.requests(data)
        except ProtocolError as exc:
            if isinstance(exc.partial, int):
                exc.partial = [self.respond() for _ in range(exc.partial)]
            raise
        return [self.respond() for _ in range(n)]

    def requests(self, data) -> int:
        """Parse ``data``; return how many requests it completed, to be answered
        one ``respond()`` at a time. A server that stops writing under backpressure
        thus never builds the responses it hasn't sent (on a ProtocolError,
        ``partial`` is the count completed before the bad line)."""
        if self._failed is not None:
            raise ProtocolError(f"request parser already failed: {self._failed}", self._failed.offset)
        if self._eof:
            raise RuntimeError("ReqRespCore.receive() after eof()")
        view = _as_bytes_view(data)
        # bytes.find is the fast way to split lines; a bytearray or memoryview
        # from the driver costs one copy here.
        buf = data if type(data) is bytes else view.tobytes()
        base = self.offset
        n = len(buf)
        done = 0
        i = 0
        while i < n:
            line = self._line
            start = base + i - len(line)
            nl = buf.find(b"\n", i)
            if nl < 0:
                # No newline: keep the partial line, checked so it stays bounded.
                line += view[i:]
                self._check_line(line, False, start, done)
                break
            if line:
                line += view[i:nl + 1]
                self._check_line(line, True, start, done)
                line.clear()
            else:
                self._check_line(view[i:nl + 1], True, start, done)
            done += 1
            i = nl + 1
        self.offset = base + n
        return done

    def eof(self) -> None:
        """The client finished sending; ProtocolError if it stopped mid-line."""
        if self._failed is not None:
            raise ProtocolError(f"request parser already failed: {self._failed}", self._failed.offset)
        self._eof = True
        if self._line:
            start = self.offset - len(self._line)
            self._failed = ProtocolError(f"truncated request: {len(self._line)} bytes without a "
                                         f"newline at byte offset {start}", start)
            raise self._failed


# ---------------------------------------------------------------------------
# Push
#
# A broadcast server (aiohttp issue 1367, S6): one producer, many clients, and
# one of them stops reading. Backpressure alone makes the broadcaster wait for
# the slowest client; the policies below are the choices a real server has.

_POLICIES = ("unbounded", "block", "drop", "disconnect")


class PushCore:
    """Broadcast with a per-client overload policy.

    Events: ``add_client(cid)``, ``remove_client(cid)``, ``backlog(cid, n)``
    (n = messages still pending for that client, as the driver knows it), and
    ``broadcast(message)``, which returns, for each client in the order they
    were added, the actions for that message:

      ``Send(cid, msg)``         write msg to that client now (in turn);
      ``Enqueue(cid, msg)``      hand msg to that client's own writer (a
                                 bounded per-client queue drained by its task,
                                 or the transport buffer on the callback port)
                                 without waiting;
      ``Block(cid)``             before the send that follows it, wait until
                                 that client's backlog falls below
                                 ``queue_limit`` (stream: ``drain()``; task:
                                 ``send_all`` blocks anyway);
      ``Drop(cid)``              msg is not delivered to that client;
      ``Disconnect(cid)``        close that client; the core forgets it.

    Policies, decided from each client's backlog:
      "unbounded"   always ``Enqueue``, without limit -- the driver hands the
                    message on (transport buffer, or the client's queue on
                    the task port) and never waits (the S6 first row);
      "block"       ``Send``, preceded by ``Block`` when the backlog is at or
                    over ``queue_limit``: the broadcaster waits for that client
                    and serves clients in turn (``queue_limit=0``: wait for
                    every write, the "write; drain per client" rows);
      "drop"        ``Enqueue``, or ``Drop`` when the backlog is >= queue_limit;
      "disconnect"  ``Enqueue``, or ``Disconnect`` when it is >= queue_limit.
    So ``Send`` always means "in turn, the broadcaster may wait" and
    ``Enqueue`` "without waiting": a driver needs no policy of its own.

    Backlog bookkeeping: each ``Send``/``Enqueue`` counts as +1 pending for
    that client until the driver reports the true figure with ``backlog(cid,
    n)`` (absolute). The driver must report when messages leave (dequeued, or
    written out): a driver that never reports makes every client look stuck
    after ``queue_limit`` messages.

    Counters: ``sent_count`` (per client: sends + enqueues), ``dropped_count``,
    ``disconnected_count``, ``blocked_count`` (totals) and ``dropped_by_client``.
    Hazards: an unknown cid is a ValueError, except that ``backlog`` and
    ``remove_client`` for a client the core itself disconnected are accepted
    and ignored (the driver learns of the disconnect after the fact).
    """

    def __init__(self, policy: str, queue_limit: int = 16):
        if policy not in _POLICIES:
            raise ValueError(f"unknown push policy {policy!r}; valid: {', '.join(_POLICIES)}")
        _check_size(queue_limit, "queue_limit", 0)
        if queue_limit == 0 and policy in ("drop", "disconnect"):
            raise ValueError(f"queue_limit=0 with policy {policy!r} would never deliver anything")
        self.policy = policy
        self.queue_limit = queue_limit
        self.sent_count: dict = {}
        self.dropped_by_client: dict = {}
        self.dropped_count = 0
        self.disconnected_count = 0
        self.blocked_count = 0
        self.broadcasts_count = 0
        self._backlog: dict = {}
        self._gone: set = set()      # disconnected by the core, not yet removed

    @property
    def clients(self) -> list:
        return list(self._backlog)

    def add_client(self, cid) -> None:
        if cid in self._backlog:
            raise ValueError(f"client {cid!r} already added")
        self._gone.discard(cid)
        self._backlog[cid] = 0
        self.sent_count.setdefault(cid, 0)
        self.dropped_by_client.setdefault(cid, 0)

    def remove_client(self, cid) -> None:
        if cid in self._backlog:
            del self._backlog[cid]
        elif cid in self._gone:
            self._gone.discard(cid)
        else:
            raise ValueError(f"unknown client {cid!r}")

    def backlog(self, cid, n: int) -> None:
        _check_size(n, "n", 0)
        if cid in self._backlog:
            self._backlog[cid] = n
        elif cid not in self._gone:
            raise ValueError(f"unknown client {cid!r}")

    def broadcast(self, message) -> list:
        msg = _owned_bytes(message, "message")
        self.broadcasts_count += 1
        policy, limit, backlog = self.policy, self.queue_limit, self._backlog
        actions = []
        for cid in list(backlog):
            full = backlog[cid] >= limit
            if policy == "unbounded":
                actions.append(Enqueue(cid, msg))
            elif policy == "block" and not full:
                actions.append(Send(cid, msg))
            elif policy == "block":
                self.blocked_count += 1
                actions.append(Block(cid))
                actions.append(Send(cid, msg))
            elif not full:
                actions.append(Enqueue(cid, msg))
            elif policy == "drop":
                self.dropped_count += 1
                self.dropped_by_client[cid] += 1
                actions.append(Drop(cid))
                continue
            else:
                self.disconnected_count += 1
                del backlog[cid]
                self._gone.add(cid)
                actions.append(Disconnect(cid))
                continue
            backlog[cid] += 1
            self.sent_count[cid] += 1
        return actions
