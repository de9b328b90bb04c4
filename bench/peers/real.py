"""The blocking-socket driver: one role core on a real socket, in the peer process.

``play(cfg, emit)`` runs one role (``bench.peers.spec.ROLES``) to its end in
the calling thread and returns its result; ``bench/peers/child.py`` runs one
thread per role. The driver carries out the core's actions and reports back
what the socket did; it decides nothing about the role.

Sockets run with a short timeout (``TICK_S``) so the driver notices the role's
deadline (``max_s``) and ticks the core (its series) while it waits; never
with ``sendall``: one ``send()`` per action, so ``sent_bytes`` is always what
the OS accepted, to the byte. Clocks: ``time.monotonic()``, which on Linux is
one clock for the whole machine, so a frame's send stamp from another process
compares with our arrival time.
"""
from __future__ import annotations

import select
import socket
import struct
import time
import traceback

from protocols.ports import pin_buffers
from bench.peers.core import (
    TICK_S, Duplex, End, Hold, Recv, Send, Shutdown, Sleep, UnknownAction,
)
from bench.peers.spec import ROLES

__all__ = ["play"]

_RESETS = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)
_RDHUP = getattr(select, "POLLRDHUP", 0)


def play(cfg: dict, emit) -> dict:
    """Run the role ``cfg`` (a checked, complete spec) to its end and return
    its result; never raises. ``emit(event)`` tells the parent it listens."""
    core = ROLES[cfg["role"]](cfg, time.monotonic())
    drv = _Driver(core, cfg, emit)
    try:
        drv.run()
    except OSError as e:
        # Expected network conditions (refused, unreachable, address in use):
        # a result, not a traceback.
        core.on_error(str(e) if e.strerror is None else f"{e.strerror} [errno {e.errno}]")
    except Exception:
        core.on_error("internal error in the peer: " + traceback.format_exc())
        traceback.print_exc()
    finally:
        drv.close_all()
    return core.report(time.monotonic())


def _unread_bytes(s: socket.socket) -> int | None:
    """Bytes waiting unread in ``s``'s receive queue (Linux FIONREAD), or None."""
    try:
        import fcntl
        import termios
        return struct.unpack("i", fcntl.ioctl(s.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]
    except (ImportError, OSError, AttributeError):
        return None


class _Driver:
    def __init__(self, core, cfg, emit):
        self.core = core
        self.cfg = cfg
        self.emit = emit
        self.deadline = core.began + cfg["max_s"]
        self.socks: list[socket.socket] = []
        self.s: socket.socket | None = None
        self._buf = memoryview(bytearray(0))
        self._reset_in_connect = False

    # -- connection -----------------------------------------------------------

    def _socket(self) -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socks.append(s)
        pin_buffers(s, self.cfg["sockbuf"])
        return s

    def open(self) -> socket.socket | None:
        """Listen and accept one connection, or connect. None if the deadline
        came first (the core has been told)."""
        cfg = self.cfg
        s = self._socket()
        if cfg["listen"] is not None:
            host, port = cfg["listen"]
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
                s.listen(1)
            except OSError as e:
                raise OSError(e.errno, f"listen on {host}:{port}: {e.strerror or e}") from None
            addr = s.getsockname()[:2]
            self.core.listening(addr)
            self.emit({"event": "listening", "name": cfg["name"], "addr": list(addr)})
            s.settimeout(TICK_S)
            while True:
                try:
                    conn, self.peer = s.accept()
                    break
                except socket.timeout:
                    now = time.monotonic()
                    if now >= self.deadline:
                        self.core.expire(now)
                        return None
            self.close(s)
            s = conn
            self.socks.append(s)
        else:
            host, port = cfg["connect"]
            s.settimeout(max(0.001, min(self.deadline - time.monotonic(), 10.0)))
            try:
                s.connect((host, port))
            except ConnectionResetError:
                # The handshake completed (a refused one is ECONNREFUSED) and the
                # peer reset the connection before connect() had read its result:
                # connected, then reset, as a connect a moment quicker sees it.
                self._reset_in_connect = True
            except OSError as e:
                raise OSError(e.errno, f"connect to {host}:{port}: {e.strerror or e}") from None
            self.peer = (host, port)
        s.settimeout(TICK_S)
        return s

    def close(self, s: socket.socket, reset: bool = False) -> None:
        """Close ``s``; with ``reset`` the close sends an RST (SO_LINGER 0)."""
        if s in self.socks:
            self.socks.remove(s)
        try:
            if reset:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        s.close()

    def close_all(self) -> None:
        for s in list(self.socks):
            self.close(s)

    # -- the loop -------------------------------------------------------------

    def run(self) -> None:
        core = self.core
        s = self.s = self.open()
        if s is not None:
            try:
                peer = s.getpeername()[:2]
            except OSError:     # reset at once: the socket is unconnected (ENOTCONN) by now
                peer = tuple(self.peer)[:2]
            core.connected(time.monotonic(), peer=peer,
                           sockbuf=[s.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF),
                                    s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)])
            if self._reset_in_connect:
                core.on_reset(time.monotonic())
        while True:
            now = time.monotonic()
            if now >= self.deadline and not core.ended:
                core.expire(now)
            act = core.next(now)
            kind = type(act)
            if kind is End:
                if s is not None and core.wants_unread:
                    core.on_unread(_unread_bytes(s))
                if s is not None:
                    self.close(s, reset=act.reset)
                return
            if kind is Recv:
                self._recv(act.max_bytes, act.until)
            elif kind is Send:
                self._send(act.data)
            elif kind is Sleep:
                self._sleep(act.until)
            elif kind is Hold:
                self._hold(act.until)
            elif kind is Duplex:
                self._duplex(act)
            elif kind is Shutdown:
                try:
                    s.shutdown(socket.SHUT_WR)
                except OSError:
                    core.on_shutdown_failed(time.monotonic())
            else:
                raise UnknownAction(f"the real peer driver has no action {act!r}")

    # -- the actions ------------------------------------------------------------
    #
    # Each one waits for at most one event, tells the core, and returns; the
    # deadline is checked before every socket call, not only when idle: a
    # peer that keeps sending would otherwise keep a reader past its bounds.

    def _view(self, n: int):
        if len(self._buf) < n:
            self._buf = memoryview(bytearray(n))
        return self._buf[:n]

    def _read_once(self, view) -> bool:
        """One read: tell the core what came; False if the socket timed out."""
        try:
            n = self.s.recv_into(view)
        except socket.timeout:
            self.core.tick(time.monotonic())
            return False
        except _RESETS:
            self.core.on_reset(time.monotonic())
            return True
        now = time.monotonic()
        if n == 0:
            self.core.on_eof(now)
        else:
            self.core.on_data(view[:n], now)
        return True

    def _recv(self, max_bytes: int, until: float | None) -> None:
        view = self._view(max_bytes)
        limit = self.deadline if until is None else min(until, self.deadline)
        while time.monotonic() < limit:
            if self._read_once(view):
                return

    def _send(self, data) -> None:
        core = self.core
        try:
            k = self.s.send(data)
        except socket.timeout:
            core.tick(time.monotonic())
            return
        except _RESETS:
            core.on_reset(time.monotonic())
            return
        core.on_sent(k, time.monotonic())

    def _sleep(self, until: float) -> None:
        core = self.core
        while True:
            now = time.monotonic()
            if now >= until or now >= self.deadline:
                return
            core.tick(now)
            time.sleep(min(until - now, self.deadline - now, TICK_S))

    def _hold(self, until: float) -> None:
        """Wait without reading a byte. POLLRDHUP reports the peer's FIN without
        consuming data, so holding never opens the receive window; the FIN
        itself only arrives once everything before it fits, which is the
        truth of a client that never reads."""
        s, core = self.s, self.core
        poller = select.poll()
        poller.register(s, _RDHUP | select.POLLERR | select.POLLHUP)
        while True:
            now = time.monotonic()
            if now >= until or now >= self.deadline:
                return
            core.tick(now)
            events = poller.poll(min(until - now, self.deadline - now, TICK_S) * 1000)
            if events:
                now = time.monotonic()
                if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    return core.on_reset(now)
                mask = events[0][1]
                if mask & (_RDHUP | select.POLLHUP):
                    return core.on_eof(now)
                if mask & select.POLLERR:
                    return core.on_reset(now)

    def _duplex(self, act: Duplex) -> None:
        """Read if there is something to read, else send if there is room."""
        now = time.monotonic()
        if now >= self.deadline:
            return
        poller = select.poll()
        poller.register(self.s, select.POLLIN | select.POLLOUT)
        events = poller.poll(min(self.deadline - now, TICK_S) * 1000)
        if not events:
            self.core.tick(time.monotonic())
            return
        mask = events[0][1]
        if mask & (select.POLLIN | select.POLLERR | select.POLLHUP):
            self._read_once(self._view(act.max_bytes))
        elif mask & select.POLLOUT:
            self._send(act.data)
