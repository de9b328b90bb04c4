"""asyncio-style streams over the callback kernel's transports: StreamReader,
StreamWriter, the protocol that joins them to a SocketTransport, and
open_connection / start_server.

The writer adds nothing to the transport's write path: ``writer.write`` *is*
``transport.write`` (bound in the constructor), so every byte goes into the
callback kernel's user-space buffer exactly as a Protocol's would, and the
same ``ConnStats`` count it. What the stream layer adds is a way to *wait*:
``await writer.drain()`` suspends while the transport has told the protocol
to pause (``pause_writing``), until ``resume_writing`` -- which the transport
calls at or below the low-water mark, not at empty. ``drain="empty"`` is the
alternative design: drain waits until the buffer is completely empty.

The reader is asyncio's: one ``bytearray`` fed by ``data_received``; when it
holds more than ``2 * limit`` bytes the transport's reading is paused, and it
is resumed when a read brings it to ``limit`` or below (or when a reader has
to wait for data). ``peak_buffer_bytes`` records the largest it got (S2).
``read()`` is the hot path of every stream server (one call per message): it
creates its waiter inline and recycles it after a normal wake-up instead of
allocating a Future per wait.
"""
from __future__ import annotations

import collections
import sys

from kernels.callback import get_running_loop
from .futures import _PENDING, Future, _state_for
from .tasks import Task, _yield_once

__all__ = ["StreamReader", "StreamWriter", "StreamProtocol", "Server", "open_connection",
           "start_server", "IncompleteReadError", "LimitOverrunError"]

_DEFAULT_LIMIT = 2 ** 16

#: Server.wait_closed(): "3.11" returns once the server is closed; "3.12" (3.12.1 on)
#: also waits for every connection it accepted. The default follows the running Python.
WAIT_CLOSED_DEFAULT = "3.11" if sys.version_info[:3] < (3, 12, 1) else "3.12"

#: The stream layer's own options (declared in ``runner.OPTIONS``). A Runner puts its
#: values on its loop as ``stream_options``; a loop made elsewhere gets these. They
#: are read only on rare paths: drain() on a closing transport, a second drain
#: waiter, a server's wait_closed().
STREAM_DEFAULTS = {"wait_closed": WAIT_CLOSED_DEFAULT, "drain_on_closing": "yield",
                   "drain_waiters": "many"}


def _stream_option(loop, name):
    return getattr(loop, "stream_options", STREAM_DEFAULTS)[name]


class IncompleteReadError(EOFError):
    """EOF came before the requested bytes; ``partial`` holds what was read."""

    def __init__(self, partial: bytes, expected):
        r_expected = "undefined" if expected is None else repr(expected)
        super().__init__(f"{len(partial)} bytes read on a total of {r_expected} expected bytes")
        self.partial = partial
        self.expected = expected

    def __reduce__(self):
        return type(self), (self.partial, self.expected)


class LimitOverrunError(Exception):
    """The separator was not found within ``limit`` bytes; ``consumed`` is how many
    bytes may be dropped to skip the overlong chunk."""

    def __init__(self, message: str, consumed: int):
        super().__init__(message)
        self.consumed = consumed

    def __reduce__(self):
        return type(self), (self.args[0], self.consumed)


class StreamReader:
    """Bytes received on a connection, read by one task at a time.

    Contract: ``read``/``readexactly``/``readline``/``readuntil`` return as soon
    as the buffer can satisfy them; otherwise they suspend until
    ``feed_data``/``feed_eof``. Only one coroutine may wait at a time
    (RuntimeError otherwise). An exception set by the protocol (a reset peer)
    is raised by every later read.

    Hazard (asyncio's, kept on purpose): the buffer may hold up to ``2 * limit``
    plus one receive before reading pauses -- the read-side buffering the 2016
    post calls bug 2.
    """

    def __init__(self, limit=_DEFAULT_LIMIT, loop=None):
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise TypeError(f"limit must be an int, got {type(limit).__name__}")
        if limit <= 0:
            raise ValueError(f"limit must be > 0, got {limit}")
        self._limit = limit
        self._loop = loop
        self._buffer = bytearray()
        self._eof = False
        self._waiter = None
        self._spare_waiter = None
        self._exception = None
        self._transport = None
        self._paused = False
        self.peak_buffer_bytes = 0

    def __repr__(self):
        info = [f"{len(self._buffer)} bytes"]
        if self._eof:
            info.append("eof")
        if self._paused:
            info.append("paused")
        if self._exception is not None:
            info.append(f"exception={self._exception!r}")
        return f"<StreamReader {' '.join(info)} limit={self._limit}>"

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def buffer_bytes(self) -> int:
        """Bytes received and not yet read."""
        return len(self._buffer)

    def exception(self):
        return self._exception

    def set_exception(self, exc) -> None:
        self._exception = exc
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if waiter._state is _PENDING:
                waiter.set_exception(exc)

    def set_transport(self, transport) -> None:
        if self._transport is not None:
            raise RuntimeError("the reader already has a transport")
        self._transport = transport

    def _wakeup_waiter(self):
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if waiter._state is _PENDING:
                waiter.set_result(None)

    def _maybe_resume_transport(self):
        if self._paused and len(self._buffer) <= self._limit:
            self._paused = False
            self._transport.resume_reading()

    def feed_eof(self) -> None:
        self._eof = True
        self._wakeup_waiter()

    def at_eof(self) -> bool:
        """True when EOF was fed and every byte has been read."""
        return self._eof and not self._buffer

    def feed_data(self, data) -> None:
        if self._eof:
            raise RuntimeError("feed_data after feed_eof")
        if not data:
            return
        buf = self._buffer
        buf += data
        size = len(buf)
        if size > self.peak_buffer_bytes:
            self.peak_buffer_bytes = size
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if waiter._state is _PENDING:
                waiter.set_result(None)
        if size > 2 * self._limit and not self._paused and self._transport is not None:
            self._transport.pause_reading()
            self._paused = True

    def _new_waiter(self, func_name) -> Future:
        """The Future a read waits on until ``feed_data``/``feed_eof``, after the
        checks (one waiter at a time, none after EOF; reading resumed if paused).
        The caller awaits it and clears ``_waiter`` in a ``finally``:
        ``_wait_for_data`` does that for readexactly/readuntil, ``read()`` inline
        (a coroutine in between costs an object and one more frame to pass
        through on every suspend and resume)."""
        if self._waiter is not None:
            raise RuntimeError(f"{func_name}() called while another coroutine is "
                               "already waiting for incoming data")
        if self._eof:
            raise RuntimeError(f"{func_name}(): waiting for data after EOF")
        # The caller needs more than the buffer holds: reading must go on even if
        # the buffer is over the limit, or nobody would ever resume it.
        if self._paused:
            self._paused = False
            self._transport.resume_reading()
        waiter = self._waiter = Future(loop=self._loop)
        return waiter

    async def _wait_for_data(self, func_name):
        waiter = self._new_waiter(func_name)
        try:
            await waiter
        finally:
            self._waiter = None

    async def read(self, n=-1) -> bytes:
        """Up to ``n`` bytes as soon as at least one is buffered; ``b""`` at EOF.
        ``n < 0``: everything until EOF. ``n == 0``: ``b""`` at once."""
        if self._exception is not None:
            raise self._exception
        if n == 0:
            return b""
        if n < 0:
            blocks = []
            while True:
                block = await self.read(self._limit)
                if not block:
                    return b"".join(blocks)
                blocks.append(block)
        buf = self._buffer
        if not buf and not self._eof:
            # The hot path of every stream server, so _new_waiter's work is done
            # here (one call less) and the waiter is recycled: once ``await
            # waiter`` has returned normally nobody else refers to it -- feed_data
            # cleared _waiter, the step that resumed us cleared the Task's
            # _fut_waiter, the awaiting frame is this one -- so the next wait
            # re-arms it instead of allocating a Future (~7 % of an echo round
            # trip). A waiter that raised (error, cancellation) may live on in a
            # traceback: it is never reused.
            if self._waiter is None and not self._paused:
                waiter = self._spare_waiter
                if waiter is None:
                    waiter = Future(loop=self._loop)
                else:
                    self._spare_waiter = None
                    waiter._state = _PENDING
                    waiter._result = None
                    waiter._callbacks = []
                self._waiter = waiter
            else:
                waiter = self._new_waiter("read")
            try:
                await waiter
            finally:
                self._waiter = None
            self._spare_waiter = waiter
        if n >= len(buf):
            data = bytes(buf)
            buf.clear()
        else:
            data = bytes(memoryview(buf)[:n])
            del buf[:n]
        if self._paused:
            self._maybe_resume_transport()
        return data

    async def readexactly(self, n) -> bytes:
        """Exactly ``n`` bytes; ``IncompleteReadError`` (with ``.partial``) if EOF
        comes first -- the partial bytes are consumed."""
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"readexactly size must be an int, got {type(n).__name__}")
        if n < 0:
            raise ValueError("readexactly size can not be less than zero")
        if self._exception is not None:
            raise self._exception
        if n == 0:
            return b""
        buf = self._buffer
        while len(buf) < n:
            if self._eof:
                partial = bytes(buf)
                buf.clear()
                raise IncompleteReadError(partial, n)
            await self._wait_for_data("readexactly")
        if len(buf) == n:
            data = bytes(buf)
            buf.clear()
        else:
            data = bytes(memoryview(buf)[:n])
            del buf[:n]
        self._maybe_resume_transport()
        return data

    async def readline(self) -> bytes:
        """A line ending in ``b"\\n"``; at EOF the incomplete rest (maybe ``b""``).
        ValueError if the line is longer than ``limit`` (the line, or the
        buffer if no newline was found, is dropped)."""
        try:
            return await self.readuntil(b"\n")
        except IncompleteReadError as e:
            return e.partial
        except LimitOverrunError as e:
            if self._buffer.startswith(b"\n", e.consumed):
                del self._buffer[:e.consumed + 1]
            else:
                self._buffer.clear()
            self._maybe_resume_transport()
            raise ValueError(e.args[0]) from None

    async def readuntil(self, separator=b"\n") -> bytes:
        """Bytes up to and including ``separator``.

        ``IncompleteReadError`` at EOF without the separator (the buffer is
        consumed into ``.partial``); ``LimitOverrunError`` if the data before
        the separator exceeds ``limit`` (the data stays buffered)."""
        seplen = len(separator)
        if seplen == 0:
            raise ValueError("separator must be at least one byte")
        if self._exception is not None:
            raise self._exception
        buf = self._buffer
        offset = 0   # where the separator can start in bytes not searched yet
        while True:
            buflen = len(buf)
            if buflen - offset >= seplen:
                isep = buf.find(separator, offset)
                if isep != -1:
                    break
                offset = buflen + 1 - seplen
                if offset > self._limit:
                    raise LimitOverrunError(
                        "separator is not found, and the chunk exceeds the limit", offset)
            if self._eof:
                partial = bytes(buf)
                buf.clear()
                raise IncompleteReadError(partial, None)
            await self._wait_for_data("readuntil")
        if isep > self._limit:
            raise LimitOverrunError("separator is found, but the chunk is longer than the limit",
                                    isep)
        end = isep + seplen
        data = bytes(memoryview(buf)[:end])
        del buf[:end]
        self._maybe_resume_transport()
        return data

    def __aiter__(self):
        return self

    async def __anext__(self):
        line = await self.readline()
        if not line:
            raise StopAsyncIteration
        return line


class StreamProtocol:
    """Joins a SocketTransport to a StreamReader and a StreamWriter's drain()
    (asyncio's StreamReaderProtocol + FlowControlMixin).

    Flow control: ``pause_writing`` sets ``paused``; ``resume_writing`` clears it
    and wakes *every* task waiting in ``drain()`` (a list of waiters: two
    drainers on one writer both wake -- CPython issue 74116 raised
    AssertionError there, as the option ``drain_waiters="one"`` does here).
    ``connection_lost`` wakes them too, with the error if there was one.
    """

    def __init__(self, reader, client_connected_cb=None, loop=None, server=None):
        self._loop = get_running_loop() if loop is None else loop
        self._reader = reader
        self._client_connected_cb = client_connected_cb
        self._server = server
        self._transport = None
        self._writer = None
        self._task = None
        self._paused = False
        self._connection_lost = False
        self._drain_waiters = collections.deque()
        # drain="empty" waits by asking the transport to pause at any buffered
        # byte (limits 0) and resume at empty; these are the limits to restore.
        self._saved_limits = None
        self._drain_empty = _state_for(self._loop).drain_empty
        self._closed = Future(loop=self._loop)
        # The transport calls data_received once per recv: skip a layer.
        self.data_received = reader.feed_data

    def __repr__(self):
        state = "lost" if self._connection_lost else "paused" if self._paused else "open"
        return f"<StreamProtocol {state}>"

    def connection_made(self, transport):
        self._transport = transport
        self._reader.set_transport(transport)
        if self._server is not None:
            self._server._attach()
        cb = self._client_connected_cb
        if cb is None:
            return
        self._writer = StreamWriter(transport, self, self._reader, self._loop)
        res = cb(self._reader, self._writer)
        if hasattr(res, "send") and hasattr(res, "throw"):
            task = self._task = Task(res, loop=self._loop)
            task.add_done_callback(self._handler_done)

    def _handler_done(self, task):
        self._task = None
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            self._loop.call_exception_handler({
                "message": "unhandled exception in client_connected_cb",
                "exception": exc, "transport": self._transport})
            if self._transport is not None:
                self._transport.close()

    def data_received(self, data):  # replaced per instance by reader.feed_data
        self._reader.feed_data(data)

    def eof_received(self):
        self._reader.feed_eof()
        return True   # stay half-open: the writer may still write

    def connection_lost(self, exc):
        self._connection_lost = True
        reader = self._reader
        if exc is None:
            reader.feed_eof()
        else:
            reader.set_exception(exc)
        if not self._closed.done():
            if exc is None:
                self._closed.set_result(None)
            else:
                self._closed.set_exception(exc)
                # Retrieved here, as asyncio's protocol does when it goes away:
                # nobody is obliged to call wait_closed().
                self._closed.exception()
        self._wake_drainers(exc)
        if self._server is not None:
            self._server._detach()
            self._server = None
        self._transport = None
        self._writer = None

    def pause_writing(self):
        self._paused = True

    def resume_writing(self):
        self._paused = False
        if self._saved_limits is not None:
            self._restore_limits()
        self._wake_drainers(None)

    def _wake_drainers(self, exc):
        for waiter in self._drain_waiters:
            if waiter._state is _PENDING:
                if exc is None:
                    waiter.set_result(None)
                else:
                    waiter.set_exception(exc)

    def _restore_limits(self):
        low, high = self._saved_limits
        self._saved_limits = None
        if self._transport is not None and not self._transport.is_closing():
            self._transport.set_write_buffer_limits(high=high, low=low)

    async def _drain_helper(self):
        if self._connection_lost:
            raise ConnectionResetError("Connection lost")
        if self._drain_empty:
            transport = self._transport
            if not transport.get_write_buffer_size():
                return
            if self._saved_limits is None:
                self._saved_limits = transport.get_write_buffer_limits()
                # Pauses now (the buffer is not empty), resumes at empty.
                transport.set_write_buffer_limits(high=0, low=0)
        elif not self._paused:
            return
        waiters = self._drain_waiters
        if waiters and _stream_option(self._loop, "drain_waiters") == "one":
            # asyncio before 3.11 (and 3.10.6) kept one waiter and asserted it was free
            raise AssertionError("drain() is already awaited on this writer "
                                 "(drain_waiters=one: a single drain waiter)")
        waiter = Future(loop=self._loop)
        waiters.append(waiter)
        try:
            await waiter
        finally:
            self._drain_waiters.remove(waiter)
            if self._saved_limits is not None and not self._drain_waiters:
                self._restore_limits()   # the waiters were cancelled before empty


class StreamWriter:
    """The write side of a stream: the transport's write calls plus ``drain()``.

    ``write``/``writelines`` *are* the transport's (``SocketTransport.write``):
    they never block and never fail for lack of room -- the bytes go to the
    transport's user-space buffer. ``close()`` is a request: it returns before
    the socket is closed; ``await wait_closed()`` waits for ``connection_lost``.
    """

    def __init__(self, transport, protocol, reader, loop):
        self._transport = transport
        self._protocol = protocol
        self._reader = reader
        self._loop = loop
        self.write = transport.write
        self.writelines = transport.writelines

    def __repr__(self):
        return f"<StreamWriter transport={self._transport!r}>"

    @property
    def transport(self):
        return self._transport

    def write(self, data) -> None:  # replaced per instance by transport.write
        self._transport.write(data)

    def writelines(self, data) -> None:  # replaced per instance by transport.writelines
        self._transport.writelines(data)

    def write_eof(self) -> None:
        return self._transport.write_eof()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def close(self) -> None:
        """Ask the transport to flush and close; returns at once."""
        return self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    async def wait_closed(self) -> None:
        """Wait until the connection is closed (``connection_lost`` ran); raises
        the connection's error if it ended with one."""
        await self._protocol._closed

    def get_extra_info(self, name, default=None):
        return self._transport.get_extra_info(name, default)

    async def drain(self) -> None:
        """Wait until it is appropriate to write more.

        ``drain="asyncio"``: returns at once unless the transport paused
        writing; then waits for ``resume_writing`` -- bytes at or below the
        low-water mark may still be buffered when it returns. ``drain="empty"``:
        waits until the write buffer is empty.
        Raises the reader's exception, or ``ConnectionResetError`` once the
        connection is lost. On a closing transport it first yields once, so that
        a pending ``connection_lost`` can run (asyncio 3.11). With the option
        ``drain_on_closing="return"`` it returns at once there instead, without
        yielding or raising (asyncio issue 263, CPython 80982)."""
        reader = self._reader
        if reader is not None and reader._exception is not None:
            if self._transport.is_closing() and self._returns_when_closing():
                return
            raise reader._exception
        protocol = self._protocol
        if self._transport.is_closing():   # also true once the connection is lost
            if self._returns_when_closing():
                return
            await _yield_once()
        elif not protocol._paused and not protocol._drain_empty:
            return                          # the common case: no second coroutine
        await protocol._drain_helper()

    def _returns_when_closing(self) -> bool:
        return _stream_option(self._loop, "drain_on_closing") == "return"


async def open_connection(host=None, port=None, *, limit=_DEFAULT_LIMIT, sockbuf=None):
    """Connect to ``host:port`` (a literal IP) and return ``(reader, writer)``.
    ``sockbuf`` sets SO_SNDBUF/SO_RCVBUF on the socket."""
    loop = get_running_loop()
    reader = StreamReader(limit=limit, loop=loop)
    protocol = StreamProtocol(reader, loop=loop)
    connected = Future(loop=loop)

    def on_connect(transport, _protocol, exc):
        if connected.done():          # the caller was cancelled meanwhile
            if transport is not None:
                transport.abort()
        elif exc is not None:
            connected.set_exception(exc)
        else:
            connected.set_result(transport)

    loop.create_connection(lambda: protocol, host, port, callback=on_connect, sockbuf=sockbuf)
    transport = await connected
    return reader, StreamWriter(transport, protocol, reader, loop)


class Server:
    """A listening stream server (the callback kernel's Server underneath).

    ``close()`` stops accepting; connections already accepted live on.
    ``await wait_closed()`` follows the option ``wait_closed``: "3.11" (the
    default on Python before 3.12.1) returns at once once the server is closed;
    "3.12" returns once the server is closed *and* every connection it accepted
    has been lost -- the semantics asyncio settled on in 3.12.1, under which a
    shutdown hangs while a client sits idle (CPython 113538, 104344). Either way
    a wait begun before ``close()`` lasts until both have happened (3.11 too). ``serve_forever()`` waits
    until cancelled or until ``close()``; cancelling it closes the server.
    """

    def __init__(self, loop):
        self._loop = loop
        self._inner = None
        self._active = 0
        self._closed = False
        self._waiters = []
        self._serving_forever = None

    def __repr__(self):
        return f"<hybrid Server sockets={self.sockets} active={self._active}>"

    @property
    def sockets(self):
        return self._inner.sockets if self._inner is not None else ()

    def get_loop(self):
        return self._loop

    def is_serving(self) -> bool:
        return self._inner is not None and self._inner.is_serving()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._inner is not None:
            self._inner.close()
        fut = self._serving_forever
        if fut is not None and not fut.done():
            fut.cancel()
        self._wake_if_done()

    def _attach(self):
        self._active += 1

    def _detach(self):
        self._active -= 1
        self._wake_if_done()

    def _wake_if_done(self):
        if self._closed and self._active == 0:
            waiters, self._waiters = self._waiters, []
            for w in waiters:
                if not w.done():
                    w.set_result(None)

    async def wait_closed(self) -> None:
        if self._closed and (self._active == 0 or
                             _stream_option(self._loop, "wait_closed") == "3.11"):
            return
        waiter = Future(loop=self._loop)
        self._waiters.append(waiter)
        await waiter

    async def start_serving(self) -> None:
        """Already serving since start_server returned; kept for asyncio parity."""

    async def serve_forever(self) -> None:
        if self._serving_forever is not None:
            raise RuntimeError("serve_forever() is already running on this server")
        if self._closed:
            raise RuntimeError("the server is closed")
        self._serving_forever = Future(loop=self._loop)
        try:
            await self._serving_forever
        finally:
            self._serving_forever = None
            self.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc_info):
        self.close()
        await self.wait_closed()


async def start_server(client_connected_cb, host=None, port=None, *, sock=None,
                       limit=_DEFAULT_LIMIT, sockbuf=None, backlog=128) -> Server:
    """Listen on ``host:port`` (literal IP) or ``sock``; for every connection call
    ``client_connected_cb(reader, writer)`` -- a coroutine function runs as a
    Task, a plain function is just called. ``sockbuf`` sets SO_SNDBUF/SO_RCVBUF
    on accepted sockets."""
    if not callable(client_connected_cb):
        raise TypeError("client_connected_cb must be callable")
    StreamReader(limit)   # validate limit here, not in every accept
    loop = get_running_loop()
    server = Server(loop)

    def factory():
        return StreamProtocol(StreamReader(limit, loop), client_connected_cb, loop, server)

    server._inner = loop.create_server(factory, host, port, sock=sock, backlog=backlog,
                                       sockbuf=sockbuf)
    return server
