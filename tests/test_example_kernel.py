"""The fourth kernel (examples/selectkernel): its own behaviour, the shipped
conformance suite run on it with one command, and S1, S3 and S4 (naive, quick)
through the unmodified CLI, the runtime registered from outside the package.

The kernel is imported only inside the ``sk`` fixture and unregistered after
this module, so the rest of the suite keeps seeing exactly the built-in runtimes.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bench import runtimes

ROOT = Path(__file__).resolve().parents[1]
RID = "selectkernel"
MODULE = "examples.selectkernel"
SUBPROCESS_S = 240          # a whole child pytest or CLI run; generous on 2 shared cores


@pytest.fixture(scope="module")
def sk():
    """The example package, its runtime registered; unregistered afterwards."""
    if not (ROOT / "examples" / "selectkernel" / "__init__.py").exists():
        pytest.skip("examples/selectkernel is not in this checkout")
    added = str(ROOT) not in sys.path
    if added:   # examples/ is a folder beside the package, not an installed package
        sys.path.insert(0, str(ROOT))
    was_registered = RID in runtimes.RUNTIMES
    try:
        import examples.selectkernel as package
        if runtimes.RUNTIMES.get(RID) is not package.INFO:
            runtimes.register(package.INFO)
        yield package
    finally:
        if not was_registered:
            runtimes.unregister(RID)
        if added:
            sys.path.remove(str(ROOT))


@pytest.fixture
def kernel(sk):
    from examples.selectkernel import kernel
    loop = kernel.Loop()
    try:
        yield kernel, loop
    finally:
        loop.close()


def _child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


# ---------------------------------------------------------------------------
# The kernel itself

@pytest.mark.timeout(10)
def test_a_task_steps_its_coroutine_with_the_results_of_futures(kernel):
    k, loop = kernel
    seen = []
    futures = [k.Future(loop), k.Future(loop)]

    async def main():
        seen.append(await futures[0])
        seen.append(await futures[1])
        return "done"

    task = loop.create_task(main())
    assert seen == [] and not task.done()          # lazy: nothing runs before the loop does
    loop.call_soon(futures[0].set_result, "a")
    loop.call_later(0.01, futures[1].set_result, "b")
    loop.run_until(task.done)
    assert seen == ["a", "b"] and task.result() == "done"
    assert loop.steps == 3                         # start, after a, after b


@pytest.mark.timeout(10)
def test_future_callbacks_run_on_a_later_pass_in_order(kernel):
    k, loop = kernel
    fut, calls = k.Future(loop), []
    fut.add_done_callback(lambda f: calls.append(("first", f.result())))
    fut.add_done_callback(lambda f: calls.append(("second", f.result())))
    fut.set_result(7)
    assert calls == []                             # never inside set_result
    loop.run_once()
    assert calls == [("first", 7), ("second", 7)]
    fut.add_done_callback(lambda f: calls.append(("late", f.result())))
    loop.run_once()
    assert calls[-1] == ("late", 7)
    with pytest.raises(RuntimeError):
        fut.set_result(8)


@pytest.mark.timeout(10)
def test_cancel_is_delivered_once_where_the_task_waits(kernel):
    k, loop = kernel
    state = {}

    async def victim():
        try:
            await k.Future(loop)                   # never resolved
        except k.CancelledError:
            state["first"] = "cancelled"
        await loop_sleep(k, loop, 0.01)            # edge: the second wait completes
        state["second"] = "completed"

    task = loop.create_task(victim())
    loop.run_once()
    assert task.cancel()
    loop.run_until(task.done)
    assert state == {"first": "cancelled", "second": "completed"}


async def loop_sleep(k, loop, delay):
    fut = k.Future(loop)
    loop.call_later(delay, fut.set_result, None)
    await fut


@pytest.mark.timeout(10)
def test_a_loop_with_nothing_to_wait_for_says_so_instead_of_hanging(kernel):
    k, loop = kernel

    async def stuck():
        await k.Future(loop)

    task = loop.create_task(stuck())
    with pytest.raises(k.Deadlock):
        loop.run_until(task.done)


@pytest.mark.timeout(20)
def test_timeouts_fire(sk):
    from examples.selectkernel.port import SelectPort

    async def main(port):
        seen = {}
        t0 = port.loop.time()
        try:
            await port.wait_for(port.sleep(5), 0.05)
        except port.TimeoutError:
            seen["wait_for"] = port.loop.time() - t0
        try:
            async with port.timeout(0.05):
                await port.sleep(5)
        except TimeoutError:
            seen["timeout"] = True
        seen["value"] = await port.wait_for(port.sleep(0.01, "ok"), 1)
        seen["tasks_left"] = len(port.all_tasks() - {port.current_task()})
        return seen

    with SelectPort(None, {}) as port:
        seen = port.run(main)
    assert 0.04 <= seen["wait_for"] < 5 and seen["timeout"] is True
    assert seen["value"] == "ok" and seen["tasks_left"] == 0


async def _echo_main(port, payload):
    async def echo(reader, writer):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await port.start_server(echo, "127.0.0.1", 0)
    host, p = server._sock.getsockname()[:2]
    reader, writer = await port.open_connection(host, p, sockbuf=65536)
    sender = port.create_task(_send(writer, payload))
    got = await reader.readexactly(len(payload))
    await sender
    writer.write(b"one line\nrest")
    writer.write_eof()
    line = await reader.readline()
    rest = await reader.read()
    writer.close()
    await writer.wait_closed()
    server.close()
    return got, line, rest


async def _send(writer, payload):
    for off in range(0, len(payload), 65536):
        writer.write(payload[off:off + 65536])
        await writer.drain()
        assert writer.transport.get_write_buffer_size() == 0   # drain() means empty


@pytest.mark.timeout(30)
def test_echo_round_trip_through_the_registered_runtime(sk):
    payload = os.urandom(1 << 20)
    with runtimes.parse(RID).open() as port:
        got, line, rest = port.run(_echo_main, payload)
        probe = port.probe()
    assert got == payload and line == b"one line\n" and rest == b"rest"
    assert probe["source"] == "kernel probe" and probe["exit"]["lost_on_exit_bytes"] == 0
    assert probe["received_bytes"] == probe["sent_bytes"] == 2 * (len(payload) + 13)


@pytest.mark.timeout(30)
def test_close_releases_every_fd_even_with_work_left(sk):
    """Leaving a server, a connection with bytes buffered and a task behind:
    close() releases the selector and every socket (the suite's leak check
    watches the process as a whole; here the port's own fds are named)."""
    def fds():
        return set(os.listdir("/proc/self/fd"))
    before = fds()
    listener = runtimes.bind_listener(sockbuf=65536)
    own_fds = {}

    async def main(port):
        server = await port.start_server(lambda r, w: None, "127.0.0.1", 0)
        reader, writer = await port.open_connection(*listener.getsockname()[:2], sockbuf=65536)
        writer.write(bytes(4 << 20))               # the listener never accepts or reads
        port.create_task(port.sleep(60))
        own_fds["seen"] = fds() - before
        port.loop.stop()                           # leave without the exit policy
        await port.sleep(60)

    port = runtimes.parse(f"{RID}:exit=cancel").open()
    task = port.loop.create_task(main(port))
    port.loop.run_forever()
    assert len(own_fds["seen"]) >= 4               # selector, server, client, listener
    port.close()
    port.close()                                   # idempotent
    listener.close()
    assert not task.done() and port.probe()["lost_on_exit_bytes"] > 0
    assert fds() - before == set()


# ---------------------------------------------------------------------------
# The design choice: exit=flush delivers what main wrote; exit=cancel drops it

def _late_reader(sock: socket.socket, start_after_s: float, out: dict):
    def run():
        try:
            conn, _ = sock.accept()
            with conn:
                conn.settimeout(10)
                time.sleep(start_after_s)
                n = 0
                while data := conn.recv(65536):
                    n += len(data)
                out["received"] = n
        except OSError as exc:
            out["error"] = exc
    thread = threading.Thread(target=run, name="late-reader")
    thread.start()
    return thread


@pytest.mark.timeout(40)
@pytest.mark.parametrize("policy", ["flush", "cancel"])
def test_exit_policy_decides_what_write_close_return_loses(sk, policy):
    total = 4 << 20
    sock = runtimes.bind_listener(sockbuf=65536)
    sock.settimeout(10)
    out: dict = {}
    thread = _late_reader(sock, 0.3, out)

    async def main(port):
        _r, writer = await port.open_connection(*sock.getsockname()[:2], sockbuf=65536)
        writer.write(bytes(total))
        writer.close()                             # S3's naive program: and return

    try:
        with runtimes.parse(f"{RID}:exit={policy}").open() as port:
            port.run(main)
            probe = port.probe()
    finally:
        thread.join(15)
        sock.close()
    assert not thread.is_alive() and "error" not in out, out
    lost = probe["exit"]["lost_on_exit_bytes"]
    assert probe["exit"]["unsent_bytes"] > 0       # precondition: bytes were buffered at return
    if policy == "flush":
        assert out["received"] == total and lost == 0
    else:
        assert lost > 0 and out["received"] == total - lost


# ---------------------------------------------------------------------------
# Registration from outside the package

def test_registered_from_outside_with_its_schema_and_declarations(sk):
    info = runtimes.get(RID)
    assert info.origin.startswith("module") and not info.ours
    assert info.style == "stream" and info.primary_reference == "asyncio-streams"
    assert info.fingerprint is not None and "write_after_close" in info.differences
    assert runtimes.parse(f"{RID}:linger_s=2.5").options["linger_s"] == 2.5
    with pytest.raises(runtimes.UsageError, match=r"runtime selectkernel: .*exit.*flush\|cancel\|raise"):
        runtimes.parse(f"{RID}:exit=later")
    with pytest.raises(runtimes.UsageError, match="already registered"):
        runtimes.register(runtimes.RuntimeInfo(RID, "stream", "x.y:Z", info.options))


# ---------------------------------------------------------------------------
# One command each: the conformance suite and the CLI

@pytest.mark.timeout(SUBPROCESS_S + 30)
def test_conformance_suite_passes_apart_from_declared_differences(sk):
    cmd = [sys.executable, "-m", "pytest", "--pyargs", "protocols.conformance",
           "--looplab-runtime-module", MODULE, "--looplab-runtimes", RID,
           "-q", "-rsx", "-p", "no:cacheprovider", "--timeout", "120"]
    proc = subprocess.run(cmd, cwd=ROOT, env=_child_env(), capture_output=True, text=True,
                          timeout=SUBPROCESS_S)
    tail = proc.stdout[-3000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    assert " passed" in proc.stdout and " failed" not in proc.stdout, tail
    # the one declared difference is reported as such, not silently passed
    assert "declared contract differences" in proc.stdout, tail
    assert f"test_stream_write_after_close[{RID}]" in proc.stdout, tail


@pytest.mark.timeout(SUBPROCESS_S + 30)
def test_repro_runs_a_zoo_entry_on_it_and_the_zoo_table_has_its_column(sk, tmp_path):
    """`looplab repro` takes the runtime registered from outside like a built-in one:
    its cells run, and the zoo table (one column per runtime) shows it."""
    from bench.verbs import repro
    assert RID in repro.columns()
    env = _child_env()
    env[runtimes.ENV_VAR] = MODULE
    out = tmp_path / "zoo.json"
    cmd = [sys.executable, "-m", "bench", "repro", "cpython-32391", "--runtimes",
           f"{RID},asyncio-streams", "--preset", "tiny", "--json", str(out)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=SUBPROCESS_S)
    tail = proc.stdout[-3000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    cells = [c for c in json.loads(out.read_text())["cells"] if c["runtime"] == RID]
    assert {c["variant"] for c in cells} == {"naive", "fixed"}, tail
    assert all(not c["errors"] for c in cells), cells
    # exit=flush: write; close; return loses nothing here, unlike asyncio
    assert f"not shown on: {RID}" in proc.stdout, tail


@pytest.mark.timeout(SUBPROCESS_S + 30)
def test_cli_runs_s1_s3_and_s4_on_it_with_the_module_from_the_environment(sk, tmp_path):
    out = tmp_path / "results.json"
    env = _child_env()
    env[runtimes.ENV_VAR] = MODULE
    cmd = [sys.executable, "-m", "bench", "run", "--scenarios", "S1,S3,S4", "--variants", "naive",
           "--runtimes", RID, "--preset", "quick", "--json", str(out)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=SUBPROCESS_S)
    tail = proc.stdout[-3000:] + proc.stderr[-2000:]
    assert out.exists(), tail
    cells = {c["scenario"]: c for c in json.loads(out.read_text())["cells"]}
    assert set(cells) == {"S1", "S3", "S4"}, tail
    for cell in cells.values():
        assert cell["runtime"] == RID and not cell["errors"] and "skipped" not in cell, cell
    # S4: the measured row is the declared one; S3 naive: exit=flush loses nothing
    assert cells["S4"]["verdicts"] == {"matches_declared": True}, cells["S4"]["notes"]
    assert cells["S3"]["verdicts"]["no_loss"] is True, cells["S3"]
    assert cells["S3"]["metrics"]["lost_bytes"] == 0
    # S1 naive never awaits drain(): with no water marks the proxy's buffer grows
    # with the source's lead (3 MB/s in, 1 MB/s out), as on asyncio
    assert cells["S1"]["metrics"]["peak_user_buffer_bytes"] > 512 * 1024, cells["S1"]["metrics"]


@pytest.mark.timeout(20)
def test_a_second_concurrent_reader_is_refused_and_the_first_stays_intact(sk):
    listener = runtimes.bind_listener()

    async def main(port):
        reader, writer = await port.open_connection(*listener.getsockname()[:2])
        peer, _ = listener.accept()              # already queued: connect completed
        with peer:
            first = port.create_task(reader.read(10))
            await port.sleep(0.01)               # the first reader is waiting now
            try:
                await reader.read(10)
                second = "read"
            except RuntimeError:
                second = "refused"
            peer.sendall(b"hello")
            got = await port.wait_for(first, 5)
        writer.close()
        return second, got

    try:
        with runtimes.parse(RID).open() as port:
            second, got = port.run(main)
    finally:
        listener.close()
    assert (second, got) == ("refused", b"hello")


@pytest.mark.timeout(20)
def test_sigint_during_the_exit_flush_drops_the_rest_and_is_raised(sk):
    """A peer that never reads would hold exit=flush for linger_s; Ctrl-C ends
    it at once, counts what was dropped and reaches the caller."""
    import signal
    listener = runtimes.bind_listener(sockbuf=65536)     # never accepts, never reads

    async def main(port):
        _r, writer = await port.open_connection(*listener.getsockname()[:2], sockbuf=65536)
        writer.write(bytes(4 << 20))
        writer.close()
        port.loop.call_later(0.2, signal.raise_signal, signal.SIGINT)

    try:
        with runtimes.parse(f"{RID}:linger_s=10").open() as port:
            with pytest.raises(KeyboardInterrupt):
                port.run(main)
            report = port.probe()["exit"]
    finally:
        listener.close()
    assert report["interrupted"] is True and report["policy"] == "flush"
    assert report["lost_on_exit_bytes"] > 0 and report["exit_s"] < 5
