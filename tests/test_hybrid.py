"""Behaviour of the hybrid kernel (kernels/hybrid): Futures and Tasks on the
callback loop, asyncio-style streams on its transports, and the Runner's
options (spawn, drain, exit).

Every test runs its coroutine under ``_run``, which bounds it with
``wait_for``; peers are blocking sockets (in threads when they must read
concurrently) on 127.0.0.1 with 64 KiB socket buffers where flow control matters.
"""
from __future__ import annotations

import gc
import socket
import struct
import threading
import time

import pytest

import kernels.hybrid as h
from kernels.options import OptionError
from kernels.callback import get_running_loop

SOCKBUF = 65536
MiB = 1 << 20


def _run(coro_fn, *args, bound=20.0, **options):
    """Run ``coro_fn(*args)`` under a fresh Runner, bounded in time. Returns
    (result, probe)."""
    async def bounded():
        return await h.wait_for(coro_fn(*args), bound)
    runner = h.Runner(**options)
    with runner:
        result = runner.run(bounded())
    return result, runner.probe


def _listener():
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKBUF)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKBUF)
    ls.bind(("127.0.0.1", 0))
    ls.listen(8)
    return ls


async def _connect_to_peer(ls):
    """A hybrid client connected to a blocking peer socket (accepted here: the
    handshake is already complete, so accept() does not block the loop)."""
    reader, writer = await h.open_connection("127.0.0.1", ls.getsockname()[1],
                                             sockbuf=SOCKBUF)
    ls.settimeout(5)
    peer, _ = ls.accept()
    peer.settimeout(10)
    return reader, writer, peer


class PeerReader(threading.Thread):
    """Reads a blocking socket until EOF (or an error), after ``delay`` seconds."""

    def __init__(self, sock, delay=0.0, chunk=65536):
        super().__init__(daemon=True)
        self.sock, self.delay, self.chunk = sock, delay, chunk
        self.received = bytearray()
        self.eof = False
        self.error = None

    def run(self):
        time.sleep(self.delay)
        try:
            while True:
                data = self.sock.recv(self.chunk)
                if not data:
                    self.eof = True
                    return
                self.received += data
        except OSError as exc:
            self.error = exc

    def finish(self):
        self.join(15)
        assert not self.is_alive(), "peer reader did not finish"
        self.sock.close()


def _pattern(n, seed=0):
    """n bytes that differ at every offset (catches reordering and loss)."""
    block = bytes((i * 7 + seed) & 0xFF for i in range(251))
    return (block * (n // len(block) + 1))[:n]


# ------------------------------------------------------------------ Futures and Tasks

def test_future_callbacks_run_via_call_soon_not_synchronously():
    async def main():
        loop = get_running_loop()
        fut = h.Future()
        calls = []
        fut.add_done_callback(lambda f: calls.append(("first", f.result())))
        fut.set_result(7)
        assert calls == [], "callback ran inside set_result"
        fut.add_done_callback(lambda f: calls.append(("late", f.result())))
        assert calls == [], "callback added to a done future ran synchronously"
        await h.sleep(0)
        assert calls == [("first", 7), ("late", 7)]
        # remove_done_callback keeps the others
        fut2 = h.Future(loop=loop)
        cb = lambda f: calls.append("removed")   # noqa: E731
        fut2.add_done_callback(cb)
        fut2.add_done_callback(lambda f: calls.append("kept"))
        assert fut2.remove_done_callback(cb) == 1
        fut2.cancel()
        await h.sleep(0)
        assert calls[-1] == "kept" and "removed" not in calls
        return True
    assert _run(main)[0]


def test_future_states_and_errors():
    async def main():
        fut = h.Future()
        with pytest.raises(h.InvalidStateError):
            fut.result()
        fut.set_exception(ValueError("boom"))
        with pytest.raises(h.InvalidStateError):
            fut.set_result(1)
        assert isinstance(fut.exception(), ValueError)
        with pytest.raises(ValueError, match="boom"):
            await fut
        with pytest.raises(TypeError):
            h.Future().set_exception(StopIteration())
        c = h.Future()
        assert c.cancel("why") and c.cancelled() and not c.cancel()
        with pytest.raises(h.CancelledError):
            c.result()
        with pytest.raises(TypeError, match="coroutine was expected"):
            h.Task(42)
        return True
    assert _run(main)[0]
    assert issubclass(h.CancelledError, BaseException)
    assert not issubclass(h.CancelledError, Exception)
    assert h.TimeoutError is TimeoutError


def test_task_steps_and_resumes_from_future_callbacks():
    async def worker(futs, log):
        for i, f in enumerate(futs):
            log.append(("awaiting", i))
            log.append(("got", await f))
        return "done"

    async def main():
        loop = get_running_loop()
        futs = [h.Future() for _ in range(3)]
        log = []
        t = h.create_task(worker(futs, log))
        await h.sleep(0)
        assert log == [("awaiting", 0)]
        for i, f in enumerate(futs):
            loop.call_later(0.01 * (i + 1), f.set_result, i * 10)
        assert await t == "done"
        assert log == [("awaiting", 0), ("got", 0), ("awaiting", 1), ("got", 10),
                       ("awaiting", 2), ("got", 20)]
        assert t.done() and t.result() == "done" and h.current_task() is not t
        return loop.probe.task_switches
    switches, probe = _run(main)
    # worker: 1 first step + 3 wake-ups; main and the wait_for wrapper add more
    assert switches >= 4
    assert probe.spawns >= 2


def test_cancellation_is_delivered_at_the_await_point_and_can_be_caught():
    async def stubborn(log):
        try:
            await h.sleep(10)
        except h.CancelledError:
            log.append("caught")
            await h.sleep(0.01)         # can still await after catching
            return "survived"

    async def obedient(log):
        try:
            await h.sleep(10)
        finally:
            log.append("cleanup")

    async def main():
        log = []
        t1 = h.create_task(stubborn(log))
        t2 = h.create_task(obedient(log))
        await h.sleep(0.01)
        assert t1.cancel() and t2.cancel()
        assert not t1.cancelled()         # a request, not a fact
        assert await t1 == "survived"
        with pytest.raises(h.CancelledError):
            await t2
        assert t2.cancelled() and not t2.cancel()
        assert sorted(log) == ["caught", "cleanup"]
        # cancel before the first step: the coroutine never runs its body
        ran = []
        async def never():
            ran.append(1)
        t3 = h.create_task(never())
        t3.cancel()
        await h.sleep(0)
        assert t3.cancelled() and ran == []
        return get_running_loop().probe.cancellations
    cancellations, _ = _run(main)
    assert cancellations >= 3


def test_cancel_after_the_awaited_future_resolved_still_cancels():
    """The future a task awaits is done but the task's step has not run yet:
    cancel() cannot cancel the future any more, so the pending step throws
    CancelledError instead of delivering the result (asyncio's _must_cancel).
    The task's one reusable step handle must carry either outcome."""
    async def waiter(f, log):
        try:
            log.append(await f)
        except h.CancelledError:
            log.append("cancelled")
            raise

    async def main():
        log = []
        f = h.Future()
        t = h.create_task(waiter(f, log))
        await h.sleep(0)                  # t is parked on f
        f.set_result("value")             # t's step is queued ...
        assert t.cancel()                 # ... and then cancelled
        with pytest.raises(h.CancelledError):
            await t
        assert log == ["cancelled"] and t.cancelled()
        # the same sequence with an exception in the future, and a task that
        # is woken many times in a row by futures, bare yields and sleeps
        f2 = h.Future()
        t2 = h.create_task(waiter(f2, log))
        await h.sleep(0)
        f2.set_exception(KeyError("k"))
        with pytest.raises(KeyError):
            await t2

        async def many():
            total = 0
            for i in range(50):
                g = h.Future()
                get_running_loop().call_soon(g.set_result, i)
                total += await g
                await h.sleep(0)
                await h.sleep(0.0001)
            return total
        assert await h.gather(many(), many()) == [1225, 1225]
        return True
    assert _run(main)[0]


def test_waking_a_task_on_a_closed_loop_raises():
    """Resolving a future that a task awaits, after the loop closed, fails loudly
    (RuntimeError from call_soon) instead of queueing the step where it never runs;
    so does creating a task on a closed loop."""
    from kernels.callback import Loop
    loop = Loop()
    try:
        f = h.Future(loop=loop)

        async def w():
            return await f
        t = h.Task(w(), loop=loop)
        loop.call_soon(loop.stop)
        loop.run_forever()                # one pass: t's first step parks it on f
        assert not t.done()
    finally:
        loop.close()
    with pytest.raises(RuntimeError, match="closed"):
        f.set_result(1)
    coro = w()
    with pytest.raises(RuntimeError, match="closed"):
        h.Task(coro, loop=loop)
    coro.close()


def test_sleep_ordering():
    async def sleeper(d, order):
        await h.sleep(d)
        order.append(d)

    async def main():
        order = []
        await h.gather(*(sleeper(d, order) for d in (0.06, 0.02, 0.04, 0.0)))
        return order
    assert _run(main)[0] == [0.0, 0.02, 0.04, 0.06]


def test_wait_for_timeout_cancels_the_inner_awaitable():
    async def inner(log):
        try:
            await h.sleep(10)
        except h.CancelledError:
            log.append("inner cancelled")
            raise

    async def main():
        log = []
        t = h.create_task(inner(log))
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            await h.wait_for(t, 0.05)
        assert time.monotonic() - t0 < 5
        assert t.cancelled() and log == ["inner cancelled"]
        # a coroutine, awaited directly
        with pytest.raises(TimeoutError):
            await h.wait_for(inner(log), 0.02)
        assert log == ["inner cancelled"] * 2
        assert await h.wait_for(h.sleep(0.01, "ok"), 5) == "ok"
        # timeout <= 0 on something not done
        with pytest.raises(TimeoutError):
            await h.wait_for(h.sleep(1), 0)
        # the timeout() context manager, and an outer cancel it must not convert
        with pytest.raises(TimeoutError):
            async with h.timeout(0.02) as cm:
                await h.sleep(10)
        assert cm.expired()
        async with h.timeout(5) as cm2:
            await h.sleep(0.01)
        assert not cm2.expired()
        return True
    assert _run(main)[0]


def test_outer_cancel_passes_through_timeout_unconverted():
    async def guarded():
        async with h.timeout(5):
            await h.sleep(10)

    async def main():
        t = h.create_task(guarded())
        await h.sleep(0.01)
        t.cancel()
        with pytest.raises(h.CancelledError):
            await t
        return t.cancelled()
    assert _run(main)[0]


def test_gather_results_errors_and_cancel():
    async def val(x, d=0.0):
        await h.sleep(d)
        return x

    async def fail(d):
        await h.sleep(d)
        raise KeyError("bad")

    async def main():
        assert await h.gather(val(1, 0.02), val(2), val(3, 0.01)) == [1, 2, 3]
        assert await h.gather() == []
        with pytest.raises(KeyError):
            await h.gather(val(1, 0.05), fail(0.01))
        res = await h.gather(val(1), fail(0), return_exceptions=True)
        assert res[0] == 1 and isinstance(res[1], KeyError)
        slow = h.create_task(val(1, 10))
        g = h.gather(slow, val(2, 10))
        await h.sleep(0)
        assert g.cancel()
        with pytest.raises(h.CancelledError):
            await g
        assert slow.cancelled()
        return True
    assert _run(main)[0]


def test_taskgroup_error_cancels_siblings_and_raises_a_group():
    async def sibling(log):
        try:
            await h.sleep(10)
        except h.CancelledError:
            log.append("sibling cancelled")
            raise

    async def crasher():
        await h.sleep(0.01)
        raise ValueError("crash")

    async def main():
        log = []
        with pytest.raises(ExceptionGroup) as info:
            async with h.TaskGroup() as tg:
                tg.create_task(sibling(log))
                tg.create_task(sibling(log))
                tg.create_task(crasher())
                await h.sleep(10)      # the body is cancelled too
        errors = info.value.exceptions
        assert len(errors) == 1 and isinstance(errors[0], ValueError)
        assert log == ["sibling cancelled"] * 2
        # the parent is not left cancelled: it can keep awaiting
        await h.sleep(0.001)
        async with h.TaskGroup() as tg:
            a = tg.create_task(h.sleep(0.01, "a"))
            b = tg.create_task(h.sleep(0.02, "b"))
        return a.result() + b.result()
    assert _run(main)[0] == "ab"


def test_event_and_queue():
    async def producer(q):
        for i in range(10):
            await q.put(i)           # maxsize 2: blocks until consumed
        await q.put(None)

    async def main():
        ev = h.Event()
        waiters = [h.create_task(ev.wait()) for _ in range(3)]
        await h.sleep(0)
        assert not any(w.done() for w in waiters)
        ev.set()
        assert await h.gather(*waiters) == [True] * 3
        q = h.Queue(maxsize=2)
        p = h.create_task(producer(q))
        got = []
        while (item := await q.get()) is not None:
            got.append(item)
            assert q.qsize() <= 2
            q.task_done()
        q.task_done()
        await q.join()
        await p
        with pytest.raises(h.QueueEmpty):
            q.get_nowait()
        q.put_nowait(1)
        q.put_nowait(2)
        with pytest.raises(h.QueueFull):
            q.put_nowait(3)
        return got
    assert _run(main)[0] == list(range(10))


def test_spawn_lazy_fingerprint_200_of_200():
    """asyncio's S4 fingerprint: the child has not run when create_task
    returns, and has run after the parent's one sleep(0) -- 200 times in 200."""
    async def main():
        not_before = ran_after = 0
        for _ in range(200):
            ran = []

            async def child():
                ran.append(1)
            t = h.create_task(child())
            not_before += not ran
            await h.sleep(0)
            ran_after += bool(ran)
            await t
        return not_before, ran_after
    assert _run(main, spawn="lazy")[0] == (200, 200)


def test_spawn_eager_runs_the_child_before_create_task_returns():
    async def main():
        parent = h.current_task()
        seen = []

        async def child():
            seen.append(h.current_task())
            await h.sleep(0.01)
            seen.append("resumed")
            return 5
        t = h.create_task(child())
        assert seen == [t], "eager child did not run its first step inside create_task"
        assert h.current_task() is parent
        assert await t == 5 and seen[-1] == "resumed"

        async def instant():
            return 9
        t2 = h.create_task(instant())
        assert t2.done() and t2.result() == 9   # finished without a loop pass
        return True
    assert _run(main, spawn="eager")[0]


# ------------------------------------------------------------------ streams

async def _echo_handler(reader, writer):
    while True:
        data = await reader.read(65536)
        if not data:
            break
        writer.write(data)
        await writer.drain()
    writer.close()
    await writer.wait_closed()


@pytest.mark.parametrize("clients", [1, 100])
def test_stream_echo_byte_exact(clients):
    size = MiB

    async def client(port, seed):
        reader, writer = await h.open_connection("127.0.0.1", port)
        payload = _pattern(size, seed)

        async def send():
            for i in range(0, size, 256 * 1024):
                writer.write(payload[i:i + 256 * 1024])
                await writer.drain()
            writer.write_eof()
        sender = h.create_task(send())
        got = await reader.readexactly(size)
        assert await reader.read() == b""        # the server closed after our EOF
        await sender
        writer.close()
        await writer.wait_closed()
        return got == payload

    async def main():
        server = await h.start_server(_echo_handler, "127.0.0.1", 0)
        async with server:
            port = server.sockets[0].getsockname()[1]
            results = await h.gather(*(client(port, i) for i in range(clients)))
        assert not server.is_serving()
        return results
    results, probe = _run(main, bound=90)
    assert results == [True] * clients
    snap = probe.snapshot()
    assert snap["connections_count"] == 2 * clients
    assert snap["accepted_bytes"] == snap["sent_bytes"] == 2 * clients * size


def test_readexactly_readline_readuntil_and_incomplete_read():
    async def main():
        ls = _listener()
        try:
            reader, writer, peer = await _connect_to_peer(ls)
            peer.sendall(b"line one\nline two\nABC--XYZ--" + b"x" * 10 + b"tail")
            peer.shutdown(socket.SHUT_WR)
            assert await reader.readline() == b"line one\n"
            assert await reader.readuntil(b"\n") == b"line two\n"
            assert await reader.readexactly(3) == b"ABC"
            assert await reader.readuntil(b"--") == b"--"
            assert await reader.readuntil(b"--") == b"XYZ--"
            with pytest.raises(h.IncompleteReadError) as info:
                await reader.readexactly(100)
            assert info.value.partial == b"x" * 10 + b"tail" and info.value.expected == 100
            assert reader.at_eof()
            assert await reader.readline() == b""
            assert await reader.read(10) == b""
            with pytest.raises(ValueError):
                await reader.readexactly(-1)
            with pytest.raises(ValueError):
                await reader.readuntil(b"")
            writer.close()
            await writer.wait_closed()
            peer.close()
        finally:
            ls.close()
        return True
    assert _run(main)[0]


def test_reads_after_cancelled_and_timed_out_reads_get_the_data():
    """read() recycles its waiter Future once a wait ended normally; a wait that
    ended in a cancellation or a timeout must leave nothing behind that a later
    read could trip over: the next reads wait and wake as usual, and bytes that
    arrived just before a cancellation stay buffered for the next read."""
    async def main():
        reader = h.StreamReader(loop=get_running_loop())
        for i in range(3):                       # wait, wake, recycle, repeat
            t = h.create_task(reader.read(100))
            await h.sleep(0)
            reader.feed_data(b"chunk%d" % i)
            assert await t == b"chunk%d" % i
        t = h.create_task(reader.read(100))      # cancelled while waiting
        await h.sleep(0)
        t.cancel()
        with pytest.raises(h.CancelledError):
            await t
        with pytest.raises(TimeoutError):        # timed out while waiting
            await h.wait_for(reader.read(100), 0.01)
        t = h.create_task(reader.read(100))      # data, then a cancel before the step
        await h.sleep(0)
        reader.feed_data(b"kept")
        t.cancel()
        with pytest.raises(h.CancelledError):
            await t
        assert await reader.read(100) == b"kept"
        t = h.create_task(reader.read(2))
        await h.sleep(0)
        reader.feed_data(b"abc")
        assert await t == b"ab" and await reader.read(100) == b"c"
        t = h.create_task(reader.read(100))      # EOF wakes a recycled waiter
        await h.sleep(0)
        reader.feed_eof()
        assert await t == b"" and reader.at_eof()
        # an error is raised by the waiting read and every later one
        r2 = h.StreamReader(loop=get_running_loop())
        t = h.create_task(r2.read(100))
        await h.sleep(0)
        r2.set_exception(ConnectionResetError("reset"))
        for _ in range(2):
            with pytest.raises(ConnectionResetError):
                await (t if not t.done() else r2.read(100))
        return True
    assert _run(main)[0]


def test_half_close_keeps_writing_possible():
    """The stream protocol's eof_received returns True: after the peer's EOF the
    transport stays half-open and the answer still goes out."""
    async def main():
        ls = _listener()
        try:
            reader, writer, peer = await _connect_to_peer(ls)
            peer.sendall(b"question")
            peer.shutdown(socket.SHUT_WR)
            assert await reader.read() == b"question"
            assert reader.at_eof() and not writer.is_closing()
            writer.write(b"answer")
            await writer.drain()
            writer.close()
            await writer.wait_closed()
            got = b""
            while chunk := peer.recv(100):
                got += chunk
            peer.close()
        finally:
            ls.close()
        return got
    assert _run(main)[0] == b"answer"


def test_readline_over_limit_and_partial_line_at_eof():
    async def main():
        ls = _listener()
        try:
            reader, writer, peer = await _connect_to_peer(ls)
            reader2 = h.StreamReader(limit=16)
            reader2.feed_data(b"a" * 40 + b"\nshort\npartial")
            reader2.feed_eof()
            with pytest.raises(ValueError):
                await reader2.readline()          # the overlong line is dropped
            assert await reader2.readline() == b"short\n"
            assert await reader2.readline() == b"partial"
            with pytest.raises(h.LimitOverrunError):
                r3 = h.StreamReader(limit=4)
                r3.feed_data(b"0123456789")
                await r3.readuntil(b"\n")
            with pytest.raises(ValueError):
                h.StreamReader(limit=0)
            writer.close()
            await writer.wait_closed()
            peer.close()
        finally:
            ls.close()
        return True
    assert _run(main)[0]


def test_reader_pauses_transport_above_twice_the_limit_and_resumes():
    limit = 16 * 1024

    async def main():
        ls = _listener()
        try:
            reader, writer, peer = await _connect_to_peer(ls)
            reader._limit = limit   # a small limit, as open_connection(limit=) would set
            sender = threading.Thread(target=peer.sendall, args=(b"z" * (512 * 1024),))
            sender.start()
            try:
                # let the reader fill up without reading
                for _ in range(200):
                    await h.sleep(0.01)
                    if not writer.transport.is_reading():
                        break
                assert not writer.transport.is_reading()
                assert 2 * limit < reader.buffer_bytes <= 2 * limit + 65536
                total = 0
                while total < 512 * 1024:
                    total += len(await reader.read(65536))
            finally:
                sender.join(10)
            assert writer.transport.is_reading()
            stats = writer.transport.stats
            assert stats.read_pauses_count >= 1
            assert 2 * limit < reader.peak_buffer_bytes <= 2 * limit + 65536
            writer.close()
            await writer.wait_closed()
            peer.close()
        finally:
            ls.close()
        return True
    assert _run(main)[0]


def test_open_connection_limit_is_the_reader_limit_and_refused_connect_raises():
    async def main():
        ls = _listener()
        port = ls.getsockname()[1]
        try:
            reader, writer = await h.open_connection("127.0.0.1", port, limit=1234)
            peer, _ = ls.accept()
            assert reader.limit == 1234
            assert writer.get_extra_info("peername") == ("127.0.0.1", port)
            writer.close()
            await writer.wait_closed()
            peer.close()
        finally:
            ls.close()
        with pytest.raises(ConnectionRefusedError):
            await h.open_connection("127.0.0.1", port)
        return True
    assert _run(main)[0]


def test_write_1mib_to_a_non_reading_peer_leaves_bytes_in_user_space():
    """S4: write() returns at once; what the socket refused waits in user space."""
    async def main():
        ls = _listener()
        try:
            reader, writer, peer = await _connect_to_peer(ls)
            writer.write(b"\0" * MiB)
            stats = writer.transport.stats
            buffered = writer.transport.get_write_buffer_size()
            assert buffered == stats.accepted_bytes - stats.sent_bytes == MiB - stats.sent_bytes
            assert buffered > MiB // 2, buffered
            assert stats.pause_writing_count == 1
            writer.transport.abort()
            await h.sleep(0)
            assert stats.lost_on_abort_bytes == buffered
            peer.close()
        finally:
            ls.close()
        return buffered
    buffered, _ = _run(main)
    assert buffered > 0


@pytest.mark.parametrize("drain", ["asyncio", "empty"])
def test_drain_returns_at_low_water_or_at_empty(drain):
    """With a peer that starts reading late: drain="asyncio" returns as soon as
    resume_writing fires -- bytes still buffered, at most the low-water mark;
    drain="empty" returns only when nothing is buffered. The marks are set wide
    (512/768 KiB) so that one send, bounded by the 64 KiB socket buffers, can
    never jump from above low water straight to empty."""
    low, high = 512 * 1024, 768 * 1024

    async def main():
        ls = _listener()
        try:
            reader, writer, peer = await _connect_to_peer(ls)
            transport = writer.transport
            transport.set_write_buffer_limits(high=high, low=low)
            peer_reader = PeerReader(peer, delay=0.2)
            peer_reader.start()
            try:
                writer.write(_pattern(3 * MiB))
                assert transport.stats.pause_writing_count == 1
                await writer.drain()
                left = transport.get_write_buffer_size()
                assert transport.get_write_buffer_limits() == (low, high)  # restored
                # drain="empty" also waits when the transport is not paused
                writer.write(b"y" * 1000)
                await writer.drain()
                left_small = transport.get_write_buffer_size()
                writer.close()
                await writer.wait_closed()
            finally:
                peer_reader.finish()
            assert bytes(peer_reader.received) == _pattern(3 * MiB) + b"y" * 1000
        finally:
            ls.close()
        return left, left_small
    (left, left_small), _ = _run(main, drain=drain)
    if drain == "asyncio":
        assert 0 < left <= low, left
    else:
        assert left == 0 and left_small == 0


def test_two_concurrent_drain_waiters_both_wake():
    """CPython 74116: the second waiter raised AssertionError; here both wake."""
    async def main():
        ls = _listener()
        try:
            reader, writer, peer = await _connect_to_peer(ls)
            writer.write(b"\1" * MiB)           # far above high water: paused
            woke = []

            async def drainer(name):
                await writer.drain()
                woke.append(name)
            tasks = [h.create_task(drainer("a")), h.create_task(drainer("b"))]
            await h.sleep(0.05)
            assert woke == []                   # nobody reads yet
            peer_reader = PeerReader(peer)
            peer_reader.start()
            try:
                await h.gather(*tasks)
                writer.close()
                await writer.wait_closed()
            finally:
                peer_reader.finish()
            assert sorted(woke) == ["a", "b"]
            assert len(peer_reader.received) == MiB
        finally:
            ls.close()
        return True
    assert _run(main)[0]


@pytest.mark.parametrize("value", ["many", "one"])
def test_drain_waiters_option_cpython_74116(value):
    """drain_waiters=one brings back the single waiter: the second drainer asserts."""
    async def main():
        ls = _listener()
        try:
            reader, writer, peer = await _connect_to_peer(ls)
            writer.write(b"\1" * MiB)           # far above high water: paused
            errors = []

            async def drainer():
                try:
                    await writer.drain()
                except AssertionError as exc:
                    errors.append(exc)
            tasks = [h.create_task(drainer()), h.create_task(drainer())]
            await h.sleep(0.05)
            peer_reader = PeerReader(peer)
            peer_reader.start()
            try:
                await h.gather(*tasks)
                writer.close()
                await writer.wait_closed()
            finally:
                peer_reader.finish()
            assert len(peer_reader.received) == MiB
        finally:
            ls.close()
        return len(errors)
    assert _run(main, drain_waiters=value)[0] == (1 if value == "one" else 0)


@pytest.mark.parametrize("value", ["yield", "return"])
def test_drain_on_closing_option_cpython_80982(value):
    """drain_on_closing=return: write(); drain() after close() neither yields nor raises,
    so connection_lost never runs inside the loop (Python 3.7's spin)."""
    async def main():
        ls = _listener()
        try:
            reader, writer, peer = await _connect_to_peer(ls)
            writer.close()
            spins, error = 0, None
            try:
                for _ in range(100):
                    writer.write(b"x")
                    await writer.drain()
                    spins += 1
            except ConnectionResetError as exc:
                error = exc
            lost_during_loop = writer.transport.stats.closed
            await writer.wait_closed()
            peer.close()
        finally:
            ls.close()
        return spins, error is not None, lost_during_loop
    spins, raised, lost = _run(main, drain_on_closing=value)[0]
    if value == "yield":
        assert (spins, raised, lost) == (0, True, True)
    else:
        assert (spins, raised, lost) == (100, False, False)


def test_close_returns_before_the_close_completes_and_one_sleep0_completes_it():
    """S4 / asyncio issue 466: close() is a request; with nothing buffered,
    connection_lost runs on the next pass -- after one sleep(0)."""
    async def main():
        ls = _listener()
        try:
            reader, writer, peer = await _connect_to_peer(ls)
            transport = writer.transport
            writer.close()
            assert writer.is_closing()
            closed_at_return = transport.stats.closed or reader.at_eof()
            await h.sleep(0)
            closed_after_yield = transport.stats.closed and reader.at_eof()
            await writer.wait_closed()      # already done: returns at once

            # asyncio 3.11's drain() on a closing transport yields once first, so
            # the pending connection_lost runs and drain reports it (issue 263)
            reader2, writer2, peer2 = await _connect_to_peer(ls)
            writer2.close()
            with pytest.raises(ConnectionResetError, match="Connection lost"):
                await writer2.drain()
            peer2.close()
            peer.settimeout(5)
            assert peer.recv(10) == b""     # the peer saw EOF
            peer.close()
        finally:
            ls.close()
        return closed_at_return, closed_after_yield
    assert _run(main)[0] == (False, True)


def test_wait_closed_waits_until_buffered_bytes_are_flushed():
    async def main():
        ls = _listener()
        try:
            reader, writer, peer = await _connect_to_peer(ls)
            payload = _pattern(2 * MiB, 3)
            writer.write(payload)
            writer.close()
            stats = writer.transport.stats
            assert not stats.closed and writer.transport.get_write_buffer_size() > 0
            peer_reader = PeerReader(peer, delay=0.1)
            peer_reader.start()
            try:
                await writer.wait_closed()
                assert stats.closed and stats.sent_bytes == 2 * MiB
                assert writer.transport.get_write_buffer_size() == 0
            finally:
                peer_reader.finish()
            assert peer_reader.eof and bytes(peer_reader.received) == payload
            # drain on a closed transport: yields once, then reports the loss
            with pytest.raises(ConnectionResetError):
                await writer.drain()
        finally:
            ls.close()
        return True
    assert _run(main)[0]


def test_peer_reset_surfaces_at_the_next_read_or_drain():
    """Error surface: a peer that resets (SO_LINGER 0) reaches the stream as an
    exception at the next read() -- not at write()."""
    async def main():
        ls = _listener()
        try:
            reader, writer, peer = await _connect_to_peer(ls)
            peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            peer.close()
            with pytest.raises(ConnectionResetError):
                for _ in range(100):
                    if not await reader.read(100):
                        break
                    await h.sleep(0.01)
            writer.write(b"after the reset")      # no error here: counted and dropped
            with pytest.raises(ConnectionResetError):
                await writer.drain()
            with pytest.raises(ConnectionResetError):
                await writer.wait_closed()
            return writer.transport.stats.writes_after_close_count
        finally:
            ls.close()
    dropped, _ = _run(main)
    assert dropped == 1


@pytest.mark.parametrize("wait_closed", ["3.11", "3.12"])
def test_server_plain_callback_wait_closed_and_serve_forever(wait_closed):
    """wait_closed=3.12 (3.12.1+) waits for the accepted connection after close();
    3.11 returns at once (CPython 113538 is the hang the 3.12 meaning causes)."""
    async def main():
        conns = []

        def on_connect(reader, writer):       # a plain function, not a coroutine
            conns.append(writer)
        server = await h.start_server(on_connect, "127.0.0.1", 0, sockbuf=SOCKBUF)
        port = server.sockets[0].getsockname()[1]
        serving = h.create_task(server.serve_forever())
        r, w = await h.open_connection("127.0.0.1", port)
        while not conns:
            await h.sleep(0.005)
        server.close()
        assert not server.is_serving()
        with pytest.raises(h.CancelledError):
            await serving                      # close() ends serve_forever
        closing = h.create_task(server.wait_closed())
        await h.sleep(0.02)
        waited = not closing.done()            # a connection is still open
        conns[0].close()
        await closing                          # ...and now it is not
        assert await r.read() == b""
        w.close()
        await w.wait_closed()
        return waited
    assert _run(main, wait_closed=wait_closed)[0] is (wait_closed == "3.12")


def test_wait_closed_default_follows_the_running_python():
    import sys
    expected = "3.11" if sys.version_info[:3] < (3, 12, 1) else "3.12"
    assert h.OPTIONS.defaults()["wait_closed"] == expected


def test_handler_exception_is_reported_and_closes_the_connection():
    async def main():
        reports = []
        get_running_loop().set_exception_handler(lambda loop, ctx: reports.append(ctx))

        async def bad(reader, writer):
            raise RuntimeError("handler bug")
        server = await h.start_server(bad, "127.0.0.1", 0)
        r, w = await h.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
        assert await r.read() == b""
        w.close()
        server.close()
        await server.wait_closed()
        return [str(c.get("exception")) for c in reports]
    assert "handler bug" in _run(main)[0]


# ------------------------------------------------------------------ Runner and exit policies

def _background_sender(ls, total, main_returns_after=0.05):
    """main() spawns a task that writes ``total`` bytes to a slow peer and waits
    for the close; main itself returns almost at once."""
    state = {}

    async def send(writer):
        try:
            writer.write(_pattern(total, 5))
            writer.close()
            await writer.wait_closed()
            state["finished"] = True
        except h.CancelledError:
            state["cancelled"] = True
            raise

    async def main():
        reader, writer, peer = await _connect_to_peer(ls)
        state["peer"] = peer
        state["stats"] = writer.transport.stats
        h.create_task(send(writer))
        await h.sleep(main_returns_after)
        return "main done"
    return main, state


def test_exit_cancel_cancels_leftover_tasks_and_counts_unsent_bytes():
    ls = _listener()
    try:
        main, state = _background_sender(ls, 4 * MiB)
        runner = h.Runner(exit="cancel")
        with runner:
            assert runner.run(main()) == "main done"
        report = runner.probe.exit_report
        stats = state["stats"]
        peer_reader = PeerReader(state["peer"])
        peer_reader.start()
        peer_reader.finish()
    finally:
        ls.close()
    assert state.get("cancelled") and not state.get("finished")
    assert report["policy"] == "cancel" and report["tasks_left_count"] == 1
    assert report["unsent_bytes"] > 0
    assert stats.lost_on_exit_bytes == report["unsent_bytes"]
    # the peer got exactly what the kernel sent; the rest is counted as lost
    assert len(peer_reader.received) == stats.sent_bytes == 4 * MiB - report["unsent_bytes"]


def test_exit_wait_delivers_everything():
    ls = _listener()
    try:
        main, state = _background_sender(ls, 4 * MiB)
        runner = h.Runner(exit="wait")
        peer_reader = None
        with runner:
            loop = runner.loop
            # the peer starts reading only once main has returned
            def start_peer():
                nonlocal peer_reader
                peer_reader = PeerReader(state["peer"], delay=0.2)
                peer_reader.start()
            t0 = time.monotonic()
            result = runner.run(main())
            start_peer()
        elapsed = time.monotonic() - t0
        report = runner.probe.exit_report
        peer_reader.finish()
    finally:
        ls.close()
    assert result == "main done" and loop.is_closed()
    assert state.get("finished") and not state.get("cancelled")
    assert report["policy"] == "wait" and report["unsent_bytes"] == 0
    assert report["tasks_cancelled_count"] == 0
    assert peer_reader.eof and bytes(peer_reader.received) == _pattern(4 * MiB, 5)
    # the wait ended because everything was delivered, not at the 10 s bound
    assert elapsed < 8, elapsed


@pytest.mark.parametrize("policy", ["cancel", "wait"])
def test_exit_policy_on_write_close_return(policy):
    """S3's shape: write 4 MiB, close(), return -- no task left, only a closing
    transport with a full buffer. cancel drops the buffer (counted), wait flushes it."""
    ls = _listener()
    total = 4 * MiB
    try:
        state = {}

        async def main():
            reader, writer, peer = await _connect_to_peer(ls)
            state["peer"], state["stats"] = peer, writer.transport.stats
            writer.write(_pattern(total, 9))
            writer.close()
        runner = h.Runner(exit=policy)
        peer_reader = None
        with runner:
            runner.run(main())
            peer_reader = PeerReader(state["peer"], delay=0.1)
            peer_reader.start()
        peer_reader.finish()
    finally:
        ls.close()
    report, stats = runner.probe.exit_report, state["stats"]
    assert report["tasks_left_count"] == 0
    if policy == "cancel":
        assert report["unsent_bytes"] > 0 and stats.lost_on_exit_bytes == report["unsent_bytes"]
        assert len(peer_reader.received) == stats.sent_bytes == total - report["unsent_bytes"]
    else:
        assert report["unsent_bytes"] == 0 and stats.lost_on_exit_bytes == 0
        assert bytes(peer_reader.received) == _pattern(total, 9) and peer_reader.eof


def test_exit_raise_names_tasks_and_bytes():
    ls = _listener()
    try:
        main, state = _background_sender(ls, 4 * MiB)
        runner = h.Runner(exit="raise")
        with pytest.raises(RuntimeError, match=r"1 task\(s\) still running and \d+ byte"):
            with runner:
                runner.run(main())
        state["peer"].close()
    finally:
        ls.close()
    assert state.get("cancelled")
    assert runner.probe.exit_report["unsent_bytes"] > 0
    assert runner.loop.is_closed()

    # nothing left: no error
    async def tidy():
        await h.sleep(0)
        return 1
    assert h.run(tidy(), exit="raise") == 1


def test_runner_option_validation():
    with pytest.raises(OptionError, match="hybrid: bad value 'sometimes' for option spawn"):
        h.Runner(spawn="sometimes")
    with pytest.raises(OptionError, match="drain"):
        h.Runner(drain="full")
    with pytest.raises(OptionError, match="exit"):
        h.Runner(exit="later")
    with pytest.raises(OptionError, match="write"):
        h.Runner(write="maybe")
    with pytest.raises(OptionError, match="high_water"):
        h.Runner(high_water="big")
    with pytest.raises(OptionError, match="must not exceed"):
        h.Runner(high_water=10, low_water=20)
    with pytest.raises(OptionError, match="trace"):
        h.Runner(trace="maybe")
    with pytest.raises(OptionError, match="unknown option 'cancel'"):
        h.Runner(cancel="level")
    assert h.OPTIONS.owner == "hybrid"
    assert h.OPTIONS.names()[:3] == ["high_water", "low_water", "write"]
    assert {"spawn", "drain", "exit", "trace"} <= set(h.OPTIONS.names())
    assert h.Runner(high_water=4096).options["low_water"] == 1024   # asyncio's rule
    with pytest.raises(ValueError, match="coroutine"):
        h.run(lambda: None)

    async def nested():
        coro = h.sleep(0)
        try:
            h.run(coro)
        except RuntimeError as exc:
            return str(exc)
    assert "running event loop" in h.run(nested())


def test_main_exception_propagates_and_unretrieved_task_errors_are_reported():
    reports = []

    async def orphan():
        raise OSError("nobody awaited me")

    async def main():
        get_running_loop().set_exception_handler(lambda loop, ctx: reports.append(ctx))
        h.create_task(orphan())
        await h.sleep(0.01)
        gc.collect()
        raise LookupError("main failed")
    with pytest.raises(LookupError):
        h.run(main())
    gc.collect()
    assert any("never retrieved" in c.get("message", "") for c in reports)


def test_trace_has_task_tracks_step_slices_and_wakeup_flows():
    async def child():
        await h.sleep(0.01)

    async def main():
        await h.create_task(child())
    runner = h.Runner(trace=True)
    with runner:
        runner.run(main())
    events = runner.probe.trace.to_chrome()["traceEvents"]
    names = {e["args"]["name"] for e in events if e["ph"] == "M"}
    assert any("child" in n for n in names) and any("main" in n for n in names)
    steps = [e for e in events if e.get("name") == "step"]
    ends = [e for e in events if e["ph"] == "E"]
    assert steps and len(ends) == len(steps)
    starts = {e["id"] for e in events if e["ph"] == "s"}
    finishes = {e["id"] for e in events if e["ph"] == "f"}
    assert finishes and finishes <= starts
    assert all(e["tid"] >= 100_000 for e in steps)


def test_keyboard_interrupt_in_a_task_propagates_and_everything_is_released():
    state = {}

    async def main():
        server = await h.start_server(_echo_handler, "127.0.0.1", 0)
        reader, writer = await h.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
        state["loop"] = get_running_loop()

        async def bomb():
            await h.sleep(0.01)
            raise KeyboardInterrupt
        h.create_task(bomb())
        try:
            await h.sleep(10)
        except h.CancelledError:
            state["main cancelled"] = True
            raise
    with pytest.raises(KeyboardInterrupt):
        h.run(main())
    assert state["loop"].is_closed() and state.get("main cancelled")
    # the leak fixture checks that the server, both transports and the loop's fds are gone


# ---------------------------------------------------------------------------- fidelity edges

def test_tasks_run_in_a_copy_of_the_context_taken_at_creation():
    import contextvars
    var = contextvars.ContextVar("var", default="default")

    async def child(seen):
        seen.append(var.get())          # set by the parent after create_task: unseen
        var.set("child")
        await h.sleep(0)
        seen.append(var.get())

    async def main():
        seen = []
        var.set("before")
        t = h.create_task(child(seen))
        var.set("after")                # after the copy was taken
        await t
        return seen, var.get()

    seen, parent_sees = h.run(main())
    assert seen == ["before", "child"]   # the copy, then its own value
    assert parent_sees == "after"        # the child's set() stayed in the child


def test_callbacks_run_in_the_context_they_were_scheduled_from():
    # asyncio: call_soon/call_later/call_at and done callbacks take a copy of the
    # current context when scheduled (or the one given with context=).
    import contextvars
    var = contextvars.ContextVar("var", default="default")

    async def main():
        seen = {}
        loop = get_running_loop()
        fut = h.Future()
        var.set("task")
        fut.add_done_callback(lambda f: seen.__setitem__("done", var.get()))
        loop.call_soon(lambda: seen.__setitem__("soon", var.get()))
        loop.call_later(0, lambda: seen.__setitem__("later", var.get()))
        loop.call_at(loop.time(), lambda: seen.__setitem__("at", var.get()))
        other = contextvars.copy_context()
        other.run(var.set, "given")
        loop.call_soon(lambda: seen.__setitem__("given", var.get()), context=other)
        var.set("changed")
        fut.set_result(None)
        done_later = h.Future()
        done_later.set_result(None)
        done_later.add_done_callback(lambda f: seen.__setitem__("already_done", var.get()))
        await h.sleep(0.01)
        return seen

    assert h.run(main()) == {"done": "task", "soon": "task", "later": "task", "at": "task",
                             "given": "given", "already_done": "changed"}


def test_done_callback_removal_and_bad_callbacks_still_work():
    async def main():
        loop = get_running_loop()
        fut = h.Future()
        calls = []
        fut.add_done_callback(calls.append)
        fut.add_done_callback(calls.append)
        assert fut.remove_done_callback(calls.append) == 2
        fut.set_result(1)
        await h.sleep(0)
        with pytest.raises(TypeError, match="callable"):
            loop.call_soon(42)
        with pytest.raises(TypeError, match="callable"):
            loop.call_later(0, 42)
        return calls

    assert h.run(main()) == []


def test_unretrieved_future_exception_is_reported_and_retrieved_one_is_not():
    import gc

    async def main():
        reports = []
        loop = get_running_loop()
        loop.set_exception_handler(lambda _loop, ctx: reports.append(ctx))
        lost = h.Future()
        lost.set_exception(ValueError("lost"))
        kept = h.Future()
        kept.set_exception(ValueError("kept"))
        assert isinstance(kept.exception(), ValueError)
        awaited = h.Future()
        awaited.set_exception(KeyError("awaited"))
        with pytest.raises(KeyError):
            await awaited
        assert type(lost).__name__ == "Future" and isinstance(lost, h.Future)
        del lost, kept, awaited
        gc.collect()
        return reports

    reports = h.run(main())
    assert [r["message"] for r in reports] == ["Future exception was never retrieved"]
    assert str(reports[0]["exception"]) == "lost"


@pytest.mark.parametrize("mode, same_task", [("task", False), ("inline", True)])
def test_wait_for_runs_the_coroutine_in_a_new_task_or_inline(mode, same_task):
    async def inner():
        return h.current_task()

    async def slow():
        await h.sleep(5)

    async def main():
        me = h.current_task()
        inside = await h.wait_for(inner(), 5)
        with pytest.raises(TimeoutError):
            await h.wait_for(slow(), 0.02)
        return inside is me

    runner = h.Runner(wait_for=mode)
    with runner:
        assert runner.run(main()) is same_task


def test_wait_for_default_follows_the_running_python():
    import sys
    expected = "task" if sys.version_info < (3, 12) else "inline"
    assert h.OPTIONS.defaults()["wait_for"] == expected
