"""Always-on counters and optional trace events, shared by the three kernels.

A kernel owns one ``Probe``; every transport or socket it makes owns one
``ConnStats`` registered with it. Counters are plain attribute increments so
they can stay on in the hot paths: a benchmark measures the kernel *with* its
probe, and the probe never changes what the kernel does.

The ``Trace`` is off unless asked for (``trace=True`` kernel option). Kernels
guard each emit with ``if trace is not None`` so that, when off, tracing costs
one attribute test. Events export as Chrome trace-event JSON (Perfetto and
chrome://tracing open it): one track per task or connection, counters for
buffer sizes, flow arrows from a wake-up to the step it caused.

Names in ``snapshot()`` follow the results contract: snake_case with the unit as
suffix (``_count``, ``_bytes``). Something a kernel cannot see is absent or
``None`` -- never reported as zero.
"""
from __future__ import annotations

import time

__all__ = ["Probe", "ConnStats", "Trace"]


class ConnStats:
    """Per-connection ground truth as the kernel sees it.

    ``accepted_bytes`` is what the write API took from the application;
    ``sent_bytes`` is what send syscalls took. Their difference, while the
    connection lives, is the user-space buffer; ``peak_user_buffer_bytes`` is its
    exact maximum, updated after every write (not sampled).
    """
    __slots__ = ("name", "accepted_bytes", "sent_bytes", "received_bytes",
                 "user_buffer_bytes", "peak_user_buffer_bytes",
                 "pause_writing_count", "written_while_paused_bytes",
                 "read_pauses_count", "lost_on_abort_bytes", "lost_on_exit_bytes",
                 "writes_after_close_count", "closed")

    def __init__(self, name: str = ""):
        self.name = name
        self.accepted_bytes = 0
        self.sent_bytes = 0
        self.received_bytes = 0
        self.user_buffer_bytes = 0
        self.peak_user_buffer_bytes = 0
        self.pause_writing_count = 0
        # Bytes the application wrote while the transport had told it to pause:
        # a protocol that honours pause_writing() keeps this near one read.
        self.written_while_paused_bytes = 0
        self.read_pauses_count = 0
        self.lost_on_abort_bytes = 0
        self.lost_on_exit_bytes = 0
        self.writes_after_close_count = 0
        self.closed = False

    def snapshot(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}


class Probe:
    """Kernel-wide counters. Kernels increment the attributes directly."""
    __slots__ = ("loop_iterations", "callbacks_run", "ready_max", "task_switches",
                 "spawns", "cancellations", "connections", "trace", "exit_report")

    def __init__(self, trace: bool = False):
        self.loop_iterations = 0
        self.callbacks_run = 0
        self.ready_max = 0          # most callbacks/tasks ready at once
        self.task_switches = 0      # coroutine steps (send/throw)
        self.spawns = 0
        self.cancellations = 0
        self.connections: list[ConnStats] = []
        self.trace: Trace | None = Trace() if trace else None
        # What run(main)/stop did with leftovers, filled in by the kernel's exit
        # policy: {"policy": ..., "tasks_left_count": ..., "unsent_bytes": ...}.
        self.exit_report: dict = {}

    def new_conn(self, name: str = "") -> ConnStats:
        stats = ConnStats(name or f"conn{len(self.connections)}")
        self.connections.append(stats)
        return stats

    def snapshot(self) -> dict:
        """Totals in the results vocabulary, plus per-connection details."""
        conns = self.connections
        return {
            "loop_iterations_count": self.loop_iterations,
            "callbacks_run_count": self.callbacks_run,
            "ready_max_count": self.ready_max,
            "task_switches_count": self.task_switches,
            "spawns_count": self.spawns,
            "cancellations_count": self.cancellations,
            "connections_count": len(conns),
            "accepted_bytes": sum(c.accepted_bytes for c in conns),
            "sent_bytes": sum(c.sent_bytes for c in conns),
            "peak_user_buffer_bytes": max((c.peak_user_buffer_bytes for c in conns), default=0),
            "pause_writing_count": sum(c.pause_writing_count for c in conns),
            "written_while_paused_bytes": sum(c.written_while_paused_bytes for c in conns),
            "read_pauses_count": sum(c.read_pauses_count for c in conns),
            "lost_on_abort_bytes": sum(c.lost_on_abort_bytes for c in conns),
            "lost_on_exit_bytes": sum(c.lost_on_exit_bytes for c in conns),
            "writes_after_close_count": sum(c.writes_after_close_count for c in conns),
            "exit": dict(self.exit_report),
            "per_connection": [c.snapshot() for c in conns],
        }


class Trace:
    """Chrome trace-event recorder. Timestamps are microseconds of
    ``time.perf_counter()``; ``tid`` is a track (a task or a connection)."""

    def __init__(self):
        self.events: list[dict] = []
        self._names: dict[int, str] = {}
        self._t0 = time.perf_counter()
        self._next_flow = 0

    def _now(self) -> float:
        return (time.perf_counter() - self._t0) * 1e6

    def track(self, tid: int, name: str) -> None:
        """Name a track once (Perfetto shows it as a thread)."""
        self._names.setdefault(tid, name)

    def instant(self, name: str, tid: int = 0, **args) -> None:
        self.events.append({"name": name, "ph": "i", "s": "t", "ts": self._now(),
                            "pid": 1, "tid": tid, "args": args})

    def begin(self, name: str, tid: int = 0, **args) -> None:
        self.events.append({"name": name, "ph": "B", "ts": self._now(),
                            "pid": 1, "tid": tid, "args": args})

    def end(self, tid: int = 0) -> None:
        self.events.append({"ph": "E", "ts": self._now(), "pid": 1, "tid": tid})

    def counter(self, name: str, value: float, tid: int = 0) -> None:
        # Viewers key counter series by name (and "id"), not by track: without the
        # id every connection's buffer would merge into one line.
        self.events.append({"name": name, "ph": "C", "ts": self._now(), "pid": 1,
                            "tid": tid, "id": tid, "args": {name: value}})

    def flow_start(self, tid: int) -> int:
        """Start an arrow (at a wake-up); pass the id to ``flow_end``."""
        self._next_flow += 1
        self.events.append({"name": "wakeup", "cat": "flow", "ph": "s", "id": self._next_flow,
                            "ts": self._now(), "pid": 1, "tid": tid})
        return self._next_flow

    def flow_end(self, flow_id: int, tid: int) -> None:
        """End an arrow at the step the wake-up caused (binds to the enclosing slice)."""
        self.events.append({"name": "wakeup", "cat": "flow", "ph": "f", "bp": "e",
                            "id": flow_id, "ts": self._now(), "pid": 1, "tid": tid})

    def to_chrome(self) -> dict:
        meta = [{"name": "thread_name", "ph": "M", "pid": 1, "tid": tid,
                 "args": {"name": name}} for tid, name in self._names.items()]
        return {"traceEvents": meta + self.events, "displayTimeUnit": "ms"}
