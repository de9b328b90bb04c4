"""The world and its clock: the event queue, the address space, the faults, the log.

``World`` is what one seed decides: the virtual clock (``now``), the event
queue (``call_at``; events run in (time, sequence) order), the simulated file
descriptors and addresses, the connections in ``connect`` order, the fault
schedule (planned or drawn from the seed) and the event log whose digest two
replays compare. It picks the TCP model once (``accounting``) and every socket
it makes uses that one. Time moves only when a poller waits or ``run`` is
called (see the package's docstring).
"""
from __future__ import annotations

import hashlib
import heapq
import math
import random
import socket as _socket
import time
from collections import deque
from collections.abc import Mapping

from . import constants as _c
from .constants import (
    ACCOUNTING, BUGGIFY_ENABLE, BUGGIFY_FIRE, BUGGIFY_POINTS, DEFAULTS, FAULT_KINDS,
    FAULT_SIDES, FD_BASE, LINK_FAULTS, SimStopped,
)
from .linux import LinuxModel
from .model import ByteModel
from .poller import SimIO, SimSelector
from .sockets import SimSocket

# the event queue's hot path: one module lookup each, not two
_heappush, _heappop = heapq.heappush, heapq.heappop

#: The TCP model behind every socket of a world, by ``accounting``.
MODELS = {"bytes": ByteModel, "linux": LinuxModel}


class World:
    """A virtual clock, an event queue and everything on the simulated network.

    ``World(seed, **params)``: see ``constants.DEFAULTS`` (and the package's docstring) for
    the parameters; ``faults`` is a list of fault dicts, or ``None`` to draw
    ``random_faults`` of them from the seed. ``log=False`` keeps no event log
    (``digest()`` then hashes nothing).
    """

    def __init__(self, seed=0, *, faults=None, log=True, **params):
        if isinstance(seed, bool) or not isinstance(seed, (int, str)):
            raise ValueError(f"simnet: seed must be an int or a str, got {seed!r}")
        unknown = sorted(set(params) - set(DEFAULTS))
        if unknown:
            raise ValueError(f"simnet: unknown parameter {unknown[0]!r}; valid: "
                             + ", ".join(sorted(DEFAULTS)))
        p = dict(DEFAULTS)
        p.update(params)
        _check_params_once(p)
        self.seed = seed
        self.params = p
        self.now = 0.0
        self._heap = []
        self._seq = 0
        self._gen = 0                 # bumped on every readiness-relevant change
        self._files = {}              # fd -> SimSocket | SimWaker
        self._next_fd = FD_BASE
        self._listeners = {}          # (host, port) -> listening SimSocket
        self._bound = set()
        self._next_port = 40000
        self._conns = []              # index -> [client endpoint, server endpoint]
        self._pollers = []
        self._pokes = deque()         # sockets whose peer must act before anything else runs
        self.tcp_model = MODELS[p["accounting"]]   # every socket's buffer, window and ACK rules
        self._stop_reason = None      # World.stop / the watchdog: every step raises SimStopped
        self._wall_limit = None       # (monotonic deadline, seconds) of the watchdog
        self._ticks = _c.WATCH_EVERY
        # seeded on first use: an explorer's world (install_chooser) never draws
        self._rng = _Seeded(self, "_rng", f"{seed}:net")
        self._cpu_rng = _Seeded(self, "_cpu_rng", f"{seed}:cpu")
        self.chooser = None           # an explorer's (install_chooser); the seams carry it
        # the seam's fault points enabled in this universe (empty: every site is one test)
        self._bug = _Buggify(seed, p["buggify"])
        self.buggify_on = self._bug.on
        self.buggify_fired = {}       # point -> how many times it fired
        self.log = [] if log else None
        if faults is None:
            faults = (_draw_faults(random.Random(f"{seed}:faults"), p)
                      if p["random_faults"] else [])
        self.faults = [_check_fault(f) for f in faults]
        for fault in sorted(self.faults, key=lambda f: f["at"]):
            self.call_at(fault["at"], self._fault, fault)

    # -- replay ---------------------------------------------------------

    def universe(self) -> dict:
        """Everything that decides this world, as plain JSON values."""
        return {"model": "looplab.simnet", "version": 1, "seed": self.seed,
                "params": dict(self.params), "faults": [dict(f) for f in self.faults]}

    @classmethod
    def from_universe(cls, d, *, log=True) -> "World":
        if not isinstance(d, Mapping) or d.get("model") != "looplab.simnet":
            raise ValueError("simnet: not a simnet universe (no model 'looplab.simnet')")
        if d.get("version") != 1:
            raise ValueError(f"simnet: universe version {d.get('version')!r} is not 1")
        return cls(d["seed"], faults=list(d.get("faults", [])), log=log,
                   **dict(d.get("params", {})))

    def install_chooser(self, chooser) -> None:
        """Hand this world's decisions to an explorer (``kernels.choice``):
        each segment's jitter and each wait's CPU time become a choice of
        none (0, the default) or the most (1) instead of a draw from the
        seed, and every seam (``io()``) carries ``chooser`` to the kernels
        built on it. Install it before the program opens its loop."""
        self.chooser = chooser
        self._rng = _Chosen(chooser, "net")
        self._cpu_rng = _Chosen(chooser, "cpu")
        # every point the world was given is enabled, and each site it reaches
        # is a choice (kernels.choice.BUGGIFY): 0 behaves, 1 fires
        self._bug.explore(chooser)
        self.buggify_on = self._bug.on

    def digest(self) -> str:
        """SHA-256 of the event log: equal digests, equal event sequences."""
        return hashlib.sha256(repr(self.log).encode()).hexdigest()

    def record(self, kind, conn=None, side=None, value=None):
        if self.log is not None:
            self.log.append((self.now, kind, conn, side, value))

    # -- the seam's fault points (BUGGIFY) ---------------------------------

    def buggify(self, point, conn=None, side=None) -> bool:
        """Whether fault point ``point`` fires at this site (a socket or a
        poller calls it only when ``point in buggify_on``). A firing is logged."""
        if point not in self.buggify_on or not self._bug.fires():
            return False
        self.buggify_fired[point] = self.buggify_fired.get(point, 0) + 1
        self.record("buggify", conn, side, point)
        return True

    def buggify_size(self, n: int) -> int:
        """How many of ``n`` (> 1) bytes a short write or read moves: uniform in
        ``[1, n - 1]`` from the seed, or half under an explorer (one choice)."""
        return self._bug.size(n)

    def buggify_pick(self, candidates):
        """One of ``candidates`` (the sockets a poll could report spuriously), or
        None when ``spurious-ready`` does not fire. They take turns. At most one
        fires per virtual instant: a program that retries at once must meet a
        poll that tells the truth, or time could never move (a real kernel's
        spurious wake-ups are rare, not a loop)."""
        if not candidates or self.now == self._bug.spurious_at \
                or not self.buggify("spurious-ready"):
            return None
        self._bug.spurious_at = self.now
        self._bug.turn += 1
        return candidates[self._bug.turn % len(candidates)]

    # -- clock and events -------------------------------------------------

    def time(self) -> float:
        return self.now

    def call_at(self, when, fn, *args):
        """Run ``fn(*args)`` at virtual time ``when`` (never before now).
        Returns a handle whose ``cancel()`` stops it."""
        ev = _Event(fn, args)
        self._seq = seq = self._seq + 1
        _heappush(self._heap, (when if when > self.now else self.now, seq, ev))
        return ev

    def call_later(self, delay, fn, *args):
        return self.call_at(self.now + delay, fn, *args)

    def next_time(self):
        """When the next event is due (``None``: nothing is scheduled)."""
        heap = self._heap
        while heap and heap[0][2].fn is None:
            _heappop(heap)
        return heap[0][0] if heap else None

    def _run_due(self):
        """Run every event due at or before now, in (time, seq) order. A
        participant that keeps scheduling itself at the same instant would
        stop time for ever: after ``constants.MAX_EVENTS_AT_ONE_TIME`` it is an error."""
        self._ticks -= 1
        if self._ticks <= 0:
            self._check_stop()
        heap = self._heap
        pokes = self._pokes
        now = self.now
        limit = budget = _c.MAX_EVENTS_AT_ONE_TIME
        fn = None
        while True:
            # A peer whose socket changed acts right after the event that
            # changed it (cheaper than a zero-delay event, just as ordered).
            while pokes:
                pokes.popleft()._poke()
                budget -= 1
            if not (heap and heap[0][0] <= now):
                break
            ev = _heappop(heap)[2]
            fn = ev.fn
            if fn is not None:
                ev.fn = None
                fn(*ev.args)
                budget -= 1
            if budget <= 0:
                raise RuntimeError(f"simnet: livelock: {limit} events at "
                                   f"t={now:.6f}s without time moving (last: {fn!r})")

    # -- stopping from outside: signals and the wall-clock watchdog ----------

    def stop(self, reason: str) -> None:
        """Make the next step of this world (and every one after it) raise
        ``SimStopped(reason)``. Safe from another thread or a signal handler:
        it only sets two attributes. Every wait of a program and every world
        run steps through ``_run_due``, so a program spinning on the world --
        however it spins -- ends within a few steps."""
        self._stop_reason = reason
        self._ticks = 0

    def watchdog(self, wall_s: float) -> None:
        """Stop this world (``SimStopped``) once it has run ``wall_s`` seconds of
        wall-clock time from now. Looked at every ``WATCH_EVERY`` steps; it
        decides nothing else, so results do not depend on it."""
        self._wall_limit = (time.monotonic() + wall_s, wall_s)

    def _check_stop(self):
        self._ticks = _c.WATCH_EVERY
        if self._stop_reason is None and self._wall_limit is not None \
                and time.monotonic() > self._wall_limit[0]:
            self._stop_reason = (f"watchdog: {self._wall_limit[1]:g} s of wall-clock time ran "
                                 f"out at t={self.now:.6f}s simulated")
        if self._stop_reason is not None:
            self._ticks = 0
            raise SimStopped(f"simnet: stopped: {self._stop_reason}")

    def run(self, until=None, max_events=None) -> None:
        """Advance through events up to virtual time ``until`` (``None``: until
        none are left), for worlds driven by peers alone."""
        count = 0
        while True:
            self._run_due()
            t = self.next_time()
            if t is None or (until is not None and t > until):
                break
            self.now = t
            count += 1
            if max_events is not None and count > max_events:
                raise RuntimeError(f"simnet: more than {max_events} event steps")
        if until is not None and until > self.now:
            self.now = until

    # -- file descriptors and addresses -------------------------------------

    def _new_fd(self, obj) -> int:
        fd = self._next_fd
        self._next_fd += 1
        self._files[fd] = obj
        return fd

    def _release_fd(self, fd) -> None:
        self._files.pop(fd, None)
        for poller in self._pollers:
            poller.forget(fd)
        self._gen += 1

    def _ephemeral(self, host) -> tuple:
        while True:
            port = self._next_port
            self._next_port = 40000 + (self._next_port - 40000 + 1) % 20000
            if (host, port) not in self._bound:
                return (host, port)

    # -- the seam's objects -------------------------------------------------

    def io(self, owner="app") -> SimIO:
        """The seam for one program; every socket it opens (and every socket
        accepted from those) belongs to ``owner`` (see ``exit_process``)."""
        return SimIO(self, owner)

    def exit_process(self, owner="app") -> int:
        """What the OS does when a process exits: close every socket of
        ``owner`` still open (in fd order), each as ``close()`` would -- a FIN
        behind its unsent bytes, or an RST if it holds unread data. Returns how
        many were closed."""
        socks = [f for fd, f in sorted(self._files.items())
                 if isinstance(f, SimSocket) and f.owner == owner]
        for sock in socks:
            sock.close()
        return len(socks)

    def selector(self) -> SimSelector:
        return SimSelector(self)

    def socket(self, family=_socket.AF_INET, type=_socket.SOCK_STREAM, proto=0) -> SimSocket:
        return SimSocket(self, family, type, proto)

    def connection(self, index):
        """``(client, server)`` endpoints of connection ``index``."""
        return tuple(self._conns[index])

    # -- faults -----------------------------------------------------------

    def _fault(self, fault):
        kind = fault["kind"]
        if kind == "clog":
            self._clog(fault)
            return
        i = fault["conn"]
        side = fault["side"]
        if i >= len(self._conns):
            self.record("fault-missed", i, side, kind)
            return
        client, server = self._conns[i]
        targets = (client, server) if side == "both" else (client if side == "client" else server,)
        if None in targets:              # not accepted yet: no server end to act on
            self.record("fault-missed", i, side, kind)
            return
        self.record("fault", i, side, kind)
        if kind in LINK_FAULTS:
            now = self.now
            entry = (("loss", now, now + fault["duration_s"], fault["p"]) if kind == "loss"
                     else ("hold", now, now + fault["duration_s"], 0.0))
            for ep in targets:
                self._link_fault(ep, entry)
            return
        for ep in targets:
            if kind == "stall":
                ep.fault_stall(fault["duration_s"])
            elif kind == "slow":
                ep.fault_slow(fault["rate_Bps"], fault["duration_s"])
            elif kind == "reset":
                ep.fault_reset()
            elif kind == "vanish":
                ep.fault_vanish()

    def _clog(self, fault):
        """FoundationDB's swizzle: clog the connections one by one, ``step_s``
        apart; ``duration_s`` after the last, unclog them in reverse order,
        ``step_s`` apart. A clogged link holds every segment (ACKs too) and
        delivers them, in order, when it is unclogged."""
        conns = fault["conns"]
        n = len(conns)
        step = fault["step_s"]
        last_unclog = self.now + (n - 1) * step + fault["duration_s"] + (n - 1) * step
        side = fault["side"]
        for k, i in enumerate(conns):
            targets = ()
            if i < len(self._conns):
                client, server = self._conns[i]
                targets = ((client, server) if side == "both"
                           else (client if side == "client" else server,))
            if not targets or None in targets:
                self.record("fault-missed", i, side, "clog")
                continue
            self.record("fault", i, side, "clog")
            start = self.now + k * step
            end = last_unclog - k * step
            for ep in targets:
                self._link_fault(ep, ("hold", start, end, 0.0))

    def _link_fault(self, ep, entry):
        """Put a wire fault on the link ``ep`` sends on, and wake the link's
        receiver at its end (a hold ends: what it held arrives then)."""
        link = ep._link
        link.sock = ep
        if link.faults is None:
            link.faults = []
        link.faults.append(entry)
        self.call_at(entry[2], self.record, "fault-end", ep._conn, ep._side, entry[0])


class _Event:
    __slots__ = ("fn", "args")

    def __init__(self, fn, args):
        self.fn = fn
        self.args = args

    def cancel(self):
        self.fn = None


class _Seeded:
    """A world's random stream before its first draw: seeding one costs about
    as much as a short world's whole construction, and a world whose draws an
    explorer makes (``install_chooser``) never uses its own. The first use
    puts the seeded ``random.Random`` in its place on the world, so every
    draw after that is the plain generator's, and the sequence is the one a
    generator seeded at construction would give."""
    __slots__ = ("world", "attr", "text")

    def __init__(self, world, attr, text):
        self.world, self.attr, self.text = world, attr, text

    def __getattr__(self, name):
        rng = random.Random(self.text)
        setattr(self.world, self.attr, rng)
        return getattr(rng, name)


class _Buggify:
    """The fault points of one universe: which are enabled (each with
    ``BUGGIFY_ENABLE``, drawn from the seed once) and, at each site, whether
    it fires (``BUGGIFY_FIRE`` from the same stream, or the explorer's choice)."""
    __slots__ = ("points", "on", "rng", "choose", "turn", "spurious_at")

    def __init__(self, seed, points):
        self.points = tuple(points or ())
        # seeding costs a short world's whole construction: only with points
        self.rng = random.Random(f"{seed}:buggify") if self.points else None
        self.on = frozenset(p for p in self.points if self.rng.random() < BUGGIFY_ENABLE)
        self.choose = None
        self.turn = 0
        self.spurious_at = -1.0

    def explore(self, chooser):
        self.on = frozenset(self.points)
        self.choose = chooser.choose

    def fires(self) -> bool:
        if self.choose is not None:
            return bool(self.choose("buggify", 2))    # kernels.choice.BUGGIFY
        return self.rng.random() < BUGGIFY_FIRE

    def size(self, n):
        if self.choose is not None:
            return max(1, n // 2)
        return self.rng.randrange(1, n)


class _Chosen:
    """Stands in for a world's random stream under an explorer: ``random()``
    is 0.0 or just under 1.0, as the chooser picks."""
    __slots__ = ("choose", "kind")

    def __init__(self, chooser, kind):
        self.choose = chooser.choose
        self.kind = kind

    def random(self) -> float:
        return 0.999999 if self.choose(self.kind, 2) else 0.0


#: Parameter sets already found valid (as sorted item tuples): a process that
#: builds thousands of worlds of one set checks it once.
_CHECKED: set = set()


def _check_params_once(p):
    try:
        # the type too: True == 1 and 1.0 == 1, but only some of them are valid
        key = tuple((k, type(v), v) for k, v in sorted(p.items()))
        hash(key)
    except TypeError:            # an unhashable value: check it (and let it fail) every time
        key = None
    if key is not None and key in _CHECKED:
        return
    _check_params(p)
    if key is not None:
        if len(_CHECKED) > 1024:
            _CHECKED.clear()
        _CHECKED.add(key)


def _check_params(p):
    def num(name, low, allow_none=False, integer=False, strict=False):
        v = p[name]
        if v is None and allow_none:
            return
        ok = (not isinstance(v, bool) and isinstance(v, int if integer else (int, float))
              and math.isfinite(v) and (v > low if strict else v >= low))
        if not ok:
            kind = "an int" if integer else "a number"
            bound = f"> {low}" if strict else f">= {low}"
            extra = " or None" if allow_none else ""
            raise ValueError(f"simnet: bad value {v!r} for {name}: must be {kind} {bound}{extra}")
    num("latency_s", 0)
    num("bandwidth_Bps", 0, allow_none=True, strict=True)
    num("jitter_s", 0)
    num("sndbuf", 1, integer=True)
    num("rcvbuf", 1, integer=True)
    num("mss", 1, integer=True)
    num("syn_retry_s", 0, strict=True)
    num("syn_retries", 0, integer=True)
    num("random_faults", 0, integer=True)
    num("fault_horizon_s", 0, strict=True)
    num("fault_connections", 1, integer=True)
    num("cpu_per_wait_s", 0)
    num("sockbuf_scale", 1, integer=True)
    if p["accounting"] not in ACCOUNTING:
        raise ValueError(f"simnet: bad value {p['accounting']!r} for accounting: must be one of "
                         + ", ".join(ACCOUNTING))
    num("skb_overhead", 0, integer=True)
    num("wake_s", 0)
    kinds = p["fault_kinds"]
    if isinstance(kinds, str) or not isinstance(kinds, (list, tuple)) or not kinds \
            or any(k not in FAULT_KINDS for k in kinds):
        raise ValueError(f"simnet: bad value {kinds!r} for fault_kinds: must be a non-empty "
                         f"list of {', '.join(FAULT_KINDS)}")
    p["fault_kinds"] = list(kinds)
    bug = p["buggify"]
    if bug is not None:
        if not isinstance(bug, (list, tuple)) or not all(isinstance(x, str) for x in bug) \
                or set(bug) - set(BUGGIFY_POINTS):
            bad = [x for x in (bug if isinstance(bug, (list, tuple)) else [bug])
                   if x not in BUGGIFY_POINTS]
            raise ValueError(f"simnet: bad value {bad[0] if bad else bug!r} for buggify: a "
                             f"list of {', '.join(BUGGIFY_POINTS)}, or None")
        # one spelling per set, so a universe's params compare equal after JSON
        p["buggify"] = [x for x in BUGGIFY_POINTS if x in bug] or None


def _check_fault(f) -> dict:
    if not isinstance(f, Mapping):
        raise ValueError(f"simnet: a fault must be a dict, got {f!r}")
    kind = f.get("kind")
    if kind not in FAULT_KINDS:
        raise ValueError(f"simnet: bad fault kind {kind!r}; valid: {', '.join(FAULT_KINDS)}")
    out = {"at": f.get("at"), "kind": kind, "conn": f.get("conn", 0),
           "side": f.get("side", "both" if kind in ("reset", "clog", "partition") else "server")}
    if isinstance(out["at"], bool) or not isinstance(out["at"], (int, float)) \
            or not math.isfinite(out["at"]) or out["at"] < 0:
        raise ValueError(f"simnet: fault 'at' must be a time >= 0, got {out['at']!r}")
    if isinstance(out["conn"], bool) or not isinstance(out["conn"], int) or out["conn"] < 0:
        raise ValueError(f"simnet: fault 'conn' must be an index >= 0, got {out['conn']!r}")
    if out["side"] not in FAULT_SIDES:
        raise ValueError(f"simnet: bad fault side {out['side']!r}; valid: {', '.join(FAULT_SIDES)}")
    if kind in ("stall", "slow", "loss", "clog", "partition"):
        d = f.get("duration_s")
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not (0 < d < math.inf):
            raise ValueError(f"simnet: a {kind} fault needs duration_s > 0, got {d!r}")
        out["duration_s"] = d
    if kind == "slow":
        r = f.get("rate_Bps")
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not (0 < r < math.inf):
            raise ValueError(f"simnet: a slow fault needs rate_Bps > 0, got {r!r}")
        out["rate_Bps"] = r
    if kind == "loss":
        q = f.get("p")
        if isinstance(q, bool) or not isinstance(q, (int, float)) or not (0 < q <= 1):
            raise ValueError(f"simnet: a loss fault needs a probability p in (0, 1], got {q!r}")
        out["p"] = q
    if kind == "partition" and out["side"] != "both":
        raise ValueError(f"simnet: a partition cuts both directions: side must be 'both', "
                         f"got {out['side']!r}")
    if kind == "clog":
        if "conn" in f:
            raise ValueError("simnet: a clog fault names its connections in 'conns', not 'conn'")
        del out["conn"]
        cs = f.get("conns")
        if not isinstance(cs, (list, tuple)) or not cs or len(set(cs)) != len(cs) or any(
                isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in cs):
            raise ValueError(f"simnet: a clog fault needs 'conns', a non-empty list of distinct "
                             f"connection indexes >= 0, got {cs!r}")
        out["conns"] = list(cs)
        st = f.get("step_s", 0.0)
        if isinstance(st, bool) or not isinstance(st, (int, float)) or not (0 <= st < math.inf):
            raise ValueError(f"simnet: a clog fault's step_s must be a time >= 0, got {st!r}")
        out["step_s"] = st
    extra = set(f) - set(out)
    if extra:
        raise ValueError(f"simnet: unknown fault field {sorted(extra)[0]!r}")
    return out


def _draw_faults(rng, p) -> list:
    """``random_faults`` faults of the kinds in ``fault_kinds``, in [0, horizon).
    The classic four draw exactly what they always drew, so old seeds keep
    their schedules."""
    faults = []
    kinds = tuple(p["fault_kinds"])
    horizon = p["fault_horizon_s"]
    for _ in range(p["random_faults"]):
        kind = rng.choice(kinds)
        f = {"at": round(rng.uniform(0, horizon), 6), "kind": kind}
        if kind == "clog":
            k = rng.randint(1, p["fault_connections"])
            f["conns"] = sorted(rng.sample(range(p["fault_connections"]), k))
            f["side"] = "both"
            f["step_s"] = round(rng.uniform(0, 0.02 * horizon), 6)
        else:
            f["conn"] = rng.randrange(p["fault_connections"])
            f["side"] = ("both" if kind == "partition" else
                         rng.choice(FAULT_SIDES if kind in ("reset", "loss") else FAULT_SIDES[:2]))
        if kind in ("stall", "slow", "loss", "clog", "partition"):
            f["duration_s"] = round(rng.uniform(0.05, 0.2 * horizon), 6)
        if kind == "slow":
            f["rate_Bps"] = float(rng.choice((16384, 65536, 262144)))
        if kind == "loss":
            f["p"] = float(rng.choice((0.1, 0.3, 0.5, 1.0)))
        faults.append(f)
    faults.sort(key=lambda f: f["at"])
    return faults


# ---------------------------------------------------------------------------
# Simulated TCP sockets


# ---------------------------------------------------------------------------
# A participant of the world

class Peer:
    """A participant that owns one connection's end, acting in the world's own
    time (no poller, no process): the base of the lab's in-world peers, which
    give it a role to play. It hears its
    socket through the socket's ``_watcher`` hook (called after every change,
    see ``SimSocket._changed``). ``listen(addr)`` accepts the
    first connection there; ``connect(addr)`` dials out. Acts when its socket
    changes or its timer fires; ``result()`` reports what it saw."""

    def __init__(self, world, name):
        self.world = world
        self.name = name
        self.sock = None
        self._lsock = None
        self._timer = None
        self._timer_at = math.inf
        self.t0 = None
        self.ended = None          # "eof" | "reset" | "closed" | "vanished" | ...
        self.ended_at = None

    def listen(self, address, backlog=1):
        s = self.world.socket()
        s.setblocking(False)
        s.bind(address)
        s.listen(backlog)
        s._watcher = self._on_listen
        self._lsock = s
        return self

    def address(self):
        return (self._lsock or self.sock).getsockname()

    def connect(self, address, at=0.0):
        def dial():
            s = self.world.socket()
            s.setblocking(False)
            s.connect_ex(address)
            self._attach(s)
        self.world.call_at(at, dial)
        return self

    def _on_listen(self):
        try:
            s, _ = self._lsock.accept()
        except BlockingIOError:
            return
        s.setblocking(False)
        self._lsock.close()
        self._lsock = None
        self._attach(s)

    def _attach(self, s):
        self.sock = s
        self.t0 = self.world.now
        s._watcher = self._act
        self._start()
        s._changed()

    def _start(self):
        pass

    def _wake_at(self, t):
        if self._timer is not None and self._timer_at <= t:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = t
        self._timer = self.world.call_at(t, self._on_timer)

    def _on_timer(self):
        self._timer = None
        self._timer_at = math.inf
        if self.sock is not None and self.ended is None:
            self._act()

    def _end(self, how):
        if self.ended is None:
            self.ended = how
            self.ended_at = self.world.now
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

    def result(self) -> dict:
        return {"name": self.name, "ended": self.ended, "ended_at_s": self.ended_at}
