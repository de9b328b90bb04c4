"""Where a simulated cell's CPU goes: the simulated network's share against the
program's (the runtime under test, its kernel and the app).

A cell under ``--net sim`` is judged fast when its CPU time is a small fraction of
the time it simulates. That CPU has two owners. The world (the event queue, the TCP
model, the poller and the peers, which act inside the world's events) runs only
inside its entry points: a poller wait, a simulated socket's call, or a run of due
events (``World._run_due``, which trio's simulated clock and the harness's linger
call directly). Everything else is the program itself, plus the harness's set-up,
which would cost the same on a real network. This runs cells in this thread with
those entry points wrapped (the outermost call in this thread is timed with its
CPU clock; the wrappers are removed afterwards) and prints, per cell, both shares
as percentages of simulated time. A developer tool, not a benchmark verb::

    python -m bench.perf.simshare [--scenarios S1,S6] [--runtimes ours] [--variants V]
                                  [--preset blog]

Each cell runs once (no repeats). A cell pinned to another interpreter
(``coro@3.12``) runs in a process of its own, out of reach of the wrappers: it
is skipped. The wrappers add about a microsecond per call, so both shares read
a little high; compare cells within one run.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import threading
import time

from bench.errors import UsageError
from bench.run import plan, run_cell, with_net
from bench.results.tables import format_table

# The seam: every way a program (or the harness) enters the simulated world.
SOCKET_CALLS = ("send", "sendmsg", "recv", "recv_into", "accept", "connect", "connect_ex",
                "shutdown", "close")


@contextlib.contextmanager
def timed_seam():
    """Wrap the world's entry points; yields a dict whose ``"world_s"`` grows by
    the CPU time this thread spends inside them (nested calls counted once).
    Calls from other threads pass through untimed."""
    from kernels.simnet.poller import SimPoller
    from kernels.simnet.sockets import SimSocket
    from kernels.simnet.world import World
    box = {"world_s": 0.0}
    me = threading.get_ident()
    inside = [False]
    clock = time.thread_time
    saved = []

    def wrap(cls, name):
        orig = cls.__dict__[name]
        saved.append((cls, name, orig))

        def timed(self, *args, **kwargs):
            if inside[0] or threading.get_ident() != me:
                return orig(self, *args, **kwargs)
            inside[0] = True
            t = clock()
            try:
                return orig(self, *args, **kwargs)
            finally:
                box["world_s"] += clock() - t
                inside[0] = False
        setattr(cls, name, timed)

    try:
        wrap(SimPoller, "wait")
        wrap(World, "_run_due")
        for name in SOCKET_CALLS:
            wrap(SimSocket, name)
        yield box
    finally:
        for cls, name, orig in reversed(saved):
            setattr(cls, name, orig)


def shares(cells) -> list[dict]:
    """Run each cell once on the simulated network; one row per measured cell:
    ``{"id", "sim_s", "cell_cpu_s", "world_cpu_s"}`` (cells on another
    interpreter, skipped and failed cells: none)."""
    rows = []
    with timed_seam() as box:
        for cell in cells:
            if cell.rt.interpreter is not None:
                continue
            box["world_s"] = 0.0
            one = with_net(dataclasses.replace(cell, repeats=1), "sim")
            result = run_cell(one)
            m = result.get("metrics") or {}
            if not m.get("sim_s") or m.get("cell_cpu_s") is None:
                continue                  # skipped or failed: nothing to split
            rows.append({"id": result["id"], "sim_s": m["sim_s"],
                         "cell_cpu_s": m["cell_cpu_s"], "world_cpu_s": box["world_s"]})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.perf.simshare",
                                 description="Split each simulated cell's CPU into the "
                                             "simulated network's share and the program's.")
    ap.add_argument("--scenarios", default="S1,S3,S5,S6,S7,S8", help="comma list (default: "
                    "the blog matrix's)")
    ap.add_argument("--runtimes", default="ours", help="comma list, or ours/all (default ours)")
    ap.add_argument("--variants", default=None, help="comma list (default: every variant)")
    ap.add_argument("--preset", default="blog", help="scenario preset (default blog)")
    args = ap.parse_args(argv)
    try:
        cells = plan(args.scenarios, args.runtimes, args.variants, args.preset)
    except UsageError as exc:
        print(f"simshare: {exc}", file=sys.stderr)
        return 2
    rows = shares(cells)
    pct = [(r["cell_cpu_s"] / r["sim_s"], r["world_cpu_s"] / r["sim_s"], r["id"]) for r in rows]
    pct.sort(key=lambda x: -x[0])
    def pc(v):          # two decimals: 0.96 % and 1.04 % must not both read 1.0 %
        return f"{100 * v:.2f} %"
    print(format_table(["cell CPU", "world", "program", "cell"],
                       [[pc(c), pc(w), pc(c - w), i] for c, w, i in pct], align="rrrl"))
    print(f"(percentages of simulated time) {len(rows)} cell{'s' if len(rows) != 1 else ''}; "
          f"within 1 %: the whole cell {sum(c <= 0.01 for c, _, _ in pct)}, "
          f"the world alone {sum(w <= 0.01 for _, w, _ in pct)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
