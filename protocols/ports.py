"""Ports: the one API a driver talks to, over our kernels and the reference libraries.

A driver is written once per *style* and must run unchanged on every runtime of that
style, so each port below is a thin adapter whose job is to make the difference between
"our kernel" and "the real library" invisible to the driver -- and *visible* to the
measurements. Three shapes:

``CallbackPort``  listen(factory, sock) / connect(factory, host, port, on_done) /
                  call_soon / call_later / run(setup) / stop(). Protocols are plain
                  classes with the six asyncio Protocol methods.
``StreamPort``    asyncio's stream and task functions, bound to our hybrid kernel or to
                  asyncio (optionally on uvloop's loop).
``TaskPort``      open_tcp_stream / listen(sock) -> accept() / open_nursery (async
                  ``spawn``, ``cancel``) / sleep / move_on_after (async CM) / Event,
                  streams with trio's ``receive_some``/``send_all``/``send_eof``/``aclose``.

Measurement of the reference libraries goes through public APIs only: a proxy
transport or writer reads ``get_write_buffer_size()`` after every write (so the
peak is exact, not sampled), a tracking loop subclass learns which transports
still hold bytes when the loop closes (asyncio forgets them; we count them as lost
and release their sockets so nothing leaks), trio's ``Instrument`` and curio's
``Activation`` count task steps and spawns. What a public API can't show (a
stream writer's pause_writing, curio's internals) is reported as ``None``.
With ``instrument=false`` the proxies are left out, for benchmarks.
"""
from __future__ import annotations

import signal
import socket
import threading
import weakref

from kernels.probe import Probe

__all__ = ["open_port", "CallbackPort", "StreamPort", "TaskPort"]


def open_port(runtime, opts: dict):
    rid = runtime.id
    if rid == "callback":
        from kernels.callback import Loop
        return OurCallbackPort(runtime, Loop(**opts))
    if rid == "hybrid":
        return HybridPort(runtime, opts)
    if rid == "coro":
        return CoroPort(runtime, opts)
    if rid in ("asyncio-protocol", "uvloop-protocol"):
        return AsyncioCallbackPort(runtime, opts, uv=rid.startswith("uvloop"))
    if rid in ("asyncio-streams", "uvloop-streams"):
        return AsyncioStreamPort(runtime, opts, uv=rid.startswith("uvloop"))
    if rid == "trio":
        return TrioPort(runtime, opts)
    if rid == "curio":
        return CurioPort(runtime, opts)
    raise ValueError(f"no port for runtime {rid}")


def client_socket(sockbuf: int | None) -> socket.socket:
    """An unconnected TCP socket with SO_SNDBUF/SO_RCVBUF pinned before connect."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if sockbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sockbuf)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, sockbuf)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class _Port:
    style = ""
    ours = False
    # Counters a reference runtime's public API cannot show: reported as None.
    unseen: tuple = ()

    def __init__(self, runtime):
        self.runtime = runtime
        self.stats = Probe()   # filled by proxies for reference runtimes

    def probe(self) -> dict:
        snap = self.stats.snapshot()
        for name in self.unseen:
            snap[name] = None
        snap["source"] = "instrumented public API"
        return snap

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---------------------------------------------------------------------------
# callback style

class CallbackPort(_Port):
    style = "callback"

    def call_soon(self, cb, *args):
        return self.loop.call_soon(cb, *args)

    def call_later(self, delay, cb, *args):
        return self.loop.call_later(delay, cb, *args)

    def time(self) -> float:
        return self.loop.time()

    def stop(self) -> None:
        self.loop.stop()

    def run(self, setup, *args) -> None:
        """Call ``setup(port, *args)`` inside the loop, run until ``stop()``. SIGINT
        and SIGTERM stop the loop between callbacks, then raise KeyboardInterrupt
        (raised inside a callback, uvloop would log it as a transport error and go on)."""
        interrupted = []

        def on_signal():
            interrupted.append(True)
            self.loop.stop()

        undo = _signals_as_loop_events(self.loop, on_signal)
        try:
            self.loop.call_soon(setup, self, *args)
            self.loop.run_forever()
        finally:
            undo()
        if interrupted:
            raise KeyboardInterrupt


def _signals_as_loop_events(loop, on_signal):
    """Deliver SIGINT/SIGTERM as a loop callback (main thread only); returns undo."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    sigs = (signal.SIGINT, signal.SIGTERM)
    for sig in sigs:
        loop.add_signal_handler(sig, on_signal)

    def undo():
        if not loop.is_closed():
            for sig in sigs:
                loop.remove_signal_handler(sig)
    return undo


async def _main_until_signal(port, running_loop, main, args, interrupted: list):
    """Run ``main(port, *args)`` as the stream port's main coroutine; a signal
    cancels it (as asyncio.Runner does for SIGINT) and is remembered."""
    task = port.current_task()

    def on_signal():
        interrupted.append(True)
        task.cancel()

    undo = _signals_as_loop_events(running_loop(), on_signal)
    try:
        return await main(port, *args)
    except port.CancelledError:
        if not interrupted:
            raise
    finally:
        undo()


class OurCallbackPort(CallbackPort):
    ours = True

    def __init__(self, runtime, loop):
        super().__init__(runtime)
        self.loop = loop

    def listen(self, factory, sock):
        return self.loop.create_server(factory, sock=sock)

    def connect(self, factory, host, port, on_done, sockbuf=None):
        self.loop.create_connection(factory, host, port, callback=on_done, sockbuf=sockbuf)

    def probe(self) -> dict:
        snap = self.loop.probe.snapshot()
        snap["source"] = "kernel probe"
        return snap

    def trace(self):
        return self.loop.probe.trace

    def close(self) -> None:
        if not self.loop.is_closed():
            self.loop.close()


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
        transport.set_protocol(self.inner)
        self.inner.connection_made(transport)


def _tracking_loop_factory(port, uv: bool):
    """A loop class whose close() first settles the transports asyncio would forget:
    their buffered bytes are what a process exit loses (S3), and their sockets must
    not leak. Returns a zero-argument factory for asyncio.Runner."""
    import asyncio
    if uv:
        import uvloop
        base = uvloop.Loop
    else:
        base = asyncio.SelectorEventLoop

    def close(loop):
        if not loop.is_closed() and not loop.is_running():
            port._settle_transports(loop)
        base.close(loop)

    cls = type("TrackingLoop", (base,), {"close": close})
    return cls


class _AsyncioMixin:
    """Shared by the asyncio/uvloop ports: transport tracking and the exit account."""

    def _init_tracking(self, opts, uv):
        self._instrument = opts.get("instrument", True)
        self._transports = weakref.WeakKeyDictionary()  # transport -> ConnStats | None
        self._uv = uv
        self.loop_class = _tracking_loop_factory(self, uv)

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


class AsyncioCallbackPort(_AsyncioMixin, CallbackPort):
    unseen = ("loop_iterations_count", "callbacks_run_count", "ready_max_count",
              "task_switches_count", "spawns_count")
    def __init__(self, runtime, opts, uv):
        super().__init__(runtime)
        self._init_tracking(opts, uv)
        self.loop = self.loop_class()

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

        loop.create_task(go()).add_done_callback(done)

    def close(self) -> None:
        if not self.loop.is_closed():
            self.loop.close()


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


# ---------------------------------------------------------------------------
# stream style

_STREAM_NAMES = ("sleep", "create_task", "gather", "wait_for", "Event", "Queue",
                 "CancelledError", "current_task", "all_tasks")


class StreamPort(_Port):
    """Subclasses provide ``run(main, *args)``: run ``main(port, *args)`` to completion
    under the runtime's exit policy, and the asyncio names in ``_STREAM_NAMES``."""
    style = "stream"
    TimeoutError = TimeoutError


class HybridPort(StreamPort):
    ours = True

    def __init__(self, runtime, opts):
        super().__init__(runtime)
        import kernels.hybrid as h
        self._h = h
        for name in _STREAM_NAMES:
            setattr(self, name, getattr(h, name))
        self.timeout = h.timeout
        self.runner = h.Runner(**opts)
        self._readers = []     # for S2: each StreamReader keeps its own buffer peak

    async def open_connection(self, host, port, **kw):
        reader, writer = await self._h.open_connection(host, port, **kw)
        self._readers.append(reader)
        return reader, writer

    async def start_server(self, cb, *args, **kw):
        def wrapped(reader, writer):
            self._readers.append(reader)
            return cb(reader, writer)
        return await self._h.start_server(wrapped, *args, **kw)

    def run(self, main, *args):
        from kernels.callback import get_running_loop
        interrupted: list = []
        result = self.runner.run(_main_until_signal(self, get_running_loop, main, args, interrupted))
        if interrupted:
            raise KeyboardInterrupt
        return result

    def probe(self) -> dict:
        snap = self.runner.probe.snapshot()
        snap["reader_buffer_peak_bytes"] = max((r.peak_buffer_bytes for r in self._readers), default=0)
        snap["source"] = "kernel probe"
        return snap

    def trace(self):
        return self.runner.probe.trace

    def close(self) -> None:
        self.runner.close()


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

    @property
    def transport(self):
        return self._mt

    def __getattr__(self, name):
        return getattr(self._w, name)


class AsyncioStreamPort(_AsyncioMixin, StreamPort):
    # The stream protocol's pause_writing() is internal to asyncio.
    unseen = ("pause_writing_count", "written_while_paused_bytes", "loop_iterations_count",
              "task_switches_count", "callbacks_run_count", "ready_max_count")
    def __init__(self, runtime, opts, uv):
        super().__init__(runtime)
        import asyncio
        self._aio = asyncio
        self._init_tracking(opts, uv)
        for name in _STREAM_NAMES:
            setattr(self, name, getattr(asyncio, name))
        self.timeout = asyncio.timeout
        self.runner = asyncio.Runner(loop_factory=self.loop_class)
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
                return await _main_until_signal(self, self._aio.get_running_loop, main, args,
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


# ---------------------------------------------------------------------------
# task style

class TaskPort(_Port):
    """``StreamError``: what a stream raises when the peer resets or the stream is
    closed under it (trio has its own exceptions for that; drivers catch this)."""
    style = "task"
    StreamError = (ConnectionError,)


class CoroPort(TaskPort):
    ours = True

    def __init__(self, runtime, opts):
        super().__init__(runtime)
        import kernels.coro as c
        self._c = c
        self.kernel = c.Kernel(**opts)
        self.sleep = c.sleep
        self.move_on_after = c.move_on_after
        self.fail_after = c.timeout_after
        self.Event = c.Event
        self.Cancelled = c.Cancelled
        self.StreamError = (ConnectionError, c.ClosedResourceError)

    def run(self, main, *args):
        return self.kernel.run(main, self, *args)

    async def open_tcp_stream(self, host, port, sockbuf=None):
        return await self._c.open_tcp_stream(host, port, sockbuf=sockbuf)

    def listen(self, sock):
        return self._c.listen(sock)

    def open_nursery(self):
        return _CoroNursery(self._c.TaskGroup())

    def probe(self) -> dict:
        snap = self.kernel.probe.snapshot()
        snap["source"] = "kernel probe"
        return snap

    def trace(self):
        return self.kernel.probe.trace

    def close(self) -> None:
        self.kernel.close()


class _Delegating:
    """An async context manager that enters and exits the one it wraps but hands
    out itself, so a port can rename what the library calls things."""

    def __init__(self, inner):
        self._inner = inner

    async def __aenter__(self):
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc):
        return await self._inner.__aexit__(*exc)


class _CoroNursery(_Delegating):
    async def spawn(self, fn, *args):
        self._inner.start_soon(fn, *args)

    async def cancel(self):
        self._inner.cancel()


class _MeasuredStream:
    """Counts bytes through a reference library's stream (no user buffer to see:
    accepted == sent once send_all returns)."""

    def __init__(self, stream, stats):
        self._s = stream
        self.stats = stats

    async def receive_some(self, max_bytes=65536):
        data = await self._s.receive_some(max_bytes)
        self.stats.received_bytes += len(data)
        return data

    async def send_all(self, data):
        stats = self.stats
        try:
            await self._s.send_all(data)
        except BaseException as exc:
            # A cancelled send got part-way; count what the library says it sent
            # (curio: bytes_sent), or nothing when it can't say.
            part = getattr(exc, "bytes_sent", None)
            if part:
                stats.accepted_bytes += part
                stats.sent_bytes += part
            raise
        stats.accepted_bytes += len(data)
        stats.sent_bytes += len(data)

    def __getattr__(self, name):
        return getattr(self._s, name)


class _AsyncCM:
    """Presents a synchronous context manager (trio's scopes) as an async one."""

    def __init__(self, cm):
        self._cm = cm

    async def __aenter__(self):
        return self._cm.__enter__()

    async def __aexit__(self, *exc):
        return self._cm.__exit__(*exc)


class TrioPort(TaskPort):
    # No transport, so no pause_writing to count; send_all blocks instead.
    unseen = ("pause_writing_count", "written_while_paused_bytes", "callbacks_run_count",
              "ready_max_count", "read_pauses_count")
    def __init__(self, runtime, opts):
        super().__init__(runtime)
        import trio
        self._trio = trio
        self._instrument = opts.get("instrument", True)
        self.sleep = trio.sleep
        self.Event = trio.Event
        self.Cancelled = trio.Cancelled
        self.StreamError = (ConnectionError, trio.BrokenResourceError, trio.ClosedResourceError)

        stats = self.stats

        class Counter(trio.abc.Instrument):
            def before_task_step(self, task):
                stats.task_switches += 1

            def task_spawned(self, task):
                stats.spawns += 1

            def before_io_wait(self, timeout):
                stats.loop_iterations += 1

        self._instruments = [Counter()] if self._instrument else []

    def move_on_after(self, seconds):
        return _AsyncCM(self._trio.move_on_after(seconds))

    def fail_after(self, seconds):
        return _AsyncCM(self._trio.fail_after(seconds))

    def run(self, main, *args):
        self.stats.exit_report.update(policy="wait", tasks_left_count=0)
        return self._trio.run(main, self, *args, instruments=self._instruments)

    def _wrap(self, stream):
        return _MeasuredStream(stream, self.stats.new_conn()) if self._instrument else stream

    async def open_tcp_stream(self, host, port, sockbuf=None):
        trio = self._trio
        sock = trio.socket.from_stdlib_socket(client_socket(sockbuf))
        try:
            await sock.connect((host, port))
        except BaseException:
            sock.close()
            raise
        return self._wrap(trio.SocketStream(sock))

    def listen(self, sock):
        sock.setblocking(False)
        listener = self._trio.SocketListener(self._trio.socket.from_stdlib_socket(sock))
        return _TrioListener(listener, self)

    def open_nursery(self):
        return _TrioNursery(self._trio.open_nursery())


class _TrioListener:
    def __init__(self, listener, port):
        self._l = listener
        self._port = port

    async def accept(self):
        return self._port._wrap(await self._l.accept())

    async def aclose(self):
        await self._l.aclose()


class _TrioNursery:
    def __init__(self, cm):
        self._cm = cm
        self._n = None

    async def __aenter__(self):
        self._n = await self._cm.__aenter__()
        return self

    async def __aexit__(self, *exc):
        return await self._cm.__aexit__(*exc)

    async def spawn(self, fn, *args):
        self._n.start_soon(fn, *args)

    async def cancel(self):
        self._n.cancel_scope.cancel()


class _CurioStream:
    """trio's Stream shape over a curio socket: the whole of the curio shim."""

    def __init__(self, sock):
        self.socket = sock

    async def receive_some(self, max_bytes=65536):
        return await self.socket.recv(max_bytes)

    async def send_all(self, data):
        await self.socket.sendall(data)

    async def send_eof(self):
        await self.socket.shutdown(socket.SHUT_WR)

    async def aclose(self):
        await self.socket.close()


class _CurioMove(_Delegating):
    """curio's ignore_after, with trio's ``cancelled_caught`` spelling."""

    @property
    def cancelled_caught(self) -> bool:
        return bool(self._inner.expired)


class CurioPort(TaskPort):
    unseen = ("pause_writing_count", "written_while_paused_bytes", "callbacks_run_count",
              "ready_max_count", "read_pauses_count", "loop_iterations_count")
    def __init__(self, runtime, opts):
        super().__init__(runtime)
        import curio
        self._curio = curio
        self._instrument = opts.get("instrument", True)
        self.sleep = curio.sleep
        self.Event = curio.UniversalEvent
        self.Cancelled = curio.CancelledError
        stats = self.stats

        class Counter(curio.kernel.Activation):
            def created(self, task):
                stats.spawns += 1

            def running(self, task):
                stats.task_switches += 1

        self.kernel = curio.Kernel(activations=[Counter()] if self._instrument else [])

    def move_on_after(self, seconds):
        return _CurioMove(self._curio.ignore_after(seconds))

    def fail_after(self, seconds):
        return self._curio.timeout_after(seconds)

    def run(self, main, *args):
        """curio lets a KeyboardInterrupt land in the middle of a task step, which
        breaks its kernel. So during the run SIGINT/SIGTERM only write to a wake-up
        socket (``signal.set_wakeup_fd``); a watcher task reads it and ends ``main``
        by cancellation, and KeyboardInterrupt is raised once the kernel is done."""
        curio = self._curio
        self.stats.exit_report.update(policy="cancel")
        if threading.current_thread() is not threading.main_thread():
            return self.kernel.run(main, self, *args)     # signals reach only the main thread
        outcome = {}
        rsock, wsock = socket.socketpair()
        rsock.setblocking(False)
        wsock.setblocking(False)

        async def guarded():
            async with curio.TaskGroup(wait=any) as g:
                task = await g.spawn(main, self, *args)
                watcher = await g.spawn(curio.io.Socket(rsock).recv, 1)
            if watcher.terminated and not watcher.cancelled:
                outcome["interrupted"] = True
            else:
                outcome["task"] = task

        ignore = lambda *a: None  # noqa: E731
        old = [signal.signal(signal.SIGINT, ignore), signal.signal(signal.SIGTERM, ignore)]
        old_fd = signal.set_wakeup_fd(wsock.fileno())
        try:
            self.kernel.run(guarded)
        finally:
            signal.set_wakeup_fd(old_fd)
            signal.signal(signal.SIGINT, old[0])
            signal.signal(signal.SIGTERM, old[1])
            rsock.close()
            wsock.close()
        if "interrupted" in outcome:
            raise KeyboardInterrupt
        return outcome["task"].result

    def _wrap(self, sock):
        stream = _CurioStream(sock)
        return _MeasuredStream(stream, self.stats.new_conn()) if self._instrument else stream

    async def open_tcp_stream(self, host, port, sockbuf=None):
        sock = self._curio.io.Socket(client_socket(sockbuf))
        try:
            await sock.connect((host, port))
        except BaseException:
            await sock.close()
            raise
        return self._wrap(sock)

    def listen(self, sock):
        return _CurioListener(self._curio.io.Socket(sock), self)

    def open_nursery(self):
        return _CurioNursery(self._curio.TaskGroup())

    def close(self) -> None:
        self.kernel.run(shutdown=True)


class _CurioListener:
    def __init__(self, sock, port):
        self._s = sock
        self._port = port

    async def accept(self):
        client, _addr = await self._s.accept()
        return self._port._wrap(client)

    async def aclose(self):
        await self._s.close()


class _CurioNursery(_Delegating):
    async def spawn(self, fn, *args):
        await self._inner.spawn(fn, *args)

    async def cancel(self):
        await self._inner.cancel_remaining()
