"""The cell's processes, seen from the orchestrator: what a scenario's ``run`` gets
(``CellContext``) and uses to start the app under test and its peers
(``serve_app``, ``run_program``; a program gets a ``Job``), and the processes they
start (``AppProcess``), which ``abort_running`` ends.

Part of the public scenario API: ``bench.scenarios.api`` re-exports every public name
here, and its docstring describes them. This module knows nothing of the
scenario registry; it only tells a cell process what this one loaded
(``plugin_spec``, from ``_LOADED``, which the registry fills in).
"""
from __future__ import annotations

import json
import os
import queue
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from bench.host import procs
from bench.errors import CRASH_KEY
from bench.peers import PeerProcess
from protocols import apps

__all__ = ["APP", "CellContext", "Job", "AppProcess", "abort_running", "Served", "Ran",
           "serve_app", "run_program", "plugin_spec", "mark_app_gone"]

APP = "app"            # a peer's ``connect=APP``: connect to the app under test
_LOADED = {"files": [], "modules": [], "runtime_modules": []}      # what this process loaded: the cells load it too


def plugin_spec() -> dict:
    """What a cell process must load to see the same scenarios and runtimes as this one."""
    return {"scenario_files": list(_LOADED["files"]), "scenario_modules": list(_LOADED["modules"]),
            "runtime_modules": list(_LOADED["runtime_modules"])}


# ---------------------------------------------------------------------------
# What a run function gets, and what a program gets

@dataclass
class CellContext:
    """One repeat of one cell, as its scenario's ``run`` sees it."""
    scenario: Any             # the bench.scenarios.api.Scenario of the cell
    runtime: Any              # bench.runtimes.Runtime
    variant: str
    preset: str
    params: dict
    trace_path: str | None = None
    notes: list = field(default_factory=list)
    sim: Any = None           # --net sim: a bench.scenarios.simulated.SimCell (the world this cell runs in)
    peers_seen: dict = field(default_factory=dict)   # name -> result of every peer this repeat ran

    @property
    def style(self) -> str:
        return self.runtime.style


@dataclass
class Job:
    """What a program gets in the cell process."""
    runtime: Any              # bench.runtimes.Runtime: job.runtime.open() -> a port
    variant: str
    params: dict
    peers: dict               # name -> (host, port) of the listening peers

    def peer(self, name: str) -> tuple[str, int]:
        try:
            return tuple(self.peers[name])
        except KeyError:
            raise KeyError(f"no listening peer {name!r}; peers: {', '.join(self.peers)}") from None


# ---------------------------------------------------------------------------
# The cell process, seen from here

_RUNNING: set = set()          # live AppProcess and PeerProcess objects (abort_running ends them)
_RUNNING_LOCK = threading.Lock()


class AppProcess:
    """``python -m bench.scenarios.appside SPEC`` with its stdout read by a thread. Leaving the
    with-block always ends the process (SIGINT, then kill)."""

    def __init__(self, spec: dict, runtime, program_file: str | None = None):
        # The runtime travels parsed, as data: the child rebuilds it without parsing.
        spec = {**spec, "runtime": runtime.to_data(), "plugins": plugin_spec()}
        from bench.host import envs      # the interpreter axis: the runtime's @INTERPRETER
        # The one place a cell's process is launched, on its runtime's interpreter: the
        # app side, or in a bare environment (no looplab) the scenario's standalone
        # program, which speaks the same JSON lines.
        python = envs.interpreter_for(runtime)
        if program_file:
            self.proc = procs.spawn([python, program_file, json.dumps(spec)], text=True,
                                    cwd=envs.cache_root(), env=envs.bare_env_vars())
        else:
            self.proc = procs.spawn(procs.python_command("bench.scenarios.appside", json.dumps(spec),
                                                         python=python),
                                    text=True, cwd=None, env=os.environ.copy())
        self.events: queue.Queue = queue.Queue()
        self.stderr_lines: list[str] = []
        self._threads = [threading.Thread(target=self._read_stdout, daemon=True),
                         threading.Thread(target=self._read_stderr, daemon=True)]
        for t in self._threads:
            t.start()

    def _read_stdout(self):
        for line in self.proc.stdout:
            try:
                self.events.put(json.loads(line))
            except ValueError:
                self.stderr_lines.append(line.rstrip())
        self.events.put({"event": "eof"})

    def _read_stderr(self):
        for line in self.proc.stderr:
            self.stderr_lines.append(line.rstrip())

    def wait(self, name: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                state = "still running" if self.proc.poll() is None else f"exit code {self.proc.poll()}"
                tail = " | ".join(self.stderr_lines[-3:])
                raise TimeoutError(f"app process gave no {name!r} within {timeout:.0f} s "
                                   f"({state}){': ' + tail if tail else ''}")
            try:
                ev = self.events.get(timeout=left)
            except queue.Empty:
                continue
            if ev.get("event") == name:
                return ev
            if ev.get("event") == "result" and CRASH_KEY in ev:
                raise RuntimeError(f"app side: {ev[CRASH_KEY]}")
            if ev.get("event") == "eof":
                tail = " | ".join(self.stderr_lines[-3:])
                raise RuntimeError(f"app process exited (code {self.proc.wait()}) before {name!r}: {tail}")

    def result(self, timeout: float) -> dict:
        """The app side's result; the error it reported is raised."""
        out = self.wait("result", timeout)
        if CRASH_KEY in out:
            raise RuntimeError(f"app side: {out[CRASH_KEY]}")
        return out

    def interrupt(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()

    def __enter__(self):
        with _RUNNING_LOCK:
            _RUNNING.add(self)
        return self

    def __exit__(self, *exc):
        with _RUNNING_LOCK:
            _RUNNING.discard(self)
        procs.stop(self.proc, first=signal.SIGINT, grace_s=3, close_pipes=False)
        for t in self._threads:
            t.join(2)
        self.proc.stdout.close()
        self.proc.stderr.close()


class _Peers(PeerProcess):
    def __enter__(self):
        super().__enter__()
        with _RUNNING_LOCK:
            _RUNNING.add(self)
        return self

    def __exit__(self, *exc):
        with _RUNNING_LOCK:
            _RUNNING.discard(self)
        super().__exit__(*exc)

    def kill(self):
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()


def abort_running() -> None:
    """Kill every cell and peer process still running, and stop every simulated
    cell's world (an interrupted matrix)."""
    with _RUNNING_LOCK:
        live = list(_RUNNING)
    for p in live:
        p.kill()
    simcells = sys.modules.get("bench.scenarios.simulated")     # no simulated cell without it
    if simcells is not None:
        simcells.stop_all("interrupted")


# ---------------------------------------------------------------------------
# Building blocks

@dataclass
class Served:
    app: dict                 # probe, counters, rss_growth_bytes, interrupted
    peers: dict               # name -> the peer's result


@dataclass
class Ran:
    app: dict                 # what the program returned (+ rss_growth_bytes)
    peers: dict
    stopped_at: float | None  # time.monotonic() when the program returned


def _bound(roles) -> float:
    return max([float(r.get("max_s") or 10.0) for r in roles] or [10.0])


#: A peer counts as having waited for an app that was gone only if it waited at
#: least this long after the app ended (or this share of its run): a starved peer
#: process, late by a scheduling slice, is not a finding.
GONE_MARGIN_S, GONE_MARGIN_SHARE = 0.5, 0.1


def mark_app_gone(peers: dict, *, started_at: float, app_ended_at: float | None = None,
                  ended_how: str = "") -> None:
    """A peer that never got its connection because the app was gone is a finding,
    not missing evidence: mark it (``app_gone``: the cause, in words) so the
    evidence rule (``Scenario.judge``) lets the verdicts stand. Gone means: a peer
    that dialed the app was refused (nothing listened any more: the app had exited
    or closed its listener), or a listening peer was still waiting, well within its
    time, when the app had already ended (``app_ended_at``, on the peers' clock;
    ``started_at``: when the peers began). A peer that simply ran out of time while
    the app still ran -- a starved or overloaded cell -- is not marked."""
    for name, res in peers.items():
        if res.get("connected") or res.get("app_gone"):
            continue
        error = str(res.get("error") or "")
        if res.get("ended") == "error" and ("refused" in error.lower() or "errno 111" in error.lower()):
            res["app_gone"] = "the app stopped accepting (its connection was refused)"
            continue
        if app_ended_at is None or res.get("ended") != "timeout":
            continue
        waited = started_at + float(res.get("ran_s") or 0.0) - app_ended_at
        if waited >= max(GONE_MARGIN_S, GONE_MARGIN_SHARE * float(res.get("ran_s") or 0.0)):
            res["app_gone"] = (f"the app had ended ({ended_how or 'it returned'} "
                               f"{app_ended_at - started_at:.2f} s in) and never connected "
                               f"to it; it waited {waited:.2f} s more")


def serve_app(ctx: CellContext, app: str, *, peers=(), params: dict | None = None,
              upstream: str | None = None, timeout_s: float | None = None) -> Served:
    """Serve ``app`` on the runtime under test with ``peers`` around it (see the
    module docstring). Peers with ``connect=APP`` start once the app listens."""
    if ctx.sim is not None:   # --net sim: the same app and peers, in one simulated world
        from bench.scenarios import simulated as simcells
        began = ctx.sim.world.now
        served = Served(*simcells.serve_app(ctx, app, peers=peers, params=params, upstream=upstream,
                                            bound=timeout_s or _bound(peers) + 10, app_marker=APP))
        mark_app_gone(served.peers, started_at=began)
        ctx.peers_seen.update(served.peers)
        return served
    roles, to_app = [], []
    for r in peers:
        r = dict(r)
        if r.get("connect") == APP:
            r.pop("connect")
            r["deferred"] = True
            to_app.append(r.get("name") or r["role"])
        roles.append(r)
    bound = timeout_s or _bound(roles) + 10
    params = dict(params or {})
    spec = {"kind": "server", "app": app, "variant": ctx.variant,
            "max_s": bound, "trace_path": ctx.trace_path, "params": params}
    with _Peers(roles, timeout_s=bound) as pp:
        if upstream:
            params["upstream"] = list(pp.address(upstream))
        with AppProcess(spec, ctx.runtime) as proc:
            addr = proc.wait("listening", 20)["addr"]
            for name in to_app:
                pp.start(name, connect=tuple(addr))
            res = pp.results()
            out = None
            if apps.get(app).one_shot and not params.get("forever"):
                # It ends by itself after its one connection; a SIGINT now would race
                # its shutdown (uvloop re-raises a caught SIGINT inside the close).
                try:
                    out = proc.result(5)
                except TimeoutError:
                    pass
            if out is None:
                proc.interrupt()
                out = proc.result(10)
    mark_app_gone(res, started_at=0.0)       # refused: nothing listened any more
    ctx.peers_seen.update(res)
    return Served(out, res)


def run_program(ctx: CellContext, *, peers=(), linger_s: float = 0.0,
                max_s: float | None = None) -> Ran:
    """Run the scenario's program for this runtime in a cell process, with the
    listening ``peers`` started first (see the module docstring)."""
    if ctx.sim is not None:   # --net sim: the same program and peers, in one simulated world
        from bench.scenarios import simulated as simcells
        began = ctx.sim.world.now
        ran = Ran(*simcells.run_program(
            ctx, lambda addrs: Job(ctx.runtime, ctx.variant, dict(ctx.params), addrs),
            peers=peers, linger_s=linger_s, bound=max_s or _bound(peers)))
        if CRASH_KEY in ran.app:     # as a cell process's failed program is on real sockets
            raise RuntimeError(f"app side: {ran.app[CRASH_KEY]}")
        mark_app_gone(ran.peers, started_at=began, app_ended_at=ran.stopped_at,
                      ended_how="its program returned")
        ctx.peers_seen.update(ran.peers)
        return ran
    roles = [dict(r) for r in peers]
    bound = max_s or _bound(roles)
    spec = {"kind": "program", "scenario": ctx.scenario.id,
            "variant": ctx.variant, "params": ctx.params, "linger_s": linger_s, "max_s": bound}
    from bench.host import envs
    program_file = None
    if envs.is_bare(ctx.runtime):
        program_file = getattr(ctx.scenario, "program_file", "")
        if not program_file:
            raise RuntimeError(f"{ctx.runtime.spec} runs below looplab's minimum and "
                               f"{ctx.scenario.id} has no standalone program_file for it")
    if not roles:
        with AppProcess({**spec, "peers": {}}, ctx.runtime, program_file) as proc:
            stopped = proc.wait("stopped", bound + 10)["at"]
            return Ran(proc.result(linger_s + 10), {}, stopped)
    began = time.monotonic()        # the peers begin after this, on the same clock
    with _Peers(roles, timeout_s=bound + 5) as pp:
        addrs = {r.get("name") or r["role"]: list(pp.address(r.get("name") or r["role"]))
                 for r in roles if r.get("listen")}
        with AppProcess({**spec, "peers": addrs}, ctx.runtime, program_file) as proc:
            stopped = proc.wait("stopped", bound + 10)["at"]
            out = proc.result(linger_s + 10)
        res = pp.results()
    # once its program returned the app dials no one: a peer still waiting then
    mark_app_gone(res, started_at=began, app_ended_at=stopped, ended_how="its program returned")
    ctx.peers_seen.update(res)
    return Ran(out, res, stopped)
