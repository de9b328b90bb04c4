"""Loop-conformance probes: what asyncio-compatible event loops (uvloop, rloop, looplab's,
a user's ``MODULE:FACTORY``) get wrong, measured against CPython's asyncio on the same
interpreter.

These are the observatory's probes (``looplab fidelity`` over loops x interpreters,
docs/observatory.md). This module holds what they share and the probes of writes,
closes and servers; the other themes have a module each: ``loopstate`` (a loop's own
state, handles, tasks, reading and connection_lost), ``loophandler`` (the exception
handler and debug mode), ``loopsock`` (``sock_*`` and their cancellation), ``loopsignal``
(signal handlers and executors), ``loopcontext`` (contextvars), ``loopdgram`` (datagram
endpoints), ``loopproc`` (subprocesses and pipes) and ``looptls`` (TLS transports).

Each probe is ``async def lp_NAME(a)`` with ``a`` the asyncio module, running on the
loop under test, and is *self-contained*: it uses only ``a``, standard library modules
and the small helpers below, so ``looplab fidelity --repro`` turns its source into a
standalone script that needs only the loop's package. A probe that needs a second loop
makes one of the running loop's own class.

Each key of an observation is the outcome of ONE call (``_call``, ``_wait``): its
value, or what it raised, type AND message (``_raised``: addresses and ports masked).
The comparison ignores the messages (``measure.comparable``): two loops raising the
same type agree, and the message says why a loop raised something else.

``promise=doc(PAGE, ANCHOR, TEXT)`` quotes the sentence of the asyncio docs that
promises what the probe checks (``bench.fidelity.promises``; checked against each
release's docs); without one the probe is de-facto (CPython does it, no promise).
``twin_of=`` names the older probes (written with looplab's helpers) whose divergence
this one reproduces alone. They are not run on our kernels (``kernels.hybrid`` has no
asyncio loop API).
"""
from __future__ import annotations

import gc
import re
import socket
import time

from bench.fidelity.promises import doc
from bench.fidelity.registry import probe

#: sides these probes are not run on: our kernels' stream style has no asyncio loop API
_KERNELS = ("HybridSide", "PortStreamSide")


def loop_probe(promise=None, twin_of=()):
    """Register a self-contained loop probe; ``promise``: the quoted docs sentence."""
    return probe("stream", unmapped_on=_KERNELS, documented=promise, twin_of=twin_of,
                 standalone=True)


# --- what every loop probe may use (copied into its reproduction) --------------------

def _plain(v):
    return v if v is None or isinstance(v, (bool, int, float, str)) else repr(v) if isinstance(v, bytes) else "returned"


def _raised(exc):
    return {"raised": type(exc).__name__, "message": re.sub(r"0x[0-9a-f]+|(?<=', )\d+(?=\))|(?<=fd=)\d+", "N", str(exc))[:120]}


def _call(fn, *args, **kw):
    try:
        return _plain(fn(*args, **kw))
    except Exception as exc:
        return _raised(exc)


async def _wait(a, aw, timeout=1.0):
    try:
        return _plain(await a.wait_for(aw, timeout))
    except Exception as exc:
        return _raised(exc)


# --- write after close, buffers after abort, EOF ---------------------------------------

@loop_probe(twin_of=("cb_write_after_close_empty", "cb_write_after_connection_lost_exc"))
async def lp_transport_write_after_close(a):
    """transport.write() after close(): raised, or dropped (CPython logs a warning)?"""
    lsn = socket.create_server(("127.0.0.1", 0))
    t, _ = await a.get_running_loop().create_connection(a.Protocol, *lsn.getsockname())
    t.close()
    out = {"write": _call(lambda: t.write(b"x"))}
    await a.sleep(0.01)
    lsn.close()
    return out


@loop_probe()
async def lp_transport_is_closing_after_close(a):
    """is_closing() before and right after close()."""
    lsn = socket.create_server(("127.0.0.1", 0))
    t, _ = await a.get_running_loop().create_connection(a.Protocol, *lsn.getsockname())
    out = {"before": _call(lambda: t.is_closing())}
    t.close()
    out["after"] = _call(lambda: t.is_closing())
    lsn.close()
    return out


@loop_probe()
async def lp_writer_write_after_close(a):
    """StreamWriter.write() after close(), and again after wait_closed()."""
    lsn = socket.create_server(("127.0.0.1", 0))
    r, w = await a.open_connection(*lsn.getsockname())
    w.close()
    out = {"after_close": _call(lambda: w.write(b"x"))}
    await _wait(a, w.wait_closed())
    out["after_wait_closed"] = _call(lambda: w.write(b"x"))
    lsn.close()
    return out


@loop_probe()
async def lp_write_buffer_size_after_abort(a):
    """get_write_buffer_size() right after abort() with 4 MB buffered, and once lost."""
    lsn = socket.create_server(("127.0.0.1", 0))
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)    # most of 4 MB stays in user space
    s.connect(lsn.getsockname())
    t, _ = await a.get_running_loop().create_connection(a.Protocol, sock=s)
    t.write(b"x" * 4_000_000)
    out = {"buffered": t.get_write_buffer_size() > 0}
    t.abort()
    out["zero_right_after"] = _call(lambda: t.get_write_buffer_size()) == 0
    await a.sleep(0.05)
    out["zero_later"] = _call(lambda: t.get_write_buffer_size()) == 0
    lsn.close()
    return out


@loop_probe(promise=doc("protocol", "asyncio.WriteTransport.abort",
                        "Close the transport immediately, without waiting for pending "
                        "operations to complete. Buffered data will be lost."))
async def lp_abort_loses_buffer(a):
    """abort() with 4 MB buffered: the peer gets less than all of it, then the end."""
    lsn = socket.create_server(("127.0.0.1", 0))
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)    # most of 4 MB stays in user space
    s.connect(lsn.getsockname())
    t, _ = await a.get_running_loop().create_connection(a.Protocol, sock=s)
    peer, _ = lsn.accept()
    t.write(b"x" * 4_000_000)
    t.abort()
    got, peer_end, deadline = 0, False, time.monotonic() + 2
    peer.setblocking(False)
    while time.monotonic() < deadline and not peer_end:
        try:
            chunk = peer.recv(1 << 20)
            got, peer_end = got + len(chunk), not chunk
        except BlockingIOError:
            await a.sleep(0.005)
        except ConnectionError:
            peer_end = True
    peer.close(), lsn.close()
    return {"all_arrived": got == 4_000_000, "peer_saw_the_end": peer_end}


@loop_probe(promise=doc("protocol", "asyncio.BaseTransport.close",
                        "If the transport has a buffer for outgoing data, buffered data will "
                        "be flushed asynchronously."),
            twin_of=("cb_write_after_close_buffered",))
async def lp_close_flushes_buffer(a):
    """close() with 1 MB buffered: the peer still receives all of it, then EOF."""
    lsn = socket.create_server(("127.0.0.1", 0))
    t, _ = await a.get_running_loop().create_connection(a.Protocol, *lsn.getsockname())
    peer, _ = lsn.accept()
    t.write(b"x" * 1_000_000)
    t.close()
    got, eof, deadline = 0, False, time.monotonic() + 2
    peer.setblocking(False)
    while time.monotonic() < deadline and not eof:
        try:
            chunk = peer.recv(1 << 20)
            got, eof = got + len(chunk), not chunk
        except BlockingIOError:
            await a.sleep(0.005)
    peer.close(), lsn.close()
    return {"received": got, "eof": eof}


@loop_probe(promise=doc("protocol", "asyncio.WriteTransport.write_eof",
                        "Close the write end of the transport after flushing all buffered "
                        "data. Data may still be received."))
async def lp_write_eof_still_receives(a):
    """write_eof(): the peer reads EOF, and data the peer sends afterwards still arrives."""
    got, lsn = [], socket.create_server(("127.0.0.1", 0))

    class P(a.Protocol):
        def data_received(self, data):
            got.append(data)
    t, _ = await a.get_running_loop().create_connection(P, *lsn.getsockname())
    peer, _ = lsn.accept()
    out = {"write_eof": _call(lambda: t.write_eof())}
    await a.sleep(0.02)
    peer.settimeout(0.5)
    out["peer_reads"] = _call(lambda: peer.recv(10))
    peer.sendall(b"after")
    await a.sleep(0.05)
    out["received_after"] = b"".join(got).decode()
    t.close(), peer.close(), lsn.close()
    return out


@loop_probe(promise=doc("protocol", "asyncio.WriteTransport.can_write_eof",
                        "Return True if the transport supports write_eof(), False if not."))
async def lp_transport_can_write_eof(a):
    """can_write_eof() on a TCP transport (TCP supports a half-close)."""
    lsn = socket.create_server(("127.0.0.1", 0))
    t, _ = await a.get_running_loop().create_connection(a.Protocol, *lsn.getsockname())
    out = {"can_write_eof": _call(lambda: t.can_write_eof())}
    t.close(), lsn.close()
    return out


@loop_probe()
async def lp_transport_write_after_write_eof(a):
    """transport.write() after write_eof()."""
    lsn = socket.create_server(("127.0.0.1", 0))
    t, _ = await a.get_running_loop().create_connection(a.Protocol, *lsn.getsockname())
    t.write_eof()
    out = {"write": _call(lambda: t.write(b"x"))}
    t.close(), lsn.close()
    return out


@loop_probe()
async def lp_drain_after_close(a):
    """await writer.drain() after writer.close()."""
    lsn = socket.create_server(("127.0.0.1", 0))
    r, w = await a.open_connection(*lsn.getsockname())
    w.close()
    out = {"drain": await _wait(a, w.drain())}
    await _wait(a, w.wait_closed())
    lsn.close()
    return out


@loop_probe(promise=doc("stream", "asyncio.StreamWriter.can_write_eof",
                        "Return True if the underlying transport supports the write_eof() "
                        "method, False otherwise."))
async def lp_writer_can_write_eof(a):
    """StreamWriter.can_write_eof() over TCP."""
    lsn = socket.create_server(("127.0.0.1", 0))
    r, w = await a.open_connection(*lsn.getsockname())
    out = {"can_write_eof": _call(lambda: w.can_write_eof())}
    w.close()
    lsn.close()
    return out


@loop_probe()
async def lp_writer_write_after_write_eof(a):
    """StreamWriter.write() after write_eof()."""
    lsn = socket.create_server(("127.0.0.1", 0))
    r, w = await a.open_connection(*lsn.getsockname())
    w.write_eof()
    out = {"write": _call(lambda: w.write(b"x"))}
    w.close()
    await _wait(a, w.wait_closed())
    lsn.close()
    return out


@loop_probe(promise=doc("stream", "asyncio.StreamWriter.is_closing",
                        "Return True if the stream is closed or in the process of being closed."))
async def lp_writer_is_closing(a):
    """StreamWriter.is_closing() before and right after close()."""
    lsn = socket.create_server(("127.0.0.1", 0))
    r, w = await a.open_connection(*lsn.getsockname())
    out = {"before": _call(lambda: w.is_closing())}
    w.close()
    out["after"] = _call(lambda: w.is_closing())
    await _wait(a, w.wait_closed())
    lsn.close()
    return out


@loop_probe()
async def lp_writer_wait_closed_twice(a):
    """wait_closed() twice after close(): what each returns."""
    lsn = socket.create_server(("127.0.0.1", 0))
    r, w = await a.open_connection(*lsn.getsockname())
    w.close()
    out = {"first": await _wait(a, w.wait_closed()), "second": await _wait(a, w.wait_closed())}
    lsn.close()
    return out


@loop_probe(twin_of=("st_read_after_reset", "st_wait_closed_after_reset"))
async def lp_read_after_reset(a):
    """read() after the peer resets, then wait_closed() after close()."""
    lsn = socket.create_server(("127.0.0.1", 0))
    r, w = await a.open_connection(*lsn.getsockname())
    peer, _ = lsn.accept()
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
    peer.close()
    out = {"read": await _wait(a, r.read(10))}
    w.close()
    out["wait_closed"] = await _wait(a, w.wait_closed())
    lsn.close()
    return out


@loop_probe(twin_of=("st_write_drain_after_reset", "st_drain_waiters_on_reset"))
async def lp_drain_after_reset(a):
    """write() and then drain() after the peer resets, twice: what each raises."""
    lsn = socket.create_server(("127.0.0.1", 0))
    r, w = await a.open_connection(*lsn.getsockname())
    peer, _ = lsn.accept()
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
    peer.close()
    await a.sleep(0.05)
    out = {}
    for i in (1, 2):
        out[f"write{i}"] = _call(lambda: w.write(b"x" * 100_000))
        out[f"drain{i}"] = await _wait(a, w.drain())
    w.close()
    lsn.close()
    return out


# --- servers: serve_forever, wait_closed, close_clients, abort_clients ---------------

@loop_probe(promise=doc("eventloop", "asyncio.Server.wait_closed",
                        "Wait until the close() method completes and all active connections "
                        "have finished.", since="3.12"))
async def lp_server_wait_closed_open_client(a):
    """Server.close(), then wait_closed() while a client connection is still open
    (3.12 made it wait for the connections: cpython 104344, 113538)."""
    async def handler(r, w):
        await r.read()
        w.close()
    srv = await a.start_server(handler, "127.0.0.1", 0)
    r, w = await a.open_connection(*srv.sockets[0].getsockname())
    await a.sleep(0.02)
    srv.close()
    out = {"wait_closed": await _wait(a, srv.wait_closed(), 0.3)}
    w.close()
    await _wait(a, srv.wait_closed())
    return out


@loop_probe()
async def lp_server_wait_closed_before_close(a):
    """Server.wait_closed() before close(): does it return at once or wait?"""
    srv = await a.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    out = {"wait_closed": await _wait(a, srv.wait_closed(), 0.2)}
    srv.close()
    await _wait(a, srv.wait_closed())
    return out


@loop_probe(promise=doc("eventloop", "asyncio.Server.close_clients",
                        "Close all existing incoming client connections.", since="3.13"))
async def lp_server_close_clients(a):
    """Server.close_clients() (3.13): does the open client see EOF?"""
    async def handler(r, w):
        await r.read()
        w.close()
    srv = await a.start_server(handler, "127.0.0.1", 0)
    r, w = await a.open_connection(*srv.sockets[0].getsockname())
    await a.sleep(0.02)
    srv.close()
    if not hasattr(srv, "close_clients"):
        out = {"close_clients": "absent"}
    else:
        out = {"close_clients": _call(lambda: srv.close_clients()), "client_read": await _wait(a, r.read())}
    w.close()
    await _wait(a, srv.wait_closed())
    return out


@loop_probe(promise=doc("eventloop", "asyncio.Server.abort_clients",
                        "Close all existing incoming client connections immediately, without "
                        "waiting for pending operations to complete.", since="3.13"))
async def lp_server_abort_clients(a):
    """Server.abort_clients() (3.13) with 4 MB queued: the client's reads end before
    all of it arrives."""
    async def handler(r, w):
        w.write(b"x" * 4_000_000)
        await r.read()
        w.close()
    srv = await a.start_server(handler, "127.0.0.1", 0)
    r, w = await a.open_connection(*srv.sockets[0].getsockname())
    await a.sleep(0.05)
    srv.close()
    if not hasattr(srv, "abort_clients"):
        w.close()
        return {"abort_clients": "absent"}
    out, n, last = {"abort_clients": _call(lambda: srv.abort_clients())}, 0, "EOF"
    try:
        while chunk := await a.wait_for(r.read(1 << 20), 1):
            n += len(chunk)
    except Exception as exc:
        last = _raised(exc)
    out.update(last_read=last, all_arrived=n == 4_000_000)
    w.close()
    await _wait(a, srv.wait_closed())
    return out


@loop_probe(promise=doc("eventloop", "asyncio.Server.serve_forever",
                        "Start accepting connections until the coroutine is cancelled. "
                        "Cancellation of serve_forever task causes the server to be closed."))
async def lp_serve_forever_cancel(a):
    """Cancelling serve_forever(): is the server still serving afterwards?"""
    srv = await a.start_server(lambda r, w: w.close(), "127.0.0.1", 0, start_serving=False)
    task = a.create_task(srv.serve_forever())
    await a.sleep(0.02)
    out = {"serving_before": srv.is_serving()}
    task.cancel()
    await a.gather(task, return_exceptions=True)
    out["serving_after"] = srv.is_serving()
    return out


@loop_probe()
async def lp_serve_forever_cancel_raises(a):
    """What awaiting a cancelled serve_forever() task raises."""
    srv = await a.start_server(lambda r, w: w.close(), "127.0.0.1", 0, start_serving=False)
    task = a.create_task(srv.serve_forever())
    await a.sleep(0.02)
    task.cancel()
    try:
        await task
        out = None
    except BaseException as exc:
        out = type(exc).__name__
    srv.close()
    return {"await_task": out}


@loop_probe()
async def lp_serve_forever_cancel_open_client(a):
    """Cancelling serve_forever() with a client connected: does the task finish while
    the client stays open (3.12+ waits for it), and does the client see EOF?"""
    async def handler(r, w):
        await r.read()
        w.close()
    srv = await a.start_server(handler, "127.0.0.1", 0, start_serving=False)
    task = a.create_task(srv.serve_forever())
    await a.sleep(0.02)
    r, w = await a.open_connection(*srv.sockets[0].getsockname())
    await a.sleep(0.02)
    task.cancel()
    await a.sleep(0.1)
    out = {"finished_with_client_open": task.done(), "client_read": await _wait(a, r.read(), 0.2)}
    w.close()
    await a.wait_for(a.gather(task, return_exceptions=True), 1)
    return out


@loop_probe()
async def lp_server_close_ends_serve_forever(a):
    """Server.close() while serve_forever() runs: does the serve_forever() task end
    (CPython cancels it)?"""
    srv = await a.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    task = a.ensure_future(srv.serve_forever())
    await a.sleep(0.02)
    srv.close()
    await a.sleep(0.05)
    out = {"task_done": task.done(), "cancelled": task.cancelled()}
    task.cancel()
    await a.gather(task, return_exceptions=True)
    return out


@loop_probe(promise=doc("eventloop", "asyncio.Server.serve_forever",
                        "Only one serve_forever task can exist per one Server object."))
async def lp_serve_forever_twice(a):
    """A second serve_forever() while the first runs."""
    srv = await a.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    task = a.create_task(srv.serve_forever())
    await a.sleep(0.01)
    out = {"second": await _wait(a, srv.serve_forever(), 0.2)}
    task.cancel()
    await a.gather(task, return_exceptions=True)
    return out


@loop_probe(promise=doc("eventloop", "asyncio.Server.is_serving",
                        "Return True if the server is accepting new connections."))
async def lp_server_is_serving(a):
    """is_serving() with start_serving=False, after start_serving(), after close()."""
    srv = await a.start_server(lambda r, w: w.close(), "127.0.0.1", 0, start_serving=False)
    out = {"not_started": _call(lambda: srv.is_serving())}
    await srv.start_serving()
    out["started"] = _call(lambda: srv.is_serving())
    srv.close()
    out["closed"] = _call(lambda: srv.is_serving())
    await _wait(a, srv.wait_closed())
    return out


@loop_probe(promise=doc("eventloop", "asyncio.Server.start_serving",
                        "This method is idempotent, so it can be called when the server is "
                        "already serving."))
async def lp_server_start_serving_twice(a):
    """start_serving() on a server already serving."""
    srv = await a.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    out = {"again": await _wait(a, srv.start_serving()), "serving": srv.is_serving()}
    srv.close()
    await _wait(a, srv.wait_closed())
    return out


@loop_probe(promise=doc("eventloop", "asyncio.Server.close",
                        "Stop serving: close listening sockets and set the sockets attribute "
                        "to None."))
async def lp_server_sockets_after_close(a):
    """Server.sockets after close(): none left (None or empty), and the port refuses."""
    srv = await a.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    addr = srv.sockets[0].getsockname()
    srv.close()
    await _wait(a, srv.wait_closed())
    out = {"no_sockets": not srv.sockets}
    try:
        r, w = await a.wait_for(a.open_connection(*addr), 1)
        out["connect"] = "connected"
        w.close()
    except Exception as exc:
        out["connect"] = _raised(exc)
    return out


@loop_probe(promise=doc("eventloop", "server-objects",
                        "When used in an async with statement, it's guaranteed that the Server "
                        "object is closed and not accepting new connections when the async with "
                        "statement is completed"))
async def lp_server_async_with(a):
    """`async with server`: not serving after the block, and wait_closed() then returns."""
    srv = await a.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    async with srv:
        inside = srv.is_serving()
    return {"inside": inside, "after": srv.is_serving(), "wait_closed": await _wait(a, srv.wait_closed())}


@loop_probe(promise=doc("eventloop", "asyncio.Server.get_loop",
                        "Return the event loop associated with the server object."))
async def lp_server_get_loop(a):
    """Server.get_loop() is the running loop."""
    srv = await a.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    out = {"same_loop": _call(lambda: srv.get_loop() is a.get_running_loop())}
    srv.close()
    await _wait(a, srv.wait_closed())
    return out


@loop_probe(twin_of=("st_server_handler_exception",))
async def lp_server_handler_exception(a):
    """A start_server handler raises: the handler's context keys, and the client's read()."""
    seen = []
    a.get_running_loop().set_exception_handler(lambda lp, ctx: seen.append(sorted(ctx)))

    async def handler(r, w):
        raise ValueError("handler failed")
    srv = await a.start_server(handler, "127.0.0.1", 0)
    r, w = await a.open_connection(*srv.sockets[0].getsockname())
    out = {"client_read": await _wait(a, r.read())}
    w.close()
    srv.close()
    await a.sleep(0.02)
    gc.collect()
    await a.sleep(0.01)
    return {**out, "contexts": seen}


@loop_probe()
async def lp_start_server_port_in_use(a):
    """start_server() on a port another socket listens on."""
    lsn = socket.create_server(("127.0.0.1", 0))
    try:
        srv = await a.start_server(lambda r, w: w.close(), *lsn.getsockname())
        srv.close()
        out = "started"
    except Exception as exc:
        out = _raised(exc)
    lsn.close()
    return {"start_server": out}


@loop_probe(promise=doc("eventloop", "asyncio.loop.create_connection",
                        "The socket family can be either AF_INET or AF_INET6 depending on host "
                        "(or the family argument, if provided)."))
async def lp_create_connection_family(a):
    """create_connection() to 127.0.0.1: the transport's socket family and peername host."""
    lsn = socket.create_server(("127.0.0.1", 0))
    t, _ = await a.get_running_loop().create_connection(a.Protocol, *lsn.getsockname())
    sock = t.get_extra_info("socket")
    out = {"family": sock.family.name if sock is not None else None,
           "peer_host": (t.get_extra_info("peername") or ("?",))[0]}
    t.close(), lsn.close()
    return out


@loop_probe()
async def lp_create_connection_refused(a):
    """create_connection() to a port nobody listens on."""
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    addr = free.getsockname()
    free.close()
    try:
        t, _ = await a.wait_for(a.get_running_loop().create_connection(a.Protocol, *addr), 1)
        t.close()
        return {"create_connection": "connected"}
    except Exception as exc:
        return {"create_connection": _raised(exc)}


@loop_probe(promise=doc("protocol", "asyncio.BaseTransport.get_extra_info",
                        "Return information about the transport or underlying resources it uses."))
async def lp_transport_extra_info(a):
    """get_extra_info(): peername, sockname, socket, and a default for an unknown name."""
    lsn = socket.create_server(("127.0.0.1", 0))
    t, _ = await a.get_running_loop().create_connection(a.Protocol, *lsn.getsockname())
    out = {"peername": t.get_extra_info("peername") == lsn.getsockname(),
           "sockname_host": (t.get_extra_info("sockname") or ("?",))[0],
           "socket": t.get_extra_info("socket") is not None,
           "default": _call(lambda: t.get_extra_info("no-such-name", "dflt"))}
    t.close(), lsn.close()
    return out


@loop_probe(promise=doc("protocol", "asyncio.BaseTransport.set_protocol",
                        "Set a new protocol."))
async def lp_transport_set_protocol(a):
    """set_protocol() swaps the protocol: data after it goes to the new one, and
    get_protocol() returns it."""
    got, lsn = [], socket.create_server(("127.0.0.1", 0))

    class New(a.Protocol):
        def data_received(self, data):
            got.append(data)
    t, _ = await a.get_running_loop().create_connection(a.Protocol, *lsn.getsockname())
    peer, _ = lsn.accept()
    new = New()
    out = {"set_protocol": _call(lambda: t.set_protocol(new)), "get_protocol": t.get_protocol() is new}
    peer.sendall(b"hi")
    await a.sleep(0.05)
    t.close(), peer.close(), lsn.close()
    return {**out, "new_got": b"".join(got).decode()}
