"""Loop-conformance probes of subprocesses and pipes: ``create_subprocess_exec`` and
``_shell`` with their pipes, return codes and signals, ``communicate``, the
``SubprocessProtocol`` callbacks of ``loop.subprocess_exec``, and
``connect_read_pipe``/``connect_write_pipe`` over ``os.pipe()``. Every child is a short
``python -c`` (this interpreter) that the probe waits for or kills. The rules of
``bench.fidelity.loops`` hold here.
"""
from __future__ import annotations

import os
import signal
import sys
import tempfile

from bench.fidelity.loops import _call, _raised, _wait, loop_probe
from bench.fidelity.promises import doc

_SIGNALLED = doc("subprocess", "asyncio.subprocess.Process.returncode",
                 "A negative value -N indicates that the child was terminated by signal N (POSIX "
                 "only).")


async def _create(make, key="create"):
    """(what awaiting ``make()`` gives, None), or (None, {key: what it raised}) for the
    probe to return: a loop refusing to start a child or connect a pipe is observed too."""
    try:
        return await make(), None
    except Exception as exc:
        return None, {key: _raised(exc)}


async def _spawn(a, code, **kw):
    """create_subprocess_exec() of this interpreter running ``code``: (proc, failed)."""
    return await _create(lambda: a.create_subprocess_exec(sys.executable, "-c", code, **kw))


async def _sleeper(a):
    return await _spawn(a, "import time; time.sleep(5)", stdin=a.subprocess.DEVNULL)


async def _reap(a, proc):
    if proc.returncode is None:
        proc.kill()
    await a.wait_for(proc.wait(), 5)


async def _signalled(a, how, *args):
    """A sleeping child, then ``proc.<how>(*args)``: what the call gives, what wait() gives."""
    proc, failed = await _sleeper(a)
    if failed:
        return failed
    out = {how: _call(lambda: getattr(proc, how)(*args))}
    out["wait"] = await _wait(a, proc.wait(), 5)
    await _reap(a, proc)
    return out


# --- processes -----------------------------------------------------------------------------

@loop_probe(promise=doc("subprocess", "asyncio.subprocess.Process.communicate",
                        "read data from stdout and stderr, until EOF is reached"))
async def lp_proc_communicate(a):
    """create_subprocess_exec() with stdout and stderr piped: communicate() returns both,
    and the return code."""
    proc, failed = await _spawn(a, "import sys; print('out'); print('err', file=sys.stderr)",
                                stdout=a.subprocess.PIPE, stderr=a.subprocess.PIPE)
    if failed:
        return failed
    out, err = await a.wait_for(proc.communicate(), 5)
    return {"stdout": out.decode().strip(), "stderr": err.decode().strip(), "returncode": proc.returncode}


@loop_probe(promise=doc("subprocess", "asyncio.subprocess.Process.communicate",
                        "The optional input argument is the data (bytes object) that will be sent "
                        "to the child process."))
async def lp_proc_communicate_input(a):
    """communicate(input=...) to a child that echoes its stdin."""
    proc, failed = await _spawn(a, "import sys; sys.stdout.write(sys.stdin.read().upper())",
                                stdin=a.subprocess.PIPE, stdout=a.subprocess.PIPE)
    if failed:
        return failed
    out, _ = await a.wait_for(proc.communicate(b"hello"), 5)
    return {"stdout": out.decode()}


@loop_probe(promise=doc("subprocess", "asyncio.subprocess.Process.communicate",
                        "2. closes stdin; 3. read data from stdout and stderr, until EOF is "
                        "reached;", since="3.12"))
async def lp_proc_communicate_closes_stdin(a):
    """communicate() without input to a child that reads stdin to its end (3.12 closes
    stdin; 3.11 left it open, and the child waits)."""
    proc, failed = await _spawn(a, "import sys; print(len(sys.stdin.read()))",
                                stdin=a.subprocess.PIPE, stdout=a.subprocess.PIPE)
    if failed:
        return failed
    try:
        out, _ = await a.wait_for(proc.communicate(), 1)
        res = out.decode().strip()
    except TimeoutError:
        res = "still waiting"
    await _reap(a, proc)
    return {"communicate": res}


@loop_probe(promise=doc("subprocess", "asyncio.subprocess.Process.returncode",
                        "A None value indicates that the process has not terminated yet."))
async def lp_proc_returncode_running(a):
    """returncode while the child runs, then after wait()."""
    proc, failed = await _sleeper(a)
    if failed:
        return failed
    out = {"running": proc.returncode}
    proc.kill()
    await a.wait_for(proc.wait(), 5)
    return {**out, "after": proc.returncode is not None}


@loop_probe(promise=doc("subprocess", "asyncio.subprocess.Process.wait",
                        "Wait for the child process to terminate."))
async def lp_proc_wait(a):
    """wait() returns the exit code of sys.exit(3), and sets returncode."""
    proc, failed = await _spawn(a, "raise SystemExit(3)")
    if failed:
        return failed
    return {"wait": await _wait(a, proc.wait(), 5), "returncode": proc.returncode}


@loop_probe()
async def lp_proc_wait_twice(a):
    """wait() again after the child was reaped."""
    proc, failed = await _spawn(a, "pass")
    if failed:
        return failed
    return {"first": await _wait(a, proc.wait(), 5), "second": await _wait(a, proc.wait(), 5)}


@loop_probe(promise=_SIGNALLED)
async def lp_proc_kill(a):
    """kill(): the return code is -SIGKILL."""
    proc, failed = await _sleeper(a)
    if failed:
        return failed
    out = {"kill": _call(lambda: proc.kill())}
    return {**out, "wait": await _wait(a, proc.wait(), 5)}


@loop_probe(promise=_SIGNALLED)
async def lp_proc_terminate(a):
    """terminate(): the return code is -SIGTERM."""
    return await _signalled(a, "terminate")


@loop_probe(promise=doc("subprocess", "asyncio.subprocess.Process.send_signal",
                        "Sends the signal signal to the child process."))
async def lp_proc_send_signal(a):
    """send_signal(SIGUSR1) to a child without a handler: the return code is -SIGUSR1."""
    return await _signalled(a, "send_signal", signal.SIGUSR1)


@loop_probe()
async def lp_proc_kill_after_exit(a):
    """kill() after the child exited and was reaped."""
    proc, failed = await _spawn(a, "pass")
    if failed:
        return failed
    await a.wait_for(proc.wait(), 5)
    return {"kill": _call(lambda: proc.kill())}


@loop_probe(promise=doc("subprocess", "asyncio.subprocess.Process.pid",
                        "Process identification number (PID)."))
async def lp_proc_pid(a):
    """pid is the child's own os.getpid()."""
    proc, failed = await _spawn(a, "import os; print(os.getpid())", stdout=a.subprocess.PIPE)
    if failed:
        return failed
    out, _ = await a.wait_for(proc.communicate(), 5)
    return {"same": int(out) == proc.pid}


@loop_probe(promise=doc("subprocess", "asyncio.subprocess.Process.stdin",
                        "If PIPE is passed to stdin argument, the Process.stdin attribute will "
                        "point to a StreamWriter instance."))
async def lp_proc_stdin_writer(a):
    """stdin=PIPE: a StreamWriter; write(), drain() and close() reach the child."""
    proc, failed = await _spawn(a, "import sys; print(sys.stdin.read()[::-1])",
                                stdin=a.subprocess.PIPE, stdout=a.subprocess.PIPE)
    if failed:
        return failed
    out = {"is_writer": isinstance(proc.stdin, a.StreamWriter)}
    proc.stdin.write(b"abc")
    out["drain"] = await _wait(a, proc.stdin.drain())
    proc.stdin.close()
    out["stdout"] = (await a.wait_for(proc.stdout.read(), 5)).decode().strip()
    await _reap(a, proc)
    return out


@loop_probe(promise=doc("subprocess", "asyncio.subprocess.STDOUT",
                        "Special value that can be used as the stderr argument and indicates that "
                        "standard error should be redirected into standard output."))
async def lp_proc_stderr_to_stdout(a):
    """stderr=STDOUT: what the child writes to stderr comes out of stdout."""
    proc, failed = await _spawn(a, "import sys; print('e', file=sys.stderr, flush=True)",
                                stdout=a.subprocess.PIPE, stderr=a.subprocess.STDOUT)
    if failed:
        return failed
    out, err = await a.wait_for(proc.communicate(), 5)
    return {"stdout": out.decode().strip(), "stderr": err}


@loop_probe()
async def lp_proc_devnull(a):
    """stdout=DEVNULL: proc.stdout is None, and the child runs to its end."""
    proc, failed = await _spawn(a, "print('x')", stdout=a.subprocess.DEVNULL)
    if failed:
        return failed
    return {"stdout": proc.stdout, "wait": await _wait(a, proc.wait(), 5)}


@loop_probe(promise=doc("subprocess", "asyncio.create_subprocess_shell",
                        "Run the cmd shell command."))
async def lp_proc_shell(a):
    """create_subprocess_shell('echo hi; exit 4'): the output and the return code."""
    proc, failed = await _create(lambda: a.create_subprocess_shell("echo hi; exit 4",
                                                                   stdout=a.subprocess.PIPE))
    if failed:
        return failed
    out, _ = await a.wait_for(proc.communicate(), 5)
    return {"stdout": out.decode().strip(), "returncode": proc.returncode}


@loop_probe()
async def lp_proc_not_found(a):
    """create_subprocess_exec() of a program that does not exist."""
    proc, failed = await _create(lambda: a.create_subprocess_exec("/nonexistent/no-such-program"))
    if failed:
        return failed
    await _reap(a, proc)
    return {"create": "created"}


@loop_probe()
async def lp_proc_text_mode(a):
    """create_subprocess_exec(text=True) (the docs: "should not be specified at all")."""
    proc, failed = await _spawn(a, "pass", text=True)
    if failed:
        return failed
    await _reap(a, proc)
    return {"create": "created"}


@loop_probe(promise=doc("eventloop", "asyncio.loop.subprocess_exec",
                        "All other keyword arguments are passed to subprocess.Popen without "
                        "interpretation, except for bufsize, universal_newlines, shell, text, "
                        "encoding and errors, which should not be specified at all."))
async def lp_proc_cwd_and_env(a):
    """cwd= and env= reach the child (passed to subprocess.Popen)."""
    d = tempfile.mkdtemp()
    proc, failed = await _spawn(a, "import os; print(os.getcwd(), os.environ.get('PROBE'))",
                                stdout=a.subprocess.PIPE, cwd=d, env={"PROBE": "yes"})
    if failed:
        os.rmdir(d)
        return failed
    out, _ = await a.wait_for(proc.communicate(), 5)
    cwd, env = out.decode().split()
    os.rmdir(d)
    return {"cwd": os.path.realpath(cwd) == os.path.realpath(d), "env": env}


@loop_probe()
async def lp_proc_write_after_exit(a):
    """The child exited without reading: write() and drain() on its stdin."""
    proc, failed = await _spawn(a, "pass", stdin=a.subprocess.PIPE)
    if failed:
        return failed
    await a.wait_for(proc.wait(), 5)
    await a.sleep(0.02)
    out = {"write": _call(lambda: proc.stdin.write(b"x" * 100_000)), "drain": await _wait(a, proc.stdin.drain())}
    proc.stdin.close()
    return out


@loop_probe()
async def lp_proc_concurrent(a):
    """Four children at once, each exiting with its own code: every wait() gets its own."""
    async def four():
        return [await a.create_subprocess_exec(sys.executable, "-c", f"raise SystemExit({i})")
                for i in range(4)]
    procs, failed = await _create(four)
    if failed:
        return failed
    return {"codes": await a.wait_for(a.gather(*(p.wait() for p in procs)), 5)}


# --- the SubprocessProtocol API ------------------------------------------------------------

def _proc_proto(a, events):
    class P(a.SubprocessProtocol):
        pipe_data_received = lambda self, fd, data: events.append(["data", fd, data.decode()])  # noqa: E731
        pipe_connection_lost = lambda self, fd, exc: events.append(["pipe_lost", fd])  # noqa: E731
        process_exited = lambda self: events.append(["exited"])  # noqa: E731
    return P


async def _exec(a, events, code, **kw):
    """loop.subprocess_exec() of this interpreter running ``code``, its protocol recording
    into ``events``: (transport, failed)."""
    made, failed = await _create(lambda: a.get_running_loop().subprocess_exec(
        _proc_proto(a, events), sys.executable, "-c", code, **kw), "subprocess_exec")
    return made[0] if made else None, failed


async def _exited(a, events, pipes=0):
    """Polls (1 s at most) until process_exited() has come, and the loss of ``pipes`` pipes."""
    for _ in range(100):
        if ["exited"] in events and (not pipes or sum(e[0] == "pipe_lost" for e in events) == pipes):
            break
        await a.sleep(0.01)


@loop_probe(promise=doc("protocol", "asyncio.SubprocessProtocol.pipe_data_received",
                        "Called when the child process writes data into its stdout or stderr pipe."))
async def lp_proc_protocol_data(a):
    """loop.subprocess_exec(): pipe_data_received(1, ...) for stdout and (2, ...) for stderr."""
    events = []
    t, failed = await _exec(a, events, "import sys; sys.stdout.write('o'); sys.stdout.flush(); "
                            "sys.stderr.write('e')", stdin=None)
    if failed:
        return failed
    await _exited(a, events, pipes=2)
    t.close()
    return {"data": sorted(e[1:] for e in events if e[0] == "data")}


@loop_probe(promise=doc("protocol", "asyncio.SubprocessProtocol.process_exited",
                        "Called when the child process has exited."))
async def lp_proc_protocol_exited(a):
    """process_exited() is called once, and both pipes report their loss."""
    events = []
    t, failed = await _exec(a, events, "pass", stdin=None)
    if failed:
        return failed
    await _exited(a, events, pipes=2)
    t.close()
    return {"exited": events.count(["exited"]), "pipes_lost": sorted(e[1] for e in events if e[0] == "pipe_lost")}


@loop_probe(promise=doc("protocol", "asyncio.SubprocessTransport.get_returncode",
                        "Return the subprocess return code as an integer or None if it hasn't "
                        "returned, which is similar to the subprocess.Popen.returncode attribute."))
async def lp_proc_transport_returncode(a):
    """SubprocessTransport: get_pid() is an int, get_returncode() None while it runs, then
    the exit code."""
    events = []
    t, failed = await _exec(a, events, "import sys; sys.stdin.read(); sys.exit(5)")
    if failed:
        return failed
    out = {"pid_int": isinstance(t.get_pid(), int), "running": _call(lambda: t.get_returncode())}
    t.get_pipe_transport(0).close()
    await _exited(a, events)
    out["exited"] = _call(lambda: t.get_returncode())
    t.close()
    return out


@loop_probe(promise=doc("protocol", "asyncio.SubprocessTransport.get_pipe_transport",
                        "Return the transport for the communication pipe corresponding to the "
                        "integer file descriptor fd:"))
async def lp_proc_pipe_transports(a):
    """get_pipe_transport(0/1/2): a write transport, two read transports; 3: None."""
    events = []
    t, failed = await _exec(a, events, "import sys; sys.stdin.read()")
    if failed:
        return failed
    out = {"stdin_writes": hasattr(t.get_pipe_transport(0), "write"),
           "stdout_reads": hasattr(t.get_pipe_transport(1), "pause_reading"),
           "stderr_reads": hasattr(t.get_pipe_transport(2), "pause_reading"),
           "fd3": _call(lambda: t.get_pipe_transport(3))}
    t.kill()
    await _exited(a, events)
    t.close()
    return out


# --- pipes ---------------------------------------------------------------------------------

def _pipe_proto(a, events):
    class P(a.Protocol):
        data_received = lambda self, d: events.append(["data", d.decode()])  # noqa: E731
        eof_received = lambda self: events.append(["eof"])  # noqa: E731
        connection_lost = lambda self, e: events.append(["lost", type(e).__name__ if e else None])  # noqa: E731
    return P


async def _pipe(a, proto, end="read"):
    """os.pipe() with its ``end`` ("read" or "write") connected to the loop by
    connect_{end}_pipe(): (transport, r, w, failed); when it failed, r and w are closed."""
    r, w = os.pipe()
    fd, mode, how = (r, "rb", "connect_read_pipe") if end == "read" else (w, "wb", "connect_write_pipe")
    made, failed = await _create(lambda: getattr(a.get_running_loop(), how)(proto, os.fdopen(fd, mode, 0)), how)
    if failed:
        os.close(r), os.close(w)
    return made[0] if made else None, r, w, failed


@loop_probe(promise=doc("eventloop", "asyncio.loop.connect_read_pipe",
                        "Register the read end of pipe in the event loop."))
async def lp_pipe_read(a):
    """connect_read_pipe() on os.pipe(): the data, then EOF and connection_lost(None)
    when the write end closes."""
    events = []
    t, r, w, failed = await _pipe(a, _pipe_proto(a, events))
    if failed:
        return failed
    os.write(w, b"abc")
    os.close(w)
    await a.sleep(0.05)
    t.close()
    return {"events": events}


@loop_probe(promise=doc("eventloop", "asyncio.loop.connect_write_pipe",
                        "Register the write end of pipe in the event loop."))
async def lp_pipe_write(a):
    """connect_write_pipe(): written bytes reach the read end; close() gives it EOF."""
    t, r, w, failed = await _pipe(a, a.Protocol, end="write")
    if failed:
        return failed
    out = {"write": _call(lambda: t.write(b"piped"))}
    t.close()
    await a.sleep(0.02)
    out["read_end_got"] = os.read(r, 100).decode()
    out["then_eof"] = os.read(r, 100) == b""
    os.close(r)
    return out


@loop_probe()
async def lp_pipe_write_reader_closed(a):
    """Writing to a pipe whose read end is closed: connection_lost()'s exception."""
    events = []
    t, r, w, failed = await _pipe(a, _pipe_proto(a, events), end="write")
    if failed:
        return failed
    os.close(r)
    await a.sleep(0.02)
    out = {"write": _call(lambda: t.write(b"x" * 10))}
    await a.sleep(0.02)
    t.close()
    return {**out, "events": events}


@loop_probe(promise=doc("protocol", "asyncio.ReadTransport.pause_reading",
                        "No data will be passed to the protocol's protocol.data_received() "
                        "method until resume_reading() is called."))
async def lp_pipe_pause_reading(a):
    """A read pipe paused: nothing arrives until resume_reading()."""
    events = []
    t, r, w, failed = await _pipe(a, _pipe_proto(a, events))
    if failed:
        return failed
    t.pause_reading()
    os.write(w, b"held")
    await a.sleep(0.03)
    out = {"while_paused": list(events)}
    t.resume_reading()
    await a.sleep(0.03)
    os.close(w)
    await a.sleep(0.02)
    t.close()
    return {**out, "after": events[:1]}


@loop_probe(promise=doc("protocol", "asyncio.BaseTransport.close",
                        "If the transport has a buffer for outgoing data, buffered data will be "
                        "flushed asynchronously."))
async def lp_pipe_write_close_flushes(a):
    """1 MB written to a pipe nobody reads yet, then close(): the reader still gets it all."""
    t, r, w, failed = await _pipe(a, a.Protocol, end="write")
    if failed:
        return failed
    t.write(b"x" * 1_000_000)
    t.close()
    got, f = 0, os.fdopen(r, "rb", 0)
    reader = a.get_running_loop().run_in_executor(None, f.read)
    got = len(await a.wait_for(reader, 5))
    f.close()
    return {"received": got}


@loop_probe()
async def lp_pipe_read_regular_file(a):
    """connect_read_pipe() on a regular file (not a pipe)."""
    with tempfile.TemporaryFile() as f:
        try:
            t, _ = await a.get_running_loop().connect_read_pipe(a.Protocol, f)
            t.close()
            return {"connect_read_pipe": "connected"}
        except Exception as exc:
            return {"connect_read_pipe": _raised(exc)}
