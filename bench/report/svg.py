"""The SVG charts of report.html, drawn here with nothing external: bars grouped by
runtime and lines over time or load, with a legend whose entries toggle their series.
Our kernels are drawn in orange, thick; the reference libraries in the palette.
"""
from __future__ import annotations

import math

from bench.report.htmldoc import STAR, e, fmt_value, is_number

PALETTE = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#17becf", "#7f7f7f", "#bcbd22", "#e377c2")
OURS_COLOUR = "#e6550d"
OURS_SHADES = ("#e6550d", "#fd8d3c", "#a63603")     # several of our kernels on one chart


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
    rows = [(label, ours, {g: v for g, v in d.items() if is_number(v)}) for label, ours, d in rows]
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
                 f'{e(fmt_value(metric, vmax * i / 4))}</text>')
    ours_text = f' font-weight="bold" fill="{OURS_COLOUR}"'
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
                     f'<title>{e(label)} {e(g)}: {e(fmt_value(metric, v))}</title></rect>'
                     f'<text x="{_n(left + w + 3)}" y="{_n(by + bar_h - 2)}" font-size="9" fill="#333">'
                     f'{e(fmt_value(metric, v))}</text></g>')
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
                 f'{e(fmt_value(metric, ymax * (4 - i) / 4))}</text>')
    ticks = [10 ** k for k in range(math.floor(lo), math.ceil(hi) + 1)] if log_x else \
        [lo + (hi - lo) * i / 4 for i in range(5)]
    for t in ticks:
        x = fx(t)
        if left - 0.5 <= x <= left + pw + 0.5:
            text = fmt_value(x_metric, t) if x_metric else f"{t:.4g}"
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
                       f'<title>{e(label)}: {e(fmt_value(metric, y))} at {e(f"{x:g}")}</title></circle>'
                       for x, y in pts) if len(pts) <= 12 else ""
        p.append(f'<g data-series="{e(key)}"><polyline fill="none" stroke="{colour}" '
                 f'stroke-width="{2.6 if thick else 1.3}"'
                 f'{dashes if dashed else ""} points="{path}">'
                 f'<title>{e(label)}: peak {e(fmt_value(metric, peak))}, last {e(fmt_value(metric, pts[-1][1]))}'
                 f'</title></polyline>{dots}</g>')
    p.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#333"/></svg>')
    return "".join(p)
