"""``looplab fidelity``: do the kernels behave like the libraries they reproduce, at the edges?

Runs the edge probes (``bench.fidelity``) on every subject -- a runtime that names
references, ours or registered from outside -- and on its references, prints one
table per pairing and the counts, and with ``--fail`` exits 1 while an undeclared
difference from a primary reference remains. ``--json FILE`` and ``--out DIR`` are
checked before any probe runs.
"""
from __future__ import annotations

import os
import time

from bench import fidelity
from bench import results as resmod
from bench.errors import ExitCode
from bench import scenario as scmod


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
    p.add_argument("--runtime-module", action="append", default=[], metavar="MODULE",
                   help="import a module that registers runtimes (repeatable); a runtime it "
                        "registers with references is a subject like our kernels")
    p.set_defaults(func=run)


def run(args) -> ExitCode:
    scmod.load_runtime_modules(args.runtime_module)
    # bad input and unwritable outputs are reported before any probe runs
    fidelity.select_probes(args.probes)
    _, skipped = fidelity.select_runtimes(args.runtimes)
    if args.json:
        resmod.check_output(args.json, "--json")
    if args.out:
        resmod.check_output(args.out, "--out", folder=True)
    start = time.monotonic()
    results, rows, names, block = fidelity.measure(args.runtimes, args.probes)
    print(fidelity.table(rows))
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
            resmod.write_text(os.path.join(args.out, "fidelity.md"),
                              "# Fidelity at the edges\n\n" + fidelity.markdown_section(block) +
                              "\n## Every probe\n\n" + fidelity.table(rows, markdown=True) + "\n")
    if args.fail and gaps:
        return ExitCode.FAILED
    return ExitCode.OK
