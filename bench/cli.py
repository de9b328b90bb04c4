"""The ``looplab`` command line (also ``python -m bench``).

Verbs: (none) the main report, ``list``, ``run``, ``serve``, ``bench``, ``compare``,
``merge``, ``trace``. Exit codes: 0 ok, 1 a verdict or regression check failed,
2 usage error, 3 environment missing. A user mistake is one line on stderr, never a
traceback.
"""
from __future__ import annotations

import argparse
import errno
import os
import signal
import sys

import kernels

kernels.check_ours(kernels)

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_ENV = 0, 1, 2, 3
APPS = ("echo", "sink", "proxy", "reqresp", "push")


class Usage(Exception):
    """A user error: printed as one line, exit code 2."""


def _addr(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not (0 <= int(port) <= 65535):
        raise Usage(f"bad address {text!r}: expected HOST:PORT, e.g. 127.0.0.1:9000")
    return host or "127.0.0.1", int(port)


def _variants_for(app: str) -> tuple[str, ...]:
    from protocols import callback, stream, task
    seen: list[str] = []
    for mod in (callback, stream, task):
        for v in mod.VARIANTS[app]:
            if v not in seen:
                seen.append(v)
    return tuple(seen)


# ---------------------------------------------------------------------------
# list

def cmd_list(args) -> int:
    from protocols import runtimes
    what = args.what
    if what == "runtimes":
        for info in runtimes.RUNTIMES.values():
            rt = runtimes.parse(info.id)
            reason = rt.unavailable_reason()
            status = "available" if reason is None else f"UNAVAILABLE: {reason}"
            ref = f" (compare with {', '.join(info.compared_with)})" if info.compared_with else ""
            print(f"{info.id:18} {info.style:8} {info.summary}{ref} -- {status}")
            for opt in info.options:
                print(f"    {opt.describe()}")
        return EXIT_OK
    if what == "scenarios":
        from bench import scenarios
        for sc in scenarios.SCENARIOS.values():
            print(f"{sc.id:4} {sc.title}  [variants: {', '.join(sc.variants)}]")
        return EXIT_OK
    if what == "cells":
        from bench import scenarios
        for cell in scenarios.plan(args.scenarios, args.runtimes, args.variants, args.preset):
            print(cell.id)
        return EXIT_OK
    if what == "apps":
        for app in APPS:
            print(f"{app:8} variants: {', '.join(_variants_for(app))}")
        return EXIT_OK
    raise Usage(f"unknown list {what!r}; choose runtimes, scenarios, cells or apps")


# ---------------------------------------------------------------------------
# serve

def _sigterm_as_sigint(signum, frame):
    # Re-deliver as SIGINT so every runtime ends the way it ends on Ctrl-C (trio
    # installs its own SIGINT handling; raising KeyboardInterrupt from here would
    # land at an arbitrary point inside its run loop).
    os.kill(os.getpid(), signal.SIGINT)


def cmd_serve(args) -> int:
    from protocols import runtimes
    rt = runtimes.parse(args.runtime)
    reason = rt.unavailable_reason()
    if reason:
        print(f"looplab serve: runtime {rt.id} is unavailable: {reason}", file=sys.stderr)
        return EXIT_ENV
    variants = _variants_for(args.app)
    if args.variant not in variants:
        raise Usage(f"unknown variant {args.variant!r} for {args.app}; valid: {', '.join(variants)}")
    if args.app == "proxy" and not args.upstream:
        raise Usage("serve proxy needs --upstream HOST:PORT")
    host, port = _addr(args.listen)
    params = {"sockbuf": args.sockbuf, "forever": args.forever, "two_way": args.two_way,
              "response_bytes": args.response_bytes, "frame_bytes": args.frame_bytes}
    if args.upstream:
        params["upstream"] = _addr(args.upstream)
    try:
        sock = runtimes.bind_listener(host, port, sockbuf=args.sockbuf)
    except OSError as exc:
        what = "port in use" if exc.errno == errno.EADDRINUSE else exc.strerror
        print(f"looplab serve: cannot listen on {host}:{port}: {what}", file=sys.stderr)
        return EXIT_USAGE
    h, p = sock.getsockname()[:2]
    print(f"listening on {h}:{p}", flush=True)
    if rt.style == "task" and args.variant in ("naive", "fixed"):
        print("note: on the task port naive and fixed are the same code", file=sys.stderr)
    driver = _driver(rt.style)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:   # started with SIGINT ignored (nohup, &)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _sigterm_as_sigint)
    port_obj = rt.open()
    try:
        try:
            driver.serve(port_obj, args.app, sock, args.variant, params)
        except* KeyboardInterrupt:   # trio delivers it inside an exception group
            pass
    finally:
        port_obj.close()
        sock.close()
    return EXIT_OK


def cmd_run(args) -> int:
    from bench import report, scenarios
    cells = scenarios.plan(args.scenarios, args.runtimes, args.variants, args.preset, args.repeat)
    if args.shard:
        from bench import results
        cells = results.shard(cells, args.shard)
    if not cells:
        raise Usage("the matrix is empty: no cell matches those scenarios, runtimes and variants")
    print(f"looplab run: {len(cells)} cells", file=sys.stderr)
    return report.run_and_report(cells, args.out, args.json, args.jobs)


def cmd_trace(args) -> int:
    """Run one server cell with tracing on and write Chrome trace-event JSON."""
    import os
    from bench import scenarios
    from protocols import runtimes
    if args.scenario not in scenarios.TRACEABLE:
        raise Usage(f"trace works on the server scenarios {', '.join(scenarios.TRACEABLE)}, "
                    f"not {args.scenario!r}")
    rt = runtimes.parse(args.runtime)
    if not rt.ours:
        raise Usage(f"tracing needs one of our kernels (callback, hybrid, coro); {rt.id} is a "
                    "reference library whose internals we only see through public APIs")
    spec = rt.spec + ("," if ":" in rt.spec else ":") + "trace=true"
    cells = scenarios.plan(args.scenario, spec, args.variant, args.preset)
    if not cells:
        raise Usage(f"no cell for {args.scenario} {rt.id} {args.variant}")
    cell = cells[0]
    cell.params["trace_path"] = os.path.abspath(args.out)
    result = scenarios.run_cell(cell)
    if result["errors"] or not os.path.exists(args.out):
        print(f"looplab trace: the cell failed: {'; '.join(result['errors']) or 'no trace written'}",
              file=sys.stderr)
        return EXIT_FAILED
    print(f"trace: {args.out} (open it in https://ui.perfetto.dev or chrome://tracing)")
    return EXIT_OK


def _driver(style: str):
    from protocols import callback, stream, task
    return {"callback": callback, "stream": stream, "task": task}[style]


# ---------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="looplab",
        description="Event-loop laboratory: backpressure, causality and shutdown data loss "
                    "measured side by side on our callback/hybrid/coro kernels and on asyncio, "
                    "uvloop, trio and curio. With no verb: the main report (S1, S3, S4, S5, S6 "
                    "at the quick preset on every available runtime).")
    p.add_argument("--out", default="looplab-report", help="report folder for the main job")
    sub = p.add_subparsers(dest="verb", metavar="VERB")

    ls = sub.add_parser("list", help="what exists: runtimes, scenarios, cells, apps")
    ls.add_argument("what", choices=["runtimes", "scenarios", "cells", "apps"])
    ls.add_argument("--scenarios", default=None, help="for cells: comma list (default: all)")
    ls.add_argument("--runtimes", default=None, help="for cells: comma list of runtime specs")
    ls.add_argument("--variants", default=None, help="for cells: comma list")
    ls.add_argument("--preset", default="quick", help="for cells: quick|blog")
    ls.set_defaults(fn=cmd_list)

    rn = sub.add_parser("run", help="run a matrix of scenarios x runtimes x variants",
                        description="Run a matrix; each cell in its own process, peers in another. "
                        "A crashing or hanging cell is recorded and the matrix goes on. Ctrl-C keeps "
                        "the finished cells.")
    rn.add_argument("--scenarios", default=None, help="comma list, e.g. S1,S3 (default: all)")
    rn.add_argument("--runtimes", default=None,
                    help="comma list of runtime specs, e.g. callback,asyncio-protocol or "
                         "coro:ready_order=random-7; 'all', 'ours' (default: all)")
    rn.add_argument("--variants", default=None, help="comma list, e.g. naive,fixed (default: all)")
    rn.add_argument("--preset", default="quick", help="quick (small, CI-sized) or blog (the post's scale)")
    rn.add_argument("--repeat", type=int, default=1, help="repeats per cell; racy outcomes become frequencies")
    rn.add_argument("--out", default=None, metavar="DIR", help="write report.md, results.json/csv and plots")
    rn.add_argument("--json", default=None, metavar="PATH", help="write the results JSON here")
    rn.add_argument("--shard", default=None, metavar="I/N", help="run only shard I of N (merge with looplab merge)")
    rn.add_argument("--jobs", type=int, default=1, help="cells run at once (default 1)")
    rn.set_defaults(fn=cmd_run)

    tr = sub.add_parser("trace", help="write a Chrome trace of one cell (Perfetto opens it)",
                        description="Run one server-scenario cell (S1, S5, S6) on one of our kernels "
                        "with trace=true and write Chrome trace-event JSON: a track per task or "
                        "connection, buffer-size counters, flow arrows from wake-up to step.")
    tr.add_argument("scenario", help="S1, S5 or S6")
    tr.add_argument("--runtime", required=True, help="callback, hybrid or coro (with options)")
    tr.add_argument("--variant", default="naive")
    tr.add_argument("--preset", default="quick")
    tr.add_argument("--out", default="trace.json", help="output path (default trace.json)")
    tr.set_defaults(fn=cmd_trace)

    sv = sub.add_parser("serve", help="run one app as a plain server for outside clients",
                        description="Run one app on one runtime. With port 0 the first stdout "
                        "line is 'listening on HOST:PORT'. SIGINT/SIGTERM end it with exit 0. "
                        "The proxy serves one connection then exits, as in the 2016 post, unless "
                        "--forever. On the task port (coro, trio, curio) naive and fixed are the "
                        "same code: send_all blocks, so there is nothing to fix.")
    sv.add_argument("app", choices=APPS)
    sv.add_argument("--runtime", required=True, help="runtime spec, e.g. coro or callback:write=defer")
    sv.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT (default 127.0.0.1:0)")
    sv.add_argument("--upstream", default=None, help="HOST:PORT for the proxy")
    sv.add_argument("--variant", default="naive", help="naive|fixed (push: unbounded|block|drop|disconnect)")
    sv.add_argument("--sockbuf", type=int, default=None, metavar="BYTES",
                    help="pin SO_SNDBUF/SO_RCVBUF on every socket it opens")
    sv.add_argument("--forever", action="store_true", help="proxy: keep serving after the first connection")
    sv.add_argument("--two-way", action="store_true", help="proxy: relay both ways, propagating half-close")
    sv.add_argument("--response-bytes", type=int, default=65536, help="reqresp: bytes per response")
    sv.add_argument("--frame-bytes", type=int, default=None,
                    help="sink: check fixed-size looplab frames of this size; a malformed stream "
                         "closes that connection only")
    sv.set_defaults(fn=cmd_serve)

    from bench import benchverb, results
    benchverb.add_parser(sub)  # bench
    results.register(sub)     # compare, merge
    return p


def main(argv=None) -> int:
    parser = build_parser()

    def usage_error(message):
        print(f"looplab: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)
    parser.error = usage_error
    for action in parser._subparsers._group_actions if parser._subparsers else []:
        for sp in action.choices.values():
            sp.error = usage_error
    args = parser.parse_args(argv)
    from protocols.runtimes import Unavailable, UsageError
    try:
        if args.verb is None:
            from bench import report
            return report.main_job(args)
        return args.fn(args)
    except (Usage, UsageError) as exc:
        print(f"looplab: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Unavailable as exc:
        print(f"looplab: {exc}", file=sys.stderr)
        return EXIT_ENV
    except KeyboardInterrupt:
        print("looplab: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:      # `looplab list runtimes | head`
        sys.stderr.close()
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
