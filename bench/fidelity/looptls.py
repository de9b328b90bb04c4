"""Loop-conformance probes of TLS transports: a TLS connection and its extra info,
``loop.start_tls`` and ``StreamWriter.start_tls`` upgrades, the handshake and shutdown
timeouts, refused arguments and what a TLS transport does with half-closes, pausing and
aborts. Each probe makes a throw-away self-signed certificate with the ``openssl``
command (``_tls``), so its reproduction needs nothing but the loop and openssl. The
rules of ``bench.fidelity.loops`` hold here.
"""
from __future__ import annotations

import os
import socket
import ssl
import subprocess
import tempfile
import threading
import time

from bench.fidelity.loops import _call, _raised, _wait, loop_probe
from bench.fidelity.promises import doc


def _tls():
    d = tempfile.mkdtemp()
    key, crt = os.path.join(d, "k.pem"), os.path.join(d, "c.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", key, "-out", crt, "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"], check=True, capture_output=True)
    server, client = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), ssl.create_default_context(cafile=crt)
    server.load_cert_chain(crt, key)
    os.remove(key), os.remove(crt), os.rmdir(d)
    return server, client


async def _echo_server(a, server_ctx):
    class Echo(a.Protocol):
        connection_made = lambda self, t: setattr(self, "t", t)  # noqa: E731
        data_received = lambda self, d: self.t.write(d)  # noqa: E731
    return await a.get_running_loop().create_server(Echo, "127.0.0.1", 0, ssl=server_ctx)


async def _tls_echo(a):
    """A TLS echo server, and the client context that trusts it: (srv, client_ctx)."""
    server_ctx, client_ctx = _tls()
    return await _echo_server(a, server_ctx), client_ctx


async def _tls_stream(a):
    """A TLS stream connected to a TLS echo server: (srv, r, w, client_ctx)."""
    server_ctx, client_ctx = _tls()
    srv = await _echo_server(a, server_ctx)
    r, w = await a.wait_for(a.open_connection(*srv.sockets[0].getsockname(), ssl=client_ctx,
                                              server_hostname="localhost"), 2)
    return srv, r, w, client_ctx


async def _tls_connect(a, proto, srv, client_ctx):
    """A TLS transport of ``proto`` connected to ``srv``."""
    t, _ = await a.wait_for(a.get_running_loop().create_connection(
        proto, *srv.sockets[0].getsockname(), ssl=client_ctx, server_hostname="localhost"), 2)
    return t


async def _close(a, w, srv):
    w.close()
    await _wait(a, w.wait_closed())
    srv.close()


@loop_probe(promise=doc("eventloop", "asyncio.loop.create_connection",
                        "ssl: if given and not false, a SSL/TLS transport is created (by default "
                        "a plain TCP transport is created)."))
async def lp_tls_echo(a):
    """open_connection(ssl=) to a TLS start_server(): 100 kB echoed back."""
    srv, r, w, _ = await _tls_stream(a)
    w.write(b"t" * 100_000)
    got = await _wait(a, r.readexactly(100_000), 2)
    await _close(a, w, srv)
    return {"echoed": got == repr(b"t" * 100_000)}


@loop_probe(promise=doc("protocol", "asyncio.BaseTransport.get_extra_info",
                        "'ssl_object': ssl.SSLObject or ssl.SSLSocket instance"))
async def lp_tls_extra_info(a):
    """A TLS client transport's extra info: ssl_object, peercert, cipher, sslcontext."""
    srv, r, w, client_ctx = await _tls_stream(a)
    obj = w.get_extra_info("ssl_object")
    out = {"ssl_object": isinstance(obj, (ssl.SSLObject, ssl.SSLSocket)),
           "peercert_cn": dict(x[0] for x in (w.get_extra_info("peercert") or {}).get("subject", ())).get("commonName"),
           "cipher_tuple": len(w.get_extra_info("cipher") or ()) == 3,
           "sslcontext": w.get_extra_info("sslcontext") is client_ctx}
    await _close(a, w, srv)
    return out


@loop_probe(promise=doc("eventloop", "asyncio.loop.start_tls",
                        "Upgrade an existing transport-based connection to TLS."))
async def lp_tls_start_tls_client(a):
    """loop.start_tls() on a plain client connection to a TLS server: a new transport
    that carries data."""
    srv, client_ctx = await _tls_echo(a)
    got = []

    class P(a.Protocol):
        data_received = lambda self, d: got.append(d)  # noqa: E731
    loop = a.get_running_loop()
    t, p = await loop.create_connection(P, *srv.sockets[0].getsockname())
    try:
        tls = await a.wait_for(loop.start_tls(t, p, client_ctx, server_hostname="localhost"), 2)
    except Exception as exc:
        t.close(), srv.close()
        return {"start_tls": _raised(exc)}
    tls.write(b"up")
    await a.sleep(0.1)
    out = {"new_transport": tls is not t, "echoed": b"".join(got).decode()}
    tls.close()
    srv.close()
    return out


@loop_probe(promise=doc("eventloop", "asyncio.loop.start_tls",
                        "Upgrade an existing transport-based connection to TLS."))
async def lp_tls_start_tls_server(a):
    """STARTTLS: the server protocol gets b"STARTTLS", upgrades with loop.start_tls(
    server_side=True), and the client upgrades too: the data sent after arrives."""
    server_ctx, client_ctx = _tls()
    loop, got, upgraded, asked = a.get_running_loop(), [], [], a.get_running_loop().create_future()

    async def upgrade(p):
        try:
            upgraded.append(await a.wait_for(loop.start_tls(p.t, p, server_ctx, server_side=True), 2) is not p.t)
        except Exception as exc:
            upgraded.append(_raised(exc))

    class P(a.Protocol):
        connection_made = lambda self, t: setattr(self, "t", t)  # noqa: E731

        def data_received(self, d):
            if d == b"STARTTLS" and not asked.done():
                self.t.pause_reading(), asked.set_result(None), loop.create_task(upgrade(self))
            else:
                got.append(d)
    srv = await loop.create_server(P, "127.0.0.1", 0)
    r, w = await a.open_connection(*srv.sockets[0].getsockname())
    w.write(b"STARTTLS")
    await _wait(a, asked)
    out = {"client_start_tls": await _wait(a, w.start_tls(client_ctx, server_hostname="localhost"), 2)}
    w.write(b"hello")
    await a.sleep(0.1)
    w.close(), srv.close()
    return {**out, "server_upgraded": upgraded, "server_got": b"".join(got).decode()}


@loop_probe(promise=doc("stream", "asyncio.StreamWriter.start_tls",
                        "Upgrade an existing stream-based connection to TLS."))
async def lp_tls_stream_start_tls(a):
    """StreamWriter.start_tls() (3.11) on a plain stream to a TLS server, then an echo."""
    srv, client_ctx = await _tls_echo(a)
    r, w = await a.open_connection(*srv.sockets[0].getsockname())
    out = {"start_tls": await _wait(a, w.start_tls(client_ctx, server_hostname="localhost"), 2)}
    w.write(b"stream")
    out["echo"] = await _wait(a, r.readexactly(6))
    out["ssl_object"] = w.get_extra_info("ssl_object") is not None
    w.close()
    srv.close()
    return out


@loop_probe(promise=doc("eventloop", "asyncio.loop.create_connection",
                        "ssl_handshake_timeout is (for a TLS connection) the time in seconds to "
                        "wait for the TLS handshake to complete before aborting the connection."))
async def lp_tls_handshake_timeout(a):
    """A server that never answers the handshake, ssl_handshake_timeout=0.2: the
    connection is aborted (within 1 s), with which exception."""
    _, client_ctx = _tls()
    lsn = socket.create_server(("127.0.0.1", 0))
    start = time.monotonic()
    try:
        t, _ = await a.wait_for(a.get_running_loop().create_connection(
            a.Protocol, *lsn.getsockname(), ssl=client_ctx, server_hostname="localhost",
            ssl_handshake_timeout=0.2), 1)
        t.close()
        out = {"create_connection": "connected"}
    except Exception as exc:
        out = {"create_connection": _raised(exc)}
    lsn.close()
    return {**out, "aborted_in_time": time.monotonic() - start < 0.9}


@loop_probe(promise=doc("eventloop", "asyncio.loop.create_connection",
                        "ssl_shutdown_timeout is the time in seconds to wait for the SSL shutdown "
                        "to complete before aborting the connection."))
async def lp_tls_shutdown_timeout(a):
    """A TLS peer that never answers close_notify, ssl_shutdown_timeout=0.2: close()
    ends in connection_lost() within 1 s."""
    server_ctx, client_ctx = _tls()
    lsn, stop = socket.create_server(("127.0.0.1", 0)), threading.Event()
    lsn.settimeout(2)

    def peer():             # handshakes, then never reads again
        try:
            conn = lsn.accept()[0]
            conn.settimeout(2)
            with server_ctx.wrap_socket(conn, server_side=True):
                stop.wait(3)
        except OSError:
            pass
    th = threading.Thread(target=peer)
    th.start()
    lost = a.get_running_loop().create_future()

    class P(a.Protocol):
        connection_lost = lambda self, e: lost.done() or lost.set_result(type(e).__name__ if e else None)  # noqa: E731
    try:
        t, _ = await a.wait_for(a.get_running_loop().create_connection(
            P, *lsn.getsockname(), ssl=client_ctx, server_hostname="localhost", ssl_shutdown_timeout=0.2), 2)
        t.close()
    except Exception as exc:
        t, out = None, {"create_connection": _raised(exc)}
    if t is not None:
        try:
            out = {"connection_lost": await a.wait_for(lost, 1)}
        except Exception as exc:
            out = {"connection_lost": _raised(exc)}
    stop.set(), th.join(), lsn.close()
    return out


@loop_probe()
async def lp_tls_handshake_timeout_zero(a):
    """create_connection(ssl=..., ssl_handshake_timeout=0)."""
    _, client_ctx = _tls()
    lsn = socket.create_server(("127.0.0.1", 0))
    out = {"create_connection": await _wait(a, a.get_running_loop().create_connection(
        a.Protocol, *lsn.getsockname(), ssl=client_ctx, server_hostname="localhost",
        ssl_handshake_timeout=0), 0.5)}
    lsn.close()
    return out


@loop_probe()
async def lp_tls_timeout_without_ssl(a):
    """ssl_handshake_timeout and ssl_shutdown_timeout given without ssl."""
    lsn = socket.create_server(("127.0.0.1", 0))
    loop, out = a.get_running_loop(), {}
    for kw in ("ssl_handshake_timeout", "ssl_shutdown_timeout"):
        try:
            t, _ = await a.wait_for(loop.create_connection(a.Protocol, *lsn.getsockname(), **{kw: 1.0}), 1)
            t.close()
            out[kw] = "connected"
        except Exception as exc:
            out[kw] = _raised(exc)
    lsn.close()
    return out


@loop_probe()
async def lp_tls_server_hostname_without_ssl(a):
    """server_hostname given without ssl ("Should only be passed if ssl is not None")."""
    lsn = socket.create_server(("127.0.0.1", 0))
    try:
        t, _ = await a.wait_for(a.get_running_loop().create_connection(
            a.Protocol, *lsn.getsockname(), server_hostname="localhost"), 1)
        t.close()
        out = "connected"
    except Exception as exc:
        out = _raised(exc)
    lsn.close()
    return {"create_connection": out}


@loop_probe()
async def lp_tls_bad_certificate(a):
    """A client that does not trust the server's certificate: what open_connection() raises."""
    srv, _ = await _tls_echo(a)
    try:
        r, w = await a.wait_for(a.open_connection(*srv.sockets[0].getsockname(),
                                                  ssl=ssl.create_default_context(),
                                                  server_hostname="localhost"), 2)
        w.close()
        out = "connected"
    except Exception as exc:
        out = _raised(exc)
    srv.close()
    await a.sleep(0.02)
    return {"open_connection": out}


@loop_probe()
async def lp_tls_start_tls_not_a_context(a):
    """loop.start_tls() with something that is not an SSLContext."""
    lsn = socket.create_server(("127.0.0.1", 0))
    loop = a.get_running_loop()
    t, p = await loop.create_connection(a.Protocol, *lsn.getsockname())
    out = {"start_tls": await _wait(a, loop.start_tls(t, p, object()), 0.5)}
    t.close(), lsn.close()
    return out


@loop_probe()
async def lp_tls_can_write_eof(a):
    """A TLS transport's can_write_eof(), and write_eof() on it."""
    srv, r, w, _ = await _tls_stream(a)
    out = {"can_write_eof": _call(lambda: w.can_write_eof()), "write_eof": _call(lambda: w.write_eof())}
    await _close(a, w, srv)
    return out


@loop_probe()
async def lp_tls_peer_close_eof(a):
    """The TLS server closes its side: the client's read() returns b'' (not an error)."""
    server_ctx, client_ctx = _tls()

    async def bye(r, w):
        w.write(b"bye")
        w.close()
    srv = await a.start_server(bye, "127.0.0.1", 0, ssl=server_ctx)
    r, w = await a.wait_for(a.open_connection(*srv.sockets[0].getsockname(), ssl=client_ctx,
                                              server_hostname="localhost"), 2)
    out = {"first": await _wait(a, r.read(10)), "then": await _wait(a, r.read(10))}
    w.close()
    srv.close()
    return out


@loop_probe(promise=doc("protocol", "asyncio.ReadTransport.pause_reading",
                        "No data will be passed to the protocol's protocol.data_received() "
                        "method until resume_reading() is called."))
async def lp_tls_pause_reading(a):
    """A TLS client transport paused: the server's data waits for resume_reading()."""
    server_ctx, client_ctx = _tls()

    async def hello(r, w):
        await r.read(1)
        w.write(b"data")
        await r.read()
        w.close()
    srv = await a.start_server(hello, "127.0.0.1", 0, ssl=server_ctx)
    got = []

    class P(a.Protocol):
        data_received = lambda self, d: got.append(d)  # noqa: E731
    t = await _tls_connect(a, P, srv, client_ctx)
    t.pause_reading()
    t.write(b"g")
    await a.sleep(0.1)
    out = {"while_paused": b"".join(got).decode()}
    t.resume_reading()
    await a.sleep(0.1)
    t.close()
    srv.close()
    return {**out, "after": b"".join(got).decode()}


@loop_probe(promise=doc("protocol", "asyncio.WriteTransport.abort",
                        "The protocol's protocol.connection_lost() method will eventually be "
                        "called with None as its argument."))
async def lp_tls_abort(a):
    """abort() on a TLS client transport: connection_lost(None)."""
    srv, client_ctx = await _tls_echo(a)
    lost = a.get_running_loop().create_future()

    class P(a.Protocol):
        connection_lost = lambda self, e: lost.done() or lost.set_result(type(e).__name__ if e else None)  # noqa: E731
    t = await _tls_connect(a, P, srv, client_ctx)
    t.abort()
    out = {"connection_lost": await _wait(a, lost)}
    srv.close()
    return out


@loop_probe()
async def lp_tls_write_after_close(a):
    """write() on a TLS transport after close()."""
    srv, client_ctx = await _tls_echo(a)
    t = await _tls_connect(a, a.Protocol, srv, client_ctx)
    t.close()
    out = {"write": _call(lambda: t.write(b"x"))}
    await a.sleep(0.02)
    srv.close()
    return out


@loop_probe()
async def lp_tls_eof_received_true(a):
    """eof_received() returns True on a TLS transport (asyncio: no effect, with a warning):
    is the transport closed after the peer's close_notify?"""
    server_ctx, client_ctx = _tls()

    async def bye(r, w):
        w.close()
    srv = await a.start_server(bye, "127.0.0.1", 0, ssl=server_ctx)
    events = []

    class P(a.Protocol):
        eof_received = lambda self: events.append("eof") or True  # noqa: E731
        connection_lost = lambda self, e: events.append("lost")  # noqa: E731
    t = await _tls_connect(a, P, srv, client_ctx)
    await a.sleep(0.1)
    out = {"events": events, "is_closing": _call(lambda: t.is_closing())}
    t.close()
    srv.close()
    return out


@loop_probe(promise=doc("protocol", "asyncio.WriteTransport.get_write_buffer_size",
                        "Return the current size of the output buffer used by the transport."))
async def lp_tls_write_buffer_size(a):
    """A TLS transport's get_write_buffer_size() is an int, 0 once the echo has come back."""
    srv, r, w, _ = await _tls_stream(a)
    w.write(b"q" * 1000)
    await _wait(a, r.readexactly(1000))
    out = {"size": _call(lambda: w.transport.get_write_buffer_size())}
    w.close()
    srv.close()
    return out
