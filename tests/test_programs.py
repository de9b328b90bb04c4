"""The S3/S7/S8 client programs against a real peer in another process.

Ground truth is the peer's count (the ``bench.peers`` ``reader`` role);
the program's own report is checked against it where the two must agree (the
bytes a runtime lost at exit are exactly what its exit report says it dropped).
Sizes are small (1-2 MB), the reader starts 0.3 s late so a shutdown finds bytes
in flight, and every peer and program is bounded in time.
"""
from __future__ import annotations

import json

import pytest

from bench.scenarios import programs
from bench.errors import CRASH_KEY
from bench.peers import PeerProcess
from bench import runtimes

SOCKBUF = 64 * 1024
TOTAL = 2_000_000




def _require(spec: str) -> None:
    rt = runtimes.parse(spec)
    reason = rt.unavailable_reason()
    if reason:
        pytest.skip(reason)


def _run(program, spec, *args, start_after_s=0.3, rate_Bps=None, max_s=8.0, **kw):
    """Run ``program`` against one ``reader`` peer (starting late, or slow);
    returns (program result, peer result). Ports the 2016 shape held are
    released after the peer has reported."""
    _require(spec)
    peer = {"name": "peer", "role": "reader", "listen": "127.0.0.1:0", "sockbuf": SOCKBUF,
            "start_after_s": start_after_s, "rate_Bps": rate_Bps, "max_s": max_s}
    try:
        with PeerProcess([peer], timeout_s=max_s + 5) as peers:
            out = program(spec, peers.address("peer"), *args, sockbuf=SOCKBUF, **kw)
            got = peers.results()["peer"]
    finally:
        programs.release_held()
    assert "error" not in out, out
    assert "error" not in got, got
    json.dumps(out)                 # it crosses a process boundary as JSON
    return out, got


# ---------------------------------------------------------------------------
# S3

@pytest.mark.parametrize("spec", ["asyncio-streams", "uvloop-streams", "hybrid",
                                  "asyncio-protocol", "callback"])
def test_s3_naive_loses_exactly_what_was_buffered(spec):
    out, got = _run(programs.s3_shutdown, spec, TOTAL, "naive")
    assert out["bytes_accepted"] == TOTAL           # write() took everything...
    assert got["received_bytes"] < TOTAL            # ...the peer did not get it
    assert got["ended"] == "eof"
    # The loss is exactly what sat in user space when the loop ended.
    assert got["received_bytes"] + out["exit_report"]["unsent_bytes"] == TOTAL


@pytest.mark.parametrize("spec,variant", [
    ("asyncio-streams", "fixed"), ("asyncio-streams", "limits0"), ("hybrid", "fixed"),
    ("asyncio-protocol", "fixed"), ("callback", "fixed"),
    ("curio", "naive"), ("trio", "naive"), ("coro", "naive")])
def test_s3_variants_that_lose_nothing(spec, variant):
    out, got = _run(programs.s3_shutdown, spec, TOTAL, variant)
    assert got["received_bytes"] == TOTAL
    assert got["ended"] == "eof"
    assert not out["exit_report"].get("unsent_bytes")


def test_s3_task_port_variants_are_the_same_code():
    out, got = _run(programs.s3_shutdown, "trio", TOTAL, "stop-2016")
    assert got["received_bytes"] == TOTAL
    assert out["note"] == programs.SAME_CODE_NOTE and not out["held_open"]


@pytest.mark.parametrize("spec", ["asyncio-streams", "asyncio-protocol"])
def test_s3_2016_shape_delivers_everything_but_never_closes(spec):
    # The reader gives up after 2.5 s: while the program's loop sits stopped and
    # unclosed, every byte arrives (limits 0 + drain) but EOF never does.
    out, got = _run(programs.s3_shutdown, spec, TOTAL, "stop-2016", max_s=2.5)
    assert out["held_open"] is True
    assert got["received_bytes"] == TOTAL
    assert got["ended"] == "timeout"
    assert programs.HELD == []          # _run released it


def test_s3_release_held_closes_the_stopped_loop():
    _require("asyncio-streams")
    with PeerProcess([{"name": "peer", "role": "reader", "listen": "127.0.0.1:0",
                       "sockbuf": SOCKBUF, "max_s": 5.0}], timeout_s=10) as peers:
        try:
            programs.s3_shutdown("asyncio-streams", peers.address("peer"), 200_000, "stop-2016")
            assert len(programs.HELD) == 1
        finally:
            assert programs.release_held() == 1
        got = peers.results()["peer"]
    # Released: the pending close finally ran, so the peer saw EOF well before max_s.
    assert got["ended"] == "eof" and got["received_bytes"] == 200_000


# ---------------------------------------------------------------------------
# S7

@pytest.mark.parametrize("spec", ["asyncio-streams", "hybrid"])
def test_s7_stream_timeout_is_a_zombie_write(spec):
    total = 1_500_000
    out, got = _run(programs.s7_timeout, spec, total, 0.2, rate_Bps=1 << 20, start_after_s=0.0)
    assert out["timed_out"] is True
    assert out["sent_at_timeout_bytes"] < total
    assert got["received_bytes"] == total           # delivered anyway, after the timeout


@pytest.mark.parametrize("spec", ["curio", "coro", "trio"])
def test_s7_task_timeout_stops_the_write(spec):
    total = 1_500_000
    out, got = _run(programs.s7_timeout, spec, total, 0.2, rate_Bps=1 << 20, start_after_s=0.0)
    assert out["timed_out"] is True
    assert got["received_bytes"] < total
    if spec == "trio":
        assert out["bytes_sent_known"] is None      # trio's Cancelled carries no count
    else:
        # curio and coro say exactly how far the send got.
        assert out["bytes_sent_known"] == got["received_bytes"]


# ---------------------------------------------------------------------------
# S8

def test_s8_trio_nursery_delivers_everything():
    out, got = _run(programs.s8_background, "trio", TOTAL)
    assert got["received_bytes"] == TOTAL and got["ended"] == "eof"
    assert out["background_finished"] is True


@pytest.mark.parametrize("spec", ["curio", "coro"])
def test_s8_unjoined_spawn_loses_silently(spec):
    out, got = _run(programs.s8_background, spec, TOTAL)
    assert got["received_bytes"] < TOTAL
    assert out["background_finished"] is False
    assert out["warnings"] == []                    # cancelled without a word


@pytest.mark.parametrize("spec", ["asyncio-streams", "hybrid", "asyncio-protocol", "callback"])
def test_s8_callback_and_stream_lose_what_was_buffered(spec):
    out, got = _run(programs.s8_background, spec, TOTAL)
    assert got["received_bytes"] < TOTAL
    assert out["background_sent_bytes"] < TOTAL
    assert got["received_bytes"] + out["exit_report"]["unsent_bytes"] == out["bytes_accepted"]


# ---------------------------------------------------------------------------
# Input checking and output capture (no peer needed)

def test_bad_input_is_a_clear_error():
    addr = ("127.0.0.1", 9)
    with pytest.raises(ValueError, match="valid variants: naive"):
        programs.s3_shutdown("asyncio-streams", addr, 10, "sloppy")
    with pytest.raises(TypeError, match="addr"):
        programs.s3_shutdown("asyncio-streams", "127.0.0.1:9", 10, "naive")
    with pytest.raises(ValueError, match="total_bytes"):
        programs.s7_timeout("trio", addr, 0)
    with pytest.raises(ValueError, match="timeout_s"):
        programs.s7_timeout("trio", addr, 10, timeout_s=-1)
    with pytest.raises(runtimes.UsageError):
        programs.s8_background("nosuch", addr, 10)


def test_refused_connection_is_reported_not_raised():
    _require("asyncio-streams")
    sock = runtimes.bind_listener()
    addr = sock.getsockname()
    sock.close()                                    # nobody listens there now
    for spec in ("asyncio-streams", "asyncio-protocol", "trio"):
        out = programs.s3_shutdown(spec, addr, 10_000, "naive", max_s=5)
        # under the namespaced crash key: the cell is an error, "error" stays free for data
        assert "ConnectionRefused" in out[CRASH_KEY] and "error" not in out, (spec, out)


def test_capture_output_collects_warnings_logs_and_stderr():
    import logging
    import sys
    import warnings
    with programs.capture_output() as captured:
        warnings.warn("unclosed thing", ResourceWarning)
        logging.getLogger("asyncio").error("Task was destroyed but it is pending!")
        print("a kernel's one-line report", file=sys.stderr)
    assert "ResourceWarning: unclosed thing" in captured.lines
    assert "ERROR asyncio: Task was destroyed but it is pending!" in captured.lines
    assert "a kernel's one-line report" in captured.lines
