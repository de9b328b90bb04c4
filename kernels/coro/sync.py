"""Synchronisation for coro tasks -- Event, Queue and TaskGroup -- built outside the kernel.

Nothing here touches the kernel's state. Everything is made of the public
primitives of ``task.py`` and ``traps.py``: ``WaitQueue`` (park a task / wake parked tasks),
``spawn``/``spawn_soon`` with an ``on_done`` callback, ``Task.cancel_soon`` and
``CancelScope``. That is curio's "microkernel" discipline: if a feature can be
written as an ordinary async function over a few traps, it doesn't belong in
the kernel, and writing it that way proves the traps are enough.
"""
from __future__ import annotations

from collections import deque

from .errors import Cancelled, TaskTimeout
from .task import CancelScope, WaitQueue
from .traps import spawn, spawn_soon

__all__ = ["Event", "Queue", "TaskGroup", "open_nursery"]


class Event:
    """A flag tasks can wait for. ``set()`` is synchronous and wakes every waiter;
    ``wait()`` on a set event returns at once without yielding (curio)."""
    __slots__ = ("_flag", "_waiters")

    def __init__(self):
        self._flag = False
        self._waiters = WaitQueue()

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        if not self._flag:
            self._flag = True
            self._waiters.wake_all()

    def clear(self) -> None:
        self._flag = False

    async def wait(self) -> None:
        if not self._flag:
            await self._waiters.park()

    def __repr__(self):
        return f"<coro Event {'set' if self._flag else 'unset'}, {len(self._waiters)} waiting>"


class Queue:
    """A FIFO queue between tasks. ``maxsize=0`` is unbounded; otherwise ``put``
    blocks while the queue holds ``maxsize`` items -- that is its backpressure.

    A woken getter/putter re-checks the condition, so a task that takes an item
    without ever blocking can't leave a woken one with nothing (it parks again)."""
    __slots__ = ("maxsize", "_items", "_getters", "_putters")

    def __init__(self, maxsize: int = 0):
        if not isinstance(maxsize, int) or isinstance(maxsize, bool):
            raise TypeError(f"Queue maxsize must be an int, got {maxsize!r}")
        if maxsize < 0:
            raise ValueError(f"Queue maxsize must be >= 0 (0 = unbounded), got {maxsize}")
        self.maxsize = maxsize
        self._items = deque()
        self._getters = WaitQueue()
        self._putters = WaitQueue()

    def qsize(self) -> int:
        return len(self._items)

    def empty(self) -> bool:
        return not self._items

    def full(self) -> bool:
        return 0 < self.maxsize <= len(self._items)

    async def put(self, item) -> None:
        while 0 < self.maxsize <= len(self._items):
            await self._putters.park()
        self._items.append(item)
        self._getters.wake()

    async def get(self):
        while not self._items:
            await self._getters.park()
        item = self._items.popleft()
        self._putters.wake()
        return item

    def __repr__(self):
        return f"<coro Queue {len(self._items)}/{self.maxsize or 'inf'}>"


class TaskGroup:
    """Nursery semantics (trio's nursery, curio's TaskGroup on its strict side).

    ``async with TaskGroup() as g:`` -- ``g.start_soon(fn, *args)`` (sync) and
    ``t = await g.spawn(fn, *args)`` start children. The block does not end
    until every child has. The first child error cancels the other children and
    the body (the body sees ``Cancelled`` at its next blocking trap; the group
    swallows that), waits for them all, then raises it: one error as is,
    several as an ``ExceptionGroup`` (body error first, then children in the
    order they failed). Children ending in ``Cancelled`` are not errors.

    If the task running the group is cancelled, or an enclosing timeout fires,
    while the group waits for its children, the children are cancelled, the
    group waits (shielded) until they have unwound, then re-raises that
    cancellation -- unless children failed, whose errors win (trio does the
    same). ``g.cancel()`` cancels every remaining child and, like trio's
    ``nursery.cancel_scope.cancel()``, the body if it is still running.
    """

    def __init__(self):
        self._children = set()
        self._errors = []
        self._idle = WaitQueue()          # the parent waits here for the last child
        self._scope = CancelScope()       # lets a failing child cancel the body
        self._state = 0                   # 0 new, 1 body running, 2 exiting, 3 closed

    async def __aenter__(self):
        if self._state:
            raise RuntimeError("a TaskGroup can be entered only once")
        await self._scope.__aenter__()
        self._state = 1
        return self

    def _check_open(self) -> None:
        if self._state not in (1, 2):
            raise RuntimeError("this TaskGroup is not open: start children inside its "
                               "`async with` block")

    def start_soon(self, fn, *args) -> None:
        """Start ``fn(*args)`` as a child; returns nothing (trio's shape)."""
        self._check_open()
        self._adopt(spawn_soon(fn, *args, on_done=self._child_done))

    async def spawn(self, fn, *args):
        """Start ``fn(*args)`` as a child and return its Task (curio's shape)."""
        self._check_open()
        task = await spawn(fn, *args, on_done=self._child_done)
        self._adopt(task)
        return task

    def _adopt(self, task) -> None:
        # An eager child may already have finished (and been counted by
        # _child_done) before spawn returned.
        if not task.done():
            self._children.add(task)

    def cancel(self) -> None:
        """Cancel every remaining child, and the body if it is still running."""
        self._scope.cancel()
        self._cancel_children()

    def _cancel_children(self) -> None:
        for task in list(self._children):
            task.cancel_soon()

    def _child_done(self, task) -> None:
        # on_done callback: runs inside the kernel when a child finishes.
        self._children.discard(task)
        exc = task.exception()
        if exc is not None and not isinstance(exc, Cancelled):
            self._errors.append(exc)
            if len(self._errors) == 1:
                self.cancel()
        if not self._children:
            self._idle.wake_all()

    async def __aexit__(self, et, exc, tb):
        self._state = 2
        if await self._scope.__aexit__(et, exc, tb):
            exc = None                       # the body was cancelled by us: not an error
        outer = None
        if exc is not None:
            if isinstance(exc, Cancelled):
                outer = exc                  # cancellation from outside the group
            else:
                self._errors.insert(0, exc)
            self._cancel_children()
        while self._children:
            try:
                await self._idle.park(shield=outer is not None)
            except (Cancelled, TaskTimeout) as e:
                outer = e
                self._cancel_children()
        self._state = 3
        errors = self._errors
        if len(errors) == 1:
            raise errors[0]
        if errors:
            raise BaseExceptionGroup(f"{len(errors)} errors in a coro TaskGroup", errors)
        if outer is not None and outer is not exc:
            raise outer
        return False


open_nursery = TaskGroup
