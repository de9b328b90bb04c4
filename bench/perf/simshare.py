"""Where a simulated cell's CPU goes: the simulated network's share against the
program's (the runtime under test, its kernel and the app).

A cell under ``--net sim`` is judged fast when its CPU time is a small fraction of
the time it simulates. That CPU has two owners. The world (the event queue, the TCP
model, the poller and the peers, which act inside the world's events) runs only
while the program is inside one of the seam's calls: a poller wait or a simulated
socket's call. Everything else is the program itself, which would cost the same on a
real network. This runs cells in this thread with those entry points wrapped (the
outermost call is timed with the thread's CPU clock; the wrappers are removed
afterwards) and prints, per cell, both shares as percentages of simulated time.
A developer tool, not a benchmark verb::

    python -m bench.perf.simshare [--scenarios S1,S6] [--runtimes ours] [--variants V]
                                  [--preset blog]

The wrappers add about a microsecond per seam call, so both shares read a little
high; compare cells within one run.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import time

from bench.errors import UsageError
from bench.run import plan, run_cell, with_net

# The seam: every way a program enters the simulated world.
SOCKET_CALLS = ("send", "sendmsg", "recv", "recv_into", "accept", "connect", "connect_ex",
                "shutdown", "close")


@contextlib.contextmanager
def timed_seam():
    """Wrap the seam's entry points; yields a dict whose ``"world_s"`` grows by the
    thread CPU time spent inside them (nested calls counted once)."""
    from kernels.simnet.poller import SimPoller
    from kernels.simnet.sockets import SimSocket
    box = {"world_s": 0.0, "inside": False}
    clock = time.thread_time
    saved = []

    def wrap(cls, name):
        orig = cls.__dict__[name]
        saved.append((cls, name, orig))

        def timed(self, *args, **kwargs):
            if box["inside"]:             # a peer's call made inside a world event
                return orig(self, *args, **kwargs)
            box["inside"] = True
            t = clock()
            try:
                return orig(self, *args, **kwargs)
            finally:
                box["world_s"] += clock() - t
                box["inside"] = False
        setattr(cls, name, timed)

    try:
        wrap(SimPoller, "wait")
        for name in SOCKET_CALLS:
            wrap(SimSocket, name)
        yield box
    finally:
        for cls, name, orig in reversed(saved):
            setattr(cls, name, orig)


def shares(cells) -> list[dict]:
    """Run each cell on the simulated network; one row per measured cell:
    ``{"id", "sim_s", "cell_cpu_s", "world_cpu_s"}``."""
    rows = []
    with timed_seam() as box:
        for cell in cells:
            box["world_s"] = 0.0
            result = run_cell(with_net(cell, "sim"))
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
    print(f"{'cell CPU':>9} {'world':>7} {'program':>8}   (% of simulated time)  cell")
    for r in sorted(rows, key=lambda r: -r["cell_cpu_s"] / r["sim_s"]):
        cell, world = 100 * r["cell_cpu_s"] / r["sim_s"], 100 * r["world_cpu_s"] / r["sim_s"]
        print(f"{cell:8.2f}% {world:6.2f}% {cell - world:7.2f}%   {r['id']}")
    print(f"{len(rows)} cells; within 1 % of simulated time: the whole cell "
          f"{sum(r['cell_cpu_s'] <= r['sim_s'] / 100 for r in rows)}, the world alone "
          f"{sum(r['world_cpu_s'] <= r['sim_s'] / 100 for r in rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
