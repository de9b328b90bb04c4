"""The coro kernel proper: tasks, traps, the run loop, cancellation and timeouts.

Everything a task can ask of the kernel goes through a *trap*: a small tuple
``(opcode, arg, ...)`` that a generator-based coroutine yields and the run loop
dispatches through a table. The kernel's side of the conversation is two calls:
``coro.send(value)`` and ``coro.throw(exc)``. Nothing else crosses the line, so
reading the trap handlers below is reading the kernel's whole contract.

The state is a few structures and counters, all closed over by one
function (``Kernel._build``), curio-style, so the loop and the handlers reach
them as fast local/cell loads instead of attribute lookups:

* ``ready``    -- a deque of tasks to step on the next loop pass;
* ``sleeping`` -- a heap of ``(deadline, seq, task_or_scope)`` timer entries.
  Entries are cancelled *lazily*: the owner's ``_timer`` slot points at its one
  live entry, and a popped entry that isn't it is dropped. When dead entries
  pile up (many short timeout blocks around fast operations) the heap is
  rebuilt, so a long-lived server doesn't accumulate them;
* ``fdmap``    -- ``fileobj -> [mask, reader, writer, fileobj, fd]``; the
  same list is in ``fdrecs`` under its fd, which is how a poll result finds
  it (the loop polls epoll directly, see "Polling"). Interest is dropped
  lazily: a task that was woken for reading and then blocks on the same
  socket again (the normal life of a connection handler) costs no
  ``epoll_ctl`` at all; an interest nobody waits on any more is removed the
  first time it fires;
* ``tasks``    -- every live task by id, in creation order (the exit policy
  cancels newest first).

A task runs until it *blocks*: non-blocking traps (spawn, current_task,
entering a timeout block) are answered at once and the same task is stepped
again without a trip through the ready queue. That is why a socket send that
doesn't block costs no scheduling at all under the default options, and why
``io_schedule_point=True`` (trio's rule that every I/O call is a checkpoint)
is a visible, measurable change.

Cancellation is *delivered at blocking traps only*. ``task.cancel()`` on a
blocked task unhooks it from whatever it waits on and throws ``Cancelled`` into
it; on a task that is ready or running it sets ``_pending`` and the exception
waits for the task's next blocking trap. Timeouts are cancel scopes with a
deadline: a scope pushed on the task's scope stack, a timer entry, and when the
entry fires the same delivery path. ``cancel="edge"`` (curio) delivers each
cancellation once; ``cancel="level"`` (trio) keeps raising it at every
blocking trap for as long as the task (or the expired block) lives. When
``run()`` tears tasks down at exit they are switched to level delivery, so a
task that swallows one ``Cancelled`` can't keep the kernel alive.

Hazards, stated once: trap handlers and ``on_done`` callbacks run inside the
kernel and must not raise for ordinary bad input (they hand the error to the
task instead); a file descriptor closed behind the kernel's back without
``io_release`` is detected when its number is reused, not before.
"""
from __future__ import annotations

import heapq
import itertools
import random
import select
import signal
import socket
import sys
import threading
import time
import types
import weakref
from collections import deque
from selectors import EVENT_READ, EVENT_WRITE, DefaultSelector
from types import CoroutineType

from ..probe import Probe

__all__ = [
    "Kernel", "run", "Task", "Cancelled", "TaskTimeout", "BusyResourceError",
    "ClosedResourceError", "sleep", "checkpoint", "spawn", "spawn_soon", "current_task", "CancelScope",
    "timeout_after", "move_on_after", "WaitQueue", "read_wait", "write_wait", "io_release",
]


# --------------------------------------------------------------------------
# Exceptions

class Cancelled(BaseException):
    """Thrown into a task at a blocking trap when the task, or a cancel scope it
    is inside, is cancelled (curio's ``CancelledError``, trio's ``Cancelled``).

    A ``BaseException`` so that ``except Exception`` cleanup code lets it pass.
    ``scope`` is the ``CancelScope`` being cancelled, or ``None`` for
    ``task.cancel()``. ``bytes_sent`` is set by ``sendall``/``send_all`` when the
    cancellation interrupted them: that many bytes reached the OS."""
    bytes_sent = None

    def __init__(self, message: str = "cancelled", scope: "CancelScope | None" = None):
        super().__init__(message)
        self.scope = scope


class TaskTimeout(TimeoutError):
    """Raised at a blocking trap when the innermost timeout block's deadline
    passed, and out of ``timeout_after``. Carries ``scope`` and, from a send,
    ``bytes_sent``."""
    bytes_sent = None

    def __init__(self, message: str = "timed out", scope: "CancelScope | None" = None):
        super().__init__(message)
        self.scope = scope


class BusyResourceError(RuntimeError):
    """Two tasks tried to use the same direction of one resource at once (two
    receivers on a stream, two tasks waiting to read one socket)."""


class ClosedResourceError(Exception):
    """The socket or stream was closed -- by this task earlier, or by another task
    while this one was waiting on it."""


# --------------------------------------------------------------------------
# Per-thread state: the running kernel (for sync primitives such as
# Event.set() and for "awaited outside a kernel" errors) and whether I/O calls
# are checkpoints. A threading.local subclass so the class attributes serve as
# defaults in every thread.

class _ThreadState(threading.local):
    kernel = None
    checkpoint = False


_state = _ThreadState()


def _running_kernel(what: str) -> "Kernel":
    kernel = _state.kernel
    if kernel is None:
        raise RuntimeError(f"{what} needs a running coro kernel in this thread "
                           "(call it from a task started by kernels.coro.run / Kernel.run)")
    return kernel


# --------------------------------------------------------------------------
# Traps. Opcodes index the kernel's handler table. Waiting kinds (Task._wait)
# say how to unhook a blocked task; 0 means "not blocked" (ready or running).
# W_READ/W_WRITE are the reader/writer index in an fdmap record and its
# interest bits, which keeps the I/O paths free of lookups.

(_YIELD, _SLEEP, _IO_WAIT, _IO_RELEASE, _SPAWN, _JOIN, _CANCEL,
 _CURRENT, _PARK, _SCOPE_ENTER, _SCOPE_EXIT) = range(11)

W_READ, W_WRITE, W_SLEEP, W_PARK, W_SHIELDED = 1, 2, 3, 4, 5

_YIELD_TRAP = (_YIELD,)
_CURRENT_TRAP = (_CURRENT,)
_MAX_SELECT_S = 3600.0   # a far timer just re-polls hourly (a finite timeout everywhere)


@types.coroutine
def sleep(seconds):
    """Suspend the calling task for ``seconds``; ``sleep(0)`` is a checkpoint:
    the task goes to the back of the ready queue (and a pending cancellation is
    delivered). Negative or NaN -> ValueError."""
    if _state.kernel is None:
        _running_kernel("sleep()")
    if seconds == 0:
        yield _YIELD_TRAP
        return
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
        raise TypeError(f"sleep() takes a number of seconds, not {type(seconds).__name__}")
    if not seconds >= 0:   # also catches NaN
        raise ValueError(f"sleep() needs a non-negative number of seconds, got {seconds!r}")
    yield (_SLEEP, seconds)


@types.coroutine
def checkpoint():
    """``sleep(0)``: yield to the other ready tasks and take delivery of a pending
    cancellation."""
    if _state.kernel is None:
        _running_kernel("checkpoint()")
    yield _YIELD_TRAP


@types.coroutine
def spawn(fn, *args, daemon=False, on_done=None):
    """Start ``fn(*args)`` as a new task and return its ``Task``.

    With ``spawn="lazy"`` (the default) the child is only queued: it has not run
    when this returns. With ``spawn="eager"`` its first step (up to its first
    blocking trap) runs before this returns. ``daemon=True`` marks a background
    task the exit policy cancels silently. ``on_done(task)``: see ``Task``."""
    if _state.kernel is None:
        _running_kernel("spawn()")
    return (yield (_SPAWN, fn, args, daemon, on_done))


def spawn_soon(fn, *args, daemon=False, on_done=None):
    """Synchronous ``spawn`` for code running inside a task (trio's
    ``start_soon`` shape). Honours ``spawn="eager"`` the way asyncio's eager
    tasks do: the child's first step runs nested inside this call."""
    return _running_kernel("spawn_soon()")._spawn(fn, args, daemon, on_done)


@types.coroutine
def current_task():
    """The ``Task`` running the caller."""
    if _state.kernel is None:
        _running_kernel("current_task()")
    return (yield _CURRENT_TRAP)


@types.coroutine
def read_wait(fileobj):
    """Block until ``fileobj`` (a socket or an fd) is readable. One reader per fd:
    a second concurrent reader gets ``BusyResourceError``."""
    if _state.kernel is None:
        _running_kernel("read_wait()")
    yield (_IO_WAIT, fileobj, W_READ)


@types.coroutine
def write_wait(fileobj):
    """Block until ``fileobj`` is writable. One writer per fd."""
    if _state.kernel is None:
        _running_kernel("write_wait()")
    yield (_IO_WAIT, fileobj, W_WRITE)


@types.coroutine
def io_release(fileobj):
    """Forget ``fileobj``: unregister it from the poller and wake any task
    still waiting on it with ``ClosedResourceError``. Call before closing.
    Never blocks and never delivers a cancellation, so it is safe in cleanup."""
    if _state.kernel is None:
        _running_kernel("io_release()")
    yield (_IO_RELEASE, fileobj)


# --------------------------------------------------------------------------
# Tasks

class Task:
    """A coroutine the kernel steps. Made by ``spawn``; not constructed directly.

    ``await task.join()`` returns the result or re-raises the task's exception
    as is (including its ``Cancelled``). ``await task.cancel()`` requests
    cancellation and waits for the task to end; it returns ``False`` if the
    task had already finished. An exception nobody joins is not lost: if no
    joiner or ``on_done`` callback takes it, one line goes to stderr when the
    task is dropped or when ``run()`` ends, whichever is first.

    ``on_done(task)`` callbacks run inside the kernel the moment the task
    finishes, before any joiner resumes. They must not block and may use only
    synchronous primitives (``WaitQueue.wake``, ``spawn_soon``,
    ``Task.cancel_soon``, ``CancelScope.cancel``). A task with an ``on_done``
    callback is supervised: its exception is the callback's to handle.
    """
    __slots__ = ("id", "coro", "daemon", "_value", "_exc", "_wait", "_wait_obj", "_timer",
                 "_pending", "_cancel", "_scopes", "_done", "_result", "_exception",
                 "_joiners", "_callbacks", "_crash", "_flow", "__weakref__")

    def __init__(self, task_id: int, coro, daemon: bool):
        self.id = task_id
        self.coro = coro
        self.daemon = daemon
        self._value = None          # what the next send() passes in
        self._exc = None            # or what the next throw() raises
        self._wait = 0              # W_* while blocked; 0 when ready/running
        self._pending = False       # a cancellation may be waiting for a blocking trap
        self._cancel = 0            # 0 no, 1 requested, 2 delivered (edge), 3 doomed (level)
        self._scopes = None         # stack of entered CancelScopes
        self._done = False
        self._joiners = None        # list of tasks blocked in join()/cancel()
        self._callbacks = None      # on_done callables

    @property
    def name(self) -> str:
        return getattr(self.coro, "__qualname__", type(self.coro).__name__)

    def done(self) -> bool:
        return self._done

    def cancelled(self) -> bool:
        """True when the task ended by a ``Cancelled`` exception."""
        return self._done and isinstance(self._exception, Cancelled)

    def result(self):
        """The finished task's result; re-raises its exception (sync, no wait)."""
        if not self._done:
            raise RuntimeError(f"{self!r} has not finished")
        self._mark_joined()
        if self._exception is not None:
            raise self._exception
        return self._result

    def exception(self):
        """The finished task's exception, or None."""
        if not self._done:
            raise RuntimeError(f"{self!r} has not finished")
        return self._exception

    def _mark_joined(self):
        if self._crash is not None:
            self._crash[0] = False

    # join() and wait() are generator-based coroutines that yield the trap
    # themselves: one frame per call instead of an async def around a trap
    # generator (spawn+join is a benchmarked hot path).

    @types.coroutine
    def join(self):
        """Wait for the task to finish; return its result or raise its exception."""
        if not self._done:
            if _state.kernel is None:
                _running_kernel("Task.join()")
            yield (_JOIN, self)
        if self._crash is not None:
            self._crash[0] = False
        if self._exception is not None:
            raise self._exception
        return self._result

    @types.coroutine
    def wait(self):
        """Wait for the task to finish without collecting its outcome."""
        if not self._done:
            if _state.kernel is None:
                _running_kernel("Task.wait()")
            yield (_JOIN, self)

    async def cancel(self, blocking: bool = True) -> bool:
        """Request cancellation; with ``blocking`` wait until the task has ended.
        Returns False if it had already finished. A task can cancel itself only
        with ``blocking=False`` (the Cancelled arrives at its next blocking trap)."""
        if self._done:
            return False
        await _cancel_trap(self, blocking)
        return True

    def cancel_soon(self) -> None:
        """Synchronous cancellation request (no wait), for kernel callbacks."""
        if not self._done:
            _running_kernel("Task.cancel_soon()")._cancel_task(self)

    def add_done_callback(self, fn) -> None:
        if not callable(fn):
            raise TypeError(f"on_done callback must be callable, got {fn!r}")
        if self._done:
            raise RuntimeError(f"{self!r} has already finished")
        if self._callbacks is None:
            self._callbacks = [fn]
        else:
            self._callbacks.append(fn)

    def __repr__(self):
        state = "done" if self._done else ("blocked" if self._wait else "ready")
        return f"<coro Task {self.id} {self.name!r} {state}>"


@types.coroutine
def _cancel_trap(task, blocking):
    if _state.kernel is None:
        _running_kernel("Task.cancel()")
    yield (_CANCEL, task, blocking)


def _instantiate(fn, args):
    """An async function plus arguments, or a coroutine object (curio accepts
    both) -> a coroutine the kernel can send to."""
    if callable(fn):
        return _checked_coro(fn, fn(*args))
    if isinstance(fn, (types.CoroutineType, types.GeneratorType)):
        if args:
            raise TypeError("arguments given together with a coroutine object; "
                            "pass the async function and its arguments instead")
        return fn
    raise TypeError(f"expected an async function, got {fn!r}")


def _checked_coro(fn, coro):
    """``coro`` (what calling ``fn`` returned) if the kernel can step it."""
    if type(coro) is types.CoroutineType or isinstance(coro, types.GeneratorType) or (
            hasattr(coro, "send") and hasattr(coro, "throw")):
        return coro
    raise TypeError(f"{getattr(fn, '__qualname__', fn)!r} is not an async function: "
                    f"calling it returned {type(coro).__name__}")


# --------------------------------------------------------------------------
# Parking: the one blocking primitive sync.py builds on

class WaitQueue:
    """A FIFO of parked tasks (trio's ParkingLot, curio's SchedFIFO).

    ``await q.park()`` blocks the caller until ``q.wake()`` picks it, and returns
    the value given to ``wake``. ``wake`` is synchronous so that ``Event.set()``
    can be. A cancellation removes the task from the queue before it is thrown
    in, so a wake-up is never spent on a task that won't see it. ``park(shield=
    True)`` defers cancellations until after the wait -- for waits that must
    complete, such as a TaskGroup collecting its cancelled children."""
    __slots__ = ("_tasks",)

    def __init__(self):
        self._tasks = deque()

    def __len__(self):
        return len(self._tasks)

    @types.coroutine
    def park(self, shield: bool = False):
        if _state.kernel is None:
            _running_kernel("WaitQueue.park()")
        return (yield (_PARK, self._tasks, shield))

    def wake(self, n: int = 1, value=None) -> int:
        """Make up to ``n`` parked tasks ready (oldest first); return how many."""
        tasks = self._tasks
        if not tasks:
            return 0
        reschedule = _running_kernel("WaitQueue.wake()")._reschedule
        woken = 0
        while tasks and woken < n:
            reschedule(tasks.popleft(), value)
            woken += 1
        return woken

    def wake_all(self, value=None) -> int:
        return self.wake(len(self._tasks), value)


# --------------------------------------------------------------------------
# Cancel scopes and timeouts

class CancelScope:
    """A block of a task that can be cancelled as a unit, by ``cancel()`` or by a
    deadline ``seconds`` after it is entered.

    Inside the block, a cancellation arrives at the next blocking trap: as
    ``TaskTimeout`` if this scope's deadline expired and it is the innermost
    scope (curio's rule: the code that set the timeout sees a timeout), otherwise
    as ``Cancelled(scope=this)``. When several enclosing scopes are cancelled
    the outermost one is delivered. On exit the scope swallows its own
    cancellation and sets ``cancelled_caught`` (this is ``move_on_after``);
    ``timeout_after`` re-raises it as ``TaskTimeout``. A deadline that passes
    while the block never blocks is not raised when the block ends. A scope is
    entered once, by one task, with ``async with``."""
    __slots__ = ("_seconds", "deadline", "_task", "_timer", "_active", "_cancel_called",
                 "_expired", "_delivered", "cancelled_caught")

    def __init__(self, seconds=None):
        if seconds is not None:
            if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
                raise TypeError(f"timeout must be a number of seconds or None, "
                                f"not {type(seconds).__name__}")
            if not seconds >= 0:
                raise ValueError(f"timeout must be non-negative, got {seconds!r}")
        self._seconds = seconds
        self.deadline = None
        self._task = None
        self._timer = None
        self._active = False
        self._cancel_called = False
        self._expired = False
        self._delivered = False
        self.cancelled_caught = False

    @property
    def cancel_called(self) -> bool:
        return self._cancel_called

    def cancel(self) -> None:
        """Cancel the block (synchronous; idempotent)."""
        if self._cancel_called:
            return
        self._cancel_called = True
        if self._active:
            _running_kernel("CancelScope.cancel()")._scope_cancelled(self)

    def _owns(self, exc) -> bool:
        return getattr(exc, "scope", None) is self and isinstance(exc, (Cancelled, TaskTimeout))

    async def __aenter__(self):
        await _scope_trap(_SCOPE_ENTER, self)
        return self

    async def __aexit__(self, et, exc, tb):
        await _scope_trap(_SCOPE_EXIT, self)
        if exc is not None and self._owns(exc):
            self.cancelled_caught = True
            return True
        return False


class move_on_after(CancelScope):
    """``async with move_on_after(s) as scope:`` -- leave the block quietly when
    ``s`` seconds pass; ``scope.cancelled_caught`` tells whether it did."""
    __slots__ = ()


class timeout_after(CancelScope):
    """``async with timeout_after(s):`` -- raise ``TaskTimeout`` out of the block
    when ``s`` seconds pass (``bytes_sent`` is kept if a send was cut short)."""
    __slots__ = ()

    async def __aexit__(self, et, exc, tb):
        await _scope_trap(_SCOPE_EXIT, self)
        if exc is None or not self._owns(exc):
            return False
        self.cancelled_caught = True
        if isinstance(exc, TaskTimeout):
            return False          # already the right exception: let it propagate as is
        timeout = TaskTimeout(f"timed out after {self._seconds} s", self)
        timeout.bytes_sent = exc.bytes_sent
        raise timeout


@types.coroutine
def _scope_trap(op, scope):
    if _state.kernel is None:
        _running_kernel("a timeout/cancel scope")
    yield (op, scope)


# --------------------------------------------------------------------------
# Polling. The loop talks to epoll directly: ``selectors`` wraps every poll
# result in a (SelectorKey, events) pair found through its own fd map and
# rounds the timeout in Python, which cost more than the epoll_wait itself on
# a busy loop. The loop keeps its own fd -> record map instead, so a ready fd
# costs one dict lookup. Where epoll is missing, ``_SelectorPoller`` offers
# the same four calls over ``selectors.DefaultSelector`` (slower, same
# behaviour). Masks are epoll's bits; ``_POLL_MASK[interest]`` converts the
# record's interest (W_READ | W_WRITE) into them.

if hasattr(select, "epoll"):
    _POLLIN, _POLLOUT = select.EPOLLIN, select.EPOLLOUT
else:
    _POLLIN, _POLLOUT = 1, 4
_POLL_MASK = (0, _POLLIN, _POLLOUT, _POLLIN | _POLLOUT)
# An event counts as readable/writable the way selectors counts it: hang-up
# and error wake both directions (the syscall that follows reports them).
_READABLE = ~_POLLOUT
_WRITABLE = ~_POLLIN


class _SelectorPoller:
    """epoll's register/modify/unregister/poll/close over a ``selectors``
    selector, for platforms without epoll. ``unregister`` of an unknown fd
    raises ``OSError`` as epoll does."""
    __slots__ = ("_selector",)

    def __init__(self):
        self._selector = DefaultSelector()

    @staticmethod
    def _events(mask):
        return (EVENT_READ if mask & _POLLIN else 0) | (EVENT_WRITE if mask & _POLLOUT else 0)

    def register(self, fd, mask):
        try:
            self._selector.register(fd, self._events(mask))
        except KeyError:
            raise FileExistsError(f"fd {fd} is already registered") from None

    def modify(self, fd, mask):
        try:
            self._selector.modify(fd, self._events(mask))
        except KeyError:
            raise FileNotFoundError(f"fd {fd} is not registered") from None

    def unregister(self, fd):
        try:
            self._selector.unregister(fd)
        except (KeyError, ValueError):
            raise FileNotFoundError(f"fd {fd} is not registered") from None

    def poll(self, timeout=None, maxevents=-1):
        return [(key.fd, (_POLLIN if events & EVENT_READ else 0)
                 | (_POLLOUT if events & EVENT_WRITE else 0))
                for key, events in self._selector.select(timeout)]

    def close(self):
        self._selector.close()


def _new_poller():
    return select.epoll() if hasattr(select, "epoll") else _SelectorPoller()


# --------------------------------------------------------------------------
# The kernel

_EXIT_POLICIES = ("cancel", "wait", "raise")
# run() phases: what makes the loop stop.
_UNTIL_MAIN, _UNTIL_NONDAEMON, _UNTIL_EMPTY = range(3)


class Kernel:
    """A trap kernel. Options (defaults reproduce curio; each changes one thing):

    * ``io_schedule_point`` -- False: a socket call that doesn't block never
      yields. True (trio): every socket call is a checkpoint, yielding once even
      when the syscall succeeded.
    * ``spawn`` -- "lazy": a spawned child is queued; "eager": its first step
      runs before ``spawn`` returns.
    * ``cancel`` -- "edge": each cancellation is delivered once; "level": it is
      delivered at every blocking trap while the task (or expired block) lasts.
    * ``ready_order`` -- "fifo", or "random-SEED": each loop pass runs its batch
      of ready tasks shuffled by ``random.Random(SEED)`` (trio-like).
    * ``exit`` -- what ``run()`` does with tasks still running when main
      returns: "cancel" them (daemons silently) and wait for them to unwind;
      "wait" for the non-daemon ones (daemons are then cancelled); "raise":
      cancel, then raise RuntimeError naming how many there were.
    * ``trace`` -- record Chrome trace events in ``probe.trace``.

    ``run(main, *args)`` may be called repeatedly; ``close()`` releases the
    poller (epoll) and the wake-up socketpair (also via ``with``). Ctrl-C while
    ``run()`` is in the main thread cancels every task, lets them unwind and
    re-raises ``KeyboardInterrupt``; a second Ctrl-C interrupts at once.
    """

    OPTIONS = {
        "io_schedule_point": (False, (False, True)),
        "spawn": ("lazy", ("lazy", "eager")),
        "cancel": ("edge", ("edge", "level")),
        "ready_order": ("fifo", ("fifo", "random-<int seed>")),
        "exit": ("cancel", _EXIT_POLICIES),
        "trace": (False, (False, True)),
    }

    def __init__(self, io_schedule_point=False, spawn="lazy", cancel="edge",
                 ready_order="fifo", exit="cancel", trace=False):
        for name, value in (("io_schedule_point", io_schedule_point), ("trace", trace)):
            if not isinstance(value, bool):
                raise TypeError(f"coro option {name} must be True or False, got {value!r}")
        for name, value in (("spawn", spawn), ("cancel", cancel), ("exit", exit)):
            valid = self.OPTIONS[name][1]
            if value not in valid:
                raise ValueError(f"coro option {name}={value!r} is not one of {', '.join(valid)}")
        seed = None
        if ready_order != "fifo":
            prefix, _, digits = str(ready_order).partition("-")
            try:
                if prefix != "random" or not digits:
                    raise ValueError
                seed = int(digits)
            except ValueError:
                raise ValueError(f"coro option ready_order={ready_order!r} must be 'fifo' or "
                                 "'random-<int seed>' (e.g. 'random-7')") from None
        self.options = {"io_schedule_point": io_schedule_point, "spawn": spawn,
                        "cancel": cancel, "ready_order": ready_order, "exit": exit,
                        "trace": trace}
        self.probe = Probe(trace=trace)
        self._seed = seed
        self._running = False
        self._closed = False
        self._broken = False
        self._poller = _new_poller()
        try:
            self._wake_r, self._wake_w = socket.socketpair()
        except BaseException:
            self._poller.close()
            raise
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._build()

    # -- public surface ----------------------------------------------------

    def run(self, main, *args):
        """Run ``main(*args)`` as the main task, apply the exit policy, return its
        result (or raise its exception)."""
        if self._closed:
            raise RuntimeError("this coro kernel is closed")
        if self._broken:
            raise RuntimeError("this coro kernel was interrupted inside its run loop "
                               "and can't be reused; close it and make a new one")
        if _state.kernel is not None:
            raise RuntimeError("a coro kernel is already running in this thread; "
                               "run() can't be nested (spawn a task instead)")
        _state.kernel = self
        _state.checkpoint = self.options["io_schedule_point"]
        self._running = True
        restore = self._install_sigint()
        try:
            return self._kernel_run(main, args)
        finally:
            if restore is not None:
                signal.signal(signal.SIGINT, restore)
            self._running = False
            _state.kernel = None
            _state.checkpoint = False

    def close(self) -> None:
        """Release the poller and the wake-up socketpair. Idempotent. Sockets
        the tasks opened are theirs to close; their registrations are dropped
        (closing the epoll fd drops them all at once)."""
        if self._closed:
            return
        if self._running:
            raise RuntimeError("can't close a coro kernel from inside its own run()")
        self._closed = True
        self._fdmap.clear()
        self._fdrecs.clear()
        self._poller.close()
        self._wake_r.close()
        self._wake_w.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def _install_sigint(self):
        """Route Ctrl-C through the loop (only from the main thread, and only if
        nobody else installed a handler). Returns the handler to restore."""
        if threading.current_thread() is not threading.main_thread():
            return None
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            return None
        signal.signal(signal.SIGINT, self._on_sigint)
        return signal.default_int_handler

    # -- the runtime -------------------------------------------------------

    def _build(self):
        """Make the kernel runtime: a set of closures over the kernel state. See
        the module docstring for the state; each handler's docstring-comment
        says which traps block."""
        kernel = self
        probe = self.probe
        trace = probe.trace
        poller = self._poller
        poll = poller.poll
        poll_register = poller.register
        poll_modify = poller.modify
        poll_unregister = poller.unregister
        ready = deque()
        ready_append = ready.append
        ready_popleft = ready.popleft
        sleeping = []
        heappush = heapq.heappush
        heappop = heapq.heappop
        next_seq = itertools.count().__next__
        next_id = itertools.count(1).__next__
        monotonic = time.monotonic
        fdmap = self._fdmap = {}
        fdrecs = self._fdrecs = {}
        tasks = {}
        crashes = []            # [pending, line] records of tasks nobody joined yet
        level = self.options["cancel"] == "level"
        eager = self.options["spawn"] == "eager"
        rng = random.Random(self._seed) if self._seed is not None else None
        exit_policy = self.options["exit"]
        wake_r = self._wake_r
        wake_w = self._wake_w
        wake_rec = [W_READ, None, None, wake_r, wake_r.fileno()]
        poll_register(wake_r.fileno(), _POLLIN)
        fdrecs[wake_r.fileno()] = wake_rec
        if trace is not None:
            trace.track(0, "kernel")

        current = None          # the task being stepped (None between steps)
        stop = False            # ends loop(); set by finish() or an interrupt
        phase = _UNTIL_MAIN
        main_task = None
        nondaemon = 0           # live non-daemon tasks
        stale = 0               # dead entries in `sleeping`
        switches = 0            # task steps not yet added to probe.task_switches
        spawns = 0              # tasks made, not yet added to probe.spawns
        interrupt = None        # KeyboardInterrupt/SystemExit that ends run()

        # -- waking and unhooking -----------------------------------------

        def reschedule(task, value):
            task._wait = 0
            task._value = value
            ready_append(task)
            if trace is not None:
                task._flow = trace.flow_start(current.id if current is not None else 0)

        def dead_timer():
            # One more lazily-cancelled heap entry; rebuild when they dominate.
            nonlocal stale
            stale += 1
            if stale > 64 and stale > len(sleeping) >> 1:
                sleeping[:] = [e for e in sleeping if e[2]._timer is e]
                heapq.heapify(sleeping)
                stale = 0

        def unblock(task):
            kind = task._wait
            if kind == W_SLEEP:
                task._timer = None
                dead_timer()
            elif kind == W_READ or kind == W_WRITE:
                rec = task._wait_obj
                if rec[kind] is task:
                    rec[kind] = None
            else:
                task._wait_obj.remove(task)
            task._wait = 0

        def throw_into(task, exc):
            # `task` is blocked: unhook it and make it ready to raise `exc`.
            unblock(task)
            task._exc = exc
            reschedule(task, None)

        def pending_exception(task):
            # The cancellation a blocking trap should raise now, or None. Task
            # cancellation first, then the outermost cancelled scope.
            c = task._cancel
            if c == 1 or c == 3 or (c == 2 and level):
                if c == 1:
                    task._cancel = 2
                return Cancelled("task was cancelled")
            scopes = task._scopes
            if scopes:
                for scope in scopes:
                    if scope._cancel_called and (level or not scope._delivered):
                        scope._delivered = True
                        if scope._expired and scope is scopes[-1]:
                            return TaskTimeout(f"timed out after {scope._seconds} s", scope)
                        return Cancelled("cancel scope was cancelled", scope)
            task._pending = False
            return None

        def deliver(task):
            # At a blocking trap with _pending set: arrange a throw if there is
            # something to deliver. True -> don't block, step again.
            exc = pending_exception(task)
            if exc is None:
                return False
            task._exc = exc
            if trace is not None:
                trace.instant("cancel_delivered", task.id, exception=type(exc).__name__)
            return True

        def cancel_task(task, doom=False):
            # A request already waiting for delivery absorbs this one; after an
            # edge delivery a new request is delivered again.
            c = task._cancel
            if task._done or c == 3 or (c == 1 and not doom):
                return
            task._cancel = 3 if doom else 1
            task._pending = True
            probe.cancellations += 1
            if trace is not None:
                trace.instant("cancel", current.id if current is not None else 0, task=task.id)
            if 0 < task._wait < W_SHIELDED:
                throw_into(task, pending_exception(task))

        def scope_cancelled(scope):
            task = scope._task
            task._pending = True
            probe.cancellations += 1
            if 0 < task._wait < W_SHIELDED:
                exc = pending_exception(task)
                if exc is not None:
                    throw_into(task, exc)

        # -- tasks -----------------------------------------------------------

        def spawn_task(fn, args, daemon, on_done):
            # Make a task and queue it (or, with spawn="eager" inside a task,
            # step it now).
            nonlocal nondaemon, spawns
            try:
                coro = fn(*args)               # the common case: an async function
            except TypeError:
                if callable(fn):
                    raise
                coro = _instantiate(fn, args)  # a coroutine object, or an error
            else:
                if type(coro) is not CoroutineType:
                    coro = _checked_coro(fn, coro)
            tid = next_id()
            task = Task(tid, coro, True if daemon else False)
            if on_done is not None:
                task.add_done_callback(on_done)
            tasks[tid] = task
            if not daemon:
                nondaemon += 1
            if phase == _UNTIL_EMPTY:      # spawned during teardown: doomed at birth
                task._cancel = 3
                task._pending = True
            spawns += 1
            if trace is not None:
                trace.track(task.id, task.name)
                parent = current.id if current is not None else 0
                trace.instant("spawn", parent, child=task.id)
                task._flow = trace.flow_start(parent)
            if eager and current is not None:
                step(task)
            else:
                ready_append(task)
            return task

        def finish(task, result, exc):
            nonlocal nondaemon, stop, interrupt
            task._done = True
            task._result = result
            task._exception = exc
            task._value = None
            task._crash = None
            del tasks[task.id]
            if not task.daemon:
                nondaemon -= 1
            if task._scopes:       # left without exiting its blocks (a broken coroutine)
                for scope in task._scopes:
                    scope._active = False
                    if scope._timer is not None:
                        scope._timer = None
                        dead_timer()
                task._scopes = None
            callbacks = task._callbacks
            if callbacks is not None:
                for fn in callbacks:
                    try:
                        fn(task)
                    except Exception as e:
                        print(f"coro: on_done callback {fn!r} of task {task.id} failed: {e!r}",
                              file=sys.stderr)
            joiners = task._joiners
            if exc is not None:
                if trace is not None:
                    trace.instant("error", task.id, exception=repr(exc))
                if isinstance(exc, Cancelled):
                    pass
                elif isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    if interrupt is None:
                        interrupt = exc
                    if phase != _UNTIL_EMPTY:
                        stop = True
                elif not joiners and callbacks is None and task is not main_task:
                    crash = task._crash = [True, f"coro: task {task.id} {task.name!r} raised "
                                                 f"{exc!r} and nobody joined it"]
                    crashes.append(crash)
                    weakref.finalize(task, _report_crash, crash)
            if joiners:
                task._joiners = None
                for joiner in joiners:          # reschedule(joiner, None), inline
                    joiner._wait = 0
                    joiner._value = None
                    ready_append(joiner)
                    if trace is not None:
                        joiner._flow = trace.flow_start(task.id)
            if phase == _UNTIL_MAIN:
                if task is main_task:
                    stop = True
            elif phase == _UNTIL_NONDAEMON:
                if not nondaemon:
                    stop = True
            elif not tasks:
                stop = True

        def step(task):
            # Run `task` until it blocks or ends. Non-blocking traps are answered
            # in place and the task is stepped again at once. The loop calls it
            # for each task of a batch; an eager spawn calls it in the middle of
            # another task's trap, so it restores `current` when it returns.
            nonlocal current, switches
            outer = current
            current = task
            coro = task.coro
            while True:
                switches += 1
                if trace is not None:
                    trace.begin("step", task.id)
                    if task._flow:
                        trace.flow_end(task._flow, task.id)
                        task._flow = 0
                exc = task._exc
                try:
                    if exc is None:
                        trap = coro.send(task._value)
                    else:
                        task._exc = None
                        trap = coro.throw(exc)
                except StopIteration as e:
                    if trace is not None:
                        trace.end(task.id)
                    finish(task, e.value, None)
                    break
                except BaseException as e:
                    if trace is not None:
                        trace.end(task.id)
                    finish(task, None, e)
                    break
                if trace is not None:
                    trace.end(task.id)
                try:
                    handler = traps[trap[0]]
                except (TypeError, IndexError, KeyError):
                    task._exc = TypeError(
                        f"task {task.name!r} awaited {trap!r}, which is not a coro kernel trap "
                        "(asyncio/trio/curio objects can't be awaited here)")
                    continue
                if handler(task, trap):
                    break
            current = outer

        # -- I/O registration ----------------------------------------------

        def purge(rec, reason):
            # Drop an fdmap record and wake its waiters with ClosedResourceError.
            if fdmap.get(rec[3]) is rec:
                del fdmap[rec[3]]
            if fdrecs.get(rec[4]) is rec:
                del fdrecs[rec[4]]
                try:
                    poll_unregister(rec[4])
                except (ValueError, OSError):
                    pass
            for i in (W_READ, W_WRITE):
                waiter = rec[i]
                if waiter is not None:
                    rec[i] = None
                    waiter._wait = 0
                    waiter._exc = ClosedResourceError(reason)
                    reschedule(waiter, None)

        def register(fileobj, event):
            fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
            if fd < 0:
                raise ClosedResourceError(f"{fileobj!r} is closed")
            old = fdrecs.get(fd)
            if old is not None:
                # The fd number is still registered for an object that was closed
                # without io_release; the number has been reused. Forget the old one.
                purge(old, "the file descriptor was closed and its number reused")
            try:
                poll_register(fd, _POLL_MASK[event])
            except FileExistsError:
                # epoll still holds the old file (a dup of it is open elsewhere).
                poll_modify(fd, _POLL_MASK[event])
            rec = [event, None, None, fileobj, fd]
            fdmap[fileobj] = rec
            fdrecs[fd] = rec
            return rec

        def t_io_wait(task, trap):                      # blocks
            # (_IO_WAIT, fileobj, W_READ or W_WRITE)
            if task._pending and deliver(task):
                return False
            fileobj = trap[1]
            event = trap[2]
            rec = fdmap.get(fileobj)
            try:
                if rec is None:
                    rec = register(fileobj, event)
                elif not rec[0] & event:
                    rec[0] |= event
                    poll_modify(rec[4], _POLL_MASK[rec[0]])
            except (OSError, ValueError, ClosedResourceError) as e:
                if rec is not None:
                    purge(rec, "the file descriptor was closed behind the kernel's back")
                task._exc = e if isinstance(e, ClosedResourceError) else ClosedResourceError(
                    f"can't wait on {fileobj!r}: {e}")
                return False
            if rec[event] is not None:
                task._exc = BusyResourceError(
                    f"another task is already waiting to {'read' if event == 1 else 'write'} "
                    f"on {fileobj!r}")
                return False
            rec[event] = task
            task._wait = event
            task._wait_obj = rec
            if trace is not None:
                trace.instant("io_wait", task.id, fd=rec[4],
                              direction="read" if event == 1 else "write")
            return True

        # -- trap handlers: (task, trap) -> True if the task blocked ---------

        def t_yield(task, trap):                        # blocks (requeues)
            if task._pending and deliver(task):
                return False
            ready_append(task)
            if trace is not None:
                task._flow = trace.flow_start(task.id)
            return True

        def t_sleep(task, trap):                        # blocks
            if task._pending and deliver(task):
                return False
            entry = (monotonic() + trap[1], next_seq(), task)
            task._timer = entry
            heappush(sleeping, entry)
            task._wait = W_SLEEP
            return True

        def t_io_release(task, trap):
            rec = fdmap.get(trap[1])
            if rec is not None:
                purge(rec, "the socket was closed by another task while this one waited on it")
            return False

        def t_spawn(task, trap):
            try:
                task._value = spawn_task(trap[1], trap[2], trap[3], trap[4])
            except Exception as e:
                task._exc = e
            return False

        def wait_for_end(task, target, shield):
            if not shield and task._pending and deliver(task):
                return False
            joiners = target._joiners
            if joiners is None:
                joiners = target._joiners = [task]
            else:
                joiners.append(task)
            task._wait = W_SHIELDED if shield else W_PARK
            task._wait_obj = joiners
            return True

        def t_join(task, trap):                         # blocks unless target is done
            target = trap[1]
            if target._done:
                return False
            if target is task:
                task._exc = RuntimeError("a task can't join itself")
                return False
            if task._pending and deliver(task):
                return False
            joiners = target._joiners           # wait_for_end(task, target, False), inline
            if joiners is None:
                target._joiners = joiners = [task]
            else:
                joiners.append(task)
            task._wait = W_PARK
            task._wait_obj = joiners
            return True

        def t_cancel(task, trap):                       # blocks if blocking=True
            target = trap[1]
            if target._done:
                return False
            if target is task and trap[2]:
                task._exc = RuntimeError("a task can't cancel itself and wait for its own end; "
                                         "use cancel(blocking=False)")
                return False
            cancel_task(target)
            if not trap[2] or target._done:
                return False
            return wait_for_end(task, target, False)

        def t_current(task, trap):
            task._value = task
            return False

        def t_park(task, trap):                         # blocks
            shield = trap[2]
            if not shield and task._pending and deliver(task):
                return False
            trap[1].append(task)
            task._wait = W_SHIELDED if shield else W_PARK
            task._wait_obj = trap[1]
            return True

        def t_scope_enter(task, trap):
            scope = trap[1]
            if scope._task is not None:
                task._exc = RuntimeError("a cancel scope / timeout block can be entered only once")
                return False
            scope._task = task
            scope._active = True
            if task._scopes is None:
                task._scopes = [scope]
            else:
                task._scopes.append(scope)
            if scope._seconds is not None and not scope._cancel_called:
                deadline = scope.deadline = monotonic() + scope._seconds
                entry = scope._timer = (deadline, next_seq(), scope)
                heappush(sleeping, entry)
            if scope._cancel_called:
                task._pending = True
            return False

        def t_scope_exit(task, trap):
            scope = trap[1]
            scopes = task._scopes
            if scope._task is not task or not scope._active or scopes[-1] is not scope:
                task._exc = RuntimeError("cancel scopes / timeout blocks exited out of order "
                                         "(or in another task)")
                return False
            scopes.pop()
            scope._active = False
            if scope._timer is not None:
                scope._timer = None
                dead_timer()
            return False

        traps = (t_yield, t_sleep, t_io_wait, t_io_release, t_spawn, t_join,
                 t_cancel, t_current, t_park, t_scope_enter, t_scope_exit)

        # -- the loop ------------------------------------------------------

        def loop():
            # Poll I/O (without waiting if anything is ready), fire timers, then
            # step the batch of tasks that were ready at that moment. Tasks made
            # ready during the batch run in the next pass, after another poll.
            # With tasks ready and no fd registered there is nothing to poll for
            # (Ctrl-C sets `stop` itself), so the syscall is skipped: pure
            # task switching costs no system call.
            # The probe's counters are kept in locals and closure cells while the
            # loop runs (an attribute update per step is measurable here) and
            # written back when it returns: read from inside a task they lag.
            nonlocal switches, spawns, current
            iterations = 0
            ready_max = probe.ready_max
            try:
                while not stop:
                    iterations += 1
                    if ready:
                        events = poll(0, len(fdrecs)) if fdmap else ()
                    else:
                        if sleeping:
                            timeout = sleeping[0][0] - monotonic()
                            if timeout < 0:
                                timeout = 0
                            elif timeout > _MAX_SELECT_S:
                                timeout = _MAX_SELECT_S
                        else:
                            timeout = None
                        events = poll(timeout, len(fdrecs))
                    for fd, ev in events:
                        # Wake the waiter of each ready direction (reschedule(),
                        # inline); drop interest nobody waits on any more.
                        rec = fdrecs[fd]
                        drop = 0
                        mask = rec[0]
                        if mask & 1 and ev & _READABLE:
                            waiter = rec[1]
                            if waiter is not None:
                                rec[1] = None
                                waiter._wait = 0
                                waiter._value = None
                                ready_append(waiter)
                                if trace is not None:
                                    trace.instant("io_ready", 0, fd=fd, direction="read")
                                    waiter._flow = trace.flow_start(0)
                            elif rec is wake_rec:
                                drain_wakeups()
                                continue
                            else:
                                drop = 1
                        if mask & 2 and ev & _WRITABLE:
                            waiter = rec[2]
                            if waiter is not None:
                                rec[2] = None
                                waiter._wait = 0
                                waiter._value = None
                                ready_append(waiter)
                                if trace is not None:
                                    trace.instant("io_ready", 0, fd=fd, direction="write")
                                    waiter._flow = trace.flow_start(0)
                            else:
                                drop |= 2
                        if drop:
                            mask = rec[0] = mask & ~drop
                            try:
                                if mask:
                                    poll_modify(fd, _POLL_MASK[mask])
                                else:
                                    del fdrecs[fd]
                                    fdmap.pop(rec[3], None)
                                    poll_unregister(fd)
                            except OSError:
                                # Closed behind the kernel's back (a dup kept it polled).
                                purge(rec, "the file descriptor was closed behind the "
                                           "kernel's back")
                    if sleeping and sleeping[0][0] <= monotonic():
                        fire_timers()
                    n = len(ready)
                    if n > ready_max:
                        ready_max = n
                    if rng is not None and n > 1:
                        batch = [ready_popleft() for _ in range(n)]
                        rng.shuffle(batch)
                        ready.extendleft(reversed(batch))
                    for _ in range(n):
                        step(ready_popleft())
                    current = None
            finally:
                probe.loop_iterations += iterations
                probe.ready_max = ready_max
                probe.task_switches += switches
                probe.spawns += spawns
                switches = spawns = 0

        def fire_timers():
            nonlocal stale
            now = monotonic()
            while sleeping and sleeping[0][0] <= now:
                entry = heappop(sleeping)
                owner = entry[2]
                if owner._timer is not entry:
                    stale -= 1
                    continue
                owner._timer = None
                if trace is not None:
                    trace.instant("timer", 0)
                if owner.__class__ is Task:
                    reschedule(owner, None)
                else:
                    if not owner._cancel_called:
                        owner._expired = True
                        owner._cancel_called = True
                        scope_cancelled(owner)

        def drain_wakeups():
            try:
                while wake_r.recv(4096):
                    pass
            except (BlockingIOError, InterruptedError):
                pass

        def on_sigint(signum, frame):
            # First Ctrl-C: ask the loop to cancel everything and unwind (wake it
            # if it is blocked in select). Second: the user means it.
            nonlocal interrupt, stop
            if isinstance(interrupt, KeyboardInterrupt):
                raise KeyboardInterrupt
            interrupt = KeyboardInterrupt()
            if phase != _UNTIL_EMPTY:
                stop = True
            try:
                wake_w.send(b"\0")
            except OSError:
                pass

        # -- run(main): the phases -------------------------------------------

        def kernel_run(fn, args):
            nonlocal phase, stop, main_task, interrupt
            phase = _UNTIL_MAIN
            stop = False
            interrupt = None
            main_task = spawn_task(fn, args, False, None)   # queued: no task is current
            try:
                loop()
                leftovers = [t for t in tasks.values() if not t.daemon and t is not main_task]
                report = {"policy": exit_policy, "tasks_left_count": len(leftovers),
                          "daemon_tasks_left_count": sum(t.daemon for t in tasks.values()),
                          "unsent_bytes": 0}
                if interrupt is None and exit_policy == "wait" and leftovers \
                        and main_task._exception is None:
                    phase = _UNTIL_NONDAEMON
                    stop = not nondaemon
                    loop()
                if tasks:
                    phase = _UNTIL_EMPTY
                    stop = False
                    for task in reversed(list(tasks.values())):
                        cancel_task(task, doom=True)
                    loop()
                if interrupt is not None:
                    report["interrupted"] = type(interrupt).__name__
                probe.exit_report = report
            except BaseException:
                kernel._broken = True
                raise
            finally:
                main = main_task
                main_task = None
                for crash in crashes:
                    _report_crash(crash)
                crashes.clear()
            if interrupt is not None:
                exc, interrupt = interrupt, None
                raise exc
            if main._exception is not None:
                raise main._exception
            if exit_policy == "raise" and report["tasks_left_count"]:
                raise RuntimeError(
                    f"main returned with {report['tasks_left_count']} task(s) still running; "
                    "they were cancelled (exit='raise')")
            return main._result

        self._kernel_run = kernel_run
        self._reschedule = reschedule
        self._spawn = spawn_task
        self._cancel_task = cancel_task
        self._scope_cancelled = scope_cancelled
        self._on_sigint = on_sigint


def _report_crash(crash) -> None:
    if crash[0]:
        crash[0] = False
        print(crash[1], file=sys.stderr)


def run(main, *args, **options):
    """``Kernel(**options).run(main, *args)``, closing the kernel afterwards."""
    with Kernel(**options) as kernel:
        return kernel.run(main, *args)
