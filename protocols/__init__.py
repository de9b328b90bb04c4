"""looplab's protocol suite: each app written once as a sans-IO core, run by a thin driver per port.

``protocols.cores`` holds the cores -- pure state machines for framing, echo, sink, source,
proxy, request/response and push (bytes and events in, actions out; no sockets, no clock,
no kernel imports). The drivers that run a core on one port live beside it:
``protocols.callback`` (asyncio-style Protocol/Transport), ``protocols.stream``
(StreamReader/StreamWriter) and ``protocols.task`` (trio-style Stream and tasks).
``protocols.ports`` adapts each port to our kernels and to the reference libraries;
``protocols.runtimes`` names the runtimes users choose from.
"""
