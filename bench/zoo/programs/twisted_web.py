"""Twisted's web server, the real releases, for the zoo entry twisted-8868 (standard
library and Twisted only, Python 3.6 syntax: Twisted 16.6 and 17.1 predate the Pythons
looplab needs).

A ``twisted.web.server.Site`` with one leaf resource that answers every GET with
``response_bytes`` of the peers' pattern. The client (looplab's ``http_client`` with
``pipeline`` and ``read=False``) sends ``count`` pipelined GETs and never reads, as the
thread's script did. Twisted 16.6's ``HTTPChannel`` went on answering them into the
transport's unbounded write buffer; 17.1 registers the channel as the transport's
producer and stops reading requests while the transport is paused (Twisted 8868).

The reactor is Twisted's asyncio reactor (``twisted.internet.asyncioreactor``, in both
releases) on asyncio's own loop; the peer's connected socket is given to the site with
``reactor.adoptStreamConnection``. After ``hold_s`` the program reports the requests the
site rendered and the transports' write-buffer peak, sampled every 10 ms.
"""
import asyncio
import socket
import time

import _common


def serve(spec, out):
    p = spec["params"]
    from twisted.internet import asyncioreactor
    asyncioreactor.install(asyncio.get_event_loop())
    import twisted
    from twisted.internet import reactor, task
    from twisted.web import resource, server

    st = {"rendered": 0, "peak": 0}
    body = _common.pattern(p["response_bytes"])

    class Answer(resource.Resource):
        isLeaf = True

        def render_GET(self, request):
            st["rendered"] += 1
            return body

    site = server.Site(Answer())
    channels = []
    build = site.buildProtocol

    def remember(addr):
        proto = build(addr)
        channels.append(proto)
        return proto
    site.buildProtocol = remember

    for name in sorted(spec["peers"]):
        sock = _common.connect(spec["peers"][name])
        reactor.adoptStreamConnection(sock.fileno(), socket.AF_INET, site)
        sock.close()            # the reactor holds its own duplicate of the descriptor

    def _transport(proto):
        # 16.6+ wraps the HTTPChannel (_GenericHTTPChannelProtocol, for HTTP/2 choice)
        t = getattr(proto, "transport", None)
        return t if t is not None else getattr(getattr(proto, "_channel", None), "transport", None)

    def buffered(t):
        # what FileDescriptor.write queued and the socket has not taken yet
        return (len(getattr(t, "dataBuffer", b"")) - getattr(t, "offset", 0)
                + getattr(t, "_tempDataLen", 0))

    def sample():
        now = sum(buffered(t) for t in map(_transport, channels) if t is not None)
        st["peak"] = max(st["peak"], now)
    sampler = task.LoopingCall(sample)
    sampler.start(0.01)
    reactor.callLater(p["hold_s"], reactor.stop)
    t0 = time.monotonic()
    reactor.run(installSignalHandlers=False)
    sample()
    out.update(requests_handled_count=st["rendered"], write_buffer_peak_bytes=st["peak"],
               served_s=time.monotonic() - t0, twisted=twisted.__version__,
               connections_count=len(channels))


if __name__ == "__main__":
    raise SystemExit(_common.run(serve))
