"""``looplab trace``: Chrome trace-event JSON of one cell, as Perfetto reads it."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

LOOPLAB = [sys.executable, "-m", "bench"]


@pytest.mark.parametrize("kernel", ["callback", "hybrid", "coro"])
def test_trace_of_a_server_cell_is_chrome_json(tmp_path, kernel):
    out = tmp_path / "trace.json"
    r = subprocess.run(LOOPLAB + ["trace", "S5", "--runtime", kernel, "--variant", "fixed",
                                  "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    events = json.loads(out.read_text())["traceEvents"]
    phases = {e["ph"] for e in events}
    assert all({"ph", "pid", "tid"} <= set(e) for e in events)
    assert any(e["ph"] == "M" and e["name"] == "thread_name" for e in events)   # named tracks
    assert all(isinstance(e["ts"], (int, float)) for e in events if e["ph"] != "M")
    if kernel == "callback":
        counters = [e for e in events if e["ph"] == "C" and e["name"] == "user_buffer_bytes"]
        assert counters and max(e["args"]["user_buffer_bytes"] for e in counters) > 0
    else:
        # a slice per task step, and flow arrows from a wake-up to the step it caused
        assert {"B", "E"} <= phases
        starts = {e["id"] for e in events if e["ph"] == "s"}
        ends = {e["id"] for e in events if e["ph"] == "f"}
        assert starts and starts & ends


def test_trace_refuses_a_reference_library(tmp_path):
    r = subprocess.run(LOOPLAB + ["trace", "S5", "--runtime", "asyncio-streams",
                                  "--out", str(tmp_path / "t.json")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "our kernels" in r.stderr and "Traceback" not in r.stderr
