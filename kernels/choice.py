"""Scheduling choice points: the one interface through which an explorer
(``looplab explore``) decides what a kernel leaves open.

A *chooser* is any object with ``choose(kind, n) -> int``: at a decision with
``n > 1`` possible outcomes, numbered in the kernel's default order, it
returns the index of the one to take. ``0`` is always what the kernel does
when nobody asks, so a chooser that returns 0 everywhere changes nothing.

A kernel finds its chooser on its I/O seam (``io.chooser``, absent on
``RealIO``) once, when it is built, and calls it only when there is one: with
no explorer installed a pass costs one ``is not None`` test.

The kinds (the strings a kernel passes; which of them a runtime may take
freely is the explorer's legality model, not the kernel's business):

* ``READY``    -- which of the ``n`` ready callbacks or tasks runs next
  (index ``i``: the i-th in queue order);
* ``IO_ORDER`` -- which of the ``n`` I/O events one poll returned is handled
  next (readiness of different fds carries no order);
* ``IO_DEFER`` -- ``n == 2``: 1 leaves this poll's *fresh* I/O events (those
  that became ready since the previous poll) for the next pass, so the
  callbacks and timers already due run first: the answer a poll made a moment
  before they became ready would have given (timer against I/O). Asked only
  when some event is fresh (``poll_order``, which gives the bound and its
  source);
* ``TIMER_TIE`` -- which of ``n`` timers due at the same deadline fires next;
* ``NET``, ``CPU`` -- the simulated network's own timing (``World`` asks:
  a segment's jitter, the CPU time charged at a wait; 0 means none);
* ``BUGGIFY`` -- ``n == 2``: 1 fires a fault point of the simulated seam
  here (a short write or read, a spurious readiness, a FIN or RST reported
  one poll late: ``kernels.simnet.constants.BUGGIFY_POINTS``); 0 behaves.
  Asked only at the sites of the points a world was given (``buggify``).

Standard library only, and no imports from the rest of looplab.
"""
from __future__ import annotations

import heapq

__all__ = ["READY", "IO_ORDER", "IO_DEFER", "TIMER_TIE", "NET", "CPU", "BUGGIFY", "KINDS", "permute",
           "PollEvents", "poll_order", "order_ties"]

READY = "ready"
IO_ORDER = "io-order"
IO_DEFER = "io-defer"
TIMER_TIE = "timer-tie"
NET = "net"
CPU = "cpu"
BUGGIFY = "buggify"
KINDS = (READY, IO_ORDER, IO_DEFER, TIMER_TIE, NET, CPU, BUGGIFY)


def permute(choose, kind: str, items: list) -> list:
    """``items`` in the order ``choose`` picks them one by one (``n - 1``
    choices for ``n`` items; all zeros keep the order). A chooser with an
    ``offer(candidates)`` method hears the candidates before each choice."""
    rest = list(items)
    out = []
    # an explorer that labels its choices (a trace) is shown the candidates first
    offer = getattr(getattr(choose, "__self__", None), "offer", None)
    while len(rest) > 1:
        if offer is not None:
            offer(rest)
        out.append(rest.pop(choose(kind, len(rest))))
    out.extend(rest)
    return out


class PollEvents(list):
    """One poll's events that also say which of them are *fresh*: ``fresh``,
    the indices of those that became ready since the previous poll reported
    (the simulated poller knows it from its ready list). It is a list, so a
    kernel that does not look sees the events alone."""
    __slots__ = ("fresh",)

    def __init__(self, events=(), fresh=()):
        super().__init__(events)
        self.fresh = frozenset(fresh)


def poll_order(choose, events, work_due: bool):
    """One poll's ``events`` in the order ``choose`` picks (``IO_ORDER``),
    without the fresh ones when, with callbacks or timers already due
    (``work_due``), it defers them to the next pass (``IO_DEFER``).

    The bound on deferring is the kernel's. Under epoll's level-triggered mode
    a registered fd that is ready when ``epoll_wait`` scans is on the ready
    list -- linked when it became ready (``ep_poll_callback``), or put back at
    the tail when the previous call reported it (``ep_send_events``; Linux's
    fs/eventpoll.c) -- and the scan reports every listed fd that is still
    ready, up to ``maxevents`` (those left over come first at the next call).
    epoll(7): in level-triggered mode epoll "is simply a faster poll(2)", which
    reports a descriptor whenever it is ready. So a poll can miss only what
    became ready after it looked: a deferral is the answer of a poll made
    just before the fresh events' readiness, and the loops handle all that a
    poll returns in that pass (asyncio's ``_run_once`` queues them before the
    due timers; our callback loop runs them first). The events the previous
    poll reported and that are still ready were ready then, so no poll can
    miss them, and a deferred event is not fresh at the next poll: no
    readiness is deferred twice. Only ``events.fresh`` may be deferred (a
    ``PollEvents``); a plain list says nothing of freshness and defers nothing.
    An fd that stopped being ready and became ready again between two polls
    without one noticing counts as not fresh: the bound errs on the side of
    orders a real kernel gives."""
    if work_due:
        fresh = getattr(events, "fresh", None)
        if fresh and choose(IO_DEFER, 2):
            events = [ev for i, ev in enumerate(events) if i not in fresh]
    if len(events) > 1:
        return permute(choose, IO_ORDER, list(events))
    return events


def order_ties(choose, heap: list, now: float) -> None:
    """Timers of a ``(when, seq, item)`` heap due by ``now`` that share a
    deadline: ``choose`` orders each such group (``TIMER_TIE``). The group's
    sequence numbers are handed out again in the chosen order, so popping
    the heap yields it."""
    if len(heap) < 2 or heap[0][0] > now:
        return
    due = []
    while heap and heap[0][0] <= now:
        due.append(heapq.heappop(heap))
    i = 0
    while i < len(due):
        j = i + 1
        while j < len(due) and due[j][0] == due[i][0]:
            j += 1
        if j - i > 1:
            seqs = [e[1] for e in due[i:j]]
            due[i:j] = [(e[0], seq) + tuple(e[2:])
                        for seq, e in zip(seqs, permute(choose, TIMER_TIE, due[i:j]))]
        i = j
    for entry in due:
        heapq.heappush(heap, entry)
