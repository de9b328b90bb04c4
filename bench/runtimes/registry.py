"""The runtime registry: what a runtime is, and the table users choose from.

A *runtime* is one ``RuntimeInfo`` object that says everything the lab knows about
it: its id and port style, where its port class lives (``"package.module:Class"``,
imported only when the runtime is opened or checked, so a missing library makes
the runtime *unavailable with a reason*, never an import-time crash), its option
schema, the reference runtimes it is compared with (primary first), the modules
it needs and the library whose version decides its behaviour, its declared S4
fingerprint, its declared differences from its style's port contract and from its
primary reference at the fidelity probes' edges, how the fidelity probes reach
it, how ``looplab trace`` traces it, its performance goals, the scheduling
choices its contract leaves open to ``looplab explore``, and whether it runs on
the simulated network. ``register(info)`` adds one; the nine built-in runtimes
(``bench.runtimes.builtin``) are registered exactly that way. The protocol suite
knows none of this: a port is constructed as ``PortClass(runtime, options)``.

The table loads on first use: the first read of ``RUNTIMES`` (or ``get``,
``register``, ``parse``) registers the built-ins, then the plugins, so no plugin
takes a built-in's id. Plugins arrive three ways (``bench.host.plugins``): the
entry-point group ``looplab.runtimes`` (a module, or a callable that registers
and may return ``RuntimeInfo`` objects), the ``LOOPLAB_RUNTIME_MODULES``
variable, and ``load_plugins(modules)`` (``--runtime-module``). A plugin that
does not load is one ``UsageError`` naming it. ``plugin_modules()`` lists the
modules loaded by name, which a fresh process loads first. Each ``RuntimeInfo``
records its ``origin``: ``builtin``, ``entry point NAME (DIST)`` or ``module
PKG.MOD``.

A parsed spec (``ID@INTERPRETER+PINS:OPTIONS``) is a ``Runtime``
(``bench.runtimes.spec``).
"""
from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, field, replace
from typing import Mapping, NamedTuple

from bench.errors import UsageError
from bench.host import plugins
from kernels.options import Schema
from protocols.apps import STYLES
from protocols.errors import Unavailable
from protocols.fingerprint import Fingerprint

__all__ = ["RuntimeInfo", "Difference", "ProbeDifference", "PerformanceGoal", "FLOOR", "Tracing",
           "RUNTIMES", "STYLES", "ENTRY_POINT_GROUP", "ENV_VAR", "UsageError", "Unavailable",
           "register", "unregister", "get", "load_object", "port_class", "unavailable_reason",
           "load_plugins", "plugin_modules", "register_loop_alias", "register_loop_kernel",
           "loop_alias", "alias_of", "loop_kernel"]

ENTRY_POINT_GROUP = "looplab.runtimes"
ENV_VAR = "LOOPLAB_RUNTIME_MODULES"


class Difference(NamedTuple):
    """A declared, measured deviation from the style's port contract: the
    ``outcome`` the conformance suite sees on this runtime, and why."""
    outcome: str
    reason: str


class ProbeDifference(NamedTuple):
    """A declared, accepted difference from the primary reference at one fidelity
    probe (``looplab fidelity``): ``expected`` is what this runtime shows -- for a
    dict observation, the keys that differ from the reference with their values
    here; otherwise the whole observation -- and ``reason`` says why. A probe whose
    observation no longer matches ``expected`` is an undeclared difference again."""
    expected: object
    reason: str


#: the reference of a goal counted against no kernel at all (``bench.perf.nokernel``)
FLOOR = "floor"


class PerformanceGoal(NamedTuple):
    """A performance goal of this runtime against a reference (``looplab bench goals``):
    ``kind`` is "echo" or a micro-benchmark op.

    ``judged_on`` "instructions": the subject's instructions per echo request or per
    operation (callgrind), over the reference's, should stay at or under ``target``;
    ``reference`` may then be "floor" (``bench.perf.nokernel``, spawn+join with no
    kernel). Otherwise the median of per-round paired ratios on "req/s", "server
    CPU/req" or "ops/s" (the reference's cost over ours, our rate over theirs) should
    reach ``target``. ``beside``: more references measured in the same timed rounds
    and shown next to the goal (rloop beside uvloop), never judged. ``subject``: the
    spec the goal measures when it is not this runtime itself, e.g.
    ``asyncio-streams:loop=looplab`` on the runtime whose kernel that loop is."""
    kind: str
    reference: str
    target: float
    what: str
    judged_on: str
    beside: tuple = ()
    subject: str | None = None


class Tracing(NamedTuple):
    """How ``looplab trace`` traces a runtime. ``option``: a port option that turns
    its own trace on (``"trace=true"``): the port then has ``trace()``. ``port``: a
    traced twin of its port (``"module:Class"``, with ``trace()``) that sees the
    library through ``hook``. Neither: ``refused`` says why it cannot be traced."""
    option: str = ""
    port: str = ""
    hook: str = ""
    refused: str = ""


@dataclass(frozen=True)
class RuntimeInfo:
    """Everything looplab knows about one runtime.

    ``port`` is ``"package.module:Class"``; the class is constructed as
    ``Class(runtime, options)`` where ``runtime`` is the parsed ``Runtime`` and
    ``options`` the full option dict. ``compared_with`` lists the reference
    runtimes (by id) whose behaviour this one's defaults reproduce, primary
    first. ``requires`` are modules that must import for the runtime to be
    available (checked before the port module itself). ``differences`` maps a
    conformance-suite key to a ``Difference`` (or an ``(outcome, reason)``
    pair). ``origin`` is filled in by ``register`` when left empty.
    ``real_network_only`` is None for a runtime whose port runs on the
    simulated network, else the reason it cannot."""
    id: str
    style: str
    port: str
    options: Schema
    ours: bool = False
    compared_with: tuple = ()
    requires: tuple = ()
    fingerprint: Fingerprint | None = None
    differences: Mapping[str, Difference] = field(default_factory=dict)
    summary: str = ""
    origin: str = ""
    #: None when the port runs on the simulated network (``kernels.simnet``,
    #: ``looplab run --net sim``) if opened inside ``protocols.ports.using_io``
    #: with a simulated IO; otherwise why it runs only on the real network (one
    #: line, shown when its simulated cells are skipped). A port has to be written
    #: for it, so a runtime that does not say is real-network only.
    real_network_only: str | None = "its port does not declare that it can run on the simulated network"
    #: the distribution whose installed version decides this runtime's behaviour
    #: (``"python"`` for the standard library), recorded beside results and zoo rows
    library: str | None = None
    #: how the fidelity probes reach it: None through its port (a stream-style port
    #: with asyncio's names runs the stream probes as is), else ``"module:Class"`` of
    #: one adapter (a probe side, see ``bench.fidelity``) made as ``Class(options)``
    probe_side: str | None = None
    #: fidelity probe name -> ``ProbeDifference`` (or ``(expected, reason)``): accepted
    #: differences from the primary reference, each with the value it must keep
    probe_differences: Mapping[str, ProbeDifference] = field(default_factory=dict)
    #: option flip -> {fidelity probe: {observation key: value when flipped}}: the
    #: probes that see a flip no S4 metric can (tests/test_fingerprints.py checks them)
    probe_flips: Mapping[str, Mapping] = field(default_factory=dict)
    #: its performance goals against references (``PerformanceGoal``), in order
    goals: tuple = ()
    #: how ``looplab trace`` traces it (None: it declares no way)
    tracing: Tracing | None = None
    #: the runtime this one is a variant of (a traced twin): not listed in tables
    variant_of: str | None = None
    #: scheduling choices (``kernels.choice`` kinds) its documented contract leaves open
    #: and its kernel exposes to ``looplab explore``: every outcome is reachable on a
    #: conforming runtime. Empty: none is hooked (only the network's choices reach it).
    schedule_choices: frozenset = frozenset()
    #: choices other runtimes' contracts allow that ``explore --portability`` crosses
    #: onto this one (an order legal on trio but not promised here)
    portable_choices: frozenset = frozenset()
    #: ``"module:function"`` listing the tasks of this runtime's loop running in the
    #: calling thread as ``[(label, coroutine)]`` (``[]`` when none runs), read when a
    #: simulated world deadlocks (``bench.explore.checks.running_tasks``); asked only
    #: once the modules of ``requires`` are imported. None: it declares no way.
    tasks: str | None = None

    @property
    def primary_reference(self) -> str | None:
        """The runtime whose behaviour this one's defaults reproduce, or None."""
        return self.compared_with[0] if self.compared_with else None

    def difference(self, key: str) -> Difference | None:
        d = self.differences.get(key)
        return None if d is None else Difference(*d)

    def probe_difference(self, probe: str) -> ProbeDifference | None:
        d = self.probe_differences.get(probe)
        return None if d is None else ProbeDifference(*d)



class _Registry(dict):
    """The table of runtimes by id, in registration order (built-ins first). Any read
    loads the built-ins and the plugins first; add to it only through ``register``."""

    def __getitem__(self, key):
        _load()
        return dict.__getitem__(self, key)

    def get(self, key, default=None):
        _load()
        return dict.get(self, key, default)

    def __contains__(self, key):
        _load()
        return dict.__contains__(self, key)

    def __iter__(self):
        _load()
        return dict.__iter__(self)

    def __len__(self):
        _load()
        return dict.__len__(self)

    def keys(self):
        _load()
        return dict.keys(self)

    def values(self):
        _load()
        return dict.values(self)

    def items(self):
        _load()
        return dict.items(self)

    def __repr__(self):
        _load()
        return dict.__repr__(self)


RUNTIMES: dict[str, RuntimeInfo] = _Registry()

BUILTIN_MODULE = "bench.runtimes.builtin"
_state = "empty"            # -> "loading" -> "loaded"
_loaded_modules: list[str] = []
_reasons: dict[str, str | None] = {}


def _load() -> None:
    """Register the built-ins, then the entry points and the environment's modules: once,
    on the first read of the table."""
    global _state
    if _state != "empty":
        return
    _state = "loading"
    try:
        with plugins.origin("builtin"):
            importlib.import_module(BUILTIN_MODULE)
        for ep in plugins.entry_points(ENTRY_POINT_GROUP):
            returned = plugins.load_entry_point(ep, call=True)
            with plugins.origin(plugins.entry_point_origin(ep)):
                _register_returned(returned)
        load_plugins(plugins.env_modules(ENV_VAR), what=f"runtime module (from {ENV_VAR})")
    finally:
        _state = "loaded"


def _check_info(info: RuntimeInfo) -> None:
    problems = []
    if not isinstance(info.id, str) or not info.id or any(c in info.id for c in ":,= "):
        problems.append(f"id {info.id!r} must be a non-empty word without ':', ',', '=' or spaces")
    if info.style not in STYLES:
        problems.append(f"style {info.style!r} must be one of {', '.join(STYLES)}")
    module, sep, cls = str(info.port).partition(":")
    if not (module and sep and cls):
        problems.append(f"port {info.port!r} must be 'package.module:Class'")
    if not isinstance(info.options, Schema):
        problems.append("options must be a kernels.options.Schema")
    if info.fingerprint is not None and not isinstance(info.fingerprint, Fingerprint):
        problems.append("fingerprint must be a protocols.fingerprint.Fingerprint or None")
    if info.real_network_only is not None and not (isinstance(info.real_network_only, str)
                                                   and info.real_network_only.strip()):
        problems.append("real_network_only must be None or the reason, as text")
    tracing_port = ""
    if isinstance(info.tracing, Tracing):
        tracing_port = info.tracing.port
    elif info.tracing is not None:
        problems.append("tracing must be a bench.runtimes.Tracing or None")
    for what, ref in (("probe_side", info.probe_side), ("tracing port", tracing_port)):
        if ref and not all(str(ref).partition(":")[::2]):
            problems.append(f"{what} {ref!r} must be 'package.module:Class'")
    if info.tasks is not None and not all(str(info.tasks).partition(":")[::2]):
        problems.append(f"tasks {info.tasks!r} must be 'package.module:function'")
    if problems:
        raise UsageError(f"cannot register runtime {info.id!r}: " + "; ".join(problems))


def register(info: RuntimeInfo) -> RuntimeInfo:
    """Add a runtime. Its id must be new: a clash is a UsageError naming where
    the existing one came from. Returns the info as registered (with ``origin``
    filled in: the loader's description, else the calling module)."""
    _load()
    if not isinstance(info, RuntimeInfo):
        raise UsageError(f"register() takes a RuntimeInfo, not {type(info).__name__}")
    _check_info(info)
    if dict.__contains__(RUNTIMES, info.id):
        raise UsageError(f"runtime {info.id!r} is already registered "
                         f"(from {dict.__getitem__(RUNTIMES, info.id).origin}); choose another id")
    if not info.origin:
        origin = plugins.current_origin() or \
            f"module {sys._getframe(1).f_globals.get('__name__', '?')}"
        info = replace(info, origin=origin)
    dict.__setitem__(RUNTIMES, info.id, info)
    _reasons.pop(info.id, None)
    return info


def unregister(runtime_id: str) -> None:
    """Remove a runtime (for tests that register throwaway ones)."""
    RUNTIMES.pop(runtime_id, None)
    _reasons.pop(runtime_id, None)


def get(runtime_id: str) -> RuntimeInfo:
    """The registered runtime ``runtime_id``; a UsageError listing the valid ids if none."""
    info = RUNTIMES.get(runtime_id)
    if info is None:
        raise UsageError(f"unknown runtime {runtime_id!r}; valid runtimes: {', '.join(RUNTIMES)}")
    return info


def _register_returned(result) -> None:
    """An entry point's callable may return RuntimeInfo objects instead of registering."""
    if isinstance(result, RuntimeInfo):
        result = [result]
    if isinstance(result, (list, tuple)):
        for info in result:
            if isinstance(info, RuntimeInfo) and dict.get(RUNTIMES, info.id) is not info:
                register(info)


def load_plugins(modules=(), what: str = "runtime module") -> list[str]:
    """Import each module in ``modules`` (an iterable or a comma list), once; each
    registers its runtimes. A module that does not import, or registers a clashing
    id, is one UsageError. Returns ``plugin_modules()``."""
    _load()
    if isinstance(modules, str):
        modules = modules.split(",")
    for name in (m.strip() for m in modules):
        if name and name not in _loaded_modules:
            plugins.import_module(name, what)
            _loaded_modules.append(name)
    return plugin_modules()


def plugin_modules() -> list[str]:
    """Every runtime module loaded by name so far (environment variable and
    ``load_plugins``), in load order: what a fresh process must load to see the
    same runtimes (installed entry points load there by themselves)."""
    return list(_loaded_modules)


# ---------------------------------------------------------------------------
# Loops: a spec's ``loop=NAME`` may be a runtime of its own, or a kernel of ours.

#: (runtime id, loop option value) -> the id of a runtime that *is* that pair, so
#: one configuration has one spec: ``asyncio-streams:loop=uvloop`` is ``uvloop-streams``.
_LOOP_ALIASES: dict[tuple[str, str], str] = {}
#: loop option value -> the id of the runtime whose kernel that loop is: the loop's
#: ``loop.NAME=VALUE`` options are that runtime's options, with its declared S4 flips.
_LOOP_KERNELS: dict[str, str] = {}


def register_loop_alias(runtime_id: str, loop: str, alias_id: str) -> None:
    """Make ``RUNTIME_ID:loop=LOOP`` parse as the runtime ``alias_id`` (whose own
    schema has no ``loop`` option: it is that loop)."""
    _LOOP_ALIASES[(runtime_id, loop)] = alias_id


def register_loop_kernel(loop: str, runtime_id: str) -> None:
    """Declare ``loop=LOOP`` to be the kernel of runtime ``runtime_id``: a
    ``loop.NAME=VALUE`` option then flips the declared S4 row exactly as
    ``runtime_id:NAME=VALUE`` does (``Runtime.declared_fingerprint``)."""
    _LOOP_KERNELS[loop] = runtime_id


def loop_alias(runtime_id: str, loop: str) -> str | None:
    _load()
    return _LOOP_ALIASES.get((runtime_id, loop))


def alias_of(runtime_id: str) -> tuple[str, str] | None:
    """(runtime id, loop) that runtime ``runtime_id`` is an alias of, or None."""
    _load()
    return next((pair for pair, alias in _LOOP_ALIASES.items() if alias == runtime_id), None)


def loop_kernel(loop: str) -> RuntimeInfo | None:
    _load()
    rid = _LOOP_KERNELS.get(loop)
    return None if rid is None else RUNTIMES.get(rid)


# Availability: required modules first, then the port class itself.

def _import_reason(module: str) -> str | None:
    try:
        importlib.import_module(module)
    except Exception as exc:  # ImportError, or curio on 3.12+ failing inside
        return f"{module} is not importable ({type(exc).__name__}: {exc})"
    return None


def load_object(ref: str):
    """``"package.module:Name"`` -> the object (imported now)."""
    module, _, name = ref.partition(":")
    obj = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def port_class(info: RuntimeInfo):
    """The runtime's port class (imported now)."""
    return load_object(info.port)


def unavailable_reason(info: RuntimeInfo) -> str | None:
    """Why the runtime cannot run in this interpreter (a required module or its port
    does not import), or None; asked once per runtime."""
    if info.id not in _reasons:
        reason = None
        for module in info.requires:
            reason = _import_reason(module)
            if reason:
                break
        if reason is None:
            try:
                port_class(info)
            except Exception as exc:
                reason = f"port {info.port} does not load ({type(exc).__name__}: {exc})"
        _reasons[info.id] = reason
    return _reasons[info.id]
