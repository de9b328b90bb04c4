"""Drivers carry out what the cores decide, and survive faulty peers.

Part 1 feeds a core events through a driver over fake transports/streams that
record every call, and checks the calls one by one; an action a driver has no
case for must raise. Part 2 runs ``looplab serve`` in a subprocess and throws
the faulty peers of issue 12 at it over 127.0.0.1, checking that the proxy
closes both sides as one unit, that file descriptors return to baseline and
that push survives 1,000 idle connections. Part 3 holds minimal reproductions
of behaviour that belongs to a library itself, using that library alone.
"""
from __future__ import annotations

import asyncio
import collections
import importlib.util
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from protocols import apps, callback, common, cores, push, relay, stream, task

pytestmark = pytest.mark.timeout(180)

LOOPLAB = [sys.executable, "-c", "from bench.cli import main; raise SystemExit(main())"]
ROOT = Path(__file__).resolve().parent.parent
HAVE = {name: importlib.util.find_spec(name) is not None for name in ("uvloop", "trio", "curio")}


# --------------------------------------------------------------------------- fakes

class FakeTransport:
    """Records every call a callback driver makes on its transport."""

    def __init__(self, log: list, name: str):
        self.log, self.name = log, name
        self.closing = False

    def _rec(self, *call):
        self.log.append((self.name, *call))

    def write(self, data):
        self._rec("write", bytes(data))

    def write_eof(self):
        self._rec("write_eof")

    def close(self):
        self._rec("close")
        self.closing = True

    def abort(self):
        self._rec("abort")
        self.closing = True

    def pause_reading(self):
        self._rec("pause_reading")

    def resume_reading(self):
        self._rec("resume_reading")

    def is_closing(self):
        return self.closing

    def get_write_buffer_size(self):
        return 0


class FakeCallbackPort:
    """Enough of a CallbackPort for one relay: connect() is completed by the test."""

    def __init__(self):
        self.pending = None
        self.stopped = False

    def connect(self, factory, host, port, on_done, sockbuf=None):
        self.pending = (factory, on_done)

    def call_soon(self, fn, *args):
        pass

    def stop(self):
        self.stopped = True


def relay_server(variant="fixed", **params):
    port = FakeCallbackPort()
    server = callback.Server(port, "proxy", variant, {"upstream": ("127.0.0.1", 9), **params})
    server.server = type("S", (), {"close": lambda self: None})()
    return port, server


def connect_upstream(port, log):
    factory, on_done = port.pending
    proto_b = factory()
    t_b = FakeTransport(log, "b")
    proto_b.connection_made(t_b)
    on_done(t_b, proto_b, None)
    return proto_b


# --------------------------------------------------------------------------- 1: driver acts

def test_callback_relay_carries_out_the_core_in_order():
    log: list = []
    port, server = relay_server("fixed")
    a = server.factory()
    a.connection_made(FakeTransport(log, "a"))
    assert log == [("a", "pause_reading")]          # nothing is read before b exists
    a.data_received(b"early")                       # uvloop reads anyway
    b = connect_upstream(port, log)
    assert log[1:] == [("b", "write", b"early"), ("a", "resume_reading")]
    del log[:]
    b.pause_writing()                               # fixed: follow the port's pause
    b.resume_writing()
    a.data_received(b"more")
    assert a.eof_received() is True                 # the core, not the transport, closes
    assert log == [("a", "pause_reading"), ("a", "resume_reading"), ("b", "write", b"more"),
                   ("a", "close"), ("b", "close")]
    a.connection_lost(None)
    assert not port.stopped                         # b still flushing: not over yet
    b.connection_lost(None)
    assert port.stopped                             # one-shot: over once both are gone


def test_callback_naive_relay_ignores_pause_writing():
    log: list = []
    port, server = relay_server("naive")
    a = server.factory()
    a.connection_made(FakeTransport(log, "a"))
    b = connect_upstream(port, log)
    del log[:]
    b.pause_writing()
    a.data_received(b"x")
    assert log == [("b", "write", b"x")]


def test_callback_client_that_leaves_before_upstream_connects_closes_it():
    log: list = []
    port, server = relay_server("fixed", forever=True)
    a = server.factory()
    a.connection_made(FakeTransport(log, "a"))
    a.connection_lost(ConnectionResetError())       # reset before the upstream exists
    connect_upstream(port, log)
    assert log[-1] == ("b", "abort")


def test_callback_one_way_passes_the_upstreams_eof_on_and_keeps_relaying():
    log: list = []
    port, server = relay_server("fixed")
    a = server.factory()
    a.connection_made(FakeTransport(log, "a"))
    b = connect_upstream(port, log)
    del log[:]
    b.data_received(b"ignored")                     # one-way: nothing goes back
    assert b.eof_received() is True
    a.data_received(b"x")
    assert log == [("a", "write_eof"), ("b", "write", b"x")]


def test_callback_two_way_passes_half_close_on():
    log: list = []
    port, server = relay_server("fixed", two_way=True)
    a = server.factory()
    a.connection_made(FakeTransport(log, "a"))
    b = connect_upstream(port, log)
    del log[:]
    a.data_received(b"req")
    assert a.eof_received() is True
    b.data_received(b"resp")
    assert b.eof_received() is True
    assert log == [("b", "write", b"req"), ("b", "write_eof"), ("a", "write", b"resp"),
                   ("a", "write_eof"), ("a", "close"), ("b", "close")]


class FakeWriter:
    def __init__(self, log, name):
        self.log, self.name = log, name
        self.transport = FakeTransport(log, name)

    def write(self, data):
        self.log.append((self.name, "write", bytes(data)))

    def write_eof(self):
        self.log.append((self.name, "write_eof"))

    async def drain(self):
        self.log.append((self.name, "drain"))

    def close(self):
        self.log.append((self.name, "close"))
        self.transport.closing = True

    async def wait_closed(self):
        self.log.append((self.name, "wait_closed"))


class FakeReader:
    def __init__(self, chunks):
        self.chunks = list(chunks)

    async def read(self, n=-1):
        if self.chunks:
            item = self.chunks.pop(0)
            if isinstance(item, BaseException):
                raise item
            return item
        await asyncio.sleep(3600)         # a silent peer: the relay must cancel this read


class FakeStreamPort:
    """asyncio's names, with open_connection handing out the fake upstream."""
    Event = asyncio.Event
    create_task = staticmethod(asyncio.ensure_future)

    def __init__(self, up_reader, up_writer):
        self.up = (up_reader, up_writer)

    async def open_connection(self, host, port, **kw):
        return self.up


def run_stream_proxy(variant, client_chunks, upstream_chunks, **params):
    log: list = []
    port = FakeStreamPort(FakeReader(upstream_chunks), FakeWriter(log, "b"))
    served = common.Served(port, "stream", "proxy", variant,
                           {"upstream": ("127.0.0.1", 9), **params})
    coro = relay.stream_proxy(served, FakeReader(client_chunks), FakeWriter(log, "a"))
    asyncio.run(asyncio.wait_for(coro, 5))
    return log


def test_stream_relay_closes_both_sides_on_client_eof():
    # The issue-12 hang: a client that half-closes must get EOF back.
    assert run_stream_proxy("fixed", [b"REQ 1\n", b""], []) == [
        ("b", "write", b"REQ 1\n"), ("b", "drain"),
        ("a", "close"), ("a", "wait_closed"), ("b", "close"), ("b", "wait_closed")]


def test_stream_naive_relay_neither_drains_nor_waits():
    assert run_stream_proxy("naive", [b"x", b""], []) == [
        ("b", "write", b"x"), ("a", "close"), ("b", "close")]


def test_stream_relay_aborts_upstream_when_the_client_resets():
    assert run_stream_proxy("fixed", [ConnectionResetError()], []) == [("b", "abort")]


def test_stream_relay_closes_client_when_upstream_resets():
    assert run_stream_proxy("naive", [], [ConnectionResetError()]) == [("a", "abort")]


class FakeStream:
    def __init__(self, log, name, chunks):
        self.log, self.name, self.chunks = log, name, list(chunks)

    async def receive_some(self, n=65536):
        if self.chunks:
            return self.chunks.pop(0)
        await asyncio.sleep(3600)

    async def send_all(self, data):
        self.log.append((self.name, "send_all", bytes(data)))

    async def send_eof(self):
        self.log.append((self.name, "send_eof"))

    async def aclose(self):
        self.log.append((self.name, "aclose"))


class FakeNursery:
    def __init__(self):
        self.tasks = []

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def spawn(self, fn, *args):
        self.tasks.append(asyncio.ensure_future(fn(*args)))

    async def cancel(self):
        for t in self.tasks:
            t.cancel()


class FakeTaskPort:
    Event = asyncio.Event
    StreamError = (ConnectionError,)

    def __init__(self, upstream):
        self.upstream = upstream

    async def open_tcp_stream(self, host, port, sockbuf=None):
        return self.upstream

    def open_nursery(self):
        return FakeNursery()


def test_task_relay_two_way_half_close_then_closes_both():
    log: list = []
    port = FakeTaskPort(FakeStream(log, "b", [b"resp", b""]))
    served = common.Served(port, "task", "proxy", "naive",
                           {"upstream": ("127.0.0.1", 9), "two_way": True})
    asyncio.run(asyncio.wait_for(relay.task_proxy(served, FakeStream(log, "a", [b"req", b""])), 5))
    assert sorted(log[:4]) == sorted([("b", "send_all", b"req"), ("b", "send_eof"),
                                      ("a", "send_all", b"resp"), ("a", "send_eof")])
    assert log[4:] == [("b", "aclose"), ("a", "aclose")]


@pytest.mark.parametrize("driver", ["callback", "stream", "task"])
def test_an_unknown_action_raises(driver):
    class Teleport(cores.Action):
        __slots__ = ()
    odd = [Teleport()]
    if driver == "callback":
        port, server = relay_server()
        proxy = relay.Relay(server)
        with pytest.raises(cores.UnknownAction, match="Teleport"):
            proxy.act(odd)
        ticker = push.PushTicker(port, cores.PushCore("drop"), {})
        import collections
        with pytest.raises(cores.UnknownAction):
            ticker.act(collections.deque(odd))
        return
    core = cores.ProxyCore()
    core.data = lambda side, data: odd          # a core that hands out something new
    if driver == "stream":
        port = FakeStreamPort(FakeReader([]), FakeWriter([], "b"))
        served = common.Served(port, "stream", "proxy", "naive", {"upstream": ("h", 1)})
        served.new_core = lambda: core
        coro = relay.stream_proxy(served, FakeReader([b"x"]), FakeWriter([], "a"))
    else:
        port = FakeTaskPort(FakeStream([], "b", []))
        served = common.Served(port, "task", "proxy", "naive", {"upstream": ("h", 1)})
        served.new_core = lambda: core
        coro = relay.task_proxy(served, FakeStream([], "a", [b"x"]))
    with pytest.raises(cores.UnknownAction, match="Teleport"):
        asyncio.run(asyncio.wait_for(coro, 5))


def test_app_table_covers_every_driver_and_variant():
    for style, module in (("callback", callback), ("stream", stream), ("task", task)):
        assert set(module.HANDLERS) == set(apps.APPS)
        assert module.VARIANTS == apps.variants(style)
    assert apps.variants("stream")["proxy"] == ("naive", "fixed", "limits0")
    # the task port's variants change nothing: same flags, same code
    flags = {(v.honour_pause, v.drain, v.zero_limits) for v in apps.APPS["proxy"].variants["task"]}
    assert flags == {(False, False, False)}
    with pytest.raises(apps.UsageError, match="valid: naive, fixed"):
        apps.variant("echo", "callback", "limits0")
    with pytest.raises(TypeError, match="missing"):
        apps.bind("task", {"echo": None})


# --------------------------------------------------------------------------- 2: faulty peers

class Served:
    """``looplab serve`` in a subprocess; stderr goes to a file (a pipe could fill
    with tracebacks and stall the very server under test)."""

    def __init__(self, app, runtime, *args, cwd=ROOT, tmp_path=None):
        self.err_path = Path(tmp_path or "/tmp") / f"serve-{app}-{runtime}-{os.getpid()}.err"
        self.err = open(self.err_path, "w+")
        self.proc = subprocess.Popen(
            LOOPLAB + ["serve", app, "--runtime", runtime, "--listen", "127.0.0.1:0", *args],
            stdout=subprocess.PIPE, stderr=self.err, cwd=cwd, text=True)
        self.err.close()          # the child holds its own copy
        ready, _, _ = select.select([self.proc.stdout], [], [], 30)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith("listening on "):
            self.stop()
            raise AssertionError(f"server did not start: {line!r} {self.stderr()}")
        host, port = line.split()[-1].rsplit(":", 1)
        self.addr = (host, int(port))

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def stderr(self) -> str:
        return self.err_path.read_text()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait(5)
        self.proc.stdout.close()
        return rc

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        self.err_path.unlink(missing_ok=True)


class Upstream:
    """A blocking echo server in a thread that counts its open connections: the
    proxy's upstream, and the witness of whether the proxy closed its side. It
    echoes until EOF, then closes."""

    def __init__(self):
        self.lsock = socket.create_server(("127.0.0.1", 0), backlog=2048)
        self.addr = self.lsock.getsockname()
        self.conns: set = set()
        self.stopping = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stopping:
            ready, _, _ = select.select([self.lsock, *self.conns][:1000], [], [], 0.05)
            for s in ready:
                if s is self.lsock:
                    c, _ = s.accept()
                    c.setblocking(False)
                    self.conns.add(c)
                    continue
                try:
                    data = s.recv(65536)
                    if data:
                        s.sendall(data)
                        continue
                except OSError:
                    pass
                self.conns.discard(s)
                s.close()

    def open_count(self, settle_s: float = 5.0, want: int = 0) -> int:
        """Open connections, waiting up to ``settle_s`` for them to fall to ``want``."""
        deadline = time.monotonic() + settle_s
        while len(self.conns) > want and time.monotonic() < deadline:
            time.sleep(0.05)
        return len(self.conns)

    def close(self):
        self.stopping = True
        self.thread.join(5)
        for c in list(self.conns):
            c.close()
        self.lsock.close()


def dial(addr, timeout=5.0) -> socket.socket:
    s = socket.create_connection(addr, timeout=timeout)
    return s


def reset_at_once(addr):
    s = dial(addr)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


def read_to_eof(s, timeout=5.0) -> tuple[bytes, bool]:
    """(bytes read, whether EOF came within ``timeout``)."""
    s.settimeout(timeout)
    got = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            chunk = s.recv(65536)
            if not chunk:
                return bytes(got), True
            got += chunk
    except (socket.timeout, OSError):
        pass
    return bytes(got), False


def request_then_half_close(addr, payload=b"REQ 1\n") -> tuple[bytes, bool]:
    with dial(addr) as s:
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        return read_to_eof(s)


def _socket_states(server) -> str:
    """What the server's open TCP sockets are doing, by state, for a failure's
    message (ss's states: a socket the peer closed is CLOSE-WAIT)."""
    try:
        out = subprocess.run(["ss", "-tanp"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "ss not available"
    states = collections.Counter(line.split()[0] for line in out.splitlines()
                                 if f"pid={server.proc.pid}," in line)
    return "server sockets by state: " + (", ".join(f"{k} {v}" for k, v in states.items())
                                          or "none seen")


def fds_settle(server, baseline, settle_s=5.0) -> int:
    deadline = time.monotonic() + settle_s
    while server.fds() > baseline and time.monotonic() < deadline:
        time.sleep(0.05)
    return server.fds()


@pytest.fixture
def upstream():
    up = Upstream()
    yield up
    up.close()


@pytest.mark.skipif(not HAVE["trio"], reason="trio not installed")
def test_trio_interrupt_lands_at_a_checkpoint():
    """A Ctrl-C (or serve's SIGTERM) on a trio cell is raised at a checkpoint of
    the main task, never between two statements of a task: one landing between a
    nursery's __aenter__ and its `async with` abandoned the nursery half-open
    (trio: "Nursery stack corrupted"), and serve exited 1 instead of 130."""
    from bench import runtimes as rtmod
    port = rtmod.parse("trio").open()
    after = []

    async def child():
        os.kill(os.getpid(), signal.SIGINT)
        after.append("ran on")          # no checkpoint since the signal
        await port.sleep(5)

    async def main(port):
        async with port.open_nursery() as n:
            await n.spawn(child)
    try:
        with pytest.raises(BaseExceptionGroup) as info:
            port.run(main)
    finally:
        port.close()
    assert after == ["ran on"]
    assert info.value.subgroup(KeyboardInterrupt) is not None
    assert info.value.subgroup(lambda e: not isinstance(e, (KeyboardInterrupt, BaseExceptionGroup))) is None


@pytest.mark.parametrize("two_way", [False, True], ids=["one-way", "two-way"])
def test_proxy_client_half_close_gets_eof_back(runtime, two_way, upstream, tmp_path):
    """Issue 12: a request, a half-close, then reading until EOF -- the proxy
    must end both sides instead of hanging."""
    args = ["--upstream", "%s:%d" % upstream.addr, "--forever", "--variant", "fixed"]
    runtime = runtime.id
    with Served("proxy", runtime, *args, *(["--two-way"] if two_way else []),
                tmp_path=tmp_path) as server:
        for _ in range(3):
            data, eof = request_then_half_close(server.addr)
            assert eof, f"{runtime}: no EOF within 5 s after a half-close"
            assert data == (b"REQ 1\n" if two_way else b"")
        assert upstream.open_count() == 0, f"{runtime}: upstream left open"
        assert server.proc.poll() is None
        assert server.stop() == 130    # stopped by SIGTERM: interrupted
        err = server.stderr()
        assert "Traceback" not in err, err[-3000:]


def test_proxy_closes_upstreams_after_faulty_clients(runtime, upstream, tmp_path):
    """Issue 12: upstreams must be closed after their clients reset, stall or
    connect and leave, and the server's fds return to baseline."""
    args = ["--upstream", "%s:%d" % upstream.addr, "--forever"]
    runtime = runtime.id
    with Served("proxy", runtime, *args, tmp_path=tmp_path) as server:
        assert request_then_half_close(server.addr)[1]           # warm up, then measure
        assert upstream.open_count() == 0
        baseline = server.fds()
        for _ in range(30):
            reset_at_once(server.addr)
        for _ in range(200):
            dial(server.addr).close()
        idle = [dial(server.addr) for _ in range(200)]
        with dial(server.addr) as half:                          # half a request, then a reset
            half.sendall(b"REQ ")
            half.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        time.sleep(0.5)
        for s in idle:
            s.close()
        assert upstream.open_count(settle_s=10) == 0, f"{runtime}: upstreams left open"
        assert fds_settle(server, baseline, 10) <= baseline, f"{runtime}: fds grew"
        assert request_then_half_close(server.addr)[1]           # still serving
        assert server.stop() == 130    # stopped by SIGTERM: interrupted
        err = server.stderr()
        assert "Traceback" not in err, err[-3000:]


def first_bytes(addr, want=20_000, timeout=5.0) -> int:
    """Bytes a healthy push client received within ``timeout`` (stops at ``want``)."""
    with dial(addr) as c:
        c.settimeout(0.2)
        got, deadline = 0, time.monotonic() + timeout
        while got < want and time.monotonic() < deadline:
            try:
                chunk = c.recv(65536)
            except socket.timeout:
                continue
            if not chunk:
                break
            got += len(chunk)
        return got


PUSH_CASES = [("drop", r) for r in ("callback", "asyncio-protocol", "uvloop-protocol", "hybrid",
                                    "asyncio-streams", "coro", "trio")] + [
    (p, r) for r in ("curio", "uvloop-streams") for p in apps.PUSH_POLICIES]


@pytest.mark.parametrize("policy,rt", PUSH_CASES)
def test_push_survives_idle_connections(policy, rt, tmp_path):
    """Issue 12: curio printed thousands of BlockingIOError tracebacks, and on
    uvloop-streams a client connecting afterwards got nothing. Under "block" a
    client that never reads stalls everyone by design, so the healthy client is
    only checked once the idle ones have gone."""
    lib = next((name for name in HAVE if rt.startswith(name)), None)
    if lib and not HAVE[lib]:
        pytest.skip(f"{lib} is not installed")
    with Served("push", rt, "--variant", policy, tmp_path=tmp_path) as server:
        assert first_bytes(server.addr) >= 20_000
        baseline = server.fds()
        idle = [dial(server.addr) for _ in range(1000 if rt in ("curio", "uvloop-streams") else 300)]
        try:
            time.sleep(1.0)
            if policy != "block":
                assert first_bytes(server.addr) >= 20_000, f"{rt}: starved while idle ones wait"
        finally:
            for s in idle:
                s.close()
        assert first_bytes(server.addr) >= 20_000, f"{rt} {policy}: starved after the idle ones left"
        assert fds_settle(server, baseline, 10) <= baseline
        rc = server.stop()
        err = server.stderr()
        assert rc == 130, f"{rt} {policy}: SIGTERM gave exit {rc}: {err[-3000:]!r}"   # interrupted
        assert "Traceback" not in err and "BlockingIOError" not in err, err[-3000:]


TASK_RUNTIMES = ("coro", "trio", "curio")


@pytest.mark.parametrize("policy", ["block", "unbounded"])
@pytest.mark.parametrize("rt", TASK_RUNTIMES)
def test_task_push_reads_clients_for_eof(rt, policy, tmp_path):
    """Issue 12 on the task port: push never read from a client, so a half-close
    got no EOF back, and under "block" a departed client stayed open for good.
    Each client is now read until EOF and closed; a failed send closes it too."""
    lib = rt if rt in HAVE else None
    if lib and not HAVE[lib]:
        pytest.skip(f"{lib} is not installed")
    with Served("push", rt, "--variant", policy, tmp_path=tmp_path) as server:
        assert first_bytes(server.addr) >= 20_000
        baseline = server.fds()
        for _ in range(3):
            with dial(server.addr) as c:
                c.shutdown(socket.SHUT_WR)
                _, eof = read_to_eof(c)
            assert eof, f"{rt} {policy}: no EOF after a half-close"
        for _ in range(50):                 # connect, never read, leave
            dial(server.addr).close()
        for _ in range(20):                 # connect, never read, reset
            reset_at_once(server.addr)
        assert fds_settle(server, baseline, 10) <= baseline, (
            f"{rt} {policy}: fds grew; {_socket_states(server)}; server stderr: "
            f"{server.stderr()[-1500:]!r}")
        assert first_bytes(server.addr) >= 20_000
        rc = server.stop()
        err = server.stderr()
        assert rc == 130, f"{rt} {policy}: SIGTERM gave exit {rc}: {err[-3000:]!r}"   # interrupted
        assert "Traceback" not in err, err[-3000:]


# --------------------------------------------------------------------------- 3: the libraries' own

@pytest.mark.skipif(not HAVE["curio"], reason="curio is not installed")
def test_curio_own_behaviour_universal_event_wakeups_overflow(tmp_path):
    """curio's own behaviour, with curio alone: each UniversalEvent.set() that
    wakes a waiting task writes one byte to the kernel's notify socketpair from a
    Future callback; a few hundred of them without a kernel pass fill it, and
    every further one prints "exception calling callback for <Future ...>" with
    BlockingIOError [Errno 11]. (The woken tasks still run: the byte is only the
    wake-up signal.) So the curio port's Event is curio's in-kernel Event."""
    code = """if True:
        import curio
        async def main():
            events = [curio.UniversalEvent() for _ in range(2000)]
            async def waiter(e):
                await e.wait()
            tasks = [await curio.spawn(waiter, e) for e in events]
            await curio.sleep(0.1)
            def set_all():
                for e in events:
                    e.set()
            set_all()
            for t in tasks:
                await t.join()
        curio.run(main)
    """
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    assert "BlockingIOError" in out.stderr and "exception calling callback" in out.stderr
    import curio
    from protocols.trio_curio_ports import CurioPort
    port = CurioPort(None, {})
    try:
        assert port.Event is curio.Event
    finally:
        port.close()


@pytest.mark.skipif(not HAVE["uvloop"], reason="uvloop is not installed")
def test_uvloop_own_behaviour_write_after_close_raises():
    """uvloop's own behaviour, with uvloop alone: writing to a transport that has
    closed raises RuntimeError, where asyncio's selector transport ignores the
    write. A push ticker that wrote to a client that had just gone died of it
    (issue 12: nobody got anything afterwards); the drivers now skip closing
    transports and a ticker that fails ends the server loudly."""
    import uvloop

    async def main(loop_is_uv):
        loop = asyncio.get_running_loop()
        server = await loop.create_server(asyncio.Protocol, "127.0.0.1", 0)
        transport, _ = await loop.create_connection(asyncio.Protocol,
                                                    *server.sockets[0].getsockname()[:2])
        transport.close()
        await asyncio.sleep(0.05)
        try:
            transport.write(b"late")
            raised = False
        except RuntimeError:
            raised = True
        server.close()
        return raised

    assert uvloop.run(main(True)) is True
    assert asyncio.run(main(False)) is False


def _eofs_after_resume(run) -> int:
    """eof_received() calls when a protocol pauses reading at EOF, then resumes."""

    async def main():
        loop = asyncio.get_running_loop()
        eofs, seen = [], asyncio.Event()

        class P(asyncio.Protocol):
            def connection_made(self, transport):
                self.transport = transport

            def eof_received(self):
                eofs.append(1)
                if len(eofs) == 1:
                    self.transport.pause_reading()
                    loop.call_later(0.05, self.transport.resume_reading)
                    loop.call_later(0.3, seen.set)
                return True

        server = await loop.create_server(P, "127.0.0.1", 0)
        with socket.create_connection(server.sockets[0].getsockname()[:2]) as c:
            c.shutdown(socket.SHUT_WR)
            await asyncio.wait_for(seen.wait(), 5)
        server.close()
        return len(eofs)
    return run(main())


def test_asyncio_and_uvloop_own_behaviour_eof_again_after_resume():
    """The libraries' own behaviour, with each library alone: resume_reading()
    after EOF reads the socket again and calls eof_received() a second time.
    ProxyCore treats a second EOF as a driver bug, so the callback relay never
    resumes a side that has reported EOF."""
    assert _eofs_after_resume(asyncio.run) == 2
    if HAVE["uvloop"]:
        import uvloop
        assert _eofs_after_resume(uvloop.run) == 2
