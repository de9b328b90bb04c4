"""The ``looplab bench`` verb: performance measurements as sub-commands.

    looplab bench matrix   echo throughput/latency over runtimes x sizes x connections
    looplab bench goals    exactly the measurements behind the performance goals
    looplab bench micro    spawn+join, yield, ping-pong, timers and tokio's scheduler benchmarks
                           (chained_spawn, yield_many, many_timers) in fresh worker processes
    looplab bench idle     server memory per idle connection
    looplab bench curve    echo throughput over 1..1000 connections

``looplab bench [matrix options]`` with no sub-command runs ``matrix``.

Each sub-command checks every option and every output path before it measures anything:
a bad value or an unwritable place is one line and exit 2, with no server started and
nothing written. Results are written atomically (a temporary file in the same folder,
then renamed), so a failed write leaves neither half a file nor a stray temporary one.
"""
from __future__ import annotations

import argparse
import math
import os
import sys

from bench.host import envs
from bench import results
from bench.perf.echo import (CURVE_CONNECTIONS, KiB, METHOD_NOTES, curve_png, curve_table,
                             default_baseline, echo_tables, echo_units, idle_table, measure_idle,
                             run_echo_matrix)
from bench.report import html
from bench.errors import ExitCode, UsageError
from bench.perf.goals import (GOAL_ECHO_RUNTIMES, GOAL_MICRO_OPS, attach_instructions,
                              attach_opcodes, count_instructions, count_opcodes,
                              counting_config, evaluate_goals, goal_runtimes, goal_sections,
                              icount_missing, run_goals, unjudged_if_interrupted)
from bench.results.tables import plural
from bench.run.runner import default_out_dir
from bench.perf.loadgen import CLIENT_KINDS, load_client
from bench.perf.machine import (Interrupted, MeasureError, bench_runtime, check_stop, env_lines,
                           environment, progress, raise_nofile, run_interruptibly,
                           split_available, stop_on_signals)
from bench.perf.micro import MICRO_NOTES, MICRO_OPS, micro_supported, micro_table, run_micro_matrix
from bench import runtimes

__all__ = ["add_parser", "PRESETS", "parse_int_list", "check_output_file",
           "check_output_dir", "write_atomic"]

PRESETS = {
    # ~9 runtimes x 3 repeats x (startup + 1 s warm-up + 2 s) ~ 2 minutes
    "quick": {"sizes": [1 * KiB], "concurrency": [10], "duration": 2.0, "repeat": 3,
              "warmup": 1.0},
    "full": {"sizes": [1 * KiB, 10 * KiB, 100 * KiB], "concurrency": [1, 10, 100],
             "duration": 5.0, "repeat": 7, "warmup": 1.0},
}
_MODE_ALIASES = {"echo": "matrix"}
_TOP = "top_"      # dest prefix of the matrix options given to bare `bench`


# ---------------------------------------------------------------------------
# Checking values

def parse_int_list(text: str, what: str, allow_size: bool = False) -> list[int]:
    """``"1KiB,10k,512"`` -> ``[1024, 10240, 512]``; every entry must be >= 1."""
    out = []
    for token in (t.strip() for t in text.split(",")):
        if not token:
            continue
        t = token.lower().replace(" ", "")
        mult = 1
        if allow_size:
            for suffix, m in (("kib", KiB), ("k", KiB), ("mib", KiB * KiB), ("m", KiB * KiB),
                              ("b", 1)):
                if t.endswith(suffix):
                    t, mult = t[: -len(suffix)], m
                    break
        if not t.isdigit() or int(t) * mult < 1:
            hint = " (bytes, or with a KiB/MiB suffix: 1KiB,10KiB)" if allow_size else ""
            raise UsageError(f"bad {what} {token!r}: expected positive integers{hint}")
        out.append(int(t) * mult)
    if not out:
        raise UsageError(f"--{what} is empty")
    return out


def _at_least(value, floor, option: str, what: str):
    if value is None:
        return value
    if not math.isfinite(value):
        raise UsageError(f"{option} must be a finite number {what}, not {value}")
    if not value >= floor:
        raise UsageError(f"{option} must be {what}, not {value:g}")
    return value


def _shard(text: str | None) -> str | None:
    if text is None:
        return None
    i, sep, n = text.partition("/")
    if not (sep and i.strip().isdigit() and n.strip().isdigit()
            and 1 <= int(i) <= int(n)):
        raise UsageError(f"bad shard {text!r}: expected I/N with 1 <= I <= N, e.g. 2/4")
    return text


def _runtimes(text: str | None, default=None) -> list:
    rts = runtimes.parse_list(text, default)        # an unknown name: UsageError
    for rt in rts:
        envs.check_loop(rt)                          # a loop=MODULE:FACTORY to import: too
    return rts


# ---------------------------------------------------------------------------
# Output paths and atomic writes

def check_output_file(path: str, option: str = "--json") -> None:
    """A UsageError unless a file can be written at ``path`` (checked for real)."""
    results.check_output(path, option)


def check_output_dir(path: str, option: str = "--out") -> None:
    """A UsageError unless ``path`` is, or can become, a folder that takes files."""
    results.check_output(path, option, folder=True)


def _check_outputs(args) -> None:
    if hasattr(args, "out") and not args.out and not getattr(args, "json", None):
        # as `looplab run` does: what is measured is always kept somewhere, and said where
        args.out = default_out_dir()
        progress(f"looplab bench: no --out or --json given; writing to {args.out}")
    if getattr(args, "json", None):
        check_output_file(args.json, "--json")
    if getattr(args, "out", None):
        check_output_dir(args.out, "--out")


def write_atomic(path: str, data: bytes | str) -> None:
    """Write ``data`` through a temporary file beside ``path`` and a rename: a reader
    never sees half a file, and a failure leaves no temporary file behind."""
    results.write_bytes(path, data)


def _write_outputs(doc: dict, args, markdown: str, extra: dict | None = None) -> ExitCode:
    """--json FILE and --out DIR (results.json, results.csv, bench.md, ``extra`` and,
    last so that its links find them, report.html), each written atomically. An
    interrupted run's document says it is incomplete."""
    if (doc.get("config") or {}).get("interrupted"):
        doc.setdefault("incomplete", {"reason": "interrupted", "finished": len(doc["cells"])})
    written = []
    try:
        if getattr(args, "json", None):
            results.write_json(doc, args.json)
            written.append(args.json)
        if getattr(args, "out", None):
            for name in ("results.json", "results.csv"):
                path = os.path.join(args.out, name)
                (results.write_json if name.endswith("json") else results.write_csv)(doc, path)
                written.append(path)
            for name, data in {"bench.md": markdown, **(extra or {})}.items():
                results.write_bytes(os.path.join(args.out, name), data)
                written.append(os.path.join(args.out, name))
            written.append(html.write_html(doc, args.out))
    except OSError as exc:
        print(f"looplab bench: cannot write {exc.filename or args.out or args.json}: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return ExitCode.FAILED
    if written:
        progress("wrote " + ", ".join(written))
    return ExitCode.OK


def _markdown(title: str, env: dict, body: str, skipped: dict, notes: list[str]) -> str:
    lines = [f"# {title}", "", *env_lines(env), ""]
    if skipped:
        lines += ["Skipped (unavailable here):", *[f"- {k}: {v}" for k, v in skipped.items()], ""]
    lines += [body, ""]
    if notes:
        lines += ["Notes:", *[f"- {n}" for n in notes], ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Shared steps

def _available(rts) -> tuple[list, dict]:
    ok, skipped = split_available(rts)
    for spec, reason in skipped.items():
        progress(f"skipping {spec}: {reason}")
    if not ok:
        print("looplab bench: none of the requested runtimes is available here", file=sys.stderr)
    return ok, skipped


def _client(kind: str):
    try:
        return load_client(kind)
    except MeasureError as exc:
        print(f"looplab bench: {exc}", file=sys.stderr)
        return None


def _measure(fn, *a, **kw):
    """``(fn(...), False)``, or on SIGINT/SIGTERM ``(cells measured so far, True)``."""
    with stop_on_signals():
        try:
            return fn(*a, **kw), False
        except Interrupted as exc:
            progress("interrupted: keeping what was measured")
            return exc.cells, True


def _measure_plain(fn, *a, **kw):
    """``(fn(...), False)``, or on SIGINT/SIGTERM ``(None, True)``: for a step that
    adds to what was measured, whose part-way result is dropped."""
    with stop_on_signals():
        try:
            return fn(*a, **kw), False
        except KeyboardInterrupt:         # SIGINT/SIGTERM, or check_stop()
            progress("interrupted: keeping what was measured before this step")
            return None, True


def _finish(code: ExitCode, interrupted: bool, args, cells: list[dict]) -> ExitCode | None:
    """The exit code of an interrupted run (None when it ran to the end)."""
    if not interrupted:
        return None
    where = [p for p in (getattr(args, "json", None), getattr(args, "out", None)) if p]
    if code:
        kept = "and they could not be written"
    elif where:
        kept = "kept in " + " and ".join(where)
    else:
        kept = "printed above only (no --json or --out)"
    print(f"looplab bench: interrupted; {len(cells)} cell(s) with measurements {kept}",
          file=sys.stderr)
    return ExitCode.INTERRUPTED


def _no_measurement(cells: list[dict]) -> ExitCode:
    failed = [c["id"] for c in cells if c["errors"] and not c["repeats"]]
    if failed:
        print(f"looplab bench: {len(failed)} cell(s) produced no measurement: {', '.join(failed)}",
              file=sys.stderr)
        return ExitCode.FAILED
    return ExitCode.OK


def _echo_run(args, mode: str, title: str, sizes, concurrency, preset: str | None = None) -> ExitCode:
    """What matrix and curve share: everything checked, then measured, then written."""
    _at_least(args.duration, 1e-9, "--duration", "> 0")
    _at_least(args.warmup, 0, "--warmup", ">= 0")
    _at_least(args.repeat, 1, "--repeat", ">= 1")
    _at_least(args.sockbuf, 0, "--sockbuf", ">= 0 (0: the system default)")
    shard = _shard(args.shard)
    rts = _runtimes(args.runtimes)
    baseline = runtimes.parse(args.baseline or default_baseline()).spec
    _check_outputs(args)      # a user's mistake before anything is built (the C client)
    rts, skipped = _available(rts)
    if not rts:
        return ExitCode.ENVIRONMENT
    client = _client(args.client)
    if client is None:
        return ExitCode.ENVIRONMENT
    pinned = not args.no_pin
    if max(concurrency) > 400:
        warning = raise_nofile(2 * max(concurrency) + 256)[2]
        if warning:
            progress("WARNING: " + warning)
    units = echo_units(rts, sizes, concurrency, shard)
    if not units:
        progress("this shard has no cells to measure")
    est = len(units) * args.repeat * (args.duration + args.warmup + 0.8)
    progress(f"looplab bench {title}: {plural(len(units), 'cell')} x {plural(args.repeat, 'repeat')}, "
             f"~{est / 60:.1f} min; load client: {client[1]}")
    env = environment(client[1], pinned)      # before measuring: its load average is the start's
    cells, interrupted = _measure(run_echo_matrix, units, args.duration, args.warmup,
                                  args.repeat, client, pinned, sockbuf=args.sockbuf or None)
    config = {"mode": mode, "preset": preset, "sizes": sizes, "concurrency": concurrency,
              "duration": args.duration, "warmup": args.warmup, "repeat": args.repeat,
              "sockbuf": args.sockbuf, "baseline": baseline, "shard": shard, "skipped": skipped,
              "interrupted": interrupted}
    doc = results.new_document(cells, env=env, config=config)
    head = [curve_table(cells)] if mode == "curve" else []
    print("\n\n".join(head + [echo_tables(cells, baseline)]))
    body = "\n\n".join(([curve_table(cells, True)] if mode == "curve" else [])
                       + [echo_tables(cells, baseline, markdown=True)])
    extra = {}
    if mode == "curve" and args.out:
        png = curve_png(cells)
        if png is None:
            progress("matplotlib is not installed: no curve.png")
        else:
            extra["curve.png"] = png
    code = _write_outputs(doc, args, _markdown(f"looplab bench {title}", env, body, skipped,
                                               METHOD_NOTES), extra)
    return _finish(code, interrupted, args, cells) or code or _no_measurement(cells)


# ---------------------------------------------------------------------------
# The sub-commands

def cmd_matrix(args) -> ExitCode:
    if args.preset not in PRESETS:
        raise UsageError(f"unknown preset {args.preset!r}; choose {', '.join(PRESETS)}")
    preset = PRESETS[args.preset]
    for name in ("duration", "warmup", "repeat"):
        if getattr(args, name) is None:
            setattr(args, name, preset[name])
    sizes = (parse_int_list(args.sizes, "sizes", allow_size=True) if args.sizes
             else preset["sizes"])
    conc = parse_int_list(args.concurrency, "concurrency") if args.concurrency else preset["concurrency"]
    return _echo_run(args, "matrix", f"matrix ({args.preset})", sizes, conc, args.preset)


def cmd_curve(args) -> ExitCode:
    sizes = parse_int_list(args.size, "size", allow_size=True)
    if len(sizes) != 1:
        raise UsageError("--size takes one message size, e.g. 1KiB")
    conc = parse_int_list(args.concurrency, "concurrency")
    return _echo_run(args, "curve", "curve", sizes, conc)


def _count_goals(pythons, progress):
    """The goals' instruction counts, then their opcode breakdowns."""
    counts = count_instructions(pythons, progress)
    progress("counting Python opcodes by function (bench.perf.opcodes)")
    return counts, count_opcodes(pythons, progress)


def cmd_goals(args) -> ExitCode:
    _at_least(args.duration, 1e-9, "--duration", "> 0")
    _at_least(args.warmup, 0, "--warmup", ">= 0")
    _at_least(args.repeat, 1, "--repeat", ">= 1")
    _at_least(args.min_time, 1e-9, "--min-time", "> 0")
    pythons = _pythons(args.python)
    if args.cpu_only and args.instructions:
        raise UsageError("--cpu-only leaves out the instruction counts that --instructions asks "
                         "for: give one of them")
    # The kernel goals are judged on instruction counts: without valgrind there is no
    # verdict to give them, unless only the timed part is asked for.
    _check_outputs(args)      # a user's mistake before anything is built (the C client)
    missing = None if args.cpu_only else icount_missing()
    if missing:
        print(f"looplab bench goals: cannot count instructions: {missing}; --cpu-only "
              f"measures only the timed goals and the CPU ratios", file=sys.stderr)
        return ExitCode.ENVIRONMENT
    client = _client(args.client)
    if client is None:
        return ExitCode.ENVIRONMENT
    pinned = not args.no_pin
    progress(f"looplab bench goals: echo 1 KiB x 10 on {len(GOAL_ECHO_RUNTIMES)} runtimes and "
             f"micro {'/'.join(GOAL_MICRO_OPS)}, {args.repeat} round(s) each"
             + (f", on Python {', '.join(pythons)}" if args.python else "")
             + ("" if args.cpu_only else ", then instruction counts under callgrind"))
    env = environment(client[1], pinned)      # before measuring: its load average is the start's
    measured, interrupted = _measure(run_goals, args.repeat, args.duration, args.warmup,
                                     args.min_time, client, pinned, progress, pythons)
    if interrupted:
        cells, rows = measured, unjudged_if_interrupted(evaluate_goals(measured, pythons), True)
        skipped = split_available(goal_runtimes(pythons))[1]
    else:
        cells, rows, skipped = measured
    for spec, reason in skipped.items():
        progress(f"skipped {spec}: {reason}")
    # The counts come after the timed goals: stopping the counts keeps the timed run
    # whole (judged as it was), and the goals judged on instructions not measured.
    counting_stopped = False
    if not args.cpu_only and not interrupted:
        progress("counting instructions under callgrind (several minutes)")
        counted, counting_stopped = _measure_plain(_count_goals, pythons, progress)
        if counted is not None:
            attach_instructions(rows, counted[0])
            attach_opcodes(rows, counted[1])
    how = None if args.cpu_only else counting_config(pythons, counting_stopped)
    doc = results.new_document(cells, env=env, goals=rows, config={
        "mode": "goals", "repeat": args.repeat, "duration": args.duration,
        "warmup": args.warmup, "min_time": args.min_time, "skipped": skipped,
        "pythons": list(pythons), "interrupted": interrupted, "cpu_only": args.cpu_only,
        "instructions": how})
    echo = [c for c in cells if c["scenario"] == "echo"]
    micro = [c for c in cells if c["scenario"] == "micro"]
    print("\n\n".join([*goal_sections(rows, how, args.cpu_only),
                        *_echo_tables_by_python(echo, pythons), micro_table(micro)]))
    body = "\n\n".join([*goal_sections(rows, how, args.cpu_only, markdown=True),
                         *_echo_tables_by_python(echo, pythons, True), micro_table(micro, True)])
    code = _write_outputs(doc, args, _markdown("looplab bench goals", env, body, skipped,
                                               METHOD_NOTES + MICRO_NOTES))
    if code or interrupted:
        return _finish(code, interrupted, args, cells) or code
    if counting_stopped:
        print("looplab bench goals: interrupted while counting instructions; the timed goals "
              "are complete and written, the goals judged on instructions not measured",
              file=sys.stderr)
        return ExitCode.INTERRUPTED
    if args.fail and any(not r["status"].startswith("met") for r in rows):
        return ExitCode.FAILED
    return ExitCode.OK


def _echo_tables_by_python(echo: list[dict], pythons, markdown: bool = False) -> list[str]:
    """The echo tables once per interpreter, each against the baseline on that
    interpreter (``asyncio-protocol@3.13``): a ratio across interpreters is not one."""
    if pythons == (None,):
        return [echo_tables(echo, default_baseline(), markdown)]
    return [echo_tables([c for c in echo if c["runtime"].partition(":")[0].endswith("@" + p)],
                        runtimes.on_interpreter(default_baseline(), p), markdown) for p in pythons]


def _pythons(text) -> tuple:
    """``--python 3.12,3.13`` -> ("3.12", "3.13"), each checked as a spec's ``@`` is;
    no option -> (None,): the interpreter looplab runs in."""
    if text is None:
        return (None,)
    pythons = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    if not pythons:
        raise UsageError("--python needs interpreters, e.g. 3.11,3.12,3.13")
    for python in pythons:
        runtimes.parse(f"coro@{python}")        # a bad token is a UsageError here,
        envs.find(python)                       # and so is a Python that isn't here
    return pythons


def cmd_micro(args) -> ExitCode:
    _at_least(args.repeat, 1, "--repeat", ">= 1")
    _at_least(args.min_time, 1e-9, "--min-time", "> 0")
    ops = [o.strip() for o in args.ops.split(",") if o.strip()] if args.ops else list(MICRO_OPS)
    for op in ops:
        if op not in MICRO_OPS:
            raise UsageError(f"unknown micro-benchmark {op!r}; valid: {', '.join(MICRO_OPS)}")
    shard = _shard(args.shard)
    rts = _runtimes(args.runtimes)
    _check_outputs(args)      # checking creates nothing: an early exit leaves no folder
    rts, skipped = _available(rts)
    if not rts:
        return ExitCode.ENVIRONMENT
    pinned = not args.no_pin
    units = results.shard([(op, rt) for op in ops for rt in rts if micro_supported(op, rt)], shard)
    progress(f"looplab bench micro: {plural(len(units), 'cell')} x {plural(args.repeat, 'repeat')}, min time "
             f"{args.min_time} s per run")
    env = environment(None, pinned)           # before measuring: its load average is the start's
    cells, interrupted = _measure(run_micro_matrix, units, args.repeat, args.min_time, pinned)
    doc = results.new_document(cells, env=env, config={
        "mode": "micro", "ops": ops, "repeat": args.repeat, "min_time": args.min_time,
        "skipped": skipped, "shard": shard, "interrupted": interrupted})
    print(micro_table(cells))
    code = _write_outputs(doc, args, _markdown("looplab bench micro", env,
                                               micro_table(cells, True), skipped, MICRO_NOTES))
    return _finish(code, interrupted, args, cells) or code or _no_measurement(cells)


def _idle_cells(rts, n: int, repeat: int) -> list[dict]:
    measured = []           # (runtime, samples, errors), filled as measurements finish

    def measure_all():
        for rt in rts:
            samples: dict[str, list] = {}
            errors: list[str] = []
            measured.append((rt, samples, errors))
            for r in range(repeat):
                check_stop()
                progress(f"idle: {rt.spec}, {n} connections (round {r + 1}/{repeat})")
                try:
                    s = measure_idle(rt, n)
                except MeasureError as exc:
                    errors.append(str(exc))
                    progress(f"  FAILED: {exc}")
                    continue
                for k, v in s.items():
                    samples.setdefault(k, []).append(v)
                progress(f"  {s['rss_per_connection_bytes'] / 1024:.1f} KiB per connection")
    interrupted = run_interruptibly(measure_all)
    cells = [results.new_cell("idle", rt.spec, "naive", {"connections": n}, samples=samples,
                              errors=errors, details={"server_runtime": bench_runtime(rt).spec})
             for rt, samples, errors in measured if samples or errors or not interrupted]
    if interrupted:
        raise Interrupted(cells)
    return cells


def cmd_idle(args) -> ExitCode:
    _at_least(args.connections, 1, "--connections", ">= 1")
    _at_least(args.repeat, 1, "--repeat", ">= 1")
    rts = _runtimes(args.runtimes)
    _check_outputs(args)      # checking creates nothing: an early exit leaves no folder
    rts, skipped = _available(rts)
    if not rts:
        return ExitCode.ENVIRONMENT
    n = args.connections
    soft, hard, warning = raise_nofile(n + 256)
    notes = [f"RLIMIT_NOFILE: soft {soft}, hard {hard}"]
    if warning:
        n = max(1, soft - 256)
        warning += f"; measuring {n} connections instead"
        progress(f"WARNING: {warning}")
        notes.append(warning)
    env = environment(None, False)            # before measuring: its load average is the start's
    cells, interrupted = _measure(_idle_cells, rts, n, args.repeat)
    print(idle_table(cells))
    if warning:
        print(f"NOTE: {warning}")
    doc = results.new_document(cells, env=env, config={
        "mode": "idle", "connections": n, "repeat": args.repeat, "skipped": skipped,
        "rlimit_nofile": [soft, hard], "interrupted": interrupted})
    code = _write_outputs(doc, args, _markdown("looplab bench idle", env, idle_table(cells, True),
                                               skipped, notes))
    return _finish(code, interrupted, args, cells) or code or (
        ExitCode.FAILED if any(c["errors"] and not c["samples"] for c in cells) else ExitCode.OK)


_COMMANDS = {"matrix": cmd_matrix, "goals": cmd_goals, "micro": cmd_micro, "idle": cmd_idle,
             "curve": cmd_curve}


# ---------------------------------------------------------------------------
# The parser

def _one_line_error(message: str):
    print(f"looplab: {message}", file=sys.stderr)
    raise SystemExit(ExitCode.USAGE)


class _Options:
    """Adds options to one parser; for bare ``bench`` (``top``) they are the matrix's,
    stored under a prefixed name with no default, so ``bench --preset full goals`` is
    caught instead of silently ignored."""

    def __init__(self, parser, top: bool = False):
        self.parser, self.top = parser, top

    def __call__(self, *flags, **kw):
        if self.top:
            dest = kw.pop("dest", None) or flags[0].lstrip("-").replace("-", "_")
            kw.update(dest=_TOP + dest, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        self.parser.add_argument(*flags, **kw)


def _outputs(opt) -> None:
    opt("--json", default=None, metavar="FILE", help="write the results JSON to this file")
    opt("--out", default=None, metavar="DIR",
        help="write results.json, results.csv and bench.md into this folder")


def _echo_options(opt, *, repeat, duration) -> None:
    opt("--runtimes", default=None,
        help="comma list of runtime specs, or all/ours (default: all available)")
    opt("--duration", "--seconds", dest="duration", type=float, default=duration,
        help="counted seconds per run" + (f" (default {duration:g})" if duration else
                                          " (default: the preset's)"))
    opt("--warmup", type=float, default=None if duration is None else 1.0,
        help="uncounted seconds before each run (default 1)")
    opt("--repeat", type=int, default=repeat,
        help="runs per cell, interleaved in rounds" + (f" (default {repeat})" if repeat else
                                                      " (default: the preset's)"))
    opt("--baseline", default=None, help="runtime the ratios are taken against (default: the "
                                          "primary reference of our first kernel, asyncio-protocol)")
    opt("--shard", default=None, metavar="I/N", help="measure only the I-th of N slices of the cells")
    opt("--client", default="auto", choices=CLIENT_KINDS,
        help="load client: auto (C if a compiler works), c, python")
    opt("--sockbuf", type=int, default=0, metavar="BYTES",
        help="pin the server's SO_SNDBUF/SO_RCVBUF (default 0: the system's)")
    opt("--no-pin", action="store_true", help="do not pin server and client to CPUs")
    _outputs(opt)


def _matrix_options(opt) -> None:
    opt("--preset", default="quick",
        help="quick (1 KiB x 10 connections, 2-s runs, 3 repeats; ~2-3 min for all runtimes) "
             "or full (1/10/100 KiB x 1/10/100 connections, 5-s runs, 7 repeats)")
    opt("--sizes", default=None, help="message sizes, e.g. 1KiB,10KiB (plain numbers are bytes)")
    opt("--concurrency", default=None, help="connection counts, e.g. 1,10,100")
    _echo_options(opt, repeat=None, duration=None)


def _dispatch(matrix_parser):
    def run(args) -> ExitCode:
        mode = _MODE_ALIASES.get(args.bench_mode, args.bench_mode)
        given = {k[len(_TOP):]: v for k, v in vars(args).items() if k.startswith(_TOP)}
        if mode is None:
            merged = matrix_parser.parse_args([])
            for k, v in given.items():
                setattr(merged, k, v)
            return cmd_matrix(merged)
        if given:
            flags = ", ".join("--" + k.replace("_", "-") for k in given)
            raise UsageError(f"{flags} before `{mode}` would be ignored: options before a "
                             f"sub-command are `bench matrix` options; see `looplab bench "
                             f"{mode} --help` for its own")
        return _COMMANDS[mode](args)
    return run


def add_parser(subparsers) -> None:
    """Register ``bench`` and its sub-commands on the looplab command line."""
    fmt = argparse.RawDescriptionHelpFormatter
    p = subparsers.add_parser(
        "bench", help="performance: echo matrix, goals, micro-benchmarks, idle memory, curve",
        formatter_class=fmt,
        description="Performance measurements, each a sub-command with its own options "
                    "(`looplab bench SUB --help`). Progress goes to stderr, tables to stdout.\n"
                    "With no sub-command, `looplab bench [options]` runs `bench matrix` "
                    "with those options (e.g. `looplab bench --preset quick`).")
    _matrix_options(_Options(p, top=True))
    sub = p.add_subparsers(dest="bench_mode", metavar="SUB")

    m = sub.add_parser(
        "matrix", aliases=["echo"], formatter_class=fmt,
        help="echo throughput/latency: runtimes x message sizes x connections (the default)",
        description="Echo throughput and latency in uvloop's shape: a fresh `looplab serve "
                    "echo` process per measurement pinned to one CPU, a C epoll load client "
                    "on the other, runtimes interleaved in rounds whose order rotates, "
                    "medians with spreads and a ratio table against --baseline.")
    _matrix_options(_Options(m))

    g = sub.add_parser(
        "goals", formatter_class=fmt, help="exactly the measurements behind the performance goals",
        description="Echo 1 KiB x 10 connections on our kernels and their references (uvloop, "
                    "asyncio, curio, trio, our kernel as an asyncio loop), plus yield, "
                    "spawn+join and ping-pong on coro and curio. The kernel goals are judged on "
                    "instructions per request or operation under callgrind (needs valgrind; an "
                    "echo count three times, judged on the median ratio with its range, a "
                    "micro count once: it repeats exactly), each shown with "
                    "the Python opcodes by function of both sides and the timed CPU ratios as "
                    "information. The other goals are judged on the median of per-round paired "
                    "ratios and shown with their range; echo rows give the req/s ratio, the "
                    "server-CPU-per-request ratio and the same without system time side by "
                    "side, and each CPU goal not met gets a line saying what user time per "
                    "request it would need.")
    go = _Options(g)
    go("--repeat", type=int, default=5, help="paired rounds (default 5; the goals quote 7)")
    go("--python", default=None, metavar="VERSIONS",
       help="comma list of interpreters (3.11,3.12,3.13 or paths): every goal is measured "
            "and judged on each, against the reference on the same interpreter (default: "
            "the one looplab runs in)")
    go("--duration", "--seconds", dest="duration", type=float, default=2.0,
       help="counted seconds per echo run (default 2)")
    go("--warmup", type=float, default=1.0, help="uncounted seconds before each echo run (default 1)")
    go("--min-time", type=float, default=0.3, help="least seconds per timed micro run (default 0.3)")
    go("--client", default="auto", choices=CLIENT_KINDS,
       help="load client: auto (C if a compiler works), c, python")
    go("--no-pin", action="store_true", help="do not pin server and client to CPUs")
    go("--fail", action="store_true", help="exit 1 when a goal is not met")
    go("--instructions", action="store_true",
       help="count instructions (the default, kept for the scripts that ask for it): the "
            "kernel goals are judged on instructions per request or operation under "
            "callgrind (needs valgrind), each with its opcode breakdown by function")
    go("--cpu-only", action="store_true",
       help="measure only the timed goals and the CPU ratios, without valgrind: the goals "
            "judged on instructions are then not measured")
    _outputs(go)

    mi = sub.add_parser(
        "micro", formatter_class=fmt, help="spawn+join, yield, ping-pong, timers, chained_spawn, yield_many, "
                         "many_timers per runtime",
        description="Micro-benchmarks, each in a fresh worker process pinned to one CPU; the "
                    "operation count grows until one run lasts --min-time (the shorter runs "
                    "before it are the warm-up). spawn_join and tokio's scheduler benchmarks "
                    "(chained_spawn, yield_many, many_timers) apply to the stream and task "
                    "ports only.")
    mo = _Options(mi)
    mo("--runtimes", default=None, help="comma list of runtime specs (default: all available)")
    mo("--ops", default=None, help=f"comma list of {','.join(MICRO_OPS)} (default: all)")
    mo("--repeat", type=int, default=3, help="rounds per cell (default 3)")
    mo("--min-time", type=float, default=0.2, help="least seconds per timed run (default 0.2)")
    mo("--shard", default=None, metavar="I/N", help="measure only the I-th of N slices of the cells")
    mo("--no-pin", action="store_true", help="do not pin the workers to a CPU")
    _outputs(mo)

    i = sub.add_parser(
        "idle", formatter_class=fmt, help="server memory per idle connection",
        description="Open --connections idle connections to a fresh echo server (one 1-byte "
                    "round trip each, so the server has set it up) and report the server's "
                    "RSS growth per connection. The soft RLIMIT_NOFILE is raised to the hard "
                    "limit; when that is too low, fewer connections are measured and the "
                    "results say so.")
    io_ = _Options(i)
    io_("--runtimes", default=None, help="comma list of runtime specs (default: all available)")
    io_("--connections", type=int, default=10000, help="idle connections to open (default 10000)")
    io_("--repeat", type=int, default=1, help="measurements per runtime (default 1)")
    _outputs(io_)

    c = sub.add_parser(
        "curve", formatter_class=fmt, help="echo throughput over 1..1000 connections",
        description="Echo requests/s of one message size over a range of connection counts, "
                    "to find where a runtime falls off; with --out, also curve.png "
                    "(needs matplotlib).")
    co = _Options(c)
    co("--concurrency", default=",".join(map(str, CURVE_CONNECTIONS)),
       help=f"connection counts (default {','.join(map(str, CURVE_CONNECTIONS))})")
    co("--size", default="1KiB", help="message size (default 1KiB)")
    _echo_options(co, repeat=3, duration=2.0)

    run = _dispatch(m)
    for parser in (p, m, g, mi, i, c):
        parser.error = _one_line_error
        parser.set_defaults(func=run)
