"""What every standalone zoo program shares: read the spec, bound the run, report.

A standalone program runs a zoo entry's bug on a real framework release in a *bare*
environment (bench.host.envs.build_bare: an interpreter below looplab's minimum, the
pinned releases and nothing of looplab), so it may use the standard library and the
pinned framework only, in Python 3.6 syntax. looplab starts it as ``python FILE SPEC``
(bench.scenarios.context.run_program); this directory is then ``sys.path[0]``, which is
how the programs import this module. The peers that measure the wire are looplab's own,
in the parent: they listen, and the program connects to each one and hands the socket to
the framework as an accepted connection.

The program speaks the cell process's JSON lines on stdout (bench.scenarios.appside):
``{"event": "stopped", "at": T}`` when its measured part is over (``time.monotonic()``:
one clock for the machine on Linux), then ``{"event": "result", ...}`` with what it
measured, or ``{"event": "result", "error": "..."}``.
"""
import json
import signal
import socket
import sys
import time
import traceback

CRASH_KEY = "looplab.error"      # bench.errors.CRASH_KEY: the cell failed


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def status_kb(field):
    """A field of /proc/self/status in bytes (VmRSS, VmHWM), or None."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def reset_peak():
    """Reset VmHWM to the current resident set where the kernel allows it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def pattern(n, start=0):
    """The peers' body pattern: byte i is i % 251 (bench.peers.http.pattern)."""
    return bytes((start + i) % 251 for i in range(n))


def connect(addr, sockbuf=None):
    """A non-blocking socket connected to a listening peer (its send and receive
    buffers pinned to ``sockbuf`` bytes if given, so a write fills them soon)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if sockbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sockbuf)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, sockbuf)
    s.settimeout(10)
    s.connect((addr[0], int(addr[1])))
    s.setblocking(False)
    return s


class Bound(Exception):
    """The run's own bound (``max_s``) ran out."""


def run(program):
    """Read the spec from argv, run ``program(spec, out)`` bounded by ``max_s`` (SIGALRM),
    and report: the stopped line, then the result line."""
    spec = json.loads(sys.argv[1])
    out = {}

    def alarm(signum, frame):
        raise Bound("did not finish within %s s" % spec.get("max_s"))
    signal.signal(signal.SIGALRM, alarm)
    signal.alarm(max(1, int(spec.get("max_s") or 30)))
    base = status_kb("VmRSS")
    reset_peak()
    try:
        program(spec, out)
    except Bound as exc:
        out[CRASH_KEY] = str(exc)
    except BaseException as exc:        # one line, with the innermost frame of ours
        frames = [f for f in traceback.extract_tb(exc.__traceback__)
                  if "site-packages" not in f.filename] or traceback.extract_tb(exc.__traceback__)
        where = " (at %s:%s in %s)" % (frames[-1].filename.rsplit("/", 1)[-1], frames[-1].lineno,
                                      frames[-1].name) if frames else ""
        out[CRASH_KEY] = "%s: %s%s" % (type(exc).__name__, exc, where)
    finally:
        signal.alarm(0)
    peak = status_kb("VmHWM")
    out["rss_growth_bytes"] = peak - base if peak is not None and base is not None else None
    out["loop_stopped_at"] = time.monotonic()
    out["python"] = sys.version.split()[0]
    emit({"event": "stopped", "at": out["loop_stopped_at"]})
    time.sleep(float(spec.get("linger_s") or 0))
    result = {"event": "result"}
    result.update(out)
    emit(result)
    return 1 if CRASH_KEY in out else 0
