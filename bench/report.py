"""Reports: the terminal table, the report folder (report.md, results, plots), the
fidelity table, and running a matrix into them.

Everything is rendered from a results document, so a report can be made again from
any results file, merged or not (``looplab report``). What a scenario shows -- its
title, columns, metric labels and units, its variants in order -- comes from the
document's ``scenarios`` section (written by every run), falling back to the
registered scenario. The terminal table is grouped by scenario, variant and style,
our kernel first and its reference libraries beside it, so a row of ours reads
against the rows it must reproduce. The *fidelity table* asks, for each scenario and
variant: does our kernel's verdict equal its references'? Mismatches are printed,
never hidden.
"""
from __future__ import annotations

import os
import signal
import sys
import time

from bench import compare as cmpmod
from bench import html as htmlmod
from bench import results as resmod
from bench import scenario as scmod
from bench import scenarios
from bench.errors import ExitCode
from bench.htmldoc import cell_net, net_rank, sim_note
from bench.tables import MISSING, fmt, format_table
from protocols import runtimes as rtmod

STYLE_ORDER = ("callback", "stream", "task")
FIDELITY_HEADER = ["scenario", "variant", "ours", "reference", "primary", "same", "difference"]
LEGEND = (f"Rows marked `*` are our kernels; the rows beside them are the reference libraries "
          f"of the same style. Sizes in MB/kB are powers of 10. `{MISSING}` = not measured or "
          "not observable on that runtime.")


def catalog(doc: dict) -> dict:
    """Scenario id -> its description (title, variants, metrics, verdicts, columns)
    for every scenario in ``doc``: from the document, else from the registry."""
    out = dict(doc.get("scenarios") or {})
    registered = scmod.scenarios()
    for cell in doc["cells"]:
        sid = cell.get("scenario")
        if sid not in out:
            sc = registered.get(sid)
            out[sid] = sc.describe() if sc else {"title": "", "variants": [], "metrics": {},
                                                 "verdicts": {}, "columns": []}
    return out


def _order_key(cat: dict):
    def key(r):
        desc = cat.get(r["scenario"], {})
        variants = desc.get("variants", [])
        v = variants.index(r["variant"]) if r["variant"] in variants else len(variants)
        style = STYLE_ORDER.index(r["style"]) if r.get("style") in STYLE_ORDER else 9
        return (v, r["variant"], style, 0 if r.get("ours") else 1, r["runtime"], net_rank(r))
    return key


def _format(sid: str, metric: str, value) -> str:
    sc = scmod.scenarios().get(sid)
    m = sc.metric(metric) if sc else None
    if m is not None and m.format is not None and value is not None:
        return m.format(value)
    return fmt(metric, value)


def table_rows(doc: dict) -> list[tuple[str, list[str], list[list[str]]]]:
    """[(title, header, rows)] per scenario, rows grouped by variant and style. When
    the run chose a network (``--net``), a ``net`` column follows the variant, and
    with ``--net both`` a runtime's real and sim rows sit next to each other."""
    cat = catalog(doc)
    out = []
    present = {r["scenario"] for r in doc["cells"]}
    for sid in [s for s in cat if s in present]:
        desc = cat[sid]
        cells = [r for r in doc["cells"] if r["scenario"] == sid]
        with_net = any(cell_net(r) for r in cells)
        cols = list(desc.get("columns", []))
        labels = [desc.get("metrics", {}).get(c, {}).get("label", c) for c in cols]
        header = ["runtime", "variant"] + (["net"] if with_net else []) + labels + ["verdicts"]
        rows = []
        for r in sorted(cells, key=_order_key(cat)):
            head = [("* " if r.get("ours") else "  ") + r["runtime"], r["variant"]]
            if with_net:
                head.append(cell_net(r) or "real")
            if r.get("skipped"):
                # "runs only on the real network" (a sim cell) is said once, under the tables
                why = "real network only" if "only on the real network" in r["skipped"] else r["skipped"][:40]
                rows.append(head + [MISSING] * len(cols) + ["skipped: " + why])
                continue
            if r.get("errors") and not r.get("verdicts"):
                rows.append(head + [MISSING] * len(cols) + ["ERROR: " + r["errors"][0][:60]])
                continue
            verdicts = " ".join(f"{k}={resmod.verdict_word(v)}" for k, v in r["verdicts"].items())
            rows.append(head + [_format(sid, c, r["metrics"].get(c)) for c in cols] + [verdicts])
        out.append((f"{sid} — {desc.get('title', '')}", header, rows))
    return out


def _references(runtime_spec: str) -> tuple[tuple, str | None]:
    """(the runtimes this one is compared with, the primary one its *defaults*
    reproduce). Any runtime that names references is a subject of the fidelity table:
    our kernels and a user's kernel alike. With options flipped there is no primary."""
    try:
        rt = rtmod.parse(runtime_spec)
    except Exception:       # a results file from a runtime not registered here
        return (), None
    return tuple(rt.info.compared_with), rt.primary_reference


def fidelity(cells: list[dict]) -> list[list[str]]:
    """For each scenario x variant x style: a kernel's verdicts vs each reference's.
    Only a mismatch with the primary reference is a fidelity failure; the others show
    how the reference libraries differ among themselves (uvloop vs asyncio, trio vs curio)."""
    rows = []
    by_key: dict = {}
    for r in cells:
        if r.get("skipped") or not r.get("verdicts"):
            continue
        # a kernel is compared with its references on the same network only
        by_key.setdefault((r["scenario"], r["variant"], r.get("style"), cell_net(r) or ""), []).append(r)
    for (sid, variant, style, net), group in sorted(by_key.items(), key=lambda kv: tuple(map(str, kv[0]))):
        if net:
            variant = f"{variant} ({net})"
        refs_of = {r["runtime"]: _references(r["runtime"]) for r in group}
        subjects = [r for r in group if refs_of[r["runtime"]][0]]
        refs = [r for r in group if not refs_of[r["runtime"]][0]]
        for o in subjects:
            primary = refs_of[o["runtime"]][1]
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


def _notes(cells, code="") -> list[str]:
    return sorted({f"{r['scenario']} {code}{r['runtime']}{code} {r['variant']}: {n}"
                   for r in cells for n in r.get("notes", [])})


def render_terminal(doc: dict, notes_in: str | None = None) -> str:
    parts = []
    for title, header, rows in table_rows(doc):
        parts.append(f"\n{title}  (* = our kernel)\n" + format_table(header, rows, align="l" * len(header)))
    fid = fidelity(doc["cells"])
    if fid:
        primary = [r for r in fid if r[4] == "yes"]
        same = sum(1 for r in primary if r[5] == "yes")
        parts.append(f"\nFidelity: our kernel's verdicts equal its primary reference's in {same} of "
                     f"{len(primary)} cells")
        bad = [r for r in fid if r[5] != "yes"]
        if bad:
            parts.append(format_table(FIDELITY_HEADER, bad))
    probes = doc.get("fidelity_probes")
    if probes:
        primary = [p for p in probes["pairings"] if p["primary"] and p["compared"]]
        parts.append("\nFidelity probes (edges): " + "; ".join(
            f"{p['pairing']} {p['agree']}/{p['compared']} agree, {p['declared']} declared, "
            f"{p['differ']} undeclared" for p in primary))
    note = sim_note(doc["cells"])
    if note:
        parts.append("\n" + note)
    errors = [f"{r['id']}: {e}" for r in doc["cells"] for e in r.get("errors", [])]
    if errors:
        parts.append("\nErrors:\n" + "\n".join("  " + e for e in errors))
    notes = _notes(doc["cells"])
    if notes and notes_in:
        parts.append(f"\n{len(notes)} notes in {notes_in}")
    return "\n".join(parts)


def _machines(doc: dict) -> str:
    env = doc.get("env")
    envs = env if isinstance(env, list) else [env] if isinstance(env, dict) else []
    seen = []
    for e in envs:
        line = (f"Python {e.get('python', MISSING)} — {e.get('platform', MISSING)} — "
                f"{e.get('cpu', MISSING)} on {e.get('node', MISSING)}")
        if line not in seen:
            seen.append(line)
    return "; ".join(seen) or "(environment not recorded)"


def render_markdown(doc: dict, plots: list[str]) -> str:
    cells = doc["cells"]
    lines = ["# looplab report", "",
             f"run `{doc.get('run_id', MISSING)}` — looplab {doc.get('looplab')} — {_machines(doc)}", ""]
    if doc.get("merged_from"):
        lines += [f"Merged from {len(doc['merged_from'])} results files.", ""]
    lines += [LEGEND, ""]
    note = sim_note(cells)
    if note:
        lines += [note.replace("--net sim", "`--net sim`"), ""]
    cat = catalog(doc)
    for title, header, rows in table_rows(doc):
        sid = title.split()[0]
        lines += [f"## {title}", ""]
        if cat.get(sid, {}).get("summary"):
            lines += [cat[sid]["summary"], ""]
        lines += [format_table(header, rows, markdown=True), ""]
        for p in plots:
            if os.path.basename(p).startswith(sid.lower() + "_"):
                lines += [f"![{sid}]({os.path.basename(p)})", ""]
    fid = fidelity(cells)
    lines += ["## Fidelity: does our kernel's verdict equal its references'?", "",
              "Only a mismatch with the *primary* reference (the library whose behaviour our "
              "kernel's defaults reproduce) is a fidelity failure; rows against the other "
              "references show where the libraries differ among themselves.", "",
              format_table(FIDELITY_HEADER, fid, markdown=True) if fid else "(no comparable cells)", ""]
    if doc.get("fidelity_probes"):
        from bench import fidelity as fidmod
        lines += [fidmod.markdown_section(doc["fidelity_probes"]), ""]
    notes = _notes(cells, "`")
    if notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    errors = [f"`{r['id']}`: {e}" for r in cells for e in r.get("errors", [])]
    if errors:
        lines += ["## Errors", ""] + [f"- {e}" for e in errors] + [""]
    return "\n".join(lines)


def plot(doc: dict, out_dir: str) -> list[str]:
    """PNG plots, as each scenario declares them; empty if matplotlib is missing.
    A plot function declared by a scenario that is not registered here is skipped."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return []
    cat = catalog(doc)
    key = _order_key(cat)
    registered = scmod.scenarios()
    written = []
    for sid in cat:
        cells = [r for r in doc["cells"] if r["scenario"] == sid and not r.get("skipped")]
        sc = registered.get(sid)
        if not cells or sc is None:
            continue
        for p in sc.plots:
            if isinstance(p, scmod.Bars):
                written += _bars(plt, sid, cells, p, out_dir, key)
            else:
                written += list(p(cells, out_dir, plt, key) or [])
    return written


def _bars(plt, sid, cells, bars, out_dir, key) -> list[str]:
    cells = sorted((r for r in cells if isinstance(r["metrics"].get(bars.metric), (int, float))), key=key)
    if not cells:
        return []
    labels = [f"{'*' if r.get('ours') else ''}{r['runtime']}\n{r['variant']}"
              + (f" {cell_net(r)}" if cell_net(r) else "") for r in cells]
    values = [r["metrics"][bars.metric] * bars.scale for r in cells]
    colors = ["tab:orange" if r.get("ours") else "tab:blue" for r in cells]
    fig, ax = plt.subplots(figsize=(max(6, 0.55 * len(cells)), 4.2))
    ax.bar(range(len(cells)), values, color=colors)
    ax.set_xticks(range(len(cells)), labels, rotation=70, fontsize=7)
    ax.set_ylabel(bars.ylabel)
    ax.set_title(f"{sid}: {bars.ylabel} (orange = our kernels)")
    fig.tight_layout()
    path = os.path.join(out_dir, f"{sid.lower()}_{bars.metric}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def write_report(doc: dict, out_dir: str) -> dict:
    """results.json, results.csv, report.md, the plots and report.html, each written
    atomically. The page comes last: it links only files that exist."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {"json": os.path.join(out_dir, "results.json"), "csv": os.path.join(out_dir, "results.csv"),
             "md": os.path.join(out_dir, "report.md")}
    resmod.write_json(doc, paths["json"])
    resmod.write_csv(doc, paths["csv"])
    plots = plot(doc, out_dir)
    resmod.write_text(paths["md"], render_markdown(doc, plots))
    paths["plots"] = plots
    paths["html"] = htmlmod.write_html(doc, out_dir, plots=plots)
    return paths


def progress_printer(stream=sys.stderr):
    start = time.monotonic()

    def show(i, n, result):
        status = "skipped" if result.get("skipped") else (
            "ERROR" if result["errors"] and all(v is None for v in result["verdicts"].values())
            else "ok")
        stream.write(f"[{i}/{n}] {time.monotonic() - start:5.1f}s {result['id']:<60} {status}\n")
        stream.flush()
    return show


def default_out_dir() -> str:
    return os.path.join("looplab-runs", time.strftime("%Y%m%d-%H%M%S", time.localtime()))


def verdict_failures(cells: list[dict]) -> list[str]:
    return [f"{r['id']}: {k}" for r in cells for k, v in (r.get("verdicts") or {}).items() if v is not True]


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised where SIGINT would be, so both keep the finished cells."""


def _on_sigterm(signum, frame):
    raise _Terminated()


def run_and_report(cells, out_dir: str, json_path: str | None = None, jobs: int = 1,
                   fail_on: str | None = None, baseline: dict | None = None,
                   extra: dict | None = None) -> int:
    """Run ``cells`` into ``out_dir`` (checked by the caller before this runs). Each
    finished cell is flushed to ``out_dir/results.json`` at once, so an interrupt
    (SIGINT or SIGTERM) keeps it; the full report is written at the end either way.

    ``fail_on="verdict"``: exit 1 when a verdict fails -- with a ``baseline``
    document, only when a verdict that held there fails now (a regression)."""
    run_id = resmod.new_run_id()
    env = resmod.environment()
    described = {sid: sc.describe() for sid, sc in scmod.scenarios().items()
                 if any(c.scenario == sid for c in cells)}
    finished: list[dict] = []

    def document(cell_list):
        return resmod.new_document(cell_list, run_id=run_id, env=env, scenarios=described,
                                   **(extra or {}))

    show = progress_printer()

    def progress(i, n, result):
        finished.append(result)
        show(i, n, result)
        resmod.write_json(document(finished), os.path.join(out_dir, "results.json"))

    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        results, interrupted = _run(cells, jobs, progress)
    finally:
        signal.signal(signal.SIGTERM, previous)
    order = {c.id: i for i, c in enumerate(cells)}
    results = sorted(finished if interrupted else results, key=lambda r: order.get(r["id"], 0))
    doc = document(results)
    paths = write_report(doc, out_dir)
    if json_path:
        resmod.write_json(doc, json_path)
    if interrupted:
        print(f"looplab: interrupted: {len(results)} of {len(cells)} cells finished, kept in "
              f"{paths['md']}", file=sys.stderr)
        return ExitCode.INTERRUPTED
    print(render_terminal(doc, notes_in=paths["md"]))
    print(f"\nreport: {paths['html']} (report.md, results.json, results.csv, {len(paths['plots'])} plots)")
    if any(r["errors"] for r in results):
        return ExitCode.FAILED
    if fail_on == "verdict":
        if baseline is not None:
            failed = [f"{r['cell']}: {r['metric']}" for r in cmpmod.verdict_changes(baseline, doc)
                      if r["status"] == "regression"]
        else:
            failed = verdict_failures(results)
        if failed:
            print(f"looplab: {len(failed)} verdict(s) failed: {', '.join(failed[:5])}"
                  + (" ..." if len(failed) > 5 else ""), file=sys.stderr)
            return ExitCode.FAILED
    return ExitCode.OK


def _run(cells, jobs, progress):
    try:
        return scenarios.run_matrix(cells, jobs=jobs, progress=progress)
    except KeyboardInterrupt:      # landed outside the matrix's own handler
        return [], True


def render_folder(doc: dict, out_dir: str) -> dict:
    """``looplab report``: the full report from a results document."""
    return write_report(doc, out_dir)
