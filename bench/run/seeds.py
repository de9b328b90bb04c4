"""Simulated universes from the run verb's side: ``looplab run --net real|sim|both``,
``--replay FILE`` and ``--seeds N``.

``bench.scenarios.simulated`` runs one cell in one world; this module sits above
``bench.run`` and decides which worlds to run:

* ``cells_for(args, planned)``: the planned cells on the chosen network (``--net
  both``: each cell twice, ``net`` a cell param), or the cells a ``--replay``
  file describes (``replay_cells``; ``cell_from_universe`` rebuilds one).
* ``explore(cell, seeds, faults)``: one cell in many universes -- network
  jitter, per-wait CPU time and the coro ready order drawn from each seed,
  optionally random faults. It counts the outcomes (the verdicts), keeps the
  first failing universe, shrinks its fault schedule to the faults the failure
  needs (``shrink``) and checks that the shrunk universe replays to the same
  outcome. ``explore_command`` prints and writes that for the run verb.
"""
from __future__ import annotations

import copy
import time

from bench.results.tables import plural
from bench.scenarios.simulated import UNIVERSE_MODEL, sim_capable

__all__ = ["NETS", "EXPLORE_NET", "cells_for", "replay_cells", "cell_from_universe", "explore",
           "explore_command", "seed_cell", "with_ready_order", "outcome_of", "failed", "shrink"]


#: A sim cell's metrics that are not a function of its universe: they measure
#: this machine (wall-clock and CPU time of the cell).
WALL_CLOCK = ("cell_wall_s", "cell_cpu_s")


def cell_from_universe(u: dict):
    """The ``bench.run.Cell`` that ``universe()``'s dict describes (its
    world pinned); ValueError if it is not one."""
    from bench.run.plan import Cell
    if not isinstance(u, dict) or u.get("model") != UNIVERSE_MODEL:
        raise ValueError("not a looplab cell universe (no model 'looplab.simcell')")
    if u.get("version") != 1:
        raise ValueError(f"cell universe version {u.get('version')!r} is not 1")
    params = dict(u["params"])
    params["net"] = "sim"
    return Cell(u["scenario"], u["runtime"], u["variant"], u["preset"], params, 1, world=u["net"])



# ---------------------------------------------------------------------------
# Exploration: many universes of one cell (``looplab run --net sim --seeds N``)

#: The network an exploration varies: one-way latency jittered by up to as much
#: again, drawn per segment from the seed, so ACK and delivery timings -- and
#: with them partial writes and wake-up order -- differ from seed to seed.
EXPLORE_NET = {"jitter_s": 2e-6, "cpu_per_wait_s": 20e-6, "sockbuf_scale": 2}


def with_ready_order(runtime_spec: str, seed: int) -> str:
    """``runtime_spec`` with ``ready_order=random-SEED`` if the runtime has that
    option (our coro kernel) and no ready order of its own; else unchanged."""
    from bench import runtimes as rtmod
    rt = rtmod.parse(runtime_spec)
    names = {o.name for o in rt.info.options.options} if hasattr(rt.info.options, "options") \
        else set(rt.info.options.defaults())
    if "ready_order" not in names or rt.options.get("ready_order", "fifo") != "fifo":
        return rt.spec
    return rtmod.parse(f"{runtime_spec}{',' if ':' in runtime_spec else ':'}"
                       f"ready_order=random-{seed}").spec


def seed_cell(cell, seed: int, faults: int = 0, net: dict | None = None):
    """``cell`` in universe ``seed``: the world's seed, ``faults`` random faults
    drawn from it, the exploration network, and the coro ready-order seed."""
    from bench.run.plan import Cell
    params = {**EXPLORE_NET, **(net or {}), "random_faults": faults}
    if faults:
        params.setdefault("fault_horizon_s", _horizon(cell))
    spec = with_ready_order(cell.runtime, seed)
    # the objects behind the names go along (none is looked up again per
    # universe), the parsed runtime only where the spec did not change
    return Cell(cell.scenario, spec, cell.variant, cell.preset,
                {**cell.params, "net": "sim"}, 1, world={"seed": seed, "params": params},
                _sc=cell._sc, _rt=cell._rt if spec == cell.runtime else None)


def _horizon(cell) -> float:
    """When drawn faults may happen: while the cell is busy (its duration or
    hold time; 2 s for the programs, which finish within about that)."""
    p = cell.params
    for key in ("duration_s", "hold_s"):
        if isinstance(p.get(key), (int, float)) and p[key] > 0:
            return float(min(p[key], 10.0))
    return 2.0


def outcome_of(result: dict) -> str:
    """One line naming a run's outcome: its verdicts (or its error)."""
    if result.get("errors"):
        return "error: " + result["errors"][0].split("\n")[0][:120]
    return ", ".join(f"{k}={'yes' if v else 'not measured' if v is None else 'NO'}"
                     for k, v in sorted(result["verdicts"].items()))


def failed(result: dict) -> bool:
    """A scenario's failing run: an error, or a verdict that did not hold."""
    return bool(result.get("errors")) or not all(result["verdicts"].values())


#: How many bisection steps ``shrink`` spends on one field of one fault, and
#: how many runs it spends on times and parameters in all.
SHRINK_STEPS = 4
SHRINK_FIELD_RUNS = 40

#: The fields ``shrink`` makes smaller, and the least each may become: a time
#: moves toward the cell's start (0), a duration and a probability toward 0.
_SHRINKABLE = ("at", "duration_s", "p", "step_s")


def shrink(cell, universe_: dict, still_fails, max_field_runs: int = SHRINK_FIELD_RUNS
           ) -> tuple[dict, int]:
    """The smallest fault schedule that reproduces ``still_fails``. First
    greedily drop one fault at a time while the run still fails the same way;
    then, for each fault left, bisect each of its times and parameters toward
    0 (``at`` earlier, ``duration_s``, ``p`` and a clog's ``step_s`` smaller,
    a clog's connections fewer), keeping a change only if the run still fails
    the same way. At most ``max_field_runs`` runs go to the second pass.
    Returns the shrunk universe and how many runs it took."""
    u = copy.deepcopy(universe_)
    faults = list(u["net"]["faults"])
    runs = 0
    changed = True
    while changed and faults:
        changed = False
        for i in range(len(faults)):
            trial = faults[:i] + faults[i + 1:]
            u2 = copy.deepcopy(u)
            u2["net"]["faults"] = trial
            runs += 1
            if still_fails(u2):
                faults, u, changed = trial, u2, True
                break
    budget = max_field_runs

    def holds(i, f):
        nonlocal budget, runs
        if budget <= 0:
            return False
        budget -= 1
        runs += 1
        u2 = copy.deepcopy(u)
        u2["net"]["faults"][i] = f
        return still_fails(u2)

    for i in range(len(faults)):
        f = dict(u["net"]["faults"][i])
        conns = f.get("conns")
        while conns and len(conns) > 1:          # a clog of fewer connections
            for j in range(len(conns)):
                trial = {**f, "conns": conns[:j] + conns[j + 1:]}
                if holds(i, trial):
                    f, conns = trial, trial["conns"]
                    u["net"]["faults"][i] = f
                    break
            else:
                break
        for key in _SHRINKABLE:
            v = f.get(key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0 \
                    or (key == "step_s" and len(f.get("conns", ())) < 2):
                continue                 # a one-connection clog has no steps
            # bisect between lo (not known to fail; 0 is never tried for a
            # duration or a probability, which must stay > 0) and v (fails)
            lo = 0.0
            for _ in range(SHRINK_STEPS):
                mid = round((lo + v) / 2, 6)
                if mid <= lo or mid >= v or budget <= 0:
                    break
                trial = {**f, key: mid}
                if holds(i, trial):
                    f, v = trial, mid
                    u["net"]["faults"][i] = f
                else:
                    lo = mid
    return u, runs


def explore(cell, seeds: int, faults: int = 0, net: dict | None = None, first_seed: int = 0,
            progress=None, failing=failed, stop=None) -> dict:
    """Run ``cell`` in ``seeds`` universes; count each outcome; keep the first
    universe for which ``failing(result)`` is true, shrunk to its smallest fault
    schedule, and check that it replays to the same result. Numeric metrics get
    min / median / max. ``stop()`` true (a signal arrived) abandons the cell
    with KeyboardInterrupt."""
    from bench import run as matrix
    counts: dict[str, int] = {}
    first_fail = None
    values: dict[str, list] = {}
    wall = 0.0
    cpu = 0.0
    sim = 0.0
    def check_stop():
        if stop is not None and stop():
            raise KeyboardInterrupt
    for s in range(first_seed, first_seed + seeds):
        check_stop()
        c = seed_cell(cell, s, faults, net)
        t = time.perf_counter()
        r = matrix.run_cell(c)
        wall += time.perf_counter() - t
        sim += r["metrics"].get("sim_s") or 0.0
        cpu += r["metrics"].get("cell_cpu_s") or 0.0
        o = outcome_of(r)
        counts[o] = counts.get(o, 0) + 1
        for k, v in r["metrics"].items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) \
                    and k not in WALL_CLOCK:
                values.setdefault(k, []).append(v)
        if first_fail is None and failing(r):
            first_fail = (s, r)
        if progress:
            progress(s, o)
    out = {"cell": cell.id, "seeds": seeds, "first_seed": first_seed, "random_faults": faults,
           "net": {**EXPLORE_NET, **(net or {})}, "outcomes": counts,
           "wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "sim_s": round(sim, 3),
           "metrics": {k: {"min": min(v), "median": sorted(v)[len(v) // 2], "max": max(v)}
                       for k, v in values.items()}}
    if first_fail is not None:
        seed, r = first_fail
        want = outcome_of(r)

        def still_fails(u):
            check_stop()
            return outcome_of(matrix.run_cell(cell_from_universe(u))) == want
        shrunk, runs = shrink(cell, r["universe"], still_fails)
        check_stop()
        replay = matrix.run_cell(cell_from_universe(shrunk))
        out["failing"] = {"seed": seed, "outcome": want, "universe": r["universe"],
                          "faults_before": len(r["universe"]["net"]["faults"]),
                          "shrunk_universe": shrunk,
                          "faults_after": len(shrunk["net"]["faults"]), "shrink_runs": runs,
                          "replayed_outcome": outcome_of(replay),
                          "replayed_metrics": {k: v for k, v in replay["metrics"].items()
                                               if k not in WALL_CLOCK}}
    return out


# ---------------------------------------------------------------------------
# The run verb's side: --net, --seeds, --replay

NETS = ("real", "sim", "both")


def cells_for(args, planned: list) -> list:
    """The cells ``looplab run`` runs: from ``--replay FILE``, or ``planned``
    on ``--net real|sim|both`` (both: each cell twice, ``net`` a cell param)."""
    from bench.errors import UsageError
    net = getattr(args, "net", None) or "real"
    if net not in NETS:
        raise UsageError(f"--net must be one of {', '.join(NETS)}, got {net!r}")
    if getattr(args, "seeds", None) and (net != "sim" or getattr(args, "replay", None)):
        raise UsageError("--seeds explores simulated universes: give it with --net sim "
                         "(and without --replay)")
    if getattr(args, "buggify", None) and not getattr(args, "seeds", None):
        raise UsageError("--buggify enables the seam's fault points per universe: give it "
                         "with --net sim --seeds N (a replay carries its own)")
    if (getattr(args, "repeat", None) or 1) > 1 and (net != "real" or getattr(args, "replay", None)):
        # A sim cell's network has no randomness of its own (no jitter, no drawn
        # CPU time, FIFO ready order), so a repeat would run the identical
        # universe and its "frequency" would be 1 of 1 however racy the cell.
        # Varying universes, counting outcomes and shrinking a failing one is
        # what --seeds does; one way to ask for it keeps results honest.
        raise UsageError("--repeat does not vary a simulated cell (every repeat is the same "
                         "universe): under --net sim/both or --replay use --seeds N")
    if getattr(args, "fault_kinds", None) and not getattr(args, "faults", 0):
        raise UsageError("--fault-kinds says which kinds --faults draws: give it with --faults K")
    if getattr(args, "replay", None):
        return replay_cells(args.replay)
    if net == "real":
        return planned
    out = []
    for c in planned:
        if net == "both":
            out.append(_with_net(c, "real"))
        out.append(_with_net(c, "sim"))
    return out


def _with_net(cell, net):
    from bench.run.plan import Cell
    return Cell(cell.scenario, cell.runtime, cell.variant, cell.preset,
                {**cell.params, "net": net}, cell.repeats, world=cell.world)


def replay_cells(path: str) -> list:
    """The cells a ``--replay FILE`` reruns: a cell universe (what ``--seeds``
    writes for a failing seed), an exploration file (its failing universe) or
    a results file (every sim cell in it)."""
    from bench.errors import UsageError
    from bench.results import read_json
    doc = read_json(path, f"--replay {path}")
    found = []
    if isinstance(doc, dict) and doc.get("model") == UNIVERSE_MODEL:
        found = [doc]
    elif isinstance(doc, dict) and isinstance(doc.get("explorations"), list):
        found = [e["failing"]["shrunk_universe"] for e in doc["explorations"] if e.get("failing")]
    elif isinstance(doc, dict) and isinstance(doc.get("cells"), list):
        found = [c["universe"] for c in doc["cells"] if isinstance(c, dict) and c.get("universe")]
    if not found:
        raise UsageError(f"--replay {path}: no simulated universe in it (give a results file "
                         "of a --net sim run, or a universe --seeds wrote)")
    from bench.run.plan import check_cell
    from bench.scenarios.simulated import new_world
    try:
        cells = [check_cell(cell_from_universe(u)) for u in found]
        for c in cells:     # the world it describes can be built (and is thrown away)
            w = dict(c.world or {})
            new_world(w.get("seed", 0), w.get("faults"), **dict(w.get("params") or {}))
    except UsageError as exc:
        raise UsageError(f"--replay {path}: {exc}") from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(f"--replay {path}: {exc}") from None
    return cells


def explore_command(cells: list, args, out_dir: str, failing=failed) -> int:
    """``--net sim --seeds N``: explore every cell; print each outcome's
    frequency; write ``OUT/explore.json`` and, per cell with a universe for
    which ``failing(result)`` holds, its shrunk universe as
    ``OUT/failing-*.json`` (replay it with ``--replay``). SIGINT or SIGTERM
    stops the running universe (``simcells.stop_all``), keeps the cells
    explored so far and exits 130, as an interrupted ``run`` does."""
    import os
    import sys
    from bench import results as resmod
    from bench.errors import ExitCode
    os.makedirs(out_dir, exist_ok=True)
    done: list = []
    signals: list = []
    with _stopping_on_signals(signals):
        try:
            _explore_cells(cells, args, out_dir, failing, done, lambda: bool(signals))
        except KeyboardInterrupt:
            signals.append("SIGINT")
    path = os.path.join(out_dir, "explore.json")
    planned = sum(c.params.get("net") == "sim" for c in cells)
    doc = {"explorations": done}
    if signals:
        doc.update(interrupted=True, incomplete={"finished": len(done), "planned": planned,
                                                 "reason": f"interrupted ({signals[0]})"})
    resmod.write_json(doc, path)
    if signals:
        print(f"looplab: interrupted ({signals[0]}): {len(done)} of {plural(planned, 'cell')} finished "
              f"exploring, kept in {path}", file=sys.stderr)
        return ExitCode.INTERRUPTED
    print(f"exploration: {path}")
    # The exit rule of a plain run, over universes: one that ended in an error (a
    # crash, or not measured) is exit 1, and so is exploring nothing at all.
    if not done:
        print(f"looplab: no cell measured anything: all {plural(planned, 'cell')} skipped "
              "(see the lines above)", file=sys.stderr)
        return ExitCode.FAILED
    errored = sum(n for ex in done for o, n in ex["outcomes"].items() if o.startswith("error: "))
    if errored:
        seeds = sum(ex["seeds"] for ex in done)
        print(f"looplab: {errored} of {plural(seeds, 'universe')} ended in an error (a crash, "
              "or too little evidence: not measured)", file=sys.stderr)
        return ExitCode.FAILED
    return ExitCode.OK


class _stopping_on_signals:
    """While active (in the main thread), SIGINT and SIGTERM stop the running
    simulated cell (``simcells.stop_all``) and append their name to ``signals``
    instead of raising inside it: a KeyboardInterrupt thrown into trio's or
    asyncio's loop would land wherever they happen to be."""

    def __init__(self, signals: list):
        self.signals = signals
        self.old: dict = {}

    def _on(self, signum, frame):
        import signal
        from bench.scenarios import simulated as simcells
        self.signals.append(signal.Signals(signum).name)
        simcells.stop_all(f"interrupted by {signal.Signals(signum).name}")

    def __enter__(self):
        import signal
        import threading
        if threading.current_thread() is threading.main_thread():
            self.old = {s: signal.signal(s, self._on) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc):
        import signal
        for s, handler in self.old.items():
            signal.signal(s, handler)


def _explore_cells(cells, args, out_dir, failing, done, stop) -> None:
    import os
    import sys
    from bench import results as resmod
    for cell in cells:
        if cell.params.get("net") != "sim":
            continue
        why = sim_capable(cell.rt)
        if why is None and cell.rt.interpreter is not None:
            why = (f"{cell.runtime}: seeds run in looplab's own process; for another "
                   "interpreter, run looplab itself with it")
        if why:
            print(f"{cell.id}: skipped: {why}", file=sys.stderr)
            continue
        kinds = getattr(args, "fault_kinds", None)
        bug = getattr(args, "buggify", None)
        net = {**({"fault_kinds": kinds} if kinds else {}), **({"buggify": bug} if bug else {})}
        ex = explore(cell, args.seeds, getattr(args, "faults", 0) or 0, failing=failing, stop=stop,
                     net=net or None)
        done.append(ex)
        print(f"{cell.id}: {plural(args.seeds, 'seed')} in {ex['wall_s']:.2f} s wall, "
              f"{ex['cpu_s']:.2f} s CPU ({ex['sim_s']:.1f} s simulated)")
        for outcome, n in sorted(ex["outcomes"].items(), key=lambda kv: -kv[1]):
            print(f"    {n:6d}  {100 * n / args.seeds:5.1f} %  {outcome}")
        lost = ex["metrics"].get("lost_bytes")
        if lost:
            print(f"    lost_bytes min {lost['min']}, median {lost['median']}, max {lost['max']}")
        f = ex.get("failing")
        if f:
            name = "failing-" + cell.id.replace("/", "_").replace(":", "_") + ".json"
            path = os.path.join(out_dir, name)
            resmod.write_json(f["shrunk_universe"], path)
            f["file"] = path
            points = f["universe"]["net"]["params"].get("buggify")
            if points:
                from kernels.simnet import World
                on = sorted(World(f["universe"]["net"]["seed"], buggify=points).buggify_on)
                print(f"    first failing seed {f['seed']}: fault points enabled: "
                      f"{', '.join(on) or 'none'}")
            print(f"    first failing seed {f['seed']}: faults {f['faults_before']} -> "
                  f"{f['faults_after']} after shrinking; replayed: {f['replayed_outcome']}; "
                  f"universe: {path}")
