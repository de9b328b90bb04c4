"""Zoo entries about drain() and the tasks around it.

asyncio 263 (drain on a dead transport), CPython 74116 (two tasks draining one writer),
curio 164 (spawn order), uvloop 631 (a deferred small write), uvicorn 336 (a task parked
in drain), home-assistant 89905 (a drain limit that is too strict) and trio 1626 (a send
under fail_after(0)).
"""
from __future__ import annotations

from bench import peers
from bench.scenarios.api import Metric, Minimum, observe, run_program, sometimes
from bench.zoo.harness import (_CAP, KiB, SOCKBUF, _block, _by_style, _callback, _notes, _now,
                                _open, _open_task, _presets, _stream, _task, _unless_cut)
from bench.zoo import releases
from bench.zoo.registry import Entry, Flip, _add


# ---------------------------------------------------------------------------
# asyncio 263: drain() that never yields on a dead transport

def _spin_stream(job):
    p = job.params
    fixed = job.variant == "fixed"

    async def main(port, out):
        reader, writer = await _open(port, job.peer("reset"))
        await port.sleep(p["settle_s"])      # the peer has reset by now
        n = after = 0
        error = None
        try:
            while n < p["iterations"]:
                if fixed and writer.is_closing():
                    break
                dead = writer.is_closing()
                writer.write(b"x" * 1024)
                n += 1
                after += dead
                await writer.drain()
        except (ConnectionError, RuntimeError) as exc:   # uvloop raises RuntimeError
            error = type(exc).__name__
        writer.close()
        out.update(iterations_count=n, iterations_after_closing_count=after, error_seen=error)
    return _stream(job, main, p["max_s"])


def _run_spin():
    def run(ctx):
        p = ctx.params
        role = peers.reset_peer(listen="127.0.0.1:0", after_bytes=None, after_s=0.05,
                                sockbuf=SOCKBUF, max_s=p["max_s"])
        ran = run_program(ctx, max_s=p["max_s"] + 2, peers=[role])
        after = ran.app.get("iterations_after_closing_count")
        m = {"iterations_after_closing_count": after, "iterations_count": ran.app.get("iterations_count")}
        notes = _notes(ran.app) + ([f"error seen: {ran.app['error_seen']}"] if ran.app.get("error_seen") else [])
        return m, {"bug_shown": after is not None and after >= p["iterations"] // 2}, notes
    return run


_SPIN_METRICS = [Metric("iterations_after_closing_count", "lower", "write+drain after closing"),
                 Metric("iterations_count", None, "iterations")]
_DRAIN_FLIP = Flip("hybrid:drain_on_closing=return", True,
                   "our kernel whose drain() returns at once on a closing or lost transport "
                   "without yielding or raising (asyncio 3.4.3), so a write(); drain() loop "
                   "never lets connection_lost run")

_add(Entry(
    id="asyncio-263", aliases=("C8",),
    decided_by=("iterations_after_closing_count",),
    title="drain() never yields after the peer disconnected: the write loop spins",
    link="https://github.com/python/asyncio/issues/263",
    mechanism="After the peer resets, writes are dropped and the transport is never paused, "
              "so drain() returned without yielding. A write(); drain() loop then never gave "
              "the loop a pass to deliver connection_lost, and spun without seeing the error.",
    reported="asyncio 3.4.3 (2015-09, the tag of 2015-02 has no closing check in drain())",
    fixed_in="asyncio PR 280 (2015-10-19, 'Raise error from drain() when socket is closed'): "
             "drain() yields once on a closing transport, then raises; first in the December "
             "2015 releases, Python 3.4.4 and 3.5.1 (3.5.0 of September 2015 predates it)",
    expected="not shown on the installed asyncio and uvloop nor on hybrid (all raise "
             "ConnectionResetError within a pass); shown with hybrid:drain_on_closing=return "
             "(our kernel's drain() returning at once on a closing transport)",
    oracle="bug shown when more than half of the loop's iterations ran after the transport "
           "was already closing",
    styles=("stream",), flips=(_DRAIN_FLIP,), affects={"python": ("3.4.0", "3.4.4")},
    show_on=("hybrid:drain_on_closing=return",),
    stand_in="hybrid:drain_on_closing=return",
    affected_versions=("python==3.4.3", "python==3.5.0"),
    fixed_versions=("python==3.4.4", "python==3.5.1"),
    verified="read the thread (gvanrossum: the loop must run for the error to be set) and PR "
             "280; read drain() in the asyncio repository at tag 3.4.3 (no closing check) and "
             "in the installed 3.6.15 (the check is there); the 3.4.4/3.5.1 release is "
             "inferred from the dates"),
    _run_spin(), _SPIN_METRICS,
    _presets({"iterations": 2000, "settle_s": 0.2, "max_s": 6}),
    {"stream": _spin_stream})

# ---------------------------------------------------------------------------
# CPython 74116: two tasks draining one writer

def _twodrain_stream(job):
    p = job.params
    fixed = job.variant == "fixed"

    async def main(port, out):
        reader, writer = await _open(port, job.peer("reader"))
        errors = []
        chunk = bytes(p["chunk_bytes"])

        async def producer(q=None):
            for _ in range(p["writes"]):
                if q is not None:
                    await q.put(chunk)
                    continue
                writer.write(chunk)
                try:
                    await writer.drain()
                except AssertionError as exc:
                    errors.append(f"AssertionError: {exc}")
                except RuntimeError as exc:
                    errors.append(f"RuntimeError: {exc}")

        if fixed:    # one writer task owns write+drain; producers hand it chunks
            q = port.Queue(maxsize=2)

            async def owner():
                for _ in range(2 * p["writes"]):
                    writer.write(await q.get())
                    await writer.drain()
            tasks = [port.create_task(owner()), port.create_task(producer(q)),
                     port.create_task(producer(q))]
        else:
            tasks = [port.create_task(producer()), port.create_task(producer())]
        await port.gather(*tasks, return_exceptions=True)
        writer.close()
        await writer.wait_closed()
        out.update(drain_errors_count=len(errors), first_error=errors[0] if errors else None)
    return _stream(job, main, p["max_s"])


def _run_twodrain(ctx):
    p = ctx.params
    ran = run_program(ctx, max_s=p["max_s"] + 2, peers=[peers.reader(
        sockbuf=SOCKBUF, start_after_s=0.2, max_s=p["max_s"])])
    n = ran.app.get("drain_errors_count")
    notes = _notes(ran.app) + ([ran.app["first_error"]] if ran.app.get("first_error") else [])
    return {"drain_errors_count": n}, {"bug_shown": bool(n)}, notes


_add(Entry(
    id="cpython-74116", aliases=("bpo-29930", "C10"),
    decided_by=("drain_errors_count",),
    title="two tasks awaiting drain() on one writer: AssertionError",
    link="https://github.com/python/cpython/issues/74116",
    mechanism="The stream protocol kept a single drain waiter. When a second task awaited "
              "drain() while the first was still parked, asyncio hit an assertion instead of "
              "parking both.",
    reported="Python 3.6 (bpo-29930, 2017; websockets hit the same assertion on 3.4)",
    fixed_in="PR 94705 (GH-74116, July 2022): a deque of drain waiters; in 3.11.0 and the 3.10 "
             "branch (the installed 3.10.13 has it, 3.9.18 does not)",
    expected="not shown on the installed Python 3.11 asyncio and uvloop streams nor on hybrid, "
             "which all keep a list of waiters; shown with hybrid:drain_waiters=one (the "
             "single waiter and its assertion)",
    oracle="bug shown when any drain() raised",
    styles=("stream",), affects={"python": ("3.4.0", "3.10.6")},
    flips=(Flip("hybrid:drain_waiters=one", True,
                "our kernel with one drain waiter per writer: a second drain() asserts, as "
                "asyncio's did up to 3.9"),),
    show_on=("hybrid:drain_waiters=one",),
    stand_in="hybrid:drain_waiters=one",
    affected_versions=("python==3.9.18", "websockets==3.2"),
    fixed_versions=("python==3.10.13", "python>=3.11.0", "websockets==3.3"),
    # below looplab's minimum (3.9, 3.10; websockets 3.x on 3.6) a standalone program runs
    # the same two drains on asyncio's streams, or through the real websockets' send()
    version_python="3.6", program_file="drain_waiters.py", version_run=releases.twodrain_run,
    version_runtimes=("asyncio-streams",), version_variants=("naive",),
    verified="read the thread and PR 94705; grepped streams.py of the installed 3.6.15-3.9.18 "
             "(single waiter) and 3.10.13/3.11.7 (_drain_waiters); the first 3.10 patch with it "
             "is not established here; websockets issue 16 and PR 168 (a lock around drain(), "
             "in 3.3); measured with looplab repro cpython-74116 --versions: 8 AssertionErrors "
             "from two drains on Python 3.9.18 and through websockets 3.2 (Python 3.6.15), none "
             "on 3.10.13, 3.11.7, 3.12.1, 3.13.0 or websockets 3.3"),
    _run_twodrain, [Metric("drain_errors_count", "lower", "drain() errors")],
    _presets({"writes": 8, "chunk_bytes": 128 * KiB, "max_s": 8}),
    {"stream": _twodrain_stream})


# ---------------------------------------------------------------------------
# curio 164: spawn runs the child later than the docs said

async def _until(port, flag, limit=1000):
    """Yield until the child has signalled (a list it appends to): the fix."""
    for _ in range(limit):
        if flag:
            return
        await port.sleep(0)


def _spawn_stream(job):
    p = job.params

    async def main(port, out):
        not_yet = 0
        for _ in range(p["trials"]):
            ran = []

            async def child():
                ran.append(True)
            task = port.create_task(child())
            if job.variant == "fixed":
                await _until(port, ran)
            not_yet += not ran
            await task
        out["child_not_run_fraction"] = not_yet / p["trials"]
    return _stream(job, main, p["max_s"])


def _spawn_task(job):
    p = job.params

    async def main(port, out):
        not_yet = 0
        for _ in range(p["trials"]):
            ran = []

            async def child():
                ran.append(True)
            async with port.open_nursery() as n:
                await n.spawn(child)
                if job.variant == "fixed":
                    await _until(port, ran)
                not_yet += not ran
        out["child_not_run_fraction"] = not_yet / p["trials"]
    return _task(job, main, p["max_s"])


def _run_spawn(ctx):
    ran = run_program(ctx, max_s=ctx.params["max_s"] + 2)
    f = ran.app.get("child_not_run_fraction")
    return {"child_not_run_fraction": f}, {"bug_shown": f is not None and f > 0.5}, _notes(ran.app)


_add(Entry(
    id="curio-164", aliases=("C18",), catalog="S4",
    decided_by=("child_not_run_fraction",),
    title="the docs said spawn runs the child first; the code did not",
    link="https://github.com/dabeaz/curio/issues/164",
    mechanism="curio's documentation promised that a spawned task starts running before "
              "spawn() returns, but the kernel only queued it. A parent that relies on the "
              "child having started (an Event set, a listener bound) races ahead of it.",
    reported="curio's documentation in January 2017 (the issue names no version)",
    fixed_in="not a code change: dabeaz answered that spawn() returns at once and the docs "
             "were out of date; a parent that needs the child started waits for an Event the "
             "child sets",
    expected="shown everywhere with the default (lazy) spawn, including trio and asyncio; "
             "coro:spawn=eager and hybrid:spawn=eager run the child inside spawn, as the "
             "docs described",
    oracle="bug shown when, in more than half of the trials, the child had not run when the "
           "parent's next statement ran",
    styles=("stream", "task"),
    flips=(Flip("coro:spawn=eager", False, "the child's first step runs inside spawn"),
           Flip("hybrid:spawn=eager", False, "the child's first step runs inside create_task")),
    show_on=("coro", "curio", "hybrid"),
    verified="read the thread (the docs quoted: 'Spawn does not return to the caller until the "
             "new task has been scheduled and executed for at least one cycle'; dabeaz: 'the "
             "current behavior of Curio is for spawn() to immediately return'); measured on "
             "the installed curio"),
    _run_spawn, [Metric("child_not_run_fraction", "lower", "child not yet run")],
    _presets({"trials": 20, "max_s": 5}),
    _by_style(None, _spawn_stream, _spawn_task))


# ---------------------------------------------------------------------------
# uvloop 631: a small write deferred to a loop pass that never comes

def _deferred_cb(job):
    p = job.params

    def start(port, t, proto, out):
        t.write(b"x" * p["write_bytes"])
        out["written_at"] = _now()

        def block():
            _block(p["block_s"])            # the program blocks without giving the loop a pass
            out["unblocked_at"] = _now()
            proto.on_lost = port.stop
            t.close()
        if job.variant == "fixed":
            port.call_later(0.02, block)   # give the loop its pass first
        else:
            block()
    return _callback(job, job.peer("reader"), start, p["max_s"])


def _deferred_stream(job):
    p = job.params

    async def main(port, out):
        reader, writer = await _open(port, job.peer("reader"))
        writer.write(b"x" * p["write_bytes"])
        out["written_at"] = _now()
        if job.variant == "fixed":
            await port.sleep(0.02)
        _block(p["block_s"])
        out["unblocked_at"] = _now()
        writer.close()
        await writer.wait_closed()
    return _stream(job, main, p["max_s"])


def _run_deferred(ctx):
    p = ctx.params
    ran = run_program(ctx, max_s=p["max_s"] + 2, peers=[peers.reader(sockbuf=SOCKBUF, max_s=p["max_s"])])
    r = ran.peers["reader"]
    first = None
    if r.get("first_byte_after_s") is not None and r.get("connected_at") is not None:
        first = r["connected_at"] + r["first_byte_after_s"]
    unblocked = ran.app.get("unblocked_at")
    delay = None if first is None or ran.app.get("written_at") is None else max(0.0, first - ran.app["written_at"])
    shown = first is None or (unblocked is not None and first >= unblocked - 0.01)
    return ({"first_byte_after_write_s": delay}, {"bug_shown": _unless_cut(r, bool(shown))},
            _notes(ran.app))


_add(Entry(
    id="uvloop-631", aliases=("uvloop-619",),
    title="a small write is deferred to a loop pass that never comes",
    link="https://github.com/MagicStack/uvloop/issues/631",
    mechanism="uvloop queued a write below the high-water mark and sent it from a later loop "
              "pass, where asyncio tries the send at once. A program that writes and then "
              "blocks (or waits on something outside the loop) never sends the bytes.",
    reported="2024-09 (graingert's socketpair repro: a write then a blocking recv never "
             "completes on uvloop); every uvloop before 0.23.0, 0.21 and 0.22 included",
    fixed_in="uvloop 0.23.0: PR 619 (tarasko) tries the send at once when nothing is buffered, "
             "as asyncio does",
    expected="not shown on the installed uvloop 0.23.0 (measured), on asyncio or on our kernels "
             "with write=try-send; shown with callback:write=defer and hybrid:write=defer (our "
             "kernels with uvloop's write deferral)",
    oracle="bug shown when the reader's first byte arrived only after the program stopped "
           "blocking (the write waited for a loop pass)",
    styles=("callback", "stream"), affects={"uvloop": ("0.15.0", "0.23.0")},
    flips=(Flip("callback:write=defer", True, "our kernel with uvloop's write deferral: every "
                                                "write waits for a later loop pass"),
           Flip("hybrid:write=defer", True, "the same on our stream kernel")),
    show_on=("callback:write=defer", "hybrid:write=defer"),
    stand_in="callback:write=defer, hybrid:write=defer",
    affected_versions=("uvloop==0.21.0", "uvloop==0.22.1"), fixed_versions=("uvloop==0.23.0",),
    verified="read the thread (graingert's repro and diagnosis of stream.pyx) and PR 619's "
             "description; read _initiate_write() in the installed uvloop 0.23.0's stream.pyx "
             "(it sends at once when the libuv queue is empty); measured with --versions: "
             "shown on the real uvloop 0.21.0 and 0.22.1 (first byte ~400 ms after the write, "
             "when the program stopped blocking), not on 0.23.0"),
    _run_deferred, [Metric("first_byte_after_write_s", "lower", "first byte after write")],
    _presets({"write_bytes": 100, "block_s": 0.4, "max_s": 5}),
    _by_style(_deferred_cb, _deferred_stream))


# ---------------------------------------------------------------------------
# uvicorn 336: a task parked in drain() never released after the disconnect

def _parked_cb(job):
    """uvicorn's FlowControl shape: the writer parks until resume_writing(); the
    naive protocol forgets to release it in connection_lost."""
    p = job.params

    def start(port, t, proto, out):
        state = {"parked_at": None}

        def writer_step():
            if proto.lost:
                out.update(released=True, release_reason="error")
                return done()
            for _ in range(_CAP):     # a lost transport drops writes and never pauses
                if proto.paused or proto.lost or t.is_closing():
                    break
                t.write(bytes(64 * KiB))
            state["parked_at"] = _now()
            proto.on_resume = lambda: (out.update(released=True, release_reason="resume"), done())

        def on_lost():
            out["lost_at"] = _now()
            # what the entry's property reads: the loss found the writer parked
            observe(parked_at_loss=proto.on_resume is not None)
            if job.variant == "fixed" and proto.on_resume is not None:
                proto.on_resume = None
                out.update(released=True, release_reason="connection_lost")
                done()
            else:
                port.call_later(p["bound_s"], done)

        def done():
            out.setdefault("released", False)
            port.stop()
        proto.on_lost = on_lost
        writer_step()
    return _callback(job, job.peer("reset"), start, p["max_s"])


def _parked_stream(job):
    p = job.params

    async def main(port, out):
        reader, writer = await _open(port, job.peer("reset"))
        for _ in range(_CAP):
            if writer.transport.get_write_buffer_size() > 256 * KiB or writer.is_closing():
                break
            writer.write(bytes(64 * KiB))
        try:
            # Both variants are the same code here: the library's drain() is woken by
            # connection_lost; the bug lived in a hand-written flow control (callback port).
            await port.wait_for(writer.drain(), p["bound_s"])
            out.update(released=True, release_reason="resume")
        except TimeoutError:
            out.update(released=False)
        except ConnectionError:
            out.update(released=True, release_reason="error")
        writer.transport.abort()
    return _stream(job, main, p["max_s"])


def _run_parked(ctx):
    p = ctx.params
    # The client takes one byte and resets. The writer has parked by then: it fills
    # the buffer to a pause in the same callback that saw the connection.
    ran = run_program(ctx, max_s=p["max_s"] + 2, peers=[peers.reset_peer(
        listen="127.0.0.1:0", after_bytes=1, sockbuf=SOCKBUF, max_s=p["max_s"])])
    released = ran.app.get("released")
    m = {"released": released, "release_reason": ran.app.get("release_reason")}
    return m, {"bug_shown": released is False}, _notes(ran.app)


_add(Entry(
    id="uvicorn-336", aliases=("uvicorn-340",),
    stand_in="our flow control in place of uvicorn's FlowControl (uvicorn 0.6.1's uvloop "
             "and httptools do not build for Python 3.11; --versions runs the real 0.6.1 and "
             "0.7.0 on Python 3.7)",
    decided_by=("released",),
    title="a task parked in drain() is never released after the client disconnects",
    link="https://github.com/Kludex/uvicorn/issues/336",
    mechanism="uvicorn's own flow control parks a sender until resume_writing() and its "
              "connection_lost did not wake it. When a client disconnected during "
              "http.response.body the sender stayed parked forever (the thread: 'Possible "
              "deadlock when client disconnect during http.response.body'), leaking the task.",
    reported="uvicorn 0.4-0.6 (2019-03, with uvloop and httptools behind gunicorn)",
    fixed_in="PR 340 (2019-03-29, 'Finesse write draining behavior when connections are "
             "dropped'), in uvicorn 0.7.0: connection_lost calls flow.resume_writing(); issue "
             "2754 (2025, uvicorn 0.38) reports the same symptom but not this mechanism, which "
             "uvicorn has not had since",
    framing="no HTTP: a raw stream to a client that stops reading and disconnects",
    expected="shown on every callback runtime with the naive protocol (an application bug); "
             "asyncio's, uvloop's and hybrid's drain() are released by the loss",
    oracle="bug shown when the parked writer was still parked bound_s after the connection "
           "was lost",
    styles=("callback", "stream"),
    show_on=("callback", "asyncio-protocol"),
    affected_versions=("uvicorn==0.6.1",), fixed_versions=("uvicorn==0.7.0",),
    # uvicorn 0.6/0.7 with the uvloop, httptools, h11 and websockets of early 2019 on
    # Python 3.7: the real releases (their h11 protocol on asyncio's loop)
    version_python="3.7", program_file="uvicorn_flow.py", version_run=releases.parked_run,
    version_runtimes=("asyncio-protocol",), version_variants=("naive",),
    version_with=("click==7.0", "h11==0.8.1", "httptools==0.0.13", "uvloop==0.12.2",
                  "websockets==7.0"),
    verified="read the thread (the maintainer's suggestion to call resume_writing in "
             "connection_lost, confirmed to fix the leak) and PR 340; read connection_lost() "
             "in today's uvicorn (it resumes the flow); 0.7.0 as the release is taken from the "
             "issue brief, the repository's release notes start later; the installed 0.54.0 "
             "serving a 20 MB StreamingResponse to a client that resets after 100 kB: the "
             "handler ended by itself, shutdown 0.1 s (tests/test_frameworks.py); read "
             "connection_lost() at tags 0.6.1 and 0.7.0 (0.7.0 adds flow.resume_writing()); "
             "measured with looplab repro uvicorn-336 --versions (Python 3.7.16, h11, a 20 MB "
             "body to a client that reads 400 kB/s and resets after 100 kB): the app stayed "
             "parked in drain() on 0.6.1 and returned on 0.7.0",
    properties=(sometimes("the writer is parked when the connection is lost",
                          lambda s: s.app.get("parked_at_loss"), styles=("callback",)),)),
    _run_parked,
    [Metric("released", None, "released", unit="flag"),
     Metric("release_reason", None, "released by", unit="text")],
    _presets({"bound_s": 1.0, "max_s": 6}),
    _by_style(_parked_cb, _parked_stream))


# ---------------------------------------------------------------------------
# home-assistant 89905: a drain limit that is too strict

def _spike_s(p) -> float:
    """A drain() wait that counts as a latency spike: ``spike_fraction`` of the time one
    burst takes at the client's reading rate (1/20: 1.2 ms at the preset). Measured on
    asyncio-streams: with the 16 KiB mark every drain waited 2-18 ms; with a mark that
    holds a burst none waited more than 0.05 ms."""
    return p["spike_fraction"] * p["burst_messages"] * p["message_bytes"] / p["reader_Bps"]


def _strict_stream(job):
    p = job.params

    async def main(port, out):
        reader, writer = await _open(port, job.peer("reader"), p["sockbuf"])
        t = writer.transport
        high = p["strict_high"] if job.variant == "naive" else p["roomy_high"]
        t.set_write_buffer_limits(high=high)
        msg = bytes(p["message_bytes"])
        spike = _spike_s(p)
        held = waits = 0
        worst = 0.0
        for _ in range(p["bursts"]):
            for _ in range(p["burst_messages"]):
                writer.write(msg)
            t0 = _now()
            await writer.drain()
            waited = _now() - t0
            worst = max(worst, waited)
            held += waited > spike       # measured: drain() really made this burst wait
            waits += 1
            await port.sleep(p["interval_s"])
        writer.close()
        await writer.wait_closed()
        out.update(held_back_fraction=held / waits, worst_drain_s=worst, bursts_count=waits)
    return _stream(job, main, p["max_s"])


def _strict_program(job):
    """The real aiohttp's websocket writer on an asyncio loop with aiohttp installed
    (``bench.zoo.frameworks``), our bursty writer elsewhere."""
    from bench.zoo import frameworks
    return frameworks.ha_89905_program(job) or _strict_stream(job)


def _run_strict(ctx):
    from bench.zoo import frameworks
    if frameworks.framework_reason(ctx.runtime, "aiohttp") is None:
        return frameworks.run_ha_89905(ctx)
    p = ctx.params
    ran = run_program(ctx, max_s=p["max_s"] + 2, peers=[peers.reader(
        sockbuf=p["sockbuf"], rate_Bps=p["reader_Bps"], max_s=p["max_s"])])
    f = ran.app.get("held_back_fraction")
    return ({"held_back_fraction": f, "worst_drain_s": ran.app.get("worst_drain_s"),
             "bursts_count": ran.app.get("bursts_count")},
            {"bug_shown": f is not None and f > 0.25}, _notes(ran.app))


_add(Entry(
    id="home-assistant-89905",
    stand_in="on an asyncio loop the real aiohttp websocket writer runs (naive: "
             "writer_limit=16 KiB, the limit Home Assistant had; fixed: 1 MiB, the limit its "
             "fix sets); on our kernels, our bursty writer in place of aiohttp's",
    verified="read PR 89905's description (the drain after every message added for aiohttp "
             "1367, the 16 KiB default limit, raising the limit after auth) and Home "
             "Assistant's code that sets wsock._writer._limit = 2**20, with its comment on "
             "aiohttp PR 9572 (writer_limit, the public way to set it, merged 2024-10-28); "
             "the installed aiohttp 3.14.5 drains when more than writer_limit was written "
             "since the last drain and the transport is paused (its default limit is 256 "
             "KiB); looplab repro home-assistant-89905 --preset tiny: bursts held back 1.00 "
             "with 16 KiB and 0.00 with 1 MiB on asyncio-streams (0.97 and 0.00 on "
             "uvloop-streams); a burst counts as held back when its sends took over 5 ms",
    decided_by=("held_back_fraction",),
    minimum=(Minimum("bursts_count", lambda p: p["bursts"], "every burst written and drained"),),
    title="a drain limit that is too strict: latency spikes under load",
    link="https://github.com/home-assistant/core/issues/89905",
    mechanism="aiohttp's websocket writer drains after every message (added for aiohttp "
              "1367) with the default 16 KiB high-water mark, so a burst of messages waits for "
              "the buffer to fall to the low-water mark even though the client keeps up on "
              "average. Messages back up in Home Assistant's queue, latency rises and clients "
              "are disconnected as too slow (the PR: 'Fix websocket back pressure bottleneck').",
    reported="Home Assistant 2023.3 on aiohttp 3.8 (PR 89905, 2023-03-18, bdraco)",
    fixed_in="Home Assistant PR 89905: after authentication the websocket's write limit is "
             "raised, relying on the TCP buffer instead; a pull request, not an issue, and a "
             "change in Home Assistant, not in aiohttp",
    framing="on an asyncio loop: aiohttp's WebSocketResponse sending bursts of 12 8-KiB "
            "messages to a plain-socket WebSocket client reading at 4 MB/s with small "
            "socket buffers; on our kernels: the same bursts as raw bytes",
    expected="shown on every stream runtime with a 16 KiB mark; not with a mark that holds "
             "one burst",
    oracle="bug shown when more than a quarter of the bursts were held back while the client "
           "reads faster than the average offered rate: on aiohttp, a burst whose sends took "
           "over held_s (5 ms) because a send waited for the writer's drain; on our kernels, "
           "a burst whose drain() waited longer than 1/20 of one burst's time at the "
           "client's reading rate (1.2 ms); not measured on aiohttp unless the client got "
           "every message intact",
    styles=("stream",),
    show_on=("hybrid", "asyncio-streams")),
    _run_strict,
    [Metric("held_back_fraction", "lower", "bursts held back"),
     Metric("worst_drain_s", "lower", "worst drain", timing=True),
     Metric("bursts_count", None, "bursts")],
    _presets({"strict_high": 16 * KiB, "roomy_high": 256 * KiB, "message_bytes": 8 * KiB,
              "burst_messages": 12, "bursts": 30, "interval_s": 0.04, "reader_Bps": 4_000_000,
              "spike_fraction": 0.05, "sockbuf": 8 * KiB, "max_s": 8,
              "ha_limit_bytes": 1024 * KiB, "held_s": 0.005}),
    {"stream": _strict_program})


# ---------------------------------------------------------------------------
# trio 1626: a send under fail_after(0) fails even when it would not block

def _zero_task(job):
    p = job.params

    async def main(port, out):
        stream = await _open_task(port, job.peer("reader"))
        failed = 0
        for _ in range(p["trials"]):
            try:
                if job.variant == "naive":
                    async with port.fail_after(0):
                        await stream.send_all(b"x" * p["send_bytes"])
                else:
                    # The deadline is checked by the program, not by the checkpoint in send.
                    await stream.send_all(b"x" * p["send_bytes"])
            except (TimeoutError, port.Cancelled) as exc:
                failed += 1
                out["raised"] = type(exc).__name__
            except Exception as exc:   # noqa: BLE001 -- trio's TooSlowError is not a TimeoutError
                failed += 1
                out["raised"] = type(exc).__name__
        await stream.aclose()
        out["failed_fraction"] = failed / p["trials"]
    return _task(job, main, p["max_s"])


def _run_zero(ctx):
    p = ctx.params
    ran = run_program(ctx, max_s=p["max_s"] + 2, peers=[peers.reader(sockbuf=SOCKBUF, max_s=p["max_s"])])
    f = ran.app.get("failed_fraction")
    notes = _notes(ran.app) + ([f"raised {ran.app['raised']}"] if ran.app.get("raised") else [])
    return {"failed_fraction": f}, {"bug_shown": f is not None and f > 0.5}, notes


_add(Entry(
    id="trio-1626",
    verified="read the thread (smurfix: a send to a memory channel that is not full fails "
             "under fail_after(0); gmacon suggests send_nowait); the entry uses a stream "
             "send, the same checkpoint rule",
    decided_by=("failed_fraction",),
    title="a send under fail_after(0) fails even when it would not block",
    link="https://github.com/python-trio/trio/issues/1626",
    mechanism="In trio every send is a checkpoint, and a checkpoint inside an expired cancel "
              "scope raises, whether or not the operation would have had to wait. A send "
              "wrapped in fail_after(0) (\"only if it is free\") therefore always fails.",
    reported="trio 0.16 (memory channels; the same for stream sends)",
    fixed_in="by design: use the non-blocking spelling (send_nowait) or check the deadline "
             "yourself",
    expected="shown on trio; not on curio or coro, where an expired deadline is delivered "
             "only when a task blocks (coro:io_schedule_point=true makes the send yield, but "
             "the deadline is still not checked there: measured); shown on coro with "
             "deadline_check=at-checkpoint and io_schedule_point=true (trio's two rules)",
    oracle="bug shown when more than half of the small sends to a reading peer failed",
    styles=("task",),
    flips=(Flip("coro:io_schedule_point=true,deadline_check=at-checkpoint", True,
                "every send is a checkpoint and a checkpoint checks the deadline (trio)"),
           Flip("coro:io_schedule_point=true", False,
                "every send is a checkpoint, but the deadline is delivered only when the "
                "task blocks (deadline_check=when-blocked, the default)")),
    show_on=("trio",)),
    _run_zero, [Metric("failed_fraction", "lower", "sends failed")],
    _presets({"trials": 20, "send_bytes": 100, "max_s": 5}),
    {"task": _zero_task})
