"""``looplab check``'s answers as a results document and as the terminal table.

Each run of the questions (one app, one loop, one network) is one cell of a standard
results document (``bench.results``): scenario ``check``, runtime the loop (or
``command``), variant the app, ``params.net`` the network, one verdict per question
(``True``/``False``/``None``), the figures as metrics with their units, the evidence as
notes, a not-measured reason as an error, and the full answers under ``check`` (with
``advice`` when a fix was searched). ``DESCRIPTION`` is how the document describes the
``check`` scenario, so ``looplab report`` and report.html render it without this code.
"""
from __future__ import annotations

from bench import results as resmod
from bench.results.tables import fmt_bytes, format_table

__all__ = ["SCENARIO", "DESCRIPTION", "new_cell", "document", "terminal", "verdict_word"]

SCENARIO = "check"
_METRICS = {
    "memory_per_slow_client_bytes": ("bytes", "lower", "memory / slow client"),
    "transports_buffered_peak_bytes": ("bytes", "lower", "transports' buffers (peak)"),
    "queued_bytes": ("bytes", "lower", "queued in asyncio queues"),
    "healthy_alone_p99_s": ("s", "lower", "healthy p99 alone"),
    "healthy_slow_p99_s": ("s", "lower", "healthy p99 beside slow"),
    "healthy_alone_p50_s": ("s", "lower", "healthy p50 alone"),
    "healthy_slow_p50_s": ("s", "lower", "healthy p50 beside slow"),
    "shutdown_promised_bytes": ("bytes", None, "promised at shutdown"),
    "shutdown_received_bytes": ("bytes", "higher", "received at shutdown"),
    "shutdown_stop_s": ("s", "lower", "time to stop"),
    "faults_survived_count": ("count", "higher", "faults survived"),
    "faults_count": ("count", None, "faults run"),
}
VERDICTS = {
    "backpressure": "a slow client's cost in server memory stays within the budget and stops "
                    "growing",
    "fairness": "healthy clients' p99 wait beside a slow client stays within the latency factor "
                "of their p99 alone",
    "shutdown": "a response in flight at the stop arrives whole, and the server stops within "
                "the grace period",
    "faults": "every fault of `looplab faults` is survived and the fds come back",
}
DESCRIPTION = {
    "title": "looplab check: the questions asked of your server",
    "summary": "Slow clients, healthy clients beside them, a stop with a response in flight "
               "and faulty peers, thrown at one server; each verdict names the measurements "
               "that decided it (docs/check.md).",
    "variants": [],
    "metrics": {name: {"unit": unit, "direction": d, "label": label}
                for name, (unit, d, label) in _METRICS.items()},
    "verdicts": VERDICTS,
    "columns": ["memory_per_slow_client_bytes", "healthy_alone_p99_s", "healthy_slow_p99_s",
                "shutdown_received_bytes", "shutdown_promised_bytes", "faults_survived_count"],
    "decided_by": {"backpressure": ["memory_per_slow_client_bytes"],
                   "fairness": ["healthy_alone_p99_s", "healthy_slow_p99_s"],
                   "shutdown": ["shutdown_received_bytes", "shutdown_promised_bytes"],
                   "faults": ["faults_survived_count", "faults_count"]},
}


def verdict_word(v) -> str:
    return "holds" if v is True else "FAILS" if v is False else "not measured"


def _scalar(v) -> bool:
    return v is None or isinstance(v, (bool, int, float, str))


def new_cell(app_label: str, where: str, net: str, answers: dict, *, kind: str,
             seed: int | None = None, advice: list | None = None,
             interrupted: bool = False) -> dict:
    """One results cell for one run of the questions."""
    metrics, verdicts, errors, notes = {}, {}, [], []
    for q, a in answers.items():
        if q == "raw":
            continue
        verdicts[q] = a.verdict
        for k, v in a.metrics.items():
            if _scalar(v):
                metrics[k] = v
        notes += [f"{q}: {line}" for line in a.evidence]
        if a.verdict is None:
            errors.append(f"{q}: not measured: {a.reason or 'nothing was measured'}")
    params = {"net": net, "kind": kind}
    if seed is not None and net == "sim":
        params["seed"] = seed
    cell = resmod.new_cell(SCENARIO, where, app_label, params, metrics=metrics,
                           verdicts=verdicts, errors=errors)
    cell["notes"] = notes
    cell["check"] = {q: a.to_data() for q, a in answers.items() if q != "raw"}
    cell["advice"] = list(advice or [])
    if interrupted:
        cell["interrupted"] = True
    return cell


def document(cells: list, config: dict, incomplete: dict | None = None) -> dict:
    desc = dict(DESCRIPTION, variants=list(dict.fromkeys(c["variant"] for c in cells)))
    doc = resmod.new_document(cells, scenarios={SCENARIO: desc}, kind="check", config=config)
    if incomplete:
        doc["incomplete"] = incomplete
    return doc


def _figures(q: str, m: dict) -> str:
    if q == "backpressure" and m.get("memory_per_slow_client_bytes") is not None:
        return f"{fmt_bytes(m['memory_per_slow_client_bytes'])}/slow client"
    if q == "fairness" and m.get("healthy_slow_p99_s") is not None:
        a, s = m.get("healthy_alone_p99_s"), m["healthy_slow_p99_s"]
        return f"p99 {_ms(a)} -> {_ms(s)}"
    if q == "shutdown" and m.get("shutdown_promised_bytes") is not None:
        return (f"{fmt_bytes(m.get('shutdown_received_bytes') or 0)} of "
                f"{fmt_bytes(m['shutdown_promised_bytes'])}")
    if q == "faults" and m.get("faults_count"):
        return f"{m['faults_survived_count']}/{m['faults_count']} survived"
    return "-"


def _ms(s):
    return "-" if s is None else f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def terminal(doc: dict) -> str:
    """The table: one block per cell, a row per question; evidence and advice below."""
    parts = []
    for cell in doc["cells"]:
        net = cell["params"].get("net")
        seed = cell["params"].get("seed")
        head = f"{cell['variant']} on {cell['runtime']}, {net} network" + (
            f" (seed {seed})" if seed is not None else "")
        if cell.get("interrupted"):
            head += " -- INTERRUPTED"
        rows = []
        for q, a in cell["check"].items():
            first = a["evidence"][0] if a["evidence"] else ("not measured: " + (a["reason"] or ""))
            rows.append([q, verdict_word(a["verdict"]), _figures(q, a["metrics"]),
                         _clip(first, 110)])
        parts.append(head + "\n" + format_table(["question", "verdict", "figures", "evidence"],
                                                rows, align="llll"))
        for q, a in cell["check"].items():
            for line in a["evidence"][1:]:
                parts.append(f"  {q}: {line}")
            if a["verdict"] is None and a["evidence"]:
                parts.append(f"  {q}: not measured: {a['reason']}")
        for adv in cell.get("advice") or []:
            parts.append("  " + advice_line(adv))
        parts.append("")
    return "\n".join(parts).rstrip()


def advice_line(adv: dict) -> str:
    if not adv.get("setting"):
        return f"advice ({adv['question']}): {adv['text']}"
    return f"advice ({adv['question']}): {adv['setting']} -- {adv['text']}"


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."
