"""Futures and Tasks stepped by the callback kernel's loop; sleep, gather,
timeouts, TaskGroup, Event, Queue, and the Runner that owns the loop.

A ``Future`` is a box with a list of callbacks. A ``Task`` is a Future that
drives a coroutine: it calls ``coro.send(None)`` (a *step*); when the coroutine
awaits a pending Future, the Future comes out of ``send`` (``yield self`` in
``Future.__await__``) and the Task parks its step on that Future's callback
list. When somebody resolves the Future -- usually a transport callback such
as ``data_received`` -- the step is queued on the loop's ready queue and runs
on a later pass, reading the outcome from the Future it waited on. A bare
``yield`` (``sleep(0)``) queues the next step directly.

The step is queued through a ``_StepHandle``, the task's one ready-queue entry,
made at spawn and reused for every step: a Task never has two steps pending,
so it needs no fresh ``Handle`` per wake-up, and the step needs no separate
wake-up callback in front of it. Plain callbacks (``add_done_callback``) still
go through ``loop.call_soon`` one by one.

Nothing here touches a socket or a selector: the loop is
``kernels.callback.Loop`` and every wake-up is a callback on it. This is the
shape of asyncio, and it is why the loop's causality leaks upward: a Future's
callbacks never run inside ``set_result``, ``create_task`` does not run the
child (unless ``spawn="eager"``), ``close()`` is a request.

Kernel-wide state that asyncio keeps in module globals (the current task, the
set of live tasks, the ``spawn`` and ``drain`` options) lives in one
``_LoopState`` per loop, found through a weak mapping when a Task is created
and then carried by the Task itself, so the step path never looks it up.
"""
from __future__ import annotations

import builtins
import collections
import math
import types
import weakref

from kernels.callback import Handle, Loop, get_running_loop

__all__ = [
    "CancelledError", "InvalidStateError", "TimeoutError", "QueueEmpty", "QueueFull",
    "Future", "Task", "create_task", "current_task", "all_tasks", "ensure_future",
    "sleep", "gather", "wait_for", "timeout", "timeout_at", "Timeout", "TaskGroup",
    "Event", "Queue", "Runner", "run",
]

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

# How long the exit policies and Runner.close() wait for leftovers before
# giving up (tasks that ignore cancellation, peers that never read).
_EXIT_BOUND_S = 10.0

# Number of live traced loops. Future resolution checks it (one global load)
# to decide whether to emit flow arrows, so that untraced runs pay nothing more.
_tracing = 0


class _LoopState:
    """What the hybrid kernel knows about one callback loop."""
    __slots__ = ("loop", "probe", "trace", "eager", "drain_empty", "tasks", "current",
                 "next_id", "__weakref__")

    def __init__(self, loop, spawn="lazy", drain="asyncio"):
        self.loop = loop
        self.probe = loop.probe
        self.trace = loop.probe.trace
        self.eager = spawn == "eager"
        self.drain_empty = drain == "empty"
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

    Hazard: a Future is not thread-safe; resolve it from the loop's thread
    (``loop.call_soon_threadsafe(fut.set_result, x)`` from elsewhere).
    """
    __slots__ = ("_loop", "_state", "_result", "_exception", "_callbacks", "_blocking",
                 "_cancel_message", "__weakref__")

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
                raise self._exception
            return self._result
        if self._state is _CANCELLED:
            raise _cancelled_error(self._cancel_message)
        raise InvalidStateError("result is not ready")

    def exception(self):
        if self._state is _FINISHED:
            return self._exception
        if self._state is _CANCELLED:
            raise _cancelled_error(self._cancel_message)
        raise InvalidStateError("exception is not set")

    def add_done_callback(self, fn) -> None:
        if self._state is _PENDING:
            self._callbacks.append(fn)
        else:
            self._loop.call_soon(fn, self)

    def remove_done_callback(self, fn) -> int:
        """Remove every occurrence of ``fn``; returns how many were removed."""
        before = len(self._callbacks)
        self._callbacks = [cb for cb in self._callbacks if cb != fn]
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


# -- Task -----------------------------------------------------------------------------------

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


class Task(Future):
    """Runs a coroutine on the loop, one step per wake-up.

    Contract:
    - Creating a Task queues its first step, as ``call_soon`` would (``spawn="lazy"``,
      asyncio): the child has not run when the constructor returns, and runs
      before its parent resumes from a ``sleep(0)`` (the ready queue is FIFO).
      With ``spawn="eager"`` (asyncio 3.12's eager task factory) the first step
      runs inside the constructor, up to the child's first suspension, when the
      loop is running.
    - ``cancel()`` is a request: a ``CancelledError`` is thrown into the
      coroutine at its current await point on the next step. The coroutine may
      catch it. The Task ends cancelled if the error escapes it.
    - The Task is done (and its own callbacks scheduled) when the coroutine
      returns or raises.

    Hazard: cancellation is edge-triggered, as in asyncio -- one ``cancel()``
    delivers one ``CancelledError``; a coroutine that catches it and awaits
    again is not cancelled again. ``cancelling()``/``uncancel()`` count
    requests for structured users (``timeout``, ``TaskGroup``).
    """
    __slots__ = ("_coro", "_kstate", "_fut_waiter", "_must_cancel", "_num_cancels_requested",
                 "_name", "_tid", "_flow", "_log_exc", "_step_handle")

    def __init__(self, coro, *, loop=None, name=None):
        if not (hasattr(coro, "send") and hasattr(coro, "throw")):
            raise TypeError(f"a coroutine was expected, got {coro!r}")
        loop = get_running_loop() if loop is None else loop
        Future.__init__(self, loop=loop)
        st = _states.get(loop)
        if st is None:
            st = _state_for(loop)
        self._coro = coro
        self._kstate = st
        self._fut_waiter = None
        self._must_cancel = False
        self._num_cancels_requested = 0
        self._log_exc = False
        self._flow = 0
        st.next_id += 1
        self._tid = TASK_TID_BASE + st.next_id
        self._name = name
        st.tasks.add(self)
        st.probe.spawns += 1
        trace = st.trace
        if trace is not None:
            trace.track(self._tid, f"{self.get_name()} {getattr(coro, '__qualname__', '?')}")
            parent = st.current
            tid = parent._tid if parent is not None else LOOP_TID
            trace.instant("spawn", tid, child=self._tid)
            self._flow = trace.flow_start(tid)
        self._step_handle = _StepHandle(Task.__step, (self,))
        if st.eager and loop.is_running():
            self.__step()
        else:
            loop._check_closed()      # what call_soon would check
            loop._ready.append(self._step_handle)

    def __repr__(self):
        return f"<Task {self.get_name()} {Future.__repr__(self)[1:-1]} coro={self._coro!r}>"

    def __del__(self):
        # The "only in a log" error surface: nobody awaited this task, so its
        # exception would otherwise vanish. (getattr: __init__ may have failed.)
        if getattr(self, "_log_exc", False):
            try:
                self._loop.call_exception_handler({
                    "message": "Task exception was never retrieved",
                    "exception": self._exception, "task": self})
            except Exception:
                pass

    def get_name(self) -> str:
        return self._name if self._name is not None else f"Task-{self._tid - TASK_TID_BASE}"

    def set_name(self, name) -> None:
        self._name = str(name)

    def get_coro(self):
        return self._coro

    def result(self):
        self._log_exc = False
        return Future.result(self)

    def exception(self):
        self._log_exc = False
        return Future.exception(self)

    def set_result(self, result):
        raise RuntimeError("Task does not support set_result()")

    def set_exception(self, exception):
        raise RuntimeError("Task does not support set_exception()")

    def cancel(self, msg=None) -> bool:
        """Request cancellation (see the class docstring); False if already done."""
        if self._state is not _PENDING:
            return False
        self._num_cancels_requested += 1
        st = self._kstate
        st.probe.cancellations += 1
        if st.trace is not None:
            st.trace.instant("cancel", self._tid)
        waiter = self._fut_waiter
        if waiter is not None and waiter.cancel(msg):
            # Keep _fut_waiter: if it is a Task that swallows the cancellation
            # we may have to cancel it again.
            return True
        self._must_cancel = True
        self._cancel_message = msg
        return True

    def cancelling(self) -> int:
        return self._num_cancels_requested

    def uncancel(self) -> int:
        if self._num_cancels_requested > 0:
            self._num_cancels_requested -= 1
        return self._num_cancels_requested

    def __step(self, exc=None):
        # One step: resume the coroutine until its next suspension. Queued as the
        # task's _StepHandle (first step, bare yield, or by the Future the task
        # awaits, which is still in _fut_waiter: its outcome goes into the
        # coroutine), or with call_soon and ``exc`` to throw a misuse error. There
        # is no separate wake-up callback that calls the step: one frame less on
        # every await that suspends.
        if self._state is not _PENDING:
            raise InvalidStateError(f"step of a finished task: {self!r}")
        future = self._fut_waiter
        if future is not None:
            self._fut_waiter = None
            if future._state is _FINISHED:
                if future._exception is not None:
                    exc = future._exception
                    if isinstance(future, Task):
                        future._log_exc = False
            else:
                exc = _cancelled_error(future._cancel_message)
        if self._must_cancel:
            if not isinstance(exc, CancelledError):
                exc = _cancelled_error(self._cancel_message)
            self._must_cancel = False
        st = self._kstate
        prev = st.current
        st.current = self
        st.probe.task_switches += 1
        trace = st.trace
        if trace is not None:
            trace.begin("step", self._tid)
            if self._flow:
                trace.flow_end(self._flow, self._tid)
                self._flow = 0
        try:
            if exc is None:
                result = self._coro.send(None)
            else:
                result = self._coro.throw(exc)
        except StopIteration as stop:
            if self._must_cancel:   # cancelled during the step that returned
                self._must_cancel = False
                Future.cancel(self, self._cancel_message)
            else:
                Future.set_result(self, stop.value)
            st.tasks.discard(self)
            self._step_handle = None
        except CancelledError as err:
            Future.cancel(self, err.args[0] if err.args else None)
            st.tasks.discard(self)
            self._step_handle = None
        except (KeyboardInterrupt, SystemExit) as err:
            Future.set_exception(self, err)
            st.tasks.discard(self)
            self._step_handle = None
            raise
        except BaseException as err:
            Future.set_exception(self, err)
            self._log_exc = True
            st.tasks.discard(self)
            self._step_handle = None
        else:
            if result is None:
                # Bare yield: give every other ready callback one turn.
                self._loop._ready.append(self._step_handle)
            elif isinstance(result, Future) and result._blocking:
                if result._loop is not self._loop:
                    self._loop.call_soon(self.__step, RuntimeError(
                        f"task {self.get_name()} awaited a future of a different loop"))
                elif result is self:
                    self._loop.call_soon(self.__step, RuntimeError(
                        f"task {self.get_name()} cannot await itself"))
                else:
                    result._blocking = False
                    result._callbacks.append(self._step_handle)
                    self._fut_waiter = result
                    if self._must_cancel and result.cancel(self._cancel_message):
                        self._must_cancel = False
            else:
                self._loop.call_soon(self.__step, RuntimeError(
                    f"task {self.get_name()} got bad yield {result!r} (only awaiting a "
                    "kernels.hybrid Future, or a bare yield, can suspend a task)"))
        finally:
            st.current = prev
            if trace is not None:
                trace.end(self._tid)


def create_task(coro, *, name=None) -> Task:
    """Wrap ``coro`` in a Task on the running loop (see ``Task`` for when it first runs)."""
    return Task(coro, name=name)


def current_task(loop=None):
    """The Task whose step is running on ``loop`` (default: the running loop), or None."""
    if loop is None:
        loop = get_running_loop()
    return _state_for(loop).current


def all_tasks(loop=None) -> set:
    """The Tasks of ``loop`` (default: the running loop) that are not done."""
    if loop is None:
        loop = get_running_loop()
    return {t for t in _state_for(loop).tasks if not t.done()}


def ensure_future(aw, *, loop=None):
    """A Future for ``aw``: itself if it is a Future, a new Task for a coroutine,
    a Task awaiting it for any other awaitable."""
    if isinstance(aw, Future):
        if loop is not None and aw._loop is not loop:
            raise ValueError("the future belongs to a different loop")
        return aw
    if isinstance(aw, types.CoroutineType) or (hasattr(aw, "send") and hasattr(aw, "throw")):
        return Task(aw, loop=loop)
    if hasattr(aw, "__await__"):
        async def _await_it():
            return await aw
        return Task(_await_it(), loop=loop)
    raise TypeError(f"an awaitable (Future, Task or coroutine) is required, got {aw!r}")


# -- sleep, gather, timeouts ----------------------------------------------------------------

@types.coroutine
def _yield_once():
    yield


def _set_result_if_pending(fut, result):
    if fut._state is _PENDING:
        fut.set_result(result)


async def sleep(delay, result=None):
    """Suspend for ``delay`` seconds and return ``result``.

    ``sleep(0)`` (or negative) is one bare yield: every callback that was
    ready before it runs, then the task continues -- the idiom that lets a
    scheduled ``connection_lost`` run (asyncio issue 466)."""
    if delay <= 0:
        await _yield_once()
        return result
    if math.isnan(delay):
        raise ValueError("sleep delay is NaN")
    loop = get_running_loop()
    fut = Future(loop=loop)
    handle = loop.call_later(delay, _set_result_if_pending, fut, result)
    try:
        return await fut
    finally:
        handle.cancel()


class _GatheringFuture(Future):
    """gather()'s outer future: cancelling it cancels the children."""
    __slots__ = ("_children", "_cancel_requested")

    def __init__(self, children, loop):
        Future.__init__(self, loop=loop)
        self._children = children
        self._cancel_requested = False

    def cancel(self, msg=None) -> bool:
        if self._state is not _PENDING:
            return False
        any_cancelled = False
        for child in self._children:
            if child.cancel(msg):
                any_cancelled = True
        if any_cancelled:
            # The outer future is cancelled when the children report back.
            self._cancel_requested = True
        return any_cancelled


def gather(*aws, return_exceptions=False):
    """Run awaitables concurrently; a Future of the list of their results, in order.

    asyncio 3.11 semantics: without ``return_exceptions`` the first exception
    (or a child's cancellation, as ``CancelledError``) is propagated at once
    and the other children keep running; with it, exceptions are results.
    Cancelling the returned future cancels every child."""
    if not aws:
        fut = Future(loop=get_running_loop())
        fut.set_result([])
        return fut
    # The same awaitable passed twice is run once (asyncio does the same); the
    # tuple keeps every argument alive, so ids are stable here.
    unique = {}
    children = []
    loop = None
    for aw in aws:
        fut = unique.get(id(aw))
        if fut is None:
            fut = unique[id(aw)] = ensure_future(aw, loop=loop)
            loop = fut._loop
        children.append(fut)
    outer = _GatheringFuture(children, loop)
    pending = [len(unique)]

    def on_child_done(child):
        pending[0] -= 1
        if outer._state is not _PENDING:
            if child._state is _FINISHED:
                child.exception()  # mark retrieved
            return
        if not return_exceptions:
            if child._state is _CANCELLED:
                outer.set_exception(_cancelled_error(child._cancel_message))
                return
            exc = child.exception()
            if exc is not None:
                outer.set_exception(exc)
                return
        if pending[0] == 0:
            results = []
            for c in children:
                if c._state is _CANCELLED:
                    results.append(_cancelled_error(c._cancel_message))
                else:
                    e = c.exception()
                    results.append(e if e is not None else c._result)
            if outer._cancel_requested:
                outer.set_exception(CancelledError())
            else:
                outer.set_result(results)

    for child in unique.values():
        child.add_done_callback(on_child_done)
    return outer


class Timeout:
    """Async context manager that cancels the enclosing task at a deadline and
    turns that cancellation into ``TimeoutError`` on exit (asyncio 3.11's
    ``asyncio.timeout``). Use ``timeout()`` / ``timeout_at()``.

    Hazard: only the ``CancelledError`` this timeout caused becomes a
    ``TimeoutError``; an outer cancellation passes through untouched (the
    task's ``cancelling()`` count tells them apart)."""

    def __init__(self, when):
        self._when = when
        self._state = "created"
        self._handle = None
        self._task = None
        self._cancelling = 0

    def when(self):
        return self._when

    def expired(self) -> bool:
        return self._state in ("expiring", "expired")

    def reschedule(self, when) -> None:
        if self._state != "entered":
            raise RuntimeError(f"cannot reschedule a timeout that is {self._state}")
        self._when = when
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if when is not None:
            loop = self._task._loop
            if when <= loop.time():
                self._handle = loop.call_soon(self._on_timeout)
            else:
                self._handle = loop.call_at(when, self._on_timeout)

    def __repr__(self):
        return f"<Timeout {self._state} when={self._when}>"

    async def __aenter__(self):
        if self._state != "created":
            raise RuntimeError("a Timeout can be entered only once")
        task = current_task()
        if task is None:
            raise RuntimeError("timeout() must be used inside a task")
        self._task = task
        self._state = "entered"
        self._cancelling = task.cancelling()
        self.reschedule(self._when)
        return self

    async def __aexit__(self, exc_type, exc, tb):
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._state == "expiring":
            self._state = "expired"
            if self._task.uncancel() <= self._cancelling and exc_type is CancelledError:
                raise TimeoutError from exc
        elif self._state == "entered":
            self._state = "exited"
        return None

    def _on_timeout(self):
        self._handle = None
        if self._state == "entered":
            self._task.cancel()
            self._state = "expiring"


def timeout(delay) -> Timeout:
    """``async with timeout(s):`` -- raise TimeoutError if the block runs longer
    than ``s`` seconds (None: never)."""
    if delay is not None and not isinstance(delay, (int, float)):
        raise TypeError(f"timeout delay must be a number or None, got {delay!r}")
    return Timeout(None if delay is None else get_running_loop().time() + delay)


def timeout_at(when) -> Timeout:
    """Like ``timeout`` with an absolute deadline in ``loop.time()`` units."""
    return Timeout(when)


async def wait_for(aw, timeout):
    """Await ``aw`` for at most ``timeout`` seconds; on expiry cancel it, wait
    for the cancellation to finish, and raise ``TimeoutError``.

    A coroutine is awaited inside the calling task (the 3.12 implementation,
    built on ``timeout()``; 3.11 wrapped it in a Task first -- the outcome is
    the same). ``timeout=None`` waits forever; ``timeout<=0`` returns only what
    is already done."""
    if timeout is None:
        return await aw
    if timeout <= 0:
        fut = ensure_future(aw)
        if fut.done():
            return fut.result()
        fut.cancel()
        await _wait_done(fut)
        try:
            return fut.result()
        except CancelledError as exc:
            raise TimeoutError from exc
    async with Timeout(get_running_loop().time() + timeout):
        return await aw


async def _wait_done(fut):
    """Wait until ``fut`` is done without taking its result or exception."""
    if fut.done():
        return
    waiter = Future(loop=fut._loop)
    fut.add_done_callback(lambda _f: _set_result_if_pending(waiter, None))
    await waiter


# -- TaskGroup ------------------------------------------------------------------------------

class TaskGroup:
    """Structured concurrency with asyncio 3.11 semantics.

    ``async with TaskGroup() as tg: tg.create_task(...)``: on exit the body waits
    for every task of the group. The first task that fails (with anything but
    ``CancelledError``) cancels the other tasks and the body itself; the exit
    then raises an ``ExceptionGroup`` (``BaseExceptionGroup`` if one is a
    KeyboardInterrupt/SystemExit, which is re-raised alone) of all errors.

    Hazard: the group cancels its parent task to interrupt the body, and takes
    that cancellation back with ``uncancel()`` on exit; a ``CancelledError``
    from an outside ``cancel()`` still propagates.
    """

    def __init__(self):
        self._entered = False
        self._exiting = False
        self._aborting = False
        self._loop = None
        self._parent = None
        self._parent_cancel_requested = False
        self._tasks = set()
        self._errors = []
        self._base_error = None
        self._all_done = None

    def __repr__(self):
        return (f"<TaskGroup tasks={len(self._tasks)} errors={len(self._errors or ())}"
                f"{' aborting' if self._aborting else ''}>")

    async def __aenter__(self):
        if self._entered:
            raise RuntimeError("TaskGroup has already been entered")
        self._loop = get_running_loop()
        self._parent = current_task(self._loop)
        if self._parent is None:
            raise RuntimeError("TaskGroup must be used inside a task")
        self._entered = True
        return self

    async def __aexit__(self, et, exc, tb):
        self._exiting = True
        if exc is not None and isinstance(exc, (KeyboardInterrupt, SystemExit)) \
                and self._base_error is None:
            self._base_error = exc
        propagate_cancel = exc if et is CancelledError else None
        if self._parent_cancel_requested and self._parent.uncancel() == 0:
            # The only cancellation pending was ours: don't let it escape.
            propagate_cancel = None
        if et is not None and not self._aborting:
            self._abort()
        while self._tasks:
            if self._all_done is None:
                self._all_done = Future(loop=self._loop)
            try:
                await self._all_done
            except CancelledError as cancel:
                if not self._aborting:
                    propagate_cancel = cancel
                    self._abort()
            self._all_done = None
        if self._base_error is not None:
            raise self._base_error
        if propagate_cancel is not None and not self._errors:
            raise propagate_cancel
        if et is not None and et is not CancelledError:
            self._errors.append(exc)
        if self._errors:
            errors, self._errors = self._errors, None
            raise BaseExceptionGroup("unhandled errors in a TaskGroup", errors) from None

    def create_task(self, coro, *, name=None) -> Task:
        if not self._entered:
            raise RuntimeError("TaskGroup has not been entered")
        if self._exiting and not self._tasks:
            raise RuntimeError("TaskGroup is finished")
        if self._aborting:
            raise RuntimeError("TaskGroup is shutting down")
        task = Task(coro, loop=self._loop, name=name)
        # An eager task may already be done: its callback is scheduled anyway.
        self._tasks.add(task)
        task.add_done_callback(self._on_task_done)
        return task

    def _abort(self):
        self._aborting = True
        for t in self._tasks:
            if not t.done():
                t.cancel()

    def _on_task_done(self, task):
        self._tasks.discard(task)
        if self._all_done is not None and not self._tasks and not self._all_done.done():
            self._all_done.set_result(True)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            return
        self._errors.append(exc)
        if isinstance(exc, (KeyboardInterrupt, SystemExit)) and self._base_error is None:
            self._base_error = exc
        if self._parent.done():
            self._loop.call_exception_handler({
                "message": f"task {task.get_name()} failed after its TaskGroup's parent finished",
                "exception": exc, "task": task})
            return
        if not self._aborting and not self._parent_cancel_requested:
            # Interrupt the body (it may be awaiting something unrelated); the
            # cancellation is taken back in __aexit__.
            self._abort()
            self._parent_cancel_requested = True
            self._parent.cancel()


# -- Event, Queue ---------------------------------------------------------------------------

class _LoopBound:
    """Binds to the running loop at first use (asyncio 3.10+)."""
    _loop = None

    def _get_loop(self):
        loop = get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise RuntimeError(f"{self!r} is bound to a different event loop")
        return loop


class Event(_LoopBound):
    """A flag tasks can wait for. ``set()`` wakes every waiter (on their next step)."""

    def __init__(self):
        self._waiters = collections.deque()
        self._value = False

    def __repr__(self):
        return f"<Event {'set' if self._value else 'unset'} waiters={len(self._waiters)}>"

    def is_set(self) -> bool:
        return self._value

    def set(self) -> None:
        if not self._value:
            self._value = True
            for fut in self._waiters:
                if not fut.done():
                    fut.set_result(True)

    def clear(self) -> None:
        self._value = False

    async def wait(self) -> bool:
        if self._value:
            return True
        fut = Future(loop=self._get_loop())
        self._waiters.append(fut)
        try:
            await fut
            return True
        finally:
            self._waiters.remove(fut)


class Queue(_LoopBound):
    """A FIFO queue for tasks (asyncio's shape). ``maxsize <= 0``: unbounded.

    ``put()`` waits while full, ``get()`` while empty; ``task_done()``/``join()``
    count unfinished items."""

    def __init__(self, maxsize=0):
        if not isinstance(maxsize, int):
            raise TypeError(f"maxsize must be an int, got {maxsize!r}")
        self._maxsize = maxsize
        self._queue = collections.deque()
        self._getters = collections.deque()
        self._putters = collections.deque()
        self._unfinished = 0
        self._finished = Event()
        self._finished.set()

    def __repr__(self):
        return f"<Queue maxsize={self._maxsize} qsize={len(self._queue)}>"

    @property
    def maxsize(self) -> int:
        return self._maxsize

    def qsize(self) -> int:
        return len(self._queue)

    def empty(self) -> bool:
        return not self._queue

    def full(self) -> bool:
        return 0 < self._maxsize <= len(self._queue)

    @staticmethod
    def _wake_one(waiters):
        while waiters:
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    async def put(self, item) -> None:
        while self.full():
            putter = Future(loop=self._get_loop())
            self._putters.append(putter)
            try:
                await putter
            except BaseException:
                putter.cancel()
                try:
                    self._putters.remove(putter)
                except ValueError:
                    pass
                if not self.full() and not putter.cancelled():
                    self._wake_one(self._putters)
                raise
        self.put_nowait(item)

    def put_nowait(self, item) -> None:
        if self.full():
            raise QueueFull
        self._queue.append(item)
        self._unfinished += 1
        self._finished.clear()
        self._wake_one(self._getters)

    async def get(self):
        while not self._queue:
            getter = Future(loop=self._get_loop())
            self._getters.append(getter)
            try:
                await getter
            except BaseException:
                getter.cancel()
                try:
                    self._getters.remove(getter)
                except ValueError:
                    pass
                if self._queue and not getter.cancelled():
                    self._wake_one(self._getters)
                raise
        return self.get_nowait()

    def get_nowait(self):
        if not self._queue:
            raise QueueEmpty
        item = self._queue.popleft()
        self._wake_one(self._putters)
        return item

    def task_done(self) -> None:
        if self._unfinished <= 0:
            raise ValueError("task_done() called too many times")
        self._unfinished -= 1
        if self._unfinished == 0:
            self._finished.set()

    async def join(self) -> None:
        if self._unfinished > 0:
            await self._finished.wait()


# -- Runner ---------------------------------------------------------------------------------

_SPAWN = ("lazy", "eager")
_DRAIN = ("asyncio", "empty")
_EXIT = ("cancel", "wait", "raise")
_WRITE = ("try-send", "defer")


def _check_choice(name, value, valid):
    if value not in valid:
        raise ValueError(f"{name}={value!r} is not a valid option; "
                         f"valid: {', '.join(map(repr, valid))}")


class Runner:
    """Owns one callback Loop and runs coroutines on it (``asyncio.Runner``).

    ``run(coro)`` makes the loop on first use (with the callback options
    ``high_water``, ``low_water``, ``write``, ``exit``, ``trace``), runs ``coro``
    as the main Task until it is done and returns its result. ``close()``
    applies the ``exit`` policy to what is left -- tasks still running and
    bytes still buffered in transports -- records it in
    ``probe.exit_report``, and closes the loop, which releases every fd.

    exit:
    - ``cancel`` (asyncio.run): cancel leftover tasks, run until they finish,
      close; the loop counts unsent transport bytes as ``lost_on_exit_bytes``.
    - ``wait`` (a trio nursery around main): wait for leftover tasks, then for
      transports to flush and closing transports to close (the loop's
      ``exit="wait"``), 10 s in all; what remains is then cancelled / lost.
      ``run()`` itself does not wait for transports: the wait happens once, at
      close.
    - ``raise``: like cancel, then ``RuntimeError`` naming the tasks and bytes
      left, if any (not raised over an exception already propagating from
      ``with Runner()``).

    The main task is always scheduled lazily, even with ``spawn="eager"``: its
    first step must run inside the loop so ``get_running_loop()`` works.
    """

    def __init__(self, high_water=65536, low_water=16384, write="try-send", spawn="lazy",
                 drain="asyncio", exit="cancel", trace=False):
        for name, value in (("high_water", high_water), ("low_water", low_water)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be an int, got {value!r}")
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if low_water > high_water:
            raise ValueError(f"low_water ({low_water}) must be <= high_water ({high_water})")
        _check_choice("write", write, _WRITE)
        _check_choice("spawn", spawn, _SPAWN)
        _check_choice("drain", drain, _DRAIN)
        _check_choice("exit", exit, _EXIT)
        if not isinstance(trace, bool):
            raise ValueError(f"trace must be True or False, got {trace!r}")
        self.options = {"high_water": high_water, "low_water": low_water, "write": write,
                        "spawn": spawn, "drain": drain, "exit": exit, "trace": trace}
        self._loop = None
        self._state = None
        self._closed = False

    def __enter__(self):
        return self

    def __exit__(self, et, exc, tb):
        self.close(_raise_policy=et is None)

    @property
    def loop(self) -> Loop:
        """The callback Loop (made on first access; still readable after close)."""
        return self._loop if self._closed and self._loop is not None else self._lazy_init()

    @property
    def probe(self):
        """The loop's Probe, with ``exit_report`` filled in by ``close()``."""
        return self.loop.probe

    def get_loop(self) -> Loop:
        return self.loop

    def _lazy_init(self) -> Loop:
        if self._closed:
            raise RuntimeError("Runner is closed")
        if self._loop is None:
            o = self.options
            loop = Loop(high_water=o["high_water"], low_water=o["low_water"], write=o["write"],
                        exit=o["exit"], trace=o["trace"])
            if o["exit"] == "wait":
                # The loop's "wait" drains on every stop(), i.e. at the end of every
                # run_until_complete. The Runner wants one bounded wait, at close:
                # no drain until then (close() sets the budget it has left).
                loop.exit_wait_s = 0.0
            st = _LoopState(loop, spawn=o["spawn"], drain=o["drain"])
            _states[loop] = st
            if st.trace is not None:
                global _tracing
                _tracing += 1
            self._loop, self._state = loop, st
        return self._loop

    def run(self, coro):
        """Run ``coro`` as the main task until it is done; return its result."""
        if not (hasattr(coro, "send") and hasattr(coro, "throw")):
            raise ValueError(f"a coroutine was expected, got {coro!r}")
        try:
            get_running_loop()
        except RuntimeError:
            pass
        else:
            coro.close()
            raise RuntimeError("Runner.run() cannot be called from a running event loop")
        loop = self._lazy_init()
        st = self._state
        eager, st.eager = st.eager, False
        try:
            task = Task(coro, loop=loop)
        finally:
            st.eager = eager
        try:
            return loop.run_until_complete(task)
        finally:
            if task.done() and not task.cancelled():
                task._log_exc = False
            elif not task.done():
                # KeyboardInterrupt or a stopped loop: the main task goes with the rest.
                task.cancel()

    def close(self, *, _raise_policy=True) -> None:
        """Apply the exit policy and close the loop. Idempotent.
        RuntimeError if called from inside the running loop."""
        if self._closed:
            return
        if self._loop is not None and self._loop.is_running():
            raise RuntimeError("Runner.close() cannot be called from a running event loop")
        self._closed = True
        loop, st = self._loop, self._state
        if loop is None:
            return
        policy = self.options["exit"]
        leftovers = [t for t in st.tasks if not t.done()]
        report = {"policy": policy, "tasks_left_count": len(leftovers)}
        failure = None
        deadline = loop.time() + _EXIT_BOUND_S
        try:
            if policy == "wait" and leftovers:
                self._run_bounded(self._wait_tasks(st), deadline - loop.time())
            remaining = [t for t in st.tasks if not t.done()]
            report["tasks_cancelled_count"] = len(remaining)
            if remaining:
                for t in remaining:
                    t.cancel()
                self._run_bounded(self._wait_tasks(st), _EXIT_BOUND_S)
                for t in remaining:
                    if t.done() and not t.cancelled() and t.exception() is not None:
                        loop.call_exception_handler({
                            "message": "unhandled exception during Runner.close()",
                            "exception": t.exception(), "task": t})
            if policy == "wait":
                # The loop's exit="wait": stop() returns once every transport
                # has flushed and closing ones have closed, or the budget is spent.
                loop.exit_wait_s = max(0.0, deadline - loop.time())
                loop.call_soon(loop.stop)
                loop.run_forever()
        finally:
            try:
                loop.close()
            except Exception as exc:  # exit="raise": the loop's UnsentDataError
                failure = exc
            finally:
                global _tracing
                if st.trace is not None:
                    _tracing -= 1
                _states.pop(loop, None)
                merged = dict(loop.probe.exit_report)
                merged.update(report)
                merged.setdefault("unsent_bytes", 0)
                loop.probe.exit_report = merged
        if policy == "raise" and _raise_policy and (report["tasks_left_count"]
                                                    or merged["unsent_bytes"]):
            raise RuntimeError(
                f"exit='raise': {report['tasks_left_count']} task(s) still running and "
                f"{merged['unsent_bytes']} byte(s) unsent when main returned "
                "(the tasks were cancelled and the bytes dropped)") from failure
        if failure is not None and not (policy == "raise"):
            raise failure

    @staticmethod
    async def _wait_tasks(st):
        # Tasks may spawn tasks while we wait: loop until none is left.
        me = st.current
        while True:
            pending = [t for t in st.tasks if not t.done() and t is not me]
            if not pending:
                return
            for t in pending:
                await _wait_done(t)

    def _run_bounded(self, coro, seconds):
        loop = self._loop
        task = Task(coro, loop=loop)
        handle = loop.call_later(seconds, task.cancel)
        try:
            loop.run_until_complete(task)
        except CancelledError:
            pass
        finally:
            handle.cancel()


def run(coro, **options):
    """``asyncio.run`` for this kernel: ``Runner(**options)``, run ``coro``, close."""
    with Runner(**options) as runner:
        return runner.run(coro)
