"""The fidelity sections of report.html: our kernels' verdicts against their primary
references, cell by cell, and the edge probes of ``looplab fidelity`` with every
difference and its reason. ``FidelitySections`` is mixed into the page, whose ``doc``,
``info``, ``rts`` and ``anchors`` it reads.
"""
from __future__ import annotations

from bench.report.htmldoc import (DASH, NO, STATUSES, YES, cell_status, e, fmt_value, html_table,
                                  is_number, metric_label, net_rank, rt_label, scenario_order)


class FidelitySections:
    # -- fidelity -----------------------------------------------------------
    def fidelity(self) -> str:
        """One row per scenario x variant, one column per kernel of ours and its primary
        reference: agree, or why not."""
        keyed = self.by_key()
        pairs = sorted({(spec, self.rts[spec]["primary"]) for spec, *_ in keyed
                        if self.rts[spec]["ours"] and self.rts[spec]["primary"]},
                       key=lambda p: self.rts.ordered(k[0] for k in keyed).index(p[0]))
        flipped = sorted({spec for spec, *_ in keyed if self.rts[spec]["ours"] and not self.rts[spec]["primary"]})
        if not pairs:
            return ""
        # a kernel is compared with its reference on the same network
        columns = sorted({(sid, v, net) for _, sid, v, net in keyed},
                         key=lambda svn: (scenario_order(svn[0]), self.info[svn[0]]["variants"].index(svn[1])
                                          if svn[1] in self.info[svn[0]]["variants"] else 99,
                                          net_rank({"params": {"net": svn[2]}})))
        with_net = any(net for _, _, net in columns)
        rows, agree, total, differ = [], 0, 0, 0
        for sid, variant, net in columns:
            row, any_pair = [f'<a href="#{self.anchors.get(sid, "s")}">{e(sid)}</a>', e(variant)], False
            if with_net:
                row.append(e(net or "real"))
            for spec, ref in pairs:
                ours, refs = keyed.get((spec, sid, variant, net)), keyed.get((ref, sid, variant, net))
                if not ours or not refs:
                    row.append('<span class="muted">not run</span>' if ours or refs else "")
                    continue
                any_pair = True
                o, r = ours[0], refs[0]
                so, sr = cell_status(o), cell_status(r)
                links = (f'<a href="#{self.anchors.get(str(o.get("id")), "c")}">ours</a>/'
                         f'<a href="#{self.anchors.get(str(r.get("id")), "c")}">ref</a>')
                if so not in ("pass", "fail") or sr not in ("pass", "fail"):
                    row.append(f'<span class="muted">{DASH} not comparable: ours {e(STATUSES[so][0])}, '
                               f'{e(ref)} {e(STATUSES[sr][0])}</span> <small>{links}</small>')
                    continue
                total += 1
                vo, vr = o.get("verdicts") or {}, r.get("verdicts") or {}
                if vo == vr:
                    agree += 1
                    row.append(f'<span class="ok">{YES} agree</span> <small class="muted">'
                               f'({e(" ".join((YES if vo[n] else NO) + n for n in sorted(vo)))})</small> '
                               f'<small>{links}</small>')
                    continue
                differ += 1
                why = "; ".join(f"{e(n)}: ours {YES if vo.get(n) else NO}, {e(ref)} {YES if vr.get(n) else NO}"
                                for n in sorted(set(vo) | set(vr)) if vo.get(n) != vr.get(n))
                head = next((m for m in self.info[sid]["columns"] if is_number((o.get("metrics") or {}).get(m))), None)
                if head:
                    why += (f" ({e(metric_label(self.info[sid], head))}: ours {e(fmt_value(head, o['metrics'][head]))}, "
                            f"{e(ref)} {e(fmt_value(head, (r.get('metrics') or {}).get(head)))})")
                notes = [str(n) for n in o.get("notes") or [] if "differs" in str(n)]
                if notes:
                    why += "; " + e("; ".join(notes[:2]))
                row.append(f'<span class="no">{NO} differ</span>: {why} <small>{links}</small>')
            if any_pair:
                rows.append(row)
        head = (f"<p><b>Our kernels' verdicts equal their primary reference's in {agree} of {total} "
                f"comparable cells</b>{f' ({differ} differ)' if differ else ''}. Each of our kernels' defaults "
                "reproduce one library: callback \u2248 asyncio-protocol, hybrid \u2248 asyncio-streams, "
                "coro \u2248 curio. A racy outcome can differ in a single run: repeat the cell "
                "(<code>--repeat N</code>) before calling it a difference.</p>")
        if flipped:
            head += ('<p class="muted">Not compared (options changed, so no single library is the reference): '
                     + ", ".join(e(s) for s in flipped) + ".</p>")
        header = ["scenario", "variant"] + (["net"] if with_net else []) \
            + [f"{rt_label(self.rts, spec)} vs {e(ref)}" for spec, ref in pairs]
        return ('<section><h2 id="fidelity">Fidelity: our kernels against their references</h2>' + head
                + html_table(header, rows, cls="data fidelity") + "</section>")

    # -- fidelity probes -----------------------------------------------------
    def probes(self) -> str:
        """The edge probes (``looplab fidelity``): agreement per pairing, and every
        difference with its declared reason."""
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
                'the context a callback sees) run on our kernel and on its references, each runtime '
                'in its own process. Against the primary reference every difference is fixed or '
                'declared with a reason; against a secondary one it is information. Measured with '
                f'<code>{e(block.get("command", "looplab fidelity"))}</code>'
                + (f' in {e(str(block["elapsed_s"]))} s' if "elapsed_s" in block else "") + ".</p>")
        if block.get("skipped"):
            head += f'<p class="muted">Not run (library missing): {e(", ".join(block["skipped"]))}.</p>'
        out = head + html_table(["pairing", "agree", "declared", "differ (undeclared)", "errors"], rows,
                            cls="data probes")
        diffs = block.get("differences") or []
        if diffs:
            drows = [[e(f'{d["ours"]} vs {d["reference"]}'), f'<code>{e(d["probe"])}</code>',
                      f'<code>{e(d["reference_obs"])}</code>', f'<code>{e(d["ours_obs"])}</code>',
                      (f'<span class="no">{NO} {e(d["verdict"])}</span>' if d["verdict"] in ("differ", "error")
                       else e(d["verdict"])), e(d["reason"])] for d in diffs]
            out += ("<h3>Differences</h3>"
                    + html_table(["pairing", "probe", "reference", "ours", "verdict", "reason"], drows,
                             cls="data probe-diffs"))
        return ('<section><h2 id="probes">Fidelity probes: our kernels at the edges</h2>' + out
                + "</section>")
