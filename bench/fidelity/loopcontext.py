"""Loop-conformance probes of ``contextvars``: the context callbacks, tasks, done
callbacks, threads and -- where asyncio promises nothing but every framework relies on
CPython's behaviour -- protocol callbacks run in (the context of the call that made
the connection, the server, the endpoint). The rules of ``bench.fidelity.loops`` hold
here.
"""
from __future__ import annotations

import contextvars
import socket

from bench.fidelity.loops import _raised, _wait, loop_probe
from bench.fidelity.promises import doc

_CB_CONTEXT = doc("eventloop", "asyncio.loop.call_soon",
                  "An optional keyword-only context argument allows specifying a custom "
                  "contextvars.Context for the callback to run in. The current context is used "
                  "when no context is provided.")


@loop_probe(promise=_CB_CONTEXT)
async def lp_ctx_call_soon_current(a):
    """call_soon() without context=: the callback sees the value set before the call."""
    var = contextvars.ContextVar("probe", default="unset")
    var.set("before")
    fut = a.get_running_loop().create_future()
    a.get_running_loop().call_soon(lambda: fut.set_result(var.get()))
    return {"sees": await _wait(a, fut)}


@loop_probe()
async def lp_ctx_call_soon_snapshot(a):
    """call_soon(), then the caller changes the variable: the callback sees which value?"""
    var = contextvars.ContextVar("probe", default="unset")
    var.set("before")
    fut = a.get_running_loop().create_future()
    a.get_running_loop().call_soon(lambda: fut.set_result(var.get()))
    var.set("after")
    return {"sees": await _wait(a, fut)}


@loop_probe(promise=_CB_CONTEXT)
async def lp_ctx_call_soon_given(a):
    """call_soon(context=ctx): the callback runs in ctx."""
    var = contextvars.ContextVar("probe", default="unset")
    ctx = contextvars.Context()
    ctx.run(var.set, "given")
    fut = a.get_running_loop().create_future()
    a.get_running_loop().call_soon(lambda: fut.set_result(var.get()), context=ctx)
    return {"sees": await _wait(a, fut)}


@loop_probe(promise=_CB_CONTEXT)
async def lp_ctx_call_later_given(a):
    """call_later(0.001, context=ctx): the callback runs in ctx."""
    var = contextvars.ContextVar("probe", default="unset")
    ctx = contextvars.Context()
    ctx.run(var.set, "given")
    fut = a.get_running_loop().create_future()
    a.get_running_loop().call_later(0.001, lambda: fut.set_result(var.get()), context=ctx)
    return {"sees": await _wait(a, fut)}


@loop_probe(promise=_CB_CONTEXT)
async def lp_ctx_call_soon_threadsafe_given(a):
    """call_soon_threadsafe(context=ctx) from a thread: the callback runs in ctx."""
    var = contextvars.ContextVar("probe", default="unset")
    ctx = contextvars.Context()
    ctx.run(var.set, "given")
    loop = a.get_running_loop()
    fut = loop.create_future()
    await a.to_thread(loop.call_soon_threadsafe, lambda: fut.set_result(var.get()), context=ctx)
    return {"sees": await _wait(a, fut)}


@loop_probe()
async def lp_ctx_callback_set_does_not_leak(a):
    """A callback sets the variable: the task that scheduled it does not see it."""
    var = contextvars.ContextVar("probe", default="unset")
    var.set("task")
    a.get_running_loop().call_soon(var.set, "callback")
    await a.sleep(0.01)
    return {"task_sees": var.get()}


@loop_probe(promise=doc("eventloop", "asyncio.loop.create_task",
                        "An optional keyword-only context argument allows specifying a custom "
                        "contextvars.Context for the coro to run in."))
async def lp_ctx_create_task_given(a):
    """loop.create_task(coro, context=ctx) (3.11): the coroutine runs in ctx."""
    var = contextvars.ContextVar("probe", default="unset")
    ctx = contextvars.Context()
    ctx.run(var.set, "given")

    async def read():
        return var.get()
    try:
        t = a.get_running_loop().create_task(read(), context=ctx)
    except TypeError as exc:
        return {"create_task": _raised(exc)}
    return {"sees": await _wait(a, t)}


@loop_probe(promise=doc("task", "asyncio.Task",
                        "If no context is provided, the Task copies the current context and "
                        "later runs its coroutine in the copied context."))
async def lp_ctx_task_copies(a):
    """A child task sees the parent's value, and its own set() does not reach the parent."""
    var = contextvars.ContextVar("probe", default="unset")
    var.set("parent")

    async def child():
        seen = var.get()
        var.set("child")
        return seen
    out = {"child_sees": await _wait(a, a.create_task(child()))}
    return {**out, "parent_sees": var.get()}


@loop_probe(promise=doc("future", "asyncio.Future.add_done_callback",
                        "An optional keyword-only context argument allows specifying a custom "
                        "contextvars.Context for the callback to run in. The current context is "
                        "used when no context is provided."))
async def lp_ctx_done_callback(a):
    """add_done_callback() without and with context=: what each callback sees."""
    var = contextvars.ContextVar("probe", default="unset")
    var.set("adder")
    fut, seen = a.get_running_loop().create_future(), {}
    fut.add_done_callback(lambda f: seen.update(current=var.get()))
    ctx = contextvars.Context()
    ctx.run(var.set, "given")
    fut.add_done_callback(lambda f: seen.update(given=var.get()), context=ctx)
    var.set("resolver")
    fut.set_result(None)
    await a.sleep(0.01)
    return seen


@loop_probe(promise=doc("future", "asyncio.Future.add_done_callback",
                        "Callbacks registered with asyncio.Future.add_done_callback() are not "
                        "called immediately. They are scheduled with loop.call_soon() instead."))
async def lp_done_callback_not_immediate(a):
    """set_result(): the done callback has not run when set_result() returns."""
    fut, seen = a.get_running_loop().create_future(), []
    fut.add_done_callback(lambda f: seen.append("cb"))
    fut.set_result(None)
    out = {"inside_set_result": list(seen)}
    await a.sleep(0.01)
    return {**out, "later": seen}


@loop_probe(promise=doc("task", "asyncio.to_thread",
                        "Also, the current contextvars.Context is propagated, allowing context "
                        "variables from the event loop thread to be accessed in the separate "
                        "thread."))
async def lp_ctx_to_thread(a):
    """asyncio.to_thread(): the function sees the caller's value."""
    var = contextvars.ContextVar("probe", default="unset")
    var.set("caller")
    return {"sees": await _wait(a, a.to_thread(var.get))}


@loop_probe()
async def lp_ctx_run_in_executor(a):
    """run_in_executor(None, f): does f see the caller's value (CPython: no)?"""
    var = contextvars.ContextVar("probe", default="unset")
    var.set("caller")
    return {"sees": await _wait(a, a.get_running_loop().run_in_executor(None, var.get))}


@loop_probe()
async def lp_ctx_add_reader(a):
    """add_reader(): the callback sees the value set before add_reader()."""
    var = contextvars.ContextVar("probe", default="unset")
    loop, fut = a.get_running_loop(), a.get_running_loop().create_future()
    s1, s2 = socket.socketpair()
    var.set("adder")
    loop.add_reader(s1.fileno(), lambda: fut.done() or fut.set_result(var.get()))
    s2.sendall(b"x")
    out = {"sees": await _wait(a, fut)}
    loop.remove_reader(s1.fileno())
    s1.close(), s2.close()
    return out


@loop_probe(promise=doc("eventloop", "asyncio.loop.set_exception_handler",
                        "The handler may be called in the Context of the task or handle where "
                        "the exception originated.", since="3.12"))
async def lp_ctx_exception_handler(a):
    """An exception in a callback run in ctx: the context the exception handler sees."""
    var = contextvars.ContextVar("probe", default="unset")
    loop, seen = a.get_running_loop(), []
    loop.set_exception_handler(lambda lp, c: seen.append(var.get()))
    ctx = contextvars.Context()
    ctx.run(var.set, "handle")
    var.set("task")
    loop.call_soon(lambda: 1 / 0, context=ctx)
    await a.sleep(0.01)
    return {"handler_sees": seen}


# --- protocol callbacks --------------------------------------------------------------------

def _ctx_proto(a, seen, var):
    class P(a.Protocol):
        connection_made = lambda self, t: seen.setdefault("made", var.get())  # noqa: E731
        data_received = lambda self, d: seen.setdefault("data", var.get())  # noqa: E731
        eof_received = lambda self: seen.setdefault("eof", var.get()) and None  # noqa: E731
        connection_lost = lambda self, e: seen.setdefault("lost", var.get())  # noqa: E731
    return P


@loop_probe()
async def lp_ctx_client_protocol_callbacks(a):
    """create_connection() called with the variable set: the value each protocol callback
    sees (made, data, eof, lost)."""
    var = contextvars.ContextVar("probe", default="unset")
    seen, lsn = {}, socket.create_server(("127.0.0.1", 0))
    var.set("caller")
    t, _ = await a.get_running_loop().create_connection(_ctx_proto(a, seen, var), *lsn.getsockname())
    var.set("changed")
    peer, _ = lsn.accept()
    peer.sendall(b"x")
    peer.shutdown(socket.SHUT_WR)
    await a.sleep(0.05)
    t.close(), peer.close(), lsn.close()
    await a.sleep(0.01)
    return seen


@loop_probe()
async def lp_ctx_client_protocol_factory(a):
    """create_connection()'s protocol factory sees the caller's value."""
    var = contextvars.ContextVar("probe", default="unset")
    seen, lsn = [], socket.create_server(("127.0.0.1", 0))
    var.set("caller")
    t, _ = await a.get_running_loop().create_connection(
        lambda: seen.append(var.get()) or a.Protocol(), *lsn.getsockname())
    t.close(), lsn.close()
    return {"factory_sees": seen}


@loop_probe()
async def lp_ctx_server_protocol_callbacks(a):
    """create_server() called with the variable set: the value the server's protocol
    factory and callbacks see."""
    var = contextvars.ContextVar("probe", default="unset")
    seen, factory = {}, []
    var.set("server")
    P = _ctx_proto(a, seen, var)
    srv = await a.get_running_loop().create_server(
        lambda: factory.append(var.get()) or P(), "127.0.0.1", 0)
    var.set("changed")
    c = socket.create_connection(srv.sockets[0].getsockname())
    c.sendall(b"x")
    c.shutdown(socket.SHUT_WR)
    await a.sleep(0.05)
    c.close()
    srv.close()
    await a.sleep(0.02)
    return {"factory": factory, **seen}


@loop_probe()
async def lp_ctx_start_server_handler(a):
    """start_server() called with the variable set: the value its client handler sees."""
    var = contextvars.ContextVar("probe", default="unset")
    fut = a.get_running_loop().create_future()

    async def handler(r, w):
        fut.done() or fut.set_result(var.get())
        w.close()
    var.set("server")
    srv = await a.start_server(handler, "127.0.0.1", 0)
    var.set("changed")
    c = socket.create_connection(srv.sockets[0].getsockname())
    out = {"handler_sees": await _wait(a, fut)}
    c.close()
    srv.close()
    return out


@loop_probe()
async def lp_ctx_connection_made_isolated(a):
    """connection_made() sets the variable: does the caller of create_connection() see it?"""
    var = contextvars.ContextVar("probe", default="unset")
    lsn = socket.create_server(("127.0.0.1", 0))
    var.set("caller")

    class P(a.Protocol):
        connection_made = lambda self, t: var.set("protocol")  # noqa: E731
    t, _ = await a.get_running_loop().create_connection(P, *lsn.getsockname())
    await a.sleep(0.01)
    t.close(), lsn.close()
    return {"caller_sees": var.get()}


@loop_probe()
async def lp_ctx_datagram_callbacks(a):
    """create_datagram_endpoint() called with the variable set: the value the protocol's
    connection_made and datagram_received see."""
    var = contextvars.ContextVar("probe", default="unset")
    seen = {}
    var.set("caller")

    class P(a.DatagramProtocol):
        connection_made = lambda self, t: seen.setdefault("made", var.get())  # noqa: E731
        datagram_received = lambda self, d, addr: seen.setdefault("datagram", var.get())  # noqa: E731
    t, _ = await a.get_running_loop().create_datagram_endpoint(P, local_addr=("127.0.0.1", 0))
    var.set("changed")
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    peer.sendto(b"x", t.get_extra_info("sockname"))
    await a.sleep(0.05)
    t.close(), peer.close()
    return seen
