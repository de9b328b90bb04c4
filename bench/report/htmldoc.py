"""What report.html reads from a results document, and the small HTML pieces every
section uses: runtimes in page order (our kernel first, its references beside it), each
scenario's title, columns and verdicts (the document first, the registries as a
fallback), a cell's status, number formatting, time series, anchors and tables.
"""
from __future__ import annotations

import html
import math
import re

from bench.results.tables import fmt

BENCH_KINDS = ("echo", "micro", "idle")
from protocols.apps import STYLES as STYLE_ORDER
_TIMING_METRICS = ("cell_wall_s", "cell_cpu_s")

# status -> (label, symbol, background, text colour); the symbol keeps the grid readable
# without colour.
STATUSES = {
    "pass": ("all verdicts hold", "\u2713", "#a6dba0", "#0b3d14"),
    "fail": ("some verdict fails", "\u2717", "#f4a582", "#5c0a0a"),
    "error": ("error: no measurement", "!", "#7b3294", "#ffffff"),
    "skipped": ("skipped (runtime unavailable, or not on this network)", "\u2013", "#d9d9d9", "#333333"),
    "measured": ("measured, no verdict", "\u2022", "#c6dbef", "#08306b"),
    "na": ("not applicable / not run", "", "#ffffff", "#999999"),
}


e = html.escape
STAR, YES, NO, MID, DASH = "\u2605", "\u2713", "\u2717", " \u00b7 ", "\u2013"


# ---------------------------------------------------------------------------
# What the document says, with the registries as a fallback

def natural(text: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(text))]


def scenario_order(sid: str):
    """looplab's own S1-S8 first, in number order; anything a user registered after."""
    return (not re.fullmatch(r"S\d+", str(sid)), natural(sid))


def axis_key(spec: str) -> tuple:
    """Sort key that groups a style's rows by runtime, then loop (asyncio's own first),
    then interpreter (this one first, then by version): ``asyncio-streams``,
    ``asyncio-streams@3.12``, ``asyncio-streams:loop=rloop``, ``...@3.12:loop=rloop``."""
    head, _, opts = str(spec).partition(":")
    ident, _, interp = head.partition("@")
    loop = ""
    for item in opts.split(","):
        name, _, value = item.partition("=")
        if name.strip() == "loop":
            loop = value.strip()
    version = tuple(int(x) for x in re.findall(r"\d+", interp)[:3]) if interp else ()
    return (ident, loop not in ("", "asyncio"), loop, bool(interp), version, str(spec))


class Runtimes:
    """Style, ours-ness and primary reference of each runtime spec in the document
    (its ``runtimes`` section; the cells' own ``style`` and ``ours`` otherwise)."""

    def __init__(self, cells, described: dict | None = None):
        self._described = described or {}
        self._info = {}
        for c in sorted(cells, key=lambda c: c.get("id", "")):
            spec = c.get("runtime", "?")
            if spec not in self._info:
                self._info[spec] = self._lookup(spec, c)

    def _lookup(self, spec, cell):
        ident = spec.split(":", 1)[0]
        d = self._described.get(spec) or {}
        style = cell.get("style") or d.get("style")
        ours = cell.get("ours") if cell.get("ours") is not None else d.get("ours")
        compared = tuple(d.get("compared_with") or ())
        # a runtime the document does not describe (a file from before it did):
        # what its cell says, and no reference
        style = style or "other"
        return {"id": ident, "style": style, "ours": bool(ours), "compared": compared,
                # options flipped: no single library is the one it reproduces
                "primary": compared[0] if ours and compared and spec == ident else None}

    def __getitem__(self, spec):
        return self._info.get(spec) or self._lookup(spec, {})

    def ordered(self, specs) -> list[str]:
        """Grouped by style; in each, our kernels first, then the libraries they are
        compared with (in that order), then the rest."""
        specs = sorted(set(specs), key=axis_key)
        out = []
        styles = [s for s in STYLE_ORDER] + sorted({self[s]["style"] for s in specs} - set(STYLE_ORDER))
        for style in styles:
            here = [s for s in specs if self[s]["style"] == style]
            ours = sorted((s for s in here if self[s]["ours"]), key=lambda s: (":" in s, axis_key(s)))
            refs = []
            for o in ours:
                for r in self[o]["compared"]:
                    for s in here:
                        if self[s]["id"] == r and s not in refs and s not in ours:
                            refs.append(s)
            rest = [s for s in here if s not in ours and s not in refs]
            out += ours + refs + rest
        return out


def scenario_info(doc: dict, sid: str, cells: list) -> dict:
    given = (doc.get("scenarios") or {}).get(sid) or {}

    def pick(key, default):
        return given.get(key) or default
    metrics = pick("metrics", {})
    timing = {m for m, d in metrics.items() if isinstance(d, dict) and d.get("timing")}
    timing.update(_TIMING_METRICS)
    names = []
    for c in cells:
        for m, v in (c.get("metrics") or {}).items():
            if m not in names and m not in timing and not isinstance(v, (dict, list)):
                names.append(m)
    columns = [m for m in pick("columns", ()) if m not in timing] \
        or names[:6]
    variants = list(pick("variants", []))
    variants += sorted({c.get("variant", "?") for c in cells} - set(variants), key=natural)
    return {"id": sid, "title": pick("title", sid), "summary": pick("summary", ""),
            "variants": variants, "columns": columns, "all_metrics": names, "timing": timing,
            "labels": {m: d.get("label") for m, d in metrics.items()
                       if isinstance(d, dict) and d.get("label") and d.get("label") != m},
            "verdicts": pick("verdicts", {}), "styles": pick("styles", []),
            # the declarations the report's questions read (unit, direction, deciding metrics)
            "metrics": metrics, "decided_by": pick("decided_by", {}), "symptoms": pick("symptoms", [])}


def metric_label(info: dict, metric: str) -> str:
    if metric in info.get("labels", {}):
        return info["labels"][metric]
    name = metric
    for suffix in ("_bytes", "_Bps", "_per_s", "_s", "_count", "_fraction"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return name.replace("_", " ")


def machine_rows(env: dict) -> tuple:
    """What a results environment says about the machine and interpreter, as (field, text)
    pairs; times and load are left out, so two runs on one machine are one machine."""
    def joined(d, sep):
        return ", ".join(f"{k}{sep}{v}" for k, v in sorted((d or {}).items()) if v) or None
    sb = env.get("socket_buffers") or {}
    fields = [
        ("machine", env.get("node")),
        ("CPU", f"{env['cpu']} \u00d7 {env.get('cpu_count')}" if env.get("cpu") else None),
        ("platform", env.get("platform")),
        ("Python", f"{env['python']} ({env.get('implementation', '?')})" if env.get("python") else None),
        ("libraries", joined(env.get("libraries"), " ")),
        ("allocator environment", joined(env.get("allocator_env"), "=") or "none set"),
        ("socket buffers pinned to 64 KiB give", f"SO_SNDBUF {sb.get('pinned_sndbuf_bytes')}, "
                                                 f"SO_RCVBUF {sb.get('pinned_rcvbuf_bytes')}" if sb else None),
        ("load client", env.get("load_client")),
        ("pinning", env.get("pinning")),
    ]
    return tuple((name, str(v)) for name, v in fields if v not in (None, ""))


def variant_index(variants: list, v) -> int:
    return variants.index(v) if v in variants else len(variants)


def cell_status(cell: dict) -> str:
    """pass | fail | error | skipped | measured: what a cell's grid colour says."""
    if cell.get("skipped"):
        return "skipped"
    verdicts = cell.get("verdicts") or {}
    if cell.get("errors") and not verdicts and not cell.get("metrics"):
        return "error"
    if any(v is False for v in verdicts.values()):
        return "fail"
    if any(v is None for v in verdicts.values()):    # not measured: no evidence, an error
        return "error"
    if verdicts:
        return "pass"
    return "error" if cell.get("errors") else "measured"


# ---------------------------------------------------------------------------
# The network a cell ran on (``looplab run --net real|sim|both``)

NETS = ("real", "sim")


def cell_net(cell: dict) -> str | None:
    """"real" or "sim" when the run chose a network (``--net``), else None: a run
    without ``--net`` is on real sockets and its tables have no net column."""
    net = (cell.get("params") or {}).get("net")
    return net if isinstance(net, str) else None


def net_rank(cell: dict) -> int:
    """Real before sim, so the two rows of a runtime and variant sit side by side."""
    net = cell_net(cell)
    return NETS.index(net) if net in NETS else len(NETS)


def incomplete_line(doc: dict) -> str | None:
    """One sentence when the run behind ``doc`` stopped before every cell ran."""
    inc = doc.get("incomplete")
    if not inc:
        return None
    of = f" of {inc['planned']}" if inc.get("planned") is not None else ""
    return (f"INCOMPLETE: this run was {inc.get('reason', 'interrupted')} after "
            f"{inc.get('finished', '?')}{of} cells; the rest were not run.")


def sim_note(cells, real_only: dict | None = None) -> str | None:
    """What a report says when some of its cells ran on the simulated network: what
    that means, and which runtimes run only on the real network (each named by its
    library when they share one), in registry order. Plain text (the caller escapes it).
    ``real_only``: the document's ``real_network_only`` (runtime id -> its reason and
    library)."""
    if not any(cell_net(c) == "sim" for c in cells):
        return None
    by_reason: dict = {}
    libraries: dict = {}
    for rid, d in (real_only or {}).items():
        reason, library = (d, rid) if isinstance(d, str) else (d.get("reason"), d.get("library"))
        by_reason.setdefault(reason, []).append(rid)
        libraries.setdefault(reason, set()).add(library or rid)
    text = ("Rows whose net is sim ran on the simulated network (--net sim): the same program "
            "or app and the same peers in one process, on a virtual clock; a sim row's times "
            "are virtual.")
    for reason, ids in by_reason.items():
        libs = libraries[reason]
        who = next(iter(libs)) if len(libs) == 1 else ", ".join(ids)
        text += (f" {who} runs only on the real network ({reason.rstrip('.')}), so its "
                 f"cells ({', '.join(ids)}) are skipped there.")
    return text


_RANK = {"error": 4, "fail": 3, "skipped": 2, "measured": 1, "pass": 0}


def worst_status(statuses) -> str:
    return max(statuses, key=lambda s: _RANK[s])


def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def fmt_value(metric: str, v) -> str:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return fmt(metric, v)


def cell_series(cell: dict) -> dict:
    """Time series of a cell: {name: [(t, v), ...]} from ``series`` or from metrics or
    samples whose value is a list of [t, v] pairs."""
    out = {}

    def take(name, val):
        if isinstance(val, list) and len(val) >= 2 and all(
                isinstance(p, (list, tuple)) and len(p) == 2
                and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in p) for p in val):
            out.setdefault(name, [(float(t), float(v)) for t, v in val])
    for name, val in sorted((cell.get("series") or {}).items()):
        take(name, val)
    for src in (cell.get("metrics") or {}, cell.get("samples") or {}):
        for name, val in sorted(src.items()):
            if isinstance(val, dict):
                for sub, sv in sorted(val.items()):
                    take(sub, sv)
            else:
                take(name, val)
    return out


def series_metric(name: str) -> str:
    """The unit-suffixed name a series' values format as."""
    if re.search(r"(_bytes|_s|_Bps|_count|_fraction|_per_s)$", name):
        return name
    if "latency" in name or "delay" in name:
        return name + "_s"
    return name + "_bytes" if ("flight" in name or "buffer" in name or "bytes" in name) else name


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", str(text)).strip("-") or "x"


class Anchors:
    def __init__(self):
        self._used, self._by = set(), {}

    def get(self, key: str, prefix: str) -> str:
        if (prefix, key) not in self._by:
            base = f"{prefix}-{slug(key)}"
            a, n = base, 2
            while a in self._used:
                a, n = f"{base}-{n}", n + 1
            self._used.add(a)
            self._by[(prefix, key)] = a
        return self._by[(prefix, key)]



# ---------------------------------------------------------------------------
# HTML pieces

def html_table(header: list, rows: list, *, cls: str = "data", row_attrs: list | None = None,
           caption: str = "", colgroup: list | None = None) -> str:
    """``rows`` hold already-escaped HTML cells; ``colgroup``: a class per column (widths
    set in CSS)."""
    out = [f'<table class="{cls}">']
    if caption:
        out.insert(0, f'<p class="caption">{caption}</p>')
    if colgroup:
        out.append("<colgroup>" + "".join(f'<col class="{c}">' for c in colgroup) + "</colgroup>")
    out.append("<thead><tr>" + "".join(f"<th>{h}</th>" for h in header) + "</tr></thead><tbody>")
    for i, row in enumerate(rows):
        attrs = row_attrs[i] if row_attrs else ""
        # short cells (numbers with units, names) never wrap; long text does
        out.append(f"<tr{attrs}>" + "".join(
            f'<td class="n">{c}</td>' if len(re.sub(r"<[^>]+>", "", str(c))) <= 28 else f"<td>{c}</td>"
            for c in row) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def rt_label(rts: Runtimes, spec: str) -> str:
    if rts[spec]["ours"]:
        return f'<span class="ours" data-rt="{e(spec)}" title="our kernel">{STAR} {e(spec)}</span>'
    return f'<span data-rt="{e(spec)}">{e(spec)}</span>'


def verdict_text(cell: dict, info: dict | None = None) -> str:
    parts = []
    for name, ok in sorted((cell.get("verdicts") or {}).items()):
        desc = (info or {}).get("verdicts", {}).get(name, "")
        t = f' title="{e(desc)}"' if desc else ""
        if ok is None:
            parts.append(f'<span class="err"{t}>{e(name)}: not measured</span>')
            continue
        parts.append(f'<span class="{"ok" if ok else "no"}"{t}>{YES if ok else NO} {e(name)}</span>')
    if cell.get("skipped"):
        parts.append(f'<span class="muted">skipped: {e(str(cell["skipped"]))}</span>')
    for err in (cell.get("errors") or [])[:2]:
        parts.append(f'<span class="err">error: {e(str(err)[:160])}</span>')
    return " ".join(parts) or '<span class="muted">-</span>'
