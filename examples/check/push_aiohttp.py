"""A push server on aiohttp: every subscriber gets every message a broadcaster makes.

One broadcaster task makes a 4 KiB message every 2 ms (up to 2 MB/s) and hands it to every
subscriber's queue; each subscriber's handler takes messages from its queue and
writes them, over chunked HTTP (``GET /feed``) or a WebSocket (``/ws``). ``GET
/snapshot`` is a finite answer (4 MB with a Content-Length) for the shutdown question.

Three versions, side by side:

- ``naive(queue_max=0)``: a queue per subscriber with no bound (asyncio's default).
  ``resp.write`` waits for a slow reader (aiohttp drains), so the slow subscriber's
  queue is where everything piles up: memory grows for as long as it stays.
- ``blocking(queue_max=16)``: bounded queues, and the broadcaster *waits* for room
  (``await queue.put``). Memory is bounded, but the slowest subscriber now sets
  everyone's pace: healthy subscribers stall behind one that does not read.
- ``fixed(queue_max=16)``: bounded queues, and a subscriber whose queue is full is
  dropped (``put_nowait`` -> ``QueueFull``): memory is bounded and nobody waits.

``naive`` and ``fixed`` are the same code with a different default: the bound is the
fix, and ``looplab check ... --advise app.queue_max`` finds it by measuring.

    looplab check examples/check/push_aiohttp.py:naive --path /feed --ws /ws

docs/check.md shows what ``looplab check`` measures on each.
"""
from __future__ import annotations

import asyncio

from aiohttp import web

PAYLOAD = bytes(range(256)) * 16          # 4 KiB
INTERVAL_S = 0.002
SNAPSHOT = bytes(range(251)) * (4_000_000 // 251)


def _app(queue_max: int, wait_for_room: bool) -> web.Application:
    subscribers: dict[asyncio.Queue, asyncio.Task] = {}    # queue -> its handler

    async def broadcast():
        seq = 0
        while True:
            seq += 1
            message = seq.to_bytes(8, "big") + PAYLOAD   # a new message each time, shared
            for q in list(subscribers):
                if wait_for_room:
                    await q.put(message)           # the slowest subscriber sets the pace
                else:
                    try:
                        q.put_nowait(message)      # never waits: with queue_max=0 never full
                    except asyncio.QueueFull:      # too far behind: drop this subscriber
                        subscribers.pop(q).cancel()
            await asyncio.sleep(INTERVAL_S)

    async def subscribe(send):
        q = asyncio.Queue(maxsize=queue_max)
        subscribers[q] = asyncio.current_task()
        try:
            while True:
                await send(await q.get())
        finally:
            subscribers.pop(q, None)

    async def feed(request):
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        await subscribe(resp.write)            # resp.write drains: waits for a slow reader
        return resp

    async def ws(request):
        sock = web.WebSocketResponse()
        await sock.prepare(request)
        await subscribe(sock.send_bytes)
        return sock

    async def snapshot(request):
        return web.Response(body=SNAPSHOT)

    async def start(app):
        app["broadcaster"] = asyncio.create_task(broadcast())

    async def stop(app):
        app["broadcaster"].cancel()

    app = web.Application()
    app.router.add_get("/feed", feed)
    app.router.add_get("/ws", ws)
    app.router.add_get("/snapshot", snapshot)
    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    return app


def naive(queue_max: int = 0) -> web.Application:
    return _app(queue_max, wait_for_room=False)


def blocking(queue_max: int = 16) -> web.Application:
    return _app(queue_max, wait_for_room=True)


def fixed(queue_max: int = 16) -> web.Application:
    return _app(queue_max, wait_for_room=False)


if __name__ == "__main__":
    import sys
    web.run_app({"naive": naive, "blocking": blocking, "fixed": fixed}[sys.argv[1]](),
                host="127.0.0.1", port=int(sys.argv[2]))
