"""What the three driver modules share: app counters, the one-line protocol
error, and the push app's state. Not sans-IO (it prints), so not in ``cores``."""
from __future__ import annotations

import sys

from protocols import cores

PUSH_POLICIES = ("unbounded", "block", "drop", "disconnect")


def protocol_error(app: str, exc) -> None:
    """One line for the operator; the caller closes that connection, the server goes on."""
    print(f"{app}: protocol error: {exc}; closing that connection", file=sys.stderr, flush=True)


def count(counters: dict, name: str, n: int = 1) -> None:
    """App-level counters (``requests_handled_count`` ...) the cell process reports."""
    counters[name] = counters.get(name, 0) + n


class PushApp:
    """A push server's state: the core and the clients by id. ``block`` waits
    before every write (queue_limit 0: "write; drain per client in turn", the S6
    row); ``drop`` and ``disconnect`` judge a client by ``queue_limit`` messages."""

    def __init__(self, policy: str, params: dict):
        limit = 0 if policy == "block" else params.get("queue_limit", 16)
        self.core = cores.PushCore(policy, limit)
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
