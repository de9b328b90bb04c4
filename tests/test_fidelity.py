"""The fidelity suite: it runs, it is deterministic, its verdict mechanics are right, and
the differences issue 13 reported are captured by named probes.

What the references do is asserted here (from issue 13's measurements); what our
kernels do is never asserted directly. "Ours must agree" checks for the gaps still
open are in ``KNOWN_GAPS`` as strict xfails: when a kernel fix lands, the check
passes, the xfail turns into a failure, and the entry must be removed.
"""
from __future__ import annotations

import json
import re
import sys

import pytest

from bench import cli, fidelity
from bench import results
from bench.errors import ExitCode
from bench.fidelity import PROBES
from bench import runtimes as rtmod

pytestmark = pytest.mark.timeout(120)

BUILTIN = [rid for rid in rtmod.ordered() if rtmod.get(rid).origin == "builtin"]
PRIMARY = {ours: refs[0] for ours, refs in fidelity.pairings().items() if ours in BUILTIN}


def _available(rid):
    return rtmod.parse(rid).available()


def _style(rid):
    return rtmod.get(rid).style


RUNTIMES = [r for r in BUILTIN if _available(r)]


def _main(argv):
    """``looplab fidelity ARGV`` through the CLI, as a user runs it."""
    return cli.main(["fidelity", *argv])


#: the probes of our kernels and their references; the loop-conformance probes (lp_*)
#: are the observatory's, measured in tests/test_observatory.py
KERNEL_PROBES = [n for n, p in PROBES.items() if not p.standalone]


@pytest.fixture(scope="module")
def runs():
    """The whole kernel suite, twice (for the determinism check)."""
    return fidelity.collect(RUNTIMES, KERNEL_PROBES), fidelity.collect(RUNTIMES, KERNEL_PROBES)


@pytest.fixture(scope="module")
def rows(runs):
    return fidelity.compare(runs[0], KERNEL_PROBES)


def _obs(runs, rid, probe):
    rec = runs[0][rid][probe]
    assert "obs" in rec, rec
    return rec["obs"]


# ---------------------------------------------------------------------------
# The suite runs

def test_at_least_60_probes_and_every_style_covered():
    by_style = {}
    for p in PROBES.values():
        by_style[p.style] = by_style.get(p.style, 0) + 1
    assert sum(by_style.values()) >= 60
    assert set(by_style) == {"callback", "stream", "task"}
    assert min(by_style.values()) >= 20


def test_every_runnable_pairing_compares_its_probes(rows):
    counts = fidelity.counts(rows)
    for ours, ref in PRIMARY.items():
        if not _available(ref):
            continue
        c = counts[f"{ours} vs {ref}"]
        # every probe of its style, less those its side declares unmapped (the loop
        # probes, lp_*, are not run on our kernels)
        side = rtmod.get(ours).probe_side.rpartition(":")[2]
        style_probes = sum(p.style == _style(ours) and side not in p.skip
                           for p in PROBES.values())
        assert c["compared"] == style_probes
    assert sum(c["compared"] for c in counts.values() if c["primary"]) >= 60


def test_no_probe_errors(runs):
    errors = {(rid, n): rec["error"] for rid, recs in runs[0].items()
              for n, rec in recs.items() if "error" in rec}
    assert errors == {}


def test_observations_are_stable_across_runs(runs):
    first, second = runs

    def record(rec):            # "s", how long it took, is a hint that varies
        return {k: v for k, v in rec.items() if k != "s"}
    unstable = [(rid, n) for rid in first for n in first[rid]
                if record(first[rid][n]) != record(second[rid][n])]
    assert unstable == []


def test_observations_are_small_and_plain(runs):
    for recs in runs[0].values():
        for n, rec in recs.items():
            text = json.dumps(rec.get("obs"))
            assert len(text) < 400, n
            assert not re.search(r"0x[0-9a-f]{6,}|line \d+|File \"", text), n


# ---------------------------------------------------------------------------
# Issue 13: the reference side of each reported difference

ISSUE_13 = [
    # (reference, probe, key, value the reference shows)
    ("asyncio-protocol", "cb_write_after_close_buffered", "peer_received_beyond_1MB", 1000),
    ("asyncio-protocol", "cb_write_after_close_empty", "handler", 0),
    ("asyncio-protocol", "cb_write_after_close_empty", "log", 3),      # writes 5, 6 and 7
    ("asyncio-protocol", "cb_write_after_connection_lost_exc", "log", 3),
    ("asyncio-protocol", "cb_write_after_completed_buffered_close", "raised", "AttributeError"),
    ("asyncio-protocol", "cb_is_reading_after_eof_kept_open", "is_reading", True),
    ("asyncio-protocol", "cb_pause_resume_after_eof", "eof_received_calls", 2),
    ("asyncio-protocol", "cb_write_empty_after_write_eof", "raised", "RuntimeError"),
    ("asyncio-streams", "tk_contextvar_set_after_create", "child_sees", "before"),
    ("asyncio-streams", "tk_contextvar_child_isolated", "parent_sees", "parent"),
    ("asyncio-streams", "tk_wait_for_runs_in_new_task", "same_task", sys.version_info >= (3, 12)),
    ("asyncio-streams", "tk_unretrieved_future_exception", "reports",
     [["Future exception was never retrieved", "ValueError"]]),
    ("curio", "co_nested_timeout_outer_expires", "at_await", "timeout"),
    ("curio", "co_nested_timeout_outer_expires", "out_of_inner", "timeout-cancellation"),
    ("curio", "co_timeout_except_exception", "caught_by_except_Exception", False),
    ("curio", "co_timeout_except_exception", "block_ended", "timeout"),
    ("curio", "co_timeout_except_oserror", "caught_by_except_OSError", False),
    ("curio", "co_join_error", "raised", "task-error"),
    ("curio", "co_join_error", "cause", "ValueError"),
    ("curio", "co_join_error", "crash_reported", True),
    ("curio", "co_event_wake_order", "fifo", False),
    # found by this suite
    ("asyncio-streams", "tk_contextvar_in_callbacks", "call_soon", "task"),
    ("asyncio-streams", "tk_contextvar_in_callbacks", "done_cb", "task"),
    ("curio", "co_cancel_finished_task", "cancel_returned", None),
    ("curio", "co_child_crash_unjoined", "reported_before_run_ends", True),
    ("curio", "co_join_cancelled", "raised", "task-error"),
    ("curio", "co_send_after_close", "send", "OSError"),
]


@pytest.mark.parametrize("ref,probe,key,value", ISSUE_13,
                         ids=[f"{r[1]}.{r[2]}" for r in ISSUE_13])
def test_issue_13_reference_behaviour(runs, ref, probe, key, value):
    if not _available(ref):
        pytest.skip(f"{ref} is not installed")
    assert _obs(runs, ref, probe)[key] == value


def test_lowering_high_water_after_close_pauses_on_asyncio(runs):
    assert "pause" in _obs(runs, "asyncio-protocol", "cb_lower_high_water_after_close")["events"]


# ---------------------------------------------------------------------------
# Ours must agree. Open gaps, one table: remove an entry when its kernel fix lands.

KNOWN_GAPS: set = set()     # none open: every difference is fixed or declared on its runtime

_PRIMARY_CASES = sorted((ours, n) for ours in PRIMARY for n in KERNEL_PROBES
                        if PROBES[n].style == _style(ours))


def _case(ours, n):
    marks = [pytest.mark.xfail(strict=True, reason="known gap (KNOWN_GAPS)")] \
        if (ours, n) in KNOWN_GAPS else []
    return pytest.param(ours, n, marks=marks, id=f"{ours}:{n}")


@pytest.mark.parametrize("ours,probe", [_case(o, n) for o, n in _PRIMARY_CASES])
def test_ours_agrees_with_primary_reference(rows, ours, probe):
    ref = PRIMARY[ours]
    if not _available(ref):
        pytest.skip(f"{ref} is not installed")
    row = next(r for r in rows if r["ours"] == ours and r["reference"] == ref
               and r["probe"] == probe)
    assert row["verdict"] in ("agree", "declared", "n/a"), \
        (row["ref_rec"], row["ours_rec"])


def test_known_gaps_name_real_probes():
    for ours, n in KNOWN_GAPS:
        assert n in PROBES and PROBES[n].style == _style(ours)


def test_declared_differences_name_real_probes_and_have_reasons_and_values():
    assert fidelity.declared()
    for subject in fidelity.pairings():
        info = rtmod.get(subject)
        for n in info.probe_differences:
            d = info.probe_difference(n)
            assert n in PROBES and PROBES[n].style == info.style
            assert len(d.reason) > 20 and d.expected is not None


# ---------------------------------------------------------------------------
# Verdict mechanics on made-up observations

def _fake(ours_obs, ref_obs, probe="cb_write_after_close_empty", ref="asyncio-protocol",
          subject="callback"):
    return {subject: {probe: ours_obs}, ref: {probe: ref_obs}}


def _a_declared():
    """(subject, primary reference, probe, declared difference) of one declaration."""
    subject, refs = next((s, r) for s, r in fidelity.pairings().items()
                         if rtmod.get(s).probe_differences)
    n = next(iter(rtmod.get(subject).probe_differences))
    return subject, refs[0], n, rtmod.get(subject).probe_difference(n)


def test_compare_verdicts():
    n = "cb_write_after_close_empty"
    same = fidelity.compare(_fake({"obs": {"a": 1}}, {"obs": {"a": 1}}), [n])
    assert [r["verdict"] for r in same] == ["agree"]
    diff = fidelity.compare(_fake({"obs": {"a": 1}}, {"obs": {"a": 2}}), [n])
    assert [r["verdict"] for r in diff] == ["differ"]
    assert fidelity.undeclared(diff) == diff
    err = fidelity.compare(_fake({"error": "boom"}, {"obs": {}}), [n])
    assert [r["verdict"] for r in err] == ["error"] and fidelity.undeclared(err)
    skip = fidelity.compare(_fake({"obs": 1}, {"skip": "API does not map"}), [n])
    assert [r["verdict"] for r in skip] == ["n/a"] and not fidelity.undeclared(skip)


def test_declared_difference_is_not_a_gap():
    subject, ref, n, d = _a_declared()
    other = {k: ["something else"] for k in d.expected}
    rows = fidelity.compare(_fake({"obs": dict(d.expected)}, {"obs": other}, n, ref, subject), [n])
    assert rows[0]["verdict"] == "declared" and rows[0]["reason"] == d.reason
    assert fidelity.undeclared(rows) == []


def test_a_declared_probe_whose_value_changes_is_a_gap_again():
    """Issue 23: a declared probe counts as declared only while the subject still
    shows the declared value; a change (or a new differing key) fails --fail."""
    subject, ref, n, d = _a_declared()
    other = {k: ["something else"] for k in d.expected}
    changed = {k: ["changed"] for k in d.expected}
    for ours in (changed, dict(d.expected, extra_key=1)):
        rows = fidelity.compare(_fake({"obs": ours}, {"obs": other}, n, ref, subject), [n])
        assert rows[0]["verdict"] == "differ" and "not as declared" in rows[0]["reason"]
        assert fidelity.undeclared(rows) == rows


def test_secondary_difference_is_information():
    n = "cb_write_after_close_empty"
    rows = fidelity.compare(_fake({"obs": 1}, {"obs": 2}, n, "uvloop-protocol"), [n])
    assert rows[0]["verdict"] == "differ" and not rows[0]["primary"]
    assert fidelity.undeclared(rows) == []


def test_table_shows_only_the_differing_keys():
    n = "cb_write_after_close_empty"
    rows = fidelity.compare(_fake({"obs": {"same": 1, "k": "ours"}},
                                  {"obs": {"same": 1, "k": "ref"}}), [n])
    text = fidelity.table(rows)
    line = next(line for line in text.splitlines() if line.startswith(n))
    assert '"ref"' in line and '"ours"' in line and "same" not in line


def test_document_has_one_cell_per_probe_and_runtime(runs, rows):
    names = KERNEL_PROBES
    doc = fidelity.document(runs[0], rows, names)
    assert doc["schema"] == results.SCHEMA and "looplab" in doc and "env" in doc
    expected = sum(1 for rid in runs[0] for n in names if n in runs[0][rid])
    assert len(doc["cells"]) == expected
    ids = {c["id"] for c in doc["cells"]}
    assert len(ids) == expected
    cell = next(c for c in doc["cells"] if c["runtime"] == "callback"
                and c["variant"] == "cb_default_buffer_limits")
    assert cell["scenario"] == "fidelity"
    assert json.loads(cell["metrics"]["observation"]) == \
        runs[0]["callback"]["cb_default_buffer_limits"]["obs"]
    assert isinstance(cell["verdicts"]["agrees"], bool)


# ---------------------------------------------------------------------------
# The verb

def test_verb_exit_code_follows_undeclared_gaps(tmp_path, capsys):
    out = tmp_path / "fid.json"
    rc = _main(["--probes", "co_*,cb_default*", "--json", str(out), "--fail"])
    doc = json.loads(out.read_text())
    gaps = [k for k, v in doc["fidelity"].items() if v["primary"] and (v["differ"] or v["error"])]
    assert rc == (ExitCode.FAILED if gaps else ExitCode.OK)
    assert _main(["--probes", "co_*,cb_default*"]) == ExitCode.OK
    printed = capsys.readouterr().out
    assert "coro vs curio:" in printed and "agree" in printed


def test_declared_difference_does_not_fail(capsys):
    subject, _, n, _ = _a_declared()
    assert _main(["--runtimes", subject, "--probes", n, "--fail"]) == ExitCode.OK


def test_out_dir_gets_valid_json_and_the_report_section(tmp_path):
    from bench import results as res
    assert _main(["--probes", "cb_default*,co_event*", "--out", str(tmp_path / "o")]) == 0
    doc = json.loads((tmp_path / "o" / "fidelity.json").read_text())
    assert doc["cells"] and res.validate(doc) == []
    block = doc["fidelity_probes"]
    pairs = {p["pairing"]: p for p in block["pairings"]}
    assert pairs["callback vs asyncio-protocol"]["compared"] == 1
    md = (tmp_path / "o" / "fidelity.md").read_text()
    assert "| probe |" in md and "## Fidelity probes" in md
    assert md.count(fidelity.markdown_section(block)) == 1
    if "coro vs curio" in pairs:        # the declared difference is listed with its reason
        assert "co_event_wake_order" in md and "hash order" in md


def _rows():
    ref = {"obs": {"fifo": False, "n": 10}}
    ours = {"obs": {"fifo": True, "n": 10}}
    return fidelity.compare({"coro": {"co_event_wake_order": ours, "co_timeout_zero": ref},
                             "curio": {"co_event_wake_order": ref, "co_timeout_zero": ref}},
                            ["co_event_wake_order", "co_timeout_zero"])


def test_probes_block_counts_and_differences():
    block = fidelity.probes_block(_rows(), skipped=["trio"], elapsed_s=1.23)
    assert block["pairings"] == [{"pairing": "coro vs curio", "ours": "coro", "reference": "curio",
                                  "primary": True, "compared": 2, "agree": 1, "declared": 1,
                                  "differ": 0, "error": 0}]
    (d,) = block["differences"]
    assert d["probe"] == "co_event_wake_order" and d["verdict"] == "declared"
    assert d["reference_obs"] == '{"fifo":false}' and d["ours_obs"] == '{"fifo":true}'
    assert d["reason"] == fidelity.declared()[("co_event_wake_order", "curio")]
    assert block["skipped"] == ["trio"] and block["elapsed_s"] == 1.2
    json.dumps(block)


def test_main_report_markdown_and_terminal_show_the_probes():
    from bench import report
    block = fidelity.probes_block(_rows())
    doc = {"schema": 1, "looplab": "x", "run_id": "r", "env": {}, "cells": [],
           "fidelity_probes": block}
    md = report.render_markdown(doc, [])
    assert "## Fidelity probes: our kernels at the edges" in md
    assert "| coro vs curio | 1 / 2 | 1 | 0 | 0 |" in md and "hash order" in md
    assert "coro vs curio 1/2 agree, 1 declared, 0 undeclared" in report.render_terminal(doc)
    assert "Fidelity probes" not in report.render_markdown(dict(doc, fidelity_probes=None), [])


def test_main_job_runs_the_probes_and_hands_them_to_the_report(monkeypatch, tmp_path):
    import argparse
    from bench.verbs import run as run_verbs
    block = fidelity.probes_block(_rows())
    monkeypatch.setattr(fidelity, "measure", lambda *a, **k: ({}, [], [], block))
    seen = {}

    def fake_run_and_report(cells, out_dir, **kw):
        seen.update(kw, cells=cells, out_dir=out_dir)
        return ExitCode.OK
    monkeypatch.setattr(run_verbs, "run_and_report", fake_run_and_report)
    args = argparse.Namespace(main_out=str(tmp_path / "rep"))
    assert run_verbs.cmd_main_job(args) == ExitCode.OK
    assert seen["extra"] == {"fidelity_probes": block} and seen["cells"]


@pytest.mark.parametrize("argv,needle", [
    (["--probes", "nothing_like_this"], "no probe matches"),
    (["--runtimes", "bogus"], "unknown runtime 'bogus'"),
    (["--no-such-flag"], "unrecognized arguments"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, needle):
    try:
        rc = _main(argv)
    except SystemExit as exc:
        rc = exc.code
    assert rc == ExitCode.USAGE
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1


def test_json_to_a_directory_is_a_usage_error(tmp_path, capsys):
    assert _main(["--probes", "cb_default*", "--json", str(tmp_path)]) == ExitCode.USAGE
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


@pytest.mark.parametrize("option,name", [("--json", "fid.json"), ("--out", "dir")])
def test_unwritable_output_is_one_line_before_any_probe(tmp_path, capsys, monkeypatch, option, name):
    """Issue 23: an output that cannot be written is refused before anything runs."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    ran = []
    monkeypatch.setattr(fidelity, "measure", lambda *a, **k: ran.append(1))
    monkeypatch.setattr(fidelity, "collect", lambda *a, **k: ran.append(1))
    rc = _main(["--probes", "cb_default*", option, str(blocker / name)])
    err = capsys.readouterr().err
    assert rc == ExitCode.USAGE and ran == []
    assert len(err.strip().splitlines()) == 1 and option in err and "Traceback" not in err


def test_the_verb_goes_through_the_cli():
    from bench.verbs import fidelity as verb
    args = cli.build_parser().parse_args(["fidelity", "--probes", "cb_*", "--fail"])
    assert args.func is verb.run and args.fail and args.probes == "cb_*"
    assert not hasattr(fidelity, "main") and not hasattr(verb, "main")


def test_a_runtime_process_that_overruns_is_killed_and_reported():
    names = [n for n, p in PROBES.items() if p.style == "callback"][:3]
    out = fidelity.collect(["callback"], names, timeout=0.0)
    assert set(out["callback"]) == set(names)
    assert all("timed out" in rec.get("error", "") for rec in out["callback"].values())


# ---------------------------------------------------------------------------
# A runtime registered from outside is a subject like our kernels

def test_an_outside_runtime_is_a_subject_with_its_declared_references():
    """examples/selectkernel, loaded with --runtime-module, runs the stream probes
    through its own port and is compared with the reference it declares (in a fresh
    process: this one keeps seeing only the built-in runtimes)."""
    import os
    import subprocess
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "fidelity", "--runtime-module", "examples.selectkernel",
         "--runtimes", "selectkernel", "--fail",
         "--probes", "tk_sleep0_round_robin,tk_event_wake_order,tk_lazy_spawn_order"],
        cwd=root, capture_output=True, text=True, timeout=100)
    assert proc.returncode == ExitCode.OK, proc.stdout[-2000:] + proc.stderr
    # the reference is the one its RuntimeInfo declares (compared_with)
    assert "selectkernel vs asyncio-streams: 3/3 agree" in proc.stdout, proc.stdout
