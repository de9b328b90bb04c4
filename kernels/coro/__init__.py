"""kernels.coro -- a trap kernel: the loop only sends to coroutines, and there is no hidden buffer.

The callback kernel answers "what happens when data arrives?" with a callback,
and answers "what happens when I write more than the socket takes?" with a
buffer the application never sees. Both answers break causality in N. J. Smith's
sense: when ``transport.write(data)`` returns, the write hasn't happened; it has
been *promised*, and every promise is an implicit thread of control running
later. The hybrid kernel puts coroutines on top but keeps the buffers.

This kernel removes them. A task is a coroutine; the kernel's only ways of
touching it are ``coro.send(value)`` and ``coro.throw(exc)``. A task asks the
kernel for something by yielding a *trap* -- a small tuple such as
``(_IO_WAIT, sock, W_READ)`` -- from a generator at the bottom of its await
chain, and the kernel dispatches it through a table. Sockets are non-blocking
and are used directly: ``sendall`` loops on ``send()`` and traps only when the
OS says EAGAIN. So ``await sock.sendall(data)`` returns exactly when the OS has the
bytes, backpressure is simply the call taking longer, and shutting down can't
lose what the application believes it wrote. That is curio's design, and the
post's verdict on it: correct as originally written.

The design choices that distinguish curio from trio are options, defaulting
to curio (see ``Kernel``): whether a non-blocking I/O call is a scheduling
point, whether a spawned child runs before ``spawn`` returns, edge- or
level-triggered cancellation, FIFO or randomised ready batches, and what
``run()`` does with tasks still alive when main returns. Each flip changes one
S4 fingerprint and nothing else.

Layout: ``kernel.py`` (the kernel, tasks, traps, cancel scopes and timeouts),
``sync.py`` (Event, Queue, TaskGroup -- written on the public primitives only),
``sockets.py`` (Socket, SocketStream, Listener, open_tcp_stream, listen).

    import kernels.coro as c

    async def main():
        async with c.TaskGroup() as g:
            g.start_soon(c.sleep, 0.1)
        async with c.move_on_after(0.5) as scope:
            await c.sleep(1)
        return scope.cancelled_caught

    c.run(main)                       # -> True
"""
from .kernel import (BusyResourceError, Cancelled, CancelScope, ClosedResourceError, Kernel,
                     Task, TaskTimeout, WaitQueue, checkpoint, current_task, io_release,
                     move_on_after, read_wait, run, sleep, spawn, spawn_soon, timeout_after,
                     write_wait)
from .sockets import Listener, Socket, SocketStream, listen, open_tcp_stream
from .sync import Event, Queue, TaskGroup, open_nursery

__all__ = [
    "Kernel", "run", "Task", "sleep", "checkpoint", "spawn", "spawn_soon", "current_task",
    "Cancelled", "TaskTimeout", "BusyResourceError", "ClosedResourceError",
    "CancelScope", "timeout_after", "move_on_after", "WaitQueue",
    "read_wait", "write_wait", "io_release",
    "Event", "Queue", "TaskGroup", "open_nursery",
    "Socket", "SocketStream", "Listener", "open_tcp_stream", "listen",
]
