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

import time

from protocols import apps, common, cores
from protocols.push import PushClient, PushTicker
from protocols.relay import ProxySide, Relay

VARIANTS = apps.variants("callback")


class Echo(common.ProtocolBase):
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


class Sink(common.ProtocolBase):
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


class ReqResp(common.ProtocolBase):
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


HANDLERS = apps.bind("callback", {
    "echo": Echo, "sink": Sink, "reqresp": ReqResp, "push": PushClient,
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
