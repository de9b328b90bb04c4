"""Conformance, task style: closing a stream under a blocked task, and misuse.

Restates trio's generic stream checks (``trio.testing.check_two_way_stream``):
``aclose`` while another task is blocked receiving or sending, use after close,
``send_all`` after ``send_eof``, two concurrent receivers or senders -- and
that every closed/broken-stream error is a ``port.StreamError``, which is what
drivers catch.
"""
from __future__ import annotations

import pytest

from protocols.conformance.contract import check
from protocols.conformance.harness import (
    BIG, HANG_S, SETTLE_S, SOCKBUF, random_payload, tk_pair, tk_read_all, tk_session)
# ===========================================================================
# Task style: closing a stream under a blocked task; use after close

async def _tk_close_while_body(port, listener, host, p, direction):
    seen = {}
    client, server = await tk_pair(port, listener, host, p, sockbuf=SOCKBUF)
    try:
        async def blocked():
            async with port.move_on_after(HANG_S) as scope:
                try:
                    if direction == "receiving":
                        await client.receive_some(1024)
                    else:
                        await client.send_all(bytes(BIG))  # the peer never reads
                    seen["outcome"] = "returned"
                except Exception as exc:
                    seen["outcome"], seen["exc"] = type(exc).__name__, exc
            if scope.cancelled_caught:
                seen["outcome"] = "hangs"

        async def closer():
            await port.sleep(SETTLE_S)
            await client.aclose()

        async with port.open_nursery() as n:
            await n.spawn(blocked)
            await n.spawn(closer)
    finally:
        await client.aclose()
        await server.aclose()
    return seen


@pytest.mark.parametrize("direction", ["receiving", "sending"])
@pytest.mark.looplab_style("task")
def test_task_close_while_blocked(looplab_runtime, direction):
    rt = looplab_runtime
    seen = tk_session(rt, _tk_close_while_body, direction, sockbuf=SOCKBUF)
    check(rt, f"close_while_{direction}", seen["outcome"], seen.get("exc"))


async def _tk_use_after_close_body(port, listener, host, p):
    client, server = await tk_pair(port, listener, host, p)
    try:
        await client.aclose()
        await client.aclose()                 # idempotent, as trio's check requires
        out = {}
        for name, call in (("send_all", lambda: client.send_all(b"x")),
                           ("receive_some", lambda: client.receive_some(1024))):
            try:
                await call()
                out[name] = "no error"
            except Exception as exc:
                out[name] = exc
    finally:
        await server.aclose()
    return out


def _names(out: dict) -> str:
    return "; ".join(f"{k}: {v if isinstance(v, str) else type(v).__name__}"
                     for k, v in out.items())


@pytest.mark.looplab_style("task")
def test_task_use_after_close(looplab_runtime):
    rt = looplab_runtime
    out = tk_session(rt, _tk_use_after_close_body)
    check(rt, "use_after_close", _names(out), out)


async def _tk_send_after_eof_body(port, listener, host, p):
    client, server = await tk_pair(port, listener, host, p)
    try:
        await client.send_eof()
        try:
            await client.send_all(b"x")
            return "no error", None
        except Exception as exc:
            return type(exc).__name__, exc
    finally:
        await client.aclose()
        await server.aclose()


@pytest.mark.looplab_style("task")
def test_task_send_after_send_eof(looplab_runtime):
    rt = looplab_runtime
    outcome, exc = tk_session(rt, _tk_send_after_eof_body)
    check(rt, "send_after_eof", outcome, exc)


@pytest.mark.looplab_style("task")
def test_task_closed_stream_errors_are_stream_errors(looplab_runtime):
    """Drivers catch ``port.StreamError`` for "the stream broke or was closed under
    me" (the push driver's disconnect relies on it), so every error the cases
    above raise for a closed stream must be one."""
    rt = looplab_runtime
    raised = {}
    for direction in ("receiving", "sending"):
        seen = tk_session(rt, _tk_close_while_body, direction, sockbuf=SOCKBUF)
        if "exc" in seen:
            raised[f"close_while_{direction}"] = seen["exc"]
    for name, value in tk_session(rt, _tk_use_after_close_body).items():
        if not isinstance(value, str):
            raised[f"use_after_close.{name}"] = value
    _, exc = tk_session(rt, _tk_send_after_eof_body)
    if exc is not None:
        raised["send_after_eof"] = exc
    with rt.open() as port:
        stream_error = port.StreamError
    outside = sorted(f"{k}: {type(v).__name__}" for k, v in raised.items()
                     if not isinstance(v, stream_error))
    check(rt, "not_stream_errors", ", ".join(outside) or "none", stream_error)


# ===========================================================================
# Task style: concurrent misuse -- a second receiver / sender on one stream

async def _tk_concurrent_body(port, listener, host, p, direction):
    seen = {}
    client, server = await tk_pair(port, listener, host, p, sockbuf=SOCKBUF)
    first_payload = random_payload(13, BIG)
    try:
        async def first():
            if direction == "receive":
                seen["first_got"] = await client.receive_some(1024)
            else:
                await client.send_all(first_payload)
                await client.send_eof()

        async def second():
            try:
                if direction == "receive":
                    await client.receive_some(1024)
                else:
                    await client.send_all(b"B" * 100)
                seen["second"] = "no error"
            except Exception as exc:
                seen["second"], seen["exc"] = type(exc).__name__, exc

        async with port.open_nursery() as n:
            await n.spawn(first)
            await port.sleep(SETTLE_S)          # first is blocked now
            async with port.move_on_after(HANG_S) as scope:
                await second()
            if scope.cancelled_caught:
                seen["second"] = "hangs"
            # Unblock the first call and see whether it survived the misuse.
            if direction == "receive":
                await server.send_all(b"x")
            else:
                seen["peer_got"] = await tk_read_all(server)
        if direction == "receive":
            intact = seen.get("first_got") == b"x"
        else:
            intact = seen["peer_got"] == first_payload
            if not intact and b"B" * 100 in seen["peer_got"]:
                seen["second"] += "; interleaved"
    finally:
        await client.aclose()
        await server.aclose()
    return f"{seen['second']}; first {'intact' if intact else 'broken'}", seen.get("exc")


@pytest.mark.parametrize("direction", ["receive", "send"])
@pytest.mark.looplab_style("task")
def test_task_concurrent_misuse(looplab_runtime, direction):
    rt = looplab_runtime
    outcome, exc = tk_session(rt, _tk_concurrent_body, direction, sockbuf=SOCKBUF)
    check(rt, f"concurrent_{direction}", outcome, exc)


# What tests/test_ports.py (and any suite that reuses these tests) collects.
__all__ = [name for name in dir() if name.startswith("test_")]


# ===========================================================================
# A child's error in a nursery: does it cancel its siblings and leave the block?

class _ChildFailed(Exception):
    pass


@pytest.mark.looplab_style("task")
def test_task_nursery_child_error(looplab_runtime):
    seen = {"sibling": "running"}

    async def body(port, listener, host, p):
        async def failing():
            await port.sleep(0)
            raise _ChildFailed("child")

        async def sibling():
            try:
                await port.sleep(SETTLE_S * 3)
                seen["sibling"] = "ran to the end"
            except BaseException:
                seen["sibling"] = "cancelled"
                raise

        try:
            async with port.open_nursery() as n:
                await n.spawn(sibling)
                await n.spawn(failing)
            return "swallowed"
        except BaseException as exc:        # trio: an ExceptionGroup around it
            inner = getattr(exc, "exceptions", (exc,))
            if any(isinstance(e, _ChildFailed) for e in inner):
                return "propagates"
            raise

    fate = tk_session(looplab_runtime, body)
    check(looplab_runtime, "child_error", f"{fate}; sibling {seen['sibling']}")
