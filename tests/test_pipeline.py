"""The run pipeline end to end: plan -> runner -> results document -> rendering.

A report rendered again from the results file equals the one rendered at run time;
every verb that runs cells keeps its finished work on SIGINT/SIGTERM and says
where; bad files are one line and exit 2; an interrupted run's report says so;
a run whose cells all errored does not exit 0.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from bench import report
from bench import results as resmod
from bench import run as matrix
from bench.run import describe as docmod

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOOPLAB = [sys.executable, "-m", "bench"]
ENV = {**os.environ, "PYTHONPATH": ROOT, "PYTHONUNBUFFERED": "1"}


def _looplab(*args, timeout=120, cwd=None):
    return subprocess.run(LOOPLAB + [str(a) for a in args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=ENV)


def _start(*args, cwd=None):
    return subprocess.Popen(LOOPLAB + [str(a) for a in args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=cwd, env=ENV)


def _wait_for(pred, limit_s=90.0):
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return False


def _cells_in(path) -> int:
    try:
        with open(path) as f:
            return len(json.load(f)["cells"])
    except (OSError, ValueError, KeyError):
        return 0


def _interrupted_line(stderr: str) -> re.Match:
    m = re.search(r"interrupted(?: \(\w+\))?: (\d+) of (\d+) \w+ finished(?: exploring)?, "
                  r"kept in (\S+)", stderr)
    assert m, stderr
    return m


# ---------------------------------------------------------------------------
# The report from the file equals the report at run time

_TIMING = re.compile(r"\d+(\.\d+)? ?(s|ms|µs)\b")


@pytest.mark.timeout(240)
def test_the_report_rendered_from_the_results_file_equals_the_one_at_run_time(tmp_path):
    run_dir, again = tmp_path / "run", tmp_path / "again"
    r = _looplab("run", "--net", "sim", "--scenarios", "S1,S5,S6", "--runtimes", "coro,trio",
                 "--preset", "tiny", "--out", run_dir, timeout=200)
    assert r.returncode == 0, r.stderr
    doc = json.loads((run_dir / "results.json").read_text())
    assert set(doc["runtimes"]) == {"coro", "trio"} and doc["runtimes"]["coro"]["compared_with"]
    assert {"bars": "healthy_share_fraction"}.items() <= doc["scenarios"]["S6"]["plots"][0].items()
    # rendered elsewhere: the file alone, in a process that loaded nothing of the run
    rr = _looplab("report", run_dir / "results.json", "--out", again, timeout=120)
    assert rr.returncode == 0, rr.stderr

    def table(stdout):      # the terminal report, without the line naming the folder
        return [ln for ln in stdout.splitlines() if not ln.startswith(("report:", "Errors"))
                and "notes in" not in ln]
    assert table(rr.stdout) == table(r.stdout[r.stdout.index("\nS1"):])
    for name in ("report.md", "results.csv", "report.html"):
        at_run, from_file = ((d / name).read_text().replace(str(run_dir), "DIR")
                             .replace(str(again), "DIR") for d in (run_dir, again))
        assert at_run == from_file, name
    pngs = sorted(p.name for p in run_dir.glob("*.png"))
    assert pngs and pngs == sorted(p.name for p in again.glob("*.png"))
    assert "healthy got" in r.stdout and "%" in r.stdout.split("S6")[1]   # S6's own formatter


def test_rendering_reads_the_document_not_the_registry():
    """A runtime's references and a scenario's columns come from the document: a
    document that describes them differently is rendered as it says."""
    cell = {"id": "X/k/naive/tiny", "scenario": "X", "runtime": "k", "variant": "naive",
            "style": "task", "ours": True, "params": {}, "repeats": 1, "notes": [],
            "metrics": {"a_count": 3}, "verdicts": {"ok": True}, "errors": []}
    ref = {**cell, "id": "X/r/naive/tiny", "runtime": "r", "ours": False,
           "verdicts": {"ok": False}}
    doc = resmod.new_document(
        [cell, ref], run_id="r", env={},
        scenarios={"X": {"title": "a scenario no registry has", "variants": ["naive"],
                         "metrics": {"a_count": {"unit": "count", "direction": None,
                                                 "label": "the a", "format": "fmt_percent"}},
                         "verdicts": {"ok": "fine"}, "columns": ["a_count"], "plots": []}},
        runtimes={"k": {"style": "task", "ours": True, "compared_with": ["r"], "primary": "r"},
                  "r": {"style": "task", "ours": False, "compared_with": [], "primary": None}})
    text = report.render_terminal(doc)
    assert "X — a scenario no registry has" in text and "the a" in text and "300.0 %" in text
    assert report.fidelity(doc["cells"], doc) == [
        ["X", "naive", "k", "r", "yes", "differ", "ok: subject yes, reference NO"]]


# ---------------------------------------------------------------------------
# Work kept on SIGINT and SIGTERM

@pytest.mark.timeout(180)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_repro_keeps_finished_cells_when_stopped(tmp_path, sig):
    out = tmp_path / "zoo"
    p = _start("repro", "cpython-32391", "--preset", "tiny", "--out", out)
    try:
        assert _wait_for(lambda: _cells_in(out / "results.json") >= 1), "no cell finished"
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 130, err
    m = _interrupted_line(err)
    done, planned = int(m[1]), int(m[2])
    assert 1 <= done < planned and m[3] == str(out / "report.md")
    doc = json.loads((out / "results.json").read_text())
    assert len(doc["cells"]) == done and doc["incomplete"]["planned"] == planned
    assert resmod.validate(doc) == []
    assert "INCOMPLETE" in (out / "report.md").read_text()
    assert (out / "zoo.md").exists() and "Traceback" not in err


@pytest.mark.timeout(180)
def test_repro_without_out_keeps_an_interrupted_run_in_a_default_folder(tmp_path):
    p = _start("repro", "cpython-32391", "--preset", "tiny", cwd=tmp_path)
    try:
        assert _wait_for(lambda: "[1/" in (p.stderr.readline() or "")), "no cell finished"
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 130, err
    where = _interrupted_line(err)[3]
    assert where.startswith("looplab-runs" + os.sep)
    assert _cells_in(tmp_path / os.path.dirname(where) / "results.json") >= 1


@pytest.mark.timeout(180)
def test_seed_exploration_keeps_finished_summaries_when_stopped(tmp_path):
    out = tmp_path / "explore"
    p = _start("run", "--net", "sim", "--seeds", "1500", "--scenarios", "S1", "--variants", "naive",
               "--runtimes", "coro,hybrid,callback", "--preset", "tiny", "--out", out)
    lines: list[str] = []
    def read():
        for ln in p.stdout:
            lines.append(ln)
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert _wait_for(lambda: any("seeds in" in ln for ln in lines), 150), "no cell explored"
        p.send_signal(signal.SIGTERM)
        err = p.stderr.read()
        p.wait(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 130, err
    m = _interrupted_line(err)
    assert m[3] == str(out / "explore.json") and int(m[1]) >= 1 and m[2] == "3"
    doc = json.loads((out / "explore.json").read_text())
    assert len(doc["explorations"]) == int(m[1]) and doc["incomplete"]["planned"] == 3
    assert doc["explorations"][0]["seeds"] == 1500


# ---------------------------------------------------------------------------
# Bad files: one line, exit 2

def _a_results_file(tmp_path):
    cell = {"id": "S5/coro/naive/tiny", "scenario": "S5", "runtime": "coro", "variant": "naive",
            "params": {}, "repeats": 1, "metrics": {"x_count": 1}, "verdicts": {"ok": True},
            "errors": []}
    return resmod.new_document([cell], run_id="r", env={})


@pytest.mark.parametrize("spoil", [
    lambda d: d["cells"][0]["verdicts"].update(ok="yes"),
    lambda d: d["cells"][0]["metrics"].update(x_count=[1, 2]),
    lambda d: d["cells"][0].pop("errors"),
    lambda d: d.update(run_id=""),
])
def test_report_refuses_a_results_file_that_fails_the_schema(tmp_path, spoil):
    from bench import cli
    doc = _a_results_file(tmp_path)
    spoil(doc)
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    r = _looplab("report", path, "--out", tmp_path / "rep", timeout=60)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "not a valid looplab results file" in r.stderr
    assert not (tmp_path / "rep" / "report.md").exists()
    assert cli  # the CLI imports


@pytest.fixture(scope="module")
def universe(tmp_path_factory):
    cell = matrix.with_net(matrix.plan("S5", "coro", "naive", "tiny")[0], "sim")
    r = matrix.run_cell(cell)
    assert not r["errors"], r["errors"]
    return r["universe"]


@pytest.mark.parametrize("edit, needle", [
    (lambda u: u.update(runtime="nope"), "unknown runtime"),
    (lambda u: u.update(preset="huge"), "no preset"),
    (lambda u: u.update(variant="zzz"), "no variant"),
    (lambda u: u["net"].update(seed=[1]), "seed"),
    (lambda u: u["net"]["params"].update(latency_s="fast"), "latency_s"),
    (lambda u: u["net"].update(faults=[{"kind": "explode"}]), "fault kind"),
    (lambda u: u.update(net=5), "network"),
    (lambda u: u["params"].update({next(iter(u["params"])): "long"}), "param"),
])
def test_run_replay_refuses_a_hand_edited_universe(tmp_path, universe, edit, needle):
    u = json.loads(json.dumps(universe))
    edit(u)
    path = tmp_path / "u.json"
    path.write_text(json.dumps(u))
    r = _looplab("run", "--replay", path, "--out", tmp_path / "o", timeout=60)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and needle in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_the_untouched_universe_replays(tmp_path, universe):
    path = tmp_path / "u.json"
    path.write_text(json.dumps(universe))
    r = _looplab("run", "--replay", path, "--out", tmp_path / "o", timeout=60)
    assert r.returncode == 0, r.stderr


# ---------------------------------------------------------------------------
# What reports say

def test_an_interrupted_runs_reports_say_it_is_incomplete(tmp_path):
    doc = docmod.complete(_a_results_file(tmp_path))
    doc["incomplete"] = {"finished": 1, "planned": 7, "reason": "interrupted"}
    line = "INCOMPLETE: this run was interrupted after 1 of 7 cells"
    assert line in report.render_terminal(doc)
    assert line in report.render_markdown(doc, [])
    paths = report.write_report(doc, str(tmp_path / "rep"))
    assert line in (tmp_path / "rep" / "report.html").read_text()
    assert paths["md"].endswith("report.md")
    assert "INCOMPLETE" not in report.render_terminal({**doc, "incomplete": None})


def test_an_interrupted_bench_run_shows_no_goal_as_not_met():
    from bench.perf import goals
    from bench.report import html
    rows = [{"goal": "g", "status": "not met (gap 40%)", "ratio": 0.6, "min": 0.5, "max": 0.7,
             "n": 1, "cpu": None},
            {"goal": "h", "status": "met", "ratio": 2.0, "min": 2.0, "max": 2.0, "n": 1,
             "cpu": None}]
    cell = {"id": "echo/coro", "scenario": "echo", "runtime": "coro", "variant": "x",
            "params": {}, "repeats": 1, "metrics": {}, "verdicts": {}, "errors": []}
    done = resmod.new_document([cell], run_id="r", env={}, goals=rows,
                               config={"interrupted": False})
    cut = {**done, "config": {"interrupted": True}}
    assert "not met (gap 40%)" in html.render_html(done)
    page = html.render_html(cut)
    assert "not met" not in page and goals.NOT_JUDGED in page
    assert [r["status"] for r in goals.unjudged_if_interrupted(rows, True)] == [goals.NOT_JUDGED, "met"]


@pytest.mark.timeout(120)
def test_report_html_links_its_plots_when_out_is_relative(tmp_path):
    pytest.importorskip("matplotlib")
    doc = resmod.new_document([{
        "id": "S6/coro/naive/tiny", "scenario": "S6", "runtime": "coro", "variant": "naive",
        "style": "task", "ours": True, "params": {}, "repeats": 1,
        "metrics": {"healthy_share_fraction": 0.5}, "verdicts": {}, "errors": []}],
        run_id="r", env={})
    (tmp_path / "r.json").write_text(json.dumps(doc))
    # in a process of its own (matplotlib keeps its fonts open), from the folder the
    # relative --out is relative to; looplab-report is the main report's default
    r = _looplab("report", "r.json", "--out", "looplab-report", cwd=tmp_path, timeout=100)
    assert r.returncode == 0, r.stderr
    page = (tmp_path / "looplab-report" / "report.html").read_text()
    hrefs = re.findall(r'href="([^"#]+\.png)"', page)
    assert hrefs
    for h in hrefs:
        assert (tmp_path / "looplab-report" / h).exists(), h


def test_bench_without_out_or_json_saves_to_a_default_folder(tmp_path, monkeypatch):
    import argparse
    from bench.verbs import benchmark
    monkeypatch.chdir(tmp_path)
    args = argparse.Namespace(out=None, json=None)
    benchmark._check_outputs(args)
    assert args.out and args.out.startswith("looplab-runs" + os.sep)
    # named now, made when the first file is written: checking creates nothing
    assert not (tmp_path / "looplab-runs").exists()
    kept = argparse.Namespace(out=None, json="x.json")
    benchmark._check_outputs(kept)
    assert kept.out is None


# ---------------------------------------------------------------------------
# Exit codes

FAILING = textwrap.dedent('''
    from bench.scenarios.api import Metric, Scenario

    def run(ctx):
        raise ConnectionRefusedError(111, "Connection refused")

    SCENARIO = Scenario(id="UF", title="always fails", run=run, summary="Fails. Always?",
                        metrics=[Metric("x_count", None, "x")], verdicts={"ok": "fine"},
                        presets={"tiny": {}})
''')


@pytest.mark.timeout(120)
def test_a_run_whose_cells_all_errored_does_not_exit_0(tmp_path):
    path = tmp_path / "failing.py"
    path.write_text(FAILING)
    r = _looplab("run", "--scenario-file", path, "--runtimes", "coro,hybrid", "--net", "sim",
                 "--preset", "tiny", "--out", tmp_path / "o", timeout=100)
    assert r.returncode == 1, r.stderr
    assert r.stderr.count("ERROR") == 2 and "ConnectionRefusedError" in r.stdout


@pytest.mark.timeout(120)
def test_s4_under_sim_is_skipped_with_its_reason_not_refused_in_every_cell(tmp_path):
    r = _looplab("run", "--net", "sim", "--scenarios", "S4", "--runtimes", "coro,hybrid",
                 "--preset", "tiny", "--out", tmp_path / "o", timeout=100)
    # every cell skipped: nothing was measured, which is no pass (exit 1, one line why)
    assert r.returncode == 1, r.stderr
    assert r.stderr.splitlines()[-1].startswith("looplab: no cell measured anything: all 2 cells")
    doc = json.loads((tmp_path / "o" / "results.json").read_text())
    assert [c.get("skipped", "") for c in doc["cells"]] == \
        ["S4 runs only on the real network: " + matrix.plan("S4", "coro", None, "tiny")[0]
         .sc.real_network_only] * 2
    assert "ConnectionRefused" not in r.stdout + r.stderr
