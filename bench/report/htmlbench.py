"""The benchmarks section of report.html: performance goals, echo throughput (ratios,
a curve over connections or bars per parameter set, the per-round table) and the
micro-benchmark and idle-connection charts. ``BenchmarkSections`` is mixed into the page,
whose ``doc``, ``bench`` and ``rts`` it reads.
"""
from __future__ import annotations

import json

from bench.perf import echo as echomod
from bench.perf import goals as goalsmod
from bench.report.htmldoc import e, fmt_value, html_table, natural, rt_label, slug
from bench.results.tables import fmt_fraction
from bench.report.svg import OURS_SHADES, PALETTE, bar_chart, line_chart


class BenchmarkSections:
    def benchmarks(self) -> str:
        if not self.bench and not self.doc.get("goals"):
            return ""
        out = ['<section><h2 id="bench">Benchmarks</h2>']
        goals = self.goals()
        if goals:
            out.append(goals)
        echo = [c for c in self.bench if c.get("scenario") == "echo"]
        if echo:
            out.append(self.echo(echo))
        micro = [c for c in self.bench if c.get("scenario") == "micro"]
        if micro:
            out.append(self.simple_bench(micro, "micro-benchmarks", "ops_per_s", "operations per second"))
        idle = [c for c in self.bench if c.get("scenario") == "idle"]
        if idle:
            out.append(self.simple_bench(idle, "idle connections", "rss_per_connection_bytes",
                                         "server memory per idle connection"))
        out.append("</section>")
        return "".join(out)

    def goals(self) -> str:
        rows = self.doc.get("goals")
        if not rows and self.bench:
            rows = goalsmod.evaluate_goals(self.bench)
            if rows and all(r.get("status") == "not measured" for r in rows):
                rows = None
        if not rows:
            return ""
        interrupted = bool(self.doc.get("incomplete") or (self.doc.get("config") or {}).get("interrupted"))
        rows = goalsmod.unjudged_if_interrupted(rows, interrupted)
        counted = [r for r in rows if r.get("judged_on") == goalsmod.INSTRUCTIONS]
        timed = [r for r in rows if r.get("judged_on") != goalsmod.INSTRUCTIONS]
        out = ['<h3 id="goals">Performance goals</h3>']
        if counted:
            out.append(self._counted_goals(counted))
        if timed:
            out.append(self._timed_goals(timed, bool(counted)))
        return "".join(out)

    @staticmethod
    def _status(st: str) -> str:
        cls = "ok" if st.startswith("met") else "muted" if st.startswith("not ") and \
            not st.startswith("not met") else "no"
        return f'<span class="{cls}">{e(st)}</span>'

    def _with_python(self, rows, table, head):
        if any(r.get("python") for r in rows):
            table = [[e(r.get("python") or "looplab's")] + line for r, line in zip(rows, table)]
            head = ["python"] + head
        return table, head

    def _counted_goals(self, rows) -> str:
        # The kernel goals, judged on instruction counts, each with its opcode breakdown.
        table = []
        for r in rows:
            cells = [e(c) for c in goalsmod.instruction_cells(r)]
            cells[4] = self._status(str(r.get("status", "?")))
            table.append(cells)
        table, head = self._with_python(rows, table, [e(h) for h in goalsmod.INSTRUCTION_HEAD])
        out = [html_table(head, table, caption=(
            "judged on instructions per echo request or per operation under callgrind: ours at "
            "most the target times the reference&#x27;s (floor: spawn+join with no kernel at all); "
            "the timed ratios are information only, ours over theirs (&lt; 1: ours cheaper)"))]
        problems = goalsmod.count_problems(rows)
        if problems:
            out.append("<ul>" + "".join(f'<li class="muted">{e(p)}</li>' for p in problems) + "</ul>")
        how = (self.doc.get("config") or {}).get("instructions")
        note = goalsmod.counting_note(how) if any(r.get("counts") for r in rows) else None
        if note:
            out.append(f'<p class="muted">{e(note)}</p>')
        parts = []
        for r in rows:
            b = goalsmod.breakdown(r)
            if b is not None:
                title, head, lines = b
                parts.append('<div class="tables">' + html_table(
                    [e(h) for h in head], [[e(c) for c in line] for line in lines],
                    caption=e(title)) + "</div>")
        if parts:
            out.append('<div class="pair">' + "".join(parts) + "</div>")
        return "".join(out)

    def _timed_goals(self, rows, after_counted: bool) -> str:
        table = []
        # Results files from before the kernel goals were judged on instructions carry
        # an instruction ratio on timed goals (reference over ours): shown as it was.
        old_counts = any(r.get("instructions") for r in rows)

        def ratio(summary):
            return fmt_fraction((summary or {}).get("ratio"))
        for r in rows:
            rng = "-" if r.get("min") is None else f"{r['min']:.2f}\u2013{r['max']:.2f}"
            table.append([e(str(r.get("goal", "?"))), "-" if r.get("ratio") is None else f"{r['ratio']:.2f}\u00d7",
                          rng, e(str(r.get("n", ""))), self._status(str(r.get("status", "?"))),
                          ratio(r.get("cpu")), ratio(r.get("user"))])
            if old_counts:
                table[-1].append(ratio(r.get("instructions")))
        head = ["goal", "measured (median of paired ratios)", "range over rounds", "rounds", "status",
                "server CPU/request, reference over ours", "the same, user CPU only (not judged)"]
        if old_counts:
            head.append("instructions, reference over ours (--instructions)")
        table, head = self._with_python(rows, table, head)
        caption = "timed goals, judged on the median of per-round paired ratios" if after_counted else ""
        out = html_table(head, table, caption=caption)
        if old_counts:
            note = goalsmod.counting_note((self.doc.get("config") or {}).get("instructions"))
            if note:
                out += f'<p class="muted">{e(note)}</p>'
        return out

    def echo(self, cells) -> str:
        cfg = self.doc.get("config") or {}
        specs = self.rts.ordered(c["runtime"] for c in cells)
        default = echomod.default_baseline()
        baseline = cfg.get("baseline") if cfg.get("baseline") in specs else (
            default if default in specs else specs[0])
        label = echomod.param_label
        measured = [c for c in cells if (c.get("metrics") or {}).get("requests_per_s")]
        ratios = echomod.ratio_table(measured, baseline) if measured else None
        def size_first(params):
            return (params.get("message_bytes", 0), params.get("connections", 0), json.dumps(params, sort_keys=True))
        labels = [label(p) for p in sorted({json.dumps(c.get("params") or {}, sort_keys=True): c.get("params") or {}
                                            for c in cells}.values(), key=size_first)]
        labels = list(dict.fromkeys(labels))
        out = ['<h3 id="echo">Echo</h3>']
        if ratios:
            rows = []
            for lb in labels:
                row = [e(lb)]
                for s in specs:
                    ent = (ratios["ratios"].get(lb) or {}).get(s)
                    if ent is None:
                        row.append("-")
                        continue
                    t = f"{ent['ratio']:.2f}"
                    if ent.get("min") is not None and len(ent.get("paired") or []) > 1:
                        t += f' <span class="muted">({ent["min"]:.2f}\u2013{ent["max"]:.2f})</span>'
                    row.append(t)
                rows.append(row)
            rows.append(["geometric mean"] + [f"{ratios['geomean'][s]:.2f}" if s in ratios["geomean"] else "-"
                                              for s in specs])
            out.append(html_table(["message \u00d7 connections"] + [rt_label(self.rts, s) for s in specs], rows,
                              caption=f"requests/s relative to {e(baseline)} (ratio of medians; in brackets the "
                                      "range of per-round paired ratios; &gt; 1 is faster)"))
        # throughput: a curve over connections when there is one, else bars per parameter set
        conns = sorted({(c.get("params") or {}).get("connections") for c in cells} - {None})
        sizes = sorted({(c.get("params") or {}).get("message_bytes") for c in cells} - {None})
        refs = [s for s in specs if not self.rts[s]["ours"]]
        ours_specs = [s for s in specs if self.rts[s]["ours"]]
        if len(conns) > 1:
            charts = []
            for size in sizes or [None]:
                lines = []
                for s in specs:
                    pts = sorted(((c["params"]["connections"], c["metrics"]["requests_per_s"]) for c in cells
                                  if c["runtime"] == s and (c.get("params") or {}).get("message_bytes") == size
                                  and (c.get("metrics") or {}).get("requests_per_s")))
                    if pts:
                        ours = self.rts[s]["ours"]
                        colour = (OURS_SHADES[ours_specs.index(s) % len(OURS_SHADES)] if ours
                                  else PALETTE[refs.index(s) % len(PALETTE)])
                        lines.append((s, ("\u2605" if ours else "") + s, colour, not ours, ours, pts))
                if lines:
                    charts.append(line_chart(f"echo throughput by connections"
                                             + (f", {size:,} B messages" if size else ""), "requests_per_s",
                                             lines, xlabel="connections (log scale)", log_x=True, width=620,
                                             height=300))
            out.append('<div class="pair"><div class="plots">' + "".join(charts) + "</div>")
        else:
            colours = {lb: PALETTE[i % len(PALETTE)] for i, lb in enumerate(labels)}
            rows = [(s, self.rts[s]["ours"], {label(c.get("params") or {}): c["metrics"]["requests_per_s"]
                                              for c in cells if c["runtime"] == s
                                              and (c.get("metrics") or {}).get("requests_per_s")}) for s in specs]
            out.append('<div class="pair"><div class="plots">'
                       + bar_chart("echo throughput (median requests/s)", "requests_per_s", rows, labels, colours)
                       + "</div>")
        rows = []
        for s in specs:
            mine = [c for c in cells if c["runtime"] == s]
            for c in sorted(mine, key=lambda c: labels.index(label(c.get("params") or {}))):
                m, d = c.get("metrics") or {}, c.get("details") or {}
                flags = []
                if d.get("noisy_rounds"):
                    flags.append(f"noisy \u00d7{len(d['noisy_rounds'])}")
                if d.get("client_bound_rounds"):
                    flags.append(f"client-bound \u00d7{len(d['client_bound_rounds'])}")
                if c.get("errors"):
                    flags.append(f"errors \u00d7{len(c['errors'])}")
                rows.append([rt_label(self.rts, s), e(label(c.get("params") or {})),
                             e(fmt_value("requests_per_s", m.get("requests_per_s"))),
                             e(fmt_value("latency_p50_s", m.get("latency_p50_s"))),
                             e(fmt_value("latency_p99_s", m.get("latency_p99_s"))),
                             e(fmt_value("server_cpu_per_request_s", m.get("server_cpu_per_request_s"))),
                             e(fmt_value("server_system_cpu_per_request_s",
                                         m.get("server_system_cpu_per_request_s"))),
                             e(str(c.get("repeats", ""))), e(", ".join(flags))])
        out.append('<div class="tables">' + html_table(
            ["runtime", "message \u00d7 connections", "requests/s", "p50", "p99", "server CPU/request",
             "of it system", "rounds", "flags"], rows, caption="medians over rounds") + "</div></div>")
        return "".join(out)

    def simple_bench(self, cells, title, metric, what) -> str:
        specs = self.rts.ordered(c["runtime"] for c in cells)
        groups = sorted({c.get("variant", "?") for c in cells}, key=natural)
        if all(g == "naive" for g in groups):
            groups = ["naive"]
        colours = {g: PALETTE[i % len(PALETTE)] for i, g in enumerate(groups)}
        rows, table = [], []
        for s in specs:
            vals = {c.get("variant", "?"): (c.get("metrics") or {}).get(metric)
                    for c in cells if c["runtime"] == s}
            rows.append((s, self.rts[s]["ours"], {g: v for g, v in vals.items() if isinstance(v, (int, float))}))
            table.append([rt_label(self.rts, s)] + [e(fmt_value(metric, vals.get(g))) for g in groups])
        head = ["runtime"] + [e(g) for g in groups] if len(groups) > 1 or groups != ["naive"] else \
            ["runtime", e(what)]
        return (f'<h3 id="{slug(title)}">{e(title[0].upper() + title[1:])}</h3><div class="pair"><div class="plots">'
                + bar_chart(f"{title}: {what}", metric, rows, groups, colours) + '</div><div class="tables">'
                + html_table(head, table, caption=e(what) + " (median over rounds)") + "</div></div>")

    # -- metadata ------------------------------------------------------------
