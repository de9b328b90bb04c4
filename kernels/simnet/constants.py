"""Every number the simulated network uses, with where it comes from.

The leaf of the package: the mask bits the poller reports, the parameters a
``World`` takes and their defaults, the constants of Linux's TCP that
``accounting="linux"`` models (each with the kernel symbol it mirrors), and
the errors the package raises. Nothing here imports the rest of the package.
"""
from __future__ import annotations

import errno
import os
import select
import socket as _socket

# The seam's mask bits (epoll's, as the real poller uses); an error or hang-up
# is reported as both.
if hasattr(select, "epoll"):
    READ, WRITE = select.EPOLLIN, select.EPOLLOUT
else:  # pragma: no cover - macOS/BSD/Windows only
    READ, WRITE = 1, 4
#: Internal to the package's files and pollers: an error or a hang-up (EPOLLERR,
#: EPOLLHUP), which a poller reports as ``READ | WRITE``.
ERR = 1 << 30
BOTH = READ | WRITE
MSG_PEEK = int(_socket.MSG_PEEK)   # a plain int: flags & the enum runs enum code per recv

#: Fake file descriptors start here: above the highest real one a process can
#: hold under Linux's default ``nr_open`` (1,048,576), so passing one to the real
#: OS fails loudly.
FD_BASE = 1 << 20

FAULT_KINDS = ("stall", "slow", "reset", "vanish", "loss", "clog", "partition")
#: The kinds a world draws (``random_faults``) unless its ``fault_kinds`` says
#: otherwise: the first four, so that a seed draws the schedule it always drew.
CLASSIC_FAULTS = FAULT_KINDS[:4]
#: The faults that act on the wire (``Link``) rather than on an end: their side
#: names whose outgoing segments they hit.
LINK_FAULTS = ("loss", "clog", "partition")
FAULT_SIDES = ("client", "server", "both")
ACCOUNTING = ("bytes", "linux")

#: A participant that keeps scheduling itself at one instant (or a poll that
#: keeps answering "ready" without time moving) is a livelock after this many
#: events or waits: an error, not a hang. Read at call time, so a test can
#: lower it (``monkeypatch.setattr(kernels.simnet.constants, ...)``).
MAX_EVENTS_AT_ONE_TIME = 1_000_000

#: How many events one ``SimPoller.wait`` returns at most when its caller gives
#: no ``maxevents``: CPython's ``select.epoll.poll`` passes ``FD_SETSIZE - 1``
#: to ``epoll_wait`` for ``maxevents=-1`` (Modules/selectmodule.c). Those left
#: over stay at the head of the ready list, as epoll keeps them.
EPOLL_MAXEVENTS = 1023

#: How many world steps (``World._run_due`` calls) pass between two looks at
#: the wall clock for the watchdog: one look costs about as much as a step.
WATCH_EVERY = 512

#: A slowed reader (the ``slow`` fault) gets at most this many seconds of its
#: rate per recv: short enough that a 16 KiB/s slow-down still paces reads.
SLOW_SLICE_S = 0.05

#: ``World``'s parameters and their defaults (the module docstring of the
#: package explains the model each one feeds).
DEFAULTS = {
    "latency_s": 50e-6,          # one way; loopback is a few microseconds to tens
    "bandwidth_Bps": None,       # None: the link never limits (loopback moves GB/s)
    "jitter_s": 0.0,             # extra one-way delay, uniform in [0, jitter_s), per segment
    "sndbuf": 65536,             # what the scenarios pin with SO_SNDBUF on real sockets
    "rcvbuf": 65536,             # ... and SO_RCVBUF
    "mss": 65483,                # loopback's MTU of 65536 minus the headers
    "syn_retry_s": 1.0,          # TCP_TIMEOUT_INIT: the first SYN retransmission (doubling after)
    "syn_retries": 6,            # net.ipv4.tcp_syn_retries' default
    "random_faults": 0,          # with faults=None: how many to draw from the seed
    "fault_horizon_s": 10.0,     # drawn faults happen in [0, horizon)
    "fault_connections": 2,      # drawn faults pick a connection in range(this)
    "cpu_per_wait_s": 0.0,       # program CPU time charged per poller wait, uniform in [0, 2x)
    "sockbuf_scale": 1,          # setsockopt(SO_SNDBUF/SO_RCVBUF, n) gives n * this (Linux: 2)
    "accounting": "bytes",       # "bytes": exact byte counts; "linux": skbs, truesize, Linux's window
    "skb_overhead": 832,         # accounting="linux": bytes of truesize per skb beyond its data
                                 # (Linux's truesize beyond the payload: 832 on 6.18 x86-64)
    "wake_s": 0.0,               # a program or peer waiting on a socket runs this long after it readies
    "fault_kinds": CLASSIC_FAULTS,   # which kinds random_faults draws from
    "buggify": None,             # None: off; a list of BUGGIFY_POINTS the seam may fire (below)
}

#: The seam's fault points (FoundationDB's BUGGIFY), each a behaviour a real
#: OS is allowed to show a program's sockets. With ``buggify=[...]`` each
#: listed point is enabled or not once per universe (probability
#: ``BUGGIFY_ENABLE``, drawn from the seed) and an enabled one fires with
#: ``BUGGIFY_FIRE`` at each site it reaches; under an explorer every listed
#: point is enabled and each site is a choice (``kernels.choice.BUGGIFY``).
#: docs/simnet.md ("Fault points in the seam") cites the man pages.
BUGGIFY_POINTS = (
    "short-write",      # send(2) takes fewer bytes than it could (at least 1)
    "short-read",       # recv(2) returns fewer bytes than are there (at least 1)
    "spurious-ready",   # a poll reports a socket ready; the call then raises EAGAIN
    "late-notify",      # a FIN or RST arrived; one poll does not report it yet
)
BUGGIFY_ENABLE = 0.25
BUGGIFY_FIRE = 0.25

# accounting="linux": the constants of Linux's TCP that shape a loopback
# stream (net/ipv4/tcp*.c and include/net/tcp.h, checked against 6.18 on
# x86-64; see the design notes in ``linux.py``).
TCP_MSS_DEFAULT = 536          # TCP_MSS_DEFAULT: the receiver's first guess at the sender's segment size
RATIO_SHIFT = 8                # TCP_RMEM_TO_WIN_SCALE: window = memory * ratio >> 8
RATIO_DEFAULT = 128            # TCP_DEFAULT_SCALING_RATIO: half, until a segment is measured
GSO_MAX_SIZE = 65536           # GSO_LEGACY_MAX_SIZE: loopback's largest GSO packet, bounds an skb's size goal
MIN_TSO_SEGS = 2               # net.ipv4.tcp_min_tso_segs' default
MIN_HALF_WND = 36              # tcp_bound_to_half_wnd: 68 minus a header with timestamps, the smallest size goal
SOCK_MIN_SNDBUF = 4608         # SOCK_MIN_SNDBUF: setsockopt floor, 2 x TCP_SKB_MIN_TRUESIZE
SOCK_MIN_RCVBUF = 2304         # SOCK_MIN_RCVBUF: setsockopt floor, 1 x TCP_SKB_MIN_TRUESIZE
PROBE_S = 0.2                  # TCP_RTO_MIN: when the persist timer fires
DELACK_S = 0.04                # TCP_DELACK_MIN: a delayed ACK waits this long at most
MAX_QUICKACKS = 16             # TCP_MAX_QUICKACKS

# The ``loss`` fault's retransmissions (include/net/tcp.h, 6.18). On loopback
# the measured RTT is microseconds, so Linux's RTO (srtt + 4 rttvar, rttvar at
# least TCP_RTO_MIN) is TCP_RTO_MIN; each retry doubles it (tcp_retransmit_timer's
# backoff) up to TCP_RTO_MAX. Fast retransmit needs three duplicate ACKs, which
# a loopback window of one or two 64 KB segments never produces, so the RTO is
# what recovers a lost segment there.
RTO_MIN_S = 0.2                # TCP_RTO_MIN (HZ / 5)
RTO_MAX_S = 120.0              # TCP_RTO_MAX (120 * HZ)


class SimDeadlock(RuntimeError):
    """``wait(None)`` found nothing ready and nothing that could ever happen."""


class SimStopped(RuntimeError):
    """The world was stopped from outside (``World.stop``: a signal) or by its
    wall-clock watchdog (``World.watchdog``). Every later step raises it again."""


class SimBlockingError(RuntimeError):
    """A simulated socket in blocking mode was asked to block: the simulation
    cannot wait inside a call. Call ``setblocking(False)``."""


def oserror(code, cls=OSError):
    return cls(code, f"{os.strerror(code)} (simulated)")


def error_exc(err):
    """The exception Python's socket module raises for errno ``err``."""
    if err == errno.ECONNRESET:
        return ConnectionResetError(err, "Connection reset by peer (simulated)")
    if err == errno.EPIPE:
        return BrokenPipeError(err, "Broken pipe (simulated)")
    if err == errno.ECONNREFUSED:
        return ConnectionRefusedError(err, "Connection refused (simulated)")
    if err == errno.ETIMEDOUT:
        return TimeoutError(err, "Connection timed out (simulated)")
    return OSError(err, f"{os.strerror(err)} (simulated)")


# A socket's states (``SimSocket._state``).
NEW, LISTENING, CONNECTING, CONNECTED, CLOSED = range(5)
STATE_NAMES = ("new", "listening", "connecting", "connected", "closed")
