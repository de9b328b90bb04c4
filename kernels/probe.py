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

Perfetto keeps an arrow only where both of its ends sit inside a slice on their
track. A wake-up recorded by the kernel itself (an I/O event, a timer, a plain
callback) happens outside any task step, so the export (``bind_flows``) gives
it a short slice there; the recording stays as cheap as before.

Names in ``snapshot()`` follow the results contract: snake_case with the unit as
suffix (``_count``, ``_bytes``). Something a kernel cannot see is absent or
``None`` -- never reported as zero.
"""
from __future__ import annotations

import time

__all__ = ["Probe", "ConnStats", "Trace", "bind_flows"]


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
    """Kernel-wide counters. Kernels increment the attributes directly; the
    per-pass ones (passes, callbacks, task steps) may be kept in the loop's
    locals and added when the loop stops, so read from a running callback or
    task they lag."""
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
        return {"traceEvents": meta + bind_flows(self.events), "displayTimeUnit": "ms"}


# Half the width of a wake-up slice made for a flow that has none, in ns; less
# where a neighbouring event on the track is closer, so slices never overlap.
WAKE_HALF_NS = 1000
# A flow this close after the end of the slice made for the previous wake-up on
# the same track (or after the instant that announced it) extends that slice: a
# burst of wake-ups from one poll becomes one slice, not a comb of them.
STRETCH_NS = 20_000


def _binds_in_place(ev: dict) -> bool:
    """Flow events that Perfetto attaches to the slice open on their track at
    their timestamp (an "f" without ``"bp": "e"`` waits for the next slice)."""
    ph = ev["ph"]
    return ph == "s" or ph == "t" or (ph == "f" and ev.get("bp") == "e")


def bind_flows(events: list[dict]) -> list[dict]:
    """The events as exported: timestamps on a whole-nanosecond grid, and every
    flow start or step (and every "f" with ``"bp": "e"``) inside a slice on its
    own track, as Perfetto's JSON importer needs to keep the arrow.

    A flow event already inside a step (a ``B``/``E`` pair) is left alone. One
    outside any slice gets one: the instant just before it on the same track,
    with nothing else in between (``io_ready``, ``spawn``, ``timer``) and at
    most ``STRETCH_NS`` before it, is stretched into a slice that ends just
    after the flow; otherwise a ``wake-up`` slice is made around it. Either is at most ``WAKE_HALF_NS`` past
    the flow and stops halfway to the track's neighbouring events. The recorded
    list is not changed.
    """
    out, ns = [], []
    for ev in events:
        ev = dict(ev)
        if "ts" in ev:
            ns.append(round(ev["ts"] * 1000))
            ev["ts"] = ns[-1] / 1000
        else:
            ns.append(None)
        out.append(ev)
    # Per track, the positions of events that take part in slices (counters
    # and metadata do not), in recording order, which is time order.
    tracks: dict[tuple, list[int]] = {}
    for i, ev in enumerate(out):
        if ev["ph"] not in ("M", "C") and ns[i] is not None:
            tracks.setdefault((ev.get("pid"), ev.get("tid")), []).append(i)
    made: dict[int, dict] = {}            # position -> slice to put before it
    for idxs in tracks.values():
        depth = 0
        stretch = None                    # (event, its ns) a following flow may extend
        for k, i in enumerate(idxs):
            ev, t = out[i], ns[i]
            ph = ev["ph"]
            if ph == "B":
                depth += 1
                stretch = None
            elif ph == "E":
                depth = max(depth - 1, 0)
                stretch = None
            elif ph == "X":
                stretch = None
            elif ph in ("i", "I"):
                stretch = (ev, t) if depth == 0 and ev.get("s", "t") == "t" else None
            elif _binds_in_place(ev) and depth == 0:
                nxt = ns[idxs[k + 1]] if k + 1 < len(idxs) else None
                tail = WAKE_HALF_NS if nxt is None else min(WAKE_HALF_NS, (nxt - t) // 2)
                if stretch is not None:
                    sl, start = stretch
                    if t - (start + round(sl.get("dur", 0) * 1000)) > STRETCH_NS:
                        stretch = None
                if stretch is None:
                    prev = ns[idxs[k - 1]] if k else None
                    head = WAKE_HALF_NS if prev is None else min(WAKE_HALF_NS, (t - prev) // 2)
                    sl = {"name": "wake-up", "ph": "X", "ts": (t - head) / 1000, "dur": 0,
                          "pid": ev.get("pid"), "tid": ev.get("tid"), "args": {}}
                    made[i] = sl
                    stretch = (sl, t - head)
                sl, start = stretch
                if sl["ph"] != "X":       # the instant becomes the wake-up's slice
                    sl["ph"] = "X"
                    sl.pop("s", None)
                sl["dur"] = (t + tail - start) / 1000
    if not made:
        return out
    merged = []
    for i, ev in enumerate(out):
        if i in made:
            merged.append(made[i])
        merged.append(ev)
    return merged
