"""report.html: checked as a parser and as a browser sees it.

One small real matrix (S1, S3, S4 on callback, coro and curio at the quick preset) is
run once through the command line; hand-made documents cover what a short run never
shows (errors, skipped cells, several machines, a scenario nobody registered, a
benchmark-only document). The browser test needs Debian's ``chromium`` and is skipped
with the reason where it is missing.
"""
from __future__ import annotations

import copy
import html
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
import zlib
from html.parser import HTMLParser

import pytest

from bench.report import html as report_html

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)


def _child_env() -> dict:
    """This checkout importable from another working directory."""
    return {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}


# ---------------------------------------------------------------------------
# documents

@pytest.fixture(scope="module")
def real_doc(tmp_path_factory):
    path = tmp_path_factory.mktemp("real") / "results.json"
    cmd = [sys.executable, "-m", "bench", "run", "--scenarios", "S1,S3,S4", "--runtimes",
           "callback,coro,curio", "--variants", "naive,fixed", "--preset", "quick", "--jobs", "2",
           "--json", str(path)]
    # run in the temporary folder: without --out, `looplab run` also writes its
    # default report folder (looplab-runs/TIME) where it runs
    proc = subprocess.run(cmd, cwd=path.parent, env=_child_env(), capture_output=True,
                          text=True, timeout=150)
    assert path.exists(), f"looplab run wrote no results (exit {proc.returncode}): {proc.stderr[-800:]}"
    with open(path) as f:
        return json.load(f)


def _cell(sid, rt, variant, metrics=None, verdicts=None, errors=None, **extra):
    c = {"id": f"{sid}/{rt}/{variant}/quick", "scenario": sid, "runtime": rt, "variant": variant,
         "params": {}, "repeats": 1, "metrics": dict(metrics or {}), "samples": {},
         "verdicts": dict(verdicts or {}), "errors": list(errors or []), "notes": []}
    c.update(extra)
    return c


def _env(node, python="3.11.7"):
    return {"python": python, "implementation": "CPython", "platform": "Linux-test", "node": node,
            "cpu": "Test CPU", "cpu_count": 2, "libraries": {"curio": "1.6", "trio": "0.35.0"},
            "time_utc": "2026-01-01T00:00:00Z", "loadavg": [0.5, 0.4, 0.3]}


@pytest.fixture()
def edge_doc():
    cells = [
        _cell("S3", "callback", "naive", {"delivered_bytes": 130964, "lost_bytes": 1966188},
              {"no_loss": False, "close_completed": True}),
        _cell("S3", "asyncio-protocol", "naive", {"delivered_bytes": 130964, "lost_bytes": 1966188},
              {"no_loss": False, "close_completed": True}),
        _cell("S3", "coro", "naive", {"delivered_bytes": 2097152, "lost_bytes": 0},
              {"no_loss": True, "close_completed": True}),
        _cell("S3", "curio", "naive", {}, {}, ["RuntimeError: app side: boom"]),
        _cell("S3", "trio", "naive", skipped="trio is not importable"),
        _cell("S3", "coro:exit=wait", "naive", {"delivered_bytes": 2097152, "lost_bytes": 0},
              {"no_loss": True, "close_completed": True}),
        _cell("S1", "callback", "naive", {"peak_user_buffer_bytes": 2_830_000}, {"bounded": False},
              series={"in_flight": [[0.0, 0], [0.5, 1e6], [1.0, 2e6]], "latency": [[0.1, 0.01], [1.0, 0.9]]}),
        _cell("S1", "asyncio-protocol", "naive", {"peak_user_buffer_bytes": 2_830_000}, {"bounded": True}),
        _cell("MY1", "coro", "naive", {"delivered_bytes": 10}, {}),
    ]
    # written without its scenarios' and runtimes' descriptions: completed as
    # `looplab report` completes such a file (bench.run.describe.complete)
    from bench.run import describe as document
    return document.complete({"schema": 1, "looplab": "0.1.0", "run_id": "merged-1",
                              "env": [_env("alpha"), _env("beta", "3.12.1")],
                              "merged_from": ["r1", "r2"], "cells": cells})


@pytest.fixture()
def bench_doc():
    cells = []
    for rt, base in (("callback", 100e3), ("asyncio-protocol", 90e3), ("coro", 80e3), ("curio", 55e3)):
        for conns in (1, 10, 100):
            rps = [base * (1 + conns / 200) * f for f in (1.0, 0.95, 1.05)]
            cells.append({"id": f"echo/{rt}/naive/connections={conns},message_bytes=1024", "scenario": "echo",
                          "runtime": rt, "variant": "naive",
                          "params": {"message_bytes": 1024, "connections": conns}, "repeats": 3,
                          "metrics": {"requests_per_s": sorted(rps)[1], "latency_p50_s": 1e-4,
                                      "latency_p99_s": 4e-4},
                          "samples": {"requests_per_s": rps}, "verdicts": {}, "errors": [],
                          "details": {"rounds": [0, 1, 2], "noisy_rounds": [1]}})
    for rt, ops in (("coro", 1.49e6), ("curio", 4.5e5)):
        cells.append({"id": f"micro/{rt}/yield", "scenario": "micro", "runtime": rt, "variant": "yield",
                      "params": {}, "repeats": 3, "metrics": {"ops_per_s": ops}, "samples": {"ops_per_s": [ops] * 3},
                      "verdicts": {}, "errors": []})
    goals = [{"goal": "coro yields/s >= 2x curio", "target": 2.0, "ratio": 3.3, "min": 3.1, "max": 3.4, "n": 3,
              "status": "met"},
             {"goal": "coro spawn+join/s >= 10x curio", "target": 10.0, "ratio": None, "min": None, "max": None,
              "n": 0, "status": "not measured"}]
    return {"schema": 1, "looplab": "0.1.0", "run_id": "bench-1", "env": _env("alpha"),
            "config": {"mode": "curve", "baseline": "asyncio-protocol"}, "goals": goals, "cells": cells}


# ---------------------------------------------------------------------------
# parsing

class Page(HTMLParser):
    """Every element with its attributes, the grid cells, the raw SVG blocks."""

    def __init__(self, text):
        super().__init__(convert_charrefs=True)
        self.elements, self.ids, self.grid, self.stack = [], set(), [], []
        self.tables = []
        self.style = ""
        self._in_style = False
        self.feed(text)
        self.svgs = re.findall(r"<svg\b.*?</svg>", text, flags=re.S)
        self.volatile = len(re.findall(r"data-volatile=", text))

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.elements.append((tag, a))
        if "id" in a:
            assert a["id"] not in self.ids, f"duplicate id {a['id']!r}"
            self.ids.add(a["id"])
        if tag == "table":
            self.tables.append("grid" in (a.get("class") or "").split())
        if tag == "td" and self.tables and self.tables[-1]:
            self.grid.append(a)      # a cell of the grid itself, not of a hover card's table
        self._in_style = tag == "style"

    def handle_endtag(self, tag):
        if tag == "table" and self.tables:
            self.tables.pop()
        if tag == "style":
            self._in_style = False

    def handle_data(self, data):
        if self._in_style:
            self.style += data


def render(doc, tmp_path, **kw):
    path = report_html.write_html(doc, str(tmp_path), **kw)
    assert path == os.path.join(str(tmp_path), "report.html")
    with open(path, encoding="utf-8") as f:
        return f.read()


def expected_status(cell):
    """The grid's colour, worked out here independently of bench.report.html."""
    if cell.get("skipped"):
        return "skipped"
    v = cell.get("verdicts") or {}
    if cell.get("errors") and not v and not cell.get("metrics"):
        return "error"
    if v:
        return "fail" if False in v.values() else "error" if None in v.values() else "pass"
    return "error" if cell.get("errors") else "measured"


def css_background(style, status):
    m = re.search(r"\.v-%s\{background:#([0-9a-f]{6})" % status, style)
    assert m, f"no background colour for .v-{status}"
    return tuple(int(m.group(1)[i:i + 2], 16) for i in (0, 2, 4))


def check_page(text, out_dir):
    """What every page must satisfy: self-contained, links resolve, SVG parses."""
    page = Page(text)
    for tag, a in page.elements:
        for attr in ("src", "href", "data", "srcset", "action", "poster"):
            val = a.get(attr)
            if val is None:
                continue
            if tag == "a" and attr == "href" and re.match(r"https://github\.com/[^\s]+/(issues|pull)/\d+", val):
                continue          # a plain hyperlink to an issue thread is fine
            assert not re.match(r"(?i)^\s*(https?:)?//", val), f"external resource <{tag} {attr}={val!r}>"
            if attr == "href" and val.startswith("#"):
                assert val[1:] in page.ids, f"broken internal link {val}"
            elif attr == "href":
                assert tag == "a", f"<{tag} href={val!r}> loads a file"
                assert os.path.exists(os.path.join(out_dir, val)), f"link to a missing file {val}"
            else:
                pytest.fail(f"<{tag} {attr}={val!r}>: the page must not load anything")
        assert tag not in ("img", "iframe", "object", "embed", "link", "video", "audio"), f"<{tag}> in the page"
        if tag == "script":
            assert "src" not in a
    assert "@import" not in page.style and "url(" not in page.style
    for svg in page.svgs:
        root = ET.fromstring(svg)
        assert root.tag.endswith("svg")
        assert len(list(root.iter())) > 5, "an empty plot"
    return page


TD = r"<td(?: class=\"n\")?>"


def grid_of(page):
    return {tuple(td["data-key"].split("|")): td for td in page.grid}


# ---------------------------------------------------------------------------
# the real run

@pytest.mark.timeout(200)
def test_real_page_is_self_contained_and_its_grid_matches_the_data(real_doc, tmp_path):
    with open(tmp_path / "results.json", "w") as f:
        json.dump(real_doc, f)
    text = render(real_doc, tmp_path, command="looplab run --scenarios S1,S3,S4")
    page = check_page(text, str(tmp_path))
    cells = [c for c in real_doc["cells"]]
    grid = grid_of(page)
    runtimes = {c["runtime"] for c in cells}
    columns = {(c["scenario"], c["variant"]) for c in cells}
    # one grid cell per runtime x (scenario, variant), no more, no fewer
    assert set(grid) == {(rt, sid, v) for rt in runtimes for sid, v in columns}
    assert len(page.grid) == len(grid)
    style = page.style
    green, red = css_background(style, "pass"), css_background(style, "fail")
    assert green[1] > green[0] and red[0] > red[1], "pass must be green and fail red"
    for c in cells:
        td = grid[(c["runtime"], c["scenario"], c["variant"])]
        want = expected_status(c)
        assert td["data-status"] == want, c["id"]
        assert f"v-{want}" in td["class"].split()
        assert c["id"] in td["data-cells"].split()
    # our kernels are marked and placed first in their style
    for ours in ("callback", "coro"):
        assert re.search(r'<tr class="ours"><th class="rt"><span class="ours" data-rt="%s"[^>]*>\u2605 %s<' % (ours, ours), text)
    # one section per scenario, each with a plot and a table
    for sid in ("S1", "S3", "S4"):
        sec = re.search(r'<section class="scenario"><h2 id="s-%s">(.*?)</section>' % sid, text, re.S)
        assert sec, sid
        assert "<svg" in sec.group(1) and '<table class="data' in sec.group(1)
    # S1 has time series: one line per cell in the in-flight charts
    s1 = [c for c in cells if c["scenario"] == "S1" and c.get("series", {}).get("in_flight")]
    assert text.count('data-series="') >= len(s1)
    # results.json is linked and the command is shown
    assert 'href="results.json"' in text and "looplab run --scenarios S1,S3,S4" in text


@pytest.mark.timeout(200)
def test_the_three_questions_follow_the_verdicts(real_doc, tmp_path):
    text = render(real_doc, tmp_path)
    answers = re.search(r'<div class="answers">(.*?)</div>', text, re.S).group(1)
    loss = answers.split("Which lose data at shutdown?")[1].split("How do the causality")[0]
    for c in real_doc["cells"]:
        if "no_loss" not in c.get("verdicts", {}):
            continue
        rows = re.findall(r"<tr><TD><a href=\"#s-%s\">%s</a> %s</td><TD>(.*?)</td><TD>(.*?)</td></tr>".replace("<TD>", TD)
                          % (c["scenario"], c["scenario"], c["variant"]), loss)
        name = 'data-rt="%s"' % c["runtime"]
        if c["verdicts"]["no_loss"]:
            assert not rows or re.search(name, rows[0][1]), c["id"]
        else:
            assert rows and re.search(name, rows[0][0]), c["id"]
    fp = answers.split("How do the causality fingerprints differ?")[1]
    s4 = [c for c in real_doc["cells"] if c["scenario"] == "S4" and c["metrics"]]
    differing = [m for m in ("child_first_after_yield_fraction", "user_buffered_after_write_bytes",
                             "closed_when_close_returned", "error_surface")
                 if len({json.dumps(c["metrics"].get(m)) for c in s4}) > 1]
    for m in differing:
        declared = ((real_doc.get("scenarios") or {}).get("S4", {}).get("metrics") or {}).get(m) or {}
        label = declared.get("label") or (
            m.rsplit("_", 1)[0].replace("_", " ") if m.endswith(("_fraction", "_bytes")) else m.replace("_", " "))
        assert f"<li>{html.escape(label)}:" in fp, m


@pytest.mark.timeout(200)
def test_same_document_same_page_and_merged_shards_equal_the_unsharded_run(real_doc, tmp_path):
    from bench import results
    one = report_html.render_html(real_doc)
    assert one == report_html.render_html(copy.deepcopy(real_doc))
    shuffled = dict(real_doc, cells=list(reversed(real_doc["cells"])))
    assert report_html.render_html(shuffled) == one
    shards = [dict(real_doc, run_id=f"shard{i}", cells=real_doc["cells"][i - 1::2]) for i in (1, 2)]
    merged = results.merge(shards)
    assert isinstance(merged["env"], list) and len(merged["env"]) == 2

    def stable(text):
        return re.sub(r'<p data-volatile="[^"]*">.*?</p>', "", text)
    assert stable(report_html.render_html(merged)) == stable(one)
    assert Page(one).volatile >= 2


# ---------------------------------------------------------------------------
# hand-made edge cases

@pytest.mark.timeout(60)
def test_errors_skips_unknown_scenarios_and_several_machines(edge_doc, tmp_path):
    (tmp_path / "s3_bytes_delivered.png").write_bytes(b"\x89PNG")
    text = render(edge_doc, tmp_path, plots=[str(tmp_path / "s3_bytes_delivered.png")])
    s3 = text.split('id="s-S3"')[1].split("</section>")[0]
    assert 'href="s3_bytes_delivered.png"' in s3
    page = check_page(text, str(tmp_path))
    grid = grid_of(page)
    assert grid[("curio", "S3", "naive")]["data-status"] == "error"
    assert grid[("trio", "S3", "naive")]["data-status"] == "skipped"
    assert grid[("callback", "S3", "naive")]["data-status"] == "fail"
    assert grid[("coro", "S3", "naive")]["data-status"] == "pass"
    assert grid[("coro", "MY1", "naive")]["data-status"] == "measured"
    assert grid[("trio", "S1", "naive")]["data-status"] == "na"
    for status in ("error", "skipped", "measured"):
        css_background(page.style, status)
    assert "RuntimeError: app side: boom" in text
    assert 'id="s-MY1">MY1 \u2014 MY1<' in text          # nobody registered it: its id is its title
    assert "machine 1" in text and "machine 2" in text and "2 different machines" in text
    # coro:exit=wait has options flipped: not compared with curio
    fid = text.split('id="fidelity"')[1].split("</section>")[0]
    assert "coro:exit=wait" in fid.split("Not compared")[1]
    header = re.search(r"<thead>(.*?)</thead>", fid).group(1)
    assert 'data-rt="callback"' in header and "vs asyncio-protocol" in header and "vs curio" in header

    def row(sid, variant):
        for tr in fid.split("<tr>")[1:]:
            tds = re.findall(r"<td[^>]*>(.*?)</td>", tr)
            if tds and re.sub(r"<[^>]+>", "", tds[0]) == sid and tds[1] == variant:
                return tds
        pytest.fail(f"no fidelity row for {sid} {variant}")
    assert "agree" in row("S3", "naive")[2]                       # callback vs asyncio-protocol
    assert "not comparable" in row("S3", "naive")[3] and "error: no measurement" in row("S3", "naive")[3]
    assert "differ" in row("S1", "naive")[2]
    assert "bounded: subject \u2717, reference \u2713" in row("S1", "naive")[2]
    assert "equal its primary reference's in 1 of 2 comparable cells" in html.unescape(fid)
    # the series in the hand-made S1 cell is drawn
    assert "S1 callback style: in flight" in text


def test_the_buffer_question_tells_a_runtimes_buffer_from_an_apps_queue(tmp_path):
    """S6 unbounded queues by the app's own policy: on the task runtimes the app's
    mailbox grows, not the runtime's buffer, and the answer says so instead of
    counting it against coro and trio; a transport buffer that grows (callback)
    stays a NO of the runtime."""
    from bench.run import describe as document

    def s6(rt, variant, buffer, queue, bounded):
        return _cell("S6", rt, variant, {"peak_user_buffer_bytes": buffer, "app_queue_peak_bytes": queue,
                                          "healthy_share_fraction": 1.0, "broadcasts_count": 200},
                     {"healthy_served": True, "bounded": bounded})
    doc = document.complete({"schema": 2, "looplab": "0.1.0", "run_id": "r", "env": _env("a"), "cells": [
        s6("callback", "unbounded", 9_000_000, 0, False), s6("coro", "unbounded", 0, 9_000_000, False),
        s6("trio", "unbounded", 0, 9_000_000, False), s6("callback", "block", 70_000, 0, True),
        s6("coro", "block", 0, 30_000, True), s6("trio", "block", 0, 30_000, True)]})
    text = render(doc, tmp_path)
    grow = re.search(r'<div class="answers">(.*?)</div>', text, re.S).group(1)
    grow = grow.split("Which lose data at shutdown?")[0]
    said = re.search(r"<p>(.*?)</p>", grow.split("</h3>", 1)[1], re.S).group(1)
    somewhere, app = said.split("Only the app's own queue grew")
    assert 'data-rt="callback"' in somewhere
    assert 'data-rt="coro"' not in somewhere and 'data-rt="trio"' not in somewhere
    assert 'data-rt="coro"' in app and 'data-rt="trio"' in app and 'data-rt="callback"' not in app
    assert "in the app&#x27;s own queue" in grow


@pytest.mark.timeout(60)
def test_bench_only_document(bench_doc, tmp_path):
    plots = {"curve.png": str(tmp_path / "curve.png")}
    (tmp_path / "curve.png").write_bytes(b"\x89PNG")
    text = render(bench_doc, tmp_path, plots=plots)
    page = check_page(text, str(tmp_path))
    assert not page.grid and 'id="grid"' not in text
    bench = text.split('id="bench"')[1]
    assert "Performance goals" in bench and "coro yields/s &gt;= 2x curio" in bench
    assert "3.30\u00d7" in bench and "not measured" in bench
    assert "requests/s relative to asyncio-protocol" in bench
    assert "echo throughput by connections" in bench       # a curve: three connection counts
    assert "Micro-benchmarks" in bench and "1.49M/s" in bench
    assert 'href="curve.png"' in text


def test_the_goals_table_shows_each_interpreter_and_both_cpu_ratios(bench_doc, tmp_path):
    # an echo goal judged on 3.11 and on 3.13: one row each, told apart by the
    # python column, with the CPU ratio and its user-only part beside the judged one
    row = {"goal": "coro echo 1 KiB x 10 conns >= 1.2x uvloop-streams", "target": 1.2,
           "judged_on": "server CPU/req", "min": 0.8, "max": 1.4, "n": 7, "status": "not met"}
    goals = [{**row, "python": "3.11", "ratio": 0.99, "cpu": {"ratio": 0.99}, "user": {"ratio": 1.13}},
             {**row, "python": "3.13", "ratio": 1.02, "cpu": {"ratio": 1.02}, "user": {"ratio": 1.2}}]
    text = render({**bench_doc, "goals": goals}, tmp_path)
    table = text.split('id="goals"')[1].split("</table>")[0]
    assert "user CPU only" in table
    cells = [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", table)]
    assert cells[:1] == ["3.11"] and cells[6:8] == ["0.99", "1.13"]
    assert "3.13" in cells and cells[-2:] == ["1.02", "1.20"]
    assert "instructions" not in table          # not counted: no column
    goals[0]["instructions"] = {"subject": 21_244, "reference": 23_417, "ratio": 23_417 / 21_244}
    goals[1]["instructions"] = {"subject": None, "reference": None, "ratio": None}
    table = render({**bench_doc, "goals": goals}, tmp_path).split('id="goals"')[1].split("</table>")[0]
    cells = [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", table)]
    assert "instructions, reference over ours" in table and cells[8] == "1.10" and cells[-1] == "-"
    assert "callgrind" not in render({**bench_doc, "goals": goals}, tmp_path)   # no method recorded
    config = {**(bench_doc.get("config") or {}),
              "instructions": {"echo": [2000, 10000, 0.005], "micro": [300, 1500], "stopped": True}}
    text = render({**bench_doc, "goals": goals, "config": config}, tmp_path)
    method = text.split('id="goals"')[1].split("</table>")[1].split("</p>")[0]
    assert "callgrind" in method and "2,000 and 10,000" in method and "5 ms apart" in method
    assert "300 and 1,500 operations" in method and "stopped before it ended" in method


_PROBES = {
    "command": "looplab fidelity", "elapsed_s": 9.5, "skipped": ["uvloop-streams"],
    "pairings": [
        {"pairing": "coro vs curio", "ours": "coro", "reference": "curio", "primary": True,
         "compared": 29, "agree": 27, "declared": 2, "differ": 0, "error": 0},
        {"pairing": "coro vs trio", "ours": "coro", "reference": "trio", "primary": False,
         "compared": 19, "agree": 10, "declared": 0, "differ": 9, "error": 0}],
    "differences": [
        {"ours": "coro", "reference": "curio", "primary": True, "probe": "co_event_wake_order",
         "verdict": "declared", "reference_obs": '{"fifo":false}', "ours_obs": '{"fifo":true}',
         "reason": "curio wakes <waiters> in hash order"},
        {"ours": "coro", "reference": "trio", "primary": False, "probe": "co_timeout_zero",
         "verdict": "information", "reference_obs": '{"raised":"timeout"}',
         "ours_obs": '{"raised":null}', "reason": ""}],
}


def test_fidelity_probes_section_shows_counts_and_each_difference_with_its_reason(edge_doc, tmp_path):
    doc = dict(edge_doc, fidelity_probes=_PROBES)
    text = render(doc, tmp_path)
    check_page(text, str(tmp_path))
    assert '<a href="#probes">fidelity probes</a>' in text
    section = text.split('id="probes"')[1].split("</section>")[0]
    assert "27 / 29" in section and "10 / 19" in section and "(information)" in section
    assert "co_event_wake_order" in section and "curio wakes &lt;waiters&gt; in hash order" in section
    assert "{&quot;fifo&quot;:false}" in section and "co_timeout_zero" in section
    assert "looplab fidelity" in section and "uvloop-streams" in section
    # without probes in the document there is no section
    assert 'id="probes"' not in render(edge_doc, tmp_path)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("doc", [
    {"schema": 1, "cells": []},
    {"schema": 1, "env": "not a dict", "cells": [{"id": "only-an-id"}]},
    {"schema": 1, "cells": [{"id": "S9/nosuch:x=1/naive", "scenario": "S9", "runtime": "nosuch:x=1",
                             "variant": "naive", "verdicts": {"ok": True},
                             "metrics": {"a_bytes": float("nan"), "b_s": None, "c": "text", "d_count": True},
                             "series": {"in_flight": [[0, 1]]}}]},
    {"schema": 1, "cells": [{"id": "echo/coro", "scenario": "echo", "runtime": "coro", "variant": "naive",
                             "params": {"connections": 1}, "metrics": {}, "errors": ["boom"]}]},
], ids=["empty", "bare-cell", "odd-values", "failed-bench"])
def test_odd_documents_still_give_a_valid_page(doc, tmp_path):
    page = check_page(render(doc, tmp_path), str(tmp_path))
    assert "run" in page.ids


# ---------------------------------------------------------------------------
# the browser

PROBE = """<script>
(function(){
  var g = document.querySelector('svg.chart .lg');
  g.dispatchEvent(new MouseEvent('click', {bubbles: true}));
  var hidden = 0, parts = g.ownerSVGElement.querySelectorAll('[data-series]');
  for (var i = 0; i < parts.length; i++) if (parts[i].style.display === 'none') hidden++;
  document.body.setAttribute('data-probe-hidden', hidden);
  document.body.setAttribute('data-probe-legend', g.getAttribute('class'));
})();
</script>"""


def _run_browser(args, timeout):
    """Chromium in its own process group, so a hang kills every process it started."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"chromium did not finish within {timeout} s")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)   # helpers it left behind
        except ProcessLookupError:
            pass
    return proc.returncode, out, err


def _png_summary(path):
    """(width, height, distinct byte values in the first rows): enough to tell a
    rendered page from a blank one, with the standard library only."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    pos, idat = 8, b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + length]
        pos += 12 + length
    raw = zlib.decompress(idat)
    return width, height, len(set(raw[: width * 4 * 600]))


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (Debian: apt-get install chromium)")
@pytest.mark.timeout(240)
def test_page_renders_in_headless_chromium(real_doc, tmp_path):
    with open(tmp_path / "results.json", "w") as f:
        json.dump(real_doc, f)
    path = report_html.write_html(real_doc, str(tmp_path))
    text = open(path, encoding="utf-8").read()
    url = "file://" + os.path.abspath(path)
    shot = tmp_path / "grid.png"
    common = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--disable-dev-shm-usage"]
    with tempfile.TemporaryDirectory() as profile:
        rc, _, err = _run_browser(common + [f"--user-data-dir={profile}", f"--screenshot={shot}",
                                            "--window-size=1400,2000", "--enable-logging=stderr", "--v=0",
                                            url], 90)
    assert shot.exists(), f"no screenshot (exit {rc}): {err[-600:]}"
    console = [ln for ln in err.splitlines() if "CONSOLE" in ln or "Uncaught" in ln]
    assert not console, "console messages: " + " | ".join(console)
    w, h, distinct = _png_summary(shot)
    assert (w, h) == (1400, 2000)
    assert distinct > 20, "the screenshot is (nearly) blank"
    assert os.path.getsize(shot) > 30_000
    # A copy of the page that clicks the first legend entry once the page's own script has run,
    # and records how many plot elements that hid: the legend toggle works in a real browser.
    probe = tmp_path / "probe.html"
    probe.write_text(text.replace("</body>", PROBE + "</body>"), encoding="utf-8")
    with tempfile.TemporaryDirectory() as profile:
        rc, dom, err = _run_browser(common + [f"--user-data-dir={profile}", "--window-size=1400,2000",
                                              "--dump-dom", "file://" + str(probe)], 90)
    body = re.search(r"<body([^>]*)>", dom)
    assert body, f"no DOM (exit {rc}): {err[-600:]}"
    attrs = dict(re.findall(r'([\w-]+)="([^"]*)"', body.group(1)))
    assert attrs.get("data-ready") == "1", "the page's script did not run to its end"
    page = Page(text)
    charts = sum(1 for tag, a in page.elements if tag == "svg" and "chart" in (a.get("class") or "").split())
    tables = sum(1 for tag, a in page.elements if tag == "table" and "data" in (a.get("class") or "").split())
    assert charts and int(attrs["data-charts-shown"]) == charts, "a plot did not render"
    assert tables and int(attrs["data-tables-shown"]) == tables, "a table did not render"
    assert int(attrs["data-grid-cells-shown"]) == len(page.grid) > 0, "the grid did not render"
    first = re.search(r'<svg class="chart".*?</svg>', text, re.S).group(0)
    key = re.search(r'class="lg" data-key="([^"]*)"', first).group(1)
    assert int(attrs["data-probe-hidden"]) == first.count(f'data-series="{key}"') > 0
    assert "off" in attrs["data-probe-legend"].split()
