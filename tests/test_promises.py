"""Quoted promises: every "documented" loop probe carries the sentence of the asyncio docs
it relies on, and each quote is found in the docs of every release it is quoted from
(docs/sources/asyncio-MINOR/, verbatim excerpts of CPython's Doc/library with their
origin). The probes check one call per result and record exception messages; the
upstream threads the reports cite live in bench/fidelity/threads.json.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys

import pytest

import fakeloops
from bench.fidelity import promises, upstream
from bench.fidelity.classes import classify
from bench.fidelity.registry import PROBES, EdgeProbe
import bench.fidelity.worker  # noqa: F401  (registers every probe)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOOP_PROBES = {n: p for n, p in PROBES.items() if p.standalone}


def test_every_quote_is_found_in_the_docs_of_its_release():
    assert promises.check(PROBES) == []
    quoted = promises.probe_promises(PROBES)
    assert len(quoted) >= 100
    # every documented probe is quoted from each release it runs on (3.11, 3.12, 3.13),
    # or from the first that documents the API onwards
    for name, pr in quoted.items():
        want = [m for m in promises.RELEASES if pr.since is None or m >= pr.since]
        assert sorted(pr.texts) == sorted(want), name


def test_a_quote_that_is_not_in_the_docs_is_reported():
    fake = {"lp_x": EdgeProbe("lp_x", "stream", None, "x", (), documented=promises.doc(
        "eventloop", "asyncio.loop.time", "Return the current time as an integer number of ticks."))}
    problems = promises.check(fake)
    assert len(problems) == 3 and all("not in the" in p and "lp_x" in p for p in problems)
    # the same sentence with its markup and line breaks as the .rst has them is found
    rst = "   Return the current time, as a :class:`float` value, according to\n   the event loop's internal monotonic clock."
    assert promises.found_in("Return the current time, as a float value, according to the event "
                             "loop's internal monotonic clock.", rst)


@pytest.mark.parametrize("rst, plain", [
    (":meth:`loop.call_soon`", "loop.call_soon()"),
    (":meth:`~asyncio.BaseTransport.close`", "close()"),
    (":class:`~asyncio.Future`", "Future"),
    (":meth:`socket.recv() <socket.socket.recv>`", "socket.recv()"),
    ("``None``", "None"),
    ("*sock* must be a\n   non-blocking socket", "sock must be a non-blocking socket"),
    ("Any \\*args and \\*\\*kwargs", "Any *args and **kwargs"),
])
def test_markup_is_read_as_the_rendered_docs_show_it(rst, plain):
    assert promises.normalize(rst) == plain


def test_each_excerpt_names_its_origin_and_holds_only_quoted_paragraphs():
    quoted = promises.probe_promises(PROBES)
    for minor, release in promises.RELEASES.items():
        folder = os.path.join(REPO, "docs", "sources", f"asyncio-{minor}")
        files = sorted(os.listdir(folder))
        assert files, minor
        for name in files:
            header, text = promises.read_excerpt(minor, name[:-4])
            assert header["release"] == release
            assert header["repository"] == "https://github.com/python/cpython"
            assert header["tag"] == f"v{release}" and header["path"] == f"Doc/library/{name}"
            assert header["copied from"]
            # every paragraph kept is quoted, or is the directive a quote belongs to
            texts = [pr.texts[minor] for pr in quoted.values()
                     if pr.page == name[:-4] and minor in pr.texts]
            for _, lines in promises.paragraphs(text):
                body = [ln for ln in lines if not ln.startswith(".. line ")]
                if not body or body[0].startswith((".. looplab", ".. release", ".. [...]")):
                    continue
                para = promises.normalize("\n".join(body))
                assert promises._DIRECTIVE.match(body[0]) or any(
                    promises.normalize(t) in para for t in texts), (minor, name, para[:80])


def test_a_promise_speaks_for_the_releases_that_document_it():
    pr = PROBES["lp_server_close_clients"].documented
    assert pr.since == "3.13" and pr.quote("3.12.1") is None
    q = pr.quote("3.13.0")
    assert q["docs"] == "3.13.0" and "Close all existing incoming client connections" in q["text"]
    assert q["url"] == "https://docs.python.org/3.13/library/asyncio-eventloop.html#asyncio.Server.close_clients"
    assert classify(PROBES["lp_server_close_clients"], "3.11.7") == ("de-facto", None)
    # an interpreter with no excerpt of its own is answered by the nearest earlier one
    assert PROBES["lp_call_soon_order"].documented.quote("3.14.1")["docs"] == "3.13.0"


def test_the_mislabelled_probes_are_de_facto_or_quote_their_promise():
    """Issue 37: four divergences rested on no promise, a fifth on a weak one."""
    for name in ("lp_is_reading_after_eof", "lp_write_buffer_limits", "lp_call_soon_after_close",
                 "lp_write_buffer_size_after_abort", "lp_loop_time_is_time_monotonic"):
        assert PROBES[name].documented is None, name
    # what the docs do promise is its own probe, quoted
    assert "monotonic clock" in PROBES["lp_loop_time_monotonic"].documented.texts["3.12"]
    assert "receiving new data" in PROBES["lp_is_reading_paused"].documented.texts["3.11"]
    assert "forces low to zero" in PROBES["lp_write_buffer_limits_high_zero"].documented.texts["3.13"]
    assert "Raises RuntimeError" in PROBES["lp_call_soon_threadsafe_after_close"].documented.texts["3.11"]
    assert "Buffered data will be lost" in PROBES["lp_abort_loses_buffer"].documented.texts["3.11"]


def test_python_m_check_exits_0_and_counts_the_quotes():
    r = subprocess.run([sys.executable, "-m", "bench.fidelity.excerpts", "check"], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and not r.stderr, r.stdout + r.stderr
    m = re.search(r"(\d+) quotes in (\d+) documented probes; 0 problems", r.stdout)
    assert m and int(m[2]) == len(promises.probe_promises(PROBES))


# ---------------------------------------------------------------------------
# One call per result, messages recorded

def _run(probe, factory):
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(PROBES[probe].fn(asyncio))


def test_each_handle_call_is_its_own_result_with_its_message():
    """rloop 0.5's handle: cancel() returns and does nothing, cancelled() is missing. One
    try around both hid which failed; each is now its own key, with the message."""
    obs = _run("lp_handle_cancelled", fakeloops.no_cancelled)
    assert obs["soon_before"] == {"raised": "AttributeError",
                                  "message": "'_HalfHandle' object has no attribute 'cancelled'"}
    assert obs["later_before"] is False and obs["later_after"] is True
    ran = _run("lp_cancelled_handle_never_runs", fakeloops.no_cancelled)
    assert ran == {"cancel_soon": None, "cancel_later": None, "ran": ["soon"]}
    assert _run("lp_cancelled_handle_never_runs", asyncio.new_event_loop)["ran"] == []


def test_loop_probes_keep_each_call_apart():
    """No loop probe wraps two recorded calls in one try: a try block that records what
    it caught (_raised) holds at most one await or one call of the loop API."""
    import ast
    import inspect
    import textwrap
    for name, p in LOOP_PROBES.items():
        tree = ast.parse(textwrap.dedent(inspect.getsource(p.fn)))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Try):
                continue
            records = any(isinstance(n, ast.Call) and getattr(n.func, "id", "") == "_raised"
                          for h in node.handlers for n in ast.walk(h))
            awaits = sum(isinstance(n, ast.Await) for stmt in node.body for n in ast.walk(stmt))
            assert not records or awaits <= 1, name


def test_a_raised_exception_is_recorded_with_its_message_masked():
    from bench.fidelity.loops import _call, _raised
    r = _raised(ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 43567)"))
    assert r == {"raised": "ConnectionRefusedError",
                 "message": "[Errno 111] Connect call failed ('127.0.0.1', N)"}
    assert _call(lambda: object().nope)["message"] == "'object' object has no attribute 'nope'"
    assert _call(lambda: b"x") == "b'x'" and _call(lambda: object()) == "returned"
    assert "0x" not in _raised(RuntimeError(f"<Handle at {hex(id(r))}>"))["message"][3:]


def test_comparison_ignores_messages_but_reports_show_them():
    import importlib
    measure = importlib.import_module("bench.fidelity.measure")
    a = {"x": {"raised": "ValueError", "message": "one wording"}}
    b = {"x": {"raised": "ValueError", "message": "another"}}
    assert measure.same(a, b) and not measure.same(a, {"x": {"raised": "TypeError", "message": ""}})
    ref, ours = measure._diff({"k": 1, **a}, {"k": 2, **b})
    assert ref == {"k": 1} and ours == {"k": 2}


# ---------------------------------------------------------------------------
# Upstream threads

def test_upstream_lines_say_what_was_searched():
    assert upstream.line("lp_call_later_zero_order", "uvloop") == "thread: uvloop#482, uvloop#704"
    assert upstream.line("lp_remove_reader_returns", "uvloop") == "none found, searched: 2026-11-28"
    assert upstream.line("lp_handle_cancelled", "rloop").startswith("none found, searched: ")
    assert upstream.line("lp_eager_start", "uvloop").startswith("related: uvloop#746")
    assert upstream.line("lp_call_soon_order", "someloop") == "not searched"


def test_the_threads_file_names_real_probes_and_dated_searches():
    with open(upstream.PATH, encoding="utf-8") as f:
        data = json.load(f)
    for probe, loops in data["probes"].items():
        assert probe in PROBES, probe
        for loop, e in loops.items():
            assert re.fullmatch(r"\d{4}-\d\d-\d\d", e["searched"]), (probe, loop)
            for t in e["threads"]:
                assert re.fullmatch(r"[\w.-]+/[\w.-]+#\d+", t), t
