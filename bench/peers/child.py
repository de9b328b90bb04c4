"""The measurement peer process: ``python -m bench.peers SPEC_JSON``.

The child side of ``bench.peers.PeerProcess``. It loads the modules that
registered the spec's user roles, checks the spec (``bench/peers/spec.py``),
runs each role on the blocking-socket driver (``bench/peers/real.py``) in a
thread of its own, and speaks JSON lines: it
prints ``{"event": "listening", "name", "addr"}``, ``{"event": "result",
"name", "result"}`` and ``{"event": "done"}`` on stdout, and reads
``{"start": name, ...fields}`` lines on stdin to start deferred roles. EOF on
stdin (the parent is gone) ends it at once; so does its own bound,
``timeout_s`` plus a grace.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import signal
import sys
import threading
import time

from bench.peers.real import play
from bench.peers.spec import _GRACE_S, _seconds_check, check_role, check_spec

__all__ = ["main", "load_role_modules"]


def load_role_modules(origins) -> None:
    """Import the modules that registered user roles (``spec.role_origin``):
    by file when the parent knew one (a scenario file, a test), else by name."""
    for origin in origins or ():
        name, path = origin.get("module"), origin.get("file")
        if name in sys.modules and name != "__main__":
            continue
        if path:
            if name == "__main__" or not name:
                name = "looplab_roles_" + hashlib.sha1(path.encode()).hexdigest()[:12]
            spec = importlib.util.spec_from_file_location(name, path)
            if spec is None or spec.loader is None:
                raise ValueError(f"cannot load the roles of {path}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        else:
            importlib.import_module(name)


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
        result = play(cfg, self.emit)
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
    SPEC_JSON is a list of roles or
    {"timeout_s": T, "roles": [...], "role_modules": [origin, ...]}."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)   # Ctrl-C: die quietly, no traceback
    argv = sys.argv[1:] if argv is None else argv
    child = None
    try:
        text = sys.stdin.readline() if not argv or argv[0] == "-" else argv[0]
        doc = json.loads(text)
        if isinstance(doc, dict):
            timeout_s = _seconds_check(True, False)("timeout_s", doc.get("timeout_s", 30.0))
            roles = doc.get("roles")
            load_role_modules(doc.get("role_modules"))
        else:
            timeout_s, roles = 30.0, doc
        child = _Child(check_spec(roles, timeout_s), timeout_s)
    except (ValueError, TypeError, ImportError, OSError) as e:
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
