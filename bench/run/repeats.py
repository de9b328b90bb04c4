"""Running one cell: its repeats on its network, folded into one result.

A *cell* (``bench.run.plan``) is one scenario x runtime x variant x preset. Running a cell means calling
its scenario's ``run`` once per repeat (``bench.scenarios.api``: peers in one process, the
runtime under test alone in another) and folding the repeats into one result:
numeric metrics are medians (raw samples kept), and each verdict holds only if it
held in every repeat, with its frequency alongside (``<verdict>_fraction``). A verdict
is True, False or None ("not measured": a repeat lacked the evidence its scenario
declares, ``Scenario.judge``). A cell that crashes, hangs or measures too little is a
result with ``errors``, never the end of the matrix -- and never a pass. Each cell
records the machine's load average at its start and end (``load``).
"""
from __future__ import annotations

import os
import time

from bench import results
from bench.errors import one_line
from bench.scenarios import api as scmod
from bench.run.net import network_of

__all__ = ["run_cell", "new_result"]


def _typical(values):
    """The median of numbers (``results.summarize``); for booleans and strings, the most
    common value."""
    median = results.summarize(values)
    if median is not None:
        return median
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


def new_result(cell, **extra) -> dict:
    """The result of ``cell`` before anything ran (``skipped=WHY`` makes a skipped one)."""
    rt = cell.rt
    result = {"id": cell.id, "scenario": cell.scenario, "runtime": cell.runtime,
              "style": rt.style, "ours": rt.ours, "variant": cell.variant, "preset": cell.preset,
              "params": cell.params, "repeats": cell.repeats, "metrics": {}, "verdicts": {},
              "samples": {}, "errors": [], "notes": []}
    result.update(extra)
    return result


def run_cell(cell, trace_path: str | None = None) -> dict:
    """Run one cell (all its repeats) on its network and return its result dict.
    Never raises for a failing cell: crashes and timeouts are recorded in ``errors``."""
    rt, sc, net = cell.rt, cell.sc, network_of(cell)
    result = new_result(cell)
    reason = net.unable(cell)
    if reason:
        result["skipped"] = reason
        return result
    environment = net.environment(cell)
    if environment is not None:
        result["environment"] = environment
    whole = net.elsewhere(cell, result)
    if whole is not None:
        return whole
    runs = []
    result["load"] = {"start": _load()}
    for rep_i in range(cell.repeats):
        t0, c0 = time.monotonic(), time.thread_time()
        def make_ctx():
            return scmod.CellContext(sc, rt, cell.variant, cell.preset, dict(cell.params),
                                     trace_path)
        out, ctx_notes, ctx_params, peers_seen = None, [], dict(cell.params), {}
        try:
            with net.repeat(cell, rep_i, result, make_ctx) as (ctx, seen):
                try:
                    out = _outcome(sc, sc.run(ctx))
                finally:
                    ctx_notes, ctx_params, peers_seen = ctx.notes, ctx.params, ctx.peers_seen
                    del ctx           # inside the network's repeat (a sim cell's heap)
        except Exception as exc:      # a crashing cell is a result, not the end of the matrix
            result["errors"].append(one_line(exc))     # with where: file.py:LINE in function
        if out is None:
            continue
        # The scenario's evidence rule: too little activity, a missing deciding metric or
        # an impossible figure makes the verdicts "not measured" and adds the error.
        metrics, verdicts, problems = sc.judge(ctx_params, out.metrics, out.verdicts, peers_seen)
        result["errors"] += [e for e in problems if e not in result["errors"]]
        # a peer the app never served because it was gone: the verdicts stand, the cause
        # goes beside them
        ctx_notes = list(ctx_notes) + sc.app_gone_notes(peers_seen)
        metrics["cell_wall_s"] = round(time.monotonic() - t0, 3)
        metrics.update(net.metrics(seen, c0))
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
        # True, False or None ("not measured"): False if any repeat failed, else None if
        # any repeat lacked its evidence, else True.
        seen = [v.get(name) for _, v in runs]
        held = [v for v in seen if v is not None]
        result["verdicts"][name] = False if False in held else None if None in seen else True
        if len(runs) > 1 and held:
            result["metrics"][f"{name}_fraction"] = sum(held) / len(held)
    return result


def _load() -> list | None:
    """The machine's 1-, 5- and 15-minute load averages (None where unknown): a cell
    that starved because the machine was busy says so."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None
