"""Schedules, the legality model, and the strategies that pick schedules.

A *schedule* is the list of choices one run made at its choice points
(``kernels.choice``). Only *legal* kinds count: a kind the runtime's
documentation promises an order for is answered 0 and not recorded. A
schedule is written as its *deviations*, ``{step: choice}`` for the steps
where it did not take the default (0); choosing index ``c`` costs ``c``
delays (it skips the head ``c`` times), as in delay bounding.

Strategies (``parse_strategy``):

* ``random`` -- every choice uniform over its alternatives;
* ``pct:d=N`` -- PCT adapted to choice points: each run takes the default
  order except at ``d - 1`` change points drawn uniformly among the ``k``
  choice points the default run measured, where it takes a uniformly drawn
  other alternative. The per-run guarantee printed is Burckhardt et al.'s
  ``1 / (n * k^(d-1))`` with ``n`` the most alternatives seen at one point;
* ``delays:D`` -- every schedule with at most ``D`` delays, breadth first
  (a child adds one deviation after its parent's last one, so each schedule
  is run once). Exhausting them is a proof for that bound.
  Shard ``k`` of ``J`` (``--jobs``) keeps, of the default run's children,
  every ``J``-th from the ``k``-th, and all their descendants: a schedule's
  first deviation decides its shard, so the shards' schedules are disjoint,
  together they are the whole bounded space, and the bound is proved when
  every shard exhausted its part. Each shard runs the default schedule to
  learn its choice points (the same in every shard: a run is a function of
  its choices).
"""
from __future__ import annotations

import hashlib
import random

from kernels import choice as _choice

__all__ = ["legal_kinds", "Recorder", "parse_strategy", "Strategy",
           "RandomWalk", "PCT", "DelayBounded", "points_digest"]

# ---------------------------------------------------------------------------
# The legality model (sources in docs/explore.md)

_NET = {_choice.NET, _choice.CPU}


def legal_kinds(runtime: str, net: bool = True, portability: bool = False,
                buggify: bool = False) -> frozenset:
    """The choice kinds exploration may take on ``runtime``: what its RuntimeInfo says
    its documented contract leaves open (``schedule_choices``; with ``portability``
    also ``portable_choices``), plus the network's own choices, plus with
    ``buggify`` the seam's fault points (``BUGGIFY``): the OS allows a short write,
    a spurious readiness or a late notification whatever runtime sits above it,
    so no runtime's contract can rule them out."""
    from bench import runtimes as rtmod
    try:
        info = rtmod.parse(runtime).info
    except rtmod.UsageError:
        # a program target's loop name ("asyncio": CPython's own loop; "looplab" and its
        # options: the kernel behind loop=looplab) rather than a runtime: the contract
        # of the registered runtimes built on that library, or of that kernel
        info = next((i for i in rtmod.RUNTIMES.values()
                     if i.library == "python" and i.schedule_choices and runtime == "asyncio"),
                    None) or rtmod.loop_kernel(runtime.partition(":")[0])
        if info is None:
            raise
    kinds = set(info.schedule_choices)
    if portability:
        kinds |= set(info.portable_choices)
    if net:
        kinds |= _NET
    if buggify:
        kinds.add(_choice.BUGGIFY)
    return frozenset(kinds)


# ---------------------------------------------------------------------------
# The chooser one run gets

class Recorder:
    """The chooser of one run: asks ``decide(step, kind, n)`` at each legal
    choice point and records ``(kind, n, chosen)``; answers 0 to the rest."""

    __slots__ = ("legal", "decide", "points", "limit")

    def __init__(self, legal, decide=None, limit=200_000):
        self.legal = legal
        self.decide = decide
        self.points: list = []
        self.limit = limit

    def choose(self, kind, n):
        if kind not in self.legal or n < 2:
            return 0
        points = self.points
        step = len(points)
        if step >= self.limit:       # a run this long is explored no further
            return 0
        c = self.decide(step, kind, n) if self.decide is not None else 0
        if not 0 <= c < n:
            c = 0                    # a replayed choice that no longer fits
        points.append((kind, n, c))
        return c

    def deviations(self) -> dict:
        return {i: c for i, (_, _, c) in enumerate(self.points) if c}


def points_digest(points) -> str:
    return hashlib.sha256(repr(points).encode()).hexdigest()[:16]


def fixed(deviations: dict):
    """A ``decide`` that replays ``{step: choice}`` and takes 0 elsewhere."""
    get = deviations.get
    return lambda step, kind, n: get(step, 0)


# ---------------------------------------------------------------------------
# Strategies: each yields the ``decide`` of the next run and hears its result

class Strategy:
    name = "?"
    exhausted = False

    def next(self):
        """The next run's ``decide``, or None when there is nothing left."""
        raise NotImplementedError

    def done(self, recorder: Recorder, failed: bool) -> None:
        """What the run of the last ``next()`` did."""

    def summary(self) -> dict:
        return {}


class RandomWalk(Strategy):
    def __init__(self, seed=0):
        self.name = "random"
        self.rng = random.Random(f"explore:{seed}")

    def next(self):
        rnd = self.rng.randrange
        return lambda step, kind, n: rnd(n)


class PCT(Strategy):
    def __init__(self, d: int, seed=0):
        self.name = f"pct:d={d}"
        self.d = d
        self.rng = random.Random(f"explore:pct:{seed}")
        self.k = None               # choice points of the default run
        self.n = 2
        self.runs = 0

    def next(self):
        if self.k is None:          # measure k on the default schedule first
            return fixed({})
        rng = self.rng
        k = max(self.k, 1)
        change = set(rng.sample(range(k), min(self.d - 1, k)))

        def decide(step, kind, n):
            return rng.randrange(1, n) if step in change else 0
        return decide

    def done(self, recorder, failed):
        self.runs += 1
        pts = recorder.points
        if self.k is None:
            self.k = len(pts)
        if pts:
            self.n = max(self.n, max(n for _, n, _ in pts))

    def summary(self):
        k, n, d = self.k or 0, self.n, self.d
        bound = 1.0 / (n * max(k, 1) ** (d - 1)) if k else 1.0
        return {"k": k, "n": n, "d": d, "guarantee": bound,
                "line": f"PCT d={d}: k={k} choice points (default run), n={n} most "
                        f"alternatives at one point; per-run guarantee 1/(n*k^(d-1)) = "
                        f"{bound:.3g} for a bug of depth {d}"}


class DelayBounded(Strategy):
    """Every schedule within ``D`` delays, breadth first."""

    def __init__(self, D: int, max_queue: int = 1_000_000, shard: tuple = (0, 1)):
        self.name = f"delays:{D}"
        self.D = D
        self.shard = shard          # (k, J): this process explores part k of J
        self.max_queue = max_queue
        self.overflow = False       # schedules left out: the space is not exhausted
        self.queue = [({}, -1, 0)]   # (deviations, last step, delays used)
        self.current = None
        self.runs = 0
        self.max_delays_run = 0

    def next(self):
        if not self.queue:
            self.exhausted = not self.overflow
            return None
        self.current = self.queue.pop(0)
        return fixed(self.current[0])

    def done(self, recorder, failed):
        self.runs += 1
        devs, last, used = self.current
        self.max_delays_run = max(self.max_delays_run, used)
        if failed:
            return
        # children: one more deviation after the last one, within the bound
        k, J = self.shard
        split = J > 1 and not devs   # the default run's children are dealt out
        i = -1
        for step in range(last + 1, len(recorder.points)):
            n = recorder.points[step][1]
            for c in range(1, n):
                if used + c > self.D:
                    break
                i += 1
                if split and i % J != k:
                    continue
                if len(self.queue) >= self.max_queue:
                    self.overflow = True
                    return
                child = dict(devs)
                child[step] = c
                self.queue.append((child, step, used + c))
        if not self.queue and not self.overflow:
            self.exhausted = True

    def summary(self):
        return {"D": self.D, "schedules": self.runs, "exhausted": self.exhausted,
                "pending": len(self.queue), "shard": list(self.shard)}


def parse_strategy(text: str, seed: int = 0, budget: int = 1000,
                   shard: tuple = (0, 1)) -> Strategy:
    """``random``, ``pct:d=N`` or ``delays:D``; ValueError with one line.
    ``shard=(k, J)``: part ``k`` of ``J`` of a ``delays:D`` space (random and
    PCT shards differ by seed instead)."""
    t = (text or "").strip()
    if t == "random":
        return RandomWalk(seed)
    if t.startswith("pct:d="):
        d = t[len("pct:d="):]
        if d.isdigit() and 1 <= int(d) <= 8:
            return PCT(int(d), seed)
        raise ValueError(f"--strategy {t}: d must be a whole number from 1 to 8")
    if t.startswith("delays:"):
        D = t[len("delays:"):]
        if D.isdigit() and int(D) <= 6:
            return DelayBounded(int(D), max_queue=max(budget, 1) * 4, shard=tuple(shard))
        raise ValueError(f"--strategy {t}: D must be a whole number from 0 to 6")
    raise ValueError(f"--strategy must be random, pct:d=N or delays:D, got {text!r}")
