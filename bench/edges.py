"""Edge probes for ``looplab fidelity``: small programs that poke one behaviour each.

Each probe is written once per API style and runs unchanged on our kernel and on the
libraries it reproduces:

* ``callback`` probes get a ``CallbackSide`` (``h.loop`` is our ``kernels.callback.Loop``
  or an asyncio/uvloop event loop; transports and protocols are the shared asyncio API).
* ``stream`` probes are ``async def probe(a)`` where ``a`` is ``asyncio`` or
  ``kernels.hybrid`` (the same names: streams, tasks, futures, timeouts).
* ``task`` probes are ``async def probe(k)`` where ``k`` is a ``TaskSide``: a tiny
  adapter that maps sleep/spawn/join/timeouts/Event/sockets onto ``kernels.coro``,
  curio or trio, and names exceptions by their *role* (``"timeout"``,
  ``"cancelled"``, ``"task-error"``...) so that curio's ``TaskCancelled`` and our
  ``Cancelled`` compare equal while a genuinely different exception does not.

A probe returns a small JSON-able observation: names, counts, booleans, never an
address, a line number or a chunk boundary. The peer of every connection is a plain
socket the probe drives itself, so a reset or a half-close happens exactly where the
probe says. Run as ``python -m bench.edges RUNTIME [NAME,...]``: one JSON line per
probe on stdout (the fidelity verb starts one such process per runtime).
"""
from __future__ import annotations

import contextvars
import gc
import json
import logging
import signal
import socket
import struct
import sys
import time

__all__ = ["PROBES", "EdgeProbe", "STYLE_OF", "probe", "run_probes", "CallbackSide", "TaskSide"]

#: runtime id -> probe style
STYLE_OF = {
    "callback": "callback", "asyncio-protocol": "callback", "uvloop-protocol": "callback",
    "hybrid": "stream", "asyncio-streams": "stream", "uvloop-streams": "stream",
    "coro": "task", "curio": "task", "trio": "task",
}

MB = 1_000_000
SOCKBUF = 65536
PROBE_TIMEOUT_S = 5.0


class EdgeProbe:
    """One registered probe: ``name``, ``style``, the function, what it checks, and
    the runtimes it does not apply to (the API does not map there)."""
    __slots__ = ("name", "style", "fn", "doc", "skip")

    def __init__(self, name, style, fn, doc, skip):
        self.name, self.style, self.fn, self.doc, self.skip = name, style, fn, doc, skip


PROBES: dict[str, EdgeProbe] = {}


def probe(style, skip=()):
    def register(fn):
        name = fn.__name__
        if name in PROBES:
            raise ValueError(f"duplicate probe {name}")
        doc = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else name
        PROBES[name] = EdgeProbe(name, style, fn, doc, tuple(skip))
        return fn
    return register


def ename(exc) -> str | None:
    return None if exc is None else type(exc).__name__


# ---------------------------------------------------------------------------
# Plain-socket peers

class _Listener:
    """A 127.0.0.1 listening socket: ``pair()`` -> (our socket, the peer's socket)."""

    def __init__(self):
        self.sock = socket.socket()
        # Small kernel buffers (inherited by accepted sockets), so a 1 MB write
        # really leaves most of itself in the user-space buffer.
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKBUF)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.opened = []

    def pair(self):
        ours = socket.socket()
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKBUF)
        ours.connect(("127.0.0.1", self.port))
        peer, _ = self.sock.accept()
        peer.setblocking(False)
        self.opened += [ours, peer]
        return ours, peer

    def close(self):
        for s in self.opened + [self.sock]:
            try:
                s.close()
            except OSError:
                pass


def reset(peer):
    """Close ``peer`` with an RST instead of a FIN (SO_LINGER 0)."""
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    peer.close()


def drain(peer) -> tuple[int, bool]:
    """Read what a non-blocking peer socket has: (bytes, saw EOF)."""
    n = 0
    while True:
        try:
            chunk = peer.recv(1 << 20)
        except (BlockingIOError, InterruptedError):
            return n, False
        except OSError:
            return n, True
        if not chunk:
            return n, True
        n += len(chunk)


class _LogCatcher(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


# ---------------------------------------------------------------------------
# Callback style

class Rec:
    """A protocol that records what happened to it, in order."""

    def __init__(self, eof_ret=None):
        self.events = []
        self.eof_ret = eof_ret
        self.transport = None
        self.received = 0
        self.lost = False

    def connection_made(self, transport):
        self.transport = transport
        self.events.append("made")

    def data_received(self, data):
        if not self.events or self.events[-1] != "data":
            self.events.append("data")
        self.received += len(data)

    def eof_received(self):
        self.events.append("eof")
        return self.eof_ret

    def connection_lost(self, exc):
        self.lost = True
        self.events.append(f"lost:{ename(exc)}")

    def pause_writing(self):
        self.events.append("pause")

    def resume_writing(self):
        self.events.append("resume")


class CallbackSide:
    """One callback-style runtime: a loop, a peer listener, and the two channels a
    loop reports through (its exception handler, and asyncio's logger)."""

    def __init__(self, rid, options=None):
        if rid == "callback":
            from kernels.callback import Loop
            self.loop = Loop(**(options or {}))
            self.ours = True
        else:
            import asyncio
            if rid == "uvloop-protocol":
                import uvloop
                self.loop = uvloop.new_event_loop()
            else:
                self.loop = asyncio.new_event_loop()
            self.ours = False
        self.handled = []
        self.loop.set_exception_handler(
            lambda loop, ctx: self.handled.append(ename(ctx.get("exception"))))
        self.log = _LogCatcher()
        # each loop logs on its own logger: asyncio's, or our kernel's package logger
        self._logger = logging.getLogger("kernels.callback" if self.ours else "asyncio")
        self._logger.addHandler(self.log)
        self.listener = _Listener()

    def close(self):
        self._logger.removeHandler(self.log)
        try:
            self.loop.close()
        finally:
            self.listener.close()

    def reports(self) -> dict:
        return {"handler": len(self.handled), "log": len(self.log.messages)}

    def connect(self, eof_ret=None, high=None):
        """A transport on a fresh connection: (transport, protocol, peer socket)."""
        ours, peer = self.listener.pair()
        proto = Rec(eof_ret)
        if self.ours:
            self.loop.connect_accepted_socket(lambda: proto, ours)
        else:
            ours.setblocking(False)
            self.loop.run_until_complete(self.loop.connect_accepted_socket(lambda: proto, ours))
        self.spin(lambda: proto.transport is not None, 2.0)
        if high is not None:
            proto.transport.set_write_buffer_limits(high=high)
        return proto.transport, proto, peer

    def spin(self, until=None, timeout=0.1, each=None):
        """Run the loop until ``until()`` holds or ``timeout`` passes; ``each()``
        runs every millisecond or so (a peer draining its socket, say)."""
        loop = self.loop
        deadline = time.monotonic() + timeout

        def check():
            if each is not None:
                each()
            if (until is not None and until()) or time.monotonic() >= deadline:
                loop.stop()
            else:
                loop.call_later(0.001, check)
        loop.call_soon(check)
        loop.run_forever()

    def fill(self, transport, nbytes=MB):
        """Write ``nbytes`` to a peer that isn't reading, so most of it stays buffered."""
        transport.write(b"x" * nbytes)
        return transport.get_write_buffer_size()

    def read_all(self, peer, proto, timeout=2.0):
        """Drain the peer until EOF (or the protocol is lost and the peer is empty)."""
        got = [0, False]

        def each():
            n, eof = drain(peer)
            got[0] += n
            got[1] = got[1] or eof
        self.spin(lambda: got[1], timeout, each)
        return got[0], got[1]


def _cb_write_after_close(h, when):
    t, p, peer = h.connect()
    if when == "lost-exc":
        reset(peer)
        t.write(b"ping")
        h.spin(lambda: p.lost, 1.0)
    else:
        t.close()
        h.spin(lambda: p.lost, 1.0)
    raised = []
    for _ in range(7):
        try:
            t.write(b"x")
        except Exception as exc:
            raised.append(ename(exc))
    h.spin(timeout=0.05)
    return dict(h.reports(), lost=p.events[-1] if p.lost else None,
                raised=sorted(set(raised)))


@probe("callback")
def cb_write_after_close_buffered(h):
    """write() after close() while 1 MB is buffered: are the bytes delivered?"""
    t, p, peer = h.connect(high=4 * MB)
    h.fill(t)
    t.close()
    t.write(b"y" * 1000)
    got, eof = h.read_all(peer, p)
    return {"peer_received_beyond_1MB": got - MB, "eof": eof, "lost": p.events[-1]}


@probe("callback")
def cb_write_after_close_empty(h):
    """7 writes after close() with nothing buffered: how are they reported?"""
    return _cb_write_after_close(h, "closed")


@probe("callback")
def cb_write_after_connection_lost_exc(h):
    """7 writes after connection_lost(ConnectionResetError): how are they reported?"""
    return _cb_write_after_close(h, "lost-exc")


@probe("callback")
def cb_write_after_completed_buffered_close(h):
    """write() after a buffered close has completed with connection_lost(None)."""
    t, p, peer = h.connect(high=4 * MB)
    h.fill(t)
    t.close()
    h.read_all(peer, p)
    h.spin(lambda: p.lost, 1.0)
    try:
        t.write(b"z")
        raised = None
    except Exception as exc:
        raised = ename(exc)
    h.spin(timeout=0.02)
    return {"raised": raised, "lost": p.events[-1]}


@probe("callback")
def cb_lower_high_water_after_close(h):
    """set_write_buffer_limits(high=1024) after close() while 1 MB drains: pause_writing()?"""
    t, p, peer = h.connect(high=4 * MB)
    h.fill(t)
    t.close()
    t.set_write_buffer_limits(high=1024)
    h.read_all(peer, p)
    return {"events": [e for e in p.events if e != "data"]}


@probe("callback")
def cb_is_reading_after_eof_kept_open(h):
    """is_reading() after EOF when eof_received() returned True."""
    t, p, peer = h.connect(eof_ret=True)
    peer.shutdown(socket.SHUT_WR)
    h.spin(lambda: "eof" in p.events, 1.0)
    return {"is_reading": t.is_reading(), "is_closing": t.is_closing()}


@probe("callback")
def cb_pause_resume_after_eof(h):
    """pause_reading(); resume_reading() after a kept-open EOF: eof_received() again?"""
    t, p, peer = h.connect(eof_ret=True)
    peer.shutdown(socket.SHUT_WR)
    h.spin(lambda: "eof" in p.events, 1.0)
    t.pause_reading()
    t.resume_reading()
    h.spin(timeout=0.05)
    return {"eof_received_calls": p.events.count("eof")}


@probe("callback")
def cb_eof_not_kept_open(h):
    """eof_received() returning None: the transport closes itself."""
    t, p, peer = h.connect(eof_ret=None)
    peer.sendall(b"abc")
    peer.shutdown(socket.SHUT_WR)
    h.spin(lambda: p.lost, 1.0)
    return {"events": p.events, "is_closing": t.is_closing()}


@probe("callback")
def cb_eof_kept_open_can_write(h):
    """After a kept-open EOF, writes still reach the half-closed peer."""
    t, p, peer = h.connect(eof_ret=True)
    peer.shutdown(socket.SHUT_WR)
    h.spin(lambda: "eof" in p.events, 1.0)
    t.write(b"after-eof")
    h.spin(timeout=0.03)
    n, _ = drain(peer)
    return {"peer_got": n, "events": p.events}


@probe("callback")
def cb_write_empty_after_write_eof(h):
    """write(b'') after write_eof()."""
    t, p, peer = h.connect()
    t.write_eof()
    try:
        t.write(b"")
        return {"raised": None}
    except Exception as exc:
        return {"raised": ename(exc)}


@probe("callback")
def cb_write_after_write_eof(h):
    """write(b'x') after write_eof()."""
    t, p, peer = h.connect()
    t.write_eof()
    try:
        t.write(b"x")
        return {"raised": None}
    except Exception as exc:
        return {"raised": ename(exc)}


@probe("callback")
def cb_write_eof_twice_and_flush(h):
    """write_eof() twice after a 1 MB write: everything arrives, then EOF."""
    t, p, peer = h.connect(high=4 * MB)
    h.fill(t)
    t.write_eof()
    t.write_eof()
    got, eof = h.read_all(peer, p)
    return {"peer_received": got, "eof": eof, "is_closing": t.is_closing(),
            "can_write_eof": t.can_write_eof()}


@probe("callback")
def cb_is_reading_states(h):
    """is_reading() through pause, pause again, resume, resume again, close."""
    t, p, peer = h.connect()
    seen = [t.is_reading()]
    for step in (t.pause_reading, t.pause_reading, t.resume_reading, t.resume_reading, t.close):
        step()
        seen.append(t.is_reading())
    h.spin(lambda: p.lost, 1.0)
    seen.append(t.is_reading())
    return {"is_reading": seen}


@probe("callback")
def cb_paused_reading_holds_data(h):
    """Data sent while reading is paused arrives only after resume_reading()."""
    t, p, peer = h.connect()
    t.pause_reading()
    peer.sendall(b"a" * 100)
    h.spin(timeout=0.03)
    before = p.received
    t.resume_reading()
    h.spin(lambda: p.received >= 100, 1.0)
    return {"while_paused": before, "after_resume": p.received}


@probe("callback")
def cb_pause_reading_after_close(h):
    """pause_reading()/resume_reading() on a closing transport."""
    t, p, peer = h.connect()
    t.close()
    out = []
    for step in (t.pause_reading, t.resume_reading):
        try:
            step()
            out.append(None)
        except Exception as exc:
            out.append(ename(exc))
    h.spin(lambda: p.lost, 1.0)
    return {"raised": out}


@probe("callback")
def cb_default_buffer_limits(h):
    """get_write_buffer_limits() by default, after high=1000, after low=1000."""
    t, p, peer = h.connect()
    out = [list(t.get_write_buffer_limits())]
    t.set_write_buffer_limits(high=1000)
    out.append(list(t.get_write_buffer_limits()))
    t.set_write_buffer_limits(low=1000)
    out.append(list(t.get_write_buffer_limits()))
    return {"limits": out}


@probe("callback")
def cb_bad_buffer_limits(h):
    """set_write_buffer_limits(high=10, low=20) and high=-1."""
    t, p, peer = h.connect()
    out = []
    for kw in ({"high": 10, "low": 20}, {"high": -1}):
        try:
            t.set_write_buffer_limits(**kw)
            out.append(None)
        except Exception as exc:
            out.append(ename(exc))
    return {"raised": out}


@probe("callback")
def cb_pause_resume_writing_cycle(h):
    """A 1 MB write to a slow peer: pause_writing() once, resume_writing() once."""
    t, p, peer = h.connect()
    size = h.fill(t)
    h.read_all(peer, p, timeout=0.5)
    return {"buffered_after_write": size > 0, "events": [e for e in p.events if e != "data"],
            "buffer_after_drain": t.get_write_buffer_size()}


@probe("callback")
def cb_abort_with_buffer(h):
    """abort() with 1 MB buffered: buffer dropped, connection_lost(None) on a later pass."""
    t, p, peer = h.connect(high=4 * MB)
    h.fill(t)
    t.abort()
    lost_at_once = p.lost
    h.spin(lambda: p.lost, 1.0)
    got, eof = h.read_all(peer, p, timeout=0.5)
    return {"lost_at_once": lost_at_once, "events": p.events, "buffer": t.get_write_buffer_size(),
            "peer_got_all": got >= MB, "is_closing": t.is_closing()}


@probe("callback")
def cb_close_twice_abort_after(h):
    """close(); close(); abort() on a buffered transport: connection_lost once."""
    t, p, peer = h.connect(high=4 * MB)
    h.fill(t)
    t.close()
    t.close()
    t.abort()
    h.spin(timeout=0.05)
    return {"lost_calls": sum(e.startswith("lost") for e in p.events), "events": p.events}


@probe("callback")
def cb_close_is_deferred(h):
    """close() with nothing buffered: connection_lost is not called inside close()."""
    t, p, peer = h.connect()
    t.close()
    inside = p.lost
    h.spin(lambda: p.lost, 1.0)
    return {"lost_inside_close": inside, "events": p.events, "is_closing": t.is_closing()}


@probe("callback")
def cb_data_after_close_ignored(h):
    """Data the peer sends after our close() is not delivered to the protocol."""
    t, p, peer = h.connect()
    t.close()
    try:
        peer.sendall(b"late")
    except OSError:
        pass
    h.spin(timeout=0.03)
    return {"events": p.events, "received": p.received}


@probe("callback")
def cb_peer_reset_while_reading(h):
    """Peer sends an RST while we read: where does it surface?"""
    t, p, peer = h.connect()
    reset(peer)
    h.spin(lambda: p.lost, 1.0)
    return dict(h.reports(), events=p.events)


@probe("callback")
def cb_peer_reset_while_buffered(h):
    """Peer resets while 1 MB sits in our buffer."""
    t, p, peer = h.connect(high=4 * MB)
    h.fill(t)
    reset(peer)
    h.spin(lambda: p.lost, 1.0)
    return dict(h.reports(), events=[e for e in p.events if e != "data"],
                buffer=t.get_write_buffer_size())


@probe("callback")
def cb_write_to_closed_peer(h):
    """Peer closes (FIN, kept open by us); we write twice: where does EPIPE surface?"""
    t, p, peer = h.connect(eof_ret=True)
    peer.close()
    h.spin(lambda: "eof" in p.events, 1.0)
    t.write(b"one")
    h.spin(timeout=0.05)
    t.write(b"two")
    h.spin(lambda: p.lost, 0.3)
    return dict(h.reports(), events=p.events)


@probe("callback")
def cb_writelines_and_memoryview(h):
    """writelines() and memoryview writes arrive intact; bad types raise."""
    t, p, peer = h.connect()
    t.writelines([b"ab", bytearray(b"cd"), memoryview(b"ef")])
    try:
        t.write("str")
        bad = None
    except Exception as exc:
        bad = ename(exc)
    h.spin(timeout=0.03)
    got = b""
    try:
        got = peer.recv(100)
    except BlockingIOError:
        pass
    return {"peer_got": got.decode(), "write_str_raised": bad}


@probe("callback")
def cb_extra_info(h):
    """get_extra_info(): peername, sockname, socket present, unknown key default."""
    t, p, peer = h.connect()
    return {"peer_host": t.get_extra_info("peername")[0],
            "sock_host": t.get_extra_info("sockname")[0],
            "has_socket": t.get_extra_info("socket") is not None,
            "unknown": t.get_extra_info("no-such-key", "dflt")}


@probe("callback")
def cb_callback_exception_reported(h):
    """An exception in a call_soon callback goes to the exception handler; the loop goes on."""
    order = []
    h.loop.call_soon(lambda: 1 / 0)
    h.loop.call_soon(order.append, "next")
    h.spin(timeout=0.02)
    return {"handled": h.handled, "order": order}


@probe("callback")
def cb_call_soon_vs_call_later_zero(h):
    """call_later(0, a) then call_soon(b): which runs first?"""
    order = []
    h.loop.call_later(0, order.append, "later0")
    h.loop.call_soon(order.append, "soon")
    h.loop.call_later(-1, order.append, "later-neg")
    h.spin(timeout=0.02)
    return {"order": order}


@probe("callback")
def cb_cancelled_handle(h):
    """A cancelled call_soon/call_later handle never runs; cancel() is idempotent."""
    order = []
    a = h.loop.call_soon(order.append, "a")
    b = h.loop.call_later(0.001, order.append, "b")
    a.cancel()
    a.cancel()
    b.cancel()
    h.spin(timeout=0.02)
    return {"order": order, "cancelled": [a.cancelled(), b.cancelled()]}


@probe("callback")
def cb_stop_before_run(h):
    """stop() before run_forever(): one pass runs the callbacks queued so far."""
    order = []
    h.loop.call_soon(order.append, 1)
    h.loop.call_soon(lambda: h.loop.call_soon(order.append, 3))
    h.loop.stop()
    h.loop.run_forever()
    first = list(order)
    h.spin(timeout=0.01)
    return {"first_run": first, "after": order}


# ---------------------------------------------------------------------------
# Stream style: ``a`` is asyncio or kernels.hybrid

async def _server(a, handler):
    srv = await a.start_server(handler, "127.0.0.1", 0)
    return srv, srv.sockets[0].getsockname()[1]


async def _peer_pair(a, limit=None):
    """(reader, writer, peer socket): our stream client connected to a plain peer."""
    lst = _Listener()
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


async def _catch(aw):
    try:
        return {"value": await aw}
    except BaseException as exc:
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return {"raised": ename(exc)}


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
    out = {"zero": (await _catch(r.readexactly(0))), "negative": await _catch(r.readexactly(-1))}
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
    out = await _catch(r.readuntil(b""))
    _done(r, w)
    return out


@probe("stream")
async def st_readline_over_limit(a):
    """readline() over the limit: ValueError, and what is left afterwards."""
    r, w, peer = await _peer_pair(a, limit=8)
    peer.sendall(b"z" * 20 + b"\nnext\n")
    await a.sleep(0.05)
    out = await _catch(r.readline())
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
    first = await _catch(a.wait_for(w.wait_closed(), 1))
    second = await _catch(a.wait_for(w.wait_closed(), 1))
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
    out = await _catch(a.wait_for(w.wait_closed(), 1))
    _done(r, w)
    return out


@probe("stream")
async def st_read_after_reset(a):
    """read() after the peer reset the connection, twice."""
    r, w, peer = await _peer_pair(a)
    reset(peer)
    await a.sleep(0.05)
    out = {"first": await _catch(a.wait_for(r.read(10), 1)),
           "second": await _catch(a.wait_for(r.read(10), 1))}
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
        out.append({"write": wr, "drain": (await _catch(a.wait_for(w.drain(), 1))).get("raised")})
    _done(r, w)
    return {"attempts": out}


@probe("stream")
async def st_drain_after_close(a):
    """close() then drain()."""
    r, w, peer = await _peer_pair(a)
    w.close()
    out = await _catch(a.wait_for(w.drain(), 1))
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
        outs.append((await _catch(w.drain())).get("raised", "ok"))
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
    data = await _catch(a.wait_for(r.read(), 1))
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
    out = await _catch(a.wait_for(a.open_connection("127.0.0.1", port), 2))
    out["is_OSError"] = out.get("raised") in ("ConnectionRefusedError", "OSError")
    return out


# -- tasks -------------------------------------------------------------------

@probe("stream")
async def tk_eager_spawn(a):
    """Eager tasks (3.12's eager_task_factory): is there one, and does the child's first
    step run inside create_task()? Where there is none, spawning is lazy."""
    factory = getattr(a, "eager_task_factory", None)
    if factory is None:
        return {"eager_factory": False}
    loop = a.get_running_loop()
    loop.set_task_factory(factory)
    order = []

    async def child():
        order.append("child")
    try:
        t = a.create_task(child())
        order.append("parent")
        await t
    finally:
        loop.set_task_factory(None)
    return {"eager_factory": True, "order": order}


@probe("stream")
async def tk_timeout_uncancels(a):
    """After an expired timeout() is caught, the task's cancelling() count is back to 0."""
    try:
        async with a.timeout(0.01):
            await a.sleep(1)
    except TimeoutError:
        pass
    task = a.current_task()
    await a.sleep(0)
    return {"cancelling": task.cancelling(), "still_runs": True}


@probe("stream")
async def tk_cancel_uncancel(a):
    """cancel() twice, then cancelling()/uncancel() inside the task."""
    seen = {}

    async def child():
        try:
            await a.sleep(10)
        except a.CancelledError:
            task = a.current_task()
            seen["cancelling"] = task.cancelling()
            seen["uncancel"] = [task.uncancel(), task.uncancel()]
            seen["after"] = task.cancelling()
            return "swallowed"
    t = a.create_task(child())
    await a.sleep(0)
    seen["first_cancel"] = t.cancel()
    seen["second_cancel"] = t.cancel()
    res = await _catch(t)
    return {**seen, **res, "cancelled": t.cancelled()}


@probe("stream")
async def tk_cancel_message(a):
    """cancel('why'): what the task sees, and what awaiting it raises."""
    seen = {}

    async def child():
        try:
            await a.sleep(10)
        except a.CancelledError as exc:
            seen["inside_args"] = list(exc.args)
            raise
    t = a.create_task(child())
    await a.sleep(0)
    t.cancel("why")
    try:
        await t
    except a.CancelledError as exc:
        seen["outside_args"] = list(exc.args)
    return seen


@probe("stream")
async def tk_cancel_before_first_step(a):
    """cancel() right after create_task(): the body never runs."""
    ran = []

    async def child():
        ran.append(1)
    t = a.create_task(child())
    first = t.cancel()
    out = await _catch(t)
    return {"cancel": first, "ran": bool(ran), "cancelled": t.cancelled(), **out,
            "cancel_done": t.cancel()}


@probe("stream")
async def tk_cancel_caught_returns(a):
    """A task that swallows its cancellation and returns: cancelled() or a result?"""
    async def child():
        try:
            await a.sleep(10)
        except a.CancelledError:
            return 42
    t = a.create_task(child())
    await a.sleep(0)
    t.cancel()
    out = await _catch(t)
    return {**out, "cancelled": t.cancelled()}


@probe("stream")
async def tk_cancelled_error_base(a):
    """CancelledError's base class, and what `except Exception` catches."""
    caught = []

    async def child():
        try:
            await a.sleep(10)
        except Exception:
            caught.append("Exception")
    t = a.create_task(child())
    await a.sleep(0)
    t.cancel()
    await _catch(t)
    return {"is_exception": issubclass(a.CancelledError, Exception), "caught": caught,
            "cancelled": t.cancelled()}


@probe("stream")
async def tk_wait_for_timeout(a):
    """wait_for(sleep(10), 0.01): what it raises and the inner coroutine's fate."""
    seen = []

    async def slow():
        try:
            await a.sleep(10)
        except a.CancelledError:
            seen.append("cancelled")
            raise
    try:
        await a.wait_for(slow(), 0.01)
        out = {"raised": None}
    except BaseException as exc:
        out = {"raised": ename(exc), "is_builtin_TimeoutError": isinstance(exc, TimeoutError)}
    out["inner"] = seen
    return out


@probe("stream")
async def tk_wait_for_runs_in_new_task(a):
    """wait_for(coro, 1): is current_task() inside the coroutine the caller?"""
    outer = a.current_task()

    async def inner():
        return a.current_task() is outer
    return {"same_task": await a.wait_for(inner(), 1)}


@probe("stream")
async def tk_wait_for_zero_timeout(a):
    """wait_for(coro_that_returns_at_once, 0)."""
    ran = []

    async def quick():
        ran.append(1)
        return "done"
    out = await _catch(a.wait_for(quick(), 0))
    out["ran"] = bool(ran)
    return out


@probe("stream")
async def tk_wait_for_none_timeout(a):
    """wait_for(coro, None) just awaits it."""
    async def quick():
        await a.sleep(0)
        return 7
    return await _catch(a.wait_for(quick(), None))


@probe("stream")
async def tk_wait_for_outer_cancel(a):
    """The caller of wait_for(slow, 10) is cancelled: the inner coroutine is cancelled too."""
    seen = []

    async def slow():
        try:
            await a.sleep(10)
        except a.CancelledError:
            seen.append("inner-cancelled")
            raise

    async def caller():
        await a.wait_for(slow(), 10)
    t = a.create_task(caller())
    await a.sleep(0.01)
    t.cancel()
    out = await _catch(t)
    return {**out, "seen": seen}


_VAR = contextvars.ContextVar("looplab_fidelity", default="default")


@probe("stream")
async def tk_contextvar_set_after_create(a):
    """A contextvar set by the parent after create_task(): what the child reads."""
    _VAR.set("before")
    seen = []

    async def child():
        seen.append(_VAR.get())
    t = a.create_task(child())
    _VAR.set("after")
    await t
    return {"child_sees": seen[0]}


@probe("stream")
async def tk_contextvar_child_isolated(a):
    """A contextvar set inside a child task: does the parent see it?"""
    _VAR.set("parent")

    async def child():
        _VAR.set("child")
    await a.create_task(child())
    return {"parent_sees": _VAR.get()}


@probe("stream")
async def tk_contextvar_in_callbacks(a):
    """call_soon callbacks and done callbacks run in which context?"""
    _VAR.set("task")
    seen = {}
    loop = a.get_running_loop()
    fut = a.Future()
    fut.add_done_callback(lambda f: seen.__setitem__("done_cb", _VAR.get()))
    loop.call_soon(lambda: seen.__setitem__("call_soon", _VAR.get()))
    _VAR.set("changed")
    fut.set_result(None)
    await a.sleep(0)
    await a.sleep(0)
    return seen


def _unretrieved(a, make):
    async def body():
        handled = []
        loop = a.get_running_loop()
        loop.set_exception_handler(lambda lp, ctx: handled.append(
            [ctx.get("message", "").split(":")[0][:40], ename(ctx.get("exception"))]))
        await make()
        for _ in range(3):
            gc.collect()
            await a.sleep(0)
        return {"reports": handled}
    return body()


@probe("stream")
async def tk_unretrieved_future_exception(a):
    """A bare Future's exception never retrieved: is it reported?"""
    async def make():
        f = a.Future()
        f.set_exception(ValueError("lost"))
        del f
    return await _unretrieved(a, make)


@probe("stream")
async def tk_unretrieved_task_exception(a):
    """A Task's exception never retrieved: is it reported?"""
    async def make():
        async def boom():
            raise ValueError("lost")
        t = a.create_task(boom())
        await a.sleep(0)
        await a.sleep(0)
        del t
    return await _unretrieved(a, make)


@probe("stream")
async def tk_retrieved_exception_silent(a):
    """An exception retrieved with exception() is not reported."""
    async def make():
        f = a.Future()
        f.set_exception(ValueError("seen"))
        f.exception()
        del f
    return await _unretrieved(a, make)


@probe("stream")
async def tk_lazy_spawn_order(a):
    """create_task(): does the child run before the parent's next await?"""
    order = []

    async def child():
        order.append("child")
    t = a.create_task(child())
    order.append("parent")
    await a.sleep(0)
    order.append("parent-after-sleep0")
    await t
    return {"order": order}


@probe("stream")
async def tk_sleep0_round_robin(a):
    """Three tasks looping over sleep(0): the interleaving."""
    order = []

    async def worker(name):
        for i in range(3):
            order.append(f"{name}{i}")
            await a.sleep(0)
    await a.gather(worker("a"), worker("b"), worker("c"))
    return {"order": order}


@probe("stream")
async def tk_gather_first_error(a):
    """gather(fail, slow): the error propagates; the sibling keeps running."""
    async def fail():
        raise ValueError("x")

    async def slow():
        await a.sleep(0.03)
        return "slow"
    s = a.ensure_future(slow())
    out = await _catch(a.gather(fail(), s))
    out["sibling_cancelled_at_once"] = s.cancelled()
    out["sibling_result"] = await s
    return out


@probe("stream")
async def tk_gather_return_exceptions(a):
    """gather(..., return_exceptions=True) returns exceptions as values."""
    async def fail():
        raise KeyError("k")
    res = await a.gather(fail(), a.sleep(0, "ok"), return_exceptions=True)
    return {"results": [ename(x) if isinstance(x, BaseException) else x for x in res]}


@probe("stream")
async def tk_timeout_cm(a):
    """async with timeout(0.01): the raised error, expired(), and the inner exception."""
    inner = []
    try:
        async with a.timeout(0.01) as cm:
            try:
                await a.sleep(10)
            except BaseException as exc:
                inner.append(ename(exc))
                raise
        out = {"raised": None}
    except BaseException as exc:
        out = {"raised": ename(exc)}
    out.update(inner=inner, expired=cm.expired())
    return out


@probe("stream")
async def tk_taskgroup_error(a):
    """A TaskGroup child fails: the siblings are cancelled and an ExceptionGroup raised."""
    seen = []

    async def fail():
        await a.sleep(0.01)
        raise ValueError("x")

    async def sibling():
        try:
            await a.sleep(10)
        except a.CancelledError:
            seen.append("sibling-cancelled")
            raise
    try:
        async with a.TaskGroup() as tg:
            tg.create_task(fail())
            tg.create_task(sibling())
        out = {"raised": None}
    except BaseException as exc:
        out = {"raised": ename(exc),
               "inner": [ename(e) for e in getattr(exc, "exceptions", [])]}
    out["seen"] = seen
    return out


@probe("stream")
async def tk_event_wake_order(a):
    """Event.set() with 6 waiters: the order they resume in."""
    ev = a.Event()
    order = []

    async def waiter(i):
        await ev.wait()
        order.append(i)
    tasks = [a.create_task(waiter(i)) for i in range(6)]
    await a.sleep(0)
    ev.set()
    await a.gather(*tasks)
    return {"order": order}


@probe("stream")
async def tk_queue_getters_fifo(a):
    """Queue: waiting getters are served in arrival order."""
    q = a.Queue()
    order = []

    async def getter(i):
        order.append((i, await q.get()))
    tasks = [a.create_task(getter(i)) for i in range(3)]
    await a.sleep(0)
    for item in "xyz":
        q.put_nowait(item)
    await a.gather(*tasks)
    return {"served": [f"{i}{v}" for i, v in order]}


@probe("stream")
async def tk_future_states(a):
    """Future.result() before done, set twice, cancel after done."""
    f = a.Future()
    out = {}
    try:
        f.result()
    except Exception as exc:
        out["result_pending"] = ename(exc)
    f.set_result(1)
    try:
        f.set_result(2)
    except Exception as exc:
        out["set_twice"] = ename(exc)
    out["cancel_done"] = f.cancel()
    out["result"] = f.result()
    return out


@probe("stream")
async def tk_current_task_in_callback(a):
    """current_task() from a plain call_soon callback."""
    seen = []
    a.get_running_loop().call_soon(lambda: seen.append(a.current_task() is None))
    await a.sleep(0)
    await a.sleep(0)
    return {"none_in_callback": seen}


@probe("stream")
async def tk_shielded_cancel_not_mine(a):
    """A task cancelled while awaiting another task: the awaited task is cancelled too."""
    async def inner():
        await a.sleep(10)
    it = a.create_task(inner())

    async def outer():
        await it
    ot = a.create_task(outer())
    await a.sleep(0)
    ot.cancel()
    await _catch(ot)
    await a.sleep(0)
    return {"outer_cancelled": ot.cancelled(), "inner_cancelled": it.cancelled()}


# ---------------------------------------------------------------------------
# Task style: ``k`` maps one API onto kernels.coro, curio or trio

class TaskSide:
    """sleep/spawn/join/cancel/timeouts/Event/sockets and exception roles for one library."""

    def __init__(self, rid, options=None):
        self.rid = rid
        self.options = options or {}
        self.nursery = None
        if rid == "coro":
            import kernels.coro as lib
            self.roles = {lib.Cancelled: "cancelled", lib.TaskTimeout: "timeout",
                          lib.TimeoutCancellationError: "timeout-cancellation",
                          lib.TaskError: "task-error"}
        elif rid == "curio":
            import curio as lib
            self.roles = {lib.TaskCancelled: "cancelled", lib.CancelledError: "cancelled",
                          lib.TaskTimeout: "timeout",
                          lib.TimeoutCancellationError: "timeout-cancellation",
                          lib.UncaughtTimeoutError: "uncaught-timeout",
                          lib.TaskError: "task-error"}
        else:
            import trio as lib
            self.roles = {lib.Cancelled: "cancelled", lib.TooSlowError: "timeout"}
        self.lib = lib

    def role(self, exc) -> str | None:
        if exc is None:
            return None
        for cls in type(exc).__mro__:
            if cls in self.roles:
                return self.roles[cls]
        return type(exc).__name__

    def base(self, exc) -> str:
        return "Exception" if isinstance(exc, Exception) else "BaseException"

    def crash_reports(self) -> int:
        """How many crash reports so far: curio logs them (logger "curio", ERROR); our
        kernel prints a line on stderr. Both channels are caught while a probe runs."""
        return len(self._log.messages) + sum(1 for line in self._err.getvalue().splitlines()
                                             if line.strip())

    def run(self, fn):
        import contextlib
        import io
        self._log, self._err = _LogCatcher(), io.StringIO()
        self._log.setLevel(logging.ERROR)
        logger = logging.getLogger(self.rid)
        logger.addHandler(self._log)
        try:
            with contextlib.redirect_stderr(self._err):
                return self._run(fn)
        finally:
            logger.removeHandler(self._log)

    def _run(self, fn):
        if self.rid in ("coro", "curio"):
            return self.lib.run(fn, self, **self.options)

        async def main():
            async with self.lib.open_nursery() as n:
                self.nursery = n
                out = await fn(self)
                n.cancel_scope.cancel()
            return out
        return self.lib.run(main)

    # -- time and tasks
    async def sleep(self, s):
        await self.lib.sleep(s)

    async def checkpoint(self):
        await self.lib.sleep(0)

    async def spawn(self, fn, *args):
        if self.rid == "trio":
            return _TrioTask(self, fn, args)
        return await self.lib.spawn(fn, *args)

    async def join(self, task):
        return await task.join()

    async def cancel(self, task):
        return await task.cancel()

    def timeout_after(self, s):
        if self.rid == "trio":
            return _AsyncCM(self.lib.fail_after(s))
        return self.lib.timeout_after(s)

    def move_on_after(self, s):
        if self.rid == "curio":
            return self.lib.ignore_after(s)
        if self.rid == "trio":
            return _AsyncCM(self.lib.move_on_after(s))
        return self.lib.move_on_after(s)

    def caught(self, scope) -> bool:
        if self.rid == "curio":
            return bool(scope.expired)
        return bool(scope.cancelled_caught)

    def Event(self):
        return self.lib.Event()

    # -- sockets (the peer is a plain socket the probe drives)
    async def connect(self, port):
        if self.rid == "curio":
            return await self.lib.open_connection("127.0.0.1", port)
        return await self.lib.open_tcp_stream("127.0.0.1", port)

    async def send(self, s, data):
        if self.rid == "curio":
            return await s.sendall(data)
        return await s.send_all(data)

    async def recv(self, s, n=65536):
        if self.rid == "curio":
            return await s.recv(n)
        return await s.receive_some(n)

    async def close(self, s):
        if self.rid == "curio":
            return await s.close()
        return await s.aclose()


class _AsyncCM:
    """trio's timeouts are plain ``with`` blocks; the probes use ``async with``."""

    def __init__(self, cm):
        self.cm = cm

    async def __aenter__(self):
        return self.cm.__enter__()

    async def __aexit__(self, *exc_info):
        return self.cm.__exit__(*exc_info)


class _TrioTask:
    """A trio child started in the main nursery, joinable like a curio task."""

    def __init__(self, side, fn, args):
        import trio
        self.done_ev = trio.Event()
        self.scope = trio.CancelScope()
        self.exc = self.value = None

        async def body():
            with self.scope:
                try:
                    self.value = await fn(*args)
                except BaseException as exc:
                    self.exc = exc
            self.done_ev.set()
        side.nursery.start_soon(body)

    async def join(self):
        await self.done_ev.wait()
        if self.exc is not None:
            raise self.exc
        return self.value

    async def cancel(self):
        self.scope.cancel()
        await self.done_ev.wait()
        return True


async def _trap(k, aw):
    try:
        return {"value": await aw}
    except BaseException as exc:
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return {"raised": k.role(exc)}


@probe("task")
async def co_nested_timeout_outer_expires(k):
    """timeout_after(0.1) around timeout_after(2) around sleep(1): which exceptions, where."""
    out = {}
    try:
        async with k.timeout_after(0.1):
            try:
                async with k.timeout_after(2):
                    try:
                        await k.sleep(1)
                    except BaseException as exc:
                        out["at_await"] = k.role(exc)
                        raise
            except BaseException as exc:
                out["out_of_inner"] = k.role(exc)
                raise
    except BaseException as exc:
        out["out_of_outer"] = k.role(exc)
    return out


@probe("task")
async def co_nested_timeout_inner_expires(k):
    """timeout_after(2) around timeout_after(0.05) around sleep(1)."""
    out = {}
    try:
        async with k.timeout_after(2):
            try:
                async with k.timeout_after(0.05):
                    try:
                        await k.sleep(1)
                    except BaseException as exc:
                        out["at_await"] = k.role(exc)
                        raise
            except BaseException as exc:
                out["out_of_inner"] = k.role(exc)
            await k.sleep(0)
            out["outer_continues"] = True
    except BaseException as exc:
        out["out_of_outer"] = k.role(exc)
    return out


@probe("task")
async def co_timeout_except_exception(k):
    """A body that catches Exception around the sleep: does the timeout pass through?"""
    out = {"caught_by_except_Exception": False}
    try:
        async with k.timeout_after(0.05):
            try:
                await k.sleep(1)
            except Exception:
                out["caught_by_except_Exception"] = True
        out["block_ended"] = "normally"
    except BaseException as exc:
        out["block_ended"] = k.role(exc)
    return out


@probe("task")
async def co_timeout_except_oserror(k):
    """A body that catches OSError around the sleep."""
    out = {"caught_by_except_OSError": False}
    try:
        async with k.timeout_after(0.05):
            try:
                await k.sleep(1)
            except OSError:
                out["caught_by_except_OSError"] = True
        out["block_ended"] = "normally"
    except BaseException as exc:
        out["block_ended"] = k.role(exc)
    return out


@probe("task")
async def co_timeout_exception_bases(k):
    """The base class of what a timeout raises at the await and out of the block."""
    out = {}
    try:
        async with k.timeout_after(0.02):
            try:
                await k.sleep(1)
            except BaseException as exc:
                out["at_await"] = k.base(exc)
                raise
    except BaseException as exc:
        out["out_of_block"] = k.base(exc)
        out["is_TimeoutError"] = isinstance(exc, TimeoutError)
    return out


@probe("task")
async def co_cancel_exception_base(k):
    """What task cancellation raises inside the task, and its base class."""
    seen = {}

    async def child():
        try:
            await k.sleep(10)
        except BaseException as exc:
            seen["inside"] = k.role(exc)
            seen["base"] = k.base(exc)
            raise
    t = await k.spawn(child)
    await k.sleep(0.01)
    await k.cancel(t)
    return seen


@probe("task", skip=("trio",))
async def co_join_error(k):
    """join() on a task that raised ValueError: what join raises, and its cause."""
    async def child():
        raise ValueError("x")
    t = await k.spawn(child)
    try:
        await k.join(t)
        out = {"raised": None}
    except BaseException as exc:
        out = {"raised": k.role(exc), "cause": k.role(exc.__cause__)}
    out["crash_reported"] = k.crash_reports() > 0
    return out


@probe("task", skip=("trio",))
async def co_join_cancelled(k):
    """join() on a task that was cancelled."""
    async def child():
        await k.sleep(10)
    t = await k.spawn(child)
    await k.sleep(0.01)
    await k.cancel(t)
    try:
        await k.join(t)
        return {"raised": None}
    except BaseException as exc:
        return {"raised": k.role(exc), "cause": k.role(exc.__cause__)}


@probe("task", skip=("trio",))
async def co_cancel_finished_task(k):
    """cancel() on a task that already returned, and join() afterwards."""
    async def child():
        return 5
    t = await k.spawn(child)
    await k.sleep(0.01)
    res = await k.cancel(t)
    return {"cancel_returned": res, "join": await _trap(k, k.join(t))}


@probe("task", skip=("trio",))
async def co_event_wake_order(k):
    """Event.set() with 10 waiters: do they resume in FIFO order?"""
    ev = k.Event()
    order = []

    async def waiter(i):
        await ev.wait()
        order.append(i)
    tasks = [await k.spawn(waiter, i) for i in range(10)]
    await k.sleep(0.01)
    await ev.set() if k.rid == "curio" else ev.set()
    for t in tasks:
        await k.join(t)
    return {"fifo": order == sorted(order)}


@probe("task")
async def co_event_set_before_wait(k):
    """wait() on an already-set Event returns; is_set() after clear()."""
    ev = k.Event()
    await ev.set() if k.rid == "curio" else ev.set()
    await ev.wait()
    return {"is_set": ev.is_set()}


@probe("task")
async def co_checkpoint_in_expired_block(k):
    """A deadline passes while the block never blocks; then sleep(0): raised where?"""
    steps = []
    try:
        async with k.timeout_after(0.01):
            time.sleep(0.03)
            steps.append("busy-done")
            await k.checkpoint()
            steps.append("after-checkpoint")
        steps.append("block-ended")
    except BaseException as exc:
        steps.append(k.role(exc))
    return {"steps": steps}


@probe("task")
async def co_expired_block_without_await(k):
    """A deadline passes while the block never blocks, and the block ends: raised?"""
    try:
        async with k.timeout_after(0.01):
            time.sleep(0.03)
        return {"raised": None}
    except BaseException as exc:
        return {"raised": k.role(exc)}


@probe("task")
async def co_move_on_after(k):
    """move_on_after/ignore_after(0.02) around sleep(1): block ends quietly, flag set."""
    async with k.move_on_after(0.02) as scope:
        await k.sleep(1)
    return {"caught": k.caught(scope)}


@probe("task")
async def co_move_on_after_not_expired(k):
    """move_on_after(1) around a short sleep: the flag stays False."""
    async with k.move_on_after(1) as scope:
        await k.sleep(0.001)
    return {"caught": k.caught(scope)}


@probe("task")
async def co_timeout_zero(k):
    """timeout_after(0) around sleep(0)."""
    try:
        async with k.timeout_after(0):
            await k.sleep(0)
        return {"raised": None}
    except BaseException as exc:
        return {"raised": k.role(exc)}


@probe("task", skip=("trio",))
async def co_lazy_spawn_order(k):
    """spawn(): does the child run before the parent's next blocking call?"""
    order = []

    async def child():
        order.append("child")
    t = await k.spawn(child)
    order.append("parent")
    await k.sleep(0)
    order.append("parent-after-sleep0")
    await k.join(t)
    return {"order": order}


@probe("task", skip=("trio",))
async def co_sleep0_round_robin(k):
    """Three tasks looping over sleep(0): the interleaving."""
    order = []

    async def worker(name):
        for i in range(3):
            order.append(f"{name}{i}")
            await k.sleep(0)
    tasks = [await k.spawn(worker, n) for n in "abc"]
    for t in tasks:
        await k.join(t)
    return {"order": order}


async def _co_connect(k):
    lst = _Listener()
    s = await k.connect(lst.port)
    peer, _ = lst.sock.accept()
    peer.setblocking(False)
    lst.opened.append(peer)
    return lst, s, peer


@probe("task")
async def co_connect_refused(k):
    """Connecting to a port nobody listens on."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return await _trap(k, _connect_only(k, port))


async def _connect_only(k, port):
    s = await k.connect(port)
    await k.close(s)
    return "connected"


@probe("task")
async def co_recv_after_peer_close(k):
    """recv after the peer's FIN: b'' twice."""
    lst, s, peer = await _co_connect(k)
    peer.sendall(b"hi")
    peer.shutdown(socket.SHUT_WR)
    got = [await k.recv(s) for _ in range(3)]
    await k.close(s)
    lst.close()
    return {"reads": [g.decode() for g in got]}


@probe("task")
async def co_recv_after_peer_reset(k):
    """recv after the peer's RST."""
    lst, s, peer = await _co_connect(k)
    reset(peer)
    await k.sleep(0.02)
    out = {"first": await _trap(k, k.recv(s)), "second": await _trap(k, k.recv(s))}
    for v in out.values():
        if "value" in v:
            v["value"] = v["value"].decode()
    await _trap(k, k.close(s))
    lst.close()
    return out


@probe("task")
async def co_send_after_peer_reset(k):
    """send after the peer's RST, twice."""
    lst, s, peer = await _co_connect(k)
    reset(peer)
    await k.sleep(0.02)
    out = [(await _trap(k, k.send(s, b"x" * 1000))).get("raised") for _ in range(2)]
    await _trap(k, k.close(s))
    lst.close()
    return {"raised": out}


@probe("task", skip=("trio",))
async def co_bytes_sent_on_timeout(k):
    """sendall of 8 MB to a peer that does not read, under timeout_after(0.1)."""
    lst, s, peer = await _co_connect(k)
    out = {}
    try:
        async with k.timeout_after(0.1):
            try:
                await k.send(s, b"b" * (8 * MB))
            except BaseException as exc:
                out["at_send"] = k.role(exc)
                out["bytes_sent_known"] = isinstance(getattr(exc, "bytes_sent", None), int)
                out["bytes_sent_positive"] = (getattr(exc, "bytes_sent", 0) or 0) > 0
                raise
        out["raised"] = None
    except BaseException as exc:
        out["raised"] = k.role(exc)
        out["bytes_sent_out_of_block"] = isinstance(getattr(exc, "bytes_sent", None), int)
    await _trap(k, k.close(s))
    lst.close()
    return out


@probe("task", skip=("trio",))
async def co_bytes_sent_on_cancel(k):
    """A task blocked in sendall of 8 MB is cancelled: what it sees, and bytes_sent."""
    lst, s, peer = await _co_connect(k)
    seen = {}

    async def sender():
        try:
            await k.send(s, b"c" * (8 * MB))
        except BaseException as exc:
            seen["role"] = k.role(exc)
            seen["bytes_sent_positive"] = (getattr(exc, "bytes_sent", 0) or 0) > 0
            raise
    t = await k.spawn(sender)
    await k.sleep(0.05)
    await k.cancel(t)
    await _trap(k, k.close(s))
    lst.close()
    return seen


@probe("task")
async def co_finished_timeout_leaves_no_timer(k):
    """After a timeout_after(0.02) block that finished early, sleeping past its deadline."""
    async with k.timeout_after(0.02):
        await k.sleep(0)
    return await _trap(k, k.sleep(0.05))


@probe("task")
async def co_send_after_close(k):
    """send and recv on a socket we closed."""
    lst, s, peer = await _co_connect(k)
    await k.close(s)
    out = {"send": (await _trap(k, k.send(s, b"x"))).get("raised"),
           "recv": (await _trap(k, k.recv(s))).get("raised")}
    lst.close()
    return out


@probe("task", skip=("trio",))
async def co_child_crash_unjoined(k):
    """A child crashes and nobody joins it: does the parent carry on?"""
    async def child():
        raise ValueError("unjoined")
    t = await k.spawn(child)
    await k.sleep(0.01)
    return {"parent_continues": True, "reported_before_run_ends": k.crash_reports() > 0,
            "done": t.done() if k.rid == "coro" else bool(t.terminated)}


@probe("task", skip=("trio",))
async def co_cancel_then_catch_continue(k):
    """A task that catches its cancellation and returns a value: what join gives."""
    async def child():
        try:
            await k.sleep(10)
        except BaseException:
            return "swallowed"
    t = await k.spawn(child)
    await k.sleep(0.01)
    await k.cancel(t)
    return await _trap(k, k.join(t))


@probe("task")
async def co_timeout_inside_cancelled_task_cleanup(k):
    """Blocking in cleanup after a cancellation: does the next await raise again?"""
    seen = []

    async def child():
        try:
            await k.sleep(10)
        except BaseException as exc:
            seen.append(k.role(exc))
            try:
                await k.sleep(0.01)
                seen.append("cleanup-slept")
            except BaseException as exc2:
                seen.append("again:" + str(k.role(exc2)))
            raise
    t = await k.spawn(child)
    await k.sleep(0.01)
    await k.cancel(t)
    return {"seen": seen}


# ---------------------------------------------------------------------------
# The worker: one process per runtime

class _ProbeTimeout(BaseException):
    pass


def _alarm(signum, frame):
    raise _ProbeTimeout()


def _jsonable(value):
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def _run_one(rid, p, options):
    style = STYLE_OF[rid]
    if style == "callback":
        h = CallbackSide(rid, options)
        try:
            return p.fn(h)
        finally:
            h.close()
    if style == "stream":
        if rid == "hybrid":
            import kernels.hybrid as a
            return a.run(p.fn(a), **options)
        import asyncio as a
        if rid == "uvloop-streams":
            import uvloop
            with a.Runner(loop_factory=uvloop.new_event_loop) as runner:
                return runner.run(p.fn(a))
        return a.run(p.fn(a))
    return TaskSide(rid, options).run(p.fn)


def parse_runtime(spec: str) -> tuple[str, dict]:
    """``RUNTIME[:OPTIONS]`` -> (runtime, options). Options apply to our kernels only
    (``coro:cancel_base=exception``) and are checked by the kernel's schema."""
    rid, _, text = spec.partition(":")
    if rid not in STYLE_OF:
        raise ValueError(f"unknown runtime {rid!r}; choose from {', '.join(STYLE_OF)}")
    if not text:
        return rid, {}
    if rid not in ("callback", "hybrid", "coro"):
        raise ValueError(f"{rid} takes no options here; only our kernels do")
    import importlib
    schema = importlib.import_module(f"kernels.{rid}").OPTIONS
    return rid, schema.parse(text)


def run_probes(rid, names=None, out=sys.stdout, options=None):
    """Run the probes of ``rid``'s style (or only ``names``), one JSON line each:
    ``{"probe", "obs"}``, or ``{"probe", "error"}`` when the probe itself failed.
    ``options``: kernel options for our kernels (the option-flip checks use them)."""
    style = STYLE_OF[rid]
    options = options or {}
    signal.signal(signal.SIGALRM, _alarm)
    # curio logs crashes and our kernel prints them; TaskSide counts both, and neither
    # reaches this process's stderr.
    logging.getLogger("curio").propagate = False
    for p in PROBES.values():
        if p.style != style or (names and p.name not in names):
            continue
        if rid in p.skip:
            rec = {"probe": p.name, "skip": "API does not map"}
        else:
            signal.setitimer(signal.ITIMER_REAL, PROBE_TIMEOUT_S)
            try:
                # each probe in a fresh copy of the context: contextvar probes
                # must not see each other's values
                obs = contextvars.copy_context().run(_run_one, rid, p, options)
                rec = {"probe": p.name, "obs": _jsonable(obs)}
            except _ProbeTimeout:
                rec = {"probe": p.name, "error": f"timed out after {PROBE_TIMEOUT_S:g} s"}
            except BaseException as exc:
                if isinstance(exc, KeyboardInterrupt):
                    raise
                rec = {"probe": p.name, "error": f"probe failed: {type(exc).__name__}"}
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        out.write(json.dumps(rec, sort_keys=True) + "\n")
        out.flush()
        gc.collect()


if __name__ == "__main__":
    try:
        if len(sys.argv) < 2:
            raise ValueError("a runtime is needed")
        _rid, _opts = parse_runtime(sys.argv[1])
    except ValueError as exc:
        print(f"usage: python -m bench.edges RUNTIME[:OPTIONS] [NAME,...]; RUNTIME is one "
              f"of {', '.join(STYLE_OF)} ({exc})", file=sys.stderr)
        sys.exit(2)
    wanted = set(sys.argv[2].split(",")) if len(sys.argv) > 2 and sys.argv[2] else None
    run_probes(_rid, wanted, options=_opts)
