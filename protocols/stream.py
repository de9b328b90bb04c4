"""Stream-port drivers: the apps as asyncio-streams coroutines.

The same coroutines run on our hybrid kernel and on asyncio/uvloop. Variants, as the
2016 post wrote them: ``naive`` never awaits ``drain()`` and returns right after
``writer.close()`` (backpressure bug, and bytes lost at shutdown); ``fixed`` awaits
``drain()`` after each write and ``wait_closed()`` before returning; ``limits0`` is
``fixed`` plus ``set_write_buffer_limits(0)`` (the post's full fix). Proxy and push
decisions are their cores'; the coroutines here feed events in and act.
"""
from __future__ import annotations

import sys
import time

from protocols import apps, common, cores
from protocols.cores import Block, Close, Disconnect, Done, Drop, Enqueue, Send, SendEof

VARIANTS = apps.variants("stream")


async def _close(writer, wait: bool):
    writer.close()
    if wait:
        try:
            await writer.wait_closed()
        except OSError:
            pass


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


async def proxy(served, reader, writer):
    """One pump task per side feeds the ProxyCore; the relay is over when the
    core says Done (the other pump, still waiting to read, is then cancelled)
    or when a pump fails with a driver bug, which is raised here."""
    port, core, v = served.port, served.new_core(), served.variant
    host, up_port = served.params["upstream"]
    ends, over, failed = {"a": writer}, port.Event(), []

    async def act(actions):
        for action in actions:
            match action:
                case Send(to, data):
                    ends[to].write(data)
                    if v.drain:
                        try:
                            await ends[to].drain()
                        except OSError as exc:
                            await act(core.closed(to, exc))
                case SendEof(to):
                    if not ends[to].transport.is_closing():
                        ends[to].write_eof()
                case Close(to, abort=True):
                    ends[to].transport.abort()
                case Close(to):
                    await _close(ends[to], v.drain)
                case Done():
                    over.set()
                case _:
                    raise common.unknown(action, "stream proxy")

    async def pump(side, reader):
        try:
            while data := await reader.read(65536):
                await act(core.data(side, data))
            await act(core.eof(side))
        except OSError as exc:
            await act(core.closed(side, exc))
        except Exception as exc:
            failed.append(exc)
            over.set()

    try:
        up_reader, ends["b"] = await port.open_connection(host, up_port,
                                                          sockbuf=served.params.get("sockbuf"))
    except OSError as exc:
        print(f"proxy: upstream {host}:{up_port} failed: {exc}", file=sys.stderr)
        return await act(core.closed("b", exc))
    if v.zero_limits:
        ends["b"].transport.set_write_buffer_limits(0)
    pumps = [port.create_task(pump("a", reader)), port.create_task(pump("b", up_reader))]
    try:
        await over.wait()
    finally:
        for task in pumps:
            task.cancel()
    if failed:
        raise failed[0]


async def push(served, reader, writer):
    app, cid = served.push, id(writer)
    app.core.add_client(cid)
    app.clients[cid] = writer
    try:
        await reader.read()          # a push client only ever sends EOF
    except OSError:
        pass
    finally:
        if app.clients.pop(cid, None) is not None:
            app.core.remove_client(cid)
    writer.close()


async def push_ticker(port, app):
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


HANDLERS = apps.bind("stream", {"echo": echo, "sink": sink, "reqresp": reqresp,
                                "proxy": proxy, "push": push})


async def main(port, name, sock, variant="naive", params=None):
    """Serve app ``name`` on ``sock``. The one-shot proxy returns after its one
    connection -- and what happens to unsent bytes then is the runtime's exit policy."""
    served = common.Served(port, "stream", name, variant, params or {})
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
            await push_ticker(port, served.push)
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
