"""The core of selectkernel: a `selectors` loop, Futures with callbacks, and Tasks
that step a coroutine by sending it the result of the Future it waited on.

Standard library only. The shape follows the idea of the "500 Lines or Less"
crawler chapter (a select loop, a Future, a Task stepping a coroutine); the code
is written from scratch for looplab. Everything runs on one thread: a callback
is either "ready" (run on the next pass) or attached to a timer or an fd.
"""
from __future__ import annotations

import heapq
import itertools
import selectors
import time

__all__ = ["Loop", "Future", "Task", "CancelledError", "Deadlock"]


class CancelledError(BaseException):
    """Thrown into a cancelled task (a BaseException, as in asyncio >= 3.8)."""


class Deadlock(RuntimeError):
    """Nothing is ready, no timer is due and no fd is watched: main can never finish."""


class Future:
    """A result that arrives later. Callbacks run on a later loop pass, never inside
    ``set_result``, so whoever resolves a future is never re-entered."""

    def __init__(self, loop: "Loop"):
        self._loop = loop
        self._state = "pending"          # pending | done | cancelled
        self._result = None
        self._exception = None
        self._callbacks: list = []

    def done(self) -> bool:
        return self._state != "pending"

    def cancelled(self) -> bool:
        return self._state == "cancelled"

    def result(self):
        if self._state == "cancelled":
            raise CancelledError()
        if self._state == "pending":
            raise RuntimeError("result() of a pending future")
        if self._exception is not None:
            raise self._exception
        return self._result

    def exception(self):
        if self._state == "cancelled":
            raise CancelledError()
        return self._exception

    def add_done_callback(self, fn) -> None:
        if self.done():
            self._loop.call_soon(fn, self)
        else:
            self._callbacks.append(fn)

    def _finish(self, state: str) -> None:
        self._state = state
        callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            self._loop.call_soon(fn, self)

    def set_result(self, value) -> None:
        if self.done():
            raise RuntimeError("future already done")
        self._result = value
        self._finish("done")

    def set_exception(self, exc: BaseException) -> None:
        if self.done():
            raise RuntimeError("future already done")
        self._exception = exc
        self._finish("done")

    def cancel(self) -> bool:
        if self.done():
            return False
        self._finish("cancelled")
        return True

    def __await__(self):
        if not self.done():
            yield self               # the Task parks here until we are done
        return self.result()


class Task(Future):
    """Drives one coroutine. The coroutine yields a Future to wait on, or None to
    let everything else that is ready run first (``sleep(0)``)."""

    def __init__(self, loop: "Loop", coro, name: str = ""):
        super().__init__(loop)
        self._coro = coro
        self.name = name or f"task-{next(loop._ids)}"
        self._waiting: Future | None = None
        self._must_cancel = False
        loop.tasks.add(self)
        loop.call_soon(self._step)   # lazy: the child starts after its creator yields

    def cancel(self) -> bool:
        """Edge-triggered: one CancelledError, delivered where the task waits."""
        if self.done():
            return False
        if self._waiting is not None and self._waiting.cancel():
            return True              # its wake-up throws CancelledError into the task
        self._must_cancel = True
        return True

    def _step(self, waited: Future | None = None) -> None:
        if self.done():
            return
        self._waiting = None
        loop = self._loop
        loop.current, prev = self, loop.current
        loop.steps += 1
        try:
            if self._must_cancel:
                self._must_cancel = False
                yielded = self._coro.throw(CancelledError())
            elif waited is None:
                yielded = self._coro.send(None)
            elif waited.cancelled() or waited._exception is not None:
                yielded = self._coro.throw(waited.exception() if not waited.cancelled()
                                           else CancelledError())
            else:
                yielded = self._coro.send(waited._result)
        except StopIteration as stop:
            self._end(self.set_result, stop.value)
        except CancelledError:
            self._end(lambda _: Future.cancel(self), None)
        except (KeyboardInterrupt, SystemExit):
            self._end(lambda _: Future.cancel(self), None)
            raise
        except BaseException as exc:
            self._end(self.set_exception, exc)
        else:
            if yielded is None:
                loop.call_soon(self._step)
            elif isinstance(yielded, Future):
                self._waiting = yielded
                yielded.add_done_callback(self._step)
            else:
                self._coro.close()
                self._end(self.set_exception, TypeError(f"task yielded {yielded!r}, not a Future"))
        finally:
            loop.current = prev

    def _end(self, finish, value) -> None:
        self._loop.tasks.discard(self)
        finish(value)


class _Timer:
    __slots__ = ("when", "fn", "args", "cancelled")

    def __init__(self, when, fn, args):
        self.when, self.fn, self.args, self.cancelled = when, fn, args, False

    def cancel(self) -> None:
        self.cancelled = True


class Loop:
    """Ready callbacks (FIFO), timers (a heap) and fds (one selector). ``run_until``
    turns the crank until a predicate holds; nothing here knows about sockets."""

    def __init__(self):
        self._selector = selectors.DefaultSelector()
        self._ready: list = []
        self._timers: list = []
        self._seq = itertools.count()
        self._ids = itertools.count(1)
        self._fds: dict[int, list] = {}  # fd -> [on_readable, on_writable]
        self.tasks: set[Task] = set()
        self.current: Task | None = None
        self.passes = 0
        self.steps = 0
        self.callbacks = 0
        self.closed = False
        self._stopping = False

    def time(self) -> float:
        return time.monotonic()

    def call_soon(self, fn, *args) -> None:
        self._ready.append((fn, args))

    def call_later(self, delay: float, fn, *args) -> _Timer:
        timer = _Timer(self.time() + max(0.0, delay), fn, args)
        heapq.heappush(self._timers, (timer.when, next(self._seq), timer))
        return timer

    def create_task(self, coro, name: str = "") -> Task:
        return Task(self, coro, name)

    # fds: one callback per direction; the selector mask follows what is set.
    def _watch(self, fd: int, slot: int, fn) -> None:
        entry = self._fds.setdefault(fd, [None, None])
        entry[slot] = fn
        mask = (selectors.EVENT_READ if entry[0] else 0) | (selectors.EVENT_WRITE if entry[1] else 0)
        if not mask:
            del self._fds[fd]
            self._selector.unregister(fd)
        elif fd in self._selector.get_map():
            self._selector.modify(fd, mask)
        else:
            self._selector.register(fd, mask)

    def add_reader(self, fd, fn): self._watch(fd, 0, fn)
    def add_writer(self, fd, fn): self._watch(fd, 1, fn)

    def remove_reader(self, fd):
        if self._fds.get(fd, (None,))[0]:
            self._watch(fd, 0, None)

    def remove_writer(self, fd):
        if self._fds.get(fd, (None, None))[1]:
            self._watch(fd, 1, None)

    def run_once(self) -> None:
        self.passes += 1
        if self._ready:
            timeout = 0.0
        elif self._timers:
            timeout = max(0.0, self._timers[0][0] - self.time())
        elif self._fds:
            timeout = None
        else:
            raise Deadlock("nothing is ready, no timer is set and no fd is watched")
        for key, events in self._selector.select(timeout):
            entry = self._fds.get(key.fd)
            # A callback may unwatch the fd (or the other direction) as it runs.
            if entry and events & selectors.EVENT_READ and entry[0]:
                entry[0]()
            entry = self._fds.get(key.fd)
            if entry and events & selectors.EVENT_WRITE and entry[1]:
                entry[1]()
        now = self.time()
        while self._timers and self._timers[0][0] <= now:
            timer = heapq.heappop(self._timers)[2]
            if not timer.cancelled:
                self._ready.append((timer.fn, timer.args))
        # Only what is ready now runs this pass; what it schedules waits for the next.
        batch, self._ready = self._ready, []
        for fn, args in batch:
            self.callbacks += 1
            fn(*args)

    def run_until(self, done) -> None:
        while not done():
            self.run_once()

    # asyncio's run_forever()/stop() pair, for programs that stop the loop themselves.
    def run_forever(self) -> None:
        self._stopping = False
        self.run_until(lambda: self._stopping)

    def stop(self) -> None:
        self._stopping = True

    def close(self) -> None:
        if not self.closed:
            # Unfinished coroutines get GeneratorExit now (their finally blocks run
            # while the selector still exists), not a warning at garbage collection.
            for task in list(self.tasks):
                try:
                    task._coro.close()
                except Exception:     # noqa: BLE001 -- one that awaits in finally
                    pass
            self.tasks.clear()
            self.closed = True
            self._selector.close()
            self._fds.clear()
            self._ready.clear()
            self._timers.clear()
