"""The nine built-in runtimes, registered the way any third-party runtime is.

Three are looplab's own kernels (callback, hybrid, coro), each driven through
the port of the style it implements; six are the reference libraries they are
compared with, driven through ports that measure them from public APIs only.
Every fact about a runtime is here, in its one ``RuntimeInfo``: options, the
references its defaults reproduce, the library it needs, its declared S4
fingerprint (measured on the reference libraries: Python 3.11, uvloop 0.23, trio
0.35, curio 1.6, Linux loopback), where it deliberately differs from its style's
port contract and from its primary reference at the fidelity probes (with the
value it shows there), the adapter the fidelity probes reach it through, how it is
traced and whether it runs on the simulated network. This is the one module that
spells runtime ids (tests/test_structure.py checks it); everything else asks the
registry. Importing the package ``protocols`` imports this module.
"""
from __future__ import annotations

from dataclasses import replace

import kernels.callback
from kernels import choice as _ch
import kernels.coro
import kernels.hybrid
from kernels.options import Option, Schema, boolean
from protocols.fingerprint import NONBLOCKING_SENDS, Between, Fingerprint, Near, Positive
from bench.runtimes import (FLOOR, Difference, PerformanceGoal, ProbeDifference, RuntimeInfo,
                            Tracing, register, register_loop_alias, register_loop_kernel)

# ---------------------------------------------------------------------------
# Option schemas: each of our kernels declares its own, once (``kernels.X.OPTIONS``);
# the reference libraries have one port option.

def reference_options(runtime_id: str) -> Schema:
    return Schema(runtime_id, (Option("instrument", True, boolean,
                                      "measure write buffers through a transport proxy (off for benchmarks)"),))


def _loop_name(value) -> str:
    """``asyncio``, ``uvloop``, ``rloop``, ``looplab`` or ``MODULE:FACTORY``. A bare
    name that is no known loop is a mistake (a typo), never a library to look for."""
    text = str(value).strip()
    module, sep, attr = text.partition(":")
    names = module.split(".") + (attr.split(".") if sep else [])
    if not text or not all(n.isidentifier() for n in names):
        raise ValueError("give a loop name (asyncio, uvloop, rloop, looplab) or MODULE:FACTORY")
    if not sep:
        from protocols.asyncio_ports import LOOPS, UNOBTAINABLE
        known = [*LOOPS, *UNOBTAINABLE]
        if text not in known:
            import difflib
            near = difflib.get_close_matches(text, known, n=1)
            raise ValueError(f"unknown loop {text!r}" + (f" (did you mean {near[0]}?)" if near else "")
                             + f"; give a known loop ({', '.join(LOOPS)}) or MODULE:FACTORY")
    return text


_loop_name.values = "asyncio|uvloop|rloop|looplab|MODULE:FACTORY"


def asyncio_options(runtime_id: str, loop: bool = True) -> Schema:
    """asyncio's ports: the reference option, eager tasks, and (unless the runtime
    is one loop, as uvloop-*) which loop runs them (``protocols.asyncio_ports.LOOPS``)."""
    extra = [Option("eager", False, boolean,
                    "start tasks eagerly (asyncio.eager_task_factory; Python 3.12+)")]
    if loop:
        extra.insert(0, Option("loop", "asyncio", _loop_name,
                               "the event loop: a known name or MODULE:FACTORY importable in "
                               "the cell's interpreter; loop.NAME=VALUE passes keyword arguments"))
    return reference_options(runtime_id).extend(runtime_id, extra)


# ---------------------------------------------------------------------------
# Declared S4 fingerprints (see protocols.fingerprint for the vocabulary).

_ASYNCIO_PROTOCOL = {
    "child_ran_before_spawn_returned": False,
    "child_first_after_yield_fraction": Near(1.0, 0.1),     # call_soon is FIFO
    "user_buffered_after_write_bytes": Positive(),          # ~869,036
    "closed_when_close_returned": False,
    "closed_after_one_yield": True,
    "other_tasks_during_nonblocking_sends_count": None,     # no tasks on this port
    "cancel_semantics": None,                               # no tasks on this port
    "error_surface": "in a callback",                       # connection_lost(exc)
}
_ASYNCIO_STREAMS = {
    **_ASYNCIO_PROTOCOL,
    "cancel_semantics": "edge",
    "error_surface": "at the call",                         # drain() raises
}
_CURIO = {
    "child_ran_before_spawn_returned": False,               # curio issue 164: docs said yes
    "child_first_after_yield_fraction": Near(1.0, 0.1),
    "user_buffered_after_write_bytes": None,                # sendall blocks
    "closed_when_close_returned": True,
    "closed_after_one_yield": True,
    "other_tasks_during_nonblocking_sends_count": 0,
    "cancel_semantics": "edge",
    "error_surface": "at the call",
}
_EVERY_SEND_YIELDS = Near(NONBLOCKING_SENDS, 0.05 * NONBLOCKING_SENDS)
_TRIO = {
    **_CURIO,
    "child_first_after_yield_fraction": Between(0.2, 0.8),  # randomized batches (~0.41)
    "other_tasks_during_nonblocking_sends_count": _EVERY_SEND_YIELDS,   # ~1999
    "cancel_semantics": "level",
}

# Version- and design-dependent options whose flip no S4 metric can see: their S4 flip
# is declared empty (the row must stay the same), and the edge probe that does see it
# is declared in the runtime's probe_flips. The default follows the installed reference (wait_for:
# a new Task on Python 3.11, inline from 3.12), so the flip is the other value.
_WAIT_FOR_FLIP = ("wait_for=inline" if kernels.hybrid.OPTIONS.defaults()["wait_for"] == "task"
                  else "wait_for=task")

# {option flip: {fidelity probe: {observation key: value when flipped}}} (probe_flips).
# tests/test_fingerprints.py runs each probe with and without the flip and checks that
# exactly these keys take these values only when flipped.
_HYBRID_FLIPS = {
    _WAIT_FOR_FLIP: {"tk_wait_for_runs_in_new_task": {
        "same_task": _WAIT_FOR_FLIP == "wait_for=inline"}},
}
_CORO_FLIPS = {
    "cancel_base=exception": {
        "co_timeout_except_exception": {"caught_by_except_Exception": True,
                                        "block_ended": "normally"},
        "co_timeout_exception_bases": {"at_await": "Exception", "out_of_block": "Exception"},
        "co_cancel_exception_base": {"base": "Exception"},
    },
}

# ---------------------------------------------------------------------------
# Declared fidelity differences from the primary reference (bench.fidelity's probes),
# each with what our kernel shows there: a change on the probe is caught again.

_CALLBACK_PROBE_DIFFERENCES = {
    "cb_write_after_completed_buffered_close": ProbeDifference(
        {"raised": None},
        "asyncio bug: after a buffered close completes, write() calls send() on the dropped "
        "socket (None) and raises AttributeError; ours drops the write as after any close"),
}
_CORO_PROBE_DIFFERENCES = {
    "co_event_wake_order": ProbeDifference(
        {"fifo": True},
        "arbitrary order in curio: its Event keeps waiters in a set (curio/sched.py "
        "SchedBarrier), so set() wakes them in hash order, which varies from run to run; "
        "ours wakes them FIFO, as asyncio's Event does"),
    "co_send_after_close": ProbeDifference(
        {"recv": "ClosedResourceError", "send": "ClosedResourceError"},
        "curio's Socket has no closed state: after close() a call reaches the closed "
        "stdlib socket and fails with OSError (EBADF); ours raises ClosedResourceError, "
        "as trio does (the same difference is declared in curio's port conformance)"),
}

# ---------------------------------------------------------------------------
# Performance goals (``looplab bench goals``). The kernel goals are judged on
# instructions per echo request or per operation under callgrind, which a fixed binary
# repeats whatever the machine's load: the CPU goals against uvloop and spawn+join
# against curio sat inside their run-to-run spread on 2 shared cores (#27). Their CPU
# ratios are still measured and shown beside, as information. The timed goals kept
# (coro against curio and trio, hybrid against asyncio's streams, yields and
# ping-pong) settle there: their margins are wider than the spread.

_ECHO, _RATE, _CPU, _OPS = "echo 1 KiB x 10 conns", "req/s", "server CPU/req", "ops/s"
_INSTR, _PER_REQUEST = "instructions", "instructions per echo request"
_RLOOP_PROTOCOL, _RLOOP_STREAMS = "asyncio-protocol:loop=rloop", "asyncio-streams:loop=rloop"
# The callback kernel also serves as an asyncio loop (loop=looplab): its goals as one
# are declared here, on the runtime whose kernel it is.
_CALLBACK_GOALS = (PerformanceGoal("echo", "uvloop-protocol", 1.6, _PER_REQUEST, _INSTR,
                                   beside=(_RLOOP_PROTOCOL,)),
                   PerformanceGoal("echo", "uvloop-streams", 1.2, _PER_REQUEST, _INSTR,
                                   subject="asyncio-streams:loop=looplab"),
                   PerformanceGoal("echo", "uvloop-protocol", 1.6, _PER_REQUEST, _INSTR,
                                   subject="asyncio-protocol:loop=looplab"))
_HYBRID_GOALS = (PerformanceGoal("echo", "asyncio-streams", 1.0, _ECHO, _RATE),)
_CORO_GOALS = (PerformanceGoal("echo", "uvloop-streams", 0.85, _PER_REQUEST, _INSTR,
                               beside=(_RLOOP_STREAMS,)),
               PerformanceGoal("spawn_join", FLOOR, 1.8, "instructions per spawn+join", _INSTR,
                               beside=("curio",)),
               PerformanceGoal("echo", "curio", 1.25, _ECHO, _CPU),
               PerformanceGoal("echo", "trio", 2.0, _ECHO, _CPU),
               PerformanceGoal("yield", "curio", 2.0, "yields/s", _OPS),
               PerformanceGoal("pingpong", "curio", 1.1, "ping-pong round trips/s", _OPS))

# ---------------------------------------------------------------------------
# The fidelity probes' adapters (one per runtime) and how ``looplab trace`` sees each.

_SIDES = "bench.fidelity"
_OWN_TRACE = Tracing(option="trace=true")
_TASK_FACTORY = "a task factory"
_NO_CALLBACK_HOOK = Tracing(refused="its code runs in Protocol callbacks, which no public "
                                    "asyncio hook reports")

# Options declared to touch no S4 metric, whatever their value.
# The edge options that bring back one version's bug from the zoo (bench/zoo/) act
# only after close(), on set_write_buffer_limits(), writelines(), a lost connection, a
# second drainer or a server's shutdown: nothing the S4 program does.
_NEUTRAL = frozenset({"exit", "trace", "instrument", "loop", "high_water", "low_water", "write", "drain",
                      "write_after_close", "limits_recheck", "writelines", "buffer_on_loss", "write_buffer",
                      "wait_closed", "drain_on_closing", "drain_waiters", "deadline_check"})
_REFERENCE = dict(neutral=_NEUTRAL)

# ---------------------------------------------------------------------------
# Declared conformance differences (keys are the conformance suite's; the
# contract itself is in protocols.conformance.contract).

_RESET_IS_OS_ERROR = {
    "reset_send": Difference("send_all raises ConnectionError; then receive_some returns b''",
                             "a reset surfaces as the OS error itself (curio's choice); "
                             "it is still a port.StreamError"),
    "reset_receive": Difference("receive_some raises ConnectionError",
                                "a reset surfaces as the OS error itself (curio's choice); "
                                "it is still a port.StreamError"),
}
_CURIO_DIFFERENCES = {
    **_RESET_IS_OS_ERROR,
    "close_while_receiving": Difference(
        "hangs", "Socket.close() releases only the closing task's own I/O wait: a task blocked "
                 "on the socket is never woken until cancelled"),
    "close_while_sending": Difference(
        "hangs", "Socket.close() releases only the closing task's own I/O wait: a task blocked "
                 "on the socket is never woken until cancelled"),
    "use_after_close": Difference(
        "send_all: OSError; receive_some: OSError",
        "no closed state: the calls reach the closed stdlib socket (EBADF)"),
    "send_after_eof": Difference("BrokenPipeError", "EPIPE from send after SHUT_WR, unwrapped"),
    "not_stream_errors": Difference(
        "use_after_close.receive_some: OSError, use_after_close.send_all: OSError",
        "the EBADF errors after close are plain OSError, outside port.StreamError"),
    "concurrent_receive": Difference(
        "ReadResourceBusy; first intact",
        "no stream-level busy check: the kernel's one-waiter-per-fd rule trips instead"),
    "concurrent_send": Difference(
        "WriteResourceBusy; first intact",
        "no stream-level busy check: the kernel's one-waiter-per-fd rule trips, and only "
        "when the second send must wait"),
    "child_error": Difference(
        "swallowed; sibling cancelled",
        "curio's TaskGroup cancels the others when a child crashes, but join() returns "
        "normally (the error is only on tg.exception), so it never leaves the block"),
}

# The simulated network (kernels.simnet): our kernels reach it through the
# I/O-and-time seam, asyncio, trio and curio through protocols.simports.
SIM = dict(real_network_only=None)
_UVLOOP_REAL_ONLY = dict(real_network_only="uvloop polls real file descriptors in C (libuv), "
                                           "where no Python object can stand in for them")

_P = "protocols.ports"
_TR = "bench.fidelity.tracing"
_AIO = "protocols.asyncio_ports"
_TC = "protocols.trio_curio_ports"

# The legality model of schedule exploration (docs/explore.md has the sources):
# asyncio promises call_soon FIFO, not the order of readiness across file descriptors,
# and calls timers due at the same time in an undefined order (call_later's docs); our
# callback kernel promises equal deadlines in scheduling order (kernels/callback/loop.py);
# coro's batch order is a design option (ready_order); trio randomizes each batch by
# design, so the chooser draws it (protocols.simports._trio_batch_order); curio promises
# a FIFO ready queue but not the order of one select's events (SimSelector orders them).
_ASYNCIO_CHOICES = frozenset({_ch.IO_ORDER, _ch.IO_DEFER, _ch.TIMER_TIE})
_OURS_CALLBACK_CHOICES = dict(schedule_choices=frozenset({_ch.IO_ORDER, _ch.IO_DEFER}),
                              portable_choices=frozenset({_ch.READY, _ch.TIMER_TIE}))

for _info in (
    RuntimeInfo("callback", "callback", f"{_P}:OurCallbackPort", kernels.callback.OPTIONS,
                ours=True, requires=("kernels.callback",),
                compared_with=("asyncio-protocol", "uvloop-protocol"),
                fingerprint=Fingerprint(_ASYNCIO_PROTOCOL, {}, _NEUTRAL),
                probe_side=f"{_SIDES}.callback:OurCallbackSide", tracing=_OWN_TRACE,
                probe_differences=_CALLBACK_PROBE_DIFFERENCES, goals=_CALLBACK_GOALS,
                **_OURS_CALLBACK_CHOICES,
                summary="our reactor, Protocol/Transport", **SIM),
    RuntimeInfo("hybrid", "stream", f"{_P}:HybridPort", kernels.hybrid.OPTIONS,
                ours=True, requires=("kernels.hybrid",),
                compared_with=("asyncio-streams", "uvloop-streams"),
                fingerprint=Fingerprint(_ASYNCIO_STREAMS, {
                    "spawn=eager": {"child_ran_before_spawn_returned": True},
                    "drain=empty": {},
                    "write=defer": {},
                    _WAIT_FOR_FLIP: {},                     # seen by probe_flips instead
                }, _NEUTRAL),
                probe_side=f"{_SIDES}.streams:HybridSide", tracing=_OWN_TRACE,
                probe_flips=_HYBRID_FLIPS, goals=_HYBRID_GOALS, **_OURS_CALLBACK_CHOICES,
                summary="our Futures/Tasks/streams on the reactor", **SIM),
    RuntimeInfo("coro", "task", f"{_P}:CoroPort", kernels.coro.OPTIONS,
                ours=True, requires=("kernels.coro",),
                compared_with=("curio", "trio"),
                fingerprint=Fingerprint(_CURIO, {
                    "io_schedule_point=true": {
                        "other_tasks_during_nonblocking_sends_count": _EVERY_SEND_YIELDS},
                    "ready_order=random-*": {"child_first_after_yield_fraction": Between(0.2, 0.8)},
                    "cancel=level": {"cancel_semantics": "level"},
                    "spawn=eager": {"child_ran_before_spawn_returned": True},
                    "read=ready": {},       # a yield more after a short read; no S4 metric moves
                    "cancel_base=exception": {},            # seen by probe_flips instead
                }, _NEUTRAL),
                differences=_RESET_IS_OS_ERROR,
                probe_side=f"{_SIDES}.coro:CoroSide", tracing=_OWN_TRACE,
                probe_differences=_CORO_PROBE_DIFFERENCES, probe_flips=_CORO_FLIPS,
                goals=_CORO_GOALS, schedule_choices=frozenset({_ch.READY}),
                summary="our trap kernel, send_all blocks", **SIM),
    RuntimeInfo("asyncio-protocol", "callback", f"{_AIO}:AsyncioCallbackPort",
                asyncio_options("asyncio-protocol"), requires=("asyncio",),
                fingerprint=Fingerprint(_ASYNCIO_PROTOCOL, **_REFERENCE),
                library="python", probe_side=f"{_SIDES}.callback:AsyncioCallbackSide",
                tracing=_NO_CALLBACK_HOOK, schedule_choices=_ASYNCIO_CHOICES,
                summary="stdlib asyncio, Protocol/Transport", **SIM),
    RuntimeInfo("asyncio-streams", "stream", f"{_AIO}:AsyncioStreamPort",
                asyncio_options("asyncio-streams"), requires=("asyncio",),
                fingerprint=Fingerprint(_ASYNCIO_STREAMS, **_REFERENCE),
                library="python", probe_side=f"{_SIDES}.streams:AsyncioStreamSide",
                tracing=Tracing(port=f"{_TR}:TracedAsyncioStreamPort", hook=_TASK_FACTORY),
                schedule_choices=_ASYNCIO_CHOICES,
                summary="stdlib asyncio, StreamReader/StreamWriter", **SIM),
    # uvloop is not in the published S4 table: its rows were measured here and agree with asyncio's.
    RuntimeInfo("uvloop-protocol", "callback", f"{_AIO}:UvloopCallbackPort",
                asyncio_options("uvloop-protocol", loop=False), requires=("uvloop",),
                fingerprint=Fingerprint(_ASYNCIO_PROTOCOL, **_REFERENCE),
                differences={"reset": Difference(
                    "connection_lost(ConnectionError); write after: no error; "
                    "once it returned: RuntimeError",
                    "uvloop closes its transport once connection_lost returned, and its "
                    "write() raises RuntimeError where asyncio drops the bytes (uvloop 0.23; "
                    "the same as uvloop-streams)")},
                library="uvloop", probe_side=f"{_SIDES}.callback:UvloopCallbackSide",
                tracing=_NO_CALLBACK_HOOK,
                summary="uvloop, Protocol/Transport", **_UVLOOP_REAL_ONLY),
    RuntimeInfo("uvloop-streams", "stream", f"{_AIO}:UvloopStreamPort",
                asyncio_options("uvloop-streams", loop=False), requires=("uvloop",),
                fingerprint=Fingerprint(_ASYNCIO_STREAMS, **_REFERENCE),
                differences={"reset": Difference(
                    "drain raises ConnectionError; then read raises ConnectionError; "
                    "write after: RuntimeError",
                    "uvloop's transport is closed once the reset surfaces, and its write() "
                    "raises RuntimeError where asyncio drops the bytes (uvloop 0.23)")},
                library="uvloop", probe_side=f"{_SIDES}.streams:UvloopStreamSide",
                tracing=Tracing(port=f"{_TR}:TracedUvloopStreamPort", hook=_TASK_FACTORY),
                summary="uvloop, asyncio streams", **_UVLOOP_REAL_ONLY),
    RuntimeInfo("curio", "task", f"{_TC}:CurioPort", reference_options("curio"),
                requires=("curio",), fingerprint=Fingerprint(_CURIO, **_REFERENCE),
                differences=_CURIO_DIFFERENCES,
                library="curio", probe_side=f"{_SIDES}.coro:CurioSide",
                tasks=f"{_TC}:curio_tasks",
                tracing=Tracing(refused="its public hooks (curio's Activation) are fixed when "
                                        "the port makes its kernel"),
                schedule_choices=frozenset({_ch.IO_ORDER}),
                summary="curio, recv/sendall through a thin Stream shim", **SIM),
    RuntimeInfo("trio", "task", f"{_TC}:TrioPort", reference_options("trio"),
                requires=("trio",), fingerprint=Fingerprint(_TRIO, **_REFERENCE),
                library="trio", probe_side=f"{_SIDES}.coro:TrioSide",
                tasks=f"{_TC}:trio_tasks",
                tracing=Tracing(port=f"{_TR}:TracedTrioPort", hook="trio.abc.Instrument"),
                schedule_choices=frozenset({_ch.READY}),
                summary="trio, SocketStream", **SIM),
):
    register(replace(_info, origin="builtin"))

# uvloop's two runtimes are asyncio's ports on uvloop's loop, kept under their own ids
# so one configuration has one spec (and earlier results keep their keys).
register_loop_alias("asyncio-protocol", "uvloop", "uvloop-protocol")
register_loop_alias("asyncio-streams", "uvloop", "uvloop-streams")
# looplab's loop is the callback kernel (kernels.callback.new_event_loop): its loop.NAME
# options are callback's options, and flip the declared S4 row as they do there.
register_loop_kernel("looplab", "callback")
