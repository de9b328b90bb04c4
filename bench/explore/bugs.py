"""The benchmark of interleaving bugs, and six small programs from real threads.

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

Three more race a cancellation against the event it cancels, where the zoo's
entries of the same ids (``zoo:ID``) place the cancellation themselves:

* ``cpython-102780``: a CancelledError caught without ``uncancel()`` inside
  ``timeout()``; when the budget expires, CancelledError comes out instead
  of TimeoutError.
* ``redis-py-2624``: a command cancelled with its reply already in the
  connection's buffer; the pooled connection hands that reply to the next
  command (off by one).
* ``httpcore-830`` (httpcore#1093): a request cancelled during its new
  connection's handshake keeps the pool's only slot (PoolTimeout).
"""
from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from functools import partial

from bench.scenarios.properties import always, eventually, observe, sometimes

__all__ = ["Bug", "Context", "PROGRAMS", "BENCHMARK", "HANGS", "register", "DEFAULT_NET"]

AT = 1.0        # the instant both racing events happen (virtual seconds)


class Context:
    """What a program that takes one argument gets: the run's world and its seam,
    the virtual clock, ``observe``, and connections whose other end follows a
    script. ``ctx.conns[i]`` is the app's end of one connection per entry of
    ``messages``: an entry that is bytes is what its peer sends at ``AT``;
    otherwise it is the peer's script, ``((t, bytes), ...)``. Peers whose sends
    share an instant send in connection order, except that those in ``first``
    send before the others: a poll reports the connection that became readable
    first first (epoll's order), so this decides the default order of the race."""

    def __init__(self, world, io, messages=(b"stop", b"item"), first=()):
        self.world = world
        self.io = io
        self.conns = []
        self._peers = []
        for _ in messages:
            self.connection()
        order = list(first) + [i for i in range(len(messages)) if i not in first]
        for i in order:
            msg = messages[i]
            for t, data in ((AT, msg),) if isinstance(msg, bytes) else msg:
                world.call_at(t, _send, self._peers[i], data)

    @property
    def now(self) -> float:
        """Virtual seconds since the run began."""
        return self.world.now

    @staticmethod
    def observe(**values) -> None:
        """Publish ``values`` to the declared properties (``s.app``)."""
        observe(**values)

    def connection(self, *script, name=None):
        """A new connection: the app's end (a non-blocking simulated socket, also
        appended to ``conns``); its peer sends each ``(t, bytes)`` of ``script`` at
        virtual time ``t``. ``name`` is how choice labels call it."""
        app, peer = self.io.socketpair()
        app.setblocking(False)
        if name:
            app.looplab_name = f"connection {name!r}"
        self.conns.append(app)
        self._peers.append(peer)
        for t, data in script:
            self.world.call_at(t, _send, peer, data)
        return app

    def close(self):
        for s in self.conns + self._peers:
            s.close()


def _send(peer, data):
    try:
        peer.send(data)
    except OSError:
        pass                # the program closed its end first: a script goes unheard


#: The network a program runs on unless it says otherwise (``Bug.net``).
DEFAULT_NET = {"latency_s": 2e-6, "wake_s": 0.0}


@dataclass
class Bug:
    """A program in two versions, ``naive`` and ``fixed``: coroutine functions
    that take no arguments or one (the run's ``Context``). ``T`` is the liveness
    bound (virtual seconds), ``net`` the world's parameters, ``context`` what
    builds the context, ``properties`` the declared ``always``/``eventually``/
    ``sometimes``. A user writes ``Bug(naive=f, fixed=g)``; the rest describes
    the benchmark's programs."""
    id: str = ""
    title: str = ""
    link: str = ""
    mechanism: str = ""
    naive: object = None
    fixed: object = None
    T: float = 5.0                  # the liveness bound, virtual seconds
    net: dict = field(default_factory=lambda: dict(DEFAULT_NET))
    context: object = Context
    properties: tuple = ()          # always / eventually / sometimes (bench.scenarios.properties)

    def __post_init__(self):
        if not callable(self.naive) or not callable(self.fixed):
            raise TypeError("Bug needs naive= and fixed=, two coroutine functions")


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


# ---------------------------------------------------------------------------
# cpython-102780: a cancellation caught without uncancel() inside timeout()

async def _timeout_program(ctx, fixed):
    """A worker reads a request under a budget (``timeout_at``); a shutdown
    interrupts the read, if it is still waiting, by cancelling the worker,
    which catches that and carries on. The work then overruns the budget, so
    the worker must end in TimeoutError. Naive: the CancelledError is caught
    without ``uncancel()``, so timeout() sees a cancellation it did not
    cause and lets CancelledError out instead. The race: the request and
    the shutdown arrive at one instant; only when the shutdown's task runs
    first is the read still waiting."""
    reading = True
    ended = []

    async def worker():
        nonlocal reading
        me = asyncio.current_task()
        try:
            async with asyncio.timeout_at(AT + 0.5):
                try:
                    await _recv(ctx.conns[1])            # the request
                except asyncio.CancelledError:
                    if fixed:
                        me.uncancel()                    # the documented rule
                finally:
                    reading = False
                await asyncio.sleep(10)                  # the work overruns the budget
            ended.append("returned")
        except TimeoutError:
            ended.append("TimeoutError")
        except asyncio.CancelledError:
            ended.append("CancelledError")

    w = asyncio.ensure_future(worker())

    async def on_shutdown():
        await _recv(ctx.conns[0])
        if reading:
            w.cancel()                                   # interrupt the read

    await asyncio.gather(on_shutdown(), w)
    assert ended == ["TimeoutError"], \
        f"the budget's overrun ended the worker with {ended[0] if ended else 'nothing'}, " \
        f"not TimeoutError"


async def timeout_naive(ctx):
    await _timeout_program(ctx, fixed=False)


async def timeout_fixed(ctx):
    await _timeout_program(ctx, fixed=True)


# ---------------------------------------------------------------------------
# redis-py-2624: a cancelled command's reply is left for the next command

async def _pool_program(ctx, fixed):
    """A pool of one connection (asyncio streams, as redis-py's client). The
    first command is sent; its reply and the caller's cancellation arrive
    at one instant. If the cancellation runs first, the reply is already in
    the connection's StreamReader buffer; the naive pool takes the
    connection back and the next command reads the old reply. Fixed (redis-py
    4.4.4/4.5.4): a cancelled command disconnects its connection."""
    pool = [await asyncio.open_connection(sock=ctx.conns[1])]
    spare = [ctx.conns[2]]                  # a new connection, when the pool is empty
    opened = []

    async def command(key):
        if pool:
            reader, writer = pool.pop()
        else:
            reader, writer = await asyncio.open_connection(sock=spare.pop())
            opened.append(writer)
        ok = False
        try:
            writer.write(b"GET " + key + b"\n")
            reply = await reader.readline()
            ok = True
            return reply
        finally:
            if ok or not fixed:
                pool.append((reader, writer))   # naive: back to the pool, reply unread
            else:
                writer.close()                  # the fix: a cancelled command disconnects

    first = asyncio.ensure_future(command(b"key0"))

    async def on_deadline():                    # the caller gives up on the first command
        await _recv(ctx.conns[0])
        first.cancel()

    await asyncio.gather(on_deadline(), asyncio.gather(first, return_exceptions=True))
    reply = await command(b"key1")
    for _, writer in pool:
        writer.close()
    assert reply == b"VAL key1\n", f"command key1 read {reply!r}: a cancelled command's reply"


async def pool_naive(ctx):
    await _pool_program(ctx, fixed=False)


async def pool_fixed(ctx):
    await _pool_program(ctx, fixed=True)


# the caller's deadline; the pooled connection answers key0 at AT and key1 later;
# a fresh connection answers key1 (the fixed pool's second command)
_POOL_SCRIPT = (b"stop", ((AT, b"VAL key0\n"), (AT + 0.5, b"VAL key1\n")),
                ((AT + 0.5, b"VAL key1\n"),))


# ---------------------------------------------------------------------------
# httpcore-830: a request cancelled while its connection connects keeps the slot

class _Slot:
    def __init__(self):
        self.state, self.rw = "CONNECTING", None


async def _slot_program(ctx, fixed):
    """A pool of one slot. A request takes the slot before its connection
    exists and waits for the connection's handshake (a greeting, as TLS or
    a proxy's CONNECT); the greeting and the caller's cancellation arrive at
    one instant. Cancelled first, the naive request leaves a CONNECTING
    connection that nobody owns, so the next request times out against a
    healthy server. Fixed (httpcore PRs 1094/1099, httpx2 PR 983): a
    connection no request owns is reclaimed."""
    slots = []
    free = asyncio.Event()

    async def acquire(wait_s):
        async with asyncio.timeout(wait_s):
            while True:
                idle = [c for c in slots if c.state == "IDLE"]
                if idle:
                    return idle[0]
                if not slots:
                    c = _Slot()
                    slots.append(c)             # the slot is taken before the connection
                    return c
                free.clear()
                await free.wait()

    async def request(sock):
        conn = await acquire(0.5)
        try:
            if conn.state == "CONNECTING":
                conn.rw = await asyncio.open_connection(sock=sock)
                await conn.rw[0].readline()     # the handshake
        except BaseException:
            if fixed:                           # the fix: reclaim the orphaned connection
                slots.remove(conn)
                if conn.rw:
                    conn.rw[1].close()
                free.set()
            raise
        conn.state = "ACTIVE"
        try:
            conn.rw[1].write(b"GET /\n")
            return await conn.rw[0].readline()
        finally:
            conn.state = "IDLE"
            free.set()

    first = asyncio.ensure_future(request(ctx.conns[1]))
    await asyncio.sleep(AT / 2)                 # the request is connecting

    async def on_cancel():                      # the caller goes away
        await _recv(ctx.conns[0])
        first.cancel()

    await asyncio.gather(on_cancel(), asyncio.gather(first, return_exceptions=True))
    try:
        await acquire(0.5)
    except TimeoutError:
        raise AssertionError("PoolTimeout against a healthy server: a cancelled request's "
                             "connecting connection keeps the only slot") from None
    finally:
        for c in slots:
            if c.rw:
                c.rw[1].close()


async def slot_naive(ctx):
    await _slot_program(ctx, fixed=False)


async def slot_fixed(ctx):
    await _slot_program(ctx, fixed=True)

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
    Bug("cpython-102780", "a cancellation caught without uncancel() turns timeout()'s "
        "TimeoutError into CancelledError", "https://github.com/python/cpython/issues/102780",
        "A worker under timeout() catches the CancelledError that interrupts its read and "
        "carries on without task.uncancel(); when the budget expires, timeout() counts that "
        "cancellation as an outer one and lets CancelledError out.",
        timeout_naive, timeout_fixed, context=partial(Context, first=(1,))),
    Bug("redis-py-2624", "a cancelled command's reply is read by the next command",
        "https://github.com/redis/redis-py/issues/2624",
        "The command is cancelled after its reply reached the connection's buffer and before "
        "it read it; the pool takes the connection back and the next command reads the old "
        "reply (off by one).",
        pool_naive, pool_fixed, context=partial(Context, messages=_POOL_SCRIPT, first=(1,))),
    Bug("httpcore-830", "a request cancelled during its connection's handshake keeps the "
        "pool's slot", "https://github.com/encode/httpcore/issues/1093",
        "The pool assigns the request a new connection (a slot) before it is established; "
        "cancelled during the handshake, the request leaves a CONNECTING connection nobody "
        "owns or reclaims, and the next request times out (PoolTimeout).",
        slot_naive, slot_fixed, context=partial(Context, messages=(b"stop", b"HELLO\n"),
                                                first=(1,))),
)}

#: The benchmark, by target id, in table order.
BENCHMARK: list = ["S3:drain", "trio-1626", "cpython-27585", "cpython-23812", "cpython-86296",
                   "cpython-102780", "redis-py-2624", "httpcore-830"]

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
# network, all five. Where a program above has the entry's id, the id names the
# program; ``zoo:`` names the zoo entry of the same bug.
for _id in ("zoo:cpython-86296", "zoo:cpython-102780", "cpython-109321", "zoo:redis-py-2624",
            "zoo:httpcore-830"):
    register(_id)
register("uvicorn-336")     # a hang of the zoo, reported as a liveness violation
