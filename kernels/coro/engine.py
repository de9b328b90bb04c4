"""The coro kernel's engine: the run loop, the step, and cancellation delivery.

``run_loop`` (made by ``build_loop``) is the event loop; ``step`` (made by
``build_scheduler``) runs one task until it blocks. Both are closures over the
kernel's state, curio-style, so that the hot paths reach it as fast local and
cell loads instead of attribute lookups. The state is shared through one
``KernelState`` record while the closures are being made; each builder copies what
it needs into locals first.

The state (all in ``KernelState``):

* ``ready``    -- a deque of tasks to step on the next loop pass;
* ``sleeping`` -- a heap of ``(deadline, seq, task_or_scope)`` timer entries.
  Entries are cancelled *lazily*: the owner's ``_timer`` slot points at its one
  live entry, and a popped entry that isn't it is dropped. When dead entries
  pile up (many short timeout blocks around fast operations) the heap is
  rebuilt by the rule in ``kernels.io``, so a long-lived server doesn't
  accumulate them;
* ``fdmap``    -- ``fileobj -> [mask, reader, writer, fileobj, fd]``; the same
  list is in ``fdrecs`` under its fd, which is how a poll result finds it.
  Interest is dropped lazily: a task that was woken for reading and then
  blocks on the same socket again (the normal life of a connection handler)
  costs no ``epoll_ctl`` at all; an interest nobody waits on any more is
  removed the first time it fires;
* ``tasks``    -- every task made, in creation order (the exit policy cancels
  newest first), finished ones included until a spawn compacts the list; a
  finish leaves it alone (a dict insert and delete by id cost a measured 600
  instructions of a spawn+join). ``live_tasks()`` is the live ones;
* ``run``      -- a ``RunState``: the stop flag, a pending interrupt and the
  dead-timer count; the run() phase, the main task and, after main, the
  count of tasks the phase waits for are cells of the scheduler, set through
  ``set_phase``.

A task runs until it *blocks*: non-blocking traps (spawn, current_task,
entering a timeout block) are answered at once and the same task is stepped
again without a trip through the ready queue. That is why a socket send that
doesn't block costs no scheduling at all under the default options.

Cancellation is *delivered at blocking traps only*. ``task.cancel()`` on a
blocked task unhooks it from whatever it waits on and throws ``Cancelled`` into
it; on a task that is ready or running it sets ``_pending`` and the exception
waits for the task's next blocking trap. Timeouts are cancel scopes with a
deadline: a scope pushed on the task's scope stack, a timer entry, and when the
entry fires the same delivery path. ``cancel="edge"`` (curio) delivers each
cancellation once; ``cancel="level"`` (trio) keeps raising it at every
blocking trap for as long as the task (or the expired block) lives.

Hazards, stated once: trap handlers and ``on_done`` callbacks run inside the
kernel and must not raise for ordinary bad input (they hand the error to the
task instead); a file descriptor closed behind the kernel's back without
``io_release`` is detected when its number is reused, not before.
"""
from __future__ import annotations

import heapq
import itertools
import random
import sys
import types
from collections import deque
from types import CoroutineType

from .. import choice as _choice
from .. import io as _io
from .errors import Cancelled, TaskError, TaskTimeout, flavour
from .handlers import POLL_MASK
from .task import Task, _checked_coro, _instantiate
from .traps import OPCODES, W_PARK, W_READ, W_SHIELDED, W_SLEEP, W_WRITE
from .traps import _JOIN as JOIN, _PARKED_TRAP as PARKED
from .traps import _join_here as join_here, join as general_join

# run() phases: what makes the loop stop.
UNTIL_MAIN, UNTIL_NONDAEMON, UNTIL_EMPTY = range(3)


class RunState:
    """The scalars the builders' closures share with each other and with
    ``Kernel.run``. (The phase, the main task and the count of tasks the
    phase waits for are the scheduler's own cells: see ``build_scheduler``.)"""
    __slots__ = ("stop", "interrupt", "stale")

    def __init__(self):
        self.stop = False           # ends run_loop(); set by finish() or an interrupt
        self.interrupt = None       # KeyboardInterrupt/SystemExit that ends run()
        self.stale = 0              # dead entries in `sleeping`


class KernelState:
    """What the builders share: the kernel's state and, as they are made, its
    functions. Read at build time only; the hot paths use their own locals."""

    def __init__(self, kernel, io):
        self.kernel = kernel
        self.probe = probe = kernel.probe
        self.trace = probe.trace
        self.options = kernel.options
        self.run = RunState()
        self.ready = deque()
        self.sleeping = []
        self.fdmap = {}
        self.fdrecs = {}
        self.tasks = []
        self.monotonic = io.time
        self.next_seq = itertools.count().__next__   # timer ties wake in the order they slept
        self.poller = io.poller()
        self.chooser = getattr(io, "chooser", None)   # an explorer's (kernels.choice)
        try:
            self.waker = io.waker()
        except BaseException:
            self.poller.close()
            raise


class _InPlace:
    """What a joiner is parked in (``_wait_obj``) while its ``join`` steps its
    child: no list, so a cancellation's unblock has nothing to remove it from."""
    __slots__ = ()

    def remove(self, task) -> None:
        pass

    def __repr__(self):
        return "<a join stepping its child in place>"


@types.coroutine
def in_place_first(task, coro):
    """A joined child's first step, run in place by a kernel's ``join`` as
    ``next(in_place_first(task, coro), sentinel)``. A coroutine's return
    reaches a ``yield from`` without an exception, and a generator that
    returns leaves ``next()`` nothing to raise, so a child that ends at once
    costs no ``StopIteration`` (raising and catching one is about 1,900
    instructions, a spawn+join's largest single cost). Its result is left in
    ``task._result``. A child that yields a trap instead stays suspended
    inside this generator, which from then on is what the kernel steps (one
    more frame a step for such a task; ``send`` and ``throw`` pass through
    to the child, and its return value is this generator's)."""
    result = task._result = yield from coro
    return result


def trap_table(handlers: dict) -> tuple:
    """The handler table indexed by opcode, from handlers named ``trap_<name>``:
    exactly one per name in ``OPCODES``, and none without an opcode."""
    found = {name[5:]: fn for name, fn in handlers.items() if name.startswith("trap_")}
    missing = [op for op in OPCODES if op not in found]
    extra = [name for name in found if name not in OPCODES]
    if missing or extra:
        raise RuntimeError(f"coro trap table: no handler for {missing}, no opcode for {extra}")
    return tuple(found[op] for op in OPCODES)


# --------------------------------------------------------------------------
# Timers

def build_timers(rt) -> None:
    """``dead_timer()``: one more lazily cancelled heap entry."""
    sleeping = rt.sleeping
    run = rt.run
    needs_compaction = _io.heap_needs_compaction
    min_dead = _io.COMPACT_MIN_DEAD
    heapify = heapq.heapify

    def dead_timer():
        stale = run.stale = run.stale + 1
        if stale > min_dead and needs_compaction(stale, len(sleeping)):
            sleeping[:] = [e for e in sleeping if e[2]._timer is e]
            heapify(sleeping)
            run.stale = 0

    rt.dead_timer = dead_timer


# --------------------------------------------------------------------------
# The scheduler: making, stepping and finishing tasks

def build_scheduler(rt) -> None:
    """``reschedule``, ``spawn_task``, ``finish``, ``step``; ``set_traps`` gives
    ``step`` its handler table once the handlers exist."""
    probe = rt.probe
    trace = rt.trace
    ready = rt.ready
    ready_append = ready.append
    ready_popleft = ready.popleft
    tasks = rt.tasks
    tasks_append = tasks.append
    run = rt.run
    dead_timer = rt.dead_timer
    eager = rt.options["spawn"] == "eager"
    last_id = 0             # task ids count from 1 (a plain cell: cheaper than a count())
    current = None          # the task being stepped (None between steps)
    switches = 0            # sends so far, never reset (flush_counters reports the new ones)
    counted_id = 0          # last_id when probe.spawns was last brought up to date
    counted_switches = 0    # switches when probe.task_switches was
    traps = ()
    phase = UNTIL_MAIN      # what makes the loop stop (Kernel.run sets it)
    doomed_at_birth = False  # phase == UNTIL_EMPTY
    counting = False        # phase != UNTIL_MAIN: spawn and finish keep `waiting`
    waiting = 0             # the live tasks the phase waits for (see set_phase)
    main_task = None
    compact_at = 64         # the task id at which `tasks` drops its finished tasks
    fdmap = rt.fdmap
    sleeping = rt.sleeping
    monotonic = rt.monotonic
    # A join may run the child in place (join, below) only where that is
    # invisible: no trace to show the nesting, no eager spawn whose parent is
    # still half-way through its own step.
    handoff = trace is None and not eager
    in_place = _InPlace()   # what a joiner waits in while join steps its child

    def reschedule(task, value):
        task._wait = 0
        task._value = value
        ready_append(task)
        if trace is not None:
            task._flow = trace.flow_start(current.id if current is not None else 0)

    def current_id():
        return current.id if current is not None else 0

    def flush_counters():
        # The step and spawn counters live in cells while the loop runs (an
        # attribute update per step is measurable); read from a task they lag.
        # Every task made takes the next id, so the ids count the spawns.
        # `switches` itself only grows: a task's `_born` is compared with it.
        nonlocal counted_id, counted_switches
        probe.task_switches += switches - counted_switches
        probe.spawns += last_id - counted_id
        counted_id = last_id
        counted_switches = switches

    def set_traps(table):
        nonlocal traps
        traps = table

    def set_phase(new_phase, new_main=None):
        # UNTIL_MAIN stops on main's end and counts nothing: while main runs
        # (every spawn+join of a benchmark) neither spawn nor finish keeps a
        # count. The later phases count once here what they wait for -- the
        # live non-daemon tasks, then all live tasks -- and from then on
        # spawn and finish keep that count (`waiting`).
        nonlocal phase, main_task, doomed_at_birth, counting, waiting
        phase = new_phase
        doomed_at_birth = new_phase == UNTIL_EMPTY
        counting = new_phase != UNTIL_MAIN
        if new_phase == UNTIL_MAIN:
            main_task = new_main
        else:
            waiting = len([t for t in tasks
                           if not t._done and (doomed_at_birth or not t.daemon)])

    def get_phase():
        return phase

    def live_nondaemon():
        return len([t for t in tasks if not t._done and not t.daemon])

    def live_tasks():
        return [t for t in tasks if not t._done]

    def spawn_task(fn, args, daemon, on_done):
        # Make a task and queue it (or, with spawn="eager" inside a task,
        # step it now).
        nonlocal waiting, last_id, compact_at
        born = switches
        try:
            coro = fn(*args)               # the common case: an async function
        except TypeError:
            if callable(fn):
                raise
            coro = _instantiate(fn, args)  # a coroutine object, or an error
        if type(coro) is not CoroutineType:
            coro = _checked_coro(fn, coro)
            born = -1                      # not a coroutine: no join hand-off
        tid = last_id = last_id + 1
        # Task has no __init__: calling the class is the cheapest way to make
        # one, and its slots are set here, once (Task.AT_SPAWN names them).
        task = task_class()
        task.id = tid
        task.coro = coro
        task.daemon = True if daemon else False
        task._value = task._exc = task._scopes = task._joiners = task._callbacks = None
        task._wait = task._cancel = 0
        task._pending = task._done = False
        task._born = born
        if on_done is not None:
            task.add_done_callback(on_done)
        tasks_append(task)
        if tid >= compact_at:
            # Amortised: the list holds at most twice the live tasks plus 64.
            tasks[:] = [t for t in tasks if not t._done]
            compact_at = tid + len(tasks) + 64
        if counting:                   # spawned after main ended (see set_phase)
            if doomed_at_birth:        # during teardown: counted, and cancelled
                waiting += 1
                task._cancel = 3
                task._pending = True
            elif not daemon:
                waiting += 1
        if trace is not None:
            trace.track(task.id, task.name)
            parent = current.id if current is not None else 0
            trace.instant("spawn", parent, child=task.id)
            task._flow = trace.flow_start(parent)
        if eager and current is not None:
            step(task)
        else:
            ready_append(task)
        return task

    def finish(task, result, exc):
        nonlocal waiting
        task._done = True
        task._result = result
        task._exception = exc
        task._value = None
        if task._scopes:       # left without exiting its blocks (a broken coroutine)
            for scope in task._scopes:
                scope._active = False
                if scope._timer is not None:
                    scope._timer = None
                    dead_timer()
            task._scopes = None
        callbacks = task._callbacks
        if callbacks is not None:
            for fn in callbacks:
                try:
                    fn(task)
                except Exception as e:
                    print(f"coro: on_done callback {fn!r} of task {task.id} failed: {e!r}",
                          file=sys.stderr)
        joiners = task._joiners
        if exc is not None:
            report_error(task, exc, joiners, callbacks)
        if joiners:
            task._joiners = None
            for joiner in joiners:          # reschedule(joiner, None), inline
                joiner._wait = 0
                joiner._value = None
                ready_append(joiner)
                if trace is not None:
                    joiner._flow = trace.flow_start(task.id)
        if not counting:
            if task is main_task:
                run.stop = True
        elif doomed_at_birth or not task.daemon:    # one `waiting` counts
            waiting -= 1
            if not waiting:
                run.stop = True

    def report_error(task, exc, joiners, callbacks):
        if trace is not None:
            trace.instant("error", task.id, exception=repr(exc))
        if isinstance(exc, Cancelled):
            pass
        elif isinstance(exc, (KeyboardInterrupt, SystemExit)):
            if run.interrupt is None:
                run.interrupt = exc
            if phase != UNTIL_EMPTY:
                run.stop = True
        elif task is not main_task:
            # curio reports every crash of a task other than main when it happens,
            # joined or not (its "Task Crash" log); join() still raises TaskError.
            print(f"coro: task {task.id} {task.name!r} crashed: {exc!r}", file=sys.stderr)

    @types.coroutine
    def join(target):
        # ``await task.join()`` on this kernel's tasks (the class made below
        # has it as its ``join``): ``traps.join`` with the hand-off inline, a
        # Python call less a join. On a child that has not finished: when the
        # child is the one task ready and nothing else could run before the
        # joiner resumes -- no batch left, no fd to poll, no timer due, no stop
        # -- the loop's next two passes would step the child and then the
        # joiner, alone. (No batch left: the child was spawned during the
        # joiner's running send -- no send since, `_born == switches` -- so it
        # is not part of the batch being stepped, and with it the only task
        # ready, nothing of the batch is left.) Do exactly that here, in
        # place: park the joiner, step the child, and if it finished and made
        # nothing else ready, carry on without yielding.
        # While the child runs the joiner is parked in no list (`in_place`),
        # so a child that finishes never wakes it (a wake and an unwake
        # saved); a child that cancels it reschedules it, exactly as from the
        # child's joiners list.
        nonlocal current, switches
        if not target._done:
            if join_here() is not join:
                # Awaited in a thread where this kernel is not running: the
                # general join (refused where no kernel runs at all).
                return (yield from general_join(target))
            task = current
            now = 0.0
            # `_born == switches`: spawned since the running send began, so
            # the child is still in `ready` (only a step takes a task out, and
            # every step counts a send); with `len(ready) == 1` it is all of
            # `ready`. A task whose coroutine in_place_first can't run is born
            # at -1.
            if (target._born != switches or len(ready) != 1 or fdmap or run.stop
                    or task is None or task._pending
                    or sleeping and sleeping[0][0] <= (now := monotonic())):
                yield (JOIN, target)
            else:
                task._wait = W_PARK
                task._wait_obj = in_place
                ready_popleft()
                # step(target), with its first send inlined: the child usually
                # ends there. A task that has never been stepped has nothing
                # to throw (a cancellation waits in _pending for its first
                # blocking trap). The send goes through in_place_first and
                # next(): a child that returns at once comes back as next()'s
                # default, with no StopIteration raised and caught here (~900
                # instructions of a spawn+join).
                current = target
                switches += 1
                runner = in_place_first(target, target.coro)
                try:
                    trap = next(runner, in_place)
                except BaseException as e:
                    finish(target, None, e)
                else:
                    if trap is not in_place:    # blocked inside the runner: step that
                        target._inner = target.coro
                        target.coro = runner
                        answer(target, trap)
                    elif (target._callbacks is None and target._joiners is None
                            and target._scopes is None and not counting):
                        # finish(target, target._result, None) for the usual
                        # child, inline: nobody else to tell, no block left
                        # open, and (the child is not main, nothing is
                        # counted) no stop to decide.
                        target._done = True
                        target._exception = None
                    else:
                        finish(target, target._result, None)
                current = task
                if task._wait != W_PARK:
                    # The child cancelled the joiner, which is rescheduled:
                    # switch away without asking anything.
                    yield PARKED
                elif target._done:
                    task._wait = 0
                    # The clock as read before the child ran: as if it had
                    # run in no time, which the loop can't tell from a fast
                    # child (and under a virtual clock, time does not move
                    # while a task runs).
                    if ready or run.stop or fdmap or (
                            sleeping and sleeping[0][0] <= (now or monotonic())):
                        task._value = None      # where the child's finish would have put it
                        ready_append(task)
                        yield PARKED
                else:
                    joiners = target._joiners   # the child blocked: wait for it as the trap does
                    if joiners is None:
                        target._joiners = joiners = [task]
                    else:
                        joiners.append(task)
                    task._wait_obj = joiners
                    yield PARKED
        if target._exception is not None:
            raise TaskError(f"task {target.id} {target.name!r} crashed") from target._exception
        return target._result

    # This kernel's tasks: a Task whose join is the one above (the hand-off
    # needs the scheduler's cells). Where the hand-off could be seen (a
    # trace, an eager spawn) their join is the general one.
    task_class = type("Task", (Task,), {"__slots__": (), "__module__": Task.__module__,
                                        "join": join if handoff else general_join})

    def answer(task, trap):
        # What step does with a trap `task` yielded, then the rest of its step.
        try:
            handler = traps[trap[0]]
        except (TypeError, IndexError, KeyError):
            task._exc = not_a_trap(task, trap)
            step(task)
            return
        if not handler(task, trap):
            step(task)

    def not_a_trap(task, trap):
        return TypeError(f"task {task.name!r} awaited {trap!r}, which is not a coro kernel trap "
                         "(asyncio/trio/curio objects can't be awaited here)")

    def step(task):
        # Run `task` until it blocks or ends. Non-blocking traps are answered
        # in place and the task is stepped again at once. The loop calls it
        # for each task of a batch; an eager spawn calls it in the middle of
        # another task's trap, so it restores `current` when it returns.
        nonlocal current, switches
        outer = current
        current = task
        coro = task.coro
        while True:
            switches += 1
            if trace is not None:
                trace.begin("step", task.id)
                if task._flow:
                    trace.flow_end(task._flow, task.id)
                    task._flow = 0
            exc = task._exc
            try:
                if exc is None:
                    trap = coro.send(task._value)
                else:
                    task._exc = None
                    trap = coro.throw(exc)
            except StopIteration as e:
                if trace is not None:
                    trace.end(task.id)
                finish(task, e.value, None)
                break
            except BaseException as e:
                if trace is not None:
                    trace.end(task.id)
                finish(task, None, e)
                break
            if trace is not None:
                trace.end(task.id)
            try:
                handler = traps[trap[0]]
            except (TypeError, IndexError, KeyError):
                task._exc = not_a_trap(task, trap)
                continue
            if handler(task, trap):
                break
        current = outer

    rt.reschedule = reschedule
    rt.current_id = current_id
    rt.flush_counters = flush_counters
    rt.set_traps = set_traps
    rt.set_phase = set_phase
    rt.get_phase = get_phase
    rt.live_nondaemon = live_nondaemon
    rt.spawn_task = spawn_task
    rt.live_tasks = live_tasks
    rt.step = step
    rt.join = join
    rt.task_class = task_class


# --------------------------------------------------------------------------
# Cancellation delivery

def build_cancellation(rt) -> None:
    """``deliver`` (at a blocking trap), ``cancel_task``, ``scope_cancelled``,
    and ``unblock``/``throw_into`` for tasks that are blocked."""
    probe = rt.probe
    trace = rt.trace
    reschedule = rt.reschedule
    dead_timer = rt.dead_timer
    current_id = rt.current_id
    level = rt.options["cancel"] == "level"
    cancelled = flavour(Cancelled, rt.options["cancel_base"])
    task_timeout = flavour(TaskTimeout, rt.options["cancel_base"])

    def unblock(task):
        kind = task._wait
        if kind == W_SLEEP:
            task._timer = None
            dead_timer()
        elif kind == W_READ or kind == W_WRITE:
            rec = task._wait_obj
            if rec[kind] is task:
                rec[kind] = None
        else:
            task._wait_obj.remove(task)
        task._wait = 0

    def throw_into(task, exc):
        # `task` is blocked: unhook it and make it ready to raise `exc`.
        unblock(task)
        task._exc = exc
        reschedule(task, None)

    def pending_exception(task):
        # The cancellation a blocking trap should raise now, or None. Task
        # cancellation first, then the outermost cancelled scope.
        c = task._cancel
        if c == 1 or c == 3 or (c == 2 and level):
            if c == 1:
                task._cancel = 2
            return cancelled("task was cancelled")
        scopes = task._scopes
        if scopes:
            for scope in scopes:
                if scope._cancel_called and (level or not scope._delivered):
                    scope._delivered = True
                    if scope._expired:
                        return task_timeout(f"timed out after {scope._seconds} s", scope)
                    return cancelled("cancel scope was cancelled", scope)
        task._pending = False
        return None

    def deliver(task):
        # At a blocking trap with _pending set: arrange a throw if there is
        # something to deliver. True -> don't block, step again.
        exc = pending_exception(task)
        if exc is None:
            return False
        task._exc = exc
        if trace is not None:
            trace.instant("cancel_delivered", task.id, exception=type(exc).__name__)
        return True

    def cancel_task(task, doom=False):
        # A request already waiting for delivery absorbs this one; after an
        # edge delivery a new request is delivered again.
        c = task._cancel
        if task._done or c == 3 or (c == 1 and not doom):
            return
        task._cancel = 3 if doom else 1
        task._pending = True
        probe.cancellations += 1
        if trace is not None:
            trace.instant("cancel", current_id(), task=task.id)
        if 0 < task._wait < W_SHIELDED:
            throw_into(task, pending_exception(task))

    def scope_cancelled(scope):
        task = scope._task
        task._pending = True
        probe.cancellations += 1
        if 0 < task._wait < W_SHIELDED:
            exc = pending_exception(task)
            if exc is not None:
                throw_into(task, exc)

    rt.deliver = deliver
    rt.cancel_task = cancel_task
    rt.scope_cancelled = scope_cancelled


# --------------------------------------------------------------------------
# The event loop

def build_loop(rt) -> None:
    """``run_loop``: run passes until ``rt.run.stop``."""
    probe = rt.probe
    trace = rt.trace
    ready = rt.ready
    ready_append = ready.append
    ready_popleft = ready.popleft
    sleeping = rt.sleeping
    heappop = heapq.heappop
    fdmap = rt.fdmap
    fdrecs = rt.fdrecs
    run = rt.run
    monotonic = rt.monotonic
    poller = rt.poller
    wait = poller.wait
    poll_modify = poller.modify
    poll_unregister = poller.unregister
    wait_timeout = _io.wait_timeout
    readable = _io.READABLE
    writable = _io.WRITABLE
    only_read = _io.READ
    poll_mask = POLL_MASK
    step = rt.step
    reschedule = rt.reschedule
    scope_cancelled = rt.scope_cancelled
    purge = rt.purge
    flush_counters = rt.flush_counters
    waker = rt.waker
    wake_rec = rt.wake_rec
    seed = rt.kernel._seed
    shuffle = random.Random(seed).shuffle if seed is not None else None
    chooser = rt.chooser
    READY = _choice.READY
    task_class = rt.task_class

    def run_loop():
        # Wait for I/O (without waiting if anything is ready), fire timers, then
        # step the batch of tasks that were ready at that moment. Tasks made
        # ready during the batch run in the next pass, after another wait.
        # With tasks ready and no fd registered there is nothing to wait for
        # (Ctrl-C sets `stop` itself), so the syscall is skipped: pure task
        # switching costs no system call.
        iterations = 0
        ready_max = probe.ready_max
        try:
            # This while loop is our event loop: every task step, I/O wake-up
            # and timer of the coro kernel happens inside one of its passes.
            while not run.stop:
                iterations += 1
                if ready:
                    events = wait(0) if fdmap else ()
                elif sleeping:
                    events = wait(wait_timeout(sleeping[0][0], monotonic()))
                else:
                    events = wait(None)
                for fd, ev in events:
                    # Wake the waiter of each ready direction (reschedule(),
                    # inline); drop interest nobody waits on any more.
                    rec = fdrecs[fd]
                    mask = rec[0]
                    drop = 0
                    # The common event, a reader's socket readable, is told in two
                    # compares where the general test is two ands and skips the
                    # writer's (an int & is not specialised on 3.11).
                    plain_read = ev == only_read and mask == 1
                    if plain_read or (mask & 1 and ev & readable):
                        waiter = rec[1]
                        if waiter is not None:
                            rec[1] = None
                            waiter._wait = 0
                            waiter._value = None
                            ready_append(waiter)
                            if trace is not None:
                                trace.instant("io_ready", 0, fd=fd, direction="read")
                                waiter._flow = trace.flow_start(0)
                        elif rec is wake_rec:
                            waker.drain()
                            continue
                        else:
                            drop = 1
                    if not plain_read and mask & 2 and ev & writable:
                        waiter = rec[2]
                        if waiter is not None:
                            rec[2] = None
                            waiter._wait = 0
                            waiter._value = None
                            ready_append(waiter)
                            if trace is not None:
                                trace.instant("io_ready", 0, fd=fd, direction="write")
                                waiter._flow = trace.flow_start(0)
                        else:
                            drop |= 2
                    if drop:
                        mask = rec[0] = mask & ~drop
                        try:
                            if mask:
                                poll_modify(fd, poll_mask[mask])
                            else:
                                del fdrecs[fd]
                                fdmap.pop(rec[3], None)
                                poll_unregister(fd)
                        except OSError:
                            # Closed behind the kernel's back (a dup kept it polled).
                            purge(rec, "the file descriptor was closed behind the "
                                       "kernel's back")
                if sleeping and sleeping[0][0] <= monotonic():
                    fire_timers()
                n = len(ready)
                if n > ready_max:
                    ready_max = n
                if shuffle is not None and n > 1:
                    batch = [ready_popleft() for _ in range(n)]
                    shuffle(batch)
                    ready.extendleft(reversed(batch))
                if chooser is not None and n > 1:
                    # the explorer picks which of the n ready now steps next
                    batch = [ready_popleft() for _ in range(n)]
                    ready.extendleft(reversed(_choice.permute(chooser.choose, READY, batch)))
                while n:
                    n -= 1
                    step(ready_popleft())
        finally:
            probe.loop_iterations += iterations
            probe.ready_max = ready_max
            flush_counters()

    def fire_timers():
        now = monotonic()
        while sleeping and sleeping[0][0] <= now:
            entry = heappop(sleeping)
            owner = entry[2]
            if owner._timer is not entry:
                run.stale -= 1
                continue
            owner._timer = None
            if trace is not None:
                trace.instant("timer", 0)
            if owner.__class__ is task_class:
                reschedule(owner, None)
            else:
                if not owner._cancel_called:
                    owner._expired = True
                    owner._cancel_called = True
                    scope_cancelled(owner)

    rt.run_loop = run_loop
