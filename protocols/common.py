"""What the three driver modules share: app counters, the one-line protocol
error, the push app's state and the unknown-action error. Not sans-IO (it
prints), so not in ``cores``."""
from __future__ import annotations

import sys

from protocols import apps, cores
from protocols.apps import PUSH_POLICIES  # noqa: F401  (re-exported for callers)


class Served:
    """What every handler of one server shares: the port, the app's table entry,
    the chosen variant and the params (``counters`` is where app counters go)."""

    def __init__(self, port, style: str, name: str, variant: str, params: dict,
                 push_app=None):
        self.port = port
        self.app = apps.get(name)
        self.variant = apps.variant(name, style, variant)
        self.params = params
        self.counters = params.get("counters", {})
        self.one_shot = self.app.one_shot and not params.get("forever", False)
        self.push = None
        if self.app.per_server:     # one core for the whole server
            self.push = (push_app or PushApp)(self.new_core(), params)

    def new_core(self):
        return self.app.core(self.variant, self.params)


def unknown(action, driver: str) -> cores.UnknownAction:
    """The error for an action a driver has no case for (raise it)."""
    return cores.UnknownAction(action, driver)


def protocol_error(app: str, exc) -> None:
    """One line for the operator; the caller closes that connection, the server goes on."""
    print(f"{app}: protocol error: {exc}; closing that connection", file=sys.stderr, flush=True)


def count(counters: dict, name: str, n: int = 1) -> None:
    """App-level counters (``requests_handled_count`` ...) the cell process reports."""
    counters[name] = counters.get(name, 0) + n


class PushApp:
    """A push server's state: the core (built by the app table for the policy)
    and the clients by id."""

    def __init__(self, core: cores.PushCore, params: dict):
        self.core = core
        self.clients: dict = {}
        self.boxes: dict = {}          # task port: per-client mailboxes
        self.counters = params.get("counters", {})
        self.message_bytes = params.get("message_bytes", 10_000)
        self.interval_s = params.get("interval_s", 0.005)
        self._filler = bytes(self.message_bytes)
        self._seq = 0

    def next_message(self) -> bytes:
        """A fresh message per broadcast, numbered, as a real feed's would be:
        a queue of them costs memory (one shared object would hide that)."""
        self._seq += 1
        return self._seq.to_bytes(8, "big") + self._filler[8:]

    def queued(self, messages: int) -> None:
        """An app-level queue (the task port's mailboxes) now holds ``messages``:
        user-space backlog that no transport counts, so the app reports its peak."""
        peak = messages * self.message_bytes
        if peak > self.counters.get("app_queue_peak_bytes", 0):
            self.counters["app_queue_peak_bytes"] = peak

    def report(self) -> None:
        core = self.core
        self.counters.update(dropped_count=core.dropped_count,
                             disconnected_count=core.disconnected_count,
                             broadcasts_count=core.broadcasts_count)
