"""Zoo entries at the real framework releases their bugs lived in.

An entry's ``--versions`` rows (bench.zoo.versions) pin the framework's releases. Where
the entry's own programs re-enact the bug in our code (the default ``looplab repro ID``),
its rows run the *real* framework instead, through ``Entry.version_run``:

- on an interpreter below looplab's minimum (aiohttp 1.x needs Python 3.6), in a bare
  environment holding only the pinned releases (bench.host.envs.build_bare), as a
  standalone program file in ``bench/zoo/programs/`` (``Entry.program_file``); looplab's
  peers, in this process's children, measure the wire as in every other cell;
- on a Python looplab runs on, in a pinned environment like any runtime's, as a program
  of the entry's own (the program checks ``job.runtime.pins``).

A version run returns the entry's metrics and its ``bug_shown`` from what the real
release did; the card's rows say what each release is expected to do.
"""
from __future__ import annotations

import os

from bench import peers
from bench.peers import http as _http  # noqa: F401 -- registers the HTTP and WebSocket roles
from bench.scenarios.api import run_program

PROGRAMS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "programs")


def program_path(name: str) -> str:
    return os.path.join(PROGRAMS, name)


def _notes(app: dict) -> list:
    out = [f"real: {k} {app[k]}" for k in ("aiohttp", "twisted", "starlette", "uvicorn",
                                            "sanic", "redis", "httpcore", "websockets")
           if app.get(k)]
    if app.get("python"):
        out.append(f"Python {app['python']} (a standalone program: bench/zoo/programs)")
    return out


# ---------------------------------------------------------------------------
# aiohttp 1367 on aiohttp 1.2.0 / 1.3.0 / 1.3.1

PUSH = {"message_bytes": 10_000, "serve_s": 1.0, "cap_bytes": 16 * 1024 * 1024}


def push_run(ctx):
    """A subscriber that never reads (looplab's ws_subscriber, stalled once upgraded),
    served by the real aiohttp 1.x's websocket send (programs/aiohttp1.py)."""
    p = dict(PUSH)           # the release runs have sizes of their own (not the preset's)
    ctx.params = {**ctx.params, **p}
    ran = run_program(ctx, max_s=p["serve_s"] + 10, peers=[peers.role(
        "ws_subscriber", "stalled", path="/ws", stall_s=p["serve_s"] + 1.5,
        max_s=p["serve_s"] + 2)])
    a, c = ran.app, ran.peers["stalled"]
    peak, err = a.get("write_buffer_peak_bytes"), a.get("send_error")
    m = {"backlog_peak_bytes": peak, "rss_growth_bytes": a.get("rss_growth_bytes"),
         "dropped_count": 0, "broadcasts_count": a.get("sent_messages_count")}
    notes = _notes(a)
    if not c.get("upgraded"):
        return m, {"bug_shown": None}, notes + ["not measured: the websocket handshake did "
                                                "not complete"]
    if err:
        notes.append(f"shown by a crash: the send raised {err}")
        return m, {"bug_shown": True}, notes
    reached = peak is not None and peak >= p["cap_bytes"]
    notes.append(f"the write buffer reached the {p['cap_bytes']} B cap: nothing held the sender "
                 "back" if reached else
                 f"the send {'parked in the drain' if a.get('parked') else 'was held back'} "
                 f"with the write buffer at {peak} B at most")
    return m, {"bug_shown": reached}, notes


# ---------------------------------------------------------------------------
# aiohttp 1221 on aiohttp 1.0.5 / 1.1.0

KEEPALIVE = {"until_requests": 2, "body_bytes": 4096, "shutdown_timeout_s": 1.0,
             "shutdown_bound_s": 3.0, "serve_s": 4.0, "settle_s": 0.1}


def keepalive_run(ctx):
    """Two keep-alive GETs, then an idle connection, then run_app's shutdown order of the
    real aiohttp 1.0/1.1 (programs/aiohttp1.py)."""
    p = dict(KEEPALIVE)
    ctx.params = {**ctx.params, **p}
    bound = p["serve_s"] + p["shutdown_bound_s"] + 4
    ran = run_program(ctx, max_s=bound + 4, peers=[peers.role(
        "http_client", "browser", path=f"/bytes/{p['body_bytes']}", count=p["until_requests"],
        finish="idle", max_s=bound)])
    a, c = ran.app, ran.peers["browser"]
    s, n = a.get("shutdown_s"), c.get("responses_count") or 0
    m = {"shutdown_s": s, "responses_count": n, "idle_eof_after_s": c.get("idle_eof_after_s")}
    notes = _notes(a)
    if c.get("mismatch_bytes"):
        notes.append(f"the client saw {c['mismatch_bytes']} wrong body bytes")
    if n < p["until_requests"]:
        return m, {"bug_shown": None}, notes + ["not measured: the keep-alive connection did "
                                                "not carry every request"]
    return m, {"bug_shown": s is None or s >= 0.8 * p["shutdown_timeout_s"]}, notes


# ---------------------------------------------------------------------------
# Twisted 8868 on Twisted 16.6.0 / 17.1.0

PIPELINE = {"count": 1000, "response_bytes": 16 * 1024, "hold_s": 1.0, "path_bytes": 3000}


def pipeline_run(ctx):
    """``count`` pipelined GETs from a client that never reads (looplab's http_client),
    answered by the real twisted.web (programs/twisted_web.py). Each request carries a
    ``path_bytes`` path, so one read of the server's takes a few requests and not all
    of them: the fix (17.1) stops *reading* while the transport is paused, and what a
    read already took is still answered."""
    p = dict(PIPELINE)
    ctx.params = {**ctx.params, **p}
    path = "/" + "x" * (p["path_bytes"] - 1)
    ran = run_program(ctx, max_s=p["hold_s"] + 10, peers=[peers.role(
        "http_client", "client", path=path, count=p["count"], pipeline=True, read=False,
        hold_s=p["hold_s"] + 1.0, max_s=p["hold_s"] + 2.0)])
    a, c = ran.app, ran.peers["client"]
    request = len(f"GET {path} HTTP/1.1\r\nHost: looplab.test\r\nUser-Agent: looplab-peer\r\n\r\n")
    handled = a.get("requests_handled_count")
    m = {"requests_handled_count": handled, "rss_growth_bytes": a.get("rss_growth_bytes"),
         "peak_user_buffer_bytes": a.get("write_buffer_peak_bytes"),
         "requests_sent_count": (c.get("sent_bytes") or 0) // request}
    notes = _notes(a) + [f"the client got {m['requests_sent_count']} of {p['count']} requests "
                         f"into the socket; the site answered {handled}, its write buffer "
                         f"peaked at {a.get('write_buffer_peak_bytes')} B"]
    if handled is None:
        return m, {"bug_shown": None}, notes + ["not measured: the program reported nothing"]
    return m, {"bug_shown": handled >= p["count"] // 2}, notes


# ---------------------------------------------------------------------------
# starlette 1012 on starlette 0.13.6 / 0.13.7 / 0.13.8 (uvicorn 0.11.8, Python 3.8)

STREAM = {"chunk_bytes": 64 * 1024, "cap_bytes": 16 * 1024 * 1024, "serve_s": 1.5,
          "rate_Bps": 1_000_000, "sockbuf": 64 * 1024}


def stream_run(ctx):
    """A StreamingResponse behind BaseHTTPMiddleware to a client that reads 1 MB/s
    (looplab's http_slow_reader), on the real starlette and uvicorn
    (programs/starlette_stream.py)."""
    p = dict(STREAM)
    ctx.params = {**ctx.params, **p}
    ran = run_program(ctx, max_s=p["serve_s"] + 10, peers=[peers.role(
        "http_slow_reader", "client", path="/stream", rate_Bps=float(p["rate_Bps"]),
        sockbuf=p["sockbuf"], recv_bytes=p["sockbuf"], max_s=p["serve_s"] + 2)])
    a, c = ran.app, ran.peers["client"]
    produced, got = a.get("produced_bytes"), c.get("body_bytes") or 0
    lead = None if produced is None else produced - got
    m = {"app_queue_peak_bytes": lead, "delivered_bytes": got}
    notes = _notes(a) + [f"the generator produced {produced} B, the client got {got} B"]
    if not got:
        return m, {"bug_shown": None}, notes + ["not measured: no body byte reached the client"]
    # the fix holds the generator to a message or two past what the sockets hold
    return m, {"bug_shown": lead is not None and lead > p["cap_bytes"] // 2}, notes


# ---------------------------------------------------------------------------
# redis-py 2624 / 2665 on redis 4.5.1 / 4.5.3 / 4.5.4 (Python 3.10)

CANCEL = {"rounds": 4, "reply_delay_s": 0.2, "cancel_after_s": 0.05}


def cancel_run(ctx):
    """The thread's repro on the real redis-py asyncio client against looplab's
    ``resp_server`` (programs/redis_cancel.py)."""
    from bench.peers import resp as _resp  # noqa: F401 -- registers resp_server
    p = dict(CANCEL)
    ctx.params = {**ctx.params, **p}
    bound = p["rounds"] * (2 * p["reply_delay_s"] + 1) + 5
    ran = run_program(ctx, max_s=bound, peers=[peers.role(
        "resp_server", "redis", reply_delay_s=p["reply_delay_s"], max_s=bound)])
    a, srv = ran.app, ran.peers["redis"]
    n, cancelled = a.get("wrong_replies_count"), a.get("cancelled_count")
    m = {"wrong_replies_count": n, "answered_count": a.get("answered_count"),
         "cancelled_count": cancelled, "connections_opened_count": None}
    notes = _notes(a) + [f"the server answered GETs for {', '.join(srv.get('answered') or []) or 'nothing'}"
                         f" ({srv.get('commands_count')} commands)"]
    if not cancelled:
        return m, {"bug_shown": None}, notes + ["not measured: no command was cancelled"]
    return m, {"bug_shown": n > 0}, notes


# ---------------------------------------------------------------------------
# uvicorn 336 on uvicorn 0.6.1 / 0.7.0 (Python 3.7)

PARKED = {"body_bytes": 20 * 1024 * 1024, "chunk_bytes": 64 * 1024, "serve_s": 4.0,
          "bound_s": 1.0, "vanish_after_bytes": 100_000, "rate_Bps": 400_000, "sockbuf": 64 * 1024}


def parked_run(ctx):
    """A streaming ASGI response to a client that reads slowly and resets mid-body
    (looplab's http_vanish), on the real uvicorn (programs/uvicorn_flow.py)."""
    p = dict(PARKED)
    ctx.params = {**ctx.params, **p}
    ran = run_program(ctx, max_s=p["serve_s"] + p["bound_s"] + 8, peers=[peers.role(
        "http_vanish", "client", path="/", vanish_after_bytes=p["vanish_after_bytes"],
        rate_Bps=float(p["rate_Bps"]), sockbuf=p["sockbuf"], recv_bytes=16384,
        max_s=p["serve_s"])])
    a, c = ran.app, ran.peers["client"]
    released = a.get("released")
    m = {"released": released, "release_reason": "returned" if released else None}
    notes = _notes(a) + [f"the client reset after {c.get('body_bytes')} B ({c.get('ended')}); "
                         f"the app had sent {a.get('sent_bytes')} B"]
    if not a.get("connection_lost") or c.get("ended") != "reset_sent":
        return m, {"bug_shown": None}, notes + ["not measured: the client did not reset "
                                                "mid-response"]
    return m, {"bug_shown": released is False}, notes


# ---------------------------------------------------------------------------
# CPython 74116 (bpo-29930) on Python 3.9 / 3.10, and on websockets 3.2 / 3.3 (Python 3.6)

TWODRAIN = {"writes": 8, "chunk_bytes": 128 * 1024, "sockbuf": 64 * 1024}


def twodrain_run(ctx):
    """Two tasks draining one writer (programs/drain_waiters.py): asyncio's own streams
    on an old Python, or websockets' send() where websockets is pinned."""
    ws = any(pin.startswith("websockets==") for pin in ctx.runtime.pins)
    p = {**TWODRAIN, "mode": "websockets" if ws else "streams", "max_s": 8}
    ctx.params = {**ctx.params, **p}
    role = (peers.role("ws_subscriber", "subscriber", path="/", stall_s=0.3, max_s=p["max_s"])
            if ws else peers.reader(sockbuf=64 * 1024, start_after_s=0.2, max_s=p["max_s"]))
    ran = run_program(ctx, max_s=p["max_s"] + 2, peers=[role])
    a = ran.app
    n = a.get("drain_errors_count")
    notes = _notes(a) + ([a["first_error"]] if a.get("first_error") else [])
    if n is None:
        return {"drain_errors_count": n}, {"bug_shown": None}, notes + [
            "not measured: the program reported nothing"]
    return {"drain_errors_count": n}, {"bug_shown": bool(n)}, notes


# ---------------------------------------------------------------------------
# CPython 86296 on Python 3.6-3.10 (the rows below looplab's minimum)

RACE = {"trials": 12, "offsets": 3, "timeout_s": 5.0, "max_s": 5}


def race_run(ctx):
    """The wait_for race on an old interpreter's asyncio (programs/wait_for_race.py)."""
    p = dict(RACE)
    ctx.params = {**ctx.params, **p}
    a = run_program(ctx, max_s=p["max_s"] + 2).app
    n, trials = a.get("swallowed_count"), a.get("trials_count")
    m = {"swallowed_count": n, "trials_count": trials}
    notes = _notes(a)
    if not trials:
        return m, {"bug_shown": None}, notes + ["not measured: no trial cancelled a running task"]
    return m, {"bug_shown": n is not None and n > 0}, notes


# ---------------------------------------------------------------------------
# sanic 2921 on sanic 23.12.1 / 23.12.2 / 24.6.0 (Python 3.10, uvloop)

CLOSE = {"body_bytes": 1024 * 1024, "rate_Bps": 2_000_000, "sockbuf": 64 * 1024, "serve_s": 4.0}


def close_run(ctx):
    """One large response to a ``Connection: close`` request from a client reading 2 MB/s
    (looplab's http_slow_reader), on the real Sanic (programs/sanic_close.py)."""
    p = dict(CLOSE)
    ctx.params = {**ctx.params, **p}
    ran = run_program(ctx, max_s=p["serve_s"] + 8, peers=[peers.role(
        "http_slow_reader", "reader", path="/big", rate_Bps=float(p["rate_Bps"]), connection="close",
        sockbuf=p["sockbuf"], recv_bytes=p["sockbuf"], max_s=p["serve_s"] + 2)])
    a, c = ran.app, ran.peers["reader"]
    got = c.get("body_bytes") or 0
    m = {"delivered_bytes": got, "lost_bytes": p["body_bytes"] - got, "aborted_with_bytes": None}
    notes = _notes(a) + [f"the client got {got} of {p['body_bytes']} B and its connection "
                         f"ended by {c.get('ended')}"]
    if not a.get("requests_count") or c.get("ended") == "timeout":
        return m, {"bug_shown": None}, notes + ["not measured: the request was not served, or "
                                                "the client ran out of time"]
    return m, {"bug_shown": got < p["body_bytes"]}, notes
