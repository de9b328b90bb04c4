"""The app table: every looplab app once, with the core that decides for it and
the variants each port style offers.

A driver module looks an app up here instead of keeping its own lists: the
table says which core to build for a connection (or, for push, for the whole
server) and what a variant changes in how the driver *acts* -- never what it
decides, which is the core's. ``bind(style, handlers)`` checks at import time
that a driver module handles exactly the apps the table lists, so an app added
here and forgotten in a driver fails loudly instead of serving nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from protocols import cores
from protocols.errors import UsageError

__all__ = ["Variant", "App", "APPS", "STYLES", "PUSH_POLICIES", "get", "variant",
           "variants", "bind", "SAME_CODE_NOTE"]

#: The three port styles, each with one driver module of the same name
#: (``protocols.common.driver``).
STYLES = ("callback", "stream", "task")
PUSH_POLICIES = ("unbounded", "block", "drop", "disconnect")
SAME_CODE_NOTE = "task port: naive and fixed are the same code (send_all blocks)"


@dataclass(frozen=True, slots=True)
class Variant:
    """How a variant uses its port. Each flag names one port API that the 2016
    post's versions of the program used or ignored."""
    name: str
    honour_pause: bool = False   # callback: pause_writing() pauses reading the source
    drain: bool = False          # stream: await drain() after writes, wait_closed() on close
    zero_limits: bool = False    # stream: set_write_buffer_limits(0) on the upstream


@dataclass(frozen=True, slots=True)
class App:
    """One app. ``core(variant, params)`` builds a fresh core: per connection,
    or once per server when ``per_server`` (push broadcasts to all clients).
    ``one_shot``: unless params say ``forever``, the server takes exactly one
    connection and returns when it is over (the 2016 post's proxy program)."""
    name: str
    summary: str
    core: Callable[[Variant, dict], object]
    variants: Mapping[str, tuple[Variant, ...]]
    per_server: bool = False
    one_shot: bool = False


_NAIVE, _FIXED = Variant("naive"), Variant("fixed", honour_pause=True, drain=True)
_LIMITS0 = Variant("limits0", honour_pause=True, drain=True, zero_limits=True)
# On the task port send_all blocks: every variant is the same code.
_SAME = tuple(Variant(name) for name in ("naive", "fixed", "limits0"))
_POLICIES = tuple(Variant(p) for p in PUSH_POLICIES)
_TWO = {"callback": (_NAIVE, _FIXED), "stream": (_NAIVE, _FIXED), "task": _SAME[:2]}


def _push_core(variant: Variant, params: dict) -> cores.PushCore:
    # "block" waits before every write (queue_limit 0: "write; drain per client
    # in turn", the S6 row); drop and disconnect judge by queue_limit messages.
    limit = 0 if variant.name == "block" else params.get("queue_limit", 16)
    return cores.PushCore(variant.name, limit)


APPS: dict[str, App] = {app.name: app for app in (
    App("echo", "every byte back, in order",
        lambda v, p: cores.EchoCore(), _TWO),
    App("sink", "count (and with frame_bytes check) what arrives",
        lambda v, p: cores.SinkCore(p.get("frame_bytes")), _TWO),
    App("reqresp", "pipelined request lines, each answered with response_bytes",
        lambda v, p: cores.ReqRespCore(p.get("response_bytes", 65536)), _TWO),
    App("proxy", "relay to upstream (two_way: both ways, passing half-close on)",
        lambda v, p: cores.ProxyCore(two_way=p.get("two_way", False),
                                     follow_pause=v.honour_pause),
        {"callback": (_NAIVE, _FIXED), "stream": (_NAIVE, _FIXED, _LIMITS0), "task": _SAME},
        one_shot=True),
    App("push", "broadcast to every client under an overload policy",
        _push_core, {style: _POLICIES for style in STYLES}, per_server=True),
)}


def get(name: str) -> App:
    try:
        return APPS[name]
    except KeyError:
        raise UsageError(f"unknown app {name!r}; valid: {', '.join(APPS)}") from None


def variant(app: str, style: str, name: str) -> Variant:
    for v in get(app).variants[style]:
        if v.name == name:
            return v
    valid = ", ".join(v.name for v in get(app).variants[style])
    raise UsageError(f"unknown variant {name!r} for {app} on the {style} port; valid: {valid}")


def variants(style: str) -> dict[str, tuple[str, ...]]:
    """App name -> the variant names ``style`` offers (a driver's ``VARIANTS``)."""
    return {name: tuple(v.name for v in app.variants[style]) for name, app in APPS.items()}


def bind(style: str, handlers: Mapping[str, object]) -> dict[str, object]:
    """A driver's app -> handler map, checked against the table."""
    if style not in STYLES:
        raise ValueError(f"unknown port style {style!r}")
    missing, extra = set(APPS) - set(handlers), set(handlers) - set(APPS)
    if missing or extra:
        raise TypeError(f"{style} driver: handlers do not match the app table "
                        f"(missing {sorted(missing)}, unknown {sorted(extra)})")
    return dict(handlers)
