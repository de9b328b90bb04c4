"""Behaviour of the coro trap kernel (kernels/coro): scheduling, cancellation,
timeouts, task groups, sync primitives, sockets without a user buffer, the
options' fingerprints, exit policies and Ctrl-C.

Every test is bounded: blocking waits sit under a timeout block, and sizes are
small. Peers live in the same kernel (the scenario tests run real peers in
another process); that keeps these tests exact about *when* things happen.
"""
from __future__ import annotations

import gc
import os
import random
import select
import signal
import socket
import struct
import threading
import time

import pytest

import kernels.coro as c
from kernels.coro import traps as kernel_module
from kernels.io import RealIO, SelectorsPoller
from kernels.options import OptionError

MiB = 1 << 20


def run(main, *args, **options):
    return c.run(main, *args, **options)


def pattern(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


async def tcp_pair(sockbuf=None):
    """A connected (client, server) pair of SocketStreams on 127.0.0.1."""
    async with c.listen(("127.0.0.1", 0), sockbuf=sockbuf) as listener:
        client = await c.open_tcp_stream("127.0.0.1", listener.address[1], sockbuf=sockbuf)
        server = await listener.accept()
    return client, server


async def read_all(stream, limit_s=10.0) -> bytes:
    got = bytearray()
    async with c.timeout_after(limit_s):
        while True:
            data = await stream.receive_some()
            if not data:
                return bytes(got)
            got += data


# ---------------------------------------------------------------------------
# Kernel lifecycle and options

@pytest.mark.parametrize("option, value", [
    ("spawn", "sometimes"), ("cancel", "pulse"), ("exit", "abandon"),
    ("ready_order", "random"), ("ready_order", "random-x"), ("ready_order", "lifo"),
])
def test_bad_option_values_are_option_errors(option, value):
    with pytest.raises(OptionError, match=f"coro: bad value .* for option {option}"):
        c.Kernel(**{option: value})


def test_options_schema_is_the_one_declaration():
    assert c.OPTIONS.owner == "coro"
    with c.Kernel() as k:
        assert k.options == c.OPTIONS.defaults()
    with pytest.raises(OptionError, match="io_schedule_point: must be true or false"):
        c.Kernel(io_schedule_point="maybe")
    with pytest.raises(OptionError, match="unknown option 'drain'"):
        c.Kernel(drain="empty")
    with c.Kernel(io_schedule_point="true", ready_order="random-7") as k:   # spec text
        assert k.options["io_schedule_point"] is True and k._seed == 7


def test_trap_table_is_built_by_name_and_checked():
    from kernels.coro import engine, traps

    def handlers(**extra):
        table = {f"trap_{op}": (lambda task, trap: False) for op in traps.OPCODES}
        table.update(extra)
        return table

    table = engine.trap_table(handlers())
    assert len(table) == len(traps.OPCODES)
    names = handlers()
    del names["trap_park"]
    with pytest.raises(RuntimeError, match="no handler for \\['park'\\]"):
        engine.trap_table(names)
    with pytest.raises(RuntimeError, match="no opcode for \\['teleport'\\]"):
        engine.trap_table(handlers(trap_teleport=lambda task, trap: False))


def test_kernel_runs_again_and_close_is_idempotent():
    async def main(x):
        await c.sleep(0)
        return x + 1

    with c.Kernel() as k:
        assert k.run(main, 1) == 2
        assert k.run(main, 2) == 3
    k.close()
    with pytest.raises(RuntimeError, match="closed"):
        k.run(main, 1)


def test_traps_outside_a_kernel_raise_runtime_error():
    with pytest.raises(RuntimeError, match="coro kernel"):
        c.sleep(0).send(None)
    with pytest.raises(RuntimeError, match="coro kernel"):
        c.current_task().send(None)
    with pytest.raises(RuntimeError, match="coro kernel"):
        c.spawn_soon(c.sleep, 0)


def test_run_can_not_be_nested():
    async def main():
        with pytest.raises(RuntimeError, match="already running"):
            c.run(c.sleep, 0)
        return "ok"

    assert run(main) == "ok"


def test_main_must_be_an_async_function():
    def plain():
        return 3

    with pytest.raises(TypeError, match="not an async function"):
        run(plain)


def test_awaiting_a_foreign_awaitable_raises_type_error_in_the_task():
    class Foreign:
        def __await__(self):
            yield "an asyncio future, say"

    async def main():
        with pytest.raises(TypeError, match="not a coro kernel trap"):
            await Foreign()
        return "survived"

    assert run(main) == "survived"


# ---------------------------------------------------------------------------
# Sleeping and ordering

def test_sleepers_wake_in_deadline_order():
    woke = []

    async def sleeper(name, delay):
        await c.sleep(delay)
        woke.append(name)

    async def main():
        for name, delay in [("c", 0.06), ("a", 0.02), ("b", 0.04), ("z", 0)]:
            await c.spawn(sleeper, name, delay)

    run(main, exit="wait")
    assert woke == ["z", "a", "b", "c"]


def test_timer_ties_wake_in_the_order_they_slept(monkeypatch):
    # A 50 ms clock makes every deadline below collide exactly, so only the
    # heap's tie-breaker decides the order.
    real = time.monotonic

    class CoarseClock(RealIO):
        time = staticmethod(lambda: (real() // 0.05) * 0.05)
    woke = []

    async def sleeper(i):
        await c.sleep(0.05)
        woke.append(i)

    async def main():
        await c.sleep(0.05)          # start right after a clock tick
        for i in range(20):
            await c.spawn(sleeper, i)

    with c.Kernel(exit="wait", io=CoarseClock()) as k:
        k.run(main)
    assert woke == list(range(20))


def test_sleep_zero_round_robins_ready_tasks():
    order = []

    async def worker(name):
        for i in range(3):
            order.append((name, i))
            await c.sleep(0)

    async def main():
        for name in "abc":
            await c.spawn(worker, name)

    run(main, exit="wait")
    assert order == [(n, i) for i in range(3) for n in "abc"]


def test_sleep_rejects_bad_durations():
    async def main():
        with pytest.raises(ValueError):
            await c.sleep(-1)
        with pytest.raises(ValueError):
            await c.sleep(float("nan"))
        with pytest.raises(TypeError):
            await c.sleep("1")

    run(main)


# ---------------------------------------------------------------------------
# Spawning, joining, the spawn option and ready order

@pytest.mark.parametrize("spawn, expected", [("lazy", False), ("eager", True)])
def test_spawn_option_decides_whether_the_child_ran_before_spawn_returned(spawn, expected):
    async def main():
        ran = []

        async def child():
            ran.append("spawn")
            await c.sleep(0)

        async def child2():
            ran.append("start_soon")
            await c.sleep(0)

        await c.spawn(child)
        after_spawn = "spawn" in ran
        async with c.TaskGroup() as g:
            g.start_soon(child2)
            after_start_soon = "start_soon" in ran
        return after_spawn, after_start_soon

    assert run(main, spawn=spawn) == (expected, expected)


def test_eager_child_that_finishes_in_its_first_step_is_done_at_once():
    async def quick():
        return 7

    async def main():
        t = await c.spawn(quick)
        return t.done(), await t.join()

    assert run(main, spawn="eager") == (True, 7)
    assert run(main, spawn="lazy") == (False, 7)


def child_first_count(trials: int, **options) -> int:
    async def main():
        first = 0
        for _ in range(trials):
            order = []

            async def child():
                order.append("child")

            await c.spawn(child)
            await c.sleep(0)
            order.append("parent")
            first += order[0] == "child"
            await c.sleep(0)        # let the child finish before the next trial
        return first

    return run(main, **options)


def test_fifo_ready_order_runs_the_child_first_every_time():
    assert child_first_count(200) == 200


def test_random_ready_order_runs_the_child_first_about_half_the_time():
    count = child_first_count(200, ready_order="random-7")
    assert 40 <= count <= 160
    assert child_first_count(200, ready_order="random-7") == count   # seeded: repeatable


def test_join_returns_result_and_raises_task_error_from_the_exception():
    boom = ValueError("boom")

    async def ok():
        await c.sleep(0.01)
        return "result"

    async def bad():
        await c.sleep(0)
        raise boom

    async def main():
        t1 = await c.spawn(ok)
        t2 = await c.spawn(bad)
        assert await t1.join() == "result"
        with pytest.raises(c.TaskError) as info:     # curio: TaskError chained from it
            await t2.join()
        assert info.value.__cause__ is boom
        with pytest.raises(ValueError) as raw:       # result() gives the exception itself
            t2.result()
        assert raw.value is boom and t2.exception() is boom
        assert t1.done() and t2.done() and not t2.cancelled()
        assert t1.name.endswith("ok")
        with pytest.raises(RuntimeError, match="itself"):
            await (await c.current_task()).join()

    run(main)


def test_spawn_of_a_non_async_function_raises_type_error_in_the_spawner():
    async def main():
        with pytest.raises(TypeError, match="not an async function"):
            await c.spawn(len, "abc")
        with pytest.raises(TypeError):
            await c.spawn(42)

    run(main)


def test_every_crash_is_reported_once_when_it_happens(capfd):
    # curio logs "Task Crash" for every task but main that ends with an exception,
    # joined or not, at the moment it ends; join() still raises TaskError.
    async def bad(tag):
        raise RuntimeError(tag)

    async def main():
        t = await c.spawn(bad, "joined-one")
        await c.spawn(bad, "lonely-one")
        await c.sleep(0.01)
        reported = [line for line in capfd.readouterr().err.splitlines() if line.strip()]
        with pytest.raises(c.TaskError):
            await t.join()
        return reported

    reported = run(main)
    gc.collect()
    assert capfd.readouterr().err == ""         # nothing more at join, run end or collection
    assert len(reported) == 2, reported
    assert "joined-one" in reported[0] and "lonely-one" in reported[1]
    assert all("crashed: RuntimeError" in line for line in reported)


def test_main_task_and_cancelled_tasks_are_not_reported_as_crashes(capfd):
    async def victim():
        await c.sleep(10)

    async def main():
        t = await c.spawn(victim)
        await c.sleep(0.01)
        await t.cancel()
        raise ValueError("main's own")

    with pytest.raises(ValueError):
        run(main)
    assert capfd.readouterr().err == ""


# ---------------------------------------------------------------------------
# Cancellation

def test_cancel_is_delivered_at_the_blocking_point():
    async def main():
        where = []

        async def victim():
            try:
                await c.sleep(10)
            except c.Cancelled:
                where.append("sleep")
                raise

        t = await c.spawn(victim)
        await c.sleep(0.01)
        assert await t.cancel() is None         # curio's cancel() returns nothing
        assert where == ["sleep"] and t.cancelled()
        with pytest.raises(c.TaskError) as info:
            await t.join()
        assert isinstance(info.value.__cause__, c.Cancelled)
        assert await t.cancel() is None         # already finished: left as it is
        assert t.cancelled()

    run(main)


def test_cancel_of_a_running_task_waits_for_its_next_blocking_trap():
    async def main():
        me = await c.current_task()
        steps = []
        await me.cancel(blocking=False)
        for i in range(3):                      # non-blocking traps: not delivery points
            await c.current_task()
            steps.append(i)
        with pytest.raises(c.Cancelled):
            await c.sleep(1)
        return steps

    assert run(main) == [0, 1, 2]


def test_cancel_before_the_first_step_arrives_at_the_first_blocking_trap():
    async def main():
        progress = []

        async def child():
            progress.append("started")
            await c.sleep(1)
            progress.append("not reached")

        t = await c.spawn(child)
        await t.cancel()
        return progress, t.cancelled()

    assert run(main) == (["started"], True)


@pytest.mark.parametrize("mode, second_sleep", [("edge", "completed"), ("level", "cancelled")])
def test_edge_vs_level_cancellation(mode, second_sleep):
    async def main():
        outcome = []

        async def stubborn():
            try:
                await c.sleep(10)
            except c.Cancelled:
                outcome.append("caught")
            try:
                await c.sleep(0.01)
                outcome.append("completed")
            except c.Cancelled:
                outcome.append("cancelled")

        t = await c.spawn(stubborn)
        await c.sleep(0.01)
        await t.cancel()
        return outcome

    assert run(main, cancel=mode) == ["caught", second_sleep]


def test_exception_types():
    # curio's family: every cancellation, timeouts included, is a BaseException
    for cls in (c.Cancelled, c.TaskTimeout, c.TimeoutCancellationError):
        assert issubclass(cls, c.Cancelled) and not issubclass(cls, Exception)
    assert issubclass(c.TaskError, Exception)
    assert issubclass(c.BusyResourceError, RuntimeError)


@pytest.mark.parametrize("base, swallowed", [("base", False), ("exception", True)])
def test_cancel_base_decides_what_except_exception_catches(base, swallowed):
    async def main():
        seen = []
        async with c.move_on_after(0.02) as scope:
            try:
                await c.sleep(5)
            except Exception as e:          # also what `except OSError` code looks like
                seen.append(type(e).__name__)
            seen.append("block went on")
        return seen, scope.cancelled_caught

    seen, caught = run(main, cancel_base=base)
    if swallowed:
        # the timeout is an Exception too: the body swallows it and ends normally
        assert seen == ["TaskTimeout", "block went on"] and not caught
    else:
        assert seen == [] and caught


def test_cancel_base_exception_flavour_is_still_a_cancellation():
    async def victim():
        await c.sleep(5)

    async def main():
        t = await c.spawn(victim)
        await c.sleep(0.01)
        await t.cancel()
        exc = t.exception()
        return isinstance(exc, c.Cancelled), isinstance(exc, Exception), t.cancelled()

    assert run(main, cancel_base="exception") == (True, True, True)
    assert run(main) == (True, False, True)


# ---------------------------------------------------------------------------
# Timeouts

def test_timeout_after_raises_task_timeout_and_move_on_after_swallows():
    async def main():
        t0 = time.monotonic()
        with pytest.raises(c.TaskTimeout):
            async with c.timeout_after(0.02):
                await c.sleep(5)
        async with c.move_on_after(0.02) as scope:
            await c.sleep(5)
        assert scope.cancelled_caught
        async with c.move_on_after(5) as quiet:
            await c.sleep(0.001)
        assert not quiet.cancelled_caught
        return time.monotonic() - t0

    assert run(main) < 2


def test_nested_inner_timeout_expires_first():
    async def main():
        async with c.timeout_after(5) as outer:
            async with c.move_on_after(0.02) as inner:
                await c.sleep(5)
            await c.sleep(0.001)                 # the outer block still works
        return inner.cancelled_caught, outer.cancelled_caught

    assert run(main) == (True, False)


def test_nested_outer_timeout_expires_first_passes_through_the_inner_block():
    async def main():
        seen = []
        async with c.move_on_after(0.02) as outer:
            try:
                async with c.timeout_after(5):
                    await c.sleep(5)
            except BaseException as e:
                seen.append(type(e).__name__)
                raise
        return seen, outer.cancelled_caught

    # curio: the outer expiry leaves the inner block as TimeoutCancellationError.
    assert run(main) == (["TimeoutCancellationError"], True)


def test_nested_timeouts_raise_what_curio_raises():
    # timeout_after(0.05) around timeout_after(2): TaskTimeout at the await in
    # the inner block, TimeoutCancellationError out of it, TaskTimeout out of
    # the outer block (curio 1.6).
    async def main():
        seen = []
        try:
            async with c.timeout_after(0.05) as outer:
                try:
                    async with c.timeout_after(2):
                        try:
                            await c.sleep(5)
                        except BaseException as e:
                            seen.append(("await", type(e).__name__))
                            raise
                except BaseException as e:
                    seen.append(("inner", type(e).__name__, e.scope is outer))
                    raise
        except BaseException as e:
            seen.append(("outer", type(e).__name__, e.scope is outer))
        return seen

    assert run(main) == [("await", "TaskTimeout"), ("inner", "TimeoutCancellationError", True),
                         ("outer", "TaskTimeout", True)]


def test_outer_timeout_after_converts_to_task_timeout():
    async def main():
        with pytest.raises(c.TaskTimeout):
            async with c.timeout_after(0.02):
                async with c.move_on_after(5) as inner:
                    await c.sleep(5)
        assert not inner.cancelled_caught

    run(main)


@pytest.mark.parametrize("mode, expected", [("edge", ["timeout", "slept"]),
                                            ("level", ["timeout", "timeout-again"])])
def test_timeout_edge_vs_level_inside_the_expired_block(mode, expected):
    async def main():
        seen = []
        async with c.move_on_after(0.02):
            try:
                await c.sleep(5)
            except c.TaskTimeout:
                seen.append("timeout")
            try:
                await c.sleep(0.01)
                seen.append("slept")
            except c.TaskTimeout:
                seen.append("timeout-again")
        await c.sleep(0.001)        # outside the block: no cancellation either way
        return seen

    assert run(main, cancel=mode) == expected


def test_finished_timeout_blocks_do_not_pile_up_in_the_timer_heap():
    # 1000 blocks with a far deadline around operations that finish at once:
    # their timer entries are dead, and the kernel must not keep them (and
    # their scopes) alive until the deadline a minute away.
    def live_scopes():
        gc.collect()
        return sum(isinstance(o, c.CancelScope) for o in gc.get_objects())

    async def main():
        before = live_scopes()
        for _ in range(1000):
            async with c.move_on_after(60):
                await c.sleep(0)
        return live_scopes() - before

    assert run(main) < 200


def test_timeout_rejects_bad_values():
    with pytest.raises(ValueError):
        c.timeout_after(-1)
    with pytest.raises(TypeError):
        c.move_on_after("soon")


# ---------------------------------------------------------------------------
# Task groups

def test_task_group_waits_for_all_children():
    async def child(i, out):
        await c.sleep(0.01 * i)
        out.append(i)

    async def main():
        out = []
        async with c.open_nursery() as g:
            for i in (3, 1, 2):
                g.start_soon(child, i, out)
            t = await g.spawn(child, 0, out)
        return out, t.done()

    assert run(main) == ([0, 1, 2, 3], True)


def test_task_group_error_cancels_siblings_and_body_then_raises_it_as_is():
    boom = KeyError("boom")

    async def main():
        log = []

        async def sibling():
            try:
                await c.sleep(5)
            finally:
                log.append("sibling unwound")

        async def failing():
            await c.sleep(0.01)
            raise boom

        with pytest.raises(KeyError) as info:
            async with c.TaskGroup() as g:
                g.start_soon(sibling)
                g.start_soon(failing)
                try:
                    await c.sleep(5)
                except c.Cancelled:
                    log.append("body cancelled")
                    raise
        assert info.value is boom
        return log

    assert run(main) == ["body cancelled", "sibling unwound"]


def test_task_group_several_errors_make_an_exception_group():
    async def fail(exc):
        await c.sleep(0)
        raise exc

    async def main():
        with pytest.raises(ExceptionGroup) as info:
            async with c.TaskGroup() as g:
                g.start_soon(fail, ValueError("a"))
                g.start_soon(fail, TypeError("b"))
        return sorted(type(e).__name__ for e in info.value.exceptions)

    assert run(main) == ["TypeError", "ValueError"]


def test_task_group_cancel_and_closed_group():
    async def main():
        async with c.TaskGroup() as g:
            t = await g.spawn(c.sleep, 5)
            g.cancel()
        with pytest.raises(RuntimeError, match="not open"):
            g.start_soon(c.sleep, 0)
        return t.cancelled()

    assert run(main) is True


@pytest.mark.parametrize("mode", ["edge", "level"])
def test_cancelling_the_task_that_waits_on_a_group_cancels_its_children(mode):
    async def main():
        log = []

        async def child():
            try:
                await c.sleep(5)
            finally:
                log.append("child unwound")

        async def parent():
            try:
                async with c.TaskGroup() as g:
                    g.start_soon(child)
                    g.start_soon(child)
            finally:
                log.append("group exited")

        t = await c.spawn(parent)
        await c.sleep(0.01)
        await t.cancel()
        return log, t.cancelled()

    assert run(main, cancel=mode) == (["child unwound", "child unwound", "group exited"], True)


def test_timeout_around_a_task_group_cancels_it():
    async def main():
        async with c.move_on_after(0.02) as scope:
            async with c.TaskGroup() as g:
                g.start_soon(c.sleep, 5)
                await c.sleep(5)
        return scope.cancelled_caught

    assert run(main) is True


# ---------------------------------------------------------------------------
# Event and Queue

def test_event_wakes_every_waiter_and_clear_resets():
    async def main():
        ev = c.Event()
        woke = []

        async def waiter(i):
            await ev.wait()
            woke.append(i)

        for i in range(3):
            await c.spawn(waiter, i)
        await c.sleep(0.01)
        assert woke == [] and not ev.is_set()
        ev.set()
        await c.sleep(0)
        await c.sleep(0)
        assert sorted(woke) == [0, 1, 2]
        ev.clear()
        async with c.move_on_after(0.02) as scope:
            await ev.wait()
        return scope.cancelled_caught

    assert run(main) is True


def test_queue_is_fifo_and_a_bounded_put_blocks_until_a_get():
    async def main():
        q = c.Queue(maxsize=2)
        await q.put(1)
        await q.put(2)
        assert q.full() and q.qsize() == 2
        async with c.move_on_after(0.02) as blocked:
            await q.put(3)
        assert blocked.cancelled_caught and q.qsize() == 2   # the blocked put added nothing

        async def putter():
            await q.put(3)
            return "put"

        t = await c.spawn(putter)
        await c.sleep(0.01)
        assert not t.done()
        assert await q.get() == 1
        assert await t.join() == "put"
        assert [await q.get(), await q.get()] == [2, 3]
        assert q.empty()
        async with c.move_on_after(0.02) as empty_get:
            await q.get()
        return empty_get.cancelled_caught

    assert run(main) is True


def test_queue_rejects_bad_maxsize():
    with pytest.raises(ValueError):
        c.Queue(-1)
    with pytest.raises(TypeError):
        c.Queue(2.5)


def test_queue_getters_are_served_in_order():
    async def main():
        q = c.Queue()
        got = []

        async def getter(i):
            got.append((i, await q.get()))

        for i in range(3):
            await c.spawn(getter, i)
        await c.sleep(0.01)
        for item in "xyz":
            await q.put(item)
        await c.sleep(0.01)
        return got

    assert run(main) == [(0, "x"), (1, "y"), (2, "z")]


# ---------------------------------------------------------------------------
# Sockets: echo, EOF, no user buffer, misuse, resets

async def echo_handler(stream):
    async with stream:
        while True:
            data = await stream.receive_some(65536)
            if not data:
                return
            await stream.send_all(data)


async def echo_client(port, seed, size):
    data = pattern(seed, size)
    async with await c.open_tcp_stream("127.0.0.1", port) as stream:
        async def send():
            await stream.send_all(data)
            await stream.send_eof()

        async with c.TaskGroup() as g:
            g.start_soon(send)
            got = await read_all(stream, limit_s=60)
    return got == data, len(got)


@pytest.mark.parametrize("clients", [1, 100])
def test_loopback_echo_is_byte_exact(clients):
    async def main():
        async with c.listen(("127.0.0.1", 0), backlog=clients) as listener:
            port = listener.address[1]

            async def serve():
                async with c.TaskGroup() as g:
                    for _ in range(clients):
                        g.start_soon(echo_handler, await listener.accept())

            async with c.timeout_after(100):
                async with c.TaskGroup() as g:
                    g.start_soon(serve)
                    results = [await g.spawn(echo_client, port, seed, MiB)
                               for seed in range(clients)]
        return [t.result() for t in results]

    with c.Kernel() as k:
        results = k.run(main)
        stats = k.probe.connections
    assert results == [(True, MiB)] * clients
    assert len(stats) == 2 * clients
    assert sum(s.received_bytes for s in stats) == 2 * clients * MiB
    assert all(s.accepted_bytes == s.sent_bytes == MiB for s in stats)
    assert all(s.peak_user_buffer_bytes == 0 and s.closed for s in stats)


def test_eof_and_send_eof_half_close():
    async def main():
        client, server = await tcp_pair()
        async with client, server:
            await client.send_all(b"question")
            await client.send_eof()
            await client.send_eof()                      # idempotent
            assert await read_all(server) == b"question"   # EOF seen by the peer
            await server.send_all(b"answer")             # ...which can still reply
            await server.aclose()
            assert await read_all(client) == b"answer"
            with pytest.raises(c.ClosedResourceError):
                await client.send_all(b"more")
            assert await client.receive_some() == b""    # EOF stays EOF

    run(main)


def test_sendall_to_a_non_reading_peer_blocks_and_cancellation_reports_bytes_sent():
    payload = pattern(1, 8 * MiB)

    async def main():
        client, server = await tcp_pair(sockbuf=65536)
        async with server:
            async with client:
                sent = None
                try:
                    async with c.timeout_after(0.2):
                        await client.send_all(payload)
                except c.TaskTimeout as e:
                    sent = e.bytes_sent
                stats = client.stats
                assert sent is not None and 0 < sent < len(payload)
                assert stats.accepted_bytes == stats.sent_bytes == sent
                assert stats.peak_user_buffer_bytes == 0
            got = await read_all(server)           # the peer gets exactly what was sent
        return sent, got

    sent, got = run(main)
    assert got == payload[:sent]


def test_task_cancel_of_sendall_reports_bytes_sent_on_cancelled():
    payload = bytes(4 * MiB)

    async def main():
        client, server = await tcp_pair(sockbuf=65536)
        async with client, server:
            box = {}

            async def writer():
                try:
                    await client.send_all(payload)
                except c.Cancelled as e:
                    box["sent"] = e.bytes_sent
                    raise

            t = await c.spawn(writer)
            await c.sleep(0.05)
            assert not t.done()                    # blocked: nothing buffered in user space
            await t.cancel()
            await client.aclose()
            got = await read_all(server)
        return box["sent"], len(got)

    sent, received = run(main)
    assert 0 < sent == received < 4 * MiB


def test_concurrent_send_all_and_receive_some_are_busy_resource_errors():
    async def main():
        client, server = await tcp_pair(sockbuf=65536)
        async with client, server:
            async with c.TaskGroup() as g:
                g.start_soon(client.send_all, bytes(4 * MiB))
                g.start_soon(client.receive_some)
                await c.sleep(0.02)
                with pytest.raises(c.BusyResourceError):
                    await client.send_all(b"x")
                with pytest.raises(c.BusyResourceError):
                    await client.send_eof()
                with pytest.raises(c.BusyResourceError):
                    await client.receive_some()
                g.cancel()

    run(main)


def test_closing_a_stream_wakes_a_blocked_receiver_with_closed_resource_error():
    async def main():
        client, server = await tcp_pair()
        async with server:
            async def receiver():
                with pytest.raises(c.ClosedResourceError):
                    await client.receive_some()
                return "woken"

            t = await c.spawn(receiver)
            await c.sleep(0.01)
            await client.aclose()
            assert client.stats.closed
            async with c.timeout_after(2):
                result = await t.join()
            with pytest.raises(c.ClosedResourceError):
                await client.receive_some()
        return result

    assert run(main) == "woken"


def reset(stream):
    """Make the peer's close send RST (SO_LINGER 0), as a crashing peer would."""
    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def test_peer_reset_mid_stream_raises_at_the_receive_call():
    async def main():
        client, server = await tcp_pair()
        async with client:
            await server.send_all(b"partial")
            reset(server)
            await server.aclose()
            got = b""
            with pytest.raises(ConnectionResetError):
                async with c.timeout_after(2):
                    while True:
                        data = await client.receive_some()
                        assert data, "a reset must not look like a clean EOF"
                        got += data
            return got

    assert b"partial".startswith(run(main))


def test_peer_reset_mid_stream_raises_at_the_send_call_with_bytes_sent():
    async def main():
        client, server = await tcp_pair(sockbuf=65536)
        async with client:
            async def closer():
                await c.sleep(0.05)
                reset(server)
                await server.aclose()

            await c.spawn(closer)
            with pytest.raises((ConnectionResetError, BrokenPipeError)) as info:
                async with c.timeout_after(5):
                    await client.send_all(bytes(8 * MiB))
            return info.value.bytes_sent

    assert 0 < run(main) < 8 * MiB


def test_fd_closed_behind_the_kernels_back_is_detected_when_its_number_is_reused():
    async def main():
        a, a_peer = socket.socketpair()
        a.setblocking(False)

        async def waiter():
            with pytest.raises(c.ClosedResourceError, match="reused"):
                await c.read_wait(a)
            return "woken"

        t = await c.spawn(waiter)
        await c.sleep(0.01)
        fd = a.fileno()
        a.close()                            # no io_release: epoll silently forgets it
        b, b_peer = socket.socketpair()
        if b.fileno() != fd:
            b, b_peer = b_peer, b
        assert b.fileno() == fd
        async with c.Socket(b) as sb:
            async def later():
                await c.sleep(0.02)
                b_peer.send(b"hi")

            await c.spawn(later)
            async with c.timeout_after(2):
                assert await sb.recv(10) == b"hi"    # registering fd again works...
                result = await t.join()               # ...and the old waiter is told
        b_peer.close()
        a_peer.close()
        return result

    assert run(main) == "woken"


class _Turns:
    """A task that counts the turns it gets while the test's own task runs."""

    def __init__(self):
        self.count = 0
        self.running = True
        self.task = None

    @classmethod
    async def start(cls):
        turns = cls()
        turns.task = await c.spawn(turns._loop)
        return turns

    async def _loop(self):
        while self.running:
            self.count += 1
            await c.sleep(0)

    async def stop(self):
        self.running = False
        await self.task.join()


def test_a_read_after_the_socket_was_drained_takes_data_that_arrived_since_without_yielding():
    # After a short read the next one asks poll() first instead of paying for an
    # EAGAIN; it must still take data (or EOF) that is already there at once,
    # without a trap, exactly as a recv that doesn't block would.
    async def main():
        client, server = await tcp_pair()
        async with client, server:
            other = await _Turns.start()
            got = []
            async with c.timeout_after(5):
                await client.send_all(b"ab")
                got.append(await server.receive_some(100))     # short read: drained
                await client.send_all(b"cd")
                assert select.select([server.socket._sock], [], [], 5)[0]   # it has arrived
                other.count = 0
                got.append(await server.receive_some(100))     # data there: no yield
                await client.socket.sendall(b"ef")
                assert select.select([server.socket._sock], [], [], 5)[0]
                got.append(await server.socket.recv(100))      # the Socket-level path too
                await client.send_eof()
                assert select.select([server.socket._sock], [], [], 5)[0]
                got.append(await server.receive_some(100))     # EOF there: no yield
                quiet_turns = other.count
            await other.stop()
            return got, quiet_turns

    got, quiet_turns = run(main)
    assert got == [b"ab", b"cd", b"ef", b""]
    assert quiet_turns == 0


def test_read_ready_waits_for_the_poller_after_a_short_read_without_polling(monkeypatch):
    # read="ready" (asyncio's and uvloop's rule): after a short read the next one
    # waits for the loop's poller instead of asking poll() first. Data that is
    # already there is still taken, whole and in order, but only after a yield;
    # a full read does not yield; and no per-socket poll is ever made.
    def no_poll(sock):
        raise AssertionError("read=ready made a poll() check")
    monkeypatch.setattr(RealIO, "read_check", staticmethod(no_poll))

    async def main():
        client, server = await tcp_pair()
        async with client, server:
            other = await _Turns.start()
            got, yielded = [], []
            async with c.timeout_after(5):
                await client.send_all(b"ab")
                got.append(await server.receive_some(100))     # short read: drained
                for data in (b"cd", b"ef"):
                    await client.send_all(data)
                    assert select.select([server.socket._sock], [], [], 5)[0]
                    other.count = 0
                    got.append(await server.receive_some(100))  # there, but waits a pass
                    yielded.append(other.count)
                await client.send_all(b"x" * 300)
                assert select.select([server.socket._sock], [], [], 5)[0]
                got.append(await server.receive_some(100))     # after a short one: waits
                other.count = 0
                got.append(await server.receive_some(100))     # after a full read: at once
                yielded.append(other.count)
            await other.stop()
            return got, yielded

    got, yielded = run(main, read="ready")
    assert got[:3] == [b"ab", b"cd", b"ef"]
    assert got[3] + got[4] == b"x" * 200 and len(got[3]) == 100
    assert yielded[0] >= 1 and yielded[1] >= 1 and yielded[2] == 0


def test_the_poll_before_a_drained_read_stops_when_it_keeps_finding_data():
    # Two polls in a row that find data mean the next read may as well try recv at
    # once (under load the next request is usually there); a recv that then finds
    # the socket empty (EAGAIN) turns the poll back on. Either way nothing is taken
    # early or late.
    async def main():
        client, server = await tcp_pair()
        async with client, server:
            sock = server.socket
            polls = []

            def counting_check(timeout):
                polls.append(timeout)
                return real_check(timeout)

            real_check = sock._poller()
            sock._readable = counting_check

            async def arrive(data):
                await client.send_all(data)
                assert select.select([sock._sock], [], [], 5)[0]

            async def later(data):
                await c.sleep(0.02)
                await client.send_all(data)

            got, counts = [], []
            async with c.timeout_after(5):
                await arrive(b"ab")
                got.append(await server.receive_some(100))   # short read: drained
                for data in (b"cd", b"ef", b"gh"):           # polls, polls, then no poll
                    await arrive(data)
                    got.append(await server.receive_some(100))
                    counts.append(len(polls))
                t = await c.spawn(later, b"ij")
                got.append(await server.receive_some(100))   # recv: EAGAIN, then waits
                await t.join()
                counts.append(len(polls))
                await arrive(b"kl")
                got.append(await sock.recv(100))             # polls again (Socket path)
                counts.append(len(polls))
            return got, counts

    got, counts = run(main)
    assert got == [b"ab", b"cd", b"ef", b"gh", b"ij", b"kl"]
    assert counts == [1, 2, 2, 2, 3]


def test_a_drained_read_that_finds_data_every_other_time_keeps_polling():
    # The last connection of a lock-step round: its next request is there once
    # (a poll finds it), then not (a poll finds nothing). One EAGAIN costs more
    # than a poll, so the alternation never turns polling off.
    async def main():
        client, server = await tcp_pair()
        async with client, server:
            sock = server.socket
            polls, eagain = [], []
            real_check = sock._poller()
            real_recv = sock._recv

            def counting_check(timeout):
                found = real_check(timeout)
                polls.append(bool(found))
                return found

            def counting_recv(n, *flags):
                try:
                    return real_recv(n, *flags)
                except BlockingIOError:
                    eagain.append(n)
                    raise

            sock._readable = counting_check
            sock._recv = counting_recv

            async def later(data):
                await c.sleep(0.01)
                await client.send_all(data)

            async with c.timeout_after(5):
                await client.send_all(b"0")
                assert await server.receive_some(100) == b"0"
                for i in range(1, 7):
                    data = str(i).encode()
                    if i % 2:
                        await client.send_all(data)
                        assert select.select([sock._sock], [], [], 5)[0]
                    else:
                        t = await c.spawn(later, data)
                    assert await server.receive_some(100) == data
                    if not i % 2:
                        await t.join()
            return polls, eagain

    polls, eagain = run(main)
    assert polls == [True, False] * 3 and eagain == []


def test_a_drained_read_waits_for_data_that_comes_later():
    async def main():
        client, server = await tcp_pair()
        async with client, server:
            async def later():
                await c.sleep(0.02)
                await client.send_all(b"late")

            await client.send_all(b"now")
            async with c.timeout_after(5):
                assert await server.receive_some(100) == b"now"    # drained
                await c.spawn(later)
                assert await server.receive_some(100) == b"late"   # poll says empty: waits

    run(main)


def test_kernel_on_the_selectors_fallback_poller(monkeypatch):
    # Where epoll is missing the loop polls through selectors instead; same
    # behaviour: I/O waits, timers, a socket closed under a waiting task.
    class SelectorsIO(RealIO):
        poller = staticmethod(SelectorsPoller)

    async def main():
        client, server = await tcp_pair(sockbuf=64 * 1024)
        data = pattern(5, 1 * MiB)

        async def echo():
            while chunk := await server.receive_some():
                await server.send_all(chunk)
            await server.send_eof()

        async def send():
            await client.send_all(data)
            await client.send_eof()

        async with client, server:
            async with c.timeout_after(10):
                async with c.TaskGroup() as g:
                    g.start_soon(echo)
                    g.start_soon(send)
                    echoed = await read_all(client)
        async with c.move_on_after(0.01) as scope:
            await c.sleep(1)

        a, b = socket.socketpair()
        sa = c.Socket(a)

        async def reader():
            with pytest.raises(c.ClosedResourceError):
                await sa.recv(10)
            return "woken"

        t = await c.spawn(reader)
        await c.sleep(0.01)
        await sa.close()
        b.close()
        return echoed == data, scope.cancelled_caught, await t.join()

    with c.Kernel(io=SelectorsIO()) as k:
        assert isinstance(k._rt.poller, SelectorsPoller)
        assert k.run(main) == (True, True, "woken")


def test_socket_wrapper_basics():
    async def main():
        a, b = socket.socketpair()
        async with c.Socket(a) as sa, c.Socket(b) as sb:
            assert sa.fileno() == a.fileno()
            await sa.sendall(b"ping")
            buf = bytearray(16)
            n = await sb.recv_into(buf)
            assert bytes(buf[:n]) == b"ping"
            assert await sb.send(b"pong") == 4
            assert await sa.recv(16) == b"pong"
            await sa.shutdown(socket.SHUT_WR)
            assert await sb.recv(16) == b""
        with pytest.raises(c.ClosedResourceError):
            await sa.recv(1)
        assert a.fileno() == -1        # closed when close() returned

    run(main)
    with pytest.raises(TypeError):
        c.Socket("not a socket")


def test_socket_wrapper_forwards_the_stdlib_sockets_other_attributes():
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s = c.Socket(raw)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        assert raw.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR)
        s.bind(("127.0.0.1", 0))
        assert s.getsockname() == raw.getsockname()
        assert (s.family, s.type, s.timeout) == (socket.AF_INET, socket.SOCK_STREAM, 0.0)
        for missing in ("_recv_later", "no_such_call"):
            with pytest.raises(AttributeError):
                getattr(s, missing)
    finally:
        raw.close()


def test_stream_and_listener_reject_bad_input():
    async def main():
        client, server = await tcp_pair()
        async with client, server:
            with pytest.raises(ValueError):
                await client.receive_some(0)
        with pytest.raises(ValueError):
            await c.open_tcp_stream("127.0.0.1", 70000)
        with pytest.raises(TypeError):
            await c.open_tcp_stream(None, 80)
        with pytest.raises(TypeError):
            c.listen("127.0.0.1:80")
        with pytest.raises(ValueError):
            c.listen(("127.0.0.1", 0), sockbuf=-5)

    run(main)


def test_connect_refused_is_an_os_error_and_leaks_nothing():
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()

    async def main():
        with pytest.raises(ConnectionRefusedError):
            await c.open_tcp_stream("127.0.0.1", port)

    run(main)


def test_listen_is_awaitable_and_accepts_existing_sockets():
    async def main():
        raw = socket.socket()
        raw.bind(("127.0.0.1", 0))
        listener = await c.listen(raw)
        async with listener:
            client = await c.open_tcp_stream("127.0.0.1", listener.address[1])
            server = await listener.accept()
            async with client, server:
                await client.send_all(b"hi")
                assert await server.receive_some() == b"hi"

    run(main)


# ---------------------------------------------------------------------------
# Fingerprint: io_schedule_point

def test_a_thread_without_a_kernel_is_never_a_checkpoint_while_another_has_them_on():
    # sockets ask checkpoint_here() only while some kernel in the process has
    # io_schedule_point on; a thread without a kernel must get False, not an error.
    import threading
    seen = {}

    async def main():
        seen["kernel"] = kernel_module.checkpoint_here()
        t = threading.Thread(target=lambda: seen.update(other=kernel_module.checkpoint_here()))
        t.start()
        t.join()

    run(main, io_schedule_point=True)
    assert seen == {"kernel": True, "other": False}
    assert kernel_module.checkpoint_here() is False and kernel_module._checkpointing == 0


@pytest.mark.parametrize("flag, expect_turns", [(False, 0), (True, 1999)])
def test_io_schedule_point_decides_whether_non_blocking_socket_calls_yield(flag, expect_turns):
    async def main():
        # TCP, not a socketpair: AF_UNIX charges a whole buffer unit per 1-byte
        # send and would block after a few hundred.
        client, server = await tcp_pair()
        async with client, server:
            turns = 0
            running = True

            async def other():
                nonlocal turns
                while running:
                    turns += 1
                    await c.sleep(0)

            t = await c.spawn(other)
            await c.sleep(0)
            turns = 0
            async with c.timeout_after(10):
                for _ in range(2000):
                    await client.socket.sendall(b"x")     # never blocks
            send_turns = turns
            async with c.timeout_after(10):
                await c.sleep(0.05)                        # let all 2000 bytes arrive
                turns = 0
                for _ in range(2000):
                    assert await server.socket.recv(1) == b"x"   # data waiting: never blocks
            recv_turns = turns
            running = False
            await t.join()
        return send_turns, recv_turns

    for turns in run(main, io_schedule_point=flag):
        if flag:
            assert turns >= expect_turns
        else:
            assert turns == 0


# ---------------------------------------------------------------------------
# Exit policies

async def main_leaving_work(log):
    async def worker():
        try:
            await c.sleep(0.05)
            log.append("worker finished")
        except c.Cancelled:
            log.append("worker cancelled")
            raise

    async def daemon():
        try:
            await c.sleep(10)
        except c.Cancelled:
            log.append("daemon cancelled")
            raise

    await c.spawn(worker)
    await c.spawn(daemon, daemon=True)
    await c.sleep(0)
    return "main done"


@pytest.mark.parametrize("policy, outcome, worker", [
    ("cancel", "main done", "worker cancelled"),
    ("wait", "main done", "worker finished"),
    ("raise", RuntimeError, "worker cancelled"),
])
def test_exit_policies(policy, outcome, worker, capfd):
    log = []
    with c.Kernel(exit=policy) as k:
        if outcome is RuntimeError:
            with pytest.raises(RuntimeError, match="1 task"):
                k.run(main_leaving_work, log)
        else:
            assert k.run(main_leaving_work, log) == outcome
        report = k.probe.exit_report
    assert sorted(log) == sorted([worker, "daemon cancelled"])
    assert report == {"policy": policy, "tasks_left_count": 1, "daemon_tasks_left_count": 1,
                      "unsent_bytes": 0}
    assert capfd.readouterr().err == ""         # cancellation at exit is silent


def test_exit_teardown_is_level_triggered_so_a_stubborn_task_still_ends():
    async def stubborn(log):
        for _ in range(3):
            try:
                await c.sleep(10)
            except c.Cancelled:
                log.append("swallowed")
        log.append("gave up")

    async def main(log):
        await c.spawn(stubborn, log)
        await c.sleep(0)

    log = []
    run(main, log)            # edge mode: teardown still re-delivers
    assert log == ["swallowed"] * 3 + ["gave up"]


# ---------------------------------------------------------------------------
# Ctrl-C

def test_keyboard_interrupt_in_a_task_cancels_everything_and_reraises():
    log = []

    async def holder():
        client, server = await tcp_pair()
        async with client, server:
            try:
                await c.sleep(10)
            except c.Cancelled:
                log.append("holder unwound")
                raise

    async def main():
        await c.spawn(holder)
        await c.sleep(0.02)
        raise KeyboardInterrupt

    with c.Kernel() as k:
        with pytest.raises(KeyboardInterrupt):
            k.run(main)
        assert log == ["holder unwound"]
        assert k.probe.exit_report["interrupted"] == "KeyboardInterrupt"

        async def again():
            return "usable"

        assert k.run(again) == "usable"


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                    reason="signals are delivered to the main thread")
def test_sigint_while_blocked_in_select_ends_run_cleanly():
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("someone else handles SIGINT here")
    log = []

    async def main():
        async def sleeper():
            try:
                await c.sleep(10)
            finally:
                log.append("sleeper unwound")

        await c.spawn(sleeper)
        try:
            await c.sleep(10)
        finally:
            log.append("main unwound")

    timer = threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            run(main)
    finally:
        timer.cancel()
        timer.join()
    assert time.monotonic() - t0 < 5
    assert sorted(log) == ["main unwound", "sleeper unwound"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


# ---------------------------------------------------------------------------
# Probe and trace

def test_probe_counts_spawns_switches_and_cancellations():
    async def main():
        t = await c.spawn(c.sleep, 10)
        await c.sleep(0)
        await t.cancel()
        for _ in range(10):
            await c.sleep(0)

    with c.Kernel() as k:
        k.run(main)
        p = k.probe
    assert p.spawns == 2                   # main + one child
    assert p.cancellations == 1
    assert p.task_switches >= 14
    assert p.loop_iterations >= 10
    assert p.ready_max >= 1


@pytest.mark.parametrize("spawn, switches, iterations", [("lazy", 2, 1), ("eager", 2, 1)])
def test_probe_counts_are_exact_for_one_spawn_and_join(spawn, switches, iterations):
    # The loop keeps these counters in locals and writes them back when it
    # returns; each send/throw is one switch. lazy: main runs to its join
    # (spawn calls the kernel directly, it yields nothing); the child is the
    # only task ready, so the join steps it in place (1) and main carries on
    # without yielding: two switches in one pass, where the loop would have
    # taken three passes. eager: the child's first step runs inside main's
    # spawn call (1 each) and is done before the join, which then doesn't
    # block.
    async def child():
        return 7

    async def main():
        t = await c.spawn(child)
        return await t.join()

    with c.Kernel(spawn=spawn) as k:
        assert k.run(main) == 7
        assert (k.probe.task_switches, k.probe.spawns, k.probe.loop_iterations) == (
            switches, 2, iterations)
        assert k.run(main) == 7                       # and they accumulate over runs
        assert k.probe.task_switches == 2 * switches and k.probe.spawns == 4


def test_trace_has_task_tracks_step_slices_io_waits_and_flows():
    async def main():
        client, server = await tcp_pair()
        async with client, server:
            async def reader():
                return await server.receive_some()

            t = await c.spawn(reader)
            await c.sleep(0.01)
            await client.send_all(b"x")
            assert await t.join() == b"x"

    with c.Kernel(trace=True) as k:
        k.run(main)
        doc = k.probe.trace.to_chrome()
    events = doc["traceEvents"]
    names = {e["args"]["name"] for e in events if e["ph"] == "M"}
    assert any(n.endswith("reader") for n in names) and any(n.endswith("main") for n in names)
    begins = [e for e in events if e["ph"] == "B"]
    ends = [e for e in events if e["ph"] == "E"]
    assert begins and len(begins) == len(ends) and all(e["name"] == "step" for e in begins)
    waits = [e for e in events if e.get("name") == "io_wait"]
    assert any(w["args"]["direction"] == "read" and w["args"]["fd"] >= 0 for w in waits)
    starts = {e["id"] for e in events if e["ph"] == "s"}
    finishes = {e["id"] for e in events if e["ph"] == "f"}
    assert finishes and finishes <= starts


def test_trace_off_records_nothing():
    with c.Kernel() as k:
        k.run(c.sleep, 0)
        assert k.probe.trace is None


def test_kernel_module_exposes_the_running_kernel_only_while_running():
    seen = []

    async def main():
        seen.append(kernel_module.running_kernel())

    with c.Kernel() as k:
        k.run(main)
        assert seen == [k] and kernel_module.running_kernel() is None


def test_spawn_and_join_from_a_thread_without_a_kernel_are_refused():
    # spawn and join find the kernel through context variables, which each
    # thread has its own of: a coroutine driven in another thread while a
    # kernel runs here must not reach this thread's kernel.
    import threading

    async def child():
        pass

    def drive(coro):
        try:
            coro.send(None)
        except BaseException as e:     # noqa: BLE001 -- the outcome under test
            return e
        return None

    outcome = {}

    async def main():
        task = await c.spawn(child)

        async def foreign_spawn():
            await c.spawn(child)

        async def foreign_join():
            await task.join()

        def other():
            outcome["spawn"] = drive(foreign_spawn())
            outcome["join"] = drive(foreign_join())
        t = threading.Thread(target=other)
        t.start()
        t.join()
        await task.join()

    c.run(main)
    for what in ("spawn", "join"):
        assert isinstance(outcome[what], RuntimeError), (what, outcome[what])
        assert "needs a running coro kernel in this thread" in str(outcome[what])


def test_receive_some_that_must_wait_outside_a_kernel_is_refused():
    # receive_some yields its socket's read trap itself (no read_wait frame
    # under it): outside any kernel it must still refuse to, as read_wait does.
    a, b = socket.socketpair()
    try:
        stream = c.SocketStream(c.Socket(a))
        waiting = stream.receive_some()
        with pytest.raises(RuntimeError, match=r"read_wait\(\) needs a running coro kernel"):
            waiting.send(None)
        b.send(b"x")
        again = stream.receive_some()       # not left busy by the refused call
        with pytest.raises(StopIteration) as got:
            again.send(None)
        assert got.value.value == b"x"
    finally:
        a.close()
        b.close()


def test_a_child_that_blocks_in_a_handed_off_join_keeps_its_name_and_result(capsys):
    # The hand-off runs the child's first step inside engine.in_place_first; a
    # child that blocks there is stepped through it from then on, and must
    # still be itself: its name, its return value, its crash report.
    names = {}

    async def sleeper(value):
        await c.sleep(0.001)
        return value

    async def crasher():
        await c.sleep(0.001)
        raise ValueError("boom")

    async def main():
        t = await c.spawn(sleeper, 42)
        assert t.name.endswith("sleeper")
        got = await t.join()
        names["sleeper"] = t.name
        u = await c.spawn(crasher)
        with pytest.raises(c.TaskError) as err:
            await u.join()
        names["crasher"] = u.name
        return got, type(err.value.__cause__)

    with c.Kernel() as k:
        assert k.run(main) == (42, ValueError)
    assert names["sleeper"].endswith("sleeper") and names["crasher"].endswith("crasher")
    assert "crasher" in capsys.readouterr().err


def test_kernel_takes_its_poller_waker_clock_and_sockets_from_the_io_seam():
    from kernels.io import SocketWaker
    made = []

    class Recording(RealIO):
        time = staticmethod(lambda: time.monotonic() + 1000.0)

        def poller(self):
            made.append("poller")
            return SelectorsPoller()

        def waker(self):
            made.append("waker")
            return SocketWaker()

        def socket(self, family, type_, proto=0):
            made.append("socket")
            return socket.socket(family, type_, proto)

        def read_check(self, sock):
            made.append("read_check")
            return RealIO.read_check(sock)

    async def main():
        listener = c.listen(("127.0.0.1", 0))
        port = listener.socket.getsockname()[1]

        async def serve():
            conn = await listener.accept()
            while data := await conn.receive_some(1024):
                await conn.send_all(data)
            await conn.aclose()

        server = await c.spawn(serve)
        stream = await c.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"ping")
        got = await stream.receive_some(1024)
        await stream.aclose()
        await server.join()
        await listener.aclose()
        async with c.move_on_after(0.01) as scope:      # deadlines on io's clock
            await c.sleep(1)
        return got, scope.cancelled_caught

    with c.Kernel(io=Recording()) as k:
        assert made == ["poller", "waker"]
        assert k.run(main) == (b"ping", True)
    assert made.count("socket") == 2 and "read_check" in made


@pytest.mark.timeout(30)
@pytest.mark.parametrize("deadline_check, raised", [("when-blocked", False), ("at-checkpoint", True)])
def test_deadline_check_option_trio_1626(deadline_check, raised):
    """A checkpoint inside an expired block: curio lets it through (the deadline is
    delivered only when the task blocks); at-checkpoint raises there, as trio does."""
    async def main():
        got = []
        for _ in range(3):
            try:
                async with c.timeout_after(0):
                    await c.checkpoint()
                got.append("passed")
            except c.TaskTimeout:
                got.append("timed out")
        async with c.move_on_after(0.02) as later:     # a deadline still ahead: both wait
            await c.checkpoint()
            await c.sleep(5)
        return got, later.cancelled_caught
    got, later = c.run(main, deadline_check=deadline_check)
    assert got == ["timed out" if raised else "passed"] * 3 and later is True


def _handoff_program(seed, log):
    """A random tree of tasks that spawn, join, yield, cancel, raise and use an
    Event, logging each step: the join hand-off must not change a line."""
    rng = random.Random(seed)

    async def node(name, depth, parent_task):
        ev = c.Event()
        for i in range(rng.randint(1, 4)):
            op = "spawn_join" if depth == i == 0 else rng.choice((
                "spawn_join", "spawn_join", "spawn_nojoin", "yield", "cancel_parent", "raise",
                "event", "timeout_join", "return"))
            log.append((name, i, op))
            if op.startswith("spawn") and depth < 3:
                me = await c.current_task()
                t = await c.spawn(node, f"{name}.{i}", depth + 1, me, daemon=op == "spawn_nojoin")
                if op == "spawn_join":
                    try:
                        log.append((name, "joined", await t.join()))
                    except c.TaskError as e:
                        log.append((name, "join-error", type(e.__cause__).__name__))
            elif op == "yield":
                await c.sleep(0)
            elif op == "cancel_parent" and parent_task is not None:
                await parent_task.cancel(blocking=False)
            elif op == "raise":
                raise ValueError(name)
            elif op == "event":
                waiter = await c.spawn(ev.wait)
                await ev.set()
                await waiter.join()
            elif op == "timeout_join" and depth < 3:
                t = await c.spawn(node, f"{name}.t{i}", depth + 1, None)
                async with c.move_on_after(5):
                    await t.join()
            elif op == "return":
                return name
        return name

    async def main():
        try:
            return await node("m", 0, None)
        except BaseException as e:          # Cancelled or the ValueError: logged, not raised
            log.append(("main", "ended", type(e).__name__))

    return main


@pytest.mark.parametrize("seed", range(40))
def test_join_hand_off_is_invisible(seed, capsys):
    # A kernel's join runs a joined child in place when nothing else could run
    # first. trace=True turns the hand-off off, so the same program run both
    # ways must log the same lines in the same order and end the same way.
    logs, passes = [], []
    for trace in (False, True):
        log = []
        with c.Kernel(trace=trace, exit="cancel") as k:
            log.append(("result", k.run(_handoff_program(seed, log))))
            passes.append(k.probe.loop_iterations)
        logs.append(log)
    assert logs[0] == logs[1]
    assert passes[0] < passes[1]        # the hand-off did happen (it saves passes)


def test_spawn_sets_the_slots_task_says_it_sets():
    # Task has no __init__: spawn_task sets its slots, and Task.AT_SPAWN /
    # Task.LATER say which (a slot left unset raises AttributeError on read).
    from kernels.coro.task import Task

    async def child():
        pass

    async def main():
        t = await c.spawn(child, daemon=1)
        assert [n for n in Task.AT_SPAWN if not hasattr(t, n)] == []
        assert [n for n in Task.LATER if hasattr(t, n)] == []
        assert (t.daemon, t._value, t._exc, t._wait, t._pending, t._cancel, t._scopes,
                t._done, t._joiners, t._callbacks) == (True, None, None, 0, False, 0, None,
                                                       False, None, None)
        await t.join()
        assert t._done and t._result is None and t._exception is None

    c.run(main)


def test_a_kernels_tasks_are_tasks_whose_join_is_the_kernels():
    # Each kernel makes its tasks from its own Task subclass, whose join runs
    # the hand-off over the scheduler's cells; they are still Tasks, slotted,
    # and the general Task.join (the join trap, never a hand-off) agrees.
    async def child(x):
        return x * 2

    async def main():
        t = await c.spawn(child, 21)
        u = await c.spawn(child, 5)
        assert isinstance(t, c.Task) and type(t) is not c.Task
        assert not hasattr(t, "__dict__")
        return await t.join(), await c.Task.join(u)

    with c.Kernel() as k1, c.Kernel() as k2:
        assert k1.run(main) == (42, 10)
        assert k2.run(main) == (42, 10)
        assert k1._rt.task_class is not k2._rt.task_class


def test_a_join_does_not_hand_off_to_a_child_of_the_running_batch():
    # main wakes the parent and spawns the child in one step, so the next
    # batch is [parent, child]: when the parent joins, the child is still due
    # in that batch and the loop must step it there, not the join.
    log = []

    async def main():
        ev = c.Event()
        box = {}

        async def child():
            log.append("child")

        async def parent():
            await ev.wait()
            log.append("parent joins")
            await box["child"].join()
            log.append("parent joined")

        p = await c.spawn(parent)
        await c.sleep(0)                     # the parent waits on ev
        ev.set()
        box["child"] = await c.spawn(child)
        await c.sleep(0.05)                  # nobody else ready when the parent ends
        await p.join()

    with c.Kernel() as k:
        k.run(main)
    assert log == ["parent joins", "child", "parent joined"]
