"""Task-port drivers: the apps as trio-Stream coroutines.

The same coroutines run on our coro kernel, trio and curio. There is one code path
per app: ``naive`` and ``fixed`` are the *same code* here, because ``await
send_all()`` returns only when the OS has the bytes -- backpressure comes from
blocking, and there is no buffer to lose at shutdown. That the variants cannot
differ on this port is the 2016 post's point; the report says so. Proxy and push
decisions are their cores'; the coroutines here feed events in and act.
"""
from __future__ import annotations

import collections
import sys
import time

from protocols import apps, common, cores
from protocols.cores import Block, Close, Disconnect, Done, Drop, Enqueue, Send, SendEof

VARIANTS = apps.variants("task")
SAME_CODE_NOTE = apps.SAME_CODE_NOTE


async def echo(served, stream):
    core = served.new_core()
    try:
        while data := await stream.receive_some(65536):
            await stream.send_all(core.receive(data))
    except served.port.StreamError:
        pass
    await stream.aclose()


async def sink(served, stream):
    core = served.new_core()
    try:
        while data := await stream.receive_some(65536):
            core.receive(data, time.monotonic())
        core.eof()
    except cores.ProtocolError as exc:
        common.protocol_error("sink", exc)
    except served.port.StreamError:
        pass
    await stream.aclose()


async def reqresp(served, stream):
    core = served.new_core()
    try:
        while data := await stream.receive_some(65536):
            for _ in range(core.requests(data)):
                await stream.send_all(core.respond())
                common.count(served.counters, "requests_handled_count")
    except cores.ProtocolError as exc:
        common.protocol_error("reqresp", exc)
    except served.port.StreamError:
        pass
    await stream.aclose()


def _set(event) -> None:
    """Set an Event from plain code: curio's Event.set called straight from a
    coroutine returns a coroutine to await instead of setting it."""
    event.set()


async def proxy(served, stream):
    """One pump task per side feeds the ProxyCore. Close waits until Done has
    cancelled the pumps: a stream is closed only once no task is using it. A
    pump that fails with a driver bug ends the relay and the error is raised."""
    port, core = served.port, served.new_core()
    host, up_port = served.params["upstream"]
    ends, over, failed = {"a": stream}, port.Event(), []

    async def act(actions):
        for action in actions:
            match action:
                case Send(to, data):
                    try:
                        await ends[to].send_all(data)
                    except port.StreamError as exc:
                        await act(core.closed(to, exc))
                    else:
                        await act(core.sent(to, len(data)))
                case SendEof(to):
                    try:
                        await ends[to].send_eof()
                    except port.StreamError as exc:
                        await act(core.closed(to, exc))
                case Close():
                    pass              # both ends are closed below, after the pumps
                case Done():
                    _set(over)
                case _:
                    raise common.unknown(action, "task proxy")

    async def pump(side):
        try:
            while data := await ends[side].receive_some(65536):
                await act(core.data(side, data))
            await act(core.eof(side))
        except port.StreamError as exc:
            await act(core.closed(side, exc))
        except Exception as exc:
            failed.append(exc)
            _set(over)

    try:
        ends["b"] = await port.open_tcp_stream(host, up_port, sockbuf=served.params.get("sockbuf"))
    except OSError as exc:
        print(f"proxy: upstream {host}:{up_port} failed: {exc}", file=sys.stderr)
        core.closed("b", exc)
    else:
        async with port.open_nursery() as n:
            await n.spawn(pump, "a")
            await n.spawn(pump, "b")
            await over.wait()
            await n.cancel()
    for side in ("b", "a"):
        if side in ends:
            await ends[side].aclose()
    if failed:
        raise failed[0]


class _Mailbox:
    """A per-client queue drained by that client's own task. Built from Events
    (a fresh one per wait: trio's cannot be cleared) so it runs on every task port."""

    def __init__(self, port):
        self.port = port
        self.items = collections.deque()
        self.ready = port.Event()

    def put(self, item):
        self.items.append(item)
        self.ready.set()

    async def get(self):
        while not self.items:
            await self.ready.wait()
            self.ready = self.port.Event()
        return self.items.popleft()


async def push(served, stream):
    """One task per client, draining its mailbox; a push client never sends, so a
    failed send is how it is known to be gone. ``None`` in the mailbox ends it."""
    port, app, cid = served.port, served.push, id(stream)
    app.core.add_client(cid)
    app.clients[cid] = stream
    box = app.boxes[cid] = _Mailbox(port)
    try:
        while (message := await box.get()) is not None:
            await stream.send_all(message)
            app.core.backlog(cid, len(box.items))
    except port.StreamError:
        pass
    finally:
        app.boxes.pop(cid, None)
        if app.clients.pop(cid, None) is not None:
            app.core.remove_client(cid)
        await stream.aclose()


# Mailbox wake-ups handed out between two yields of the ticker. curio's Event
# (the one that also works from threads) wakes its kernel with one byte on a
# socketpair per waiter and fails, printing a traceback, once that socket is
# full (a few hundred wake-ups without a pass of the kernel).
WAKEUPS_PER_YIELD = 64


async def _push_ticker(port, app):
    """Send in turn from here (send_all blocks, so one stalled client stalls
    all); Enqueue hands the message to the client's own task through its
    mailbox -- unbounded, or bounded by the core, as trio's memory channels."""
    while True:
        woken = 0
        for action in app.core.broadcast(app.next_message()):
            match action:
                case Send(cid, data):
                    if (stream := app.clients.get(cid)) is not None:
                        try:
                            await stream.send_all(data)
                        except port.StreamError:
                            if (box := app.boxes.get(cid)) is not None:
                                box.put(None)           # its task ends and forgets it
                                woken += 1
                case Enqueue(cid, data):
                    if (box := app.boxes.get(cid)) is not None:
                        box.put(data)
                        app.queued(len(box.items))
                        woken += 1
                case Disconnect(cid):
                    if (stream := app.clients.pop(cid, None)) is not None:
                        await stream.aclose()   # its task, blocked in send_all, gets StreamError
                case Block() | Drop():
                    pass              # send_all blocks anyway; a dropped message is not sent
                case _:
                    raise common.unknown(action, "task push")
            if woken >= WAKEUPS_PER_YIELD:
                woken = 0
                await port.sleep(0)
        app.report()
        await port.sleep(app.interval_s)


HANDLERS = apps.bind("task", {"echo": echo, "sink": sink, "reqresp": reqresp,
                              "proxy": proxy, "push": push})


async def main(port, name, sock, variant="naive", params=None):
    served = common.Served(port, "task", name, variant, params or {})
    handler = HANDLERS[name]
    listener = port.listen(sock)
    async with port.open_nursery() as n:
        if served.push is not None:
            await n.spawn(_push_ticker, port, served.push)
        while True:
            stream = await listener.accept()
            if served.one_shot:
                await listener.aclose()
                await handler(served, stream)
                await n.cancel()
                return
            await n.spawn(handler, served, stream)


def serve(port, name, sock, variant="naive", params=None):
    return port.run(main, name, sock, variant, params)
