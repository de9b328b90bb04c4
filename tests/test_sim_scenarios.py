"""Scenarios on the simulated network (``looplab run --net sim``, ``bench.scenarios.simulated``).

The app is the same driver or program code as on real sockets, opened on the
world's seam; the peers are in-world roles. These tests check that a sim cell
runs without touching a real socket, that it is a pure function of its
universe (same universe, same results, byte for byte apart from wall-clock
fields), that a universe replays, and -- the differential check -- that its
verdicts equal the real network's for S1 and S3 at the tiny preset.
"""
from __future__ import annotations

import json

import pytest

from bench import run as matrix
from bench.scenarios import simulated as simcells
from bench.run import seeds as simruns

pytestmark = pytest.mark.timeout(120)

OURS = "callback,hybrid,coro"
WALL = ("cell_wall_s", "cell_cpu_s")


def sim_cells(sids, runtimes=OURS, variants=None, preset="tiny", world=None):
    cells = matrix.plan(sids, runtimes, variants, preset)
    for c in cells:
        c.params["net"] = "sim"
        c.world = world
    return cells


def strip_wall(result: dict) -> dict:
    out = json.loads(json.dumps(result))
    for name in WALL:
        out["metrics"].pop(name, None)
        out["samples"].pop(name, None)
    out.pop("load", None)            # the machine's load averages while the cell ran
    return out


def test_a_sim_cell_has_its_own_id_records_its_universe_and_sim_time():
    cell = sim_cells("S1", "callback", "naive")[0]
    assert cell.id == "S1/callback/naive/tiny/sim"
    r = matrix.run_cell(cell)
    assert not r["errors"], r["errors"]
    u = r["universe"]
    assert u["model"] == simcells.UNIVERSE_MODEL and u["runtime"] == "callback"
    assert u["net"]["model"] == "looplab.simnet" and "latency_s" in u["net"]["params"]
    # the source runs 1 s, the sink is bounded at duration + grace: virtual time moved
    assert 1.0 <= r["metrics"]["sim_s"] <= 3.0
    assert r["metrics"]["rss_growth_bytes"] is None
    assert r["metrics"]["delivered_bytes"] > 500_000


def test_the_same_universe_gives_identical_results():
    for cell in sim_cells("S1,S3", OURS, "naive"):
        a, b = matrix.run_cell(cell), matrix.run_cell(cell)
        assert not a["errors"], a["errors"]
        assert json.dumps(strip_wall(a), sort_keys=True) == json.dumps(strip_wall(b), sort_keys=True)


def test_a_universe_replays_its_cell_exactly():
    cell = sim_cells("S3", "hybrid", "naive", world={"seed": 5, "params": {"jitter_s": 2e-5}})[0]
    first = matrix.run_cell(cell)
    again = simruns.cell_from_universe(json.loads(json.dumps(first["universe"])))
    assert again.id == cell.id
    second = matrix.run_cell(again)
    assert strip_wall(first) == strip_wall(second)


def test_a_runtime_without_a_sim_port_is_skipped_with_the_reason():
    pytest.importorskip("uvloop")
    cell = sim_cells("S1", "uvloop-protocol", "naive")[0]
    r = matrix.run_cell(cell)
    assert "real network" in r["skipped"] and "uvloop" in r["skipped"]


def test_a_bad_universe_is_refused():
    with pytest.raises(ValueError):
        simruns.cell_from_universe({"model": "something else"})


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sid", ["S1", "S3"])
def test_verdicts_under_sim_equal_verdicts_on_real_sockets(sid):
    """The differential check at the tiny preset, every variant on our kernels,
    on asyncio (its own selector loop and transports over SimSelector) and on
    trio (a custom Clock and simulated trio sockets)."""
    runtimes = OURS + ",asyncio-protocol,asyncio-streams"
    try:
        import trio  # noqa: F401
        runtimes += ",trio"
    except ImportError:
        pass
    real = {c.id: matrix.run_cell(c) for c in matrix.plan(sid, runtimes, None, "tiny")}
    for cell in sim_cells(sid, runtimes):
        sim = matrix.run_cell(cell)
        assert not sim["errors"], (cell.id, sim["errors"])
        twin = real[cell.id.rsplit("/", 1)[0]]
        assert not twin["errors"], (cell.id, twin["errors"])
        assert sim["verdicts"] == twin["verdicts"], (cell.id, sim["verdicts"], twin["verdicts"])


# ---------------------------------------------------------------------------
# The run verb: --net sim twice, --replay, --seeds

ENV_WALL = ("loadavg", "time_utc")


@pytest.fixture(scope="module", autouse=True)
def _fonts_loaded():
    """The report's plots keep a font file open for the process's life: open it
    before the leak check's first look."""
    try:
        import io as _io
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        yield
        return
    fig = plt.figure()
    fig.text(0.5, 0.5, "x")
    fig.savefig(_io.BytesIO(), format="png")
    plt.close(fig)
    yield


def _cli(*argv):
    from bench.cli import main
    return main(list(argv))


def _without_wall_clock(doc: dict) -> str:
    doc = json.loads(json.dumps(doc))
    doc.pop("run_id", None)
    for k in ENV_WALL:
        doc.get("env", {}).pop(k, None)
    doc["cells"] = [strip_wall(c) for c in doc["cells"]]
    return json.dumps(doc, sort_keys=True)


def test_run_net_sim_twice_gives_byte_identical_results_apart_from_wall_clock(tmp_path):
    docs = []
    for i in (1, 2):
        path = tmp_path / f"r{i}.json"
        assert _cli("run", "--net", "sim", "--scenarios", "S1,S3", "--runtimes", OURS,
                    "--variants", "naive,drain", "--preset", "tiny",
                    "--out", str(tmp_path / f"out{i}"), "--json", str(path)) == 0
        docs.append(json.loads(path.read_text()))
    assert len(docs[0]["cells"]) == 9
    assert all(c.get("universe") for c in docs[0]["cells"])
    assert _without_wall_clock(docs[0]) == _without_wall_clock(docs[1])

    replayed = tmp_path / "replayed.json"
    assert _cli("run", "--replay", str(tmp_path / "r1.json"), "--out", str(tmp_path / "out3"),
                "--json", str(replayed)) == 0
    assert _without_wall_clock(json.loads(replayed.read_text())) == _without_wall_clock(docs[0])


def test_run_net_both_puts_real_and_sim_side_by_side_and_skips_runtimes_without_a_sim_port(tmp_path):
    pytest.importorskip("uvloop")
    from bench.run.plan import plan
    import argparse
    args = argparse.Namespace(net="both", seeds=None, replay=None)
    cells = simruns.cells_for(args, plan("S3", "callback,uvloop-protocol", "naive", "tiny"))
    assert [c.id for c in cells] == ["S3/callback/naive/tiny", "S3/callback/naive/tiny/sim",
                                     "S3/uvloop-protocol/naive/tiny",
                                     "S3/uvloop-protocol/naive/tiny/sim"]
    skipped = matrix.run_cell(cells[3])
    assert skipped.get("skipped"), skipped
    assert "real network" in str(skipped.get("skipped")), skipped


def test_bad_net_options_are_one_line_usage_errors(tmp_path, capsys):
    assert _cli("run", "--seeds", "3", "--scenarios", "S3", "--runtimes", "coro",
                "--out", str(tmp_path / "o")) == 2
    assert "--net sim" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert _cli("run", "--replay", str(bad), "--out", str(tmp_path / "o2")) == 2
    assert "no simulated universe" in capsys.readouterr().err


def test_seeds_count_outcomes_and_a_failing_universe_replays(tmp_path, capsys):
    out = tmp_path / "ex"
    assert _cli("run", "--net", "sim", "--seeds", "6", "--faults", "2", "--scenarios", "S3",
                "--runtimes", "callback", "--variants", "drain", "--preset", "tiny",
                "--out", str(out)) == 0
    ex = json.loads((out / "explore.json").read_text())["explorations"][0]
    assert sum(ex["outcomes"].values()) == 6
    if ex.get("failing"):
        f = ex["failing"]
        assert f["faults_after"] <= f["faults_before"] <= 2
        assert f["replayed_outcome"] == f["outcome"]
        cell = simruns.cell_from_universe(json.loads(open(f["file"]).read()))
        assert simruns.outcome_of(matrix.run_cell(cell)) == f["outcome"]


def test_shrinking_keeps_only_the_faults_a_failure_needs():
    u = {"net": {"faults": [{"kind": k, "at": i} for i, k in enumerate("abcde")]}}
    needed = {"b", "d"}

    def fails(trial):
        return needed <= {f["kind"] for f in trial["net"]["faults"]}
    shrunk, runs = simruns.shrink(None, u, fails)
    assert [f["kind"] for f in shrunk["net"]["faults"]] == ["b", "d"]
    assert runs >= 3


def test_trio_runs_in_virtual_time_and_stops_when_its_peers_are_done():
    pytest.importorskip("trio")
    r = matrix.run_cell(sim_cells("S5", "trio", "naive")[0])
    assert not r["errors"], r["errors"]
    # the pipelining client holds 0.8 s; the server is stopped right after, not at its bound
    assert 0.8 <= r["metrics"]["sim_s"] < 1.0


def test_coro_seeds_vary_the_ready_order_and_others_keep_their_spec():
    assert simruns.with_ready_order("coro", 7) == "coro:ready_order=random-7"
    assert simruns.with_ready_order("coro:ready_order=random-3", 7) == "coro:ready_order=random-3"
    assert simruns.with_ready_order("callback", 7) == "callback"


# ---------------------------------------------------------------------------
# Stopping a simulated run, and --repeat (issue 23)

def test_repeat_under_sim_is_refused_with_a_pointer_to_seeds(tmp_path, capsys):
    """Every repeat of a sim cell is the same universe, so --repeat is refused
    under sim (one line, exit 2, before anything runs) and --seeds named."""
    for net in ("sim", "both"):
        assert _cli("run", "--net", net, "--repeat", "3", "--scenarios", "S3", "--runtimes",
                    "callback", "--variants", "naive", "--preset", "tiny",
                    "--out", str(tmp_path / net)) == 2
        err = capsys.readouterr().err
        assert "--seeds" in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / net / "results.json").exists()


def test_the_watchdog_ends_a_sim_cell_as_an_error_that_keeps_its_universe(monkeypatch):
    monkeypatch.setattr(simcells, "WATCHDOG_S", 0.0)
    r = matrix.run_cell(sim_cells("S1", "callback", "naive")[0])
    assert any("SimStopped" in e and "watchdog" in e for e in r["errors"]), r["errors"]
    again = simruns.cell_from_universe(r["universe"])        # what --replay reruns
    monkeypatch.setattr(simcells, "WATCHDOG_S", 300.0)
    assert not matrix.run_cell(again)["errors"]


def test_an_interrupted_matrix_stops_the_simulated_cells_it_runs():
    """``abort_running`` (the matrix's answer to SIGINT/SIGTERM) stops every
    live world, so a spinning sim cell cannot hold the run open."""
    from bench.scenarios import api as scmod
    from kernels.simnet import SimStopped
    cell = simcells.cell_world(sim_cells("S1", "callback", "naive")[0], 0, {})

    def tick():
        cell.world.call_later(1e-3, tick)
    cell.world.call_later(0, tick)
    scmod.abort_running()
    with pytest.raises(SimStopped, match="interrupted"):
        cell.world.run()


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_signal_stops_a_seeds_exploration_and_keeps_what_finished(tmp_path, sig):
    import os
    import signal
    import subprocess
    import sys
    import time
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / "ex"
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench", "run", "--net", "sim", "--seeds", "100000", "--scenarios",
         "S1", "--variants", "naive", "--runtimes", "trio", "--preset", "tiny",
         "--out", str(out)], cwd=root, env={**os.environ, "PYTHONPATH": root},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(4.0)
        proc.send_signal(getattr(signal, sig))
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, (proc.returncode, stderr[-2000:])
    assert "interrupted" in stderr and "explore.json" in stderr, stderr[-2000:]
    assert "Traceback" not in stderr, stderr[-2000:]
    doc = json.loads((out / "explore.json").read_text())
    assert doc["interrupted"] is True


TINY_ONLY_SCENARIO = '''
from bench.scenarios.api import Metric, Scenario


def program(job):
    return {"done_count": 1}


def run(ctx):
    from bench.scenarios.api import run_program
    ran = run_program(ctx, max_s=10)
    return {"done_count": ran.app["done_count"]}, {"ok": True}, []


SCENARIO = Scenario(id="T-tinyonly", title="t", summary="s", run=run, programs={"*": program},
                    metrics=[Metric("done_count", None)], verdicts={"ok": "ran"},
                    presets={"tiny": {}})
'''


def test_a_replay_plans_no_default_matrix(tmp_path):
    """A replay runs the file's cells: a user scenario loaded beside it that has no
    'quick' preset (the default matrix's) once made the replay refuse."""
    user = tmp_path / "tinyonly.py"
    user.write_text(TINY_ONLY_SCENARIO)
    first = tmp_path / "r.json"
    assert _cli("run", "--net", "sim", "--scenarios", "S3", "--runtimes", "coro",
                "--variants", "naive", "--preset", "tiny", "--out", str(tmp_path / "o1"),
                "--json", str(first)) == 0
    again = tmp_path / "again.json"
    assert _cli("run", "--scenario-file", str(user), "--replay", str(first),
                "--out", str(tmp_path / "o2"), "--json", str(again)) == 0
    cells = json.loads(again.read_text())["cells"]
    assert [c["scenario"] for c in cells] == ["S3"]
