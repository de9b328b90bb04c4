"""Does a kernel's verdict equal its references'? One computation for every report --
the terminal summary, report.md and report.html -- so they give one answer.

A *subject* is a runtime the document describes with references (``compared_with``):
our kernels and any kernel registered from outside. Each subject cell is compared
only with the cells of the runtimes it names, on the same interpreter, scenario,
variant and network: never with another kernel, and a kernel is never the subject of
another kernel's comparison. A subject whose options are flipped reproduces no single
library (its document says ``primary: None``) and is listed as not compared.

A comparison is **same** when every verdict is measured on both sides and equal,
**differ** when a verdict measured on both sides differs, and **not comparable**
when a side was not measured (a skipped or failed cell, or a verdict ``None``): a
side that measured nothing is never "same". The summary counts the primary
comparisons: "N of M comparable cells" counts only the comparable ones and says how
many were not.
"""
from __future__ import annotations

from bench.report.htmldoc import STATUSES, cell_net, cell_status

__all__ = ["comparisons", "summary", "summary_line", "table_rows", "TABLE_HEADER", "not_compared"]

TABLE_HEADER = ["scenario", "variant", "subject", "reference", "primary", "verdicts", "difference"]


def _ident(spec: str) -> tuple[str, str]:
    """(runtime id, interpreter) of a spec, read from the text alone."""
    head = str(spec).partition(":")[0]
    ident, _, interp = head.partition("@")
    return ident, interp


def _described(doc: dict, spec: str) -> dict:
    return (doc.get("runtimes") or {}).get(spec) or {}


def _primary(doc: dict, spec: str) -> str | None:
    """The reference a subject's defaults reproduce, as the document records it."""
    d = _described(doc, spec)
    refs = d.get("compared_with") or ()
    if "primary" in d:
        return d["primary"]
    return refs[0] if refs and ":" not in str(spec) else None


def not_compared(doc: dict) -> list[str]:
    """Subjects in the document whose options are flipped: no library is their reference."""
    specs = {c.get("runtime") for c in doc.get("cells", []) if c.get("runtime")}
    return sorted(s for s in specs if _described(doc, s).get("compared_with")
                  and _primary(doc, s) is None)


def _verdict_word(v) -> str:
    return "not measured" if v is None else "yes" if v else "NO"


def _compare(subject: dict, ref: dict) -> dict:
    if any(c.get("skipped") or not c.get("verdicts") for c in (subject, ref)):
        ss, rs = cell_status(subject), cell_status(ref)
        return {"status": "not comparable", "differ": [], "unmeasured": [],
                "why": f"subject {STATUSES[ss][0]}, reference {STATUSES[rs][0]}"}
    vs, vr = subject.get("verdicts") or {}, ref.get("verdicts") or {}
    keys = sorted(set(vs) | set(vr))
    measured = [k for k in keys if isinstance(vs.get(k), bool) and isinstance(vr.get(k), bool)]
    unmeasured = [k for k in keys if k not in measured]
    differ = [k for k in measured if vs[k] != vr[k]]
    out = {"differ": [(k, vs[k], vr[k]) for k in differ],
           "unmeasured": [(k, vs.get(k), vr.get(k)) for k in unmeasured]}
    if differ:
        out["status"] = "differ"
    elif unmeasured or not keys:
        out["status"] = "not comparable"
        out["why"] = "; ".join(f"{k}: subject {_verdict_word(a)}, reference {_verdict_word(b)}"
                               for k, a, b in out["unmeasured"]) or "no verdicts"
    else:
        out["status"] = "same"
    return out


def comparisons(doc: dict) -> list[dict]:
    """Every (subject cell, reference cell) comparison in the document: ``scenario``,
    ``variant``, ``net``, ``subject``, ``reference`` (specs), ``primary``, the two
    cells, ``status`` and what differs or was not measured."""
    cells = [c for c in doc.get("cells", []) if c.get("runtime") and c.get("scenario")]
    index: dict = {}
    for c in cells:
        index.setdefault((c["runtime"], c["scenario"], c.get("variant"), cell_net(c)), []).append(c)
    out = []
    for c in cells:
        spec = c["runtime"]
        refs = list(_described(doc, spec).get("compared_with") or ())
        primary = _primary(doc, spec)
        if not refs or primary is None:
            continue
        _, interp = _ident(spec)
        for ref_id in refs:
            ref_spec = f"{ref_id}@{interp}" if interp else ref_id
            for r in index.get((ref_spec, c["scenario"], c.get("variant"), cell_net(c)), [])[:1]:
                out.append({"scenario": c["scenario"], "variant": c.get("variant"),
                            "net": cell_net(c), "subject": spec, "reference": ref_spec,
                            "primary": ref_id == primary, "subject_cell": c,
                            "reference_cell": r, **_compare(c, r)})
    return out


def summary(comps: list[dict]) -> dict:
    """Counts over the primary comparisons: same, differ, not comparable."""
    prim = [c for c in comps if c["primary"]]
    same = sum(c["status"] == "same" for c in prim)
    differ = sum(c["status"] == "differ" for c in prim)
    return {"same": same, "differ": differ, "comparable": same + differ,
            "not_comparable": len(prim) - same - differ, "primary": len(prim)}


def summary_line(s: dict) -> str:
    """The one sentence every report gives."""
    text = (f"each kernel's verdicts equal its primary reference's in {s['same']} of "
            f"{s['comparable']} comparable cells")
    if s["differ"]:
        text += f" ({s['differ']} differ)"
    if s["not_comparable"]:
        text += (f"; {s['not_comparable']} not comparable (a side not measured or without "
                 "verdicts)")
    return text


def _difference(c: dict) -> str:
    if c["status"] == "differ":
        return "; ".join(f"{k}: subject {_verdict_word(a)}, reference {_verdict_word(b)}"
                         for k, a, b in c["differ"])
    return c.get("why", "")


def table_rows(comps: list[dict], only_not_same: bool = False) -> list[list[str]]:
    """TABLE_HEADER rows, sorted by scenario, variant, subject and reference."""
    rows = []
    for c in sorted(comps, key=lambda c: (str(c["scenario"]), str(c["variant"]), str(c["net"] or ""),
                                          c["subject"], not c["primary"], c["reference"])):
        if only_not_same and c["status"] == "same":
            continue
        variant = f"{c['variant']} ({c['net']})" if c["net"] else str(c["variant"])
        rows.append([c["scenario"], variant, c["subject"], c["reference"],
                     "yes" if c["primary"] else "no", c["status"], _difference(c)])
    return rows
