"""One exploration: a strategy's schedules of one target on one runtime, the
first failure shrunk and written as a replay file, or the proof of a bound.

``explore(...)`` returns a plain dict (what the verb prints and writes).
``shrink`` minimises a failing schedule's deviations (chunks first, then one
by one, then each choice lowered to 1), keeping only changes under which
the run still fails with the same outcome. ``schedule_doc`` / ``replay``
write and rerun a schedule; a replay is exact when it makes the same
choices at the same points (``points_digest``) and ends the same way.

Every run goes through ``recorder`` and ``execute``: a target that declares
properties (``bench.scenarios.properties``) gets a ``checks.Watched`` recorder, and a
violated ``always`` or ``eventually`` is that run's failure. ``sometimes``
properties reached are counted over the exploration; one never reached is
reported vacuous, and a ``delays:D`` search without failures is then not a
proof. The failing schedule's choices are written beside those of the
nearest passing run (``nearest_passing``, ``trace_beside``).
"""
from __future__ import annotations

import functools
import gc
import os
import subprocess
import time

from bench.explore import checks, search
from bench.explore.checks import failure_key
from bench.explore.search import Recorder, fixed, legal_kinds, points_digest

__all__ = ["explore", "shrink", "schedule_doc", "replay", "code_version", "SCHEDULE_MODEL",
           "recorder", "execute", "nearest_passing", "trace_beside"]

SCHEDULE_MODEL = "looplab.explore.schedule"

#: A full collection every this many schedules. A simulated cell collects its
#: own garbage while the older heap is frozen, and what it leaves in cycles (its
#: port, loop and sockets: about 40 KB a schedule at S3's blog preset) lands
#: where no automatic collection looks, so a long search grew by a gigabyte in
#: 27,000 schedules. One full collection costs about what one schedule does.
_COLLECT_EVERY = 256


@functools.cache
def code_version() -> str:
    """The commit this code is (``+dirty`` with uncommitted changes), or the
    package version outside a git checkout."""
    from bench.host.procs import ROOT as root
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


def recorder(target, runtime, variant, legal, decide, trace=False):
    """The chooser of one run: a plain ``Recorder``, or a ``checks.Watched``
    one when the target declares properties for ``variant`` (or a trace is
    wanted)."""
    declared = checks.declared(target, variant, runtime)
    if not declared and not trace:
        return Recorder(legal, decide)
    watch = checks.Watch(getattr(target, "params", None), variant, runtime)
    return checks.Watched(legal, decide, properties=declared, watch=watch, trace=trace)


def execute(target, runtime, variant, rec):
    """Run ``target`` under ``rec``; a violated declared property is the failure."""
    begin = getattr(rec, "begin", None)
    if begin is None:
        return target.run(runtime, variant, rec)
    begin()
    try:
        r = target.run(runtime, variant, rec)
    finally:
        rec.end()
    return checks.judge(rec, r)


def _run(target, runtime, variant, legal, deviations, trace=False):
    rec = recorder(target, runtime, variant, legal, fixed(deviations), trace)
    return rec, execute(target, runtime, variant, rec)


def _distance(a: dict, b: dict) -> int:
    """How many steps two schedules choose differently at."""
    return sum(1 for k in set(a) | set(b) if a.get(k, 0) != b.get(k, 0))


def nearest_passing(target, runtime, variant, legal, failing: dict, tried=(),
                    max_runs: int = 12):
    """The passing schedule closest to ``failing`` (fewest differing
    deviations): among the runs already ``tried`` ((deviations, failed)
    pairs, the shrinker's), else the default order, else single changes of
    the failing schedule's choices. Returns (deviations, runs) or (None, runs)."""
    passing = [d for d, failed in tried if not failed]
    if passing:
        return min(passing, key=lambda d: (_distance(d, failing), sorted(d.items()))), 0
    runs = 0
    candidates = [{}] if failing else []
    candidates += [{k: v for k, v in failing.items() if k != drop} for drop in sorted(failing)]
    seen = set()
    for cand in candidates:
        key = tuple(sorted(cand.items()))
        if key in seen or cand == failing:
            continue
        seen.add(key)
        runs += 1
        if not _run(target, runtime, variant, legal, cand)[1].failed:
            return cand, runs
    # one more deviation at a point of the failing run (a different choice there)
    rec, _ = _run(target, runtime, variant, legal, failing)
    runs += 1
    for k, (_, n, c) in enumerate(rec.points):
        for alt in range(n):
            if alt == c or runs >= max_runs:
                continue
            cand = {**failing, k: alt}
            if not alt:
                del cand[k]
            runs += 1
            if not _run(target, runtime, variant, legal, cand)[1].failed:
                return cand, runs
        if runs >= max_runs:
            break
    return None, runs


def trace_beside(target, runtime, variant, legal, failing: dict, passing: dict) -> dict:
    """Both runs again, labelled: their choices and where they first differ."""
    frec, fr = _run(target, runtime, variant, legal, failing, trace=True)
    prec, pr = _run(target, runtime, variant, legal, passing, trace=True)
    ftr, ptr = checks.trace_of(frec), checks.trace_of(prec)
    at = checks.first_difference(ftr, ptr)
    return {"first_difference": at,
            "failing": {"deviations": sorted(failing.items()), "outcome": fr.outcome,
                        "choices": ftr},
            "passing": {"deviations": sorted(passing.items()), "outcome": pr.outcome,
                        "choices": ptr},
            "lines": checks.trace_lines(ftr, ptr, at)}


def shrink(target, runtime, variant, legal, deviations: dict, key: str,
           max_runs: int = 300, tried: list | None = None) -> tuple[dict, int]:
    """The fewest deviations (then the smallest choices) under which the run
    still fails with the failure ``key`` it started from (``failure_key``: its
    kind and place, not its message, so a run that fails another way is not
    taken). Returns them and how many runs it took; each run's (deviations,
    failed) goes into ``tried`` when given."""
    runs = 0
    devs = dict(deviations)

    def still(d):
        nonlocal runs
        runs += 1
        r = _run(target, runtime, variant, legal, d)[1]
        if tried is not None:
            tried.append((d, r.failed))
        return r.failed and failure_key(r) == key

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
        base, r0 = _run(target, runtime, variant, legal, {})
        runs += 1
        if tried is not None:
            tried.append(({}, r0.failed))
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
            "failure": failure_key(result) if result.failed else None,
            "pending": result.pending,
            "properties": [[p.kind, p.name] for p in checks.declared(target, variant, runtime)]}
    if getattr(target, "buggify", None):
        doc["buggify"] = list(target.buggify)     # absent: no fault points (older files too)
    if getattr(target, "source", None):
        # a user's program: its file (absolute here; relative to the schedule file once
        # written, ``programs.for_file``) and the sha256 of its source
        doc["program"] = dict(target.source)
    return doc


def replay(doc: dict, target) -> dict:
    """Rerun a schedule document; ``exact`` when the same choices were made at
    the same points and the run ended the same way: the same failure (its
    ``failure_key``, in files that record one) or else the same outcome."""
    legal = frozenset(doc["legal"])
    devs = {int(k): int(v) for k, v, *_ in doc["deviations"]}
    target.buggify = doc.get("buggify") or None
    rec, r = _run(target, doc["runtime"], doc["variant"], legal, devs)
    same_points = points_digest(rec.points) == doc["points_digest"]
    if doc.get("failure"):
        same_end = r.failed and failure_key(r) == doc["failure"]
    else:
        same_end = r.outcome == doc["outcome"]
    return {"outcome": r.outcome, "failed": r.failed, "same_points": same_points,
            "exact": same_points and same_end, "pending": r.pending,
            "chains": r.detail.get("chains") or [], "at": r.detail.get("at"),
            "code_then": doc.get("code"), "code_now": code_version()}


def explore(target, runtime: str, variant: str, strategy_text: str, budget: int, *,
            seed: int = 0, net: bool = True, portability: bool = False,
            do_shrink: bool = True, shard: tuple = (0, 1), buggify=None) -> dict:
    """Run up to ``budget`` schedules; stop at the first failure, shrink it and
    check its replay. Under ``delays:D`` with no failure and the bounded
    space exhausted, the result carries the proof line (of shard ``k`` of
    ``J`` only, with ``shard=(k, J)``: ``search.DelayBounded``). ``buggify``:
    the seam's fault points (``kernels.simnet.BUGGIFY_POINTS``) whose every
    site becomes a choice."""
    strategy = search.parse_strategy(strategy_text, seed, budget, shard)
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
    declared = checks.declared(target, variant, runtime)
    reached: dict = {}          # sometimes property -> the first schedule that reached it
    shared = _shared_prefixes(target, runtime, variant, legal, strategy, budget, shard)
    if shared is not None:
        runs, points, reached, first = (shared.runs, list(shared.points), shared.reached,
                                        shared.first)
        strategy.runs, strategy.exhausted, strategy.queue = runs, shared.exhausted, []
        if shared.tally.skipped:
            out["skipped"] = shared.tally.skipped
    while shared is None and runs < budget:
        decide = strategy.next()
        if decide is None:
            break
        rec = recorder(target, runtime, variant, legal, decide)
        r = execute(target, runtime, variant, rec)
        runs += 1
        if not runs % _COLLECT_EVERY:
            gc.collect()
        points.append(len(rec.points))
        for name in getattr(rec, "seen", ()):
            reached.setdefault(name, runs)
        strategy.done(rec, r.failed)
        if r.outcome.startswith("skipped"):
            out["skipped"] = r.outcome
            break
        if r.failed:
            first = (runs, rec, r)
            break
    out.update({"schedules": runs, "wall_s": round(time.perf_counter() - t0, 3),
                "cpu_s": round(time.process_time() - c0
                               + (shared.children_cpu if shared is not None else 0), 3),
                "choice_points": {"min": min(points, default=0), "max": max(points, default=0)},
                "strategy_info": shared.summary if shared is not None else strategy.summary()})
    if shared is not None and shared.lost:
        out["not_proved"] = f"not a proof: {shared.lost}"
    if declared:
        out["properties"] = _properties(declared, reached, runs)
    vacuous = out.get("properties", {}).get("vacuous")
    if first is None:
        out["found"] = False
        if isinstance(strategy, search.DelayBounded) and strategy.exhausted:
            line = (f"no failing schedule within {strategy.D} "
                    f"delay{'' if strategy.D == 1 else 's'} ({runs} schedules)")
            if vacuous:
                # a sometimes never reached: the schedules never got where the
                # property says they should, so their passing proves nothing
                out["not_proved"] = f"not a proof: {line}, but {len(vacuous)} vacuous"
            else:
                out["proved"] = "proved: " + line
        return out
    index, rec, r = first
    devs = rec.deviations()
    out.update({"found": True, "first_failure": index, "outcome": r.outcome,
                "failure_key": failure_key(r), "liveness": bool(r.detail.get("liveness")),
                "deviations_found": len(devs), "delays_found": sum(devs.values())})
    tried: list = []
    shrunk, shrink_runs = (shrink(target, runtime, variant, legal, devs, failure_key(r),
                                  tried=tried)
                           if do_shrink else (devs, 0))
    rec2, r2 = _run(target, runtime, variant, legal, shrunk)
    # what the report shows of the failure is the shrunk run's own (the replay file's
    # run): where its tasks wait, when its property was seen failing
    out.update({"pending": r2.pending, "chains": r2.detail.get("chains") or [],
                "failed_at": r2.detail.get("at")})
    if r2.detail.get("property"):
        out["violation_at"] = r2.detail.get("at")
        out["target_outcome"] = r2.detail.get("target_outcome")
    doc = schedule_doc(target, runtime, variant, legal, shrunk, rec2, r2, strategy.name,
                       net, portability)
    if do_shrink:
        passing, near_runs = nearest_passing(target, runtime, variant, legal, shrunk, tried)
        if passing is not None:
            doc["trace"] = trace_beside(target, runtime, variant, legal, shrunk, passing)
            out["trace_lines"] = doc["trace"]["lines"]
        else:
            out["trace_lines"] = [f"no passing schedule near the failing one "
                                  f"({near_runs} tried)"]
    again = replay(doc, target)
    out.update({"shrunk_deviations": len(shrunk), "shrunk_delays": sum(shrunk.values()),
                "shrink_runs": shrink_runs, "shrunk_outcome": r2.outcome,
                "replay_exact": again["exact"], "schedule": doc})
    return out


def _shared_prefixes(target, runtime, variant, legal, strategy, budget, shard):
    """A ``delays:D`` search that forks the universe where two schedules part,
    when that costs less than re-running their prefix (``prefix``), or None
    where no fork is possible or wanted (then ``DelayBounded`` re-runs every
    prefix). The same schedules either way."""
    from bench.explore import prefix
    if not isinstance(strategy, search.DelayBounded) or prefix.mode() == "never":
        return None
    return prefix.search(
        target, runtime, variant, legal, strategy.D, budget, shard=shard,
        make_recorder=lambda decide: recorder(target, runtime, variant, legal, decide),
        execute=lambda rec: execute(target, runtime, variant, rec))


def _properties(declared, reached: dict, runs: int) -> dict:
    """The declared properties' summary: each one, the first schedule that
    reached each ``sometimes``, and the vacuous ones (never reached)."""
    out = {"declared": [[p.kind, p.name] for p in declared],
           "reached": {p.name: reached[p.name] for p in declared
                       if p.kind == "sometimes" and p.name in reached}}
    out["vacuous"] = [f"vacuous: {p.name} never reached in {runs} schedules"
                      for p in declared if p.kind == "sometimes" and p.name not in reached]
    return out
