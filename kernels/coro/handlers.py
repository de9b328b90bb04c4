"""The coro kernel's trap handlers, one ``trap_<name>`` per opcode in
``traps.OPCODES``, and the fd registry the I/O traps keep.

A handler is called as ``handler(task, trap)`` by ``step`` with the tuple the
task yielded. It answers by setting ``task._value`` (what the next ``send``
passes in) or ``task._exc`` (what the next ``throw`` raises) and returns True
if the task is now blocked, False to have it stepped again at once. Handlers
never raise for a task's bad input: the error goes to the task.

Each builder makes its handlers as closures over the kernel state (see
``engine.py``) and returns them by name; ``engine.trap_table`` turns the names
into the table ``step`` indexes.
"""
from __future__ import annotations

import heapq

from .. import io as _io
from .errors import BusyResourceError, ClosedResourceError
from .traps import W_PARK, W_READ, W_SHIELDED, W_SLEEP, W_WRITE

__all__ = ["build_io_handlers", "build_task_handlers", "POLL_MASK"]

#: An fd record's interest (W_READ | W_WRITE) -> the poller's mask bits.
POLL_MASK = (0, _io.READ, _io.WRITE, _io.READ | _io.WRITE)


def build_io_handlers(rt) -> dict:
    """``trap_io_wait``, ``trap_io_release``, and ``purge`` (also used by the
    loop): the fd records of ``rt.fdmap``/``rt.fdrecs`` and their waiters."""
    trace = rt.trace
    fdmap = rt.fdmap
    fdrecs = rt.fdrecs
    poll_register = rt.poller.register
    poll_modify = rt.poller.modify
    poll_unregister = rt.poller.unregister
    poll_mask = POLL_MASK
    reschedule = rt.reschedule
    deliver = rt.deliver

    def purge(rec, reason):
        # Drop an fdmap record and wake its waiters with ClosedResourceError.
        if fdmap.get(rec[3]) is rec:
            del fdmap[rec[3]]
        if fdrecs.get(rec[4]) is rec:
            del fdrecs[rec[4]]
            try:
                poll_unregister(rec[4])
            except (ValueError, OSError):
                pass
        for i in (W_READ, W_WRITE):
            waiter = rec[i]
            if waiter is not None:
                rec[i] = None
                waiter._wait = 0
                waiter._exc = ClosedResourceError(reason)
                reschedule(waiter, None)

    def register(fileobj, event):
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        if fd < 0:
            raise ClosedResourceError(f"{fileobj!r} is closed")
        old = fdrecs.get(fd)
        if old is not None:
            # The fd number is still registered for an object that was closed
            # without io_release; the number has been reused. Forget the old one.
            purge(old, "the file descriptor was closed and its number reused")
        try:
            poll_register(fd, poll_mask[event])
        except FileExistsError:
            # epoll still holds the old file (a dup of it is open elsewhere).
            poll_modify(fd, poll_mask[event])
        rec = [event, None, None, fileobj, fd]
        fdmap[fileobj] = rec
        fdrecs[fd] = rec
        return rec

    def trap_io_wait(task, trap):                      # blocks
        # (_IO_WAIT, fileobj, W_READ or W_WRITE)
        if task._pending and deliver(task):
            return False
        fileobj = trap[1]
        event = trap[2]
        rec = fdmap.get(fileobj)
        try:
            if rec is None:
                rec = register(fileobj, event)
            elif not rec[0] & event:
                rec[0] |= event
                poll_modify(rec[4], poll_mask[rec[0]])
        except (OSError, ValueError, ClosedResourceError) as e:
            if rec is not None:
                purge(rec, "the file descriptor was closed behind the kernel's back")
            task._exc = e if isinstance(e, ClosedResourceError) else ClosedResourceError(
                f"can't wait on {fileobj!r}: {e}")
            return False
        if rec[event] is not None:
            task._exc = BusyResourceError(
                f"another task is already waiting to {'read' if event == 1 else 'write'} "
                f"on {fileobj!r}")
            return False
        rec[event] = task
        task._wait = event
        task._wait_obj = rec
        if trace is not None:
            trace.instant("io_wait", task.id, fd=rec[4],
                          direction="read" if event == 1 else "write")
        return True

    def trap_io_release(task, trap):
        rec = fdmap.get(trap[1])
        if rec is not None:
            purge(rec, "the socket was closed by another task while this one waited on it")
        return False

    return {name: fn for name, fn in locals().items()
            if name.startswith("trap_") or name == "purge"}


def build_task_handlers(rt) -> dict:
    """The other traps: yielding, sleeping, spawning, joining, cancelling,
    parking, and entering/leaving cancel scopes."""
    trace = rt.trace
    ready_append = rt.ready.append
    sleeping = rt.sleeping
    heappush = heapq.heappush
    next_seq = rt.next_seq
    monotonic = rt.monotonic
    deliver = rt.deliver
    cancel_task = rt.cancel_task
    dead_timer = rt.dead_timer

    def trap_yield(task, trap):                        # blocks (requeues)
        if task._pending and deliver(task):
            return False
        ready_append(task)
        if trace is not None:
            task._flow = trace.flow_start(task.id)
        return True

    if rt.options["deadline_check"] == "at-checkpoint":
        yield_when_blocked = trap_yield
        scope_cancelled = rt.scope_cancelled

        def trap_yield(task, trap):                    # noqa: F811 -- chosen once, here
            # trio's rule: a checkpoint inside a block whose deadline has passed
            # raises now, even if its timer has not fired on a loop pass yet.
            scopes = task._scopes
            if scopes:
                now = monotonic()
                for scope in scopes:
                    deadline = scope.deadline
                    if deadline is not None and deadline <= now and not scope._cancel_called:
                        if scope._timer is not None:
                            scope._timer = None
                            dead_timer()
                        scope._expired = scope._cancel_called = True
                        scope_cancelled(scope)
            return yield_when_blocked(task, trap)

    def trap_sleep(task, trap):                        # blocks
        if task._pending and deliver(task):
            return False
        entry = (monotonic() + trap[1], next_seq(), task)
        task._timer = entry
        heappush(sleeping, entry)
        task._wait = W_SLEEP
        return True

    def wait_for_end(task, target, shield):
        if not shield and task._pending and deliver(task):
            return False
        joiners = target._joiners
        if joiners is None:
            joiners = target._joiners = [task]
        else:
            joiners.append(task)
        task._wait = W_SHIELDED if shield else W_PARK
        task._wait_obj = joiners
        return True

    def trap_parked(task, trap):                       # blocks: the join parked it
        return True

    def trap_join(task, trap):                         # blocks unless target is done
        target = trap[1]
        if target._done:
            return False
        if target is task:
            task._exc = RuntimeError("a task can't join itself")
            return False
        if task._pending and deliver(task):
            return False
        joiners = target._joiners           # wait_for_end(task, target, False), inline
        if joiners is None:
            target._joiners = joiners = [task]
        else:
            joiners.append(task)
        task._wait = W_PARK
        task._wait_obj = joiners
        return True

    def trap_cancel(task, trap):                       # blocks if blocking=True
        target = trap[1]
        if target._done:
            return False
        if target is task and trap[2]:
            task._exc = RuntimeError("a task can't cancel itself and wait for its own end; "
                                     "use cancel(blocking=False)")
            return False
        cancel_task(target)
        if not trap[2] or target._done:
            return False
        return wait_for_end(task, target, False)

    def trap_current(task, trap):
        task._value = task
        return False

    def trap_park(task, trap):                         # blocks
        shield = trap[2]
        if not shield and task._pending and deliver(task):
            return False
        trap[1].append(task)
        task._wait = W_SHIELDED if shield else W_PARK
        task._wait_obj = trap[1]
        return True

    def trap_scope_enter(task, trap):
        scope = trap[1]
        if scope._task is not None:
            task._exc = RuntimeError("a cancel scope / timeout block can be entered only once")
            return False
        scope._task = task
        scope._active = True
        if task._scopes is None:
            task._scopes = [scope]
        else:
            task._scopes.append(scope)
        if scope._seconds is not None and not scope._cancel_called:
            deadline = scope.deadline = monotonic() + scope._seconds
            entry = scope._timer = (deadline, next_seq(), scope)
            heappush(sleeping, entry)
        if scope._cancel_called:
            task._pending = True
        return False

    def trap_scope_exit(task, trap):
        scope = trap[1]
        scopes = task._scopes
        if scope._task is not task or not scope._active or scopes[-1] is not scope:
            task._exc = RuntimeError("cancel scopes / timeout blocks exited out of order "
                                     "(or in another task)")
            return False
        scopes.pop()
        scope._active = False
        if scope._timer is not None:
            scope._timer = None
            dead_timer()
        return False

    return {name: fn for name, fn in locals().items() if name.startswith("trap_")}
