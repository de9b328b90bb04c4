"""The hybrid kernel: Futures, Tasks and asyncio-style streams layered on the
callback kernel's loop and transports.

This is the second idea in looplab's history, and the one asyncio shipped:
keep the reactor, and let coroutines ride on it. There is no second loop and no
second transport here. A ``Task`` is a callback that calls ``coro.send()``;
when the coroutine awaits a ``Future``, the Task parks its wake-up on that
Future, and whoever resolves it -- usually a transport callback like
``data_received`` -- puts the wake-up back on the ready queue with
``call_soon``. ``StreamWriter.write`` *is* ``SocketTransport.write``.

That inheritance is the point of building it this way, because it carries the
callback style's properties straight into code that reads as if it were
sequential:

* **Writes still buffer.** ``writer.write(data)`` returns at once with the
  bytes the socket refused sitting in the transport's user-space buffer (S4:
  asyncio leaves ~869 KB of a 1 MB write there). Backpressure is opt-in:
  ``await writer.drain()`` waits only while the transport has called
  ``pause_writing()``, and returns at the low-water mark, not at empty. Forget
  it and the buffer grows without bound (S1, S5, S6).
* **Effects still complete later.** ``writer.close()`` returns before the
  socket closes; ``connection_lost`` runs on a later pass, which is why one
  ``await sleep(0)`` -- or, properly, ``await writer.wait_closed()`` -- is
  needed before returning from main (S3). Exiting earlier drops the buffer;
  what exactly happens is the ``exit`` option, reported in
  ``probe.exit_report``.
* **Spawning is still scheduling.** ``create_task`` queues the child's first
  step; the child runs after the parent's next suspension (S4's 200/200).

Design choices are options whose defaults reproduce asyncio 3.11, so that one
can be flipped at a time::

    Runner(high_water=65536, low_water=16384, write="try-send"|"defer",   # the loop's
           spawn="lazy"|"eager",        # eager: the child's first step runs inside create_task
           drain="asyncio"|"empty",     # empty: drain() returns only when nothing is buffered
           wait_for="task"|"inline",    # 3.11: wait_for runs a coroutine in a new Task; 3.12 inline
           wait_closed="3.11"|"3.12",   # 3.12: Server.wait_closed() waits for every connection
           drain_on_closing="yield"|"return",  # return: drain() on a closing transport returns
           drain_waiters="many"|"one",  # one: a second task awaiting drain() asserts
           exit="cancel"|"wait"|"raise",
           trace=False, io=None)        # io: the loop's I/O seam (kernels.io)

plus the callback loop's edge options (``write_after_close``, ``limits_recheck``,
``writelines``, ``buffer_on_loss``). They are declared once, in ``OPTIONS``.
The last three above bring back an older or newer asyncio's stream edge, so
that ``looplab repro`` can show a bug the installed Python does not have and show
it gone at the default: ``wait_closed="3.12"`` is 3.12.1's Server, whose
shutdown hangs on an idle client (CPython 113538; the default follows the running
Python, as ``wait_for``'s does); ``drain_on_closing="return"`` is the drain()
that never yields on a closing or lost transport, so a ``write(); drain()`` loop
spins without seeing the error (asyncio issue 263, CPython 80982);
``drain_waiters="one"`` is the single drain waiter before 3.11 (CPython 74116).
They are read only on those rare paths, never on a plain write or drain. As in asyncio, a Task runs in a copy
of the context current when it was created; done callbacks, and callbacks
scheduled with the Runner loop's ``call_soon``/``call_later``/``call_at``, run
in a copy of the context current when they were scheduled (or ``context=``);
and a Future whose exception nobody retrieved is reported when it is collected.

What it costs: every ``await`` on I/O is a Future to wait on, a trip through
the ready queue and a ``send`` into a stack of coroutine frames, on top of the
reactor's own work -- the gap between the ``callback`` and ``hybrid`` rows of a
benchmark. The step path is kept lean for that reason: the task's kernel state
is carried by the task; a task is queued through one ready-queue entry made at
spawn and reused for every step (no Handle per wake-up), and the step itself is
the wake-up; a stream read recycles its waiter Future; the probe and trace
cost an increment and a ``None`` test when tracing is off.

Measured (server instructions per 1 KiB echo request, callgrind, 10
connections, ``python -m bench.perf.icount``; runs agree within ~2-4 %): hybrid
27.4k, uvloop's streams 30.1k, asyncio's streams 50.0k. Where the 27.4k go:
the reactor's share is the callback kernel's 11.4k; the rest is the Task step
(``context.run`` + ``coro.send`` through the handler's frames), one Future
resolution and re-arm per read, and the stream reader's copy out of its
buffer. Writes are not batched per pass for the reason the callback kernel
gives (one send per request already).

Where the loop is: there is no second loop. The event loop is the callback
kernel's ``Loop.run_forever`` (``kernels/callback/loop.py``); what it calls for
a task is ``Task.__step`` in ``tasks.py``.

Modules: ``futures`` (Future, the exceptions, per-loop state), ``tasks``
(Task, sleep, gather, wait_for, timeout, TaskGroup), ``sync`` (Event, Queue),
``runner`` (Runner, run, OPTIONS) and ``streams`` (StreamReader, StreamWriter,
open_connection, start_server).
"""
from .futures import (CancelledError, Future, InvalidStateError, QueueEmpty, QueueFull,
                      TimeoutError)
from .tasks import (Task, TaskGroup, Timeout, all_tasks, create_task, current_task,
                    ensure_future, gather, sleep, timeout, timeout_at, wait_for)
from .sync import Event, Queue
from .runner import OPTIONS, Runner, run
from .streams import (
    IncompleteReadError, LimitOverrunError, Server, StreamProtocol, StreamReader,
    StreamWriter, open_connection, start_server,
)
from kernels.callback import get_running_loop

__all__ = [
    "CancelledError", "InvalidStateError", "TimeoutError", "QueueEmpty", "QueueFull",
    "IncompleteReadError", "LimitOverrunError",
    "Future", "Task", "create_task", "current_task", "all_tasks", "ensure_future",
    "sleep", "gather", "wait_for", "timeout", "timeout_at", "Timeout", "TaskGroup",
    "Event", "Queue", "Runner", "run", "OPTIONS", "get_running_loop",
    "StreamReader", "StreamWriter", "StreamProtocol", "Server", "open_connection",
    "start_server",
]
