"""Real web frameworks as scenario programs, and the zoo entries that run them.

The programs run aiohttp's web server and uvicorn's ``Server`` with a starlette app
inside the stream port's asyncio loop, so they work on every loop of the loop axis
(``asyncio-streams:loop=uvloop|rloop|looplab|MODULE:FACTORY``, ``uvloop-streams``).
A runtime whose port is not an asyncio loop (our kernels, trio, curio), or a
framework that is not installed, makes the cell "not measured" with the reason
(``framework_reason``), never a crash. The frameworks are imported lazily.

How a connection reaches the framework. The peers (``bench.peers.http``: plain-socket
HTTP/1.1 and WebSocket clients) listen; the program connects to each one and hands
the connected socket to the framework as an accepted connection
(``loop.connect_accepted_socket`` with the framework's own protocol factory:
aiohttp's ``Server``, uvicorn's ``config.http_protocol_class`` bound to the
``Server``'s state). From there the framework's own parser, handlers, flow control
and shutdown run on it, and the peer counts what crossed the wire. This keeps
``bench.scenarios.api.run_program`` as it is, on the real and on the simulated network.

The apps serve the same routes on both frameworks; every body is
``bench.peers.http.pattern`` (byte i is ``i % 251``), so a peer checks it byte for byte:

- ``/bytes/N``: one response of N bytes (Content-Length);
- ``/stream/N``: N bytes, chunked, ``chunk_bytes`` at a time;
- ``/sse``: server-sent events, one every ``interval_s``, ``sse_events`` of them
  (None: forever, until the server shuts down);
- ``/ws``: a WebSocket that sends ``messages`` binary messages of ``message_bytes``
  every ``interval_s`` (None: forever), then closes with 1000;
- ``/proxy/N`` (aiohttp, with ``upstream=True``): a streaming proxy of ``/stream/N``
  served by the same app on a listening socket of its own, fetched with aiohttp's
  client. aiohttp's client opens its own sockets, so this route needs the real network.

``websockets_serve(job)`` runs websockets' asyncio server the same way and sends the
``/ws`` messages to every peer (it is a WebSocket server only).

``aiohttp_serve(job)``, ``uvicorn_serve(job)`` and ``websockets_serve(job)`` serve every listening peer of the
job, until every connection closed, ``until_requests`` requests were handled (then
``settle_s`` more) or ``serve_s`` passed; then they shut the server down and time it.
They return ``shutdown_s`` (None when it did not finish within ``shutdown_bound_s``),
``requests_count`` and ``shutdown_started_at`` (the program's clock, comparable with
the peers' ``*_at`` on either network). docs/scenarios.md shows how to use them from
a scenario of your own.

The entries here: aiohttp 1221 (an idle keep-alive connection holds shutdown for the
whole timeout) and uvicorn 451 (graceful shutdown waits forever for a streaming
response; WebSocket clients are closed with 1012).
"""
from __future__ import annotations

import asyncio
import importlib.util

from bench import peers
from bench.peers import http as httppeers
from bench.scenarios.api import Metric, run_program
from bench.zoo.harness import _listen, _now, _presets, _stream
from bench.zoo import releases
from bench.zoo.registry import Entry, _add
from protocols import ports

__all__ = ["aiohttp_serve", "uvicorn_serve", "websockets_serve", "starlette_stream_serve", "framework_reason", "DEFAULTS"]

DEFAULTS = {"chunk_bytes": 16 * 1024, "interval_s": 0.02, "sse_events": None, "messages": None,
            "message_bytes": 1024, "serve_s": 5.0, "until_requests": None, "settle_s": 0.1,
            "shutdown_timeout_s": 1.0, "shutdown_bound_s": 3.0, "shutdown": "graceful",
            "sockbuf": None, "writer_limit_bytes": 2 ** 18, "bursts": 30, "burst_messages": 12,
            "held_s": 0.005}
_INSTALL = "pip install 'looplab[frameworks]'"


def framework_reason(runtime, module: str) -> str | None:
    """Why a framework program cannot run on ``runtime`` (None: it can): the framework
    is not installed, or the runtime's port is not an asyncio event loop."""
    if importlib.util.find_spec(module) is None:
        return f"{module} is not installed ({_INSTALL})"
    if not runtime.info.port.startswith("protocols.asyncio_ports:"):
        return (f"{module} runs on an asyncio event loop and {runtime.id}'s port is not one "
                "(use asyncio-streams with any loop=, or uvloop-streams)")
    return None


def _params(job) -> dict:
    return {**DEFAULTS, **job.params}


async def _connect(addr, sockbuf):
    """A socket connected to a listening peer, from the ambient IO (real or simulated)."""
    loop = asyncio.get_running_loop()
    sock = ports.client_socket(sockbuf)
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, tuple(addr))
    except BaseException:
        sock.close()
        raise
    return sock


async def _uvicorn_on_peers(app, job, p, out, **options):
    """uvicorn's ``Server`` for ``app``, started programmatically in the running loop
    (no signal handlers, no listening socket), with ``job``'s peer connections handed
    to its HTTP protocol. (server, its open connections), or None when the hand-over
    failed (the server is already shut down)."""
    import uvicorn
    config = uvicorn.Config(app, lifespan="off", log_config=None, log_level="critical",
                            access_log=False, http="h11", **options)
    config.load()
    server = uvicorn.Server(config)
    server.lifespan = config.lifespan_class(config)
    await server.startup(sockets=[])

    def protocol():
        return config.http_protocol_class(config=config, server_state=server.server_state,
                                          app_state=server.lifespan.state)
    if not await _hand_over(job, p, protocol, out):
        await server.shutdown()
        return None
    return server, server.server_state.connections


async def _hand_over(job, p, factory, out) -> bool:
    """Connect to every listening peer and give each socket to ``factory`` as an
    accepted connection. False (with ``out["unsupported"]``, every socket closed so the
    peers end at once) when the loop has no ``connect_accepted_socket``."""
    loop = asyncio.get_running_loop()
    socks = [await _connect(job.peers[name], p["sockbuf"]) for name in sorted(job.peers)]
    for i, sock in enumerate(socks):
        try:
            await loop.connect_accepted_socket(factory, sock=sock)
        except NotImplementedError:
            for s in socks[i:]:
                s.close()
            out["unsupported"] = (f"the loop {type(loop).__module__}.{type(loop).__name__} does "
                                  "not implement connect_accepted_socket(), which hands a peer's "
                                  "socket to the framework")
            return False
    return True


async def _serve_until(port, p, st, open_count):
    """Serve until every connection closed, the requests asked for were handled (and
    ``settle_s`` passed), or ``serve_s``."""
    t0 = _now()
    while _now() - t0 < p["serve_s"]:
        if open_count() == 0:
            return "closed"
        if p["until_requests"] is not None and st["requests"] >= p["until_requests"]:
            await port.sleep(p["settle_s"])
            return "requests"
        await port.sleep(0.01)
    return "serve_s"


async def _timed(coro, bound_s, on_overrun):
    """Run a shutdown; its duration in seconds, or None when it overran ``bound_s``
    (then ``on_overrun()`` forces it and it is awaited to its end)."""
    t0 = _now()
    task = asyncio.ensure_future(coro)
    done, _ = await asyncio.wait({task}, timeout=bound_s)
    if task in done:
        task.result()
        return _now() - t0
    on_overrun()
    try:
        await asyncio.wait_for(task, 5.0)
    except (asyncio.TimeoutError, asyncio.CancelledError):
        pass
    return None


async def _events(p, i=0):
    while p["sse_events"] is None or i < p["sse_events"]:
        yield f"data: {i}\n\n".encode()
        i += 1
        await asyncio.sleep(p["interval_s"])


def _chunks(p, n):
    step = p["chunk_bytes"]
    return [httppeers.pattern(min(step, n - at), at) for at in range(0, n, step)]


# ---------------------------------------------------------------------------
# aiohttp

def _aiohttp_app(web, p, st):
    async def count(request, handler):
        st["requests"] += 1
        return await handler(request)

    async def nbytes(request):
        return web.Response(body=httppeers.pattern(int(request.match_info["n"])))

    async def stream(request):
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for chunk in _chunks(p, int(request.match_info["n"])):
            await resp.write(chunk)             # drains: aiohttp's backpressure
        await resp.write_eof()
        return resp

    async def sse(request):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        async for event in _events(p):
            await resp.write(event)
        await resp.write_eof()
        return resp

    async def ws(request):
        sock = web.WebSocketResponse()
        await sock.prepare(request)
        i, t = 0, request.transport
        while p["messages"] is None or i < p["messages"]:
            await sock.send_bytes(httppeers.pattern(p["message_bytes"]))
            st["ws_sent"] = st.get("ws_sent", 0) + 1
            if t is not None:      # how much aiohttp let pile up in front of the socket
                st["ws_backlog_peak"] = max(st.get("ws_backlog_peak", 0),
                                            t.get_write_buffer_size())
            i += 1
            await asyncio.sleep(p["interval_s"])
        await sock.close(code=1000)
        return sock

    async def proxy(request):
        # A streaming proxy: the upstream is this same app on its own listening
        # socket (``upstream``, set by aiohttp_serve); each chunk is written on
        # (resp.write drains) before the next one is read from upstream.
        from aiohttp import ClientSession
        url = f"http://{st['upstream'][0]}:{st['upstream'][1]}/stream/{request.match_info['n']}"
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        async with ClientSession() as session, session.get(url) as up:
            async for chunk in up.content.iter_chunked(p["chunk_bytes"]):
                await resp.write(chunk)
                st["proxied_bytes"] = st.get("proxied_bytes", 0) + len(chunk)
        await resp.write_eof()
        return resp

    async def bursts(request):
        # Home Assistant 89905's shape: bursts of messages to a client that keeps up on
        # average, through aiohttp's websocket writer with ``writer_limit_bytes``.
        sock = web.WebSocketResponse(writer_limit=p["writer_limit_bytes"])
        await sock.prepare(request)
        msg = httppeers.pattern(p["message_bytes"])
        held, worst = 0, 0.0   # held_s: a burst that never waits takes well under a ms
        for _ in range(p["bursts"]):
            t0 = _now()
            for _ in range(p["burst_messages"]):
                await sock.send_bytes(msg)
            took = _now() - t0
            worst = max(worst, took)
            held += took > p["held_s"]        # a send waited for the writer to drain
            await asyncio.sleep(p["interval_s"])
        st.update(bursts_held=held, bursts_done=p["bursts"], worst_burst_s=worst)
        await sock.close(code=1000)
        return sock

    app = web.Application(middlewares=[web.middleware(count)])
    app.router.add_get("/bursts", bursts)
    app.router.add_get("/proxy/{n}", proxy)
    app.router.add_get("/bytes/{n}", nbytes)
    app.router.add_get("/stream/{n}", stream)
    app.router.add_get("/sse", sse)
    app.router.add_get("/ws", ws)
    return app


def aiohttp_serve(job) -> dict:
    """aiohttp's web server on every listening peer of ``job`` (see the module
    docstring). ``shutdown``: "graceful" is ``AppRunner.cleanup()`` (the release's own
    path: idle keep-alive connections closed first, then handlers given
    ``shutdown_timeout_s``); "no_idle_close" is the shutdown before aiohttp 1.1 (PR
    1222): every connection's handler awaited up to ``shutdown_timeout_s``, idle ones
    included."""
    p = _params(job)

    async def main(port, out):
        from aiohttp import web
        st = {"requests": 0}
        runner = web.AppRunner(_aiohttp_app(web, p, st), handle_signals=False, access_log=None,
                               shutdown_timeout=p["shutdown_timeout_s"])
        await runner.setup()
        server = runner.server
        if p.get("upstream"):      # /proxy/N: the upstream is this app on a socket of its own
            up = _listen()
            st["upstream"] = up.getsockname()[:2]
            await web.SockSite(runner, up).start()
        if not await _hand_over(job, p, server, out):
            await runner.cleanup()
            return
        out["served_until"] = await _serve_until(port, p, st, lambda: len(server.connections))
        out["requests_count"] = st["requests"]
        out["proxied_bytes"] = st.get("proxied_bytes", 0)
        out["ws_sent_count"] = st.get("ws_sent", 0)
        if "bursts_done" in st:
            out.update(held_back_fraction=st["bursts_held"] / st["bursts_done"],
                       worst_burst_s=st["worst_burst_s"], bursts_count=st["bursts_done"])
        out["ws_backlog_peak_bytes"] = st.get("ws_backlog_peak", 0)
        out["open_at_shutdown_count"] = len(server.connections)
        out["shutdown_started_at"] = _now()

        async def shutdown():
            if p["shutdown"] == "no_idle_close":
                await server.shutdown(p["shutdown_timeout_s"])
            await runner.cleanup()

        def force():
            for conn in server.connections:
                conn.force_close()
        out["shutdown_s"] = await _timed(shutdown(), p["shutdown_bound_s"], force)
    return _stream(job, main, p["serve_s"] + p["shutdown_bound_s"] + 8)


# ---------------------------------------------------------------------------
# uvicorn with a starlette app

def _starlette_app(p, st):
    from starlette.applications import Starlette
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route, WebSocketRoute

    async def nbytes(request):
        st["requests"] += 1
        return Response(httppeers.pattern(int(request.path_params["n"])))

    async def stream(request):
        st["requests"] += 1

        async def body():
            for chunk in _chunks(p, int(request.path_params["n"])):
                yield chunk
        return StreamingResponse(body())

    async def sse(request):
        st["requests"] += 1
        return StreamingResponse(_events(p), media_type="text/event-stream")

    async def ws(sock):
        st["requests"] += 1
        await sock.accept()
        i = 0
        try:
            while p["messages"] is None or i < p["messages"]:
                await sock.send_bytes(httppeers.pattern(p["message_bytes"]))
                i += 1
                await asyncio.sleep(p["interval_s"])
            await sock.close(code=1000)
        except Exception as exc:   # noqa: BLE001 -- a closed socket ends the handler, any class
            st["ws_ended_by"] = type(exc).__name__

    return Starlette(routes=[Route("/bytes/{n:int}", nbytes), Route("/stream/{n:int}", stream),
                             Route("/sse", sse), WebSocketRoute("/ws", ws)])


def uvicorn_serve(job) -> dict:
    """uvicorn's ``Server`` with a starlette app on every listening peer of ``job``,
    started and shut down programmatically in the port's loop (no signal handlers):
    ``startup(sockets=[])``, the peers' connections given to uvicorn's protocol, then
    ``shutdown()`` -- uvicorn's graceful shutdown, with ``timeout_graceful_shutdown`` =
    ``shutdown_timeout_s`` (None: wait for every connection, uvicorn's default)."""
    p = _params(job)

    async def main(port, out):
        st = {"requests": 0}
        got = await _uvicorn_on_peers(_starlette_app(p, st), job, p, out,
                                      timeout_graceful_shutdown=p["shutdown_timeout_s"])
        if got is None:
            return
        server, conns = got
        out["served_until"] = await _serve_until(port, p, st, lambda: len(conns))
        out["requests_count"] = st["requests"]
        out["open_at_shutdown_count"] = len(conns)
        out["tasks_at_shutdown_count"] = len(server.server_state.tasks)   # handlers still running
        out["shutdown_started_at"] = _now()
        server.should_exit = True

        def force():   # what a second Ctrl-C does, then what the process exit does
            server.force_exit = True
            for t in list(server.server_state.tasks):
                t.cancel()
            for c in list(conns):
                c.transport.close()
        out["shutdown_s"] = await _timed(server.shutdown(), p["shutdown_bound_s"], force)
        if st.get("ws_ended_by"):
            out["ws_ended_by"] = st["ws_ended_by"]
    return _stream(job, main, p["serve_s"] + p["shutdown_bound_s"] + 8)


def _lead_app(app, p, st):
    """An ASGI wrapper at the server's edge: counts the body bytes the app handed to
    uvicorn; the producer (``/produce/N``) counts what it made. Their difference is
    what sits between them (a middleware's queue)."""
    async def edge(scope, receive, send):
        async def counted(message):
            if message.get("type") == "http.response.body":
                st["handed"] += len(message.get("body", b""))
            await send(message)
        await app(scope, receive, counted)
    return edge


def starlette_stream_serve(job) -> dict:
    """uvicorn + starlette serving ``/produce/N``: a StreamingResponse whose generator
    makes ``chunk_bytes`` chunks, one every ``interval_s`` -- through a pass-through
    ``BaseHTTPMiddleware`` when ``middleware`` is true (starlette 1012's shape), else
    straight. Returns ``app_queue_peak_bytes``: the most the producer was ever ahead of
    what reached uvicorn (measured at every chunk)."""
    p = _params(job)

    async def main(port, out):
        from starlette.applications import Starlette
        from starlette.middleware.base import BaseHTTPMiddleware
        from starlette.responses import StreamingResponse
        from starlette.routing import Route
        st = {"requests": 0, "produced": 0, "handed": 0, "peak": 0}

        async def produce(request):
            st["requests"] += 1
            n = int(request.path_params["n"])

            async def body():
                for chunk in _chunks(p, n):
                    st["peak"] = max(st["peak"], st["produced"] - st["handed"])
                    st["produced"] += len(chunk)
                    yield chunk
                    await asyncio.sleep(p["interval_s"])
            return StreamingResponse(body())

        async def passthrough(request, call_next):
            return await call_next(request)

        app = Starlette(routes=[Route("/produce/{n:int}", produce)])
        if p.get("middleware"):
            app.add_middleware(BaseHTTPMiddleware, dispatch=passthrough)
        got = await _uvicorn_on_peers(_lead_app(app, p, st), job, p, out)
        if got is None:
            return
        server, conns = got
        out["served_until"] = await _serve_until(port, p, st, lambda: len(conns))
        st["peak"] = max(st["peak"], st["produced"] - st["handed"])
        out.update(requests_count=st["requests"], produced_bytes=st["produced"],
                   app_queue_peak_bytes=st["peak"])
        server.should_exit = True
        out["shutdown_s"] = await _timed(server.shutdown(), p["shutdown_bound_s"],
                                         lambda: setattr(server, "force_exit", True))
    return _stream(job, main, p["serve_s"] + p["shutdown_bound_s"] + 8)


def ha_89905_program(job):
    """Home Assistant 89905 on the real aiohttp where it can run (else None): bursts
    through aiohttp's websocket writer with the strict limit HA had (naive) or the
    1 MiB HA raised it to after authentication (fixed)."""
    if framework_reason(job.runtime, "aiohttp") is not None:
        return None
    p = job.params
    job.params = {**p, "writer_limit_bytes": p["strict_high"] if job.variant == "naive"
                  else p["ha_limit_bytes"], "serve_s": float(p["max_s"]), "sockbuf": p["sockbuf"]}
    return aiohttp_serve(job)


def run_ha_89905(ctx):
    """The parent side of ``ha_89905_program``: a subscriber reading at ``reader_Bps``.
    A burst was held back when its sends took longer than ``held_s`` (a send waited
    for the writer's drain); measured, not implied by the limit."""
    p = ctx.params
    ran = run_program(ctx, max_s=p["max_s"] + 6, peers=[peers.role(
        "ws_subscriber", "client", path="/bursts", rate_Bps=float(p["reader_Bps"]),
        recv_bytes=p["sockbuf"], sockbuf=p["sockbuf"], max_s=p["max_s"] + 2)])
    metrics = ("held_back_fraction", "worst_drain_s")
    if _unsupported(ran, metrics):
        return _unsupported(ran, metrics)
    f, c = ran.app.get("held_back_fraction"), ran.peers["client"]
    m = {"held_back_fraction": f, "worst_drain_s": ran.app.get("worst_burst_s"),
         "bursts_count": ran.app.get("bursts_count")}
    notes = _notes(ran.app) + [f"real: {_versions('aiohttp')}, writer_limit "
                               f"{p['strict_high'] if ctx.variant == 'naive' else p['ha_limit_bytes']} B"]
    want = p["bursts"] * p["burst_messages"]
    if f is None or c.get("messages_count") != want or c.get("mismatch_bytes"):
        return m, {"bug_shown": None}, notes + [
            f"not measured: the client got {c.get('messages_count')} of {want} messages"]
    return m, {"bug_shown": f > 0.25}, notes


def _versions(*dists) -> str:
    import importlib.metadata as md
    return ", ".join(f"{d} {md.version(d)}" for d in dists)


# ---------------------------------------------------------------------------
# websockets

def websockets_serve(job) -> dict:
    """websockets' asyncio server (``websockets.asyncio.server``) on every listening
    peer of ``job``: each peer gets ``messages`` binary messages of ``message_bytes``,
    one every ``interval_s`` (None: until shutdown), through ``send()`` -- which waits
    while the connection's write buffer is above ``write_limit_bytes`` -- then a close
    with 1000. Shutdown is ``Server.close()`` (1001 to open connections) and
    ``wait_closed()``.

    The server is started with ``serve()`` on a listening socket of its own (its
    ``asyncio.Server``, closed on shutdown; nobody connects to it); each peer's
    connected socket is given a ``ServerConnection`` built the way ``serve()`` builds
    one (a sans-I/O ``ServerProtocol`` plus the server it belongs to), so the handshake,
    the handler task and the close run in the server's own code."""
    p = _params(job)

    async def main(port, out):
        from websockets.asyncio.server import ServerConnection, serve
        from websockets.server import ServerProtocol
        st = {"requests": 0, "sent": 0, "send_wait_s": 0.0}

        async def handler(conn):
            st["requests"] += 1
            i = 0
            msg = httppeers.pattern(p["message_bytes"])
            while p["messages"] is None or i < p["messages"]:
                t0 = _now()
                await conn.send(msg)
                st["send_wait_s"] = max(st["send_wait_s"], _now() - t0)
                st["sent"] += 1
                i += 1
                await asyncio.sleep(p["interval_s"])
            await conn.close(1000)

        limit = p.get("write_limit_bytes") or 2 ** 15
        srv = await serve(handler, sock=_listen(), ping_interval=None, write_limit=limit)

        def connection():
            return ServerConnection(ServerProtocol(max_size=None), srv, ping_interval=None,
                                    write_limit=limit)
        if not await _hand_over(job, p, connection, out):
            srv.close()
            await srv.wait_closed()
            return
        out["served_until"] = await _serve_until(port, p, st, lambda: len(srv.handler_tasks))
        out.update(requests_count=st["requests"], sent_messages_count=st["sent"],
                   worst_send_wait_s=st["send_wait_s"],
                   open_at_shutdown_count=len(srv.handler_tasks), shutdown_started_at=_now())

        async def shutdown():
            srv.close()
            await srv.wait_closed()

        def force():
            for t in list(srv.handler_tasks):
                t.cancel()
        out["shutdown_s"] = await _timed(shutdown(), p["shutdown_bound_s"], force)
    return _stream(job, main, p["serve_s"] + p["shutdown_bound_s"] + 8)


# ---------------------------------------------------------------------------
# Entries

def _not_measured(ctx, module, metrics):
    why = framework_reason(ctx.runtime, module)
    if why is None:
        return None
    return {m: None for m in metrics}, {"bug_shown": None}, [f"not measured: {why}"]


def _notes(app):
    return [f"program: {app['error']}"] if app.get("error") else []


def _unsupported(ran, metrics):
    """The not-measured result of a run whose loop could not host the framework."""
    if not ran.app.get("unsupported"):
        return None
    return ({m: None for m in metrics}, {"bug_shown": None},
            [f"not measured: {ran.app['unsupported']}"])


_KEEPALIVE_METRICS = ("shutdown_s", "responses_count", "idle_eof_after_s")


def _keepalive_program(job):
    shutdown = "no_idle_close" if job.variant == "naive" else "graceful"
    job.params = {**job.params, "shutdown": shutdown}
    return aiohttp_serve(job)


def _run_keepalive(ctx):
    skipped = _not_measured(ctx, "aiohttp", _KEEPALIVE_METRICS)
    if skipped:
        return skipped
    p = {**DEFAULTS, **ctx.params}
    bound = p["serve_s"] + p["shutdown_bound_s"] + 4
    ran = run_program(ctx, max_s=bound + 4, peers=[httppeers_role(
        "http_client", "browser", path=f"/bytes/{p['body_bytes']}", count=p["until_requests"],
        finish="idle", max_s=bound)])
    if _unsupported(ran, _KEEPALIVE_METRICS):
        return _unsupported(ran, _KEEPALIVE_METRICS)
    c = ran.peers["browser"]
    s, n = ran.app.get("shutdown_s"), c.get("responses_count") or 0
    m = {"shutdown_s": s, "responses_count": n, "idle_eof_after_s": c.get("idle_eof_after_s")}
    notes = _notes(ran.app)
    if c.get("mismatch_bytes"):
        notes.append(f"the client saw {c['mismatch_bytes']} wrong body bytes")
    if n < p["until_requests"] or ran.app.get("error"):
        return m, {"bug_shown": None}, notes + ["not measured: the keep-alive connection "
                                                "did not carry every request"]
    # Stalled: shutdown took most of its timeout (or overran) although the only
    # connection was idle; the fixed path closes it at once.
    stalled = s is None or s >= 0.8 * p["shutdown_timeout_s"]
    return m, {"bug_shown": stalled}, notes


def httppeers_role(kind, name, **fields):
    """A role of ``bench.peers.http`` as a spec dict (the module registers them)."""
    return peers.role(kind, name, **fields)


_add(Entry(
    id="aiohttp-1221", aliases=("aiohttp-1222",),
    stand_in="the naive shutdown is aiohttp 1.0's order (handlers awaited before idle "
             "keep-alive connections are closed), run on the installed aiohttp's server; "
             "the fixed program is the installed aiohttp's own AppRunner.cleanup()",
    title="an idle keep-alive connection holds the server's shutdown for the whole timeout",
    link="https://github.com/aio-libs/aiohttp/issues/1221",
    mechanism="On shutdown aiohttp waited for every connection's handler to finish, up to "
              "the shutdown timeout (60 s in run_app), and a keep-alive connection with no "
              "request in flight has a handler parked waiting for the next request. So one "
              "idle browser connection kept the process alive for the whole timeout (the "
              "thread: 'Keep-alive connections prevent server from shutdown').",
    reported="aiohttp 1.0.2 on Python 3.5 (2016-09-28)",
    fixed_in="aiohttp 1.1.0 (2016-11-03, PR 1222: 'Close idle keep-alive connections on "
             "shutdown'); since 3.9.0 Server.pre_shutdown() closes them before the graceful "
             "period of BaseRunner(shutdown_timeout=)",
    framing="real HTTP/1.1 on aiohttp's own server: two keep-alive GETs, then the client "
            "stays connected and idle; the timeout is scaled from 60 s to 1 s",
    expected="shown with the naive shutdown on asyncio-streams with any loop and on "
             "uvloop-streams; not with the installed aiohttp's cleanup(); not measured on "
             "runtimes without an asyncio loop or without aiohttp",
    oracle="bug shown when shutting down took at least 0.8 x shutdown_timeout_s (or did "
           "not finish) while the only connection was idle; not measured unless the "
           "client's keep-alive connection carried every request",
    styles=("stream",),
    affected_versions=("aiohttp==1.0.5",), fixed_versions=("aiohttp==1.1.0",),
    version_python="3.6", program_file="aiohttp1.py", version_run=releases.keepalive_run,
    version_runtimes=("asyncio-streams",), version_variants=("naive",),
    version_with={"aiohttp==1.0.5": ("async-timeout==1.1.0", "chardet==2.3.0", "multidict==2.1.4"),
                  "aiohttp==1.1.0": ("async-timeout==1.1.0", "chardet==2.3.0", "multidict==2.1.4",
                                     "yarl==0.8.1")},
    show_on=("asyncio-streams",),
    minimum=(("responses_count", 2, "both keep-alive requests answered"),),
    verified="read the thread (tahajahangir: ^C waits 60 s with a browser's keep-alive "
             "connection open; idle connections should be closed at once), the 1.1.0 "
             "changelog line for PR 1222, and the installed aiohttp 3.14's "
             "BaseRunner.cleanup (pre_shutdown closes idle connections) and "
             "RequestHandler.shutdown (awaits the parked handler up to the timeout), and "
             "ServerHttpProtocol.shutdown in 1.0.5 and 1.1.0 (1.1 cancels an idle keep-alive "
             "handler); measured with looplab repro aiohttp-1221 --versions (the real releases "
             "on Python 3.6.15, run_app's shutdown order, timeout 1 s): 1.0.5 took 1.00 s, "
             "1.1.0 took 0.7 ms. Neither runs on Python 3.11, so the default cells play 1.0's "
             "order on the installed release"),
    _run_keepalive,
    [Metric("shutdown_s", "lower", "shutdown took", timing=True),
     Metric("responses_count", None, "responses"),
     Metric("idle_eof_after_s", None, "idle connection closed after", timing=True)],
    _presets({"until_requests": 2, "body_bytes": 4096, "shutdown_timeout_s": 1.0,
              "shutdown_bound_s": 3.0, "serve_s": 4.0, "settle_s": 0.1}),
    {"stream": _keepalive_program})


_GRACE_METRICS = ("shutdown_s", "sse_events_count", "sse_closed_after_shutdown_s",
                  "ws_close_code", "ws_messages_count")


def _grace_program(job):
    if job.variant == "naive":
        job.params = {**job.params, "shutdown_timeout_s": None}
    return uvicorn_serve(job)


def _run_grace(ctx):
    skipped = _not_measured(ctx, "uvicorn", _GRACE_METRICS) or \
        _not_measured(ctx, "starlette", _GRACE_METRICS)
    if skipped:
        return skipped
    p = {**DEFAULTS, **ctx.params}
    bound = p["serve_s"] + p["shutdown_bound_s"] + 4
    ran = run_program(ctx, max_s=bound + 4, peers=[
        httppeers_role("http_client", "sse", path="/sse", max_s=bound),
        httppeers_role("ws_subscriber", "ws", path="/ws", max_s=bound)])
    if _unsupported(ran, _GRACE_METRICS):
        return _unsupported(ran, _GRACE_METRICS)
    sse, ws = ran.peers["sse"], ran.peers["ws"]
    started = ran.app.get("shutdown_started_at")
    s = ran.app.get("shutdown_s")
    closed_after = (sse["eof_at"] - started) if sse.get("eof_at") and started else None
    m = {"shutdown_s": s, "sse_events_count": sse.get("sse_events_count"),
         "sse_closed_after_shutdown_s": closed_after, "ws_close_code": None if ws.get("close_code") is None else str(ws["close_code"]),
         "ws_messages_count": ws.get("messages_count")}
    notes = _notes(ran.app)
    if not sse.get("sse_events_count") or ran.app.get("error"):
        return m, {"bug_shown": None}, notes + ["not measured: the SSE stream carried no event "
                                                "before the shutdown"]
    return m, {"bug_shown": s is None}, notes


_add(Entry(
    id="uvicorn-451", aliases=("uvicorn-1950", "uvicorn-2829"),
    title="graceful shutdown waits forever for a streaming (SSE) response",
    link="https://github.com/Kludex/uvicorn/issues/451",
    mechanism="On the first Ctrl-C uvicorn stops accepting, asks every connection to shut "
              "down and waits until they have all closed. A WebSocket is closed with 1012, "
              "but a streaming response that never ends (server-sent events) is only marked "
              "not keep-alive, so the wait never ends and the lifespan shutdown never runs "
              "(the thread: 'How do I cancel a streaming response on shutdown?').",
    reported="uvicorn 0.9 (2019-10); the same wait in every release since, by design",
    fixed_in="by configuration: uvicorn 0.24.0 (PR 1950, 2023) added "
             "--timeout-graceful-shutdown, after which the remaining tasks are cancelled; "
             "0.43.0 sent http.disconnect to streaming responses on shutdown (PR 2829) and "
             "0.45.0 reverted it (PR 2913: a second signal force-quits, as process managers "
             "send), so 0.43.0-0.44.0 are the only releases without the wait",
    framing="real HTTP/1.1 and WebSocket on uvicorn's h11 protocol and a starlette app; an "
            "SSE client and a WebSocket subscriber are connected when shutdown() starts",
    expected="shown with the default timeout_graceful_shutdown=None on asyncio-streams with "
             "any loop and on uvloop-streams (the installed uvicorn 0.54); not with a "
             "graceful-shutdown timeout; the WebSocket client gets close code 1012 either way",
    oracle="bug shown when shutdown() had not finished shutdown_bound_s after it started "
           "while an SSE client was connected; not measured unless that client had received "
           "an event",
    styles=("stream",),
    affected_versions=("uvicorn==0.42.0", "uvicorn==0.54.0"),
    fixed_versions=("uvicorn==0.44.0",),
    # uvicorn is the framework the program runs on asyncio's streams: pinned there
    version_runtimes=("asyncio-streams",), version_with=("starlette==1.10.0",),
    show_on=("asyncio-streams",),
    minimum=(("sse_events_count", 1, "one SSE event before the shutdown"),),
    verified="read the thread (rob-blackbourn: the first ^C does not stop an SSE response, "
             "the lifespan shutdown is skipped), PR 1140 (WebSockets get 1012 on shutdown), "
             "PR 1950 (timeout_graceful_shutdown), PR 2829 and its revert PR 2913 with the "
             "maintainer's reason, and Server.shutdown() in the installed 0.54.0; ran this "
             "entry's tiny cells on asyncio-streams at uvicorn 0.42.0, 0.44.0, 0.45.0 and "
             "0.54.0 (Python 3.11.7, starlette 1.10.0): naive shown on 0.42.0, 0.45.0 and "
             "0.54.0, not shown on 0.44.0 (the SSE stream closed 0.6 ms into the shutdown); "
             "fixed not shown on all four"),
    _run_grace,
    [Metric("shutdown_s", "lower", "shutdown took", timing=True),
     Metric("sse_events_count", None, "SSE events"),
     Metric("sse_closed_after_shutdown_s", None, "SSE closed after shutdown began",
            timing=True),
     Metric("ws_close_code", None, "WebSocket close code", unit="text"),
     Metric("ws_messages_count", None, "WebSocket messages")],
    _presets({"shutdown_timeout_s": 0.5, "shutdown_bound_s": 2.0, "serve_s": 0.3,
              "interval_s": 0.02, "until_requests": None}),
    {"stream": _grace_program})
