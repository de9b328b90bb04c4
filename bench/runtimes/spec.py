"""A runtime spec, parsed once: ``ID[@INTERPRETER[+DIST==VERSION...]][:OPT=VALUE,...]``.

``parse(spec)`` turns text such as ``coro:ready_order=random-7``,
``asyncio-streams@3.12:loop=uvloop,eager=true``, ``uvloop-streams@3.11+uvloop==0.22.1``
or ``trio@/opt/py/bin/python3.13`` into one ``Runtime``: the registered
``RuntimeInfo`` plus everything the spec adds --

* ``options``: every option's value (the schema's defaults, then the spec's);
* ``interpreter``: ``@X.Y[.Z]`` or ``@PATH`` (made absolute), the Python its cells
  run in (``bench.host.envs`` finds it and builds the environment), or None for
  looplab's own;
* ``pins``: ``+DIST==VERSION``, exact releases that environment installs (a pin
  needs an interpreter);
* ``loop_options``: ``loop.NAME=VALUE``, keyword arguments for an asyncio port's
  loop factory (``loop=...``).

That object is what travels: a child process gets ``runtime.to_data()`` and
rebuilds it with ``from_data`` -- no second parse of the text. ``Runtime.open()``
constructs a fresh port as ``PortClass(runtime, options)``. Every user mistake
-- an unknown id, option or value, a bad interpreter or pin -- is one
``UsageError`` whose message names the runtime and lists what is valid.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from bench.errors import UsageError
from bench.runtimes import registry
from bench.runtimes.registry import RuntimeInfo
from kernels.options import OptionError, show
from protocols.errors import Unavailable

__all__ = ["Runtime", "parse", "parse_list", "from_data", "on_interpreter", "ordered",
           "available_runtimes", "dist_name", "as_runtime"]

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
    #: "all" or "ours" when ``parse_list`` expanded it from that word; None when the
    #: user named it (so a named runtime that is missing is an error, an expanded one
    #: a skip). Not part of the spec.
    expanded_from: str | None = field(default=None, compare=False)

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
        kernel = registry.loop_kernel(str(self.options.get("loop")))
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
        """Why this runtime cannot run *in this interpreter*, or None. A runtime bound
        to another interpreter (``@``) is judged there: ``bench.host.envs.unavailable_reason``."""
        reason = registry.unavailable_reason(self.info)
        if reason is None:
            # A port may refuse a configuration here (a loop that does not import,
            # eager tasks before 3.12): ``PortClass.unavailable(options, loop_options)``.
            check = getattr(registry.port_class(self.info), "unavailable", None)
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
            check = getattr(registry.port_class(self.info), "real_network_only", None)
            why = check(self.options) if check is not None else None
        return None if why is None else f"{self.spec} runs only on the real network: {why}"

    @property
    def loop(self) -> str | None:
        """The asyncio loop this runtime runs on (a name in ``protocols.asyncio_ports.LOOPS``
        or ``MODULE:FACTORY``), or None when its port is no asyncio port."""
        try:
            of = getattr(registry.port_class(self.info), "loop_of", None)
        except Exception:
            return self.options.get("loop")
        return of(self.options) if of else self.options.get("loop")

    def requirements(self) -> tuple:
        """What an environment for this runtime installs beside looplab: what its port
        needs for this configuration (a loop's distribution), then the spec's pins (a
        pin replaces an open requirement on the same distribution)."""
        try:
            needs = getattr(registry.port_class(self.info), "requirements", None)
        except Exception:
            needs = None
        reqs = tuple(needs(self.options)) if needs else ()
        pinned = {dist_name(p) for p in self.pins}
        return tuple(r for r in reqs if dist_name(r) not in pinned) + tuple(self.pins)

    def to_data(self) -> dict:
        """The parsed spec as plain data, for a child process (``from_data``)."""
        return {"id": self.id, "options": dict(self.options), "interpreter": self.interpreter,
                "loop_options": dict(self.loop_options), "pins": list(self.pins)}

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
        return registry.port_class(self.info)(self, opts)


def from_data(data: dict) -> Runtime:
    """The ``Runtime`` that ``to_data()`` described, rebuilt without parsing text (the
    option values are validated against the schema again)."""
    info = registry.get(data["id"])
    try:
        options = info.options.validate(dict(data.get("options") or {}))
    except OptionError as exc:
        raise _usage_from(info, exc) from None
    return Runtime(info, options, data.get("interpreter"), dict(data.get("loop_options") or {}),
                   tuple(data.get("pins") or ()))


def as_runtime(runtime) -> Runtime:
    """``runtime`` itself when it is already parsed, else ``parse(runtime)``: for the
    functions that take either, so a parsed spec is never parsed again."""
    return runtime if isinstance(runtime, Runtime) else parse(runtime)


def dist_name(req: str) -> str:
    """A requirement's distribution name, normalized as pins are."""
    return re.sub(r"[-_.]+", "-", re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0]).lower()


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
    info = registry.get(ident)
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
    alias = registry.loop_alias(info.id, str(options.get("loop")))
    if alias is not None:
        info = registry.get(alias)
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
    ``all`` and ``ours`` expand (and mark what they expanded: ``expanded_from``)."""
    if text is None:
        return [_expanded(parse(s), "all") for s in (default or list(registry.RUNTIMES))]
    if not text.replace(",", "").strip():     # --runtimes '': a mistake, not "every runtime"
        raise UsageError("--runtimes is empty: name at least one (e.g. coro,trio), or all, "
                         "or leave the option out")
    specs: list[tuple[str, str | None]] = []
    for token in (t.strip() for t in text.split(",") if t.strip()):
        head = token.partition(":")[0].partition("@")[0].partition("+")[0]
        if token == "all":
            specs.extend((rid, "all") for rid in registry.RUNTIMES)
        elif token == "ours":
            specs.extend((rid, "ours") for rid, info in registry.RUNTIMES.items() if info.ours)
        elif head in registry.RUNTIMES or "=" not in token or not specs:
            specs.append((token, None))
        else:
            spec, how = specs[-1]
            specs[-1] = (spec + ("," if ":" in spec else ":") + token, how)
    return [_expanded(parse(s), how) for s, how in specs]


def _expanded(rt: Runtime, how: str | None) -> Runtime:
    rt.expanded_from = how
    return rt


def ordered() -> list[str]:
    """Every listed runtime id, each runtime that names references followed by them
    (``callback, asyncio-protocol, uvloop-protocol, hybrid, ...``), then the rest in
    registration order: the column order of comparison tables. Variants (a traced
    twin) are left out."""
    out: list[str] = []
    for info in registry.RUNTIMES.values():
        if info.variant_of is None and info.compared_with:
            out += [r for r in (info.id, *info.compared_with) if r in registry.RUNTIMES and r not in out]
    return out + [rid for rid, info in registry.RUNTIMES.items()
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
# The two axes a spec adds: the interpreter (``@``, with ``+`` pins) and the loop's keywords.

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
