"""The command line as a user meets it: serve on every runtime, byte-exact through
echo and through the proxy; bad input is one line and the documented exit code."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading

import pytest

LOOPLAB = [sys.executable, "-m", "bench"]


def _looplab(*args, timeout=30):
    return subprocess.run(LOOPLAB + list(args), capture_output=True, text=True, timeout=timeout)


class Served:
    """``looplab serve`` in a child process; always ended on exit."""

    def __init__(self, *args):
        self.proc = subprocess.Popen(LOOPLAB + ["serve", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline().strip()
        assert line.startswith("listening on "), (line, self.proc.stderr.read() if self.proc.poll() is not None else "")
        host, port = line.rsplit(" ", 1)[1].rsplit(":", 1)
        self.addr = (host, int(port))

    def stop(self, sig=signal.SIGTERM, timeout=10) -> tuple[int, str]:
        if self.proc.stderr.closed:
            return self.proc.returncode, ""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        err = self.proc.stderr.read()
        self.proc.stdout.close()
        self.proc.stderr.close()
        return rc, err

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def _roundtrip(addr, payload: bytes, timeout=20.0) -> bytes:
    """Send payload (then EOF) while reading everything back."""
    with socket.create_connection(addr, timeout=timeout) as s:
        t = threading.Thread(target=lambda: (s.sendall(payload), s.shutdown(socket.SHUT_WR)))
        t.start()
        got = bytearray()
        while chunk := s.recv(65536):
            got += chunk
        t.join(timeout)
    return bytes(got)


def _payload(n: int, seed: int = 0) -> bytes:
    return bytes((i * 7 + seed) % 251 for i in range(256)) * (n // 256)


def test_echo_through_serve_is_byte_exact(runtime):
    with Served("echo", "--runtime", runtime.spec) as srv:
        results = []
        threads = [threading.Thread(target=lambda k=k: results.append(
            _roundtrip(srv.addr, _payload(256 * 1024, k)) == _payload(256 * 1024, k))) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        rc, err = srv.stop()
    assert results == [True] * 8
    assert rc == 130, err        # stopped by a signal: interrupted (README, exit codes)


def test_proxy_relays_one_connection_then_exits(runtime):
    """The post's program: one connection, copy until EOF, then the program ends."""
    sink = socket.socket()
    sink.bind(("127.0.0.1", 0))
    sink.listen(1)
    sink.settimeout(20)
    got = bytearray()

    def serve_sink():
        conn, _ = sink.accept()
        with conn:
            conn.settimeout(20)
            while chunk := conn.recv(65536):
                got.extend(chunk)

    t = threading.Thread(target=serve_sink)
    t.start()
    payload = _payload(1024 * 1024)
    try:
        with Served("proxy", "--runtime", runtime.spec, "--variant", "fixed",
                    "--upstream", "%s:%d" % sink.getsockname()) as srv:
            with socket.create_connection(srv.addr, timeout=20) as c:
                c.sendall(payload)
                c.shutdown(socket.SHUT_WR)
                c.recv(1)    # the proxy closes us once it is done
            rc = srv.proc.wait(20)     # exits by itself: one connection only
            assert rc == 0, srv.proc.stderr.read()
        t.join(20)
    finally:
        sink.close()
    assert bytes(got) == payload


def test_proxy_upstream_by_name_is_resolved_up_front():
    """``--upstream localhost:P`` works on every port style, callback included."""
    with Served("echo", "--runtime", "asyncio-protocol") as upstream:
        for rt in ("callback", "hybrid", "coro"):
            with Served("proxy", "--runtime", rt, "--two-way", "--forever",
                        "--upstream", "localhost:%d" % upstream.addr[1]) as proxy:
                assert _roundtrip(proxy.addr, _payload(64 * 1024), timeout=10) == _payload(64 * 1024)
                rc, err = proxy.stop()
                assert rc == 130, err


def test_two_way_proxy_echoes_through_upstream(runtime):
    with Served("echo", "--runtime", "asyncio-protocol") as upstream:
        with Served("proxy", "--runtime", runtime.spec, "--two-way", "--forever",
                    "--upstream", "%s:%d" % upstream.addr) as proxy:
            assert _roundtrip(proxy.addr, _payload(512 * 1024)) == _payload(512 * 1024)
            rc, err = proxy.stop()
            assert rc == 130, err


def test_upstream_refused_is_one_line_and_server_survives(runtime):
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    dead = free.getsockname()
    free.close()     # nothing listens there now
    with Served("proxy", "--runtime", runtime.spec, "--forever", "--upstream", "%s:%d" % dead) as srv:
        for _ in range(2):
            with socket.create_connection(srv.addr, timeout=10) as c:
                c.settimeout(10)
                try:
                    assert c.recv(1) == b""
                except ConnectionResetError:
                    pass
        assert srv.proc.poll() is None, "a refused upstream must not end the server"
        rc, err = srv.stop()
    assert rc == 130
    lines = [ln for ln in err.splitlines() if "upstream" in ln]
    assert lines and "Traceback" not in err


def test_port_in_use_is_one_line_exit_2():
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    try:
        r = _looplab("serve", "echo", "--runtime", "asyncio-protocol", "--listen",
                     "127.0.0.1:%d" % holder.getsockname()[1])
    finally:
        holder.close()
    assert r.returncode == 2
    assert "port in use" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args, needle", [
    (["serve", "echo", "--runtime", "nope"], "valid runtimes"),
    (["--bogus"], "unrecognized"),
    (["serve", "echo", "--runtime", "coro:bogus=1"], "valid options"),
    (["serve", "echo", "--runtime", "coro", "--variant", "weird"], "valid"),
    (["run", "--scenarios", "S99"], "valid scenarios"),
    (["run", "--preset", "huge"], "its presets"),
    (["run", "--repeat", "0"], "--repeat"),
    (["run", "--jobs", "0"], "--jobs"),
    (["serve", "echo", "--runtime", "coro", "--sockbuf", "-1"], "--sockbuf"),
    (["serve", "proxy", "--runtime", "callback", "--upstream", "no-such-host.invalid:80"],
     "cannot resolve"),
    (["--out", "x", "list", "runtimes"], "writes no report folder"),
    (["compare", "a.json"], "required"),
    (["list", "cells", "--shard", "3/2"], "bad shard"),
    (["run", "--scenarios", "S1", "--variants", "odd"], "valid variants"),
    (["list", "cells", "--runtimes", "nope"], "valid runtimes"),
])
def test_user_mistakes_are_one_line_exit_2(args, needle):
    r = _looplab(*args)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_unwritable_out_fails_before_any_cell(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    r = _looplab("run", "--scenarios", "S4", "--runtimes", "asyncio-protocol", "--out", str(blocker / "sub"))
    assert r.returncode == 2 and "cannot write" in r.stderr
    assert "cells" not in r.stdout


def test_list_runtimes_shows_options_and_every_id():
    r = _looplab("list", "runtimes")
    assert r.returncode == 0
    from bench.runtimes import RUNTIMES
    for rid in RUNTIMES:
        assert any(line.startswith(rid + " ") for line in r.stdout.splitlines()), rid
    for opt in ("high_water=65536", "io_schedule_point=false", "ready_order=fifo", "drain=asyncio"):
        assert opt in r.stdout


def test_python_m_bench_is_looplab():
    r = subprocess.run([os.path.join(os.path.dirname(sys.executable), "looplab"), "list", "apps"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout == _looplab("list", "apps").stdout


@pytest.mark.parametrize("verb", ["list", "run", "serve", "trace", "report", "compare",
                                  "merge", "validate", "bench"])
def test_every_verb_has_help(verb):
    r = _looplab(verb, "--help")
    assert r.returncode == 0 and "usage: looplab " + verb in r.stdout


def _closed_by_server(sock) -> bool:
    sock.settimeout(10)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


@pytest.mark.parametrize("app, extra, garbage", [
    ("sink", ["--frame-bytes", "1024"], b"GARBAGE!" * 16),
    ("reqresp", ["--response-bytes", "100"], b"HELLO there\n"),
])
def test_malformed_input_closes_that_connection_only(runtime, app, extra, garbage):
    from protocols.cores import encode_frame
    with Served(app, "--runtime", runtime.spec, *extra) as srv:
        good = socket.create_connection(srv.addr, timeout=10)
        bad = socket.create_connection(srv.addr, timeout=10)
        try:
            bad.sendall(garbage)
            assert _closed_by_server(bad)
            if app == "sink":
                good.sendall(b"".join(encode_frame(i, 0.0, 1024) for i in range(3)))
                good.shutdown(socket.SHUT_WR)
                assert _closed_by_server(good)      # it closes after a clean EOF
            else:
                good.sendall(b"REQ 1\n")
                got = b""
                while len(got) < 100:
                    chunk = good.recv(100 - len(got))
                    assert chunk, "the server stopped answering the healthy connection"
                    got += chunk
                assert got.startswith(b"RESP")
        finally:
            good.close()
            bad.close()
        assert srv.proc.poll() is None, "a malformed peer must not end the server"
        rc, err = srv.stop()
    assert rc == 130
    assert "protocol error" in err and "Traceback" not in err


def test_version():
    r = _looplab("--version")
    assert r.returncode == 0 and re.match(r"looplab \d+\.\d+", r.stdout)


@pytest.mark.parametrize("args, needle", [
    (["run", "--scenarios", "S4", "--runtimes", "callback", "--json", "{tmp}"], "is a folder"),
    (["run", "--scenarios", "S4", "--runtimes", "callback", "--out", "/proc/looplab/x"], "cannot write"),
    (["merge", "{doc}", "-o", "/proc/looplab/x.json"], "cannot write"),
    (["merge", "{doc}", "-o", "{tmp}"], "is a folder"),
    (["merge", "{doc}", "--csv", "{tmp}"], "is a folder"),
    (["report", "{doc}", "--out", "/proc/looplab"], "cannot write"),
    (["trace", "S5", "--runtime", "coro", "--out", "/proc/looplab/t.json"], "cannot write"),
])
def test_bad_output_paths_are_one_line_exit_2_before_measuring(tmp_path, args, needle):
    from bench import results
    doc = tmp_path / "r.json"
    results.write_json(results.new_document([], run_id="r", env={}), str(doc))
    args = [a.format(tmp=tmp_path, doc=doc) for a in args]
    r = _looplab(*args)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not [p for p in os.listdir(tmp_path) if ".tmp" in p]


def test_run_without_out_writes_a_default_folder_and_says_where(tmp_path):
    r = subprocess.run(LOOPLAB + ["run", "--scenarios", "S4", "--runtimes", "callback",
                                  "--preset", "tiny"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    said = re.search(r"writing to (\S+)", r.stderr).group(1)
    assert (tmp_path / said / "results.json").exists() and (tmp_path / said / "report.md").exists()


def test_global_out_is_the_verbs_out(tmp_path):
    r = _looplab("--out", str(tmp_path / "g"), "run", "--scenarios", "S4", "--runtimes", "callback",
                 "--preset", "tiny", timeout=120)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "g" / "results.json").exists()


def test_a_missing_runtime_library_is_exit_3_in_run_and_serve(monkeypatch, capsys):
    from bench import cli
    from bench import runtimes
    monkeypatch.setattr(runtimes.Runtime, "unavailable_reason",
                        lambda self: "No module named 'uvloop'" if self.id.startswith("uvloop") else None)
    assert cli.main(["run", "--runtimes", "uvloop-protocol", "--scenarios", "S4",
                     "--out", "/tmp/looplab-test-never-written"]) == 3
    assert cli.main(["serve", "echo", "--runtime", "uvloop-protocol"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all("unavailable" in ln for ln in err)


# Import structure (no cycles, nobody imports the CLI): tests/test_structure.py.


def test_a_closed_output_pipe_is_a_quiet_exit():
    # `looplab list runtimes | head -1`: the reader goes, looplab stops quietly.
    proc = subprocess.Popen([sys.executable, "-m", "bench", "list", "runtimes"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, PYTHONPATH=os.getcwd()))
    proc.stdout.close()             # before it has written anything: its first write breaks
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert b"Traceback" not in err


def test_a_broken_pipe_inside_the_work_is_not_swallowed(monkeypatch):
    # A BrokenPipeError from a socket of the work (once seen from a simulated
    # program under explore) is a failure, not the user closing `| head`.
    from bench import cli

    def broken(args):
        raise BrokenPipeError(32, "a socket of the work")

    parser = cli.build_parser
    monkeypatch.setattr(cli, "build_parser", lambda: _with_func(parser(), broken))
    with pytest.raises(BrokenPipeError):
        cli.main(["list", "runtimes"])


def _with_func(parser, fn):
    real = parser.parse_args

    def parse_args(argv=None):
        args = real(argv)
        args.func = fn
        return args

    parser.parse_args = parse_args
    return parser


# ---------------------------------------------------------------------------
# The edges a new user meets (issue #35): every mistake one line and exit 2,
# every run that measured nothing a non-zero exit.

def _cli(capsys, *argv) -> tuple[int, str, str]:
    from bench import cli
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("argv", [
    ["run", "--runtimes", ""], ["run", "--runtimes", " , "], ["run", "--scenarios", ""],
    ["run", "--scenarios", "S1", "--variants", ""], ["repro", "uvloop-631", "--runtimes", ""],
    ["fidelity", "--runtimes", ""], ["bench", "micro", "--runtimes", ""],
    ["list", "cells", "--runtimes", ""],
])
def test_an_empty_list_is_a_mistake_not_every_one(capsys, tmp_path, argv):
    rc, out, err = _cli(capsys, *argv, *(["--out", str(tmp_path / "o")] if argv[0] == "run" else []))
    assert rc == 2, err
    assert "is empty" in err and err.count("\n") == 1 and err.startswith("looplab: ")
    assert list(tmp_path.iterdir()) == []


def test_a_scenario_id_forgives_case_and_suggests_the_near_one(capsys):
    rc, out, _ = _cli(capsys, "list", "cells", "--scenarios", "s1,S1", "--runtimes", "coro")
    assert rc == 0 and out.split() == ["S1/coro/naive/quick", "S1/coro/fixed/quick"]
    rc, _, err = _cli(capsys, "run", "--scenarios", "S11")
    assert rc == 2 and "did you mean S1?" in err and err.count("\n") == 1


def test_an_empty_matrix_says_why(capsys):
    rc, _, err = _cli(capsys, "run", "--scenarios", "S2", "--runtimes", "coro,trio")
    assert rc == 2 and err.count("\n") == 1
    assert "S2 runs on the stream style" in err and "coro is task" in err


def test_the_probes_hint_names_every_prefix(capsys):
    from bench import fidelity
    rc, _, err = _cli(capsys, "fidelity", "--probes", "nothing_like_this*")
    assert rc == 2 and err.count("\n") == 1
    for prefix in {name.split("_", 1)[0] + "_" for name in fidelity.PROBES}:
        assert prefix in err, prefix


def test_counts_agree_with_their_nouns(capsys, tmp_path):
    from bench.results.tables import plural
    assert [plural(n, "cell") for n in (0, 1, 2)] == ["0 cells", "1 cell", "2 cells"]
    rc, out, err = _cli(capsys, "run", "--scenarios", "S2", "--runtimes", "hybrid", "--variants",
                        "naive", "--preset", "tiny", "--net", "sim", "--out", str(tmp_path / "o"))
    assert rc == 0, err
    assert "looplab run: 1 cell\n" in err and re.search(r"\n1 note in ", out), out
    assert not re.search(r"\b1 (cells|plots|notes)\b", out + err)


def test_a_report_of_a_missing_file_leaves_no_folder(capsys, tmp_path):
    rc, _, err = _cli(capsys, "report", str(tmp_path / "nosuch.json"), "--out", str(tmp_path / "rep"))
    assert rc == 2 and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_a_run_where_every_cell_is_skipped_exits_non_zero(capsys, tmp_path):
    """uvloop runs only on real sockets: on the simulated network every cell is
    skipped, and a CI gate must not pass on nothing (README: exit 1)."""
    for argv in (["run", "--scenarios", "S1", "--runtimes", "uvloop-streams"],
                 ["run", "--scenarios", "S1", "--runtimes", "uvloop-streams", "--seeds", "2"],
                 ["repro", "uvloop-631", "--runtimes", "uvloop-protocol"]):
        rc, out, err = _cli(capsys, *argv, "--preset", "tiny", "--net", "sim",
                            "--out", str(tmp_path / argv[0] / str(len(argv))))
        assert rc == 1, (argv, err)
        assert err.splitlines()[-1].startswith("looplab: no cell measured anything: all 2 cells skipped")


NOT_MEASURED = '''
from bench.scenarios.api import Metric, Scenario

SCENARIO = Scenario(
    id="NM1", title="never decides", summary="Its oracle never has evidence.",
    run=lambda ctx: ({"done_count": 1}, {"ok": None}, []),
    metrics=[Metric("done_count", None)], verdicts={"ok": "decided"},
    presets={"tiny": {}})
'''


def test_not_measured_cells_exit_alike_in_run_and_in_seeds(capsys, tmp_path):
    path = tmp_path / "nm.py"
    path.write_text(NOT_MEASURED)
    codes = []
    for extra in ([], ["--net", "sim"], ["--net", "sim", "--seeds", "3"]):
        rc, out, err = _cli(capsys, "run", "--scenario-file", str(path), "--runtimes", "coro",
                            "--preset", "tiny", "--out", str(tmp_path / f"o{len(extra)}"), *extra)
        codes.append(rc)
        assert "not measured" in out + err
    assert codes == [1, 1, 1]


@pytest.mark.parametrize("loop, words", [
    ("rloopx", "unknown loop 'rloopx' (did you mean rloop?)"),
    ("nonexistent:thing", "no module 'nonexistent' can be imported"),
])
@pytest.mark.parametrize("at", ["", "@3.12"])
def test_a_misspelt_loop_is_a_mistake_before_any_environment_is_built(monkeypatch, capsys, loop,
                                                                        words, at):
    from bench.host import envs

    def build(*a, **kw):
        raise AssertionError("an environment was built for a misspelt loop")
    monkeypatch.setattr(envs, "build", build)
    for argv in (["fidelity", "--runtimes"], ["run", "--scenarios", "S1", "--runtimes"],
                 ["bench", "--runtimes"], ["serve", "echo", "--runtime"]):
        rc, _, err = _cli(capsys, *argv, f"asyncio-streams{at}:loop={loop}")
        assert rc == 2, (argv, err)
        assert words in err and err.count("\n") == 1, err


RAISES_IN_RUN = '''
from bench.scenarios.api import Metric, Scenario


def run(ctx):
    got = {}
    return ({"done_count": got["user_buffer_peak_bytes"]}, {"ok": True}, [])


SCENARIO = Scenario(
    id="RR1", title="raises in run", summary="Its run raises.", run=run,
    metrics=[Metric("done_count", None)], verdicts={"ok": "decided"}, presets={"tiny": {}})
'''


def test_an_exception_in_a_scenarios_run_says_where(capsys, tmp_path):
    """As an error of the cell program does: file.py:LINE in function, in the terminal,
    report.md and results.json."""
    import json
    path = tmp_path / "rr.py"
    path.write_text(RAISES_IN_RUN)
    out = tmp_path / "o"
    rc, stdout, err = _cli(capsys, "run", "--scenario-file", str(path), "--runtimes", "coro",
                           "--preset", "tiny", "--net", "sim", "--out", str(out))
    where = "KeyError: 'user_buffer_peak_bytes' (at rr.py:7 in run)"
    assert rc == 1
    assert where in stdout
    assert where in (out / "report.md").read_text()
    (cell,) = json.loads((out / "results.json").read_text())["cells"]
    assert cell["errors"] == [where]


def test_a_re_used_out_folder_keeps_no_stale_plots(tmp_path):
    """Re-using --out replaces the earlier report: the plots it wrote and this run
    does not are removed (also from a folder written before the manifest); a file of
    the user's in the folder is never touched."""
    from bench.report.render import MANIFEST
    out = tmp_path / "o"

    def run(sid):          # a process of its own: matplotlib keeps its fonts open
        r = _looplab("run", "--scenarios", sid, "--runtimes", "hybrid", "--variants", "naive",
                     "--preset", "tiny", "--net", "sim", "--out", str(out), timeout=120)
        assert r.returncode == 0, r.stderr
        return {p.name for p in out.glob("*.png")}
    first = run("S1")
    assert first and all(n.startswith("s1") for n in first)
    (out / "mine.png").write_bytes(b"the user's")
    second = run("S2")
    assert second and not any(n.startswith("s1") for n in second)
    assert {p.name for p in out.glob("*.png")} == second | {"mine.png"}
    (out / MANIFEST).unlink()                  # a folder from before the manifest
    assert run("S1") == first | {"mine.png"}
    assert {p.name for p in out.glob("*.png")} == first | {"mine.png"}


NEVER_RETRIEVED = '''
from bench import peers
from bench.scenarios.api import Metric, Scenario, run_program


async def handle(port, host, tcp_port):
    reader, writer = await port.open_connection(host, tcp_port)
    while True:
        writer.write(b"x" * 65536)
        await writer.drain()          # raises on the reset; nobody awaits the task


async def main(port, job):
    port.create_task(handle(port, *job.peer("reset")))
    await port.sleep(0.5)


def program(job):
    port = job.runtime.open()
    try:
        port.run(main, job)
    finally:
        port.close()
    return {}


def run(ctx):
    ran = run_program(ctx, peers=[peers.reset_peer(name="reset", listen="127.0.0.1:0",
                                                   after_bytes=100_000)], max_s=3)
    return ({"got_bytes": ran.peers["reset"]["received_bytes"]}, {"ok": True}, [])


SCENARIO = Scenario(
    id="NR1", title="a task that raises, never awaited", summary="It raises. Who hears of it?",
    run=run, programs={"stream": program}, styles=("stream",),
    metrics=[Metric("got_bytes", "higher")], verdicts={"ok": "ran"}, presets={"tiny": {}})
'''


def test_what_a_simulated_app_writes_is_its_own_not_the_progress_output(capsys, tmp_path):
    """Under --net sim the app runs in looplab's process: a task's late "exception was
    never retrieved" (when its world is collected) goes to the cell's notes, as it
    stays in the app process on real sockets, never between the progress lines."""
    import json
    path = tmp_path / "nr.py"
    path.write_text(NEVER_RETRIEVED)
    out = tmp_path / "o"
    rc, stdout, err = _cli(capsys, "run", "--scenario-file", str(path), "--runtimes",
                           "hybrid,asyncio-streams", "--preset", "tiny", "--net", "sim",
                           "--out", str(out))
    assert rc == 0, err
    assert "never retrieved" not in err + stdout
    assert [ln for ln in err.splitlines() if not ln.startswith("[")] == ["looplab run: 2 cells"]
    for cell in json.loads((out / "results.json").read_text())["cells"]:
        assert any(n.startswith("the app wrote: ") and "exception was never retrieved" in n
                   for n in cell["notes"]), cell


# ---------------------------------------------------------------------------
# Every verb walked through the README's exit codes (issue #35's done-when): a bad
# --out (where the verb has one), Ctrl-C mid-run (where it measures) and a plan where
# every cell is skipped (where it plans cells). Each ends in one line and its code
# (2 / 130 / non-zero) and leaves nothing behind: no empty folder, no process. The
# verbs come from the CLI's parser, so a verb added later fails here until it has a
# row below.

NEEDSLIB = '''
from bench import runtimes
from bench.runtimes import RuntimeInfo

runtimes.register(RuntimeInfo("needslib", "task", "protocols.ports:CoroPort",
                              runtimes.get("coro").options, requires=("looplab_no_such_lib",)))
'''

#: verb (None: ``looplab`` alone, the main job) -> its walk: ``args`` run it (and
#: take a bad --out); ``measures`` is the line it prints once measuring, or "child"
#: for its first child process; ``skipped`` is a plan whose every cell is skipped,
#: with the exit code that says so (1: nothing measured; 3: nothing available).
WALK = {
    None: dict(args=[], measures="fidelity probes"),
    "list": dict(args=["runtimes"]),
    "run": dict(args=["--scenarios", "S1", "--runtimes", "coro", "--preset", "quick"],
                measures="[1/", skipped=(["--scenarios", "S1", "--runtimes", "uvloop-streams",
                                          "--net", "sim", "--preset", "tiny"], 1)),
    "trace": dict(args=["S1", "--runtime", "coro"], measures="child"),
    "report": dict(args=["{results}"]),
    "serve": dict(args=["echo", "--runtime", "coro"], measures="the same code"),  # once it serves
    "bench": dict(args=["micro", "--runtimes", "coro"], measures="looplab bench micro",
                  skipped=(["micro", "--runtimes", "needslib"], 3)),
    "fidelity": dict(args=["--runtimes", "coro"], measures="child"),
    "faults": dict(args=["--serve", "coro", "--app", "echo"], measures="round 1"),
    "repro": dict(args=["C6", "--runtimes", "coro"], measures="[1/",
                  skipped=(["uvloop-631", "--runtimes", "uvloop-protocol", "--net", "sim"], 1)),
    "compare": dict(args=["{results}", "{results}"]),
    "merge": dict(args=["{results}"]),
    "validate": dict(args=["{results}"]),
    "env": dict(args=["list"]),
    # a proof that takes minutes, in two worker processes (a child shows it started)
    "explore": dict(args=["S3", "--variant", "fixed", "--runtimes", "callback,coro", "--preset",
                          "blog", "--strategy", "delays:2", "--budget", "100000", "--jobs", "2"],
                    measures="child",
                    skipped=(["S1", "--runtimes", "uvloop-streams"], None)),
}
# check refuses a plan it cannot run (uvloop on the simulated network) before
# measuring, so it has no all-skipped plan to walk
WALK["check"] = dict(args=[os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                        "examples", "check", "protocol_server.py") + ":naive",
                           "--send", "GET 33554432\\n"], measures="healthy clients alone")
ELSEWHERE: dict = {}      # verbs whose fixes are pending elsewhere (none)


def _parser_verbs() -> list:
    import argparse
    from bench import cli
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return [None, *sub.choices]


def _outputs(verb) -> list[str]:
    """The output options the verb's parser has (--out, --json)."""
    import argparse
    from bench import cli
    parser = cli.build_parser()
    if verb is not None:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[verb]
    flags = {o for a in parser._actions for o in a.option_strings}
    return [f for f in ("--out", "--json") if f in flags]


def _session(sid: int) -> list[int]:
    """The live processes of session ``sid`` (the verb's and its children's)."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] != "Z":
                found.append(int(pid))
    return found


def _empty_folders(root) -> list[str]:
    return [d for d, subs, files in os.walk(root) if not subs and not files and d != str(root)]


class _Verb:
    """``looplab VERB ...`` in a session of its own (as a shell starts a job), so
    what is left of it afterwards can be found."""

    def __init__(self, argv, cwd, env):
        self.proc = subprocess.Popen(LOOPLAB + argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, start_new_session=True)
        self.err = ""
        os.set_blocking(self.proc.stderr.fileno(), False)

    def read(self):
        self.err += (self.proc.stderr.read() or b"").decode(errors="replace")

    def wait_for(self, measures: str, timeout: float) -> bool:
        import time
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            self.read()
            if measures in self.err or (measures == "child" and len(_session(self.proc.pid)) > 1):
                return True
            time.sleep(0.05)
        return False

    def end(self, timeout=90) -> tuple[int, str, list]:
        import time
        try:
            rc = self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            # what is left is found and killed before stderr is read to its end: a
            # process left holding the pipe would keep that read from ever ending
            time.sleep(0.3)
            left = _session(self.proc.pid)
            for pid in left:              # never leave them to the next test
                os.kill(pid, signal.SIGKILL)
            os.set_blocking(self.proc.stderr.fileno(), True)
            self.read()
            self.proc.stderr.close()
        return rc, self.err, left


def _last_line_says(err: str, code: int) -> None:
    lines = err.strip().splitlines()
    assert "Traceback" not in err, err[-2000:]
    assert lines and lines[-1].startswith("looplab"), (code, err[-1000:])


@pytest.mark.parametrize("verb", [pytest.param(v, marks=[pytest.mark.timeout(400)] + (
    [pytest.mark.xfail(strict=True, reason=ELSEWHERE[v])] if v in ELSEWHERE else []),
    id=v or "main-job") for v in _parser_verbs()])
def test_every_verb_keeps_the_readme_exit_codes(verb, tmp_path):
    if verb not in WALK:
        pytest.fail(f"`looplab {verb}` is not walked: give it a row in WALK (its arguments, "
                    "when it measures, and a plan whose every cell is skipped)")
    walk = WALK[verb]
    from bench import results
    doc = tmp_path / "r.json"
    results.write_json(results.new_document([], run_id="r", env={}), str(doc))
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    (tmp_path / "needslib_rt.py").write_text(NEEDSLIB)
    env = {**os.environ, "LOOPLAB_RUNTIME_MODULES": "needslib_rt",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.getcwd()])}
    work = tmp_path / "work"
    work.mkdir()
    head = [verb] if verb else []
    args = [a.format(results=doc) for a in walk["args"]]

    # a bad output path: one line, exit 2, before anything is measured or made
    for flag in _outputs(verb):
        before = sorted(os.listdir(tmp_path))
        argv = (["--out", str(a_file / "sub")] if verb is None else
                head + args + [flag, str(a_file / ("sub" if flag == "--out" else "x.json"))])
        rc, err, left = _Verb(argv, work, env).end()
        assert rc == 2, (argv, err[-1500:])
        assert err.count("\n") == 1 and err.startswith("looplab: ") and "cannot write" in err, err
        assert sorted(os.listdir(tmp_path)) == before and not os.listdir(work) and not left

    # Ctrl-C mid-run (SIGINT to its process group, as a terminal sends it): 130 and one
    # line; finished work kept, no empty folder, no process left
    if walk.get("measures"):
        out = ["--out", str(work / "o")] if "--out" in _outputs(verb) else []
        if verb == "trace":
            out = ["--out", str(work / "o" / "t.json")]
        v = _Verb(head + args + out, work, env)
        started = v.wait_for(walk["measures"], 240)
        if v.proc.poll() is None:
            os.killpg(v.proc.pid, signal.SIGINT)
        rc, err, left = v.end()
        assert started, f"it never started measuring: {err[-1500:]}"
        assert rc == 130, err[-1500:]
        _last_line_says(err, rc)
        assert "interrupted" in err.strip().splitlines()[-1]
        assert not left and not _empty_folders(work), (left, _empty_folders(work))

    # every cell skipped: non-zero, the last line says why
    if walk.get("skipped"):
        skipped, code = walk["skipped"]
        rc, err, left = _Verb(head + skipped + (["--out", str(work / "s")] if "--out" in
                                                 _outputs(verb) else []), work, env).end()
        assert rc != 0 and (code is None or rc == code), err[-1500:]
        _last_line_says(err, rc)
        assert not left and not _empty_folders(work)
