"""Synchronisation primitives for hybrid tasks: ``Event`` and ``Queue``
(asyncio's shapes), written on Futures only. Each binds to the running loop at
first use, as asyncio's do since 3.10.
"""
from __future__ import annotations

import collections

from kernels.callback import get_running_loop
from .futures import Future, QueueEmpty, QueueFull

__all__ = ["Event", "Queue"]


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
