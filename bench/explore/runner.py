"""One exploration: a strategy's schedules of one target on one runtime, the
first failure shrunk and written as a replay file, or the proof of a bound.

``explore(...)`` returns a plain dict (what the verb prints and writes).
``shrink`` minimises a failing schedule's deviations (chunks first, then one
by one, then each choice lowered to 1), keeping only changes under which
the run still fails with the same outcome. ``schedule_doc`` / ``replay``
write and rerun a schedule; a replay is exact when it makes the same
choices at the same points (``points_digest``) and ends the same way.
"""
from __future__ import annotations

import functools
import os
import subprocess
import time

from bench.explore import search
from bench.explore.search import Recorder, fixed, legal_kinds, points_digest

__all__ = ["explore", "shrink", "schedule_doc", "replay", "code_version", "SCHEDULE_MODEL"]

SCHEDULE_MODEL = "looplab.explore.schedule"


@functools.cache
def code_version() -> str:
    """The commit this code is (``+dirty`` with uncommitted changes), or the
    package version outside a git checkout."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root,
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        head = dirty = ""
    if head:
        return head + ("+dirty" if dirty else "")
    from bench.results import VERSION
    return f"looplab {VERSION}"


def _run(target, runtime, variant, legal, deviations):
    # the target's world carries the fault points the search was given (``buggify``)
    rec = Recorder(legal, fixed(deviations))
    return rec, target.run(runtime, variant, rec)


def shrink(target, runtime, variant, legal, deviations: dict, outcome: str,
           max_runs: int = 300) -> tuple[dict, int]:
    """The fewest deviations (then the smallest choices) under which the run
    still ends in ``outcome``. Returns them and how many runs it took."""
    runs = 0
    devs = dict(deviations)

    def still(d):
        nonlocal runs
        runs += 1
        return _run(target, runtime, variant, legal, d)[1].outcome == outcome

    chunk = max(len(devs) // 2, 1)
    while devs and runs < max_runs:
        keys = sorted(devs)
        changed = False
        for i in range(0, len(keys), chunk):
            if runs >= max_runs:
                break
            trial = {k: v for k, v in devs.items() if k not in keys[i:i + chunk]}
            if still(trial):
                devs, changed = trial, True
                break
        if not changed:
            if chunk == 1:
                break
            chunk = max(chunk // 2, 1)
    if len(devs) > 1:
        # Removing a deviation can move the steps after it, so a greedy pass
        # may stop above the minimum: try each single deviation of the
        # default run (while the budget lasts).
        base, _ = _run(target, runtime, variant, legal, {})
        runs += 1
        for k, (_, n, _) in enumerate(base.points):
            if runs >= max_runs:
                break
            if still({k: 1}):
                devs = {k: 1}
                break
    for k in sorted(devs):
        if runs >= max_runs:
            break
        if devs[k] > 1:
            trial = {**devs, k: 1}
            if still(trial):
                devs = trial
    return devs, runs


def schedule_doc(target, runtime, variant, legal, deviations, rec, result, strategy,
                 net, portability) -> dict:
    doc = {"model": SCHEDULE_MODEL, "version": 1, "code": code_version(),
            "target": target.name, "preset": getattr(target, "preset", None),
            "runtime": runtime, "variant": variant, "strategy": strategy,
            "net_choices": net, "portability": portability, "legal": sorted(legal),
            "deviations": [[k, v, rec.points[k][0] if k < len(rec.points) else "?"]
                           for k, v in sorted(deviations.items())],
            "delays": sum(deviations.values()), "choice_points": len(rec.points),
            "points_digest": points_digest(rec.points), "outcome": result.outcome,
            "pending": result.pending}
    if getattr(target, "buggify", None):
        doc["buggify"] = list(target.buggify)     # absent: no fault points (older files too)
    return doc


def replay(doc: dict, target) -> dict:
    """Rerun a schedule document; ``exact`` when the same choices were made at
    the same points and the run ended the same way."""
    legal = frozenset(doc["legal"])
    devs = {int(k): int(v) for k, v, *_ in doc["deviations"]}
    target.buggify = doc.get("buggify") or None
    rec, r = _run(target, doc["runtime"], doc["variant"], legal, devs)
    same_points = points_digest(rec.points) == doc["points_digest"]
    return {"outcome": r.outcome, "failed": r.failed, "same_points": same_points,
            "exact": same_points and r.outcome == doc["outcome"], "pending": r.pending,
            "code_then": doc.get("code"), "code_now": code_version()}


def explore(target, runtime: str, variant: str, strategy_text: str, budget: int, *,
            seed: int = 0, net: bool = True, portability: bool = False,
            do_shrink: bool = True, buggify=None) -> dict:
    """Run up to ``budget`` schedules; stop at the first failure, shrink it and
    check its replay. Under ``delays:D`` with no failure and the bounded
    space exhausted, the result carries the proof line. ``buggify``: the
    seam's fault points (``kernels.simnet.BUGGIFY_POINTS``) whose every site
    becomes a choice."""
    strategy = search.parse_strategy(strategy_text, seed, budget)
    target.buggify = list(buggify) if buggify else None
    legal = legal_kinds(runtime, net, portability, bool(buggify))
    out = {"target": target.name, "runtime": runtime, "variant": variant,
           "strategy": strategy.name, "seed": seed, "budget": budget, "legal": sorted(legal)}
    if buggify:
        out["buggify"] = list(buggify)
    t0, c0 = time.perf_counter(), time.process_time()
    runs = 0
    points = []
    first = None
    while runs < budget:
        decide = strategy.next()
        if decide is None:
            break
        rec = Recorder(legal, decide)
        r = target.run(runtime, variant, rec)
        runs += 1
        points.append(len(rec.points))
        strategy.done(rec, r.failed)
        if r.outcome.startswith("skipped"):
            out["skipped"] = r.outcome
            break
        if r.failed:
            first = (runs, rec, r)
            break
    out.update({"schedules": runs, "wall_s": round(time.perf_counter() - t0, 3),
                "cpu_s": round(time.process_time() - c0, 3),
                "choice_points": {"min": min(points, default=0), "max": max(points, default=0)},
                "strategy_info": strategy.summary()})
    if first is None:
        out["found"] = False
        if isinstance(strategy, search.DelayBounded) and strategy.exhausted:
            out["proved"] = (f"proved: no failing schedule within {strategy.D} "
                             f"delay{'' if strategy.D == 1 else 's'} ({runs} schedules)")
        return out
    index, rec, r = first
    devs = rec.deviations()
    out.update({"found": True, "first_failure": index, "outcome": r.outcome,
                "pending": r.pending, "liveness": bool(r.detail.get("liveness")),
                "deviations_found": len(devs), "delays_found": sum(devs.values())})
    shrunk, shrink_runs = (shrink(target, runtime, variant, legal, devs, r.outcome)
                           if do_shrink else (devs, 0))
    rec2, r2 = _run(target, runtime, variant, legal, shrunk)
    doc = schedule_doc(target, runtime, variant, legal, shrunk, rec2, r2, strategy.name,
                       net, portability)
    again = replay(doc, target)
    out.update({"shrunk_deviations": len(shrunk), "shrunk_delays": sum(shrunk.values()),
                "shrink_runs": shrink_runs, "shrunk_outcome": r2.outcome,
                "replay_exact": again["exact"], "schedule": doc})
    return out
