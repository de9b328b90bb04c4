"""No verdict without evidence: every built-in scenario and zoo entry, starved, is "not
measured" (an error saying what was missing), never a pass or a fail; a user's oracle
that returns None is "not measured"; an impossible figure is an error; and a matrix run
with more jobs than cores gives not-measured errors (exit 1) or real verdicts.

The starved cells are the ones a loaded machine makes: the peers' time ran out before
the app started, so no peer got its connection, and the app or program saw nothing.
``serve_app`` and ``run_program`` are replaced by ones that return exactly that.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.scenarios import catalog
from bench import results
from bench import run as scenarios
from bench.run import repeats as _cells
from bench.scenarios import api as scmod

STARVED_PEER = {"connected": False, "ended": "timeout", "received_bytes": 0, "sent_bytes": 0,
                "requests_sent": 0, "series": [], "latency_series": []}
STARVED_APP = {"probe": {}, "counters": {}, "rss_growth_bytes": None, "interrupted": False}


def _starve(monkeypatch, module):
    """Make ``module``'s serve_app and run_program return what a starved cell returns."""
    def serve_app(ctx, app, *, peers=(), **kw):
        got = {r.get("name") or r["role"]: dict(STARVED_PEER) for r in peers}
        ctx.peers_seen.update(got)
        return scmod.Served(dict(STARVED_APP), got)

    def run_program(ctx, *, peers=(), **kw):
        got = {r.get("name") or r["role"]: dict(STARVED_PEER) for r in peers}
        ctx.peers_seen.update(got)
        return scmod.Ran({}, got, None)
    monkeypatch.setattr(module, "serve_app", serve_app, raising=False)
    monkeypatch.setattr(module, "run_program", run_program, raising=False)


def _judged(sc, rt="callback", preset=None):
    from bench import runtimes
    preset = preset or next(iter(sc.presets))
    ctx = scmod.CellContext(sc, runtimes.parse(rt), sc.variants[0], preset, dict(sc.presets[preset]))
    out = _cells._outcome(sc, sc.run(ctx))
    return sc.judge(ctx.params, out.metrics, out.verdicts, ctx.peers_seen)


def _zoo():
    scmod.load_plugins(modules=("bench.zoo",))
    from bench import zoo
    return zoo


@pytest.mark.parametrize("sid", [f"S{i}" for i in range(1, 9)])
def test_a_starved_builtin_cell_is_not_measured(monkeypatch, sid):
    _starve(monkeypatch, catalog)
    sc = scmod.get(sid)
    rt = {"S2": "asyncio-streams"}.get(sid, "callback")
    _, verdicts, errors = _judged(sc, rt)
    assert verdicts and all(v is None for v in verdicts.values()), verdicts
    assert errors and all(e.startswith("not measured") for e in errors), errors


def test_every_zoo_entry_starved_is_not_measured(monkeypatch):
    zoo = _zoo()
    from bench.zoo import buffers, cancel, drain, frameworks, limits, shutdown, tls
    for module in (buffers, cancel, drain, frameworks, limits, shutdown, tls):
        _starve(monkeypatch, module)
    for e in zoo.ENTRIES.values():
        style_rt = {"callback": "callback", "stream": "asyncio-streams", "task": "coro"}
        _, verdicts, errors = _judged(e.scenario, style_rt[e.styles[0]])
        assert verdicts == {"bug_shown": None}, (e.id, verdicts)
        assert any("not measured" in x for x in errors), (e.id, errors)


def test_every_builtin_and_zoo_verdict_names_its_evidence():
    zoo = _zoo()
    scs = [scmod.get(f"S{i}") for i in range(1, 9)] + [e.scenario for e in zoo.ENTRIES.values()]
    # uvloop-631's symptom is a byte that never arrives (no metric to require): its
    # oracle is "not measured" when the reader was cut by its own deadline instead.
    for sc in scs:
        assert sc.minimum or sc.decided_by or sc.id == "uvloop-631", sc.id
        assert sc.problems() == [], sc.id


def _user(run, **kw):
    return scmod.Scenario(id="T-ev", title="t", summary="s", run=run, presets={"q": {"rate_Bps": 100}},
                          metrics=[scmod.Metric("rate_Bps", None, ceiling=lambda p: 2 * p["rate_Bps"]),
                                   scmod.Metric("done_count", None)],
                          verdicts={"ok": "fine"}, **kw)


def test_a_user_oracle_returning_none_is_not_measured():
    sc = _user(lambda ctx: None)
    _, verdicts, errors = sc.judge({"rate_Bps": 100}, {"done_count": 3}, {"ok": None})
    assert verdicts == {"ok": None} and "no evidence" in errors[0]
    # and a measured one stays a boolean
    _, verdicts, errors = sc.judge({"rate_Bps": 100}, {"done_count": 3}, {"ok": 1})
    assert verdicts == {"ok": True} and errors == []


def test_below_the_minimum_and_an_impossible_figure_are_errors():
    sc = _user(None, minimum=(scmod.Minimum("done_count", 2, "two requests answered"),),
               decided_by={"ok": ("rate_Bps",)})
    metrics, verdicts, errors = sc.judge({"rate_Bps": 100}, {"done_count": 1, "rate_Bps": 150},
                                         {"ok": True})
    assert verdicts == {"ok": None} and "done_count was 1" in errors[0] and "two requests" in errors[0]
    metrics, verdicts, errors = sc.judge({"rate_Bps": 100}, {"done_count": 5, "rate_Bps": 1.5e9},
                                         {"ok": True})
    assert metrics["rate_Bps"] is None and verdicts == {"ok": None}
    assert any(e.startswith("implausible: rate_Bps") for e in errors)


def test_merged_repeats_fold_false_over_none_over_true():
    a = results.new_cell("S1", "coro", "naive", verdicts={"x": True, "y": None, "z": True})
    b = results.new_cell("S1", "coro", "naive", verdicts={"x": None, "y": False, "z": True})
    merged = results.document._merge_cells(a, b, "ra", "rb")
    assert merged["verdicts"] == {"x": None, "y": False, "z": True}


def test_a_null_verdict_validates_and_reads_as_not_measured():
    cell = results.new_cell("S1", "coro", "naive", verdicts={"bounded": None},
                            errors=["not measured: too little activity"], load={"start": [1.0, 1.0, 1.0]})
    doc = results.new_document([cell], run_id="r", env={})
    assert results.validate(doc) == []
    assert results.verdict_word(None) == "not measured"
    doc["schema"] = 1                         # an old document still reads
    assert results.check_document(doc)


@pytest.mark.timeout(300)
def test_more_jobs_than_cores_never_passes_on_no_data(tmp_path):
    """S1 at --jobs 9: each cell is not measured (an error, exit 1) or has real evidence."""
    out = tmp_path / "r"
    proc = subprocess.run([sys.executable, "-m", "bench", "run", "--scenarios", "S1", "--variants",
                           "naive", "--runtimes", "callback,coro,trio", "--preset", "tiny",
                           "--jobs", "9", "--out", str(out)],
                          capture_output=True, text=True, timeout=280)
    assert "more than this machine's" in proc.stderr or "--jobs 9" not in proc.stderr
    doc = json.loads((out / "results.json").read_text())
    assert len(doc["cells"]) == 3
    for c in doc["cells"]:
        assert c["load"]["start"] is not None
        v = c["verdicts"].get("bounded")
        if v is None:
            assert any(e.startswith("not measured") for e in c["errors"]), c
            assert proc.returncode == 1
        else:
            assert c["metrics"]["delivered_bytes"] >= 1_000_000 * 1.0 / 8, c
            assert c["metrics"]["in_flight_at_end_bytes"] is not None


ERROR_KEY_SCENARIO = '''
from bench.scenarios.api import Metric, Scenario


def program(job):
    return {"error": "a field of the program's own", "done_count": 1}


def run(ctx):
    from bench.scenarios.api import run_program
    ran = run_program(ctx, max_s=10)
    return ({"done_count": ran.app["done_count"]}, {"ok": ran.app["error"].startswith("a field")}, [])


SCENARIO = Scenario(id="T-errkey", title="t", summary="s", run=run, programs={"*": program},
                    metrics=[Metric("done_count", None)], verdicts={"ok": "the key came back"},
                    presets={"tiny": {}})
'''


@pytest.mark.timeout(120)
def test_a_program_result_key_named_error_is_data_not_a_crash(tmp_path):
    path = tmp_path / "errkey.py"
    path.write_text(ERROR_KEY_SCENARIO)
    scmod.load_scenario_file(str(path))
    [cell] = scenarios.plan("T-errkey", "coro", None, "tiny")
    result = scenarios.run_cell(cell)
    assert result["errors"] == [] and result["verdicts"] == {"ok": True}, result


def test_compare_says_not_measured_rather_than_a_fix_or_regression():
    from bench.results import compare
    old = results.new_document([results.new_cell("S1", "coro", "naive", verdicts={"bounded": True})],
                               run_id="a", env={})
    new = results.new_document([results.new_cell("S1", "coro", "naive", verdicts={"bounded": None})],
                               run_id="b", env={})
    [row] = compare.verdict_changes(old, new)
    assert row["status"] == "not-measured"


def test_the_report_questions_read_declarations_not_verdict_names():
    """A latency verdict named ``*_bounded`` is not a buffer that grew; a byte-metric
    verdict with any name is, and a not-measured one answers neither way."""
    import re
    from bench.report import html
    sc = {"title": "t", "variants": ["naive"], "columns": [], "verdicts": {"latency_bounded": "x",
                                                                           "kept_small": "y"},
          "metrics": {"worst_s": {"unit": "seconds", "direction": "lower"},
                      "backlog_bytes": {"unit": "bytes", "direction": "lower"}},
          "decided_by": {"latency_bounded": ["worst_s"], "kept_small": ["backlog_bytes"]}}

    def cell(rt, verdicts):
        return results.new_cell("U9", rt, "naive", metrics={"worst_s": 1.0, "backlog_bytes": 9e6},
                                verdicts=verdicts, style="task", preset="tiny")
    doc = results.new_document([cell("coro", {"latency_bounded": False, "kept_small": True}),
                                cell("trio", {"latency_bounded": True, "kept_small": False}),
                                cell("curio", {"latency_bounded": True, "kept_small": None})],
                               run_id="q", env={}, scenarios={"U9": sc})
    text = html.render_html(doc)
    answers = re.search(r'<div class="answers">(.*?)</div>', text, re.S).group(1)
    grow = answers.split("grow without bound?")[1].split("Which lose data")[0]
    failing = grow.split("somewhere:")[1].split(".")[0]
    assert "trio" in failing and "coro" not in failing and "curio" not in failing, grow


# ---------------------------------------------------------------------------
# A server that dies is a finding, not missing evidence

def test_a_peer_the_app_never_served_because_it_was_gone_is_marked_with_the_cause():
    from bench.scenarios.context import mark_app_gone
    peers = {"refused": {"connected": False, "ended": "error",
                         "error": "Connection refused [errno 111]", "ran_s": 0.01},
             "left": {"connected": False, "ended": "timeout", "ran_s": 3.0},
             "starved": {"connected": False, "ended": "timeout", "ran_s": 3.0},
             "served": {"connected": True, "ended": "eof", "ran_s": 1.0}}
    # the app ended 1 s in: "left" waited 2 s more for it (the app was gone)
    mark_app_gone({k: peers[k] for k in ("refused", "left", "served")}, started_at=100.0,
                  app_ended_at=101.0, ended_how="its program returned")
    # an app that ended after the peer's own time ran out: the peer starved, no finding
    mark_app_gone({"starved": peers["starved"]}, started_at=100.0, app_ended_at=103.2)
    assert "stopped accepting" in peers["refused"]["app_gone"]
    assert "its program returned 1.00 s in" in peers["left"]["app_gone"]
    assert "app_gone" not in peers["starved"] and "app_gone" not in peers["served"]


def test_a_gone_app_lets_the_verdicts_stand_and_a_starved_cell_stays_not_measured():
    sc = _user(None)
    gone = {"healthy": {"connected": False, "ended": "timeout", "app_gone": "the app had ended"}}
    _, verdicts, errors = sc.judge({"rate_Bps": 100}, {"done_count": 1}, {"ok": False}, gone)
    assert verdicts == {"ok": False} and errors == []
    assert sc.app_gone_notes(gone) == ["peer 'healthy' never got its connection: the app had ended"]
    starved = {"healthy": dict(STARVED_PEER)}
    _, verdicts, errors = sc.judge({"rate_Bps": 100}, {"done_count": 1}, {"ok": False}, starved)
    assert verdicts == {"ok": None} and errors[0].startswith("not measured: too little activity")


CRASHES_ON_RESET = '''
from bench import peers
from bench.scenarios.api import Metric, Scenario, run_program


async def serve(port, host, tcp_port, n):
    stream = await port.open_tcp_stream(host, tcp_port)
    try:
        while True:
            await stream.send_all(b"x" * n)
    finally:
        await stream.aclose()


async def main(port, job):
    # one connection after the other; the handler raises on a reset and ends the app
    await serve(port, *job.peer("reset"), 65536)
    await serve(port, *job.peer("healthy"), 1000)


def program(job):
    port = job.runtime.open()
    try:
        port.run(main, job)
    except Exception as exc:
        return {"crashed": type(exc).__name__}
    finally:
        port.close()
    return {"crashed": ""}


def run(ctx):
    ran = run_program(ctx, max_s=3, peers=[
        peers.reset_peer(name="reset", listen="127.0.0.1:0", after_bytes=100_000),
        peers.reader(name="healthy", listen="127.0.0.1:0", max_s=3)])
    got = ran.peers["healthy"]["received_bytes"]
    return ({"healthy_bytes": got}, {"still_serving": got > 0}, [])


SCENARIO = Scenario(
    id="C8", title="crash on reset", summary="A reset ends the app. Is the healthy peer served?",
    run=run, programs={"task": program}, styles=("task",),
    metrics=[Metric("healthy_bytes", "higher")],
    verdicts={"still_serving": "the healthy peer got bytes"}, presets={"tiny": {}})
'''


@pytest.mark.timeout(180)
@pytest.mark.parametrize("net", ["sim", "real"])
def test_an_app_that_dies_after_a_reset_fails_its_verdict_with_the_cause(tmp_path, net):
    """The issue's C8: the app's handler raises on a reset, so its healthy peer never
    connects. That is the measurement (still_serving fails, the note says why), not
    "not measured: too little activity"."""
    path = tmp_path / "c8.py"
    path.write_text(CRASHES_ON_RESET)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "bench", "run", "--net", net, "--scenario-file",
                           str(path), "--scenarios", "C8", "--runtimes", "coro,trio",
                           "--preset", "tiny", "--out", str(out)],
                          capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stderr
    cells = json.loads((out / "results.json").read_text())["cells"]
    assert [c["runtime"] for c in cells] == ["coro", "trio"]
    for c in cells:
        assert c["verdicts"] == {"still_serving": False} and c["errors"] == [], c
        assert any(n.startswith("peer 'healthy' never got its connection: the app had ended")
                   for n in c["notes"]), c["notes"]
    assert "still_serving=NO" in proc.stdout and "not measured" not in proc.stdout
