"""The machine a benchmark runs on: which CPUs the server and the load run on, how much
CPU each process used (from /proc), how busy everything else was, and what the allocator
was told.

Benchmark numbers on a shared 2-CPU machine are only worth something with this context:
each measurement pins the server and the load client to their own CPU, accounts their
CPU time over the counted window, and flags the window as noisy when other processes or
the hypervisor took a noticeable share. The runtime helpers at the end say how a runtime
is benchmarked (reference libraries without their measurement proxies) and whether it
can run here at all.
"""
from __future__ import annotations

import os
import resource
import select
import signal
import sys
import time

from bench.host import envs
from bench.host import procs
from bench import results
from bench import runtimes

__all__ = ["ROOT", "MeasureError", "Interrupted", "run_interruptibly", "stop_on_signals",
           "check_stop", "NOISY_OTHER_CPU", "NOISY_STEAL", "CLIENT_SATURATED", "cpu_plan", "pin",
           "proc_user_system", "proc_ticks", "machine_ticks", "rss_bytes", "Window", "loadavg",
           "allocator_env", "raise_nofile", "environment", "env_lines", "read_line",
           "stop_process", "tail", "progress", "bench_runtime", "unavailable", "split_available"]

# The folder holding the `bench` package: worker processes start here, so
# `python -m bench...` finds the same code as this process.
ROOT = procs.ROOT

# A run is "noisy" when, during its counted window, other processes used more than this
# much CPU (in CPUs) or the hypervisor stole more than this fraction of all CPU time.
NOISY_OTHER_CPU = 0.25
NOISY_STEAL = 0.05
# A load client above this fraction of its CPU may be what sets the pace.
CLIENT_SATURATED = 0.90

_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class MeasureError(Exception):
    """One measurement failed (server crashed, client error, timeout): recorded in the
    cell's errors, and the run goes on."""


class Interrupted(Exception):
    """SIGINT or SIGTERM arrived mid-run; ``cells`` holds what had been measured, so the
    caller can still write it."""

    def __init__(self, cells: list[dict]):
        super().__init__(f"interrupted after {len(cells)} cell(s) had measurements")
        self.cells = cells


def run_interruptibly(fn) -> bool:
    """Run ``fn()``; True if SIGINT or SIGTERM (see ``stop_on_signals``) ended it. The
    measurement's own ``finally`` blocks have stopped its processes by then."""
    try:
        fn()
    except KeyboardInterrupt:
        return True
    return False


_stop = {"requested": False}


def _on_stop_signal(signum, frame):
    _stop["requested"] = True
    raise KeyboardInterrupt


class stop_on_signals:
    """While active, SIGINT and SIGTERM (what CI time-outs, Slurm and ``kill`` send) end
    a run the same way: servers and clients are stopped and finished cells are kept.

    The handler also sets a flag that ``check_stop()`` turns back into KeyboardInterrupt:
    a signal that lands inside an at-fork handler (``subprocess`` forks for every server)
    has its exception printed and dropped by Python, and the flag makes sure the run still
    stops at the next measurement."""

    def __enter__(self):
        _stop["requested"] = False
        self._old = {s: signal.signal(s, _on_stop_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc):
        for s, handler in self._old.items():
            signal.signal(s, handler)
        _stop["requested"] = False


def check_stop() -> None:
    """Raise KeyboardInterrupt if a stop signal arrived but its exception was lost."""
    if _stop["requested"]:
        raise KeyboardInterrupt


def progress(message: str) -> None:
    """Progress lines go to stderr, so stdout carries only the tables."""
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# CPU pinning

def cpu_plan(pinned: bool = True) -> tuple[int | None, int | None]:
    """(server CPU, client CPU) -- the first two CPUs we may use, or (None, None)."""
    if not pinned:
        return None, None
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None, None
    if len(cpus) < 2:
        return None, None
    return cpus[0], cpus[1]


def pin(pid: int, cpu: int | None) -> None:
    """Pin ``pid`` to one CPU; a machine that does not allow it runs unpinned."""
    if cpu is None:
        return
    try:
        os.sched_setaffinity(pid, {cpu})
    except (AttributeError, OSError):
        pass


# ---------------------------------------------------------------------------
# /proc accounting

def _stat_fields(pid) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def proc_user_system(pid: int) -> tuple[int, int]:
    """(user, system) CPU ticks used by ``pid`` and its reaped children. Kept apart
    because on loopback the system share of an echo request (the TCP stack runs in
    the sender's system call) is large and differs little between runtimes: it is
    what squeezes the CPU ratios toward 1."""
    fields = _stat_fields(pid)
    if fields is None:
        return 0, 0
    return int(fields[11]) + int(fields[13]), int(fields[12]) + int(fields[14])


def proc_ticks(pid: int, children: bool = False) -> int:
    """CPU ticks used by ``pid`` (user+system), plus its reaped children's, plus (with
    ``children``) those of its live children -- the Python client forks workers."""
    total = sum(proc_user_system(pid))
    if children:
        try:
            names = os.listdir("/proc")
        except OSError:
            names = []
        for name in names:
            if name.isdigit():
                f = _stat_fields(name)
                if f is not None and int(f[1]) == pid:
                    total += int(f[11]) + int(f[12])
    return total


def machine_ticks() -> tuple[int, int, int] | None:
    """(busy user+nice+system, steal, all) ticks over all CPUs, from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            parts = f.readline().split()
    except OSError:
        return None
    vals = [int(x) for x in parts[1:]]
    while len(vals) < 8:
        vals.append(0)
    user, nice, system, _idle, _iowait, _irq, _softirq, steal = vals[:8]
    return user + nice + system, steal, sum(vals[:8])


def rss_bytes(pid: int) -> int | None:
    return procs.rss_bytes(pid)


def loadavg() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


class Window:
    """A snapshot of CPU accounting -- the server's, the client's, the machine's --
    taken when a counted window opens; ``until(later)`` is the window's share of each."""

    def __init__(self, server_pid: int, client_pid: int | None):
        self.server_pid, self.client_pid = server_pid, client_pid
        self.t = time.monotonic()
        self.server = proc_user_system(server_pid)
        self.client = proc_ticks(client_pid, children=True) if client_pid else 0
        self.machine = machine_ticks()
        self.loadavg = loadavg()

    def until(self, later: "Window") -> dict:
        wall = max(later.t - self.t, 1e-9)
        user = (later.server[0] - self.server[0]) / _HZ
        system = (later.server[1] - self.server[1]) / _HZ
        server = user + system
        client = (later.client - self.client) / _HZ
        out = {"server_cpu_fraction": server / wall, "server_user_cpu_fraction": user / wall,
               "server_system_cpu_fraction": system / wall, "client_cpu_fraction": client / wall}
        if self.machine and later.machine:
            busy = (later.machine[0] - self.machine[0]) / _HZ
            steal = later.machine[1] - self.machine[1]
            total = later.machine[2] - self.machine[2]
            out["other_cpu_fraction"] = max(0.0, busy - server - client) / wall
            out["steal_fraction"] = steal / total if total > 0 else 0.0
        return out


# ---------------------------------------------------------------------------
# Limits and environment

def allocator_env() -> dict[str, str]:
    """What the allocator was told: glibc's mmap threshold alone changed asyncio's
    ping-pong 3.3x on these machines, so every result carries it."""
    return {k: v for k, v in os.environ.items()
            if k.startswith("MALLOC_") or k in ("PYTHONMALLOC", "LD_PRELOAD")}


def raise_nofile(wanted: int) -> tuple[int, int, str | None]:
    """Raise the soft RLIMIT_NOFILE to the hard limit; returns (soft, hard, warning)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, wanted + 256)
    if soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    warning = None
    if soft < wanted:
        warning = (f"RLIMIT_NOFILE is {soft} (hard {hard}), lower than the {wanted} file "
                   f"descriptors needed; raise it (ulimit -n) to measure the full count")
    return soft, hard, warning


def environment(client_desc: str | None, pinned: bool) -> dict:
    """The results' ``env``: the machine and interpreter, plus how this run was pinned,
    which load client it used, and the allocator environment."""
    env = results.environment()
    server_cpu, client_cpu = cpu_plan(pinned)
    env["pinning"] = (f"server on CPU {server_cpu}, client on CPU {client_cpu}"
                      if server_cpu is not None else "none (fewer than 2 CPUs, or --no-pin)")
    env["allocator_env"] = allocator_env()
    if client_desc:
        env["load_client"] = client_desc
    return env


def env_lines(env: dict) -> list[str]:
    """The environment as Markdown bullet lines for bench.md."""
    libs = ", ".join(f"{k} {v}" for k, v in env.get("libraries", {}).items() if v)
    return [f"- Python {env.get('python')} ({env.get('implementation')}), {env.get('platform')}",
            f"- CPU: {env.get('cpu')} x {env.get('cpu_count')}; {env.get('pinning', '')}",
            f"- load client: {env.get('load_client', '-')}",
            f"- libraries: {libs}",
            f"- allocator environment: {env.get('allocator_env') or 'none set'}",
            f"- load average at start: {env.get('loadavg')}"]


# ---------------------------------------------------------------------------
# Child processes

def read_line(proc, buf: bytearray, deadline: float) -> str | None:
    """One line from ``proc``'s stdout before ``deadline`` (None on timeout or EOF)."""
    fd = proc.stdout.fileno()
    while True:
        nl = buf.find(b"\n")
        if nl >= 0:
            line = bytes(buf[:nl]).decode(errors="replace")
            del buf[:nl + 1]
            return line
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], min(left, 0.5))
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            buf += chunk


def stop_process(proc, grace_s: float = 5.0) -> int | None:
    """SIGTERM, wait, then SIGKILL: the process is always gone (and reaped) afterwards."""
    procs.stop(proc, grace_s=grace_s)
    return proc.returncode


def tail(f, limit: int = 600) -> str:
    """The end of a captured stderr file, on one line."""
    try:
        f.seek(0)
        text = f.read().decode(errors="replace").strip()
    except (OSError, ValueError):
        return ""
    return text[-limit:].replace("\n", " | ")


# ---------------------------------------------------------------------------
# Runtimes as benchmarked

def unavailable(rt) -> str | None:
    """Why runtime ``rt`` can't run here (library missing, or its port not importable)."""
    return envs.unavailable_reason(rt)


def bench_runtime(rt):
    """The runtime as benchmarked: reference runtimes without their measurement proxies.
    Our kernels keep their always-on probe, which is part of what they are."""
    if not rt.ours and rt.options.get("instrument") is True:
        spec = rt.spec
        return runtimes.parse(spec + ("," if ":" in spec else ":") + "instrument=false")
    return rt


def split_available(rts) -> tuple[list, dict[str, str]]:
    """(the runtimes that can run here, {spec: why not} for the others)."""
    ok, skipped = [], {}
    for rt in rts:
        reason = unavailable(rt)
        if reason:
            skipped[rt.spec] = reason
        else:
            ok.append(rt)
    return ok, skipped
