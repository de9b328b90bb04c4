"""System calls per echo request for one runtime's server, counted by the Linux kernel.

CPU time per request is noisy on a shared machine; how many system calls a server
makes per request is not, and each one costs kernel time and, in a Python server,
the GIL's release and re-acquisition. This serves each runtime as ``looplab bench``
serves it (pinned, uninstrumented), drives it with the same C load client, and
counts the server's system calls over the client's counted window with
``perf stat`` on the kernel's syscall tracepoints. perf attaches just after the
window opens, so the counts run low by the time that takes (about 1 % of a 2 s
window here): compare runtimes counted the same way, not against exact integers. A developer tool, not a
benchmark verb::

    python -m bench.perf.syscalls RUNTIME... [--conns 10] [--size 1024]
                                             [--duration 2] [--repeat 3]

It prints, per runtime and round, the calls per request by name (those above 0.01)
and their total. The runtimes are interleaved in rounds, as the benchmarks do.
Needs ``perf`` on PATH and tracepoints it may read (root, or
``kernel.perf_event_paranoid`` at most 1); without them it says so and exits 3
before starting anything. Counting adds a little to each call, so the CPU time of
these runs is not a benchmark.
"""
from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import time

from bench import procs
from bench.errors import ExitCode, UsageError
from bench.perf.loadgen import ServerProcess, client_command, load_client
from bench.perf.machine import MeasureError, bench_runtime, cpu_plan, pin, read_line, stop_process
from protocols import runtimes

# The calls an echo server makes; "all" is every system call, named or not.
CALLS = ("recvfrom", "sendto", "read", "write", "poll", "ppoll", "select", "epoll_wait",
         "epoll_pwait", "epoll_ctl", "recvmsg", "sendmsg", "readv", "writev")
_ALL = "raw_syscalls:sys_enter"


def _events() -> list[str]:
    return [_ALL] + [f"syscalls:sys_enter_{name}" for name in CALLS]


def unavailable() -> str | None:
    """Why perf can't count the tracepoints here, or None."""
    if shutil.which("perf") is None:
        return "perf is not on PATH (Debian/Ubuntu: apt install linux-perf or linux-tools)"
    probe = subprocess.run(["perf", "stat", "-x,", "-e", _ALL, "--", "true"],
                           capture_output=True, text=True, timeout=60)
    if probe.returncode != 0 or "<not supported>" in probe.stderr or "<not counted>" in probe.stderr:
        said = [ln for ln in probe.stderr.splitlines() if ln.strip()]
        return ("perf can't read the syscall tracepoints here (root, or "
                f"sysctl kernel.perf_event_paranoid=1): {said[-1] if said else 'no output'}")
    return None


def _parse(text: str) -> dict[str, int]:
    counts = {}
    for line in text.splitlines():
        fields = line.split(",")
        if len(fields) > 2 and fields[0].strip().isdigit():
            name = fields[2].replace("syscalls:sys_enter_", "")
            counts["all" if name == _ALL else name] = int(fields[0])
    return counts


def count(spec: str, conns: int, size: int, duration: float, client) -> dict:
    """One run: ``{"requests": n, "per_request": {call: calls per request}}``."""
    server_cpu, client_cpu = cpu_plan(True)
    server = ServerProcess(bench_runtime(runtimes.parse(spec)).spec, cpu=server_cpu).start()
    proc = perf = None
    try:
        host, port = server.address
        proc = procs.spawn(client_command(client, host, port, conns, size, 1.0, duration))
        pin(proc.pid, client_cpu)
        buf = bytearray()
        if read_line(proc, buf, time.monotonic() + 31) != "W":
            raise MeasureError("load client did not start its window")
        perf = subprocess.Popen(["perf", "stat", "-x,", "-e", ",".join(_events()),
                                 "-p", str(server.pid)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        line = read_line(proc, buf, time.monotonic() + duration + 30)
        perf.send_signal(signal.SIGINT)
        said = perf.communicate(timeout=30)[1]
        if not line:
            raise MeasureError(f"load client gave no result; server alive: {server.alive()}")
        try:
            requests = json.loads(line)["requests"]
        except (ValueError, KeyError, TypeError):
            raise MeasureError(f"load client printed {line[:200]!r}") from None
        if requests < 1:
            raise MeasureError("no request was answered in the window")
        counts = _parse(said)
        if "all" not in counts:
            raise MeasureError(f"perf counted nothing: {said.strip()[-200:]}")
        return {"requests": requests, "per_request": {k: v / requests for k, v in counts.items()}}
    finally:
        if perf is not None and perf.poll() is None:
            perf.kill()
            perf.wait()
        if proc is not None:
            stop_process(proc, 2.0)
        server.stop()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.perf.syscalls",
                                 description="System calls per echo request of each runtime's "
                                             "server under the C load client (perf tracepoints).")
    ap.add_argument("runtimes", nargs="+", help="runtime specs, e.g. coro coro:read=ready uvloop-streams")
    ap.add_argument("--conns", type=int, default=10, help="connections (default 10)")
    ap.add_argument("--size", type=int, default=1024, help="message bytes (default 1024)")
    ap.add_argument("--duration", type=float, default=2.0, help="counted seconds per run (default 2)")
    ap.add_argument("--repeat", type=int, default=3, help="rounds (default 3)")
    args = ap.parse_args(argv)
    for spec in args.runtimes:
        try:
            runtimes.parse(spec)
        except UsageError as exc:          # one line, nothing started
            print(f"python -m bench.perf.syscalls: {exc}", file=sys.stderr)
            return ExitCode.USAGE
    if args.conns < 1 or args.size < 1 or args.duration <= 0 or args.repeat < 1:
        print("python -m bench.perf.syscalls: --conns, --size and --repeat must be >= 1, "
              "--duration > 0", file=sys.stderr)
        return ExitCode.USAGE
    reason = unavailable()
    if reason:
        print(f"python -m bench.perf.syscalls: {reason}", file=sys.stderr)
        return ExitCode.ENVIRONMENT
    client = load_client("auto")
    for rnd in range(args.repeat):
        for spec in args.runtimes:
            try:
                got = count(spec, args.conns, args.size, args.duration, client)
            except MeasureError as exc:
                print(f"round {rnd + 1} {spec}: error: {exc}", flush=True)
                continue
            except KeyboardInterrupt:      # every process it started is already stopped
                print(f"python -m bench.perf.syscalls: interrupted in round {rnd + 1} at {spec}; "
                      "the lines above are complete", file=sys.stderr)
                return ExitCode.INTERRUPTED
            per = got["per_request"]
            named = "  ".join(f"{k} {v:.2f}" for k, v in sorted(per.items())
                              if k != "all" and v >= 0.01)
            print(f"round {rnd + 1} {spec:24s} {got['requests']:7d} requests  "
                  f"system calls/request {per['all']:.2f}  ({named})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
