"""Stream-port drivers: the apps as asyncio-streams coroutines.

The same coroutines run on our hybrid kernel and on asyncio/uvloop. Variants, as the
2016 post wrote them: ``naive`` never awaits ``drain()`` and returns right after
``writer.close()`` (backpressure bug, and bytes lost at shutdown); ``fixed`` awaits
``drain()`` after each write and ``wait_closed()`` before returning; ``limits0`` is
``fixed`` plus ``set_write_buffer_limits(0)`` (the post's full fix). Proxy and push
decisions are their cores'; the coroutines here feed events in and act.
"""
from __future__ import annotations

import time

from protocols import apps, common, cores
from protocols.push import PushApp, stream_push, stream_ticker
from protocols.relay import stream_proxy

_close = common.close_writer

VARIANTS = apps.variants("stream")


async def echo(served, reader, writer):
    core, drain = served.new_core(), served.variant.drain
    try:
        while data := await reader.read(65536):
            writer.write(core.receive(data))
            if drain:
                await writer.drain()
    except OSError:
        pass
    await _close(writer, drain)


async def sink(served, reader, writer):
    core = served.new_core()
    try:
        while data := await reader.read(65536):
            core.receive(data, time.monotonic())
        core.eof()
    except cores.ProtocolError as exc:
        common.protocol_error("sink", exc)
        writer.transport.abort()
        return
    except OSError:
        pass
    await _close(writer, served.variant.drain)


async def reqresp(served, reader, writer):
    core, drain = served.new_core(), served.variant.drain
    try:
        while data := await reader.read(65536):
            for _ in range(core.requests(data)):
                writer.write(core.respond())
                common.count(served.counters, "requests_handled_count")
                if drain:
                    await writer.drain()
    except cores.ProtocolError as exc:
        common.protocol_error("reqresp", exc)
        writer.transport.abort()
        return
    except OSError:
        pass
    await _close(writer, drain)


HANDLERS = apps.bind("stream", {"echo": echo, "sink": sink, "reqresp": reqresp,
                                "proxy": stream_proxy, "push": stream_push})


async def main(port, name, sock, variant="naive", params=None):
    """Serve app ``name`` on ``sock``. The one-shot proxy returns after its one
    connection -- and what happens to unsent bytes then is the runtime's exit policy."""
    served = common.Served(port, "stream", name, variant, params or {}, PushApp)
    fn, done = HANDLERS[name], port.Event()

    async def handler(reader, writer):
        if served.one_shot:
            server.close()
        try:
            await fn(served, reader, writer)
        except port.CancelledError:
            # Cancelled at shutdown: end quietly. (asyncio 3.11's done-callback
            # for this task calls task.exception() and logs a traceback for a
            # cancelled one; what happens to its transport is the exit policy's.)
            return
        if served.one_shot:
            done.set()

    failed: list = []

    async def tick():
        try:
            await stream_ticker(port, served.push)
        except Exception as exc:       # a dead ticker must end the server, not hide
            failed.append(exc)
            done.set()

    ticker = port.create_task(tick()) if served.push else None
    server = await port.start_server(handler, sock=sock, limit=served.params.get("limit", 65536))
    try:
        await done.wait()
    finally:
        server.close()
        if ticker is not None:
            ticker.cancel()
    if failed:
        raise failed[0]


def serve(port, name, sock, variant="naive", params=None):
    return port.run(main, name, sock, variant, params)
