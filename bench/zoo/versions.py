"""Versions as environments: run a zoo entry at the releases its bug lived in.

An entry's card names, as requirement strings, the versions where the bug lives
(``affected_versions``), where a fix removed it (``fixed_versions``) and, for a bug a
release introduced, versions from before it (``unaffected_versions``): ``"python>=3.8,<3.12"``,
``"python==3.12.1"``, ``"uvloop==0.22.1"``. ``points(entry)`` turns each string into the
runs it stands for:

- a ``python`` requirement runs on every interpreter found here (``bench.host.envs.found``)
  that satisfies it and that looplab supports, one point per exact version;
- a ``DIST==VERSION`` requirement pins that release (``+DIST==VERSION`` in the runtime
  spec) in an environment on looplab's own Python version;
- anything else (a library range, a version below looplab's minimum, a library no
  runtime here runs) is a point that is not run, with the reason.

Each point runs on the entry's ``version_runtimes`` or, by default, on every runtime of
its styles whose ``RuntimeInfo.library`` is the requirement's distribution (``python``:
asyncio's own runtimes). A point expects the naive program to show the bug where the
role is ``affected`` and not to show it elsewhere; the fixed program never. Cells run
on the real network (a version pin is a library's, which the simulated network cannot
carry for uvloop; the interpreter alone could be simulated, ``docs/axes.md``).
``summarize`` reads the results back, with the exact versions each cell measured in
its own interpreter (the cell's ``environment`` block).

This module also says, for the zoo page and ``repro --all``'s report, what framework
an entry is about and whether it ran on the real library or on a stand-in.
"""
from __future__ import annotations

import platform
import re
from dataclasses import dataclass, replace

from bench.host import envs
from bench.errors import UsageError
from bench import runtimes as rtmod

ROLES = ("affected", "fixed", "unaffected")
_OPS = ("==", ">=", "<=", "!=", ">", "<")


@dataclass(frozen=True)
class Point:
    """One version an entry runs at: its role, the card's requirement string, and
    either the interpreter and pins to run with or the reason it is not run."""
    role: str                   # "affected", "fixed" or "unaffected"
    requirement: str            # as the card writes it
    interpreter: str | None     # exact Python version, e.g. "3.12.1"
    pins: tuple = ()            # ("uvloop==0.22.1",)
    dist: str = "python"        # the distribution the requirement is about
    reason: str | None = None   # why it is not run (None: it is)

    @property
    def expect_shown(self) -> bool:
        return self.role == "affected"

    @property
    def label(self) -> str:
        if self.reason is not None:
            return self.requirement
        if self.pins and self.dist != "python":     # the card's release; the rest is its setting
            return self.pins[0].replace("==", " ") + f" (Python {self.interpreter})"
        return f"Python {self.interpreter}"


def _vt(text: str) -> tuple:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def parse_requirement(text: str) -> tuple[str, list[tuple[str, str]]]:
    """``"python>=3.8,<3.12"`` -> ("python", [(">=", "3.8"), ("<", "3.12")])."""
    m = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(.*)$", text)
    if not m:
        raise ValueError(f"not a requirement: {text!r}")
    name = re.sub(r"[-_.]+", "-", m.group(1)).lower()
    clauses = []
    for part in filter(None, (p.strip() for p in m.group(2).split(","))):
        op = next((o for o in _OPS if part.startswith(o)), None)
        if op is None or not part[len(op):].strip():
            raise ValueError(f"bad clause {part!r} in requirement {text!r}")
        clauses.append((op, part[len(op):].strip()))
    return name, clauses


def satisfies(version: str, clauses) -> bool:
    """Whether ``version`` meets every clause. ``==X.Y`` matches every X.Y.z (as
    ``==X.Y.*`` would); the other operators compare release tuples padded with 0."""
    have = _vt(version)
    for op, want in clauses:
        w = _vt(want)
        if op == "==":
            ok = have[:len(w)] == w
        elif op == "!=":
            ok = have[:len(w)] != w
        else:
            n = max(len(have), len(w))
            a, b = have + (0,) * (n - len(have)), w + (0,) * (n - len(w))
            ok = {">=": a >= b, "<=": a <= b, ">": a > b, "<": a < b}[op]
        if not ok:
            return False
    return True


def versions_of(e) -> list[tuple[str, str]]:
    """(role, requirement) for every version the card names."""
    return [(role, req) for role in ROLES for req in getattr(e, f"{role}_versions", ()) or ()]


def declares_versions(e) -> bool:
    return bool(versions_of(e))


def _library_runtimes(e, dist: str) -> list[str]:
    """The runtime ids of the entry's styles whose behaviour ``dist`` decides."""
    return [rid for rid in rtmod.ordered()
            if rtmod.get(rid).library == dist and rtmod.get(rid).style in e.styles]


def _runtimes_for(e, dist: str) -> list[str]:
    return list(getattr(e, "version_runtimes", ()) or ()) or _library_runtimes(e, dist)


def _bare_ok(e) -> bool:
    """Whether the entry ships a standalone program for interpreters below looplab's
    minimum (``Entry.program_file``)."""
    return bool(getattr(e, "program_file", ""))


def _with(e, req: str) -> tuple:
    """The exact releases a version run installs beside the pinned one: the card's
    ``version_with``, for every row (a tuple) or per requirement (a dict)."""
    extra = getattr(e, "version_with", ()) or ()
    if isinstance(extra, dict):
        extra = extra.get(req, ())
    return tuple(extra)


def _library_interpreter(e) -> tuple[str | None, str | None]:
    """(exact Python version, None) a library's version rows run on -- the entry's
    ``version_python`` found here, else looplab's own -- or (None, why not)."""
    want = getattr(e, "version_python", "") or ""
    if not want:
        return platform.python_version(), None
    try:
        it = envs.locate(want)
    except UsageError:
        return None, f"no Python {want} found here (the releases need it)"
    if envs.below_minimum(it) and not _bare_ok(e):
        return None, (f"Python {it.version} is below looplab's minimum (requires-python "
                      f"{envs._minimum()[0]}) and the entry ships no standalone program for it")
    return it.version, None


def points(e) -> list[Point]:
    """The runs the card's versions stand for, in card order (see the module doc)."""
    least_text, least = envs._minimum()
    out = []
    for role, req in versions_of(e):
        why = (getattr(e, "not_run", None) or {}).get(req)
        if why:
            out.append(Point(role, req, None, reason=why))
            continue
        try:
            dist, clauses = parse_requirement(req)
        except ValueError as exc:
            out.append(Point(role, req, None, reason=str(exc)))
            continue
        if not _runtimes_for(e, dist):
            out.append(Point(role, req, None, dist=dist, reason=(
                f"re-enactment only: the entry's program stands in for {dist}, and no "
                f"program of the real {dist} runs its releases here")))
            continue
        if dist == "python":
            found = envs.found()
            fits = [i for i in found if satisfies(i.version, clauses)]
            usable = [i for i in fits if _vt(i.version) >= least or _bare_ok(e)]
            if not usable:
                why = (f"Python {', '.join(i.version for i in fits)} is below looplab's minimum "
                       f"(requires-python {least_text}) and the entry ships no standalone "
                       "program for it" if fits else "no such Python found here")
                out.append(Point(role, req, None, reason=why))
            seen = set()
            for it in sorted(usable, key=lambda i: _vt(i.version)):
                if it.version not in seen:
                    seen.add(it.version)
                    out.append(Point(role, req, it.version, _with(e, req)))
            continue
        if len(clauses) != 1 or clauses[0][0] != "==" or "*" in clauses[0][1]:
            out.append(Point(role, req, None, dist=dist, reason=(
                "a range of releases: the card must name an exact one (DIST==VERSION) to run it")))
            continue
        python, why = _library_interpreter(e)
        if why:
            out.append(Point(role, req, None, dist=dist, reason=why))
            continue
        out.append(Point(role, req, python, (f"{dist}=={clauses[0][1]}",) + _with(e, req), dist))
    return out


def spec_for(e, point: Point, runtime: str) -> str:
    """The runtime spec of ``runtime`` at ``point``: ``ID@X.Y.Z[+DIST==V][:OPTIONS]``."""
    rt = rtmod.parse(runtime)
    # parsed again: the canonical spec (pins named as the grammar prints them), which is
    # what the cells carry
    return rtmod.parse(replace(rt, interpreter=point.interpreter, pins=tuple(sorted(point.pins))).spec).spec


def plan(e) -> list[tuple[Point, str | None]]:
    """(point, runtime spec) for every run of the entry; (point, None) for a point
    that is not run."""
    out = []
    for p in points(e):
        if p.reason is not None:
            out.append((p, None))
            continue
        for rid in _runtimes_for(e, p.dist):
            spec = spec_for(e, p, rid)
            if rtmod.parse(spec).style in e.styles:
                out.append((p, spec))
    return out


def build(planned) -> list[tuple[Point, str | None]]:
    """Build every environment the plan needs now (``bench.host.envs.ensure``); a run whose
    environment cannot be built (a release with no wheel for that Python, an index
    that is out of reach) becomes a point that is not run, with pip's reason."""
    out = []
    for p, spec in planned:
        if spec is not None:
            try:
                envs.ensure(rtmod.parse(spec))
            except UsageError as exc:
                out.append((replace(p, reason=str(exc)), None))
                continue
        out.append((p, spec))
    return out


# ---------------------------------------------------------------------------
# Reading the results back

def cell_word(cell) -> str:
    """One zoo cell's outcome in a word: shown, not shown, not measured (below its
    evidence minimum), error, skipped, or n/a (no cell)."""
    if cell is None:
        return "n/a"
    if cell.get("skipped"):
        return "skipped"
    if "bug_shown" not in (cell.get("verdicts") or {}):
        return "error"
    shown = cell["verdicts"]["bug_shown"]     # None: below the entry's evidence minimum
    return "not measured" if shown is None else "shown" if shown else "not shown"


def measured_versions(cell, point: Point) -> str:
    """The exact versions the cell measured in its own interpreter: Python and the
    pinned (or the runtime's own) distribution."""
    env = (cell or {}).get("environment") or {}
    py = (env.get("interpreter") or {}).get("version")
    libs = env.get("libraries") or {}
    parts = [f"Python {py}"] if py else []
    for pin in point.pins:
        dist = pin.partition("==")[0]
        have = next((v for k, v in libs.items() if re.sub(r"[-_.]+", "-", k).lower() == dist), None)
        parts.append(f"{dist} {have or 'not imported'}")
    return ", ".join(parts) or "not recorded"


def summarize(e, planned, cells) -> dict:
    """The entry's version runs: one row per (point, runtime), its words, what was
    expected, whether they agree, and the exact versions measured; ``shown_pair``
    says whether the bug showed at an affected version and at no other."""
    by = {}
    for c in cells:
        if c["scenario"] == e.id:
            by.setdefault(c["runtime"], {})[c["variant"]] = c
    rows = []
    for p, spec in planned:
        if spec is None:
            rows.append({"role": p.role, "requirement": p.requirement, "runtime": None,
                         "label": p.label, "naive": "not run", "fixed": "not run",
                         "expected": None, "agrees": None, "versions": None, "reason": p.reason})
            continue
        v = by.get(spec, {})
        naive = cell_word(v.get("naive"))
        # an entry whose fix is the release runs only its naive program at a version
        with_fixed = "fixed" in (getattr(e, "version_variants", None) or ("naive", "fixed"))
        fixed = cell_word(v.get("fixed")) if with_fixed else "-"
        expected = "shown" if p.expect_shown else "not shown"
        ran = naive in ("shown", "not shown") and (fixed in ("shown", "not shown")
                                                   or not with_fixed)
        rows.append({"role": p.role, "requirement": p.requirement, "runtime": spec,
                     "label": p.label, "naive": naive, "fixed": fixed, "expected": expected,
                     "agrees": (naive == expected and fixed in ("not shown", "-")) if ran else None,
                     "versions": measured_versions(v.get("naive") or v.get("fixed"), p),
                     "reason": (v.get("naive") or {}).get("skipped")})
    shown = [r for r in rows if r["role"] == "affected" and r["naive"] == "shown"]
    clean = [r for r in rows if r["role"] != "affected" and r["naive"] == "not shown"]
    return {"id": e.id, "rows": rows,
            "shown_pair": bool(shown and clean and all(r["agrees"] is not False for r in rows))}


def table_rows(summaries) -> list[list[str]]:
    out = []
    for s in summaries:
        for r in s["rows"]:
            agree = {True: "yes", False: "NO", None: "-"}[r["agrees"]]
            out.append([s["id"], r["role"], r["requirement"], r["runtime"] or "-",
                        r["versions"] or (r["reason"] or "-"), r["naive"], r["fixed"],
                        r["expected"] or "-", agree])
    return out


HEADER = ["bug", "role", "card says", "runtime", "measured versions", "naive", "fixed",
          "expected (naive)", "as expected"]


def verdict_line(s: dict) -> str:
    ran = [r for r in s["rows"] if r["runtime"]]
    shown = sorted({r["label"] for r in ran if r["naive"] == "shown"})
    clean = sorted({r["label"] for r in ran if r["naive"] == "not shown"})
    off = [r for r in ran if r["agrees"] is False]
    text = (f"shown at: {', '.join(shown) or 'none'}; not shown at: {', '.join(clean) or 'none'}")
    if off:
        text += "; not as the card expects: " + ", ".join(f"{r['runtime']} ({r['role']})" for r in off)
    skipped = [r for r in s["rows"] if not r["runtime"]]
    if skipped:
        text += "; not run: " + "; ".join(f"{r['requirement']} ({r['reason']})" for r in skipped)
    return text


# ---------------------------------------------------------------------------
# The zoo page's columns

def framework_of(e) -> str:
    """The framework or library (other than Python and the loops) the entry's bug lived
    in, from its card: a declared ``framework``, else the distributions its versions
    name that no runtime here is; "" when the bug is in Python or a loop."""
    declared = getattr(e, "framework", "")
    if declared:
        return declared
    loops = {info.library for info in rtmod.RUNTIMES.values()} | {"python", "asyncio"}
    names = []
    for _, req in versions_of(e):
        try:
            dist = parse_requirement(req)[0]
        except ValueError:
            continue
        if dist not in loops and dist not in names:
            names.append(dist)
    return ", ".join(names)


def versions_cell(e) -> str:
    """The card's versions, short: "affected X; fixed Y"."""
    parts = []
    for role in ROLES:
        reqs = getattr(e, f"{role}_versions", ()) or ()
        if reqs:
            parts.append(f"{role} {', '.join(reqs)}")
    return "; ".join(parts) or "-"


def runs_on_cell(e, version_summary: dict | None = None) -> str:
    """What runs the bug, for the zoo page and the verdict lines: the installed library
    ("real"), our program in place of a framework's ("re-enactment"), or one of our
    kernels' options ("knob"); with "; real at pinned releases" where a version run
    measured the real interpreter or release (whatever it showed)."""
    kind = getattr(e, "kind", lambda: "knob" if e.stand_in else "real")()
    word = {"real": "real (installed)", "re-enactment": "re-enactment", "knob": "knob"}[kind]
    if kind == "knob":
        word = f"knob: {e.stand_in}"
    ran = version_summary is not None and any(
        r["runtime"] and r["naive"] in ("shown", "not shown") for r in version_summary["rows"])
    return word + ("; real at pinned releases" if ran else "")
