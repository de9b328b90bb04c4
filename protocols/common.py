"""What the driver modules share: the served app's context, app counters, the
one-line protocol error, the unknown-action error, the callback port's no-op
Protocol base, setting a port's Event and the stream port's writer close. Not
sans-IO (it prints, it awaits), so not in ``cores``."""
from __future__ import annotations

import importlib
import sys

from protocols import apps, cores
from protocols.apps import STYLES


def driver(style: str):
    """The driver module that serves apps on ports of ``style`` (``serve(port, app,
    sock, variant, params)``)."""
    if style not in STYLES:
        raise ValueError(f"unknown port style {style!r}; styles: {', '.join(STYLES)}")
    return importlib.import_module(f"protocols.{style}")


class Served:
    """What every handler of one server shares: the port, the app's table entry,
    the chosen variant and the params (``counters`` is where app counters go)."""

    def __init__(self, port, style: str, name: str, variant: str, params: dict, push_app=None):
        self.port = port
        self.app = apps.get(name)
        self.variant = apps.variant(name, style, variant)
        self.params = params
        self.counters = params.get("counters", {})
        self.one_shot = self.app.one_shot and not params.get("forever", False)
        # push: one core for the whole server, in the driver's push app
        self.push = push_app(self.new_core(), params) if self.app.per_server else None

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


class ProtocolBase:
    """The six Protocol methods, so a driver class never needs a kernel's base class."""
    transport = None

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        pass

    def eof_received(self):
        return False          # let the transport close itself once its buffer drains

    def connection_lost(self, exc):
        pass

    def pause_writing(self):
        pass

    def resume_writing(self):
        pass


async def set_event(event) -> None:
    """Set a port's Event, waking its waiters. asyncio's, trio's and coro's
    ``set()`` does that at once; curio's in-kernel Event.set() is a coroutine
    that does it when awaited."""
    woke = event.set()
    if woke is not None:
        await woke


async def close_writer(writer, wait: bool):
    """Close a stream writer; with ``wait`` (fixed variants) until it is closed."""
    writer.close()
    if wait:
        try:
            await writer.wait_closed()
        except OSError:
            pass
