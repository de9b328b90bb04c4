"""``looplab check APP``: backpressure, fairness, shutdown and faults, asked of your server.

APP is ``module:NAME`` or ``path/to/file.py:NAME`` (an aiohttp Application, an ASGI app,
or a factory of either or of an asyncio server), or ``-- COMMAND ...`` with ``{port}``
for any server process. Everything a user can get wrong is checked before anything is
measured (one line, exit 2; a missing library, exit 3); then each loop x network is one
run of the questions (``bench.check.session``), the advice searches knob settings for
what failed (``bench.check.advice``), and the report folder gets results.json and
report.html (``bench.check.report``). docs/check.md is the user's page.

Exit codes: 0 done (whatever the verdicts), 1 with ``--fail-on verdict`` when a verdict
does not hold (not measured included) or when nothing at all was measured, 2 a user
mistake, 3 a missing library, 130 interrupted (what was measured is written first).
"""
from __future__ import annotations

import argparse
import os
import signal
import sys

from bench.errors import ExitCode, Unavailable, UsageError

__all__ = ["add_parser", "run"]

QUESTIONS = ("backpressure", "fairness", "shutdown", "faults")
DEFAULT_OUT = "looplab-check"


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "check", help="ask your server the questions: backpressure, fairness, shutdown, faults",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Drive YOUR server with looplab's peers and answer, with evidence: does a "
                    "slow client cost memory without bound (backpressure), do healthy clients "
                    "suffer beside it (fairness), does a response in flight survive the stop "
                    "(shutdown), does it survive faulty peers (faults). For a verdict that "
                    "fails, search the knobs for the smallest setting that fixes it (advice).",
        epilog="examples:\n"
               "  looplab check examples/check/push_aiohttp.py:naive --path /feed --ws /ws\n"
               "  looplab check myapp:app --asgi --path /export --loop uvloop --net both\n"
               "  looplab check mypkg.server:make_server --send 'GET 65536\\n::65536'\n"
               "  looplab check --send 'GET 100\\n' -- python server.py --port {port}\n"
               "APP is module:NAME or path/to/file.py:NAME; a command comes after --.")
    p.add_argument("app", nargs="*", metavar="APP | -- COMMAND",
                   help="module:NAME or file.py:NAME, or after -- a server command with {port}")
    p.add_argument("--asgi", action="store_true",
                   help="serve APP with uvicorn as an ASGI app (detected when it looks like one)")
    p.add_argument("--path", action="append", default=[], metavar="/PATH",
                   help="an HTTP endpoint: GET PATH (repeatable)")
    p.add_argument("--ws", action="append", default=[], metavar="/PATH",
                   help="a WebSocket endpoint (repeatable)")
    p.add_argument("--send", action="append", default=[], metavar="TEXT[::N]",
                   help="a raw endpoint: send TEXT (\\n, \\r\\n, \\xNN escapes); ::N declares an "
                        "N-byte answer (repeatable)")
    p.add_argument("--shutdown", default=None, metavar="ENDPOINT",
                   help="the answer in flight at the stop: /PATH, ws:/PATH or raw:TEXT::N "
                        "(default: the first endpoint whose answer declares its size)")
    p.add_argument("--healthy", default=None, metavar="ENDPOINT",
                   help="what healthy clients ask for (default: the endpoint under test): "
                        "/PATH, ws:/PATH or raw:TEXT::N")
    p.add_argument("--questions", default=",".join(QUESTIONS), metavar="A,B",
                   help=f"which questions (default all: {', '.join(QUESTIONS)})")
    p.add_argument("--loop", action="append", default=[], metavar="LOOP",
                   help="in-process apps: asyncio (default), uvloop, rloop, looplab[:KNOB=V,...] "
                        "or MODULE:FACTORY (repeatable: one run each)")
    p.add_argument("--net", choices=("real", "sim", "both"), default="real",
                   help="real sockets (default), the simulated network (in-process apps on "
                        "asyncio or looplab's loop), or both")
    p.add_argument("--seed", type=int, default=0, help="the simulated network's seed (default 0)")
    p.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE", dest="knobs",
                   help="apply a knob: app.PARAM (a factory's keyword), aiohttp.heartbeat, "
                        "uvicorn.timeout_graceful_shutdown, ... (repeatable)")
    p.add_argument("--advise", action="append", default=[], metavar="KNOB[=V1,V2]",
                   help="the knobs (and values) the advice tries (default: those that apply)")
    p.add_argument("--no-advice", action="store_true", dest="no_advice",
                   help="report the verdicts only; search no fix")
    p.add_argument("--budget-mb", type=float, default=1.0, dest="budget_mb",
                   help="memory a slow client may cost the server, in MB (default 1)")
    p.add_argument("--latency-factor", type=float, default=3.0, dest="latency_factor",
                   help="how much worse healthy p99 may get beside slow clients (default 3)")
    p.add_argument("--slow-rate", default="16KiB", dest="slow_rate",
                   help="bytes/s a slow client reads (0: never reads; default 16KiB)")
    p.add_argument("--preset", choices=("small", "default"), default="default",
                   help="phase lengths and client counts (small: quick, for tests)")
    p.add_argument("--window", type=float, default=None,
                   help="seconds slow clients are held (default: the preset's)")
    p.add_argument("--grace", type=float, default=None,
                   help="seconds the server may take to stop (default: the preset's)")
    p.add_argument("--port", type=int, default=None,
                   help="the port to listen on (default: a free one)")
    p.add_argument("--sockbuf", default="64KiB",
                   help="in-process apps: SO_SNDBUF/SO_RCVBUF of accepted sockets (default 64KiB; "
                        "'os' leaves the kernel's autotuning, which hides megabytes)")
    p.add_argument("--start-timeout", type=float, default=10.0, dest="start_timeout",
                   help="seconds a command may take to listen (default 10)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help=f"report folder: results.json, report.html (default {DEFAULT_OUT})")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the results here")
    p.add_argument("--fail-on", choices=["verdict"], default=None, dest="fail_on",
                   help="exit 1 unless every verdict holds")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=run)


# ---------------------------------------------------------------------------
# Everything checked before anything runs

def _seconds(name, v, low=0.05, high=600.0):
    if v is not None and not low <= v <= high:
        raise UsageError(f"--{name} must be seconds in [{low:g}, {high:g}], got {v:g}")


def plan(args):
    """The jobs, the advice's knobs and the output paths; raises on any mistake."""
    from bench import results as resmod
    from bench.check import host as hostmod
    from bench.check import questions as qs
    from bench.check import target as tg
    from bench.check.session import Job
    from kernels.options import nbytes

    asked = tuple(q.strip() for q in args.questions.split(",") if q.strip())
    bad = [q for q in asked if q not in QUESTIONS]
    if bad or not asked:
        raise UsageError(f"--questions: unknown {bad[0] if bad else 'empty list'}; "
                         f"valid: {', '.join(QUESTIONS)}")
    if not 0 < args.budget_mb <= 1 << 20:
        raise UsageError(f"--budget-mb must be > 0, got {args.budget_mb:g}")
    if not 1 <= args.latency_factor <= 1000:
        raise UsageError(f"--latency-factor must be in [1, 1000], got {args.latency_factor:g}")
    for name in ("window", "grace", "start_timeout"):
        _seconds(name.replace("_", "-"), getattr(args, name))
    try:
        slow_rate = nbytes(args.slow_rate)
        sockbuf = None if args.sockbuf == "os" else nbytes(args.sockbuf)
    except ValueError as exc:
        raise UsageError(f"--slow-rate/--sockbuf: {exc}") from None
    if sockbuf is not None and not 4096 <= sockbuf <= 64 << 20:
        raise UsageError(f"--sockbuf must be 4KiB..64MiB or 'os', got {args.sockbuf}")
    if args.port is not None and not 1 <= args.port <= 65535:
        raise UsageError(f"--port must be 1..65535, got {args.port}")

    words = list(args.app)
    if not words:
        raise UsageError("give the app (module:NAME or file.py:NAME) or, after --, a server "
                         "command with {port}")
    command = app = None
    if len(words) == 1 and ":" in words[0] and "{port}" not in words[0]:
        app = tg.AppRef(words[0], args.asgi)
        obj = tg.load_object(app.ref)
        kind = tg.kind_of(obj, args.asgi)
        params = tg.factory_params(obj) if kind == "factory" else {}
        if args.asgi:
            kind = "asgi"          # a factory of one, or one: served by uvicorn either way
        missing = hostmod.framework_missing(kind)
        if missing:
            raise Unavailable(f"{app.ref} is {'an' if kind == 'aiohttp' else 'an ASGI'} app and "
                              f"{missing}")
    else:
        command = tg.Command(tuple(words))
        kind, params = "command", {}
        if args.asgi:
            raise UsageError("--asgi is for an in-process APP, not a command")
        if not command.has_port and args.port is None:
            raise UsageError("the command must listen on {port} (put {port} in it) or give --port N")
    if args.port is not None:
        from bench.check.drive import port_free
        if not port_free(args.port):
            raise UsageError(f"--port {args.port}: the port is in use")

    endpoints = ([tg.parse_endpoint("http", t, "--path") for t in args.path]
                 + [tg.parse_endpoint("ws", t, "--ws") for t in args.ws]
                 + [tg.parse_endpoint("raw", t, "--send") for t in args.send])
    shutdown_ep = tg.parse_endpoint("any", args.shutdown, "--shutdown") if args.shutdown else None
    healthy_ep = tg.parse_endpoint("any", args.healthy, "--healthy") if args.healthy else None
    if not endpoints and ({"backpressure", "fairness"} & set(asked)
                          or ("faults" in asked and shutdown_ep is None)
                          or ("shutdown" in asked and shutdown_ep is None)):
        raise UsageError("name an endpoint: --path /PATH, --ws /PATH or --send 'TEXT' (the "
                         "requests a client of your server makes)")

    loops = [tg.parse_loop(t) for t in args.loop] or ([tg.LoopChoice()] if command is None else [])
    if command is not None and args.loop:
        raise UsageError("--loop is for an in-process APP; a command runs its own loop")
    nets = ("real", "sim") if args.net == "both" else (args.net,)
    if "sim" in nets:
        if command is not None:
            raise UsageError("--net sim needs an in-process APP: a command's sockets are the "
                             "real network's")
        for lp in loops:
            if not lp.sim_capable:
                raise UsageError(f"--loop {lp.label} runs on real sockets only; on the simulated "
                                 "network use asyncio or looplab")
    knobs = tg.parse_knobs(args.knobs, kind, params, loops[0] if loops else None)
    ladders = [] if args.no_advice else [
        tg.parse_ladder(t, kind, params, loops[0] if loops else None) for t in args.advise]
    if args.no_advice and args.advise:
        raise UsageError("--advise and --no-advice do not go together")

    base = qs.PRESETS[args.preset]
    changes = {"budget_bytes": int(args.budget_mb * 1_000_000),
               "latency_factor": args.latency_factor, "slow_rate_Bps": float(slow_rate)}
    if args.window is not None:
        changes["window_s"] = args.window
    if args.grace is not None:
        changes["grace_s"] = args.grace
    the_plan = qs.smaller(base, **changes)
    # the output last: a mistake above leaves no empty folder behind
    out_dir = resmod.check_output(args.out or DEFAULT_OUT, "--out", folder=True)
    json_path = resmod.check_output(args.json, "--json") if args.json else None
    jobs = []
    for net in nets:
        for lp in (loops or [None]):
            jobs.append(Job(app, command, kind, lp, net, tuple(endpoints), the_plan, asked,
                            knobs=knobs, shutdown_endpoint=shutdown_ep,
                            healthy_endpoint=healthy_ep, port=args.port,
                            sockbuf=sockbuf, seed=args.seed, start_timeout_s=args.start_timeout))
    return {"jobs": jobs, "out": out_dir, "json": json_path, "ladders": ladders,
            "params": params, "kind": kind}


# ---------------------------------------------------------------------------
# The verb

class _Terminated(Exception):
    pass


def run(args) -> ExitCode:
    the = plan(args)
    log = None if args.quiet else (lambda line: print(f"check: {line}", file=sys.__stderr__,
                                                      flush=True))

    def on_term(signum, frame):
        raise KeyboardInterrupt
    old = signal.signal(signal.SIGTERM, on_term)
    try:
        return _run(args, the, log)
    finally:
        signal.signal(signal.SIGTERM, old)


def _run(args, the, log) -> ExitCode:
    from bench.check import advice as advmod
    from bench.check import report as rep
    from bench.check.drive import StartFailed
    from bench.check.session import run_job
    cells, interrupted = [], None
    for job in the["jobs"]:
        answers: dict = {}
        if log:
            log(f"{job.label} on {job.where}, {job.net} network")
        try:
            run_job(job, answers, log)
        except StartFailed as exc:
            if cells:            # a later run's server failed: keep what was measured
                print(f"looplab check: {exc}", file=sys.stderr)
                continue
            raise UsageError(str(exc)) from None
        except KeyboardInterrupt:
            interrupted = job
            cells.append(rep.new_cell(job.label, job.where, job.net, answers, kind=job.kind,
                                      seed=job.seed, interrupted=True))
            break
        advice = []
        try:
            if not args.no_advice:
                advice = _advice(job, answers, the, log, advmod)
        except KeyboardInterrupt:
            interrupted = job
        cells.append(rep.new_cell(job.label, job.where, job.net, answers, kind=job.kind,
                                  seed=job.seed, advice=advice, interrupted=interrupted is job))
        if interrupted:
            break
    incomplete = None
    if interrupted is not None:
        incomplete = {"reason": "interrupted", "finished": len(cells) - 1,
                      "planned": len(the["jobs"])}
    doc = rep.document(cells, _config(the), incomplete)
    _write(doc, the)
    if interrupted is not None:
        print(f"looplab check: interrupted; what was measured is in "
              f"{os.path.join(the['out'], 'results.json')}", file=sys.stderr)
        return ExitCode.INTERRUPTED
    print(rep.terminal(doc))
    print(f"\nreport: {os.path.join(the['out'], 'report.html')} (results.json beside it)")
    verdicts = [v for c in doc["cells"] for v in c["verdicts"].values()]
    if not any(v is not None for v in verdicts):
        print("looplab check: nothing was measured (see the reasons above)", file=sys.stderr)
        return ExitCode.FAILED
    if args.fail_on == "verdict":
        failed = [f"{c['runtime']} {c['params']['net']}: {q}" for c in doc["cells"]
                  for q, v in c["verdicts"].items() if v is not True]
        if failed:
            print(f"looplab: {len(failed)} verdict(s) do not hold: {', '.join(failed[:6])}",
                  file=sys.stderr)
            return ExitCode.FAILED
    return ExitCode.OK


def _config(the) -> dict:
    from dataclasses import asdict
    job = the["jobs"][0]
    return {"app": job.label, "kind": job.kind, "questions": list(job.questions),
            "endpoints": [e.to_data() for e in job.endpoints],
            "plan": asdict(job.plan), "knobs": job.knobs}


def _write(doc, the) -> None:
    from bench import results as resmod
    from bench.report import render
    render.write_report(doc, the["out"])
    if the["json"]:
        resmod.write_json(doc, the["json"])


def _advice(job, answers, the, log, advmod) -> list:
    from bench.check.session import run_job
    out = []
    for question in ("backpressure", "shutdown", "fairness"):
        a = answers.get(question)
        if a is None or a.verdict is not False:
            continue
        if job.command is not None:
            out.append({"question": question, "setting": None,
                        "text": "a command's knobs are out of reach: run the app in-process "
                                "(module:NAME) to have settings searched"})
            continue
        tries = advmod.candidates(question, job.kind, the["params"], job.loop,
                                  job.endpoints, the["ladders"])
        asked = ("backpressure", "fairness") if question == "backpressure" else (question,)

        def trial(name, value, asked=asked):
            got: dict = {}
            try:
                run_job(job.with_knob(name, value), got, None, questions=asked)
            except Exception as exc:     # noqa: BLE001 -- a setting the app refuses: data
                from bench.check.questions import Answer
                got = {q: Answer(None, reason=f"{name}={value}: {exc}") for q in asked}
            return got
        out.append(advmod.search(question, answers, tries, trial, job.plan, log))
    return out
