"""The planner: verbs and axes (scenarios x runtimes x variants x preset x network)
become cells.

A *cell* is one scenario x runtime x variant x preset (and, with ``--net``, network).
It is named by ids and a canonical runtime spec, so it can be written down, sharded
and replayed; it also carries the objects those names stand for -- the registered
``Scenario`` and the parsed ``Runtime`` -- looked up once, when it is planned, and
handed from there to the runner, the network and the scenario's ``run``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from bench import results
from bench.scenarios import api as scmod
from bench.errors import UsageError
from bench import runtimes as rtmod

__all__ = ["Cell", "plan", "split", "with_net", "check_cell", "why_empty"]


@dataclass
class Cell:
    scenario: str
    runtime: str          # canonical runtime spec
    variant: str
    preset: str
    params: dict = field(default_factory=dict)
    repeats: int = 1
    world: dict | None = None   # --net sim: the simulated world's seed, params, faults
    # The objects behind the names, found once (``sc``, ``rt``); not part of the
    # cell's identity.
    _sc: scmod.Scenario | None = field(default=None, repr=False, compare=False)
    _rt: rtmod.Runtime | None = field(default=None, repr=False, compare=False)

    @property
    def id(self) -> str:
        net = self.params.get("net", "real")     # --net sim|both: the network is part of the id
        return results.cell_id(self.scenario, self.runtime, self.variant, self.preset,
                               "" if net == "real" else net)

    @property
    def net(self) -> str:
        return self.params.get("net", "real")

    @property
    def sc(self) -> scmod.Scenario:
        """The registered scenario (UsageError if none has this id)."""
        if self._sc is None:
            self._sc = scmod.get(self.scenario)
        return self._sc

    @property
    def rt(self) -> rtmod.Runtime:
        """The parsed runtime spec."""
        if self._rt is None:
            self._rt = rtmod.parse(self.runtime)
        return self._rt


def with_net(cell: Cell, net: str) -> Cell:
    """``cell`` on another network (the objects it carries go with it)."""
    return Cell(cell.scenario, cell.runtime, cell.variant, cell.preset,
                {**cell.params, "net": net}, cell.repeats, world=cell.world,
                _sc=cell._sc, _rt=cell._rt)


def check_cell(cell: Cell) -> Cell:
    """A cell read from a file (a replayed universe): its scenario, runtime, preset
    and variant exist, and its params have the types its preset's have. A problem
    is a one-line UsageError."""
    sc, _ = cell.sc, cell.rt            # UsageError naming the valid ones
    if cell.preset not in sc.presets:
        raise UsageError(f"scenario {sc.id} has no preset {cell.preset!r}; its presets: "
                         f"{', '.join(sc.presets)}")
    if cell.variant not in sc.variants:
        raise UsageError(f"scenario {sc.id} has no variant {cell.variant!r}; its variants: "
                         f"{', '.join(sc.variants)}")
    if not isinstance(cell.params, dict):
        raise UsageError(f"params must be an object, got {type(cell.params).__name__}")
    for key, want in sc.presets[cell.preset].items():
        got = cell.params.get(key, want)
        number = (int, float)
        same = (isinstance(got, number) and not isinstance(got, bool)) if \
            (isinstance(want, number) and not isinstance(want, bool)) else \
            (want is None or got is None or isinstance(got, type(want)))
        if not same:
            raise UsageError(f"param {key}={got!r} is not a {type(want).__name__} like the "
                             f"{cell.preset} preset's {want!r}")
    if cell.world is not None and not isinstance(cell.world, dict):
        raise UsageError(f"its network must be an object, got {type(cell.world).__name__}")
    return cell


def split(text: str | None) -> list[str] | None:
    return [t.strip() for t in text.split(",") if t.strip()] if text else None


def plan(scenarios: str | None, runtimes, variants: str | None,
         preset: str = "quick", repeats: int = 1, main_job: bool = False) -> list[Cell]:
    """The cells of a matrix, validated. ``runtimes``: parsed ``Runtime`` objects, or
    the text of a list (parsed here). Unknown names raise UsageError listing the
    valid ones; unavailable runtimes are kept (they become skipped cells).
    ``main_job`` keeps the scenarios (and variants) that belong in the main report."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise UsageError(f"--repeat must be a whole number >= 1, got {repeats!r}")
    known = scmod.scenarios()
    for text, option in ((scenarios, "--scenarios"), (variants, "--variants")):
        if text is not None and not split(text):     # '' is a mistake, not "every one"
            raise UsageError(f"{option} is empty: name at least one, or leave the option out")
    if main_job and not scenarios:
        ids = [sid for sid, sc in known.items() if sc.main_job]
    else:
        # s1 is S1 (case is forgiven), anything else unknown gets a did-you-mean
        ids = list(dict.fromkeys(scmod.resolve(s) for s in split(scenarios) or known))
    for sid in ids:
        if preset not in known[sid].presets:
            raise UsageError(f"scenario {sid} has no preset {preset!r}; its presets: "
                             f"{', '.join(known[sid].presets)}")
    rts = runtimes if isinstance(runtimes, list) else rtmod.parse_list(runtimes)
    wanted = split(variants)
    if wanted:
        allowed = {v for sid in ids for v in known[sid].variants}
        for v in wanted:
            if v not in allowed:
                raise UsageError(f"unknown variant {v!r} for {', '.join(ids)}; valid variants: "
                                 f"{', '.join(sorted(allowed))}")
    cells = []
    for sid in ids:
        sc = known[sid]
        for rt in rts:
            if rt.style not in sc.styles:
                continue      # e.g. S2 measures stream readers; other ports have none
            for v in sc.variants:
                if wanted and v not in wanted:
                    continue
                if main_job and sc.main_variants and v not in sc.main_variants:
                    continue
                cells.append(Cell(sid, rt.spec, v, preset, dict(sc.presets[preset]),
                                  max(repeats, sc.default_repeats), _sc=sc, _rt=rt))
    return cells


def why_empty(scenarios: str | None, runtimes: str | None) -> str:
    """Why ``plan`` made no cell of these scenarios and runtimes: a scenario runs
    only on the port styles it declares (a program-based one, where it has a
    program), and no runtime asked for has one of them."""
    known = scmod.scenarios()
    ids = list(dict.fromkeys(scmod.resolve(s) for s in split(scenarios) or known))
    rts = rtmod.parse_list(runtimes)
    parts = []
    for sid in ids:
        sc = known[sid]
        progs = f" (it has programs for: {', '.join(sc.programs)})" if sc.programs else ""
        parts.append(f"{sid} runs on the {'/'.join(sc.styles)} style{'s' if len(sc.styles) > 1 else ''}"
                     f"{progs}")
    have = ", ".join(f"{rt.spec} is {rt.style}" for rt in rts[:6]) + (" ..." if len(rts) > 6 else "")
    return f"{'; '.join(parts)}; no runtime asked for has that style ({have})"
