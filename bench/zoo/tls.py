"""Zoo entries over TLS: the standard library's ``ssl`` on asyncio's and uvloop's loops.

CPython 118950 (the SSL transport's is_closing() stays False after a failed send,
so a write(); drain() loop never yields) and uvloop 471 (closing an SSL transport
keeps the TCP connection open while the TLS shutdown waits, up to 30 s).

The certificate is made at run time for 127.0.0.1 (with ``cryptography`` when it is
installed, else with the ``openssl`` command), once per process, in a private
temporary directory removed when the process exits. The TLS peer is a thread of the program's own process with a
blocking ``ssl`` socket -- it must act (reset, keep sending) while the program holds
its loop without a pass, which a peer on the same loop could not do. Our kernels
have no TLS: their cells are not measured, and the entries are real-network only.
"""
from __future__ import annotations

import atexit
import os
import shutil
import socket
import ssl
import struct
import subprocess
import tempfile
import threading
import time

from bench.scenarios.api import Metric, run_program
from bench.zoo.harness import KiB, _notes, _presets, _stream
from bench.zoo.registry import Entry, _add

_REAL_ONLY = ("its TLS peer is a thread of the program's process on real sockets (it must act "
              "while the program holds its loop), and the simulated network has no TLS")
_CERT: dict = {}


def certificate() -> tuple[str, str] | str:
    """(certfile, keyfile) for 127.0.0.1, made once per process; or the reason none
    can be made here."""
    if _CERT:
        return _CERT["pair"]
    d = tempfile.mkdtemp(prefix="looplab-tls-")
    atexit.register(shutil.rmtree, d, True)      # the key never outlives the process
    cert, key = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
    try:
        _with_cryptography(cert, key)
    except ImportError:
        if not shutil.which("openssl"):
            _CERT["pair"] = "no certificate: neither the cryptography package nor openssl is here"
            return _CERT["pair"]
        r = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                            "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                            "-keyout", key, "-out", cert], capture_output=True, timeout=30)
        if r.returncode != 0:
            _CERT["pair"] = f"no certificate: openssl req failed: {r.stderr.decode()[-200:]}"
            return _CERT["pair"]
    _CERT["pair"] = (cert, key)
    return _CERT["pair"]


def _with_cryptography(cert, key):
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    k = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    c = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(k.public_key())
         .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
         .not_valid_after(now + datetime.timedelta(days=1))
         .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                        critical=False).sign(k, hashes.SHA256()))
    with open(key, "wb") as f:
        f.write(k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()))
    with open(cert, "wb") as f:
        f.write(c.public_bytes(serialization.Encoding.PEM))


def _client_context(cert):
    ctx = ssl.create_default_context(cafile=cert)
    ctx.check_hostname = False       # the certificate is checked; the name is an IP literal
    return ctx


class TLSPeer(threading.Thread):
    """One TLS connection on 127.0.0.1, served by a thread with a blocking socket.

    ``mode="reset"``: read ``after_bytes``, then close with SO_LINGER 0 (an RST) and
    set ``done``. ``mode="stream"``: send ``chunk`` after ``chunk`` and never read;
    ``closed_at`` is when a send first failed (the client's TCP is gone)."""

    def __init__(self, pair, mode, *, after_bytes=1, chunk=16 * KiB, max_s=5.0):
        super().__init__(daemon=True, name=f"tls-peer-{mode}")
        self.mode, self.after_bytes, self.chunk, self.max_s = mode, after_bytes, chunk, max_s
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(*pair)
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(1)
        self.lsock.settimeout(max_s)
        self.addr = self.lsock.getsockname()
        self.done = threading.Event()
        self.stop = threading.Event()
        self.closed_at = None
        self.sent = 0
        self.error = None

    def run(self):
        deadline = time.monotonic() + self.max_s
        try:
            raw, _ = self.lsock.accept()
            raw.settimeout(self.max_s)
            s = self.ctx.wrap_socket(raw, server_side=True)
            try:
                if self.mode == "reset":
                    got = 0
                    while got < self.after_bytes:
                        data = s.recv(64 * KiB)
                        if not data:
                            break
                        got += len(data)
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                else:
                    s.settimeout(0.05)
                    block = bytes(self.chunk)
                    while not self.stop.is_set() and time.monotonic() < deadline:
                        try:
                            self.sent += s.send(block)
                        except (socket.timeout, ssl.SSLWantWriteError):
                            continue
                        except (OSError, ssl.SSLError):
                            self.closed_at = time.monotonic()
                            break
            finally:
                s.close()
        except (OSError, ssl.SSLError) as exc:
            self.error = repr(exc)
        finally:
            self.lsock.close()
            self.done.set()


def _unsupported(port, out) -> bool:
    if getattr(port, "ours", False):
        out["unsupported"] = "our kernels have no TLS"
        return True
    pair = certificate()
    if isinstance(pair, str):
        out["unsupported"] = pair
        return True
    return False


def _verdict_note(app) -> list:
    return _notes(app) + ([f"not measured: {app['unsupported']}"] if app.get("unsupported") else []) \
        + ([f"peer: {app['peer_error']}"] if app.get("peer_error") else [])


# ---------------------------------------------------------------------------
# CPython 118950: is_closing() stays False after the send failed; drain() never yields

def _sendfail_stream(job):
    p = job.params
    fixed = job.variant == "fixed"

    async def main(port, out):
        if _unsupported(port, out):
            return
        import asyncio
        pair = certificate()
        peer = TLSPeer(pair, "reset", after_bytes=100, max_s=p["max_s"])
        peer.start()
        try:
            reader, writer = await asyncio.open_connection(*peer.addr, ssl=_client_context(pair[0]))
            writer.write(b"x" * 100)
            await writer.drain()
            # Hold the loop (no pass) until the peer has reset: the read side must not
            # see the RST first, as in the thread the send is what fails.
            peer.done.wait(p["max_s"])
            time.sleep(0.05)
            n, error = 0, None
            try:
                while n < p["iterations"]:
                    if fixed:
                        await asyncio.sleep(0)   # one loop pass: connection_lost gets to run
                    writer.write(b"x" * 1024)
                    await writer.drain()
                    n += 1
            except (ConnectionError, RuntimeError) as exc:
                error = type(exc).__name__
            out.update(iterations_after_reset_count=n, error_seen=error,
                       is_closing_after=writer.is_closing(), peer_reset=peer.error is None)
            writer.transport.abort()
        finally:
            peer.join(p["max_s"])
            out["peer_error"] = peer.error
    return _stream(job, main, p["max_s"] + 2)


def _run_sendfail(ctx):
    p = ctx.params
    ran = run_program(ctx, max_s=p["max_s"] + 4)
    a = ran.app
    n = a.get("iterations_after_reset_count")
    shown = None if n is None or not a.get("peer_reset") else n >= p["iterations"] // 2
    notes = _verdict_note(a) + ([f"error seen: {a['error_seen']}"] if a.get("error_seen") else [])
    return ({"iterations_after_reset_count": n, "peer_reset": a.get("peer_reset")},
            {"bug_shown": shown}, notes)


_add(Entry(
    id="cpython-118950", aliases=("gh-118950",),
    title="TLS: is_closing() stays False after a failed send, so drain() never yields",
    link="https://github.com/python/cpython/issues/118950",
    mechanism="When socket.send() fails under an SSL transport, the TCP transport is closing "
              "and schedules connection_lost, but _SSLProtocolTransport.is_closing() still "
              "returns False. StreamWriter.drain() yields only on a closing transport, so a "
              "write(); drain() loop never gives the loop the pass that delivers "
              "connection_lost and keeps writing into a dead connection ('socket.send() "
              "raised exception' warnings, then silence).",
    reported="Python 3.11/3.12 with aiohttp WebSockets (2024)",
    fixed_in="PR 118960 (merged): is_closing() also reports the inner transport closing; not "
             "in the installed 3.11.7, nor in 3.12.1 or 3.13.0 (their sslproto.py still "
             "returns self._closed, read here)",
    framing="no WebSocket: a write(1 KiB); drain() loop over TLS to a peer that reset the "
            "connection while the program held its loop",
    expected="shown on the installed Python 3.11.7 asyncio streams and, measured, on asyncio "
             "streams over uvloop 0.23.0 (its own SSL transport behaves the same); the fixed "
             "program (one sleep(0) per iteration, the asyncio 263 workaround) sees "
             "ConnectionResetError at once; our kernels have no TLS",
    oracle="bug shown when at least half of the write+drain iterations completed after the "
           "peer's reset without an error; not measured when the peer did not reset",
    styles=("stream",), affects={"python": ("3.11.0", None)},
    affected_versions=("python==3.11.7", "python==3.12.1", "python==3.13.0"), fixed_versions=(),
    show_on=("asyncio-streams", "uvloop-streams"), real_only=_REAL_ONLY,
    minimum=(("iterations_after_reset_count", 1, "one write after the reset"),),
    verified="read the thread (the TL;DR: is_closing should match the inner transport) and PR "
             "118960's description; read is_closing() in the installed 3.6.15 to 3.13.0 "
             "sslproto.py (all return self._closed); measured on 3.11.7 only (the range "
             "check starts at 3.11, the sslproto rewrite the thread ran)"),
    _run_sendfail, [Metric("iterations_after_reset_count", "lower", "writes after the reset"),
                    Metric("peer_reset", None, "peer reset", unit="flag")],
    _presets({"iterations": 500, "max_s": 5}),
    {"stream": _sendfail_stream})


# ---------------------------------------------------------------------------
# uvloop 471: close() of an SSL transport leaves TCP open while the shutdown waits

def _linger_stream(job):
    p = job.params
    fixed = job.variant == "fixed"

    async def main(port, out):
        if _unsupported(port, out):
            return
        import asyncio
        pair = certificate()
        peer = TLSPeer(pair, "stream", max_s=p["bound_s"] + p["max_s"])
        peer.start()
        try:
            reader, writer = await asyncio.open_connection(*peer.addr, ssl=_client_context(pair[0]))
            await reader.readexactly(p["read_bytes"])      # part of a long response
            out["read_bytes"] = p["read_bytes"]
            closed_at = time.monotonic()
            writer.close()
            if fixed:
                writer.transport.abort()    # the workaround: do not wait for close_notify
            # Keep the loop running, as the thread's program did after closing.
            while peer.closed_at is None and time.monotonic() - closed_at < p["bound_s"]:
                await asyncio.sleep(0.02)
            open_s = None if peer.closed_at is None else peer.closed_at - closed_at
            out.update(tcp_open_after_close_s=open_s, still_open=peer.closed_at is None,
                       measured=True)
            writer.transport.abort()
        finally:
            peer.stop.set()
            peer.join(p["max_s"])
            out["peer_error"] = peer.error
    return _stream(job, main, p["bound_s"] + p["max_s"] + 2)


def _run_linger(ctx):
    p = ctx.params
    ran = run_program(ctx, max_s=p["bound_s"] + p["max_s"] + 4)
    a = ran.app
    shown = a.get("still_open") if a.get("measured") else None
    return ({"tcp_open_after_close_s": a.get("tcp_open_after_close_s"), "still_open": a.get("still_open"),
             "read_bytes": a.get("read_bytes")},
            {"bug_shown": shown}, _verdict_note(a))


_add(Entry(
    id="uvloop-471", aliases=("aiohttp-6762",),
    title="TLS: closing an SSL transport keeps the TCP connection open for 30 s",
    link="https://github.com/MagicStack/uvloop/issues/471",
    mechanism="close() on uvloop's SSL transport starts the TLS shutdown: it sends "
              "close_notify and waits for the peer's, up to ssl_shutdown_timeout (30 s), "
              "while it keeps reading. A server that keeps sending (a long download) never "
              "answers, so the TCP connection stays open and the download goes on for 30 s "
              "after aiohttp closed it.",
    reported="uvloop 0.16 with aiohttp 3.8 (2022; aiohttp issue 6762)",
    fixed_in="open in uvloop; aiohttp closed 6762 on its side. Python 3.11's asyncio took "
             "over uvloop's SSL implementation yet closes the TCP connection at once here "
             "(measured on 3.11.7, as the thread saw asyncio send its RST at once); "
             "transport.abort() after close() drops the connection at once on uvloop",
    framing="no HTTP: a TLS peer that streams 16 KiB chunks and never reads; the client "
            "reads 64 KiB and closes",
    expected="shown on the installed uvloop 0.23.0 (the asyncio side of the thread is the "
             "real one here: not shown on Python 3.11.7 asyncio, whose TCP closed within "
             "milliseconds, measured); not with abort(); our kernels have no TLS, so no option "
             "of theirs stands in",
    oracle="bug shown when the peer could still send bound_s after the client's close(); "
           "not measured when the program did not reach its close",
    styles=("stream",), affects={"uvloop": ("0.15.0", None)},
    affected_versions=("uvloop==0.16.0", "uvloop==0.21.0"), fixed_versions=(),
    show_on=("uvloop-streams",), not_on=("asyncio-streams",), real_only=_REAL_ONLY,
    minimum=(("read_bytes", 1, "part of the response read before the close"),),
    verified="read the thread (the 30 s measured there, uvloop's close() -> _start_shutdown "
             "with the shutdown timeout) and aiohttp 6762; read ssl_shutdown_timeout in the "
             "installed uvloop's sslproto.pyx; measured here"),
    _run_linger, [Metric("tcp_open_after_close_s", "lower", "TCP open after close"),
                  Metric("still_open", None, "still open at bound", unit="flag"),
                  Metric("read_bytes", None, "read before close")],
    _presets({"read_bytes": 64 * KiB, "bound_s": 1.5, "max_s": 4}),
    {"stream": _linger_stream})
