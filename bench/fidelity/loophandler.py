"""Loop-conformance probes of error handling and debug mode: the exception handler's
call shape and context keys, the default handler, exceptions that must escape the loop,
and what debug mode adds (slow callbacks, tasks and timers logged; the wrong-thread
check; callback checks; coroutine origin tracking). The rules of ``bench.fidelity.loops``
hold here.
"""
from __future__ import annotations

import gc
import logging
import socket
import sys
import threading
import time
import warnings

from bench.fidelity.loops import _call, _raised, _wait, loop_probe
from bench.fidelity.promises import doc

_HANDLER = doc("eventloop", "asyncio.loop.set_exception_handler",
               "Otherwise, handler must be a callable with the signature matching (loop, "
               "context), where loop is a reference to the active event loop, and context is a "
               "dict object containing the details of the exception")
_SLOW = doc("dev", "asyncio-debug-mode",
            "Callbacks taking longer than 100 milliseconds are logged. The loop."
            "slow_callback_duration attribute can be used to set the minimum execution "
            "duration in seconds that is considered \"slow\".")
_WRONG_THREAD = doc("dev", "asyncio-debug-mode",
                    "Many non-threadsafe asyncio APIs (such as loop.call_soon() and "
                    "loop.call_at() methods) raise an exception if they are called from a "
                    "wrong thread.")


def _log(level=logging.WARNING):
    seen, h = [], logging.Handler(level)
    h.emit = lambda r: seen.append(r.getMessage().split(" ")[0] if r.getMessage() else "")
    logging.getLogger("asyncio").addHandler(h)
    return seen, h


# --- the exception handler -------------------------------------------------------------

@loop_probe(promise=_HANDLER, twin_of=("cb_callback_exception_reported",))
async def lp_handler_callback_exception(a):
    """An exception in a call_soon callback: the handler's arguments and context keys."""
    loop, seen = a.get_running_loop(), []
    loop.set_exception_handler(lambda lp, ctx: seen.append(
        (lp is loop, sorted(ctx), type(ctx.get("exception")).__name__)))
    loop.call_soon(lambda: 1 / 0)
    await a.sleep(0.01)
    return {"calls": seen}


@loop_probe(promise=doc("dev", "detect-never-retrieved-exceptions",
                        "In this case, asyncio would emit a log message when the Future object "
                        "is garbage collected."),
            twin_of=("tk_unretrieved_task_exception",))
async def lp_handler_unretrieved_task(a):
    """A task's exception nobody retrieved: the handler's context keys and message."""
    seen = []
    a.get_running_loop().set_exception_handler(lambda lp, ctx: seen.append(
        (sorted(ctx), ctx.get("message"))))

    async def fail():
        raise ValueError("x")
    a.create_task(fail())
    await a.sleep(0.01)
    gc.collect()
    await a.sleep(0.01)
    return {"calls": seen}


@loop_probe(promise=doc("dev", "detect-never-retrieved-exceptions",
                        "In this case, asyncio would emit a log message when the Future object "
                        "is garbage collected."),
            twin_of=("tk_unretrieved_future_exception",))
async def lp_handler_unretrieved_future(a):
    """A future's exception nobody retrieved: the handler's context keys and message."""
    seen = []
    a.get_running_loop().set_exception_handler(lambda lp, ctx: seen.append(
        (sorted(ctx), ctx.get("message"))))
    fut = a.get_running_loop().create_future()
    fut.set_exception(ValueError("x"))
    del fut
    gc.collect()
    await a.sleep(0.01)
    return {"calls": seen}


@loop_probe(promise=doc("eventloop", "asyncio.loop.call_exception_handler",
                        "Call the current event loop exception handler."))
async def lp_call_exception_handler_direct(a):
    """call_exception_handler(context) reaches the handler with the same keys."""
    loop, seen = a.get_running_loop(), []
    loop.set_exception_handler(lambda lp, ctx: seen.append(sorted(ctx)))
    out = {"call": _call(lambda: loop.call_exception_handler({"message": "m", "extra": 1}))}
    return {**out, "calls": seen}


@loop_probe(promise=doc("eventloop", "asyncio.loop.get_exception_handler",
                        "Return the current exception handler, or None if no custom exception "
                        "handler was set."))
async def lp_get_exception_handler(a):
    """get_exception_handler(): None by default, the handler once set, None once reset."""
    loop = a.get_running_loop()
    out = {"default": _call(lambda: loop.get_exception_handler())}

    def h(lp, ctx):
        pass
    loop.set_exception_handler(h)
    out["set"] = _call(lambda: loop.get_exception_handler() is h)
    loop.set_exception_handler(None)
    return {**out, "reset": _call(lambda: loop.get_exception_handler())}


@loop_probe()
async def lp_set_exception_handler_not_callable(a):
    """set_exception_handler(42) (the docs oblige the caller: "must be a callable")."""
    return {"set": _call(lambda: a.get_running_loop().set_exception_handler(42))}


@loop_probe()
async def lp_handler_that_raises(a):
    """The exception handler itself raises: does the loop go on running callbacks?"""
    loop, order = a.get_running_loop(), []

    def bad(lp, ctx):
        raise RuntimeError("handler failed")
    loop.set_exception_handler(bad)
    loop.call_soon(lambda: 1 / 0)
    loop.call_soon(order.append, "next")
    seen, h = _log(logging.ERROR)
    await a.sleep(0.01)
    logging.getLogger("asyncio").removeHandler(h)
    loop.set_exception_handler(None)
    return {"order": order, "logged": len(seen) > 0}


@loop_probe(promise=doc("eventloop", "asyncio.loop.default_exception_handler",
                        "This is called when an exception occurs and no exception handler is set."))
async def lp_default_handler_logs(a):
    """No handler set: an exception in a callback is logged by the asyncio logger (ERROR)."""
    seen, h = _log(logging.ERROR)
    a.get_running_loop().call_soon(lambda: 1 / 0)
    await a.sleep(0.01)
    logging.getLogger("asyncio").removeHandler(h)
    return {"logged": seen}


@loop_probe(promise=doc("eventloop", "asyncio.loop.default_exception_handler",
                        "This can be called by a custom exception handler that wants to defer "
                        "to the default handler behavior."))
async def lp_default_handler_direct(a):
    """default_exception_handler({"message": "m"}) logs the message (ERROR)."""
    seen, h = _log(logging.ERROR)
    out = {"call": _call(lambda: a.get_running_loop().default_exception_handler({"message": "probe-msg"}))}
    logging.getLogger("asyncio").removeHandler(h)
    return {**out, "logged": seen}


@loop_probe()
async def lp_callback_systemexit_escapes(a):
    """A callback raising SystemExit: run_until_complete() raises it (not the handler)."""
    loop, seen = type(a.get_running_loop())(), []
    loop.set_exception_handler(lambda lp, ctx: ctx.get("exception") and seen.append(
        type(ctx["exception"]).__name__))

    def go():
        loop.call_soon(sys.exit, 3)
        try:
            loop.run_until_complete(a.sleep(0.05))
            return None
        except BaseException as exc:
            return type(exc).__name__
    out = {"run": await a.to_thread(go), "handler_calls": seen}
    loop.close()
    return out


@loop_probe()
async def lp_protocol_data_received_raises(a):
    """data_received() raises: the handler's context keys, and connection_lost()'s argument."""
    loop, seen, lost = a.get_running_loop(), [], []
    loop.set_exception_handler(lambda lp, ctx: seen.append(sorted(ctx)))

    class P(a.Protocol):
        def data_received(self, data):
            raise ValueError("bad data")

        def connection_lost(self, exc):
            lost.append(type(exc).__name__ if exc else None)
    lsn = socket.create_server(("127.0.0.1", 0))
    t, _ = await loop.create_connection(P, *lsn.getsockname())
    peer, _ = lsn.accept()
    peer.sendall(b"x")
    await a.sleep(0.05)
    t.close(), peer.close(), lsn.close()
    return {"contexts": seen, "lost": lost}


@loop_probe()
async def lp_protocol_connection_made_raises(a):
    """connection_made() raises (client side): the handler's keys, and is the transport
    left open?"""
    loop, seen = a.get_running_loop(), []
    loop.set_exception_handler(lambda lp, ctx: seen.append(sorted(ctx)))

    class P(a.Protocol):
        def connection_made(self, tr):
            raise ValueError("bad start")
    lsn = socket.create_server(("127.0.0.1", 0))
    try:
        t, _ = await a.wait_for(loop.create_connection(P, *lsn.getsockname()), 1)
    except Exception as exc:
        lsn.close()
        return {"create_connection": _raised(exc), "contexts": seen}
    await a.sleep(0.02)
    out = {"create_connection": "returned", "is_closing": _call(lambda: t.is_closing())}
    t.close(), lsn.close()
    return {**out, "contexts": seen}


@loop_probe()
async def lp_server_connection_made_raises(a):
    """A server protocol's connection_made() raises: the handler's keys, and what the
    client reads."""
    loop, seen = a.get_running_loop(), []
    loop.set_exception_handler(lambda lp, ctx: seen.append(sorted(ctx)))

    class P(a.Protocol):
        def connection_made(self, tr):
            raise ValueError("bad start")
    srv = await loop.create_server(P, "127.0.0.1", 0)
    r, w = await a.open_connection(*srv.sockets[0].getsockname())
    out = {"client_read": await _wait(a, r.read(), 0.3)}
    w.close()
    srv.close()
    return {**out, "contexts": seen}


# --- debug mode ----------------------------------------------------------------------

@loop_probe(promise=doc("eventloop", "asyncio.loop.get_debug", "Get the debug mode (bool) of the "
                        "event loop."))
async def lp_debug_flag(a):
    """get_debug() follows set_debug()."""
    loop = a.get_running_loop()
    before = loop.get_debug()
    loop.set_debug(True)
    out = {"on": _call(lambda: loop.get_debug())}
    loop.set_debug(before)
    return {**out, "restored": _call(lambda: loop.get_debug()) == before}


@loop_probe(promise=doc("eventloop", "asyncio.loop.get_debug",
                        "The default value is True if the environment variable "
                        "PYTHONASYNCIODEBUG is set to a non-empty string, False otherwise."))
async def lp_debug_default(a):
    """A fresh loop's get_debug() with PYTHONASYNCIODEBUG unset and no -X dev."""
    loop = type(a.get_running_loop())()
    out = {"default": _call(lambda: loop.get_debug()), "env_set": bool(sys.flags.dev_mode)}
    loop.close()
    return out


@loop_probe(promise=doc("runner", "asyncio.Runner",
                        "If debug is True, the event loop will be run in debug mode."))
async def lp_debug_runner(a):
    """asyncio.Runner(debug=True) with this loop class: get_debug() inside."""
    async def inside():
        return a.get_running_loop().get_debug()
    cls = type(a.get_running_loop())

    def go():
        with a.Runner(debug=True, loop_factory=cls) as runner:
            return _call(lambda: runner.run(inside()))
    return {"get_debug": await a.to_thread(go)}


@loop_probe(promise=_SLOW)
async def lp_debug_slow_callback_duration(a):
    """loop.slow_callback_duration: 0.1 by default, and settable."""
    loop = a.get_running_loop()
    out = {"default": _call(getattr, loop, "slow_callback_duration", "absent")}
    out["set"] = _call(setattr, loop, "slow_callback_duration", 0.25)
    out["after"] = _call(getattr, loop, "slow_callback_duration", "absent")
    return out


@loop_probe(promise=_SLOW)
async def lp_debug_slow_callback_logged(a):
    """Debug mode, slow_callback_duration=0.01: a call_soon callback blocking 30 ms is
    logged (WARNING, "Executing ...")."""
    loop = a.get_running_loop()
    loop.set_debug(True)
    loop.slow_callback_duration = 0.01
    seen, h = _log()
    loop.call_soon(time.sleep, 0.03)
    await a.sleep(0.02)
    logging.getLogger("asyncio").removeHandler(h)
    loop.set_debug(False)
    return {"logged": seen}


@loop_probe(promise=_SLOW)
async def lp_debug_slow_timer_logged(a):
    """Debug mode: a call_later callback blocking 30 ms is logged."""
    loop = a.get_running_loop()
    loop.set_debug(True)
    loop.slow_callback_duration = 0.01
    seen, h = _log()
    loop.call_later(0.001, time.sleep, 0.03)
    await a.sleep(0.05)
    logging.getLogger("asyncio").removeHandler(h)
    loop.set_debug(False)
    return {"logged": seen}


@loop_probe(promise=_SLOW)
async def lp_debug_slow_task_step_logged(a):
    """Debug mode: a task step blocking 30 ms is logged."""
    loop = a.get_running_loop()
    loop.set_debug(True)
    loop.slow_callback_duration = 0.01
    seen, h = _log()

    async def blocker():
        time.sleep(0.03)
    await a.create_task(blocker())
    await a.sleep(0.01)
    logging.getLogger("asyncio").removeHandler(h)
    loop.set_debug(False)
    return {"logged": seen}


@loop_probe()
async def lp_slow_callback_not_logged_without_debug(a):
    """Debug mode off: a callback blocking 30 ms over slow_callback_duration=0.01 is not logged."""
    loop = a.get_running_loop()
    loop.slow_callback_duration = 0.01
    seen, h = _log()
    loop.call_soon(time.sleep, 0.03)
    await a.sleep(0.02)
    logging.getLogger("asyncio").removeHandler(h)
    return {"logged": seen}


@loop_probe(promise=_WRONG_THREAD)
async def lp_debug_call_soon_wrong_thread(a):
    """Debug mode: call_soon() from another thread."""
    loop, out = a.get_running_loop(), {}
    loop.set_debug(True)
    th = threading.Thread(target=lambda: out.update(call_soon=_call(lambda: loop.call_soon(int))))
    th.start(), th.join()
    loop.set_debug(False)
    await a.sleep(0.01)
    return out


@loop_probe(promise=_WRONG_THREAD)
async def lp_debug_call_at_wrong_thread(a):
    """Debug mode: call_at() and call_later() from another thread."""
    loop, out = a.get_running_loop(), {}
    loop.set_debug(True)
    th = threading.Thread(target=lambda: out.update(
        call_at=_call(lambda: loop.call_at(loop.time() + 5, int)), call_later=_call(lambda: loop.call_later(5, int))))
    th.start(), th.join()
    loop.set_debug(False)
    return out


@loop_probe()
async def lp_call_soon_wrong_thread_no_debug(a):
    """Debug mode off: call_soon() from another thread is not checked."""
    loop, out = a.get_running_loop(), {}
    th = threading.Thread(target=lambda: out.update(call_soon=_call(lambda: loop.call_soon(int))))
    th.start(), th.join()
    await a.sleep(0.01)
    return out


@loop_probe()
async def lp_debug_call_soon_coroutine_function(a):
    """Debug mode: call_soon() with a coroutine function."""
    loop = a.get_running_loop()

    async def coro_fn():
        pass
    loop.set_debug(True)
    out = {"call_soon": _call(lambda: loop.call_soon(coro_fn))}
    loop.set_debug(False)
    await a.sleep(0.01)
    return out


@loop_probe()
async def lp_debug_call_soon_not_callable(a):
    """Debug mode: call_soon(42)."""
    loop = a.get_running_loop()
    loop.set_debug(True)
    out = {"call_soon": _call(lambda: loop.call_soon(42))}
    loop.set_debug(False)
    loop.set_exception_handler(lambda lp, ctx: None)
    await a.sleep(0.01)
    return out


@loop_probe()
async def lp_call_soon_not_callable_no_debug(a):
    """Debug mode off: call_soon(42), and what the exception handler sees when it runs."""
    loop, seen = a.get_running_loop(), []
    loop.set_exception_handler(lambda lp, ctx: seen.append(type(ctx.get("exception")).__name__))
    out = {"call_soon": _call(lambda: loop.call_soon(42))}
    await a.sleep(0.01)
    return {**out, "handler_saw": seen}


@loop_probe()
async def lp_debug_run_in_executor_coroutine_function(a):
    """Debug mode: run_in_executor(None, a coroutine function)."""
    loop = a.get_running_loop()

    async def coro_fn():
        pass
    loop.set_debug(True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            fut = loop.run_in_executor(None, coro_fn)
            out = {"run_in_executor": "returned", "await": await _wait(a, fut)}
        except Exception as exc:
            out = {"run_in_executor": _raised(exc)}
    loop.set_debug(False)
    return out


@loop_probe(promise=doc("dev", "asyncio-debug-mode",
                        "asyncio checks for coroutines that were not awaited and logs them; this "
                        "mitigates the \"forgotten await\" pitfall."))
async def lp_debug_coroutine_origin(a):
    """Debug mode: a coroutine never awaited is reported with where it was created."""
    loop = a.get_running_loop()

    async def never():
        pass
    loop.set_debug(True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        never()
        gc.collect()
    loop.set_debug(False)
    texts = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    return {"warned": len(texts), "with_origin": any("created at" in t for t in texts)}


@loop_probe()
async def lp_debug_sock_recv_blocking_socket(a):
    """Debug mode: sock_recv() on a socket still in blocking mode (CPython: ValueError)."""
    loop = a.get_running_loop()
    s1, s2 = socket.socketpair()
    s2.sendall(b"x")        # so that a loop that goes ahead does not block
    loop.set_debug(True)
    out = {"sock_recv": await _wait(a, loop.sock_recv(s1, 10), 0.5)}
    loop.set_debug(False)
    s1.close(), s2.close()
    return out


@loop_probe()
async def lp_debug_unretrieved_source_traceback(a):
    """Debug mode: an unretrieved future exception's context has a source_traceback."""
    loop, seen = a.get_running_loop(), []
    loop.set_exception_handler(lambda lp, ctx: seen.append("source_traceback" in ctx))
    loop.set_debug(True)
    fut = loop.create_future()
    loop.set_debug(False)
    fut.set_exception(ValueError("x"))
    del fut
    gc.collect()
    await a.sleep(0.01)
    return {"has_source_traceback": seen}


@loop_probe()
async def lp_unclosed_loop_resource_warning(a):
    """A loop dropped without close(): a ResourceWarning when it is collected."""
    loop = type(a.get_running_loop())()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del loop
        gc.collect()
    return {"resource_warnings": sum(issubclass(w.category, ResourceWarning) for w in caught)}
