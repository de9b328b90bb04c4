"""What a run writes around its cells, so its report can be rendered from the results
file alone (``looplab report FILE``, on any machine, with or without the scenario's
code): each scenario present, described (title, variants, metrics with their units,
labels and formatters, verdicts, columns, plots), and each runtime present
(style, ours, the references it is compared with and its primary one).

Everything here is data: a plot is its kind with its series and axes (``Bars``,
``Lines``), a formatter the name of one in ``bench.results.tables``. No function
travels in the document; a scenario's plot *function* is drawn only where its
code is registered (``bench.report.render.plot``).
"""
from __future__ import annotations

from bench import results as resmod
from bench.scenarios import api as scmod
from bench import runtimes as rtmod

__all__ = ["describe_scenario", "describe_runtime", "describe", "builder", "build", "complete"]


def describe_scenario(sc) -> dict:
    d = sc.describe()
    plots = []
    for p in sc.plots:
        if isinstance(p, scmod.Bars):
            plots.append({"bars": p.metric, "ylabel": p.ylabel, "scale": p.scale})
        elif isinstance(p, scmod.Lines):
            plots.append(p.describe())
    d["plots"] = plots
    return d


def describe_runtime(rt) -> dict:
    return {"style": rt.style, "ours": bool(rt.ours),
            "compared_with": list(rt.info.compared_with or ()),
            "primary": rt.primary_reference}


def describe(cells) -> tuple[dict, dict]:
    """({scenario id: description}, {runtime spec: description}) of planned cells."""
    scenarios, runtimes = {}, {}
    for c in cells:
        if c.scenario not in scenarios:
            scenarios[c.scenario] = describe_scenario(c.sc)
        if c.runtime not in runtimes:
            runtimes[c.runtime] = describe_runtime(c.rt)
    return scenarios, runtimes


def builder(cells, **extra):
    """``document(results, incomplete)`` for a run of the planned ``cells``: the
    descriptions are made once, here, not at every flush (a run's main thread
    builds a document per finished cell while the next cell runs)."""
    scenarios, runtimes = describe(cells)
    real_only = _real_network_only() if any(c.net == "sim" for c in cells) else None
    extra.setdefault("run_id", resmod.new_run_id())
    extra.setdefault("env", resmod.environment())

    def document(results, incomplete=None):
        doc = resmod.new_document(results, scenarios=scenarios, runtimes=runtimes, **extra)
        if real_only is not None:
            doc["real_network_only"] = real_only
        if incomplete:
            doc["incomplete"] = incomplete
        return doc
    return document


def build(results: list, cells, *, incomplete=None, **extra) -> dict:
    """The results document of ``results`` (finished cells) of the planned ``cells``."""
    return builder(cells, **extra)(results, incomplete)


def _real_network_only() -> dict:
    """Every registered runtime (not a variant of another) that cannot run on the
    simulated network: why, and its library."""
    return {info.id: {"reason": info.real_network_only, "library": info.library or info.id}
            for info in rtmod.RUNTIMES.values()
            if info.real_network_only is not None and getattr(info, "variant_of", None) is None}


def complete(doc: dict) -> dict:
    """A document written before it recorded its scenarios and runtimes (or merged
    from such): the missing descriptions, from what is registered here."""
    scenarios = dict(doc.get("scenarios") or {})
    runtimes = dict(doc.get("runtimes") or {})
    registered = scmod.scenarios()
    for c in doc["cells"]:
        sid, spec = c.get("scenario"), c.get("runtime")
        if sid not in scenarios and sid in registered:
            scenarios[sid] = describe_scenario(registered[sid])
        elif sid in scenarios and sid in registered and (
                "plots" not in scenarios[sid]
                or any("function" in p for p in scenarios[sid]["plots"])):
            # an older document: no plots, or plots named as functions; the registered
            # scenario's plots as data instead
            scenarios[sid] = {**scenarios[sid],
                              "plots": describe_scenario(registered[sid])["plots"]}
        if spec not in runtimes:
            try:
                runtimes[spec] = describe_runtime(rtmod.parse(spec))
            except Exception:       # a runtime not registered here: its cells say enough
                pass
    doc = {**doc, "scenarios": scenarios, "runtimes": runtimes}
    if "real_network_only" not in doc and any((c.get("params") or {}).get("net") == "sim"
                                              for c in doc["cells"]):
        doc["real_network_only"] = _real_network_only()
    return doc
