"""Results documents: write, read, check, shard and merge looplab measurements.

Every looplab run produces one JSON document, described by the JSON Schema shipped
beside this module (``schema.json``; ``looplab validate FILE`` checks a file)::

    {"schema": 2, "looplab": VERSION, "run_id": "...", "env": {...}, "cells": [CELL, ...],
     "scenarios": {id: {title, variants, metrics: {name: {unit, direction}}, verdicts, columns}},
     "shard": {"index", "count", "plan"}}          # the last two when they apply

A *cell* is one scenario x runtime x variant x parameter set::

    {"id", "scenario", "runtime", "variant", "params", "repeats",
     "metrics": {name: value},          # the summary: medians over the repeats
     "samples": {name: [per repeat]},   # the raw values behind each summary
     "verdicts": {name: true | false | null},   # null: not measured (see errors)
     "errors": [str, ...], "notes": [str, ...],
     "load": {"start": [1, 5, 15 min], "end": [...]},   # the machine's load averages
     "spread": {name: {"q1", "q3", "iqr", "min", "max", "n"}}}  # optional, from samples

Schema 2 (this one) added the verdict ``null``: "not measured", a cell without the
evidence its scenario declares (bench.scenarios.api.Scenario.judge); such a cell also has an
error saying what was missing. Schema 1 documents (booleans only) are still read.

Metric names carry their unit as a suffix (``_bytes``, ``_s``, ``_Bps``, ``_per_s``,
``_count``, ``_fraction``).

Why medians and raw samples: on these shared two-core machines a 5-s run varies ~9 %, so a
summary without its spread invites reading noise as signal. Comparisons are only meaningful
within one run or between runs on one machine; ``env`` records enough (interpreter, CPU,
library versions, allocator variables, socket buffer sizes, load) to see when they are not.

Comparing two documents and the pytest-benchmark export are in ``bench.results.compare``.

Merging (``merge``) is how sharded runs (``--shard I/N``) become one document: the union of
the cells. It refuses the same input twice, one cell id with different parameters, an
incomplete set of shards, and inputs from different machines (unless told to pool them).
When two documents hold the *same* cell id, the measurements are taken to be more repeats
of one experiment: samples are concatenated, summaries recomputed from them, verdicts AND-ed
(a failure anywhere stays a failure; else "not measured" anywhere stays so), errors kept, and the cell remembers which runs it came
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

__all__ = ["VERSION", "SCHEMA", "environment", "new_document", "new_cell", "cell_id",
           "write_json", "write_text", "write_csv", "check_output", "check_document",
           "load_json", "validate", "shard", "shard_info", "merge", "machine",
           "summarize", "spread", "quantile", "verdict_word", "lib_version",
           "CSV_COLUMNS", "SCHEMA_FILE", "new_run_id", "read_json", "write_bytes"]

SCHEMA = 2
READS = (1, 2)       # schema 1 is schema 2 without null verdicts


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


def _runtime_libraries() -> list[str]:
    """The distributions the registered runtimes declare (``RuntimeInfo.library``)."""
    from bench import runtimes
    libs = [runtimes.get(r).library for r in runtimes.ordered()]
    return list(dict.fromkeys(lib for lib in libs if lib and lib != "python"))


def lib_version(dist: str) -> str | None:
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
        "libraries": {name: lib_version(name) for name in
                      ("looplab", *_runtime_libraries(), "pytest-benchmark")},
        # The allocator trap (docs/benchmarking.md): glibc's mmap threshold changed asyncio's
        # ping-pong 3.3x, so every result says what the allocator was told.
        "allocator_env": {k: v for k, v in os.environ.items()
                          if k.startswith("MALLOC_") or k in ("PYTHONMALLOC", "LD_PRELOAD")},
        "socket_buffers": _socket_buffers(),
        "loadavg": load,
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


# ---------------------------------------------------------------------------
# Documents and cells

def cell_id(scenario: str, runtime: str, variant: str, *qualifiers) -> str:
    """The one spelling of a cell's id: ``scenario/runtime/variant[/QUALIFIER...]``,
    empty qualifiers left out. Equal cells from different runs get equal ids (that is
    what compare, merge and shards match on): a scenario cell is qualified by its
    preset and network (``run.plan.Cell.id``), a benchmark cell by its parameters
    (``params_qualifier``)."""
    return "/".join([scenario, runtime, variant, *(str(q) for q in qualifiers if q)])


def params_qualifier(params: dict | None) -> str:
    """``k=v,...`` with the keys sorted."""
    return ",".join(f"{k}={params[k]}" for k in sorted(params or {}))


def summarize(values: list):
    """The median of the numeric samples (None when there are none)."""
    nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(v)]
    return statistics.median(nums) if nums else None


def quantile(sorted_vals: list, q: float) -> float:
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
    q1, q3 = quantile(nums, 0.25), quantile(nums, 0.75)
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
        "id": cell_id(scenario, runtime, variant, params_qualifier(params)),
        "scenario": scenario, "runtime": runtime, "variant": variant, "params": params,
        "repeats": max((len(v) for v in samples.values()), default=1 if summary else 0),
        "metrics": summary, "samples": samples,
        "verdicts": dict(verdicts or {}), "errors": list(errors or []),
    }
    if spreads:
        cell["spread"] = spreads
    cell.update(extra)
    return cell


def verdict_word(value) -> str:
    """How a report writes a verdict: yes (holds), NO (fails), not measured (None)."""
    return "not measured" if value is None else "yes" if value else "NO"


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
    (``folder=True``) or a file. The rule for every verb's ``--out`` and ``--json``:
    missing folders on the way are created when the first file is written there,
    and the check creates nothing -- it tries on a throwaway entry in the nearest
    folder that exists -- so a command that stops before writing leaves nothing
    behind. A problem is a one-line UsageError naming the option ``what``."""
    full = os.path.abspath(path)
    if folder:
        if os.path.exists(full) and not os.path.isdir(full):
            raise UsageError(f"{what} {path}: exists and is not a folder")
        target = full
    else:
        if os.path.isdir(full):
            raise UsageError(f"{what} {path}: is a folder; give a file name")
        target = os.path.dirname(full)
    nearest = target
    while not os.path.exists(nearest):
        nearest = os.path.dirname(nearest)
    if not os.path.isdir(nearest):
        raise UsageError(f"{what} {path}: cannot write there: {nearest} is a file, not a folder")
    try:
        if nearest == target:
            fd, probe = tempfile.mkstemp(dir=target, prefix=".looplab-write-test.")
            os.close(fd)
            os.unlink(probe)
        else:       # the folders to create: can one be made here?
            os.rmdir(tempfile.mkdtemp(dir=nearest, prefix=".looplab-write-test."))
        if not folder and os.path.exists(full) and not os.access(full, os.W_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as exc:
        raise UsageError(f"{what} {path}: cannot write there: {exc.strerror or exc}") from None
    return full


def check_document(doc, where: str = "document") -> dict:
    """Raise a one-line Usage error unless ``doc`` looks like a looplab results document."""
    if not isinstance(doc, dict) or "cells" not in doc or "schema" not in doc:
        raise UsageError(f"{where} is not a looplab results file (no 'schema' and 'cells' keys)")
    if doc["schema"] not in READS or isinstance(doc["schema"], bool):
        raise UsageError(f"{where} has results schema {doc['schema']!r}; this looplab reads schema "
                         f"{' and '.join(map(str, READS))}")
    if not isinstance(doc["cells"], list):
        raise UsageError(f"{where} is not a looplab results file ('cells' is not a list)")
    for i, cell in enumerate(doc["cells"]):
        if not isinstance(cell, dict) or not isinstance(cell.get("id"), str) \
                or not isinstance(cell.get("metrics", {}), dict):
            raise UsageError(f"{where}: cell {i} is malformed (needs an 'id' and a 'metrics' dict)")
    return doc


SCHEMA_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "schema.json")


def schema() -> dict:
    with open(SCHEMA_FILE) as f:
        return json.load(f)


def validate(doc) -> list[str]:
    """Where ``doc`` departs from the results JSON Schema (shipped as
    ``bench/results/schema.json``): one line per problem, empty when valid."""
    import jsonschema
    validator = jsonschema.Draft202012Validator(schema())
    problems = []
    for err in sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path)):
        where = "/".join(str(p) for p in err.absolute_path) or "(top)"
        problems.append(f"{where}: {err.message[:200]}")
    return problems


def read_json(path: str, where: str | None = None):
    """The JSON value in the file at ``path``; a file that can't be read or isn't
    JSON is a one-line UsageError that starts with ``where`` (default: the path)."""
    where = path if where is None else where
    try:
        with open(path) as f:
            text = f.read()
    except OSError as exc:
        raise UsageError(f"{where}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"{where}: not JSON ({exc})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{where}: not JSON ({exc})") from None


def load_json(path: str) -> dict:
    """Read a results document; anything else is a one-line Usage error naming the file."""
    doc = check_document(read_json(path, f"{path} is not a looplab results file"), path)
    try:
        problems = validate(doc)
    except ImportError:     # jsonschema missing: the checks above are all there is
        problems = []
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise UsageError(f"{path} is not a valid looplab results file: {problems[0]}{more}")
    return doc


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
        both = [verdicts.get(name, True), value]
        verdicts[name] = False if False in both else None if None in both else True
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
    runtimes: dict = {}         # what each document recorded (bench.run.describe)
    real_only: dict = {}
    for doc, name in zip(docs, names):
        run = doc.get("run_id", "")
        runs.append(run)
        inputs.append({"file": name, "run_id": run, "machine": machines[name],
                       **({"shard": doc["shard"]} if doc.get("shard") else {})})
        env = doc.get("env")
        envs.extend(env if isinstance(env, list) else [env] if env else [])
        for sid, desc in (doc.get("scenarios") or {}).items():
            scenarios.setdefault(sid, desc)
        for spec, desc in (doc.get("runtimes") or {}).items():
            runtimes.setdefault(spec, desc)
        real_only.update(doc.get("real_network_only") or {})
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
    if runtimes:
        out["runtimes"] = runtimes
    if real_only:
        out["real_network_only"] = real_only
    return out
