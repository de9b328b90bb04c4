"""The callback kernel's options, declared once: ``Loop(**options)`` validates
with them, and so do the runtime specs, ``looplab list runtimes`` and the
asyncio loop (``aioloop.LOOP_OPTIONS``, the same rows)."""
from __future__ import annotations

from ..options import EXIT, TRACE, Option, Schema, boolean, choice, nbytes

__all__ = ["OPTIONS"]


def _water_marks(values, given):
    # asyncio's rule for a transport's limits, applied to the loop-wide defaults
    if "high_water" in given and "low_water" not in given:
        values["low_water"] = values["high_water"] // 4
    elif "low_water" in given and "high_water" not in given:
        values["high_water"] = max(values["high_water"], 4 * values["low_water"])
    if values["low_water"] > values["high_water"]:
        raise ValueError(f"low_water ({values['low_water']}) must not exceed "
                         f"high_water ({values['high_water']})")


OPTIONS = Schema("callback", (
    Option("high_water", 65536, nbytes,
           "pause_writing above this many buffered bytes (default of every transport)"),
    Option("low_water", 16384, nbytes,
           "resume_writing at or below this (only high given: high // 4)"),
    Option("write", "try-send", choice("try-send", "defer"),
           "try-send: send at once, buffer the rest (asyncio); defer: always buffer (Twisted)"),
    Option("write_after_close", "flush-if-buffered", choice("flush-if-buffered", "drop"),
           "a write() after close(): flush-if-buffered: sent with the bytes still buffered "
           "(asyncio 3.11, 3.12.9+); drop: dropped and counted (3.12.0-3.12.8, CPython 115514)"),
    Option("limits_recheck", True, boolean,
           "true: set_write_buffer_limits() pauses at once when the buffer is already above "
           "the new high mark (asyncio 3.4.1+); false: it only stores the marks (asyncio 140)"),
    Option("writelines", "checked", choice("checked", "unchecked"),
           "checked: writelines() makes write()'s pause check (3.11); unchecked: it buffers "
           "without it (3.12.0-3.12.8, CPython 127655)"),
    Option("write_buffer", "bytearray", choice("bytearray", "deque"),
           "bytearray: one buffer with an O(1) size (asyncio 3.11); deque: a deque of chunks "
           "whose size is summed on every write's pause check (3.12+, CPython 146507)"),
    Option("buffer_on_loss", "free", choice("free", "keep"),
           "free: a lost or aborted transport drops its write buffer at once (asyncio); keep: "
           "the bytes are lost but their memory is held until the loop goes away (uvloop 548)"),
    EXIT, TRACE,
), check=_water_marks)
