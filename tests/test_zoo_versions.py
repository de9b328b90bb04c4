"""Versions as environments: pinned releases in runtime specs (``+DIST==VERSION``),
the zoo's version points (``bench.zoo.versions``) and ``looplab repro --versions``.

The grammar and the planning are in-process and fast (the interpreters found are
replaced by a fixed list). One end-to-end test runs uvloop-631 at one affected and at
the fixed uvloop release: two environments, built once in the user's cache (about
30 s each the first time, reused after), four cells. It skips with the reason where
this Python has no other uvloop wheel or the package index is out of reach. The
wide matrix (every entry at every version) runs only through the command:
``looplab repro --all --versions`` (docs/zoo.md).
"""
from __future__ import annotations

import platform
import sys
from types import SimpleNamespace

import pytest

from protocols import asyncio_ports
from bench.host import envs
from bench.scenarios import api as scmod
from bench import run as scenarios
from bench.cli import main as looplab
from bench.errors import UsageError
from bench import runtimes as rtmod

scmod.load_plugins(modules=("bench.zoo",))
from bench import zoo  # noqa: E402 -- loaded as a scenario module first, as the verb does
from bench.zoo import versions  # noqa: E402

# ---------------------------------------------------------------------------
# The grammar


@pytest.mark.parametrize("spec, canonical, pins", [
    ("asyncio-streams@3.11+uvloop==0.22.1:loop=uvloop", "uvloop-streams@3.11+uvloop==0.22.1",
     ("uvloop==0.22.1",)),
    ("uvloop-protocol@3.12.1+UVLoop==0.21.0", "uvloop-protocol@3.12.1+uvloop==0.21.0",
     ("uvloop==0.21.0",)),
    ("asyncio-streams@3.11+typing_Extensions==4.8.0+aiohttp==3.8.6",
     "asyncio-streams@3.11+aiohttp==3.8.6+typing-extensions==4.8.0",
     ("aiohttp==3.8.6", "typing-extensions==4.8.0")),
    ("asyncio-streams@3.12", "asyncio-streams@3.12", ()),
])
def test_pins_parse_and_print_one_way(spec, canonical, pins):
    rt = rtmod.parse(spec)
    assert rt.pins == pins and rt.spec == canonical
    assert rtmod.parse(rt.spec).spec == canonical


def test_a_list_splits_at_pinned_specs():
    got = [r.spec for r in rtmod.parse_list(
        "uvloop-streams@3.11+uvloop==0.22.1,asyncio-protocol@3.11+uvloop==0.21.0:loop=uvloop,"
        "loop.debug=true,trio")]
    assert got == ["uvloop-streams@3.11+uvloop==0.22.1",
                   "uvloop-protocol@3.11+uvloop==0.21.0:loop.debug=true", "trio"]


@pytest.mark.parametrize("spec, words", [
    ("uvloop-streams+uvloop==0.22.1", "needs an interpreter"),
    ("uvloop-streams@3.11+uvloop>=0.22", "bad pin"),
    ("uvloop-streams@3.11+", "bad pin"),
    ("uvloop-streams@3.11+uvloop==0.21.0+uvloop==0.22.1", "pinned twice"),
])
def test_bad_pins_are_one_line(spec, words):
    with pytest.raises(UsageError, match=words) as info:
        rtmod.parse(spec)
    assert "\n" not in str(info.value)


def test_a_pin_replaces_the_loops_requirement_and_keys_the_environment():
    plain = rtmod.parse("uvloop-streams@3.11")
    old = rtmod.parse("uvloop-streams@3.11+uvloop==0.22.1")
    new = rtmod.parse("uvloop-streams@3.11+uvloop==0.23.0")
    assert envs.requirements(plain) == (asyncio_ports.LOOP_REQUIREMENTS["uvloop"],)
    assert envs.requirements(old) == ("uvloop==0.22.1",)
    assert envs.requirements(rtmod.parse("asyncio-streams@3.11+aiohttp==3.8.6")) == ("aiohttp==3.8.6",)
    it = envs.Interpreter("/usr/bin/python3.11", "3.11.7", "CPython", "test")
    names = {envs._name(it, envs.requirements(r)) for r in (plain, old, new)}
    assert len(names) == 3


# ---------------------------------------------------------------------------
# Planning an entry's versions (the interpreters found are a fixed list here)

FOUND = [envs.Interpreter(f"/py/{v}/bin/python", v, "CPython", "test")
         for v in ("3.13.0", "3.12.1", "3.11.7", "3.10.13")]


@pytest.fixture
def found(monkeypatch):
    monkeypatch.setattr(envs, "found", lambda: list(FOUND))


def _entry(**versions):
    return SimpleNamespace(id="x-1", styles=("stream",), stand_in="", **versions)


@pytest.mark.parametrize("version, req, ok", [
    ("3.11.7", "python>=3.8,<3.12", True), ("3.12.1", "python>=3.8,<3.12", False),
    ("3.12.1", "python==3.12", True), ("3.12.1", "python==3.12.2", False),
    ("3.12.9", "python>=3.12.9,<3.13", True), ("3.13.0", "python>=3.12.9,<3.13", False),
    ("3.11.7", "python<3.12", True), ("3.11.7", "python!=3.11", False),
])
def test_requirements_are_read_as_release_ranges(version, req, ok):
    assert versions.satisfies(version, versions.parse_requirement(req)[1]) is ok


def test_points_are_the_interpreters_found_and_the_exact_releases(found):
    e = _entry(affected_versions=("python>=3.8,<3.12", "uvloop==0.22.1"),
               fixed_versions=("python>=3.12.0", "uvloop>=0.23"),
               unaffected_versions=("python==3.4.3", "python==3.10"))
    pts = versions.points(e)
    ran = [(p.role, p.interpreter, p.pins) for p in pts if p.reason is None]
    here = platform.python_version()
    assert ran == [("affected", "3.11.7", ()), ("affected", here, ("uvloop==0.22.1",)),
                   ("fixed", "3.12.1", ()), ("fixed", "3.13.0", ())]
    off = {p.requirement: p.reason for p in pts if p.reason is not None}
    assert "below looplab's minimum" in off["python==3.10"]      # 3.10.13 fits, too old
    assert "exact" in off["uvloop>=0.23"]
    assert "no such Python" in off["python==3.4.3"]


def test_a_library_no_runtime_runs_is_not_run_unless_the_entry_names_runtimes(found):
    stand_in = versions.points(_entry(affected_versions=("aiohttp==3.8.6",)))
    assert stand_in[0].reason and "stands in" in stand_in[0].reason
    named = _entry(affected_versions=("aiohttp==3.8.6",), version_runtimes=(
        rtmod.ordered()[rtmod.ordered().index(_stream_asyncio())],))
    planned = versions.plan(named)
    assert [spec for _, spec in planned] == [
        f"{_stream_asyncio()}@{platform.python_version()}+aiohttp==3.8.6"]


def _stream_asyncio() -> str:
    """asyncio's own stream runtime, from the registry (no id spelled here)."""
    return next(rid for rid in rtmod.ordered()
                if rtmod.get(rid).library == "python" and rtmod.get(rid).style == "stream")


def test_the_summary_reads_verdicts_per_version_and_flags_disagreement(found):
    e = _entry(affected_versions=("python==3.11",), fixed_versions=("python==3.12",))
    planned = versions.plan(e)
    specs = [spec for _, spec in planned]

    def cell(spec, variant, shown, py):
        return {"scenario": "x-1", "runtime": spec, "variant": variant,
                "verdicts": {"bug_shown": shown},
                "environment": {"interpreter": {"version": py}, "libraries": {}}}
    good = [cell(specs[0], "naive", True, "3.11.7"), cell(specs[0], "fixed", False, "3.11.7"),
            cell(specs[1], "naive", False, "3.12.1"), cell(specs[1], "fixed", False, "3.12.1")]
    s = versions.summarize(e, planned, good)
    assert s["shown_pair"] and [r["versions"] for r in s["rows"]] == ["Python 3.11.7", "Python 3.12.1"]
    assert versions.runs_on_cell(SimpleNamespace(stand_in="a knob"), s).endswith("real at pinned releases")
    unrun = versions.summarize(e, planned, [])
    assert versions.runs_on_cell(SimpleNamespace(stand_in="a knob"), unrun) == "knob: a knob"
    bad = good[:2] + [cell(specs[1], "naive", True, "3.12.1"), good[3]]
    s = versions.summarize(e, planned, bad)
    assert not s["shown_pair"] and s["rows"][1]["agrees"] is False
    assert "not as the card expects" in versions.verdict_line(s)


def test_versions_is_never_a_usage_error_for_a_card_without_versions(capsys):
    # trio-412 names no release (the bug is the program's own): the card and why, exit 0
    assert looplab(["repro", "trio-412", "--versions"]) == 0
    assert "names no versions" in capsys.readouterr().out


def test_versions_refuses_what_it_cannot_combine_with(capsys):
    assert looplab(["repro", "uvloop-631", "--versions", "--net", "sim"]) == 2
    assert "real network" in capsys.readouterr().err


def test_every_cards_versions_are_requirements_this_module_reads():
    for e in zoo.ENTRIES.values():
        for _, req in versions.versions_of(e):
            name, clauses = versions.parse_requirement(req)   # raises on a malformed one
            assert name and clauses, (e.id, req)


# ---------------------------------------------------------------------------
# End to end: uvloop-631 at an affected and at the fixed release


@pytest.fixture(scope="session")
def uvloop_631():
    """The planned runs of uvloop-631 at uvloop 0.22.1 and 0.23.0 on one stream
    runtime, their environments built (or a skip with pip's reason)."""
    e = zoo.entry("uvloop-631")
    planned = [(p, spec) for p, spec in versions.plan(e)
               if spec and p.pins in (("uvloop==0.22.1",), ("uvloop==0.23.0",))
               and rtmod.parse(spec).style == "stream"]
    if len(planned) != 2:
        pytest.skip(f"uvloop-631's card no longer names 0.22.1 and 0.23.0: {planned}")
    try:
        for _, spec in planned:
            envs.ensure(rtmod.parse(spec))
    except UsageError as exc:
        pytest.skip(f"an environment for uvloop-631 could not be built here: {exc}")
    return e, planned


@pytest.mark.timeout(600)
@pytest.mark.skipif(sys.platform == "win32", reason="uvloop has no Windows build")
def test_uvloop_631_shows_at_the_affected_release_and_not_at_the_fixed_one(uvloop_631):
    e, planned = uvloop_631
    cells = []
    for _, spec in planned:
        cells += scenarios.plan(e.id, spec, "naive,fixed", "tiny")
    done, interrupted = scenarios.run_matrix(cells, jobs=2)
    assert not interrupted
    s = versions.summarize(e, planned, done)
    by = {r["label"].split(" (")[0]: r for r in s["rows"]}
    assert by["uvloop 0.22.1"]["naive"] == "shown", s
    assert by["uvloop 0.23.0"]["naive"] == "not shown", s
    assert all(r["fixed"] == "not shown" for r in s["rows"]), s
    # the exact releases, measured in each cell's own interpreter
    assert by["uvloop 0.22.1"]["versions"].endswith("uvloop 0.22.1")
    assert by["uvloop 0.23.0"]["versions"].endswith("uvloop 0.23.0")
    assert s["shown_pair"]
