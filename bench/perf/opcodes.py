"""Python opcodes per echo request, or per micro-benchmark operation, by function.

Where a pure-Python design spends its interpreted work, counted exactly and in
seconds: no valgrind, no noise. The server (or the micro-benchmark) runs in this
process under ``sys.settrace`` with opcode events, and every opcode executed in its
thread is charged to the function it belongs to. Only bytecode is counted: C code
(uvloop's loop, asyncio's C Task and Future, the socket calls) costs nothing here,
which is the point when comparing how much a design asks of the interpreter, and
the reason not to read the totals as CPU time (``bench.perf.icount`` counts
machine instructions, C included). A developer tool, not a benchmark verb::

    python -m bench.perf.opcodes RUNTIME... [--requests 500] [--conns 10] [--top 12]
    python -m bench.perf.opcodes --micro OP RUNTIME... [--small 200] [--large 1000]

Echo: a client thread drives the server as ``bench.perf.icount --pause`` does
(``icount.round_trips``): rounds of one 1 KiB message on each of ``--conns``
connections, every echo read back, 2 ms apart, so each round finds the server
idle; only the ``--requests`` round trips after a warm-up are counted.
Micro: the whole operation loop runs twice, ``small`` and ``large`` operations, and
the difference is divided, so set-up cancels out; ``floor`` in place of a runtime
counts ``bench.perf.nokernel`` (spawn+join with no kernel). Runtimes run in this
interpreter (a spec pinned to another, ``@3.13``, is refused in one line); ``--json``
prints one JSON object a runtime instead of the table. ``breakdown()`` is the same
count for ``looplab bench goals``, taken in a child process on the runtime's own
interpreter, so that neither the tracing nor the server's stop signal touches the
caller.
"""
from __future__ import annotations

import argparse
import collections
import json
import platform
import signal
import subprocess
import socket
import sys
import threading
import time

from bench.errors import ExitCode, UsageError
from bench.host import envs, procs
from bench import runtimes

FLOOR = runtimes.FLOOR

_WARMUP_ROUNDS = 30
_PAYLOAD = 1024
_PAUSE_S = 0.002


class _Counter:
    """Opcodes per (file, function) while ``on``, in the thread that installed it."""

    def __init__(self):
        self.counts = collections.Counter()
        self.on = False

    def trace(self, frame, event, arg):
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        if event == "opcode" and self.on:
            code = frame.f_code
            self.counts[(code.co_filename, getattr(code, "co_qualname", code.co_name))] += 1
        return self.trace

    def __enter__(self):
        sys.settrace(self.trace)
        return self

    def __exit__(self, *exc):
        sys.settrace(None)


def _where(filename: str) -> str:
    parts = filename.replace("\\", "/").split("/")
    return "/".join(parts[-2:])


def _parse(spec: str):
    rt = runtimes.parse(spec)
    if rt.interpreter is not None:
        raise UsageError(f"{spec}: opcodes are counted in this interpreter only; run "
                         f"python{rt.interpreter} -m bench.perf.opcodes instead")
    reason = rt.unavailable_reason()
    if reason:
        raise UsageError(f"runtime {rt.id} is unavailable here: {reason}")
    return rt


def echo_opcodes(spec: str, requests: int = 500, conns: int = 10) -> collections.Counter:
    """Opcodes per echo request by (file, function), in this process."""
    from bench.perf.icount import round_trips
    from bench.perf.machine import bench_runtime
    from protocols.common import driver
    rt = bench_runtime(_parse(spec))
    counted = max(1, requests // conns) * conns
    sock = runtimes.bind_listener("127.0.0.1", 0)
    addr = sock.getsockname()[:2]
    counter = _Counter()
    failed: list[BaseException] = []
    serving, ours = [False], [False]    # the server runs; the SIGINT that ends it is ours
    lock = threading.Lock()

    socks: list[socket.socket] = []

    def client():
        try:
            for _ in range(conns):
                s = socket.create_connection(addr, timeout=10)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                socks.append(s)
            round_trips(socks, _PAYLOAD, _WARMUP_ROUNDS * conns, _PAUSE_S)
            counter.on = True
            round_trips(socks, _PAYLOAD, counted, _PAUSE_S)
            counter.on = False
        except BaseException as exc:     # noqa: B902 -- reported by the main thread
            counter.on = False
            failed.append(exc)
        finally:
            for s in socks:
                s.close()
            with lock:      # ends the server in the main thread, if it still serves
                if serving[0]:
                    ours[0] = True
                    # to the main thread itself: raised here, the signal would not
                    # wake a server asleep in its poller
                    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    thread = threading.Thread(target=client, name="opcodes-client", daemon=True)
    params = {"sockbuf": None, "forever": False, "two_way": False,
              "response_bytes": 65536, "frame_bytes": None}
    user_stopped = False
    port = None
    try:
        port = rt.open()
        serving[0] = True
        thread.start()
        with counter:
            try:
                driver(rt.style).serve(port, "echo", sock, "naive", params)
            except* KeyboardInterrupt:
                pass
            finally:
                with lock:
                    serving[0] = False
                    user_stopped = not ours[0]
    finally:
        if port is not None:
            port.close()
        sock.close()
        if user_stopped:    # the client may be waiting on a server that is gone:
            for s in list(socks):       # a shutdown wakes its recv, a close would not
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        if thread.is_alive():
            thread.join(30)
    if user_stopped:
        raise KeyboardInterrupt
    if failed:
        raise RuntimeError(f"the echo client failed on {spec}: {failed[0]!r}")
    return collections.Counter({k: v / counted for k, v in counter.counts.items()})


def micro_opcodes(op: str, spec: str, small: int = 200, large: int = 1000) -> collections.Counter:
    """Opcodes per micro-benchmark operation by (file, function), ``small`` and
    ``large`` operations apart."""
    from bench.perf.icount import ops_per_n
    from bench.perf.micro import Micro
    rt = _parse(spec)
    totals = []
    for n in (small, large):
        counter = _Counter()
        with Micro(op, rt, n) as m:
            with counter:
                counter.on = True
                res = m.run()
                counter.on = False
        if res.error:
            raise RuntimeError(f"{op} on {spec} failed: {res.error}")
        totals.append(counter.counts)
    per = (large - small) * ops_per_n(op)
    a, b = totals
    return collections.Counter({k: (b.get(k, 0) - a.get(k, 0)) / per for k in set(a) | set(b)})


def floor_opcodes(small: int = 200, large: int = 1000) -> collections.Counter:
    """Opcodes per spawn+join with no kernel at all (``bench.perf.nokernel``), by
    function, ``small`` and ``large`` operations apart."""
    from bench.perf import nokernel
    totals = []
    for n in (small, large):
        counter = _Counter()
        with counter:
            counter.on = True
            nokernel.run(n)
            counter.on = False
        totals.append(counter.counts)
    a, b = totals
    return collections.Counter({k: (b.get(k, 0) - a.get(k, 0)) / (large - small)
                                for k in set(a) | set(b)})


def summary(counts: collections.Counter, top: int) -> dict:
    """The ``top`` functions with their opcodes, what the others add up to, and the
    total: ``{"functions": [[label, opcodes], ...], "other", "total"}``."""
    best = [(f"{_where(f)}:{name}", v) for (f, name), v in counts.most_common(top) if v >= 0.05]
    total = sum(counts.values())
    return {"functions": [list(x) for x in best], "other": total - sum(v for _, v in best),
            "total": total}


def _child(kind: str, spec: str) -> tuple[str, str]:
    """(the interpreter to count ``spec`` in, the spec as that interpreter names it):
    a spec pinned to an interpreter (``coro@3.13``) is counted by that interpreter's
    environment, unpinned."""
    if spec == FLOOR or spec.startswith(FLOOR + "@"):
        at = spec.partition("@")[2]
        return (envs.find(at).path if at else sys.executable), FLOOR
    rt = runtimes.parse(spec)
    if rt.interpreter is None:
        return sys.executable, rt.spec
    here = runtimes.from_data({**rt.to_data(), "interpreter": None, "pins": []})
    return envs.interpreter_for(rt), here.spec


def breakdown(kind: str, spec: str, top: int = 6, requests: int = 500, conns: int = 10,
              small: int = 200, large: int = 1000, timeout: float = 600.0) -> dict:
    """Opcodes per echo request (``kind`` "echo") or per micro-benchmark operation of
    ``spec`` by function, counted by ``python -m bench.perf.opcodes --json`` in a child
    on the spec's interpreter: ``summary()``'s dict plus ``python``, the interpreter's
    version. RuntimeError when the count fails."""
    python, here = _child(kind, spec)
    args = ["--json", "--top", top, "--requests", requests, "--conns", conns,
            "--small", small, "--large", large]
    if kind != "echo":
        args += ["--micro", kind]
    proc = subprocess.run(procs.python_command("bench.perf.opcodes", *args, here, python=python),
                          cwd=procs.ROOT, env=procs.child_env(), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        said = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        raise RuntimeError(said[-1][-300:] if said else f"exit {proc.returncode}, no output")
    data = json.loads(lines[-1])
    if data.get("error"):
        raise RuntimeError(data["error"])
    return data


def table(counts: collections.Counter, top: int) -> list[str]:
    lines = [f"{v:9.1f}  {_where(f)}:{name}" for (f, name), v in counts.most_common(top) if v >= 0.05]
    rest = sum(counts.values()) - sum(v for _, v in counts.most_common(top))
    if abs(rest) >= 0.05:
        lines.append(f"{rest:9.1f}  (the other functions)")
    lines.append(f"{sum(counts.values()):9.1f}  total")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.perf.opcodes",
                                 description="Python opcodes per echo request or per "
                                             "micro-benchmark operation, by function.")
    ap.add_argument("runtimes", nargs="+", help="runtime specs, e.g. coro uvloop-streams")
    ap.add_argument("--micro", default=None, metavar="OP",
                    help="count a bench.perf.micro operation (spawn_join, yield, ...) instead")
    ap.add_argument("--requests", type=int, default=500, help="counted echo requests (default 500)")
    ap.add_argument("--conns", type=int, default=10, help="echo connections (default 10)")
    ap.add_argument("--small", type=int, default=200, help="micro: the smaller run (default 200)")
    ap.add_argument("--large", type=int, default=1000, help="micro: the larger run (default 1000)")
    ap.add_argument("--top", type=int, default=12, help="functions shown (default 12)")
    ap.add_argument("--json", action="store_true",
                    help="one JSON object a runtime: the top functions, the rest, the total")
    args = ap.parse_args(argv)
    try:
        if min(args.requests, args.conns, args.small, args.top) < 1 or args.large <= args.small:
            raise UsageError("--requests, --conns, --small and --top must be >= 1, "
                             "and --large above --small")
        if args.micro is not None:
            from bench.perf.micro import MICRO_OPS
            if args.micro not in MICRO_OPS:
                raise UsageError(f"unknown micro-benchmark {args.micro!r}; valid: "
                                 f"{', '.join(MICRO_OPS)}")
        for spec in args.runtimes:
            if spec == FLOOR:
                if args.micro != "spawn_join":
                    raise UsageError(f"{FLOOR} is counted for --micro spawn_join only")
                continue
            _parse(spec)
    except UsageError as exc:
        print(f"python -m bench.perf.opcodes: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    for spec in args.runtimes:
        what = f"per {args.micro} operation" if args.micro else "per echo request"
        try:
            if spec == FLOOR:
                counts = floor_opcodes(args.small, args.large)
            elif args.micro:
                counts = micro_opcodes(args.micro, spec, args.small, args.large)
            else:
                counts = echo_opcodes(spec, args.requests, args.conns)
        except (RuntimeError, ValueError, OSError) as exc:
            print(json.dumps({"runtime": spec, "error": str(exc)}) if args.json
                  else f"{spec}: error: {exc}", flush=True)
            continue
        except KeyboardInterrupt:
            print(f"python -m bench.perf.opcodes: interrupted at {spec}", file=sys.stderr)
            return ExitCode.INTERRUPTED
        if args.json:
            print(json.dumps({"runtime": spec, "per": what, "python": platform.python_version(),
                              **summary(counts, args.top)}), flush=True)
            continue
        print(f"{spec}: Python opcodes {what}")
        print("\n".join(table(counts, args.top)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
