"""Argument types and plugin options the verb modules share."""
from __future__ import annotations

import argparse

from bench.scenarios import api as scmod


def _int_at_least(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be >= {least}, got {value}")
    return value


def positive_int(text: str) -> int:
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    return _int_at_least(text, 0)


def fault_kinds(text: str) -> list:
    """``--fault-kinds A,B``: which kinds ``--faults`` draws (simnet's FAULT_KINDS)."""
    from kernels.simnet import FAULT_KINDS
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    bad = [k for k in kinds if k not in FAULT_KINDS]
    if not kinds or bad:
        raise argparse.ArgumentTypeError(f"unknown fault kind {bad[0] if bad else text!r}; "
                                         f"valid: {', '.join(FAULT_KINDS)}")
    return list(dict.fromkeys(kinds))


def add_net_options(p: argparse.ArgumentParser, *, skipped: str = "", explored: str) -> None:
    """--net, --seeds, --faults and --replay (bench.run.seeds carries them out).
    ``skipped``: what else the verb skips on the simulated network; ``explored``:
    what --seeds counts and writes."""
    p.add_argument("--net", choices=("real", "sim", "both"), default="real",
                   help="real loopback sockets (default), the simulated network and virtual "
                        "clock (one process per cell; uvloop runs only on real sockets, so its "
                        f"cells are skipped there{skipped}), or both side by side")
    p.add_argument("--seeds", type=positive_int, default=None, metavar="N",
                   help="with --net sim: run each cell in N universes (network, CPU and coro "
                        f"ready-order seeds), {explored}")
    p.add_argument("--faults", type=non_negative_int, default=0, metavar="K",
                   help="with --seeds: draw K random faults per seed (of the --fault-kinds)")
    p.add_argument("--fault-kinds", type=fault_kinds, default=None, metavar="A,B,...",
                   help="with --faults: the kinds to draw, of stall, slow, reset, vanish, loss, "
                        "clog, partition (default: the first four)")
    p.add_argument("--replay", default=None, metavar="FILE",
                   help="rerun the simulated universe(s) in FILE exactly: a results file of a "
                        "--net sim run, a universe --seeds wrote, or its explore.json")


def buggify_points(text: str) -> list:
    """``--buggify [POINT,...]``: the seam's fault points it names (``all``:
    every one), in their canonical order."""
    from kernels.simnet import BUGGIFY_POINTS
    names = [n.strip() for n in text.split(",") if n.strip()]
    if names == ["all"]:
        return list(BUGGIFY_POINTS)
    bad = [n for n in names if n not in BUGGIFY_POINTS]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"unknown fault point {bad[0] if bad else text!r}; valid: all, "
            + ", ".join(BUGGIFY_POINTS) + " (a target goes before --buggify)")
    return [p for p in BUGGIFY_POINTS if p in names]


def add_buggify_option(p: argparse.ArgumentParser, how: str) -> None:
    """``--buggify [POINT,...]`` (docs/simnet.md, "Fault points in the seam")."""
    # argparse does not pass a const through ``type``: the bare flag's list is built here
    p.add_argument("--buggify", nargs="?", const=buggify_points("all"), default=None,
                   type=buggify_points,
                   metavar="POINT,...",
                   help="fault points in the simulated seam, each legal on a real OS: "
                        "short-write, short-read, spurious-ready, late-notify (default with "
                        f"the flag: all); {how}. Off unless given")


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
