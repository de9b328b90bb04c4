"""asyncio loops that each break one thing on purpose, for the observatory's tests: a
test names one as ``loop=fakeloops:FACTORY`` (with this folder on PYTHONPATH) or runs a
probe on it in-process. Each is CPython's selector loop with one method changed.
"""
from __future__ import annotations

import asyncio
import os
import signal
import time


class LateZeroLoop(asyncio.SelectorEventLoop):
    """call_later(0) and call_later(-1) run as call_soon (uvloop 0.23's order)."""

    def call_later(self, delay, callback, *args, context=None):
        if delay <= 0:
            return self.call_soon(callback, *args, context=context)
        return super().call_later(delay, callback, *args, context=context)


class _HalfHandle:
    """A call_soon handle whose cancel() does nothing and that has no cancelled()."""

    def __init__(self, handle):
        self._handle = handle

    def cancel(self):
        pass


class NoCancelledLoop(asyncio.SelectorEventLoop):
    """call_soon() returns a handle whose cancel() is a no-op and which lacks
    cancelled() (rloop 0.5's)."""

    def call_soon(self, callback, *args, context=None):
        return _HalfHandle(super().call_soon(callback, *args, context=context))


class DyingLoop(asyncio.SelectorEventLoop):
    """connect_read_pipe() kills the process (SIGKILL: no core file), as uvloop 0.23
    aborts on a regular file."""

    async def connect_read_pipe(self, protocol_factory, pipe):
        os.kill(os.getpid(), signal.SIGKILL)


class StuckLoop(asyncio.SelectorEventLoop):
    """add_signal_handler() blocks SIGALRM and hangs, as a loop stuck in C code does:
    the worker's per-probe alarm never fires."""

    def add_signal_handler(self, sig, callback, *args):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        time.sleep(120)


def late_zero():
    return LateZeroLoop()


def no_cancelled():
    return NoCancelledLoop()


def dying():
    return DyingLoop()


def stuck():
    return StuckLoop()
