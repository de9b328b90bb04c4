"""``looplab faults``: throw faulty peers at a TCP server and judge whether it survived.

Point it at any server (``looplab faults 127.0.0.1:9000 --app echo``), the user's own
included, or let it start ``looplab serve`` itself (``--serve RUNTIME``). After each
fault (bench/peers/faults.py) a healthy client of the app must be served correctly
within a few seconds; with ``--pid`` (implied by ``--serve``) the server's open file
descriptors and RSS are read from /proc before and after, so a fault that leaks
shows as fd growth. One table row per fault; exit 1 when a fault was not survived.

``--stress`` is the other mode: many concurrent active echo connections for a while,
every byte checked, on the given server or on each runtime named by ``--serve``.

A verb module: ``add_parser(subparsers)`` registers it; nothing here prints a
traceback for a user mistake (``UsageError``, exit 2) or a missing library
(``Unavailable``, exit 3), and all of that is checked before anything runs.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import socket
import sys
import tempfile
import threading
import time

from bench.host import envs, procs
from bench.peers import faults as faultpeers  # the faulty peers themselves
from bench.errors import ExitCode, Unavailable, UsageError
from bench import results as resmod
from bench.results.tables import fmt, fmt_bytes, format_table
from protocols import apps

#: How ``looplab serve`` ends on SIGTERM when it stops cleanly: 130, interrupted,
#: the exit code of every verb stopped by a signal (README, exit codes).
SIGTERM_EXIT = ExitCode.INTERRUPTED

__all__ = ["add_parser", "run", "ServedServer"]

SERVE_APPS = tuple(apps.APPS)
VERB_APPS = SERVE_APPS + ("raw",)          # raw: the user's own server, started by them
# What a Python traceback or an event loop's "exception in callback" report looks like.
_TRACEBACK = re.compile(rb"Traceback \(most recent call last\)|[Ee]xception in callback|"
                        rb"exception calling callback")


# ---------------------------------------------------------------------------
# /proc

def _raise_nofile(need: int) -> str:
    """Raise RLIMIT_NOFILE's soft limit (up to the hard one) when ``need`` fds would
    not fit; returns a note saying what it did, or ""."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= need:
        return ""
    new = need if hard == resource.RLIM_INFINITY else min(need, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    note = f"raised RLIMIT_NOFILE soft limit from {soft} to {new}"
    if new < need:
        note += f" (the hard limit); {need} were wanted, so some connections may fail"
    return note


# ---------------------------------------------------------------------------
# A server this verb starts itself

class ServedServer:
    """``looplab serve APP --runtime R --listen 127.0.0.1:0`` in a child process, its
    stderr in a temporary file (so a chatty server never blocks on a full pipe)."""

    def __init__(self, app: str, runtime: str, variant: str | None = None,
                 upstream=None, start_timeout_s: float = 20.0):
        from bench.host import envs      # the server runs in the runtime's own interpreter (@)
        cmd = procs.python_command("bench", "serve", app, "--runtime", runtime,
                                   "--listen", "127.0.0.1:0", python=envs.interpreter_for(runtime))
        if variant:
            cmd += ["--variant", variant]
        if app == "proxy":
            cmd += ["--upstream", "%s:%d" % tuple(upstream), "--forever"]
        self.cmd = cmd
        self._err = tempfile.TemporaryFile()
        self.proc = procs.spawn(cmd, stderr=self._err, cwd=None)
        self.address = None
        deadline = time.monotonic() + start_timeout_s
        line = b""
        try:
            os.set_blocking(self.proc.stdout.fileno(), False)
            while time.monotonic() < deadline and self.proc.poll() is None:
                chunk = self.proc.stdout.read() or b""
                line += chunk
                if b"\n" in line:
                    break
                time.sleep(0.02)
            m = re.match(rb"listening on ([\d.]+):(\d+)", line)
            if not m:
                raise RuntimeError(f"`{' '.join(cmd[2:])}` did not start: "
                                   f"{self.stderr()[-300:].strip() or 'no listening line'}")
            self.address = (m.group(1).decode(), int(m.group(2)))
        except BaseException:
            self.stop()
            raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stderr_bytes(self) -> bytes:
        self._err.seek(0)
        return self._err.read()

    def stderr(self) -> str:
        return self.stderr_bytes().decode("utf-8", "replace")

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM, wait; SIGKILL if it does not end. Returns the exit code from the
        SIGTERM (None when it had to be killed)."""
        rc = procs.stop(self.proc, grace_s=timeout_s, close_pipes=False)
        self.proc.stdout.close()
        return rc

    def close(self) -> None:
        if self.proc.poll() is None:
            self.stop()
        if not self.proc.stdout.closed:
            self.proc.stdout.close()
        self._err.close()


# ---------------------------------------------------------------------------
# The matrix

class Watch:
    """What the verb knows of the server besides its answers: its pid (fds, RSS,
    alive) and, when it started the server, its stderr."""

    def __init__(self, pid: int | None = None, server: ServedServer | None = None):
        self.pid = pid
        self.server = server
        self._err_seen = 0

    def fds(self):
        return None if self.pid is None else procs.fd_count(self.pid)

    def rss(self):
        return None if self.pid is None else procs.rss_bytes(self.pid)

    def alive(self) -> bool | None:
        if self.server is not None:
            return self.server.proc.poll() is None
        return None if self.pid is None else procs.alive(self.pid)

    def new_traceback(self) -> bool:
        """Did a traceback appear on the server's stderr since the last call?"""
        if self.server is None:
            return False
        err = self.server.stderr_bytes()
        new, self._err_seen = err[self._err_seen:], len(err)
        return bool(_TRACEBACK.search(new))

    def settle_fds(self, target: int | None, settle_s: float):
        """Wait up to ``settle_s`` for the fd count to fall to ``target``; the count then."""
        n = self.fds()
        if target is None or n is None:
            return n
        deadline = time.monotonic() + settle_s
        while n is not None and n > target and time.monotonic() < deadline:
            time.sleep(0.05)
            n = self.fds()
        return n


class PeakRSS:
    """The server's peak resident set while a fault runs, above what it was when the
    fault began: its ``VmHWM``, reset at the start where the kernel lets this process
    (``/proc/PID/clear_refs``), and ``VmRSS`` sampled every 10 ms in any case (a
    sample can miss a short peak; VmHWM cannot). RSS after settling cannot tell a
    server that queued megabytes and freed them on the reset from one that held
    nothing; the peak can. ``growth`` is None without a pid or /proc."""

    def __init__(self, pid: int | None):
        self.pid = pid
        self.base = self.peak = None
        self.growth = None
        self.hwm = False
        self._stop = threading.Event()
        self._thread = None

    def _sample(self):
        while not self._stop.wait(0.01):
            rss = procs.rss_bytes(self.pid)
            if rss is not None:
                self.peak = max(self.peak or 0, rss)

    def __enter__(self):
        if self.pid is not None:
            self.base = self.peak = procs.rss_bytes(self.pid)
            self.hwm = procs.reset_peak_rss(self.pid)
            if self.base is not None:
                self._thread = threading.Thread(target=self._sample, daemon=True,
                                                name="faults-peak-rss")
                self._thread.start()
        return self

    def __exit__(self, *exc):
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        if self.hwm:
            hwm = procs.rss_bytes(self.pid, "VmHWM")
            if hwm is not None:
                self.peak = max(self.peak or 0, hwm)
        self.growth = None if self.peak is None else self.peak - self.base


def run_matrix(addr, app: str, faults, limits, rounds: int = 1, watch: Watch | None = None,
               upstream=None, settle_s: float = 3.0, log=None, fail_fast: bool = False,
               healthy=None) -> dict:
    """Every fault ``rounds`` times against one server; returns {"baseline_fds",
    "final_fds", "rows": [one dict per fault]}. ``healthy``: the healthy client, with
    ``bench.peers.faults.healthy``'s signature and result (default: that one, for
    ``app``); ``looplab check`` passes one that speaks the app's HTTP or WebSocket."""
    watch = watch or Watch()
    healthy = healthy or faultpeers.healthy
    warm = healthy(app, addr, limits, upstream, seed=1)
    if not warm.ok:
        raise _NotServing(f"the server at {addr[0]}:{addr[1]} does not serve a healthy "
                          f"{app} client before any fault: {warm.why}")
    watch.new_traceback()
    time.sleep(0.2)
    baseline = watch.fds()
    rows = {f: {"fault": f, "rounds_count": 0, "survived_count": 0, "slow_count": 0,
                "hung_count": 0, "died": False, "traceback": False, "fd_growth_count": None,
                "rss_growth_bytes": None, "rss_peak_bytes": None, "health_s": None,
                "took_s": 0.0, "notes": []}
            for f in faults}
    seed = 10
    stopped = ""
    for rnd in range(rounds):
        for fault in faults:
            row = rows[fault]
            if stopped:
                if stopped not in row["notes"]:
                    row["notes"].append(stopped)
                continue
            seed += 1
            t_fault = time.monotonic()
            fds0, rss0 = watch.fds(), watch.rss()
            # the peak from the fault's start until it settled (so it is never below
            # the growth after settling)
            with PeakRSS(watch.pid) as peak:
                note, during = faultpeers.run_fault(fault, app, addr, limits, upstream, seed)
                after = healthy(app, addr, limits, upstream, seed)
                fds1 = watch.settle_fds(fds0, settle_s)
                rss1 = watch.rss()
            alive = watch.alive()
            died = (alive is False) or after.refused
            hung = after.timed_out or (during is not None and during.timed_out) \
                or note.startswith("FAIL: no EOF")
            slow = after.ok and (after.took_s > limits.slow_s or note.startswith("SLOW:"))
            tb = watch.new_traceback()
            growth = None if fds0 is None or fds1 is None else fds1 - fds0
            rgrowth = None if rss0 is None or rss1 is None else rss1 - rss0
            ok = (after.ok and not died and not note.startswith("FAIL")
                  and (during is None or during.ok) and not tb and not (growth or 0) > 0)
            row["rounds_count"] += 1
            row["survived_count"] += ok
            row["slow_count"] += slow
            row["hung_count"] += hung
            row["died"] = row["died"] or died
            row["traceback"] = row["traceback"] or tb
            if growth is not None:
                row["fd_growth_count"] = max(growth, row["fd_growth_count"] or 0) \
                    if row["fd_growth_count"] is not None else growth
            if rgrowth is not None:
                row["rss_growth_bytes"] = (row["rss_growth_bytes"] or 0) + rgrowth
            if peak.growth is not None:
                row["rss_peak_bytes"] = max(row["rss_peak_bytes"] or 0, peak.growth)
            row["health_s"] = max(row["health_s"] or 0.0, after.took_s)
            for text in (note, "" if after.ok else f"healthy client: {after.why}",
                         "traceback on the server's stderr" if tb else "",
                         f"{growth} fds still open {settle_s:g} s later" if (growth or 0) > 0 else ""):
                if text and text not in row["notes"]:
                    row["notes"].append(text)
            row["took_s"] += time.monotonic() - t_fault
            if log:
                log(f"round {rnd + 1} {fault} ({time.monotonic() - t_fault:.2f} s): "
                    f"{'survived' if ok else 'NOT survived'}"
                    f"{' (' + '; '.join(filter(None, [note, after.why])) + ')' if (note or after.why) else ''}")
            if died:
                stopped = "not run: the server died"
            elif fail_fast and not ok:
                stopped = "not run: --fail-fast"
    final = watch.settle_fds(baseline, settle_s)
    out = []
    for f in faults:
        r = rows[f]
        r["survived"] = r["rounds_count"] == rounds and r["survived_count"] == rounds
        out.append(r)
    return {"baseline_fds": baseline, "final_fds": final, "rows": out}


class _NotServing(Exception):
    pass


def _yes_no_count(n: int, rounds: int) -> str:
    if rounds == 1:
        return "yes" if n else "no"
    return f"{n}/{rounds}"


def matrix_table(result: dict, rounds: int) -> str:
    header = ["fault", "survived", "slow", "hung", "server died", "fd growth", "RSS peak",
              "RSS growth", "healthy client", "note"]
    rows = []
    for r in result["rows"]:
        rows.append([r["fault"],
                     "not run" if r["rounds_count"] == 0 else
                     _yes_no_count(r["survived_count"], rounds) if rounds > 1 else
                     ("yes" if r["survived"] else "NO"),
                     _yes_no_count(r["slow_count"], rounds), _yes_no_count(r["hung_count"], rounds),
                     "YES" if r["died"] else "no",
                     "-" if r["fd_growth_count"] is None else f"{r['fd_growth_count']:+d}",
                     "-" if r.get("rss_peak_bytes") is None else "+" + fmt_bytes(r["rss_peak_bytes"]),
                     "-" if r["rss_growth_bytes"] is None else
                     ("+" if r["rss_growth_bytes"] >= 0 else "") + fmt_bytes(r["rss_growth_bytes"]),
                     fmt("health_s", r["health_s"]), "; ".join(r["notes"])[:90] or ""])
    return format_table(header, rows, align="llllrrrrrl")


# ---------------------------------------------------------------------------
# Checking the command line before anything runs

def _parse_addr(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise UsageError(f"bad address {text!r}: expected HOST:PORT, e.g. 127.0.0.1:9000")
    try:
        socket.inet_aton(host)
    except OSError:
        if host != "localhost":
            raise UsageError(f"bad address {text!r}: HOST must be an IPv4 address such as "
                             "127.0.0.1") from None
        host = "127.0.0.1"
    return host, int(port)


def _probe(addr) -> None:
    try:
        socket.create_connection(addr, timeout=3.0).close()
    except OSError as exc:
        why = "nothing is listening" if isinstance(exc, ConnectionRefusedError) else str(exc)
        raise UsageError(f"cannot connect to {addr[0]}:{addr[1]}: {why}") from None


def _faults_list(text: str | None, app: str) -> list[str]:
    if not text or text == "all":
        names = list(faultpeers.FAULTS)
        if app == "raw":       # a raw server owes no answer, so half-close has no verdict
            names.remove("half-close")
        return names
    names = [n.strip() for n in text.split(",") if n.strip()]
    for n in names:
        if n not in faultpeers.FAULTS:
            raise UsageError(f"unknown fault {n!r}; valid faults: {', '.join(faultpeers.FAULTS)}")
    if app == "raw" and "half-close" in names:
        raise UsageError("half-close needs an app that answers (echo, sink, reqresp, push, proxy), "
                         "not raw")
    return list(dict.fromkeys(names))


def _json_path(path: str | None) -> str | None:
    # the rule of every verb's output paths (bench.results.check_output): missing
    # folders are created when the file is written; the check creates nothing
    return None if path is None else resmod.check_output(path, "--json")


def _write_json(path: str, doc: dict) -> None:
    """Atomic: a reader never sees half a file, an interrupted run leaves the old one."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".faults-", suffix=".json", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=2, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _runtimes(text: str, app: str, variant: str | None):
    from bench import runtimes
    rts = runtimes.parse_list(text)
    if not rts:
        raise UsageError("--serve needs a runtime, e.g. --serve coro")
    explicit = "all" not in text.split(",")
    usable, missing = [], []
    for rt in rts:
        reason = envs.unavailable_reason(rt)
        if reason is None:
            usable.append(rt)
        elif explicit:
            raise Unavailable(f"runtime {rt.id} is unavailable: {reason}")
        else:
            missing.append(f"{rt.id}: {reason}")
    if variant is not None:
        from protocols.common import driver
        for rt in usable:
            valid = driver(rt.style).VARIANTS[app]
            if variant not in valid:
                raise UsageError(f"unknown variant {variant!r} for {app} on {rt.id}; "
                                 f"valid: {', '.join(valid)}")
    return usable, missing


def _check_args(args) -> dict:
    """Every check that can fail on user input, before any socket or process opens."""
    plan = {}
    if args.rounds < 1 or args.rounds > 1000:
        raise UsageError(f"--rounds must be 1..1000, got {args.rounds}")
    for name in ("burst", "idle_many", "connections"):
        v = getattr(args, name)
        if not 1 <= v <= 100_000:
            raise UsageError(f"--{name.replace('_', '-')} must be 1..100000, got {v}")
    for name in ("hold", "duration", "timeout", "settle"):
        v = getattr(args, name)
        if not 0 < v <= 3600:
            raise UsageError(f"--{name} must be a number of seconds in (0, 3600], got {v}")
    plan["json"] = _json_path(args.json)
    if args.stress and args.app not in ("echo",):
        raise UsageError("--stress runs echo connections: use --app echo")
    if args.serve:
        if args.address:
            raise UsageError("give HOST:PORT or --serve RUNTIME, not both")
        if args.pid is not None:
            raise UsageError("--pid is implied by --serve (the verb watches the server it starts)")
        if args.app == "raw":
            raise UsageError(f"--serve starts `looplab serve APP`: choose --app from "
                             f"{', '.join(SERVE_APPS)}, not raw")
        if args.upstream:
            raise UsageError("--upstream is for a server you started; with --serve the verb "
                             "runs the proxy's upstream itself")
        plan["runtimes"], plan["missing"] = _runtimes(args.serve, args.app, args.variant)
        if len(plan["runtimes"]) > 1 and not args.stress:
            raise UsageError("the fault matrix serves one runtime at a time; give one --serve "
                             "RUNTIME (several are for --stress)")
    else:
        if not args.address:
            raise UsageError("give the server's HOST:PORT, or --serve RUNTIME to start one")
        if args.variant:
            raise UsageError("--variant is passed to the server --serve starts; your own "
                             "server already runs its variant")
        plan["addr"] = _parse_addr(args.address)
        if args.app == "proxy":
            if not args.upstream:
                raise UsageError("--app proxy needs --upstream HOST:PORT: the address your proxy "
                                 "forwards to, where this verb runs a sink to see what it relays")
            plan["upstream"] = _parse_addr(args.upstream)
        elif args.upstream:
            raise UsageError("--upstream is only for --app proxy")
        if args.pid is not None and (args.pid <= 0 or not procs.alive(args.pid)):
            raise UsageError(f"--pid {args.pid}: no such running process")
        _probe(plan["addr"])
    plan["faults"] = _faults_list(args.faults, args.app)
    return plan


# ---------------------------------------------------------------------------
# The verb

def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "faults", help="throw faulty peers at a TCP server and check it survives",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Throw faulty peers at a TCP server -- yours, or one `looplab serve` this "
                    "verb starts (--serve) -- and after each fault check that a healthy client "
                    "of the app is still served correctly. One row per fault; exit 1 when a "
                    "fault was not survived.\n\nfaults:\n" + "\n".join(
                        f"  {name:12} {text}" for name, text in faultpeers.FAULT_HELP.items()),
        epilog="examples:\n  looplab faults 127.0.0.1:9000 --app echo --pid 4242\n"
               "  looplab faults --serve coro --app push --variant drop --json push.json\n"
               "  looplab faults --serve ours,asyncio-streams --app echo --stress")
    p.add_argument("address", nargs="?", metavar="HOST:PORT",
                   help="the server to test (not with --serve)")
    p.add_argument("--app", required=True, choices=VERB_APPS,
                   help="what a healthy client expects: echo (bytes back), sink (takes frames, "
                        "closes on EOF), reqresp (b'REQ n\\n' -> 'RESP n size\\n'+body), push "
                        "(sends unasked), proxy (relays to --upstream), raw (only accepts)")
    p.add_argument("--faults", default=None, metavar="A,B,...",
                   help=f"comma list (default: all): {', '.join(faultpeers.FAULTS)}")
    p.add_argument("--rounds", type=int, default=1, help="run the whole list N times (default 1)")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the results here (atomic)")
    p.add_argument("--pid", type=int, default=None,
                   help="the server's process id: watch its open fds and RSS in /proc")
    p.add_argument("--serve", default=None, metavar="RUNTIME",
                   help="start `looplab serve APP --runtime RUNTIME --listen 127.0.0.1:0` (and a "
                        "proxy's upstream) and test that; SIGTERM must end it with exit 0 and no "
                        "traceback. --stress takes a comma list, 'ours' or 'all'")
    p.add_argument("--variant", default=None,
                   help="with --serve: the app variant (push: unbounded|block|drop|disconnect)")
    p.add_argument("--upstream", default=None, metavar="HOST:PORT",
                   help="--app proxy on your own server: where your proxy forwards to; the verb "
                        "listens there with a sink and checks the relayed bytes")
    p.add_argument("--burst", type=int, default=200, help="burst: connections (default 200)")
    p.add_argument("--idle-many", type=int, default=1000, dest="idle_many",
                   help="idle-many: concurrent connections (default 1000)")
    p.add_argument("--hold", type=float, default=1.0,
                   help="seconds idle and stalling peers are held (default 1)")
    p.add_argument("--timeout", type=float, default=5.0,
                   help="seconds the healthy client and a half-close's EOF may take (default 5)")
    p.add_argument("--settle", type=float, default=3.0,
                   help="seconds the server's fd count may take to fall back after a fault "
                        "before the rest counts as a leak (default 3)")
    p.add_argument("--fail-fast", action="store_true", dest="fail_fast",
                   help="stop at the first fault not survived")
    p.add_argument("--stress", action="store_true",
                   help="instead of faults: --connections active echo connections for --duration "
                        "seconds, every byte checked")
    p.add_argument("--connections", type=int, default=1000, help="--stress: connections (default 1000)")
    p.add_argument("--duration", type=float, default=10.0, help="--stress: seconds (default 10)")
    p.add_argument("--quiet", action="store_true", help="no per-fault progress lines on stderr")
    p.set_defaults(func=run)


def _log(args):
    if args.quiet:
        return None
    return lambda line: print(f"faults: {line}", file=sys.stderr, flush=True)


def run(args) -> ExitCode:
    """The verb: check everything, then run the fault matrix or the stress mode."""
    plan = _check_args(args)
    need = (args.connections if args.stress else args.idle_many) + 64
    note = _raise_nofile(2 * need if args.serve else need)
    if note:
        print(f"faults: {note}", file=sys.stderr)
    limits = faultpeers.Limits(burst=args.burst, idle_many=args.idle_many, hold_s=args.hold,
                               health_timeout_s=args.timeout, eof_timeout_s=args.timeout)
    if args.stress:
        return _run_stress(args, plan)
    return _run_faults(args, plan, limits)


def _run_faults(args, plan, limits) -> ExitCode:
    log = _log(args)
    upstream = server = None
    doc = {"schema": 1, "kind": "faults", "app": args.app, "faults": plan["faults"],
           "rounds": args.rounds, "limits": vars(limits)}
    verdicts: list[str] = []
    failed = False
    try:
        if args.app == "proxy":
            where = plan.get("upstream") or ("127.0.0.1", 0)
            try:
                upstream = faultpeers.Upstream(*where)
            except OSError as exc:
                raise UsageError(f"cannot listen on --upstream {where[0]}:{where[1]} for the "
                                 f"proxy's upstream sink: {exc.strerror}") from None
        if args.serve:
            rt = plan["runtimes"][0]
            try:
                server = ServedServer(args.app, rt.spec, args.variant,
                                      upstream.address if upstream else None)
            except RuntimeError as exc:
                print(f"looplab faults: {exc}", file=sys.stderr)
                return ExitCode.FAILED
            addr, watch = server.address, Watch(server.pid, server)
            doc.update(runtime=rt.spec, variant=args.variant, target="%s:%d" % addr)
        else:
            addr, watch = plan["addr"], Watch(args.pid)
            doc.update(target="%s:%d" % addr, pid=args.pid)
        try:
            result = run_matrix(addr, args.app, plan["faults"], limits, args.rounds, watch,
                                upstream, settle_s=args.settle, log=log,
                                fail_fast=args.fail_fast)
        except _NotServing as exc:
            print(f"looplab faults: {exc}", file=sys.stderr)
            return ExitCode.FAILED
        doc.update(result)
        failed = not all(r["survived"] for r in result["rows"])
        base, final = result["baseline_fds"], result["final_fds"]
        if base is not None:
            back = final is not None and final <= base
            verdicts.append(f"fds: {final} at the end, baseline {base}"
                            f"{'' if back else ' -- NOT back to baseline'}")
            failed |= not back
        if server is not None:
            rc = server.stop()
            tb = bool(_TRACEBACK.search(server.stderr_bytes()))
            doc.update(sigterm_exit=rc, stderr_traceback=tb, stderr_tail=server.stderr()[-2000:])
            verdicts.append(f"SIGTERM: exit {rc if rc is not None else 'none (killed after 10 s)'}"
                            f"{'' if rc == SIGTERM_EXIT else f' -- expected {SIGTERM_EXIT}'}")
            verdicts.append("stderr: " + ("a TRACEBACK (see --json stderr_tail)" if tb else "no traceback"))
            failed |= rc != SIGTERM_EXIT or tb
        what = f"{args.app}{'/' + args.variant if args.variant else ''} on " + \
            (doc.get("runtime") or doc["target"])
        print(f"looplab faults: {what}, {len(plan['faults'])} faults x {args.rounds} round(s)")
        print(matrix_table(result, args.rounds))
        for v in verdicts:
            print(v)
        doc["ok"] = not failed
        print("result: " + ("every fault survived" if not failed else "NOT SURVIVED"))
        if plan["json"]:
            _write_json(plan["json"], doc)
        return ExitCode.FAILED if failed else ExitCode.OK
    finally:
        if server is not None:
            server.close()
        if upstream is not None:
            upstream.close()


def _stress_row(name: str, res: dict, growth, rss) -> list:
    return [name, f"{res['held_count']:,}/{res['connections_count']:,}",
            fmt("round_trips_count", res["round_trips_count"]),
            fmt("min_round_trips_count", res["min_round_trips_count"]),
            fmt_bytes(res["echoed_bytes"]), fmt("mismatches_count", res["mismatches_count"]),
            fmt("lost_count", res["lost_count"]),
            "-" if growth is None else f"{growth:+d}", "-" if rss is None else fmt_bytes(rss),
            "ok" if res["ok"] else "FAILED"]


def _stress_ok(res: dict) -> bool:
    return (res["held_count"] == res["connections_count"] and res["mismatches_count"] == 0
            and res["lost_count"] == 0 and not res["errors"] and res["min_round_trips_count"] > 0)


def _run_stress(args, plan) -> ExitCode:
    log = _log(args)
    rows, docs = [], []
    targets = [(rt.spec, rt) for rt in plan["runtimes"]] if args.serve else [(args.address, None)]
    for name, rt in targets:
        server = None
        try:
            if rt is not None:
                try:
                    server = ServedServer("echo", rt.spec)
                except RuntimeError as exc:
                    res = {"connections_count": args.connections, "held_count": 0,
                           "round_trips_count": 0, "min_round_trips_count": 0, "echoed_bytes": 0,
                           "mismatches_count": 0, "lost_count": 0, "errors": [str(exc)]}
                    res["ok"] = False
                    rows.append(_stress_row(name, res, None, None))
                    docs.append(dict(res, runtime=name))
                    continue
                addr, pid = server.address, server.pid
            else:
                addr, pid = plan["addr"], args.pid
            # One client first: a server may open fds lazily on its first connection.
            faultpeers.healthy("echo", addr, faultpeers.Limits())
            time.sleep(0.2)
            fds0 = procs.fd_count(pid) if pid else None
            rss0 = procs.rss_bytes(pid) if pid else None
            if log:
                log(f"stress {name}: {args.connections} connections for {args.duration:g} s")
            res = faultpeers.stress_echo(addr, args.connections, args.duration)
            rss1 = procs.rss_bytes(pid) if pid else None
            w = Watch(pid, server)
            fds1 = w.settle_fds(fds0, args.settle) if pid else None
            growth = None if fds0 is None or fds1 is None else fds1 - fds0
            res["ok"] = _stress_ok(res) and not (growth or 0) > 0
            if server is not None:
                rc = server.stop()
                tb = bool(_TRACEBACK.search(server.stderr_bytes()))
                res.update(sigterm_exit=rc, stderr_traceback=tb)
                if rc != SIGTERM_EXIT or tb:
                    res["ok"] = False
                    res["errors"].append(f"SIGTERM exit {rc}" + (", traceback on stderr" if tb else ""))
            res.update(runtime=name, fd_growth_count=growth,
                       rss_growth_bytes=None if rss0 is None or rss1 is None else rss1 - rss0)
            rows.append(_stress_row(name, res, growth, res["rss_growth_bytes"]))
            docs.append(res)
        finally:
            if server is not None:
                server.close()
    print(f"looplab faults --stress: {args.connections:,} active echo connections x "
          f"{args.duration:g} s, 512-byte round trips, every byte checked")
    print(format_table(["server", "held", "round trips", "min per conn", "echoed", "mismatches",
                        "lost", "fd growth", "RSS growth", "verdict"], rows,
                       align="lrrrrrrrrl"))
    for d in docs:
        for e in d["errors"][:3]:
            print(f"{d['runtime']}: {e}")
    for m in plan.get("missing", []):
        print(f"skipped {m}")
    failed = not all(d["ok"] for d in docs)
    if plan["json"]:
        _write_json(plan["json"], {"schema": 1, "kind": "stress", "connections": args.connections,
                                   "duration_s": args.duration, "rows": docs, "ok": not failed})
    return ExitCode.FAILED if failed else ExitCode.OK
