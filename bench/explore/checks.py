"""What a run is checked against beyond its verdicts, and what a failure shows.

* **Declared properties** (``bench.scenarios.properties``: ``always``, ``eventually``,
  ``sometimes``). ``Watched`` is the recorder of a run whose target declares
  some: at every choice point it sees (before the choice) and at every
  ``observe`` of the code under test it evaluates the predicates on a
  ``Watch`` of the run. The plain ``Recorder`` stays as it was, so a target
  without declarations pays nothing.
* **Traces.** A ``Watched`` recorder with ``trace=True`` also keeps a short
  label of what each choice picked (which task, callback, fd or timer: the
  kernels offer the candidates through ``offer``, ``kernels.choice.permute``).
  ``first_difference`` and ``trace_lines`` put a failing run's choices beside
  the nearest passing run's.
* **Where tasks wait** when a cell's world deadlocks: the tasks of whatever
  runs in the thread (an asyncio or hybrid loop, a coro kernel, a trio run, a
  curio kernel), read at the moment the simulated poller, or trio's simulated
  clock, finds that nothing can happen (``world.on_deadlock``).
"""
from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, field

from bench.scenarios import properties as _props
from bench.explore import where
from bench.explore.search import Recorder

__all__ = ["RunResult", "failure_key", "Watch", "Watched", "declared", "judge", "label", "name_of", "first_difference",
           "trace_lines", "running_tasks", "running_task_entries", "where_coro_waits"]


@dataclass
class RunResult:
    """One run of a target: whether it failed, its outcome in one line, a hang's
    pending tasks, details (``at``: virtual time; ``chains``: await chains) and
    the failure's ``key`` (``failure_key``)."""
    failed: bool
    outcome: str                      # one line: verdicts, the assertion, or the hang
    pending: list = field(default_factory=list)   # a hang's tasks and where each waits
    detail: dict = field(default_factory=dict)
    key: str = ""


def failure_key(r: RunResult) -> str:
    """What makes two failures the same failure: its kind and where it happened
    (an assertion's file:line, an exception's type and file:line, the places a
    hang's tasks wait, the verdicts that failed, the property violated), never
    the message text. The shrinker keeps it; a replay compares it."""
    return r.key or r.outcome


class Watch:
    """What a predicate reads: the run's virtual time, what the code under test
    published (``app``, from ``bench.scenarios.properties.observe``), a cell's peers, the
    preset's ``params``, the ``variant``, the ``runtime`` and the ``world``."""

    __slots__ = ("world", "app", "params", "variant", "runtime")

    def __init__(self, params=None, variant="", runtime=""):
        self.world = None
        self.app = _props.STATE
        self.params = dict(params or {})
        self.variant = variant
        self.runtime = runtime

    @property
    def now(self) -> float:
        return self.world.now if self.world is not None else 0.0

    def _role(self, name):
        """The peer ``name``; None before the cell placed its peers."""
        cell = getattr(self.world, "cell", None)
        if cell is None or not cell.roles:
            return None
        role = cell.roles.get(name)
        if role is None:
            raise LookupError(f"no peer {name!r} in this run "
                              f"(its peers: {', '.join(sorted(cell.roles))})")
        return role

    def received(self, peer: str) -> int:
        """Bytes the peer has received so far (0 before it exists)."""
        role = self._role(peer)
        return role.core.received if role is not None else 0

    def sent(self, peer: str) -> int:
        """Bytes the peer has sent so far (0 before it exists)."""
        role = self._role(peer)
        return role.core.sent if role is not None else 0

    def ended(self, peer: str):
        """How the peer ended ("eof", "reset", "timeout", ...), None while it runs."""
        role = self._role(peer)
        return role.ended if role is not None else None


def declared(target, variant: str, runtime: str | None = None) -> tuple:
    """The properties ``target`` declares for ``variant`` (and the port style
    of ``runtime``, where the target is a cell)."""
    style = None
    if runtime is not None and getattr(target, "kind", "") == "cell":
        from bench import runtimes as rtmod
        try:
            style = rtmod.parse(runtime).style
        except Exception:       # a spec that does not parse runs nowhere anyway
            style = None
    return tuple(p for p in getattr(target, "properties", ()) or ()
                 if p.applies(variant, style))


class Watched(Recorder):
    """A recorder that checks declared properties at each choice point and
    each ``observe``, and (``trace``) labels each recorded choice."""

    __slots__ = ("watch", "always", "eventually", "sometimes", "seen", "violation", "at",
                 "trace", "labels", "_offered", "_busy", "_frozen")

    def __init__(self, legal, decide=None, *, properties=(), watch=None, trace=False):
        super().__init__(legal, decide)
        self.watch = watch if watch is not None else Watch()
        self.always = [p for p in properties if p.kind == "always"]
        self.eventually = [(p, p.deadline(self.watch.params)) for p in properties
                           if p.kind == "eventually"]
        self.sometimes = [p for p in properties if p.kind == "sometimes"]
        self.seen: list = []            # the sometimes properties this run reached
        self.violation = None           # the first property that failed: one line
        self.at = None                  # and the virtual time it was seen failing
        self.trace = trace
        self.labels: list = []
        self._offered = None
        self._busy = False
        self._frozen = False

    # -- the run's life ------------------------------------------------------

    def attach(self, world) -> None:
        """The world of this run (the target calls it when it installs us).
        Each ``eventually`` is also checked at its deadline exactly, by a
        world event (no choice point need fall there)."""
        self.watch.world = world
        for _, T in self.eventually:
            world.call_at(T, self.check)

    def begin(self) -> None:
        _props.watch(self.check if (self.always or self.eventually or self.sometimes)
                     else None)

    def end(self) -> None:
        _props.watch(None)
        self.check(final=True)
        _props.STATE.clear()        # the run's objects are not kept until the next run

    def freeze(self) -> None:
        """The run is decided (the program returned, or hung at its bound): the
        properties take their final look now, and what the clean-up after it
        does (cancelling tasks, closing sockets) is neither checked nor recorded."""
        self.check(final=True)
        self._frozen = True
        self.limit = len(self.points)

    # -- the kernels' side ---------------------------------------------------

    def offer(self, items) -> None:
        """The candidates of the next choice, in default order (labels only)."""
        if self.trace:
            self._offered = items

    def choose(self, kind, n):
        if self.violation is None and (self.always or self.eventually or self.sometimes):
            self.check()
        before = len(self.points)
        c = Recorder.choose(self, kind, n)
        if self.trace and len(self.points) > before:
            self.labels.append(label(kind, c, self._offered, self.watch.world))
        self._offered = None
        return c

    # -- the properties ------------------------------------------------------

    def check(self, final: bool = False) -> None:
        if self.violation is not None or self._busy or self._frozen:
            return
        self._busy = True          # a predicate that observes must not recurse
        s = self.watch
        try:
            now = s.now
            for p in self.always:
                if not p.predicate(s):
                    self.violation, self.at = f"violated: always {p.name}", now
                    return
            if self.sometimes:
                for p in [p for p in self.sometimes if p.predicate(s)]:
                    self.sometimes.remove(p)
                    self.seen.append(p.name)
            if self.eventually:
                left = []
                for p, T in self.eventually:
                    if p.predicate(s):
                        continue
                    if now >= T or final:
                        self.violation = (f"violated: eventually {p.name}: not by t={T:g}s"
                                          if now >= T else
                                          f"violated: eventually {p.name}: the run ended first")
                        self.at = now
                        return
                    left.append((p, T))
                self.eventually = left
        except Exception as exc:        # a predicate that breaks is the author's to fix
            self.violation = (f"error: property predicate raised {type(exc).__name__}: "
                              f"{exc}"[:200])
            self.at = s.now
        finally:
            self._busy = False


def judge(rec, result):
    """The run's result with its declared properties folded in: a violated
    ``always`` or ``eventually`` is the failure (its outcome first, the
    target's own after it in ``detail``)."""
    v = getattr(rec, "violation", None)
    if v is None:
        return result
    result.detail = dict(result.detail, target_outcome=result.outcome, property=True,
                         at=rec.at)
    result.failed, result.outcome = True, v
    # the property is the failure's kind and place: its text may carry a time
    result.key = ("error:property predicate" if v.startswith("error:")
                  else "property:" + v.removeprefix("violated: ").split(": ")[0])
    return result


# ---------------------------------------------------------------------------
# Labels and the trace beside the nearest passing run

_BINARY = {"io-defer": ("I/O now", "I/O deferred"), "net": ("no jitter", "most jitter"),
           "cpu": ("no CPU time", "most CPU time"), "buggify": ("behaves", "fires")}


def label(kind, c, offered, world=None) -> str:
    """A short, run-independent name of what choice ``c`` picked: the task it
    runs or wakes and, for I/O, the connection (``where.describe``)."""
    two = _BINARY.get(kind)
    if two is not None:
        return two[1 if c else 0]
    if offered is None or not 0 <= c < len(offered):
        return ""
    return name_of(offered[c], world)[:120]


def name_of(item, world=None) -> str:
    """A ready callback or task, an I/O event, a timer entry (``where.describe``)."""
    try:
        return where.describe(item, world)
    except Exception as exc:        # a label must never end the run it describes
        return f"({type(exc).__name__} naming {type(item).__name__})"


def first_difference(a: list, b: list) -> int | None:
    """The first step where two runs' choices differ (kind, n or index); the
    shorter run's length when one is a prefix of the other; None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if tuple(x[:3]) != tuple(y[:3]):
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def trace_of(rec) -> list:
    """A run's choices as ``[kind, n, index, label]``."""
    labels = getattr(rec, "labels", [])
    return [[k, n, c, labels[i] if i < len(labels) else ""]
            for i, (k, n, c) in enumerate(rec.points)]


def trace_lines(failing: list, passing: list, at: int | None, context: int = 3) -> list:
    """Both runs' choices around their first difference, a few on each side."""
    if at is None:
        return ["the failing and the passing run made the same choices"]
    lo = max(at - context, 0)
    out = []
    for name, tr in (("failing", failing), ("passing", passing)):
        out.append(f"{name}:")
        for i in range(lo, min(at + context + 1, len(tr))):
            k, n, c, lab = tr[i]
            mark = ">>" if i == at else "  "
            out.append(f"  {mark} step {i}: {k} {c}/{n}" + (f"  {lab}" if lab else ""))
        if at >= len(tr):
            out.append(f"  >> step {at}: (the run made no more choices)")
    return out


# ---------------------------------------------------------------------------
# Where the tasks of a deadlocked cell wait

def where_coro_waits(coro, library: str | None = None) -> str:
    """Where a suspended coroutine chain waits: ``file.py:LINE in fn``, the
    innermost frame of the user's code (``where.innermost``): not asyncio's,
    looplab's kernels' or a runtime library's (``library`` adds one)."""
    if library:
        where.add_library(library)
    frames, _ = where.frames_of(coro)
    return where.location(where.innermost(frames)) if frames else "not started"


def running_task_entries() -> list:
    """``[(line, await chain)]`` for the tasks of whatever runs now in this
    thread, not done: the running asyncio loop's, the running callback loop's
    hybrid tasks, the running coro kernel's, trio's, curio's; not the runtime's
    own machinery (``where.machinery``). Called at the moment a world deadlocks."""
    out = []
    import asyncio
    loop = asyncio._get_running_loop()
    if loop is not None:
        out += [where.task_line(t) for t in asyncio.all_tasks(loop) if not where.machinery(t)]
    try:
        from kernels.callback import get_running_loop
        from kernels.hybrid import all_tasks
        cb_loop = get_running_loop()
    except (ImportError, RuntimeError):
        cb_loop = None
    if cb_loop is not None and cb_loop is not loop:
        out += [where.task_line(t) for t in all_tasks(cb_loop) if not where.machinery(t)]
    try:
        from kernels.coro.traps import running_kernel
        kernel = running_kernel()
    except ImportError:
        kernel = None
    if kernel is not None:
        out += [where.task_line(coro=t.coro, label=f"coro task {t.id} {t.name}")
                for t in kernel._rt.live_tasks() if not where.machinery(coro=t.coro)]
    out += _declared_task_entries()
    return sorted(out)


def running_tasks() -> list:
    """The lines of ``running_task_entries``: each task and where it waits."""
    return [line for line, _ in running_task_entries()]


def _declared_tasks() -> list:
    """The lines of ``_declared_task_entries``."""
    return [line for line, _ in _declared_task_entries()]


def _declared_task_entries() -> list:
    """The tasks of every runtime that declares how to list them
    (``RuntimeInfo.tasks``; trio's and curio's), asked only when the runtime's
    modules are already imported: this never imports a library. Each task is
    shown where its own code waits, not inside its library."""
    from bench import runtimes
    out, asked = [], set()
    for info in runtimes.RUNTIMES.values():
        if info.tasks is None or info.tasks in asked \
                or not all(m in sys.modules for m in info.requires):
            continue
        asked.add(info.tasks)
        if info.library:
            where.add_library(info.library)
        module, _, name = info.tasks.partition(":")
        try:
            listed = getattr(importlib.import_module(module), name)()
        except Exception as exc:  # a plugin's lister must not hide the deadlock itself
            out.append((f"{info.id}: its tasks could not be listed ({type(exc).__name__}: {exc})",
                        []))
            continue
        for label, coro in listed:
            if not where.machinery(coro=coro):      # the runtime's own tasks are not listed
                out.append(where.task_line(coro=coro, label=label))
    return out
