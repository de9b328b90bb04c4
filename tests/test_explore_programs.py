"""``looplab explore`` on a user's own program: file and module targets, what a
failure names (the user's file:line, task and connection), replay files that
carry their program by path and hash, the shrinker's failure key, and the
verb's edges (--out, interrupts, budgets, a zoo alias beside a user scenario)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap

import pytest

from bench import cli
from bench.explore import checks, exploration, programs, search, targets
from bench.explore.targets import RunResult

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A server whose two clients' requests arrive in one poll: a lost wake-up when the
# "take" request is handled first (an io-order choice), as in docs/explore.md.
RACE = '''
import asyncio


async def main():
    jobs, wake = [], asyncio.Event()

    async def handle(reader, writer):
        if await reader.readline() == b"job\\n":
            jobs.append(b"done\\n")
            wake.set()
        else:
            if not jobs:
                await asyncio.sleep(0)
                wake.clear()
                await wake.wait()                       # WAIT
            writer.write(jobs.pop())
        writer.close()

    async def client(request):
        reader, writer = await asyncio.open_connection("127.0.0.1", 8000)
        writer.write(request)
        reply = await reader.readline()                 # READ
        writer.close()
        return reply

    async with await asyncio.start_server(handle, "127.0.0.1", 8000):
        await asyncio.gather(client(b"job\\n"), client(b"take\\n"))
'''

KINDS = '''
import asyncio
from bench.explore import Bug


async def unhandled():
    async def producer():
        await asyncio.sleep(0.1)
        raise ValueError("boom")                        # RAISE
    asyncio.get_running_loop().create_task(producer(), name="producer")
    await asyncio.sleep(1)


async def plain_assert():
    x = 1
    await asyncio.sleep(0.1)
    assert x == 2                                       # ASSERT


async def with_ctx(ctx):
    loop = asyncio.get_running_loop()
    jobs = ctx.connection((0.5, b"hi"), name="jobs")
    control = ctx.connection((0.5, b"bye"), name="control")
    got = await asyncio.gather(loop.sock_recv(jobs, 10), loop.sock_recv(control, 10))
    ctx.observe(got=got)
    assert ctx.now >= 0.5 and got == [b"hi", b"bye"]


async def two(a, b):
    pass


def not_async():
    pass


async def ok():
    await asyncio.sleep(0.1)


PAIR = Bug(naive=plain_assert, fixed=ok)
'''


def _line(text: str, marker: str) -> int:
    return next(i for i, ln in enumerate(text.splitlines(), 1) if marker in ln)


def _plant(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def _one_usage_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("looplab: "), err
    return err[0]


# ---------------------------------------------------------------------------
# what a failure names

@pytest.mark.parametrize("loop_name", ["asyncio", "looplab"])
def test_a_planted_programs_pending_tasks_and_labels_name_its_file_task_and_connection(
        tmp_path, loop_name):
    path = _plant(tmp_path, "race.py", RACE)
    t = targets.resolve(f"{path}:main")
    r = exploration.explore(t, loop_name, "main", "delays:1", 200)
    assert r["found"] and r["first_failure"] > 1 and r["shrunk_deviations"] == 1
    assert r["replay_exact"] and r["outcome"].startswith("hang: ")
    wait, read = _line(RACE, "# WAIT"), _line(RACE, "# READ")
    pending = r["pending"]
    # each task by its name and coroutine, where the user's code waits (not asyncio's)
    assert any(re.fullmatch(rf"Task-\d+ \(handle\): waits at \S*race\.py:{wait} in handle", p)
               for p in pending), pending
    assert any(re.fullmatch(rf"Task-\d+ \(client\): waits at \S*race\.py:{read} in client", p)
               for p in pending), pending
    assert not any("asyncio" in p for p in pending)
    # the await chain goes on into asyncio, below the user's frame
    chain = r["chains"][[i for i, p in enumerate(pending) if "(handle)" in p][0]]
    assert chain[0].endswith(f"race.py:{wait} in handle") and chain[-1].startswith("asyncio/")
    # the deciding choice: the connection (local role, peer address) and the task it wakes
    step = r["schedule"]["deviations"][0][0]
    fail = r["schedule"]["trace"]["failing"]["choices"][step]
    ok = r["schedule"]["trace"]["passing"]["choices"][step]
    # (under epoll's order the race is decided where the clients' connections become
    # writable, or where the server reads: either way a connection and a task)
    for label in (fail[3], ok[3]):
        assert re.fullmatch(r"(read server 127\.0\.0\.1:8000 <- peer 127\.0\.0\.1:4000\d -> task "
                            r"handle|(write|event) client 127\.0\.0\.1:4000\d -> peer "
                            r"127\.0\.0\.1:8000 -> task client)", label), label
    assert fail[3] != ok[3] and fail[:2] == ["io-order", 2]
    labels = [c[3] for c in r["schedule"]["trace"]["failing"]["choices"]]
    assert not any(re.search(r"\bfd \d", lab) for lab in labels)


def test_a_context_connection_is_labelled_by_its_name(tmp_path):
    path = _plant(tmp_path, "kinds.py", KINDS)
    t = targets.resolve(f"{path}:with_ctx")
    assert t.variants == ("with_ctx",) and t.runtimes == ("asyncio", "looplab")
    legal = search.legal_kinds("looplab")
    rec = checks.Watched(legal, lambda step, kind, n: 0, trace=True)
    assert not exploration.execute(t, "looplab", "with_ctx", rec).failed
    io = [lab for (kind, _, _), lab in zip(rec.points, rec.labels) if kind == "io-order"]
    assert io and all(re.fullmatch(r"read connection '(jobs|control)' -> task sock_recv", lab)
                      for lab in io), rec.labels


def test_hybrid_ready_choices_name_the_task_not_its_step():
    from kernels import simnet
    from kernels.hybrid import Runner, create_task, sleep
    world = simnet.World(0, log=False)
    legal = search.legal_kinds("hybrid", net=False, portability=True)
    rec = checks.Watched(legal, lambda step, kind, n: n - 1, trace=True)
    world.install_chooser(rec)
    rec.attach(world)

    async def worker():
        await sleep(0)
        await sleep(0)

    async def top():
        for t in [create_task(worker()) for _ in range(3)]:
            await t
    with Runner(io=world.io()) as runner:
        runner.run(top())
    ready = [lab for (kind, _, _), lab in zip(rec.points, rec.labels) if kind == "ready"]
    assert ready and all(lab in ("task worker", "task top") for lab in ready), ready


@pytest.mark.parametrize("name,outcome,key", [
    ("unhandled", r"error: unhandled ValueError in task producer: boom \(at \S*kinds\.py:{RAISE} "
                  r"in producer\)", "unhandled:error:ValueError@kinds.py:{RAISE} in producer"),
    ("plain_assert", r"violated: assert x == 2 \(at \S*kinds\.py:{ASSERT} in plain_assert\)",
     "violated@kinds.py:{ASSERT} in plain_assert"),
])
def test_an_unretrieved_task_exception_and_a_plain_assert_are_failures(tmp_path, name, outcome,
                                                                        key):
    path = _plant(tmp_path, "kinds.py", KINDS)
    lines = {"RAISE": _line(KINDS, "# RAISE"), "ASSERT": _line(KINDS, "# ASSERT")}
    t = targets.resolve(f"{path}:{name}")
    for rt in t.runtimes:
        r = exploration.explore(t, rt, name, "random", 5)
        assert r["found"] and re.fullmatch(outcome.format(**lines), r["outcome"]), r["outcome"]
        assert r["failure_key"] == key.format(**lines) and r["replay_exact"]
    assert not exploration.explore(targets.resolve(f"{path}:ok"), "asyncio", "ok", "random",
                                   5)["found"]


def test_a_trio_program_runs_on_trio_and_its_hang_names_its_tasks(tmp_path):
    pytest.importorskip("trio")
    text = '''
    import trio


    async def main():
        async with trio.open_nursery() as n:
            ev = trio.Event()

            async def waiter():
                await ev.wait()                       # WAIT
            n.start_soon(waiter)
    '''
    path = _plant(tmp_path, "tprog.py", text)
    t = targets.resolve(f"{path}:main")
    assert t.runtimes == ("trio",) and t.applies("asyncio")
    r = exploration.explore(t, "trio", "main", "random", 3)
    line = _line(textwrap.dedent(text), "# WAIT")
    # every task waits and nothing is scheduled: a deadlock, seen at once
    assert r["found"] and r["liveness"] and r["outcome"].startswith("hang: ")
    assert any(p.startswith("trio task tprog.main.<locals>.waiter: waits at ")
               and p.endswith(f"tprog.py:{line} in waiter") for p in r["pending"]), r["pending"]
    assert any(p.startswith("trio task main: waits at ") for p in r["pending"]), r["pending"]


def test_a_module_target_and_a_bug_pair(tmp_path, monkeypatch, capsys):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "kinds.py").write_text(textwrap.dedent(KINDS))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    t = targets.resolve("mypkg.kinds:PAIR")
    assert t.variants == ("naive", "fixed") and t.source["module"] == "mypkg.kinds"
    out = tmp_path / "ex"
    assert cli.main(["explore", "mypkg.kinds:PAIR", "--variant", "both", "--runtimes",
                     "asyncio", "--budget", "5", "--out", str(out)]) == 1
    text = capsys.readouterr().out
    assert "mypkg.kinds:PAIR asyncio naive random: FAILED" in text
    assert "mypkg.kinds:PAIR asyncio fixed random: no failing schedule" in text
    doc = json.loads((out / "failing-mypkg.kinds_PAIR_asyncio_naive.json").read_text())
    assert doc["program"]["module"] == "mypkg.kinds"
    assert doc["program"]["file"] == os.path.join("..", "mypkg", "kinds.py")
    assert cli.main(["explore", "--replay", str(out / "failing-mypkg.kinds_PAIR_asyncio_naive.json")]) == 0
    assert "exact: yes" in capsys.readouterr().out


@pytest.mark.parametrize("spec,says", [
    ("kinds.py:two", "takes 2 arguments"),
    ("kinds.py:not_async", "is not an async def"),
    ("kinds.py:nosuch", "has no 'nosuch'; its programs: "),
    ("broken.py:main", "importing broken.py failed: ZeroDivisionError"),
    ("missing.py:main", "no file missing.py"),
    ("no_such_pkg.mod:main", "no module 'no_such_pkg'"),
])
def test_a_program_target_that_is_not_one_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys,
                                                                 spec, says):
    _plant(tmp_path, "kinds.py", KINDS)
    _plant(tmp_path, "broken.py", "x = 1 / 0\n")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["explore", spec, "--budget", "2"]) == 2
    assert says in _one_usage_line(capsys)


def test_a_runtime_a_program_cannot_run_on(tmp_path, capsys):
    path = _plant(tmp_path, "kinds.py", KINDS)
    assert cli.main(["explore", f"{path}:ok", "--runtimes", "looplab:nosuch=1"]) == 2
    assert "unknown option 'nosuch'" in _one_usage_line(capsys)
    assert cli.main(["explore", f"{path}:ok", "--runtimes", "coro"]) == 2
    err = capsys.readouterr().err
    assert "is an asyncio program: it runs on asyncio, looplab" in err
    assert "no runtime left to explore" in err


# ---------------------------------------------------------------------------
# replay files carry their program

def _failing_file(tmp_path, capsys) -> str:
    path = _plant(tmp_path, "race.py", RACE)
    out = tmp_path / "ex"
    assert cli.main(["explore", f"{path}:main", "--runtimes", "asyncio", "--strategy",
                     "delays:1", "--out", str(out)]) == 1
    capsys.readouterr()
    return str(out / "failing-race.py_main_asyncio_main.json")


def test_a_replay_file_names_its_program_and_needs_nothing_else(tmp_path, monkeypatch, capsys):
    replay = _failing_file(tmp_path, capsys)
    doc = json.loads(open(replay).read())
    assert doc["program"]["file"] == os.path.join("..", "race.py")     # relative to itself
    assert doc["program"]["sha256"] == programs.source_of(str(tmp_path / "race.py"))
    assert doc["failure"].startswith("hang@")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert cli.main(["explore", "--replay", replay, "--await-chain"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"replaying main from {tmp_path / 'race.py'} (sha256 as recorded)")
    assert "same choice points: yes; exact: yes" in out
    assert re.search(r"pending: Task-\d+ \(handle\): waits at \S*race\.py:\d+ in handle\n"
                     r"\s+\S*race\.py:\d+ in handle\n\s+asyncio/locks\.py:\d+ in wait", out), out


def test_a_replay_whose_source_changed_or_is_missing_is_refused(tmp_path, capsys):
    replay = _failing_file(tmp_path, capsys)
    src = tmp_path / "race.py"
    src.write_text(src.read_text() + "\n# edited\n")
    assert cli.main(["explore", "--replay", replay]) == 2
    line = _one_usage_line(capsys)
    assert f"the program {src} changed since the schedule was recorded" in line
    assert "--allow-changed" in line
    # asked for: it runs, and the replay is not called exact whatever it does
    assert cli.main(["explore", "--replay", replay, "--allow-changed"]) == 1
    out = capsys.readouterr().out
    assert "source changed" in out and "exact: NO (the source changed)" in out
    src.unlink()
    assert cli.main(["explore", "--replay", replay, "--allow-changed"]) == 2
    assert "(recorded relative to the schedule file) is not at" in _one_usage_line(capsys)


# ---------------------------------------------------------------------------
# the shrinker keeps its failure

class _Fake(targets.Target):
    """Fails when choices 0 and 1 both deviate, at 'f.py:1', with a message that
    changes with the number of deviations (a time); with only one of them it fails
    elsewhere ('f.py:2')."""
    kind = "program"
    name = "fake"
    variants = ("v",)

    def run(self, runtime, variant, chooser):
        got = [chooser.choose("io-order", 2) for _ in range(12)]
        devs = sum(got)
        if got[0] and got[1]:
            return RunResult(True, f"violated: X at t={devs}", detail={"at": float(devs)},
                             key="violated@f.py:1")
        if got[0] or got[1]:
            return RunResult(True, "violated: Y", detail={"at": -1.0}, key="violated@f.py:2")
        return RunResult(False, "ok")


def test_the_shrinker_keeps_the_failures_kind_and_place_not_its_text():
    legal = frozenset({"io-order"})
    start = {0: 1, 1: 1, 5: 1, 7: 1}
    devs, runs = exploration.shrink(_Fake(), "asyncio", "v", legal, start, "violated@f.py:1")
    # the message changed as deviations went (t=4 -> t=2), the failure did not; dropping
    # 0 or 1 fails too, but elsewhere, and is not taken
    assert devs == {0: 1, 1: 1}, devs
    r = exploration.explore(_Fake(), "asyncio", "v", "random", 50)
    assert r["found"] and r["deviations_found"] > 2 and r["shrunk_deviations"] == 2
    # the report's time is the shrunk run's own
    assert r["failed_at"] == 2.0 and r["shrunk_outcome"] == "violated: X at t=2"
    assert r["schedule"]["failure"] == "violated@f.py:1"


# ---------------------------------------------------------------------------
# the verb's edges

def test_a_delays_search_out_of_budget_says_so_and_exits_4(tmp_path, capsys):
    path = _plant(tmp_path, "kinds.py", KINDS)
    rc = cli.main(["explore", f"{path}:ok", "--runtimes", "asyncio", "--strategy", "delays:2",
                   "--budget", "2"])
    out = capsys.readouterr().out
    assert rc == 4, out
    assert "    not exhausted: 2 schedules, no proof" in out and "proved" not in out
    # with the budget to finish, the same search is a proof (exit 0)
    assert cli.main(["explore", f"{path}:ok", "--runtimes", "asyncio", "--strategy", "delays:2",
                     "--budget", "2000"]) == 0
    out = capsys.readouterr().out
    assert "proved: no failing schedule within 2 delays" in out and "not exhausted" not in out


@pytest.mark.parametrize("make", ["file", "unwritable"])
def test_explore_out_that_cannot_be_written_is_one_line_and_exit_2(tmp_path, capsys, make):
    if make == "file":
        out = tmp_path / "a_file"
        out.write_text("x")
        says = "exists and is not a folder"
    else:
        out = "/sys/kernel/looplab-x"
        says = "cannot write there"
    assert cli.main(["explore", "cpython-23812", "--out", str(out)]) == 2
    line = _one_usage_line(capsys)
    assert says in line and capsys.readouterr().out == ""      # nothing explored


@pytest.mark.timeout(180)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_explore_keeps_the_units_that_finished(tmp_path, sig):
    path = _plant(tmp_path, "kinds.py", KINDS)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench", "explore", f"{path}:PAIR", "--variant", "both",
         "--runtimes", "asyncio", "--budget", "100000000", "--out", "ex"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen = []
        for line in proc.stdout:          # the naive unit fails at once; the fixed one runs on
            seen.append(line)
            if line.strip().startswith("schedule: "):
                break
        proc.send_signal(sig)
        rest, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, (seen, err)
    assert "interrupted; 1 of 2 unit(s) finished, kept in ex/explore.json" in err
    assert "Traceback" not in err
    doc = json.loads((tmp_path / "ex" / "explore.json").read_text())
    assert doc["interrupted"] == {"finished_units": 1, "units": 2}
    assert [e["variant"] for e in doc["explorations"]] == ["naive"]
    assert doc["explorations"][0]["found"]
    assert (tmp_path / "ex" / "failing-kinds.py_PAIR_asyncio_naive.json").exists()


C8 = '''
from bench import peers
from bench.scenarios.api import Metric, Scenario, run_program


async def send(port, host, tcp_port):
    stream = await port.open_tcp_stream(host, tcp_port)
    await stream.send_all(b"x" * 1000)
    await stream.aclose()


def program(job):
    port = job.runtime.open()
    try:
        port.run(send, *job.peer("reader"))
    finally:
        port.close()
    return {}


def run(ctx):
    ran = run_program(ctx, peers=[peers.reader(max_s=10)], max_s=10)
    got = ran.peers["reader"]["received_bytes"]
    return {"delivered_bytes": got}, {"all_arrived": got == 1000}, []


SCENARIO = Scenario(
    id="C8", title="a user's C8", run=run, programs={"task": program}, styles=("task",),
    summary="Sends then closes.", metrics=[Metric("delivered_bytes", "higher", "delivered")],
    verdicts={"all_arrived": "every byte arrived"}, presets={"tiny": {}})
'''


@pytest.mark.timeout(300)
def test_a_users_scenario_wins_over_a_zoo_alias_of_the_same_name(tmp_path):
    _plant(tmp_path, "c8.py", C8)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))

    def looplab(*args):
        return subprocess.run([sys.executable, "-m", "bench", *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=240)
    r = looplab("explore", "C8", "--scenario-file", "c8.py", "--runtimes", "coro",
                "--strategy", "delays:0")
    assert r.returncode == 0, r.stderr
    assert "C8 coro naive delays:0: no failing schedule" in r.stdout
    assert "note: C8 is your scenario; the zoo's C8 (asyncio-263) is zoo:C8" in r.stderr
    # the zoo's entry stays reachable by its own name
    r = looplab("explore", "zoo:C8", "--scenario-file", "c8.py", "--runtimes", "coro",
                "--strategy", "delays:0")
    assert "asyncio-263" in r.stdout + r.stderr and "a user's C8" not in r.stdout


@pytest.mark.timeout(300)
def test_a_user_scenarios_schedule_replays_without_its_scenario_file_option(tmp_path):
    _plant(tmp_path, "short.py", C8.replace('id="C8"', 'id="SHORTCOUNT"').replace(
        '"all_arrived": got == 1000', '"all_arrived": got == 999'))
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))

    def looplab(cwd, *args):
        return subprocess.run([sys.executable, "-m", "bench", *args], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=240)
    r = looplab(tmp_path, "explore", "SHORTCOUNT", "--scenario-file", "short.py", "--runtimes",
                "coro", "--strategy", "delays:0", "--out", "ex")
    assert r.returncode == 1 and "all_arrived=NO" in r.stdout, r.stdout + r.stderr
    doc = json.loads((tmp_path / "ex" / "failing-SHORTCOUNT_coro_naive.json").read_text())
    assert doc["program"]["scenario"] and doc["program"]["file"] == os.path.join("..", "short.py")
    other = tmp_path / "other"
    other.mkdir()
    r = looplab(other, "explore", "--replay", str(tmp_path / "ex" / "failing-SHORTCOUNT_coro_naive.json"))
    assert r.returncode == 0 and "exact: yes" in r.stdout, r.stdout + r.stderr
    assert r.stdout.startswith(f"replaying SHORTCOUNT from {tmp_path / 'short.py'}")


def test_a_curio_program_runs_on_its_runtimes_port_and_the_ports_own_tasks_are_not_listed(
        tmp_path):
    pytest.importorskip("curio")
    text = '''
    import curio


    async def main():
        await curio.sleep(100)                         # SLEEP
    '''
    path = _plant(tmp_path, "cprog.py", text)
    t = targets.resolve(f"{path}:main")
    assert t.library == "curio" and t.runtimes == programs.library_runtimes("curio")
    r = exploration.explore(t, t.runtimes[0], "main", "random", 2)
    line = _line(textwrap.dedent(text), "# SLEEP")
    assert r["found"] and r["failed_at"] == 5.0 and r["outcome"].startswith("hang: tasks still")
    # the program's task, by its function's name; not curio's kernel task or the port's
    assert len(r["pending"]) == 1 and re.fullmatch(
        rf"curio task \d+ main: waits at \S*cprog\.py:{line} in main", r["pending"][0]), r["pending"]
