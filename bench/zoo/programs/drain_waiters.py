"""Two tasks awaiting a drain on one connection, for the zoo entry cpython-74116
(bpo-29930; standard library, and websockets where it is pinned; Python 3.6 syntax).

``mode`` "streams": two tasks each ``write()`` a ``chunk_bytes`` chunk and ``await
drain()`` on one ``asyncio.StreamWriter``, ``writes`` times, to a peer that starts
reading late (looplab's ``reader``), so both park in the drain at once. asyncio kept a
single drain waiter up to 3.9 (``assert waiter is None or waiter.cancelled()``); 3.10.6
and 3.11 keep a deque (PR 94705).

``mode`` "websockets": the same through websockets' server protocol, whose ``send()``
drains the same StreamWriter; two tasks send to a subscriber that stops reading for a
while (looplab's ``ws_subscriber``). websockets 3.2 let both reach the drain (issue 16);
3.3 serialises them with a lock (PR 168).

It reports how many sends or drains raised, and the first error.
"""
import asyncio

import _common


def run(spec, out):
    p = spec["params"]
    loop = asyncio.get_event_loop()
    errors = []
    chunk = bytes(p["chunk_bytes"])

    def failed(exc):
        errors.append("%s: %s" % (type(exc).__name__, exc))

    if p["mode"] == "websockets":          # websockets 3.x: Python 3.6, loop= everywhere
        import websockets
        from websockets.server import WebSocketServer, WebSocketServerProtocol
        done = asyncio.Event(loop=loop)

        @asyncio.coroutine
        def handler(ws, path):
            @asyncio.coroutine
            def sender():
                for _ in range(p["writes"]):
                    try:
                        yield from ws.send(chunk)
                    except (AssertionError, RuntimeError) as exc:
                        failed(exc)
            try:
                yield from asyncio.gather(sender(), sender(), loop=loop, return_exceptions=True)
            finally:
                done.set()

        server = WebSocketServer(loop)

        @asyncio.coroutine
        def main():
            addr = spec["peers"]["subscriber"]
            yield from loop.connect_accepted_socket(
                lambda: WebSocketServerProtocol(handler, server, loop=loop),
                sock=_common.connect(addr, p["sockbuf"]))
            yield from asyncio.wait_for(done.wait(), p["max_s"], loop=loop)
            for ws in list(server.websockets):
                ws.writer.transport.abort()
        loop.run_until_complete(main())
        out["websockets"] = websockets.version.version
    else:                                   # 3.6 to 3.10: no loop= (3.10 removed it)
        @asyncio.coroutine
        def main():
            reader, writer = yield from asyncio.open_connection(
                sock=_common.connect(spec["peers"]["reader"], p["sockbuf"]))

            @asyncio.coroutine
            def producer():
                for _ in range(p["writes"]):
                    writer.write(chunk)
                    try:
                        yield from writer.drain()
                    except (AssertionError, RuntimeError) as exc:
                        failed(exc)
            yield from asyncio.gather(producer(), producer(), return_exceptions=True)
            writer.close()
        loop.run_until_complete(main())
    out.update(drain_errors_count=len(errors), first_error=errors[0] if errors else None)


if __name__ == "__main__":
    raise SystemExit(_common.run(run))
