"""The bug zoo: famous backpressure, shutdown, TLS and cancellation bugs, one small
reproduction each.

Every entry is an ordinary scenario (``bench.scenarios.api.Scenario``) registered through
the public API -- its programs run on the runtime under test in a cell process, its
peers (``bench.peers``) count what really crossed the wire -- plus what a user who
searched for the bug by name wants to know: the thread, the mechanism in two
sentences, the versions it was reported against and fixed in, what to expect where,
and which of our kernels' design options turns it on or off.

Each entry has two variants: ``naive`` is the program as the report wrote it,
``fixed`` the program with the fix the thread settled on. Its one verdict,
``bug_shown``, is computed from measurements (bytes lost, buffer peak against its
bound, requests answered, seconds to EOF, whether a parked task was released...),
never from the runtime's name. So the same entry says "shown" on a library that
still has the bug and "not shown" on one that fixed it, and a version that is not
installed here is represented by one of our kernels with the option that
reproduces it (``flips``); where no such option exists yet the entry says which
option it needs (``needs``). Each card also says where it runs (the real library, or
what stands in for it: an option of ours, or our program in place of a framework's),
the versions a pinned run would install (``affected_versions``/``fixed_versions``, as
requirement strings) and how it was checked against its thread (``verified``).

``looplab repro`` (``bench.verbs.repro``) runs entries and writes the zoo table.

The package: ``registry`` (what an entry is, the table, the version check),
``plumbing`` (the program helpers, one per port style) and the entries grouped by
theme -- ``buffers``, ``limits``, ``shutdown``, ``drain``, ``tls``, ``cancel``, and ``frameworks`` (the real
aiohttp and uvicorn as programs, and the entries that run them). Importing ``bench.zoo``
declares every entry, in the order below (the order of the zoo table and of ``looplab repro
--list``); the scenario registry takes them when the package is loaded as a scenario module.
"""
from __future__ import annotations

from bench.zoo import buffers, cancel, drain, frameworks, limits, shutdown, tls  # noqa: F401 -- each declares its entries
from bench.zoo.registry import (ENTRIES, VERDICT, Entry, Flip, affected_note, entry,
                                installed_versions, lib_of, register_in_order)

__all__ = ["Entry", "Flip", "ENTRIES", "entry", "installed_versions", "affected_note",
           "VERDICT", "lib_of"]

ORDER = ("twisted-8868", "aiohttp-1367", "cpython-32391", "asyncio-466", "aiohttp-1368",
         "asyncio-248", "asyncio-263", "cpython-118950", "cpython-74116", "cpython-116279",
         "cpython-127655", "asyncio-140", "cpython-146507", "uvloop-548", "trio-412",
         "curio-164", "cpython-113538", "cpython-115514", "uvloop-631", "sanic-2921",
         "uvicorn-336", "starlette-1012", "home-assistant-89905", "trio-1626",
         "uvloop-471",
         "cpython-86296", "cpython-102780", "cpython-109321", "redis-py-2624", "httpcore-830",
         "aiohttp-1221", "uvicorn-451")

register_in_order(ORDER)
#: the entries as scenarios, in the table's order: what the scenario registry takes when
#: this package is loaded as a scenario module (``looplab repro`` does)
SCENARIOS = tuple(e.scenario for e in ENTRIES.values())
