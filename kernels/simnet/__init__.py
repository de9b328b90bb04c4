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
if a registered fd is ready it returns at once (the ready fds in epoll's order:
the order they became ready in, level-triggered), otherwise it jumps the clock to
the next event (a delivery, an acknowledgement, a peer's timer, a fault) and
looks again, until something is ready or ``now + timeout`` is reached. So ten
simulated seconds of a 1 MB/s stream cost a few thousand events, not ten
seconds. ``wait(None)`` with nothing ready and nothing scheduled would block
forever; it raises ``SimDeadlock`` instead. From outside, ``world.stop(reason)``
(a signal handler, another thread) and ``world.watchdog(wall_s)`` (wall-clock
time) make the world's next step raise ``SimStopped``.

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
  raises ``BrokenPipeError``. ``SO_ERROR`` reports and clears it too. After
  the peer's FIN (CLOSE_WAIT) it is ``EPIPE`` instead, as Linux's
  ``tcp_reset`` has it. A pending error is reported before a fault's gate.
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

The wire faults hit the segments that ``side`` sends ("both": both ways),
from ``at`` for ``duration_s``, in ``Link``:

* ``loss``: each data segment is lost with probability ``p`` and sent again
  after an RTO (``TCP_RTO_MIN``, 200 ms, doubling per retry): late, never lost;
* ``clog`` (FoundationDB's swizzle): the connections in ``conns`` are clogged
  one by one ``step_s`` apart, then unclogged in reverse order; a clogged
  direction holds every segment and ACK and delivers them in order after;
* ``partition``: both directions hold everything, then deliver it.

Drawn faults are of the kinds in ``fault_kinds`` (default: the first four).

What it does not model: congestion control, slow start and Nagle; packet loss
and retransmission (except the SYN retries above and the ``loss`` fault; no
fast retransmit, SACK or tail-loss probe) -- a Linux receiver whose
memory overflows drops the segment and the sender retransmits it, here it is
kept; delayed ACKs and everything skb-shaped unless ``accounting="linux"``; the
ACK a loopback receiver sends within the sender's own system call (here it
takes ``2 x latency_s``); IP fragmentation, urgent data, ``SO_LINGER`` with a
time-out; and file-descriptor reuse (fake fds count up from ``FD_BASE``, above
any real descriptor, so passing one to the real OS fails loudly).

Peers
-----
``Peer`` is a participant in the same world: it holds simulated sockets and
acts when the world tells it a socket changed or its timer fires. The roles
that play the peers (sources, sinks, readers, clients; the ground truth,
independent of the program under test) are the bench's, one implementation
for real sockets and for this world, which the lab's simulated peers run here.

Replay
------
``world.universe()`` is a JSON-able dict: the seed, every parameter and the
full fault schedule (drawn faults written out). ``World.from_universe(d)``
builds the same world; run the same program on it and every event happens at
the same virtual time in the same order. ``world.log`` lists the events
(``(time, kind, conn, side, value)``) and ``world.digest()`` hashes it.

The package
-----------
``constants`` (every number, with where it comes from, and the errors),
``world`` (``World``: clock, events, addresses, faults, log), ``model`` (the
``TcpModel`` interface and ``ByteModel``) and ``linux`` (``LinuxModel``),
``sockets`` (``SimSocket``, the wire), ``poller`` (``SimPoller``,
``SimWaker``, ``SimIO``, ``SimSelector``). Each imports only the ones before it;
``world`` also holds ``Peer``.

Standard library only, and no imports from the rest of looplab.
"""
from __future__ import annotations

from .constants import (
    ACCOUNTING, BUGGIFY_POINTS, ERR, FAULT_KINDS, FD_BASE, LISTENING, MAX_EVENTS_AT_ONE_TIME, READ, WRITE,
    SimBlockingError, SimDeadlock, SimStopped,
)
from .linux import LinuxModel
from .model import ByteModel, TcpModel
from .poller import SimIO, SimPoller, SimSelector, SimWaker
from .sockets import SimSocket
from .world import Peer, World

__all__ = ["World", "SimIO", "SimSocket", "SimPoller", "SimWaker", "SimSelector",
           "SimDeadlock", "SimStopped", "SimBlockingError", "READ", "WRITE", "FD_BASE", "FAULT_KINDS", "ACCOUNTING",
           "BUGGIFY_POINTS",
           "TcpModel", "ByteModel", "LinuxModel",
           "Peer"]

# Names the bench's in-world peers use from before the split: the error bit and
# the listening state.
_ERR = ERR
_LISTENING = LISTENING
