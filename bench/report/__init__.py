"""Rendering a results document: the terminal table, report.md, results.json/csv,
the PNG plots (``render``), report.html (``html``, with ``htmldoc`` for what the
page reads from the document, ``svg`` for its charts, ``htmlbench`` for the
benchmark sections). Every renderer reads only the document, so a report rendered
again from a results file equals the one rendered at run time.
"""
from bench.report.render import (FIDELITY_HEADER, LEGEND, catalog, fidelity, incomplete_line,
                                 plot, render_folder, render_markdown, render_terminal,
                                 table_rows, write_report)

__all__ = ["FIDELITY_HEADER", "LEGEND", "catalog", "fidelity", "incomplete_line", "plot",
           "render_folder", "render_markdown", "render_terminal", "table_rows", "write_report"]
