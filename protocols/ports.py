"""Ports: the one API a driver talks to, and the ports of looplab's own kernels.

A driver is written once per *style* and must run unchanged on every runtime of that
style, so each port is a thin adapter whose job is to make the difference between
"our kernel" and "the real library" invisible to the driver -- and *visible* to the
measurements. The promises each style makes are written down as ``typing.Protocol``
classes in ``protocols.contracts``; this module holds what every port shares
(``PortBase`` and the per-style bases ``CallbackPortBase``, ``StreamPortBase``,
``TaskPortBase``, which a third-party kernel's port may subclass) and the ports of
our three kernels:

``OurCallbackPort``  the callback kernel's ``Loop`` (style callback)
``HybridPort``       the hybrid kernel's ``Runner`` and streams (style stream)
``CoroPort``         the coro kernel (style task)

The reference libraries' ports are in ``protocols.asyncio_ports`` (asyncio, uvloop)
and ``protocols.trio_curio_ports`` (trio, curio). Every port is constructed as
``Port(runtime, options)`` by ``Runtime.open()``; ``options`` is the runtime's full
option dict.
"""
from __future__ import annotations

import contextlib
import signal
import sys
import socket
import threading

from kernels.probe import Probe

__all__ = ["PortBase", "CallbackPortBase", "StreamPortBase", "TaskPortBase", "OurCallbackPort",
           "HybridPort", "CoroPort", "client_socket", "bind_listener", "pin_buffers", "STREAM_NAMES", "using_io", "current_io", "sim_sigint"]

# --- simulated-network hook ----------------------------------------------------
# Programs open their own ports (``runtime.open()``), so the IO object a
# simulated cell runs on is ambient: every port of our kernels opened inside
# ``using_io(io)`` hands ``io`` to its kernel, and the reference ports build
# their loop, clock or kernel on it from ``protocols.simports``. Real signals are left alone (a
# simulated waker has no fd a signal could write to); what a port would do on
# SIGINT is kept per thread instead (``sim_sigint()``), for the cell to deliver.
class _SimState(threading.local):
    def __init__(self):
        self.io: list = []          # the ambient IO objects, innermost last
        self.sigint: list = []      # the running ports' SIGINT handlers, innermost last


_SIM = _SimState()              # per thread: sim cells may run in a matrix's worker threads


@contextlib.contextmanager
def using_io(io):
    """Open ports on ``io`` (a ``kernels.io`` seam object) inside."""
    _SIM.io.append(io)
    try:
        yield io
    finally:
        _SIM.io.pop()


def current_io():
    """The ambient IO object of this thread, or None (the real OS)."""
    return _SIM.io[-1] if _SIM.io else None


def sim_sigint() -> list:
    """This thread's simulated-SIGINT handlers (innermost last)."""
    return _SIM.sigint


def _io_kw() -> dict:
    return {"io": _SIM.io[-1]} if _SIM.io else {}
# --- end of the hook ---------------------------------------------------------

def pin_buffers(sock, size: int | None) -> None:
    """Pin SO_SNDBUF/SO_RCVBUF to ``size`` (nothing when it is 0 or None). Before
    listen or connect: the window scale is fixed in the handshake, and an accepted
    socket inherits its listener's buffers."""
    if size:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)


def client_socket(sockbuf: int | None) -> socket.socket:
    """An unconnected TCP socket with SO_SNDBUF/SO_RCVBUF pinned before connect
    (from the ambient IO object inside ``using_io``)."""
    sock = _SIM.io[-1].socket(socket.AF_INET, socket.SOCK_STREAM) if _SIM.io else \
        socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    pin_buffers(sock, sockbuf)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def bind_listener(host: str = "127.0.0.1", port: int = 0, sockbuf: int | None = None,
                  backlog: int = 128, io=None) -> socket.socket:
    """A listening TCP socket. ``sockbuf`` pins SO_SNDBUF/SO_RCVBUF, which accepted
    sockets inherit on Linux. ``io``: a ``kernels.io`` seam object whose sockets to
    use (a simulated world's), else the OS's. A port in use raises OSError
    (EADDRINUSE)."""
    sock = (io.socket if io is not None else socket.socket)(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        pin_buffers(sock, sockbuf)
        sock.bind((host, port))
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock


class PortBase:
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

class CallbackPortBase(PortBase):
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
    if _SIM.io:
        # as a real signal arrives: through the loop's wake-up, so that a loop with
        # nothing ready wakes and runs the handler as a callback
        def deliver():
            loop.call_soon_threadsafe(on_signal)
        _SIM.sigint.append(deliver)
        return lambda: _SIM.sigint.remove(deliver)
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    sigs = (signal.SIGINT, signal.SIGTERM)
    before = {sig: signal.getsignal(sig) for sig in sigs}
    for sig in sigs:
        loop.add_signal_handler(sig, on_signal)

    def undo():
        if not loop.is_closed():
            for sig in sigs:
                try:
                    loop.remove_signal_handler(sig)
                except Exception as exc:
                    # A loop whose remove_signal_handler is broken (rloop 0.5.0 calls a
                    # method it never defines): say so; the handler is put back below,
                    # so the cell measures the loop's I/O rather than dying on its exit path.
                    print(f"looplab: {type(loop).__module__}.{type(loop).__name__}."
                          f"remove_signal_handler({sig.name}) raised {type(exc).__name__}: {exc}; "
                          "restored the handler with signal.signal", file=sys.stderr)
        for sig in sigs:
            # uvloop 0.23 forgets handlers added before run_forever once it stops:
            # remove_signal_handler then returns False and leaves its own handler in
            # place, and a later Ctrl-C in this process went to a stopped loop
            if signal.getsignal(sig) is not before[sig] and before[sig] is not None:
                signal.signal(sig, before[sig])
    return undo


async def main_until_signal(port, running_loop, main, args, interrupted: list):
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


class OurCallbackPort(CallbackPortBase):
    ours = True

    def __init__(self, runtime, opts):
        super().__init__(runtime)
        from kernels.callback import Loop
        self.loop = Loop(**opts, **_io_kw())

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


# ---------------------------------------------------------------------------
# stream style

STREAM_NAMES = ("sleep", "create_task", "gather", "wait_for", "Event", "Queue",
                 "CancelledError", "current_task", "all_tasks")


class StreamPortBase(PortBase):
    """Subclasses provide ``run(main, *args)``: run ``main(port, *args)`` to completion
    under the runtime's exit policy, and the asyncio names in ``STREAM_NAMES``."""
    style = "stream"
    TimeoutError = TimeoutError


class HybridPort(StreamPortBase):
    ours = True

    def __init__(self, runtime, opts):
        super().__init__(runtime)
        import kernels.hybrid as h
        self._h = h
        for name in STREAM_NAMES:
            setattr(self, name, getattr(h, name))
        self.timeout = h.timeout
        self.runner = h.Runner(**opts, **_io_kw())
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
        result = self.runner.run(main_until_signal(self, get_running_loop, main, args, interrupted))
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


# ---------------------------------------------------------------------------
# task style

class TaskPortBase(PortBase):
    """``StreamError``: what a stream raises when the peer resets or the stream is
    closed under it (trio has its own exceptions for that; drivers catch this)."""
    style = "task"
    StreamError = (ConnectionError,)
    # The library's spawn-without-join (a task that outlives no nursery), where
    # it has one; None where every task lives in a nursery (trio).
    detached_spawn = None


class CoroPort(TaskPortBase):
    ours = True

    def __init__(self, runtime, opts):
        super().__init__(runtime)
        import kernels.coro as c
        self._c = c
        self.kernel = c.Kernel(**opts, **_io_kw())
        self.sleep = c.sleep
        self.move_on_after = c.move_on_after
        self.fail_after = c.timeout_after
        self.Event = c.Event
        self.Cancelled = c.Cancelled
        self.detached_spawn = c.spawn
        self.StreamError = (ConnectionError, c.ClosedResourceError)

    def run(self, main, *args):
        if _SIM.io:       # simulated SIGINT: what the kernel's own handler does
            _SIM.sigint.append(on_sigint := lambda: self.kernel._on_sigint(signal.SIGINT, None))
            try:
                return self.kernel.run(main, self, *args)
            finally:
                _SIM.sigint.remove(on_sigint)
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


class Delegating:
    """An async context manager that enters and exits the one it wraps but hands
    out itself, so a port can rename what the library calls things."""

    def __init__(self, inner):
        self._inner = inner

    async def __aenter__(self):
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc):
        return await self._inner.__aexit__(*exc)


class _CoroNursery(Delegating):
    async def spawn(self, fn, *args):
        self._inner.start_soon(fn, *args)

    async def cancel(self):
        self._inner.cancel()

