"""Argument types and plugin options the verb modules share."""
from __future__ import annotations

import argparse

from bench import scenario as scmod


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def add_plugin_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scenario-file", action="append", default=[], metavar="FILE",
                   help="load a scenario file (repeatable); it is loaded in every cell process too. "
                        "Without --scenarios, the files' own scenarios run")
    p.add_argument("--scenario-module", action="append", default=[], metavar="MODULE",
                   help="import a module that registers scenarios (repeatable)")
    p.add_argument("--runtime-module", action="append", default=[], metavar="MODULE",
                   help="import a module that registers runtimes (repeatable)")


def load_plugins(args) -> None:
    """Runtimes first (a scenario file may name them), then scenarios. A user who
    names scenario files but no ``--scenarios`` means the files' own scenarios."""
    scmod.load_runtime_modules(getattr(args, "runtime_module", None) or ())
    files = getattr(args, "scenario_file", None) or ()
    scmod.load_plugins(files, getattr(args, "scenario_module", None) or ())
    if files and hasattr(args, "scenarios") and not args.scenarios:
        args.scenarios = ",".join(sc.id for f in files for sc in scmod.load_scenario_file(f))
