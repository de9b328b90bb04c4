"""Framing for the sans-IO cores: fixed-size frames, their decoder and their statistics.

Frames carry a sequence number and a send timestamp, for latency, order and
loss measurements. ``encode_frame`` builds one, ``FrameDecoder`` takes a byte
stream apart (any chunking gives the same frames), ``FrameStats`` counts what
arrived. Like the cores that use them (``protocols/cores.py``) they decide and
never act: no socket, no clock -- the time arrives as the argument ``now`` --
no kernel. The peers (``bench/peers/``, blocking sockets in another process)
use the same code to check what the kernel under test delivered.

Bad peer input raises ``ProtocolError`` (a ValueError) that says what was wrong
and at which byte offset; what the failing call had already decoded rides on
it as ``.partial``.

``from protocols.cores import encode_frame, ...`` keeps working: ``cores``
re-exports everything public defined here.
"""
from __future__ import annotations

import bisect
import math
import struct
from typing import NamedTuple

__all__ = ["ProtocolError", "FRAME_MAGIC", "FRAME_HEADER_BYTES", "Frame", "encode_frame",
           "frame_payload", "FrameDecoder", "FrameStats"]


class ProtocolError(ValueError):
    """The peer sent bytes that break the protocol.

    ``offset`` is the byte offset in the stream (counted from the first byte the
    core ever received) where the offending unit starts, or None when no single
    byte is to blame. ``partial`` holds what the failing call had already
    decoded before the bad byte (frames, responses), so that "any chunking gives
    the same outcome" stays true even for streams that end in garbage.
    """

    def __init__(self, message: str, offset: int | None = None, partial: list | None = None):
        super().__init__(message)
        self.offset = offset
        self.partial = [] if partial is None else partial


def _owned_bytes(data, what: str = "data") -> bytes:
    """``data`` as immutable bytes: the object itself when it already is (no
    copy on the hot path), else a copy -- drivers may reuse a bytearray or a
    memoryview into their read buffer as soon as the call returns."""
    if type(data) is bytes:
        return data
    return _as_bytes_view(data, what).tobytes()


def _as_bytes_view(data, what: str = "data") -> memoryview:
    """A flat byte view of ``data``; TypeError for anything that isn't bytes-like."""
    if isinstance(data, str):
        raise TypeError(f"{what} must be bytes-like, not str (encode it first)")
    try:
        view = memoryview(data)
    except TypeError:
        raise TypeError(f"{what} must be bytes-like, not {type(data).__name__}") from None
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


# ---------------------------------------------------------------------------
# Framing
#
# A frame is a 24-byte big-endian header -- magic b"LLF1", total length (header
# included) as u32, sequence number as u64, send timestamp as f64 -- followed by
# filler. The filler is a pure function of (seq, position): byte i of the
# payload of frame seq is (seq + i) % 251. A receiver that asks (verify=True)
# can therefore check every payload byte with a memcmp against a cached
# pattern, without anything in the frame to carry a checksum. 251 is prime so
# the pattern never lines up with power-of-two chunk or buffer sizes: a chunk
# duplicated, dropped or shifted by a driver shows up as a mismatch.
#
# The decoder never buffers payload bytes. It collects at most one header (24
# bytes) and then only *counts* payload bytes as they stream past (comparing
# them in place when verifying). A sink reading 64 KiB chunks of 32 KiB frames
# costs one header unpack per frame and no copies, which keeps the peers --
# the ground truth -- cheap enough not to be the bottleneck they measure.

FRAME_MAGIC = b"LLF1"
FRAME_HEADER_BYTES = 24
_HEADER = struct.Struct(">4sIQd")
_MAX_U32 = 2**32 - 1
_MAX_U64 = 2**64 - 1
_PERIOD = 251

assert _HEADER.size == FRAME_HEADER_BYTES

# bytes(i % 251 for i in range(...)), grown on demand and never shrunk; slices
# of it are the filler. Replaced whole (never mutated), so threads (the peers
# run roles in threads) only ever see a complete buffer.
_pattern = bytes(i % _PERIOD for i in range(_PERIOD + 65536))


def _pattern_view(phase: int, length: int) -> memoryview:
    """``length`` filler bytes starting at pattern phase ``phase`` (0..250)."""
    global _pattern
    if _PERIOD + length > len(_pattern):
        size = len(_pattern)
        while size < _PERIOD + length:
            size *= 2
        _pattern = bytes(range(_PERIOD)) * (size // _PERIOD + 1)
    return memoryview(_pattern)[phase:phase + length]


class Frame(NamedTuple):
    """One decoded frame: its sequence number, the sender's timestamp (seconds
    on the sender's clock; ``time.monotonic()`` is system-wide on Linux) and its
    total length in bytes, header included."""
    seq: int
    send_ts: float
    length: int


def frame_payload(seq: int, payload_bytes: int) -> bytes:
    """The filler that follows the header of frame ``seq`` (for tests and
    peers that want to build or check frames by hand)."""
    return bytes(_pattern_view(seq % _PERIOD, payload_bytes))


def encode_frame(seq: int, send_ts: float, frame_bytes: int) -> bytes:
    """One frame of exactly ``frame_bytes`` bytes (header included).

    ``seq`` is 0 .. 2**64-1, ``send_ts`` a finite float (the sender's ``now``),
    ``frame_bytes`` at least the 24-byte header and at most 2**32-1. Anything
    else is a TypeError or ValueError: a frame the decoder would reject is never
    produced.
    """
    if isinstance(seq, bool) or not isinstance(seq, int):
        raise TypeError(f"seq must be an int, not {type(seq).__name__}")
    if not 0 <= seq <= _MAX_U64:
        raise ValueError(f"seq must be in 0..2**64-1, got {seq}")
    if isinstance(frame_bytes, bool) or not isinstance(frame_bytes, int):
        raise TypeError(f"frame_bytes must be an int, not {type(frame_bytes).__name__}")
    if frame_bytes < FRAME_HEADER_BYTES:
        raise ValueError(f"frame_bytes must be >= {FRAME_HEADER_BYTES} (the header), "
                         f"got {frame_bytes}")
    if frame_bytes > _MAX_U32:
        raise ValueError(f"frame_bytes must fit the u32 length field, got {frame_bytes}")
    if isinstance(send_ts, bool) or not isinstance(send_ts, (int, float)):
        raise TypeError(f"send_ts must be a float, not {type(send_ts).__name__}")
    if not math.isfinite(send_ts):
        raise ValueError(f"send_ts must be finite, got {send_ts}")
    return _encode(seq, float(send_ts), frame_bytes)


def _encode(seq: int, send_ts: float, frame_bytes: int) -> bytes:
    # One copy: join() reads the header and a view of the cached pattern.
    header = _HEADER.pack(FRAME_MAGIC, frame_bytes, seq, send_ts)
    return b"".join((header, _pattern_view(seq % _PERIOD, frame_bytes - FRAME_HEADER_BYTES)))


class FrameDecoder:
    """Bytes in, ``Frame``s out.

    ``feed(data)`` returns the frames completed by ``data`` (possibly none);
    any split of the same stream gives the same frames in the same order.
    ``eof()`` says the stream ended: if it ended inside a frame it raises
    ``ProtocolError("truncated frame: N of M bytes ...")``.

    Errors, each a ProtocolError with the frame's start offset: bad magic
    (checked as soon as 4 header bytes are in), a length below the 24-byte
    header or above ``max_frame_bytes`` (checked as soon as 8 are in), and with
    ``verify=True`` a payload byte that isn't the filler of that frame's seq.
    After an error the decoder stays failed: every later ``feed``/``eof`` raises
    again -- there is no resynchronising on a byte stream without delimiters.

    Counters: ``frames_count``, ``offset`` (bytes consumed so far).
    Hazard: the decoder checks structure, not order; order, gaps and latency
    are ``FrameStats``'s job.
    """

    def __init__(self, max_frame_bytes: int = 16 * 1024 * 1024, verify: bool = False):
        if isinstance(max_frame_bytes, bool) or not isinstance(max_frame_bytes, int):
            raise TypeError("max_frame_bytes must be an int")
        if not FRAME_HEADER_BYTES <= max_frame_bytes <= _MAX_U32:
            raise ValueError(f"max_frame_bytes must be in {FRAME_HEADER_BYTES}..{_MAX_U32}, "
                             f"got {max_frame_bytes}")
        self.max_frame_bytes = max_frame_bytes
        self.verify = bool(verify)
        self.frames_count = 0
        self.offset = 0              # stream bytes consumed by feed()
        self._header = bytearray()   # a header split across feeds
        self._frame_start = 0        # stream offset of the current frame
        self._current: Frame | None = None   # header decoded, payload streaming
        self._remaining = 0          # payload bytes still to come for _current
        self._failed: ProtocolError | None = None
        self._eof = False

    @property
    def in_frame(self) -> bool:
        """True when the stream stopped in the middle of a frame."""
        return bool(self._header) or self._current is not None

    def _fail(self, message: str, offset: int | None, frames: list) -> ProtocolError:
        err = ProtocolError(message, offset, frames)
        self._failed = err
        return err

    def _check_prefix(self, header, frames) -> None:
        """Validate what is known of a header; the same checks run in the same
        order whether the header arrived whole or in pieces."""
        n = len(header)
        if n >= 4 and header[:4] != FRAME_MAGIC:
            raise self._fail(f"bad magic {bytes(header[:4])!r} at byte offset {self._frame_start} "
                             f"(expected {FRAME_MAGIC!r})", self._frame_start, frames)
        if n >= 8:
            length = int.from_bytes(header[4:8], "big")
            if length < FRAME_HEADER_BYTES:
                raise self._fail(f"frame length {length} at byte offset {self._frame_start} is "
                                 f"below the {FRAME_HEADER_BYTES}-byte header",
                                 self._frame_start, frames)
            if length > self.max_frame_bytes:
                raise self._fail(f"frame length {length} at byte offset {self._frame_start} "
                                 f"exceeds max_frame_bytes={self.max_frame_bytes}",
                                 self._frame_start, frames)

    def _verify(self, chunk: memoryview, frames: list) -> None:
        cur = self._current
        done = cur.length - FRAME_HEADER_BYTES - self._remaining  # payload bytes already seen
        expected = _pattern_view((cur.seq + done) % _PERIOD, len(chunk))
        if chunk != expected:
            bad = next(i for i in range(len(chunk)) if chunk[i] != expected[i])
            at = self._frame_start + FRAME_HEADER_BYTES + done + bad
            raise self._fail(f"payload mismatch in frame seq {cur.seq} (at byte offset "
                             f"{self._frame_start}) at byte offset {at}: got {chunk[bad]}, "
                             f"expected {expected[bad]}", self._frame_start, frames)

    def feed(self, data) -> list[Frame]:
        """Consume ``data`` (bytes-like) and return the frames it completed."""
        if self._failed is not None:
            raise ProtocolError(f"decoder already failed: {self._failed}", self._failed.offset)
        if self._eof:
            raise RuntimeError("FrameDecoder.feed() after eof()")
        view = _as_bytes_view(data)
        n = len(view)
        base = self.offset
        frames: list[Frame] = []
        i = 0
        while i < n:
            if self._current is not None:
                # Inside a payload: count (and maybe compare) bytes, never copy.
                take = min(self._remaining, n - i)
                if self.verify:
                    self._verify(view[i:i + take], frames)
                i += take
                self._remaining -= take
                if self._remaining == 0:
                    frames.append(self._current)
                    self._current = None
                    self.frames_count += 1
                continue
            header = self._header
            if not header:
                self._frame_start = base + i
                if n - i >= FRAME_HEADER_BYTES:
                    # Fast path: the whole header is in this chunk.
                    magic, length, seq, ts = _HEADER.unpack_from(view, i)
                    if magic != FRAME_MAGIC or not FRAME_HEADER_BYTES <= length <= self.max_frame_bytes:
                        self._check_prefix(view[i:i + 8], frames)
                    i += FRAME_HEADER_BYTES
                    self._start_payload(Frame(seq, ts, length), frames)
                    continue
            take = min(FRAME_HEADER_BYTES - len(header), n - i)
            header += view[i:i + take]
            i += take
            self._check_prefix(header, frames)
            if len(header) == FRAME_HEADER_BYTES:
                magic, length, seq, ts = _HEADER.unpack(header)
                header.clear()
                self._start_payload(Frame(seq, ts, length), frames)
        self.offset = base + n
        return frames

    def _start_payload(self, frame: Frame, frames: list) -> None:
        if frame.length == FRAME_HEADER_BYTES:
            frames.append(frame)
            self.frames_count += 1
        else:
            self._current = frame
            self._remaining = frame.length - FRAME_HEADER_BYTES

    def eof(self) -> None:
        """The stream ended. Raises ProtocolError if it ended inside a frame
        (or if the decoder had already failed); idempotent otherwise."""
        if self._failed is not None:
            raise ProtocolError(f"decoder already failed: {self._failed}", self._failed.offset)
        self._eof = True
        if self._current is not None:
            have = self._current.length - self._remaining
            raise self._fail(f"truncated frame: {have} of {self._current.length} bytes "
                             f"(frame seq {self._current.seq} at byte offset {self._frame_start})",
                             self._frame_start, [])
        if self._header:
            have = len(self._header)
            if have >= 8:
                total = f"{int.from_bytes(self._header[4:8], 'big')} bytes"
            else:
                total = f"at least {FRAME_HEADER_BYTES} bytes (header incomplete)"
            raise self._fail(f"truncated frame: {have} of {total} "
                             f"(frame at byte offset {self._frame_start})", self._frame_start, [])


class FrameStats:
    """What a frame sink computes from the frames it got: ``add(frame, now)``.

    Sequence numbers are expected to run 0, 1, 2, ... . A frame beyond the next
    expected one opens a gap (``missing_count`` grows by its width); a frame
    that fills a hole in a gap arrived late (``out_of_order_count`` += 1,
    ``missing_count`` -= 1); a frame whose seq was already seen is a duplicate.
    So at any moment ``missing_count`` is the number of seqs below the highest
    seen that never arrived. Gaps are kept as intervals, so memory grows with
    the number of gaps, not with the number of frames or the width of a jump.

    Latency is ``now - frame.send_ts`` (both on one clock: ``time.monotonic()``
    is system-wide on Linux). ``max_latency_s`` is exact; ``latencies`` and the
    parallel ``latency_times`` (the ``now`` of each sample) keep every sample
    up to ``max_samples``, then are thinned deterministically to every 2nd,
    4th, ... frame -- a uniform subsample that keeps time order, so they still
    draw a latency-vs-time series. Before any frame ``max_latency_s`` is None
    (unknown, not zero).
    """

    def __init__(self, max_samples: int = 10000):
        if isinstance(max_samples, bool) or not isinstance(max_samples, int) or max_samples < 2:
            raise ValueError(f"max_samples must be an int >= 2, got {max_samples!r}")
        self.max_samples = max_samples
        self.count = 0
        self.bytes = 0
        self.out_of_order_count = 0
        self.missing_count = 0
        self.duplicate_count = 0
        self.max_latency_s: float | None = None
        self.latencies: list[float] = []
        self.latency_times: list[float] = []
        self.last_seq: int | None = None
        self._next = 0                       # highest seq seen + 1
        self._gap_starts: list[int] = []     # sorted, disjoint [start, end) holes
        self._gap_ends: list[int] = []
        self._stride = 1                     # keep every stride-th latency sample
        self._skip = 0

    def add(self, frame: Frame, now: float) -> None:
        seq = frame.seq
        self.count += 1
        self.bytes += frame.length
        latency = now - frame.send_ts
        if self.max_latency_s is None or latency > self.max_latency_s:
            self.max_latency_s = latency
        self._skip += 1
        if self._skip >= self._stride:
            self._skip = 0
            self.latencies.append(latency)
            self.latency_times.append(now)
            if len(self.latencies) >= self.max_samples:
                del self.latencies[1::2]
                del self.latency_times[1::2]
                self._stride *= 2
        self.last_seq = seq
        nxt = self._next
        if seq == nxt:
            self._next = seq + 1
        elif seq > nxt:
            self._gap_starts.append(nxt)
            self._gap_ends.append(seq)
            self.missing_count += seq - nxt
            self._next = seq + 1
        else:
            self._fill(seq)

    def _fill(self, seq: int) -> None:
        starts, ends = self._gap_starts, self._gap_ends
        k = bisect.bisect_right(starts, seq) - 1
        if k < 0 or seq >= ends[k]:
            self.duplicate_count += 1
            return
        self.out_of_order_count += 1
        self.missing_count -= 1
        start, end = starts[k], ends[k]
        if start == seq and end == seq + 1:
            del starts[k], ends[k]
        elif start == seq:
            starts[k] = seq + 1
        elif end == seq + 1:
            ends[k] = seq
        else:
            ends[k] = seq
            starts.insert(k + 1, seq + 1)
            ends.insert(k + 1, end)

    def latency_quantile(self, q: float) -> float | None:
        """The q-quantile (0..1, nearest rank) of the kept latency samples, or
        None before any frame."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"q must be within 0..1, got {q}")
        if not self.latencies:
            return None
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def summary(self) -> dict:
        """The counters in the results vocabulary (snake_case, unit suffix)."""
        return {
            "frames_count": self.count,
            "frames_bytes": self.bytes,
            "out_of_order_count": self.out_of_order_count,
            "missing_count": self.missing_count,
            "duplicate_count": self.duplicate_count,
            "max_latency_s": self.max_latency_s,
            "p50_latency_s": self.latency_quantile(0.5),
            "last_seq": self.last_seq,
        }
