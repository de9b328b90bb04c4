"""The trio and curio ports: task-style reference runtimes, measured through public APIs.

trio's ``Instrument`` and curio's ``Activation`` count task steps and spawns; a
stream wrapper counts bytes. curio has no Stream type, so ``_CurioStream`` gives
its sockets trio's ``receive_some``/``send_all``/``send_eof``/``aclose`` shape.
What these libraries cannot show (no transport, so no pause_writing) is ``None``.
Opened on a simulated network (``protocols.simports``), trio runs with a clock
and sockets of that network and curio with a kernel on it.
"""
from __future__ import annotations

import signal
import socket
import threading

from protocols import simports
from protocols.ports import Delegating, TaskPortBase, client_socket, sim_sigint

__all__ = ["TrioPort", "CurioPort", "trio_tasks", "curio_tasks"]


class _MeasuredStream:
    """Counts bytes through a reference library's stream (no user buffer to see:
    accepted == sent once send_all returns)."""

    def __init__(self, stream, stats):
        self._s = stream
        self.stats = stats

    async def receive_some(self, max_bytes=65536):
        data = await self._s.receive_some(max_bytes)
        self.stats.received_bytes += len(data)
        return data

    async def send_all(self, data):
        stats = self.stats
        try:
            await self._s.send_all(data)
        except BaseException as exc:
            # A cancelled send got part-way; count what the library says it sent
            # (curio: bytes_sent), or nothing when it can't say.
            part = getattr(exc, "bytes_sent", None)
            if part:
                stats.accepted_bytes += part
                stats.sent_bytes += part
            raise
        stats.accepted_bytes += len(data)
        stats.sent_bytes += len(data)

    async def aclose(self):
        try:
            await self._s.aclose()
        finally:
            self.stats.closed = True

    def __getattr__(self, name):
        return getattr(self._s, name)


class _AsyncCM:
    """Presents a synchronous context manager (trio's scopes) as an async one."""

    def __init__(self, cm):
        self._cm = cm

    async def __aenter__(self):
        return self._cm.__enter__()

    async def __aexit__(self, *exc):
        return self._cm.__exit__(*exc)


class TrioPort(TaskPortBase):
    # No transport, so no pause_writing to count; send_all blocks instead.
    unseen = ("pause_writing_count", "written_while_paused_bytes", "callbacks_run_count",
              "ready_max_count", "read_pauses_count")
    def __init__(self, runtime, opts):
        super().__init__(runtime)
        import trio
        self._trio = trio
        self._sim = simports.sim_io()
        self._instrument = opts.get("instrument", True)
        self.sleep = trio.sleep
        self.Event = trio.Event
        self.Cancelled = trio.Cancelled
        self.StreamError = (ConnectionError, trio.BrokenResourceError, trio.ClosedResourceError)

        stats = self.stats

        class Counter(trio.abc.Instrument):
            def before_task_step(self, task):
                stats.task_switches += 1

            def task_spawned(self, task):
                stats.spawns += 1

            def before_io_wait(self, timeout):
                stats.loop_iterations += 1

        self._instruments = [Counter()] if self._instrument else []

    def move_on_after(self, seconds):
        return _AsyncCM(self._trio.move_on_after(seconds))

    def fail_after(self, seconds):
        return _AsyncCM(self._trio.fail_after(seconds))

    def run(self, main, *args):
        self.stats.exit_report.update(policy="wait", tasks_left_count=0)
        if self._sim is not None:
            return simports.run_trio(self._sim, main, self, *args, instruments=self._instruments)
        # trio raises KeyboardInterrupt at whatever unprotected frame runs: a Ctrl-C
        # (or serve's SIGTERM) landing in a task between a nursery's __aenter__ and
        # its `async with` abandoned the nursery half-open, and trio reported
        # "Nursery stack corrupted" and exit 1, not 130 (1 run in 40). trio's own
        # option raises it at a checkpoint of the main task instead, "like a
        # Cancelled exception" (trio.run's docs), and the nursery cancels the rest.
        # The price, as its docs say: a task that never checkpoints cannot be
        # interrupted; every app here awaits I/O.
        return self._trio.run(main, self, *args, instruments=self._instruments,
                              restrict_keyboard_interrupt_to_checkpoints=True)

    def _wrap(self, stream):
        return _MeasuredStream(stream, self.stats.new_conn()) if self._instrument else stream

    async def open_tcp_stream(self, host, port, sockbuf=None):
        trio = self._trio
        sock = simports.trio_socket(client_socket(sockbuf))
        try:
            await sock.connect((host, port))
        except BaseException:
            sock.close()
            raise
        return self._wrap(trio.SocketStream(sock))

    def listen(self, sock):
        sock.setblocking(False)
        listener = self._trio.SocketListener(simports.trio_socket(sock))
        return _TrioListener(listener, self)

    def open_nursery(self):
        return _TrioNursery(self._trio.open_nursery())


class _TrioListener:
    def __init__(self, listener, port):
        self._l = listener
        self._port = port

    async def accept(self):
        return self._port._wrap(await self._l.accept())

    async def aclose(self):
        await self._l.aclose()


class _TrioNursery:
    def __init__(self, cm):
        self._cm = cm
        self._n = None

    async def __aenter__(self):
        self._n = await self._cm.__aenter__()
        return self

    async def __aexit__(self, *exc):
        return await self._cm.__aexit__(*exc)

    async def spawn(self, fn, *args):
        self._n.start_soon(fn, *args)

    async def cancel(self):
        self._n.cancel_scope.cancel()


class _CurioStream:
    """trio's Stream shape over a curio socket: the whole of the curio shim."""

    def __init__(self, sock):
        self.socket = sock

    async def receive_some(self, max_bytes=65536):
        return await self.socket.recv(max_bytes)

    async def send_all(self, data):
        await self.socket.sendall(data)

    async def send_eof(self):
        await self.socket.shutdown(socket.SHUT_WR)

    async def aclose(self):
        await self.socket.close()


class _CurioMove(Delegating):
    """curio's ignore_after, with trio's ``cancelled_caught`` spelling."""

    @property
    def cancelled_caught(self) -> bool:
        return bool(self._inner.expired)


class CurioPort(TaskPortBase):
    unseen = ("pause_writing_count", "written_while_paused_bytes", "callbacks_run_count",
              "ready_max_count", "read_pauses_count", "loop_iterations_count")
    def __init__(self, runtime, opts):
        super().__init__(runtime)
        import curio
        self._curio = curio
        self._instrument = opts.get("instrument", True)
        self.sleep = curio.sleep
        # The in-kernel Event (set() is a coroutine: drivers call common.set_event).
        # UniversalEvent, the one whose set() is plain, wakes the kernel through a
        # socketpair, one byte per waiter, and fails once that socket is full.
        self.Event = curio.Event
        self.Cancelled = curio.CancelledError
        self.detached_spawn = curio.spawn
        stats = self.stats

        class Counter(curio.kernel.Activation):
            def created(self, task):
                stats.spawns += 1

            def running(self, task):
                stats.task_switches += 1

        activations = [Counter()] if self._instrument else []
        self._sim = simports.sim_io()
        self.kernel = (curio.Kernel(activations=activations) if self._sim is None
                       else simports.curio_kernel(self._sim, activations=activations))

    def move_on_after(self, seconds):
        return _CurioMove(self._curio.ignore_after(seconds))

    def fail_after(self, seconds):
        return self._curio.timeout_after(seconds)

    def run(self, main, *args):
        """curio lets a KeyboardInterrupt land in the middle of a task step, which
        breaks its kernel. So during the run SIGINT/SIGTERM only write to a wake-up
        socket (``signal.set_wakeup_fd``); a watcher task reads it and ends ``main``
        by cancellation, and KeyboardInterrupt is raised once the kernel is done.
        On a simulated network the cell's simulated SIGINT wakes the watcher."""
        self.stats.exit_report.update(policy="cancel")
        if self._sim is not None:
            wake = simports.WakeSocket(self._sim.waker())
            on_sigint = lambda: wake.send(b"\0")  # noqa: E731
            sim_sigint().append(on_sigint)
            try:
                return self._run_until_woken(main, args, wake)
            finally:
                sim_sigint().remove(on_sigint)
                wake.close()
        if threading.current_thread() is not threading.main_thread():
            return self.kernel.run(main, self, *args)     # signals reach only the main thread
        rsock, wsock = socket.socketpair()
        rsock.setblocking(False)
        wsock.setblocking(False)
        ignore = lambda *a: None  # noqa: E731
        old = [signal.signal(signal.SIGINT, ignore), signal.signal(signal.SIGTERM, ignore)]
        old_fd = signal.set_wakeup_fd(wsock.fileno())
        try:
            return self._run_until_woken(main, args, rsock)
        finally:
            signal.set_wakeup_fd(old_fd)
            signal.signal(signal.SIGINT, old[0])
            signal.signal(signal.SIGTERM, old[1])
            rsock.close()
            wsock.close()

    def _run_until_woken(self, main, args, wake):
        """Run ``main(self, *args)``; a byte on ``wake`` cancels it and raises
        KeyboardInterrupt once the kernel is done."""
        curio = self._curio
        outcome = {}

        async def guarded():
            async with curio.TaskGroup(wait=any) as g:
                task = await g.spawn(main, self, *args)
                watcher = await g.spawn(curio.io.Socket(wake).recv, 1)
            if watcher.terminated and not watcher.cancelled:
                outcome["interrupted"] = True
            else:
                outcome["task"] = task

        self.kernel.run(guarded)
        if "interrupted" in outcome:
            raise KeyboardInterrupt
        return outcome["task"].result

    def _wrap(self, sock):
        stream = _CurioStream(sock)
        return _MeasuredStream(stream, self.stats.new_conn()) if self._instrument else stream

    async def open_tcp_stream(self, host, port, sockbuf=None):
        sock = self._curio.io.Socket(client_socket(sockbuf))
        try:
            await sock.connect((host, port))
        except BaseException:
            await sock.close()
            raise
        return self._wrap(sock)

    def listen(self, sock):
        return _CurioListener(self._curio.io.Socket(sock), self)

    def open_nursery(self):
        return _CurioNursery(self._curio.TaskGroup())

    def close(self) -> None:
        self.kernel.run(shutdown=True)


class _CurioListener:
    def __init__(self, sock, port):
        self._s = sock
        self._port = port

    async def accept(self):
        client, _addr = await self._s.accept()
        return self._port._wrap(client)

    async def aclose(self):
        await self._s.close()


class _CurioNursery(Delegating):
    async def spawn(self, fn, *args):
        await self._inner.spawn(fn, *args)

    async def cancel(self):
        await self._inner.cancel_remaining()


# ---------------------------------------------------------------------------
# The tasks of a running trio or curio, for a deadlock's report (RuntimeInfo.tasks)

def trio_tasks() -> list:
    """The task tree of the trio run in this thread, from its root (trio's own
    ``<...>`` system tasks left out), as ``[(label, coroutine)]``."""
    import trio
    try:
        root = trio.lowlevel.current_root_task()
    except RuntimeError:                  # no trio run in this thread
        return []
    out, todo = [], [root] if root is not None else []
    while todo:
        task = todo.pop()
        if not task.name.startswith("<"):
            out.append((f"trio task {task.name}", task.coro))
        for nursery in task.child_nurseries:
            todo.extend(nursery.child_tasks)
    return out


def curio_tasks() -> list:
    """The task table of the curio kernel running in this thread. curio has no
    public way to list it: ``curio.meta`` keeps the running kernel (curio 1.6),
    and a curio without it lists nothing."""
    import curio.meta
    kernel = getattr(getattr(curio.meta, "_locals", None), "kernel", None)
    tasks = getattr(kernel, "_tasks", None)
    if not isinstance(tasks, dict):
        return []
    return [(f"curio task {t.id} {t.name}", t.coro) for t in tasks.values()
            if not getattr(t, "terminated", False)]
