"""Loop-conformance probes of the low-level socket API: ``sock_*`` calls on stream and
datagram sockets, what cancelling one leaves behind (the data, the socket, the reader
registration), and ``add_reader``/``add_writer``. The rules of ``bench.fidelity.loops``
hold here.
"""
from __future__ import annotations

import os
import socket
import tempfile
import time

from bench.fidelity.loops import _call, _raised, _wait, loop_probe
from bench.fidelity.promises import doc


def _pair():
    s1, s2 = socket.socketpair()
    s1.setblocking(False), s2.setblocking(False)
    return s1, s2


# --- sock_* on stream sockets ----------------------------------------------------------

@loop_probe(promise=doc("eventloop", "asyncio.loop.sock_recv",
                        "Receive up to nbytes from sock. Asynchronous version of socket.recv()."))
async def lp_sock_recv(a):
    """sock_recv() returns the bytes already there, at most nbytes."""
    s1, s2 = _pair()
    s2.sendall(b"hello world")
    out = {"recv": await _wait(a, a.get_running_loop().sock_recv(s1, 5))}
    s1.close(), s2.close()
    return out


@loop_probe()
async def lp_sock_recv_eof(a):
    """sock_recv() after the peer closed: b'' (as socket.recv())."""
    s1, s2 = _pair()
    s2.close()
    out = {"recv": await _wait(a, a.get_running_loop().sock_recv(s1, 10))}
    s1.close()
    return out


@loop_probe(promise=doc("eventloop", "asyncio.loop.sock_sendall",
                        "This method continues to send to the socket until either all data in "
                        "data has been sent or an error occurs. None is returned on success."))
async def lp_sock_sendall_and_recv(a):
    """sock_sendall() of 1 MB returns None; sock_recv() reads it all until the peer closes."""
    loop = a.get_running_loop()
    s1, s2 = _pair()

    async def send():
        r = await loop.sock_sendall(s1, b"x" * 1_000_000)
        s1.close()
        return r
    task, got = a.create_task(send()), 0
    while chunk := await a.wait_for(loop.sock_recv(s2, 65536), 1):
        got += len(chunk)
    out = {"sendall": await _wait(a, task), "received": got}
    s2.close()
    return out


@loop_probe(promise=doc("eventloop", "asyncio.loop.sock_recv_into",
                        "Return the number of bytes written to the buffer."))
async def lp_sock_recv_into(a):
    """sock_recv_into() fills the buffer and returns the count."""
    s1, s2 = _pair()
    s2.sendall(b"hello")
    buf = bytearray(10)
    out = {"n": await _wait(a, a.get_running_loop().sock_recv_into(s1, buf))}
    s1.close(), s2.close()
    return {**out, "data": bytes(buf[:5]).decode()}


@loop_probe()
async def lp_sock_connect_refused(a):
    """sock_connect() to a port nobody listens on."""
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    addr = free.getsockname()
    free.close()
    s = socket.socket()
    s.setblocking(False)
    out = {"connect": await _wait(a, a.get_running_loop().sock_connect(s, addr))}
    s.close()
    return out


@loop_probe(promise=doc("eventloop", "asyncio.loop.sock_connect",
                        "Connect sock to a remote socket at address."))
async def lp_sock_connect(a):
    """sock_connect() to a listener: returns None, and the peer name is the listener's."""
    lsn = socket.create_server(("127.0.0.1", 0))
    s = socket.socket()
    s.setblocking(False)
    out = {"connect": await _wait(a, a.get_running_loop().sock_connect(s, lsn.getsockname()))}
    out["peer_ok"] = _call(lambda: s.getpeername() == lsn.getsockname())
    s.close(), lsn.close()
    return out


@loop_probe(promise=doc("eventloop", "asyncio.loop.sock_accept",
                        "The return value is a pair (conn, address) where conn is a new socket "
                        "object usable to send and receive data on the connection, and address "
                        "is the address bound to the socket on the other end of the connection."))
async def lp_sock_accept(a):
    """sock_accept(): a new socket and the client's address."""
    lsn = socket.create_server(("127.0.0.1", 0))
    lsn.setblocking(False)
    c = socket.create_connection(lsn.getsockname())
    conn, addr = await a.wait_for(a.get_running_loop().sock_accept(lsn), 1)
    out = {"addr_is_client": addr == c.getsockname(), "new_socket": conn is not lsn}
    conn.close(), c.close(), lsn.close()
    return out


@loop_probe()
async def lp_sock_accept_blocking_mode(a):
    """sock_accept(): the accepted socket's blocking mode (not documented)."""
    lsn = socket.create_server(("127.0.0.1", 0))
    lsn.setblocking(False)
    c = socket.create_connection(lsn.getsockname())
    conn, _ = await a.wait_for(a.get_running_loop().sock_accept(lsn), 1)
    out = {"blocking": conn.getblocking()}
    conn.close(), c.close(), lsn.close()
    return out


@loop_probe()
async def lp_sock_sendall_to_reset_peer(a):
    """sock_sendall() to a peer that has reset the connection, three times."""
    lsn = socket.create_server(("127.0.0.1", 0))
    s = socket.create_connection(lsn.getsockname())
    peer, _ = lsn.accept()
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
    peer.close()
    s.setblocking(False)
    time.sleep(0.02)
    out = {}
    for i in range(3):
        out[f"sendall{i}"] = await _wait(a, a.get_running_loop().sock_sendall(s, b"x" * 100_000))
    s.close(), lsn.close()
    return out


@loop_probe()
async def lp_sock_recv_closed_socket(a):
    """sock_recv() on a socket already closed."""
    s1, s2 = _pair()
    s1.close()
    out = {"recv": await _wait(a, a.get_running_loop().sock_recv(s1, 10))}
    s2.close()
    return out


@loop_probe()
async def lp_sock_recv_transport_socket(a):
    """sock_recv() on the socket a transport is using."""
    lsn = socket.create_server(("127.0.0.1", 0))
    t, _ = await a.get_running_loop().create_connection(a.Protocol, *lsn.getsockname())
    same_fd = socket.socket(fileno=t.get_extra_info("socket").fileno())
    out = {"recv": await _wait(a, a.get_running_loop().sock_recv(same_fd, 10), 0.2)}
    same_fd.detach()
    t.close(), lsn.close()
    return out


@loop_probe(promise=doc("eventloop", "asyncio.loop.sock_sendfile",
                        "Send a file using high-performance os.sendfile if possible. Return the "
                        "total number of bytes sent."))
async def lp_sock_sendfile(a):
    """sock_sendfile() of a 100 kB file: the count returned and the bytes the peer reads."""
    loop, (s1, s2) = a.get_running_loop(), _pair()

    async def read_all():
        got = 0
        while chunk := await loop.sock_recv(s2, 1 << 16):
            got += len(chunk)
        return got
    reader = a.ensure_future(read_all())
    with tempfile.TemporaryFile() as f:
        f.write(b"z" * 100_000)
        f.seek(0)
        out = {"sent": await _wait(a, loop.sock_sendfile(s1, f), 2)}
    s1.close()
    out["received"] = await _wait(a, reader)
    s2.close()
    return out


@loop_probe(promise=doc("eventloop", "asyncio.loop.sock_recv",
                        "Even though this method was always documented as a coroutine method, "
                        "releases before Python 3.7 returned a Future. Since Python 3.7 this is "
                        "an async def method."))
async def lp_sock_recv_is_coroutine(a):
    """sock_recv() and sock_sendall() return coroutines (async def since 3.7)."""
    loop, (s1, s2) = a.get_running_loop(), _pair()
    out = {}
    for name, aw in (("sock_recv", loop.sock_recv(s1, 1)), ("sock_sendall", loop.sock_sendall(s1, b"x"))):
        out[name] = a.iscoroutine(aw)
        await _wait(a, aw, 0.1)
    s1.close(), s2.close()
    return out


@loop_probe()
async def lp_sock_accept_is_coroutine(a):
    """sock_connect() and sock_accept() return coroutines (documented as coroutine methods)."""
    loop = a.get_running_loop()
    lsn = socket.create_server(("127.0.0.1", 0))
    lsn.setblocking(False)
    s = socket.socket()
    s.setblocking(False)
    connect = loop.sock_connect(s, lsn.getsockname())
    out = {"sock_connect": a.iscoroutine(connect)}
    await _wait(a, connect, 0.5)
    accept = loop.sock_accept(lsn)
    out["sock_accept"] = a.iscoroutine(accept)
    try:
        conn, _ = await a.wait_for(accept, 0.5)
        conn.close()
    except Exception:
        pass
    s.close(), lsn.close()
    return out


# --- sock_* on datagram sockets (3.11) ------------------------------------------------------

def _udp():
    s, peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM), socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0)), peer.bind(("127.0.0.1", 0))
    s.setblocking(False)
    return s, peer


@loop_probe(promise=doc("eventloop", "asyncio.loop.sock_recvfrom",
                        "Return a tuple of (received data, remote address)."))
async def lp_sock_recvfrom(a):
    """sock_recvfrom() of one datagram: the data and the sender's address."""
    s, peer = _udp()
    peer.sendto(b"dgram", s.getsockname())
    try:
        data, addr = await a.wait_for(a.get_running_loop().sock_recvfrom(s, 100), 1)
        out = {"data": data.decode(), "from_peer": addr == peer.getsockname()}
    except Exception as exc:
        out = {"recvfrom": _raised(exc)}
    s.close(), peer.close()
    return out


@loop_probe(promise=doc("eventloop", "asyncio.loop.sock_recvfrom_into",
                        "Return a tuple of (number of bytes received, remote address)."))
async def lp_sock_recvfrom_into(a):
    """sock_recvfrom_into() of one datagram: the count and the sender's address."""
    s, peer = _udp()
    peer.sendto(b"dgram", s.getsockname())
    buf = bytearray(100)
    try:
        n, addr = await a.wait_for(a.get_running_loop().sock_recvfrom_into(s, buf), 1)
        out = {"n": n, "data": bytes(buf[:n]).decode(), "from_peer": addr == peer.getsockname()}
    except Exception as exc:
        out = {"recvfrom_into": _raised(exc)}
    s.close(), peer.close()
    return out


@loop_probe(promise=doc("eventloop", "asyncio.loop.sock_sendto",
                        "Return the number of bytes sent."))
async def lp_sock_sendto(a):
    """sock_sendto(): the count returned, and the datagram arrives."""
    s, peer = _udp()
    out = {"sendto": await _wait(a, a.get_running_loop().sock_sendto(s, b"hello", peer.getsockname()))}
    peer.settimeout(0.5)
    out["peer_got"] = _call(lambda: peer.recv(100))
    s.close(), peer.close()
    return out


# --- cancellation ----------------------------------------------------------------------

@loop_probe(promise=doc("eventloop", "asyncio.loop.sock_recv",
                        "Receive up to nbytes from sock. Asynchronous version of socket.recv()."))
async def lp_sock_recv_cancel_keeps_data(a):
    """A sock_recv() cancelled while waiting: the bytes sent after go to the next call."""
    loop = a.get_running_loop()
    s1, s2 = _pair()
    t = a.ensure_future(loop.sock_recv(s1, 10))
    await a.sleep(0.01)
    t.cancel()
    await a.gather(t, return_exceptions=True)
    s2.sendall(b"ab")
    out = {"cancelled": t.cancelled(), "next": await _wait(a, loop.sock_recv(s1, 10))}
    s1.close(), s2.close()
    return out


@loop_probe()
async def lp_sock_recv_cancel_as_data_arrives(a):
    """Data arrives, and the waiting sock_recv() is cancelled before the loop runs it: is
    the data lost, or there for the next call (a race that hangs some loops)?"""
    loop = a.get_running_loop()
    s1, s2 = _pair()
    t = a.ensure_future(loop.sock_recv(s1, 10))
    await a.sleep(0.01)
    s2.sendall(b"ab")
    time.sleep(0.01)          # readable now, before the loop polls again
    t.cancel()
    await a.gather(t, return_exceptions=True)
    out = {"task": "cancelled" if t.cancelled() else _call(lambda: t.result()),
           "next": await _wait(a, loop.sock_recv(s1, 10), 0.3)}
    s1.close(), s2.close()
    return out


@loop_probe()
async def lp_sock_recv_into_cancel_keeps_data(a):
    """A sock_recv_into() cancelled while waiting: the next call gets the bytes."""
    loop = a.get_running_loop()
    s1, s2 = _pair()
    buf = bytearray(10)
    t = a.ensure_future(loop.sock_recv_into(s1, buf))
    await a.sleep(0.01)
    t.cancel()
    await a.gather(t, return_exceptions=True)
    s2.sendall(b"cd")
    out = {"next": await _wait(a, loop.sock_recv_into(s1, buf)), "data": bytes(buf[:2]).decode()}
    s1.close(), s2.close()
    return out


@loop_probe()
async def lp_sock_recv_timeout_then_read(a):
    """wait_for(sock_recv(), 0.05) times out; the bytes sent after reach the next call."""
    loop = a.get_running_loop()
    s1, s2 = _pair()
    first = await _wait(a, loop.sock_recv(s1, 10), 0.05)
    s2.sendall(b"late")
    out = {"first": first, "next": await _wait(a, loop.sock_recv(s1, 10))}
    s1.close(), s2.close()
    return out


@loop_probe()
async def lp_sock_recv_two_waiters(a):
    """Two sock_recv() waiting on one socket, then one send: which call gets the bytes?"""
    loop = a.get_running_loop()
    s1, s2 = _pair()
    t1, t2 = a.ensure_future(loop.sock_recv(s1, 10)), a.ensure_future(loop.sock_recv(s1, 10))
    await a.sleep(0.01)
    s2.sendall(b"one")
    await a.sleep(0.05)
    out = {"first": _call(lambda: t1.result()) if t1.done() else "waiting",
           "second": _call(lambda: t2.result()) if t2.done() else "waiting"}
    t1.cancel(), t2.cancel()
    await a.gather(t1, t2, return_exceptions=True)
    s1.close(), s2.close()
    return out


@loop_probe()
async def lp_sock_sendall_cancel(a):
    """sock_sendall() of 8 MB to a peer that does not read, cancelled: the task ends
    cancelled, and a later sock_sendall() on the socket still works."""
    loop = a.get_running_loop()
    s1, s2 = _pair()
    t = a.ensure_future(loop.sock_sendall(s1, b"x" * 8_000_000))
    await a.sleep(0.02)
    t.cancel()
    await a.gather(t, return_exceptions=True)
    drained = 0
    while True:
        try:
            drained += len(s2.recv(1 << 20))
        except BlockingIOError:
            break
    out = {"cancelled": t.cancelled(), "partial": 0 < drained < 8_000_000,
           "later_sendall": await _wait(a, loop.sock_sendall(s1, b"y"))}
    s1.close(), s2.close()
    return out


@loop_probe()
async def lp_sock_accept_cancel_keeps_connection(a):
    """A sock_accept() cancelled while waiting: a client that connects after is accepted
    by the next call."""
    loop = a.get_running_loop()
    lsn = socket.create_server(("127.0.0.1", 0))
    lsn.setblocking(False)
    t = a.ensure_future(loop.sock_accept(lsn))
    await a.sleep(0.01)
    t.cancel()
    await a.gather(t, return_exceptions=True)
    c = socket.create_connection(lsn.getsockname())
    try:
        conn, _ = await a.wait_for(loop.sock_accept(lsn), 1)
        out, _ = {"next": "accepted"}, conn.close()
    except Exception as exc:
        out = {"next": _raised(exc)}
    c.close(), lsn.close()
    return {"cancelled": t.cancelled(), **out}


@loop_probe()
async def lp_sock_connect_cancel(a):
    """A sock_connect() cancelled before it runs: the task ends cancelled."""
    lsn = socket.create_server(("127.0.0.1", 0))
    s = socket.socket()
    s.setblocking(False)
    t = a.ensure_future(a.get_running_loop().sock_connect(s, lsn.getsockname()))
    t.cancel()
    await a.gather(t, return_exceptions=True)
    out = {"cancelled": t.cancelled()}
    s.close(), lsn.close()
    return out


@loop_probe()
async def lp_sock_recvfrom_cancel_keeps_datagram(a):
    """A sock_recvfrom() cancelled while waiting: a datagram sent after reaches the next call."""
    loop = a.get_running_loop()
    s, peer = _udp()
    t = a.ensure_future(loop.sock_recvfrom(s, 100))
    await a.sleep(0.01)
    t.cancel()
    await a.gather(t, return_exceptions=True)
    peer.sendto(b"after", s.getsockname())
    try:
        data, _ = await a.wait_for(loop.sock_recvfrom(s, 100), 1)
        out = {"next": data.decode()}
    except Exception as exc:
        out = {"next": _raised(exc)}
    s.close(), peer.close()
    return out


# --- add_reader and add_writer ---------------------------------------------------------

@loop_probe(promise=doc("eventloop", "asyncio.loop.add_reader",
                        "Start monitoring the fd file descriptor for read availability and "
                        "invoke callback with the specified arguments once fd is available for "
                        "reading."))
async def lp_add_reader_callback(a):
    """add_reader(fd, cb, 'arg'): cb runs with its argument once data is there."""
    loop, seen = a.get_running_loop(), []
    s1, s2 = _pair()
    loop.add_reader(s1.fileno(), lambda arg: seen.append(arg) or s1.recv(10), "arg")
    s2.sendall(b"x")
    await a.sleep(0.02)
    loop.remove_reader(s1.fileno())
    s1.close(), s2.close()
    return {"calls": seen[:1]}


@loop_probe(promise=doc("eventloop", "asyncio.loop.remove_reader",
                        "Stop monitoring the fd file descriptor for read availability. Returns "
                        "True if fd was previously being monitored for reads."))
async def lp_remove_reader_returns(a):
    """remove_reader(): True for a watched fd, False the second time."""
    loop = a.get_running_loop()
    s1, s2 = _pair()
    loop.add_reader(s1.fileno(), int)
    out = {"first": _call(lambda: loop.remove_reader(s1.fileno())), "second": _call(lambda: loop.remove_reader(s1.fileno()))}
    s1.close(), s2.close()
    return out


@loop_probe(promise=doc("eventloop", "asyncio.loop.remove_writer",
                        "Stop monitoring the fd file descriptor for write availability. Returns "
                        "True if fd was previously being monitored for writes."))
async def lp_remove_writer_returns(a):
    """remove_writer(): True for a watched fd, False the second time."""
    loop = a.get_running_loop()
    s1, s2 = _pair()
    loop.add_writer(s1.fileno(), int)
    out = {"first": _call(lambda: loop.remove_writer(s1.fileno())), "second": _call(lambda: loop.remove_writer(s1.fileno()))}
    s1.close(), s2.close()
    return out


@loop_probe()
async def lp_add_writer_fires_once_writable(a):
    """add_writer() on a writable socket: the callback runs (level-triggered: again until
    removed)."""
    loop, calls = a.get_running_loop(), []
    s1, s2 = _pair()
    loop.add_writer(s1.fileno(), calls.append, 1)
    await a.sleep(0.01)
    loop.remove_writer(s1.fileno())
    s1.close(), s2.close()
    return {"called": len(calls) > 0, "again": len(calls) > 1}


@loop_probe()
async def lp_add_reader_replaces(a):
    """add_reader() twice on one fd: only the second callback runs."""
    loop, seen = a.get_running_loop(), []
    s1, s2 = _pair()
    loop.add_reader(s1.fileno(), seen.append, "first")
    loop.add_reader(s1.fileno(), lambda: seen.append("second") or s1.recv(10))
    s2.sendall(b"x")
    await a.sleep(0.02)
    loop.remove_reader(s1.fileno())
    s1.close(), s2.close()
    return {"ran": sorted(set(seen))}


@loop_probe()
async def lp_remove_reader_before_callback(a):
    """Data is ready and remove_reader() is called before the loop polls: the callback
    never runs."""
    loop, seen = a.get_running_loop(), []
    s1, s2 = _pair()
    loop.add_reader(s1.fileno(), seen.append, 1)
    s2.sendall(b"x")
    loop.remove_reader(s1.fileno())
    await a.sleep(0.02)
    s1.close(), s2.close()
    return {"ran": seen}


@loop_probe()
async def lp_add_reader_transport_fd(a):
    """add_reader() on the fd of a socket a transport is using."""
    lsn = socket.create_server(("127.0.0.1", 0))
    t, _ = await a.get_running_loop().create_connection(a.Protocol, *lsn.getsockname())
    out = {"add_reader": _call(lambda: a.get_running_loop().add_reader(t.get_extra_info("socket").fileno(), int))}
    t.close(), lsn.close()
    return out


@loop_probe()
async def lp_add_reader_pipe(a):
    """add_reader() on the read end of an os.pipe(): the callback runs once written."""
    loop, seen = a.get_running_loop(), []
    r, w = os.pipe()
    loop.add_reader(r, lambda: seen.append(os.read(r, 10).decode()))
    os.write(w, b"p")
    await a.sleep(0.02)
    loop.remove_reader(r)
    os.close(r), os.close(w)
    return {"read": seen}
