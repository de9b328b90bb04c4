"""Plugins: how a user's code joins the lab, the same way for every registry.

Two registries take plugins -- runtimes (``bench.runtimes``) and scenarios
(``bench.scenarios``) -- and both find them the same ways: an entry point of an
installed distribution (group ``looplab.runtimes`` or ``looplab.scenarios``), a
module the user names (``--runtime-module``, ``--scenario-module``, the
``LOOPLAB_RUNTIME_MODULES`` variable) and, for scenarios, a file
(``--scenario-file``). A module named by the user is found from the current
directory, as ``python -m`` would find it.

One rule for failures, whatever the source: a plugin that does not load is one
``UsageError`` naming it and why (the command stops, exit 2). A plugin is code
the user asked for; carrying on without it would measure something else.

What a process loaded by name is what its children must load first, so they see
the same runtimes and scenarios (``bench.scenarios.context.plugin_spec``).
"""
from __future__ import annotations

import importlib
import os
import sys
from contextlib import contextmanager

from bench.errors import UsageError

__all__ = ["import_module", "entry_points", "load_entry_point", "env_modules", "origin",
           "current_origin"]

_origins: list[str] = []


@contextmanager
def origin(text: str):
    """Everything registered inside the block came from ``text`` (``module X``,
    ``entry point NAME (DIST)``, ``file PATH``, ``builtin``)."""
    _origins.append(text)
    try:
        yield
    finally:
        _origins.pop()


def current_origin(default: str = "") -> str:
    return _origins[-1] if _origins else default


def import_module(name: str, what: str):
    """Import the module ``name`` that the user named as a ``what`` ("runtime
    module", "scenario module"). A module that does not import is one UsageError;
    a UsageError it raises itself (a clashing id) passes through."""
    # The console scripts don't put the current directory on sys.path; a user names
    # a module of their checkout as ``python -m`` would find it (last, so it never
    # shadows an installed package). Child processes share the cwd.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
    with origin(f"module {name}"):
        try:
            return importlib.import_module(name)
        except UsageError as exc:
            raise UsageError(f"{what} {name}: {exc}") from None
        except Exception as exc:
            raise UsageError(f"{what} {name!r} does not import: {type(exc).__name__}: {exc}") \
                from None


def entry_points(group: str) -> list:
    """The entry points of ``group`` in the installed distributions."""
    from importlib.metadata import entry_points as _eps
    try:
        return list(_eps(group=group))
    except Exception as exc:          # a broken distribution's metadata
        raise UsageError(f"entry points {group}: {type(exc).__name__}: {exc}") from None


def entry_point_origin(ep) -> str:
    dist = getattr(getattr(ep, "dist", None), "name", None) or ep.value
    return f"entry point {ep.name} ({dist})"


def load_entry_point(ep, call: bool = False):
    """The object an entry point names (called, if ``call`` and it is a function),
    loaded with its origin set. One UsageError if it fails."""
    where = entry_point_origin(ep)
    with origin(where):
        try:
            obj = ep.load()
            if call and callable(obj) and not isinstance(obj, type(sys)):
                obj = obj()
            return obj
        except UsageError as exc:
            raise UsageError(f"{where}: {exc}") from None
        except Exception as exc:
            raise UsageError(f"{where}: {type(exc).__name__}: {exc}") from None


def env_modules(var: str) -> list[str]:
    """The comma list of module names in the environment variable ``var``."""
    return [m.strip() for m in os.environ.get(var, "").split(",") if m.strip()]
