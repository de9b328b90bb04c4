"""The proxy on every port: ProxyCore's actions carried out, per port style.

The core decides everything a proxy decides -- what to relay where, what EOF
and a reset mean, when to pause reading, that both sides end together. Here
each port only acts: ``Relay``/``ProxySide`` on the callback port (a Protocol
per side), ``AsyncRelay`` with one pump task per side on the stream and task
ports (``stream_proxy``, ``task_proxy``).
"""
from __future__ import annotations

import sys

from protocols import common
from protocols.actions import Close, Done, PauseReading, ResumeReading, Send, SendEof

__all__ = ["Relay", "ProxySide", "AsyncRelay", "stream_proxy", "task_proxy"]


# ---------------------------------------------------------------- callback port

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
        # Not after a's EOF: a transport resumed after EOF reads again and reports
        # EOF a second time (asyncio and uvloop alike).
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


class ProxySide(common.ProtocolBase):
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


# ---------------------------------------------------------------- stream and task ports

class AsyncRelay:
    """A ProxyCore carried out over two async ends (the stream and task ports).

    An end has ``read()`` (b"" at EOF), ``send(data)``, ``send_eof()`` and
    ``close(abort)``; ``errors`` are the exceptions meaning a side is gone. The
    driver runs ``pump("a")`` and ``pump("b")`` as two tasks and waits on
    ``over`` (an Event), which is set at Done or when a pump fails with a driver
    bug; ``check()`` then raises that bug."""

    def __init__(self, core, ends: dict, errors, over, driver: str):
        self.core, self.ends, self.errors, self.over = core, ends, errors, over
        self.driver = driver
        self.failed: list = []

    async def act(self, actions) -> None:
        for action in actions:
            match action:
                case Send(to, data):
                    try:
                        await self.ends[to].send(data)
                    except self.errors as exc:
                        await self.act(self.core.closed(to, exc))
                case SendEof(to):
                    try:
                        await self.ends[to].send_eof()
                    except self.errors as exc:
                        await self.act(self.core.closed(to, exc))
                case Close(to, abort):
                    await self.ends[to].close(abort)
                case Done():
                    await common.set_event(self.over)
                case _:
                    raise common.unknown(action, self.driver)

    async def pump(self, side: str) -> None:
        core = self.core
        try:
            while data := await self.ends[side].read():
                await self.act(core.data(side, data))
            await self.act(core.eof(side))
        except self.errors as exc:
            await self.act(core.closed(side, exc))
        except Exception as exc:
            self.failed.append(exc)
            await common.set_event(self.over)

    def check(self) -> None:
        if self.failed:
            raise self.failed[0]


# ---------------------------------------------------------------- stream port

class StreamEnd:
    """One side of a proxy as the relay sees it: a reader and a writer."""

    def __init__(self, reader, writer, variant):
        self.reader, self.writer, self.variant = reader, writer, variant

    async def read(self):
        return await self.reader.read(65536)

    async def send(self, data):
        self.writer.write(data)
        if self.variant.drain:
            await self.writer.drain()

    async def send_eof(self):
        if not self.writer.transport.is_closing():
            self.writer.write_eof()

    async def close(self, abort):
        if abort:
            self.writer.transport.abort()
        else:
            await common.close_writer(self.writer, self.variant.drain)


async def stream_proxy(served, reader, writer):
    """The relay is over when the core says Done; the pump still waiting to read
    is then cancelled (naive returns right after writer.close(), as in the post)."""
    port, core, v = served.port, served.new_core(), served.variant
    host, up_port = served.params["upstream"]
    ends = {"a": StreamEnd(reader, writer, v)}
    relay = AsyncRelay(core, ends, OSError, port.Event(), "stream proxy")
    try:
        up = await port.open_connection(host, up_port, sockbuf=served.params.get("sockbuf"))
    except OSError as exc:
        print(f"proxy: upstream {host}:{up_port} failed: {exc}", file=sys.stderr)
        return await relay.act(core.closed("b", exc))
    ends["b"] = StreamEnd(*up, v)
    if v.zero_limits:
        up[1].transport.set_write_buffer_limits(0)
    pumps = [port.create_task(relay.pump(side)) for side in ("a", "b")]
    try:
        await relay.over.wait()
    finally:
        for task in pumps:
            task.cancel()
    relay.check()


# ---------------------------------------------------------------- task port

class TaskEnd:
    """One side of a proxy as the relay sees it. Close waits: both streams are
    closed after the pumps, so a stream is closed only once no task uses it."""

    def __init__(self, stream):
        self.stream = stream

    async def read(self):
        return await self.stream.receive_some(65536)

    async def send(self, data):
        await self.stream.send_all(data)

    async def send_eof(self):
        await self.stream.send_eof()

    async def close(self, abort):
        pass


async def task_proxy(served, stream):
    port, core = served.port, served.new_core()
    host, up_port = served.params["upstream"]
    ends = {"a": TaskEnd(stream)}
    relay = AsyncRelay(core, ends, port.StreamError, port.Event(), "task proxy")
    try:
        ends["b"] = TaskEnd(await port.open_tcp_stream(host, up_port,
                                                    sockbuf=served.params.get("sockbuf")))
    except OSError as exc:
        print(f"proxy: upstream {host}:{up_port} failed: {exc}", file=sys.stderr)
        core.closed("b", exc)
    else:
        async with port.open_nursery() as n:
            await n.spawn(relay.pump, "a")
            await n.spawn(relay.pump, "b")
            await relay.over.wait()
            await n.cancel()
    for side in ("b", "a"):
        if side in ends:
            await ends[side].stream.aclose()
    relay.check()
