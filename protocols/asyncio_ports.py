"""The asyncio ports, on any asyncio loop: reference runtimes measured through public APIs only.

Which loop runs them is the ``loop`` option: a name in ``LOOPS`` (asyncio's selector
loop by default, uvloop, rloop, looplab's own) or ``MODULE:FACTORY``, anything
importable in the cell's interpreter that returns an asyncio event loop when called
with the ``loop.NAME=VALUE`` options as keyword arguments. ``eager=true`` installs
``asyncio.eager_task_factory`` (Python 3.12+). A loop that cannot carry the port
(it does not import, refuses the keywords, lacks a method the port calls) makes the
runtime unavailable with that reason, so its cells are skipped, never crashed.

A proxy transport (or stream writer) reads ``get_write_buffer_size()`` after every
write, so the user-space buffer peak is exact, not sampled. A tracking loop
subclass learns which transports still hold bytes when the loop closes (asyncio
forgets them; we count them as lost and release their sockets so nothing leaks).
What a public API can't show (a stream writer's pause_writing, the loop's
iteration count) is reported as ``None``. With ``instrument=false`` the proxies
are left out, for benchmarks.
"""
from __future__ import annotations

import functools
import importlib
import sys
import time
import weakref

from protocols import simports
from protocols.ports import (STREAM_NAMES, CallbackPortBase, StreamPortBase, client_socket,
                             main_until_signal)

__all__ = ["AsyncioCallbackPort", "UvloopCallbackPort", "AsyncioStreamPort", "UvloopStreamPort",
           "LOOPS", "LOOP_REQUIREMENTS", "UNOBTAINABLE", "resolve_loop", "loop_identity"]

#: ``loop=NAME`` -> what it imports (``MODULE:ATTR``, a loop class or a factory).
#: ``looplab`` is our callback kernel's asyncio loop, where that kernel provides one.
LOOPS = {
    "asyncio": "asyncio:SelectorEventLoop",
    "uvloop": "uvloop:Loop",
    "rloop": "rloop:new_event_loop",
    "looplab": "kernels.callback:new_event_loop",
}
#: ``loop=NAME`` -> the distribution that brings it, for an environment that must
#: install it; a loop not here comes with Python or looplab (or, a user's
#: ``MODULE:FACTORY``, must be importable in the environment already).
LOOP_REQUIREMENTS = {"uvloop": "uvloop>=0.17", "rloop": "rloop>=0.5"}
#: asyncio loops looplab knows of that it cannot get on every machine, and why.
UNOBTAINABLE = {
    "zuvloop": "needs Python >= 3.14 (no release for older interpreters)",
    "rsloop": "builds only with a nightly Rust toolchain (no wheels on the package registry)",
}
#: The loops that reach the simulated network, and how: asyncio's selector loop over
#: ``simports.SimSelectorEventLoop``, looplab's through its ``io=`` seam.
_SIM_LOOPS = {"asyncio": "selector", "looplab": "seam", LOOPS["looplab"]: "seam"}
#: What each port calls on its loop; a loop without one of them cannot carry the port.
_NEEDS = ("create_server", "create_connection", "sock_connect", "call_soon", "create_task")


def resolve_loop(name: str):
    """``loop=NAME`` -> the loop class or factory it names. Raises ImportError or
    AttributeError (with the reason) when it is not there."""
    target = LOOPS.get(name, name)
    module, _, attr = target.partition(":")
    if not attr:
        raise ImportError(f"loop {name!r} is neither a known loop ({', '.join(LOOPS)}) "
                          "nor MODULE:FACTORY")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise AttributeError(f"{module} has no {attr}") from None
    return obj


def loop_identity(name: str) -> dict:
    """{"name", "target", "version"} of a loop: the version of the distribution that
    holds it (Python's own for asyncio's loop), or None when none is recorded."""
    target = LOOPS.get(name, name)
    top = target.partition(":")[0].split(".")[0]
    version = None
    if top == "asyncio":
        version = sys.version.split()[0]
    else:
        from importlib import metadata
        try:
            dists = metadata.packages_distributions().get(top) or [top]
            version = metadata.version(dists[0])
        except Exception:
            version = getattr(sys.modules.get(top), "__version__", None)
    return {"name": name, "target": target, "version": version}


def _check_loop(name: str, kwargs: dict, eager: bool) -> str | None:
    """None if the loop ``name`` can carry an asyncio port here, else why not."""
    if eager and sys.version_info < (3, 12):
        return (f"eager=true needs Python 3.12+ (asyncio.eager_task_factory); this is "
                f"{sys.version.split()[0]}")
    if name == "asyncio" and not kwargs:
        # asyncio's own loop carries its ports by definition; making one to check would
        # open a real self-pipe, which a simulated cell must never do.
        return None
    key = (name, tuple(sorted(kwargs.items())))
    if key not in _LOOP_CHECKS:
        _LOOP_CHECKS[key] = _try_loop(name, kwargs)
    return _LOOP_CHECKS[key]


_LOOP_CHECKS: dict = {}


def _try_loop(name: str, kwargs: dict) -> str | None:
    try:
        factory = resolve_loop(name)
    except Exception as exc:
        return f"loop {name} is not importable here ({type(exc).__name__}: {exc})"
    try:
        loop = factory(**kwargs)
    except Exception as exc:
        return f"loop {name} cannot be made with {kwargs or 'no arguments'} ({type(exc).__name__}: {exc})"
    try:
        missing = [m for m in _NEEDS if not callable(getattr(loop, m, None))]
        if missing:
            return f"loop {name} cannot carry asyncio's ports: it has no {', '.join(missing)}"
    finally:
        loop.close()
    return None


class _MeasuredTransport:
    """Stands in for an asyncio transport: every write is counted and followed by a
    ``get_write_buffer_size()`` read, so the user-space buffer peak is exact."""
    __slots__ = ("_t", "stats", "_paused")

    def __init__(self, transport, stats):
        self._t = transport
        self.stats = stats
        self._paused = False

    def _account(self, n: int) -> None:
        s = self.stats
        if self._t.is_closing():
            s.writes_after_close_count += 1
        s.accepted_bytes += n
        if self._paused:
            s.written_while_paused_bytes += n
        size = self._t.get_write_buffer_size()
        s.user_buffer_bytes = size
        s.sent_bytes = s.accepted_bytes - size
        if size > s.peak_user_buffer_bytes:
            s.peak_user_buffer_bytes = size

    def write(self, data) -> None:
        self._t.write(data)
        self._account(len(data))

    def writelines(self, seq) -> None:
        seq = list(seq)
        self._t.writelines(seq)
        self._account(sum(len(d) for d in seq))

    def pause_reading(self) -> None:
        self.stats.read_pauses_count += 1
        self._t.pause_reading()

    def abort(self) -> None:
        s = self.stats
        s.lost_on_abort_bytes += self._t.get_write_buffer_size()
        s.user_buffer_bytes = 0
        self._t.abort()

    def __getattr__(self, name):
        return getattr(self._t, name)


class _MeasuredProtocol:
    """Wraps a driver's protocol for a reference loop: hands it a measured transport
    and counts pause_writing."""

    def __init__(self, inner, port):
        self.inner = inner
        self.port = port
        self.mt = None

    def connection_made(self, transport):
        self.mt = _MeasuredTransport(transport, self.port.stats.new_conn())
        self.port._transports[transport] = self.mt.stats
        self.inner.connection_made(self.mt)

    def data_received(self, data):
        self.mt.stats.received_bytes += len(data)
        self.inner.data_received(data)

    def eof_received(self):
        return self.inner.eof_received()

    def connection_lost(self, exc):
        self.mt.stats.closed = True
        self.inner.connection_lost(exc)

    def pause_writing(self):
        self.mt._paused = True
        self.mt.stats.pause_writing_count += 1
        self.inner.pause_writing()

    def resume_writing(self):
        self.mt._paused = False
        self.inner.resume_writing()


class _Tracked:
    """Uninstrumented mode: remember the transport, then get out of the way
    (``set_protocol`` makes the transport call the driver's protocol directly)."""
    __slots__ = ("inner", "port")

    def __init__(self, inner, port):
        self.inner = inner
        self.port = port

    def connection_made(self, transport):
        self.port._transports[transport] = None
        try:
            transport.set_protocol(self.inner)
        except NotImplementedError:
            pass        # rloop 0.5: its calls reach the driver's protocol through __getattr__
        self.inner.connection_made(transport)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _tracking_loop_factory(port, name: str, kwargs: dict, eager: bool):
    """A loop whose close() first settles the transports asyncio would forget:
    their buffered bytes are what a process exit loses (S3), and their sockets must
    not leak. Returns a zero-argument factory for asyncio.Runner. A loop class is
    subclassed; a factory's loop gets the wrapper on the instance. Opened on a
    simulated network, asyncio's loop is its selector loop over it
    (``protocols.simports.SimSelectorEventLoop``) and looplab's takes the world's
    ``SimIO`` as ``io=``, its kernel's I/O-and-time seam; other loops are refused
    there by ``real_network_only``."""
    import asyncio
    io = simports.sim_io() if name in _SIM_LOOPS else None
    made = resolve_loop(name)
    if io is not None and _SIM_LOOPS[name] == "seam":
        kwargs = {**kwargs, "io": io}
        io = None                       # passed as a keyword, not positionally
    elif io is not None:
        made = simports.SimSelectorEventLoop

    def settle_then(close):
        def closing(loop):
            if not loop.is_closed() and not loop.is_running():
                port._settle_transports(loop)
            close(loop)
        return closing

    if isinstance(made, type):
        cls = type("TrackingLoop", (made,), {"close": settle_then(made.close)})
        args = (io,) if io is not None else ()

        def make():
            port.made_loop = cls(*args, **kwargs)
            return port.made_loop
    else:
        def make():
            loop = made(**kwargs)
            loop.close = functools.partial(settle_then(type(loop).close), loop)
            port.made_loop = loop
            return loop

    if not eager:
        return make

    def make_eager():
        loop = make()
        loop.set_task_factory(asyncio.eager_task_factory)
        return loop
    return make_eager


class _Transports:
    """transport -> ConnStats | None, held weakly where the loop's transports allow it.
    rloop's (Rust) transports cannot be weakly referenced: those are held until the
    port closes, which a cell's bounded connection count makes harmless."""

    def __init__(self):
        self._weak = weakref.WeakKeyDictionary()
        self._strong: dict = {}

    def __setitem__(self, transport, stats):
        try:
            self._weak[transport] = stats
        except TypeError:
            self._strong[id(transport)] = (transport, stats)

    def items(self):
        return list(self._weak.items()) + list(self._strong.values())


class _AsyncioMixin:
    """Shared by the asyncio/uvloop ports: transport tracking and the exit account."""

    #: The loop this port runs on when its runtime has no ``loop`` option.
    fixed_loop = None
    #: The last loop the port's factory made (the stream port's Runner makes it).
    made_loop = None

    @classmethod
    def loop_of(cls, opts) -> str:
        """The loop a configuration runs on: a name in ``LOOPS`` or ``MODULE:FACTORY``."""
        return cls.fixed_loop or opts.get("loop", "asyncio")

    @classmethod
    def requirements(cls, opts) -> tuple:
        """What an environment must install for this configuration: its loop's
        distribution."""
        req = LOOP_REQUIREMENTS.get(cls.loop_of(opts))
        return (req,) if req else ()

    @classmethod
    def unavailable(cls, opts, loop_options) -> str | None:
        """Why this configuration cannot run here (``Runtime.unavailable_reason``)."""
        return _check_loop(cls.loop_of(opts), loop_options, opts.get("eager", False))

    @classmethod
    def real_network_only(cls, opts) -> str | None:
        name = cls.loop_of(opts)
        if name in _SIM_LOOPS or cls.fixed_loop:
            return None       # a fixed loop (uvloop) declares it on its RuntimeInfo
        return (f"loop {name} is neither asyncio's selector loop nor looplab's, the only "
                "loops the simulated network reaches (protocols.simports.SimSelectorEventLoop, "
                "the io= seam of kernels.callback.new_event_loop)")

    def _init_tracking(self, runtime, opts):
        self._instrument = opts.get("instrument", True)
        self._transports = _Transports()      # transport -> ConnStats | None
        self.loop_name = self.loop_of(opts)
        self._uv = self.loop_name == "uvloop"
        self.loop_factory = _tracking_loop_factory(
            self, self.loop_name, dict(getattr(runtime, "loop_options", None) or {}),
            opts.get("eager", False))

    def trace(self):
        """The loop's own trace, when it records one: looplab's loop with
        ``loop.trace=true`` (the callback kernel's transport events); else None."""
        return getattr(getattr(self.made_loop, "probe", None), "trace", None)

    def _settle_transports(self, loop):
        unsent, open_count, closing = 0, 0, 0
        for t, stats in list(self._transports.items()):
            size = t.get_write_buffer_size()
            if t.is_closing() and not size:
                closing += 1                # closed, or its connection_lost is queued
                continue
            open_count += 1
            unsent += size
            if stats is not None:
                stats.user_buffer_bytes = size
                stats.lost_on_exit_bytes = size
            t.abort()
        # One pass so the aborts' connection_lost callbacks run and close the sockets
        # (run_forever, not run_until_complete: a pending stop() must not make it fail).
        if open_count or closing:
            loop.call_soon(loop.stop)
            loop.run_forever()
        report = self.stats.exit_report
        report.setdefault("policy", "cancel")
        report.update(transports_open_count=open_count, unsent_bytes=unsent)


class AsyncioCallbackPort(_AsyncioMixin, CallbackPortBase):
    unseen = ("loop_iterations_count", "callbacks_run_count", "ready_max_count",
              "task_switches_count", "spawns_count")
    def __init__(self, runtime, opts):
        super().__init__(runtime)
        self._init_tracking(runtime, opts)
        self.loop = self.loop_factory()
        self._connecting = set()        # connect() tasks not finished yet

    def _wrap(self, factory):
        wrapper = _MeasuredProtocol if self._instrument else _Tracked
        return lambda: wrapper(factory(), self)

    def listen(self, factory, sock):
        sock.setblocking(False)
        task = self.loop.create_task(self.loop.create_server(self._wrap(factory), sock=sock))
        return _PendingServer(task)

    def connect(self, factory, host, port, on_done, sockbuf=None):
        loop = self.loop

        async def go():
            sock = client_socket(sockbuf)
            sock.setblocking(False)
            try:
                await loop.sock_connect(sock, (host, port))
                return await loop.create_connection(self._wrap(factory), sock=sock)
            except BaseException:
                sock.close()
                raise

        def done(task):
            if task.cancelled():
                on_done(None, None, ConnectionAbortedError("connect cancelled"))
            elif task.exception() is not None:
                on_done(None, None, task.exception())
            else:
                transport, proto = task.result()
                inner = getattr(proto, "inner", proto)
                shown = getattr(proto, "mt", None) or transport
                on_done(shown, inner, None)

        task = loop.create_task(go())
        task.add_done_callback(done)
        self._connecting.add(task)
        task.add_done_callback(self._connecting.discard)

    def close(self) -> None:
        if not self.loop.is_closed():
            self._finish_connects()
            self.loop.close()

    def _finish_connects(self, bound_s: float = 1.0) -> None:
        # A connect still resolving its address when the server stops: let it
        # end before the loop closes. uvloop resolves even a numeric host in
        # libuv's thread pool, and a resolution that completes after close()
        # raises "Event loop is closed" inside uvloop and leaves the task
        # pending ("Task was destroyed but it is pending!"). Bounded: what is
        # still connecting after bound_s is cancelled.
        loop = self.loop
        if not self._connecting or loop.is_running():
            return
        deadline = time.monotonic() + bound_s
        while self._connecting and time.monotonic() < deadline:
            loop.call_later(0.01, loop.stop)
            loop.run_forever()
        for task in list(self._connecting):
            task.cancel()
        if self._connecting:
            loop.call_soon(loop.stop)
            loop.run_forever()


class _PendingServer:
    """asyncio's create_server is a coroutine; drivers want a server object now."""

    def __init__(self, task):
        self._task = task

    def close(self):
        if self._task.done():
            if not self._task.cancelled() and self._task.exception() is None:
                self._task.result().close()
        else:
            self._task.cancel()


class _MeasuredWriter:
    """A StreamWriter stand-in that reads the transport's buffer after every write."""

    def __init__(self, writer, stats):
        self._w = writer
        self._mt = _MeasuredTransport(writer.transport, stats)

    def write(self, data):
        self._w.write(data)
        self._mt._account(len(data))

    def writelines(self, seq):
        seq = list(seq)
        self._w.writelines(seq)
        self._mt._account(sum(len(d) for d in seq))

    async def wait_closed(self):
        # The probe's `closed` is true once the socket is closed; asyncio closes it a
        # loop pass after close(), and wait_closed() returning is when a program sees it.
        try:
            await self._w.wait_closed()
        finally:
            if self._w.transport.is_closing():
                self._mt.stats.closed = True

    @property
    def transport(self):
        return self._mt

    def __getattr__(self, name):
        return getattr(self._w, name)


class AsyncioStreamPort(_AsyncioMixin, StreamPortBase):
    # The stream protocol's pause_writing() is internal to asyncio.
    unseen = ("pause_writing_count", "written_while_paused_bytes", "loop_iterations_count",
              "task_switches_count", "callbacks_run_count", "ready_max_count")
    def __init__(self, runtime, opts):
        super().__init__(runtime)
        import asyncio
        self._aio = asyncio
        self._init_tracking(runtime, opts)
        for name in STREAM_NAMES:
            setattr(self, name, getattr(asyncio, name))
        self.timeout = asyncio.timeout
        self.runner = asyncio.Runner(loop_factory=self.loop_factory)
        self._reader_peak = 0

    def _watch_reader(self, reader):
        """S2: the reader's buffer peak, read after every feed_data. asyncio keeps
        the buffer in a private attribute (``_buffer``); this is the one place
        looplab reads a private attribute of a reference library."""
        feed = reader.feed_data

        def feed_and_measure(data):
            feed(data)
            size = len(reader._buffer)
            if size > self._reader_peak:
                self._reader_peak = size
        reader.feed_data = feed_and_measure

    def probe(self) -> dict:
        snap = super().probe()
        snap["reader_buffer_peak_bytes"] = self._reader_peak if self._instrument else None
        return snap

    def _wrap_pair(self, reader, writer):
        if self._instrument:
            self._watch_reader(reader)
        if not self._instrument:
            self._transports[writer.transport] = None
            return reader, writer
        stats = self.stats.new_conn()
        self._transports[writer.transport] = stats
        return reader, _MeasuredWriter(writer, stats)

    async def open_connection(self, host, port, *, limit=65536, sockbuf=None):
        loop = self._aio.get_running_loop()
        sock = client_socket(sockbuf)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, (host, port))
            reader, writer = await self._aio.open_connection(sock=sock, limit=limit)
        except BaseException:
            sock.close()
            raise
        return self._wrap_pair(reader, writer)

    async def start_server(self, cb, host=None, port=None, *, sock=None, limit=65536):
        def wrapped(reader, writer):
            return cb(*self._wrap_pair(reader, writer))
        if sock is not None:
            sock.setblocking(False)
            return await self._aio.start_server(wrapped, sock=sock, limit=limit)
        return await self._aio.start_server(wrapped, host, port, limit=limit)

    def run(self, main, *args):
        interrupted: list = []

        async def outer():
            try:
                return await main_until_signal(self, self._aio.get_running_loop, main, args,
                                                interrupted)
            finally:
                me = self._aio.current_task()
                left = [t for t in self._aio.all_tasks() if t is not me and not t.done()]
                self.stats.exit_report.update(policy="cancel", tasks_left_count=len(left))
        try:
            result = self.runner.run(outer())
        finally:
            self.runner.close()
        if interrupted:
            raise KeyboardInterrupt
        return result

    def close(self) -> None:
        self.runner.close()


class UvloopCallbackPort(AsyncioCallbackPort):
    """asyncio's Protocol/Transport API on uvloop's loop (``asyncio-protocol:loop=uvloop``)."""
    fixed_loop = "uvloop"


class UvloopStreamPort(AsyncioStreamPort):
    """asyncio's streams on uvloop's loop (``asyncio-streams:loop=uvloop``)."""
    fixed_loop = "uvloop"
