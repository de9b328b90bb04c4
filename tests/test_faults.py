"""The fault matrix: every app on every runtime against every faulty peer.

Each case starts one ``looplab serve APP --runtime R`` through the ``looplab faults``
verb (``--serve``), runs every fault of bench/peers/faults.py against that one server,
and requires: a healthy client served correctly after each fault, the server's fds
back where they were, SIGTERM -> exit 0, no traceback on stderr.

Scale, smaller than the verb's defaults so the file stays short on a 2-core machine:
300 idle connections instead of 1,000, a burst of 100 instead of 200, peers held 0.1 s
instead of 1 s, the healthy client and a half-close's EOF given 2 s instead of 5, a
leak judged after 1 s instead of 3. Known failing cases stop at their first failed
fault (``--fail-fast``): they only have to fail.

KNOWN_FAILURES lists the cases that fail because of a library's own behaviour (shown
with that library alone in tests/test_drivers.py), as strict xfails: when one starts
passing, pytest reports XPASS(strict) as a failure and the entry is removed. A driver
defect is fixed, never listed.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from bench import cli
from bench.verbs import faults
from bench import runtimes

RUNTIMES = ["callback", "hybrid", "coro", "asyncio-protocol", "asyncio-streams",
            "uvloop-protocol", "uvloop-streams", "curio", "trio"]
APPS = ["echo", "sink", "reqresp", "proxy",
        "push/unbounded", "push/block", "push/drop", "push/disconnect"]
SMALL = ["--idle-many", "300", "--burst", "100", "--hold", "0.1", "--timeout", "2",
         "--settle", "1", "--quiet"]

# Cases that fail because of a library's own behaviour, each with its minimal
# reproduction (the library alone) in tests/test_drivers.py. None today: every
# case failing for a driver defect was fixed.
KNOWN_FAILURES: dict = {}

# Cases that once failed only on a race (uvloop-streams push: about one pass in ten
# missed it): they run five rounds, so a regression there is caught.
RACY = {(f"push/{p}", "uvloop-streams") for p in ("unbounded", "block", "drop", "disconnect")}


def _unavailable(rt: str) -> str | None:
    return runtimes.parse(rt).unavailable_reason()


# The uvloop-streams push cases once failed about one full matrix in seven (a
# ConnectionResetError traceback from StreamReader.read on the server's stderr, cause
# not found). They were non-strict xfails, which can never fail; a strict xfail would
# fail on every pass. They run as ordinary cases now: five rounds each (RACY), and a
# failure is a failure, with the server's stderr in its message.


def _cases():
    for rt in RUNTIMES:
        for app in APPS:
            marks = []
            reason = KNOWN_FAILURES.get((app, rt))
            if reason:
                marks.append(pytest.mark.xfail(strict=True, reason=reason))
            yield pytest.param(app, rt, marks=marks, id=f"{app}-{rt}")


def _verb(argv) -> int:
    return cli.main(["faults"] + [str(a) for a in argv])


def _failures(doc: dict) -> str:
    lines = [f"{r['fault']}: {'; '.join(r['notes']) or 'not survived'}"
             for r in doc.get("rows", []) if not r["survived"]]
    if doc.get("final_fds") is not None and doc["final_fds"] > doc["baseline_fds"]:
        lines.append(f"fds {doc['baseline_fds']} -> {doc['final_fds']}")
    if doc.get("sigterm_exit") not in (130, None) or doc.get("stderr_traceback"):
        lines.append(f"SIGTERM exit {doc.get('sigterm_exit')}, stderr: {doc.get('stderr_tail', '')[-500:]}")
    return "\n".join(lines)


def _run_case(app: str, rt: str, folder) -> tuple[int, dict]:
    name, _, variant = app.partition("/")
    out = folder / "faults.json"
    argv = ["--serve", rt, "--app", name, "--json", out, *SMALL]
    if variant:
        argv += ["--variant", variant]
    if (app, rt) in KNOWN_FAILURES:
        argv.append("--fail-fast")
    if (app, rt) in RACY:
        argv += ["--rounds", "5"]
    rc = _verb(argv)
    return rc, (json.loads(out.read_text()) if out.exists() else {})


@pytest.fixture(scope="module")      # torn down (and leak-checked) when this file ends
def matrix_runs(request, tmp_path_factory):
    """The selected matrix cases, run two at a time in the background (each case is
    mostly waiting on its server), in the order pytest will ask for them. The leak
    check that the per-test fixture makes is made here, once, for all of them."""
    from concurrent.futures import ThreadPoolExecutor
    from conftest import _children, _fds, leaks_since
    import threading
    wanted = [item.callspec.params for item in request.session.items
              if getattr(item, "originalname", None) == "test_fault_matrix"]
    before = _fds(), set(threading.enumerate()), _children()
    pool = ThreadPoolExecutor(2, thread_name_prefix="fault-matrix")
    futures = {}
    for p in wanted:
        key = (p["app"], p["rt"])
        if key not in futures and _unavailable(p["rt"]) is None:
            folder = tmp_path_factory.mktemp("faults")
            futures[key] = pool.submit(_run_case, p["app"], p["rt"], folder)
    yield futures
    for f in futures.values():
        f.cancel()
    pool.shutdown(wait=True)
    problems = leaks_since(*before)
    assert not problems, "the fault matrix leaked: " + "; ".join(problems)


@pytest.mark.allow_leaks      # checked once for the whole matrix, in matrix_runs
@pytest.mark.timeout(300)
@pytest.mark.parametrize("app,rt", list(_cases()))
def test_fault_matrix(app, rt, matrix_runs):
    reason = _unavailable(rt)
    if reason:
        pytest.skip(reason)
    rc, doc = matrix_runs[(app, rt)].result(timeout=280)
    assert doc, f"no JSON written (exit {rc})"
    assert rc == 0 and doc["ok"], f"{app} on {rt} did not survive:\n{_failures(doc)}"
    assert [r["fault"] for r in doc["rows"]] == list(faults.faultpeers.FAULTS)
    assert doc["sigterm_exit"] == 130 and not doc["stderr_traceback"]   # interrupted, cleanly
    assert doc["final_fds"] <= doc["baseline_fds"]


# ---------------------------------------------------------------------------
# The verb against servers that are not looplab's

_LEAKY = textwrap.dedent("""
    import socket, sys, time
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(512)
    print("listening on %s:%d" % ls.getsockname(), flush=True)
    kept = []                       # accepted and never closed: the leak under test
    ls.settimeout(0.5)
    end = time.monotonic() + 60
    while time.monotonic() < end:
        try:
            kept.append(ls.accept()[0])
        except socket.timeout:
            pass
""")


@pytest.fixture
def leaky_server():
    proc = subprocess.Popen([sys.executable, "-c", _LEAKY], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        host, port = line.split()[-1].rsplit(":", 1)
        yield f"{host}:{port}", proc.pid
    finally:
        proc.kill()
        proc.wait(5)
        proc.stdout.close()


@pytest.mark.timeout(60)
def test_leaky_server_is_reported(leaky_server, tmp_path, capsys):
    addr, pid = leaky_server
    out = tmp_path / "leak.json"
    rc = _verb([addr, "--app", "raw", "--pid", pid, "--faults", "reset,idle,burst",
                "--burst", "20", "--hold", "0.2", "--settle", "0.5", "--json", out, "--quiet"])
    assert rc == 1
    doc = json.loads(out.read_text())
    rows = {r["fault"]: r for r in doc["rows"]}
    assert rows["burst"]["fd_growth_count"] >= 20 and not rows["burst"]["survived"]
    assert rows["reset"]["fd_growth_count"] >= 1
    table = capsys.readouterr().out
    assert "burst" in table and "NOT back to baseline" in table


@pytest.mark.timeout(60)
def test_coro_echo_passes_the_default_faults(capsys):
    rc = _verb(["--serve", "coro", "--app", "echo", "--idle-many", "300", "--hold", "0.2",
                "--quiet"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "every fault survived" in out and "SIGTERM: exit 130" in out


@pytest.mark.timeout(60)
def test_own_server_with_pid(tmp_path, capsys):
    """The way a user runs it: their server already up, its pid given."""
    srv = faults.ServedServer("reqresp", "callback")
    try:
        rc = _verb(["%s:%d" % srv.address, "--app", "reqresp", "--pid", srv.pid,
                    "--faults", "garbage,long-line,half-close", "--hold", "0.2", "--quiet"])
    finally:
        assert srv.stop() == 130      # stopped by SIGTERM: interrupted
        srv.close()
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "fds:" in out


@pytest.mark.timeout(60)
def test_own_proxy_with_upstream(capsys):
    """--app proxy on a proxy the user started: the verb listens as its upstream."""
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    up = "%s:%d" % s.getsockname()
    s.close()
    srv = faults.ServedServer("proxy", "callback", upstream=("127.0.0.1", int(up.split(":")[1])))
    try:
        rc = _verb(["%s:%d" % srv.address, "--app", "proxy", "--upstream", up, "--pid", srv.pid,
                    "--faults", "reset,half-close,burst", "--burst", "20", "--quiet"])
    finally:
        assert srv.stop() == 130      # stopped by SIGTERM: interrupted
        srv.close()
    out = capsys.readouterr().out
    assert rc == 0, out


@pytest.mark.timeout(90)
def test_stress_small(tmp_path):
    out = tmp_path / "stress.json"
    rc = _verb(["--stress", "--serve", "ours", "--app", "echo", "--connections", "100",
                "--duration", "2", "--json", out, "--quiet"])
    doc = json.loads(out.read_text())
    assert rc == 0, doc
    assert [r["runtime"] for r in doc["rows"]] == ["callback", "hybrid", "coro"]
    for row in doc["rows"]:
        assert row["held_count"] == 100 and row["mismatches_count"] == 0
        assert row["min_round_trips_count"] > 0 and row["sigterm_exit"] == 130


# ---------------------------------------------------------------------------
# Bad input: one line, exit 2 (3 for a missing library), before anything runs

def _closed_port() -> str:
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"127.0.0.1:{port}"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("argv,words", [
    (["127.0.0.1:1", "--app", "nope"], "invalid choice"),
    (["--serve", "coro", "--app", "echo", "--faults", "reset,explode"], "unknown fault 'explode'"),
    (["localhostt:99", "--app", "echo"], "bad address"),
    (["127.0.0.1", "--app", "echo"], "bad address"),
    (["CLOSED", "--app", "echo"], "nothing is listening"),
    (["--serve", "nosuch", "--app", "echo"], "unknown runtime 'nosuch'"),
    (["--serve", "coro", "--app", "raw"], "not raw"),
    (["--serve", "coro", "--app", "push", "--variant", "sideways"], "unknown variant"),
    (["--app", "echo"], "HOST:PORT"),
    (["--serve", "coro", "--app", "echo", "--json", "/proc/looplab/x.json"], "cannot write there"),
    (["--serve", "coro", "--app", "echo", "--rounds", "0"], "--rounds"),
])
def test_bad_input_is_one_line_exit_2(argv, words, capsys):
    argv = [_closed_port() if a == "CLOSED" else a for a in argv]
    t0 = time.monotonic()
    try:
        rc = _verb(argv)
    except SystemExit as exc:        # argparse's own checks (choices) exit from parse_args
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2, err
    assert words in err and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    assert time.monotonic() - t0 < 10


@pytest.mark.timeout(30)
def test_bad_pid_for_a_live_server(capsys):
    srv = faults.ServedServer("echo", "coro")
    try:
        rc = _verb(["%s:%d" % srv.address, "--app", "echo", "--pid", "999999999"])
    finally:
        srv.stop()
        srv.close()
    err = capsys.readouterr().err
    assert rc == 2 and "no such running process" in err


@pytest.mark.timeout(30)
def test_missing_library_is_exit_3(monkeypatch, capsys):
    monkeypatch.setattr(runtimes.Runtime, "unavailable_reason",
                        lambda self: "trio is not importable (test)" if self.id == "trio" else None)
    rc = _verb(["--serve", "trio", "--app", "echo"])
    err = capsys.readouterr().err
    assert rc == 3 and "trio is not importable" in err


@pytest.mark.timeout(30)
def test_help_lists_every_fault(capsys):
    with pytest.raises(SystemExit) as exc:
        _verb(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for name in faults.faultpeers.FAULTS:
        assert name in out


def test_json_write_is_atomic(tmp_path):
    path = tmp_path / "r.json"
    path.write_text("old")
    faults._write_json(str(path), {"a": 1})
    assert json.loads(path.read_text()) == {"a": 1}
    assert os.listdir(tmp_path) == ["r.json"]


@pytest.mark.timeout(90)
def test_the_peak_during_a_stall_tells_a_server_without_backpressure(tmp_path):
    """``--faults stall --pid PID``: the callback echo queues what it cannot send (no
    backpressure on its naive variant) and frees it on the reset, so its RSS after
    settling is flat; its peak during the fault is megabytes. coro's send_all blocks:
    no such peak."""
    peaks = {}
    for rt in ("callback", "coro"):
        srv = faults.ServedServer("echo", rt)
        out = tmp_path / f"{rt}.json"
        try:
            rc = _verb(["%s:%d" % srv.address, "--app", "echo", "--pid", srv.pid,
                        "--faults", "stall", "--hold", "0.5", "--json", out, "--quiet"])
        finally:
            srv.stop()
            srv.close()
        assert rc == 0
        (row,) = json.loads(out.read_text())["rows"]
        peaks[rt] = row["rss_peak_bytes"]
        assert row["rss_growth_bytes"] < 1_000_000, row      # settled: nothing to see there
    assert peaks["callback"] > 2_000_000 > peaks["coro"], peaks
