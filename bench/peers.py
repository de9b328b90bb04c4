"""Measurement peers: the ground truth of every scenario, in a process of their own.

A scenario never believes the kernel under test about what it did. Whatever a
kernel's probe says it wrote, the number that goes into a verdict is what a
*peer* counted on the other end of the socket: a plain blocking socket, in
another process, that counts every byte, checks frame order, timestamps
arrivals and records how its stream ended -- "eof" (a FIN), "reset" (an RST) or
"timeout" (its own hard bound ran out first).

Why a process and why blocking sockets: the peers must not share the kernel's
GIL, CPU accounting or RSS, and they must not have an event loop of their own
whose buffering could hide the very effect we measure. A blocking ``send()``
returns when the OS took the bytes and a blocking ``recv()`` returns what the OS
delivered; there is nothing in between. Each role runs in a thread of ONE child
process (``python -m bench.peers``), so a scenario with a source and a sink
costs one interpreter start, and roles that must be concurrent (a healthy and a
stalled push client) are. The price: roles share that process's GIL. At the
rates the scenarios use (a few MB/s, 32 KiB frames) a role spends its time in
the kernel, not in Python; for throughput benchmarks where the peer itself
could be the bottleneck, use one PeerProcess per role.

The parent side is ``PeerProcess``::

    with PeerProcess(spec, timeout_s=30) as peers:
        addr = peers.address("sink")        # blocks until that role listens
        peers.start("source", connect=addr) # a deferred role, fields may be set now
        results = peers.results()           # {name: result dict} once all roles ended

Leaving the block always ends the child (stdin closed, then terminate, then
kill) and reaps it; the parent's reader thread and pipes are closed: no orphan,
no leaked fd. If the parent dies without cleaning up, the child sees EOF on its
stdin and exits at once; a terminal Ctrl-C reaches the child too, which dies
silently (default SIGINT action) while the parent's ``__exit__`` reaps it.

The wire between them is JSON lines. The spec goes in argv (``-`` means: the
first line of stdin); the child prints ``{"event": "listening", "name", "addr"}``,
``{"event": "result", "name", "result"}``, and ``{"event": "done"}`` when every
role has reported; the parent writes ``{"start": name, ...fields}`` lines to
start deferred roles. Anything else the child has to say goes to stderr, which
the parent keeps (the tail) for its error messages.

Clocks and bounds. Every role has ``max_s``, a hard bound counted from the
moment the role starts (including the wait for a connection); when it runs out
the role closes its socket and reports ``ended="timeout"``. Times *inside* a
result (``series``, ``eof_after_s``, ``start_after_s``) are counted from the
moment the connection was established, because that is the moment the other
side can start talking -- a listener may wait a long time before anybody
connects. All waits use ``time.monotonic()``, which on Linux is one clock for
the whole machine, so a frame's send timestamp from another process compares
with our arrival time.

Exact counts despite timeouts. Sockets run with a short timeout (``_TICK``) so
a role can notice its deadline, never with ``sendall``: a ``sendall`` that times
out has sent an unknown part of its buffer. Roles send with a loop of ``send()``
calls instead, so ``sent_bytes`` is always what the OS accepted, to the byte.

Result vocabulary (every role): ``name``, ``role``, ``ended`` -- "eof" (the peer
half-closed), "reset" (the peer reset, or a send hit EPIPE/ECONNRESET),
"timeout" (``max_s``), "closed" (we closed as planned), "reset_sent" (we reset
as planned), "error" (with ``error``: a refused connection and the like, never
a traceback for an expected network condition) -- plus ``connected``,
``connected_at`` (the ``time.monotonic()`` of the connection: add it to a
series' t to line roles or processes up), ``connected_after_s``,
``sockbuf_effective`` ([SO_SNDBUF, SO_RCVBUF] as the kernel granted them:
Linux doubles the request), ``sent_bytes``, ``received_bytes``, ``ran_s`` and
``series``: [[t_s, cumulative_bytes], ...] every ~50 ms of the role's main
counter (received for readers, sent for writers).
"""
from __future__ import annotations

import json
import math
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback

__all__ = ["PeerProcess", "PeerError", "PeerTimeout", "ROLES", "check_spec", "check_role",
           "role", "sink", "source", "reader", "pipeline_client", "push_client", "echo_client",
           "reset_peer", "main"]

_TICK = 0.05                 # socket timeout and series sampling period
_MAX_CHUNK = 64 * 1024 * 1024  # largest recv/chunk size a spec may ask for
_FRAME_HEADER_BYTES = 24     # protocols.cores.FRAME_HEADER_BYTES, checked without importing it
_STDERR_KEEP = 64 * 1024     # the parent keeps this much of the child's stderr
_GRACE_S = 3.0               # how much longer than timeout_s the parent waits for results


class PeerError(RuntimeError):
    """The peer process failed: it died, or reported something it should not."""


class PeerTimeout(PeerError, TimeoutError):
    """A wait on the peer process ran out of time."""


# ---------------------------------------------------------------------------
# The spec: roles, their fields, and the checks both sides run.
#
# One table says which fields a role takes and their defaults; one table says
# what a field may hold. The parent checks the spec before it spawns anything
# (a typo is a ValueError in the caller's frame, not a dead child), and the
# child checks again (``python -m bench.peers`` is usable on its own).

_REQUIRED = object()   # marks a field a role cannot run without (may come at start)

_COMMON = {"name": None, "role": None, "listen": None, "connect": None, "sockbuf": None,
           "max_s": None, "deferred": False}

ROLES: dict[str, dict] = {
    "sink": {"rate_Bps": None, "recv_bytes": 65536, "frame_bytes": None, "verify": False,
             "start_after_s": 0.0, "stall_at_s": 0.0, "stall_s": 0.0,
             "pause_at_bytes": None, "pause_s": 0.0, "close_with_reset": False,
             "warmup_s": 1.0},
    "source": {"rate_Bps": None, "frame_bytes": 32768, "duration_s": None, "total_bytes": None,
               "finish": "close", "eof_wait_s": 5.0, "warmup_s": 1.0, "recv_bytes": 65536},
    "pipeline_client": {"count": _REQUIRED, "hold_s": 1.0},
    "push_client": {"mode": _REQUIRED, "duration_s": _REQUIRED, "recv_bytes": 65536},
    "echo_client": {"total_bytes": _REQUIRED, "chunk_bytes": 16384, "recv_bytes": 65536,
                    "shutdown": True, "eof_wait_s": 0.5},
    "reset_peer": {"after_bytes": None, "after_s": None, "recv_bytes": 65536},
    "reader": {"start_after_s": 0.0, "recv_bytes": 65536, "rate_Bps": None, "warmup_s": 1.0},
}
"""Role name -> {field: default} (beyond the common fields ``name``, ``role``,
``listen``, ``connect``, ``sockbuf``, ``max_s``, ``deferred``)."""


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _addr(field, v):
    """None, "host:port", or [host, port] / (host, port) -> [host, port]."""
    if v is None:
        return None
    if isinstance(v, str):
        host, sep, port = v.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"{field}: bad address {v!r}, expected 'HOST:PORT'")
        v = [host, int(port)]
    if not isinstance(v, (list, tuple)) or len(v) != 2:
        raise TypeError(f"{field}: an address is 'HOST:PORT' or (host, port), got {v!r}")
    host, port = v
    if not isinstance(host, str) or not host:
        raise TypeError(f"{field}: host must be a non-empty str, got {host!r}")
    if not _is_int(port) or not 0 <= port <= 65535:
        raise ValueError(f"{field}: port must be an int in 0..65535, got {port!r}")
    return [host, port]


def _int_check(low, optional):
    def check(field, v):
        if v is None and optional:
            return None
        if not _is_int(v):
            raise TypeError(f"{field} must be an int{' or None' if optional else ''}, got {v!r}")
        if v < low:
            raise ValueError(f"{field} must be >= {low}, got {v}")
        if low > 0 and v > _MAX_CHUNK:
            raise ValueError(f"{field} must be <= {_MAX_CHUNK}, got {v}")
        return v
    return check


def _seconds_check(positive, optional):
    def check(field, v):
        if v is None and optional:
            return None
        if not _is_num(v):
            raise TypeError(f"{field} must be a number of seconds{' or None' if optional else ''}, "
                            f"got {v!r}")
        if not math.isfinite(v) or v < 0 or (positive and v == 0):
            raise ValueError(f"{field} must be {'> 0' if positive else '>= 0'} and finite, got {v}")
        return float(v)
    return check


def _rate(field, v):
    if v is None:
        return None
    if not _is_num(v):
        raise TypeError(f"{field} must be bytes per second or None, got {v!r}")
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{field} must be > 0 and finite (None: unlimited), got {v}")
    return float(v)


def _bool(field, v):
    if not isinstance(v, bool):
        raise TypeError(f"{field} must be True or False, got {v!r}")
    return v


def _choice(*values):
    def check(field, v):
        if v not in values:
            raise ValueError(f"{field} must be one of {', '.join(map(repr, values))}, got {v!r}")
        return v
    return check


def _name(field, v):
    if not isinstance(v, str) or not v:
        raise TypeError(f"{field} must be a non-empty str, got {v!r}")
    return v


_FIELD_CHECKS = {
    "name": _name, "role": _name, "listen": _addr, "connect": _addr,
    "sockbuf": _int_check(1, True), "max_s": _seconds_check(True, False),
    "deferred": _bool, "rate_Bps": _rate,
    "recv_bytes": _int_check(1, False), "chunk_bytes": _int_check(1, False),
    "frame_bytes": _int_check(_FRAME_HEADER_BYTES, True), "verify": _bool,
    "start_after_s": _seconds_check(False, False), "stall_at_s": _seconds_check(False, False),
    "stall_s": _seconds_check(False, False), "pause_at_bytes": _int_check(0, True),
    "pause_s": _seconds_check(False, False), "close_with_reset": _bool,
    "duration_s": _seconds_check(True, True), "total_bytes": _int_check(0, True),
    "finish": _choice("shutdown", "close", "reset"), "eof_wait_s": _seconds_check(False, False),
    "warmup_s": _seconds_check(False, False), "count": _int_check(0, False),
    "hold_s": _seconds_check(False, False), "mode": _choice("healthy", "stalled"),
    "shutdown": _bool, "after_bytes": _int_check(0, True), "after_s": _seconds_check(False, True),
}


def check_role(cfg, default_max_s: float = 30.0, starting: bool = False) -> dict:
    """Check one role's spec and return it normalized: every field present,
    defaults filled in, addresses as [host, port], seconds as floats.

    Unknown roles and fields are ValueErrors that list the valid ones; a value
    of the wrong type is a TypeError, out of range a ValueError. A deferred role
    may leave its endpoint and required fields to ``start()``; ``starting=True``
    (or a role that is not deferred) demands them.
    """
    if not isinstance(cfg, dict):
        raise TypeError(f"a role spec is a dict, got {type(cfg).__name__}")
    role = cfg.get("role")
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; valid roles: {', '.join(ROLES)}")
    fields = {**_COMMON, **ROLES[role]}
    unknown = sorted(set(cfg) - set(fields))
    if unknown:
        raise ValueError(f"role {role!r} has no field {', '.join(map(repr, unknown))}; "
                         f"valid fields: {', '.join(sorted(fields))}")
    out = {}
    for field, default in fields.items():
        v = cfg.get(field, default)
        if field == "name" and v is None:
            v = role
        if field == "max_s" and v is None:
            v = default_max_s
        if v is _REQUIRED:
            out[field] = None
            continue
        out[field] = _FIELD_CHECKS[field](field, v)
    name = out["name"]
    if out["listen"] is not None and out["connect"] is not None:
        raise ValueError(f"role {name!r}: give either listen or connect, not both")
    if out["deferred"] and not starting:
        return out
    # From here on the role is about to run: everything it needs must be there.
    if out["listen"] is None and out["connect"] is None:
        raise ValueError(f"role {name!r} needs listen='HOST:PORT' or connect=(host, port)")
    missing = [f for f, d in fields.items() if d is _REQUIRED and out[f] is None]
    if missing:
        raise ValueError(f"role {name!r} ({role}) needs {', '.join(missing)}")
    if role == "source":
        if out["duration_s"] is None and out["total_bytes"] is None:
            raise ValueError(f"role {name!r}: a source needs duration_s or total_bytes")
        total, frame = out["total_bytes"], out["frame_bytes"]
        if frame is None:
            raise ValueError(f"role {name!r}: a source needs frame_bytes")
        if total is not None and 0 < total % frame < _FRAME_HEADER_BYTES:
            raise ValueError(f"role {name!r}: total_bytes={total} would end with a "
                             f"{total % frame}-byte frame, shorter than the "
                             f"{_FRAME_HEADER_BYTES}-byte frame header")
    if out.get("pause_at_bytes") is not None and not out["pause_s"] > 0:
        raise ValueError(f"role {name!r}: pause_at_bytes needs pause_s > 0")
    return out


def check_spec(spec, default_max_s: float = 30.0) -> list[dict]:
    """Check a whole spec (a list of role dicts) and return it normalized;
    names must be unique. See ``check_role``."""
    if isinstance(spec, (str, bytes, dict)) or not isinstance(spec, (list, tuple)):
        raise TypeError(f"a peer spec is a list of role dicts, got {type(spec).__name__}")
    if not spec:
        raise ValueError("a peer spec needs at least one role")
    roles = [check_role(cfg, default_max_s) for cfg in spec]
    seen = set()
    for r in roles:
        if r["name"] in seen:
            raise ValueError(f"two roles are named {r['name']!r}; names must be unique")
        seen.add(r["name"])
    return roles


# ---------------------------------------------------------------------------
# The roles as public building blocks: ``peers.sink(rate_Bps=1e6, listen=...)``
# returns the role's spec dict (checked when a PeerProcess starts). A scenario's
# ``serve_app`` also accepts ``connect=bench.scenario.APP``: "connect to the app".

def role(kind: str, name: str | None = None, **fields) -> dict:
    """A role spec of ``kind`` (one of ROLES) named ``name`` (default: the kind).
    Listening roles default to ``listen="127.0.0.1:0"``."""
    if kind not in ROLES:
        raise ValueError(f"unknown role {kind!r}; valid roles: {', '.join(ROLES)}")
    if "connect" not in fields and "listen" not in fields and kind in _LISTENERS:
        fields["listen"] = "127.0.0.1:0"
    return {"name": name or kind, "role": kind, **fields}


_LISTENERS = ("sink", "reader")


def sink(name: str = "sink", **fields) -> dict:
    """Counts and timestamps what arrives, optionally rate limited (``rate_Bps``)."""
    return role("sink", name, **fields)


def source(name: str = "source", **fields) -> dict:
    """Sends framed data at ``rate_Bps`` for ``duration_s`` or ``total_bytes``."""
    return role("source", name, **fields)


def reader(name: str = "reader", **fields) -> dict:
    """Reads everything until EOF, starting after ``start_after_s``, optionally rate limited."""
    return role("reader", name, **fields)


def pipeline_client(name: str = "client", **fields) -> dict:
    """Sends ``count`` tiny requests at once and never reads for ``hold_s``."""
    return role("pipeline_client", name, **fields)


def push_client(name: str = "client", **fields) -> dict:
    """A push subscriber: ``mode="healthy"`` reads, ``"stalled"`` never does."""
    return role("push_client", name, **fields)


def echo_client(name: str = "client", **fields) -> dict:
    """Sends ``total_bytes`` and checks the echo byte for byte."""
    return role("echo_client", name, **fields)


def reset_peer(name: str = "reset", **fields) -> dict:
    """Resets its connection after ``after_bytes`` or ``after_s``."""
    return role("reset_peer", name, **fields)


# ---------------------------------------------------------------------------
# The parent side.

class PeerProcess:
    """Run a spec's roles in one child process and collect what they measured.

    Contract: ``with PeerProcess(spec, timeout_s) as peers`` spawns the child
    (the spec is checked first: bad input raises here, before any process
    exists). Non-deferred roles start at once. ``address(name)`` waits until a
    listening role listens; ``start(name, **fields)`` starts a deferred role;
    ``result(name)`` / ``results()`` wait for roles to end. Leaving the block
    ends and reaps the child, joins the reader thread and closes the pipes,
    whatever state the roles are in.

    ``timeout_s`` bounds the whole run: every wait gives up at
    ``timeout_s`` (+ a few seconds' grace) after the spawn with ``PeerTimeout``,
    the child exits by itself shortly after, and a role's ``max_s`` defaults to
    it. A child that dies early makes every wait raise ``PeerError`` with the
    tail of its stderr.

    Hazard: a role's ``max_s`` counts from when *it* starts, so a deferred role
    started late can outlive ``timeout_s``; the process bound wins.
    """

    def __init__(self, spec, timeout_s: float = 30.0, python: str | None = None):
        self.timeout_s = _seconds_check(True, False)("timeout_s", timeout_s)
        self.roles = check_spec(spec, default_max_s=self.timeout_s)
        self._by_name = {r["name"]: r for r in self.roles}
        self._python = python or sys.executable
        self._proc: subprocess.Popen | None = None
        self._pump_thread: threading.Thread | None = None
        self._cond = threading.Condition()
        self._listening: dict[str, tuple] = {}
        self._results: dict[str, dict] = {}
        self._errors: list[str] = []
        self._stderr = bytearray()
        self._eof = False                  # the child's stdout closed: it is gone
        self._started = {r["name"] for r in self.roles if not r["deferred"]}
        self._deadline = math.inf

    # -- lifecycle --------------------------------------------------------

    def __enter__(self) -> "PeerProcess":
        self.open()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self) -> None:
        """Spawn the child. Called by ``__enter__``; once only."""
        if self._proc is not None:
            raise RuntimeError("PeerProcess.open() called twice")
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        doc = json.dumps({"timeout_s": self.timeout_s, "roles": self.roles})
        self._deadline = time.monotonic() + self.timeout_s + _GRACE_S
        self._proc = subprocess.Popen(
            [self._python, "-m", "bench.peers", doc], cwd=root, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self._pump_thread = threading.Thread(target=self._pump, name="peers-reader", daemon=True)
        self._pump_thread.start()

    def close(self) -> None:
        """End the child (stdin EOF, then SIGTERM, then SIGKILL), reap it,
        join the reader thread, close the pipes. Idempotent."""
        proc = self._proc
        if proc is None or proc.stdin is None:
            return
        try:
            try:
                proc.stdin.close()         # the child exits at once on stdin EOF
            except OSError:
                pass
            try:
                proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                proc.terminate()
                try:
                    proc.wait(timeout=1.0)
                except subprocess.TimeoutExpired:
                    pass
        finally:
            # Even if a second Ctrl-C lands in the waits above: never an orphan.
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if self._pump_thread is not None:
                self._pump_thread.join(timeout=5.0)
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
            proc.stdin = None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    @property
    def stderr(self) -> str:
        """What the child wrote on stderr (the last 64 KiB): empty when all went well."""
        with self._cond:
            return self._stderr.decode("utf-8", "replace")

    # -- the reader thread --------------------------------------------------

    def _pump(self) -> None:
        """Read the child's stdout (events) and stderr (kept) until both close."""
        proc = self._proc
        kinds = {proc.stdout.fileno(): "out", proc.stderr.fileno(): "err"}
        poller = select.poll()
        for fd in kinds:
            poller.register(fd, select.POLLIN)
        partial = b""
        try:
            while kinds:
                for fd, _ in poller.poll():
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        poller.unregister(fd)
                        del kinds[fd]
                    elif kinds[fd] == "err":
                        self._keep_stderr(chunk)
                    else:
                        lines = (partial + chunk).split(b"\n")
                        partial = lines.pop()
                        for line in lines:
                            self._on_line(line)
        finally:
            with self._cond:
                self._eof = True
                self._cond.notify_all()

    def _keep_stderr(self, chunk: bytes) -> None:
        with self._cond:
            self._stderr += chunk
            del self._stderr[:-_STDERR_KEEP]

    def _on_line(self, line: bytes) -> None:
        try:
            event = json.loads(line)
            kind = event["event"]
        except (ValueError, TypeError, KeyError):
            self._keep_stderr(b"[stray stdout] " + line + b"\n")
            return
        with self._cond:
            if kind == "listening":
                self._listening[event["name"]] = tuple(event["addr"])
            elif kind == "result":
                self._results[event["name"]] = event["result"]
            elif kind == "error":
                self._errors.append(str(event.get("error")))
            self._cond.notify_all()

    # -- waiting -------------------------------------------------------------

    def _tail(self) -> str:
        text = self._stderr.decode("utf-8", "replace").strip()
        errors = "; ".join(self._errors)
        out = ""
        if errors:
            out += f"; peer errors: {errors}"
        if text:
            out += f"; peer stderr (tail):\n{text[-2000:]}"
        return out

    def _wait(self, ready, what: str, timeout: float | None):
        """Wait (under the lock) until ``ready()`` returns non-None; raise
        PeerError if the child is gone first, PeerTimeout past the bound."""
        if self._proc is None:
            raise RuntimeError("the peer process is not running: use 'with PeerProcess(...)'")
        limit = self._deadline
        if timeout is not None:
            limit = min(limit, time.monotonic() + _seconds_check(False, False)("timeout", timeout))
        with self._cond:
            while True:
                value = ready()
                if value is not None:
                    return value
                if self._eof:
                    code = self._proc.poll()
                    if code is None:
                        try:
                            code = self._proc.wait(timeout=1.0)
                        except subprocess.TimeoutExpired:
                            pass
                    raise PeerError(f"the peer process exited (code {code}) before {what}"
                                    + self._tail())
                left = limit - time.monotonic()
                if left <= 0:
                    raise PeerTimeout(f"timed out waiting for {what}" + self._tail())
                self._cond.wait(left)

    def _role(self, name: str) -> dict:
        try:
            return self._by_name[name]
        except (KeyError, TypeError):
            raise ValueError(f"no role named {name!r}; roles: {', '.join(self._by_name)}") from None

    def address(self, name: str, timeout: float | None = None) -> tuple[str, int]:
        """(host, port) where role ``name`` listens; blocks until it does."""
        role = self._role(name)
        if name not in self._started:
            raise ValueError(f"role {name!r} is deferred and not started: start() it first")
        if role["listen"] is None:
            raise ValueError(f"role {name!r} connects, it does not listen")

        def ready():
            if name in self._listening:
                return self._listening[name]
            if name in self._results:
                res = self._results[name]
                raise PeerError(f"role {name!r} ended without listening: "
                                f"{res.get('error') or res.get('ended')}")
            return None
        host, port = self._wait(ready, f"role {name!r} to listen", timeout)
        return host, port

    def start(self, name: str, **fields) -> None:
        """Start deferred role ``name``, setting ``fields`` first (e.g.
        ``connect=addr``). Bad fields raise here, as for the spec."""
        role = self._role(name)
        if name in self._started:
            raise ValueError(f"role {name!r} was already started"
                             + ("" if role["deferred"] else " (it is not deferred)"))
        for fixed in ("name", "role", "deferred"):
            if fixed in fields:
                raise ValueError(f"start() cannot change {fixed!r}")
        merged = check_role({**role, **fields, "deferred": False}, self.timeout_s, starting=True)
        if self._proc is None or self._proc.stdin is None:
            raise RuntimeError("the peer process is not running: use 'with PeerProcess(...)'")
        line = json.dumps({"start": name, **{k: merged[k] for k in fields}}) + "\n"
        try:
            self._proc.stdin.write(line.encode())
            self._proc.stdin.flush()
        except OSError as e:
            raise PeerError(f"cannot start role {name!r}: the peer process is gone ({e})"
                            + self._tail()) from None
        self._started.add(name)
        self._by_name[name] = merged

    def result(self, name: str, timeout: float | None = None) -> dict:
        """Role ``name``'s result, once it has ended."""
        self._role(name)
        if name not in self._started:
            raise PeerError(f"role {name!r} is deferred and was never started")
        return self._wait(lambda: self._results.get(name), f"the result of role {name!r}", timeout)

    def results(self, timeout: float | None = None) -> dict[str, dict]:
        """{name: result} for every role, once all have ended."""
        never = [n for n in self._by_name if n not in self._started]
        if never:
            raise PeerError(f"deferred roles never started: {', '.join(never)}")

        def ready():
            if len(self._results) == len(self._by_name):
                return {n: self._results[n] for n in self._by_name}
            return None
        try:
            return self._wait(ready, "all roles to end", timeout)
        except PeerError as e:
            with self._cond:
                waiting = ", ".join(n for n in self._by_name if n not in self._results)
            raise type(e)(f"{e} (still running: {waiting})") from None


# ---------------------------------------------------------------------------
# The child side: one _Run per role, in its own thread.

class _Ended(Exception):
    """The stream ended (``how``: "eof", "reset", "timeout"); unwinds a role."""

    def __init__(self, how: str):
        super().__init__(how)
        self.how = how


_RESETS = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


class _Run:
    """One role's life: its config, its clock and deadline, its sockets, its
    counters and its result. The role functions below are written against
    these few primitives, which own the error mapping: a peer reset is
    ``_Ended("reset")`` wherever it surfaces, the role's deadline is
    ``_Ended("timeout")``, and counts stay exact across both."""

    def __init__(self, cfg: dict, emit):
        self.cfg = cfg
        self.name = cfg["name"]
        self.emit = emit
        self.began = time.monotonic()
        self.deadline = self.began + cfg["max_s"]
        self.t0: float | None = None        # when the connection was established
        self.sent = 0
        self.received = 0
        self.tracked = "received"           # which counter the series follows
        self.series: list[list] = []
        self._warm: tuple | None = None     # (t, received) when warmup_s had passed
        self._last_in: tuple | None = None  # (t, received) at the last byte in
        self._next_sample = 0.0
        self.socks: list[socket.socket] = []
        self.result: dict = {"name": self.name, "role": cfg["role"], "ended": None,
                             "connected": False}

    # -- connection -----------------------------------------------------------

    def _socket(self) -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socks.append(s)
        size = self.cfg["sockbuf"]
        if size:
            # Before listen/connect: the window scale is fixed in the handshake,
            # and an accepted socket inherits the listener's buffers.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)
        return s

    def open(self) -> socket.socket:
        """Listen and accept one connection, or connect; start the role's clock."""
        cfg = self.cfg
        s = self._socket()
        if cfg["listen"] is not None:
            host, port = cfg["listen"]
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
                s.listen(1)
            except OSError as e:
                raise OSError(e.errno, f"listen on {host}:{port}: {e.strerror or e}") from None
            addr = s.getsockname()[:2]
            self.result["listen"] = list(addr)
            self.emit({"event": "listening", "name": self.name, "addr": list(addr)})
            s.settimeout(_TICK)
            while True:
                try:
                    conn, _ = s.accept()
                    break
                except socket.timeout:
                    if time.monotonic() >= self.deadline:
                        raise _Ended("timeout") from None
            self.close(s)
            s = conn
            self.socks.append(s)
        else:
            host, port = cfg["connect"]
            s.settimeout(max(0.001, min(self.deadline - time.monotonic(), 10.0)))
            try:
                s.connect((host, port))
            except OSError as e:
                raise OSError(e.errno, f"connect to {host}:{port}: {e.strerror or e}") from None
        s.settimeout(_TICK)
        self.t0 = time.monotonic()
        self._next_sample = self.t0
        self.result.update(
            connected=True, connected_at=self.t0, connected_after_s=self.t0 - self.began,
            peer=list(s.getpeername()[:2]),
            sockbuf_effective=[s.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF),
                               s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)])
        return s

    def close(self, s: socket.socket, reset: bool = False) -> None:
        """Close ``s``; with ``reset`` the close sends an RST (SO_LINGER 0)."""
        if s in self.socks:
            self.socks.remove(s)
        try:
            if reset:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        s.close()

    def close_all(self) -> None:
        for s in list(self.socks):
            self.close(s)

    # -- time -----------------------------------------------------------------

    def sample(self, now: float, force: bool = False) -> None:
        """Add [t, counter] to the series if ~50 ms passed (or ``force``)."""
        if now >= self._next_sample or force:
            self.series.append([round(now - self.t0, 4), getattr(self, self.tracked)])
            self._next_sample = now + _TICK

    def sleep_until(self, t: float) -> None:
        """Sleep until monotonic ``t``, sampling meanwhile; ``_Ended("timeout")``
        if the role's deadline comes first."""
        while True:
            now = time.monotonic()
            if now >= t:
                return
            if now >= self.deadline:
                raise _Ended("timeout")
            if self.t0 is not None:
                self.sample(now)
            time.sleep(min(t - now, self.deadline - now, _TICK))

    # -- data -------------------------------------------------------------

    def count_in(self, n: int, now: float) -> None:
        """Count ``n`` bytes received at ``now`` (series, warm-up rate).

        The warm-up mark is taken *after* counting the read that crosses it,
        so the rate spans whole read-to-read intervals: marking before would
        count k reads over k-1 intervals and overstate a paced reader's rate
        by one read per window (6 % for 64 KiB reads at 1 MB/s over 1 s)."""
        self.received += n
        if self._warm is None and now - self.t0 >= self.cfg.get("warmup_s", math.inf):
            self._warm = (now, self.received)
        self._last_in = (now, self.received)
        self.sample(now)

    def rate_in_after_warmup(self) -> float | None:
        """Bytes/s received from ``warmup_s`` after connecting to the last
        byte; None if nothing came after the warm-up."""
        if self._warm is None or self._last_in[0] <= self._warm[0]:
            return None
        return (self._last_in[1] - self._warm[1]) / (self._last_in[0] - self._warm[0])

    def recv_into(self, s: socket.socket, view, until: float | None = None) -> int | None:
        """Block until some bytes arrive: their count, 0 at EOF, None once
        ``until`` passed (if before the deadline). Reset and the deadline raise
        ``_Ended``."""
        cut = until is not None and until < self.deadline
        limit = until if cut else self.deadline
        while True:
            # Checked before every call, not only when idle: a peer that keeps
            # sending would otherwise keep a reader past its bounds.
            if time.monotonic() >= limit:
                if cut:
                    return None
                raise _Ended("timeout")
            try:
                return s.recv_into(view)
            except socket.timeout:
                self.sample(time.monotonic())
            except _RESETS:
                raise _Ended("reset") from None

    def send_all(self, s: socket.socket, data, sample: bool = True) -> None:
        """Like ``sendall``, but ``self.sent`` counts every byte the OS took,
        also when the deadline (``_Ended("timeout")``) or a reset cuts it.
        ``sample=False`` for a sender beside a thread that owns the series."""
        view = memoryview(data)
        n, done = len(view), 0
        while done < n:
            if time.monotonic() >= self.deadline:
                raise _Ended("timeout")
            try:
                k = s.send(view[done:])
            except socket.timeout:
                if sample:
                    self.sample(time.monotonic())
                continue
            except _RESETS:
                raise _Ended("reset") from None
            done += k
            self.sent += k

    def hold(self, s: socket.socket, until: float) -> str | None:
        """Keep the connection open without reading a byte until ``until``.

        Returns None when held to the end, "eof"/"reset" when the peer ended
        the connection first. POLLRDHUP reports the peer's FIN without
        consuming data, so holding never opens the receive window; the FIN
        itself only arrives once everything before it fits, which is the
        truth of a client that never reads. Deadline: ``_Ended("timeout")``.
        """
        cut = until > self.deadline
        limit = self.deadline if cut else until
        rdhup = getattr(select, "POLLRDHUP", 0)
        poller = select.poll()
        poller.register(s, rdhup | select.POLLERR | select.POLLHUP)
        while True:
            now = time.monotonic()
            if now >= limit:
                if cut:
                    raise _Ended("timeout")
                return None
            self.sample(now)
            events = poller.poll(min(limit - now, _TICK) * 1000)
            if events:
                if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    return "reset"
                mask = events[0][1]
                if mask & (rdhup | select.POLLHUP):
                    return "eof"
                if mask & select.POLLERR:
                    return "reset"


def _unread_bytes(s: socket.socket) -> int | None:
    """Bytes waiting unread in ``s``'s receive queue (Linux FIONREAD), or None."""
    try:
        import fcntl
        import termios
        return struct.unpack("i", fcntl.ioctl(s.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]
    except (ImportError, OSError, AttributeError):
        return None


class _Bucket:
    """Token bucket for reads: on average ``rate`` bytes/s, and at most
    ``burst`` bytes of credit saved while the reader was waiting for data (a
    sink must not make up for an idle second in one gulp)."""
    __slots__ = ("per_byte", "burst_s", "due")

    def __init__(self, rate: float, burst: int, now: float):
        self.per_byte = 1.0 / rate
        self.burst_s = burst / rate
        self.due = now

    def charge(self, n: int, now: float) -> None:
        due = self.due
        if due < now - self.burst_s:
            due = now - self.burst_s
        self.due = due + n * self.per_byte


# -- the roles ------------------------------------------------------------
#
# Each role function fills run.result with its own fields; the common ones
# (counters, series, ended) are filled by _play around it. A role sets
# result["ended"] where it knows; an _Ended raised through it sets it too.

def _sink(run: _Run) -> None:
    """Read and count until EOF, reset or ``max_s``.

    Shaping, all optional: ``start_after_s`` (read nothing until then: a
    stalled reader), ``stall_at_s``+``stall_s`` (a pause at a time),
    ``pause_at_bytes``+``pause_s`` (a pause once that much has arrived),
    ``rate_Bps`` (token bucket, one ``recv_bytes`` read of burst). With
    ``frame_bytes`` the stream is decoded as frames no longer than that
    (``protocols.cores.SinkCore``; ``verify`` checks every payload byte).
    Reports ``eof_after_s`` (connect to EOF), ``eof_at`` (its monotonic
    time), ``rate_after_warmup_Bps`` (received, from ``warmup_s`` after
    connecting to the last byte), ``pauses`` [[from_s, to_s, bytes_before,
    why]], and with frames ``frames_count``, ``out_of_order_count``,
    ``missing_count``, ``duplicate_count``, ``max_latency_s``,
    ``p50_latency_s``, ``last_seq``, ``latency_series`` [[t_s, max latency in
    that ~50 ms]] and ``frame_error`` if the stream broke the framing (bytes
    are still counted). ``close_with_reset`` closes with an RST whatever the
    ending.

    Hazards: a pause starts between reads, so up to one ``recv_bytes`` read
    may land past ``pause_at_bytes`` and a stall may begin up to ~50 ms late.
    Latency is measured when the read returns: a sink slower than its source
    shows the queue in front of it as latency, which is the point.
    """
    cfg, res = run.cfg, run.result
    res.update(eof_after_s=None, eof_at=None, rate_after_warmup_Bps=None, pauses=[])
    core = None
    if cfg["frame_bytes"] is not None:
        from protocols.cores import ProtocolError, SinkCore
        core = SinkCore(cfg["frame_bytes"], verify=cfg["verify"])
    buf = memoryview(bytearray(cfg["recv_bytes"]))
    s = run.open()
    t0 = run.t0
    bucket = _Bucket(cfg["rate_Bps"], cfg["recv_bytes"], t0) if cfg["rate_Bps"] else None
    stall_from = t0 + cfg["stall_at_s"] if cfg["stall_s"] else math.inf
    stall_to = stall_from + cfg["stall_s"]
    pause_at = cfg["pause_at_bytes"]

    def pause(until, why):
        began = time.monotonic()
        at = run.received
        run.sleep_until(until)
        res["pauses"].append([round(began - t0, 4), round(time.monotonic() - t0, 4), at, why])

    try:
        if cfg["start_after_s"]:
            pause(t0 + cfg["start_after_s"], "start_after_s")
        while True:
            now = time.monotonic()
            if stall_from <= now < stall_to:
                pause(stall_to, "stall_s")
                stall_from = math.inf
            if pause_at is not None and run.received >= pause_at:
                pause(now + cfg["pause_s"], "pause_at_bytes")
                pause_at = None
            if bucket is not None and bucket.due > now:
                run.sleep_until(bucket.due)
            # A pending stall bounds the wait: a recv blocked across the
            # stall's start would otherwise read in the middle of it.
            n = run.recv_into(s, buf, stall_from)
            if n is None:
                continue
            now = time.monotonic()
            if n == 0:
                res.update(ended="eof", eof_at=now, eof_after_s=now - t0)
                if core is not None and "frame_error" not in res:
                    try:
                        core.eof()
                    except ProtocolError as e:
                        res["frame_error"] = str(e)
                break
            run.count_in(n, now)
            if bucket is not None:
                bucket.charge(n, now)
            if core is not None and "frame_error" not in res:
                try:
                    core.receive(buf[:n], now)
                except ProtocolError as e:
                    # The decoder stays failed: from here on we count bytes only.
                    # Frames completed in this chunk before the bad byte ride on
                    # the error; SinkCore does not add them (guarded so that it
                    # may start to without double counting).
                    res["frame_error"] = str(e)
                    if core.stats.count < core.decoder.frames_count:
                        for frame in e.partial:
                            core.stats.add(frame, now)
    finally:
        res["rate_after_warmup_Bps"] = run.rate_in_after_warmup()
        if core is not None:
            stats = core.stats
            res.update(stats.summary())
            res["latency_series"] = _window_max(stats.latency_times, stats.latencies, t0)
        if cfg["close_with_reset"]:
            run.close(s, reset=True)


def _window_max(times, values, t0) -> list[list]:
    """[[t, max value in that ~50 ms window], ...] from time-ordered samples."""
    out: list[list] = []
    end = -math.inf
    for t, v in zip(times, values):
        if t >= end:
            out.append([round(t - t0, 4), v])
            end = t + _TICK
        elif v > out[-1][1]:
            out[-1][1] = v
    return out


def _source(run: _Run) -> None:
    """Send frames (``protocols.cores.SourceCore``: numbered from 0, stamped
    with ``time.monotonic()`` just before the send) at ``rate_Bps`` for
    ``duration_s`` and/or up to ``total_bytes`` (a shorter last frame), then
    ``finish``: "close", "reset" (RST), or "shutdown" (SHUT_WR, then wait up to
    ``eof_wait_s`` for the other side's EOF: ``peer_eof``).

    ``frames_sent`` counts frames handed to the socket (the last one may be
    partial if a reset or ``max_s`` cut it; ``sent_bytes`` is exact).
    A frame goes whole, blocking: backpressure shows as a lower achieved rate
    (``rate_Bps`` over the whole send, ``rate_after_warmup_Bps`` after
    ``warmup_s``) and as ``send_blocked_s``, never as a burst afterwards (the
    bucket saves at most two frames of credit). A frame started before
    ``duration_s`` is finished, so the peer never sees a truncated frame
    unless ``max_s`` or a reset cuts it.
    """
    from protocols.cores import SourceCore
    cfg, res = run.cfg, run.result
    run.tracked = "sent"
    res.update(finish=cfg["finish"], frames_sent=0, rate_Bps=None, rate_after_warmup_Bps=None,
               send_blocked_s=0.0, sending_s=None, peer_eof=None)
    core = SourceCore(cfg["frame_bytes"], cfg["total_bytes"], cfg["rate_Bps"])
    s = run.open()
    t0 = run.t0
    stop_at = t0 + cfg["duration_s"] if cfg["duration_s"] is not None else math.inf
    # Rate after warm-up: between two send *completions* (cumulative bytes the
    # OS had taken by then), so whole frame intervals are counted, never one
    # frame more than the span it took.
    warm_at = t0 + cfg["warmup_s"]
    warm_mark = last_done = None
    blocked = 0.0
    ended_sending = None
    try:
        while not core.done:
            now = time.monotonic()
            if now >= stop_at:
                break
            frame = core.next_chunk(now)
            if frame is None:
                run.sleep_until(min(now + core.wait_s(now), stop_at))
                continue
            run.send_all(s, frame)
            after = time.monotonic()
            blocked += after - now
            last_done = (after, run.sent)
            if warm_mark is None and after >= warm_at:
                warm_mark = last_done
            run.sample(after)
    except _Ended as e:
        ended_sending = e.how
    finally:
        t_end = time.monotonic()
        res["frames_sent"] = core.frames_sent
        res["send_blocked_s"] = blocked
        res["sending_s"] = t_end - t0
        if t_end > t0:
            res["rate_Bps"] = run.sent / (t_end - t0)
        if warm_mark is not None and last_done[0] > warm_mark[0]:
            res["rate_after_warmup_Bps"] = ((last_done[1] - warm_mark[1])
                                            / (last_done[0] - warm_mark[0]))
    if ended_sending is not None:
        raise _Ended(ended_sending)
    finish = cfg["finish"]
    if finish == "close":
        run.close(s)
        res["ended"] = "closed"
    elif finish == "reset":
        run.close(s, reset=True)
        res["ended"] = "reset_sent"
    else:
        try:
            s.shutdown(socket.SHUT_WR)
        except OSError:
            raise _Ended("reset") from None
        # Wait for the other side's EOF, discarding (but counting) what comes.
        buf = memoryview(bytearray(cfg["recv_bytes"]))
        until = time.monotonic() + cfg["eof_wait_s"]
        while True:
            n = run.recv_into(s, buf, until)
            if n is None:
                res.update(ended="timeout", peer_eof=False)
                return
            if n == 0:
                res.update(ended="eof", peer_eof=True)
                return
            run.received += n


def _pipeline_client(run: _Run) -> None:
    """Send ``count`` requests b"REQ i\\n" back to back, never read a byte,
    hold the connection ``hold_s`` (ending early if the server closes or
    resets), then close -- with the responses unread, so the close is an RST,
    as for the real clients of Twisted ticket 8868. Reports ``requests_sent``
    and ``unread_bytes`` (what the server got into our receive queue)."""
    cfg, res = run.cfg, run.result
    run.tracked = "sent"
    res.update(requests_sent=0, unread_bytes=None)
    s = run.open()
    try:
        # One send per request: each is on the wire as soon as the OS takes
        # it (Nagle may still coalesce them; the server must cope either way).
        for i in range(cfg["count"]):
            run.send_all(s, b"REQ %d\n" % i)
            res["requests_sent"] = i + 1
        how = run.hold(s, time.monotonic() + cfg["hold_s"])
        res["ended"] = how or "closed"
    finally:
        res["unread_bytes"] = _unread_bytes(s)


def _push_client(run: _Run) -> None:
    """Connect and stay ``duration_s``: ``mode="healthy"`` reads everything as
    fast as it comes, ``"stalled"`` never reads (``unread_bytes`` at the end).
    Ends early on the server's EOF or reset."""
    cfg, res = run.cfg, run.result
    res.update(mode=cfg["mode"], unread_bytes=None)
    s = run.open()
    until = run.t0 + cfg["duration_s"]
    if cfg["mode"] == "stalled":
        try:
            res["ended"] = run.hold(s, until) or "closed"
        finally:
            res["unread_bytes"] = _unread_bytes(s)
        return
    buf = memoryview(bytearray(cfg["recv_bytes"]))
    while True:
        n = run.recv_into(s, buf, until)
        if n is None:
            res["ended"] = "closed"
            return
        if n == 0:
            res["ended"] = "eof"
            return
        run.count_in(n, time.monotonic())


_PERIOD = 251   # the echo pattern: byte i of the stream is i % 251 (prime: never aligns)


def _echo_client(run: _Run) -> None:
    """Send ``total_bytes`` of a deterministic pattern in ``chunk_bytes``
    pieces while a second thread reads the echo and checks it byte for byte;
    then SHUT_WR (``shutdown``) and wait up to ``eof_wait_s`` for the server's
    EOF. Reports ``ok`` (everything came back, unchanged) and ``mismatch_at``
    (stream offset of the first wrong byte, or None)."""
    cfg, res = run.cfg, run.result
    total, chunk = cfg["total_bytes"], cfg["chunk_bytes"]
    pattern = memoryview(bytes(i % _PERIOD
                               for i in range(_PERIOD + max(chunk, cfg["recv_bytes"]))))
    res.update(ok=False, mismatch_at=None)
    s = run.open()
    read_end: list[str] = []

    def read_echo():
        # Runs beside the sender: an echo server that only writes back what
        # it can send would deadlock a client that sends everything first.
        buf = memoryview(bytearray(cfg["recv_bytes"]))
        until = None
        try:
            while True:
                n = run.recv_into(s, buf, until)
                if n is None:
                    read_end.append("closed")
                    return
                if n == 0:
                    read_end.append("eof")
                    return
                if res["mismatch_at"] is None:
                    phase = run.received % _PERIOD
                    if buf[:n] != pattern[phase:phase + n]:
                        bad = next(i for i in range(n) if buf[i] != pattern[phase + i])
                        res["mismatch_at"] = run.received + bad
                run.count_in(n, time.monotonic())
                if run.received >= total and until is None:
                    until = time.monotonic() + cfg["eof_wait_s"]
        except _Ended as e:
            read_end.append(e.how)

    reader = threading.Thread(target=read_echo, name=f"peer-{run.name}-echo", daemon=True)
    reader.start()
    try:
        done = 0
        while done < total:
            n = min(chunk, total - done)
            phase = done % _PERIOD
            run.send_all(s, pattern[phase:phase + n], sample=False)
            done += n
        if cfg["shutdown"]:
            try:
                s.shutdown(socket.SHUT_WR)
            except OSError:
                pass
    except _Ended:
        pass     # the reader sees the same reset or deadline and says so
    finally:
        reader.join(max(0.0, run.deadline - time.monotonic()) + 2 * _TICK + 1.0)
    res["ended"] = read_end[0] if read_end else "timeout"
    res["ok"] = (res["mismatch_at"] is None and run.sent == total and run.received == total)


def _reset_peer(run: _Run) -> None:
    """Read exactly ``after_bytes`` (leaving the rest unread) and/or for
    ``after_s``, then close with SO_LINGER 0: an RST mid-stream. With neither,
    reset at once. Reports ``reset_sent`` and ``reset_after_s``."""
    cfg, res = run.cfg, run.result
    res.update(reset_sent=False, reset_after_s=None)
    after_bytes, after_s = cfg["after_bytes"], cfg["after_s"]
    buf = memoryview(bytearray(cfg["recv_bytes"]))
    s = run.open()
    until = run.t0 + after_s if after_s is not None else None
    try:
        while after_bytes is not None or after_s is not None:
            want = len(buf)
            if after_bytes is not None:
                want = min(want, after_bytes - run.received)
                if want <= 0:
                    break
            n = run.recv_into(s, buf[:want], until)
            if n is None:
                break
            if n == 0:
                res["ended"] = "eof"
                break
            run.count_in(n, time.monotonic())
    except _Ended as e:
        res["ended"] = e.how
    # Whatever happened, the plan is an RST: SO_LINGER 0, then close.
    res["reset_after_s"] = time.monotonic() - run.t0
    run.close(s, reset=True)
    res["reset_sent"] = True
    if res["ended"] is None:
        res["ended"] = "reset_sent"


def _reader(run: _Run) -> None:
    """The S3/S7/S8 ground truth: wait ``start_after_s``, then read everything
    until EOF, at most ``rate_Bps`` (a slow reader) if set. ``eof_after_s`` is
    from the first byte read to EOF (from the start of reading if nothing
    came); also ``first_byte_after_s`` and ``eof_after_connect_s`` from the
    connection, ``eof_at`` (monotonic, comparable with other processes' clocks
    on Linux) and ``rate_after_warmup_Bps`` as for the sink."""
    cfg, res = run.cfg, run.result
    res.update(eof_after_s=None, eof_after_connect_s=None, eof_at=None, first_byte_after_s=None,
               rate_after_warmup_Bps=None)
    buf = memoryview(bytearray(cfg["recv_bytes"]))
    s = run.open()
    t0 = run.t0
    bucket = _Bucket(cfg["rate_Bps"], cfg["recv_bytes"], t0) if cfg["rate_Bps"] else None
    try:
        run.sleep_until(t0 + cfg["start_after_s"])
        reading_from = time.monotonic()
        first = None
        while True:
            if bucket is not None and bucket.due > time.monotonic():
                run.sleep_until(bucket.due)
            n = run.recv_into(s, buf)
            now = time.monotonic()
            if n == 0:
                res.update(ended="eof", eof_at=now, eof_after_connect_s=now - t0,
                           eof_after_s=now - (first if first is not None else reading_from))
                return
            if first is None:
                first = now
                res["first_byte_after_s"] = now - t0
            run.count_in(n, now)
            if bucket is not None:
                bucket.charge(n, now)
    finally:
        res["rate_after_warmup_Bps"] = run.rate_in_after_warmup()


_ROLE_FUNCS = {"sink": _sink, "source": _source, "pipeline_client": _pipeline_client,
               "push_client": _push_client, "echo_client": _echo_client,
               "reset_peer": _reset_peer, "reader": _reader}
assert set(_ROLE_FUNCS) == set(ROLES)


def _play(cfg: dict, emit) -> dict:
    """Run one role to its end and return its result; never raises."""
    run = _Run(cfg, emit)
    res = run.result
    try:
        _ROLE_FUNCS[cfg["role"]](run)
    except _Ended as e:
        if res["ended"] is None:
            res["ended"] = e.how
    except OSError as e:
        # Expected network conditions (refused, unreachable, address in use):
        # a result, not a traceback.
        res["error"] = str(e) if e.strerror is None else f"{e.strerror} [errno {e.errno}]"
        res["ended"] = "error"
    except Exception:
        res["error"] = "internal error in the peer: " + traceback.format_exc()
        res["ended"] = "error"
        traceback.print_exc()
    finally:
        run.close_all()
    now = time.monotonic()
    if run.t0 is not None:
        run.sample(now, force=True)
    if res["ended"] is None:
        res["ended"] = "closed"
    res.update(sent_bytes=run.sent, received_bytes=run.received, ran_s=now - run.began,
               series=run.series)
    return res


class _Child:
    """The child process: starts the roles, listens to the parent, reports."""

    def __init__(self, roles: list[dict], timeout_s: float):
        self.roles = {r["name"]: r for r in roles}
        self.timeout_s = timeout_s
        self.started: set[str] = set()
        self.reported: set[str] = set()
        self.parent_gone = False
        self.cond = threading.Condition()
        self.out_lock = threading.Lock()

    def emit(self, event: dict) -> None:
        line = json.dumps(event) + "\n"
        with self.out_lock:
            try:
                sys.stdout.write(line)
                sys.stdout.flush()
            except (OSError, ValueError):
                os._exit(1)              # nobody is listening any more

    def launch(self, cfg: dict) -> None:
        self.started.add(cfg["name"])
        threading.Thread(target=self._role_thread, args=(cfg,), name=f"peer-{cfg['name']}",
                         daemon=True).start()

    def _role_thread(self, cfg: dict) -> None:
        result = _play(cfg, self.emit)
        self.emit({"event": "result", "name": cfg["name"], "result": result})
        with self.cond:
            self.reported.add(cfg["name"])
            self.cond.notify_all()

    def _listen_parent(self) -> None:
        for line in sys.stdin:
            try:
                cmd = json.loads(line)
                name = cmd.pop("start")
            except (ValueError, TypeError, KeyError, AttributeError):
                self.emit({"event": "error", "error": f"bad command line {line.strip()!r}"})
                continue
            with self.cond:
                if name not in self.roles or name in self.started:
                    self.emit({"event": "error", "error": f"cannot start role {name!r}: "
                               "unknown or already started"})
                    continue
                try:
                    cfg = check_role({**self.roles[name], **cmd, "deferred": False},
                                     self.timeout_s, starting=True)
                except (ValueError, TypeError) as e:
                    self.started.add(name)
                    self.emit({"event": "result", "name": name,
                               "result": {"name": name, "role": self.roles[name]["role"],
                                          "ended": "error", "error": str(e)}})
                    self.reported.add(name)
                    self.cond.notify_all()
                    continue
                self.launch(cfg)
        with self.cond:
            self.parent_gone = True
            self.cond.notify_all()

    def run(self) -> int:
        with self.cond:
            for cfg in self.roles.values():
                if not cfg["deferred"]:
                    self.launch(cfg)
        threading.Thread(target=self._listen_parent, name="peer-stdin", daemon=True).start()
        deadline = time.monotonic() + self.timeout_s + 2 * _GRACE_S
        with self.cond:
            while not self.parent_gone and len(self.reported) < len(self.roles):
                left = deadline - time.monotonic()
                if left <= 0:
                    running = ", ".join(sorted(set(self.roles) - self.reported))
                    self.emit({"event": "error", "error": f"peer process timeout "
                               f"({self.timeout_s} s); roles still running: {running}"})
                    return 3
                self.cond.wait(left)
            if not self.parent_gone:
                self.emit({"event": "done"})
        return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.peers SPEC_JSON`` (or ``-``: the first stdin line).
    SPEC_JSON is a list of roles or {"timeout_s": T, "roles": [...]}."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)   # Ctrl-C: die quietly, no traceback
    argv = sys.argv[1:] if argv is None else argv
    child = None
    try:
        text = sys.stdin.readline() if not argv or argv[0] == "-" else argv[0]
        doc = json.loads(text)
        if isinstance(doc, dict):
            timeout_s = _seconds_check(True, False)("timeout_s", doc.get("timeout_s", 30.0))
            roles = doc.get("roles")
        else:
            timeout_s, roles = 30.0, doc
        child = _Child(check_spec(roles, timeout_s), timeout_s)
    except (ValueError, TypeError) as e:
        line = json.dumps({"event": "error", "error": f"bad peer spec: {e}"})
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
        return 2
    code = child.run()
    # os._exit: the stdin reader thread is blocked in a read, and interpreter
    # shutdown with a daemon thread inside a buffered stdin read can abort.
    # Every role has closed its sockets and stdout is flushed.
    sys.stdout.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
