"""Load generation for the echo benchmark: the server under test in its own process, and
the load client that drives it.

The client must never be the bottleneck. The preferred client is a small C program using
epoll (``bench/perf/echo_client.c``, shipped with the package), compiled at run time with the
machine's C compiler into a cache folder. Without a compiler, a Python client of blocking
sockets in forked worker processes stands in, and the results say so. Both print "W"
when the counted window opens, then one JSON line with the same keys.

This module is also the Python client's entry point::

    python -m bench.perf.loadgen client HOST PORT CONNS MESSAGE_BYTES WARMUP_S DURATION_S [--procs P]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from importlib import resources

from bench.host import envs
from bench.host import procs
from bench.errors import UsageError
from bench.perf.machine import ROOT, MeasureError, pin, read_line, stop_process, tail

__all__ = ["ROOT", "CLIENT_KINDS", "ServerProcess", "client_source", "load_client",
           "client_command", "py_client_main"]

CLIENT_KINDS = ("auto", "c", "python")
_C_SOURCE = "echo_client.c"


def _default_sigint() -> None:
    # `serve` turns SIGTERM into SIGINT, which does nothing if we were started with SIGINT
    # ignored (nohup, a background job of a script): un-ignore it in the child.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class ServerProcess:
    """``python -m bench serve APP --runtime SPEC`` in a fresh process, pinned, ready.

    ``start()`` waits for its "listening on H:P" line and then for one real echo round
    trip, so the measured window never includes the interpreter's start-up. ``sockbuf``
    (bytes, 0 or None: the system default) pins the server's socket buffers."""

    def __init__(self, spec: str, app: str = "echo", variant: str = "naive",
                 cpu: int | None = None, start_timeout_s: float = 30.0,
                 sockbuf: int | None = None):
        self.spec, self.app, self.variant, self.cpu = spec, app, variant, cpu
        self.start_timeout_s = start_timeout_s
        self.sockbuf = sockbuf
        self.proc = None
        self.address = None
        self._stderr = None

    def command(self) -> list[str]:
        # A spec's @3.12 serves from that interpreter's environment; any other spec
        # from looplab's own Python, which also reports a bad spec itself.
        python = envs.interpreter_for(self.spec) if "@" in self.spec else None
        cmd = procs.python_command("bench", "serve", self.app, "--runtime", self.spec,
                                   "--listen", "127.0.0.1:0", "--variant", self.variant,
                                   python=python)
        if self.sockbuf:
            cmd += ["--sockbuf", str(self.sockbuf)]
        return cmd

    def start(self) -> "ServerProcess":
        self._stderr = tempfile.TemporaryFile()
        self.proc = procs.spawn(self.command(), stderr=self._stderr, preexec_fn=_default_sigint)
        try:
            pin(self.proc.pid, self.cpu)
            deadline = time.monotonic() + self.start_timeout_s
            line = read_line(self.proc, bytearray(), deadline)
            if not line or not line.startswith("listening on "):
                raise MeasureError(f"server {self.spec} did not start: {line or 'no output'}; "
                                   f"stderr: {tail(self._stderr) or '-'}")
            host, _, port = line[len("listening on "):].strip().rpartition(":")
            self.address = (host, int(port))
            if self.app == "echo":
                self._probe(deadline)
        except BaseException:        # a failed start, or Ctrl-C/SIGTERM during it
            self.stop()
            raise
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
                raise MeasureError(f"server {self.spec} never echoed; "
                                   f"stderr: {tail(self._stderr) or '-'}")
            time.sleep(0.1)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stderr_tail(self) -> str:
        return tail(self._stderr) if self._stderr else ""

    def stop(self) -> int | None:
        code = None
        if self.proc is not None:
            code = stop_process(self.proc)
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        return code

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


# ---------------------------------------------------------------------------
# The load client

def client_source() -> bytes:
    """The C client's source, read from the installed package's data."""
    return resources.files("bench.perf").joinpath(_C_SOURCE).read_bytes()


def _cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "looplab")


def _compile(cc: str, source: bytes) -> tuple[str | None, str]:
    """(path of the compiled client, "") or (None, why not). Compiled once per source
    version into the cache folder; a half-built binary is never left at the final name."""
    digest = hashlib.sha256(source).hexdigest()[:12]
    folder = _cache_dir()
    exe = os.path.join(folder, f"echo-client-{digest}")
    if os.access(exe, os.X_OK):
        return exe, ""
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            src = os.path.join(tmp, _C_SOURCE)
            with open(src, "wb") as f:
                f.write(source)
            out = os.path.join(tmp, "echo-client")
            r = subprocess.run([cc, "-O2", "-o", out, src], capture_output=True, text=True,
                               timeout=120)
            if r.returncode != 0:
                return None, f"{cc} failed: {r.stderr.strip()[-200:]}"
            os.replace(out, exe)
            return exe, ""
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"cannot build the C client: {exc}"


def load_client(kind: str = "auto") -> tuple[list[str] | None, str]:
    """The load client to use: ``(argv prefix, description)``; the prefix is None for the
    Python client. ``kind``: auto (C when a compiler works, else Python), c, python.
    ``c`` without a working compiler raises MeasureError."""
    if kind not in CLIENT_KINDS:
        raise UsageError(f"unknown load client {kind!r}; choose {', '.join(CLIENT_KINDS)}")
    if kind == "python":
        return None, "python (blocking sockets in worker processes; asked for)"
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("cc")
    reason = "no C compiler found"
    if cc:
        try:
            source = client_source()
        except OSError as exc:
            exe, reason = None, f"the C client's source is missing from the package: {exc}"
        else:
            exe, reason = _compile(cc, source)
        if exe:
            return [exe], f"c-epoll ({exe})"
    if kind == "c":
        raise MeasureError(f"--client c: {reason}")
    return None, f"python (blocking sockets in worker processes; {reason})"


def client_command(client, host: str, port: int, connections: int, message_bytes: int,
                   warmup: float, duration: float) -> list[str]:
    prefix = client[0]
    args = [host, str(port), str(connections), str(message_bytes), repr(warmup), repr(duration)]
    if prefix is None:
        return procs.python_command("bench.perf.loadgen", "client", *args)
    return [*prefix, *args]


# --- the Python load client (fallback) -------------------------------------------------

def _pattern(size: int) -> bytes:
    return (bytes((i * 131 + 7) & 0xFF for i in range(256)) * (size // 256 + 1))[:size]


def _py_client_worker(host, port, conns, size, t_start, t_end, out_fd) -> None:
    """One worker: ``conns`` blocking sockets, round-robin request/response. All its
    connections have a request in flight at once (send all, then read all back)."""
    msg = _pattern(size)
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


def main(argv=None) -> int:
    """``python -m bench.perf.loadgen client ...``: the Python client as its own process."""
    p = argparse.ArgumentParser(prog="python -m bench.perf.loadgen")
    sub = p.add_subparsers(dest="what", required=True)
    c = sub.add_parser("client", help="the Python echo load client")
    c.add_argument("host")
    for name in ("port", "conns", "size"):
        c.add_argument(name, type=int)
    c.add_argument("warmup", type=float)
    c.add_argument("duration", type=float)
    c.add_argument("--procs", type=int, default=0)
    a = p.parse_args(argv)
    if a.conns < 1 or a.size < 1 or a.duration <= 0 or a.warmup < 0:
        p.error("conns and size must be >= 1, duration > 0, warmup >= 0")
    return py_client_main(a.host, a.port, a.conns, a.size, a.warmup, a.duration, a.procs)


if __name__ == "__main__":
    sys.exit(main())
