"""The measurement peers' spec: the roles, their fields, and the checks both sides run.

A peer spec is a list of role dicts (``bench/peers.py`` builds them with
``sink(...)``, ``source(...)``, ...). The parent (``PeerProcess``) checks it
before it spawns anything, and the child (``bench/peerproc.py``) checks it
again, with the same code, from here. This module imports nothing of the
peers, so both sides can.
"""
from __future__ import annotations

import math

__all__ = ["ROLES", "check_role", "check_spec"]

_MAX_CHUNK = 64 * 1024 * 1024  # largest recv/chunk size a spec may ask for
_FRAME_HEADER_BYTES = 24     # protocols.cores.FRAME_HEADER_BYTES, checked without importing it
_GRACE_S = 3.0               # how much longer than timeout_s the parent waits for results


# ---------------------------------------------------------------------------
# The spec: roles, their fields, and the checks both sides run.
#
# One table says which fields a role takes and their defaults; one table says
# what a field may hold. The parent checks the spec before it spawns anything
# (a typo is a ValueError in the caller's frame, not a dead child), and the
# child checks again (``python -m bench.peerproc`` is usable on its own).

_REQUIRED = object()   # marks a field a role cannot run without (may come at start)

_COMMON = {"name": None, "role": None, "listen": None, "connect": None, "sockbuf": None,
           "max_s": None, "deferred": False}

ROLES: dict[str, dict] = {
    "sink": {"rate_Bps": None, "recv_bytes": 65536, "frame_bytes": None, "verify": False,
             "start_after_s": 0.0, "stall_at_s": 0.0, "stall_s": 0.0,
             "pause_at_bytes": None, "pause_s": 0.0, "close_with_reset": False,
             "warmup_s": 1.0},
    "source": {"rate_Bps": None, "frame_bytes": 32768, "duration_s": None, "total_bytes": None,
               "finish": "close", "eof_wait_s": 5.0, "warmup_s": 1.0, "recv_bytes": 65536},
    "pipeline_client": {"count": _REQUIRED, "hold_s": 1.0},
    "push_client": {"mode": _REQUIRED, "duration_s": _REQUIRED, "recv_bytes": 65536},
    "echo_client": {"total_bytes": _REQUIRED, "chunk_bytes": 16384, "recv_bytes": 65536,
                    "shutdown": True, "eof_wait_s": 0.5},
    "reset_peer": {"after_bytes": None, "after_s": None, "recv_bytes": 65536},
    "reader": {"start_after_s": 0.0, "recv_bytes": 65536, "rate_Bps": None, "warmup_s": 1.0},
}
"""Role name -> {field: default} (beyond the common fields ``name``, ``role``,
``listen``, ``connect``, ``sockbuf``, ``max_s``, ``deferred``)."""


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
    fields = {**_COMMON, **ROLES[role]}
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
        if v is _REQUIRED:
            out[field] = None
            continue
        out[field] = _FIELD_CHECKS[field](field, v)
    name = out["name"]
    if out["listen"] is not None and out["connect"] is not None:
        raise ValueError(f"role {name!r}: give either listen or connect, not both")
    if out["deferred"] and not starting:
        return out
    # From here on the role is about to run: everything it needs must be there.
    if out["listen"] is None and out["connect"] is None:
        raise ValueError(f"role {name!r} needs listen='HOST:PORT' or connect=(host, port)")
    missing = [f for f, d in fields.items() if d is _REQUIRED and out[f] is None]
    if missing:
        raise ValueError(f"role {name!r} ({role}) needs {', '.join(missing)}")
    if role == "source":
        if out["duration_s"] is None and out["total_bytes"] is None:
            raise ValueError(f"role {name!r}: a source needs duration_s or total_bytes")
        total, frame = out["total_bytes"], out["frame_bytes"]
        if frame is None:
            raise ValueError(f"role {name!r}: a source needs frame_bytes")
        if total is not None and 0 < total % frame < _FRAME_HEADER_BYTES:
            raise ValueError(f"role {name!r}: total_bytes={total} would end with a "
                             f"{total % frame}-byte frame, shorter than the "
                             f"{_FRAME_HEADER_BYTES}-byte frame header")
    if out.get("pause_at_bytes") is not None and not out["pause_s"] > 0:
        raise ValueError(f"role {name!r}: pause_at_bytes needs pause_s > 0")
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
