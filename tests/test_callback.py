"""Behaviour tests for the callback kernel (kernels/callback): the loop's
scheduling contract, the transports' buffering, flow control, closing and
error surfaces as asyncio 3.11's selector transports show them, and the exit
policies. Every run is bounded by a guard timer; every socket is closed (the
autouse leak check in conftest.py verifies it)."""
from __future__ import annotations

import os
import random
import signal
import socket
import struct
import threading
import time

import pytest
import kernels.callback as callback
from kernels.options import OptionError

from kernels.callback import (Handle, Loop, Protocol, Server, SocketTransport, TimerHandle,
                              UnsentDataError, get_running_loop)

KiB = 1024
MiB = 1024 * KiB
SOCKBUF = 64 * KiB
PAYLOAD = random.Random(20160512).randbytes(MiB)


# ---------------------------------------------------------------------------- helpers

@pytest.fixture(params=["reads-in-pass", "reads-by-transport"])
def loop(request):
    """A loop, twice: as it is (the pass reads a stream transport itself) and
    registering every transport's ``_read_ready`` instead, the path a loop that
    wraps its readers takes (the asyncio loop): the two must not differ."""
    lp = Loop()
    if request.param == "reads-by-transport":
        lp._add_stream_reader = lambda fd, t: Loop._add_reader(lp, fd, t._read_ready, ())
    yield lp
    if lp.is_running():   # a failed test left it running: cannot happen, but be safe
        lp.stop()
    lp.close()


def run(loop, timeout=10.0):
    """run_forever bounded by a guard timer; fail if the guard fired."""
    fired = []

    def guard():
        fired.append(True)
        loop.stop()

    handle = loop.call_later(timeout, guard)
    loop.run_forever()
    handle.cancel()
    assert not fired, f"loop was stopped by the {timeout}s guard timer"


def tcp_pair(sockbuf=None):
    """(server_side, client_side) connected over 127.0.0.1. With sockbuf, both
    ends get SO_SNDBUF/SO_RCVBUF before the connection exists."""
    listener = socket.socket()
    try:
        if sockbuf:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sockbuf)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, sockbuf)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        client = socket.socket()
        if sockbuf:
            client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sockbuf)
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, sockbuf)
        client.settimeout(10)
        client.connect(listener.getsockname())
        server_side, _ = listener.accept()
    finally:
        listener.close()
    return server_side, client


class Recorder:
    """A plain protocol (no Protocol base: the loop must not require it) that
    records every event in order."""

    def __init__(self, eof_keep_open=None):
        self.events = []
        self.data = bytearray()
        self.transport = None
        self.lost = []
        self.eof_keep_open = eof_keep_open
        self.on_made = self.on_data = self.on_eof = self.on_lost = None
        self.on_pause = self.on_resume = None

    def connection_made(self, transport):
        self.transport = transport
        self.events.append("made")
        if self.on_made:
            self.on_made(transport)

    def data_received(self, data):
        assert type(data) is bytes
        self.data += data
        if not self.events or self.events[-1] != "data":
            self.events.append("data")
        if self.on_data:
            self.on_data(data)

    def eof_received(self):
        self.events.append("eof")
        if self.on_eof:
            self.on_eof()
        return self.eof_keep_open

    def connection_lost(self, exc):
        self.events.append("lost")
        self.lost.append(exc)
        if self.on_lost:
            self.on_lost(exc)

    def pause_writing(self):
        self.events.append(("pause", self.transport.get_write_buffer_size()))
        if self.on_pause:
            self.on_pause()

    def resume_writing(self):
        self.events.append(("resume", self.transport.get_write_buffer_size()))
        if self.on_resume:
            self.on_resume()

    def count(self, kind):
        return sum(1 for e in self.events if e == kind or (isinstance(e, tuple) and e[0] == kind))


def accounting_ok(stats, transport):
    """The ledger every write must keep: what write() took is sent, buffered,
    or counted lost."""
    return (stats.accepted_bytes == stats.sent_bytes + transport.get_write_buffer_size()
            + stats.lost_on_abort_bytes + stats.lost_on_exit_bytes)


def reader_thread(sock, out, *, delay=0.0, limit=None):
    """Read until EOF (or ``limit`` bytes) into ``out``; record how it ended."""

    def body():
        time.sleep(delay)
        try:
            while limit is None or len(out["data"]) < limit:
                chunk = sock.recv(256 * KiB)
                if not chunk:
                    out["end"] = "eof"
                    return
                out["data"] += chunk
            out["end"] = "limit"
        except OSError as exc:
            out["end"] = repr(exc)

    out.setdefault("data", bytearray())
    th = threading.Thread(target=body, name="test-reader")
    th.start()
    return th


def fill_until_paused(loop, transport, proto, chunk=16 * KiB, max_chunks=2000):
    """Write chunks until pause_writing fires (the peer is not reading)."""
    data = b"z" * chunk
    for _ in range(max_chunks):
        transport.write(data)
        if proto.count("pause"):
            return
    raise AssertionError("pause_writing never fired")


# ---------------------------------------------------------------------------- loop: options

def test_options_are_validated_and_exposed():
    with Loop() as lp:
        assert lp.options == {"high_water": 65536, "low_water": 16384, "write": "try-send",
                              "write_after_close": "flush-if-buffered", "limits_recheck": True,
                              "writelines": "checked", "write_buffer": "bytearray",
                              "buffer_on_loss": "free",
                              "exit": "cancel", "trace": False}
        assert lp.options == callback.OPTIONS.defaults()
        assert lp.probe.trace is None
    with pytest.raises(OptionError, match="callback: bad value 'eager' for option write"):
        Loop(write="eager")
    with pytest.raises(OptionError, match="option exit: must be one of cancel"):
        Loop(exit="never")
    with pytest.raises(OptionError, match=r"low_water \(20\) must not exceed high_water \(10\)"):
        Loop(high_water=10, low_water=20)
    with pytest.raises(OptionError, match="must be >= 0"):
        Loop(high_water=10, low_water=-1)
    with pytest.raises(OptionError, match="high_water"):
        Loop(high_water="lots")
    with pytest.raises(OptionError, match="trace"):
        Loop(trace="maybe")
    with pytest.raises(OptionError, match="unknown option 'colour'"):
        Loop(colour="red")


def test_water_marks_follow_asyncio_rule():
    # only high given: low = high // 4; only low given: high = max(high, 4 * low)
    with Loop(high_water=1000) as lp:
        assert (lp.options["high_water"], lp.options["low_water"]) == (1000, 250)
    with Loop(low_water=100_000) as lp:
        assert (lp.options["high_water"], lp.options["low_water"]) == (400_000, 100_000)
    with Loop(low_water=10) as lp:
        assert (lp.options["high_water"], lp.options["low_water"]) == (65536, 10)
    with Loop(high_water="64KiB", trace="false") as lp:   # spec text works too
        assert lp.options["high_water"] == 65536 and lp.options["trace"] is False


# ---------------------------------------------------------------------------- loop: scheduling

def test_call_soon_runs_fifo_and_returns_handles(loop):
    order = []
    handles = [loop.call_soon(order.append, i) for i in range(50)]
    assert all(isinstance(h, Handle) for h in handles)
    loop.call_soon(loop.stop)
    run(loop)
    assert order == list(range(50))


def test_callbacks_scheduled_by_a_callback_run_on_the_next_pass(loop):
    # a pass starts with one poll: count them (the probe's counts lag while running)
    polls = []
    wait = loop._poller.wait

    def counted(timeout):
        polls.append(timeout)
        return wait(timeout)

    loop._poller.wait = counted
    seen = []

    def first():
        seen.append(("first", len(polls)))
        loop.call_soon(second)

    def second():
        seen.append(("second", len(polls)))
        loop.stop()

    loop.call_soon(first)
    run(loop)
    assert seen[1][1] == seen[0][1] + 1
    assert loop.probe.loop_iterations == len(polls)     # brought up to date at the stop


def test_timers_run_in_deadline_order_equal_deadlines_in_call_order(loop):
    order = []
    now = loop.time()
    when = now + 0.02
    for i in range(10):
        h = loop.call_at(when, order.append, ("same", i))
        assert isinstance(h, TimerHandle) and h.when() == when
    loop.call_later(0.04, order.append, ("late", 0))
    loop.call_later(0.001, order.append, ("early", 0))
    loop.call_later(0.06, loop.stop)
    run(loop)
    assert order == [("early", 0)] + [("same", i) for i in range(10)] + [("late", 0)]


def test_timers_do_not_fire_early(loop):
    fired = []
    start = loop.time()
    loop.call_later(0.05, lambda: (fired.append(loop.time()), loop.stop()))
    run(loop)
    assert fired[0] - start >= 0.05


def test_cancelled_handles_and_timers_never_run(loop):
    ran = []
    h = loop.call_soon(ran.append, "soon")
    t = loop.call_later(0.01, ran.append, "timer")
    soon_many = [loop.call_later(0.001, ran.append, f"soon{i}") for i in range(100)]
    # far-future cancelled timers must not pile up in the heap (compaction)
    many = soon_many + [loop.call_later(100, ran.append, f"far{i}") for i in range(300)]
    h.cancel()
    t.cancel()
    for m in many:
        m.cancel()
    h.cancel()  # idempotent
    assert h.cancelled() and t.cancelled() and not loop.call_soon(lambda: None).cancelled()
    loop.call_later(0.03, ran.append, "kept")
    loop.call_later(0.04, loop.stop)
    run(loop)
    assert ran == ["kept"]
    assert len(loop._timers) < 10   # cancelled entries were popped or compacted


def test_call_later_and_call_soon_reject_bad_input(loop):
    with pytest.raises(TypeError, match="callable"):
        loop.call_soon(42)
    with pytest.raises(TypeError, match="delay"):
        loop.call_later("1", print)
    with pytest.raises(ValueError, match="NaN"):
        loop.call_later(float("nan"), print)
    with pytest.raises(TypeError, match="when"):
        loop.call_at(None, print)


def test_call_soon_threadsafe_wakes_a_blocked_select(loop):
    woke = []

    def from_thread():
        time.sleep(0.1)
        loop.call_soon_threadsafe(lambda: (woke.append(loop.time()), loop.stop()))

    th = threading.Thread(target=from_thread)
    start = loop.time()
    th.start()
    try:
        run(loop, timeout=5)   # nothing else is scheduled: select blocks until woken
    finally:
        th.join()
    assert woke and woke[0] - start < 2.5


def test_stop_before_run_forever_does_one_pass(loop):
    ran = []
    loop.call_soon(ran.append, 1)
    loop.stop()
    loop.run_forever()
    assert ran == [1]
    assert not loop.is_running()


def test_probe_counts_iterations_callbacks_and_ready_max(loop):
    for _ in range(7):
        loop.call_soon(lambda: None)
    loop.call_soon(loop.stop)
    run(loop)
    assert loop.probe.callbacks_run == 8
    assert loop.probe.ready_max == 8
    assert loop.probe.loop_iterations == 1


def test_get_running_loop(loop):
    with pytest.raises(RuntimeError, match="no running"):
        get_running_loop()
    seen = []
    loop.call_soon(lambda: (seen.append(get_running_loop()), loop.stop()))
    run(loop)
    assert seen == [loop]
    with pytest.raises(RuntimeError):
        get_running_loop()


def test_run_forever_refuses_reentry_and_close_while_running(loop):
    errors = []

    def inside():
        for fn in (loop.run_forever, loop.close):
            try:
                fn()
            except RuntimeError as exc:
                errors.append(str(exc))
        loop.stop()

    loop.call_soon(inside)
    run(loop)
    assert len(errors) == 2 and "already running" in errors[0] and "running" in errors[1]


class FakeFuture:
    """The duck type run_until_complete accepts."""

    def __init__(self):
        self._callbacks = []
        self._done = False
        self._result = self._exc = None

    def add_done_callback(self, fn):
        self._callbacks.append(fn)

    def remove_done_callback(self, fn):
        self._callbacks.remove(fn)

    def done(self):
        return self._done

    def result(self):
        if self._exc:
            raise self._exc
        return self._result

    def set(self, result=None, exc=None):
        self._done, self._result, self._exc = True, result, exc
        for fn in self._callbacks:
            fn(self)


def test_run_until_complete(loop):
    fut = FakeFuture()
    loop.call_later(0.01, fut.set, 42)
    guard = loop.call_later(5, loop.stop)
    assert loop.run_until_complete(fut) == 42
    assert fut._callbacks == []

    fut = FakeFuture()
    loop.call_soon(fut.set, None, ValueError("boom"))
    with pytest.raises(ValueError, match="boom"):
        loop.run_until_complete(fut)

    fut = FakeFuture()
    loop.call_soon(loop.stop)
    with pytest.raises(RuntimeError, match="loop stopped before the future completed"):
        loop.run_until_complete(fut)
    guard.cancel()
    with pytest.raises(TypeError, match="future-like"):
        loop.run_until_complete(object())


# ---------------------------------------------------------------------------- loop: errors

def test_exception_handler_receives_errors_and_the_loop_continues(loop):
    contexts = []
    loop.set_exception_handler(lambda lp, ctx: contexts.append((lp, ctx)))
    ran = []

    def boom():
        raise ValueError("boom")

    loop.call_soon(boom)
    loop.call_soon(ran.append, "after")
    # an I/O callback that raises keeps its registration and the loop goes on
    a, b = socket.socketpair()
    try:
        def bad_reader():
            a.recv(100)
            raise KeyError("reader")

        loop.add_reader(a, bad_reader)
        b.send(b"x")
        loop.call_later(0.05, loop.stop)
        run(loop)
        assert loop.remove_reader(a) is True
        assert loop.remove_reader(a) is False
    finally:
        a.close()
        b.close()
    assert ran == ["after"]
    excs = [ctx["exception"] for _, ctx in contexts]
    assert sorted(type(e).__name__ for e in excs) == ["KeyError", "ValueError"]
    assert all(lp is loop and ctx["message"] for lp, ctx in contexts)


def test_a_reader_with_arguments_gets_them_and_its_failure_names_it(loop):
    # Registrations with arguments are bound to them once; the report of a failure
    # still names the callback that was registered, not the binding.
    contexts = []
    loop.set_exception_handler(lambda lp, ctx: contexts.append(ctx))
    a, b = socket.socketpair()
    got = []
    try:
        def reader_with_args(sock, tag, *, n=100):
            got.append((tag, sock.recv(n)))
            raise KeyError("reader")

        def writer_with_args(tag):
            got.append(tag)
            loop.remove_writer(a)

        loop.add_reader(a, reader_with_args, a, "r")
        loop.add_writer(a, writer_with_args, "w")
        b.send(b"x")
        loop.call_later(0.05, loop.stop)
        run(loop)
        assert loop.remove_reader(a) is True
    finally:
        a.close()
        b.close()
    assert "w" in got
    assert ("r", b"x") in got
    assert contexts and contexts[0]["callback"] is reader_with_args
    assert "reader_with_args" in contexts[0]["message"]


def test_reader_removed_earlier_in_the_same_batch_does_not_run(loop):
    pairs = [socket.socketpair() for _ in range(2)]
    try:
        ran = []

        def make_reader(i):
            def reader():
                ran.append(i)
                other = pairs[1 - i][0]
                assert loop.remove_reader(other) is True
                loop.remove_reader(pairs[i][0])
            return reader

        for i, (a, b) in enumerate(pairs):
            loop.add_reader(a, make_reader(i))
            b.send(b"x")          # both readable before the loop polls: one batch
        loop.call_later(0.05, loop.stop)
        run(loop)
        assert len(ran) == 1
    finally:
        for a, b in pairs:
            a.close()
            b.close()


def test_add_writer_and_remove_writer(loop):
    a, b = socket.socketpair()
    try:
        calls = []

        def writable(tag):
            calls.append(tag)
            if len(calls) == 3:
                assert loop.remove_writer(a) is True
                loop.call_later(0.02, loop.stop)

        loop.add_reader(a, lambda: None)   # reader and writer share one registration
        loop.add_writer(a, writable, "w")
        run(loop)
        assert calls == ["w", "w", "w"]
        assert loop.remove_writer(a) is False
        assert loop.remove_reader(a.fileno()) is True
    finally:
        a.close()
        b.close()


def test_protocol_base_class_is_all_no_ops():
    p = Protocol()
    assert p.connection_made(None) is None and p.data_received(b"x") is None
    assert not p.eof_received()
    assert p.connection_lost(None) is None
    assert p.pause_writing() is None and p.resume_writing() is None


def test_default_exception_handler_prints_one_line(loop, capsys):
    loop.call_soon(lambda: 1 / 0)
    loop.call_soon(loop.stop)
    run(loop)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ZeroDivisionError" in err


def test_call_exception_handler_never_raises(loop, capsys):
    def broken(lp, ctx):
        raise RuntimeError("handler bug")

    loop.set_exception_handler(broken)
    loop.call_exception_handler({"message": "original", "exception": OSError("x")})
    err = capsys.readouterr().err
    assert "handler bug" in err and "original" in err
    with pytest.raises(TypeError):
        loop.set_exception_handler("not callable")


def test_keyboard_interrupt_propagates_and_close_still_releases_everything():
    lp = Loop()
    server = lp.create_server(Protocol, "127.0.0.1", 0)
    s, c = tcp_pair()
    try:
        transport, _ = lp.connect_accepted_socket(Protocol, s)

        def interrupt():
            raise KeyboardInterrupt

        lp.call_soon(transport.write, b"x" * 10)
        lp.call_soon(interrupt)
        lp.call_later(5, lp.stop)
        with pytest.raises(KeyboardInterrupt):
            lp.run_forever()
        assert not lp.is_running()
        with pytest.raises(RuntimeError):
            get_running_loop()
    finally:
        lp.close()
        c.close()
    assert lp.is_closed() and not server.is_serving()
    assert transport.stats.closed


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                    reason="signals need the main thread")
def test_signal_handler_runs_on_the_loop(loop):
    got = []
    old_wakeup = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(old_wakeup)
    loop.add_signal_handler(signal.SIGUSR1, lambda tag: (got.append(tag), loop.stop()), "usr1")
    try:
        loop.call_soon(os.kill, os.getpid(), signal.SIGUSR1)
        run(loop, timeout=5)
    finally:
        assert loop.remove_signal_handler(signal.SIGUSR1) is True
    assert got == ["usr1"]
    assert loop.remove_signal_handler(signal.SIGUSR1) is False
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL
    assert signal.set_wakeup_fd(-1) == old_wakeup   # restored
    signal.set_wakeup_fd(old_wakeup)
    with pytest.raises(ValueError):
        loop.add_signal_handler(0, print)


# ---------------------------------------------------------------------------- echo

class FlowEcho:
    """Echo server that honours flow control: pause reading while the write
    buffer is above high water (the 2016 post's fix)."""

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.transport.write(data)

    def eof_received(self):
        return None   # close once the echo is flushed

    def connection_lost(self, exc):
        pass

    def pause_writing(self):
        self.transport.pause_reading()

    def resume_writing(self):
        self.transport.resume_reading()


def test_echo_one_threaded_client_one_mib_byte_exact(loop):
    server = loop.create_server(FlowEcho, "127.0.0.1", 0)
    assert isinstance(server, Server) and server.is_serving()
    addr = server.sockets[0].getsockname()
    result = {}

    def client():
        with socket.create_connection(addr, timeout=10) as sock:
            sender = threading.Thread(target=lambda: (sock.sendall(PAYLOAD),
                                                      sock.shutdown(socket.SHUT_WR)))
            sender.start()
            out = {}
            reader_thread(sock, out).join()
            sender.join()
            result.update(out)
        loop.call_soon_threadsafe(loop.stop)

    th = threading.Thread(target=client)
    th.start()
    try:
        run(loop, timeout=30)
    finally:
        th.join()
    assert result["end"] == "eof"
    assert bytes(result["data"]) == PAYLOAD
    (stats,) = loop.probe.connections
    assert stats.received_bytes == stats.accepted_bytes == stats.sent_bytes == MiB


class EchoClient:
    """Sends PAYLOAD with flow control, checks the echo byte-exact as it comes."""

    def __init__(self, done):
        self.done = done
        self.sent = 0
        self.received = 0
        self.mismatch = False
        self.paused = False
        self.lost = None

    def connection_made(self, transport):
        self.transport = transport
        self.pump()

    def pump(self):
        view = memoryview(PAYLOAD)
        while not self.paused and self.sent < MiB:
            n = min(64 * KiB, MiB - self.sent)
            self.transport.write(view[self.sent:self.sent + n])
            self.sent += n

    def data_received(self, data):
        n = len(data)
        if memoryview(PAYLOAD)[self.received:self.received + n] != data:
            self.mismatch = True
        self.received += n
        if self.received == MiB:
            self.transport.close()

    def eof_received(self):
        return None

    def connection_lost(self, exc):
        self.lost = exc
        self.done(self)

    def pause_writing(self):
        self.paused = True

    def resume_writing(self):
        self.paused = False
        self.pump()


def test_echo_hundred_concurrent_clients_one_mib_each_byte_exact():
    lp = Loop()
    try:
        server = lp.create_server(FlowEcho, "127.0.0.1", 0, sockbuf=SOCKBUF)
        port = server.sockets[0].getsockname()[1]
        finished, failures = [], []

        def done(client):
            finished.append(client)
            if len(finished) == 100:
                lp.stop()

        def connected(transport, protocol, exc):
            if exc is not None:
                failures.append(exc)
                lp.stop()
            else:
                assert transport.get_protocol() is protocol and protocol.transport is transport

        for _ in range(100):
            lp.create_connection(lambda: EchoClient(done), "127.0.0.1", port,
                                 callback=connected, sockbuf=SOCKBUF)
        run(lp, timeout=90)
        assert not failures
        assert len(finished) == 100
        assert all(c.received == MiB and not c.mismatch and c.lost is None for c in finished)
        # every connection (both ends) moved exactly 1 MiB each way
        assert all(s.accepted_bytes == s.sent_bytes == MiB for s in lp.probe.connections)
        assert len(lp.probe.connections) == 200
        # the echo honoured flow control: its buffers stayed near high water
        assert max(s.peak_user_buffer_bytes for s in lp.probe.connections) <= 64 * KiB + 64 * KiB
    finally:
        lp.close()


# ---------------------------------------------------------------------------- EOF, close

def test_eof_closes_by_default_and_half_close_keeps_writing_possible(loop):
    # default: eof_received returns None -> the transport closes itself
    s1, c1 = tcp_pair()
    # half-open: eof_received returns True -> we may still answer
    s2, c2 = tcp_pair()
    try:
        closer = Recorder()
        t1, _ = loop.connect_accepted_socket(lambda: closer, s1)
        half = Recorder(eof_keep_open=True)

        def answer_after_eof():
            # asyncio: an EOF kept half-open leaves the transport "reading"
            assert not half.transport.is_closing() and half.transport.is_reading()
            half.transport.write(b"reply:" + bytes(half.data))
            half.transport.close()

        half.on_eof = answer_after_eof
        t2, _ = loop.connect_accepted_socket(lambda: half, s2)
        c1.sendall(b"hello")
        c1.shutdown(socket.SHUT_WR)
        c2.sendall(b"question")
        c2.shutdown(socket.SHUT_WR)
        lost = []
        closer.on_lost = half.on_lost = lambda exc: (lost.append(exc),
                                                     len(lost) == 2 and loop.stop())
        run(loop)
        assert closer.events == ["made", "data", "eof", "lost"] and closer.lost == [None]
        assert half.events == ["made", "data", "eof", "lost"] and half.lost == [None]
        assert bytes(closer.data) == b"hello"
        out1, out2 = {}, {}
        reader_thread(c1, out1).join()
        reader_thread(c2, out2).join()
        assert out1 == {"data": bytearray(), "end": "eof"}
        assert out2 == {"data": bytearray(b"reply:question"), "end": "eof"}
    finally:
        for s in (c1, c2):
            s.close()


def test_write_eof_half_closes_and_reading_goes_on(loop):
    s, c = tcp_pair()
    try:
        proto = Recorder()
        transport, _ = loop.connect_accepted_socket(lambda: proto, s)
        assert transport.can_write_eof()

        def go():
            transport.write(b"data")
            transport.write_eof()
            with pytest.raises(RuntimeError, match="write_eof"):
                transport.write(b"more")
            out = {}
            reader_thread(c, out).join()
            assert out == {"data": bytearray(b"data"), "end": "eof"}
            c.sendall(b"still reading")
            c.shutdown(socket.SHUT_WR)

        proto.on_made = lambda t: loop.call_soon(go)
        proto.on_lost = lambda exc: loop.stop()
        run(loop)
        assert bytes(proto.data) == b"still reading"
        assert proto.lost == [None]
    finally:
        c.close()


def test_close_with_buffered_data_delivers_everything_then_eof(loop):
    s, c = tcp_pair(SOCKBUF)
    try:
        proto = Recorder()
        transport, _ = loop.connect_accepted_socket(lambda: proto, s)
        data = random.Random(3).randbytes(3 * MiB)
        state = {}

        def write_and_close():
            transport.write(data)
            transport.close()
            state["buffered_at_close"] = transport.get_write_buffer_size()
            state["lost_when_close_returned"] = list(proto.lost)
            assert transport.is_closing()
            transport.write(b"appended")  # after close, bytes still buffered: sent too
            loop.call_later(0.1, start_reader)

        def start_reader():
            state["thread"] = reader_thread(c, state.setdefault("out", {}))

        proto.on_made = lambda t: loop.call_soon(write_and_close)
        proto.on_lost = lambda exc: loop.stop()
        try:
            run(loop, timeout=30)
        finally:
            if "thread" in state:
                state["thread"].join(10)
        assert state["buffered_at_close"] > 0
        assert state["lost_when_close_returned"] == []   # close() returned before it completed
        assert proto.lost == [None]
        assert state["out"]["end"] == "eof"
        assert bytes(state["out"]["data"]) == data + b"appended"
        st = transport.stats
        assert st.sent_bytes == st.accepted_bytes == len(data) + len(b"appended")
        assert st.writes_after_close_count == 1 and st.closed   # made after close, and sent
        assert transport.get_write_buffer_size() == 0
    finally:
        c.close()


def test_close_with_empty_buffer_completes_on_a_later_pass(loop):
    s, c = tcp_pair()
    try:
        proto = Recorder()
        transport, _ = loop.connect_accepted_socket(lambda: proto, s)
        seen = {}

        def close_now():
            transport.close()
            seen["lost_after_close"] = list(proto.lost)
            seen["sock_open_after_close"] = transport.get_extra_info("socket").fileno() >= 0
            loop.call_soon(lambda: (seen.update(lost_next_pass=list(proto.lost)), loop.stop()))

        proto.on_made = lambda t: loop.call_soon(close_now)
        run(loop)
        assert seen == {"lost_after_close": [], "sock_open_after_close": True,
                        "lost_next_pass": [None]}
        assert transport.get_extra_info("socket").fileno() == -1
        transport.close()   # idempotent: connection_lost ran once
        assert proto.count("lost") == 1
    finally:
        c.close()


def test_abort_drops_the_buffer_and_counts_it(loop, caplog):
    s, c = tcp_pair(SOCKBUF)
    contexts = []
    loop.set_exception_handler(lambda lp, ctx: contexts.append(ctx))
    try:
        proto = Recorder()
        transport, _ = loop.connect_accepted_socket(lambda: proto, s)
        seen = {}

        def write_then_abort():
            transport.write(b"a" * MiB)
            seen["buffered"] = transport.get_write_buffer_size()
            transport.abort()
            seen["lost_sync"] = list(proto.lost)
            assert transport.is_closing() and transport.get_write_buffer_size() == 0
            for _ in range(6):
                transport.write(b"after abort")
            transport.abort()   # idempotent
            transport.close()   # no-op now
            loop.call_soon(loop.call_soon, loop.stop)

        proto.on_made = lambda t: loop.call_soon(write_then_abort)
        run(loop)
        st = transport.stats
        assert seen["buffered"] > 0 and seen["lost_sync"] == []
        assert st.lost_on_abort_bytes == seen["buffered"]
        assert st.sent_bytes + st.lost_on_abort_bytes == st.accepted_bytes == MiB
        assert proto.lost == [None] and proto.count("lost") == 1
        assert st.writes_after_close_count == 6
        # asyncio: silent for four, then one log line per dropped write
        warnings = [r for r in caplog.records if r.getMessage() == "socket.send() raised exception."]
        assert len(warnings) == 2 and not contexts
        assert st.closed and transport.get_extra_info("socket").fileno() == -1
    finally:
        c.close()


def test_peer_reset_mid_stream_surfaces_as_connection_lost_exc(loop):
    s, c = tcp_pair(SOCKBUF)
    try:
        proto = Recorder()
        transport, _ = loop.connect_accepted_socket(lambda: proto, s)
        state = {}

        def start():
            transport.write(b"r" * (4 * MiB))
            loop.call_later(0.05, peer_reads_then_resets)

        def peer_reads_then_resets():
            state["peer_got"] = len(c.recv(64 * KiB))
            c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            c.close()   # RST

        def lost(exc):
            # later writes are dropped and counted, not raised
            transport.write(b"into the void")
            loop.stop()

        proto.on_made = lambda t: loop.call_soon(start)
        proto.on_lost = lost
        run(loop)
        assert state["peer_got"] > 0
        (exc,) = proto.lost
        assert isinstance(exc, (ConnectionResetError, BrokenPipeError)), exc
        st = transport.stats
        assert st.lost_on_abort_bytes > 0 and accounting_ok(st, transport)
        assert st.writes_after_close_count == 1 and st.closed
    finally:
        c.close()


def test_a_failing_data_received_is_the_transports_fatal_error(loop):
    s, c = tcp_pair()
    try:
        proto = Recorder()
        seen = []
        loop.set_exception_handler(lambda lp, ctx: seen.append(ctx))

        def boom(data):
            raise ValueError("bad frame")

        proto.on_data = boom
        proto.on_lost = lambda exc: loop.stop()
        transport, _ = loop.connect_accepted_socket(lambda: proto, s)
        c.sendall(b"x" * 100)
        run(loop)
        (exc,) = proto.lost
        assert isinstance(exc, ValueError) and str(exc) == "bad frame"
        assert [ctx["message"] for ctx in seen] == ["protocol.data_received() failed"]
        assert transport.stats.received_bytes == 100 and transport.is_closing()
        assert c.recv(10) == b""            # the transport closed its socket
    finally:
        c.close()


def test_an_empty_write_does_not_touch_the_socket(loop):
    # asyncio returns on b"" before the socket: a reset waiting on it surfaces at
    # the next read, not in the empty write
    import time
    s, c = tcp_pair()
    try:
        proto = Recorder()
        transport, _ = loop.connect_accepted_socket(lambda: proto, s)
        loop.call_soon(loop.stop)
        run(loop)
        c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        c.close()                                   # RST
        time.sleep(0.05)
        transport.write(b"")
        assert not transport.is_closing() and proto.lost == []
        transport.abort()
    finally:
        c.close()


def test_the_pass_reads_a_plain_transport_and_forgets_it_when_reading_stops():
    # the stream slot follows the reader: set by the transport's registration,
    # cleared by pause_reading (remove_reader) and by any other reader on the fd
    lp = Loop()
    s, c = tcp_pair()
    try:
        proto = Recorder()
        transport, _ = lp.connect_accepted_socket(lambda: proto, s)
        lp.call_soon(lp.stop)
        run(lp)
        fd = s.fileno()
        assert lp._fds[fd][2] is transport and lp._fds[fd][0] == transport._read_ready
        transport.pause_reading()
        assert fd not in lp._fds
        transport.resume_reading()
        assert lp._fds[fd][2] is transport
        lp.add_reader(fd, lambda: None)
        assert lp._fds[fd][2] is None
        lp.remove_reader(fd)
        transport.abort()
    finally:
        c.close()
        lp.close()


# ---------------------------------------------------------------------------- flow control

def test_pause_writing_once_when_crossing_high_resume_at_low(loop):
    s, c = tcp_pair(SOCKBUF)
    c.setblocking(False)
    try:
        proto = Recorder()
        transport, _ = loop.connect_accepted_socket(lambda: proto, s)
        high = 64 * KiB
        low = 16 * KiB
        state = {"drained": 0}

        def fill():
            chunk = 8 * KiB
            fill_until_paused(loop, transport, proto, chunk=chunk)
            size = transport.get_write_buffer_size()
            assert high < size <= high + chunk   # paused by the write that crossed high
            st = transport.stats
            assert st.written_while_paused_bytes == 0
            for _ in range(5):
                transport.write(b"p" * chunk)   # keep writing while paused
            assert proto.count("pause") == 1 and st.pause_writing_count == 1
            assert st.written_while_paused_bytes == 5 * chunk
            assert st.peak_user_buffer_bytes == transport.get_write_buffer_size()
            loop.add_reader(c, drain)    # now the peer starts reading

        def drain():
            try:
                while True:
                    chunk = c.recv(256 * KiB)
                    if not chunk:
                        break
                    state["drained"] += len(chunk)
            except BlockingIOError:
                pass
            st = transport.stats
            if state["drained"] == st.accepted_bytes:
                loop.remove_reader(c)
                loop.stop()

        proto.on_made = lambda t: loop.call_soon(fill)
        run(loop)
        pauses = [e for e in proto.events if isinstance(e, tuple)]
        assert [p[0] for p in pauses] == ["pause", "resume"]
        assert pauses[0][1] > high
        assert pauses[1][1] <= low    # resumed at or below the low-water mark
        assert transport.get_write_buffer_size() == 0
        assert transport.get_write_buffer_limits() == (low, high)
    finally:
        c.close()


def test_lowering_limits_below_buffered_size_calls_pause_writing_asyncio_140(loop):
    s, c = tcp_pair(SOCKBUF)
    try:
        proto = Recorder()
        transport, _ = loop.connect_accepted_socket(lambda: proto, s)
        seen = {}

        def go():
            transport.set_write_buffer_limits(high=50 * MiB)   # never pauses
            transport.write(b"k" * (2 * MiB))                  # kernel fills, rest buffered
            size = transport.get_write_buffer_size()
            assert size > 0 and proto.count("pause") == 0
            transport.set_write_buffer_limits(high=size - 1)  # below what is buffered
            seen["paused_at_once"] = proto.count("pause")
            seen["low"] = transport.get_write_buffer_limits()[0]
            loop.stop()

        proto.on_made = lambda t: loop.call_soon(go)
        run(loop)
        assert seen["paused_at_once"] == 1
        assert transport.stats.pause_writing_count == 1
    finally:
        c.close()


def test_resume_writing_fires_at_low_water_not_at_empty(loop):
    # With low water (1 MiB) far above what one send can take (the socket buffers
    # are ~64 KiB each), the drain must pass through (0, low]: resume fires there.
    s, c = tcp_pair(SOCKBUF)
    c.setblocking(False)
    try:
        proto = Recorder()
        transport, _ = loop.connect_accepted_socket(lambda: proto, s)
        total = 3 * MiB

        def go():
            transport.set_write_buffer_limits(high=2 * MiB, low=MiB)
            transport.write(b"d" * total)
            assert proto.count("pause") == 1
            loop.add_reader(c, drain)

        got = [0]

        def drain():
            try:
                while True:
                    chunk = c.recv(256 * KiB)
                    if not chunk:
                        break
                    got[0] += len(chunk)
            except BlockingIOError:
                pass
            if got[0] == total:
                loop.remove_reader(c)
                loop.stop()

        proto.on_made = lambda t: loop.call_soon(go)
        run(loop, timeout=30)
        pauses = [e for e in proto.events if isinstance(e, tuple)]
        assert [p[0] for p in pauses] == ["pause", "resume"]
        assert 0 < pauses[1][1] <= MiB
    finally:
        c.close()


def test_set_write_buffer_limits_rules(loop):
    s, c = tcp_pair()
    try:
        transport, proto = loop.connect_accepted_socket(Recorder, s)
        transport.set_write_buffer_limits(high=4000)
        assert transport.get_write_buffer_limits() == (1000, 4000)
        transport.set_write_buffer_limits(low=100)
        assert transport.get_write_buffer_limits() == (100, 400)
        transport.set_write_buffer_limits(high=10, low=10)
        assert transport.get_write_buffer_limits() == (10, 10)
        transport.set_write_buffer_limits()
        assert transport.get_write_buffer_limits() == (16384, 65536)
        transport.set_write_buffer_limits(0)
        assert transport.get_write_buffer_limits() == (0, 0)
        with pytest.raises(ValueError, match="high >= low"):
            transport.set_write_buffer_limits(high=10, low=20)
        with pytest.raises(ValueError, match="high >= low >= 0"):
            transport.set_write_buffer_limits(low=-1)
        with pytest.raises(TypeError):
            transport.set_write_buffer_limits(high="big")
    finally:
        c.close()


def test_limits_zero_pause_on_any_buffered_byte_resume_at_empty(loop):
    s, c = tcp_pair(SOCKBUF)
    c.setblocking(False)
    try:
        proto = Recorder()
        transport, _ = loop.connect_accepted_socket(lambda: proto, s)

        def go():
            transport.set_write_buffer_limits(0)
            fill_until_paused(loop, transport, proto, chunk=4 * KiB)
            assert transport.get_write_buffer_size() > 0
            loop.add_reader(c, drain)

        def drain():
            try:
                while c.recv(256 * KiB):
                    pass
            except BlockingIOError:
                pass
            if proto.count("resume"):
                loop.remove_reader(c)
                loop.stop()

        proto.on_made = lambda t: loop.call_soon(go)
        run(loop)
        pauses = [e for e in proto.events if isinstance(e, tuple)]
        assert pauses[0][0] == "pause" and pauses[1] == ("resume", 0)
    finally:
        c.close()


def test_writelines_applies_flow_control_cpython_127655(loop):
    s, c = tcp_pair(SOCKBUF)
    try:
        proto = Recorder()
        transport, _ = loop.connect_accepted_socket(lambda: proto, s)
        seen = {}

        def go():
            transport.writelines([b"w" * 100_000] * 10 + [bytearray(b"b" * 10), memoryview(b"mv")])
            seen["size"] = transport.get_write_buffer_size()
            seen["pauses"] = proto.count("pause")
            with pytest.raises(TypeError, match="writelines"):
                transport.writelines(["str"])
            loop.stop()

        proto.on_made = lambda t: loop.call_soon(go)
        run(loop)
        assert seen["size"] > 64 * KiB and seen["pauses"] == 1
        st = transport.stats
        assert st.accepted_bytes == 1_000_012 and accounting_ok(st, transport)
        assert st.peak_user_buffer_bytes == seen["size"]
    finally:
        c.close()


def test_pause_writing_errors_go_to_the_exception_handler(loop):
    s, c = tcp_pair(SOCKBUF)
    contexts = []
    loop.set_exception_handler(lambda lp, ctx: contexts.append(ctx))
    try:
        proto = Recorder()

        def bad_pause():
            raise ValueError("pause bug")

        proto.on_pause = bad_pause
        transport, _ = loop.connect_accepted_socket(lambda: proto, s)
        proto.on_made = lambda t: loop.call_soon(lambda: (t.write(b"x" * (2 * MiB)),
                                                          loop.stop()))
        run(loop)
        assert [type(ctx["exception"]) for ctx in contexts] == [ValueError]
        assert "pause_writing" in contexts[0]["message"]
        assert not transport.is_closing()   # an advisory callback failing is not fatal
    finally:
        c.close()


# ---------------------------------------------------------------------------- write modes & stats

@pytest.mark.parametrize("mode", ["try-send", "defer"])
def test_write_mode_try_send_sends_inside_write_defer_never_does(mode):
    lp = Loop(write=mode)
    s, c = tcp_pair()
    try:
        proto = Recorder()
        transport, _ = lp.connect_accepted_socket(lambda: proto, s)
        seen = {}

        def go():
            for i in range(3):
                transport.write(b"m" * 1000)
                seen.setdefault("after_write", []).append(
                    (transport.stats.sent_bytes, transport.get_write_buffer_size()))
            lp.call_later(0.05, lp.stop)

        proto.on_made = lambda t: lp.call_soon(go)
        run(lp)
        if mode == "defer":
            assert seen["after_write"] == [(0, 1000), (0, 2000), (0, 3000)]
        else:
            assert seen["after_write"] == [(1000, 0), (2000, 0), (3000, 0)]
        # either way the bytes arrive, on the writable callback for "defer"
        assert transport.stats.sent_bytes == 3000 and transport.get_write_buffer_size() == 0
        c.settimeout(5)
        got = b""
        while len(got) < 3000:
            got += c.recv(4096)
        assert got == b"m" * 3000
    finally:
        lp.close()
        c.close()


def test_write_buffer_size_equals_accepted_minus_sent_after_every_write(loop):
    s, c = tcp_pair(SOCKBUF)
    c.setblocking(False)
    try:
        proto = Recorder()
        transport, _ = loop.connect_accepted_socket(lambda: proto, s)
        rng = random.Random(7)
        checks = []
        peak = [0]

        def check():
            st = transport.stats
            size = transport.get_write_buffer_size()
            peak[0] = max(peak[0], size)
            checks.append(size == st.accepted_bytes - st.sent_bytes == st.user_buffer_bytes
                          and st.peak_user_buffer_bytes == peak[0])

        def writes(n):
            for _ in range(n):
                transport.write(os.urandom(rng.randrange(1, 40 * KiB)))
                check()

        def drain():
            try:
                while c.recv(256 * KiB):
                    pass
            except BlockingIOError:
                pass
            check()
            if transport.get_write_buffer_size() == 0:
                loop.remove_reader(c)
                loop.stop()

        def go():
            writes(60)
            loop.add_reader(c, drain)
            writes(20)

        proto.on_made = lambda t: loop.call_soon(go)
        run(loop)
        assert len(checks) > 80 and all(checks)
        assert peak[0] > 64 * KiB
    finally:
        c.close()


def test_write_rejects_bad_types_and_ignores_empty(loop):
    s, c = tcp_pair()
    try:
        transport, _ = loop.connect_accepted_socket(Recorder, s)
        with pytest.raises(TypeError, match="bytes, bytearray or memoryview"):
            transport.write("text")
        with pytest.raises(TypeError):
            transport.write(None)
        transport.write(b"")
        transport.write(memoryview(b""))
        assert transport.stats.accepted_bytes == 0
        transport.write(memoryview(struct.pack("4i", 1, 2, 3, 4)).cast("i"))
        assert transport.stats.accepted_bytes == 16
    finally:
        c.close()


def test_pause_and_resume_reading_are_idempotent_and_counted(loop):
    s, c = tcp_pair()
    try:
        proto = Recorder()
        transport, _ = loop.connect_accepted_socket(lambda: proto, s)
        seen = {}

        def paused():
            transport.pause_reading()
            transport.pause_reading()
            assert not transport.is_reading()
            c.sendall(b"while paused")
            loop.call_later(0.05, check_then_resume)

        def check_then_resume():
            seen["data_while_paused"] = bytes(proto.data)
            transport.resume_reading()
            transport.resume_reading()
            assert transport.is_reading()
            loop.call_later(0.05, loop.stop)

        proto.on_made = lambda t: loop.call_soon(paused)
        run(loop)
        assert seen["data_while_paused"] == b""
        assert bytes(proto.data) == b"while paused"
        assert transport.stats.read_pauses_count == 1
    finally:
        c.close()


def test_transport_extra_info_and_protocol_swap(loop):
    s, c = tcp_pair()
    try:
        transport, proto = loop.connect_accepted_socket(Recorder, s)
        assert isinstance(transport, SocketTransport)
        assert transport.get_extra_info("peername") == c.getsockname()
        assert transport.get_extra_info("sockname") == c.getpeername()
        assert transport.get_extra_info("socket") is s
        assert transport.get_extra_info("nope", 7) == 7
        other = Recorder()
        transport.set_protocol(other)
        assert transport.get_protocol() is other
        loop.call_soon(loop.stop)
        run(loop)
        assert other.events == ["made"] and proto.events == []
    finally:
        c.close()


def test_trace_records_writes_sends_pauses_and_closes():
    lp = Loop(trace=True)
    s, c = tcp_pair(SOCKBUF)
    try:
        proto = Recorder()
        transport, _ = lp.connect_accepted_socket(lambda: proto, s)

        def go():
            transport.write(b"t" * (2 * MiB))
            transport.abort()
            lp.call_soon(lp.call_soon, lp.stop)

        proto.on_made = lambda t: lp.call_soon(go)
        run(lp)
        trace = lp.probe.trace
        names = [e.get("name") for e in trace.events]
        for expected in ("write", "send", "pause_writing", "user_buffer_bytes", "abort",
                         "close_completed"):
            assert expected in names, expected
        write_ev = next(e for e in trace.events if e.get("name") == "write")
        assert write_ev["args"]["bytes"] == 2 * MiB and write_ev["tid"] == 0
        assert trace.to_chrome()["traceEvents"][0]["ph"] == "M"   # the track is named
    finally:
        lp.close()
        c.close()


# ---------------------------------------------------------------------------- connections & servers

def test_create_connection_success_calls_back_after_connection_made(loop):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    try:
        results = []

        def connected(transport, protocol, exc):
            results.append((transport, protocol, exc, list(protocol.events)))
            transport.close()
            loop.call_later(0.01, loop.stop)

        loop.create_connection(Recorder, "127.0.0.1", listener.getsockname()[1],
                               callback=connected)
        run(loop)
        (transport, protocol, exc, events_then), = results
        assert exc is None and events_then == ["made"] and protocol.transport is transport
        with pytest.raises(TypeError):
            loop.create_connection(Recorder, "127.0.0.1", 1, callback=None)
    finally:
        listener.close()


def test_create_connection_refused_calls_back_with_the_error(loop):
    probe_sock = socket.socket()
    probe_sock.bind(("127.0.0.1", 0))
    port = probe_sock.getsockname()[1]
    probe_sock.close()   # nothing listens there now
    results = []
    loop.create_connection(Recorder, "127.0.0.1", port,
                           callback=lambda *a: (results.append(a), loop.stop()))
    run(loop)
    assert len(results) == 1
    transport, protocol, exc = results[0]
    assert transport is None and protocol is None
    assert isinstance(exc, ConnectionRefusedError)


def test_no_dns_and_bad_addresses_are_clear_errors(loop):
    with pytest.raises(ValueError, match="literal IP"):
        loop.create_server(Recorder, "localhost", 0)
    with pytest.raises(ValueError, match="literal IP"):
        loop.create_connection(Recorder, "example.com", 80, callback=print)
    with pytest.raises(ValueError, match="port"):
        loop.create_server(Recorder, "127.0.0.1", 70000)
    with pytest.raises(ValueError, match="port"):
        loop.create_server(Recorder, "127.0.0.1")
    with pytest.raises(TypeError):
        loop.add_reader("not a socket", print)


def test_port_in_use_raises_oserror_from_bind(loop):
    server = loop.create_server(Recorder, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    with pytest.raises(OSError):
        loop.create_server(Recorder, "127.0.0.1", port)


def test_create_server_with_bound_sock_and_sockbuf(loop):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    protos = []

    def factory():
        protos.append(Recorder())
        protos[-1].on_made = lambda t: loop.stop()
        return protos[-1]

    server = loop.create_server(factory, sock=sock, sockbuf=SOCKBUF)
    assert server.sockets == (sock,)
    with socket.create_connection(sock.getsockname(), timeout=5):
        run(loop)
    accepted = protos[0].transport.get_extra_info("socket")
    assert accepted.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) <= 4 * SOCKBUF
    assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1


def test_server_close_stops_accepting_but_connections_live_on(loop):
    protos = []

    def factory():
        p = Recorder()
        p.on_data = lambda data: p.transport.write(data.upper())
        protos.append(p)
        return p

    server = loop.create_server(factory, "127.0.0.1", 0)
    addr = server.sockets[0].getsockname()
    c = socket.create_connection(addr, timeout=5)
    try:
        loop.call_later(0.05, loop.stop)
        run(loop)
        server.close()
        server.close()
        assert not server.is_serving() and server.sockets[0].fileno() == -1
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(addr, timeout=5).close()
        c.sendall(b"still here")
        got = []
        protos[0].on_data = lambda data: (protos[0].transport.write(data.upper()),
                                          loop.call_later(0.05, loop.stop))
        run(loop)
        got = c.recv(100)
        assert got == b"STILL HERE" and len(protos) == 1
    finally:
        c.close()


def test_connection_made_runs_before_data_and_reading_starts_after_it(loop):
    s, c = tcp_pair()
    try:
        c.sendall(b"early bytes")
        proto = Recorder()
        proto.on_made = lambda t: t.pause_reading()   # pausing in connection_made holds data
        transport, _ = loop.connect_accepted_socket(lambda: proto, s)
        assert proto.events == []                      # not synchronous
        loop.call_later(0.05, loop.stop)
        run(loop)
        assert proto.events == ["made"]
        transport.resume_reading()
        loop.call_later(0.05, loop.stop)
        run(loop)
        assert proto.events == ["made", "data"] and bytes(proto.data) == b"early bytes"
    finally:
        c.close()


def test_protocol_errors_close_the_transport_with_the_error(loop):
    s, c = tcp_pair()
    contexts = []
    loop.set_exception_handler(lambda lp, ctx: contexts.append(ctx))
    try:
        proto = Recorder()

        def bad(data):
            raise ValueError("parser bug")

        proto.on_data = bad
        proto.on_lost = lambda exc: loop.stop()
        loop.connect_accepted_socket(lambda: proto, s)
        c.sendall(b"x")
        run(loop)
        assert isinstance(proto.lost[0], ValueError)
        assert "data_received" in contexts[0]["message"]
    finally:
        c.close()


# ---------------------------------------------------------------------------- exit policies

def _write_close_stop(lp, c, size, *, reader_delay=None):
    """The S3 program on the callback port: write a lot, close, stop the loop.
    Returns (transport, reader_out, reader_thread)."""
    proto = Recorder()
    out = {}
    th = None
    if reader_delay is not None:
        th = reader_thread(c, out, delay=reader_delay)

    def go(transport):
        transport.write(PAYLOAD * (size // MiB))
        transport.close()
        lp.stop()

    proto.on_made = lambda t: lp.call_soon(go, t)
    return proto, out, th


@pytest.mark.parametrize("policy", ["cancel", "raise"])
def test_exit_cancel_and_raise_drop_and_count_unsent_bytes(policy):
    lp = Loop(exit=policy)
    s, c = tcp_pair(SOCKBUF)
    try:
        proto, _, _ = _write_close_stop(lp, c, 2 * MiB)
        transport, _ = lp.connect_accepted_socket(lambda: proto, s)
        run(lp)
        buffered = transport.get_write_buffer_size()
        assert buffered > 0 and proto.lost == []   # the close never completed
        if policy == "raise":
            with pytest.raises(UnsentDataError) as info:
                lp.close()
            assert info.value.bytes_unsent == buffered
        else:
            lp.close()
        lp.close()   # idempotent, and raises only once
        st = transport.stats
        assert st.lost_on_exit_bytes == buffered and st.closed
        assert st.sent_bytes + st.lost_on_exit_bytes == st.accepted_bytes == 2 * MiB
        assert lp.probe.exit_report == {"policy": policy, "transports_open_count": 1,
                                        "unsent_bytes": buffered}
        # what was handed to the OS still arrives, then EOF
        out = {}
        reader_thread(c, out).join(10)
        assert out["end"] == "eof" and len(out["data"]) == st.sent_bytes
        assert bytes(out["data"]) == (PAYLOAD * 2)[:st.sent_bytes]
    finally:
        lp.close() if not lp.is_closed() else None
        c.close()


def test_exit_wait_flushes_everything_before_run_forever_returns():
    lp = Loop(exit="wait")
    s, c = tcp_pair(SOCKBUF)
    th = None
    try:
        proto, out, th = _write_close_stop(lp, c, 2 * MiB, reader_delay=0.3)
        transport, _ = lp.connect_accepted_socket(lambda: proto, s)
        run(lp, timeout=30)
        assert transport.get_write_buffer_size() == 0
        assert proto.lost == [None]          # the close completed before run_forever returned
        lp.close()
        assert lp.probe.exit_report == {"policy": "wait", "transports_open_count": 0,
                                        "unsent_bytes": 0}
        th.join(10)
        assert out["end"] == "eof" and bytes(out["data"]) == PAYLOAD * 2
        assert transport.stats.lost_on_exit_bytes == 0
    finally:
        if th is not None:
            th.join(10)
        lp.close()
        c.close()


def test_exit_wait_is_bounded_and_counts_the_rest_as_lost():
    lp = Loop(exit="wait")
    lp.exit_wait_s = 0.3
    s, c = tcp_pair(SOCKBUF)
    try:
        proto, _, _ = _write_close_stop(lp, c, 2 * MiB)   # the peer never reads
        transport, _ = lp.connect_accepted_socket(lambda: proto, s)
        start = time.monotonic()
        run(lp, timeout=30)
        waited = time.monotonic() - start
        assert 0.3 <= waited < 10
        buffered = transport.get_write_buffer_size()
        assert buffered > 0
        lp.close()
        assert lp.probe.exit_report["unsent_bytes"] == buffered
        assert transport.stats.lost_on_exit_bytes == buffered
    finally:
        lp.close()
        c.close()


def test_exit_wait_second_stop_ends_the_wait():
    lp = Loop(exit="wait")
    s, c = tcp_pair(SOCKBUF)
    try:
        proto, _, _ = _write_close_stop(lp, c, 2 * MiB)
        lp.connect_accepted_socket(lambda: proto, s)
        lp.call_later(0.2, lp.stop)
        start = time.monotonic()
        run(lp, timeout=30)
        assert time.monotonic() - start < 5
    finally:
        lp.close()
        c.close()


def test_close_releases_servers_transports_pending_connects_and_the_selector():
    lp = Loop()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    s, c = tcp_pair()
    try:
        server = lp.create_server(Recorder, "127.0.0.1", 0)
        transport, _ = lp.connect_accepted_socket(Recorder, s)
        # never run: the connect stays pending, the server never accepts
        lp.create_connection(Recorder, "127.0.0.1", listener.getsockname()[1],
                             callback=lambda *a: None)
        lp.call_later(100, print)
        lp.close()
        assert lp.is_closed() and not server.is_serving() and transport.stats.closed
        assert lp.probe.exit_report == {"policy": "cancel", "transports_open_count": 1,
                                        "unsent_bytes": 0}
        with pytest.raises(RuntimeError, match="closed"):
            lp.call_soon(print)
        with pytest.raises(RuntimeError, match="closed"):
            lp.run_forever()
    finally:
        lp.close()
        listener.close()
        c.close()
    # the autouse fixture checks that no fd survived (selector, self-pipe, sockets)


# ---------------------------------------------------------------------------- asyncio's edges

def test_write_after_close_with_nothing_buffered_drops_silently_then_logs(loop, caplog):
    s, c = tcp_pair()
    try:
        proto = Recorder()
        transport, _ = loop.connect_accepted_socket(lambda: proto, s)
        logged = []

        def close_then_write():
            transport.close()
            for i in range(6):
                transport.write(b"late")
                logged.append(sum(r.getMessage() == "socket.send() raised exception."
                                  for r in caplog.records))
            loop.call_soon(loop.call_soon, loop.stop)

        proto.on_made = lambda t: loop.call_soon(close_then_write)
        run(loop)
        assert logged == [0, 0, 0, 0, 1, 2]        # from the fifth write on
        assert transport.stats.writes_after_close_count == 6
        assert transport.stats.accepted_bytes == 0 and proto.lost == [None]
    finally:
        c.close()


def test_write_after_a_completed_buffered_close_is_dropped_not_raised(loop):
    # asyncio raises AttributeError here (its own bug); we drop and count.
    s, c = tcp_pair()
    try:
        proto = Recorder()
        transport, _ = loop.connect_accepted_socket(lambda: proto, s)
        c.setblocking(False)

        def lost(exc):
            transport.write(b"after the end")
            loop.stop()

        def write_and_close():
            transport.write(b"x" * (4 * MiB))
            transport.close()
            assert transport.get_write_buffer_size() > 0
            drain()

        def drain():
            try:
                while c.recv(1 << 20):
                    pass
            except BlockingIOError:
                pass
            if not proto.lost:
                loop.call_later(0.005, drain)

        proto.on_made = lambda t: loop.call_soon(write_and_close)
        proto.on_lost = lost
        run(loop, timeout=30)
        assert proto.lost == [None] and transport.stats.writes_after_close_count == 1
    finally:
        c.close()


def test_lowering_the_limits_after_close_pauses_while_the_buffer_drains(loop):
    s, c = tcp_pair(SOCKBUF)
    try:
        proto = Recorder()
        transport, _ = loop.connect_accepted_socket(lambda: proto, s)
        seen = {}

        def write_close_lower():
            transport.set_write_buffer_limits(high=8 * MiB)
            transport.write(b"p" * MiB)
            transport.close()
            seen["before"] = [e for e in proto.events if e[0] == "pause"]
            transport.set_write_buffer_limits(high=1024)
            seen["after"] = [e for e in proto.events if e[0] == "pause"]
            transport.abort()
            loop.call_soon(loop.call_soon, loop.stop)

        proto.on_made = lambda t: loop.call_soon(write_close_lower)
        run(loop)
        assert seen["before"] == [] and len(seen["after"]) == 1
    finally:
        c.close()


def test_pause_and_resume_reading_after_a_kept_eof_reads_the_eof_again(loop):
    s, c = tcp_pair()
    try:
        proto = Recorder(eof_keep_open=True)
        transport, _ = loop.connect_accepted_socket(lambda: proto, s)

        def on_eof():
            if proto.count("eof") == 1:
                assert transport.is_reading()
                loop.call_soon(pause_resume)
            else:
                loop.call_soon(loop.stop)

        def pause_resume():
            assert transport.is_reading()      # asyncio: still True after the EOF
            transport.pause_reading()
            assert not transport.is_reading()
            transport.resume_reading()

        proto.on_eof = on_eof
        c.shutdown(socket.SHUT_WR)
        run(loop)
        assert proto.count("eof") == 2         # asyncio calls eof_received() again
        transport.abort()
    finally:
        c.close()


def test_write_of_nothing_after_write_eof_raises(loop):
    s, c = tcp_pair()
    try:
        transport, _ = loop.connect_accepted_socket(Protocol, s)
        transport.write_eof()
        with pytest.raises(RuntimeError, match="write_eof"):
            transport.write(b"")
        with pytest.raises(RuntimeError, match="write_eof"):
            transport.write(b"more")
    finally:
        c.close()


# ---------------------------------------------------------------------------- the I/O seam

def test_loop_takes_its_poller_waker_clock_and_sockets_from_the_io_seam():
    from kernels.io import RealIO, SelectorsPoller, SocketWaker
    made = []

    class Recording(RealIO):
        # a clock 1000 s ahead of the OS's: the loop must use this one
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

    io = Recording()
    with Loop(io=io) as lp:
        assert made == ["poller", "waker"]
        assert abs(lp.time() - io.time()) < 1.0 and lp.time() > time.monotonic() + 999
        got = []

        class Echo(Protocol):
            def connection_made(self, transport):
                self.transport = transport

            def data_received(self, data):
                self.transport.write(data)

        server = lp.create_server(Echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]

        class Client(Protocol):
            def connection_made(self, transport):
                transport.write(b"ping")

            def data_received(self, data):
                got.append(data)
                lp.stop()

        def connected(transport, protocol, exc):
            assert exc is None

        lp.create_connection(Client, "127.0.0.1", port, callback=connected)
        run(lp)
        server.close()
    assert made == ["poller", "waker", "socket", "socket"]
    assert b"ping" in got


# ---------------------------------------------------------------------------- zoo options
# Each option brings back one library version's edge (bench/zoo/); both values are
# checked on the same program: the default is asyncio 3.11's behaviour.

def _option_loop(**options):
    lp = Loop(**options)
    return lp


@pytest.mark.timeout(30)
@pytest.mark.parametrize("value, delivered", [("flush-if-buffered", True), ("drop", False)])
def test_write_after_close_option_cpython_115514(value, delivered):
    loop = _option_loop(write_after_close=value)
    s, c = tcp_pair(SOCKBUF)
    try:
        proto = Recorder()
        transport, _ = loop.connect_accepted_socket(lambda: proto, s)
        seen = {}

        def go():
            transport.write(b"a" * MiB)
            transport.close()
            seen["buffered"] = transport.get_write_buffer_size()
            transport.write(b"late")

        proto.on_made = lambda t: loop.call_soon(go)
        proto.on_lost = lambda exc: loop.stop()
        got = {}
        reader = reader_thread(c, got, delay=0.1)
        run(loop, timeout=20)
        reader.join(10)
        st = transport.stats
        expected = MiB + (4 if delivered else 0)
        assert seen["buffered"] > 0 and st.writes_after_close_count == 1
        assert st.accepted_bytes == expected and accounting_ok(st, transport)
        assert got["end"] == "eof" and len(got["data"]) == expected
        assert got["data"].endswith(b"late") is delivered
    finally:
        c.close()
        loop.close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("value, pauses", [(True, 1), (False, 0)])
def test_limits_recheck_option_asyncio_140(value, pauses):
    loop = _option_loop(limits_recheck=value)
    s, c = tcp_pair(SOCKBUF)
    try:
        proto = Recorder()
        transport, _ = loop.connect_accepted_socket(lambda: proto, s)
        seen = {}

        def go():
            transport.set_write_buffer_limits(high=50 * MiB)
            transport.write(b"k" * (2 * MiB))
            size = transport.get_write_buffer_size()
            transport.set_write_buffer_limits(high=size - 1)
            seen["after_lowering"] = proto.count("pause")
            transport.write(b"k")                  # the next write makes the check
            seen["after_next_write"] = proto.count("pause")
            loop.stop()

        proto.on_made = lambda t: loop.call_soon(go)
        run(loop)
        assert seen["after_lowering"] == pauses
        assert seen["after_next_write"] == 1
    finally:
        c.close()
        loop.close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("value, pauses", [("checked", 1), ("unchecked", 0)])
def test_writelines_option_cpython_127655(value, pauses):
    loop = _option_loop(writelines=value)
    s, c = tcp_pair(SOCKBUF)
    try:
        proto = Recorder()
        transport, _ = loop.connect_accepted_socket(lambda: proto, s)
        seen = {}

        def go():
            transport.writelines([b"w" * 100_000] * 10)
            seen["size"] = transport.get_write_buffer_size()
            seen["pauses"] = proto.count("pause")
            seen["limits"] = transport.get_write_buffer_limits()
            transport.write(b"x")                  # write() itself still checks
            seen["pauses_after_write"] = proto.count("pause")
            loop.stop()

        proto.on_made = lambda t: loop.call_soon(go)
        run(loop)
        assert seen["size"] > 64 * KiB and seen["pauses"] == pauses
        assert seen["limits"] == (16 * KiB, 64 * KiB) and seen["pauses_after_write"] == 1
        st = transport.stats
        assert st.accepted_bytes == 1_000_001 and accounting_ok(st, transport)
    finally:
        c.close()
        loop.close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("value", ["free", "keep"])
def test_buffer_on_loss_option_uvloop_548(value):
    from kernels.callback import transports
    loop = _option_loop(buffer_on_loss=value)
    s, c = tcp_pair(SOCKBUF)
    try:
        proto = Recorder()
        transport, _ = loop.connect_accepted_socket(lambda: proto, s)

        def go():
            transport.write(b"a" * MiB)
            transport.abort()
            loop.call_soon(loop.call_soon, loop.stop)

        proto.on_made = lambda t: loop.call_soon(go)
        run(loop)
        st = transport.stats
        # The bytes are lost either way and the transport says so; only the memory differs.
        assert transport.get_write_buffer_size() == 0 and st.lost_on_abort_bytes > 0
        assert accounting_ok(st, transport)
        kept = sum(len(b) for b in transports._kept_buffers.get(loop, ()))
        assert kept == (st.lost_on_abort_bytes if value == "keep" else 0)
    finally:
        c.close()
        loop.close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("value", ["bytearray", "deque"])
def test_write_buffer_option_cpython_146507(value):
    # Both buffers deliver the same bytes in order with the same flow control; the
    # deque's size is a sum over its chunks (3.12), the bytearray's a length.
    loop = _option_loop(write_buffer=value)
    s, c = tcp_pair(SOCKBUF)
    try:
        proto = Recorder()
        transport, _ = loop.connect_accepted_socket(lambda: proto, s)
        expected = b"".join(bytes([i % 251]) * 1000 for i in range(3000)) + b"tail"
        seen = {}

        def go():
            for i in range(3000):
                transport.write(bytes([i % 251]) * 1000)
            transport.write(memoryview(b"tail"))
            seen["chunks"] = sum(1 for _ in transport._buffer) if value == "deque" else None
            seen["size"] = transport.get_write_buffer_size()
            seen["pauses"] = proto.count("pause")
            transport.close()

        proto.on_made = lambda t: loop.call_soon(go)
        proto.on_lost = lambda exc: loop.stop()
        got = {}
        reader = reader_thread(c, got, delay=0.1)
        run(loop, timeout=20)
        reader.join(10)
        assert bytes(got["data"]) == expected
        assert seen["pauses"] == 1 and seen["size"] > 64 * KiB
        if value == "deque":
            assert seen["chunks"] > 1      # one entry per write still buffered
        st = transport.stats
        assert st.sent_bytes == st.accepted_bytes == len(expected)
        assert st.peak_user_buffer_bytes >= seen["size"] and accounting_ok(st, transport)
    finally:
        c.close()
        loop.close()


def test_zoo_options_reject_bad_values():
    for opt, bad in (("write_after_close", "maybe"), ("limits_recheck", "sometimes"),
                     ("writelines", "fast"), ("buffer_on_loss", "leak"),
                     ("write_buffer", "list")):
        with pytest.raises(OptionError, match=f"option {opt}"):
            Loop(**{opt: bad})
