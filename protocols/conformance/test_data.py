"""Conformance, every style: data arrives intact and in order, EOF works both ways.

Byte-exact round trips with 1 and 100 connections, half-close (EOF one way
while the other direction still works), and close with data still buffered
(delivers all, then EOF). These are contract without exceptions: no runtime
declares a difference here.
"""
from __future__ import annotations

import pytest

from protocols.conformance.contract import CONTRACT
from protocols.contracts import CONTRACTS
from protocols.conformance.harness import (
    BIG, CHUNK, MANY, SMALL, SOCKBUF, Recorder, cb_session, random_payload, st_session,
    tk_pair, tk_read_all, tk_session)
# ===========================================================================
# Every style: round trip

def test_port_has_its_style_contract(looplab_runtime):
    """The port a runtime opens has every method and attribute of its style's
    ``protocols.contracts`` class (the rest of the suite tests what they do)."""
    contract = CONTRACTS[looplab_runtime.style]
    with looplab_runtime.open() as port:
        missing = [name for name in sorted(_members(contract)) if not hasattr(port, name)]
        assert port.style == looplab_runtime.style
    assert not missing, f"{looplab_runtime.id}'s port lacks {missing} of {contract.__name__}"


def _members(protocol) -> set[str]:
    names = set()
    for cls in protocol.__mro__:
        if cls is object or cls.__name__ in ("Protocol", "Generic"):
            continue
        names |= {n for n in vars(cls) if not n.startswith("_")}
        names |= set(getattr(cls, "__annotations__", {}))
    return names


def test_declared_differences_name_contract_keys(looplab_runtime):
    """A runtime's declared differences name keys of its style's contract, each
    with a reason, and none merely repeats the contract."""
    rt = looplab_runtime
    contract = CONTRACT[rt.style]
    unknown = set(rt.info.differences) - set(contract)
    assert not unknown, f"{rt.id} declares differences for unknown keys {sorted(unknown)}"
    for key in rt.info.differences:
        declared = rt.info.difference(key)
        assert declared.reason.strip(), f"{rt.id}.{key} has no reason"
        assert declared.outcome != contract[key], f"{rt.id}.{key} repeats the contract"


def _cb_round_trip(rt, conns, size):
    payloads = [random_payload(i, size) for i in range(conns)]
    clients = []

    def body(s):
        s.listen(lambda: Recorder(echo=True, on_lost=s.lost))
        s.expect_lost(2 * conns)          # both ends of every connection
        for i in range(conns):
            def have_all(proto, n=size):
                if len(proto.data) >= n and not proto.transport.is_closing():
                    proto.transport.close()
            proto = Recorder(on_data=have_all, on_lost=s.lost)
            clients.append(proto)
            s.connect(proto, lambda t, i=i: t.write(payloads[i]))

    cb_session(rt, body)
    return [bytes(c.data) for c in clients], payloads


async def _st_round_trip_body(port, listener, host, p, payloads):
    errors = []
    finished = [0]
    all_finished = port.Event()

    async def echo(reader, writer):
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except Exception as exc:        # recorded: a handler's error would only be logged
            errors.append(exc)
        finally:
            writer.close()
            finished[0] += 1
            if finished[0] == len(payloads):
                all_finished.set()

    async def client(payload):
        reader, writer = await port.open_connection(host, p)

        async def send():
            for off in range(0, len(payload), CHUNK):
                writer.write(payload[off:off + CHUNK])
                await writer.drain()

        sender = port.create_task(send())
        try:
            got = await reader.readexactly(len(payload))
            await sender
        finally:
            writer.close()
        await writer.wait_closed()
        return got

    server = await port.start_server(echo, sock=listener)
    try:
        got = await port.gather(*(client(pl) for pl in payloads))
        await all_finished.wait()
    finally:
        server.close()
    return got, errors


async def _tk_round_trip_body(port, listener, host, p, payloads):
    got = [None] * len(payloads)

    async def echo(stream):
        try:
            while data := await stream.receive_some(65536):
                await stream.send_all(data)
        finally:
            await stream.aclose()

    async def serve(nursery):
        for _ in payloads:
            await nursery.spawn(echo, await listener.accept())

    async def client(i):
        stream = await port.open_tcp_stream(host, p)
        try:
            received = bytearray()
            async with port.open_nursery() as n:
                await n.spawn(stream.send_all, payloads[i])
                while len(received) < len(payloads[i]):
                    data = await stream.receive_some(65536)
                    if not data:
                        break
                    received += data
            got[i] = bytes(received)
        finally:
            await stream.aclose()

    async with port.open_nursery() as n:
        await n.spawn(serve, n)
        for i in range(len(payloads)):
            await n.spawn(client, i)
    return got


@pytest.mark.parametrize("conns,size", [(1, BIG), (MANY, SMALL)], ids=["1x1MiB", "100x64KiB"])
def test_round_trip_is_byte_exact(looplab_runtime, conns, size):
    runtime = looplab_runtime
    if runtime.style == "callback":
        got, payloads = _cb_round_trip(runtime, conns, size)
    elif runtime.style == "stream":
        payloads = [random_payload(i, size) for i in range(conns)]
        (got, errors), _ = st_session(runtime, _st_round_trip_body, payloads)
        assert errors == []
    else:
        payloads = [random_payload(i, size) for i in range(conns)]
        got = tk_session(runtime, _tk_round_trip_body, payloads)
    assert len(got) == conns
    bad = [i for i in range(conns) if got[i] != payloads[i]]
    assert not bad, (f"{len(bad)} of {conns} connections differ; first: conn {bad[0]} got "
                     f"{len(got[bad[0]] or b'')} of {size} bytes")


# ===========================================================================
# Every style: half-close. The client sends b"ping" and its EOF; the server
# sees both, and only then answers -- the direction still open must work.

def _cb_half_close(rt):
    seen = {}

    def body(s):
        def answer(proto):
            seen["server_data_at_eof"] = bytes(proto.data)
            proto.transport.write(b"after-eof:" + bytes(proto.data))
            proto.transport.close()

        server = Recorder(keep_open=True, on_eof=answer, on_lost=s.lost)
        client = Recorder(on_lost=s.lost)           # keep_open=False: close at EOF
        seen["server"], seen["client"] = server, client
        s.listen(lambda: server)
        s.expect_lost(2)

        def connected(t):
            t.write(b"ping")
            t.write_eof()
        s.connect(client, connected)

    cb_session(rt, body)
    server, client = seen["server"], seen["client"]
    assert seen["server_data_at_eof"] == b"ping" and server.eof
    assert bytes(client.data) == b"after-eof:ping" and client.eof
    assert client.lost == [None] and server.lost == [None]


async def _st_half_close_body(port, listener, host, p):
    seen = {}
    done = port.Event()

    async def handler(reader, writer):
        try:
            data = await reader.read()              # to EOF
            seen["server_at_eof"] = reader.at_eof()
            writer.write(b"after-eof:" + data)
            await writer.drain()
        except Exception as exc:
            seen["server_error"] = exc
        finally:
            writer.close()
            done.set()

    server = await port.start_server(handler, sock=listener)
    try:
        reader, writer = await port.open_connection(host, p)
        writer.write(b"ping")
        writer.write_eof()
        seen["client_got"] = await reader.read()
        seen["client_again"] = await reader.read()   # EOF is sticky
        writer.close()
        await writer.wait_closed()
        await done.wait()
    finally:
        server.close()
    return seen


async def _tk_half_close_body(port, listener, host, p):
    seen = {}
    client, server = await tk_pair(port, listener, host, p)
    try:
        async def serve():
            data = await tk_read_all(server)
            await server.send_all(b"after-eof:" + data)
            await server.aclose()

        async with port.open_nursery() as n:
            await n.spawn(serve)
            await client.send_all(b"ping")
            await client.send_eof()
            seen["client_got"] = await tk_read_all(client)
            seen["client_again"] = await client.receive_some(1024)
    finally:
        await client.aclose()
        await server.aclose()
    return seen


def test_half_close_eof_while_the_other_direction_works(looplab_runtime):
    runtime = looplab_runtime
    if runtime.style == "callback":
        _cb_half_close(runtime)
        return
    if runtime.style == "stream":
        seen, _ = st_session(runtime, _st_half_close_body)
        assert "server_error" not in seen, seen
        assert seen["server_at_eof"] is True
    else:
        seen = tk_session(runtime, _tk_half_close_body)
    assert seen["client_got"] == b"after-eof:ping"
    assert seen["client_again"] == b""


# ===========================================================================
# Every style: close with data still buffered delivers it all, then EOF.

def _cb_close_buffered(rt, payload):
    seen = {}

    def body(s):
        server = Recorder(on_lost=s.lost)            # EOF -> closes itself
        client = Recorder(on_lost=s.lost)
        seen["server"], seen["client"] = server, client
        s.listen(lambda: server)
        s.expect_lost(2)

        def connected(t):
            t.write(payload)
            seen["buffered"] = t.get_write_buffer_size()
            t.close()
        s.connect(client, connected, sockbuf=SOCKBUF)

    cb_session(rt, body, sockbuf=SOCKBUF)
    assert seen["buffered"] > 0, "precondition: the write left bytes in user space"
    assert seen["client"].lost == [None], "close() ended in an error"
    return bytes(seen["server"].data), seen["server"].eof


async def _st_close_buffered_body(port, listener, host, p, payload):
    seen = {}
    done = port.Event()

    async def sink(reader, writer):
        try:
            seen["data"] = await reader.read()         # to EOF, or raises
            seen["eof"] = reader.at_eof()
        finally:
            writer.close()
            done.set()

    server = await port.start_server(sink, sock=listener)
    try:
        _reader, writer = await port.open_connection(host, p, sockbuf=SOCKBUF)
        writer.write(payload)
        seen["buffered"] = writer.transport.get_write_buffer_size()
        writer.close()
        await done.wait()
        await writer.wait_closed()
    finally:
        server.close()
    return seen


def _st_close_buffered(rt, payload):
    seen, _ = st_session(rt, _st_close_buffered_body, payload, sockbuf=SOCKBUF)
    assert seen["buffered"] > 0, "precondition: the write left bytes in user space"
    return seen.get("data", b""), seen.get("eof", False)


async def _tk_close_buffered_body(port, listener, host, p, payload):
    # send_all returns once the kernel holds the bytes; the reader starts only
    # after aclose() returned, so the close really happens with data in flight.
    client, server = await tk_pair(port, listener, host, p, sockbuf=SOCKBUF)
    try:
        await client.send_all(payload)
        await client.aclose()
        data = await tk_read_all(server)             # returns only at EOF
        again = await server.receive_some(1024)
    finally:
        await client.aclose()
        await server.aclose()
    return data, again == b""


def test_close_with_data_buffered_delivers_all_then_eof(looplab_runtime):
    """callback/stream: write() then close(), with most of the write still in user
    space; task: send_all() then aclose(), with the bytes still in the kernel."""
    runtime = looplab_runtime
    if runtime.style == "callback":
        payload = random_payload(7, BIG)
        data, eof = _cb_close_buffered(runtime, payload)
    elif runtime.style == "stream":
        payload = random_payload(7, BIG)
        data, eof = _st_close_buffered(runtime, payload)
    else:
        # well under what the pinned kernel buffers hold, so send_all can't block
        payload = random_payload(7, SMALL)
        data, eof = tk_session(runtime, _tk_close_buffered_body, payload, sockbuf=SOCKBUF)
    assert len(data) == len(payload) and data == payload
    assert eof


# What tests/test_ports.py (and any suite that reuses these tests) collects.
__all__ = [name for name in dir() if name.startswith("test_")]
