"""report.html: one self-contained page per results document.

The page answers the questions looplab exists for -- which runtimes let a buffer grow
without bound, which lose data at shutdown, how the causality fingerprints differ -- for
a reader who has nothing but this one file. It holds the verdict grid (runtimes down the
side grouped by port style, our kernel first and its references beside it; scenario x
variant across), a section per scenario (what it shows, a plot, a table), the fidelity of
our kernels to their primary references, the benchmarks when the document has any, and
the run's metadata.

Self-contained means no network and nothing outside the file but plain links: CSS, SVG
and a few lines of script are inline, and the page reads the same with the script off
(hover cards and anchors are CSS; the script only toggles plot series).

Deterministic: cells are ordered by their ids and the registry, never by the order they
appear in the document, and everything that differs between two runs of the same
measurements (run ids, times, load, the command, timing metrics) sits inside elements
marked ``data-volatile``. So a report from merged shards equals the unsharded one with
those elements removed.

This module is the page and its sections; ``bench.report.htmldoc`` reads the document,
``bench.report.svg`` draws the charts, ``bench.report.htmlbench`` holds the benchmarks section
and ``bench.report.htmlfidelity`` the two fidelity sections.
"""
from __future__ import annotations


import json
import os

from bench.report.htmlbench import BenchmarkSections
from bench.report.htmlcheck import CheckSections, is_check
from bench.report.htmlfidelity import FidelitySections
from bench.report.htmldoc import (BENCH_KINDS, MID, NO, STAR, STATUSES, YES, Anchors,
                                  Runtimes, cell_net, cell_series, cell_status, e, fmt_value,
                                  html_table, incomplete_line, is_number, machine_rows,
                                  metric_label, net_rank, rt_label, scenario_info, scenario_order,
                                  series_metric, sim_note, variant_index, verdict_text,
                                  worst_status)
from bench.report.svg import OURS_COLOUR, PALETTE, bar_chart, line_chart
from bench.results import write_text
from bench.results.tables import fmt, plural

__all__ = ["write_html", "render_html", "cell_status", "STATUSES", "BENCH_KINDS"]


class _Page(BenchmarkSections, FidelitySections, CheckSections):
    def __init__(self, doc: dict, plots: dict | None, command: str | None, out_dir: str | None):
        self.doc = doc
        cells = [c for c in (doc.get("cells") or []) if isinstance(c, dict)]
        self.cells = sorted(cells, key=lambda c: (scenario_order(c.get("scenario", "")), str(c.get("id", ""))))
        self.bench = [c for c in self.cells if c.get("scenario") in BENCH_KINDS]
        self.scen = [c for c in self.cells if c.get("scenario") not in BENCH_KINDS]
        self.rts = Runtimes(self.cells, doc.get("runtimes"))
        self.anchors = Anchors()
        self.sids = sorted({c.get("scenario", "?") for c in self.scen}, key=scenario_order)
        self.info = {sid: scenario_info(doc, sid, [c for c in self.scen if c.get("scenario") == sid])
                     for sid in self.sids}
        if isinstance(plots, (list, tuple)):      # what bench.report.plot() returns: paths
            plots = {os.path.basename(str(p)): p for p in plots}
        self.plots = dict(plots or {})
        self.command = command if command is not None else doc.get("command")
        self.out_dir = out_dir
        for sid in self.sids:
            self.anchors.get(sid, "s")
        for c in self.scen:
            self.anchors.get(str(c.get("id")), "c")
        self._fingerprint = self._find_fingerprint()

    def by_key(self):
        """(runtime, scenario, variant, net) -> cells; net is None unless the run chose
        one (``--net``), so ``--net both`` keeps a runtime's real and sim cells apart."""
        out = {}
        for c in self.scen:
            out.setdefault((c.get("runtime", "?"), c.get("scenario", "?"), c.get("variant", "?"),
                            cell_net(c)), []).append(c)
        return out

    def nets(self) -> list:
        """The networks in this document, real first ([None] without ``--net``)."""
        return sorted({cell_net(c) for c in self.scen}, key=lambda n: net_rank({"params": {"net": n}}))

    def label(self, cell) -> str:
        """A cell's runtime as the page names it: with its network under ``--net``."""
        net = cell_net(cell)
        return rt_label(self.rts, cell.get("runtime", "?")) + (
            f' <small class="net">{e(net)}</small>' if net else "")

    # -- the verdict grid --------------------------------------------------
    def grid(self) -> str:
        if not self.scen:
            return ""
        keyed = self.by_key()
        columns = [(sid, v) for sid in self.sids for v in self.info[sid]["variants"]
                   if any(k[1] == sid and k[2] == v for k in keyed)]
        specs = self.rts.ordered(c.get("runtime", "?") for c in self.scen)
        nets = self.nets()
        head1 = ['<th rowspan="2" class="corner">runtime \\ scenario</th>']
        for sid in self.sids:
            n = sum(1 for s, _ in columns if s == sid)
            if n:
                head1.append(f'<th colspan="{n}" class="sc"><a href="#{self.anchors.get(sid, "s")}" '
                             f'title="{e(self.info[sid]["title"])}">{e(sid)}</a></th>')
        head2 = [f'<th class="var">{e(v)}</th>' for _, v in columns]
        rows, style = [], None
        ncol = len(columns)
        for spec in specs:
            info = self.rts[spec]
            if info["style"] != style:
                style = info["style"]
                rows.append(f'<tr class="style"><th colspan="{ncol + 1}">{e(style)} style</th></tr>')
            # one row per network the runtime ran on: real and sim side by side
            for net in [n for n in nets if any(k[0] == spec and k[3] == n for k in keyed)]:
                tds = []
                for i, (sid, v) in enumerate(columns):
                    tds.append(self.grid_cell(spec, sid, v, keyed.get((spec, sid, v, net), []),
                                              i >= ncol * 0.6, net))
                cls = ' class="ours"' if info["ours"] else ""
                tag = f' <small class="net">{e(net)}</small>' if net else ""
                rows.append(f'<tr{cls}><th class="rt">{rt_label(self.rts, spec)}{tag}</th>{"".join(tds)}</tr>')
        legend = " ".join(
            f'<span class="key"><span class="sw v-{k}">{STATUSES[k][1]}</span> {e(STATUSES[k][0])}</span>'
            for k in STATUSES)
        return ('<div class="gridwrap"><table class="grid" id="grid"><thead><tr>' + "".join(head1)
                + "</tr><tr>" + "".join(head2) + "</tr></thead><tbody>" + "".join(rows)
                + f'</tbody></table></div><p class="legend">{legend}</p><p class="legend">{STAR} our kernel, '
                "listed first in its style with the libraries it imitates below it. Each cell shows the "
                "scenario's first metric; hover it for the others, click it for its row in the "
                "scenario's table.</p>" + self.net_note())

    def net_note(self) -> str:
        note = sim_note(self.scen, self.doc.get("real_network_only"))
        return f'<p class="legend simnote" id="simnet">{e(note)}</p>' if note else ""

    def grid_cell(self, spec, sid, variant, cells, flip, net=None) -> str:
        info = self.info[sid]
        key = f"{e(spec)}|{e(sid)}|{e(variant)}" + (f"|{e(net)}" if net else "")
        if not cells:
            styles = info.get("styles") or []
            why = (f"{sid} runs on the {', '.join(styles)} style only" if styles
                   and self.rts[spec]["style"] not in styles else "not in this run")
            return (f'<td class="v-na" data-status="na" data-key="{key}" '
                    f'title="not applicable: {e(why)}"></td>')
        status = worst_status(cell_status(c) for c in cells)
        main = cells[0]
        head = next((m for m in info["columns"] if is_number((main.get("metrics") or {}).get(m))), None)
        text = STATUSES[status][1]
        if head and status in ("pass", "fail", "measured") and sid != self.fingerprint_sid():
            text += " " + e(fmt_value(head, main["metrics"][head]))
        tip = [f'<b>{e(spec)}</b> \u00b7 {e(sid)} {e(variant)}{(MID + e(net)) if net else ""}'
               f'<br><i>{e(STATUSES[status][0])}</i>']
        for c in cells:
            if len(cells) > 1:
                tip.append(f'<div class="muted">{e(str(c.get("id")))}</div>')
            rows = "".join(f"<tr><td>{e(metric_label(info, m))}</td><td>{e(fmt_value(m, c['metrics'][m]))}</td></tr>"
                           for m in info["columns"] if (c.get("metrics") or {}).get(m) is not None)
            if rows:
                tip.append(f"<table>{rows}</table>")
            tip.append(verdict_text(c, info))
            for n in (c.get("notes") or [])[:2]:
                tip.append(f'<div class="note">{e(str(n)[:200])}</div>')
        ids = " ".join(str(c.get("id")) for c in cells)
        anchor = self.anchors.get(str(main.get("id")), "c")
        return (f'<td class="v-{status}{" flip" if flip else ""}" data-status="{status}" '
                f'data-key="{key}" data-cells="{e(ids)}">'
                f'<a href="#{anchor}">{text}</a><div class="tip">{"".join(tip)}</div></td>')

    # -- the three questions -----------------------------------------------
    def answers(self) -> str:
        def witness(c, kind):
            """The number that shows why a verdict failed, as (label, text)."""
            m = c.get("metrics") or {}
            if kind == "grow":
                names = [n for n in m if n.endswith("_bytes") and ("buffer" in n or "queue" in n) and is_number(m[n])]
                if names:
                    best = max(sorted(names), key=lambda n: m[n])
                    return fmt(best, m[best]) + (" in the app's own queue" if app_queue(c) else "")
                for n in ("in_flight_at_end_bytes", "rss_growth_bytes"):
                    if is_number(m.get(n)):
                        return fmt(n, m[n])
            else:
                if is_number(m.get("lost_bytes")):
                    return fmt("lost_bytes", m["lost_bytes"]) + " lost"
                for n in sorted(m):
                    if "delivered" in n and is_number(m[n]):
                        return fmt(n, m[n]) + " delivered"
            return ""

        def answers_it(sid, name, want):
            """Whether verdict ``name`` answers a question, from its declarations: it
            holds when good (not a symptom) and a metric deciding it has the unit and
            direction the question asks about (``want``: {(unit, direction), ...})."""
            info = self.info.get(sid) or {}
            if name in (info.get("symptoms") or ()):
                return False
            metrics = info.get("metrics") or {}
            return any((metrics.get(m, {}).get("unit"), metrics.get(m, {}).get("direction")) in want
                       for m in (info.get("decided_by") or {}).get(name, ()))

        grow = {("bytes", "lower"), ("count", "lower")}

        def app_queue(c) -> bool:
            """Whether ``c``'s unbounded backlog is the app's own queue, not the
            runtime's buffer: the largest of the metrics deciding its failing bounded
            verdicts is one its scenario declares the app's (``Metric.owner``)."""
            info = self.info.get(c.get("scenario")) or {}
            declared, m = info.get("metrics") or {}, c.get("metrics") or {}
            deciding = [n for v, ok in (c.get("verdicts") or {}).items() if ok is False
                        and answers_it(c.get("scenario"), v, grow)
                        for n in (info.get("decided_by") or {}).get(v, ())
                        if (declared.get(n, {}).get("unit"), declared.get(n, {}).get("direction"))
                        in grow and is_number(m.get(n))]
            if not deciding:
                return False
            top = max(sorted(deciding), key=lambda n: m[n])
            return declared.get(top, {}).get("owner") == "app"

        def question(want, kind, none_text, legend):
            found = {}
            for c in self.scen:
                names = [n for n in (c.get("verdicts") or {}) if answers_it(c.get("scenario"), n, want)]
                if names:
                    if any(c["verdicts"][n] is None for n in names):
                        continue        # not measured: no answer either way
                    holds = all(c["verdicts"][n] for n in names)
                    found.setdefault((c.get("scenario"), c.get("variant")), ([], []))[1 if holds else 0].append(c)
            if not found:
                return f'<p class="muted">{none_text}</p>'
            rows, clean, bad_rts, app_rts, seen = [], [], set(), set(), set()
            for (sid, variant), (failing, holding) in sorted(
                    found.items(), key=lambda kv: (scenario_order(kv[0][0]),
                                                   variant_index(self.info[kv[0][0]]["variants"], kv[0][1]))):
                seen.update(c["runtime"] for c in failing + holding)
                link = f'<a href="#{self.anchors.get(sid, "s")}">{e(sid)}</a> {e(variant)}'
                if not failing:
                    clean.append(link)
                    continue
                order = {s: i for i, s in enumerate(self.rts.ordered(c["runtime"] for c in failing + holding))}
                for c in failing:       # an app's own queue is not the runtime's buffer
                    (app_rts if kind == "grow" and app_queue(c) else bad_rts).add(c["runtime"])
                fails = ", ".join(self.label(c) + (
                    f' <span class="muted">{e(witness(c, kind))}</span>' if witness(c, kind) else "")
                    for c in sorted(failing, key=lambda c: (order[c["runtime"]], net_rank(c))))
                holds = ", ".join(self.label(c) for c in sorted(
                    holding, key=lambda c: (order[c["runtime"]], net_rank(c)))) or "none"
                rows.append([link, fails, holds])
            app_rts -= bad_rts
            never = [s for s in self.rts.ordered(seen) if s not in bad_rts and s not in app_rts]
            out = ("<p>" + (f"{NO} somewhere: " + ", ".join(rt_label(self.rts, s) for s in self.rts.ordered(bad_rts))
                            if bad_rts else "No runtime fails.")
                   + (". Only the app's own queue grew (the app's policy, not the runtime's "
                      "buffer): " + ", ".join(rt_label(self.rts, s) for s in self.rts.ordered(app_rts))
                      if app_rts else "")
                   + (f". {YES} everywhere it ran: " + ", ".join(rt_label(self.rts, s) for s in never)
                      if never and (bad_rts or app_rts) else "") + ".</p>")
            if rows:
                out += html_table(["cell", f"{NO} fails", f"{YES} holds"], rows, cls="data answer", caption=legend)
            if clean:
                out += f'<p class="muted">Holds on every runtime: {", ".join(clean)}.</p>'
            return out

        return "".join([
            '<div class="answers"><h2 id="answers">The three questions</h2>',
            "<h3>Which runtimes let the buffer grow without bound?</h3>",
            # a buffer or backlog that should stay low: bytes or a count, lower is better
            question(grow, "grow",
                     "No scenario with a bounded verdict in this run (S1, S5 and S6 answer it).",
                     "the bounded verdict: user-space buffer (or queue, or memory) within its limit; "
                     "after a failing runtime, its largest user-space buffer or queue (a queue "
                     "the app keeps by its own policy is said to be the app's)"),
            "<h3>Which lose data at shutdown?</h3>",
            # bytes that should arrive: higher is better
            question({("bytes", "higher")}, "loss",
                     "No scenario with a no_loss verdict in this run (S3 and S8 answer it).",
                     "the no_loss verdict: every byte written reached the peer"),
            "<h3>How do the causality fingerprints differ?</h3>", self.fingerprint_summary(), "</div>"])

    def fingerprint_sid(self):
        return self._fingerprint

    def _find_fingerprint(self):
        for sid in self.sids:
            if sid == "S4" or any("matches_declared" in (c.get("verdicts") or {})
                                  for c in self.scen if c.get("scenario") == sid):
                return sid
        return None

    def fingerprint_summary(self) -> str:
        sid = self.fingerprint_sid()
        if sid is None:
            return '<p class="muted">No fingerprint scenario in this run (S4 answers it).</p>'
        info = self.info[sid]
        cells = [c for c in self.scen if c.get("scenario") == sid and c.get("metrics")]
        order = {s: i for i, s in enumerate(self.rts.ordered(c["runtime"] for c in cells))}
        items = []
        for m in info["columns"]:
            groups = {}
            for c in sorted(cells, key=lambda c: order[c["runtime"]]):
                v = c["metrics"].get(m)
                groups.setdefault("n/a" if v is None else fmt_value(m, v), []).append(c["runtime"])
            if len(groups) < 2:
                continue
            alts = "; ".join(f"<b>{e(v)}</b> on {', '.join(rt_label(self.rts, r) for r in rs)}"
                             for v, rs in groups.items())
            items.append(f"<li>{e(metric_label(info, m))}: {alts}</li>")
        same = [(metric_label(info, m)) for m in info["columns"]
                if len({fmt_value(m, c["metrics"].get(m)) for c in cells}) == 1]
        out = f'<p>From <a href="#{self.anchors.get(sid, "s")}">{e(sid)}</a>; only the facts that differ:</p>'
        out += "<ul>" + "".join(items) + "</ul>" if items else "<p>Every runtime measured the same row.</p>"
        if same:
            out += f'<p class="muted">The same everywhere: {e(", ".join(same))}.</p>'
        return out

    # -- per scenario ----------------------------------------------------------
    def scenario(self, sid: str) -> str:
        info = self.info[sid]
        cells = [c for c in self.scen if c.get("scenario") == sid]
        order = {s: i for i, s in enumerate(self.rts.ordered(c.get("runtime", "?") for c in cells))}
        vorder = {v: i for i, v in enumerate(info["variants"])}
        cells.sort(key=lambda c: (order[c.get("runtime", "?")], vorder.get(c.get("variant"), 99), net_rank(c),
                                  str(c.get("id"))))
        anchor = self.anchors.get(sid, "s")
        out = [f'<section class="scenario"><h2 id="{anchor}">{e(sid)} \u2014 {e(info["title"])}</h2>']
        if info["summary"]:
            out.append(f'<p class="summary">{e(info["summary"])}</p>')
        if info["verdicts"]:
            out.append('<p class="muted">Verdicts: ' + "; ".join(
                f"<code>{e(k)}</code>: {e(str(v))}" for k, v in sorted(info["verdicts"].items())) + "</p>")
        plots = self.scenario_plots(sid, info, cells)
        out.append(f'<div class="pair"><div class="plots">{plots}</div>')
        out.append(f'<div class="tables">{self.scenario_table(sid, info, cells)}</div></div>')
        pngs = [(lb, p) for lb, p in sorted(self.plots.items())
                if os.path.basename(str(p)).lower().startswith(sid.lower() + "_")]
        if pngs:
            out.append('<p class="muted">Also as image: ' + ", ".join(
                f'<a href="{e(self.rel(p))}">{e(os.path.basename(str(p)))}</a>' for _, p in pngs) + "</p>")
        notes = sorted({f"{c.get('runtime')} {c.get('variant')}{' ' + cell_net(c) if cell_net(c) else ''}: {n}"
                        for c in cells for n in c.get("notes") or []})
        if notes:
            out.append(f'<details><summary>{plural(len(notes), "note")}</summary><ul>'
                       + "".join(f"<li>{e(n)}</li>" for n in notes) + "</ul></details>")
        out.append("</section>")
        return "".join(out)

    def scenario_plots(self, sid, info, cells) -> str:
        series_cells = [c for c in cells if cell_series(c)]
        if series_cells:
            return self.series_plots(sid, info, series_cells)
        numeric = [m for m in info["columns"]
                   if any(isinstance((c.get("metrics") or {}).get(m), (int, float))
                          and not isinstance(c["metrics"][m], bool) for c in cells)][:2]
        if not numeric:
            return '<p class="muted">(no numeric metric to plot)</p>'
        variants = [v for v in info["variants"] if any(c.get("variant") == v for c in cells)]
        colours = {v: PALETTE[i % len(PALETTE)] for i, v in enumerate(variants)}
        charts = []
        nets = sorted({cell_net(c) for c in cells}, key=lambda n: net_rank({"params": {"net": n}}))
        for m in numeric:
            rows = []
            for spec in self.rts.ordered(c.get("runtime", "?") for c in cells):
                for net in nets:
                    vals = {c.get("variant"): c["metrics"][m] for c in cells if c.get("runtime") == spec
                            and cell_net(c) == net and isinstance((c.get("metrics") or {}).get(m), (int, float))
                            and not isinstance(c["metrics"][m], bool)}
                    if vals or len(nets) == 1:
                        rows.append((f"{spec} {net}" if net else spec, self.rts[spec]["ours"], vals))
            charts.append(bar_chart(f"{sid}: {metric_label(info, m)}", m, rows, variants, colours))
        return "".join(charts)

    def series_plots(self, sid, info, cells) -> str:
        names = sorted({n for c in cells for n in cell_series(c)}, key=lambda n: (n != "in_flight", n))
        variants = [v for v in info["variants"] if any(c.get("variant") == v for c in cells)]
        charts, summary = [], {}
        styles = []
        for spec in self.rts.ordered(c.get("runtime", "?") for c in cells):
            if self.rts[spec]["style"] not in styles:
                styles.append(self.rts[spec]["style"])
        for name in names:
            metric = series_metric(name)
            row = []
            for style in styles:
                specs = [s for s in self.rts.ordered(c.get("runtime", "?") for c in cells)
                         if self.rts[s]["style"] == style]
                colour = {}
                refs = [s for s in specs if not self.rts[s]["ours"]]
                for s in specs:
                    colour[s] = OURS_COLOUR if self.rts[s]["ours"] else PALETTE[refs.index(s) % len(PALETTE)]
                lines = []
                for s in specs:
                    for c in sorted((c for c in cells if c.get("runtime") == s),
                                    key=lambda c: (variant_index(variants, c.get("variant")), net_rank(c))):
                        pts = cell_series(c).get(name)
                        if not pts:
                            continue
                        v = c.get("variant", "?")
                        vn = f"{v} {cell_net(c)}" if cell_net(c) else v
                        lines.append((f"{s} {vn}", f"{STAR if self.rts[s]['ours'] else ''}{s} {vn}", colour[s],
                                      variants.index(v) > 0 if v in variants else True, self.rts[s]["ours"], pts))
                        summary.setdefault((s, vn), {})[name] = (
                            fmt_value(metric, max(p[1] for p in pts)), fmt_value(metric, pts[-1][1]))
                if lines:
                    row.append(line_chart(f"{sid} {style} style: {name.replace('_', ' ')}", metric, lines,
                                          xlabel="time (s)", width=430, height=230))
            charts.append(row)
        # one row per series with a chart per style; a single style puts its charts side by side
        rows_html = ['<div class="row">' + "".join(r) + "</div>" for r in charts] if len(styles) > 1 else \
            ['<div class="row">' + "".join(x for r in charts for x in r) + "</div>"]
        charts = rows_html
        note = ('<p class="muted">Solid: the first variant (' + e(variants[0] if variants else "") +
                "); dashed: the others. Thick orange: our kernel. Click a legend entry to hide or show "
                "its line; hover a line for its peak.</p>")
        order = {sp: i for i, sp in enumerate(self.rts.ordered(c.get("runtime", "?") for c in cells))}
        rows = [[rt_label(self.rts, sp), e(v)]
                + [e(summary[(sp, v)].get(n, ("-", "-"))[k]) for n in names for k in (0, 1)]
                for sp, v in sorted(summary, key=lambda sv: (order[sv[0]], variant_index(variants, sv[1].split()[0]),
                                                             sv[1]))]
        header = ["runtime", "variant"] + [f"{e(n.replace('_', ' '))}: {k}"
                                           for n in names for k in ("peak", "at the end")]
        table = html_table(header, rows, caption="the plotted series in numbers")
        return "".join(charts) + note + table

    def scenario_table(self, sid, info, cells) -> str:
        cols = info["columns"]
        fingerprint = sid == self.fingerprint_sid()
        mode = {}
        if fingerprint:
            for m in cols:
                vals = ["n/a" if (c.get("metrics") or {}).get(m) is None else fmt_value(m, c["metrics"][m])
                        for c in cells if c.get("metrics")]
                mode[m] = max(sorted(set(vals)), key=vals.count) if vals else None
        rows, attrs = [], []
        with_net = any(cell_net(c) for c in cells)
        for c in cells:
            row = [rt_label(self.rts, c.get("runtime", "?")), e(str(c.get("variant", "?")))]
            if with_net:
                row.append(e(cell_net(c) or "real"))
            for m in cols:
                v = (c.get("metrics") or {}).get(m)
                # a fingerprint fact a style cannot have (no tasks on the callback port) is n/a, not 0
                text = "n/a" if fingerprint and v is None and c.get("metrics") else e(fmt_value(m, v))
                if fingerprint and c.get("metrics") and text != e(mode.get(m) or ""):
                    text = f'<span class="diff" title="differs from most runtimes">{text}</span>'
                row.append(text)
            row.append(verdict_text(c, info))
            rows.append(row)
            cls = "ours" if self.rts[c.get("runtime", "?")]["ours"] else ""
            attrs.append(f' id="{self.anchors.get(str(c.get("id")), "c")}"' + (f' class="{cls}"' if cls else ""))
        header = ["runtime", "variant"] + (["net"] if with_net else []) + [e(metric_label(info, m)) for m in cols] \
            + ["verdicts"]
        cap = "\u2605 our kernel; highlighted values differ from most runtimes" if fingerprint else "\u2605 our kernel"
        out = html_table(header, rows, row_attrs=attrs, caption=cap)
        extra = [m for m in info["all_metrics"] if m not in cols]
        if extra:
            more = [[rt_label(self.rts, c.get("runtime", "?")), e(str(c.get("variant")))]
                    + ([e(cell_net(c) or "real")] if with_net else [])
                    + [e(fmt_value(m, (c.get("metrics") or {}).get(m))) for m in extra] for c in cells]
            out += ('<details><summary>every metric</summary>'
                    + html_table(["runtime", "variant"] + (["net"] if with_net else []) + [e(m) for m in extra],
                                 more, cls="more") + "</details>")
        return out

    def rel(self, path) -> str:
        """``path`` (absolute, or relative to the working directory as the plots'
        paths are) as the page, in ``out_dir``, links it."""
        path = str(path)
        if self.out_dir:
            return os.path.relpath(os.path.abspath(path), os.path.abspath(self.out_dir))
        return path

    def metadata(self) -> str:
        envs = self.doc.get("env")
        envs = envs if isinstance(envs, list) else [envs] if isinstance(envs, dict) else []
        machines = sorted({machine_rows(env) for env in envs if isinstance(env, dict)})
        out = ['<section><h2 id="run">Run</h2>']
        if machines:
            names = list(dict.fromkeys(n for m in machines for n, _ in m))
            rows = [[e(n)] + [e(dict(m).get(n, "-")) for m in machines] for n in names]
            out.append(html_table(["", *[f"machine {i + 1}" if len(machines) > 1 else "machine"
                                     for i in range(len(machines))]], rows, cls="data meta"))
            if len(machines) > 1:
                out.append(f'<p class="no">These results come from {len(machines)} different machines or '
                           "interpreters: compare numbers only within one.</p>")
        runs = self.doc.get("merged_from") or [self.doc.get("run_id")]
        times = sorted({str(env.get("time_utc")) for env in envs if isinstance(env, dict) and env.get("time_utc")})
        loads = [env.get("loadavg") for env in envs if isinstance(env, dict) and env.get("loadavg")]
        vol = [f"run id {e(', '.join(str(r) for r in runs if r))}"]
        if times:
            vol.append("started " + e(", ".join(times)))
        if loads:
            vol.append("load average at start " + e("; ".join(" ".join(f"{x:.2f}" for x in ld) for ld in loads)))
        cmd = self.command
        out.append(f'<p data-volatile="run">{MID.join(vol)}</p>')
        out.append('<p data-volatile="command">command: '
                   + (f"<code>{e(cmd)}</code>" if cmd else '<span class="muted">not recorded</span>') + "</p>")
        cfg = self.doc.get("config")
        if cfg:
            out.append(f'<p>configuration: <code>{e(json.dumps(cfg, sort_keys=True, default=str))}</code></p>')
        out.append(f"<p>looplab {e(str(self.doc.get('looplab', '?')))}, results schema "
                   f"{e(str(self.doc.get('schema', '?')))}, {plural(len(self.cells), 'cell')}.</p>")
        links = []
        if self.out_dir is None or os.path.exists(os.path.join(self.out_dir, "results.json")):
            links.append('<a href="results.json">results.json</a> (every metric, sample and verdict)')
        if self.out_dir is None or os.path.exists(os.path.join(self.out_dir, "results.csv")):
            links.append('<a href="results.csv">results.csv</a>')
        if self.out_dir is None or os.path.exists(os.path.join(self.out_dir, "report.md")):
            links.append('<a href="report.md">report.md</a>')
        if links:
            out.append("<p>In this folder: " + ", ".join(links) + ".</p>")
        traces = sorted(self.traces())
        files = [(lb, p) for lb, p in sorted(self.plots.items()) if (lb, p) not in traces]
        if traces:
            out.append("<p>Traces (Chrome trace-event JSON; open in Perfetto): " + ", ".join(
                f'<a href="{e(self.rel(p))}">{e(lb)}</a>' for lb, p in traces) + ".</p>")
        if files:
            out.append("<p>Other files: " + ", ".join(f'<a href="{e(self.rel(p))}">{e(lb)}</a>' for lb, p in files)
                       + ".</p>")
        out.append("</section>")
        return "".join(out)

    def traces(self):
        found = set()
        for c in self.cells:
            for src in (c, c.get("details") or {}, c.get("params") or {}):
                for key in ("trace", "trace_path"):
                    if isinstance(src.get(key), str) and src.get(key):
                        found.add((str(c.get("id")), src[key]))
        for lb, p in self.plots.items():
            if "trace" in str(lb).lower() or str(p).endswith(".trace.json"):
                found.add((lb, p))
        return found

    # -- the page -------------------------------------------------------------
    def render(self) -> str:
        body = []
        title = "looplab report"
        nav = ['<a href="#grid">verdicts</a>'] if self.scen else []
        if self.scen:
            nav.append('<a href="#answers">the three questions</a>')
        nav += [f'<a href="#{self.anchors.get(sid, "s")}">{e(sid)}</a>' for sid in self.sids]
        fidelity = self.fidelity()
        probes = self.probes()
        bench = self.benchmarks()
        if fidelity:
            nav.append('<a href="#fidelity">fidelity</a>')
        if probes:
            nav.append('<a href="#probes">fidelity probes</a>')
        if bench:
            nav.append('<a href="#bench">benchmarks</a>')
        nav.append('<a href="#run">run</a>')
        counts = {}
        for c in self.scen:
            st = cell_status(c)
            counts[st] = counts.get(st, 0) + 1
        summary = ", ".join(f"{counts[k]} {STATUSES[k][0]}" for k in STATUSES if counts.get(k))
        body.append(f'<header><h1>{title}</h1><p class="lead">{len(self.scen)} scenario cells'
                    f'{" (" + e(summary) + ")" if summary else ""}'
                    f'{", " + str(len(self.bench)) + " benchmark cells" if self.bench else ""} on '
                    f'{plural(len({c.get("runtime") for c in self.cells}), "runtime")}.</p>'
                    f'<nav>{MID.join(nav)}</nav></header>')
        if incomplete_line(self.doc):
            body.append(f'<p class="no" id="incomplete"><strong>{e(incomplete_line(self.doc))}</strong></p>')
        if self.scen:
            body.append('<section><h2 id="verdicts">Verdicts</h2>' + self.grid() + "</section>")
            body.append(self.check_answers() if is_check(self.doc) else self.answers())
            for sid in self.sids:
                body.append(self.scenario(sid))
        body.append(fidelity)
        body.append(probes)
        body.append(bench)
        body.append(self.metadata())
        return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{title}</title>"
                f"<style>{_CSS}</style></head><body>" + "\n".join(b for b in body if b)
                + f"<script>{_JS}</script></body></html>\n")


_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;color:#1a1a1a;
margin:0 auto;padding:12px 24px 60px;max-width:1500px;background:#fafafa}
h1{margin:8px 0 2px;font-size:26px}h2{margin:28px 0 8px;font-size:20px;border-bottom:1px solid #ddd;padding-bottom:3px}
h3{margin:16px 0 6px;font-size:16px}a{color:#0b5cad}nav{margin:6px 0 0;font-size:13px}
code{background:#f0f0f0;padding:0 3px;border-radius:3px;font-size:12px}
.lead{margin:0;color:#444}.muted{color:#777}.ok{color:#1a7a35}.no{color:#b2182b;font-weight:600}.err{color:#7b3294}
span.ours{font-weight:700;color:#a63603}
.gridwrap{overflow-x:auto;padding-bottom:4px}
table.grid{border-collapse:separate;border-spacing:2px;font-size:12px}
table.grid th{font-weight:600;background:#eee;padding:3px 6px;white-space:nowrap}
table.grid th.rt{text-align:left;background:#f4f4f4}
table.grid tr.ours th.rt{background:#fde0c5}
table.grid tr.style th{background:none;text-align:left;color:#555;font-style:italic;padding-top:8px}
table.grid th.var{font-weight:400;font-size:11px}
table.grid>tbody>tr>td{position:relative;min-width:64px;height:24px;padding:0;text-align:center;border-radius:3px;
white-space:nowrap}
table.grid>tbody>tr>td>a{display:block;padding:3px 5px;color:inherit;text-decoration:none}
table.grid>tbody>tr>td.v-na{border:1px dashed #ddd}
table.grid>tbody>tr>td:hover{outline:2px solid #333;z-index:3}
.tip{display:none;position:absolute;left:0;top:100%;z-index:5;background:#fff;color:#111;border:1px solid #999;
box-shadow:0 3px 10px rgba(0,0,0,.25);padding:6px 8px;text-align:left;white-space:normal;width:290px;
font-size:12px;font-weight:400;border-radius:4px}
td.flip .tip{left:auto;right:0}
table.grid>tbody>tr>td:hover .tip{display:block}
.tip table{border-collapse:collapse;margin:4px 0}.tip td{padding:0 8px 0 0;text-align:left;background:none}
.tip .note{color:#555;font-size:11px;margin-top:3px}
.v-pass{background:#a6dba0;color:#0b3d14}.v-fail{background:#f4a582;color:#5c0a0a;font-weight:600}
.v-error{background:#7b3294;color:#fff}.v-skipped{background:#d9d9d9;color:#333}
.v-measured{background:#c6dbef;color:#08306b}.v-na{background:#fff;color:#999}
.legend{font-size:12px;color:#444}.key{margin-right:12px;white-space:nowrap}
.sw,.badge{display:inline-block;min-width:16px;text-align:center;border-radius:3px;padding:0 3px;
border:1px solid #ccc}
.answers{background:#fff;border:1px solid #ddd;border-radius:6px;padding:2px 16px 8px;margin-top:16px}
.answers li{margin:3px 0}
section.scenario{margin-top:10px}
.summary{font-size:15px;max-width:1000px}
.pair{display:flex;flex-wrap:wrap;gap:16px;align-items:flex-start}
.plots{flex:0 1 auto}.plots .row{display:flex;flex-wrap:wrap;gap:6px}.tables{flex:1 1 560px;min-width:0;overflow-x:auto}
svg.chart{background:#fff;border:1px solid #e2e2e2;border-radius:4px;margin:0 6px 6px 0;font-family:inherit}
svg.chart .lg{cursor:pointer}svg.chart .lg.off{opacity:.35}
table.data,table.more{border-collapse:collapse;background:#fff;font-size:12px;margin:4px 0 8px}
p.caption{color:#666;font-size:12px;margin:6px 0 0}
table.data th,table.data td,table.more th,table.more td{border:1px solid #ddd;padding:3px 7px;text-align:left;
vertical-align:top}
table.data th,table.more th{background:#f1f1f1;font-weight:600}
td.n{white-space:nowrap}
table.data tr.ours td{background:#fff5eb}
table.data tr:target td{background:#fff3a8}
table.data td span.ok,table.data td span.no,table.data td span.err{margin-right:6px;white-space:nowrap}
.diff{background:#fee08b;padding:0 3px;border-radius:2px;font-weight:600}
table.meta td:first-child{font-weight:600;white-space:nowrap}
details{margin:4px 0 10px}summary{cursor:pointer;color:#0b5cad}
small.net{font-weight:400;color:#555;font-size:11px;background:#eef;border-radius:3px;padding:0 3px}
"""

# Legend clicks toggle a series; the body attributes let a test see that the script ran
# and that every chart and table has a size on screen.
_JS = """
(function(){
  var legends = document.querySelectorAll('svg.chart .lg');
  for (var i = 0; i < legends.length; i++) {
    legends[i].addEventListener('click', function(ev){
      var g = ev.currentTarget, svg = g.ownerSVGElement, key = g.getAttribute('data-key');
      var off = !g.classList.contains('off');
      g.classList.toggle('off', off);
      var parts = svg.querySelectorAll('[data-series]');
      for (var j = 0; j < parts.length; j++) {
        if (parts[j].getAttribute('data-series') === key) parts[j].style.display = off ? 'none' : '';
      }
    });
  }
  function shown(sel){
    var n = 0, els = document.querySelectorAll(sel);
    for (var i = 0; i < els.length; i++) {
      var r = els[i].getBoundingClientRect();
      if (r.width > 0 && r.height > 0) n++;
    }
    return n;
  }
  var b = document.body;
  b.setAttribute('data-charts-shown', shown('svg.chart'));
  b.setAttribute('data-tables-shown', shown('table.data'));
  b.setAttribute('data-grid-cells-shown', shown('table.grid td'));
  b.setAttribute('data-ready', '1');
})();
"""


def render_html(doc: dict, *, plots: dict | None = None, command: str | None = None,
                out_dir: str | None = None) -> str:
    """The page as a string. ``plots``: {label: path} (or a list of paths) of files already
    in the report folder (PNG plots, traces) to link to; a PNG whose name starts with a
    scenario id (``s1_...``) is also linked from that scenario's section. ``command``: the
    command line that produced the document (default: the document's own ``command``)."""
    return _Page(doc, plots, command, out_dir).render()


def write_html(doc: dict, out_dir: str, *, plots: dict | None = None, command: str | None = None) -> str:
    """Write ``out_dir/report.html`` from a results document; returns its path."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "report.html")
    text = render_html(doc, plots=plots, command=command, out_dir=out_dir)
    write_text(path, text)
    return path
