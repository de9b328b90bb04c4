"""The fidelity sections of report.html: each kernel's verdicts against its primary
reference, cell by cell (``bench.report.agreement``, the one computation the terminal
and report.md use too), and the edge probes of ``looplab fidelity`` with every
difference: its verdict and reason first, then the subject and reference observations,
long ones wrapped. ``FidelitySections`` is mixed into the page, whose ``doc``, ``info``,
``rts`` and ``anchors`` it reads.
"""
from __future__ import annotations

from bench.report import agreement
from bench.report.htmldoc import (DASH, NO, YES, e, fmt_value, html_table, is_number,
                                  metric_label, net_rank, rt_label, scenario_order)

#: observations longer than this are cut in the differences table (the full text is
#: the cell's title, shown on hover, and is in fidelity.md)
OBS_CHARS = 160

#: keeps the differences table inside the page: fixed layout, long words broken
STYLE = ("table.probe-diffs{table-layout:fixed;width:100%;max-width:1100px}"
         "table.probe-diffs td{overflow-wrap:anywhere;word-break:break-word;vertical-align:top}"
         "table.probe-diffs td code{white-space:pre-wrap}"
         "table.probe-diffs col.v{width:8em}table.probe-diffs col.r{width:30%}"
         "table.probe-diffs col.p{width:14%}table.probe-diffs col.o{width:20%}")


def _clip(text: str) -> str:
    text = str(text)
    return text if len(text) <= OBS_CHARS else text[:OBS_CHARS - 1] + "\u2026"


class FidelitySections:
    # -- fidelity -----------------------------------------------------------
    def fidelity(self) -> str:
        """One row per scenario x variant, one column per subject and its primary
        reference: same, differ (and why) or not comparable (and why)."""
        comps = agreement.comparisons(self.doc)
        prim = [c for c in comps if c["primary"]]
        if not prim:
            return ""
        order = self.rts.ordered({c["subject"] for c in prim})
        pairs = sorted({(c["subject"], c["reference"]) for c in prim}, key=lambda p: order.index(p[0]))
        columns = sorted({(c["scenario"], c["variant"], c["net"]) for c in prim},
                         key=lambda svn: (scenario_order(svn[0]),
                                          self.info[svn[0]]["variants"].index(svn[1])
                                          if svn[1] in self.info[svn[0]]["variants"] else 99,
                                          net_rank({"params": {"net": svn[2]}})))
        by = {(c["subject"], c["reference"], c["scenario"], c["variant"], c["net"]): c for c in prim}
        with_net = any(net for _, _, net in columns)
        rows = []
        for sid, variant, net in columns:
            row = [f'<a href="#{self.anchors.get(sid, "s")}">{e(sid)}</a>', e(variant)]
            if with_net:
                row.append(e(net or "real"))
            for subject, ref in pairs:
                c = by.get((subject, ref, sid, variant, net))
                row.append(self._agreement_cell(c) if c else "")
            rows.append(row)
        s = agreement.summary(comps)
        head = (f"<p><b>Fidelity: {e(agreement.summary_line(s))}</b>. A kernel's defaults reproduce "
                "one library (callback \u2248 asyncio-protocol, hybrid \u2248 asyncio-streams, "
                "coro \u2248 curio; a kernel registered from outside names its own), and each is "
                "compared only with the libraries it names. A racy outcome can differ in a single "
                "run: repeat the cell (<code>--repeat N</code>) before calling it a difference.</p>")
        flipped = agreement.not_compared(self.doc)
        if flipped:
            head += ('<p class="muted">Not compared (options changed, so no single library is the '
                     'reference): ' + ", ".join(e(x) for x in flipped) + ".</p>")
        header = ["scenario", "variant"] + (["net"] if with_net else []) \
            + [f"{rt_label(self.rts, subject)} vs {e(ref)}" for subject, ref in pairs]
        return ('<section><h2 id="fidelity">Fidelity: kernels against their references</h2>' + head
                + html_table(header, rows, cls="data fidelity") + "</section>")

    def _agreement_cell(self, c) -> str:
        o, r = c["subject_cell"], c["reference_cell"]
        links = (f'<a href="#{self.anchors.get(str(o.get("id")), "c")}">subject</a>/'
                 f'<a href="#{self.anchors.get(str(r.get("id")), "c")}">reference</a>')
        if c["status"] == "not comparable":
            return (f'<span class="muted">{DASH} not comparable: {e(c.get("why", ""))}</span> '
                    f'<small>{links}</small>')
        vo = o.get("verdicts") or {}
        if c["status"] == "same":
            return (f'<span class="ok">{YES} agree</span> <small class="muted">'
                    f'({e(" ".join((YES if vo[n] else NO) + n for n in sorted(vo)))})</small> '
                    f'<small>{links}</small>')
        why = "; ".join(f"{e(k)}: subject {YES if a else NO}, reference {YES if b else NO}"
                        for k, a, b in c["differ"])
        sid, metrics, rmetrics = c["scenario"], o.get("metrics") or {}, r.get("metrics") or {}
        head = next((m for m in self.info[sid]["columns"] if is_number(metrics.get(m))), None)
        if head:
            why += (f" ({e(metric_label(self.info[sid], head))}: subject {e(fmt_value(head, metrics[head]))}, "
                    f"reference {e(fmt_value(head, rmetrics.get(head)))})")
        notes = [str(n) for n in o.get("notes") or [] if "differs" in str(n)]
        if notes:
            why += "; " + e("; ".join(notes[:2]))
        return f'<span class="no">{NO} differ</span>: {why} <small>{links}</small>'

    # -- fidelity probes -----------------------------------------------------
    def probes(self) -> str:
        """The edge probes (``looplab fidelity``): agreement per pairing, and every
        difference with its verdict and reason first."""
        block = self.doc.get("fidelity_probes")
        if not block:
            return ""
        rows = []
        for p in block.get("pairings", []):
            name = e(p["pairing"]) + ("" if p["primary"] else ' <small class="muted">(information)</small>')
            if not p["compared"]:
                rows.append([name, '<span class="muted">no probe maps</span>', "", "", ""])
                continue
            ok = p["primary"] and not p["differ"] and not p["error"]
            agree = f'{p["agree"]} / {p["compared"]}'
            rows.append([name, f'<span class="ok">{YES} {agree}</span>' if ok else e(agree),
                         e(str(p["declared"])), e(str(p["differ"])), e(str(p["error"]))])
        head = ('<p>Small programs that each poke one edge (a write after close, a nested timeout, '
                'the context a callback sees) run on each subject -- our kernels, and asyncio loops '
                'judged against CPython\'s asyncio -- and on its references, each runtime in its own '
                'process. Against the primary reference every difference is fixed or declared with '
                'a reason; against a secondary one it is information; a loop\'s difference shows the '
                'promise of the asyncio docs it breaks, or "de-facto". Measured with '
                f'<code>{e(block.get("command", "looplab fidelity"))}</code>'
                + (f' in {e(str(block["elapsed_s"]))} s' if "elapsed_s" in block else "") + ".</p>")
        if block.get("skipped"):
            head += f'<p class="muted">Not run (library missing): {e(", ".join(block["skipped"]))}.</p>'
        out = head + html_table(["pairing", "agree", "declared", "differ (undeclared)", "errors"], rows,
                                cls="data probes")
        diffs = block.get("differences") or []
        if diffs:
            drows = [[(f'<span class="no">{NO} {e(d["verdict"])}</span>' if d["verdict"] in ("differ", "error")
                       else e(d["verdict"])),
                      self._reason(d),
                      f'{e(d.get("subject", d["ours"]))} <small class="muted">vs</small> {e(d["reference"])}',
                      f'<code>{e(d["probe"])}</code>',
                      f'<code title="{e(d["reference_obs"])}">{e(_clip(d["reference_obs"]))}</code>',
                      f'<code title="{e(d["ours_obs"])}">{e(_clip(d["ours_obs"]))}</code>'] for d in diffs]
            out += (f"<style>{STYLE}</style><h3>Differences</h3>"
                    '<p class="muted">Verdict and reason first. <i>subject</i>: the runtime judged '
                    '(a kernel, or an asyncio loop); <i>reference</i>: the one it is judged against. '
                    f'Observations over {OBS_CHARS} characters are cut (hover for the whole).</p>'
                    + html_table(["verdict", "reason", "subject vs reference", "probe", "reference shows",
                                  "subject shows"], drows, cls="data probe-diffs",
                                 colgroup=["v", "r", "p", "p", "o", "o"]))
        return ('<section><h2 id="probes">Fidelity probes: kernels and loops at the edges</h2>' + out
                + "</section>")

    @staticmethod
    def _reason(d) -> str:
        quote = d.get("promise")
        if d.get("kind") != "loop":
            return e(d.get("reason", ""))
        # the docs' address as a title, not a link: the page loads and links nothing outside
        text = (f'documented: <q>{e(quote["text"])}</q> <small title="{e(quote["url"])}">'
                f'({e(quote["page"])} {e(quote["docs"])})</small>' if quote else "de-facto")
        return text + f'<br><small class="muted">{e(d.get("upstream") or "not searched")}</small>'
