"""The app side of one cell, in its own process: ``python -m bench.scenarios.appside JSON``.

Each cell's kernel under test runs here, alone, so its RSS, its leaks and its crashes
are its own. The parent side is ``bench.scenarios.context.AppProcess``; it talks to this
process over stdout, one JSON object per line:

  {"event": "listening", "addr": [host, port]}   a server is accepting
  {"event": "stopped", "at": T}                    a program returned (time.monotonic())
  {"event": "result", ...}                         what the app side measured

The spec (JSON, in argv) says what to run -- ``kind`` "server" (``app``, ``variant``,
``params`` served through the runtime's port driver) or "program" (the ``scenario``
whose program for this runtime runs, with ``variant``, ``params`` and the listening
``peers``' addresses) -- on ``runtime`` (the parsed spec as data:
``Runtime.to_data()``), bounded by ``max_s``. ``plugins`` names the
scenario files and modules (and runtime modules) the parent had loaded: they are
loaded here first, so a user's scenario, its programs and its runtimes exist here too.

A server runs until its app finishes (the one-shot proxy) or the orchestrator sends
SIGINT; ``max_s`` bounds it regardless. RSS growth is the peak resident set during
the run (VmHWM, reset before the run where the kernel allows) minus the resident set
just before it.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

from bench import results, runtimes
from bench.errors import one_line
from bench.host import procs
from bench.scenarios import api
from protocols.common import driver
from protocols.ports import bind_listener


def emit(obj) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _deadline(max_s: float) -> threading.Timer:
    """Bound every run: after max_s, interrupt the main thread as Ctrl-C would."""
    timer = threading.Timer(max_s, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.daemon = True
    timer.start()
    return timer


def run_server(spec: dict) -> dict:
    rt = runtimes.from_data(spec["runtime"])
    params = dict(spec.get("params", {}))
    if params.get("upstream"):
        params["upstream"] = tuple(params["upstream"])
    counters: dict = {}
    params["counters"] = counters
    sock = bind_listener("127.0.0.1", 0, sockbuf=params.get("sockbuf"))
    serve = driver(rt.style).serve
    port = rt.open()
    emit({"event": "listening", "addr": list(sock.getsockname()[:2])})
    interrupted = False
    base = procs.rss_bytes("self", "VmRSS")
    procs.reset_peak_rss()
    timer = _deadline(spec.get("max_s", 60))
    try:
        try:
            serve(port, spec["app"], sock, spec["variant"], params)
        except* KeyboardInterrupt:
            interrupted = True
    finally:
        # Done either way: a late SIGINT from the orchestrator must not cut the report.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        timer.cancel()
        peak = procs.rss_bytes("self", "VmHWM")
        try:
            port.close()
        except KeyboardInterrupt:   # uvloop re-raises a SIGINT it caught on its next run
            interrupted = True
            port.close()
        sock.close()
    trace = port.trace() if hasattr(port, "trace") else None
    if spec.get("trace_path") and trace is not None:
        results.write_text(spec["trace_path"], json.dumps(trace.to_chrome()))
    return {"probe": port.probe(), "counters": counters, "interrupted": interrupted,
            "rss_growth_bytes": (peak - base) if peak is not None and base is not None else None}


def run_program(spec: dict) -> dict:
    rt = runtimes.from_data(spec["runtime"])
    fn = api.get(spec["scenario"]).program_for(rt)
    job = api.Job(rt, spec.get("variant", "naive"), dict(spec.get("params", {})),
                       {k: tuple(v) for k, v in spec.get("peers", {}).items()})
    # Import the runtime's library before the baseline, so RSS growth is the program's
    # and not 2-4 MB of imports, and compares across runtimes (the server path opens its
    # port before its baseline for the same reason).
    rt.unavailable_reason()
    base = procs.rss_bytes("self", "VmRSS")
    procs.reset_peak_rss()
    timer = _deadline(spec.get("max_s", 60))
    try:
        result = fn(job)
    finally:
        timer.cancel()
    if not isinstance(result, dict):
        raise TypeError(f"the program of {spec['scenario']} returned {type(result).__name__}, not a dict")
    if "event" in result:       # the key of the line it travels on (bench.scenarios.api.CRASH_KEY is the other)
        raise ValueError(f"the program of {spec['scenario']} returned the reserved key 'event'")
    result["loop_stopped_at"] = time.monotonic()
    peak = procs.rss_bytes("self", "VmHWM")
    result["rss_growth_bytes"] = (peak - base) if peak is not None and base is not None else None
    # Stay alive so the peer can tell "the close completed" from "the process exited".
    emit({"event": "stopped", "at": result["loop_stopped_at"]})
    time.sleep(spec.get("linger_s", 0.0))
    return result


def main(argv: list[str]) -> int:
    # SIGINT is how the orchestrator ends a server cell. A parent started in the
    # background of a shell (``looplab run ... &``) passes SIGINT down ignored, and
    # a runtime that honours an inherited SIG_IGN would then never stop.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    spec = json.loads(argv[1] if len(argv) > 1 else sys.stdin.read())
    kind = spec["kind"]
    runner = {"server": run_server, "program": run_program}[kind]
    result = {api.CRASH_KEY: "interrupted"}
    try:
        api.load_plugin_spec(spec.get("plugins") or {})
        result = runner(spec)
    except* KeyboardInterrupt:
        pass
    except* Exception as group:   # reported to the parent as this cell's error, one line
        # One line, but with the innermost frame: a rare failure must still say where.
        result = {api.CRASH_KEY: one_line(group.exceptions[0])}
    emit({"event": "result", **result})
    return 1 if api.CRASH_KEY in result else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
