"""Reports: the terminal table, the report folder (report.md, results.json/csv,
plots, report.html) and the fidelity table, rendered from a results document.

Everything is rendered from the document alone, so a report made again from a
results file (``looplab report``, merged or not, on another machine) equals the
one made at run time. What a scenario shows -- its title, columns, metric labels,
units and formatters, its variants in order, its plots -- comes from the
document's ``scenarios`` section, and which runtimes are compared with which from
its ``runtimes`` section (``bench.run.describe`` writes both). The terminal table is grouped by scenario, variant and style,
our kernel first and its reference libraries beside it, so a row of ours reads
against the rows it must reproduce. The *fidelity table* asks, for each scenario and
variant: does our kernel's verdict equal its references'? Mismatches are printed,
never hidden.
"""
from __future__ import annotations

import json
import os
import re

from bench import results as resmod
from bench.results import tables
from bench.report import html as htmlmod
from bench.report.htmldoc import axis_key, cell_net, incomplete_line, net_rank, sim_note
from bench.results.tables import MISSING, fmt, format_table, plural

from protocols.apps import STYLES as STYLE_ORDER
from bench.report import agreement
FIDELITY_HEADER = agreement.TABLE_HEADER
LEGEND = (f"Rows marked `*` are our kernels; the rows beside them are the reference libraries "
          f"of the same style. Sizes in MB/kB are powers of 10. `{MISSING}` = not measured or "
          "not observable on that runtime.")


def catalog(doc: dict) -> dict:
    """Scenario id -> its description (title, variants, metrics, verdicts, columns,
    plots) for every scenario in ``doc``, as the document records it."""
    out = dict(doc.get("scenarios") or {})
    for cell in doc["cells"]:
        out.setdefault(cell.get("scenario"), {"title": "", "variants": [], "metrics": {},
                                              "verdicts": {}, "columns": []})
    return out


def _order_key(cat: dict):
    def key(r):
        desc = cat.get(r["scenario"], {})
        variants = desc.get("variants", [])
        v = variants.index(r["variant"]) if r["variant"] in variants else len(variants)
        style = STYLE_ORDER.index(r["style"]) if r.get("style") in STYLE_ORDER else 9
        # style, then runtime, loop and interpreter (htmldoc.axis_key)
        return (v, r["variant"], style, 0 if r.get("ours") else 1, axis_key(r["runtime"]),
                net_rank(r))
    return key


def _format(desc: dict, metric: str, value) -> str:
    named = (desc.get("metrics", {}).get(metric) or {}).get("format")
    formatter = getattr(tables, named, None) if isinstance(named, str) else None
    if callable(formatter) and value is not None:
        return formatter(value)
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
            rows.append(head + [_format(desc, c, r["metrics"].get(c)) for c in cols] + [verdicts])
        out.append((f"{sid} — {desc.get('title', '')}", header, rows))
    return out


def _references(doc: dict, runtime_spec: str) -> tuple[tuple, str | None]:
    """(the runtimes this one is compared with, the primary one its *defaults*
    reproduce), as the document records them. Any runtime that names references is
    a subject of the fidelity table: our kernels and a user's kernel alike. With
    options flipped there is no primary."""
    d = (doc.get("runtimes") or {}).get(runtime_spec) or {}
    return tuple(d.get("compared_with") or ()), d.get("primary")


def fidelity(cells: list[dict], doc: dict | None = None) -> list[list[str]]:
    """For each scenario x variant: each kernel's verdicts against each reference it
    names (``bench.report.agreement``, the computation report.html uses too): rows of
    ``FIDELITY_HEADER`` whose ``verdicts`` column is same, differ or not comparable.
    Only a primary reference's difference is a fidelity failure; the others show how
    the libraries differ among themselves."""
    return agreement.table_rows(agreement.comparisons(dict(doc or {}, cells=cells)))


def _notes(cells, code="") -> list[str]:
    return sorted({f"{r['scenario']} {code}{r['runtime']}{code} {r['variant']}: {n}"
                   for r in cells for n in r.get("notes", [])})


def render_terminal(doc: dict, notes_in: str | None = None) -> str:
    parts = []
    if incomplete_line(doc):
        parts.append("\n" + incomplete_line(doc))
    for title, header, rows in table_rows(doc):
        parts.append(f"\n{title}  (* = our kernel)\n" + format_table(header, rows, align="l" * len(header)))
    comps = agreement.comparisons(doc)
    if comps:
        parts.append("\nFidelity: " + agreement.summary_line(agreement.summary(comps)))
        bad = agreement.table_rows(comps, only_not_same=True)
        if bad:
            parts.append(format_table(FIDELITY_HEADER, bad))
    probes = doc.get("fidelity_probes")
    if probes:
        primary = [p for p in probes["pairings"] if p["primary"] and p["compared"]]
        parts.append("\nFidelity probes (edges): " + "; ".join(
            f"{p['pairing']} {p['agree']}/{p['compared']} agree, {p['declared']} declared, "
            f"{p['differ']} undeclared" for p in primary))
    note = sim_note(doc["cells"], doc.get("real_network_only"))
    if note:
        parts.append("\n" + note)
    errors = [f"{r['id']}: {e}" for r in doc["cells"] for e in r.get("errors", [])]
    if errors:
        parts.append("\nErrors:\n" + "\n".join("  " + e for e in errors))
    notes = _notes(doc["cells"])
    if notes and notes_in:
        parts.append(f"\n{plural(len(notes), 'note')} in {notes_in}")
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
    if incomplete_line(doc):
        lines += [f"**{incomplete_line(doc)}**", ""]
    lines += [LEGEND, ""]
    note = sim_note(cells, doc.get("real_network_only"))
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
    comps = agreement.comparisons(doc)
    lines += ["## Fidelity: does a kernel's verdict equal its references'?", "",
              "Each kernel (ours, or one registered from outside) is compared only with the "
              "libraries it names. Only a mismatch with the *primary* reference (the library "
              "whose behaviour the kernel's defaults reproduce) is a fidelity failure; rows "
              "against the other references show where the libraries differ among themselves. "
              "A side that measured nothing is *not comparable*, never *same*.", ""]
    if comps:
        lines += [f"Fidelity: {agreement.summary_line(agreement.summary(comps))}.", "",
                  format_table(FIDELITY_HEADER, agreement.table_rows(comps), markdown=True), ""]
    else:
        lines += ["(no comparable cells)", ""]
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
    """PNG plots, as the document's scenario descriptions declare them (``Bars``,
    ``Lines``: data); empty if matplotlib is missing. A scenario's plot *function* is
    code, never in the document: it is drawn only where that scenario is registered."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return []
    cat = catalog(doc)
    key = _order_key(cat)
    written = []
    for sid, desc in cat.items():
        cells = [r for r in doc["cells"] if r["scenario"] == sid and not r.get("skipped")]
        if not cells:
            continue
        for p in desc.get("plots") or ():
            if "bars" in p:
                written += _bars(plt, sid, cells, p, out_dir, key)
            elif "lines" in p:
                written += _lines(plt, sid, cells, p["lines"], out_dir, key)
        for fn in _plot_functions(sid):
            written += list(fn(cells, out_dir, plt, key) or [])
    return written


def _plot_functions(sid: str) -> list:
    """The plot functions of scenario ``sid`` if its code is registered here."""
    from bench.scenarios import api as scmod
    sc = scmod.scenarios().get(sid)
    return [p for p in sc.plots if callable(p) and not isinstance(p, (scmod.Bars, scmod.Lines))] \
        if sc is not None else []


def _lines(plt, sid, cells, spec, out_dir, key) -> list[str]:
    """A ``Lines`` plot: a row of panels per series, a column per port style; our kernels
    thick, the first variant solid and the others dashed, one colour per runtime."""
    series = spec.get("series") or []
    drawn = [r for r in cells if any((r.get("series") or {}).get(s["name"]) for s in series)]
    if not drawn or not series:
        return []
    styles = [st for st in STYLE_ORDER if any(r.get("style") == st for r in drawn)] or [None]
    fig, axes = plt.subplots(len(series), len(styles), figsize=(5 * len(styles), 3.5 * len(series)),
                             squeeze=False, sharex=True, sharey="row")
    palette = ("tab:orange", "tab:blue", "tab:green", "tab:purple", "tab:red", "tab:brown")
    for col, style in enumerate(styles):
        here = [r for r in drawn if r.get("style") == style or style is None]
        ids = sorted({(not r.get("ours"), r["runtime"]) for r in here})
        colour = dict(zip([rid for _, rid in ids], palette))
        variants = []
        for r in sorted(here, key=key):
            if r["variant"] not in variants:
                variants.append(r["variant"])
        for r in sorted(here, key=key):
            kw = dict(color=colour.get(r["runtime"]),
                      linestyle="-" if r["variant"] == variants[0] else "--",
                      linewidth=2.4 if r.get("ours") else 1.1,
                      label=f"{'*' if r.get('ours') else ''}{r['runtime']} {r['variant']}"
                            + (f" {cell_net(r)}" if cell_net(r) else ""))
            for row, s in enumerate(series):
                pts = (r.get("series") or {}).get(s["name"])
                if pts:
                    t, v = zip(*pts)
                    axes[row][col].plot(t, [x * s.get("scale", 1.0) for x in v], **kw)
        for row, s in enumerate(series):
            axes[row][col].set_title(f"{style} style: {s['title']}" if style else s["title"],
                                     fontsize=10)
        axes[-1][col].set_xlabel(spec.get("xlabel") or "time (s)")
        if axes[0][col].get_legend_handles_labels()[0]:      # cells not measured draw no line
            axes[0][col].legend(fontsize=7)
    fig.suptitle(f"{spec.get('title', sid)}; * = our kernel", fontsize=10)
    fig.tight_layout()
    path = os.path.join(out_dir, spec.get("file") or f"{sid.lower()}_lines.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def _bars(plt, sid, cells, bars, out_dir, key) -> list[str]:
    metric, scale, ylabel = bars["bars"], bars.get("scale", 1.0), bars.get("ylabel", bars["bars"])
    cells = sorted((r for r in cells if isinstance(r["metrics"].get(metric), (int, float))), key=key)
    if not cells:
        return []
    labels = [f"{'*' if r.get('ours') else ''}{r['runtime']}\n{r['variant']}"
              + (f" {cell_net(r)}" if cell_net(r) else "") for r in cells]
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
    return [path]


#: The list of files the last report wrote into its folder, beside them.
MANIFEST = ".looplab-report.json"


def _earlier_files(out_dir: str) -> set[str]:
    """The files an earlier report wrote into ``out_dir``: its manifest, or, for a
    folder written before there was one, the plots its report.md shows."""
    try:
        with open(os.path.join(out_dir, MANIFEST)) as f:
            return {n for n in json.load(f).get("files", []) if isinstance(n, str)}
    except (OSError, ValueError, AttributeError):
        pass
    try:
        with open(os.path.join(out_dir, "report.md")) as f:
            return set(re.findall(r"^!\[[^\]]*\]\(([^/()\s]+\.png)\)$", f.read(), re.M))
    except OSError:
        return set()


def write_report(doc: dict, out_dir: str) -> dict:
    """results.json, results.csv, report.md, the plots and report.html, each written
    atomically. The page comes last: it links only files that exist.

    A folder that holds an earlier report is re-used, not refused: what the earlier
    report wrote and this one does not (a plot of a scenario not in this run) is
    removed, so nothing stale is left beside the new report; a file looplab did
    not write there is never touched. The manifest (``MANIFEST``) lists what this
    report wrote."""
    os.makedirs(out_dir, exist_ok=True)
    earlier = _earlier_files(out_dir)
    paths = {"json": os.path.join(out_dir, "results.json"), "csv": os.path.join(out_dir, "results.csv"),
             "md": os.path.join(out_dir, "report.md")}
    resmod.write_json(doc, paths["json"])
    resmod.write_csv(doc, paths["csv"])
    plots = plot(doc, out_dir)
    resmod.write_text(paths["md"], render_markdown(doc, plots))
    paths["plots"] = plots
    paths["html"] = htmlmod.write_html(doc, out_dir, plots=plots)
    written = sorted({os.path.relpath(p, out_dir) for p in (paths["json"], paths["csv"],
                                                             paths["md"], paths["html"], *plots)})
    for name in earlier - set(written):
        if not os.path.isabs(name) and ".." not in name.split(os.sep):    # inside the folder
            try:
                os.unlink(os.path.join(out_dir, name))
            except OSError:
                pass
    resmod.write_json({"files": written}, os.path.join(out_dir, MANIFEST))
    return paths


def render_folder(doc: dict, out_dir: str) -> dict:
    """``looplab report``: the full report from a results document."""
    return write_report(doc, out_dir)
