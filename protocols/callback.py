"""Callback-port drivers: the apps as asyncio-style Protocol classes.

The same classes run on our reactor and on asyncio's or uvloop's loop (the port
hides the difference). Variants, as N. J. Smith's 2016 post wrote them:
``naive`` writes whatever arrives and ignores ``pause_writing()`` -- the transport
buffers without bound; ``fixed`` turns the destination's ``pause_writing()`` into
``pause_reading()`` on the source, which is the whole of callback-style flow control.
Proxy and push decisions are their cores' (``ProxyCore``, ``PushCore``); the
classes here feed events in and carry the actions out.
"""
from __future__ import annotations

import collections
import sys
import time

from protocols import apps, common, cores
from protocols.cores import (Block, Close, Disconnect, Done, Drop, Enqueue, PauseReading,
                             ResumeReading, Send, SendEof)

VARIANTS = apps.variants("callback")


class _Base:
    """The six Protocol methods, so a driver class never needs a kernel's base class."""
    transport = None

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        pass

    def eof_received(self):
        return False          # let the transport close itself once its buffer drains

    def connection_lost(self, exc):
        pass

    def pause_writing(self):
        pass

    def resume_writing(self):
        pass


class Echo(_Base):
    def __init__(self, server):
        self.core = server.new_core()
        self.fixed = server.variant.honour_pause

    def data_received(self, data):
        self.transport.write(self.core.receive(data))

    def pause_writing(self):
        if self.fixed:
            self.transport.pause_reading()

    def resume_writing(self):
        if self.fixed:
            self.transport.resume_reading()


class Sink(_Base):
    """Counts what arrives; with ``frame_bytes`` it checks the framing, and a
    malformed stream closes that connection only."""

    def __init__(self, server):
        self.core = server.new_core()

    def data_received(self, data):
        try:
            self.core.receive(data, time.monotonic())
        except cores.ProtocolError as exc:
            common.protocol_error("sink", exc)
            self.transport.abort()

    def eof_received(self):
        try:
            self.core.eof()
        except cores.ProtocolError as exc:
            common.protocol_error("sink", exc)
        return False


class ReqResp(_Base):
    """Answers pipelined requests. ``naive`` writes every response at once (Twisted
    ticket 8868); ``fixed`` answers while the transport accepts and, once paused,
    holds the parsed requests and stops reading until resume_writing()."""

    def __init__(self, server):
        self.core = server.new_core()
        self.fixed = server.variant.honour_pause
        self.counters = server.counters
        self.pending = 0          # requests parsed, not yet answered
        self.paused = False

    def data_received(self, data):
        try:
            self.pending += self.core.requests(data)
        except cores.ProtocolError as exc:
            common.protocol_error("reqresp", exc)
            self.transport.abort()
            return
        self._answer()

    def _answer(self):
        respond, write = self.core.respond, self.transport.write
        while self.pending and not (self.fixed and self.paused):
            self.pending -= 1
            write(respond())
            common.count(self.counters, "requests_handled_count")
        if self.fixed and self.paused and self.transport.is_reading():
            self.transport.pause_reading()

    def pause_writing(self):
        self.paused = True

    def resume_writing(self):
        self.paused = False
        if self.fixed:
            self._answer()
            if not self.paused and not self.transport.is_closing():
                self.transport.resume_reading()


class Relay:
    """One proxied connection: the client ("a") and upstream ("b") transports
    and the ProxyCore that decides for both. Reading a waits until b exists;
    actions toward b before then (uvloop reads after connection_made anyway,
    and a client may leave first) wait with it. The app is over for this
    relay once the core said Done and both transports are gone."""

    def __init__(self, server):
        self.server = server
        self.core = server.new_core()
        self.ends = {"a": None, "b": None}
        self.ready = {"a"}            # sides actions may touch (b: once connected)
        self.waiting: list = []       # actions toward b before that
        self.gone: set = set()        # sides whose transport is lost (or never came)

    def made(self, side, transport):
        self.ends[side] = transport
        if side == "a":
            transport.pause_reading()
            host, port = self.server.upstream
            self.server.port.connect(lambda: ProxySide(self, "b"), host, port,
                                     self._connected, sockbuf=self.server.sockbuf)

    def _connected(self, transport, protocol, exc):
        # Act on b only from here, never inside its connection_made: uvloop's
        # create_connection(sock=...) must return before its transport is closed.
        if exc is not None:
            host, port = self.server.upstream
            print(f"proxy: upstream {host}:{port} failed: {exc}", file=sys.stderr)
            self.waiting.clear()
            self.act(self.core.closed("b", exc))
            return self.lost("b")
        self.ready.add("b")
        waiting, self.waiting = self.waiting, []
        self.act(waiting)
        core, a = self.core, self.ends["a"]
        # Not after a's EOF: uvloop, unlike asyncio, reads again and reports EOF twice.
        if not (core.done or core.paused["a"] or core.eof_seen["a"] or a.is_closing()):
            a.resume_reading()

    def lost(self, side=None):
        """``side``'s transport is gone; the relay is over once both are and the
        core said Done (in either order)."""
        if side:
            self.gone.add(side)
        if self.core.done and {"a", "b"} <= self.gone:
            self.server.finished()

    def act(self, actions):
        ends = self.ends
        for action in actions:
            match action:
                case (Send(to, _) | SendEof(to) | Close(to, _) | PauseReading(to)
                      | ResumeReading(to)) if to not in self.ready:
                    self.waiting.append(action)
                case Send(to, data):
                    if not ends[to].is_closing():     # uvloop raises on a closed one
                        ends[to].write(data)
                case SendEof(to):
                    if not ends[to].is_closing():
                        ends[to].write_eof()
                case Close(to, abort):
                    if abort:
                        ends[to].abort()
                    elif not ends[to].is_closing():
                        ends[to].close()
                case PauseReading(side):
                    if not ends[side].is_closing():
                        ends[side].pause_reading()
                case ResumeReading(side):
                    if not ends[side].is_closing():
                        ends[side].resume_reading()
                case Done():
                    self.lost()
                case _:
                    raise common.unknown(action, "callback proxy")


class ProxySide(_Base):
    """One side's Protocol: every event goes to the relay's core."""

    def __init__(self, relay: Relay, side: str):
        self.relay = relay
        self.side = side

    def connection_made(self, transport):
        self.transport = transport
        self.relay.made(self.side, transport)

    def data_received(self, data):
        self.relay.act(self.relay.core.data(self.side, data))

    def eof_received(self):
        self.relay.act(self.relay.core.eof(self.side))
        return True               # the core closes the transport when it decides to

    def pause_writing(self):
        self.relay.act(self.relay.core.write_paused(self.side))

    def resume_writing(self):
        self.relay.act(self.relay.core.write_resumed(self.side))

    def connection_lost(self, exc):
        self.relay.act(self.relay.core.closed(self.side, exc))
        self.relay.lost(self.side)


class Push(_Base):
    """A push client connection: the server only writes to it."""

    def __init__(self, server):
        self.app = server.push
        self.paused = False

    def connection_made(self, transport):
        self.transport = transport
        self.cid = id(self)
        self.app.core.add_client(self.cid)
        self.app.clients[self.cid] = self

    def pause_writing(self):
        self.paused = True

    def resume_writing(self):
        self.paused = False
        self.app.unblock(self.cid)

    def connection_lost(self, exc):
        if self.app.clients.pop(self.cid, None) is not None:
            self.app.core.remove_client(self.cid)
        self.app.unblock(self.cid)


class PushTicker(common.PushApp):
    """The push server's broadcaster, driven by a timer."""

    def __init__(self, port, core, params):
        super().__init__(core, params)
        self.port = port
        self.blocked = None       # (cid, remaining actions) while parked on Block

    def tick(self):
        """Push: offer one message to every client under the overload policy."""
        size = self.message_bytes
        for cid, proto in self.clients.items():
            self.core.backlog(cid, proto.transport.get_write_buffer_size() // size)
        self.act(collections.deque(self.core.broadcast(self.next_message())))

    def act(self, actions):
        # A callback can't wait, so Block parks the rest of this broadcast until
        # that client's transport calls resume_writing(): the callback-style
        # spelling of "write; drain per client in turn".
        client = self.clients.get     # None once that client has gone
        while actions:
            match action := actions.popleft():
                case Block(cid):
                    if (proto := client(cid)) is not None and proto.paused:
                        self.blocked = (cid, actions)
                        return
                case Send(cid, data) | Enqueue(cid, data):
                    if (proto := client(cid)) is not None:
                        proto.transport.write(data)
                case Disconnect(cid):
                    if (proto := client(cid)) is not None:
                        proto.transport.abort()
                case Drop():
                    pass
                case _:
                    raise common.unknown(action, "callback push")
        self.report()
        self.port.call_later(self.interval_s, self.tick)

    def unblock(self, cid):
        if self.blocked is not None and self.blocked[0] == cid:
            actions, self.blocked = self.blocked[1], None
            self.act(actions)


HANDLERS = apps.bind("callback", {
    "echo": Echo, "sink": Sink, "reqresp": ReqResp, "push": Push,
    "proxy": lambda server: ProxySide(Relay(server), "a"),
})


class Server(common.Served):
    """One app instance on a callback port: builds protocols from the app table
    and decides when a one-shot program is over."""

    def __init__(self, port, name, variant, params):
        super().__init__(port, "callback", name, variant, params,
                         lambda core, params: PushTicker(port, core, params))
        self.upstream = params.get("upstream")
        self.sockbuf = params.get("sockbuf")
        self.server = None
        self._handler = HANDLERS[name]

    def factory(self):
        if self.one_shot:     # serve exactly one connection, as the post's program
            # (closed on the next pass: asyncio's Server must still attach this one)
            self.port.call_soon(self.server.close)
        return self._handler(self)

    def finished(self):
        if self.one_shot:
            self.port.stop()


def serve(port, name, sock, variant="naive", params=None):
    """Run app ``name`` on a callback port, accepting on ``sock``, until the app
    finishes (one-shot proxy) or the port is stopped."""
    server = Server(port, name, variant, params or {})

    def setup(port):
        server.server = port.listen(server.factory, sock)
        if server.push is not None:
            port.call_later(0, server.push.tick)

    port.run(setup)
    return server
