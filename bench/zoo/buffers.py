"""Zoo entries about buffers that grow without bound, on the write side and the read side.

Twisted 8868 (pipelined requests), aiohttp 1367 (push without drain), aiohttp 1368
(pipelined requests read ahead while the handler is busy) and starlette 1012 (an
unbounded queue between producer and socket). The flow-control limits themselves
are in ``limits``.
"""
from __future__ import annotations

import dataclasses

from protocols.apps import STYLES
from bench import peers
from bench.scenarios.api import APP, Metric, Minimum, run_program, serve_app
from bench.zoo.harness import (KiB, MiB, SOCKBUF, _by_style, _callback, _notes, _open,
                                _open_task, _presets, _stream, _task)
from bench.zoo import releases
from bench.zoo.registry import Entry, _add

#: aiohttp 1.x's dependencies at the releases of its time (early 2017): a bare
#: environment installs exactly these beside the pinned aiohttp (pip check passes)
_AIOHTTP1_DEPS = ("async-timeout==1.1.0", "chardet==2.3.0", "multidict==2.1.4", "yarl==0.8.1")
AIOHTTP1_WITH = {f"aiohttp=={v}": _AIOHTTP1_DEPS for v in ("1.2.0", "1.3.0", "1.3.1")}
#: uvicorn 0.11.8 and its dependencies (mid 2020), beside a pinned starlette 0.13
_UVICORN011 = ("click==7.1.2", "h11==0.9.0", "httptools==0.1.1", "uvicorn==0.11.8",
               "uvloop==0.14.0", "websockets==8.1")
#: Twisted 16.6's dependencies at their releases of late 2016 (17.1 adds Automat's)
_TWISTED_DEPS = ("constantly==15.1.0", "incremental==16.10.1", "zope.interface==4.3.3")


# ---------------------------------------------------------------------------
# Twisted 8868: pipelined requests answered into an unbounded buffer (S5)

def _run_pipelining(ctx):
    p = ctx.params
    served = serve_app(ctx, "reqresp", timeout_s=p["hold_s"] + 15,
                       params={"response_bytes": p["response_bytes"], "sockbuf": SOCKBUF},
                       peers=[peers.pipeline_client(connect=APP, count=p["count"], hold_s=p["hold_s"],
                                                    sockbuf=SOCKBUF, max_s=p["hold_s"] + 5)])
    handled = served.app["counters"].get("requests_handled_count", 0)
    m = {"requests_handled_count": handled, "rss_growth_bytes": served.app.get("rss_growth_bytes"),
         "peak_user_buffer_bytes": served.app["probe"].get("peak_user_buffer_bytes"),
         "requests_sent_count": served.peers["client"].get("requests_sent", 0)}
    return m, {"bug_shown": handled >= p["count"] // 2}, []


_add(Entry(
    id="twisted-8868", aliases=("twisted-4891", "C1"), catalog="S5",
    stand_in="our server program in place of twisted.web's HTTPChannel",
    decided_by=("requests_handled_count",),
    # Every request sent and one answered: a starved server answers none, which
    # would otherwise read as "not shown".
    minimum=(Minimum("requests_sent_count", lambda p: p["count"], "the client sent every request"),
             Minimum("requests_handled_count", 1, "the server answered at least one request")),
    title="pipelined requests answered into an unbounded write buffer",
    link="https://github.com/twisted/twisted/issues/8868",
    mechanism="A client pipelines many small requests for large responses and never reads. "
              "A server that answers each request with a non-blocking write builds every "
              "response in its user-space buffer instead of stopping when the socket is full.",
    reported="Twisted before 17.1 (2016-10-21, njsmith; twisted.web's HTTPChannel read and "
             "answered every pipelined request; 4891 reported the read side in 2011)",
    fixed_in="Twisted 17.1.0 (2017-02-04): HTTPChannel exerts backpressure, it stops reading "
             "requests from a client that does not read its responses (branch "
             "8868-lukasa-httpchannelproducerconsumer); the same rule for a hand-written server",
    framing="no HTTP: 8-byte requests for 64 KiB responses from a client that never reads",
    expected="shown on every callback and stream runtime with the naive server; never on "
             "the task port (send_all blocks, so naive and fixed are the same code)",
    oracle="bug shown when at least half of the pipelined requests were answered",
    styles=STYLES,
    show_on=("callback", "hybrid", "asyncio-protocol"),
    affected_versions=("twisted==16.6.0",), fixed_versions=("twisted==17.1.0",),
    # Twisted 16.6/17.1 on Python 3.6, on Twisted's asyncio reactor: the real twisted.web
    version_python="3.6", program_file="twisted_web.py", version_run=releases.pipeline_run,
    version_runtimes=("asyncio-protocol",), version_variants=("naive",),
    version_with={"twisted==16.6.0": _TWISTED_DEPS,
                  "twisted==17.1.0": _TWISTED_DEPS + ("attrs==16.3.0", "automat==0.5.0",
                                                      "six==1.10.0")},
    verified="read the thread (njsmith's report: a client that sends GETs and never reads; "
             "branch named there) and Twisted's NEWS.rst (Twisted Web 17.1.0: 'now exerts "
             "backpressure against clients that do not read responses ... (#8868)'; 16.6.0 "
             "of 2016-11-17 is the release before) and HTTPChannel.pauseProducing in 17.1.0 "
             "(it stops reading; what one read took is still answered); measured with looplab "
             "repro twisted-8868 --versions (twisted.web on Python 3.6.15, 1000 pipelined GETs "
             "with 3 kB paths, 16 KiB answers): 16.6.0 answered 955 into a 12.9 MB write "
             "buffer, 17.1.0 answered 200 and stopped reading (347 kB)"),
    _run_pipelining,
    [Metric("requests_handled_count", "lower", "requests answered", ceiling=lambda p: p["count"]),
     Metric("rss_growth_bytes", None, "RSS growth"),
     Metric("peak_user_buffer_bytes", "lower", "user buffer peak"),
     Metric("requests_sent_count", None, "requests sent")],
    _presets({"count": 100, "response_bytes": 64 * KiB, "hold_s": 0.8},
             {"count": 300, "response_bytes": 64 * KiB, "hold_s": 1.0}))


# ---------------------------------------------------------------------------
# aiohttp 1367 / websockets 10: push without drain to a client that never reads

def _run_push(ctx):
    p = ctx.params
    app_variant = "unbounded" if ctx.variant == "naive" else "drop"
    served = serve_app(
        dataclasses.replace(ctx, variant=app_variant), "push", timeout_s=p["duration_s"] + 15,
        params={"message_bytes": p["message_bytes"], "interval_s": p["interval_s"],
                "sockbuf": SOCKBUF, "queue_limit": 16},
        peers=[peers.push_client(name, connect=APP, mode=name, duration_s=p["duration_s"],
                                 sockbuf=SOCKBUF, max_s=p["duration_s"] + 5)
               for name in ("healthy", "stalled")])
    c = served.app["counters"]
    backlog = max(served.app["probe"].get("peak_user_buffer_bytes") or 0,
                  c.get("app_queue_peak_bytes", 0))
    m = {"backlog_peak_bytes": backlog, "rss_growth_bytes": served.app.get("rss_growth_bytes"),
         "dropped_count": c.get("dropped_count", 0), "broadcasts_count": c.get("broadcasts_count", 0)}
    bound = 4 * 16 * p["message_bytes"]      # 4 x what the bounded policy may queue
    return m, {"bug_shown": backlog > bound}, [f"served with the push app's {app_variant!r} policy"]


_add(Entry(
    id="aiohttp-1367", aliases=("websockets-10", "C4"), catalog="S6",
    stand_in="our push server in place of aiohttp's and websockets' send() (aiohttp 1.x does "
             "not run on Python 3.11; --versions runs the real 1.2.0, 1.3.0 and 1.3.1 on 3.6)",
    verified="read the thread (njsmith: a websocket server that sends without awaiting grows "
             "its memory for a client that never reads), Home Assistant PR 89905, and "
             "aiohttp's commit b3c80ee3f ('Accepting back-pressure from slow websocket "
             "clients #1367', first in tag 1.3.0) and issue 1613 (1.3.0's server writer "
             "called drain() on the transport: AttributeError, fixed in 1.3.1 the next day); "
             "measured with looplab repro aiohttp-1367 --versions (the real aiohttp on Python "
             "3.6.15, a subscriber that never reads, 10 kB messages): 1.2.0's write buffer "
             "reached the program's 16 MiB cap, 1.3.0's send raised '_SelectorSocketTransport' "
             "object has no attribute 'drain' after 6 messages, 1.3.1's send parked in the "
             "drain at 95 kB",
    affected_versions=("aiohttp==1.2.0", "aiohttp==1.3.0"), fixed_versions=("aiohttp==1.3.1",),
    # aiohttp 1.x runs on Python 3.6, below looplab's minimum: a standalone program in a
    # bare environment, with the dependency releases of early 2017 (pip check passes)
    version_python="3.6", program_file="aiohttp1.py", version_run=releases.push_run,
    version_runtimes=("asyncio-streams",), version_variants=("naive",),
    version_with=AIOHTTP1_WITH,
    decided_by=("backlog_peak_bytes",),
    minimum=(Minimum("broadcasts_count", 4, "the server pushed a few messages"),),
    title="push to a subscriber that never reads: the backlog grows without bound",
    link="https://github.com/aio-libs/aiohttp/issues/1367",
    mechanism="A server pushes messages to every subscriber with a write that never blocks. "
              "One subscriber stops reading, and everything meant for it piles up in the "
              "server's memory.",
    reported="aiohttp 1.x websockets; websockets 1.x (issue 10)",
    fixed_in="an application policy: a bounded per-client queue that drops (or blocks, or "
             "disconnects); aiohttp and websockets later made send() drain",
    expected="shown with the unbounded policy on every runtime (the task port's per-client "
             "mailbox grows instead of a transport buffer); the bounded dropping queue "
             "keeps the backlog small everywhere",
    oracle="bug shown when the stalled client's backlog (transport buffer or app queue) "
           "passes 4 x what the bounded policy may queue (16 messages)",
    styles=STYLES,
    show_on=("callback", "hybrid", "asyncio-streams")),
    _run_push,
    [Metric("backlog_peak_bytes", "lower", "backlog peak"),
     Metric("rss_growth_bytes", None, "RSS growth"),
     Metric("dropped_count", None, "dropped"), Metric("broadcasts_count", None, "broadcasts")],
    _presets({"message_bytes": 10_000, "interval_s": 0.005, "duration_s": 1.5},
             {"message_bytes": 10_000, "interval_s": 0.005, "duration_s": 2.0}))


# ---------------------------------------------------------------------------
# aiohttp 1368: the receive side reads ahead while the handler is busy

def _readahead_cb(job):
    p = job.params
    limit, fixed = p["limit_bytes"], job.variant == "fixed"

    def start(port, t, proto, out):
        queue = []
        state = {"queued": 0, "peak": 0, "consumed": 0, "paused": False}

        def on_data(data):
            queue.append(data)
            state["queued"] += len(data)
            state["peak"] = max(state["peak"], state["queued"])
            if fixed and state["queued"] > limit and not state["paused"]:
                state["paused"] = True
                t.pause_reading()

        def consume():
            if queue:
                data = queue.pop(0)
                state["queued"] -= len(data)
                state["consumed"] += len(data)
                if state["paused"] and state["queued"] <= limit // 2:
                    state["paused"] = False
                    t.resume_reading()
            if proto.eof and not queue:
                out.update(app_queue_peak_bytes=state["peak"], consumed_bytes=state["consumed"])
                t.close()
                port.stop()
                return
            port.call_later(p["tick_s"], consume)
        proto.on_data = on_data
        port.call_later(p["tick_s"], consume)
    return _callback(job, job.peer("source"), start, p["max_s"])


def _readahead_stream(job):
    p = job.params
    limit, fixed = p["limit_bytes"], job.variant == "fixed"

    async def main(port, out):
        reader, writer = await _open(port, job.peer("source"))
        q = port.Queue(maxsize=max(1, limit // (64 * KiB)) if fixed else 0)
        state = {"queued": 0, "peak": 0, "consumed": 0}

        async def pump():
            while data := await reader.read(64 * KiB):
                await q.put(data)
                state["queued"] += len(data)
                state["peak"] = max(state["peak"], state["queued"])
            await q.put(b"")

        task = port.create_task(pump())
        while True:
            data = await q.get()
            if not data:
                break
            state["queued"] -= len(data)
            state["consumed"] += len(data)
            await port.sleep(p["tick_s"])      # the handler is busy
        await task
        writer.close()
        await writer.wait_closed()
        out.update(app_queue_peak_bytes=state["peak"], consumed_bytes=state["consumed"])
    return _stream(job, main, p["max_s"])


def _readahead_task(job):
    p = job.params
    limit, fixed = p["limit_bytes"], job.variant == "fixed"

    async def main(port, out):
        stream = await _open_task(port, job.peer("source"))
        queue, state = [], {"queued": 0, "peak": 0, "consumed": 0, "eof": False}

        async def pump():
            while True:
                while fixed and state["queued"] > limit:
                    await port.sleep(p["tick_s"] / 4)
                data = await stream.receive_some(64 * KiB)
                if not data:
                    state["eof"] = True
                    return
                queue.append(data)
                state["queued"] += len(data)
                state["peak"] = max(state["peak"], state["queued"])

        async with port.open_nursery() as n:
            await n.spawn(pump)
            while not (state["eof"] and not queue):
                if queue:
                    data = queue.pop(0)
                    state["queued"] -= len(data)
                    state["consumed"] += len(data)
                await port.sleep(p["tick_s"])
        await stream.aclose()
        out.update(app_queue_peak_bytes=state["peak"], consumed_bytes=state["consumed"])
    return _task(job, main, p["max_s"])


def _run_readahead(ctx):
    p = ctx.params
    ran = run_program(ctx, max_s=p["max_s"] + 2, peers=[peers.source(
        listen="127.0.0.1:0", total_bytes=p["total_bytes"], frame_bytes=32 * KiB, finish="close",
        sockbuf=SOCKBUF, max_s=p["max_s"])])
    peak = ran.app.get("app_queue_peak_bytes")
    m = {"app_queue_peak_bytes": peak, "consumed_bytes": ran.app.get("consumed_bytes"),
         "source_sent_bytes": ran.peers["source"].get("sent_bytes")}
    return m, {"bug_shown": peak is not None and peak > 4 * p["limit_bytes"]}, _notes(ran.app)


_add(Entry(
    id="aiohttp-1368", aliases=("C3",),
    stand_in="our reader and handler in place of aiohttp's request handler",
    title="pipelined requests read ahead while the handler is busy: the receive side is unbounded",
    decided_by=("app_queue_peak_bytes",),
    link="https://github.com/aio-libs/aiohttp/issues/1368",
    mechanism="The server keeps reading and parsing requests that a client pipelines while "
              "the handler is still busy with an earlier one, and queues them without a bound. "
              "A client that pipelines faster than the handler answers fills the server's "
              "memory instead of its own socket (the thread: 'Applying backpressure to "
              "over-eager pipelining clients').",
    reported="aiohttp 1.1 (2016-11, njsmith: a client that sends GETs in a loop)",
    fixed_in="aiohttp PR 12830 (2026-06, backported to the 3.14 and 3.15 branches as PRs "
             "12854 and 12855): at most 32 parsed requests (MAX_MSG_QUEUE_SIZE) wait behind "
             "the handler, then the transport is paused; the release is not established here",
    framing="no HTTP: the client streams raw bytes standing for pipelined requests; the "
            "handler consumes 64 KiB per tick; the queue between reader and handler plays "
            "aiohttp's per-connection message queue",
    expected="shown on every runtime with an unbounded queue between reader and handler; a "
             "bounded one (pause_reading, a bounded Queue, not reading) holds the client back",
    oracle="bug shown when the queue between reader and handler peaks above 4 x the limit",
    styles=STYLES,
    show_on=("callback", "hybrid", "coro"),
    affected_versions=("aiohttp==1.1.0", "aiohttp==3.13.0"), fixed_versions=(),
    verified="read the thread (njsmith's pipelining client, 'queues up requests "
             "indefinitely') and PR 12830 with its backports 12854/12855 (the 32-message cap "
             "and pause); the release carrying it was not found"),
    _run_readahead,
    [Metric("app_queue_peak_bytes", "lower", "read-ahead peak"),
     Metric("consumed_bytes", None, "consumed"), Metric("source_sent_bytes", None, "client sent")],
    _presets({"total_bytes": 2 * MiB, "limit_bytes": 128 * KiB, "tick_s": 0.01, "max_s": 8},
             {"total_bytes": 4 * MiB, "limit_bytes": 128 * KiB, "tick_s": 0.01, "max_s": 12}),
    _by_style(_readahead_cb, _readahead_stream, _readahead_task))


# ---------------------------------------------------------------------------
# starlette 1012: an unbounded queue between producer and socket

def _queue_program(job):
    p = job.params
    fixed = job.variant == "fixed"
    task_style = job.runtime.style == "task"

    async def main(port, out):
        if task_style:
            stream = await _open_task(port, job.peer("reader"))
            send = stream.send_all
        else:
            reader, writer = await _open(port, job.peer("reader"))

            async def send(data):
                writer.write(data)
                await writer.drain()
        queue, st = [], {"queued": 0, "peak": 0, "done": False}
        chunk = bytes(p["chunk_bytes"])

        async def producer():
            for _ in range(p["chunks"]):
                while fixed and len(queue) >= p["maxsize"]:
                    await port.sleep(p["interval_s"] / 2)
                queue.append(chunk)
                st["queued"] += len(chunk)
                st["peak"] = max(st["peak"], st["queued"])
                await port.sleep(p["interval_s"])
            st["done"] = True

        async def sender():
            while not (st["done"] and not queue):
                if not queue:
                    await port.sleep(p["interval_s"] / 2)
                    continue
                data = queue.pop(0)
                st["queued"] -= len(data)
                await send(data)

        if task_style:
            async with port.open_nursery() as n:
                await n.spawn(producer)
                await n.spawn(sender)
            await stream.aclose()
        else:
            await port.gather(port.create_task(producer()), port.create_task(sender()))
            writer.close()
            await writer.wait_closed()
        out["app_queue_peak_bytes"] = st["peak"]
    runner = _task if task_style else _stream
    return runner(job, main, p["max_s"])


def _run_queue(ctx):
    p = ctx.params
    ran = run_program(ctx, max_s=p["max_s"] + 2, peers=[peers.reader(
        sockbuf=SOCKBUF, rate_Bps=p["reader_Bps"], max_s=p["max_s"])])
    peak = ran.app.get("app_queue_peak_bytes")
    return ({"app_queue_peak_bytes": peak, "delivered_bytes": ran.peers["reader"].get("received_bytes")},
            {"bug_shown": peak is not None and peak > 1 * MiB}, _notes(ran.app))


_add(Entry(
    id="starlette-1012",
    stand_in="our producer, queue and sender in place of starlette's BaseHTTPMiddleware "
             "and StreamingResponse (no affected starlette runs on Python 3.11; --versions "
             "runs the real 0.13.6, 0.13.7 and 0.13.8 with uvicorn 0.11.8 on Python 3.8)",
    verified="read the thread (BaseHTTPMiddleware's unbounded asyncio.Queue, a slow client "
             "grows it without bound), PR 1018 (maxsize=1, release 0.13.7) and PR 1028 "
             "(reverted in 0.13.8 because users relied on the full evaluation); starlette "
             "0.13.6 installs on Python 3.11 but its StreamingResponse fails there "
             "(asyncio.wait() given coroutines), so it cannot run here; the installed 1.10.0 "
             "(anyio stream without buffer in BaseHTTPMiddleware) measured with "
             "starlette_stream_serve under uvicorn 0.54.0: a 3.9 MB body to a 1 MB/s client, "
             "the producer never ahead of the server (0 B) with or without the middleware; "
             "measured with looplab repro starlette-1012 --versions (Python 3.8.18, a 16 MiB "
             "StreamingResponse behind a no-op BaseHTTPMiddleware to a 1 MB/s client, 1.5 s): "
             "the generator ran 13.9 MB ahead at 0.13.6 and 14.2 MB at 0.13.8, 3.1 MB at 0.13.7",
    affected_versions=("starlette==0.13.6", "starlette==0.13.8"),
    fixed_versions=("starlette==0.13.7",),
    # starlette 0.13 with the uvicorn of its time on Python 3.8: the real releases
    version_python="3.8", program_file="starlette_stream.py", version_run=releases.stream_run,
    version_runtimes=("asyncio-streams",), version_variants=("naive",),
    version_with=_UVICORN011,
    decided_by=("app_queue_peak_bytes",),
    title="an unbounded queue between producer and socket: a slow client grows memory",
    link="https://github.com/encode/starlette/issues/1012",
    mechanism="A streaming response put every chunk the producer made into an unbounded "
              "queue and a second task sent them. Backpressure on the socket stops the sender, "
              "not the producer, so a slow client makes the queue grow without bound.",
    reported="starlette 0.13 (StreamingResponse / BaseHTTPMiddleware)",
    fixed_in="a bounded queue (or no queue): the producer waits when it is full; starlette "
             "bounded it in 0.13.7 (PR 1018, maxsize=1) and reverted that in 0.13.8 (PR "
             "1028); later releases are not checked here",
    framing="no HTTP: a producer task, a sender task and a raw socket",
    expected="shown on every stream and task runtime with the unbounded queue, even though "
             "the sender uses drain() or send_all; a bounded queue holds the producer back",
    oracle="bug shown when the queue peaks above 1 MiB",
    styles=("stream", "task"),
    show_on=("hybrid", "coro", "trio")),
    _run_queue,
    [Metric("app_queue_peak_bytes", "lower", "queue peak"), Metric("delivered_bytes", None, "delivered")],
    _presets({"chunks": 120, "chunk_bytes": 32 * KiB, "interval_s": 0.005, "maxsize": 4,
              "reader_Bps": 1_000_000, "max_s": 10}),
    {"stream": _queue_program, "task": _queue_program})
