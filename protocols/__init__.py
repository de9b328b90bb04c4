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
``protocols.trio_curio_ports`` (the reference libraries); a port is constructed
as ``Port(runtime, options)`` by whoever names runtimes (the lab's registry).
``protocols.fingerprint`` holds the vocabulary of declared causality fingerprints.

The suite knows nothing of the lab that runs it: nothing here imports or names
the harness, and importing this package registers nothing.
"""
