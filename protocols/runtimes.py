"""Runtimes: a kernel plus the port it is driven through, named for users.

A *runtime* is one ``RuntimeInfo`` object that says everything about itself:
its id and port style, where its port class lives (``"package.module:Class"``,
imported only when the runtime is opened or checked, so a missing library makes
the runtime *unavailable with a reason*, never an import-time crash), its
option schema, the reference libraries it is compared with (primary first), the
modules it needs and the library whose version decides its behaviour, its
declared S4 fingerprint, its declared differences from its style's port contract
and from its primary reference at the fidelity probes' edges (each with the value
expected), how the fidelity probes reach it (its port, or one declared adapter),
how ``looplab trace`` traces it, and whether it can run on the simulated network
(``real_network_only``: None, or why not). ``register(info)`` adds one; the nine
built-in runtimes (``protocols.builtin``) are registered exactly that way.
Registration points one way: ``protocols.builtin`` imports this module, never the
reverse; the package ``protocols`` imports the built-ins, then discovers plugins.

A *runtime spec* is ``ID[@INTERPRETER[+DIST==VERSION...]][:OPT=VALUE,OPT=VALUE...]``,
e.g. ``coro:ready_order=random-7``, ``asyncio-streams@3.12:loop=uvloop,eager=true``,
``uvloop-streams@3.11+uvloop==0.22.1`` or ``trio@/opt/py/bin/python3.13``.
``@INTERPRETER`` (a version ``X.Y[.Z]`` or a path, without ``:``, ``,`` or ``+``) names
the Python its cells run in (``bench.envs`` finds it and builds an environment);
without it they run in looplab's own interpreter. Each ``+DIST==VERSION`` pins one
distribution at an exact release in that environment (``Runtime.pins``); a pin needs
an ``@INTERPRETER``, since it is installed into a built environment. An option
``loop.NAME=VALUE`` is a keyword argument for the runtime's loop factory (asyncio's
ports, ``loop=...``); it lands in ``Runtime.loop_options``. See docs/axes.md.
``parse(spec)`` turns it into a ``Runtime`` (the info plus full option values);
``Runtime.open()`` constructs a fresh port as ``PortClass(runtime, options)``.
Every user mistake -- an unknown id, an unknown option, a bad value -- is one
``UsageError`` whose one-line message names the runtime and lists what is valid.

Discovery. Runtimes from outside the package arrive three ways, all of which
import a module (or call a function) that calls ``register``:

* the entry-point group ``looplab.runtimes`` of any installed distribution
  (an entry point names a module, or a callable that registers and may also
  return RuntimeInfo objects to register);
* the ``LOOPLAB_RUNTIME_MODULES`` environment variable, a comma list of modules;
* ``load_plugins(modules)``, which the CLI's ``--runtime-module`` calls.

Entry points and the environment variable are read once, by ``discover()``, which
the package ``protocols`` calls after registering the built-ins; a plugin that
fails to load there is recorded (``plugin_errors()``) and named in "unknown
runtime" messages instead of crashing every command. ``plugin_modules()`` lists
the modules loaded so far,
so a parent can hand them to a fresh process, which calls
``load_plugins(that_list)`` before looking anything up. Each RuntimeInfo
records its ``origin``: ``builtin``, ``entry point NAME (DIST)`` or ``module PKG.MOD``.
"""
from __future__ import annotations

import importlib
import os
import re
import socket
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Mapping, NamedTuple

from kernels.options import OptionError, Schema, show
from protocols.errors import Unavailable, UsageError
from protocols.fingerprint import Fingerprint

__all__ = ["RuntimeInfo", "Difference", "ProbeDifference", "PerformanceGoal", "Tracing",
           "Runtime", "ordered", "discover", "load_object", "RUNTIMES", "STYLES", "UsageError",
           "Unavailable", "register", "unregister", "get", "parse", "parse_list",
           "available_runtimes", "load_plugins", "plugin_modules", "plugin_errors",
           "bind_listener", "ENTRY_POINT_GROUP", "ENV_VAR", "register_loop_alias",
           "register_loop_kernel", "set_interpreter_check"]

STYLES = ("callback", "stream", "task")
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


class PerformanceGoal(NamedTuple):
    """A performance goal of this runtime against a reference (``looplab bench goals``):
    ``kind`` is "echo" or a micro-benchmark op; the median paired ratio, judged on
    ``judged_on`` ("req/s", "server CPU/req" or "ops/s"), should reach ``target``.
    ``beside``: more references measured in the same rounds and shown next to the
    judged ratio (rloop beside uvloop), never judged."""
    kind: str
    reference: str
    target: float
    what: str
    judged_on: str
    beside: tuple = ()


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


# The registry, in registration order (built-ins first). Read it freely; add to
# it only through register().
RUNTIMES: dict[str, RuntimeInfo] = {}

_origin_stack: list[str] = []
_loaded_modules: list[str] = []
_plugin_errors: list[str] = []
_reasons: dict[str, str | None] = {}


@contextmanager
def _origin(text: str):
    _origin_stack.append(text)
    try:
        yield
    finally:
        _origin_stack.pop()


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
        problems.append("tracing must be a protocols.runtimes.Tracing or None")
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
    if not isinstance(info, RuntimeInfo):
        raise UsageError(f"register() takes a RuntimeInfo, not {type(info).__name__}")
    _check_info(info)
    if info.id in RUNTIMES:
        raise UsageError(f"runtime {info.id!r} is already registered "
                         f"(from {RUNTIMES[info.id].origin}); choose another id")
    if not info.origin:
        if _origin_stack:
            origin = _origin_stack[-1]
        else:
            origin = f"module {sys._getframe(1).f_globals.get('__name__', '?')}"
        info = replace(info, origin=origin)
    RUNTIMES[info.id] = info
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
        failed = f" (plugins that failed to load: {'; '.join(_plugin_errors)})" if _plugin_errors else ""
        raise UsageError(f"unknown runtime {runtime_id!r}; valid runtimes: "
                         f"{', '.join(RUNTIMES)}{failed}")
    return info


# ---------------------------------------------------------------------------
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


def _port_class(info: RuntimeInfo):
    return load_object(info.port)


def _unavailable_reason(info: RuntimeInfo) -> str | None:
    if info.id not in _reasons:
        reason = None
        for module in info.requires:
            reason = _import_reason(module)
            if reason:
                break
        if reason is None:
            try:
                _port_class(info)
            except Exception as exc:
                reason = f"port {info.port} does not load ({type(exc).__name__}: {exc})"
        _reasons[info.id] = reason
    return _reasons[info.id]


# ---------------------------------------------------------------------------
# The two axes a spec adds to a runtime: the interpreter (``@``) and, for ports
# that take a ``loop`` option, the loop factory's keyword arguments (``loop.NAME=``).

#: (runtime id, loop option value) -> the id of a runtime that *is* that pair, so
#: one configuration has one spec: ``asyncio-streams:loop=uvloop`` is ``uvloop-streams``.
_LOOP_ALIASES: dict[tuple[str, str], str] = {}
#: loop option value -> the id of the runtime whose kernel that loop is: the loop's
#: ``loop.NAME=VALUE`` options are that runtime's options, with its declared S4 flips.
_LOOP_KERNELS: dict[str, str] = {}
#: Set by ``bench.envs``: judges a runtime bound to another interpreter (``@``)
#: from here -- None when it can run, else why not. None when unset, or inside
#: that interpreter's environment, where the ordinary checks apply.
_interpreter_check = None


def register_loop_alias(runtime_id: str, loop: str, alias_id: str) -> None:
    """Make ``RUNTIME_ID:loop=LOOP`` parse as the runtime ``alias_id`` (whose own
    schema has no ``loop`` option: it is that loop)."""
    _LOOP_ALIASES[(runtime_id, loop)] = alias_id


def register_loop_kernel(loop: str, runtime_id: str) -> None:
    """Declare ``loop=LOOP`` to be the kernel of runtime ``runtime_id``: a
    ``loop.NAME=VALUE`` option then flips the declared S4 row exactly as
    ``runtime_id:NAME=VALUE`` does (``Runtime.declared_fingerprint``)."""
    _LOOP_KERNELS[loop] = runtime_id


def set_interpreter_check(check) -> None:
    """``check(runtime) -> str | None`` for runtimes with an ``@INTERPRETER``."""
    global _interpreter_check
    _interpreter_check = check


def _loop_value(text: str):
    """``loop.NAME=VALUE``: true/false, integers and decimals become Python values."""
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][0-9A-Za-z.!_-]*)$")


def _pins(ident: str, tokens: list[str], interpreter: str | None) -> tuple:
    """``+DIST==VERSION`` parts -> sorted ("dist==version", ...), names normalized
    (lower case, runs of ``-_.`` as ``-``) so one pin has one spelling."""
    out = {}
    for token in (t.strip() for t in tokens):
        m = _PIN.match(token)
        if not m:
            raise UsageError(f"runtime {ident}: bad pin {token!r}; a pin is +DIST==VERSION, an "
                             f"exact release, e.g. {ident}@3.11+uvloop==0.22.1")
        name = re.sub(r"[-_.]+", "-", m.group(1)).lower()
        if name in out:
            raise UsageError(f"runtime {ident}: {name} is pinned twice")
        out[name] = f"{name}=={m.group(2)}"
    if out and interpreter is None:
        raise UsageError(f"runtime {ident}: a pin (+{next(iter(out.values()))}) is installed in "
                         f"a built environment, so it needs an interpreter: e.g. "
                         f"{ident}@3.11+{next(iter(out.values()))}")
    return tuple(sorted(out.values()))


def _interpreter_token(ident: str, token: str) -> str:
    token = token.strip()
    if not token:
        raise UsageError(f"runtime {ident}: '@' needs an interpreter: a version like "
                         f"{ident}@3.12 or a path like {ident}@/usr/bin/python3.12")
    if "/" in token or token.startswith("~"):
        return os.path.abspath(os.path.expanduser(token))
    parts = token.split(".")
    if not (2 <= len(parts) <= 3 and all(p.isdigit() for p in parts)):
        raise UsageError(f"runtime {ident}: bad interpreter {token!r}; give a version X.Y or "
                         "X.Y.Z (e.g. 3.12) or a path to a python executable")
    return token


# ---------------------------------------------------------------------------
# A parsed runtime: info plus option values.

@dataclass
class Runtime:
    info: RuntimeInfo
    options: dict = field(default_factory=dict)
    #: ``@VERSION`` or ``@PATH`` from the spec (a path made absolute), or None:
    #: the interpreter looplab itself runs in.
    interpreter: str | None = None
    #: ``loop.NAME=VALUE`` options: keyword arguments for the loop factory.
    loop_options: dict = field(default_factory=dict)
    #: ``+DIST==VERSION`` pins, sorted: exact releases its environment installs.
    pins: tuple = ()

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def style(self) -> str:
        return self.info.style

    @property
    def ours(self) -> bool:
        return self.info.ours

    @property
    def spec(self) -> str:
        """Canonical spec: the id plus the options that differ from their defaults."""
        changed = self.info.options.changed(self.options)
        changed += [f"loop.{k}={show(v)}" for k, v in sorted(self.loop_options.items())]
        at = f"@{self.interpreter}" if self.interpreter else ""
        at += "".join(f"+{p}" for p in self.pins)
        return self.id + at + (":" + ",".join(changed) if changed else "")

    @property
    def primary_reference(self) -> str | None:
        """The reference this runtime reproduces *as configured*: the info's
        primary reference with default options, None once an option is flipped.
        The interpreter is not an option: a kernel on 3.12 is compared with its
        reference on 3.12."""
        changed = self.info.options.changed(self.options) or self.loop_options
        return None if changed else self.info.primary_reference

    def declared_fingerprint(self) -> tuple[dict, list[str]]:
        """(declared S4 row with this runtime's option flips applied, problems)."""
        fp = self.info.fingerprint
        if fp is None:
            return {}, [f"no declared fingerprint for runtime {self.id}"]
        row, problems = fp.declared(self.options, self.info.options.defaults())
        kernel = RUNTIMES.get(_LOOP_KERNELS.get(str(self.options.get("loop")), ""))
        if self.loop_options and kernel is not None:
            if kernel.fingerprint is None:
                return row, problems + [f"no declared fingerprint for runtime {kernel.id}, "
                                        "whose kernel this loop is"]
            try:
                values = kernel.options.validate(dict(self.loop_options))
            except OptionError as exc:
                return row, problems + [f"loop options: {exc}"]
            defaults = kernel.options.defaults()
            for name, value in values.items():
                if value == defaults.get(name):
                    continue
                change = kernel.fingerprint.flip(name, value)
                if change is not None:
                    row.update(change)
                elif name not in kernel.fingerprint.neutral:
                    problems.append(f"loop.{name}={show(value)}: nothing is declared for "
                                    f"this option flip on {kernel.id}")
        return row, problems

    def unavailable_reason(self) -> str | None:
        if self.interpreter is not None and _interpreter_check is not None:
            return _interpreter_check(self)
        reason = _unavailable_reason(self.info)
        if reason is None:
            # A port may refuse a configuration here (a loop that does not import,
            # eager tasks before 3.12): ``PortClass.unavailable(options, loop_options)``.
            check = getattr(_port_class(self.info), "unavailable", None)
            if check is not None:
                reason = check(self.options, self.loop_options)
        return reason

    def available(self) -> bool:
        return self.unavailable_reason() is None

    def real_network_only(self) -> str | None:
        """None if this runtime can run on the simulated network, else one line:
        "ID runs only on the real network: REASON"."""
        why = self.info.real_network_only
        if why is None:
            check = getattr(_port_class(self.info), "real_network_only", None)
            why = check(self.options) if check is not None else None
        return None if why is None else f"{self.spec} runs only on the real network: {why}"

    def open(self, **overrides):
        """A fresh port (a new loop or kernel). The caller must ``close()`` it."""
        reason = self.unavailable_reason()
        if reason:
            raise Unavailable(f"runtime {self.id} is unavailable: {reason}")
        if self.info.real_network_only is not None and _on_simulated_network():
            raise Unavailable(self.real_network_only())
        opts = dict(self.options)
        if overrides:
            try:
                opts = self.info.options.validate({**opts, **overrides})
            except OptionError as exc:
                raise _usage_from(self.info, exc) from None
        return _port_class(self.info)(self, opts)


def _on_simulated_network() -> bool:
    from protocols import simports
    return simports.sim_io() is not None


def _usage_from(info: RuntimeInfo, exc: OptionError) -> UsageError:
    message = str(exc)
    prefix = f"{info.options.owner}: "
    if message.startswith(prefix):
        message = message[len(prefix):]
    return UsageError(f"runtime {info.id}: {message}")


def on_interpreter(spec: str, python: str | None) -> str:
    """``spec`` pinned to interpreter ``python``: the ``@`` goes after the id and
    before any ``:options`` (``coro:spawn=eager`` on 3.13 is
    ``coro@3.13:spawn=eager``). None leaves ``spec`` as it is."""
    if python is None:
        return spec
    rid, sep, options = spec.partition(":")
    return f"{rid}@{python}{sep}{options}"


def parse(spec: str) -> Runtime:
    """``ID[@INTERPRETER[+DIST==VERSION...]][:OPT=VALUE,...]`` -> Runtime. Unknown ids,
    unknown options, bad values, a malformed interpreter or pin raise one UsageError
    naming the runtime and the valid choices. ``loop.NAME=VALUE`` options go to
    ``loop_options``; pins to ``pins``."""
    if not isinstance(spec, str):
        raise UsageError(f"a runtime spec is text like 'coro:spawn=eager', not {type(spec).__name__}")
    head, _, rest = spec.strip().partition(":")
    # pins follow the interpreter (ID@3.11+uvloop==0.22.1); a '+' before any '@' is part
    # of the id (a traced twin: ID+trace, or ID+trace@3.12)
    ident, at, interp = head.partition("@")
    interp, *pin_tokens = interp.split("+") if at else ("",)
    if not at and "+" in ident:
        base, _, tail = ident.partition("+")
        if any(_PIN.match(t.strip()) for t in tail.split("+")):
            raise UsageError(f"runtime {base}: a pin (+{tail}) is installed in a built "
                             f"environment, so it needs an interpreter: e.g. {base}@3.11+{tail}")
    info = get(ident)
    interpreter = _interpreter_token(ident, interp) if at else None
    pins = _pins(ident, pin_tokens, interpreter)
    plain, loop_options = [], {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        name, eq, value = item.partition("=")
        if name.strip().startswith("loop."):
            key = name.strip()[len("loop."):]
            if not (eq and key.isidentifier()):
                raise UsageError(f"runtime {ident}: a loop option is written loop.NAME=VALUE, "
                                 f"not {item!r}")
            loop_options[key] = _loop_value(value.strip())
        else:
            plain.append(item)
    try:
        options = info.options.parse(",".join(plain))
    except OptionError as exc:
        raise _usage_from(info, exc) from None
    alias = _LOOP_ALIASES.get((info.id, str(options.get("loop"))))
    if alias is not None:
        info = get(alias)
        rest_items = [p for p in plain if p.partition("=")[0].strip() != "loop"]
        try:
            options = info.options.parse(",".join(rest_items))
        except OptionError as exc:
            raise _usage_from(info, exc) from None
    if loop_options and "loop" not in info.options.names() and alias is None:
        raise UsageError(f"runtime {ident} takes no loop, so no loop.NAME options "
                         "(asyncio's runtimes do: loop=NAME or loop=MODULE:FACTORY)")
    return Runtime(info, options, interpreter, loop_options, pins)


def parse_list(text: str | None, default: list[str] | None = None) -> list[Runtime]:
    """A comma list of runtime specs. Options are joined to their runtime with ``:`` and
    separated by ``,``, so runtimes are split where a token starts with a known id;
    ``all`` and ``ours`` expand."""
    if not text:
        return [parse(s) for s in (default or list(RUNTIMES))]
    specs: list[str] = []
    for token in (t.strip() for t in text.split(",") if t.strip()):
        head = token.partition(":")[0].partition("@")[0].partition("+")[0]
        if token == "all":
            specs.extend(RUNTIMES)
        elif token == "ours":
            specs.extend(rid for rid, info in RUNTIMES.items() if info.ours)
        elif head in RUNTIMES or "=" not in token or not specs:
            specs.append(token)
        else:
            specs[-1] += ("," if ":" in specs[-1] else ":") + token
    return [parse(s) for s in specs]


def ordered() -> list[str]:
    """Every listed runtime id, each runtime that names references followed by them
    (``callback, asyncio-protocol, uvloop-protocol, hybrid, ...``), then the rest in
    registration order: the column order of comparison tables. Variants (a traced
    twin) are left out."""
    out: list[str] = []
    for info in RUNTIMES.values():
        if info.variant_of is None and info.compared_with:
            out += [r for r in (info.id, *info.compared_with) if r in RUNTIMES and r not in out]
    return out + [rid for rid, info in RUNTIMES.items()
                  if info.variant_of is None and rid not in out]


def available_runtimes(runtimes: list[Runtime] | None = None) -> tuple[list[Runtime], dict[str, str]]:
    """Split into (available, {spec: reason unavailable})."""
    ok, missing = [], {}
    for rt in runtimes if runtimes is not None else parse_list(None):
        reason = rt.unavailable_reason()
        if reason:
            missing[rt.spec] = reason
        else:
            ok.append(rt)
    return ok, missing


# ---------------------------------------------------------------------------
# Discovery

def _register_returned(result) -> None:
    """An entry point's callable may return RuntimeInfo objects instead of registering."""
    if isinstance(result, RuntimeInfo):
        result = [result]
    if isinstance(result, (list, tuple)):
        for info in result:
            if isinstance(info, RuntimeInfo) and RUNTIMES.get(info.id) is not info:
                register(info)


def _load_module(name: str) -> None:
    if name in _loaded_modules:
        return
    # A user names a module of their checkout, as ``python -m`` would find it; the
    # console scripts don't put the current directory on sys.path, so we do (last,
    # so it never shadows an installed package). Cell processes share the cwd.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
    with _origin(f"module {name}"):
        try:
            importlib.import_module(name)
        except UsageError:
            raise
        except Exception as exc:
            raise UsageError(f"runtime module {name!r} does not import: "
                             f"{type(exc).__name__}: {exc}") from None
    _loaded_modules.append(name)


def load_plugins(modules=()) -> list[str]:
    """Import each module in ``modules`` (an iterable or a comma list), once;
    each registers its runtimes. A module that does not import, or registers a
    clashing id, raises one UsageError. Returns ``plugin_modules()``."""
    if isinstance(modules, str):
        modules = modules.split(",")
    for name in (m.strip() for m in modules):
        if name:
            _load_module(name)
    return plugin_modules()


def plugin_modules() -> list[str]:
    """Every runtime module loaded by name so far (environment variable and
    ``load_plugins``), in load order: what a fresh process must load to see the
    same runtimes (installed entry points load there by themselves)."""
    return list(_loaded_modules)


def plugin_errors() -> list[str]:
    """One line per entry point or environment-variable module that failed to
    load when this module was imported."""
    return list(_plugin_errors)


def _entry_points():
    from importlib.metadata import entry_points
    return entry_points(group=ENTRY_POINT_GROUP)


def _load_entry_points() -> None:
    try:
        eps = list(_entry_points())
    except Exception as exc:          # a broken distribution's metadata
        _plugin_errors.append(f"entry points {ENTRY_POINT_GROUP}: {type(exc).__name__}: {exc}")
        return
    for ep in eps:
        dist = getattr(getattr(ep, "dist", None), "name", None) or "?"
        origin = f"entry point {ep.name} ({dist})"
        try:
            with _origin(origin):
                obj = ep.load()
                if callable(obj) and not isinstance(obj, type(sys)):
                    _register_returned(obj())
        except Exception as exc:
            _plugin_errors.append(f"{origin}: {type(exc).__name__}: {exc}")


def _load_env() -> None:
    for name in filter(None, (m.strip() for m in os.environ.get(ENV_VAR, "").split(","))):
        try:
            _load_module(name)
        except UsageError as exc:
            _plugin_errors.append(f"{ENV_VAR}: {exc}")


# ---------------------------------------------------------------------------

def bind_listener(host: str = "127.0.0.1", port: int = 0, sockbuf: int | None = None,
                  backlog: int = 128) -> socket.socket:
    """A listening TCP socket. ``sockbuf`` pins SO_SNDBUF/SO_RCVBUF, which accepted
    sockets inherit on Linux. A port in use raises OSError (EADDRINUSE)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if sockbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sockbuf)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, sockbuf)
        sock.bind((host, port))
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock


_discovered = False


def discover() -> None:
    """Load the entry points and the environment variable's modules, once. The
    package ``protocols`` calls it after registering the built-ins, so a plugin
    cannot take their ids."""
    global _discovered
    if not _discovered:
        _discovered = True
        _load_entry_points()
        _load_env()
