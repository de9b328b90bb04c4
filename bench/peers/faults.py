"""Faulty peers and the healthy client that judges them, as plain sockets.

``looplab faults`` (bench/verbs/faults.py) throws these at a TCP server: each *fault* is
one way a real client misbehaves (resets, garbage, a 4 GiB frame header, a peer
that stops reading, a thousand idle connections ...), and after each one a
*healthy* client checks that the same server still serves its app correctly.

Everything here runs in the caller's process on blocking or non-blocking sockets
(one thread, for the proxy's upstream sink). Every loop is
bounded in count and in time, and every socket connects only to the one address
it is given. Nothing here imports a kernel: the server under test may be any
program, the user's own included.
"""
from __future__ import annotations

import random
import selectors
import socket
import struct
import threading
import time

from protocols.cores import FRAME_HEADER_BYTES, FRAME_MAGIC, encode_frame

__all__ = ["FAULTS", "FAULT_HELP", "APPS", "Limits", "Upstream", "healthy", "run_fault",
           "Health", "stress_echo"]

APPS = ("echo", "sink", "reqresp", "push", "proxy", "raw")

# What each fault does, in the words the table and --help use.
FAULT_HELP = {
    "reset": "connect, then close at once with SO_LINGER 0 (an RST)",
    "half-frame": "send half a frame (reqresp: half a request line), then an RST",
    "garbage": "send 4 KiB of random bytes, half-close, read until EOF or the hold time",
    "huge-header": "send a frame header claiming a 4 GiB frame, wait the hold time, close",
    "long-line": "send a 100 kB request line with no newline, wait the hold time, close",
    "half-close": "send one valid request, shutdown(SHUT_WR), expect the answer then EOF",
    "stall": "make the server write to a peer that never reads, hold it, then vanish (RST)",
    "idle": "one connection that sends nothing, held while a healthy client is served (push: after)",
    "burst": "connect and close N times in a row (default 200)",
    "idle-many": "N concurrent idle connections (default 1,000), held while a healthy client is served",
}
FAULTS = tuple(FAULT_HELP)


class Limits:
    """The sizes and times a run uses; the CLI defaults are the issue's scale, tests
    pass smaller ones."""

    def __init__(self, burst: int = 200, idle_many: int = 1000, hold_s: float = 1.0,
                 health_timeout_s: float = 5.0, slow_s: float = 1.0, eof_timeout_s: float = 5.0):
        self.burst = burst
        self.idle_many = idle_many
        self.hold_s = hold_s
        self.health_timeout_s = health_timeout_s
        self.slow_s = slow_s
        self.eof_timeout_s = eof_timeout_s


class Health:
    """The healthy client's verdict: ``ok``; ``refused`` (nothing listens: the server
    died); otherwise ``why`` says what went wrong; ``took_s`` from connect to verdict."""

    def __init__(self, ok: bool, took_s: float, why: str = "", refused: bool = False,
                 timed_out: bool = False):
        self.ok, self.took_s, self.why, self.refused, self.timed_out = ok, took_s, why, refused, timed_out

    def __repr__(self):
        return f"Health(ok={self.ok}, took_s={self.took_s:.3f}, why={self.why!r})"


class _Deadline(Exception):
    pass


def _connect(addr, timeout: float) -> socket.socket:
    s = socket.create_connection(addr, timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _reset(s: socket.socket) -> None:
    """Close with SO_LINGER 0: the kernel sends an RST instead of a FIN."""
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    s.close()


def _recv_exact(s: socket.socket, n: int, deadline: float) -> bytes:
    out = bytearray()
    while len(out) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise _Deadline(f"got {len(out)} of {n} bytes")
        s.settimeout(left)
        try:
            chunk = s.recv(min(65536, n - len(out)))
        except socket.timeout:
            raise _Deadline(f"got {len(out)} of {n} bytes") from None
        if not chunk:
            raise ConnectionError(f"EOF after {len(out)} of {n} bytes")
        out += chunk
    return bytes(out)


def _read_until_eof(s: socket.socket, deadline: float, keep: int = 1 << 20) -> tuple[bytes, str]:
    """Read until EOF ("eof"), an error ("reset") or the deadline ("timeout");
    returns the first ``keep`` bytes read and how it ended."""
    out = bytearray()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return bytes(out), "timeout"
        s.settimeout(min(left, 0.5))
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            continue
        except OSError:
            return bytes(out), "reset"
        if not chunk:
            return bytes(out), "eof"
        if len(out) < keep:
            out += chunk[:keep - len(out)]


def _pattern(seed: int, n: int) -> bytes:
    return random.Random(seed).randbytes(n)


# ---------------------------------------------------------------------------
# The proxy's upstream: a counting sink the verb runs itself, so that it can see
# what the proxy relayed and when the proxy closes its upstream connections.

class Upstream:
    """A sink on 127.0.0.1 (or ``host``) in a selector thread: accepts, reads, keeps
    the first bytes of each connection, closes on EOF or error. ``received(tag)``
    says whether some connection's stream started with ``tag``."""

    KEEP = 256 * 1024

    def __init__(self, host: str = "127.0.0.1", port: int = 0, max_conns: int = 20000):
        self._lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._lsock.bind((host, port))
        self._lsock.listen(1024)
        self._lsock.setblocking(False)
        self.address = self._lsock.getsockname()[:2]
        self.max_conns = max_conns
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._lsock, selectors.EVENT_READ, None)
        self._heads: list[bytearray] = []
        self._finished: list[bytes] = []
        self._lock = threading.Lock()
        self.open_count = 0
        self.accepted_count = 0
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="faults-upstream", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop:
            for key, _ in self._sel.select(0.1):
                if key.data is None:
                    self._accept()
                else:
                    self._read(key.fileobj, key.data)

    def _accept(self) -> None:
        for _ in range(64):
            try:
                conn, _ = self._lsock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            if self.open_count >= self.max_conns:
                conn.close()
                continue
            conn.setblocking(False)
            head = bytearray()
            with self._lock:
                self._heads.append(head)
                self.open_count += 1
                self.accepted_count += 1
            self._sel.register(conn, selectors.EVENT_READ, head)

    def _read(self, conn, head) -> None:
        try:
            chunk = conn.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if chunk:
            if len(head) < self.KEEP:
                with self._lock:
                    head += chunk[:self.KEEP - len(head)]
            return
        self._sel.unregister(conn)
        conn.close()
        with self._lock:
            self.open_count -= 1
            self._heads.remove(head)
            # The proxy check must still see bytes whose upstream connection has
            # already ended (a client's close ends it): keep the last few heads.
            self._finished.append(bytes(head[:16384]))
            del self._finished[:-64]

    def received(self, data: bytes) -> bool:
        with self._lock:
            return any(bytes(h[:len(data)]) == data for h in self._heads + self._finished)

    def close(self) -> None:
        self._stop = True
        self._thread.join(2.0)
        for key in list(self._sel.get_map().values()):
            key.fileobj.close()
        self._sel.close()




# ---------------------------------------------------------------------------
# Healthy clients, one per app

def healthy(app: str, addr, limits: Limits, upstream=None, seed: int = 0) -> Health:
    """One healthy client of ``app`` against ``addr``: ok only when the app's answer
    is right and arrives within ``limits.health_timeout_s``."""
    t0 = time.monotonic()
    deadline = t0 + limits.health_timeout_s
    try:
        s = _connect(addr, limits.health_timeout_s)
    except ConnectionRefusedError:
        return Health(False, time.monotonic() - t0, "connection refused", refused=True)
    except OSError as exc:
        return Health(False, time.monotonic() - t0, f"connect failed: {exc}", timed_out=True)
    try:
        why = _CHECKS[app](s, deadline, upstream, seed)
    except _Deadline as exc:
        return Health(False, time.monotonic() - t0, f"no answer within "
                      f"{limits.health_timeout_s:g} s ({exc})", timed_out=True)
    except OSError as exc:
        why = f"{type(exc).__name__}: {exc}"
    finally:
        s.close()
    return Health(not why, time.monotonic() - t0, why or "")


def _check_echo(s, deadline, upstream, seed) -> str:
    data = _pattern(seed, 65536)
    got = bytearray()
    s.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE)
    sent = 0
    try:
        while len(got) < len(data):
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Deadline(f"echoed {len(got)} of {len(data)} bytes")
            for _, ev in sel.select(min(left, 0.2)):
                if ev & selectors.EVENT_WRITE and sent < len(data):
                    try:
                        sent += s.send(data[sent:sent + 16384])
                    except BlockingIOError:
                        pass
                    if sent == len(data):
                        sel.modify(s, selectors.EVENT_READ)
                if ev & selectors.EVENT_READ:
                    try:
                        chunk = s.recv(65536)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        return f"EOF after {len(got)} of {len(data)} echoed bytes"
                    got += chunk
    finally:
        sel.close()
    if bytes(got) != data:
        bad = next(i for i in range(len(data)) if got[i] != data[i])
        return f"echo differs at byte {bad}"
    return ""


def _check_sink(s, deadline, upstream, seed) -> str:
    s.sendall(b"".join(encode_frame(i, 0.0, 1024) for i in range(8)))
    s.shutdown(socket.SHUT_WR)
    data, how = _read_until_eof(s, deadline)
    if how == "timeout":
        raise _Deadline("the sink never closed after our EOF")
    return "" if how == "eof" and not data else f"sink ended with {how} after {len(data)} bytes"


def _check_reqresp(s, deadline, upstream, seed) -> str:
    s.sendall(b"REQ %d\n" % seed)
    line = bytearray()
    while not line.endswith(b"\n"):
        line += _recv_exact(s, 1, deadline)
        if len(line) > 64:
            return f"response line does not start like b'RESP n size\\n': {bytes(line[:32])!r}"
    parts = line.split()
    if len(parts) != 3 or parts[0] != b"RESP" or not parts[2].isdigit():
        return f"bad response line {bytes(line)!r}"
    _recv_exact(s, int(parts[2]) - len(line), deadline)
    return ""


def _check_push(s, deadline, upstream, seed) -> str:
    _recv_exact(s, 10_000, deadline)    # one looplab push message
    return ""


def _check_proxy(s, deadline, upstream, seed) -> str:
    if upstream is None:
        return "proxy check needs the upstream sink"
    tag = b"looplab-faults %d " % seed + _pattern(seed, 8192)
    s.sendall(tag)
    while not upstream.received(tag):
        if time.monotonic() >= deadline:
            raise _Deadline("the upstream never received the relayed bytes")
        time.sleep(0.01)
    return ""


def _check_raw(s, deadline, upstream, seed) -> str:
    # Accepted and still open a moment later: nothing more is known of a raw server.
    s.settimeout(0.2)
    try:
        chunk = s.recv(1, socket.MSG_PEEK)
    except socket.timeout:
        return ""
    return "" if chunk else "the server closed at once"


_CHECKS = {"echo": _check_echo, "sink": _check_sink, "reqresp": _check_reqresp,
           "push": _check_push, "proxy": _check_proxy, "raw": _check_raw}


# ---------------------------------------------------------------------------
# The faults. Each returns a note ("" or what it saw) and raises nothing for an
# ordinary network error: a server that resets a misbehaving peer is right to.

def _request(app: str, seed: int) -> bytes:
    if app == "reqresp":
        return b"REQ %d\n" % seed
    if app in ("push", "raw"):
        return b""
    return encode_frame(seed, 0.0, 1024)


def _half_frame(app, addr, limits, during):
    s = _connect(addr, 2.0)
    half = b"REQ 12" if app == "reqresp" else encode_frame(1, 0.0, 1024)[:512]
    try:
        s.sendall(half)
        time.sleep(0.05)
    finally:
        _reset(s)
    return ""


def _reset_now(app, addr, limits, during):
    _reset(_connect(addr, 2.0))
    return ""


def _send_then_linger(s, data: bytes, wait_s: float, half_close: bool = False) -> str:
    """Send ``data`` (for at most 2 s), then read until EOF or ``wait_s``; says how
    the server reacted."""
    s.settimeout(2.0)
    try:
        s.sendall(data)
    except socket.timeout:
        how = "stopped reading"
    except OSError as exc:
        return f"server closed while we sent ({type(exc).__name__})"
    else:
        if half_close:
            s.shutdown(socket.SHUT_WR)
        _, how = _read_until_eof(s, time.monotonic() + wait_s)
    return {"eof": "server closed it", "reset": "server reset it", "timeout": "kept open",
            "stopped reading": "server stopped reading"}[how]


def _garbage(app, addr, limits, during):
    s = _connect(addr, 2.0)
    try:
        note = _send_then_linger(s, _pattern(12, 4096), limits.hold_s, half_close=True)
    finally:
        s.close()
    return note


def _huge_header(app, addr, limits, during):
    s = _connect(addr, 2.0)
    header = struct.pack(">4sIQd", FRAME_MAGIC, 2**32 - 1, 0, 0.0)
    assert len(header) == FRAME_HEADER_BYTES
    try:
        note = _send_then_linger(s, header, limits.hold_s)
    finally:
        s.close()
    return note


def _long_line(app, addr, limits, during):
    s = _connect(addr, 2.0)
    try:
        note = _send_then_linger(s, b"REQ " + b"x" * 100_000, limits.hold_s)
    finally:
        s.close()
    return note


def _half_close(app, addr, limits, during):
    """A valid request, SHUT_WR, then read until EOF: a server that never sends EOF
    back after the client said it was done is holding a connection it cannot use."""
    s = _connect(addr, 2.0)
    try:
        req = _request(app, 5)
        if req:
            s.sendall(req)
        s.shutdown(socket.SHUT_WR)
        data, how = _read_until_eof(s, time.monotonic() + limits.eof_timeout_s)
    finally:
        s.close()
    if how == "timeout":
        return f"FAIL: no EOF within {limits.eof_timeout_s:g} s after our half-close"
    if app == "echo" and data != req:
        return f"FAIL: echoed {len(data)} bytes of {len(req)} before EOF"
    if app == "reqresp" and not data.startswith(b"RESP "):
        return f"FAIL: no response before EOF ({how})"
    return "" if how == "eof" else f"ended with {how}"


def _stall_load(app: str) -> bytes:
    if app == "reqresp":
        # 256 pipelined requests ask for 16 MB of answers (64 KiB each by default):
        # enough to fill every buffer on the way, little enough for a server that
        # queues all of it (the naive variant) to survive on a shared machine.
        return b"".join(b"REQ %d\n" % i for i in range(256))
    if app in ("echo", "raw"):
        return _pattern(3, 8 << 20)
    if app in ("sink", "proxy"):
        return b"".join(encode_frame(i, 0.0, 65536) for i in range(16))
    return b""      # push writes on its own


def _stall(app, addr, limits, during):
    s = _connect(addr, 2.0)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        data, sent = _stall_load(app), 0
        s.setblocking(False)
        until = time.monotonic() + limits.hold_s
        while sent < len(data) and time.monotonic() < until:
            try:
                sent += s.send(data[sent:sent + 65536])
            except BlockingIOError:
                time.sleep(0.01)
            except OSError:
                break
        while time.monotonic() < until:
            time.sleep(0.02)
    finally:
        _reset(s)
    return f"sent {sent:,} bytes, read none"


def _idle(app, addr, limits, during):
    s = _connect(addr, 2.0)
    try:
        note = during()
        time.sleep(limits.hold_s)
    finally:
        s.close()
    return note


def _burst(app, addr, limits, during):
    failed = slow = 0
    until = time.monotonic() + 60.0
    for _ in range(limits.burst):
        if time.monotonic() > until:
            break
        t0 = time.monotonic()
        try:
            _connect(addr, 2.0).close()
        except OSError:
            failed += 1
        # Over 0.5 s on loopback means a dropped SYN and the 1-s retransmit: the
        # server's accept queue (its listen backlog) was full.
        slow += time.monotonic() - t0 > 0.5
    if failed:
        return f"FAIL: {failed} of {limits.burst} connects failed"
    if slow:
        return (f"SLOW: {slow} of {limits.burst} connects waited for a SYN retransmit "
                "(the listen backlog was full)")
    return ""


def _idle_many(app, addr, limits, during):
    socks, failed = [], 0
    until = time.monotonic() + 30.0
    try:
        for _ in range(limits.idle_many):
            if time.monotonic() > until:
                break
            try:
                socks.append(_connect(addr, 3.0))
            except OSError:
                failed += 1
        note = during()
        time.sleep(limits.hold_s)
    finally:
        for s in socks:
            s.close()
    if len(socks) < limits.idle_many:
        return (f"FAIL: held only {len(socks):,} of {limits.idle_many:,} ({failed:,} connects "
                "failed, the rest not tried within 30 s)") + (f"; {note}" if note else "")
    return note


_FAULT_FUNCS = {"reset": _reset_now, "half-frame": _half_frame, "garbage": _garbage,
                "huge-header": _huge_header, "long-line": _long_line, "half-close": _half_close,
                "stall": _stall, "idle": _idle, "burst": _burst, "idle-many": _idle_many}
assert set(_FAULT_FUNCS) == set(FAULTS)

# A push server writes to every connection, so an idle push client is a stalled
# one and a "block" server rightly serves no one while it is held: for push the
# healthy client runs only after the faulty peers are gone.
_DURING = {"idle", "idle-many"}


def run_fault(fault: str, app: str, addr, limits: Limits, upstream=None, seed: int = 0):
    """Run one fault; returns (note, health_during or None). ``note`` starting with
    "FAIL:" means the fault itself saw the server misbehave (no EOF after a
    half-close ...)."""
    during_health = []

    def during():
        if fault in _DURING and app != "push":
            h = healthy(app, addr, limits, upstream, seed + 100_000)
            during_health.append(h)
            return "" if h.ok else f"FAIL: healthy client while held: {h.why}"
        return ""
    try:
        note = _FAULT_FUNCS[fault](app, addr, limits, during)
    except ConnectionRefusedError:
        note = "connection refused"
    except OSError as exc:
        note = f"{type(exc).__name__}: {exc}"
    return note, (during_health[0] if during_health else None)


# ---------------------------------------------------------------------------
# Stress: many active echo connections at once, every byte checked

def stress_echo(addr, connections: int, duration_s: float, chunk: int = 512,
                connect_timeout_s: float = 20.0) -> dict:
    """``connections`` echo clients in one selector loop, each with one chunk in
    flight at a time, for ``duration_s``: every echoed byte is compared. Returns
    counts: held (connected and never lost), round trips (total, min per
    connection), bytes, mismatches, errors (resets, early EOFs, connect failures)."""
    sel = selectors.DefaultSelector()
    conns = []
    errors: list[str] = []
    t_connect = time.monotonic() + connect_timeout_s
    for i in range(connections):
        if time.monotonic() > t_connect:
            errors.append(f"connect phase took over {connect_timeout_s:g} s")
            break
        try:
            s = _connect(addr, 5.0)
        except OSError as exc:
            errors.append(f"connect {i}: {exc}")
            continue
        s.setblocking(False)
        conns.append(s)
    base = _pattern(99, chunk + 251)
    state = {}     # sock -> [offset, outstanding bytes, round trips, received buffer]
    mismatches = 0
    total_bytes = 0
    lost = 0
    end = time.monotonic() + duration_s
    try:
        for s in conns:
            state[s] = [0, b"", 0, bytearray()]
            sel.register(s, selectors.EVENT_WRITE)
        while time.monotonic() < end and state:
            for key, ev in sel.select(0.2):
                s = key.fileobj
                st = state.get(s)
                if st is None:
                    continue
                try:
                    if ev & selectors.EVENT_WRITE:
                        msg = base[st[0] % 251:st[0] % 251 + chunk]
                        s.sendall(msg)      # 512 bytes always fit an empty socket buffer
                        st[1] = msg
                        sel.modify(s, selectors.EVENT_READ)
                    else:
                        got = s.recv(65536)
                        if not got:
                            raise ConnectionError("EOF from the server")
                        st[3] += got
                        if len(st[3]) >= len(st[1]):
                            if bytes(st[3]) != st[1]:
                                mismatches += 1
                            total_bytes += len(st[1])
                            st[0] += len(st[1])
                            st[2] += 1
                            st[3] = bytearray()
                            sel.modify(s, selectors.EVENT_WRITE)
                except BlockingIOError:
                    pass
                except OSError as exc:
                    lost += 1
                    if len(errors) < 20:
                        errors.append(f"{type(exc).__name__}: {exc}")
                    sel.unregister(s)
                    del state[s]
                    conns.remove(s)
                    s.close()
        rts = [st[2] for st in state.values()]
    finally:
        sel.close()
        for s in conns:
            s.close()
    return {"connections_count": connections, "held_count": len(rts),
            "round_trips_count": sum(rts), "min_round_trips_count": min(rts) if rts else 0,
            "echoed_bytes": total_bytes, "mismatches_count": mismatches, "lost_count": lost,
            "errors": errors}
