"""Echo measurements and what is computed from them: one measured run, the interleaved
matrix of runs, paired per-round ratios against a baseline, the connection curve, and
server memory per idle connection.

How a measurement keeps itself honest:

* **The server is alone on its CPU.** Every measurement starts a fresh server process
  (``python -m bench serve echo --runtime R --variant naive``) pinned to the first CPU, and
  the load client pinned to the second (``bench.perf.machine``, ``bench.perf.loadgen``).
* **Noise is measured, not assumed away.** Runtimes are interleaved in rounds whose order
  rotates so nobody always goes first; each run has an uncounted warm-up; during the
  counted window /proc says how much CPU other processes used and how much the hypervisor
  stole. Such runs are flagged ``noisy`` and kept (dropping them would bias toward lucky
  runs), and the tables mark them.
* **Only ratios travel.** Absolute numbers drift ~20 % between sessions, so summaries are
  ratios against a baseline measured in the same run, with spreads from per-round
  *paired* ratios, which cancel slow drifts of the machine.
"""
from __future__ import annotations

import io
import json
import math
import socket
import time

from bench.host import procs
from bench import results
from bench.perf.loadgen import ServerProcess, client_command, load_client
from bench.perf.machine import (CLIENT_SATURATED, NOISY_OTHER_CPU, NOISY_STEAL, Interrupted,
                           MeasureError, Window, bench_runtime, check_stop, cpu_plan, pin,
                           progress, read_line, rss_bytes, run_interruptibly, stop_process)
from bench.results.tables import MISSING, fmt_bytes, fmt_rate, fmt_seconds, format_table
from bench import runtimes

__all__ = ["default_baseline", "KiB", "ECHO_METRICS", "CURVE_CONNECTIONS", "measure_echo", "run_echo_matrix",
           "echo_units", "size_label", "param_label", "by_round", "paired", "ratio_table", "echo_tables",
           "curve_table", "curve_png", "measure_idle", "idle_table", "METHOD_NOTES"]

KiB = 1024
CURVE_CONNECTIONS = [1, 3, 10, 30, 100, 300, 1000]
ECHO_METRICS = ("requests_per_s", "throughput_Bps", "latency_p50_s", "latency_p99_s",
                "latency_mean_s", "latency_max_s", "server_cpu_per_request_s",
                "server_user_cpu_per_request_s", "server_system_cpu_per_request_s",
                "server_cpu_fraction", "client_cpu_fraction", "other_cpu_fraction",
                "steal_fraction")

METHOD_NOTES = [
    "each measurement is a fresh server process (`looplab serve echo --variant naive`), "
    "pinned to its own CPU, with the load client on the other; reference runtimes run with "
    "instrument=false",
    "runtimes are interleaved in rounds whose order rotates; the warm-up is not counted",
    f"noisy: other processes used > {NOISY_OTHER_CPU} CPU or steal > {NOISY_STEAL:.0%} during "
    f"the counted window; client-bound: the load client used > {CLIENT_SATURATED:.0%} of its CPU",
    "absolute numbers drift ~20 % between sessions on these machines: compare ratios within a run",
]


# ---------------------------------------------------------------------------
# One measurement

def check_client_output(out: dict, server: ServerProcess) -> None:
    """Raise MeasureError unless the load client's result is a clean measurement."""
    if out.get("error") and not out.get("requests"):
        raise MeasureError(f"load client: {out['error']}; server stderr: "
                           f"{server.stderr_tail() or '-'}")
    if out.get("mismatches"):
        raise MeasureError(f"the server echoed wrong bytes ({out['mismatches']} mismatching reads)")
    if out.get("dead_connections"):
        raise MeasureError(f"{out['dead_connections']} connection(s) failed during the run: "
                           f"{out.get('error')}; server stderr: {server.stderr_tail() or '-'}")
    if out.get("requests", 0) <= 0:
        raise MeasureError("no request completed in the window")


def measure_echo(rt, message_bytes: int, connections: int, duration: float = 2.0,
                 warmup: float = 1.0, client=None, pinned: bool = True,
                 sockbuf: int | None = None) -> dict:
    """Start a fresh server for ``rt`` (benchmarked uninstrumented), drive it with the load
    client for ``warmup + duration`` seconds, stop it. Returns one sample::

        {"requests_per_s", "throughput_Bps", "latency_p50_s", "latency_p99_s",
         "latency_mean_s", "latency_max_s", "server_cpu_per_request_s",
         "server_user_cpu_per_request_s", "server_system_cpu_per_request_s",
         "server_cpu_fraction", "client_cpu_fraction", "other_cpu_fraction",
         "steal_fraction", "loadavg", "noisy", "client_saturated"}

    ``throughput_Bps`` counts the echoed payload once (requests x message_bytes).
    Raises MeasureError when anything goes wrong (the message says what)."""
    if message_bytes < 1 or connections < 1 or duration <= 0 or warmup < 0:
        raise ValueError("message_bytes and connections must be >= 1, duration > 0, warmup >= 0")
    if client is None:
        client = load_client("auto")
    server_cpu, client_cpu = cpu_plan(pinned)
    server = ServerProcess(bench_runtime(rt).spec, cpu=server_cpu, sockbuf=sockbuf).start()
    try:
        def snapshot(client_pid):
            return Window(server.pid, client_pid)
        out, start, end = client_window(server, client, connections, message_bytes, warmup,
                                        duration, client_cpu, snapshot, snapshot)
        window = out.get("window_s") or duration
        requests = out["requests"]
        acct = start.until(end)
        user, system = acct.pop("server_user_cpu_fraction"), acct.pop("server_system_cpu_fraction")
        sample = {
            "requests_per_s": requests / window,
            "throughput_Bps": requests * message_bytes / window,
            "latency_p50_s": out.get("latency_p50_s"),
            "latency_p99_s": out.get("latency_p99_s"),
            "latency_mean_s": out.get("latency_mean_s"),
            "latency_max_s": out.get("latency_max_s"),
            "server_cpu_per_request_s": acct["server_cpu_fraction"] * window / requests,
            "server_user_cpu_per_request_s": user * window / requests,
            "server_system_cpu_per_request_s": system * window / requests,
            **acct,
            "loadavg": start.loadavg,
        }
        sample["noisy"] = bool(sample.get("other_cpu_fraction", 0) > NOISY_OTHER_CPU
                               or sample.get("steal_fraction", 0) > NOISY_STEAL)
        sample["client_saturated"] = bool(acct["client_cpu_fraction"] > CLIENT_SATURATED)
        return sample
    finally:
        server.stop()


def client_window(server: ServerProcess, client, connections: int, message_bytes: int,
                  warmup: float, duration: float, client_cpu: int | None = None,
                  at_start=None, at_end=None) -> tuple[dict, object, object]:
    """Drive ``server`` with the load client for ``warmup + duration`` seconds:
    ``at_start(client_pid)`` runs when the client opens its counted window and
    ``at_end(client_pid)`` when its result arrives. Returns the checked result and
    what the two calls returned; raises MeasureError. The client is stopped on return."""
    host, port = server.address
    proc = procs.spawn(client_command(client, host, port, connections, message_bytes,
                                      warmup, duration))
    try:
        pin(proc.pid, client_cpu)
        buf = bytearray()
        budget = 30.0 + connections * 0.02
        line = read_line(proc, buf, time.monotonic() + warmup + budget)
        if line != "W":
            raise MeasureError(f"load client did not start its window: {line or 'no output'}")
        started = at_start(proc.pid) if at_start is not None else None
        line = read_line(proc, buf, time.monotonic() + duration + budget)
        ended = at_end(proc.pid) if at_end is not None else None
        if not line:
            raise MeasureError(f"load client gave no result; server alive: {server.alive()}")
        try:
            out = json.loads(line)
        except ValueError:
            raise MeasureError(f"load client printed {line[:200]!r}") from None
        check_client_output(out, server)
        return out, started, ended
    finally:
        stop_process(proc, 2.0)


# ---------------------------------------------------------------------------
# The matrix

def size_label(n: int) -> str:
    if n >= KiB * KiB and n % (KiB * KiB) == 0:
        return f"{n // (KiB * KiB)} MiB"
    if n >= KiB and n % KiB == 0:
        return f"{n // KiB} KiB"
    return f"{n} B"


def param_label(params: dict) -> str:
    if "message_bytes" in params:
        return f"{size_label(params['message_bytes'])} x {params['connections']}"
    return ",".join(f"{k}={v}" for k, v in sorted(params.items())) or MISSING


def echo_units(rts, sizes, concurrency, shard_spec=None) -> list[tuple]:
    """The cells to measure, as (runtime, message_bytes, connections), sharded."""
    units = [(rt, m, c) for m in sizes for c in concurrency for rt in rts]
    return results.shard(units, shard_spec)


def run_echo_matrix(units, duration: float, warmup: float, repeat: int, client=None,
                    pinned: bool = True, progress=progress, sockbuf: int | None = None) -> list[dict]:
    """Measure every unit ``repeat`` times, interleaved in rounds with the runtime order
    rotating each round; one cell per unit with the samples in round order."""
    if client is None:
        client = load_client("auto")
    groups: dict[tuple, list] = {}
    for rt, m, c in units:
        groups.setdefault((m, c), []).append(rt)
    store = {(rt.spec, m, c): {"samples": {k: [] for k in ECHO_METRICS}, "rounds": [],
                               "noisy": [], "saturated": [], "loadavg": [], "errors": []}
             for rt, m, c in units}
    total, done = len(units) * repeat, 0

    def measure_all():
        nonlocal done
        for r in range(repeat):
            for (m, c), rts in groups.items():
                k = r % len(rts)
                for rt in rts[k:] + rts[:k]:
                    check_stop()
                    done += 1
                    entry = store[(rt.spec, m, c)]
                    label = f"[{done}/{total}] round {r + 1}/{repeat} {rt.spec} {size_label(m)} x {c}"
                    try:
                        s = measure_echo(rt, m, c, duration, warmup, client, pinned, sockbuf)
                    except MeasureError as exc:
                        entry["errors"].append(f"round {r + 1}: {exc}")
                        progress(f"{label}: FAILED: {exc}")
                        continue
                    for name in ECHO_METRICS:
                        entry["samples"][name].append(s.get(name))
                    entry["rounds"].append(r)
                    entry["loadavg"].append(s.get("loadavg"))
                    if s["noisy"]:
                        entry["noisy"].append(r)
                    if s["client_saturated"]:
                        entry["saturated"].append(r)
                    flags = (" NOISY" if s["noisy"] else "") + (" CLIENT-BOUND" if s["client_saturated"] else "")
                    progress(f"{label}: {fmt_rate(s['requests_per_s'], ' req/s')}, server CPU/req "
                             f"{fmt_seconds(s['server_cpu_per_request_s'])} (system "
                             f"{fmt_seconds(s.get('server_system_cpu_per_request_s'))}), p99 "
                             f"{fmt_seconds(s['latency_p99_s'])}, other CPU "
                             f"{s.get('other_cpu_fraction', 0):.2f}{flags}")

    interrupted = run_interruptibly(measure_all)
    cells = []
    for rt, m, c in units:
        entry = store[(rt.spec, m, c)]
        samples = {k: v for k, v in entry["samples"].items() if v}
        cell = results.new_cell(
            "echo", rt.spec, "naive", {"message_bytes": m, "connections": c},
            samples=samples, errors=entry["errors"],
            details={"server_runtime": bench_runtime(rt).spec, "client": client[1],
                     "duration_s": duration, "warmup_s": warmup, "sockbuf_bytes": sockbuf,
                     "rounds": entry["rounds"], "noisy_rounds": entry["noisy"],
                     "client_bound_rounds": entry["saturated"], "loadavg": entry["loadavg"]})
        cell["repeats"] = len(entry["rounds"])
        cells.append(cell)
    if interrupted:
        raise Interrupted([c for c in cells if c["repeats"] or c["errors"]])
    return cells


# ---------------------------------------------------------------------------
# Paired ratios

def default_baseline() -> str:
    """The runtime echo ratios are taken against by default: the primary reference of
    the first of our kernels (asyncio's Protocol/Transport for the built-ins)."""
    for rid in runtimes.ordered():
        info = runtimes.get(rid)
        if info.ours and info.primary_reference:
            return info.primary_reference
    return runtimes.ordered()[0]


def by_round(cell: dict, metric: str) -> dict:
    """``{round: sample}`` of one metric of a cell (rounds it failed are absent)."""
    rounds = (cell.get("details") or {}).get("rounds")
    vals = (cell.get("samples") or {}).get(metric, [])
    if rounds is None or len(rounds) != len(vals):
        rounds = list(range(len(vals)))
    return dict(zip(rounds, vals))


def paired(cell: dict, base: dict, metric: str) -> list[float]:
    """Per-round ratios cell/base, pairing samples measured in the same round."""
    a, b = by_round(cell, metric), by_round(base, metric)
    return [a[r] / b[r] for r in a if r in b and a[r] and b[r]]


def ratio_table(cells: list[dict], baseline: str, metric: str = "requests_per_s",
                cost: bool = False) -> dict:
    """Ratios of each runtime's median to the baseline's, per parameter set, with the
    paired per-round ratios for the spread and a geometric mean per runtime. With
    ``cost`` (a metric where less is better, such as CPU per request) the ratios are
    the baseline's over the runtime's, so that > 1 still reads "better"::

        {"baseline", "metric", "params": [label...], "runtimes": [spec...],
         "ratios": {label: {spec: {"ratio", "paired": [..], "min", "max"}}},
         "geomean": {spec: value}}
    """
    labels, specs = [], []
    by = {}
    for cell in cells:
        label = param_label(cell.get("params", {}))
        if label not in labels:
            labels.append(label)
        if cell["runtime"] not in specs:
            specs.append(cell["runtime"])
        by[(label, cell["runtime"])] = cell
    ratios: dict[str, dict] = {}
    for label in labels:
        base = by.get((label, baseline))
        row = ratios[label] = {}
        if base is None or not base["metrics"].get(metric):
            continue
        for spec in specs:
            cell = by.get((label, spec))
            if cell is None or cell["metrics"].get(metric) is None:
                continue
            if cost and not cell["metrics"][metric]:
                continue            # a cost of 0 (too short a run for the CPU ticks): no ratio
            p = paired(cell, base, metric)
            ratio = cell["metrics"][metric] / base["metrics"][metric]
            if cost:
                p, ratio = [1 / x for x in p], 1 / ratio
            row[spec] = {"ratio": ratio, "paired": p,
                         "min": min(p) if p else None, "max": max(p) if p else None}
    geomean = {}
    for spec in specs:
        vals = [ratios[lb][spec]["ratio"] for lb in labels if spec in ratios[lb]]
        if vals and all(v > 0 for v in vals):
            geomean[spec] = math.exp(sum(math.log(v) for v in vals) / len(vals))
    return {"baseline": baseline, "metric": metric, "params": labels, "runtimes": specs,
            "ratios": ratios, "geomean": geomean}


# ---------------------------------------------------------------------------
# Tables

def _title(text: str, markdown: bool) -> str:
    return ("### " if markdown else "") + text


def _ratio_text(entry) -> str:
    if entry is None:
        return MISSING
    text = f"{entry['ratio']:.2f}"
    if entry.get("min") is not None and len(entry["paired"]) > 1:
        text += f" ({entry['min']:.2f}-{entry['max']:.2f})"
    return text


def _rate_with_spread(value, iqr) -> str:
    text = fmt_rate(value, "")
    return text + (f" ±{fmt_rate(iqr / 2, '')}" if iqr and value is not None else "")


def _fraction(v) -> str:
    return MISSING if v is None else f"{v:.2f}"


def echo_tables(cells: list[dict], baseline: str, markdown: bool = False) -> str:
    """The ratio matrix (rows: parameter sets + geometric mean; columns: runtimes) and
    the absolute table (one row per cell, server CPU per request beside req/s)."""
    parts = []
    measured = [c for c in cells if c["metrics"].get("requests_per_s")]
    titles = ((f"echo requests/s relative to {baseline} (ratio of medians; in brackets the "
               f"range of per-round paired ratios; > 1 is faster)", "requests_per_s", False),
              (f"server CPU per request relative to {baseline} (the baseline's CPU over each "
               f"runtime's, ratio of medians; in brackets the range of per-round paired ratios; "
               f"> 1 is cheaper)", "server_cpu_per_request_s", True))
    for title, metric, cost in titles:
        table = ratio_table(measured, baseline, metric, cost) if measured else None
        if table and any(table["ratios"][lb] for lb in table["params"]):
            rows = [[lb] + [_ratio_text(table["ratios"][lb].get(s)) for s in table["runtimes"]]
                    for lb in table["params"]]
            rows.append(["geometric mean"] + [f"{table['geomean'][s]:.2f}" if s in table["geomean"]
                                              else MISSING for s in table["runtimes"]])
            parts.append(_title(title, markdown))
            parts.append(format_table(["message x connections"] + table["runtimes"], rows, markdown))
        elif measured and metric == "requests_per_s":
            parts.append(f"(no ratio table: baseline {baseline} was not measured in this run)")
    rows = []
    for c in cells:
        m, sp, d = c["metrics"], c.get("spread", {}), c.get("details", {})
        flags = []
        if d.get("noisy_rounds"):
            flags.append(f"noisy x{len(d['noisy_rounds'])}")
        if d.get("client_bound_rounds"):
            flags.append(f"client-bound x{len(d['client_bound_rounds'])}")
        if c.get("errors"):
            flags.append(f"errors x{len(c['errors'])}")
        rows.append([c["runtime"], param_label(c.get("params", {})),
                     _rate_with_spread(m.get("requests_per_s"),
                                       sp.get("requests_per_s", {}).get("iqr")),
                     fmt_seconds(m.get("server_cpu_per_request_s")),
                     fmt_seconds(m.get("server_user_cpu_per_request_s")),
                     fmt_seconds(m.get("server_system_cpu_per_request_s")),
                     fmt_seconds(m.get("latency_p50_s")), fmt_seconds(m.get("latency_p99_s")),
                     _fraction(m.get("server_cpu_fraction")), _fraction(m.get("other_cpu_fraction")),
                     c.get("repeats", 0), ", ".join(flags)])
    parts.append(_title("absolute numbers (medians over repeats, each column its own: user and "
                        "system need not add up to the total; ± is half the IQR)", markdown))
    parts.append(format_table(["runtime", "message x conns", "req/s", "server CPU/req",
                               "of it user", "of it system", "p50",
                               "p99", "server CPU", "other CPU", "n", "flags"], rows, markdown))
    return "\n\n".join(parts)


def curve_table(cells: list[dict], markdown: bool = False) -> str:
    specs = list(dict.fromkeys(c["runtime"] for c in cells))
    conns = sorted({c["params"]["connections"] for c in cells})
    by = {(c["runtime"], c["params"]["connections"]): c for c in cells}
    rows = [[n] + [fmt_rate((by.get((s, n)) or {}).get("metrics", {}).get("requests_per_s"), "")
                   for s in specs] for n in conns]
    return (_title("echo requests/s by number of connections (medians)", markdown) + "\n\n"
            + format_table(["connections"] + specs, rows, markdown))


def curve_png(cells) -> bytes | None:
    """The curve as PNG bytes, or None without matplotlib (an optional dependency)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return None
    fig, ax = plt.subplots(figsize=(8, 5))
    for spec in dict.fromkeys(c["runtime"] for c in cells):
        pts = sorted((c["params"]["connections"], c["metrics"]["requests_per_s"])
                     for c in cells if c["runtime"] == spec and c["metrics"].get("requests_per_s"))
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=spec)
    ax.set_xscale("log")
    ax.set_xlabel("connections")
    ax.set_ylabel("requests/s (median)")
    ax.set_title("echo throughput by connection count")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=100)
    plt.close(fig)
    return out.getvalue()


# ---------------------------------------------------------------------------
# Idle connections

def measure_idle(rt, connections: int, progress=progress, batch: int = 100) -> dict:
    """Open ``connections`` idle connections to a fresh echo server; each is used for one
    1-byte round trip (so the server has really set it up), then left idle. Returns the
    server's RSS before and after and the growth per connection."""
    socks = []
    with ServerProcess(bench_runtime(rt).spec) as server:
        time.sleep(0.3)
        before = rss_bytes(server.pid)
        try:
            host, port = server.address
            for start in range(0, connections, batch):
                fresh = []
                for _ in range(min(batch, connections - start)):
                    s = socket.create_connection((host, port), timeout=10)
                    socks.append(s)
                    fresh.append(s)
                for s in fresh:
                    s.sendall(b"i")
                for s in fresh:
                    if s.recv(16) != b"i":
                        raise MeasureError("the server did not echo on an idle connection")
                if not server.alive():
                    raise MeasureError(f"server died: {server.stderr_tail()}")
                if (start // batch) % 20 == 19:
                    progress(f"  {rt.spec}: {len(socks)} connections open")
            time.sleep(0.5)
            after = rss_bytes(server.pid)
        except OSError as exc:
            raise MeasureError(f"after {len(socks)} connections: {exc}") from None
        finally:
            for s in socks:
                s.close()
    if before is None or after is None:
        raise MeasureError("cannot read the server's RSS (/proc not available)")
    return {"server_rss_before_bytes": before, "server_rss_after_bytes": after,
            "rss_per_connection_bytes": (after - before) / max(connections, 1),
            "connections_count": connections}


def idle_table(cells: list[dict], markdown: bool = False) -> str:
    rows = [[c["runtime"], c["params"]["connections"],
             fmt_bytes(c["metrics"].get("rss_per_connection_bytes")),
             fmt_bytes(c["metrics"].get("server_rss_after_bytes")),
             "; ".join(c["errors"])[:60]] for c in cells]
    return (_title("server memory per idle connection", markdown) + "\n\n"
            + format_table(["runtime", "connections", "RSS per connection", "server RSS",
                            "errors"], rows, markdown))
