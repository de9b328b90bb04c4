"""Scenarios on the simulated network (``looplab run --net sim``, ``bench.simcells``).

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

from bench import scenarios, simcells

pytestmark = pytest.mark.timeout(120)

OURS = "callback,hybrid,coro"
WALL = ("cell_wall_s",)


def sim_cells(sids, runtimes=OURS, variants=None, preset="tiny", world=None):
    cells = scenarios.plan(sids, runtimes, variants, preset)
    for c in cells:
        c.params["net"] = "sim"
        c.world = world
    return cells


def strip_wall(result: dict) -> dict:
    out = json.loads(json.dumps(result))
    for name in WALL:
        out["metrics"].pop(name, None)
        out["samples"].pop(name, None)
    return out


def test_a_sim_cell_has_its_own_id_records_its_universe_and_sim_time():
    cell = sim_cells("S1", "callback", "naive")[0]
    assert cell.id == "S1/callback/naive/tiny/sim"
    r = scenarios.run_cell(cell)
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
        a, b = scenarios.run_cell(cell), scenarios.run_cell(cell)
        assert not a["errors"], a["errors"]
        assert json.dumps(strip_wall(a), sort_keys=True) == json.dumps(strip_wall(b), sort_keys=True)


def test_a_universe_replays_its_cell_exactly():
    cell = sim_cells("S3", "hybrid", "naive", world={"seed": 5, "params": {"jitter_s": 2e-5}})[0]
    first = scenarios.run_cell(cell)
    again = simcells.cell_from_universe(json.loads(json.dumps(first["universe"])))
    assert again.id == cell.id
    second = scenarios.run_cell(again)
    assert strip_wall(first) == strip_wall(second)


def test_a_runtime_without_a_sim_port_is_skipped_with_the_reason():
    cell = sim_cells("S1", "asyncio-protocol", "naive")[0]
    r = scenarios.run_cell(cell)
    assert "real network" in r["skipped"]


def test_a_bad_universe_is_refused():
    with pytest.raises(ValueError):
        simcells.cell_from_universe({"model": "something else"})


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sid", ["S1", "S3"])
def test_verdicts_under_sim_equal_verdicts_on_real_sockets(sid):
    """The differential check at the tiny preset, every variant on our kernels."""
    real = {c.id: scenarios.run_cell(c) for c in scenarios.plan(sid, OURS, None, "tiny")}
    for cell in sim_cells(sid):
        sim = scenarios.run_cell(cell)
        assert not sim["errors"], (cell.id, sim["errors"])
        twin = real[cell.id.rsplit("/", 1)[0]]
        assert not twin["errors"], (cell.id, twin["errors"])
        assert sim["verdicts"] == twin["verdicts"], (cell.id, sim["verdicts"], twin["verdicts"])
