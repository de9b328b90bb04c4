"""Running the probe workers: one ``python -m bench.fidelity.worker`` process per runtime,
a few at a time, each read line by line as it reports (so no worker ever blocks on a
full pipe while another is waited for).

A worker is judged probe by probe, not only as a whole:

* a worker that **dies** (a loop that aborts or kills the interpreter) charges the probe
  it was running with how it died, and a fresh worker runs the probes after it;
* a worker that **stalls** -- no record for ``STALL_S`` after its first one, although
  each probe has its own time limit (``worker.PROBE_TIMEOUT_S``; a loop blocked in C
  code never sees that alarm) -- is killed, the probe it was running is charged, and a
  fresh worker runs the rest;
* a worker that **overruns** its whole time budget is killed and its unfinished probes
  get an error (no restart: the budget is spent).

At most ``MAX_RESTARTS`` fresh workers per runtime.
"""
from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import time

STALL_S = 30.0
MAX_RESTARTS = 20


def budget(n_probes: int) -> float:
    """A worker's whole time budget for ``n_probes``: generous, since each probe is
    bounded on its own; it only stops a runaway."""
    return 60.0 + 3.0 * n_probes


def died(code: int, err: str) -> str:
    """How a worker ended, in one line: its exit status (the signal's name when a signal
    killed it) and the last line it wrote to stderr."""
    how = f"exited with {code}"
    if code < 0:
        try:
            how = f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            pass
    last = (err.strip().splitlines() or ["?"])[-1][:120]
    return f"runtime process {how}: {last}"


class _Worker:
    def __init__(self, rid, names, restarts, cmd, env, cwd, timeout):
        self.rid, self.names, self.restarts = rid, names, restarts
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=env, cwd=cwd)
        # no stall is counted before the first record: starting up has the whole budget
        self.began, self.active = time.monotonic(), None
        self.timeout = budget(len(names)) if timeout is None else timeout
        self.out, self.err, self.open = b"", b"", 2


def run(todo, command, env, cwd, parallel, timeout, on_record, stall=None) -> dict:
    """Run ``todo`` [(runtime, [probe names])]: {runtime: {probe: record}}. ``command``
    (runtime, names) -> argv; ``on_record(runtime, record)`` sees every line (the meta
    line too); ``stall``: seconds without a record before a worker is killed
    (``STALL_S``)."""
    stall = STALL_S if stall is None else stall
    results = {rid: {} for rid, _ in todo}
    queue = [(rid, ns, 0) for rid, ns in todo if ns]
    sel, running, started = selectors.DefaultSelector(), [], []

    def start(rid, ns, restarts):
        w = _Worker(rid, ns, restarts, command(rid, ns), env, cwd, timeout)
        started.append(w.proc)
        for stream in (w.proc.stdout, w.proc.stderr):
            os.set_blocking(stream.fileno(), False)
            sel.register(stream, selectors.EVENT_READ, w)
        running.append(w)

    def lines(w):
        *done, w.out = w.out.split(b"\n")
        for raw in done:
            try:
                rec = json.loads(raw.decode("utf-8", "replace"))
            except ValueError:
                continue
            if not isinstance(rec, dict):
                continue
            w.active = time.monotonic()
            on_record(w.rid, rec)
            if "probe" in rec:
                results[w.rid][rec["probe"]] = rec

    def finish(w, failure, restart):
        running.remove(w)
        for stream in (w.proc.stdout, w.proc.stderr):
            try:
                sel.unregister(stream)
            except (KeyError, ValueError):
                pass
            stream.close()
        recs = results[w.rid]
        missing = [n for n in w.names if n not in recs]
        if failure and restart and missing:
            recs[missing[0]] = {"probe": missing[0], "error": f"{failure} while this probe ran"}
            if missing[1:] and w.restarts < MAX_RESTARTS:
                queue.insert(0, (w.rid, missing[1:], w.restarts + 1))
                return
        for n in w.names:
            recs.setdefault(n, {"probe": n, "error": failure or "no result"})

    try:
        while queue or running:
            while queue and len(running) < parallel:
                start(*queue.pop(0))
            for key, _ in sel.select(timeout=0.5):
                w, stream = key.data, key.fileobj
                try:
                    data = os.read(stream.fileno(), 65536)
                except BlockingIOError:
                    continue
                if not data:
                    sel.unregister(stream)
                    w.open -= 1
                elif stream is w.proc.stdout:
                    w.out += data
                    lines(w)
                else:
                    w.err = (w.err + data)[-4096:]
            now = time.monotonic()
            for w in list(running):
                if w.open == 0:
                    code = w.proc.wait()
                    lines(w)
                    err = w.err.decode("utf-8", "replace")
                    finish(w, None if code == 0 else died(code, err), restart=code != 0)
                elif now - w.began > w.timeout:
                    w.proc.kill()
                    w.proc.wait()
                    finish(w, f"runtime process timed out after {w.timeout:g} s", restart=False)
                elif w.active is not None and now - w.active > stall:
                    w.proc.kill()
                    w.proc.wait()
                    finish(w, f"runtime process gave no result for {stall:g} s and was killed",
                           restart=True)
    finally:
        # interrupted (Ctrl-C): no worker outlives the run
        for proc in started:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for stream in (proc.stdout, proc.stderr):
                if not stream.closed:
                    stream.close()
        sel.close()
    return results
