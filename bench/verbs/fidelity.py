"""``looplab fidelity``: do the kernels behave like the libraries they reproduce, at the edges?

Runs the edge probes (``bench.fidelity``) on every subject -- a runtime that names
references, ours or registered from outside -- and on its references, prints one
table per pairing and the counts, and with ``--fail`` exits 1 while an undeclared
difference from a primary reference remains. ``--json FILE`` and ``--out DIR`` are
checked before any probe runs.
"""
from __future__ import annotations

import os
import sys
import time

from bench.host import envs
from bench import fidelity
from bench.fidelity import observatory
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
                   help="write a standalone reproduction (<= 30 lines, needing only the loop's "
                        "package) of PROBE on --runtime's loop: to stdout, or into --out DIR")
    p.add_argument("--runtime", metavar="SPEC",
                   help="with --repro: the runtime whose loop runs it, e.g. "
                        "asyncio-streams@3.12:loop=rloop")
    p.add_argument("--runtime-module", action="append", default=[], metavar="MODULE",
                   help="import a module that registers runtimes (repeatable); a runtime it "
                        "registers with references is a subject like our kernels")
    p.set_defaults(func=run)


def run(args) -> ExitCode:
    scmod.load_runtime_modules(args.runtime_module)
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
    on the same interpreter, then write the standalone script."""
    from bench.errors import Unavailable, UsageError
    from bench import runtimes as rtmod
    if not (args.repro and args.runtime):
        raise UsageError("--repro PROBE and --runtime SPEC go together, e.g. --repro "
                         "lp_call_later_zero_order --runtime asyncio-streams:loop=uvloop")
    target = observatory.repro_probe(args.repro)
    rt = observatory.runtime_for(target, args.runtime)
    ref = fidelity.grid_reference(rt)
    for spec in (rt, ref):
        why = spec and envs.unavailable_reason(rtmod.parse(spec))
        if why:
            raise Unavailable(f"runtime {spec} is unavailable here: {why}")
    if args.out:
        resmod.check_output(args.out, "--out", folder=True)
    meta: dict = {}
    results = fidelity.collect([r for r in (ref, rt) if r], [target], meta=meta)
    obs = (results.get(rt, {}).get(target) or {}).get("obs")
    expected = (results.get(ref, {}).get(target) or {}).get("obs") if ref else None
    m = meta.get(rt, {})
    versions = {"python": m.get("python"), "loop": (m.get("loop") or {}).get("name"),
                "loop_version": (m.get("loop") or {}).get("version")}
    text = observatory.reproduction(target, rt, expected, obs, versions)
    if args.out:
        path = os.path.join(args.out, f"{target}-{_file_part(rt)}.py")
        resmod.write_text(path, text)
        print(f"wrote {path} ({len(text.splitlines())} lines)")
    else:
        print(text, end="")
    if expected is not None and obs is not None and expected == obs:
        print(f"note: {target} agrees with CPython's asyncio here; nothing to report",
              file=sys.stderr)
    return ExitCode.OK
