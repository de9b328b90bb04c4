"""Loop-conformance probes: what asyncio-compatible event loops (uvloop, rloop, a user's
``MODULE:FACTORY``) get wrong, measured against CPython's asyncio on the same interpreter.

These are the observatory's probes (``looplab fidelity`` over loops x interpreters,
docs/observatory.md): write after close, server shutdown (``serve_forever``
cancellation, ``wait_closed``, ``close_clients``, ``abort_clients``), the exception
handler's call shape, ``sock_*`` calls, a closed loop, eager tasks, reading paused
around EOF, buffer limits, signal handlers and the default executor (the probes of a
loop's own state are in ``bench.fidelity.loopstate``).

Each probe is ``async def lp_NAME(a)`` with ``a`` the asyncio module, running on the
loop under test, and is *self-contained*: it uses only ``a``, the standard library
modules imported here and nothing else of looplab, so ``looplab fidelity --repro``
turns its source into a standalone script that needs only the loop's package. A
probe that needs a second loop makes one of the running loop's own class.

``documented=`` links the asyncio documentation that promises the behaviour; without
it the probe is de-facto (CPython does it, no promise). ``twin_of=`` names the older
probes (written with looplab's helpers) whose divergence this one reproduces alone.
They are not run on our kernels (``kernels.hybrid`` has no asyncio loop API).
"""
from __future__ import annotations

import gc
import socket
import time

from bench.fidelity.registry import probe

_EL = "https://docs.python.org/3/library/asyncio-eventloop.html"
_PR = "https://docs.python.org/3/library/asyncio-protocol.html"
_ST = "https://docs.python.org/3/library/asyncio-stream.html"
_TK = "https://docs.python.org/3/library/asyncio-task.html"
#: sides these probes are not run on: our kernels' stream style has no asyncio loop API
_KERNELS = ("HybridSide", "PortStreamSide")


def loop_probe(documented=None, twin_of=()):
    return probe("stream", unmapped_on=_KERNELS, documented=documented, twin_of=twin_of)


# --- write after close, buffers after abort ---------------------------------------

@loop_probe(twin_of=("cb_write_after_close_empty", "cb_write_after_connection_lost_exc"))
async def lp_transport_write_after_close(a):
    """transport.write() after close(): raised, or dropped (CPython logs a warning)?"""
    lsn = socket.create_server(("127.0.0.1", 0))
    t, _ = await a.get_running_loop().create_connection(a.Protocol, *lsn.getsockname())
    t.close()
    try:
        t.write(b"x")
        out = None
    except Exception as exc:
        out = type(exc).__name__
    await a.sleep(0.01)
    lsn.close()
    return {"raised": out, "is_closing": t.is_closing()}


@loop_probe()
async def lp_writer_write_after_close(a):
    """StreamWriter.write() after close() and after wait_closed()."""
    lsn = socket.create_server(("127.0.0.1", 0))
    r, w = await a.open_connection(*lsn.getsockname())
    out = []
    w.close()
    for _ in range(2):
        try:
            w.write(b"x")
            out.append(None)
        except Exception as exc:
            out.append(type(exc).__name__)
        await w.wait_closed()
    lsn.close()
    return {"raised": out}


@loop_probe(documented=f"{_PR}#asyncio.WriteTransport.get_write_buffer_size")
async def lp_write_buffer_size_after_abort(a):
    """get_write_buffer_size() right after abort() with 4 MB buffered, and once lost."""
    lsn = socket.create_server(("127.0.0.1", 0))
    t, _ = await a.get_running_loop().create_connection(a.Protocol, *lsn.getsockname())
    t.write(b"x" * 4_000_000)
    before = t.get_write_buffer_size() > 0
    t.abort()
    now = t.get_write_buffer_size() == 0
    await a.sleep(0.05)
    lsn.close()
    return {"buffered": before, "empty_right_after": now, "empty_later": t.get_write_buffer_size() == 0}


@loop_probe(documented=f"{_PR}#asyncio.BaseTransport.close",
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
    while time.monotonic() < deadline:
        try:
            chunk = peer.recv(1 << 20)
        except BlockingIOError:
            await a.sleep(0.005)
            continue
        got, eof = got + len(chunk), not chunk
        if eof:
            break
    peer.close(), lsn.close()
    return {"received": got, "eof": eof}


@loop_probe(documented=f"{_ST}#asyncio.StreamWriter.drain")
async def lp_drain_after_close(a):
    """await writer.drain() after writer.close()."""
    lsn = socket.create_server(("127.0.0.1", 0))
    r, w = await a.open_connection(*lsn.getsockname())
    w.close()
    try:
        await a.wait_for(w.drain(), 1)
        out = None
    except Exception as exc:
        out = type(exc).__name__
    await w.wait_closed()
    lsn.close()
    return {"raised": out}


@loop_probe(documented=f"{_ST}#asyncio.StreamWriter.write_eof")
async def lp_writer_write_after_write_eof(a):
    """StreamWriter.write() after write_eof(); can_write_eof()."""
    lsn = socket.create_server(("127.0.0.1", 0))
    r, w = await a.open_connection(*lsn.getsockname())
    can = w.can_write_eof()
    w.write_eof()
    try:
        w.write(b"x")
        out = None
    except Exception as exc:
        out = type(exc).__name__
    w.close()
    await w.wait_closed()
    lsn.close()
    return {"can_write_eof": can, "raised": out}


@loop_probe(documented=f"{_ST}#asyncio.StreamWriter.wait_closed")
async def lp_writer_wait_closed_twice(a):
    """wait_closed() twice after close(); is_closing() before and after."""
    lsn = socket.create_server(("127.0.0.1", 0))
    r, w = await a.open_connection(*lsn.getsockname())
    before = w.is_closing()
    w.close()
    first = await a.wait_for(w.wait_closed(), 1)
    second = await a.wait_for(w.wait_closed(), 1)
    lsn.close()
    return {"before": before, "after": w.is_closing(), "values": [first, second]}


@loop_probe(twin_of=("st_read_after_reset", "st_wait_closed_after_reset"))
async def lp_read_after_reset(a):
    """read() after the peer resets, then wait_closed() after close()."""
    lsn = socket.create_server(("127.0.0.1", 0))
    r, w = await a.open_connection(*lsn.getsockname())
    peer, _ = lsn.accept()
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
    peer.close()
    out = {}
    for key, aw in (("read", r.read(10)), ("wait_closed", None)):
        if aw is None:
            w.close()
            aw = w.wait_closed()
        try:
            out[key] = repr(await a.wait_for(aw, 1))
        except Exception as exc:
            out[key] = type(exc).__name__
    lsn.close()
    return out


@loop_probe(twin_of=("st_write_drain_after_reset", "st_drain_waiters_on_reset"))
async def lp_drain_after_reset(a):
    """write() and drain() after the peer resets: what each raises."""
    lsn = socket.create_server(("127.0.0.1", 0))
    r, w = await a.open_connection(*lsn.getsockname())
    peer, _ = lsn.accept()
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
    peer.close()
    await a.sleep(0.05)
    out = []
    for _ in range(2):
        step = {}
        for key in ("write", "drain"):
            try:
                w.write(b"x" * 100_000) if key == "write" else await a.wait_for(w.drain(), 1)
                step[key] = None
            except Exception as exc:
                step[key] = type(exc).__name__
        out.append(step)
    w.close()
    lsn.close()
    return {"attempts": out}


# --- servers: serve_forever, wait_closed, close_clients, abort_clients ---------------

@loop_probe(documented=f"{_EL}#asyncio.Server.wait_closed")
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
    try:
        await a.wait_for(srv.wait_closed(), 0.3)
        out = "returned"
    except TimeoutError:
        out = "waits for the connection"
    w.close()
    await a.wait_for(srv.wait_closed(), 1)
    return {"wait_closed": out}


@loop_probe(documented=f"{_EL}#asyncio.Server.wait_closed")
async def lp_server_wait_closed_before_close(a):
    """Server.wait_closed() before close(): does it return at once or wait?"""
    srv = await a.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    try:
        await a.wait_for(srv.wait_closed(), 0.2)
        out = "returned"
    except TimeoutError:
        out = "waits for close()"
    srv.close()
    await srv.wait_closed()
    return {"wait_closed": out}


@loop_probe(documented=f"{_EL}#asyncio.Server.close_clients")
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
        w.close()
    else:
        srv.close_clients()
        out = {"client_read": repr(await a.wait_for(r.read(), 1))}
    await a.wait_for(srv.wait_closed(), 1)
    w.close()
    return out


@loop_probe(documented=f"{_EL}#asyncio.Server.abort_clients")
async def lp_server_abort_clients(a):
    """Server.abort_clients() (3.13): what the open client's read() sees."""
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
    srv.abort_clients()
    n = 0
    try:
        while chunk := await a.wait_for(r.read(1 << 20), 1):
            n += len(chunk)
        out = "EOF"
    except Exception as exc:
        out = type(exc).__name__
    w.close()
    await a.wait_for(srv.wait_closed(), 1)
    return {"client_read": out, "all_arrived": n == 4_000_000}


@loop_probe(documented=f"{_EL}#asyncio.Server.serve_forever")
async def lp_serve_forever_cancel(a):
    """Cancelling serve_forever(): what it raises, and is the server still serving?"""
    srv = await a.start_server(lambda r, w: w.close(), "127.0.0.1", 0, start_serving=False)
    task = a.create_task(srv.serve_forever())
    await a.sleep(0.02)
    serving = srv.is_serving()
    task.cancel()
    try:
        await task
        out = None
    except BaseException as exc:
        out = type(exc).__name__
    return {"serving_before": serving, "raised": out, "serving_after": srv.is_serving()}


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
    out = {"finished_with_client_open": task.done()}
    try:
        out["client_read"] = repr(await a.wait_for(r.read(), 0.2))
    except Exception as exc:
        out["client_read"] = type(exc).__name__
    w.close()
    await a.wait_for(a.gather(task, return_exceptions=True), 1)
    return out


@loop_probe(documented=f"{_EL}#asyncio.Server.serve_forever")
async def lp_serve_forever_twice(a):
    """A second serve_forever() while the first runs."""
    srv = await a.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    task = a.create_task(srv.serve_forever())
    await a.sleep(0.01)
    try:
        await a.wait_for(srv.serve_forever(), 0.2)
        out = None
    except Exception as exc:
        out = type(exc).__name__
    task.cancel()
    await a.gather(task, return_exceptions=True)
    return {"raised": out}


@loop_probe(documented=f"{_EL}#asyncio.Server.is_serving")
async def lp_server_states(a):
    """is_serving() with start_serving=False, after start_serving(), after close();
    sockets after close()."""
    srv = await a.start_server(lambda r, w: w.close(), "127.0.0.1", 0, start_serving=False)
    states = [srv.is_serving()]
    await srv.start_serving()
    states.append(srv.is_serving())
    srv.close()
    states.append(srv.is_serving())
    await srv.wait_closed()
    return {"is_serving": states, "sockets_after_close": len(srv.sockets or ())}


@loop_probe(documented=f"{_EL}#server-objects")
async def lp_server_async_with(a):
    """`async with server`: closed on exit, and wait_closed() then returns."""
    srv = await a.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    async with srv:
        inside = srv.is_serving()
    await a.wait_for(srv.wait_closed(), 1)
    return {"inside": inside, "after": srv.is_serving(), "same_loop": srv.get_loop() is a.get_running_loop()}


@loop_probe(twin_of=("st_server_handler_exception",))
async def lp_server_handler_exception(a):
    """A start_server handler raises: the handler's context keys, and the client's read()."""
    seen = []
    a.get_running_loop().set_exception_handler(lambda lp, ctx: seen.append(sorted(ctx)))

    async def handler(r, w):
        raise ValueError("handler failed")
    srv = await a.start_server(handler, "127.0.0.1", 0)
    r, w = await a.open_connection(*srv.sockets[0].getsockname())
    try:
        out = repr(await a.wait_for(r.read(), 1))
    except Exception as exc:
        out = type(exc).__name__
    w.close()
    srv.close()
    await a.sleep(0.02)
    gc.collect()
    await a.sleep(0.01)
    return {"client_read": out, "contexts": seen}


# --- the exception handler's call shape ----------------------------------------------

@loop_probe(documented=f"{_EL}#asyncio.loop.set_exception_handler",
            twin_of=("cb_callback_exception_reported",))
async def lp_handler_callback_exception(a):
    """An exception in a call_soon callback: the handler's arguments and context keys."""
    loop, seen = a.get_running_loop(), []
    loop.set_exception_handler(lambda lp, ctx: seen.append(
        (lp is loop, sorted(ctx), type(ctx.get("exception")).__name__)))
    loop.call_soon(lambda: 1 / 0)
    await a.sleep(0.01)
    return {"calls": seen}


@loop_probe(documented=f"{_EL}#asyncio.loop.set_exception_handler",
            twin_of=("tk_unretrieved_task_exception",))
async def lp_handler_unretrieved_task(a):
    """A task's exception nobody retrieved: the handler's context keys and message."""
    seen = []
    a.get_running_loop().set_exception_handler(lambda lp, ctx: seen.append(
        (sorted(ctx), ctx.get("message"))))

    async def fail():
        raise ValueError("x")
    a.create_task(fail())
    await a.sleep(0.01)
    gc.collect()
    await a.sleep(0.01)
    return {"calls": seen}


@loop_probe(documented=f"{_EL}#asyncio.loop.set_exception_handler",
            twin_of=("tk_unretrieved_future_exception",))
async def lp_handler_unretrieved_future(a):
    """A future's exception nobody retrieved: the handler's context keys and message."""
    seen = []
    a.get_running_loop().set_exception_handler(lambda lp, ctx: seen.append(
        (sorted(ctx), ctx.get("message"))))
    fut = a.get_running_loop().create_future()
    fut.set_exception(ValueError("x"))
    del fut
    gc.collect()
    await a.sleep(0.01)
    return {"calls": seen}


@loop_probe(documented=f"{_EL}#asyncio.loop.call_exception_handler")
async def lp_call_exception_handler_direct(a):
    """call_exception_handler(context) reaches the handler with the same dict."""
    loop, seen = a.get_running_loop(), []
    loop.set_exception_handler(lambda lp, ctx: seen.append(sorted(ctx)))
    loop.call_exception_handler({"message": "m", "extra": 1})
    return {"calls": seen, "handler_kept": loop.get_exception_handler() is not None}


@loop_probe(documented=f"{_EL}#asyncio.loop.get_exception_handler")
async def lp_get_exception_handler(a):
    """get_exception_handler(): None by default, the handler once set, None once reset."""
    loop = a.get_running_loop()
    first = loop.get_exception_handler()

    def h(lp, ctx):
        pass
    loop.set_exception_handler(h)
    second = loop.get_exception_handler() is h
    loop.set_exception_handler(None)
    return {"default": first, "set": second, "reset": loop.get_exception_handler()}


@loop_probe(documented=f"{_EL}#asyncio.loop.set_exception_handler")
async def lp_set_exception_handler_not_callable(a):
    """set_exception_handler() with something that is not callable."""
    try:
        a.get_running_loop().set_exception_handler(42)
        return {"raised": None}
    except Exception as exc:
        return {"raised": type(exc).__name__}


@loop_probe()
async def lp_handler_that_raises(a):
    """The exception handler itself raises: does the loop go on running callbacks?"""
    loop, order = a.get_running_loop(), []

    def bad(lp, ctx):
        raise RuntimeError("handler failed")
    loop.set_exception_handler(bad)
    loop.call_soon(lambda: 1 / 0)
    loop.call_soon(order.append, "next")
    await a.sleep(0.01)
    loop.set_exception_handler(None)
    return {"order": order}


# --- sock_* on non-blocking sockets --------------------------------------------------

@loop_probe(documented=f"{_EL}#asyncio.loop.sock_recv")
async def lp_sock_recv_blocking_socket(a):
    """sock_recv() on a socket still in blocking mode, in debug mode (ValueError)."""
    loop = a.get_running_loop()
    s1, s2 = socket.socketpair()
    s2.sendall(b"x")        # so that a loop that goes ahead does not block
    loop.set_debug(True)
    try:
        out = repr(await a.wait_for(loop.sock_recv(s1, 10), 0.5))
    except Exception as exc:
        out = type(exc).__name__
    loop.set_debug(False)
    s1.close(), s2.close()
    return {"result": out}


@loop_probe(documented=f"{_EL}#asyncio.loop.sock_sendall")
async def lp_sock_sendall_and_recv(a):
    """sock_sendall() of 1 MB, read with sock_recv() until the peer closes."""
    loop = a.get_running_loop()
    s1, s2 = socket.socketpair()
    s1.setblocking(False), s2.setblocking(False)

    async def send():
        await loop.sock_sendall(s1, b"x" * 1_000_000)
        s1.close()
    task, got = a.create_task(send()), 0
    while chunk := await a.wait_for(loop.sock_recv(s2, 65536), 1):
        got += len(chunk)
    await task
    s2.close()
    return {"received": got}


@loop_probe(documented=f"{_EL}#asyncio.loop.sock_recv_into")
async def lp_sock_recv_into(a):
    """sock_recv_into() fills the buffer and returns the count."""
    s1, s2 = socket.socketpair()
    s1.setblocking(False)
    s2.sendall(b"hello")
    buf = bytearray(10)
    n = await a.wait_for(a.get_running_loop().sock_recv_into(s1, buf), 1)
    s1.close(), s2.close()
    return {"n": n, "data": bytes(buf[:n]).decode()}


@loop_probe(documented=f"{_EL}#asyncio.loop.sock_connect")
async def lp_sock_connect_refused(a):
    """sock_connect() to a port nobody listens on."""
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    addr = free.getsockname()
    free.close()
    s = socket.socket()
    s.setblocking(False)
    try:
        await a.wait_for(a.get_running_loop().sock_connect(s, addr), 1)
        out = None
    except Exception as exc:
        out = type(exc).__name__
    s.close()
    return {"raised": out}


@loop_probe(documented=f"{_EL}#asyncio.loop.sock_accept")
async def lp_sock_accept(a):
    """sock_accept(): the accepted socket's blocking mode and the address's host."""
    lsn = socket.create_server(("127.0.0.1", 0))
    lsn.setblocking(False)
    c = socket.create_connection(lsn.getsockname())
    conn, addr = await a.wait_for(a.get_running_loop().sock_accept(lsn), 1)
    out = {"blocking": conn.getblocking(), "host": addr[0]}
    conn.close(), c.close(), lsn.close()
    return out


@loop_probe(documented=f"{_EL}#asyncio.loop.sock_recv")
async def lp_sock_recv_eof_and_cancel(a):
    """A cancelled sock_recv() leaves the socket usable; then b'' at the peer's EOF."""
    loop = a.get_running_loop()
    s1, s2 = socket.socketpair()
    s1.setblocking(False)
    t = a.create_task(loop.sock_recv(s1, 10))
    await a.sleep(0.01)
    t.cancel()
    await a.gather(t, return_exceptions=True)
    s2.sendall(b"ab")
    s2.close()
    first = await a.wait_for(loop.sock_recv(s1, 10), 1)
    second = await a.wait_for(loop.sock_recv(s1, 10), 1)
    s1.close()
    return {"cancelled": t.cancelled(), "reads": [first.decode(), second.decode()]}


@loop_probe(documented=f"{_EL}#asyncio.loop.sock_sendall")
async def lp_sock_sendall_to_reset_peer(a):
    """sock_sendall() to a peer that has reset the connection."""
    lsn = socket.create_server(("127.0.0.1", 0))
    s = socket.create_connection(lsn.getsockname())
    peer, _ = lsn.accept()
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
    peer.close()
    s.setblocking(False)
    time.sleep(0.02)
    try:
        for _ in range(3):
            await a.wait_for(a.get_running_loop().sock_sendall(s, b"x" * 100_000), 1)
        out = None
    except Exception as exc:
        out = type(exc).__name__
    s.close(), lsn.close()
    return {"raised": out}
