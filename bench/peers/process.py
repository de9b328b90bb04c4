"""The parent side of the peer process: ``PeerProcess``.

Spawns ``python -m bench.peers`` (the child, ``bench/peers/child.py``) with
the checked spec, relays its JSON lines, and always reaps it. See the package docstring
for the contract.
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

from bench.host import procs
from bench.peers.spec import _GRACE_S, _seconds_check, check_role, check_spec, role_origin

__all__ = ["PeerProcess", "PeerError", "PeerTimeout"]

_STDERR_KEEP = 64 * 1024     # the parent keeps this much of the child's stderr


class PeerError(RuntimeError):
    """The peer process failed: it died, or reported something it should not."""


class PeerTimeout(PeerError, TimeoutError):
    """A wait on the peer process ran out of time."""


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
        origins = []
        for r in self.roles:
            origin = role_origin(r["role"])
            if origin is not None and origin not in origins:
                origins.append(origin)
        doc = json.dumps({"timeout_s": self.timeout_s, "roles": self.roles,
                          "role_modules": origins})
        self._deadline = time.monotonic() + self.timeout_s + _GRACE_S
        self._proc = procs.spawn(procs.python_command("bench.peers", doc, python=self._python),
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


