"""``looplab trace``: Chrome trace-event JSON of one cell, as Perfetto reads it.

Perfetto's importer keeps a flow arrow only where its ends bind to slices, and its
trace processor is a binary these machines cannot fetch. So ``unbound_flows``
below applies the binding rule itself, to every flow of every trace: a flow start
or step, and a flow end with ``"bp": "e"``, must lie inside a slice (``X``, or a
``B``/``E`` pair) on the same (pid, tid) track -- ``ts <= flow.ts <= ts + dur``;
a flow end without ``"bp": "e"`` binds to the next slice starting at or after it.
Timestamps are compared in whole nanoseconds, as Perfetto stores them.
"""
from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest

from kernels.probe import Trace, bind_flows

LOOPLAB = [sys.executable, "-m", "bench"]


# ---------------------------------------------------------------------------
# The rule, written here independently of the export that must satisfy it

def _ns(ts) -> int:
    return round(ts * 1000)


def slices_by_track(events) -> dict:
    """(pid, tid) -> [(start_ns, end_ns)]: X events and matched B/E pairs (a B
    never ended stays open to the end of the trace)."""
    out: dict = {}
    open_: dict = {}
    for e in events:
        key = (e.get("pid"), e.get("tid"))
        if e["ph"] == "X":
            out.setdefault(key, []).append((_ns(e["ts"]), _ns(e["ts"]) + _ns(e.get("dur", 0))))
        elif e["ph"] == "B":
            open_.setdefault(key, []).append(_ns(e["ts"]))
        elif e["ph"] == "E" and open_.get(key):
            out.setdefault(key, []).append((open_[key].pop(), _ns(e["ts"])))
    for key, starts in open_.items():
        out.setdefault(key, []).extend((s, float("inf")) for s in starts)
    return out


def unbound_flows(events) -> list[dict]:
    """Every flow event that Perfetto would drop (or bind to the wrong slice)."""
    slices = slices_by_track(events)
    bad = []
    for e in events:
        if e["ph"] not in ("s", "t", "f"):
            continue
        here = slices.get((e.get("pid"), e.get("tid")), [])
        t = _ns(e["ts"])
        if e["ph"] == "f" and e.get("bp") != "e":
            ok = any(start >= t for start, _ in here)
        else:
            ok = any(start <= t <= end for start, end in here)
        if not ok:
            bad.append(e)
    return bad


def misnested(events) -> list[tuple]:
    """Slices on one track that overlap without nesting (Perfetto truncates them)."""
    bad = []
    for key, spans in slices_by_track(events).items():
        spans = sorted(spans, key=lambda s: (s[0], -s[1]))
        stack: list = []
        for start, end in spans:
            while stack and stack[-1][1] <= start:
                stack.pop()
            if stack and end > stack[-1][1]:
                bad.append((key, stack[-1], (start, end)))
            stack.append((start, end))
    return bad


def flow_report(events) -> dict:
    starts = [e for e in events if e["ph"] == "s"]
    ends = [e for e in events if e["ph"] == "f"]
    bad = unbound_flows(events)
    return {"starts": len(starts), "ends": len(ends),
            "unbound_starts": sum(e["ph"] == "s" for e in bad),
            "unbound_ends": sum(e["ph"] == "f" for e in bad),
            "arrows": len({e["id"] for e in starts} & {e["id"] for e in ends})}


# ---------------------------------------------------------------------------
# The rule itself can fail

def test_the_rule_accepts_flows_inside_slices_and_refuses_others():
    step = [{"name": "step", "ph": "B", "ts": 10.0, "pid": 1, "tid": 2},
            {"name": "w", "ph": "f", "bp": "e", "id": 1, "ts": 10.5, "pid": 1, "tid": 2},
            {"ph": "E", "ts": 12.0, "pid": 1, "tid": 2}]
    start = [{"name": "wake", "ph": "X", "ts": 9.0, "dur": 0.5, "pid": 1, "tid": 0},
             {"name": "w", "ph": "s", "id": 1, "ts": 9.5, "pid": 1, "tid": 0}]
    assert unbound_flows(start + step) == []
    # outside the slice in time, on another track, an instant instead of a slice
    late = [dict(start[0]), dict(start[1], ts=9.501)]
    other = [dict(start[0], tid=7), start[1]]
    instant = [{"name": "io_ready", "ph": "i", "s": "t", "ts": 9.5, "pid": 1, "tid": 0}, start[1]]
    for case in (late, other, instant):
        assert len(unbound_flows(case + step)) == 1
    # a flow end after its step's E, and one without bp "e" with no slice after it
    assert len(unbound_flows(start + step[:1] + step[2:] + [dict(step[1], ts=12.5)])) == 1
    assert unbound_flows(start + [dict(step[1], ts=9.9, bp=None)] + step) == []
    assert len(unbound_flows(start + step + [dict(step[1], ts=13.0, bp=None)])) == 1
    assert misnested([{"ph": "X", "ts": 0, "dur": 2, "pid": 1, "tid": 0},
                      {"ph": "X", "ts": 1, "dur": 2, "pid": 1, "tid": 0}])


# ---------------------------------------------------------------------------
# Today's export fails the rule; bind_flows fixes the same events

# Verbatim from the export before bind_flows existed (S1, tiny preset; timestamps
# cut to ns), on coro: wake-ups from the kernel track (tid 0) and from a finished
# task's track (flow 9) have no enclosing slice; spawns inside a step do.
OLD_CORO = [
    {"name": "thread_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "kernel"}},
    {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "main"}},
    {"name": "thread_name", "ph": "M", "pid": 1, "tid": 2, "args": {"name": "AsyncRelay.pump"}},
    {"name": "spawn", "ph": "i", "s": "t", "ts": 7847.326, "pid": 1, "tid": 0, "args": {"child": 1}},
    {"name": "wakeup", "cat": "flow", "ph": "s", "id": 1, "ts": 7853.237, "pid": 1, "tid": 0},
    {"name": "step", "ph": "B", "ts": 7869.948, "pid": 1, "tid": 1, "args": {}},
    {"name": "wakeup", "cat": "flow", "ph": "f", "bp": "e", "id": 1, "ts": 7873.134, "pid": 1, "tid": 1},
    {"ph": "E", "ts": 8047.32, "pid": 1, "tid": 1},
    {"name": "io_wait", "ph": "i", "s": "t", "ts": 10445.721, "pid": 1, "tid": 1,
     "args": {"fd": 3, "direction": "write"}},
    {"name": "io_ready", "ph": "i", "s": "t", "ts": 10459.687, "pid": 1, "tid": 0,
     "args": {"fd": 3, "direction": "write"}},
    {"name": "wakeup", "cat": "flow", "ph": "s", "id": 2, "ts": 10462.443, "pid": 1, "tid": 0},
    {"name": "step", "ph": "B", "ts": 10469.195, "pid": 1, "tid": 1, "args": {}},
    {"name": "wakeup", "cat": "flow", "ph": "f", "bp": "e", "id": 2, "ts": 10471.46, "pid": 1, "tid": 1},
    {"ph": "E", "ts": 10531.041, "pid": 1, "tid": 1},
    {"name": "step", "ph": "B", "ts": 10534.257, "pid": 1, "tid": 1, "args": {}},
    {"name": "spawn", "ph": "i", "s": "t", "ts": 10562.911, "pid": 1, "tid": 1, "args": {"child": 2}},
    {"name": "wakeup", "cat": "flow", "ph": "s", "id": 3, "ts": 10565.065, "pid": 1, "tid": 1},
    {"ph": "E", "ts": 10587.807, "pid": 1, "tid": 1},
    {"name": "step", "ph": "B", "ts": 10607.424, "pid": 1, "tid": 2, "args": {}},
    {"name": "wakeup", "cat": "flow", "ph": "f", "bp": "e", "id": 3, "ts": 10608.997, "pid": 1, "tid": 2},
    {"ph": "E", "ts": 22483.243, "pid": 1, "tid": 2},
    {"name": "wakeup", "cat": "flow", "ph": "s", "id": 9, "ts": 22490.858, "pid": 1, "tid": 2},
    {"name": "error", "ph": "i", "s": "t", "ts": 22500.246, "pid": 1, "tid": 2,
     "args": {"exception": "Cancelled('task was cancelled')"}},
    {"name": "step", "ph": "B", "ts": 22507.248, "pid": 1, "tid": 1, "args": {}},
    {"name": "wakeup", "cat": "flow", "ph": "f", "bp": "e", "id": 9, "ts": 22508.321, "pid": 1, "tid": 1},
    {"ph": "E", "ts": 22523.148, "pid": 1, "tid": 1},
]

# The same, on hybrid (flow 7 added: two wake-ups from one callback): wake-ups
# from plain loop callbacks (track 100000), a
# spawn from the loop, and a spawn inside a step.
OLD_HYBRID = [
    {"name": "thread_name", "ph": "M", "pid": 1, "tid": 100000, "args": {"name": "loop callbacks"}},
    {"name": "spawn", "ph": "i", "s": "t", "ts": 610.303, "pid": 1, "tid": 100000, "args": {"child": 100002}},
    {"name": "wakeup", "cat": "flow", "ph": "s", "id": 2, "ts": 612.808, "pid": 1, "tid": 100000},
    {"name": "step", "ph": "B", "ts": 682.368, "pid": 1, "tid": 100002, "args": {}},
    {"name": "wakeup", "cat": "flow", "ph": "f", "bp": "e", "id": 2, "ts": 685.404, "pid": 1, "tid": 100002},
    {"ph": "E", "ts": 879.077, "pid": 1, "tid": 100002},
    {"name": "wakeup", "cat": "flow", "ph": "s", "id": 3, "ts": 961.481, "pid": 1, "tid": 100000},
    {"name": "step", "ph": "B", "ts": 979.024, "pid": 1, "tid": 100002, "args": {}},
    {"name": "wakeup", "cat": "flow", "ph": "f", "bp": "e", "id": 3, "ts": 980.476, "pid": 1, "tid": 100002},
    {"name": "spawn", "ph": "i", "s": "t", "ts": 1004.101, "pid": 1, "tid": 100002, "args": {"child": 100003}},
    {"name": "wakeup", "cat": "flow", "ph": "s", "id": 4, "ts": 1005.563, "pid": 1, "tid": 100002},
    {"ph": "E", "ts": 1027.004, "pid": 1, "tid": 100002},
    {"name": "step", "ph": "B", "ts": 1032.674, "pid": 1, "tid": 100003, "args": {}},
    {"name": "wakeup", "cat": "flow", "ph": "f", "bp": "e", "id": 4, "ts": 1033.867, "pid": 1, "tid": 100003},
    {"ph": "E", "ts": 1111.482, "pid": 1, "tid": 100003},
    {"name": "wakeup", "cat": "flow", "ph": "s", "id": 6, "ts": 12820.98, "pid": 1, "tid": 100000},
    {"name": "wakeup", "cat": "flow", "ph": "s", "id": 7, "ts": 12821.5, "pid": 1, "tid": 100000},
    {"name": "step", "ph": "B", "ts": 12849.754, "pid": 1, "tid": 100003, "args": {}},
    {"name": "wakeup", "cat": "flow", "ph": "f", "bp": "e", "id": 6, "ts": 12853.511, "pid": 1, "tid": 100003},
    {"ph": "E", "ts": 12978.074, "pid": 1, "tid": 100003},
]


@pytest.mark.parametrize("old, unbound", [(OLD_CORO, {1, 2, 9}), (OLD_HYBRID, {2, 3, 6, 7})],
                         ids=["coro", "hybrid"])
def test_the_export_before_bind_flows_fails_the_rule(old, unbound):
    assert {e["id"] for e in unbound_flows(old)} == unbound
    assert all(e["ph"] == "s" for e in unbound_flows(old))


@pytest.mark.parametrize("old", [OLD_CORO, OLD_HYBRID], ids=["coro", "hybrid"])
def test_bind_flows_binds_every_flow_of_the_old_shape_without_misnesting(old):
    recorded = copy.deepcopy(old)
    events = bind_flows(recorded)
    assert recorded == old                              # the recording is untouched
    assert unbound_flows(events) == [] and misnested(events) == []
    assert [e["id"] for e in events if e["ph"] in "sf"] == [e["id"] for e in old if e["ph"] in "sf"]
    made = [e for e in events if e["ph"] == "X"]
    # an instant that announced the wake-up carries it; a bare wake-up gets its own slice
    names = {e["name"] for e in made}
    assert "spawn" in names and ("io_ready" in names or "wake-up" in names)
    assert all(e["dur"] * 1000 <= 25_000 for e in made)    # short, never the whole run
    # every slice made for a flow sits before the flow in the file, as the importer reads it
    for s in (e for e in events if e["ph"] == "s"):
        i = events.index(s)
        assert any(x["ph"] in ("X", "B") and x["tid"] == s["tid"] for x in events[:i])


def test_a_recorded_trace_exports_bound_flows():
    tr = Trace()
    tr.track(0, "loop")
    tr.track(5, "task")
    tr.instant("io_ready", 0, fd=3)
    f1 = tr.flow_start(0)
    f2 = tr.flow_start(0)
    tr.begin("step", 5)
    tr.flow_end(f1, 5)
    f3 = tr.flow_start(5)          # inside the step: already bound
    tr.end(5)
    tr.begin("step", 5)
    tr.flow_end(f2, 5)
    tr.flow_end(f3, 5)
    tr.end(5)
    assert len(unbound_flows(tr.events)) == 2          # the raw recording: f1, f2 on the loop
    doc = tr.to_chrome()
    events = doc["traceEvents"]
    assert events[0]["ph"] == "M"
    assert unbound_flows(events) == [] and misnested(events) == []
    assert flow_report(events)["arrows"] == 3


# ---------------------------------------------------------------------------
# Traces of real cells

def _trace(tmp_path, *args, timeout=150):
    out = tmp_path / "trace.json"
    r = subprocess.run(LOOPLAB + ["trace", *args, "--out", str(out)],
                       capture_output=True, text=True, timeout=timeout)
    return r, out


@pytest.mark.parametrize("kernel", ["callback", "hybrid", "coro"])
def test_every_flow_of_an_s1_trace_binds_on_each_kernel(tmp_path, kernel):
    r, out = _trace(tmp_path, "S1", "--runtime", kernel, "--preset", "tiny")
    assert r.returncode == 0, r.stderr
    events = json.loads(out.read_text())["traceEvents"]
    assert unbound_flows(events) == []
    assert misnested(events) == []
    report = flow_report(events)
    if kernel == "callback":
        # no tasks, so no wake-up arrows; its tracks are connections
        assert report["starts"] == 0
        assert any(e["ph"] == "C" and e["name"] == "user_buffer_bytes" for e in events)
    else:
        assert report["arrows"] >= 3 and report["ends"] <= report["starts"]


@pytest.mark.parametrize("kernel", ["callback", "hybrid", "coro"])
def test_trace_of_a_server_cell_is_chrome_json(tmp_path, kernel):
    out = tmp_path / "trace.json"
    # tiny: a traced quick cell once outran the app's 10 s result wait on a loaded CI worker
    r = subprocess.run(LOOPLAB + ["trace", "S5", "--runtime", kernel, "--variant", "fixed",
                                  "--preset", "tiny", "--out", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    events = json.loads(out.read_text())["traceEvents"]
    phases = {e["ph"] for e in events}
    assert all({"ph", "pid", "tid"} <= set(e) for e in events)
    assert any(e["ph"] == "M" and e["name"] == "thread_name" for e in events)   # named tracks
    assert all(isinstance(e["ts"], (int, float)) for e in events if e["ph"] != "M")
    assert unbound_flows(events) == []
    if kernel == "callback":
        counters = [e for e in events if e["ph"] == "C" and e["name"] == "user_buffer_bytes"]
        assert counters and max(e["args"]["user_buffer_bytes"] for e in counters) > 0
    else:
        # a slice per task step, and flow arrows from a wake-up to the step it caused
        assert {"B", "E"} <= phases
        starts = {e["id"] for e in events if e["ph"] == "s"}
        ends = {e["id"] for e in events if e["ph"] == "f"}
        assert starts and starts & ends


# ---------------------------------------------------------------------------
# Reference runtimes, through their public hooks

@pytest.mark.parametrize("ref", ["trio", "asyncio-streams"])
def test_a_reference_runtime_traces_in_the_same_shape(tmp_path, ref):
    r, out = _trace(tmp_path, "S1", "--runtime", ref, "--preset", "tiny")
    assert r.returncode == 0, r.stderr
    events = json.loads(out.read_text())["traceEvents"]
    assert all({"ph", "pid", "tid"} <= set(e) for e in events)
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
    steps = [e for e in events if e["ph"] == "B" and e["name"] == "step"]
    assert steps and {e["tid"] for e in steps} <= set(names)        # a named track per task
    assert len({e["tid"] for e in steps}) >= 2                       # more than one task seen
    assert unbound_flows(events) == [] and misnested(events) == []
    report = flow_report(events)
    assert report["arrows"] >= 3 and report["unbound_starts"] == 0


@pytest.mark.parametrize("ref, needle", [("asyncio-protocol", "Protocol callbacks"),
                                         ("curio", "Activation")])
def test_a_runtime_without_usable_hooks_is_refused_in_one_line(tmp_path, ref, needle):
    r, out = _trace(tmp_path, "S1", "--runtime", ref, "--preset", "tiny", timeout=60)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr and "trio" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not out.exists()


def test_a_reference_runtime_whose_library_is_missing_exits_3(tmp_path):
    plugin = tmp_path / "ghostrt.py"
    plugin.write_text(
        "from dataclasses import replace\n"
        "from protocols import runtimes\n"
        "runtimes.register(replace(runtimes.get('trio'), id='ghost', origin='',\n"
        "                          requires=('no_such_library_for_looplab',)))\n")
    env = {**__import__("os").environ, "PYTHONPATH": str(tmp_path)}
    out = tmp_path / "t.json"
    r = subprocess.run(LOOPLAB + ["trace", "S1", "--runtime", "ghost", "--runtime-module", "ghostrt",
                                  "--out", str(out)],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 3, r.stderr
    assert "no_such_library_for_looplab" in r.stderr and "Traceback" not in r.stderr
    assert not out.exists()


# ---------------------------------------------------------------------------
# A runtime registered from outside, traced the way it declares

def test_an_outside_runtime_traces_through_the_twin_it_declares(tmp_path):
    """examples/selectkernel declares a traced twin of its port on its RuntimeInfo;
    `looplab trace` runs it with no edit of looplab."""
    r, out = _trace(tmp_path, "S1", "--runtime-module", "examples.selectkernel",
                    "--runtime", "selectkernel", "--preset", "tiny")
    assert r.returncode == 0, r.stderr
    events = json.loads(out.read_text())["traceEvents"]
    steps = [e for e in events if e["ph"] == "B" and e["name"] == "step"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
    assert len({e["tid"] for e in steps}) >= 2 and {e["tid"] for e in steps} <= set(names)
    assert unbound_flows(events) == [] and misnested(events) == []
    assert flow_report(events)["arrows"] >= 1
