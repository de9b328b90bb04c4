"""selectkernel's TCP streams: a Connection (the transport), a pull-based reader
and a writer whose ``drain()`` waits for an empty buffer.

Standard library only. The design choices, each the opposite of asyncio's:

* Reading is *pulled*: the socket is read only while a task waits in ``read``,
  so unread bytes stay in the kernel's socket buffer and TCP pushes back on the
  peer. There is no read-side buffer beyond what one call asked for.
* ``write()`` sends what the socket takes at once and keeps the rest; there are
  no water marks: ``drain()`` returns only when the user-space buffer is empty.
* ``close()`` with nothing buffered closes the socket before it returns; with
  bytes buffered it closes as soon as they are out. Writes after ``close()`` are
  dropped (and counted), whatever is still buffered.
"""
from __future__ import annotations

import errno
import socket

from .kernel import Future

__all__ = ["Connection", "StreamReader", "StreamWriter", "IncompleteReadError", "Stats"]

CHUNK = 65536


class IncompleteReadError(EOFError):
    def __init__(self, partial: bytes, expected: int):
        super().__init__(f"{len(partial)} bytes read on a total of {expected} expected bytes")
        self.partial, self.expected = partial, expected


class Stats:
    """Per-connection counters, named in looplab's results vocabulary."""
    __slots__ = ("accepted_bytes", "sent_bytes", "received_bytes", "peak_user_buffer_bytes",
                 "peak_reader_buffer_bytes", "lost_on_abort_bytes", "lost_on_exit_bytes",
                 "writes_after_close_count")

    def __init__(self):
        for name in self.__slots__:
            setattr(self, name, 0)

    def snapshot(self) -> dict:
        return {name: getattr(self, name) for name in self.__slots__}


class Connection:
    """One connected, non-blocking socket and its write buffer."""

    def __init__(self, loop, sock: socket.socket, stats: Stats):
        sock.setblocking(False)
        self.loop, self.sock, self.stats = loop, sock, stats
        self.fd = sock.fileno()
        self.wbuf = bytearray()
        self.error: BaseException | None = None
        self.closing = self.closed = False
        self._eof_pending = False
        self._drainers: list[Future] = []
        self._closed_waiters: list[Future] = []
        self._readable: Future | None = None
        self.reader: StreamReader | None = None

    # -- writing
    def write(self, data) -> None:
        if self.closing or self.closed:
            if self.error is None:     # dropped: close() was the last word
                self.stats.writes_after_close_count += 1
            return
        data = bytes(data)
        self.stats.accepted_bytes += len(data)
        if not self.wbuf:
            try:
                n = self.sock.send(data)
            except BlockingIOError:
                n = 0
            except OSError as exc:
                self.fail(exc)
                return
            self.stats.sent_bytes += n
            data = data[n:]
            if not data:
                return
            self.loop.add_writer(self.fd, self._on_writable)
        self.wbuf += data
        self.stats.peak_user_buffer_bytes = max(self.stats.peak_user_buffer_bytes, len(self.wbuf))

    def _on_writable(self) -> None:
        try:
            n = self.sock.send(self.wbuf)
        except BlockingIOError:
            return
        except OSError as exc:
            self.fail(exc)
            return
        self.stats.sent_bytes += n
        del self.wbuf[:n]
        if not self.wbuf:
            self.loop.remove_writer(self.fd)
            self._wake(self._drainers, None)
            if self._eof_pending:
                self._shutdown_write()
            if self.closing:
                self._finish()

    async def drain(self) -> None:
        if self.error is not None:
            raise self.error
        if self.wbuf:
            fut = Future(self.loop)
            self._drainers.append(fut)
            await fut

    def write_eof(self) -> None:
        if self.wbuf:
            self._eof_pending = True
        elif not self.closed:
            self._shutdown_write()

    def _shutdown_write(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError as exc:
            self.fail(exc)

    # -- reading (pulled: only while someone waits)
    async def readable(self) -> None:
        if self._readable is not None:
            raise RuntimeError("another task is already reading this connection")
        fut = self._readable = Future(self.loop)
        self.loop.add_reader(self.fd, self._on_readable)
        try:
            await fut
        finally:
            self._readable = None
            if not self.closed:
                self.loop.remove_reader(self.fd)

    def _on_readable(self) -> None:
        if self._readable is not None and not self._readable.done():
            self._readable.set_result(None)
        self.loop.remove_reader(self.fd)

    # -- ending
    def close(self) -> None:
        if self.closing or self.closed:
            return
        self.closing = True
        if not self.wbuf:
            self._finish()            # causal: closed when close() returns

    def abort(self) -> None:
        if self.closed:
            return
        self.stats.lost_on_abort_bytes += len(self.wbuf)
        self.wbuf.clear()
        self._finish()

    def fail(self, exc: BaseException) -> None:
        """The connection broke (a reset, EPIPE): every waiter hears ``exc``."""
        if not self.closed:
            self.error = exc
            self.wbuf.clear()
            self._finish(exc)

    def _finish(self, exc: BaseException | None = None) -> None:
        self.closing = self.closed = True
        self.loop.remove_reader(self.fd)
        self.loop.remove_writer(self.fd)
        self.sock.close()
        if self.reader is not None:
            self.reader._lost(exc)
        if self._readable is not None and not self._readable.done():
            self._readable.set_result(None)
        self._wake(self._drainers, exc)
        self._wake(self._closed_waiters, exc)

    @staticmethod
    def _wake(futures: list, exc) -> None:
        waiting, futures[:] = list(futures), []
        for fut in waiting:
            if not fut.done():
                fut.set_result(None) if exc is None else fut.set_exception(exc)

    async def wait_closed(self) -> None:
        if not self.closed:
            fut = Future(self.loop)
            self._closed_waiters.append(fut)
            await fut
        elif self.error is not None:
            raise self.error

    # -- the transport members drivers use
    def get_write_buffer_size(self) -> int:
        return len(self.wbuf)

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        """Accepted for asyncio compatibility; there are no water marks to set."""

    def is_closing(self) -> bool:
        return self.closing

    def pause_reading(self) -> None:
        """Nothing to do: the socket is read only while a reader waits."""

    resume_reading = pause_reading

    def get_extra_info(self, name, default=None):
        try:
            if name == "socket":
                return self.sock
            if name == "peername":
                return self.sock.getpeername()
            if name == "sockname":
                return self.sock.getsockname()
        except OSError:
            pass
        return default


class StreamReader:
    def __init__(self, conn: Connection, limit: int = CHUNK):
        self._conn, self._limit = conn, limit
        self._buf = bytearray()
        self._eof = False
        self._error: BaseException | None = None
        conn.reader = self

    def _lost(self, exc) -> None:
        self._eof = True
        self._error = exc

    async def _fill(self, n: int) -> None:
        """One recv of up to ``n`` bytes into the buffer, waiting for readability."""
        conn = self._conn
        while not self._eof:
            try:
                data = conn.sock.recv(max(n, 1))
            except BlockingIOError:
                await conn.readable()
                continue
            except OSError as exc:
                if exc.errno == errno.EBADF and conn.closed:
                    continue          # closed under us: _lost has set EOF
                conn.fail(exc)
                break
            if not data:
                self._eof = True
            else:
                conn.stats.received_bytes += len(data)
                self._buf += data
                conn.stats.peak_reader_buffer_bytes = max(conn.stats.peak_reader_buffer_bytes,
                                                          len(self._buf))
            return
        if self._error is not None:
            raise self._error

    def _take(self, n: int) -> bytes:
        data = bytes(self._buf[:n])
        del self._buf[:n]
        return data

    async def read(self, n: int = -1) -> bytes:
        if self._error is not None and not self._buf:
            raise self._error
        if n < 0:
            while not self._eof:
                await self._fill(self._limit)
            return self._take(len(self._buf))
        if not self._buf and n:
            await self._fill(n)
        return self._take(n)

    async def readexactly(self, n: int) -> bytes:
        while len(self._buf) < n and not self._eof:
            await self._fill(n - len(self._buf))
        if len(self._buf) < n:
            raise IncompleteReadError(self._take(len(self._buf)), n)
        return self._take(n)

    async def readuntil(self, separator: bytes = b"\n") -> bytes:
        while (i := self._buf.find(separator)) < 0:
            if self._eof:
                raise IncompleteReadError(self._take(len(self._buf)), None)
            await self._fill(self._limit)
        return self._take(i + len(separator))

    async def readline(self) -> bytes:
        try:
            return await self.readuntil(b"\n")
        except IncompleteReadError as exc:
            return exc.partial

    def at_eof(self) -> bool:
        return self._eof and not self._buf


class StreamWriter:
    def __init__(self, conn: Connection, reader: StreamReader):
        self.transport = conn
        self._reader = reader

    def write(self, data) -> None:
        self.transport.write(data)

    def writelines(self, seq) -> None:
        self.transport.write(b"".join(seq))

    async def drain(self) -> None:
        await self.transport.drain()

    def write_eof(self) -> None:
        self.transport.write_eof()

    def can_write_eof(self) -> bool:
        return True

    def close(self) -> None:
        self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()

    async def wait_closed(self) -> None:
        await self.transport.wait_closed()

    def get_extra_info(self, name, default=None):
        return self.transport.get_extra_info(name, default)
