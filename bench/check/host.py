"""An in-process app on an asyncio loop: started, sampled and shut down the way it is
deployed, on real sockets (in ``bench.check.appside``'s process) or on the simulated
network (in the verb's process, on the world's seam).

- ``make_loop(choice, io)``: the loop (``asyncio``, ``uvloop``, ``rloop``, looplab's with
  its knobs, ``MODULE:FACTORY``); with a simulated world's ``io``, asyncio's selector
  loop over the world or looplab's loop on its seam;
- ``Hosted``: the app served on a listening socket. aiohttp through ``AppRunner`` and
  ``SockSite`` (its shutdown: ``runner.cleanup()``, which stops accepting, closes idle
  connections and waits up to ``shutdown_timeout`` for handlers); an ASGI app through
  uvicorn's ``Server`` (``startup(sockets=...)``, then ``shutdown(sockets=...)``:
  uvicorn's graceful shutdown, with ``timeout_graceful_shutdown``); an asyncio server
  from a factory (``bench.check.target`` says what a factory may return and how it is
  stopped). After the stop, ``finish_loop`` does what ``asyncio.run`` does when its
  coroutine returns: remaining tasks cancelled, async generators closed, the loop
  closed -- so bytes a server left in a transport's buffer are lost, as in production;
- ``Sampler``: what the app holds in memory that a loop can see: every transport's
  write-buffer size (``loop._transports`` on asyncio's and looplab's loops, a scan of
  the heap on others), the items and bytes in ``asyncio.Queue`` objects, and, on the
  simulated network, the Python heap's size (``tracemalloc``), which stands in for
  RSS there (one process holds the world, its peers and the app).
"""
from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import time
import tracemalloc

from bench.check import target as tg
from bench.errors import UsageError

__all__ = ["make_loop", "finish_loop", "Hosted", "Sampler", "framework_missing"]


def framework_missing(kind: str) -> str | None:
    """Why an app of ``kind`` cannot be served here (None: it can)."""
    import importlib.util
    need = {"aiohttp": ("aiohttp",), "asgi": ("uvicorn",)}.get(kind, ())
    for module in need:
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install 'looplab[frameworks]')"
    return None


def make_loop(choice: tg.LoopChoice, io=None):
    """A new event loop of ``choice``; on a simulated world when ``io`` is its SimIO."""
    from protocols import asyncio_ports
    if io is not None:
        if choice.name == "looplab":
            import kernels.callback as cb
            return cb.new_event_loop(io=io, **choice.kwargs())
        if choice.name == "asyncio":
            from protocols import simports
            return simports.SimSelectorEventLoop(io)
        raise UsageError(f"--loop {choice.name} runs on real sockets only; on the simulated "
                         "network use asyncio or looplab")
    made = asyncio_ports.resolve_loop(choice.name)
    return made(**choice.kwargs())


def finish_loop(loop) -> None:
    """``asyncio.run``'s epilogue: cancel what still runs, close async generators and
    the loop. Whatever a transport still buffers is dropped with it."""
    try:
        tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for t in tasks:
            t.cancel()
        if tasks:
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        loop.close()


@contextlib.contextmanager
def aiohttp_knobs(values: dict):
    """Apply ``aiohttp.heartbeat``/``max_msg_size``/``writer_limit`` to every
    ``WebSocketResponse`` the app makes (its own arguments are overridden: the knob
    says what the run measures), for the block only."""
    ws_args = {k: v for k, v in values.items() if k in ("heartbeat", "max_msg_size", "writer_limit")}
    if not ws_args:
        yield
        return
    from aiohttp import web_ws
    cls = web_ws.WebSocketResponse
    original = cls.__init__

    def init(self, *args, **kwargs):
        kwargs.update(ws_args)
        original(self, *args, **kwargs)
    cls.__init__ = init
    try:
        yield
    finally:
        cls.__init__ = original


class Hosted:
    """One app served on one loop. ``start(listener)`` serves it; ``address`` is
    where it listens; ``stop()`` is the framework's own shutdown."""

    def __init__(self, app: tg.AppRef, knobs: dict, grace_s: float, io=None,
                 port: int = 0, sockbuf: int | None = 65536):
        self.app = app
        self.sockbuf = sockbuf
        self.knobs = dict(knobs)
        self.grace_s = grace_s
        self.io = io
        self.port = port
        self.kind = None
        self.address = None
        self._stop = None
        self.note = ""

    def _listener(self):
        from protocols import ports
        if self.io is not None:
            return ports.bind_listener("127.0.0.1", 8000, self.sockbuf, io=self.io)
        return ports.bind_listener("127.0.0.1", self.port, self.sockbuf)

    async def start(self) -> None:
        obj = tg.load_object(self.app.ref)
        kind = tg.kind_of(obj, self.app.asgi)
        app_args = {k[4:]: v for k, v in self.knobs.items() if k.startswith("app.")}
        if kind == "factory":
            obj = await self._call_factory(obj, app_args)
            if tg._is_aiohttp_app(obj):
                kind = "aiohttp"
            elif isinstance(obj, tuple) or hasattr(obj, "sockets") or hasattr(obj, "shutdown"):
                return self._server(obj)
            elif self.app.asgi or tg._asgi_shaped(obj):
                kind = "asgi"
            else:
                raise UsageError(f"{self.app.ref} returned {type(obj).__name__}: expected an "
                                 "aiohttp Application, an ASGI app or an asyncio server")
        elif app_args:
            raise UsageError(f"app.{next(iter(app_args))}: {self.app.ref} is not a factory")
        self.kind = kind
        if kind == "aiohttp":
            await self._aiohttp(obj)
        else:
            await self._uvicorn(obj)

    async def _call_factory(self, fn, app_args):
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            params = {}
        args = dict(app_args)
        if "host" in params:
            args["host"] = "127.0.0.1"
        if "port" in params:
            args["port"] = 8000 if self.io is not None else self.port
        made = fn(**args)
        if inspect.isawaitable(made):
            made = await made
        return made

    def _server(self, obj) -> None:
        self.kind = "server"
        if isinstance(obj, tuple):
            self.address = (str(obj[0]), int(obj[1]))
        else:
            socks = list(getattr(obj, "sockets", None) or ())
            if not socks:
                raise UsageError(f"{self.app.ref} returned a server that listens nowhere "
                                 "(no sockets)")
            self.address = tuple(socks[0].getsockname()[:2])
            if self.sockbuf:       # sockets accepted from now on inherit the listener's
                import socket
                for sock in socks:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.sockbuf)
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.sockbuf)
        own = getattr(obj, "shutdown", None)

        async def stop():
            if own is not None:
                made = own()
                if inspect.isawaitable(made):
                    await made
                return "the app's shutdown() returned"
            close = getattr(obj, "close", None)
            if close is not None:
                close()
            await asyncio.sleep(0)
            return "close() called; then the loop ended as asyncio.run ends it"
        self._stop = stop

    async def _aiohttp(self, application) -> None:
        from aiohttp import web
        ak = {k[8:]: v for k, v in self.knobs.items() if k.startswith("aiohttp.")}
        self._knob_ctx = aiohttp_knobs(ak)
        self._knob_ctx.__enter__()
        runner = web.AppRunner(application, handle_signals=False, access_log=None)
        await runner.setup()
        sock = self._listener()
        site = web.SockSite(runner, sock, shutdown_timeout=ak.get("shutdown_timeout", self.grace_s))
        await site.start()
        self.address = tuple(sock.getsockname()[:2])

        async def stop():
            try:
                await runner.cleanup()
            finally:
                self.release()
            return "AppRunner.cleanup() returned"
        self._stop = stop

    async def _uvicorn(self, asgi) -> None:
        import uvicorn
        uk = {k[8:]: v for k, v in self.knobs.items() if k.startswith("uvicorn.")}
        config = uvicorn.Config(asgi, lifespan="auto", log_config=None, log_level="error",
                                access_log=False, http="h11", **uk)
        config.load()
        server = uvicorn.Server(config)
        server.lifespan = config.lifespan_class(config)
        sock = self._listener()
        try:
            await server.startup(sockets=[sock])
        except SystemExit:
            sock.close()
            raise RuntimeError("the ASGI app's lifespan startup failed") from None
        self.address = tuple(sock.getsockname()[:2])

        async def stop():
            await server.shutdown(sockets=[sock])
            return "uvicorn's Server.shutdown() returned"
        self._stop = stop
        self._uvicorn_server = server

    async def stop(self) -> str:
        if self._stop is None:
            return "the app never started"
        return await self._stop()

    def release(self) -> None:
        """Undo what the run changed in this process (aiohttp's knob defaults)."""
        ctx, self._knob_ctx = getattr(self, "_knob_ctx", None), None
        if ctx is not None:
            ctx.__exit__(None, None, None)

    def force(self) -> None:
        """What a second Ctrl-C does to uvicorn (force_exit); nothing for the others."""
        server = getattr(self, "_uvicorn_server", None)
        if server is not None:
            server.force_exit = True


# ---------------------------------------------------------------------------
# What the app holds

def _transports(loop) -> list:
    held = getattr(loop, "_transports", None)
    if held is not None:
        try:
            return list(held.values()) if hasattr(held, "values") else list(held)
        except RuntimeError:       # changed while we looked: the next sample sees it
            return []
    return [o for o in gc.get_objects() if type(o).__name__.endswith("Transport")
            and hasattr(o, "get_write_buffer_size")]


class Sampler:
    """Reads the app's memory from inside its process (see the module docstring)."""

    def __init__(self, loop, heap: bool = False):
        self.loop = loop
        self.heap = heap
        if heap and not tracemalloc.is_tracing():
            tracemalloc.start()
            self._started = True
        else:
            self._started = False

    def close(self) -> None:
        if self._started:
            tracemalloc.stop()
            self._started = False

    def buffered(self) -> dict:
        sizes = []
        for t in _transports(self.loop):
            try:
                if not t.is_closing():
                    sizes.append(t.get_write_buffer_size())
            except Exception:     # noqa: BLE001 -- a transport torn down under us
                continue
        return {"transports_count": len(sizes), "buffered_bytes": sum(sizes),
                "largest_buffer_bytes": max(sizes, default=0)}

    def heap_bytes(self):
        return tracemalloc.get_traced_memory()[0] if self.heap and tracemalloc.is_tracing() else None

    @staticmethod
    def queues() -> dict:
        """Every ``asyncio.Queue`` alive: how many, their items, the bytes of the
        bytes-like items, and how many have no bound."""
        count = items = nbytes = unbounded = largest = 0
        for o in gc.get_objects():
            if isinstance(o, asyncio.Queue):
                n = o.qsize()
                count += 1
                items += n
                largest = max(largest, n)
                unbounded += o.maxsize <= 0
                for x in list(getattr(o, "_queue", ())):
                    if isinstance(x, (bytes, bytearray, memoryview, str)):
                        nbytes += len(x)
        return {"queues_count": count, "queued_items_count": items, "queued_bytes": nbytes,
                "unbounded_queues_count": unbounded, "largest_queue_count": largest}

    def sample(self) -> dict:
        out = {"t": self.loop.time() if self.heap else time.monotonic()}
        out.update(self.buffered())
        out["heap_bytes"] = self.heap_bytes()
        return out
