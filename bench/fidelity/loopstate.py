"""Loop-conformance probes, continued: a loop's own state -- a closed loop, threads and
the clock, eager tasks and the task factory, reading paused around EOF and buffer limits,
signal handlers, the default executor, futures and a task's loop, and when
``connection_lost`` comes. The rules of ``bench.fidelity.loops`` hold here: each probe
is self-contained, so ``looplab fidelity --repro`` can turn it into a standalone script.
"""
from __future__ import annotations

import concurrent.futures
import os
import signal
import socket
import threading
import time

from bench.fidelity.loops import _EL, _PR, _ST, _TK, loop_probe  # noqa: F401

# --- a closed loop, threads, the clock -----------------------------------------------

def _closed_loop(a):
    loop = type(a.get_running_loop())()
    loop.close()
    return loop


@loop_probe(documented=f"{_EL}#asyncio.loop.close")
async def lp_call_soon_after_close(a):
    """call_soon(), call_later() and create_future() on a closed loop (of the same class)."""
    loop, out = _closed_loop(a), {}
    for name, call in (("call_soon", lambda: loop.call_soon(print)),
                       ("call_later", lambda: loop.call_later(1, print)),
                       ("create_future", lambda: loop.create_future())):
        try:
            call()
            out[name] = None
        except Exception as exc:
            out[name] = type(exc).__name__
    return {**out, "is_closed": loop.is_closed()}


@loop_probe(documented=f"{_EL}#asyncio.loop.call_soon_threadsafe")
async def lp_call_soon_threadsafe_after_close(a):
    """call_soon_threadsafe() on a closed loop, from another thread."""
    loop, out = _closed_loop(a), []

    def other():
        try:
            loop.call_soon_threadsafe(print)
            out.append(None)
        except Exception as exc:
            out.append(type(exc).__name__)
    th = threading.Thread(target=other)
    th.start(), th.join()
    return {"raised": out}


@loop_probe(documented=f"{_EL}#asyncio.loop.call_soon_threadsafe")
async def lp_call_soon_threadsafe_wakes(a):
    """call_soon_threadsafe() from a thread wakes a loop waiting on a future; the
    callback runs in the loop's thread."""
    loop = a.get_running_loop()
    fut = loop.create_future()
    main = threading.get_ident()
    th = threading.Thread(target=lambda: loop.call_soon_threadsafe(
        lambda: fut.set_result(threading.get_ident() == main)))
    th.start()
    ok = await a.wait_for(fut, 1)
    th.join()
    return {"in_loop_thread": ok}


@loop_probe(documented=f"{_EL}#asyncio.loop.run_until_complete")
async def lp_run_on_closed_loop(a):
    """run_until_complete() and run_forever() on a closed loop."""
    loop, out = _closed_loop(a), {}

    async def nothing():
        pass
    for name in ("run_until_complete", "run_forever"):
        coro = nothing()
        try:
            loop.run_until_complete(coro) if name == "run_until_complete" else loop.run_forever()
            out[name] = None
        except Exception as exc:
            out[name] = type(exc).__name__
        coro.close()
    return out


@loop_probe(documented=f"{_EL}#asyncio.loop.close")
async def lp_close_running_loop(a):
    """close() on the running loop, and run_forever() on it again."""
    loop, out = a.get_running_loop(), {}
    for name, call in (("close", loop.close), ("run_forever", loop.run_forever)):
        try:
            call()
            out[name] = None
        except Exception as exc:
            out[name] = type(exc).__name__
    return {**out, "is_running": loop.is_running(), "is_closed": loop.is_closed()}


@loop_probe(documented=f"{_EL}#asyncio.loop.time")
async def lp_loop_time_is_monotonic(a):
    """loop.time() is time.monotonic() (the documented clock), to within 50 ms."""
    return {"monotonic": abs(a.get_running_loop().time() - time.monotonic()) < 0.05}


@loop_probe(twin_of=("cb_call_soon_vs_call_later_zero",))
async def lp_call_later_zero_order(a):
    """call_later(0), call_soon() and call_later(-1), scheduled in that order."""
    loop, order = a.get_running_loop(), []
    loop.call_later(0, order.append, "later0")
    loop.call_soon(order.append, "soon")
    loop.call_later(-1, order.append, "later-neg")
    await a.sleep(0.01)
    return {"order": order}


@loop_probe(twin_of=("cb_stop_before_run",))
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


@loop_probe(documented=f"{_EL}#asyncio.TimerHandle.when")
async def lp_timer_handle(a):
    """A TimerHandle: when() is loop.time() + delay; cancel() and cancelled()."""
    loop = a.get_running_loop()
    h = loop.call_later(10, print)
    close = abs(h.when() - (loop.time() + 10)) < 0.05
    h.cancel()
    return {"when_ok": close, "cancelled": h.cancelled()}


# --- tasks: eager start, the task factory --------------------------------------------

@loop_probe(documented=f"{_TK}#asyncio.eager_task_factory", twin_of=("tk_eager_spawn",))
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
    try:
        t0, t1 = loop.create_task(child(0)), loop.create_task(child(1))
    except Exception as exc:
        loop.set_task_factory(None)
        return {"create_task": type(exc).__name__}
    order.append("parent")
    done = [t0.done(), t1.done()]
    await a.gather(t0, t1)
    loop.set_task_factory(None)
    return {"order": order, "done_at_once": done}


@loop_probe(documented=f"{_EL}#asyncio.loop.set_task_factory")
async def lp_task_factory_roundtrip(a):
    """get_task_factory() after set_task_factory(); the factory sees every create_task()."""
    loop, seen = a.get_running_loop(), []

    def factory(lp, coro, **kw):
        seen.append(lp is loop)
        return a.Task(coro, loop=lp, **kw)
    default = loop.get_task_factory()
    loop.set_task_factory(factory)
    same = loop.get_task_factory() is factory
    await a.create_task(a.sleep(0))
    loop.set_task_factory(None)
    return {"default": default, "same": same, "seen": seen}


# --- reading paused around EOF, buffer limits ----------------------------------------

def _recorder(a, events, keep_open):
    class Rec(a.Protocol):
        data_received = lambda self, data: events.append("data")  # noqa: E731
        eof_received = lambda self: events.append("eof") or keep_open  # noqa: E731
        connection_lost = lambda self, exc: events.append("lost")  # noqa: E731
    return Rec


@loop_probe(documented=f"{_PR}#asyncio.ReadTransport.pause_reading",
            twin_of=("cb_pause_resume_after_eof",))
async def lp_pause_reading_around_eof(a):
    """Data then EOF arrive while reading is paused: nothing until resume_reading()."""
    events, lsn = [], socket.create_server(("127.0.0.1", 0))
    t, _ = await a.get_running_loop().create_connection(
        _recorder(a, events, True), *lsn.getsockname())
    peer, _ = lsn.accept()
    t.pause_reading()
    peer.sendall(b"abc")
    peer.shutdown(socket.SHUT_WR)
    await a.sleep(0.05)
    paused = list(events)
    t.resume_reading()
    await a.sleep(0.05)
    t.close(), peer.close(), lsn.close()
    return {"while_paused": paused, "after": events}


@loop_probe(documented=f"{_PR}#asyncio.ReadTransport.is_reading",
            twin_of=("cb_is_reading_after_eof_kept_open",))
async def lp_is_reading_after_eof(a):
    """is_reading() after EOF with eof_received() returning True; resume_reading() then."""
    events, lsn = [], socket.create_server(("127.0.0.1", 0))
    t, _ = await a.get_running_loop().create_connection(
        _recorder(a, events, True), *lsn.getsockname())
    peer, _ = lsn.accept()
    peer.shutdown(socket.SHUT_WR)
    await a.sleep(0.05)
    out = {"events": list(events), "is_reading": t.is_reading(), "is_closing": t.is_closing()}
    try:
        t.resume_reading()
        out["resume"] = None
    except Exception as exc:
        out["resume"] = type(exc).__name__
    t.close(), peer.close(), lsn.close()
    return out


@loop_probe(documented=f"{_PR}#asyncio.ReadTransport.pause_reading")
async def lp_pause_reading_twice_after_close(a):
    """pause_reading() twice, resume_reading() twice, then both after close() (3.7+: no-ops)."""
    lsn = socket.create_server(("127.0.0.1", 0))
    t, _ = await a.get_running_loop().create_connection(a.Protocol, *lsn.getsockname())
    out = []
    for call in (t.pause_reading, t.pause_reading, t.resume_reading, t.resume_reading,
                 t.close, t.pause_reading, t.resume_reading):
        try:
            call()
            out.append(None)
        except Exception as exc:
            out.append(type(exc).__name__)
    await a.sleep(0.01)
    lsn.close()
    return {"raised": out}


@loop_probe(documented=f"{_PR}#asyncio.WriteTransport.set_write_buffer_limits",
            twin_of=("cb_default_buffer_limits",))
async def lp_write_buffer_limits(a):
    """get_write_buffer_limits(): the default, after high=1000, after low=10 only."""
    lsn = socket.create_server(("127.0.0.1", 0))
    t, _ = await a.get_running_loop().create_connection(a.Protocol, *lsn.getsockname())
    out = [t.get_write_buffer_limits()]
    t.set_write_buffer_limits(high=1000)
    out.append(t.get_write_buffer_limits())
    t.set_write_buffer_limits(low=10)
    out.append(t.get_write_buffer_limits())
    t.close()
    lsn.close()
    return {"limits": [list(x) for x in out]}


@loop_probe(documented=f"{_ST}#asyncio.StreamReader.readline")
async def lp_stream_limit_readline(a):
    """readline() past the stream's limit=8: what it raises, and what is left after."""
    lsn = socket.create_server(("127.0.0.1", 0))
    r, w = await a.open_connection(*lsn.getsockname(), limit=8)
    peer, _ = lsn.accept()
    peer.sendall(b"0123456789abcdef\nok\n")
    try:
        out = {"first": repr(await a.wait_for(r.readline(), 1))}
    except Exception as exc:
        out = {"first": type(exc).__name__}
    out["next"] = repr(await a.wait_for(r.readline(), 1))
    w.close()
    peer.close(), lsn.close()
    return out


@loop_probe(documented=f"{_PR}#asyncio.Protocol.eof_received")
async def lp_eof_received_false_closes(a):
    """eof_received() returns None: the transport closes itself (events, is_closing)."""
    events, lsn = [], socket.create_server(("127.0.0.1", 0))
    t, _ = await a.get_running_loop().create_connection(
        _recorder(a, events, None), *lsn.getsockname())
    peer, _ = lsn.accept()
    peer.sendall(b"x")
    peer.shutdown(socket.SHUT_WR)
    await a.sleep(0.05)
    peer.close(), lsn.close()
    return {"events": events, "is_closing": t.is_closing()}


@loop_probe(documented=f"{_EL}#asyncio.loop.connect_accepted_socket")
async def lp_connect_accepted_socket(a):
    """connect_accepted_socket() on an accepted socket: a transport, and data flows."""
    lsn = socket.create_server(("127.0.0.1", 0))
    c = socket.create_connection(lsn.getsockname())
    conn, _ = lsn.accept()
    events = []
    try:
        t, _ = await a.get_running_loop().connect_accepted_socket(_recorder(a, events, None), conn)
        c.sendall(b"x")
        await a.sleep(0.05)
        out = {"events": events, "closing": t.close()}
    except Exception as exc:
        out = {"raised": type(exc).__name__}
    c.close(), conn.close(), lsn.close()
    return out


# --- signal handlers -----------------------------------------------------------------

@loop_probe(documented=f"{_EL}#asyncio.loop.add_signal_handler")
async def lp_signal_handler_delivery(a):
    """add_signal_handler(SIGUSR1): the callback runs with its arguments, in the loop."""
    loop, fut = a.get_running_loop(), a.get_running_loop().create_future()
    loop.add_signal_handler(signal.SIGUSR1, fut.set_result, "called")
    os.kill(os.getpid(), signal.SIGUSR1)
    try:
        out = await a.wait_for(fut, 1)
    except TimeoutError:
        out = "not called"
    try:
        loop.remove_signal_handler(signal.SIGUSR1)
    except Exception:
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    return {"handler": out}


@loop_probe(documented=f"{_EL}#asyncio.loop.remove_signal_handler")
async def lp_remove_signal_handler(a):
    """remove_signal_handler(): True for an installed handler, False the second time."""
    loop, out = a.get_running_loop(), []
    loop.add_signal_handler(signal.SIGUSR2, print)
    for _ in range(2):
        try:
            out.append(loop.remove_signal_handler(signal.SIGUSR2))
        except Exception as exc:
            out.append(type(exc).__name__)
    signal.signal(signal.SIGUSR2, signal.SIG_DFL)
    return {"returns": out}


@loop_probe(documented=f"{_EL}#asyncio.loop.add_signal_handler")
async def lp_signal_handler_bad_arguments(a):
    """add_signal_handler() with SIGKILL, with signal 0, and with a coroutine function."""
    loop, out = a.get_running_loop(), {}

    async def coro_fn():
        pass
    for name, args in (("sigkill", (signal.SIGKILL, print)), ("zero", (0, print)),
                       ("coroutine", (signal.SIGUSR2, coro_fn))):
        try:
            loop.add_signal_handler(*args)
            out[name] = None
        except Exception as exc:
            out[name] = type(exc).__name__
    signal.signal(signal.SIGUSR2, signal.SIG_DFL)
    return out


# --- the default executor ------------------------------------------------------------

@loop_probe(documented=f"{_EL}#asyncio.loop.run_in_executor")
async def lp_run_in_executor(a):
    """run_in_executor(None, f): the result, in another thread; an exception propagates."""
    loop = a.get_running_loop()
    other = await loop.run_in_executor(None, lambda: threading.get_ident() != threading.main_thread().ident)
    try:
        await loop.run_in_executor(None, int, "x")
        raised = None
    except Exception as exc:
        raised = type(exc).__name__
    return {"in_other_thread": other, "raised": raised}


@loop_probe(documented=f"{_EL}#asyncio.loop.shutdown_default_executor")
async def lp_shutdown_default_executor(a):
    """run_in_executor(None, ...) after shutdown_default_executor() (on a fresh loop)."""
    loop = type(a.get_running_loop())()

    async def go():
        await loop.run_in_executor(None, int, "1")
        await loop.shutdown_default_executor()
        try:
            await loop.run_in_executor(None, int, "2")
            return None
        except Exception as exc:
            return type(exc).__name__
    out = await a.to_thread(loop.run_until_complete, go())
    loop.close()
    return {"after_shutdown": out}


@loop_probe(documented=f"{_EL}#asyncio.loop.set_default_executor")
async def lp_set_default_executor_wrong_type(a):
    """set_default_executor() with something that is not a ThreadPoolExecutor (3.11: TypeError)."""
    loop = a.get_running_loop()
    try:
        loop.set_default_executor(object())
        out = None
    except Exception as exc:
        out = type(exc).__name__
    loop.set_default_executor(concurrent.futures.ThreadPoolExecutor())
    return {"raised": out}


# --- futures and a task's loop -------------------------------------------------------

@loop_probe(documented=f"{_EL}#asyncio.loop.create_future")
async def lp_future_class(a):
    """create_future(): an asyncio.Future? isfuture()? get_loop() is the running loop?"""
    loop = a.get_running_loop()
    fut = loop.create_future()
    out = {"is_asyncio_future": isinstance(fut, a.Future), "isfuture": a.isfuture(fut),
           "same_loop": fut.get_loop() is loop}
    fut.cancel()
    return out


@loop_probe(documented=f"{_EL}#asyncio.loop.get_debug")
async def lp_debug_flag(a):
    """get_debug() follows set_debug()."""
    loop = a.get_running_loop()
    before = loop.get_debug()
    loop.set_debug(True)
    on = loop.get_debug()
    loop.set_debug(before)
    return {"on": on, "restored": loop.get_debug() == before}


@loop_probe(documented=f"{_EL}#asyncio.loop.shutdown_asyncgens")
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
    await a.to_thread(loop.run_until_complete, loop.shutdown_asyncgens())
    loop.close()
    del g
    return {"order": order}


# --- transports: when connection_lost comes, and with what ---------------------------

def _lost_recorder(a, lost):
    class Rec(a.Protocol):
        connection_lost = lambda self, exc: lost.append(type(exc).__name__ if exc else None)  # noqa: E731
    return Rec


@loop_probe(documented=f"{_PR}#asyncio.BaseTransport.close",
            twin_of=("cb_close_is_deferred", "cb_abort_with_buffer"))
async def lp_connection_lost_is_deferred(a):
    """close() and abort(): connection_lost() is called later, never inside the call."""
    lsn, out = socket.create_server(("127.0.0.1", 0)), {}
    for how in ("close", "abort"):
        lost = []
        t, _ = await a.get_running_loop().create_connection(_lost_recorder(a, lost),
                                                             *lsn.getsockname())
        getattr(t, how)()
        out[how] = {"inside": list(lost)}
        await a.sleep(0.02)
        out[how]["later"] = lost
    lsn.close()
    return out


@loop_probe(documented=f"{_PR}#asyncio.BaseProtocol.connection_lost",
            twin_of=("cb_peer_reset_while_reading", "cb_peer_reset_while_buffered"))
async def lp_peer_reset_connection_lost(a):
    """The peer resets an idle connection: connection_lost() and with which exception."""
    lsn, lost = socket.create_server(("127.0.0.1", 0)), []
    t, _ = await a.get_running_loop().create_connection(_lost_recorder(a, lost),
                                                         *lsn.getsockname())
    peer, _ = lsn.accept()
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
    peer.close()
    await a.sleep(0.1)
    t.close(), lsn.close()
    return {"lost": lost}


@loop_probe(documented=f"{_PR}#asyncio.BaseProtocol.connection_lost")
async def lp_write_to_closed_peer(a):
    """Writes to a peer that has closed its socket: connection_lost()'s exception."""
    lsn, lost = socket.create_server(("127.0.0.1", 0)), []
    t, _ = await a.get_running_loop().create_connection(_lost_recorder(a, lost),
                                                         *lsn.getsockname())
    peer, _ = lsn.accept()
    peer.close()
    for _ in range(20):
        if not t.is_closing():
            t.write(b"x" * 10_000)
        await a.sleep(0.01)
    lsn.close()
    return {"lost": lost}


@loop_probe(documented=f"{_PR}#asyncio.WriteTransport.set_write_buffer_limits",
            twin_of=("cb_bad_buffer_limits",))
async def lp_bad_buffer_limits(a):
    """set_write_buffer_limits(high=10, low=20) and high=-1 (asyncio: ValueError)."""
    lsn = socket.create_server(("127.0.0.1", 0))
    t, _ = await a.get_running_loop().create_connection(a.Protocol, *lsn.getsockname())
    out = []
    for kw in ({"high": 10, "low": 20}, {"high": -1}):
        try:
            t.set_write_buffer_limits(**kw)
            out.append(None)
        except Exception as exc:
            out.append(type(exc).__name__)
    t.close(), lsn.close()
    return {"raised": out}


@loop_probe(documented=f"{_EL}#asyncio.Handle.cancelled", twin_of=("cb_cancelled_handle",))
async def lp_cancelled_handle(a):
    """Handle and TimerHandle: cancel() twice, cancelled(), and they never run."""
    loop, order = a.get_running_loop(), []
    hs = [loop.call_soon(order.append, "soon"), loop.call_later(0.001, order.append, "later")]
    out = {}
    for name, h in zip(("call_soon", "call_later"), hs):
        try:
            h.cancel(), h.cancel()
            out[name] = h.cancelled()
        except Exception as exc:
            out[name] = type(exc).__name__
    await a.sleep(0.02)
    return {"cancelled": out, "ran": order}
