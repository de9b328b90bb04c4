"""What a loop divergence is: documented (a quoted sentence of the asyncio docs of that
interpreter promises the behaviour) or de-facto, and which upstream threads were read
about it. The grid, the reports and ``--repro`` all ask here, so they say the same.
"""
from __future__ import annotations

from bench.fidelity import upstream
from bench import runtimes as rtmod


def classify(p, python) -> tuple[str, dict | None]:
    """("documented", the quote speaking for ``python``) when probe ``p`` quotes a
    promise of that interpreter's asyncio docs, else ("de-facto", None)."""
    quote = p.documented.quote(python) if p.documented is not None else None
    return ("documented", quote) if quote else ("de-facto", None)


def promise_text(quote: dict | None, markdown: bool = True) -> str:
    """How the reports show a promise beside a divergence."""
    if not quote:
        return "de-facto"
    src = f"{quote['page']} {quote['docs']}"
    return (f"documented: \"{quote['text']}\" ([{src}]({quote['url']}))" if markdown
            else f"documented: \"{quote['text']}\" ({src})")


def annotate(rows: list, meta: dict, probes: dict) -> list:
    """Give each loop-conformance row that is not an agreement its promise and its
    upstream threads (``row["promise"]``, ``row["upstream"]``) and say both in its
    ``reason``, so every report shows the quote beside the divergence. ``meta``: each
    worker's Python and loop (``measure.collect``)."""
    for r in rows:
        if r.get("kind") != "loop" or r["verdict"] in ("agree", "n/a"):
            continue
        m = meta.get(r["ours"], {})
        loop = (m.get("loop") or {}).get("name") or rtmod.parse(r["ours"]).loop
        _, quote = classify(probes[r["probe"]], m.get("python"))
        r["promise"], r["upstream"] = quote, upstream.line(r["probe"], loop)
        r["reason"] = f"{promise_text(quote, markdown=False)}; {r['upstream']}"
    return rows
