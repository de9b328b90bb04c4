"""``looplab explore``: the command line of schedule exploration.

    looplab explore TARGET [--runtimes R,...] [--strategy random|pct:d=N|delays:D]
                    [--budget N] [--variant naive|fixed|both] [--preset P] [--seed S]
                    [--net-choices on|off] [--portability] [--buggify [POINT,...]]
                    [--jobs J] [--out DIR] [--await-chain] [--shard I/N]
                    [--scenario-file FILE] [--scenario-module M] [--runtime-module M]
    looplab explore --merge DIR_OR_PART... [--out DIR]
    looplab explore --replay FILE [--allow-changed] [--await-chain]
    looplab explore --bench [--seeds S] [--budget N] [--only ID,...] [--out DIR]

TARGET is a scenario, a variant, a zoo entry, a benchmark program, or a
user's program (``path/to/file.py:NAME``, ``package.module:NAME``:
``bench.explore.programs``). One unit is one target x runtime x variant.
``--jobs`` runs units in parallel processes; when there are fewer units than
jobs, a unit is split into shards: random and PCT shards with their own seeds
and shares of the budget, a ``delays:D`` unit into disjoint parts of its
bounded space (``search.DelayBounded``). The shards' results merge; a bound
is proved when every part of it is. ``--shard I/N`` runs one such part in this
process and writes it; ``--merge`` joins the parts from any number of machines
(``bench.explore.shards``). Each unit is printed (and its failing
schedule written) as it finishes, so SIGINT or SIGTERM keeps the finished ones
(exit 130). Exit 0 when no failing schedule was found, 1 when one was or when
a declared ``sometimes`` property was never reached (vacuous), 2 for a usage
mistake, 4 when a ``delays:D`` search stopped at its budget without a proof.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

from bench.errors import ExitCode, UsageError
from bench.explore.shards import merge as _merge

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
    target = r["target"]
    if os.sep in target.rpartition(":")[0]:
        target = os.path.basename(target)       # a program file's path: its name is enough
    safe = "".join(c if c.isalnum() or c in "-." else "_" for c in
                   f"{target}_{r['runtime']}_{r['variant']}")
    return f"failing-{safe}" + (f"-part-{part[0]}-of-{part[1]}" if part else "") + ".json"


def not_exhausted(r: dict) -> str | None:
    """A ``delays:D`` search that stopped at its budget (or its queue) before it
    had run the whole bounded space, without a failure: it proves nothing."""
    if r.get("found") or r.get("skipped") or r.get("proved") or r.get("not_proved"):
        return None
    if not str(r.get("strategy", "")).startswith("delays:"):
        return None
    return f"not exhausted: {r['schedules']} schedules, no proof"


def _report(r: dict, out_dir: str | None, chains: bool = False, part=None) -> None:
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
        for line in [info, r.get("proved"), r.get("not_proved"), not_exhausted(r)] \
                + _property_lines(r):
            if line:
                print(f"    {line}")
        return
    print(f"{head} FAILED at schedule {r['first_failure']} ({rate}): {r['outcome']}")
    if info:
        print(f"    {info}")
    for line in _property_lines(r):
        print(f"    {line}")
    print(f"    deviations from the default order: {r['deviations_found']}, shrunk to "
          f"{r['shrunk_deviations']} ({r['shrunk_delays']} delays, {r['shrink_runs']} runs): "
          f"{r['shrunk_outcome']}; replay exact: {'yes' if r['replay_exact'] else 'NO'}")
    # the shrunk run's own: when it failed, and where its tasks wait
    if r.get("violation_at") is not None:
        print(f"    seen at t={r['violation_at']:.6f}s; the target's own outcome: "
              f"{r.get('target_outcome')}")
    elif r.get("failed_at") is not None:
        print(f"    failed at t={r['failed_at']:.6f}s (virtual)")
    _pending_lines(r.get("pending") or [], r.get("chains") or [], chains)
    trace = r.get("trace_lines")
    if trace:
        print("    beside the nearest passing schedule (>> the first differing choice):")
        for line in trace:
            print(f"      {line}")
    if out_dir:
        path = os.path.join(out_dir, _file_name(r, part))
        _write(path, r["schedule"])
        print(f"    schedule: {path}  (looplab explore --replay {path})")


def _pending_lines(pending: list, chain_list: list, chains: bool) -> None:
    for i, line in enumerate(pending):
        print(f"    pending: {line}")
        if chains and i < len(chain_list):
            for step in chain_list[i]:
                print(f"        {step}")


def _write(path, doc) -> None:
    """A schedule file, written atomically; its folder is made now (the output rule:
    a folder appears when its first file is written)."""
    from bench.explore import programs
    from bench import results
    results.write_text(path, json.dumps(programs.for_file(doc, path), indent=1,
                                        sort_keys=True) + "\n")


def _replay_target(doc: dict, path: str, allow_changed: bool):
    """The target a schedule file names; a user's program is found relative to
    the file and must be the source recorded (``programs.check_source``)."""
    from bench.explore import programs, targets
    prog = doc.get("program")
    if not prog:
        return targets.resolve(doc["target"], doc.get("preset") or "tiny"), None
    if not isinstance(prog, dict) or not prog.get("name"):
        raise UsageError(f"--replay {path}: its program entry is malformed")
    src, note = programs.check_source(prog, os.path.dirname(os.path.abspath(path)),
                                      allow_changed)
    print(f"replaying {prog['name']} from {src}" + (f" ({note})" if note else
                                                     " (sha256 as recorded)"))
    if prog.get("scenario"):            # a scenario of a user's scenario file
        from bench.scenarios import api as scmod
        scmod.load_scenario_file(src)
        return targets.resolve(doc["target"], doc.get("preset") or "tiny"), note
    if prog.get("module"):
        t = targets.ProgramTarget(programs.load(f"{prog['module']}:{prog['name']}"))
        if os.path.realpath(t.source["file"]) != os.path.realpath(src):
            raise UsageError(f"--replay {path}: module {prog['module']} imports from "
                             f"{t.source['file']}, not the recorded {src}")
    else:
        t = targets.ProgramTarget(programs.load(f"{src}:{prog['name']}"))
    # a marked test's bound and network (``@pytest.mark.looplab(T=..., net=...)``)
    if "T" in prog:
        t.bug.T = float(prog["T"])
    if prog.get("net"):
        t.bug.net = dict(prog["net"])
    t.name = doc["target"]
    return t, note


def _replay(path: str, allow_changed: bool = False, chains: bool = False) -> int:
    from bench.explore import exploration as runner
    from bench.results import read_json
    doc = read_json(path, f"--replay {path}")
    if not isinstance(doc, dict) or doc.get("model") != runner.SCHEDULE_MODEL:
        raise UsageError(f"--replay {path}: not a schedule file (model {runner.SCHEDULE_MODEL})")
    t, changed = _replay_target(doc, path, allow_changed)
    got = runner.replay(doc, t)
    exact = got["exact"] and not changed
    print(f"{doc['target']} {doc['runtime']} {doc['variant']}: {got['outcome']}")
    print(f"    recorded: {doc['outcome']}; same choice points: "
          f"{'yes' if got['same_points'] else 'NO'}; exact: {'yes' if exact else 'NO'}"
          + (" (the source changed)" if changed else ""))
    if got["code_then"] != got["code_now"]:
        print(f"    note: recorded on code {got['code_then']}, replayed on {got['code_now']}")
    _pending_lines(got["pending"], got.get("chains") or [], chains)
    return ExitCode.OK if exact else ExitCode.FAILED


def _unit_results(shards: list, jobs: int):
    """Each unit's merged result as soon as all its shards are done (in unit
    order), so an interrupt keeps every unit that finished."""
    if jobs <= 1 or len(shards) <= 1:
        for s in shards:
            yield _merge([s], [_run_unit(s)])[0]
        return
    import multiprocessing
    done: dict = {}
    want = {}
    for s in shards:
        want[s["unit"]] = want.get(s["unit"], 0) + 1
    if len(shards) <= jobs:
        # a process a shard, each with its own pipe: no pool. A pool's terminate()
        # takes its task queue's lock, which a worker still waiting for its first
        # task holds: an interrupt at that moment hung the verb (seen twice under load)
        results = _in_processes(shards)
    else:
        pool = multiprocessing.get_context("fork").Pool(jobs, initializer=_worker_signals)
        results = _pooled(pool, shards)
    for s, r in zip(shards, results):
        done.setdefault(s["unit"], []).append((s, r))
        if len(done[s["unit"]]) == want[s["unit"]]:
            pairs = done.pop(s["unit"])
            yield _merge([p[0] for p in pairs], [p[1] for p in pairs])[0]


def _pooled(pool, shards):
    try:
        yield from pool.imap(_run_unit, shards)
        pool.close()
    finally:
        pool.terminate()        # an interrupt: the workers' unfinished units are dropped
        pool.join()


def _in_processes(shards):
    """Each shard's result, in order, from a forked process of its own; on an
    interrupt (or any exit) every process still running is ended with SIGTERM."""
    import multiprocessing
    ctx = multiprocessing.get_context("fork")
    running = []
    try:
        for s in shards:
            reader, writer = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_shard_process, args=(s, writer), daemon=True)
            proc.start()
            writer.close()
            running.append((proc, reader))
        for proc, reader in running:
            try:
                ok, value = reader.recv()
            except EOFError:
                raise RuntimeError(f"an exploration process ended without its result "
                                   f"(exit {proc.exitcode})") from None
            if not ok:
                raise value
            yield value
    finally:
        for proc, reader in running:
            if proc.is_alive():
                proc.terminate()
        for proc, reader in running:
            proc.join()
            reader.close()


def _shard_process(shard, writer) -> None:
    _worker_signals()
    try:
        try:
            out = (True, _run_unit(shard))
        except Exception as exc:            # raised again in the parent, as a pool does
            out = (False, exc)
        try:
            writer.send(out)
        except Exception as exc:            # an exception that does not pickle
            writer.send((False, RuntimeError(f"{type(exc).__name__}: {exc}")))
    finally:
        writer.close()


def _worker_signals() -> None:
    """A worker leaves SIGINT to the parent (a terminal's Ctrl-C reaches the whole
    group) and dies on SIGTERM, which is how the parent ends it."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _check_out(out: str) -> None:
    from bench.results import check_output
    check_output(out, "--out", folder=True)


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
        return _replay(args.replay, args.allow_changed, args.await_chain)
    if args.out:
        _check_out(args.out)    # before anything runs: one line, exit 2
    if args.bench:
        return _bench(args)
    if not args.target:
        raise UsageError("explore needs a TARGET (a scenario, S3:drain, a zoo id, a program "
                         f"file.py:NAME or module:NAME, or one of {', '.join(bugs.PROGRAMS)}), "
                         "--replay FILE or --bench")
    try:
        search.parse_strategy(args.strategy)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    target = targets.resolve(args.target, args.preset)
    hidden = targets.shadowed_alias(args.target) if target.kind == "cell" else None
    if hidden:
        sid = args.target.partition(":")[0]
        print(f"note: {sid} is your scenario; the zoo's {sid} ({hidden}) is zoo:{sid}",
              file=sys.stderr)
    units = _units(args, target)
    if not units:
        raise UsageError(f"{args.target}: no runtime left to explore")
    shards = _shard(units, args.jobs, part)
    t0 = time.perf_counter()
    results: list = []
    from bench.perf.machine import stop_on_signals
    interrupted = False
    with stop_on_signals():
        try:
            for r in _unit_results(shards, args.jobs):
                results.append(r)
                _report(r, args.out, args.await_chain, part)
                sys.stdout.flush()
        except KeyboardInterrupt:           # SIGINT or SIGTERM: keep what finished
            interrupted = True
    if part and not interrupted:
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
        doc = {"explorations": results}
        if interrupted:
            doc["interrupted"] = {"finished_units": len(results), "units": len(units)}
        _write_summary(os.path.join(args.out, "explore.json"), doc)
    if interrupted:
        kept = (f"kept in {os.path.join(args.out, 'explore.json')}" if args.out
                else "printed above (no --out)")
        print(f"looplab: interrupted; {len(results)} of {len(units)} unit(s) finished, {kept}",
              file=sys.stderr)
        return ExitCode.INTERRUPTED
    # a failing schedule, or a sometimes property no schedule reached (vacuous)
    if any(r.get("found") or _vacuous(r) for r in results):
        return ExitCode.FAILED
    if any(not_exhausted(r) for r in results):
        return ExitCode.NOT_EXHAUSTED
    return ExitCode.OK


def _write_summary(path: str, doc: dict) -> None:
    from bench.explore import programs
    doc = dict(doc, explorations=[dict(r, schedule=programs.for_file(r["schedule"], path))
                                  if r.get("schedule") else r for r in doc["explorations"]])
    _write(path, doc)


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
        if not (r.get("proved") or (r.get("strategy_info") or {}).get("exhausted")):
            # (exhausted without a proof: a sometimes not reached yet in it; the
            # next D goes on as after a proof)
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
        from bench import results
        _write(os.path.join(args.out, "bench.json"), {"rows": rows, "budget": args.budget,
                                                      "seeds": args.seeds})
        results.write_text(os.path.join(args.out, "bench.md"), table + "\n")
    return ExitCode.OK


def add_parser(sub) -> None:
    from bench.verbs.common import add_plugin_options, positive_int
    p = sub.add_parser("explore", help="explore a target's schedules: find, shrink and replay "
                                       "a failing interleaving, or prove a delay bound")
    p.add_argument("target", nargs="?", help="a scenario (S3), a variant (S3:drain), a zoo id, "
                                             "a program of yours (path/to/file.py:NAME or "
                                             "package.module:NAME: an async def, or a "
                                             "Bug(naive=..., fixed=...)), or a benchmark "
                                             "program (cpython-27585, ...)")
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
                   help="write explore.json and each failing schedule here (as each unit "
                        "finishes: Ctrl-C or SIGTERM keeps the finished ones, exit 130)")
    p.add_argument("--replay", default=None, metavar="FILE",
                   help="rerun a schedule file (a user's program is found relative to it, "
                        "and must be the source it recorded)")
    p.add_argument("--allow-changed", action="store_true",
                   help="--replay: run a program whose source changed since the schedule "
                        "was recorded (the replay is then marked exact: NO)")
    p.add_argument("--await-chain", action="store_true",
                   help="under each pending task, its await chain (file:LINE in function, "
                        "outermost first)")
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
