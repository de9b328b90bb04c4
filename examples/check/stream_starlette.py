"""A Starlette app under uvicorn that streams an export: ``GET /export?bytes=N``.

The export is N bytes (default 8 MB) with a Content-Length, made 64 KiB at a time, as
a report generator or a database cursor makes it. ``GET /export?bytes=65536`` is a
small one, for healthy clients.

- ``naive(prefetch=0)``: a producer task makes the chunks as fast as it can into a
  queue (``prefetch=0``: no bound, asyncio's default) "so the response never waits on
  the database"; the response takes them from the queue. uvicorn's flow control stops
  the response when a client reads slowly -- but not the producer: a slow client's
  whole export waits in memory.
- ``fixed()``: the response's generator makes each chunk when uvicorn asks for the
  next one, so uvicorn's flow control (its transport's high-water mark) is what
  bounds the memory a slow client costs.

    looplab check examples/check/stream_starlette.py:naive --asgi --path /export \\
        --healthy '/export?bytes=65536'
"""
from __future__ import annotations

import asyncio

from starlette.applications import Starlette
from starlette.responses import StreamingResponse
from starlette.routing import Route

CHUNK = 65536
_BASE = bytes(range(251)) * (CHUNK // 251 + 1)


def _chunk(at: int, n: int) -> bytes:
    """A fresh chunk (as a real producer makes one): byte i of the export is i % 251."""
    k = at % 251
    return _BASE[k:k + n] if n <= len(_BASE) - k else (_BASE * 2)[k:k + n]


def _size(request) -> int:
    return int(request.query_params.get("bytes", 8_000_000))


def _response(body, size: int) -> StreamingResponse:
    return StreamingResponse(body, media_type="application/octet-stream",
                             headers={"content-length": str(size)})


def naive(prefetch: int = 0) -> Starlette:
    async def export(request):
        size = _size(request)
        queue: asyncio.Queue = asyncio.Queue(maxsize=prefetch)

        async def produce():
            for at in range(0, size, CHUNK):
                await queue.put(_chunk(at, min(CHUNK, size - at)))   # never waits at 0
            await queue.put(None)
        producer = asyncio.create_task(produce())

        async def body():
            try:
                while (chunk := await queue.get()) is not None:
                    yield chunk
            finally:
                producer.cancel()
        return _response(body(), size)
    return Starlette(routes=[Route("/export", export)])


def fixed() -> Starlette:
    async def export(request):
        size = _size(request)

        async def body():
            for at in range(0, size, CHUNK):
                yield _chunk(at, min(CHUNK, size - at))   # made when uvicorn wants it
        return _response(body(), size)
    return Starlette(routes=[Route("/export", export)])


if __name__ == "__main__":
    import sys
    import uvicorn
    uvicorn.run({"naive": naive, "fixed": fixed}[sys.argv[1]](), host="127.0.0.1",
                port=int(sys.argv[2]), log_level="warning")
