"""Callback-port drivers: the apps as asyncio-style Protocol classes.

The same classes run on our reactor and on asyncio's or uvloop's loop (the port
hides the difference). Variants, as N. J. Smith's 2016 post wrote them:
``naive`` writes whatever arrives and ignores ``pause_writing()`` -- the transport
buffers without bound; ``fixed`` turns the destination's ``pause_writing()`` into
``pause_reading()`` on the source, which is the whole of callback-style flow control.
"""
from __future__ import annotations

import collections
import sys
import time

from protocols import common, cores

VARIANTS = {"echo": ("naive", "fixed"), "sink": ("naive", "fixed"),
            "proxy": ("naive", "fixed"), "reqresp": ("naive", "fixed"),
            "push": common.PUSH_POLICIES}


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
    def __init__(self, fixed: bool):
        self.core = cores.EchoCore()
        self.fixed = fixed

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

    def __init__(self, frame_bytes=None):
        self.core = cores.SinkCore(frame_bytes)

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

    def __init__(self, fixed: bool, response_bytes: int, counters: dict):
        self.core = cores.ReqRespCore(response_bytes)
        self.fixed = fixed
        self.counters = counters
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


class ProxyIn(_Base):
    """The accepted (source) side. Reading pauses until the upstream connects; what
    arrives anyway (uvloop starts reading after connection_made) is held and
    relayed on connect."""

    def __init__(self, app):
        self.app = app
        self.out = None           # upstream transport
        self.early: list = []     # data (and b"" for EOF) before the upstream exists

    def connection_made(self, transport):
        self.transport = transport
        transport.pause_reading()
        host, port = self.app.upstream
        self.app.port.connect(lambda: ProxyOut(self), host, port, self._connected,
                              sockbuf=self.app.sockbuf)

    def _connected(self, transport, protocol, exc):
        if exc is not None:
            print(f"proxy: upstream {self.app.upstream[0]}:{self.app.upstream[1]} "
                  f"failed: {exc}", file=sys.stderr)
            self.transport.abort()
            self.app.finished()
            return
        self.out = transport
        early, self.early = self.early, []
        for data in early:
            if data:
                transport.write(data)
            else:
                self._eof()
        if not self.transport.is_closing():
            self.transport.resume_reading()

    def data_received(self, data):
        if self.out is None:
            self.early.append(data)
        else:
            self.out.write(data)

    def eof_received(self):
        if self.out is None:
            self.early.append(b"")
            return True           # act on it once the upstream exists
        return self._eof()

    def _eof(self):
        if self.app.two_way:
            self.out.write_eof()
            return True           # keep the other direction flowing
        self.out.close()          # the post's program: EOF -> close the destination
        if self.transport.get_write_buffer_size() == 0:
            self.transport.close()
        return False

    def connection_lost(self, exc):
        if self.out is not None and not self.out.is_closing():
            (self.out.abort if exc else self.out.close)()


class ProxyOut(_Base):
    def __init__(self, inbound: ProxyIn):
        self.inbound = inbound

    def data_received(self, data):        # two-way only: upstream -> client
        self.inbound.transport.write(data)

    def eof_received(self):
        if self.inbound.app.two_way:
            self.inbound.transport.write_eof()
            return True
        return False

    def pause_writing(self):
        if self.inbound.app.fixed:
            self.inbound.transport.pause_reading()

    def resume_writing(self):
        if self.inbound.app.fixed:
            self.inbound.transport.resume_reading()

    def connection_lost(self, exc):
        inbound = self.inbound.transport
        if not inbound.is_closing():
            (inbound.abort if exc else inbound.close)()
        self.inbound.app.finished()


class Push(_Base):
    """A push client connection: the server only writes to it."""

    def __init__(self, app):
        self.app = app
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

    def __init__(self, port, policy, params):
        super().__init__(policy, params)
        self.port = port
        self.blocked = None       # (cid, remaining actions) while parked on "block"

    def tick(self):
        """Push: offer one message to every client under the overload policy."""
        size = self.message_bytes
        for cid, proto in self.clients.items():
            self.core.backlog(cid, proto.transport.get_write_buffer_size() // size)
        self._act(collections.deque(self.core.broadcast(self.next_message())))

    def _act(self, actions):
        # A callback can't wait, so "block" parks the rest of this broadcast until
        # that client's transport calls resume_writing(): the callback-style
        # spelling of "write; drain per client in turn".
        while actions:
            kind, cid, *rest = actions.popleft()
            proto = self.clients.get(cid)
            if proto is None:
                continue
            if kind == "block":
                if proto.paused:
                    self.blocked = (cid, actions)
                    return
            elif kind in ("send", "enqueue"):
                proto.transport.write(rest[0])
            elif kind == "disconnect":
                proto.transport.abort()
            # "drop": nothing is written to that client.
        self.report()
        self.port.call_later(self.interval_s, self.tick)

    def unblock(self, cid):
        if self.blocked is not None and self.blocked[0] == cid:
            actions, self.blocked = self.blocked[1], None
            self._act(actions)


class App:
    """One app instance on a callback port: builds protocol factories and decides
    when a one-shot program is over."""

    def __init__(self, port, name, variant, params):
        self.port = port
        self.name = name
        self.fixed = variant == "fixed"
        self.variant = variant
        self.params = params
        self.upstream = params.get("upstream")
        self.two_way = params.get("two_way", False)
        self.sockbuf = params.get("sockbuf")
        self.forever = params.get("forever", False)
        self.counters = params.get("counters", {})
        self.server = None
        self.push = PushTicker(port, variant, params) if name == "push" else None

    def factory(self):
        name = self.name
        if name == "echo":
            return Echo(self.fixed)
        if name == "sink":
            return Sink(self.params.get("frame_bytes"))
        if name == "reqresp":
            return ReqResp(self.fixed, self.params.get("response_bytes", 65536), self.counters)
        if name == "proxy":
            if not self.forever:      # serve exactly one connection, as the post's program
                # (closed on the next pass: asyncio's Server must still attach this one)
                self.port.call_soon(self.server.close)
            return ProxyIn(self)
        if name == "push":
            return Push(self.push)
        raise ValueError(f"unknown app {name!r}")

    def finished(self):
        if not self.forever:
            self.port.stop()

def serve(port, name, sock, variant="naive", params=None):
    """Run app ``name`` on a callback port, accepting on ``sock``, until the app
    finishes (one-shot proxy) or the port is stopped."""
    app = App(port, name, variant, params or {})

    def setup(port):
        app.server = port.listen(app.factory, sock)
        if name == "push":
            port.call_later(0, app.push.tick)

    port.run(setup)
    return app
