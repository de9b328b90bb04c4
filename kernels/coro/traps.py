"""These are the only functions that ever yield to the coro kernel: the traps.

A task asks the kernel for something by yielding a small tuple ``(opcode,
arg, ...)`` from one of the generator-based coroutines below (or a tuple made
below: ``SocketStream.receive_some`` yields its socket's ``read_trap`` itself,
a generator less on every read that waits); the kernel looks
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

import contextvars
import threading
import types

from .errors import TaskError

__all__ = ["OPCODES", "sleep", "checkpoint", "spawn", "spawn_soon", "current_task",
           "read_wait", "write_wait", "io_release"]


# --------------------------------------------------------------------------
# Which kernel runs where. A kernel's ``run`` sets three context variables
# (asserting once, on entry, that none is set: one kernel per thread, never
# nested) and resets them on exit. Each thread has its own context, so a
# thread without a kernel reads None. ``spawn`` and ``join`` read the kernel's
# closures straight from their variables: ``ContextVar.get`` answers from a
# per-thread cache without allocating, which measured cheaper than a
# ``threading.local`` attribute or a comparison with ``threading.get_ident()``
# (whose int is allocated on every call); these two are a measured share of a
# spawn+join. The await traps only need to know that *some* kernel will read
# what they yield, so they test a plain module global, the number of kernels
# running in this process. A trap awaited in a thread with no kernel while
# another thread runs one goes to whatever loop awaits it, which refuses it
# (asyncio: "bad yield"). The counts change under ``_lock`` (``+=`` on a
# global is not atomic across threads); nothing on a hot path takes it.

_kernel_var = contextvars.ContextVar("looplab.coro kernel", default=None)
_spawn_var = contextvars.ContextVar("looplab.coro spawn", default=None)
_join_var = contextvars.ContextVar("looplab.coro join", default=None)
running_kernel = _kernel_var.get    # the kernel running in this thread, or None
_spawn_here = _spawn_var.get        # its spawn_task(fn, args, daemon, on_done), or None
_join_here = _join_var.get          # its tasks' join (engine.build_scheduler), or None
_lock = threading.Lock()
_live = 0               # coro kernels running in this process, any thread
_checkpointing = 0      # of those, how many have io_schedule_point=True


def _enter(kernel, checkpoint: bool) -> tuple:
    """``kernel`` starts running in this thread (the caller checked that none
    is); returns what ``_leave`` needs."""
    global _live, _checkpointing
    with _lock:
        _live += 1
        _checkpointing += checkpoint
    return (_kernel_var.set(kernel), _spawn_var.set(kernel._spawn),
            _join_var.set(kernel._join))


def _leave(tokens: tuple, checkpoint: bool) -> None:
    global _live, _checkpointing
    kernel_token, spawn_token, join_token = tokens
    _join_var.reset(join_token)
    _spawn_var.reset(spawn_token)
    _kernel_var.reset(kernel_token)
    with _lock:
        _live -= 1
        _checkpointing -= checkpoint


def checkpoint_here() -> bool:
    """Whether socket calls in this thread are checkpoints (the running kernel's
    ``io_schedule_point``); sockets ask only while some kernel has it on."""
    kernel = running_kernel()
    return kernel is not None and kernel.options["io_schedule_point"]


def _running_kernel(what: str):
    kernel = running_kernel()
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
    spawn_task = _spawn_here()
    if spawn_task is None:
        _running_kernel("spawn()")
    return spawn_task(fn, args, daemon, on_done)
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


def read_trap(fileobj) -> tuple:
    """What ``read_wait(fileobj)`` yields, made once for a socket: a
    generator-based coroutine at the bottom of an await chain may yield it
    itself instead of awaiting ``read_wait``, a generator less per wait
    (``SocketStream.receive_some`` does, on the echo hot path). It must test
    ``_live`` first, as ``read_wait`` does."""
    return (_IO_WAIT, fileobj, W_READ)


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
# A kernel's own tasks have its ``join`` instead (``engine.build_scheduler``),
# which runs a child in place where that is invisible and comes here when it
# is awaited in a thread where its kernel is not running.

@types.coroutine
def join(task):
    """Wait for the task to finish; return its result, or raise ``TaskError``
    chained from the exception it ended with (curio)."""
    if not task._done:
        if _join_here() is None:
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
