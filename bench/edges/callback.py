"""Callback-style probes: asyncio's ``Protocol``/``Transport`` API on our
``kernels.callback`` loop, asyncio's loop and uvloop's.

A probe is ``def probe(h)`` where ``h`` is a ``CallbackSide``: ``h.loop`` is the event
loop, ``h.connect()`` gives a transport whose peer is a plain socket the probe drives,
``h.spin()`` runs the loop for a while, and ``h.reports()`` counts what reached the
exception handler and the loop's logger.
"""
from __future__ import annotations

import abc
import logging
import socket
import time

from bench.edges.registry import MB, Listener, LogCatcher, drain, ename, probe, reset


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


class CallbackSide(abc.ABC):
    """One callback-style runtime: a loop, a peer listener, and the two channels a
    loop reports through (its exception handler, and its logger). Subclasses say
    which loop it is and how an accepted socket is handed to it."""
    style = "callback"
    #: the package whose ``OPTIONS`` schema checks this side's options (ours only)
    kernel = None
    #: the logger the loop reports on
    logger_name = "asyncio"
    #: options name an asyncio loop (``loop=``, ``loop.NAME=``): asyncio's runtime
    takes_loop = False

    def __init__(self, options=None):
        self.loop = self.new_loop(options or {})
        self.handled = []
        self.loop.set_exception_handler(
            lambda loop, ctx: self.handled.append(ename(ctx.get("exception"))))
        self.log = LogCatcher()
        self._logger = logging.getLogger(self.logger_name)
        self._logger.addHandler(self.log)
        self.listener = Listener()

    @abc.abstractmethod
    def new_loop(self, options):
        """A fresh event loop of this library, with the runtime's ``options``."""

    def adopt(self, sock, factory):
        """Give the loop an accepted socket (asyncio's call is a coroutine)."""
        sock.setblocking(False)
        self.loop.run_until_complete(self.loop.connect_accepted_socket(factory, sock))

    def run(self, fn):
        """Run one probe on this side, then close it."""
        try:
            return fn(self)
        finally:
            self.close()

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
        self.adopt(ours, lambda: proto)
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


class OurCallbackSide(CallbackSide):
    """``kernels.callback.Loop``, which takes an accepted socket synchronously."""
    kernel = "kernels.callback"
    logger_name = "kernels.callback"

    def new_loop(self, options):
        from kernels.callback import Loop
        return Loop(**options)

    def adopt(self, sock, factory):
        self.loop.connect_accepted_socket(factory, sock)


class AsyncioCallbackSide(CallbackSide):
    """asyncio's default event loop, or the loop its options name
    (``asyncio-protocol:loop=looplab``)."""
    takes_loop = True

    def new_loop(self, options):
        return asyncio_loop(options)()


def asyncio_loop(options):
    """A zero-argument factory of the asyncio loop ``options`` name (the runtime's
    ``loop`` and ``loop.NAME=VALUE``), asyncio's default one without them."""
    import asyncio
    import functools
    if not options.get("loop"):
        return asyncio.new_event_loop
    from protocols.asyncio_ports import resolve_loop
    return functools.partial(resolve_loop(options["loop"]), **options.get("loop_options", {}))


class UvloopCallbackSide(CallbackSide):
    """uvloop's event loop."""

    def new_loop(self, options):
        import uvloop
        return uvloop.new_event_loop()


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


