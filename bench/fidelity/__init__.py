"""Fidelity at the edges: small programs (probes) that poke one behaviour each, run on
each kernel and on the libraries it reproduces (``looplab fidelity``,
``bench.verbs.fidelity``).

Scenario verdicts say the kernels agree on the big picture; users compare designs at
the edges -- what a write after close does, where a reset surfaces, what a nested
timeout raises. Everything about a runtime that fidelity needs is declared on its
``RuntimeInfo``: its references (``compared_with``, primary first), its accepted
differences with the value it shows (``probe_differences``), the option flips a probe
sees (``probe_flips``) and how the probes reach it (``probe_side``).

Each probe is written once per API style and runs unchanged on every runtime of that
style. A *side* adapts one runtime to its style's probes:

* ``callback`` probes (``bench.fidelity.callback``) get a ``CallbackSide`` (``h.loop``
  is our ``kernels.callback.Loop`` or an asyncio/uvloop event loop; transports and
  protocols are the shared asyncio API).
* ``stream`` probes (``bench.fidelity.streams`` for streams, ``bench.fidelity.tasks``
  for tasks, futures and timeouts) are ``async def probe(a)`` where ``a`` is
  ``asyncio``, ``kernels.hybrid`` or a stream port (the same names): a stream-style
  runtime that declares no side runs them through its own port (``PortStreamSide``).
* ``task`` probes (``bench.fidelity.coro``) are ``async def probe(k)`` where ``k`` is a
  ``TaskSide``: a tiny adapter that maps sleep/spawn/join/timeouts/Event/sockets onto
  ``kernels.coro``, curio or trio, and names exceptions by their *role*.

A probe returns a small JSON-able observation: names, counts, booleans, never an
address, a line number or a chunk boundary. The peer of every connection is a plain
socket the probe drives itself, so a reset or a half-close happens exactly where the
probe says. ``python -m bench.fidelity.worker RUNTIME[:OPTIONS] [NAME,...]`` runs one
runtime's probes, one JSON line each (the verb starts one such process per runtime);
``bench.fidelity.measure`` selects, collects and compares.
"""
from __future__ import annotations

# the probe modules, in the order their probes are listed
from bench.fidelity import callback, coro, streams, tasks  # noqa: F401
# the loop-conformance probes come last, by theme
from bench.fidelity import (loops, loopstate, looptransport, loophandler, loopsock,  # noqa: F401,I001
                            loopsignal, loopcontext, loopdgram, loopproc, looptls)
from bench.fidelity.measure import (COMMAND, collect, compare, comparable, counts, declared,
                                    document, grid_reference, same,
                                    markdown_section, measure, pairings, probes_block,
                                    select_probes, select_runtimes, summary_line, table,
                                    undeclared)
from bench.fidelity.registry import PROBES, EdgeProbe, probe

__all__ = ["PROBES", "EdgeProbe", "probe", "COMMAND", "collect", "compare", "comparable", "counts",
           "grid_reference", "same",
           "declared", "document", "markdown_section", "measure", "pairings", "probes_block",
           "select_probes", "select_runtimes", "summary_line", "table", "undeclared"]
