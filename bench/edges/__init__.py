"""Edge probes for ``looplab fidelity``: small programs that poke one behaviour each.

Each probe is written once per API style and runs unchanged on our kernel and on the
libraries it reproduces. A *side* adapts one runtime to its style's probes:

* ``callback`` probes (``bench.edges.callback``) get a ``CallbackSide`` (``h.loop`` is
  our ``kernels.callback.Loop`` or an asyncio/uvloop event loop; transports and
  protocols are the shared asyncio API).
* ``stream`` probes (``bench.edges.streams`` for streams, ``bench.edges.tasks`` for
  tasks, futures and timeouts) are ``async def probe(a)`` where ``a`` is ``asyncio`` or
  ``kernels.hybrid`` (the same names).
* ``task`` probes (``bench.edges.coro``) are ``async def probe(k)`` where ``k`` is a
  ``TaskSide``: a tiny adapter that maps sleep/spawn/join/timeouts/Event/sockets onto
  ``kernels.coro``, curio or trio, and names exceptions by their *role*.

What differs between the libraries of one style lives in a subclass of its side
(``CoroSide``, ``CurioSide``, ``TrioSide``...); ``SIDES`` in ``bench.edges.worker`` picks
the side for a runtime id, and nothing else looks at the id.

A probe returns a small JSON-able observation: names, counts, booleans, never an
address, a line number or a chunk boundary. The peer of every connection is a plain
socket the probe drives itself, so a reset or a half-close happens exactly where the
probe says. Run as ``python -m bench.edges RUNTIME[:OPTIONS] [NAME,...]``: one JSON line
per probe on stdout (the fidelity verb starts one such process per runtime).
"""
from __future__ import annotations

from bench.edges.callback import CallbackSide
from bench.edges.coro import TaskSide
from bench.edges.registry import PROBES, EdgeProbe, probe
from bench.edges.streams import StreamSide
from bench.edges.worker import SIDES, STYLE_OF, parse_runtime, run_probes

__all__ = ["PROBES", "EdgeProbe", "SIDES", "STYLE_OF", "probe", "parse_runtime", "run_probes",
           "CallbackSide", "StreamSide", "TaskSide"]
