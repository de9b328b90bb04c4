"""A simulated TCP network under a virtual clock: one seed, one universe.

What it is for
--------------
A scenario on real loopback sockets takes its full duration in wall time, and a
race it hits once cannot be replayed. Here the whole cell -- the program under
test, its peers and the wires between them -- lives in one process as one
deterministic sequence of events. ``World(seed, ...)`` holds the clock and the
event queue; ``world.io()`` is a ``SimIO`` with the shape of the kernels'
I/O-and-time seam (``poller()``, ``waker()``, ``time()``, ``socket()``,
``socketpair()``, ``getaddrinfo()``, ``read_check()``), so a kernel that takes an
IO object runs on it unchanged; ``world.selector()`` is a
``selectors.BaseSelector`` over the same world for code built on selectors.

Time never passes by itself. ``Poller.wait(timeout)`` runs the events due now;
if a registered fd is ready it returns at once, otherwise it jumps the clock to
the next event (a delivery, an acknowledgement, a peer's timer, a fault) and
looks again, until something is ready or ``now + timeout`` is reached. So ten
simulated seconds of a 1 MB/s stream cost a few thousand events, not ten
seconds. ``wait(None)`` with nothing ready and nothing scheduled would block
forever; it raises ``SimDeadlock`` instead.

The model (what a byte goes through)
------------------------------------
Each connection has two directions. In each, the sender's **send buffer**
(``SO_SNDBUF`` bytes, 64 KiB by default, as the scenarios pin on real sockets)
holds bytes the application handed over and the receiver has not acknowledged.
``send`` takes what fits -- a partial write when the buffer is nearly full,
``BlockingIOError`` when it is full -- and the socket polls writable when the
free space is at least half of what is queued (Linux's ``sk_stream_is_writeable``
rule, which is why a full buffer does not wake a writer for every ACK).

Bytes leave the send buffer for the **link** in segments of at most ``mss``
bytes, and only as far as the receiver's **window** allows: the receiver's
``SO_RCVBUF`` minus what is in flight or unread there, as last reported to the
sender. The link serializes at ``bandwidth_Bps`` (``None``: unlimited) and
delivers after ``latency_s`` (plus ``jitter_s`` drawn from the seed; a
direction never reorders). A delivered segment lands in the receiver's
**receive buffer**; its ACK travels back after the latency and frees the
sender's buffer. When the application reads, a window update travels back the
same way. So a reader that stops fills its receive buffer, then the window
closes, then the sender's buffer fills, and the writer blocks: the same two
64 KiB buffers of backpressure a pinned real socket pair has.

That is ``accounting="bytes"`` (the default): capacities are exact byte counts.
``accounting="linux"`` counts the way Linux does, where byte-level outcomes
depend on it (how much a send takes, what a close leaves behind):

* The stream is cut into **skbs**. A send tops up the last unsent skb to a
  size goal, then starts new ones while the queued memory (payload plus
  ``skb_overhead`` per skb, Linux's truesize) is below ``SO_SNDBUF``: one send
  can overshoot the buffer by almost an skb, and sends take whole skbs. The
  goal is half the largest window the peer has offered. A full skb leaves at
  once; the first unsent one swallows those behind it up to a two-segment GSO
  packet, waits while an ACK due within 1 ms would bring more window (TSO
  deferral), and is split at the window's edge. Writable means the free
  memory is at least half the queued memory.
* The **receive window** comes from receive memory, not bytes: the free part of
  ``SO_RCVBUF`` after the truesize of the skbs held, scaled by the payload ratio
  the receiver measured on incoming segments, capped by ``rcv_ssthresh`` (which
  grows only while segments land in a nearly empty buffer), rounded to the
  window scale, never taken back once offered, and zero when what is free is
  under a segment. A partly read skb keeps all its memory.
* **ACKs**: the first segments are ACKed at once; later ones when more than a
  segment waits and the window is not shrinking, or when a read drains more
  than a segment or can double the window; otherwise after 40 ms (delayed ACK).
  A persist timer (0.2 s) sends what a too-small window takes when nothing is in
  flight.

``wake_s`` is the scheduler's part: a program that asked for readiness and did
not get it, and a peer (always asleep between its actions), run that long after
the socket readies. A busy program sees the change at once when it next asks.
With ``latency_s`` of a few microseconds this is loopback as Linux runs it: the
stack settles within microseconds, while the processes wake tens of
microseconds later.

Endings follow Linux:

* ``shutdown(SHUT_WR)`` (and ``close``) queue a FIN behind the unsent data; the
  peer's ``recv`` returns ``b""`` once it has read everything before it. The
  other direction keeps working (half-close). ``send`` after ``SHUT_WR`` raises
  ``BrokenPipeError``.
* ``close()`` with unread received data sends an RST instead of a FIN and drops
  whatever the closer had not sent yet (trio issue 412: the peer may lose data
  it was about to read); so does data arriving at a socket that was closed, and
  ``close()`` after ``SO_LINGER`` (on, 0 s).
* An RST received is a pending ``ECONNRESET``: the receiver can still read what
  had already arrived, then the first ``recv`` or ``send`` raises
  ``ConnectionResetError``; afterwards ``recv`` returns ``b""`` and ``send``
  raises ``BrokenPipeError``. ``SO_ERROR`` reports and clears it too.
* ``connect`` to an address nobody listens on fails with ``ECONNREFUSED`` after
  one round trip. A listener queues at most ``backlog + 1`` connections not yet
  accepted (Linux's accept-queue test); a SYN beyond that is dropped and
  retried after ``syn_retry_s``, doubling, ``syn_retries`` times, then the
  connect fails with ``ETIMEDOUT``.

Faults, planned or drawn from the seed, act on connection ``conn`` (numbered in
``connect`` order from 0; a ``socketpair`` counts too) at time ``at``, on its
``side`` ("client" is the connecting end, "server" the accepted end):

* ``stall``: that side's application sees nothing to read for ``duration_s``
  (data keeps arriving until its receive buffer and the window are full);
* ``slow``: that side reads at most ``rate_Bps`` for ``duration_s``;
* ``reset``: an RST reaches that side ("both": both sides) now;
* ``vanish``: that side's host disappears without a FIN: nothing more crosses
  the connection in either direction, and nothing ever tells the survivor
  (no keep-alive, no retransmission time-out).

What it does not model: congestion control, slow start and Nagle; packet loss
and retransmission (except the SYN retries above) -- a Linux receiver whose
memory overflows drops the segment and the sender retransmits it, here it is
kept; delayed ACKs and everything skb-shaped unless ``accounting="linux"``; the
ACK a loopback receiver sends within the sender's own system call (here it
takes ``2 x latency_s``); IP fragmentation, urgent data, ``SO_LINGER`` with a
time-out; and file-descriptor reuse (fake fds count up from ``FD_BASE``, above
any real descriptor, so passing one to the real OS fails loudly).

Peers
-----
``Source``, ``Sink`` (and its ``StalledReader`` and ``DelayedReader``
settings), ``PipeliningClient`` and ``ResettingPeer`` are sans-IO participants
in the same world: they hold simulated sockets, act when the world tells them a
socket changed or their timer fires, count every byte and timestamp it with
the virtual clock. They are the ground truth, independent of the program under
test.

Replay
------
``world.universe()`` is a JSON-able dict: the seed, every parameter and the
full fault schedule (drawn faults written out). ``World.from_universe(d)``
builds the same world; run the same program on it and every event happens at
the same virtual time in the same order. ``world.log`` lists the events
(``(time, kind, conn, side, value)``) and ``world.digest()`` hashes it.

Standard library only, and no imports from the rest of looplab.
"""
from __future__ import annotations

import bisect
import errno
import hashlib
import heapq
import math
import os
import random
import select
import selectors
import socket as _socket
import struct
from collections import deque
from collections.abc import Mapping

__all__ = ["World", "SimIO", "SimSocket", "SimPoller", "SimWaker", "SimSelector",
           "SimDeadlock", "SimBlockingError", "READ", "WRITE", "FD_BASE", "FAULT_KINDS", "ACCOUNTING",
           "Peer", "Source", "Sink", "StalledReader", "DelayedReader", "PipeliningClient",
           "ResettingPeer", "queue_delays"]

# the event queue's hot path: one module lookup each, not two
_heappush, _heappop = heapq.heappush, heapq.heappop

# The seam's mask bits (epoll's, as the real poller uses); an error or hang-up
# is reported as both.
if hasattr(select, "epoll"):
    READ, WRITE = select.EPOLLIN, select.EPOLLOUT
else:  # pragma: no cover - macOS/BSD/Windows only
    READ, WRITE = 1, 4
_ERR = 1 << 30            # internal: error or hang-up, reported as READ | WRITE
_BOTH = READ | WRITE
_MSG_PEEK = int(_socket.MSG_PEEK)   # a plain int: flags & the enum runs enum code per recv

#: Fake file descriptors start here: above the highest real one a process can
#: hold under Linux's default ``nr_open``.
FD_BASE = 1 << 20

FAULT_KINDS = ("stall", "slow", "reset", "vanish")
ACCOUNTING = ("bytes", "linux")
MAX_EVENTS_AT_ONE_TIME = 1_000_000
_SIDES = ("client", "server", "both")
_SLOW_SLICE_S = 0.05      # a slowed reader gets at most this many seconds of rate per recv

_DEFAULTS = {
    "latency_s": 50e-6,          # one way; loopback is a few microseconds to tens
    "bandwidth_Bps": None,       # None: the link never limits (loopback moves GB/s)
    "jitter_s": 0.0,             # extra one-way delay, uniform in [0, jitter_s), per segment
    "sndbuf": 65536,
    "rcvbuf": 65536,
    "mss": 65483,                # loopback's MTU of 65536 minus the headers
    "syn_retry_s": 1.0,
    "syn_retries": 6,
    "random_faults": 0,          # with faults=None: how many to draw from the seed
    "fault_horizon_s": 10.0,     # drawn faults happen in [0, horizon)
    "fault_connections": 2,      # drawn faults pick a connection in range(this)
    "cpu_per_wait_s": 0.0,       # program CPU time charged per poller wait, uniform in [0, 2x)
    "sockbuf_scale": 1,          # setsockopt(SO_SNDBUF/SO_RCVBUF, n) gives n * this (Linux: 2)
    "accounting": "bytes",       # "bytes": exact byte counts; "linux": skbs, truesize, Linux's window
    "skb_overhead": 832,         # accounting="linux": bytes of truesize per skb beyond its data
    "wake_s": 0.0,               # a program or peer waiting on a socket runs this long after it readies
}

#: ``accounting="linux"``: the constants of Linux's TCP that shape a loopback
#: stream (net/ipv4/tcp*.c, checked against 6.18 on x86-64; see the design
#: notes above ``SimSocket._lx_open``).
_TCP_MSS_DEFAULT = 536          # the receiver's first guess at the sender's segment size
_RATIO_SHIFT = 8                # TCP_RMEM_TO_WIN_SCALE: window = memory * ratio >> 8
_RATIO_DEFAULT = 128            # TCP_DEFAULT_SCALING_RATIO: half, until a segment is measured
_GSO_MAX_SIZE = 65536           # loopback's largest GSO packet: bounds an skb's size goal
_MIN_TSO_SEGS = 2               # tcp_min_tso_segs
_MIN_HALF_WND = 36              # 68 minus a header with timestamps: the smallest size goal
_SOCK_MIN_SNDBUF = 4608         # setsockopt floors (2 x and 1 x TCP_SKB_MIN_TRUESIZE)
_SOCK_MIN_RCVBUF = 2304
_PROBE_S = 0.2                  # TCP_RTO_MIN: when the persist timer fires
_DELACK_S = 0.04                # TCP_DELACK_MIN: a delayed ACK waits this long at most
_MAX_QUICKACKS = 16             # TCP_MAX_QUICKACKS


class SimDeadlock(RuntimeError):
    """``wait(None)`` found nothing ready and nothing that could ever happen."""


class SimBlockingError(RuntimeError):
    """A simulated socket in blocking mode was asked to block: the simulation
    cannot wait inside a call. Call ``setblocking(False)``."""


def _oserror(code, cls=OSError):
    return cls(code, f"{os.strerror(code)} (simulated)")


# ---------------------------------------------------------------------------
# The world: clock, event queue, address space, faults, log


class World:
    """A virtual clock, an event queue and everything on the simulated network.

    ``World(seed, **params)``: see ``_DEFAULTS`` (and the module docstring) for
    the parameters; ``faults`` is a list of fault dicts, or ``None`` to draw
    ``random_faults`` of them from the seed. ``log=False`` keeps no event log
    (``digest()`` then hashes nothing).
    """

    def __init__(self, seed=0, *, faults=None, log=True, **params):
        if isinstance(seed, bool) or not isinstance(seed, (int, str)):
            raise ValueError(f"simnet: seed must be an int or a str, got {seed!r}")
        unknown = sorted(set(params) - set(_DEFAULTS))
        if unknown:
            raise ValueError(f"simnet: unknown parameter {unknown[0]!r}; valid: "
                             + ", ".join(sorted(_DEFAULTS)))
        p = dict(_DEFAULTS)
        p.update(params)
        _check_params(p)
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
        self._rng = random.Random(f"{seed}:net")
        self._cpu_rng = random.Random(f"{seed}:cpu")
        self.log = [] if log else None
        if faults is None:
            faults = _draw_faults(random.Random(f"{seed}:faults"), p)
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

    def digest(self) -> str:
        """SHA-256 of the event log: equal digests, equal event sequences."""
        return hashlib.sha256(repr(self.log).encode()).hexdigest()

    def record(self, kind, conn=None, side=None, value=None):
        if self.log is not None:
            self.log.append((self.now, kind, conn, side, value))

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
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def _run_due(self):
        """Run every event due at or before now, in (time, seq) order. A
        participant that keeps scheduling itself at the same instant would
        stop time for ever: after ``MAX_EVENTS_AT_ONE_TIME`` it is an error."""
        heap = self._heap
        pokes = self._pokes
        now = self.now
        budget = MAX_EVENTS_AT_ONE_TIME
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
                raise RuntimeError(f"simnet: livelock: {MAX_EVENTS_AT_ONE_TIME} events at "
                                   f"t={now:.6f}s without time moving (last: {fn!r})")

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
            poller._fds.pop(fd, None)
        self._gen += 1

    def _ephemeral(self, host) -> tuple:
        while True:
            port = self._next_port
            self._next_port = 40000 + (self._next_port - 40000 + 1) % 20000
            if (host, port) not in self._bound:
                return (host, port)

    # -- the seam's objects -------------------------------------------------

    def io(self, owner="app") -> "SimIO":
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

    def selector(self) -> "SimSelector":
        return SimSelector(self)

    def socket(self, family=_socket.AF_INET, type=_socket.SOCK_STREAM, proto=0):
        return SimSocket(self, family, type, proto)

    def connection(self, index):
        """``(client, server)`` endpoints of connection ``index``."""
        return tuple(self._conns[index])

    # -- faults -----------------------------------------------------------

    def _fault(self, fault):
        i = fault["conn"]
        if i >= len(self._conns):
            self.record("fault-missed", i, fault["side"], fault["kind"])
            return
        client, server = self._conns[i]
        side = fault["side"]
        targets = (client, server) if side == "both" else (client if side == "client" else server,)
        kind = fault["kind"]
        self.record("fault", i, side, kind)
        for ep in targets:
            if kind == "stall":
                ep._gate_until = max(ep._gate_until, self.now + fault["duration_s"])
                self.call_at(ep._gate_until, ep._changed)
            elif kind == "slow":
                ep._slow_rate = fault["rate_Bps"]
                ep._slow_until = self.now + fault["duration_s"]
                ep._slow_due = self.now
                self.call_at(ep._slow_until, ep._changed)
            elif kind == "reset":
                ep._on_rst()
            elif kind == "vanish":
                ep._vanished = True
                ep._link.dead = True
                if ep._peer is not None:
                    ep._peer._link.dead = True
            ep._changed()


class _Event:
    __slots__ = ("fn", "args")

    def __init__(self, fn, args):
        self.fn = fn
        self.args = args

    def cancel(self):
        self.fn = None


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


def _check_fault(f) -> dict:
    if not isinstance(f, Mapping):
        raise ValueError(f"simnet: a fault must be a dict, got {f!r}")
    kind = f.get("kind")
    if kind not in FAULT_KINDS:
        raise ValueError(f"simnet: bad fault kind {kind!r}; valid: {', '.join(FAULT_KINDS)}")
    out = {"at": f.get("at"), "kind": kind, "conn": f.get("conn", 0),
           "side": f.get("side", "both" if kind == "reset" else "server")}
    if isinstance(out["at"], bool) or not isinstance(out["at"], (int, float)) \
            or not math.isfinite(out["at"]) or out["at"] < 0:
        raise ValueError(f"simnet: fault 'at' must be a time >= 0, got {out['at']!r}")
    if isinstance(out["conn"], bool) or not isinstance(out["conn"], int) or out["conn"] < 0:
        raise ValueError(f"simnet: fault 'conn' must be an index >= 0, got {out['conn']!r}")
    if out["side"] not in _SIDES:
        raise ValueError(f"simnet: bad fault side {out['side']!r}; valid: {', '.join(_SIDES)}")
    if kind in ("stall", "slow"):
        d = f.get("duration_s")
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not (0 < d < math.inf):
            raise ValueError(f"simnet: a {kind} fault needs duration_s > 0, got {d!r}")
        out["duration_s"] = d
    if kind == "slow":
        r = f.get("rate_Bps")
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not (0 < r < math.inf):
            raise ValueError(f"simnet: a slow fault needs rate_Bps > 0, got {r!r}")
        out["rate_Bps"] = r
    extra = set(f) - set(out) - {"duration_s", "rate_Bps"}
    if extra:
        raise ValueError(f"simnet: unknown fault field {sorted(extra)[0]!r}")
    return out


def _draw_faults(rng, p) -> list:
    faults = []
    for _ in range(p["random_faults"]):
        kind = rng.choice(FAULT_KINDS)
        f = {"at": round(rng.uniform(0, p["fault_horizon_s"]), 6), "kind": kind,
             "conn": rng.randrange(p["fault_connections"]),
             "side": rng.choice(_SIDES if kind == "reset" else _SIDES[:2])}
        if kind in ("stall", "slow"):
            f["duration_s"] = round(rng.uniform(0.05, 0.2 * p["fault_horizon_s"]), 6)
        if kind == "slow":
            f["rate_Bps"] = float(rng.choice((16384, 65536, 262144)))
        faults.append(f)
    faults.sort(key=lambda f: f["at"])
    return faults


# ---------------------------------------------------------------------------
# Simulated TCP sockets


class _Link:
    """One direction of a connection: serialization and propagation."""
    __slots__ = ("latency", "bandwidth", "jitter", "free_at", "last_arrival", "dead")

    def __init__(self, p):
        self.latency = p["latency_s"]
        self.bandwidth = p["bandwidth_Bps"]
        self.jitter = p["jitter_s"]
        self.free_at = 0.0
        self.last_arrival = 0.0
        self.dead = False

    def arrival(self, world, nbytes) -> float:
        start = world.now if world.now > self.free_at else self.free_at
        if self.bandwidth is not None and nbytes:
            start += nbytes / self.bandwidth
            self.free_at = start
        t = start + self.latency
        if self.jitter:
            t += world._rng.random() * self.jitter
        if t < self.last_arrival:
            t = self.last_arrival          # a direction never reorders
        self.last_arrival = t
        return t


_NEW, _LISTENING, _CONNECTING, _CONNECTED, _CLOSED = range(5)
_STATE_NAMES = ("new", "listening", "connecting", "connected", "closed")


class SimSocket:
    """A TCP socket on the simulated network, with the part of the socket API
    the kernels use. Non-blocking calls that would block raise
    ``BlockingIOError``; in blocking mode they raise ``SimBlockingError``."""

    def __init__(self, world, family=_socket.AF_INET, type=_socket.SOCK_STREAM, proto=0,
                 *, _fd=True):
        if type != _socket.SOCK_STREAM:
            raise _oserror(errno.EPROTONOSUPPORT)
        self._world = world
        self.owner = None                 # which program holds it (World.exit_process)
        self.family = family
        self.type = type
        self.proto = proto
        self._fd = world._new_fd(self) if _fd else -1
        self._blocking = True
        self._state = _NEW
        self._local = None
        self._remote = None
        self._conn = None                 # connection index
        self._side = None                 # "client" | "server"
        self._peer = None
        self._link = _Link(world.params)
        self.sndbuf = world.params["sndbuf"]
        self.rcvbuf = world.params["rcvbuf"]
        self._opts = {}
        self._owns_addr = False
        self._linger_abort = False
        # sending
        self._unsent = bytearray()
        self._unacked = 0
        self._sent_total = 0
        self._peer_read = 0               # the peer's read total, as last reported
        self._fin_queued = False
        self._fin_sent = False
        self._wr_shut = False
        # receiving
        self._rcv = bytearray()
        self._read_total = 0
        self._eof = False
        self._rd_shut = False
        # errors and faults
        self._err = 0                     # pending error, reported once (SO_ERROR, recv, send)
        self._reset = False               # an RST arrived (or we sent one)
        self._app_closed = False
        self._vanished = False
        self._gate_until = 0.0            # stall: nothing readable before this
        self._slow_rate = None
        self._slow_until = 0.0
        self._slow_due = 0.0
        # listening
        self._queue = None
        self._backlog = 0
        # sans-IO peers
        self._watcher = None
        self._poke_pending = False
        # wake_s: when readiness that appeared becomes visible to a waiting program
        self._wake = world.params["wake_s"]
        self._asleep = 0                  # READ/WRITE a program found missing and waits for
        self._read_at = 0.0
        self._write_at = 0.0
        # accounting="linux" (a socketpair keeps exact bytes: AF_UNIX has no window)
        self._lx = world.params["accounting"] == "linux"
        self._wq = deque()                # unsent skbs' lengths, oldest first (sum: _unsent)
        self._rtx = deque()               # sent, unacknowledged skbs' lengths (sum: _unacked)
        self._wmem = 0                    # sk_wmem_queued: both queues' data + overhead per skb
        self._wnd_end = 0                 # the peer's window's right edge, in our send offsets
        self._max_window = 0              # the largest window the peer ever offered
        self._snd_wnd = 0                 # the window it offered last
        self._pushed_seq = 0              # send offset of the last push (forced_push)
        self._last_tx = -1.0              # when we last sent a segment
        self._srtt = 0.0                  # smoothed round trip, from ACKs
        self._probe = None                # the persist timer, while armed
        self._rq = deque()                # received skbs not wholly read: [unread, truesize]
        self._rmem = 0                    # sk_rmem_alloc: their truesize
        self._rcv_nxt = 0                 # bytes received
        self._rcv_wup = 0                 # rcv_nxt when the window was last advertised
        self._rcv_wnd = 0                 # the window advertised then
        self._ssthresh = 0                # rcv_ssthresh: how far the window may grow now
        self._clamp = 0                   # window_clamp: the window for the whole buffer
        self._ratio = _RATIO_DEFAULT      # scaling_ratio: payload per byte of truesize, x256
        self._rcv_mss = _TCP_MSS_DEFAULT  # the peer's segment size, as measured
        self._wscale = 0                  # our receive window's scale (granularity 2**this)
        self._ack_pending = False         # data received and not yet ACKed
        self._ack_pushed = False          # ... some of it in a short segment
        self._ack_started = False         # any data received yet
        self._quick = 0                   # quick ACKs left (ACK every segment)
        self._delack = None               # the delayed-ACK timer, while armed

    def __repr__(self):
        where = f" conn={self._conn} {self._side}" if self._conn is not None else ""
        return f"<SimSocket fd={self._fd} {_STATE_NAMES[self._state]}{where}>"

    # -- readiness -------------------------------------------------------

    def _changed(self):
        world = self._world
        world._gen += 1
        wake = self._wake
        if wake:
            self._wake_edges(world, wake)
        w = self._watcher
        if w is None:
            return
        if w.__class__ is _Watch:
            # a poller's mark costs nothing and decides nothing: the poller asks
            # _events(), which applies wake_s itself (a busy program sees the
            # change at once, a sleeping one after its wake-up)
            w()
        elif not self._poke_pending:
            self._poke_pending = True
            if wake:
                world.call_at(world.now + wake, self._poke)
            else:
                world._pokes.append(self)

    def _wake_edges(self, world, wake):
        """``wake_s``: a program that found this socket not readable (or not
        writable) waits for it; when that changes, the kernel wakes it, and it
        runs that much later (the scheduler's wake-up latency) -- by which time
        the stack may have moved on. A program that was busy meanwhile sees the
        change at once, as ``poll`` does (Linux: SOCK_NOSPACE, sk_data_ready)."""
        rising = self._raw_events() & self._asleep
        if rising:
            self._asleep &= ~rising
            at = world.now + wake
            if rising & READ:
                self._read_at = at
            if rising & WRITE:
                self._write_at = at
            world.call_at(at, self._woken)

    def _woken(self):
        self._world._gen += 1
        w = self._watcher
        if w.__class__ is _Watch:
            w()                       # what the program waited for is now visible

    def _poke(self):
        self._poke_pending = False
        if self._watcher is not None:
            self._watcher()

    def _gated(self) -> bool:
        now = self._world.now
        if now < self._gate_until:
            return True
        if self._slow_rate is not None:
            if now >= self._slow_until:
                self._slow_rate = None
            elif now < self._slow_due:
                return True
        return False

    def _events(self) -> int:
        ev = self._raw_events()
        if self._wake and not ev & _ERR:
            self._asleep |= ~ev & _BOTH       # whoever asks waits for what is missing
            if ev:
                now = self._world.now
                if now < self._read_at:
                    ev &= ~READ
                if now < self._write_at:
                    ev &= ~WRITE
        return ev

    def _raw_events(self) -> int:
        state = self._state
        if state == _CONNECTED:
            if self._err or self._reset:
                return _ERR
            ev = 0
            if (self._rcv or self._eof or self._rd_shut) and not self._gated():
                ev = READ
            if self._wr_shut:
                ev |= WRITE
            else:
                used = self._wmem if self._lx else len(self._unsent) + self._unacked
                if self.sndbuf - used >= used >> 1 and self.sndbuf > used:
                    ev |= WRITE
            if self._eof and self._wr_shut:
                ev |= _ERR                 # both directions shut: a hang-up
            return ev
        if state == _LISTENING:
            return READ if self._queue else 0
        if state == _CONNECTING:
            return 0
        if self._err or self._conn is not None:
            return _ERR                    # a failed connect: error, then hang-up
        return _ERR if state == _CLOSED else 0

    # -- plain socket calls ------------------------------------------------

    def fileno(self) -> int:
        return self._fd

    def setblocking(self, flag) -> None:
        self._blocking = bool(flag)

    def getblocking(self) -> bool:
        return self._blocking

    def settimeout(self, value) -> None:
        self._blocking = value is None or value > 0

    def gettimeout(self):
        return None if self._blocking else 0.0

    def _would_block(self, what):
        if self._blocking:
            raise SimBlockingError(f"simulated socket fd {self._fd} is in blocking mode and "
                                   f"{what} would block; call setblocking(False)")
        raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable (simulated)")

    def _check_open(self):
        if self._app_closed:
            raise _oserror(errno.EBADF)

    def bind(self, address) -> None:
        self._check_open()
        host, port = _address(address)
        if self._local is not None:
            raise _oserror(errno.EINVAL)
        if port == 0:
            addr = self._world._ephemeral(host)
        else:
            addr = (host, port)
            if addr in self._world._bound:
                raise _oserror(errno.EADDRINUSE)
        self._world._bound.add(addr)
        self._local = addr
        self._owns_addr = True

    def listen(self, backlog=128) -> None:
        self._check_open()
        if self._state not in (_NEW, _LISTENING):
            raise _oserror(errno.EINVAL)
        if self._local is None:
            self.bind(("0.0.0.0", 0))
        self._backlog = max(0, int(backlog))
        if self._state == _NEW:
            self._state = _LISTENING
            self._queue = deque()
            self._world._listeners[self._local] = self
        self._changed()

    def getsockname(self):
        return self._local if self._local is not None else ("0.0.0.0", 0)

    def getpeername(self):
        if self._state != _CONNECTED or self._remote is None:
            raise _oserror(errno.ENOTCONN)
        return self._remote

    def setsockopt(self, level, option, value, *rest) -> None:
        self._check_open()
        if level == _socket.SOL_SOCKET and option == _socket.SO_SNDBUF:
            self.sndbuf = max(_SOCK_MIN_SNDBUF if self._lx else 1,
                              int(value) * self._world.params["sockbuf_scale"])
            self._changed()
        elif level == _socket.SOL_SOCKET and option == _socket.SO_RCVBUF:
            self.rcvbuf = max(_SOCK_MIN_RCVBUF if self._lx else 1,
                              int(value) * self._world.params["sockbuf_scale"])
            if self._peer is not None:
                self._peer._pump()
        elif level == _socket.SOL_SOCKET and option == _socket.SO_LINGER:
            onoff, secs = struct.unpack("ii", value)
            self._linger_abort = bool(onoff) and secs == 0
            self._opts[(level, option)] = value
        else:
            self._opts[(level, option)] = value     # TCP_NODELAY, SO_REUSEADDR, ...: no effect

    def getsockopt(self, level, option, buflen=None):
        self._check_open()
        if level == _socket.SOL_SOCKET:
            if option == _socket.SO_ERROR:
                err, self._err = self._err, 0
                return err
            if option == _socket.SO_SNDBUF:
                return self.sndbuf
            if option == _socket.SO_RCVBUF:
                return self.rcvbuf
        value = self._opts.get((level, option), 0)
        return value

    # -- connecting and accepting ----------------------------------------------

    def connect_ex(self, address) -> int:
        self._check_open()
        if self._state == _CONNECTING:
            return errno.EALREADY
        if self._state == _CONNECTED:
            return errno.EISCONN
        if self._state != _NEW:
            return errno.EINVAL
        if self._err:                        # an earlier connect failed
            err, self._err = self._err, 0
            return err
        world = self._world
        host, port = _address(address)
        if self._local is None:
            self._local = world._ephemeral("127.0.0.1")
            world._bound.add(self._local)
            self._owns_addr = True
        self._remote = (host, port)
        self._state = _CONNECTING
        self._conn = len(world._conns)
        self._side = "client"
        world._conns.append([self, None])
        world.record("syn", self._conn, "client", port)
        world.call_at(self._link.arrival(world, 0), self._syn_arrives, 0)
        return errno.EINPROGRESS

    def connect(self, address) -> None:
        err = self.connect_ex(address)
        if err == errno.EINPROGRESS:
            if self._blocking:
                raise SimBlockingError(f"simulated socket fd {self._fd} is in blocking mode "
                                       "and connect would block; call setblocking(False)")
            raise BlockingIOError(errno.EINPROGRESS, "Operation now in progress (simulated)")
        if err:
            raise _oserror(err)

    def _syn_arrives(self, attempt):
        world = self._world
        if self._state != _CONNECTING:
            return
        host, port = self._remote
        lsock = world._listeners.get((host, port)) or world._listeners.get(("0.0.0.0", port))
        if lsock is None or lsock._state != _LISTENING:
            world.call_at(world.now + self._link.latency, self._connect_failed,
                          errno.ECONNREFUSED)
            return
        if len(lsock._queue) > lsock._backlog:
            world.record("syn-drop", self._conn, "client", attempt)
            if attempt >= world.params["syn_retries"]:
                self._connect_failed(errno.ETIMEDOUT)
            else:
                world.call_at(world.now + world.params["syn_retry_s"] * 2 ** attempt,
                              self._syn_arrives, attempt + 1)
            return
        server = SimSocket(world, self.family, self.type, self.proto, _fd=False)
        server._state = _CONNECTED
        server._local = lsock._local if lsock._local[0] != "0.0.0.0" else (host, port)
        server._remote = self._local
        server._conn = self._conn
        server._side = "server"
        server.sndbuf = lsock.sndbuf          # accepted sockets inherit the listener's sizes
        server.rcvbuf = lsock.rcvbuf
        server._peer = self
        self._peer = server
        if self._lx:
            # each side's first window: the SYN's (client) and the SYN-ACK's (server)
            self._wnd_end = self._max_window = self._snd_wnd = server._lx_open()
            server._wnd_end = server._max_window = server._snd_wnd = self._lx_open()
            self._srtt = server._srtt = 2 * self._link.latency     # the handshake's
        world._conns[self._conn][1] = server
        # the SYN-ACK goes first on the way back: server data can't overtake it
        synack = server._link.arrival(world, 0)
        world.call_at(synack, self._established)
        lsock._queue.append(server)
        world.record("accept-queued", self._conn, "server", len(lsock._queue))
        lsock._changed()

    def _established(self):
        if self._state != _CONNECTING:
            return
        self._state = _CONNECTED
        self._world.record("established", self._conn, "client", None)
        self._changed()

    def _connect_failed(self, err):
        if self._state != _CONNECTING:
            return
        self._state = _NEW
        self._err = err
        self._world.record("connect-failed", self._conn, "client", errno.errorcode.get(err))
        self._changed()

    def accept(self):
        self._check_open()
        if self._state != _LISTENING:
            raise _oserror(errno.EINVAL)
        if not self._queue:
            self._would_block("accept")
        conn = self._queue.popleft()
        conn._fd = self._world._new_fd(conn)
        conn.owner = self.owner
        self._world.record("accept", conn._conn, "server", conn._fd)
        self._changed()
        return conn, conn._remote

    # -- data -----------------------------------------------------------

    def send(self, data, flags=0) -> int:
        self._check_open()
        if self._state != _CONNECTED:
            if self._state == _CONNECTING:
                self._would_block("send")
            if self._err:                      # a failed connect
                raise _error_exc(self._take_err())
            raise _oserror(errno.ENOTCONN)
        if self._err:
            raise _error_exc(self._take_err())
        if self._wr_shut or self._reset:
            raise BrokenPipeError(errno.EPIPE, "Broken pipe (simulated)")
        if self._lx:
            return self._lx_send(data)
        free = self.sndbuf - len(self._unsent) - self._unacked
        if free <= 0:
            self._would_block("send")
        n = len(data)
        if n > free:
            n = free
            self._unsent += memoryview(data)[:n]
        else:
            self._unsent += data
        if n:
            self._pump()
            self._changed()
        return n

    def recv(self, bufsize, flags=0) -> bytes:
        n = self._recv_size(bufsize, flags)
        if n is None:
            return b""
        rcv = self._rcv
        data = memoryview(rcv)[:n].tobytes()       # one copy, not a slice and then bytes
        if flags & _MSG_PEEK:
            return data
        del rcv[:n]
        self._consumed(n)
        return data

    def recv_into(self, buffer, nbytes=0, flags=0) -> int:
        view = memoryview(buffer).cast("B")
        size = nbytes or len(view)
        n = self._recv_size(size, flags)
        if n is None:
            return 0
        view[:n] = memoryview(self._rcv)[:n]
        if not flags & _MSG_PEEK:
            del self._rcv[:n]
            self._consumed(n)
        return n

    def _recv_size(self, bufsize, flags):
        """How many bytes a recv of ``bufsize`` returns now; ``None`` for EOF.
        Raises what Linux's tcp_recvmsg would."""
        self._check_open()
        if bufsize < 0:
            raise ValueError("negative buffersize in recv")
        if self._state != _CONNECTED:
            if self._state == _CONNECTING:
                self._would_block("recv")
            if self._err:
                raise _error_exc(self._take_err())
            raise _oserror(errno.ENOTCONN)
        if self._gated():
            self._would_block("recv")
        rcv = self._rcv
        if rcv and not self._rd_shut:
            n = bufsize if bufsize < len(rcv) else len(rcv)
            if self._slow_rate is not None:
                cap = max(1, int(self._slow_rate * _SLOW_SLICE_S))
                if n > cap:
                    n = cap
                now = self._world.now
                self._slow_due = max(self._slow_due, now) + n / self._slow_rate
                self._world.call_at(self._slow_due, self._changed)
            return n
        if self._eof or self._rd_shut:
            return None
        if self._err:
            raise _error_exc(self._take_err())
        if self._reset:
            return None
        if bufsize == 0:
            return 0
        self._would_block("recv")

    def _consumed(self, n):
        if not n:
            return
        self._read_total += n
        if self._lx:
            self._lx_consumed(n)
            return
        peer = self._peer
        world = self._world
        if peer is not None and not self._reset:
            # the window update travels back like an ACK
            reverse = self._link
            if not reverse.dead:
                world.call_at(world.now + reverse.latency, peer._on_window, self._read_total)
        self._changed()

    def _take_err(self):
        err, self._err = self._err, 0
        return err

    # -- the wire ---------------------------------------------------------

    def _pump(self):
        """Move unsent bytes onto the link as far as the peer's window allows,
        then the FIN if one is queued behind them."""
        if not self._unsent and (self._fin_sent or not self._fin_queued):
            return
        peer = self._peer
        if peer is None or self._reset or self._state != _CONNECTED:
            return
        if self._lx:
            self._lx_pump(peer)
            return
        world = self._world
        link = self._link
        unsent = self._unsent
        mss = world.params["mss"]
        while unsent:
            window = peer.rcvbuf - (self._sent_total - self._peer_read)
            if window <= 0:
                return
            n = min(len(unsent), mss, window)
            if n == len(unsent):
                data = bytes(unsent)
                unsent.clear()
            else:
                data = memoryview(unsent)[:n].tobytes()
                del unsent[:n]
            self._sent_total += n
            self._unacked += n
            world.call_at(link.arrival(world, n), peer._deliver, data)
        if self._fin_queued and not self._fin_sent:
            self._fin_sent = True
            world.call_at(link.arrival(world, 0), peer._on_fin)

    def _deliver(self, data):
        """A segment arrives at this endpoint."""
        world = self._world
        sender = self._peer
        if sender._link.dead or self._vanished:
            return
        if self._reset:
            return
        if self._app_closed:
            # data for a socket nobody will read: answer with an RST (Linux)
            world.record("rst-on-data", self._conn, self._side, len(data))
            self._send_rst()
            return
        self._rcv += data
        n = len(data)
        world.record("deliver", self._conn, self._side, n)
        reverse = self._link
        if not reverse.dead:
            world.call_at(world.now + reverse.latency, sender._on_ack, n, self._read_total)
        self._changed()

    def _on_ack(self, n, peer_read):
        if self._reset or self._vanished:
            return
        self._unacked -= n
        if peer_read > self._peer_read:
            self._peer_read = peer_read
        self._pump()
        self._changed()

    def _on_window(self, peer_read):
        if self._reset or self._vanished:
            return
        if peer_read > self._peer_read:
            self._peer_read = peer_read
            self._pump()
            self._changed()

    def _on_fin(self):
        if self._reset or self._vanished or self._peer._link.dead:
            return
        self._eof = True
        self._world.record("fin", self._conn, self._side, None)
        self._changed()

    def _send_rst(self):
        """Abort: tell the peer, drop what we had not sent."""
        world = self._world
        peer = self._peer
        self._unsent.clear()
        self._unacked = 0
        self._lx_drop_queues()
        self._reset = True
        if peer is not None and not self._link.dead:
            world.call_at(self._link.arrival(world, 0), peer._rst_arrives)
        self._changed()

    def _rst_arrives(self):
        if not self._peer._link.dead:
            self._on_rst()

    def _on_rst(self):
        if self._reset or self._vanished:
            return
        self._reset = True
        if not self._app_closed and self._state == _CONNECTED:
            self._err = errno.ECONNRESET
        self._unsent.clear()
        self._unacked = 0
        self._lx_drop_queues()
        self._world.record("rst", self._conn, self._side, len(self._rcv))
        self._changed()

    # -- accounting="linux": skbs, truesize and Linux's window ------------------
    #
    # Linux does not count bytes against a socket's buffers: it counts skbs.
    # A send appends to the last unsent skb up to a size goal, then starts new
    # skbs for as long as the queued memory (sk_wmem_queued: payload plus a
    # fixed truesize overhead per skb) is below SO_SNDBUF -- so one send can
    # overshoot the buffer by up to one skb, and a send takes whole skbs. The
    # size goal is bounded by half the largest window the peer ever offered
    # (tcp_bound_to_half_wnd), and that window comes from the peer's receive
    # memory (payload plus overhead per skb) scaled by the payload/truesize
    # ratio it measured (tcp_win_from_space), capped by rcv_ssthresh (which
    # grows only while the buffer has room for more than it), and never shrunk
    # once offered. On loopback with 64 KiB pinned (128 KiB effective) buffers
    # that makes the first skbs 32,741 bytes (half of the SYN's 65,483-byte
    # window), the window 94,834 bytes once the first segment is measured, and
    # every later skb 47,417 bytes: S3's 8,000,000-byte write leaves
    # (8,000,000 - 32,741 - 94,834) mod 47,417 = 1,203 bytes in the last skb.
    # The ACK rules (quick ACKs, delayed ACKs, ACK on read) decide when the
    # sender's memory comes back, and with it when a writer wakes.

    def _lx_open(self) -> int:
        """The handshake: set up this end's receive side and return the window
        its SYN (or SYN-ACK) offers (tcp_select_initial_window)."""
        mss = self._world.params["mss"]
        space = (self.rcvbuf * _RATIO_DEFAULT) >> _RATIO_SHIFT
        self._ratio = _RATIO_DEFAULT
        self._clamp = space
        self._wscale = min(14, max(0, space.bit_length() - 16))
        wnd = space - space % mss if space > mss else space
        wnd = min(wnd, 65535)                 # a SYN's window is never scaled
        self._rcv_wnd = self._ssthresh = wnd
        self._rcv_mss = _TCP_MSS_DEFAULT
        return wnd

    def _lx_mss_now(self):
        """(segment size, size goal) for what we send now (tcp_current_mss,
        tcp_xmit_size_goal): both bounded by half the peer's largest window."""
        mss = self._world.params["mss"]
        w = self._max_window
        cutoff = w >> 1 if w > _TCP_MSS_DEFAULT else w
        if cutoff and mss > cutoff:
            mss = max(cutoff, _MIN_HALF_WND)
        goal = _GSO_MAX_SIZE
        if cutoff and goal > cutoff:
            goal = max(cutoff, _MIN_HALF_WND)
        return mss, max(mss, goal // mss * mss)

    def _lx_send(self, data) -> int:
        """tcp_sendmsg: fill the last unsent skb up to the size goal, then new
        skbs while sk_wmem_queued < SO_SNDBUF. A full skb goes out at once if
        it is the first unsent one (tcp_push_one), and everything queued does
        every half window (forced_push) and at the end."""
        n = len(data)
        if not n:
            return 0
        goal = self._lx_mss_now()[1]
        over = self._world.params["skb_overhead"]
        peer = self._peer
        wq = self._wq
        view = data if isinstance(data, (bytes, bytearray)) else memoryview(data).cast("B")
        taken = 0
        while taken < n:
            if wq and wq[-1] < goal:
                copy = min(goal - wq[-1], n - taken)
                wq[-1] += copy
            elif self._wmem >= self.sndbuf:
                break
            else:
                copy = min(goal, n - taken)
                wq.append(copy)
                self._wmem += over
            self._wmem += copy
            self._unsent += view[taken:taken + copy]
            taken += copy
            if taken < n and wq[-1] >= goal:
                write_seq = self._sent_total + len(self._unsent)
                if write_seq > self._pushed_seq + (self._max_window >> 1):
                    self._pushed_seq = write_seq
                    self._lx_pump(peer)
                elif len(wq) == 1:
                    self._lx_pump(peer, push_one=True)
        if not taken:
            self._would_block("send")
        self._pushed_seq = self._sent_total + len(self._unsent)
        self._lx_pump(peer)
        self._changed()
        return taken

    def _lx_pump(self, peer, push_one=False):
        """tcp_write_xmit: the first unsent skb takes bytes from those behind
        it up to a GSO packet (tcp_grow_skb), goes out if its first segment fits
        the window (tcp_snd_wnd_test) unless it is better to wait for the ACK
        under way (tcp_tso_should_defer), and is split at the window's edge."""
        world = self._world
        link = self._link
        wq = self._wq
        over = world.params["skb_overhead"]
        mss_now = self._lx_mss_now()[0]
        max_len = max(_MIN_TSO_SEGS, _GSO_MAX_SIZE // mss_now) * mss_now
        while wq:
            head = wq[0]
            while head < max_len and len(wq) > 1:
                take = min(max_len - head, wq[1])
                head += take
                if take == wq[1]:
                    del wq[1]
                    self._wmem -= over        # the emptied skb is freed
                else:
                    wq[1] -= take
            wq[0] = head
            room = self._wnd_end - self._sent_total
            if room < (head if head < mss_now else mss_now):
                if room > 0 and not self._rtx and self._probe is None and not link.dead:
                    # too small a window and nothing in flight to bring a bigger one
                    self._probe = world.call_at(world.now + _PROBE_S, self._lx_probe)
                return
            if not push_one and head > mss_now and self._lx_defer(head, room, max_len, len(wq) == 1):
                return
            n = head if head < max_len else max_len
            if n > room:
                n = room
            if n < head:
                wq[0] = head - n
                self._wmem += over            # the rest becomes an skb of its own
            else:
                wq.popleft()
            self._lx_transmit(peer, n, mss_now)
            if push_one:
                return
        if self._fin_queued and not self._fin_sent:
            self._fin_sent = True
            world.call_at(link.arrival(world, 0), peer._on_fin)

    def _lx_defer(self, head, room, max_len, is_tail) -> bool:
        """tcp_tso_should_defer, without congestion control: hold a packet the
        window cannot take whole when an ACK (and with it more window) is due
        within min(1 ms, srtt/2) and something was sent within the last 1 ms."""
        now = self._world.now
        if now - self._last_tx > 1e-3 or room >= max_len or (not is_tail and room >= head):
            return False
        if room >= self._snd_wnd // 3 or not self._rtx or (self._fin_queued and is_tail):
            return False
        srtt = self._srtt
        return self._rtx[0][1] + srtt - now <= min(srtt / 2, 1e-3)

    def _lx_transmit(self, peer, n, mss_now):
        world = self._world
        unsent = self._unsent
        if n == len(unsent):
            data = bytes(unsent)
            unsent.clear()
        else:
            data = memoryview(unsent)[:n].tobytes()
            del unsent[:n]
        self._sent_total += n
        self._unacked += n
        now = world.now
        self._last_tx = now
        self._rtx.append((n, now))
        if self._ack_pending:
            self._lx_send_ack()               # the segment carries it
        world.call_at(self._link.arrival(world, n), peer._lx_deliver, data,
                      mss_now if n > mss_now else n)

    def _lx_probe(self):
        """The persist timer: a window too small for the next segment and
        nothing in flight. Send what fits (tcp_write_wakeup); its ACK brings
        the window back."""
        self._probe = None
        peer = self._peer
        if (self._rtx or not self._wq or peer is None or self._reset
                or self._state != _CONNECTED or self._link.dead):
            return
        room = self._wnd_end - self._sent_total
        if room <= 0:
            return
        mss_now = self._lx_mss_now()[0]
        n = min(room, mss_now, self._wq[0])
        if n < self._wq[0]:
            self._wq[0] -= n
            self._wmem += self._world.params["skb_overhead"]
        else:
            self._wq.popleft()
        self._world.record("probe", self._conn, self._side, n)
        self._lx_transmit(peer, n, mss_now)

    def _lx_deliver(self, data, gso):
        """A segment arrives: queue it as one skb, measure it (tcp_measure_rcv_mss,
        tcp_grow_window), and ACK now or later (__tcp_ack_snd_check)."""
        world = self._world
        sender = self._peer
        if sender._link.dead or self._vanished or self._reset:
            return
        if self._app_closed:
            world.record("rst-on-data", self._conn, self._side, len(data))
            self._send_rst()
            return
        n = len(data)
        truesize = n + world.params["skb_overhead"]
        self._rcv += data
        self._rcv_nxt += n
        self._rq.append([n, truesize])
        self._rmem += truesize
        if gso >= self._rcv_mss:
            if gso != self._rcv_mss:
                ratio = (n << _RATIO_SHIFT) // truesize or 1
                if ratio != self._ratio:
                    self._ratio = ratio
                    self._clamp = (self.rcvbuf * ratio) >> _RATIO_SHIFT
                    if self._clamp < self._ssthresh:
                        self._ssthresh = self._clamp
            self._rcv_mss = min(gso, world.params["mss"])
        else:
            self._ack_pushed = True           # a short segment: ACK once it is all read
        if not self._ack_started:
            # the first data: quick ACKs for about a window's worth (tcp_incr_quickack)
            self._ack_started = True
            self._quick = max(self._quick, min(_MAX_QUICKACKS,
                                               self._rcv_wnd // (2 * self._rcv_mss) or 2))
        if n >= 128:
            space = ((self.rcvbuf - self._rmem) * self._ratio) >> _RATIO_SHIFT
            room = min(self._clamp, space) - self._ssthresh
            if room > 0:
                self._ssthresh += min(room, max(2 * self._rcv_mss, 2 * n))
                self._quick |= 1
        world.record("deliver", self._conn, self._side, n)
        self._ack_pending = True
        if self._quick or (self._rcv_nxt - self._rcv_wup > self._rcv_mss
                           and self._lx_free_window() >= self._rcv_wnd):
            self._lx_send_ack()
        elif self._delack is None:
            self._delack = world.call_at(world.now + _DELACK_S, self._lx_delack)
        self._changed()

    def _lx_send_ack(self):
        """An ACK of everything received, with the window we can offer now."""
        if self._ack_pending and self._quick:
            self._quick -= 1
        self._ack_pending = self._ack_pushed = False
        if self._delack is not None:
            self._delack.cancel()
            self._delack = None
        wnd = self._lx_select_window()
        peer = self._peer
        if peer is not None and not self._reset and not self._link.dead:
            world = self._world
            world.call_at(world.now + self._link.latency, peer._lx_on_ack, self._rcv_nxt,
                          self._rcv_nxt + wnd, wnd)

    def _lx_delack(self):
        self._delack = None
        if self._ack_pending and self._state == _CONNECTED:
            self._lx_send_ack()

    def _lx_free_window(self) -> int:
        """__tcp_select_window: the window our free receive memory allows."""
        ratio = self._ratio
        free = ((self.rcvbuf - self._rmem) * ratio) >> _RATIO_SHIFT
        allowed = (self.rcvbuf * ratio) >> _RATIO_SHIFT
        full = min(self._clamp, allowed)
        mss = min(self._rcv_mss, full)
        if mss <= 0:
            return 0
        grain = 1 << self._wscale
        if free < full >> 1:
            if free < 0:
                return 0
            free -= free % grain
            if free < allowed >> 4 or free < mss:
                return 0
        if free > self._ssthresh:
            free = self._ssthresh
        return -(-free // grain) * grain

    def _lx_select_window(self) -> int:
        """tcp_select_window: never take back a window once offered."""
        cur = self._rcv_wup + self._rcv_wnd - self._rcv_nxt
        new = self._lx_free_window()
        if new < cur:
            grain = 1 << self._wscale
            new = -(-cur // grain) * grain
        self._rcv_wnd = new
        self._rcv_wup = self._rcv_nxt
        return new

    def _lx_consumed(self, n):
        """A read frees the skbs it emptied; a partly read skb keeps all its
        memory. Then an ACK if more than a segment waits for one, or if the
        window can now at least double (tcp_cleanup_rbuf)."""
        rq = self._rq
        while n and rq:
            head = rq[0]
            if n >= head[0]:
                n -= head[0]
                self._rmem -= head[1]
                rq.popleft()
            else:
                head[0] -= n
                n = 0
        if self._peer is not None and not self._reset and not self._link.dead:
            if self._ack_pending and (self._rcv_nxt - self._rcv_wup > self._rcv_mss
                                      or (self._ack_pushed and not self._rmem)):
                self._lx_send_ack()
            else:
                now_wnd = self._rcv_wup + self._rcv_wnd - self._rcv_nxt
                if now_wnd < 0:
                    now_wnd = 0
                if 2 * now_wnd <= self._clamp:
                    new = self._lx_free_window()
                    if new and new >= 2 * now_wnd:
                        self._lx_send_ack()
        self._changed()

    def _lx_on_ack(self, ack, wnd_end, wnd):
        """An ACK (or a window update) arrives: free the skbs it covers (a
        partly covered one loses the covered bytes), take the window."""
        if self._reset or self._vanished:
            return
        acked = ack - (self._sent_total - self._unacked)
        if acked > 0:
            self._unacked -= acked
            over = self._world.params["skb_overhead"]
            rtx = self._rtx
            first = None
            while acked and rtx:
                sent, t = rtx[0]
                if first is None:
                    first = t
                if sent <= acked:
                    rtx.popleft()
                    acked -= sent
                    self._wmem -= sent + over
                else:
                    rtx[0] = (sent - acked, t)
                    self._wmem -= acked
                    acked = 0
            self._srtt += (self._world.now - first - self._srtt) / 8
        self._snd_wnd = wnd
        if wnd > self._max_window:
            self._max_window = wnd
        if wnd_end > self._wnd_end:
            self._wnd_end = wnd_end
        self._pump()
        self._changed()

    def _lx_drop_queues(self):
        self._wq.clear()
        self._rtx.clear()
        self._wmem = 0
        if self._probe is not None:
            self._probe.cancel()
            self._probe = None
        if self._delack is not None:
            self._delack.cancel()
            self._delack = None
        self._ack_pending = False

    # -- endings ----------------------------------------------------------

    def shutdown(self, how) -> None:
        self._check_open()
        if self._state != _CONNECTED:
            raise _oserror(errno.ENOTCONN)
        if how in (_socket.SHUT_RD, _socket.SHUT_RDWR):
            self._rd_shut = True
        if how in (_socket.SHUT_WR, _socket.SHUT_RDWR) and not self._wr_shut:
            self._wr_shut = True
            self._fin_queued = True
            self._world.record("shutdown", self._conn, self._side, len(self._unsent))
            self._pump()
        self._changed()

    def close(self) -> None:
        if self._app_closed:
            return
        world = self._world
        self._app_closed = True
        if self._state == _LISTENING:
            world._listeners.pop(self._local, None)
            for conn in self._queue:           # never accepted: reset them
                conn._app_closed = True
                conn._send_rst()
            self._queue.clear()
        elif self._state == _CONNECTED and not self._reset:
            if self._rcv or self._linger_abort:
                world.record("close-rst", self._conn, self._side, len(self._rcv))
                self._send_rst()
            else:
                world.record("close", self._conn, self._side, len(self._unsent))
                if not self._fin_queued:
                    self._fin_queued = True
                    self._wr_shut = True
                    self._pump()
        elif self._state == _CONNECTING:
            self._state = _CLOSED
        if self._owns_addr:
            world._bound.discard(self._local)
        if self._fd >= 0:
            world._release_fd(self._fd)
        self._fd = -1
        self._watcher = None

    def detach(self):
        raise OSError("simulated sockets cannot be detached")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- introspection for tests and peers -------------------------------------

    @property
    def unread_bytes(self) -> int:
        """Bytes received and not yet read (FIONREAD)."""
        return len(self._rcv)

    @property
    def peer_eof(self) -> bool:
        """A FIN arrived (POLLRDHUP: seen without reading)."""
        return self._eof

    @property
    def peer_reset(self) -> bool:
        """An RST arrived or was sent."""
        return self._reset

    @property
    def queued_bytes(self) -> int:
        """Bytes in the send buffer: unsent plus unacknowledged."""
        return len(self._unsent) + self._unacked


def _error_exc(err):
    if err == errno.ECONNRESET:
        return ConnectionResetError(err, "Connection reset by peer (simulated)")
    if err == errno.EPIPE:
        return BrokenPipeError(err, "Broken pipe (simulated)")
    if err == errno.ECONNREFUSED:
        return ConnectionRefusedError(err, "Connection refused (simulated)")
    if err == errno.ETIMEDOUT:
        return TimeoutError(err, "Connection timed out (simulated)")
    return OSError(err, f"{os.strerror(err)} (simulated)")


def _address(address):
    if not (isinstance(address, tuple) and len(address) >= 2):
        raise TypeError(f"simulated sockets take (host, port) addresses, got {address!r}")
    host, port = address[0], address[1]
    if host in ("", None):
        host = "0.0.0.0"
    elif host == "localhost":
        host = "127.0.0.1"
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise OverflowError(f"port must be 0-65535, got {port!r}")
    return (host, port)


# ---------------------------------------------------------------------------
# The seam: poller, waker, clock, sockets


class SimPoller:
    """The seam's poller over the world. ``wait`` never blocks: it advances the
    virtual clock instead (see the module docstring).

    ``wait`` asks a registered fd for its readiness again only when it may have
    changed: each registered socket's ``_watcher`` (the hook peers use, which
    the world calls after every ``_changed`` of the socket) marks it, and so do
    a waker's ``wake`` and ``register``/``modify``; an fd that was ready at the
    last look is asked again every time (its reader may have drained it). So
    every change that can make a socket ready must go through ``_changed``,
    as the peers already need. An fd nobody marked was
    not ready and still is not, so the events that only concern others -- the
    peers' deliveries, ACKs and timers -- cost no look at all. The events come
    out in registration order, as from a full scan (``ready()``). A socket that
    already has another watcher (a peer's) keeps it and is asked every time."""
    __slots__ = ("_world", "_fds", "_closed", "_spin_at", "_spins", "_dirty", "_recheck",
                 "_always")

    #: Tests set this to check every wait's answer against a full scan.
    verify_skips = False

    def __init__(self, world):
        self._world = world
        self._fds = {}
        self._closed = False
        self._spin_at = -1.0
        self._spins = 0
        self._dirty = set()           # fds marked since the last look
        self._recheck = set()         # fds that were ready at the last look
        self._always = set()          # fds this poller cannot watch: asked every time
        world._pollers.append(self)

    def register(self, fd, mask) -> None:
        self._check(fd)
        if fd in self._fds:
            raise FileExistsError(errno.EEXIST, f"fd {fd} is already registered")
        self._fds[fd] = mask
        self._watch(fd)

    def modify(self, fd, mask) -> None:
        self._check(fd)
        if fd not in self._fds:
            raise FileNotFoundError(errno.ENOENT, f"fd {fd} is not registered")
        self._fds[fd] = mask
        self._watch(fd)

    def _watch(self, fd):
        self._dirty.add(fd)
        obj = self._world._files[fd]
        w = obj._watcher
        if w is None:
            obj._watcher = w = _Watch(fd)
        elif w.__class__ is not _Watch:
            self._always.add(fd)
            return
        if self not in w.pollers:
            w.pollers.append(self)

    def unregister(self, fd) -> None:
        if self._closed:
            raise ValueError("I/O operation on closed poller")
        if self._fds.pop(fd, None) is None:
            raise FileNotFoundError(errno.ENOENT, f"fd {fd} is not registered")

    def _check(self, fd):
        if self._closed:
            raise ValueError("I/O operation on closed poller")
        if fd not in self._world._files:
            raise OSError(errno.EBADF, f"fd {fd} is not an open simulated file")

    def ready(self) -> list:
        """What ``wait(0)`` would report, without running any event."""
        files = self._world._files
        out = []
        for fd, interest in self._fds.items():
            ev = files[fd]._events()
            if ev & _ERR:
                out.append((fd, _BOTH))
            elif ev & interest:
                out.append((fd, ev & interest))
        return out

    def _look(self) -> list:
        """``ready()`` asking only the fds that may have changed (see the class)."""
        ask = self._dirty
        ask |= self._recheck
        if self._always:
            ask |= self._always
        self._dirty = set()
        files = self._world._files
        out = []
        if len(ask) == 1:
            fd = next(iter(ask))
            interest = self._fds.get(fd)
            if interest is not None:
                ev = files[fd]._events()
                if ev & _ERR:
                    out.append((fd, _BOTH))
                elif ev & interest:
                    out.append((fd, ev & interest))
        else:
            for fd, interest in self._fds.items():
                if fd in ask:
                    ev = files[fd]._events()
                    if ev & _ERR:
                        out.append((fd, _BOTH))
                    elif ev & interest:
                        out.append((fd, ev & interest))
        self._recheck = {fd for fd, _ in out}
        return out

    def wait(self, timeout=None) -> list:
        if self._closed:
            raise ValueError("I/O operation on closed poller")
        world = self._world
        cpu = world.params["cpu_per_wait_s"]
        if cpu:
            # The program ran since its last wait: that long passes first,
            # events happening at their own times meanwhile.
            world.run(until=world.now + world._cpu_rng.random() * 2 * cpu)
        if timeout is None or timeout < 0:       # epoll: negative means forever
            deadline = math.inf
        else:
            deadline = world.now + timeout
        heap = world._heap
        heappop = _heappop
        run_due = world._run_due
        verify = self.verify_skips
        while True:
            run_due()
            if self._dirty or self._recheck or self._always:
                events = self._look()
                if verify and events != self.ready():
                    raise AssertionError(f"simnet: the poller saw {events}, a full scan "
                                         f"{self.ready()} at t={world.now:.6f}s (a change "
                                         f"without _changed())")
                if events:
                    if world.now != self._spin_at:
                        self._spin_at = world.now
                        self._spins = 0
                    else:
                        # level-triggered readiness nobody consumes never lets time move
                        self._spins += 1
                        if self._spins >= MAX_EVENTS_AT_ONE_TIME:
                            raise RuntimeError(
                                f"simnet: livelock: {self._spins} waits at t={world.now:.6f}s "
                                f"returned ready fds without time moving (e.g. {events[0]})")
                    return events
            elif verify and self.ready():
                raise AssertionError(f"simnet: the poller skipped {self.ready()} at "
                                     f"t={world.now:.6f}s (a change without _changed())")
            while heap and heap[0][2].fn is None:
                heappop(heap)
            if not heap:
                if deadline == math.inf:
                    raise SimDeadlock(f"simnet: wait(None) at t={world.now:.6f}s with nothing "
                                      f"ready and nothing scheduled: it would block forever")
                world.now = deadline
                return []
            t = heap[0][0]
            if t > deadline:
                world.now = deadline
                return []
            world.now = t

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._fds.clear()
            try:
                self._world._pollers.remove(self)
            except ValueError:
                pass


class _Watch:
    """The ``_watcher`` of a socket or waker that pollers watch: marks its fd
    in each of them (``SimPoller._look``)."""
    __slots__ = ("fd", "pollers")

    def __init__(self, fd):
        self.fd = fd
        self.pollers = []

    def __call__(self):
        for poller in self.pollers:
            poller._dirty.add(self.fd)


class SimWaker:
    """The seam's wake-up pair, simulated: ``wake()`` makes ``fileno()``
    readable until ``drain()``. No signal can reach it (``signal_fd()`` is None)."""
    __slots__ = ("_world", "_fd", "_pending", "_watcher")

    def __init__(self, world):
        self._world = world
        self._fd = world._new_fd(self)
        self._pending = bytearray()
        self._watcher = None          # set by the pollers that watch it

    def fileno(self) -> int:
        return self._fd

    def signal_fd(self):
        return None

    def wake(self) -> None:
        if self._fd >= 0:
            self._pending += b"\0"
            self._world._gen += 1
            if self._watcher is not None:
                self._watcher()

    def drain(self) -> bytes:
        data = bytes(self._pending)
        self._pending.clear()
        return data

    def _events(self) -> int:
        return READ if self._pending else 0

    def close(self) -> None:
        if self._fd >= 0:
            self._world._release_fd(self._fd)
            self._fd = -1


class SimIO:
    """The I/O-and-time seam backed by a ``World``: hand it to a kernel in
    place of ``RealIO``."""

    def __init__(self, world, owner="app"):
        self.world = world
        self.owner = owner
        self.time = world.time

    def poller(self) -> SimPoller:
        return SimPoller(self.world)

    def waker(self) -> SimWaker:
        return SimWaker(self.world)

    def socket(self, family=_socket.AF_INET, type=_socket.SOCK_STREAM, proto=0) -> SimSocket:
        sock = SimSocket(self.world, family, type, proto)
        sock.owner = self.owner
        return sock

    def socketpair(self, family=None, type=_socket.SOCK_STREAM, proto=0):
        """Two connected simulated sockets (a connection of its own in the log)."""
        world = self.world
        fam = _socket.AF_UNIX if family is None else family
        a = SimSocket(world, fam, type, proto)
        b = SimSocket(world, fam, type, proto)
        a.owner = b.owner = self.owner
        a._local, b._local = world._ephemeral("127.0.0.1"), world._ephemeral("127.0.0.1")
        a._remote, b._remote = b._local, a._local
        a._state = b._state = _CONNECTED
        a._peer, b._peer = b, a
        a._lx = b._lx = False
        a._conn = b._conn = len(world._conns)
        a._side, b._side = "client", "server"
        world._conns.append([a, b])
        world.record("socketpair", a._conn, None, None)
        return a, b

    @staticmethod
    def getaddrinfo(host, port, family=0, type=0, proto=0, flags=0):
        if host in (None, ""):
            host = "0.0.0.0"
        elif host == "localhost":
            host = "127.0.0.1"
        try:
            _socket.inet_aton(host)
        except OSError:
            raise _socket.gaierror(_socket.EAI_NONAME,
                                   f"simulated network knows no host {host!r}") from None
        return [(_socket.AF_INET, _socket.SOCK_STREAM, _socket.IPPROTO_TCP, "",
                 (host, int(port or 0)))]

    @staticmethod
    def read_check(sock):
        """``check(timeout)`` true when ``sock`` has something to read now."""
        def check(timeout=0):
            return bool(sock._events() & (READ | _ERR))
        return check

    def __repr__(self):
        return f"SimIO(seed={self.world.seed!r})"


class SimSelector(selectors.BaseSelector):
    """A ``selectors`` selector over the world, for code built on selectors
    (asyncio's selector event loop): ``select(timeout)`` advances the virtual
    clock as ``SimPoller.wait`` does."""

    def __init__(self, world):
        self._world = world
        self._poller = SimPoller(world)
        self._keys = {}
        self._map = _KeyMap(self._keys)

    def _fd(self, fileobj):
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        if not isinstance(fd, int) or fd < 0:
            raise ValueError(f"invalid file object {fileobj!r}")
        return fd

    def register(self, fileobj, events, data=None):
        if not events or events & ~(selectors.EVENT_READ | selectors.EVENT_WRITE):
            raise ValueError(f"invalid events: {events!r}")
        fd = self._fd(fileobj)
        if fd in self._keys:
            raise KeyError(f"{fileobj!r} (FD {fd}) is already registered")
        self._poller.register(fd, (READ if events & selectors.EVENT_READ else 0)
                              | (WRITE if events & selectors.EVENT_WRITE else 0))
        key = selectors.SelectorKey(fileobj, fd, events, data)
        self._keys[fd] = key
        return key

    def unregister(self, fileobj):
        fd = self._fd(fileobj)
        key = self._keys.pop(fd, None)
        if key is None:
            raise KeyError(f"{fileobj!r} is not registered")
        self._poller._fds.pop(fd, None)
        return key

    def select(self, timeout=None):
        if timeout is not None and timeout < 0:
            timeout = 0
        out = []
        for fd, mask in self._poller.wait(timeout):
            key = self._keys.get(fd)
            if key is None:
                continue
            ev = ((selectors.EVENT_READ if mask & READ else 0)
                  | (selectors.EVENT_WRITE if mask & WRITE else 0)) & key.events
            if ev:
                out.append((key, ev))
        return out

    def close(self):
        self._poller.close()
        self._keys.clear()

    def get_map(self):
        return self._map


class _KeyMap(Mapping):
    __slots__ = ("_keys",)

    def __init__(self, keys):
        self._keys = keys

    def __len__(self):
        return len(self._keys)

    def __getitem__(self, fileobj):
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        return self._keys[fd]

    def __iter__(self):
        return iter(self._keys)


# ---------------------------------------------------------------------------
# Peers: sans-IO participants that count the truth


class Peer:
    """A participant that owns one connection's end. ``listen(addr)`` accepts the
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


class _Bucket:
    """Rate limiter as a due time: each ``charge(n)`` moves it n/rate later;
    at most ``burst`` bytes of unused credit are kept."""
    __slots__ = ("per_byte", "burst_s", "due")

    def __init__(self, rate, burst, now):
        self.per_byte = 1.0 / rate
        self.burst_s = burst / rate
        self.due = now

    def charge(self, n, now):
        due = self.due
        if due < now - self.burst_s:
            due = now - self.burst_s
        self.due = due + n * self.per_byte


_PATTERN_PERIOD = 251     # a prime: a shifted or dropped byte never lines up again
_PATTERN = bytes(range(_PATTERN_PERIOD)) * (1 + (4 << 20) // _PATTERN_PERIOD)


def _pattern(offset, n):
    """The source's bytes ``offset .. offset+n`` (n up to 4 MiB)."""
    start = offset % _PATTERN_PERIOD
    return _PATTERN[start:start + n]


class Source(Peer):
    """Sends a byte pattern in ``frame_bytes`` frames at ``rate_Bps`` (None:
    as fast as the socket takes them) for ``duration_s`` and/or up to
    ``total_bytes``, then ``finish``es: "shutdown" (SHUT_WR), "close" or
    "reset". A frame goes whole before the next starts, so backpressure shows
    as a lower achieved rate; the bucket saves at most two frames of credit.
    ``frames`` records (first byte offset, virtual time) of every frame, which
    ``queue_delays`` uses as ground truth."""

    def __init__(self, world, *, rate_Bps=None, frame_bytes=32768, duration_s=None,
                 total_bytes=None, finish="shutdown", name="source"):
        super().__init__(world, name)
        if finish not in ("shutdown", "close", "reset"):
            raise ValueError(f"simnet: bad finish {finish!r}; valid: shutdown, close, reset")
        self.rate = rate_Bps
        self.frame_bytes = frame_bytes
        self.duration_s = duration_s
        self.total_bytes = total_bytes
        self.finish = finish
        self.sent = 0
        self.frame_offsets = []
        self.frame_times = []
        self._left = 0                 # bytes of the current frame still to send
        self._bucket = None

    def _start(self):
        if self.rate:
            self._bucket = _Bucket(self.rate, 2 * self.frame_bytes, self.world.now)

    def _act(self):
        if self.ended is not None or self.sock is None:
            return
        s = self.sock
        now = self.world.now
        while True:
            if self._left:
                try:
                    n = s.send(_pattern(self.sent, self._left))
                except BlockingIOError:
                    return
                except OSError as e:
                    self._end("reset" if isinstance(e, (ConnectionResetError, BrokenPipeError))
                              else f"error:{e.errno}")
                    return
                self.sent += n
                self._left -= n
                if self._left:
                    continue
            done_time = self.duration_s is not None and now >= self.t0 + self.duration_s
            done_bytes = self.total_bytes is not None and self.sent >= self.total_bytes
            if done_time or done_bytes:
                self._finish()
                return
            if self._bucket is not None and self._bucket.due > now:
                wake = self._bucket.due
                if self.duration_s is not None:
                    wake = min(wake, self.t0 + self.duration_s)
                self._wake_at(wake)
                return
            size = self.frame_bytes
            if self.total_bytes is not None:
                size = min(size, self.total_bytes - self.sent)
            self.frame_offsets.append(self.sent)
            self.frame_times.append(now)
            if self._bucket is not None:
                self._bucket.charge(size, now)
            self._left = size

    def _finish(self):
        s = self.sock
        try:
            if self.finish == "shutdown":
                s.shutdown(_socket.SHUT_WR)
            elif self.finish == "reset":
                s.setsockopt(_socket.SOL_SOCKET, _socket.SO_LINGER, struct.pack("ii", 1, 0))
                s.close()
            else:
                s.close()
        except OSError:
            pass
        self._end({"shutdown": "shutdown", "close": "closed", "reset": "reset_sent"}[self.finish])

    def result(self):
        r = super().result()
        span = (self.ended_at if self.ended_at is not None else self.world.now) - (self.t0 or 0)
        r.update(sent_bytes=self.sent, frames=len(self.frame_offsets),
                 rate_Bps=self.sent / span if span > 0 else None)
        return r


class Sink(Peer):
    """Reads and counts until EOF or reset: ``recv_bytes`` a read, at most
    ``rate_Bps`` (token bucket, one read of burst). ``start_after_s`` reads
    nothing until then; ``stall_at_s`` + ``stall_s`` pauses once. ``verify``
    checks every byte against the ``Source`` pattern. ``arrivals`` holds
    (time, total bytes read) after every read. ``close_with_reset`` ends with
    an RST."""

    def __init__(self, world, *, rate_Bps=None, recv_bytes=65536, start_after_s=0.0,
                 stall_at_s=None, stall_s=0.0, verify=True, close_with_reset=False,
                 name="sink"):
        super().__init__(world, name)
        self.rate = rate_Bps
        self.recv_bytes = recv_bytes
        self.start_after_s = start_after_s
        self.stall_at_s = stall_at_s
        self.stall_s = stall_s
        self.verify = verify
        self.close_with_reset = close_with_reset
        self.received = 0
        self.arrival_times = []
        self.arrival_totals = []
        self.corrupt_at = None
        self._bucket = None

    def _start(self):
        if self.rate:
            self._bucket = _Bucket(self.rate, self.recv_bytes, self.world.now)

    def _act(self):
        if self.ended is not None or self.sock is None:
            return
        s = self.sock
        while True:
            now = self.world.now
            # absolute times: the timer fires at exactly these, and now - t0
            # may round just below the interval
            start = self.t0 + self.start_after_s
            if now < start:
                if start != math.inf:
                    self._wake_at(start)
                return
            if self.stall_at_s is not None:
                stall_from = self.t0 + self.stall_at_s
                stall_to = stall_from + self.stall_s
                if stall_from <= now < stall_to:
                    self._wake_at(stall_to)
                    return
            if self._bucket is not None and self._bucket.due > now:
                self._wake_at(self._bucket.due)
                return
            try:
                data = s.recv(self.recv_bytes)
            except BlockingIOError:
                return
            except ConnectionResetError:
                self._end("reset")
                return
            except OSError as e:
                self._end(f"error:{e.errno}")
                return
            if not data:
                self._end("eof")
                if self.close_with_reset:
                    s.setsockopt(_socket.SOL_SOCKET, _socket.SO_LINGER, struct.pack("ii", 1, 0))
                s.close()
                return
            n = len(data)
            if self.verify and self.corrupt_at is None and data != _pattern(self.received, n):
                self.corrupt_at = self.received
            self.received += n
            self.arrival_times.append(now)
            self.arrival_totals.append(self.received)
            if self._bucket is not None:
                self._bucket.charge(n, now)

    def result(self):
        r = super().result()
        r.update(received_bytes=self.received, reads=len(self.arrival_times),
                 corrupt_at=self.corrupt_at)
        return r


class StalledReader(Sink):
    """Accepts or connects and never reads."""

    def __init__(self, world, name="stalled", **kw):
        super().__init__(world, start_after_s=math.inf, name=name, **kw)


class DelayedReader(Sink):
    """Reads nothing for ``delay_s``, then like a ``Sink``."""

    def __init__(self, world, delay_s, name="delayed", **kw):
        super().__init__(world, start_after_s=delay_s, name=name, **kw)


class PipeliningClient(Peer):
    """Sends ``count`` requests of ``request`` bytes back to back and, unless
    ``read``, never reads a response (Twisted 8868's flood). Counts requests the
    socket took whole and bytes of responses read."""

    def __init__(self, world, *, request=b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", count=1000,
                 read=False, name="pipeliner"):
        super().__init__(world, name)
        self.request = bytes(request)
        self.count = count
        self.read = read
        self.sent = 0
        self.requests_sent = 0
        self.received = 0
        self._out = memoryview(self.request * count)

    def _act(self):
        if self.ended is not None or self.sock is None:
            return
        s = self.sock
        while self.sent < len(self._out):
            try:
                n = s.send(self._out[self.sent:])
            except BlockingIOError:
                break
            except OSError:
                self._end("reset")
                return
            self.sent += n
        self.requests_sent = self.sent // len(self.request)
        while self.read:
            try:
                data = s.recv(65536)
            except BlockingIOError:
                break
            except OSError:
                self._end("reset")
                return
            if not data:
                self._end("eof")
                return
            self.received += len(data)

    def result(self):
        r = super().result()
        r.update(sent_bytes=self.sent, requests_sent=self.requests_sent,
                 received_bytes=self.received)
        return r


class ResettingPeer(Peer):
    """Sends ``send_bytes`` of pattern, reads whatever comes, and resets the
    connection (SO_LINGER 0, close: an RST) ``after_s`` after it starts or once
    it has read ``after_bytes``."""

    def __init__(self, world, *, after_s=None, after_bytes=None, send_bytes=0, name="resetter"):
        super().__init__(world, name)
        if after_s is None and after_bytes is None:
            raise ValueError("simnet: ResettingPeer needs after_s or after_bytes")
        self.after_s = after_s
        self.after_bytes = after_bytes
        self.send_bytes = send_bytes
        self.sent = 0
        self.received = 0

    def _act(self):
        if self.ended is not None or self.sock is None:
            return
        s = self.sock
        now = self.world.now
        if self.after_s is not None and now >= self.t0 + self.after_s:
            return self._reset()
        if self.after_s is not None:
            self._wake_at(self.t0 + self.after_s)
        while self.sent < self.send_bytes:
            try:
                n = s.send(_pattern(self.sent, min(65536, self.send_bytes - self.sent)))
            except BlockingIOError:
                break
            except OSError:
                self._end("reset")
                return
            self.sent += n
        while True:
            try:
                data = s.recv(65536)
            except BlockingIOError:
                break
            except OSError:
                self._end("reset")
                return
            if not data:
                break
            self.received += len(data)
            if self.after_bytes is not None and self.received >= self.after_bytes:
                return self._reset()

    def _reset(self):
        self.sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()
        self._end("reset_sent")

    def result(self):
        r = super().result()
        r.update(sent_bytes=self.sent, received_bytes=self.received)
        return r


def queue_delays(source, sink) -> list:
    """[(time, delay)] per sink read: how long the last byte of that read
    waited since its frame was stamped at the source."""
    offsets = source.frame_offsets
    times = source.frame_times
    out = []
    for t, total in zip(sink.arrival_times, sink.arrival_totals):
        i = bisect.bisect_right(offsets, total - 1) - 1
        if i >= 0:
            out.append((t, t - times[i]))
    return out
