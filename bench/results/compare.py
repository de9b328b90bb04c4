"""Comparing two results documents, and exporting one for pytest-benchmark.

Comparing (``compare``) looks at verdicts first: a verdict that held and now fails is a
regression, the reverse a fix. Then the metrics whose scenario declares a direction (lower
or higher is better); the rest are information, as are latency maxima. A difference counts
only when it is beyond the rule's threshold (default 10 % of the median) *and* beyond the
noise: with five or more samples a side, a Mann-Whitney U test at p < 0.05; with two to
four, ranges apart by more than the threshold; with a lone sample a side, a change of at
least 50 % -- except for a timing (a wall-clock metric), which with one sample has no
verdict at all (status ``one-sample``: shown, never a regression or an improvement).
Byte differences under 64 KiB (one socket buffer) never count. Results without declared
directions (benchmark files) fall back on the unit: rates higher, times lower.
"""
from __future__ import annotations

import math
import platform
import statistics
import time

from bench.errors import UsageError
from bench.results import check_document, lib_version, quantile
from bench.results.tables import fmt, format_table

__all__ = ["compare", "verdict_changes", "parse_rule", "parse_gates", "significant",
           "mann_whitney_p", "format_compare", "direction", "to_pytest_benchmark", "GATES"]


# Verdicts first, then metrics with a declared direction, noise-aware

_STATS = {"median": statistics.median, "mean": statistics.fmean, "min": min, "max": max}
GATES = ("verdict", "behaviour", "timing")
ALPHA = 0.05                 # Mann-Whitney's two-sided significance level
LONE_SAMPLE_CHANGE = 0.5     # with one sample a side, only a change this large counts
BYTES_FLOOR = 64 * 1024      # byte differences below one socket buffer never count


def parse_rule(rule: str) -> tuple[str, float]:
    """``median:10%`` -> ("median", 0.10). The statistic is taken over a cell's samples
    (its summary value when it has none): median, mean, min or max."""
    text = (rule or "").strip()
    stat, sep, thr = text.partition(":")
    if not sep:
        stat, thr = "median", text
    stat = stat.strip().lower()
    thr = thr.strip()
    if stat not in _STATS or not thr.endswith("%"):
        raise UsageError(f"bad rule {rule!r}: expected STAT:N% with STAT one of "
                         f"{', '.join(_STATS)}, e.g. median:10%")
    try:
        value = float(thr[:-1]) / 100.0
    except ValueError:
        raise UsageError(f"bad rule {rule!r}: {thr!r} is not a percentage") from None
    if not (value >= 0 and math.isfinite(value)):
        raise UsageError(f"bad rule {rule!r}: the threshold must be a non-negative percentage")
    return stat, value


def parse_gates(text: str | None) -> tuple[set, str | None]:
    """``--fail`` -> (gates, rule). Gates: a comma list of verdict, behaviour, timing or
    all; a rule such as ``median:10%`` (the older spelling) means all gates with it."""
    if not text:
        return set(), None
    if ":" in text or text.strip().endswith("%"):
        parse_rule(text)
        return set(GATES), text
    gates = set()
    for g in (t.strip() for t in text.split(",") if t.strip()):
        if g == "all":
            gates |= set(GATES)
        elif g in GATES:
            gates.add(g)
        else:
            raise UsageError(f"bad --fail {text!r}: choose from {', '.join(GATES)}, all "
                             "(comma-separated), or a rule such as median:10%")
    return gates, None


def direction(metric: str) -> str | None:
    """The direction a metric's unit implies, for results that do not declare one
    (benchmark files): rates higher, times lower, maxima and everything else none."""
    if "max" in metric.split("_"):
        return None
    if metric.endswith("_per_s") or metric.endswith("_Bps"):
        return "higher"
    if metric.endswith("_s"):
        return "lower"
    return None


def _declared(old: dict, new: dict, cell: dict, metric: str) -> tuple[str | None, bool]:
    """(direction, timing) of ``metric`` in ``cell``'s scenario: as the documents
    declare it, else as the registered scenario does, else by its unit (timing)."""
    sid = cell.get("scenario")
    for doc in (new, old):
        desc = (doc.get("scenarios") or {}).get(sid)
        if desc and metric in desc.get("metrics", {}):
            m = desc["metrics"][metric]
            return m.get("direction"), bool(m.get("timing"))
        if desc and metric.endswith("_fraction") and metric[:-9] in desc.get("verdicts", {}):
            return "higher", False
        if desc and metric in ("cell_wall_s", "cell_cpu_s"):
            return None, True
    from bench.scenarios import api as scmod
    sc = scmod.scenarios().get(sid)
    if sc is not None:
        m = sc.metric(metric)
        return (m.direction, m.timing) if m else (None, metric in ("cell_wall_s", "cell_cpu_s"))
    return direction(metric), True


def _samples(cell: dict, metric: str) -> list:
    vals = (cell.get("samples", {}) or {}).get(metric)
    if not vals:
        vals = [cell.get("metrics", {}).get(metric)]
    return [v for v in vals if isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(v)]


def mann_whitney_p(a: list, b: list) -> float:
    """Two-sided p-value of the Mann-Whitney U test (normal approximation with a tie
    correction and continuity correction): is one sample set stochastically larger?"""
    n1, n2 = len(a), len(b)
    pooled = sorted([(v, 0) for v in a] + [(v, 1) for v in b])
    ranks = [0.0] * len(pooled)
    i, ties = 0, 0.0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        for k in range(i, j + 1):
            ranks[k] = (i + j) / 2 + 1
        t = j - i + 1
        ties += t ** 3 - t
        i = j + 1
    r1 = sum(r for r, (_, side) in zip(ranks, pooled) if side == 0)
    u = r1 - n1 * (n1 + 1) / 2
    n = n1 + n2
    var = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1)))
    if var <= 0:
        return 1.0
    z = (abs(u - n1 * n2 / 2) - 0.5) / math.sqrt(var)
    return max(0.0, min(1.0, math.erfc(z / math.sqrt(2))))


def significant(a: list, b: list, margin: float = 0.0) -> tuple[bool, str]:
    """Is the difference between sample sets ``a`` and ``b`` more than noise?
    Five or more samples a side: Mann-Whitney U, p < 0.05. Two to four: too few for a
    rank test to reach 0.05, so the ranges must be apart by more than ``margin`` (the
    rule's threshold, in the metric's units). One sample on a side: no spread to judge
    by; it counts only when the change is large (``LONE_SAMPLE_CHANGE``, the caller's
    check)."""
    if len(a) >= 5 and len(b) >= 5:
        p = mann_whitney_p(a, b)
        return p < ALPHA, f"Mann-Whitney p={p:.3f}"
    if len(a) >= 2 and len(b) >= 2:
        gap = max(min(b) - max(a), min(a) - max(b))
        apart = gap > margin
        return apart, "ranges apart" if apart else "ranges too close"
    return True, "one sample"


def _spread_text(a: list, b: list) -> str:
    def r(v):
        return fmt("", min(v)) if len(v) == 1 else f"{fmt('', min(v))}..{fmt('', max(v))}"
    return f"n={len(a)}/{len(b)}, {r(a)} vs {r(b)}"


def verdict_changes(old: dict, new: dict) -> list[dict]:
    """One row per verdict of each cell in both: regression (held, now fails), fix
    (failed, now holds) or same."""
    old_cells = {c["id"]: c for c in old["cells"]}
    rows = []
    for b in new["cells"]:
        a = old_cells.get(b["id"])
        if a is None:
            continue
        for name in dict.fromkeys([*a.get("verdicts", {}), *b.get("verdicts", {})]):
            va, vb = a.get("verdicts", {}).get(name), b.get("verdicts", {}).get(name)
            if name not in b.get("verdicts", {}) or name not in a.get("verdicts", {}):
                status = "only-old" if name not in b.get("verdicts", {}) else "only-new"
            elif va is None or vb is None:     # no evidence on one side: neither a fix nor a regression
                status = "not-measured"
            else:
                status = "same" if bool(va) == bool(vb) else ("regression" if va else "fix")
            rows.append({"cell": b["id"], "metric": f"verdict:{name}", "kind": "verdict",
                         "old": va, "new": vb, "change": None, "direction": "higher",
                         "status": status, "spread": ""})
    return rows


def compare(old: dict, new: dict, rule: str = "median:10%", metrics=None,
            gates=GATES) -> tuple[list, list]:
    """Match cells by id; compare verdicts first, then the metrics with a declared
    direction. Returns ``(rows, failures)``: rows carry ``cell, metric, kind`` (verdict,
    behaviour, timing), ``old, new, change`` ((new - old) / old of the rule's
    statistic), ``status`` (regression, fix, improvement, same, noise, one-sample: a
    timing with a lone sample a side, info, only-old, only-new, not-measured: a verdict
    without evidence on one side) and ``spread``; failures are the regressions of a kind in ``gates``.
    Nothing in common, or a ``metrics`` name found nowhere, is a UsageError."""
    stat, threshold = parse_rule(rule)
    check_document(old, "old")
    check_document(new, "new")
    old_cells = {c["id"]: c for c in old["cells"]}
    new_cells = {c["id"]: c for c in new["cells"]}
    common = [cid for cid in new_cells if cid in old_cells]
    if not common:
        raise UsageError("nothing to compare: no cell id is in both files (are they results "
                         "of the same scenarios, runtimes, variants and presets?)")
    wanted = set(metrics) if metrics else None
    if wanted:
        found = {n for cid in common for c in (old_cells[cid], new_cells[cid])
                 for n in [*c.get("metrics", {}), *(f"verdict:{v}" for v in c.get("verdicts", {}))]}
        unknown = sorted(wanted - found - {n.split(":", 1)[-1] for n in found if n.startswith("verdict:")})
        if unknown:
            raise UsageError(f"--metrics: no cell has {', '.join(unknown)}")
    rows = []
    for cid in dict.fromkeys([*old_cells, *new_cells]):
        if cid not in common:
            rows.append({"cell": cid, "metric": "", "kind": "", "old": None, "new": None,
                         "change": None, "direction": None, "spread": "",
                         "status": "only-old" if cid not in new_cells else "only-new"})
    for r in verdict_changes(old, new):
        if wanted is None or r["metric"] in wanted or r["metric"][8:] in wanted:
            rows.append(r)
    for cid in common:
        a, b = old_cells[cid], new_cells[cid]
        for name in dict.fromkeys([*a.get("metrics", {}), *b.get("metrics", {})]):
            if wanted is not None and name not in wanted:
                continue
            d, timing = _declared(old, new, b, name)
            sa, sb = _samples(a, name), _samples(b, name)
            row = {"cell": cid, "metric": name, "kind": "timing" if timing else "behaviour",
                   "old": a.get("metrics", {}).get(name), "new": b.get("metrics", {}).get(name),
                   "change": None, "direction": d, "spread": "", "status": "info"}
            rows.append(row)
            if not sa or not sb:
                continue
            va, vb = _STATS[stat](sa), _STATS[stat](sb)
            row["old"], row["new"] = va, vb
            row["spread"] = _spread_text(sa, sb)
            if va != 0:
                row["change"] = (vb - va) / abs(va)
            elif vb == 0:
                row["change"] = 0.0
            else:
                row["change"] = math.copysign(math.inf, vb)
            if d is None:
                continue
            change = row["change"]
            small = name.endswith("_bytes") and abs(vb - va) < BYTES_FLOOR
            needed = max(threshold, LONE_SAMPLE_CHANGE) if min(len(sa), len(sb)) < 2 else threshold
            if small or abs(change) <= needed:
                row["status"] = "same"
                continue
            if timing and min(len(sa), len(sb)) < 2:
                # a lone wall-clock timing has no spread to judge noise by: shown, never
                # a regression or an improvement (the gate needs --repeat 2 or more)
                row["status"] = "one-sample"
                row["spread"] += ", one sample: no verdict"
                continue
            sig, why = significant(sa, sb, threshold * abs(va))
            row["spread"] += f", {why}"
            if not sig:
                row["status"] = "noise"
                continue
            worse = change < 0 if d == "higher" else change > 0
            row["status"] = "regression" if worse else "improvement"
    failures = [r for r in rows if r["status"] == "regression" and r["kind"] in set(gates)]
    return rows, failures


def format_compare(rows: list[dict], show_all: bool = False) -> str:
    """Verdict changes and metric regressions/improvements (every row with --all)."""
    quiet = ("info", "same", "noise")
    shown = [r for r in rows if show_all or r["status"] not in quiet]
    if not shown:
        return "no verdict changed and no metric moved beyond the rule (use --all to see every row)"
    table = []
    for r in shown:
        change = "-" if r["change"] is None else (
            f"{r['change'] * 100:+.1f}%" if math.isfinite(r["change"]) else "from 0")
        table.append([r["cell"], r["metric"], fmt(r["metric"], r["old"]), fmt(r["metric"], r["new"]),
                      change, r["status"], r.get("spread", "")])
    return format_table(["cell", "metric", "old", "new", "change", "status", "spread"], table,
                        align="llrrrll")


# ---------------------------------------------------------------------------
# pytest-benchmark export

def _pb_stats(times: list[float]) -> dict:
    data = sorted(times)
    n = len(data)
    mean = statistics.fmean(data)
    stddev = statistics.stdev(data) if n > 1 else 0.0
    q1, q3 = quantile(data, 0.25), quantile(data, 0.75)
    iqr = q3 - q1
    lo_fence, hi_fence = q1 - 1.5 * iqr, q3 + 1.5 * iqr
    inside = [v for v in data if lo_fence <= v <= hi_fence] or data
    iqr_out = sum(1 for v in data if v < lo_fence or v > hi_fence)
    sd_out = sum(1 for v in data if v < mean - stddev or v > mean + stddev)
    return {"min": data[0], "max": data[-1], "mean": mean, "stddev": stddev, "rounds": n,
            "median": statistics.median(data), "iqr": iqr, "q1": q1, "q3": q3,
            "iqr_outliers": iqr_out, "stddev_outliers": sd_out,
            "outliers": f"{sd_out};{iqr_out}", "ld15iqr": inside[0], "hd15iqr": inside[-1],
            "ops": (1.0 / mean) if mean > 0 else 0.0, "total": sum(data),
            "data": list(times), "iterations": 1}


def to_pytest_benchmark(doc: dict) -> dict:
    """The document in pytest-benchmark's JSON shape, so ``pytest-benchmark compare FILE``
    (and its histograms) can read it. pytest-benchmark measures *time per operation*, so a
    rate sample r (``*_per_s``) becomes 1/r seconds and a time (``*_s``) stays as it is;
    one benchmark per cell x such metric, named ``CELL_ID:METRIC``, grouped by scenario
    and parameters. Byte rates (``_Bps``) are left out: they restate ``requests_per_s``."""
    check_document(doc)
    env = doc.get("env")
    env = env[0] if isinstance(env, list) and env else env if isinstance(env, dict) else {}
    benches = []
    for cell in doc["cells"]:
        samples = cell.get("samples", {}) or {}
        for name, value in cell.get("metrics", {}).items():
            d = direction(name)
            if d is None or name.endswith("_Bps"):
                continue
            vals = [v for v in samples.get(name, [value])
                    if isinstance(v, (int, float)) and not isinstance(v, bool)
                    and math.isfinite(v) and v > 0]
            if not vals:
                continue
            times = [1.0 / v for v in vals] if d == "higher" else list(vals)
            params = dict(cell.get("params", {}))
            group = cell.get("scenario", "") + (
                " " + ",".join(f"{k}={params[k]}" for k in sorted(params)) if params else "")
            if name not in ("requests_per_s", "ops_per_s"):
                group += f" [{name}]"
            benches.append({
                "group": group, "name": f"{cell['id']}:{name}",
                "fullname": f"looplab::{cell['id']}:{name}",
                "params": {**params, "runtime": cell.get("runtime"), "variant": cell.get("variant")},
                "param": cell.get("runtime"),
                "extra_info": {"metric": name, "unit": "s" if d == "lower" else f"1/{name}",
                               "looplab_value": cell["metrics"].get(name)},
                "options": {"timer": "looplab", "min_rounds": 1, "max_time": None,
                            "min_time": None, "warmup": True},
                "stats": _pb_stats(times),
            })
    libs = env.get("libraries", {}) if isinstance(env, dict) else {}
    py = env.get("python", platform.python_version()) if isinstance(env, dict) else ""
    machine_info = {
        "node": env.get("node", ""), "processor": platform.processor(),
        "machine": platform.machine(), "python_compiler": platform.python_compiler(),
        "python_implementation": env.get("implementation", platform.python_implementation()),
        "python_implementation_version": py, "python_version": py,
        "python_build": env.get("python_build", "").split(" ", 1) if env.get("python_build") else [],
        "release": env.get("kernel", platform.release()), "system": platform.system(),
        "cpu": {"brand_raw": env.get("cpu", ""), "count": env.get("cpu_count")},
        "looplab": {"run_id": doc.get("run_id"), "libraries": libs},
    }
    return {"machine_info": machine_info,
            "commit_info": {"id": doc.get("run_id", ""), "time": env.get("time_utc", ""),
                            "project": "looplab", "dirty": False, "branch": ""},
            "benchmarks": benches,
            "datetime": env.get("time_utc") or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "version": lib_version("pytest-benchmark") or "5"}
