"""The bug zoo (``bench.zoo``) and ``looplab repro``.

Every entry runs at the tiny preset and its oracle is checked both ways: the naive
program shows the bug and the fixed one does not, on a runtime where the entry says
it shows. An entry that no installed library and no option of ours can show is
checked for what it claims instead: not shown on its reference runtime, and it names
the option it needs. Each entry's cells run in one matrix (two at a time) when its test runs,
each in its own process with its peers in another; every program is bounded.
Every option flip that shows a bug is checked both ways: with its value the bug
shows, and on the same kernel at its defaults it does not; a runtime an entry names in
``not_on`` is measured not to show it. The TLS entries make their certificate at run
time and are skipped, with the reason, where no certificate can be made.
"""
from __future__ import annotations

import json
import os

import pytest
from packaging.requirements import Requirement

from bench import results as resmod
from bench.scenarios import api as scmod
from bench import run as matrix
from bench.cli import main as looplab
from bench import runtimes as rtmod

scmod.load_plugins(modules=("bench.zoo",))
from bench import zoo  # noqa: E402 -- loaded as a scenario module first, as the verb does
from bench.zoo import cancel, tls  # noqa: E402

IDS = list(zoo.ENTRIES)
# Where an entry that cannot show on this machine is measured not to show.
REFERENCE = {"callback": "asyncio-protocol", "stream": "asyncio-streams", "task": "trio"}


def _reference(e) -> str:
    return REFERENCE[e.styles[0]] if e.styles[0] in REFERENCE else e.styles[0]


def _checks(e) -> list[tuple[str, str, bool]]:
    """(runtime spec, variant, expected bug_shown) this entry is tested on."""
    out = []
    if e.show_on:
        rt = e.show_on[0]
        out += [(rt, "naive", True), (rt, "fixed", False)]
        # and on the first runtime named for each other port style it claims
        for style in e.styles:
            other = next((s for s in e.show_on if rtmod.parse(s).style == style), None)
            if other and other != rt:
                out += [(other, "naive", True), (other, "fixed", False)]
    else:
        rt = _reference(e)
        out += [(rt, "naive", False), (rt, "fixed", False)]
    out += [(rt, "naive", False) for rt in e.not_on]
    out += [(f.spec, "naive", f.shows) for f in e.flips if f.spec != (e.show_on or ("",))[0]]
    # A flip that shows the bug: the kernel at its defaults (the option's other value,
    # the installed reference's) does not.
    for f in e.flips:
        base = (f.spec.split(":")[0], "naive", False)
        if f.shows and base not in out:
            out.append(base)
    return out


def _outcomes(eid: str) -> dict:
    """The entry's cells, run (two at a time) only when a selected test needs them,
    so that ``-k ENTRY`` runs that entry's cells alone."""
    e = zoo.ENTRIES[eid]
    cells = []
    for spec, variant, _ in _checks(e):
        cells += matrix.plan(e.id, spec, variant, "tiny")
    done, interrupted = matrix.run_matrix(cells, jobs=2)
    assert not interrupted
    return {(r["scenario"], rtmod.parse(r["runtime"]).spec, r["variant"]): r for r in done}


def test_the_zoo_has_twenty_complete_entries():
    assert len(zoo.ENTRIES) >= 20
    for e in zoo.ENTRIES.values():
        assert e.link.startswith("https://"), e.id
        assert e.mechanism.count(". ") >= 1 and e.reported and e.fixed_in and e.expected, e.id
        assert e.oracle and e.scenario.verdicts == zoo.VERDICT, e.id
        assert e.scenario.variants == ("naive", "fixed"), e.id
        assert set(e.scenario.presets) == {"tiny", "quick"}, e.id
        for style in e.styles:     # a program for every style it claims
            assert any(k in e.scenario.programs for k in (style, "*")) or e.id in (
                "twisted-8868", "aiohttp-1367"), (e.id, style)
        # Either it shows somewhere here, or it says which option it needs.
        assert e.show_on or e.needs, e.id
        for name in e.names():
            assert zoo.entry(name.upper()) is e
        # How the card was checked, and what a pinned run would install.
        assert len(e.verified) > 40, e.id
        for req in e.affected_versions + e.fixed_versions:
            assert Requirement(req).specifier, (e.id, req)
        assert e.runs_on().startswith(f"{e.kind()}: "), e.id
        assert (e.kind() == "real") == (not e.stand_in), e.id


def test_the_zoo_page_lists_every_card():
    """docs/zoo.md's Cards table is the entries' own card fields, entry by entry."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "docs", "zoo.md")) as f:
        page = f.read()
    for e in zoo.ENTRIES.values():
        row = next((line for line in page.splitlines()
                    if line.startswith(f"| `{e.id}` | {e.kind()}")), None)
        assert row is not None, e.id
        assert e.runs_on().replace("|", "\\|") in row and e.verified.replace("|", "\\|") in row, e.id


def test_tls_and_cancellation_entries_are_registered():
    def module_of(e):
        program = e.scenario.programs.get("stream")
        return getattr(program, "__module__", None)
    tls_ids = [e.id for e in zoo.ENTRIES.values() if module_of(e) == tls.__name__]
    cancel_ids = [e.id for e in zoo.ENTRIES.values() if module_of(e) == cancel.__name__]
    assert len(tls_ids) >= 2 and len(cancel_ids) >= 5, (tls_ids, cancel_ids)
    for i in tls_ids:       # the simulated network has no TLS: each says so
        assert zoo.ENTRIES[i].real_only and zoo.ENTRIES[i].sim_skip()
    for i in cancel_ids:    # each declares the least activity its oracle needs
        assert zoo.ENTRIES[i].minimum, i


@pytest.mark.timeout(360)
@pytest.mark.parametrize("eid", IDS)
def test_oracle_both_outcomes(eid):
    e = zoo.ENTRIES[eid]
    if getattr(e.scenario.programs.get("stream"), "__module__", None) == tls.__name__:
        why = tls.certificate()
        if isinstance(why, str):
            pytest.skip(why)
    outcomes = _outcomes(eid)
    for spec, variant, expected in _checks(e):
        cell = outcomes[(eid, rtmod.parse(spec).spec, variant)]
        assert not cell["errors"], (spec, variant, cell["errors"])
        got = cell["verdicts"]["bug_shown"]
        assert got is expected, (spec, variant, cell["metrics"], cell["notes"])


@pytest.mark.timeout(120)
def test_tls_entry_on_a_kernel_without_tls_is_not_measured():
    """Our kernels have no TLS: the cell says so and measures nothing, rather than
    reporting the bug as absent from a program that never ran."""
    [cell] = matrix.plan("cpython-118950", "hybrid", "naive", "tiny")
    done, interrupted = matrix.run_matrix([cell], jobs=1)
    assert not interrupted
    [r] = done
    assert r["metrics"]["iterations_after_reset_count"] is None
    assert any("not measured: our kernels have no TLS" in n for n in r["notes"]), r["notes"]
    assert r["verdicts"]["bug_shown"] is not True


def test_versions_are_read_from_the_installed_libraries():
    v = zoo.installed_versions()
    assert v["python"].count(".") == 2
    e = zoo.entry("cpython-127655")
    e_old = dict(e.affects)
    try:
        e.affects = {"python": ("3.12.0", "3.12.9")}
        inside = zoo.affected_note(e, {"python": "3.12.4"})[0]
        outside = zoo.affected_note(e, {"python": "3.11.7"})[0]
        missing = zoo.affected_note(e, {"python": None})[0]
    finally:
        e.affects = e_old
    assert "inside" in inside and "outside" in outside and "not installed" in missing


def test_repro_list(capsys):
    assert looplab(["repro", "--list"]) == 0
    out = capsys.readouterr().out
    for eid in IDS:
        assert eid in out
    assert f"{len(IDS)} bugs" in out


@pytest.mark.parametrize("argv, needle", [
    (["repro", "no-such-bug"], "unknown bug 'no-such-bug'"),
    (["repro", "curio-164", "--knob", "bogus=1"], "unknown --knob 'bogus'"),
    (["repro", "curio-164", "--knob", "spawn=maybe"], "bad value 'maybe'"),
    (["repro", "curio-164", "--knob", "spawn"], "expected OPT=VAL"),
    (["repro"], "give one bug"),
    (["repro", "curio-164", "--all"], "give one bug"),
    (["repro", "curio-164", "--preset", "huge"], "invalid choice"),
])
def test_repro_usage_errors_are_one_line_exit_2(capsys, argv, needle):
    try:
        rc = looplab(argv)
    except SystemExit as exc:       # argparse errors exit from the parser
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.timeout(120)
def test_repro_one_bug_end_to_end(tmp_path, capsys):
    out, js = tmp_path / "rep", tmp_path / "r.json"
    rc = looplab(["repro", "C18", "--runtimes", "coro,trio", "--knob", "spawn=eager",
                  "--out", str(out), "--json", str(js), "--jobs", "2"])
    text = capsys.readouterr().out
    assert rc == 0
    assert "curio-164" in text and "https://github.com/dabeaz/curio/issues/164" in text
    assert "verdict: shown on: coro, trio" in text
    assert "coro:spawn=eager -> not shown" in text
    doc = json.loads(js.read_text())
    assert resmod.validate(doc) == []
    specs = {c["runtime"] for c in doc["cells"]}
    assert specs == {"coro", "trio", "coro:spawn=eager", "hybrid:spawn=eager"}
    assert all(set(c["verdicts"]) == {"bug_shown"} for c in doc["cells"])
    assert doc["zoo"]["bugs"][0]["shown_on"] == ["coro", "trio"]
    for name in ("report.md", "report.html", "results.json", "zoo.md"):
        assert os.path.exists(out / name), name
    md = (out / "report.md").read_text()
    assert "## Bug zoo" in md and "| curio-164 | - | - | real (installed) | n/a |" in md


def test_the_verdict_line_says_what_was_shown_where():
    """A runtime the user named with options (not one of the entry's flips) is
    reported like any runtime: "shown on: SPEC", never "shown on: none; not shown
    on: none; option flips: SPEC -> shown"; a --knob runtime stays a flip."""
    from bench.verbs import repro
    e = zoo.ENTRIES["uvloop-631"]
    named, knob = "asyncio-protocol:loop=looplab,loop.write=defer", "callback:write=defer"

    def cell(rt, variant, shown):
        return {"scenario": e.id, "runtime": rt, "variant": variant,
                "verdicts": {"bug_shown": shown}}
    cells = [cell(named, "naive", True), cell(named, "fixed", False),
             cell("trio", "naive", None), cell(knob, "naive", True)]
    s = repro.summarize(zoo, e, cells, knobs=[knob])
    line = repro.verdict_line(s)
    assert s["shown_on"] == [named] and [f["runtime"] for f in s["flips"]] == [knob]
    assert line == (f"shown on: {named}; not measured (or an error) on: trio; "
                    f"option flips: {knob} -> shown")
    assert repro.verdict_line(repro.summarize(zoo, e, [cell(knob, "naive", True)], [knob])) \
        == f"option flips: {knob} -> shown"
