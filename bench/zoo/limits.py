"""Zoo entries about flow-control limits and what a transport's buffer costs.

The write loops and limits of CPython 116279 / 127655 and asyncio 140, CPython 146507
(an O(n) buffer size under write pressure) and uvloop 548 (memory kept after
connection_lost).
"""
from __future__ import annotations

import gc
import time

from bench import peers
from bench.scenarios.api import Metric, run_program
from bench.zoo.harness import (_CAP, KiB, MiB, SOCKBUF, _by_style, _callback, _notes, _open,
                                _presets, _rss, _stream)
from bench.zoo.registry import Entry, Flip, _add


# ---------------------------------------------------------------------------
# Write loops and flow control: CPython 116279, 127655; asyncio 140

def _flood_stream(mode):
    """mode: 'sleep0' (116279), 'writelines' (127655)."""
    def program(job):
        p = job.params
        fixed = job.variant == "fixed"

        async def main(port, out):
            reader, writer = await _open(port, job.peer("reader"))
            t = writer.transport
            chunk, peak, n = bytes(p["chunk_bytes"]), 0, 0
            while n < p["total_bytes"]:
                if mode == "writelines" and not fixed:
                    writer.writelines([chunk[: len(chunk) // 2], chunk[len(chunk) // 2:]])
                else:
                    writer.write(chunk)
                n += len(chunk)
                peak = max(peak, t.get_write_buffer_size())
                if mode == "sleep0" and not fixed:
                    await port.sleep(0)
                else:
                    await writer.drain()
            writer.close()
            await writer.wait_closed()
            out.update(peak_buffer_bytes=peak, high_water_bytes=t.get_write_buffer_limits()[1])
        return _stream(job, main, p["max_s"])
    return program


def _flood_cb(mode):
    def program(job):
        p = job.params
        fixed = job.variant == "fixed"

        def start(port, t, proto, out):
            st = {"n": 0, "peak": 0}
            chunk = bytes(p["chunk_bytes"])

            def step():
                if st["n"] >= p["total_bytes"]:
                    out.update(peak_buffer_bytes=st["peak"], high_water_bytes=t.get_write_buffer_limits()[1])
                    proto.on_lost = port.stop
                    t.close()
                    return
                if proto.paused and (fixed or mode == "writelines"):
                    proto.on_resume = step          # honour flow control
                    return
                if mode == "writelines" and not fixed:
                    t.writelines([chunk[: len(chunk) // 2], chunk[len(chunk) // 2:]])
                else:
                    t.write(chunk)
                st["n"] += len(chunk)
                st["peak"] = max(st["peak"], t.get_write_buffer_size())
                port.call_soon(step)
            step()
        return _callback(job, job.peer("reader"), start, p["max_s"])
    return program


def _run_flood(ctx):
    p = ctx.params
    ran = run_program(ctx, max_s=p["max_s"] + 2, peers=[peers.reader(
        sockbuf=SOCKBUF, start_after_s=p["start_after_s"], max_s=p["max_s"])])
    peak, high = ran.app.get("peak_buffer_bytes"), ran.app.get("high_water_bytes") or 64 * KiB
    m = {"peak_buffer_bytes": peak, "delivered_bytes": ran.peers["reader"].get("received_bytes")}
    return m, {"bug_shown": peak is not None and peak > high + 4 * p["chunk_bytes"]}, _notes(ran.app)


_FLOOD_METRICS = [Metric("peak_buffer_bytes", "lower", "write buffer peak"),
                  Metric("delivered_bytes", None, "delivered")]

_add(Entry(
    id="cpython-116279", aliases=("C14",), catalog="S1",
    verified="read the thread (2024-03, a feature request: write(); sleep(0) to a slow "
             "reader fills memory; closed) which points to the flow-control callbacks of "
             "81162",
    decided_by=("peak_buffer_bytes",),
    title="a write loop with sleep(0) but no drain(): memory climbs",
    link="https://github.com/python/cpython/issues/116279",
    mechanism="`await asyncio.sleep(0)` lets other tasks run but waits for nothing, so a loop "
              "of write(); sleep(0) to a slow reader queues everything in the transport. Only "
              "drain() (or honouring pause_writing) ties the writer to the socket.",
    reported="Python 3.12 (a user report; the behaviour is as old as asyncio)",
    fixed_in="not a library bug: await writer.drain() after each write",
    expected="shown on every callback and stream runtime; the task port has no buffer to fill",
    oracle="bug shown when the write buffer peaks above high water + 4 writes",
    styles=("callback", "stream"),
    show_on=("hybrid", "asyncio-streams", "callback")),
    _run_flood, _FLOOD_METRICS,
    _presets({"total_bytes": 2 * MiB, "chunk_bytes": 32 * KiB, "start_after_s": 0.4, "max_s": 8}),
    _by_style(_flood_cb("sleep0"), _flood_stream("sleep0")))

_add(Entry(
    id="cpython-127655", aliases=("GHSA-fw89-6wjj-8j95", "C12"),
    stand_in="callback:writelines=unchecked, hybrid:writelines=unchecked",
    verified="read PR 127656 (bdraco: the selector transport's writelines, 3.12+ only since "
             "it exists only from 3.12, did not pause the protocol; a security NEWS entry); "
             "the 3.12.9/3.13.2 releases are from the advisory, not re-checked; measured with "
             "--versions: shown on 3.12.1 and 3.13.0 (buffer peak 885 kB against 98 kB), "
             "not on 3.11.7",
    decided_by=("peak_buffer_bytes",),
    title="writelines() skipped the flow-control check",
    link="https://github.com/python/cpython/issues/127655",
    mechanism="On 3.12 and 3.13 the selector transport's writelines() appended to the buffer "
              "without calling the pause check that write() makes. A writer using writelines() "
              "and drain() was never paused, so its buffer grew without bound.",
    reported="Python 3.12.0-3.12.8, 3.13.0-3.13.1",
    fixed_in="Python 3.12.9, 3.13.2 (security advisory GHSA-fw89-6wjj-8j95)",
    expected="not shown on the installed Python 3.11 (writelines joins and calls write) nor on "
             "our kernels at their defaults; shown with callback:writelines=unchecked and "
             "hybrid:writelines=unchecked",
    oracle="bug shown when a writelines()+drain() writer's buffer peaks above high water + 4 writes",
    styles=("callback", "stream"), affects={"python": ("3.12.0", "3.12.9")},
    flips=(Flip("callback:writelines=unchecked", True,
                "our callback kernel whose writelines() buffers without the pause check, as "
                "Python 3.12.0-3.12.8 did"),
           Flip("hybrid:writelines=unchecked", True, "the same on the stream kernel")),
    show_on=("callback:writelines=unchecked", "hybrid:writelines=unchecked"),
    affected_versions=("python>=3.12.0,<3.12.9", "python>=3.13.0,<3.13.2"),
    fixed_versions=("python>=3.12.9,<3.13", "python>=3.13.2"), unaffected_versions=("python<3.12",)),
    _run_flood, _FLOOD_METRICS,
    _presets({"total_bytes": 1 * MiB, "chunk_bytes": 32 * KiB, "start_after_s": 0.4, "max_s": 8}),
    _by_style(_flood_cb("writelines"), _flood_stream("writelines")))


def _limits_cb(job):
    p = job.params
    fixed = job.variant == "fixed"

    def start(port, t, proto, out):
        def fill():
            # Write until the kernel buffers are full and some bytes wait in user space,
            # then a bit more: the buffer ends below the default high-water mark.
            for _ in range(_CAP):
                if t.get_write_buffer_size() or t.is_closing():
                    break
                t.write(bytes(8 * KiB))
            t.write(bytes(p["extra_bytes"]))
            before = t.get_write_buffer_size()
            paused_before = proto.paused
            t.set_write_buffer_limits(high=p["new_high"])
            held = proto.paused or (fixed and t.get_write_buffer_size() > p["new_high"])
            out.update(buffer_at_lowering_bytes=before, paused_before=paused_before,
                       went_ahead=not held and t.get_write_buffer_size() > p["new_high"])
            t.abort()
            port.stop()
        port.call_later(0.05, fill)
    return _callback(job, job.peer("reader"), start, p["max_s"])


def _limits_stream(job):
    p = job.params
    fixed = job.variant == "fixed"

    async def main(port, out):
        reader, writer = await _open(port, job.peer("reader"))
        t = writer.transport
        await port.sleep(0.05)
        for _ in range(_CAP):
            if t.get_write_buffer_size() or t.is_closing():
                break
            writer.write(bytes(8 * KiB))
        writer.write(bytes(p["extra_bytes"]))
        before = t.get_write_buffer_size()
        t.set_write_buffer_limits(high=p["new_high"])
        # drain() is the gate the program writes behind; it waits only if paused.
        try:
            await port.wait_for(writer.drain(), 0.2)
            drained_at_once = True
        except TimeoutError:
            drained_at_once = False
        held = not drained_at_once or (fixed and t.get_write_buffer_size() > p["new_high"])
        out.update(buffer_at_lowering_bytes=before,
                   went_ahead=not held and t.get_write_buffer_size() > p["new_high"])
        t.abort()
    return _stream(job, main, p["max_s"])


def _run_limits(ctx):
    p = ctx.params
    ran = run_program(ctx, max_s=p["max_s"] + 2, peers=[peers.reader(
        sockbuf=SOCKBUF, start_after_s=1.0, max_s=p["max_s"])])
    m = {"buffer_at_lowering_bytes": ran.app.get("buffer_at_lowering_bytes"),
         "went_ahead": ran.app.get("went_ahead")}
    return m, {"bug_shown": bool(ran.app.get("went_ahead"))}, _notes(ran.app)


_add(Entry(
    id="asyncio-140", aliases=("C20",),
    decided_by=("went_ahead",),
    title="lowering the write-buffer limits below the current size did not pause",
    link="https://github.com/python/asyncio/issues/140",
    mechanism="set_write_buffer_limits() stored the new marks but did not re-check the buffer "
              "against them. A writer that lowered its high-water mark below what was already "
              "buffered was not paused until its next write.",
    reported="asyncio (Tulip) 0.3.1, February 2014, before Python 3.4.0 (Guido's remark on "
             "the list, filed by gjcarneiro)",
    fixed_in="asyncio 0.4.1 (2014-02-24), so Python 3.4.0 (2014-03-16) shipped the fix: "
             "set_write_buffer_limits() calls _maybe_pause_protocol()",
    expected="not shown on the installed Python, uvloop or our kernels at their defaults; "
             "shown with callback:limits_recheck=false and hybrid:limits_recheck=false (our "
             "kernels without the pause check; no Python release had the bug)",
    oracle="bug shown when, right after lowering the mark below the buffered size, the "
           "program's gate (pause_writing / drain) let it write on",
    styles=("callback", "stream"),
    flips=(Flip("callback:limits_recheck=false", True,
                "our callback kernel storing the marks without the pause check (what Tulip "
                "0.3.1 did)"),
           Flip("hybrid:limits_recheck=false", True, "the same on our stream kernel")),
    show_on=("callback:limits_recheck=false", "hybrid:limits_recheck=false"),
    stand_in="callback:limits_recheck=false, hybrid:limits_recheck=false",
    affected_versions=("asyncio==0.3.1",), fixed_versions=("asyncio==0.4.1", "python>=3.4.0"),
    not_run={req: "Tulip (asyncio on PyPI) 0.3.1 and 0.4.1 install into Python 3.3 only, which "
                 "is not installed here (pyenv has 3.6 to 3.13); Python 3.4.0 shipped the fix"
             for req in ("asyncio==0.3.1", "asyncio==0.4.1")},
    verified="read the thread (the description quotes the bug); read set_write_buffer_limits() "
             "in the asyncio repository at tags 0.3.1 (no pause check) and 0.4.1 (with it)"),
    _run_limits,
    [Metric("buffer_at_lowering_bytes", None, "buffered when lowered"),
     Metric("went_ahead", None, "writer went ahead", unit="flag")],
    _presets({"extra_bytes": 24 * KiB, "new_high": 4 * KiB, "max_s": 5}),
    _by_style(_limits_cb, _limits_stream))


# ---------------------------------------------------------------------------
# CPython 146507: an O(n) get_write_buffer_size() under write pressure

def _cost_program(job):
    p = job.params
    n, group = p["writes"], p["group"]
    chunk = bytes(p["chunk_bytes"])

    coalesce = job.variant == "fixed"

    def measure(t, write):
        times = []
        for g in range(n // group):
            t0 = time.perf_counter()
            if coalesce:        # the fix on the application side: one write per batch
                write(b"".join([chunk] * group))
                t.get_write_buffer_size()
            else:
                for _ in range(group):
                    write(chunk)
                    t.get_write_buffer_size()
            times.append(time.perf_counter() - t0)
        first, last = sorted(times[:3])[1], sorted(times[-3:])[1]
        return {"cost_ratio_fraction": last / first if first else None,
                "chunks_buffered_count": n, "buffer_bytes": t.get_write_buffer_size()}

    if job.runtime.style == "callback":
        def start(port, t, proto, out):
            out.update(measure(t, t.write))
            t.abort()
            port.stop()
        return _callback(job, job.peer("reader"), start, p["max_s"])

    async def main(port, out):
        reader, writer = await _open(port, job.peer("reader"))
        out.update(measure(writer.transport, writer.write))
        writer.transport.abort()
    return _stream(job, main, p["max_s"])


def _run_cost(ctx):
    p = ctx.params
    ran = run_program(ctx, max_s=p["max_s"] + 2, peers=[peers.reader(
        sockbuf=SOCKBUF, start_after_s=0.5, max_s=p["max_s"])])
    r = ran.app.get("cost_ratio_fraction")
    notes = _notes(ran.app)
    if ctx.variant == "fixed":
        notes.append("fixed: the same bytes coalesced into one write per batch of messages")
    return ({"cost_ratio_fraction": r, "buffer_bytes": ran.app.get("buffer_bytes")},
            {"bug_shown": r is not None and r > p["ratio"]}, notes)


_add(Entry(
    id="cpython-146507", aliases=("C15",),
    stand_in="callback:write_buffer=deque",
    verified="read the thread (2026-03: get_write_buffer_size() sums the deque on every "
             "write, ~90% CPU in an aiohttp WebSocket server) and PR 146518 (a running "
             "_buffer_size); the deque came with PR 31871 (GH-91166); measured with "
             "--versions: shown on 3.12.1 and 3.13.0, not on 3.11.7",
    decided_by=("cost_ratio_fraction",),
    title="get_write_buffer_size() summed a deque on every write: O(n^2) under pressure",
    link="https://github.com/python/cpython/issues/146507",
    mechanism="The selector transport's write buffer became a deque of chunks, and "
              "get_write_buffer_size() (called by the pause check after every write) summed "
              "it each time. When small chunks pile up faster than they drain, each write "
              "costs more than the last.",
    reported="Python 3.12 and later (the deque buffer)",
    fixed_in="a running total (CPython PR 146518, 2026); on the application side, coalesce "
             "small messages into fewer writes",
    expected="not shown on the installed Python 3.11 (one bytearray) nor on our kernels "
             "(a bytearray, O(1) len); shown with callback:write_buffer=deque (3.12's deque, "
             "summed on every write; hybrid:write_buffer=deque is the same transport: add it "
             "with --knob write_buffer=deque)",
    oracle="bug shown when a group of writes late in the run costs more than "
           "`ratio` x a group at the start (a scaling ratio, not a wall-clock limit)",
    styles=("callback", "stream"), affects={"python": ("3.12.0", None)},
    flips=(Flip("callback:write_buffer=deque", True,
                "our callback kernel with a deque of chunks whose size is summed on every "
                "write, as Python 3.12+ has"),),
    show_on=("callback:write_buffer=deque",),
    affected_versions=("python>=3.12.0",), unaffected_versions=("python<3.12",),
    real_only="its oracle is the CPU time each write costs (time.perf_counter), which the "
              "simulated network neither models nor replays from a seed; the network plays no "
              "part in it"),
    _run_cost,
    [Metric("cost_ratio_fraction", "lower", "late/early cost"), Metric("buffer_bytes", None, "buffered")],
    _presets({"writes": 6000, "group": 300, "chunk_bytes": 100, "ratio": 5.0, "max_s": 20},
             {"writes": 12000, "group": 600, "chunk_bytes": 100, "ratio": 5.0, "max_s": 20}),
    _by_style(_cost_program, _cost_program))


# ---------------------------------------------------------------------------
# uvloop 548: buffer memory kept after connection_lost

def _memory_program(job):
    p = job.params
    fixed = job.variant == "fixed"
    size = p["flood_bytes"]

    def start(port, t, proto, out):
        gc.collect()
        out["rss_before_bytes"] = _rss()
        st = {"n": 0}

        def flood():
            while st["n"] < size and not proto.lost and not (fixed and proto.paused):
                t.write(bytes(256 * KiB))
                st["n"] += 256 * KiB
            if fixed and proto.paused and st["n"] < size:
                proto.on_resume = flood
            out["buffered_peak_bytes"] = max(out.get("buffered_peak_bytes", 0), t.get_write_buffer_size())

        def after_lost():
            out["buffered_at_loss_bytes"] = out.get("buffered_peak_bytes", 0)
            port.call_later(0.2, measure)

        def measure():
            gc.collect()
            out["rss_kept_bytes"] = _rss() - out["rss_before_bytes"]
            port.stop()
        proto.on_lost = after_lost
        flood()
    return _callback(job, job.peer("reset"), start, p["max_s"])


def _run_memory(ctx):
    p = ctx.params
    # The client takes one byte and resets: the flood is already buffered by then.
    ran = run_program(ctx, max_s=p["max_s"] + 2, peers=[peers.reset_peer(
        listen="127.0.0.1:0", after_bytes=1, sockbuf=SOCKBUF, max_s=p["max_s"])])
    kept, peak = ran.app.get("rss_kept_bytes"), ran.app.get("buffered_peak_bytes")
    m = {"rss_kept_bytes": kept, "buffered_peak_bytes": peak}
    shown = kept is not None and kept > p["flood_bytes"] // 2
    return m, {"bug_shown": shown}, _notes(ran.app)


_add(Entry(
    id="uvloop-548", aliases=("C16",),
    decided_by=("rss_kept_bytes",),
    title="transport buffer memory not released after connection_lost",
    link="https://github.com/MagicStack/uvloop/issues/548",
    mechanism="A protocol floods transport.write() to a client that stops reading; the client "
              "goes away. The reporter saw the process's memory stay resident after "
              "connection_lost on uvloop, where asyncio freed it at once; the thread never "
              "found why (uvloop holding the buffer, or the allocator keeping freed memory).",
    reported="uvloop 0.17.0 (Python 3.11.4), one report, not diagnosed",
    fixed_in="open in the thread, no diagnosis; the installed uvloop is measured",
    expected="asyncio and our callback kernel release the buffer at once; the installed "
             "uvloop is measured (0.23.0 here: released); callback:buffer_on_loss=keep shows "
             "the reported behaviour; honouring pause_writing never builds the buffer in the "
             "first place",
    oracle="bug shown when, 0.2 s after connection_lost and a gc, the process still holds "
           "more than half the flooded bytes above its starting RSS",
    styles=("callback",), affects={"uvloop": ("0.17.0", None)},
    flips=(Flip("callback:buffer_on_loss=keep", True,
                "our kernel keeping the lost transport's buffer referenced: one possible cause "
                "of what was reported, not a diagnosis of uvloop"),),
    show_on=("callback:buffer_on_loss=keep",),
    stand_in="callback:buffer_on_loss=keep (a hypothesis, not uvloop 0.17)",
    affected_versions=("uvloop==0.17.0",), fixed_versions=(),
    verified="read the thread (the reporter's malloc-bomb program and observation; no "
             "maintainer reply, open); aiohttp 6762 shows how resident memory after a flood "
             "turned out to be fragmentation there; measured with --versions: not shown on "
             "the real uvloop 0.17.0 either, so the stand-in's hypothesis is not what 0.17.0 "
             "does at this size",
    real_only="its oracle is the process's resident memory after connection_lost; on the "
              "simulated network the program, the world and its peers share one process, and "
              "memory is not part of a universe"),
    _run_memory,
    [Metric("rss_kept_bytes", "lower", "RSS kept after loss"),
     Metric("buffered_peak_bytes", None, "buffered at peak")],
    _presets({"flood_bytes": 48 * MiB, "max_s": 8}),
    {"callback": _memory_program})
