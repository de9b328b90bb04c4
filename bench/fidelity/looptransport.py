"""Loop-conformance probes of stream transports and protocols: reading paused around
EOF, write-buffer limits and flow control, the protocol's callbacks in their documented
order, ``BufferedProtocol``, ``connect_accepted_socket`` and when ``connection_lost``
comes, with what. The rules of ``bench.fidelity.loops`` hold here.
"""
from __future__ import annotations

import socket

from bench.fidelity.loops import _call, _raised, loop_probe
from bench.fidelity.promises import doc


def _recorder(a, events, keep_open):
    class Rec(a.Protocol):
        data_received = lambda self, data: events.append("data")  # noqa: E731
        eof_received = lambda self: events.append("eof") or keep_open  # noqa: E731
        connection_lost = lambda self, exc: events.append("lost")  # noqa: E731
    return Rec


async def _connect(a, proto):
    """A listener on 127.0.0.1 and a ``proto`` transport connected to it: (t, lsn)."""
    lsn = socket.create_server(("127.0.0.1", 0))
    t, _ = await a.get_running_loop().create_connection(proto, *lsn.getsockname())
    return t, lsn


async def _accepted(a, proto):
    """_connect(), and the listener's end of the connection: (t, peer, lsn)."""
    t, lsn = await _connect(a, proto)
    peer, _ = lsn.accept()
    return t, peer, lsn


# --- reading paused around EOF ---------------------------------------------------------

@loop_probe(promise=doc("protocol", "asyncio.ReadTransport.pause_reading",
                        "No data will be passed to the protocol's protocol.data_received() "
                        "method until resume_reading() is called."),
            twin_of=("cb_pause_resume_after_eof",))
async def lp_pause_reading_around_eof(a):
    """Data then EOF arrive while reading is paused: nothing until resume_reading()."""
    events = []
    t, peer, lsn = await _accepted(a, _recorder(a, events, True))
    t.pause_reading()
    peer.sendall(b"abc")
    peer.shutdown(socket.SHUT_WR)
    await a.sleep(0.05)
    paused = list(events)
    t.resume_reading()
    await a.sleep(0.05)
    t.close(), peer.close(), lsn.close()
    return {"while_paused": paused, "after": events}


@loop_probe(promise=doc("protocol", "asyncio.ReadTransport.is_reading",
                        "Return True if the transport is receiving new data."))
async def lp_is_reading_paused(a):
    """is_reading(): true when connected, false after pause_reading(), true after resume."""
    t, lsn = await _connect(a, a.Protocol)
    out = {"connected": _call(lambda: t.is_reading())}
    t.pause_reading()
    out["paused"] = _call(lambda: t.is_reading())
    t.resume_reading()
    out["resumed"] = _call(lambda: t.is_reading())
    t.close(), lsn.close()
    return out


@loop_probe(twin_of=("cb_is_reading_after_eof_kept_open",))
async def lp_is_reading_after_eof(a):
    """is_reading() after EOF with eof_received() returning True (the docs say only
    "receiving new data")."""
    events = []
    t, peer, lsn = await _accepted(a, _recorder(a, events, True))
    peer.shutdown(socket.SHUT_WR)
    await a.sleep(0.05)
    out = {"events": list(events), "is_reading": _call(lambda: t.is_reading()), "is_closing": _call(lambda: t.is_closing())}
    t.close(), peer.close(), lsn.close()
    return out


@loop_probe()
async def lp_resume_reading_after_eof(a):
    """resume_reading() after EOF with eof_received() returning True."""
    events = []
    t, peer, lsn = await _accepted(a, _recorder(a, events, True))
    peer.shutdown(socket.SHUT_WR)
    await a.sleep(0.05)
    out = {"resume": _call(lambda: t.resume_reading())}
    t.close(), peer.close(), lsn.close()
    return out


@loop_probe(promise=doc("protocol", "asyncio.ReadTransport.pause_reading",
                        "The method is idempotent, i.e. it can be called when the transport is "
                        "already paused or closed."))
async def lp_pause_reading_idempotent(a):
    """pause_reading() twice, then once after close() (3.7+: no-ops)."""
    t, lsn = await _connect(a, a.Protocol)
    out = {"first": _call(lambda: t.pause_reading()), "second": _call(lambda: t.pause_reading())}
    t.close()
    out["after_close"] = _call(lambda: t.pause_reading())
    await a.sleep(0.01)
    lsn.close()
    return out


@loop_probe(promise=doc("protocol", "asyncio.ReadTransport.resume_reading",
                        "The method is idempotent, i.e. it can be called when the transport is "
                        "already reading."))
async def lp_resume_reading_idempotent(a):
    """resume_reading() on a transport that is reading, twice."""
    t, lsn = await _connect(a, a.Protocol)
    out = {"first": _call(lambda: t.resume_reading()), "second": _call(lambda: t.resume_reading())}
    t.close(), lsn.close()
    return out


@loop_probe()
async def lp_resume_reading_after_close(a):
    """resume_reading() after close() (the docs call only pause_reading() safe then)."""
    t, lsn = await _connect(a, a.Protocol)
    t.pause_reading()
    t.close()
    out = {"resume": _call(lambda: t.resume_reading())}
    await a.sleep(0.01)
    lsn.close()
    return out


# --- write-buffer limits and flow control ----------------------------------------------

@loop_probe(twin_of=("cb_default_buffer_limits",))
async def lp_write_buffer_limits(a):
    """get_write_buffer_limits() by default ("The defaults are implementation-specific")."""
    t, lsn = await _connect(a, a.Protocol)
    out = {"default": _call(lambda: list(t.get_write_buffer_limits()))}
    t.close(), lsn.close()
    return out


@loop_probe()
async def lp_write_buffer_limits_set(a):
    """get_write_buffer_limits() after set_write_buffer_limits(high=1000), then low=10."""
    t, lsn = await _connect(a, a.Protocol)
    t.set_write_buffer_limits(high=1000)
    out = {"high_1000": _call(lambda: list(t.get_write_buffer_limits()))}
    t.set_write_buffer_limits(low=10)
    out["low_10"] = _call(lambda: list(t.get_write_buffer_limits()))
    t.close(), lsn.close()
    return out


@loop_probe(promise=doc("protocol", "asyncio.WriteTransport.set_write_buffer_limits",
                        "If only the high watermark is given, the low watermark defaults to an "
                        "implementation-specific value less than or equal to the high watermark."))
async def lp_write_buffer_limits_high_only(a):
    """set_write_buffer_limits(high=1000): low <= high."""
    t, lsn = await _connect(a, a.Protocol)
    t.set_write_buffer_limits(high=1000)
    low, high = t.get_write_buffer_limits()
    t.close(), lsn.close()
    return {"low_le_high": low <= high, "high": high}


@loop_probe(promise=doc("protocol", "asyncio.WriteTransport.set_write_buffer_limits",
                        "Setting high to zero forces low to zero as well, and causes "
                        "pause_writing() to be called whenever the buffer becomes non-empty."))
async def lp_write_buffer_limits_high_zero(a):
    """set_write_buffer_limits(high=0): the limits read (0, 0)."""
    t, lsn = await _connect(a, a.Protocol)
    out = {"set": _call(lambda: t.set_write_buffer_limits(high=0)),
           "limits": _call(lambda: list(t.get_write_buffer_limits()))}
    t.close(), lsn.close()
    return out


@loop_probe(promise=doc("protocol", "asyncio.BaseProtocol.pause_writing",
                        "Called when the transport's buffer goes over the high watermark."))
async def lp_pause_writing_above_high(a):
    """high=1000 and 1 MB written to a peer that does not read: pause_writing() called
    once, resume_writing() once the peer drains it."""
    events = []

    class P(a.Protocol):
        pause_writing = lambda self: events.append("pause")  # noqa: E731
        resume_writing = lambda self: events.append("resume")  # noqa: E731
    t, peer, lsn = await _accepted(a, P)
    t.set_write_buffer_limits(high=1000)
    t.write(b"x" * 1_000_000)
    await a.sleep(0.02)
    paused = list(events)
    peer.setblocking(False)
    for _ in range(400):
        try:
            peer.recv(1 << 22)
        except BlockingIOError:
            if "resume" in events:
                break
            await a.sleep(0.001)
    t.close(), peer.close(), lsn.close()
    return {"after_write": paused, "after_drain": events}


@loop_probe(twin_of=("cb_bad_buffer_limits",))
async def lp_bad_buffer_limits(a):
    """set_write_buffer_limits(high=10, low=20) and high=-1 (asyncio: ValueError)."""
    t, lsn = await _connect(a, a.Protocol)
    out = {"low_above_high": _call(lambda: t.set_write_buffer_limits(high=10, low=20)),
           "negative_high": _call(lambda: t.set_write_buffer_limits(high=-1))}
    t.close(), lsn.close()
    return out


# --- the protocol's callbacks ----------------------------------------------------------

@loop_probe(promise=doc("protocol", "asyncio.BaseProtocol.connection_made",
                        "The transport argument is the transport representing the connection."))
async def lp_connection_made_transport(a):
    """connection_made() gets the transport create_connection() returns, before it returns."""
    seen = []

    class P(a.Protocol):
        connection_made = lambda self, tr: seen.append(tr)  # noqa: E731
    t, lsn = await _connect(a, P)
    out = {"calls": len(seen), "same": bool(seen) and seen[0] is t}
    t.close(), lsn.close()
    return out


@loop_probe(promise=doc("protocol", "asyncio.Protocol.data_received",
                        "Called when some data is received. data is a non-empty bytes object "
                        "containing the incoming data."))
async def lp_data_received_type(a):
    """data_received()'s argument: its type, non-empty, and all of it arrives."""
    kinds, got = set(), []

    class P(a.Protocol):
        def data_received(self, data):
            kinds.add(type(data).__name__)
            got.append(bytes(data))
    t, peer, lsn = await _accepted(a, P)
    peer.sendall(b"x" * 100_000)
    await a.sleep(0.05)
    t.close(), peer.close(), lsn.close()
    return {"types": sorted(kinds), "empty_calls": sum(not g for g in got), "total": sum(map(len, got))}


@loop_probe(promise=doc("protocol", "connection-callbacks",
                        "start -> connection_made [-> data_received]* [-> eof_received]? -> "
                        "connection_lost -> end"))
async def lp_protocol_state_machine(a):
    """Data, EOF, then our close(): the callbacks in the documented order, each once."""
    events = []

    class P(_recorder(a, events, True)):
        connection_made = lambda self, tr: events.append("made")  # noqa: E731
    t, peer, lsn = await _accepted(a, P)
    peer.sendall(b"abc")
    peer.shutdown(socket.SHUT_WR)
    await a.sleep(0.05)
    t.close()
    await a.sleep(0.02)
    peer.close(), lsn.close()
    return {"events": [e for i, e in enumerate(events) if e != "data" or events[i - 1] != "data"]}


@loop_probe(promise=doc("protocol", "asyncio.Protocol.eof_received",
                        "This method may return a false value (including None), in which case "
                        "the transport will close itself."))
async def lp_eof_received_false_closes(a):
    """eof_received() returns None: the transport closes itself (events, is_closing)."""
    events = []
    t, peer, lsn = await _accepted(a, _recorder(a, events, None))
    peer.sendall(b"x")
    peer.shutdown(socket.SHUT_WR)
    await a.sleep(0.05)
    peer.close(), lsn.close()
    return {"events": events, "is_closing": _call(lambda: t.is_closing())}


@loop_probe()
async def lp_eof_received_true_keeps_open(a):
    """eof_received() returns True: the transport stays open and can still write."""
    events = []
    t, peer, lsn = await _accepted(a, _recorder(a, events, True))
    peer.shutdown(socket.SHUT_WR)
    await a.sleep(0.05)
    out = {"events": list(events), "is_closing": _call(lambda: t.is_closing()), "write": _call(lambda: t.write(b"ok"))}
    peer.settimeout(1)
    out["peer_got"] = peer.recv(10).decode()
    t.close(), peer.close(), lsn.close()
    return out


@loop_probe(promise=doc("protocol", "asyncio.BufferedProtocol.buffer_updated",
                        "Called when the buffer was updated with the received data."))
async def lp_buffered_protocol(a):
    """A BufferedProtocol gets 100 kB through get_buffer()/buffer_updated(), then EOF."""
    got, events = bytearray(), []

    class P(a.BufferedProtocol):
        buf = bytearray(65536)
        get_buffer = lambda self, hint: self.buf  # noqa: E731
        buffer_updated = lambda self, n: got.extend(self.buf[:n])  # noqa: E731
        eof_received = lambda self: events.append("eof")  # noqa: E731
    t, peer, lsn = await _accepted(a, P)
    peer.sendall(b"y" * 100_000)
    peer.shutdown(socket.SHUT_WR)
    await a.sleep(0.05)
    t.close(), peer.close(), lsn.close()
    return {"received": len(got), "events": events}


@loop_probe(promise=doc("eventloop", "asyncio.loop.connect_accepted_socket",
                        "Wrap an already accepted connection into a transport/protocol pair."))
async def lp_connect_accepted_socket(a):
    """connect_accepted_socket() on an accepted socket: a transport, and data flows."""
    lsn = socket.create_server(("127.0.0.1", 0))
    c = socket.create_connection(lsn.getsockname())
    conn, _ = lsn.accept()
    events = []
    try:
        t, _ = await a.get_running_loop().connect_accepted_socket(_recorder(a, events, None), conn)
    except Exception as exc:
        c.close(), conn.close(), lsn.close()
        return {"connect_accepted_socket": _raised(exc)}
    c.sendall(b"x")
    c.shutdown(socket.SHUT_WR)
    await a.sleep(0.05)
    t.close(), c.close(), lsn.close()
    return {"events": events}


# --- when connection_lost comes, and with what -------------------------------------------

def _lost_recorder(a, lost):
    class Rec(a.Protocol):
        connection_lost = lambda self, exc: lost.append(type(exc).__name__ if exc else None)  # noqa: E731
    return Rec


async def _lost_after(a, how):
    """close() or abort() (``how``) on a connected transport: what connection_lost() got."""
    lost = []
    t, lsn = await _connect(a, _lost_recorder(a, lost))
    getattr(t, how)()
    await a.sleep(0.02)
    lsn.close()
    return {"lost": lost}


@loop_probe(promise=doc("protocol", "asyncio.BaseTransport.close",
                        "After all buffered data is flushed, the protocol's protocol."
                        "connection_lost() method will be called with None as its argument."))
async def lp_connection_lost_after_close(a):
    """close(): connection_lost(None) is called, once."""
    return await _lost_after(a, "close")


@loop_probe(promise=doc("protocol", "asyncio.WriteTransport.abort",
                        "The protocol's protocol.connection_lost() method will eventually be "
                        "called with None as its argument."))
async def lp_connection_lost_after_abort(a):
    """abort(): connection_lost(None) is called, once."""
    return await _lost_after(a, "abort")


@loop_probe(twin_of=("cb_close_is_deferred", "cb_abort_with_buffer"))
async def lp_connection_lost_is_deferred(a):
    """close() and abort(): is connection_lost() called inside the call (CPython: later)?"""
    lsn, out = socket.create_server(("127.0.0.1", 0)), {}
    for how in ("close", "abort"):
        lost = []
        t, _ = await a.get_running_loop().create_connection(_lost_recorder(a, lost),
                                                             *lsn.getsockname())
        getattr(t, how)()
        out[f"inside_{how}"] = list(lost)
        await a.sleep(0.02)
    lsn.close()
    return out


@loop_probe(promise=doc("protocol", "asyncio.BaseProtocol.connection_lost",
                        "The argument is either an exception object or None. The latter means a "
                        "regular EOF is received, or the connection was aborted or closed by "
                        "this side of the connection."),
            twin_of=("cb_peer_reset_while_reading", "cb_peer_reset_while_buffered"))
async def lp_peer_reset_connection_lost(a):
    """The peer resets an idle connection: connection_lost() and with which exception."""
    lost = []
    t, peer, lsn = await _accepted(a, _lost_recorder(a, lost))
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
    peer.close()
    await a.sleep(0.1)
    t.close(), lsn.close()
    return {"lost": lost}


@loop_probe(promise=doc("protocol", "asyncio.BaseProtocol.connection_lost",
                        "The argument is either an exception object or None. The latter means a "
                        "regular EOF is received, or the connection was aborted or closed by "
                        "this side of the connection."))
async def lp_write_to_closed_peer(a):
    """Writes to a peer that has closed its socket: connection_lost()'s exception."""
    lost = []
    t, peer, lsn = await _accepted(a, _lost_recorder(a, lost))
    peer.close()
    for _ in range(20):
        if not t.is_closing():
            t.write(b"x" * 10_000)
        await a.sleep(0.01)
    lsn.close()
    return {"lost": lost}
