"""The ``looplab check`` section of report.html: each question's verdict for each run (app,
loop, network), with the evidence that decided it and the measured advice. For a
document of ``looplab check`` it stands where a scenario run's "three questions" do.
``CheckSections`` is mixed into the page, whose ``doc`` and ``cells`` it reads.
"""
from __future__ import annotations

from bench.report.htmldoc import DASH, NO, YES, e, html_table

_WORD = {True: f'<span class="ok">{YES} holds</span>', False: f'<span class="no">{NO} fails</span>',
         None: f'<span class="muted">{DASH} not measured</span>'}


def is_check(doc: dict) -> bool:
    return doc.get("kind") == "check"


class CheckSections:
    def check_answers(self) -> str:
        cells = [c for c in self.cells if c.get("scenario") == "check"]
        if not cells:
            return ""
        questions = list(dict.fromkeys(q for c in cells for q in (c.get("check") or {})))
        header = ["run"] + [e(q) for q in questions]
        rows = []
        for c in cells:
            net = (c.get("params") or {}).get("net", "real")
            seed = (c.get("params") or {}).get("seed")
            row = [f"{e(c.get('variant', ''))}<br><small>{e(c.get('runtime', ''))}, {e(net)}"
                   + (f" (seed {e(str(seed))})" if seed is not None else "") + "</small>"]
            for q in questions:
                a = (c.get("check") or {}).get(q)
                if a is None:
                    row.append("")
                    continue
                lines = list(a.get("evidence") or [])
                if a.get("verdict") is None:
                    lines.append("not measured: " + (a.get("reason") or ""))
                row.append(_WORD.get(a.get("verdict")) + "".join(
                    f'<div class="note">{e(line)}</div>' for line in lines))
            rows.append(row)
        advice = []
        for c in cells:
            for adv in c.get("advice") or []:
                head = (f"<strong>{e(adv['setting'])}</strong>: " if adv.get("setting")
                        else "")
                tried = ", ".join(
                    f"{t['setting']} ({'holds' if t['holds'] else 'fails'})"
                    for t in adv.get("tried") or [])
                advice.append(f"<li>{e(c.get('runtime', ''))}, {e(adv['question'])}: {head}"
                              f"{e(adv['text'])}" + (f'<div class="note">tried: {e(tried)}</div>'
                                                     if tried else "") + "</li>")
        return ('<section class="answers" id="answers"><h2>The questions, asked of your server</h2>'
                + html_table(header, rows)
                + (f"<h3>Advice, measured</h3><ul>{''.join(advice)}</ul>" if advice else "")
                + "</section>")
