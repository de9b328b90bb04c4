"""The framework programs (bench/zoo/frameworks.py) against the plain-socket HTTP and
WebSocket peers (bench/peers/http.py), and the zoo entries that run them.

Each program runs in this process on asyncio-streams; the peers run in their own
process and count every byte. Sizes are small, every wait is bounded. A framework
that is not installed skips its tests with the reason.
"""
from __future__ import annotations

import importlib.util

import pytest

from bench import peers
from bench.scenarios import api as scmod
from bench.peers import PeerProcess
from bench.peers import http as hp
from bench.scenarios.api import Job

scmod.load_plugins(modules=("bench.zoo",))   # as looplab repro does: cells see the zoo
from bench.zoo import entry  # noqa: E402
from bench.zoo import frameworks as fw  # noqa: E402
from bench import runtimes  # noqa: E402


def _need(*modules):
    for m in modules:
        if importlib.util.find_spec(m) is None:
            pytest.skip(f"{m} is not installed (pip install 'looplab[frameworks]')")


def _serve(program, specs, variant="fixed", runtime="asyncio-streams", **params):
    rt = runtimes.parse(runtime)
    with PeerProcess(specs, timeout_s=20) as pp:
        addrs = {s["name"]: pp.address(s["name"], timeout=10) for s in specs}
        out = program(Job(rt, variant, {"serve_s": 6.0, **params}, addrs))
        res = pp.results(20)
    assert "error" not in out, out
    return out, res


# -- the HTTP response parser of the peers, alone ------------------------------------

def test_parser_reads_chunked_and_length_bodies_split_anywhere():
    body = hp.pattern(700)
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + \
        b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 300]), body[i:i + 300])
                 for i in range(0, 700, 300)) + b"0\r\n\r\n"
    sized = b"HTTP/1.1 200 OK\r\nContent-Length: 700\r\n\r\n" + body
    for wire in (chunked, sized):
        for cut in (1, 7, 64):
            p, got = hp._Body(), []
            for i in range(0, len(wire), cut):
                got.append(p.feed(wire[i:i + cut]))
            assert p.done and b"".join(got) == body


def test_ws_client_frames_are_masked():
    frame = hp.ws_frame(0x1, b"hello", b"\x01\x02\x03\x04")
    assert frame[0] == 0x81 and frame[1] == 0x80 | 5
    assert bytes(b ^ frame[2 + i % 4] for i, b in enumerate(frame[6:])) == b"hello"


# -- aiohttp ----------------------------------------------------------------------

def test_aiohttp_serves_pipelined_requests_byte_exact():
    _need("aiohttp")
    out, res = _serve(fw.aiohttp_serve, [peers.role(
        "http_client", "c", path="/bytes/5000", count=3, pipeline=True, max_s=15)])
    c = res["c"]
    assert c["responses_count"] == 3 and c["statuses"] == [200, 200, 200]
    assert c["body_bytes"] == 15000 and c["mismatch_bytes"] == 0
    assert out["requests_count"] == 3 and out["shutdown_s"] is not None


def test_aiohttp_streams_to_a_slow_reader_and_survives_the_others():
    _need("aiohttp")
    out, res = _serve(fw.aiohttp_serve, [
        peers.role("http_slow_reader", "slow", path="/stream/200000", rate_Bps=400_000.0,
                   recv_bytes=16384, max_s=15),
        peers.role("http_no_read", "deaf", path="/stream/2000000", hold_s=0.5, max_s=15),
        peers.role("http_vanish", "gone", path="/stream/2000000", vanish_after_bytes=40000,
                   max_s=15)], serve_s=3.0)
    slow = res["slow"]
    assert slow["body_bytes"] == 200000 and slow["mismatch_bytes"] == 0
    assert slow["last_response_after_s"] >= 0.3          # it really read at ~400 kB/s
    assert res["deaf"]["received_bytes"] == 0
    assert res["gone"]["ended"] == "reset_sent" and res["gone"]["mismatch_bytes"] == 0
    assert out["open_at_shutdown_count"] == 0            # every connection was dropped


def test_aiohttp_websocket_to_a_slow_subscriber():
    _need("aiohttp")
    out, res = _serve(fw.aiohttp_serve, [peers.role(
        "ws_subscriber", "ws", path="/ws", rate_Bps=200_000.0, recv_bytes=4096, max_s=15)],
        messages=20, message_bytes=3000, interval_s=0.0)
    ws = res["ws"]
    assert ws["upgraded"] and ws["messages_count"] == 20 and ws["message_bytes"] == 60000
    assert ws["mismatch_bytes"] == 0 and ws["close_code"] == 1000


def test_aiohttp_websocket_send_waits_for_a_subscriber_that_stopped_reading():
    """aiohttp 1367's fix, on the installed release: send_bytes() drains, so a
    subscriber that stops reading holds the sender back; the backlog stays bounded."""
    _need("aiohttp")
    out, res = _serve(fw.aiohttp_serve, [peers.role(
        "ws_subscriber", "ws", stall_s=3.0, sockbuf=65536, max_s=6)],
        serve_s=1.0, messages=None, message_bytes=10000, interval_s=0.0, sockbuf=65536,
        shutdown_timeout_s=0.3)
    assert res["ws"]["upgraded"] and res["ws"]["mismatch_bytes"] == 0
    assert 5 < out["ws_sent_count"] < 200          # unbounded, 1 s of sends would be far more
    assert out["ws_backlog_peak_bytes"] < 1024 * 1024


def test_starlette_middleware_queue_is_bounded_on_the_installed_release():
    """starlette 1012's shape (BaseHTTPMiddleware in front of a StreamingResponse) on the
    installed starlette: the producer never runs far ahead of a 1 MB/s client."""
    _need("uvicorn", "starlette")
    n = 1_500_000
    out, res = _serve(fw.starlette_stream_serve, [peers.role(
        "http_slow_reader", "r", path=f"/produce/{n}", rate_Bps=1_000_000.0, sockbuf=65536,
        max_s=10)], middleware=True, chunk_bytes=32768, interval_s=0.002, sockbuf=65536)
    assert res["r"]["body_bytes"] == n and res["r"]["mismatch_bytes"] == 0
    assert out["produced_bytes"] == n and out["app_queue_peak_bytes"] < 256 * 1024


def test_aiohttp_streaming_proxy_byte_exact():
    _need("aiohttp")
    out, res = _serve(fw.aiohttp_serve, [peers.role(
        "http_slow_reader", "c", path="/proxy/150000", rate_Bps=600_000.0, recv_bytes=16384,
        max_s=15)], upstream=True)
    assert res["c"]["body_bytes"] == 150000 and res["c"]["mismatch_bytes"] == 0
    assert out["proxied_bytes"] == 150000


# -- websockets ---------------------------------------------------------------------

def test_websockets_server_to_a_fast_and_a_slow_subscriber():
    _need("websockets")
    out, res = _serve(fw.websockets_serve, [
        peers.role("ws_subscriber", "fast", sockbuf=4096, max_s=15),
        peers.role("ws_subscriber", "slow", rate_Bps=200_000.0, recv_bytes=4096, sockbuf=4096,
                   max_s=15)],
        messages=30, message_bytes=5000, interval_s=0.0, write_limit_bytes=8192, sockbuf=4096)
    for name in ("fast", "slow"):
        ws = res[name]
        assert ws["upgraded"] and ws["messages_count"] == 30, (name, ws)
        assert ws["message_bytes"] == 150000 and ws["mismatch_bytes"] == 0
        assert ws["close_code"] == 1000
    # send() waited for the slow one: 150 kB at 200 kB/s is ~0.75 s, and the
    # socket buffers and the write limit hold a few tens of kB
    assert out["worst_send_wait_s"] > 0.05


# -- uvicorn + starlette ------------------------------------------------------------

def test_uvicorn_serves_bytes_stream_and_websocket():
    _need("uvicorn", "starlette")
    out, res = _serve(fw.uvicorn_serve, [
        peers.role("http_client", "get", path="/bytes/3000", count=2, pipeline=True, max_s=15),
        peers.role("http_slow_reader", "stream", path="/stream/100000", rate_Bps=500_000.0,
                   recv_bytes=16384, max_s=15),
        peers.role("ws_subscriber", "ws", path="/ws", max_s=15)],
        messages=5, message_bytes=2000, interval_s=0.0)
    assert res["get"]["body_bytes"] == 6000 and res["get"]["mismatch_bytes"] == 0
    assert res["get"]["responses_count"] == 2
    assert res["stream"]["body_bytes"] == 100000 and res["stream"]["mismatch_bytes"] == 0
    ws = res["ws"]
    assert ws["messages_count"] == 5 and ws["mismatch_bytes"] == 0 and ws["close_code"] == 1000
    assert out["shutdown_s"] is not None


def test_uvicorn_releases_the_handler_of_a_client_that_vanished_mid_response():
    """uvicorn 336's fix, on the installed release: a client that resets during a long
    streaming response leaves no handler task behind."""
    _need("uvicorn", "starlette")
    out, res = _serve(fw.uvicorn_serve, [peers.role(
        "http_vanish", "v", path="/stream/20000000", vanish_after_bytes=100000, sockbuf=16384,
        rate_Bps=2_000_000.0, max_s=8)], serve_s=5.0, sockbuf=16384)
    assert res["v"]["ended"] == "reset_sent" and res["v"]["mismatch_bytes"] == 0
    assert res["v"]["body_bytes"] < 1_000_000
    # the connection is gone, and the handler ends by itself: uvicorn's shutdown waits
    # for running handlers, and would take its whole 1 s timeout for a parked one
    assert out["served_until"] == "closed" and out["shutdown_s"] < 0.5


# -- without an asyncio loop, and the entries ----------------------------------------

def test_a_runtime_without_an_asyncio_loop_is_not_measured():
    rt = runtimes.parse("hybrid")
    why = fw.framework_reason(rt, "aiohttp")
    assert why is not None and ("asyncio" in why or "not installed" in why)
    assert fw.framework_reason(runtimes.parse("asyncio-streams"), "no_such_framework_xyz") \
        .startswith("no_such_framework_xyz is not installed")


def _cell(eid, variant, runtime="asyncio-streams", net=None):
    from bench import run as scenarios
    params = dict(entry(eid).scenario.presets["tiny"])
    if net:
        params["net"] = net
    cell = scenarios.Cell(scenario=eid, runtime=runtime, variant=variant, preset="tiny",
                          params=params, repeats=1)
    return scenarios.run_cell(cell)


@pytest.mark.parametrize("eid,module", [("aiohttp-1221", "aiohttp"), ("uvicorn-451", "uvicorn")])
def test_entry_shown_naive_not_fixed(eid, module):
    _need(module)
    naive, fixed = _cell(eid, "naive"), _cell(eid, "fixed")
    assert not naive["errors"] and not fixed["errors"], (naive["errors"], fixed["errors"])
    assert naive["verdicts"]["bug_shown"] is True
    assert fixed["verdicts"]["bug_shown"] is False
    # the fixed shutdown ends well inside the bound the naive one overruns or fills
    bound = entry(eid).scenario.presets["tiny"]["shutdown_bound_s"]
    assert fixed["metrics"]["shutdown_s"] < bound / 2


def test_home_assistant_entry_runs_the_real_aiohttp_writer_on_asyncio():
    _need("aiohttp")
    naive, fixed = _cell("home-assistant-89905", "naive"), _cell("home-assistant-89905", "fixed")
    for r in (naive, fixed):
        assert not r["errors"], r["errors"]
        assert any(n.startswith("real: aiohttp ") for n in r["notes"]), r["notes"]
    assert naive["verdicts"]["bug_shown"] is True and fixed["verdicts"]["bug_shown"] is False
    assert naive["metrics"]["held_back_fraction"] > fixed["metrics"]["held_back_fraction"]


def test_entries_on_a_runtime_without_asyncio_are_not_measured():
    r = _cell("aiohttp-1221", "naive", runtime="hybrid")
    # not measured: an error that says what was missing, and no verdict
    assert r["errors"] and all(e.startswith("not measured") for e in r["errors"]), r["errors"]
    assert r["verdicts"]["bug_shown"] is None
    assert any("not measured" in n and "asyncio" in n for n in r["notes"]), r["notes"]


@pytest.mark.parametrize("eid,module", [("aiohttp-1221", "aiohttp"), ("uvicorn-451", "uvicorn")])
def test_entry_on_the_simulated_network(eid, module):
    _need(module)
    naive, fixed = _cell(eid, "naive", net="sim"), _cell(eid, "fixed", net="sim")
    assert not naive["errors"] and not fixed["errors"], (naive["errors"], fixed["errors"])
    assert naive["verdicts"]["bug_shown"] is True and fixed["verdicts"]["bug_shown"] is False


def test_entry_without_its_framework_is_not_measured_with_the_reason(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(fw.importlib.util, "find_spec",
                        lambda name, *a: None if name == "aiohttp" else real(name, *a))
    r = _cell("aiohttp-1221", "naive")
    assert r["errors"] and all(e.startswith("not measured") for e in r["errors"]), r["errors"]
    assert r["verdicts"]["bug_shown"] is None
    assert any("aiohttp is not installed" in n and "looplab[frameworks]" in n
               for n in r["notes"]), r["notes"]


def test_peer_specs_are_checked():
    with pytest.raises(TypeError):
        peers.check_role(peers.role("http_client", "c", path="no-slash"))
    with pytest.raises(ValueError):
        peers.check_role(peers.role("http_client", "c", finish="later"))
    with pytest.raises(ValueError):
        peers.check_role(peers.role("ws_subscriber", "w", no_such_field=1))
