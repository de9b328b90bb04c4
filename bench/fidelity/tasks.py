"""Stream-style task probes: tasks, futures, cancellation, timeouts, context variables
and unretrieved exceptions, on ``kernels.hybrid`` against asyncio and uvloop.

A probe is ``async def probe(a)`` where ``a`` is ``asyncio`` or ``kernels.hybrid``; they
run on the stream sides (``bench.fidelity.streams``).
"""
from __future__ import annotations

import contextvars
import gc

from bench.fidelity.registry import catch, ename, probe


@probe("stream")
async def tk_eager_spawn(a):
    """Eager tasks (3.12's eager_task_factory): is there one, and does the child's first
    step run inside create_task()? Where there is none, spawning is lazy."""
    factory = getattr(a, "eager_task_factory", None)
    if factory is None:
        return {"eager_factory": False}
    loop = a.get_running_loop()
    loop.set_task_factory(factory)
    order = []

    async def child():
        order.append("child")
    try:
        t = a.create_task(child())
        order.append("parent")
        await t
    finally:
        loop.set_task_factory(None)
    return {"eager_factory": True, "order": order}


@probe("stream")
async def tk_timeout_uncancels(a):
    """After an expired timeout() is caught, the task's cancelling() count is back to 0."""
    try:
        async with a.timeout(0.01):
            await a.sleep(1)
    except TimeoutError:
        pass
    task = a.current_task()
    await a.sleep(0)
    return {"cancelling": task.cancelling(), "still_runs": True}


@probe("stream")
async def tk_cancel_uncancel(a):
    """cancel() twice, then cancelling()/uncancel() inside the task."""
    seen = {}

    async def child():
        try:
            await a.sleep(10)
        except a.CancelledError:
            task = a.current_task()
            seen["cancelling"] = task.cancelling()
            seen["uncancel"] = [task.uncancel(), task.uncancel()]
            seen["after"] = task.cancelling()
            return "swallowed"
    t = a.create_task(child())
    await a.sleep(0)
    seen["first_cancel"] = t.cancel()
    seen["second_cancel"] = t.cancel()
    res = await catch(t)
    return {**seen, **res, "cancelled": t.cancelled()}


@probe("stream")
async def tk_cancel_message(a):
    """cancel('why'): what the task sees, and what awaiting it raises."""
    seen = {}

    async def child():
        try:
            await a.sleep(10)
        except a.CancelledError as exc:
            seen["inside_args"] = list(exc.args)
            raise
    t = a.create_task(child())
    await a.sleep(0)
    t.cancel("why")
    try:
        await t
    except a.CancelledError as exc:
        seen["outside_args"] = list(exc.args)
    return seen


@probe("stream")
async def tk_cancel_before_first_step(a):
    """cancel() right after create_task(): the body never runs."""
    ran = []

    async def child():
        ran.append(1)
    t = a.create_task(child())
    first = t.cancel()
    out = await catch(t)
    return {"cancel": first, "ran": bool(ran), "cancelled": t.cancelled(), **out,
            "cancel_done": t.cancel()}


@probe("stream")
async def tk_cancel_caught_returns(a):
    """A task that swallows its cancellation and returns: cancelled() or a result?"""
    async def child():
        try:
            await a.sleep(10)
        except a.CancelledError:
            return 42
    t = a.create_task(child())
    await a.sleep(0)
    t.cancel()
    out = await catch(t)
    return {**out, "cancelled": t.cancelled()}


@probe("stream")
async def tk_cancelled_error_base(a):
    """CancelledError's base class, and what `except Exception` catches."""
    caught = []

    async def child():
        try:
            await a.sleep(10)
        except Exception:
            caught.append("Exception")
    t = a.create_task(child())
    await a.sleep(0)
    t.cancel()
    await catch(t)
    return {"is_exception": issubclass(a.CancelledError, Exception), "caught": caught,
            "cancelled": t.cancelled()}


@probe("stream")
async def tk_wait_for_timeout(a):
    """wait_for(sleep(10), 0.01): what it raises and the inner coroutine's fate."""
    seen = []

    async def slow():
        try:
            await a.sleep(10)
        except a.CancelledError:
            seen.append("cancelled")
            raise
    try:
        await a.wait_for(slow(), 0.01)
        out = {"raised": None}
    except BaseException as exc:
        out = {"raised": ename(exc), "is_builtin_TimeoutError": isinstance(exc, TimeoutError)}
    out["inner"] = seen
    return out


@probe("stream")
async def tk_wait_for_runs_in_new_task(a):
    """wait_for(coro, 1): is current_task() inside the coroutine the caller?"""
    outer = a.current_task()

    async def inner():
        return a.current_task() is outer
    return {"same_task": await a.wait_for(inner(), 1)}


@probe("stream")
async def tk_wait_for_zero_timeout(a):
    """wait_for(coro_that_returns_at_once, 0)."""
    ran = []

    async def quick():
        ran.append(1)
        return "done"
    out = await catch(a.wait_for(quick(), 0))
    out["ran"] = bool(ran)
    return out


@probe("stream")
async def tk_wait_for_none_timeout(a):
    """wait_for(coro, None) just awaits it."""
    async def quick():
        await a.sleep(0)
        return 7
    return await catch(a.wait_for(quick(), None))


@probe("stream")
async def tk_wait_for_outer_cancel(a):
    """The caller of wait_for(slow, 10) is cancelled: the inner coroutine is cancelled too."""
    seen = []

    async def slow():
        try:
            await a.sleep(10)
        except a.CancelledError:
            seen.append("inner-cancelled")
            raise

    async def caller():
        await a.wait_for(slow(), 10)
    t = a.create_task(caller())
    await a.sleep(0.01)
    t.cancel()
    out = await catch(t)
    return {**out, "seen": seen}


_VAR = contextvars.ContextVar("looplab_fidelity", default="default")


@probe("stream")
async def tk_contextvar_set_after_create(a):
    """A contextvar set by the parent after create_task(): what the child reads."""
    _VAR.set("before")
    seen = []

    async def child():
        seen.append(_VAR.get())
    t = a.create_task(child())
    _VAR.set("after")
    await t
    return {"child_sees": seen[0]}


@probe("stream")
async def tk_contextvar_child_isolated(a):
    """A contextvar set inside a child task: does the parent see it?"""
    _VAR.set("parent")

    async def child():
        _VAR.set("child")
    await a.create_task(child())
    return {"parent_sees": _VAR.get()}


@probe("stream")
async def tk_contextvar_in_callbacks(a):
    """call_soon callbacks and done callbacks run in which context?"""
    _VAR.set("task")
    seen = {}
    loop = a.get_running_loop()
    fut = a.Future()
    fut.add_done_callback(lambda f: seen.__setitem__("done_cb", _VAR.get()))
    loop.call_soon(lambda: seen.__setitem__("call_soon", _VAR.get()))
    _VAR.set("changed")
    fut.set_result(None)
    await a.sleep(0)
    await a.sleep(0)
    return seen


def _unretrieved(a, make):
    async def body():
        handled = []
        loop = a.get_running_loop()
        loop.set_exception_handler(lambda lp, ctx: handled.append(
            [ctx.get("message", "").split(":")[0][:40], ename(ctx.get("exception"))]))
        await make()
        for _ in range(3):
            gc.collect()
            await a.sleep(0)
        return {"reports": handled}
    return body()


@probe("stream")
async def tk_unretrieved_future_exception(a):
    """A bare Future's exception never retrieved: is it reported?"""
    async def make():
        f = a.Future()
        f.set_exception(ValueError("lost"))
        del f
    return await _unretrieved(a, make)


@probe("stream")
async def tk_unretrieved_task_exception(a):
    """A Task's exception never retrieved: is it reported?"""
    async def make():
        async def boom():
            raise ValueError("lost")
        t = a.create_task(boom())
        await a.sleep(0)
        await a.sleep(0)
        del t
    return await _unretrieved(a, make)


@probe("stream")
async def tk_retrieved_exception_silent(a):
    """An exception retrieved with exception() is not reported."""
    async def make():
        f = a.Future()
        f.set_exception(ValueError("seen"))
        f.exception()
        del f
    return await _unretrieved(a, make)


@probe("stream")
async def tk_lazy_spawn_order(a):
    """create_task(): does the child run before the parent's next await?"""
    order = []

    async def child():
        order.append("child")
    t = a.create_task(child())
    order.append("parent")
    await a.sleep(0)
    order.append("parent-after-sleep0")
    await t
    return {"order": order}


@probe("stream")
async def tk_sleep0_round_robin(a):
    """Three tasks looping over sleep(0): the interleaving."""
    order = []

    async def worker(name):
        for i in range(3):
            order.append(f"{name}{i}")
            await a.sleep(0)
    await a.gather(worker("a"), worker("b"), worker("c"))
    return {"order": order}


@probe("stream")
async def tk_gather_first_error(a):
    """gather(fail, slow): the error propagates; the sibling keeps running."""
    async def fail():
        raise ValueError("x")

    async def slow():
        await a.sleep(0.03)
        return "slow"
    s = a.ensure_future(slow())
    out = await catch(a.gather(fail(), s))
    out["sibling_cancelled_at_once"] = s.cancelled()
    out["sibling_result"] = await s
    return out


@probe("stream")
async def tk_gather_return_exceptions(a):
    """gather(..., return_exceptions=True) returns exceptions as values."""
    async def fail():
        raise KeyError("k")
    res = await a.gather(fail(), a.sleep(0, "ok"), return_exceptions=True)
    return {"results": [ename(x) if isinstance(x, BaseException) else x for x in res]}


@probe("stream")
async def tk_timeout_cm(a):
    """async with timeout(0.01): the raised error, expired(), and the inner exception."""
    inner = []
    try:
        async with a.timeout(0.01) as cm:
            try:
                await a.sleep(10)
            except BaseException as exc:
                inner.append(ename(exc))
                raise
        out = {"raised": None}
    except BaseException as exc:
        out = {"raised": ename(exc)}
    out.update(inner=inner, expired=cm.expired())
    return out


@probe("stream")
async def tk_taskgroup_error(a):
    """A TaskGroup child fails: the siblings are cancelled and an ExceptionGroup raised."""
    seen = []

    async def fail():
        await a.sleep(0.01)
        raise ValueError("x")

    async def sibling():
        try:
            await a.sleep(10)
        except a.CancelledError:
            seen.append("sibling-cancelled")
            raise
    try:
        async with a.TaskGroup() as tg:
            tg.create_task(fail())
            tg.create_task(sibling())
        out = {"raised": None}
    except BaseException as exc:
        out = {"raised": ename(exc),
               "inner": [ename(e) for e in getattr(exc, "exceptions", [])]}
    out["seen"] = seen
    return out


@probe("stream")
async def tk_event_wake_order(a):
    """Event.set() with 6 waiters: the order they resume in."""
    ev = a.Event()
    order = []

    async def waiter(i):
        await ev.wait()
        order.append(i)
    tasks = [a.create_task(waiter(i)) for i in range(6)]
    await a.sleep(0)
    ev.set()
    await a.gather(*tasks)
    return {"order": order}


@probe("stream")
async def tk_queue_getters_fifo(a):
    """Queue: waiting getters are served in arrival order."""
    q = a.Queue()
    order = []

    async def getter(i):
        order.append((i, await q.get()))
    tasks = [a.create_task(getter(i)) for i in range(3)]
    await a.sleep(0)
    for item in "xyz":
        q.put_nowait(item)
    await a.gather(*tasks)
    return {"served": [f"{i}{v}" for i, v in order]}


@probe("stream")
async def tk_future_states(a):
    """Future.result() before done, set twice, cancel after done."""
    f = a.Future()
    out = {}
    try:
        f.result()
    except Exception as exc:
        out["result_pending"] = ename(exc)
    f.set_result(1)
    try:
        f.set_result(2)
    except Exception as exc:
        out["set_twice"] = ename(exc)
    out["cancel_done"] = f.cancel()
    out["result"] = f.result()
    return out


@probe("stream")
async def tk_current_task_in_callback(a):
    """current_task() from a plain call_soon callback."""
    seen = []
    a.get_running_loop().call_soon(lambda: seen.append(a.current_task() is None))
    await a.sleep(0)
    await a.sleep(0)
    return {"none_in_callback": seen}


@probe("stream")
async def tk_shielded_cancel_not_mine(a):
    """A task cancelled while awaiting another task: the awaited task is cancelled too."""
    async def inner():
        await a.sleep(10)
    it = a.create_task(inner())

    async def outer():
        await it
    ot = a.create_task(outer())
    await a.sleep(0)
    ot.cancel()
    await catch(ot)
    await a.sleep(0)
    return {"outer_cancelled": ot.cancelled(), "inner_cancelled": it.cancelled()}

