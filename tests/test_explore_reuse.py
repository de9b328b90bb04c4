"""Many universes in one process: what a target keeps between its schedules
(``targets.REUSE``), the world's lazily seeded streams and checked
parameters, and ``delays:D`` dealt out to processes in disjoint parts. A
schedule's outcome and choices must not depend on any of it."""
from __future__ import annotations

import random

import pytest

from bench.explore import exploration, search, targets, verb
from kernels import simnet
from kernels.simnet import world as worldmod


def _schedules(make_target, runtime, variants, n, seed=3):
    """(variant, outcome, choice digest) of ``n`` random schedules per
    variant, the variants interleaved."""
    legal = search.legal_kinds(runtime)
    walk = search.RandomWalk(seed)
    out = []
    for i in range(n):
        for v in variants:
            rec = search.Recorder(legal, walk.next())
            r = make_target().run(runtime, v, rec)
            out.append((v, r.outcome, len(rec.points), search.points_digest(rec.points)))
    return out


@pytest.mark.parametrize("name,rt_id,n", [("S3", "callback", 12),
                                            ("cpython-23812", "callback", 40),
                                            ("cpython-23812", "asyncio", 20)])
def test_a_reused_target_gives_each_schedule_the_outcome_and_choices_of_a_fresh_one(
        name, rt_id, n, monkeypatch):
    target = targets.resolve(name, "tiny")
    variants = target.variants
    reused = _schedules(lambda: target, rt_id, variants, n)
    monkeypatch.setattr(targets, "REUSE", False)
    monkeypatch.setattr(worldmod, "_CHECKED", set())
    fresh = _schedules(lambda: targets.resolve(name, "tiny"), rt_id, variants, n)
    assert reused == fresh
    # the schedules differ among themselves: the comparison compared something
    assert len({d for *_, d in reused}) > n // 2
    if target.kind == "program":     # and the naive program's bug shows up in some
        assert any(o != "ok" for v, o, *_ in reused if v == "naive")


def test_a_worlds_streams_are_the_ones_seeded_at_construction():
    for seed in (0, 7, "s3+2"):
        w = simnet.World(seed, log=False)
        net, cpu = random.Random(f"{seed}:net"), random.Random(f"{seed}:cpu")
        assert [w._rng.random() for _ in range(5)] == [net.random() for _ in range(5)]
        assert [w._cpu_rng.random() for _ in range(3)] == [cpu.random() for _ in range(3)]
        assert type(w._rng) is random.Random     # the stand-in is gone after one draw
    # random faults are still drawn from the seed
    p = dict(worldmod.DEFAULTS, random_faults=3)
    want = worldmod._draw_faults(random.Random("5:faults"), p)
    assert simnet.World(5, random_faults=3, log=False).faults == want and len(want) == 3


def test_a_checked_parameter_set_does_not_let_a_wrong_type_through():
    simnet.World(0, latency_s=1, log=False)
    for bad in (True, float("nan"), -1):
        with pytest.raises(ValueError, match="latency_s"):
            simnet.World(0, latency_s=bad, log=False)


def _delays_runs(target, runtime, variant, D, shard):
    s = search.DelayBounded(D, shard=shard)
    legal = search.legal_kinds(runtime)
    seen = []
    while (decide := s.next()) is not None:
        rec = search.Recorder(legal, decide)
        r = target.run(runtime, variant, rec)
        seen.append(tuple(sorted(rec.deviations().items())))
        s.done(rec, r.failed)
    return seen, s.exhausted


def test_delays_parts_are_disjoint_and_together_the_whole_bounded_space():
    t = targets.resolve("cpython-23812")
    whole, done = _delays_runs(t, "callback", "fixed", 2, (0, 1))
    assert done and len(whole) > 20
    parts = [_delays_runs(t, "callback", "fixed", 2, (k, 3)) for k in range(3)]
    assert all(ex for _, ex in parts)
    runs = [set(seen) - {()} for seen, _ in parts]      # each part re-runs the default
    assert all(seen[0] == () for seen, _ in parts)
    assert sum(map(len, runs)) == len(set().union(*runs)) == len(whole) - 1
    assert set().union(*runs) | {()} == set(whole)


def test_delays_parts_merge_into_one_proof_or_none():
    unit = {"target": "cpython-23812", "preset": "tiny", "runtime": "callback",
            "variant": "fixed", "strategy": "delays:2", "budget": 400, "seed": 0,
            "net": True, "portability": False}
    [alone] = verb.run_units([unit])
    shards = verb._shard([unit], 2)
    [merged] = verb._merge(shards, verb.run_units(shards, 1))
    assert alone["proved"].startswith("proved: no failing schedule within 2 delays")
    assert merged["schedules"] == alone["schedules"] and merged["shards"] == 2
    assert merged["proved"] == alone["proved"][:-1] + ", 2 parts)"
    # each part may run the unit's whole budget: a space one process proves
    # within its budget, the parts prove too, however unevenly it splits
    tight = dict(unit, budget=alone["schedules"])
    [both] = verb._merge(verb._shard([tight], 2), verb.run_units(verb._shard([tight], 2), 1))
    assert both["proved"] == merged["proved"]
    # a part that ran out of budget proves nothing
    short = verb._shard([dict(unit, budget=20)], 2)
    [partial] = verb._merge(short, verb.run_units(short, 1))
    assert not partial.get("proved") and not partial["found"]
    # and a naive program's failure is found in its part
    naive = verb._shard([dict(unit, variant="naive", strategy="delays:1")], 2)
    [failed] = verb._merge(naive, verb.run_units(naive, 1))
    assert failed["found"] and failed["replay_exact"] and not failed.get("proved")


def test_the_echo_pattern_is_byte_i_mod_the_period_at_every_size():
    from bench.peers import roles
    for size in (0, 1, roles.ECHO_PERIOD - 1, roles.ECHO_PERIOD, roles.ECHO_PERIOD + 1, 70_000):
        assert roles._echo_pattern(size) == bytes(i % roles.ECHO_PERIOD for i in range(size))


def test_a_kernels_options_validated_again_are_the_same_values_in_a_new_dict():
    from kernels.callback import loop
    from kernels.options import OptionError
    schema = loop.OPTIONS
    for given in ({}, {"high_water": "1k"}, {"trace": True}, {"trace": "true"}):
        first, again = schema.validate(given), schema.validate(given)
        assert first == again == schema._validate(given) and first is not again
        again["trace"] = "changed"               # a caller's copy is its own
        assert schema.validate(given) == first
    assert schema.validate({"high_water": 1})["high_water"] == 1
    for bad in ({"high_water": True}, {"nope": 1}, {"high_water": "lots"}):
        for _ in range(2):                        # refused every time, never remembered
            with pytest.raises(OptionError):
                schema.validate(bad)
