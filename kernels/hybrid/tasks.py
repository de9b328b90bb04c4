"""Tasks, the coroutines the hybrid kernel steps on the callback loop, and what
is built directly on them: ``sleep``, ``gather``, ``timeout``/``wait_for`` and
``TaskGroup``.

A ``Task`` is a Future that drives a coroutine: it calls ``coro.send(None)``
(a *step*); when the coroutine awaits a pending Future, the Future comes out of
``send`` (``yield self`` in ``Future.__await__``) and the Task parks its step on
that Future's callback list. When somebody resolves the Future the step is
queued on the loop's ready queue and runs on a later pass, reading the outcome
from the Future it waited on. A bare ``yield`` (``sleep(0)``) queues the next
step directly.

The step is queued through a ``_StepHandle``, the task's one ready-queue entry,
made at spawn and reused for every step: a Task never has two steps pending,
so it needs no fresh ``Handle`` per wake-up, and the step needs no separate
wake-up callback in front of it. Plain callbacks (``add_done_callback``) still
go through ``loop.call_soon`` one by one. The event loop itself is the
callback kernel's ``Loop.run_forever``; ``Task.__step`` is what it calls.
"""
from __future__ import annotations

import functools
import math
import types
from contextvars import copy_context

from kernels.callback import get_running_loop
from . import futures as _futures
from .futures import (LOOP_TID, TASK_TID_BASE, _CANCELLED, _FINISHED, _PENDING, CancelledError,
                      InvalidStateError, TimeoutError, _StepHandle, _cancelled_error, _state_for,
                      _report_unretrieved)

# Assigned, not imported: CPython 3.11 compiles ``Name.attr(...)`` into a
# method call (no bound-method object) only when ``Name`` is not bound by an
# import, and the step path calls ``Future.set_result(self, ...)`` and
# ``_states.get(loop)`` on every task.
Future = _futures.Future
_states = _futures._states

__all__ = ["Task", "create_task", "current_task", "all_tasks", "ensure_future", "sleep",
           "gather", "wait_for", "timeout", "timeout_at", "Timeout", "TaskGroup"]


# -- Task -----------------------------------------------------------------------------------

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
                 "_name", "_tid", "_flow", "_step_handle", "_context", "_in_context",
                 "_send")

    def __init__(self, coro, *, loop=None, name=None, context=None):
        if not (hasattr(coro, "send") and hasattr(coro, "throw")):
            raise TypeError(f"a coroutine was expected, got {coro!r}")
        loop = get_running_loop() if loop is None else loop
        Future.__init__(self, loop=loop)
        # Every step runs in this context: a copy of the creator's, taken now
        # (asyncio), so neither side sees what the other sets afterwards.
        self._context = copy_context() if context is None else context
        # Bound once: two method objects fewer on every step.
        self._in_context = self._context.run
        self._send = coro.send
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
        # nobody awaited this task: its exception would otherwise vanish
        _report_unretrieved(self, "task")

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
                result = self._in_context(self._send, None)
            else:
                result = self._in_context(self._coro.throw, exc)
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


def create_task(coro, *, name=None, context=None) -> Task:
    """Wrap ``coro`` in a Task on the running loop (see ``Task`` for when it first
    runs). It runs in ``context``, by default a copy of the current one."""
    return Task(coro, name=name, context=context)


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

    The ``wait_for`` option says how: ``"task"`` (Python 3.11) wraps a
    coroutine in a new Task and waits for that (``current_task()`` inside is not
    the caller); ``"inline"`` (3.12) awaits it inside the calling task under a
    ``timeout()``. ``timeout=None`` waits forever; ``timeout<=0`` returns only
    what is already done."""
    if timeout is None:
        return await aw
    loop = get_running_loop()
    if timeout <= 0:
        fut = ensure_future(aw, loop=loop)
        if fut.done():
            return fut.result()
        fut.cancel()
        await _wait_done(fut)
        try:
            return fut.result()
        except CancelledError as exc:
            raise TimeoutError from exc
    if _state_for(loop).wait_for_task:
        return await _wait_for_in_task(aw, timeout, loop)
    async with Timeout(loop.time() + timeout):
        return await aw


async def _wait_for_in_task(aw, timeout, loop):
    # Python 3.11's wait_for: the awaitable runs as its own Task; this task
    # waits on a waiter that either the Task's end or the timer releases.
    waiter = Future(loop=loop)
    timeout_handle = loop.call_later(timeout, _release_waiter, waiter)
    cb = functools.partial(_release_waiter, waiter)
    fut = ensure_future(aw, loop=loop)
    fut.add_done_callback(cb)
    try:
        try:
            await waiter
        except CancelledError:
            if fut.done():
                return fut.result()
            fut.remove_done_callback(cb)
            await _cancel_and_wait(fut, loop)     # never leave it running
            raise
        if fut.done():
            return fut.result()
        fut.remove_done_callback(cb)
        await _cancel_and_wait(fut, loop)
        try:
            return fut.result()                   # it may have ignored the cancel
        except CancelledError as exc:
            raise TimeoutError from exc
    finally:
        timeout_handle.cancel()


async def _cancel_and_wait(fut, loop):
    waiter = Future(loop=loop)
    cb = functools.partial(_release_waiter, waiter)
    fut.add_done_callback(cb)
    try:
        fut.cancel()
        await waiter       # not fut itself: this wait must stay cancellable
    finally:
        fut.remove_done_callback(cb)


def _release_waiter(waiter, *args):
    if waiter._state is _PENDING:
        waiter.set_result(None)


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
