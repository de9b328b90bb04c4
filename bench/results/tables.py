"""Tables and units: the one table renderer and the one set of number formatters.

Every table looplab prints -- the terminal summary, report.md, `compare`, the bench
ratio tables -- goes through ``format_table``; every number goes through ``fmt`` (by
the unit suffix of its metric name, the results vocabulary: ``_bytes``, ``_s``,
``_Bps``, ``_count``, ``_fraction``, ``_per_s``) or one of the unit formatters below.
A value that was not measured is shown as ``-``, never as 0.
"""
from __future__ import annotations

__all__ = ["format_table", "fmt", "fmt_bytes", "fmt_seconds", "fmt_rate", "fmt_Bps",
           "fmt_count", "fmt_fraction", "fmt_percent", "fmt_value", "MISSING", "plural"]

MISSING = "-"


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """``1 cell``, ``2 cells``, ``0 cells``: a count and its noun, agreeing."""
    return f"{n} {noun if n == 1 else nouns or noun + 's'}"


def fmt_bytes(v) -> str:
    """Bytes in decimal units, as the reports quote them (19.88 MB)."""
    if v is None:
        return MISSING
    a = abs(v)
    if a >= 1e9:
        return f"{v / 1e9:.2f} GB"
    if a >= 1e6:
        return f"{v / 1e6:.2f} MB"
    if a >= 1e4:
        return f"{v / 1e3:.1f} kB"
    return f"{v:,.0f} B"


def fmt_seconds(v) -> str:
    if v is None:
        return MISSING
    a = abs(v)
    if a >= 1 or a == 0:
        return f"{v:.2f} s"
    if a >= 1e-3:
        return f"{v * 1e3:.2f} ms"
    return f"{v * 1e6:.1f} µs"


def fmt_rate(v, unit: str = "/s") -> str:
    """Operations per second with k/M prefixes (105.0k/s)."""
    if v is None:
        return MISSING
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:.2f}M{unit}"
    if a >= 1e3:
        return f"{v / 1e3:.1f}k{unit}"
    return f"{v:.0f}{unit}"


def fmt_Bps(v) -> str:
    if v is None:
        return MISSING
    return f"{v / 1e6:.2f} MB/s"


def fmt_count(v) -> str:
    if v is None:
        return MISSING
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (int, float)):
        return f"{v:,.0f}" if float(v).is_integer() or abs(v) >= 100 else f"{v:.2f}"
    return str(v)


def fmt_fraction(v) -> str:
    return MISSING if v is None else f"{v:.2f}"


def fmt_percent(v) -> str:
    return MISSING if v is None else f"{100 * v:.1f} %"


def fmt_value(v) -> str:
    """A value of no known unit: booleans as yes/no, floats to 3 significant digits."""
    if v is None:
        return MISSING
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if v == 0:
            return "0"
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


_BY_SUFFIX = (("_bytes", fmt_bytes), ("_Bps", fmt_Bps), ("_per_s", fmt_rate), ("_s", fmt_seconds),
              ("_fraction", fmt_fraction), ("_count", fmt_count))


def fmt(metric: str, v) -> str:
    """Format ``v`` by the unit its metric name ends in."""
    if v is None or isinstance(v, bool) or not isinstance(v, (int, float)):
        return fmt_value(v)
    for suffix, f in _BY_SUFFIX:
        if metric.endswith(suffix):
            return f(v)
    return fmt_value(v)


def format_table(header, rows, markdown: bool = False, align: str | None = None) -> str:
    """A plain-text (or Markdown) table. ``align`` has one letter per column, ``l`` or
    ``r``; by default the first column is left-aligned and text columns too, numbers
    right-aligned."""
    header = [str(h) for h in header]
    rows = [[str(c) for c in row] for row in rows]
    if markdown:
        seps = ["---:" if (align and align[i] == "r") else "---" for i in range(len(header))]
        esc = lambda c: c.replace("|", "\\|")  # noqa: E731
        lines = ["| " + " | ".join(map(esc, header)) + " |", "|" + "|".join(seps) + "|"]
        lines += ["| " + " | ".join(map(esc, row)) + " |" for row in rows]
        return "\n".join(lines)
    widths = [max([len(h)] + [len(r[i]) for r in rows if i < len(r)]) for i, h in enumerate(header)]
    if align is None:
        align = "".join("l" if i == 0 or not all(_numeric(r[i]) for r in rows if i < len(r)) else "r"
                        for i in range(len(header)))

    def line(cells):
        return "  ".join(c.rjust(w) if a == "r" else c.ljust(w)
                         for c, w, a in zip(cells, widths, align)).rstrip()
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def _numeric(cell: str) -> bool:
    head = cell.strip().split(" ")[0].replace(",", "").rstrip("%kMx/s")
    try:
        float(head)
        return True
    except ValueError:
        return cell.strip() == MISSING
