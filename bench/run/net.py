"""The networks a cell runs on: real loopback sockets and the simulated world, two
implementations of one interface the cell runner calls (``Network``).

The runner asks a cell's network three things: can this cell run here at all
(``unable``: a reason to skip it, or None); set up one repeat (``repeat``: a
context manager that puts what the scenario's ``run`` needs on its context); and
what the repeat measured about the network itself (``metrics``). The real
network needs nothing (each cell's app and peers are processes of their own,
``bench.scenario``); the simulated one runs the cell inside a world of
``kernels.simnet`` whose mechanics live in ``bench.simcells``.
"""
from __future__ import annotations

import contextlib
import time

__all__ = ["Network", "RealNetwork", "SimNetwork", "network_of"]


class Network:
    name = ""

    def unable(self, cell) -> str | None:
        """Why ``cell`` cannot run on this network (it becomes a skipped cell), or None."""
        return cell.rt.unavailable_reason()

    @contextlib.contextmanager
    def repeat(self, cell, rep_i: int, result: dict, make_ctx):
        """Around one repeat: the scenario's context (``make_ctx()``) with what its
        run needs on this network. Yields (context, a dict the network fills with
        what it saw, for ``metrics``); the caller drops the context inside."""
        yield make_ctx(), {}

    def metrics(self, seen: dict, cpu_start: float) -> dict:
        """What one finished repeat measured about its network and machine."""
        return {}

    def environment(self, cell) -> dict | None:
        """What the cell's own interpreter runs it with, for its result (or None)."""
        return None


class RealNetwork(Network):
    name = "real"

    def environment(self, cell):
        from bench import envs     # the cell's process runs on the runtime's interpreter
        return {k: v for k, v in envs.describe(cell.rt).items() if k != "unavailable"}


class SimNetwork(Network):
    """One world per repeat (repeat i runs seed + i), the cell's heap frozen around it."""
    name = "sim"

    def unable(self, cell) -> str | None:
        from bench import simcells
        reason = super().unable(cell)
        if reason:
            return reason
        why = getattr(cell.sc, "real_network_only", "")
        if why:
            return f"{cell.scenario} runs only on the real network: {why}"
        return simcells.sim_capable(cell.rt)

    @contextlib.contextmanager
    def repeat(self, cell, rep_i, result, make_ctx):
        from bench import simcells
        # The context is made inside the cell's heap and dropped inside it, so the
        # world's garbage is collected with this cell and not in a later one.
        with simcells.cell_heap():
            ctx = make_ctx()
            ctx.sim = simcells.cell_world(cell, rep_i, result)
            seen: dict = {}
            try:
                yield ctx, seen
            finally:
                seen["sim_s"] = ctx.sim.world.now
                if ctx.sim.world.buggify_on:
                    seen["buggify_fired"] = sum(ctx.sim.world.buggify_fired.values())
                del ctx

    def metrics(self, seen, cpu_start):
        # CPU time, which holds on a loaded machine where wall time does not. Only
        # under sim, where the whole cell runs in this thread (on real sockets the app
        # and the peers are other processes); the thread's, not the process's: the
        # matrix writes the last cell's results from another thread while this one runs.
        out = {"cell_cpu_s": round(time.thread_time() - cpu_start, 4),
               "sim_s": round(seen["sim_s"], 6)}
        if "buggify_fired" in seen:
            # the seam's fault points that fired (only in a universe that enabled some)
            out["buggify_fired"] = seen["buggify_fired"]
        return out


NETWORKS = {"real": RealNetwork(), "sim": SimNetwork()}


def network_of(cell) -> Network:
    return NETWORKS[cell.net]
