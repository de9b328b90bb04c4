"""The bug zoo on the simulated network (``looplab repro --net sim|both``) and the
report's ``net`` column.

Every entry that runs on the simulated network runs at the tiny preset there, and
its oracle is checked both ways as ``tests/test_zoo.py`` checks it on real sockets:
the naive program shows the bug and the fixed one does not on a runtime where the
entry says it shows, and each option flip does what it claims. A sim cell is one
process and one world, so these run in this process (one at a time), each bounded
by its world's virtual time and by an explicit test timeout; the same cell twice
gives the same result. The entries whose oracle reads the real machine are skipped
cells with their reason. The report tests use hand-made documents for the tables
and one small ``--net both`` run for the page in headless Chromium.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import pytest
from test_html import CHROMIUM, _png_summary, _run_browser, check_page, grid_of

from bench.report import html as report_html
from bench import peers
from bench import report
from bench import results as resmod
from bench.scenarios import api as scmod
from bench import run as matrix
from bench.scenarios import simulated as simcells
from bench.run import seeds as simruns
from bench.cli import main as looplab
from bench import runtimes as rtmod

scmod.load_plugins(modules=("bench.zoo",))
from bench import zoo  # noqa: E402 -- loaded as a scenario module first, as the verb does

ON_SIM = [eid for eid, e in zoo.ENTRIES.items() if not e.real_only]
REAL_ONLY = [eid for eid, e in zoo.ENTRIES.items() if e.real_only]
UVLOOP_NOTE = "uvloop runs only on the real network"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _sim_ok(spec: str) -> bool:
    rt = rtmod.parse(spec)
    return rt.available() and rt.real_network_only() is None


def expectations(e) -> dict:
    """(runtime spec, variant) -> the bug_shown a real-socket run gives (what
    test_zoo checks there): both variants where the entry shows, each flip's
    claim, and a showing flip's kernel at its defaults not showing it."""
    on = next(s for s in e.show_on if _sim_ok(s))
    out = {(on, "naive"): True, (on, "fixed"): False}
    for f in e.flips:
        out.setdefault((f.spec, "naive"), f.shows)
        if f.shows:
            out.setdefault((f.spec.split(":")[0], "naive"), False)
    return out


def sim_cell(eid, spec, variant, world=None):
    [cell] = matrix.plan(eid, spec, variant, "tiny")
    cell.params["net"] = "sim"
    cell.world = world
    return cell


def without_wall(result: dict) -> str:
    r = json.loads(json.dumps(result))
    for k in simruns.WALL_CLOCK:
        r["metrics"].pop(k, None)
        r["samples"].pop(k, None)
    r.pop("load", None)              # the machine's load averages while the cell ran
    return json.dumps(r, sort_keys=True)


def run(argv, capsys):
    try:
        rc = looplab(argv)
    except SystemExit as exc:       # argparse errors exit from the parser
        rc = exc.code
    out = capsys.readouterr()
    return rc, out.out, out.err


# ---------------------------------------------------------------------------
# every entry that can, on the simulated network

def test_the_entries_split_into_sim_and_real_only_with_a_reason():
    assert len(ON_SIM) >= 20 and len(ON_SIM) + len(REAL_ONLY) == len(zoo.ENTRIES)
    for eid in REAL_ONLY:
        why = zoo.ENTRIES[eid].sim_skip()
        assert why.startswith(f"{eid} runs only on the real network: ") and len(why) > 80
    for eid in ON_SIM:
        assert zoo.ENTRIES[eid].sim_skip() is None


@pytest.mark.timeout(90)
@pytest.mark.parametrize("eid", ON_SIM)
def test_oracle_both_ways_on_the_simulated_network(eid):
    e = zoo.ENTRIES[eid]
    want = expectations(e)
    for (spec, variant), expected in want.items():
        r = matrix.run_cell(sim_cell(eid, spec, variant))
        assert not r.get("skipped") and not r["errors"], (spec, variant, r.get("skipped"), r["errors"])
        assert r["universe"]["scenario"] == eid and r["metrics"]["sim_s"] >= 0
        assert r["verdicts"]["bug_shown"] is expected, (spec, variant, r["metrics"], r["notes"])
    # a pure function of its universe: the showing cell again, byte for byte
    spec = next(s for (s, v), shown in want.items() if shown and v == "naive")
    cell = sim_cell(eid, spec, "naive", world={"seed": 3})
    assert without_wall(matrix.run_cell(cell)) == without_wall(matrix.run_cell(cell))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("eid", REAL_ONLY)
def test_a_real_only_entry_is_a_skipped_cell_under_repro_and_a_note_under_run(eid, capsys):
    e = zoo.ENTRIES[eid]
    spec = {"callback": "callback", "stream": "hybrid", "task": "coro"}[e.styles[0]]
    rc, out, err = run(["repro", eid, "--net", "sim", "--runtimes", spec], capsys)
    # every cell skipped: no cell measured anything, which is not a pass (exit 1)
    assert rc == 1 and err.splitlines()[-1].startswith("looplab: no cell measured anything"), err
    assert f"verdict: not run: {e.sim_skip()}" in out
    assert f"{eid}/{spec}/naive/tiny/sim: skipped: {eid} runs only on the real network" in err
    # looplab run knows nothing of the zoo: the cell runs, and its note says why its
    # numbers are not part of the universe there
    r = matrix.run_cell(sim_cell(eid, spec, "fixed"))
    # no crash: at most "not measured" (a TLS entry on our kernels, which have no TLS)
    assert all(e.startswith("not measured") for e in r["errors"]), r["errors"]
    assert any("not part of its universe" in n for n in r["notes"]), r["notes"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("spec", ["callback", "hybrid", "coro", "asyncio-protocol",
                                  "asyncio-streams", "trio", "curio"])
def test_the_echo_client_role_plays_in_the_world(spec):
    """bench.peers' last role without an in-world twin: it sends a pattern, checks
    the echo byte for byte, half-closes and waits for the server's EOF."""
    rt = rtmod.parse(spec)
    assert simcells.sim_capable(rt) is None          # (and puts trio on the world, as run_cell does)
    sc = scmod.Scenario(id="echo-check", title="echo", summary="echo", run=None, verdicts={},
                        presets={"tiny": {}})
    ctx = scmod.CellContext(sc, rt, "naive", "tiny", {})
    ctx.sim = simcells.SimCell(simcells.new_world(7))
    total = 700_001                        # not a multiple of the chunk, nor of the pattern
    app, roles = simcells.serve_app(ctx, "echo", params={"sockbuf": 65536}, bound=20,
                                    peers=[peers.echo_client(connect=scmod.APP, total_bytes=total,
                                                             chunk_bytes=10_000, max_s=10)])
    c = roles["client"]
    assert c["ok"] is True and c["mismatch_at"] is None, c
    assert c["sent_bytes"] == c["received_bytes"] == total and c["ended"] == "eof"
    assert ctx.sim.world.now < 10          # it ended by the server's EOF, not by its bound


# ---------------------------------------------------------------------------
# looplab repro --net both | --seeds | --replay

@pytest.mark.timeout(120)
def test_repro_net_both_puts_real_and_sim_side_by_side_with_equal_verdicts(tmp_path, capsys):
    js = tmp_path / "r.json"
    rc, out, err = run(["repro", "trio-412", "--runtimes", "callback,coro,uvloop-protocol", "--net",
                        "both", "--jobs", "2", "--json", str(js), "--out", str(tmp_path / "rep")], capsys)
    assert rc == 0, err
    lines = out.splitlines()
    header = next(ln for ln in lines if ln.startswith("runtime"))
    assert header.split()[:4] == ["runtime", "net", "naive", "fixed"]
    rows = [ln.split() for ln in lines if ln.split()[:1] in (["callback"], ["coro"], ["uvloop-protocol"])]
    assert [r[:2] for r in rows] == [["callback", "real"], ["callback", "sim"], ["coro", "real"],
                                     ["coro", "sim"], ["uvloop-protocol", "real"], ["uvloop-protocol", "sim"]]
    assert rows[-1][2:4] == ["skipped", "skipped"]
    doc = json.loads(js.read_text())
    assert resmod.validate(doc) == []
    [bug] = doc["zoo"]["bugs"]
    assert bug["net"] == "both"
    assert bug["sim"] == {"compared": ["callback", "coro"], "differ_on": [], "skipped_on": ["uvloop-protocol"]}
    assert "simulated network: the same verdicts on 2 of 2 runtimes, skipped on uvloop-protocol" in out
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "## Bug zoo" in md and "shown / shown" in md and UVLOOP_NOTE in md


@pytest.mark.timeout(120)
def test_repro_seeds_explores_one_entry_and_its_universe_replays(tmp_path, capsys):
    out_dir = tmp_path / "ex"
    rc, out, err = run(["repro", "asyncio-466", "--runtimes", "hybrid", "--net", "sim", "--seeds", "6",
                        "--faults", "1", "--out", str(out_dir)], capsys)
    explored = json.loads((out_dir / "explore.json").read_text())["explorations"]
    # the exit of a plain run, over universes: 1 when one ended in an error
    errored = any(o.startswith("error: ") for x in explored for o in x["outcomes"])
    assert rc == (1 if errored else 0), err
    assert [x["cell"] for x in explored] == ["asyncio-466/hybrid/naive/tiny/sim",
                                             "asyncio-466/hybrid/fixed/tiny/sim"]
    for x in explored:
        assert sum(x["outcomes"].values()) == 6 and x["random_faults"] == 1
        # a fault that keeps EOF from the reader until its own deadline leaves the
        # oracle without evidence: "not measured", neither shown nor not shown
        assert {o for o in x["outcomes"] if not o.startswith("error: not measured")} \
            <= {"bug_shown=yes", "bug_shown=NO"}, x["outcomes"]
        assert f"{x['cell']}: 6 seeds in" in out
    # the universe kept is one where the bug showed (the naive program's usual
    # outcome; the fixed program never shows it): shrunk to the faults it needs,
    # written, and it replays to that outcome
    kept = {x["cell"].split("/")[2]: x.get("failing") for x in explored}
    assert kept["fixed"] is None and "bug_shown=yes" not in explored[1]["outcomes"], explored[1]
    f = kept["naive"]
    assert f, explored[0]["outcomes"]
    assert f["replayed_outcome"] == f["outcome"] == "bug_shown=yes" and os.path.exists(f["file"])
    assert f["faults_after"] <= f["faults_before"] == 1
    rc, out, err = run(["repro", "--replay", f["file"]], capsys)
    assert rc == 0, err
    cell_id = f["shrunk_universe"]["scenario"] + "/"
    assert f"replayed {cell_id}" in out and "bug shown" in out


@pytest.mark.parametrize("argv, needle", [
    (["repro", "C6", "--net", "moon"], "invalid choice: 'moon'"),
    (["repro", "C6", "--seeds", "3"], "give it with --net sim"),
    (["repro", "C6", "--net", "sim", "--seeds", "0"], "must be >= 1"),
    (["repro", "C6", "--faults", "2"], "--faults draws faults for each seed"),
    (["repro", "C6", "--net", "sim", "--seeds", "2", "--faults", "-1"], "must be >= 0"),
    (["repro", "C6", "--replay", "x.json"], "give no bug and no --all"),
    (["repro", "--replay", "/nonexistent/u.json"], "--replay /nonexistent/u.json"),
])
def test_repro_net_usage_errors_are_one_line_exit_2(capsys, argv, needle):
    rc, _, err = run(argv, capsys)
    assert rc == 2
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err


def test_repro_replay_refuses_a_universe_that_is_not_a_zoo_entry(tmp_path, capsys):
    u = {"model": simcells.UNIVERSE_MODEL, "version": 1, "scenario": "S3", "runtime": "callback",
         "variant": "naive", "preset": "tiny", "params": {}, "net": {"seed": 0}}
    path = tmp_path / "u.json"
    path.write_text(json.dumps(u))
    rc, _, err = run(["repro", "--replay", str(path)], capsys)
    assert rc == 2 and "S3 is not a zoo entry" in err and err.count("\n") == 1


# ---------------------------------------------------------------------------
# the report's net column

def _cell(sid, rt, variant, net, verdicts=None, metrics=None, **extra):
    suffix = "" if net == "real" else f"/{net}"
    c = {"id": f"{sid}/{rt}/{variant}/tiny{suffix}", "scenario": sid, "runtime": rt, "variant": variant,
         "preset": "tiny", "params": {"net": net}, "repeats": 1, "metrics": dict(metrics or {}),
         "samples": {}, "verdicts": dict(verdicts or {}), "errors": [], "notes": [],
         "ours": rt in ("callback", "hybrid", "coro"), "style": "callback"}
    c.update(extra)
    return c


@pytest.fixture()
def both_doc():
    cells = []
    for rt in ("callback", "asyncio-protocol", "uvloop-protocol"):
        for variant, lost in (("naive", 917_504), ("fixed", 0)):
            for net in ("sim", "real"):       # sim first: the tables must put real first
                if net == "sim" and rt == "uvloop-protocol":
                    cells.append(_cell("S3", rt, variant, net, skipped=(
                        "uvloop-protocol runs only on the real network: it has no port onto the "
                        "simulated network yet (uvloop polls real file descriptors in C)")))
                    continue
                cells.append(_cell("S3", rt, variant, net, {"no_loss": lost == 0, "close_completed": True},
                                   {"delivered_bytes": 1_048_576 - lost, "lost_bytes": lost}))
    # as a results file is read: the scenario and runtime descriptions the renderers use
    from bench.run import describe
    return describe.complete({"schema": 1, "looplab": "0.1.0", "run_id": "both-1", "env": {},
                              "cells": cells})


def test_tables_have_a_net_column_with_real_and_sim_side_by_side(both_doc):
    [(title, header, rows)] = report.table_rows(both_doc)
    assert header[:3] == ["runtime", "variant", "net"]
    keys = [(r[0].strip("* ").strip(), r[1], r[2]) for r in rows]
    assert keys[:4] == [("callback", "naive", "real"), ("callback", "naive", "sim"),
                        ("asyncio-protocol", "naive", "real"), ("asyncio-protocol", "naive", "sim")]
    skipped = [r for r in rows if r[0].strip() == "uvloop-protocol" and r[2] == "sim"]
    assert len(skipped) == 2 and all(r[-1] == "skipped: real network only" for r in skipped)
    text = report.render_terminal(both_doc)
    assert " net " in text.splitlines()[2] and UVLOOP_NOTE in text
    md = report.render_markdown(both_doc, [])
    assert "| runtime | variant | net |" in md and UVLOOP_NOTE in md
    # the fidelity table compares a kernel with its reference on the same network
    fid = report.fidelity(both_doc["cells"], both_doc)
    assert {r[1] for r in fid} == {"naive (real)", "naive (sim)", "fixed (real)", "fixed (sim)"}


def test_without_net_the_tables_are_as_before(both_doc):
    real = [dict(c, params={}) for c in both_doc["cells"] if c["params"]["net"] == "real"]
    doc = dict(both_doc, cells=real)
    [(_, header, _)] = report.table_rows(doc)
    assert "net" not in header
    assert UVLOOP_NOTE not in report.render_terminal(doc)
    assert UVLOOP_NOTE not in report_html.render_html(doc)


def test_page_has_a_net_column_per_net_grid_rows_and_the_uvloop_note(both_doc, tmp_path):
    path = report_html.write_html(both_doc, str(tmp_path))
    text = open(path, encoding="utf-8").read()
    page = check_page(text, str(tmp_path))
    grid = grid_of(page)
    for rt in ("callback", "asyncio-protocol"):
        for net in ("real", "sim"):
            assert grid[(rt, "S3", "naive", net)]["data-status"] == "fail"
            assert grid[(rt, "S3", "fixed", net)]["data-status"] == "pass"
    assert grid[("uvloop-protocol", "S3", "naive", "sim")]["data-status"] == "skipped"
    assert grid[("uvloop-protocol", "S3", "naive", "real")]["data-status"] == "fail"
    assert UVLOOP_NOTE in text and 'id="simnet"' in text
    assert "<th>runtime</th><th>variant</th><th>net</th>" in text
    # the fidelity section has a net column: each pairing on its own network
    fid = text[text.index('id="fidelity"'):]
    assert "<th>net</th>" in fid[:fid.index("</thead>")]


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (Debian: apt-get install chromium)")
@pytest.mark.timeout(240)
def test_a_net_both_page_renders_in_headless_chromium(tmp_path):
    # in its own process, as test_html runs its matrix: the report's plots keep
    # matplotlib's font files open for the life of the process
    cmd = [sys.executable, "-m", "bench", "run", "--net", "both", "--scenarios", "S3", "--runtimes",
           "callback,asyncio-protocol,uvloop-protocol", "--variants", "naive,fixed", "--preset", "tiny",
           "--out", str(tmp_path / "rep")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr[-800:]
    path = tmp_path / "rep" / "report.html"
    text = path.read_text(encoding="utf-8")
    page = check_page(text, str(tmp_path / "rep"))
    assert UVLOOP_NOTE in text
    assert {k[3] for k in grid_of(page) if len(k) == 4} == {"real", "sim"}
    common = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--disable-dev-shm-usage", "--window-size=1400,2000"]
    shot = tmp_path / "page.png"
    with tempfile.TemporaryDirectory() as profile:
        rc, _, err = _run_browser(common + [f"--user-data-dir={profile}", f"--screenshot={shot}",
                                            "file://" + str(path)], 90)
    assert shot.exists(), f"no screenshot (exit {rc}): {err[-600:]}"
    w, h, distinct = _png_summary(shot)
    assert (w, h) == (1400, 2000) and distinct > 20
    with tempfile.TemporaryDirectory() as profile:
        rc, dom, err = _run_browser(common + [f"--user-data-dir={profile}", "--dump-dom",
                                              "file://" + str(path)], 90)
    assert 'data-ready="1"' in dom, f"the page's script did not run (exit {rc}): {err[-600:]}"
    shown = int(dom.split('data-grid-cells-shown="')[1].split('"')[0])
    assert shown == len(page.grid) > 0
    assert "simnet" in dom
