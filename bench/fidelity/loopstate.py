"""Loop-conformance probes, continued: a loop's own state -- its life (run, stop,
close), the clock and scheduled callbacks, handles, tasks and futures, reading paused
around EOF and write-buffer limits, the protocol's callbacks and when
``connection_lost`` comes. The rules of ``bench.fidelity.loops`` hold here: each probe
is self-contained and each key is one call.
"""
from __future__ import annotations

import contextvars
import threading
import time
import weakref

from bench.fidelity.loops import _call, _wait, loop_probe
from bench.fidelity.promises import doc

# --- a closed loop, running state, threads ---------------------------------------------

def _closed_loop(a):
    loop = type(a.get_running_loop())()
    loop.close()
    return loop


@loop_probe()
async def lp_call_soon_after_close(a):
    """call_soon(), call_later() and create_future() on a closed loop (of the same class)."""
    loop = _closed_loop(a)
    return {"call_soon": _call(lambda: loop.call_soon(int)), "call_later": _call(lambda: loop.call_later(1, int)),
            "create_future": _call(lambda: loop.create_future())}


@loop_probe(promise=doc("eventloop", "asyncio.loop.call_soon_threadsafe",
                        "Raises RuntimeError if called on a loop that's been closed."))
async def lp_call_soon_threadsafe_after_close(a):
    """call_soon_threadsafe() on a closed loop, from another thread."""
    loop, out = _closed_loop(a), {}
    th = threading.Thread(target=lambda: out.update(call=_call(lambda: loop.call_soon_threadsafe(int))))
    th.start(), th.join()
    return out


@loop_probe(promise=doc("eventloop", "asyncio.loop.call_soon_threadsafe",
                        "A thread-safe variant of call_soon()."))
async def lp_call_soon_threadsafe_wakes(a):
    """call_soon_threadsafe() from a thread wakes a loop waiting on a future; the
    callback runs in the loop's thread."""
    loop = a.get_running_loop()
    fut = loop.create_future()
    main = threading.get_ident()
    th = threading.Thread(target=lambda: loop.call_soon_threadsafe(
        lambda: fut.set_result(threading.get_ident() == main)))
    th.start()
    out = {"in_loop_thread": await _wait(a, fut)}
    th.join()
    return out


@loop_probe()
async def lp_run_on_closed_loop(a):
    """run_until_complete() and run_forever() on a closed loop."""
    loop = _closed_loop(a)

    async def nothing():
        pass
    coro = nothing()
    out = {"run_until_complete": _call(lambda: loop.run_until_complete(coro)), "run_forever": _call(lambda: loop.run_forever())}
    coro.close()
    return out


@loop_probe()
async def lp_close_running_loop(a):
    """close() on the running loop, then run_forever() on it again."""
    loop = a.get_running_loop()
    out = {"close": _call(lambda: loop.close()), "run_forever": _call(lambda: loop.run_forever())}
    return {**out, "is_running": loop.is_running(), "is_closed": loop.is_closed()}


@loop_probe(promise=doc("eventloop", "asyncio.loop.close",
                        "This method is idempotent and irreversible."))
async def lp_close_twice(a):
    """close() twice on a fresh loop; is_closed() after."""
    loop = type(a.get_running_loop())()
    return {"first": _call(lambda: loop.close()), "second": _call(lambda: loop.close()), "is_closed": _call(lambda: loop.is_closed())}


@loop_probe(promise=doc("eventloop", "asyncio.loop.is_running",
                        "Return True if the event loop is currently running."))
async def lp_is_running(a):
    """is_running() of the running loop, and of a fresh loop of the same class."""
    fresh = type(a.get_running_loop())()
    out = {"running": _call(lambda: a.get_running_loop().is_running()), "fresh": _call(lambda: fresh.is_running())}
    fresh.close()
    return out


@loop_probe(promise=doc("eventloop", "asyncio.loop.run_until_complete",
                        "Return the Future's result or raise its exception."))
async def lp_run_until_complete_result(a):
    """run_until_complete() on a fresh loop (in a thread): a coroutine's result, then its
    exception."""
    loop = type(a.get_running_loop())()

    async def ok():
        return 42

    async def bad():
        raise KeyError("k")
    out = {"result": await a.to_thread(_call, loop.run_until_complete, ok()),
           "exception": await a.to_thread(_call, loop.run_until_complete, bad())}
    loop.close()
    return out


@loop_probe()
async def lp_run_until_complete_while_running(a):
    """run_until_complete() on the loop that is running."""
    async def nothing():
        pass
    coro = nothing()
    out = {"run_until_complete": _call(lambda: a.get_running_loop().run_until_complete(coro))}
    coro.close()
    return out


@loop_probe(promise=doc("eventloop", "asyncio.get_running_loop",
                        "Return the running event loop in the current OS thread."))
async def lp_get_running_loop_in_callback(a):
    """asyncio.get_running_loop() inside a call_soon() callback."""
    loop, fut = a.get_running_loop(), a.get_running_loop().create_future()
    loop.call_soon(lambda: fut.set_result(_call(lambda: a.get_running_loop() is loop)))
    return {"in_callback": await _wait(a, fut)}


@loop_probe(promise=doc("eventloop", "asyncio.get_running_loop",
                        "Raise a RuntimeError if there is no running event loop."))
async def lp_get_running_loop_other_thread(a):
    """asyncio.get_running_loop() in a thread with no loop."""
    return {"other_thread": await a.to_thread(_call, a.get_running_loop)}


@loop_probe(promise=doc("eventloop", "asyncio.get_event_loop",
                        "When called from a coroutine or a callback (e.g. scheduled with "
                        "call_soon or similar API), this function will always return the "
                        "running event loop."))
async def lp_get_event_loop_in_coroutine(a):
    """asyncio.get_event_loop() from a coroutine is the running loop."""
    return {"same": _call(lambda: a.get_event_loop() is a.get_running_loop())}


# --- the clock and scheduled callbacks -------------------------------------------------

@loop_probe(promise=doc("eventloop", "asyncio.loop.time",
                        "Return the current time, as a float value, according to the event "
                        "loop's internal monotonic clock."))
async def lp_loop_time_monotonic(a):
    """loop.time() is a float and never goes back, over 20 readings around sleeps."""
    loop, seen = a.get_running_loop(), []
    for _ in range(20):
        seen.append(loop.time())
        await a.sleep(0.001)
    return {"float": isinstance(seen[0], float), "never_back": seen == sorted(seen)}


@loop_probe()
async def lp_loop_time_is_time_monotonic(a):
    """loop.time() reads time.monotonic() (CPython's clock), to within 50 ms."""
    return {"time_monotonic": abs(a.get_running_loop().time() - time.monotonic()) < 0.05}


@loop_probe(promise=doc("eventloop", "asyncio.loop.call_soon",
                        "Callbacks are called in the order in which they are registered."))
async def lp_call_soon_order(a):
    """Five call_soon() callbacks run in the order they were scheduled."""
    loop, order = a.get_running_loop(), []
    for i in range(5):
        loop.call_soon(order.append, i)
    await a.sleep(0.01)
    return {"order": order}


@loop_probe(promise=doc("eventloop", "asyncio.loop.call_later",
                        "Schedule callback to be called after the given delay number of seconds "
                        "(can be either an int or a float)."))
async def lp_call_later_not_early(a):
    """call_later(0.05): the callback runs no earlier than the delay, by loop.time()."""
    loop, fut = a.get_running_loop(), a.get_running_loop().create_future()
    start = loop.time()
    loop.call_later(0.05, lambda: fut.set_result(loop.time() - start))
    waited = await _wait(a, fut)
    return {"not_early": isinstance(waited, float) and waited >= 0.049}


@loop_probe(promise=doc("eventloop", "asyncio.loop.call_at",
                        "Schedule callback to be called at the given absolute timestamp when (an "
                        "int or a float), using the same time reference as loop.time()."))
async def lp_call_at_order(a):
    """call_at() three times, out of order: they run by their time."""
    loop, order = a.get_running_loop(), []
    now = loop.time()
    for d in (0.03, 0.01, 0.02):
        loop.call_at(now + d, order.append, d)
    await a.sleep(0.06)
    return {"order": order}


@loop_probe()
async def lp_call_later_same_time_order(a):
    """Three call_at() callbacks for the same instant (the docs leave the order undefined)."""
    loop, order = a.get_running_loop(), []
    when = loop.time() + 0.01
    for i in range(3):
        loop.call_at(when, order.append, i)
    await a.sleep(0.03)
    return {"order": order}


@loop_probe(twin_of=("cb_call_soon_vs_call_later_zero",))
async def lp_call_later_zero_order(a):
    """call_later(0), call_soon() and call_later(-1), scheduled in that order."""
    loop, order = a.get_running_loop(), []
    loop.call_later(0, order.append, "later0")
    loop.call_soon(order.append, "soon")
    loop.call_later(-1, order.append, "later-neg")
    await a.sleep(0.01)
    return {"order": order}


@loop_probe(promise=doc("eventloop", "asyncio.loop.run_forever",
                        "If stop() is called before run_forever() is called, the loop will poll "
                        "the I/O selector once with a timeout of zero, run all callbacks "
                        "scheduled in response to I/O events (and those that were already "
                        "scheduled), and then exit."),
            twin_of=("cb_stop_before_run",))
async def lp_stop_before_run_forever(a):
    """stop() before run_forever(): the callbacks already scheduled run once, then it stops."""
    loop, order = type(a.get_running_loop())(), []
    loop.call_soon(order.append, 1)
    loop.call_soon(lambda: loop.call_soon(order.append, 3))
    loop.stop()
    await a.to_thread(loop.run_forever)
    first = list(order)
    await a.to_thread(loop.run_until_complete, a.sleep(0))
    loop.close()
    return {"first_run": first, "after": order}


# --- handles -------------------------------------------------------------------------

@loop_probe(promise=doc("eventloop", "asyncio.TimerHandle.when",
                        "The time is an absolute timestamp, using the same time reference as "
                        "loop.time()."))
async def lp_timer_handle_when(a):
    """TimerHandle.when() of call_later(10) is loop.time() + 10."""
    loop = a.get_running_loop()
    h = loop.call_later(10, int)
    out = {"when_ok": _call(lambda: abs(h.when() - (loop.time() + 10)) < 0.05)}
    h.cancel()
    return out


@loop_probe()
async def lp_handle_cancel_twice(a):
    """Handle.cancel() twice (call_soon) and TimerHandle.cancel() twice (call_later)."""
    loop = a.get_running_loop()
    h, th = loop.call_soon(int), loop.call_later(1, int)
    return {"soon_first": _call(lambda: h.cancel()), "soon_second": _call(lambda: h.cancel()),
            "later_first": _call(lambda: th.cancel()), "later_second": _call(lambda: th.cancel())}


@loop_probe(promise=doc("eventloop", "asyncio.Handle.cancelled",
                        "Return True if the callback was cancelled."))
async def lp_handle_cancelled(a):
    """Handle.cancelled() and TimerHandle.cancelled(), before and after cancel()."""
    loop = a.get_running_loop()
    h, th = loop.call_soon(int), loop.call_later(1, int)
    out = {"soon_before": _call(lambda: h.cancelled()), "later_before": _call(lambda: th.cancelled())}
    h.cancel(), th.cancel()
    return {**out, "soon_after": _call(lambda: h.cancelled()), "later_after": _call(lambda: th.cancelled())}


@loop_probe(promise=doc("eventloop", "asyncio.Handle.cancel",
                        "Cancel the callback. If the callback has already been canceled or "
                        "executed, this method has no effect."),
            twin_of=("cb_cancelled_handle",))
async def lp_cancelled_handle_never_runs(a):
    """A cancelled call_soon() and a cancelled call_later(0.001) never run."""
    loop, order = a.get_running_loop(), []
    h, th = loop.call_soon(order.append, "soon"), loop.call_later(0.001, order.append, "later")
    out = {"cancel_soon": _call(lambda: h.cancel()), "cancel_later": _call(lambda: th.cancel())}
    await a.sleep(0.02)
    return {**out, "ran": order}


@loop_probe()
async def lp_handle_cancel_after_run(a):
    """Handle.cancel() after the callback ran: no effect, and cancelled() then."""
    loop, order = a.get_running_loop(), []
    h = loop.call_soon(order.append, 1)
    await a.sleep(0.01)
    return {"cancel": _call(lambda: h.cancel()), "cancelled": _call(lambda: h.cancelled()), "ran": order}


@loop_probe()
async def lp_handle_weakref(a):
    """A Handle and a TimerHandle can be weakly referenced (CPython's can)."""
    loop = a.get_running_loop()
    h, th = loop.call_soon(int), loop.call_later(1, int)
    out = {"handle": _call(lambda: weakref.ref(h)() is h), "timer": _call(lambda: weakref.ref(th)() is th)}
    h.cancel(), th.cancel()
    return out


@loop_probe(promise=doc("eventloop", "asyncio.Handle.get_context",
                        "Return the contextvars.Context object associated with the handle.",
                        since="3.12"))
async def lp_handle_get_context(a):
    """Handle.get_context() (3.12) is the context given to call_soon(context=)."""
    ctx = contextvars.copy_context()
    h = a.get_running_loop().call_soon(int, context=ctx)
    h.cancel()
    return {"get_context": _call(lambda: h.get_context() is ctx) if hasattr(h, "get_context") else "absent"}


# --- tasks and futures ---------------------------------------------------------------

@loop_probe(promise=doc("task", "asyncio.eager_task_factory",
                        "When using this factory (via loop.set_task_factory(asyncio."
                        "eager_task_factory)), coroutines begin execution synchronously during "
                        "Task construction.", since="3.12"),
            twin_of=("tk_eager_spawn",))
async def lp_eager_start(a):
    """eager_task_factory (3.12): the child's first step runs inside create_task(), and
    a child that never awaits is done when create_task() returns."""
    if not hasattr(a, "eager_task_factory"):
        return {"eager_task_factory": "absent"}
    loop, order = a.get_running_loop(), []
    loop.set_task_factory(a.eager_task_factory)

    async def child(n):
        order.append(n)
        if n:
            await a.sleep(0)
    t0 = _call(lambda: loop.create_task(child(0)))
    t1 = _call(lambda: loop.create_task(child(1)))
    order.append("parent")
    loop.set_task_factory(None)
    await a.sleep(0.01)
    return {"create_task_0": t0, "create_task_1": t1, "order": order}


@loop_probe(promise=doc("eventloop", "asyncio.loop.get_task_factory",
                        "Return a task factory or None if the default one is in use."))
async def lp_task_factory_roundtrip(a):
    """get_task_factory(): None by default, the factory once set, and the factory sees
    every create_task()."""
    loop, seen = a.get_running_loop(), []

    def factory(lp, coro, **kw):
        seen.append(lp is loop)
        return a.Task(coro, loop=lp, **kw)
    out = {"default": _call(lambda: loop.get_task_factory())}
    loop.set_task_factory(factory)
    out["same"] = _call(lambda: loop.get_task_factory() is factory)
    await a.create_task(a.sleep(0))
    loop.set_task_factory(None)
    return {**out, "seen": seen}


@loop_probe(promise=doc("eventloop", "asyncio.loop.create_task",
                        "If the name argument is provided and not None, it is set as the name "
                        "of the task using Task.set_name()."))
async def lp_create_task_name(a):
    """loop.create_task(coro, name="n") names the task."""
    t = a.get_running_loop().create_task(a.sleep(0), name="probe-task")
    await t
    return {"name": _call(lambda: t.get_name())}


@loop_probe(promise=doc("eventloop", "asyncio.loop.create_future",
                        "Create an asyncio.Future object attached to the event loop."))
async def lp_future_class(a):
    """create_future(): an asyncio.Future, isfuture(), and get_loop() is the running loop."""
    loop = a.get_running_loop()
    fut = loop.create_future()
    out = {"is_asyncio_future": isinstance(fut, a.Future), "isfuture": a.isfuture(fut),
           "same_loop": _call(lambda: fut.get_loop() is loop)}
    fut.cancel()
    return out


@loop_probe(promise=doc("eventloop", "asyncio.loop.shutdown_asyncgens",
                        "Schedule all currently open asynchronous generator objects to close "
                        "with an aclose() call."))
async def lp_shutdown_asyncgens(a):
    """An async generator left suspended: finalized by shutdown_asyncgens() (on a fresh loop)."""
    loop, order = type(a.get_running_loop())(), []

    async def agen():
        try:
            yield 1
            yield 2
        finally:
            order.append("finalized")

    async def go():
        g = agen()
        await g.__anext__()
        order.append("suspended")
        return g
    g = await a.to_thread(loop.run_until_complete, go())
    out = {"shutdown": await a.to_thread(_call, loop.run_until_complete, loop.shutdown_asyncgens())}
    loop.close()
    del g
    return {**out, "order": order}
