"""Conformance: resets, aborts and writes after close -- where errors surface.

The peer resets mid-stream (callback: ``connection_lost``; stream: the next
call; task: ``send_all``/``receive_some``), ``abort()`` drops what is buffered
and the probe counts it, ``write()`` after ``close()``, and two tasks in
``drain()`` on one writer (CPython issue 74116).
"""
from __future__ import annotations

import pytest

from protocols.conformance.contract import check
from protocols.conformance.harness import (
    BIG, CHUNK, LIMIT_S, MAX_WRITES, SETTLE_S, SMALL, SOCKBUF, Recorder, ResettingPeer,
    cb_run, cb_session, error_family, random_payload, st_session, tk_pair, tk_session)
# ===========================================================================
# Every style: the peer resets mid-stream. Where does the error surface?

def _cb_reset(rt):
    payload = random_payload(3, BIG)
    seen = {}
    with ResettingPeer(read_first=SMALL) as peer:
        listener_host, listener_port = peer.address
        with rt.open() as port:
            def setup(port):
                def write(proto, key, data):
                    try:
                        proto.transport.write(data)
                        seen[key] = "no error"
                    except Exception as exc:
                        seen[key] = type(exc).__name__

                def later(proto):
                    # a program's error path writes later too: uvloop's transport is
                    # closed once connection_lost returned, and its write() raises then
                    write(proto, "write_later", b"once connection_lost returned")
                    port.stop()

                def lost(proto):
                    write(proto, "write_after", b"after the reset")
                    port.call_later(0, later, proto)

                client = Recorder(on_lost=lost)
                seen["client"] = client

                def done(transport, protocol, exc):
                    if exc is not None:
                        raise exc
                    transport.write(payload)
                port.connect(lambda: client, listener_host, listener_port, done,
                             sockbuf=SOCKBUF)
            cb_run(port, setup)
    assert peer.error is None and peer.reset_done
    lost = seen["client"].lost
    assert len(lost) == 1, lost
    surfaced = "None" if lost[0] is None else error_family(lost[0])
    return (f"connection_lost({surfaced}); write after: {seen['write_after']}; "
            f"once it returned: {seen['write_later']}"), lost


async def _st_reset_main(port, address):
    reader, writer = await port.open_connection(*address, sockbuf=SOCKBUF)
    where, exc = None, None
    chunk = bytes(CHUNK)
    try:
        for _ in range(MAX_WRITES):
            try:
                writer.write(chunk)
            except Exception as e:
                where, exc = "write", e
                break
            try:
                await writer.drain()
            except Exception as e:
                where, exc = "drain", e
                break
        try:
            data = await reader.read(1)
            after = "returns b''" if not data else "returns data"
        except Exception as e:
            after = f"raises {error_family(e)}"
        if where is not None:
            # A write after the error surfaced: uvloop raises RuntimeError here (its
            # transport is closed), asyncio drops it; a program's error path hits this.
            try:
                writer.write(b"after the reset")
                after += "; write after: no error"
            except Exception as e:
                after += f"; write after: {type(e).__name__}"
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except Exception:       # noqa: BLE001 -- the connection's error again
            pass
    if where is None:
        return f"no error in {MAX_WRITES} writes", None
    return f"{where} raises {error_family(exc)}; then read {after}", exc


def _st_reset(rt):
    with ResettingPeer(read_first=SMALL) as peer:
        with rt.open() as port:
            async def main(port):
                return await port.wait_for(_st_reset_main(port, peer.address), LIMIT_S)
            outcome, exc = port.run(main)
    assert peer.error is None and peer.reset_done
    return outcome, exc


@pytest.mark.looplab_style("callback")
def test_callback_peer_reset_surfaces_in_connection_lost(looplab_runtime):
    outcome, details = _cb_reset(looplab_runtime)
    check(looplab_runtime, "reset", outcome, details)


@pytest.mark.looplab_style("stream")
def test_stream_peer_reset_surfaces_at_the_next_call(looplab_runtime):
    outcome, details = _st_reset(looplab_runtime)
    check(looplab_runtime, "reset", outcome, details)


async def _tk_reset_send_main(port, address):
    stream = await port.open_tcp_stream(*address, sockbuf=SOCKBUF)
    exc = None
    try:
        chunk = bytes(CHUNK)
        for _ in range(MAX_WRITES):
            try:
                await stream.send_all(chunk)
            except Exception as e:
                exc = e
                break
        if exc is None:
            return f"no error in {MAX_WRITES} sends", None
        try:
            data = await stream.receive_some(1024)
            after = "returns b''" if not data else "returns data"
        except Exception as e:
            after = f"raises {error_family(e)}"
    finally:
        await stream.aclose()
    return f"send_all raises {error_family(exc)}; then receive_some {after}", exc


async def _tk_reset_receive_main(port, address):
    stream = await port.open_tcp_stream(*address)
    try:
        try:
            data = await stream.receive_some(1024)
        except Exception as e:
            return f"receive_some raises {error_family(e)}", e
        return f"receive_some returns {data!r}", None
    finally:
        await stream.aclose()


@pytest.mark.parametrize("side", ["send", "receive"])
@pytest.mark.looplab_style("task")
def test_task_peer_reset(looplab_runtime, side):
    rt = looplab_runtime
    if side == "send":
        peer_args, main, key = dict(read_first=SMALL), _tk_reset_send_main, "reset_send"
    else:
        peer_args, main, key = dict(delay_s=SETTLE_S), _tk_reset_receive_main, "reset_receive"
    with ResettingPeer(**peer_args) as peer:
        with rt.open() as port:
            async def bounded(port):
                async with port.fail_after(LIMIT_S):
                    return await main(port, peer.address)
            outcome, exc = port.run(bounded)
            stream_error = port.StreamError
    assert peer.error is None and peer.reset_done
    # whatever its class, drivers must be able to catch it as port.StreamError
    assert isinstance(exc, stream_error), f"{exc!r} is not one of {stream_error}"
    check(rt, key, outcome, exc)


# ===========================================================================
# Callback style: abort() drops what is buffered

def _cb_abort(rt):
    payload = random_payload(5, BIG)
    seen = {}

    def body(s):
        server = Recorder(on_lost=s.lost)
        client = Recorder(on_lost=s.lost)
        seen["server"], seen["client"] = server, client
        s.listen(lambda: server)
        s.expect_lost(2)

        def connected(t):
            t.write(payload)
            seen["buffered"] = t.get_write_buffer_size()
            t.abort()
            seen["closing"] = t.is_closing()
            t.write(b"after abort")            # dropped, never raises
        s.connect(client, connected, sockbuf=SOCKBUF)

    _, probe = cb_session(rt, body, sockbuf=SOCKBUF)
    return payload, seen, probe


@pytest.mark.looplab_style("callback")
def test_callback_abort_drops_buffered_bytes(looplab_runtime):
    rt = looplab_runtime
    payload, seen, _ = _cb_abort(rt)
    server, client = seen["server"], seen["client"]
    got = bytes(server.data)
    assert seen["buffered"] > 0, "precondition: the write left bytes in user space"
    assert seen["closing"] is True
    assert len(got) < len(payload), "abort() delivered everything"
    assert got == payload[:len(got)], "the peer got bytes that are not a prefix"
    if server.lost and server.lost[0] is not None:
        ending = f"reset ({error_family(server.lost[0])})"
    else:
        ending = "EOF" if server.eof else "no EOF"
    lost = "connection_lost(None)" if client.lost == [None] else f"connection_lost{client.lost}"
    check(rt, "abort", f"peer: prefix then {ending}; {lost}",
          {"buffered": seen["buffered"], "peer_got": len(got)})


def _abort_counted(reported, buffered: int) -> str:
    if reported is None:
        return "unseen (None)"
    if reported == buffered:
        return "counted exactly"
    return "reported 0" if reported == 0 else "reported a different count"


@pytest.mark.looplab_style("callback")
def test_callback_abort_loss_is_counted_by_the_probe(looplab_runtime):
    """What abort() dropped is loss: the probe reports exactly that many bytes in
    lost_on_abort_bytes, or None if it can't see them -- never a zero."""
    rt = looplab_runtime
    _, seen, probe = _cb_abort(rt)
    check(rt, "abort_counted", _abort_counted(probe["lost_on_abort_bytes"],
                                                       seen["buffered"]),
          {"buffered": seen["buffered"], "reported": probe["lost_on_abort_bytes"]})


async def _st_abort_body(port, listener, host, p, payload):
    seen = {}
    done = port.Event()

    async def sink(reader, writer):
        try:
            seen["data"] = await reader.read()
            seen["ending"] = "EOF"
        except Exception as exc:
            seen["ending"] = f"raises {error_family(exc)}"
        finally:
            writer.close()
            done.set()

    server = await port.start_server(sink, sock=listener)
    try:
        _reader, writer = await port.open_connection(host, p, sockbuf=SOCKBUF)
        writer.write(payload)
        seen["buffered"] = writer.transport.get_write_buffer_size()
        writer.transport.abort()
        await done.wait()
    finally:
        server.close()
    return seen


@pytest.mark.looplab_style("stream")
def test_stream_abort_loss_is_counted_by_the_probe(looplab_runtime):
    """``writer.transport.abort()`` (the push driver's disconnect) drops the
    buffer: the peer gets a prefix, and the probe counts the rest as lost."""
    rt = looplab_runtime
    payload = random_payload(5, BIG)
    seen, probe = st_session(rt, _st_abort_body, payload, sockbuf=SOCKBUF)
    assert seen["buffered"] > 0, "precondition: the write left bytes in user space"
    got = seen.get("data", b"")
    assert len(got) < len(payload) and got == payload[:len(got)]
    assert seen["ending"] == "EOF", seen["ending"]     # as on the callback port
    check(rt, "abort_counted", _abort_counted(probe["lost_on_abort_bytes"],
                                                       seen["buffered"]),
          {"buffered": seen["buffered"], "reported": probe["lost_on_abort_bytes"]})


# ===========================================================================
# Callback and stream style: write() after close()

def _cb_write_after_close(rt):
    payload = random_payload(9, BIG)
    seen = {}

    def body(s):
        s.listen(lambda: Recorder(on_lost=s.lost))
        s.expect_lost(4)

        def write_then(t, data):
            if data:
                t.write(data)
            t.close()
            try:
                t.write(b"LATE")
                seen.setdefault("raised", []).append(None)
            except Exception as exc:
                seen.setdefault("raised", []).append(type(exc).__name__)

        empty, buffered = Recorder(on_lost=s.lost), Recorder(on_lost=s.lost)
        seen["empty"], seen["buffered"] = empty, buffered
        s.connect(empty, lambda t: write_then(t, b""), sockbuf=SOCKBUF)
        s.connect(buffered, lambda t: write_then(t, payload), sockbuf=SOCKBUF)

    session, probe = cb_session(rt, body, sockbuf=SOCKBUF)
    return payload, seen, session.accepted, probe


def _late_outcome(got: bytes, payload: bytes) -> str:
    if got == payload + b"LATE":
        return "delivered"
    if got == payload:
        return "dropped"
    return f"{len(got)} bytes, neither"


@pytest.mark.looplab_style("callback")
def test_callback_write_after_close(looplab_runtime):
    rt = looplab_runtime
    payload, seen, servers, probe = _cb_write_after_close(rt)
    raised = [r for r in seen["raised"] if r is not None]
    assert len(servers) == 2 and all(s.eof for s in servers)
    by_size = sorted(servers, key=lambda s: len(s.data))
    parts = [f"empty: {_late_outcome(bytes(by_size[0].data), b'')}",
             f"buffered: {_late_outcome(bytes(by_size[1].data), payload)}",
             f"counted {probe['writes_after_close_count']}"]
    outcome = "; ".join(parts) if not raised else f"write raises {raised}"
    check(rt, "write_after_close", outcome)


async def _st_write_after_close_body(port, listener, host, p, payload):
    got = []
    done = port.Event()

    async def sink(reader, writer):
        try:
            got.append(await reader.read())
        finally:
            writer.close()
            if len(got) == 2:
                done.set()

    raised = []
    server = await port.start_server(sink, sock=listener)
    try:
        for data in (b"", payload):
            _reader, writer = await port.open_connection(host, p, sockbuf=SOCKBUF)
            if data:
                writer.write(data)
            writer.close()
            try:
                writer.write(b"LATE")
            except Exception as exc:
                raised.append(type(exc).__name__)
            try:
                await writer.wait_closed()
            except ConnectionError:
                pass
        await done.wait()
    finally:
        server.close()
    return sorted(got, key=len), raised


@pytest.mark.looplab_style("stream")
def test_stream_write_after_close(looplab_runtime):
    rt = looplab_runtime
    payload = random_payload(9, BIG)
    (got, raised), probe = st_session(rt, _st_write_after_close_body, payload, sockbuf=SOCKBUF)
    parts = [f"empty: {_late_outcome(got[0], b'')}",
             f"buffered: {_late_outcome(got[1], payload)}",
             f"counted {probe['writes_after_close_count']}"]
    outcome = "; ".join(parts) if not raised else f"write raises {raised}"
    check(rt, "write_after_close", outcome)


# ===========================================================================
# Stream style: two tasks in drain() on one writer (CPython 74116)

async def _st_two_drainers_body(port, listener, host, p, payload):
    release = port.Event()
    seen = {}

    async def slow_sink(reader, writer):
        try:
            await release.wait()
            seen["data"] = await reader.read()
        finally:
            writer.close()

    async def drainer(writer, name):
        try:
            await port.wait_for(writer.drain(), 5.0)
            seen[name] = "woke"
        except port.TimeoutError:
            seen[name] = "hangs"
        except Exception as exc:
            seen[name] = f"raises {type(exc).__name__}"

    server = await port.start_server(slow_sink, sock=listener)
    try:
        _reader, writer = await port.open_connection(host, p, sockbuf=SOCKBUF)
        writer.write(payload)                      # far over high water: paused
        tasks = [port.create_task(drainer(writer, n)) for n in ("first", "second")]
        await port.sleep(SETTLE_S)
        seen["both_waiting"] = not any(t.done() for t in tasks)
        release.set()
        await port.gather(*tasks)
        writer.close()
        await writer.wait_closed()
        while "data" not in seen:
            await port.sleep(0.01)
    finally:
        server.close()
    return seen


@pytest.mark.looplab_style("stream")
def test_stream_two_drainers_both_wake(looplab_runtime):
    rt = looplab_runtime
    payload = random_payload(11, BIG)
    seen, _ = st_session(rt, _st_two_drainers_body, payload, sockbuf=SOCKBUF)
    assert seen["both_waiting"], "precondition: drain() must block while paused"
    outcome = "both wake" if seen["first"] == seen["second"] == "woke" else (
        f"first {seen['first']}, second {seen['second']}")
    assert seen["data"] == payload
    check(rt, "two_drainers", outcome)


# What tests/test_ports.py (and any suite that reuses these tests) collects.
__all__ = [name for name in dir() if name.startswith("test_")]


# ===========================================================================
# The probe's per-connection `closed` follows a completed close.

async def _st_close_body(port, listener, host, p):
    reader, writer = await port.open_connection(host, p, sockbuf=SOCKBUF)
    writer.write(b"x")
    await writer.drain()
    writer.close()
    await writer.wait_closed()


@pytest.mark.looplab_style("stream")
def test_stream_probe_marks_a_closed_connection(looplab_runtime):
    _, probe = st_session(looplab_runtime, _st_close_body)
    conns = probe["per_connection"]
    if not conns or any("closed" not in c for c in conns):
        pytest.skip(f"{looplab_runtime.id} does not report per-connection closed")
    assert [c["closed"] for c in conns] == [True]


@pytest.mark.looplab_style("task")
def test_task_probe_marks_a_closed_connection(looplab_runtime):
    async def body(port, listener, host, p):
        client, server = await tk_pair(port, listener, host, p, sockbuf=SOCKBUF)
        await client.send_all(b"x")
        await client.aclose()
        await server.aclose()

    seen = {}

    async def main_probe(port, listener, host, p):
        await body(port, listener, host, p)
        seen.update(port.probe())
    tk_session(looplab_runtime, main_probe)
    conns = seen["per_connection"]
    if not conns or any("closed" not in c for c in conns):
        pytest.skip(f"{looplab_runtime.id} does not report per-connection closed")
    assert [c["closed"] for c in conns] == [True, True]
