"""The port contract each style is held to, and how a measured outcome is judged.

Behaviours that may differ between runtimes are measured into a short *outcome*
string and compared with ``CONTRACT[style][key]``: what the style's reference
library does (asyncio for callback and stream, trio for task). A runtime that
deviates on purpose declares it on its ``RuntimeInfo.differences`` as
``Difference(outcome, reason)``. ``check`` then makes the test:

* pass when the outcome is the contract's and nothing is declared;
* xfail, with the declared reason, when the outcome is the declared difference
  (the plugin lists these at the end of the run, so they are never silent);
* fail otherwise -- including when a declared difference no longer happens,
  so a declaration cannot outlive the behaviour it describes.
"""
from __future__ import annotations

import pytest

__all__ = ["CONTRACT", "DIFFERENCE_PREFIX", "check"]

# Runtimes declare their differences on their RuntimeInfo (bench/runtimes/builtin.py for
# the built-ins); this module holds only the contract and the judge.

# The start of every xfail reason ``check`` gives, which the plugin's summary looks for.
DIFFERENCE_PREFIX = "declared difference"

CONTRACT = {
    "callback": {
        # the peer resets (SO_LINGER 0) while our write is buffered; a write in
        # connection_lost, and one once it returned, is dropped without raising
        "reset": "connection_lost(ConnectionError); write after: no error; "
                 "once it returned: no error",
        # abort() with bytes buffered: what the peer gets, how each end hears of it
        "abort": "peer: prefix then EOF; connection_lost(None)",
        # ...and whether the probe reports the dropped bytes as lost
        "abort_counted": "counted exactly",
        # write() after close(): with nothing buffered / with bytes still buffered;
        # asyncio appends to a closing transport's buffer (asyncio issue 248)
        "write_after_close": "empty: dropped; buffered: delivered; counted 2",
    },
    "stream": {
        # ...and a write after the error has surfaced is dropped without raising
        "reset": "drain raises ConnectionError; then read raises ConnectionError; "
                 "write after: no error",
        "abort_counted": "counted exactly",
        # CPython 74116 (AssertionError) is fixed in the 3.11.7 we run: both wake
        "two_drainers": "both wake",
        "write_after_close": "empty: dropped; buffered: delivered; counted 2",
    },
    "task": {
        "reset_send": "send_all raises BrokenResourceError; then receive_some returns b''",
        "reset_receive": "receive_some raises BrokenResourceError",
        "close_while_receiving": "ClosedResourceError",
        "close_while_sending": "ClosedResourceError",
        "use_after_close": "send_all: ClosedResourceError; receive_some: ClosedResourceError",
        "send_after_eof": "ClosedResourceError",
        "concurrent_receive": "BusyResourceError; first intact",
        "concurrent_send": "BusyResourceError; first intact",
        # a child raises while a sibling sleeps: the nursery cancels the sibling and
        # the error leaves the block (trio wraps it in an ExceptionGroup)
        "child_error": "propagates; sibling cancelled",
        # closed/broken-stream errors above that are not port.StreamError, which
        # is what drivers catch
        "not_stream_errors": "none",
    },
}

def check(rt, key: str, outcome: str, details=None) -> None:
    """Judge a measured ``outcome`` of contract ``key`` on runtime ``rt`` (see the
    module docstring). Call it last in a test: a declared difference ends the
    test as an xfail."""
    contract = CONTRACT[rt.style][key]
    declared = rt.info.difference(key)
    more = f"; details: {details!r}" if details is not None else ""
    if declared is None:
        assert outcome == contract, (
            f"{rt.id} {key}: measured {outcome!r}, contract {contract!r}{more}")
        return
    if outcome == declared.outcome:
        pytest.xfail(f"{DIFFERENCE_PREFIX} of {rt.id} in {key}: {declared.reason} "
                     f"(measured {outcome!r}; contract {contract!r})")
    if outcome == contract:
        pytest.fail(f"{rt.id} {key}: meets the contract {contract!r} now, but declares the "
                    f"difference {declared.outcome!r}: remove the declaration", pytrace=False)
    raise AssertionError(f"{rt.id} {key}: measured {outcome!r}, declared {declared.outcome!r} "
                         f"(contract {contract!r}){more}")
