"""Results documents: write, read, shard, merge, compare and export looplab measurements.

Every looplab run produces one JSON document, described by the JSON Schema shipped
beside this module (``results.schema.json``; ``looplab validate FILE`` checks a file)::

    {"schema": 1, "looplab": VERSION, "run_id": "...", "env": {...}, "cells": [CELL, ...],
     "scenarios": {id: {title, variants, metrics: {name: {unit, direction}}, verdicts, columns}},
     "shard": {"index", "count", "plan"}}          # the last two when they apply

A *cell* is one scenario x runtime x variant x parameter set::

    {"id", "scenario", "runtime", "variant", "params", "repeats",
     "metrics": {name: value},          # the summary: medians over the repeats
     "samples": {name: [per repeat]},   # the raw values behind each summary
     "verdicts": {name: bool}, "errors": [str, ...], "notes": [str, ...],
     "spread": {name: {"q1", "q3", "iqr", "min", "max", "n"}}}  # optional, from samples

Metric names carry their unit as a suffix (``_bytes``, ``_s``, ``_Bps``, ``_per_s``,
``_count``, ``_fraction``).

Comparing (``compare``) looks at verdicts first: a verdict that held and now fails is a
regression, the reverse a fix. Then the metrics whose scenario declares a direction (lower
or higher is better); the rest are information, as are latency maxima. A difference counts
only when it is beyond the rule's threshold (default 10 % of the median) *and* beyond the
noise: with five or more samples a side, a Mann-Whitney U test at p < 0.05; with two to
four, ranges apart by more than the threshold; with a lone sample a side, a change of at
least 50 %. Byte
differences under 64 KiB (one socket buffer) never count. Results without declared
directions (benchmark files) fall back on the unit: rates higher, times lower.

Why medians and raw samples: on these shared two-core machines a 5-s run varies ~9 %, so a
summary without its spread invites reading noise as signal. Comparisons are only meaningful
within one run or between runs on one machine; ``env`` records enough (interpreter, CPU,
library versions, allocator variables, socket buffer sizes, load) to see when they are not.

Merging (``merge``) is how sharded runs (``--shard I/N``) become one document: the union of
the cells. It refuses the same input twice, one cell id with different parameters, an
incomplete set of shards, and inputs from different machines (unless told to pool them).
When two documents hold the *same* cell id, the measurements are taken to be more repeats
of one experiment: samples are concatenated, summaries recomputed from them, verdicts AND-ed
(a failure anywhere stays a failure), errors kept, and the cell remembers which runs it came
from (``merged_from``). Each input's file, run and machine are listed in ``inputs``.
"""
from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import platform
import secrets
import shlex
import socket
import statistics
import sys
import tempfile
import time

from bench.errors import UsageError
from bench.tables import fmt, format_table

__all__ = ["VERSION", "SCHEMA", "environment", "new_document", "new_cell", "cell_id",
           "write_json", "write_text", "write_csv", "check_output", "load_json", "validate",
           "shard", "shard_info", "merge", "machine", "compare", "verdict_changes", "parse_rule",
           "parse_gates", "significant", "format_compare", "direction", "summarize", "spread",
           "to_pytest_benchmark"]

SCHEMA = 1


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("looplab")
    except Exception:  # not installed (running from a bare checkout)
        return "0.1.0"


VERSION = _version()


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
    doc.setdefault("command", shlex.join(["looplab", *sys.argv[1:]]))
    doc.update(extra)
    return doc


def _json_default(obj):
    if isinstance(obj, (set, tuple)):
        return list(obj)
    return str(obj)


_UMASK = os.umask(0o022)
os.umask(_UMASK)


def _atomic(path: str, write, mode: str = "w", newline=None) -> None:
    """Write ``path`` through a temporary file in its folder, then rename: a reader
    never sees half a file, and a failure leaves no temporary file behind."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)      # what open() would have given it
        with os.fdopen(fd, mode, newline=newline) as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_json(doc: dict, path: str) -> None:
    def dump(f):
        json.dump(doc, f, indent=1, default=_json_default, allow_nan=False)
        f.write("\n")
    _atomic(path, dump)


def write_text(path: str, text: str) -> None:
    _atomic(path, lambda f: f.write(text))


def write_bytes(path: str, data: bytes | str) -> None:
    """Text or bytes, atomically (the one writer every output goes through)."""
    if isinstance(data, str):
        write_text(path, data)
    else:
        _atomic(path, lambda f: f.write(data), mode="wb")


def check_output(path: str, what: str, folder: bool = False) -> str:
    """Check, before anything is measured, that ``path`` can be written: a folder
    (``folder=True``, created if missing) or a file (its folder created if missing).
    A problem is a one-line UsageError naming the option ``what``."""
    full = os.path.abspath(path)
    if folder:
        if os.path.exists(full) and not os.path.isdir(full):
            raise UsageError(f"{what} {path}: exists and is not a folder")
        target = full
    else:
        if os.path.isdir(full):
            raise UsageError(f"{what} {path}: is a folder; give a file name")
        target = os.path.dirname(full)
    try:
        os.makedirs(target, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=target, prefix=".looplab-write-test.")
        os.close(fd)
        os.unlink(probe)
        if not folder and os.path.exists(full) and not os.access(full, os.W_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as exc:
        raise UsageError(f"{what} {path}: cannot write there: {exc.strerror or exc}") from None
    return full


def check_document(doc, where: str = "document") -> dict:
    """Raise a one-line Usage error unless ``doc`` looks like a looplab results document."""
    if not isinstance(doc, dict) or "cells" not in doc or "schema" not in doc:
        raise UsageError(f"{where} is not a looplab results file (no 'schema' and 'cells' keys)")
    if doc["schema"] != SCHEMA:
        raise UsageError(f"{where} has results schema {doc['schema']!r}; this looplab reads schema {SCHEMA}")
    if not isinstance(doc["cells"], list):
        raise UsageError(f"{where} is not a looplab results file ('cells' is not a list)")
    for i, cell in enumerate(doc["cells"]):
        if not isinstance(cell, dict) or not isinstance(cell.get("id"), str) \
                or not isinstance(cell.get("metrics", {}), dict):
            raise UsageError(f"{where}: cell {i} is malformed (needs an 'id' and a 'metrics' dict)")
    return doc


SCHEMA_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results.schema.json")


def schema() -> dict:
    with open(SCHEMA_FILE) as f:
        return json.load(f)


def validate(doc) -> list[str]:
    """Where ``doc`` departs from the results JSON Schema (shipped as
    ``bench/results.schema.json``): one line per problem, empty when valid."""
    import jsonschema
    validator = jsonschema.Draft202012Validator(schema())
    problems = []
    for err in sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path)):
        where = "/".join(str(p) for p in err.absolute_path) or "(top)"
        problems.append(f"{where}: {err.message[:200]}")
    return problems


def load_json(path: str) -> dict:
    """Read a results document; anything else is a one-line Usage error naming the file."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path} is not a looplab results file (not JSON: {exc})") from None
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
    def rows(f):
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        w.writerows(csv_rows(doc))
    _atomic(path, rows, newline="")


# ---------------------------------------------------------------------------
# Shard and merge

def parse_shard(text: str) -> tuple[int, int]:
    index, sep, total = (text or "").partition("/")
    if not sep or not index.strip().isdigit() or not total.strip().isdigit():
        raise UsageError(f"bad shard {text!r}: expected I/N with 1 <= I <= N, e.g. 2/4")
    i, n = int(index), int(total)
    if n < 1 or not 1 <= i <= n:
        raise UsageError(f"bad shard {text!r}: expected I/N with 1 <= I <= N, e.g. 2/4")
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


def shard_info(cells_ids: list[str], spec: str) -> dict:
    """What a shard's results record so ``merge`` can tell a complete set: its index,
    the count, and a fingerprint of the whole plan it was cut from."""
    i, n = parse_shard(spec)
    plan = hashlib.sha1("\n".join(cells_ids).encode()).hexdigest()[:16]
    return {"index": i, "count": n, "plan": plan}


def machine(doc: dict) -> str:
    """The machine a document was measured on (host and CPU), or "" if unrecorded."""
    env = doc.get("env")
    envs = env if isinstance(env, list) else [env] if isinstance(env, dict) else []
    names = sorted({f"{e.get('node', 'unknown host')} ({e.get('cpu', 'unknown CPU')})"
                    for e in envs if isinstance(e, dict)})
    return ", ".join(names)


def merge(docs: list[dict], names: list[str] | None = None,
          allow_mixed_machines: bool = False) -> dict:
    """Union of the cells of ``docs`` (see the module docstring for duplicate ids).

    Refused (UsageError): the same input twice (same run id and cells), one cell id
    with different parameters, an incomplete or mixed set of shards (the message
    names the missing ones), and inputs from different machines unless
    ``allow_mixed_machines``. Each input's file, run id, machine and shard are
    recorded in ``inputs``."""
    if not docs:
        raise UsageError("merge needs at least one results file")
    names = list(names or [f"input {i + 1}" for i in range(len(docs))])
    seen: dict = {}
    for doc, name in zip(docs, names):
        check_document(doc, name)
        key = (doc.get("run_id"), json.dumps(doc.get("shard"), sort_keys=True),
               tuple(c["id"] for c in doc["cells"]))
        if key in seen:
            raise UsageError(f"merge: {name} is the same results as {seen[key]} (run "
                             f"{doc.get('run_id')}); give each input once")
        seen[key] = name
    shards = [d.get("shard") for d in docs]
    if any(shards):
        if not all(shards):
            plain = [n for n, s in zip(names, shards) if not s]
            raise UsageError(f"merge: {', '.join(plain)} is not a shard, the others are; "
                             "merge shards of one run together")
        plans = {(s["plan"], s["count"]) for s in shards}
        if len(plans) > 1:
            raise UsageError("merge: these shards come from different plans (different "
                             "scenarios, runtimes, variants or preset); merge one run's shards")
        count = shards[0]["count"]
        have = {s["index"] for s in shards}
        missing = [f"{i}/{count}" for i in range(1, count + 1) if i not in have]
        if missing:
            raise UsageError(f"merge: incomplete shard set: missing shard(s) {', '.join(missing)}")
    machines = {n: machine(d) for n, d in zip(names, docs)}
    if len({m for m in machines.values() if m}) > 1 and not allow_mixed_machines:
        listing = "; ".join(f"{n}: {m}" for n, m in machines.items())
        raise UsageError(f"merge: inputs come from different machines ({listing}); numbers from "
                         "different machines do not pool -- pass --allow-mixed-machines to merge anyway")
    cells: dict[str, dict] = {}
    origin: dict[str, str] = {}
    envs, runs, inputs = [], [], []
    scenarios: dict = {}
    for doc, name in zip(docs, names):
        run = doc.get("run_id", "")
        runs.append(run)
        inputs.append({"file": name, "run_id": run, "machine": machines[name],
                       **({"shard": doc["shard"]} if doc.get("shard") else {})})
        env = doc.get("env")
        envs.extend(env if isinstance(env, list) else [env] if env else [])
        for sid, desc in (doc.get("scenarios") or {}).items():
            scenarios.setdefault(sid, desc)
        for cell in doc["cells"]:
            cid = cell["id"]
            if cid in cells:
                if cells[cid].get("params", {}) != cell.get("params", {}):
                    raise UsageError(f"merge: cell {cid} has different parameters in {origin[cid]} "
                                     f"and {name}; these are different experiments")
                cells[cid] = _merge_cells(cells[cid], cell, cells[cid].get("run_id", ""), run)
            else:
                cells[cid] = json.loads(json.dumps(cell, default=_json_default))
                cells[cid].setdefault("run_id", run)
                origin[cid] = name
    out = {"schema": SCHEMA, "looplab": VERSION, "run_id": new_run_id(), "env": envs,
           "merged_from": runs, "inputs": inputs, "cells": list(cells.values())}
    if scenarios:
        out["scenarios"] = scenarios
    return out


# ---------------------------------------------------------------------------
# Compare: verdicts first, then metrics with a declared direction, noise-aware

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
        if desc and metric == "cell_wall_s":
            return None, True
    from bench import scenario as scmod
    sc = scmod.scenarios().get(sid)
    if sc is not None:
        m = sc.metric(metric)
        return (m.direction, m.timing) if m else (None, metric == "cell_wall_s")
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
            if va is None or vb is None:
                status = "only-old" if vb is None else "only-new"
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
    statistic), ``status`` (regression, fix, improvement, same, noise, info, only-old,
    only-new) and ``spread``; failures are the regressions of a kind in ``gates``.
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
