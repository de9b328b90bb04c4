"""The transports of ``AioLoop`` (the callback kernel as an asyncio loop): the
kernel's ``SocketTransport`` with asyncio's two extras, and a UDP transport.

A stream connection is the callback kernel's own ``SocketTransport`` -- its
write path, buffer, flow control and options untouched -- in one of four
variants that differ only in what asyncio adds: ``BufferedProtocol`` reads
(``recv_into`` the protocol's buffer, which TLS needs: ``SSLProtocol`` is one)
and telling the server when a connection ends. ``set_protocol`` switches the
variant in place (``__class__`` assignment between classes of one layout), as
the kernel switches to its deque buffer, so the plain read path pays nothing.

``DatagramTransport`` is a small UDP transport of its own (the kernel has
none); its flow control uses the loop's ``high_water``/``low_water``.
``_SendfileProtocol`` stands in for an app's protocol while ``sendfile`` writes.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import socket
import sys

from asyncio import futures

from .transports import (_FAILED, _WOULD_BLOCK, Aborting, SocketTransport,
                         _ChunkBufferTransport, call_protocol)

__all__ = ["AioTransport", "DatagramTransport", "make_transport", "set_nodelay"]

logger = logging.getLogger("asyncio")

# ---------------------------------------------------------------------------
# Reading into the protocol's buffer

def _nonempty_buffer(protocol):
    buf = protocol.get_buffer(-1)
    if not len(buf):
        raise RuntimeError("get_buffer() returned an empty buffer")
    return buf


class BufferedReads:
    """The read path for a protocol that lends its own buffer (asyncio's
    ``BufferedProtocol``: ``get_buffer``/``buffer_updated``), mixed in before a
    ``SocketTransport`` class: one ``recv_into`` the protocol's buffer per
    readiness, the rest (EOF, errors, counts) as in the plain path. TLS needs
    it: asyncio's ``SSLProtocol`` is a ``BufferedProtocol``."""
    __slots__ = ()

    def _read_ready(self):
        protocol = self._protocol
        buf = self._guarded("Fatal error: protocol.get_buffer() call failed.",
                            _nonempty_buffer, protocol)
        if buf is _FAILED:
            return
        n = self._guarded("fatal read error on socket transport", self._sock.recv_into, buf,
                          would_block=_WOULD_BLOCK)
        if n is _FAILED:
            return
        if not n:
            self._read_eof()
            return
        self.stats.received_bytes += n
        self._guarded("Fatal error: protocol.buffer_updated() call failed.",
                      protocol.buffer_updated, n)


# ---------------------------------------------------------------------------
# Transports: the kernel's SocketTransport with asyncio's two extras.

class _AioMixin:
    """What asyncio's loop adds to a stream transport: the server learns when a
    connection ends, and ``set_protocol`` picks the read path for the new
    protocol (``BufferedProtocol`` reads into the protocol's buffer)."""
    __slots__ = ()
    _made_failure_is_fatal = False

    def set_protocol(self, protocol):
        self._protocol = protocol
        _choose_class(self)
        if self._started and not self._closing and not self._read_paused \
                and not self._eof_received:
            # the registered reader is a bound method of the old class
            self._read_from_loop()

    def _call_connection_lost(self, exc):
        server = self._server
        try:
            SocketTransport._call_connection_lost(self, exc)
        finally:
            if server is not None:
                server._detach(self)

    def get_extra_info(self, name, default=None):
        return self._extra.get(name, default)


class AioTransport(_AioMixin, SocketTransport):
    __slots__ = ()


class AioBufferedTransport(BufferedReads, AioTransport):
    __slots__ = ()


class AioChunkTransport(_AioMixin, _ChunkBufferTransport):
    __slots__ = ()


class AioChunkBufferedTransport(BufferedReads, AioChunkTransport):
    __slots__ = ()


def _choose_class(transport):
    chunk = isinstance(transport, _ChunkBufferTransport)
    buffered = isinstance(transport._protocol, asyncio.BufferedProtocol)
    transport.__class__ = ((AioChunkBufferedTransport if buffered else AioChunkTransport)
                           if chunk else
                           (AioBufferedTransport if buffered else AioTransport))


def make_transport(loop, sock, protocol, server=None, waiter=None):
    """A stream transport for a connected non-blocking ``sock``: the kernel's
    ``SocketTransport`` (its ``__init__`` decides the write buffer from the
    loop's options), given asyncio's read path for ``protocol``.
    ``connection_made`` runs on the next pass, then ``waiter`` resolves."""
    transport = SocketTransport(loop, sock, protocol, server)
    _choose_class(transport)
    if server is not None:
        server._attach(transport)
    if waiter is not None:
        loop.call_soon(futures._set_result_unless_cancelled, waiter, None)
    return transport


def set_nodelay(sock):
    if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass



# ---------------------------------------------------------------------------
# UDP

#: 3.12 sends an empty datagram (3.11 drops it) and counts 8 header bytes per
#: queued datagram in get_write_buffer_size(); we follow the interpreter
_EMPTY_DATAGRAMS_SENT = sys.version_info >= (3, 12)
_DATAGRAM_HEADER = 8 if _EMPTY_DATAGRAMS_SENT else 0
_MAX_DATAGRAM = 256 * 1024        # asyncio's max_size: a UNIX datagram can exceed 64 KiB
_WARN_AFTER_LOST_SENDS = 5        # asyncio's LOG_THRESHOLD_FOR_CONNLOST_WRITES


class DatagramTransport(Aborting, asyncio.DatagramTransport):
    """A UDP socket for a ``DatagramProtocol``, asyncio's selector transport's
    behaviour: ``sendto`` tries the socket at once and queues what would block
    (flow control with the loop's marks); ``error_received`` gets the socket's
    errors; a connected endpoint counts sends after its loss and from the fifth
    on logs each; ``connection_lost`` once."""

    def __init__(self, loop, sock, protocol, address=None, waiter=None):
        super().__init__({"socket": sock, "sockname": sock.getsockname()})
        try:
            self._extra["peername"] = sock.getpeername()
        except OSError:
            self._extra["peername"] = None
        self._loop = loop
        self._sock = sock
        self._fileno = sock.fileno()
        self._protocol = protocol
        self._address = address
        self._buffer = collections.deque()
        self._buffer_size = 0
        self._high_water = loop.options["high_water"]
        self._low_water = loop.options["low_water"]
        self._paused = False
        self._closing = False
        self._lost = 0                  # asyncio's _conn_lost: sends after the loss
        loop.call_soon(self._protocol.connection_made, self)
        loop.call_soon(self._start_reading)
        if waiter is not None:
            loop.call_soon(futures._set_result_unless_cancelled, waiter, None)

    def __repr__(self):
        return f"<{type(self).__name__} fd={self._fileno} closing={self._closing}>"

    def _start_reading(self):
        if not self._closing:
            self._loop._add_reader(self._fileno, self._read_ready, ())

    def _read_ready(self):
        if self._lost:
            return
        try:
            data, addr = self._sock.recvfrom(_MAX_DATAGRAM)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._protocol.error_received(exc)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._fatal_error(exc, "Fatal read error on datagram transport")
        else:
            self._protocol.datagram_received(data, addr)

    def sendto(self, data, addr=None):
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"data argument must be a bytes-like object, "
                            f"not {type(data).__name__!r}")
        if not data and not _EMPTY_DATAGRAMS_SENT:
            return
        if self._address:
            if addr not in (None, self._address):
                raise ValueError(f"Invalid address: must be None or {self._address}")
            addr = self._address
        if self._lost and self._address:
            if self._lost >= _WARN_AFTER_LOST_SENDS:
                logger.warning("socket.send() raised exception.")
            self._lost += 1
            return
        if not self._buffer:
            if self._send(data, addr):
                return
            self._loop._add_writer(self._fileno, self._write_ready, ())
        self._buffer.append((bytes(data), addr))     # what we keep must not change
        self._buffer_size += len(data) + _DATAGRAM_HEADER
        if self._buffer_size > self._high_water and not self._paused:
            self._paused = True
            call_protocol(self, "pause_writing")

    def _send(self, data, addr):
        """One datagram now: True if it went or failed (reported), False if it
        would block."""
        try:
            if self._extra["peername"] or addr is None:
                # (asyncio calls sendto(data, None) on a socket connected before
                # it was handed over, a TypeError; we send on it)
                self._sock.send(data)
            else:
                self._sock.sendto(data, addr)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as exc:
            self._protocol.error_received(exc)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._fatal_error(exc, "Fatal write error on datagram transport")
        return True

    def _write_ready(self):
        buffer = self._buffer
        while buffer:
            data, addr = buffer[0]
            if not self._send(data, addr):
                break
            buffer.popleft()
            self._buffer_size -= len(data) + _DATAGRAM_HEADER
            if self._lost:
                return
        if self._paused and self._buffer_size <= self._low_water:
            self._paused = False
            call_protocol(self, "resume_writing")
        if not buffer:
            self._loop._remove_writer(self._fileno)
            if self._closing and not self._lost:
                self._lost += 1
                self._call_connection_lost(None)

    def get_write_buffer_size(self):
        return self._buffer_size

    def is_closing(self):
        return self._closing

    def close(self):
        if self._closing:
            return
        self._closing = True
        self._loop._remove_reader(self._fileno)
        if not self._buffer:
            self._lost += 1
            self._loop.call_soon(self._call_connection_lost, None)

    def _force_close(self, exc):
        if self._lost:
            return
        loop = self._loop
        if self._buffer:
            self._buffer.clear()
            self._buffer_size = 0
            loop._remove_writer(self._fileno)
        if not self._closing:
            self._closing = True
            loop._remove_reader(self._fileno)
        self._lost += 1
        if loop._closed:
            self._sock.close()
        else:
            loop.call_soon(self._call_connection_lost, exc)

    def _released(self):
        self._loop._datagrams.discard(self)

    def _abandon_at_exit(self):
        self._lost += 1
        self._closing = True
        self._sock.close()
        return 0


class _SendfileProtocol(asyncio.Protocol):
    """Stands in for an app's protocol while ``sendfile``'s fallback writes:
    it turns ``pause_writing``/``resume_writing`` into a wait for ``drain``."""

    def __init__(self, transport):
        self._transport = transport
        self._proto = transport.get_protocol()
        self._paused = None

    def pause_writing(self):
        if self._paused is None:
            self._paused = self._transport._loop.create_future()

    def resume_writing(self):
        if self._paused is not None:
            if not self._paused.done():
                self._paused.set_result(None)
            self._paused = None

    async def drain(self):
        if self._transport.is_closing():
            raise ConnectionError("Connection closed by peer")
        if self._paused is not None:
            await self._paused

    def data_received(self, data):
        raise RuntimeError("Invalid state: connection should have been established already.")

    def eof_received(self):
        return self._proto.eof_received()

    def connection_lost(self, exc):
        self.resume_writing()
        self._proto.connection_lost(exc)

    def restore(self):
        self._transport.set_protocol(self._proto)
