"""Sanic, the real releases, for the zoo entry sanic-2921 (standard library and Sanic
with its dependencies only; Python 3.10 here, on uvloop as Sanic runs by default: the
thread's truncation needs uvloop, whose close() leaves unsent data queued in libuv where
asyncio's transport had let the handler wait it out).

One GET for a ``body_bytes`` response with keep-alive off, from a client that reads
slowly (looplab's ``http_slow_reader``), so most of the response is still in the
transport's buffer when the handler is done. Sanic 23.12.1 then closed the connection
with ``transport.close()`` and at once ``abort()``, which drops what is buffered: the
client got a truncated body (issue 2921). PR 2973 (in 24.6.0, backported as 23.12.2)
closes, and aborts only once the buffer drained or ``GRACEFUL_TCP_CLOSE_TIMEOUT`` passed.

The app is started with ``create_server(return_asyncio_server=True)`` on a listening
socket nobody connects to, on a uvloop loop whose ``create_server`` keeps the protocol
factory Sanic passed it; the peer's connected socket is given to that factory with
``loop.connect_accepted_socket``. The client's account of the body is the finding; the
program reports the server side's view.
"""
import asyncio
import socket
import time

import _common


def serve(spec, out):
    p = spec["params"]
    import sanic
    import uvloop
    from sanic import Sanic
    from sanic.response import raw

    factories = []

    class Loop(uvloop.Loop):
        def create_server(self, protocol_factory, *args, **kwargs):
            factories.append(protocol_factory)       # the factory Sanic built
            return super().create_server(protocol_factory, *args, **kwargs)

    loop = Loop()
    asyncio.set_event_loop(loop)
    app = Sanic("looplab_zoo")
    app.config.KEEP_ALIVE = False
    app.config.ACCESS_LOG = False
    app.config.NOISY_EXCEPTIONS = False
    body = _common.pattern(p["body_bytes"])
    st = {"requests": 0}

    @app.get("/big")
    async def big(request):
        st["requests"] += 1
        return raw(body)

    async def main():
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        srv = await app.create_server(sock=listener, return_asyncio_server=True)
        await srv.startup()
        factory = factories[-1]
        for name in sorted(spec["peers"]):
            await loop.connect_accepted_socket(
                factory, sock=_common.connect(spec["peers"][name], p["sockbuf"]))
        end = time.monotonic() + p["serve_s"]
        while time.monotonic() < end and (st["requests"] == 0 or srv.connections):
            await asyncio.sleep(0.01)
        out["open_at_end_count"] = len(srv.connections)
        for conn in list(srv.connections):
            conn.close(timeout=0)
        srv.close()
        await srv.wait_closed()
        listener.close()
    loop.run_until_complete(main())
    loop.close()
    out.update(requests_count=st["requests"], body_bytes=p["body_bytes"], sanic=sanic.__version__,
               uvloop=uvloop.__version__)


if __name__ == "__main__":
    raise SystemExit(_common.run(serve))
