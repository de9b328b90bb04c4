"""SelectPort: selectkernel seen through looplab's stream port (asyncio's names).

Standard library only: the port is duck-typed against looplab's StreamPort
contract, it imports nothing from looplab. ``SelectPort(runtime, options)`` is
how looplab constructs it; ``SelectPort(None, {})`` works without looplab.

What ``run(main)`` does when main returns is the ``exit`` option:

* ``flush`` (default): leftover tasks are cancelled, then the loop keeps going
  until every write buffer is sent and every closed connection closed, for at
  most ``linger_s`` seconds; what is still buffered then is dropped and counted
  (``lost_on_exit_bytes``). Returning from main does not lose written bytes.
* ``cancel``: leftover tasks are cancelled and buffered bytes dropped (counted),
  as ``asyncio.run`` does.
* ``raise``: as ``cancel``, then RuntimeError if anything was left.
"""
from __future__ import annotations

import errno
import os
import socket

from .kernel import CancelledError, Deadlock, Future, Loop
from .streams import Connection, IncompleteReadError, Stats, StreamReader, StreamWriter

__all__ = ["SelectPort", "Server", "Event", "EXIT_POLICIES"]

EXIT_POLICIES = ("flush", "cancel", "raise")
CANCEL_WAIT_S = 1.0            # how long cancelled leftovers get to finish at exit


class _Yield:
    def __await__(self):
        yield                   # a bare yield: the task goes to the back of the ready queue


class Event:
    _loop: Loop | None = None   # bound per port (port.Event is a subclass)

    def __init__(self):
        self._set = False
        self._waiters: list[Future] = []

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(True)

    def clear(self) -> None:
        self._set = False

    async def wait(self) -> bool:
        if not self._set:
            fut = Future(self._loop)
            self._waiters.append(fut)
            await fut
        return True


class Server:
    """Accepts on a listening socket. ``close()`` stops accepting; it closes the
    socket only if ``start_server`` made it."""

    def __init__(self, port: "SelectPort", sock, cb, limit, own: bool):
        self._port, self._sock, self._cb, self._limit, self._own = port, sock, cb, limit, own
        self._fd = sock.fileno()
        self.closed = False
        sock.setblocking(False)
        port.loop.add_reader(self._fd, self._accept)

    def _accept(self) -> None:
        for _ in range(64):                   # bounded per pass: others get their turn
            try:
                sock, _addr = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:            # EMFILE and friends: try again next pass
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    return
                raise
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            reader, writer = self._port._wrap(sock, self._limit)
            result = self._cb(reader, writer)
            if hasattr(result, "send"):
                self._port.loop.create_task(result)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if not self._port.loop.closed:
                self._port.loop.remove_reader(self._fd)
            if self._own:
                self._sock.close()

    def is_serving(self) -> bool:
        return not self.closed

    async def wait_closed(self) -> None:
        return None


class _Timeout:
    def __init__(self, port, delay):
        self._port, self._delay, self.expired = port, delay, False

    async def __aenter__(self):
        self._task = self._port.loop.current
        self._timer = self._port.loop.call_later(self._delay, self._fire)
        return self

    def _fire(self):
        self.expired = True
        self._task.cancel()

    async def __aexit__(self, exc_type, exc, tb):
        self._timer.cancel()
        if self.expired and exc_type is CancelledError:
            raise TimeoutError(f"timed out after {self._delay} s") from None
        if self.expired:
            self._task._must_cancel = False   # the body finished first: no stray cancel
        return False


class _Runner:
    """``port.runner.get_loop()``, for programs that drive the loop themselves."""

    def __init__(self, loop):
        self._loop = loop

    def get_loop(self) -> Loop:
        return self._loop


class SelectPort:
    style = "stream"
    ours = False
    CancelledError = CancelledError
    TimeoutError = TimeoutError
    IncompleteReadError = IncompleteReadError

    def __init__(self, runtime=None, options=None):
        options = dict(options or {})
        self.runtime = runtime
        self.exit_policy = options.pop("exit", "flush")
        self.linger_s = float(options.pop("linger_s", 10.0))
        if self.exit_policy not in EXIT_POLICIES or self.linger_s < 0 or options:
            raise ValueError(f"selectkernel: bad options exit={self.exit_policy!r}, "
                             f"linger_s={self.linger_s!r}, unknown {sorted(options)}")
        self.loop = Loop()
        self.runner = _Runner(self.loop)
        self.Event = type("Event", (Event,), {"_loop": self.loop})
        self.create_task = self.loop.create_task
        self._conns: list[Connection] = []
        self._servers: list[Server] = []
        self._exit: dict = {}
        self._ran = False

    # -- asyncio's names
    async def sleep(self, delay: float, result=None):
        if delay <= 0:
            await _Yield()
            return result
        fut = Future(self.loop)
        timer = self.loop.call_later(delay, lambda: fut.done() or fut.set_result(None))
        try:
            await fut
        finally:
            timer.cancel()
        return result

    def _as_task(self, aw):
        return aw if isinstance(aw, Future) else self.loop.create_task(aw)

    async def wait_for(self, aw, timeout):
        task = self._as_task(aw)
        if timeout is None:
            return await task
        fired = []
        timer = self.loop.call_later(timeout, lambda: (fired.append(True), task.cancel()))
        try:
            return await task
        except CancelledError:
            if fired:
                raise TimeoutError(f"timed out after {timeout} s") from None
            task.cancel()
            raise
        finally:
            timer.cancel()

    def timeout(self, delay: float) -> _Timeout:
        return _Timeout(self, delay)

    async def gather(self, *aws):
        tasks = [self._as_task(a) for a in aws]
        try:
            return [await t for t in tasks]
        except BaseException:
            for t in tasks:             # structured: one failure ends the rest
                t.cancel()
            raise

    def current_task(self):
        return self.loop.current

    def all_tasks(self) -> set:
        return set(self.loop.tasks)

    # -- streams
    def _wrap(self, sock, limit):
        stats = Stats()
        conn = Connection(self.loop, sock, stats)
        self._conns.append(conn)
        reader = StreamReader(conn, limit)
        return reader, StreamWriter(conn, reader)

    async def open_connection(self, host, port, *, limit=65536, sockbuf=None):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            if sockbuf:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sockbuf)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, sockbuf)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
            err = sock.connect_ex((host, port))
            if err in (errno.EINPROGRESS, errno.EAGAIN):
                fut = Future(self.loop)
                self.loop.add_writer(sock.fileno(), lambda: fut.done() or fut.set_result(None))
                try:
                    await fut
                finally:
                    self.loop.remove_writer(sock.fileno())
                err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                raise OSError(err, f"connect to {host}:{port}: {os.strerror(err)}")
        except BaseException:
            sock.close()
            raise
        return self._wrap(sock, limit)

    async def start_server(self, client_connected_cb, host=None, port=None, *, sock=None,
                           limit=65536):
        own = sock is None
        if own:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((host or "127.0.0.1", port or 0))
                sock.listen(128)
            except BaseException:
                sock.close()
                raise
        server = Server(self, sock, client_connected_cb, limit, own)
        self._servers.append(server)
        return server

    # -- lifecycle
    def run(self, main, *args):
        """Run ``main(port, *args)``; then the exit policy. A KeyboardInterrupt
        (SIGINT) ends the run as ``exit=cancel`` would and is raised again."""
        if self._ran or self.loop.closed:
            raise RuntimeError("a SelectPort runs once")
        self._ran = True
        task = self.loop.create_task(main(self, *args), "main")
        try:
            self.loop.run_until(task.done)
        except KeyboardInterrupt:
            self._end("cancel", interrupted=True)      # raises KeyboardInterrupt again
        except BaseException:
            self._end("cancel")
            raise
        self._end(self.exit_policy)
        return task.result()

    def _settle(self, done, limit_s: float) -> None:
        """Turn the loop until ``done()`` or ``limit_s`` passes (a timer wakes it)."""
        timer = self.loop.call_later(limit_s, lambda: None)
        deadline = self.loop.time() + limit_s
        try:
            while not done() and self.loop.time() < deadline:
                self.loop.run_once()
        except Deadlock:
            pass
        finally:
            timer.cancel()

    def _end(self, policy: str, interrupted: bool = False) -> None:
        left = [t for t in self.loop.tasks if not t.done()]
        unsent = sum(len(c.wbuf) for c in self._conns if not c.closed)
        for t in left:
            t.cancel()
        t0 = self.loop.time()
        try:
            if not interrupted:
                self._settle(lambda: all(t.done() for t in left), CANCEL_WAIT_S)
                if policy == "flush":
                    self._settle(lambda: all(c.closed or not c.wbuf for c in self._conns),
                                 self.linger_s)
        except KeyboardInterrupt:          # Ctrl-C during the flush: drop the rest now
            interrupted = True
        lost = self._drop_all()
        self._exit = {"policy": policy, "tasks_left_count": len(left), "unsent_bytes": unsent,
                      "lost_on_exit_bytes": lost, "exit_s": round(self.loop.time() - t0, 4),
                      "interrupted": interrupted}
        if interrupted:
            raise KeyboardInterrupt
        if policy == "raise" and (left or unsent):
            raise RuntimeError(f"selectkernel: main returned with {len(left)} tasks and "
                               f"{unsent} unsent bytes left (exit=raise)")

    def _drop_all(self) -> int:
        lost = 0
        for server in self._servers:
            server.close()
        for conn in self._conns:
            if not conn.closed:
                lost += len(conn.wbuf)
                conn.stats.lost_on_exit_bytes += len(conn.wbuf)
                conn.wbuf.clear()
                conn._finish()
        return lost

    def probe(self) -> dict:
        stats = [c.stats for c in self._conns]
        total = lambda name: sum(getattr(s, name) for s in stats)   # noqa: E731
        return {
            "loop_iterations_count": self.loop.passes,
            "callbacks_run_count": self.loop.callbacks,
            "task_switches_count": self.loop.steps,
            "connections_count": len(stats),
            "accepted_bytes": total("accepted_bytes"),
            "sent_bytes": total("sent_bytes"),
            "received_bytes": total("received_bytes"),
            "peak_user_buffer_bytes": max((s.peak_user_buffer_bytes for s in stats), default=0),
            "reader_buffer_peak_bytes": max((s.peak_reader_buffer_bytes for s in stats), default=0),
            "pause_writing_count": None,          # no water marks: never pauses
            "written_while_paused_bytes": None,
            "lost_on_abort_bytes": total("lost_on_abort_bytes"),
            "lost_on_exit_bytes": total("lost_on_exit_bytes"),
            "writes_after_close_count": total("writes_after_close_count"),
            "exit": dict(self._exit),
            "per_connection": [s.snapshot() for s in stats],
            "source": "kernel probe",
        }

    def close(self) -> None:
        """Close every socket and the selector; idempotent."""
        if not self.loop.closed:
            self._drop_all()
            self.loop.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
