"""The coro kernel object: ``Kernel`` (its options, ``run`` and the exit
policy's phases, ``close``), ``OPTIONS``, and ``run()``.

The kernel's runtime is made by ``_build`` from the builders in ``engine.py``
(the loop, the step, cancellation) and ``handlers.py`` (one handler per trap).
The event loop is ``engine.build_loop``'s ``run_loop``.
"""
from __future__ import annotations

import signal
import threading

from .. import io as _io
from ..options import EXIT, TRACE, Option, Schema, boolean, choice
from ..probe import Probe
from .engine import (UNTIL_EMPTY, UNTIL_MAIN, UNTIL_NONDAEMON, KernelState,
                     build_cancellation, build_loop, build_scheduler, build_timers,
                     trap_table)
from .handlers import build_io_handlers, build_task_handlers
from .traps import W_READ, _enter, _leave, running_kernel

__all__ = ["Kernel", "run", "OPTIONS"]


def _ready_order(value) -> str:
    text = str(value)
    if text == "fifo":
        return text
    prefix, _, digits = text.partition("-")
    if prefix == "random" and digits.lstrip("-").isdigit():
        return text
    raise ValueError("must be fifo or random-SEED (e.g. random-7)")
_ready_order.values = "fifo|random-SEED"


#: The coro kernel's options, declared once; defaults reproduce curio.
OPTIONS = Schema("coro", (
    Option("io_schedule_point", False, boolean,
           "every I/O call yields (trio) or only blocking ones (curio)"),
    Option("spawn", "lazy", choice("lazy", "eager"),
           "lazy: a child runs after the parent yields; eager: its first step runs in spawn"),
    Option("cancel", "edge", choice("edge", "level"),
           "edge: a cancellation is delivered once (curio); level: at every blocking "
           "trap until the task or block ends (trio)"),
    Option("ready_order", "fifo", _ready_order,
           "order of each batch of ready tasks: fifo, or shuffled by random.Random(SEED)"),
    Option("deadline_check", "when-blocked", choice("when-blocked", "at-checkpoint"),
           "when-blocked: an expired timeout is delivered by its timer, at the next "
           "blocking trap (curio); at-checkpoint: a checkpoint (sleep(0), and with "
           "io_schedule_point=true every socket call) inside an expired block raises at "
           "once (trio 1626)"),
    Option("read", "try", choice("try", "ready"),
           "after a short read, try: the next read takes data already there without "
           "yielding (curio), at the cost of a poll() per read when there is none; "
           "ready: it waits for the poller to report the socket readable, as asyncio and "
           "uvloop read only on readiness (a system call less, a yield more)"),
    Option("cancel_base", "base", choice("base", "exception"),
           "base: Cancelled/TaskTimeout derive from BaseException, so except Exception "
           "lets them pass (curio, asyncio>=3.8); exception: they are also Exceptions"),
    EXIT, TRACE,
))


class Kernel:
    """A trap kernel. Options (defaults reproduce curio; each changes one thing):

    * ``io_schedule_point`` -- False: a socket call that doesn't block never
      yields. True (trio): every socket call is a checkpoint, yielding once even
      when the syscall succeeded.
    * ``spawn`` -- "lazy": a spawned child is queued; "eager": its first step
      runs before ``spawn`` returns.
    * ``cancel`` -- "edge": each cancellation is delivered once; "level": it is
      delivered at every blocking trap while the task (or expired block) lasts.
    * ``deadline_check`` -- "when-blocked": a timeout block's deadline is
      delivered when its timer fires on a loop pass, at the task's next blocking
      trap, so a block that never waits never times out (curio). "at-checkpoint"
      (trio): a checkpoint compares the clock with the enclosing deadlines
      itself, so ``sleep(0)`` -- and every socket call with
      ``io_schedule_point=True`` -- inside an expired block raises at once,
      even if the call would not have had to wait (trio issue 1626).
    * ``read`` -- "try": a read never yields when the socket has data, even
      right after a read that emptied it (then it asks ``poll()`` first, a
      system call per read when nothing has come). "ready": after a read that
      emptied the socket, the next one waits for the loop's poller to report
      it readable, as asyncio and uvloop read only on readiness: no extra
      system call, but the task yields even if the data was already there.
    * ``ready_order`` -- "fifo", or "random-SEED": each loop pass runs its batch
      of ready tasks shuffled by ``random.Random(SEED)`` (trio-like).
    * ``exit`` -- what ``run()`` does with tasks still running when main
      returns: "cancel" them (daemons silently) and wait for them to unwind;
      "wait" for the non-daemon ones (daemons are then cancelled); "raise":
      cancel, then raise RuntimeError naming how many there were.
    * ``trace`` -- record Chrome trace events in ``probe.trace``.

    ``io`` is the I/O-and-time seam (``kernels.io``; None: the real OS). The
    options are ``OPTIONS``; a bad one raises ``OptionError``.

    ``run(main, *args)`` may be called repeatedly; ``close()`` releases the
    poller (epoll) and the wake-up pair (also via ``with``). Ctrl-C while
    ``run()`` is in the main thread cancels every task, lets them unwind and
    re-raises ``KeyboardInterrupt``; a second Ctrl-C interrupts at once.
    """

    def __init__(self, *, io=None, **options):
        self.options = options = OPTIONS.validate(options)
        order = options["ready_order"]
        self._seed = None if order == "fifo" else int(order[len("random-"):])
        self.probe = Probe(trace=options["trace"])
        self._io = _io.REAL if io is None else io
        self._running = False
        self._closed = False
        self._broken = False
        self._build()

    # -- public surface ----------------------------------------------------

    def run(self, main, *args):
        """Run ``main(*args)`` as the main task, apply the exit policy, return its
        result (or raise its exception)."""
        if self._closed:
            raise RuntimeError("this coro kernel is closed")
        if self._broken:
            raise RuntimeError("this coro kernel was interrupted inside its run loop "
                               "and can't be reused; close it and make a new one")
        if running_kernel() is not None:
            raise RuntimeError("a coro kernel is already running in this thread; "
                               "run() can't be nested (spawn a task instead)")
        checkpoint = self.options["io_schedule_point"]
        tokens = _enter(self, checkpoint)
        self._running = True
        try:
            restore = self._install_sigint()
            try:
                return self._kernel_run(main, args)
            finally:
                if restore is not None:
                    signal.signal(signal.SIGINT, restore)
        finally:
            self._running = False
            _leave(tokens, checkpoint)

    def close(self) -> None:
        """Release the poller and the wake-up socketpair. Idempotent. Sockets
        the tasks opened are theirs to close; their registrations are dropped
        (closing the epoll fd drops them all at once)."""
        if self._closed:
            return
        if self._running:
            raise RuntimeError("can't close a coro kernel from inside its own run()")
        self._closed = True
        rt = self._rt
        rt.fdmap.clear()
        rt.fdrecs.clear()
        rt.poller.close()
        rt.waker.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def _install_sigint(self):
        """Route Ctrl-C through the loop (only from the main thread, and only if
        nobody else installed a handler). Returns the handler to restore."""
        if threading.current_thread() is not threading.main_thread():
            return None
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            return None
        signal.signal(signal.SIGINT, self._on_sigint)
        return signal.default_int_handler

    def _build(self):
        """Make the runtime: the closures of ``engine`` and ``handlers`` over one
        ``KernelState``, in dependency order, and the trap table by name."""
        rt = self._rt = KernelState(self, self._io)
        waker = rt.waker
        fd = waker.fileno()
        rt.wake_rec = [W_READ, None, None, waker, fd]
        try:
            rt.poller.register(fd, _io.READ)
        except BaseException:
            waker.close()
            rt.poller.close()
            raise
        rt.fdrecs[fd] = rt.wake_rec
        if rt.trace is not None:
            rt.trace.track(0, "kernel")
        build_timers(rt)
        build_scheduler(rt)
        build_cancellation(rt)
        handlers = build_io_handlers(rt)
        rt.purge = handlers.pop("purge")
        handlers.update(build_task_handlers(rt))
        rt.set_traps(trap_table(handlers))
        build_loop(rt)
        # The synchronous entry points of traps.py call these.
        self._reschedule = rt.reschedule
        self._spawn = rt.spawn_task
        self._join = rt.join
        self._cancel_task = rt.cancel_task
        self._scope_cancelled = rt.scope_cancelled

    def _kernel_run(self, fn, args):
        """run(): the phases. Run until main ends; with exit="wait" until the
        non-daemon tasks end; then cancel what is left and run until it is gone."""
        rt = self._rt
        run = rt.run
        exit_policy = self.options["exit"]
        rt.set_phase(UNTIL_MAIN)
        run.stop = False
        run.interrupt = None
        main_task = rt.spawn_task(fn, args, False, None)   # queued: no task is current
        rt.set_phase(UNTIL_MAIN, main_task)
        try:
            rt.run_loop()
            alive = rt.live_tasks()
            leftovers = [t for t in alive if not t.daemon and t is not main_task]
            report = {"policy": exit_policy, "tasks_left_count": len(leftovers),
                      "daemon_tasks_left_count": sum(t.daemon for t in alive),
                      "unsent_bytes": 0}
            if run.interrupt is None and exit_policy == "wait" and leftovers \
                    and main_task._exception is None:
                rt.set_phase(UNTIL_NONDAEMON)
                run.stop = not rt.live_nondaemon()
                rt.run_loop()
            alive = rt.live_tasks()
            if alive:
                rt.set_phase(UNTIL_EMPTY)
                run.stop = False
                for task in reversed(alive):
                    rt.cancel_task(task, doom=True)
                rt.run_loop()
            if run.interrupt is not None:
                report["interrupted"] = type(run.interrupt).__name__
            self.probe.exit_report = report
        except BaseException:
            self._broken = True
            raise
        finally:
            main = main_task
            rt.set_phase(UNTIL_MAIN, None)
        if run.interrupt is not None:
            exc, run.interrupt = run.interrupt, None
            raise exc
        if main._exception is not None:
            raise main._exception
        if exit_policy == "raise" and report["tasks_left_count"]:
            raise RuntimeError(
                f"main returned with {report['tasks_left_count']} task(s) still running; "
                "they were cancelled (exit='raise')")
        return main._result

    def _on_sigint(self, signum, frame):
        # First Ctrl-C: ask the loop to cancel everything and unwind (wake it
        # if it is blocked in select). Second: the user means it.
        run = self._rt.run
        if isinstance(run.interrupt, KeyboardInterrupt):
            raise KeyboardInterrupt
        run.interrupt = KeyboardInterrupt()
        if self._rt.get_phase() != UNTIL_EMPTY:
            run.stop = True
        self._rt.waker.wake()


def run(main, *args, **options):
    """``Kernel(**options).run(main, *args)``, closing the kernel afterwards."""
    with Kernel(**options) as kernel:
        return kernel.run(main, *args)
