"""The callback kernel's reactor: ``Loop`` (a select/epoll loop that runs
callbacks) and its ``Handle``/``TimerHandle``. Opening connections and
``Server`` are in ``network.py``, the options (``OPTIONS``) in ``options.py``.

One pass of the loop (an *iteration*) is::

    select(timeout)          timeout 0 if callbacks are ready or stop() was called,
                             else until the nearest timer, else forever
    dispatch I/O             every ready fd's reader/writer callback, called in place
    due timers -> ready      in deadline order; equal deadlines in scheduling order
    run the ready queue      exactly the callbacks queued *now*; what they schedule
                             waits for the next pass

That is asyncio's shape with one deliberate difference: asyncio wraps each I/O
readiness in a ``Handle`` and queues it behind the ready callbacks, we call the
reader or writer directly from the select loop. That saves an allocation and a
deque round-trip per event, which is most of a reactor's overhead at the
transport level. Its visible effects: within a pass, I/O callbacks run *before*
the callbacks that were already queued (asyncio runs those first), and what an
I/O callback schedules with ``call_soon`` runs in the same pass, one select
syscall sooner than in asyncio. Relative order among ``call_soon`` callbacks is
FIFO as in asyncio, and what a ready callback schedules still waits for the next
pass, so ``close()`` + ``stop()`` inside a task step leaves the close pending
exactly as in asyncio (the 2016 shutdown bug), and ``close()`` then one
``sleep(0)`` completes it.

The loop is ``Loop.run_forever``; its ``while`` loop carries a signpost.

Registrations are one small list per fd, ``[reader, writer, stream]``, in a dict
the dispatcher indexes by fd. Each callback slot holds a callable that takes no
arguments: the callback itself, or (when it was registered with arguments) the
callback bound to them once, at registration. ``stream`` is a transport whose
plain read the pass does itself (``_add_stream_reader``), as libuv's loop reads
for a stream and hands over the bytes: the pass calls ``recv`` and the protocol's
``data_received``, one Python frame less per read than calling the transport's
``_read_ready``, which stays the reader it stands for. A plain ``cb()`` is a
cheaper call than ``cb(*args)``: CPython 3.11 runs a Python callee called that
way in the same interpreter loop, while a star-call goes through C and a nested
one. An event that is only "readable" (the common case) takes a short path that
tests the mask with one integer comparison. Removing a callback clears its slot and the dispatcher reads the slot at dispatch time, so a
callback removed earlier in the same batch never runs. The poller is only
touched when the *mask* of an fd changes. Poller, wake-up pair and clock come
from the I/O seam (``kernels.io``; on Linux the poller's ``wait`` is epoll's
own ``poll``, called with no Python frame in between). The price of indexing
by fd is that an fd closed and reused within one batch may see one spurious
readiness; every callback here tolerates that (non-blocking calls, and a
connect is confirmed with ``getpeername`` before it counts).

The loop keeps a registry of live transports and servers: ``close()`` releases
all of them, whatever the application forgot, and applies the ``exit`` policy to
bytes still sitting in transport buffers. Threads and signals reach the loop
through the seam's wake-up pair: ``call_soon_threadsafe`` calls ``wake()``,
``signal.set_wakeup_fd`` writes the signal number to it.
"""
from __future__ import annotations

import collections
import functools
import heapq
import itertools
import signal
import sys
import threading

from .. import choice as _choice
from .. import io as _io
from .options import OPTIONS
from ..probe import Probe
from .network import Networking, Server

__all__ = ["Loop", "Handle", "TimerHandle", "Server", "UnsentDataError", "get_running_loop",
           "OPTIONS"]



_running = threading.local()


def get_running_loop() -> "Loop":
    """The ``Loop`` running in this thread. RuntimeError if none is."""
    loop = getattr(_running, "loop", None)
    if loop is None:
        raise RuntimeError("no running looplab callback loop in this thread")
    return loop


class UnsentDataError(RuntimeError):
    """``Loop.close()`` under ``exit="raise"`` found bytes still buffered in
    transports. Raised after everything was released; ``bytes_unsent`` says how
    many bytes the application believed were written and never reached the OS."""

    def __init__(self, bytes_unsent: int):
        super().__init__(f"{bytes_unsent} bytes were still buffered in transports "
                         "when the loop closed; they were dropped")
        self.bytes_unsent = bytes_unsent


class Handle:
    """A callback queued on the loop. ``cancel()`` before it runs and it never
    runs; cancelling drops the references to the callback and its arguments."""
    __slots__ = ("_callback", "_args", "_cancelled")

    def __init__(self, callback, args):
        self._callback = callback
        self._args = args
        self._cancelled = False

    def cancel(self) -> None:
        if not self._cancelled:
            self._cancelled = True
            self._callback = None
            self._args = None

    def cancelled(self) -> bool:
        return self._cancelled

    def __repr__(self):
        state = "cancelled" if self._cancelled else _callback_name(self._callback)
        return f"<{type(self).__name__} {state}>"


class TimerHandle(Handle):
    """A callback due at ``when()`` (loop time). Cancelled timers stay in the heap
    until they come due or the loop compacts it; the loop counts them for that."""
    __slots__ = ("_when", "_loop", "_scheduled")

    def __init__(self, when, callback, args, loop):
        super().__init__(callback, args)
        self._when = when
        self._loop = loop
        self._scheduled = True

    def when(self) -> float:
        return self._when

    def cancel(self) -> None:
        if not self._cancelled and self._scheduled:
            self._loop._timers_cancelled += 1
        super().cancel()


def _callback_name(cb) -> str:
    return getattr(cb, "__qualname__", None) or repr(cb)


def _no_args(callback, args):
    """A reader or writer registered with arguments, bound to them once, as a
    plain ``functools.partial``: on 3.11 a subclass of it loses the vectorcall
    path and every call builds an argument tuple. The mark tells the loop's
    failure report to name the callback inside (``.func``), not a partial an
    app registered itself."""
    if not args:
        return callback
    bound = functools.partial(callback, *args)
    bound._looplab_bound = True
    return bound


def _registered(cb):
    """What was registered: the callback inside a partial ``_no_args`` made."""
    return cb.func if _is_bound(cb) else cb


def _is_bound(cb) -> bool:
    return cb.__class__ is functools.partial and "_looplab_bound" in cb.__dict__


def _noop():
    pass


def _fileno(fd_or_sock) -> int:
    if isinstance(fd_or_sock, int):
        fd = fd_or_sock
    else:
        try:
            fd = fd_or_sock.fileno()
        except AttributeError:
            raise TypeError(f"expected a file descriptor (int) or an object with fileno(), "
                            f"got {type(fd_or_sock).__name__}") from None
        if not isinstance(fd, int):
            raise TypeError(f"fileno() returned {type(fd).__name__}, not int")
    if fd < 0:
        raise ValueError(f"invalid file descriptor {fd} (closed socket?)")
    return fd


def _default_exception_handler(context) -> None:
    """One line on stderr: what failed and the exception's repr."""
    message = context.get("message") or "unhandled error in the event loop"
    exc = context.get("exception")
    line = f"looplab callback loop: {message}"
    if exc is not None:
        line += f": {exc!r}"
    stream = sys.stderr
    if stream is not None:
        try:
            stream.write(line.replace("\n", " ") + "\n")
            stream.flush()
        except (OSError, ValueError):
            pass


class Loop(Networking):
    """A single-threaded reactor. Not thread-safe except ``call_soon_threadsafe``.

    ``io`` is the I/O-and-time seam (``kernels.io``; None: the real OS). The
    options are ``OPTIONS``; a bad one raises ``OptionError`` naming the valid
    values:

    ``high_water``, ``low_water``
        default write-buffer limits of every transport (64 KiB / 16 KiB).
    ``write``
        ``"try-send"`` (asyncio: ``write()`` on an empty buffer tries
        ``sock.send`` at once and buffers only the rest) or ``"defer"``
        (Twisted: ``write()`` only appends; the writable callback sends).
    ``write_after_close``, ``limits_recheck``, ``writelines``, ``write_buffer``, ``buffer_on_loss``
        one edge of an older or newer library each, off by default (see the
        transport module): a late write dropped (3.12.0-3.12.8), limits stored
        without the pause check (asyncio 3.4.0), ``writelines`` without it
        (3.12.0-3.12.8), a deque buffer summed per write (3.12+), a lost
        buffer's memory held (uvloop 548).
    ``exit``
        what happens to bytes still in transport buffers when the loop ends:
        ``"cancel"`` (asyncio: ``close()`` drops them and counts them as
        ``lost_on_exit_bytes``), ``"wait"`` (``run_forever`` keeps running after
        ``stop()`` until every buffer is flushed and every closing transport has
        closed, for at most ``exit_wait_s`` seconds; a second ``stop()`` during that
        wait ends it at once), ``"raise"`` (like cancel, then ``close()`` raises
        ``UnsentDataError``).
    ``trace``
        record Chrome trace events in ``probe.trace``.
    """

    #: the "wait" exit policy gives up after this many seconds; what is left is
    #: then dropped (and counted as lost) by close().
    exit_wait_s = 10.0

    def __init__(self, *, io=None, **options):
        self.options = options = OPTIONS.validate(options)
        trace = options["trace"]
        self._io = io = _io.REAL if io is None else io
        # The clock, bound once: loop.time() is io.time itself, no frame in between.
        self.time = io.time
        self.probe = Probe(trace=trace)

        # Handles to run this pass. kernels.hybrid appends its Tasks' reusable
        # step handles here directly (checking _closed first, as call_soon does).
        self._ready = collections.deque()
        self._timers = []                 # heap of (when, seq, TimerHandle)
        self._timer_seq = itertools.count()
        self._timers_cancelled = 0
        self._poller = io.poller()
        # An explorer's chooser (kernels.choice), only on a seam that carries one.
        self._chooser = getattr(io, "chooser", None)
        self._fds = {}                    # fd -> [reader, writer], called with no arguments
        self._running = False
        self._stopping = False
        self._closed = False
        self._exception_handler = None

        self._transports = set()          # live SocketTransports (until connection_lost)
        self._servers = set()
        self._connecting = {}             # fd -> socket of a pending create_connection

        self._signal_handlers = {}
        self._old_wakeup_fd = None
        try:
            self._waker = io.waker()
        except BaseException:
            self._poller.close()
            raise
        try:
            self._add_reader(self._waker.fileno(), self._read_self, ())
        except BaseException:
            self._waker.close()
            self._poller.close()
            raise

    def __repr__(self):
        state = "closed" if self._closed else "running" if self._running else "idle"
        return f"<looplab callback Loop {state} {self.options}>"

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    # ------------------------------------------------------------------ time & callbacks

    def time(self) -> float:
        """The loop's clock: ``io.time()``, ``time.monotonic()`` for the real OS
        (system-wide on Linux, so peers in other processes can timestamp frames
        against it). ``__init__`` shadows this method with the clock itself."""
        return self._io.time()

    def _check_closed(self):
        if self._closed:
            raise RuntimeError("the loop is closed")

    def call_soon(self, callback, *args) -> Handle:
        """Run ``callback(*args)`` on a later pass, FIFO with other ``call_soon``\\ s."""
        if self._closed:
            raise RuntimeError("the loop is closed")
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {type(callback).__name__}")
        handle = Handle(callback, args)
        self._ready.append(handle)
        return handle

    def call_later(self, delay, callback, *args) -> TimerHandle:
        """Run ``callback(*args)`` ``delay`` seconds from now (no earlier)."""
        if isinstance(delay, bool) or not isinstance(delay, (int, float)):
            raise TypeError(f"delay must be a number of seconds, got {type(delay).__name__}")
        if delay != delay:
            raise ValueError("delay must not be NaN")
        return self.call_at(self.time() + delay, callback, *args)

    def call_at(self, when, callback, *args) -> TimerHandle:
        """Run ``callback(*args)`` once ``loop.time() >= when``. Timers with equal
        deadlines run in the order they were scheduled."""
        if self._closed:
            raise RuntimeError("the loop is closed")
        if isinstance(when, bool) or not isinstance(when, (int, float)) or when != when:
            raise TypeError(f"when must be a number (loop time), got {when!r}")
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {type(callback).__name__}")
        handle = TimerHandle(when, callback, args, self)
        heapq.heappush(self._timers, (when, next(self._timer_seq), handle))
        return handle

    def call_soon_threadsafe(self, callback, *args) -> Handle:
        """``call_soon`` from any thread; wakes the loop if it is blocked in select.

        ``deque.append`` is atomic, so the only extra work is one byte on the
        wake-up pair. A full pair means a wake-up is already pending: ignored."""
        handle = self.call_soon(callback, *args)
        self._waker.wake()
        return handle

    def _read_self(self):
        """Drain the wake-up pair; non-zero bytes are signal numbers from
        ``signal.set_wakeup_fd``: queue their handlers."""
        data = self._waker.drain()
        handlers = self._signal_handlers
        if handlers:
            for signum in data:
                if signum:
                    handle = handlers.get(signum)
                    if handle is not None:
                        self._ready.append(handle)

    # ------------------------------------------------------------------ fd registrations

    def _add_reader(self, fd, callback, args):
        entry = self._fds.get(fd)
        if entry is None:
            self._poller.register(fd, _io.READ)
            self._fds[fd] = [_no_args(callback, args), None, None]
        else:
            had_reader = entry[0] is not None
            entry[0] = _no_args(callback, args)
            stream = entry[2]
            if stream is not None:
                stream._deliver = None     # (its _reader_run stays: a read under way ends in it)
                entry[2] = None
            if not had_reader:
                self._poller.modify(fd, _io.READ | _io.WRITE)

    def _add_stream_reader(self, fd, transport):
        """Read ``transport`` (a ``SocketTransport`` on the plain read path) on
        each readiness of ``fd`` in the pass itself: what its ``_read_ready``
        does, without the call (see the module docstring). The pass hands the
        bytes to ``transport._deliver``, its protocol's ``data_received`` bound
        here, as uvloop binds it when the protocol is set. The reader slot
        holds ``_read_ready`` all the same, for whoever looks at the
        registration."""
        self._add_reader(fd, transport._read_ready, ())
        transport._deliver = transport._protocol.data_received
        self._fds[fd][2] = transport

    def _add_writer(self, fd, callback, args):
        entry = self._fds.get(fd)
        if entry is None:
            self._poller.register(fd, _io.WRITE)
            self._fds[fd] = [None, _no_args(callback, args), None]
        else:
            had_writer = entry[1] is not None
            entry[1] = _no_args(callback, args)
            if not had_writer:
                self._poller.modify(fd, _io.READ | _io.WRITE)

    def _remove_reader(self, fd) -> bool:
        entry = self._fds.get(fd)
        if entry is None or entry[0] is None:
            return False
        stream = entry[2]
        if stream is not None:
            stream._deliver = None     # (its _reader_run stays: a read under way ends in it)
        entry[0] = entry[2] = None
        try:
            if entry[1] is None:
                del self._fds[fd]
                self._poller.unregister(fd)
            else:
                self._poller.modify(fd, _io.WRITE)
        except (OSError, ValueError, KeyError):
            pass   # the fd was closed under us: the kernel forgot it already
        return True

    def _remove_writer(self, fd) -> bool:
        entry = self._fds.get(fd)
        if entry is None or entry[1] is None:
            return False
        entry[1] = None
        try:
            if entry[0] is None:
                del self._fds[fd]
                self._poller.unregister(fd)
            else:
                self._poller.modify(fd, _io.READ)
        except (OSError, ValueError, KeyError):
            pass
        return True

    def add_reader(self, fd, callback, *args) -> None:
        """Call ``callback(*args)`` whenever ``fd`` (an int or anything with
        ``fileno()``) is readable; replaces a previous reader of that fd.
        The callback runs straight from the select loop, without a Handle."""
        self._check_closed()
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {type(callback).__name__}")
        self._add_reader(_fileno(fd), callback, args)

    def add_writer(self, fd, callback, *args) -> None:
        """Like ``add_reader``, for writability."""
        self._check_closed()
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {type(callback).__name__}")
        self._add_writer(_fileno(fd), callback, args)

    def remove_reader(self, fd) -> bool:
        """Stop watching ``fd`` for reading; False if it was not watched."""
        if self._closed:
            return False
        try:
            fd = _fileno(fd)
        except ValueError:
            return False
        return self._remove_reader(fd)

    def remove_writer(self, fd) -> bool:
        """Stop watching ``fd`` for writing; False if it was not watched."""
        if self._closed:
            return False
        try:
            fd = _fileno(fd)
        except ValueError:
            return False
        return self._remove_writer(fd)

    # ------------------------------------------------------------------ errors

    def set_exception_handler(self, handler) -> None:
        """``handler(loop, context)`` receives every error a callback raised (and
        warnings such as writes after close). None restores the default, which
        prints one line to stderr."""
        if handler is not None and not callable(handler):
            raise TypeError(f"exception handler must be callable or None, "
                            f"got {type(handler).__name__}")
        self._exception_handler = handler

    def get_exception_handler(self):
        return self._exception_handler

    def default_exception_handler(self, context) -> None:
        _default_exception_handler(context)

    def call_exception_handler(self, context) -> None:
        """Report ``context`` (``"message"``, ``"exception"``, ...). Never raises,
        except KeyboardInterrupt/SystemExit: an error inside a custom handler is
        reported by the default handler together with the original context."""
        handler = self._exception_handler
        if handler is None:
            try:
                _default_exception_handler(context)
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException:
                pass
            return
        try:
            handler(self, context)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            try:
                _default_exception_handler(
                    {"message": "error in the custom exception handler", "exception": exc})
                _default_exception_handler(context)
            except BaseException:
                pass

    def _callback_failed(self, callback, exc):
        if isinstance(callback, Handle):
            ctx = {"message": f"exception in callback {_callback_name(callback._callback)}",
                   "exception": exc, "handle": callback}
        else:
            callback = _registered(callback)
            ctx = {"message": f"exception in I/O callback {_callback_name(callback)}",
                   "exception": exc, "callback": callback}
        self.call_exception_handler(ctx)

    # ------------------------------------------------------------------ running

    def is_running(self) -> bool:
        return self._running

    def is_closed(self) -> bool:
        return self._closed

    def stop(self) -> None:
        """Make ``run_forever`` return after the current pass (``exit="wait"``: once
        transport buffers are flushed). Called before ``run_forever``, the next run
        does one pass and returns -- asyncio's semantics."""
        self._stopping = True

    def run_forever(self) -> None:
        """Run passes until ``stop()``. KeyboardInterrupt/SystemExit raised by a
        callback propagate out of here; the loop stays closable."""
        self._check_closed()
        if self._running:
            raise RuntimeError("this loop is already running")
        if getattr(_running, "loop", None) is not None:
            raise RuntimeError("another loop is already running in this thread")
        self._running = True
        _running.loop = self

        # Everything the pass touches is bound to a local once: attribute and
        # global lookups are a measurable share of a Python reactor's overhead.
        ready = self._ready
        popleft = ready.popleft
        ready_append = ready.append
        timers = self._timers
        heappop = heapq.heappop
        wait = self._poller.wait
        chooser = self._chooser
        if chooser is not None:
            wait = self._chosen_wait(wait, chooser)
        fds = self._fds
        monotonic = self._io.time
        wait_timeout = _io.wait_timeout
        needs_compaction = _io.heap_needs_compaction
        readable = _io.READABLE
        writable = _io.WRITABLE
        read_only = _io.READ            # a mask that is readable and nothing else
        probe = self.probe
        failed = self._callback_failed
        wait_exit = self.options["exit"] == "wait"
        draining = False
        drain_deadline = drain_guard = None
        # passes and callbacks run, kept in locals while the loop runs and added
        # to the probe when it stops (an attribute update per pass is measurable):
        # read from a callback, the probe's counts lag, as the coro kernel's do
        passes = ran = 0
        try:
            # This while loop is our event loop: every callback, I/O readiness
            # and timer of the callback kernel (and every hybrid Task step) runs
            # inside one of its passes.
            while True:
                if ready or self._stopping:
                    timeout = 0
                elif timers:
                    timeout = wait_timeout(timers[0][0], monotonic())
                else:
                    timeout = None
                events = wait(timeout)
                # callbacks run: one per event, corrected on the rare paths below
                # (no entry, no callback, nothing readable), so the common event
                # costs no count of its own
                ran += len(events)
                for fd, mask in events:
                    try:
                        entry = fds[fd]
                    except KeyError:
                        ran -= 1
                        continue
                    # only readable, the common event, takes one compare where the
                    # general test is two ands (an int & is not specialised on 3.11)
                    if mask == read_only or mask & readable:
                        t = entry[2]
                        if t is not None:
                            # a stream transport's read, done here: SocketTransport.
                            # _read_ready, step for step (tests/test_callback.py
                            # runs both paths)
                            try:
                                recv = t._recv      # an attribute, not a method: no lookup
                                data = recv()
                            except (BlockingIOError, InterruptedError):
                                pass
                            except (SystemExit, KeyboardInterrupt):
                                raise
                            except BaseException as exc:
                                t._read_failed(exc, "fatal read error on socket transport")
                            else:
                                if data:
                                    t.stats.received_bytes += len(data)
                                    deliver = t._deliver
                                    try:
                                        deliver(data)
                                    except (SystemExit, KeyboardInterrupt):
                                        raise
                                    except BaseException as exc:
                                        t._read_failed(exc, "protocol.data_received() failed")
                                else:
                                    t._read_ended()
                        else:
                            cb = entry[0]
                            if cb is not None:
                                try:
                                    cb()
                                except (SystemExit, KeyboardInterrupt):
                                    raise
                                except BaseException as exc:
                                    failed(cb, exc)
                            else:
                                ran -= 1
                    else:
                        ran -= 1
                    if mask != read_only and mask & writable:
                        cb = entry[1]   # re-read: the reader may just have removed it
                        if cb is not None:
                            ran += 1
                            try:
                                cb()
                            except (SystemExit, KeyboardInterrupt):
                                raise
                            except BaseException as exc:
                                failed(cb, exc)

                if timers:
                    now = monotonic()
                    if chooser is not None:
                        _choice.order_ties(chooser.choose, timers, now)
                    while timers and timers[0][0] <= now:
                        handle = heappop(timers)[2]
                        if handle._cancelled:
                            self._timers_cancelled -= 1
                        else:
                            handle._scheduled = False
                            ready_append(handle)
                    dead = self._timers_cancelled
                    if dead and needs_compaction(dead, len(timers)):
                        self._compact_timers()

                if ready:               # empty on most passes of a busy server: one test
                    ntodo = len(ready)
                    if ntodo > probe.ready_max:
                        probe.ready_max = ntodo
                    if ntodo > 1 and chooser is not None:
                        # the explorer picks which of those queued now runs next, one
                        # at a time (a callback of this batch only appends behind them)
                        batch = [popleft() for _ in range(ntodo)]
                        ready.extendleft(reversed(_choice.permute(
                            chooser.choose, _choice.READY, batch)))
                    while ntodo:
                        ntodo -= 1
                        handle = popleft()
                        if handle._cancelled:
                            continue
                        ran += 1
                        try:
                            handle._callback(*handle._args)
                        except (SystemExit, KeyboardInterrupt):
                            raise
                        except BaseException as exc:
                            failed(handle, exc)
                passes += 1

                if self._stopping or draining:
                    if not wait_exit:
                        break
                    # exit="wait": keep serving until transports are flushed and
                    # closed. The first stop() starts the drain, another ends it.
                    if self._stopping:
                        if draining:
                            break
                        draining = True
                        self._stopping = False
                        drain_deadline = monotonic() + self.exit_wait_s
                        drain_guard = self.call_at(drain_deadline, _noop)  # wakes select
                    if not self._exit_pending() or monotonic() >= drain_deadline:
                        break
        finally:
            probe.loop_iterations += passes
            probe.callbacks_run += ran
            if drain_guard is not None:
                drain_guard.cancel()
            self._stopping = False
            self._running = False
            _running.loop = None

    def _chosen_wait(self, wait, chooser):
        """The poller's ``wait`` with an explorer's choice of the order in which
        the pass dispatches what it returned (kernels.choice)."""
        ready, timers, monotonic = self._ready, self._timers, self._io.time

        def chosen(timeout):
            return _choice.poll_order(chooser.choose, wait(timeout), bool(ready) or bool(
                timers and timers[0][0] <= monotonic()))
        return chosen

    def _exit_pending(self) -> bool:
        for transport in self._transports:
            if transport._closing or transport._buffer:
                return True
        return False

    def _compact_timers(self):
        self._timers[:] = [entry for entry in self._timers if not entry[2]._cancelled]
        heapq.heapify(self._timers)
        self._timers_cancelled = 0

    def run_until_complete(self, future):
        """Run until ``future`` is done and return its result (or raise its
        exception). Duck-typed: ``add_done_callback(fn)``, ``done()``, ``result()``
        (and ``remove_done_callback`` if it has one). RuntimeError if the loop
        stops before the future completes."""
        for name in ("add_done_callback", "done", "result"):
            if not callable(getattr(future, name, None)):
                raise TypeError(f"run_until_complete needs a future-like object with "
                                f"{name}(); got {type(future).__name__}")

        def stop_when_done(_fut):
            self.stop()

        future.add_done_callback(stop_when_done)
        try:
            self.run_forever()
        finally:
            remove = getattr(future, "remove_done_callback", None)
            if remove is not None:
                remove(stop_when_done)
        if not future.done():
            raise RuntimeError("loop stopped before the future completed")
        return future.result()

    # ------------------------------------------------------------------ signals

    def add_signal_handler(self, signum, callback, *args) -> None:
        """Run ``callback(*args)`` on the loop when ``signum`` arrives. The C-level
        handler writes the signal number to the wake-up pair (``set_wakeup_fd``), so a
        blocked select wakes. Main thread only (a Python rule)."""
        self._check_closed()
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("signal handlers can only be added from the main thread")
        if isinstance(signum, bool) or not isinstance(signum, int):
            raise TypeError(f"signum must be an int, got {type(signum).__name__}")
        if not 1 <= signum < signal.NSIG:
            raise ValueError(f"signal number {signum} out of range 1..{signal.NSIG - 1}")
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {type(callback).__name__}")
        if not self._signal_handlers:
            fd = self._waker.signal_fd()
            if fd is None:
                raise RuntimeError(f"signals can't wake this loop's I/O ({self._io!r})")
            self._old_wakeup_fd = signal.set_wakeup_fd(fd, warn_on_full_buffer=False)
        self._signal_handlers[signum] = Handle(callback, args)
        try:
            # A do-nothing Python handler: the work happens on the loop. Without it
            # the default action (e.g. terminate) would run.
            signal.signal(signum, _noop_signal_handler)
            signal.siginterrupt(signum, False)
        except (OSError, ValueError, RuntimeError) as exc:
            del self._signal_handlers[signum]
            if not self._signal_handlers:
                self._restore_wakeup_fd()
            raise RuntimeError(f"cannot handle signal {signum}: {exc}") from exc

    def remove_signal_handler(self, signum) -> bool:
        """Restore the default disposition of ``signum``; False if we had none."""
        if signum not in self._signal_handlers:
            return False
        del self._signal_handlers[signum]
        default = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
        try:
            signal.signal(signum, default)
        except (OSError, ValueError):
            pass
        if not self._signal_handlers:
            self._restore_wakeup_fd()
        return True

    def _restore_wakeup_fd(self):
        old, self._old_wakeup_fd = self._old_wakeup_fd, None
        try:
            signal.set_wakeup_fd(-1 if old is None else old)
        except ValueError:   # not the main thread any more: nothing we can do
            pass

    # ------------------------------------------------------------------ close & exit policy

    def close(self) -> None:
        """Release everything: servers, transports (the ``exit`` policy decides
        what their unsent bytes mean), pending connects, signal handlers, the
        wake-up pair and the poller. Idempotent. RuntimeError on a running loop.

        Protocols are *not* told (no ``connection_lost``): the loop that would run
        the callback is going away, as with asyncio's ``loop.close()``."""
        if self._running:
            raise RuntimeError("cannot close a running loop; stop() it first")
        if self._closed:
            return
        self._closed = True
        policy = self.options["exit"]
        open_count = len(self._transports)
        unsent = 0
        for transport in list(self._transports):
            unsent += transport._abandon_at_exit()
        self._transports.clear()
        for server in list(self._servers):
            server.close()
        for sock in self._connecting.values():
            sock.close()
        self._connecting.clear()
        for signum in list(self._signal_handlers):
            self.remove_signal_handler(signum)
        self._ready.clear()
        self._timers.clear()
        self._fds.clear()
        self._poller.close()
        self._waker.close()
        self.probe.exit_report = {"policy": policy, "transports_open_count": open_count,
                                  "unsent_bytes": unsent}
        if policy == "raise" and unsent:
            raise UnsentDataError(unsent)

def _noop_signal_handler(signum, frame):
    pass
