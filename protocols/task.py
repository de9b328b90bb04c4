"""Task-port drivers: the apps as trio-Stream coroutines.

The same coroutines run on our coro kernel, trio and curio. There is one code path
per app: ``naive`` and ``fixed`` are the *same code* here, because ``await
send_all()`` returns only when the OS has the bytes -- backpressure comes from
blocking, and there is no buffer to lose at shutdown. That the variants cannot
differ on this port is the 2016 post's point; the report says so.
"""
from __future__ import annotations

import collections
import sys
import time

from protocols import common, cores

VARIANTS = {"echo": ("naive", "fixed"), "sink": ("naive", "fixed"),
            "proxy": ("naive", "fixed", "limits0"), "reqresp": ("naive", "fixed"),
            "push": common.PUSH_POLICIES}
SAME_CODE_NOTE = "task port: naive and fixed are the same code (send_all blocks)"


async def echo(port, stream, params):
    core = cores.EchoCore()
    try:
        while data := await stream.receive_some(65536):
            await stream.send_all(core.receive(data))
    except port.StreamError:
        pass
    await stream.aclose()


async def sink(port, stream, params):
    core = cores.SinkCore(params.get("frame_bytes"))
    try:
        while data := await stream.receive_some(65536):
            core.receive(data, time.monotonic())
        core.eof()
    except cores.ProtocolError as exc:
        common.protocol_error("sink", exc)
    except port.StreamError:
        pass
    await stream.aclose()


async def reqresp(port, stream, params):
    core = cores.ReqRespCore(params.get("response_bytes", 65536))
    try:
        while data := await stream.receive_some(65536):
            for _ in range(core.requests(data)):
                await stream.send_all(core.respond())
                common.count(params.get("counters", {}), "requests_handled_count")
    except cores.ProtocolError as exc:
        common.protocol_error("reqresp", exc)
    except port.StreamError:
        pass
    await stream.aclose()


async def _copy(port, src, dst, propagate_eof: bool):
    try:
        while data := await src.receive_some(65536):
            await dst.send_all(data)
        if propagate_eof:
            await dst.send_eof()
    except port.StreamError:
        pass


async def proxy(port, stream, params):
    host, up_port = params["upstream"]
    try:
        upstream = await port.open_tcp_stream(host, up_port, sockbuf=params.get("sockbuf"))
    except OSError as exc:
        print(f"proxy: upstream {host}:{up_port} failed: {exc}", file=sys.stderr)
        await stream.aclose()
        return
    if params.get("two_way"):
        async with port.open_nursery() as n:
            await n.spawn(_copy, port, stream, upstream, True)
            await n.spawn(_copy, port, upstream, stream, True)
    else:
        await _copy(port, stream, upstream, False)
    await upstream.aclose()
    await stream.aclose()


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


async def _push_client(port, stream, app):
    """One task per client, draining its mailbox; a push client never sends, so a
    failed send is how it is known to be gone. ``None`` in the mailbox ends it."""
    cid = id(stream)
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


async def _push_ticker(port, app, params):
    """``block`` sends to each client in turn from here (send_all blocks, so one
    stalled client stalls all); the other policies hand the message to the client's
    own task through its mailbox -- ``unbounded`` without limit, ``drop`` and
    ``disconnect`` bounded, as trio's memory channels would be."""
    while True:
        for kind, cid, *rest in app.core.broadcast(app.next_message()):
            stream = app.clients.get(cid)
            if stream is None:
                continue
            if kind == "send" and app.core.policy == "block":
                try:
                    await stream.send_all(rest[0])
                except port.StreamError:
                    pass
            elif kind in ("send", "enqueue"):
                box = app.boxes[cid]
                box.put(rest[0])
                app.queued(len(box.items))
            elif kind == "disconnect":
                app.clients.pop(cid, None)
                await stream.aclose()       # its task, blocked in send_all, gets StreamError
        app.report()
        await port.sleep(app.interval_s)


HANDLERS = {"echo": echo, "sink": sink, "reqresp": reqresp, "proxy": proxy}


async def main(port, name, sock, variant="naive", params=None):
    params = params or {}
    one_shot = name == "proxy" and not params.get("forever")
    listener = port.listen(sock)
    app = common.PushApp(variant, params) if name == "push" else None
    async with port.open_nursery() as n:
        if app is not None:
            await n.spawn(_push_ticker, port, app, params)
        while True:
            stream = await listener.accept()
            if one_shot:
                await listener.aclose()
                await proxy(port, stream, params)
                await n.cancel()
                return
            if app is not None:
                await n.spawn(_push_client, port, stream, app)
            else:
                await n.spawn(HANDLERS[name], port, stream, params)


def serve(port, name, sock, variant="naive", params=None):
    return port.run(main, name, sock, variant, params)
