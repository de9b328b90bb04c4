"""The least a spawn+join can cost in this interpreter: the yardstick for the
spawn+join goal.

``await spawn(child)`` then ``await task.join()`` with nothing but what the API
itself makes: a coroutine for the child, a task object with the coro kernel's
twelve fields, two awaited generators (``spawn``'s and ``join``'s) and the
child's ``StopIteration``. No kernel: no ready queue, no task table, no
cancellation, no exit policy. A real kernel can only add to this::

    python -m bench.perf.icount --micro spawn_join floor coro curio

counts it beside the kernels, in instructions per operation (callgrind).
"""
from __future__ import annotations

import sys
import types

__all__ = ["run"]


class _Task:
    # No __init__: calling a class without one and setting the slots after is
    # the cheapest way to make the object (the coro kernel does the same).
    __slots__ = ("id", "body", "daemon", "_value", "_exc", "_wait", "_pending", "_cancel",
                 "_scopes", "_done", "_joiners", "_callbacks", "_result", "_exception",
                 "__weakref__")


@types.coroutine
def _spawn(fn):
    task = _Task()
    task.id = 1
    task.body = fn()
    task.daemon = False
    task._value = task._exc = task._scopes = task._joiners = task._callbacks = None
    task._wait = task._cancel = 0
    task._pending = task._done = False
    return task
    yield       # never reached: a generator, so that it can be awaited


@types.coroutine
def _join(task):
    if not task._done:
        try:
            task.body.send(None)
        except StopIteration as e:
            task._done, task._result, task._exception = True, e.value, None
    return task._result
    yield       # never reached


def run(n: int) -> int:
    """``n`` spawn+joins of a child that counts itself; returns the count."""
    box = [0]

    async def child():
        box[0] += 1

    async def main():
        for _ in range(n):
            task = await _spawn(child)
            await _join(task)

    coro = main()
    try:
        coro.send(None)
    except StopIteration:
        pass
    return box[0]


if __name__ == "__main__":
    sys.exit(0 if run(int(sys.argv[1])) == int(sys.argv[1]) else 1)
