"""The networks a cell runs on: real loopback sockets and the simulated world, two
implementations of one interface the cell runner calls (``Network``).

The runner asks a cell's network three things: can this cell run here at all
(``unable``: a reason to skip it, or None); set up one repeat (``repeat``: a
context manager that puts what the scenario's ``run`` needs on its context); and
what the repeat measured about the network itself (``metrics``). The real
network needs nothing (each cell's app and peers are processes of their own,
``bench.scenarios.api``); the simulated one runs the cell inside a world of
``kernels.simnet`` whose mechanics live in ``bench.scenarios.simulated``.
"""
from __future__ import annotations

import contextlib
import time
from bench.host import envs


__all__ = ["Network", "RealNetwork", "SimNetwork", "network_of"]

#: How long a simulated cell bound to another interpreter may take as a whole.
SIM_CHILD_TIMEOUT_S = 900


class Network:
    name = ""

    def unable(self, cell) -> str | None:
        """Why ``cell`` cannot run on this network (it becomes a skipped cell), or None."""
        return envs.unavailable_reason(cell.rt)

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

    def elsewhere(self, cell, result: dict) -> dict | None:
        """The cell's result when this network runs it in another process as a
        whole (``result`` filled in), or None: the runner runs it here."""
        return None


class RealNetwork(Network):
    name = "real"

    def unable(self, cell) -> str | None:
        if envs.is_bare(cell.rt) and not getattr(cell.sc, "program_file", ""):
            return (f"{cell.runtime}: its Python is below looplab's minimum, and "
                    f"{cell.scenario} ships no standalone program for it (program_file)")
        return super().unable(cell)

    def environment(self, cell):

        return {k: v for k, v in envs.describe(cell.rt).items() if k != "unavailable"}


class SimNetwork(Network):
    """One world per repeat (repeat i runs seed + i), the cell's heap frozen around it."""
    name = "sim"

    def unable(self, cell) -> str | None:
        from bench.scenarios import simulated as simcells
        reason = super().unable(cell)
        if reason:
            return reason
        why = getattr(cell.sc, "real_network_only", "")
        if why:
            return f"{cell.scenario} runs only on the real network: {why}"
        if envs.is_bare(cell.rt):
            return (f"{cell.runtime} runs only on the real network: its Python is below "
                    "looplab's minimum, where a standalone program runs on real sockets")
        if cell.rt.interpreter is not None and cell.world is not None:
            # elsewhere() hands the other interpreter a plain `run --net sim`
            return (f"{cell.runtime}: a simulated cell on another interpreter runs in the "
                    "default universe only; for --seeds, --replay or explore, run looplab "
                    "itself with that interpreter")
        return simcells.sim_capable(cell.rt)

    @contextlib.contextmanager
    def repeat(self, cell, rep_i, result, make_ctx):
        from bench.scenarios import simulated as simcells
        # The context is made inside the cell's heap and dropped inside it, so the
        # world's garbage is collected with this cell and not in a later one; what
        # the app writes meanwhile (and as it is collected) goes to the cell's notes.
        with simcells.one_cell_at_a_time(), simcells.cell_heap(), simcells.app_output(result):
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

    def environment(self, cell):
        if cell.rt.interpreter is None:
            return None
        from bench.host import envs
        return {k: v for k, v in envs.describe(cell.rt).items() if k != "unavailable"}

    def elsewhere(self, cell, result):
        # A world runs in looplab's own process, so a cell bound to another
        # interpreter (@3.12) runs as a whole in that interpreter's environment:
        # `looplab run --net sim` there, for this one cell, read back from its JSON.
        if cell.rt.interpreter is None:
            return None
        import dataclasses
        import json
        import subprocess
        import tempfile

        from bench.scenarios import context as cellrun
        from bench.host import envs
        from bench.host import procs
        here = dataclasses.replace(cell.rt, interpreter=None, pins=()).spec
        plugins = cellrun.plugin_spec()
        with tempfile.TemporaryDirectory(prefix="looplab-simcell-") as tmp:
            out = f"{tmp}/cell.json"
            args = ["run", "--net", "sim", "--scenarios", cell.scenario, "--variants",
                    cell.variant, "--runtimes", here, "--preset", cell.preset,
                    "--json", out, "--out", tmp]
            for flag, key in (("--scenario-file", "scenario_files"),
                              ("--scenario-module", "scenario_modules"),
                              ("--runtime-module", "runtime_modules")):
                for value in plugins[key]:
                    args += [flag, value]
            python = envs.interpreter_for(cell.rt)
            try:
                proc = subprocess.run(procs.python_command("bench", *args, python=python),
                                      env=procs.child_env(), capture_output=True, text=True,
                                      timeout=SIM_CHILD_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                result["errors"].append(f"the simulated cell in {python} did not finish "
                                        f"within {SIM_CHILD_TIMEOUT_S} s")
                return result
            try:
                with open(out) as f:
                    (got,) = json.load(f)["cells"]
            except (OSError, ValueError, KeyError) as exc:
                tail = (proc.stderr.strip().splitlines() or [repr(exc)])[-1]
                result["errors"].append(f"the simulated cell in {python} wrote no result "
                                        f"(exit {proc.returncode}): {tail}")
                return result
        for key in ("metrics", "verdicts", "samples", "errors", "notes", "load", "series",
                    "skipped", "net", "universe", "universes"):
            if key in got:
                result[key] = got[key]
        for u in [result.get("universe"), *(result.get("universes") or [])]:
            if isinstance(u, dict) and "runtime" in u:
                u["runtime"] = cell.runtime         # a replay of it runs there again
        return result

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
