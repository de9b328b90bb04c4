"""Core actions: what a sans-IO core asks its driver to do.

Cores decide, drivers act. A core (``protocols/cores.py``) returns a list of
these small frozen classes -- ``Send("b", data)``, ``Close("a")``, ... -- and
never expects a reply except through its own event methods. A driver
(``protocols/callback.py``, ``stream.py``, ``task.py``, ``relay.py``,
``push.py``) ``match``es on the class and does what it says, and raises
``UnknownAction`` for a class it has no case for: an action silently skipped
is a decision silently overruled.

``from protocols.cores import Send, ...`` keeps working: ``cores`` re-exports
everything defined here.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Action", "Send", "SendEof", "Close", "PauseReading", "ResumeReading",
           "Done", "Enqueue", "Block", "Drop", "Disconnect", "UnknownAction"]


# ---------------------------------------------------------------------------
# Actions
#
# What a core asks its driver to do. ``to`` names a proxy side ("a" the client,
# "b" the upstream) or a push client id. The classes carry no behaviour: how to
# send or close is the port's business, whether to is the core's.

class Action:
    """Base of every core action (for ``isinstance`` and error messages)."""
    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Send(Action):
    """Write ``data`` to ``to`` now (push: in turn, the broadcaster may wait)."""
    to: object
    data: bytes


@dataclass(frozen=True, slots=True)
class SendEof(Action):
    """Half-close toward ``to``: no more bytes will be written to it."""
    to: str


@dataclass(frozen=True, slots=True)
class Close(Action):
    """Close ``to``; ``abort`` drops what is still buffered toward it (the
    other side ended with an error, so there is no orderly end to pass on)."""
    to: str
    abort: bool = False


@dataclass(frozen=True, slots=True)
class PauseReading(Action):
    """Stop reading from ``side`` until ``ResumeReading(side)``."""
    side: str


@dataclass(frozen=True, slots=True)
class ResumeReading(Action):
    side: str


@dataclass(frozen=True, slots=True)
class Done(Action):
    """The relay is over: every later event is answered with no actions."""


@dataclass(frozen=True, slots=True)
class Enqueue(Action):
    """Hand ``data`` to client ``to``'s own writer (its queue or its transport
    buffer) without waiting."""
    to: object
    data: bytes


@dataclass(frozen=True, slots=True)
class Block(Action):
    """Before the ``Send`` that follows, wait until client ``to`` drains."""
    to: object


@dataclass(frozen=True, slots=True)
class Drop(Action):
    """This message is not delivered to client ``to``."""
    to: object


@dataclass(frozen=True, slots=True)
class Disconnect(Action):
    """Close client ``to``; the core has already forgotten it."""
    to: object


class UnknownAction(TypeError):
    """A driver was handed an action it has no case for: a driver bug, never
    to be skipped."""

    def __init__(self, action, driver: str):
        super().__init__(f"{driver}: no case for action {action!r}")
        self.action = action
