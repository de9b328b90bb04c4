"""The benchmark of interleaving bugs, and three small programs from real threads.

``BENCHMARK`` lists every bug the benchmark runs, by target id
(``bench.explore.targets.resolve``): the S3 ``drain`` race, zoo entries, and
the programs below. It is a list of ids, so a zoo entry added later (the
cancellation entries) joins with one line, ``register("its-id", ...)``.

Each program is an asyncio program in two versions: ``naive`` carries the
mechanism of the bug as its thread reported it (reduced: the library's
primitive as it was then, written out in a few lines), ``fixed`` the fix the
thread settled on. Each races two things that happen at the same virtual
instant -- two messages arriving on two connections in one poll, or two
timers due together -- so only some orders of that one instant fail:

* ``cpython-27585`` (bpo-27585): a lock waiter that was already handed the
  lock is cancelled before it runs; the 3.6 ``Lock.acquire`` then wakes
  nobody and the next waiter hangs for ever (a liveness failure).
* ``cpython-23812`` (bpo-23812, python/asyncio#256): ``Queue.put_nowait``
  handed the item to the waiting getter's future; a getter cancelled before
  it ran lost the item.
* ``cpython-86296`` (bpo-42130): ``wait_for`` (3.8-3.11) returned the inner
  result when its own task was cancelled just as the inner finished, so the
  cancellation vanished and the worker never stopped (a liveness failure).
  Its race is two timers due at one deadline, an order asyncio leaves
  undefined and our callback kernel promises (scheduling order).
"""
from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from bench.props import always, eventually, observe, sometimes

__all__ = ["Bug", "PROGRAMS", "BENCHMARK", "HANGS", "register"]

AT = 1.0        # the instant both racing events happen (virtual seconds)


class Context:
    """What a program gets: the world, its seam, and two connections whose
    peers each send one message at ``AT`` (``ctx.conns[i]``: the app's end)."""

    def __init__(self, world, io, messages=(b"stop", b"item")):
        self.world = world
        self.io = io
        self.conns = []
        self._peers = []
        for msg in messages:
            app, peer = io.socketpair()
            app.setblocking(False)
            self.conns.append(app)
            self._peers.append(peer)
            world.call_at(AT, peer.send, msg)

    def close(self):
        for s in self.conns + self._peers:
            s.close()


@dataclass
class Bug:
    id: str
    title: str
    link: str
    mechanism: str
    naive: object
    fixed: object
    T: float = 5.0                  # the liveness bound, virtual seconds
    net: dict = field(default_factory=lambda: {"latency_s": 2e-6, "wake_s": 0.0})
    context: object = Context
    properties: tuple = ()          # always / eventually / sometimes (bench.props)


async def _recv(sock):
    return await asyncio.get_running_loop().sock_recv(sock, 100)


# ---------------------------------------------------------------------------
# cpython-27585: a cancelled lock waiter that was handed the lock

class Lock36:
    """asyncio.Lock's acquire/release as in 3.6 (``fixed=False``) and with
    the bpo-27585 fix: a waiter cancelled after release() chose it passes
    the wake-up on."""

    def __init__(self, fixed):
        self.fixed = fixed
        self.locked = False
        self.waiters = deque()
        self.holders = 0            # what the properties read: who holds it now

    async def acquire(self):
        if not self.locked and all(w.cancelled() for w in self.waiters):
            self.locked = True
            self.holders += 1
            return
        fut = asyncio.get_running_loop().create_future()
        self.waiters.append(fut)
        try:
            await fut
            self.locked = True
            self.holders += 1
        except asyncio.CancelledError:
            if self.fixed and not self.locked:
                self._wake_first()
            raise
        finally:
            self.waiters.remove(fut)

    def release(self):
        self.locked = False
        self.holders -= 1
        self._wake_first()

    def _wake_first(self):
        for fut in self.waiters:
            if not fut.done():
                fut.set_result(True)
                break


async def _lock_program(ctx, fixed):
    lock = Lock36(fixed)
    observe(lock=lock)
    await lock.acquire()

    async def user(name):
        await lock.acquire()
        lock.release()
        return name

    b = asyncio.ensure_future(user("b"))
    c = asyncio.ensure_future(user("c"))

    async def on_disconnect():       # the peer of b goes away: b is cancelled
        await _recv(ctx.conns[0])
        # the race window: the lock was handed to a waiter that has not run yet
        observe(cancel_in_window=bool(lock.waiters) and lock.waiters[0].done()
                and not lock.locked)
        b.cancel()

    async def on_done():             # the holder's work finishes: it releases
        await _recv(ctx.conns[1])
        lock.release()

    tasks = [asyncio.ensure_future(on_disconnect()), asyncio.ensure_future(on_done())]
    await asyncio.gather(*tasks)
    assert await c == "c", "c did not get the lock"
    await asyncio.gather(b, return_exceptions=True)


async def lock_naive(ctx):
    await _lock_program(ctx, fixed=False)


async def lock_fixed(ctx):
    await _lock_program(ctx, fixed=True)


# ---------------------------------------------------------------------------
# cpython-23812: an item handed to a getter that is then cancelled

class Queue34:
    """``put_nowait`` hands the item to the first waiting getter's future
    (3.4, ``fixed=False``), or only wakes it and the getter takes the item
    when it runs (the bpo-23812 fix)."""

    def __init__(self, fixed):
        self.fixed = fixed
        self.items = deque()
        self.getters = deque()
        self.woken = None           # a getter's future set, its getter not yet run

    def put_nowait(self, item):
        while self.getters:
            g = self.getters.popleft()
            if not g.done():
                self.woken = g
                if self.fixed:
                    self.items.append(item)
                    g.set_result(None)
                else:
                    g.set_result(item)
                return
        self.items.append(item)

    async def get(self):
        while not self.items:
            g = asyncio.get_running_loop().create_future()
            self.getters.append(g)
            try:
                got = await g
                self.woken = None
            except asyncio.CancelledError:
                self.woken = None
                if self.fixed and self.items and not g.cancelled():
                    self.put_nowait(self.items.popleft())    # wake the next getter
                raise
            if not self.fixed:
                return got
        return self.items.popleft()


async def _queue_program(ctx, fixed):
    q = Queue34(fixed)
    received = []

    async def consumer():
        received.append(await q.get())

    getter = asyncio.ensure_future(consumer())
    observe(queue=q, received=received)

    async def on_stop():             # the client's deadline: stop waiting
        await _recv(ctx.conns[0])
        # the race window: the getter was woken (handed the item) and has not run
        observe(cancel_in_window=q.woken is not None)
        getter.cancel()

    async def on_item():             # an item arrives from the producer
        q.put_nowait(await _recv(ctx.conns[1]))

    await asyncio.gather(on_stop(), on_item())
    await asyncio.gather(getter, return_exceptions=True)
    assert len(received) + len(q.items) == 1, \
        f"the item was lost: received {len(received)}, queued {len(q.items)}"


async def queue_naive(ctx):
    await _queue_program(ctx, fixed=False)


async def queue_fixed(ctx):
    await _queue_program(ctx, fixed=True)


# ---------------------------------------------------------------------------
# cpython-86296: wait_for swallows the cancellation of its own task

async def wait_for_311(aw, timeout, fixed):
    """asyncio.wait_for's structure in 3.8-3.11 (``fixed=False``): when the
    outer task is cancelled and the inner is already done, it returns the
    result. Fixed (3.12): the cancellation propagates."""
    loop = asyncio.get_running_loop()
    waiter = loop.create_future()
    fut = asyncio.ensure_future(aw)

    def release(_=None):
        if not waiter.done():
            waiter.set_result(None)
    handle = loop.call_later(timeout, release)
    fut.add_done_callback(release)
    try:
        try:
            await waiter
        except asyncio.CancelledError:
            if fut.done() and not fixed:
                return fut.result()
            fut.remove_done_callback(release)
            fut.cancel()
            raise
        if fut.done():
            return fut.result()
        fut.remove_done_callback(release)
        fut.cancel()
        raise asyncio.TimeoutError
    finally:
        handle.cancel()


async def _wait_for_program(ctx, fixed):
    loop = asyncio.get_running_loop()
    q = asyncio.Queue()

    async def worker():
        while True:
            try:
                await wait_for_311(q.get(), 10.0, fixed)
            except asyncio.TimeoutError:
                continue

    w = asyncio.ensure_future(worker())
    observe(worker=w)
    await asyncio.sleep(0)
    # two timers due at the same deadline: the shutdown and the last item
    loop.call_at(AT, w.cancel)
    loop.call_at(AT, q.put_nowait, "item")
    try:
        await w
    except asyncio.CancelledError:
        return
    raise AssertionError("the worker returned instead of being cancelled")


async def wait_for_naive(ctx):
    await _wait_for_program(ctx, fixed=False)


async def wait_for_fixed(ctx):
    await _wait_for_program(ctx, fixed=True)


_WINDOW = "the cancellation lands in the race window"

PROGRAMS = {b.id: b for b in (
    Bug("cpython-27585", "a lock waiter cancelled after it was handed the lock: the next "
        "waiter hangs", "https://github.com/python/cpython/pull/1031",
        "release() hands the lock to the first waiter's future; that waiter is cancelled "
        "before it runs, and 3.6's acquire() re-raises without waking the next waiter.",
        lock_naive, lock_fixed,
        properties=(always("the lock has at most one holder",
                           lambda s: s.app["lock"].holders <= 1 if "lock" in s.app else True),
                    sometimes(_WINDOW, lambda s: s.app.get("cancel_in_window")))),
    Bug("cpython-23812", "Queue.put_nowait then cancelling the getter loses the item",
        "https://github.com/python/asyncio/pull/256",
        "put_nowait() hands the item to the waiting getter's future; the getter is cancelled "
        "before it runs, and the item goes with the cancelled task.",
        queue_naive, queue_fixed,
        properties=(always("the item is in one place at most",
                           lambda s: "queue" not in s.app
                           or len(s.app["received"]) + len(s.app["queue"].items) <= 1),
                    sometimes(_WINDOW, lambda s: s.app.get("cancel_in_window")))),
    Bug("cpython-86296", "wait_for swallows a cancellation that races the inner result",
        "https://github.com/python/cpython/issues/86296",
        "The task in wait_for() is cancelled just as the awaited call finishes; 3.8-3.11 return "
        "the result and drop the cancellation, so a worker told to stop keeps running.",
        wait_for_naive, wait_for_fixed,
        properties=(eventually("the worker has stopped",
                               lambda s: "worker" in s.app and s.app["worker"].done(),
                               within_s=AT + 1.0),)),
)}

#: The benchmark, by target id, in table order.
BENCHMARK: list = ["S3:drain", "trio-1626", "cpython-27585", "cpython-23812", "cpython-86296"]

#: Zoo entries whose bug is a hang: what waits for ever when ``bug_shown``
#: holds. The entry's own oracle is a bounded wait (the task is still parked
#: ``bound_s`` after the event that should have woken it), which is the
#: liveness bound of a cell; the explorer reports such a failure as ``hang``.
HANGS: dict = {
    "uvicorn-336": "the writer parked in drain() (waiting for resume_writing) is never "
                   "released after connection_lost",
}


def register(target_id: str) -> None:
    """Add a target (a zoo entry id, a scenario variant) to the benchmark."""
    if target_id not in BENCHMARK:
        BENCHMARK.append(target_id)


# The zoo's cancellation entries (bench/zoo/cancel.py) that run on the simulated
# network, all five. cpython-86296's id names the program above; ``zoo:`` names
# the zoo entry of the same bug.
for _id in ("zoo:cpython-86296", "cpython-102780", "cpython-109321", "redis-py-2624",
            "httpcore-830"):
    register(_id)
register("uvicorn-336")     # a hang of the zoo, reported as a liveness violation
