"""looplab's protocol suite: each app written once as a sans-IO core, run by a thin driver per port.

``protocols.cores`` holds the cores -- pure state machines for framing, echo, sink, source,
proxy, request/response and push (bytes and events in, actions out; no sockets, no clock,
no kernel imports). The drivers that run a core on one port live beside it:
``protocols.callback`` (asyncio-style Protocol/Transport), ``protocols.stream``
(StreamReader/StreamWriter) and ``protocols.task`` (trio-style Stream and tasks).

What a driver may rely on is written down in ``protocols.contracts`` (one
``typing.Protocol`` per port style) and measured on every runtime by the
conformance suite in ``protocols.conformance``. The ports themselves are in
``protocols.ports`` (our kernels), ``protocols.asyncio_ports`` and
``protocols.trio_curio_ports`` (the reference libraries).

``protocols.runtimes`` is the registry users choose from: ``parse("coro:spawn=eager")``
gives a ``Runtime`` whose ``open()`` is a fresh port, ``port.run(main)`` runs a
program and ``port.probe()`` reads its counters. The nine built-in runtimes are
declared in ``protocols.builtin``, which this package imports first; a third-party
kernel registers its own ``RuntimeInfo`` the same way (an entry point, ``LOOPLAB_RUNTIME_MODULES`` or
``--runtime-module``). ``protocols.fingerprint`` holds the vocabulary of the
declared S4 fingerprints, and ``protocols.pytest_plugin`` runs tests across runtimes.
"""
from protocols import builtin as _builtin  # noqa: E402,F401  (registers the built-in runtimes)
from protocols.runtimes import discover as _discover  # noqa: E402

# Registration points one way: the built-ins register through protocols.runtimes like
# any plugin, first (so no plugin takes their ids); then the plugins are discovered.
_discover()
