"""selectkernel: a small select-loop Future/Task kernel, registered with looplab
from outside the package as the runtime ``selectkernel`` (style ``stream``).

Importing this module registers the runtime, which is what
``--runtime-module examples.selectkernel``, ``LOOPLAB_RUNTIME_MODULES`` and the
pytest plugin's ``--looplab-runtime-module`` do. The kernel itself
(``kernel``, ``streams``, ``port``) is standard library only; only this file
knows about looplab. See README.md in this folder.
"""
from __future__ import annotations

from kernels.options import Option, Schema, choice
from protocols.fingerprint import Fingerprint, Near, Positive
from bench.runtimes import RUNTIMES, Difference, RuntimeInfo, Tracing, register

__all__ = ["OPTIONS", "INFO", "RUNTIME_ID"]

RUNTIME_ID = "selectkernel"


def _seconds(value) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError("must be a number of seconds (e.g. 2.5)") from None
    if isinstance(value, bool) or not 0 <= seconds < float("inf"):
        raise ValueError("must be a finite number of seconds >= 0")
    return seconds
_seconds.values = "seconds"

OPTIONS = Schema(RUNTIME_ID, (
    Option("exit", "flush", choice("flush", "cancel", "raise"),
           "when main returns: flush sends what is buffered (up to linger_s) before closing; "
           "cancel drops it as asyncio.run does; raise fails the run if anything was left"),
    Option("linger_s", 10.0, _seconds, "how long exit=flush may take before it drops the rest"),
))

# Measured with `looplab run --scenarios S4` (see README.md): asyncio's row except
# that a close with nothing buffered has closed the socket when close() returns.
FINGERPRINT = Fingerprint({
    "child_ran_before_spawn_returned": False,            # create_task only schedules
    "child_first_after_yield_fraction": Near(1.0, 0.1),  # one FIFO ready queue
    "user_buffered_after_write_bytes": Positive(),       # write() keeps what send() refused
    "closed_when_close_returned": True,                  # causal close (empty buffer)
    "closed_after_one_yield": True,
    "other_tasks_during_nonblocking_sends_count": None,  # write() never yields
    "cancel_semantics": "edge",
    "error_surface": "at the call",                      # drain() raises
}, {}, frozenset({"exit", "linger_s"}))

DIFFERENCES = {
    "write_after_close": Difference(
        "empty: dropped; buffered: dropped; counted 2",
        "close() is the last word: a write after it is dropped and counted even while "
        "earlier bytes are still being sent (asyncio sends it: asyncio issue 248)"),
}

INFO = RuntimeInfo(
    RUNTIME_ID, "stream", "examples.selectkernel.port:SelectPort", OPTIONS,
    compared_with=("asyncio-streams",), requires=("selectors",),
    fingerprint=FINGERPRINT, differences=DIFFERENCES,
    # looplab trace: a traced twin of the port (tracing.py); the fidelity probes reach
    # it through its port (no probe_side), as a stream port has asyncio's names
    tracing=Tracing(port="examples.selectkernel.tracing:TracedSelectPort",
                    hook="a Task subclass that records each step"),
    summary="a user's select-loop Future/Task kernel: drain() waits for an empty buffer, "
            "pull-based reads, exit flushes")

# Registering twice (a module re-imported under pytest, say) is harmless; a
# different runtime already holding the id is the registry's clash error.
if RUNTIMES.get(RUNTIME_ID) is None or RUNTIMES[RUNTIME_ID].port != INFO.port:
    INFO = register(INFO)
