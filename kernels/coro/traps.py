"""These are the only functions that ever yield to the coro kernel: the traps.

A task asks the kernel for something by yielding a small tuple ``(opcode,
arg, ...)`` from one of the generator-based coroutines below; the kernel looks
the opcode up in its handler table (built by name from the ``trap_<name>``
handlers in ``handlers.py``, one per entry of ``OPCODES``) and answers with
``coro.send(value)`` or ``coro.throw(exc)``. Nothing else crosses the line,
so this file is the whole contract between tasks and the kernel.

The few things a task -- or a kernel callback such as ``on_done`` -- must be
able to do *without* awaiting go through the synchronous entry points at the
end (``spawn_soon``, ``wake``, ``cancel_soon``, ``cancel_scope``): each calls
the running kernel directly and never blocks.

Every trap checks first that a kernel is running, so awaiting one from
asyncio, trio or plain code fails with a clear ``RuntimeError`` instead of
handing the tuple to a loop that can't read it (see ``_live`` below for what
is checked). ``spawn`` is awaited like a trap but is one of the direct calls:
it can't block, so it never yields.
"""
from __future__ import annotations

import threading
import types
from threading import get_ident

from .errors import TaskError

__all__ = ["OPCODES", "sleep", "checkpoint", "spawn", "spawn_soon", "current_task",
           "read_wait", "write_wait", "io_release"]


# --------------------------------------------------------------------------
# Which kernel runs where. Each thread runs at most one kernel at a time
# (``Kernel.run`` asserts it once, on entry): the thread-local ``_state`` names
# it, for the entry points that must call it directly (``spawn`` and the
# synchronous ones) and for ``run``'s nesting check. The await traps only need
# to know that *some* kernel will read what they yield, so they test a plain
# module global, the number of kernels running in this process: a
# thread-local read costs about as much as the rest of a trap's checks. A
# trap awaited in a thread with no kernel while another thread runs one goes
# to whatever loop awaits it, which refuses it (asyncio: "bad yield"). The
# counts change under ``_lock`` (``+=`` on a global is not atomic across
# threads); nothing on a hot path takes it.

class _ThreadState(threading.local):
    kernel = None
    checkpoint = False


_state = _ThreadState()
_lock = threading.Lock()
_live = 0               # coro kernels running in this process, any thread
_checkpointing = 0      # of those, how many have io_schedule_point=True

# The usual process runs one kernel. While it is the only one, ``spawn`` and
# ``join`` reach it through these globals, after comparing the thread's
# ident with its thread's: cheaper than the thread-local, and as strict (a
# call from another thread takes the thread-local path and its error). A
# second kernel starting anywhere turns this off until all have stopped.
_solo_thread = None     # get_ident() of the solo kernel's thread, or None
_solo_spawn = None      # its spawn_task(fn, args, daemon, on_done)
_solo_join = None       # its join_now(target)


def _enter(kernel, checkpoint: bool) -> None:
    """``kernel`` starts running in this thread (the caller checked it is the only one)."""
    global _live, _checkpointing, _solo_thread, _solo_spawn, _solo_join
    with _lock:
        _state.kernel = kernel
        _state.checkpoint = checkpoint
        _live += 1
        _checkpointing += checkpoint
        if _live == 1:
            _solo_thread = get_ident()
            _solo_spawn, _solo_join = kernel._spawn, kernel._join_now
        else:
            _solo_thread = _solo_spawn = _solo_join = None


def _leave(checkpoint: bool) -> None:
    global _live, _checkpointing, _solo_thread, _solo_spawn, _solo_join
    with _lock:
        _state.kernel = None
        _state.checkpoint = False
        _live -= 1
        _checkpointing -= checkpoint
        _solo_thread = _solo_spawn = _solo_join = None


def io_checkpoint() -> bool:
    """Whether a socket call in this thread is a checkpoint (``io_schedule_point``):
    no thread-local read unless some running kernel has the option on."""
    return _checkpointing and _state.checkpoint


def _running_kernel(what: str):
    kernel = _state.kernel
    if kernel is None:
        raise RuntimeError(f"{what} needs a running coro kernel in this thread "
                           "(call it from a task started by kernels.coro.run / Kernel.run)")
    return kernel


# --------------------------------------------------------------------------
# Opcodes. The kernel has exactly one handler ``trap_<name>`` per name, and
# its table is indexed by the opcode, the name's position here.

OPCODES = ("yield", "sleep", "io_wait", "io_release", "join", "cancel", "current",
           "park", "scope_enter", "scope_exit", "parked")
(_YIELD, _SLEEP, _IO_WAIT, _IO_RELEASE, _JOIN, _CANCEL,
 _CURRENT, _PARK, _SCOPE_ENTER, _SCOPE_EXIT, _PARKED) = range(len(OPCODES))

# What a blocked task waits on (Task._wait); 0 means "not blocked" (ready or
# running). W_READ/W_WRITE double as the reader/writer index in an fd record
# and as its interest bits, which keeps the I/O paths free of lookups.
W_READ, W_WRITE, W_SLEEP, W_PARK, W_SHIELDED = 1, 2, 3, 4, 5

_YIELD_TRAP = (_YIELD,)
_CURRENT_TRAP = (_CURRENT,)
_PARKED_TRAP = (_PARKED,)   # "I am already parked (or requeued): just switch away"


# --------------------------------------------------------------------------
# The traps

@types.coroutine
def sleep(seconds):
    """Suspend the calling task for ``seconds``; ``sleep(0)`` is a checkpoint:
    the task goes to the back of the ready queue (and a pending cancellation is
    delivered). Negative or NaN -> ValueError."""
    if not _live:
        _running_kernel("sleep()")
    if seconds == 0:
        yield _YIELD_TRAP
        return
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
        raise TypeError(f"sleep() takes a number of seconds, not {type(seconds).__name__}")
    if not seconds >= 0:   # also catches NaN
        raise ValueError(f"sleep() needs a non-negative number of seconds, got {seconds!r}")
    yield (_SLEEP, seconds)


@types.coroutine
def checkpoint():
    """``sleep(0)``: yield to the other ready tasks and take delivery of a pending
    cancellation."""
    if not _live:
        _running_kernel("checkpoint()")
    yield _YIELD_TRAP


@types.coroutine
def spawn(fn, *args, daemon=False, on_done=None):
    """Start ``fn(*args)`` as a new task and return its ``Task``.

    With ``spawn="lazy"`` (the default) the child is only queued: it has not run
    when this returns. With ``spawn="eager"`` its first step (up to its first
    blocking trap) runs before this returns. ``daemon=True`` marks a background
    task the exit policy cancels silently. ``on_done(task)``: see ``Task``.

    Never blocks, never delivers a cancellation and never lets another task
    run (an eager child's first step is nested inside this call), so it calls
    the kernel directly instead of yielding a trap: a trap would cost a
    round trip through every frame of the caller's await chain and one more
    step. It is still awaited, as curio's is."""
    if _solo_thread == get_ident():
        return _solo_spawn(fn, args, daemon, on_done)
    return _running_kernel("spawn()")._spawn(fn, args, daemon, on_done)
    yield       # never reached: makes this a generator, so that it can be awaited


@types.coroutine
def current_task():
    """The ``Task`` running the caller."""
    if not _live:
        _running_kernel("current_task()")
    return (yield _CURRENT_TRAP)


@types.coroutine
def read_wait(fileobj):
    """Block until ``fileobj`` (a socket or an fd) is readable. One reader per fd:
    a second concurrent reader gets ``BusyResourceError``."""
    if not _live:
        _running_kernel("read_wait()")
    yield (_IO_WAIT, fileobj, W_READ)


@types.coroutine
def write_wait(fileobj):
    """Block until ``fileobj`` is writable. One writer per fd."""
    if not _live:
        _running_kernel("write_wait()")
    yield (_IO_WAIT, fileobj, W_WRITE)


@types.coroutine
def io_release(fileobj):
    """Forget ``fileobj``: unregister it from the poller and wake any task
    still waiting on it with ``ClosedResourceError``. Call before closing.
    Never blocks and never delivers a cancellation, so it is safe in cleanup."""
    if not _live:
        _running_kernel("io_release()")
    yield (_IO_RELEASE, fileobj)


# join and wait are Task methods (``Task.join = traps.join``): generator-based
# coroutines that yield the trap themselves, one frame per call instead of an
# async def around a trap generator (spawn+join is a benchmarked hot path).

@types.coroutine
def join(task):
    """Wait for the task to finish; return its result, or raise ``TaskError``
    chained from the exception it ended with (curio).

    A join on a child that is the only task ready may run the child in place
    (``join_now`` in ``engine.py``, where it is invisible): then nothing is
    yielded, or only the PARKED trap if the child blocked."""
    if not task._done:
        if _solo_thread == get_ident():
            how = _solo_join(task)
            if how != 1:
                yield (_JOIN, task) if how == 0 else _PARKED_TRAP
        else:
            if not _live:
                _running_kernel("Task.join()")
            yield (_JOIN, task)
    if task._exception is not None:
        raise TaskError(f"task {task.id} {task.name!r} crashed") from task._exception
    return task._result


@types.coroutine
def wait(task):
    """Wait for the task to finish without collecting its outcome."""
    if not task._done:
        if not _live:
            _running_kernel("Task.wait()")
        yield (_JOIN, task)


@types.coroutine
def cancel(task, blocking):
    """Request cancellation of ``task``; with ``blocking``, wait for its end."""
    if not _live:
        _running_kernel("Task.cancel()")
    yield (_CANCEL, task, blocking)


@types.coroutine
def park(queue, shield=False):
    """``WaitQueue.park``: block until ``wake`` picks this task; return its value."""
    if not _live:
        _running_kernel("WaitQueue.park()")
    return (yield (_PARK, queue._tasks, shield))


@types.coroutine
def scope_enter(scope):
    if not _live:
        _running_kernel("a timeout/cancel scope")
    yield (_SCOPE_ENTER, scope)


@types.coroutine
def scope_exit(scope):
    if not _live:
        _running_kernel("a timeout/cancel scope")
    yield (_SCOPE_EXIT, scope)


# --------------------------------------------------------------------------
# Synchronous entry points: the running kernel is called directly, nothing
# blocks, and no cancellation is delivered here.

def spawn_soon(fn, *args, daemon=False, on_done=None):
    """Synchronous ``spawn`` for code running inside a task (trio's
    ``start_soon`` shape). Honours ``spawn="eager"`` the way asyncio's eager
    tasks do: the child's first step runs nested inside this call."""
    return _running_kernel("spawn_soon()")._spawn(fn, args, daemon, on_done)


def wake(tasks, n, value) -> int:
    """Make up to ``n`` tasks parked in the deque ``tasks`` ready, oldest first."""
    reschedule = _running_kernel("WaitQueue.wake()")._reschedule
    woken = 0
    while tasks and woken < n:
        reschedule(tasks.popleft(), value)
        woken += 1
    return woken


def cancel_soon(task) -> None:
    """Request cancellation of ``task`` without waiting."""
    _running_kernel("Task.cancel_soon()")._cancel_task(task)


def cancel_scope(scope) -> None:
    """Deliver the cancellation of an active ``CancelScope`` to its task."""
    _running_kernel("CancelScope.cancel()")._scope_cancelled(scope)
