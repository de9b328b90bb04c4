"""Traces of reference runtimes, taken through their public hooks only.

``looplab trace`` writes the same Chrome trace-event JSON for a reference runtime
as for our kernels -- a track per task, a ``step`` slice per task step, and a flow
arrow from what scheduled a task to the step it caused -- so the two open side by
side in Perfetto. What each library lets an outsider see:

* trio: ``trio.abc.Instrument`` (added with ``trio.lowlevel.add_instrument`` when
  the main task starts) reports every spawn, every reschedule, every step and
  every wait for I/O. A reschedule inside a task step (an event set, a spawn, a
  task rescheduling itself) starts its arrow in that step; I/O readiness starts
  it inside the ``io wait`` slice on the ``run loop`` track (trio hands out I/O
  events before its after-wait hook), a deadline just after that slice.
* asyncio streams (and uvloop's): a task factory (``loop.set_task_factory``)
  wraps each new task's coroutine, so every ``send``/``throw`` the Task makes is
  a step. The future a step yields gets a done-callback, so the arrow starts when
  the loop runs that future's callbacks (on the ``loop callbacks`` track) -- not
  when, or by whom, the future was resolved, which no public hook shows. A spawn
  starts its arrow in the parent's step. The task that runs ``main`` exists
  before the factory is installed, so its steps are not seen.

How a runtime is traced is declared on it (``RuntimeInfo.tracing``): a port option
that turns its own trace on (our kernels: ``trace=true``), a traced twin of its port
(the classes here, for trio and asyncio/uvloop streams), or why it cannot be (asyncio's
and uvloop's Protocol/Transport code runs in plain callbacks that no public hook
reports; curio's activations are fixed when its kernel is made): refused with one
line. A runtime registered from outside declares its own the same way.

Mechanism: importing this module registers one extra runtime per runtime with a
traced twin, ``ID+trace`` (e.g. ``trio+trace``), whose port is the twin (with a
``trace()`` method); ``looplab trace`` loads this module as a runtime module, so the
cell process sees the same runtimes.
"""
from __future__ import annotations

import collections.abc
from dataclasses import replace

from kernels.probe import Trace
from bench import runtimes as rtmod
from protocols.asyncio_ports import AsyncioStreamPort, UvloopStreamPort
from protocols.errors import UsageError
from protocols.trio_curio_ports import TrioPort

__all__ = ["SUFFIX", "traceable", "plan", "traced_spec", "refusal", "register_twins",
           "TracedTrioPort", "TracedAsyncioStreamPort", "TracedUvloopStreamPort"]

SUFFIX = "+trace"
LOOP_TID = 0          # the run loop / plain loop callbacks; tasks get 1, 2, ...


def _how(info):
    t = info.tracing
    return t if t is not None and (t.option or t.port) else None


def traceable() -> list[str]:
    """The listed runtimes ``looplab trace`` can trace."""
    return [rid for rid in rtmod.ordered() if _how(rtmod.get(rid))]


def _loop_records(runtime) -> bool:
    """asyncio's Protocol port on looplab's loop: the loop is our callback kernel,
    which records its transports' events itself (``loop.trace=true``)."""
    return runtime.style == "callback" and runtime.options.get("loop") == "looplab"


def refusal(runtime) -> str | None:
    """Why ``looplab trace`` cannot trace this runtime, or None if it can."""
    if _how(runtime.info) or _loop_records(runtime):
        return None
    t = runtime.info.tracing
    why = t.refused if t is not None and t.refused else \
        "it declares no way to be traced (RuntimeInfo.tracing)"
    return (f"cannot trace {runtime.id}: {why}; traceable: {', '.join(traceable())}, and "
            f"asyncio's Protocol port on looplab's loop (loop=looplab: the loop records it)")


def traced_spec(runtime) -> str:
    """The spec to run traced, same options: the runtime with its trace option on,
    its traced twin ``ID+trace``, or, on looplab's loop, the loop told to record."""
    how = _how(runtime.info)
    spec = runtime.spec
    if how is None and _loop_records(runtime):
        return spec + ("," if ":" in spec else ":") + "loop.trace=true"
    if how is None:
        raise UsageError(refusal(runtime))
    if how.option:
        return spec + ("," if ":" in spec else ":") + how.option
    head, sep, rest = spec.partition(":")
    ident, at, interp = head.partition("@")     # the twin keeps the interpreter: ID+trace@3.12
    return ident + SUFFIX + at + interp + sep + rest


def plan(runtime) -> tuple[str, list[str]]:
    """(spec to run, runtime modules the cell process must load for it)."""
    spec = traced_spec(runtime)
    if _how(runtime.info) is None or runtime.info.tracing.option:
        return spec, []          # an option of its own, or looplab's loop recording
    register_twins()
    return spec, [__name__]


def register_twins() -> None:
    """Register ``ID+trace`` for every runtime whose tracing is a traced twin port."""
    for info in list(rtmod.RUNTIMES.values()):
        how = _how(info)
        if how is None or not how.port or info.id + SUFFIX in rtmod.RUNTIMES:
            continue
        rtmod.register(replace(info, id=info.id + SUFFIX, port=how.port, compared_with=(),
                               fingerprint=None, differences={}, probe_differences={},
                               probe_flips={}, tracing=None, variant_of=info.id, origin="",
                               summary=f"{info.summary}, traced through {how.hook} (looplab trace)"))


# ---------------------------------------------------------------------------
# trio

def _trio_tracer(trace: Trace):
    import trio

    class Tracer(trio.abc.Instrument):
        """Steps, spawns and reschedules as trace events; never raises (trio drops
        an instrument that does)."""

        def __init__(self):
            self.tids: dict = {}
            self.flows: dict = {}
            self.count = 0
            self.current = None      # the task whose step is running

        def tid(self, task) -> int:
            tid = self.tids.get(task)
            if tid is None:
                self.count += 1
                tid = self.tids[task] = self.count
                trace.track(tid, task.name)
            return tid

        def _here(self) -> int:
            return self.tid(self.current) if self.current is not None else LOOP_TID

        def task_spawned(self, task):
            trace.instant("spawn", self._here(), child=self.tid(task))

        def task_scheduled(self, task):
            self.flows[task] = trace.flow_start(self._here())

        def before_task_step(self, task):
            tid = self.tid(task)
            self.current = task
            trace.begin("step", tid)
            flow = self.flows.pop(task, 0)
            if flow:
                trace.flow_end(flow, tid)

        def after_task_step(self, task):
            # The step that added this instrument began unseen: no slice to end.
            if self.current is task:
                trace.end(self.tid(task))
            self.current = None

        def task_exited(self, task):
            trace.instant("exit", self.tid(task))
            self.flows.pop(task, None)

        def before_io_wait(self, timeout):
            trace.begin("io wait", LOOP_TID, timeout_s=timeout)

        def after_io_wait(self, timeout):
            trace.end(LOOP_TID)

    return Tracer()


class TracedTrioPort(TrioPort):
    """trio's port with a tracing Instrument added when the main task starts."""

    def __init__(self, runtime, opts):
        super().__init__(runtime, opts)
        self._trace = Trace()
        self._trace.track(LOOP_TID, "run loop")

    def trace(self) -> Trace:
        return self._trace

    def run(self, main, *args):
        import trio
        tracer = _trio_tracer(self._trace)

        async def traced(port, *rest):
            trio.lowlevel.add_instrument(tracer)
            return await main(port, *rest)
        # trio names the main task after its function: keep the driver's name
        traced.__qualname__ = getattr(main, "__qualname__", "main")
        traced.__module__ = getattr(main, "__module__", None)
        return super().run(traced, *args)


# ---------------------------------------------------------------------------
# asyncio (and uvloop) streams

class _Stepped(collections.abc.Coroutine):
    """A task's coroutine, seen from the Task: each send/throw is one step."""
    __slots__ = ("_coro", "_tracer", "_tid")

    def __init__(self, coro, tracer, tid):
        self._coro = coro
        self._tracer = tracer
        self._tid = tid

    def send(self, value):
        return self._tracer.step(self._tid, self._coro.send, value)

    def throw(self, *exc):
        return self._tracer.step(self._tid, self._coro.throw, *exc)

    def close(self):
        return self._coro.close()

    def __next__(self):
        return self.send(None)

    def __iter__(self):
        return self

    def __await__(self):
        return self


class _AsyncioTracer:
    def __init__(self, trace: Trace):
        import asyncio
        self._isfuture = asyncio.isfuture
        self._Task = asyncio.Task
        self.trace = trace
        self.flows: dict[int, int] = {}
        self.current = LOOP_TID
        self.next_tid = 0
        self.previous = None

    def install(self, loop) -> None:
        self.previous = loop.get_task_factory()
        loop.set_task_factory(self.factory)

    def factory(self, loop, coro, **kw):
        self.next_tid += 1
        tid = self.next_tid
        trace = self.trace
        parent = self.current
        trace.instant("spawn", parent, child=tid)
        self.flows[tid] = trace.flow_start(parent)
        stepped = _Stepped(coro, self, tid)
        if self.previous is not None:
            task = self.previous(loop, stepped, **kw)
        else:
            task = self._Task(stepped, loop=loop, **kw)
        trace.track(tid, getattr(coro, "__qualname__", None) or task.get_name())
        return task

    def _woken(self, tid, _fut) -> None:
        self.flows[tid] = self.trace.flow_start(LOOP_TID)

    def step(self, tid, fn, *args):
        trace = self.trace
        trace.begin("step", tid)
        flow = self.flows.pop(tid, 0)
        if flow:
            trace.flow_end(flow, tid)
        outer, self.current = self.current, tid
        try:
            yielded = fn(*args)
        except BaseException:
            trace.end(tid)
            raise
        finally:
            self.current = outer
        if yielded is None:
            # a bare yield (asyncio.sleep(0)): the Task reschedules itself now
            self.flows[tid] = trace.flow_start(tid)
        elif self._isfuture(yielded):
            # Added before the Task adds its own wake-up, so it runs just before it.
            yielded.add_done_callback(lambda fut, tid=tid: self._woken(tid, fut))
        trace.end(tid)
        return yielded


class _TracedStreams:
    """Mixin: install the task factory when the main coroutine starts."""

    def _setup_trace(self):
        self._trace = Trace()
        self._trace.track(LOOP_TID, "loop callbacks")

    def trace(self) -> Trace:
        return self._trace

    def run(self, main, *args):
        import asyncio
        tracer = _AsyncioTracer(self._trace)

        async def traced(port, *rest):
            tracer.install(asyncio.get_running_loop())
            return await main(port, *rest)
        traced.__qualname__ = getattr(main, "__qualname__", "main")
        return super().run(traced, *args)


class TracedAsyncioStreamPort(_TracedStreams, AsyncioStreamPort):
    def __init__(self, runtime, opts):
        super().__init__(runtime, opts)
        self._setup_trace()


class TracedUvloopStreamPort(_TracedStreams, UvloopStreamPort):
    def __init__(self, runtime, opts):
        super().__init__(runtime, opts)
        self._setup_trace()


register_twins()
