"""What the coro kernel schedules and what tasks block on: ``Task``,
``WaitQueue`` (the one parking primitive ``sync.py`` builds on) and
``CancelScope`` with its two timeout forms, ``move_on_after`` and
``timeout_after``.

These are plain objects. The kernel reads and writes their slots directly
(``Task._wait``, ``_cancel``, ``_scopes`` ...); their blocking methods are the
traps from ``traps.py``.
"""
from __future__ import annotations

import types
from collections import deque

from . import traps
from .errors import Cancelled, TaskTimeout, TimeoutCancellationError, flavour

__all__ = ["Task", "WaitQueue", "CancelScope", "move_on_after", "timeout_after"]


class Task:
    """A coroutine the kernel steps. Made by ``spawn``; not constructed directly.

    ``await task.join()`` returns the result, or raises ``TaskError`` chained
    from the task's exception (its ``Cancelled`` included), as curio does;
    ``task.result()`` re-raises the exception itself. ``await task.cancel()`` requests
    cancellation and waits for the task to end; it returns ``False`` if the
    task had already finished. An exception is not lost: every task but main
    that ends with one is reported on stderr the moment it ends, joined or not
    (curio's "Task Crash" log).

    ``on_done(task)`` callbacks run inside the kernel the moment the task
    finishes, before any joiner resumes. They must not block and may use only
    synchronous primitives (``WaitQueue.wake``, ``spawn_soon``,
    ``Task.cancel_soon``, ``CancelScope.cancel``). A task with an ``on_done``
    callback is supervised: its exception is the callback's to handle.
    """
    # Set by the kernel's spawn_task, which makes every Task (it has no
    # __init__: calling a class without one is the cheapest construction):
    AT_SPAWN = (
        "id", "coro", "daemon",
        "_value",       # what the next send() passes in
        "_exc",         # or what the next throw() raises
        "_wait",        # W_* while blocked; 0 when ready/running
        "_pending",     # a cancellation may be waiting for a blocking trap
        "_cancel",      # 0 no, 1 requested, 2 delivered (edge), 3 doomed (level)
        "_scopes",      # stack of entered CancelScopes, or None
        "_done",
        "_joiners",     # list of tasks blocked in join()/cancel(), or None
        "_callbacks",   # on_done callables, or None
        "_born",        # the kernel's send count when spawned, -1 if its coroutine
                        # is not a coroutine object (the hand-off in engine's join)
    )
    # Set later: when the task first blocks, sleeps, is traced or ends.
    LATER = ("_wait_obj", "_timer", "_flow", "_result", "_exception",
             "_inner")      # the task's own coroutine when ``coro`` is the runner
                            # around it (engine.in_place_first)
    __slots__ = AT_SPAWN + LATER + ("__weakref__",)

    @property
    def name(self) -> str:
        coro = getattr(self, "_inner", self.coro)
        return getattr(coro, "__qualname__", type(coro).__name__)

    def done(self) -> bool:
        return self._done

    def cancelled(self) -> bool:
        """True when the task ended by a ``Cancelled`` exception."""
        return self._done and isinstance(self._exception, Cancelled)

    def result(self):
        """The finished task's result; re-raises its exception (sync, no wait)."""
        if not self._done:
            raise RuntimeError(f"{self!r} has not finished")
        if self._exception is not None:
            raise self._exception
        return self._result

    def exception(self):
        """The finished task's exception, or None."""
        if not self._done:
            raise RuntimeError(f"{self!r} has not finished")
        return self._exception

    join = traps.join
    wait = traps.wait

    async def cancel(self, blocking: bool = True) -> None:
        """Request cancellation; with ``blocking`` wait until the task has ended.
        Returns None, as curio's does (a finished task is left as it is: ask
        ``done()`` or ``cancelled()``). A task can cancel itself only with
        ``blocking=False`` (the Cancelled arrives at its next blocking trap)."""
        if self._done:
            return None
        await traps.cancel(self, blocking)
        return None

    def cancel_soon(self) -> None:
        """Synchronous cancellation request (no wait), for kernel callbacks."""
        if not self._done:
            traps.cancel_soon(self)

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

    park = traps.park

    def wake(self, n: int = 1, value=None) -> int:
        """Make up to ``n`` parked tasks ready (oldest first); return how many."""
        if not self._tasks:
            return 0
        return traps.wake(self._tasks, n, value)

    def wake_all(self, value=None) -> int:
        return self.wake(len(self._tasks), value)


# --------------------------------------------------------------------------
# Cancel scopes and timeouts

class CancelScope:
    """A block of a task that can be cancelled as a unit, by ``cancel()`` or by a
    deadline ``seconds`` after it is entered.

    Inside the block, a cancellation arrives at the next blocking trap: as
    ``TaskTimeout(scope=this)`` if this scope's deadline expired, otherwise as
    ``Cancelled(scope=this)``. When several enclosing scopes are cancelled the
    outermost one is delivered. On exit the scope swallows its own
    cancellation and sets ``cancelled_caught`` (this is ``move_on_after``);
    ``timeout_after`` re-raises it as ``TaskTimeout``. A ``TaskTimeout`` of an
    enclosing scope leaves this one as ``TimeoutCancellationError`` (curio's
    rule: only the block whose deadline passed reports a timeout). A deadline
    that passes while the block never blocks is not raised when the block
    ends. A scope is entered once, by one task, with ``async with``."""
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
            traps.cancel_scope(self)

    async def __aenter__(self):
        await traps.scope_enter(self)
        return self

    async def __aexit__(self, et, exc, tb):
        await traps.scope_exit(self)
        if exc is None or not isinstance(exc, Cancelled):
            return False
        if exc.scope is self:
            self.cancelled_caught = True
            return self._caught(exc)
        if isinstance(exc, TaskTimeout) and exc.scope is not None:
            # An enclosing block timed out, not this one.
            err = _flavoured(TimeoutCancellationError)(
                f"an enclosing timeout block timed out ({exc})", exc.scope)
            err.bytes_sent = exc.bytes_sent
            raise err.with_traceback(tb) from None
        return False

    def _caught(self, exc) -> bool:
        """This scope's own cancellation reached its exit: True swallows it."""
        return True


class move_on_after(CancelScope):
    """``async with move_on_after(s) as scope:`` -- leave the block quietly when
    ``s`` seconds pass; ``scope.cancelled_caught`` tells whether it did."""
    __slots__ = ()


class timeout_after(CancelScope):
    """``async with timeout_after(s):`` -- raise ``TaskTimeout`` out of the block
    when ``s`` seconds pass (``bytes_sent`` is kept if a send was cut short)."""
    __slots__ = ()

    def _caught(self, exc) -> bool:
        if isinstance(exc, TaskTimeout):
            return False          # already the right exception: let it propagate as is
        timeout = _flavoured(TaskTimeout)(f"timed out after {self._seconds} s", self)
        timeout.bytes_sent = exc.bytes_sent
        raise timeout


def _flavoured(cls):
    """``cls`` as the running kernel raises it (its ``cancel_base`` option)."""
    kernel = traps.running_kernel()
    return cls if kernel is None else flavour(cls, kernel.options["cancel_base"])
