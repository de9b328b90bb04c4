"""starlette 0.13, the real releases, for the zoo entry starlette-1012 (standard library,
starlette and uvicorn 0.11 only, Python 3.6 syntax; starlette 0.13.6's StreamingResponse
passes coroutines to asyncio.wait(), which Python 3.11 refuses).

A StreamingResponse whose generator produces ``chunk_bytes`` chunks as fast as it is
let (up to ``cap_bytes``), behind a no-op ``BaseHTTPMiddleware``, served by uvicorn's h11
protocol on asyncio's loop, to a client that reads at ``rate_Bps`` (looplab's
``http_slow_reader``). BaseHTTPMiddleware's ``call_next`` put every body message into an
``asyncio.Queue()``: unbounded before 0.13.7, ``maxsize=1`` in 0.13.7 (PR 1018),
unbounded again in 0.13.8 (PR 1028). The program reports how far the generator got
(``produced_bytes``) after ``serve_s``; the peer reports what reached it.
"""
import asyncio
import time

import _common


def serve(spec, out):
    p = spec["params"]
    import starlette
    import uvicorn
    from starlette.applications import Starlette
    from starlette.middleware.base import BaseHTTPMiddleware
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    loop = asyncio.get_event_loop()
    st = {"produced": 0, "requests": 0}
    chunk = _common.pattern(p["chunk_bytes"])

    async def body():
        while st["produced"] < p["cap_bytes"]:
            st["produced"] += len(chunk)
            yield chunk

    async def stream(request):
        st["requests"] += 1
        return StreamingResponse(body(), media_type="application/octet-stream")

    class Passthrough(BaseHTTPMiddleware):
        async def dispatch(self, request, call_next):
            return await call_next(request)

    app = Starlette(routes=[Route("/stream", stream)])
    app.add_middleware(Passthrough)
    config = uvicorn.Config(app, http="h11", loop="asyncio", lifespan="off", log_level="critical",
                            access_log=False)
    config.load()
    server = uvicorn.Server(config)

    def protocol():
        return config.http_protocol_class(config=config, server_state=server.server_state)

    async def main():
        for name in sorted(spec["peers"]):
            await loop.connect_accepted_socket(protocol, sock=_common.connect(spec["peers"][name]))
        end = time.monotonic() + p["serve_s"]
        while time.monotonic() < end:
            await asyncio.sleep(0.01)
        out["produced_bytes"] = st["produced"]
        for conn in list(server.server_state.connections):
            conn.transport.abort()
        await asyncio.sleep(0.05)
        for task in [t for t in asyncio.all_tasks(loop) if t is not asyncio.current_task(loop)]:
            task.cancel()
    loop.run_until_complete(main())
    out.update(requests_count=st["requests"], cap_bytes=p["cap_bytes"],
               starlette=starlette.__version__, uvicorn=uvicorn.__version__)


if __name__ == "__main__":
    raise SystemExit(_common.run(serve))
