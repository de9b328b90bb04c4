"""Conformance of the callback kernel's asyncio loop (kernels.callback.aioloop).

One test per promise of the asyncio event-loop documentation, written by the
team. Each runs on CPython's own loop (the judge) and on ours; a promise that
fails on the judge is a wrong test, one that fails on ours alone is a
divergence to fix or to declare in docs/aioloop.md. The last section checks
that the loop's knobs change exactly what they change on the callback kernel.
"""
from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading

import pytest

import kernels.callback as cb
from kernels.options import OptionError

FACTORIES = {"asyncio": asyncio.new_event_loop, "looplab": cb.new_event_loop}


@pytest.fixture(params=list(FACTORIES))
def factory(request):
    return FACTORIES[request.param]


def run(factory, main, timeout=10.0):
    """Run ``main()`` on a fresh loop from ``factory`` with a time limit."""
    async def bounded():
        return await asyncio.wait_for(main(), timeout)
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(bounded())


def on_loop(factory):
    loop = factory()
    return loop


class Echo(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.transport.write(data)


class Collect(asyncio.Protocol):
    def __init__(self):
        self.events = []
        self.data = bytearray()
        self.lost = None
        self.paused = 0

    def connection_made(self, transport):
        self.transport = transport
        self.events.append("made")
        self.lost = asyncio.get_running_loop().create_future()

    def data_received(self, data):
        if "data" not in self.events:
            self.events.append("data")
        self.data += data

    def eof_received(self):
        self.events.append("eof")

    def connection_lost(self, exc):
        self.events.append("lost")
        if not self.lost.done():
            self.lost.set_result(exc)

    def pause_writing(self):
        self.paused += 1


async def _read_n(protocol, n, limit=5.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while len(protocol.data) < n and loop.time() < deadline:
        await asyncio.sleep(0.001)
    return bytes(protocol.data)


# --------------------------------------------------------------------- scheduling

def test_call_soon_runs_in_fifo_order(factory):
    loop = factory()
    try:
        order = []
        for i in range(5):
            loop.call_soon(order.append, i)
        loop.call_soon(loop.stop)
        loop.run_forever()
        assert order == [0, 1, 2, 3, 4]
    finally:
        loop.close()


def test_cancelled_handle_never_runs(factory):
    loop = factory()
    try:
        ran = []
        handle = loop.call_soon(ran.append, 1)
        handle.cancel()
        assert handle.cancelled()
        loop.call_soon(loop.stop)
        loop.run_forever()
        assert ran == []
    finally:
        loop.close()


def test_call_later_never_runs_early(factory):
    async def main():
        loop = asyncio.get_running_loop()
        start = loop.time()
        fut = loop.create_future()
        loop.call_later(0.05, lambda: fut.set_result(loop.time()))
        handle = loop.call_at(start + 0.02, lambda: None)
        assert handle.when() == start + 0.02
        return start, await fut
    start, fired = run(factory, main)
    assert fired - start >= 0.05


def test_call_soon_runs_in_given_or_copied_context(factory):
    var = contextvars.ContextVar("var", default="unset")

    async def main():
        loop = asyncio.get_running_loop()
        seen = []
        ctx = contextvars.Context()
        ctx.run(var.set, "given")
        loop.call_soon(lambda: seen.append(var.get()), context=ctx)
        var.set("current")
        loop.call_soon(lambda: (seen.append(var.get()), var.set("leaked")))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return seen, var.get()
    seen, after = run(factory, main)
    assert seen == ["given", "current"]
    assert after == "current"     # the callback ran in a copy


def test_call_soon_threadsafe_wakes_a_waiting_loop(factory):
    async def main():
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        timer = threading.Timer(0.05, loop.call_soon_threadsafe, (fut.set_result, "woken"))
        timer.start()
        try:
            return await fut
        finally:
            timer.join()
    assert run(factory, main) == "woken"


def test_time_is_monotonic(factory):
    loop = factory()
    try:
        times = [loop.time() for _ in range(100)]
        assert times == sorted(times)
    finally:
        loop.close()


# --------------------------------------------------------------------- running

def test_run_until_complete_returns_result_or_raises(factory):
    loop = factory()
    try:
        async def ok():
            return 42

        async def bad():
            raise KeyError("x")
        assert loop.run_until_complete(ok()) == 42
        with pytest.raises(KeyError):
            loop.run_until_complete(bad())
        fut = loop.create_future()
        loop.call_soon(fut.set_result, "f")
        assert loop.run_until_complete(fut) == "f"
    finally:
        loop.close()


def test_stop_before_run_forever_runs_one_iteration(factory):
    loop = factory()
    try:
        ran = []
        loop.call_soon(ran.append, 1)
        loop.stop()
        loop.run_forever()
        assert ran == [1]
        assert not loop.is_running()
    finally:
        loop.close()


def test_run_until_complete_when_stopped_early_raises(factory):
    loop = factory()
    try:
        fut = loop.create_future()
        loop.call_soon(loop.stop)
        with pytest.raises(RuntimeError):
            loop.run_until_complete(fut)
    finally:
        loop.close()


def test_running_loop_is_running_and_refuses_reentry(factory):
    async def main():
        loop = asyncio.get_running_loop()
        assert loop.is_running()
        with pytest.raises(RuntimeError):
            loop.run_forever()
        return loop
    loop = factory()
    try:
        assert loop.run_until_complete(main()) is loop
        assert not loop.is_running()
    finally:
        loop.close()


def test_running_loop_refuses_close(factory):
    # a test of its own: CPython 3.13.0's nested run_forever() clears the
    # running state on its way out, after which close() would succeed
    async def main():
        loop = asyncio.get_running_loop()
        with pytest.raises(RuntimeError):
            loop.close()
        return loop.is_closed()
    loop = factory()
    try:
        assert loop.run_until_complete(main()) is False
    finally:
        loop.close()


def test_closed_loop_refuses_callbacks_and_close_is_idempotent(factory):
    loop = factory()
    loop.close()
    loop.close()
    assert loop.is_closed()
    with pytest.raises(RuntimeError):
        loop.call_soon(lambda: None)
    with pytest.raises(RuntimeError):
        loop.run_forever()


def test_asyncio_run_uses_the_loop_factory(factory):
    async def main():
        return type(asyncio.get_running_loop())
    if sys.version_info >= (3, 12):
        kind = asyncio.run(main(), loop_factory=factory)
    else:
        kind = run(factory, main)
    probe = factory()
    probe.close()
    assert kind is type(probe)


# --------------------------------------------------------------------- tasks

def test_create_task_name_and_context(factory):
    var = contextvars.ContextVar("var", default="unset")

    async def child():
        return var.get(), asyncio.current_task().get_name()

    async def main():
        loop = asyncio.get_running_loop()
        ctx = contextvars.Context()
        ctx.run(var.set, "ctx")
        return await loop.create_task(child(), name="kid", context=ctx)
    assert run(factory, main) == ("ctx", "kid")


def test_task_factory_makes_every_task(factory):
    made = []

    def task_factory(loop, coro, **kwargs):
        made.append(kwargs)
        return asyncio.Task(coro, loop=loop, **kwargs)

    async def main():
        loop = asyncio.get_running_loop()
        loop.set_task_factory(task_factory)
        assert loop.get_task_factory() is task_factory
        task = asyncio.ensure_future(asyncio.sleep(0, "done"))
        named = loop.create_task(asyncio.sleep(0), name="named")
        await named
        loop.set_task_factory(None)
        return await task, named.get_name()
    assert run(factory, main) == ("done", "named")
    assert len(made) == 2


@pytest.mark.skipif(not hasattr(asyncio, "eager_task_factory"), reason="no eager tasks before 3.12")
def test_eager_task_runs_synchronously_until_first_await(factory):
    steps = []

    async def child():
        steps.append("child started")
        await asyncio.sleep(0)
        steps.append("child resumed")

    async def main():
        loop = asyncio.get_running_loop()
        loop.set_task_factory(asyncio.eager_task_factory)
        task = loop.create_task(child())
        steps.append("created")
        await task
    run(factory, main)
    assert steps == ["child started", "created", "child resumed"]


def test_exception_handler_receives_callback_errors(factory):
    async def main():
        loop = asyncio.get_running_loop()
        contexts = []
        loop.set_exception_handler(lambda lp, ctx: contexts.append((lp, ctx)))
        assert loop.get_exception_handler() is not None

        def boom():
            raise ZeroDivisionError
        loop.call_soon(boom)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        loop.set_exception_handler(None)
        return loop, contexts
    loop, contexts = run(factory, main)
    assert len(contexts) == 1
    assert contexts[0][0] is loop
    assert isinstance(contexts[0][1]["exception"], ZeroDivisionError)
    assert "boom" in contexts[0][1]["message"]       # names the callback itself


def test_default_exception_handler_logs_to_asyncio_logger(factory, caplog):
    loop = factory()
    try:
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            loop.call_exception_handler({"message": "custom trouble",
                                         "exception": ValueError("v")})
        assert any("custom trouble" in r.getMessage() for r in caplog.records)
    finally:
        loop.close()


def test_debug_mode_flag(factory):
    loop = factory()
    try:
        loop.set_debug(True)
        assert loop.get_debug()
        loop.set_debug(False)
        assert not loop.get_debug()
    finally:
        loop.close()


def test_unretrieved_task_exception_reaches_handler(factory):
    async def fail():
        raise OSError("unseen")

    async def main():
        loop = asyncio.get_running_loop()
        seen = []
        loop.set_exception_handler(lambda lp, ctx: seen.append(ctx.get("exception")))
        task = loop.create_task(fail())
        await asyncio.sleep(0.01)
        del task
        import gc
        gc.collect()
        await asyncio.sleep(0)
        return seen
    seen = run(factory, main)
    assert any(isinstance(e, OSError) for e in seen)


# --------------------------------------------------------------------- readers, writers, sock_*

def test_add_reader_and_remove_reader(factory):
    async def main():
        loop = asyncio.get_running_loop()
        a, b = socket.socketpair()
        with a, b:
            a.setblocking(False)
            got = loop.create_future()
            loop.add_reader(a, lambda: got.done() or got.set_result(a.recv(10)))
            b.send(b"ping")
            data = await got
            return data, loop.remove_reader(a), loop.remove_reader(a)
    assert run(factory, main) == (b"ping", True, False)


def test_add_writer_fires_on_writable_socket(factory):
    async def main():
        loop = asyncio.get_running_loop()
        a, b = socket.socketpair()
        with a, b:
            fut = loop.create_future()
            loop.add_writer(a.fileno(), lambda: fut.done() or fut.set_result("w"))
            result = await fut
            return result, loop.remove_writer(a.fileno())
    assert run(factory, main) == ("w", True)


def test_sock_sendall_and_sock_recv_into(factory):
    payload = os.urandom(300_000)

    async def main():
        loop = asyncio.get_running_loop()
        a, b = socket.socketpair()
        with a, b:
            a.setblocking(False)
            b.setblocking(False)
            sender = loop.create_task(loop.sock_sendall(a, payload))
            got = bytearray()
            buf = bytearray(65536)
            while len(got) < len(payload):
                n = await loop.sock_recv_into(b, buf)
                got += buf[:n]
            await sender
            a.shutdown(socket.SHUT_WR)
            return bytes(got), await loop.sock_recv(b, 10)
    got, tail = run(factory, main)
    assert got == payload and tail == b""


def test_sock_connect_and_sock_accept(factory):
    async def main():
        loop = asyncio.get_running_loop()
        with socket.socket() as lsock, socket.socket() as csock:
            lsock.bind(("127.0.0.1", 0))
            lsock.listen()
            lsock.setblocking(False)
            csock.setblocking(False)
            accept = loop.create_task(loop.sock_accept(lsock))
            await loop.sock_connect(csock, lsock.getsockname())
            conn, addr = await accept
            with conn:
                await loop.sock_sendall(csock, b"hello")
                return await loop.sock_recv(conn, 5), addr == csock.getsockname()
    assert run(factory, main) == (b"hello", True)


def test_sock_sendto_and_recvfrom(factory):
    async def main():
        loop = asyncio.get_running_loop()
        with socket.socket(type=socket.SOCK_DGRAM) as a, \
                socket.socket(type=socket.SOCK_DGRAM) as b:
            a.bind(("127.0.0.1", 0))
            b.bind(("127.0.0.1", 0))
            a.setblocking(False)
            b.setblocking(False)
            await loop.sock_sendto(a, b"dgram", b.getsockname())
            data, addr = await loop.sock_recvfrom(b, 100)
            return data, addr == a.getsockname()
    assert run(factory, main) == (b"dgram", True)


def test_sock_recv_is_cancellable(factory):
    async def main():
        loop = asyncio.get_running_loop()
        a, b = socket.socketpair()
        with a, b:
            a.setblocking(False)
            task = loop.create_task(loop.sock_recv(a, 10))
            await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            b.send(b"later")              # the reader must be gone: nobody steals it
            await asyncio.sleep(0.01)
            return a.recv(10)
    assert run(factory, main) == b"later"


# --------------------------------------------------------------------- connections & servers

def test_protocol_echo_connection_made_before_data(factory):
    async def main():
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        transport, proto = await loop.create_connection(Collect, "127.0.0.1", port)
        payload = bytes(range(256)) * 400
        transport.write(payload)
        data = await _read_n(proto, len(payload))
        transport.close()
        await proto.lost
        server.close()
        await server.wait_closed()
        return proto.events, data == payload, transport.get_extra_info("peername")[1] == port
    events, same, peer = run(factory, main)
    assert events[:2] == ["made", "data"] and events[-1] == "lost"
    assert same and peer


def test_streams_echo_byte_exact(factory):
    async def handle(reader, writer):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()

    async def main():
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        sent = bytearray()
        got = bytearray()
        for i in range(200):
            chunk = os.urandom(1 + i * 37)
            writer.write(chunk)
            sent += chunk
            await writer.drain()
            got += await reader.readexactly(len(chunk))
        writer.write_eof()
        assert await reader.read() == b""
        writer.close()
        await writer.wait_closed()
        server.close()
        await server.wait_closed()
        return sent == got
    assert run(factory, main)


def test_create_server_on_given_sock_and_start_serving_false(factory):
    async def main():
        loop = asyncio.get_running_loop()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        server = await loop.create_server(Echo, sock=sock, start_serving=False)
        serving_before = server.is_serving()
        await server.start_serving()
        _, proto = await loop.create_connection(Collect, sock=socket.create_connection(
            sock.getsockname()))
        proto.transport.write(b"abc")
        data = await _read_n(proto, 3)
        proto.transport.close()
        server.close()
        return serving_before, server.is_serving(), data
    assert run(factory, main) == (False, False, b"abc")


@pytest.mark.skipif(not hasattr(socket, "SO_REUSEPORT"), reason="no SO_REUSEPORT here")
def test_reuse_port_lets_two_servers_share_a_port(factory):
    async def main():
        loop = asyncio.get_running_loop()
        first = await loop.create_server(Echo, "127.0.0.1", 0, reuse_port=True)
        port = first.sockets[0].getsockname()[1]
        second = await loop.create_server(Echo, "127.0.0.1", port, reuse_port=True)
        ports = {s.getsockname()[1] for s in first.sockets + second.sockets}
        first.close()
        second.close()
        return ports == {port}
    assert run(factory, main)


def test_closed_server_refuses_new_connections(factory):
    async def main():
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Echo, "127.0.0.1", 0, backlog=5)
        port = server.sockets[0].getsockname()[1]
        server.close()
        assert not server.is_serving() and server.sockets == ()
        with pytest.raises(OSError):
            await loop.create_connection(Collect, "127.0.0.1", port)
        return True
    assert run(factory, main)


def test_serve_forever_cancelled_closes_the_server(factory):
    async def main():
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Echo, "127.0.0.1", 0, start_serving=False)
        task = loop.create_task(server.serve_forever())
        await asyncio.sleep(0.01)
        serving = server.is_serving()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return serving, server.is_serving(), server.sockets
    assert run(factory, main) == (True, False, ())


def test_wait_closed_follows_the_interpreter(factory):
    """3.12.1+: wait_closed waits for close() and every client's end; 3.11
    returns at once after close()."""
    async def main():
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        transport, proto = await loop.create_connection(Collect, "127.0.0.1", port)
        transport.write(b"x")
        await _read_n(proto, 1)
        server.close()
        waiter = loop.create_task(server.wait_closed())
        await asyncio.sleep(0.02)
        done_with_client = waiter.done()
        transport.close()
        await asyncio.wait_for(waiter, 2)
        return done_with_client
    expect_waiting = sys.version_info >= (3, 12, 1)
    assert run(factory, main) is (not expect_waiting)


@pytest.mark.skipif(not hasattr(asyncio.Server, "close_clients"), reason="3.13+")
def test_close_clients_and_abort_clients(factory):
    async def main():
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        _, p1 = await loop.create_connection(Collect, "127.0.0.1", port)
        p1.transport.write(b"1")
        await _read_n(p1, 1)
        server.close_clients()
        await asyncio.wait_for(p1.lost, 2)
        _, p2 = await loop.create_connection(Collect, "127.0.0.1", port)
        p2.transport.write(b"2")
        await _read_n(p2, 1)
        server.abort_clients()
        await asyncio.wait_for(p2.lost, 2)
        server.close()
        await asyncio.wait_for(server.wait_closed(), 2)
        return p1.events[-1], p2.events[-1]
    assert run(factory, main) == ("lost", "lost")


def test_unix_server_and_connection(factory, tmp_path):
    path = str(tmp_path / "s.sock")

    async def main():
        loop = asyncio.get_running_loop()
        server = await loop.create_unix_server(Echo, path)
        transport, proto = await loop.create_unix_connection(Collect, path)
        transport.write(b"unix")
        data = await _read_n(proto, 4)
        transport.close()
        server.close()
        await server.wait_closed()
        return data
    assert run(factory, main) == b"unix"


def test_connect_accepted_socket(factory):
    async def main():
        loop = asyncio.get_running_loop()
        a, b = socket.socketpair()
        transport, proto = await loop.connect_accepted_socket(Echo, a)
        b.setblocking(False)
        await loop.sock_sendall(b, b"acc")
        data = await loop.sock_recv(b, 3)
        transport.close()
        b.close()
        return data
    assert run(factory, main) == b"acc"


def test_write_eof_half_closes(factory):
    async def main():
        loop = asyncio.get_running_loop()
        server_proto = Collect()
        server = await loop.create_server(lambda: server_proto, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        transport, _ = await loop.create_connection(Collect, "127.0.0.1", port)
        assert transport.can_write_eof()
        transport.write(b"last")
        transport.write_eof()
        for _ in range(500):
            if "eof" in server_proto.events:
                break
            await asyncio.sleep(0.002)
        transport.close()
        server.close()
        return bytes(server_proto.data), "eof" in server_proto.events
    assert run(factory, main) == (b"last", True)


def test_pause_writing_above_the_high_mark(factory):
    async def main():
        loop = asyncio.get_running_loop()
        lsock = socket.socket()
        lsock.bind(("127.0.0.1", 0))
        lsock.listen()
        transport, proto = await loop.create_connection(Collect, *lsock.getsockname())
        conn, _ = lsock.accept()             # never read: the bytes must queue
        transport.set_write_buffer_limits(high=1000)
        assert transport.get_write_buffer_limits() == (250, 1000)
        for _ in range(200):
            transport.write(b"z" * 65536)
            if proto.paused:
                break
        paused, size = proto.paused, transport.get_write_buffer_size()
        transport.abort()
        conn.close()
        lsock.close()
        return paused, size > 1000
    assert run(factory, main) == (1, True)


def test_sendfile_sends_the_file_exactly(factory, tmp_path):
    content = os.urandom(200_000)
    (tmp_path / "f").write_bytes(content)

    async def main():
        loop = asyncio.get_running_loop()
        sink = Collect()
        server = await loop.create_server(lambda: sink, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        transport, _ = await loop.create_connection(asyncio.Protocol, "127.0.0.1", port)
        with open(tmp_path / "f", "rb") as f:
            sent = await loop.sendfile(transport, f, offset=1000, count=150_000)
            pos = f.tell()
        data = await _read_n(sink, 150_000)
        transport.close()
        server.close()
        return sent, pos, data
    sent, pos, data = run(factory, main)
    assert (sent, pos) == (150_000, 151_000) and data == content[1000:151_000]


def test_sock_sendfile(factory, tmp_path):
    (tmp_path / "f").write_bytes(b"0123456789" * 1000)

    async def main():
        loop = asyncio.get_running_loop()
        a, b = socket.socketpair()
        with a, b:
            a.setblocking(False)
            with open(tmp_path / "f", "rb") as f:
                sent = await loop.sock_sendfile(a, f, 5, 100)
            b.setblocking(False)
            return sent, await loop.sock_recv(b, 1000)
    assert run(factory, main) == (100, (b"0123456789" * 20)[5:105])


def test_udp_endpoints(factory):
    class Udp(asyncio.DatagramProtocol):
        def __init__(self):
            self.got = None

        def connection_made(self, transport):
            self.transport = transport

        def datagram_received(self, data, addr):
            if self.got is None:
                self.transport.sendto(data.upper(), addr)
            else:
                self.got.set_result(data)

    async def main():
        loop = asyncio.get_running_loop()
        server, _ = await loop.create_datagram_endpoint(Udp, local_addr=("127.0.0.1", 0))
        addr = server.get_extra_info("sockname")
        client, proto = await loop.create_datagram_endpoint(Udp, remote_addr=addr)
        proto.got = loop.create_future()
        client.sendto(b"shout")
        data = await asyncio.wait_for(proto.got, 2)
        client.close()
        server.close()
        return data
    assert run(factory, main) == b"SHOUT"


def test_getaddrinfo_and_getnameinfo(factory):
    async def main():
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo("127.0.0.1", 80, type=socket.SOCK_STREAM)
        name = await loop.getnameinfo(("127.0.0.1", 80), socket.NI_NUMERICHOST | socket.NI_NUMERICSERV)
        return infos, name
    infos, name = run(factory, main)
    assert infos == socket.getaddrinfo("127.0.0.1", 80, type=socket.SOCK_STREAM)
    assert name == ("127.0.0.1", "80")


# --------------------------------------------------------------------- executors, asyncgens, signals

def test_run_in_executor_and_shutdown_default_executor(factory):
    async def main():
        loop = asyncio.get_running_loop()
        tid = await loop.run_in_executor(None, threading.get_ident)
        await loop.shutdown_default_executor()
        with pytest.raises(RuntimeError):
            loop.run_in_executor(None, int)
        return tid != threading.get_ident()
    assert run(factory, main)


def test_shutdown_asyncgens_finalizes_open_generators(factory):
    closed = []

    async def gen():
        try:
            yield 1
            yield 2
        finally:
            closed.append(True)

    loop = factory()
    try:
        agen = gen()

        async def first():
            return await agen.__anext__()     # first iteration under the loop's hooks
        assert loop.run_until_complete(first()) == 1
        loop.run_until_complete(loop.shutdown_asyncgens())
        assert closed == [True]
    finally:
        loop.close()


@pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="POSIX signals")
def test_signal_handler_runs_on_the_loop(factory):
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals need the main thread")

    async def main():
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        loop.add_signal_handler(signal.SIGUSR1, fut.set_result, "sig")
        with pytest.raises(TypeError):
            loop.add_signal_handler(signal.SIGUSR2, main)
        os.kill(os.getpid(), signal.SIGUSR1)
        result = await asyncio.wait_for(fut, 2)
        return result, loop.remove_signal_handler(signal.SIGUSR1), \
            loop.remove_signal_handler(signal.SIGUSR1)
    assert run(factory, main) == ("sig", True, False)


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="POSIX signals")
def test_an_uncatchable_signal_is_a_runtime_error(factory):
    """add_signal_handler: "Raise RuntimeError if there is a problem setting up the
    handler" -- SIGKILL cannot be caught (the observatory's probe found our loop raising
    the OSError itself)."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals need the main thread")

    async def main():
        loop = asyncio.get_running_loop()
        with pytest.raises(RuntimeError):
            loop.add_signal_handler(signal.SIGKILL, lambda: None)
        return loop.remove_signal_handler(signal.SIGKILL)
    assert run(factory, main) is False


# --------------------------------------------------------------------- TLS

@pytest.fixture(scope="module")
def tls_contexts(tmp_path_factory):
    ssl = pytest.importorskip("ssl")
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is needed to make a test certificate")
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
                    "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert, key)
    client = ssl.create_default_context(cafile=str(cert))
    return server, client


def test_tls_server_and_client(factory, tls_contexts):
    server_ctx, client_ctx = tls_contexts

    async def handle(reader, writer):
        writer.write((await reader.readline()).upper())
        await writer.drain()
        writer.close()

    async def main():
        server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server_ctx)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_ctx,
                                                       server_hostname="localhost")
        writer.write(b"secret line\n")
        line = await reader.readline()
        version = writer.get_extra_info("ssl_object").version()
        writer.close()
        await writer.wait_closed()
        server.close()
        await server.wait_closed()
        return line, version.startswith("TLS")
    assert run(factory, main) == (b"SECRET LINE\n", True)


def test_start_tls_upgrades_a_plain_connection(factory, tls_contexts):
    server_ctx, client_ctx = tls_contexts

    async def handle(reader, writer):
        assert await reader.readline() == b"STARTTLS\n"
        writer.write(b"GO\n")
        await writer.drain()
        await writer.start_tls(server_ctx)
        writer.write(await reader.readline())
        await writer.drain()
        writer.close()

    async def main():
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"STARTTLS\n")
        assert await reader.readline() == b"GO\n"
        await writer.start_tls(client_ctx, server_hostname="localhost")
        writer.write(b"over tls\n")
        line = await reader.readline()
        tls = writer.get_extra_info("ssl_object") is not None
        writer.close()
        server.close()
        return line, tls
    if sys.version_info < (3, 11):
        pytest.skip("StreamWriter.start_tls is 3.11+")
    assert run(factory, main) == (b"over tls\n", True)


# --------------------------------------------------------------------- declared divergences

def test_not_a_subclass_of_asyncio_loops():
    loop = cb.new_event_loop()
    try:
        assert isinstance(loop, asyncio.AbstractEventLoop)
        assert not isinstance(loop, asyncio.BaseEventLoop)
        assert asyncio.BaseEventLoop not in type(loop).__mro__
    finally:
        loop.close()


# --------------------------------------------------------------------- knobs

def test_bad_option_is_one_clear_line():
    with pytest.raises(OptionError) as info:
        cb.new_event_loop(write="later")
    assert "\n" not in str(info.value)
    assert "write" in str(info.value) and "try-send|defer" in str(info.value)
    with pytest.raises(OptionError, match="unknown option 'hig_water'"):
        cb.new_event_loop(hig_water=1)


def _buffer_after_write(options, nbytes=1000, lines=False):
    """(buffer size right after one write, pause_writing calls) on our asyncio
    loop and on the plain callback kernel, for the same options."""
    async def on_aioloop():
        loop = asyncio.get_running_loop()
        lsock = socket.socket()
        lsock.bind(("127.0.0.1", 0))
        lsock.listen()
        transport, proto = await loop.create_connection(Collect, *lsock.getsockname())
        conn, _ = lsock.accept()
        if lines:
            transport.writelines([b"q" * (nbytes // 2)] * 2)
        else:
            transport.write(b"q" * nbytes)
        result = (transport.get_write_buffer_size(), proto.paused)
        transport.abort()
        conn.close()
        lsock.close()
        return result

    def on_kernel():
        loop = cb.Loop(**options)
        lsock = socket.socket()
        lsock.bind(("127.0.0.1", 0))
        lsock.listen()
        out = {}

        class P(cb.Protocol):
            paused = 0

            def pause_writing(self):
                P.paused += 1

        def connected(transport, protocol, exc):
            if lines:
                transport.writelines([b"q" * (nbytes // 2)] * 2)
            else:
                transport.write(b"q" * nbytes)
            out["r"] = (transport.get_write_buffer_size(), P.paused)
            transport.abort()
            loop.stop()
        loop.create_connection(P, *lsock.getsockname(), callback=connected)
        loop.call_later(5, loop.stop)
        loop.run_forever()
        loop.close()
        lsock.close()
        return out["r"]
    ours = run(functools.partial(cb.new_event_loop, **options), on_aioloop)
    return ours, on_kernel()


@pytest.mark.parametrize("options, expected", [
    ({}, (0, 0)),                                        # try-send: the socket took it
    ({"write": "defer"}, (1000, 0)),                     # defer: all of it buffered
    ({"write": "defer", "high_water": 500}, (1000, 1)),  # and above the mark: paused once
    ({"write": "defer", "high_water": 5000}, (1000, 0)),
])
def test_knobs_change_what_they_change_on_the_kernel(options, expected):
    ours, kernel = _buffer_after_write(options)
    assert ours == kernel == expected


@pytest.mark.parametrize("options, expected", [
    ({"write": "defer", "high_water": 500}, (1000, 1)),
    # the 3.12.0-3.12.8 stand-in (CPython 127655): writelines skips the pause check
    ({"write": "defer", "high_water": 500, "writelines": "unchecked"}, (1000, 0)),
])
def test_version_stand_in_changes_writelines_as_on_the_kernel(options, expected):
    ours, kernel = _buffer_after_write(options, lines=True)
    assert ours == kernel == expected


def test_exit_raise_reports_unsent_bytes():
    loop = cb.new_event_loop(write="defer", exit="raise")

    async def main():
        lsock = socket.socket()
        lsock.bind(("127.0.0.1", 0))
        lsock.listen()
        transport, _ = await loop.create_connection(asyncio.Protocol, *lsock.getsockname())
        transport.write(b"u" * (16 << 20))     # more than the socket buffers hold
        await asyncio.sleep(0.05)
        return lsock, transport.get_write_buffer_size()
    lsock, buffered = loop.run_until_complete(main())
    with pytest.raises(cb.UnsentDataError) as info:
        loop.close()
    lsock.close()
    assert 0 < info.value.bytes_unsent == buffered


def test_trace_records_transport_events():
    loop = cb.new_event_loop(trace=True)
    try:
        async def main():
            server = await loop.create_server(Echo, "127.0.0.1", 0)
            port = server.sockets[0].getsockname()[1]
            transport, proto = await loop.create_connection(Collect, "127.0.0.1", port)
            transport.write(b"traced")
            await _read_n(proto, 6)
            transport.close()
            server.close()
        loop.run_until_complete(main())
        names = {event.get("name") for event in loop.probe.trace.events}
        assert {"write", "send"} <= names
    finally:
        loop.close()


# --------------------------------------------------------------------- simulated network

def test_streams_app_on_the_simulated_network_replays_exactly():
    """The loop's I/O and clock through ``io=``: an unmodified streams app on
    ``kernels.simnet`` gives the same bytes, end time and event log per seed,
    and a knob (``write=defer``) changes the transports' buffering, not the bytes."""
    from kernels import simnet

    async def handle(reader, writer):
        while data := await reader.read(4096):
            writer.write(data.upper())
            await writer.drain()
        writer.close()

    async def main():
        server = await asyncio.start_server(handle, "127.0.0.1", 9000)
        reader, writer = await asyncio.open_connection("127.0.0.1", 9000)
        got = bytearray()
        for i in range(200):
            writer.write(b"msg %d " % i * (1 + i % 40))
            await writer.drain()
            got += await reader.readexactly(len(b"msg %d " % i) * (1 + i % 40))
        writer.close()
        await writer.wait_closed()
        server.close()
        await server.wait_closed()
        loop = asyncio.get_running_loop()
        peak = max(conn.peak_user_buffer_bytes for conn in loop.probe.connections)
        return bytes(got), loop.time(), peak

    def once(seed, **options):
        world = simnet.World(seed, latency_s=0.0002, jitter_s=0.0001)
        factory = functools.partial(cb.new_event_loop, io=world.io(), **options)
        return run(factory, main) + (world.digest(),)

    first, again = once(3), once(3)
    deferred = once(3, write="defer")
    assert first == again
    assert first[0] == deferred[0]
    assert first[2] == 0 < deferred[2]      # try-send never buffered; defer always does


@pytest.mark.parametrize("policy", ["cancel", "wait"])
def test_exit_policy_under_asyncio_runner(policy):
    """``exit=wait`` delivers what a returning ``main`` left buffered; the
    default drops it when the Runner closes the loop, as asyncio does."""
    total = 16 << 20
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen()
    received = []

    def slow_peer():
        conn, _ = lsock.accept()
        got = 0
        with conn:
            conn.settimeout(10)
            try:
                while chunk := conn.recv(65536):
                    got += len(chunk)
                    threading.Event().wait(0.0005)     # slower than the loop writes
            except OSError:
                pass
        received.append(got)

    peer = threading.Thread(target=slow_peer)
    peer.start()

    async def main():
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_connection(asyncio.Protocol, *lsock.getsockname())
        transport.write(b"w" * total)
        transport.close()             # returns at once; the bytes are still buffered

    try:
        run(functools.partial(cb.new_event_loop, exit=policy), main)
    finally:
        peer.join(20)
        lsock.close()
    if policy == "wait":
        assert received == [total]
    else:
        assert received and received[0] < total


def test_closing_the_loop_releases_every_descriptor():
    fds = "/proc/self/fd"
    if not os.path.isdir(fds):
        pytest.skip("needs /proc")

    async def main():
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        for _ in range(3):                  # left open on purpose: close() releases them
            await loop.create_connection(Collect, "127.0.0.1", port)
        await loop.create_datagram_endpoint(asyncio.DatagramProtocol,
                                            local_addr=("127.0.0.1", 0))
        await asyncio.sleep(0.01)

    before = len(os.listdir(fds))
    run(cb.new_event_loop, main)
    assert len(os.listdir(fds)) == before


def test_runner_turns_sigint_into_keyboard_interrupt(factory):
    """asyncio.Runner's Ctrl-C: the main task is cancelled, the loop woken from
    its wait, and KeyboardInterrupt raised after the loop shut down."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("needs the main thread with Python's default SIGINT handler")
    cancelled = []

    async def main():
        try:
            await asyncio.sleep(30)         # the loop waits in its poller, no timer due soon
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    timer = threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            with asyncio.Runner(loop_factory=factory) as runner:
                runner.run(main())
    finally:
        timer.cancel()
    assert cancelled == [True]
