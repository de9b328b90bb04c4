"""Declared S4 fingerprints: the row of causality facts a runtime promises.

A runtime declares what its calls have done by the time they return (did a
spawned child run, how many bytes stay in user space after a big write, when
is a closed connection closed ...). The lab's causality scenario (S4) measures the same
row through the port API and compares the two, so the declaration is a claim that a
test can hold a runtime to. It lives on the runtime (the registry's ``fingerprint`` field)
because it is part of what the runtime *is*, like its options.

A declared value is a plain value (booleans and None compared by identity,
numbers by ``==``) or a tolerance from this module: ``Near``, ``Between``,
``Positive``. A frequency is never declared as an exact number.

``Fingerprint.flips`` says what changing one option does: keys are
``"option=value"`` (``fnmatch`` patterns, so ``ready_order=random-*`` stands
for every seed), values the metrics that change and their new declaration.
``neutral`` names the options declared to touch no metric at all. Any other
non-default option is reported as undeclared, never silently passed.

A leaf: imports nothing from looplab.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Mapping

__all__ = ["Fingerprint", "Near", "Between", "Positive", "satisfies", "NONBLOCKING_SENDS"]

# The S4 turn-count probe does this many small sends that never block; a
# runtime whose every I/O call is a schedule point lets another task run ~once per send.
NONBLOCKING_SENDS = 2000


class Near:
    """A number within ``tol`` of ``value`` (inclusive)."""

    def __init__(self, value: float, tol: float):
        self.value, self.tol = value, tol

    def ok(self, v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v - self.value) <= self.tol

    def __repr__(self):
        return f"{self.value}±{self.tol}"


class Between:
    """A number strictly between ``lo`` and ``hi``."""

    def __init__(self, lo: float, hi: float):
        self.lo, self.hi = lo, hi

    def ok(self, v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and self.lo < v < self.hi

    def __repr__(self):
        return f"strictly between {self.lo} and {self.hi}"


class Positive:
    """A byte count above zero: for buffered bytes only "some", "none" (0) and
    "not applicable" (None) are declared; the exact figure depends on the
    machine's socket buffers."""

    def ok(self, v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v > 0

    def __repr__(self):
        return "> 0"


def satisfies(expected, v) -> bool:
    """Does measured value ``v`` meet declaration ``expected`` (a plain value --
    booleans and None by identity, numbers by ==, never True == 1 -- or a
    tolerance with ``ok``)?"""
    if hasattr(expected, "ok"):
        return expected.ok(v)
    if isinstance(expected, bool) or expected is None:
        return v is expected
    if isinstance(expected, (int, float)):
        return isinstance(v, (int, float)) and not isinstance(v, bool) and v == expected
    return v == expected


def _show(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


@dataclass(frozen=True)
class Fingerprint:
    """One runtime's declared S4 row, and what its option flips change."""
    row: Mapping[str, object]
    flips: Mapping[str, Mapping[str, object]] = field(default_factory=dict)
    neutral: frozenset = frozenset()

    def flip(self, name: str, value) -> Mapping[str, object] | None:
        """The declared change for option ``name`` set to ``value``: a dict of
        metrics (possibly empty), or None when nothing is declared for it."""
        key = f"{name}={_show(value)}"
        for pattern, change in self.flips.items():
            if fnmatchcase(key, pattern):
                return change
        return None

    def declared(self, values: Mapping[str, object], defaults: Mapping[str, object]
                 ) -> tuple[dict, list[str]]:
        """The row for a runtime with option ``values``: the base row with the
        flips of every non-default option applied. Returns (row, problems); an
        option that is changed but neither flipped nor neutral is a problem."""
        row = dict(self.row)
        problems = []
        for name, value in values.items():
            if name in defaults and value == defaults[name]:
                continue
            change = self.flip(name, value)
            if change is not None:
                row.update(change)
            elif name not in self.neutral:
                problems.append(f"{name}={_show(value)}: nothing is declared for this option flip")
        return row, problems

    def flip_specs(self, runtime_id: str) -> list[str]:
        """One runtime spec per declared flip (a pattern's ``*`` becomes ``1``),
        for tests that check each flip changes what it claims."""
        return [f"{runtime_id}:{pattern.replace('*', '1')}" for pattern in self.flips]
