"""Zoo entries about closing and shutting down: what is lost, what never ends.

asyncio 141 / bpo-32391 and asyncio 466 (shutdown), asyncio 248 (a file pushed into a
dead connection), trio 412 (RST on close with unread data), CPython 113538
(Server.wait_closed), CPython 115514 (writes after close) and sanic 2921 (close then
abort on a timer).
"""
from __future__ import annotations

from protocols.apps import STYLES
from bench import peers
from bench.scenarios import programs
from bench.scenarios.api import Metric, run_program
from bench.zoo.harness import (KiB, MiB, SOCKBUF, _by_style, _callback, _listen, _notes, _now,
                                _open, _open_task, _presets, _stream, _task, _unless_cut)
from bench.zoo import releases
from bench.zoo.registry import Entry, Flip, _add


# ---------------------------------------------------------------------------
# asyncio 141 / bpo-32391 and asyncio 466: shutdown (S3 programs)

def _s3_program(variant_map):
    def program(job):
        p = job.params
        return programs.s3_shutdown(job.runtime.spec, job.peer("reader"), p["total_bytes"],
                                    variant_map[job.variant], sockbuf=SOCKBUF)
    return program


def _run_loss(ctx):
    p = ctx.params
    ran = run_program(ctx, max_s=10, linger_s=0.3,
                      peers=[peers.reader(sockbuf=SOCKBUF, start_after_s=p["start_after_s"], max_s=10)])
    got = ran.peers["reader"].get("received_bytes", 0)
    m = {"delivered_bytes": got, "lost_bytes": p["total_bytes"] - got}
    return m, {"bug_shown": _unless_cut(ran.peers["reader"], got < p["total_bytes"])}, _notes(ran.app)


_add(Entry(
    id="cpython-32391", aliases=("bpo-32391", "asyncio-141", "C6"), catalog="S3",
    verified="read the thread (asvetlov, 2017-12: add StreamWriter.wait_closed(), labelled "
             "3.7) and PR 5281 (merged 2018-01-24)",
    decided_by=("delivered_bytes",),
    title="close() returns at once: exiting right after it loses the buffered data",
    link="https://bugs.python.org/issue32391",
    mechanism="A stream's close() only asks the transport to flush and close later. A "
              "program that writes, closes and returns from main ends the loop with the "
              "unsent bytes still in user space, and they are lost.",
    reported="asyncio 3.4-3.7 (asyncio issue 141: no way to wait for the close)",
    fixed_in="Python 3.7 added StreamWriter.wait_closed(); the program must await it",
    expected="shown on every callback and stream runtime with write; close; return; never on "
             "the task port (send_all returns when the OS has the bytes)",
    oracle="bug shown when the reader received fewer bytes than were written",
    styles=STYLES, flips=(Flip("hybrid:exit=wait", False,
                                                     "exit=wait flushes what is buffered "
                                                     "before run() returns"),),
    show_on=("hybrid", "asyncio-streams", "callback")),
    _run_loss, [Metric("delivered_bytes", "higher", "delivered"), Metric("lost_bytes", "lower", "lost")],
    _presets({"total_bytes": 1 * MiB, "start_after_s": 0.3}, {"total_bytes": 4 * MiB, "start_after_s": 0.5}),
    {"*": _s3_program({"naive": "naive", "fixed": "fixed"})})


def _run_no_eof(ctx):
    p = ctx.params
    ran = run_program(ctx, max_s=10, linger_s=p["eof_within_s"] + 0.5,
                      peers=[peers.reader(sockbuf=SOCKBUF, start_after_s=0.0, max_s=10)])
    r = ran.peers["reader"]
    after = None
    if r.get("ended") == "eof" and r.get("eof_at") is not None and ran.stopped_at is not None:
        after = max(0.0, r["eof_at"] - ran.stopped_at)
    m = {"eof_after_stop_s": after, "delivered_bytes": r.get("received_bytes", 0)}
    shown = after is None or after > p["eof_within_s"]
    return m, {"bug_shown": _unless_cut(r, shown)}, _notes(ran.app)


_add(Entry(
    id="asyncio-466", aliases=("C7",), catalog="S3",
    verified="not re-read against its thread in this pass (issue 25 named no drift in this "
             "card)",
    decided_by=("delivered_bytes",),
    title="the close completes on a later loop pass: stop the loop first and EOF never comes",
    link="https://github.com/python/asyncio/issues/466",
    mechanism="transport.close() schedules connection_lost for a later pass of the loop. A "
              "program that stops its loop right after close() (the 2016 run_forever shape) "
              "leaves the socket open while the process lives, so the peer never sees EOF.",
    reported="asyncio 3.5/3.6 (the `await asyncio.sleep(0)` idiom)",
    fixed_in="not a library fix: await writer.wait_closed() (3.7+) before stopping",
    expected="shown on asyncio and on our callback and hybrid kernels with close; "
             "loop.stop(); not on uvloop, whose close() of an empty transport completes at "
             "once (measured); never on the task port, whose aclose() completes before it "
             "returns",
    oracle="bug shown when the reader saw no EOF within eof_within_s of the loop's stop while "
           "the process was still alive",
    styles=STYLES,
    show_on=("hybrid", "asyncio-streams", "callback")),
    _run_no_eof, [Metric("eof_after_stop_s", "lower", "EOF after stop"),
                  Metric("delivered_bytes", None, "delivered")],
    _presets({"total_bytes": 256 * KiB, "eof_within_s": 1.0}),
    {"*": _s3_program({"naive": "stop-2016", "fixed": "fixed"})})


# ---------------------------------------------------------------------------
# asyncio 248: a file pushed into a dead connection

def _deadpush_cb(job):
    p = job.params
    fixed = job.variant == "fixed"

    def start(port, t, proto, out):
        st = {"n": 0, "after": 0}

        def step():
            dead = proto.lost or t.is_closing()
            if fixed and dead:
                return finish()
            if st["n"] >= p["total_bytes"]:
                return finish()
            try:
                t.write(bytes(p["chunk_bytes"]))
            except RuntimeError as exc:        # uvloop: "the handler is closed"
                out["error_seen"] = f"RuntimeError: {exc}"
                return finish()
            st["n"] += p["chunk_bytes"]
            if dead:
                st["after"] += p["chunk_bytes"]
            port.call_later(p["tick_s"], step)

        def finish():
            out.update(written_bytes=st["n"], written_after_lost_bytes=st["after"])
            t.close()
            port.stop()
        step()
    return _callback(job, job.peer("reset"), start, p["max_s"])


def _deadpush_stream(job):
    p = job.params
    fixed = job.variant == "fixed"

    async def main(port, out):
        reader, writer = await _open(port, job.peer("reset"))
        n = after = 0
        error = None
        try:
            while n < p["total_bytes"]:
                if fixed and writer.is_closing():
                    break
                dead = writer.is_closing()
                writer.write(bytes(p["chunk_bytes"]))
                n += p["chunk_bytes"]
                if dead:
                    after += p["chunk_bytes"]
                await writer.drain()
                await port.sleep(p["tick_s"])
        except (ConnectionError, RuntimeError) as exc:   # uvloop raises RuntimeError
            error = type(exc).__name__
        writer.close()
        out.update(written_bytes=n, written_after_lost_bytes=after, error_seen=error)
    return _stream(job, main, p["max_s"])


def _run_deadpush(ctx):
    p = ctx.params
    ran = run_program(ctx, max_s=p["max_s"] + 2, peers=[peers.reset_peer(
        listen="127.0.0.1:0", after_bytes=64 * KiB, sockbuf=SOCKBUF, max_s=p["max_s"])])
    after = ran.app.get("written_after_lost_bytes")
    m = {"written_after_lost_bytes": after, "written_bytes": ran.app.get("written_bytes")}
    notes = _notes(ran.app) + ([f"error seen: {ran.app['error_seen']}"] if ran.app.get("error_seen") else [])
    return m, {"bug_shown": after is not None and after >= p["total_bytes"] // 4}, notes


_add(Entry(
    id="asyncio-248", aliases=("C9", "aiohttp-370"),
    decided_by=("written_after_lost_bytes",),
    title="writes to a closing transport keep succeeding: a whole file pushed into a dead connection",
    link="https://github.com/python/asyncio/issues/248",
    mechanism="Once the peer has gone, transport.write() drops the data without an error and "
              "drain() has nothing to wait for. A handler that streams a file chunk by chunk "
              "pushes all of it into the dead connection.",
    reported="asyncio 3.4.3 (2015-05, asvetlov for aiohttp's static files, aiohttp issue 370)",
    fixed_in="transport.is_closing() (the issue's 'closing property'), asyncio PR 291, "
             "committed to CPython's 3.4 and 3.5 branches on 2015-11-16 ('versionadded:: "
             "3.5.1'): Python 3.4.4 and 3.5.1; from PR 280 (2015-10) drain() also raises once "
             "the connection is lost",
    expected="shown on asyncio's and our callback port (writes are dropped silently, the "
             "program must ask is_closing()); not on uvloop, whose write() to a closed "
             "transport raises RuntimeError, nor on today's stream ports, whose drain() raises "
             "ConnectionResetError",
    oracle="bug shown when at least a quarter of the file was written after the connection "
           "was already lost",
    styles=("callback", "stream"),
    show_on=("callback", "asyncio-protocol"),
    affected_versions=("python==3.4.3", "python==3.5.0"),
    fixed_versions=("python==3.4.4", "python==3.5.1"),
    verified="read the thread (asvetlov's static-file loop and the _closing/_conn_lost "
             "analysis); the python-checkins mails of 2015-11-16 ('asyncio: Add "
             "Transport.is_closing()' on the 3.4 branch, versionadded 3.5.1); BaseTransport at "
             "the asyncio 3.4.3 tag has no is_closing()"),
    _run_deadpush,
    [Metric("written_after_lost_bytes", "lower", "written after loss"),
     Metric("written_bytes", None, "written")],
    _presets({"total_bytes": 2 * MiB, "chunk_bytes": 64 * KiB, "tick_s": 0.004, "max_s": 8}),
    _by_style(_deadpush_cb, _deadpush_stream))


# ---------------------------------------------------------------------------
# trio 412: close with unread inbound data sends RST

def _rst_cb(job):
    """naive: answer after the first chunk of the request and close; fixed: read the
    request to its EOF first, then answer and close."""
    p = job.params
    fixed = job.variant == "fixed"

    def start(port, t, proto, out):
        proto.on_lost = port.stop

        def answer():
            t.write(bytes(p["response_bytes"]))
            t.close()
        if fixed:
            proto.on_eof = answer
        else:
            proto.on_data = lambda data: (setattr(proto, "on_data", None), answer())
    return _callback(job, job.peer("source"), start, p["max_s"])


def _rst_stream(job):
    p = job.params

    async def main(port, out):
        reader, writer = await _open(port, job.peer("source"))
        await reader.read(64 * KiB)                 # the request's head
        if job.variant == "fixed":
            while await reader.read(64 * KiB):       # the rest of the request, to EOF
                pass
        writer.write(bytes(p["response_bytes"]))
        writer.close()
        try:
            await writer.wait_closed()
        except ConnectionError:
            pass
    return _stream(job, main, p["max_s"])


def _rst_task(job):
    p = job.params

    async def main(port, out):
        stream = await _open_task(port, job.peer("source"))
        try:
            await stream.receive_some(64 * KiB)
            if job.variant == "fixed":
                while await stream.receive_some(64 * KiB):
                    pass
            await stream.send_all(bytes(p["response_bytes"]))
        except port.StreamError as exc:
            out["send_error"] = type(exc).__name__
        finally:
            await stream.aclose()
    return _task(job, main, p["max_s"])


def _run_rst(ctx):
    p = ctx.params
    ran = run_program(ctx, max_s=p["max_s"] + 2, peers=[peers.source(
        listen="127.0.0.1:0", total_bytes=p["request_bytes"], frame_bytes=32 * KiB,
        finish="shutdown", eof_wait_s=p["max_s"], sockbuf=SOCKBUF, max_s=p["max_s"] + 1)])
    s = ran.peers["source"]
    got = s.get("received_bytes", 0)
    m = {"response_received_bytes": got, "response_lost_bytes": p["response_bytes"] - got,
         "peer_end": s.get("ended")}
    return m, {"bug_shown": got < p["response_bytes"]}, _notes(ran.app)


_add(Entry(
    id="trio-412", aliases=("C17",),
    verified="read the thread (aclose() was socket.close() plus a checkpoint; the RFC 7230 "
             "section 6.6 staged close it quotes: half-close, read until the peer closes, "
             "then close)",
    decided_by=("response_received_bytes",),
    title="close with unread inbound data sends RST: the peer loses the response",
    link="https://github.com/python-trio/trio/issues/412",
    mechanism="Closing a TCP socket whose receive queue still holds unread bytes makes the "
              "kernel send RST instead of FIN. A server that answers after the request's head "
              "and closes while the client is still uploading resets the connection, and the "
              "client never gets to read the answer.",
    reported="trio in January 2018 (Nikratio: SocketStream.aclose() closed without a "
             "shutdown first; the issue names no version); a property of TCP, every runtime",
    fixed_in="not a library fix: read the request to its end (or shut down the write side "
             "and drain the input) before closing",
    framing="no HTTP: the client uploads a 1 MiB request, then reads the answer until EOF",
    expected="shown on every runtime when the server answers after the first chunk and "
             "closes; not shown when it reads the request to EOF first",
    oracle="bug shown when the client received less than the whole response",
    styles=STYLES,
    show_on=("coro", "trio", "hybrid")),
    _run_rst,
    [Metric("response_received_bytes", "higher", "response received"),
     Metric("response_lost_bytes", "lower", "response lost"),
     Metric("peer_end", None, "client saw", unit="text")],
    _presets({"response_bytes": 64 * KiB, "request_bytes": 1 * MiB, "max_s": 6}),
    _by_style(_rst_cb, _rst_stream, _rst_task))


# ---------------------------------------------------------------------------
# CPython 113538 / 104344: Server.wait_closed() waits for every handler (3.12)

def _waitclosed_stream(job):
    p = job.params
    fixed = job.variant == "fixed"

    async def main(port, out):
        handlers = []
        started = port.Event()

        async def handler(reader, writer):
            handlers.append(writer)
            started.set()
            await reader.read()          # idle client: waits for EOF

        server = await port.start_server(handler, sock=_listen())
        host, tcp = server.sockets[0].getsockname()[:2]
        creader, cwriter = await port.open_connection(host, tcp)
        await port.wait_for(started.wait(), 2)
        server.close()
        if fixed:                         # close the connections you accepted (3.13: close_clients)
            for w in handlers:
                w.close()
        t0 = _now()
        try:
            await port.wait_for(server.wait_closed(), p["bound_s"])
            out["wait_closed_s"] = _now() - t0
            out["hung"] = False
        except TimeoutError:
            out["wait_closed_s"] = None
            out["hung"] = True
        cwriter.close()
        try:
            await cwriter.wait_closed()
        except ConnectionError:
            pass
        for w in handlers:
            w.close()
    return _stream(job, main, p["max_s"])


def _run_waitclosed(ctx):
    ran = run_program(ctx, max_s=ctx.params["max_s"] + 2)
    hung = ran.app.get("hung")
    m = {"wait_closed_s": ran.app.get("wait_closed_s"), "hung": hung}
    return m, {"bug_shown": bool(hung)}, _notes(ran.app) + [
        "the idle client is opened by the program itself on the same loop (no peer can "
        "connect to a server a program starts)"]


_add(Entry(
    id="cpython-113538", aliases=("cpython-104344",),
    decided_by=("hung",),
    title="Server.wait_closed() waits for every handler: shutdown hangs on an idle client",
    link="https://github.com/python/cpython/issues/113538",
    mechanism="From 3.12.0 Server.wait_closed() returns only once every accepted connection "
              "is gone (3.11 returned as soon as the listener closed). A shutdown that closes "
              "the server and awaits wait_closed() hangs while a client sits idle in read().",
    reported="Python 3.12.0 (104344 saw the hang on 3.12.0a7; 3.12.1 fixed a different corner "
             "of the same change; 113538 asks for a way to close the clients)",
    fixed_in="by design; Python 3.13.0 added Server.close_clients()/abort_clients() (PR "
             "114432); before that, close the handlers' writers first",
    expected="not shown on the installed Python 3.11 (wait_closed returns at once) nor on "
             "hybrid, whose Server follows the running Python; shown with "
             "hybrid:wait_closed=3.12; closing the accepted writers fixes it everywhere",
    oracle="bug shown when wait_closed() did not return within bound_s",
    styles=("stream",), affects={"python": ("3.12.0", None)},
    flips=(Flip("hybrid:wait_closed=3.12", True,
                "our kernel whose Server.wait_closed() also waits for every accepted "
                "connection, as Python's does from 3.12.0"),),
    show_on=("hybrid:wait_closed=3.12",),
    stand_in="hybrid:wait_closed=3.12",
    affected_versions=("python>=3.12.0",), fixed_versions=(), unaffected_versions=("python<3.12",),
    verified="read 104344 (the 3.12.0a7 repro) and PR 114432; read Server.wait_closed() in the "
             "installed 3.11.7, 3.12.1 and 3.13.0 (its docstring: 'In 3.11 and before ... An "
             "attempted fix in 3.12.0 ...') and found close_clients only in 3.13.0; measured "
             "with --versions: shown on 3.12.1 and 3.13.0 (the naive shutdown does not call "
             "close_clients), not on 3.11.7"),
    _run_waitclosed,
    [Metric("wait_closed_s", None, "wait_closed took"), Metric("hung", None, "hung", unit="flag")],
    _presets({"bound_s": 1.0, "max_s": 6}),
    {"stream": _waitclosed_stream})


# ---------------------------------------------------------------------------
# CPython 115514: writes after close() dropped while data is buffered

def _afterclose_cb(job):
    p = job.params

    def start(port, t, proto, out):
        t.write(bytes(p["first_bytes"]))
        if job.variant == "fixed":
            t.write(bytes(p["late_bytes"]))
            t.close()
        else:
            buffered = t.get_write_buffer_size()
            t.close()
            t.write(bytes(p["late_bytes"]))    # scheduled after close(), bytes still buffered
            out["buffered_at_close_bytes"] = buffered
        proto.on_lost = port.stop
    return _callback(job, job.peer("reader"), start, p["max_s"])


def _afterclose_stream(job):
    p = job.params

    async def main(port, out):
        reader, writer = await _open(port, job.peer("reader"))
        writer.write(bytes(p["first_bytes"]))
        if job.variant == "fixed":
            writer.write(bytes(p["late_bytes"]))
            writer.close()
        else:
            out["buffered_at_close_bytes"] = writer.transport.get_write_buffer_size()
            writer.close()
            writer.write(bytes(p["late_bytes"]))
        await writer.wait_closed()
    return _stream(job, main, p["max_s"])


def _run_afterclose(ctx):
    p = ctx.params
    ran = run_program(ctx, max_s=p["max_s"] + 2, peers=[peers.reader(
        sockbuf=SOCKBUF, start_after_s=0.3, max_s=p["max_s"])])
    got = ran.peers["reader"].get("received_bytes", 0)
    total = p["first_bytes"] + p["late_bytes"]
    m = {"delivered_bytes": got, "lost_bytes": total - got,
         "buffered_at_close_bytes": ran.app.get("buffered_at_close_bytes")}
    return m, {"bug_shown": _unless_cut(ran.peers["reader"], got < total)}, _notes(ran.app)


_add(Entry(
    id="cpython-115514",
    stand_in="callback:write_after_close=drop, hybrid:write_after_close=drop",
    verified="read the thread (spurious 'Exception in callback None()' after upgrading to "
             "3.12.1) and PR 128037 (writes after close missed since gh-106503, backport "
             "asked to 3.12 and 3.13); the release numbers are not re-checked",
    decided_by=("delivered_bytes",),
    title="writes made after close() are dropped while data is still buffered",
    link="https://github.com/python/cpython/issues/115514",
    mechanism="asyncio's transport accepts write() after close() as long as earlier bytes "
              "are still buffered, and flushes them before closing. After the 3.12 writev "
              "change those late writes were silently dropped, truncating the stream.",
    reported="Python 3.12.0-3.12.8, 3.13.0-3.13.1 (after gh-106503)",
    fixed_in="Python 3.12.9, 3.13.2 (gh-128037)",
    expected="not shown on the installed Python 3.11 asyncio, nor on our callback and hybrid "
             "kernels, which reproduce 3.11 (a late write is flushed while bytes are buffered); "
             "shown with callback:write_after_close=drop and hybrid:write_after_close=drop; "
             "writing everything before close() avoids it everywhere",
    oracle="bug shown when the reader received less than everything written (including the "
           "write made after close())",
    styles=("callback", "stream"), affects={"python": ("3.12.0", "3.12.9")},
    flips=(Flip("callback:write_after_close=drop", True,
                "our callback kernel dropping a write after close() while bytes are "
                "buffered, what the card says 3.12.0-3.12.8 did"),
           Flip("hybrid:write_after_close=drop", True, "the same on the stream kernel")),
    show_on=("callback:write_after_close=drop", "hybrid:write_after_close=drop")),
    _run_afterclose,
    [Metric("delivered_bytes", "higher", "delivered"), Metric("lost_bytes", "lower", "lost"),
     Metric("buffered_at_close_bytes", None, "buffered at close")],
    _presets({"first_bytes": 1 * MiB, "late_bytes": 64 * KiB, "max_s": 6}),
    _by_style(_afterclose_cb, _afterclose_stream))


# ---------------------------------------------------------------------------
# sanic 2921: close() then abort() on a timer truncates the response

def _abort_cb(job):
    p = job.params

    def start(port, t, proto, out):
        t.write(bytes(p["response_bytes"]))
        t.close()
        proto.on_lost = port.stop
        grace = p["abort_after_s"] if job.variant == "naive" else p["generous_s"]

        def fallback():
            if not proto.lost:
                out["aborted_with_bytes"] = t.get_write_buffer_size()
                t.abort()
        port.call_later(grace, fallback)
    return _callback(job, job.peer("reader"), start, p["max_s"])


def _abort_stream(job):
    p = job.params

    async def main(port, out):
        reader, writer = await _open(port, job.peer("reader"))
        writer.write(bytes(p["response_bytes"]))
        writer.close()
        grace = p["abort_after_s"] if job.variant == "naive" else p["generous_s"]
        try:
            await port.wait_for(writer.wait_closed(), grace)
        except TimeoutError:
            out["aborted_with_bytes"] = writer.transport.get_write_buffer_size()
            writer.transport.abort()
    return _stream(job, main, p["max_s"])


def _run_abort(ctx):
    p = ctx.params
    ran = run_program(ctx, max_s=p["max_s"] + 2, peers=[peers.reader(
        sockbuf=SOCKBUF, rate_Bps=p["reader_Bps"], max_s=p["max_s"])])
    got = ran.peers["reader"].get("received_bytes", 0)
    m = {"delivered_bytes": got, "lost_bytes": p["response_bytes"] - got,
         "aborted_with_bytes": ran.app.get("aborted_with_bytes")}
    return m, {"bug_shown": _unless_cut(ran.peers["reader"], got < p["response_bytes"])}, _notes(ran.app)


_add(Entry(
    id="sanic-2921", aliases=("sanic-2973",),
    stand_in="our close-then-abort program in place of sanic (on the real uvloop; "
             "--versions runs the real sanic 23.12.1, 23.12.2 and 24.6.0 on Python 3.10 and "
             "uvloop 0.19.0)",
    verified="read the thread (ashleysommer: uvloop's close() leaves the connection open "
             "while data is buffered, so sanic's fallback abort() cut responses) and PR 2973 "
             "(abort only after the buffer drained or a timeout); its commit eafc1780 "
             "(2024-06-28) is first in tag v24.6.0, and the 23.12 LTS branch took it as PR "
             "2975 before tag v23.12.2 (the card named 23.12.2 affected before: wrong); read "
             "HttpProtocol.close() at v23.12.1 (transport.close() then abort() at once) and "
             "v23.12.2 (the buffer check)",
    affected_versions=("sanic==23.12.1",), fixed_versions=("sanic==23.12.2", "sanic==24.6.0"),
    # the real Sanic on uvloop, Python 3.10, with dependencies of mid 2024
    version_python="3.10", program_file="sanic_close.py", version_run=releases.close_run,
    version_runtimes=("uvloop-streams",), version_variants=("naive",),
    version_with=("aiofiles==23.2.1", "html5tagger==1.3.0", "httptools==0.6.1",
                  "multidict==6.0.5", "sanic-routing==23.12.0", "setuptools==70.1.0",
                  "tracerite==1.1.1", "typing-extensions==4.12.2", "ujson==5.10.0",
                  "uvloop==0.19.0", "websockets==12.0"),
    decided_by=("delivered_bytes",),
    title="close() then abort() on a timer truncates a large response",
    link="https://github.com/sanic-org/sanic/issues/2921",
    mechanism="transport.close() with bytes still buffered keeps the connection open until "
              "they are sent. Sanic called abort() a fixed moment later as a fallback, which "
              "drops whatever a slow client had not yet taken.",
    reported="sanic 23.x on uvloop (the close/abort fallback)",
    fixed_in="sanic PR 2973: abort only once the buffer is empty or after a generous timeout",
    framing="no HTTP: the response is a raw 1 MiB body to a client reading at 2 MB/s",
    expected="shown on every callback and stream runtime with the short fallback; not with "
             "the generous one",
    oracle="bug shown when the client received less than the whole response",
    styles=("callback", "stream"),
    show_on=("callback", "uvloop-protocol", "hybrid")),
    _run_abort,
    [Metric("delivered_bytes", "higher", "delivered"), Metric("lost_bytes", "lower", "lost"),
     Metric("aborted_with_bytes", None, "buffered at abort")],
    _presets({"response_bytes": 1 * MiB, "reader_Bps": 2_000_000, "abort_after_s": 0.1,
              "generous_s": 4.0, "max_s": 7}),
    _by_style(_abort_cb, _abort_stream))
