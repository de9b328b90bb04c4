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

from bench.errors import UsageError
from bench.explore import checks

__all__ = ["RunResult", "Target", "CellTarget", "ProgramTarget", "resolve", "EXPLORE_NET",
           "REUSE", "failure_key", "shadowed_alias"]

#: Whether a target keeps what its schedules share between runs (the parsed
#: runtime, the scenario, the preset's params; see ``CellTarget.run``). Off,
#: every run looks them up again, as a single run would: the tests compare the
#: two, and a schedule's outcome and choices must not depend on it.
REUSE = True

#: The network under exploration: the cells' own (bench.scenarios.simulated.NET_DEFAULTS)
#: plus the jitter and per-wait CPU time of ``--seeds``, whose every draw is a
#: choice point (none, or the most) when network choices are on.
EXPLORE_NET = {"jitter_s": 2e-6, "cpu_per_wait_s": 20e-6}


# the result of one run and its failure's key live in ``checks`` (programs build them too)
RunResult = checks.RunResult
failure_key = checks.failure_key


def _hang_key(lines) -> str:
    from bench.explore import where
    return "hang@" + ";".join(sorted({
        where.key_location(ln.split(": waits at ", 1)[-1].split(", for ")[0]) for ln in lines}))


def _error_key(text: str) -> str:
    """``Type: message (at file.py:N in fn)`` -> ``error:Type@file.py:N in fn``."""
    from bench.explore import where
    kind = text.split(":", 1)[0].strip()
    at = text.rsplit("(at ", 1)[1].rstrip(")") if "(at " in text else ""
    return f"error:{kind}@{where.key_location(at)}"


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
        # a user's scenario file travels in the replay file as a program does
        origin = str(getattr(self.sc, "origin", "") or "")
        self.source = None
        if origin.startswith("file "):
            from bench.explore import programs
            path = origin[len("file "):]
            self.source = {"file": path, "sha256": programs.source_of(path), "name": sid,
                           "scenario": True, "module": None}

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
            world.on_deadlock = lambda: waits or waits.extend(checks.running_task_entries())
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
                lines = [line for line, _ in waits]
                return RunResult(True, "hang: " + err[:160], lines,
                                 detail={"liveness": True, "chains": [c for _, c in waits]},
                                 key=_hang_key(lines))
            return RunResult(True, "error: " + err[:160], key=_error_key(err))
        v = r["verdicts"]
        failed = bool(v.get("bug_shown")) if self.zoo else not all(v.values())
        from bench.explore import bugs
        hang = bugs.HANGS.get(self.sid) if self.zoo else None
        if failed and hang:
            # the entry's oracle waited its bound for a wake-up that never came
            m = r["metrics"]
            shown = ", ".join(f"{k}={m[k]}" for k in self.entry.decided_by if k in m)
            return RunResult(True, f"hang: {hang}" + (f" ({shown})" if shown else ""),
                             [f"{self.sid}: {hang}"], {"liveness": True}, key=f"hang:{self.sid}")
        return RunResult(failed, _outcome_line(v),
                         detail={"lost_bytes": r["metrics"].get("lost_bytes")},
                         key="verdicts:" + ",".join(sorted(k for k, ok in v.items()
                                                           if (ok if self.zoo else not ok))))


class ProgramTarget(Target):
    """A program (a ``bugs.Bug``, or a user's ``programs.UserProgram``) on one
    loop over a world: asyncio's selector loop (``asyncio``), looplab's loop
    (``looplab``, ``callback``: the callback kernel's asyncio loop, with its
    options as ``looplab:OPT=V,...``), or for a program of another runtime's
    library (trio) that runtime's port."""

    kind = "program"

    def __init__(self, bug, source: dict | None = None):
        from bench.explore import programs
        self.bug = bug
        self.name = bug.id
        self.source = source if source is not None else getattr(bug, "source", None)
        self.properties = tuple(getattr(bug, "properties", ()))
        self.variants = tuple(getattr(bug, "variants", ("naive", "fixed")))
        self.library = getattr(bug, "library", "asyncio")
        if self.library != "asyncio":
            self.runtimes = programs.library_runtimes(self.library)
        else:
            # the benchmark's programs keep the names their tables use
            self.runtimes = ("asyncio", "looplab") if self.source else ("callback", "asyncio")

    def applies(self, runtime):
        from bench.explore import programs
        base = runtime.partition(":")[0]
        ok = self.runtimes if self.library != "asyncio" else programs.ASYNCIO_LOOPS
        if base not in ok:
            return (f"{self.name} is a{'n' if self.library[0] in 'aeiou' else ''} "
                    f"{self.library} program: it runs on {', '.join(self.runtimes)}")
        if self.library == "asyncio":
            programs.loop_options(runtime)      # a bad option: UsageError, before any run
        return None

    def run(self, runtime, variant, chooser):
        from bench.explore import programs
        return programs.run(self.bug, runtime, variant, chooser, self.net_params())


def resolve(name: str, preset: str = "tiny") -> Target:
    """A target by name: ``S3``, ``S3:drain``, a zoo id (or alias), a program of
    ``bench.explore.bugs``, or a user's program (``file.py:NAME``,
    ``package.module:NAME``: ``programs.load``). A scenario's own name wins over
    a zoo entry's alias (a user's scenario ``C8`` is not the zoo's ``C8``, which
    stays ``zoo:C8``), as in ``looplab run`` and ``looplab list``. UsageError
    names the valid ones."""
    from bench.scenarios import api as scmod
    from bench.explore import bugs, programs
    if name in bugs.PROGRAMS:
        return ProgramTarget(bugs.PROGRAMS[name])
    scmod.load_scenario_module("bench.zoo")     # the zoo's scenarios, as looplab repro loads them
    from bench.zoo import registry
    known = scmod.scenarios()
    if programs.is_program_spec(name, known):
        return ProgramTarget(programs.load(name))
    # ``zoo:ID`` is the zoo entry even where a program has the same id (cpython-86296)
    forced = name.startswith("zoo:")
    if forced:
        name = name[len("zoo:"):]
    sid, _, variant = name.partition(":")
    e = registry.entry(sid)
    if forced and e is None:
        raise UsageError(f"zoo:{sid}: no zoo entry {sid!r}")
    if e is not None and (forced or sid not in known):
        sid = e.id
    if sid not in known:
        raise UsageError(f"unknown explore target {name!r}; give a scenario (S3), a variant "
                         f"(S3:drain), a zoo id, a program file.py:NAME or module:NAME, or one "
                         f"of {', '.join(bugs.PROGRAMS)}")
    t = CellTarget(sid, variant or None, preset)
    if forced:
        t.name = "zoo:" + t.name
    return t


def shadowed_alias(name: str) -> str | None:
    """The zoo entry whose alias ``name``'s scenario hides (a note for the user)."""
    from bench.scenarios import api as scmod
    from bench.zoo import registry
    sid = name.partition(":")[0]
    e = registry.entry(sid)
    if e is None or e.id == sid or sid not in scmod.scenarios():
        return None
    return e.id
