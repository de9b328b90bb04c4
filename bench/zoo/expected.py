"""What each card expects where: the runtimes a zoo entry names, and on which of them its
naive program shows the bug.

``looplab repro ID`` without ``--runtimes`` runs exactly these runtimes (those available
here) plus the entry's option flips, and exits 0 only when every cell is as the card
says: the naive program shown where it is listed as shown and not shown where it is
listed as not shown, the fixed program never shown, each flip as its ``Flip.shows``.
A runtime the card does not name is one where the entry cannot measure the bug (its
port style is not the entry's, or its port has no TLS, or it is not an asyncio loop a
framework can run on): running it there is a question for ``--runtimes``, not a check.

The words come from the zoo table in docs/zoo.md (``looplab repro --all``, each row
measured; the command, date and interpreter are there).
"""
from __future__ import annotations


def _card(shown=(), not_shown=()) -> dict:
    out = {rid: True for rid in shown}
    out.update({rid: False for rid in not_shown})
    return out


#: entry id -> {runtime id: whether the naive program shows the bug there}
EXPECT = {
    "twisted-8868": _card(shown=("callback", "asyncio-protocol", "uvloop-protocol", "hybrid", "asyncio-streams", "uvloop-streams"),
                           not_shown=("coro", "curio", "trio")),
    "aiohttp-1367": _card(shown=("callback", "asyncio-protocol", "uvloop-protocol", "hybrid", "asyncio-streams", "uvloop-streams", "coro", "curio", "trio"),
                           not_shown=()),
    "cpython-32391": _card(shown=("callback", "asyncio-protocol", "uvloop-protocol", "hybrid", "asyncio-streams", "uvloop-streams"),
                            not_shown=("coro", "curio", "trio")),
    "asyncio-466": _card(shown=("callback", "asyncio-protocol", "hybrid", "asyncio-streams"),
                          not_shown=("uvloop-protocol", "uvloop-streams", "coro", "curio", "trio")),
    "aiohttp-1368": _card(shown=("callback", "asyncio-protocol", "uvloop-protocol", "hybrid", "asyncio-streams", "uvloop-streams", "coro", "curio", "trio"),
                           not_shown=()),
    "asyncio-248": _card(shown=("callback", "asyncio-protocol"),
                          not_shown=("uvloop-protocol", "hybrid", "asyncio-streams", "uvloop-streams")),
    "asyncio-263": _card(shown=(),
                          not_shown=("hybrid", "asyncio-streams", "uvloop-streams")),
    "cpython-118950": _card(shown=("asyncio-streams", "uvloop-streams"),
                             not_shown=()),
    "cpython-74116": _card(shown=(),
                            not_shown=("hybrid", "asyncio-streams", "uvloop-streams")),
    "cpython-116279": _card(shown=("callback", "asyncio-protocol", "uvloop-protocol", "hybrid", "asyncio-streams", "uvloop-streams"),
                             not_shown=()),
    "cpython-127655": _card(shown=(),
                             not_shown=("callback", "asyncio-protocol", "uvloop-protocol", "hybrid", "asyncio-streams", "uvloop-streams")),
    "asyncio-140": _card(shown=(),
                          not_shown=("callback", "asyncio-protocol", "uvloop-protocol", "hybrid", "asyncio-streams", "uvloop-streams")),
    "cpython-146507": _card(shown=(),
                             not_shown=("callback", "asyncio-protocol", "uvloop-protocol", "hybrid", "asyncio-streams", "uvloop-streams")),
    "uvloop-548": _card(shown=(),
                         not_shown=("callback", "asyncio-protocol", "uvloop-protocol")),
    "trio-412": _card(shown=("callback", "asyncio-protocol", "uvloop-protocol", "hybrid", "asyncio-streams", "uvloop-streams", "coro", "curio", "trio"),
                       not_shown=()),
    "curio-164": _card(shown=("hybrid", "asyncio-streams", "uvloop-streams", "coro", "curio", "trio"),
                        not_shown=()),
    "cpython-113538": _card(shown=(),
                             not_shown=("hybrid", "asyncio-streams", "uvloop-streams")),
    "cpython-115514": _card(shown=(),
                             not_shown=("callback", "asyncio-protocol", "uvloop-protocol", "hybrid", "asyncio-streams", "uvloop-streams")),
    "uvloop-631": _card(shown=(),
                         not_shown=("callback", "asyncio-protocol", "uvloop-protocol", "hybrid", "asyncio-streams", "uvloop-streams")),
    "sanic-2921": _card(shown=("callback", "asyncio-protocol", "uvloop-protocol", "hybrid", "asyncio-streams", "uvloop-streams"),
                         not_shown=()),
    "uvicorn-336": _card(shown=("callback", "asyncio-protocol", "uvloop-protocol"),
                          not_shown=("hybrid", "asyncio-streams", "uvloop-streams")),
    "starlette-1012": _card(shown=("hybrid", "asyncio-streams", "uvloop-streams", "coro", "curio", "trio"),
                             not_shown=()),
    "home-assistant-89905": _card(shown=("hybrid", "asyncio-streams", "uvloop-streams"),
                                   not_shown=()),
    "trio-1626": _card(shown=("trio",),
                        not_shown=("coro", "curio")),
    "uvloop-471": _card(shown=("uvloop-streams",),
                         not_shown=("asyncio-streams",)),
    "cpython-86296": _card(shown=("hybrid", "asyncio-streams", "uvloop-streams"),
                            not_shown=()),
    "cpython-102780": _card(shown=("hybrid", "asyncio-streams", "uvloop-streams"),
                             not_shown=()),
    "cpython-109321": _card(shown=("asyncio-streams", "uvloop-streams"),
                             not_shown=("hybrid",)),
    "redis-py-2624": _card(shown=("hybrid", "asyncio-streams", "uvloop-streams", "coro", "curio", "trio"),
                            not_shown=()),
    "httpcore-830": _card(shown=("hybrid", "asyncio-streams", "uvloop-streams", "coro", "curio", "trio"),
                           not_shown=()),
    "aiohttp-1221": _card(shown=("asyncio-streams", "uvloop-streams"),
                           not_shown=()),
    "uvicorn-451": _card(shown=("asyncio-streams", "uvloop-streams"),
                          not_shown=()),
}
