"""Performance matrices: ``looplab bench`` (echo load, goals, idle memory, connection curve)
and the micro-benchmarks (spawn+join, yield, ping-pong, timers).

How the echo benchmark keeps itself honest (BENCHMARKING.md says why each rule exists):

* **The server is alone on its CPU.** Every measurement starts a fresh server process
  (``python -m bench serve echo --runtime R --variant naive``) pinned to the first CPU, and
  the load client pinned to the second. Reference runtimes run with ``instrument=false`` so
  the measurement proxies are left out; our kernels run with their always-on probe, which
  is part of what they are.
* **The client is never the bottleneck.** It is a small C program using epoll (compiled once
  with the system's C compiler into a cache folder); without a compiler, a Python client of
  blocking sockets in worker processes stands in and the results say so. The client's own
  CPU use is recorded every run: a client above 90 % of its CPU is flagged, since then it,
  not the server, may set the pace.
* **Noise is measured, not assumed away.** Runtimes are interleaved in rounds (A B C, B C A,
  ...: the order rotates so that nobody always goes first), each run has a warm-up that is
  not counted, and during the counted window /proc/stat tells how much CPU *other*
  processes used and how much the hypervisor stole. Such runs are flagged ``noisy``; they
  stay in the samples (dropping them would bias toward lucky runs) but the tables mark them.
* **Only ratios travel.** Absolute numbers drift ~20 % between sessions, so the summary is a
  ratio table against a baseline runtime (default ``asyncio-protocol``) with a geometric
  mean row; spreads come from per-round *paired* ratios (each runtime against the baseline
  measured in the same round), which cancels slow drifts of the machine.

The micro-benchmarks build the kernel (open the port, bind the listening socket) outside the
timed region and time only the operations, inside the loop, with ``time.perf_counter``.
``looplab bench --micro`` runs each measurement in a fresh worker process pinned to one CPU,
calibrating the operation count so a run lasts at least ``--min-time``; the pytest suite
(tests/test_bench.py) runs the same building blocks once each as correctness tests, or
timed with ``--benchmark-enable``.

This module is also the entry point of its own worker processes::

    python -m bench.perf client HOST PORT CONNS MESSAGE_BYTES WARMUP_S DURATION_S [--procs P]
    python -m bench.perf micro-worker --op OP --runtime SPEC [--min-time S] [--n N]
"""
from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import math
import os
import random
import resource
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from bench import results

__all__ = ["PRESETS", "MICRO_OPS", "GOALS", "MeasureError", "bench_runtime", "unavailable",
           "load_client", "measure_echo", "run_echo_matrix", "ratio_table", "micro_supported",
           "Micro", "MicroResult", "micro", "run_micro_matrix", "run_goals", "measure_idle",
           "register"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KiB = 1024

PRESETS = {
    # ~9 runtimes x 3 repeats x (startup + 1 s warm-up + 2 s) ~ 2 minutes
    "quick": {"sizes": [1 * KiB], "concurrency": [10], "duration": 2.0, "repeat": 3,
              "warmup": 1.0, "min_time": 0.2},
    "full": {"sizes": [1 * KiB, 10 * KiB, 100 * KiB], "concurrency": [1, 10, 100],
             "duration": 5.0, "repeat": 7, "warmup": 1.0, "min_time": 0.5},
}
CURVE_CONNECTIONS = [1, 3, 10, 30, 100, 300, 1000]

# A run is "noisy" when, during its counted window, other processes used more than this
# much CPU (in CPUs) or the hypervisor stole more than this fraction of all CPU time.
NOISY_OTHER_CPU = 0.25
NOISY_STEAL = 0.05
CLIENT_SATURATED = 0.90


class MeasureError(Exception):
    """One measurement failed (server crashed, client error, timeout): recorded in the
    cell's errors, the run goes on."""


def _usage(message: str) -> Exception:
    from bench.cli import Usage
    return Usage(message)


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# Runtimes

_OUR_MODULES = {"callback": "kernels.callback", "hybrid": "kernels.hybrid", "coro": "kernels.coro"}


def unavailable(rt) -> str | None:
    """Why runtime ``rt`` can't run here (library missing, or our kernel not importable)."""
    reason = rt.unavailable_reason()
    if reason:
        return reason
    module = _OUR_MODULES.get(rt.id)
    if module:
        try:
            importlib.import_module(module)
        except Exception as exc:
            return f"{module} does not import ({type(exc).__name__}: {exc})"
    return None


def bench_runtime(rt):
    """The runtime as benchmarked: reference runtimes without their measurement proxies."""
    from protocols import runtimes
    if not rt.ours and rt.options.get("instrument") is True:
        spec = rt.spec
        return runtimes.parse(spec + ("," if ":" in spec else ":") + "instrument=false")
    return rt


def _runtimes(text: str | None, default=None):
    from protocols import runtimes
    return runtimes.parse_list(text, default)


def _split_available(rts):
    ok, skipped = [], {}
    for rt in rts:
        reason = unavailable(rt)
        if reason:
            skipped[rt.spec] = reason
        else:
            ok.append(rt)
    return ok, skipped


# ---------------------------------------------------------------------------
# CPU pinning and /proc accounting

def cpu_plan(pin: bool = True) -> tuple[int | None, int | None]:
    """(server CPU, client CPU) -- the first two CPUs we may use, or (None, None)."""
    if not pin:
        return None, None
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None, None
    if len(cpus) < 2:
        return None, None
    return cpus[0], cpus[1]


def _pin(pid: int, cpu: int | None) -> None:
    if cpu is None:
        return
    try:
        os.sched_setaffinity(pid, {cpu})
    except (AttributeError, OSError):
        pass


_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_ticks(pid: int, children: bool = False) -> int:
    """CPU ticks used by ``pid`` (user+system), plus its reaped children's, plus (with
    ``children``) those of its live children -- the Python client forks workers."""
    def read(p):
        try:
            with open(f"/proc/{p}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return None
    fields = read(pid)
    if fields is None:
        return 0
    total = int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
    if children:
        try:
            names = os.listdir("/proc")
        except OSError:
            names = []
        for name in names:
            if name.isdigit():
                f = read(name)
                if f is not None and int(f[1]) == pid:
                    total += int(f[11]) + int(f[12])
    return total


def _machine_ticks() -> tuple[int, int, int] | None:
    """(busy user+nice+system, steal, all) ticks over all CPUs, from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            parts = f.readline().split()
    except OSError:
        return None
    vals = [int(x) for x in parts[1:]]
    while len(vals) < 8:
        vals.append(0)
    user, nice, system, idle, iowait, irq, softirq, steal = vals[:8]
    return user + nice + system, steal, sum(vals[:8])


def _rss_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class _Window:
    """CPU accounting between two instants: the server's, the client's, the machine's."""

    def __init__(self, server_pid: int, client_pid: int | None):
        self.server_pid, self.client_pid = server_pid, client_pid
        self.t = time.monotonic()
        self.server = _proc_ticks(server_pid)
        self.client = _proc_ticks(client_pid, children=True) if client_pid else 0
        self.machine = _machine_ticks()
        try:
            self.loadavg = os.getloadavg()[0]
        except OSError:
            self.loadavg = None

    def until(self, later: "_Window") -> dict:
        wall = max(later.t - self.t, 1e-9)
        server = (later.server - self.server) / _HZ
        client = (later.client - self.client) / _HZ
        out = {"server_cpu_fraction": server / wall, "client_cpu_fraction": client / wall}
        if self.machine and later.machine:
            busy = (later.machine[0] - self.machine[0]) / _HZ
            steal = later.machine[1] - self.machine[1]
            total = later.machine[2] - self.machine[2]
            out["other_cpu_fraction"] = max(0.0, busy - server - client) / wall
            out["steal_fraction"] = steal / total if total > 0 else 0.0
        return out


# ---------------------------------------------------------------------------
# Processes: the server under test and the load client

def _read_line(proc, buf: bytearray, deadline: float) -> str | None:
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


def _stop(proc, grace_s: float = 5.0) -> int | None:
    """SIGTERM, wait, then SIGKILL: the process is always gone (and reaped) afterwards."""
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    for stream in (proc.stdout, proc.stdin):
        if stream is not None:
            stream.close()
    return proc.returncode


def _tail(f, limit: int = 600) -> str:
    try:
        f.seek(0)
        text = f.read().decode(errors="replace").strip()
    except (OSError, ValueError):
        return ""
    return text[-limit:].replace("\n", " | ")


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class ServerProcess:
    """``python -m bench serve APP --runtime SPEC`` in a fresh process, pinned, ready.

    ``start()`` waits for its "listening on H:P" line and then for one real echo round
    trip, so the measured window never includes the interpreter's start-up."""

    def __init__(self, spec: str, app: str = "echo", variant: str = "naive",
                 cpu: int | None = None, start_timeout_s: float = 30.0):
        self.spec, self.app, self.variant, self.cpu = spec, app, variant, cpu
        self.start_timeout_s = start_timeout_s
        self.proc = None
        self.address = None
        self._stderr = None

    def start(self) -> "ServerProcess":
        self._stderr = tempfile.TemporaryFile()
        cmd = [sys.executable, "-m", "bench", "serve", self.app, "--runtime", self.spec,
               "--listen", "127.0.0.1:0", "--variant", self.variant]
        # preexec: `serve` turns SIGTERM into SIGINT, which does nothing if we were
        # started with SIGINT ignored (nohup, a background job of a script) -- un-ignore it.
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._stderr,
                                     stdin=subprocess.DEVNULL, cwd=ROOT,
                                     preexec_fn=_default_sigint)
        _pin(self.proc.pid, self.cpu)
        deadline = time.monotonic() + self.start_timeout_s
        line = _read_line(self.proc, bytearray(), deadline)
        if not line or not line.startswith("listening on "):
            why = _tail(self._stderr) or "-"
            self.stop()
            raise MeasureError(f"server {self.spec} did not start: {line or 'no output'}; "
                               f"stderr: {why}")
        host, _, port = line[len("listening on "):].strip().rpartition(":")
        self.address = (host, int(port))
        if self.app == "echo":
            self._probe(deadline)
        return self

    def _probe(self, deadline: float) -> None:
        while True:
            try:
                with socket.create_connection(self.address, timeout=5) as s:
                    s.sendall(b"ready?")
                    got = b""
                    while len(got) < 6:
                        chunk = s.recv(64)
                        if not chunk:
                            break
                        got += chunk
                    if got == b"ready?":
                        return
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                why = _tail(self._stderr) or "-"
                self.stop()
                raise MeasureError(f"server {self.spec} never echoed; stderr: {why}")
            time.sleep(0.1)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stderr_tail(self) -> str:
        return _tail(self._stderr) if self._stderr else ""

    def stop(self) -> int | None:
        code = None
        if self.proc is not None:
            code = _stop(self.proc)
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        return code

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


# The C load client. One thread, epoll, non-blocking sockets; each connection sends one
# message, waits for every byte to come back (checking each), then sends the next. It
# prints "W" when the counted window opens, then one JSON line. Latencies go into a
# 1-microsecond histogram up to 1 s (4 MB), so percentiles are exact to the microsecond.
C_CLIENT = r"""
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define HIST_US 1000000
static uint32_t hist[HIST_US + 1];
struct conn { int fd; size_t sent, recvd; uint64_t t0; int out_armed, dead; };
static int ep; static unsigned char *msg; static size_t size;
static uint64_t win_start, win_end, count, lat_sum_ns, lat_max_ns, mismatches, dead_count;
static char errbuf[160];

static uint64_t now_ns(void) {
    struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
static void kill_conn(struct conn *c, const char *why) {
    if (c->dead) return;
    c->dead = 1; dead_count++;
    if (!errbuf[0]) snprintf(errbuf, sizeof errbuf, "%s", why);
    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
}
static void arm_out(struct conn *c, int on) {
    struct epoll_event ev = {.events = EPOLLIN | (on ? EPOLLOUT : 0), .data.ptr = c};
    if (c->out_armed != on) { epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev); c->out_armed = on; }
}
static void do_send(struct conn *c) {
    while (c->sent < size) {
        ssize_t n = send(c->fd, msg + c->sent, size - c->sent, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) { arm_out(c, 1); return; }
            if (errno == EINTR) continue;
            kill_conn(c, strerror(errno)); return;
        }
        c->sent += (size_t)n;
    }
    arm_out(c, 0);
}
static void do_recv(struct conn *c, unsigned char *buf) {
    for (;;) {
        ssize_t n = recv(c->fd, buf, 262144, 0);
        if (n == 0) { kill_conn(c, "server closed the connection"); return; }
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            if (errno == EINTR) continue;
            kill_conn(c, strerror(errno)); return;
        }
        if (c->recvd + (size_t)n > c->sent) { mismatches++; kill_conn(c, "more bytes came back than were sent"); return; }
        if (memcmp(buf, msg + c->recvd, (size_t)n) != 0) mismatches++;
        c->recvd += (size_t)n;
        if (c->recvd == size) {
            uint64_t t = now_ns();
            if (t >= win_start && t < win_end) {
                uint64_t lat = t - c->t0, us = lat / 1000;
                hist[us > HIST_US ? HIST_US : us]++;
                count++; lat_sum_ns += lat;
                if (lat > lat_max_ns) lat_max_ns = lat;
            }
            c->sent = c->recvd = 0; c->t0 = t;
            do_send(c);
            if (c->dead) return;
        }
    }
}
static double pct(double q) {
    if (!count) return -1;
    uint64_t want = (uint64_t)(q * (double)count), acc = 0;
    if (want >= count) want = count - 1;
    for (int i = 0; i <= HIST_US; i++) { acc += hist[i]; if (acc > want) return (i + 0.5) / 1e6; }
    return HIST_US / 1e6;
}
int main(int argc, char **argv) {
    if (argc != 7) { fprintf(stderr, "usage: %s HOST PORT CONNS MESSAGE_BYTES WARMUP_S DURATION_S\n", argv[0]); return 2; }
    const char *host = argv[1]; int port = atoi(argv[2]); int nconn = atoi(argv[3]);
    size = (size_t)atol(argv[4]); double warmup = atof(argv[5]), duration = atof(argv[6]);
    if (nconn < 1 || size < 1 || port < 1 || duration <= 0 || warmup < 0) { fprintf(stderr, "bad arguments\n"); return 2; }
    msg = malloc(size); unsigned char *buf = malloc(262144);
    for (size_t i = 0; i < size; i++) msg[i] = (unsigned char)((i * 131 + 7) & 0xff);
    struct conn *conns = calloc((size_t)nconn, sizeof *conns);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) { fprintf(stderr, "bad host %s\n", host); return 2; }
    ep = epoll_create1(0);
    for (int i = 0; i < nconn; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
        struct timeval tv = {.tv_sec = 10};
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
            printf("W\n{\"error\": \"connect %d: %s\"}\n", i, strerror(errno)); return 1;
        }
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
        conns[i].fd = fd;
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &conns[i]};
        epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    }
    uint64_t start = now_ns();
    win_start = start + (uint64_t)(warmup * 1e9);
    win_end = win_start + (uint64_t)(duration * 1e9);
    for (int i = 0; i < nconn; i++) { conns[i].t0 = now_ns(); do_send(&conns[i]); }
    struct epoll_event evs[256];
    int announced = 0;
    for (;;) {
        uint64_t t = now_ns();
        if (!announced && t >= win_start) { printf("W\n"); fflush(stdout); announced = 1; }
        if (t >= win_end || dead_count == (uint64_t)nconn) break;
        uint64_t until = announced ? win_end : win_start;
        int timeout = (int)((until - t) / 1000000) + 1;
        if (timeout > 100) timeout = 100;
        int n = epoll_wait(ep, evs, 256, timeout);
        for (int i = 0; i < n; i++) {
            struct conn *c = evs[i].data.ptr;
            if (c->dead) continue;
            if (evs[i].events & EPOLLIN) do_recv(c, buf);
            if (!c->dead && (evs[i].events & EPOLLOUT)) do_send(c);
            if (!c->dead && (evs[i].events & (EPOLLERR | EPOLLHUP)) && !(evs[i].events & EPOLLIN))
                kill_conn(c, "connection error");
        }
    }
    uint64_t end = now_ns();
    if (end > win_end) end = win_end;
    double window = end > win_start ? (double)(end - win_start) / 1e9 : 0.0;
    if (!announced) printf("W\n");
    printf("{\"client\": \"c-epoll\", \"requests\": %llu, \"window_s\": %.6f, \"latency_p50_s\": %.9g, "
           "\"latency_p99_s\": %.9g, \"latency_max_s\": %.9g, \"latency_mean_s\": %.9g, "
           "\"mismatches\": %llu, \"dead_connections\": %llu, \"error\": ",
           (unsigned long long)count, window, pct(0.50), pct(0.99), lat_max_ns / 1e9,
           count ? (double)lat_sum_ns / (double)count / 1e9 : -1.0,
           (unsigned long long)mismatches, (unsigned long long)dead_count);
    if (errbuf[0]) printf("\"%s\"}\n", errbuf); else printf("null}\n");
    fflush(stdout);
    for (int i = 0; i < nconn; i++) close(conns[i].fd);
    return 0;
}
"""


def _cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "looplab")


def load_client(kind: str = "auto") -> tuple[list[str] | None, str]:
    """The load client to use: ``(argv prefix, description)``; the prefix is None for the
    Python client. ``kind``: auto (C when a compiler works, else Python), c, python."""
    if kind not in ("auto", "c", "python"):
        raise _usage(f"unknown --client {kind!r}; choose auto, c or python")
    if kind == "python":
        return None, "python (blocking sockets in worker processes; asked for)"
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("cc")
    reason = "no C compiler found"
    if cc:
        digest = hashlib.sha256(C_CLIENT.encode()).hexdigest()[:12]
        folder = _cache_dir()
        exe = os.path.join(folder, f"echo-client-{digest}")
        if os.access(exe, os.X_OK):
            return [exe], f"c-epoll ({exe})"
        try:
            os.makedirs(folder, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=folder) as tmp:
                src = os.path.join(tmp, "echo_client.c")
                with open(src, "w") as f:
                    f.write(C_CLIENT)
                out = os.path.join(tmp, "echo-client")
                r = subprocess.run([cc, "-O2", "-o", out, src], capture_output=True, text=True,
                                   timeout=120)
                if r.returncode == 0:
                    os.replace(out, exe)
                    return [exe], f"c-epoll ({exe})"
                reason = f"{cc} failed: {r.stderr.strip()[-200:]}"
        except (OSError, subprocess.SubprocessError) as exc:
            reason = f"cannot build the C client: {exc}"
    if kind == "c":
        raise MeasureError(f"--client c: {reason}")
    return None, f"python (blocking sockets in worker processes; {reason})"


# --- the Python load client (fallback) -------------------------------------------------

def _pattern(size: int) -> bytes:
    return bytes((i * 131 + 7) & 0xFF for i in range(min(size, 256))) * (size // 256 + 1)


def _py_client_worker(host, port, conns, size, t_start, t_end, out_fd) -> None:
    """One worker: ``conns`` blocking sockets, round-robin request/response. All its
    connections have a request in flight at once (send all, then read all back)."""
    msg = _pattern(size)[:size]
    view = memoryview(msg)
    hist: dict[int, int] = {}
    count = mismatches = 0
    lat_sum = lat_max = 0.0
    error = None
    socks = []
    buf = bytearray(max(size, 65536))
    try:
        for _ in range(conns):
            s = socket.create_connection((host, port), timeout=10)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            socks.append(s)
        mono = time.monotonic
        while mono() < t_end:
            t0 = mono()
            for s in socks:
                s.sendall(msg)
            for s in socks:
                got = 0
                while got < size:
                    n = s.recv_into(buf, size - got)
                    if n == 0:
                        raise ConnectionError("server closed the connection")
                    if buf[:n] != view[got:got + n]:
                        mismatches += 1
                    got += n
                t = mono()
                if t_start <= t < t_end:
                    lat = t - t0
                    count += 1
                    lat_sum += lat
                    lat_max = max(lat_max, lat)
                    us = int(lat * 1e6)
                    hist[us] = hist.get(us, 0) + 1
    except OSError as exc:
        error = f"{type(exc).__name__}: {exc}"
    finally:
        for s in socks:
            s.close()
    data = json.dumps({"requests": count, "hist": hist, "lat_sum": lat_sum, "lat_max": lat_max,
                       "mismatches": mismatches, "error": error}).encode()
    with os.fdopen(out_fd, "wb") as f:
        f.write(data)


def _hist_pct(hist: dict[int, int], count: int, q: float) -> float | None:
    if not count:
        return None
    want = min(int(q * count), count - 1)
    acc = 0
    for us in sorted(hist):
        acc += hist[us]
        if acc > want:
            return (us + 0.5) / 1e6
    return None


def py_client_main(host: str, port: int, conns: int, size: int, warmup: float,
                   duration: float, procs: int = 0) -> int:
    """The fallback client: forks ``procs`` workers (default min(conns, 4)), announces
    the window with "W", prints the merged JSON. Same output as the C client."""
    procs = procs or min(conns, 4)
    procs = max(1, min(procs, conns))
    t_start = time.monotonic() + 0.5 + warmup        # 0.5 s to connect
    t_end = t_start + duration
    children = []
    for i in range(procs):
        share = conns // procs + (1 if i < conns % procs else 0)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            code = 0
            try:
                _py_client_worker(host, port, share, size, t_start, t_end, w)
            except BaseException:
                code = 1
            os._exit(code)
        os.close(w)
        children.append((pid, r))
    time.sleep(max(0.0, t_start - time.monotonic()))
    print("W", flush=True)
    total = {"requests": 0, "hist": {}, "lat_sum": 0.0, "lat_max": 0.0, "mismatches": 0}
    errors = []
    for pid, r in children:
        with os.fdopen(r, "rb") as f:
            raw = f.read()
        os.waitpid(pid, 0)
        try:
            part = json.loads(raw.decode() or "{}")
        except ValueError:
            part = {"error": "worker died"}
        if part.get("error"):
            errors.append(part["error"])
        total["requests"] += part.get("requests", 0)
        total["lat_sum"] += part.get("lat_sum", 0.0)
        total["lat_max"] = max(total["lat_max"], part.get("lat_max", 0.0))
        total["mismatches"] += part.get("mismatches", 0)
        for us, n in part.get("hist", {}).items():
            total["hist"][int(us)] = total["hist"].get(int(us), 0) + n
    count = total["requests"]
    out = {"client": "python", "requests": count, "window_s": duration,
           "latency_p50_s": _hist_pct(total["hist"], count, 0.5),
           "latency_p99_s": _hist_pct(total["hist"], count, 0.99),
           "latency_max_s": total["lat_max"],
           "latency_mean_s": total["lat_sum"] / count if count else None,
           "mismatches": total["mismatches"], "dead_connections": len(errors),
           "error": errors[0] if errors else None}
    print(json.dumps(out), flush=True)
    return 0


# ---------------------------------------------------------------------------
# One echo measurement

def measure_echo(rt, message_bytes: int, connections: int, duration: float = 2.0,
                 warmup: float = 1.0, client=None, pin: bool = True) -> dict:
    """Start a fresh server for ``rt`` (benchmarked uninstrumented), drive it with the load
    client for ``warmup + duration`` seconds, stop it. Returns one sample::

        {"requests_per_s", "throughput_Bps", "latency_p50_s", "latency_p99_s",
         "latency_mean_s", "latency_max_s", "server_cpu_per_request_s",
         "server_cpu_fraction", "client_cpu_fraction", "other_cpu_fraction",
         "steal_fraction", "loadavg", "noisy", "client_saturated"}

    ``throughput_Bps`` counts the echoed payload once (requests x message_bytes).
    Raises MeasureError when anything goes wrong (the message says what)."""
    if message_bytes < 1 or connections < 1 or duration <= 0 or warmup < 0:
        raise ValueError("message_bytes and connections must be >= 1, duration > 0, warmup >= 0")
    if client is None:
        client = load_client("auto")
    prefix, _desc = client
    server_cpu, client_cpu = cpu_plan(pin)
    spec = bench_runtime(rt).spec
    server = ServerProcess(spec, cpu=server_cpu).start()
    proc = None
    try:
        host, port = server.address
        args = [host, str(port), str(connections), str(message_bytes), repr(warmup), repr(duration)]
        if prefix is None:
            cmd = [sys.executable, "-m", "bench.perf", "client", *args]
        else:
            cmd = [*prefix, *args]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, cwd=ROOT)
        _pin(proc.pid, client_cpu)
        buf = bytearray()
        budget = 30.0 + connections * 0.02
        line = _read_line(proc, buf, time.monotonic() + warmup + budget)
        if line != "W":
            raise MeasureError(f"load client did not start its window: {line or 'no output'}")
        start = _Window(server.pid, proc.pid)
        line = _read_line(proc, buf, time.monotonic() + duration + budget)
        end = _Window(server.pid, proc.pid)
        if not line:
            raise MeasureError(f"load client gave no result; server alive: {server.alive()}")
        try:
            out = json.loads(line)
        except ValueError:
            raise MeasureError(f"load client printed {line[:200]!r}") from None
        if out.get("error") and not out.get("requests"):
            raise MeasureError(f"load client: {out['error']}; server stderr: "
                               f"{server.stderr_tail() or '-'}")
        if out.get("mismatches"):
            raise MeasureError(f"the server echoed wrong bytes ({out['mismatches']} mismatching reads)")
        if out.get("dead_connections"):
            raise MeasureError(f"{out['dead_connections']} connection(s) failed during the run: "
                               f"{out.get('error')}; server stderr: {server.stderr_tail() or '-'}")
        window = out.get("window_s") or duration
        requests = out["requests"]
        if requests <= 0:
            raise MeasureError("no request completed in the window")
        acct = start.until(end)
        sample = {
            "requests_per_s": requests / window,
            "throughput_Bps": requests * message_bytes / window,
            "latency_p50_s": out.get("latency_p50_s"),
            "latency_p99_s": out.get("latency_p99_s"),
            "latency_mean_s": out.get("latency_mean_s"),
            "latency_max_s": out.get("latency_max_s"),
            "server_cpu_per_request_s": acct["server_cpu_fraction"] * window / requests,
            **acct,
            "loadavg": start.loadavg,
        }
        sample["noisy"] = bool(sample.get("other_cpu_fraction", 0) > NOISY_OTHER_CPU
                               or sample.get("steal_fraction", 0) > NOISY_STEAL)
        sample["client_saturated"] = bool(acct["client_cpu_fraction"] > CLIENT_SATURATED)
        return sample
    finally:
        if proc is not None:
            _stop(proc, 2.0)
            if proc.stderr is not None:
                proc.stderr.close()
        server.stop()


# ---------------------------------------------------------------------------
# The echo matrix

ECHO_METRICS = ("requests_per_s", "throughput_Bps", "latency_p50_s", "latency_p99_s",
                "latency_mean_s", "latency_max_s", "server_cpu_per_request_s",
                "server_cpu_fraction", "client_cpu_fraction", "other_cpu_fraction",
                "steal_fraction")


def size_label(n: int) -> str:
    if n >= KiB * KiB and n % (KiB * KiB) == 0:
        return f"{n // (KiB * KiB)} MiB"
    if n >= KiB and n % KiB == 0:
        return f"{n // KiB} KiB"
    return f"{n} B"


def _param_label(params: dict) -> str:
    if "message_bytes" in params:
        return f"{size_label(params['message_bytes'])} x {params['connections']}"
    return ",".join(f"{k}={v}" for k, v in sorted(params.items())) or "-"


def echo_units(rts, sizes, concurrency, shard_spec=None) -> list[tuple]:
    """The cells to measure, as (runtime, message_bytes, connections), sharded."""
    units = [(rt, m, c) for m in sizes for c in concurrency for rt in rts]
    return results.shard(units, shard_spec)


def run_echo_matrix(units, duration: float, warmup: float, repeat: int, client=None,
                    pin: bool = True, progress=_progress) -> list[dict]:
    """Measure every unit ``repeat`` times, interleaved in rounds with the runtime order
    rotating each round; one cell per unit with the samples in round order."""
    if client is None:
        client = load_client("auto")
    groups: dict[tuple, list] = {}
    for rt, m, c in units:
        groups.setdefault((m, c), []).append(rt)
    store = {(rt.spec, m, c): {"samples": {k: [] for k in ECHO_METRICS}, "rounds": [],
                               "noisy": [], "saturated": [], "loadavg": [], "errors": []}
             for rt, m, c in units}
    total = len(units) * repeat
    done = 0
    for r in range(repeat):
        for (m, c), rts in groups.items():
            k = r % len(rts)
            for rt in rts[k:] + rts[:k]:
                done += 1
                entry = store[(rt.spec, m, c)]
                label = f"[{done}/{total}] round {r + 1}/{repeat} {rt.spec} {size_label(m)} x {c}"
                try:
                    s = measure_echo(rt, m, c, duration, warmup, client, pin)
                except MeasureError as exc:
                    entry["errors"].append(f"round {r + 1}: {exc}")
                    progress(f"{label}: FAILED: {exc}")
                    continue
                for name in ECHO_METRICS:
                    entry["samples"][name].append(s.get(name))
                entry["rounds"].append(r)
                entry["loadavg"].append(s.get("loadavg"))
                if s["noisy"]:
                    entry["noisy"].append(r)
                if s["client_saturated"]:
                    entry["saturated"].append(r)
                flags = (" NOISY" if s["noisy"] else "") + (" CLIENT-BOUND" if s["client_saturated"] else "")
                progress(f"{label}: {s['requests_per_s']:,.0f} req/s, p99 "
                         f"{_fmt_s(s['latency_p99_s'])}, other CPU {s.get('other_cpu_fraction', 0):.2f}"
                         f"{flags}")
    cells = []
    for rt, m, c in units:
        entry = store[(rt.spec, m, c)]
        samples = {k: v for k, v in entry["samples"].items() if v}
        cells.append(results.new_cell(
            "echo", rt.spec, "naive", {"message_bytes": m, "connections": c},
            samples=samples, errors=entry["errors"],
            details={"server_runtime": bench_runtime(rt).spec, "client": client[1],
                     "duration_s": duration, "warmup_s": warmup, "rounds": entry["rounds"],
                     "noisy_rounds": entry["noisy"], "client_bound_rounds": entry["saturated"],
                     "loadavg": entry["loadavg"]}))
        cells[-1]["repeats"] = len(entry["rounds"])
    return cells


def _paired(cell: dict, base: dict, metric: str) -> list[float]:
    """Per-round ratios cell/base, pairing samples measured in the same round."""
    def by_round(c):
        rounds = (c.get("details") or {}).get("rounds")
        vals = (c.get("samples") or {}).get(metric, [])
        if rounds is None or len(rounds) != len(vals):
            rounds = list(range(len(vals)))
        return dict(zip(rounds, vals))
    a, b = by_round(cell), by_round(base)
    return [a[r] / b[r] for r in a if r in b and a[r] and b[r]]


def ratio_table(cells: list[dict], baseline: str, metric: str = "requests_per_s") -> dict:
    """Ratios of each runtime's median to the baseline's, per parameter set, with the
    paired per-round ratios for the spread and a geometric mean per runtime::

        {"baseline", "metric", "params": [label...], "runtimes": [spec...],
         "ratios": {label: {spec: {"ratio", "paired": [..], "min", "max"}}},
         "geomean": {spec: value}}
    """
    labels, specs = [], []
    by = {}
    for cell in cells:
        label = _param_label(cell.get("params", {}))
        if label not in labels:
            labels.append(label)
        if cell["runtime"] not in specs:
            specs.append(cell["runtime"])
        by[(label, cell["runtime"])] = cell
    ratios: dict[str, dict] = {}
    for label in labels:
        base = by.get((label, baseline))
        row = ratios[label] = {}
        if base is None or not base["metrics"].get(metric):
            continue
        for spec in specs:
            cell = by.get((label, spec))
            if cell is None or cell["metrics"].get(metric) is None:
                continue
            paired = _paired(cell, base, metric)
            row[spec] = {"ratio": cell["metrics"][metric] / base["metrics"][metric],
                         "paired": paired,
                         "min": min(paired) if paired else None,
                         "max": max(paired) if paired else None}
    geomean = {}
    for spec in specs:
        vals = [ratios[lb][spec]["ratio"] for lb in labels if spec in ratios[lb]]
        if vals and all(v > 0 for v in vals):
            geomean[spec] = math.exp(sum(math.log(v) for v in vals) / len(vals))
    return {"baseline": baseline, "metric": metric, "params": labels, "runtimes": specs,
            "ratios": ratios, "geomean": geomean}


# --- rendering -------------------------------------------------------------------------

def _fmt_s(v) -> str:
    if v is None:
        return "-"
    if v >= 1:
        return f"{v:.2f} s"
    if v >= 1e-3:
        return f"{v * 1e3:.2f} ms"
    return f"{v * 1e6:.0f} us"


def _fmt_rate(v) -> str:
    if v is None:
        return "-"
    if v >= 1e6:
        return f"{v / 1e6:.2f}M"
    if v >= 1e3:
        return f"{v / 1e3:.1f}k"
    return f"{v:.0f}"


def render_table(headers, rows, markdown: bool = False) -> str:
    rows = [[str(x) for x in row] for row in rows]
    if markdown:
        out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
        out += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(out)
    widths = [max(len(str(h)), *(len(r[i]) for r in rows)) if rows else len(str(h))
              for i, h in enumerate(headers)]
    line = lambda vals: "  ".join(  # noqa: E731
        (v.ljust(widths[i]) if i == 0 else v.rjust(widths[i])) for i, v in enumerate(vals)).rstrip()
    return "\n".join([line([str(h) for h in headers]), "  ".join("-" * w for w in widths)]
                     + [line(r) for r in rows])


def _ratio_text(entry) -> str:
    if entry is None:
        return "-"
    text = f"{entry['ratio']:.2f}"
    if entry.get("min") is not None and len(entry["paired"]) > 1:
        text += f" ({entry['min']:.2f}-{entry['max']:.2f})"
    return text


def echo_tables(cells: list[dict], baseline: str, markdown: bool = False) -> str:
    """The ratio matrix (rows: parameter sets + geometric mean; columns: runtimes) and
    the absolute table (one row per cell)."""
    parts = []
    measured = [c for c in cells if c["metrics"].get("requests_per_s")]
    table = ratio_table(measured, baseline) if measured else None
    if table and any(table["ratios"][lb] for lb in table["params"]):
        rows = [[lb] + [_ratio_text(table["ratios"][lb].get(s)) for s in table["runtimes"]]
                for lb in table["params"]]
        rows.append(["geometric mean"] + [f"{table['geomean'][s]:.2f}" if s in table["geomean"]
                                          else "-" for s in table["runtimes"]])
        title = (f"echo requests/s relative to {baseline} (ratio of medians; in brackets the "
                 f"range of per-round paired ratios; > 1 is faster)")
        parts.append(("### " if markdown else "") + title)
        parts.append(render_table(["message x connections"] + table["runtimes"], rows, markdown))
    elif measured:
        parts.append(f"(no ratio table: baseline {baseline} was not measured in this run)")
    rows = []
    for c in cells:
        m, sp, d = c["metrics"], c.get("spread", {}), c.get("details", {})
        iqr = sp.get("requests_per_s", {}).get("iqr")
        flags = []
        if d.get("noisy_rounds"):
            flags.append(f"noisy x{len(d['noisy_rounds'])}")
        if d.get("client_bound_rounds"):
            flags.append(f"client-bound x{len(d['client_bound_rounds'])}")
        if c.get("errors"):
            flags.append(f"errors x{len(c['errors'])}")
        cpu_req = m.get("server_cpu_per_request_s")
        rows.append([c["runtime"], _param_label(c.get("params", {})),
                     _fmt_rate(m.get("requests_per_s")) + (f" ±{_fmt_rate(iqr / 2)}" if iqr else ""),
                     _fmt_s(m.get("latency_p50_s")), _fmt_s(m.get("latency_p99_s")),
                     f"{cpu_req * 1e6:.1f} us" if cpu_req else "-",
                     f"{m['server_cpu_fraction']:.2f}" if m.get("server_cpu_fraction") is not None else "-",
                     f"{m['other_cpu_fraction']:.2f}" if m.get("other_cpu_fraction") is not None else "-",
                     c.get("repeats", 0), ", ".join(flags)])
    title = "absolute numbers (medians over repeats; ± is half the IQR)"
    parts.append(("### " if markdown else "") + title)
    parts.append(render_table(["runtime", "message x conns", "req/s", "p50", "p99",
                               "server CPU/req", "server CPU", "other CPU", "n", "flags"],
                              rows, markdown))
    return "\n\n".join(parts)


def micro_table(cells: list[dict], markdown: bool = False) -> str:
    ops = list(dict.fromkeys(c["variant"] for c in cells))
    specs = list(dict.fromkeys(c["runtime"] for c in cells))
    by = {(c["variant"], c["runtime"]): c for c in cells}
    rows = []
    for spec in specs:
        row = [spec]
        for op in ops:
            c = by.get((op, spec))
            if c is None:
                row.append("n/a")
                continue
            v = c["metrics"].get("ops_per_s")
            iqr = c.get("spread", {}).get("ops_per_s", {}).get("iqr")
            row.append("failed" if v is None else _fmt_rate(v) + (f" ±{_fmt_rate(iqr / 2)}" if iqr else ""))
        rows.append(row)
    title = "micro-benchmarks, operations per second (median over repeats; ± is half the IQR)"
    return ("### " if markdown else "") + title + "\n\n" + render_table(["runtime"] + ops, rows, markdown)


def _env_lines(env: dict) -> list[str]:
    libs = ", ".join(f"{k} {v}" for k, v in env.get("libraries", {}).items() if v)
    return [f"- Python {env.get('python')} ({env.get('implementation')}), {env.get('platform')}",
            f"- CPU: {env.get('cpu')} x {env.get('cpu_count')}; {env.get('pinning', '')}",
            f"- load client: {env.get('load_client', '-')}",
            f"- libraries: {libs}",
            f"- allocator environment: {env.get('allocator_env') or 'none set'}",
            f"- load average at start: {env.get('loadavg')}"]


def write_outputs(doc: dict, args, text_md: str) -> None:
    if getattr(args, "json", None):
        results.write_json(doc, args.json)
    out = getattr(args, "out", None)
    if out:
        os.makedirs(out, exist_ok=True)
        results.write_json(doc, os.path.join(out, "results.json"))
        results.write_csv(doc, os.path.join(out, "results.csv"))
        with open(os.path.join(out, "bench.md"), "w") as f:
            f.write(text_md)
        _progress(f"wrote {out}/results.json, results.csv, bench.md")


# ---------------------------------------------------------------------------
# Micro-benchmarks

MICRO_OPS = ("spawn_join", "yield", "pingpong", "timers")
_MICRO_STYLES = {"spawn_join": ("stream", "task"), "yield": ("callback", "stream", "task"),
                 "pingpong": ("callback", "stream", "task"),
                 "timers": ("callback", "stream", "task")}
MICRO_START_N = {"spawn_join": 2000, "yield": 5000, "pingpong": 1000, "timers": 2000}
MICRO_TIMEOUT_S = 60.0


def micro_supported(op: str, rt) -> bool:
    """Whether ``op`` makes sense on ``rt``'s port (callback: no tasks, so no spawn_join)."""
    if op not in _MICRO_STYLES:
        raise ValueError(f"unknown micro-benchmark {op!r}; valid: {', '.join(MICRO_OPS)}")
    return rt.style in _MICRO_STYLES[op]


class MicroResult:
    """What one timed run did: ``ops`` operations completed (checked, not assumed) in
    ``elapsed_s`` seconds of the timed region."""
    __slots__ = ("op", "runtime", "n", "ops", "elapsed_s", "error")

    def __init__(self, op, runtime, n, ops, elapsed_s, error=None):
        self.op, self.runtime, self.n, self.ops = op, runtime, n, ops
        self.elapsed_s, self.error = elapsed_s, error

    @property
    def ops_per_s(self) -> float:
        return self.ops / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def as_dict(self) -> dict:
        return {"op": self.op, "runtime": self.runtime, "n": self.n, "ops": self.ops,
                "elapsed_s": self.elapsed_s, "ops_per_s": self.ops_per_s, "error": self.error}

    def __repr__(self):
        return (f"MicroResult({self.op} on {self.runtime}: {self.ops}/{self.n} ops in "
                f"{self.elapsed_s:.4f} s{', ' + self.error if self.error else ''})")


class _Box:
    """Where a run body leaves its count and timestamps."""
    __slots__ = ("ops", "t0", "t1", "error", "closed")

    def __init__(self):
        self.ops = 0
        self.t0 = self.t1 = None
        self.error = None
        self.closed = 0


# --- callback style: call_soon chains, two protocols, call_later -----------------------

def _cb_yield(port, n, box):
    call_soon = port.loop.call_soon
    left = [n, n]

    def step(i):
        box.ops += 1
        left[i] -= 1
        if left[i] > 0:
            call_soon(step, i)
        elif left[1 - i] == 0:
            box.t1 = time.perf_counter()
            port.stop()
    box.t0 = time.perf_counter()
    call_soon(step, 0)
    call_soon(step, 1)


def _cb_timers(port, n, box, delays):
    loop = port.loop

    def fire():
        box.ops += 1
        if box.ops == n:
            box.t1 = time.perf_counter()
            port.stop()
    box.t0 = time.perf_counter()
    call_later = loop.call_later
    for d in delays:
        call_later(d, fire)


class _PingServer:
    """Echoes every byte back; the run stops once both ends have closed."""
    transport = None

    def __init__(self, port, box):
        self.port, self.box = port, box

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.transport.write(data)

    def eof_received(self):
        return False

    def connection_lost(self, exc):
        if exc is not None and self.box.error is None:
            self.box.error = f"connection lost: {exc!r}"
        self.box.closed += 1
        if self.box.closed == 2:
            self.port.stop()

    def pause_writing(self):
        pass

    def resume_writing(self):
        pass


class _PingClient(_PingServer):
    def __init__(self, port, n, box, server):
        super().__init__(port, box)
        self.n, self.server = n, server

    def connection_made(self, transport):
        self.transport = transport
        self.box.t0 = time.perf_counter()
        transport.write(b"x")

    def data_received(self, data):
        box = self.box
        box.ops += len(data)
        if box.ops >= self.n:
            box.t1 = time.perf_counter()
            self.transport.close()
            self.server.close()
        else:
            self.transport.write(b"x")


def _cb_pingpong(port, n, box, listener):
    server = port.listen(lambda: _PingServer(port, box), listener)
    host, p = listener.getsockname()[:2]

    def connected(transport, protocol, exc):
        if exc is not None:
            box.error = f"connect failed: {exc!r}"
            server.close()
            port.stop()
    port.connect(lambda: _PingClient(port, n, box, server), host, p, connected)


# --- stream style ----------------------------------------------------------------------

async def _st_spawn_join(port, n, box):
    async def child():
        box.ops += 1
    create = port.create_task
    box.t0 = time.perf_counter()
    for _ in range(n):
        await create(child())
    box.t1 = time.perf_counter()


async def _st_yield(port, n, box):
    sleep = port.sleep

    async def worker():
        for _ in range(n):
            await sleep(0)
            box.ops += 1
    box.t0 = time.perf_counter()
    await port.gather(worker(), worker())
    box.t1 = time.perf_counter()


async def _st_timers(port, n, box, delays):
    sleep = port.sleep

    async def sleeper(d):
        await sleep(d)
        box.ops += 1
    box.t0 = time.perf_counter()
    tasks = [port.create_task(sleeper(d)) for d in delays]
    await port.gather(*tasks)
    box.t1 = time.perf_counter()


async def _st_pingpong(port, n, box, listener):
    async def handle(reader, writer):
        try:
            while data := await reader.read(1024):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        writer.close()
    server = await port.start_server(handle, sock=listener)
    host, p = listener.getsockname()[:2]
    reader, writer = await port.open_connection(host, p)
    try:
        box.t0 = time.perf_counter()
        for _ in range(n):
            writer.write(b"x")
            await writer.drain()
            data = await reader.read(1024)
            if not data:
                box.error = "server closed the connection"
                break
            box.ops += len(data)
        box.t1 = time.perf_counter()
    finally:
        writer.close()
        server.close()
        for _ in range(3):       # let both sides' close callbacks run
            await port.sleep(0)


# --- task style ------------------------------------------------------------------------

def _native_spawn(port):
    """The library's own ``spawn`` where it has spawn-and-join (coro, curio): that is the
    operation the goals name. trio has no join; its idiom is a nursery per child."""
    rid = port.runtime.id
    if rid == "coro":
        import kernels.coro as lib
        return lib.spawn
    if rid == "curio":
        import curio as lib
        return lib.spawn
    return None


async def _tk_spawn_join(port, n, box):
    async def child():
        box.ops += 1
    spawn = _native_spawn(port)
    box.t0 = time.perf_counter()
    if spawn is not None:
        for _ in range(n):
            task = await spawn(child)
            await task.join()
    else:
        open_nursery = port.open_nursery
        for _ in range(n):
            async with open_nursery() as nursery:
                await nursery.spawn(child)
    box.t1 = time.perf_counter()


async def _tk_yield(port, n, box):
    sleep = port.sleep

    async def worker():
        for _ in range(n):
            await sleep(0)
            box.ops += 1
    box.t0 = time.perf_counter()
    async with port.open_nursery() as nursery:
        await nursery.spawn(worker)
        await nursery.spawn(worker)
    box.t1 = time.perf_counter()


async def _tk_timers(port, n, box, delays):
    sleep = port.sleep

    async def sleeper(d):
        await sleep(d)
        box.ops += 1
    box.t0 = time.perf_counter()
    async with port.open_nursery() as nursery:
        for d in delays:
            await nursery.spawn(sleeper, d)
    box.t1 = time.perf_counter()


async def _tk_pingpong(port, n, box, listener):
    lst = port.listen(listener)
    host, p = listener.getsockname()[:2]

    async def serve_one():
        stream = await lst.accept()
        try:
            while data := await stream.receive_some(1024):
                await stream.send_all(data)
        except ConnectionError:
            pass
        await stream.aclose()

    async with port.open_nursery() as nursery:
        await nursery.spawn(serve_one)
        client = await port.open_tcp_stream(host, p)
        try:
            box.t0 = time.perf_counter()
            for _ in range(n):
                await client.send_all(b"x")
                data = await client.receive_some(1024)
                if not data:
                    box.error = "server closed the connection"
                    break
                box.ops += len(data)
            box.t1 = time.perf_counter()
        finally:
            await client.aclose()
    await lst.aclose()


_BODIES = {
    "callback": {"yield": _cb_yield, "timers": _cb_timers, "pingpong": _cb_pingpong},
    "stream": {"spawn_join": _st_spawn_join, "yield": _st_yield, "timers": _st_timers,
               "pingpong": _st_pingpong},
    "task": {"spawn_join": _tk_spawn_join, "yield": _tk_yield, "timers": _tk_timers,
             "pingpong": _tk_pingpong},
}


async def _bounded_stream(port, body, args, box):
    try:
        await port.wait_for(body(port, *args), MICRO_TIMEOUT_S)
    except TimeoutError:
        box.error = f"timed out after {MICRO_TIMEOUT_S:.0f} s"


async def _bounded_task(port, body, args, box):
    async with port.move_on_after(MICRO_TIMEOUT_S) as scope:
        await body(port, *args)
    if scope.cancelled_caught:
        box.error = f"timed out after {MICRO_TIMEOUT_S:.0f} s"


class Micro:
    """One prepared micro-benchmark run: the port is open and the listening socket bound
    (outside any timed region); ``run()`` does the operations once; ``close()`` releases
    everything (idempotent). A Micro runs once -- make a new one per round.

    ``op``: spawn_join (spawn a task and wait for it, ``n`` times: ``create_task`` +
    ``await`` on the stream port; ``spawn`` + ``join`` on coro and curio, a nursery per
    child on trio, which has no join), yield (two tasks or
    call_soon chains each yielding ``n`` times: 2n operations), pingpong (``n`` 1-byte
    round trips over a 127.0.0.1 TCP connection made through the port's own
    connect/accept), timers (``n`` timers -- sleeping tasks on the task and stream ports --
    with seeded random delays up to 1 ms, all awaited)."""

    def __init__(self, op: str, runtime, n: int, seed: int = 1):
        from protocols import runtimes
        if isinstance(runtime, str):
            runtime = runtimes.parse(runtime)
        if op not in _MICRO_STYLES:
            raise ValueError(f"unknown micro-benchmark {op!r}; valid: {', '.join(MICRO_OPS)}")
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"n must be a positive int, not {n!r}")
        if not micro_supported(op, runtime):
            raise ValueError(f"micro-benchmark {op} does not apply to {runtime.id} "
                             f"({runtime.style} port)")
        self.op, self.n = op, n
        self.runtime = bench_runtime(runtime)
        self.expected = 2 * n if op == "yield" else n
        self.box = _Box()
        self.listener = None
        self.port = None
        self._ran = False
        rng = random.Random(seed)
        self.delays = [rng.random() * 0.001 for _ in range(n)] if op == "timers" else None
        try:
            if op == "pingpong":
                self.listener = runtimes.bind_listener("127.0.0.1", 0)
            self.port = self.runtime.open()
        except BaseException:
            self.close()
            raise

    def run(self) -> MicroResult:
        if self._ran:
            raise RuntimeError("a Micro runs once; make a new one")
        self._ran = True
        port, box, op, n = self.port, self.box, self.op, self.n
        body = _BODIES[port.style][op]
        extra = (self.delays,) if op == "timers" else (self.listener,) if op == "pingpong" else ()
        if port.style == "callback":
            def setup(p):
                p.call_later(MICRO_TIMEOUT_S, self._timeout)
                body(p, n, box, *extra)
            port.run(setup)
        elif port.style == "stream":
            port.run(_bounded_stream, body, (n, box, *extra), box)
        else:
            port.run(_bounded_task, body, (n, box, *extra), box)
        elapsed = (box.t1 - box.t0) if box.t0 is not None and box.t1 is not None else 0.0
        error = box.error
        if error is None and box.ops != self.expected:
            error = f"{box.ops} of {self.expected} operations completed"
        return MicroResult(op, self.runtime.spec, n, box.ops, elapsed, error)

    def _timeout(self):
        self.box.error = f"timed out after {MICRO_TIMEOUT_S:.0f} s"
        self.port.stop()

    def close(self) -> None:
        if self.port is not None:
            port, self.port = self.port, None
            port.close()
        if self.listener is not None:
            self.listener.close()
            self.listener = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def micro(op: str, runtime, n: int, seed: int = 1) -> MicroResult:
    """Prepare, run once, close. The port is built outside the timed region."""
    with Micro(op, runtime, n, seed) as m:
        return m.run()


def micro_calibrated(op: str, runtime, min_time: float = 0.2, n: int | None = None,
                     max_rounds: int = 6) -> MicroResult:
    """pyperf-style: grow ``n`` until one run lasts ``min_time``; the runs before the
    last are the warm-up. Always at least one warm-up run."""
    n = n or MICRO_START_N[op]
    warmed = False
    for _ in range(max_rounds):
        res = micro(op, runtime, n)
        if res.error:
            return res
        if res.elapsed_s >= min_time and warmed:
            return res
        warmed = True
        if res.elapsed_s < min_time:
            grow = min_time * 1.2 / max(res.elapsed_s, 1e-6)
            n = int(min(max(n * 2, n * grow), n * 50, 5_000_000))
    return res


def micro_worker_main(argv) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.perf micro-worker")
    p.add_argument("--op", required=True, choices=MICRO_OPS)
    p.add_argument("--runtime", required=True)
    p.add_argument("--min-time", type=float, default=0.2)
    p.add_argument("--n", type=int, default=None)
    a = p.parse_args(argv)
    try:
        res = micro_calibrated(a.op, a.runtime, a.min_time, a.n)
        out = res.as_dict()
    except Exception as exc:
        out = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(out), flush=True)
    return 0


def _micro_in_worker(op: str, rt, min_time: float, cpu: int | None,
                     timeout_s: float = 180.0) -> dict:
    cmd = [sys.executable, "-m", "bench.perf", "micro-worker", "--op", op, "--runtime",
           bench_runtime(rt).spec, "--min-time", repr(min_time)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, cwd=ROOT)
    _pin(proc.pid, cpu)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise MeasureError(f"micro worker timed out after {timeout_s:.0f} s") from None
    lines = out.decode(errors="replace").strip().splitlines()
    try:
        res = json.loads(lines[-1])
    except (IndexError, ValueError):
        raise MeasureError(f"micro worker failed: {err.decode(errors='replace').strip()[-300:]}") from None
    if res.get("error"):
        raise MeasureError(res["error"])
    return res


def run_micro_matrix(rts, ops, repeat: int, min_time: float, pin: bool = True,
                     progress=_progress) -> list[dict]:
    """Every supported (op, runtime), ``repeat`` times, interleaved across runtimes in
    rounds, each in a fresh worker process pinned to one CPU."""
    cpu, _ = cpu_plan(pin)
    units = [(op, rt) for op in ops for rt in rts if micro_supported(op, rt)]
    store = {(op, rt.spec): {"ops_per_s": [], "n": [], "rounds": [], "errors": []}
             for op, rt in units}
    total, done = len(units) * repeat, 0
    for r in range(repeat):
        for op in ops:
            rts_op = [rt for o, rt in units if o == op]
            if not rts_op:
                continue
            k = r % len(rts_op)
            for rt in rts_op[k:] + rts_op[:k]:
                done += 1
                entry = store[(op, rt.spec)]
                label = f"[{done}/{total}] round {r + 1}/{repeat} {op} {rt.spec}"
                try:
                    res = _micro_in_worker(op, rt, min_time, cpu)
                except MeasureError as exc:
                    entry["errors"].append(f"round {r + 1}: {exc}")
                    progress(f"{label}: FAILED: {exc}")
                    continue
                entry["ops_per_s"].append(res["ops_per_s"])
                entry["n"].append(res["n"])
                entry["rounds"].append(r)
                progress(f"{label}: {res['ops_per_s']:,.0f} ops/s (n={res['n']})")
    cells = []
    for op, rt in units:
        e = store[(op, rt.spec)]
        cell = results.new_cell("micro", rt.spec, op, {},
                                samples={"ops_per_s": e["ops_per_s"]} if e["ops_per_s"] else {},
                                errors=e["errors"],
                                details={"n": e["n"], "rounds": e["rounds"], "min_time_s": min_time,
                                         "runtime_benchmarked": bench_runtime(rt).spec})
        cell["repeats"] = len(e["rounds"])
        cells.append(cell)
    return cells


# ---------------------------------------------------------------------------
# Goals (the performance targets, benchmarks not asserts)

class Goal:
    def __init__(self, kind, subject, reference, target, what):
        self.kind, self.subject, self.reference = kind, subject, reference
        self.target, self.what = target, what


GOALS = [
    Goal("echo", "callback", "asyncio-protocol", 1.1, "echo 1 KiB x 10 conns"),
    Goal("echo", "hybrid", "asyncio-streams", 1.0, "echo 1 KiB x 10 conns"),
    Goal("echo", "coro", "curio", 1.25, "echo 1 KiB x 10 conns"),
    Goal("echo", "coro", "trio", 2.0, "echo 1 KiB x 10 conns"),
    Goal("yield", "coro", "curio", 2.0, "yields/s"),
    Goal("spawn_join", "coro", "curio", 10.0, "spawn+join/s"),
    Goal("pingpong", "coro", "curio", 1.1, "ping-pong round trips/s"),
]
GOAL_ECHO_RUNTIMES = ["callback", "asyncio-protocol", "hybrid", "asyncio-streams", "coro",
                      "curio", "trio"]
GOAL_MICRO_RUNTIMES = ["coro", "curio"]


def evaluate_goals(cells: list[dict]) -> list[dict]:
    """One row per goal: median of paired per-round ratios, their range, and the verdict
    ("met" when the median reaches the target; "borderline" when the range straddles it)."""
    by = {}
    for c in cells:
        key = "echo" if c["scenario"] == "echo" else c["variant"]
        by[(key, c["runtime"])] = c
    rows = []
    for g in GOALS:
        metric = "requests_per_s" if g.kind == "echo" else "ops_per_s"
        a, b = by.get((g.kind, g.subject)), by.get((g.kind, g.reference))
        row = {"goal": f"{g.subject} {g.what} >= {g.target:g}x {g.reference}", "target": g.target,
               "kind": g.kind, "subject": g.subject, "reference": g.reference,
               "ratio": None, "min": None, "max": None, "n": 0, "status": "not measured"}
        if a and b and a["metrics"].get(metric) and b["metrics"].get(metric):
            paired = _paired(a, b, metric) or [a["metrics"][metric] / b["metrics"][metric]]
            med = statistics.median(paired)
            lo, hi = min(paired), max(paired)
            status = "met" if med >= g.target else "not met"
            if lo < g.target <= hi:
                status += " (borderline)"
            row.update(ratio=med, min=lo, max=hi, n=len(paired), status=status)
            if g.kind == "echo":
                # Server CPU per request, reference over subject: the efficiency ratio.
                # With 10 connections neither side saturates its CPU (cross-CPU wake-ups
                # set part of the pace), so this says more about the kernel's own cost.
                cpu = _paired(b, a, "server_cpu_per_request_s")
                row["cpu_ratio"] = statistics.median(cpu) if cpu else None
        rows.append(row)
    return rows


def goals_table(rows: list[dict], markdown: bool = False) -> str:
    table = [[r["goal"],
              "-" if r["ratio"] is None else f"{r['ratio']:.2f}",
              "-" if r["min"] is None else f"{r['min']:.2f}-{r['max']:.2f}",
              r["n"], r["status"],
              "-" if r.get("cpu_ratio") is None else f"{r['cpu_ratio']:.2f}"] for r in rows]
    return render_table(["goal", "measured ratio (median)", "range", "rounds", "status",
                         "server CPU/req ratio"], table, markdown)


def run_goals(repeat: int = 5, duration: float = 2.0, warmup: float = 1.0, min_time: float = 0.3,
              client=None, pin: bool = True, progress=_progress) -> tuple[list[dict], list[dict], dict]:
    """Exactly the measurements behind GOALS. Returns (cells, goal rows, skipped)."""
    rts, skipped = _split_available(_runtimes(",".join(GOAL_ECHO_RUNTIMES)))
    cells = []
    if rts:
        cells += run_echo_matrix(echo_units(rts, [1 * KiB], [10]), duration, warmup, repeat,
                                 client, pin, progress)
    mrts = [rt for rt in rts if rt.id in GOAL_MICRO_RUNTIMES]
    if mrts:
        cells += run_micro_matrix(mrts, ["yield", "spawn_join", "pingpong"], repeat, min_time,
                                  pin, progress)
    return cells, evaluate_goals(cells), skipped


# ---------------------------------------------------------------------------
# Scale: idle connections and the connection curve

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


def measure_idle(rt, connections: int, progress=_progress, batch: int = 100) -> dict:
    """Open ``connections`` idle connections to a fresh echo server; each is used for one
    1-byte round trip (so the server has really set it up), then left idle. Returns the
    server's RSS before and after and the growth per connection."""
    spec = bench_runtime(rt).spec
    socks = []
    with ServerProcess(spec) as server:
        time.sleep(0.3)
        before = _rss_bytes(server.pid)
        try:
            host, port = server.address
            for start in range(0, connections, batch):
                fresh = []
                for _ in range(min(batch, connections - start)):
                    s = socket.create_connection((host, port), timeout=10)
                    socks.append(s)
                    fresh.append(s)
                for s in fresh:
                    s.sendall(b"i")
                for s in fresh:
                    if s.recv(16) != b"i":
                        raise MeasureError("the server did not echo on an idle connection")
                if not server.alive():
                    raise MeasureError(f"server died: {server.stderr_tail()}")
                if (start // batch) % 20 == 19:
                    progress(f"  {rt.spec}: {len(socks)} connections open")
            time.sleep(0.5)
            after = _rss_bytes(server.pid)
        except OSError as exc:
            raise MeasureError(f"after {len(socks)} connections: {exc}") from None
        finally:
            for s in socks:
                s.close()
    if before is None or after is None:
        raise MeasureError("cannot read the server's RSS (/proc not available)")
    return {"server_rss_before_bytes": before, "server_rss_after_bytes": after,
            "rss_per_connection_bytes": (after - before) / max(connections, 1),
            "connections_count": connections}


# ---------------------------------------------------------------------------
# Command line

def _parse_int_list(text: str, what: str, allow_size: bool = False) -> list[int]:
    out = []
    for token in (t.strip() for t in text.split(",")):
        if not token:
            continue
        t = token.lower().replace(" ", "")
        mult = 1
        if allow_size:
            for suffix, m in (("kib", KiB), ("k", KiB), ("mib", KiB * KiB), ("m", KiB * KiB), ("b", 1)):
                if t.endswith(suffix):
                    t, mult = t[: -len(suffix)], m
                    break
        if not t.isdigit() or int(t) * mult < 1:
            hint = " (bytes, or with a KiB/MiB suffix: 1KiB,10KiB)" if allow_size else ""
            raise _usage(f"bad {what} {token!r}: expected positive integers{hint}")
        out.append(int(t) * mult)
    if not out:
        raise _usage(f"--{what} is empty")
    return out


def _settings(args) -> dict:
    preset = args.preset or "quick"
    if preset not in PRESETS:
        raise _usage(f"unknown preset {preset!r}; choose {', '.join(PRESETS)}")
    s = dict(PRESETS[preset], preset=preset)
    if args.sizes:
        s["sizes"] = _parse_int_list(args.sizes, "sizes", allow_size=True)
    if args.concurrency:
        s["concurrency"] = _parse_int_list(args.concurrency, "concurrency")
    for name in ("duration", "warmup", "min_time"):
        v = getattr(args, name, None)
        if v is not None:
            if not v > 0 and not (name == "warmup" and v == 0):
                raise _usage(f"--{name.replace('_', '-')} must be positive")
            s[name] = v
    if args.repeat is not None:
        if args.repeat < 1:
            raise _usage("--repeat must be >= 1")
        s["repeat"] = args.repeat
    return s


def _env(client_desc: str | None, pin: bool) -> dict:
    env = results.environment()
    server_cpu, client_cpu = cpu_plan(pin)
    env["pinning"] = ("server on CPU %d, client on CPU %d" % (server_cpu, client_cpu)
                      if server_cpu is not None else "none (fewer than 2 CPUs, or --no-pin)")
    if client_desc:
        env["load_client"] = client_desc
    return env


def _pick_runtimes(args, default=None):
    rts = _runtimes(args.runtimes, default)
    ok, skipped = _split_available(rts)
    for spec, reason in skipped.items():
        _progress(f"skipping {spec}: {reason}")
    return ok, skipped


def _md_report(title: str, env: dict, body: str, skipped: dict, notes: list[str]) -> str:
    lines = [f"# {title}", "", *_env_lines(env), ""]
    if skipped:
        lines += ["Skipped (unavailable here):", *[f"- {k}: {v}" for k, v in skipped.items()], ""]
    lines += [body, ""]
    if notes:
        lines += ["Notes:", *[f"- {n}" for n in notes], ""]
    return "\n".join(lines)


_METHOD_NOTES = [
    "each measurement is a fresh server process (`looplab serve echo --variant naive`), "
    "pinned to its own CPU, with the load client on the other; reference runtimes run with "
    "instrument=false",
    "runtimes are interleaved in rounds whose order rotates; a 1-s warm-up is not counted",
    f"noisy: other processes used > {NOISY_OTHER_CPU} CPU or steal > {NOISY_STEAL:.0%} during "
    f"the counted window; client-bound: the load client used > {CLIENT_SATURATED:.0%} of its CPU",
    "absolute numbers drift ~20 % between sessions on these machines: compare ratios within a run",
]


def cmd_bench(args) -> int:
    mode = "micro" if args.micro else (args.mode or "echo")
    if args.micro and args.mode not in (None, "echo", "micro"):
        raise _usage(f"--micro cannot be combined with `bench {args.mode}`")
    if mode == "goals":
        return _cmd_goals(args)
    if mode == "idle":
        return _cmd_idle(args)
    settings = _settings(args)
    pin = not args.no_pin
    if mode == "micro":
        return _cmd_micro(args, settings, pin)
    if mode == "curve":
        if not args.concurrency:
            settings["concurrency"] = list(CURVE_CONNECTIONS)
        if not args.sizes:
            settings["sizes"] = [1 * KiB]
    rts, skipped = _pick_runtimes(args)
    if not rts:
        print("looplab bench: none of the requested runtimes is available here", file=sys.stderr)
        return 3
    from protocols import runtimes as _r
    baseline = _r.parse(args.baseline).spec
    try:
        client = load_client(args.client)
    except MeasureError as exc:
        print(f"looplab bench: {exc}", file=sys.stderr)
        return 3
    if mode == "curve" and max(settings["concurrency"]) > 400:
        _soft, _hard, warning = raise_nofile(2 * max(settings["concurrency"]) + 256)
        if warning:
            _progress("WARNING: " + warning)
    units = echo_units(rts, settings["sizes"], settings["concurrency"], args.shard)
    if not units:
        _progress("this shard has no cells to measure")
    est = len(units) * settings["repeat"] * (settings["duration"] + settings["warmup"] + 0.8)
    _progress(f"looplab bench {mode} ({settings['preset']}): {len(units)} cells x "
              f"{settings['repeat']} repeats, ~{est / 60:.1f} min; load client: {client[1]}")
    cells = run_echo_matrix(units, settings["duration"], settings["warmup"], settings["repeat"],
                            client, pin)
    env = _env(client[1], pin)
    config = {"mode": mode, **settings, "baseline": baseline, "shard": args.shard,
              "skipped": skipped}
    doc = results.new_document(cells, env=env, config=config)
    text = echo_tables(cells, baseline)
    if mode == "curve":
        text = curve_table(cells) + "\n\n" + text
    print(text)
    md = _md_report(f"looplab bench {mode} ({settings['preset']})", env,
                    (curve_table(cells, True) + "\n\n" if mode == "curve" else "")
                    + echo_tables(cells, baseline, markdown=True), skipped, _METHOD_NOTES)
    write_outputs(doc, args, md)
    if mode == "curve" and args.out:
        _plot_curve(cells, os.path.join(args.out, "curve.png"))
    failed = [c["id"] for c in cells if c["errors"] and not c["repeats"]]
    if failed:
        print(f"looplab bench: {len(failed)} cell(s) produced no measurement: {', '.join(failed)}",
              file=sys.stderr)
        return 1
    return 0


def curve_table(cells: list[dict], markdown: bool = False) -> str:
    specs = list(dict.fromkeys(c["runtime"] for c in cells))
    conns = sorted({c["params"]["connections"] for c in cells})
    by = {(c["runtime"], c["params"]["connections"]): c for c in cells}
    rows = [[n] + [_fmt_rate((by.get((s, n)) or {}).get("metrics", {}).get("requests_per_s"))
                   for s in specs] for n in conns]
    title = "echo requests/s by number of connections (medians)"
    return ("### " if markdown else "") + title + "\n\n" + render_table(["connections"] + specs,
                                                                         rows, markdown)


def _plot_curve(cells, path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        _progress("matplotlib is not installed: no curve.png")
        return
    fig, ax = plt.subplots(figsize=(8, 5))
    for spec in dict.fromkeys(c["runtime"] for c in cells):
        pts = sorted((c["params"]["connections"], c["metrics"]["requests_per_s"])
                     for c in cells if c["runtime"] == spec and c["metrics"].get("requests_per_s"))
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=spec)
    ax.set_xscale("log")
    ax.set_xlabel("connections")
    ax.set_ylabel("requests/s (median)")
    ax.set_title("echo throughput by connection count")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    _progress(f"wrote {path}")


def _cmd_micro(args, settings, pin) -> int:
    rts, skipped = _pick_runtimes(args)
    if not rts:
        print("looplab bench: none of the requested runtimes is available here", file=sys.stderr)
        return 3
    ops = [o.strip() for o in args.ops.split(",")] if args.ops else list(MICRO_OPS)
    for op in ops:
        if op not in MICRO_OPS:
            raise _usage(f"unknown micro-benchmark {op!r}; valid: {', '.join(MICRO_OPS)}")
    all_units = [(op, rt) for op in ops for rt in rts if micro_supported(op, rt)]
    keep = results.shard(all_units, args.shard)
    kept_ops = list(dict.fromkeys(op for op, _ in keep))
    kept_rts = list({rt.spec: rt for _, rt in keep}.values())
    _progress(f"looplab bench --micro ({settings['preset']}): {len(keep)} cells x "
              f"{settings['repeat']} repeats, min time {settings['min_time']} s per run")
    cells = [c for c in run_micro_matrix(kept_rts, kept_ops, settings["repeat"],
                                         settings["min_time"], pin)
             if any((op, rt.spec) == (c["variant"], c["runtime"]) for op, rt in keep)]
    env = _env(None, pin)
    doc = results.new_document(cells, env=env, config={"mode": "micro", **settings,
                                                        "skipped": skipped, "shard": args.shard})
    text = micro_table(cells)
    print(text)
    notes = ["each value is one fresh worker process pinned to one CPU; the operation count "
             "grows until a run lasts --min-time, the earlier runs being the warm-up",
             "pingpong runs over a 127.0.0.1 TCP connection made through the port (not a "
             "socketpair): every runtime pays the same kernel cost per round trip",
             "timers on the stream and task ports are sleeping tasks (spawn + sleep)",
             "spawn_join: create_task + await (stream port), spawn + join (coro, curio), "
             "a nursery per child (trio, which has no join)"]
    write_outputs(doc, args, _md_report(f"looplab bench --micro ({settings['preset']})", env,
                                        micro_table(cells, True), skipped, notes))
    return 1 if any(c["errors"] and not c["repeats"] for c in cells) else 0


def _cmd_goals(args) -> int:
    repeat = args.repeat or 5
    duration = args.duration or 2.0
    warmup = args.warmup if args.warmup is not None else 1.0
    min_time = args.min_time or 0.3
    pin = not args.no_pin
    try:
        client = load_client(args.client)
    except MeasureError as exc:
        print(f"looplab bench: {exc}", file=sys.stderr)
        return 3
    _progress(f"looplab bench goals: echo 1 KiB x 10 on {len(GOAL_ECHO_RUNTIMES)} runtimes and "
              f"micro yield/spawn_join/pingpong on coro and curio, {repeat} rounds each")
    cells, rows, skipped = run_goals(repeat, duration, warmup, min_time, client, pin)
    for spec, reason in skipped.items():
        _progress(f"skipped {spec}: {reason}")
    env = _env(client[1], pin)
    doc = results.new_document(cells, env=env, config={
        "mode": "goals", "repeat": repeat, "duration": duration, "warmup": warmup,
        "min_time": min_time, "skipped": skipped}, goals=rows)
    print(goals_table(rows))
    print()
    print(echo_tables([c for c in cells if c["scenario"] == "echo"], "asyncio-protocol"))
    print()
    print(micro_table([c for c in cells if c["scenario"] == "micro"]))
    body = "\n\n".join(["### goals (median of per-round paired ratios; range over rounds; "
                        "server CPU/req ratio: the reference's server CPU per request over "
                        "the subject's, > 1 is cheaper)",
                        goals_table(rows, True),
                        echo_tables([c for c in cells if c["scenario"] == "echo"],
                                    "asyncio-protocol", True),
                        micro_table([c for c in cells if c["scenario"] == "micro"], True)])
    write_outputs(doc, args, _md_report("looplab bench goals", env, body, skipped, _METHOD_NOTES))
    if args.fail and any(not r["status"].startswith("met") for r in rows):
        return 1
    return 0


def _cmd_idle(args) -> int:
    n = args.connections
    if n < 1:
        raise _usage("--connections must be >= 1")
    rts, skipped = _pick_runtimes(args)
    if not rts:
        print("looplab bench: none of the requested runtimes is available here", file=sys.stderr)
        return 3
    soft, hard, warning = raise_nofile(n + 256)
    notes = [f"RLIMIT_NOFILE: soft {soft}, hard {hard}"]
    if warning:
        n = max(1, soft - 256)
        warning += f"; measuring {n} connections instead"
        print(f"WARNING: {warning}", file=sys.stderr)
        notes.append(warning)
    repeat = args.repeat or 1
    cells = []
    for rt in rts:
        samples: dict[str, list] = {}
        errors = []
        for r in range(repeat):
            _progress(f"idle: {rt.spec}, {n} connections (round {r + 1}/{repeat})")
            try:
                s = measure_idle(rt, n)
            except MeasureError as exc:
                errors.append(str(exc))
                _progress(f"  FAILED: {exc}")
                continue
            for k, v in s.items():
                samples.setdefault(k, []).append(v)
            _progress(f"  {s['rss_per_connection_bytes'] / 1024:.1f} KiB per connection")
        cells.append(results.new_cell("idle", rt.spec, "naive", {"connections": n},
                                      samples=samples, errors=errors,
                                      details={"server_runtime": bench_runtime(rt).spec}))
    rows = [[c["runtime"], c["params"]["connections"],
             "-" if c["metrics"].get("rss_per_connection_bytes") is None
             else f"{c['metrics']['rss_per_connection_bytes'] / 1024:.1f} KiB",
             "-" if c["metrics"].get("server_rss_after_bytes") is None
             else f"{c['metrics']['server_rss_after_bytes'] / 2**20:.1f} MiB",
             "; ".join(c["errors"])[:60]] for c in cells]
    headers = ["runtime", "connections", "RSS per connection", "server RSS", "errors"]
    print(render_table(headers, rows))
    if warning:
        print(f"NOTE: {warning}")
    env = _env(None, False)
    doc = results.new_document(cells, env=env, config={"mode": "idle", "connections": n,
                                                        "skipped": skipped, "rlimit_nofile": [soft, hard]})
    write_outputs(doc, args, _md_report("looplab bench idle", env,
                                        "### server memory per idle connection\n\n"
                                        + render_table(headers, rows, True), skipped, notes))
    return 1 if any(c["errors"] and not c["samples"] for c in cells) else 0


def register(subparsers) -> None:
    """Add the ``bench`` verb to the looplab command line."""
    p = subparsers.add_parser(
        "bench", help="performance matrices: echo throughput/latency, micro-benchmarks, goals",
        description="Echo throughput and latency (uvloop's benchmark shape): a fresh server "
                    "process per measurement pinned to CPU 0, a C epoll load client on CPU 1, "
                    "runtimes interleaved in rounds, medians with spreads and a ratio table "
                    "against --baseline. `bench goals` runs the measurements behind the "
                    "performance goals; `bench idle` measures server memory per idle "
                    "connection; `bench curve` throughput over 1..1000 connections; --micro "
                    "the micro-benchmarks (spawn_join, yield, pingpong, timers). Progress goes "
                    "to stderr, tables to stdout.")
    p.add_argument("mode", nargs="?", default=None, choices=["echo", "goals", "idle", "curve", "micro"],
                   help="what to measure (default echo)")
    p.add_argument("--preset", default=None,
                   help="quick (1 KiB x 10 conns, 2-s runs, 3 repeats; ~2-3 min for all runtimes) "
                        "or full (1/10/100 KiB x 1/10/100 conns, 5-s runs, 7 repeats)")
    p.add_argument("--runtimes", default=None,
                   help="comma list of runtime specs (default: all available)")
    p.add_argument("--sizes", default=None, help="message sizes, e.g. 1KiB,10KiB,100KiB (plain numbers are bytes)")
    p.add_argument("--concurrency", default=None, help="connection counts, e.g. 1,10,100")
    p.add_argument("--duration", type=float, default=None, help="counted seconds per run")
    p.add_argument("--warmup", type=float, default=None, help="uncounted seconds before each run (default 1)")
    p.add_argument("--repeat", type=int, default=None, help="runs per cell")
    p.add_argument("--baseline", default="asyncio-protocol", help="runtime the ratios are taken against")
    p.add_argument("--json", default=None, metavar="PATH", help="write the results JSON here")
    p.add_argument("--out", default=None, metavar="DIR", help="write results.json, results.csv and bench.md here")
    p.add_argument("--shard", default=None, metavar="I/N", help="measure only the I-th of N slices of the cells")
    p.add_argument("--micro", action="store_true", help="run the micro-benchmarks instead of the echo load")
    p.add_argument("--ops", default=None, help="micro: comma list of spawn_join,yield,pingpong,timers")
    p.add_argument("--min-time", type=float, default=None, help="micro: least seconds per timed run")
    p.add_argument("--connections", type=int, default=10000, help="idle: connections to open (default 10000)")
    p.add_argument("--client", default="auto", help="load client: auto (C if a compiler works), c, python")
    p.add_argument("--no-pin", action="store_true", help="do not pin server and client to CPUs")
    p.add_argument("--fail", action="store_true", help="goals: exit 1 when a goal is not met")
    p.set_defaults(fn=cmd_bench)


def main(argv=None) -> int:
    """Worker entry points (``python -m bench.perf client|micro-worker ...``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "client":
        p = argparse.ArgumentParser(prog="python -m bench.perf client")
        for name in ("host",):
            p.add_argument(name)
        for name in ("port", "conns", "size"):
            p.add_argument(name, type=int)
        p.add_argument("warmup", type=float)
        p.add_argument("duration", type=float)
        p.add_argument("--procs", type=int, default=0)
        a = p.parse_args(argv[1:])
        return py_client_main(a.host, a.port, a.conns, a.size, a.warmup, a.duration, a.procs)
    if argv and argv[0] == "micro-worker":
        return micro_worker_main(argv[1:])
    print("usage: python -m bench.perf client ... | micro-worker ... (worker processes of "
          "`looplab bench`)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
