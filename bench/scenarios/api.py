"""The public scenario API: one ``Scenario`` object carries everything about itself.

A scenario is a question asked of every runtime the same way: which peers to start
(``bench.peers``: blocking sockets in their own process, the ground truth), what runs
on the runtime under test (an app served through its port's driver, or a program of
the scenario's own), which numbers to keep (``Metric``: the name ends in its unit,
the direction says whether lower or higher is better, or neither) and which yes/no
oracles to judge (``verdicts``). The report's columns, its plots, the presets, the
variants, whether the scenario belongs in the main job and whether it can be traced
live on the same object. Looplab's own S1-S8 (``bench.scenarios.catalog``) are defined exactly
this way; a user's scenario is one more object, registered from their own file::

    # my_bug.py -- run with: looplab run --scenario-file my_bug.py --runtimes coro,trio
    from bench import peers
    from bench.scenarios import Bars, Metric, Scenario, run_program


    async def send(port, host, tcp_port, n):
        stream = await port.open_tcp_stream(host, tcp_port)
        await stream.send_all(b"x" * n)
        await stream.aclose()


    def program(job):                      # runs in the cell process, on job.runtime
        port = job.runtime.open()
        try:
            port.run(send, *job.peer("reader"), job.params["total_bytes"])
        finally:
            port.close()
        return {"written_bytes": job.params["total_bytes"]}


    def run(ctx):                          # runs in the parent, once per repeat
        ran = run_program(ctx, peers=[peers.reader(max_s=10)], max_s=10)
        got = ran.peers["reader"]["received_bytes"]
        return ({"delivered_bytes": got, "written_bytes": ran.app["written_bytes"]},
                {"all_arrived": got == ran.app["written_bytes"]}, [])


    SCENARIO = Scenario(
        id="U1", title="user send and close", run=run, programs={"task": program},
        styles=("task",), summary="Sends then closes. Does every byte arrive?",
        metrics=[Metric("delivered_bytes", "higher", "delivered"),
                 Metric("written_bytes", None, "written")],
        verdicts={"all_arrived": "the reader got every byte written"},
        presets={"tiny": {"total_bytes": 300_000}, "quick": {"total_bytes": 3_000_000}},
        plots=[Bars("delivered_bytes", "bytes delivered")])

A module-level ``Scenario`` is registered when the file is loaded (calling
``register`` yourself does the same). ``run(ctx)`` gets a ``CellContext`` (``scenario``,
``runtime``, ``variant``, ``preset``, ``params`` -- the preset's values -- ``style`` and
``trace_path``) and returns ``(metrics, verdicts, notes)`` or an ``Outcome`` (which can
also carry time series for plots). Every metric it returns must be declared, and every
declared verdict returned; otherwise that repeat is recorded as an error. The building
blocks:

``serve_app(ctx, app, peers=..., params=..., upstream=None)``
    Start the peers, serve one of the protocol suite's apps (echo, sink, proxy,
    reqresp, push) through the port driver of the runtime under test in a cell
    process, start the peers that connect to it (``connect=APP``), wait for the
    peers to finish, stop the server. Returns ``Served(app, peers)``: the app side's
    probe and counters, and each peer's result. ``upstream="sink"`` hands that
    listening peer's address to a proxy.
``run_program(ctx, peers=..., linger_s=0)``
    Start the (listening) peers, then run the scenario's program for the runtime's
    port style in a cell process; the program gets a ``Job`` (runtime, variant,
    params, peer addresses) and returns a JSON-able dict. Returns
    ``Ran(app, peers, stopped_at)``. ``linger_s`` keeps the cell process alive after
    the program returned, so a peer can tell "the close completed" from "the process
    exited".
``bench.peers`` roles: ``sink``, ``source``, ``reader``, ``pipeline_client``,
    ``push_client``, ``echo_client``, ``reset_peer`` (each ``peers.ROLE(name=..., **fields)``).

``properties=(always(...), eventually(...), sometimes(...))`` declares what ``looplab
explore`` checks beyond the verdicts, at every choice point of every schedule it runs;
the program shows its state to them with ``observe(**values)`` (``bench.scenarios.properties``,
docs/explore.md).

Programs are looked up per runtime: ``programs`` maps a runtime id, a port style
(``callback``, ``stream``, ``task``) or ``"*"`` to a function. The cell process is a
fresh interpreter: its spec names the scenario files and modules this process loaded
(``plugin_spec()``), and it loads them before it looks the program up, so a program
defined in the user's own file runs there.

Discovery: ``load_plugins(files, modules)`` loads scenario files
(``--scenario-file``), modules (``--scenario-module``) and the installed packages'
entry points in group ``looplab.scenarios`` (an entry point names a module, a
``Scenario``, or an iterable of them). Each scenario remembers where it came from
(``origin``). A file that does not import, or that defines no scenario, is a
``UsageError`` naming the file; so is an id that is already taken.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from bench.scenarios.context import (
    _LOADED, APP, AppProcess, CellContext, Job, Ran, Served, abort_running, plugin_spec,
    run_program, serve_app,
)
from bench.errors import CRASH_KEY, UsageError
from bench.host import plugins
from protocols.apps import STYLES
from bench.scenarios.properties import Property, always, eventually, observe, sometimes

__all__ = ["Scenario", "Metric", "Minimum", "Bars", "Lines", "Series", "Job", "CellContext", "Outcome", "Served",
           "Ran", "APP", "STYLES", "UNITS", "CRASH_KEY", "NOT_MEASURED", "register", "get", "scenarios", "load_scenario_file",
           "load_plugins", "plugin_spec", "serve_app", "run_program", "AppProcess",
           "abort_running", "Property", "always", "eventually", "sometimes", "observe", "resolve"]

UNITS = {"_bytes": "bytes", "_Bps": "bytes/s", "_per_s": "1/s", "_s": "seconds",
         "_count": "count", "_fraction": "fraction"}
KINDS = ("flag", "text")   # metrics whose value is not a number: yes/no, a label
DIRECTIONS = ("lower", "higher", None)
BUILTIN_MODULE = "bench.scenarios.catalog"
NOT_MEASURED = "not measured"   # a verdict of None, as reports show it
ENTRY_POINT_GROUP = "looplab.scenarios"
_ID = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")


def unit_of(name: str) -> str | None:
    for suffix, unit in UNITS.items():
        if name.endswith(suffix):
            return unit
    return None


@dataclass(frozen=True)
class Metric:
    """One number a scenario keeps. ``name`` ends in its unit (``_bytes``, ``_s``,
    ``_Bps``, ``_per_s``, ``_count``, ``_fraction``) unless ``unit`` is ``"flag"`` or
    ``"text"``. ``direction``: ``"lower"`` or ``"higher"`` is better, or ``None``
    (information: shown, never a gate). ``label`` heads its report column; ``format``
    overrides the unit's formatter: the name of one in ``bench.results.tables``
    (``"fmt_percent"``), so the results document can name it. (A function is still
    taken, for this process's tables, but a report rendered from the document shows
    the unit's formatter instead.)"""
    name: str
    direction: str | None = None
    label: str = ""
    unit: str | None = None
    format: str | Callable | None = None
    timing: bool = False      # a wall-clock timing: compared noise-aware, never exactly
    # The most this cell could physically produce, from its parameters (a function of
    # ``ctx.params``, or a number): a value above it is an error, not a figure.
    ceiling: Callable | float | None = None
    # Whose memory a buffer or queue metric is: ``"app"`` for a queue the app under
    # test keeps by its own policy (S6's unbounded mailbox), not the runtime's buffer;
    # the report's answers count it against the app, not the runtime. None: the runtime's.
    owner: str | None = None

    def __post_init__(self):
        if self.unit is None:
            object.__setattr__(self, "unit", unit_of(self.name))
        if not self.label:
            object.__setattr__(self, "label", self.name)

    def problem(self) -> str | None:
        if not isinstance(self.name, str) or not self.name:
            return "a metric without a name"
        if self.unit is None:
            return (f"metric {self.name!r} must end in its unit "
                    f"({', '.join(UNITS)}) or give unit='flag' or 'text'")
        if self.unit not in UNITS.values() and self.unit not in KINDS:
            return f"metric {self.name!r}: unknown unit {self.unit!r}"
        if self.direction not in DIRECTIONS:
            return f"metric {self.name!r}: direction must be 'lower', 'higher' or None"
        if self.direction is not None and self.unit in KINDS:
            return f"metric {self.name!r}: a {self.unit} has no direction"
        if self.owner not in (None, "app"):
            return f"metric {self.name!r}: owner must be 'app' or None (the runtime's)"
        return None

    def describe(self) -> dict:
        out = {"unit": self.unit, "direction": self.direction, "label": self.label,
               "timing": self.timing}
        if isinstance(self.format, str):
            out["format"] = self.format
        if self.owner:
            out["owner"] = self.owner
        return out


def _value_of(bound, params):
    return bound(params) if callable(bound) else bound


@dataclass(frozen=True)
class Minimum:
    """The least activity a cell must show before its verdicts mean anything: the
    metric ``metric`` (bytes through, requests answered, seconds of steady state) at
    least ``at_least`` -- a number, or a function of ``ctx.params``. A cell below it
    is an error that says what was missing, and its verdicts are "not measured".
    ``what`` says it in words for that error (e.g. "a sixteenth of what the sink
    takes in the run")."""
    metric: str
    at_least: Callable | float = 1
    what: str = ""

    def shortfall(self, metrics: dict, params: dict) -> str | None:
        """Why ``metrics`` fall short of this minimum, or None if they meet it."""
        need = _value_of(self.at_least, params)
        got = metrics.get(self.metric)
        why = f" ({self.what})" if self.what else ""
        if got is None:
            return f"{self.metric} was not measured; the oracle needs >= {need:g}{why}"
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            return f"{self.metric} is {got!r}, not a number; the oracle needs >= {need:g}{why}"
        if got < need:
            return f"{self.metric} was {got:g}; the oracle needs >= {need:g}{why}"
        return None


@dataclass(frozen=True)
class Series:
    """One time series a ``Lines`` plot draws: ``name`` in the outcomes' ``series``,
    the title of its panel, and the factor its values are drawn at (1e-6: bytes as MB)."""
    name: str
    title: str
    scale: float = 1.0


@dataclass(frozen=True)
class Lines:
    """Time series as lines: a row of panels per ``Series``, a column per port style,
    a line per cell (our kernels thick; the first variant solid, the others dashed),
    written as ``file`` in the report folder. Data, like ``Bars``: the results
    document records it and any report draws it."""
    file: str
    title: str
    series: tuple
    xlabel: str = "time (s)"

    def describe(self) -> dict:
        return {"lines": {"file": self.file, "title": self.title, "xlabel": self.xlabel,
                          "series": [{"name": s.name, "title": s.title, "scale": s.scale}
                                     for s in self.series]}}


@dataclass(frozen=True)
class Bars:
    """A bar chart of one metric, one bar per cell (our kernels highlighted)."""
    metric: str
    ylabel: str
    scale: float = 1.0


@dataclass
class Outcome:
    """What one repeat of a scenario found. ``series``: time series for plots
    ({name: [[t, value], ...]}, kept from the first repeat)."""
    metrics: dict
    verdicts: dict
    notes: list = field(default_factory=list)
    series: dict = field(default_factory=dict)


@dataclass(eq=False)
class Scenario:
    """Everything about one scenario (see the module docstring).

    ``run(ctx) -> Outcome | (metrics, verdicts, notes)`` is called once per repeat in
    the parent process. ``presets`` maps a preset name to the parameters a cell gets
    (``ctx.params``). ``variants`` are listed in the order the report shows them.
    ``columns`` names the metrics the report table shows (default: every metric with
    a direction). ``main_variants`` narrows the main job (``looplab`` with no verb)."""
    id: str
    title: str
    summary: str
    run: Callable
    metrics: tuple = ()
    verdicts: Mapping[str, str] = field(default_factory=dict)
    presets: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    variants: tuple = ("naive",)
    programs: Mapping[str, Callable] = field(default_factory=dict)
    peers: tuple = ()
    columns: tuple = ()
    plots: tuple = ()
    styles: tuple = STYLES
    main_job: bool = False
    main_variants: tuple | None = None
    traceable: bool = False
    default_repeats: int = 1
    origin: str = ""
    real_network_only: str = ""     # why it cannot run on the simulated network ("": it can)
    # The evidence (see ``judge``): the least activity every verdict needs, and for
    # each verdict the metrics that decide it (each must be measured).
    minimum: tuple = ()
    decided_by: Mapping[str, tuple] = field(default_factory=dict)
    symptoms: tuple = ()      # verdicts whose True is the bug showing (the zoo's bug_shown)
    # Declared properties beyond the verdicts (``always``, ``eventually``,
    # ``sometimes``: bench.scenarios.properties), checked by ``looplab explore``.
    properties: tuple = ()
    # A standalone program (a path: standard library and the runtime's pinned libraries
    # only) that ``run_program`` runs instead of the cell process on an interpreter below
    # looplab's minimum, in a bare environment (bench.host.envs.is_bare). It gets the
    # program's spec as JSON in argv[1] (``variant``, ``params``, ``peers``, ``max_s``,
    # ``linger_s``) and prints the cell process's JSON lines: ``{"event": "stopped",
    # "at": time.monotonic()}``, then ``{"event": "result", ...}``.
    program_file: str = ""

    def __post_init__(self):
        self.metrics = tuple(self.metrics)
        self.variants = tuple(self.variants)
        self.styles = tuple(self.styles)
        self.verdicts = dict(self.verdicts)
        self.presets = {k: dict(v) for k, v in dict(self.presets).items()}
        self.programs = dict(self.programs)
        self.minimum = tuple(self.minimum)
        self.decided_by = {k: tuple(v) for k, v in dict(self.decided_by).items()}
        self.properties = tuple(self.properties)
        if not self.columns:
            self.columns = tuple(m.name for m in self.metrics if m.direction is not None) \
                or tuple(m.name for m in self.metrics[:4])
        self.columns = tuple(self.columns)

    def metric(self, name: str) -> Metric | None:
        for m in self.metrics:
            if m.name == name:
                return m
        return None

    def problems(self) -> list[str]:
        """What is missing or wrong; empty when the scenario can be registered."""
        out = []
        if not isinstance(self.id, str) or not _ID.match(self.id):
            out.append(f"an id of letters, digits, '_', '.', '-' (got {self.id!r})")
        if not self.title:
            out.append("a title")
        if not self.summary:
            out.append("a summary (two sentences: what it does, what it asks)")
        if not callable(self.run):
            out.append("run: a function run(ctx) -> (metrics, verdicts, notes)")
        if not self.metrics:
            out.append("metrics: at least one Metric")
        if not self.verdicts:
            out.append("verdicts (oracles): at least one {name: meaning}")
        if not self.presets:
            out.append("presets: at least one {name: params}")
        if not self.variants:
            out.append("variants: at least one")
        for m in self.metrics:
            if not isinstance(m, Metric):
                out.append(f"metrics must be Metric objects, got {m!r}")
                continue
            p = m.problem()
            if p:
                out.append(p)
        names = [m.name for m in self.metrics if isinstance(m, Metric)]
        if len(set(names)) != len(names):
            out.append("metrics with unique names")
        for c in self.columns:
            if c not in names:
                out.append(f"column {c!r} is not a declared metric")
        for p in self.plots:
            if isinstance(p, Bars) and p.metric not in names:
                out.append(f"plot of {p.metric!r}, which is not a declared metric")
            elif isinstance(p, Lines) and not (p.series and all(isinstance(s, Series)
                                                                for s in p.series)):
                out.append(f"plot {p.file!r} with Series(...) to draw")
            elif not isinstance(p, (Bars, Lines)) and not callable(p):
                out.append(f"plots that are Bars, Lines or a function (got {type(p).__name__})")
        for m in self.metrics:
            if isinstance(m, Metric) and isinstance(m.format, str):
                from bench.results import tables
                if not callable(getattr(tables, m.format, None)):
                    out.append(f"metric {m.name}: format {m.format!r} is not a formatter of "
                               "bench.results.tables (fmt_percent, fmt_bytes, ...)")
        for s in self.styles:
            if s not in STYLES:
                out.append(f"styles from {', '.join(STYLES)} (got {s!r})")
        if self.main_variants and set(self.main_variants) - set(self.variants):
            out.append("main_variants from its variants")
        if not isinstance(self.default_repeats, int) or self.default_repeats < 1:
            out.append("default_repeats >= 1")
        for m in self.minimum:
            if not isinstance(m, Minimum):
                out.append(f"minimum must hold Minimum objects, got {m!r}")
            elif m.metric not in names:
                out.append(f"minimum on {m.metric!r}, which is not a declared metric")
        for v, ms in self.decided_by.items():
            if v not in self.verdicts:
                out.append(f"decided_by names {v!r}, which is not a declared verdict")
            out += [f"verdict {v!r} decided by {m!r}, which is not a declared metric"
                    for m in ms if m not in names]
        out += [f"symptom {v!r} is not a declared verdict" for v in self.symptoms
                if v not in self.verdicts]
        for p in self.properties:
            if not isinstance(p, Property):
                out.append(f"properties must be always/eventually/sometimes, got {p!r}")
                continue
            why = p.problem()
            if why:
                out.append(why)
            out += [f"property {p.name!r} names variant {v!r}, which is not declared"
                    for v in p.variants if v not in self.variants]
        names = [p.name for p in self.properties if isinstance(p, Property)]
        if len(set(names)) != len(names):
            out.append("properties with unique names")
        return out

    def judge(self, params: dict, metrics: dict, verdicts: dict,
              peers_seen: Mapping | None = None) -> tuple[dict, dict, list]:
        """The evidence rule, applied to one repeat: (metrics, verdicts, errors).

        A verdict is True (holds), False (fails) or None (not measured): None when
        its oracle returned None, when a metric in its ``decided_by`` is missing,
        or when the cell fell short of a ``minimum`` or one of its peers
        (``peers_seen``) never got its connection (then every verdict is None) --
        unless the app was gone by then (the peer's ``app_gone``: it exited, stopped
        accepting or ended while the peer waited): that is a finding, and the
        oracle's verdicts stand (``app_gone_notes`` says why, for the cell's notes).
        A metric above its ``ceiling`` is an error and is dropped, not reported.
        Each verdict not measured adds an error saying what was missing."""
        metrics, errors = dict(metrics), []
        for m in self.metrics:
            value = metrics.get(m.name)
            if m.ceiling is None or not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            top = _value_of(m.ceiling, params)
            if value > top:
                errors.append(f"implausible: {m.name} = {value:g} is above the {top:g} this "
                              "cell could produce; not kept")
                metrics[m.name] = None
        out = {k: (None if v is None else bool(v)) for k, v in verdicts.items()}
        # A peer the app never served because the app was gone (``app_gone``: it had
        # exited, stopped accepting or ended) is the measurement, not missing evidence.
        short = [f"peer {name!r} never got its connection"
                 for name, res in (peers_seen or {}).items()
                 if not res.get("connected") and not res.get("app_gone")]
        short += [s for s in (m.shortfall(metrics, params) for m in self.minimum) if s]
        if short:
            errors.append(f"{NOT_MEASURED}: too little activity: {'; '.join(short)}")
            return metrics, {k: None for k in out}, errors
        for name, value in out.items():
            missing = [m for m in self.decided_by.get(name, ()) if metrics.get(m) is None]
            if missing:
                out[name] = None
                errors.append(f"{NOT_MEASURED}: {name} needs {', '.join(missing)}, "
                              "which the cell did not measure")
            elif value is None:
                errors.append(f"{NOT_MEASURED}: the oracle of {name} had no evidence to decide")
        return metrics, out, errors

    @staticmethod
    def app_gone_notes(peers_seen: Mapping | None) -> list[str]:
        """The cause, per peer the app never served because it was gone."""
        return [f"peer {name!r} never got its connection: {res['app_gone']}"
                for name, res in (peers_seen or {}).items()
                if not res.get("connected") and res.get("app_gone")]

    def program_for(self, runtime) -> Callable:
        """The program for ``runtime``: by its id, else its style, else ``"*"``."""
        for key in (runtime.id, runtime.style, "*"):
            if key in self.programs:
                return self.programs[key]
        raise UsageError(f"scenario {self.id} has no program for {runtime.id} "
                         f"({runtime.style} style); it has: {', '.join(self.programs) or 'none'}")

    def describe(self) -> dict:
        """The JSON-able part, stored in every results file so a report can be
        rendered without the scenario's code."""
        return {"title": self.title, "summary": self.summary, "origin": self.origin,
                "variants": list(self.variants),
                "metrics": {m.name: m.describe() for m in self.metrics},
                "verdicts": dict(self.verdicts), "columns": list(self.columns),
                "decided_by": {v: list(self.decided_by.get(v, ())) for v in self.verdicts},
                "minimum": [{"metric": m.metric, "what": m.what} for m in self.minimum],
                "symptoms": list(self.symptoms)}


# ---------------------------------------------------------------------------
# The registry

_REGISTRY: dict[str, Scenario] = {}
_FILE_MODULES: dict[str, Any] = {}
_builtin_loaded = False


def register(scenario: Scenario) -> Scenario:
    """Add ``scenario``. Refused (UsageError) when something is missing (the message
    says what) or its id is taken. Registering the same object twice is a no-op."""
    if not isinstance(scenario, Scenario):
        raise UsageError(f"register() takes a Scenario, got {type(scenario).__name__}")
    _ensure_builtin()
    have = _REGISTRY.get(scenario.id)
    if have is scenario:
        return scenario
    missing = scenario.problems()
    if missing:
        raise UsageError(f"scenario {scenario.id!r} is refused: it needs {'; '.join(missing)}")
    if have is not None:
        raise UsageError(f"scenario id {scenario.id!r} is taken by {have.origin}; "
                         "choose another id")
    if not scenario.origin:
        scenario.origin = plugins.current_origin("registered in-process")
    _REGISTRY[scenario.id] = scenario
    return scenario


def _ensure_builtin() -> None:
    global _builtin_loaded
    if not _builtin_loaded:
        _builtin_loaded = True
        # Built-ins are loaded the way any scenario module is, by name.
        with plugins.origin("built-in"):
            importlib.import_module(BUILTIN_MODULE)


def scenarios() -> dict[str, Scenario]:
    """Every registered scenario, built-ins first, in registration order."""
    _ensure_builtin()
    return dict(_REGISTRY)


def get(sid: str) -> Scenario:
    _ensure_builtin()
    try:
        return _REGISTRY[sid]
    except KeyError:
        raise UsageError(f"unknown scenario {sid!r}; valid scenarios: {', '.join(_REGISTRY)}") from None


def resolve(name: str) -> str:
    """The registered id a user meant by ``name``: itself, or the one id that
    differs from it only in case (``s1`` is ``S1``); else a UsageError with the
    closest ids as a did-you-mean."""
    _ensure_builtin()
    if name in _REGISTRY:
        return name
    same = [sid for sid in _REGISTRY if sid.lower() == name.lower()]
    if len(same) == 1:
        return same[0]
    import difflib
    close = difflib.get_close_matches(name, list(_REGISTRY), n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    raise UsageError(f"unknown scenario {name!r}; {hint}valid scenarios: {', '.join(_REGISTRY)}")


def _register_found(namespace: dict, before: set) -> int:
    """Register module-level Scenario objects not yet registered, and the module's
    ``SCENARIOS`` sequence in its order; count new ids."""
    for value in list(namespace.get("SCENARIOS", ())) + list(namespace.values()):
        if isinstance(value, Scenario) and _REGISTRY.get(value.id) is not value:
            register(value)
    return len(set(_REGISTRY) - before)


def load_scenario_file(path: str) -> list[Scenario]:
    """Load a user's scenario file; returns the scenarios it added. Loading the
    same file again is a no-op. Errors are one-line UsageErrors naming the file."""
    _ensure_builtin()
    full = os.path.abspath(path)
    if full in _FILE_MODULES:
        return [s for s in _REGISTRY.values() if s.origin == f"file {full}"]
    if not os.path.isfile(full):
        raise UsageError(f"scenario file {path}: no such file")
    modname = "looplab_scenario_" + hashlib.sha1(full.encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(modname, full)
    if spec is None or spec.loader is None:
        raise UsageError(f"scenario file {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    before = set(_REGISTRY)
    sys.modules[modname] = module          # so its programs and dataclasses resolve
    try:
        with plugins.origin(f"file {full}"):
            spec.loader.exec_module(module)
            added = _register_found(vars(module), before)
    except BaseException as exc:   # noqa: BLE001 -- a user's file may raise anything, even SystemExit
        sys.modules.pop(modname, None)
        for sid in set(_REGISTRY) - before:     # all of the file or none of it
            del _REGISTRY[sid]
        if isinstance(exc, UsageError):
            raise UsageError(f"scenario file {path}: {exc}") from None
        where = _line_in(exc, full)
        raise UsageError(f"scenario file {path}{where}: {type(exc).__name__}: {exc}") from None
    if not added:
        sys.modules.pop(modname, None)
        raise UsageError(f"scenario file {path}: defines no scenario (give it a module-level "
                         "Scenario(...) or call bench.scenarios.register)")
    _FILE_MODULES[full] = module
    _LOADED["files"].append(full)
    return [_REGISTRY[s] for s in _REGISTRY if s not in before]


def _line_in(exc: BaseException, filename: str) -> str:
    if isinstance(exc, SyntaxError) and exc.lineno:
        return f", line {exc.lineno}"
    tb, line = exc.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            line = tb.tb_lineno
        tb = tb.tb_next
    return f", line {line}" if line else ""


def load_scenario_module(name: str) -> list[Scenario]:
    _ensure_builtin()
    before = set(_REGISTRY)
    module = plugins.import_module(name, "scenario module")
    _register_found(vars(module), before)
    if name not in _LOADED["modules"]:
        _LOADED["modules"].append(name)
    return [_REGISTRY[s] for s in _REGISTRY if s not in before]


def load_plugins(files=(), modules=()) -> list[Scenario]:
    """Load the entry points of group ``looplab.scenarios``, then ``modules``, then
    ``files``. Returns the scenarios added."""
    _ensure_builtin()
    added: list[Scenario] = []
    for ep in plugins.entry_points(ENTRY_POINT_GROUP):
        origin = plugins.entry_point_origin(ep)
        if any(s.origin == origin for s in _REGISTRY.values()):
            continue
        before = set(_REGISTRY)
        obj = plugins.load_entry_point(ep)
        objs = [obj] if isinstance(obj, Scenario) else \
            list(obj) if isinstance(obj, (list, tuple)) else []
        with plugins.origin(origin):
            for sc in objs:
                register(sc)
            if not objs and hasattr(obj, "__dict__"):
                _register_found(vars(obj), before)
        added += [_REGISTRY[s] for s in _REGISTRY if s not in before]
    for name in modules:
        added += load_scenario_module(name)
    for path in files:
        added += load_scenario_file(path)
    return added


def load_runtime_modules(modules=()) -> None:
    """Import runtime plugin modules through the runtime registry (and remember them
    for the cell processes)."""
    from bench import runtimes
    loader = getattr(runtimes, "load_plugins", None)
    if modules and loader is None:
        raise UsageError("--runtime-module needs a runtime registry with load_plugins()")
    if loader is not None:
        loader(tuple(modules))
    for m in modules:
        if m not in _LOADED["runtime_modules"]:
            _LOADED["runtime_modules"].append(m)


def load_plugin_spec(spec: dict) -> None:
    """The cell side of ``plugin_spec``."""
    load_runtime_modules(spec.get("runtime_modules") or ())
    load_plugins(spec.get("scenario_files", ()), spec.get("scenario_modules", ()))
