"""Futures for the hybrid kernel, the exceptions they raise, and the state the
kernel keeps per callback loop.

A ``Future`` is a box with a list of callbacks. When it is resolved -- usually
by a transport callback such as ``data_received`` -- each callback is queued
on the loop's ready queue; a Task waiting on it is queued through its one
reusable step handle (see ``tasks``). Nothing here touches a socket or a
selector: the loop is ``kernels.callback.Loop`` and every wake-up is a
callback on it. This is the shape of asyncio, and it is why the loop's
causality leaks upward: a Future's callbacks never run inside ``set_result``.

Kernel-wide state that asyncio keeps in module globals (the current task, the
set of live tasks, the ``spawn`` and ``drain`` options) lives in one
``_LoopState`` per loop, found through a weak mapping when a Task is created
and then carried by the Task itself, so the step path never looks it up.
"""
from __future__ import annotations

import builtins
import sys
import weakref
from contextvars import copy_context

from kernels.callback import Handle, Loop, get_running_loop

__all__ = ["CancelledError", "InvalidStateError", "TimeoutError", "QueueEmpty", "QueueFull",
           "Future"]

TimeoutError = builtins.TimeoutError


class CancelledError(BaseException):
    """Thrown into a coroutine at its await point when its Task is cancelled.

    A ``BaseException`` (as in asyncio 3.8+), so ``except Exception`` in user
    code does not swallow a cancellation by accident."""


class InvalidStateError(Exception):
    """A Future operation not allowed in its current state (for example
    ``set_result`` twice, or ``result()`` while pending)."""


class QueueEmpty(Exception):
    """``Queue.get_nowait()`` on an empty queue."""


class QueueFull(Exception):
    """``Queue.put_nowait()`` on a full queue."""


#: How wait_for runs a coroutine by default: in a new Task up to Python 3.11,
#: inline from 3.12 on -- whatever the running Python's asyncio does.
WAIT_FOR_DEFAULT = "task" if sys.version_info < (3, 12) else "inline"

# Future states. Compared by identity on the hot paths.
_PENDING = "PENDING"
_CANCELLED = "CANCELLED"
_FINISHED = "FINISHED"

# Trace tracks: the callback kernel's connections use their index (0, 1, ...);
# ours start far above. LOOP_TID is the track of plain loop callbacks (a
# data_received that wakes a task draws its arrow from there); task n is
# LOOP_TID + n.
LOOP_TID = 100_000
TASK_TID_BASE = LOOP_TID

# Number of live traced loops. Future resolution checks it (one global load)
# to decide whether to emit flow arrows, so that untraced runs pay nothing more.
_tracing = 0


class _LoopState:
    """What the hybrid kernel knows about one callback loop."""
    __slots__ = ("loop", "probe", "trace", "eager", "drain_empty", "wait_for_task", "tasks",
                 "current", "next_id", "__weakref__")

    def __init__(self, loop, spawn="lazy", drain="asyncio", wait_for=None):
        self.loop = loop
        self.probe = loop.probe
        self.trace = loop.probe.trace
        self.eager = spawn == "eager"
        self.drain_empty = drain == "empty"
        self.wait_for_task = (wait_for or WAIT_FOR_DEFAULT) == "task"
        self.tasks = set()        # tasks not yet done (a strong set: exit policies need them)
        self.current = None       # the task whose step is running
        self.next_id = 0
        if self.trace is not None:
            self.trace.track(LOOP_TID, "loop callbacks")


# Loops made by a Runner, until it closes them (a plain dict: the lookup is on
# the Task-creation path). Loops made elsewhere get a default state, held
# weakly so that it goes away with the loop.
_states: dict = {}
_foreign_states = weakref.WeakKeyDictionary() if hasattr(Loop, "__weakref__") else {}


def _state_for(loop) -> _LoopState:
    """The loop's hybrid state; a loop the Runner did not make gets defaults."""
    st = _states.get(loop)
    if st is None:
        st = _foreign_states.get(loop)
        if st is None:
            st = _foreign_states[loop] = _LoopState(loop)
            if st.trace is not None:
                global _tracing
                _tracing += 1
    return st


# What a done Future's callback list becomes: nothing is ever appended to it
# (add_done_callback on a done future schedules at once), so one shared empty
# tuple saves a list allocation per resolution.
_DONE_CALLBACKS = ()


def _cancelled_error(msg):
    return CancelledError() if msg is None else CancelledError(msg)


# -- Future ---------------------------------------------------------------------------------

class Future:
    """A result that will exist later, bound to one loop.

    Contract: callbacks added with ``add_done_callback(fn)`` are called as
    ``fn(future)`` through ``loop.call_soon`` -- never synchronously inside
    ``set_result``/``set_exception``/``cancel``, and never before the caller of
    those returns. A callback added to a future that is already done is
    scheduled the same way. (A waiting Task's step is queued in the same order,
    without the call_soon wrapper.) Resolving a future that has callbacks on a
    closed loop raises RuntimeError. ``await future`` suspends the awaiting Task
    until the future is done, then returns its result or raises its exception
    (``CancelledError`` if it was cancelled).

    An exception nobody retrieves (with ``result()``, ``exception()`` or
    ``await``) is reported to the loop's exception handler as "Future
    exception was never retrieved" when the future is collected, as asyncio
    does.

    Hazard: a Future is not thread-safe; resolve it from the loop's thread
    (``loop.call_soon_threadsafe(fut.set_result, x)`` from elsewhere).
    """
    __slots__ = ("_loop", "_state", "_result", "_exception", "_callbacks", "_blocking",
                 "_cancel_message", "_log_exc", "__weakref__")

    def __init__(self, *, loop=None):
        self._loop = get_running_loop() if loop is None else loop
        self._state = _PENDING
        self._result = None
        self._exception = None
        self._callbacks = []
        # True between the coroutine yielding this future and the Task picking it
        # up: tells a Task "this came from an await", not from a stray yield.
        self._blocking = False
        self._cancel_message = None

    def __repr__(self):
        state = self._state.lower()
        if self._state is _FINISHED:
            state += f" exception={self._exception!r}" if self._exception is not None \
                else f" result={self._result!r:.60}"
        return f"<{type(self).__name__} {state}>"

    def get_loop(self):
        return self._loop

    def done(self) -> bool:
        return self._state is not _PENDING

    def cancelled(self) -> bool:
        return self._state is _CANCELLED

    def result(self):
        """The result; raises the future's exception, ``CancelledError`` if it
        was cancelled, ``InvalidStateError`` if it is still pending."""
        if self._state is _FINISHED:
            if self._exception is not None:
                self._log_exc = False
                raise self._exception
            return self._result
        if self._state is _CANCELLED:
            raise _cancelled_error(self._cancel_message)
        raise InvalidStateError("result is not ready")

    def exception(self):
        if self._state is _FINISHED:
            self._log_exc = False
            return self._exception
        if self._state is _CANCELLED:
            raise _cancelled_error(self._cancel_message)
        raise InvalidStateError("exception is not set")

    def add_done_callback(self, fn, *, context=None) -> None:
        """``fn(future)`` once done, run in ``context`` -- by default a copy of the
        context current now, as asyncio does."""
        cb = _InContext(fn, copy_context() if context is None else context)
        if self._state is _PENDING:
            self._callbacks.append(cb)
        else:
            self._loop.call_soon(cb, self)

    def remove_done_callback(self, fn) -> int:
        """Remove every occurrence of ``fn``; returns how many were removed."""
        before = len(self._callbacks)
        self._callbacks = [cb for cb in self._callbacks if getattr(cb, "fn", cb) != fn]
        return before - len(self._callbacks)

    def set_result(self, result) -> None:
        if self._state is not _PENDING:
            raise InvalidStateError(f"set_result on a {self._state.lower()} future")
        self._result = result
        self._state = _FINISHED
        # _schedule_callbacks() inlined: this is the wake-up of every read
        callbacks = self._callbacks
        if callbacks:
            self._callbacks = _DONE_CALLBACKS
            if _tracing:
                _trace_wakeups(callbacks)
            loop = self._loop
            for fn in callbacks:
                if fn.__class__ is _StepHandle and not loop._closed:
                    loop._ready.append(fn)
                else:
                    loop.call_soon(fn, self)

    def set_exception(self, exception) -> None:
        if self._state is not _PENDING:
            raise InvalidStateError(f"set_exception on a {self._state.lower()} future")
        if isinstance(exception, type):
            exception = exception()
        if not isinstance(exception, BaseException):
            raise TypeError(f"set_exception expects an exception, got {exception!r}")
        if isinstance(exception, StopIteration):
            raise TypeError("StopIteration interacts badly with generators "
                            "and cannot be raised into a Future")
        self._exception = exception
        self._state = _FINISHED
        if self.__class__ is Future:
            # Only a future that holds an exception pays for a __del__.
            self._log_exc = True
            self.__class__ = _ExceptionFuture
        self._schedule_callbacks()

    def cancel(self, msg=None) -> bool:
        """Cancel if pending (schedules the callbacks); False if already done."""
        if self._state is not _PENDING:
            return False
        self._state = _CANCELLED
        self._cancel_message = msg
        self._schedule_callbacks()
        return True

    def _schedule_callbacks(self):
        # A Task waiting on this future is not a callable in the list but its
        # _StepHandle: it goes onto the loop's ready queue as it is (see Task).
        callbacks = self._callbacks
        if not callbacks:
            return
        self._callbacks = _DONE_CALLBACKS
        if _tracing:
            _trace_wakeups(callbacks)
        loop = self._loop
        for fn in callbacks:
            if fn.__class__ is _StepHandle and not loop._closed:
                loop._ready.append(fn)
            else:
                loop.call_soon(fn, self)   # raises on a closed loop, as it should

    def __await__(self):
        if self._state is _PENDING:
            self._blocking = True
            yield self
            if self._state is _PENDING:
                raise RuntimeError("await wasn't used with this future")
        if self._state is _FINISHED and self._exception is None:
            return self._result     # the common case, without a call to result()
        return self.result()

    __iter__ = __await__


class _InContext:
    """A callback and the context it runs in (asyncio gives every handle one):
    done callbacks and the Runner loop's ``call_soon``/``call_later``/``call_at``
    callbacks run in a copy of the context current when they were scheduled."""
    __slots__ = ("fn", "context")

    def __init__(self, fn, context):
        self.fn = fn
        self.context = context

    def __call__(self, *args):
        return self.context.run(self.fn, *args)

    def __repr__(self):         # the loop names a failing callback by this
        return getattr(self.fn, "__qualname__", None) or repr(self.fn)


def _trace_wakeups(callbacks):
    """Start a flow arrow for each Task this resolution wakes (trace on only).

    The arrow starts in whatever is running now -- a task's step, or a plain
    loop callback such as ``data_received`` (track ``LOOP_TID``) -- and ends in the step
    that the wake-up causes."""
    for fn in callbacks:
        if fn.__class__ is _StepHandle:
            task = fn._args[0]
            st = task._kstate
            if st.trace is not None:
                cur = st.current
                task._flow = st.trace.flow_start(cur._tid if cur is not None else LOOP_TID)


class _StepHandle(Handle):
    """A Task's one entry for the loop's ready queue, made once and queued for
    every step, instead of a fresh ``Handle`` per wake-up (allocating and
    initialising one was ~5 % of an echo round trip).

    Safe to reuse because a Task has at most one step pending at any time: a
    step ends by finishing, by queueing the next step (bare yield), or by
    parking this handle on exactly one pending Future, which queues it once when
    it completes. The step then reads the outcome from ``task._fut_waiter``.
    Futures recognise the handle by its class (it is not callable) and append it
    to the ready queue directly. Never cancelled; dropped when the task is done,
    which also breaks the task -> handle -> task cycle."""
    __slots__ = ()


class _ExceptionFuture(Future):
    """What a plain ``Future`` becomes in ``set_exception``: the same object
    with a ``__del__`` that reports an exception nobody retrieved."""
    __slots__ = ()

    def __del__(self):
        _report_unretrieved(self, "future")


def _report_unretrieved(fut, kind):
    """From ``__del__``: an exception nobody retrieved goes to the loop's
    exception handler -- the "only in a log" error surface. (getattr: the
    constructor may have failed before the flag existed.)"""
    if getattr(fut, "_log_exc", False):
        try:
            fut._loop.call_exception_handler({
                "message": f"{kind.capitalize()} exception was never retrieved",
                "exception": fut._exception, kind: fut})
        except Exception:
            pass


_ExceptionFuture.__name__ = _ExceptionFuture.__qualname__ = "Future"
