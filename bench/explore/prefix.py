"""A ``delays:D`` search that can run a shared prefix once: the simulated
universe is forked at the choice point where two schedules part.

``search.DelayBounded`` runs every schedule from the start, so a schedule whose
deviations come late repeats the whole run its parent made up to there. Here a
run, at each choice point where the bound still allows a deviation, either
*forks* (``os.fork``): the child takes the alternative and carries on from that
very point while the parent waits for it, then takes the default; or *defers*
the schedule to a queue of runs from the start, as ``DelayBounded`` would. A
child is itself such a run: its deviations are fixed up to the fork and it
branches after it. Either way the schedules are exactly ``DelayBounded``'s (a
child adds one deviation after its parent's last one, at the steps of its
parent's run), each run once: the count and the proof are the same, only the
order differs (depth first where forked).

**When a fork pays.** A forked child skips the prefix but pays for the fork: it
touches the interpreter's working set again, and every page it writes first
is copied (copy-on-write). That costs a few thousand page faults, about as
much as a short universe. So the search forks only where the prefix it saves
costs more than a fork (``Costs``): the first two runs from the start fork
nothing, and the second (the first is also the process warming up) measures
how the CPU time of a run grows with its steps; each fork measures what it
cost beyond the suffix it ran. A prefix cheaper than a fork is
re-run. ``LOOPLAB_EXPLORE_FORK``: ``never`` (the default: ``DelayBounded``
alone), ``auto`` (that rule), ``always`` (fork wherever it is safe: for
measuring). On the machine this was measured on (a 2-core VM, where a
copy-on-write fault costs 5 to 8 us) the fork of an S3 universe at the blog
preset cost 7 ms of CPU beyond its suffix against 11 to 16 ms for a whole run,
and neither ``auto`` nor ``always`` ran the delays:2 proof in less CPU time
than re-running, so sharing is off unless asked for (docs/explore.md,
"Sharing prefixes").

**Why a fork is sound here.** A simulated cell or program is one process and
one deterministic sequence of events (``kernels.simnet``), so a copy of the
process at a choice point is the universe at that point. That holds only while
nothing outside the process takes part, so before each fork ``fork_safe``
checks that no other thread is alive (it would not be copied, and a lock it
held would stay held) and that the run holds no real file descriptor it did not
hold when the search began (a descriptor is shared with the child: an epoll
set or a socket both would change). The world itself holds none (its sockets,
pollers and wake-up pairs are simulated). A target that opens real descriptors
(trio's run opens an epoll set and a wake-up socketpair) is re-run, never
forked. asyncio remembers its running loop by process id; the child's copy of
the loop is set running again.

**No leak.** Only one process runs at a time: a parent blocks on its child's
pipe, so at most ``D + 1`` processes exist (each level of the chain has spent a
delay), and the global count of schedules is exact in every process (a child
starts from its parent's count), so the budget is kept as one process keeps
it. A child always ends with ``os._exit`` (after its run, after an error, after
an interrupt); its parent reaps it before going on, so no zombie is left, and
a child holds no descriptor but its own pipe's write end. A child that dies
without reporting makes the search no proof.

A failure stops the search: nothing forks or is dequeued again, and the runs
in progress finish. Where forked, a failure deep in the tree can come before a
shallower one that breadth-first order would have met first; the shrinker
minimises it as usual.
"""
from __future__ import annotations

import gc
import os
import pickle
import signal
import sys
import threading
import time
from collections import deque

from bench.explore.search import Recorder, points_digest

__all__ = ["mode", "Costs", "Node", "search", "fork_safe", "joined", "ENV"]

#: ``never`` (default), ``auto`` or ``always``.
ENV = "LOOPLAB_EXPLORE_FORK"


def mode() -> str:
    """How prefixes are shared here: ``never`` (the default: measured on the
    shared 2-core machine, a fork cost about as much as the prefix it saves,
    docs/explore.md), ``auto`` or ``always``."""
    m = os.environ.get(ENV, "never").strip().lower()
    if not hasattr(os, "fork") or m not in ("auto", "always", "1", "fork"):
        return "never"                  # re-run every prefix (DelayBounded)
    return "always" if m in ("1", "always", "fork") else "auto"


def _open_fds():
    """The process's open descriptors, or None where they cannot be listed."""
    for where in ("/proc/self/fd", "/dev/fd"):
        try:
            names = os.listdir(where)
        except OSError:
            continue
        fds = set()
        for name in names:
            if name.isdigit():
                try:
                    os.fstat(int(name))     # the listing's own descriptor is closed by now
                except OSError:
                    continue
                fds.add(int(name))
        return fds
    return None


def fork_safe(baseline, own=()) -> str | None:
    """None when this process may fork a universe now, else why not."""
    if threading.active_count() > 1:
        return f"{threading.active_count() - 1} other thread(s) alive"
    fds = _open_fds()
    if fds is None or baseline is None:
        return "open file descriptors cannot be listed here"
    new = fds - baseline - set(own)
    if new:
        return f"the run holds real file descriptors ({', '.join(map(str, sorted(new)[:4]))})"
    return None


class Costs:
    """What a run's prefix costs and what a fork costs, both measured in CPU
    seconds. ``profile[i]`` is the CPU time the first run (the default
    schedule, from the start) had spent when it reached choice point ``i``;
    ``run`` its whole CPU time. A fork's cost is what a forked child spent
    beyond the suffix it ran (estimated from the profile), averaged with a
    prior of half a run."""

    PRIOR_WEIGHT = 4

    def __init__(self, how: str):
        self.how = how
        self.profile = None
        self.run = None
        self.samples = 0
        self.total = 0.0
        self.unsafe = None           # why this target cannot be forked (then it never is)
        self.measured = 0
        self._sum = 0.0
        self._profile_run = None

    def learn_run(self, profile, run_s: float) -> None:
        """A run from the start (``profile``: measured step by step, or None).
        The first one of a process also pays for what it loads and warms up,
        so it is left out; the second gives the profile's shape, and every
        later one the mean a run costs, to which the profile is scaled."""
        self.measured += 1
        if self.measured < 2:
            return
        if self.profile is None and profile:
            self.profile = profile
            self._profile_run = run_s
        self._sum += run_s
        self.run = self._sum / (self.measured - 1)

    def fork_cost(self) -> float:
        prior = (self.run or 0.0) / 2
        w = self.PRIOR_WEIGHT
        return (w * prior + self.total) / (w + self.samples)

    def suffix(self, step: int) -> float:
        return max(self.run - self._at(step), 0.0)

    def _at(self, step: int) -> float:
        p = self.profile
        at = p[step] if step < len(p) else p[-1] if p else 0.0
        return at * self.run / self._profile_run if self._profile_run else at

    def pays(self, step: int) -> bool:
        if self.unsafe or self.how == "never":
            return False
        if self.how == "always":
            return True
        if self.profile is None:
            return False               # the first runs measure; they fork nothing
        return self._at(step) > self.fork_cost()

    def sample(self, step: int, child_cpu: float):
        """Learn from a child forked at ``step`` that used ``child_cpu`` itself;
        returns the fork's cost it measured (None before the profile exists)."""
        if self.profile is None:
            return None
        cost = max(child_cpu - self.suffix(step), 0.0)
        self.samples += 1
        self.total += cost
        return cost

    def merge(self, samples: int, total: float) -> None:
        self.samples += samples
        self.total += total


class _Plain(Recorder):
    """A plain recorder that also learns the run's world (to re-arm its
    watchdog in a child)."""

    __slots__ = ("world",)

    def attach(self, world) -> None:
        self.world = world


class _Tally:
    """What a subtree of the search did; a child sends its tally to its parent."""

    __slots__ = ("runs", "pmin", "pmax", "reached", "first", "skipped", "overflow", "lost",
                 "forks", "deferred", "samples", "sample_total", "desc_cpu", "log")

    def __init__(self, keep_log=False):
        self.runs = 0
        self.pmin = None
        self.pmax = 0
        self.reached = {}          # sometimes property -> the first schedule (global index)
        self.first = None          # (index, deviations, outcome, pending, detail)
        self.skipped = None
        self.overflow = False      # the budget ran out: schedules left out
        self.lost = None           # a child that died without a report: one line
        self.forks = 0
        self.deferred = []         # (deviations, last step, delays): to run from the start
        self.samples = 0           # forks' costs measured in this subtree
        self.sample_total = 0.0
        self.desc_cpu = 0.0        # CPU time of this process's reaped children
        self.log = [] if keep_log else None

    def merge(self, other: "_Tally") -> None:
        self.runs += other.runs
        if other.pmin is not None:
            self.pmin = other.pmin if self.pmin is None else min(self.pmin, other.pmin)
        self.pmax = max(self.pmax, other.pmax)
        for name, at in other.reached.items():
            self.reached.setdefault(name, at)
        if self.first is None:
            self.first = other.first
        self.skipped = self.skipped or other.skipped
        self.overflow = self.overflow or other.overflow
        self.lost = self.lost or other.lost
        self.forks += other.forks
        self.deferred.extend(other.deferred)
        self.samples += other.samples
        self.sample_total += other.sample_total
        if self.log is not None and other.log:
            self.log.extend(other.log)

    def __getstate__(self):
        return {k: getattr(self, k) for k in self.__slots__}

    def __setstate__(self, state):
        for k, v in state.items():
            setattr(self, k, v)


class Node:
    """One run of the search, in whichever process it is: the ``decide`` of
    that run. At a step after its last deviation, for each alternative the
    bound allows (while the budget lasts), a forked child or a deferred run
    from the start; then the default."""

    def __init__(self, search, devs: dict, last: int, used: int, before: int, pending: int):
        self.s = search
        self.devs = devs
        self.last = last
        self.used = used
        self.before = before       # schedules completed before this process's subtree
        self.pending = pending     # schedules known to be queued elsewhere
        self.chain = 1             # runs in progress in the chain of processes (all will count)
        self.root_branch = -1      # the default run's children seen (for --jobs parts)
        self.tally = _Tally(search.keep_log)
        self.report_fd = None      # a child's end of the pipe to its parent
        self.stop = False
        self.rec = None
        self.profile = [] if search.costs.profile is None else None
        self.cpu0 = time.process_time()
        self.forking = 0.0         # CPU time this process spent forking and reaping

    @property
    def in_child(self) -> bool:
        return self.report_fd is not None

    def known(self) -> int:
        return (self.before + self.tally.runs + self.chain + self.pending
                + len(self.tally.deferred))

    def __call__(self, step, kind, n):
        if self.profile is not None:
            # the run's own time: what forking cost this process is left out
            self.profile.append(time.process_time() - self.cpu0 - self.forking)
        if step <= self.last:
            return self.devs.get(step, 0)     # a run from the start replays its deviations
        if self.stop:
            return 0
        s = self.s
        k, J = s.shard
        for c in range(1, n):
            if self.used + c > s.D:
                break
            if not self.devs and J > 1:
                # the default run's children are dealt out over the parts
                self.root_branch += 1
                if self.root_branch % J != k:
                    continue
            if self.known() >= s.budget:
                self.tally.overflow = True
                break
            if not self._may_fork(step):
                self._defer(step, c)
            elif self._fork(step, c):
                return c               # this is the child: it takes the alternative
            if self.stop:
                break
        return 0

    def _may_fork(self, step) -> bool:
        costs = self.s.costs
        if not costs.pays(step):
            return False
        why = fork_safe(self.s.fds, () if self.report_fd is None else (self.report_fd,))
        if why:
            costs.unsafe = why         # this target is re-run from now on
            return False
        return True

    def _defer(self, step, c) -> None:
        self.tally.deferred.append(({**self.devs, step: c}, step, self.used + c))

    def _fork(self, step, c) -> bool:
        """Fork the child that takes ``c`` at ``step``: True in the child; in
        the parent, False once the child has reported (or the schedule is
        deferred when the fork itself failed)."""
        # asyncio remembers its running loop with the pid that set it and, in
        # another process, answers "no running loop": the child's copy of the
        # loop is the running one all the same
        aio = sys.modules.get("asyncio.events")
        loop = aio._get_running_loop() if aio is not None else None
        sys.stdout.flush()
        sys.stderr.flush()
        t0 = time.process_time()
        r, w = os.pipe()
        try:
            pid = os.fork()
        except OSError:
            os.close(r)
            os.close(w)
            self.s.costs.unsafe = "fork failed"
            self._defer(step, c)
            return False
        if pid == 0:
            os.close(r)
            if self.report_fd is not None:
                os.close(self.report_fd)     # the parent's pipe is its parent's business
            if loop is not None:
                aio._set_running_loop(loop)
            self._become_child(w, step, c)
            return True
        os.close(w)
        self.tally.forks += 1
        self._wait_child(pid, r, step)
        self.forking += time.process_time() - t0
        return False

    def _become_child(self, w, step, c) -> None:
        self.report_fd = w
        self.pending += len(self.tally.deferred)
        self.before += self.tally.runs
        self.devs = {**self.devs, step: c}
        self.last = step
        self.used += c
        self.chain += 1
        self.tally = _Tally(self.s.keep_log)
        world = getattr(self.rec, "world", None) or getattr(
            getattr(self.rec, "watch", None), "world", None)
        if world is not None and getattr(world, "_wall_limit", None):
            # the watchdog measures this schedule, not the tree's time so far
            world.watchdog(world._wall_limit[1])

    def _wait_child(self, pid, r, step) -> None:
        chunks = []
        try:
            while True:
                b = os.read(r, 1 << 16)
                if not b:
                    break
                chunks.append(b)
        except BaseException:
            # interrupted while a child runs: end it, reap it, then go on unwinding
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
            os.waitpid(pid, 0)
            raise
        finally:
            os.close(r)
        _, status, usage = os.wait4(pid, 0)
        child_cpu = usage.ru_utime + usage.ru_stime       # with its own reaped children
        self.tally.desc_cpu += child_cpu
        try:
            sub = pickle.loads(b"".join(chunks)) if chunks else None
        except Exception:
            sub = None
        if sub is None:
            code = os.waitstatus_to_exitcode(status)
            self.tally.lost = self.tally.lost or (
                f"a forked schedule ended without its report (exit status {code})")
            self.stop = True
            return
        costs = self.s.costs
        sample = costs.sample(step, child_cpu - sub.desc_cpu)
        if sample is not None:
            self.tally.samples += 1
            self.tally.sample_total += sample
        costs.merge(sub.samples, sub.sample_total)
        sub.desc_cpu = 0.0
        self.tally.merge(sub)
        if sub.first is not None or sub.lost or sub.skipped:
            self.stop = True

    # -- one run's end, in whichever process it happened ---------------------

    def record(self, rec, r) -> None:
        t = self.tally
        t.runs += 1
        index = self.before + t.runs
        npts = len(rec.points)
        t.pmin = npts if t.pmin is None else min(t.pmin, npts)
        t.pmax = max(t.pmax, npts)
        for name in getattr(rec, "seen", ()):
            t.reached.setdefault(name, index)
        if t.log is not None:
            t.log.append((tuple(sorted(self.devs.items())), points_digest(rec.points),
                          r.outcome))
        if r.outcome.startswith("skipped"):
            t.skipped = r.outcome
        elif r.failed and t.first is None:
            t.first = (index, dict(self.devs), r.outcome, list(r.pending), dict(r.detail))

    def report_and_exit(self, error: str | None = None) -> None:
        """A child's end: send the tally up and leave without unwinding (the
        parent's stack, copied here, is the parent's to unwind)."""
        code = 0
        try:
            if error:
                self.tally.lost = self.tally.lost or error
            data = pickle.dumps(self.tally)
            view = memoryview(data)
            while view:
                view = view[os.write(self.report_fd, view):]
        except BaseException:
            code = 70
        finally:
            os._exit(code)


class _Failing:
    """What ``exploration.explore`` reads of the failing run's recorder."""

    def __init__(self, devs):
        self._devs = devs

    def deviations(self) -> dict:
        return dict(self._devs)


class Result:
    __slots__ = ("runs", "points", "reached", "first", "exhausted", "summary", "lost", "tally",
                 "children_cpu")


class _Search:
    def __init__(self, D, budget, shard, keep_log, how):
        self.D = D
        self.budget = budget
        self.shard = tuple(shard)
        self.keep_log = keep_log
        self.costs = Costs(how)
        self.fds = _open_fds()


def search(target, runtime, variant, legal, D: int, budget: int, *, shard=(0, 1),
           make_recorder=None, execute=None, keep_log=False, how=None) -> Result:
    """Every schedule within ``D`` delays of ``target`` on ``runtime``, each
    shared prefix run once where a fork pays (``how``: ``mode()`` by default).
    ``make_recorder(decide)`` builds a run's recorder
    (``exploration.recorder``), ``execute(rec)`` runs it. Returns the
    schedules run (globally counted), the choice points' range, the sometimes
    properties reached, the first failure (``(index, recorder-like,
    RunResult)`` as ``exploration.explore`` keeps it) and whether the space was
    exhausted."""
    import resource

    from bench.explore.targets import RunResult
    s = _Search(D, budget, shard, keep_log, how or mode())
    kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    root_pid = os.getpid()
    total = _Tally(keep_log)
    queue = deque([({}, -1, 0)])       # runs from the start (deviations, last step, delays)
    reruns = 0
    while queue:
        if total.first is not None or total.lost or total.skipped:
            break
        devs, last, used = queue.popleft()
        node = Node(s, devs, last, used, before=total.runs, pending=len(queue))
        rec = make_recorder(node)
        if type(rec) is Recorder:            # the plain one: learn the world as well
            rec = _Plain(rec.legal, node)
        node.rec = rec
        reruns += 1
        if not reruns % 256:
            gc.collect()        # as exploration.explore does: a cell's leftover cycles
        try:
            r = execute(rec)
        except BaseException as exc:
            if node.in_child:
                node.report_and_exit(f"a forked schedule raised {type(exc).__name__}: {exc}")
            raise
        if node.in_child:
            try:
                node.record(rec, r)
            finally:
                node.report_and_exit()
        assert os.getpid() == root_pid
        node.record(rec, r)
        s.costs.learn_run(node.profile, time.process_time() - node.cpu0 - node.forking)
        total.merge(node.tally)
        queue.extend(node.tally.deferred)
        node.tally.deferred = []
    total.deferred = []
    out = Result()
    out.tally = total
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    # the forked schedules' CPU time (a child's includes its own children's)
    out.children_cpu = (kids.ru_utime - kids0.ru_utime) + (kids.ru_stime - kids0.ru_stime)
    out.runs = total.runs
    out.points = (total.pmin or 0, total.pmax)
    out.reached = total.reached
    out.lost = total.lost
    out.first = None
    if total.first is not None:
        index, devs, outcome, pending, detail = total.first
        out.first = (index, _Failing(devs), RunResult(True, outcome, pending, detail))
    out.exhausted = not (total.overflow or total.lost or total.skipped or queue
                         or total.first is not None)
    forked = total.forks
    costs = s.costs
    line = _line(forked, reruns)
    if costs.unsafe:
        line += f" (no fork: {costs.unsafe})"
    elif costs.run is not None:
        line += f"; a run took {costs.run * 1e3:.1f} ms of CPU"
        if costs.samples:
            line += (f", a fork {costs.total / costs.samples * 1e3:.1f} ms more than its "
                     f"suffix ({costs.samples} measured)")
    out.summary = {"D": D, "schedules": total.runs, "exhausted": out.exhausted,
                   "pending": len(queue), "shard": list(shard), "forks": forked,
                   "reruns": reruns, "line": line}
    if costs.run is not None:
        out.summary["run_cpu_s"] = round(costs.run, 5)
    if costs.samples:
        out.summary["fork_cpu_s"] = round(costs.total / costs.samples, 5)   # measured only
    if total.lost:
        out.summary["lost"] = total.lost
    return out


def _line(forks: int, reruns: int) -> str:
    return (f"prefixes: {forks} schedule{'s' if forks != 1 else ''} forked where "
            f"{'it leaves' if forks == 1 else 'they leave'} the run before, {reruns} run "
            "from the start")


def joined(a: dict, b: dict) -> dict:
    """The summaries of two parts of one search, as one (``--jobs``, ``--merge``)."""
    out = dict(a)
    out["forks"] = a["forks"] + b["forks"]
    out["reruns"] = a.get("reruns", 0) + b.get("reruns", 0)
    out["line"] = _line(out["forks"], out["reruns"])
    for k in ("run_cpu_s", "fork_cpu_s", "lost"):
        out.pop(k, None)
    if a.get("lost") or b.get("lost"):
        out["lost"] = a.get("lost") or b.get("lost")
    return out
