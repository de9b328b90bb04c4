"""How one scenario cell runs inside one simulated world (``looplab run --net sim``).

On real sockets a cell is three processes: the peers (``bench.peers``), the app
under test (``bench.scenarios.appside``) and the orchestrator. Under ``--net sim`` it is one
process and one deterministic sequence of events in a ``kernels.simnet.World``:

* the **app** is the same code as on real sockets -- the port driver serving an
  app (``protocols.callback|stream|task``) or the scenario's program
  (``bench.scenarios.programs``) -- on a port opened inside
  ``protocols.ports.using_io(world.io())``: our kernels poll, sleep and open
  sockets through the simulated seam; the reference libraries' ports build
  what they need from ``protocols.simports`` (asyncio's own selector loop over
  ``SimSelector``, trio with a clock and sockets of the world, curio with a
  kernel on it). A runtime that declares it runs only on the real network
  (uvloop) has its cells skipped with the reason (``sim_capable``);
* the **peers** are in-world participants (``SimPeer``, ``bench.peers.sim``): the very
  role cores the peer process runs (``bench.peers``: sink, source, reader,
  pipeline_client, push_client, echo_client, reset_peer and any registered
  role), on the world's sockets, with virtual times where the real ones
  report ``time.monotonic()``;
* the **scenario's own ``run`` function** is unchanged: ``serve_app`` and
  ``run_program`` (``bench.scenarios.api``) hand over to ``serve_app`` and
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
``bench.run.seeds.cell_from_universe`` rebuilds the cell, and running it
replays it exactly; exploration (``--seeds``) and the run verb's options live
there too, above ``bench.run`` (this module sits below it).
"""
from __future__ import annotations

import contextlib
import copy
import threading
import weakref

from bench.peers.sim import SimPeer, SimRole, make_role  # noqa: F401 -- re-exported
from kernels import simnet

__all__ = ["SimCell", "SimRole", "sim_capable", "NET_DEFAULTS", "new_world", "cell_heap",
           "keep_freed_memory", "cell_world", "serve_app", "run_program", "universe",
           "UNIVERSE_MODEL", "make_role", "WATCHDOG_S", "stop_all", "app_output", "one_cell_at_a_time"]

UNIVERSE_MODEL = "looplab.simcell"
#: The network a cell runs on unless its universe says otherwise: loopback as
#: Linux runs it -- the SO_SNDBUF/SO_RCVBUF the scenarios pin, doubled and
#: counted in skbs as Linux counts them; a stack that settles within
#: microseconds (2 us one way, no bandwidth limit, no jitter); and processes
#: that wake 20 us after their socket readies (docs/simnet.md, "Linux's accounting").
NET_DEFAULTS: dict = {"sockbuf_scale": 2, "accounting": "linux", "latency_s": 2e-6,
                      "wake_s": 20e-6}
# One sim cell at a time per process: the programs capture sys.stderr and the
# warnings filters process-wide (bench.scenarios.programs.capture_output), and a world
# is CPU-bound anyway (``--jobs`` buys nothing under one GIL). Re-entrant: a repeat
# holds it (``app_output``) around the serve_app or run_program that takes it again.
_ONE_AT_A_TIME = threading.RLock()
_SERVER_GRACE_S = 10.0

#: A sim cell's wall-clock watchdog: a cell still running after this long (a
#: program spinning on the world, a livelock the event budget cannot see) ends
#: as an error (``SimStopped``), its universe kept in its result for --replay.
#: Every built-in cell at every preset takes seconds; this is a hang detector.
WATCHDOG_S = 300.0
_LIVE: "weakref.WeakSet[simnet.World]" = weakref.WeakSet()   # worlds of cells now running
#: Called with each cell's new world before anything runs in it: the explorer
#: (``bench.explore``) installs its chooser there (``World.install_chooser``).
WORLD_HOOKS: list = []


def stop_all(reason: str) -> int:
    """Stop every sim cell's world now running (SIGINT/SIGTERM: the matrix's
    ``abort_running``, the exploration's handler): each ends at its next step
    with ``SimStopped(reason)``. Returns how many."""
    live = list(_LIVE)
    for world in live:
        world.stop(reason)
    return len(live)


@contextlib.contextmanager
def app_output(result: dict):
    """Around one repeat of a sim cell (``one_cell_at_a_time`` held): what the app writes on
    stderr, logs or warns -- a task's "exception was never retrieved" when its world
    is collected, say -- is the app's output, as it would be in the app process on
    real sockets, not a line in the progress output. It lands in the cell's notes
    (the first few lines)."""
    from bench.scenarios.programs import capture_output
    captured = capture_output()
    captured.__enter__()
    try:
        yield
    finally:
        captured.__exit__(None, None, None)     # collects: late reports land here
        lines = [ln for ln in captured.lines if ln.strip()]
        for ln in lines[:APP_OUTPUT_LINES]:
            note = f"the app wrote: {ln.strip()[:300]}"
            if note not in result["notes"]:
                result["notes"].append(note)
        if len(lines) > APP_OUTPUT_LINES:
            result["notes"].append(f"the app wrote {len(lines) - APP_OUTPUT_LINES} more "
                                   "line(s) on stderr")


def one_cell_at_a_time():
    """The lock a sim cell's repeat holds (re-entrant): one simulated cell at a time
    per process, since capturing its output and freezing its heap are process-wide."""
    return _ONE_AT_A_TIME


#: How many lines of a sim cell's app output its notes keep.
APP_OUTPUT_LINES = 5


def sim_capable(runtime) -> str | None:
    """None if ``runtime`` can run on the simulated network, else why not: what
    the runtime declares (``RuntimeInfo.real_network_only``)."""
    return runtime.real_network_only()


def cell_heap():
    """What ``bench.run.repeats.run_cell`` runs a sim cell inside: the garbage
    collector looks only at the cell's own objects (``programs.own_garbage``).
    An automatic full collection walks the whole heap -- 7 to 9 ms, more than a
    short cell's whole run -- and lands in whichever cell happens to cross its
    threshold; frozen, the heap is not walked. The cell's own garbage (its
    world, roles and buffers, mostly in cycles) is collected when it ends,
    with the cell's time. The first call also keeps freed memory in the
    process (``keep_freed_memory``)."""
    from bench.scenarios import programs
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
    """What a ``CellContext`` carries under ``--net sim``: the world and the roles
    living in it."""

    def __init__(self, world: simnet.World):
        self.world = world
        self.roles: dict[str, SimPeer] = {}
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
    the app (``connect=app_marker``, ``bench.scenarios.api.APP``) dial ``app_addr``.
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
    from protocols.ports import bind_listener
    s = bind_listener("127.0.0.1", 8000, sockbuf, io=io)
    s.setblocking(False)
    return s


def serve_app(ctx, app: str, *, peers=(), params=None, upstream=None, bound=30.0,
              app_marker="app"):
    """``bench.scenarios.api.serve_app`` in the world: the same driver serves ``app``
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
    """``bench.scenarios.api.run_program`` in the world: the scenario's program runs on
    the world's seam. ``make_job(addresses)`` builds the program's ``Job``.
    Returns (what the program returned, {role name: result}, the virtual time
    it returned)."""
    from bench.scenarios import programs
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
    world.watchdog(WATCHDOG_S)
    for hook in WORLD_HOOKS:
        hook(world)
    _LIVE.add(world)
    u = universe(cell, world)
    if repeat == 0:
        result["net"] = "sim"
        result["universe"] = u
    else:
        result.setdefault("universes", [result["universe"]]).append(u)
    sc = SimCell(world)
    world.cell = sc        # what an explorer's declared properties read (the peers)
    return sc


def universe(cell, world: simnet.World) -> dict:
    """Everything that decides this cell's run, as plain JSON values."""
    return {"model": UNIVERSE_MODEL, "version": 1, "scenario": cell.scenario,
            "runtime": cell.runtime, "variant": cell.variant, "preset": cell.preset,
            "params": copy.deepcopy(cell.params), "net": world.universe()}
