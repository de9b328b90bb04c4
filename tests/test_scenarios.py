"""Scenarios: the public API (register, files, plugins), a user's one-file scenario run
end to end through the CLI, sharded runs rendered as one report, SIGTERM mid-run, and
S1, S3, S4, S5 at small scale on every runtime, judged by generous oracles.

The expected verdicts of the built-ins depend only on the *style* and the variant: that
is the claim looplab makes (callback and hybrid behave as asyncio does, coro as curio
and trio do). Each cell runs its app in its own process and its peers in another; every
wait is bounded, so a broken kernel fails here instead of hanging.
"""
from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from bench import results
from bench import run as matrix
from bench.scenarios import api as scmod
from bench.errors import UsageError

KiB, MiB = 1024, 1024 * 1024
LOOPLAB = [sys.executable, "-m", "bench"]


def _looplab(*args, timeout=120, cwd=None):
    return subprocess.run(LOOPLAB + [str(a) for a in args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


# ---------------------------------------------------------------------------
# The API

def _noop(ctx):
    return {}, {"ok": True}, []


def test_register_refuses_a_scenario_without_oracles_or_metrics():
    sc = scmod.Scenario(id="T-empty", title="t", summary="s", run=_noop, presets={"q": {}})
    with pytest.raises(UsageError) as info:
        scmod.register(sc)
    msg = str(info.value)
    assert "metrics" in msg and "verdicts" in msg and "\n" not in msg
    assert "T-empty" not in scmod.scenarios()


def test_register_refuses_a_metric_without_its_unit_and_a_clash_with_a_builtin():
    bad = scmod.Scenario(id="T-unit", title="t", summary="s", run=_noop, presets={"q": {}},
                         metrics=[scmod.Metric("delivered")], verdicts={"ok": "fine"})
    with pytest.raises(UsageError, match="must end in its unit"):
        scmod.register(bad)
    clash = scmod.Scenario(id="S1", title="t", summary="s", run=_noop, presets={"q": {}},
                           metrics=[scmod.Metric("x_count")], verdicts={"ok": "fine"})
    with pytest.raises(UsageError, match="taken by built-in"):
        scmod.register(clash)


def test_builtins_are_scenario_objects_with_everything_declared():
    # Other tests in the session may have loaded more (the zoo, a user's file): only
    # the built-ins are asked about here.
    known = {sid: sc for sid, sc in scmod.scenarios().items() if sc.origin == "built-in"}
    assert list(known) == [f"S{i}" for i in range(1, 9)]
    for sc in known.values():
        assert sc.problems() == [] and sc.origin == "built-in"
    assert [s for s, sc in known.items() if sc.main_job] == ["S1", "S3", "S4", "S5", "S6"]
    assert [s for s, sc in known.items() if sc.traceable] == ["S1", "S5", "S6"]
    assert known["S3"].variants[0] == "naive"


def test_run_results_are_checked_against_the_declaration():
    sc = scmod.Scenario(id="T-check", title="t", summary="s", run=_noop, presets={"q": {}},
                        metrics=[scmod.Metric("x_count")], verdicts={"ok": "fine"})
    with pytest.raises(ValueError, match="undeclared metrics y_count"):
        matrix.repeats._outcome(sc, ({"y_count": 1}, {"ok": True}, []))
    with pytest.raises(ValueError, match="declares"):
        matrix.repeats._outcome(sc, ({}, {}, []))


def _docstring_example() -> str:
    """The user scenario file shown in bench.scenarios.api's docstring, as written there."""
    lines = scmod.__doc__.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.strip().startswith("# my_bug.py"))
    block = []
    for ln in lines[start:]:
        if ln and not ln.startswith("    "):
            break
        block.append(ln)
    return textwrap.dedent("\n".join(block))


USER_SCENARIO = _docstring_example()


@pytest.fixture
def user_file(tmp_path):
    path = tmp_path / "my_bug.py"
    path.write_text(USER_SCENARIO)
    return path


@pytest.mark.timeout(240)
def test_a_user_scenario_file_runs_end_to_end(tmp_path, user_file):
    out = tmp_path / "report"
    r = _looplab("run", "--scenario-file", user_file, "--scenarios", "U1", "--runtimes", "coro,trio",
                 "--preset", "tiny", "--out", out, "--fail-on", "verdict", timeout=200)
    assert r.returncode == 0, r.stderr
    assert "U1 — user send and close" in r.stdout
    rows = [ln for ln in r.stdout.splitlines() if "all_arrived=" in ln]
    assert len(rows) == 2 and all("all_arrived=yes" in ln for ln in rows), r.stdout
    assert any(ln.startswith("* coro") for ln in rows)
    doc = json.loads((out / "results.json").read_text())
    assert results.validate(doc) == []
    assert doc["scenarios"]["U1"]["origin"] == f"file {user_file}"
    by_rt = {c["runtime"]: c for c in doc["cells"]}
    assert set(by_rt) == {"coro", "trio"}
    for cell in by_rt.values():
        assert cell["metrics"]["delivered_bytes"] == 300_000 and cell["verdicts"] == {"all_arrived": True}
    with open(out / "results.csv", newline="") as f:
        csv_rows = list(csv.DictReader(f))
    assert {(r["runtime"], r["value"]) for r in csv_rows if r["metric"] == "verdict:all_arrived"} \
        == {("coro", "true"), ("trio", "true")}
    md = (out / "report.md").read_text()
    assert "## U1 — user send and close" in md and "![U1](u1_delivered_bytes.png)" in md
    assert (out / "u1_delivered_bytes.png").stat().st_size > 0
    assert "coro | trio |" in md          # a fidelity row: our task kernel against trio
    same = _looplab("compare", out / "results.json", out / "results.json", "--fail", "all", timeout=30)
    assert same.returncode == 0 and "0 regression" not in same.stderr, same.stderr
    # the report renders from the results alone, without the user's file
    again = _looplab("report", out / "results.json", "--out", tmp_path / "again", timeout=60)
    assert again.returncode == 0, again.stderr
    assert "U1 — user send and close" in again.stdout and "all_arrived=yes" in again.stdout
    listed = _looplab("list", "scenarios", "--scenario-file", user_file, timeout=30)
    assert re.search(r"^U1 .*\[from: file .*my_bug\.py\]", listed.stdout, re.M), listed.stdout


@pytest.mark.parametrize("body, needle", [
    ("def broken(:\n", "SyntaxError"),
    ("import no_such_module_here\n", "ModuleNotFoundError"),
    ("x = 1\n", "defines no scenario"),
    (USER_SCENARIO.replace('id="U1"', 'id="S1"'), "taken by built-in"),
])
def test_a_bad_scenario_file_is_one_line_exit_2(tmp_path, body, needle):
    path = tmp_path / "bad.py"
    path.write_text(textwrap.dedent(body))
    r = _looplab("run", "--scenario-file", path, "--runtimes", "coro", timeout=30)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr and str(path) in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------------------
# Shards, interrupts

def _tables(md: str) -> str:
    """The report's tables and notes, without the run line (ids, machines)."""
    return "\n".join(ln for ln in md.splitlines()
                     if ln.startswith("|") or ln.startswith("## ") or ln.startswith("- "))


@pytest.mark.timeout(240)
def test_two_shards_merged_and_rendered_equal_the_run_in_one_piece(tmp_path):
    common = ["--scenarios", "S4", "--runtimes", "callback,coro,asyncio-protocol", "--preset", "tiny"]
    assert _looplab("run", *common, "--out", tmp_path / "whole", timeout=200).returncode == 0
    for i in (1, 2):
        r = _looplab("run", *common, "--shard", f"{i}/2", "--out", tmp_path / f"s{i}", timeout=200)
        assert r.returncode == 0, r.stderr
    missing = _looplab("merge", tmp_path / "s1" / "results.json", timeout=30)
    assert missing.returncode == 2 and "missing shard(s) 2/2" in missing.stderr
    r = _looplab("report", tmp_path / "s1" / "results.json", tmp_path / "s2" / "results.json",
                 "--out", tmp_path / "merged", timeout=60)
    assert r.returncode == 0, r.stderr
    whole = (tmp_path / "whole" / "report.md").read_text()
    merged = (tmp_path / "merged" / "report.md").read_text()
    assert _tables(merged) == _tables(whole) and "| * callback" in _tables(whole)
    assert results.validate(json.loads((tmp_path / "merged" / "results.json").read_text())) == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_mid_run_keeps_the_finished_cells(tmp_path, sig):
    out = tmp_path / "run"
    proc = subprocess.Popen(LOOPLAB + ["run", "--scenarios", "S4,S3", "--runtimes", "callback",
                                       "--preset", "tiny", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            path = out / "results.json"
            if path.exists() and json.loads(path.read_text())["cells"]:
                break
            time.sleep(0.1)
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("looplab: interrupted:") and "report.md" in last
    doc = json.loads((out / "results.json").read_text())
    assert doc["cells"] and all(c["verdicts"] for c in doc["cells"])
    assert (out / "report.md").exists()
    assert not [p for p in os.listdir(out) if p.endswith(".tmp")]


@pytest.mark.timeout(60)
def test_server_cells_stop_when_looplab_runs_in_the_background_of_a_shell(tmp_path):
    """``looplab run ... &`` in a script: the shell starts it with SIGINT ignored,
    and the cells inherit that. The orchestrator ends a server cell with SIGINT,
    and the coro kernel (like Python) leaves an ignored SIGINT ignored, so
    without the cell restoring it the app never stopped."""
    # as a shell does it (and no preexec_fn, which is not safe in a threaded process)
    ignoring = ["sh", "-c", "trap '' INT; exec \"$@\"", "sh"]
    r = subprocess.run(ignoring + LOOPLAB + ["run", "--scenarios", "S5", "--runtimes", "coro",
                                             "--variants", "naive", "--preset", "tiny",
                                             "--out", str(tmp_path / "bg")],
                       capture_output=True, text=True, timeout=50)
    assert r.returncode == 0, r.stderr[-600:]
    cell = json.loads((tmp_path / "bg" / "results.json").read_text())["cells"][0]
    assert not cell["errors"] and cell["verdicts"], cell


# ---------------------------------------------------------------------------
# The built-ins on every runtime

EXPECTED = {
    ("S1", "callback", "naive"): {"bounded": False},
    ("S1", "callback", "fixed"): {"bounded": True},
    ("S1", "stream", "naive"): {"bounded": False},
    ("S1", "stream", "fixed"): {"bounded": True},
    ("S1", "task", "naive"): {"bounded": True},
    ("S1", "task", "fixed"): {"bounded": True},
    ("S3", "callback", "naive"): {"no_loss": False},
    ("S3", "callback", "fixed"): {"no_loss": True, "close_completed": True},
    ("S3", "stream", "naive"): {"no_loss": False},
    ("S3", "stream", "fixed"): {"no_loss": True, "close_completed": True},
    ("S3", "task", "naive"): {"no_loss": True, "close_completed": True},
    ("S3", "task", "fixed"): {"no_loss": True, "close_completed": True},
    ("S5", "callback", "naive"): {"bounded": False},
    ("S5", "callback", "fixed"): {"bounded": True},
    ("S5", "stream", "naive"): {"bounded": False},
    ("S5", "stream", "fixed"): {"bounded": True},
    ("S5", "task", "naive"): {"bounded": True},
    ("S5", "task", "fixed"): {"bounded": True},
}

SMALL = {
    "S1": {"duration_s": 1.2, "grace_s": 0.8},
    "S3": {"total_bytes": 2 * MiB, "start_after_s": 0.3},
    "S5": {"hold_s": 0.8},
}


def _run(sid, runtime, variant):
    [cell] = matrix.plan(sid, runtime.spec, variant, "quick")
    cell.params.update(SMALL.get(sid, {}))
    result = matrix.run_cell(cell)
    assert not result["errors"], result["errors"]
    return result


@pytest.mark.parametrize("sid, variant", [(s, v) for s in ("S1", "S3", "S5") for v in ("naive", "fixed")])
def test_verdicts_follow_the_style(runtime, sid, variant):
    result = _run(sid, runtime, variant)
    expected = EXPECTED[(sid, runtime.style, variant)]
    got = {k: result["verdicts"][k] for k in expected}
    assert got == expected, (result["metrics"], result["notes"])


def test_s1_naive_buffer_grows_where_the_style_buffers(runtime):
    m = _run("S1", runtime, "naive")["metrics"]
    if runtime.style == "task":
        assert m["peak_user_buffer_bytes"] in (0, None)
    else:
        # 3 MB/s in, 1 MB/s out for 1.2 s: about 2.4 MB piles up in user space.
        assert m["peak_user_buffer_bytes"] > 1 * MiB
        assert m["pause_writing_count"] in (None,) or m["pause_writing_count"] >= 1


def test_s3_what_the_peer_counted_against_what_the_program_wrote(runtime):
    """Two independent witnesses: the runtime's probe says what the write API accepted,
    the reader in another process counts what arrived. Naive shutdown on a buffering
    style loses the difference; the task style loses nothing."""
    m = _run("S3", runtime, "naive")["metrics"]
    assert m["accepted_bytes"] == 2 * MiB
    if runtime.style == "task":
        assert m["delivered_bytes"] == m["accepted_bytes"]
    else:
        assert 0 <= m["delivered_bytes"] < m["accepted_bytes"]
    assert m["eof_after_stop_s"] is None or m["eof_after_stop_s"] >= 0


def test_s4_fingerprint_matches_its_declared_column(runtime):
    result = _run("S4", runtime, "naive")
    assert result["verdicts"]["matches_declared"], result["notes"]


@pytest.mark.timeout(180)
def test_run_fail_on_verdict_exits_1_on_a_planted_verdict_regression(tmp_path):
    """S3 naive on callback loses data (no_loss=NO). Without a baseline any failed
    verdict fails the run; with one, only a verdict that held there."""
    common = ["run", "--scenarios", "S3", "--runtimes", "callback", "--variants", "naive",
              "--preset", "tiny", "--fail-on", "verdict"]
    first = _looplab(*common, "--out", tmp_path / "a", timeout=120)
    assert first.returncode == 1 and "verdict(s) failed" in first.stderr
    baseline = json.loads((tmp_path / "a" / "results.json").read_text())
    assert baseline["cells"][0]["verdicts"]["no_loss"] is False
    results.write_json(baseline, str(tmp_path / "same.json"))
    baseline["cells"][0]["verdicts"]["no_loss"] = True            # the planted "it used to hold"
    results.write_json(baseline, str(tmp_path / "held.json"))
    r = _looplab(*common, "--baseline", tmp_path / "same.json", "--out", tmp_path / "b", timeout=120)
    assert r.returncode == 0, r.stderr
    r = _looplab(*common, "--baseline", tmp_path / "held.json", "--out", tmp_path / "c", timeout=120)
    assert r.returncode == 1 and "no_loss" in r.stderr


def test_report_rows_naive_first_marker_on_errors_and_no_question_marks():
    from bench import report
    from bench.run import describe as docmod

    def cell(rt, variant, ours, **kw):
        base = {"id": f"S3/{rt}/{variant}/tiny", "scenario": "S3", "runtime": rt, "variant": variant,
                "style": "callback", "ours": ours, "params": {}, "repeats": 1, "notes": [],
                "metrics": {"accepted_bytes": 10, "delivered_bytes": None, "lost_bytes": 0,
                            "eof_after_stop_s": 0.0},
                "verdicts": {"no_loss": True, "close_completed": True}, "errors": []}
        base.update(kw)
        return base
    doc = results.new_document([cell("asyncio-protocol", "fixed", False),
                                cell("callback", "fixed", True, verdicts={}, metrics={},
                                     errors=["RuntimeError: boom"]),
                                cell("asyncio-protocol", "naive", False),
                                cell("callback", "naive", True)], run_id="r", env={})
    doc = docmod.complete(doc)      # a document without descriptions: as `looplab report` reads it
    [(title, header, rows)] = report.table_rows(doc)
    assert [r[1] for r in rows] == ["naive", "naive", "fixed", "fixed"]     # declared order
    error_row = next(r for r in rows if r[-1].startswith("ERROR"))
    assert error_row[0] == "* callback"
    assert "?" not in report.render_terminal(doc)
    md_rows = [ln for ln in report.render_markdown(doc, []).splitlines() if ln.startswith("|")]
    assert md_rows and not any("?" in ln for ln in md_rows)
