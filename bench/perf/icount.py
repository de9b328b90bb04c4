"""Instruction counts per echo request for one runtime's server, under callgrind.

Wall-clock figures on a shared 2-CPU machine are too noisy to decide a ±5 % change;
instruction counts are not. This runs ``looplab serve echo`` for a runtime under
``valgrind --tool=callgrind`` twice, with a plain blocking client (a separate,
uninstrumented process) doing ``small`` and then ``large`` lock-step round trips
spread over ``connections`` sockets, and reports

    (instructions(large) - instructions(small)) / (large - small)

so start-up, imports and connection set-up cancel out. A developer tool, not a
benchmark verb::

    python -m bench.perf.icount RUNTIME... [--conns 10] [--size 1024] [--small 2000] [--large 10000]
                                      [--pause 0.005] [--cache-sim]

With ``--micro OP`` it counts a micro-benchmark of ``bench.perf.micro`` instead: the whole
process runs under callgrind once with ``small`` and once with ``large`` operations, and
the difference is divided the same way (everything but the operations cancels out).
Counts of operations that wait on the clock (timers) depend on how often the loop finds
nothing to do, so only the scheduling operations are reproducible::

    python -m bench.perf.icount --micro spawn_join coro curio [--small 2000] [--large 10000]

``floor`` in place of a runtime counts ``bench.perf.nokernel``: the echo app served
by the least a Python reactor does (epoll, ``os.read``, the app, ``os.write``), or with
``--micro spawn_join`` spawn+join with no kernel at all: the least the API itself costs
in this interpreter (``floor@3.13``: in that one).

Echo servers are counted as given. A reference library's runtime given as is carries
its port's measuring proxy (``instrument=true``: about 6,000 instructions a request on
the protocol path on 3.11, 4,000 on 3.13), which the benchmarks turn off: the tool says
so on stderr, and ``looplab bench goals --instructions`` counts every goal's runtimes as
benchmarked. (``--micro`` counts them as the micro-benchmarks run them, proxy off.)

Needs valgrind on PATH. Every process it starts is stopped before it returns.
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

from bench.host import envs
from bench.host import procs
from bench.errors import UsageError
from bench.perf.machine import bench_runtime
from bench import runtimes


def _file_part(spec: str) -> str:
    """A runtime spec as part of a file name (an interpreter path has slashes)."""
    return re.sub(r"[^\w.=-]", "_", spec)


def round_trips(socks, size, requests, pause=0.0):
    """``requests`` lock-step echo round trips of ``size`` bytes: each round sends one
    message on every socket, then reads every echo back, then sleeps ``pause``."""
    payload = b"x" * size
    done = 0
    while done < requests:
        batch = socks[:requests - done]
        for s in batch:
            s.sendall(payload)
        for s in batch:
            got = 0
            while got < size:
                chunk = s.recv(size - got)
                if not chunk:
                    raise RuntimeError("server closed")
                got += len(chunk)
        done += len(batch)
        if pause:
            time.sleep(pause)


def _client(host, port, conns, size, requests, pid, pause, max_s=600.0):
    socks = [socket.create_connection((host, port)) for _ in range(conns)]
    try:
        for s in socks:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.settimeout(max_s)
        round_trips(socks, size, 5 * conns)           # warm-up, not instrumented
        # Instrumentation starts when the server next runs; single pings on one
        # connection wake it until callgrind_control says it is on. A few of
        # them are counted in (how many varies): with --large - --small = 2000
        # that is a few hundred instructions per request, and with several
        # connections the number of requests one pass finds varies too. Repeat
        # a measurement and trust only differences larger than its spread.
        ctl = subprocess.Popen(["callgrind_control", "-i", "on", str(pid)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            while ctl.poll() is None:
                round_trips(socks[:1], size, 1)
                time.sleep(0.3)
        finally:                      # interrupted (Ctrl-C): the helper goes too
            if ctl.poll() is None:
                ctl.kill()
            ctl.wait()
        round_trips(socks, size, requests, pause)
    finally:
        for s in socks:
            s.close()


def instructions(runtime, conns, size, requests, out_dir, extra=(), pause=0.0):
    out = os.path.join(out_dir, f"cg.{_file_part(runtime)}.c{conns}.{requests}.out")
    floor, _, at = runtime.partition("@")
    if floor == runtimes.FLOOR:     # bench.perf.nokernel's echo: the least a Python reactor does
        python = envs.find(at).path if at else sys.executable
        serve = [python, "-m", "bench.perf.nokernel", "echo"]
    else:
        serve = procs.python_command("bench", "serve", "echo", "--runtime", runtime,
                                     python=envs.interpreter_for(runtime))
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
           f"--callgrind-out-file={out}", *extra, *serve]
    proc = procs.spawn(cmd, env=procs.child_env({"PYTHONHASHSEED": "0"}),
                       stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()
        m = re.match(r"listening on ([\d.]+):(\d+)", line)
        if not m:
            raise RuntimeError(f"server did not start: {line!r}")
        _client(m.group(1), int(m.group(2)), conns, size, requests, proc.pid, pause)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with open(out) as f:
        for line in f:
            if line.startswith("summary:") or line.startswith("totals:"):
                return [int(x) for x in line.split()[1:]], out
    raise RuntimeError(f"no totals in {out}")


def micro_instructions(op, runtime, n, out_dir, extra=()):
    """Instructions of one process that runs micro-benchmark ``op`` once with ``n``
    operations on ``runtime`` (imports and port set-up included: they cancel out)."""
    out = os.path.join(out_dir, f"cg.micro.{op}.{_file_part(runtime)}.{n}.out")
    env = procs.child_env({"PYTHONHASHSEED": "0"})
    code = ("import sys; from bench.perf.micro import micro; r = micro(sys.argv[1], sys.argv[2], "
            "int(sys.argv[3])); sys.exit(r.error)")
    floor, _, at = runtime.partition("@")
    if floor == runtimes.FLOOR:     # bench.perf.nokernel: spawn+join with no kernel at all
        if op != "spawn_join":
            raise SystemExit("python -m bench.perf.icount: the floor is measured for spawn_join only")
        code = "import sys; from bench.perf.nokernel import run; run(int(sys.argv[3]))"
        # floor@3.13: the floor needs no library, only that interpreter
        python = envs.find(at).path if at else sys.executable
    else:
        python = envs.interpreter_for(runtime)
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *extra,
           python, "-c", code, op, runtime, str(n)]
    proc = subprocess.run(cmd, cwd=procs.ROOT, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, timeout=1800)
    if proc.returncode != 0:
        # valgrind's own lines ("==PID== ...") end stderr; the program's error is above
        said = [ln for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith("==")]
        raise RuntimeError(f"{op} on {runtime} failed: {said[-1][-300:] if said else 'no output'}")
    with open(out) as f:
        for line in f:
            if line.startswith("summary:") or line.startswith("totals:"):
                return [int(x) for x in line.split()[1:]], out
    raise RuntimeError(f"no totals in {out}")


def ops_per_n(op: str) -> int:
    from bench.perf.micro import YIELD_MANY_TASKS
    return {"yield": 2, "yield_many": YIELD_MANY_TASKS}.get(op, 1)


def per_request(runtime, conns, size, small, large, out_dir, extra=(), pause=0.0):
    """Callgrind's counters per echo request, ``small`` and ``large`` requests
    apart: ``(per-request counters, totals at small, totals at large, file)``."""
    a, _ = instructions(runtime, conns, size, small, out_dir, extra, pause)
    b, path = instructions(runtime, conns, size, large, out_dir, extra, pause)
    return [(y - x) / (large - small) for x, y in zip(a, b)], a, b, path


def per_operation(op, runtime, small, large, out_dir):
    """Instructions per micro-benchmark operation, two whole processes ``small``
    and ``large`` operations apart: ``(per operation, total at small, at large, file)``
    (operations per n: yield is two tasks yielding n times each, and so on)."""
    a, _ = micro_instructions(op, runtime, small, out_dir)
    b, path = micro_instructions(op, runtime, large, out_dir)
    return (b[0] - a[0]) / (large - small) / ops_per_n(op), a[0], b[0], path


def _say_if_instrumented(spec: str) -> None:
    """A reference counted as given carries its port's measuring proxy (thousands of
    instructions a request), which the timed benchmarks turn off: say so, since
    comparing it with our kernels is then not like for like."""
    if spec.partition("@")[0] == runtimes.FLOOR:
        return
    try:
        rt = runtimes.parse(spec)
    except UsageError:        # a bad spec fails in the server, with its own line
        return
    served = bench_runtime(rt).spec
    if served != rt.spec:
        print(f"note: {spec} is counted with its measuring proxy on; the benchmarks serve "
              f"{served}", file=sys.stderr)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.perf.icount")
    ap.add_argument("runtimes", nargs="+")
    ap.add_argument("--conns", type=int, default=10)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--small", type=int, default=2000)
    ap.add_argument("--large", type=int, default=10000)
    ap.add_argument("--pause", type=float, default=0.0,
                    help="seconds between rounds: the server is idle in its poller when each "
                         "round arrives, so every round takes the same path and the count is "
                         "reproducible (without it, how many requests one pass finds varies)")
    ap.add_argument("--keep", default=None, help="directory for the callgrind files")
    ap.add_argument("--cache-sim", action="store_true",
                    help="also simulate the caches: last-level misses per request")
    ap.add_argument("--micro", default=None, metavar="OP",
                    help="count a bench.perf.micro operation (spawn_join, yield, ...) per operation "
                         "instead of echo requests")
    args = ap.parse_args(argv)
    out_dir = args.keep or tempfile.mkdtemp(prefix="icount-")
    os.makedirs(out_dir, exist_ok=True)
    if args.micro:
        for rt in args.runtimes:
            per, a, b, path = per_operation(args.micro, rt, args.small, args.large, out_dir)
            print(f"{rt:24s} {args.micro} instr/op={per:10.0f}  ({a} @ {args.small}, "
                  f"{b} @ {args.large}; {path})", flush=True)
        return 0
    for rt in args.runtimes:
        _say_if_instrumented(rt)
        extra = ("--cache-sim=yes",) if args.cache_sim else ()
        per, a, b, path = per_request(rt, args.conns, args.size, args.small, args.large,
                                      out_dir, extra, args.pause)
        line = (f"{rt:24s} conns={args.conns} size={args.size} instr/request={per[0]:10.0f}")
        if args.cache_sim and len(per) >= 9:
            # callgrind's order: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw
            line += (f"  I1 misses/request={per[3]:7.1f}"
                     f"  D1 misses/request={per[4] + per[5]:7.1f}"
                     f"  LL misses/request={per[6] + per[7] + per[8]:7.1f}")
        print(f"{line}  ({a[0]} @ {args.small}, {b[0]} @ {args.large}; {path})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
