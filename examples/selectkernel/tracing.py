"""A traced twin of SelectPort, for ``looplab trace --runtime selectkernel``.

``__init__`` declares it on the runtime (``Tracing(port=...)``); looplab registers
the twin as ``selectkernel+trace`` and runs the cell on it. The twin makes every task
a ``_TracedTask``: each step is a ``step`` slice on the task's own track, and a spawn
draws an arrow from the parent's step to the child's first step. Wake-ups through a
Future are not drawn: the kernel resolves a Future in whatever callback happens to
run, and this twin does not reach into the kernel to see which one.

The kernel is untouched: the twin only replaces ``loop.create_task``. The recorder is
looplab's (``kernels.probe.Trace``), so this file, like ``__init__``, knows looplab.
"""
from __future__ import annotations

from kernels.probe import Trace

from .kernel import Task
from .port import SelectPort

__all__ = ["TracedSelectPort"]

LOOP_TID = 0      # the loop itself; tasks get 1, 2, ...


class _Tracer:
    def __init__(self):
        self.trace = Trace()
        self.trace.track(LOOP_TID, "select loop")
        self.tids: dict = {}
        self.flows: dict = {}

    def tid(self, task) -> int:
        tid = self.tids.get(task)
        if tid is None:
            tid = self.tids[task] = len(self.tids) + 1
            self.trace.track(tid, task.name)
        return tid

    def spawned(self, task, parent) -> None:
        tid = self.tid(task)
        if parent is not None:     # main is made by run(), outside any step: no arrow
            ptid = self.tid(parent)
            self.trace.instant("spawn", ptid, child=tid)
            self.flows[task] = self.trace.flow_start(ptid)

    def begin(self, task) -> int:
        tid = self.tid(task)
        self.trace.begin("step", tid)
        flow = self.flows.pop(task, 0)
        if flow:
            self.trace.flow_end(flow, tid)
        return tid


class _TracedTask(Task):
    def __init__(self, loop, coro, name, tracer):
        self._tracer = tracer
        super().__init__(loop, coro, name)
        tracer.spawned(self, loop.current)

    def _step(self, waited=None) -> None:
        if self.done():
            return
        tid = self._tracer.begin(self)
        try:
            super()._step(waited)
        finally:
            self._tracer.trace.end(tid)


class TracedSelectPort(SelectPort):
    """SelectPort whose tasks record their steps; ``trace()`` is the recording."""

    def __init__(self, runtime=None, options=None):
        super().__init__(runtime, options)
        tracer, loop = _Tracer(), self.loop
        self._tracer = tracer

        def create_task(coro, name: str = ""):
            return _TracedTask(loop, coro, name, tracer)
        loop.create_task = self.create_task = create_task

    def trace(self) -> Trace:
        return self._tracer.trace
