"""``looplab explore``: the command line of schedule exploration.

    looplab explore TARGET [--runtimes R,...] [--strategy random|pct:d=N|delays:D]
                    [--budget N] [--variant naive|fixed|both] [--preset P] [--seed S]
                    [--net-choices on|off] [--portability] [--buggify [POINT,...]]
                    [--jobs J] [--out DIR] [--shard I/N]
                    [--scenario-file FILE] [--scenario-module M] [--runtime-module M]
    looplab explore --merge DIR_OR_PART... [--out DIR]
    looplab explore --replay FILE [--scenario-file FILE]
    looplab explore --bench [--seeds S] [--budget N] [--only ID,...] [--out DIR]

One unit is one target x runtime x variant. ``--jobs`` runs units in
parallel processes; when there are fewer units than jobs, a unit is split
into shards: random and PCT shards with their own seeds and shares of the
budget, a ``delays:D`` unit into disjoint parts of its bounded space
(``search.DelayBounded``). The shards' results merge; a bound is proved
when every part of it is. ``--shard I/N`` runs one such part in this process
and writes it; ``--merge`` joins the parts from any number of machines
(``bench.explore.shards``). Exit 0 when no failing schedule was found, 1 when
one was or when a declared ``sometimes`` property was never reached
(vacuous), 2 for a usage mistake.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

from bench.errors import ExitCode, UsageError

__all__ = ["add_parser", "cmd_explore", "run_units", "bench_rows"]


def _units(args, target) -> list:
    if args.runtimes:
        runtimes = [r.strip() for r in args.runtimes.split(",") if r.strip()]
    elif target.kind == "program":
        runtimes = list(target.runtimes)
    else:
        # the runtimes whose kernels expose scheduling choices (RuntimeInfo.schedule_choices)
        from bench import runtimes as rtmod
        runtimes = [rid for rid, info in rtmod.RUNTIMES.items() if info.schedule_choices]
    if args.variant == "both":
        variants = list(target.variants)
    elif args.variant == "fixed":
        variants = [v for v in target.variants if v == "fixed"] or list(target.variants[-1:])
    else:
        variants = list(target.variants[:1])
    units = []
    for rt in runtimes:
        try:
            why = target.applies(rt)
        except Exception as exc:     # a runtime spec that does not parse
            raise UsageError(f"--runtimes {rt}: {exc}") from None
        if why:
            print(f"{target.name} {rt}: skipped: {why}", file=sys.stderr)
            continue
        for v in variants:
            units.append({"target": args.target, "preset": args.preset, "runtime": rt,
                          "variant": v, "strategy": args.strategy, "budget": args.budget,
                          "seed": args.seed, "net": args.net_choices == "on",
                          "portability": args.portability,
                          "buggify": getattr(args, "buggify", None)})
    return units


def _run_unit(u: dict) -> dict:
    from bench.explore import exploration as runner, targets
    t = targets.resolve(u["target"], u["preset"])
    return runner.explore(t, u["runtime"], u["variant"], u["strategy"], u["budget"],
                          seed=u["seed"], net=u["net"], portability=u["portability"],
                          do_shrink=u.get("shrink", True),
                          shard=tuple(u.get("shard", (0, 1))), buggify=u.get("buggify"))


def run_units(units: list, jobs: int = 1) -> list:
    """Each unit's exploration, in order; in ``jobs`` processes if > 1."""
    if jobs <= 1 or len(units) <= 1:
        return [_run_unit(u) for u in units]
    import concurrent.futures as cf
    import multiprocessing
    with cf.ProcessPoolExecutor(max_workers=jobs,
                                mp_context=multiprocessing.get_context("fork")) as pool:
        return list(pool.map(_run_unit, units))


def _shard(units: list, jobs: int, part=None) -> list:
    """Split units so that ``jobs`` processes have work (``shards.split``: random/PCT
    pieces get their own seeds and shares of the budget, ``delays:D`` pieces their
    own part of the space); ``part = (I, N)``: only part I of N of each unit."""
    from bench.explore import shards
    return shards.split(units, jobs, part)


def _merge(shards: list, results: list) -> list:
    merged: dict = {}
    parts: dict = {}              # unit -> how many of its delays:D parts proved theirs
    for s, r in zip(shards, results):
        u = s["unit"]
        parts[u] = parts.get(u, 0) + bool(r.get("proved"))
        m = merged.get(u)
        if m is None:
            merged[u] = dict(r, shards=1)
            continue
        m["shards"] += 1
        # every delays:D part re-ran the default schedule; it counts once
        m["schedules"] += r["schedules"] - (1 if "shard" in s and r["schedules"] else 0)
        m["wall_s"] = max(m["wall_s"], r["wall_s"])
        m["cpu_s"] = round(m["cpu_s"] + r["cpu_s"], 3)
        if "forks" in (m.get("strategy_info") or {}) and "forks" in (r.get("strategy_info") or {}):
            from bench.explore import prefix
            m["strategy_info"] = prefix.joined(m["strategy_info"], r["strategy_info"])
        reached = dict((r.get("properties") or {}).get("reached", {}))
        reached.update((m.get("properties") or {}).get("reached", {}))
        if r.get("found") and not m.get("found"):
            keep = {k: m[k] for k in ("schedules", "wall_s", "cpu_s", "shards")}
            m.clear()
            m.update(r)
            m.update(keep)
        if m.get("properties"):
            # a sometimes reached in any shard is reached; vacuous only in none
            props = m["properties"]
            props["reached"] = reached
            props["vacuous"] = [f"vacuous: {name} never reached in {m['schedules']} schedules"
                                for kind, name in props["declared"]
                                if kind == "sometimes" and name not in reached]
    for u, m in merged.items():
        if m["shards"] > 1 and m.get("proved"):
            if m.get("found") or parts[u] < m["shards"]:
                m.pop("proved")       # a part not exhausted (or a failure): no proof
            else:
                D = m["strategy_info"]["D"]
                m["proved"] = (f"proved: no failing schedule within {D} "
                               f"delay{'' if D == 1 else 's'} ({m['schedules']} schedules, "
                               f"{m['shards']} parts)")
    return [merged[k] for k in sorted(merged)]


def _vacuous(r: dict) -> list:
    return (r.get("properties") or {}).get("vacuous") or []


def _property_lines(r: dict) -> list:
    props = r.get("properties")
    if not props:
        return []
    reached = props.get("reached", {})
    parts = []
    for kind, name in props["declared"]:
        if kind == "sometimes":
            at = reached.get(name)
            parts.append(f"sometimes {name}: " + (f"reached (schedule {at})" if at
                                                  else "never reached"))
        else:
            parts.append(f"{kind} {name}")
    return ["properties: " + "; ".join(parts)] + list(props.get("vacuous") or [])


def _file_name(r: dict, part=None) -> str:
    safe = "".join(c if c.isalnum() or c in "-." else "_" for c in
                   f"{r['target']}_{r['runtime']}_{r['variant']}")
    return f"failing-{safe}" + (f"-part-{part[0]}-of-{part[1]}" if part else "") + ".json"


def _report(r: dict, out_dir: str | None, part=None) -> None:
    if part and part[1] > 1 and r.get("proved"):
        # one part's space exhausted is no proof until every part is merged
        r = dict(r, proved=f"part {part[0]}/{part[1]} exhausted: no failing schedule in it "
                           f"({r['schedules']} schedules); the bound is proved when "
                           f"--merge finds every part so")
    head = (f"{r['target']} {r['runtime']} {r['variant']} {r['strategy']}"
            + (f" buggify={','.join(r['buggify'])}" if r.get("buggify") else "") + ":")
    if r.get("skipped"):
        print(f"{head} {r['skipped']}")
        return
    rate = f"{r['schedules']} schedules in {r['wall_s']:.2f} s wall, {r['cpu_s']:.2f} s CPU"
    info = r.get("strategy_info", {}).get("line")
    if not r.get("found"):
        print(f"{head} no failing schedule ({rate})")
        for line in [info, r.get("proved"), r.get("not_proved")] + _property_lines(r):
            if line:
                print(f"    {line}")
        return
    print(f"{head} FAILED at schedule {r['first_failure']} ({rate}): {r['outcome']}")
    if info:
        print(f"    {info}")
    if r.get("violation_at") is not None:
        print(f"    seen at t={r['violation_at']:.6f}s; the target's own outcome: "
              f"{r.get('target_outcome')}")
    for line in _property_lines(r):
        print(f"    {line}")
    print(f"    deviations from the default order: {r['deviations_found']}, shrunk to "
          f"{r['shrunk_deviations']} ({r['shrunk_delays']} delays, {r['shrink_runs']} runs): "
          f"{r['shrunk_outcome']}; replay exact: {'yes' if r['replay_exact'] else 'NO'}")
    for line in r.get("pending") or []:
        print(f"    pending: {line}")
    trace = r.get("trace_lines")
    if trace:
        print("    beside the nearest passing schedule (>> the first differing choice):")
        for line in trace:
            print(f"      {line}")
    if out_dir:
        path = os.path.join(out_dir, _file_name(r, part))
        _write(path, r["schedule"])
        print(f"    schedule: {path}  (looplab explore --replay {path})")


def _write(path, doc) -> None:
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")


def _replay(path: str) -> int:
    from bench.explore import exploration as runner, targets
    from bench.results import read_json
    doc = read_json(path, f"--replay {path}")
    if not isinstance(doc, dict) or doc.get("model") != runner.SCHEDULE_MODEL:
        raise UsageError(f"--replay {path}: not a schedule file (model {runner.SCHEDULE_MODEL})")
    t = targets.resolve(doc["target"], doc.get("preset") or "tiny")
    got = runner.replay(doc, t)
    print(f"{doc['target']} {doc['runtime']} {doc['variant']}: {got['outcome']}")
    print(f"    recorded: {doc['outcome']}; same choice points: "
          f"{'yes' if got['same_points'] else 'NO'}; exact: {'yes' if got['exact'] else 'NO'}")
    if got["code_then"] != got["code_now"]:
        print(f"    note: recorded on code {got['code_then']}, replayed on {got['code_now']}")
    for line in got["pending"]:
        print(f"    pending: {line}")
    return ExitCode.OK if got["exact"] else ExitCode.FAILED


def _check_parts(args):
    """``--shard I/N`` as ``(I, N)`` (None without it), and the options it and
    ``--merge`` cannot go with: one line, before anything runs."""
    if args.merge and (args.target or args.replay or args.bench or args.shard):
        raise UsageError("explore --merge takes part files or directories only (no TARGET, "
                         "--replay, --bench or --shard)")
    if not args.shard:
        return None
    from bench.explore import shards
    part = shards.parse(args.shard)
    if args.replay or args.bench:
        raise UsageError("--shard I/N splits an exploration of a TARGET, not --replay or --bench")
    if not args.out:
        raise UsageError(f"--shard {args.shard} needs --out DIR: the part is written there "
                         "for looplab explore --merge")
    return part


def _merged(args) -> int:
    """``--merge``: the parts joined, reported as one exploration."""
    from bench.explore import shards
    parts = shards.read_parts(args.merge)
    results, reason = shards.merge_parts(parts)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    for r in results:
        _report(r, args.out)
    count = parts[0][1]["exploration"]["count"]
    print(f"merged {len(parts)} of {count} parts: {sum(r['schedules'] for r in results)} "
          f"schedules, {max((r['wall_s'] for r in results), default=0):.1f} s wall for the "
          f"longest part, {sum(r['cpu_s'] for r in results):.1f} s CPU in all")
    if reason:
        print(reason)
    if args.out:
        _write(os.path.join(args.out, "explore.json"),
               {"explorations": results, "merged_from": [p for p, _ in parts],
                **({"not_proved": reason} if reason else {})})
    failed = bool(reason) or any(r.get("found") or _vacuous(r) for r in results)
    return ExitCode.FAILED if failed else ExitCode.OK


def cmd_explore(args) -> int:
    from bench.explore import bugs, search, targets
    from bench.verbs.common import load_plugins
    load_plugins(args)          # a user's scenario file (its declared properties too)
    part = _check_parts(args)
    if args.merge:
        return _merged(args)
    if args.replay:
        return _replay(args.replay)
    if args.bench:
        return _bench(args)
    if not args.target:
        raise UsageError("explore needs a TARGET (a scenario, S3:drain, a zoo id or one of "
                         f"{', '.join(bugs.PROGRAMS)}), --replay FILE or --bench")
    try:
        search.parse_strategy(args.strategy)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    target = targets.resolve(args.target, args.preset)
    units = _units(args, target)
    if not units:
        raise UsageError(f"{args.target}: no runtime left to explore")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    shards = _shard(units, args.jobs, part)
    t0 = time.perf_counter()
    results = _merge(shards, run_units(shards, args.jobs))
    for r in results:
        _report(r, args.out, part)
    if part:
        from bench.explore import shards as shardmod
        path = shardmod.part_file(args.out, *part)
        _write(path, shardmod.part_doc(args, part[0], part[1], results))
        print(f"part {part[0]}/{part[1]}: {path}  (join every part with looplab explore "
              f"--merge)")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    print(f"explored {sum(r['schedules'] for r in results)} schedules in "
          f"{time.perf_counter() - t0:.1f} s wall"
          + (f" (load average {load:.1f})" if load is not None else ""))
    if args.out:
        _write(os.path.join(args.out, "explore.json"), {"explorations": results})
    # a failing schedule, or a sometimes property no schedule reached (vacuous)
    return ExitCode.FAILED if any(r.get("found") or _vacuous(r) for r in results) \
        else ExitCode.OK


# ---------------------------------------------------------------------------
# The benchmark table (--bench)

#: Per benchmark target: its preset for finding the bug, its preset for the
#: proof of the fix, and the runtimes it runs on (None: every one that applies).
BENCH_SPECS = {"S3:drain": {"preset": "blog", "proof_preset": "tiny", "seeds": 3},
               # the task runtimes and the zoo entry's own design flips (its card)
               "trio-1626": {"runtimes": "entry"}}
STRATEGIES = ("random", "pct:d=2", "pct:d=3")


def _bench_row(job: tuple) -> dict:
    from bench.explore import exploration as runner, targets
    tid, rt, seeds, budget = job
    spec = BENCH_SPECS.get(tid, {})
    seeds = spec.get("seeds", seeds)
    t = targets.resolve(tid, spec.get("preset", "tiny"))
    proof_t = targets.resolve(tid, spec.get("proof_preset", spec.get("preset", "tiny")))
    naive, fixed = t.variants[0], t.variants[-1]
    row = {"bug": tid, "runtime": rt}
    for strat in STRATEGIES:
        firsts = []
        for s in range(seeds):
            r = runner.explore(t, rt, naive, strat, budget, seed=s, do_shrink=False)
            firsts.append(r["first_failure"] if r.get("found") else None)
        found = [f for f in firsts if f is not None]
        row[strat] = {"found": len(found), "seeds": seeds,
                      "median": statistics.median(f if f is not None else budget + 1
                                                  for f in firsts)}
    row["delays"] = None
    for D in range(4):
        r = runner.explore(t, rt, naive, f"delays:{D}", budget)
        if r.get("found"):
            row["delays"] = {"D": D, "schedules": r["first_failure"],
                             "shrunk": r["shrunk_deviations"], "replay_exact": r["replay_exact"],
                             "liveness": r["liveness"], "outcome": r["outcome"]}
            break
        if not (r.get("strategy_info") or {}).get("exhausted"):
            # exhausted but vacuous (a sometimes not reached yet) goes on to D + 1
            row["delays"] = {"D": None, "note": f"D={D} not exhausted in {budget}"}
            break
    if fixed != naive:
        p = runner.explore(proof_t, rt, fixed, "delays:2", 20 * budget)
        row["fixed"] = p.get("proved") or p.get("not_proved") or (
            f"FAILED: {p['outcome']}" if p.get("found") else
            f"not exhausted in {p['schedules']} schedules")
    return row


def bench_rows(ids, seeds: int, budget: int, jobs: int = 1, progress=print) -> list:
    """One row per benchmark bug x runtime it runs on: schedules to the first
    failure per strategy (median over seeds; budget + 1 when not found), the
    delays the bug needs, and the fixed program's proof within 2 delays."""
    from bench.explore import targets
    work = []
    for tid in ids:
        spec = BENCH_SPECS.get(tid, {})
        t = targets.resolve(tid, spec.get("preset", "tiny"))
        rts = list(t.runtimes)
        if spec.get("runtimes") == "entry":
            # the zoo card's design flips join the runtimes of its port styles
            from bench.zoo import registry
            rts += [f.spec for f in registry.entry(tid).flips]
        work += [(tid, rt, seeds, budget) for rt in rts if not t.applies(rt)]
    if jobs <= 1:
        rows = []
        for job in work:
            rows.append(_bench_row(job))
            progress(json.dumps(rows[-1]))
        return rows
    import concurrent.futures as cf
    import multiprocessing
    with cf.ProcessPoolExecutor(max_workers=jobs,
                                mp_context=multiprocessing.get_context("fork")) as pool:
        rows = list(pool.map(_bench_row, work))
    for row in rows:
        progress(json.dumps(row))
    return rows


def _cell(x) -> str:
    if not x:
        return "-"
    return f"{x['median']:g} ({x['found']}/{x['seeds']})" if x["found"] else \
        f"> budget (0/{x['seeds']})"


def bench_table(rows: list, budget: int) -> str:
    lines = ["| bug | runtime | random | PCT d=2 | PCT d=3 | delays: D, schedules, "
             "shrunk to | fixed, within 2 delays |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        d = r.get("delays")
        if d and d.get("D") is not None:
            dl = (f"D={d['D']}: {d['schedules']}, {d['shrunk']} dev., replay "
                  f"{'exact' if d['replay_exact'] else 'NOT exact'}"
                  + (", a hang" if d.get("liveness") else ""))
        else:
            dl = (d or {}).get("note", "never fails within D=3")
        lines.append(f"| {r['bug']} | {r['runtime']} | {_cell(r['random'])} | "
                     f"{_cell(r['pct:d=2'])} | {_cell(r['pct:d=3'])} | {dl} | "
                     f"{r.get('fixed', '-')} |")
    return "\n".join(lines)


def _bench(args) -> int:
    from bench.explore import bugs
    ids = [i.strip() for i in args.only.split(",")] if args.only else list(bugs.BENCHMARK)
    t0 = time.perf_counter()
    rows = bench_rows(ids, args.seeds, args.budget, args.jobs,
                      progress=lambda line: print(line, file=sys.stderr))
    table = bench_table(rows, args.budget)
    print(table)
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    print(f"benchmark: {time.perf_counter() - t0:.0f} s wall"
          + (f", load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}" if load else ""))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        _write(os.path.join(args.out, "bench.json"), {"rows": rows, "budget": args.budget,
                                                      "seeds": args.seeds})
        with open(os.path.join(args.out, "bench.md"), "w") as f:
            f.write(table + "\n")
    return ExitCode.OK


def add_parser(sub) -> None:
    from bench.verbs.common import add_plugin_options, positive_int
    p = sub.add_parser("explore", help="explore a target's schedules: find, shrink and replay "
                                       "a failing interleaving, or prove a delay bound")
    p.add_argument("target", nargs="?", help="a scenario (S3), a variant (S3:drain), a zoo id, "
                                             "or a program (cpython-27585, ...)")
    p.add_argument("--runtimes", default=None, help="comma-separated runtime specs")
    p.add_argument("--strategy", default="random", help="random | pct:d=N | delays:D")
    p.add_argument("--budget", type=positive_int, default=1000, help="schedules per unit")
    p.add_argument("--variant", choices=("naive", "fixed", "both"), default="naive")
    p.add_argument("--preset", default="tiny", help="the scenario's preset (default tiny)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random and PCT draws")
    p.add_argument("--net-choices", choices=("on", "off"), default="on",
                   help="the network's timing choices join the scheduler's (default on)")
    p.add_argument("--portability", action="store_true",
                   help="also take orders another runtime's contract allows")
    from bench.verbs.common import add_buggify_option
    add_buggify_option(p, "every point given is enabled and each site it reaches is a "
                          "choice (kind buggify: behave or fire), legal on every runtime")
    p.add_argument("--jobs", type=positive_int, default=1, help="processes (default 1)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="write explore.json and each failing schedule here")
    p.add_argument("--replay", default=None, metavar="FILE", help="rerun a schedule file")
    p.add_argument("--shard", default=None, metavar="I/N",
                   help="run only part I of N of each unit's search and write it under --out "
                        "(join the parts with --merge)")
    p.add_argument("--merge", nargs="+", default=None, metavar="PART",
                   help="join the parts written by --shard (files, or directories holding "
                        "explore-part-*.json) into one result")
    p.add_argument("--bench", action="store_true", help="run the benchmark of bugs")
    p.add_argument("--seeds", type=positive_int, default=5,
                   help="--bench: seeds per random/PCT measurement (default 5)")
    p.add_argument("--only", default=None, help="--bench: these benchmark ids only")
    add_plugin_options(p)
    p.set_defaults(func=cmd_explore)
