"""The matrix: plan cells of scenarios x runtimes x variants, run them, summarize repeats.

A *cell* is one scenario x runtime x variant x preset. Running a cell means calling
its scenario's ``run`` once per repeat (``bench.scenario``: peers in one process, the
runtime under test alone in another) and folding the repeats into one result:
numeric metrics are medians (raw samples kept), and each verdict holds only if it
held in every repeat, with its frequency alongside (``<verdict>_fraction``). A verdict
is True, False or None ("not measured": a repeat lacked the evidence its scenario
declares, ``Scenario.judge``): False if any repeat failed, else None if any repeat
was not measured. A cell that crashes, hangs or measures too little is a result with
``errors``, never the end of the matrix -- and never a pass. Each cell records the
machine's load average at its start and end (``load``): a cell that starved because
the machine was busy says so.
"""
from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field

from bench import scenario as scmod
from bench.errors import UsageError
from protocols import runtimes as rtmod

__all__ = ["Cell", "plan", "run_cell", "run_matrix", "split"]


@dataclass
class Cell:
    scenario: str
    runtime: str          # canonical runtime spec
    variant: str
    preset: str
    params: dict = field(default_factory=dict)
    repeats: int = 1
    world: dict | None = None   # --net sim: the simulated world's seed, params, faults

    @property
    def id(self) -> str:
        net = self.params.get("net", "real")     # --net sim|both: the network is part of the id
        return f"{self.scenario}/{self.runtime}/{self.variant}/{self.preset}" + \
            ("" if net == "real" else f"/{net}")


def split(text: str | None) -> list[str] | None:
    return [t.strip() for t in text.split(",") if t.strip()] if text else None


def plan(scenarios: str | None, runtimes: str | None, variants: str | None,
         preset: str = "quick", repeats: int = 1, main_job: bool = False) -> list[Cell]:
    """The cells of a matrix, validated. Unknown names raise UsageError listing the
    valid ones; unavailable runtimes are kept (they become skipped cells).
    ``main_job`` keeps the scenarios (and variants) that belong in the main report."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise UsageError(f"--repeat must be a whole number >= 1, got {repeats!r}")
    known = scmod.scenarios()
    if main_job and not scenarios:
        ids = [sid for sid, sc in known.items() if sc.main_job]
    else:
        ids = split(scenarios) or list(known)
    for sid in ids:
        if sid not in known:
            raise UsageError(f"unknown scenario {sid!r}; valid scenarios: {', '.join(known)}")
        if preset not in known[sid].presets:
            raise UsageError(f"scenario {sid} has no preset {preset!r}; its presets: "
                             f"{', '.join(known[sid].presets)}")
    rts = rtmod.parse_list(runtimes)
    wanted = split(variants)
    if wanted:
        allowed = {v for sid in ids for v in known[sid].variants}
        for v in wanted:
            if v not in allowed:
                raise UsageError(f"unknown variant {v!r} for {', '.join(ids)}; valid variants: "
                                 f"{', '.join(sorted(allowed))}")
    cells = []
    for sid in ids:
        sc = known[sid]
        for rt in rts:
            if rt.style not in sc.styles:
                continue      # e.g. S2 measures stream readers; other ports have none
            for v in sc.variants:
                if wanted and v not in wanted:
                    continue
                if main_job and sc.main_variants and v not in sc.main_variants:
                    continue
                cells.append(Cell(sid, rt.spec, v, preset, dict(sc.presets[preset]),
                                  max(repeats, sc.default_repeats)))
    return cells


def _typical(values):
    """The median of numbers; for booleans and strings, the most common value."""
    nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if nums:
        return statistics.median(nums)
    present = [v for v in values if v is not None]
    return max(present, key=present.count) if present else None


def _outcome(sc, got) -> scmod.Outcome:
    """A run function's return value, checked against what the scenario declares."""
    if isinstance(got, scmod.Outcome):
        out = got
    elif isinstance(got, tuple) and len(got) == 3:
        out = scmod.Outcome(dict(got[0]), dict(got[1]), list(got[2] or []))
    else:
        raise TypeError(f"{sc.id}.run returned {type(got).__name__}; expected "
                        "(metrics, verdicts, notes) or an Outcome")
    declared = {m.name for m in sc.metrics}
    extra = [k for k in out.metrics if k not in declared]
    if extra:
        raise ValueError(f"{sc.id}.run returned undeclared metrics {', '.join(extra)} "
                         "(declare them in metrics=)")
    missing = [v for v in sc.verdicts if v not in out.verdicts]
    unknown = [v for v in out.verdicts if v not in sc.verdicts]
    if missing or unknown:
        raise ValueError(f"{sc.id}.run returned verdicts {sorted(out.verdicts)}; "
                         f"it declares {sorted(sc.verdicts)}")
    return out


def run_cell(cell: Cell, trace_path: str | None = None) -> dict:
    """Run one cell (all its repeats) and return its result dict. Never raises for a
    failing cell: crashes and timeouts are recorded in ``errors``."""
    rt = rtmod.parse(cell.runtime)
    sc = scmod.get(cell.scenario)
    result = {"id": cell.id, "scenario": cell.scenario, "runtime": cell.runtime,
              "style": rt.style, "ours": rt.ours, "variant": cell.variant, "preset": cell.preset,
              "params": cell.params, "repeats": cell.repeats, "metrics": {}, "verdicts": {},
              "samples": {}, "errors": [], "notes": []}
    reason = rt.unavailable_reason()
    sim = cell.params.get("net") == "sim"
    if sim and not reason:
        from bench import simcells
        reason = simcells.sim_capable(rt)
    if reason:
        result["skipped"] = reason
        return result
    if not sim:   # what the cell's own interpreter runs it with (bench.envs)
        from bench import envs
        result["environment"] = {k: v for k, v in envs.describe(rt).items() if k != "unavailable"}
    runs = []
    result["load"] = {"start": _load()}
    for rep_i in range(cell.repeats):
        t0, c0 = time.monotonic(), time.thread_time()
        with simcells.cell_heap() if sim else contextlib.nullcontext():
            ctx = scmod.CellContext(sc, rt, cell.variant, cell.preset, dict(cell.params), trace_path)
            if sim:   # one world per repeat: repeat i runs seed + i (see bench.simcells)
                ctx.sim = simcells.cell_world(cell, rep_i, result)
            try:
                out = _outcome(sc, sc.run(ctx))
            except Exception as exc:  # a crashing cell is a result, not the end of the matrix
                result["errors"].append(f"{type(exc).__name__}: {exc}")
                continue
            sim_s = ctx.sim.world.now if sim else None
            ctx_notes, ctx_params, seen = ctx.notes, ctx.params, ctx.peers_seen
            del ctx                   # the world goes with it, inside cell_heap
        metrics, verdicts, problems = sc.judge(ctx_params, out.metrics, out.verdicts, seen)
        result["errors"] += [e for e in problems if e not in result["errors"]]
        metrics["cell_wall_s"] = round(time.monotonic() - t0, 3)
        if sim:
            # CPU time, which holds on a loaded machine where wall time does not.
            # Only under sim, where the whole cell runs in this thread (on real
            # sockets the app and the peers are other processes); the thread's,
            # not the process's: the matrix writes the last cell's results from
            # another thread while this one runs.
            metrics["cell_cpu_s"] = round(time.thread_time() - c0, 4)
            metrics["sim_s"] = round(sim_s, 6)
        if out.series and "series" not in result:
            result["series"] = out.series          # time series: first repeat
        runs.append((metrics, verdicts))
        for n in list(out.notes) + ctx_notes:
            if n not in result["notes"]:
                result["notes"].append(n)
    result["load"]["end"] = _load()
    if not runs:
        return result
    names = list(dict.fromkeys(n for m, _ in runs for n in m))
    for name in names:
        values = [m.get(name) for m, _ in runs]
        result["samples"][name] = values
        result["metrics"][name] = _typical(values)
    for name in sc.verdicts:
        seen = [v.get(name) for _, v in runs]
        held = [v for v in seen if v is not None]
        result["verdicts"][name] = False if False in held else None if None in seen else True
        if len(runs) > 1 and held:
            result["metrics"][f"{name}_fraction"] = sum(held) / len(held)
    return result


def _load() -> list | None:
    """The machine's 1-, 5- and 15-minute load averages (None where unknown)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def run_matrix(cells: list[Cell], jobs: int = 1, progress=None) -> tuple[list[dict], bool]:
    """Run cells, ``jobs`` at a time; returns (finished results in plan order,
    interrupted). ``progress(i, n, result)`` is called as each finishes (the caller
    flushes it to disk there). KeyboardInterrupt stops the matrix: running cells are
    killed and dropped, finished ones are kept."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise UsageError(f"--jobs must be a whole number >= 1, got {jobs!r}")
    cores = os.cpu_count() or 1
    if jobs > cores:
        # Each cell is a runtime process plus a peer process with deadlines: more of
        # them than cores starves cells (they then end "not measured", never a pass).
        print(f"looplab: warning: --jobs {jobs} is more than this machine's {cores} cores; "
              "cells may be starved (each records the load average)", file=sys.stderr)
    results: list[dict | None] = [None] * len(cells)
    interrupted = False
    pool = ThreadPoolExecutor(max_workers=jobs)
    futures = {pool.submit(run_cell, c): i for i, c in enumerate(cells)}
    done = 0
    try:
        for fut in as_completed(futures):
            i = futures[fut]
            results[i] = fut.result()
            done += 1
            if progress:
                progress(done, len(cells), results[i])
    except KeyboardInterrupt:
        interrupted = True
        for f in futures:
            f.cancel()
        scmod.abort_running()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    if interrupted:
        # Cells that were running when the interrupt came end as killed: not results.
        finished = {i for f, i in futures.items() if results[i] is not None}
        return [results[i] for i in sorted(finished)], True
    return [r for r in results if r is not None], False
