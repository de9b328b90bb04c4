"""Measuring fidelity: run the edge probes on each subject and its references, compare.

A *subject* is every registered runtime that names references (``RuntimeInfo.
compared_with``, primary first): our three kernels, and a kernel registered from
outside (``--runtime-module``) the same way. Each selected runtime runs the probes of
its style in its own subprocess (``bench.fidelity.worker``; hard timeout, JSON lines
on stdout), and each subject is compared with its references.

A probe *agrees* when its observation on the subject equals the primary reference's.
A difference is either declared on the subject (``RuntimeInfo.probe_differences``:
the value the subject shows there, and why) or it is undeclared: a gap, and
``--fail`` exits 1 while any remains. A declared probe whose observation no longer
matches its declared value is undeclared again. Differences from a secondary
reference are information.
"""
from __future__ import annotations

import fnmatch
import json
import os
import time

from bench.errors import Unavailable, UsageError
from bench.host import envs
from bench.results.tables import format_table
from bench import runtimes as rtmod

__all__ = ["pairings", "declared", "collect", "compare", "counts", "undeclared", "document",
           "select_probes", "select_runtimes", "measure", "probes_block", "markdown_section",
           "table", "summary_line", "COMMAND"]

PARALLEL = 3


def pairings() -> dict[str, tuple]:
    """subject -> its registered references, primary first (registry order)."""
    out = {}
    for info in rtmod.RUNTIMES.values():
        refs = tuple(r for r in info.compared_with if r in rtmod.RUNTIMES)
        if info.variant_of is None and refs:
            out[info.id] = refs
    return out


def declared() -> dict[tuple, str]:
    """(probe, primary reference) -> reason, for every declared difference."""
    return {(probe, refs[0]): rtmod.get(subject).probe_difference(probe).reason
            for subject, refs in pairings().items()
            for probe in rtmod.get(subject).probe_differences}


def _members() -> list[str]:
    pairs = pairings()
    wanted = {r for s, refs in pairs.items() for r in (s, *refs)}
    return [rid for rid in rtmod.ordered() if rid in wanted]


# ---------------------------------------------------------------------------
# Selection

def _missing(rid) -> str | None:
    reason = envs.unavailable_reason(rtmod.parse(rid))
    return None if reason is None else f"runtime {rid} is unavailable here: {reason}"


def _plain(rt) -> bool:
    """No option changed from its default and no loop keyword: the runtime as registered."""
    return not rt.info.options.changed(rt.options) and not rt.loop_options


def grid_reference(rt) -> str | None:
    """For an asyncio runtime on another loop (``asyncio-streams:loop=rloop``, the
    ``uvloop-*`` aliases) or with a flipped option (``eager=true``): the spec of
    CPython's asyncio with that port on the *same interpreter*, its de-facto
    reference. None for anything else."""
    if isinstance(rt, str):
        rt = rtmod.parse(rt)
    base = (rtmod.alias_of(rt.id) or (None,))[0]
    if base is None:
        if "loop" not in rt.info.options.names() or _plain(rt):
            return None
        base = rt.id
    return rtmod.on_interpreter(base, rt.interpreter)


def select_runtimes(text: str | None) -> tuple[list[str], list[str]]:
    """The runtimes to run (each subject's primary reference added to it) and the
    ones skipped because they are unavailable. Explicitly named but unavailable ->
    Unavailable.

    A plain id keeps its pairing: a kernel brings its primary reference, a reference
    brings its kernel. An asyncio runtime on another loop (``loop=rloop``, the
    ``uvloop-*`` aliases) or with a flipped option is a cell of the grid: it brings
    CPython's asyncio on the same interpreter (``grid_reference``) and nothing else. A
    kernel with an interpreter (``@3.12``) brings its primary reference there."""
    members, pairs = _members(), pairings()
    if text is None:
        named, explicit = list(members), False
    else:
        parsed = rtmod.parse_list(text)
        from bench.host import envs
        for rt in parsed:           # a misspelt loop is a mistake before any reference's build
            envs.check_loop(rt)
        named = [rt.spec for rt in parsed]
        bad = [t for t in named if t not in members and not _grid_spec(t)]
        if bad or not named:
            raise UsageError(f"unknown runtime {(bad or [text])[0]!r} for fidelity; "
                             f"choose from {', '.join(members)}, or give a spec of one with "
                             "an interpreter or a loop (e.g. asyncio-streams@3.12:loop=rloop)")
        explicit = True
    wanted = []
    for spec in named:
        rt = rtmod.parse(spec)
        if explicit and grid_reference(rt) is not None:
            # an asyncio loop (uvloop-*, loop=..., eager=true) is a cell of the grid: it
            # brings CPython's asyncio on its interpreter, and nothing else was asked for
            adds = [grid_reference(rt), spec]
        elif spec in members:
            subjects = [spec] if spec in pairs else [s for s, refs in pairs.items() if spec in refs]
            adds = [x for s in subjects for x in (s, pairs[s][0])] + [spec]
            ref = grid_reference(rt)
            adds = ([ref] if ref else []) + adds
        else:
            ref = grid_reference(rt)
            if rt.id in pairs and _plain(rt):
                ref = rtmod.on_interpreter(pairs[rt.id][0], rt.interpreter)
            adds = ([ref] if ref else []) + [spec]
        for r in adds:
            if r not in wanted:
                wanted.append(r)
    skipped = []
    for rid in list(wanted):
        why = _missing(rid)
        if why:
            if explicit and rid in named:
                raise Unavailable(why)
            wanted.remove(rid)
            skipped.append(rid)
    order = {rid: i for i, rid in enumerate(members)}
    return sorted(wanted, key=lambda r: (order.get(r, len(order)), wanted.index(r))), skipped


def _grid_spec(spec: str) -> bool:
    rt = rtmod.parse(spec)
    return (rt.id in _members() and (rt.interpreter is not None or not _plain(rt))) \
        or grid_reference(rt) is not None


def _probes() -> dict:
    from bench.fidelity.registry import PROBES
    from bench.fidelity import worker  # noqa: F401  (imports every probe module)
    return PROBES


def select_probes(text: str | None) -> list[str]:
    """Probe names matching any of the comma-separated shell patterns (all by default)."""
    probes = _probes()
    if not text:
        return list(probes)
    pats = [p.strip() for p in text.split(",") if p.strip()]
    out = [n for n in probes if any(fnmatch.fnmatchcase(n, p) for p in pats)]
    if not out:
        # the hint lists the prefixes the registered probes have, so it cannot go stale
        prefixes = dict.fromkeys(n.split("_", 1)[0] + "_" for n in probes)
        hint = ", ".join(f"{p} ({_PREFIXES[p]})" if p in _PREFIXES else p for p in prefixes)
        raise UsageError(f"no probe matches {text!r}; probe names start with {hint}, "
                         "e.g. --probes 'lp_*'; looplab fidelity --list lists them")
    return out


_PREFIXES = {"cb_": "callback", "st_": "streams", "tk_": "tasks", "co_": "the coro kernel",
             "lp_": "asyncio loop conformance"}


# ---------------------------------------------------------------------------
# Running

def _worker_cmd(rid, names):
    # the worker runs in the runtime's own interpreter (its environment for ``@``)
    from bench.host import envs
    return [envs.interpreter_for(rid), "-m", "bench.fidelity.worker", rid, ",".join(names)]


def collect(runtimes, names, timeout=None, parallel=PARALLEL, meta=None, stall=None) -> dict:
    """Run the probes on each runtime in its own process: {runtime: {probe: record}}.
    A record has ``obs``, ``skip`` or ``error``. A process that dies or stalls charges
    the probe it was running and a fresh one runs the rest; one that overruns its
    budget (``timeout`` seconds; by default ``workers.budget`` of its probe count) keeps
    what it finished (``bench.fidelity.workers``). ``meta``, a dict, receives each
    runtime's Python and loop version as its worker reported them."""
    from bench.fidelity import workers
    probes = _probes()
    from bench.host.procs import ROOT as root
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (root, os.getcwd(), os.environ.get("PYTHONPATH")) if p))
    # the worker sees the runtimes this process sees: built-ins, entry points, and
    # the runtime modules loaded here (--runtime-module)
    modules = [m for m in os.environ.get(rtmod.ENV_VAR, "").split(",") if m.strip()]
    modules += [m for m in rtmod.plugin_modules() if m not in modules]
    if modules:
        env[rtmod.ENV_VAR] = ",".join(modules)
    todo = [(rid, [n for n in names if probes[n].style == rtmod.parse(rid).style])
            for rid in runtimes]

    def on_record(rid, rec):
        if "meta" in rec and meta is not None:
            meta[rid] = rec["meta"]
    return workers.run([t for t in todo if t[1]], _worker_cmd, env, root, parallel, timeout,
                       on_record, stall)


# ---------------------------------------------------------------------------
# Comparing

def comparable(obs):
    """An observation as it is compared: without the exception messages (``"message"``
    keys, at any depth). Two runtimes that raise the same type agree; the message is
    shown, to say why one raised something else."""
    if isinstance(obs, dict):
        return {k: comparable(v) for k, v in obs.items() if k != "message"}
    if isinstance(obs, list):
        return [comparable(v) for v in obs]
    return obs


def same(a, b) -> bool:
    """Are two observations equal as compared (messages aside)?"""
    return comparable(a) == comparable(b)


def _diff(ref, ours):
    """The parts that differ (messages aside), shown whole: for two dicts, only their
    differing keys."""
    if isinstance(ref, dict) and isinstance(ours, dict):
        keys = sorted(set(ref) | set(ours))
        d = [k for k in keys if not same(ref.get(k, "<absent>"), ours.get(k, "<absent>"))]
        return ({k: ref.get(k, "<absent>") for k in d}, {k: ours.get(k, "<absent>") for k in d})
    return ref, ours


def _show(rec) -> str:
    if rec is None:
        return "-"
    if "error" in rec:
        return f"error: {rec['error']}"
    if "skip" in rec:
        return f"n/a ({rec['skip']})"
    return json.dumps(rec["obs"], sort_keys=True, separators=(",", ":"))


def _as_declared(ref_obs, ours_obs, expected) -> bool:
    """Does the subject's observation keep its declared difference? For dicts: every
    key that differs from the reference is declared, and every declared key has its
    declared value; otherwise the whole observation is the declared one."""
    if isinstance(ref_obs, dict) and isinstance(ours_obs, dict) and isinstance(expected, dict):
        differing = _diff(ref_obs, ours_obs)[1]
        return set(differing) <= set(expected) and all(
            same(ours_obs.get(k, "<absent>"), v) for k, v in expected.items())
    return same(ours_obs, expected)


def compare(results: dict, names) -> list[dict]:
    """One row per (subject, reference, probe) that ran on both: ``verdict`` is
    ``agree``, ``declared``, ``differ`` (undeclared, or no longer as declared),
    ``error`` or ``n/a``. A loop cell of the grid (``grid_reference``) gets rows
    against CPython's asyncio on the same interpreter (``kind`` "loop"), whose
    differences are ``divergent``."""
    probes = _probes()
    pairs = pairings()
    rows = []
    for key in results:
        rt = rtmod.parse(key)
        info = rt.info
        refs = []
        if rt.id in pairs and _plain(rt):
            refs = [(rtmod.on_interpreter(r, rt.interpreter), i == 0, "kernel") for i, r in enumerate(pairs[rt.id])]
        elif grid_reference(rt):
            refs = [(grid_reference(rt), False, "loop")]
        for ref, primary, kind in refs:
            if ref not in results:
                continue
            for n in names:
                if probes[n].style != info.style:
                    continue
                a, b = results[ref].get(n), results[key].get(n)
                decl = info.probe_difference(n) if primary else None
                row = {"ours": key, "reference": ref, "primary": primary, "probe": n,
                       "ref_rec": a, "ours_rec": b, "reason": decl.reason if decl else None,
                       "kind": kind}
                if a is None or b is None or "skip" in a or "skip" in b:
                    row["verdict"] = "n/a"
                elif "error" in a or "error" in b:
                    row["verdict"] = "error"
                elif same(a["obs"], b["obs"]):
                    row["verdict"] = "agree"
                elif kind == "loop":
                    row["verdict"] = "divergent"
                elif decl and _as_declared(a["obs"], b["obs"], decl.expected):
                    row["verdict"] = "declared"
                else:
                    row["verdict"] = "differ"
                    if decl:
                        row["reason"] = (f"not as declared (declared {json.dumps(decl.expected, sort_keys=True)}"
                                         f"): {decl.reason}")
                rows.append(row)
    return rows


def counts(rows) -> dict:
    """Per pairing ``"ours vs ref"``: probes compared, agreeing, declared, undeclared, errors."""
    out = {}
    for r in rows:
        c = out.setdefault(f"{r['ours']} vs {r['reference']}",
                           {"compared": 0, "agree": 0, "declared": 0, "differ": 0, "error": 0,
                            "primary": r["primary"]})
        if r.get("kind") == "loop":
            c["kind"] = "loop"
        if r["verdict"] == "n/a":
            continue
        c["compared"] += 1
        c["differ" if r["verdict"] == "divergent" else r["verdict"]] += 1
    return out


def undeclared(rows) -> list[dict]:
    """Gaps the kernels must close: undeclared differences (and errors) against a primary."""
    return [r for r in rows if r["primary"] and r["verdict"] in ("differ", "error")]


def summary_line(pair, c) -> str:
    if not c["compared"]:
        return f"{pair}: no selected probe maps onto both"
    if c.get("kind") == "loop":
        return (f"{pair} (loop conformance): {c['agree']}/{c['compared']} agree, "
                f"{c['differ']} divergent, {c['error']} errors")
    if not c["primary"]:
        return (f"{pair} (secondary, information): {c['agree']}/{c['compared']} agree, "
                f"{c['differ'] + c['declared']} differ, {c['error']} errors")
    return (f"{pair}: {c['agree']}/{c['compared']} agree, {c['declared']} declared, "
            f"{c['differ']} undeclared, {c['error']} errors")


def _clip(text, width=72):
    return text if len(text) <= width else text[:width - 1] + "…"


def table(rows, markdown=False) -> str:
    """probe | reference behaviour | ours | verdict | reason, for each pairing. In the
    terminal, an agreeing value is clipped and a secondary pairing shows only its
    differences; the Markdown version has everything."""
    parts = []
    by_pair = {}
    for r in rows:
        by_pair.setdefault((r["ours"], r["reference"], r["primary"]), []).append(r)
    for (ours, ref, primary), rs in by_pair.items():
        body = []
        for r in rs:
            a, b = r["ref_rec"], r["ours_rec"]
            if r["verdict"] in ("differ", "declared", "divergent") and a and b:
                da, db = _diff(a["obs"], b["obs"])
                ref_txt = json.dumps(da, sort_keys=True, separators=(",", ":"))
                ours_txt = json.dumps(db, sort_keys=True, separators=(",", ":"))
            else:
                ref_txt, ours_txt = _show(a), ("=" if r["verdict"] == "agree" else _show(b))
                if not markdown:
                    if not primary:
                        continue
                    ref_txt = _clip(ref_txt)
            verdict = r["verdict"] if primary or r["verdict"] in ("agree", "n/a", "divergent") \
                else "differ (info)"
            body.append([r["probe"], ref_txt, ours_txt, verdict, r["reason"] or ""])
        c = counts(rs)[f"{ours} vs {ref}"]
        title = summary_line(f"{ours} vs {ref}", c)
        if not body:
            parts.append(title)
            continue
        parts.append(("### " if markdown else "") + title + "\n\n" +
                     format_table(["probe", ref, ours, "verdict", "reason"], body,
                                  markdown=markdown, align="lllll"))
    return "\n\n".join(parts)


def document(results: dict, rows, names) -> dict:
    """The results document: one cell per probe x runtime, scenario "fidelity"."""
    from bench import results as res
    agrees = {}
    for r in rows:
        if r["verdict"] == "n/a":
            continue
        ok = r["verdict"] == "agree"
        agrees.setdefault((r["ours"], r["probe"]), {})[r["reference"]] = (ok, r["primary"],
                                                                          r["reason"])
        agrees.setdefault((r["reference"], r["probe"]), {})[r["ours"]] = (ok, True, r["reason"])
    cells = []
    for rid, recs in results.items():
        for n in names:
            rec = recs.get(n)
            if rec is None:
                continue
            versus = agrees.get((rid, n), {})
            primary = [v for v in versus.items() if v[1][1]]
            verdicts = {"agrees": primary[0][1][0]} if primary else {}
            cell = res.new_cell(
                # metrics are scalars in the schema: the observation as compact JSON text
                "fidelity", rid, n, metrics={"observation": None if "obs" not in rec else
                                             json.dumps(rec["obs"], sort_keys=True,
                                                        separators=(",", ":"))},
                verdicts=verdicts, errors=[rec["error"]] if "error" in rec else [],
                compared_with={k: v[0] for k, v in versus.items()},
                declared=next((v[2] for v in versus.values() if v[2]), None))
            if "skip" in rec:
                cell["notes"] = [rec["skip"]]
            cells.append(cell)
    summary = {k: {kk: vv for kk, vv in v.items()} for k, v in counts(rows).items()}
    return res.new_document(cells, fidelity=summary)


# ---------------------------------------------------------------------------
# The report section: the same block in results documents (top-level key
# ``fidelity_probes``), report.md, report.html and ``looplab fidelity --out``.

COMMAND = "looplab fidelity"


def probes_block(rows, skipped=(), elapsed_s=None) -> dict:
    """What the reports show: per pairing its counts, and every row that is not an
    agreement (only the observation keys that differ), with its declared reason."""
    pairings = [dict(pairing=k, ours=k.split(" vs ")[0], reference=k.split(" vs ")[1], **v)
                for k, v in counts(rows).items()]
    differences = []
    for r in rows:
        if r["verdict"] in ("agree", "n/a"):
            continue
        a, b = r["ref_rec"] or {}, r["ours_rec"] or {}
        if "obs" in a and "obs" in b:
            da, db = _diff(a["obs"], b["obs"])
            ref_txt, ours_txt = (json.dumps(x, sort_keys=True, separators=(",", ":"))
                                 for x in (da, db))
        else:
            ref_txt, ours_txt = _show(r["ref_rec"]), _show(r["ours_rec"])
        d = {"subject": r["ours"], "ours": r["ours"], "reference": r["reference"],
             "primary": r["primary"], "probe": r["probe"], "kind": r.get("kind", "kernel"),
             "verdict": r["verdict"] if r["primary"] or r["verdict"] == "divergent"
             else "information",
             "reference_obs": ref_txt, "ours_obs": ours_txt, "reason": r["reason"] or ""}
        if r.get("kind") == "loop":
            d.update(promise=r.get("promise"), upstream=r.get("upstream"))
        differences.append(d)
    block = {"command": COMMAND, "pairings": pairings, "differences": differences,
             "skipped": list(skipped)}
    if elapsed_s is not None:
        block["elapsed_s"] = round(elapsed_s, 1)
    return block


def markdown_section(block: dict, level: str = "##") -> str:
    """The fidelity-probes section of report.md (and of ``--out DIR``'s fidelity.md)."""
    lines = [f"{level} Fidelity probes: our kernels at the edges", "",
             "Small programs that poke one edge each (a write after close, a nested timeout, "
             "the context a callback sees) run on our kernel and on its references, each "
             "runtime in its own process. Against the primary reference every difference must "
             "be fixed or declared with a reason; against a secondary one it is information. "
             f"Measured with `{block.get('command', COMMAND)}`.", ""]
    head = ["pairing", "agree", "declared", "differ (undeclared)", "errors"]
    body = []
    for p in block["pairings"]:
        name = p["pairing"] + ("" if p["primary"] else " (information)")
        if not p["compared"]:
            body.append([name, "no probe maps", "", "", ""])
            continue
        body.append([name, f"{p['agree']} / {p['compared']}", str(p["declared"]),
                     str(p["differ"]), str(p["error"])])
    lines += [format_table(head, body, markdown=True, align="lrrrr"), ""]
    if block.get("skipped"):
        lines += [f"Not run (library missing): {', '.join(block['skipped'])}.", ""]
    diffs = block["differences"]
    if diffs:
        lines += [f"{level}# Differences", "",
                  "Verdict and reason first; `subject` is the runtime judged (our kernel, or an "
                  "asyncio loop), `reference` the one it is judged against. A loop's reason is "
                  "the promise of the asyncio docs it breaks (or de-facto) and the upstream "
                  "threads read.", "",
                  format_table(["verdict", "reason", "subject vs reference", "probe", "reference shows",
                                "subject shows"],
                               [[d["verdict"], _md(d["reason"]),
                                 f"{d.get('subject', d['ours'])} vs {d['reference']}", d["probe"],
                                 _md(d["reference_obs"]), _md(d["ours_obs"])] for d in diffs],
                               markdown=True, align="llllll"), ""]
    else:
        lines += ["No differences.", ""]
    return "\n".join(lines)


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def measure(runtimes_text=None, probes_text=None, loop_probes=True) -> tuple[dict, list, list, dict]:
    """Run the probes: (results, rows, names, block). For the main job and the verb.
    ``loop_probes=False`` leaves out the observatory's loop-conformance probes (the
    main job measures our kernels; ``looplab fidelity`` measures the loops)."""
    names = select_probes(probes_text)
    if not loop_probes:
        names = [n for n in names if not _probes()[n].standalone]
    runtimes, skipped = select_runtimes(runtimes_text)
    start = time.monotonic()
    meta: dict = {}
    results = collect(runtimes, names, meta=meta)
    rows = compare(results, names)
    from bench.fidelity import classes
    classes.annotate(rows, meta, _probes())
    block = probes_block(rows, skipped, time.monotonic() - start)
    # what each worker ran with (Python, loop and its version): the observatory's grid
    # (``bench.fidelity.observatory.add_grid``) reads it
    block["workers"] = meta
    return results, rows, names, block
