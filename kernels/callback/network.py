"""The callback kernel's networking: ``Server`` (listening sockets that turn
accepted connections into ``SocketTransport``\\ s) and the ``Loop`` methods that
open connections (``create_server``, ``create_connection``,
``connect_accepted_socket``), kept in the ``Networking`` base class so that
``loop.py`` holds the reactor alone.

Every socket opened here comes from the loop's I/O seam (``loop._io.socket``)
and is used only through its methods, so a simulated network can stand in for
the OS. Addresses are literal IPs: the loop does no DNS.
"""
from __future__ import annotations

import errno
import os
import socket

__all__ = ["Networking", "Server", "Acceptor", "connect_result"]


def _literal_family(host: str) -> int:
    """Address family of a literal IP; the loop does no DNS (a hidden blocking
    call in a reactor is exactly the kind of thing this lab is about)."""
    if not isinstance(host, str):
        raise TypeError(f"host must be a str literal IP address, got {type(host).__name__}")
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
            return family
        except OSError:
            pass
    raise ValueError(f"host must be a literal IP address such as '127.0.0.1' "
                     f"(this loop does no DNS), got {host!r}")


def _check_port(port) -> int:
    if isinstance(port, bool) or not isinstance(port, int):
        raise TypeError(f"port must be an int, got {type(port).__name__}")
    if not 0 <= port <= 65535:
        raise ValueError(f"port must be in 0..65535, got {port}")
    return port


def _check_sockbuf(sockbuf):
    if sockbuf is None:
        return None
    if isinstance(sockbuf, bool) or not isinstance(sockbuf, int):
        raise TypeError(f"sockbuf must be an int or None, got {type(sockbuf).__name__}")
    if sockbuf <= 0:
        raise ValueError(f"sockbuf must be > 0, got {sockbuf}")
    return sockbuf


def _prepare_stream_socket(sock, sockbuf) -> None:
    """What every connection socket gets: non-blocking, Nagle off (asyncio does the
    same for TCP), and the requested kernel buffer sizes."""
    sock.setblocking(False)
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
    if sockbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sockbuf)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, sockbuf)


def _is_stream_socket(sock) -> bool:
    # Duck-typed, so that a simulated network's sockets pass too.
    return (getattr(sock, "type", None) == socket.SOCK_STREAM
            and callable(getattr(sock, "recv", None)) and callable(getattr(sock, "fileno", None)))


class Networking:
    """The networking half of ``Loop`` (a base class; never used alone). It
    relies on the loop's ``_io``, ``_check_closed``, ``call_soon``,
    ``_add_writer``/``_remove_writer`` and ``_connecting``."""
    __slots__ = ()


    def create_server(self, protocol_factory, host=None, port=None, *, sock=None,
                      backlog=128, sockbuf=None) -> "Server":
        """Listen on ``host:port`` (a literal IP; None means every IPv4 interface)
        or on an already bound ``sock``. Synchronous: when it returns, the socket
        is listening and accepts run on the loop. OSError from bind propagates."""
        self._check_closed()
        if not callable(protocol_factory):
            raise TypeError("protocol_factory must be callable")
        if isinstance(backlog, bool) or not isinstance(backlog, int) or backlog < 1:
            raise ValueError(f"backlog must be a positive int, got {backlog!r}")
        sockbuf = _check_sockbuf(sockbuf)
        if sock is not None:
            if host is not None or port is not None:
                raise ValueError("give either sock or host/port, not both")
            if not _is_stream_socket(sock):
                raise TypeError(f"sock must be a SOCK_STREAM socket, got {sock!r}")
        else:
            if port is None:
                raise ValueError("create_server needs a port (0 for any) or sock=")
            port = _check_port(port)
            if host is None:
                host = "0.0.0.0"
            family = _literal_family(host)
            sock = self._io.socket(family, socket.SOCK_STREAM)
            try:
                if os.name == "posix":
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((host, port))
            except BaseException:
                sock.close()
                raise
        try:
            if sockbuf is not None:
                # accepted sockets inherit these, so the window is right from SYN
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sockbuf)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, sockbuf)
            sock.listen(backlog)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        return Server(self, [sock], protocol_factory, backlog, sockbuf)

    def create_connection(self, protocol_factory, host, port, *, callback,
                          sockbuf=None) -> None:
        """Start a non-blocking connect to ``host:port`` (literal IP). From the
        loop, later: ``callback(transport, protocol, None)`` -- after the
        protocol's ``connection_made`` -- or ``callback(None, None, exc)``."""
        self._check_closed()
        if not callable(protocol_factory):
            raise TypeError("protocol_factory must be callable")
        if not callable(callback):
            raise TypeError("callback must be callable")
        family = _literal_family(host)
        port = _check_port(port)
        sockbuf = _check_sockbuf(sockbuf)
        sock = self._io.socket(family, socket.SOCK_STREAM)
        try:
            _prepare_stream_socket(sock, sockbuf)
            err = sock.connect_ex((host, port))
        except BaseException:
            sock.close()
            raise
        if err not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EINTR):
            sock.close()
            self.call_soon(callback, None, None, OSError(err, os.strerror(err)))
            return
        fd = sock.fileno()
        self._connecting[fd] = sock
        self._add_writer(fd, self._connect_done, (sock, protocol_factory, callback))

    def _connect_done(self, sock, protocol_factory, callback):
        err = connect_result(sock)
        if err is None:
            return   # spurious readiness (see the module notes): keep waiting
        fd = sock.fileno()
        self._remove_writer(fd)
        del self._connecting[fd]
        if err:
            sock.close()
            callback(None, None, OSError(err, os.strerror(err)))
            return
        try:
            protocol = protocol_factory()
        except Exception as exc:
            sock.close()
            callback(None, None, exc)
            return
        transport = _transport_class()(self, sock, protocol)
        self.call_soon(callback, transport, protocol, None)   # queued after connection_made

    def connect_accepted_socket(self, protocol_factory, sock):
        """Wrap a connected stream socket; returns ``(transport, protocol)`` at once.
        ``connection_made`` runs on the loop's next pass, before any data."""
        self._check_closed()
        if not _is_stream_socket(sock):
            raise TypeError(f"sock must be a connected SOCK_STREAM socket, got {sock!r}")
        if not callable(protocol_factory):
            raise TypeError("protocol_factory must be callable")
        _prepare_stream_socket(sock, None)
        protocol = protocol_factory()
        transport = _transport_class()(self, sock, protocol)
        return transport, protocol


def connect_result(sock):
    """After a non-blocking connect's socket turned writable: 0 if it is
    connected, the errno if the connect failed, None if the readiness was
    spurious (an fd closed and reused within one batch) and the connect is
    still pending. Both loops' connects use it."""
    err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if not err:
        try:
            sock.getpeername()
        except OSError as exc:
            if exc.errno == errno.ENOTCONN:
                return None
            err = exc.errno or errno.ECONNABORTED
    return err


def _transport_class():
    # transports.py imports the loop; bind lazily to avoid the cycle
    from .transports import SocketTransport
    return SocketTransport


class Acceptor:
    """The accept path of a listening server, shared by this kernel's ``Server``
    and the asyncio loop's (``aionet.AioServer``). A subclass supplies
    ``_loop``, ``_backlog``, ``_serving_now()`` and ``_connection(conn)`` (what an
    accepted socket becomes), and may rename its reports (``_resource_message``,
    ``_failure_message``) or widen what a failed connection reports instead of
    raising (``_reported``)."""
    __slots__ = ()

    _resource_message = "accept() failed; pausing accepts for 1 s"
    _failure_message = "protocol factory failed for an accepted connection"
    #: a failure of ``_connection`` of this class is reported and the accept loop
    #: goes on; anything else is raised (SystemExit and KeyboardInterrupt always are)
    _reported = Exception

    def _accept_ready(self, lsock):
        # Accept a batch per readiness (asyncio takes up to backlog): a burst of
        # connects costs one select pass, not one each.
        loop = self._loop
        for _ in range(self._backlog):
            try:
                conn, _addr = lsock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # Out of descriptors or memory: stop accepting for a second
                    # rather than spin on a listening socket that stays readable.
                    loop.call_exception_handler({
                        "message": self._resource_message, "exception": exc,
                        "socket": lsock, "server": self})
                    loop._remove_reader(lsock.fileno())
                    loop.call_later(1.0, self._resume_accepting, lsock)
                    return
                raise
            try:
                self._connection(conn)
            except BaseException as exc:
                conn.close()
                if (isinstance(exc, (SystemExit, KeyboardInterrupt))
                        or not isinstance(exc, self._reported)):
                    raise
                loop.call_exception_handler({
                    "message": self._failure_message, "exception": exc, "server": self})

    def _resume_accepting(self, lsock):
        if self._serving_now() and not self._loop._closed:
            self._loop._add_reader(lsock.fileno(), self._accept_ready, (lsock,))


class Server(Acceptor):
    """Listening sockets feeding new ``SocketTransport``\\ s to the loop.

    ``close()`` stops accepting and closes the listening sockets; connections
    already accepted live on (they are the loop's, not the server's)."""

    def __init__(self, loop, sockets, protocol_factory, backlog, sockbuf):
        self._loop = loop
        self._sockets = list(sockets)
        self._protocol_factory = protocol_factory
        self._backlog = backlog
        self._sockbuf = sockbuf
        self._serving = True
        loop._servers.add(self)
        for sock in self._sockets:
            loop._add_reader(sock.fileno(), self._accept_ready, (sock,))

    @property
    def sockets(self):
        return tuple(self._sockets)

    def is_serving(self) -> bool:
        return self._serving

    def _serving_now(self) -> bool:
        return self._serving

    def close(self) -> None:
        if not self._serving:
            return
        self._serving = False
        loop = self._loop
        for sock in self._sockets:
            if not loop._closed:
                loop._remove_reader(sock.fileno())
            sock.close()
        loop._servers.discard(self)

    def __repr__(self):
        names = [s.getsockname() for s in self._sockets if s.fileno() >= 0]
        return f"<looplab callback Server {names} serving={self._serving}>"

    def _connection(self, conn):
        _prepare_stream_socket(conn, self._sockbuf)
        _transport_class()(self._loop, conn, self._protocol_factory(), server=self)
