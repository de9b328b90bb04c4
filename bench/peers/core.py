"""What a peer role is: the events it is fed and the actions it returns.

A role is a sans-IO core (in the manner of ``protocols/cores.py``): it never
touches a socket and never reads a clock. A *driver* owns the connection and
the time -- ``bench/peers/real.py`` on blocking sockets in the peer process,
``bench/peers/sim.py`` inside a ``kernels.simnet`` world -- and does only this:

1. tell the core what happened: ``listening(addr)``, ``connected(now, ...)``,
   ``on_sent(n, now)``, ``on_data(data, now)``, ``on_eof(now)``,
   ``on_reset(now)``, ``expire(now)`` (the role's ``max_s``: ``on_timeout``),
   ``on_shutdown_failed(now)``, ``on_error(text)``, ``on_unread(n)`` (bytes
   left unread at the end, for a role with ``wants_unread``), ``tick(now)``
   (time passed while it waited);
2. ask it ``next(now)`` what to do, and carry the answer out: one of the
   small frozen actions below. An action a driver doesn't know is an error
   (``UnknownAction``), never a silent no-op;
3. at the end, ``report(now)`` is the role's result.

A ``Sleep`` is a promise: a driver that asks again before it is over (woken
by its socket) gets the same sleep, so how often a driver asks never changes
what a role does.

Everything a role decides -- what to send, when to read, when to pause, how a
stream's ending maps to ``ended`` and which numbers it reports -- lives in its
core, once. The two networks differ only in what the drivers can see: a real
driver ticks the core every ~50 ms while it waits (the ``series`` gets idle
samples); the simulated world has no idle time to sample, only events.

The built-in roles are in ``bench/peers/roles.py``; the registry, one table
of every role, is ``ROLES`` in ``bench/peers/spec.py``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Send", "Recv", "Duplex", "Sleep", "Hold", "Shutdown", "End", "UnknownAction",
           "Role", "Bucket", "REQUIRED", "TICK_S"]

TICK_S = 0.05    # the series' sampling period; also the real driver's socket timeout


# ---------------------------------------------------------------------------
# Actions: what a core asks its driver to do next.

@dataclass(frozen=True)
class Send:
    """Send ``data`` (a first part of it is fine: the driver reports how much
    the OS took with ``on_sent`` and asks again)."""
    data: object


@dataclass(frozen=True)
class Recv:
    """Read at most ``max_bytes`` and report it (``on_data``, ``on_eof``). With
    ``until``: if nothing came by then, ask again (``next``) instead."""
    max_bytes: int
    until: float | None = None


@dataclass(frozen=True)
class Duplex:
    """Send ``data`` and read at most ``max_bytes``, whichever the socket
    allows first: a client whose server echoes must read while it sends."""
    data: object
    max_bytes: int


@dataclass(frozen=True)
class Sleep:
    """Do nothing with the socket until ``until``, then ask again."""
    until: float


@dataclass(frozen=True)
class Hold:
    """Keep the connection open without reading a byte until ``until`` (then ask
    again); report the peer's FIN (``on_eof``) or RST (``on_reset``) if either
    comes first. Never reading keeps the receive window closed."""
    until: float


@dataclass(frozen=True)
class Shutdown:
    """Half-close (SHUT_WR). If the socket refuses, report ``on_shutdown_failed``."""


@dataclass(frozen=True)
class End:
    """Close the connection -- with an RST (SO_LINGER 0) if ``reset`` -- and
    stop: the role has ended. ``how`` is what ``ended`` reports unless the role
    set it before."""
    how: str
    reset: bool = False


class UnknownAction(TypeError):
    """A driver was handed an action it does not know."""


# ---------------------------------------------------------------------------
# The core every role extends.

class Role:
    """One peer role as a sans-IO core. Subclasses set the class attributes and
    implement ``step(now)``; they may override the ``on_*`` events.

    Class attributes: ``role`` (its name in the registry), ``fields``
    ({field: default} beyond the common ones; ``REQUIRED`` marks a field with
    no default), ``checks`` ({field: check(field, value) -> value} for fields
    the spec module does not know), ``listens`` (the constructor's default
    endpoint is ``listen="127.0.0.1:0"``), ``tracked`` (the counter the
    ``series`` follows: "received" or "sent"), ``wants_unread`` (the driver
    reports the bytes left unread in the receive queue at the end, as
    ``unread_bytes``). ``check(cfg)`` (a classmethod) may refuse a spec whose
    fields do not go together.
    """

    role = ""
    fields: dict = {}
    checks: dict = {}
    listens = False
    tracked = "received"
    wants_unread = False

    def __init__(self, cfg: dict, now: float):
        self.cfg = cfg
        self.began = now
        self.t0: float | None = None          # when the connection was established
        self.sent = 0
        self.received = 0
        self.series: list[list] = []
        self._next_sample = 0.0
        self._warm: tuple | None = None       # (t, received) once warmup_s had passed
        self._last_in: tuple | None = None    # (t, received) at the last byte in
        self._end: End | None = None
        self._asleep: Sleep | None = None
        self.result: dict = {"name": cfg["name"], "role": cfg["role"], "ended": None,
                             "connected": False}
        self.setup()

    @classmethod
    def check(cls, cfg: dict) -> None:
        """Raise ValueError if the (complete) spec ``cfg`` cannot run."""

    def setup(self) -> None:
        """Put the role's own result fields in place (before any connection)."""

    def start(self, now: float) -> None:
        """The connection is up (``self.t0 == now``)."""

    def step(self, now: float):
        """What to do now: one action. Called only while the role runs."""
        raise NotImplementedError

    def finish(self, now: float) -> None:
        """Fill in the fields that are computed at the end, however it came."""

    # -- driver-facing events --------------------------------------------------

    def listening(self, addr) -> None:
        self.result["listen"] = list(addr)

    def connected(self, now: float, peer=None, sockbuf=None) -> None:
        self.t0 = now
        self._next_sample = now
        self.result.update(connected=True, connected_at=now, connected_after_s=now - self.began)
        if peer is not None:
            self.result["peer"] = list(peer)
        self.result["sockbuf_effective"] = list(sockbuf) if sockbuf is not None else None
        self.start(now)

    def next(self, now: float):
        """The driver's question: what now? ``End`` once the role has ended."""
        if self._end is not None:
            return self._end
        # A sleep is a promise: asked again before it is over (a driver woken
        # by its socket), the answer is the same sleep, so how often a driver
        # asks never changes what a role does.
        if self._asleep is not None:
            if now < self._asleep.until:
                return self._asleep
            self._asleep = None
        act = self.step(now)
        if type(act) is Sleep:
            self._asleep = act
        return act

    @property
    def ended(self) -> bool:
        return self._end is not None

    def on_sent(self, n: int, now: float) -> None:
        self.sent += n

    def on_data(self, data, now: float) -> None:
        self.count_in(len(data), now)

    def on_eof(self, now: float) -> None:
        self.end("eof")

    def on_reset(self, now: float) -> None:
        self.end("reset")

    def on_timeout(self, now: float) -> None:
        self.end("timeout")

    def expire(self, now: float) -> None:
        """The role's ``max_s`` ran out (drivers call this, not ``on_timeout``):
        whatever ``on_timeout`` does, the role ends now."""
        self.on_timeout(now)
        if self._end is None:
            self.end("timeout")

    def on_shutdown_failed(self, now: float) -> None:
        self.end("reset")

    def on_error(self, text: str) -> None:
        self.result["error"] = text
        self.end("error")

    def on_unread(self, n) -> None:
        """The bytes left unread at the end (drivers call it when ``wants_unread``)."""
        if self.result.get("unread_bytes") is None:
            self.result["unread_bytes"] = n

    def tick(self, now: float) -> None:
        """Time passed while the driver waited: sample the series."""
        if self.t0 is not None:
            self.sample(now)

    def report(self, now: float) -> dict:
        """The role's result (call once, when it has ended)."""
        self.finish(now)
        res = self.result
        if self.t0 is not None:
            self.sample(now, force=True)
        if res["ended"] is None:
            res["ended"] = "closed"
        res.update(sent_bytes=self.sent, received_bytes=self.received, ran_s=now - self.began,
                   series=self.series)
        return res

    # -- helpers for the roles ---------------------------------------------------

    def end(self, how: str, reset: bool = False) -> None:
        """End the role: ``ended`` is ``how`` unless already set; the driver
        closes the connection (an RST with ``reset``) at its next ``next``."""
        if self.result["ended"] is None:
            self.result["ended"] = how
        if self._end is None:
            self._end = End(how, reset)

    def sample(self, now: float, force: bool = False) -> None:
        """Add [t, counter] to the series if ~50 ms passed (or ``force``)."""
        if now >= self._next_sample or force:
            self.series.append([round(now - self.t0, 4), getattr(self, self.tracked)])
            self._next_sample = now + TICK_S

    def count_in(self, n: int, now: float) -> None:
        """Count ``n`` bytes received at ``now`` (series, warm-up rate).

        The warm-up mark is taken *after* counting the read that crosses it,
        so the rate spans whole read-to-read intervals: marking before would
        count k reads over k-1 intervals and overstate a paced reader's rate
        by one read per window (6 % for 64 KiB reads at 1 MB/s over 1 s)."""
        self.received += n
        if self._warm is None and now - self.t0 >= self.cfg.get("warmup_s", math.inf):
            self._warm = (now, self.received)
        self._last_in = (now, self.received)
        self.sample(now)

    def rate_in_after_warmup(self) -> float | None:
        """Bytes/s received from ``warmup_s`` after connecting to the last
        byte; None if nothing came after the warm-up."""
        if self._warm is None or self._last_in[0] <= self._warm[0]:
            return None
        return (self._last_in[1] - self._warm[1]) / (self._last_in[0] - self._warm[0])


class Bucket:
    """Token bucket for reads: on average ``rate`` bytes/s, and at most
    ``burst`` bytes of credit saved while the reader was waiting for data (a
    reader must not make up for an idle second in one gulp). ``due`` is when
    the next read may happen."""
    __slots__ = ("per_byte", "burst_s", "due")

    def __init__(self, rate: float, burst: int, now: float):
        self.per_byte = 1.0 / rate
        self.burst_s = burst / rate
        self.due = now

    def charge(self, n: int, now: float) -> None:
        due = self.due
        if due < now - self.burst_s:
            due = now - self.burst_s
        self.due = due + n * self.per_byte


REQUIRED = object()   # a field with no default: the spec (or start()) must give it
