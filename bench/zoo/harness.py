"""Program plumbing shared by the zoo entries, one helper per port style.

``_callback``, ``_stream`` and ``_task`` open a port of the cell's runtime, run one
program on it bounded in time, and close it; the rest are small shared pieces.

The same programs run on the simulated network (``--net sim``): there the port is
opened on the world's seam (``protocols.ports.using_io``), so a program reads the
time through ``_now()``, blocks through ``_block()`` and opens a listening socket
through ``_listen()``, never through ``time`` or ``socket`` directly -- on real
sockets those three are exactly ``time.monotonic``, ``time.sleep`` and a bound
``socket.socket``.
"""
from __future__ import annotations

import contextlib
import logging
import time

from bench.host import procs
from bench.errors import CRASH_KEY
from protocols import ports

KiB, MiB = 1024, 1024 * 1024
SOCKBUF = 64 * KiB
_CAP = 4096          # bound on every synchronous fill loop (a dead transport never fills)


def _world():
    """The simulated world this program runs in, or None on real sockets."""
    return getattr(ports.current_io(), "world", None)


def _now() -> float:
    """The program's clock: virtual under ``--net sim``, monotonic otherwise."""
    io = ports.current_io()
    return io.time() if io is not None else time.monotonic()


def _block(seconds: float) -> None:
    """Block the whole program (no loop pass) for ``seconds``. In the world the
    network and the peers go on meanwhile, as the OS does while a process sleeps."""
    world = _world()
    if world is None:
        time.sleep(seconds)
    else:
        world.run(until=world.now + seconds)


def _listen(backlog: int = 16):
    """A listening TCP socket on 127.0.0.1 (an ephemeral port), from the ambient
    IO: pass it to ``start_server(sock=...)``."""
    s = ports.client_socket(None)
    try:
        s.bind(("127.0.0.1", 0))
        s.listen(backlog)
    except BaseException:
        s.close()
        raise
    return s


@contextlib.contextmanager
def _quiet_on_sim():
    """On real sockets a program's log lines go to its cell process's stderr, which
    the report does not show; in the world the program shares the orchestrator's
    process, so its runtime's warnings (asyncio's "socket.send() raised
    exception.", and our callback kernel's copy of it) are kept out of the terminal
    the same way: a handler that drops them stops logging's last-resort printer."""
    if _world() is None:
        yield
        return
    handler = logging.NullHandler()
    log = logging.getLogger()
    log.addHandler(handler)
    try:
        yield
    finally:
        log.removeHandler(handler)


def _rss() -> int:
    return procs.rss_bytes("self") or 0


class _P:
    """A callback-port protocol with hooks: remembers pause state and loss."""

    def __init__(self):
        self.transport = None
        self.paused = False
        self.lost = False
        self.lost_at = None
        self.eof = False
        self.received = 0
        self.on_resume = None
        self.on_lost = None
        self.on_eof = None
        self.on_data = None
        self.pauses = 0

    def connection_made(self, t):
        self.transport = t

    def data_received(self, data):
        self.received += len(data)
        if self.on_data:
            self.on_data(data)

    def eof_received(self):
        self.eof = True
        if self.on_eof:
            self.on_eof()
        return True

    def connection_lost(self, exc):
        self.lost, self.lost_at = True, _now()
        hook, self.on_lost = self.on_lost, None
        if hook:
            hook()

    def pause_writing(self):
        self.paused = True
        self.pauses += 1

    def resume_writing(self):
        self.paused = False
        hook, self.on_resume = self.on_resume, None
        if hook:
            hook()


def _callback(job, addr, start, max_s):
    """Connect a ``_P`` to ``addr`` and call ``start(port, transport, proto, out)``
    in the loop; runs until ``port.stop()`` or ``max_s`` (then ``out[CRASH_KEY]``: the cell is an error)."""
    port = job.runtime.open()
    out: dict = {}
    try:
        def setup(port):
            def bound():
                out[CRASH_KEY] = f"did not finish within {max_s} s"
                port.stop()
            port.call_later(max_s, bound)

            def done(t, p, exc):
                if exc is not None:
                    out[CRASH_KEY] = f"connect failed: {exc!r}"
                    port.stop()
                    return
                start(port, t, p, out)
            port.connect(_P, addr[0], addr[1], done, sockbuf=SOCKBUF)
        with _quiet_on_sim():
            port.run(setup)
    finally:
        out["probe_peak_bytes"] = port.probe().get("peak_user_buffer_bytes")
        port.close()
    return out


def _stream(job, main, max_s):
    """Run ``main(port, out)`` on a stream port, bounded by ``max_s``."""
    port = job.runtime.open()
    out: dict = {}

    async def outer(port):
        try:
            async with port.timeout(max_s):
                await main(port, out)
        except TimeoutError:
            out.setdefault("error", f"did not finish within {max_s} s")
    try:
        with _quiet_on_sim():
            port.run(outer)
    finally:
        out["probe_peak_bytes"] = port.probe().get("peak_user_buffer_bytes")
        port.close()
    return out


def _task(job, main, max_s):
    port = job.runtime.open()
    out: dict = {}

    async def outer(port):
        async with port.move_on_after(max_s) as scope:
            await main(port, out)
        if scope.cancelled_caught:
            out.setdefault("error", f"did not finish within {max_s} s")
    try:
        with _quiet_on_sim():
            port.run(outer)
    finally:
        port.close()
    return out


async def _open(port, addr, sockbuf=SOCKBUF):
    return await port.open_connection(addr[0], addr[1], sockbuf=sockbuf)


async def _open_task(port, addr):
    return await port.open_tcp_stream(addr[0], addr[1], sockbuf=SOCKBUF)


def _by_style(cb=None, st=None, tk=None) -> dict:
    return {k: v for k, v in (("callback", cb), ("stream", st), ("task", tk)) if v}


def _unless_cut(reader: dict, shown: bool) -> bool | None:
    """``shown``, unless the peer ended on its own deadline: then what it missed is no
    evidence of a loss (a loaded machine starved the cell) and the verdict is None."""
    return None if reader.get("ended") == "timeout" else shown


def _notes(app: dict) -> list:
    return [f"program: {app[CRASH_KEY]}"] if app.get(CRASH_KEY) else []


def _presets(tiny: dict, quick: dict | None = None) -> dict:
    return {"tiny": dict(tiny), "quick": dict(quick or tiny)}

