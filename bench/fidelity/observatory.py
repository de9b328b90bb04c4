"""The loop-conformance observatory: asyncio loops x interpreters, each cell compared
with CPython's asyncio on the same interpreter (``looplab fidelity --runtimes
asyncio-streams@3.12:loop=rloop,...``; docs/observatory.md).

``grid`` turns the measured cells into what the report shows: one row per cell
(style, loop and its version, Python), the divergences, the probes whose CPython
observation changed between interpreters, and each probe's class: **documented**
(the asyncio docs promise it; ``EdgeProbe.documented`` links the section),
**de-facto** (CPython does it, no promise) or **divergent** (a loop differs from
CPython on the same interpreter). ``reproduction`` writes a standalone script of at
most ``REPRO_MAX_LINES`` lines for one probe on one loop, needing only the loop's
package: the probe's own source (the ``lp_`` probes are self-contained), a loop
factory and a print.
"""
from __future__ import annotations

import ast
import inspect
import json
import sys
import textwrap

from bench.errors import UsageError
from bench.fidelity import upstream
from bench.fidelity.classes import classify, promise_text
from bench.results.tables import format_table
from bench import runtimes as rtmod

__all__ = ["grid", "add_grid", "markdown_grid", "html_page", "reproduction", "repro_probe", "REPRO_MAX_LINES"]

REPRO_MAX_LINES = 60
#: the standard library modules a loop probe may use (imported by its reproduction)
_STDLIB = ("concurrent.futures", "contextvars", "gc", "logging", "os", "re", "signal", "socket",
           "ssl", "subprocess", "sys", "tempfile", "threading", "time", "warnings", "weakref")


def _probes():
    from bench.fidelity.measure import _probes as p
    return p()


def _compact(obs) -> str:
    return json.dumps(obs, sort_keys=True, separators=(",", ":"))


def _vkey(v):
    return tuple(int(x) for x in str(v).split(".")[:3] if x.isdigit())


def grid(results: dict, rows: list, names, meta: dict) -> dict:
    """What the report shows of the loops x interpreters grid (empty ``cells`` when no
    asyncio cell ran)."""
    from bench.fidelity.measure import _diff, comparable, grid_reference
    probes = _probes()
    cells = []
    for key in results:
        rt = rtmod.parse(key)
        ref = grid_reference(rt)
        if ref is None and "loop" not in rt.info.options.names():
            continue
        m = meta.get(key, {})
        mine = [r for r in rows if r.get("kind") == "loop" and r["ours"] == key
                and r["verdict"] != "n/a"]
        loop = m.get("loop") or {"name": rt.loop, "version": None}
        cells.append({"spec": key, "style": rt.style, "loop": loop.get("name"),
                      "loop_version": loop.get("version"), "python": m.get("python"),
                      "reference": ref, "compared": len(mine),
                      "agree": sum(r["verdict"] == "agree" for r in mine),
                      "divergent": sum(r["verdict"] == "divergent" for r in mine),
                      "error": sum(r["verdict"] == "error" for r in mine)})
    cells.sort(key=lambda c: (c["style"], c["loop"] != "asyncio", c["loop"] or "",
                              _vkey(c["python"] or "")))
    by_spec = {c["spec"]: c for c in cells}
    divergences = []
    for r in rows:
        if r.get("kind") != "loop" or r["verdict"] not in ("divergent", "error"):
            continue
        c = by_spec[r["ours"]]
        a, b = r["ref_rec"] or {}, r["ours_rec"] or {}
        if "obs" in a and "obs" in b:
            da, db = (_compact(x) for x in _diff(a["obs"], b["obs"]))
        else:
            da = _compact(a["obs"]) if "obs" in a else f"error: {a.get('error')}"
            db = _compact(b["obs"]) if "obs" in b else f"error: {b.get('error')}"
        twin = repro_probe(r["probe"], quiet=True)
        cls, quote = classify(probes[r["probe"]], c["python"])
        divergences.append({"probe": r["probe"], "spec": r["ours"], "reference": r["reference"],
                            "verdict": r["verdict"], "loop": c["loop"],
                            "loop_version": c["loop_version"], "python": c["python"],
                            "class": cls, "promise": quote,
                            "upstream": upstream.line(r["probe"], c["loop"]),
                            "asyncio": da, "loop_shows": db, "repro": twin})
    # CPython's own asyncio across interpreters
    changed = []
    bases = [c for c in cells if c["loop"] == "asyncio" and c["reference"] is None]
    for style in sorted({c["style"] for c in bases}):
        same = [c for c in bases if c["style"] == style and c["python"]]
        if len({c["python"] for c in same}) < 2:
            continue
        for n in names:
            if probes[n].style != style:
                continue
            seen = {c["python"]: (results[c["spec"]].get(n) or {}).get("obs") for c in same}
            if len({_compact(comparable(v)) for v in seen.values()}) > 1:
                changed.append({"probe": n, "style": style,
                                "class": "documented" if probes[n].documented else "de-facto",
                                "by_python": {v: _compact(o) for v, o in
                                              sorted(seen.items(), key=lambda kv: _vkey(kv[0]))}})
    styles = {c["style"] for c in cells}
    divergent = {d["probe"] for d in divergences if d["verdict"] == "divergent"}
    classes = {n: ("divergent" if n in divergent else
                   "documented" if probes[n].documented else "de-facto")
               for n in names if probes[n].style in styles}
    counts = {k: sum(v == k for v in classes.values()) for k in ("documented", "de-facto", "divergent")}
    # of the divergent probes, those that break a quoted promise on some cell
    counts["divergent_documented"] = len({d["probe"] for d in divergences
                                          if d["verdict"] == "divergent" and d["class"] == "documented"})
    return {"cells": cells, "divergences": divergences, "changed": changed,
            "classes": classes, "class_counts": counts}


def add_grid(results: dict, rows: list, names, block: dict) -> dict:
    """Put the grid into the report block (``block["grid"]``) when an asyncio cell ran."""
    g = grid(results, rows, names, block.get("workers") or {})
    if g["cells"]:
        block["grid"] = g
    return block


def _md(text) -> str:
    return str(text).replace("|", "\\|")


def _cell_text(c) -> str:
    if c["reference"] is None:
        return "reference"
    if not c["compared"]:
        return "-"
    return f"{c['agree']}/{c['compared']} agree, {c['divergent']} divergent, {c['error']} errors"


def markdown_grid(g: dict, level: str = "##") -> str:
    """The observatory section: the grid, the divergences, the interpreter changes and
    the probes' classes."""
    pythons = sorted({c["python"] or "?" for c in g["cells"]}, key=_vkey)
    lines = [f"{level} The observatory: asyncio loops x interpreters", "",
             "Each loop runs the probes of its style in the cell's own interpreter and is "
             "compared with CPython's asyncio on the same interpreter. Rows: style, then loop, "
             "then interpreter.", ""]
    rows = {}
    for c in g["cells"]:
        rows.setdefault((c["style"], c["loop"], c["loop_version"]), {})[c["python"] or "?"] = c
    body = [[style, f"{loop} {ver or ''}".strip(), *(_cell_text(cs[p]) if p in cs else ""
                                                     for p in pythons)]
            for (style, loop, ver), cs in rows.items()]
    lines += [format_table(["style", "loop", *[f"Python {p}" for p in pythons]], body,
                           markdown=True, align="ll" + "l" * len(pythons)), ""]
    cc = g["class_counts"]
    total = cc["documented"] + cc["de-facto"] + cc["divergent"]
    lines += [f"Probes on the grid: {total} -- {cc['documented']} documented (a quoted sentence "
              f"of the asyncio docs promises it) and {cc['de-facto']} de-facto (CPython does it, "
              f"no promise) that agree everywhere, and {cc['divergent']} divergent on at least one "
              f"loop ({cc.get('divergent_documented', 0)} of them break a quoted promise).", ""]
    if g["divergences"]:
        lines += [f"{level}# Divergences", "",
                  "Against CPython's asyncio on the same interpreter, one row per probe and "
                  "loop (the interpreters where it shows the same thing). `promise`: the "
                  "sentence of the asyncio docs of that interpreter the loop breaks, or "
                  "de-facto. `upstream`: the issue threads read (`bench/fidelity/threads.json`). "
                  "`repro`: the probe whose standalone script `looplab fidelity --repro PROBE "
                  "--runtime SPEC` writes.", ""]
        grouped: dict = {}
        for d in g["divergences"]:
            key = (d["probe"], d["loop"], d["loop_version"], d["asyncio"], d["loop_shows"])
            grouped.setdefault(key, []).append(d)
        body = []
        for (probe, loop, ver, ref, got), ds in grouped.items():
            quotes = []
            for x in ds:
                text = promise_text(x.get("promise"))
                if text not in quotes:
                    quotes.append(text)
            body.append([probe, f"{loop} {ver or ''}".strip(),
                         ", ".join(sorted({x["python"] or "?" for x in ds}, key=_vkey)),
                         _md(ref), _md(got), _md("; ".join(quotes)),
                         ds[0].get("upstream") or "not searched", ds[0]["repro"] or "-"])
        lines += [format_table(["probe", "loop", "on Python", "asyncio", "loop shows", "promise",
                                "upstream", "repro"], body, markdown=True, align="llllllll"), ""]
    if g["changed"]:
        pys = sorted({p for ch in g["changed"] for p in ch["by_python"]}, key=_vkey)
        lines += [f"{level}# Changed between interpreters (CPython's asyncio)", "",
                  format_table(["probe", *pys], [[ch["probe"], *(_md(ch["by_python"].get(p, "-"))
                                                                for p in pys)]
                                                 for ch in g["changed"]],
                               markdown=True, align="l" * (1 + len(pys))), ""]
    return "\n".join(lines)


def html_page(title: str, markdown_text: str) -> str:
    """A self-contained HTML page of the fidelity Markdown (headings, pipe tables,
    paragraphs): the same content as fidelity.md, for a browser."""
    import html as h
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>{h.escape(title)}</title>"
           "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;"
           "font-size:13px}td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}"
           "code{font-size:12px}</style></head><body>"]
    lines = markdown_text.splitlines()
    i = 0
    while i < len(lines):
        ln = lines[i]
        if ln.startswith("#"):
            lvl = len(ln) - len(ln.lstrip("#"))
            out.append(f"<h{lvl}>{h.escape(ln.lstrip('#').strip())}</h{lvl}>")
        elif ln.startswith("|"):
            block = []
            while i < len(lines) and lines[i].startswith("|"):
                block.append(lines[i])
                i += 1
            cells = [[c.strip().replace("\\|", "|") for c in
                      _split_row(r)] for r in block if not set(r) <= set("|-: ")]
            out.append("<table><thead><tr>" + "".join(f"<th>{h.escape(c)}</th>" for c in cells[0])
                       + "</tr></thead><tbody>" + "".join(
                           "<tr>" + "".join(f"<td>{h.escape(c)}</td>" for c in r) + "</tr>"
                           for r in cells[1:]) + "</tbody></table>")
            continue
        elif ln.strip():
            out.append(f"<p>{h.escape(ln)}</p>")
        i += 1
    out.append("</body></html>")
    return "\n".join(out)


def _split_row(row: str) -> list:
    parts, cur, esc = [], "", False
    for ch in row.strip().strip("|"):
        if ch == "|" and not esc:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
        esc = ch == "\\"
    return parts + [cur]


# ---------------------------------------------------------------------------
# Standalone reproductions

def repro_probe(name: str, quiet: bool = False) -> str | None:
    """The self-contained probe that reproduces ``name``: itself for an ``lp_`` probe
    (from ``bench.fidelity.loops`` and ``.loopstate``), else the loop probe that names it in ``twin_of``."""
    probes = _probes()
    p = probes.get(name)
    if p is None:
        if quiet:
            return None
        raise UsageError(f"no probe named {name!r}; see looplab fidelity --probes")
    if p.standalone:
        return name
    twin = next((q.name for q in probes.values() if name in q.twin_of), None)
    if twin is None and not quiet:
        raise UsageError(f"probe {name} is written with looplab's probe helpers and has no "
                         "standalone form; the loop probes (lp_*) have one")
    return twin


def runtime_for(probe_name: str, spec: str) -> str:
    """The canonical spec that runs ``probe_name`` on the loop, interpreter and loop
    keywords of ``spec``: an asyncio runtime of the probe's style (a loop probe is
    stream-style, so ``asyncio-protocol:loop=uvloop`` runs it as ``uvloop-streams``)."""
    rt = rtmod.parse(spec)
    style = _probes()[probe_name].style
    if rt.style == style:
        return rt.spec
    if rt.loop is None:
        raise UsageError(f"runtime {rt.spec} runs no asyncio loop, so it cannot run "
                         f"{probe_name}; give an asyncio runtime, e.g. asyncio-streams:loop=uvloop")
    twin = next((i.id for i in rtmod.RUNTIMES.values() if i.style == style and i.variant_of is None
                 and "loop" in i.options.names()), None)
    if twin is None:
        raise UsageError(f"no {style}-style asyncio runtime is registered to run {probe_name}")
    opts = [f"loop={rt.loop}"] + [f"loop.{k}={v}" for k, v in sorted(rt.loop_options.items())]
    at = f"@{rt.interpreter}" if rt.interpreter else ""
    return rtmod.parse(f"{twin}{at}:{','.join(opts)}").spec


def _source(fn) -> str:
    src = textwrap.dedent(inspect.getsource(fn))
    tree = ast.parse(src)
    node = tree.body[0]
    start = node.lineno - 1 + len(node.decorator_list) * 0
    lines = src.splitlines()
    # drop the decorator and the docstring (the header says what the probe checks)
    first = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith(("def ", "async def ")))
    body = lines[first:]
    doc = ast.get_docstring(node, clean=False)
    if doc is not None:
        d = node.body[0]
        body = lines[first:d.lineno - 1] + lines[d.end_lineno:]
    del start
    return "\n".join(body)


def _names_used(fn) -> set:
    out, todo = set(), [fn.__code__]
    while todo:
        code = todo.pop()
        out |= set(code.co_names)
        todo += [c for c in code.co_consts if inspect.iscode(c)]
    return out


def _loop_lines(spec: str) -> tuple[list, str]:
    """(import lines, loop factory expression) for the loop ``spec`` runs on."""
    from protocols.asyncio_ports import LOOPS
    rt = rtmod.parse(spec)
    name = rt.loop
    target = LOOPS.get(name, name)
    module, _, attr = target.partition(":")
    kw = ", ".join(f"{k}={v!r}" for k, v in sorted(rt.loop_options.items()))
    if name == "asyncio" and not kw:
        return [], "asyncio.new_event_loop"
    imports = [] if module == "asyncio" else [f"import {module}"]
    factory = f"{module}.{attr}"
    return imports, (f"lambda: {factory}({kw})" if kw else factory)


def reproduction(name: str, spec: str, expected=None, observed=None, versions: dict | None = None) -> str:
    """A standalone script (at most ``REPRO_MAX_LINES`` lines) that runs probe ``name``
    on the loop of runtime ``spec`` and prints what it observes. ``expected``: CPython
    asyncio's observation on the same interpreter; ``observed``: the loop's; both go in
    the header with ``versions`` ({"python", "loop", "loop_version"})."""
    target = repro_probe(name)
    p = _probes()[target]
    used, helpers, todo = _names_used(p.fn), [], [p.fn]
    while todo:         # the helpers it calls, and theirs (each in its own module), once
        fn = todo.pop()
        for n in sorted(_names_used(fn)):
            hf = fn.__globals__.get(n)
            if n.startswith("_") and inspect.isfunction(hf) and hf not in helpers:
                helpers.append(hf)
                todo.append(hf)
                used |= _names_used(hf)
    helpers.sort(key=lambda f: f.__name__)
    stdlib = [m for m in _STDLIB if m.split(".")[0] in used]
    imports, factory = _loop_lines(spec)
    v = versions or {}
    on = f"{v.get('loop') or rtmod.parse(spec).loop} {v.get('loop_version') or ''}".strip()
    py = v.get("python") or ".".join(map(str, sys.version_info[:3]))
    what = " ".join((inspect.getdoc(p.fn) or p.doc).split("\n\n")[0].split())
    head = [f'"""{target}: {what}']
    if expected is not None:
        head.append(f"CPython {py} asyncio: {_compact(expected)}")
    if observed is not None:
        head.append(f"{on} on {py}: {_compact(observed)}")
    cls, quote = classify(p, py)
    head.append(f"asyncio docs {quote['docs']} ({quote['page']}): \"{quote['text']}\""
                if quote else "de-facto: no sentence of the asyncio docs promises this")
    head.append(f"upstream: {upstream.line(target, v.get('loop') or rtmod.parse(spec).loop)}")
    head = [head[0]] + [h.replace('"""', "'''") for h in head[1:]]   # keep the docstring whole
    head[-1] += '"""'
    parts = head + ["import asyncio"] + [f"import {m}" for m in stdlib] + imports
    for hf in helpers:
        parts += [_source(hf)]
    parts += [_source(p.fn),
              f"with asyncio.Runner(loop_factory={factory}) as runner:",
              f"    print(runner.run({target}(asyncio)))"]
    text = "\n".join(parts) + "\n"
    return text
