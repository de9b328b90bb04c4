"""Loop-conformance probes: what asyncio-compatible event loops (uvloop, rloop, a user's
``MODULE:FACTORY``) get wrong, measured against CPython's asyncio on the same interpreter.

These are the observatory's probes (``looplab fidelity`` over loops x interpreters,
docs/observatory.md): write after close, server shutdown (``serve_forever``
cancellation, ``wait_closed``, ``close_clients``, ``abort_clients``), the exception
handler's call shape, ``sock_*`` calls, a closed loop, eager tasks, reading paused
around EOF, buffer limits, signal handlers and the default executor.

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

import concurrent.futures
import gc
import os
import signal
import socket
import threading
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


# --- a closed loop, threads, the clock -----------------------------------------------

def _closed_loop(a):
    loop = type(a.get_running_loop())()
    loop.close()
    return loop


@loop_probe(documented=f"{_EL}#asyncio.loop.close")
async def lp_call_soon_after_close(a):
    """call_soon(), call_later() and create_future() on a closed loop (of the same class)."""
    loop, out = _closed_loop(a), {}
    for name, call in (("call_soon", lambda: loop.call_soon(print)),
                       ("call_later", lambda: loop.call_later(1, print)),
                       ("create_future", lambda: loop.create_future())):
        try:
            call()
            out[name] = None
        except Exception as exc:
            out[name] = type(exc).__name__
    return {**out, "is_closed": loop.is_closed()}


@loop_probe(documented=f"{_EL}#asyncio.loop.call_soon_threadsafe")
async def lp_call_soon_threadsafe_after_close(a):
    """call_soon_threadsafe() on a closed loop, from another thread."""
    loop, out = _closed_loop(a), []

    def other():
        try:
            loop.call_soon_threadsafe(print)
            out.append(None)
        except Exception as exc:
            out.append(type(exc).__name__)
    th = threading.Thread(target=other)
    th.start(), th.join()
    return {"raised": out}


@loop_probe(documented=f"{_EL}#asyncio.loop.call_soon_threadsafe")
async def lp_call_soon_threadsafe_wakes(a):
    """call_soon_threadsafe() from a thread wakes a loop waiting on a future; the
    callback runs in the loop's thread."""
    loop = a.get_running_loop()
    fut = loop.create_future()
    main = threading.get_ident()
    th = threading.Thread(target=lambda: loop.call_soon_threadsafe(
        lambda: fut.set_result(threading.get_ident() == main)))
    th.start()
    ok = await a.wait_for(fut, 1)
    th.join()
    return {"in_loop_thread": ok}


@loop_probe(documented=f"{_EL}#asyncio.loop.run_until_complete")
async def lp_run_on_closed_loop(a):
    """run_until_complete() and run_forever() on a closed loop."""
    loop, out = _closed_loop(a), {}

    async def nothing():
        pass
    for name in ("run_until_complete", "run_forever"):
        coro = nothing()
        try:
            loop.run_until_complete(coro) if name == "run_until_complete" else loop.run_forever()
            out[name] = None
        except Exception as exc:
            out[name] = type(exc).__name__
        coro.close()
    return out


@loop_probe(documented=f"{_EL}#asyncio.loop.close")
async def lp_close_running_loop(a):
    """close() on the running loop, and run_forever() on it again."""
    loop, out = a.get_running_loop(), {}
    for name, call in (("close", loop.close), ("run_forever", loop.run_forever)):
        try:
            call()
            out[name] = None
        except Exception as exc:
            out[name] = type(exc).__name__
    return {**out, "is_running": loop.is_running(), "is_closed": loop.is_closed()}


@loop_probe(documented=f"{_EL}#asyncio.loop.time")
async def lp_loop_time_is_monotonic(a):
    """loop.time() is time.monotonic() (the documented clock), to within 50 ms."""
    return {"monotonic": abs(a.get_running_loop().time() - time.monotonic()) < 0.05}


@loop_probe(twin_of=("cb_call_soon_vs_call_later_zero",))
async def lp_call_later_zero_order(a):
    """call_later(0), call_soon() and call_later(-1), scheduled in that order."""
    loop, order = a.get_running_loop(), []
    loop.call_later(0, order.append, "later0")
    loop.call_soon(order.append, "soon")
    loop.call_later(-1, order.append, "later-neg")
    await a.sleep(0.01)
    return {"order": order}


@loop_probe(twin_of=("cb_stop_before_run",))
async def lp_stop_before_run_forever(a):
    """stop() before run_forever(): the callbacks already scheduled run once, then it stops."""
    loop, order = type(a.get_running_loop())(), []
    loop.call_soon(order.append, 1)
    loop.call_soon(lambda: loop.call_soon(order.append, 3))
    loop.stop()
    await a.to_thread(loop.run_forever)
    first = list(order)
    await a.to_thread(loop.run_until_complete, a.sleep(0))
    loop.close()
    return {"first_run": first, "after": order}


@loop_probe(documented=f"{_EL}#asyncio.TimerHandle.when")
async def lp_timer_handle(a):
    """A TimerHandle: when() is loop.time() + delay; cancel() and cancelled()."""
    loop = a.get_running_loop()
    h = loop.call_later(10, print)
    close = abs(h.when() - (loop.time() + 10)) < 0.05
    h.cancel()
    return {"when_ok": close, "cancelled": h.cancelled()}


# --- tasks: eager start, the task factory --------------------------------------------

@loop_probe(documented=f"{_TK}#asyncio.eager_task_factory", twin_of=("tk_eager_spawn",))
async def lp_eager_start(a):
    """eager_task_factory (3.12): the child's first step runs inside create_task(), and
    a child that never awaits is done when create_task() returns."""
    if not hasattr(a, "eager_task_factory"):
        return {"eager_task_factory": "absent"}
    loop, order = a.get_running_loop(), []
    loop.set_task_factory(a.eager_task_factory)

    async def child(n):
        order.append(n)
        if n:
            await a.sleep(0)
    try:
        t0, t1 = loop.create_task(child(0)), loop.create_task(child(1))
    except Exception as exc:
        loop.set_task_factory(None)
        return {"create_task": type(exc).__name__}
    order.append("parent")
    done = [t0.done(), t1.done()]
    await a.gather(t0, t1)
    loop.set_task_factory(None)
    return {"order": order, "done_at_once": done}


@loop_probe(documented=f"{_EL}#asyncio.loop.set_task_factory")
async def lp_task_factory_roundtrip(a):
    """get_task_factory() after set_task_factory(); the factory sees every create_task()."""
    loop, seen = a.get_running_loop(), []

    def factory(lp, coro, **kw):
        seen.append(lp is loop)
        return a.Task(coro, loop=lp, **kw)
    default = loop.get_task_factory()
    loop.set_task_factory(factory)
    same = loop.get_task_factory() is factory
    await a.create_task(a.sleep(0))
    loop.set_task_factory(None)
    return {"default": default, "same": same, "seen": seen}


# --- reading paused around EOF, buffer limits ----------------------------------------

def _recorder(a, events, keep_open):
    class Rec(a.Protocol):
        data_received = lambda self, data: events.append("data")  # noqa: E731
        eof_received = lambda self: events.append("eof") or keep_open  # noqa: E731
        connection_lost = lambda self, exc: events.append("lost")  # noqa: E731
    return Rec


@loop_probe(documented=f"{_PR}#asyncio.ReadTransport.pause_reading",
            twin_of=("cb_pause_resume_after_eof",))
async def lp_pause_reading_around_eof(a):
    """Data then EOF arrive while reading is paused: nothing until resume_reading()."""
    events, lsn = [], socket.create_server(("127.0.0.1", 0))
    t, _ = await a.get_running_loop().create_connection(
        _recorder(a, events, True), *lsn.getsockname())
    peer, _ = lsn.accept()
    t.pause_reading()
    peer.sendall(b"abc")
    peer.shutdown(socket.SHUT_WR)
    await a.sleep(0.05)
    paused = list(events)
    t.resume_reading()
    await a.sleep(0.05)
    t.close(), peer.close(), lsn.close()
    return {"while_paused": paused, "after": events}


@loop_probe(documented=f"{_PR}#asyncio.ReadTransport.is_reading",
            twin_of=("cb_is_reading_after_eof_kept_open",))
async def lp_is_reading_after_eof(a):
    """is_reading() after EOF with eof_received() returning True; resume_reading() then."""
    events, lsn = [], socket.create_server(("127.0.0.1", 0))
    t, _ = await a.get_running_loop().create_connection(
        _recorder(a, events, True), *lsn.getsockname())
    peer, _ = lsn.accept()
    peer.shutdown(socket.SHUT_WR)
    await a.sleep(0.05)
    out = {"events": list(events), "is_reading": t.is_reading(), "is_closing": t.is_closing()}
    try:
        t.resume_reading()
        out["resume"] = None
    except Exception as exc:
        out["resume"] = type(exc).__name__
    t.close(), peer.close(), lsn.close()
    return out


@loop_probe(documented=f"{_PR}#asyncio.ReadTransport.pause_reading")
async def lp_pause_reading_twice_after_close(a):
    """pause_reading() twice, resume_reading() twice, then both after close() (3.7+: no-ops)."""
    lsn = socket.create_server(("127.0.0.1", 0))
    t, _ = await a.get_running_loop().create_connection(a.Protocol, *lsn.getsockname())
    out = []
    for call in (t.pause_reading, t.pause_reading, t.resume_reading, t.resume_reading,
                 t.close, t.pause_reading, t.resume_reading):
        try:
            call()
            out.append(None)
        except Exception as exc:
            out.append(type(exc).__name__)
    await a.sleep(0.01)
    lsn.close()
    return {"raised": out}


@loop_probe(documented=f"{_PR}#asyncio.WriteTransport.set_write_buffer_limits",
            twin_of=("cb_default_buffer_limits",))
async def lp_write_buffer_limits(a):
    """get_write_buffer_limits(): the default, after high=1000, after low=10 only."""
    lsn = socket.create_server(("127.0.0.1", 0))
    t, _ = await a.get_running_loop().create_connection(a.Protocol, *lsn.getsockname())
    out = [t.get_write_buffer_limits()]
    t.set_write_buffer_limits(high=1000)
    out.append(t.get_write_buffer_limits())
    t.set_write_buffer_limits(low=10)
    out.append(t.get_write_buffer_limits())
    t.close()
    lsn.close()
    return {"limits": [list(x) for x in out]}


@loop_probe(documented=f"{_ST}#asyncio.StreamReader.readline")
async def lp_stream_limit_readline(a):
    """readline() past the stream's limit=8: what it raises, and what is left after."""
    lsn = socket.create_server(("127.0.0.1", 0))
    r, w = await a.open_connection(*lsn.getsockname(), limit=8)
    peer, _ = lsn.accept()
    peer.sendall(b"0123456789abcdef\nok\n")
    try:
        out = {"first": repr(await a.wait_for(r.readline(), 1))}
    except Exception as exc:
        out = {"first": type(exc).__name__}
    out["next"] = repr(await a.wait_for(r.readline(), 1))
    w.close()
    peer.close(), lsn.close()
    return out


@loop_probe(documented=f"{_PR}#asyncio.Protocol.eof_received")
async def lp_eof_received_false_closes(a):
    """eof_received() returns None: the transport closes itself (events, is_closing)."""
    events, lsn = [], socket.create_server(("127.0.0.1", 0))
    t, _ = await a.get_running_loop().create_connection(
        _recorder(a, events, None), *lsn.getsockname())
    peer, _ = lsn.accept()
    peer.sendall(b"x")
    peer.shutdown(socket.SHUT_WR)
    await a.sleep(0.05)
    peer.close(), lsn.close()
    return {"events": events, "is_closing": t.is_closing()}


@loop_probe(documented=f"{_EL}#asyncio.loop.connect_accepted_socket")
async def lp_connect_accepted_socket(a):
    """connect_accepted_socket() on an accepted socket: a transport, and data flows."""
    lsn = socket.create_server(("127.0.0.1", 0))
    c = socket.create_connection(lsn.getsockname())
    conn, _ = lsn.accept()
    events = []
    try:
        t, _ = await a.get_running_loop().connect_accepted_socket(_recorder(a, events, None), conn)
        c.sendall(b"x")
        await a.sleep(0.05)
        out = {"events": events, "closing": t.close()}
    except Exception as exc:
        out = {"raised": type(exc).__name__}
    c.close(), conn.close(), lsn.close()
    return out


# --- signal handlers -----------------------------------------------------------------

@loop_probe(documented=f"{_EL}#asyncio.loop.add_signal_handler")
async def lp_signal_handler_delivery(a):
    """add_signal_handler(SIGUSR1): the callback runs with its arguments, in the loop."""
    loop, fut = a.get_running_loop(), a.get_running_loop().create_future()
    loop.add_signal_handler(signal.SIGUSR1, fut.set_result, "called")
    os.kill(os.getpid(), signal.SIGUSR1)
    try:
        out = await a.wait_for(fut, 1)
    except TimeoutError:
        out = "not called"
    try:
        loop.remove_signal_handler(signal.SIGUSR1)
    except Exception:
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    return {"handler": out}


@loop_probe(documented=f"{_EL}#asyncio.loop.remove_signal_handler")
async def lp_remove_signal_handler(a):
    """remove_signal_handler(): True for an installed handler, False the second time."""
    loop, out = a.get_running_loop(), []
    loop.add_signal_handler(signal.SIGUSR2, print)
    for _ in range(2):
        try:
            out.append(loop.remove_signal_handler(signal.SIGUSR2))
        except Exception as exc:
            out.append(type(exc).__name__)
    signal.signal(signal.SIGUSR2, signal.SIG_DFL)
    return {"returns": out}


@loop_probe(documented=f"{_EL}#asyncio.loop.add_signal_handler")
async def lp_signal_handler_bad_arguments(a):
    """add_signal_handler() with SIGKILL, with signal 0, and with a coroutine function."""
    loop, out = a.get_running_loop(), {}

    async def coro_fn():
        pass
    for name, args in (("sigkill", (signal.SIGKILL, print)), ("zero", (0, print)),
                       ("coroutine", (signal.SIGUSR2, coro_fn))):
        try:
            loop.add_signal_handler(*args)
            out[name] = None
        except Exception as exc:
            out[name] = type(exc).__name__
    signal.signal(signal.SIGUSR2, signal.SIG_DFL)
    return out


# --- the default executor ------------------------------------------------------------

@loop_probe(documented=f"{_EL}#asyncio.loop.run_in_executor")
async def lp_run_in_executor(a):
    """run_in_executor(None, f): the result, in another thread; an exception propagates."""
    loop = a.get_running_loop()
    other = await loop.run_in_executor(None, lambda: threading.get_ident() != threading.main_thread().ident)
    try:
        await loop.run_in_executor(None, int, "x")
        raised = None
    except Exception as exc:
        raised = type(exc).__name__
    return {"in_other_thread": other, "raised": raised}


@loop_probe(documented=f"{_EL}#asyncio.loop.shutdown_default_executor")
async def lp_shutdown_default_executor(a):
    """run_in_executor(None, ...) after shutdown_default_executor() (on a fresh loop)."""
    loop = type(a.get_running_loop())()

    async def go():
        await loop.run_in_executor(None, int, "1")
        await loop.shutdown_default_executor()
        try:
            await loop.run_in_executor(None, int, "2")
            return None
        except Exception as exc:
            return type(exc).__name__
    out = await a.to_thread(loop.run_until_complete, go())
    loop.close()
    return {"after_shutdown": out}


@loop_probe(documented=f"{_EL}#asyncio.loop.set_default_executor")
async def lp_set_default_executor_wrong_type(a):
    """set_default_executor() with something that is not a ThreadPoolExecutor (3.11: TypeError)."""
    loop = a.get_running_loop()
    try:
        loop.set_default_executor(object())
        out = None
    except Exception as exc:
        out = type(exc).__name__
    loop.set_default_executor(concurrent.futures.ThreadPoolExecutor())
    return {"raised": out}


# --- futures and a task's loop -------------------------------------------------------

@loop_probe(documented=f"{_EL}#asyncio.loop.create_future")
async def lp_future_class(a):
    """create_future(): an asyncio.Future? isfuture()? get_loop() is the running loop?"""
    loop = a.get_running_loop()
    fut = loop.create_future()
    out = {"is_asyncio_future": isinstance(fut, a.Future), "isfuture": a.isfuture(fut),
           "same_loop": fut.get_loop() is loop}
    fut.cancel()
    return out


@loop_probe(documented=f"{_EL}#asyncio.loop.get_debug")
async def lp_debug_flag(a):
    """get_debug() follows set_debug()."""
    loop = a.get_running_loop()
    before = loop.get_debug()
    loop.set_debug(True)
    on = loop.get_debug()
    loop.set_debug(before)
    return {"on": on, "restored": loop.get_debug() == before}


@loop_probe(documented=f"{_EL}#asyncio.loop.shutdown_asyncgens")
async def lp_shutdown_asyncgens(a):
    """An async generator left suspended: finalized by shutdown_asyncgens() (on a fresh loop)."""
    loop, order = type(a.get_running_loop())(), []

    async def agen():
        try:
            yield 1
            yield 2
        finally:
            order.append("finalized")

    async def go():
        g = agen()
        await g.__anext__()
        order.append("suspended")
        return g
    g = await a.to_thread(loop.run_until_complete, go())
    await a.to_thread(loop.run_until_complete, loop.shutdown_asyncgens())
    loop.close()
    del g
    return {"order": order}


# --- transports: when connection_lost comes, and with what ---------------------------

def _lost_recorder(a, lost):
    class Rec(a.Protocol):
        connection_lost = lambda self, exc: lost.append(type(exc).__name__ if exc else None)  # noqa: E731
    return Rec


@loop_probe(documented=f"{_PR}#asyncio.BaseTransport.close",
            twin_of=("cb_close_is_deferred", "cb_abort_with_buffer"))
async def lp_connection_lost_is_deferred(a):
    """close() and abort(): connection_lost() is called later, never inside the call."""
    lsn, out = socket.create_server(("127.0.0.1", 0)), {}
    for how in ("close", "abort"):
        lost = []
        t, _ = await a.get_running_loop().create_connection(_lost_recorder(a, lost),
                                                             *lsn.getsockname())
        getattr(t, how)()
        out[how] = {"inside": list(lost)}
        await a.sleep(0.02)
        out[how]["later"] = lost
    lsn.close()
    return out


@loop_probe(documented=f"{_PR}#asyncio.BaseProtocol.connection_lost",
            twin_of=("cb_peer_reset_while_reading", "cb_peer_reset_while_buffered"))
async def lp_peer_reset_connection_lost(a):
    """The peer resets an idle connection: connection_lost() and with which exception."""
    lsn, lost = socket.create_server(("127.0.0.1", 0)), []
    t, _ = await a.get_running_loop().create_connection(_lost_recorder(a, lost),
                                                         *lsn.getsockname())
    peer, _ = lsn.accept()
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
    peer.close()
    await a.sleep(0.1)
    t.close(), lsn.close()
    return {"lost": lost}


@loop_probe(documented=f"{_PR}#asyncio.BaseProtocol.connection_lost")
async def lp_write_to_closed_peer(a):
    """Writes to a peer that has closed its socket: connection_lost()'s exception."""
    lsn, lost = socket.create_server(("127.0.0.1", 0)), []
    t, _ = await a.get_running_loop().create_connection(_lost_recorder(a, lost),
                                                         *lsn.getsockname())
    peer, _ = lsn.accept()
    peer.close()
    for _ in range(20):
        if not t.is_closing():
            t.write(b"x" * 10_000)
        await a.sleep(0.01)
    lsn.close()
    return {"lost": lost}


@loop_probe(documented=f"{_PR}#asyncio.WriteTransport.set_write_buffer_limits",
            twin_of=("cb_bad_buffer_limits",))
async def lp_bad_buffer_limits(a):
    """set_write_buffer_limits(high=10, low=20) and high=-1 (asyncio: ValueError)."""
    lsn = socket.create_server(("127.0.0.1", 0))
    t, _ = await a.get_running_loop().create_connection(a.Protocol, *lsn.getsockname())
    out = []
    for kw in ({"high": 10, "low": 20}, {"high": -1}):
        try:
            t.set_write_buffer_limits(**kw)
            out.append(None)
        except Exception as exc:
            out.append(type(exc).__name__)
    t.close(), lsn.close()
    return {"raised": out}


@loop_probe(documented=f"{_EL}#asyncio.Handle.cancelled", twin_of=("cb_cancelled_handle",))
async def lp_cancelled_handle(a):
    """Handle and TimerHandle: cancel() twice, cancelled(), and they never run."""
    loop, order = a.get_running_loop(), []
    hs = [loop.call_soon(order.append, "soon"), loop.call_later(0.001, order.append, "later")]
    out = {}
    for name, h in zip(("call_soon", "call_later"), hs):
        try:
            h.cancel(), h.cancel()
            out[name] = h.cancelled()
        except Exception as exc:
            out[name] = type(exc).__name__
    await a.sleep(0.02)
    return {"cancelled": out, "ran": order}
