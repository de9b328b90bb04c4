"""Stream-style probes: asyncio's streams (``open_connection``, ``StreamReader``,
``StreamWriter``, ``start_server``) on ``kernels.hybrid``, asyncio and uvloop.

A probe is ``async def probe(a)`` where ``a`` is ``asyncio`` or ``kernels.hybrid`` (the
same names). The task, future and timeout probes of this style are in
``bench.edges.tasks``; the sides that run both are here.
"""
from __future__ import annotations

import abc
import gc
import socket

from bench.edges.registry import MB, SOCKBUF, Listener, catch, drain, ename, probe, reset


class StreamSide(abc.ABC):
    """One stream-style runtime: runs ``probe(a)`` to completion on its library.
    Subclasses say which library and which loop."""
    style = "stream"
    #: the package whose ``OPTIONS`` schema checks this side's options (ours only)
    kernel = None
    #: options name an asyncio loop (``loop=``, ``loop.NAME=``): asyncio's runtime
    takes_loop = False

    def __init__(self, options=None):
        self.options = options or {}

    @abc.abstractmethod
    def run(self, fn):
        """Run the probe ``fn(a)`` to completion on this library; its observation."""


class HybridSide(StreamSide):
    """``kernels.hybrid``, run with this side's kernel options."""
    kernel = "kernels.hybrid"

    def run(self, fn):
        import kernels.hybrid as a
        return a.run(fn(a), **self.options)


class AsyncioStreamSide(StreamSide):
    """asyncio on its default event loop, or the loop its options name
    (``asyncio-streams:loop=looplab``)."""
    takes_loop = True

    def run(self, fn):
        import asyncio as a

        from bench.edges.callback import asyncio_loop
        with a.Runner(loop_factory=asyncio_loop(self.options)) as runner:
            return runner.run(fn(a))


class UvloopStreamSide(StreamSide):
    """asyncio's streams on uvloop's event loop."""

    def run(self, fn):
        import asyncio as a

        import uvloop
        with a.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(fn(a))


async def _server(a, handler):
    srv = await a.start_server(handler, "127.0.0.1", 0)
    return srv, srv.sockets[0].getsockname()[1]


async def _peer_pair(a, limit=None):
    """(reader, writer, peer socket): our stream client connected to a plain peer."""
    lst = Listener()
    kw = {} if limit is None else {"limit": limit}
    r, w = await a.open_connection("127.0.0.1", lst.port, **kw)
    # a small send buffer, so a 2 MB write leaves the writer paused
    w.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKBUF)
    peer, _ = lst.sock.accept()
    peer.setblocking(False)
    lst.opened.append(peer)
    r._looplab_listener = lst
    return r, w, peer


def _done(r, w):
    try:
        w.close()
    except Exception:
        pass
    r._looplab_listener.close()


@probe("stream")
async def st_readexactly_incomplete(a):
    """readexactly(10) when the peer sends 5 bytes and EOF."""
    r, w, peer = await _peer_pair(a)
    peer.sendall(b"12345")
    peer.shutdown(socket.SHUT_WR)
    try:
        await r.readexactly(10)
        out = {"raised": None}
    except EOFError as exc:
        out = {"raised": ename(exc), "partial": len(exc.partial), "expected": exc.expected}
    out["at_eof"] = r.at_eof()
    _done(r, w)
    return out


@probe("stream")
async def st_readexactly_edges(a):
    """readexactly(0) and readexactly(-1)."""
    r, w, peer = await _peer_pair(a)
    out = {"zero": (await catch(r.readexactly(0))), "negative": await catch(r.readexactly(-1))}
    out["zero"] = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in out["zero"].items()}
    _done(r, w)
    return out


@probe("stream")
async def st_readexactly_split_and_read_partial(a):
    """readexactly(10) across two sends; read(100) returns what is there."""
    r, w, peer = await _peer_pair(a)
    peer.sendall(b"abc")
    a.get_running_loop().call_later(0.02, peer.sendall, b"defghij")
    whole = await a.wait_for(r.readexactly(10), 1)
    peer.sendall(b"12345")
    await a.sleep(0.02)
    part = await a.wait_for(r.read(100), 1)
    _done(r, w)
    return {"readexactly": whole.decode(), "read": part.decode()}


@probe("stream")
async def st_readuntil_limit_not_found(a):
    """readuntil() with limit=16 and 40 bytes without separator."""
    r, w, peer = await _peer_pair(a, limit=16)
    peer.sendall(b"x" * 40)
    await a.sleep(0.05)
    try:
        await r.readuntil(b"\n")
        out = {"raised": None}
    except Exception as exc:
        out = {"raised": ename(exc), "consumed": getattr(exc, "consumed", None)}
    peer.sendall(b"\n")
    rest = await a.wait_for(r.read(100), 1)
    out["left_in_buffer"] = len(rest)
    _done(r, w)
    return out


@probe("stream")
async def st_readuntil_found_beyond_limit(a):
    """readuntil() with limit=8 when the separator is at offset 12."""
    r, w, peer = await _peer_pair(a, limit=8)
    peer.sendall(b"y" * 12 + b"\n" + b"tail")
    await a.sleep(0.05)
    try:
        await r.readuntil(b"\n")
        out = {"raised": None}
    except Exception as exc:
        out = {"raised": ename(exc), "consumed": getattr(exc, "consumed", None)}
    _done(r, w)
    return out


@probe("stream")
async def st_readuntil_eof_partial(a):
    """readuntil() when EOF comes first: IncompleteReadError with the partial data."""
    r, w, peer = await _peer_pair(a)
    peer.sendall(b"abc")
    peer.shutdown(socket.SHUT_WR)
    try:
        await r.readuntil(b"\n")
        out = {"raised": None}
    except Exception as exc:
        out = {"raised": ename(exc), "partial": getattr(exc, "partial", b"").decode()}
    out["after"] = (await r.read()).decode()
    _done(r, w)
    return out


@probe("stream")
async def st_readuntil_empty_separator(a):
    """readuntil(b'') is a ValueError."""
    r, w, peer = await _peer_pair(a)
    out = await catch(r.readuntil(b""))
    _done(r, w)
    return out


@probe("stream")
async def st_readline_over_limit(a):
    """readline() over the limit: ValueError, and what is left afterwards."""
    r, w, peer = await _peer_pair(a, limit=8)
    peer.sendall(b"z" * 20 + b"\nnext\n")
    await a.sleep(0.05)
    out = await catch(r.readline())
    nxt = await a.wait_for(r.readline(), 1)
    out["next_line"] = nxt.decode()
    _done(r, w)
    return out


@probe("stream")
async def st_at_eof_sequence(a):
    """at_eof() before data, with data buffered, with data+EOF buffered, after reading."""
    r, w, peer = await _peer_pair(a)
    seen = [r.at_eof()]
    peer.sendall(b"data")
    await a.sleep(0.03)
    seen.append(r.at_eof())
    peer.shutdown(socket.SHUT_WR)
    await a.sleep(0.03)
    seen.append(r.at_eof())
    await r.read(4)
    seen.append(r.at_eof())
    again = [await r.read(), await r.read(10)]
    _done(r, w)
    return {"at_eof": seen, "reads_after_eof": [x.decode() for x in again]}


@probe("stream")
async def st_wait_closed_twice(a):
    """close(); wait_closed(); wait_closed() again; is_closing()."""
    r, w, peer = await _peer_pair(a)
    w.close()
    first = await catch(a.wait_for(w.wait_closed(), 1))
    second = await catch(a.wait_for(w.wait_closed(), 1))
    out = {"first": first, "second": second, "is_closing": w.is_closing()}
    _done(r, w)
    return out


@probe("stream")
async def st_wait_closed_after_reset(a):
    """Peer resets; we close and wait_closed(): does the reset surface there?"""
    r, w, peer = await _peer_pair(a)
    reset(peer)
    await a.sleep(0.05)
    w.close()
    out = await catch(a.wait_for(w.wait_closed(), 1))
    _done(r, w)
    return out


@probe("stream")
async def st_read_after_reset(a):
    """read() after the peer reset the connection, twice."""
    r, w, peer = await _peer_pair(a)
    reset(peer)
    await a.sleep(0.05)
    out = {"first": await catch(a.wait_for(r.read(10), 1)),
           "second": await catch(a.wait_for(r.read(10), 1))}
    _done(r, w)
    return out


@probe("stream")
async def st_write_drain_after_reset(a):
    """Peer resets; write() then drain(), twice: which call raises what?"""
    r, w, peer = await _peer_pair(a)
    reset(peer)
    await a.sleep(0.05)
    out = []
    for _ in range(2):
        try:
            w.write(b"x" * 1000)
            wr = None
        except Exception as exc:
            wr = ename(exc)
        out.append({"write": wr, "drain": (await catch(a.wait_for(w.drain(), 1))).get("raised")})
    _done(r, w)
    return {"attempts": out}


@probe("stream")
async def st_drain_after_close(a):
    """close() then drain()."""
    r, w, peer = await _peer_pair(a)
    w.close()
    out = await catch(a.wait_for(w.drain(), 1))
    _done(r, w)
    return out


@probe("stream")
async def st_drain_several_waiters(a):
    """Three tasks drain() on one paused writer; the peer then reads everything."""
    r, w, peer = await _peer_pair(a)
    w.write(b"d" * (2 * MB))
    results = []

    async def waiter(i):
        try:
            await w.drain()
            results.append((i, None))
        except Exception as exc:
            results.append((i, ename(exc)))
    tasks = [a.create_task(waiter(i)) for i in range(3)]
    await a.sleep(0.02)
    blocked = sum(not t.done() for t in tasks)
    got = 0
    for _ in range(2000):
        n, _eof = drain(peer)
        got += n
        if all(t.done() for t in tasks) and got >= 2 * MB:
            break
        await a.sleep(0.001)
    _done(r, w)
    return {"blocked_while_paused": blocked, "outcomes": sorted(results)}


@probe("stream")
async def st_drain_waiters_on_reset(a):
    """Two tasks blocked in drain() when the peer resets: what do they get?"""
    r, w, peer = await _peer_pair(a)
    w.write(b"d" * (2 * MB))
    outs = []

    async def waiter():
        outs.append((await catch(w.drain())).get("raised", "ok"))
    tasks = [a.create_task(waiter()) for _ in range(2)]
    await a.sleep(0.02)
    reset(peer)
    await a.wait_for(a.gather(*tasks), 1)
    _done(r, w)
    return {"outcomes": sorted(outs)}


@probe("stream")
async def st_write_after_close_silent(a):
    """write() after close() on a stream writer: silent or raised?"""
    r, w, peer = await _peer_pair(a)
    w.close()
    try:
        w.write(b"x")
        out = {"raised": None}
    except Exception as exc:
        out = {"raised": ename(exc)}
    await a.sleep(0.02)
    _done(r, w)
    return out


@probe("stream")
async def st_half_close_reply(a):
    """Peer half-closes; we read to EOF, reply, write_eof(); the peer gets reply + EOF."""
    r, w, peer = await _peer_pair(a)
    peer.sendall(b"question")
    peer.shutdown(socket.SHUT_WR)
    q = await r.read()
    w.write(b"answer")
    w.write_eof()
    await w.drain()
    await a.sleep(0.03)
    got = peer.recv(100)
    eof = peer.recv(100) == b""
    _done(r, w)
    return {"question": q.decode(), "reply": got.decode(), "peer_eof": eof,
            "can_write_eof": w.can_write_eof()}


@probe("stream")
async def st_server_handler_exception(a):
    """An exception in a start_server client handler: logged? connection closed?"""
    handled = []
    loop = a.get_running_loop()
    loop.set_exception_handler(lambda lp, ctx: handled.append(ename(ctx.get("exception"))))

    async def handler(r, w):
        raise ValueError("handler failed")
    srv, port = await _server(a, handler)
    r, w = await a.open_connection("127.0.0.1", port)
    data = await catch(a.wait_for(r.read(), 1))
    w.close()
    srv.close()
    await srv.wait_closed()
    await a.sleep(0.02)
    gc.collect()
    await a.sleep(0.01)
    return {"client_read": data.get("value", b"").decode() if "value" in data else data,
            "handled": handled}


@probe("stream")
async def st_connect_refused(a):
    """open_connection() to a port nobody listens on."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    out = await catch(a.wait_for(a.open_connection("127.0.0.1", port), 2))
    out["is_OSError"] = out.get("raised") in ("ConnectionRefusedError", "OSError")
    return out
