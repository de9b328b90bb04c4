"""Port conformance: one contract suite, run through the port API on every runtime.

A driver is written once per style and trusted on every runtime of that style, so
what a port promises has to be checked on all of them with the same code. These
tests restate trio's generic stream checks (``trio.testing.check_two_way_stream``)
for the three port shapes: byte-exact round trips with 1 and 100 connections,
half-close, close with data still buffered, abort, a peer that resets mid-stream,
and -- for the task port -- closing a stream under a blocked task and concurrent
misuse; for the stream port, two tasks in ``drain()`` and writes after ``close()``.

Runtimes do not all behave alike, and some differences are the point of looplab
(asyncio keeps "delivering" writes made after ``close()``; curio has no
closed-resource notion). So every behaviour that may differ is measured into a
short *outcome* string and compared with a declaration:

``CONTRACT[style][key]``
    what the style's reference library does (asyncio for callback and stream,
    trio for task) -- the behaviour a runtime of that style is held to;
``DIFFERENCES[runtime_id][key]``
    a measured, expected deviation. Asserted like the contract: a runtime that
    stops differing fails too, so the table can't rot;
``KNOWN_BUGS[(runtime_id, key)]``
    a port or kernel bug that makes a runtime break its contract. That one test
    is ``xfail(strict=True)`` with the reason; fixing the bug turns it into an
    XPASS failure, which is the reminder to delete the entry.

Nothing is skipped for differing. Every run is bounded (port-level timeouts, a
watchdog timer on callback loops, joined peer threads), uses 127.0.0.1 and small
sizes, and closes what it opens: the autouse leak check in ``conftest.py`` runs
after each test.
"""
from __future__ import annotations

import random
import socket
import struct
import threading
import time

import pytest

from protocols import runtimes

# ---------------------------------------------------------------------------
# Declarations

CONTRACT = {
    "callback": {
        # the peer resets (SO_LINGER 0) while our write is buffered
        "reset": "connection_lost(ConnectionError); write after: no error",
        # abort() with bytes buffered: what the peer gets, how each end hears of it
        "abort": "peer: prefix then EOF; connection_lost(None)",
        # ...and whether the probe reports the dropped bytes as lost
        "abort_counted": "counted exactly",
        # write() after close(): with nothing buffered / with bytes still buffered;
        # asyncio appends to a closing transport's buffer (asyncio issue 248)
        "write_after_close": "empty: dropped; buffered: delivered; counted 2",
    },
    "stream": {
        "reset": "drain raises ConnectionError; then read raises ConnectionError",
        "abort_counted": "counted exactly",
        # CPython 74116 (AssertionError) is fixed in the 3.11.7 we run: both wake
        "two_drainers": "both wake",
        "write_after_close": "empty: dropped; buffered: delivered; counted 2",
    },
    "task": {
        "reset_send": "send_all raises BrokenResourceError; then receive_some returns b''",
        "reset_receive": "receive_some raises BrokenResourceError",
        "close_while_receiving": "ClosedResourceError",
        "close_while_sending": "ClosedResourceError",
        "use_after_close": "send_all: ClosedResourceError; receive_some: ClosedResourceError",
        "send_after_eof": "ClosedResourceError",
        "concurrent_receive": "BusyResourceError; first intact",
        "concurrent_send": "BusyResourceError; first intact",
        # closed/broken-stream errors above that are not port.StreamError, which
        # is what drivers catch
        "not_stream_errors": "none",
    },
}

# Measured on Python 3.11.7, uvloop 0.23, trio 0.35, curio 1.6 (Linux loopback).
# uvloop-protocol, uvloop-streams, asyncio-* and trio match their style's contract.
DIFFERENCES: dict[str, dict[str, str]] = {
    # Our transports drop (and count) every write after close(), where asyncio
    # still sends one made while the buffer drains: the fix for asyncio issue 248,
    # on purpose (CALLBACK.md).
    "callback": {"write_after_close": "empty: dropped; buffered: dropped; counted 2"},
    "hybrid": {"write_after_close": "empty: dropped; buffered: dropped; counted 2"},
    # A reset is the OS error itself (curio's choice); trio wraps it in
    # BrokenResourceError. Both are port.StreamError (asserted separately).
    "coro": {
        "reset_send": "send_all raises ConnectionError; then receive_some returns b''",
        "reset_receive": "receive_some raises ConnectionError",
    },
    "curio": {
        "reset_send": "send_all raises ConnectionError; then receive_some returns b''",
        "reset_receive": "receive_some raises ConnectionError",
        # Socket.close() releases only the closing task's own I/O wait: a task
        # blocked on the socket is never woken -- it waits until cancelled.
        "close_while_receiving": "hangs",
        "close_while_sending": "hangs",
        # No closed state: the calls reach the closed stdlib socket (EBADF).
        "use_after_close": "send_all: OSError; receive_some: OSError",
        "send_after_eof": "BrokenPipeError",          # EPIPE from send after SHUT_WR
        "not_stream_errors": "use_after_close.receive_some: OSError, "
                             "use_after_close.send_all: OSError",
        # No stream-level busy check. What trips is the kernel's rule that one task
        # waits per fd and direction, and only when the second call must *wait*:
        # a second sender that finds room in the socket buffer is not stopped.
        "concurrent_receive": "ReadResourceBusy; first intact",
        "concurrent_send": "WriteResourceBusy; first intact",
    },
}

# Port bugs this suite found are fixed; a new one goes here as a strict xfail
# (with the failing behaviour and the proposed fix) until it is fixed.
KNOWN_BUGS: dict[tuple[str, str], str] = {}


def expected(rt, key: str) -> str:
    """The declared outcome of ``key`` on runtime ``rt``."""
    return DIFFERENCES.get(rt.id, {}).get(key, CONTRACT[rt.style][key])


def check(request, rt, key: str, outcome: str, details=None) -> None:
    """Assert the measured ``outcome`` is the declared one; a known bug makes this
    test a strict xfail (it must keep failing until the bug is fixed)."""
    bug = KNOWN_BUGS.get((rt.id, key))
    if bug is not None:
        request.applymarker(pytest.mark.xfail(strict=True, reason=bug))
    assert outcome == expected(rt, key), (
        f"{rt.id} {key}: measured {outcome!r}, declared {expected(rt, key)!r}"
        + (f"; details: {details!r}" if details is not None else ""))


# ---------------------------------------------------------------------------
# Sizes and bounds

BIG = 1 << 20            # one connection's round trip; the "buffered" writes
SMALL = 64 * 1024        # each of MANY connections' round trip
MANY = 100
SOCKBUF = 64 * 1024      # pinned where bytes must pile up in user space (~192 KiB fit in the kernel)
CHUNK = 64 * 1024
LIMIT_S = 30.0           # a whole port run; 2 noisy cores, so generous -- it only bounds a hang
HANG_S = 0.5             # "blocked and not woken" after this long counts as a hang
SETTLE_S = 0.1           # lets a spawned task reach its blocking call
MAX_WRITES = 500         # bounds a write-until-error loop (drain blocks long before)


def _payload(seed: int, n: int) -> bytes:
    # Random per connection: a swapped, repeated or dropped chunk can't match.
    return random.Random(seed).randbytes(n)


def _family(exc: BaseException) -> str:
    """An exception as the declarations name it: OS connection errors by their
    common base (which one of EPIPE/ECONNRESET comes first is a race), anything
    else by its class name."""
    if isinstance(exc, ConnectionError):
        return "ConnectionError"
    return type(exc).__name__




# Style-specific tests take ``callback_runtime`` / ``stream_runtime`` /
# ``task_runtime``: the same specs as conftest's ``runtime`` (``--runtimes``
# honoured), filtered by style, so a callback-only check is not a skip on the
# six runtimes it does not apply to.
_STYLE_FIXTURES = {"callback_runtime": "callback", "stream_runtime": "stream",
                   "task_runtime": "task"}


def pytest_generate_tests(metafunc):
    for name, style in _STYLE_FIXTURES.items():
        if name in metafunc.fixturenames:
            chosen = runtimes.parse_list(metafunc.config.getoption("--runtimes"))
            metafunc.parametrize(name, [rt.spec for rt in chosen if rt.style == style],
                                 indirect=True)


def _style_runtime(request):
    rt = runtimes.parse(request.param)
    reason = rt.unavailable_reason()
    if reason:
        pytest.skip(reason)
    return rt


callback_runtime = pytest.fixture(_style_runtime, name="callback_runtime")
stream_runtime = pytest.fixture(_style_runtime, name="stream_runtime")
task_runtime = pytest.fixture(_style_runtime, name="task_runtime")


# ---------------------------------------------------------------------------
# A peer that resets: a plain blocking socket in a thread, so the reset comes
# from outside the runtime under test.

class ResettingPeer:
    """Accept one connection, read ``read_first`` bytes (or wait ``delay_s``), then
    close with SO_LINGER 0 -- the kernel sends RST instead of FIN. Every blocking
    call has a timeout; ``close()`` joins the thread and releases the sockets."""

    def __init__(self, read_first: int = 0, delay_s: float = 0.0):
        self.listener = runtimes.bind_listener("127.0.0.1", 0, sockbuf=SOCKBUF)
        self.listener.settimeout(10.0)
        self.address = self.listener.getsockname()[:2]
        self.read_first = read_first
        self.delay_s = delay_s
        self.received = 0
        self.reset_done = False
        self.error = None
        self._thread = threading.Thread(target=self._run, name="resetting-peer", daemon=True)
        self._thread.start()

    def _run(self):
        try:
            conn, _ = self.listener.accept()
        except OSError as exc:
            self.error = exc
            return
        try:
            conn.settimeout(10.0)
            while self.received < self.read_first:
                data = conn.recv(65536)
                if not data:
                    break
                self.received += len(data)
            if self.delay_s:
                time.sleep(self.delay_s)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.reset_done = True
        except OSError as exc:
            self.error = exc
        finally:
            conn.close()

    def close(self):
        self._thread.join(15.0)
        self.listener.close()
        assert not self._thread.is_alive(), "the resetting peer thread did not finish"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---------------------------------------------------------------------------
# Callback style: a recording protocol and a bounded run.

class Recorder:
    """A callback-port protocol that writes down everything its transport tells
    it. ``echo`` writes back what arrives; ``keep_open`` is eof_received's answer;
    ``on_data``/``on_eof``/``on_lost`` are hooks called with the recorder."""

    def __init__(self, echo=False, keep_open=False, on_data=None, on_eof=None, on_lost=None):
        self.echo = echo
        self.keep_open = keep_open
        self.on_data = on_data
        self.on_eof = on_eof
        self.on_lost = on_lost
        self.transport = None
        self.data = bytearray()
        self.eof = False
        self.lost = []          # every connection_lost argument, in order

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.data += data
        if self.echo:
            self.transport.write(data)
        if self.on_data is not None:
            self.on_data(self)

    def eof_received(self):
        self.eof = True
        if self.on_eof is not None:
            self.on_eof(self)
        return self.keep_open

    def connection_lost(self, exc):
        self.lost.append(exc)
        if self.on_lost is not None:
            self.on_lost(self)

    def pause_writing(self):
        pass

    def resume_writing(self):
        pass


def cb_run(port, setup, limit_s: float = LIMIT_S) -> None:
    """Run ``setup(port)`` on the loop until something calls ``port.stop()``.

    A watchdog timer stops the loop after ``limit_s``. An exception raised in a
    protocol callback goes to the loop's exception handler, not to us, so the
    handler collects it and stops the loop, and it is raised here."""
    errors, timed_out = [], []

    def handler(loop, context):
        errors.append(context)
        port.stop()

    def watchdog():
        timed_out.append(True)
        port.stop()

    def start(port):
        port.call_later(limit_s, watchdog)
        setup(port)

    port.loop.set_exception_handler(handler)
    port.run(start)
    if errors:
        raise AssertionError(f"errors in loop callbacks: {errors}") from errors[0].get("exception")
    assert not timed_out, f"the loop was still running after {limit_s} s"


class CbSession:
    """One callback port with a listener, and a count of connections that must
    end (``connection_lost``) before the run stops."""

    def __init__(self, port, listener):
        self.port = port
        self.listener = listener
        self.host, self.p = listener.getsockname()[:2]
        self.server = None
        self.accepted = []      # server-side protocols, in accept order
        self.pending = 0

    def listen(self, factory):
        def recording():
            proto = factory()
            self.accepted.append(proto)
            return proto
        self.server = self.port.listen(recording, self.listener)

    def expect_lost(self, n: int = 1) -> None:
        self.pending += n

    def lost(self, _proto=None) -> None:
        self.pending -= 1
        if self.pending == 0:
            self.server.close()
            self.port.stop()

    def connect(self, proto, on_done, sockbuf=None):
        def done(transport, protocol, exc):
            if exc is not None:
                raise exc          # reaches cb_run through the exception handler
            on_done(transport)
        self.port.connect(lambda: proto, self.host, self.p, done, sockbuf=sockbuf)


def cb_session(rt, body, sockbuf=None):
    """Open a port and a listener, run ``body(session)`` as the loop's setup and
    close everything, however the run ends. Returns (session, the port's probe)."""
    listener = runtimes.bind_listener(sockbuf=sockbuf)
    try:
        with rt.open() as port:
            session = CbSession(port, listener)
            try:
                cb_run(port, lambda port: body(session))
            finally:
                if session.server is not None:
                    session.server.close()
            return session, port.probe()
    finally:
        listener.close()


# ---------------------------------------------------------------------------
# Stream and task style: one bounded run with a listener.

def st_session(rt, body, *args, sockbuf=None):
    """``body(port, listener, host, port_number, *args)`` under ``wait_for``;
    returns (body's result, probe)."""
    listener = runtimes.bind_listener(sockbuf=sockbuf)
    host, p = listener.getsockname()[:2]

    async def main(port):
        return await port.wait_for(body(port, listener, host, p, *args), LIMIT_S)

    try:
        with rt.open() as port:
            result = port.run(main)
            return result, port.probe()
    finally:
        listener.close()


def tk_session(rt, body, *args, sockbuf=None):
    """``body(port, port_listener, host, port_number, *args)`` under
    ``fail_after``, the port's listener closed afterwards; returns body's result."""
    sock = runtimes.bind_listener(sockbuf=sockbuf)
    host, p = sock.getsockname()[:2]

    async def main(port):
        listener = port.listen(sock)
        try:
            async with port.fail_after(LIMIT_S):
                return await body(port, listener, host, p, *args)
        finally:
            await listener.aclose()

    try:
        with rt.open() as port:
            return port.run(main)
    finally:
        sock.close()


async def tk_pair(port, listener, host, p, sockbuf=None):
    """A connected (client, server) pair of port streams."""
    client = await port.open_tcp_stream(host, p, sockbuf=sockbuf)
    try:
        server = await listener.accept()
    except BaseException:
        await client.aclose()
        raise
    return client, server


async def tk_read_all(stream, limit: int = 1 << 24) -> bytes:
    got = bytearray()
    while len(got) <= limit:
        data = await stream.receive_some(65536)
        if not data:
            return bytes(got)
        got += data
    raise AssertionError(f"more than {limit} bytes: no EOF in sight")


# ===========================================================================
# Every style: round trip

def _cb_round_trip(rt, conns, size):
    payloads = [_payload(i, size) for i in range(conns)]
    clients = []

    def body(s):
        s.listen(lambda: Recorder(echo=True, on_lost=s.lost))
        s.expect_lost(2 * conns)          # both ends of every connection
        for i in range(conns):
            def have_all(proto, n=size):
                if len(proto.data) >= n and not proto.transport.is_closing():
                    proto.transport.close()
            proto = Recorder(on_data=have_all, on_lost=s.lost)
            clients.append(proto)
            s.connect(proto, lambda t, i=i: t.write(payloads[i]))

    cb_session(rt, body)
    return [bytes(c.data) for c in clients], payloads


async def _st_round_trip_body(port, listener, host, p, payloads):
    errors = []
    finished = [0]
    all_finished = port.Event()

    async def echo(reader, writer):
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except Exception as exc:        # recorded: a handler's error would only be logged
            errors.append(exc)
        finally:
            writer.close()
            finished[0] += 1
            if finished[0] == len(payloads):
                all_finished.set()

    async def client(payload):
        reader, writer = await port.open_connection(host, p)

        async def send():
            for off in range(0, len(payload), CHUNK):
                writer.write(payload[off:off + CHUNK])
                await writer.drain()

        sender = port.create_task(send())
        try:
            got = await reader.readexactly(len(payload))
            await sender
        finally:
            writer.close()
        await writer.wait_closed()
        return got

    server = await port.start_server(echo, sock=listener)
    try:
        got = await port.gather(*(client(pl) for pl in payloads))
        await all_finished.wait()
    finally:
        server.close()
    return got, errors


async def _tk_round_trip_body(port, listener, host, p, payloads):
    got = [None] * len(payloads)

    async def echo(stream):
        try:
            while data := await stream.receive_some(65536):
                await stream.send_all(data)
        finally:
            await stream.aclose()

    async def serve(nursery):
        for _ in payloads:
            await nursery.spawn(echo, await listener.accept())

    async def client(i):
        stream = await port.open_tcp_stream(host, p)
        try:
            received = bytearray()
            async with port.open_nursery() as n:
                await n.spawn(stream.send_all, payloads[i])
                while len(received) < len(payloads[i]):
                    data = await stream.receive_some(65536)
                    if not data:
                        break
                    received += data
            got[i] = bytes(received)
        finally:
            await stream.aclose()

    async with port.open_nursery() as n:
        await n.spawn(serve, n)
        for i in range(len(payloads)):
            await n.spawn(client, i)
    return got


@pytest.mark.parametrize("conns,size", [(1, BIG), (MANY, SMALL)], ids=["1x1MiB", "100x64KiB"])
def test_round_trip_is_byte_exact(runtime, conns, size):
    if runtime.style == "callback":
        got, payloads = _cb_round_trip(runtime, conns, size)
    elif runtime.style == "stream":
        payloads = [_payload(i, size) for i in range(conns)]
        (got, errors), _ = st_session(runtime, _st_round_trip_body, payloads)
        assert errors == []
    else:
        payloads = [_payload(i, size) for i in range(conns)]
        got = tk_session(runtime, _tk_round_trip_body, payloads)
    assert len(got) == conns
    bad = [i for i in range(conns) if got[i] != payloads[i]]
    assert not bad, (f"{len(bad)} of {conns} connections differ; first: conn {bad[0]} got "
                     f"{len(got[bad[0]] or b'')} of {size} bytes")


# ===========================================================================
# Every style: half-close. The client sends b"ping" and its EOF; the server
# sees both, and only then answers -- the direction still open must work.

def _cb_half_close(rt):
    seen = {}

    def body(s):
        def answer(proto):
            seen["server_data_at_eof"] = bytes(proto.data)
            proto.transport.write(b"after-eof:" + bytes(proto.data))
            proto.transport.close()

        server = Recorder(keep_open=True, on_eof=answer, on_lost=s.lost)
        client = Recorder(on_lost=s.lost)           # keep_open=False: close at EOF
        seen["server"], seen["client"] = server, client
        s.listen(lambda: server)
        s.expect_lost(2)

        def connected(t):
            t.write(b"ping")
            t.write_eof()
        s.connect(client, connected)

    cb_session(rt, body)
    server, client = seen["server"], seen["client"]
    assert seen["server_data_at_eof"] == b"ping" and server.eof
    assert bytes(client.data) == b"after-eof:ping" and client.eof
    assert client.lost == [None] and server.lost == [None]


async def _st_half_close_body(port, listener, host, p):
    seen = {}
    done = port.Event()

    async def handler(reader, writer):
        try:
            data = await reader.read()              # to EOF
            seen["server_at_eof"] = reader.at_eof()
            writer.write(b"after-eof:" + data)
            await writer.drain()
        except Exception as exc:
            seen["server_error"] = exc
        finally:
            writer.close()
            done.set()

    server = await port.start_server(handler, sock=listener)
    try:
        reader, writer = await port.open_connection(host, p)
        writer.write(b"ping")
        writer.write_eof()
        seen["client_got"] = await reader.read()
        seen["client_again"] = await reader.read()   # EOF is sticky
        writer.close()
        await writer.wait_closed()
        await done.wait()
    finally:
        server.close()
    return seen


async def _tk_half_close_body(port, listener, host, p):
    seen = {}
    client, server = await tk_pair(port, listener, host, p)
    try:
        async def serve():
            data = await tk_read_all(server)
            await server.send_all(b"after-eof:" + data)
            await server.aclose()

        async with port.open_nursery() as n:
            await n.spawn(serve)
            await client.send_all(b"ping")
            await client.send_eof()
            seen["client_got"] = await tk_read_all(client)
            seen["client_again"] = await client.receive_some(1024)
    finally:
        await client.aclose()
        await server.aclose()
    return seen


def test_half_close_eof_while_the_other_direction_works(runtime):
    if runtime.style == "callback":
        _cb_half_close(runtime)
        return
    if runtime.style == "stream":
        seen, _ = st_session(runtime, _st_half_close_body)
        assert "server_error" not in seen, seen
        assert seen["server_at_eof"] is True
    else:
        seen = tk_session(runtime, _tk_half_close_body)
    assert seen["client_got"] == b"after-eof:ping"
    assert seen["client_again"] == b""


# ===========================================================================
# Every style: close with data still buffered delivers it all, then EOF.

def _cb_close_buffered(rt, payload):
    seen = {}

    def body(s):
        server = Recorder(on_lost=s.lost)            # EOF -> closes itself
        client = Recorder(on_lost=s.lost)
        seen["server"], seen["client"] = server, client
        s.listen(lambda: server)
        s.expect_lost(2)

        def connected(t):
            t.write(payload)
            seen["buffered"] = t.get_write_buffer_size()
            t.close()
        s.connect(client, connected, sockbuf=SOCKBUF)

    cb_session(rt, body, sockbuf=SOCKBUF)
    assert seen["buffered"] > 0, "precondition: the write left bytes in user space"
    assert seen["client"].lost == [None], "close() ended in an error"
    return bytes(seen["server"].data), seen["server"].eof


async def _st_close_buffered_body(port, listener, host, p, payload):
    seen = {}
    done = port.Event()

    async def sink(reader, writer):
        try:
            seen["data"] = await reader.read()         # to EOF, or raises
            seen["eof"] = reader.at_eof()
        finally:
            writer.close()
            done.set()

    server = await port.start_server(sink, sock=listener)
    try:
        _reader, writer = await port.open_connection(host, p, sockbuf=SOCKBUF)
        writer.write(payload)
        seen["buffered"] = writer.transport.get_write_buffer_size()
        writer.close()
        await done.wait()
        await writer.wait_closed()
    finally:
        server.close()
    return seen


def _st_close_buffered(rt, payload):
    seen, _ = st_session(rt, _st_close_buffered_body, payload, sockbuf=SOCKBUF)
    assert seen["buffered"] > 0, "precondition: the write left bytes in user space"
    return seen.get("data", b""), seen.get("eof", False)


async def _tk_close_buffered_body(port, listener, host, p, payload):
    # send_all returns once the kernel holds the bytes; the reader starts only
    # after aclose() returned, so the close really happens with data in flight.
    client, server = await tk_pair(port, listener, host, p, sockbuf=SOCKBUF)
    try:
        await client.send_all(payload)
        await client.aclose()
        data = await tk_read_all(server)             # returns only at EOF
        again = await server.receive_some(1024)
    finally:
        await client.aclose()
        await server.aclose()
    return data, again == b""


def test_close_with_data_buffered_delivers_all_then_eof(runtime):
    """callback/stream: write() then close(), with most of the write still in user
    space; task: send_all() then aclose(), with the bytes still in the kernel."""
    if runtime.style == "callback":
        payload = _payload(7, BIG)
        data, eof = _cb_close_buffered(runtime, payload)
    elif runtime.style == "stream":
        payload = _payload(7, BIG)
        data, eof = _st_close_buffered(runtime, payload)
    else:
        # well under what the pinned kernel buffers hold, so send_all can't block
        payload = _payload(7, SMALL)
        data, eof = tk_session(runtime, _tk_close_buffered_body, payload, sockbuf=SOCKBUF)
    assert len(data) == len(payload) and data == payload
    assert eof


# ===========================================================================
# Every style: the peer resets mid-stream. Where does the error surface?

def _cb_reset(rt):
    payload = _payload(3, BIG)
    seen = {}
    with ResettingPeer(read_first=SMALL) as peer:
        listener_host, listener_port = peer.address
        with rt.open() as port:
            def setup(port):
                def lost(proto):
                    try:
                        proto.transport.write(b"after the reset")
                        seen["write_after"] = "no error"
                    except Exception as exc:
                        seen["write_after"] = type(exc).__name__
                    port.stop()

                client = Recorder(on_lost=lost)
                seen["client"] = client

                def done(transport, protocol, exc):
                    if exc is not None:
                        raise exc
                    transport.write(payload)
                port.connect(lambda: client, listener_host, listener_port, done,
                             sockbuf=SOCKBUF)
            cb_run(port, setup)
    assert peer.error is None and peer.reset_done
    lost = seen["client"].lost
    assert len(lost) == 1, lost
    surfaced = "None" if lost[0] is None else _family(lost[0])
    return f"connection_lost({surfaced}); write after: {seen['write_after']}", lost


async def _st_reset_main(port, address):
    reader, writer = await port.open_connection(*address, sockbuf=SOCKBUF)
    where, exc = None, None
    chunk = bytes(CHUNK)
    try:
        for _ in range(MAX_WRITES):
            try:
                writer.write(chunk)
            except Exception as e:
                where, exc = "write", e
                break
            try:
                await writer.drain()
            except Exception as e:
                where, exc = "drain", e
                break
        try:
            data = await reader.read(1)
            after = "returns b''" if not data else "returns data"
        except Exception as e:
            after = f"raises {_family(e)}"
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except Exception:       # noqa: BLE001 -- the connection's error again
            pass
    if where is None:
        return f"no error in {MAX_WRITES} writes", None
    return f"{where} raises {_family(exc)}; then read {after}", exc


def _st_reset(rt):
    with ResettingPeer(read_first=SMALL) as peer:
        with rt.open() as port:
            async def main(port):
                return await port.wait_for(_st_reset_main(port, peer.address), LIMIT_S)
            outcome, exc = port.run(main)
    assert peer.error is None and peer.reset_done
    return outcome, exc


def test_callback_peer_reset_surfaces_in_connection_lost(request, callback_runtime):
    outcome, details = _cb_reset(callback_runtime)
    check(request, callback_runtime, "reset", outcome, details)


def test_stream_peer_reset_surfaces_at_the_next_call(request, stream_runtime):
    outcome, details = _st_reset(stream_runtime)
    check(request, stream_runtime, "reset", outcome, details)


async def _tk_reset_send_main(port, address):
    stream = await port.open_tcp_stream(*address, sockbuf=SOCKBUF)
    exc = None
    try:
        chunk = bytes(CHUNK)
        for _ in range(MAX_WRITES):
            try:
                await stream.send_all(chunk)
            except Exception as e:
                exc = e
                break
        if exc is None:
            return f"no error in {MAX_WRITES} sends", None
        try:
            data = await stream.receive_some(1024)
            after = "returns b''" if not data else "returns data"
        except Exception as e:
            after = f"raises {_family(e)}"
    finally:
        await stream.aclose()
    return f"send_all raises {_family(exc)}; then receive_some {after}", exc


async def _tk_reset_receive_main(port, address):
    stream = await port.open_tcp_stream(*address)
    try:
        try:
            data = await stream.receive_some(1024)
        except Exception as e:
            return f"receive_some raises {_family(e)}", e
        return f"receive_some returns {data!r}", None
    finally:
        await stream.aclose()


@pytest.mark.parametrize("side", ["send", "receive"])
def test_task_peer_reset(request, task_runtime, side):
    rt = task_runtime
    if side == "send":
        peer_args, main, key = dict(read_first=SMALL), _tk_reset_send_main, "reset_send"
    else:
        peer_args, main, key = dict(delay_s=SETTLE_S), _tk_reset_receive_main, "reset_receive"
    with ResettingPeer(**peer_args) as peer:
        with rt.open() as port:
            async def bounded(port):
                async with port.fail_after(LIMIT_S):
                    return await main(port, peer.address)
            outcome, exc = port.run(bounded)
            stream_error = port.StreamError
    assert peer.error is None and peer.reset_done
    check(request, rt, key, outcome, exc)
    # whatever its class, drivers must be able to catch it as port.StreamError
    assert isinstance(exc, stream_error), f"{exc!r} is not one of {stream_error}"


# ===========================================================================
# Callback style: abort() drops what is buffered

def _cb_abort(rt):
    payload = _payload(5, BIG)
    seen = {}

    def body(s):
        server = Recorder(on_lost=s.lost)
        client = Recorder(on_lost=s.lost)
        seen["server"], seen["client"] = server, client
        s.listen(lambda: server)
        s.expect_lost(2)

        def connected(t):
            t.write(payload)
            seen["buffered"] = t.get_write_buffer_size()
            t.abort()
            seen["closing"] = t.is_closing()
            t.write(b"after abort")            # dropped, never raises
        s.connect(client, connected, sockbuf=SOCKBUF)

    _, probe = cb_session(rt, body, sockbuf=SOCKBUF)
    return payload, seen, probe


def test_callback_abort_drops_buffered_bytes(request, callback_runtime):
    rt = callback_runtime
    payload, seen, _ = _cb_abort(rt)
    server, client = seen["server"], seen["client"]
    got = bytes(server.data)
    assert seen["buffered"] > 0, "precondition: the write left bytes in user space"
    assert seen["closing"] is True
    assert len(got) < len(payload), "abort() delivered everything"
    assert got == payload[:len(got)], "the peer got bytes that are not a prefix"
    if server.lost and server.lost[0] is not None:
        ending = f"reset ({_family(server.lost[0])})"
    else:
        ending = "EOF" if server.eof else "no EOF"
    lost = "connection_lost(None)" if client.lost == [None] else f"connection_lost{client.lost}"
    check(request, rt, "abort", f"peer: prefix then {ending}; {lost}",
          {"buffered": seen["buffered"], "peer_got": len(got)})


def _abort_counted(reported, buffered: int) -> str:
    if reported is None:
        return "unseen (None)"
    if reported == buffered:
        return "counted exactly"
    return "reported 0" if reported == 0 else "reported a different count"


def test_callback_abort_loss_is_counted_by_the_probe(request, callback_runtime):
    """What abort() dropped is loss: the probe reports exactly that many bytes in
    lost_on_abort_bytes, or None if it can't see them -- never a zero."""
    rt = callback_runtime
    _, seen, probe = _cb_abort(rt)
    check(request, rt, "abort_counted", _abort_counted(probe["lost_on_abort_bytes"],
                                                       seen["buffered"]),
          {"buffered": seen["buffered"], "reported": probe["lost_on_abort_bytes"]})


async def _st_abort_body(port, listener, host, p, payload):
    seen = {}
    done = port.Event()

    async def sink(reader, writer):
        try:
            seen["data"] = await reader.read()
            seen["ending"] = "EOF"
        except Exception as exc:
            seen["ending"] = f"raises {_family(exc)}"
        finally:
            writer.close()
            done.set()

    server = await port.start_server(sink, sock=listener)
    try:
        _reader, writer = await port.open_connection(host, p, sockbuf=SOCKBUF)
        writer.write(payload)
        seen["buffered"] = writer.transport.get_write_buffer_size()
        writer.transport.abort()
        await done.wait()
    finally:
        server.close()
    return seen


def test_stream_abort_loss_is_counted_by_the_probe(request, stream_runtime):
    """``writer.transport.abort()`` (the push driver's disconnect) drops the
    buffer: the peer gets a prefix, and the probe counts the rest as lost."""
    rt = stream_runtime
    payload = _payload(5, BIG)
    seen, probe = st_session(rt, _st_abort_body, payload, sockbuf=SOCKBUF)
    assert seen["buffered"] > 0, "precondition: the write left bytes in user space"
    got = seen.get("data", b"")
    assert len(got) < len(payload) and got == payload[:len(got)]
    assert seen["ending"] == "EOF", seen["ending"]     # as on the callback port
    check(request, rt, "abort_counted", _abort_counted(probe["lost_on_abort_bytes"],
                                                       seen["buffered"]),
          {"buffered": seen["buffered"], "reported": probe["lost_on_abort_bytes"]})


# ===========================================================================
# Callback and stream style: write() after close()

def _cb_write_after_close(rt):
    payload = _payload(9, BIG)
    seen = {}

    def body(s):
        s.listen(lambda: Recorder(on_lost=s.lost))
        s.expect_lost(4)

        def write_then(t, data):
            if data:
                t.write(data)
            t.close()
            try:
                t.write(b"LATE")
                seen.setdefault("raised", []).append(None)
            except Exception as exc:
                seen.setdefault("raised", []).append(type(exc).__name__)

        empty, buffered = Recorder(on_lost=s.lost), Recorder(on_lost=s.lost)
        seen["empty"], seen["buffered"] = empty, buffered
        s.connect(empty, lambda t: write_then(t, b""), sockbuf=SOCKBUF)
        s.connect(buffered, lambda t: write_then(t, payload), sockbuf=SOCKBUF)

    session, probe = cb_session(rt, body, sockbuf=SOCKBUF)
    return payload, seen, session.accepted, probe


def _late_outcome(got: bytes, payload: bytes) -> str:
    if got == payload + b"LATE":
        return "delivered"
    if got == payload:
        return "dropped"
    return f"{len(got)} bytes, neither"


def test_callback_write_after_close(request, callback_runtime):
    rt = callback_runtime
    payload, seen, servers, probe = _cb_write_after_close(rt)
    raised = [r for r in seen["raised"] if r is not None]
    assert len(servers) == 2 and all(s.eof for s in servers)
    by_size = sorted(servers, key=lambda s: len(s.data))
    parts = [f"empty: {_late_outcome(bytes(by_size[0].data), b'')}",
             f"buffered: {_late_outcome(bytes(by_size[1].data), payload)}",
             f"counted {probe['writes_after_close_count']}"]
    outcome = "; ".join(parts) if not raised else f"write raises {raised}"
    check(request, rt, "write_after_close", outcome)


async def _st_write_after_close_body(port, listener, host, p, payload):
    got = []
    done = port.Event()

    async def sink(reader, writer):
        try:
            got.append(await reader.read())
        finally:
            writer.close()
            if len(got) == 2:
                done.set()

    raised = []
    server = await port.start_server(sink, sock=listener)
    try:
        for data in (b"", payload):
            _reader, writer = await port.open_connection(host, p, sockbuf=SOCKBUF)
            if data:
                writer.write(data)
            writer.close()
            try:
                writer.write(b"LATE")
            except Exception as exc:
                raised.append(type(exc).__name__)
            try:
                await writer.wait_closed()
            except ConnectionError:
                pass
        await done.wait()
    finally:
        server.close()
    return sorted(got, key=len), raised


def test_stream_write_after_close(request, stream_runtime):
    rt = stream_runtime
    payload = _payload(9, BIG)
    (got, raised), probe = st_session(rt, _st_write_after_close_body, payload, sockbuf=SOCKBUF)
    parts = [f"empty: {_late_outcome(got[0], b'')}",
             f"buffered: {_late_outcome(got[1], payload)}",
             f"counted {probe['writes_after_close_count']}"]
    outcome = "; ".join(parts) if not raised else f"write raises {raised}"
    check(request, rt, "write_after_close", outcome)


# ===========================================================================
# Stream style: two tasks in drain() on one writer (CPython 74116)

async def _st_two_drainers_body(port, listener, host, p, payload):
    release = port.Event()
    seen = {}

    async def slow_sink(reader, writer):
        try:
            await release.wait()
            seen["data"] = await reader.read()
        finally:
            writer.close()

    async def drainer(writer, name):
        try:
            await port.wait_for(writer.drain(), 5.0)
            seen[name] = "woke"
        except port.TimeoutError:
            seen[name] = "hangs"
        except Exception as exc:
            seen[name] = f"raises {type(exc).__name__}"

    server = await port.start_server(slow_sink, sock=listener)
    try:
        _reader, writer = await port.open_connection(host, p, sockbuf=SOCKBUF)
        writer.write(payload)                      # far over high water: paused
        tasks = [port.create_task(drainer(writer, n)) for n in ("first", "second")]
        await port.sleep(SETTLE_S)
        seen["both_waiting"] = not any(t.done() for t in tasks)
        release.set()
        await port.gather(*tasks)
        writer.close()
        await writer.wait_closed()
        while "data" not in seen:
            await port.sleep(0.01)
    finally:
        server.close()
    return seen


def test_stream_two_drainers_both_wake(request, stream_runtime):
    rt = stream_runtime
    payload = _payload(11, BIG)
    seen, _ = st_session(rt, _st_two_drainers_body, payload, sockbuf=SOCKBUF)
    assert seen["both_waiting"], "precondition: drain() must block while paused"
    outcome = "both wake" if seen["first"] == seen["second"] == "woke" else (
        f"first {seen['first']}, second {seen['second']}")
    check(request, rt, "two_drainers", outcome)
    assert seen["data"] == payload


# ===========================================================================
# Task style: closing a stream under a blocked task; use after close

async def _tk_close_while_body(port, listener, host, p, direction):
    seen = {}
    client, server = await tk_pair(port, listener, host, p, sockbuf=SOCKBUF)
    try:
        async def blocked():
            async with port.move_on_after(HANG_S) as scope:
                try:
                    if direction == "receiving":
                        await client.receive_some(1024)
                    else:
                        await client.send_all(bytes(BIG))  # the peer never reads
                    seen["outcome"] = "returned"
                except Exception as exc:
                    seen["outcome"], seen["exc"] = type(exc).__name__, exc
            if scope.cancelled_caught:
                seen["outcome"] = "hangs"

        async def closer():
            await port.sleep(SETTLE_S)
            await client.aclose()

        async with port.open_nursery() as n:
            await n.spawn(blocked)
            await n.spawn(closer)
    finally:
        await client.aclose()
        await server.aclose()
    return seen


@pytest.mark.parametrize("direction", ["receiving", "sending"])
def test_task_close_while_blocked(request, task_runtime, direction):
    rt = task_runtime
    seen = tk_session(rt, _tk_close_while_body, direction, sockbuf=SOCKBUF)
    check(request, rt, f"close_while_{direction}", seen["outcome"], seen.get("exc"))


async def _tk_use_after_close_body(port, listener, host, p):
    client, server = await tk_pair(port, listener, host, p)
    try:
        await client.aclose()
        await client.aclose()                 # idempotent, as trio's check requires
        out = {}
        for name, call in (("send_all", lambda: client.send_all(b"x")),
                           ("receive_some", lambda: client.receive_some(1024))):
            try:
                await call()
                out[name] = "no error"
            except Exception as exc:
                out[name] = exc
    finally:
        await server.aclose()
    return out


def _names(out: dict) -> str:
    return "; ".join(f"{k}: {v if isinstance(v, str) else type(v).__name__}"
                     for k, v in out.items())


def test_task_use_after_close(request, task_runtime):
    rt = task_runtime
    out = tk_session(rt, _tk_use_after_close_body)
    check(request, rt, "use_after_close", _names(out), out)


async def _tk_send_after_eof_body(port, listener, host, p):
    client, server = await tk_pair(port, listener, host, p)
    try:
        await client.send_eof()
        try:
            await client.send_all(b"x")
            return "no error", None
        except Exception as exc:
            return type(exc).__name__, exc
    finally:
        await client.aclose()
        await server.aclose()


def test_task_send_after_send_eof(request, task_runtime):
    rt = task_runtime
    outcome, exc = tk_session(rt, _tk_send_after_eof_body)
    check(request, rt, "send_after_eof", outcome, exc)


def test_task_closed_stream_errors_are_stream_errors(request, task_runtime):
    """Drivers catch ``port.StreamError`` for "the stream broke or was closed under
    me" (the push driver's disconnect relies on it), so every error the cases
    above raise for a closed stream must be one."""
    rt = task_runtime
    raised = {}
    for direction in ("receiving", "sending"):
        seen = tk_session(rt, _tk_close_while_body, direction, sockbuf=SOCKBUF)
        if "exc" in seen:
            raised[f"close_while_{direction}"] = seen["exc"]
    for name, value in tk_session(rt, _tk_use_after_close_body).items():
        if not isinstance(value, str):
            raised[f"use_after_close.{name}"] = value
    _, exc = tk_session(rt, _tk_send_after_eof_body)
    if exc is not None:
        raised["send_after_eof"] = exc
    with rt.open() as port:
        stream_error = port.StreamError
    outside = sorted(f"{k}: {type(v).__name__}" for k, v in raised.items()
                     if not isinstance(v, stream_error))
    check(request, rt, "not_stream_errors", ", ".join(outside) or "none", stream_error)


# ===========================================================================
# Task style: concurrent misuse -- a second receiver / sender on one stream

async def _tk_concurrent_body(port, listener, host, p, direction):
    seen = {}
    client, server = await tk_pair(port, listener, host, p, sockbuf=SOCKBUF)
    first_payload = _payload(13, BIG)
    try:
        async def first():
            if direction == "receive":
                seen["first_got"] = await client.receive_some(1024)
            else:
                await client.send_all(first_payload)
                await client.send_eof()

        async def second():
            try:
                if direction == "receive":
                    await client.receive_some(1024)
                else:
                    await client.send_all(b"B" * 100)
                seen["second"] = "no error"
            except Exception as exc:
                seen["second"], seen["exc"] = type(exc).__name__, exc

        async with port.open_nursery() as n:
            await n.spawn(first)
            await port.sleep(SETTLE_S)          # first is blocked now
            async with port.move_on_after(HANG_S) as scope:
                await second()
            if scope.cancelled_caught:
                seen["second"] = "hangs"
            # Unblock the first call and see whether it survived the misuse.
            if direction == "receive":
                await server.send_all(b"x")
            else:
                seen["peer_got"] = await tk_read_all(server)
        if direction == "receive":
            intact = seen.get("first_got") == b"x"
        else:
            intact = seen["peer_got"] == first_payload
            if not intact and b"B" * 100 in seen["peer_got"]:
                seen["second"] += "; interleaved"
    finally:
        await client.aclose()
        await server.aclose()
    return f"{seen['second']}; first {'intact' if intact else 'broken'}", seen.get("exc")


@pytest.mark.parametrize("direction", ["receive", "send"])
def test_task_concurrent_misuse(request, task_runtime, direction):
    rt = task_runtime
    outcome, exc = tk_session(rt, _tk_concurrent_body, direction, sockbuf=SOCKBUF)
    check(request, rt, f"concurrent_{direction}", outcome, exc)


# ===========================================================================
# The declarations themselves

def test_declarations_name_real_runtimes_and_keys():
    for rid, diffs in DIFFERENCES.items():
        assert rid in runtimes.RUNTIMES, rid
        style = runtimes.RUNTIMES[rid].style
        assert set(diffs) <= set(CONTRACT[style]), (rid, set(diffs) - set(CONTRACT[style]))
        for key, value in diffs.items():
            assert value != CONTRACT[style][key], f"{rid}.{key} repeats the contract"
    for (rid, key), reason in KNOWN_BUGS.items():
        assert rid in runtimes.RUNTIMES and reason
        assert key in CONTRACT[runtimes.RUNTIMES[rid].style], key
