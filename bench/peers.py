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
process (``python -m bench.peerproc``), so a scenario with a source and a sink
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

Where the parts live. This module is what a scenario uses: the role
constructors (``sink(...)``, ``source(...)``, ... build spec dicts), the checks
(``check_role``, ``check_spec``, from ``bench/peerspec.py``, which both sides
run) and ``PeerProcess``. The child is ``bench/peerproc.py`` (the JSON-lines
loop and ``main``), running the role bodies of ``bench/peerroles.py``.

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
import subprocess
import sys
import threading
import time

from bench import procs
from bench.peerproc import main
from bench.peerspec import _GRACE_S, ROLES, _seconds_check, check_role, check_spec

__all__ = ["PeerProcess", "PeerError", "PeerTimeout", "ROLES", "check_spec", "check_role",
           "role", "sink", "source", "reader", "pipeline_client", "push_client", "echo_client",
           "reset_peer", "main"]

_STDERR_KEEP = 64 * 1024     # the parent keeps this much of the child's stderr


class PeerError(RuntimeError):
    """The peer process failed: it died, or reported something it should not."""


class PeerTimeout(PeerError, TimeoutError):
    """A wait on the peer process ran out of time."""



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
        self._python = procs.interpreter(python)
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
        doc = json.dumps({"timeout_s": self.timeout_s, "roles": self.roles})
        self._deadline = time.monotonic() + self.timeout_s + _GRACE_S
        self._proc = procs.spawn(procs.python_command("bench.peerproc", doc, python=self._python),
                                 stdin=subprocess.PIPE)
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


if __name__ == "__main__":
    sys.exit(main())
