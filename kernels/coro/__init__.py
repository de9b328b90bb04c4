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
level-triggered cancellation, whether a checkpoint inside an expired timeout
block raises at once (``deadline_check="at-checkpoint"``, trio's rule, which
with ``io_schedule_point=True`` makes a send under a zero timeout fail even
when it would not block: trio issue 1626) or only when the task blocks
(curio), FIFO or randomised ready batches, whether
cancellations are ``BaseException``\\ s only (``cancel_base``), and what
``run()`` does with tasks still alive when main returns. They are declared
once, in ``OPTIONS``. Timeouts raise what curio raises: ``TaskTimeout`` at the
blocking call, ``TimeoutCancellationError`` out of an inner block an outer
timeout passed through; ``join()`` on a failed task raises ``TaskError``
chained from its exception. As curio logs "Task Crash", every task but main
that ends with an exception is reported on stderr when it ends, joined or not;
``Task.cancel()`` returns None, as curio's does.

Where the loop is: ``run_loop`` in ``engine.py`` (made by ``build_loop``) is
the event loop, and ``step`` next to it runs one task until it blocks.

Speed decisions, with what they measured (CPU instructions from callgrind,
CPython 3.11; ``python -m bench.perf.icount`` for echo, 10 connections, 1 KiB; runs
agree within ~2-4 %):

* An I/O wake-up puts the task itself on the ready deque: no handle, no
  callback, and interest in an fd is dropped lazily, so a connection that
  blocks on the same socket again costs no ``epoll_ctl``. Echo: 23.7-24.2k
  instructions per request, against 49.7k for curio, 114k for trio and 30.1k
  for uvloop's streams.
* Non-blocking traps (current_task, entering a timeout block, ...) are
  answered in place and the task is stepped again without a trip through
  the loop; a join of a finished task doesn't trap at all.
* The loop steps each ready batch with a countdown instead of a ``range``
  object per pass: spawn+join 28.2k -> 27.6k instructions per operation;
  the in-process TCP ping-pong micro-benchmark (client and server tasks in
  one kernel, so the count is exact) 57.3k -> 55.2k per round trip; echo
  over one idle connection 17.5-18.2k -> 16.9-17.0k per request.
* ``recv`` returns its own ``bytes``; after a short read one ``poll(0)``
  replaces the failed ``recv`` and its exception (see ``sockets.py``).

What a spawn costs, decided for spawn+join (issue 27). ``spawn`` can't block,
deliver a cancellation or let another task run, so it is not a trap: it calls
the kernel directly and returns without yielding (it is still awaited, as
curio's is). A trap cost a round trip up and down every frame of the
caller's await chain and one more step; ``task_switches`` now counts one send
fewer per spawn, because that send no longer happens -- it still counts every
send and throw, and ``spawns`` every task. The kernel running in a thread is
known to the thread (one per thread, checked once when ``run`` starts), but
the await traps no longer ask the thread-local on every call: they test a
process-wide count of running kernels, which is all they need to refuse a
trap awaited outside any kernel (``traps.py``); only the direct calls (spawn
and the synchronous entry points) read the thread-local, once each. What is
left per spawn+join is the Task, the child's coroutine and the spawn and join
generators, three steps (the parent to its join, the child, the parent
again) and two loop passes. The two passes are what ``spawn="lazy"`` means:
the child runs after the parent yields, in the next pass, and the parent
resumes in the pass after it, behind whatever became ready meanwhile; a
join of a child that has already finished (``spawn="eager"``, or a later
join) takes no pass at all. Moving the joiner into the running batch would
change the order the S4 fingerprints record, so it stays. Measured with
``python -m bench.perf.icount --micro OP coro`` (whole process under callgrind,
1,000 and 5,000 operations, the difference divided; previous and new code
in one run): spawn+join 29.9k -> 27.1k instructions (curio: 113k, so 4.2x);
chained_spawn 19.9k -> 18.1k; and, from the count test alone, a ``sleep(0)``
6.9k -> 6.3k (two tasks) and 5.4k -> 4.9k (100 tasks). On CPython 3.12 and
3.13 spawn+join goes 30.6k -> 27.6k and 30.1k -> 27.1k. The socket calls ask "is every I/O call a
checkpoint?" the same way (a process-wide count of running kernels with
``io_schedule_point`` first, the thread-local only when it isn't zero): echo
(10 connections, 1 KiB, ``--small 1000 --large 3000 --pause 0.005``)
went from 24.6k and 23.6k to 22.2k and 22.8k instructions per request (two
runs of each, alternating; with 2,000 requests between the two counts the
spread is a few per cent, so call it 3-10 % fewer). A Task built without its ``__init__`` frame
measured no fewer instructions and was not kept.

Layout: ``traps.py`` (the only functions that yield to the kernel: opcodes,
trap coroutines, the synchronous entry points), ``kernel.py`` (``Kernel``,
``OPTIONS``, ``run``), ``engine.py`` (the loop, the step, cancellation
delivery), ``handlers.py`` (one ``trap_<name>`` handler per opcode),
``task.py`` (Task, WaitQueue, CancelScope, timeouts), ``errors.py``,
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
from .errors import (BusyResourceError, Cancelled, ClosedResourceError, TaskError, TaskTimeout,
                     TimeoutCancellationError)
from .kernel import OPTIONS, Kernel, run
from .task import CancelScope, Task, WaitQueue, move_on_after, timeout_after
from .traps import (checkpoint, current_task, io_release, read_wait, sleep, spawn, spawn_soon,
                    write_wait)
from .sockets import Listener, Socket, SocketStream, listen, open_tcp_stream
from .sync import Event, Queue, TaskGroup, open_nursery

__all__ = [
    "Kernel", "OPTIONS", "run", "Task", "sleep", "checkpoint", "spawn", "spawn_soon", "current_task",
    "Cancelled", "TaskTimeout", "TimeoutCancellationError", "TaskError", "BusyResourceError", "ClosedResourceError",
    "CancelScope", "timeout_after", "move_on_after", "WaitQueue",
    "read_wait", "write_wait", "io_release",
    "Event", "Queue", "TaskGroup", "open_nursery",
    "Socket", "SocketStream", "Listener", "open_tcp_stream", "listen",
]
