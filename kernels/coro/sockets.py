"""Sockets for coro tasks: a curio-style ``Socket`` and a trio-shaped ``SocketStream``.

The whole I/O story is one loop: try the non-blocking syscall; on
``BlockingIOError`` (EAGAIN) trap into the kernel with ``read_wait`` /
``write_wait`` and try again when it says the socket is ready. There is no
user-space buffer anywhere: ``await sendall(data)`` returns when the kernel's
socket buffer has taken the last byte, so what the application "wrote" and what
the OS has are always the same number (``ConnStats.accepted_bytes ==
sent_bytes``, ``peak_user_buffer_bytes == 0``). Backpressure is the call taking
longer. A call that doesn't block doesn't yield either -- unless the kernel runs
with ``io_schedule_point=True``, where every socket call starts with a
checkpoint (trio's rule: cancellation is checked and other tasks get a turn
before the syscall, even if it then succeeds at once).

A failed ``recv`` is not cheap: EAGAIN comes back as a ``BlockingIOError``
that costs three times the syscall, and a request/response connection pays it
on every other read (the read after the one that emptied the socket). So when
the last ``recv`` returned less than it asked for -- the socket was drained --
the next one first asks ``poll()`` with a zero timeout whether anything has
arrived since, and waits for readability straight away if not. That is the
same test the failed syscall makes, so the rule is unchanged: a call traps
only when the socket has nothing for it, and never when it has. A wrong guess
costs one poll, which is a system call too: under load the next request has
usually arrived by the time the handler reads again, and the poll was the third
syscall of every echo round trip (beside recv and send). So the guess learns, per
socket: two polls in a row that find data turn polling off, and the next ``recv``
that fails with EAGAIN (or a poll that finds nothing) turns it back on. A
connection that keeps finding its socket empty polls as before; one that keeps
finding data pays no poll; one that alternates (data there every other time: the
last connection of a lock-step round) keeps polling, since one EAGAIN costs more
than the polls it saves.

Under request/response load even that is a system call per request that asyncio
and uvloop do not make: they read only when their poller says the socket is
readable. The kernel option ``read="ready"`` does the same: after a short read
the next one waits for the loop's poller (which the loop asks once per pass for
every socket) without asking first. It saves the poll and gives up the rule
above: a read whose data arrived since the last one still yields once.

When ``sendall`` is interrupted -- cancelled, timed out, or the peer reset the
connection -- the exception carries ``bytes_sent``: exactly how many bytes the
OS accepted, so the caller knows what the peer can still receive (curio does
the same). Closing goes through the kernel (``io_release``) so a task blocked
on the socket wakes with ``ClosedResourceError`` instead of waiting forever on
an fd that no longer exists.
"""
from __future__ import annotations

import os
import socket
import types

from .. import io as _io
from ..probe import ConnStats
from .errors import BusyResourceError, Cancelled, ClosedResourceError, TaskTimeout
from . import traps as _traps
from .traps import checkpoint, checkpoint_here, io_release, read_wait, running_kernel, write_wait

__all__ = ["Socket", "SocketStream", "Listener", "open_tcp_stream", "listen"]

_DEFAULT_RECEIVE = 65536


def _not_yet(timeout) -> bool:
    # read="ready": the poll before a drained read, answered without a system call
    return False


def _closed(*args, **kwargs):
    raise ClosedResourceError("the socket is closed")


def _is_socket(sock) -> bool:
    # Duck-typed, so that a simulated network's sockets pass too.
    return not isinstance(sock, Socket) and all(
        callable(getattr(sock, name, None)) for name in ("fileno", "recv", "send"))


def _io_now():
    """The running kernel's I/O seam (the real OS outside a kernel)."""
    kernel = running_kernel()
    return kernel._io if kernel is not None else _io.REAL


def _fmt(addr) -> str:
    if isinstance(addr, tuple) and len(addr) >= 2:
        return f"{addr[0]}:{addr[1]}"
    return str(addr) or "unix"


def _stats_for(sock: socket.socket) -> ConnStats:
    """A connected socket is a connection: register its stats with the running
    kernel's probe. Unconnected ones (listeners, not-yet-connected) are not."""
    try:
        name = f"{_fmt(sock.getsockname())}->{_fmt(sock.getpeername())}"
    except OSError:
        return ConnStats("unconnected")
    kernel = running_kernel()
    return kernel.probe.new_conn(name) if kernel is not None else ConnStats(name)


def _check_sockbuf(sockbuf) -> None:
    if sockbuf is not None and (not isinstance(sockbuf, int) or isinstance(sockbuf, bool)
                                or sockbuf <= 0):
        raise ValueError(f"sockbuf must be a positive number of bytes or None, got {sockbuf!r}")


def _set_sockbuf(sock: socket.socket, sockbuf) -> None:
    if sockbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sockbuf)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, sockbuf)


class Socket:
    """A stdlib socket made non-blocking, with async versions of its blocking
    calls (curio's shape): ``recv``, ``recv_into``, ``send``, ``sendall``,
    ``accept``, ``connect``, ``shutdown``, ``close``. The stdlib socket's other
    public attributes (``bind``, ``listen``, ``setsockopt``, ``getsockname``,
    ``family``, ...) are forwarded to the wrapped socket.

    One task may wait to read and one to write at a time; a second one gets
    ``BusyResourceError`` from the kernel. After ``close()`` every call raises
    ``ClosedResourceError``.
    """
    __slots__ = ("_sock", "stats", "_recv", "_recv_into", "_send", "_closed", "_drained",
                 "_readable", "_poll_hits", "_read_trap")

    def __init__(self, sock: socket.socket):
        if not _is_socket(sock):
            raise TypeError(f"Socket() wraps a socket.socket, got {type(sock).__name__}")
        if sock.fileno() < 0:
            raise ClosedResourceError("Socket() was given a closed socket")
        sock.setblocking(False)
        self._sock = sock
        self._recv = sock.recv
        self._recv_into = sock.recv_into
        self._send = sock.send
        self._closed = False
        self._drained = False     # poll before the next recv: the last one emptied the
                                  # socket and polling pays off (a hint only)
        self._poll_hits = 0       # polls in a row that found data (see the module's essay)
        self._readable = None     # poll(0) on this fd alone, made on first need
        self._read_trap = _traps.read_trap(sock)  # what read_wait(sock) yields, made once
        self.stats = _stats_for(sock)

    def fileno(self) -> int:
        return self._sock.fileno()

    def __repr__(self):
        return f"<coro Socket {self._sock!r}>"

    async def recv(self, maxsize: int, flags: int = 0) -> bytes:
        if _traps._checkpointing and checkpoint_here():
            await checkpoint()
        if self._drained:
            if (self._readable or self._poller())(0):
                self._poll_hits += 1       # it had data: the poll was a wasted syscall
            else:
                self._poll_hits = 0
                await read_wait(self._sock)    # empty, as recv would have said with EAGAIN
        while True:
            try:
                data = self._recv(maxsize, flags)
                break
            except BlockingIOError:
                self._poll_hits = 0
                await read_wait(self._sock)
        n = len(data)
        self._drained = n < maxsize and self._poll_hits < 2
        self.stats.received_bytes += n
        return data

    def _poller(self):
        # "Is there anything to read?" for this fd alone, made on first need.
        # Under read="ready" the answer is always "not yet": wait for the poller.
        kernel = running_kernel()
        if kernel is not None and kernel.options["read"] == "ready":
            check = self._readable = _not_yet
        else:
            check = self._readable = _io_now().read_check(self._sock)
        return check

    async def recv_into(self, buffer, nbytes: int = 0, flags: int = 0) -> int:
        if _traps._checkpointing and checkpoint_here():
            await checkpoint()
        while True:
            try:
                n = self._recv_into(buffer, nbytes, flags)
                break
            except BlockingIOError:
                await read_wait(self._sock)
        self.stats.received_bytes += n
        return n

    async def send(self, data, flags: int = 0) -> int:
        if _traps._checkpointing and checkpoint_here():
            await checkpoint()
        while True:
            try:
                n = self._send(data, flags)
                break
            except BlockingIOError:
                await write_wait(self._sock)
        stats = self.stats
        stats.accepted_bytes += n
        stats.sent_bytes += n
        return n

    async def sendall(self, data, flags: int = 0) -> None:
        """Send every byte; return when the OS has them all. If interrupted, the
        exception's ``bytes_sent`` says how many it has."""
        send = self._send
        sent = 0
        try:
            if _traps._checkpointing and checkpoint_here():
                await checkpoint()
            total = len(data) if isinstance(data, (bytes, bytearray)) else memoryview(data).nbytes
            try:
                sent = send(data, flags)
            except BlockingIOError:
                pass
            stats = self.stats
            stats.accepted_bytes += sent
            stats.sent_bytes += sent
        except (Cancelled, TaskTimeout, OSError, ClosedResourceError) as e:
            e.bytes_sent = sent
            raise
        if sent != total:
            await self._send_rest(send, data, flags, sent, total)

    async def _send_rest(self, send, data, flags, sent, total):
        # sendall after a first send() that didn't take everything: send the
        # rest, waiting for room only when the OS says EAGAIN. A short write is
        # not a full buffer (POSIX lets send take fewer bytes at any time), and
        # a task that waits blocks -- where an expired deadline is delivered --
        # though the socket had room. On a full buffer the retry costs one
        # EAGAIN. Split off so that the common case -- the OS takes it all at
        # once -- stays short enough to inline (SocketStream).
        stats = self.stats
        try:
            with memoryview(data).cast("B") as view:
                while sent < total:
                    try:
                        n = send(view[sent:], flags)
                    except BlockingIOError:
                        await write_wait(self._sock)
                        continue
                    sent += n
                    stats.accepted_bytes += n
                    stats.sent_bytes += n
        except (Cancelled, TaskTimeout, OSError, ClosedResourceError) as e:
            e.bytes_sent = sent
            raise

    async def accept(self):
        """Accept a connection: ``(Socket, address)``."""
        if self._closed:
            _closed()
        if _traps._checkpointing and checkpoint_here():
            await checkpoint()
        while True:
            try:
                conn, address = self._sock.accept()
                break
            except BlockingIOError:
                await read_wait(self._sock)
        try:
            return Socket(conn), address
        except BaseException:
            conn.close()
            raise

    async def connect(self, address) -> None:
        if self._closed:
            _closed()
        if _traps._checkpointing and checkpoint_here():
            await checkpoint()
        sock = self._sock
        try:
            sock.connect(address)
        except BlockingIOError:
            await write_wait(sock)
            err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                raise OSError(err, f"connect to {address!r} failed: {os.strerror(err)}")
        self.stats = _stats_for(sock)

    async def shutdown(self, how: int) -> None:
        if self._closed:
            _closed()
        self._sock.shutdown(how)

    async def close(self) -> None:
        """Close now (the fd is closed when this returns); idempotent. Tasks
        blocked on this socket get ``ClosedResourceError``."""
        if self._closed:
            return
        self._closed = True
        self._drained = False          # straight to _closed, not to a poll of a dead fd
        if running_kernel() is not None:
            await io_release(self._sock)
        self._sock.close()
        self.stats.closed = True
        self._recv = self._recv_into = self._send = _closed

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc_info):
        await self.close()


def _forwarded(name):
    def get(self):
        return getattr(self._sock, name)
    return property(get, doc=f"The wrapped socket's ``{name}``.")


# The stdlib socket's other public names, forwarded one by one. A __getattr__ would
# do it in one place, but on CPython 3.11 a class with __getattr__ gets none of the
# interpreter's specialised attribute loads: every ``sock._recv`` or ``sock.stats``
# on the I/O path went through the slow generic lookup, about 200 machine
# instructions each and some 1,500 per echo round trip.
for _name in dir(socket.socket):
    if not _name.startswith("_") and not hasattr(Socket, _name):
        setattr(Socket, _name, _forwarded(_name))
del _name


class SocketStream:
    """trio's ``Stream`` over a ``Socket``: ``receive_some``, ``send_all``,
    ``send_eof``, ``aclose``; ``.socket`` and ``.stats`` (the socket's ConnStats).

    Concurrent misuse is an error, not a race: a second task calling
    ``send_all`` (or ``send_eof``) while one is in progress, or a second
    ``receive_some``, gets ``BusyResourceError``. ``send_all`` after
    ``send_eof``, and anything after ``aclose``, gets ``ClosedResourceError``.
    """
    __slots__ = ("socket", "stats", "_receiving", "_sending", "_eof_sent")

    def __init__(self, sock):
        if _is_socket(sock):
            sock = Socket(sock)
        elif not isinstance(sock, Socket):
            raise TypeError(f"SocketStream() needs a Socket or socket.socket, got "
                            f"{type(sock).__name__}")
        raw = sock._sock
        if raw.family in (socket.AF_INET, socket.AF_INET6):
            try:
                raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        self.socket = sock
        self.stats = sock.stats
        self._receiving = False
        self._sending = False
        self._eof_sent = False

    @types.coroutine
    def receive_some(self, max_bytes=_DEFAULT_RECEIVE) -> bytes:
        """Up to ``max_bytes`` bytes (``None``: 64 KiB, trio's spelling); ``b""`` at EOF."""
        # A generator-based coroutine rather than an async def, so that it can
        # yield its socket's read trap itself where an async def awaits
        # read_wait(): a generator less to make, enter and leave on every
        # read that waits (about 1,500 instructions of an echo request).
        if type(max_bytes) is not int or max_bytes < 1:
            if max_bytes is not None:
                raise ValueError(f"max_bytes must be a positive int, got {max_bytes!r}")
            max_bytes = _DEFAULT_RECEIVE
        if self._receiving:
            raise BusyResourceError("another task is already receiving on this stream")
        self._receiving = True
        sock = self.socket
        try:
            # Socket.recv(max_bytes), inline: one coroutine less between the
            # task and its trap on every read (this is the echo hot path).
            if _traps._checkpointing and checkpoint_here():
                yield from checkpoint()
            if sock._drained:
                if (sock._readable or sock._poller())(0):
                    sock._poll_hits += 1
                else:
                    sock._poll_hits = 0
                    if not _traps._live:                  # as read_wait() checks
                        _traps._running_kernel("read_wait()")
                    yield sock._read_trap                 # read_wait(sock._sock)
            while True:
                try:
                    data = sock._recv(max_bytes)
                    break
                except BlockingIOError:
                    sock._poll_hits = 0
                    if not _traps._live:
                        _traps._running_kernel("read_wait()")
                    yield sock._read_trap
            n = len(data)
            sock._drained = n < max_bytes and sock._poll_hits < 2
            sock.stats.received_bytes += n
            return data
        finally:
            self._receiving = False

    async def send_all(self, data) -> None:
        if self._sending:
            raise BusyResourceError("another task is already sending on this stream")
        if self._eof_sent:
            raise ClosedResourceError("can't send data after send_eof()")
        self._sending = True
        sock = self.socket
        send = sock._send
        sent = 0
        try:
            # Socket.sendall(data), inline up to its first send(): when the OS
            # takes everything at once, no coroutine is created for it.
            try:
                if _traps._checkpointing and checkpoint_here():
                    await checkpoint()
                total = len(data) if isinstance(data, (bytes, bytearray)) \
                    else memoryview(data).nbytes
                try:
                    sent = send(data)
                except BlockingIOError:
                    pass
                stats = sock.stats
                stats.accepted_bytes += sent
                stats.sent_bytes += sent
            except (Cancelled, TaskTimeout, OSError, ClosedResourceError) as e:
                e.bytes_sent = sent
                raise
            if sent != total:
                await sock._send_rest(send, data, 0, sent, total)
        finally:
            self._sending = False

    async def send_eof(self) -> None:
        """Half-close: the peer reads EOF; this side can still receive."""
        if self._sending:
            raise BusyResourceError("can't send EOF while another task is sending")
        if self._eof_sent:
            return
        await self.socket.shutdown(socket.SHUT_WR)
        self._eof_sent = True

    async def aclose(self) -> None:
        await self.socket.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc_info):
        await self.aclose()


class Listener:
    """A listening socket that accepts ``SocketStream``s. ``c.listen(...)``
    returns one; it can also be awaited (``await c.listen(...)``) so that code
    written for an async ``listen`` works unchanged."""
    __slots__ = ("socket", "_sockbuf")

    def __init__(self, sock: Socket, sockbuf=None):
        self.socket = sock
        self._sockbuf = sockbuf

    @property
    def address(self):
        """The bound ``(host, port)``."""
        return self.socket.getsockname()

    async def accept(self) -> SocketStream:
        conn, _ = await self.socket.accept()
        if self._sockbuf is not None:
            _set_sockbuf(conn._sock, self._sockbuf)
        return SocketStream(conn)

    async def aclose(self) -> None:
        await self.socket.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc_info):
        await self.aclose()

    def __await__(self):
        return self
        yield  # noqa: unreachable -- makes this a generator, so `await` gives self


def listen(target, backlog: int = 128, sockbuf=None) -> Listener:
    """A ``Listener`` on ``(host, port)`` (port 0: any free port) or on an existing
    socket. ``sockbuf`` pins SO_SNDBUF/SO_RCVBUF on it and on every accepted
    connection."""
    _check_sockbuf(sockbuf)
    if not isinstance(backlog, int) or isinstance(backlog, bool) or backlog < 0:
        raise ValueError(f"backlog must be a non-negative int, got {backlog!r}")
    if isinstance(target, Socket) or _is_socket(target):
        sock = target if isinstance(target, Socket) else Socket(target)
        _set_sockbuf(sock._sock, sockbuf)
        sock._sock.listen(backlog)
        return Listener(sock, sockbuf)
    if not (isinstance(target, tuple) and len(target) == 2):
        raise TypeError(f"listen() takes a (host, port) tuple or a socket, got {target!r}")
    host, port = target
    _check_port(port)
    io = _io_now()
    family, type_, proto, _, address = io.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    raw = io.socket(family, type_, proto)
    try:
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        _set_sockbuf(raw, sockbuf)
        raw.bind(address)
        raw.listen(backlog)
        return Listener(Socket(raw), sockbuf)
    except BaseException:
        raw.close()
        raise


def _check_port(port) -> None:
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise ValueError(f"port must be an int in 0..65535, got {port!r}")


async def open_tcp_stream(host: str, port: int, sockbuf=None) -> SocketStream:
    """Connect to ``host:port`` (each resolved address in turn) and return a
    ``SocketStream`` with TCP_NODELAY set. Name resolution uses the blocking
    ``getaddrinfo``: instant for numeric addresses, which is what looplab uses."""
    if not isinstance(host, str):
        raise TypeError(f"host must be a str, got {host!r}")
    _check_port(port)
    _check_sockbuf(sockbuf)
    error = None
    io = _io_now()
    for family, type_, proto, _, address in io.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        raw = io.socket(family, type_, proto)
        sock = None
        try:
            _set_sockbuf(raw, sockbuf)
            sock = Socket(raw)
            await sock.connect(address)
            return SocketStream(sock)
        except BaseException as e:
            if sock is not None:
                await sock.close()
            else:
                raw.close()
            if not isinstance(e, OSError):
                raise
            error = e
    raise error if error is not None else OSError(f"no address found for {host}:{port}")
