"""Verbs over the scenario matrix: ``run``, ``list``, ``trace``, ``report``, and the main
report (``looplab`` with no verb).

Every output path is checked before the first cell runs. A runtime named explicitly
whose library is missing is exit 3 (ENVIRONMENT) before anything runs -- the same code
``serve`` and ``bench`` give, because the machine lacks something the user asked for;
with ``all`` or ``ours`` the missing ones are skipped with a line saying so.
"""
from __future__ import annotations

import os
import sys

from bench.results.tables import plural
from bench.host import envs
from bench.results import compare as cmpmod
from bench import report
from bench import results as resmod
from bench import run as matrix
from bench.scenarios import api as scmod
from bench.errors import ExitCode, Unavailable, UsageError
from bench.run import describe as docmod
from bench.run.runner import interrupted_line, nothing_measured
from bench.verbs.common import (
    add_buggify_option, add_net_options, add_plugin_options, load_plugins, positive_int,
)
from bench import runtimes as rtmod
from protocols import apps
from protocols.common import driver

APPS = tuple(apps.APPS)
LIST_WHAT = ("runtimes", "scenarios", "cells", "apps")


def _variants_for(app: str) -> tuple[str, ...]:
    seen: list[str] = []
    for style in apps.STYLES:
        for v in driver(style).VARIANTS[app]:
            if v not in seen:
                seen.append(v)
    return tuple(seen)


def check_named_runtimes(rts) -> None:
    """Exit 3 up front when a runtime the user named (not one ``all`` or ``ours``
    expanded to) is missing here. ``rts``: parsed runtimes, or the text of a list."""
    for rt in rtmod.parse_list(rts) if isinstance(rts, str) or rts is None else rts:
        if rt.expanded_from is not None:
            continue
        reason = envs.unavailable_reason(rt)
        if reason:
            raise Unavailable(f"runtime {rt.spec} is unavailable here: {reason}")


# ---------------------------------------------------------------------------
# list

def cmd_list(args) -> int:
    load_plugins(args)
    if args.what == "runtimes":
        for info in rtmod.RUNTIMES.values():
            rt = rtmod.parse(info.id)
            reason = envs.unavailable_reason(rt)
            status = "available" if reason is None else f"UNAVAILABLE: {reason}"
            ref = f" (compare with {', '.join(info.compared_with)})" if info.compared_with else ""
            origin = getattr(info, "origin", "") or "built-in"
            print(f"{info.id:18} {info.style:8} {info.summary}{ref} -- {status} [from: {origin}]")
            for opt in info.options:
                print(f"    {opt.describe()}")
        _list_axes()
        return ExitCode.OK
    if args.what == "scenarios":
        for sc in scmod.scenarios().values():
            flags = [f for f, on in (("main job", sc.main_job), ("traceable", sc.traceable)) if on]
            print(f"{sc.id:5} {sc.title}  [variants: {', '.join(sc.variants)}; presets: "
                  f"{', '.join(sc.presets)}{'; ' + ', '.join(flags) if flags else ''}] "
                  f"[from: {sc.origin}]")
            print(f"      {sc.summary}")
        return ExitCode.OK
    if args.what == "cells":
        cells = matrix.plan(args.scenarios, args.runtimes, args.variants, args.preset)
        if args.shard:
            cells = resmod.shard(cells, args.shard)
        for cell in cells:
            print(cell.id)
        return ExitCode.OK
    for app in APPS:
        print(f"{app:8} variants: {', '.join(_variants_for(app))}")
    return ExitCode.OK


def _list_axes() -> None:
    """The two axes of a spec: interpreters found (``@X.Y``) and asyncio loops (``loop=``)."""
    import platform
    from bench.host import envs
    from protocols import asyncio_ports
    print(f"\ninterpreters (RUNTIME@VERSION or RUNTIME@PATH; without @: this one, "
          f"{platform.python_version()}):")
    least_text, least = envs._minimum()
    for it in envs.found():
        too_old = "" if envs._vtuple(it.version) >= least else f" -- below looplab's minimum ({least_text})"
        print(f"  {it.version:10} {it.path} [{it.found_by}]{too_old}")
    print("\nasyncio loops (asyncio-protocol/asyncio-streams:loop=NAME, or loop=MODULE:FACTORY):")
    for name, target in asyncio_ports.LOOPS.items():
        reason = asyncio_ports._check_loop(name, {}, False)
        where = asyncio_ports.LOOP_REQUIREMENTS.get(name)
        status = (f"available here, version {asyncio_ports.loop_identity(name)['version']}"
                  if reason is None else f"not here: {reason}")
        extra = f"; an @VERSION environment installs {where}" if where else ""
        print(f"  {name:9} {target} -- {status}{extra}")
    newest = envs.found()[0].version if envs.found() else "none"
    for name, why in asyncio_ports.UNOBTAINABLE.items():
        print(f"  {name:9} NOT OBTAINABLE on this machine: {why} (newest Python found: {newest})")


# ---------------------------------------------------------------------------
# run

def cmd_run(args) -> int:
    load_plugins(args)
    # Everything a user can get wrong is checked before the output folder is made:
    # a mistake leaves no empty folder behind.
    rts = rtmod.parse_list(args.runtimes)       # the one parse of the runtime specs
    # A replay's cells are the file's: the default matrix is not planned (a
    # user scenario without the default preset would refuse a replay of S3).
    cells = ([] if getattr(args, "replay", None) else
             matrix.plan(args.scenarios, rts, args.variants, args.preset, args.repeat))
    if args.baseline and args.fail_on != "verdict":
        raise UsageError("--baseline is the reference for --fail-on verdict; give both")
    # the simulated network (bench.run.seeds): --net, --replay, --seeds
    from bench.run import seeds as simruns
    cells = simruns.cells_for(args, cells)
    if not cells:
        raise UsageError(f"the matrix is empty: {matrix.plan_why_empty(args.scenarios, args.runtimes)}")
    extra = {}
    if not args.seeds:
        if args.shard:
            planned = len(cells)
            extra["shard"] = resmod.shard_info([c.id for c in cells], args.shard)
            cells = resmod.shard(cells, args.shard)
            if not cells:
                raise UsageError(f"the matrix is empty: shard {args.shard} of its {planned} "
                                 f"cell{'s' if planned != 1 else ''} has none")
    baseline = resmod.load_json(args.baseline) if args.baseline else None
    out_dir = args.out or matrix.default_out_dir()
    with matrix.outputs_checked(out_dir, args.json):
        envs.prepare(rts)       # find the interpreters, build missing environments (progress on stderr)
        check_named_runtimes(rts)
    if args.seeds:
        return simruns.explore_command(cells, args, out_dir)
    if not args.out:
        print(f"looplab run: no --out given; writing to {out_dir}", file=sys.stderr)
    print(f"looplab run: {plural(len(cells), 'cell')}", file=sys.stderr)
    return run_and_report(cells, out_dir, args.json, args.jobs, args.fail_on, baseline, extra)


def verdict_failures(cells: list[dict]) -> list[str]:
    return [f"{r['id']}: {k}" for r in cells for k, v in (r.get("verdicts") or {}).items() if v is not True]


def run_and_report(cells, out_dir: str, json_path: str | None = None, jobs: int = 1,
                   fail_on: str | None = None, baseline: dict | None = None,
                   extra: dict | None = None) -> int:
    """Run ``cells`` into ``out_dir`` (checked before this runs): each finished cell is
    flushed to ``out_dir/results.json`` at once, so an interrupt (SIGINT or SIGTERM)
    keeps it, and the report -- marked incomplete then -- is written at the end
    either way.

    ``fail_on="verdict"``: exit 1 when a verdict fails -- with a ``baseline``
    document, only when a verdict that held there fails now (a regression)."""
    runner = matrix.Runner(cells, docmod.builder(cells, **(extra or {})), out_dir=out_dir, jobs=jobs)
    doc = runner.run()
    paths = report.write_report(doc, out_dir)
    if json_path:
        resmod.write_json(doc, json_path)
    if runner.interrupted:
        print(interrupted_line(len(doc["cells"]), len(cells), paths["md"]), file=sys.stderr)
        return ExitCode.INTERRUPTED
    print(report.render_terminal(doc, notes_in=paths["md"]))
    print(f"\nreport: {paths['html']} (report.md, results.json, results.csv, "
          f"{plural(len(paths['plots']), 'plot')})")
    code = matrix.exit_code(doc)
    line = nothing_measured(doc["cells"])
    if line:
        print(line, file=sys.stderr)
    if code != ExitCode.OK:
        return code
    if fail_on == "verdict":
        if baseline is not None:
            failed = [f"{r['cell']}: {r['metric']}" for r in cmpmod.verdict_changes(baseline, doc)
                      if r["status"] == "regression"]
        else:
            failed = verdict_failures(doc["cells"])
        if failed:
            print(f"looplab: {len(failed)} verdict(s) failed: {', '.join(failed[:5])}"
                  + (" ..." if len(failed) > 5 else ""), file=sys.stderr)
            return ExitCode.FAILED
    return ExitCode.OK


def cmd_main_job(args) -> int:
    """``looplab`` with no verb: the main-job scenarios at the quick preset on every
    available runtime, the table in the terminal and the report folder."""
    out_dir = args.main_out or "looplab-report"
    resmod.check_output(out_dir, "--out", folder=True)
    available, missing = rtmod.available_runtimes()
    for spec, reason in missing.items():
        print(f"skipping {spec}: {reason}", file=sys.stderr)
    cells = matrix.plan(None, available, None, "quick", main_job=True)
    # The edge probes first (a few seconds), so no cell is measured while they run;
    # the report shows them beside the scenario verdicts. The loop-conformance probes
    # (lp_*, a minute) are the observatory's: looplab fidelity runs them.
    from bench import fidelity
    print("looplab: fidelity probes (our kernels against their references) ...", file=sys.stderr)
    *_, probes = fidelity.measure(loop_probes=False)
    for p in probes["pairings"]:
        if p["primary"]:
            print(f"  {p['pairing']}: {p['agree']}/{p['compared']} agree, {p['declared']} "
                  f"declared, {p['differ']} undeclared", file=sys.stderr)
    print(f"looplab: {plural(len(cells), 'cell')} on {plural(len(available), 'runtime')} "
          "(quick preset)", file=sys.stderr)
    return run_and_report(cells, out_dir, jobs=2, extra={"fidelity_probes": probes})


# ---------------------------------------------------------------------------
# trace

def cmd_trace(args) -> int:
    """Run one server cell with tracing on and write Chrome trace-event JSON."""
    load_plugins(args)
    args.scenario = scmod.resolve(args.scenario)        # s1 is S1, as in run
    traceable = [sid for sid, sc in scmod.scenarios().items() if sc.traceable]
    if args.scenario not in traceable:
        raise UsageError(f"trace works on the server scenarios {', '.join(traceable)}, "
                         f"not {args.scenario!r}")
    path = resmod.check_output(args.out, "--out")
    rt = rtmod.parse(args.runtime)
    reason = envs.unavailable_reason(rt)
    if reason:
        raise Unavailable(f"runtime {rt.id} is unavailable: {reason}")
    # how it is traced is declared on the runtime: its own trace option, or a
    # traced twin of its port (bench/fidelity/tracing.py), which the cell process loads
    from bench.fidelity import tracing
    spec, modules = tracing.plan(rt)
    scmod.load_runtime_modules(modules)
    cells = matrix.plan(args.scenario, spec, args.variant, args.preset)
    if not cells:
        raise UsageError(f"no cell for {args.scenario} {rt.id} {args.variant}")
    result = matrix.run_cell(cells[0], trace_path=path)
    if result["errors"] or not os.path.exists(path):
        print(f"looplab trace: the cell failed: {'; '.join(result['errors']) or 'no trace written'}",
              file=sys.stderr)
        return ExitCode.FAILED
    print(f"trace: {args.out} (open it in https://ui.perfetto.dev or chrome://tracing)")
    return ExitCode.OK


# ---------------------------------------------------------------------------
# report

def cmd_report(args) -> int:
    load_plugins(args)
    resmod.check_output(args.out, "--out", folder=True)
    docs = [resmod.load_json(p) for p in args.files]
    doc = docs[0] if len(docs) == 1 else resmod.merge(
        docs, args.files, allow_mixed_machines=args.allow_mixed_machines)
    doc = docmod.complete(doc)      # a file from before documents described themselves
    paths = report.render_folder(doc, args.out)
    print(report.render_terminal(doc, notes_in=paths["md"]))
    print(f"\nreport: {paths['html']} (report.md, results.json, results.csv, "
          f"{plural(len(paths['plots']), 'plot')})")
    return ExitCode.OK


def add_parser(sub) -> None:
    ls = sub.add_parser("list", help="what exists: runtimes, scenarios, cells, apps",
                        description="List runtimes and scenarios (with where each came from), "
                        "the cells a run would make (with --shard: one shard's), or the apps.")
    ls.add_argument("what", choices=LIST_WHAT)
    ls.add_argument("--scenarios", default=None, help="for cells: comma list (default: all)")
    ls.add_argument("--runtimes", default=None, help="for cells: comma list of runtime specs")
    ls.add_argument("--variants", default=None, help="for cells: comma list")
    ls.add_argument("--preset", default="quick", help="for cells: a preset, e.g. quick, blog, tiny")
    ls.add_argument("--shard", default=None, metavar="I/N", help="for cells: only shard I of N")
    add_plugin_options(ls)
    ls.set_defaults(func=cmd_list)

    rn = sub.add_parser("run", help="run a matrix of scenarios x runtimes x variants",
                        description="Run a matrix; each cell in its own process, peers in another. "
                        "A crashing or hanging cell is recorded and the matrix goes on. Finished cells "
                        "are written to DIR/results.json as they complete; Ctrl-C or SIGTERM keeps "
                        "them. Exit 0 ok, 1 a cell failed (or a verdict, with --fail-on verdict), "
                        "2 usage, 3 a named runtime is missing, 130 interrupted.")
    rn.add_argument("--scenarios", default=None, help="comma list, e.g. S1,S3 (default: all)")
    rn.add_argument("--runtimes", default=None,
                    help="comma list of runtime specs, e.g. callback,asyncio-protocol or "
                         "coro:ready_order=random-7; 'all', 'ours' (default: all)")
    rn.add_argument("--variants", default=None, help="comma list, e.g. naive,fixed (default: all)")
    rn.add_argument("--preset", default="quick",
                    help="quick (CI-sized), blog (the post's scale), tiny (smoke tests)")
    rn.add_argument("--repeat", type=positive_int, default=1,
                    help="repeats per cell; racy outcomes become frequencies (real network: "
                         "a simulated cell repeats one universe, so use --seeds there)")
    rn.add_argument("--out", default=None, metavar="DIR",
                    help="write report.md, results.json/csv and plots (default: looplab-runs/TIME)")
    rn.add_argument("--json", default=None, metavar="PATH", help="also write the results JSON here")
    rn.add_argument("--shard", default=None, metavar="I/N", help="run only shard I of N (merge with looplab merge)")
    rn.add_argument("--jobs", type=positive_int, default=1, help="cells run at once (default 1)")
    rn.add_argument("--fail-on", choices=["verdict"], default=None,
                    help="exit 1 when a verdict fails (with --baseline: only one that held there)")
    rn.add_argument("--baseline", default=None, metavar="RESULTS.json",
                    help="for --fail-on verdict: the results whose verdicts must keep holding")
    add_net_options(rn, explored="count outcomes, write and shrink a failing one")
    add_buggify_option(rn, "with --net sim --seeds N: each point enabled with probability "
                           "1/4 per seed, then firing with 1/4 at each site it reaches")
    add_plugin_options(rn)
    rn.set_defaults(func=cmd_run)

    tr = sub.add_parser("trace", help="write a Chrome trace of one cell (Perfetto opens it)",
                        description="Run one server-scenario cell with tracing on and write "
                        "Chrome trace-event JSON: a track per task or connection, buffer-size "
                        "counters, flow arrows from wake-up to step. Our kernels record it "
                        "themselves (trace=true); trio, asyncio-streams and uvloop-streams are "
                        "traced through their public hooks. See docs/tracing.md.")
    tr.add_argument("scenario", help="a traceable scenario (looplab list scenarios)")
    tr.add_argument("--runtime", required=True,
                    help="a runtime spec: our kernels (with options), trio, asyncio or uvloop "
                         "streams, or a loaded runtime that declares how it is traced")
    tr.add_argument("--variant", default="naive")
    tr.add_argument("--preset", default="quick")
    tr.add_argument("--out", default="trace.json", help="output path (default trace.json)")
    add_plugin_options(tr)
    tr.set_defaults(func=cmd_trace)

    rp = sub.add_parser("report", help="render the full report from results files",
                        description="Render report.md, results.json/csv and plots into DIR from "
                        "one results file or several (merged first, with merge's checks).")
    rp.add_argument("files", nargs="+", metavar="RESULTS.json")
    rp.add_argument("--out", required=True, metavar="DIR", help="report folder")
    rp.add_argument("--allow-mixed-machines", action="store_true",
                    help="pool results from different machines")
    add_plugin_options(rp)
    rp.set_defaults(func=cmd_report)
