"""The hybrid kernel's ``Runner``: it owns one callback loop, runs a main
coroutine on it as a Task, and applies the ``exit`` policy when it closes.
``OPTIONS`` (the callback loop's options plus ``spawn``, ``drain``, ``wait_for``
and the stream edges ``wait_closed``, ``drain_on_closing``, ``drain_waiters``) is
declared here.
"""
from __future__ import annotations

import contextvars

import kernels.callback as _callback
from kernels.callback import Loop, get_running_loop
from kernels.options import Option, choice
from . import futures as _futures
from .futures import WAIT_FOR_DEFAULT, CancelledError, _InContext, _LoopState, _states
from .streams import WAIT_CLOSED_DEFAULT, STREAM_DEFAULTS
from .tasks import Task, _wait_done

__all__ = ["Runner", "run", "OPTIONS"]

# How long the exit policies and Runner.close() wait for leftovers before
# giving up (tasks that ignore cancellation, peers that never read).
_EXIT_BOUND_S = 10.0

#: The hybrid kernel's options: the callback loop's (all passed to its loop), plus
#: how tasks start, what ``drain()`` waits for, and the stream layer's edges (put on
#: the loop as ``stream_options`` for ``streams`` to read on its rare paths).
OPTIONS = _callback.OPTIONS.extend("hybrid", (
    Option("spawn", "lazy", choice("lazy", "eager"),
           "lazy: a child runs after the parent yields (asyncio); eager: its first step "
           "runs inside create_task (3.12 eager task factory)"),
    Option("drain", "asyncio", choice("asyncio", "empty"),
           "asyncio: drain() returns unless paused, resuming at low water; "
           "empty: drain() waits for an empty buffer"),
    Option("wait_for", WAIT_FOR_DEFAULT, choice("task", "inline"),
           "task: wait_for runs a coroutine in a new Task (Python 3.11); inline: in the "
           "calling task under a timeout (3.12); the default follows the running Python"),
    Option("wait_closed", WAIT_CLOSED_DEFAULT, choice("3.11", "3.12"),
           "Server.wait_closed() after close(): 3.11: returns at once; 3.12: also waits for "
           "every accepted connection to close (3.12.1+, CPython 113538); the default "
           "follows the running Python"),
    Option("drain_on_closing", "yield", choice("yield", "return"),
           "drain() on a closing or lost transport: yield: yield once, then raise once the "
           "connection is lost (asyncio 3.8+); return: return at once without yielding or "
           "raising (asyncio issue 263, CPython 80982)"),
    Option("drain_waiters", "many", choice("many", "one"),
           "many: any number of tasks may await drain() on one writer (3.11); one: a second "
           "one raises AssertionError (before 3.11, CPython 74116)"),
))


class _ContextLoop(Loop):
    """The Runner's callback loop. As in asyncio, a callback scheduled with
    ``call_soon``, ``call_later`` or ``call_at`` runs in ``context=``, by default a
    copy of the context current when it was scheduled: a callback a task schedules
    sees the task's context variables as they were then. (A Task's own steps and
    the transports' I/O callbacks do not go through here.)"""

    def call_soon(self, callback, *args, context=None):
        if callback.__class__ is not _InContext:
            _check_callable(callback)
            callback = _InContext(callback, contextvars.copy_context() if context is None
                                  else context)
        return Loop.call_soon(self, callback, *args)

    def call_at(self, when, callback, *args, context=None):
        if callback.__class__ is not _InContext:
            _check_callable(callback)
            callback = _InContext(callback, contextvars.copy_context() if context is None
                                  else context)
        return Loop.call_at(self, when, callback, *args)

    def call_later(self, delay, callback, *args, context=None):
        if callback.__class__ is not _InContext:
            _check_callable(callback)
            callback = _InContext(callback, contextvars.copy_context() if context is None
                                  else context)
        return Loop.call_later(self, delay, callback, *args)


def _check_callable(callback):
    if not callable(callback):
        raise TypeError(f"callback must be callable, got {type(callback).__name__}")


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

    def __init__(self, *, io=None, **options):
        self.options = OPTIONS.validate(options)
        self._io = io
        self._loop = None
        self._state = None
        self._context = None
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
            loop = _ContextLoop(io=self._io, **{n: o[n] for n in _callback.OPTIONS.names()})
            loop.stream_options = {n: o[n] for n in STREAM_DEFAULTS}
            if o["exit"] == "wait":
                # The loop's "wait" drains on every stop(), i.e. at the end of every
                # run_until_complete. The Runner wants one bounded wait, at close:
                # no drain until then (close() sets the budget it has left).
                loop.exit_wait_s = 0.0
            st = _LoopState(loop, spawn=o["spawn"], drain=o["drain"], wait_for=o["wait_for"])
            # asyncio.Runner: every run() of this runner shares one copy of the
            # context current when the loop was made.
            self._context = contextvars.copy_context()
            _states[loop] = st
            if st.trace is not None:
                _futures._tracing += 1
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
            task = Task(coro, loop=loop, context=self._context)
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
                if st.trace is not None:
                    _futures._tracing -= 1
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
