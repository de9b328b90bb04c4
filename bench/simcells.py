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
* the **peers** are in-world participants (``SimRole`` below) that take the very
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
its peers and the app share one interpreter. Wall-clock fields (``cell_wall_s``)
stay wall clock; everything else in a sim cell is a function of its universe.

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
import struct
import threading

from kernels import simnet

__all__ = ["SimCell", "SimRole", "sim_capable", "SIM_REFERENCES", "NET_DEFAULTS", "new_world",
           "cell_world", "serve_app", "run_program", "universe", "UNIVERSE_MODEL", "make_role"]

UNIVERSE_MODEL = "looplab.simcell"
#: The network a cell runs on unless its universe says otherwise: simnet's
#: defaults (50 us one way, no bandwidth limit, no jitter), with Linux's
#: doubling of the SO_SNDBUF/SO_RCVBUF the scenarios pin, as real cells get it.
NET_DEFAULTS: dict = {"sockbuf_scale": 2}
_TICK = 0.05                        # the real peers' series period
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


class SimRole(simnet.Peer):
    """One ``bench.peers`` role spec played in the world, reporting what the
    real role reports. Subclasses implement ``_act``."""

    tracked = "received"

    def __init__(self, cell: SimCell, cfg: dict):
        super().__init__(cell.world, cfg["name"])
        self.cell = cell
        self.cfg = cfg
        self.began = cell.world.now
        self.sent = 0
        self.received = 0
        self.series: list = []
        self._next_sample = 0.0
        self._warm = None
        self._last_in = None
        self.res: dict = {"name": cfg["name"], "role": cfg["role"], "ended": None,
                          "connected": False}
        cell.roles[cfg["name"]] = self
        self._deadline = cell.world.call_at(self.began + cfg["max_s"], self._timeout)

    # the role's life -----------------------------------------------------------

    def _attach(self, s):
        size = self.cfg.get("sockbuf")
        if size:
            s.setsockopt(_socket.SOL_SOCKET, _socket.SO_SNDBUF, size)
            s.setsockopt(_socket.SOL_SOCKET, _socket.SO_RCVBUF, size)
        now = self.world.now
        self._next_sample = now
        self.res.update(connected=True, connected_at=now, connected_after_s=now - self.began,
                        sockbuf_effective=[s.sndbuf, s.rcvbuf])
        super()._attach(s)

    def listen(self, address, backlog=1):
        super().listen(address, backlog)
        size = self.cfg.get("sockbuf")
        if size:     # accepted sockets inherit the listener's buffers
            self._lsock.setsockopt(_socket.SOL_SOCKET, _socket.SO_SNDBUF, size)
            self._lsock.setsockopt(_socket.SOL_SOCKET, _socket.SO_RCVBUF, size)
        self.res["listen"] = list(address)
        return self

    def _timeout(self):
        if self.ended is None:
            self._finish("timeout")

    def _finish(self, how, reset=False):
        """End the role: close its sockets (an RST with ``reset``) and report."""
        for s in (self.sock, self._lsock):
            if s is not None:
                try:
                    if reset:
                        s.setsockopt(_socket.SOL_SOCKET, _socket.SO_LINGER, struct.pack("ii", 1, 0))
                    s.close()
                except OSError:
                    pass
        self._lsock = None
        if self.res["ended"] is None:
            self.res["ended"] = how
        self._end(how)

    def _end(self, how):
        first = self.ended is None
        super()._end(how)
        if first:
            self._deadline.cancel()
            if self.sock is not None:
                self.sock._watcher = None
            self.cell.role_ended(self)

    # counting ----------------------------------------------------------------

    def sample(self, now, force=False):
        if self.t0 is not None and (now >= self._next_sample or force):
            self.series.append([round(now - self.t0, 4), getattr(self, self.tracked)])
            self._next_sample = now + _TICK

    def count_in(self, n, now):
        self.received += n
        if self._warm is None and now - self.t0 >= self.cfg.get("warmup_s", math.inf):
            self._warm = (now, self.received)
        self._last_in = (now, self.received)
        self.sample(now)

    def rate_in_after_warmup(self):
        if self._warm is None or self._last_in[0] <= self._warm[0]:
            return None
        return (self._last_in[1] - self._warm[1]) / (self._last_in[0] - self._warm[0])

    def result(self) -> dict:
        res = dict(self.res)
        now = self.ended_at if self.ended_at is not None else self.world.now
        if self.t0 is not None:
            self.sample(now, force=True)
        if res["ended"] is None:
            res["ended"] = "closed"
        res.update(sent_bytes=self.sent, received_bytes=self.received, ran_s=now - self.began,
                   series=self.series)
        return res

    # helpers for subclasses ---------------------------------------------------

    def _recv(self, n):
        """``recv`` with the real role's error mapping: data, b"" at EOF, None
        when nothing is there; a reset ends the role."""
        try:
            return self.sock.recv(n)
        except BlockingIOError:
            return None
        except (ConnectionResetError, BrokenPipeError):
            self._finish("reset")
            return None
        except OSError as e:
            self.res["error"] = f"{e.strerror} [errno {e.errno}]"
            self._finish("error")
            return None


class _Reading(SimRole):
    """sink, reader and a healthy push_client: read and count until EOF, a
    reset, ``until`` (push_client's duration) or ``max_s``."""

    def __init__(self, cell, cfg, until_s=None):
        super().__init__(cell, cfg)
        self.until_s = until_s
        self._bucket = None
        self.first = None
        self.reading_from = None
        self.latencies = []           # (t, latency) of completed frames
        self._frame_i = 0
        self._stall_from = math.inf
        self._stall_to = math.inf

    def _start(self):
        cfg, now = self.cfg, self.world.now
        if cfg.get("rate_Bps"):
            self._bucket = simnet_bucket(cfg["rate_Bps"], cfg["recv_bytes"], now)
        if cfg.get("stall_s"):
            self._stall_from = now + cfg["stall_at_s"]
            self._stall_to = self._stall_from + cfg["stall_s"]
        if self.until_s is not None:
            self.world.call_at(now + self.until_s, self._until)

    def _until(self):
        if self.ended is None:
            self._finish("closed")

    def _act(self):
        if self.ended is not None or self.sock is None:
            return
        cfg = self.cfg
        while self.ended is None:
            now = self.world.now
            start = self.t0 + (cfg.get("start_after_s") or 0.0)
            if now < start:
                self._wake_at(start)
                return
            if self.reading_from is None:
                self.reading_from = now
            if self._stall_from <= now < self._stall_to:
                self._wake_at(self._stall_to)
                return
            if self._bucket is not None and self._bucket.due > now:
                self._wake_at(self._bucket.due)
                return
            data = self._recv(cfg["recv_bytes"])
            if data is None:
                return
            if not data:
                self._eof(now)
                return
            n = len(data)
            if self.first is None:
                self.first = now
                self.res["first_byte_after_s"] = now - self.t0
            before = self.received
            self.count_in(n, now)
            if self._bucket is not None:
                self._bucket.charge(n, now)
            if cfg.get("frame_bytes") and self.cell.frames is not None:
                self._frames_done(before, self.received, now)

    def _frames_done(self, before, total, now):
        """Latency of every frame whose last byte arrived in this read (the
        source stamped each frame when it began sending it)."""
        offsets, times = self.cell.frames
        i = self._frame_i
        while i + 1 < len(offsets) and offsets[i + 1] <= total:
            self.latencies.append((now, now - times[i]))
            i += 1
        self._frame_i = i

    def _eof(self, now):
        role = self.cfg["role"]
        self.res.update(eof_at=now, eof_after_s=now - self.t0)
        if role == "reader":
            self.res.update(eof_after_connect_s=now - self.t0,
                            eof_after_s=now - (self.first if self.first is not None
                                               else self.reading_from))
        self._finish("eof", reset=bool(self.cfg.get("close_with_reset")))

    def result(self):
        res = super().result()
        role = self.cfg["role"]
        if role in ("sink", "reader"):
            res.setdefault("eof_at", None)
            res.setdefault("eof_after_s", None)
            res["rate_after_warmup_Bps"] = self.rate_in_after_warmup()
        if role == "reader":
            res.setdefault("eof_after_connect_s", None)
            res.setdefault("first_byte_after_s", None)
        if role == "push_client":
            res["mode"] = "healthy"
        if self.latencies:
            lat = [v for _, v in self.latencies]
            res.update(frames_count=len(lat), max_latency_s=max(lat),
                       p50_latency_s=sorted(lat)[len(lat) // 2],
                       latency_series=_window_max(self.latencies, self.t0))
        elif role == "sink" and self.cfg.get("frame_bytes"):
            res.update(frames_count=0, max_latency_s=None, latency_series=[])
        return res


def simnet_bucket(rate, burst, now):
    return simnet._Bucket(rate, burst, now)


def _window_max(samples, t0) -> list:
    out: list = []
    end = -math.inf
    for t, v in samples:
        if t >= end:
            out.append([round(t - t0, 4), v])
            end = t + _TICK
        elif v > out[-1][1]:
            out[-1][1] = v
    return out


class _Source(SimRole):
    """source: frames of ``frame_bytes`` at ``rate_Bps`` for ``duration_s`` and/or
    ``total_bytes``, then ``finish`` (close, reset, or shutdown)."""

    tracked = "sent"

    def __init__(self, cell, cfg):
        super().__init__(cell, cfg)
        self.offsets, self.times = [], []
        if cell.frames is None:
            cell.frames = (self.offsets, self.times)
        self._left = 0
        self._bucket = None
        self._warm_mark = None
        self._last_done = None
        self.frames_sent = 0
        self._eof_wait = False

    def _start(self):
        cfg = self.cfg
        if cfg.get("rate_Bps"):
            self._bucket = simnet_bucket(cfg["rate_Bps"], 2 * cfg["frame_bytes"], self.world.now)

    def _eof_timeout(self):
        if self.ended is None:
            self.res["peer_eof"] = False
            self._finish("timeout")

    def _act(self):
        if self.ended is not None or self.sock is None:
            return
        cfg, s = self.cfg, self.sock
        now = self.world.now
        while self._eof_wait and self.ended is None:
            data = self._recv(cfg["recv_bytes"])
            if data is None:
                return
            if not data:
                self.res["peer_eof"] = True
                return self._finish("eof")
            self.received += len(data)
        while self.ended is None:
            if self._left:
                try:
                    n = s.send(simnet._pattern(self.sent, min(self._left, 4 << 20)))
                except BlockingIOError:
                    return
                except (ConnectionResetError, BrokenPipeError):
                    return self._finish("reset")
                except OSError as e:
                    self.res["error"] = f"{e.strerror} [errno {e.errno}]"
                    return self._finish("error")
                self.sent += n
                self._left -= n
                if self._left:
                    continue
                self._last_done = (now, self.sent)
                if self._warm_mark is None and now >= self.t0 + cfg["warmup_s"]:
                    self._warm_mark = self._last_done
                self.sample(now)
            dur, total = cfg.get("duration_s"), cfg.get("total_bytes")
            if (dur is not None and now >= self.t0 + dur) or (total is not None and self.sent >= total):
                return self._done()
            if self._bucket is not None and self._bucket.due > now:
                wake = self._bucket.due
                if dur is not None:
                    wake = min(wake, self.t0 + dur)
                self._wake_at(wake)
                return
            size = cfg["frame_bytes"]
            if total is not None:
                size = min(size, total - self.sent)
            self.offsets.append(self.sent)
            self.times.append(now)
            self.frames_sent += 1
            if self._bucket is not None:
                self._bucket.charge(size, now)
            self._left = size

    def _done(self):
        finish = self.cfg["finish"]
        now = self.world.now
        self.res["sending_s"] = now - self.t0
        if finish == "shutdown":
            try:
                self.sock.shutdown(_socket.SHUT_WR)
            except OSError:
                return self._finish("reset")
            # then wait up to eof_wait_s for the other side's EOF, counting what comes
            self._eof_wait = True
            self.world.call_at(now + self.cfg["eof_wait_s"], self._eof_timeout)
            return self._act()
        self._finish("reset_sent" if finish == "reset" else "closed", reset=finish == "reset")

    def result(self):
        res = super().result()
        span = (self.ended_at or self.world.now) - (self.t0 or 0)
        res.setdefault("peer_eof", None)
        res.update(finish=self.cfg["finish"], frames_sent=self.frames_sent,
                   rate_Bps=self.sent / span if self.t0 is not None and span > 0 else None,
                   rate_after_warmup_Bps=None)
        w, d = self._warm_mark, self._last_done
        if w is not None and d[0] > w[0]:
            res["rate_after_warmup_Bps"] = (d[1] - w[1]) / (d[0] - w[0])
        return res


class _Holding(SimRole):
    """pipeline_client (send ``count`` requests, never read, hold ``hold_s``) and
    a stalled push_client (never read, hold ``duration_s``): then close, which
    is an RST when responses sit unread. Ends early if the server ends first."""

    tracked = "sent"

    def __init__(self, cell, cfg, hold_s, requests=0):
        super().__init__(cell, cfg)
        self.hold_s = hold_s
        self.out = b"".join(b"REQ %d\n" % i for i in range(requests))
        self.requests = requests
        self.hold_until = None

    def _act(self):
        if self.ended is not None or self.sock is None:
            return
        s = self.sock
        while self.sent < len(self.out):
            try:
                n = s.send(self.out[self.sent:])
            except BlockingIOError:
                return
            except OSError:
                return self._finish("reset")
            self.sent += n
        if self.hold_until is None:
            self.hold_until = self.world.now + self.hold_s
            self.world.call_at(self.hold_until, self._held)
        if s.peer_reset:
            self._finish("reset")
        elif s.peer_eof:
            self._finish("eof")

    def _held(self):
        if self.ended is None:
            self._finish("closed")

    def _finish(self, how, reset=False):
        if self.sock is not None and self.res.get("unread_bytes") is None:
            self.res["unread_bytes"] = self.sock.unread_bytes
        super()._finish(how, reset)

    def result(self):
        res = super().result()
        res.setdefault("unread_bytes", None)
        if self.cfg["role"] == "pipeline_client":
            res["requests_sent"] = _requests_in(self.out, self.sent)
        else:
            res["mode"] = "stalled"
        return res


def _requests_in(out: bytes, sent: int) -> int:
    return out.count(b"\n", 0, sent)


class _Resetting(SimRole):
    """reset_peer: read until ``after_bytes`` or ``after_s``, then reset."""

    def _start(self):
        if self.cfg.get("after_s") is not None:
            self.world.call_at(self.world.now + self.cfg["after_s"], self._reset)

    def _reset(self):
        if self.ended is None:
            self._finish("reset_sent", reset=True)

    def _act(self):
        while self.ended is None and self.sock is not None:
            data = self._recv(self.cfg["recv_bytes"])
            if data is None:
                return
            if not data:
                return self._finish("eof")
            self.count_in(len(data), self.world.now)
            after = self.cfg.get("after_bytes")
            if after is not None and self.received >= after:
                return self._reset()


def make_role(cell: SimCell, cfg: dict) -> SimRole:
    kind = cfg["role"]
    if kind in ("sink", "reader"):
        return _Reading(cell, cfg)
    if kind == "source":
        return _Source(cell, cfg)
    if kind == "pipeline_client":
        return _Holding(cell, cfg, cfg["hold_s"], requests=cfg["count"])
    if kind == "push_client":
        if cfg["mode"] == "stalled":
            return _Holding(cell, cfg, cfg["duration_s"])
        return _Reading(cell, cfg, until_s=cfg["duration_s"])
    if kind == "reset_peer":
        return _Resetting(cell, cfg)
    raise ValueError(f"the simulated network has no {kind!r} peer yet")


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
