"""Networking for ``AioLoop`` (the callback kernel as an asyncio loop): TCP and
UNIX connections and servers, accepted sockets, UDP endpoints, TLS and
``sendfile``, kept in the ``AioNetworking`` base class so that ``aioloop.py``
holds scheduling and running alone.

Stream connections are the callback kernel's own ``SocketTransport``s (the
variants in ``aiotransports.py`` add only asyncio's ``BufferedProtocol`` reads
and a server's client tracking), so the kernel's options -- ``high_water``/``low_water``,
``write=try-send|defer``, the version stand-ins -- act on every connection an
unmodified asyncio app opens, and ``probe`` counts them.

TLS reuses ``asyncio.sslproto.SSLProtocol``: it is a protocol over any
transport, driving ``ssl.MemoryBIO`` with no loop internals (it calls only
``call_soon``, ``call_later``, ``create_future``, ``get_debug`` and
``call_exception_handler``). Rewriting it would add a second TLS state machine
to audit and nothing to measure: the lab's knobs act on the TCP transport
beneath it, where the bytes queue. Its app-side transport keeps asyncio's own
write buffer and limits (documented in docs/aioloop.md).

Every socket opened here comes from the loop's I/O seam (``self._io.socket``),
so the simulated network can stand in for the OS.
"""
from __future__ import annotations

import asyncio
import collections
import collections.abc
import errno
import logging
import os
import socket
import stat
import sys
import weakref

from asyncio import sslproto, tasks

from .aiotransports import DatagramTransport, _SendfileProtocol, make_transport, set_nodelay
from .network import Acceptor
from .transports import SocketTransport

try:
    import ssl as _ssl
except ImportError:  # pragma: no cover - interpreter built without OpenSSL
    _ssl = None

__all__ = ["AioNetworking", "AioServer"]

logger = logging.getLogger("asyncio")

#: 3.12.1 fixed ``Server.wait_closed`` (gh-79033); 3.13 tracks the clients
#: themselves for ``close_clients``/``abort_clients``. We follow the interpreter.
_WAIT_CLOSED_FIXED = sys.version_info >= (3, 12, 1)
_HAS_CLOSE_CLIENTS = hasattr(asyncio.Server, "close_clients")
#: create_datagram_endpoint(sock=<not a datagram socket>)'s words, per interpreter
_DGRAM_SOCKET = "datagram socket" if sys.version_info >= (3, 13) else "UDP Socket"


# ---------------------------------------------------------------------------
# Server

class AioServer(Acceptor, asyncio.AbstractServer):
    """asyncio's ``Server`` contract on looplab's loop: listening sockets, the
    clients they accepted, ``close``/``wait_closed``/``serve_forever``/
    ``start_serving``; ``close_clients``/``abort_clients`` where the running
    interpreter's Server has them (3.13+). ``wait_closed`` follows the
    interpreter: from 3.12.1 it waits for close() and for every client to end;
    before, it returns at once once the server is closed."""

    def __init__(self, loop, sockets, protocol_factory, ssl_context, backlog,
                 ssl_handshake_timeout, ssl_shutdown_timeout=None):
        self._loop = loop
        self._sockets = sockets
        self._clients = weakref.WeakSet()
        self._active_count = 0
        self._waiters = []
        self._protocol_factory = protocol_factory
        self._backlog = backlog
        self._ssl_context = ssl_context
        self._ssl_handshake_timeout = ssl_handshake_timeout
        self._ssl_shutdown_timeout = ssl_shutdown_timeout
        self._serving = False
        self._serving_forever_fut = None
        self._unlink_path = None
        loop._servers.add(self)

    def __repr__(self):
        return f"<{type(self).__name__} sockets={self.sockets!r}>"

    def _attach(self, transport):
        self._clients.add(transport)
        self._active_count += 1

    def _detach(self, transport):
        self._clients.discard(transport)
        self._active_count -= 1
        if self._active_count == 0 and self._sockets is None:
            self._wakeup()

    def _wakeup(self):
        waiters, self._waiters = self._waiters, None
        for waiter in waiters or ():
            if not waiter.done():
                waiter.set_result(None)

    def _start_serving(self):
        if self._serving:
            return
        self._serving = True
        for sock in self._sockets:
            sock.listen(self._backlog)
            self._loop._add_reader(sock.fileno(), self._accept_ready, (sock,))

    # the accept path is the kernel's (network.Acceptor), with asyncio's texts
    _resource_message = "socket.accept() out of system resource"
    _failure_message = "Error on transport creation for incoming connection"
    _reported = BaseException

    def _connection(self, conn):
        conn.setblocking(False)
        set_nodelay(conn)
        self._loop._accepted(conn, self._protocol_factory, self._ssl_context, self,
                             self._ssl_handshake_timeout, self._ssl_shutdown_timeout)

    def _serving_now(self):
        return self._sockets is not None

    def get_loop(self):
        return self._loop

    def is_serving(self):
        return self._serving

    @property
    def sockets(self):
        return () if self._sockets is None else tuple(self._sockets)

    def close(self):
        sockets = self._sockets
        if sockets is None:
            return
        self._sockets = None
        loop = self._loop
        for sock in sockets:
            if self._serving and not loop._closed:
                loop._remove_reader(sock.fileno())
            sock.close()
        if self._unlink_path is not None:
            try:
                os.unlink(self._unlink_path)
            except OSError:
                pass
        self._serving = False
        loop._servers.discard(self)
        if loop._closed:
            return      # the loop's close(): no callback can run any more
        fut = self._serving_forever_fut
        if fut is not None and not fut.done():
            fut.cancel()
            self._serving_forever_fut = None
        if self._active_count == 0:
            self._wakeup()

    if _HAS_CLOSE_CLIENTS:
        def close_clients(self):
            for transport in self._clients.copy():
                transport.close()

        def abort_clients(self):
            for transport in self._clients.copy():
                transport.abort()

    async def start_serving(self):
        self._start_serving()
        await tasks.sleep(0)

    async def serve_forever(self):
        if self._serving_forever_fut is not None:
            raise RuntimeError(f"server {self!r} is already being awaited on serve_forever()")
        if self._sockets is None:
            raise RuntimeError(f"server {self!r} is closed")
        self._start_serving()
        self._serving_forever_fut = self._loop.create_future()
        try:
            await self._serving_forever_fut
        except asyncio.CancelledError:
            try:
                self.close()
                await self.wait_closed()
            finally:
                raise
        finally:
            self._serving_forever_fut = None

    async def wait_closed(self):
        if _WAIT_CLOSED_FIXED:
            if self._waiters is None:
                return
        elif self._sockets is None or self._waiters is None:
            return
        waiter = self._loop.create_future()
        self._waiters.append(waiter)
        await waiter


# ---------------------------------------------------------------------------
# The loop's networking methods

class AioNetworking:
    """The networking half of ``AioLoop`` (a base class; never used alone)."""
    __slots__ = ()

    async def _ensure_resolved(self, address, *, family=0, type=socket.SOCK_STREAM,
                               proto=0, flags=0):
        host, port = address[:2]
        return await self.getaddrinfo(host, port, family=family, type=type, proto=proto,
                                      flags=flags)

    # -------------------------------------------------------------- stream connections

    async def create_connection(self, protocol_factory, host=None, port=None, *, ssl=None,
                                family=0, proto=0, flags=0, sock=None, local_addr=None,
                                server_hostname=None, ssl_handshake_timeout=None,
                                ssl_shutdown_timeout=None, happy_eyeballs_delay=None,
                                interleave=None, all_errors=False):
        """Connect to ``host:port`` (each resolved address in turn; no
        happy-eyeballs race) or wrap ``sock``; TLS with ``ssl=``."""
        if server_hostname is not None and not ssl:
            raise ValueError("server_hostname is only meaningful with ssl")
        if server_hostname is None and ssl:
            if not host:
                raise ValueError("You must set server_hostname when using ssl without a host")
            server_hostname = host
        if ssl_handshake_timeout is not None and not ssl:
            raise ValueError("ssl_handshake_timeout is only meaningful with ssl")
        if ssl_shutdown_timeout is not None and not ssl:
            raise ValueError("ssl_shutdown_timeout is only meaningful with ssl")
        if host is not None or port is not None:
            if sock is not None:
                raise ValueError("host/port and sock can not be specified at the same time")
            infos = await self._ensure_resolved((host, port), family=family,
                                                type=socket.SOCK_STREAM, proto=proto,
                                                flags=flags)
            if not infos:
                raise OSError("getaddrinfo() returned empty list")
            laddr_infos = None
            if local_addr is not None:
                laddr_infos = await self._ensure_resolved(
                    local_addr, family=family, type=socket.SOCK_STREAM, proto=proto,
                    flags=flags)
                if not laddr_infos:
                    raise OSError("getaddrinfo() returned empty list")
            exceptions = []
            for af, type_, pr, _, address in infos:
                try:
                    sock = await self._connect_one(af, type_, pr, address, laddr_infos)
                    break
                except OSError as exc:
                    exceptions.append(exc)
            else:
                if all_errors:
                    raise ExceptionGroup("create_connection failed", exceptions)
                if len(exceptions) == 1:
                    raise exceptions[0]
                model = str(exceptions[0])
                if all(str(exc) == model for exc in exceptions):
                    raise exceptions[0]
                raise OSError("Multiple exceptions: {}".format(
                    ", ".join(str(exc) for exc in exceptions)))
        else:
            if sock is None:
                raise ValueError("host and port was not specified and no sock specified")
            if sock.type != socket.SOCK_STREAM:
                raise ValueError(f"A Stream Socket was expected, got {sock!r}")
        transport, protocol = await self._create_connection_transport(
            sock, protocol_factory, ssl, server_hostname,
            ssl_handshake_timeout=ssl_handshake_timeout,
            ssl_shutdown_timeout=ssl_shutdown_timeout)
        return transport, protocol

    async def _connect_one(self, family, type_, proto, address, laddr_infos):
        sock = self._io.socket(family, type_, proto)
        try:
            sock.setblocking(False)
            if laddr_infos is not None:
                for lfamily, _, _, _, laddr in laddr_infos:
                    if lfamily != family:
                        continue
                    try:
                        sock.bind(laddr)
                        break
                    except OSError as exc:
                        msg = (f"error while attempting to bind on address {laddr!r}: "
                               f"{(exc.strerror or '').lower()}")
                        raise OSError(exc.errno, msg) from None
                else:
                    raise OSError(f"no matching local address with family={family} found")
            await self.sock_connect(sock, address)
            return sock
        except BaseException:
            sock.close()
            raise

    async def _create_connection_transport(self, sock, protocol_factory, ssl,
                                           server_hostname, server_side=False,
                                           ssl_handshake_timeout=None,
                                           ssl_shutdown_timeout=None):
        sock.setblocking(False)
        set_nodelay(sock)
        protocol = protocol_factory()
        waiter = self.create_future()
        if ssl:
            sslcontext = None if isinstance(ssl, bool) else ssl
            ssl_protocol = sslproto.SSLProtocol(
                self, protocol, sslcontext, waiter, server_side, server_hostname,
                ssl_handshake_timeout=ssl_handshake_timeout,
                ssl_shutdown_timeout=ssl_shutdown_timeout)
            raw = make_transport(self, sock, ssl_protocol)
            transport = ssl_protocol._app_transport
        else:
            raw = transport = make_transport(self, sock, protocol, waiter=waiter)
        try:
            await waiter
        except BaseException:
            raw.close()
            raise
        return transport, protocol

    def _accepted(self, conn, protocol_factory, sslcontext, server,
                  ssl_handshake_timeout, ssl_shutdown_timeout):
        """An accepted connection of ``server``: its transport, now (TLS: after
        the handshake, which reports its own errors)."""
        protocol = protocol_factory()
        if sslcontext:
            waiter = self.create_future()
            waiter.add_done_callback(_swallow)   # the SSL protocol reports failures
            protocol = sslproto.SSLProtocol(
                self, protocol, sslcontext, waiter, server_side=True,
                ssl_handshake_timeout=ssl_handshake_timeout,
                ssl_shutdown_timeout=ssl_shutdown_timeout)
        make_transport(self, conn, protocol, server)

    async def connect_accepted_socket(self, protocol_factory, sock, *, ssl=None,
                                      ssl_handshake_timeout=None, ssl_shutdown_timeout=None):
        if sock.type != socket.SOCK_STREAM:
            raise ValueError(f"A Stream Socket was expected, got {sock!r}")
        if ssl_handshake_timeout is not None and not ssl:
            raise ValueError("ssl_handshake_timeout is only meaningful with ssl")
        if ssl_shutdown_timeout is not None and not ssl:
            raise ValueError("ssl_shutdown_timeout is only meaningful with ssl")
        return await self._create_connection_transport(
            sock, protocol_factory, ssl, "", server_side=True,
            ssl_handshake_timeout=ssl_handshake_timeout,
            ssl_shutdown_timeout=ssl_shutdown_timeout)

    async def create_unix_connection(self, protocol_factory, path=None, *, ssl=None,
                                     sock=None, server_hostname=None,
                                     ssl_handshake_timeout=None, ssl_shutdown_timeout=None):
        if ssl:
            if server_hostname is None:
                raise ValueError("you have to pass server_hostname when using ssl")
        else:
            if server_hostname is not None:
                raise ValueError("server_hostname is only meaningful with ssl")
            if ssl_handshake_timeout is not None:
                raise ValueError("ssl_handshake_timeout is only meaningful with ssl")
            if ssl_shutdown_timeout is not None:
                raise ValueError("ssl_shutdown_timeout is only meaningful with ssl")
        if path is not None:
            if sock is not None:
                raise ValueError("path and sock can not be specified at the same time")
            path = os.fspath(path)
            sock = self._io.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0)
            try:
                sock.setblocking(False)
                await self.sock_connect(sock, path)
            except BaseException:
                sock.close()
                raise
        else:
            if sock is None:
                raise ValueError("no path and sock were specified")
            if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
                raise ValueError(f"A UNIX Domain Stream Socket was expected, got {sock!r}")
        return await self._create_connection_transport(
            sock, protocol_factory, ssl, server_hostname,
            ssl_handshake_timeout=ssl_handshake_timeout,
            ssl_shutdown_timeout=ssl_shutdown_timeout)

    # -------------------------------------------------------------- servers

    async def create_server(self, protocol_factory, host=None, port=None, *,
                            family=socket.AF_UNSPEC, flags=socket.AI_PASSIVE, sock=None,
                            backlog=100, ssl=None, reuse_address=None, reuse_port=None,
                            keep_alive=None, ssl_handshake_timeout=None,
                            ssl_shutdown_timeout=None, start_serving=True):
        """Listen on every address of ``host`` (a str, a list of them, or
        None/"" for all interfaces) at ``port``, or on ``sock``."""
        if isinstance(ssl, bool):
            raise TypeError("ssl argument must be an SSLContext or None")
        if ssl_handshake_timeout is not None and ssl is None:
            raise ValueError("ssl_handshake_timeout is only meaningful with ssl")
        if ssl_shutdown_timeout is not None and ssl is None:
            raise ValueError("ssl_shutdown_timeout is only meaningful with ssl")
        if host is not None or port is not None:
            if sock is not None:
                raise ValueError("host/port and sock can not be specified at the same time")
            if reuse_address is None:
                reuse_address = os.name == "posix" and sys.platform != "cygwin"
            if host == "":
                hosts = [None]
            elif isinstance(host, str) or not isinstance(host, collections.abc.Iterable):
                hosts = [host]
            else:
                hosts = host
            infos = set()
            for h in hosts:
                infos.update(await self._ensure_resolved(
                    (h, port), family=family, type=socket.SOCK_STREAM, flags=flags))
            sockets = []
            try:
                for af, socktype, proto, _, sa in infos:
                    try:
                        sock = self._io.socket(af, socktype, proto)
                    except OSError:
                        continue      # e.g. no IPv6 here
                    sockets.append(sock)
                    if reuse_address:
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, True)
                    if reuse_port:
                        if not hasattr(socket, "SO_REUSEPORT"):
                            raise ValueError("reuse_port not supported by socket module")
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                    if keep_alive:
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, True)
                    if af == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, True)
                    try:
                        sock.bind(sa)
                    except OSError as err:
                        raise OSError(err.errno, f"error while attempting to bind on "
                                      f"address {sa!r}: {(err.strerror or '').lower()}") from None
            except BaseException:
                for s in sockets:
                    s.close()
                raise
            if not sockets:
                raise OSError("could not bind on any address out of %r" % [i[4] for i in infos])
        else:
            if sock is None:
                raise ValueError("Neither host/port nor sock were specified")
            if sock.type != socket.SOCK_STREAM:
                raise ValueError(f"A Stream Socket was expected, got {sock!r}")
            sockets = [sock]
        for s in sockets:
            s.setblocking(False)
        server = AioServer(self, sockets, protocol_factory, ssl, backlog,
                           ssl_handshake_timeout, ssl_shutdown_timeout)
        if start_serving:
            server._start_serving()
            await tasks.sleep(0)
        return server

    async def create_unix_server(self, protocol_factory, path=None, *, sock=None,
                                 backlog=100, ssl=None, ssl_handshake_timeout=None,
                                 ssl_shutdown_timeout=None, start_serving=True,
                                 cleanup_socket=True):
        if isinstance(ssl, bool):
            raise TypeError("ssl argument must be an SSLContext or None")
        if ssl_handshake_timeout is not None and not ssl:
            raise ValueError("ssl_handshake_timeout is only meaningful with ssl")
        unlink = None
        if path is not None:
            if sock is not None:
                raise ValueError("path and sock can not be specified at the same time")
            path = os.fspath(path)
            if path[0] not in (0, "\x00"):
                try:
                    if stat.S_ISSOCK(os.stat(path).st_mode):
                        os.remove(path)     # a stale socket file from an earlier run
                except FileNotFoundError:
                    pass
            sock = self._io.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.bind(path)
            except OSError as exc:
                sock.close()
                if exc.errno == errno.EADDRINUSE:
                    raise OSError(errno.EADDRINUSE, f"Address {path!r} is already in use") \
                        from None
                raise
            except BaseException:
                sock.close()
                raise
            if cleanup_socket and sys.version_info >= (3, 13) and path[0] not in (0, "\x00"):
                unlink = path
        else:
            if sock is None:
                raise ValueError("path was not specified, and no sock specified")
            if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
                raise ValueError(f"A UNIX Domain Stream Socket was expected, got {sock!r}")
        sock.setblocking(False)
        server = AioServer(self, [sock], protocol_factory, ssl, backlog,
                           ssl_handshake_timeout, ssl_shutdown_timeout)
        server._unlink_path = unlink
        if start_serving:
            server._start_serving()
            await tasks.sleep(0)
        return server

    # -------------------------------------------------------------- TLS upgrade

    async def start_tls(self, transport, protocol, sslcontext, *, server_side=False,
                        server_hostname=None, ssl_handshake_timeout=None,
                        ssl_shutdown_timeout=None):
        """Upgrade a connection to TLS (``asyncio.sslproto.SSLProtocol`` over the
        kernel's transport); returns the new app-side transport."""
        if _ssl is None:
            raise RuntimeError("Python ssl module is not available")
        if not isinstance(sslcontext, _ssl.SSLContext):
            raise TypeError(f"sslcontext is expected to be an instance of ssl.SSLContext, "
                            f"got {sslcontext!r}")
        if not isinstance(transport, SocketTransport):
            raise TypeError(f"transport {transport!r} is not supported by start_tls()")
        waiter = self.create_future()
        ssl_protocol = sslproto.SSLProtocol(
            self, protocol, sslcontext, waiter, server_side, server_hostname,
            ssl_handshake_timeout=ssl_handshake_timeout,
            ssl_shutdown_timeout=ssl_shutdown_timeout, call_connection_made=False)
        transport.pause_reading()
        transport.set_protocol(ssl_protocol)
        conmade_cb = self.call_soon(ssl_protocol.connection_made, transport)
        resume_cb = self.call_soon(transport.resume_reading)
        try:
            await waiter
        except BaseException:
            transport.close()
            conmade_cb.cancel()
            resume_cb.cancel()
            raise
        return ssl_protocol._app_transport

    # -------------------------------------------------------------- sendfile

    @staticmethod
    def _check_sendfile_args(file, offset, count):
        if "b" not in getattr(file, "mode", "b"):
            raise ValueError("file should be opened in binary mode")
        if not isinstance(offset, int):
            raise TypeError(f"offset must be a non-negative integer (got {offset!r})")
        if offset < 0:
            raise ValueError(f"offset must be a non-negative integer (got {offset!r})")
        if count is not None:
            if not isinstance(count, int):
                raise TypeError(f"count must be a positive integer (got {count!r})")
            if count <= 0:
                raise ValueError(f"count must be a positive integer (got {count!r})")

    async def sendfile(self, transport, file, offset=0, count=None, *, fallback=True):
        """The fallback only: read chunks and ``transport.write`` them, waiting
        while the transport has paused writing (its ``high_water``)."""
        if transport.is_closing():
            raise RuntimeError("Transport is closing")
        if not fallback:
            raise asyncio.SendfileNotAvailableError(
                "looplab's loop has no native sendfile; use fallback=True")
        self._check_sendfile_args(file, offset, count)
        if offset:
            file.seek(offset)
        proto = _SendfileProtocol(transport)
        transport.set_protocol(proto)
        total = 0
        try:
            while count is None or total < count:
                want = 16384 if count is None else min(16384, count - total)
                data = file.read(want)
                if not data:
                    break
                await proto.drain()
                transport.write(data)
                total += len(data)
            await proto.drain()
            return total
        finally:
            if total:
                file.seek(offset + total)
            proto.restore()

    # -------------------------------------------------------------- UDP

    async def create_datagram_endpoint(self, protocol_factory, local_addr=None,
                                       remote_addr=None, *, family=0, proto=0, flags=0,
                                       reuse_port=None, allow_broadcast=None, sock=None):
        """A UDP (or UNIX datagram) endpoint, asyncio's rules: ``sock`` alone or
        addresses resolved and grouped by (family, proto), the first pair that
        binds and connects wins; ``allow_broadcast`` sends to ``remote_addr``
        without connecting. ``reuse_address`` is gone, as in asyncio 3.11+."""
        if sock is not None:
            if sock.type != socket.SOCK_DGRAM:
                raise ValueError(f"A {_DGRAM_SOCKET} was expected, got {sock!r}")
            modifiers = dict(local_addr=local_addr, remote_addr=remote_addr, family=family,
                             proto=proto, flags=flags, reuse_port=reuse_port,
                             allow_broadcast=allow_broadcast)
            problems = ", ".join(f"{k}={v}" for k, v in modifiers.items() if v)
            if problems:
                raise ValueError(f"socket modifier keyword arguments can not be used "
                                 f"when sock is specified. ({problems})")
            sock.setblocking(False)
            remote = None
        else:
            pairs = await self._datagram_address_pairs(local_addr, remote_addr, family,
                                                       proto, flags)
            exceptions = []
            for (fam, pro), (laddr, raddr) in pairs:
                sock = remote = None
                try:
                    sock = self._io.socket(fam, socket.SOCK_DGRAM, pro)
                    if reuse_port:
                        if not hasattr(socket, "SO_REUSEPORT"):
                            raise ValueError("reuse_port not supported by socket module")
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                    if allow_broadcast:
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
                    sock.setblocking(False)
                    if local_addr:
                        sock.bind(laddr)
                    if remote_addr:
                        if not allow_broadcast:
                            await self.sock_connect(sock, raddr)
                        remote = raddr
                except OSError as exc:
                    if sock is not None:
                        sock.close()
                    exceptions.append(exc)
                except BaseException:
                    if sock is not None:
                        sock.close()
                    raise
                else:
                    break
            else:
                raise exceptions[0]
        protocol = protocol_factory()
        waiter = self.create_future()
        transport = DatagramTransport(self, sock, protocol, remote, waiter)
        self._datagrams.add(transport)
        return await self._connected(transport, protocol, waiter)

    @staticmethod
    async def _connected(transport, protocol, waiter):
        """``(transport, protocol)`` once ``waiter`` says ``connection_made`` ran;
        the transport closed if the wait is cancelled (datagrams, pipes)."""
        try:
            await waiter
        except BaseException:
            transport.close()
            raise
        return transport, protocol

    async def _datagram_address_pairs(self, local_addr, remote_addr, family, proto, flags):
        """``[((family, proto), (local, remote)), ...]`` to try, asyncio's way."""
        if not (local_addr or remote_addr):
            if family == 0:
                raise ValueError("unexpected address family")
            return [((family, proto), (None, None))]
        if hasattr(socket, "AF_UNIX") and family == socket.AF_UNIX:
            for addr in (local_addr, remote_addr):
                if addr is not None and not isinstance(addr, str):
                    raise TypeError("string is expected")
            if local_addr and local_addr[0] not in (0, "\x00"):
                try:
                    if stat.S_ISSOCK(os.stat(local_addr).st_mode):
                        os.remove(local_addr)     # a stale socket file
                except FileNotFoundError:
                    pass
                except OSError as err:
                    logger.error("Unable to check or remove stale UNIX socket %r: %r",
                                 local_addr, err)
            return [((family, proto), (local_addr, remote_addr))]
        by_family = {}
        for index, addr in ((0, local_addr), (1, remote_addr)):
            if addr is None:
                continue
            if not (isinstance(addr, tuple) and len(addr) == 2):
                raise TypeError("2-tuple is expected")
            infos = await self._ensure_resolved(addr, family=family, type=socket.SOCK_DGRAM,
                                                proto=proto, flags=flags)
            if not infos:
                raise OSError("getaddrinfo() returned empty list")
            for fam, _, pro, _, address in infos:
                by_family.setdefault((fam, pro), [None, None])[index] = address
        pairs = [(key, tuple(addrs)) for key, addrs in by_family.items()
                 if not ((local_addr and addrs[0] is None) or (remote_addr and addrs[1] is None))]
        if not pairs:
            raise ValueError("can not get address information")
        return pairs


def _swallow(fut):
    if not fut.cancelled():
        fut.exception()
