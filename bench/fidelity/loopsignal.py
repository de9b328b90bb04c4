"""Loop-conformance probes of signal handlers and executors: ``add_signal_handler``'s
delivery, arguments, refusals and removal, and the default executor (its threads and
their names, ``set_default_executor``, ``shutdown_default_executor`` and its timeout,
``to_thread``). The rules of ``bench.fidelity.loops`` hold here.
"""
from __future__ import annotations

import concurrent.futures
import os
import signal
import threading
import time
import warnings

from bench.fidelity.loops import _call, _raised, _wait, loop_probe
from bench.fidelity.promises import doc

# --- signal handlers -----------------------------------------------------------------------

@loop_probe(promise=doc("eventloop", "asyncio.loop.add_signal_handler",
                        "The callback will be invoked by loop, along with other queued callbacks "
                        "and runnable coroutines of that event loop."))
async def lp_signal_handler_delivery(a):
    """add_signal_handler(SIGUSR1): the callback runs with its argument, in the loop's thread."""
    loop, fut = a.get_running_loop(), a.get_running_loop().create_future()
    main = threading.get_ident()
    loop.add_signal_handler(signal.SIGUSR1, lambda x: fut.set_result((x, threading.get_ident() == main)), "arg")
    os.kill(os.getpid(), signal.SIGUSR1)
    out = {"handler": await _wait(a, fut)}
    try:
        loop.remove_signal_handler(signal.SIGUSR1)
    except Exception:
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    return {"handler": list(out["handler"]) if isinstance(out["handler"], tuple) else out["handler"]}


@loop_probe(promise=doc("eventloop", "asyncio.loop.remove_signal_handler",
                        "Return True if the signal handler was removed, or False if no handler "
                        "was set for the given signal."))
async def lp_remove_signal_handler(a):
    """remove_signal_handler(): True for an installed handler, False the second time."""
    loop = a.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR2, int)
    out = {"first": _call(lambda: loop.remove_signal_handler(signal.SIGUSR2)),
           "second": _call(lambda: loop.remove_signal_handler(signal.SIGUSR2))}
    signal.signal(signal.SIGUSR2, signal.SIG_DFL)
    return out


@loop_probe(promise=doc("eventloop", "asyncio.loop.add_signal_handler",
                        "Raise ValueError if the signal number is invalid or uncatchable."))
async def lp_signal_handler_uncatchable(a):
    """add_signal_handler() with SIGKILL and with SIGSTOP."""
    loop = a.get_running_loop()
    return {"sigkill": _call(lambda: loop.add_signal_handler(signal.SIGKILL, int)),
            "sigstop": _call(lambda: loop.add_signal_handler(signal.SIGSTOP, int))}


@loop_probe(promise=doc("eventloop", "asyncio.loop.add_signal_handler",
                        "Raise ValueError if the signal number is invalid or uncatchable."))
async def lp_signal_handler_invalid_number(a):
    """add_signal_handler() with signal 0 and with signal 1000."""
    loop = a.get_running_loop()
    return {"zero": _call(lambda: loop.add_signal_handler(0, int)),
            "too_big": _call(lambda: loop.add_signal_handler(1000, int))}


@loop_probe()
async def lp_signal_handler_coroutine_function(a):
    """add_signal_handler() with a coroutine function (CPython: TypeError)."""
    async def coro_fn():
        pass
    out = {"add": _call(lambda: a.get_running_loop().add_signal_handler(signal.SIGUSR2, coro_fn))}
    signal.signal(signal.SIGUSR2, signal.SIG_DFL)
    return out


@loop_probe()
async def lp_signal_handler_not_a_signal(a):
    """add_signal_handler('x', cb)."""
    return {"add": _call(lambda: a.get_running_loop().add_signal_handler("x", int))}


@loop_probe()
async def lp_signal_handler_replaced(a):
    """add_signal_handler() twice for SIGUSR1: one signal runs only the second callback."""
    loop, seen = a.get_running_loop(), []
    loop.add_signal_handler(signal.SIGUSR1, seen.append, "first")
    loop.add_signal_handler(signal.SIGUSR1, seen.append, "second")
    os.kill(os.getpid(), signal.SIGUSR1)
    await a.sleep(0.05)
    _call(lambda: loop.remove_signal_handler(signal.SIGUSR1))
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    return {"ran": seen}


@loop_probe()
async def lp_signal_handler_exception(a):
    """A signal callback raises: the exception handler gets it, with which keys."""
    loop, seen = a.get_running_loop(), []
    loop.set_exception_handler(lambda lp, ctx: seen.append(
        (sorted(ctx), type(ctx.get("exception")).__name__)))
    loop.add_signal_handler(signal.SIGUSR1, lambda: 1 / 0)
    os.kill(os.getpid(), signal.SIGUSR1)
    await a.sleep(0.05)
    _call(lambda: loop.remove_signal_handler(signal.SIGUSR1))
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    return {"calls": seen}


@loop_probe()
async def lp_signal_handler_two_signals(a):
    """SIGUSR1 then SIGUSR2, each with a handler: both callbacks run."""
    loop, seen = a.get_running_loop(), []
    loop.add_signal_handler(signal.SIGUSR1, seen.append, 1)
    loop.add_signal_handler(signal.SIGUSR2, seen.append, 2)
    os.kill(os.getpid(), signal.SIGUSR1)
    os.kill(os.getpid(), signal.SIGUSR2)
    await a.sleep(0.05)
    for s in (signal.SIGUSR1, signal.SIGUSR2):
        _call(lambda: loop.remove_signal_handler(s))
        signal.signal(s, signal.SIG_DFL)
    return {"ran": sorted(seen)}


@loop_probe()
async def lp_remove_sigint_handler_restores_default(a):
    """remove_signal_handler(SIGINT): Python's default SIGINT handler is back."""
    loop = a.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, int)
    out = {"remove": _call(lambda: loop.remove_signal_handler(signal.SIGINT)),
           "default_back": signal.getsignal(signal.SIGINT) is signal.default_int_handler}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    return out


@loop_probe(promise=doc("eventloop", "asyncio.loop.add_signal_handler",
                        "Raise RuntimeError if there is a problem setting up the handler."))
async def lp_signal_handler_outside_main_thread(a):
    """add_signal_handler() on a loop running in a thread other than the main one."""
    loop = type(a.get_running_loop())()

    async def add():
        return _call(lambda: a.get_running_loop().add_signal_handler(signal.SIGUSR2, int))
    out = {"add": await a.to_thread(loop.run_until_complete, add())}
    loop.close()
    signal.signal(signal.SIGUSR2, signal.SIG_DFL)
    return out


# --- the default executor ------------------------------------------------------------------

@loop_probe(promise=doc("eventloop", "asyncio.loop.run_in_executor",
                        "Arrange for func to be called in the specified executor."))
async def lp_run_in_executor(a):
    """run_in_executor(None, f): the result, computed in another thread."""
    loop = a.get_running_loop()
    f = loop.run_in_executor(None, lambda: threading.get_ident() != threading.main_thread().ident)
    return {"in_other_thread": await _wait(a, f), "is_future": a.isfuture(f)}


@loop_probe()
async def lp_run_in_executor_exception(a):
    """run_in_executor(None, int, 'x'): the ValueError reaches the awaiting coroutine."""
    return {"await": await _wait(a, a.get_running_loop().run_in_executor(None, int, "x"))}


@loop_probe()
async def lp_default_executor_thread_name(a):
    """The default executor's thread names (CPython: asyncio_N)."""
    name = await a.get_running_loop().run_in_executor(None, lambda: threading.current_thread().name)
    return {"prefix": name.rstrip("0123456789")}


@loop_probe()
async def lp_default_executor_is_thread_pool(a):
    """The default executor runs functions in threads of this process (not processes)."""
    pid = await a.get_running_loop().run_in_executor(None, os.getpid)
    return {"same_process": pid == os.getpid()}


@loop_probe(promise=doc("eventloop", "asyncio.loop.set_default_executor",
                        "Set executor as the default executor used by run_in_executor()."))
async def lp_set_default_executor_used(a):
    """set_default_executor(ThreadPoolExecutor(thread_name_prefix='mine')): run_in_executor(None)
    runs there."""
    loop = a.get_running_loop()
    ex = concurrent.futures.ThreadPoolExecutor(thread_name_prefix="mine")
    out = {"set": _call(lambda: loop.set_default_executor(ex))}
    out["runs_there"] = await _wait(a, loop.run_in_executor(
        None, lambda: threading.current_thread().name.startswith("mine")))
    return out


@loop_probe()
async def lp_set_default_executor_wrong_type(a):
    """set_default_executor(object()) (3.11 docs: "must be an instance of ThreadPoolExecutor")."""
    loop = a.get_running_loop()
    out = {"set": _call(lambda: loop.set_default_executor(object()))}
    loop.set_default_executor(concurrent.futures.ThreadPoolExecutor())
    return out


@loop_probe(promise=doc("eventloop", "asyncio.loop.run_in_executor",
                        "Arrange for func to be called in the specified executor."))
async def lp_run_in_executor_given_executor(a):
    """run_in_executor(executor, f) runs f in that executor's threads."""
    ex = concurrent.futures.ThreadPoolExecutor(thread_name_prefix="given")
    name = await a.get_running_loop().run_in_executor(ex, lambda: threading.current_thread().name)
    ex.shutdown()
    return {"in_given": name.startswith("given")}


@loop_probe(promise=doc("eventloop", "asyncio.loop.shutdown_default_executor",
                        "Once this method has been called, using the default executor with "
                        "loop.run_in_executor() will raise a RuntimeError."))
async def lp_shutdown_default_executor(a):
    """run_in_executor(None, ...) after shutdown_default_executor() (on a fresh loop)."""
    loop = type(a.get_running_loop())()

    async def go():
        await loop.run_in_executor(None, int, "1")
        await loop.shutdown_default_executor()
        try:
            return await a.wait_for(loop.run_in_executor(None, int, "2"), 1)
        except Exception as exc:
            return _raised(exc)
    out = {"after_shutdown": await a.to_thread(loop.run_until_complete, go())}
    loop.close()
    return out


@loop_probe(promise=doc("eventloop", "asyncio.loop.shutdown_default_executor",
                        "If the timeout is reached, a RuntimeWarning is emitted and the default "
                        "executor is terminated without waiting for its threads to finish "
                        "joining.", since="3.12"))
async def lp_shutdown_default_executor_timeout(a):
    """shutdown_default_executor(timeout=0.1) (3.12) while a thread blocks 0.5 s: it
    returns with a RuntimeWarning, before the thread ends."""
    loop = type(a.get_running_loop())()

    async def go():
        loop.run_in_executor(None, time.sleep, 0.5)
        start = time.monotonic()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                out = {"shutdown": await a.wait_for(loop.shutdown_default_executor(timeout=0.1), 2)}
            except Exception as exc:
                out = {"shutdown": _raised(exc)}
        return {**out, "early": time.monotonic() - start < 0.4,
                "warned": [w.category.__name__ for w in caught]}
    out = await a.to_thread(loop.run_until_complete, go())
    loop.close()
    await a.sleep(0.5)
    return out


@loop_probe()
async def lp_shutdown_default_executor_twice(a):
    """shutdown_default_executor() twice on a fresh loop."""
    loop = type(a.get_running_loop())()

    async def go():
        await loop.run_in_executor(None, int, "1")
        return {"first": await _wait(a, loop.shutdown_default_executor()),
                "second": await _wait(a, loop.shutdown_default_executor())}
    out = await a.to_thread(loop.run_until_complete, go())
    loop.close()
    return out


@loop_probe()
async def lp_run_in_executor_on_closed_loop(a):
    """run_in_executor() on a closed loop."""
    loop = type(a.get_running_loop())()
    loop.close()
    out = _call(lambda: loop.run_in_executor(None, int, "1"))
    return {"run_in_executor": out}


@loop_probe()
async def lp_run_in_executor_cancel(a):
    """Cancelling the future of a run_in_executor() whose function is running: the await
    raises CancelledError, and the function still runs to its end."""
    done, go, loop = [], threading.Event(), a.get_running_loop()
    f = loop.run_in_executor(None, lambda: go.wait(2) and done.append(1))
    await a.sleep(0.01)
    f.cancel()
    try:
        await f
        out = None
    except BaseException as exc:
        out = type(exc).__name__
    go.set()
    for _ in range(200):
        if done:
            break
        await a.sleep(0.01)
    return {"await": out, "function_finished": done}


@loop_probe(promise=doc("task", "asyncio.to_thread",
                        "Asynchronously run function func in a separate thread."))
async def lp_to_thread(a):
    """asyncio.to_thread(f, 'x', k=1): the result, computed in another thread."""
    def f(x, k):
        return [x, k, threading.get_ident() != threading.main_thread().ident]
    return {"to_thread": await _wait(a, a.to_thread(f, "x", k=1))}
