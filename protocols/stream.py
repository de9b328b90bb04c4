"""Stream-port drivers: the apps as asyncio-streams coroutines.

The same coroutines run on our hybrid kernel and on asyncio/uvloop. Variants, as the
2016 post wrote them: ``naive`` never awaits ``drain()`` and returns right after
``writer.close()`` (backpressure bug, and bytes lost at shutdown); ``fixed`` awaits
``drain()`` at the top of each pass and ``wait_closed()`` before returning;
``limits0`` is ``fixed`` plus ``set_write_buffer_limits(0)`` (the post's full fix).
"""
from __future__ import annotations

import sys
import time

from protocols import common, cores

VARIANTS = {"echo": ("naive", "fixed"), "sink": ("naive", "fixed"),
            "proxy": ("naive", "fixed", "limits0"), "reqresp": ("naive", "fixed"),
            "push": common.PUSH_POLICIES}


async def _close(writer, fixed: bool):
    writer.close()
    if fixed:
        try:
            await writer.wait_closed()
        except ConnectionError:
            pass


async def echo(port, reader, writer, variant, params):
    core, fixed = cores.EchoCore(), variant != "naive"
    try:
        while data := await reader.read(65536):
            writer.write(core.receive(data))
            if fixed:
                await writer.drain()
    except ConnectionError:
        pass
    await _close(writer, fixed)


async def sink(port, reader, writer, variant, params):
    core = cores.SinkCore(params.get("frame_bytes"))
    try:
        while data := await reader.read(65536):
            core.receive(data, time.monotonic())
        core.eof()
    except cores.ProtocolError as exc:
        common.protocol_error("sink", exc)
        writer.transport.abort()
        return
    except ConnectionError:
        pass
    await _close(writer, variant != "naive")


async def reqresp(port, reader, writer, variant, params):
    core, fixed = cores.ReqRespCore(params.get("response_bytes", 65536)), variant != "naive"
    try:
        while data := await reader.read(65536):
            for _ in range(core.requests(data)):
                writer.write(core.respond())
                common.count(params.get("counters", {}), "requests_handled_count")
                if fixed:
                    await writer.drain()
    except cores.ProtocolError as exc:
        common.protocol_error("reqresp", exc)
        writer.transport.abort()
        return
    except ConnectionError:
        pass
    await _close(writer, fixed)


async def proxy(port, reader, writer, variant, params):
    """The post's program: copy client -> upstream until EOF (two-way: both ways,
    propagating half-close)."""
    fixed = variant != "naive"
    host, up_port = params["upstream"]
    try:
        up_reader, up_writer = await port.open_connection(host, up_port, sockbuf=params.get("sockbuf"))
    except OSError as exc:
        print(f"proxy: upstream {host}:{up_port} failed: {exc}", file=sys.stderr)
        writer.close()
        return
    if variant == "limits0":
        up_writer.transport.set_write_buffer_limits(0)

    async def copy(src, dst):
        try:
            while True:
                if fixed:
                    await dst.drain()
                data = await src.read(65536)
                if not data:
                    break
                dst.write(data)
            if params.get("two_way"):
                dst.write_eof()
        except ConnectionError:
            pass

    if params.get("two_way"):
        await port.gather(copy(reader, up_writer), copy(up_reader, writer))
        await _close(writer, fixed)
    else:
        await copy(reader, up_writer)
    await _close(up_writer, fixed)


async def push_client(port, reader, writer, app):
    cid = id(writer)
    app.core.add_client(cid)
    app.clients[cid] = writer
    try:
        await reader.read()          # a push client only ever sends EOF
    except ConnectionError:
        pass
    finally:
        if app.clients.pop(cid, None) is not None:
            app.core.remove_client(cid)
    writer.close()


async def push_ticker(port, app, params):
    """Offer one message every interval to every client, under the overload policy.
    ``block`` awaits that client's drain() before writing -- one stalled client
    stalls all; ``drop``/``disconnect`` judge a client by its transport backlog."""
    while True:
        for cid, writer in app.clients.items():
            app.core.backlog(cid, writer.transport.get_write_buffer_size() // app.message_bytes)
        for kind, cid, *rest in app.core.broadcast(app.next_message()):
            writer = app.clients.get(cid)
            if writer is None:
                continue
            if kind in ("send", "enqueue"):
                writer.write(rest[0])
            elif kind == "block":
                try:
                    await writer.drain()
                except ConnectionError:
                    pass
            elif kind == "disconnect":
                writer.transport.abort()
        app.report()
        await port.sleep(app.interval_s)


HANDLERS = {"echo": echo, "sink": sink, "reqresp": reqresp, "proxy": proxy}


async def main(port, name, sock, variant="naive", params=None):
    """Serve app ``name`` on ``sock``. The one-shot proxy returns after its one
    connection -- and what happens to unsent bytes then is the runtime's exit policy."""
    params = params or {}
    one_shot = name == "proxy" and not params.get("forever")
    done = port.Event()
    if name == "push":
        app = common.PushApp(variant, params)
        handler = lambda r, w: push_client(port, r, w, app)  # noqa: E731
        ticker = port.create_task(push_ticker(port, app, params))
    else:
        ticker = None
        fn = HANDLERS[name]

        async def handler(reader, writer):
            if one_shot:
                server.close()
            await fn(port, reader, writer, variant, params)
            if one_shot:
                done.set()

    server = await port.start_server(handler, sock=sock, limit=params.get("limit", 65536))
    try:
        await done.wait()
    finally:
        server.close()
        if ticker is not None:
            ticker.cancel()


def serve(port, name, sock, variant="naive", params=None):
    return port.run(main, name, sock, variant, params)
