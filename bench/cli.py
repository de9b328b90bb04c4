"""The ``looplab`` command line (also ``python -m bench``): a parser built from the verb
modules, and the one place errors become exit codes.

Each module in ``VERB_MODULES`` exposes ``add_parser(subparsers)``, which adds its
sub-parsers; each sub-parser sets ``func(args) -> ExitCode``. Exit codes are
``bench.errors.ExitCode``: 0 ok, 1 a verdict, gate or cell failed, 2 a user mistake
(``UsageError``: one line on stderr, never a traceback), 3 a library this needs is
missing here (``Unavailable``), 130 interrupted. Nothing imports this module.
"""
from __future__ import annotations

import argparse
import select
import sys

import kernels
from bench.verbs import check as check_verbs
from bench.verbs import faults
from bench.verbs import benchmark as bench_verbs
from bench.errors import ExitCode, Unavailable, UsageError
from bench.explore import verb as explore_verb
from bench.results import VERSION
from bench.verbs import env as env_verbs
from bench.verbs import fidelity as fidelity_verbs
from bench.verbs import results as results_verbs
from bench.verbs import run as run_verbs
from bench.verbs import repro as repro_verbs
from bench.verbs import serve as serve_verbs

kernels.check_ours(kernels)

VERB_MODULES = (run_verbs, serve_verbs, bench_verbs, fidelity_verbs, faults, check_verbs,
                repro_verbs, results_verbs, env_verbs, explore_verb)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="looplab",
        description="Event-loop laboratory: backpressure, causality and shutdown data loss "
                    "measured side by side on our callback/hybrid/coro kernels and on asyncio, "
                    "uvloop, trio and curio. With no verb: the main report (the main-job "
                    "scenarios at the quick preset on every available runtime).")
    p.add_argument("--version", action="version", version=f"looplab {VERSION}")
    p.add_argument("--out", dest="main_out", default=None, metavar="DIR",
                   help="report folder (default looplab-report); with a verb that writes a "
                        "folder it is that verb's --out")
    sub = p.add_subparsers(dest="verb", metavar="VERB")
    for module in VERB_MODULES:
        module.add_parser(sub)
    _one_line_errors(p)
    return p


def _one_line_errors(parser: argparse.ArgumentParser) -> None:
    """Every (sub-)parser reports a mistake as one line and exit 2."""
    def error(message):
        print(f"looplab: {message}", file=sys.stderr)
        raise SystemExit(ExitCode.USAGE)
    parser.error = error
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _one_line_errors(child)


def _global_out(args) -> None:
    """``looplab --out DIR VERB``: honoured as the verb's ``--out`` when the verb writes
    a folder or file there, refused otherwise (or when both disagree)."""
    if args.verb is None or args.main_out is None:
        return
    if args.verb == "trace":
        raise UsageError("--out before `trace` is ambiguous; put it after: looplab trace ... --out FILE")
    if not hasattr(args, "out"):
        raise UsageError(f"--out before the verb is for the main report; `looplab {args.verb}` "
                         "writes no report folder")
    if args.out is not None and args.out != args.main_out:
        raise UsageError(f"--out given twice ({args.main_out!r} before the verb, {args.out!r} "
                         "after it); give it once")
    args.out = args.main_out


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        _global_out(args)
        if args.verb is None:
            return int(run_verbs.cmd_main_job(args))
        return int(args.func(args))
    except UsageError as exc:
        print(f"looplab: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    except Unavailable as exc:
        print(f"looplab: {exc}", file=sys.stderr)
        return ExitCode.ENVIRONMENT
    except KeyboardInterrupt:
        print("looplab: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except BrokenPipeError:
        if not _stdout_gone():   # a pipe of the work itself broke: not a quiet exit
            raise
        sys.stderr.close()       # `looplab list runtimes | head`
        return ExitCode.OK


def _stdout_gone() -> bool:
    """Whether standard output is a pipe whose reader has gone (poll says POLLERR):
    only that BrokenPipeError means the user closed the pipe on purpose."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return True


if __name__ == "__main__":
    sys.exit(main())
