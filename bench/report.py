"""Reports: the terminal table, the report folder, the fidelity table, and the main job.

The terminal table is grouped by scenario and style, our kernel first and its
reference libraries beside it, so a row of ours reads against the rows it must
reproduce. The *fidelity table* asks, for each scenario and variant: does our
kernel's verdict equal its references'? Mismatches are printed, never hidden.
"""
from __future__ import annotations

import os
import sys
import time

from protocols import runtimes as rtmod

STYLE_ORDER = ("callback", "stream", "task")
OUR_BY_STYLE = {"callback": "callback", "stream": "hybrid", "task": "coro"}

# The columns each scenario shows: (metric, header, formatter)
def _mb(v):
    return "?" if v is None else f"{v / 1e6:.2f} MB"


def _mbs(v):
    return "?" if v is None else f"{v / 1e6:.2f} MB/s"


def _s(v):
    return "?" if v is None else f"{v:.2f} s"


def _n(v):
    return "?" if v is None else f"{v:,.0f}" if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


def _pct(v):
    return "?" if v is None else f"{100 * v:.1f} %"


def _frac(v):
    return "?" if v is None else f"{v:.2f}"


COLUMNS = {
    "S1": [("source_rate_Bps", "source", _mbs), ("peak_user_buffer_bytes", "user buffer peak", _mb),
           ("rss_growth_bytes", "RSS growth", _mb), ("queue_delay_s", "queue delay", _s),
           ("pause_writing_count", "pause_writing", _n)],
    "S2": [("reader_buffer_peak_bytes", "reader buffer peak", _n), ("source_rate_Bps", "source", _mbs)],
    "S3": [("bytes_accepted", "accepted", _n), ("bytes_delivered", "delivered", _n),
           ("bytes_lost", "lost", _n), ("eof_after_stop_s", "EOF after stop", _s)],
    "S4": [("child_ran_before_spawn_returned", "child before spawn returns", _n),
           ("child_first_after_yield_fraction", "child first after yield", _frac),
           ("user_buffered_after_write_bytes", "buffered after write(1MB)", _n),
           ("closed_when_close_returned", "closed at close()", _n),
           ("other_tasks_during_nonblocking_sends_count", "turns during sends", _n),
           ("cancel_semantics", "cancel", _n), ("error_surface", "reset surfaces", _n)],
    "S5": [("requests_handled_count", "requests handled", _n), ("rss_growth_bytes", "RSS growth", _mb),
           ("peak_user_buffer_bytes", "user buffer peak", _mb)],
    "S6": [("healthy_share_fraction", "healthy got", _pct), ("rss_growth_bytes", "RSS growth", _mb),
           ("dropped_count", "dropped", _n), ("peak_user_buffer_bytes", "user buffer peak", _mb),
           ("app_queue_peak_bytes", "app queue peak", _mb)],
    "S7": [("bytes_delivered_after_timeout", "delivered", _n), ("bytes_sent_known", "bytes_sent known", _n)],
    "S8": [("bytes_delivered", "delivered", _n), ("warnings", "warnings", _n)],
}


def _order_key(r):
    style = STYLE_ORDER.index(r["style"]) if r.get("style") in STYLE_ORDER else 9
    return (r["scenario"], r["variant"], style, 0 if r.get("ours") else 1, r["runtime"])


def table_rows(results: list[dict]) -> list[tuple[str, list[str], list[list[str]]]]:
    """[(title, header, rows)] per scenario, rows grouped by variant and style."""
    out = []
    for sid in sorted({r["scenario"] for r in results}):
        from bench.scenarios import SCENARIOS
        cols = COLUMNS.get(sid, [])
        header = ["runtime", "variant"] + [h for _, h, _ in cols] + ["verdicts"]
        rows = []
        for r in sorted((r for r in results if r["scenario"] == sid), key=_order_key):
            if r.get("skipped"):
                rows.append([r["runtime"], r["variant"]] + ["-"] * len(cols) + ["skipped: " + r["skipped"][:40]])
                continue
            if r["errors"] and not r["metrics"]:
                rows.append([r["runtime"], r["variant"]] + ["-"] * len(cols) + ["ERROR: " + r["errors"][0][:60]])
                continue
            verdicts = " ".join(f"{k}={'yes' if v else 'NO'}" for k, v in r["verdicts"].items())
            rows.append([("* " if r.get("ours") else "  ") + r["runtime"], r["variant"]]
                        + [fmt(r["metrics"].get(m)) for m, _, fmt in cols] + [verdicts])
        out.append((f"{sid} — {SCENARIOS[sid].title}", header, rows))
    return out


def format_table(header: list[str], rows: list[list[str]], markdown: bool = False) -> str:
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in rows]
        return "\n".join(lines)
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    fmt = lambda row: "  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])


def _primary_reference(runtime_spec: str) -> str | None:
    """The library whose behaviour our kernel's *defaults* reproduce: the first
    of its compared_with (callback -> asyncio-protocol, hybrid -> asyncio-streams,
    coro -> curio). With options flipped there is no single primary."""
    rt = rtmod.parse(runtime_spec)
    if not rt.ours or not rt.info.compared_with or rt.spec != rt.id:
        return None
    return rt.info.compared_with[0]


def fidelity(results: list[dict]) -> list[list[str]]:
    """For each scenario x variant x style: our verdicts vs each reference's.
    Rows: [scenario, variant, ours, reference, primary?, same, difference]. Only a
    mismatch with the primary reference is a fidelity failure; the others show how
    the reference libraries differ among themselves (uvloop vs asyncio, trio vs curio)."""
    rows = []
    by_key: dict = {}
    for r in results:
        if r.get("skipped") or not r["verdicts"]:
            continue
        by_key.setdefault((r["scenario"], r["variant"], r["style"]), []).append(r)
    for (sid, variant, style), group in sorted(by_key.items()):
        ours = [r for r in group if r.get("ours")]
        refs = [r for r in group if not r.get("ours")]
        for o in ours:
            primary = _primary_reference(o["runtime"])
            for ref in refs:
                same = o["verdicts"] == ref["verdicts"]
                diff = "" if same else "; ".join(
                    f"{k}: ours={o['verdicts'].get(k)} ref={ref['verdicts'].get(k)}"
                    for k in sorted(set(o["verdicts"]) | set(ref["verdicts"]))
                    if o["verdicts"].get(k) != ref["verdicts"].get(k))
                rows.append([sid, variant, o["runtime"], ref["runtime"],
                             "yes" if ref["runtime"] == primary else "no",
                             "yes" if same else "NO", diff])
    return rows


FIDELITY_HEADER = ["scenario", "variant", "ours", "reference", "primary", "same", "difference"]


def render_terminal(results: list[dict]) -> str:
    parts = []
    for title, header, rows in table_rows(results):
        parts.append(f"\n{title}  (* = our kernel)\n" + format_table(header, rows))
    fid = fidelity(results)
    if fid:
        primary = [r for r in fid if r[4] == "yes"]
        same = sum(1 for r in primary if r[5] == "yes")
        parts.append(f"\nFidelity: our kernel's verdicts equal its primary reference's in {same} of "
                     f"{len(primary)} cells (callback ~ asyncio-protocol, hybrid ~ asyncio-streams, "
                     "coro ~ curio)")
        bad = [r for r in fid if r[5] != "yes"]
        if bad:
            parts.append(format_table(FIDELITY_HEADER, bad))
    notes = sorted({f"{r['scenario']} {r['runtime']} {r['variant']}: {n}" for r in results for n in r.get("notes", [])})
    errors = [f"{r['id']}: {e}" for r in results for e in r.get("errors", [])]
    if errors:
        parts.append("\nErrors:\n" + "\n".join("  " + e for e in errors))
    if notes:
        parts.append(f"\n{len(notes)} notes in report.md")
    return "\n".join(parts)


def render_markdown(doc: dict, plots: list[str]) -> str:
    results = doc["cells"]
    env = doc.get("env", {})
    lines = ["# looplab report", "",
             f"run `{doc.get('run_id', '?')}` — looplab {doc.get('looplab')} — Python {env.get('python', '?')} "
             f"— {env.get('platform', '?')}", "",
             "Rows marked `*` are our kernels; the rows beside them are the reference libraries "
             "of the same style. Sizes in MB are 10^6 bytes.", ""]
    for title, header, rows in table_rows(results):
        lines += [f"## {title}", "", format_table(header, rows, markdown=True), ""]
        sid = title.split()[0]
        for p in plots:
            if os.path.basename(p).startswith(sid.lower()):
                lines += [f"![{sid}]({os.path.basename(p)})", ""]
    fid = fidelity(results)
    lines += ["## Fidelity: does our kernel's verdict equal its references'?", ""]
    lines += ["Only a mismatch with the *primary* reference (the library whose behaviour our "
              "kernel's defaults reproduce) is a fidelity failure; rows against the other "
              "references show where the libraries differ among themselves.", ""]
    lines += [format_table(FIDELITY_HEADER, fid, markdown=True) if fid else "(no comparable cells)", ""]
    notes = sorted({f"{r['scenario']} `{r['runtime']}` {r['variant']}: {n}" for r in results for n in r.get("notes", [])})
    if notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    errors = [f"`{r['id']}`: {e}" for r in results for e in r.get("errors", [])]
    if errors:
        lines += ["## Errors", ""] + [f"- {e}" for e in errors] + [""]
    return "\n".join(lines)


def plot(results: list[dict], out_dir: str) -> list[str]:
    """PNG plots, one figure per scenario; empty if matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return []
    written = []

    def bars(sid, metric, ylabel, scale=1.0):
        cells = [r for r in results if r["scenario"] == sid and r["metrics"].get(metric) is not None]
        if not cells:
            return
        cells.sort(key=_order_key)
        labels = [f"{'*' if r.get('ours') else ''}{r['runtime']}\n{r['variant']}" for r in cells]
        values = [r["metrics"][metric] * scale for r in cells]
        colors = ["tab:orange" if r.get("ours") else "tab:blue" for r in cells]
        fig, ax = plt.subplots(figsize=(max(6, 0.55 * len(cells)), 4.2))
        ax.bar(range(len(cells)), values, color=colors)
        ax.set_xticks(range(len(cells)), labels, rotation=70, fontsize=7)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{sid}: {ylabel} (orange = our kernels)")
        fig.tight_layout()
        path = os.path.join(out_dir, f"{sid.lower()}_{metric}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    s1 = [r for r in results if r["scenario"] == "S1" and r.get("series")]
    if s1:
        # One column per style, so each of our kernels sits with its references:
        # solid = naive, dashed = fixed, our kernel drawn thick.
        styles = [st for st in STYLE_ORDER if any(r.get("style") == st for r in s1)]
        fig, axes = plt.subplots(2, len(styles), figsize=(5 * len(styles), 7), squeeze=False,
                                 sharex=True, sharey="row")
        for col, style in enumerate(styles):
            runtimes_here = sorted({r["runtime"] for r in s1 if r.get("style") == style},
                                   key=lambda rid: (0 if rtmod.parse(rid).ours else 1, rid))
            colors = dict(zip(runtimes_here, ("tab:orange", "tab:blue", "tab:green", "tab:purple")))
            top, bottom = axes[0][col], axes[1][col]
            for r in sorted((r for r in s1 if r.get("style") == style), key=_order_key):
                kw = dict(color=colors.get(r["runtime"]), linestyle="-" if r["variant"] == "naive" else "--",
                          linewidth=2.4 if r.get("ours") else 1.1,
                          label=f"{'*' if r.get('ours') else ''}{r['runtime']} {r['variant']}")
                if r["series"].get("in_flight"):
                    t, v = zip(*r["series"]["in_flight"])
                    top.plot(t, [x / 1e6 for x in v], **kw)
                if r["series"].get("latency"):
                    t, v = zip(*r["series"]["latency"])
                    bottom.plot(t, v, **kw)
            top.set_title(f"{style} style: bytes in flight (MB)", fontsize=10)
            bottom.set_title(f"{style} style: latency of frames arriving at the sink (s)", fontsize=10)
            bottom.set_xlabel("time since the source connected (s)")
            top.legend(fontsize=7)
        fig.suptitle("S1 one-way proxy, source 3 MB/s -> sink 1 MB/s: in flight = source sent - sink "
                     "received (user + kernel buffers); * = our kernel", fontsize=10)
        fig.tight_layout()
        path = os.path.join(out_dir, "s1_buffer_and_delay.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    else:
        bars("S1", "peak_user_buffer_bytes", "user-space buffer peak (MB)", 1e-6)
    bars("S3", "bytes_delivered", "bytes delivered (MB)", 1e-6)
    bars("S5", "requests_handled_count", "requests handled of 300")
    bars("S6", "healthy_share_fraction", "healthy client's share")
    return written


def write_report(doc: dict, out_dir: str) -> dict:
    from bench import results as resmod
    os.makedirs(out_dir, exist_ok=True)
    paths = {"json": os.path.join(out_dir, "results.json"), "csv": os.path.join(out_dir, "results.csv"),
             "md": os.path.join(out_dir, "report.md")}
    resmod.write_json(doc, paths["json"])
    resmod.write_csv(doc, paths["csv"])
    plots = plot(doc["cells"], out_dir)
    with open(paths["md"], "w") as f:
        f.write(render_markdown(doc, plots))
    paths["plots"] = plots
    return paths


def check_writable(out_dir: str) -> None:
    """Fail before any cell runs if the report folder can't be written."""
    try:
        os.makedirs(out_dir, exist_ok=True)
        probe = os.path.join(out_dir, ".looplab-write-test")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as exc:
        raise rtmod.UsageError(f"cannot write to --out {out_dir!r}: {exc.strerror or exc}") from None


def progress_printer(stream=sys.stderr):
    start = time.monotonic()

    def show(i, n, result):
        status = "skipped" if result.get("skipped") else ("ERROR" if result["errors"] and not result["metrics"]
                                                           else "ok")
        stream.write(f"\r[{i}/{n}] {time.monotonic() - start:5.1f}s {result['id']:<60} {status}\n")
        stream.flush()
    return show


def run_and_report(cells, out_dir: str | None, json_path: str | None, jobs: int) -> int:
    from bench import results as resmod
    from bench import scenarios
    if out_dir:
        check_writable(out_dir)
    results, interrupted = scenarios.run_matrix(cells, jobs=jobs, progress=progress_printer())
    doc = resmod.new_document(results)
    print(render_terminal(results))
    if out_dir:
        paths = write_report(doc, out_dir)
        print(f"\nreport: {paths['md']} (results.json, results.csv, {len(paths['plots'])} plots)")
    if json_path:
        resmod.write_json(doc, json_path)
    if interrupted:
        print("interrupted: finished cells were kept", file=sys.stderr)
        return 130
    failed = any(r["errors"] for r in results)
    return 1 if failed else 0


def main_job(args) -> int:
    """``looplab`` with no verb: S1, S3, S4, S5, S6 at the quick preset, every
    available runtime, the table in the terminal and the report folder."""
    from bench import scenarios
    available, missing = rtmod.available_runtimes()
    for spec, reason in missing.items():
        print(f"skipping {spec}: {reason}", file=sys.stderr)
    cells = scenarios.plan(",".join(scenarios.MAIN_JOB), ",".join(r.spec for r in available), None, "quick")
    cells = [c for c in cells if not (c.scenario == "S3" and c.variant not in ("naive", "fixed"))
             and not (c.scenario == "S6" and c.variant == "disconnect")]
    print(f"looplab: {len(cells)} cells on {len(available)} runtimes (quick preset)", file=sys.stderr)
    return run_and_report(cells, args.out, None, jobs=2)
