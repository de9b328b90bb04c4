"""What a zoo entry is, the table of entries, and the installed-version check.

The entry modules (``bench.zoo.buffers``, ``.shutdown``, ``.drain``, ``.tls``,
``.cancel``) declare their entries with ``_add``; ``bench.zoo`` makes them scenarios, in its fixed order.
"""
from __future__ import annotations

import importlib.metadata
import platform
import re
from dataclasses import dataclass, field

from bench.scenarios.api import Scenario
from bench import runtimes

VERDICT = {"bug_shown": "the measurements show the bug's symptom (see the entry's oracle)"}


# ---------------------------------------------------------------------------
# What an entry carries besides its scenario

@dataclass(frozen=True)
class Flip:
    """A design option of one of our kernels that turns the mechanism on or off.
    ``shows``: whether the bug is expected to show on the naive program with it."""
    spec: str
    shows: bool
    meaning: str


@dataclass
class Entry:
    id: str
    title: str
    link: str
    mechanism: str                 # two sentences
    reported: str                  # versions it was reported against
    fixed_in: str                  # versions that fixed it (or "not a library bug: ...")
    expected: str                  # what to expect where
    oracle: str                    # what "bug shown" means, in measurements
    styles: tuple
    scenario: Scenario = None
    aliases: tuple = ()
    catalog: str = ""              # the scenario it relates to (S1..S8), if any
    flips: tuple = ()
    needs: str = ""                # an option our kernels lack to show an uninstalled version
    framing: str = ""              # how the original (HTTP, TLS, ...) was reduced
    affects: dict = field(default_factory=dict)   # library -> (first affected, first fixed|None)
    show_on: tuple = ()            # runtimes where the tests expect naive=shown, fixed=not
    not_on: tuple = ()             # runtimes where the naive program is measured not to show it
    real_only: str = ""            # why it cannot run on the simulated network ("": it can)
    # How the card was checked against its thread: what was read, what was run.
    verified: str = ""
    # Requirement strings ("uvloop==0.22.1", "python>=3.8,<3.12"): where the bug
    # lives, where a fix removed it, and (for a bug a release introduced) where it
    # was not yet. ``looplab repro ID --versions`` runs each in its own environment
    # (bench.zoo.versions): a python range on every interpreter found in it, a
    # DIST==VERSION pinned on looplab's own Python version.
    affected_versions: tuple = ()
    fixed_versions: tuple = ()
    unaffected_versions: tuple = ()
    # The runtimes a version run uses (default: those of the entry's styles whose
    # RuntimeInfo.library is the requirement's distribution). An entry whose program
    # imports a framework (aiohttp) names the runtimes it runs that program on.
    version_runtimes: tuple = ()
    # Exact releases every version run of the entry also installs: what its program
    # needs beside the pinned library ("starlette==1.10.0" for a uvicorn entry's app);
    # a dict gives them per requirement string (an old release's own dependencies).
    version_with: tuple | dict = ()
    # The Python a library's version rows run on ("3.6"; default: looplab's own).
    version_python: str = ""
    # The run of a version row (a cell whose runtime pins releases, or runs below
    # looplab's minimum): the real framework at that release (bench.zoo.releases),
    # where the entry's own programs re-enact the bug. None: the entry's own run.
    version_run: object = None
    # The standalone program (a file in bench/zoo/programs) a version row runs on an
    # interpreter below looplab's minimum (Scenario.program_file).
    program_file: str = ""
    # Requirement -> why the card's version is not run here, where the card knows better
    # than the planner (a release for a Python this machine cannot have).
    not_run: dict = field(default_factory=dict)
    # The variants a version row runs: ("naive",) where the fix is the release itself
    # (the same program at the affected and at the fixed release).
    version_variants: tuple = ("naive", "fixed")
    # What plays the buggy version here: "" when the entry shows on a real library
    # or interpreter installed here (or the bug is the program's own), otherwise
    # the option of our kernel that stands in for it.
    stand_in: str = ""
    # The least activity the oracle needs: (metric, at least, in words) triples.
    # Below it the verdict is not measured (the oracle also returns None itself).
    minimum: tuple = ()
    # Declared properties beyond bug_shown (bench.scenarios.properties), checked by looplab explore.
    properties: tuple = ()
    # The runtimes the card names -> whether the naive program shows the bug there
    # (bench.zoo.expected): what ``looplab repro ID`` runs by default and checks.
    expect: dict = field(default_factory=dict)

    def kind(self) -> str:
        """"real" (the bug is measured on the library or interpreter installed here),
        "re-enactment" (our program plays a framework's code) or "knob" (an option of
        our kernels plays a release that is not installed)."""
        if not self.stand_in:
            return "real"
        head = self.stand_in.split(":", 1)[0].split(",", 1)[0].strip()
        return "knob" if head in runtimes.RUNTIMES else "re-enactment"

    def runs_on(self) -> str:
        """Where the bug is measured: the real library here, our re-enactment of a
        framework's code, or a knob of our kernels; and, where the card names versions,
        that ``--versions`` runs the real ones (bench.zoo.versions)."""
        head = {"real": "real: the installed runtimes", "re-enactment": f"re-enactment: {self.stand_in}",
                "knob": f"knob: {self.stand_in}"}[self.kind()]
        if self.version_run is not None:
            return head + "; --versions runs the real releases the card names"
        return head + ("; --versions runs the versions it names" if self._real_versions() else "")

    def _real_versions(self) -> bool:
        """Whether a version the card names is of Python or of a runtime's library
        (what ``--versions`` can install), found here or not."""
        libs = {"python"} | {info.library for info in runtimes.RUNTIMES.values() if info.library}
        reqs = self.affected_versions + self.fixed_versions + self.unaffected_versions
        return any(re.split(r"[<>=!~ ]", r, maxsplit=1)[0].lower() in libs for r in reqs)

    def card_fields(self) -> list[tuple[str, str]]:
        """The card lines that say how far to trust the entry: (label, text) pairs for
        where it runs, the versions a pinned run would install, and how it was checked
        against its thread (for ``looplab repro ID`` and the zoo page). The versions
        are what ``looplab repro ID --versions`` runs at."""
        out = [("runs on", self.runs_on())]
        if self.affected_versions:
            out.append(("affected", ", ".join(self.affected_versions)))
        if self.fixed_versions:
            out.append(("fixed", ", ".join(self.fixed_versions)))
        if self.unaffected_versions:
            out.append(("unaffected", ", ".join(self.unaffected_versions)))
        out.append(("verified", self.verified))
        return out

    # The evidence bug_shown needs (bench.scenarios.api.Scenario.judge): the metrics that decide
    # it (each must be measured).
    decided_by: tuple = ()

    def expected_on(self, spec: str) -> bool | None:
        """Whether the card expects the naive program to show the bug on runtime
        ``spec`` (a named runtime, or one of the entry's flips), or None when the card
        says nothing about it."""
        flip = next((f for f in self.flips if f.spec == spec), None)
        if flip is not None:
            return flip.shows
        return self.expect.get(spec)

    def names(self) -> tuple:
        return (self.id,) + tuple(self.aliases)

    def sim_skip(self) -> str | None:
        """The reason a ``--net sim`` cell of this entry is skipped, or None."""
        return f"{self.id} runs only on the real network: {self.real_only}" if self.real_only else None


ENTRIES: dict[str, Entry] = {}
_ALIASES: dict[str, str] = {}
_DECLARED: dict[str, tuple] = {}    # id -> (entry, run, metrics, presets, programs), not yet registered


def _add(e: Entry, run, metrics, presets, programs_=None) -> Entry:
    """Declare an entry; ``register_in_order`` makes it a scenario (the entry modules
    are grouped by theme, the table keeps one order of its own)."""
    _DECLARED[e.id] = (e, run, metrics, presets, programs_)
    return e


def register_in_order(order) -> None:
    """Make every declared entry a scenario, in ``order`` (which must name each declared
    entry exactly once). Nothing is registered with the scenario registry here: the
    package's ``SCENARIOS`` are, when ``bench.zoo`` is loaded as a scenario module."""
    if sorted(order) != sorted(_DECLARED) or len(set(order)) != len(order):
        raise RuntimeError(f"zoo order {list(order)} does not match the declared entries "
                           f"{sorted(_DECLARED)}")
    from bench.zoo.expected import EXPECT
    for eid in order:
        e, run, metrics, presets, programs_ = _DECLARED.pop(eid)
        e.expect = dict(EXPECT.get(eid, {}))
        e.scenario = Scenario(
            id=e.id, title=e.title, run=_at_versions(e, _noted_on_sim(e, run)), summary=e.mechanism,
            variants=("naive", "fixed"),
            presets=presets, programs=programs_ or {}, styles=e.styles, verdicts=VERDICT,
            metrics=tuple(metrics), symptoms=tuple(VERDICT),
            decided_by={"bug_shown": e.decided_by} if e.decided_by else {},
            properties=e.properties, program_file=_program_file(e), **_evidence(e))
        e.scenario.origin = "bench.zoo"
        ENTRIES[e.id] = e
        for name in e.names():
            _ALIASES[name.lower()] = e.id


def _program_file(e: Entry) -> str:
    if not e.program_file:
        return ""
    from bench.zoo.releases import program_path
    return program_path(e.program_file)


def _at_versions(e: Entry, run):
    """A cell at a pinned release (its runtime pins one, or runs below looplab's
    minimum) runs the entry's ``version_run``: the real framework at that release."""
    if e.version_run is None:
        return run

    def dispatched(ctx):
        from bench.host import envs
        if ctx.runtime.pins or envs.is_bare(ctx.runtime):
            return e.version_run(ctx)
        return run(ctx)
    return dispatched


def _evidence(e: Entry) -> dict:
    """The entry's minimum as the scenario's, where scenarios declare one (the
    evidence rule: a cell below it is "not measured")."""
    if not e.minimum:
        return {}
    from bench.scenarios.api import Minimum
    return {"minimum": tuple(m if isinstance(m, Minimum) else Minimum(*m) for m in e.minimum)}


def _noted_on_sim(e: Entry, run):
    """``looplab repro --net sim`` skips an entry that only runs on the real network;
    ``looplab run --net sim`` (which knows nothing of the zoo) runs it, and this
    note says why its numbers are not a function of the universe there."""
    if not e.real_only:
        return run

    def noted(ctx):
        metrics, verdicts, notes = run(ctx)
        if ctx.sim is not None:
            notes = list(notes) + [f"measured in the simulated world's process, but not part of its "
                                   f"universe: {e.real_only} (looplab repro skips it under --net sim)"]
        return metrics, verdicts, notes
    return noted


def entry(name: str) -> Entry | None:
    """The entry called ``name`` (its id or an alias, any case), or None."""
    return ENTRIES.get(_ALIASES.get(name.strip().lower(), ""))


# ---------------------------------------------------------------------------
# Versions: what is installed, and whether it falls in an entry's affected range

def lib_of(runtime_id: str) -> str | None:
    """The library whose version decides a runtime's behaviour (``RuntimeInfo.library``:
    a distribution name, or "python" for the standard library), or None."""
    info = runtimes.RUNTIMES.get(runtime_id)
    return None if info is None else info.library


def installed_versions() -> dict:
    """"python" and every library a registered runtime declares -> installed version."""
    out = {"python": platform.python_version()}
    for info in runtimes.RUNTIMES.values():
        lib = info.library
        if lib and lib not in out:
            try:
                out[lib] = importlib.metadata.version(lib)
            except importlib.metadata.PackageNotFoundError:
                out[lib] = None
    return out


def _vt(text: str) -> tuple:
    return tuple(int(p) for p in text.split(".") if p.isdigit())


def affected_note(e: Entry, versions: dict | None = None) -> list[str]:
    """One line per library the entry names: installed version, range, verdict."""
    versions = versions or installed_versions()
    out = []
    for lib, (first, fixed) in e.affects.items():
        have = versions.get(lib)
        rng = f"{first} up to {'before ' + fixed if fixed else 'today (not fixed)'}"
        if have is None:
            out.append(f"{lib}: not installed (affected: {rng})")
            continue
        inside = _vt(have) >= _vt(first) and (fixed is None or _vt(have) < _vt(fixed))
        out.append(f"{lib} {have} installed: {'inside' if inside else 'outside'} the affected "
                   f"range ({rng})")
    return out

