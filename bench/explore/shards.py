"""Explorations split into parts that run anywhere, and the merge that joins them.

``looplab explore TARGET ... --shard I/N --out DIR`` runs part ``I`` of ``N`` of
every unit (runtime x variant) and writes it to ``DIR/explore-part-I-of-N.json``;
``looplab explore --merge DIR_OR_FILE...`` joins the parts into one result. The
parts need nothing from each other, so any job array runs them (Slurm's
``SLURM_ARRAY_TASK_ID``, a CI matrix, GNU parallel, a shell loop).

What a part is, per strategy (``split``, which ``--jobs`` uses as well):

* ``delays:D``: part ``p`` of ``P`` of the bounded space
  (``search.DelayBounded``: a schedule's first deviation decides its part), so
  the parts are disjoint and together they are the whole space. Each part runs
  the default schedule to learn its choice points; the merge counts it once,
  so the merged count is one process's. The bound is proved only when every
  part is present and exhausted its own;
* ``random`` and ``pct:d=N``: seed ``seed * 1000 + p`` and ``1/P`` of the
  budget, so the parts draw different schedules.

With ``--jobs J`` as well, part ``I`` of ``N`` is cut again into ``J`` (part
``I-1 + N*j`` of ``N*J``), which is the same space as ``N*J`` machines.

A merge holds only what its parts say together: a part that is missing, or
made by another exploration (target, preset, strategy, budget, options) or
another code version, makes it no proof, said in one line (exit 1). A failing
schedule found by any part is a failure all the same.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import platform
import time

from bench.errors import UsageError

__all__ = ["MODEL", "parse", "split", "part_doc", "part_file", "read_parts", "merge_parts"]

MODEL = "looplab.explore.part"

#: What must be equal in every part of one exploration (besides the code version).
KEY = ("target", "preset", "strategy", "budget", "seed", "net", "portability", "buggify",
       "variant", "runtimes", "count")


def parse(text: str) -> tuple[int, int]:
    """``I/N`` (1-based) as ``(I, N)``; UsageError with one line."""
    from bench.results.document import parse_shard
    return parse_shard(text)


def split(units: list, jobs: int, part: tuple[int, int] | None = None) -> list:
    """Units cut into the pieces that processes run: part ``part = (I, N)``
    (1-based) of each unit, cut again so that ``jobs`` processes have work.
    Each piece names its unit (``unit``); a ``delays:D`` piece its part of the
    space (``shard = (p, P)``), a random or PCT piece its own seed and share
    of the budget."""
    i, n = ((part[0] - 1, part[1]) if part else (0, 1))
    per = -(-jobs // len(units)) if units and jobs > len(units) else 1
    out = []
    for u_i, u in enumerate(units):
        if per < 2 and n == 1:
            out.append(dict(u, unit=u_i))
            continue
        P = n * per
        share = -(-u["budget"] // P)
        for k in range(per):
            p = i + n * k
            if u["strategy"].startswith("delays"):
                out.append(dict(u, unit=u_i, shard=(p, P)))
            else:
                out.append(dict(u, unit=u_i, seed=u["seed"] * 1000 + p, budget=share))
    return out


def _key(args, count: int) -> dict:
    return {"target": args.target, "preset": args.preset, "strategy": args.strategy,
            "budget": args.budget, "seed": args.seed, "net": args.net_choices == "on",
            "portability": bool(args.portability),
            "buggify": list(args.buggify) if getattr(args, "buggify", None) else None,
            "variant": args.variant, "runtimes": args.runtimes, "count": count}


def part_file(out_dir: str, index: int, count: int) -> str:
    return os.path.join(out_dir, f"explore-part-{index}-of-{count}.json")


def part_doc(args, index: int, count: int, results: list) -> dict:
    """What one part writes: the exploration it belongs to, its index, the code
    that ran it, and each unit's result for this part."""
    from bench.explore.exploration import code_version
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"model": MODEL, "version": 1, "code": code_version(),
            "exploration": _key(args, count), "part": index,
            "host": platform.node(), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "load": [round(x, 2) for x in load] if load else None,
            "results": results}


def _fingerprint(doc: dict) -> str:
    return hashlib.sha1(json.dumps([doc["code"], doc["exploration"]], sort_keys=True)
                        .encode()).hexdigest()[:12]


def _describe(doc: dict) -> str:
    e = doc["exploration"]
    return (f"{e['target']} {e['strategy']} budget {e['budget']}, {e['count']} parts, "
            f"code {doc['code']}")


def read_parts(paths: list) -> list:
    """The part documents named by ``paths``: files, or directories whose
    ``explore-part-*.json`` files are read. A file that is not a part, or a
    directory without one, is a UsageError (one line). Returns [(path, doc)]."""
    from bench.results import read_json
    files = []
    for p in paths:
        if os.path.isdir(p):
            found = sorted(glob.glob(os.path.join(p, "explore-part-*.json")))
            if not found:
                raise UsageError(f"--merge {p}: no explore part in this directory "
                                 "(explore-part-I-of-N.json, written by --shard I/N --out)")
            files += found
        else:
            files.append(p)
    out = []
    for f in files:
        doc = read_json(f, f"--merge {f}")
        if not (isinstance(doc, dict) and doc.get("model") == MODEL
                and isinstance(doc.get("exploration"), dict)
                and isinstance(doc.get("results"), list) and isinstance(doc.get("part"), int)):
            raise UsageError(f"--merge {f}: not an explore part (model {MODEL}, written by "
                             "looplab explore --shard I/N --out DIR)")
        if doc.get("version") != 1:
            raise UsageError(f"--merge {f}: explore part version {doc.get('version')!r}; "
                             "this looplab reads version 1")
        out.append((f, doc))
    return out


def merge(shards: list, results: list) -> list:
    """Join the results of one unit's shards (or of one shard) into the unit's
    result: schedules summed (the default schedule counted once), a failure kept,
    a proof only when every delays:D part proved its own."""
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


def merge_parts(parts: list) -> tuple[list, str | None]:
    """Join the parts' results, unit by unit. Returns the merged results (as
    one process's, ``merge``) and the reason it is no proof (one line),
    or None when every part of every unit is there.

    Parts of different explorations or code versions are not merged at all
    (``[]`` and the reason). The same part given twice is a UsageError."""
    first_path, first = parts[0]
    for path, doc in parts[1:]:
        if _fingerprint(doc) != _fingerprint(first):
            return [], (f"not a proof: the parts are not of one exploration: {first_path} is "
                        f"{_describe(first)}; {path} is {_describe(doc)}")
    count = first["exploration"]["count"]
    seen: dict = {}
    for path, doc in parts:
        i = doc["part"]
        if not 1 <= i <= count:
            raise UsageError(f"--merge {path}: part {i} of {count} does not exist")
        if i in seen:
            raise UsageError(f"--merge: part {i}/{count} given twice ({seen[i]} and {path})")
        seen[i] = path
    # a unit is its runtime and variant: a part whose machine skipped a runtime
    # (a library missing there) lacks that unit, and only that unit is unproved
    units: dict = {}
    pieces, results = [], []
    for _, doc in sorted(parts, key=lambda pd: pd[1]["part"]):
        for r in doc["results"]:
            key = (r["runtime"], r["variant"])
            u = units.setdefault(key, {"index": len(units), "parts": set()})
            u["parts"].add(doc["part"])
            piece = {"unit": u["index"]}
            if r.get("strategy", "").startswith("delays"):
                piece["shard"] = (doc["part"] - 1, count)
            pieces.append(piece)
            results.append(r)
    merged = merge(pieces, results) if results else []
    missing_all = sorted(set(range(1, count + 1)) - set(seen))
    reason = None
    for key, u in units.items():
        lacking = sorted(set(range(1, count + 1)) - u["parts"])
        m = merged[u["index"]]
        if lacking:
            m.pop("proved", None)
            m["not_proved"] = _missing(lacking, count)
        elif count > 1 and m.get("proved") is None and not m.get("found") \
                and not m.get("not_proved") and m.get("strategy", "").startswith("delays"):
            m["not_proved"] = "not a proof: a part did not exhaust its space"
    if missing_all:
        reason = _missing(missing_all, count)
    elif any(len(u["parts"]) < count for u in units.values()):
        reason = "not a proof: some units lack parts (a runtime skipped on a part's machine)"
    return merged, reason


def _missing(lacking: list, count: int) -> str:
    return (f"not a proof: part{'s' if len(lacking) > 1 else ''} "
            f"{', '.join(map(str, lacking))} of {count} missing")
