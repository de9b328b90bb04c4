"""The probe registry and what every probe shares: the plain-socket peer a probe drives
itself, a log catcher, and exception naming.

A probe is a function registered with ``@probe(style)``; it takes the side of its style
(see ``bench.fidelity``) and returns a small JSON-able observation.
"""
from __future__ import annotations

import logging
import socket
import struct

MB = 1_000_000
SOCKBUF = 65536


class EdgeProbe:
    """One registered probe: ``name``, ``style``, the function, what it checks, the
    sides (adapter class names) it does not apply to (the API does not map there),
    ``documented``: the sentence of the asyncio docs that promises the behaviour (a
    ``bench.fidelity.promises.Promise``; None: de-facto, CPython does it without a
    promise), ``twin_of``: older probes whose divergence this self-contained one
    reproduces, and ``standalone``: its source is its own reproduction (the loop
    probes)."""
    __slots__ = ("name", "style", "fn", "doc", "skip", "documented", "twin_of", "standalone")

    def __init__(self, name, style, fn, doc, skip, documented=None, twin_of=(), standalone=False):
        self.name, self.style, self.fn, self.doc, self.skip = name, style, fn, doc, skip
        self.documented, self.twin_of, self.standalone = documented, tuple(twin_of), standalone


PROBES: dict[str, EdgeProbe] = {}


def probe(style, unmapped_on=(), documented=None, twin_of=(), standalone=False):
    """Register the decorated function as a probe of ``style``; ``unmapped_on``: the
    names of the side classes whose library's API does not map onto it;
    ``documented``: the quoted promise of the asyncio docs it checks (a ``Promise``);
    ``twin_of``: probes whose divergence it reproduces standalone; ``standalone``: its
    source runs on its own (``looplab fidelity --repro``)."""
    def register(fn):
        name = fn.__name__
        if name in PROBES:
            raise ValueError(f"duplicate probe {name}")
        doc = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else name
        PROBES[name] = EdgeProbe(name, style, fn, doc, tuple(unmapped_on), documented, twin_of,
                                 standalone)
        return fn
    return register


def asyncio_loop_factory(options):
    """A zero-argument factory for the asyncio event loop a runtime's options name:
    ``loop`` (asyncio's selector loop by default, uvloop, rloop, looplab's or
    ``MODULE:FACTORY``), its ``loop.NAME`` keywords (passed here as ``"loop.NAME"``
    keys), and ``eager`` (``asyncio.eager_task_factory``)."""
    import asyncio

    from protocols.asyncio_ports import resolve_loop
    name = options.get("loop", "asyncio")
    kwargs = {k[len("loop."):]: v for k, v in options.items() if k.startswith("loop.")}
    made = asyncio.new_event_loop if name == "asyncio" and not kwargs else resolve_loop(name)

    def make():
        loop = made(**kwargs)
        if options.get("eager"):
            loop.set_task_factory(asyncio.eager_task_factory)
        return loop
    return make


def ename(exc) -> str | None:
    return None if exc is None else type(exc).__name__


async def catch(aw):
    """Await ``aw``: ``{"value": ...}``, or ``{"raised": exception name}``."""
    try:
        return {"value": await aw}
    except BaseException as exc:
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return {"raised": ename(exc)}


# ---------------------------------------------------------------------------
# Plain-socket peers

class Listener:
    """A 127.0.0.1 listening socket: ``pair()`` -> (our socket, the peer's socket)."""

    def __init__(self):
        self.sock = socket.socket()
        # Small kernel buffers (inherited by accepted sockets), so a 1 MB write
        # really leaves most of itself in the user-space buffer.
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKBUF)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.opened = []

    def pair(self):
        ours = socket.socket()
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKBUF)
        ours.connect(("127.0.0.1", self.port))
        peer, _ = self.sock.accept()
        peer.setblocking(False)
        self.opened += [ours, peer]
        return ours, peer

    def close(self):
        for s in self.opened + [self.sock]:
            try:
                s.close()
            except OSError:
                pass


def reset(peer):
    """Close ``peer`` with an RST instead of a FIN (SO_LINGER 0)."""
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    peer.close()


def drain(peer) -> tuple[int, bool]:
    """Read what a non-blocking peer socket has: (bytes, saw EOF)."""
    n = 0
    while True:
        try:
            chunk = peer.recv(1 << 20)
        except (BlockingIOError, InterruptedError):
            return n, False
        except OSError:
            return n, True
        if not chunk:
            return n, True
        n += len(chunk)


class LogCatcher(logging.Handler):
    """Collects a logger's messages (WARNING and up unless its level is changed)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())
