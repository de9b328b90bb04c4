"""What the conformance tests share: sizes and bounds, peers, and bounded port runs.

Every run here is bounded (port-level timeouts, a watchdog timer on callback
loops, joined peer threads), uses 127.0.0.1 and small sizes, and closes what
it opens, whatever way it ends.
"""
from __future__ import annotations

import random
import socket
import struct
import threading
import time

from protocols.ports import bind_listener

BIG = 1 << 20            # one connection's round trip; the "buffered" writes
SMALL = 64 * 1024        # each of MANY connections' round trip
MANY = 100
SOCKBUF = 64 * 1024      # pinned where bytes must pile up in user space (~192 KiB fit in the kernel)
CHUNK = 64 * 1024
LIMIT_S = 30.0           # a whole port run; 2 noisy cores, so generous -- it only bounds a hang
HANG_S = 0.5             # "blocked and not woken" after this long counts as a hang
SETTLE_S = 0.1           # lets a spawned task reach its blocking call
MAX_WRITES = 500         # bounds a write-until-error loop (drain blocks long before)


def random_payload(seed: int, n: int) -> bytes:
    # Random per connection: a swapped, repeated or dropped chunk can't match.
    return random.Random(seed).randbytes(n)


def error_family(exc: BaseException) -> str:
    """An exception as the declarations name it: OS connection errors by their
    common base (which one of EPIPE/ECONNRESET comes first is a race), anything
    else by its class name."""
    if isinstance(exc, ConnectionError):
        return "ConnectionError"
    return type(exc).__name__




# Style-specific tests take ``looplab_runtime`` / ``looplab_runtime`` /
# ``looplab_runtime``: the same specs as conftest's ``runtime`` (``--runtimes``

# ---------------------------------------------------------------------------
# A peer that resets: a plain blocking socket in a thread, so the reset comes
# from outside the runtime under test.

class ResettingPeer:
    """Accept one connection, read ``read_first`` bytes (or wait ``delay_s``), then
    close with SO_LINGER 0 -- the kernel sends RST instead of FIN. Every blocking
    call has a timeout; ``close()`` joins the thread and releases the sockets."""

    def __init__(self, read_first: int = 0, delay_s: float = 0.0):
        self.listener = bind_listener("127.0.0.1", 0, sockbuf=SOCKBUF)
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
    listener = bind_listener(sockbuf=sockbuf)
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
    listener = bind_listener(sockbuf=sockbuf)
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
    sock = bind_listener(sockbuf=sockbuf)
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

