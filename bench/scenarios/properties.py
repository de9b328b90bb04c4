"""Declared properties of a target, beyond its verdicts: ``always``,
``eventually`` and ``sometimes`` (``looplab explore``, docs/explore.md).

A scenario (``Scenario(properties=...)``), a zoo entry (its scenario) and a
program of ``bench.explore.bugs`` (``Bug(properties=...)``) declare them::

    from bench.scenarios.api import always, eventually, observe, sometimes

    properties=(
        always("delivered <= written",
               lambda s: s.received("reader") <= s.app.get("written_bytes", 0)),
        sometimes("the drain waiter is parked", lambda s: s.app.get("drain_parked"),
                  variants=("drain",)),
        eventually("the reader saw EOF", lambda s: s.ended("reader") == "eof", within_s=8.0),
    )

Each predicate gets the explorer's view of the run (``bench.explore.checks.Watch``):
``s.now`` (virtual seconds), ``s.app`` (what the program or app published with
``observe``), ``s.received(peer)``, ``s.sent(peer)``, ``s.ended(peer)`` for a
cell's peers, ``s.params``, ``s.variant``, ``s.runtime`` and ``s.world``.

``observe(**values)`` is how the code under test shows its state: it updates
``s.app`` and, while an exploration watches, checks the properties at that
moment too (a transient state between two choice points is seen). With nobody
watching it costs one test, and outside the simulated network nobody does.

Standard library only: scenario files and programs import this from below
every other layer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

__all__ = ["Property", "always", "eventually", "sometimes", "observe", "KINDS"]

KINDS = ("always", "eventually", "sometimes")


@dataclass(frozen=True)
class Property:
    """One declared property. ``within_s`` (eventually only): virtual seconds
    from the run's start, a number or ``within_s(params) -> seconds``.
    ``variants``, ``styles``: the variants and port styles (callback, stream,
    task) it is declared for (empty: every one)."""
    kind: str
    name: str
    predicate: Callable
    within_s: object = None
    variants: tuple = ()
    styles: tuple = ()

    def problem(self) -> str | None:
        if self.kind not in KINDS:
            return f"property kind from {', '.join(KINDS)} (got {self.kind!r})"
        if not isinstance(self.name, str) or not self.name:
            return f"a {self.kind} property needs a name"
        if not callable(self.predicate):
            return f"property {self.name!r}: the predicate must be callable"
        if self.kind == "eventually":
            w = self.within_s
            if not (callable(w) or (isinstance(w, (int, float)) and not isinstance(w, bool)
                                    and w > 0)):
                return f"property {self.name!r}: within_s must be seconds > 0 or a function"
        return None

    def applies(self, variant: str, style: str | None = None) -> bool:
        return ((not self.variants or variant in self.variants)
                and (not self.styles or style is None or style in self.styles))

    def deadline(self, params) -> float:
        w = self.within_s
        return float(w(params) if callable(w) else w)


def always(name: str, predicate: Callable, *, variants=(), styles=()) -> Property:
    """``predicate(s)`` holds at every step of every explored schedule."""
    return Property("always", name, predicate, None, tuple(variants), tuple(styles))


def eventually(name: str, predicate: Callable, within_s, *, variants=(), styles=()) -> Property:
    """``predicate(s)`` holds at some step by virtual time ``within_s``."""
    return Property("eventually", name, predicate, within_s, tuple(variants), tuple(styles))


def sometimes(name: str, predicate: Callable, *, variants=(), styles=()) -> Property:
    """``predicate(s)`` holds at some step of at least one explored schedule.
    Never reached, the exploration is vacuous for it: not a proof."""
    return Property("sometimes", name, predicate, None, tuple(variants), tuple(styles))


# What the code under test shows (``observe``), and who watches (the explorer's
# recorder of the run now going; one at a time, as sim cells run one at a time).
STATE: dict = {}
_watcher: list = [None]


def observe(**values) -> None:
    """Publish ``values`` to the declared properties (``s.app``); while an
    exploration watches, the properties are checked now as well."""
    w = _watcher[0]
    if w is None:
        return
    STATE.update(values)
    w()


def watch(check) -> None:
    """Start a run's watch (``STATE`` emptied, ``check()`` called at each
    ``observe``), or end it (None: nobody watches; ``STATE`` is kept for the
    run's last check)."""
    if check is not None:
        STATE.clear()
    _watcher[0] = check
