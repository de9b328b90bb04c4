"""Measurement peers: the ground truth of every scenario, in a process of their own.

A scenario never believes the kernel under test about what it did. Whatever a
kernel's probe says it wrote, the number that goes into a verdict is what a
*peer* counted on the other end of the socket: a plain blocking socket, in
another process, that counts every byte, checks frame order, timestamps
arrivals and records how its stream ended -- "eof" (a FIN), "reset" (an RST) or
"timeout" (its own hard bound ran out first).

Why a process and why blocking sockets: the peers must not share the kernel's
GIL, CPU accounting or RSS, and they must not have an event loop of their own
whose buffering could hide the very effect we measure. A blocking ``send()``
returns when the OS took the bytes and a blocking ``recv()`` returns what the OS
delivered; there is nothing in between. Each role runs in a thread of ONE child
process (``python -m bench.peers``), so a scenario with a source and a sink
costs one interpreter start, and roles that must be concurrent (a healthy and a
stalled push client) are. The price: roles share that process's GIL. At the
rates the scenarios use (a few MB/s, 32 KiB frames) a role spends its time in
the kernel, not in Python; for throughput benchmarks where the peer itself
could be the bottleneck, use one PeerProcess per role.

The parent side is ``PeerProcess``::

    with PeerProcess(spec, timeout_s=30) as peers:
        addr = peers.address("sink")        # blocks until that role listens
        peers.start("source", connect=addr) # a deferred role, fields may be set now
        results = peers.results()           # {name: result dict} once all roles ended

Leaving the block always ends the child (stdin closed, then terminate, then
kill) and reaps it; the parent's reader thread and pipes are closed: no orphan,
no leaked fd. If the parent dies without cleaning up, the child sees EOF on its
stdin and exits at once; a terminal Ctrl-C reaches the child too, which dies
silently (default SIGINT action) while the parent's ``__exit__`` reaps it.

The wire between them is JSON lines. The spec goes in argv (``-`` means: the
first line of stdin); the child prints ``{"event": "listening", "name", "addr"}``,
``{"event": "result", "name", "result"}``, and ``{"event": "done"}`` when every
role has reported; the parent writes ``{"start": name, ...fields}`` lines to
start deferred roles. Anything else the child has to say goes to stderr, which
the parent keeps (the tail) for its error messages.

Clocks and bounds. Every role has ``max_s``, a hard bound counted from the
moment the role starts (including the wait for a connection); when it runs out
the role closes its socket and reports ``ended="timeout"``. Times *inside* a
result (``series``, ``eof_after_s``, ``start_after_s``) are counted from the
moment the connection was established, because that is the moment the other
side can start talking -- a listener may wait a long time before anybody
connects. All waits use ``time.monotonic()``, which on Linux is one clock for
the whole machine, so a frame's send timestamp from another process compares
with our arrival time.

Exact counts despite timeouts. Sockets run with a short timeout (50 ms) so
a role can notice its deadline, never with ``sendall``: a ``sendall`` that times
out has sent an unknown part of its buffer. The driver sends with one ``send()``
per action instead, so ``sent_bytes`` is always what the OS accepted, to the byte.

Roles written once. Each role is one sans-IO core (``bench/peers/core.py``
says what that means; ``bench/peers/roles.py`` holds the built-in ones) that
two drivers run: blocking sockets in the peer process (``bench/peers/real.py``)
and the simulated world of ``looplab run --net sim`` (``bench/peers/sim.py``).
A real-vs-sim comparison therefore compares networks, not two implementations
of a peer. A user adds a role with ``register_role`` (docs/peers.md).

Where the parts live. This package is what a scenario uses: the role
constructors (``sink(...)``, ``source(...)``, ... build spec dicts), the
registry and the checks (``ROLES``, ``register_role``, ``check_role``,
``check_spec``, in ``bench/peers/spec.py``, which both sides run) and
``PeerProcess`` (``bench/peers/process.py``). The child is
``bench/peers/child.py`` (the JSON-lines loop and ``main``).
``bench/peers/faults.py`` holds the faulty peers of ``looplab faults``.

Result vocabulary (every role): ``name``, ``role``, ``ended`` -- "eof" (the peer
half-closed), "reset" (the peer reset, or a send hit EPIPE/ECONNRESET),
"timeout" (``max_s``), "closed" (we closed as planned), "reset_sent" (we reset
as planned), "error" (with ``error``: a refused connection and the like, never
a traceback for an expected network condition) -- plus ``connected``,
``connected_at`` (the ``time.monotonic()`` of the connection: add it to a
series' t to line roles or processes up), ``connected_after_s``,
``sockbuf_effective`` ([SO_SNDBUF, SO_RCVBUF] as the kernel granted them:
Linux doubles the request), ``sent_bytes``, ``received_bytes``, ``ran_s`` and
``series``: [[t_s, cumulative_bytes], ...] every ~50 ms of the role's main
counter (received for readers, sent for writers). docs/peers.md lists every
role's own fields, with units.
"""
from __future__ import annotations

from bench.peers.child import main
from bench.peers.core import (
    REQUIRED, Duplex, End, Hold, Recv, Role, Send, Shutdown, Sleep, UnknownAction,
)
from bench.peers.process import PeerError, PeerProcess, PeerTimeout
from bench.peers.spec import ROLES, check_role, check_spec, register_role

__all__ = ["PeerProcess", "PeerError", "PeerTimeout", "ROLES", "check_spec", "check_role",
           "register_role", "Role", "REQUIRED", "Send", "Recv", "Duplex", "Sleep", "Hold",
           "Shutdown", "End", "UnknownAction",
           "role", "sink", "source", "reader", "pipeline_client", "push_client", "echo_client",
           "reset_peer", "main"]


# ---------------------------------------------------------------------------
# The roles as public building blocks: ``peers.sink(rate_Bps=1e6, listen=...)``
# returns the role's spec dict (checked when a PeerProcess starts). A scenario's
# ``serve_app`` also accepts ``connect=bench.scenarios.api.APP``: "connect to the app".

def role(kind: str, name: str | None = None, **fields) -> dict:
    """A role spec of ``kind`` (one of ROLES) named ``name`` (default: the kind).
    Listening roles default to ``listen="127.0.0.1:0"``."""
    if kind not in ROLES:
        raise ValueError(f"unknown role {kind!r}; valid roles: {', '.join(ROLES)}")
    if "connect" not in fields and "listen" not in fields and ROLES[kind].listens:
        fields["listen"] = "127.0.0.1:0"
    return {"name": name or kind, "role": kind, **fields}


def sink(name: str = "sink", **fields) -> dict:
    """Counts and timestamps what arrives, optionally rate limited (``rate_Bps``)."""
    return role("sink", name, **fields)


def source(name: str = "source", **fields) -> dict:
    """Sends framed data at ``rate_Bps`` for ``duration_s`` or ``total_bytes``."""
    return role("source", name, **fields)


def reader(name: str = "reader", **fields) -> dict:
    """Reads everything until EOF, starting after ``start_after_s``, optionally rate limited."""
    return role("reader", name, **fields)


def pipeline_client(name: str = "client", **fields) -> dict:
    """Sends ``count`` tiny requests at once and never reads for ``hold_s``."""
    return role("pipeline_client", name, **fields)


def push_client(name: str = "client", **fields) -> dict:
    """A push subscriber: ``mode="healthy"`` reads, ``"stalled"`` never does."""
    return role("push_client", name, **fields)


def echo_client(name: str = "client", **fields) -> dict:
    """Sends ``total_bytes`` and checks the echo byte for byte."""
    return role("echo_client", name, **fields)


def reset_peer(name: str = "reset", **fields) -> dict:
    """Resets its connection after ``after_bytes`` or ``after_s``."""
    return role("reset_peer", name, **fields)
