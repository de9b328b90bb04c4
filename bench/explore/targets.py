"""What ``looplab explore`` runs: a target on one runtime under one chooser,
and the properties that decide whether that run failed.

Two kinds of target, one interface (``resolve(name)`` -> ``Target``;
``target.run(runtime, variant, chooser) -> RunResult``):

* **cells** -- a scenario (``S3``), a variant (``S3:drain``) or a zoo entry
  (``trio-1626``). A thin adapter over the simulated cells that exist
  (``bench.run.run_cell`` on a ``--net sim`` cell): the chooser is
  installed on the cell's world through ``bench.scenarios.simulated.WORLD_HOOKS``. The
  properties are the target's own verdicts (a scenario fails when a verdict
  does not hold or the cell errs; a zoo entry when ``bug_shown`` holds). A
  world that deadlocks (``SimDeadlock``: every task waits and nothing is
  scheduled) is a liveness violation, reported as ``hang``.
* **programs** -- the small interleaving bugs of ``bench.explore.bugs``,
  asyncio programs run on asyncio's selector loop over the world
  (``asyncio``) and on the callback kernel's asyncio loop (``callback``).
  Besides their own assertions, a liveness phase: every task must finish
  within the program's ``T`` virtual seconds; one that has not is a ``hang``,
  listed with where it waits.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

from bench.errors import UsageError
from bench.explore import checks

__all__ = ["RunResult", "Target", "CellTarget", "ProgramTarget", "resolve", "EXPLORE_NET",
           "REUSE"]

#: Whether a target keeps what its schedules share between runs (the parsed
#: runtime, the scenario, the preset's params; see ``CellTarget.run``). Off,
#: every run looks them up again, as a single run would: the tests compare the
#: two, and a schedule's outcome and choices must not depend on it.
REUSE = True

#: The network under exploration: the cells' own (bench.scenarios.simulated.NET_DEFAULTS)
#: plus the jitter and per-wait CPU time of ``--seeds``, whose every draw is a
#: choice point (none, or the most) when network choices are on.
EXPLORE_NET = {"jitter_s": 2e-6, "cpu_per_wait_s": 20e-6}


@dataclass
class RunResult:
    failed: bool
    outcome: str                      # one line: verdicts, the assertion, or the hang
    pending: list = field(default_factory=list)   # a hang's tasks and where each waits
    detail: dict = field(default_factory=dict)


class Target:
    name = "?"
    kind = "?"
    variants = ("naive", "fixed")
    runtimes: tuple = ()
    properties: tuple = ()          # declared beyond the verdicts (bench.scenarios.properties)
    params: dict = {}               # what a property's predicate reads as ``s.params``

    #: the seam's fault points its world is given (``World(buggify=...)``), or None
    buggify = None

    def net_params(self) -> dict:
        """The exploration network, with the fault points when there are some."""
        return {**EXPLORE_NET, "buggify": list(self.buggify)} if self.buggify else \
            dict(EXPLORE_NET)

    def run(self, runtime: str, variant: str, chooser) -> RunResult:
        raise NotImplementedError


def _outcome_line(verdicts: dict) -> str:
    return ", ".join(f"{k}={'yes' if v else 'NO'}" for k, v in sorted(verdicts.items()))


class CellTarget(Target):
    """A scenario or zoo entry as simulated cells."""

    kind = "cell"

    def __init__(self, sid: str, variant: str | None, preset: str):
        from bench.scenarios import api as scmod
        from bench.zoo import registry
        self.sc = scmod.get(sid)
        self.sid = sid
        self.preset = preset
        self.zoo = sid in registry.ENTRIES
        self.entry = registry.ENTRIES.get(sid)
        if preset not in self.sc.presets:
            raise UsageError(f"{sid} has no preset {preset!r}; its presets: "
                             f"{', '.join(self.sc.presets)}")
        if variant is not None and variant not in self.sc.variants:
            raise UsageError(f"{sid} has no variant {variant!r}; its variants: "
                             f"{', '.join(self.sc.variants)}")
        self.name = sid if variant is None else f"{sid}:{variant}"
        self.properties = self.sc.properties
        self.params = self.sc.presets[preset]
        if self.zoo:
            self.variants = ("naive", "fixed") if variant is None else (variant,)
        else:
            # a scenario's "naive" is the variant given; its "fixed" is its fixed variant
            naive = variant or self.sc.variants[0]
            self.variants = (naive,) + (("fixed",) if "fixed" in self.sc.variants
                                        and naive != "fixed" else ())
        # every registered runtime that can run on the simulated network
        from bench import runtimes as rtmod
        self.runtimes = tuple(rid for rid, info in rtmod.RUNTIMES.items()
                              if info.real_network_only is None and info.variant_of is None)
        self._params = {**self.sc.presets[preset], "net": "sim"}
        self._rts: dict = {}         # runtime spec -> (parsed Runtime, canonical spec)

    def applies(self, runtime) -> str | None:
        """Why this target does not run on ``runtime`` (None: it does)."""
        from bench.scenarios import simulated as simcells
        from bench import runtimes as rtmod
        rt = rtmod.parse(runtime)
        if rt.style not in self.sc.styles:
            return f"{self.sid} has no {rt.style} program"
        why = rt.unavailable_reason() or simcells.sim_capable(rt)
        if not why and rt.interpreter is not None:
            why = (f"{runtime}: exploration runs in looplab's own process; for another "
                   "interpreter, run looplab itself with it")
        if not why and self.entry is not None:
            why = self.entry.sim_skip()
        return why

    def _runtime(self, runtime):
        got = self._rts.get(runtime) if REUSE else None
        if got is None:
            from bench import runtimes as rtmod
            rt = rtmod.parse(runtime)
            got = self._rts[runtime] = (rt, rt.spec)
        return got

    def run(self, runtime, variant, chooser):
        from bench import run as scenarios
        from bench.scenarios import simulated as simcells
        from bench.run import Cell
        # One schedule's cell. Everything but the world is the same for every
        # schedule, and the cell carries the objects its names stand for (as
        # the planner's cells do) so the run looks none of them up again. The
        # params are copied: a run may change its own.
        rt, spec = self._runtime(runtime)
        shared = {"_sc": self.sc, "_rt": rt} if REUSE else {}
        cell = Cell(self.sid, spec, variant, self.preset, copy.deepcopy(self._params), 1,
                    world={"seed": 0, "params": self.net_params()}, **shared)

        waits: list = []

        def install(world):
            world.install_chooser(chooser)
            attach = getattr(chooser, "attach", None)
            if attach is not None:
                attach(world)
            # a deadlock is looked at before it unwinds: the tasks and where each waits
            world.on_deadlock = lambda: waits or waits.extend(checks.running_tasks())
        simcells.WORLD_HOOKS.append(install)
        try:
            r = scenarios.run_cell(cell)
        finally:
            simcells.WORLD_HOOKS.remove(install)
        if r.get("skipped"):
            return RunResult(True, "skipped: " + r["skipped"])
        if r["errors"]:
            err = r["errors"][0].split("\n")[0]
            if err.startswith("SimDeadlock"):
                return RunResult(True, "hang: " + err[:160], waits, detail={"liveness": True})
            return RunResult(True, "error: " + err[:160])
        v = r["verdicts"]
        failed = bool(v.get("bug_shown")) if self.zoo else not all(v.values())
        from bench.explore import bugs
        hang = bugs.HANGS.get(self.sid) if self.zoo else None
        if failed and hang:
            # the entry's oracle waited its bound for a wake-up that never came
            m = r["metrics"]
            shown = ", ".join(f"{k}={m[k]}" for k in self.entry.decided_by if k in m)
            return RunResult(True, f"hang: {hang}" + (f" ({shown})" if shown else ""),
                             [f"{self.sid}: {hang}"], {"liveness": True})
        return RunResult(failed, _outcome_line(v),
                         detail={"lost_bytes": r["metrics"].get("lost_bytes")})


class ProgramTarget(Target):
    """An asyncio program of ``bench.explore.bugs`` on one loop over a world."""

    kind = "program"
    runtimes = ("callback", "asyncio")

    def __init__(self, bug):
        self.bug = bug
        self.name = bug.id
        self.properties = tuple(getattr(bug, "properties", ()))

    def applies(self, runtime):
        if runtime not in self.runtimes:
            return f"{self.name} is an asyncio program: it runs on {', '.join(self.runtimes)}"
        return None

    def run(self, runtime, variant, chooser):
        import asyncio

        from kernels import simnet
        bug = self.bug
        world = simnet.World(0, log=False, **{**bug.net, **self.net_params()})
        world.install_chooser(chooser)
        attach = getattr(chooser, "attach", None)
        if attach is not None:
            attach(world)
        io = world.io()
        if runtime == "asyncio":
            from protocols import simports
            loop = simports.SimSelectorEventLoop(io)
        else:
            from kernels.callback import new_event_loop
            loop = new_event_loop(io=io)
        main = bug.naive if variant == "naive" else bug.fixed
        ctx = bug.context(world, io)
        failure = None
        pending = []
        try:
            task = loop.create_task(main(ctx))
            task.add_done_callback(lambda t: loop.stop())
            bound = loop.call_at(bug.T, loop.stop)
            try:
                loop.run_forever()
            except simnet.SimDeadlock as exc:
                failure = f"hang: {exc}"
            except Exception as exc:         # out of the loop itself (a world event's error)
                failure = f"error: {type(exc).__name__}: {exc}"
            bound.cancel()
            if task.done() and failure is None:
                exc = task.exception()
                if isinstance(exc, AssertionError):
                    # the program's own message only: under pytest, assertion rewriting
                    # appends reprs with object addresses, which no replay reproduces
                    failure = f"violated: {str(exc).splitlines()[0] if str(exc) else 'assertion'}"
                elif exc is not None:
                    failure = f"error: {type(exc).__name__}: {exc}"
            elif failure is None:
                failure = f"hang: tasks still pending at t={bug.T:g}s (liveness bound)"
            if failure and failure.startswith("hang"):
                pending = _where_tasks_wait(asyncio.all_tasks(loop))
            _cancel_all(loop)
        finally:
            ctx.close()
            loop.close()
        if failure:
            return RunResult(True, failure, pending, {"liveness": failure.startswith("hang")})
        return RunResult(False, "ok")


def _where_tasks_wait(tasks) -> list:
    out = []
    for t in sorted(tasks, key=lambda t: t.get_name()):
        if t.done():
            continue
        frames = t.get_stack()
        where = (f"{frames[-1].f_code.co_name} at line {frames[-1].f_lineno}"
                 if frames else "not started")
        out.append(f"{t.get_name()} ({t.get_coro().__qualname__}): waits in {where}")
    return out


def _cancel_all(loop) -> None:
    """Unwind whatever a failed run left (bounded: the world may be stuck)."""
    import asyncio
    left = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for t in left:
        t.cancel()
    if left:
        try:
            loop.run_until_complete(asyncio.wait(left, timeout=1.0))
        except Exception:
            pass


def resolve(name: str, preset: str = "tiny") -> Target:
    """A target by name: ``S3``, ``S3:drain``, a zoo id (or alias), or a
    program of ``bench.explore.bugs``. UsageError names the valid ones."""
    from bench.scenarios import api as scmod
    from bench.explore import bugs
    scmod.load_scenario_module("bench.zoo")     # the zoo's scenarios, as looplab repro loads them
    from bench.zoo import registry
    if name in bugs.PROGRAMS:
        return ProgramTarget(bugs.PROGRAMS[name])
    # ``zoo:ID`` is the zoo entry even where a program has the same id (cpython-86296)
    forced = name.startswith("zoo:")
    if forced:
        name = name[len("zoo:"):]
    sid, _, variant = name.partition(":")
    known = scmod.scenarios()
    # A user's scenario wins over a zoo alias of the same name (C8 is asyncio-263's
    # alias): `run` and `list scenarios` take the user's; ``zoo:C8`` names the entry.
    users = sid in known and getattr(known[sid], "origin", "") != "bench.zoo" and not forced
    e = None if users else registry.entry(sid)
    if e is not None:
        sid = e.id
    elif forced:
        raise UsageError(f"zoo:{sid}: no zoo entry {sid!r}")
    if sid not in known:
        raise UsageError(f"unknown explore target {name!r}; give a scenario (S3), a variant "
                         f"(S3:drain), a zoo id or one of {', '.join(bugs.PROGRAMS)}")
    t = CellTarget(sid, variant or None, preset)
    if forced:
        t.name = "zoo:" + t.name
    return t
