"""The bug zoo (``bench.zoo``) and ``looplab repro``.

Every entry runs at the tiny preset and its oracle is checked both ways: the naive
program shows the bug and the fixed one does not, on a runtime where the entry says
it shows. An entry that no installed library and no option of ours can show is
checked for what it claims instead: not shown on its reference runtime, and it names
the option it needs. Each entry's cells run in one matrix (two at a time) when its test runs,
each in its own process with its peers in another; every program is bounded.
Every option flip that shows a bug is checked both ways: with its value the bug
shows, and on the same kernel at its defaults it does not.
"""
from __future__ import annotations

import json
import os

import pytest

from bench import results as resmod
from bench import scenario as scmod
from bench import run as matrix
from bench.cli import main as looplab
from protocols import runtimes as rtmod

scmod.load_plugins(modules=("bench.zoo",))
from bench import zoo  # noqa: E402 -- loaded as a scenario module first, as the verb does

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
    else:
        rt = _reference(e)
        out += [(rt, "naive", False), (rt, "fixed", False)]
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


@pytest.mark.timeout(360)
@pytest.mark.parametrize("eid", IDS)
def test_oracle_both_outcomes(eid):
    e = zoo.ENTRIES[eid]
    outcomes = _outcomes(eid)
    for spec, variant, expected in _checks(e):
        cell = outcomes[(eid, rtmod.parse(spec).spec, variant)]
        assert not cell["errors"], (spec, variant, cell["errors"])
        got = cell["verdicts"]["bug_shown"]
        assert got is expected, (spec, variant, cell["metrics"], cell["notes"])


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
    assert "## Bug zoo" in md and "| curio-164 | n/a |" in md
