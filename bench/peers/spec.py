"""The peer registry and the spec checks both sides of the peer process run.

``ROLES`` is the one table of roles (name -> ``bench.peers.core.Role``
subclass): the built-in ones (``bench/peers/roles.py``) and any a user
registers with ``register_role``. A peer spec is a list of role dicts
(``bench.peers.sink(...)``, ...). The parent (``PeerProcess``) checks it before
it spawns anything, and the child (``bench/peers/child.py``) checks it again,
with the same code, from here.
"""
from __future__ import annotations

import math
import sys

from bench.peers.core import REQUIRED, Role
from bench.peers.roles import BUILTIN

__all__ = ["ROLES", "register_role", "role_origin", "check_role", "check_spec"]

_MAX_CHUNK = 64 * 1024 * 1024  # largest recv/chunk size a spec may ask for
_FRAME_HEADER_BYTES = 24     # protocols.cores.FRAME_HEADER_BYTES, checked without importing it
_GRACE_S = 3.0               # how much longer than timeout_s the parent waits for results

_COMMON = {"name": None, "role": None, "listen": None, "connect": None, "sockbuf": None,
           "max_s": None, "deferred": False}


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _addr(field, v):
    """None, "host:port", or [host, port] / (host, port) -> [host, port]."""
    if v is None:
        return None
    if isinstance(v, str):
        host, sep, port = v.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"{field}: bad address {v!r}, expected 'HOST:PORT'")
        v = [host, int(port)]
    if not isinstance(v, (list, tuple)) or len(v) != 2:
        raise TypeError(f"{field}: an address is 'HOST:PORT' or (host, port), got {v!r}")
    host, port = v
    if not isinstance(host, str) or not host:
        raise TypeError(f"{field}: host must be a non-empty str, got {host!r}")
    if not _is_int(port) or not 0 <= port <= 65535:
        raise ValueError(f"{field}: port must be an int in 0..65535, got {port!r}")
    return [host, port]


def _int_check(low, optional):
    def check(field, v):
        if v is None and optional:
            return None
        if not _is_int(v):
            raise TypeError(f"{field} must be an int{' or None' if optional else ''}, got {v!r}")
        if v < low:
            raise ValueError(f"{field} must be >= {low}, got {v}")
        if low > 0 and v > _MAX_CHUNK:
            raise ValueError(f"{field} must be <= {_MAX_CHUNK}, got {v}")
        return v
    return check


def _seconds_check(positive, optional):
    def check(field, v):
        if v is None and optional:
            return None
        if not _is_num(v):
            raise TypeError(f"{field} must be a number of seconds{' or None' if optional else ''}, "
                            f"got {v!r}")
        if not math.isfinite(v) or v < 0 or (positive and v == 0):
            raise ValueError(f"{field} must be {'> 0' if positive else '>= 0'} and finite, got {v}")
        return float(v)
    return check


def _rate(field, v):
    if v is None:
        return None
    if not _is_num(v):
        raise TypeError(f"{field} must be bytes per second or None, got {v!r}")
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{field} must be > 0 and finite (None: unlimited), got {v}")
    return float(v)


def _bool(field, v):
    if not isinstance(v, bool):
        raise TypeError(f"{field} must be True or False, got {v!r}")
    return v


def _choice(*values):
    def check(field, v):
        if v not in values:
            raise ValueError(f"{field} must be one of {', '.join(map(repr, values))}, got {v!r}")
        return v
    return check


def _name(field, v):
    if not isinstance(v, str) or not v:
        raise TypeError(f"{field} must be a non-empty str, got {v!r}")
    return v


_FIELD_CHECKS = {
    "name": _name, "role": _name, "listen": _addr, "connect": _addr,
    "sockbuf": _int_check(1, True), "max_s": _seconds_check(True, False),
    "deferred": _bool, "rate_Bps": _rate,
    "recv_bytes": _int_check(1, False), "chunk_bytes": _int_check(1, False),
    "frame_bytes": _int_check(_FRAME_HEADER_BYTES, True), "verify": _bool,
    "start_after_s": _seconds_check(False, False), "stall_at_s": _seconds_check(False, False),
    "stall_s": _seconds_check(False, False), "pause_at_bytes": _int_check(0, True),
    "pause_s": _seconds_check(False, False), "close_with_reset": _bool,
    "duration_s": _seconds_check(True, True), "total_bytes": _int_check(0, True),
    "finish": _choice("shutdown", "close", "reset"), "eof_wait_s": _seconds_check(False, False),
    "warmup_s": _seconds_check(False, False), "count": _int_check(0, False),
    "hold_s": _seconds_check(False, False), "mode": _choice("healthy", "stalled"),
    "shutdown": _bool, "after_bytes": _int_check(0, True), "after_s": _seconds_check(False, True),
}


# ---------------------------------------------------------------------------
# The registry

ROLES: dict[str, type[Role]] = {}
"""Role name -> its Role class (``ROLES[name].fields``: its fields and defaults
beyond the common ``name``, ``role``, ``listen``, ``connect``, ``sockbuf``,
``max_s``, ``deferred``)."""


def register_role(cls: type[Role]) -> type[Role]:
    """Add a role (a ``Role`` subclass with ``role`` set); usable as a class
    decorator. Each of its fields needs a check: a common field name (see
    docs/peers.md) or an entry in the class's ``checks``. Registering the same
    class again, or a class of the same name from the same module (a file
    loaded again), replaces it; another module's role of that name is a
    ValueError."""
    if not (isinstance(cls, type) and issubclass(cls, Role)):
        raise TypeError(f"register_role() takes a Role subclass, got {cls!r}")
    name = cls.role
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"a role's name (its class attribute 'role') must be an identifier, "
                         f"got {name!r}")
    have = ROLES.get(name)
    if have is not None and (have.__module__, have.__qualname__) != (cls.__module__,
                                                                     cls.__qualname__):
        raise ValueError(f"role name {name!r} is taken by {have.__module__}.{have.__qualname__}")
    common = sorted(set(cls.fields) & set(_COMMON))
    if common:
        raise ValueError(f"role {name!r}: {', '.join(common)} are fields every role has; "
                         "a role cannot declare them again")
    unchecked = [f for f in cls.fields if f not in cls.checks and f not in _FIELD_CHECKS]
    if unchecked:
        raise ValueError(f"role {name!r}: no check for field(s) {', '.join(unchecked)} "
                         "(add them to the class's 'checks', or use a known field name)")
    ROLES[name] = cls
    return cls


def role_origin(name: str) -> dict | None:
    """Where the peer process finds role ``name``: None for a built-in role,
    else {"module": its module's name, "file": its file or None}."""
    cls = ROLES[name]
    if cls in BUILTIN:
        return None
    module = sys.modules.get(cls.__module__)
    return {"module": cls.__module__, "file": getattr(module, "__file__", None)}


for _cls in BUILTIN:
    register_role(_cls)


def check_role(cfg, default_max_s: float = 30.0, starting: bool = False) -> dict:
    """Check one role's spec and return it normalized: every field present,
    defaults filled in, addresses as [host, port], seconds as floats.

    Unknown roles and fields are ValueErrors that list the valid ones; a value
    of the wrong type is a TypeError, out of range a ValueError. A deferred role
    may leave its endpoint and required fields to ``start()``; ``starting=True``
    (or a role that is not deferred) demands them.
    """
    if not isinstance(cfg, dict):
        raise TypeError(f"a role spec is a dict, got {type(cfg).__name__}")
    role = cfg.get("role")
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; valid roles: {', '.join(ROLES)}")
    cls = ROLES[role]
    fields = {**_COMMON, **cls.fields}
    unknown = sorted(set(cfg) - set(fields))
    if unknown:
        raise ValueError(f"role {role!r} has no field {', '.join(map(repr, unknown))}; "
                         f"valid fields: {', '.join(sorted(fields))}")
    out = {}
    for field, default in fields.items():
        v = cfg.get(field, default)
        if field == "name" and v is None:
            v = role
        if field == "max_s" and v is None:
            v = default_max_s
        if v is REQUIRED:
            out[field] = None
            continue
        out[field] = cls.checks.get(field, _FIELD_CHECKS.get(field))(field, v)
    name = out["name"]
    if out["listen"] is not None and out["connect"] is not None:
        raise ValueError(f"role {name!r}: give either listen or connect, not both")
    if out["deferred"] and not starting:
        return out
    # From here on the role is about to run: everything it needs must be there.
    if out["listen"] is None and out["connect"] is None:
        raise ValueError(f"role {name!r} needs listen='HOST:PORT' or connect=(host, port)")
    missing = [f for f, d in fields.items() if d is REQUIRED and out[f] is None]
    if missing:
        raise ValueError(f"role {name!r} ({role}) needs {', '.join(missing)}")
    cls.check(out)
    return out


def check_spec(spec, default_max_s: float = 30.0) -> list[dict]:
    """Check a whole spec (a list of role dicts) and return it normalized;
    names must be unique. See ``check_role``."""
    if isinstance(spec, (str, bytes, dict)) or not isinstance(spec, (list, tuple)):
        raise TypeError(f"a peer spec is a list of role dicts, got {type(spec).__name__}")
    if not spec:
        raise ValueError("a peer spec needs at least one role")
    roles = [check_role(cfg, default_max_s) for cfg in spec]
    seen = set()
    for r in roles:
        if r["name"] in seen:
            raise ValueError(f"two roles are named {r['name']!r}; names must be unique")
        seen.add(r["name"])
    return roles
