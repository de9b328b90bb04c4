"""Unmodified asyncio frameworks on the callback kernel's asyncio loop.

aiohttp (server and client), uvicorn serving a starlette app (plain and
streaming responses, httpx as the client) and websockets (server and client)
run on ``kernels.callback.new_event_loop`` and each serves 1,000 requests or
messages whose bytes are checked exactly -- once with the defaults and once
with ``write=defer`` and a small ``high_water``, so the knobs act under real
apps. The frameworks are the optional extra ``frameworks``; a missing one is
a skip with the reason.
"""
from __future__ import annotations

import asyncio
import functools
import socket

import pytest

import kernels.callback as cb

REQUESTS = 1000
KNOBS = [{}, {"write": "defer", "high_water": "4KiB"}]


def run_on_looplab(main, options, timeout=60.0):
    async def bounded():
        return await asyncio.wait_for(main(), timeout)
    with asyncio.Runner(loop_factory=functools.partial(cb.new_event_loop, **options)) as runner:
        result = runner.run(bounded())
        loop = runner.get_loop()
        assert isinstance(loop, cb.AioLoop)
        return result, loop.probe


def body(i: int) -> bytes:
    return (b"%05d:" % i) * (1 + i % 97)


@pytest.mark.parametrize("options", KNOBS, ids=["default", "defer-4KiB"])
def test_aiohttp_server_and_client(options):
    pytest.importorskip("aiohttp", reason="aiohttp is in the optional extra 'frameworks'")
    from aiohttp import ClientSession, web

    async def reverse(request):
        return web.Response(body=(await request.read())[::-1])

    async def main():
        app = web.Application()
        app.router.add_post("/reverse", reverse)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        good = 0
        try:
            async with ClientSession() as session:
                for i in range(REQUESTS):
                    async with session.post(f"http://127.0.0.1:{port}/reverse",
                                            data=body(i)) as response:
                        good += (await response.read()) == body(i)[::-1]
        finally:
            await runner.cleanup()
        return good
    good, probe = run_on_looplab(main, options)
    assert good == REQUESTS
    # the kernel's transports carried every byte both ways (each body, at least)
    carried = sum(conn.accepted_bytes for conn in probe.connections)
    assert carried > 2 * sum(len(body(i)) for i in range(REQUESTS))


@pytest.mark.parametrize("options", KNOBS, ids=["default", "defer-4KiB"])
def test_uvicorn_starlette_http_and_streaming(options):
    pytest.importorskip("uvicorn", reason="uvicorn is in the optional extra 'frameworks'")
    pytest.importorskip("starlette", reason="starlette is in the optional extra 'frameworks'")
    httpx = pytest.importorskip("httpx", reason="httpx is in the optional extra 'frameworks'")
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    chunks = [bytes([i % 251]) * (1000 + 37 * i) for i in range(200)]

    async def item(request):
        return Response(body(int(request.path_params["i"])),
                        media_type="application/octet-stream")

    async def stream(request):
        async def gen():
            for chunk in chunks:
                yield chunk
                await asyncio.sleep(0)
        return StreamingResponse(gen(), media_type="application/octet-stream")

    app = Starlette(routes=[Route("/item/{i:int}", item), Route("/stream", stream)])

    async def main():
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False)
        server = uvicorn.Server(config)
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        try:
            for _ in range(500):
                if server.started:
                    break
                await asyncio.sleep(0.01)
            assert server.started
            good = 0
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                for i in range(REQUESTS):
                    response = await client.get(f"/item/{i}")
                    good += response.content == body(i)
                async with client.stream("GET", "/stream") as response:
                    streamed = b"".join([part async for part in response.aiter_bytes()])
        finally:
            server.should_exit = True
            await asyncio.wait_for(serving, 10)
            sock.close()
        return good, streamed == b"".join(chunks)
    (good, streamed_ok), _probe = run_on_looplab(main, options)
    assert good == REQUESTS
    assert streamed_ok


@pytest.mark.parametrize("options", KNOBS, ids=["default", "defer-4KiB"])
def test_websockets_echo(options):
    pytest.importorskip("websockets", reason="websockets is in the optional extra 'frameworks'")
    try:
        from websockets.asyncio.client import connect
        from websockets.asyncio.server import serve
    except ImportError:
        pytest.skip("websockets >= 13 (the asyncio implementation) is needed")

    async def echo(ws):
        async for message in ws:
            await ws.send(message)

    async def main():
        good = 0
        async with serve(echo, "127.0.0.1", 0) as server:
            port = next(iter(server.sockets)).getsockname()[1]
            async with connect(f"ws://127.0.0.1:{port}") as ws:
                for i in range(REQUESTS):
                    message = body(i) if i % 2 else body(i).decode()
                    await ws.send(message)
                    good += (await ws.recv()) == message
        return good
    good, probe = run_on_looplab(main, options)
    assert good == REQUESTS


def test_aiohttp_on_the_simulated_network_is_deterministic():
    """An unmodified aiohttp server on the loop with ``io=`` a simulated world:
    the same seed gives the same results, whole: the bytes the client read, the
    virtual end time, the world's event log and every counter of the loop's probe
    (per-connection bytes, buffer peaks, pauses, loop passes, callbacks run)."""
    pytest.importorskip("aiohttp", reason="aiohttp is in the optional extra 'frameworks'")
    from aiohttp import web

    from kernels import simnet

    async def reverse(request):
        # a fixed Date: aiohttp stamps wall-clock time otherwise
        return web.Response(body=(await request.read())[::-1],
                            headers={"Date": "Thu, 01 Jan 1970 00:00:00 GMT"})

    async def main():
        app = web.Application()
        app.router.add_post("/reverse", reverse)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 8080).start()
        # the client: asyncio streams on the same loop (aiohttp's client opens
        # its sockets with the socket module, outside the loop's I/O seam)
        reader, writer = await asyncio.open_connection("127.0.0.1", 8080)
        got = bytearray()
        for i in range(REQUESTS):
            writer.write(b"POST /reverse HTTP/1.1\r\nHost: sim\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(body(i)), body(i)))
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            payload = await reader.readexactly(length)
            assert payload == body(i)[::-1]
            got += head + payload
        writer.close()
        await writer.wait_closed()
        await runner.cleanup()
        return bytes(got), asyncio.get_running_loop().time()

    def once(seed):
        world = simnet.World(seed, latency_s=0.0005, jitter_s=0.0002)
        (data, end), probe = run_on_looplab(main, {"io": world.io()})
        return data, end, world.digest(), probe.snapshot()

    first, again, other = once(7), once(7), once(8)
    assert first == again
    assert first[0] == other[0]              # the bytes never depend on the seed...
    assert first[1:3] != other[1:3]          # ...the timing and the event log do
    assert first[1] > REQUESTS * 2 * 0.0005  # virtual time: a round trip per request
    counters = first[3]
    assert counters["connections_count"] == 2 and counters["loop_iterations_count"] > REQUESTS
    assert counters["accepted_bytes"] == counters["sent_bytes"] > len(first[0])
