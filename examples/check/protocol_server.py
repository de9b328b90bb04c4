"""A raw asyncio ``Protocol`` server: ``GET n\\n`` answers n bytes (byte i is i % 251), and
the connection stays open for the next line.

- ``naive``: answers a request by writing all n bytes at once. ``transport.write``
  never blocks: what the socket cannot take waits in the transport's buffer, so a
  client that reads slowly costs the server its whole answer in memory. Its factory
  returns the ``asyncio.Server``: stopping it is ``close()``, and whatever the
  transports still hold is lost when the loop ends.
- ``fixed``: writes 64 KiB at a time and only while the transport has not called
  ``pause_writing()``; ``resume_writing()`` continues. The transport's high-water mark
  (64 KiB on asyncio's loop; ``--loop looplab:high_water=16KiB`` changes it) bounds
  what a slow client costs. Its factory returns a server with ``async def shutdown()``:
  stop accepting, let the answers in flight be written out (up to 10 s), then close.

    looplab check examples/check/protocol_server.py:naive --send 'GET 33554432\\n' \\
        --healthy 'raw:GET 65536\\n::65536' --shutdown 'raw:GET 4000000\\n::4000000'
"""
from __future__ import annotations

import asyncio
from collections import deque

CHUNK = 65536
_BASE = bytes(range(251)) * (2 * CHUNK // 251 + 2)


def _chunk(at: int, n: int) -> bytes:
    k = at % 251
    return _BASE[k:k + n]


class _Lines(asyncio.Protocol):
    """Splits requests into lines; ``answer(n)`` is each version's own."""

    def connection_made(self, transport):
        self.transport = transport
        self.buf = b""

    def data_received(self, data):
        self.buf += data
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            parts = line.split()
            if len(parts) == 2 and parts[0] == b"GET" and parts[1].isdigit():
                self.answer(int(parts[1]))
            else:
                self.transport.close()
                return


class NaiveAnswer(_Lines):
    def answer(self, n):
        for at in range(0, n, CHUNK):
            self.transport.write(_chunk(at, min(CHUNK, n - at)))   # all of it, now


class FixedAnswer(_Lines):
    def connection_made(self, transport):
        super().connection_made(transport)
        self.owed = deque()          # [bytes written so far, n] per request, in order
        self.paused = False
        self.done = asyncio.get_running_loop().create_future()

    def answer(self, n):
        self.owed.append([0, n])
        self.pump()

    def pump(self):
        while self.owed and not self.paused:
            entry = self.owed[0]
            at, n = entry
            take = min(CHUNK, n - at)
            self.transport.write(_chunk(at, take))
            entry[0] += take
            if entry[0] >= n:
                self.owed.popleft()

    def pause_writing(self):
        self.paused = True

    def resume_writing(self):
        self.paused = False
        self.pump()

    def connection_lost(self, exc):
        if not self.done.done():
            self.done.set_result(None)


async def naive(host: str = "127.0.0.1", port: int = 0):
    loop = asyncio.get_running_loop()
    return await loop.create_server(NaiveAnswer, host, port)


class _Stoppable:
    """The listening server plus the connections it made, for a shutdown that lets
    every answer in flight finish."""

    def __init__(self, server, conns):
        self.server, self.conns = server, conns
        self.sockets = server.sockets

    async def shutdown(self, timeout_s: float = 10.0):
        self.server.close()                               # no new connections

        async def drained(p):
            while (p.owed or p.transport.get_write_buffer_size()) and not p.done.done():
                await asyncio.sleep(0.01)
            p.transport.close()                           # FIN once the buffer is out
            await p.done
        live = [p for p in self.conns if not p.done.done()]
        if live:
            await asyncio.wait([asyncio.ensure_future(drained(p)) for p in live],
                               timeout=timeout_s)


async def fixed(host: str = "127.0.0.1", port: int = 0):
    loop = asyncio.get_running_loop()
    conns: set = set()

    def made():
        p = FixedAnswer()
        conns.add(p)
        return p
    server = await loop.create_server(made, host, port)
    return _Stoppable(server, conns)
