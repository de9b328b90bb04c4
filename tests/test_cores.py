"""Tests for protocols/cores.py: the sans-IO cores, without any I/O.

The central property is h11's: a core's outcome depends on the bytes, never on
how they were chunked. Hypothesis splits streams at arbitrary points (and feeds
garbage) and compares against feeding the whole stream at once. Time is a
simulated float; nothing sleeps.
"""
from __future__ import annotations

import ast
import math
import pathlib
import struct

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from protocols.cores import (
    FRAME_HEADER_BYTES, FRAME_MAGIC, EchoCore, Frame, FrameDecoder, FrameStats, ProtocolError,
    Block, Close, Disconnect, Done, Drop, Enqueue, PauseReading, ResumeReading, Send, SendEof,
    ProxyCore, PushCore, ReqRespCore, SinkCore, SourceCore, encode_frame, frame_payload,
)

FAST = settings(max_examples=200, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
PROTOCOLS = pathlib.Path(__file__).resolve().parent.parent / "protocols"
# The cores and the two modules they are built from (framing, actions): all sans-IO.
SANS_IO = ("cores.py", "framing.py", "actions.py")


def split(data: bytes, cuts) -> list[bytes]:
    """``data`` cut at the given offsets (any order, duplicates give empty chunks)."""
    points = sorted(min(max(c, 0), len(data)) for c in cuts)
    out, prev = [], 0
    for p in points + [len(data)]:
        out.append(data[prev:p])
        prev = p
    return out


def chunkings(data: bytes):
    return st.lists(st.integers(0, len(data)), max_size=30).map(lambda cuts: split(data, cuts))


def decode_outcome(chunks, **kw):
    """(frames, error message or None) for a stream fed as ``chunks`` then EOF."""
    dec = FrameDecoder(**kw)
    frames = []
    try:
        for c in chunks:
            frames += dec.feed(c)
        dec.eof()
        return frames, None
    except ProtocolError as e:
        return frames + e.partial, str(e)


# --------------------------------------------------------------------------- hygiene

@pytest.mark.parametrize("filename", SANS_IO)
def test_cores_imports_nothing_forbidden(filename):
    forbidden = {"kernels", "socket", "time", "asyncio", "trio", "curio", "selectors"}
    tree = ast.parse((PROTOCOLS / filename).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{filename} must not import relatives (e.g. the drivers)"
            imported.add(node.module)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "__import__":
            pytest.fail(f"{filename} must not import dynamically")
    assert imported, "the ast walk found no imports at all: the check is broken"
    tops = {name.split(".")[0] for name in imported}
    assert not tops & forbidden, f"{filename} imports {tops & forbidden}"
    # Within protocols, only the sans-IO modules themselves (never a driver).
    ours = {name for name in imported if name.split(".")[0] == "protocols"}
    allowed = {"protocols." + f.removesuffix(".py") for f in SANS_IO}
    assert ours <= allowed, f"{filename} imports {ours - allowed}"


# --------------------------------------------------------------------------- framing

def test_encode_frame_layout():
    f = encode_frame(7, 12.5, 40)
    assert len(f) == 40
    assert struct.unpack(">4sIQd", f[:24]) == (FRAME_MAGIC, 40, 7, 12.5)
    assert f[24:] == frame_payload(7, 16) == bytes((7 + i) % 251 for i in range(16))
    assert encode_frame(0, 0.0, FRAME_HEADER_BYTES)[4:8] == (24).to_bytes(4, "big")


@pytest.mark.parametrize("args, exc", [
    ((0, 0.0, 23), ValueError), ((0, 0.0, 0), ValueError), ((-1, 0.0, 32), ValueError),
    ((2**64, 0.0, 32), ValueError), ((0, math.nan, 32), ValueError),
    ((0, math.inf, 32), ValueError), ((0, 0.0, 2**32), ValueError),
    ((0, 0.0, 32.0), TypeError), (("1", 0.0, 32), TypeError), ((0, "now", 32), TypeError),
])
def test_encode_frame_rejects_bad_arguments(args, exc):
    with pytest.raises(exc):
        encode_frame(*args)


frame_specs = st.lists(st.tuples(st.integers(0, 2**64 - 1),
                                 st.floats(allow_nan=False, allow_infinity=False),
                                 st.integers(FRAME_HEADER_BYTES, 300)), max_size=12)


@FAST
@given(st.data(), frame_specs, st.booleans())
def test_random_frames_round_trip_under_any_chunking(data, specs, verify):
    stream = b"".join(encode_frame(*s) for s in specs)
    chunks = data.draw(chunkings(stream))
    frames, err = decode_outcome(chunks, verify=verify)
    assert err is None
    assert frames == [Frame(*s) for s in specs]


@FAST
@given(st.data(), st.binary(max_size=200), frame_specs)
def test_garbage_decodes_or_raises_protocol_error_identically_for_any_chunking(data, junk, specs):
    # Valid frames, then garbage (which may itself look like a header).
    stream = b"".join(encode_frame(*s) for s in specs) + junk
    if data.draw(st.booleans()):
        stream = junk + stream      # garbage first: must fail at offset 0 or decode
    whole = decode_outcome([stream], max_frame_bytes=4096, verify=True)
    chunks = data.draw(chunkings(stream))
    # decode_outcome only catches ProtocolError: any other exception fails here.
    assert decode_outcome(chunks, max_frame_bytes=4096, verify=True) == whole


@FAST
@given(st.data(), st.binary(min_size=1, max_size=64))
def test_headerlike_garbage_never_raises_anything_else(data, tail):
    # Force the magic so the length/seq/ts fields and payload are random.
    stream = FRAME_MAGIC + tail
    frames, err = decode_outcome(data.draw(chunkings(stream)), max_frame_bytes=64, verify=True)
    assert err is not None or frames


def test_truncated_frame_at_eof_is_a_clear_error():
    f = encode_frame(3, 1.0, 100)
    dec = FrameDecoder()
    assert dec.feed(f[:60]) == []
    with pytest.raises(ProtocolError, match=r"^truncated frame: 60 of 100 bytes") as e:
        dec.eof()
    assert e.value.offset == 0
    dec = FrameDecoder()
    dec.feed(encode_frame(0, 0.0, 30) + f[:10])
    with pytest.raises(ProtocolError, match=r"^truncated frame: 10 of 100 bytes .*offset 30"):
        dec.eof()
    dec = FrameDecoder()
    dec.feed(f[:5])
    with pytest.raises(ProtocolError, match=r"^truncated frame: 5 of at least 24 bytes"):
        dec.eof()


def test_clean_eof_and_empty_stream_are_fine():
    dec = FrameDecoder()
    assert dec.feed(b"") == []
    dec.eof()
    dec.eof()   # idempotent
    with pytest.raises(RuntimeError):
        dec.feed(encode_frame(0, 0.0, 24))


@pytest.mark.parametrize("stream, pattern, offset", [
    (b"XLF1" + bytes(20), r"bad magic b'XLF1' at byte offset 0", 0),
    (encode_frame(0, 0.0, 30) + b"LLF2" + bytes(20), r"bad magic b'LLF2' at byte offset 30", 30),
    (FRAME_MAGIC + (23).to_bytes(4, "big") + bytes(16), r"length 23 .* below the 24-byte", 0),
    (FRAME_MAGIC + (4097).to_bytes(4, "big") + bytes(16), r"length 4097 .* exceeds max_frame_bytes=4096", 0),
])
def test_bad_headers_raise_with_offset_and_stay_failed(stream, pattern, offset):
    for chunks in ([stream], [bytes([b]) for b in stream]):
        dec = FrameDecoder(max_frame_bytes=4096)
        with pytest.raises(ProtocolError, match=pattern) as e:
            for c in chunks:
                dec.feed(c)
        assert e.value.offset == offset
        with pytest.raises(ProtocolError, match="already failed"):
            dec.feed(encode_frame(0, 0.0, 24))
        with pytest.raises(ProtocolError, match="already failed"):
            dec.eof()


def test_bad_magic_is_detected_before_the_header_is_complete():
    dec = FrameDecoder()
    with pytest.raises(ProtocolError, match="bad magic"):
        dec.feed(b"GET ")


def test_frames_decoded_before_an_error_ride_on_it():
    good = encode_frame(0, 0.0, 40) + encode_frame(1, 0.0, 40)
    with pytest.raises(ProtocolError) as e:
        FrameDecoder().feed(good + b"junkjunkjunkjunkjunkjunk")
    assert [f.seq for f in e.value.partial] == [0, 1]


def test_verify_detects_a_corrupted_payload_byte():
    f = bytearray(encode_frame(9, 0.0, 100))
    f[70] ^= 0xFF
    assert [x.seq for x in FrameDecoder().feed(bytes(f))] == [9]   # not verifying: fine
    for chunks in ([bytes(f)], split(bytes(f), [30, 69, 71])):
        dec = FrameDecoder(verify=True)
        with pytest.raises(ProtocolError, match=r"payload mismatch in frame seq 9 .*at byte offset 70"):
            for c in chunks:
                dec.feed(c)


def test_decoder_accepts_bytearray_and_memoryview_and_rejects_str():
    f = encode_frame(1, 2.0, 50)
    assert FrameDecoder().feed(bytearray(f)) == [Frame(1, 2.0, 50)]
    assert FrameDecoder().feed(memoryview(f)) == [Frame(1, 2.0, 50)]
    with pytest.raises(TypeError):
        FrameDecoder().feed("LLF1")
    with pytest.raises(ValueError):
        FrameDecoder(max_frame_bytes=10)


def test_large_frames_stream_without_buffering_payload():
    frames = [encode_frame(i, float(i), 256 * 1024) for i in range(8)]
    stream = b"".join(frames)
    dec = FrameDecoder(verify=True)
    got = []
    for i in range(0, len(stream), 65536):
        got += dec.feed(stream[i:i + 65536])
        assert len(dec._header) < FRAME_HEADER_BYTES   # only ever a partial header held
    assert [f.seq for f in got] == list(range(8))
    assert dec.offset == len(stream) and dec.frames_count == 8


# --------------------------------------------------------------------------- FrameStats

def stats_of(seqs, ts=0.0, now=1.0):
    s = FrameStats()
    for q in seqs:
        s.add(Frame(q, ts, 100), now)
    return s


def test_stats_in_order():
    s = stats_of(range(5))
    assert (s.count, s.bytes, s.missing_count, s.out_of_order_count, s.duplicate_count,
            s.last_seq) == (5, 500, 0, 0, 0, 4)


def test_stats_gap_then_late_arrivals_and_duplicates():
    s = stats_of([0, 1, 4, 5])
    assert s.missing_count == 2 and s.out_of_order_count == 0
    s.add(Frame(2, 0.0, 100), 1.0)
    assert (s.missing_count, s.out_of_order_count, s.duplicate_count) == (1, 1, 0)
    s.add(Frame(2, 0.0, 100), 1.0)
    s.add(Frame(5, 0.0, 100), 1.0)
    assert (s.missing_count, s.out_of_order_count, s.duplicate_count) == (1, 1, 2)
    s.add(Frame(3, 0.0, 100), 1.0)
    assert (s.missing_count, s.out_of_order_count) == (0, 2)
    assert s.last_seq == 3


def test_stats_first_frame_not_zero_counts_missing():
    assert stats_of([3, 4]).missing_count == 3


@FAST
@given(st.lists(st.integers(0, 60), max_size=80))
def test_stats_match_a_set_model(seqs):
    s = stats_of(seqs)
    seen, top, ooo, dup = set(), -1, 0, 0
    for q in seqs:
        if q in seen:
            dup += 1
        elif q < top:
            ooo += 1
        seen.add(q)
        top = max(top, q)
    missing = sum(1 for q in range(top + 1) if q not in seen)
    assert (s.missing_count, s.out_of_order_count, s.duplicate_count) == (missing, ooo, dup)
    assert s.count == len(seqs)


def test_stats_latency_max_quantile_and_bounded_samples():
    s = FrameStats(max_samples=8)
    assert s.max_latency_s is None and s.latency_quantile(0.5) is None
    for i in range(100):
        s.add(Frame(i, float(i), 64), i + (0.5 if i == 37 else 0.01))
    assert s.max_latency_s == pytest.approx(0.5)
    assert len(s.latencies) < 8 and len(s.latencies) == len(s.latency_times)
    assert s.latency_times == sorted(s.latency_times)     # still a time series
    assert s.latency_quantile(0.5) == pytest.approx(0.01)
    summary = s.summary()
    assert summary["frames_count"] == 100 and summary["max_latency_s"] == pytest.approx(0.5)


# --------------------------------------------------------------------------- echo and sink

@FAST
@given(st.data(), st.binary(max_size=500))
def test_echo_returns_the_same_bytes_for_any_chunking(data, payload):
    core = EchoCore()
    out = b"".join(core.receive(c) for c in data.draw(chunkings(payload)))
    assert out == payload and core.received_bytes == len(payload)


def test_echo_copies_and_rejects_str():
    buf = bytearray(b"abc")
    out = EchoCore().receive(buf)
    buf[0] = 0
    assert out == b"abc" and type(out) is bytes
    with pytest.raises(TypeError):
        EchoCore().receive("abc")


def test_sink_counts_bytes_without_framing():
    core = SinkCore()
    core.receive(b"x" * 10, 0.0)
    core.receive(b"", 0.0)
    core.eof()
    assert core.received_bytes == 10 and core.stats is None and core.eof_seen
    with pytest.raises(RuntimeError):
        core.receive(b"y", 1.0)


@FAST
@given(st.data(), st.integers(0, 20))
def test_sink_frame_stats_for_any_chunking(data, n):
    stream = b"".join(encode_frame(i, 1.0, 64) for i in range(n))
    core = SinkCore(frame_bytes=64, verify=True)
    for c in data.draw(chunkings(stream)):
        core.receive(c, 3.0)
    core.eof()
    assert core.stats.count == n and core.received_bytes == len(stream)
    assert core.stats.missing_count == 0
    assert n == 0 or core.stats.max_latency_s == 2.0


def test_sink_rejects_oversized_frames_and_truncation():
    core = SinkCore(frame_bytes=64)
    with pytest.raises(ProtocolError, match="exceeds max_frame_bytes=64"):
        core.receive(encode_frame(0, 0.0, 65), 0.0)
    core = SinkCore(frame_bytes=64)
    core.receive(encode_frame(0, 0.0, 64)[:40], 0.0)
    with pytest.raises(ProtocolError, match="truncated frame: 40 of 64 bytes"):
        core.eof()


# --------------------------------------------------------------------------- source

def run_source(core, seconds, step=None):
    """Poll ``core`` over a simulated [0, seconds] span; returns (emit times, frames).
    ``step=None`` jumps to each wait_s(); a number polls at that fixed interval."""
    now, times, frames = 0.0, [], []
    for _ in range(1_000_000):     # bounded: never spin forever
        if now > seconds:
            break
        chunk = core.next_chunk(now)
        if chunk is not None:
            times.append(now)
            frames.append(chunk)
            continue
        wait = core.wait_s(now)
        if wait == math.inf:
            break
        assert wait > 0, "next_chunk said no but wait_s says ready"
        now += wait if step is None else step
    else:
        pytest.fail("source simulation did not finish")
    return times, frames


@pytest.mark.parametrize("rate, frame_bytes, step", [
    (1_000_000, 32768, None), (3_000_000, 32768, None), (123_457, 1000, None),
    (1_000_000, 32768, 0.010), (1_000_000, 32768, 0.003), (50_000_000, 65536, 0.0007),
])
def test_source_token_bucket_rate_over_simulated_10s(rate, frame_bytes, step):
    core = SourceCore(frame_bytes, rate_Bps=rate)
    times, frames = run_source(core, 10.0, step)
    expected = rate * 10 / frame_bytes
    assert abs(len(frames) - expected) <= 1.0 + 1e-9, (len(frames), expected)
    assert all(len(f) == frame_bytes for f in frames)
    decoded = FrameDecoder().feed(b"".join(frames))
    assert [f.seq for f in decoded] == list(range(len(frames)))     # numbered from 0
    assert [f.send_ts for f in decoded] == times                    # stamped with now


@FAST
@given(st.integers(1, 10**9), st.integers(FRAME_HEADER_BYTES, 70000),
       st.floats(0, 1e6, allow_nan=False), st.integers(0, 3))
def test_source_wait_s_is_exactly_when_the_next_frame_is_ready(rate, frame_bytes, t0, extra):
    # The driver contract: sleep wait_s(now), then next_chunk gives a frame;
    # wait_s is 0.0 exactly when next_chunk would give one. Float rounding
    # must never leave a driver a sliver of a second to wait forever.
    core = SourceCore(frame_bytes, rate_Bps=rate, burst_bytes=frame_bytes + extra)
    now = t0
    for _ in range(40):
        wait = core.wait_s(now)
        assert wait >= 0.0
        if wait > 0.0:
            assert core.next_chunk(now) is None
            now += wait
            assert core.wait_s(now) == 0.0
        assert core.next_chunk(now) is not None


def test_source_does_not_catch_up_after_a_stall():
    core = SourceCore(1000, rate_Bps=10_000)      # one frame per 0.1 s, burst 2 frames
    assert core.next_chunk(0.0) is not None
    assert core.next_chunk(0.0) is None
    assert core.wait_s(0.0) == pytest.approx(0.1)
    # Blocked for 5 s (backpressure): at most the burst is available at once.
    burst = 0
    while core.next_chunk(5.0) is not None and burst < 100:
        burst += 1
    assert burst == 2
    assert core.wait_s(5.0) == pytest.approx(0.1)


def test_source_total_bytes_ends_with_a_short_frame_and_done():
    core = SourceCore(1000, total_bytes=2500)
    chunks = [core.next_chunk(0.0) for _ in range(3)]
    assert [len(c) for c in chunks] == [1000, 1000, 500]
    assert core.done and core.sent_bytes == 2500 and core.frames_sent == 3
    assert core.next_chunk(1.0) is None and core.wait_s(1.0) == math.inf
    sink = SinkCore(frame_bytes=1000, verify=True)
    sink.receive(b"".join(chunks), 1.0)
    sink.eof()
    assert sink.stats.count == 3 and sink.received_bytes == 2500
    assert SourceCore(1000, total_bytes=0).done


def test_source_unlimited_rate_always_ready():
    core = SourceCore(100)
    assert all(core.next_chunk(0.0) is not None for _ in range(50))
    assert core.wait_s(0.0) == 0.0 and not core.done


@pytest.mark.parametrize("kwargs, exc", [
    (dict(frame_bytes=10), ValueError), (dict(frame_bytes=100, rate_Bps=0), ValueError),
    (dict(frame_bytes=100, rate_Bps=-5.0), ValueError), (dict(frame_bytes=100, rate_Bps="1"), TypeError),
    (dict(frame_bytes=100, total_bytes=110), ValueError),    # would end with a 10-byte frame
    (dict(frame_bytes=100, burst_bytes=50), ValueError), (dict(frame_bytes=100, total_bytes=-1), ValueError),
])
def test_source_rejects_bad_arguments(kwargs, exc):
    with pytest.raises(exc):
        SourceCore(**kwargs)


def test_source_rejects_time_going_backwards():
    core = SourceCore(100, rate_Bps=1000)
    core.next_chunk(5.0)
    with pytest.raises(ValueError, match="backwards"):
        core.next_chunk(4.0)
    with pytest.raises(TypeError):
        core.wait_s(None)


# --------------------------------------------------------------------------- proxy

def sends(actions, side):
    return b"".join(a.data for a in actions if isinstance(a, Send) and a.to == side)


def test_proxy_one_way_relays_and_shuts_down_on_eof():
    p = ProxyCore()
    assert p.data("a", b"hello") == [Send("b", b"hello")]
    assert p.data("b", b"ignored") == [] and p.ignored_bytes == 7
    assert p.eof("a") == [Close("a"), Close("b"), Done()]
    assert p.done
    assert p.data("a", b"late") == [] and p.eof("b") == [] and p.closed("a", None) == []
    assert p.relayed_bytes == {"a": 5, "b": 0}


def test_proxy_two_way_half_close_propagation():
    p = ProxyCore(two_way=True)
    assert p.data("a", b"req") == [Send("b", b"req")]
    assert p.eof("a") == [SendEof("b")]
    assert not p.done
    # b -> a keeps flowing after a half-closed.
    assert p.data("b", b"resp1") == [Send("a", b"resp1")]
    assert p.data("b", b"resp2") == [Send("a", b"resp2")]
    with pytest.raises(RuntimeError):
        p.data("a", b"after eof")
    assert p.eof("b") == [SendEof("a"), Close("a"), Close("b"), Done()]
    assert p.done and p.relayed_bytes == {"a": 3, "b": 10}


def test_proxy_closed_side_ends_the_proxy():
    p = ProxyCore(two_way=True)
    err = ConnectionResetError()
    assert p.closed("b", err) == [Close("a", abort=True), Done()]
    assert p.error is err and p.done


def test_proxy_rejects_bad_sides_and_data():
    p = ProxyCore()
    with pytest.raises(ValueError):
        p.data("c", b"x")
    with pytest.raises(TypeError):
        p.data("a", "text")
    with pytest.raises(ValueError):
        p.sent("a", -1)
    with pytest.raises(ValueError):
        ProxyCore(relay_limit_bytes=-1)
    assert p.eof("b") == [SendEof("a")]     # one-way: the upstream's EOF is passed on
    assert p.data("a", b"still") == [Send("b", b"still")] and not p.done
    with pytest.raises(RuntimeError):
        p.eof("b")


@FAST
@given(st.data(), st.binary(max_size=300), st.binary(max_size=300), st.booleans())
def test_proxy_output_concatenation_is_chunking_independent(data, a_bytes, b_bytes, two_way):
    p = ProxyCore(two_way=two_way)
    a_chunks = data.draw(chunkings(a_bytes))
    b_chunks = data.draw(chunkings(b_bytes))
    actions = []
    # Interleave the two directions in a drawn order.
    order = data.draw(st.permutations(["a"] * len(a_chunks) + ["b"] * len(b_chunks)))
    ia = ib = 0
    for side in order:
        if side == "a":
            actions += p.data("a", a_chunks[ia]); ia += 1
        else:
            actions += p.data("b", b_chunks[ib]); ib += 1
    actions += p.eof("b") + p.eof("a")
    assert sends(actions, "b") == a_bytes
    assert sends(actions, "a") == (b_bytes if two_way else b"")
    assert actions[-1] == Done() and p.done
    assert SendEof("b") in actions if two_way else SendEof("b") not in actions


def test_proxy_relay_limit_pauses_and_resumes_the_other_side():
    p = ProxyCore(two_way=True, relay_limit_bytes=1000)
    assert p.data("a", b"x" * 1500) == [Send("b", b"x" * 1500)]   # emitting never pauses
    assert p.buffered("b", 1500) == [PauseReading("a")]
    assert p.buffered("b", 1600) == []                                 # once, not per report
    assert p.buffered("b", 600) == []                                  # not yet below half
    assert p.buffered("b", 500) == [ResumeReading("a")]
    assert p.relay_limit_triggers == 1
    # Counting via sent(): pending = asked - sent.
    p.data("b", b"y" * 3000)
    assert p.sent("a", 1000) == [PauseReading("b")]               # 2000 pending
    assert p.sent("a", 1600) == [ResumeReading("b")]              # 400 pending
    assert p.relay_limit_triggers == 2


def test_proxy_relay_limit_never_triggers_with_blocking_sends():
    # The task port: send_all returns when the OS has the bytes, then sent() is reported.
    p = ProxyCore(relay_limit_bytes=16384)
    for _ in range(100):
        for action in p.data("a", b"z" * 65536):
            assert isinstance(action, Send)
            assert p.sent("b", len(action.data)) == []
    assert p.relay_limit_triggers == 0 and p.pending["b"] == 0


def test_proxy_follow_pause_is_the_fixed_proxys_flow_control():
    fixed, naive = ProxyCore(), ProxyCore(follow_pause=False)
    assert fixed.write_paused("b") == [PauseReading("a")]
    assert fixed.write_paused("b") == []                       # an edge, not a level
    assert fixed.write_resumed("b") == [ResumeReading("a")]
    assert naive.write_paused("b") == [] and naive.write_resumed("b") == []


def test_proxy_pause_reasons_combine():
    # Reading a stays paused while either the port or the relay limit holds it.
    p = ProxyCore(relay_limit_bytes=100)
    p.data("a", b"x" * 500)
    assert p.buffered("b", 500) == [PauseReading("a")]
    assert p.write_paused("b") == []
    assert p.buffered("b", 0) == []
    assert p.write_resumed("b") == [ResumeReading("a")]


def test_proxy_reset_aborts_the_other_side_and_clean_close_closes_it():
    assert ProxyCore().closed("a", None) == [Close("b"), Done()]
    assert ProxyCore().closed("a", ConnectionResetError()) == [Close("b", abort=True), Done()]


def test_actions_are_frozen_values():
    import dataclasses
    with pytest.raises(dataclasses.FrozenInstanceError):
        Send("a", b"x").to = "b"
    assert Close("a") == Close("a", abort=False) != Close("a", abort=True)
    assert not hasattr(Done(), "__dict__")          # slots: small and cheap


def test_proxy_relay_limit_does_not_pause_a_side_at_eof():
    p = ProxyCore(two_way=True, relay_limit_bytes=10)
    p.data("a", b"x" * 100)
    p.eof("a")
    assert p.buffered("b", 100) == []


# --------------------------------------------------------------------------- reqresp

def reqresp_outcome(chunks, **kw):
    core = ReqRespCore(**kw)
    out = []
    try:
        for c in chunks:
            out += core.receive(c)
        core.eof()
        return out, None
    except ProtocolError as e:
        return out + e.partial, str(e)


@FAST
@given(st.data(), st.lists(st.binary(max_size=20).filter(lambda b: b"\n" not in b), max_size=40))
def test_reqresp_pipelined_requests_any_chunking(data, bodies):
    stream = b"".join(b"REQ " + b + b"\n" for b in bodies)
    responses, err = reqresp_outcome(data.draw(chunkings(stream)), response_bytes=100)
    assert err is None
    assert len(responses) == len(bodies)
    for i, r in enumerate(responses):
        assert len(r) == 100 and r.startswith(b"RESP %d 100\n" % i)


@FAST
@given(st.data(), st.binary(max_size=120))
def test_reqresp_garbage_same_outcome_for_any_chunking(data, junk):
    stream = b"REQ 1\nREQ 2\n" + junk
    whole = reqresp_outcome([stream], response_bytes=64, max_request_bytes=32)
    assert reqresp_outcome(data.draw(chunkings(stream)), response_bytes=64,
                           max_request_bytes=32) == whole


def test_reqresp_counts_and_bad_lines():
    core = ReqRespCore(response_bytes=64)
    assert len(core.receive(b"REQ a\nREQ b\nREQ")) == 2
    assert len(core.receive(b" c\n")) == 1
    assert core.requests_count == 3
    with pytest.raises(ProtocolError, match=r"byte offset 18 does not start with b'REQ '") as e:
        core.receive(b"GET / HTTP/1.1\r\n")
    assert e.value.offset == 18
    with pytest.raises(ProtocolError, match="already failed"):
        core.receive(b"REQ d\n")


def test_reqresp_bounds_the_request_buffer():
    core = ReqRespCore(response_bytes=64, max_request_bytes=16)
    assert core.receive(b"REQ " + b"x" * 10) == []
    with pytest.raises(ProtocolError, match="longer than max_request_bytes=16"):
        core.receive(b"x" * 1000)        # no newline: rejected without waiting for one
    core = ReqRespCore(response_bytes=64, max_request_bytes=16)
    assert len(core.receive(b"REQ " + b"x" * 11 + b"\n")) == 1    # exactly 16 is fine


@pytest.mark.parametrize("line", [b"\n", b"RE\n", b"REQ\n", b"req 1\n"])
def test_reqresp_rejects_short_or_wrong_prefix_lines(line):
    for chunks in ([line], [bytes([b]) for b in line]):
        core = ReqRespCore(response_bytes=64)
        with pytest.raises(ProtocolError, match="does not start with b'REQ '"):
            for c in chunks:
                core.receive(c)


def test_reqresp_never_holds_more_than_max_request_bytes():
    # 16 bytes without a newline can only become a 17+ byte line: reject now,
    # fed whole or a byte at a time.
    line = b"REQ " + b"x" * 12
    for chunks in ([line], [bytes([b]) for b in line]):
        core = ReqRespCore(response_bytes=64, max_request_bytes=16)
        with pytest.raises(ProtocolError, match="longer than max_request_bytes=16") as e:
            for c in chunks:
                core.receive(c)
        assert e.value.offset == 0
    core = ReqRespCore(response_bytes=64, max_request_bytes=16)
    assert core.receive(b"REQ " + b"x" * 11) == []      # 15 bytes: may still end well


def test_reqresp_truncated_request_at_eof_and_bad_arguments():
    core = ReqRespCore(response_bytes=64)
    core.receive(b"REQ 1\nREQ 2")
    with pytest.raises(ProtocolError, match="truncated request: 5 bytes .* offset 6"):
        core.eof()
    with pytest.raises(ValueError, match="response_bytes"):
        ReqRespCore(response_bytes=10)
    with pytest.raises(TypeError):
        ReqRespCore(response_bytes=64).receive("REQ 1\n")


# --------------------------------------------------------------------------- push

def test_push_unbounded_always_enqueues():
    core = PushCore("unbounded", queue_limit=2)
    core.add_client("h")
    core.add_client("s")
    for _ in range(10):
        assert core.broadcast(b"m") == [Enqueue("h", b"m"), Enqueue("s", b"m")]
    assert core.sent_count == {"h": 10, "s": 10} and core.dropped_count == 0


def test_push_block_waits_for_a_full_client_in_turn():
    core = PushCore("block", queue_limit=2)
    core.add_client("h")
    core.add_client("s")
    assert core.broadcast(b"1") == [Send("h", b"1"), Send("s", b"1")]
    core.backlog("h", 0)
    assert core.broadcast(b"2") == [Send("h", b"2"), Send("s", b"2")]
    core.backlog("h", 0)
    # "s" now has 2 pending: the broadcaster must wait for it before sending.
    assert core.broadcast(b"3") == [Send("h", b"3"), Block("s"), Send("s", b"3")]
    assert core.blocked_count == 1
    core.backlog("s", 0)
    core.backlog("h", 0)
    assert core.broadcast(b"4") == [Send("h", b"4"), Send("s", b"4")]


def test_push_block_with_zero_limit_waits_every_time():
    core = PushCore("block", queue_limit=0)
    core.add_client(1)
    assert core.broadcast(b"x") == [Block(1), Send(1, b"x")]


def test_push_drop_policy_s6_shape():
    # One healthy client (reports an empty queue after each message), one stalled.
    core = PushCore("drop", queue_limit=16)
    core.add_client("healthy")
    core.add_client("stalled")
    got = {"healthy": 0, "stalled": 0}
    for _ in range(100):
        for action in core.broadcast(b"m" * 10):
            if isinstance(action, Enqueue):
                got[action.to] += 1
            else:
                assert action == Drop("stalled")
        core.backlog("healthy", 0)
    assert got == {"healthy": 100, "stalled": 16}
    assert core.dropped_count == 84 == core.dropped_by_client["stalled"]
    core.backlog("stalled", 15)            # the client read one message
    assert Enqueue("stalled", b"n") in core.broadcast(b"n")


def test_push_disconnect_policy_forgets_the_client():
    core = PushCore("disconnect", queue_limit=3)
    core.add_client("h")
    core.add_client("s")
    actions = []
    for _ in range(6):
        actions += core.broadcast(b"m")
        core.backlog("h", 0)
    assert actions.count(Disconnect("s")) == 1
    assert core.disconnected_count == 1 and core.clients == ["h"]
    assert core.sent_count == {"h": 6, "s": 3}
    core.backlog("s", 3)        # a late report from the driver: accepted, ignored
    core.remove_client("s")     # the driver's connection_lost: accepted
    with pytest.raises(ValueError, match="unknown client"):
        core.remove_client("s")
    core.add_client("s")        # reconnecting with the same id works
    assert Enqueue("s", b"x") in core.broadcast(b"x")


def test_push_rejects_bad_use():
    with pytest.raises(ValueError, match="unknown push policy 'fifo'.*unbounded"):
        PushCore("fifo")
    with pytest.raises(ValueError):
        PushCore("drop", queue_limit=0)
    core = PushCore("drop")
    core.add_client(1)
    with pytest.raises(ValueError, match="already added"):
        core.add_client(1)
    with pytest.raises(ValueError, match="unknown client"):
        core.backlog(2, 0)
    with pytest.raises(ValueError):
        core.backlog(1, -1)
    with pytest.raises(TypeError):
        core.broadcast("text")


@settings(max_examples=100, deadline=None)
@given(n=st.integers(0, 30), cuts=st.lists(st.integers(0, 400), max_size=8))
def test_reqresp_lazy_answers_equal_eager_ones(n, cuts):
    """requests() + respond() (what a backpressured server uses) gives exactly what
    receive() gives, for any chunking -- without building unanswered responses."""
    stream = b"".join(b"REQ %d\n" % i for i in range(n))
    points = sorted({min(c, len(stream)) for c in cuts})
    chunks = [stream[a:b] for a, b in zip([0] + points, points + [len(stream)])]
    eager, lazy = ReqRespCore(64), ReqRespCore(64)
    got_eager = [r for c in chunks for r in eager.receive(c)]
    pending = sum(lazy.requests(c) for c in chunks)
    assert pending == n and lazy.requests_count == 0     # nothing built yet
    assert [lazy.respond() for _ in range(pending)] == got_eager
