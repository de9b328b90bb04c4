"""Kernel options: the one schema type every kernel validates with and the CLI reads.

Each of looplab's kernels exposes its design choices as options whose defaults
reproduce a reference library, so a user can flip one choice at a time. A kernel
declares its options once, as a ``Schema`` of ``Option`` rows; everything else
(the kernel constructor, ``looplab list runtimes``, the runtime spec parser, the
docs) reads that one declaration. A bad option always fails the same way: an
``OptionError`` (a ``ValueError``) whose message names the owner, the option and
the values it accepts.

Values arrive in two shapes: Python values from code (``Loop(high_water=0)``) and
text from a runtime spec (``callback:high_water=64KiB``). ``Schema.validate``
takes the first, ``Schema.parse`` the second; both end in the same checks.

Standard library only, and no imports from the rest of looplab: this is a leaf.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

__all__ = ["Option", "Schema", "OptionError", "nbytes", "boolean", "choice", "integer",
           "EXIT", "TRACE"]


class OptionError(ValueError):
    """A kernel option that does not exist or has a value it does not accept."""


# ---------------------------------------------------------------------------
# Value parsers. Each takes the option's value -- text from a spec, or a Python
# value from code -- and returns the canonical value or raises ValueError with a
# short phrase saying what it accepts ("must be ...").

def nbytes(value) -> int:
    """A byte count >= 0: 65536, "64KiB", "64k", "1MiB"."""
    if isinstance(value, bool):
        raise ValueError("must be a number of bytes (e.g. 65536 or 64KiB)")
    if isinstance(value, int):
        n = value
    else:
        text = str(value).strip().lower()
        mult = 1
        for suffix, m in (("kib", 1024), ("mib", 1 << 20), ("k", 1024), ("m", 1 << 20)):
            if text.endswith(suffix):
                text, mult = text[: -len(suffix)], m
                break
        try:
            n = int(text) * mult
        except ValueError:
            raise ValueError("must be a number of bytes (e.g. 65536 or 64KiB)") from None
    if n < 0:
        raise ValueError("must be >= 0")
    return n
nbytes.values = "bytes"


def boolean(value) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError("must be true or false")
boolean.values = "true|false"


def integer(value) -> int:
    if isinstance(value, bool):
        raise ValueError("must be an integer")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError("must be an integer") from None
integer.values = "int"


def choice(*values: str) -> Callable:
    """One of fixed words."""
    def parse_choice(value) -> str:
        if value not in values:
            raise ValueError("must be one of " + "|".join(values))
        return value
    parse_choice.values = "|".join(values)
    return parse_choice


@dataclass(frozen=True)
class Option:
    name: str
    default: object
    parse: Callable          # value (text or Python) -> canonical value, or ValueError
    help: str

    @property
    def values(self) -> str:
        """How the value is written, for help text: ``true|false``, ``bytes`` ..."""
        return getattr(self.parse, "values", "")

    def describe(self) -> str:
        kind = f" ({self.values})" if self.values else ""
        return f"{self.name}={show(self.default)}{kind} {self.help}"


def show(value) -> str:
    """An option value as a spec writes it (``true``, not ``True``)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


@dataclass(frozen=True)
class Schema:
    """The options of one kernel (or port). ``check`` is a rule across options:
    it receives the full values and the names the caller gave, may adjust
    derived values in place, and raises ValueError when the combination is bad."""
    owner: str
    options: tuple[Option, ...]
    check: Callable[[dict, set], None] | None = None

    def __post_init__(self):
        # given options -> the values ``validate`` made of them: every loop a
        # kernel builds validates its options, and a process that builds
        # thousands (an exploration's schedules) asks for the same few sets
        object.__setattr__(self, "_valid", {})

    def __iter__(self):
        return iter(self.options)

    def names(self) -> list[str]:
        return [o.name for o in self.options]

    def defaults(self) -> dict:
        return {o.name: o.default for o in self.options}

    def extend(self, owner: str, extra: Iterable[Option], check=None) -> "Schema":
        """A schema with more options (a kernel built on another's options)."""
        extra = tuple(extra)
        added = {o.name for o in extra}
        base = tuple(o for o in self.options if o.name not in added)
        return Schema(owner, base + extra, check or self.check)

    def _error(self, message: str) -> OptionError:
        return OptionError(f"{self.owner}: {message}")

    def validate(self, given: Mapping[str, object]) -> dict:
        """Full option values from ``given`` (text or Python values), defaults for
        the rest. Unknown names and bad values raise OptionError."""
        try:
            # the type too: 1 == 1.0 == True, but they need not parse alike
            key = tuple((name, type(raw), raw) for name, raw in given.items())
            seen = self._valid.get(key)
        except TypeError:          # an unhashable value: validated every time
            key = seen = None
        if seen is not None:
            return dict(seen)      # the caller's own copy (the values are immutable)
        values = self._validate(given)
        if key is not None and len(self._valid) < 256:
            self._valid[key] = dict(values)
        return values

    def _validate(self, given: Mapping[str, object]) -> dict:
        by_name = {o.name: o for o in self.options}
        values = self.defaults()
        for name, raw in given.items():
            opt = by_name.get(name)
            if opt is None:
                raise self._error(f"unknown option {name!r}; valid options: "
                                  f"{', '.join(by_name) or 'none'}")
            try:
                values[name] = opt.parse(raw)
            except ValueError as exc:
                raise self._error(f"bad value {show(raw)!r} for option {name}: {exc}") from None
        if self.check is not None:
            try:
                self.check(values, set(given))
            except ValueError as exc:
                raise self._error(str(exc)) from None
        return values

    def parse(self, text: str) -> dict:
        """``"a=1,b=x"`` (the part of a runtime spec after the colon) -> full values."""
        given: dict[str, str] = {}
        for item in filter(None, (p.strip() for p in text.split(","))):
            name, eq, value = item.partition("=")
            if not eq:
                if name not in {o.name for o in self.options}:
                    raise self._error(f"unknown option {name!r}; valid options: "
                                      f"{', '.join(self.names()) or 'none'}")
                raise self._error(f"option {name!r} needs a value: {name}=VALUE")
            given[name.strip()] = value.strip()
        return self.validate(given)

    def changed(self, values: Mapping[str, object]) -> list[str]:
        """``name=value`` for each value that differs from its default."""
        return [f"{o.name}={show(values[o.name])}" for o in self.options
                if o.name in values and values[o.name] != o.default]

    def describe(self) -> list[str]:
        return [o.describe() for o in self.options]


# Options every one of our kernels has.
EXIT = Option("exit", "cancel", choice("cancel", "wait", "raise"),
              "what run(main) does with leftover tasks and unsent bytes when main returns")
TRACE = Option("trace", False, boolean, "record Chrome trace events")
