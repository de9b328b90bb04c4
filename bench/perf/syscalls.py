"""System calls per echo request for one runtime's server, counted by the Linux kernel.

CPU time per request is noisy on a shared machine; how many system calls a server
makes per request is not, and each one costs kernel time and, in a Python server,
the GIL's release and re-acquisition. This serves each runtime as ``looplab bench``
serves it (pinned, uninstrumented), drives it with the same C load client, and
counts the server's system calls over the client's counted window with
``perf stat`` on the kernel's syscall tracepoints, its counters switched on and off
by the client's own window marks (``perf stat --control``, perf 5.10 or later). A developer tool, not a
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
import os
import select
import shutil
import signal
import subprocess
import sys

from bench.errors import ExitCode, UsageError
from bench.perf.echo import client_window
from bench.perf.loadgen import ServerProcess, load_client
from bench.perf.machine import MeasureError, bench_runtime, cpu_plan
from bench import runtimes

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


class _Perf:
    """``perf stat`` attached to ``pid`` with its counters off until ``enable()``:
    the counted window is exactly the one the caller opens and closes."""

    def __init__(self, pid: int):
        self._ctl_r, self._ctl_w = os.pipe()
        self._ack_r, self._ack_w = os.pipe()
        try:
            self.proc = subprocess.Popen(
                ["perf", "stat", "-x,", "-e", ",".join(_events()), "--delay=-1",
                 f"--control=fd:{self._ctl_r},{self._ack_w}", "-p", str(pid)],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                pass_fds=(self._ctl_r, self._ack_w))
        except BaseException:
            self._close_fds()
            raise

    def _say(self, command: str) -> None:
        os.write(self._ctl_w, command.encode() + b"\n")
        ready = select.select([self._ack_r], [], [], 10)[0]
        if not ready or not os.read(self._ack_r, 64).startswith(b"ack"):
            raise MeasureError(f"perf did not acknowledge {command!r}")

    def enable(self) -> None:
        self._say("enable")

    def disable(self) -> None:
        self._say("disable")

    def counts(self) -> dict[str, int]:
        self.proc.send_signal(signal.SIGINT)
        said = self.proc.communicate(timeout=30)[1]
        counts = _parse(said)
        if "all" not in counts:
            raise MeasureError(f"perf counted nothing: {said.strip()[-200:]}")
        return counts

    def _close_fds(self) -> None:
        for fd in (self._ctl_r, self._ctl_w, self._ack_r, self._ack_w):
            try:
                os.close(fd)
            except OSError:
                pass

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stderr is not None:      # not read when the count failed
            self.proc.stderr.close()
        self._close_fds()


def count(spec: str, conns: int, size: int, duration: float, client) -> dict:
    """One run: ``{"requests": n, "per_request": {call: calls per request}}``."""
    server_cpu, client_cpu = cpu_plan(True)
    server = ServerProcess(bench_runtime(runtimes.parse(spec)).spec, cpu=server_cpu).start()
    perf = None
    try:
        perf = _Perf(server.pid)
        out, _, _ = client_window(server, client, conns, size, 1.0, duration, client_cpu,
                                  lambda pid: perf.enable(), lambda pid: perf.disable())
        requests = out["requests"]
        counts = perf.counts()
        return {"requests": requests, "per_request": {k: v / requests for k, v in counts.items()}}
    finally:
        if perf is not None:
            perf.close()
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
    try:
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
                per = got["per_request"]
                named = "  ".join(f"{k} {v:.2f}" for k, v in sorted(per.items())
                                  if k != "all" and v >= 0.01)
                print(f"round {rnd + 1} {spec:24s} {got['requests']:7d} requests  "
                      f"system calls/request {per['all']:.2f}  ({named})", flush=True)
    except KeyboardInterrupt:           # every process it started is already stopped
        print("python -m bench.perf.syscalls: interrupted; the lines above are complete",
              file=sys.stderr)
        return ExitCode.INTERRUPTED
    return 0

if __name__ == "__main__":
    sys.exit(main())
