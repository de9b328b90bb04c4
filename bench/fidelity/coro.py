"""Task-style probes: the pure-coroutine API on ``kernels.coro`` against curio and trio.

A probe is ``async def probe(k)`` where ``k`` is a ``TaskSide``: a small adapter that
maps sleep/spawn/join/timeouts/Event/sockets onto one library and names exceptions by
their *role* (``"timeout"``, ``"cancelled"``, ``"task-error"``...), so that curio's
``TaskCancelled`` and our ``Cancelled`` compare equal while a genuinely different
exception does not. What differs between the libraries lives in ``CoroSide``,
``CurioSide`` and ``TrioSide``; a probe never asks which library it runs on.
"""
from __future__ import annotations

import abc
import logging
import socket
import time

from bench.fidelity.registry import MB, Listener, LogCatcher, probe, reset


class TaskSide(abc.ABC):
    """sleep/spawn/join/cancel/timeouts/Event/sockets and exception roles for one
    library. The defaults are the API ``kernels.coro`` shares with trio (``Stream``'s
    ``send_all``/``receive_some``, ``lib.run(fn, side)``); subclasses override what
    their library does differently."""
    style = "task"

    def __init__(self, options=None):
        self.options = options or {}
        self.nursery = None
        self.lib = self.load()
        self.roles = self.exception_roles(self.lib)

    @abc.abstractmethod
    def load(self):
        """Import and return the library."""

    @abc.abstractmethod
    def exception_roles(self, lib) -> dict:
        """exception class -> its role (``"cancelled"``, ``"timeout"``...)."""

    def role(self, exc) -> str | None:
        if exc is None:
            return None
        for cls in type(exc).__mro__:
            if cls in self.roles:
                return self.roles[cls]
        return type(exc).__name__

    def base(self, exc) -> str:
        return "Exception" if isinstance(exc, Exception) else "BaseException"

    def crash_reports(self) -> int:
        """How many crash reports so far: curio logs them (logger "curio", ERROR); our
        kernel prints a line on stderr. Both channels are caught while a probe runs."""
        return len(self._log.messages) + sum(1 for line in self._err.getvalue().splitlines()
                                             if line.strip())

    def run(self, fn):
        import contextlib
        import io
        self._log, self._err = LogCatcher(), io.StringIO()
        self._log.setLevel(logging.ERROR)
        # crash reports go to the library's own logger (curio logs them there)
        # (and not on to this process's stderr)
        logger = logging.getLogger(self.lib.__name__)
        logger.addHandler(self._log)
        propagate, logger.propagate = logger.propagate, False
        try:
            with contextlib.redirect_stderr(self._err):
                return self._run(fn)
        finally:
            logger.removeHandler(self._log)
            logger.propagate = propagate

    def _run(self, fn):
        return self.lib.run(fn, self, **self.options)

    # -- time and tasks
    async def sleep(self, s):
        await self.lib.sleep(s)

    async def checkpoint(self):
        await self.lib.sleep(0)

    async def spawn(self, fn, *args):
        return await self.lib.spawn(fn, *args)

    async def join(self, task):
        return await task.join()

    async def cancel(self, task):
        return await task.cancel()

    def task_done(self, task) -> bool:
        return task.done()

    def timeout_after(self, s):
        return self.lib.timeout_after(s)

    def move_on_after(self, s):
        return self.lib.move_on_after(s)

    def caught(self, scope) -> bool:
        return bool(scope.cancelled_caught)

    def Event(self):
        return self.lib.Event()

    async def set_event(self, ev):
        ev.set()

    # -- sockets (the peer is a plain socket the probe drives)
    async def connect(self, port):
        return await self.lib.open_tcp_stream("127.0.0.1", port)

    async def send(self, s, data):
        return await s.send_all(data)

    async def recv(self, s, n=65536):
        return await s.receive_some(n)

    async def close(self, s):
        return await s.aclose()


class CoroSide(TaskSide):
    """``kernels.coro``, run with this side's kernel options."""

    def load(self):
        import kernels.coro as lib
        return lib

    def exception_roles(self, lib):
        return {lib.Cancelled: "cancelled", lib.TaskTimeout: "timeout",
                lib.TimeoutCancellationError: "timeout-cancellation",
                lib.TaskError: "task-error"}


class CurioSide(TaskSide):
    """curio: ``ignore_after``, an awaitable ``Event.set``, and socket streams with
    ``sendall``/``recv``/``close``."""

    def load(self):
        import curio as lib
        return lib

    def exception_roles(self, lib):
        return {lib.TaskCancelled: "cancelled", lib.CancelledError: "cancelled",
                lib.TaskTimeout: "timeout",
                lib.TimeoutCancellationError: "timeout-cancellation",
                lib.UncaughtTimeoutError: "uncaught-timeout",
                lib.TaskError: "task-error"}

    def task_done(self, task) -> bool:
        return bool(task.terminated)

    def move_on_after(self, s):
        return self.lib.ignore_after(s)

    def caught(self, scope) -> bool:
        return bool(scope.expired)

    async def set_event(self, ev):
        await ev.set()

    async def connect(self, port):
        return await self.lib.open_connection("127.0.0.1", port)

    async def send(self, s, data):
        return await s.sendall(data)

    async def recv(self, s, n=65536):
        return await s.recv(n)

    async def close(self, s):
        return await s.close()


class TrioSide(TaskSide):
    """trio: the probe runs inside a nursery that spawned children join, and the
    timeouts are plain ``with`` blocks."""

    def load(self):
        import trio as lib
        return lib

    def exception_roles(self, lib):
        return {lib.Cancelled: "cancelled", lib.TooSlowError: "timeout"}

    def _run(self, fn):
        async def main():
            async with self.lib.open_nursery() as n:
                self.nursery = n
                out = await fn(self)
                n.cancel_scope.cancel()
            return out
        return self.lib.run(main)

    async def spawn(self, fn, *args):
        return _TrioTask(self, fn, args)

    def task_done(self, task) -> bool:
        return task.done_ev.is_set()

    def timeout_after(self, s):
        return _AsyncCM(self.lib.fail_after(s))

    def move_on_after(self, s):
        return _AsyncCM(self.lib.move_on_after(s))


class _AsyncCM:
    """trio's timeouts are plain ``with`` blocks; the probes use ``async with``."""

    def __init__(self, cm):
        self.cm = cm

    async def __aenter__(self):
        return self.cm.__enter__()

    async def __aexit__(self, *exc_info):
        return self.cm.__exit__(*exc_info)


class _TrioTask:
    """A trio child started in the main nursery, joinable like a curio task."""

    def __init__(self, side, fn, args):
        import trio
        self.done_ev = trio.Event()
        self.scope = trio.CancelScope()
        self.exc = self.value = None

        async def body():
            with self.scope:
                try:
                    self.value = await fn(*args)
                except BaseException as exc:
                    self.exc = exc
            self.done_ev.set()
        side.nursery.start_soon(body)

    async def join(self):
        await self.done_ev.wait()
        if self.exc is not None:
            raise self.exc
        return self.value

    async def cancel(self):
        self.scope.cancel()
        await self.done_ev.wait()
        return True


async def _trap(k, aw):
    try:
        return {"value": await aw}
    except BaseException as exc:
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return {"raised": k.role(exc)}


@probe("task")
async def co_nested_timeout_outer_expires(k):
    """timeout_after(0.1) around timeout_after(2) around sleep(1): which exceptions, where."""
    out = {}
    try:
        async with k.timeout_after(0.1):
            try:
                async with k.timeout_after(2):
                    try:
                        await k.sleep(1)
                    except BaseException as exc:
                        out["at_await"] = k.role(exc)
                        raise
            except BaseException as exc:
                out["out_of_inner"] = k.role(exc)
                raise
    except BaseException as exc:
        out["out_of_outer"] = k.role(exc)
    return out


@probe("task")
async def co_nested_timeout_inner_expires(k):
    """timeout_after(2) around timeout_after(0.05) around sleep(1)."""
    out = {}
    try:
        async with k.timeout_after(2):
            try:
                async with k.timeout_after(0.05):
                    try:
                        await k.sleep(1)
                    except BaseException as exc:
                        out["at_await"] = k.role(exc)
                        raise
            except BaseException as exc:
                out["out_of_inner"] = k.role(exc)
            await k.sleep(0)
            out["outer_continues"] = True
    except BaseException as exc:
        out["out_of_outer"] = k.role(exc)
    return out


async def _timeout_through(k, caught: type) -> dict:
    """A body that catches ``caught`` around the sleep: does the timeout pass through?"""
    key = f"caught_by_except_{caught.__name__}"
    out = {key: False}
    try:
        async with k.timeout_after(0.05):
            try:
                await k.sleep(1)
            except caught:
                out[key] = True
        out["block_ended"] = "normally"
    except BaseException as exc:
        out["block_ended"] = k.role(exc)
    return out


@probe("task")
async def co_timeout_except_exception(k):
    """A body that catches Exception around the sleep: does the timeout pass through?"""
    return await _timeout_through(k, Exception)


@probe("task")
async def co_timeout_except_oserror(k):
    """A body that catches OSError around the sleep."""
    return await _timeout_through(k, OSError)


@probe("task")
async def co_timeout_exception_bases(k):
    """The base class of what a timeout raises at the await and out of the block."""
    out = {}
    try:
        async with k.timeout_after(0.02):
            try:
                await k.sleep(1)
            except BaseException as exc:
                out["at_await"] = k.base(exc)
                raise
    except BaseException as exc:
        out["out_of_block"] = k.base(exc)
        out["is_TimeoutError"] = isinstance(exc, TimeoutError)
    return out


@probe("task")
async def co_cancel_exception_base(k):
    """What task cancellation raises inside the task, and its base class."""
    seen = {}

    async def child():
        try:
            await k.sleep(10)
        except BaseException as exc:
            seen["inside"] = k.role(exc)
            seen["base"] = k.base(exc)
            raise
    t = await k.spawn(child)
    await k.sleep(0.01)
    await k.cancel(t)
    return seen


@probe("task", unmapped_on=("TrioSide",))
async def co_join_error(k):
    """join() on a task that raised ValueError: what join raises, and its cause."""
    async def child():
        raise ValueError("x")
    t = await k.spawn(child)
    try:
        await k.join(t)
        out = {"raised": None}
    except BaseException as exc:
        out = {"raised": k.role(exc), "cause": k.role(exc.__cause__)}
    out["crash_reported"] = k.crash_reports() > 0
    return out


@probe("task", unmapped_on=("TrioSide",))
async def co_join_cancelled(k):
    """join() on a task that was cancelled."""
    async def child():
        await k.sleep(10)
    t = await k.spawn(child)
    await k.sleep(0.01)
    await k.cancel(t)
    try:
        await k.join(t)
        return {"raised": None}
    except BaseException as exc:
        return {"raised": k.role(exc), "cause": k.role(exc.__cause__)}


@probe("task", unmapped_on=("TrioSide",))
async def co_cancel_finished_task(k):
    """cancel() on a task that already returned, and join() afterwards."""
    async def child():
        return 5
    t = await k.spawn(child)
    await k.sleep(0.01)
    res = await k.cancel(t)
    return {"cancel_returned": res, "join": await _trap(k, k.join(t))}


@probe("task", unmapped_on=("TrioSide",))
async def co_event_wake_order(k):
    """Event.set() with 10 waiters: do they resume in FIFO order?"""
    ev = k.Event()
    order = []

    async def waiter(i):
        await ev.wait()
        order.append(i)
    tasks = [await k.spawn(waiter, i) for i in range(10)]
    await k.sleep(0.01)
    await k.set_event(ev)
    for t in tasks:
        await k.join(t)
    return {"fifo": order == sorted(order)}


@probe("task")
async def co_event_set_before_wait(k):
    """wait() on an already-set Event returns; is_set() after clear()."""
    ev = k.Event()
    await k.set_event(ev)
    await ev.wait()
    return {"is_set": ev.is_set()}


@probe("task")
async def co_checkpoint_in_expired_block(k):
    """A deadline passes while the block never blocks; then sleep(0): raised where?"""
    steps = []
    try:
        async with k.timeout_after(0.01):
            time.sleep(0.03)
            steps.append("busy-done")
            await k.checkpoint()
            steps.append("after-checkpoint")
        steps.append("block-ended")
    except BaseException as exc:
        steps.append(k.role(exc))
    return {"steps": steps}


@probe("task")
async def co_expired_block_without_await(k):
    """A deadline passes while the block never blocks, and the block ends: raised?"""
    try:
        async with k.timeout_after(0.01):
            time.sleep(0.03)
        return {"raised": None}
    except BaseException as exc:
        return {"raised": k.role(exc)}


@probe("task")
async def co_move_on_after(k):
    """move_on_after/ignore_after(0.02) around sleep(1): block ends quietly, flag set."""
    async with k.move_on_after(0.02) as scope:
        await k.sleep(1)
    return {"caught": k.caught(scope)}


@probe("task")
async def co_move_on_after_not_expired(k):
    """move_on_after(1) around a short sleep: the flag stays False."""
    async with k.move_on_after(1) as scope:
        await k.sleep(0.001)
    return {"caught": k.caught(scope)}


@probe("task")
async def co_timeout_zero(k):
    """timeout_after(0) around sleep(0)."""
    try:
        async with k.timeout_after(0):
            await k.sleep(0)
        return {"raised": None}
    except BaseException as exc:
        return {"raised": k.role(exc)}


@probe("task", unmapped_on=("TrioSide",))
async def co_lazy_spawn_order(k):
    """spawn(): does the child run before the parent's next blocking call?"""
    order = []

    async def child():
        order.append("child")
    t = await k.spawn(child)
    order.append("parent")
    await k.sleep(0)
    order.append("parent-after-sleep0")
    await k.join(t)
    return {"order": order}


@probe("task", unmapped_on=("TrioSide",))
async def co_sleep0_round_robin(k):
    """Three tasks looping over sleep(0): the interleaving."""
    order = []

    async def worker(name):
        for i in range(3):
            order.append(f"{name}{i}")
            await k.sleep(0)
    tasks = [await k.spawn(worker, n) for n in "abc"]
    for t in tasks:
        await k.join(t)
    return {"order": order}


async def _co_connect(k):
    lst = Listener()
    s = await k.connect(lst.port)
    peer, _ = lst.sock.accept()
    peer.setblocking(False)
    lst.opened.append(peer)
    return lst, s, peer


@probe("task")
async def co_connect_refused(k):
    """Connecting to a port nobody listens on."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return await _trap(k, _connect_only(k, port))


async def _connect_only(k, port):
    s = await k.connect(port)
    await k.close(s)
    return "connected"


@probe("task")
async def co_recv_after_peer_close(k):
    """recv after the peer's FIN: b'' twice."""
    lst, s, peer = await _co_connect(k)
    peer.sendall(b"hi")
    peer.shutdown(socket.SHUT_WR)
    got = [await k.recv(s) for _ in range(3)]
    await k.close(s)
    lst.close()
    return {"reads": [g.decode() for g in got]}


@probe("task")
async def co_recv_after_peer_reset(k):
    """recv after the peer's RST."""
    lst, s, peer = await _co_connect(k)
    reset(peer)
    await k.sleep(0.02)
    out = {"first": await _trap(k, k.recv(s)), "second": await _trap(k, k.recv(s))}
    for v in out.values():
        if "value" in v:
            v["value"] = v["value"].decode()
    await _trap(k, k.close(s))
    lst.close()
    return out


@probe("task")
async def co_send_after_peer_reset(k):
    """send after the peer's RST, twice."""
    lst, s, peer = await _co_connect(k)
    reset(peer)
    await k.sleep(0.02)
    out = [(await _trap(k, k.send(s, b"x" * 1000))).get("raised") for _ in range(2)]
    await _trap(k, k.close(s))
    lst.close()
    return {"raised": out}


@probe("task", unmapped_on=("TrioSide",))
async def co_bytes_sent_on_timeout(k):
    """sendall of 8 MB to a peer that does not read, under timeout_after(0.1)."""
    lst, s, peer = await _co_connect(k)
    out = {}
    try:
        async with k.timeout_after(0.1):
            try:
                await k.send(s, b"b" * (8 * MB))
            except BaseException as exc:
                out["at_send"] = k.role(exc)
                out["bytes_sent_known"] = isinstance(getattr(exc, "bytes_sent", None), int)
                out["bytes_sent_positive"] = (getattr(exc, "bytes_sent", 0) or 0) > 0
                raise
        out["raised"] = None
    except BaseException as exc:
        out["raised"] = k.role(exc)
        out["bytes_sent_out_of_block"] = isinstance(getattr(exc, "bytes_sent", None), int)
    await _trap(k, k.close(s))
    lst.close()
    return out


@probe("task", unmapped_on=("TrioSide",))
async def co_bytes_sent_on_cancel(k):
    """A task blocked in sendall of 8 MB is cancelled: what it sees, and bytes_sent."""
    lst, s, peer = await _co_connect(k)
    seen = {}

    async def sender():
        try:
            await k.send(s, b"c" * (8 * MB))
        except BaseException as exc:
            seen["role"] = k.role(exc)
            seen["bytes_sent_positive"] = (getattr(exc, "bytes_sent", 0) or 0) > 0
            raise
    t = await k.spawn(sender)
    await k.sleep(0.05)
    await k.cancel(t)
    await _trap(k, k.close(s))
    lst.close()
    return seen


@probe("task")
async def co_finished_timeout_leaves_no_timer(k):
    """After a timeout_after(0.02) block that finished early, sleeping past its deadline."""
    async with k.timeout_after(0.02):
        await k.sleep(0)
    return await _trap(k, k.sleep(0.05))


@probe("task")
async def co_send_after_close(k):
    """send and recv on a socket we closed."""
    lst, s, peer = await _co_connect(k)
    await k.close(s)
    out = {"send": (await _trap(k, k.send(s, b"x"))).get("raised"),
           "recv": (await _trap(k, k.recv(s))).get("raised")}
    lst.close()
    return out


@probe("task", unmapped_on=("TrioSide",))
async def co_child_crash_unjoined(k):
    """A child crashes and nobody joins it: does the parent carry on?"""
    async def child():
        raise ValueError("unjoined")
    t = await k.spawn(child)
    await k.sleep(0.01)
    return {"parent_continues": True, "reported_before_run_ends": k.crash_reports() > 0,
            "done": k.task_done(t)}


@probe("task", unmapped_on=("TrioSide",))
async def co_cancel_then_catch_continue(k):
    """A task that catches its cancellation and returns a value: what join gives."""
    async def child():
        try:
            await k.sleep(10)
        except BaseException:
            return "swallowed"
    t = await k.spawn(child)
    await k.sleep(0.01)
    await k.cancel(t)
    return await _trap(k, k.join(t))


@probe("task")
async def co_timeout_inside_cancelled_task_cleanup(k):
    """Blocking in cleanup after a cancellation: does the next await raise again?"""
    seen = []

    async def child():
        try:
            await k.sleep(10)
        except BaseException as exc:
            seen.append(k.role(exc))
            try:
                await k.sleep(0.01)
                seen.append("cleanup-slept")
            except BaseException as exc2:
                seen.append("again:" + str(k.role(exc2)))
            raise
    t = await k.spawn(child)
    await k.sleep(0.01)
    await k.cancel(t)
    return {"seen": seen}

