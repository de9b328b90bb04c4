"""``looplab check``: the lab's questions asked of the user's own server, with measured advice.

Point it at an aiohttp app, an ASGI app (served by uvicorn), a factory of an asyncio
server, or any server command, and it answers with evidence: does a slow client cost
the server memory without bound (backpressure), do healthy clients suffer beside one
(fairness), does a response in flight survive the stop (shutdown), does the server
survive ``looplab faults``' faulty peers (faults); and for a verdict that fails, which
knob setting fixes it, measured before and after (advice).

The rooms inside:

- ``target``: what the user names (app, loop, endpoints, knobs), checked before anything runs;
- ``roles``: ``check_client``, the peer role that plays slow, healthy and shutdown clients;
- ``host`` and ``appside``: an in-process app on a loop, its shutdown, its memory as the
  loop sees it; ``appside`` is the app's own process on real sockets;
- ``drive`` (real sockets, /proc) and ``sim`` (the simulated network): the rigs;
- ``questions``: the phases and the judgements; ``session``: one run, always cleaned up;
- ``advice``: the knob search; ``report``: the results document and the terminal table.

The verb is ``bench/verbs/check.py``; docs/check.md is the user's page.
"""
from __future__ import annotations

from bench.check import roles as _roles  # noqa: F401 -- registers the check_client role

__all__: list = []
