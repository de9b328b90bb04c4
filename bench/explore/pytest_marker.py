"""``@pytest.mark.looplab(...)``: a test function explored like ``looplab explore``.

The plugin (``bench.verbs.pytest_plugin``) imports this module only when a test
carries the marker, so a pytest run that does not use it pays nothing. The
marked test is an ``async def``; each schedule runs it afresh on a simulated
world (``bench.explore.programs``): asyncio's loop and looplab's (or trio for
a trio test), every strategy, ``buggify``, declared properties. A test that
passes every schedule explored passes. The first failing schedule fails the
test, once: shrunk, with the pending tasks, the trace beside the nearest
passing schedule and the replay command, and a one-line message first (what
junit's ``message`` shows).

Marker options (all keywords): ``strategy`` (``random``, ``pct:d=N``,
``delays:D``; default ``random``), ``budget`` (schedules per runtime, 1000),
``runtimes`` (a list or comma string; default: the program's loops), ``seed``,
``buggify`` (a list of fault points, or True for all), ``T`` (the liveness
bound, virtual seconds, 5), ``properties`` (``always``/``eventually``/
``sometimes``), ``net`` (the world's parameters).

A test may take the run's context as a parameter named ``looplab_ctx`` (a
placeholder fixture of the plugin; each schedule passes its own). A test that
takes other fixtures gets their values, the same object in every schedule;
its replay file then cannot run from the command line (the fixtures exist only
under pytest).
"""
from __future__ import annotations

import os

from bench.errors import UsageError

__all__ = ["run_item", "LooplabFailure", "OPTIONS"]

OPTIONS = ("strategy", "budget", "runtimes", "seed", "buggify", "T", "properties", "net")
CTX = "looplab_ctx"


class LooplabFailure(Exception):
    """A failing schedule: ``summary`` is one line, ``text`` the whole report."""

    def __init__(self, summary: str, text: str):
        super().__init__(summary)
        self.summary = summary
        self.text = text


class _TestProgram:
    """A test function as ``programs.run`` sees a program: one variant, named
    after the test, called with the context (when it asks for it) and the
    other fixtures' values."""

    def __init__(self, item, kw: dict):
        from bench.explore import bugs, programs
        fn = item.obj
        self.fn = fn
        names = list(getattr(item, "_fixtureinfo").argnames) if hasattr(item, "_fixtureinfo") \
            else []
        fixtures = {n: item.funcargs[n] for n in names if n != CTX and n in item.funcargs}
        wants_ctx = CTX in names

        async def program(ctx):
            args = dict(fixtures)
            if wants_ctx:
                args[CTX] = ctx
            return await fn(**args)
        program.__name__ = program.__qualname__ = fn.__name__
        self.id = fn.__name__
        self.functions = {fn.__name__: program}
        self.arity = {fn.__name__: 1}
        self.variants = (fn.__name__,)
        self.T = float(kw.get("T", bugs.Bug.T))
        self.net = dict(kw.get("net") or bugs.DEFAULT_NET)
        self.context = lambda world, io: bugs.Context(world, io, messages=())
        self.properties = tuple(kw.get("properties") or ())
        self.library = programs.library_of(fn)
        self.replayable = not fixtures


def _options(marker) -> dict:
    if marker.args:
        raise UsageError("looplab marker: give its options by name, e.g. "
                         "@pytest.mark.looplab(strategy='pct:d=3', budget=500)")
    bad = sorted(set(marker.kwargs) - set(OPTIONS))
    if bad:
        raise UsageError(f"looplab marker: unknown option {bad[0]!r}; its options: "
                         f"{', '.join(OPTIONS)}")
    kw = dict(marker.kwargs)
    budget = kw.get("budget", 1000)
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
        raise UsageError(f"looplab marker: budget must be a whole number >= 1, got {budget!r}")
    from bench.explore import search
    try:
        search.parse_strategy(kw.get("strategy", "random"))
    except ValueError as exc:
        raise UsageError(f"looplab marker: {exc}") from None
    rts = kw.get("runtimes")
    if isinstance(rts, str):
        kw["runtimes"] = [r.strip() for r in rts.split(",") if r.strip()]
    b = kw.get("buggify")
    if b is True:
        from kernels.simnet import BUGGIFY_POINTS
        kw["buggify"] = list(BUGGIFY_POINTS)
    elif b:
        from bench.verbs.common import buggify_points
        kw["buggify"] = buggify_points(",".join(b) if not isinstance(b, str) else b)
    return kw


def run_item(item, marker, replay_dir: str) -> list:
    """Explore the marked test ``item``; raise ``LooplabFailure`` at its first
    failing schedule. Returns one summary line per runtime explored."""
    import inspect

    from bench.explore import exploration, programs, targets, verb
    if not inspect.iscoroutinefunction(item.obj):
        raise UsageError(f"looplab marker on {item.nodeid}: the test must be an async def")
    kw = _options(item.get_closest_marker("looplab") if marker is None else marker)
    prog = _TestProgram(item, kw)
    path = os.path.realpath(str(item.path))
    source = {"file": path, "sha256": programs.source_of(path), "name": item.obj.__name__,
              "module": None}
    # what the replay needs beyond the function: the marker's bound and network
    source.update({k: kw[k] for k in ("T", "net") if k in kw})
    target = targets.ProgramTarget(prog, source=source)
    target.name = f"{os.path.relpath(path)}:{item.obj.__name__}"
    runtimes = kw.get("runtimes") or list(target.runtimes)
    lines = []
    for rt in runtimes:
        why = target.applies(rt)
        if why:
            lines.append(f"{rt}: skipped: {why}")
            continue
        r = exploration.explore(target, rt, prog.variants[0], kw.get("strategy", "random"),
                                kw.get("budget", 1000), seed=kw.get("seed", 0),
                                buggify=kw.get("buggify"))
        if r.get("found") or verb._vacuous(r):
            raise _failure(r, replay_dir, prog.replayable)
        lines.append(_passed_line(r))
    return lines


def _passed_line(r: dict) -> str:
    from bench.explore import verb
    return (f"{r['runtime']} {r['strategy']}: no failing schedule in {r['schedules']}"
            + (f"; {r['proved']}" if r.get("proved") else "")
            + (f"; {verb.not_exhausted(r)}" if verb.not_exhausted(r) else ""))


def _failure(r: dict, replay_dir: str, replayable: bool) -> LooplabFailure:
    """The report of a failing unit, as ``looplab explore`` prints it."""
    import contextlib
    import io

    from bench.explore import verb
    if not r.get("found"):
        vac = "; ".join(verb._vacuous(r))
        summary = f"looplab: {r['target']} on {r['runtime']}: {vac}"
        return LooplabFailure(summary, summary + "\n(a sometimes property no schedule reached: "
                                                 "the schedules never got where it says)")
    os.makedirs(replay_dir, exist_ok=True)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        verb._report(r, replay_dir, chains=True)
    summary = (f"looplab: {r['target']} on {r['runtime']} ({r['strategy']}): fails at schedule "
               f"{r['first_failure']}, shrunk to {r['shrunk_deviations']} "
               f"deviation{'' if r['shrunk_deviations'] == 1 else 's'}: {r['shrunk_outcome']}")
    text = summary + "\n" + buf.getvalue().rstrip()
    if not replayable:
        text += ("\n    (the test takes fixtures, which exist only under pytest: the replay "
                 "runs it without them)")
    return LooplabFailure(summary, text)
