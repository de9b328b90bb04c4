"""``looplab fidelity``: do the kernels behave like the libraries they reproduce, at the edges?

Runs the edge probes (``bench.fidelity``) on every subject -- a runtime that names
references, ours or registered from outside -- and on its references, prints one
table per pairing and the counts, and with ``--fail`` exits 1 while an undeclared
difference from a primary reference remains. ``--json FILE`` and ``--out DIR`` are
checked before any probe runs.
"""
from __future__ import annotations

import json
import os
import sys
import time

from bench.host import envs
from bench import fidelity
from bench.fidelity import classes, observatory, upstream
from bench import results as resmod
from bench.errors import ExitCode
from bench.scenarios import api as scmod


def add_parser(subparsers) -> None:
    """Register ``fidelity`` on the CLI's sub-parsers."""
    p = subparsers.add_parser(
        "fidelity", help="edge-behaviour probes: each kernel vs its reference libraries, side by side",
        description="Run the edge probes on every runtime that names references (our kernels, "
                    "and a kernel loaded with --runtime-module that declares compared_with) and on "
                    "those references, each runtime in its own process; compare. Exit 0 ok, 1 with "
                    "--fail while an undeclared difference from a primary reference remains, 2 usage, "
                    "3 a named runtime is unavailable, 130 interrupted.")
    p.add_argument("--runtimes", metavar="LIST",
                   help="comma-separated runtime ids (default: every available subject and its "
                        "references; a subject brings its primary reference)")
    p.add_argument("--probes", metavar="PATTERN,...",
                   help="only probes whose names match these shell patterns, e.g. 'cb_*,tk_wait*'")
    p.add_argument("--json", metavar="FILE", help="write the observations as a results document")
    p.add_argument("--out", metavar="DIR", help="write DIR/fidelity.json and DIR/fidelity.md")
    p.add_argument("--fail", action="store_true",
                   help="exit 1 while any undeclared difference from a primary reference remains")
    p.add_argument("--repro", metavar="PROBE",
                   help=f"write a standalone reproduction (at most {observatory.REPRO_MAX_LINES} "
                        "lines, needing only the loop's package) of PROBE on --runtime's loop: to stdout, or into --out DIR")
    p.add_argument("--runtime", metavar="SPEC",
                   help="with --repro: the runtime whose loop runs it, e.g. "
                        "asyncio-streams@3.12:loop=rloop")
    p.add_argument("--list", action="store_true",
                   help="list the probes (or those --probes matches) with their class and the "
                        "quoted promise of a documented one, and count them; run nothing")
    p.add_argument("--runtime-module", action="append", default=[], metavar="MODULE",
                   help="import a module that registers runtimes (repeatable); a runtime it "
                        "registers with references is a subject like our kernels")
    p.set_defaults(func=run)


def run(args) -> ExitCode:
    scmod.load_runtime_modules(args.runtime_module)
    if args.list:
        return _list(args)
    if args.repro or args.runtime:
        return _repro(args)
    # bad input and unwritable outputs are reported before any probe runs
    fidelity.select_probes(args.probes)
    _, skipped = fidelity.select_runtimes(args.runtimes)
    if args.json:
        resmod.check_output(args.json, "--json")
    if args.out:
        resmod.check_output(args.out, "--out", folder=True)
    start = time.monotonic()
    results, rows, names, block = fidelity.measure(args.runtimes, args.probes)
    observatory.add_grid(results, rows, names, block)
    print(fidelity.table(rows))
    if block.get("grid"):
        print()
        print(observatory.markdown_grid(block["grid"]))
    gaps = fidelity.undeclared(rows)
    print()
    for pair, v in fidelity.counts(rows).items():
        print(fidelity.summary_line(pair, v))
    if skipped:
        print(f"not run (library missing): {', '.join(skipped)}")
    print(f"{len(gaps)} undeclared difference(s) from a primary reference "
          f"[{time.monotonic() - start:.1f} s]")
    if args.json or args.out:
        doc = fidelity.document(results, rows, names)
        doc["fidelity_probes"] = block
        if args.json:
            resmod.write_json(doc, args.json)
        if args.out:
            resmod.write_json(doc, os.path.join(args.out, "fidelity.json"))
            # the main report's section, then every row of every pairing
            text = "# Fidelity at the edges\n\n" + fidelity.markdown_section(block)
            if block.get("grid"):
                text += "\n" + observatory.markdown_grid(block["grid"]) + "\n"
                _write_repros(args.out, block["grid"], results)
            text += "\n## Every probe\n\n" + fidelity.table(rows, markdown=True) + "\n"
            resmod.write_text(os.path.join(args.out, "fidelity.md"), text)
            resmod.write_text(os.path.join(args.out, "fidelity.html"),
                              observatory.html_page("Fidelity at the edges", text))
    if args.fail and gaps:
        return ExitCode.FAILED
    return ExitCode.OK


def _list(args) -> ExitCode:
    """``--list``: every probe (or those ``--probes`` matches), one line each -- name,
    style, class -- the quoted promise under a documented one, then the counts."""
    names = fidelity.select_probes(args.probes)
    probes = fidelity.PROBES
    for n in names:
        p = probes[n]
        cls = "documented" if p.documented is not None else (
            "de-facto" if p.standalone else "kernel probe")
        print(f"{n:44} {p.style:8} {cls:12} {p.doc}")
        if p.documented is not None:
            since = f" (documented since {p.documented.since})" if p.documented.since else ""
            quote = p.documented.quote(None)
            print(f"{'':44} {'':8} {'':12} \"{quote['text']}\" ({quote['page']}){since}")
    loop = [n for n in names if probes[n].standalone]
    documented = sum(probes[n].documented is not None for n in loop)
    styles = {}
    for n in names:
        if not probes[n].standalone:
            styles[probes[n].style] = styles.get(probes[n].style, 0) + 1
    kernel = ", ".join(f"{v} {k}" for k, v in sorted(styles.items()))
    print(f"{len(names)} probes: {len(names) - len(loop)} on our kernels and their references "
          f"({kernel or 'none'}), {len(loop)} loop-conformance probes (lp_*: {documented} "
          f"documented, {len(loop) - documented} de-facto)")
    return ExitCode.OK


def _write_repros(out_dir, grid, results) -> None:
    """One standalone reproduction per divergence that has one, on the runtime of the
    reproducing probe's style: DIR/repro/PROBE-SPEC.py (a probe reproducing several
    divergences on one loop and interpreter is written once)."""
    folder = os.path.join(out_dir, "repro")
    written = {}
    for d in grid["divergences"]:
        if not d["repro"] or d["verdict"] != "divergent":
            continue
        spec = observatory.runtime_for(d["repro"], d["spec"])
        name = f"{d['repro']}-{_file_part(spec)}.py"
        if name not in written:
            ref = fidelity.grid_reference(spec)
            exp = (results.get(ref, {}).get(d["repro"]) or {}).get("obs")
            obs = (results.get(spec, {}).get(d["repro"]) or {}).get("obs")
            text = observatory.reproduction(d["repro"], spec, exp, obs, d)
            os.makedirs(folder, exist_ok=True)
            resmod.write_text(os.path.join(folder, name), text)
            written[name] = True
        d["repro_file"] = os.path.join("repro", name)


def _file_part(spec: str) -> str:
    return "".join(ch if ch.isalnum() or ch in ".-" else "_" for ch in spec)


def _repro(args) -> ExitCode:
    """``--repro PROBE --runtime SPEC``: measure the probe on SPEC and on CPython's asyncio
    on the same interpreter, then write the standalone script -- only when the two
    differ: a probe that agrees there is refused on one line (exit 1), nothing written."""
    from bench.errors import Unavailable, UsageError
    from bench import runtimes as rtmod
    if not (args.repro and args.runtime):
        raise UsageError("--repro PROBE and --runtime SPEC go together, e.g. --repro "
                         "lp_call_later_zero_order --runtime asyncio-streams:loop=uvloop")
    target = observatory.repro_probe(args.repro)
    rt = observatory.runtime_for(target, args.runtime)
    ref = fidelity.grid_reference(rt)
    if ref is None:
        raise UsageError(f"{rt} is CPython's asyncio itself, the reference of the loop cells; "
                         "give a runtime on another loop, e.g. asyncio-streams:loop=uvloop")
    for spec in (rt, ref):
        why = envs.unavailable_reason(rtmod.parse(spec))
        if why:
            raise Unavailable(f"runtime {spec} is unavailable here: {why}")
    if args.out:
        resmod.check_output(args.out, "--out", folder=True)
    meta: dict = {}
    results = fidelity.collect([ref, rt], [target], meta=meta)
    got, want = results.get(rt, {}).get(target) or {}, results.get(ref, {}).get(target) or {}
    if not _differs(want, got):
        seen = _compact(got["obs"]) if "obs" in got else str(got.get("error", "no result"))
        print(f"looplab: {target} shows no difference on {rt}: it observes what CPython's asyncio "
              f"does on the same interpreter ({seen[:100]}); nothing to reproduce", file=sys.stderr)
        return ExitCode.FAILED
    m = meta.get(rt, {})
    versions = {"python": m.get("python"), "loop": (m.get("loop") or {}).get("name"),
                "loop_version": (m.get("loop") or {}).get("version")}
    text = observatory.reproduction(target, rt, want.get("obs"), got.get("obs"), versions)
    if args.out:
        path = os.path.join(args.out, f"{target}-{_file_part(rt)}.py")
        resmod.write_text(path, text)
        print(f"wrote {path} ({len(text.splitlines())} lines)")
    else:
        print(text, end="")
    _, quote = classes.classify(fidelity.PROBES[target], versions["python"])
    loop = versions["loop"] or rtmod.parse(rt).loop
    print(f"{target} on {rt}: {classes.promise_text(quote, markdown=False)}; "
          f"{upstream.line(target, loop)}", file=sys.stderr)
    return ExitCode.OK


def _differs(want: dict, got: dict) -> bool:
    """Do two probe records differ as compared (messages aside)? An error on one side
    only is a difference; the same error on both is not."""
    if "obs" in want and "obs" in got:
        return not fidelity.same(want["obs"], got["obs"])
    return want.get("obs", want.get("error")) != got.get("obs", got.get("error"))


def _compact(obs) -> str:
    return json.dumps(obs, sort_keys=True, separators=(",", ":"))
