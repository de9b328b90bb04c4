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
* ``SocketStream.receive_some`` is a generator-based coroutine that yields
  its socket's read trap (made once per socket) instead of awaiting
  ``read_wait``: a generator less on every read that waits. Echo with a
  pause between rounds (``--pause 0.005``): 21,190 -> 19,505 instructions per
  request.

What a spawn costs, decided for spawn+join (issue 27):

* ``spawn`` can't block, deliver a cancellation or let another task run, so
  it is not a trap: it calls the kernel directly and returns without
  yielding (it is still awaited, as curio's is). ``task_switches`` counts
  every send and throw, ``spawns`` every task (from the task ids).
* One kernel per thread, checked once when ``run`` starts, which sets three
  context variables (the kernel, its ``spawn_task`` and its tasks' ``join``).
  ``spawn`` and ``join`` read their closure with ``ContextVar.get``, a
  per-thread cache hit that allocates nothing; a thread without a kernel
  reads None and gets the "needs a running coro kernel" error. (Comparing
  ``threading.get_ident()`` with the kernel's thread cost more: the ident is a
  new int on every call.) The await traps test a process-wide count of
  running kernels, which is all they need to refuse a trap awaited outside
  any kernel (``traps.py``).
* A join hands off. ``spawn="lazy"`` means the child runs after the parent
  yields, and the parent resumes behind whatever became ready meanwhile.
  When the child is the only task ready, no batch is left, no fd is
  registered, no timer is due and nothing stops the loop, the next two
  passes would step the child and then the parent, alone; the join
  (``engine.py``) does exactly that in place and the parent carries on
  without yielding. Where any condition fails it takes the join trap as
  before. ``tests/test_coro.py`` runs 40 random task trees (spawn, join,
  cancel the parent, raise, events, timeouts) with the hand-off and without
  it (``trace=True`` turns it off) and requires the same log, line by line.
* ``Task`` has no ``__init__``: ``spawn_task`` calls the class (the cheapest
  construction; ``object.__new__`` costs more, an ``__init__`` a frame more)
  and sets the slots ``Task.AT_SPAWN`` names. A join handed off to a child
  that simply returns finishes it inline, without the general ``finish``.
  The kernel's task list is appended to and compacted now and then, never
  deleted from by id.
* The hand-off sends to the child through a generator (``in_place_first``)
  driven by ``next()``, so a child that returns at once raises no
  ``StopIteration`` to catch (about 1,900 instructions in a fresh frame);
  each kernel's tasks are a ``Task`` subclass whose ``join`` is a closure
  over the scheduler, the hand-off inline (a call less); and no task count
  is kept while main runs (the exit phases count once what they wait for).
  spawn+join 15,950 -> 13,874 instructions per operation (``--small 500
  --large 2500``; the floor is 8,005).

Measured with ``python -m bench.perf.icount --micro spawn_join floor coro
curio`` (whole process under callgrind, 1,000 and 5,000 operations, the
difference divided; CPython 3.11.7): spawn+join 27,169 -> 18,555 (the hand-off)
-> 15,947 instructions (this design; curio 113,134, so 7.1x). ``floor`` is
the same API with no kernel at all -- a coroutine, a
12-field task, two awaited generators and a ``StopIteration``: 8,036. Ten
times curio's count would leave 3,277 instructions for a whole kernel on
top of that floor: in instructions, 10x is out of reach of any kernel in
this interpreter's bytecode that keeps a task table, a ready queue and the
hand-off's conditions. The goal is judged in operations per second
(``looplab bench goals``), where the ratio comes out higher than the
count's: curio's instructions cost more time each (docs/benchmarking.md has
the figures).

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
