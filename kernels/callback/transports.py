"""Socket transports for the callback kernel: ``SocketTransport`` (one class for
accepted and connected TCP sockets) and the ``Protocol`` base class.

A transport is where the callback style hides its buffer. ``write()`` never
blocks and never refuses: what the socket cannot take right now is appended to
a user-space ``bytearray`` and sent from the writable callback later. The
application learns about the backlog only through ``pause_writing()`` (buffer
above the high-water mark) and ``resume_writing()`` (drained to the low-water
mark) -- advice it is free to ignore, which is the whole of bug 1 in the 2016
post. Every number here is counted exactly in ``stats`` (a ``ConnStats``),
updated on every write and every send, so the reports can show what the
application was told and what it did.

The write buffer is one ``bytearray``, like asyncio 3.11's: ``len()`` is the
O(1) running total (CPython 146507 summed a deque per write), ``sock.send(buf)``
sends straight from it, and deleting the sent prefix is cheap because CPython's
bytearray moves its start pointer instead of copying. The cost is memory: a
growing bytearray over-allocates, so a runaway buffer holds roughly twice its
backlog -- the behaviour the S1 figures show for asyncio.

Errors surface in callbacks, never at the call: a reset peer turns into
``connection_lost(exc)`` on a later pass, and ``write()`` after that is counted
and dropped (from the fifth such write on, each is logged as asyncio logs it).
That is the callback style's "error surface" measured by S4.

The edges follow asyncio 3.11's selector transport: a ``write()`` after
``close()`` while bytes are still buffered is appended and delivered; flow
control keeps running while a closed transport drains; after an EOF that the
protocol kept half-open, ``is_reading()`` stays true and ``pause_reading();
resume_reading()`` reads the EOF again. Four options bring back older or other
libraries' edges, one each, on these rare paths only (the per-write path never
reads them): ``write_after_close="drop"`` (3.12.0-3.12.8),
``limits_recheck=false`` (asyncio 3.4.0), ``writelines="unchecked"``
(3.12.0-3.12.8) and ``buffer_on_loss="keep"`` (uvloop 548). ``write_buffer="deque"``
(3.12+, CPython 146507) makes the transport a ``_ChunkBufferTransport`` with a
deque of chunks instead, decided once in ``__init__``. One deliberate difference: asyncio
raises ``AttributeError`` for a ``write()`` after a buffered close completed
(its own bug); we drop and count it like any write on a lost connection.
"""
from __future__ import annotations

import collections
import functools
import logging
import os
import socket
import weakref

from ..probe import ConnStats

__all__ = ["Protocol", "SocketTransport", "Aborting", "report_fatal",
           "call_protocol"]

#: From this many writes dropped on a closed or lost connection on, each one
#: more logs "socket.send() raised exception." (asyncio's threshold and text).
WARN_AFTER_DROPPED_WRITES = 5

logger = logging.getLogger(__name__)

#: ``buffer_on_loss="keep"``: the write buffers of each loop's lost transports,
#: held (not freed) for as long as the loop exists.
_kept_buffers: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

#: One read is ``sock.recv(_RECV_BYTES)``: CPython allocates that much, shrinks
#: the ``bytes`` in place to what arrived, and the object goes to
#: ``data_received`` as it is. (It used to be ``recv_into`` a loop-wide buffer and
#: a copy out with ``view[:n].tobytes()``: two more objects and a copy per read,
#: ~4 % of an echo round trip's instructions.) Stay below glibc's 128 KiB mmap
#: threshold: asyncio's 256 KiB turns every recv into mmap + munmap (the
#: allocator trap in docs/benchmarking.md).
_RECV_BYTES = 65536


class Protocol:
    """No-op base for callback-port protocols. The transport calls exactly these
    six methods; inheriting from this class is optional (any object with all six
    works).

    ``eof_received()`` returning a true value keeps the transport half-open (we
    may still write); a false value makes the transport close itself.
    ``pause_writing()``/``resume_writing()`` are advisory: the transport keeps
    accepting writes while paused, and counts them."""

    def connection_made(self, transport):
        pass

    def data_received(self, data):
        pass

    def eof_received(self):
        return None

    def connection_lost(self, exc):
        pass

    def pause_writing(self):
        pass

    def resume_writing(self):
        pass


def _byte_calls(sock, fd):
    """The transport's ``recv()`` (of ``_RECV_BYTES``) and ``send(data)``. On a real socket they are
    ``os.read``/``os.write`` on its descriptor: the same syscalls' effect on a
    stream socket, through argument-clinic functions, where ``socket.recv``
    and ``send`` parse a tuple with ``PyArg_ParseTuple`` and go through the
    socket's timeout machinery (about 900 fewer instructions per echo round
    trip). Any other socket object (the simulated network's) keeps its methods.
    The transport owns the descriptor: it never reads or writes after closing."""
    if type(sock) is socket.socket:
        return functools.partial(os.read, fd, _RECV_BYTES), functools.partial(os.write, fd)
    return functools.partial(sock.recv, _RECV_BYTES), sock.send


def _byte_view(view: memoryview) -> memoryview:
    if view.format == "B" and view.ndim == 1:
        return view
    try:
        return view.cast("B")
    except TypeError:
        raise TypeError("write() needs a C-contiguous memoryview") from None


class _TransportStats(ConnStats):
    """A transport's ``ConnStats``: ``accepted_bytes`` is not counted per write
    but derived. Every byte ``write()`` accepts is, at any moment, exactly one
    of: sent, still buffered, dropped by an abort or a fatal error, or dropped
    at the loop's exit; the transport keeps those four exact, so their sum is
    the accepted count, and a write on the fast path updates one counter
    instead of two."""
    __slots__ = ()

    @property
    def accepted_bytes(self):
        return (self.sent_bytes + self.user_buffer_bytes + self.lost_on_abort_bytes
                + self.lost_on_exit_bytes)


def report_fatal(transport, exc, message):
    """A transport's fatal error, reported as asyncio reports it: socket errors
    are the peer's business and reach the protocol through
    ``connection_lost(exc)`` alone; anything else is a bug worth a report. Every
    transport of both loops (stream, datagram) reports through this."""
    if not isinstance(exc, OSError):
        transport._loop.call_exception_handler({
            "message": message, "exception": exc, "transport": transport,
            "protocol": transport._protocol})


def call_protocol(transport, name):
    """``transport._protocol.<name>()`` (``pause_writing``, ``resume_writing``):
    advice whose failure is reported to the loop's handler, never raised into
    the transport. Every transport of both loops advises through this."""
    try:
        getattr(transport._protocol, name)()
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:
        transport._loop.call_exception_handler({
            "message": f"protocol.{name}() failed", "exception": exc,
            "transport": transport, "protocol": transport._protocol})


#: what ``SocketTransport._guarded`` gives for a call that failed or would block
_FAILED = object()
_WOULD_BLOCK = (BlockingIOError, InterruptedError)


class Aborting:
    """How every socket transport of both loops (stream, datagram) ends:
    ``abort()`` and the fatal-error path report as asyncio does
    (``report_fatal``), then the transport's own ``_force_close(exc)`` drops
    what is buffered and queues ``_call_connection_lost(exc)``, which tells the
    protocol, closes the socket and lets the transport forget it
    (``_released``)."""
    __slots__ = ()

    def _call_connection_lost(self, exc):
        try:
            self._protocol.connection_lost(exc)
        finally:
            self._sock.close()
            self._released()

    def abort(self) -> None:
        """Close now: drop the buffer (a stream transport counts it in
        ``stats.lost_on_abort_bytes``); ``connection_lost(None)`` runs on the
        next pass."""
        self._force_close(None)

    def _fatal_error(self, exc, message):
        report_fatal(self, exc, message)
        self._force_close(exc)


class SocketTransport(Aborting):
    """A non-blocking stream socket driven by the loop on behalf of a protocol.

    Lifecycle: created by the loop (accept, connect or
    ``connect_accepted_socket``); ``connection_made`` runs on the next pass and
    only then does reading start. ``close()`` stops reading at once, lets the
    buffer drain, then closes the socket and calls ``connection_lost(None)``
    (via ``call_soon`` when the buffer was already empty, as asyncio does; from
    the writable callback that sent the last byte otherwise). ``abort()`` and
    fatal errors drop the buffer, close the socket immediately and call
    ``connection_lost`` on the next pass. ``connection_lost`` is called exactly
    once, always from the loop, never from inside ``close()``/``abort()``.

    Hazards: ``close()`` returning does not mean the peer has the data -- if the
    loop stops and closes before the buffer drains, the bytes are dropped and
    counted (``exit`` policy). A write after ``close()`` joins the bytes still
    buffered and is sent with them; once nothing is buffered (or after
    ``abort()`` or a lost connection) writes are dropped. Every write after
    ``close()`` counts in ``stats.writes_after_close_count``; from the fifth
    dropped one on, each is logged ("socket.send() raised exception.").
    """

    __slots__ = ("_loop", "_sock", "_fileno", "_recv", "_send", "_protocol", "_server",
                 "_buffer", "_high_water", "_low_water", "_try_send", "_direct",
                 "_protocol_paused", "_read_paused", "_started", "_eof_received", "_eof",
                 "_closing", "_conn_lost", "_dropped", "_extra", "_trace", "_tid", "stats",
                 "_deliver", "_reader_run", "__weakref__")

    def __init__(self, loop, sock, protocol, server=None):
        self._loop = loop
        self._sock = sock
        self._fileno = fd = sock.fileno()
        self._recv, self._send = _byte_calls(sock, fd)
        self._protocol = protocol
        self._server = server
        # what the loop's pass calls with the bytes it read, and the context the
        # rest of a read runs in (None: the caller's); the loop sets them when it
        # registers this transport (Loop._add_stream_reader)
        self._deliver = self._reader_run = None
        self._buffer = bytearray()
        options = loop.options
        if options["write_buffer"] == "deque":
            # CPython 146507's buffer: chosen here, once, so that the default
            # transport's write path is the bytearray one and pays nothing for it
            self.__class__ = _ChunkBufferTransport
            self._buffer = _ChunkBuffer()
        self._high_water = options["high_water"]
        self._low_water = options["low_water"]
        self._try_send = options["write"] == "try-send"
        self._protocol_paused = False
        self._read_paused = False
        self._started = False
        self._eof_received = False
        self._eof = False           # write_eof() called
        self._closing = False       # close()/abort() called or connection lost
        self._conn_lost = False     # connection_lost is scheduled (or has run)
        self._dropped = 0           # writes dropped because of that
        try:
            peername = sock.getpeername()
        except OSError:
            peername = None
        self._extra = {"socket": sock, "sockname": sock.getsockname(), "peername": peername}
        probe = loop.probe
        self._tid = len(probe.connections)
        self.stats = stats = probe.new_conn()
        stats.__class__ = _TransportStats
        self._trace = trace = probe.trace
        if trace is not None:
            trace.track(self._tid, f"{self.stats.name} {peername}")
        self._update_direct()
        loop._transports.add(self)
        loop.call_soon(self._start)

    def __repr__(self):
        state = ("lost" if self._conn_lost else "closing" if self._closing else "open")
        return (f"<SocketTransport {self.stats.name} fd={self._fileno} {state} "
                f"buffer={len(self._buffer)}>")

    #: an exception from ``connection_made``: the transport's fatal error (True,
    #: this kernel) or reported with the connection left open, as asyncio's
    #: loop reports a failed callback (False, the asyncio loop's transports)
    _made_failure_is_fatal = True

    def _start(self):
        try:
            self._protocol.connection_made(self)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            if self._made_failure_is_fatal:
                self._fatal_error(exc, "protocol.connection_made() failed")
                return
            self._loop.call_exception_handler({
                "message": f"Exception in callback {type(self._protocol).__qualname__}"
                           f".connection_made({self!r})",
                "exception": exc, "transport": self, "protocol": self._protocol})
        self._started = True
        if not self._closing and not self._read_paused:
            self._read_from_loop()

    def _read_from_loop(self):
        """Register this transport's reads: the plain path (``_read_ready`` as
        defined here) is done by the loop's pass itself; a class that reads
        otherwise, or a protocol without ``data_received``, registers its own
        ``_read_ready``."""
        if type(self)._read_ready is SocketTransport._read_ready \
                and hasattr(self._protocol, "data_received"):
            self._loop._add_stream_reader(self._fileno, self)
        else:
            self._loop._add_reader(self._fileno, self._read_ready, ())

    def _read_failed(self, exc, message):
        """A read of the loop's pass failed (``recv`` or ``data_received``)."""
        run = self._reader_run
        if run is None:
            self._fatal_error(exc, message)
        else:
            run(self._fatal_error, exc, message)

    def _read_ended(self):
        """A read of the loop's pass found the end of the stream."""
        run = self._reader_run
        if run is None:
            self._read_eof()
        else:
            run(self._read_eof)

    # ------------------------------------------------------------------ reading

    def _read_ready(self):
        # the loop's pass does this itself for a transport registered with
        # _add_stream_reader (loop.py): the two stay step for step
        try:
            recv = self._recv      # an attribute load, not a method lookup
            data = recv()
        except (BlockingIOError, InterruptedError):
            return
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._fatal_error(exc, "fatal read error on socket transport")
            return
        if not data:
            self._read_eof()
            return
        self.stats.received_bytes += len(data)
        try:
            self._protocol.data_received(data)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._fatal_error(exc, "protocol.data_received() failed")

    def _read_eof(self):
        self._eof_received = True
        self._loop._remove_reader(self._fileno)
        keep_open = self._guarded("protocol.eof_received() failed", self._protocol.eof_received)
        if keep_open is _FAILED:
            return
        if not keep_open:
            self.close()

    def _guarded(self, message, call, *args, would_block=()):
        """``call(*args)`` on a path that is not the per-read one: a failure is
        this transport's fatal error (``message``) and gives ``_FAILED``, as does
        an exception of ``would_block`` (then without error)."""
        try:
            return call(*args)
        except would_block:
            return _FAILED
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._fatal_error(exc, message)
            return _FAILED

    def pause_reading(self) -> None:
        """Stop calling ``data_received`` until ``resume_reading()``. Idempotent;
        each effective pause counts in ``stats.read_pauses_count``."""
        if self._closing or self._read_paused:
            return
        self._read_paused = True
        self.stats.read_pauses_count += 1
        self._loop._remove_reader(self._fileno)
        trace = self._trace
        if trace is not None:
            trace.instant("pause_reading", self._tid)

    def resume_reading(self) -> None:
        """Undo ``pause_reading()``. Idempotent. After an EOF the socket is read
        again, so the protocol hears ``eof_received()`` once more (asyncio)."""
        if self._closing or not self._read_paused:
            return
        self._read_paused = False
        if self._started:
            self._read_from_loop()
        trace = self._trace
        if trace is not None:
            trace.instant("resume_reading", self._tid)

    def is_reading(self) -> bool:
        """Not closing and not paused (an EOF kept half-open still reads: asyncio)."""
        return not (self._closing or self._read_paused)

    # ------------------------------------------------------------------ writing

    def write(self, data) -> None:
        """Accept ``data`` (bytes, bytearray or memoryview) for sending. Never
        blocks. With ``write="try-send"`` and nothing buffered, the socket gets
        it at once and only the rest is buffered; with ``"defer"`` everything
        is buffered for the writable callback. Flow control runs after every
        write: crossing the high-water mark calls ``pause_writing()`` once.

        TypeError for other types; RuntimeError after ``write_eof()`` (even for
        ``b""``). After ``close()`` with bytes still buffered: appended and sent
        before the close completes (dropped and counted instead with the option
        ``write_after_close="drop"``, CPython 115514). After ``close()`` with
        nothing buffered, ``abort()`` or a lost connection: dropped and counted."""
        if data.__class__ is self._direct:
            # the common case, one test: bytes, on an open transport that sends at
            # once, nothing buffered, no trace, not paused (see _update_direct)
            n = len(data)
            if not n:
                return          # as asyncio: the socket is not touched (its error waits)
            send = self._send
            try:
                sent = send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as exc:
                self._write_failed(exc, n)
                return
            if sent == n:
                self.stats.sent_bytes += n
                return
            if sent:
                self.stats.sent_bytes += sent
                data = memoryview(data)[sent:]
            self._buffer_rest(data)
            return
        self._write(data)

    def _write(self, data):
        """``write()`` in general: any bytes-like type, after ``close()`` or
        ``write_eof()``, with a trace, while paused, or behind buffered bytes."""
        cls = data.__class__
        if cls is not bytes and cls is not bytearray:
            if isinstance(data, memoryview):
                data = _byte_view(data)
            elif not isinstance(data, (bytes, bytearray)):
                raise TypeError(f"data argument must be a bytes-like object (bytes, "
                                f"bytearray or memoryview), not {type(data).__name__!r}")
        if self._eof:
            raise RuntimeError("cannot write() after write_eof()")
        n = len(data)
        if not n:
            return
        if self._closing:
            # counted whether sent or dropped, as the reference ports count it
            self.stats.writes_after_close_count += 1
            if self._conn_lost or self._loop.options["write_after_close"] == "drop":
                self._drop_write()
                return
        stats = self.stats
        if self._protocol_paused:
            stats.written_while_paused_bytes += n
        trace = self._trace
        if trace is not None:
            trace.instant("write", self._tid, bytes=n)
        if not self._buffer:
            if self._try_send:
                sent = self._guarded("fatal write error on socket transport", self._send, data,
                                     would_block=_WOULD_BLOCK)
                if sent is _FAILED:
                    if self._conn_lost:         # the send failed: the bytes are lost
                        stats.lost_on_abort_bytes += n
                        return
                    sent = 0                    # it would block
                if sent:
                    stats.sent_bytes += sent
                    if trace is not None:
                        trace.instant("send", self._tid, bytes=sent)
                    if sent == n:
                        return
                    data = memoryview(data)[sent:]
            self._buffer_rest(data)
            return
        self._buffer_more(data)

    def _write_failed(self, exc, n):
        self.stats.lost_on_abort_bytes += n
        self._fatal_error(exc, "fatal write error on socket transport")

    def _buffer_rest(self, data):
        """Buffer what a write could not send on an empty buffer; from now on
        the writable callback sends."""
        self._loop._add_writer(self._fileno, self._write_ready, ())
        self._buffer_more(data)

    def _buffer_more(self, data):
        self._direct = None
        buf = self._buffer
        buf += data
        size = len(buf)
        stats = self.stats
        stats.user_buffer_bytes = size
        if size > stats.peak_user_buffer_bytes:
            stats.peak_user_buffer_bytes = size
        trace = self._trace
        if trace is not None:
            trace.counter("user_buffer_bytes", size, self._tid)
        if size > self._high_water and not self._protocol_paused:
            self._pause_protocol()

    def _update_direct(self):
        """``write()``'s one test: ``_direct`` is ``bytes`` while a write of bytes
        needs nothing but the send (open, no EOF sent, try-send, no trace, not
        paused, nothing buffered), else None, so that one identity test of the
        data's class decides. Every place that changes one of these calls this or
        clears it."""
        self._direct = bytes if (self._try_send and self._trace is None and not self._closing
                                 and not self._eof and not self._protocol_paused
                                 and not self._buffer) else None

    def writelines(self, list_of_data) -> None:
        """Write the concatenation as one ``write()``: same flow-control check
        (CPython 127655 was a ``writelines`` that skipped it). With the option
        ``writelines="unchecked"`` the bytes are buffered and sent the same way
        but crossing the high-water mark does not pause the protocol (3.12.0-3.12.8)."""
        try:
            data = b"".join(list_of_data)
        except TypeError as exc:
            raise TypeError(f"writelines() needs an iterable of bytes-like objects: "
                            f"{exc}") from None
        if self._loop.options["writelines"] == "checked":
            self.write(data)
            return
        # write() without its pause check is write() with no high-water mark; the
        # mark is restored before anything else can look at it.
        high = self._high_water
        self._high_water = float("inf")
        try:
            self.write(data)
        finally:
            self._high_water = high

    def _write_ready(self):
        buf = self._buffer
        try:
            n = self._send(buf)
        except (BlockingIOError, InterruptedError):
            return
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._fatal_error(exc, "fatal write error on socket transport")
            return
        stats = self.stats
        if n:
            del buf[:n]
            stats.sent_bytes += n
        size = len(buf)
        stats.user_buffer_bytes = size
        trace = self._trace
        if trace is not None:
            trace.instant("send", self._tid, bytes=n)
            trace.counter("user_buffer_bytes", size, self._tid)
        if not size:
            # before resume_writing(): a write() made from it must find the
            # writer unregistered, like any write() on an empty buffer
            self._loop._remove_writer(self._fileno)
            self._update_direct()
        if self._protocol_paused and size <= self._low_water:
            self._resume_protocol()
        if buf or self._conn_lost:
            return
        if self._closing:
            self._conn_lost = True
            self._call_connection_lost(None)
        elif self._eof:
            self._shutdown_write()

    def _drop_write(self):
        self._dropped += 1
        if self._dropped >= WARN_AFTER_DROPPED_WRITES:
            # on the asyncio loop, asyncio's logger, where apps configure it
            getattr(self._loop, "transport_logger", logger).warning("socket.send() raised exception.")

    def _pause_protocol(self):
        self._protocol_paused = True
        self._direct = None
        self.stats.pause_writing_count += 1
        trace = self._trace
        if trace is not None:
            trace.instant("pause_writing", self._tid, buffer_bytes=len(self._buffer))
        call_protocol(self, "pause_writing")

    def _resume_protocol(self):
        self._protocol_paused = False
        self._update_direct()
        trace = self._trace
        if trace is not None:
            trace.instant("resume_writing", self._tid, buffer_bytes=len(self._buffer))
        call_protocol(self, "resume_writing")

    def get_write_buffer_size(self) -> int:
        """Bytes accepted by ``write()`` and not yet taken by a send syscall. O(1)."""
        return len(self._buffer)

    def get_write_buffer_limits(self):
        """``(low, high)``, asyncio's order."""
        return (self._low_water, self._high_water)

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        """asyncio's rules: high only -> low = high // 4; low only -> high =
        4 * low; neither -> the loop's options. ValueError unless high >= low >= 0.

        Flow control is re-checked at once: lowering the limits below what is
        already buffered calls ``pause_writing()`` now (asyncio issue 140), also
        while a closed transport is still draining.
        ``set_write_buffer_limits(0)`` pauses on any buffered byte and resumes
        only at empty. With the option ``limits_recheck=false`` the marks are only
        stored, as in asyncio 3.4.0: the next write makes the check."""
        for name, value in (("high", high), ("low", low)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise TypeError(f"{name} must be an int or None, got {type(value).__name__}")
        if high is None:
            if low is None:
                high = self._loop.options["high_water"]
                low = self._loop.options["low_water"]
            else:
                high = 4 * low
        elif low is None:
            low = high // 4
        if not high >= low >= 0:
            raise ValueError(f"need high >= low >= 0, got high={high}, low={low}")
        self._high_water = high
        self._low_water = low
        if (len(self._buffer) > high and not self._protocol_paused and not self._conn_lost
                and self._loop.options["limits_recheck"]):
            self._pause_protocol()

    def write_eof(self) -> None:
        """Half-close: send FIN once the buffer is flushed; reading goes on."""
        if self._closing or self._eof:
            return
        self._eof = True
        self._direct = None
        if not self._buffer:
            self._shutdown_write()

    def _shutdown_write(self):
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError as exc:
            self._fatal_error(exc, "shutdown(SHUT_WR) failed")

    def can_write_eof(self) -> bool:
        return True

    # ------------------------------------------------------------------ closing

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        """Stop reading now; close after the buffer drains. Returns at once:
        the close completes on a later pass (``connection_lost(None)``)."""
        if self._closing:
            return
        self._closing = True
        self._direct = None
        loop = self._loop
        loop._remove_reader(self._fileno)
        trace = self._trace
        if trace is not None:
            trace.instant("close_requested", self._tid, buffer_bytes=len(self._buffer))
        if not self._buffer:
            self._conn_lost = True
            loop.call_soon(self._call_connection_lost, None)

    def _force_close(self, exc):
        if self._conn_lost:
            return
        self._conn_lost = True
        self._closing = True
        self._direct = None
        stats = self.stats
        buf = self._buffer
        loop = self._loop
        if buf:
            stats.lost_on_abort_bytes += len(buf)
            if loop.options["buffer_on_loss"] == "keep":
                # the bytes are lost all the same; only their memory stays,
                # held by the loop until it goes away (uvloop 548)
                _kept_buffers.setdefault(loop, []).append(buf)
                self._buffer = buf.__class__()
            else:
                buf.clear()
            stats.user_buffer_bytes = 0
        loop._remove_reader(self._fileno)
        loop._remove_writer(self._fileno)
        self._sock.close()
        stats.closed = True
        trace = self._trace
        if trace is not None:
            trace.instant("abort", self._tid, error=repr(exc))
            trace.counter("user_buffer_bytes", 0, self._tid)
        loop.call_soon(self._call_connection_lost, exc)

    def _released(self):
        self.stats.closed = True
        self._loop._transports.discard(self)
        self._server = None
        trace = self._trace
        if trace is not None:
            trace.instant("close_completed", self._tid)

    def _abandon_at_exit(self) -> int:
        """``Loop.close()``: drop what is buffered (``lost_on_exit_bytes``) and
        close the socket, without telling the protocol. Returns the bytes lost."""
        buf = self._buffer
        lost = len(buf)
        stats = self.stats
        if lost:
            stats.lost_on_exit_bytes += lost
            buf.clear()
            stats.user_buffer_bytes = 0
        self._closing = True
        self._direct = None
        self._conn_lost = True
        self._sock.close()
        stats.closed = True
        return lost

    # ------------------------------------------------------------------ misc

    def get_extra_info(self, name, default=None):
        """``"socket"``, ``"peername"``, ``"sockname"``."""
        return self._extra.get(name, default)

    def set_protocol(self, protocol) -> None:
        self._protocol = protocol
        if self._deliver is not None:       # registered: the pass delivers to the new one
            self._read_from_loop()

    def get_protocol(self):
        return self._protocol

    @property
    def loop(self):
        return self._loop


# ---------------------------------------------------------------------------
# write_buffer="deque": Python 3.12's write buffer, to show CPython 146507

class _ChunkBuffer(collections.deque):
    """A deque of the written chunks whose ``len()`` is their summed size,
    computed on every call as 3.12's ``get_write_buffer_size()`` does: the pause
    check after every write walks the whole backlog, so under write pressure
    each write costs more than the last (CPython 146507). It stands in for the
    bytearray in ``SocketTransport.write``: ``+=`` appends a chunk."""
    __slots__ = ()

    def __iadd__(self, data):
        self.append(bytes(data))    # the caller may reuse its buffer
        return self

    def __len__(self):
        return sum(map(len, self))

    def __bool__(self):
        return collections.deque.__len__(self) > 0


class _ChunkBufferTransport(SocketTransport):
    """``SocketTransport`` with a ``_ChunkBuffer``: only the writable callback
    differs, because a deque cannot be handed to ``send`` as it is."""
    __slots__ = ()

    def _write_ready(self):
        buf = self._buffer
        front = buf[0]
        if len(front) < _RECV_BYTES and collections.deque.__len__(buf) > 1:
            # one send of up to 64 KiB from the front, as 3.12's sendmsg of the deque
            parts, size = [], 0
            while buf and size < _RECV_BYTES:
                chunk = buf.popleft()
                parts.append(chunk)
                size += len(chunk)
            front = b"".join(parts)
            buf.appendleft(front)
        try:
            n = self._send(front)
        except (BlockingIOError, InterruptedError):
            return
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._fatal_error(exc, "fatal write error on socket transport")
            return
        stats = self.stats
        if n:
            if n == len(front):
                buf.popleft()
            else:
                buf[0] = front[n:]
            stats.sent_bytes += n
        size = len(buf)
        stats.user_buffer_bytes = size
        trace = self._trace
        if trace is not None:
            trace.instant("send", self._tid, bytes=n)
            trace.counter("user_buffer_bytes", size, self._tid)
        if not size:
            self._loop._remove_writer(self._fileno)
            self._update_direct()
        if self._protocol_paused and size <= self._low_water:
            self._resume_protocol()
        if buf or self._conn_lost:
            return
        if self._closing:
            self._conn_lost = True
            self._call_connection_lost(None)
        elif self._eof:
            self._shutdown_write()
