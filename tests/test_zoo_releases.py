"""The zoo at real framework releases: bare environments for interpreters below looplab's
minimum (bench.host.envs.build_bare), standalone programs (bench/zoo/programs), the RESP
peer, the cards' expectations (bench/zoo/expected.py) and what ``looplab repro`` does
with them.

Fast tests plan and judge in-process. One end-to-end test runs an old-interpreter row as
the suite's representative: redis-py-2624 at redis 4.5.3 and 4.5.4 on Python 3.10 (two
bare environments of wheels, built once in the user's cache, about 20 s each the first
time; skipped with the reason where Python 3.10 or the package index is missing). The
modern pinned row is tests/test_zoo_versions.py's uvloop-631. Every other release row
(aiohttp 1.x and Twisted compile from source: about a minute each the first time) runs
with ``LOOPLAB_ALL_RELEASES=1`` or through the command, ``looplab repro --all --versions``.
"""
from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from bench import runtimes as rtmod
from bench.cli import main as looplab
from bench.errors import UsageError
from bench.host import envs
from bench.peers import resp
from bench.peers.core import Recv, Send
from bench.scenarios import api as scmod
from bench import run as scenarios

scmod.load_plugins(modules=("bench.zoo",))
from bench import zoo  # noqa: E402
from bench.verbs import repro  # noqa: E402
from bench.zoo import versions  # noqa: E402
from bench.zoo.expected import EXPECT  # noqa: E402

REAL = ("aiohttp-1367", "aiohttp-1221", "twisted-8868", "starlette-1012", "redis-py-2624",
        "uvicorn-336", "cpython-74116", "sanic-2921")


# ---------------------------------------------------------------------------
# What the cards expect, and what `repro ID` runs by default

def test_every_card_names_its_runtimes_and_only_those_of_its_styles():
    assert set(EXPECT) == set(zoo.ENTRIES)
    for e in zoo.ENTRIES.values():
        assert e.expect, e.id
        for rid in e.expect:
            assert rtmod.get(rid).style in e.styles, (e.id, rid)
            assert ":" not in rid and "@" not in rid, (e.id, rid)


def test_repro_runs_the_card_runtimes_and_its_flips_by_default():
    e = zoo.entry("uvicorn-451")
    specs = [r.spec for r in repro._runtimes_for(e, None, [])]
    assert set(specs) <= set(e.expect) | {f.spec for f in e.flips}
    assert "hybrid" not in specs        # the card does not name it: "not measured" there
    e = zoo.entry("uvloop-631")
    assert {f.spec for f in e.flips} <= set(r.spec for r in repro._runtimes_for(e, None, []))


def _summary(e, rows):
    s = {"rows": rows}
    s["off_card"] = repro.off_card(e, s)
    return s


def test_a_cell_off_the_card_is_named_and_a_skipped_one_is_not_judged():
    e = zoo.entry("uvloop-471")     # shown on uvloop-streams, not on asyncio-streams
    ok = _summary(e, {"uvloop-streams": {"naive": "shown", "fixed": "not shown"},
                      "asyncio-streams": {"naive": "not shown", "fixed": "not shown"},
                      "asyncio-streams:loop=rloop": {"naive": "error", "fixed": "error"}})
    assert ok["off_card"] == []     # a runtime the card does not name is not a check
    bad = _summary(e, {"uvloop-streams": {"naive": "not measured", "fixed": "not shown"},
                       "asyncio-streams": {"naive": "skipped", "fixed": "skipped"}})
    assert len(bad["off_card"]) == 1 and "uvloop-streams" in bad["off_card"][0]
    flip = zoo.entry("uvloop-631").flips[0]
    s = _summary(zoo.entry("uvloop-631"), {flip.spec: {"naive": "not shown", "fixed": "not shown"}})
    assert s["off_card"] and flip.spec in s["off_card"][0]


def test_the_real_entries_have_release_programs_and_say_re_enactment_otherwise():
    for eid in REAL:
        e = zoo.entry(eid)
        assert e.version_run is not None and e.program_file, eid
        assert os.path.exists(e.scenario.program_file), eid
        assert "--versions runs the real releases" in e.runs_on()
    kinds = {e.id: e.kind() for e in zoo.ENTRIES.values()}
    assert kinds["twisted-8868"] == "re-enactment" and kinds["uvloop-631"] == "knob"
    assert kinds["trio-412"] == "real"


# ---------------------------------------------------------------------------
# Planning release rows: the interpreter a library's rows run on

OLD = envs.Interpreter("/py/3.6.15/bin/python", "3.6.15", "CPython", "test")


def test_a_library_row_runs_on_the_cards_python_in_a_bare_environment(monkeypatch):
    monkeypatch.setattr(envs, "locate", lambda token: OLD)
    e = SimpleNamespace(id="x-1", styles=("stream",), stand_in="", version_python="3.6",
                        program_file="x.py", version_runtimes=("asyncio-streams",),
                        affected_versions=("aiohttp==1.2.0",), fixed_versions=(),
                        unaffected_versions=(), version_with={"aiohttp==1.2.0": ("yarl==0.8.1",)})
    (p,) = versions.points(e)
    assert p.reason is None and p.interpreter == "3.6.15"
    assert p.pins == ("aiohttp==1.2.0", "yarl==0.8.1") and p.label == "aiohttp 1.2.0 (Python 3.6.15)"
    (point, spec), = versions.plan(e)
    assert spec == "asyncio-streams@3.6.15+aiohttp==1.2.0+yarl==0.8.1"
    without = SimpleNamespace(**{**vars(e), "program_file": ""})
    (p,) = versions.points(without)
    assert p.reason and "no standalone program" in p.reason


def test_a_bare_runtime_is_refused_by_run_and_skipped_without_a_program(monkeypatch):
    monkeypatch.setattr(envs, "locate", lambda token: OLD)
    rt = rtmod.parse("asyncio-streams@3.6.15+aiohttp==1.2.0")
    assert envs.is_bare(rt)
    assert not envs.is_bare(rtmod.parse("asyncio-streams"))
    with pytest.raises(UsageError, match="below looplab's minimum"):
        envs.prepare([rt])
    from bench.run.net import RealNetwork, SimNetwork
    cell = SimpleNamespace(rt=rt, runtime=rt.spec, scenario="S1", sc=SimpleNamespace(program_file=""),
                           world=None)
    assert "ships no standalone program" in RealNetwork().unable(cell)
    monkeypatch.setattr(envs, "unavailable_reason", lambda rt: None)
    cell.sc = SimpleNamespace(program_file="x.py", real_network_only="")
    assert "only on the real network" in SimNetwork().unable(cell)


# ---------------------------------------------------------------------------
# The RESP peer (sans-IO)

def test_resp_commands_are_parsed_whole_and_answered_in_order_after_the_delay():
    cmds, rest = resp.parse_commands(b"*2\r\n$3\r\nGET\r\n$4\r\nkey0\r\n*1\r\n$4\r\nPI")
    assert cmds == [[b"GET", b"key0"]] and rest == b"*1\r\n$4\r\nPI"
    assert resp.reply_for([b"GET", b"k"]) == b"$7\r\nvalue:k\r\n"
    assert resp.reply_for([b"PING"]) == b"+PONG\r\n" and resp.reply_for([b"SELECT", b"1"]) == b"+OK\r\n"
    role = resp.RespServer({"name": "redis", "role": "resp_server", "reply_delay_s": 0.2,
                            "recv_bytes": 4096}, now=0.0)
    role.connected(0.0)
    role.on_data(b"*2\r\n$3\r\nGET\r\n$1\r\na\r\n*2\r\n$3\r\nGET\r\n$1\r\nb\r\n", 1.0)
    act = role.next(1.1)
    assert isinstance(act, Recv) and act.until == pytest.approx(1.2)     # reads while it waits
    act = role.next(1.25)
    assert isinstance(act, Send) and act.data == b"$7\r\nvalue:a\r\n$7\r\nvalue:b\r\n"
    assert role.result["answered"] == ["a", "b"] and role.result["commands_count"] == 2
    with pytest.raises(ValueError):
        resp.parse_commands(b"GET a\r\n")


# ---------------------------------------------------------------------------
# End to end: an old-interpreter row (redis-py on Python 3.10, a bare environment)

def _rows(eid, keep):
    e = zoo.entry(eid)
    planned = [(p, spec) for p, spec in versions.plan(e) if spec and keep(p)]
    try:
        for _, spec in planned:
            envs.ensure(rtmod.parse(spec))
    except UsageError as exc:
        pytest.skip(f"a bare environment for {eid} could not be built here: {exc}")
    return e, planned


def _run_rows(e, planned):
    cells = []
    for _, spec in planned:
        cells += scenarios.plan(e.id, spec, ",".join(e.version_variants), "tiny")
    done, interrupted = scenarios.run_matrix(cells, jobs=1)
    assert not interrupted
    return versions.summarize(e, planned, done)


@pytest.mark.timeout(600)
def test_redis_py_2624_shows_at_4_5_3_and_not_at_4_5_4_on_the_real_client():
    e, planned = _rows("redis-py-2624", lambda p: p.pins[:1] in (("redis==4.5.3",), ("redis==4.5.4",)))
    if len(planned) != 2:
        pytest.skip(f"redis-py-2624's card no longer names 4.5.3 and 4.5.4 here: {planned}")
    s = _run_rows(e, planned)
    by = {r["label"]: r for r in s["rows"]}
    assert by["redis 4.5.3 (Python 3.10.13)"]["naive"] == "shown", s
    assert by["redis 4.5.4 (Python 3.10.13)"]["naive"] == "not shown", s
    assert by["redis 4.5.3 (Python 3.10.13)"]["versions"].startswith("Python 3.10.13, redis 4.5.3")
    assert s["shown_pair"]


@pytest.mark.timeout(1800)
@pytest.mark.skipif(not os.environ.get("LOOPLAB_ALL_RELEASES"),
                    reason="every release row (aiohttp 1.x and Twisted build from source, about "
                           "a minute each the first time): set LOOPLAB_ALL_RELEASES=1")
@pytest.mark.parametrize("eid", REAL)
def test_every_real_entry_shows_at_its_affected_release_and_not_at_the_fixed_one(eid):
    e, planned = _rows(eid, lambda p: True)
    s = _run_rows(e, planned)
    assert s["shown_pair"], s
    assert all(r["agrees"] for r in s["rows"] if r["runtime"]), s


def test_versions_on_a_card_with_versions_is_not_a_usage_error(capsys, monkeypatch):
    # every version of the card made unrunnable: the rows say why, exit 1, no usage error
    monkeypatch.setattr(versions, "_library_interpreter", lambda e: (None, "no Python 3.6 here (test)"))
    assert looplab(["repro", "aiohttp-1367", "--versions"]) == 1
    out, err = capsys.readouterr()
    assert "no Python 3.6 here (test)" in out and "nothing measured" in err


@pytest.mark.timeout(300)
def test_cpython_86296_on_old_pythons_runs_the_standalone_race():
    # Python rows below looplab's minimum: a bare environment with no pins (a venv)
    e, planned = _rows("cpython-86296", lambda p: p.interpreter in ("3.7.16", "3.9.18"))
    if len(planned) != 2:
        pytest.skip(f"Python 3.7.16 and 3.9.18 are not both here: {planned}")
    s = _run_rows(e, planned)
    by = {r["label"]: r for r in s["rows"]}
    assert by["Python 3.9.18"]["naive"] == "shown" and by["Python 3.9.18"]["role"] == "affected", s
    assert by["Python 3.7.16"]["naive"] == "not shown" and by["Python 3.7.16"]["role"] == "unaffected", s


def test_a_users_scenario_named_like_a_zoo_alias_wins_in_explore():
    # issue 35: with a user scenario C8, `looplab explore C8` explored asyncio-263 (alias C8)
    from bench.explore import targets
    from bench.scenarios.api import _REGISTRY
    assert targets.resolve("C8").sid == "asyncio-263"          # no user scenario: the alias
    mine = scmod.Scenario(id="C8", title="t", summary="s", run=lambda ctx: ({}, {"ok": True}, []),
                          presets={"tiny": {}}, metrics=[scmod.Metric("x_count")],
                          verdicts={"ok": "fine"}, variants=("naive",))
    scmod.register(mine)
    try:
        assert targets.resolve("C8").sid == "C8"
        assert targets.resolve("zoo:C8").sid == "asyncio-263"  # the entry, by its prefix
    finally:
        _REGISTRY.pop("C8", None)
