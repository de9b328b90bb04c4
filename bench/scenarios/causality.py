"""S4 causality fingerprints: what a runtime's calls have *done* by the time they return.

The 2016 post calls an API causal when its effects are complete when the call
returns, so that ``f(); g()`` means f is finished before g starts. Every runtime
bends that somewhere -- a spawned child has not run yet, a write left bytes in
user space, a close has not closed -- and where it bends is what a program
written on it must know. This module measures those places. It is not a test
with a pass and a fail: a fingerprint is a row of facts, and each runtime declares
what its row is supposed to be (``RuntimeInfo.fingerprint``, measured on the
reference libraries), so that our kernels can be checked against the library
they imitate and a flipped option can be seen to change exactly what it claims.

The probes are written once per *style*, against the port API only, so the
same probe code measures our kernel and the library it is compared with
(callback / stream / task):

``child_ran_before_spawn_returned``
    call_soon / create_task / nursery spawn: had the child run when the call
    returned?
``child_first_after_yield_fraction``
    spawn, then one ``sleep(0)`` (callback: ``call_soon(child)`` then
    ``call_soon(parent_next)``): how often the child ran before the parent
    resumed, over ``trials``.
``user_buffered_after_write_bytes``
    ``write(1 MB)`` to a peer that never reads, 64 KiB socket buffers on both
    sides: bytes still in user space when write returned. The task style's
    ``send_all`` blocks instead (bounded at 0.5 s): None.
``closed_when_close_returned`` / ``closed_after_one_yield``
    close a quiet connection: is it closed -- the fd closed and, where the style
    has one, ``connection_lost`` run (the stream reader's EOF shows it) -- when
    close returns, and after one ``sleep(0)`` (callback: one loop pass)?
``other_tasks_during_nonblocking_sends_count``
    task style only: another task counts its turns while this one does 2000
    small sends that never block.
``cancel_semantics``
    a task is cancelled (stream: ``task.cancel()``; task: a ``move_on_after``
    expires), catches it and blocks again: the second block completes ("edge")
    or raises again ("level"). No tasks on the callback port: None.
``error_surface``
    the peer resets (SO_LINGER 0) while a send is pending: "at the call",
    "in a callback", "only in a log" or "nowhere".

A metric that does not apply to a style, or that the style cannot see, is
``None`` and ``notes[metric]`` says why -- never a made-up zero. ``details``
keeps the raw observations behind each verdict (how many bytes did get sent,
which exception surfaced, whether the fd and the protocol agreed about a close).

Peers here are plain stdlib sockets in *this* process, accepted synchronously
from a listener once the runtime's connect has completed (the connection is
already in the accept queue then); they never read unless a probe needs them
to, and they are closed before the probe ends. That is enough for S4: no probe
measures throughput, only order and state, so the peers need not live in another
process as the scenario peers must.

Hazards. ``child_first_after_yield_fraction`` is a frequency by design (trio
shuffles its batches), so it is compared with a tolerance, never for equality.
``other_tasks...`` assumes the 2000 sends never block; the sends are 64 bytes to
a draining reader with default socket buffers, which on loopback never fills.
The error probe waits at most 2 s for the reset to surface somewhere; a runtime
that swallows it entirely is reported "nowhere", which is a finding, not a hang.
"""
from __future__ import annotations

import os
import socket
import struct
import threading
import time

from bench import runtimes
from protocols.fingerprint import NONBLOCKING_SENDS, Between, Near, Positive, satisfies

__all__ = ["METRICS", "fingerprint", "declared_for",
           "matches", "satisfies", "Near", "Between", "Positive", "SURFACES"]

METRICS = (
    "child_ran_before_spawn_returned",
    "child_first_after_yield_fraction",
    "user_buffered_after_write_bytes",
    "closed_when_close_returned",
    "closed_after_one_yield",
    "other_tasks_during_nonblocking_sends_count",
    "cancel_semantics",
    "error_surface",
)

WRITE_BYTES = 1_000_000      # the S4 "write(1 MB)"
SOCKBUF = 64 * 1024          # SO_SNDBUF/SO_RCVBUF requested on both sides of that write
SENDS = NONBLOCKING_SENDS    # non-blocking sends for the turn-count probe (the declarations use it)
SEND_BYTES = 64
ERROR_WAIT_S = 2.0           # how long a reset may take to surface before "nowhere"
PROBE_LIMIT_S = 10.0         # watchdog per callback probe (none should come near it)
SURFACES = ("at the call", "in a callback", "only in a log", "nowhere")


# ---------------------------------------------------------------------------
# Expectations. What each runtime's row is supposed to be is declared on the
# runtime itself (``RuntimeInfo.fingerprint``, a ``protocols.fingerprint.Fingerprint``),
# with the tolerances a declared value may use.

def declared_for(runtime_spec: str) -> tuple[dict, list[str]]:
    """The declared fingerprint of a runtime spec: its runtime's row with the
    declared flips of its non-default options applied. Returns (table, problems):
    an option flip that is neither declared nor neutral is a problem (nothing is
    claimed for it), and so is a runtime without a declared row."""
    return runtimes.as_runtime(runtime_spec).declared_fingerprint()


def matches(runtime_spec: str, measured: dict) -> list[str]:
    """Mismatches between a measured fingerprint and the declared one, as readable
    lines (empty: it matches). Fractions are compared with their tolerance
    (±0.1, or trio's "strictly between 0.2 and 0.8"), byte counts as > 0 / 0 /
    None, everything else exactly."""
    if not isinstance(measured, dict):
        raise TypeError(f"measured must be a fingerprint dict, got {type(measured).__name__}")
    table, problems = declared_for(runtime_spec)
    out = list(problems)
    for metric, expected in table.items():
        if metric not in measured:
            out.append(f"{metric}: not measured (declared {expected!r})")
            continue
        got = measured[metric]
        if not satisfies(expected, got):
            out.append(f"{metric}: measured {got!r}, declared {expected!r}")
    return out


# ---------------------------------------------------------------------------
# Small shared pieces: the never-reading peer, the reset, the fd identity check.

class _Peers:
    """A listener with pinned buffers and the stdlib sockets accepted from it.
    ``accept()`` is called right after the runtime's connect completed, so it
    never waits (bounded at 2 s anyway). ``close()`` releases everything."""

    def __init__(self, sockbuf: int | None = SOCKBUF):
        self.listener = runtimes.bind_listener("127.0.0.1", 0, sockbuf=sockbuf)
        self.listener.settimeout(2.0)
        self.host, self.port = self.listener.getsockname()[:2]
        self.accepted: list[socket.socket] = []

    def accept(self) -> socket.socket:
        sock, _ = self.listener.accept()
        self.accepted.append(sock)
        return sock

    def close(self) -> None:
        for s in self.accepted:
            s.close()
        self.listener.close()


def _reset(sock: socket.socket) -> None:
    """Close with SO_LINGER 0: the kernel sends an RST instead of a FIN."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def _fd_watch(fileno: int):
    """A function telling whether ``fileno`` (open now) has been closed since:
    the fd is gone, or its number now names a different file."""
    ino = os.fstat(fileno).st_ino

    def closed() -> bool:
        try:
            return os.fstat(fileno).st_ino != ino
        except OSError:
            return True
    return closed


class _Drainer:
    """A thread that accepts one connection and reads it to EOF (the peer that
    drains, for the non-blocking-sends probe). Every wait is short, so ``close()``
    ends it promptly even if nobody connected; ``limit_s`` bounds it anyway."""

    def __init__(self, limit_s: float = 10.0):
        self.listener = runtimes.bind_listener("127.0.0.1", 0)
        self.listener.settimeout(0.05)
        self.host, self.port = self.listener.getsockname()[:2]
        self.received = 0
        self._deadline = time.monotonic() + limit_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="causality-drainer", daemon=True)
        self._thread.start()

    def _going(self) -> bool:
        return not self._stop.is_set() and time.monotonic() < self._deadline

    def _run(self):
        sock = None
        while sock is None and self._going():
            try:
                sock, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
        if sock is None:
            return
        with sock:
            sock.settimeout(0.05)
            while self._going():
                try:
                    data = sock.recv(65536)
                except socket.timeout:
                    continue
                except OSError:
                    return
                if not data:
                    return
                self.received += len(data)

    def close(self):
        """Call after the connection was closed (the thread then sees EOF)."""
        self._thread.join(1.0)
        self._stop.set()
        self._thread.join()
        self.listener.close()


# ---------------------------------------------------------------------------
# callback style: each probe is its own port.run(), bounded by a watchdog timer.

class _Recorder:
    """A plain protocol (the six asyncio methods) that remembers what happened."""

    def __init__(self):
        self.transport = None
        self.lost = False
        self.lost_exc = None
        self.paused = 0
        self.on_lost = None         # a probe's hook, called from connection_lost

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        pass

    def eof_received(self):
        return None

    def connection_lost(self, exc):
        self.lost = True
        self.lost_exc = exc
        if self.on_lost is not None:
            self.on_lost()

    def pause_writing(self):
        self.paused += 1

    def resume_writing(self):
        pass


def _cb_run(port, probe, limit_s: float = PROBE_LIMIT_S) -> bool:
    """Run ``probe(port, finish)`` inside the loop until it calls ``finish()``
    or the watchdog fires; True if it finished."""
    state = {"finished": False, "watchdog": None}

    def setup(port):
        state["watchdog"] = port.call_later(limit_s, port.stop)

        def finish():
            if not state["finished"]:
                state["finished"] = True
                port.stop()

        probe(port, finish)

    port.run(setup)
    if state["watchdog"] is not None:   # also when the probe stopped the loop on failure
        state["watchdog"].cancel()
    return state["finished"]


def _cb_connect(port, peers, on_ready, fail):
    """Connect a _Recorder to ``peers``; on success call on_ready(transport,
    recorder, peer_socket), else fail(exc)."""
    def done(transport, proto, exc):
        if exc is not None:
            fail(exc)
            return
        on_ready(transport, proto, peers.accept())
    port.connect(_Recorder, peers.host, peers.port, done, sockbuf=SOCKBUF)


def _callback_probes(port, trials, out, notes, details):
    # 1. call_soon never runs the callback inside call_soon.
    def spawn_probe(port, finish):
        ran = []
        port.call_soon(ran.append, True)
        out["child_ran_before_spawn_returned"] = bool(ran)
        port.call_soon(finish)
    _cb_run(port, spawn_probe)

    # 2. call_soon(child); call_soon(parent_next): FIFO or not.
    def order_probe(port, finish):
        hits = [0]

        def trial(i):
            order = []
            port.call_soon(order.append, "child")
            port.call_soon(parent_next, i, order)

        def parent_next(i, order):
            hits[0] += bool(order)
            if i + 1 < trials:
                trial(i + 1)
            else:
                out["child_first_after_yield_fraction"] = hits[0] / trials
                finish()
        trial(0)
    if not _cb_run(port, order_probe):
        notes["child_first_after_yield_fraction"] = "the trials did not finish in time"

    peers = _Peers()
    try:
        _callback_io_probes(port, peers, out, notes, details)
    finally:
        peers.close()


def _callback_io_probes(port, peers, out, notes, details):
    def failed(metric):
        def fail(exc):
            notes[metric] = f"connect failed: {exc!r}"
            port.stop()
        return fail

    # 3. write(1 MB) to a peer that never reads.
    def write_probe(port, finish):
        def ready(transport, proto, peer):
            transport.write(bytes(WRITE_BYTES))
            left = transport.get_write_buffer_size()
            out["user_buffered_after_write_bytes"] = left
            details["write"] = {"sent_at_once_bytes": WRITE_BYTES - left,
                                "pause_writing_called": proto.paused > 0}
            proto.on_lost = finish
            transport.abort()
        _cb_connect(port, peers, ready, failed("user_buffered_after_write_bytes"))
    _cb_run(port, write_probe)

    # 4. close a quiet connection: connection_lost run and fd closed?
    def close_probe(port, finish):
        def ready(transport, proto, peer):
            fd_closed = _fd_watch(transport.get_extra_info("socket").fileno())
            transport.close()
            now = (proto.lost, fd_closed())
            out["closed_when_close_returned"] = all(now)

            def one_pass():
                later = (proto.lost, fd_closed())
                out["closed_after_one_yield"] = all(later)
                details["close"] = {"when_returned": {"connection_lost": now[0], "fd_closed": now[1]},
                                    "after_one_yield": {"connection_lost": later[0],
                                                       "fd_closed": later[1]}}
                if proto.lost:
                    finish()
                else:
                    proto.on_lost = finish
            port.call_soon(one_pass)
        _cb_connect(port, peers, ready, failed("closed_when_close_returned"))
    _cb_run(port, close_probe)

    # 5. the peer resets while our write is pending.
    from bench.scenarios.programs import capture_output
    seen = {"handler": []}

    def error_probe(port, finish):
        loop = port.loop
        loop.set_exception_handler(lambda loop, context: seen["handler"].append(context))

        def ready(transport, proto, peer):
            seen["proto"] = proto
            transport.write(bytes(WRITE_BYTES))     # most of it stays buffered: a send is pending
            proto.on_lost = lambda: port.call_soon(finish)   # let a handler call land first
            port.call_later(0.05, _reset, peer)
        _cb_connect(port, peers, ready, failed("error_surface"))

    with capture_output() as captured:
        _cb_run(port, error_probe, limit_s=0.05 + ERROR_WAIT_S)   # the watchdog ends "nowhere"
    port.loop.set_exception_handler(None)
    proto = seen.get("proto")
    if proto is not None:
        logged = [str(c.get("message")) for c in seen["handler"]] + captured.lines
        if proto.lost_exc is not None:
            surface = "in a callback"
        elif logged:
            surface = "only in a log"
        else:
            surface = "nowhere"
        out["error_surface"] = surface
        details["error"] = {"connection_lost_called": proto.lost,
                            "connection_lost_exc": repr(proto.lost_exc) if proto.lost_exc else None,
                            "logged": logged[:5]}
        if proto.transport is not None and not proto.lost:
            proto.transport.abort()
            port.call_soon(port.stop)       # one pass: its connection_lost closes the socket
            port.run(lambda port: None)


# ---------------------------------------------------------------------------
# stream style: one main coroutine runs the probes in order.

async def _stream_main(port, trials, out, notes, details):
    # 1. create_task: has the child run when it returns?
    ran = []

    async def child():
        ran.append(True)
    t = port.create_task(child())
    out["child_ran_before_spawn_returned"] = bool(ran)
    await t

    # 2. create_task; one sleep(0); did the child run first?
    hits = 0
    for _ in range(trials):
        ran.clear()
        t = port.create_task(child())
        await port.sleep(0)
        hits += bool(ran)
        await t
    out["child_first_after_yield_fraction"] = hits / trials

    peers = _Peers()
    try:
        await _stream_io_probes(port, peers, out, notes, details)
    finally:
        peers.close()

    # 4. cancel a task that catches it and blocks again.
    state = {}

    async def victim():
        try:
            await port.sleep(10)
            state["first"] = "completed"
        except port.CancelledError:
            state["first"] = "cancelled"
            try:
                await port.sleep(0.05)
                state["second"] = "completed"
            except port.CancelledError:
                state["second"] = "cancelled"
                raise
    t = port.create_task(victim())
    await port.sleep(0)
    t.cancel()
    for _ in range(200):                # bounded: 2 s
        if t.done():
            break
        await port.sleep(0.01)
    details["cancel"] = dict(state, done=t.done())
    if not t.done():
        t.cancel()
        notes["cancel_semantics"] = "the cancelled task did not finish within 2 s"
    elif "second" in state:
        out["cancel_semantics"] = "edge" if state["second"] == "completed" else "level"
    else:
        notes["cancel_semantics"] = f"the cancellation was not delivered as expected: {state}"


async def _open(port, peers):
    reader, writer = await port.wait_for(
        port.open_connection(peers.host, peers.port, sockbuf=SOCKBUF), 5)
    return reader, writer, peers.accept()


async def _stream_io_probes(port, peers, out, notes, details):
    # 3a. write(1 MB) to a peer that never reads.
    reader, writer, peer = await _open(port, peers)
    writer.write(bytes(WRITE_BYTES))
    left = writer.transport.get_write_buffer_size()
    out["user_buffered_after_write_bytes"] = left
    details["write"] = {"sent_at_once_bytes": WRITE_BYTES - left}
    writer.transport.abort()
    await _bounded_wait_closed(port, writer)

    # 3b. close a quiet connection. connection_lost(None) feeds EOF to the reader,
    # so reader.at_eof() is the public sign that it ran.
    reader, writer, peer = await _open(port, peers)
    fd_closed = _fd_watch(writer.get_extra_info("socket").fileno())
    writer.close()
    now = (reader.at_eof(), fd_closed())
    await port.sleep(0)
    later = (reader.at_eof(), fd_closed())
    out["closed_when_close_returned"] = all(now)
    out["closed_after_one_yield"] = all(later)
    details["close"] = {"when_returned": {"connection_lost": now[0], "fd_closed": now[1]},
                        "after_one_yield": {"connection_lost": later[0], "fd_closed": later[1]}}
    await _bounded_wait_closed(port, writer)

    # 3c. the peer resets while we write and drain.
    from bench.scenarios.programs import capture_output
    reader, writer, peer = await _open(port, peers)

    async def resetter():
        await port.sleep(0.05)
        _reset(peer)
    rt = port.create_task(resetter())
    surface, error = None, None
    chunk = bytes(64 * 1024)
    with capture_output() as captured:
        deadline = time.monotonic() + 0.05 + ERROR_WAIT_S
        try:
            while time.monotonic() < deadline:
                writer.write(chunk)
                await port.wait_for(writer.drain(), max(0.01, deadline - time.monotonic()))
        except port.TimeoutError:   # before OSError: TimeoutError is one
            pass
        except Exception as exc:    # noqa: BLE001 -- any exception at the call is the finding
            surface, error = "at the call", exc
        await rt
        writer.transport.abort()
        await _bounded_wait_closed(port, writer)
    if surface is None:
        surface = "only in a log" if captured.lines else "nowhere"
    out["error_surface"] = surface
    details["error"] = {"raised": repr(error) if error else None, "logged": captured.lines[:5]}


async def _bounded_wait_closed(port, writer):
    try:
        await port.wait_for(writer.wait_closed(), 2)
    except Exception:       # noqa: BLE001 -- a reset connection's wait_closed raises it
        pass


# ---------------------------------------------------------------------------
# task style

async def _task_main(port, trials, out, notes, details):
    # 1. nursery spawn: has the child run when spawn returns?
    ran = []

    async def child():
        ran.append(True)
    async with port.open_nursery() as n:
        await n.spawn(child)
        out["child_ran_before_spawn_returned"] = bool(ran)

    # 2. spawn; one sleep(0); did the child run first?
    hits = 0
    for _ in range(trials):
        ran.clear()
        async with port.open_nursery() as n:
            await n.spawn(child)
            await port.sleep(0)
            hits += bool(ran)
    out["child_first_after_yield_fraction"] = hits / trials

    peers = _Peers()
    try:
        await _task_io_probes(port, peers, out, notes, details)
    finally:
        peers.close()
    await _task_turns_probe(port, out, notes, details)
    await _task_cancel_probe(port, out, notes, details)


async def _task_io_probes(port, peers, out, notes, details):
    # 3a. send_all(1 MB) to a peer that never reads: it blocks, so there is
    # nothing in user space to count; bound it and say so.
    stream = await port.open_tcp_stream(peers.host, peers.port, sockbuf=SOCKBUF)
    peers.accept()
    async with port.move_on_after(0.5) as scope:
        await stream.send_all(bytes(WRITE_BYTES))
    blocked = bool(scope.cancelled_caught)
    details["write"] = {"send_all_blocked": blocked}
    if blocked:
        out["user_buffered_after_write_bytes"] = None
        notes["user_buffered_after_write_bytes"] = (
            "n/a: send_all blocks until the OS has the bytes (it was still blocked after 0.5 s)")
    else:
        snap = port.probe().get("per_connection") or [{}]
        out["user_buffered_after_write_bytes"] = snap[-1].get("user_buffer_bytes")
    await _aclose_quietly(stream)

    # 3b. close a quiet connection: is the fd closed when aclose returns?
    stream = await port.open_tcp_stream(peers.host, peers.port, sockbuf=SOCKBUF)
    peers.accept()
    fd_closed = _fd_watch(stream.socket.fileno())
    await stream.aclose()
    now = fd_closed()
    await port.sleep(0)
    later = fd_closed()
    out["closed_when_close_returned"] = now
    out["closed_after_one_yield"] = later
    details["close"] = {"when_returned": {"fd_closed": now}, "after_one_yield": {"fd_closed": later}}

    # 3c. the peer resets while send_all is blocked.
    from bench.scenarios.programs import capture_output
    stream = await port.open_tcp_stream(peers.host, peers.port, sockbuf=SOCKBUF)
    peer = peers.accept()
    seen = {}
    chunk = bytes(64 * 1024)

    async def sender():
        try:
            for _ in range(1000):
                await stream.send_all(chunk)
            seen["completed"] = True
        except port.Cancelled:
            raise
        except Exception as exc:    # noqa: BLE001 -- any exception at the call is the finding
            seen["raised"] = exc

    with capture_output() as captured:
        async with port.move_on_after(0.05 + ERROR_WAIT_S):
            async with port.open_nursery() as n:
                await n.spawn(sender)
                await port.sleep(0.05)
                _reset(peer)
        await _aclose_quietly(stream)
    if "raised" in seen:
        surface = "at the call"
    else:
        surface = "only in a log" if captured.lines else "nowhere"
    out["error_surface"] = surface
    details["error"] = {"raised": repr(seen.get("raised")) if "raised" in seen else None,
                        "logged": captured.lines[:5]}


async def _aclose_quietly(stream):
    try:
        await stream.aclose()
    except Exception:       # noqa: BLE001 -- a broken stream may complain on close
        pass


async def _task_turns_probe(port, out, notes, details):
    """Another task counts its turns while this one does SENDS small sends that
    never block (a thread drains the other end)."""
    drainer = _Drainer()
    try:
        stream = await port.open_tcp_stream(drainer.host, drainer.port)
        turns = [0]
        stop = []

        async def counter():
            while not stop:
                turns[0] += 1
                await port.sleep(0)

        data = bytes(SEND_BYTES)
        try:
            async with port.open_nursery() as n:
                await n.spawn(counter)
                await port.sleep(0)         # the counter is running
                before = turns[0]
                t0 = time.perf_counter()
                for _ in range(SENDS):
                    await stream.send_all(data)
                out["other_tasks_during_nonblocking_sends_count"] = turns[0] - before
                details["sends"] = {"count": SENDS, "bytes_each": SEND_BYTES,
                                    "elapsed_s": round(time.perf_counter() - t0, 4)}
                stop.append(True)
        finally:
            await _aclose_quietly(stream)
    finally:
        drainer.close()


async def _task_cancel_probe(port, out, notes, details):
    """A move_on_after expires while the task sleeps; it catches the
    cancellation and sleeps again (0.05 s). Edge: the second sleep completes.
    Level: it raises again (trio: still inside the expired scope)."""
    from bench.scenarios.programs import capture_output
    state = {}
    # What arrives is port.Cancelled (trio, curio's TaskTimeout) or a TimeoutError
    # (our coro kernel's TaskTimeout): both are "the cancellation" here.
    caught = (port.Cancelled, TimeoutError)
    with capture_output() as captured:
        async with port.move_on_after(0.02):
            try:
                await port.sleep(10)
                state["first"] = "completed"
            except caught as exc:
                state["first"] = type(exc).__name__
                try:
                    await port.sleep(0.05)
                    state["second"] = "completed"
                except caught as exc2:
                    state["second"] = type(exc2).__name__
                    raise
    if captured.lines:      # curio logs a timeout block that outlived its deadline
        state["logged"] = captured.lines[:3]
    details["cancel"] = state
    if "second" in state:
        out["cancel_semantics"] = "edge" if state["second"] == "completed" else "level"
    else:
        notes["cancel_semantics"] = f"the timeout was not delivered as expected: {state}"


# ---------------------------------------------------------------------------

_NOT_APPLICABLE = {
    "callback": {
        "other_tasks_during_nonblocking_sends_count": "n/a: the callback port has no tasks "
                                                      "(write() never yields)",
        "cancel_semantics": "n/a: the callback port has no tasks to cancel",
    },
    "stream": {
        "other_tasks_during_nonblocking_sends_count": "n/a: on the stream port write() is "
                                                      "synchronous and never yields",
    },
    "task": {},
}


def fingerprint(runtime_spec: str, trials: int = 200) -> dict:
    """Measure the S4 fingerprint of ``runtime_spec`` on a fresh port (closed
    afterwards). Returns ``{metric: value for METRICS}`` plus ``runtime`` (the
    canonical spec), ``style``, ``trials``, ``notes`` ({metric: why it is None})
    and ``details`` (raw observations). An unknown runtime or option raises
    UsageError; a missing library raises runtimes.Unavailable."""
    if isinstance(trials, bool) or not isinstance(trials, int):
        raise TypeError(f"trials must be an int, got {type(trials).__name__}")
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    rt = runtimes.as_runtime(runtime_spec)
    out: dict = {m: None for m in METRICS}
    notes: dict = dict(_NOT_APPLICABLE[rt.style])
    details: dict = {}
    port = rt.open()
    try:
        if rt.style == "callback":
            _callback_probes(port, trials, out, notes, details)
        elif rt.style == "stream":
            port.run(_stream_main, trials, out, notes, details)
        else:
            port.run(_task_main, trials, out, notes, details)
    finally:
        port.close()
    for m in METRICS:
        if out[m] is None and m not in notes:
            notes[m] = "not measured (the probe did not complete)"
    out.update(runtime=rt.spec, style=rt.style, trials=trials, notes=notes, details=details)
    return out
