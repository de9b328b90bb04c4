"""``looplab fidelity``: do our kernels behave like the libraries they reproduce, at the edges?

Scenario verdicts say the kernels agree on the big picture; users compare designs at
the edges -- what a write after close does, where a reset surfaces, what a nested
timeout raises. The probes in ``bench.edges`` poke one edge each. This module runs
them on every selected runtime, one subprocess per runtime (hard timeout, JSON lines
on stdout), and compares each of our kernels with its references:

    callback  vs asyncio-protocol (primary), uvloop-protocol
    hybrid    vs asyncio-streams  (primary), uvloop-streams
    coro      vs curio            (primary), trio

A probe *agrees* when its observation on our kernel equals the primary reference's.
A difference is either listed in ``DECLARED`` with its reason (accepted: the
reference's own bug, say) or it is undeclared: a gap in our kernel, and ``--fail``
exits 1 while any remains. Differences from a secondary reference are information.

Usage: ``looplab fidelity [--runtimes ...] [--probes PATTERN,...] [--json FILE]
[--out DIR] [--fail]`` (``python -m bench.fidelity`` until the verb is wired in).
"""
from __future__ import annotations

import argparse
import fnmatch
import importlib.util
import json
import os
import subprocess
import sys
import time

from bench.errors import ExitCode, Unavailable, UsageError
from bench.tables import format_table

__all__ = ["PAIRINGS", "DECLARED", "add_parser", "run", "collect", "compare", "document",
           "select_probes", "select_runtimes", "measure", "probes_block", "markdown_section",
           "main"]

#: our runtime -> its references, primary first
PAIRINGS = {
    "callback": ("asyncio-protocol", "uvloop-protocol"),
    "hybrid": ("asyncio-streams", "uvloop-streams"),
    "coro": ("curio", "trio"),
}
_REFERENCE_OF = {ref: ours for ours, refs in PAIRINGS.items() for ref in refs}
_ALL = tuple(r for ours, refs in PAIRINGS.items() for r in (ours,) + refs)
#: the library a runtime's process needs
_REQUIRES = {"asyncio-protocol": "asyncio", "asyncio-streams": "asyncio", "uvloop-protocol": "uvloop",
             "uvloop-streams": "uvloop", "curio": "curio", "trio": "trio"}

#: Known, accepted differences: (probe, reference runtime) -> why ours differs on purpose.
DECLARED = {
    ("cb_write_after_completed_buffered_close", "asyncio-protocol"):
        "asyncio bug: after a buffered close completes, write() calls send() on the dropped "
        "socket (None) and raises AttributeError; ours drops the write as after any close",
    ("co_event_wake_order", "curio"):
        "arbitrary order in curio: its Event keeps waiters in a set (curio/sched.py "
        "SchedBarrier), so set() wakes them in hash order, which varies from run to run; "
        "ours wakes them FIFO, as asyncio's Event does",
    ("co_send_after_close", "curio"):
        "curio's Socket has no closed state: after close() a call reaches the closed "
        "stdlib socket and fails with OSError (EBADF); ours raises ClosedResourceError, "
        "as trio does (the same difference is declared in curio's port conformance)",
}

WORKER_TIMEOUT_S = 50.0
PARALLEL = 3


# ---------------------------------------------------------------------------
# Selection

def _library_missing(rid) -> str | None:
    mod = _REQUIRES.get(rid)
    if mod and importlib.util.find_spec(mod) is None:
        return f"{rid} needs the '{mod}' library, which is not installed here"
    return None


def select_runtimes(text: str | None) -> tuple[list[str], list[str]]:
    """The runtimes to run (each pairing's primary reference added to its kernel) and the
    ones skipped because their library is missing. Explicitly named but missing ->
    Unavailable."""
    if not text:
        named, explicit = list(_ALL), False
    else:
        named = _split_specs(text)
        bad = [t for t in named if t not in _ALL and not _loop_spec(t)]
        if bad or not named:
            raise UsageError(f"unknown runtime {(bad or [text])[0]!r} for fidelity; "
                             f"choose from {', '.join(_ALL)}, or asyncio-protocol/"
                             "asyncio-streams with loop=NAME[,loop.NAME=VALUE...]")
        explicit = True
    wanted, loops = [], []
    for rid in named:
        if _loop_spec(rid):        # compared with asyncio's own loop, its primary reference
            if _base(rid) not in wanted:
                wanted.append(_base(rid))
            if rid not in loops:
                loops.append(rid)
            continue
        ours = _REFERENCE_OF.get(rid, rid)
        for r in (ours, PAIRINGS[ours][0], rid):
            if r not in wanted:
                wanted.append(r)
    skipped = []
    for rid in list(wanted):
        why = _library_missing(rid)
        if why:
            if explicit and rid in named:
                raise Unavailable(why)
            wanted.remove(rid)
            skipped.append(rid)
    for spec in list(loops):
        why = _loop_missing(spec)
        if why:
            if explicit:
                raise Unavailable(why)
            loops.remove(spec)
            skipped.append(spec)
    return [r for r in _ALL if r in wanted] + loops, skipped


def _loop_missing(spec) -> str | None:
    from protocols import runtimes
    try:
        why = runtimes.parse(spec).unavailable_reason()
    except runtimes.UsageError as exc:
        raise UsageError(str(exc)) from None
    return None if why is None else f"{spec} is unavailable: {why}"


#: asyncio's runtimes, which take a loop (``asyncio-streams:loop=looplab``): such a
#: spec is compared with the same runtime on asyncio's own loop.
_TAKES_LOOP = ("asyncio-protocol", "asyncio-streams")


def _base(spec: str) -> str:
    return spec.partition(":")[0]


def _loop_spec(spec: str) -> bool:
    return _base(spec) in _TAKES_LOOP and ":" in spec


def _split_specs(text: str) -> list[str]:
    """A comma list of runtimes; a ``NAME=VALUE`` token belongs to the spec before it."""
    specs: list[str] = []
    for token in (t.strip() for t in text.split(",") if t.strip()):
        if "=" in token and specs and _base(token) not in _ALL:
            specs[-1] += ("," if ":" in specs[-1] else ":") + token
        else:
            specs.append(token)
    return specs


def _pairings(results) -> dict:
    """PAIRINGS, plus each loop spec that ran paired with its runtime on asyncio's loop."""
    extra = {spec: (_base(spec),) for spec in results if _loop_spec(spec)}
    return {**PAIRINGS, **extra}


def select_probes(text: str | None) -> list[str]:
    """Probe names matching any of the comma-separated shell patterns (all by default)."""
    from bench.edges import PROBES
    if not text:
        return list(PROBES)
    pats = [p.strip() for p in text.split(",") if p.strip()]
    out = [n for n in PROBES if any(fnmatch.fnmatchcase(n, p) for p in pats)]
    if not out:
        raise UsageError(f"no probe matches {text!r}; probe names start with cb_ (callback), "
                         "st_/tk_ (streams and tasks) or co_ (coro), e.g. --probes 'co_*'")
    return out


# ---------------------------------------------------------------------------
# Running

def _worker_cmd(rid, names):
    return [sys.executable, "-m", "bench.edges", rid, ",".join(names)]


def collect(runtimes, names, timeout=WORKER_TIMEOUT_S, parallel=PARALLEL) -> dict:
    """Run the probes on each runtime in its own process: {runtime: {probe: record}}.
    A record has ``obs``, ``skip`` or ``error``. A process that dies or overruns keeps the
    probes it finished; the rest get an error record."""
    from bench.edges import PROBES, STYLE_OF
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    todo = [(rid, [n for n in names if PROBES[n].style == STYLE_OF[_base(rid)]])
            for rid in runtimes]
    todo = [(rid, ns) for rid, ns in todo if ns]
    results, running, started = {}, [], []

    def finish(rid, ns, proc, start):
        try:
            out, err = proc.communicate(timeout=max(0.0, timeout - (time.monotonic() - start)))
            failure = None if proc.returncode == 0 else \
                f"runtime process exited with {proc.returncode}: " \
                f"{(err.strip().splitlines() or ['?'])[-1][:120]}"
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            failure = f"runtime process timed out after {timeout:g} s"
        recs = {}
        for line in out.splitlines():
            try:
                rec = json.loads(line)
                recs[rec["probe"]] = rec
            except (ValueError, KeyError, TypeError):
                continue
        for n in ns:
            recs.setdefault(n, {"probe": n, "error": failure or "no result"})
        results[rid] = recs

    try:
        for rid, ns in todo:
            while len(running) >= parallel:
                finish(*running.pop(0))
            proc = subprocess.Popen(_worker_cmd(rid, ns), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, env=env, cwd=root)
            started.append(proc)
            running.append((rid, ns, proc, time.monotonic()))
        while running:
            finish(*running.pop(0))
    finally:
        # interrupted (Ctrl-C): no worker outlives the run
        for proc in started:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
    return results


# ---------------------------------------------------------------------------
# Comparing

def _diff(ref, ours):
    """The parts that differ: for two dicts, only their differing keys."""
    if isinstance(ref, dict) and isinstance(ours, dict):
        keys = sorted(set(ref) | set(ours))
        d = [k for k in keys if ref.get(k, "<absent>") != ours.get(k, "<absent>")]
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


def compare(results: dict, names) -> list[dict]:
    """One row per (our runtime, reference, probe) that ran on both: ``verdict`` is
    ``agree``, ``declared``, ``differ`` (undeclared), ``error`` or ``n/a``."""
    from bench.edges import PROBES, STYLE_OF
    rows = []
    for ours, refs in _pairings(results).items():
        if ours not in results:
            continue
        for i, ref in enumerate(refs):
            if ref not in results:
                continue
            for n in names:
                if PROBES[n].style != STYLE_OF[_base(ours)]:
                    continue
                a, b = results[ref].get(n), results[ours].get(n)
                row = {"ours": ours, "reference": ref, "primary": i == 0, "probe": n,
                       "ref_rec": a, "ours_rec": b, "reason": DECLARED.get((n, ref))}
                if a is None or b is None or "skip" in a or "skip" in b:
                    row["verdict"] = "n/a"
                elif "error" in a or "error" in b:
                    row["verdict"] = "error"
                elif a["obs"] == b["obs"]:
                    row["verdict"] = "agree"
                else:
                    row["verdict"] = "declared" if row["reason"] else "differ"
                rows.append(row)
    return rows


def counts(rows) -> dict:
    """Per pairing ``"ours vs ref"``: probes compared, agreeing, declared, undeclared, errors."""
    out = {}
    for r in rows:
        c = out.setdefault(f"{r['ours']} vs {r['reference']}",
                           {"compared": 0, "agree": 0, "declared": 0, "differ": 0, "error": 0,
                            "primary": r["primary"]})
        if r["verdict"] == "n/a":
            continue
        c["compared"] += 1
        c[r["verdict"]] += 1
    return out


def undeclared(rows) -> list[dict]:
    """Gaps the kernels must close: undeclared differences (and errors) against a primary."""
    return [r for r in rows if r["primary"] and r["verdict"] in ("differ", "error")]


def _summary(pair, c) -> str:
    if not c["compared"]:
        return f"{pair}: no selected probe maps onto both"
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
            if r["verdict"] in ("differ", "declared") and a and b:
                da, db = _diff(a["obs"], b["obs"])
                ref_txt = json.dumps(da, sort_keys=True, separators=(",", ":"))
                ours_txt = json.dumps(db, sort_keys=True, separators=(",", ":"))
            else:
                ref_txt, ours_txt = _show(a), ("=" if r["verdict"] == "agree" else _show(b))
                if not markdown:
                    if not primary:
                        continue
                    ref_txt = _clip(ref_txt)
            verdict = r["verdict"] if primary or r["verdict"] in ("agree", "n/a") else "differ (info)"
            body.append([r["probe"], ref_txt, ours_txt, verdict, r["reason"] or ""])
        c = counts(rs)[f"{ours} vs {ref}"]
        title = _summary(f"{ours} vs {ref}", c)
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
        differences.append({"ours": r["ours"], "reference": r["reference"],
                            "primary": r["primary"], "probe": r["probe"],
                            "verdict": r["verdict"] if r["primary"] else "information",
                            "reference_obs": ref_txt, "ours_obs": ours_txt,
                            "reason": r["reason"] or ""})
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
                  format_table(["pairing", "probe", "reference", "ours", "verdict", "reason"],
                               [[f"{d['ours']} vs {d['reference']}", d["probe"],
                                 _md(d["reference_obs"]), _md(d["ours_obs"]), d["verdict"],
                                 _md(d["reason"])] for d in diffs],
                               markdown=True, align="llllll"), ""]
    else:
        lines += ["No differences.", ""]
    return "\n".join(lines)


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def measure(runtimes_text=None, probes_text=None) -> tuple[dict, list, list, dict]:
    """Run the probes: (results, rows, names, block). For the main job and the verb."""
    names = select_probes(probes_text)
    runtimes, skipped = select_runtimes(runtimes_text)
    start = time.monotonic()
    results = collect(runtimes, names)
    rows = compare(results, names)
    return results, rows, names, probes_block(rows, skipped, time.monotonic() - start)


# ---------------------------------------------------------------------------
# The verb

def _add_arguments(p):
    p.add_argument("--runtimes", metavar="LIST",
                   help=f"comma-separated runtimes (default: all available; each kernel brings "
                        f"its primary reference): {', '.join(_ALL)}; or asyncio-protocol/"
                        f"asyncio-streams on another loop (asyncio-streams:loop=looplab), "
                        f"compared with asyncio's own loop")
    p.add_argument("--probes", metavar="PATTERN,...",
                   help="only probes whose names match these shell patterns, e.g. 'cb_*,tk_wait*'")
    p.add_argument("--json", metavar="FILE", help="write the observations as a results document")
    p.add_argument("--out", metavar="DIR", help="write DIR/fidelity.json and DIR/fidelity.md")
    p.add_argument("--fail", action="store_true",
                   help="exit 1 while any undeclared difference from a primary reference remains")


def add_parser(subparsers) -> None:
    """Register ``fidelity`` on the CLI's sub-parsers."""
    p = subparsers.add_parser("fidelity", help="edge-behaviour probes: our kernels vs their "
                                               "reference libraries, side by side")
    _add_arguments(p)
    p.set_defaults(func=run)


def run(args) -> ExitCode:
    select_probes(args.probes)              # bad input is reported before anything runs
    _, skipped = select_runtimes(args.runtimes)
    if args.json and os.path.isdir(args.json):
        raise UsageError(f"--json {args.json!r} is a directory; give a file name")
    if args.out and os.path.exists(args.out) and not os.path.isdir(args.out):
        raise UsageError(f"--out {args.out!r} exists and is not a directory")
    start = time.monotonic()
    results, rows, names, block = measure(args.runtimes, args.probes)
    print(table(rows))
    gaps = undeclared(rows)
    c = counts(rows)
    print()
    for pair, v in c.items():
        print(_summary(pair, v))
    if skipped:
        print(f"not run (library missing): {', '.join(skipped)}")
    print(f"{len(gaps)} undeclared difference(s) from a primary reference "
          f"[{time.monotonic() - start:.1f} s]")
    doc = None
    if args.json or args.out:
        from bench import results as res
        doc = document(results, rows, names)
        doc["fidelity_probes"] = block
        if args.json:
            res.write_json(doc, args.json)
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            res.write_json(doc, os.path.join(args.out, "fidelity.json"))
            # the main report's section, then every row of every pairing
            res.write_text(os.path.join(args.out, "fidelity.md"),
                           "# Fidelity at the edges\n\n" + markdown_section(block) +
                           "\n## Every probe\n\n" + table(rows, markdown=True) + "\n")
    if args.fail and gaps:
        return ExitCode.FAILED
    return ExitCode.OK


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message):
        print(f"looplab fidelity: {message}", file=sys.stderr)
        raise SystemExit(ExitCode.USAGE)


def main(argv=None) -> int:
    p = _OneLineParser(prog="python -m bench.fidelity",
                       description="Edge probes: our kernels vs their reference libraries.")
    _add_arguments(p)
    args = p.parse_args(argv)
    try:
        return int(run(args))
    except UsageError as exc:
        print(f"looplab: {exc}", file=sys.stderr)
        return int(ExitCode.USAGE)
    except Unavailable as exc:
        print(f"looplab: {exc}", file=sys.stderr)
        return int(ExitCode.ENVIRONMENT)
    except KeyboardInterrupt:
        print("looplab: interrupted", file=sys.stderr)
        return int(ExitCode.INTERRUPTED)


if __name__ == "__main__":
    sys.exit(main())
