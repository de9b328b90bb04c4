"""The push server on every port: PushCore's actions carried out, per port style.

One PushCore per server decides, for every broadcast and every client, whether
to send in turn (``Send``, the broadcaster may wait), hand the message on
without waiting (``Enqueue``), wait first (``Block``), drop it or disconnect the
client. The callback port parks a broadcast on Block until resume_writing();
the stream port awaits drain(); the task port sends in turn from the ticker or
through a per-client mailbox drained by that client's task.
"""
from __future__ import annotations

import collections

from protocols import common, cores
from protocols.actions import Block, Disconnect, Drop, Enqueue, Send

__all__ = ["PushApp", "PushClient", "PushTicker", "stream_push", "stream_ticker", "task_push",
           "task_ticker"]


class PushApp:
    """A push server's state: the core (built by the app table for the policy)
    and the clients by id."""

    def __init__(self, core: cores.PushCore, params: dict):
        self.core = core
        self.clients: dict = {}
        self.counters = params.get("counters", {})
        self.message_bytes = params.get("message_bytes", 10_000)
        self.interval_s = params.get("interval_s", 0.005)
        self._filler = bytes(self.message_bytes)
        self._seq = 0

    def next_message(self) -> bytes:
        """A fresh message per broadcast, numbered, as a real feed's would be:
        a queue of them costs memory (one shared object would hide that)."""
        self._seq += 1
        return self._seq.to_bytes(8, "big") + self._filler[8:]

    def forget(self, cid) -> None:
        """That client has gone (or is going): the core stops offering it messages."""
        if self.clients.pop(cid, None) is not None:
            self.core.remove_client(cid)

    def queued(self, messages: int) -> None:
        """An app-level queue (the task port's mailboxes) now holds ``messages``:
        user-space backlog that no transport counts, so the app reports its peak."""
        peak = messages * self.message_bytes
        if peak > self.counters.get("app_queue_peak_bytes", 0):
            self.counters["app_queue_peak_bytes"] = peak

    def report(self) -> None:
        core = self.core
        self.counters.update(dropped_count=core.dropped_count,
                             disconnected_count=core.disconnected_count,
                             broadcasts_count=core.broadcasts_count)


# ---------------------------------------------------------------- callback port

class PushClient(common.ProtocolBase):
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
        self.app.forget(self.cid)
        self.app.unblock(self.cid)


class PushTicker(PushApp):
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
                    # (uvloop raises on writing to a transport that has closed)
                    if (proto := client(cid)) is not None and not proto.transport.is_closing():
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


# ---------------------------------------------------------------- stream port

async def stream_push(served, reader, writer):
    app, cid = served.push, id(writer)
    app.core.add_client(cid)
    app.clients[cid] = writer
    try:
        await reader.read()          # a push client only ever sends EOF
    except OSError:
        # A reset: connection_lost stored the error in the writer's close-future as
        # well. Retrieve it here; left alone, whichever of that future and its
        # protocol the cyclic GC finalizes first may log "Future exception was never
        # retrieved" with this read's traceback (seen about one run in ten on uvloop).
        try:
            await writer.wait_closed()
        except OSError:
            pass
    finally:
        app.forget(cid)
    writer.close()


async def stream_ticker(port, app):
    """Offer one message every interval to every client, under the overload policy.
    Block awaits that client's drain() before writing -- one stalled client
    stalls all; drop/disconnect judge a client by its transport backlog."""
    while True:
        for cid, writer in app.clients.items():
            app.core.backlog(cid, writer.transport.get_write_buffer_size() // app.message_bytes)
        client = app.clients.get     # None once that client has gone
        for action in app.core.broadcast(app.next_message()):
            match action:
                case Send(cid, data) | Enqueue(cid, data):
                    # A client whose transport has closed is about to be removed
                    # by its own task; uvloop raises on writing to it.
                    if (writer := client(cid)) is not None and not writer.transport.is_closing():
                        writer.write(data)
                case Block(cid):
                    if (writer := client(cid)) is not None:
                        try:
                            await writer.drain()
                        except OSError:
                            pass
                case Disconnect(cid):
                    if (writer := client(cid)) is not None:
                        writer.transport.abort()
                case Drop():
                    pass
                case _:
                    raise common.unknown(action, "stream push")
        app.report()
        await port.sleep(app.interval_s)


# ---------------------------------------------------------------- task port

class _TaskClient:
    """One push client on the task port: its stream, its mailbox (a queue drained
    by its own delivery task, built from Events -- a fresh one per wait, since
    trio's cannot be cleared -- so it runs on every task port) and ``over``, set
    once the connection is to end (the client's EOF or error, a failed send, the
    core's Disconnect).

    Only the client's own task closes the stream, and only after its helper
    tasks are cancelled and the ticker has left any send to it: closing a
    stream another task is blocked on is not safe on every library (curio
    leaves that task registered on a closed fd)."""

    def __init__(self, port, stream):
        self.port, self.stream = port, stream
        self.items = collections.deque()
        self.ready = port.Event()
        self.over = port.Event()
        self.ended = False
        self.sending = False         # the ticker is in send_all to this client
        self.ticker_left = None      # the Event the closing task waits on meanwhile

    async def put(self, item):
        self.items.append(item)
        await common.set_event(self.ready)

    async def get(self):
        while not self.items:
            await self.ready.wait()
            self.ready = self.port.Event()
        return self.items.popleft()

    async def end(self):
        if not self.ended:
            self.ended = True
            await common.set_event(self.over)


async def _read_until_eof(port, client):
    # A push client has nothing to say: what it sends is dropped, its EOF (or a
    # reset) is how the server learns it has gone.
    try:
        while await client.stream.receive_some(65536):
            pass
    except port.StreamError:
        pass
    await client.end()


async def _deliver(port, app, cid, client):
    try:
        while True:
            await client.stream.send_all(await client.get())
            if app.clients.get(cid) is client:
                app.core.backlog(cid, len(client.items))
    except port.StreamError:
        pass
    await client.end()


async def task_push(served, stream):
    """One task per client, with two helpers: one reads the client until EOF,
    one drains its mailbox. The connection ends when either finishes or the
    ticker ends it; then this task forgets the client and closes the stream."""
    port, app, cid = served.port, served.push, id(stream)
    client = _TaskClient(port, stream)
    app.core.add_client(cid)
    app.clients[cid] = client
    try:
        async with port.open_nursery() as n:
            await n.spawn(_read_until_eof, port, client)
            await n.spawn(_deliver, port, app, cid, client)
            await client.over.wait()
            await n.cancel()
    finally:
        app.forget(cid)
        try:
            if client.sending:
                client.ticker_left = port.Event()
                await client.ticker_left.wait()
        finally:
            await stream.aclose()


async def _send_in_turn(port, app, cid, client, data):
    """Send from the ticker (send_all blocks, so one stalled client stalls all).
    A client whose send fails is forgotten at once and its task closes it."""
    client.sending = True
    try:
        await client.stream.send_all(data)
    except port.StreamError:
        app.forget(cid)
        await client.end()
    finally:
        client.sending = False
        if client.ticker_left is not None:
            await common.set_event(client.ticker_left)


async def task_ticker(port, app):
    """Send in turn from here (Send); Enqueue hands the message to the client's
    own task through its mailbox -- unbounded, or bounded by the core, as
    trio's memory channels; Disconnect ends that client's task, which cancels
    a send it is blocked in and closes the stream."""
    while True:
        for action in app.core.broadcast(app.next_message()):
            match action:
                case Send(cid, data):
                    if (client := app.clients.get(cid)) is not None and not client.ended:
                        await _send_in_turn(port, app, cid, client, data)
                case Enqueue(cid, data):
                    if (client := app.clients.get(cid)) is not None and not client.ended:
                        await client.put(data)
                        app.queued(len(client.items))
                case Disconnect(cid):
                    if (client := app.clients.get(cid)) is not None:
                        await client.end()
                case Block() | Drop():
                    pass              # send_all blocks anyway; a dropped message is not sent
                case _:
                    raise common.unknown(action, "task push")
        app.report()
        await port.sleep(app.interval_s)
