"""Verbs over results files: ``compare``, ``merge``, ``validate``."""
from __future__ import annotations

import json
import sys

from bench.results.tables import plural
from bench.results import compare as cmpmod
from bench import results as resmod
from bench.errors import ExitCode, UsageError


def cmd_compare(args) -> int:
    old, new = resmod.load_json(args.old), resmod.load_json(args.new)
    gates, rule = cmpmod.parse_gates(args.fail)
    rule = rule or args.rule
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()] if args.metrics else None
    rows, failures = cmpmod.compare(old, new, rule, metrics, gates=gates)
    print(cmpmod.format_compare(rows, args.all))
    counts: dict = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    print(f"\nrule {rule} (noise-aware): {summary}")
    if failures:
        kinds = sorted({r["kind"] for r in failures})
        print(f"looplab compare: {len(failures)} regression(s) ({', '.join(kinds)})", file=sys.stderr)
        return ExitCode.FAILED
    return ExitCode.OK


def cmd_merge(args) -> int:
    for path, what in ((args.out, "--out"), (args.csv, "--csv"), (args.pytest_benchmark, "--pytest-benchmark")):
        if path:
            resmod.check_output(path, what)
    docs = [resmod.load_json(p) for p in args.files]
    doc = resmod.merge(docs, args.files, allow_mixed_machines=args.allow_mixed_machines)
    if not (args.out or args.csv or args.pytest_benchmark):
        json.dump(doc, sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
        return ExitCode.OK
    if args.out:
        resmod.write_json(doc, args.out)
    if args.csv:
        resmod.write_csv(doc, args.csv)
    if args.pytest_benchmark:
        resmod.write_json(cmpmod.to_pytest_benchmark(doc), args.pytest_benchmark)
    print(f"merged {plural(len(docs), 'file')}: {plural(len(doc['cells']), 'cell')}", file=sys.stderr)
    return ExitCode.OK


def cmd_validate(args) -> int:
    bad = 0
    for path in args.files:
        doc = resmod.read_json(path)
        problems = resmod.validate(doc)
        if problems:
            bad += 1
            print(f"{path}: INVALID ({len(problems)} problem(s))")
            for p in problems[:20]:
                print(f"  {p}")
        else:
            print(f"{path}: valid (results schema {doc['schema']}, {plural(len(doc['cells']), 'cell')})")
    return ExitCode.FAILED if bad else ExitCode.OK


def add_parser(sub) -> None:
    cp = sub.add_parser(
        "compare", help="compare two results files: verdicts, then metrics",
        description="Match cells by id. Verdicts first: one that held and now fails is a "
                    "regression, the reverse a fix. Then the metrics whose scenario declares a "
                    "direction, noise-aware: a change counts only beyond the rule's threshold and "
                    "beyond the noise (Mann-Whitney U at p<0.05 with 5+ samples a side, "
                    "ranges apart by more than the threshold with 2-4, a 50%% change with one). Latency maxima "
                    "and metrics without a direction are information. No cell in common is an "
                    "error (exit 2). Exit 1 with --fail when a gated regression is found.")
    cp.add_argument("old", help="baseline results JSON")
    cp.add_argument("new", help="results JSON to check")
    cp.add_argument("--fail", metavar="GATES", default=None,
                    help="exit 1 on a regression of these kinds: verdict, behaviour, timing, all "
                         "(comma list); a rule such as median:10%% means all, with that rule")
    cp.add_argument("--rule", default="median:10%",
                    help="statistic and threshold, e.g. median:10%% (median, mean, min or max)")
    cp.add_argument("--metrics", default=None, help="comma list of metric (or verdict) names")
    cp.add_argument("--all", action="store_true", help="also show unchanged and information rows")
    cp.set_defaults(func=cmd_compare)

    mp = sub.add_parser(
        "merge", help="merge results files (e.g. shards) into one",
        description="Union of the cells. Refuses the same input twice, one cell id with "
                    "different parameters, an incomplete set of shards (naming the missing "
                    "ones) and inputs from different machines (unless --allow-mixed-machines). "
                    "The same cell id in several files is taken as more repeats of one "
                    "experiment. Without an output option the merged JSON goes to stdout.")
    mp.add_argument("files", nargs="+", help="results JSON files")
    mp.add_argument("--out", "-o", default=None, metavar="PATH", help="write the merged JSON here")
    mp.add_argument("--csv", default=None, metavar="PATH", help="also write CSV rows here")
    mp.add_argument("--pytest-benchmark", default=None, metavar="PATH",
                    help="also write pytest-benchmark JSON (for `pytest-benchmark compare`)")
    mp.add_argument("--allow-mixed-machines", action="store_true",
                    help="pool results from different machines")
    mp.set_defaults(func=cmd_merge)

    vp = sub.add_parser("validate", help="check results files against the results JSON Schema",
                        description="Exit 0 when every file is valid, 1 when one is not.")
    vp.add_argument("files", nargs="+", metavar="FILE")
    vp.set_defaults(func=cmd_validate)
