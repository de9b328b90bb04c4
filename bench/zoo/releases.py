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
    p = {**PUSH, **{k: v for k, v in ctx.params.items() if k in PUSH}}
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
    p = {**KEEPALIVE, **{k: v for k, v in ctx.params.items() if k in KEEPALIVE}}
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
