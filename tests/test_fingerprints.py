"""S4 causality fingerprints: each runtime's measured row equals its declared row
(fidelity), and flipping one kernel option changes exactly the metric it claims.

The fraction metric is a frequency; trials stay at 100 so a run is ~1 s per
runtime. The declarations live on each runtime (``RuntimeInfo.fingerprint``); tolerances
come from ``protocols.fingerprint`` (±0.1, trio's "strictly between
0.2 and 0.8"), so a fingerprint test never depends on one lucky draw.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bench.scenarios import causality
from bench import runtimes
from protocols.fingerprint import Between, Fingerprint, Near, satisfies

TRIALS = 100




def _require(runtime_id: str) -> None:
    rt = runtimes.parse(runtime_id)
    reason = rt.unavailable_reason()
    if reason:
        pytest.skip(reason)


def _flips() -> list[str]:
    return [spec for rid, info in runtimes.RUNTIMES.items() if info.fingerprint
            for spec in info.fingerprint.flip_specs(rid)]


@pytest.mark.parametrize("runtime_id", list(runtimes.RUNTIMES))
def test_fingerprint_matches_declared(runtime_id):
    _require(runtime_id)
    fp = causality.fingerprint(runtime_id, trials=TRIALS)
    assert causality.matches(runtime_id, fp) == [], fp
    assert fp["runtime"] == runtime_id and fp["trials"] == TRIALS
    json.dumps(fp)                  # it crosses a process boundary as JSON
    for metric in causality.METRICS:
        if fp[metric] is None:      # unknown is never silent
            assert fp["notes"].get(metric), f"{metric} is None without a reason"


@pytest.mark.parametrize("flip", _flips())
def test_flip_changes_exactly_the_declared_metric(flip):
    rt = runtimes.parse(flip)
    _require(rt.id)
    fp = causality.fingerprint(flip, trials=TRIALS)
    # Every metric matches: the flipped ones their new declaration, the rest the base row.
    assert causality.matches(flip, fp) == [], fp
    base = rt.info.fingerprint.row
    (name, value), = ((n, v) for n, v in rt.options.items()
                      if v != rt.info.options.defaults()[n])
    for metric in rt.info.fingerprint.flip(name, value):
        assert not satisfies(base[metric], fp[metric]), (
            f"{flip} was declared to change {metric}, but it still matches the base "
            f"declaration {base[metric]!r}: measured {fp[metric]!r}")


def _edge_obs(spec: str, probe: str) -> dict:
    """One fidelity probe (bench.fidelity) on ``spec`` in its own process."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-m", "bench.fidelity.worker", spec, probe], cwd=root,
                          capture_output=True, text=True, timeout=60)
    rec = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "obs" in rec, (spec, rec)
    return rec["obs"]


def _edge_flips() -> list:
    """(flipped spec, probe, change) for every RuntimeInfo.probe_flips declaration."""
    return [(f"{info.id}:{flip}", probe, change) for info in runtimes.RUNTIMES.values()
            for flip, probes in info.probe_flips.items() for probe, change in probes.items()]


@pytest.mark.parametrize("spec,probe,change", _edge_flips(),
                         ids=[f"{s}-{p}" for s, p, _ in _edge_flips()])
def test_edge_flip_changes_exactly_its_declared_observations(spec, probe, change):
    # Options S4 cannot see (wait_for, cancel_base) are checked by the edge probe that
    # can: the declared keys take the declared values only when the option is flipped,
    # and nothing else in the observation moves.
    base = _edge_obs(spec.split(":")[0], probe)
    flipped = _edge_obs(spec, probe)
    for key, value in change.items():
        assert flipped[key] == value, (key, flipped)
        assert base[key] != value, (key, base)
    assert {k: v for k, v in flipped.items() if k not in change} == \
        {k: v for k, v in base.items() if k not in change}


def test_every_edge_flip_has_an_s4_declaration_and_names_a_real_probe():
    from bench.fidelity import PROBES
    assert _edge_flips()
    for info in runtimes.RUNTIMES.values():
        for flip, probes in info.probe_flips.items():
            name, _, value = flip.partition("=")
            assert info.fingerprint.flip(name, value) is not None, flip
            assert value != str(info.options.defaults()[name]).lower(), flip
            for probe in probes:
                assert PROBES[probe].style == info.style, probe


def test_every_choice_of_our_kernels_options_is_declared_or_neutral():
    # A new option value must say what it changes (or that it changes nothing S4 sees).
    for info in runtimes.RUNTIMES.values():
        if not info.ours or info.origin != "builtin":
            continue
        defaults = info.options.defaults()
        for opt in info.options.options:
            if opt.name in info.fingerprint.neutral:
                continue
            values = getattr(opt.parse, "values", "true|false").split("|")
            for value in values:
                if value == str(defaults[opt.name]).lower() or not value.islower():
                    continue        # the default, or a pattern such as random-SEED
                assert info.fingerprint.flip(opt.name, value) is not None, \
                    f"{info.id}:{opt.name}={value} declares no fingerprint flip"


def test_every_builtin_runtime_declares_a_row_with_every_metric():
    builtin = [info for info in runtimes.RUNTIMES.values() if info.origin == "builtin"]
    assert len(builtin) == 9
    for info in builtin:
        assert info.fingerprint is not None, info.id
        assert set(info.fingerprint.row) == set(causality.METRICS), info.id
        for change in info.fingerprint.flips.values():
            assert set(change) <= set(causality.METRICS), info.id


def test_declared_flips_name_real_options_of_our_kernels():
    flips = _flips()
    assert flips
    for spec in flips:
        rt = runtimes.parse(spec)            # UsageError if the option or value is wrong
        assert rt.ours and rt.spec == spec


def test_declared_for_applies_flips_and_neutral_options():
    table, problems = causality.declared_for("coro:ready_order=random-7,exit=wait")
    assert problems == []
    assert isinstance(table["child_first_after_yield_fraction"], Between)
    assert table["cancel_semantics"] == "edge"          # untouched by either option
    table, problems = causality.declared_for("coro:cancel=level,io_schedule_point=true")
    assert table["cancel_semantics"] == "level"
    assert Near(2000, 100).ok(table["other_tasks_during_nonblocking_sends_count"].value)


def test_an_undeclared_flip_and_a_missing_row_are_problems():
    fp = Fingerprint({"cancel_semantics": "edge"}, {"spawn=eager": {}}, frozenset({"exit"}))
    row, problems = fp.declared({"spawn": "eager", "exit": "wait", "cancel": "level"},
                                {"spawn": "lazy", "exit": "cancel", "cancel": "edge"})
    assert row == {"cancel_semantics": "edge"}
    assert problems == ["cancel=level: nothing is declared for this option flip"]
    info = runtimes.register(runtimes.RuntimeInfo(
        "fp-test-nofp", "task", "protocols.ports:CoroPort", runtimes.get("coro").options))
    try:
        assert causality.declared_for("fp-test-nofp") == (
            {}, ["no declared fingerprint for runtime fp-test-nofp"])
        assert causality.matches(info.id, {}) == ["no declared fingerprint for runtime fp-test-nofp"]
    finally:
        runtimes.unregister(info.id)


def _asyncio_like(**changes) -> dict:
    fp = {"child_ran_before_spawn_returned": False, "child_first_after_yield_fraction": 0.95,
          "user_buffered_after_write_bytes": 869_036, "closed_when_close_returned": False,
          "closed_after_one_yield": True, "other_tasks_during_nonblocking_sends_count": None,
          "cancel_semantics": "edge", "error_surface": "at the call"}
    fp.update(changes)
    return fp


def test_matches_tolerances_and_kinds():
    assert causality.matches("asyncio-streams", _asyncio_like()) == []
    # fraction: ±0.1
    bad = causality.matches("asyncio-streams", _asyncio_like(child_first_after_yield_fraction=0.85))
    assert len(bad) == 1 and bad[0].startswith("child_first_after_yield_fraction")
    # bytes: "some" vs "none" vs "not applicable" are three different answers
    assert causality.matches("asyncio-streams", _asyncio_like(user_buffered_after_write_bytes=5)) == []
    assert causality.matches("asyncio-streams", _asyncio_like(user_buffered_after_write_bytes=0))
    assert causality.matches("asyncio-streams", _asyncio_like(user_buffered_after_write_bytes=None))
    # booleans are not numbers, and False is not None
    assert causality.matches("asyncio-streams", _asyncio_like(closed_when_close_returned=0))
    assert causality.matches("asyncio-streams", _asyncio_like(child_ran_before_spawn_returned=None))
    # a missing metric is reported, not skipped
    fp = _asyncio_like()
    del fp["error_surface"]
    assert causality.matches("asyncio-streams", fp) == [
        "error_surface: not measured (declared 'at the call')"]


def test_trio_fraction_must_be_strictly_between():
    row = dict(runtimes.get("trio").fingerprint.row)
    fp = {m: (v if not hasattr(v, "ok") else None) for m, v in row.items()}
    fp["other_tasks_during_nonblocking_sends_count"] = 1999
    for fraction, ok in ((0.41, True), (0.2, False), (1.0, False), (0.79, True)):
        fp["child_first_after_yield_fraction"] = fraction
        assert (causality.matches("trio", fp) == []) is ok, fraction


def test_bad_input_is_a_clear_error():
    with pytest.raises(runtimes.UsageError, match="valid runtimes"):
        causality.fingerprint("nosuch")
    with pytest.raises(ValueError, match="trials"):
        causality.fingerprint("asyncio-protocol", trials=0)
    with pytest.raises(TypeError, match="trials"):
        causality.fingerprint("asyncio-protocol", trials="10")
    with pytest.raises(TypeError, match="fingerprint dict"):
        causality.matches("trio", None)
