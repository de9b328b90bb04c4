"""``looplab check`` on real sockets: the server's process, the peers' process, and /proc.

Three processes take part: the server (an in-process app in ``bench.check.appside``,
``AppChild``, or the user's command, ``CommandServer``), the peers
(``bench.peers.PeerProcess`` running ``check_client`` roles: blocking sockets, the
ground truth) and this one, which orchestrates and reads the server's resident memory
from ``/proc`` every 50 ms (``RealRig``). Everything started here is stopped and reaped
by ``RealRig.close()`` -- a SIGTERM, a grace period, then SIGKILL to the process group
of a command -- whatever happened before.

``RealRig`` and ``bench.check.sim.SimRig`` offer the same operations
(``run_clients``, ``shutdown_run``, ``mark``, ``samples``, ``dead``), so the questions
(``bench.check.questions``) are asked the same way on both networks.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time

from bench.check import roles as rolemod
from bench.check import target as tg
from bench.host import procs
from bench.peers import PeerError, PeerProcess

__all__ = ["AppChild", "CommandServer", "RealRig", "StartFailed", "free_port", "port_free"]


class StartFailed(Exception):
    """The server never served: a user mistake the verb reports in one line (exit 2)."""


def free_port() -> int:
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
    finally:
        s.close()


def port_free(port: int) -> bool:
    s = socket.socket()
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:240] if lines else ""


class _Server:
    """What both kinds of server share: the process, its stderr in a file, its fate."""
    proc: subprocess.Popen
    address: tuple

    def __init__(self):
        self._err = tempfile.TemporaryFile()
        self.proc = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stderr_bytes(self) -> bytes:
        self._err.seek(0)
        return self._err.read()

    def stderr(self) -> str:
        return self.stderr_bytes().decode("utf-8", "replace")

    def death(self) -> str:
        """Why the process is gone: its exit code or signal, and its stderr's last line."""
        rc = self.proc.poll()
        how = (f"killed by signal {-rc}" if rc is not None and rc < 0 else f"exit code {rc}")
        tail = _last_line(self.stderr())
        return f"the server died ({how})" + (f": {tail}" if tail else "")

    def signal(self, sig=signal.SIGTERM) -> None:
        if self.alive():
            self.proc.send_signal(sig)

    def wait(self, timeout_s: float):
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def close(self) -> None:
        if self.proc is not None:
            procs.stop(self.proc, grace_s=3.0)
            self._kill_group()
        self._err.close()

    def _kill_group(self) -> None:
        pass


class AppChild(_Server):
    """An in-process app in ``python -m bench.check.appside``: it reports where it
    listens, its transports' buffers every 50 ms, its queues when asked."""

    def __init__(self, app: tg.AppRef, loop: tg.LoopChoice, knobs: dict, grace_s: float,
                 port: int = 0, sockbuf: int | None = 65536, start_timeout_s: float = 20.0):
        super().__init__()
        spec = {"app": app.to_data(), "loop": loop.to_data(), "knobs": knobs,
                "grace_s": grace_s, "port": port, "sockbuf": sockbuf}
        self.samples: list[dict] = []
        self.events: list[dict] = []
        self._cond = threading.Condition()
        self._scans: list[dict] = []
        cwd = os.getcwd()
        env = procs.child_env({"PYTHONPATH": procs.ROOT + os.pathsep + cwd
                               + (os.pathsep + os.environ["PYTHONPATH"]
                                  if os.environ.get("PYTHONPATH") else "")})
        self.proc = procs.spawn(procs.python_command("bench.check.appside", json.dumps(spec)),
                                stdin=subprocess.PIPE, stderr=self._err, cwd=cwd, env=env)
        self._reader = threading.Thread(target=self._read, name="check-app-events", daemon=True)
        self._reader.start()
        ev = self._wait(lambda: next((e for e in self.events if e["event"] in
                                      ("listening", "error")), None), start_timeout_s)
        if ev is None or ev["event"] == "error":
            why = (ev or {}).get("error") or (self.death() if not self.alive() else
                                              f"no answer within {start_timeout_s:g} s")
            self.close()
            raise StartFailed(f"the app did not start: {why}")
        self.address = tuple(ev["addr"])
        self.kind = ev["kind"]

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            with self._cond:
                if ev["event"] == "sample":
                    self.samples.append(ev)
                elif ev["event"] == "scan":
                    self._scans.append(ev)
                else:
                    self.events.append(ev)
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def _wait(self, ready, timeout_s: float):
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                got = ready()
                if got is not None:
                    return got
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    return ready()
                self._cond.wait(min(left, 0.1))

    def scan(self, timeout_s: float = 5.0) -> dict | None:
        with self._cond:
            have = len(self._scans)
        try:
            self.proc.stdin.write(b"scan\n")
            self.proc.stdin.flush()
        except OSError:
            return None
        return self._wait(lambda: self._scans[have] if len(self._scans) > have else None,
                          timeout_s)

    def event(self, name: str):
        with self._cond:
            return next((e for e in self.events if e["event"] == name), None)

    def close(self) -> None:
        if self.proc is not None and self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        super().close()
        self._reader.join(5.0)


class CommandServer(_Server):
    """The user's server command, ``{port}`` replaced; listening is seen by connecting.
    It runs in a session of its own, so whatever it starts is ended with it."""

    def __init__(self, command: tg.Command, port: int, start_timeout_s: float = 10.0):
        super().__init__()
        self.kind = "command"
        self.samples: list[dict] = []
        self.address = ("127.0.0.1", port)
        argv = command.render(port)
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                         stdout=self._err, stderr=self._err,
                                         start_new_session=True)
        except OSError as exc:
            self._err.close()
            raise StartFailed(f"cannot run {argv[0]!r}: {exc.strerror or exc}") from None
        deadline = time.monotonic() + start_timeout_s
        while True:
            if not self.alive():
                why = self.death()
                self.close()
                raise StartFailed(f"the command ended before it listened on 127.0.0.1:{port} "
                                  + why.removeprefix("the server died "))
            try:
                socket.create_connection(self.address, timeout=0.5).close()
                return
            except OSError:
                pass
            if time.monotonic() >= deadline:
                self.close()
                raise StartFailed(f"the command did not listen on 127.0.0.1:{port} within "
                                  f"{start_timeout_s:g} s (does it use {{port}}?)")
            time.sleep(0.05)

    def scan(self, timeout_s: float = 0.0):
        return None

    def event(self, name: str):
        return None

    def _kill_group(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, OSError):
            pass


class RealRig:
    """The questions' operations on real sockets (see the module docstring)."""
    net = "real"

    def __init__(self, server: _Server):
        self.server = server
        self.address = server.address
        # an in-process app's accepted sockets have pinned buffers; a command's grow freely
        self.pinned = not isinstance(server, CommandServer)
        self.rss: list[tuple] = []          # (t, bytes)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="check-rss", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            rss = procs.rss_bytes(self.server.pid)
            if rss is not None:
                self.rss.append((time.monotonic(), rss))
            self._stop.wait(0.05)

    def now(self) -> float:
        return time.monotonic()

    def dead(self) -> str | None:
        return None if self.server.alive() else self.server.death()

    def memory(self, t0: float, t1: float) -> list[tuple]:
        """(t, bytes) of the server's RSS between t0 and t1."""
        return [(t, v) for t, v in list(self.rss) if t0 <= t <= t1]

    def buffered(self, t0: float, t1: float) -> list[dict]:
        return [s for s in list(self.server.samples) if t0 <= s["t"] <= t1]

    def mark(self) -> dict:
        """The memory now: RSS (and, in-process, transports and queues)."""
        out = {"t": time.monotonic(), "memory_bytes": procs.rss_bytes(self.server.pid),
               "memory_kind": "rss"}
        scan = self.server.scan()
        if scan:
            out.update({k: v for k, v in scan.items() if k not in ("event", "t")})
        return out

    def _specs(self, specs):
        return [dict(s, connect=list(self.address)) for s in specs]

    def run_clients(self, specs: list[dict], bound_s: float, mark_after_s=None) -> dict:
        """Run the roles against the server at once; their results once all ended.
        ``mark_after_s``: also ``mark()`` that long after they start (``"mark"`` in
        the answer)."""
        marks = []
        timer = threading.Timer(mark_after_s, lambda: marks.append(self.mark())) \
            if mark_after_s is not None else None
        try:
            with PeerProcess(self._specs(specs), timeout_s=bound_s) as peers:
                if timer is not None:
                    timer.start()
                out = peers.results()
        except PeerError as exc:
            out = {s["name"]: {"name": s["name"], "ended": "error", "error": str(exc)[:300],
                               "connected": False} for s in specs}
        finally:
            if timer is not None:
                timer.cancel()
                timer.join()
        if marks:
            out["mark"] = marks[0]
        return out

    def shutdown_run(self, spec: dict, stop_after_s: float, grace_s: float) -> tuple[dict, dict]:
        """One client in flight; ``stop_after_s`` after it started, SIGTERM; wait
        ``grace_s`` for the server to exit (then SIGKILL). (its result, the stop)."""
        stop = {"sent_at": None, "exited": None, "exit_code": None, "stop_s": None}
        bound = stop_after_s + grace_s + 10.0
        with PeerProcess(self._specs([spec]), timeout_s=bound) as peers:
            time.sleep(stop_after_s)
            stop["sent_at"] = time.monotonic()
            self.server.signal(signal.SIGTERM)
            rc = self.server.wait(grace_s)
            stop["stop_s"] = time.monotonic() - stop["sent_at"]
            stop["exited"] = rc is not None
            stop["exit_code"] = rc
            ev = self.server.event("stopped")
            if ev:
                stop["note"] = ev.get("note")
            if rc is None:
                self.server.signal(signal.SIGKILL)
                self.server.wait(5.0)
            try:
                result = peers.results()[spec["name"]]
            except PeerError as exc:
                result = {"name": spec["name"], "ended": "error", "error": str(exc)[:300]}
        return result, stop

    def faults(self, endpoint: tg.Endpoint, names: list, limits, settle_s: float, log=None):
        """``looplab faults``' matrix (bench.verbs.faults.run_matrix) against the server,
        with a healthy client of ``endpoint``."""
        from bench.verbs import faults as faultverb
        # Judged by what the server does (serves, keeps its fds), not by what it logs: a
        # framework logs a traceback for every client that resets mid-response.
        watch = faultverb.Watch(self.server.pid)
        health = _healthy_client(endpoint)
        seen = len(self.server.stderr_bytes())
        out = faultverb.run_matrix(self.address, "raw", names, limits, 1, watch,
                                   settle_s=settle_s, log=log, healthy=health)
        out["tracebacks_count"] = len(faultverb._TRACEBACK.findall(self.server.stderr_bytes()[seen:]))
        return out

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2.0)
        self.server.close()


def _healthy_client(endpoint: tg.Endpoint):
    """A healthy client for the fault matrix, with ``bench.peers.faults.healthy``'s
    signature: one request of ``endpoint`` on a plain socket; served when the answer
    starts right (HTTP 2xx, a 101 upgrade, any byte of a raw answer)."""
    from bench.peers import faults as faultpeers
    request = rolemod.request_bytes(endpoint.kind, endpoint.target)

    def healthy(app, addr, limits, upstream=None, seed=0):
        t0 = time.monotonic()
        deadline = t0 + limits.health_timeout_s
        try:
            s = socket.create_connection(addr, timeout=limits.health_timeout_s)
        except ConnectionRefusedError:
            return faultpeers.Health(False, time.monotonic() - t0, "connection refused", refused=True)
        except OSError as exc:
            return faultpeers.Health(False, time.monotonic() - t0, f"connect failed: {exc}",
                                     timed_out=True)
        got = b""
        try:
            s.sendall(request)
            while time.monotonic() < deadline:
                s.settimeout(max(0.01, deadline - time.monotonic()))
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
                if endpoint.kind == "raw" or b"\r\n\r\n" in got:
                    break
        except socket.timeout:
            pass
        except OSError as exc:
            return faultpeers.Health(False, time.monotonic() - t0, f"{type(exc).__name__}: {exc}")
        finally:
            s.close()
        took = time.monotonic() - t0
        if not got:
            timed = took >= limits.health_timeout_s
            return faultpeers.Health(False, took, "no answer" + (
                f" within {limits.health_timeout_s:g} s" if timed else " (closed)"), timed_out=timed)
        if endpoint.kind != "raw":
            status = got.split(b"\r\n", 1)[0].split(b" ")
            code = int(status[1]) if len(status) > 1 and status[1].isdigit() else None
            if code is None or not (200 <= code < 300 or code == 101):
                return faultpeers.Health(False, took, f"answered {got[:40]!r}")
        return faultpeers.Health(True, took)
    return healthy
