"""Upstream threads about the divergences the loop probes find: a data file
(``threads.json``, beside this module) that says, per probe and loop, which issue
threads were read and when the search was made, so a report never claims more than
was checked. ``line(probe, loop)`` is what the reports print: ``thread: uvloop#482``,
``none found, searched: 2026-11-28`` or ``not searched``.
"""
from __future__ import annotations

import functools
import json
import os

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "threads.json")

#: repositories shown by a short name in the reports
_SHORT = {"MagicStack/uvloop": "uvloop", "python/cpython": "cpython"}


@functools.lru_cache(maxsize=1)
def data() -> dict:
    with open(PATH, encoding="utf-8") as f:
        return json.load(f)


def entry(probe: str, loop: str | None) -> dict | None:
    """The record for a divergence of ``probe`` on ``loop``: its own, else the loop's
    (a search that covered every probe on that loop), else None (not searched)."""
    d = data()
    own = (d.get("probes", {}).get(probe) or {}).get(loop or "")
    return own if own is not None else d.get("loops", {}).get(loop or "")


def short(thread: str) -> str:
    repo, _, num = thread.partition("#")
    return f"{_SHORT.get(repo, repo)}#{num}"


def url(thread: str) -> str:
    repo, _, num = thread.partition("#")
    return f"https://github.com/{repo}/issues/{num}"


def line(probe: str, loop: str | None) -> str:
    """``thread: uvloop#482, uvloop#704`` (``related:`` for a thread about the same
    cause), ``none found, searched: DATE`` or ``not searched``."""
    e = entry(probe, loop)
    if e is None:
        return "not searched"
    if not e.get("threads"):
        return f"none found, searched: {e.get('searched', '?')}"
    label = "related" if e.get("related") else "thread"
    return f"{label}: {', '.join(short(t) for t in e['threads'])}"
