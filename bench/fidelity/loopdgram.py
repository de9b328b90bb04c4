"""Loop-conformance probes of datagram endpoints (``create_datagram_endpoint``):
receiving and sending, connected endpoints, ``error_received``, closing and aborting,
the arguments it refuses, and the zero-length datagram 3.13 allows. The peer is a plain
UDP socket on 127.0.0.1. The rules of ``bench.fidelity.loops`` hold here.
"""
from __future__ import annotations

import socket

from bench.fidelity.loops import _call, _raised, loop_probe
from bench.fidelity.promises import doc


def _dgram(a, events):
    class P(a.DatagramProtocol):
        connection_made = lambda self, t: events.append("made")  # noqa: E731
        datagram_received = lambda self, data, addr: events.append(["data", type(data).__name__, data.decode("latin-1"), addr])  # noqa: E731
        error_received = lambda self, exc: events.append(["error", type(exc).__name__])  # noqa: E731
        connection_lost = lambda self, exc: events.append(["lost", type(exc).__name__ if exc else None])  # noqa: E731
    return P


def _udp_peer():
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    peer.bind(("127.0.0.1", 0))
    peer.settimeout(1)
    return peer


@loop_probe(promise=doc("protocol", "asyncio.DatagramProtocol.datagram_received",
                        "Called when a datagram is received. data is a bytes object containing "
                        "the incoming data. addr is the address of the peer sending the data; "
                        "the exact format depends on the transport."))
async def lp_dgram_received(a):
    """A datagram from a peer: datagram_received(data, addr) with the peer's address."""
    events, peer = [], _udp_peer()
    t, _ = await a.get_running_loop().create_datagram_endpoint(
        _dgram(a, events), local_addr=("127.0.0.1", 0))
    peer.sendto(b"ping", t.get_extra_info("sockname"))
    await a.sleep(0.05)
    data = [e for e in events if e[0] == "data"]
    out = {"first_event": events[:1], "data": data[0][1:3] if data else None,
           "from_peer": bool(data) and data[0][3] == peer.getsockname()}
    t.close(), peer.close()
    return out


@loop_probe(promise=doc("protocol", "asyncio.DatagramTransport.sendto",
                        "Send the data bytes to the remote peer given by addr (a "
                        "transport-dependent target address)."))
async def lp_dgram_sendto(a):
    """transport.sendto(data, addr): the peer receives it."""
    events, peer = [], _udp_peer()
    t, _ = await a.get_running_loop().create_datagram_endpoint(
        _dgram(a, events), local_addr=("127.0.0.1", 0))
    out = {"sendto": _call(lambda: t.sendto(b"hello", peer.getsockname()))}
    await a.sleep(0.02)
    out["peer_got"] = _call(lambda: peer.recv(100))
    t.close(), peer.close()
    return out


@loop_probe(promise=doc("protocol", "asyncio.DatagramTransport.sendto",
                        "If addr is None, the data is sent to the target address given on "
                        "transport creation."))
async def lp_dgram_connected_sendto(a):
    """remote_addr given: sendto(data) without an address reaches that peer."""
    events, peer = [], _udp_peer()
    t, _ = await a.get_running_loop().create_datagram_endpoint(
        _dgram(a, events), remote_addr=peer.getsockname())
    out = {"sendto": _call(lambda: t.sendto(b"to-default"))}
    await a.sleep(0.02)
    out["peer_got"] = _call(lambda: peer.recv(100))
    t.close(), peer.close()
    return out


@loop_probe()
async def lp_dgram_connected_sendto_other_addr(a):
    """remote_addr given: sendto(data, another address)."""
    events, peer, other = [], _udp_peer(), _udp_peer()
    t, _ = await a.get_running_loop().create_datagram_endpoint(
        _dgram(a, events), remote_addr=peer.getsockname())
    out = {"sendto": _call(lambda: t.sendto(b"x", other.getsockname()))}
    await a.sleep(0.01)
    t.close(), peer.close(), other.close()
    return out


@loop_probe()
async def lp_dgram_unconnected_sendto_no_addr(a):
    """No remote_addr: sendto(data) without an address."""
    events = []
    t, _ = await a.get_running_loop().create_datagram_endpoint(
        _dgram(a, events), local_addr=("127.0.0.1", 0))
    out = {"sendto": _call(lambda: t.sendto(b"x"))}
    await a.sleep(0.02)
    t.close()
    await a.sleep(0.01)
    return {**out, "events": [e for e in events if e != "made"]}


@loop_probe(promise=doc("protocol", "asyncio.DatagramProtocol.error_received",
                        "Called when a previous send or receive operation raises an OSError. "
                        "exc is the OSError instance."))
async def lp_dgram_error_received(a):
    """Connected to a closed port: the ICMP error reaches error_received() as an OSError."""
    events, closed = [], _udp_peer()
    addr = closed.getsockname()
    closed.close()
    t, _ = await a.get_running_loop().create_datagram_endpoint(_dgram(a, events), remote_addr=addr)
    sent = []
    for _ in range(3):
        sent.append(_call(lambda: t.sendto(b"x")))
        await a.sleep(0.02)
    t.close()
    await a.sleep(0.01)
    errors = [e[1] for e in events if e[0] == "error"]
    return {"error_received": sorted(set(errors)), "lost": [e for e in events if e[0] == "lost"],
            "sendto": sent}


@loop_probe(promise=doc("eventloop", "asyncio.loop.create_datagram_endpoint",
                        "A tuple of (transport, protocol) is returned on success."))
async def lp_dgram_endpoint_pair(a):
    """create_datagram_endpoint(): (transport, protocol), connection_made() called with it."""
    events = []
    t, p = await a.get_running_loop().create_datagram_endpoint(
        _dgram(a, events), local_addr=("127.0.0.1", 0))
    out = {"protocol_from_factory": isinstance(p, a.DatagramProtocol), "made": events[:1],
           "has_sendto": callable(getattr(t, "sendto", None))}
    t.close()
    return out


@loop_probe()
async def lp_dgram_transport_class(a):
    """The datagram transport is an asyncio.DatagramTransport (CPython's is)."""
    t, _ = await a.get_running_loop().create_datagram_endpoint(
        a.DatagramProtocol, local_addr=("127.0.0.1", 0))
    out = {"is_datagram_transport": isinstance(t, a.DatagramTransport), "is_base_transport": isinstance(t, a.BaseTransport)}
    t.close()
    return out


@loop_probe(promise=doc("protocol", "asyncio.BaseTransport.close",
                        "After all buffered data is flushed, the protocol's protocol."
                        "connection_lost() method will be called with None as its argument."))
async def lp_dgram_close(a):
    """close(): connection_lost(None), later; is_closing() right after."""
    events = []
    t, _ = await a.get_running_loop().create_datagram_endpoint(
        _dgram(a, events), local_addr=("127.0.0.1", 0))
    t.close()
    out = {"is_closing": _call(lambda: t.is_closing()), "inside": [e for e in events if e != "made"]}
    await a.sleep(0.02)
    return {**out, "later": [e for e in events if e != "made"]}


@loop_probe(promise=doc("protocol", "asyncio.DatagramTransport.abort",
                        "The protocol's protocol.connection_lost() method will eventually be "
                        "called with None as its argument."))
async def lp_dgram_abort(a):
    """abort(): connection_lost(None)."""
    events = []
    t, _ = await a.get_running_loop().create_datagram_endpoint(
        _dgram(a, events), local_addr=("127.0.0.1", 0))
    t.abort()
    await a.sleep(0.02)
    return {"events": [e for e in events if e != "made"]}


@loop_probe()
async def lp_dgram_sendto_after_close(a):
    """sendto() after close()."""
    events, peer = [], _udp_peer()
    t, _ = await a.get_running_loop().create_datagram_endpoint(
        _dgram(a, events), local_addr=("127.0.0.1", 0))
    t.close()
    out = {"sendto": _call(lambda: t.sendto(b"x", peer.getsockname()))}
    await a.sleep(0.02)
    peer.close()
    return out


@loop_probe(promise=doc("protocol", "asyncio.DatagramTransport.sendto",
                        "This method can be called with an empty bytes object to send a "
                        "zero-length datagram.", since="3.13"))
async def lp_dgram_sendto_empty(a):
    """sendto(b''): does the peer receive a zero-length datagram (3.13)?"""
    events, peer = [], _udp_peer()
    t, _ = await a.get_running_loop().create_datagram_endpoint(
        _dgram(a, events), local_addr=("127.0.0.1", 0))
    out = {"sendto": _call(lambda: t.sendto(b"", peer.getsockname()))}
    await a.sleep(0.02)
    peer.settimeout(0.2)
    out["peer_got"] = _call(lambda: peer.recv(100))
    t.close(), peer.close()
    return out


@loop_probe()
async def lp_dgram_sendto_too_large(a):
    """sendto() of 70,000 bytes (over the UDP limit): raised, or error_received()?"""
    events, peer = [], _udp_peer()
    t, _ = await a.get_running_loop().create_datagram_endpoint(
        _dgram(a, events), local_addr=("127.0.0.1", 0))
    out = {"sendto": _call(lambda: t.sendto(b"x" * 70_000, peer.getsockname()))}
    await a.sleep(0.02)
    t.close(), peer.close()
    await a.sleep(0.01)
    return {**out, "errors": [e[1] for e in events if e[0] == "error"],
            "lost": [e[1] for e in events if e[0] == "lost"]}


@loop_probe()
async def lp_dgram_write_buffer_size(a):
    """get_write_buffer_size() after a sendto() that went out at once."""
    events, peer = [], _udp_peer()
    t, _ = await a.get_running_loop().create_datagram_endpoint(
        _dgram(a, events), local_addr=("127.0.0.1", 0))
    t.sendto(b"x", peer.getsockname())
    out = {"size": _call(lambda: t.get_write_buffer_size())}
    t.close(), peer.close()
    return out


@loop_probe(promise=doc("eventloop", "asyncio.loop.create_datagram_endpoint",
                        "sock can optionally be specified in order to use a preexisting, already "
                        "connected, socket.socket object to be used by the transport."))
async def lp_dgram_given_socket(a):
    """create_datagram_endpoint(sock=) with a bound, connected UDP socket: data flows."""
    events, peer = [], _udp_peer()
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    s.connect(peer.getsockname())
    s.setblocking(False)
    t, _ = await a.get_running_loop().create_datagram_endpoint(_dgram(a, events), sock=s)
    out = {"sendto": _call(lambda: t.sendto(b"via-sock"))}
    await a.sleep(0.02)
    out.update(peer_got=_call(lambda: peer.recv(100)), same_socket=t.get_extra_info("socket").fileno() == s.fileno())
    t.close(), peer.close()
    return out


@loop_probe()
async def lp_dgram_sock_with_addr(a):
    """create_datagram_endpoint(sock=..., local_addr=...) together."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setblocking(False)
    try:
        t, _ = await a.get_running_loop().create_datagram_endpoint(
            a.DatagramProtocol, sock=s, local_addr=("127.0.0.1", 0))
        t.close()
        out = "created"
    except Exception as exc:
        out = _raised(exc)
    s.close()
    return {"create": out}


@loop_probe(promise=doc("eventloop", "asyncio.loop.create_datagram_endpoint",
                        "Explicitly passing reuse_address=True will raise an exception."))
async def lp_dgram_reuse_address(a):
    """create_datagram_endpoint(reuse_address=True) (removed in 3.11)."""
    try:
        t, _ = await a.get_running_loop().create_datagram_endpoint(
            a.DatagramProtocol, local_addr=("127.0.0.1", 0), reuse_address=True)
        t.close()
        return {"refused": False}
    except Exception as exc:     # the docs promise an exception, not which one
        return {"refused": True, "message": f"{type(exc).__name__}: {exc}"[:120]}


@loop_probe(promise=doc("eventloop", "asyncio.loop.create_datagram_endpoint",
                        "allow_broadcast tells the kernel to allow this endpoint to send "
                        "messages to the broadcast address."))
async def lp_dgram_allow_broadcast(a):
    """allow_broadcast=True: the socket has SO_BROADCAST set."""
    t, _ = await a.get_running_loop().create_datagram_endpoint(
        a.DatagramProtocol, local_addr=("127.0.0.1", 0), allow_broadcast=True)
    out = {"so_broadcast": t.get_extra_info("socket").getsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST) != 0}
    t.close()
    return out


@loop_probe()
async def lp_dgram_no_address(a):
    """create_datagram_endpoint() with no address, family or socket."""
    try:
        t, _ = await a.get_running_loop().create_datagram_endpoint(a.DatagramProtocol)
        t.close()
        return {"create": "created"}
    except Exception as exc:
        return {"create": _raised(exc)}


@loop_probe(promise=doc("protocol", "asyncio.BaseTransport.get_extra_info",
                        "Return information about the transport or underlying resources it uses."))
async def lp_dgram_extra_info(a):
    """A connected endpoint's extra info: peername is the peer, sockname is 127.0.0.1."""
    peer = _udp_peer()
    t, _ = await a.get_running_loop().create_datagram_endpoint(
        a.DatagramProtocol, remote_addr=peer.getsockname())
    out = {"peername": t.get_extra_info("peername") == peer.getsockname(),
           "sockname_host": (t.get_extra_info("sockname") or ("?",))[0]}
    t.close(), peer.close()
    return out


@loop_probe()
async def lp_dgram_many_datagrams(a):
    """50 datagrams sent at once: all arrive, as separate datagram_received() calls, in order."""
    events, peer = [], _udp_peer()
    t, _ = await a.get_running_loop().create_datagram_endpoint(
        _dgram(a, events), local_addr=("127.0.0.1", 0))
    for i in range(50):
        peer.sendto(str(i).encode(), t.get_extra_info("sockname"))
    for _ in range(100):
        if sum(e[0] == "data" for e in events) >= 50:
            break
        await a.sleep(0.01)
    got = [e[2] for e in events if e[0] == "data"]
    t.close(), peer.close()
    return {"count": len(got), "in_order": got == [str(i) for i in range(50)]}
