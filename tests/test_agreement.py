"""Issue 35: the fidelity summaries agree. One computation (``bench.report.agreement``)
answers "does a kernel's verdict equal its references'?" for the terminal, report.md and
report.html; a side that measured nothing is "not comparable", never "same"; a kernel is
compared only with the references it names. And report.html's probe Differences table
fits: verdict and reason first, subject/reference columns, long observations cut.
"""
from __future__ import annotations

import html
import re

from bench import report
from bench import results as resmod
from bench.report import agreement
from bench.report import html as report_html


def _cell(runtime, verdicts, *, ours=False, style="stream", sid="S1", variant="naive", skipped=None):
    c = {"id": f"{sid}/{runtime}/{variant}/tiny", "scenario": sid, "runtime": runtime,
         "variant": variant, "style": style, "ours": ours, "params": {}, "repeats": 1,
         "notes": [], "metrics": {"x_bytes": 1.0}, "verdicts": verdicts, "errors": []}
    if skipped:
        c.update(skipped=skipped, verdicts={}, metrics={})
    return c


def _doc(cells):
    described = {
        "hybrid": {"style": "stream", "ours": True,
                   "compared_with": ["asyncio-streams", "uvloop-streams"], "primary": "asyncio-streams"},
        "mykernel": {"style": "stream", "ours": False, "compared_with": ["asyncio-streams"],
                     "primary": "asyncio-streams"},
        "hybrid:spawn=eager": {"style": "stream", "ours": True,
                               "compared_with": ["asyncio-streams", "uvloop-streams"], "primary": None},
        "asyncio-streams": {"style": "stream", "ours": False, "compared_with": [], "primary": None},
        "uvloop-streams": {"style": "stream", "ours": False, "compared_with": [], "primary": None},
    }
    return resmod.new_document(
        cells, run_id="agree-1", env={},
        scenarios={"S1": {"title": "S1", "variants": ["naive", "fixed"], "metrics": {},
                          "verdicts": {"bounded": "b", "served": "s"}, "columns": ["x_bytes"],
                          "plots": []}},
        runtimes=described)


def _issue_doc():
    """hybrid's 'bounded' not measured (None) where asyncio-streams measured True; a user
    kernel that agrees; hybrid with an option flipped; uvloop differing from asyncio."""
    return _doc([
        _cell("hybrid", {"bounded": None, "served": True}, ours=True),
        _cell("mykernel", {"bounded": True, "served": True}),
        _cell("hybrid:spawn=eager", {"bounded": True, "served": True}, ours=True),
        _cell("asyncio-streams", {"bounded": True, "served": True}),
        _cell("uvloop-streams", {"bounded": False, "served": True}),
        _cell("hybrid", {"bounded": False, "served": True}, ours=True, variant="fixed"),
        _cell("asyncio-streams", {"bounded": True, "served": True}, variant="fixed"),
        _cell("mykernel", {}, variant="fixed", skipped="runtime unavailable"),
    ])


def test_a_side_not_measured_is_not_comparable_never_same():
    comps = agreement.comparisons(_issue_doc())
    hyb = next(c for c in comps if c["subject"] == "hybrid" and c["reference"] == "asyncio-streams"
               and c["variant"] == "naive")
    assert hyb["status"] == "not comparable" and "bounded" in hyb["why"]
    s = agreement.summary(comps)
    # hybrid/fixed differs, mykernel/naive is the same, hybrid/naive and mykernel/fixed
    # (skipped) are not comparable
    assert s == {"same": 1, "differ": 1, "comparable": 2, "not_comparable": 2, "primary": 4}
    rows = report.fidelity(_issue_doc()["cells"], _issue_doc())
    assert not [r for r in rows if r[2] == "hybrid" and r[1] == "naive" and r[5] == "same"]
    assert ["S1", "naive", "hybrid", "asyncio-streams", "yes", "not comparable",
            "bounded: subject not measured, reference yes"] in rows


def test_each_kernel_is_compared_only_with_the_references_it_names():
    comps = agreement.comparisons(_issue_doc())
    pairs = {(c["subject"], c["reference"]) for c in comps}
    assert pairs == {("hybrid", "asyncio-streams"), ("hybrid", "uvloop-streams"),
                     ("mykernel", "asyncio-streams")}
    # the user's kernel is never the subject or the reference of our kernel's comparison,
    # a library is never a subject, and a kernel with options flipped is not compared
    assert agreement.not_compared(_issue_doc()) == ["hybrid:spawn=eager"]
    assert {c["primary"] for c in comps if c["reference"] == "uvloop-streams"} == {False}


def test_terminal_markdown_and_page_give_one_answer(tmp_path):
    doc = _issue_doc()
    line = agreement.summary_line(agreement.summary(agreement.comparisons(doc)))
    assert line == ("each kernel's verdicts equal its primary reference's in 1 of 2 comparable "
                    "cells (1 differ); 2 not comparable (a side not measured or without verdicts)")
    assert f"Fidelity: {line}" in report.render_terminal(doc)
    assert f"Fidelity: {line}." in report.render_markdown(doc, [])
    page = html.unescape(report_html.render_html(doc))
    fid = page.split('id="fidelity"')[1].split("</section>")[0]
    assert f"Fidelity: {line}" in fid
    assert "not comparable: bounded: subject not measured, reference yes" in fid
    # the terminal never calls a not-measured side "same NO"
    assert "same NO" not in report.render_terminal(doc) and " NO " not in \
        report.render_terminal(doc).split("Fidelity:")[1].split("\n\n")[0].replace("reference NO", "")


_LONG = '{"events":' + ",".join(['"data"'] * 300) + "}"


def _probe_doc():
    quote = {"text": "Return True if the signal handler was removed, or False if no handler was set "
                     "for the given signal.", "docs": "3.12.1", "page": "asyncio-eventloop",
             "url": "https://docs.python.org/3.12/library/asyncio-eventloop.html#asyncio.loop.remove_signal_handler"}
    block = {"command": "looplab fidelity", "elapsed_s": 3.0, "skipped": [],
             "pairings": [{"pairing": "uvloop-streams vs asyncio-streams", "ours": "uvloop-streams",
                           "reference": "asyncio-streams", "primary": False, "kind": "loop",
                           "compared": 2, "agree": 0, "declared": 0, "differ": 2, "error": 0}],
             "differences": [
                 {"subject": "uvloop-streams", "ours": "uvloop-streams", "reference": "asyncio-streams",
                  "primary": False, "probe": "lp_remove_signal_handler", "kind": "loop",
                  "verdict": "divergent", "reference_obs": '{"first":true}', "ours_obs": '{"first":null}',
                  "reason": "", "promise": quote, "upstream": "none found, searched: 2026-11-28"},
                 {"subject": "uvloop-streams", "ours": "uvloop-streams", "reference": "asyncio-streams",
                  "primary": False, "probe": "lp_protocol_state_machine", "kind": "loop",
                  "verdict": "divergent", "reference_obs": _LONG, "ours_obs": '{"events":[]}',
                  "reason": "", "promise": None, "upstream": "not searched"}]}
    return resmod.new_document([], run_id="p-1", env={}, fidelity_probes=block)


def test_the_probe_differences_table_fits_and_names_its_columns():
    page = report_html.render_html(_probe_doc())
    section = page.split('id="probes"')[1].split("</section>")[0]
    table = section.split("<h3>Differences</h3>")[1]
    header = re.findall(r"<th>(.*?)</th>", table.split("</thead>")[0])
    assert header == ["verdict", "reason", "subject vs reference", "probe", "reference shows",
                      "subject shows"]
    assert "ours" not in header
    assert "table-layout:fixed" in section and "overflow-wrap:anywhere" in section
    rows = table.split("<tbody>")[1].split("</tr>")
    cells = re.findall(r"<td[^>]*>(.*?)</td>", rows[0])
    assert "divergent" in cells[0] and "Return True if the signal handler was removed" in html.unescape(cells[1])
    assert "none found, searched: 2026-11-28" in cells[1] and "asyncio-eventloop 3.12.1" in cells[1]
    assert "uvloop-streams" in cells[2] and "asyncio-streams" in cells[2]
    # a long observation is cut in the cell and whole in its title
    long_cell = re.findall(r"<td[^>]*>(.*?)</td>", rows[1])[4]
    shown = html.unescape(re.sub(r"<[^>]+>", "", long_cell))
    assert len(shown) <= 160 and shown.endswith("\u2026")
    assert html.escape(_LONG) in long_cell
    assert "de-facto" in re.findall(r"<td[^>]*>(.*?)</td>", rows[1])[1]


def test_markdown_differences_put_verdict_and_reason_first():
    from bench import fidelity
    md = fidelity.markdown_section(_probe_doc()["fidelity_probes"])
    head = next(ln for ln in md.splitlines() if ln.startswith("| verdict"))
    assert head.startswith("| verdict | reason | subject vs reference | probe |")
