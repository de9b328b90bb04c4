"""Zoo entries about cancellation: what a cancelled task leaves behind.

CPython 86296 (wait_for swallows a cancellation racing completion), CPython 102780
(a swallowed CancelledError without uncancel() breaks timeout()), CPython 109321
(StreamWriter.__del__ closes the transport), a redis-py CVE-2023-28858-style pool
(a cancelled command leaves its reply on a pooled connection) and an httpcore
830-style pool (a request cancelled while connecting keeps its slot).

Each program is deterministic at small sizes: the cancellation is delivered at a
chosen point (a named number of loop passes after an event, or while a reply is
known to be outstanding), so a later schedule explorer can vary that point. The
servers the pool programs talk to are served by the program itself on the same
loop (``port.start_server`` on ``_listen()``), so they run on the simulated network
as well; every one of them answers from a fixed delay, never from load.
"""
from __future__ import annotations

import gc

from bench.scenarios.api import Metric, run_program
from bench.zoo.harness import _by_style, _listen, _notes, _open, _presets, _stream, _task
from bench.zoo import releases
from bench.zoo.registry import Entry, Flip, _add


def _ratio_verdict(bad, trials):
    """bug shown iff any trial went wrong; None when no trial ran."""
    if not trials:
        return None
    return bad is not None and bad > 0


# ---------------------------------------------------------------------------
# CPython 86296: wait_for returns the result and drops the cancellation

def _race_stream(job):
    p = job.params
    fixed = job.variant == "fixed"

    async def main(port, out):
        swallowed = trials = 0
        for trial in range(p["trials"]):
            passes = trial % p["offsets"]     # loop passes between completion and cancel
            ev = port.Event()

            async def waiter():
                if fixed:      # what 3.12 made wait_for do: await inline under timeout()
                    async with port.timeout(p["timeout_s"]):
                        await ev.wait()
                    return "result"
                await port.wait_for(ev.wait(), p["timeout_s"])
                return "result"
            t = port.create_task(waiter())
            for _ in range(2):             # the waiter and wait_for's inner task are parked
                await port.sleep(0)
            ev.set()                       # the inner await completes...
            for _ in range(passes):
                await port.sleep(0)
            if not t.cancel():             # ...and the outer task is cancelled in the race
                await t                    # it had already returned: no race this time
                continue
            try:
                await t
                swallowed += 1             # the task ended normally: the cancel was lost
            except port.CancelledError:
                pass
            trials += 1
        out.update(swallowed_count=swallowed, trials_count=trials)
    return _stream(job, main, p["max_s"])


def _run_race(ctx):
    ran = run_program(ctx, max_s=ctx.params["max_s"] + 2)
    n, trials = ran.app.get("swallowed_count"), ran.app.get("trials_count")
    return ({"swallowed_count": n, "trials_count": trials},
            {"bug_shown": _ratio_verdict(n, trials)}, _notes(ran.app))


_add(Entry(
    id="cpython-86296", aliases=("bpo-42130",),
    title="wait_for() swallows a cancellation that races the inner completion",
    link="https://github.com/python/cpython/issues/86296",
    mechanism="When the awaited inner future completes in the same loop pass as the task "
              "running wait_for() is cancelled, wait_for() saw the inner result ready and "
              "returned it, dropping the CancelledError. The cancelled task carries on as if "
              "nothing happened (the thread: 'wait_for can hide cancellation in a rare race').",
    reported="Python 3.8-3.11 (bpo-42130, 2020)",
    fixed_in="Python 3.12.0: wait_for rewritten on asyncio.timeout() (GH-96764, PR 98518), "
             "which awaits the inner awaitable in the calling task; not backported to 3.11",
    expected="shown on the installed Python 3.11 asyncio and uvloop (asyncio's wait_for on "
             "uvloop's loop) and on hybrid with wait_for=task (its 3.11 default); not with "
             "the fixed program (timeout() + await), nor on hybrid:wait_for=inline; not shown "
             "on Python 3.12.1 and 3.13.0 (looplab repro cpython-86296 --versions)",
    oracle="bug shown when in any trial a task cancelled while still running ended normally; "
           "a trial whose task had already returned is not counted; not measured when no "
           "trial cancelled a running task",
    styles=("stream",), affects={"python": ("3.8.0", "3.12.0")},
    affected_versions=("python>=3.8,<3.12",), fixed_versions=("python>=3.12.0",),
    unaffected_versions=("python>=3.6,<3.8",),
    # below looplab's minimum (3.6-3.10) the same race runs as a standalone program
    program_file="wait_for_race.py", version_run=releases.race_run, version_variants=("naive",),
    flips=(Flip("hybrid:wait_for=inline", False,
                "our kernel with 3.12's wait_for (inline under a timeout)"),),
    show_on=("asyncio-streams", "hybrid:wait_for=task", "uvloop-streams"),
    minimum=(("trials_count", 1, "one cancelled trial"),),
    verified="read the thread (bpo-42130 migrated; PRs 26097 and 28149 closed unmerged) and "
             "PR 98518 (the 3.12 rewrite); measured with looplab repro cpython-86296 "
             "--versions (3.6-3.10 as a standalone program on asyncio's own loop): see the "
             "versions table in docs/zoo.md"),
    _run_race, [Metric("swallowed_count", "lower", "cancels swallowed"),
                Metric("trials_count", None, "trials")],
    _presets({"trials": 12, "offsets": 3, "timeout_s": 5.0, "max_s": 5}),
    {"stream": _race_stream})


# ---------------------------------------------------------------------------
# CPython 102780: a swallowed CancelledError without uncancel() inside timeout()

def _uncancel_stream(job):
    p = job.params
    fixed = job.variant == "fixed"

    async def main(port, out):
        got = {"TimeoutError": 0, "CancelledError": 0, "none": 0}

        async def body():
            me = port.current_task()

            async def canceller():
                await port.sleep(p["cancel_after_s"])
                me.cancel()
            c = port.create_task(canceller())
            try:
                async with port.timeout(p["timeout_s"]):
                    try:
                        await port.sleep(10)          # the outer cancel lands here
                    except port.CancelledError:
                        if fixed:
                            me.uncancel()            # the documented rule
                    await port.sleep(10)              # the timeout fires here
                got["none"] += 1
            except TimeoutError:
                got["TimeoutError"] += 1
            except port.CancelledError:
                got["CancelledError"] += 1
            await c
        for _ in range(p["trials"]):
            await port.create_task(body())
        out.update(cancelled_instead_of_timeout_count=got["CancelledError"],
                   timeout_error_count=got["TimeoutError"], trials_count=p["trials"])
    return _stream(job, main, p["max_s"])


def _run_uncancel(ctx):
    ran = run_program(ctx, max_s=ctx.params["max_s"] + 2)
    n, trials = ran.app.get("cancelled_instead_of_timeout_count"), ran.app.get("trials_count")
    return ({"cancelled_instead_of_timeout_count": n, "trials_count": trials,
             "timeout_error_count": ran.app.get("timeout_error_count")},
            {"bug_shown": _ratio_verdict(n, trials)}, _notes(ran.app))


_add(Entry(
    id="cpython-102780", aliases=("gh-102780",),
    title="a CancelledError caught without uncancel(): timeout() lets CancelledError out",
    link="https://github.com/python/cpython/issues/102780",
    mechanism="asyncio.timeout() tells its own cancellation from an outer one by the task's "
              "cancelling() count. Code that catches a CancelledError and carries on without "
              "task.uncancel() leaves the count raised, so when the timeout then expires its "
              "exit sees a cancellation it did not cause and re-raises CancelledError instead "
              "of TimeoutError (the thread: 'catching CancelledError requires use of "
              "task.uncancel()').",
    reported="Python 3.11 (2023-03; the thread's repro: the swallow before entering "
             "timeout())",
    fixed_in="PR 102815 (backported to 3.11; the installed 3.11.7 has it): timeout() records "
             "cancelling() on entry, which fixes the thread's repro; a swallow inside the "
             "timeout's block still needs uncancel() (documented by the same PR), which is "
             "what this entry measures",
    expected="shown on the installed Python 3.11.7 asyncio, on uvloop and on hybrid (whose "
             "Timeout follows the fixed 3.11.3 rule); not with uncancel(); the same on "
             "Python 3.12.1 and 3.13.0 (looplab repro cpython-102780 --versions)",
    oracle="bug shown when any trial's timeout() raised CancelledError rather than "
           "TimeoutError after the outer cancel had been caught",
    styles=("stream",),
    affected_versions=("python>=3.11",), fixed_versions=(),
    show_on=("asyncio-streams", "hybrid", "uvloop-streams"),
    minimum=(("trials_count", 1, "one trial"),),
    verified="read the thread and PR 102815 (its description and the docs it added); the "
             "swallow inside the block measured with looplab repro cpython-102780 --versions: "
             "CancelledError on 3.11.7, 3.12.1 and 3.13.0 without uncancel (the thread's own "
             "first repro, fixed in 3.11.3, is not what the entry runs)"),
    _run_uncancel, [Metric("cancelled_instead_of_timeout_count", "lower", "CancelledError escaped"),
                    Metric("timeout_error_count", None, "TimeoutError"),
                    Metric("trials_count", None, "trials")],
    _presets({"trials": 4, "cancel_after_s": 0.01, "timeout_s": 0.05, "max_s": 5}),
    {"stream": _uncancel_stream})


# ---------------------------------------------------------------------------
# A server the program serves itself: one reply per line, after a fixed delay

async def _serve_lines(port, delay_s, reply=lambda line: b"VAL " + line[4:], greeting=None,
                       greet_after_s=0.0):
    """Start a line server on this loop; returns (server, addr)."""
    sock = _listen()
    addr = sock.getsockname()[:2]

    async def handle(reader, writer):
        try:
            if greeting is not None:
                await port.sleep(greet_after_s)
                writer.write(greeting)
            while True:
                line = await reader.readline()
                if not line:
                    break
                await port.sleep(delay_s)
                writer.write(reply(line))
                await writer.drain()
        except (ConnectionError, port.CancelledError):
            pass
        finally:
            writer.close()
    server = await port.start_server(handle, sock=sock)
    return server, addr


async def _close_server(server):
    server.close()
    await server.wait_closed()


# ---------------------------------------------------------------------------
# redis-py CVE-2023-28858: the reply of a cancelled command goes to the next caller

def _pool_stream(job):
    p = job.params
    fixed = job.variant == "fixed"

    async def main(port, out):
        server, addr = await _serve_lines(port, p["reply_delay_s"])
        pool = []          # idle connections: (reader, writer)
        opened = [0]

        async def command(i):
            if pool:
                reader, writer = pool.pop()
            else:
                reader, writer = await _open(port, addr)
                opened[0] += 1
            ok = False
            try:
                writer.write(b"GET key%d\n" % i)
                await writer.drain()
                reply = await reader.readline()
                ok = True
                return reply
            finally:
                if ok or not fixed:
                    pool.append((reader, writer))      # naive: back to the pool, reply pending
                else:
                    writer.close()                     # the fix: a cancelled command disconnects
        wrong = answered = cancelled = 0
        for i in range(p["rounds"]):
            t = port.create_task(command(2 * i))
            await port.sleep(p["cancel_after_s"])      # sent; its reply is still on its way
            t.cancel()
            try:
                await t
            except port.CancelledError:
                cancelled += 1
            reply = await command(2 * i + 1)
            answered += 1
            wrong += reply.strip() != b"VAL key%d" % (2 * i + 1)
        for _, w in pool:
            w.close()
        await _close_server(server)
        out.update(wrong_replies_count=wrong, answered_count=answered, cancelled_count=cancelled,
                   connections_opened_count=opened[0])
    return _stream(job, main, p["max_s"])


class _Lines:
    """A task-port stream read line by line (a reply may arrive with the next one)."""

    def __init__(self, stream):
        self.stream, self.buf = stream, bytearray()

    async def readline(self) -> bytes:
        while b"\n" not in self.buf:
            data = await self.stream.receive_some(4096)
            if not data:
                return b""
            self.buf += data
        line, _, rest = bytes(self.buf).partition(b"\n")
        self.buf[:] = rest
        return line + b"\n"


def _pool_task(job):
    """The same pool on the task port: the cancel is a deadline (move_on_after) that
    expires while the reply is outstanding."""
    p = job.params
    fixed = job.variant == "fixed"

    async def main(port, out):
        sock = _listen()
        addr = sock.getsockname()[:2]
        listener = port.listen(sock)

        async def handle(stream):
            lines = _Lines(stream)
            try:
                while True:
                    line = await lines.readline()
                    if not line:
                        break
                    await port.sleep(p["reply_delay_s"])
                    await stream.send_all(b"VAL " + line[4:])
            except port.StreamError:
                pass
            finally:
                await stream.aclose()

        async def serve(n):
            while True:
                await n.spawn(handle, await listener.accept())

        pool, opened = [], [0]

        async def command(i):
            if pool:
                conn = pool.pop()
            else:
                conn = _Lines(await port.open_tcp_stream(*addr))
                opened[0] += 1
            ok = False
            try:
                await conn.stream.send_all(b"GET key%d\n" % i)
                reply = await conn.readline()
                ok = True
                return reply
            finally:
                if ok or not fixed:
                    pool.append(conn)          # naive: back to the pool, reply pending
                else:
                    await conn.stream.aclose()  # the fix: a cancelled command disconnects

        wrong = answered = cancelled = 0
        async with port.open_nursery() as n:
            await n.spawn(serve, n)
            for i in range(p["rounds"]):
                async with port.move_on_after(p["cancel_after_s"]) as scope:
                    await command(2 * i)
                cancelled += scope.cancelled_caught
                reply = await command(2 * i + 1)
                answered += 1
                wrong += reply.strip() != b"VAL key%d" % (2 * i + 1)
            await n.cancel()                    # the server's tasks, before its listener
        for conn in pool:
            await conn.stream.aclose()
        await listener.aclose()
        out.update(wrong_replies_count=wrong, answered_count=answered, cancelled_count=cancelled,
                   connections_opened_count=opened[0])
    return _task(job, main, p["max_s"])


def _run_pool(ctx):
    ran = run_program(ctx, max_s=ctx.params["max_s"] + 2)
    a = ran.app
    n, cancelled = a.get("wrong_replies_count"), a.get("cancelled_count")
    return ({"wrong_replies_count": n, "answered_count": a.get("answered_count"),
             "cancelled_count": cancelled, "connections_opened_count": a.get("connections_opened_count")},
            {"bug_shown": _ratio_verdict(n, cancelled)}, _notes(a))


_add(Entry(
    id="redis-py-2624", aliases=("CVE-2023-28858", "CVE-2023-28859", "redis-py-2665"),
    stand_in="our one-connection pool in place of redis-py's asyncio client (--versions runs "
             "the real 4.5.1, 4.5.3 and 4.5.4 on Python 3.10 against a RESP peer)",
    title="a cancelled command leaves its reply on the pooled connection: the next caller "
          "reads someone else's data",
    link="https://github.com/redis/redis-py/issues/2624",
    mechanism="A command was cancelled after it was sent and before its reply was read; the "
              "connection went back to the pool with that reply still on the wire. The next "
              "command on it read the previous reply, and the connection stayed off by one "
              "from then on (the thread: 'Off by 1').",
    reported="redis-py's asyncio client from 4.2.0 (issue 2579 for blocking commands, 2624 "
             "for all commands, 2023-03, on 4.5.1)",
    fixed_in="in two steps: 4.3.6, 4.4.3 and 4.5.3 (CVE-2023-28858, which the advisories "
             "quoted in the downstream threads describe as the pipeline case), then 4.4.4 and "
             "4.5.4 for single commands (CVE-2023-28859, issue 2665: the first fix was "
             "incomplete); a connection whose command was cancelled is disconnected. The "
             "entry's single commands are the 28859 case",
    framing="no RESP: a line server on the same loop answers 'GET keyN' with 'VAL keyN' after "
            "a fixed delay; a pool of one connection; the cancel lands while the reply is "
            "outstanding",
    expected="an application-level pool bug: shown on every stream and task runtime with "
             "the naive pool (the connection is returned with its reply pending; on the task "
             "port the cancel is a deadline expiring while the reply is outstanding); the "
             "fixed pool closes a connection whose command was cancelled",
    oracle="bug shown when any command received a reply meant for another command; not "
           "measured when no command was cancelled",
    styles=("stream", "task"),
    affected_versions=("redis==4.5.1", "redis==4.5.3"), fixed_versions=("redis==4.5.4",),
    # the real redis-py asyncio client (Python 3.10, async-timeout of its time) against
    # looplab's resp_server peer
    version_python="3.10", program_file="redis_cancel.py", version_run=releases.cancel_run,
    version_runtimes=("asyncio-streams",), version_variants=("naive",),
    version_with=("async-timeout==4.0.2",),
    show_on=("asyncio-streams", "hybrid", "uvloop-streams", "trio", "coro", "curio"),
    minimum=(("cancelled_count", 1, "one cancelled command"),),
    verified="read issues 2624 and 2665 (the repro: create_task(r.get), sleep, cancel, the "
             "next command gets the old reply) and the advisory texts quoted in downstream "
             "issues (feast 3603, django-q 722, openFEC 5381): 28858 fixed in 4.3.6/4.4.3/"
             "4.5.3, 28859 through 4.5.3 and fixed in 4.4.4/4.5.4; the CVE records themselves "
             "were not read; the advisory-database PR 1894 (fixes in 4.5.4 and 4.4.4); "
             "measured with looplab repro redis-py-2624 --versions (the real asyncio client on "
             "Python 3.10.13 against looplab's resp_server, reply delay 0.2 s, cancel after "
             "0.05 s, 4 rounds): 4 of 4 replies went to the wrong command on 4.5.1 and 4.5.3, "
             "none on 4.5.4"),
    _run_pool, [Metric("wrong_replies_count", "lower", "wrong replies"),
                Metric("answered_count", None, "answered"),
                Metric("cancelled_count", None, "cancelled"),
                Metric("connections_opened_count", None, "connections opened")],
    _presets({"rounds": 4, "reply_delay_s": 0.05, "cancel_after_s": 0.01, "max_s": 6}),
    _by_style(None, _pool_stream, _pool_task))


# ---------------------------------------------------------------------------
# httpcore 830 / 1093: a request cancelled while its connection connects keeps the slot

def _slots_stream(job):
    p = job.params
    fixed = job.variant == "fixed"

    async def main(port, out):
        # The server greets after a delay: the connection's handshake (TLS, a proxy's
        # CONNECT) during which the request is cancelled.
        server, addr = await _serve_lines(port, 0.0, greeting=b"HELLO\n",
                                          greet_after_s=p["handshake_s"])
        slots = []              # connections the pool counts against max_connections
        free = port.Event()

        class Conn:
            def __init__(self):
                self.state, self.owner, self.rw = "CONNECTING", None, None

        async def acquire(wait_s):
            async with port.timeout(wait_s):
                while True:
                    idle = [c for c in slots if c.state == "IDLE"]
                    if idle:
                        return idle[0]
                    if len(slots) < p["max_connections"]:
                        c = Conn()
                        slots.append(c)    # the slot is taken before the connection exists
                        return c
                    free.clear()
                    await free.wait()

        async def request(i, wait_s):
            conn = await acquire(wait_s)
            conn.owner = i
            try:
                if conn.state == "CONNECTING":
                    conn.rw = await _open(port, addr)
                    await conn.rw[0].readline()       # the handshake: cancelled in here
            except BaseException:
                if fixed:          # the fix: a connection nobody owns is reclaimed
                    slots.remove(conn)
                    if conn.rw:
                        conn.rw[1].close()
                    free.set()
                raise
            conn.state = "ACTIVE"
            try:
                reader, writer = conn.rw
                writer.write(b"GET /%d\n" % i)
                await writer.drain()
                return await reader.readline()
            finally:
                conn.state, conn.owner = "IDLE", None
                free.set()

        cancelled = 0
        for i in range(p["cancelled_requests"]):
            t = port.create_task(request(i, p["pool_wait_s"]))
            await port.sleep(p["cancel_after_s"])
            t.cancel()
            try:
                await t
            except port.CancelledError:
                cancelled += 1
        leaked = sum(1 for c in slots if c.state == "CONNECTING")
        try:
            await request(999, p["pool_wait_s"])
            later_ok = True
        except TimeoutError:
            later_ok = False      # PoolTimeout against a healthy server
        for c in slots:
            if c.rw:
                c.rw[1].close()
        await _close_server(server)
        out.update(slots_leaked_count=leaked, cancelled_count=cancelled, later_request_ok=later_ok)
    return _stream(job, main, p["max_s"])


def _slots_task(job):
    """The same pool on the task port: requests are cancelled by a deadline
    (move_on_after) while they wait for the greeting; a slot is waited for by polling."""
    p = job.params
    fixed = job.variant == "fixed"

    async def main(port, out):
        sock = _listen()
        addr = sock.getsockname()[:2]
        listener = port.listen(sock)

        async def greet(stream):
            try:
                await port.sleep(p["handshake_s"])
                await stream.send_all(b"HELLO\n")
                lines = _Lines(stream)
                while True:
                    line = await lines.readline()
                    if not line:
                        break
                    await stream.send_all(b"OK " + line)
            except port.StreamError:
                pass
            finally:
                await stream.aclose()

        async def serve(n):
            while True:
                await n.spawn(greet, await listener.accept())

        slots = []

        class Conn:
            def __init__(self):
                self.state, self.lines = "CONNECTING", None

        async def request(i):
            conn = None
            while conn is None:              # the pool's wait for a slot
                idle = [c for c in slots if c.state == "IDLE"]
                if idle:
                    conn = idle[0]
                elif len(slots) < p["max_connections"]:
                    conn = Conn()
                    slots.append(conn)       # the slot is taken before the connection exists
                else:
                    await port.sleep(0.01)
            try:
                if conn.state == "CONNECTING":
                    conn.lines = _Lines(await port.open_tcp_stream(*addr))
                    await conn.lines.readline()   # the handshake: cancelled in here
            except BaseException:
                if fixed:          # the fix: a connection nobody owns is reclaimed
                    slots.remove(conn)
                    if conn.lines:
                        await conn.lines.stream.aclose()
                raise
            conn.state = "ACTIVE"
            try:
                await conn.lines.stream.send_all(b"GET /%d\n" % i)
                return await conn.lines.readline()
            finally:
                conn.state = "IDLE"

        cancelled = 0
        async with port.open_nursery() as n:
            await n.spawn(serve, n)
            for i in range(p["cancelled_requests"]):
                async with port.move_on_after(p["cancel_after_s"]) as scope:
                    await request(i)
                cancelled += scope.cancelled_caught
            leaked = sum(1 for c in slots if c.state == "CONNECTING")
            async with port.move_on_after(p["pool_wait_s"] + p["handshake_s"]) as scope:
                await request(999)
            later_ok = not scope.cancelled_caught   # else: PoolTimeout against a healthy server
            await n.cancel()
        for c in slots:
            if c.lines:
                await c.lines.stream.aclose()
        await listener.aclose()
        out.update(slots_leaked_count=leaked, cancelled_count=cancelled, later_request_ok=later_ok)
    return _task(job, main, p["max_s"])


def _run_slots(ctx):
    ran = run_program(ctx, max_s=ctx.params["max_s"] + 2)
    a = ran.app
    n, cancelled = a.get("slots_leaked_count"), a.get("cancelled_count")
    return ({"slots_leaked_count": n, "cancelled_count": cancelled,
             "later_request_ok": a.get("later_request_ok")},
            {"bug_shown": _ratio_verdict(n, cancelled)}, _notes(a))


_add(Entry(
    id="httpcore-830", aliases=("httpcore-1093", "httpcore-658"),
    stand_in="our pool in place of httpcore's AsyncConnectionPool",
    title="a request cancelled while its connection connects keeps its pool slot",
    link="https://github.com/encode/httpcore/issues/830",
    mechanism="The pool assigns a request a new connection (taking a slot) before the "
              "connection is established. A request cancelled in that window leaves a "
              "connection that is neither idle, closed nor expired, so nothing reclaims it; "
              "once max_connections of them pile up every request fails with PoolTimeout "
              "against a healthy server.",
    reported="httpcore 0.17-1.0.9 (issues 658 and 830, closed; reproduced on 1.0.9 in issue "
             "1093, 2026)",
    fixed_in="not released: PRs 1094 and 1099 (open) reclaim a connection no request owns; "
             "the httpx2 fork fixed it (pydantic/httpx2 PR 983)",
    framing="no HTTP: a line server on the same loop greets after handshake_s (the "
            "connection's setup); a pool of max_connections slots; requests are cancelled "
            "while they wait for the greeting",
    expected="an application-level pool bug: shown on every stream and task runtime with the "
             "naive pool (on the task port the cancel is a deadline expiring during the "
             "handshake); the fixed pool reclaims the connection in its cancellation handler",
    oracle="bug shown when any slot is still held by a connecting connection that no request "
           "owns after the cancelled requests ended; not measured when none was cancelled",
    styles=("stream", "task"),
    affected_versions=("httpcore==1.0.9",), fixed_versions=(),
    show_on=("asyncio-streams", "hybrid", "uvloop-streams", "trio", "coro", "curio"),
    minimum=(("cancelled_count", 1, "one cancelled request"),),
    verified="read issue 1093 (mechanism, 1.0.9, '#658 and #830') and PRs 1094 and 1099 (root "
             "cause: is_closed/has_expired/is_idle all False for a CONNECTING connection; both "
             "open); issue 830 itself was found only through those cross-references"),
    _run_slots, [Metric("slots_leaked_count", "lower", "slots leaked"),
                 Metric("cancelled_count", None, "cancelled"),
                 Metric("later_request_ok", None, "later request served", unit="flag")],
    _presets({"max_connections": 2, "cancelled_requests": 2, "handshake_s": 0.1,
              "cancel_after_s": 0.02, "pool_wait_s": 0.5, "max_s": 6}),
    _by_style(None, _slots_stream, _slots_task))


# ---------------------------------------------------------------------------
# CPython 109321: StreamWriter.__del__ closes the transport under a live reader

def _del_stream(job):
    p = job.params
    fixed = job.variant == "fixed"

    async def main(port, out):
        server, addr = await _serve_lines(port, p["reply_delay_s"],
                                          reply=lambda line: bytes(p["reply_bytes"]))
        keep = []

        async def ask():
            """Send the request; hand back the reader only (the writer is dropped)."""
            reader, writer = await _open(port, addr)
            writer.write(b"GET big\n")
            await writer.drain()
            if fixed:
                keep.append(writer)     # the fix: the writer lives as long as the reader
            return reader
        got = 0
        for _ in range(p["trials"]):
            reader = await ask()
            gc.collect()                # the dropped writer is collected now, not by chance
            try:
                data = await reader.readexactly(p["reply_bytes"])
                got += len(data)
            except Exception as exc:   # noqa: BLE001 -- IncompleteReadError, ConnectionError
                out["error_seen"] = type(exc).__name__
        for w in keep:
            w.close()
        await _close_server(server)
        out.update(received_bytes=got, expected_bytes=p["trials"] * p["reply_bytes"],
                   trials_count=p["trials"])
    return _stream(job, main, p["max_s"])


def _run_del(ctx):
    ran = run_program(ctx, max_s=ctx.params["max_s"] + 2)
    a = ran.app
    got, want = a.get("received_bytes"), a.get("expected_bytes")
    lost = None if got is None or want is None else want - got
    notes = _notes(a) + ([f"reader saw {a['error_seen']}"] if a.get("error_seen") else [])
    return ({"reply_lost_bytes": lost, "received_bytes": got, "trials_count": a.get("trials_count")},
            {"bug_shown": None if lost is None or not a.get("trials_count") else lost > 0}, notes)


_add(Entry(
    id="cpython-109321", aliases=("gh-109321",),
    title="StreamWriter.__del__ closes the transport while its reader still reads",
    link="https://github.com/python/cpython/issues/109321",
    mechanism="Python 3.11.5 and 3.12 gave StreamWriter a __del__ that closes the transport "
              "(with a ResourceWarning) when the writer is garbage collected unclosed. Code "
              "that kept only the reader (or the protocol) lost its connection when the "
              "writer went out of scope (the thread: ConnectionResetError after StreamWriter "
              "is garbage collected).",
    reported="Python 3.11.5 and 3.12.0 (the __del__ came from PR 107650; issue 109538 for "
             "its closed-loop error)",
    fixed_in="not changed in CPython (the thread: the transport is not under the streams' "
             "control, so the writer closes it): keep a reference to the writer and close it "
             "yourself",
    framing="a line server on the same loop answers after reply_delay_s; the client helper "
            "returns only the reader and a gc.collect() runs before the read",
    expected="shown on the installed Python 3.11.7 asyncio streams, on asyncio streams over "
             "uvloop (asyncio's StreamWriter), not on hybrid (its writer has no __del__); "
             "not with the writer kept",
    oracle="bug shown when the reader received fewer reply bytes than the server sent",
    styles=("stream",), affects={"python": ("3.11.5", None)},
    affected_versions=("python>=3.11.5",), fixed_versions=(),
    show_on=("asyncio-streams", "uvloop-streams"), not_on=("hybrid",),
    minimum=(("trials_count", 1, "one request"),),
    verified="read the thread (gvanrossum's reply on why the writer closes the transport), "
             "issue 109538 (the __del__ from PR 107650, backported as 3.11.5) and a downstream "
             "workaround (NabuCasa universal-silabs-flasher PR 58); read StreamWriter.__del__ "
             "in the installed 3.12.1 (it closes the transport); measured on 3.11.7"),
    _run_del, [Metric("reply_lost_bytes", "lower", "reply bytes lost"),
               Metric("received_bytes", None, "received"), Metric("trials_count", None, "trials")],
    _presets({"trials": 2, "reply_bytes": 4096, "reply_delay_s": 0.05, "max_s": 6}),
    {"stream": _del_stream})
