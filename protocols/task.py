"""Task-port drivers: the apps as trio-Stream coroutines.

The same coroutines run on our coro kernel, trio and curio. There is one code path
per app: ``naive`` and ``fixed`` are the *same code* here, because ``await
send_all()`` returns only when the OS has the bytes -- backpressure comes from
blocking, and there is no buffer to lose at shutdown. That the variants cannot
differ on this port is the 2016 post's point; the report says so. Proxy and push
decisions are their cores'; the coroutines here feed events in and act.
"""
from __future__ import annotations

import time

from protocols import apps, common, cores
from protocols.push import PushApp, task_push, task_ticker
from protocols.relay import task_proxy

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


HANDLERS = apps.bind("task", {"echo": echo, "sink": sink, "reqresp": reqresp,
                              "proxy": task_proxy, "push": task_push})


async def main(port, name, sock, variant="naive", params=None):
    served = common.Served(port, "task", name, variant, params or {}, PushApp)
    handler = HANDLERS[name]
    listener = port.listen(sock)
    async with port.open_nursery() as n:
        if served.push is not None:
            await n.spawn(task_ticker, port, served.push)
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
