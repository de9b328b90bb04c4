"""aiohttp 1.x, the real releases, for two zoo entries (standard library and aiohttp only,
Python 3.6 syntax: aiohttp 1.x does not run on the Pythons looplab needs).

``aiohttp-1367`` (spec["scenario"]): a websocket handler pushes ``message_bytes`` messages
to a subscriber that never reads, as the thread's server did, written for the release's
own API: ``send_bytes()`` returns nothing in 1.2 and, from 1.3, something to ``yield
from`` (the drain). It stops when the transport's write buffer reached ``cap_bytes``
(the release let the backlog grow: nothing held the sender back), when a send raised
(1.3.0's ``'_SelectorSocketTransport' object has no attribute 'drain'``, aiohttp 1613),
or after ``serve_s`` (1.3.1: the send parked in the drain). It reports the messages
accepted, the write buffer's peak and the send's exception.

``aiohttp-1221``: a keep-alive client makes ``until_requests`` GETs and stays connected,
idle; then the program shuts down in ``run_app``'s order of the release (``app.shutdown()``,
``handler.finish_connections(shutdown_timeout_s)``, ``app.cleanup()``) and times it:
1.0's ``RequestHandler.shutdown`` waits for the idle connection's handler up to the
timeout, 1.1 cancels an idle keep-alive handler at once (PR 1222).

The peers (looplab's ``ws_subscriber`` and ``http_client``) listen; each is connected to
and handed to aiohttp's handler factory with ``loop.connect_accepted_socket``.
"""
import asyncio
import time

import _common

import aiohttp
from aiohttp import web


def _peers(spec):
    return [spec["peers"][name] for name in sorted(spec["peers"])]


@asyncio.coroutine
def _hand_over(loop, factory, spec):
    for addr in _peers(spec):
        yield from loop.connect_accepted_socket(factory, sock=_common.connect(addr))


@asyncio.coroutine
def _send(ws, msg):
    """A send as the release's API has it: 1.2 returns None, 1.3 returns () or the drain."""
    r = ws.send_bytes(msg)
    if r is not None:
        yield from r


def push(spec, out):
    p = spec["params"]
    loop = asyncio.get_event_loop()
    st = {"sent": 0, "peak": 0, "error": None, "parked": False}
    done = asyncio.Event(loop=loop)
    msg = _common.pattern(p["message_bytes"])

    @asyncio.coroutine
    def handler(request):
        ws = web.WebSocketResponse()
        yield from ws.prepare(request)
        t = request.transport
        end = time.monotonic() + p["serve_s"]
        try:
            while time.monotonic() < end and st["peak"] < p["cap_bytes"]:
                try:
                    yield from asyncio.wait_for(_send(ws, msg), end - time.monotonic(), loop=loop)
                except asyncio.TimeoutError:
                    st["parked"] = True          # held back by the drain until serve_s
                    break
                except Exception as exc:         # the release's own failure is the finding
                    st["error"] = "%s: %s" % (type(exc).__name__, exc)
                    break
                st["sent"] += 1
                st["peak"] = max(st["peak"], t.get_write_buffer_size())
                yield from asyncio.sleep(0, loop=loop)
        finally:
            done.set()
        t.abort()
        return ws

    app = web.Application(loop=loop)
    app.router.add_get("/ws", handler)
    factory = app.make_handler()
    loop.run_until_complete(_hand_over(loop, factory, spec))
    loop.run_until_complete(asyncio.wait_for(done.wait(), p["serve_s"] + 5, loop=loop))
    out.update(sent_messages_count=st["sent"], write_buffer_peak_bytes=st["peak"],
               send_error=st["error"], parked=st["parked"], cap_bytes=p["cap_bytes"],
               aiohttp=aiohttp.__version__)
    _close(loop, app, factory)


def keepalive(spec, out):
    p = spec["params"]
    loop = asyncio.get_event_loop()
    st = {"requests": 0}
    body = _common.pattern(p["body_bytes"])

    @asyncio.coroutine
    def nbytes(request):
        st["requests"] += 1
        return web.Response(body=body)

    app = web.Application(loop=loop)
    app.router.add_get("/bytes/{n}", nbytes)
    factory = app.make_handler()
    loop.run_until_complete(_hand_over(loop, factory, spec))

    @asyncio.coroutine
    def serve():
        end = time.monotonic() + p["serve_s"]
        while time.monotonic() < end and st["requests"] < p["until_requests"]:
            yield from asyncio.sleep(0.01, loop=loop)
        yield from asyncio.sleep(p["settle_s"], loop=loop)
    loop.run_until_complete(serve())
    out["requests_count"] = st["requests"]

    @asyncio.coroutine
    def shutdown():                   # run_app's order in 1.0 and 1.1
        yield from app.shutdown()
        yield from _finish(factory)(p["shutdown_timeout_s"])
        yield from app.cleanup()
    out["shutdown_started_at"] = time.monotonic()
    t0 = time.monotonic()
    try:
        loop.run_until_complete(asyncio.wait_for(shutdown(), p["shutdown_bound_s"], loop=loop))
        out["shutdown_s"] = time.monotonic() - t0
    except asyncio.TimeoutError:
        out["shutdown_s"] = None
    out["aiohttp"] = aiohttp.__version__
    loop.close()


def _finish(factory):
    """The handler factory's shutdown of its connections: ``finish_connections`` in 1.0
    and 1.1, ``Server.shutdown`` from 1.2."""
    return getattr(factory, "finish_connections", None) or factory.shutdown


def _close(loop, app, factory):
    @asyncio.coroutine
    def down():
        yield from app.shutdown()
        yield from _finish(factory)(0.1)
        yield from app.cleanup()
    try:
        loop.run_until_complete(asyncio.wait_for(down(), 2, loop=loop))
    except asyncio.TimeoutError:
        pass
    loop.close()


PROGRAMS = {"aiohttp-1367": push, "aiohttp-1221": keepalive}

if __name__ == "__main__":
    raise SystemExit(_common.run(lambda spec, out: PROGRAMS[spec["scenario"]](spec, out)))
