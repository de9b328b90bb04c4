"""Child processes and what they use: the one place looplab starts its child
processes (which interpreter, which environment, which pipes), stops them (a
signal, a grace period, then SIGKILL: never an orphan), and reads a process's
resident memory, its peak and its open descriptors.

Every child that runs looplab's own code (a cell's app, the peers, a served
server, a load client, a micro-benchmark worker) is started by ``spawn`` with a
command from ``python_command``, so the interpreter is chosen in one place
(``interpreter``: the one running looplab, unless a cell names another).
Standard library only: everything in bench may use it.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys

__all__ = ["ROOT", "interpreter", "python_command", "child_env", "spawn", "stop",
           "rss_bytes", "reset_peak_rss", "fd_count", "alive"]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def interpreter(choice: str | None = None) -> str:
    """The Python a child runs: ``choice`` (a cell's own interpreter) or this one."""
    return choice or sys.executable


def python_command(module: str, *args: str, python: str | None = None) -> list[str]:
    """``python -m MODULE ARGS...`` on ``interpreter(python)``."""
    return [interpreter(python), "-m", module, *map(str, args)]


def child_env(extra: dict | None = None) -> dict:
    """This environment with looplab's root first on PYTHONPATH, so
    ``python -m bench...`` in the child finds the same code as this process."""
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra or {})
    return env


def spawn(cmd: list[str], *, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
          stderr=subprocess.PIPE, text: bool = False, cwd: str | None = ROOT,
          env: dict | None = None, **popen) -> subprocess.Popen:
    """Start ``cmd`` (from ``python_command``, or another program) in looplab's root
    with ``child_env()``."""
    return subprocess.Popen(cmd, stdin=stdin, stdout=stdout, stderr=stderr, text=text, cwd=cwd,
                            env=child_env() if env is None else env, **popen)


def stop(proc: subprocess.Popen, *, first: int | None = signal.SIGTERM, grace_s: float = 5.0,
         close_pipes: bool = True) -> int | None:
    """Send ``first`` (None: only wait), wait ``grace_s``, then SIGKILL: the process is
    always gone and reaped afterwards. Returns its exit code (None if it had to be
    killed)."""
    rc = proc.returncode if proc.poll() is not None else None
    if proc.poll() is None:
        try:
            if first is not None:
                proc.send_signal(first)
            rc = proc.wait(grace_s)
        except ProcessLookupError:
            rc = proc.wait()
        except subprocess.TimeoutExpired:
            pass
        finally:
            # even if a second Ctrl-C lands in the wait above: never an orphan
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if close_pipes:
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    return rc


def rss_bytes(pid: int | str = "self", field: str = "VmRSS") -> int | None:
    """A process's resident set (``VmRSS``) or its peak (``VmHWM``) in bytes, from
    /proc; None where there is no /proc or no such process."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def reset_peak_rss(pid: int | str = "self") -> bool:
    """Reset a process's VmHWM to its current RSS (Linux >= 4.0, and only where this
    process may: itself, or one it could trace); whether it was reset."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def fd_count(pid: int | str = "self") -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False
