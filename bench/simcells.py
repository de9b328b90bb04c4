"""How one scenario cell runs inside one simulated world (``looplab run --net sim``).

On real sockets a cell is three processes: the peers (``bench.peers``), the app
under test (``bench.cell``) and the orchestrator. Under ``--net sim`` it is one
process and one deterministic sequence of events in a ``kernels.simnet.World``:

* the **app** is the same code as on real sockets -- the port driver serving an
  app (``protocols.callback|stream|task``) or the scenario's program
  (``bench.programs``) -- on a port opened inside
  ``protocols.ports.using_io(world.io())``: our kernels poll, sleep and open
  sockets through the simulated seam; asyncio's own selector loop runs over
  ``SimSelector``; trio runs under a custom clock with simulated trio sockets
  (uvloop and curio have no way onto the world: their cells are skipped);
* the **peers** are in-world participants (``SimRole``, ``bench.simroles``) that take the very
  role specs ``bench.peers`` takes (sink, source, reader, pipeline_client,
  push_client, reset_peer) and report results in the same vocabulary, with
  virtual times where the real ones report ``time.monotonic()``;
* the **scenario's own ``run`` function** is unchanged: ``serve_app`` and
  ``run_program`` (``bench.scenario``) hand over to ``serve_app`` and
  ``run_program`` here when the ``CellContext`` carries a world, so metrics and
  verdicts come from the same code on both networks -- which is what makes the
  differential check (``--net both``) mean something.

What stands in for the processes: the end of a server run (the orchestrator's
SIGINT once every peer has reported) is a ``KeyboardInterrupt`` raised out of
the poller's wait, as Python's default SIGINT handler would raise it; the end of
the app's process is ``World.exit_process("app")``: every socket the app still
holds is closed the way the OS closes a dead process's descriptors. A program's
``linger_s`` is virtual time the world runs after the program returned.

Not simulated (reported as ``None``, with a note): RSS growth -- the world,
its peers and the app share one interpreter (which is also why
``keep_freed_memory`` may keep freed blocks in the process). The cell's
wall-clock and CPU times (``cell_wall_s``, ``cell_cpu_s``) measure the machine;
everything else in a sim cell is a function of its universe.

The universe of a cell (``universe(cell, world)``) is the scenario, runtime
spec (its ``ready_order`` seed included), variant, preset, params and the
world's universe (seed, every network parameter, the full fault schedule).
``bench.simruns.cell_from_universe`` rebuilds the cell, and running it
replays it exactly; exploration (``--seeds``) and the run verb's options live
there too, above ``bench.scenarios`` (this module sits below it).
"""
from __future__ import annotations

import copy
import errno
import math
import os
import socket as _socket
import threading

from bench.simroles import SimRole, make_role, simnet_bucket  # noqa: F401 -- re-exported
from kernels import simnet

__all__ = ["SimCell", "SimRole", "sim_capable", "SIM_REFERENCES", "NET_DEFAULTS", "new_world",
           "cell_heap", "keep_freed_memory", "cell_world", "serve_app", "run_program", "universe", "UNIVERSE_MODEL", "make_role"]

UNIVERSE_MODEL = "looplab.simcell"
#: The network a cell runs on unless its universe says otherwise: simnet's
#: defaults (50 us one way, no bandwidth limit, no jitter), with Linux's
#: doubling of the SO_SNDBUF/SO_RCVBUF the scenarios pin, as real cells get it.
NET_DEFAULTS: dict = {"sockbuf_scale": 2}
# One sim cell at a time per process: the programs capture sys.stderr and the
# warnings filters process-wide (bench.programs.capture_output), and a world
# is CPU-bound anyway (``--jobs`` buys nothing under one GIL).
_ONE_AT_A_TIME = threading.Lock()
_SERVER_GRACE_S = 10.0


def sim_capable(runtime) -> str | None:
    """None if ``runtime`` can run on the simulated network, else why not."""
    if runtime.ours:
        return None
    install = _ON_SIM.get(runtime.id)     # the one table of reference runtimes that can
    if install is not None:
        install()
        return None
    return (f"{runtime.id} runs only on the real network: it has no port onto the "
            "simulated network yet" + (" (uvloop polls real file descriptors in C)"
                                       if "uvloop" in runtime.info.requires else ""))


def cell_heap():
    """What ``bench.scenarios.run_cell`` runs a sim cell inside: the garbage
    collector looks only at the cell's own objects (``programs.own_garbage``).
    An automatic full collection walks the whole heap -- 7 to 9 ms, more than a
    short cell's whole run -- and lands in whichever cell happens to cross its
    threshold; frozen, the heap is not walked. The cell's own garbage (its
    world, roles and buffers, mostly in cycles) is collected when it ends,
    with the cell's time. The first call also keeps freed memory in the
    process (``keep_freed_memory``)."""
    from bench import programs
    keep_freed_memory()
    return programs.own_garbage(collect=True)


_MALLOC_SET: list = []


def keep_freed_memory() -> bool:
    """Ask glibc's malloc (once per process) to keep freed blocks of up to
    32 MiB for reuse instead of handing them back to the OS.

    By default a block of 128 KiB or more comes from a fresh ``mmap`` and goes
    back with ``munmap`` when freed (and the heap's top is trimmed), so every
    time a naive relay's 20 MB buffer grows, the copy lands on fresh pages and
    page-faults them in: in S1's naive cells that was about half the cell's CPU
    time, system time for the kernel. Under ``--net sim`` RSS is not measured
    (see the module docstring), so where the bytes live changes no result.
    Returns whether the setting took (False off glibc)."""
    if _MALLOC_SET:
        return _MALLOC_SET[0]
    ok = False
    try:
        import ctypes
        mallopt = ctypes.CDLL(None).mallopt       # the process's own libc
    except (OSError, AttributeError, TypeError):
        mallopt = None
    if mallopt is not None:
        m_trim_threshold, m_mmap_threshold = -1, -3      # malloc.h
        ok = bool(mallopt(m_mmap_threshold, 32 << 20)) and bool(mallopt(m_trim_threshold, 1 << 30))
    _MALLOC_SET.append(ok)
    return ok


def new_world(seed=0, faults=None, **params) -> simnet.World:
    return simnet.World(seed, faults=faults, log=False, **{**NET_DEFAULTS, **params})


# ---------------------------------------------------------------------------
# The cell's world and its bookkeeping

class SimCell:
    """What a ``CellContext`` carries under ``--net sim``: the world, the roles
    living in it, and the source frames (for the sinks' latencies)."""

    def __init__(self, world: simnet.World):
        self.world = world
        self.roles: dict[str, SimRole] = {}
        self.frames = None            # the first source's (offsets, times)
        self._on_all_ended = None
        self._next_port = 9000

    def address(self):
        self._next_port += 1
        return ("127.0.0.1", self._next_port)

    def all_ended(self) -> bool:
        return all(r.ended is not None for r in self.roles.values())

    def role_ended(self, role) -> None:
        if self._on_all_ended is not None and self.all_ended():
            cb, self._on_all_ended = self._on_all_ended, None
            self.world.call_later(0, cb)

    def when_all_ended(self, cb) -> None:
        if self.all_ended():
            self.world.call_later(0, cb)
        else:
            self._on_all_ended = cb

    def run_until_peers_end(self, bound_at: float) -> None:
        """Run the world (the app is gone or idle) until every role ended or
        ``bound_at``; roles still running then end by their own ``max_s``."""
        world = self.world
        while not self.all_ended():
            t = world.next_time()
            if t is None or t > bound_at:
                break
            world.run(until=t)


# ---------------------------------------------------------------------------
# asyncio on the simulated network

_ASYNCIO_PATCHED = []


def _asyncio_on_sim() -> None:
    """Make ``asyncio.SelectorEventLoop`` a subclass that, in a thread inside
    ``protocols.ports.using_io(sim io)``, polls ``SimSelector``, wakes through a
    ``SimWaker`` and reads the virtual clock; anywhere else it is asyncio's
    loop unchanged. The asyncio ports build their loops from that name, and
    their client sockets come from ``ports.client_socket`` (the ambient IO), so
    asyncio's real transports, flow control and streams run on the world.
    Relies on three private CPython hooks (``_make_self_pipe``,
    ``_close_self_pipe``, ``_write_to_self``), checked on 3.11."""
    import asyncio
    if _ASYNCIO_PATCHED:
        return
    from protocols import ports
    base = asyncio.SelectorEventLoop

    class SimSelectorEventLoop(base):
        def __init__(self, selector=None):
            io = ports.current_io()
            self._sim_world = getattr(io, "world", None) if selector is None else None
            if self._sim_world is not None:
                selector = simnet.SimSelector(self._sim_world)
            super().__init__(selector)

        def _make_self_pipe(self):
            if getattr(self, "_sim_world", None) is None:
                return super()._make_self_pipe()
            self._sim_waker = self._sim_world.io("app").waker()
            self._ssock = self._csock = None
            self._internal_fds += 1
            self._add_reader(self._sim_waker.fileno(), self._sim_waker.drain)

        def _close_self_pipe(self):
            if getattr(self, "_sim_world", None) is None:
                return super()._close_self_pipe()
            self._remove_reader(self._sim_waker.fileno())
            self._sim_waker.close()
            self._internal_fds -= 1

        def _write_to_self(self):
            if getattr(self, "_sim_world", None) is None:
                return super()._write_to_self()
            self._sim_waker.wake()

        def time(self):
            world = getattr(self, "_sim_world", None)
            return world.now if world is not None else super().time()

    asyncio.SelectorEventLoop = SimSelectorEventLoop
    _ASYNCIO_PATCHED.append(base)


# ---------------------------------------------------------------------------
# trio on the simulated network

_TRIO_PATCHED = []


def _trio_on_sim() -> None:
    """Put trio on the world, as far as its public hooks go: a custom ``Clock``
    whose ``deadline_to_sleep_time`` -- which trio calls exactly when every task
    is blocked -- runs the world to the next event that readies a waiting task
    (or to trio's next deadline) and says "don't sleep"; and trio sockets over
    simulated ones (``SimTrioSocket``, a ``trio.socket.SocketType``), whose
    waits park the task with the clock instead of in trio's epoll. The trio port
    calls ``trio.run`` without a clock and ``trio.socket.from_stdlib_socket`` on
    its sockets, so in a thread inside ``using_io(sim io)`` those two names pass
    the clock in and wrap simulated sockets; anywhere else they are trio's own.
    The simulated SIGINT cancels the main task's scope."""
    import trio
    if _TRIO_PATCHED:
        return
    from protocols import ports
    real_run, real_from = trio.run, trio.socket.from_stdlib_socket

    def run(async_fn, *args, **kw):
        io = ports.current_io()
        world = getattr(io, "world", None)
        if world is None or "clock" in kw:
            return real_run(async_fn, *args, **kw)
        clock = _SimClock(world)
        box = []

        async def main():
            with trio.CancelScope() as scope:
                box.append(scope)
                return await async_fn(*args)

        def on_sigint():
            if box:
                box[0].cancel()
                clock.kicked = True
        ports.sim_sigint().append(on_sigint)
        _TRIO_CLOCK.append(clock)
        try:
            return real_run(main, clock=clock, **kw)
        finally:
            _TRIO_CLOCK.remove(clock)
            ports.sim_sigint().remove(on_sigint)

    def from_stdlib_socket(sock):
        if isinstance(sock, simnet.SimSocket):
            return _sim_trio_socket_class()(sock)
        return real_from(sock)

    trio.run = run
    trio.socket.from_stdlib_socket = from_stdlib_socket
    _TRIO_PATCHED.append((real_run, real_from))


_TRIO_CLOCK: list = []
_SIM_TRIO_SOCKET = []


class _SimClock:
    """trio's clock on the world (duck-typed ``trio.abc.Clock``)."""

    def __init__(self, world):
        self.world = world
        self.waiters: dict = {}       # task -> (SimSocket, mask)
        self.idle = 0
        self.kicked = False           # something outside the waiters woke a task

    def start_clock(self):
        pass

    def current_time(self):
        return self.world.now

    def _ready(self):
        import trio
        woke = False
        for task, (sock, mask) in list(self.waiters.items()):
            ev = sock._events()
            if ev & mask or ev & simnet._ERR or sock._app_closed:
                del self.waiters[task]
                trio.lowlevel.reschedule(task)
                woke = True
        return woke

    def deadline_to_sleep_time(self, deadline):
        world = self.world
        while True:
            world._run_due()
            if self._ready() or self.kicked:
                # a task is runnable again (a socket it waits on, or an event
                # that cancelled it): let trio run it before time moves
                self.kicked = False
                self.idle = 0
                return 0
            t = world.next_time()
            if not self.waiters and deadline == math.inf:
                t = None             # nothing of trio's waits on the world: don't move it
            if t is None or t > deadline:
                if deadline == math.inf:
                    # trio's own start-up and hand-offs block for a moment
                    # with no deadline; only a long run of them is a deadlock
                    self.idle += 1
                    if self.idle > 10_000:
                        raise simnet.SimDeadlock(f"simnet: trio is blocked at t={world.now:.6f}s "
                                                 "with nothing scheduled")
                    return 0
                if deadline > world.now:
                    world.now = deadline
                    self.idle = 0
                return 0
            world.now = t


def _sim_trio_socket_class():
    """``SimTrioSocket``: the part of ``trio.socket.SocketType`` that trio's
    ``SocketStream`` and ``SocketListener`` use, over a ``SimSocket``."""
    if _SIM_TRIO_SOCKET:
        return _SIM_TRIO_SOCKET[0]
    import trio

    class SimTrioSocket(trio.socket.SocketType):
        def __init__(self, sock):
            super().__init__()
            self._sock = sock
            sock.setblocking(False)
            self._shut_wr = False

        did_shutdown_SHUT_WR = property(lambda self: self._shut_wr)

        family = property(lambda self: self._sock.family)
        type = property(lambda self: self._sock.type)
        proto = property(lambda self: self._sock.proto)

        def fileno(self):
            return self._sock.fileno()

        def getsockname(self):
            return self._sock.getsockname()

        def getpeername(self):
            return self._sock.getpeername()

        def setsockopt(self, *a):
            return self._sock.setsockopt(*a)

        def getsockopt(self, level, option, *a):
            if level == _socket.SOL_SOCKET and option == _socket.SO_ACCEPTCONN:
                return int(self._sock._state == simnet._LISTENING)
            return self._sock.getsockopt(level, option, *a)

        def shutdown(self, how):
            self._sock.shutdown(how)
            if how in (_socket.SHUT_WR, _socket.SHUT_RDWR):
                self._shut_wr = True

        def close(self):
            self._sock.close()

        def is_readable(self):
            return bool(self._sock._events() & (simnet.READ | simnet._ERR))

        async def _wait(self, mask):
            clock = _TRIO_CLOCK[-1]
            task = trio.lowlevel.current_task()
            clock.waiters[task] = (self._sock, mask)

            def abort(_):
                clock.waiters.pop(task, None)
                clock.kicked = True
                return trio.lowlevel.Abort.SUCCEEDED
            await trio.lowlevel.wait_task_rescheduled(abort)

        async def wait_writable(self):
            await self._wait(simnet.WRITE)

        async def _io(self, mask, fn, *args):
            await trio.lowlevel.checkpoint_if_cancelled()
            while True:
                try:
                    out = fn(*args)
                except BlockingIOError:
                    await self._wait(mask)
                    continue
                await trio.lowlevel.cancel_shielded_checkpoint()
                return out

        async def send(self, data, flags=0):
            return await self._io(simnet.WRITE, self._sock.send, data)

        async def recv(self, n=65536, flags=0):
            return await self._io(simnet.READ, self._sock.recv, n)

        async def recv_into(self, buf, n=0, flags=0):
            return await self._io(simnet.READ, self._sock.recv_into, buf, n)

        async def accept(self):
            conn, addr = await self._io(simnet.READ, self._sock.accept)
            return SimTrioSocket(conn), addr

        async def connect(self, address):
            await trio.lowlevel.checkpoint_if_cancelled()
            err = self._sock.connect_ex(address)
            if err == errno.EINPROGRESS:
                await self._wait(simnet.WRITE)
                err = self._sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_ERROR)
            if err:
                raise OSError(err, f"connect to {address}: {os.strerror(err)} (simulated)")

    _SIM_TRIO_SOCKET.append(SimTrioSocket)
    return SimTrioSocket


# ---------------------------------------------------------------------------
# The app side, in the world

def _interrupt():
    """What the orchestrator's SIGINT does to the app process: the handler the
    running port installed (``protocols.ports.sim_sigint()``), or else Python's
    default, a KeyboardInterrupt out of whatever runs (here: the poller's wait)."""
    from protocols import ports
    handlers = ports.sim_sigint()
    if handlers:
        handlers[-1]()
    else:
        raise KeyboardInterrupt


def _place_roles(cell: SimCell, specs, bound, app_addr=None, app_marker="app"):
    """Create the roles (checked and completed with their defaults by
    ``bench.peers.check_role``); listening ones listen now, ones that connect to
    the app (``connect=app_marker``, ``bench.scenario.APP``) dial ``app_addr``.
    Returns {name: address} of the listening ones."""
    from bench import peers as peermod
    addrs = {}
    for r in specs:
        r = dict(r)
        to_app = r.pop("connect", None) == app_marker
        r.pop("listen", None)
        r["deferred"] = True          # no real endpoint: the world gives one
        cfg = peermod.check_role(r, bound)
        role = make_role(cell, cfg)
        if to_app:
            role.connect(app_addr)
        else:
            addr = cell.address()
            role.listen(addr)
            addrs[cfg["name"]] = addr
    return addrs


def _listener(io, sockbuf):
    s = io.socket()
    if sockbuf:
        s.setsockopt(_socket.SOL_SOCKET, _socket.SO_SNDBUF, sockbuf)
        s.setsockopt(_socket.SOL_SOCKET, _socket.SO_RCVBUF, sockbuf)
    s.setblocking(False)
    s.bind(("127.0.0.1", 8000))
    s.listen(128)
    return s


def serve_app(ctx, app: str, *, peers=(), params=None, upstream=None, bound=30.0,
              app_marker="app"):
    """``bench.scenario.serve_app`` in the world: the same driver serves ``app``
    on the runtime's port opened on the world's seam; the roles play the peers.
    Returns (the app side's dict, {role name: result})."""
    from protocols import callback, ports, stream, task
    drivers = {"callback": callback, "stream": stream, "task": task}
    cell: SimCell = ctx.sim
    world = cell.world
    params = dict(params or {})
    counters: dict = {}
    params["counters"] = counters
    io = world.io("app")
    sock = _listener(io, params.get("sockbuf"))
    addrs = _place_roles(cell, peers, bound, app_addr=sock.getsockname(), app_marker=app_marker)
    if upstream:
        params["upstream"] = addrs[upstream]
    rt = ctx.runtime
    interrupted = False
    start = world.now
    with _ONE_AT_A_TIME, ports.using_io(io):
        port = rt.open()
        cell.when_all_ended(_interrupt)
        hard = world.call_at(start + bound, _interrupt)
        try:
            drivers[rt.style].serve(port, app, sock, ctx.variant, params)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            hard.cancel()
            cell._on_all_ended = None
            try:
                port.close()
            except KeyboardInterrupt:
                port.close()
            sock.close()
    probe = port.probe()
    world.exit_process("app")
    cell.run_until_peers_end(start + bound)
    ctx.notes.append("simulated network: RSS growth is not measured (one process)")
    return ({"probe": probe, "counters": counters, "interrupted": interrupted,
             "rss_growth_bytes": None},
            {name: role.result() for name, role in cell.roles.items()})


def run_program(ctx, make_job, *, peers=(), linger_s: float = 0.0, bound=30.0):
    """``bench.scenario.run_program`` in the world: the scenario's program runs on
    the world's seam. ``make_job(addresses)`` builds the program's ``Job``.
    Returns (what the program returned, {role name: result}, the virtual time
    it returned)."""
    from bench import programs
    from protocols import ports
    cell: SimCell = ctx.sim
    world = cell.world
    addrs = _place_roles(cell, peers, bound + 5)
    start = world.now
    job = make_job(addrs)
    fn = ctx.scenario.program_for(ctx.runtime)
    io = world.io("app")
    with _ONE_AT_A_TIME, ports.using_io(io):
        out = fn(job)
        if not isinstance(out, dict):
            raise TypeError(f"the program of {ctx.scenario.id} returned "
                            f"{type(out).__name__}, not a dict")
        stopped = world.now
        out["loop_stopped_at"] = stopped
        out["rss_growth_bytes"] = None
        # the process lingers: the OS keeps sending what the sockets hold
        world.run(until=stopped + linger_s)
        programs.release_held()
    world.exit_process("app")
    cell.run_until_peers_end(start + bound + 5)
    return out, {name: role.result() for name, role in cell.roles.items()}, stopped


# ---------------------------------------------------------------------------
# Universes: what decides a sim cell, and replay

def cell_world(cell, repeat: int, result: dict) -> SimCell:
    """The world repeat ``repeat`` of ``cell`` runs in: ``cell.world`` (a simnet
    universe, or part of one: ``seed``, ``params``, ``faults``) with the seed
    moved on by ``repeat``. Its universe goes into ``result`` (``universe``, and
    ``universes`` for more than one repeat)."""
    spec = dict(cell.world or {})
    seed = spec.get("seed", 0)
    if repeat:
        seed = seed + repeat if isinstance(seed, int) else f"{seed}+{repeat}"
    world = new_world(seed, spec.get("faults"), **dict(spec.get("params") or {}))
    u = universe(cell, world)
    if repeat == 0:
        result["net"] = "sim"
        result["universe"] = u
    else:
        result.setdefault("universes", [result["universe"]]).append(u)
    return SimCell(world)


def universe(cell, world: simnet.World) -> dict:
    """Everything that decides this cell's run, as plain JSON values."""
    return {"model": UNIVERSE_MODEL, "version": 1, "scenario": cell.scenario,
            "runtime": cell.runtime, "variant": cell.variant, "preset": cell.preset,
            "params": copy.deepcopy(cell.params), "net": world.universe()}


#: Reference runtimes with a way onto the simulated network: asyncio's own selector
#: event loop over ``SimSelector``, and trio with a clock and sockets of the world.
_ON_SIM = {"asyncio-protocol": _asyncio_on_sim, "asyncio-streams": _asyncio_on_sim,
           "trio": _trio_on_sim}
SIM_REFERENCES = tuple(_ON_SIM)
