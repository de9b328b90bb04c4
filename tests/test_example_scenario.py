"""The shipped user scenario (examples/linereq/linereq.py) through the unmodified CLI.

It runs at the tiny preset on our three kernels and one reference library per port
style, then checks what the scenario claims where the outcome is robust: a naive
callback service pulls every pipelined request into user space while the task port
leaves them in the socket (and the client is held back); naive streams bound their
reads but not their writes; the fixed variants bound both. The results file must
validate, and comparing it with itself must find nothing.
"""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest

from bench.scenarios import api as scmod

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILE = os.path.join(ROOT, "examples", "linereq", "linereq.py")
LOOPLAB = [sys.executable, "-m", "bench"]
RUNTIMES = ("callback", "hybrid", "coro", "asyncio-protocol", "asyncio-streams", "trio")
KiB = 1024


def _looplab(*args, timeout):
    return subprocess.run(LOOPLAB + [str(a) for a in args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def test_the_file_declares_one_complete_scenario():
    added = scmod.load_scenario_file(FILE)
    assert [sc.id for sc in added] == ["LINEREQ"]
    sc = added[0]
    assert sc.problems() == []
    assert set(sc.programs) == {"callback", "stream", "task"}
    assert {"tiny", "quick", "blog"} <= set(sc.presets)
    assert set(sc.verdicts) == {"bounded", "responses_bounded"}
    assert sc.origin == f"file {FILE}"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("linereq") / "report"
    r = _looplab("run", "--scenario-file", FILE, "--scenarios", "LINEREQ",
                 "--runtimes", ",".join(RUNTIMES), "--preset", "tiny", "--out", out, timeout=280)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    doc = json.loads((out / "results.json").read_text())
    cells = {(c["runtime"], c["variant"]): c for c in doc["cells"]}
    return out, r.stdout, doc, cells


def _skip_missing(cells, *keys):
    for key in keys:
        if cells[key].get("skipped"):
            pytest.skip(f"{key[0]}: {cells[key]['skipped']}")


@pytest.mark.timeout(300)
def test_every_cell_ran_and_the_outputs_exist(run):
    out, stdout, doc, cells = run
    assert len(cells) == 2 * len(RUNTIMES)
    for key, cell in cells.items():
        if not cell.get("skipped"):
            assert cell["errors"] == [], (key, cell["errors"])
            assert set(cell["verdicts"]) == {"bounded", "responses_bounded"}
    assert "LINEREQ — pipelined lines to a slow handler" in stdout
    assert doc["scenarios"]["LINEREQ"]["origin"] == f"file {FILE}"
    md = (out / "report.md").read_text()
    assert "## LINEREQ" in md and "| LINEREQ | naive | callback | asyncio-protocol | yes |" in md
    assert (out / "linereq_requests_in_user_space_peak_bytes.png").stat().st_size > 0
    assert (out / "report.html").stat().st_size > 0
    with open(out / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["runtime"] for r in rows if r["metric"] == "verdict:bounded"} >= {"callback", "coro"}


@pytest.mark.timeout(300)
def test_naive_callback_pulls_the_requests_into_user_space_the_task_port_does_not(run):
    _, _, _, cells = run
    count = 150_000
    task = [cells[(rt, v)] for rt in ("coro", "trio") for v in ("naive", "fixed")
            if not cells[(rt, v)].get("skipped")]
    task_held = max(c["metrics"]["requests_in_user_space_peak_bytes"] for c in task)
    task_sent = max(c["metrics"]["requests_sent_count"] for c in task)
    for rt in ("callback", "asyncio-protocol"):
        _skip_missing(cells, (rt, "naive"))
        m = cells[(rt, "naive")]["metrics"]
        assert cells[(rt, "naive")]["verdicts"]["bounded"] is False, m
        # Everything the client got out sits in the service's queue, less what the
        # socket buffers hold; the task port holds at most one receive_some.
        assert m["requests_in_user_space_peak_bytes"] > 3 * task_held, (m, task_held)
        assert m["requests_sent_count"] > 2 * task_sent, (m, task_sent)
        assert m["waiting_peak_count"] > 10 * 1000
    for c in task:
        m = c["metrics"]
        assert c["verdicts"] == {"bounded": True, "responses_bounded": True}, (c["runtime"], m)
        assert m["peak_user_buffer_bytes"] == 0
        assert m["requests_handled_count"] < count // 100      # send_all blocked the handler
        assert m["requests_sent_count"] < count // 2            # and the socket, the client


@pytest.mark.timeout(300)
def test_streams_bound_their_reads_but_only_drain_bounds_the_writes(run):
    _, _, _, cells = run
    for rt in ("hybrid", "asyncio-streams"):
        _skip_missing(cells, (rt, "naive"), (rt, "fixed"))
        naive, fixed = cells[(rt, "naive")], cells[(rt, "fixed")]
        assert naive["verdicts"]["responses_bounded"] is False, naive["metrics"]
        assert naive["metrics"]["peak_user_buffer_bytes"] > 10 * 72 * KiB
        assert naive["metrics"]["waiting_peak_count"] == 1       # readline: one at a time
        assert naive["metrics"]["reader_buffer_peak_bytes"] < 512 * KiB
        assert fixed["verdicts"] == {"bounded": True, "responses_bounded": True}, fixed["metrics"]
    for rt in ("callback", "asyncio-protocol"):
        fixed = cells[(rt, "fixed")]
        assert fixed["verdicts"] == {"bounded": True, "responses_bounded": True}, fixed["metrics"]


@pytest.mark.timeout(120)
def test_the_results_validate_and_compare_equal_to_themselves(run):
    out, _, _, _ = run
    v = _looplab("validate", out / "results.json", timeout=60)
    assert v.returncode == 0, v.stdout + v.stderr
    c = _looplab("compare", out / "results.json", out / "results.json", "--fail", "all", timeout=60)
    assert c.returncode == 0, c.stdout + c.stderr
    assert "no verdict changed" in c.stdout + c.stderr
