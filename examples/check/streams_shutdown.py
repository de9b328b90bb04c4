"""An asyncio streams server that is stopped with answers in flight.

``GET n\\n`` answers n bytes (byte i is i % 251), 64 KiB at a time with ``await
writer.drain()`` after each, so both versions respect backpressure; the connection
stays open for the next line. What differs is the stop.

- ``naive``: the factory returns the ``asyncio.Server``; stopping it is ``close()``,
  and then ``asyncio.run`` ends as it always does: the handlers are cancelled in the
  middle of their answers. Run as a process (``python streams_shutdown.py naive
  --port P``) it has no SIGTERM handler, so SIGTERM's default action ends it at once.
- ``fixed``: the factory returns a server with ``async def shutdown()``: stop
  accepting, let every answer in flight finish (up to 10 s), then close each
  connection and wait for it to close. As a process it turns SIGTERM into that
  shutdown.

    looplab check examples/check/streams_shutdown.py:naive --send 'GET 65536\\n::65536' \\
        --shutdown 'raw:GET 4000000\\n::4000000'
    looplab check --send 'GET 65536\\n::65536' --shutdown 'raw:GET 4000000\\n::4000000' \\
        -- python examples/check/streams_shutdown.py naive --port {port}
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal

CHUNK = 65536
_BASE = bytes(range(251)) * (2 * CHUNK // 251 + 2)


async def _answer(reader, writer, busy: set | None = None):
    try:
        while line := await reader.readline():
            parts = line.split()
            if len(parts) != 2 or parts[0] != b"GET" or not parts[1].isdigit():
                break
            n = int(parts[1])
            if busy is not None:
                busy.add(writer)
            try:
                for at in range(0, n, CHUNK):
                    k = at % 251
                    writer.write(_BASE[k:k + min(CHUNK, n - at)])
                    await writer.drain()
            finally:                      # a client that vanished is not in flight any more
                if busy is not None:
                    busy.discard(writer)
    except ConnectionError:
        pass
    finally:
        writer.close()
        # close() only asks; the bytes still buffered go out before the connection
        # closes, and a process that exits first loses them: wait for it
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def naive(host: str = "127.0.0.1", port: int = 0):
    return await asyncio.start_server(_answer, host, port)


class Fixed:
    """``start_server`` plus the bookkeeping a graceful stop needs."""

    def __init__(self):
        self.busy: set = set()        # writers with an answer in flight
        self.handlers: set = set()

    async def start(self, host, port):
        async def handle(reader, writer):
            task = asyncio.current_task()
            self.handlers.add(task)
            try:
                await _answer(reader, writer, self.busy)
            finally:
                self.handlers.discard(task)
        self.server = await asyncio.start_server(handle, host, port)
        self.sockets = self.server.sockets
        return self

    async def shutdown(self, timeout_s: float = 10.0):
        self.server.close()                       # no new connections
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.busy and loop.time() < deadline:
            await asyncio.sleep(0.01)             # answers in flight finish
        for task in list(self.handlers):
            task.cancel()                         # idle connections: wake them to close
        if self.handlers:
            await asyncio.wait(list(self.handlers), timeout=max(0.0, deadline - loop.time()))


async def fixed(host: str = "127.0.0.1", port: int = 0):
    return await Fixed().start(host, port)


async def _main(version: str, port: int):
    server = await {"naive": naive, "fixed": fixed}[version]("127.0.0.1", port)
    if version == "naive":
        await server.serve_forever()              # SIGTERM's default action ends the process
        return
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await server.shutdown()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("version", choices=("naive", "fixed"))
    ap.add_argument("--port", type=int, required=True)
    a = ap.parse_args()
    asyncio.run(_main(a.version, a.port))
