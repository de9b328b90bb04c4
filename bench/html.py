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
"""
from __future__ import annotations

import html
import json
import math
import os
import re

from bench import echo as echomod
from bench import goals as goalsmod
from bench.results import write_text
from bench.tables import fmt

__all__ = ["write_html", "render_html", "cell_status", "STATUSES", "BENCH_KINDS"]

BENCH_KINDS = ("echo", "micro", "idle")
STYLE_ORDER = ("callback", "stream", "task")
# The library each of our kernels' defaults reproduce, when the runtime registry cannot
# be asked (a document read on a machine without looplab's protocols package).
_PRIMARY_FALLBACK = {"callback": "asyncio-protocol", "hybrid": "asyncio-streams", "coro": "curio"}
_STYLE_FALLBACK = {"callback": "callback", "asyncio-protocol": "callback", "uvloop-protocol": "callback",
                   "hybrid": "stream", "asyncio-streams": "stream", "uvloop-streams": "stream",
                   "coro": "task", "curio": "task", "trio": "task"}
_TIMING_METRICS = ("cell_wall_s",)

# status -> (label, symbol, background, text colour); the symbol keeps the grid readable
# without colour.
STATUSES = {
    "pass": ("all verdicts hold", "\u2713", "#a6dba0", "#0b3d14"),
    "fail": ("some verdict fails", "\u2717", "#f4a582", "#5c0a0a"),
    "error": ("error: no measurement", "!", "#7b3294", "#ffffff"),
    "skipped": ("skipped (runtime unavailable)", "\u2013", "#d9d9d9", "#333333"),
    "measured": ("measured, no verdict", "\u2022", "#c6dbef", "#08306b"),
    "na": ("not applicable / not run", "", "#ffffff", "#999999"),
}

_PALETTE = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#17becf", "#7f7f7f", "#bcbd22", "#e377c2")
_OURS_COLOUR = "#e6550d"
_OURS_SHADES = ("#e6550d", "#fd8d3c", "#a63603")     # several of our kernels on one chart

e = html.escape
STAR, YES, NO, MID, DASH = "\u2605", "\u2713", "\u2717", " \u00b7 ", "\u2013"


# ---------------------------------------------------------------------------
# What the document says, with the registries as a fallback

def _natural(text: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(text))]


def _scenario_order(sid: str):
    """looplab's own S1-S8 first, in number order; anything a user registered after."""
    return (not re.fullmatch(r"S\d+", str(sid)), _natural(sid))


class _Runtimes:
    """Style, ours-ness and primary reference of each runtime spec in the document."""

    def __init__(self, cells):
        self._info = {}
        for c in sorted(cells, key=lambda c: c.get("id", "")):
            spec = c.get("runtime", "?")
            if spec not in self._info:
                self._info[spec] = self._lookup(spec, c)

    @staticmethod
    def _lookup(spec, cell):
        ident = spec.split(":", 1)[0]
        style, ours, compared = cell.get("style"), cell.get("ours"), ()
        try:
            from protocols import runtimes as rtmod
            rt = rtmod.parse(spec)
            style = style or rt.style
            ours = rt.ours if ours is None else ours
            compared = tuple(getattr(rt.info, "compared_with", ()) or ())
        except Exception:  # an unknown plugin runtime, or no protocols package
            pass
        style = style or _STYLE_FALLBACK.get(ident, "other")
        if ours is None:
            ours = ident in _PRIMARY_FALLBACK
        if ours and not compared and ident in _PRIMARY_FALLBACK:
            compared = (_PRIMARY_FALLBACK[ident],)
        return {"id": ident, "style": style, "ours": bool(ours), "compared": compared,
                # options flipped: no single library is the one it reproduces
                "primary": compared[0] if ours and compared and spec == ident else None}

    def __getitem__(self, spec):
        return self._info.get(spec) or self._lookup(spec, {})

    def ordered(self, specs) -> list[str]:
        """Grouped by style; in each, our kernels first, then the libraries they are
        compared with (in that order), then the rest."""
        specs = sorted(set(specs))
        out = []
        styles = [s for s in STYLE_ORDER] + sorted({self[s]["style"] for s in specs} - set(STYLE_ORDER))
        for style in styles:
            here = [s for s in specs if self[s]["style"] == style]
            ours = sorted((s for s in here if self[s]["ours"]), key=lambda s: (":" in s, s))
            refs = []
            for o in ours:
                for r in self[o]["compared"]:
                    for s in sorted(here):
                        if self[s]["id"] == r and s not in refs and s not in ours:
                            refs.append(s)
            rest = [s for s in here if s not in ours and s not in refs]
            out += ours + refs + rest
        return out


def _registry_scenario(sid: str) -> dict:
    try:
        from bench import scenario as api
        sc = api.scenarios().get(sid)
        if sc is not None:
            return sc.describe()
    except Exception:  # the public scenario API is not there (yet), or it failed
        pass
    try:
        from bench.scenarios import SCENARIOS
        sc = SCENARIOS.get(sid)
    except Exception:
        sc = None
    if sc is None:
        return {}
    return {"title": getattr(sc, "title", ""), "summary": getattr(sc, "summary", ""),
            "variants": list(getattr(sc, "variants", ()) or ()),
            "styles": list(getattr(sc, "styles", ()) or ())}


def _scenario_info(doc: dict, sid: str, cells: list) -> dict:
    given = (doc.get("scenarios") or {}).get(sid) or {}
    reg = _registry_scenario(sid)

    def pick(key, default):
        return given.get(key) or reg.get(key) or default
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
    variants += sorted({c.get("variant", "?") for c in cells} - set(variants), key=_natural)
    return {"id": sid, "title": pick("title", sid), "summary": pick("summary", ""),
            "variants": variants, "columns": columns, "all_metrics": names, "timing": timing,
            "labels": {m: d.get("label") for m, d in metrics.items()
                       if isinstance(d, dict) and d.get("label") and d.get("label") != m},
            "verdicts": pick("verdicts", {}), "styles": pick("styles", [])}


def _label(info: dict, metric: str) -> str:
    if metric in info.get("labels", {}):
        return info["labels"][metric]
    name = metric
    for suffix in ("_bytes", "_Bps", "_per_s", "_s", "_count", "_fraction"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return name.replace("_", " ")


def _machine(env: dict) -> tuple:
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


def _vindex(variants: list, v) -> int:
    return variants.index(v) if v in variants else len(variants)


def cell_status(cell: dict) -> str:
    """pass | fail | error | skipped | measured: what a cell's grid colour says."""
    if cell.get("skipped"):
        return "skipped"
    verdicts = cell.get("verdicts") or {}
    if cell.get("errors") and not verdicts and not cell.get("metrics"):
        return "error"
    if any(not v for v in verdicts.values()):
        return "fail"
    if verdicts:
        return "pass"
    return "error" if cell.get("errors") else "measured"


_RANK = {"error": 4, "fail": 3, "skipped": 2, "measured": 1, "pass": 0}


def _worst(statuses) -> str:
    return max(statuses, key=lambda s: _RANK[s])


def _numeric(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _value(metric: str, v) -> str:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return fmt(metric, v)


def _series(cell: dict) -> dict:
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


def _series_metric(name: str) -> str:
    """The unit-suffixed name a series' values format as."""
    if re.search(r"(_bytes|_s|_Bps|_count|_fraction|_per_s)$", name):
        return name
    if "latency" in name or "delay" in name:
        return name + "_s"
    return name + "_bytes" if ("flight" in name or "buffer" in name or "bytes" in name) else name


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", str(text)).strip("-") or "x"


class _Anchors:
    def __init__(self):
        self._used, self._by = set(), {}

    def get(self, key: str, prefix: str) -> str:
        if (prefix, key) not in self._by:
            base = f"{prefix}-{_slug(key)}"
            a, n = base, 2
            while a in self._used:
                a, n = f"{base}-{n}", n + 1
            self._used.add(a)
            self._by[(prefix, key)] = a
        return self._by[(prefix, key)]


# ---------------------------------------------------------------------------
# SVG charts (drawn here, nothing external)

def _n(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".")


def _nice_max(v: float) -> float:
    if v <= 0:
        return 1.0
    exp = 10 ** math.floor(math.log10(v))
    for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if m * exp >= v:
            return m * exp
    return 10 * exp


def _legend(entries, x0: float, y0: float, width: float) -> tuple[str, float]:
    """Clickable legend rows; returns (svg, height used)."""
    parts, x, y = [], x0, y0
    for key, label, colour, dash, thick in entries:
        w = 26 + 6.3 * len(label)
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        bold = ' font-weight="bold"' if thick else ""
        if x + w > x0 + width and x > x0:
            x, y = x0, y + 16
        parts.append(
            f'<g class="lg" data-key="{e(key)}" transform="translate({_n(x)},{_n(y)})">'
            f'<title>click to show or hide {e(label)}</title>'
            f'<rect x="-2" y="-9" width="{_n(w)}" height="14" fill="#fff" fill-opacity="0"/>'
            f'<line x1="0" y1="-2" x2="16" y2="-2" stroke="{colour}" stroke-width="{3 if thick else 2}"'
            f'{dash_attr}/><text x="20" y="2" font-size="11"{bold}>'
            f'{e(label)}</text></g>')
        x += w + 10
    return "".join(parts), y - y0 + 16


def _short(label: str, n: int = 22) -> str:
    return label if len(label) <= n else label[: n - 1] + "\u2026"


def bar_chart(title: str, metric: str, rows: list, groups: list, colours: dict) -> str:
    """Horizontal bars: ``rows`` are (runtime label, ours, {group: value}); one bar per
    group (variant) in each row."""
    groups = [g for g in groups if any(g in vals for _, _, vals in rows)]
    nb = max(1, len(groups))
    bar_h = 9 if nb > 1 else 12
    row_h = nb * bar_h + 6
    left, right, top = 150, 80, 24
    width = 560
    plot_w = width - left - right
    legend, lh = _legend([(g, g, colours[g], "", False) for g in groups], left, top, plot_w) \
        if len(groups) > 1 else ("", 0)
    top += lh
    rows = [(label, ours, {g: v for g, v in d.items() if _numeric(v)}) for label, ours, d in rows]
    vals = [v for _, _, d in rows for v in d.values()]
    vmax = _nice_max(max([abs(v) for v in vals] + [0]))
    height = top + row_h * len(rows) + 28
    p = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{_n(height)}" '
         f'viewBox="0 0 {width} {_n(height)}" role="img" aria-label="{e(title)}">',
         f'<text x="4" y="14" font-size="12" font-weight="bold">{e(title)}</text>', legend]
    for i in range(5):
        x = left + plot_w * i / 4
        p.append(f'<line x1="{_n(x)}" y1="{top}" x2="{_n(x)}" y2="{_n(height - 24)}" stroke="#e5e5e5"/>'
                 f'<text x="{_n(x)}" y="{_n(height - 10)}" font-size="10" text-anchor="middle" fill="#555">'
                 f'{e(_value(metric, vmax * i / 4))}</text>')
    ours_text = f' font-weight="bold" fill="{_OURS_COLOUR}"'
    ours_bar = ' stroke="#000" stroke-width="0.8"'
    for r, (label, ours, d) in enumerate(rows):
        y = top + r * row_h + 3
        p.append(f'<text x="{left - 6}" y="{_n(y + row_h / 2 + 1)}" font-size="11" text-anchor="end"'
                 f'{ours_text if ours else ""}>'
                 f'<title>{e(label)}</title>{e((STAR + " " if ours else "") + _short(label))}</text>')
        for j, g in enumerate(groups):
            v = d.get(g)
            by = y + j * bar_h
            if v is None:
                continue
            w = plot_w * abs(v) / vmax
            p.append(f'<g data-series="{e(g)}"><rect x="{left}" y="{_n(by)}" width="{_n(max(w, 0.5))}" '
                     f'height="{bar_h - 1}" fill="{colours[g]}"'
                     f'{ours_bar if ours else ""}>'
                     f'<title>{e(label)} {e(g)}: {e(_value(metric, v))}</title></rect>'
                     f'<text x="{_n(left + w + 3)}" y="{_n(by + bar_h - 2)}" font-size="9" fill="#333">'
                     f'{e(_value(metric, v))}</text></g>')
    p.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{_n(height - 24)}" stroke="#333"/></svg>')
    return "".join(p)


def line_chart(title: str, metric: str, lines: list, *, xlabel: str, log_x: bool = False,
               width: int = 440, height: int = 260, x_metric: str | None = None) -> str:
    """``lines``: (key, label, colour, dashed, thick, [(x, y), ...]); the legend toggles them."""
    left, right, top, bottom = 62, 12, 24, 36
    legend, lh = _legend([(k, lb, c, "5,3" if d else "", t) for k, lb, c, d, t, _ in lines],
                         left, top, width - left - right)
    top += lh
    height += lh
    pw, ph = width - left - right, height - top - bottom
    xs = [x for *_, pts in lines for x, _ in pts if not log_x or x > 0]
    ys = [y for *_, pts in lines for _, y in pts]
    if log_x:
        lo, hi = math.log10(min(xs or [1])), math.log10(max(xs or [10]))
        hi = hi if hi > lo else lo + 1
        fx = lambda x: left + pw * (math.log10(x) - lo) / (hi - lo)  # noqa: E731
    else:
        lo, hi = 0.0, _nice_max(max(xs or [1]))
        fx = lambda x: left + pw * (x - lo) / (hi - lo)  # noqa: E731
    ymax = _nice_max(max(ys or [0]))
    fy = lambda y: top + ph - ph * y / ymax  # noqa: E731
    p = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
         f'viewBox="0 0 {width} {height}" role="img" aria-label="{e(title)}">',
         f'<text x="4" y="14" font-size="12" font-weight="bold">{e(title)}</text>', legend]
    for i in range(5):
        y = top + ph * i / 4
        p.append(f'<line x1="{left}" y1="{_n(y)}" x2="{left + pw}" y2="{_n(y)}" stroke="#e5e5e5"/>'
                 f'<text x="{left - 4}" y="{_n(y + 3)}" font-size="10" text-anchor="end" fill="#555">'
                 f'{e(_value(metric, ymax * (4 - i) / 4))}</text>')
    ticks = [10 ** k for k in range(math.floor(lo), math.ceil(hi) + 1)] if log_x else \
        [lo + (hi - lo) * i / 4 for i in range(5)]
    for t in ticks:
        x = fx(t)
        if left - 0.5 <= x <= left + pw + 0.5:
            text = _value(x_metric, t) if x_metric else f"{t:.4g}"
            p.append(f'<text x="{_n(x)}" y="{top + ph + 14}" font-size="10" text-anchor="middle" '
                     f'fill="#555">{e(text)}</text>')
    p.append(f'<text x="{left + pw / 2:.0f}" y="{height - 6}" font-size="10" text-anchor="middle">'
             f'{e(xlabel)}</text>')
    # thick lines (our kernels) last, so a reference drawn on top never hides them
    for key, label, colour, dashed, thick, pts in sorted(lines, key=lambda ln: bool(ln[4])):
        pts = [(x, y) for x, y in pts if not log_x or x > 0]
        if not pts:
            continue
        step = max(1, len(pts) // 240)   # a few hundred points per line is plenty
        pts = pts[::step] + ([pts[-1]] if (len(pts) - 1) % step else [])
        dashes = ' stroke-dasharray="5,3"'
        path = " ".join(f"{_n(fx(x))},{_n(fy(y))}" for x, y in pts)
        peak = max(y for _, y in pts)
        dots = "".join(f'<circle cx="{_n(fx(x))}" cy="{_n(fy(y))}" r="2.5" fill="{colour}">'
                       f'<title>{e(label)}: {e(_value(metric, y))} at {e(f"{x:g}")}</title></circle>'
                       for x, y in pts) if len(pts) <= 12 else ""
        p.append(f'<g data-series="{e(key)}"><polyline fill="none" stroke="{colour}" '
                 f'stroke-width="{2.6 if thick else 1.3}"'
                 f'{dashes if dashed else ""} points="{path}">'
                 f'<title>{e(label)}: peak {e(_value(metric, peak))}, last {e(_value(metric, pts[-1][1]))}'
                 f'</title></polyline>{dots}</g>')
    p.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#333"/></svg>')
    return "".join(p)


# ---------------------------------------------------------------------------
# HTML pieces

def _table(header: list, rows: list, *, cls: str = "data", row_attrs: list | None = None,
           caption: str = "") -> str:
    """``rows`` hold already-escaped HTML cells."""
    out = [f'<table class="{cls}">']
    if caption:
        out.insert(0, f'<p class="caption">{caption}</p>')
    out.append("<thead><tr>" + "".join(f"<th>{h}</th>" for h in header) + "</tr></thead><tbody>")
    for i, row in enumerate(rows):
        attrs = row_attrs[i] if row_attrs else ""
        # short cells (numbers with units, names) never wrap; long text does
        out.append(f"<tr{attrs}>" + "".join(
            f'<td class="n">{c}</td>' if len(re.sub(r"<[^>]+>", "", str(c))) <= 28 else f"<td>{c}</td>"
            for c in row) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _rt_label(rts: _Runtimes, spec: str) -> str:
    if rts[spec]["ours"]:
        return f'<span class="ours" data-rt="{e(spec)}" title="our kernel">{STAR} {e(spec)}</span>'
    return f'<span data-rt="{e(spec)}">{e(spec)}</span>'


def _verdict_text(cell: dict, info: dict | None = None) -> str:
    parts = []
    for name, ok in sorted((cell.get("verdicts") or {}).items()):
        desc = (info or {}).get("verdicts", {}).get(name, "")
        t = f' title="{e(desc)}"' if desc else ""
        parts.append(f'<span class="{"ok" if ok else "no"}"{t}>{YES if ok else NO} {e(name)}</span>')
    if cell.get("skipped"):
        parts.append(f'<span class="muted">skipped: {e(str(cell["skipped"]))}</span>')
    for err in (cell.get("errors") or [])[:2]:
        parts.append(f'<span class="err">error: {e(str(err)[:160])}</span>')
    return " ".join(parts) or '<span class="muted">-</span>'


class _Page:
    def __init__(self, doc: dict, plots: dict | None, command: str | None, out_dir: str | None):
        self.doc = doc
        cells = [c for c in (doc.get("cells") or []) if isinstance(c, dict)]
        self.cells = sorted(cells, key=lambda c: (_scenario_order(c.get("scenario", "")), str(c.get("id", ""))))
        self.bench = [c for c in self.cells if c.get("scenario") in BENCH_KINDS]
        self.scen = [c for c in self.cells if c.get("scenario") not in BENCH_KINDS]
        self.rts = _Runtimes(self.cells)
        self.anchors = _Anchors()
        self.sids = sorted({c.get("scenario", "?") for c in self.scen}, key=_scenario_order)
        self.info = {sid: _scenario_info(doc, sid, [c for c in self.scen if c.get("scenario") == sid])
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
        out = {}
        for c in self.scen:
            out.setdefault((c.get("runtime", "?"), c.get("scenario", "?"), c.get("variant", "?")), []).append(c)
        return out

    # -- the verdict grid --------------------------------------------------
    def grid(self) -> str:
        if not self.scen:
            return ""
        keyed = self.by_key()
        columns = [(sid, v) for sid in self.sids for v in self.info[sid]["variants"]
                   if any(k[1] == sid and k[2] == v for k in keyed)]
        specs = self.rts.ordered(c.get("runtime", "?") for c in self.scen)
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
            tds = []
            for i, (sid, v) in enumerate(columns):
                tds.append(self.grid_cell(spec, sid, v, keyed.get((spec, sid, v), []), i >= ncol * 0.6))
            cls = ' class="ours"' if info["ours"] else ""
            rows.append(f'<tr{cls}><th class="rt">{_rt_label(self.rts, spec)}</th>{"".join(tds)}</tr>')
        legend = " ".join(
            f'<span class="key"><span class="sw v-{k}">{STATUSES[k][1]}</span> {e(STATUSES[k][0])}</span>'
            for k in STATUSES)
        return ('<div class="gridwrap"><table class="grid" id="grid"><thead><tr>' + "".join(head1)
                + "</tr><tr>" + "".join(head2) + "</tr></thead><tbody>" + "".join(rows)
                + f'</tbody></table></div><p class="legend">{legend}</p><p class="legend">{STAR} our kernel, '
                "listed first in its style with the libraries it imitates below it. Each cell shows the "
                "scenario's first metric; hover it for the others, click it for its row in the "
                "scenario's table.</p>")

    def grid_cell(self, spec, sid, variant, cells, flip) -> str:
        info = self.info[sid]
        if not cells:
            styles = info.get("styles") or []
            why = (f"{sid} runs on the {', '.join(styles)} style only" if styles
                   and self.rts[spec]["style"] not in styles else "not in this run")
            return (f'<td class="v-na" data-status="na" data-key="{e(spec)}|{e(sid)}|{e(variant)}" '
                    f'title="not applicable: {e(why)}"></td>')
        status = _worst(cell_status(c) for c in cells)
        main = cells[0]
        head = next((m for m in info["columns"] if _numeric((main.get("metrics") or {}).get(m))), None)
        text = STATUSES[status][1]
        if head and status in ("pass", "fail", "measured") and sid != self.fingerprint_sid():
            text += " " + e(_value(head, main["metrics"][head]))
        tip = [f'<b>{e(spec)}</b> \u00b7 {e(sid)} {e(variant)}<br><i>{e(STATUSES[status][0])}</i>']
        for c in cells:
            if len(cells) > 1:
                tip.append(f'<div class="muted">{e(str(c.get("id")))}</div>')
            rows = "".join(f"<tr><td>{e(_label(info, m))}</td><td>{e(_value(m, c['metrics'][m]))}</td></tr>"
                           for m in info["columns"] if (c.get("metrics") or {}).get(m) is not None)
            if rows:
                tip.append(f"<table>{rows}</table>")
            tip.append(_verdict_text(c, info))
            for n in (c.get("notes") or [])[:2]:
                tip.append(f'<div class="note">{e(str(n)[:200])}</div>')
        ids = " ".join(str(c.get("id")) for c in cells)
        anchor = self.anchors.get(str(main.get("id")), "c")
        return (f'<td class="v-{status}{" flip" if flip else ""}" data-status="{status}" '
                f'data-key="{e(spec)}|{e(sid)}|{e(variant)}" data-cells="{e(ids)}">'
                f'<a href="#{anchor}">{text}</a><div class="tip">{"".join(tip)}</div></td>')

    # -- the three questions -----------------------------------------------
    def answers(self) -> str:
        def witness(c, kind):
            """The number that shows why a verdict failed, as (label, text)."""
            m = c.get("metrics") or {}
            if kind == "grow":
                names = [n for n in m if n.endswith("_bytes") and ("buffer" in n or "queue" in n) and _numeric(m[n])]
                if names:
                    best = max(sorted(names), key=lambda n: m[n])
                    return fmt(best, m[best])
                for n in ("in_flight_at_end_bytes", "rss_growth_bytes"):
                    if _numeric(m.get(n)):
                        return fmt(n, m[n])
            else:
                if _numeric(m.get("lost_bytes")):
                    return fmt("lost_bytes", m["lost_bytes"]) + " lost"
                for n in sorted(m):
                    if "delivered" in n and _numeric(m[n]):
                        return fmt(n, m[n]) + " delivered"
            return ""

        def question(pred, kind, none_text, legend):
            found = {}
            for c in self.scen:
                names = [n for n in (c.get("verdicts") or {}) if pred(n)]
                if names:
                    holds = all(c["verdicts"][n] for n in names)
                    found.setdefault((c.get("scenario"), c.get("variant")), ([], []))[1 if holds else 0].append(c)
            if not found:
                return f'<p class="muted">{none_text}</p>'
            rows, clean, bad_rts, seen = [], [], set(), set()
            for (sid, variant), (failing, holding) in sorted(
                    found.items(), key=lambda kv: (_scenario_order(kv[0][0]),
                                                   _vindex(self.info[kv[0][0]]["variants"], kv[0][1]))):
                seen.update(c["runtime"] for c in failing + holding)
                link = f'<a href="#{self.anchors.get(sid, "s")}">{e(sid)}</a> {e(variant)}'
                if not failing:
                    clean.append(link)
                    continue
                order = {s: i for i, s in enumerate(self.rts.ordered(c["runtime"] for c in failing + holding))}
                bad_rts.update(c["runtime"] for c in failing)
                fails = ", ".join(_rt_label(self.rts, c["runtime"]) + (
                    f' <span class="muted">{e(witness(c, kind))}</span>' if witness(c, kind) else "")
                    for c in sorted(failing, key=lambda c: order[c["runtime"]]))
                holds = ", ".join(_rt_label(self.rts, c["runtime"])
                                  for c in sorted(holding, key=lambda c: order[c["runtime"]])) or "none"
                rows.append([link, fails, holds])
            never = [s for s in self.rts.ordered(seen) if s not in bad_rts]
            out = ("<p>" + (f"{NO} somewhere: " + ", ".join(_rt_label(self.rts, s) for s in self.rts.ordered(bad_rts))
                            if bad_rts else "No runtime fails.")
                   + (f". {YES} everywhere it ran: " + ", ".join(_rt_label(self.rts, s) for s in never)
                      if never and bad_rts else "") + ".</p>")
            if rows:
                out += _table(["cell", f"{NO} fails", f"{YES} holds"], rows, cls="data answer", caption=legend)
            if clean:
                out += f'<p class="muted">Holds on every runtime: {", ".join(clean)}.</p>'
            return out

        return "".join([
            '<div class="answers"><h2 id="answers">The three questions</h2>',
            "<h3>Which runtimes let the buffer grow without bound?</h3>",
            question(lambda n: "bounded" in n, "grow",
                     "No scenario with a bounded verdict in this run (S1, S5 and S6 answer it).",
                     "the bounded verdict: user-space buffer (or queue, or memory) within its limit; "
                     "after a failing runtime, its largest user-space buffer or queue"),
            "<h3>Which lose data at shutdown?</h3>",
            question(lambda n: n == "no_loss", "loss",
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
                groups.setdefault("n/a" if v is None else _value(m, v), []).append(c["runtime"])
            if len(groups) < 2:
                continue
            alts = "; ".join(f"<b>{e(v)}</b> on {', '.join(_rt_label(self.rts, r) for r in rs)}"
                             for v, rs in groups.items())
            items.append(f"<li>{e(_label(info, m))}: {alts}</li>")
        same = [(_label(info, m)) for m in info["columns"]
                if len({_value(m, c["metrics"].get(m)) for c in cells}) == 1]
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
        cells.sort(key=lambda c: (order[c.get("runtime", "?")], vorder.get(c.get("variant"), 99), str(c.get("id"))))
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
        notes = sorted({f"{c.get('runtime')} {c.get('variant')}: {n}" for c in cells for n in c.get("notes") or []})
        if notes:
            out.append(f'<details><summary>{len(notes)} notes</summary><ul>'
                       + "".join(f"<li>{e(n)}</li>" for n in notes) + "</ul></details>")
        out.append("</section>")
        return "".join(out)

    def scenario_plots(self, sid, info, cells) -> str:
        series_cells = [c for c in cells if _series(c)]
        if series_cells:
            return self.series_plots(sid, info, series_cells)
        numeric = [m for m in info["columns"]
                   if any(isinstance((c.get("metrics") or {}).get(m), (int, float))
                          and not isinstance(c["metrics"][m], bool) for c in cells)][:2]
        if not numeric:
            return '<p class="muted">(no numeric metric to plot)</p>'
        variants = [v for v in info["variants"] if any(c.get("variant") == v for c in cells)]
        colours = {v: _PALETTE[i % len(_PALETTE)] for i, v in enumerate(variants)}
        charts = []
        for m in numeric:
            rows = []
            for spec in self.rts.ordered(c.get("runtime", "?") for c in cells):
                vals = {c.get("variant"): c["metrics"][m] for c in cells if c.get("runtime") == spec
                        and isinstance((c.get("metrics") or {}).get(m), (int, float))
                        and not isinstance(c["metrics"][m], bool)}
                rows.append((spec, self.rts[spec]["ours"], vals))
            charts.append(bar_chart(f"{sid}: {_label(info, m)}", m, rows, variants, colours))
        return "".join(charts)

    def series_plots(self, sid, info, cells) -> str:
        names = sorted({n for c in cells for n in _series(c)}, key=lambda n: (n != "in_flight", n))
        variants = [v for v in info["variants"] if any(c.get("variant") == v for c in cells)]
        charts, summary = [], {}
        styles = []
        for spec in self.rts.ordered(c.get("runtime", "?") for c in cells):
            if self.rts[spec]["style"] not in styles:
                styles.append(self.rts[spec]["style"])
        for name in names:
            metric = _series_metric(name)
            row = []
            for style in styles:
                specs = [s for s in self.rts.ordered(c.get("runtime", "?") for c in cells)
                         if self.rts[s]["style"] == style]
                colour = {}
                refs = [s for s in specs if not self.rts[s]["ours"]]
                for s in specs:
                    colour[s] = _OURS_COLOUR if self.rts[s]["ours"] else _PALETTE[refs.index(s) % len(_PALETTE)]
                lines = []
                for s in specs:
                    for c in sorted((c for c in cells if c.get("runtime") == s),
                                    key=lambda c: _vindex(variants, c.get("variant"))):
                        pts = _series(c).get(name)
                        if not pts:
                            continue
                        v = c.get("variant", "?")
                        lines.append((f"{s} {v}", f"{STAR if self.rts[s]['ours'] else ''}{s} {v}", colour[s],
                                      variants.index(v) > 0 if v in variants else True, self.rts[s]["ours"], pts))
                        summary.setdefault((s, v), {})[name] = (
                            _value(metric, max(p[1] for p in pts)), _value(metric, pts[-1][1]))
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
        rows = [[_rt_label(self.rts, sp), e(v)]
                + [e(summary[(sp, v)].get(n, ("-", "-"))[k]) for n in names for k in (0, 1)]
                for sp, v in sorted(summary, key=lambda sv: (order[sv[0]], _vindex(variants, sv[1])))]
        header = ["runtime", "variant"] + [f"{e(n.replace('_', ' '))}: {k}"
                                           for n in names for k in ("peak", "at the end")]
        table = _table(header, rows, caption="the plotted series in numbers")
        return "".join(charts) + note + table

    def scenario_table(self, sid, info, cells) -> str:
        cols = info["columns"]
        fingerprint = sid == self.fingerprint_sid()
        mode = {}
        if fingerprint:
            for m in cols:
                vals = ["n/a" if (c.get("metrics") or {}).get(m) is None else _value(m, c["metrics"][m])
                        for c in cells if c.get("metrics")]
                mode[m] = max(sorted(set(vals)), key=vals.count) if vals else None
        rows, attrs = [], []
        for c in cells:
            row = [_rt_label(self.rts, c.get("runtime", "?")), e(str(c.get("variant", "?")))]
            for m in cols:
                v = (c.get("metrics") or {}).get(m)
                # a fingerprint fact a style cannot have (no tasks on the callback port) is n/a, not 0
                text = "n/a" if fingerprint and v is None and c.get("metrics") else e(_value(m, v))
                if fingerprint and c.get("metrics") and text != e(mode.get(m) or ""):
                    text = f'<span class="diff" title="differs from most runtimes">{text}</span>'
                row.append(text)
            row.append(_verdict_text(c, info))
            rows.append(row)
            cls = "ours" if self.rts[c.get("runtime", "?")]["ours"] else ""
            attrs.append(f' id="{self.anchors.get(str(c.get("id")), "c")}"' + (f' class="{cls}"' if cls else ""))
        header = ["runtime", "variant"] + [e(_label(info, m)) for m in cols] + ["verdicts"]
        cap = "\u2605 our kernel; highlighted values differ from most runtimes" if fingerprint else "\u2605 our kernel"
        out = _table(header, rows, row_attrs=attrs, caption=cap)
        extra = [m for m in info["all_metrics"] if m not in cols]
        if extra:
            more = [[_rt_label(self.rts, c.get("runtime", "?")), e(str(c.get("variant")))]
                    + [e(_value(m, (c.get("metrics") or {}).get(m))) for m in extra] for c in cells]
            out += ('<details><summary>every metric</summary>'
                    + _table(["runtime", "variant"] + [e(m) for m in extra], more, cls="more") + "</details>")
        return out

    # -- fidelity -----------------------------------------------------------
    def fidelity(self) -> str:
        """One row per scenario x variant, one column per kernel of ours and its primary
        reference: agree, or why not."""
        keyed = self.by_key()
        pairs = sorted({(spec, self.rts[spec]["primary"]) for spec, _, _ in keyed
                        if self.rts[spec]["ours"] and self.rts[spec]["primary"]},
                       key=lambda p: self.rts.ordered(k[0] for k in keyed).index(p[0]))
        flipped = sorted({spec for spec, _, _ in keyed if self.rts[spec]["ours"] and not self.rts[spec]["primary"]})
        if not pairs:
            return ""
        columns = sorted({(sid, v) for _, sid, v in keyed},
                         key=lambda sv: (_scenario_order(sv[0]), self.info[sv[0]]["variants"].index(sv[1])
                                         if sv[1] in self.info[sv[0]]["variants"] else 99))
        rows, agree, total, differ = [], 0, 0, 0
        for sid, variant in columns:
            row, any_pair = [f'<a href="#{self.anchors.get(sid, "s")}">{e(sid)}</a>', e(variant)], False
            for spec, ref in pairs:
                ours, refs = keyed.get((spec, sid, variant)), keyed.get((ref, sid, variant))
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
                head = next((m for m in self.info[sid]["columns"] if _numeric((o.get("metrics") or {}).get(m))), None)
                if head:
                    why += (f" ({e(_label(self.info[sid], head))}: ours {e(_value(head, o['metrics'][head]))}, "
                            f"{e(ref)} {e(_value(head, (r.get('metrics') or {}).get(head)))})")
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
        header = ["scenario", "variant"] + [f"{_rt_label(self.rts, spec)} vs {e(ref)}" for spec, ref in pairs]
        return ('<section><h2 id="fidelity">Fidelity: our kernels against their references</h2>' + head
                + _table(header, rows, cls="data fidelity") + "</section>")

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
        out = head + _table(["pairing", "agree", "declared", "differ (undeclared)", "errors"], rows,
                            cls="data probes")
        diffs = block.get("differences") or []
        if diffs:
            drows = [[e(f'{d["ours"]} vs {d["reference"]}'), f'<code>{e(d["probe"])}</code>',
                      f'<code>{e(d["reference_obs"])}</code>', f'<code>{e(d["ours_obs"])}</code>',
                      (f'<span class="no">{NO} {e(d["verdict"])}</span>' if d["verdict"] in ("differ", "error")
                       else e(d["verdict"])), e(d["reason"])] for d in diffs]
            out += ("<h3>Differences</h3>"
                    + _table(["pairing", "probe", "reference", "ours", "verdict", "reason"], drows,
                             cls="data probe-diffs"))
        return ('<section><h2 id="probes">Fidelity probes: our kernels at the edges</h2>' + out
                + "</section>")

    # -- benchmarks -----------------------------------------------------------
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
        table = []
        for r in rows:
            st = str(r.get("status", "?"))
            cls = "ok" if st.startswith("met") else "muted" if st == "not measured" else "no"
            rng = "-" if r.get("min") is None else f"{r['min']:.2f}\u2013{r['max']:.2f}"
            table.append([e(str(r.get("goal", "?"))), "-" if r.get("ratio") is None else f"{r['ratio']:.2f}\u00d7",
                          rng, e(str(r.get("n", ""))), f'<span class="{cls}">{e(st)}</span>',
                          "-" if r.get("cpu_ratio") is None else f"{r['cpu_ratio']:.2f}"])
        return ('<h3 id="goals">Performance goals</h3>'
                + _table(["goal", "measured (median of paired ratios)", "range over rounds", "rounds", "status",
                          "server CPU/request, reference over ours"], table))

    def echo(self, cells) -> str:
        cfg = self.doc.get("config") or {}
        specs = self.rts.ordered(c["runtime"] for c in cells)
        baseline = cfg.get("baseline") if cfg.get("baseline") in specs else (
            "asyncio-protocol" if "asyncio-protocol" in specs else specs[0])
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
            out.append(_table(["message \u00d7 connections"] + [_rt_label(self.rts, s) for s in specs], rows,
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
                        colour = (_OURS_SHADES[ours_specs.index(s) % len(_OURS_SHADES)] if ours
                                  else _PALETTE[refs.index(s) % len(_PALETTE)])
                        lines.append((s, ("\u2605" if ours else "") + s, colour, not ours, ours, pts))
                if lines:
                    charts.append(line_chart(f"echo throughput by connections"
                                             + (f", {size:,} B messages" if size else ""), "requests_per_s",
                                             lines, xlabel="connections (log scale)", log_x=True, width=620,
                                             height=300))
            out.append('<div class="pair"><div class="plots">' + "".join(charts) + "</div>")
        else:
            colours = {lb: _PALETTE[i % len(_PALETTE)] for i, lb in enumerate(labels)}
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
                rows.append([_rt_label(self.rts, s), e(label(c.get("params") or {})),
                             e(_value("requests_per_s", m.get("requests_per_s"))),
                             e(_value("latency_p50_s", m.get("latency_p50_s"))),
                             e(_value("latency_p99_s", m.get("latency_p99_s"))),
                             e(_value("server_cpu_per_request_s", m.get("server_cpu_per_request_s"))),
                             e(str(c.get("repeats", ""))), e(", ".join(flags))])
        out.append('<div class="tables">' + _table(
            ["runtime", "message \u00d7 connections", "requests/s", "p50", "p99", "server CPU/request", "rounds",
             "flags"], rows, caption="medians over rounds") + "</div></div>")
        return "".join(out)

    def simple_bench(self, cells, title, metric, what) -> str:
        specs = self.rts.ordered(c["runtime"] for c in cells)
        groups = sorted({c.get("variant", "?") for c in cells}, key=_natural)
        if all(g == "naive" for g in groups):
            groups = ["naive"]
        colours = {g: _PALETTE[i % len(_PALETTE)] for i, g in enumerate(groups)}
        rows, table = [], []
        for s in specs:
            vals = {c.get("variant", "?"): (c.get("metrics") or {}).get(metric)
                    for c in cells if c["runtime"] == s}
            rows.append((s, self.rts[s]["ours"], {g: v for g, v in vals.items() if isinstance(v, (int, float))}))
            table.append([_rt_label(self.rts, s)] + [e(_value(metric, vals.get(g))) for g in groups])
        head = ["runtime"] + [e(g) for g in groups] if len(groups) > 1 or groups != ["naive"] else \
            ["runtime", e(what)]
        return (f'<h3 id="{_slug(title)}">{e(title[0].upper() + title[1:])}</h3><div class="pair"><div class="plots">'
                + bar_chart(f"{title}: {what}", metric, rows, groups, colours) + '</div><div class="tables">'
                + _table(head, table, caption=e(what) + " (median over rounds)") + "</div></div>")

    # -- metadata ------------------------------------------------------------
    def rel(self, path) -> str:
        path = str(path)
        if self.out_dir and os.path.isabs(path):
            return os.path.relpath(path, self.out_dir)
        return path

    def metadata(self) -> str:
        envs = self.doc.get("env")
        envs = envs if isinstance(envs, list) else [envs] if isinstance(envs, dict) else []
        machines = sorted({_machine(env) for env in envs if isinstance(env, dict)})
        out = ['<section><h2 id="run">Run</h2>']
        if machines:
            names = list(dict.fromkeys(n for m in machines for n, _ in m))
            rows = [[e(n)] + [e(dict(m).get(n, "-")) for m in machines] for n in names]
            out.append(_table(["", *[f"machine {i + 1}" if len(machines) > 1 else "machine"
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
                   f"{e(str(self.doc.get('schema', '?')))}, {len(self.cells)} cells.</p>")
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
                    f'{len({c.get("runtime") for c in self.cells})} runtimes.</p>'
                    f'<nav>{MID.join(nav)}</nav></header>')
        if self.scen:
            body.append('<section><h2 id="verdicts">Verdicts</h2>' + self.grid() + "</section>")
            body.append(self.answers())
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
