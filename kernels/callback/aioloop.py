"""The callback kernel as an ``asyncio`` event loop: ``AioLoop`` and
``new_event_loop(**options)``.

``AioLoop`` implements ``asyncio.AbstractEventLoop`` from scratch on the
callback kernel's reactor (``loop.Loop``) and transports
(``transports.SocketTransport``); it does not subclass ``asyncio.BaseEventLoop``
or the selector loop. asyncio's own ``Future`` and ``Task`` (the C ones) run on
it unchanged: they only need ``call_soon(..., context=)``, ``get_debug`` and
``call_exception_handler``. What it adds to the reactor:

* handles that run in a ``contextvars.Context`` (``AioHandle``): the reactor
  runs ``handle._callback(*handle._args)``, so a handle stores
  ``context.run`` as its callback and the real callback as the first argument --
  the reactor's hot loop is untouched;
* asyncio's running-loop registration, async-generator hooks, task factories,
  debug flag, executors, signal handlers with asyncio's errors, and the
  ``sock_*`` family as futures over ``add_reader``/``add_writer``;
* in ``aionet.py``: streams, servers, UDP, TLS and sendfile.

The loop's design knobs are the callback kernel's options (``LOOP_OPTIONS``,
the same rows as ``kernels.callback.OPTIONS``): ``high_water``/``low_water``
and ``write=try-send|defer`` shape every TCP transport an app opens,
``exit=cancel|wait|raise`` decides what ``close()`` does with unsent bytes,
``trace=true`` records the transports' events, and the version stand-ins
(``write_after_close``, ``limits_recheck``, ``writelines``, ``write_buffer``,
``buffer_on_loss``) change the transports exactly as on the callback kernel.

Use it with ``asyncio.run(main(), loop_factory=new_event_loop)`` (3.12+) or
``asyncio.Runner(loop_factory=functools.partial(new_event_loop, write="defer"))``.
Pipes and child processes are in ``aioprocess.py``; docs/aioloop.md lists
every divergence from CPython's loop.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import errno
import functools
import heapq
import itertools
import logging
import os
import socket
import sys
import threading
import warnings
import weakref

from asyncio import events, format_helpers, futures, tasks

from ..options import Schema
from .aionet import AioNetworking
from .aioprocess import AioProcesses
from .loop import OPTIONS, Handle, Loop, TimerHandle, _is_bound
from .network import connect_result

__all__ = ["AioLoop", "AioHandle", "AioTimerHandle", "new_event_loop", "LOOP_OPTIONS"]

#: The loop's options: every row of the callback kernel's ``OPTIONS`` applies
#: (all of them are transport or exit behaviour), under the name ``looplab``.
LOOP_OPTIONS = Schema("looplab", OPTIONS.options, OPTIONS.check)

logger = logging.getLogger("asyncio")     # where asyncio's loop reports, for apps' log config

_copy_context = contextvars.copy_context
heappush = heapq.heappush
_new_handle = object.__new__


def _handle_repr(handle):
    # asyncio's class names (a slow-callback warning reads "Executing <Handle ...>")
    args = handle._args
    kind = type(handle).__name__.removeprefix("Aio")
    if handle._cancelled or not args:
        return f"<{kind} cancelled>"
    return f"<{kind} {format_helpers._format_callback_source(args[0], args[1:])}>"


def _callback_name(cb):
    return getattr(cb, "__qualname__", None) or repr(cb)


class AioHandle(Handle):
    """A callback queued with ``call_soon``; runs in ``get_context()``. The
    reactor calls ``_callback(*_args)``, which is ``context.run(callback, *args)``
    (in debug mode, ``_run_timed`` around it). Weak-referenceable, as
    asyncio's handles are; ``_source_traceback`` is set in debug mode only."""
    __slots__ = ("_context", "_source_traceback", "__weakref__")

    def get_context(self):
        return self._context

    __repr__ = _handle_repr


class AioTimerHandle(TimerHandle):
    """A callback due at ``when()``; runs in ``get_context()``."""
    __slots__ = ("_context", "_source_traceback", "__weakref__")

    def get_context(self):
        return self._context

    __repr__ = _handle_repr


#: frames of a coroutine's origin recorded in debug mode (asyncio's constant)
_DEBUG_STACK_DEPTH = 10


def _user_frame():
    """The first frame outside this module: where a debug-mode handle was made."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        frame = frame.f_back
    return frame


class _IOCallback:
    """What a debug-mode slow-I/O warning names: the registered callback."""
    __slots__ = ("callback", "args")

    def __init__(self, callback, args):
        self.callback = callback
        self.args = args

    def __repr__(self):
        return f"<I/O callback {format_helpers._format_callback_source(self.callback, self.args)}>"


def _format_handle(handle):
    # asyncio's rule: a Task's step is named by its Task
    args = getattr(handle, "_args", None)
    callback = args[0] if args else None
    task = getattr(callback, "__self__", None)
    if isinstance(task, tasks.Task):
        return repr(task)
    return repr(handle)


def _run_until_complete_cb(fut):
    if not fut.cancelled():
        exc = fut.exception()
        if isinstance(exc, (SystemExit, KeyboardInterrupt)):
            return      # run_forever() is already unwinding with it
    fut.get_loop().stop()


def _literal_host(host) -> bool:
    """True if resolving ``host`` needs no DNS (None or a literal IP)."""
    if host is None:
        return True
    if isinstance(host, bytes):
        host = host.decode("idna")
    if not isinstance(host, str):
        return False
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host.partition("%")[0])
            return True
        except OSError:
            pass
    return False


class AioLoop(AioNetworking, AioProcesses, Loop, asyncio.AbstractEventLoop):
    """``asyncio.AbstractEventLoop`` on the callback kernel's reactor.
    ``AioLoop(io=None, **options)``; options as ``LOOP_OPTIONS``."""

    #: where the kernel's transports log ("socket.send() raised exception."): asyncio's
    transport_logger = logger

    def __init__(self, *, io=None, **options):
        options = LOOP_OPTIONS.validate(options)
        self._debug = False
        #: call_soon's one test for its slow path: the loop is closed or in debug mode
        self._checked_calls = False
        self._thread_id = None
        super().__init__(io=io, **options)
        self.set_debug(sys.flags.dev_mode or (
            not sys.flags.ignore_environment and bool(os.environ.get("PYTHONASYNCIODEBUG"))))
        # Every Future asks get_debug() when it is made, and streams make one
        # per read: both calls are C callables bound here (as the reactor binds
        # time), so neither costs a Python frame.
        self.create_future = functools.partial(futures.Future, loop=self)
        self.slow_callback_duration = 0.1
        self._task_factory = None
        self._default_executor = None
        self._executor_shutdown_called = False
        self._asyncgens = weakref.WeakSet()
        self._asyncgens_shutdown_called = False
        self._datagrams = set()           # live DatagramTransports
        self._pipes = set()               # live pipe transports
        self._children = {}               # pid -> stop watching it (aioprocess.watch_child)

    def __repr__(self):
        return (f"<{type(self).__name__} running={self.is_running()} "
                f"closed={self.is_closed()} debug={self._debug}>")

    # ------------------------------------------------------------------ scheduling

    def _check_closed(self):
        if self._closed:
            raise RuntimeError("Event loop is closed")

    def call_soon(self, callback, *args, context=None):
        """Run ``callback(*args)`` on a later pass, in ``context`` (default: a
        copy of the current one), FIFO with other ``call_soon``\\ s. In debug
        mode: only from the loop's thread, timed, with its source traceback."""
        if self._checked_calls:          # closed, or debug mode
            return self._call_soon_checked(callback, args, context)
        if context is None:
            context = _copy_context()
        # the handle's fields set here, without an __init__ frame: this runs
        # once per Task wake-up
        handle = _new_handle(AioHandle)
        handle._callback = context.run
        handle._args = (callback, *args)
        handle._cancelled = False
        handle._context = context
        self._ready.append(handle)
        return handle

    def _call_soon_checked(self, callback, args, context):
        if self._closed:
            raise RuntimeError("Event loop is closed")
        self._check_thread()
        return self._debug_handle(AioHandle, None, callback, args, context)

    def call_soon_threadsafe(self, callback, *args, context=None):
        if self._closed:
            raise RuntimeError("Event loop is closed")
        if self._debug:
            handle = self._debug_handle(AioHandle, None, callback, args, context)
        else:
            handle = self._new_handle(AioHandle, callback, args, context)
            self._ready.append(handle)
        self._waker.wake()
        return handle

    def call_later(self, delay, callback, *args, context=None):
        if delay is None:
            raise TypeError("delay must not be None")
        return self._call_at(self.time() + delay, callback, args, context)

    def call_at(self, when, callback, *args, context=None):
        return self._call_at(when, callback, args, context)

    def _call_at(self, when, callback, args, context):
        if self._closed:
            raise RuntimeError("Event loop is closed")
        if when is None:
            raise TypeError("when cannot be None")
        if self._debug:
            self._check_thread()
            return self._debug_handle(AioTimerHandle, when, callback, args, context)
        handle = self._new_handle(AioTimerHandle, callback, args, context, when)
        heappush(self._timers, (when, next(self._timer_seq), handle))
        return handle

    def _new_handle(self, cls, callback, args, context, when=None):
        if context is None:
            context = _copy_context()
        if when is None:
            handle = _new_handle(cls)
            handle._callback = context.run
            handle._args = (callback, *args)
            handle._cancelled = False
        else:
            handle = cls(when, context.run, (callback, *args), self)
        handle._context = context
        return handle

    # ------------------------------------------------------------------ debug mode

    def _check_thread(self):
        """asyncio's debug-mode rule: the non-thread-safe calls only from the
        thread running the loop (any thread while it is not running)."""
        thread_id = self._thread_id
        if thread_id is not None and thread_id != threading.get_ident():
            raise RuntimeError("Non-thread-safe operation invoked on an event loop other "
                               "than the current one")

    def _debug_handle(self, cls, when, callback, args, context):
        """A handle as in normal mode, plus its source traceback, whose run
        ``_run_timed`` times; queued (``when`` None) or pushed on the timers."""
        if not callable(callback):
            raise TypeError(f"a callable object was expected by call_soon(), got {callback!r}")
        handle = self._new_handle(cls, callback, args, context, when)
        handle._source_traceback = format_helpers.extract_stack(_user_frame())
        handle._callback = functools.partial(self._run_timed, handle, handle._callback)
        if when is None:
            self._ready.append(handle)
        else:
            heappush(self._timers, (when, next(self._timer_seq), handle))
        return handle

    def _run_timed(self, what, run, *args):
        """``run(*args)``, warning on the ``asyncio`` logger when it took at least
        ``slow_callback_duration`` seconds (asyncio's text)."""
        start = self.time()
        try:
            return run(*args)
        finally:
            took = self.time() - start
            if took >= self.slow_callback_duration:
                logger.warning("Executing %s took %.3f seconds", _format_handle(what), took)

    def _add_reader(self, fd, callback, args):
        # every I/O callback (a transport's reads, a server's accepts, sock_*)
        # runs in a copy of the context it was registered in, as asyncio's
        # handles do; in debug mode it is timed too
        Loop._add_reader(self, fd, *self._in_context(callback, args))

    def _add_writer(self, fd, callback, args):
        Loop._add_writer(self, fd, *self._in_context(callback, args))

    def _add_stream_reader(self, fd, transport):
        # A transport's reads run in a copy of the context it registered in, as
        # every reader here does: the pass reads, and hands the bytes to
        # data_received (and an EOF or error to the transport) in that context.
        # In debug mode its own _read_ready is registered, to be timed.
        if self._debug:
            self._add_reader(fd, transport._read_ready, ())
            return
        run = _copy_context().run
        Loop._add_reader(self, fd, run, (transport._read_ready,))
        transport._deliver = functools.partial(run, transport._protocol.data_received)
        transport._reader_run = run
        self._fds[fd][2] = transport

    def _in_context(self, callback, args):
        run = _copy_context().run
        if self._debug:
            return self._run_timed, (_IOCallback(callback, args), run, callback, *args)
        return run, (callback, *args)

    # ------------------------------------------------------------------ futures & tasks

    def create_future(self):
        """An asyncio ``Future`` on this loop (``__init__`` shadows this method
        with an equivalent ``functools.partial``)."""
        return futures.Future(loop=self)

    def create_task(self, coro, *, name=None, context=None, **kwargs):
        """A ``Task`` (or the task factory's object) for ``coro``. Extra keyword
        arguments (``eager_start`` on 3.12+) go to the factory or ``Task``; an
        interpreter whose ``Task`` lacks one raises its TypeError."""
        self._check_closed()
        if self._task_factory is None:
            task = tasks.Task(coro, loop=self, name=name, context=context, **kwargs)
        else:
            if context is not None:
                kwargs["context"] = context
            task = self._task_factory(self, coro, **kwargs)
            if name is not None:
                task.set_name(name)
        return task

    def set_task_factory(self, factory):
        if factory is not None and not callable(factory):
            raise TypeError("task factory must be a callable or None")
        self._task_factory = factory

    def get_task_factory(self):
        return self._task_factory

    # ------------------------------------------------------------------ running

    def run_forever(self):
        """Run passes until ``stop()`` (the reactor's ``run_forever``), as the
        thread's running asyncio loop with this loop's async-generator hooks."""
        self._check_closed()
        if self._running:
            raise RuntimeError("This event loop is already running")
        if events._get_running_loop() is not None:
            raise RuntimeError("Cannot run the event loop while another loop is running")
        self._thread_id = threading.get_ident()
        old_hooks = sys.get_asyncgen_hooks()
        sys.set_asyncgen_hooks(firstiter=self._asyncgen_firstiter_hook,
                               finalizer=self._asyncgen_finalizer_hook)
        events._set_running_loop(self)
        debug = self._debug
        if debug:
            old_depth = sys.get_coroutine_origin_tracking_depth()
            sys.set_coroutine_origin_tracking_depth(_DEBUG_STACK_DEPTH)
        try:
            Loop.run_forever(self)
        finally:
            if debug:
                sys.set_coroutine_origin_tracking_depth(old_depth)
            events._set_running_loop(None)
            self._thread_id = None
            sys.set_asyncgen_hooks(*old_hooks)

    def run_until_complete(self, future):
        """Run until ``future`` (a future or a coroutine, wrapped in a Task) is
        done; return its result or raise its exception."""
        self._check_closed()
        if self._running:
            raise RuntimeError("This event loop is already running")
        new_task = not futures.isfuture(future)
        future = tasks.ensure_future(future, loop=self)
        if new_task:
            future._log_destroy_pending = False
        future.add_done_callback(_run_until_complete_cb)
        try:
            self.run_forever()
        except BaseException:
            if new_task and future.done() and not future.cancelled():
                future.exception()     # it is re-raised here; don't log it too
            raise
        finally:
            future.remove_done_callback(_run_until_complete_cb)
        if not future.done():
            raise RuntimeError("Event loop stopped before Future completed.")
        return future.result()

    def close(self):
        """Close (the reactor's ``close``: the ``exit`` policy applies to unsent
        bytes), then shut the default executor down without waiting."""
        if self._running:
            raise RuntimeError("Cannot close a running event loop")
        if self._closed:
            return
        for transport in [*self._datagrams, *self._pipes]:
            transport._abandon_at_exit()
        self._datagrams.clear()
        self._pipes.clear()
        for stop in list(self._children.values()):
            stop()
        self._children.clear()
        try:
            Loop.close(self)
        finally:
            self._checked_calls = True
            self._executor_shutdown_called = True
            executor, self._default_executor = self._default_executor, None
            if executor is not None:
                executor.shutdown(wait=False)

    # ------------------------------------------------------------------ async generators

    def _asyncgen_firstiter_hook(self, agen):
        if self._asyncgens_shutdown_called:
            warnings.warn(f"asynchronous generator {agen!r} was scheduled after "
                          f"loop.shutdown_asyncgens() call", ResourceWarning, source=self)
        self._asyncgens.add(agen)

    def _asyncgen_finalizer_hook(self, agen):
        self._asyncgens.discard(agen)
        if not self.is_closed():
            self.call_soon_threadsafe(self.create_task, agen.aclose())

    async def shutdown_asyncgens(self):
        """``aclose()`` every async generator still open; errors are reported."""
        self._asyncgens_shutdown_called = True
        if not len(self._asyncgens):
            return
        closing = list(self._asyncgens)
        self._asyncgens.clear()
        results = await tasks.gather(*[ag.aclose() for ag in closing], return_exceptions=True)
        for result, agen in zip(results, closing):
            if isinstance(result, Exception):
                self.call_exception_handler({
                    "message": f"an error occurred during closing of asynchronous "
                               f"generator {agen!r}",
                    "exception": result, "asyncgen": agen})

    # ------------------------------------------------------------------ executors

    def run_in_executor(self, executor, func, *args):
        self._check_closed()
        if executor is None:
            if self._executor_shutdown_called:
                raise RuntimeError("Executor shutdown has been called")
            executor = self._default_executor
            if executor is None:
                executor = self._default_executor = concurrent.futures.ThreadPoolExecutor(
                    thread_name_prefix="asyncio")
        return futures.wrap_future(executor.submit(func, *args), loop=self)

    def set_default_executor(self, executor):
        if not isinstance(executor, concurrent.futures.ThreadPoolExecutor):
            raise TypeError("executor must be ThreadPoolExecutor")
        self._default_executor = executor

    async def shutdown_default_executor(self, timeout=None):
        """Join the default executor's threads (in a helper thread, so the loop
        keeps running); after ``timeout`` seconds, warn and stop waiting."""
        self._executor_shutdown_called = True
        executor = self._default_executor
        if executor is None:
            return
        future = self.create_future()

        def shutdown():
            try:
                executor.shutdown(wait=True)
                if not self.is_closed():
                    self.call_soon_threadsafe(
                        futures._set_result_unless_cancelled, future, None)
            except RuntimeError:
                pass      # the loop closed meanwhile

        thread = threading.Thread(target=shutdown, name="looplab-executor-shutdown")
        thread.start()
        try:
            if timeout is None:
                await future
            else:
                await tasks.wait_for(asyncio.shield(future), timeout)
        except asyncio.TimeoutError:
            warnings.warn(f"The executor did not finish joining its threads within "
                          f"{timeout} seconds.", RuntimeWarning, stacklevel=2)
            executor.shutdown(wait=False)
        else:
            thread.join()
        finally:
            self._default_executor = None

    # ------------------------------------------------------------------ name resolution

    async def getaddrinfo(self, host, port, *, family=0, type=0, proto=0, flags=0):
        """``socket.getaddrinfo`` through the loop's I/O seam; in the executor
        unless the host is None or a literal IP (no DNS, so no thread)."""
        getaddrinfo = self._io.getaddrinfo
        if _literal_host(host):
            return getaddrinfo(host, port, family, type, proto, flags)
        return await self.run_in_executor(None, getaddrinfo, host, port, family, type,
                                          proto, flags)

    async def getnameinfo(self, sockaddr, flags=0):
        return await self.run_in_executor(None, socket.getnameinfo, sockaddr, flags)

    # ------------------------------------------------------------------ readers & writers

    def add_reader(self, fd, callback, *args):
        """Call ``callback(*args)`` (in a copy of the current context) whenever
        ``fd`` is readable; replaces a previous reader of that fd."""
        self._check_closed()
        Loop.add_reader(self, fd, callback, *args)

    def add_writer(self, fd, callback, *args):
        self._check_closed()
        Loop.add_writer(self, fd, callback, *args)

    def _sock_wait(self, sock, writer, step, *args):
        """A future for ``step(fut, sock, *args)`` run on each readiness of
        ``sock`` until it resolves ``fut``; the registration goes with it."""
        fut = self.create_future()
        fd = sock.fileno()
        if fd < 0:
            raise ValueError("the socket is closed")
        slot = 1 if writer else 0
        (self._add_writer if writer else self._add_reader)(fd, step, (fut, sock, *args))
        mine = self._fds[fd][slot]

        def unregister(_fut):
            # only our own registration: a cancelled sock_recv's callback runs a
            # pass later, when another sock_recv may already wait on this fd
            entry = self._fds.get(fd)
            if not self._closed and entry is not None and entry[slot] is mine:
                (self._remove_writer if writer else self._remove_reader)(fd)

        fut.add_done_callback(unregister)
        return fut

    @staticmethod
    def _sock_call(fut, sock, method, *args):
        if fut.done():
            return
        try:
            result = method(*args)
        except (BlockingIOError, InterruptedError):
            return
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            fut.set_exception(exc)
        else:
            fut.set_result(result)

    def _check_sock(self, sock):
        if self._debug and sock.gettimeout() != 0:
            raise ValueError("the socket must be non-blocking")

    async def _sock_read(self, sock, call, *args):
        """One read call now; if it would block, again when ``sock`` is readable."""
        self._check_sock(sock)
        try:
            return call(*args)
        except (BlockingIOError, InterruptedError):
            pass
        return await self._sock_wait(sock, False, self._sock_call, call, *args)

    async def sock_recv(self, sock, nbytes):
        return await self._sock_read(sock, sock.recv, nbytes)

    async def sock_recv_into(self, sock, buf):
        return await self._sock_read(sock, sock.recv_into, buf)

    async def sock_recvfrom(self, sock, bufsize):
        return await self._sock_read(sock, sock.recvfrom, bufsize)

    async def sock_recvfrom_into(self, sock, buf, nbytes=0):
        return await self._sock_read(sock, sock.recvfrom_into, buf, nbytes or len(buf))

    async def sock_sendto(self, sock, data, address):
        self._check_sock(sock)
        try:
            return sock.sendto(data, address)
        except (BlockingIOError, InterruptedError):
            pass
        return await self._sock_wait(sock, True, self._sock_call, sock.sendto, data, address)

    async def sock_sendall(self, sock, data):
        self._check_sock(sock)
        try:
            n = sock.send(data)
        except (BlockingIOError, InterruptedError):
            n = 0
        if n == len(data):
            return
        view = memoryview(data).cast("B")
        return await self._sock_wait(sock, True, self._sock_sendall_ready, view, [n])

    @staticmethod
    def _sock_sendall_ready(fut, sock, view, pos):
        if fut.done():
            return
        start = pos[0]
        try:
            n = sock.send(view[start:])
        except (BlockingIOError, InterruptedError):
            return
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            fut.set_exception(exc)
            return
        pos[0] = start = start + n
        if start == len(view):
            fut.set_result(None)

    async def sock_connect(self, sock, address):
        self._check_sock(sock)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            infos = await self._ensure_resolved(address, family=sock.family,
                                                type=sock.type, proto=sock.proto)
            address = infos[0][4]
        try:
            sock.connect(address)
            return
        except (BlockingIOError, InterruptedError):
            pass
        return await self._sock_wait(sock, True, self._sock_connect_ready, address)

    @staticmethod
    def _sock_connect_ready(fut, sock, address):
        if fut.done():
            return
        try:
            err = connect_result(sock)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            fut.set_exception(exc)
            return
        if err is None:
            return    # spurious readiness of a reused fd: keep waiting
        if err:
            fut.set_exception(OSError(err, f"Connect call failed {address}"))
        else:
            fut.set_result(None)

    async def sock_accept(self, sock):
        self._check_sock(sock)
        try:
            conn, address = sock.accept()
        except (BlockingIOError, InterruptedError):
            conn, address = await self._sock_wait(sock, False, self._sock_call, sock.accept)
        conn.setblocking(False)
        return conn, address

    async def sock_sendfile(self, sock, file, offset=0, count=None, *, fallback=True):
        """The fallback only (read and ``sock_sendall``): no ``os.sendfile``."""
        if not fallback:
            raise asyncio.SendfileNotAvailableError(
                "looplab's loop has no native sendfile; use fallback=True")
        self._check_sendfile_args(file, offset, count)
        if offset:
            file.seek(offset)
        total = 0
        try:
            while count is None or total < count:
                want = 65536 if count is None else min(65536, count - total)
                data = file.read(want)
                if not data:
                    break
                await self.sock_sendall(sock, data)
                total += len(data)
            return total
        finally:
            if total:
                file.seek(offset + total)

    # ------------------------------------------------------------------ signals

    def add_signal_handler(self, sig, callback, *args):
        if asyncio.iscoroutine(callback) or asyncio.iscoroutinefunction(callback):
            raise TypeError("coroutines cannot be used with add_signal_handler()")
        self._check_closed()
        if isinstance(sig, bool) or not isinstance(sig, int):
            raise TypeError(f"sig must be an int, not {sig!r}")
        if threading.current_thread() is not threading.main_thread():
            raise ValueError("set_wakeup_fd only works in main thread of the main interpreter")
        try:
            Loop.add_signal_handler(self, sig, _copy_context().run, callback, *args)
        except RuntimeError as exc:
            cause = exc.__cause__
            # asyncio's contract: an uncatchable signal (EINVAL: SIGKILL, SIGSTOP) is a
            # RuntimeError; any other OS error is raised as itself
            if isinstance(cause, OSError) and cause.errno != errno.EINVAL:
                raise cause from None
            if isinstance(cause, OSError):
                raise RuntimeError(f"sig {sig} cannot be caught") from None
            raise

    def remove_signal_handler(self, sig):
        if isinstance(sig, bool) or not isinstance(sig, int):
            raise TypeError(f"sig must be an int, not {sig!r}")
        return Loop.remove_signal_handler(self, sig)

    # ------------------------------------------------------------------ errors & debug

    def default_exception_handler(self, context):
        """Log ``context`` to the ``asyncio`` logger, as asyncio's loop does."""
        message = context.get("message") or "Unhandled exception in event loop"
        exception = context.get("exception")
        exc_info = (type(exception), exception, exception.__traceback__) if exception else False
        lines = [message]
        for key in sorted(context):
            if key in ("message", "exception"):
                continue
            try:
                lines.append(f"{key}: {context[key]!r}")
            except Exception:
                lines.append(f"{key}: <unprintable>")
        logger.error("\n".join(lines), exc_info=exc_info)

    def call_exception_handler(self, context):
        handler = self._exception_handler
        if handler is None:
            try:
                self.default_exception_handler(context)
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException:
                logger.error("Exception in default exception handler", exc_info=True)
            return
        try:
            ctx = None
            thing = context.get("task") or context.get("handle")
            if thing is not None and hasattr(thing, "get_context"):
                ctx = thing.get_context()
            if ctx is not None:
                ctx.run(handler, self, context)
            else:
                handler(self, context)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            try:
                self.default_exception_handler({
                    "message": "Unhandled error in exception handler",
                    "exception": exc, "context": context})
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException:
                logger.error("Exception in default exception handler while handling "
                             "an unexpected error in custom exception handler", exc_info=True)

    def _callback_failed(self, callback, exc):
        # the reactor's report, named after the callback inside context.run
        if isinstance(callback, (AioHandle, AioTimerHandle)) and callback._args:
            name = _callback_name(callback._args[0])
            ctx = {"message": f"Exception in callback {name}", "exception": exc,
                   "handle": callback}
            source = getattr(callback, "_source_traceback", None)
            if source:
                ctx["source_traceback"] = source
        else:
            if _is_bound(callback) and callback.args:
                # context.run's callback, or in debug mode _run_timed's
                callback = callback.args[0]
                if callback.__class__ is _IOCallback:
                    callback = callback.callback
            ctx = {"message": f"Exception in I/O callback {_callback_name(callback)}",
                   "exception": exc, "callback": callback}
        self.call_exception_handler(ctx)

    def get_debug(self):
        """Shadowed in ``set_debug`` by a C callable returning the flag."""
        return self._debug

    def set_debug(self, enabled):
        self._debug = enabled = bool(enabled)
        self._checked_calls = enabled or self._closed
        self.get_debug = itertools.repeat(enabled).__next__


def new_event_loop(**options) -> AioLoop:
    """An ``AioLoop`` with the callback kernel's options (``LOOP_OPTIONS``):
    ``asyncio.run(main(), loop_factory=new_event_loop)`` or
    ``loop_factory=functools.partial(new_event_loop, write="defer")``. A bad
    option raises ``OptionError`` (one line naming the valid values)."""
    io = options.pop("io", None)
    return AioLoop(io=io, **options)
