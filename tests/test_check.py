"""``looplab check``: the right verdicts on naive and fixed servers, measured advice, and
bad input that is one line and the right exit code -- with nothing left running.

The four example servers of ``examples/check`` run at the small preset, on real sockets
and (in-process ones) on the simulated network; each test asks only the questions its
server is about. Oracles are generous: a naive server's memory per slow client is many
times the budget, a fixed one's well under it. The frameworks are optional: a missing
one skips its tests with the reason.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EX = os.path.join(ROOT, "examples", "check")
RUN_S = 240


def _needs(*modules):
    for m in modules:
        pytest.importorskip(m, reason=f"{m} is not installed (pip install 'looplab[frameworks]')")


def _strays(marker: str) -> list[str]:
    """Processes whose command line names ``marker`` (a test's own folder)."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
            except OSError:
                continue
            if marker in cmd and "pytest" not in cmd:
                found.append(f"{pid}: {cmd[:160]}")
    return found


def check(tmp_path, *args, preset="small", timeout=RUN_S):
    """``looplab check ARGS`` in ``tmp_path``; (the process result, results.json or None).
    Afterwards nothing that names ``tmp_path`` may still run."""
    out = tmp_path / "out"
    # the options first: after "--" everything is the server's command
    cmd = [sys.executable, "-m", "bench", "check", "--quiet", "--out", str(out)]
    if preset:
        cmd += ["--preset", preset]
    cmd += list(args)
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=timeout)
    doc = json.loads((out / "results.json").read_text()) if (out / "results.json").exists() else None
    assert not _strays(str(tmp_path)), _strays(str(tmp_path))
    return r, doc


def _copy(tmp_path, name: str) -> str:
    """The example copied into the test's folder, so its processes name the folder."""
    dst = tmp_path / name
    shutil.copy(os.path.join(EX, name), dst)
    return str(dst)


def verdicts(doc) -> dict:
    assert doc is not None and len(doc["cells"]) == 1, doc
    return doc["cells"][0]["verdicts"]


def metric(doc, name):
    return doc["cells"][0]["metrics"].get(name)


RAW = ["--send", r"GET 33554432\n", "--healthy", r"raw:GET 65536\n::65536",
       "--shutdown", r"raw:GET 4000000\n::4000000"]


# ---------------------------------------------------------------------------
# The four servers, naive and fixed, on real sockets

def test_push_server_naive_fixed_and_blocking(tmp_path):
    _needs("aiohttp")
    app = _copy(tmp_path, "push_aiohttp.py")
    r, doc = check(tmp_path, f"{app}:naive", "--path", "/feed", "--questions",
                   "backpressure,fairness", "--no-advice")
    assert r.returncode == 0, r.stderr
    assert verdicts(doc) == {"backpressure": False, "fairness": True}
    assert metric(doc, "memory_per_slow_client_bytes") > 1_500_000       # budget 1 MB
    assert "still rising" in doc["cells"][0]["check"]["backpressure"]["evidence"][0]
    r, doc = check(tmp_path, f"{app}:fixed", "--ws", "/ws", "--questions", "backpressure",
                   "--no-advice")
    assert verdicts(doc) == {"backpressure": True}, doc["cells"][0]["notes"]
    assert metric(doc, "memory_per_slow_client_bytes") < 1_000_000
    r, doc = check(tmp_path, f"{app}:blocking", "--path", "/feed", "--questions",
                   "backpressure,fairness", "--no-advice")
    assert verdicts(doc) == {"backpressure": True, "fairness": False}
    assert metric(doc, "healthy_slow_p99_s") > 0.2 > metric(doc, "healthy_alone_p99_s")


def test_starlette_streaming_under_uvicorn(tmp_path):
    _needs("uvicorn", "starlette")
    app = _copy(tmp_path, "stream_starlette.py")
    common = ["--asgi", "--path", "/export", "--healthy", "/export?bytes=65536",
              "--questions", "backpressure,shutdown", "--no-advice"]
    r, doc = check(tmp_path, f"{app}:naive", *common)
    assert r.returncode == 0, r.stderr
    # the whole 8 MB export waits in memory, but uvicorn's graceful stop delivers it
    assert verdicts(doc) == {"backpressure": False, "shutdown": True}
    assert metric(doc, "memory_per_slow_client_bytes") > 4_000_000
    r, doc = check(tmp_path, f"{app}:fixed", *common)
    assert verdicts(doc) == {"backpressure": True, "shutdown": True}, doc["cells"][0]["notes"]


def test_raw_protocol_server(tmp_path):
    app = _copy(tmp_path, "protocol_server.py")
    r, doc = check(tmp_path, f"{app}:naive", *RAW, "--questions", "backpressure,shutdown",
                   "--no-advice")
    assert r.returncode == 0, r.stderr
    assert verdicts(doc) == {"backpressure": False, "shutdown": False}
    assert metric(doc, "memory_per_slow_client_bytes") > 16_000_000     # its 32 MB answer
    assert metric(doc, "shutdown_received_bytes") < 4_000_000
    r, doc = check(tmp_path, f"{app}:fixed", *RAW, "--questions", "backpressure,shutdown",
                   "--no-advice")
    assert verdicts(doc) == {"backpressure": True, "shutdown": True}, doc["cells"][0]["notes"]
    assert metric(doc, "shutdown_received_bytes") == 4_000_000


def test_streams_server_that_shuts_down_in_process_and_as_a_command(tmp_path):
    app = _copy(tmp_path, "streams_shutdown.py")
    for version, holds in (("naive", False), ("fixed", True)):
        r, doc = check(tmp_path, f"{app}:{version}", *RAW, "--questions", "shutdown",
                       "--no-advice")
        assert r.returncode == 0, r.stderr
        assert verdicts(doc) == {"shutdown": holds}, doc["cells"][0]["notes"]
        # a command's sockets are not pinned: the kernel's send buffer (4 MB by default)
        # could hold a whole 4 MB answer, so the command is asked for 16 MB
        r, doc = check(tmp_path, *RAW[:4], "--shutdown", r"raw:GET 16000000\n::16000000",
                       "--questions", "shutdown", "--",
                       sys.executable, app, version, "--port", "{port}")
        assert r.returncode == 0, r.stderr
        assert verdicts(doc) == {"shutdown": holds}, doc["cells"][0]["notes"]
        assert doc["cells"][0]["runtime"] == "command"
        if not holds:
            ev = doc["cells"][0]["check"]["shutdown"]["evidence"][0]
            assert "signal 15" in ev          # SIGTERM's default action ended it


# ---------------------------------------------------------------------------
# The in-process servers on the simulated network

SIM = [
    ("push_aiohttp.py", "naive", ["--path", "/feed"], "backpressure", False, ("aiohttp",)),
    ("push_aiohttp.py", "fixed", ["--path", "/feed"], "backpressure", True, ("aiohttp",)),
    ("push_aiohttp.py", "blocking", ["--path", "/feed"], "fairness", False, ("aiohttp",)),
    ("stream_starlette.py", "naive", ["--asgi", "--path", "/export", "--healthy",
                                      "/export?bytes=65536"], "backpressure", False,
     ("uvicorn", "starlette")),
    ("stream_starlette.py", "fixed", ["--asgi", "--path", "/export", "--healthy",
                                      "/export?bytes=65536"], "backpressure", True,
     ("uvicorn", "starlette")),
    ("protocol_server.py", "naive", RAW, "backpressure,shutdown", False, ()),
    ("protocol_server.py", "fixed", RAW, "backpressure,shutdown", True, ()),
    ("streams_shutdown.py", "naive", RAW, "shutdown", False, ()),
    ("streams_shutdown.py", "fixed", RAW, "shutdown", True, ()),
]


@pytest.mark.parametrize("name, version, args, questions, holds, needs", SIM,
                         ids=[f"{s[0][:-3]}-{s[1]}" for s in SIM])
def test_in_process_servers_on_the_simulated_network(tmp_path, name, version, args, questions,
                                                     holds, needs):
    _needs(*needs)
    loop = ["--loop", "looplab"] if version == "fixed" else []     # both sim-capable loops
    r, doc = check(tmp_path, f"{os.path.join(EX, name)}:{version}", *args, "--questions",
                   questions, "--net", "sim", "--no-advice", *loop)
    assert r.returncode == 0, r.stderr
    assert doc["cells"][0]["params"]["net"] == "sim"
    assert verdicts(doc) == {q: holds for q in questions.split(",")}, doc["cells"][0]["notes"]


def test_a_simulated_run_is_replayed_by_its_seed(tmp_path):
    runs = []
    for i in range(2):
        (tmp_path / str(i)).mkdir()
        r, doc = check(tmp_path / str(i), f"{EX}/protocol_server.py:naive", *RAW, "--questions",
                       "backpressure,shutdown", "--net", "sim", "--seed", "7", "--no-advice")
        assert r.returncode == 0, r.stderr
        runs.append(doc["cells"][0])
    assert runs[0]["params"]["seed"] == 7
    for key in ("shutdown_received_bytes", "shutdown_received_before_stop_bytes",
                "healthy_slow_p99_s"):
        assert runs[0]["metrics"].get(key) == runs[1]["metrics"].get(key), key
    assert runs[0]["verdicts"] == runs[1]["verdicts"]
    # the heap figure also counts the interpreter's own allocations, which vary by a few
    # hundred bytes between processes (hash randomization): equal to 0.1 %, not the byte
    a, b = (r["metrics"]["memory_per_slow_client_bytes"] for r in runs)
    assert abs(a - b) <= 1e-3 * max(a, b), (a, b)


# ---------------------------------------------------------------------------
# Advice, measured

def test_advice_names_a_setting_that_fits_the_budget(tmp_path):
    _needs("aiohttp")
    app = _copy(tmp_path, "push_aiohttp.py")
    r, doc = check(tmp_path, f"{app}:naive", "--path", "/feed", "--questions",
                   "backpressure,fairness", "--advise", "app.queue_max=4,16")
    assert r.returncode == 0, r.stderr
    cell = doc["cells"][0]
    assert cell["verdicts"]["backpressure"] is False
    advice = [a for a in cell["advice"] if a["question"] == "backpressure"]
    assert len(advice) == 1 and advice[0]["setting"] in ("app.queue_max=4", "app.queue_max=16")
    after = [t for t in advice[0]["tried"] if t["setting"] == advice[0]["setting"]][0]
    assert after["holds"] and after["memory_per_slow_client_bytes"] <= 1_000_000
    assert "memory per slow client" in advice[0]["text"] and "->" in advice[0]["text"]
    assert "advice (backpressure): app.queue_max=" in r.stdout


# ---------------------------------------------------------------------------
# Bad input, and a server that dies

def _one_line(r, code, words):
    assert r.returncode == code, (r.returncode, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("looplab:")]
    assert len(lines) == 1 and words in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_an_app_that_does_not_import_is_one_line(tmp_path):
    (tmp_path / "broken.py").write_text("import no_such_module_for_looplab\n")
    r, doc = check(tmp_path, f"{tmp_path}/broken.py:app", "--path", "/", timeout=60)
    _one_line(r, 2, "does not import: ModuleNotFoundError")
    assert doc is None and not (tmp_path / "out").exists()


def test_a_command_that_never_listens_is_bounded(tmp_path):
    t0 = time.monotonic()
    r, _ = check(tmp_path, "--send", r"x\n", "--start-timeout", "1", "--",
                 sys.executable, "-c", "import time, sys; time.sleep(60)", str(tmp_path),
                 "{port}", timeout=60)
    _one_line(r, 2, "did not listen on 127.0.0.1:")
    assert time.monotonic() - t0 < 30


def test_a_port_in_use_and_a_bad_out_are_refused_before_anything_runs(tmp_path):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    try:
        r, _ = check(tmp_path, f"{EX}/protocol_server.py:fixed", *RAW, "--port",
                     str(busy.getsockname()[1]), timeout=60)
    finally:
        busy.close()
    _one_line(r, 2, "is in use")
    (tmp_path / "afile").write_text("")
    r = subprocess.run([sys.executable, "-m", "bench", "check", f"{EX}/protocol_server.py:fixed",
                        *RAW, "--out", str(tmp_path / "afile")], capture_output=True, text=True,
                       timeout=60, cwd=tmp_path)
    _one_line(r, 2, "--out")
    for args, words in ((["--net", "sim", "--", "true", "{port}"], "in-process APP"),
                        ([f"{EX}/protocol_server.py:fixed", "--net", "sim", "--loop", "uvloop"],
                         "real sockets only"),
                        ([f"{EX}/protocol_server.py:fixed", "--questions", "speed"], "unknown"),
                        ([f"{EX}/protocol_server.py:fixed", "--set", "app.nope=1"], "app.nope")):
        r, _ = check(tmp_path, *RAW[:2], *args, timeout=60)
        _one_line(r, 2, words)


DIES = """
import os, socket, sys, threading
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", int(sys.argv[1])))
ls.listen(16)

def serve(c):
    try:
        for line in c.makefile("rb"):
            c.sendall(bytes(int(line.split()[1])))
    except OSError:
        pass

n = 0
while True:
    c, _ = ls.accept()
    n += 1
    if n >= 3:
        print("crashed on purpose", file=sys.stderr)
        os._exit(3)
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""


def test_a_server_that_dies_mid_check_fails_with_the_cause(tmp_path):
    script = tmp_path / "dies.py"
    script.write_text(DIES)
    args = ["--send", r"GET 1000000\n", "--no-advice", "--", sys.executable, str(script), "{port}"]
    r, doc = check(tmp_path, *args)
    assert r.returncode == 0, r.stderr
    cell = doc["cells"][0]
    assert cell["verdicts"]["backpressure"] is False
    assert cell["verdicts"]["shutdown"] is None and cell["verdicts"]["faults"] is None
    assert "died (exit code 3): crashed on purpose" in cell["check"]["backpressure"]["evidence"][0]
    assert any("not run: the server died" in e for e in cell["errors"])
    r, doc = check(tmp_path, *args[:-4], "--fail-on", "verdict", *args[-4:])
    assert r.returncode == 1


def test_sigint_keeps_what_was_measured(tmp_path):
    app = _copy(tmp_path, "protocol_server.py")
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "bench", "check", f"{app}:fixed", *RAW,
                             "--questions", "backpressure,fairness,shutdown", "--window", "6",
                             "--no-advice", "--out", str(out)],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(5)           # within the slow clients' window
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    doc = json.loads((out / "results.json").read_text())
    assert doc["incomplete"]["reason"] == "interrupted"
    assert doc["cells"][0]["interrupted"] is True
    time.sleep(0.5)
    assert not _strays(str(tmp_path)), _strays(str(tmp_path))


# ---------------------------------------------------------------------------
# The judgements themselves

def test_memory_growth_that_keeps_rising_fails_and_a_plateau_holds():
    from bench.check.questions import judge_memory
    rising = [(t / 10, 1_000_000 + t * 200_000) for t in range(21)]     # +4 MB over 2 s
    ok, per, up, text = judge_memory(rising, 1_000_000, 1, 1_000_000, 0.0, 2.0)
    assert (ok, up) == (False, True) and per == 4_000_000 and "still rising" in text
    flat = [(t / 10, 1_000_000 + min(t, 3) * 100_000) for t in range(21)]
    ok, per, up, _ = judge_memory(flat, 1_000_000, 1, 1_000_000, 0.0, 2.0)
    assert (ok, up, per) == (True, False, 300_000)
    over = [(t / 10, 1_000_000 + min(t, 3) * 1_000_000) for t in range(21)]    # flat at 3 MB
    ok, per, up, _ = judge_memory(over, 1_000_000, 1, 1_000_000, 0.0, 2.0)
    assert (ok, up) == (False, False)
    assert judge_memory(flat[:2], 1_000_000, 1, 1_000_000, 0.0, 2.0)[0] is None


def test_latency_beside_slow_clients_is_judged_against_alone():
    from bench.check.questions import judge_latency
    alone = [0.002] * 50
    assert judge_latency(alone, [0.003] * 50, 3.0, 0.005)[0] is True
    ok, figs, text = judge_latency(alone, [0.002] * 45 + [0.9] * 5, 3.0, 0.005)
    assert ok is False and figs["slow_p99_s"] == 0.9 and "limit x3" in text
    assert judge_latency(alone[:3], alone, 3.0, 0.005)[0] is None          # too few alone
    assert judge_latency(alone, [2.0], 3.0, 0.005)[0] is False              # one wait is enough
    assert judge_latency(alone, [0.001], 3.0, 0.005)[0] is None             # to fail, not to pass


def test_endpoints_parse_as_documented():
    from bench.check.target import parse_endpoint
    from bench.errors import UsageError
    ep = parse_endpoint("raw", r"GET 4096\n::4096", "--send")
    assert (ep.kind, ep.target, ep.declared) == ("raw", "GET 4096\n", 4096)
    assert ep.label == r"send 'GET 4096\n' (4,096 B)"
    assert parse_endpoint("any", "ws:/ws", "--healthy").kind == "ws"
    assert parse_endpoint("any", "/x?y=1", "--healthy").target == "/x?y=1"
    with pytest.raises(UsageError):
        parse_endpoint("http", "feed", "--path")
