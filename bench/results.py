"""Results documents: write, read, shard, merge, compare and export looplab measurements.

Every looplab run produces one JSON document (the contract in DESIGN.md, "Results")::

    {"schema": 1, "looplab": VERSION, "run_id": "...", "env": {...}, "cells": [CELL, ...]}

A *cell* is one scenario x runtime x variant x parameter set::

    {"id", "scenario", "runtime", "variant", "params", "repeats",
     "metrics": {name: value},          # the summary: medians over the repeats
     "samples": {name: [per repeat]},   # the raw values behind each summary
     "verdicts": {name: bool}, "errors": [str, ...],
     "spread": {name: {"q1", "q3", "iqr", "min", "max", "n"}},  # optional, from samples
     "details": {...}}                  # optional, free-form: how it was measured

Metric names carry their unit as a suffix (``_bytes``, ``_s``, ``_Bps``, ``_per_s``,
``_count``, ``_fraction``), and that suffix is what ``compare`` reads to know which way is
worse: a rate (``_per_s``, ``_Bps``) regresses when it falls, a time (``_s``) when it rises;
anything else (counts, sizes, fractions) is shown but never called a regression, because
"more bytes" is not worse in general.

Why medians and raw samples: on these shared two-core machines a 5-s run varies ~9 %, so a
summary without its spread invites reading noise as signal. Comparisons are only meaningful
within one run or between runs on one machine; ``env`` records enough (interpreter, CPU,
library versions, allocator variables, socket buffer sizes, load) to see when they are not.

Merging (``merge``) is how sharded runs (``--shard I/N``) become one document: the union of
the cells. When two documents hold the *same* cell id, the measurements are taken to be more
repeats of one experiment: samples are concatenated, summaries recomputed from them, verdicts
AND-ed (a failure anywhere stays a failure), errors kept, and the cell remembers which runs
it came from (``merged_from``). The environments are kept as a list, one per input, so a merge
of runs from different machines stays visible as such.
"""
from __future__ import annotations

import csv
import json
import math
import os
import platform
import secrets
import socket
import statistics
import sys
import time

__all__ = ["VERSION", "SCHEMA", "environment", "new_document", "new_cell", "cell_id",
           "write_json", "load_json", "write_csv", "shard", "merge", "compare", "parse_rule",
           "direction", "summarize", "spread", "to_pytest_benchmark", "register"]

SCHEMA = 1


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("looplab")
    except Exception:  # not installed (running from a bare checkout)
        return "0.1.0"


VERSION = _version()


def _usage(message: str) -> Exception:
    from bench.cli import Usage
    return Usage(message)


# ---------------------------------------------------------------------------
# Environment

def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _lib_version(dist: str) -> str | None:
    try:
        from importlib.metadata import version
        return version(dist)
    except Exception:
        return None


def _socket_buffers() -> dict:
    """What a fresh TCP socket gets, and what pinning 64 KiB really gives (Linux doubles
    the request to account for bookkeeping; backpressure results depend on it)."""
    out = {}
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return out
    try:
        out["default_sndbuf_bytes"] = s.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        out["default_rcvbuf_bytes"] = s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        out["pinned_request_bytes"] = 65536
        out["pinned_sndbuf_bytes"] = s.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        out["pinned_rcvbuf_bytes"] = s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    finally:
        s.close()
    for name in ("tcp_wmem", "tcp_rmem"):
        try:
            with open(f"/proc/sys/net/ipv4/{name}") as f:
                out[name] = [int(x) for x in f.read().split()]
        except (OSError, ValueError):
            pass
    return out


def environment() -> dict:
    """Everything about this machine and interpreter that changes a number."""
    try:
        load = list(os.getloadavg())
    except OSError:
        load = None
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "python_build": " ".join(platform.python_build()),
        "executable": sys.executable,
        "platform": platform.platform(),
        "kernel": platform.release(),
        "node": platform.node(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity_count": affinity,
        "libraries": {name: _lib_version(name) for name in
                      ("looplab", "trio", "curio", "uvloop", "pytest-benchmark")},
        # The allocator trap (BENCHMARKING.md): glibc's mmap threshold changed asyncio's
        # ping-pong 3.3x, so every result says what the allocator was told.
        "allocator_env": {k: v for k, v in os.environ.items()
                          if k.startswith("MALLOC_") or k in ("PYTHONMALLOC", "LD_PRELOAD")},
        "socket_buffers": _socket_buffers(),
        "loadavg": load,
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


# ---------------------------------------------------------------------------
# Documents and cells

def cell_id(scenario: str, runtime: str, variant: str, params: dict | None = None) -> str:
    """``scenario/runtime/variant[/k=v,...]`` with params sorted, so equal cells from
    different runs get equal ids (that is what compare and merge match on)."""
    base = f"{scenario}/{runtime}/{variant}"
    if params:
        base += "/" + ",".join(f"{k}={params[k]}" for k in sorted(params))
    return base


def summarize(values: list):
    """The median of the numeric samples (None when there are none)."""
    nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(v)]
    return statistics.median(nums) if nums else None


def _quantile(sorted_vals: list, q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if len(sorted_vals) == 1:
        return sorted_vals[0]
    pos = (len(sorted_vals) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def spread(values: list) -> dict | None:
    """Quartiles, IQR and range of numeric samples."""
    nums = sorted(v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)
                  and math.isfinite(v))
    if not nums:
        return None
    q1, q3 = _quantile(nums, 0.25), _quantile(nums, 0.75)
    return {"q1": q1, "q3": q3, "iqr": q3 - q1, "min": nums[0], "max": nums[-1], "n": len(nums)}


def new_cell(scenario: str, runtime: str, variant: str, params: dict | None = None,
             samples: dict | None = None, metrics: dict | None = None,
             verdicts: dict | None = None, errors: list | None = None, **extra) -> dict:
    """A cell whose summary metrics are the medians of ``samples`` (plus any ``metrics``
    given directly, which win). ``extra`` keys are kept as they are."""
    params = dict(params or {})
    samples = {k: list(v) for k, v in (samples or {}).items()}
    summary = {}
    spreads = {}
    for name, vals in samples.items():
        summary[name] = summarize(vals)
        s = spread(vals)
        if s is not None and len(vals) > 1:
            spreads[name] = s
    summary.update(metrics or {})
    cell = {
        "id": cell_id(scenario, runtime, variant, params),
        "scenario": scenario, "runtime": runtime, "variant": variant, "params": params,
        "repeats": max((len(v) for v in samples.values()), default=1 if summary else 0),
        "metrics": summary, "samples": samples,
        "verdicts": dict(verdicts or {}), "errors": list(errors or []),
    }
    if spreads:
        cell["spread"] = spreads
    cell.update(extra)
    return cell


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


def new_document(cells: list, run_id: str | None = None, env: dict | None = None, **extra) -> dict:
    """A results document. ``extra`` adds top-level keys (e.g. ``config``)."""
    doc = {"schema": SCHEMA, "looplab": VERSION, "run_id": run_id or new_run_id(),
           "env": env if env is not None else environment(), "cells": list(cells)}
    doc.update(extra)
    return doc


def _json_default(obj):
    if isinstance(obj, (set, tuple)):
        return list(obj)
    return str(obj)


def write_json(doc: dict, path: str) -> None:
    """Write atomically (a reader never sees half a file)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, default=_json_default, allow_nan=False)
        f.write("\n")
    os.replace(tmp, path)


def check_document(doc, where: str = "document") -> dict:
    """Raise a one-line Usage error unless ``doc`` looks like a looplab results document."""
    if not isinstance(doc, dict) or "cells" not in doc or "schema" not in doc:
        raise _usage(f"{where} is not a looplab results file (no 'schema' and 'cells' keys)")
    if doc["schema"] != SCHEMA:
        raise _usage(f"{where} has results schema {doc['schema']!r}; this looplab reads schema {SCHEMA}")
    if not isinstance(doc["cells"], list):
        raise _usage(f"{where} is not a looplab results file ('cells' is not a list)")
    for i, cell in enumerate(doc["cells"]):
        if not isinstance(cell, dict) or not isinstance(cell.get("id"), str) \
                or not isinstance(cell.get("metrics", {}), dict):
            raise _usage(f"{where}: cell {i} is malformed (needs an 'id' and a 'metrics' dict)")
    return doc


def load_json(path: str) -> dict:
    """Read a results document; anything else is a one-line Usage error naming the file."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as exc:
        raise _usage(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _usage(f"{path} is not a looplab results file (not JSON: {exc})") from None
    return check_document(doc, path)


CSV_COLUMNS = ("run_id", "cell", "scenario", "runtime", "variant", "params", "metric", "value")


def _csv_value(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return value


def csv_rows(doc: dict) -> list[dict]:
    """One row per cell x metric; verdicts follow as ``verdict:NAME`` rows."""
    run_id = doc.get("run_id", "")
    rows = []
    for cell in doc["cells"]:
        base = {"run_id": cell.get("run_id", run_id), "cell": cell["id"],
                "scenario": cell.get("scenario", ""), "runtime": cell.get("runtime", ""),
                "variant": cell.get("variant", ""),
                "params": json.dumps(cell.get("params", {}), sort_keys=True)}
        for name, value in cell.get("metrics", {}).items():
            rows.append({**base, "metric": name, "value": _csv_value(value)})
        for name, value in cell.get("verdicts", {}).items():
            rows.append({**base, "metric": f"verdict:{name}", "value": _csv_value(value)})
    return rows


def write_csv(doc: dict, path: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        w.writerows(csv_rows(doc))


# ---------------------------------------------------------------------------
# Shard and merge

def parse_shard(text: str) -> tuple[int, int]:
    index, sep, total = (text or "").partition("/")
    if not sep or not index.strip().isdigit() or not total.strip().isdigit():
        raise _usage(f"bad shard {text!r}: expected I/N with 1 <= I <= N, e.g. 2/4")
    i, n = int(index), int(total)
    if n < 1 or not 1 <= i <= n:
        raise _usage(f"bad shard {text!r}: expected I/N with 1 <= I <= N, e.g. 2/4")
    return i, n


def shard(items, spec: str | None):
    """The I-th of N interleaved slices (``items[I-1::N]``); ``None`` keeps everything.
    Interleaving (not blocks) keeps each shard's mix of runtimes and sizes similar."""
    items = list(items)
    if spec is None:
        return items
    i, n = parse_shard(spec)
    return items[i - 1::n]


def _merge_cells(a: dict, b: dict, run_a: str, run_b: str) -> dict:
    out = json.loads(json.dumps(a, default=_json_default))   # deep copy, JSON-shaped
    out.setdefault("merged_from", [a.get("run_id", run_a)])
    out["merged_from"].append(b.get("run_id", run_b))
    samples_a, samples_b = a.get("samples", {}) or {}, b.get("samples", {}) or {}
    names = list(dict.fromkeys([*a.get("metrics", {}), *b.get("metrics", {}),
                                *samples_a, *samples_b]))
    samples, metrics, spreads, errors = {}, {}, {}, list(a.get("errors", []))
    for name in names:
        if name in samples_a or name in samples_b:
            # a side without samples contributes its summary as one sample
            va = samples_a.get(name, [a["metrics"][name]] if name in a.get("metrics", {}) else [])
            vb = samples_b.get(name, [b["metrics"][name]] if name in b.get("metrics", {}) else [])
            samples[name] = list(va) + list(vb)
            metrics[name] = summarize(samples[name])
            s = spread(samples[name])
            if s is not None and len(samples[name]) > 1:
                spreads[name] = s
            continue
        ma, mb = a.get("metrics", {}).get(name), b.get("metrics", {}).get(name)
        if name not in a.get("metrics", {}):
            metrics[name] = mb
        elif name not in b.get("metrics", {}) or ma == mb:
            metrics[name] = ma
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (ma, mb)):
            samples[name] = [ma, mb]
            metrics[name] = summarize([ma, mb])
        else:
            metrics[name] = ma
            errors.append(f"merge: {name} differs between runs ({ma!r} vs {mb!r}); kept the first")
    out["samples"], out["metrics"] = samples, metrics
    if spreads:
        out["spread"] = spreads
    else:
        out.pop("spread", None)
    verdicts = dict(a.get("verdicts", {}))
    for name, value in (b.get("verdicts", {}) or {}).items():
        verdicts[name] = bool(verdicts.get(name, True)) and bool(value)
    out["verdicts"] = verdicts
    out["errors"] = errors + list(b.get("errors", []))
    out["repeats"] = int(a.get("repeats", 0) or 0) + int(b.get("repeats", 0) or 0)
    return out


def merge(docs: list[dict]) -> dict:
    """Union of the cells of ``docs`` (see the module docstring for duplicate ids)."""
    if not docs:
        raise _usage("merge needs at least one results file")
    cells: dict[str, dict] = {}
    origin: dict[str, str] = {}
    envs, runs = [], []
    for doc in docs:
        check_document(doc)
        run = doc.get("run_id", "")
        runs.append(run)
        env = doc.get("env")
        envs.extend(env if isinstance(env, list) else [env] if env else [])
        for cell in doc["cells"]:
            cid = cell["id"]
            if cid in cells:
                cells[cid] = _merge_cells(cells[cid], cell, origin[cid], run)
            else:
                cells[cid] = json.loads(json.dumps(cell, default=_json_default))
                cells[cid].setdefault("run_id", run)
                origin[cid] = run
    return {"schema": SCHEMA, "looplab": VERSION, "run_id": new_run_id(), "env": envs,
            "merged_from": runs, "cells": list(cells.values())}


# ---------------------------------------------------------------------------
# Compare

_STATS = {"median": statistics.median, "mean": statistics.fmean, "min": min, "max": max}


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
        raise _usage(f"bad rule {rule!r}: expected STAT:N% with STAT one of "
                     f"{', '.join(_STATS)}, e.g. median:10%")
    try:
        value = float(thr[:-1]) / 100.0
    except ValueError:
        raise _usage(f"bad rule {rule!r}: {thr!r} is not a percentage") from None
    if not (value >= 0 and math.isfinite(value)):
        raise _usage(f"bad rule {rule!r}: the threshold must be a non-negative percentage")
    return stat, value


def direction(metric: str) -> str | None:
    """"higher" if bigger is better (rates), "lower" for times, None when the unit
    doesn't say (sizes, counts, fractions)."""
    if metric.endswith("_per_s") or metric.endswith("_Bps"):
        return "higher"
    if metric.endswith("_s"):
        return "lower"
    return None


def _value(cell: dict, metric: str, stat: str):
    samples = [v for v in (cell.get("samples", {}) or {}).get(metric, [])
               if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
    if samples:
        return _STATS[stat](samples)
    value = cell.get("metrics", {}).get(metric)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    return None


def compare(old: dict, new: dict, rule: str = "median:10%", metrics=None) -> tuple[list, list]:
    """Match cells by id and metrics by name. Returns ``(rows, regressions)``; each row is
    ``{"cell", "metric", "old", "new", "change", "direction", "status"}`` with status one of
    regression | improvement | same | info (no direction or not numeric) | only-old | only-new.
    ``change`` is (new - old) / old."""
    stat, threshold = parse_rule(rule)
    check_document(old, "old")
    check_document(new, "new")
    wanted = set(metrics) if metrics else None
    old_cells = {c["id"]: c for c in old["cells"]}
    new_cells = {c["id"]: c for c in new["cells"]}
    rows = []
    for cid in list(dict.fromkeys([*old_cells, *new_cells])):
        if cid not in new_cells or cid not in old_cells:
            rows.append({"cell": cid, "metric": "", "old": None, "new": None, "change": None,
                         "direction": None,
                         "status": "only-old" if cid not in new_cells else "only-new"})
            continue
        a, b = old_cells[cid], new_cells[cid]
        for name in dict.fromkeys([*a.get("metrics", {}), *b.get("metrics", {})]):
            if wanted is not None and name not in wanted:
                continue
            va, vb = _value(a, name, stat), _value(b, name, stat)
            d = direction(name)
            change = None
            if va is not None and vb is not None and va != 0:
                change = (vb - va) / abs(va)
            elif va == 0 and vb == 0:
                change = 0.0
            if d is None or change is None:
                status = "info"
            elif (d == "higher" and change < -threshold) or (d == "lower" and change > threshold):
                status = "regression"
            elif (d == "higher" and change > threshold) or (d == "lower" and change < -threshold):
                status = "improvement"
            else:
                status = "same"
            rows.append({"cell": cid, "metric": name,
                         "old": va if va is not None else a.get("metrics", {}).get(name),
                         "new": vb if vb is not None else b.get("metrics", {}).get(name),
                         "change": change, "direction": d, "status": status})
    regressions = [r for r in rows if r["status"] == "regression"]
    return rows, regressions


# ---------------------------------------------------------------------------
# pytest-benchmark export

def _pb_stats(times: list[float]) -> dict:
    data = sorted(times)
    n = len(data)
    mean = statistics.fmean(data)
    stddev = statistics.stdev(data) if n > 1 else 0.0
    q1, q3 = _quantile(data, 0.25), _quantile(data, 0.75)
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
            "version": _lib_version("pytest-benchmark") or "5"}


# ---------------------------------------------------------------------------
# Command line: `looplab compare` and `looplab merge`

def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 1:
            return f"{value:.3g}"
        return f"{value:.3g}"
    return str(value)


def format_compare(rows: list[dict], show_all: bool = False) -> str:
    shown = [r for r in rows if show_all or r["status"] not in ("info",)]
    if not shown:
        return "no comparable metrics (use --all to see every row)"
    head = ("cell", "metric", "old", "new", "change", "status")
    table = [head]
    for r in shown:
        change = "-" if r["change"] is None else f"{r['change'] * 100:+.1f}%"
        table.append((r["cell"], r["metric"], _fmt(r["old"]), _fmt(r["new"]), change, r["status"]))
    widths = [max(len(str(row[i])) for row in table) for i in range(len(head))]
    lines = ["  ".join(str(v).ljust(widths[i]) if i < 2 else str(v).rjust(widths[i])
                       for i, v in enumerate(row)).rstrip() for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def cmd_compare(args) -> int:
    old, new = load_json(args.old), load_json(args.new)
    rule = args.fail or args.rule
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()] if args.metrics else None
    rows, regressions = compare(old, new, rule, metrics)
    print(format_compare(rows, args.all))
    stat, thr = parse_rule(rule)
    counts = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    print(f"\nrule {stat}:{thr * 100:g}%: {summary or 'nothing to compare'}")
    if args.fail and regressions:
        print(f"looplab compare: {len(regressions)} regression(s) beyond {stat}:{thr * 100:g}%",
              file=sys.stderr)
        return 1
    return 0


def cmd_merge(args) -> int:
    docs = [load_json(p) for p in args.files]
    doc = merge(docs)
    if not (args.out or args.csv or args.pytest_benchmark):
        json.dump(doc, sys.stdout, indent=1, default=_json_default)
        sys.stdout.write("\n")
        return 0
    if args.out:
        write_json(doc, args.out)
    if args.csv:
        write_csv(doc, args.csv)
    if args.pytest_benchmark:
        write_json(to_pytest_benchmark(doc), args.pytest_benchmark)
    print(f"merged {len(docs)} file(s): {len(doc['cells'])} cells", file=sys.stderr)
    return 0


def register(subparsers) -> None:
    """Add the ``compare`` and ``merge`` verbs to the looplab command line."""
    cp = subparsers.add_parser(
        "compare", help="compare two results files, cell by cell",
        description="Match cells by id and metrics by name; a rate (_per_s, _Bps) regresses "
                    "when it falls, a time (_s) when it rises, by more than the rule's "
                    "threshold. Other metrics are shown with --all but never fail. "
                    "Exit 1 with --fail when a regression is found.")
    cp.add_argument("old", help="baseline results JSON")
    cp.add_argument("new", help="results JSON to check")
    cp.add_argument("--fail", metavar="RULE", default=None,
                    help="exit 1 on a regression beyond RULE, e.g. median:10%% "
                         "(statistic over the samples: median, mean, min or max)")
    cp.add_argument("--rule", default="median:10%",
                    help="rule used to mark rows without failing (default median:10%%)")
    cp.add_argument("--metrics", default=None, help="comma list of metric names to compare")
    cp.add_argument("--all", action="store_true", help="also show rows without a direction")
    cp.set_defaults(fn=cmd_compare)

    mp = subparsers.add_parser(
        "merge", help="merge results files (e.g. shards) into one",
        description="Union of the cells. The same cell id in several files is taken as more "
                    "repeats of one experiment: samples are concatenated and the medians "
                    "recomputed, verdicts AND-ed; the environments are kept as a list. "
                    "Without an output option the merged JSON goes to stdout.")
    mp.add_argument("files", nargs="+", help="results JSON files")
    mp.add_argument("--out", "-o", default=None, metavar="PATH", help="write the merged JSON here")
    mp.add_argument("--csv", default=None, metavar="PATH", help="also write CSV rows here")
    mp.add_argument("--pytest-benchmark", default=None, metavar="PATH",
                    help="also write pytest-benchmark JSON (for `pytest-benchmark compare`)")
    mp.set_defaults(fn=cmd_merge)
