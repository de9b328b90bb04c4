"""The least a kernel can cost in this interpreter: the yardsticks for the
spawn+join goal and for the echo goals.

``await spawn(child)`` then ``await task.join()`` with nothing but what the API
itself makes: a coroutine for the child, a task object with the coro kernel's
twelve fields, two awaited generators (``spawn``'s and ``join``'s) and the
child's ``StopIteration``. No kernel: no ready queue, no task table, no
cancellation, no exit policy. A real kernel can only add to this::

    python -m bench.perf.icount --micro spawn_join floor coro curio

counts it beside the kernels, in instructions per operation (callgrind).

The echo floor (``python -m bench.perf.nokernel echo``) serves the shared echo
app (``protocols.callback.Echo``) from the least a Python reactor does a
request: ``epoll.poll()``, ``os.read`` and the app, whose ``transport.write`` is
one ``os.write``. No buffering (a short write loses bytes), no flow control, no
counters, no ready queue, timers or exception handling: a floor, not a
transport. The echo goals' references do all of that in C; a kernel written in
Python can only add to this::

    python -m bench.perf.icount floor callback uvloop-protocol:instrument=false
"""
from __future__ import annotations

import functools
import os
import select
import signal
import socket
import sys
import types

__all__ = ["run", "serve_echo"]


class _Task:
    # No __init__: calling a class without one and setting the slots after is
    # the cheapest way to make the object (the coro kernel does the same).
    __slots__ = ("id", "body", "daemon", "_value", "_exc", "_wait", "_pending", "_cancel",
                 "_scopes", "_done", "_joiners", "_callbacks", "_result", "_exception",
                 "__weakref__")


@types.coroutine
def _spawn(fn):
    task = _Task()
    task.id = 1
    task.body = fn()
    task.daemon = False
    task._value = task._exc = task._scopes = task._joiners = task._callbacks = None
    task._wait = task._cancel = 0
    task._pending = task._done = False
    return task
    yield       # never reached: a generator, so that it can be awaited


@types.coroutine
def _join(task):
    if not task._done:
        try:
            task.body.send(None)
        except StopIteration as e:
            task._done, task._result, task._exception = True, e.value, None
    return task._result
    yield       # never reached


def run(n: int) -> int:
    """``n`` spawn+joins of a child that counts itself; returns the count."""
    box = [0]

    async def child():
        box[0] += 1

    async def main():
        for _ in range(n):
            task = await _spawn(child)
            await _join(task)

    coro = main()
    try:
        coro.send(None)
    except StopIteration:
        pass
    return box[0]


#: A read's size, the callback kernel's: what glibc does to shrink an allocation of
#: it to the bytes that arrived is part of every read, in C and in the kernel alike.
_RECV_BYTES = 65536


class _Writer:
    """All of ``transport.write`` the floor keeps: the socket gets the bytes."""
    __slots__ = ("write",)


def serve_echo(host: str = "127.0.0.1") -> None:
    """Serve the echo app on an ephemeral port of ``host`` until SIGINT or
    SIGTERM, saying ``listening on HOST:PORT`` first (as ``looplab serve echo``
    does). A signal wakes the poll through ``signal.set_wakeup_fd``, as a real
    loop's does: a ``KeyboardInterrupt`` raised inside ``epoll.poll`` under
    valgrind did not always end the process."""
    from protocols.callback import Echo
    from protocols.cores import EchoCore

    server = types.SimpleNamespace(new_core=EchoCore,
                                   variant=types.SimpleNamespace(honour_pause=False))
    listener = socket.create_server((host, 0))
    listener.setblocking(False)
    wake_r, wake_w = socket.socketpair()
    wake_r.setblocking(False)
    wake_w.setblocking(False)
    ep = select.epoll()
    conns = {}
    old = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    old_fd = signal.set_wakeup_fd(wake_w.fileno())
    try:
        ep.register(listener.fileno(), select.EPOLLIN)
        ep.register(wake_r.fileno(), select.EPOLLIN)
        print(f"listening on {host}:{listener.getsockname()[1]}", flush=True)
        lfd, wfd = listener.fileno(), wake_r.fileno()
        while True:
            for fd, _ in ep.poll():
                if fd in conns:
                    sock, read, proto = conns[fd]
                    data = read()
                    if data:
                        proto.data_received(data)
                    else:
                        ep.unregister(fd)
                        del conns[fd]
                        sock.close()
                elif fd == lfd:
                    sock, _ = listener.accept()
                    sock.setblocking(False)
                    writer = _Writer()
                    writer.write = functools.partial(os.write, sock.fileno())
                    proto = Echo(server)
                    proto.transport = writer
                    conns[sock.fileno()] = (sock, functools.partial(os.read, sock.fileno(),
                                                                    _RECV_BYTES), proto)
                    ep.register(sock.fileno(), select.EPOLLIN)
                elif fd == wfd:
                    return
    finally:
        signal.set_wakeup_fd(old_fd)
        for sig, handler in old.items():
            signal.signal(sig, handler)
        for sock, _, _ in conns.values():
            sock.close()
        ep.close()
        listener.close()
        wake_r.close()
        wake_w.close()


if __name__ == "__main__":
    if sys.argv[1:] == ["echo"]:
        serve_echo()
        sys.exit(0)
    sys.exit(0 if run(int(sys.argv[1])) == int(sys.argv[1]) else 1)
