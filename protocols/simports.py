"""The reference libraries on the simulated network: the adapters their ports build from.

Our kernels take the simulated world through the I/O-and-time seam
(``Loop(io=)``, ``Runner(io=)``, ``Kernel(io=)``). asyncio, trio and curio have no
such seam, so each port asks ``sim_io()`` whether it is being opened on a
simulated network (``protocols.ports.using_io`` with a ``kernels.simnet.SimIO``)
and, if so, builds what it needs from here, explicitly:

* **asyncio** -- ``SimSelectorEventLoop(io)``: asyncio's own ``SelectorEventLoop``
  over ``SimSelector``, so its real transports, flow control and streams run.
  Three private CPython hooks (``_make_self_pipe``, ``_close_self_pipe``,
  ``_write_to_self``) swap the self-pipe for a ``SimWaker``; ``time()`` reads the
  virtual clock. ``create_server``/``create_connection`` given a host and port
  (so ``asyncio.start_server`` and ``open_connection`` of an unmodified app)
  make their sockets on the world and hand them to asyncio's own code as
  ``sock=``; ``getaddrinfo`` is the world's. Checked on CPython 3.11.
* **trio** -- ``run_trio(io, ...)`` calls ``trio.run`` with ``clock=SimClock``, a
  public ``trio.abc.Clock`` that runs the world whenever every task is blocked,
  and sets trio's per-run socket factory and hostname resolver to the world's;
  ``trio_socket(sock)`` turns a socket into a trio socket, a ``SimTrioSocket``
  (a ``trio.socket.SocketType``) when it is simulated. Public hooks, and one
  private generator seeded for the run (trio's batch order, ``_trio_batch_order``);
  under an explorer, that generator and trio's deterministic-scheduling flag are
  swapped for the run so that the explorer draws each batch's order.
* **curio** -- ``curio_kernel(io, ...)``: a ``curio.Kernel`` with
  ``selector=SimSelector``. curio's kernel reads ``time.monotonic`` and calls
  ``socket.socketpair()`` through its module's globals and takes neither as a
  parameter, so ``SimKernel`` runs curio's own ``Kernel._make_kernel_runtime``
  with a private copy of those globals in which they are the virtual clock and
  a ``SimWaker``. Nothing of curio is modified.

Nothing here replaces an attribute of a module, except trio's two scheduler
globals while an explored run lasts (put back after it): outside a simulated
cell every library is untouched. The libraries are imported only when a port needs them;
a missing one (or a curio whose kernel no longer has the shape above) raises
``Unavailable`` with the reason. Which runtimes can run on the simulated network
at all is declared on their ``RuntimeInfo`` (``real_network_only``).
"""
from __future__ import annotations

import errno
import functools
import heapq
import importlib
import math
import os
import random
import socket as _socket
import sys
import types

from kernels import choice as _choice
from protocols import ports
from protocols.errors import Unavailable

# Also public, built on first use because they subclass a library's classes:
# SimSelectorEventLoop, SimClock, SimTrioSocket, SimKernel (left out of __all__
# so that a star import does not import trio and curio).
__all__ = ["sim_io", "run_trio", "trio_socket", "curio_kernel", "WakeSocket"]


def sim_io():
    """The ambient IO object if it is a simulated network's, else None."""
    io = ports.current_io()
    if io is None:
        return None                   # the real network: kernels.simnet stays unimported
    from kernels import simnet
    return io if isinstance(io, simnet.SimIO) else None


def _library(name: str):
    try:
        return importlib.import_module(name)
    except Exception as exc:       # ImportError, or a library failing inside its import
        raise Unavailable(f"{name} is not importable ({type(exc).__name__}: {exc})") from None


def _named(cls):
    cls.__qualname__ = cls.__name__       # not "_builder.<locals>.Name" in reprs
    return cls


def __getattr__(name):
    # The adapters subclass a library's classes, so they exist once it is imported.
    builders = {"SimSelectorEventLoop": _asyncio_loop_class, "SimTrioSocket": _trio_socket_class,
                "SimKernel": _curio_kernel_class, "SimClock": _trio_clock_class}
    if name in builders:
        return builders[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------------------
# asyncio

@functools.cache
def _asyncio_loop_class():
    asyncio = _library("asyncio")

    class SimSelectorEventLoop(asyncio.SelectorEventLoop):
        """asyncio's selector event loop on a simulated network (``io``, a ``SimIO``)."""

        def __init__(self, io):
            self._sim_io = io          # before super(): it makes the self-pipe
            selector = io.world.selector()
            selector.orders_events = False     # _process_events orders them (below)
            super().__init__(selector)

        def _make_self_pipe(self):
            self._sim_waker = self._sim_io.waker()
            self._ssock = self._csock = None
            self._internal_fds += 1
            self._add_reader(self._sim_waker.fileno(), self._sim_waker.drain)

        def _close_self_pipe(self):
            self._remove_reader(self._sim_waker.fileno())
            self._sim_waker.close()
            self._internal_fds -= 1

        def _write_to_self(self):
            self._sim_waker.wake()

        def time(self):
            return self._sim_io.time()

        def _process_events(self, event_list):
            # An explorer's choices (kernels.choice), only when one is installed:
            # the order of one select's events, I/O deferred behind callbacks and
            # timers already due, and the order of timers due at one instant
            # (asyncio leaves all three undefined). The due timers go to the ready
            # queue here, just before _run_once would move them, so its own loop
            # finds none.
            chooser = self._sim_io.chooser
            if chooser is None:
                return super()._process_events(event_list)
            end = self.time() + self._clock_resolution
            scheduled = self._scheduled
            due = bool(self._ready) or bool(scheduled and scheduled[0]._when < end)
            super()._process_events(_choice.poll_order(chooser.choose, event_list, due))
            timers = []
            while scheduled and scheduled[0]._when < end:
                timers.append(heapq.heappop(scheduled))
            i = 0
            while i < len(timers):
                j = i + 1
                while j < len(timers) and timers[j]._when == timers[i]._when:
                    j += 1
                group = timers[i:j] if j - i < 2 else \
                    _choice.permute(chooser.choose, _choice.TIMER_TIE, timers[i:j])
                for handle in group:
                    handle._scheduled = False
                    self._ready.append(handle)
                i = j

        # asyncio makes the sockets of create_server and create_connection
        # itself, from the socket module, when given a host and port; here they
        # come from the world, and asyncio's own code takes them as ``sock=``.
        # Names resolve through the world too (asyncio would ask the real
        # resolver in a thread, which the virtual clock never waits for).

        async def getaddrinfo(self, host, port, *, family=0, type=0, proto=0, flags=0):
            return self._sim_io.getaddrinfo(host, port, family, type, proto, flags)

        async def getnameinfo(self, sockaddr, flags=0):
            raise OSError(errno.ENOSYS, "the simulated network has no names")

        async def create_server(self, protocol_factory, host=None, port=None, *,
                                family=_socket.AF_UNSPEC, flags=_socket.AI_PASSIVE, sock=None,
                                backlog=100, reuse_address=None, reuse_port=None, **kw):
            if sock is None and (host is not None or port is not None):
                hosts = [host] if host is None or isinstance(host, str) else list(host)
                if len(hosts) != 1:
                    raise OSError(errno.EINVAL, "a simulated server listens on one host")
                info = self._sim_io.getaddrinfo(hosts[0], port, family, _socket.SOCK_STREAM,
                                                0, flags)[0]
                sock = self._sim_io.socket(info[0], info[1], info[2])
                try:
                    sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
                    sock.bind(info[4])
                except BaseException:
                    sock.close()
                    raise
            return await super().create_server(protocol_factory, sock=sock, backlog=backlog,
                                               **kw)

        async def create_connection(self, protocol_factory, host=None, port=None, *,
                                    family=0, proto=0, flags=0, sock=None, local_addr=None,
                                    happy_eyeballs_delay=None, interleave=None, **kw):
            if sock is None and (host is not None or port is not None):
                sock = await self._sim_connect(host, port, family, proto, flags, local_addr)
                if kw.get("ssl") and kw.get("server_hostname") is None:
                    kw["server_hostname"] = host      # what asyncio infers from host
            return await super().create_connection(protocol_factory, sock=sock, **kw)

        async def _sim_connect(self, host, port, family, proto, flags, local_addr):
            error = None
            for fam, typ, pro, _, addr in self._sim_io.getaddrinfo(
                    host, port, family, _socket.SOCK_STREAM, proto, flags):
                sock = self._sim_io.socket(fam, typ, pro)
                sock.setblocking(False)
                try:
                    if local_addr is not None:
                        sock.bind(local_addr)
                    await self.sock_connect(sock, addr)
                    return sock
                except OSError as exc:
                    sock.close()
                    error = exc
                except BaseException:
                    sock.close()
                    raise
            raise error or OSError(f"getaddrinfo({host!r}) returned nothing")

    return _named(SimSelectorEventLoop)


# ---------------------------------------------------------------------------
# trio

def run_trio(io, main, *args, **kw):
    """``trio.run(main, *args, clock=SimClock(io.world), **kw)``. Inside, trio's
    own socket factory and hostname resolver (``trio.socket.socket()``,
    ``trio.open_tcp_stream``, ``trio.open_tcp_listeners``) are the world's too:
    both are per-run settings of trio. The cell's simulated SIGINT
    (``ports.sim_sigint()``) cancels ``main``, which then returns None."""
    trio = _library("trio")
    clock = _trio_clock_class()(io.world)
    scopes = []

    class Factory(trio.abc.SocketFactory):
        def socket(self, family=_socket.AF_INET, type=_socket.SOCK_STREAM, proto=0):
            return _trio_socket_class()(io.socket(family, type, proto))

    class Resolver(trio.abc.HostnameResolver):
        async def getaddrinfo(self, host, port, family=0, type=0, proto=0, flags=0):
            await trio.lowlevel.checkpoint()
            return io.getaddrinfo(host, port, family, type, proto, flags)

        async def getnameinfo(self, sockaddr, flags):
            raise OSError(errno.ENOSYS, "the simulated network has no names")

    async def cancellable():
        trio.socket.set_custom_socket_factory(Factory())
        trio.socket.set_custom_hostname_resolver(Resolver())
        with trio.CancelScope() as scope:
            scopes.append(scope)
            return await main(*args)

    def on_sigint():
        if scopes:
            scopes[0].cancel()
            clock.kicked = True
    clock.on_failure = on_sigint
    ports.sim_sigint().append(on_sigint)
    try:
        with _trio_batch_order(trio, io.world, io.chooser):
            out = trio.run(cancellable, clock=clock, **kw)
    except trio.TrioInternalError as exc:
        # What the clock raised inside trio's scheduler, when cancelling the run
        # did not end it: trio wraps it; the world's own error is the answer.
        cause = exc.__cause__
        if isinstance(cause, RuntimeError) and str(cause).startswith("simnet:"):
            raise cause from None
        raise
    finally:
        ports.sim_sigint().remove(on_sigint)
    if clock.failure is not None:
        raise clock.failure
    return out


class _trio_batch_order:
    """trio runs each batch of runnable tasks in an order drawn from one
    module-level ``random.Random`` (``trio._core._run._r``: reversed or not,
    with probability 1/2), unseeded, so the same universe ran its tasks in
    different orders in different processes. While a simulated run lasts, that
    generator is seeded from the world's seed; afterwards its state is put
    back, so trio outside a simulated cell draws as if nothing had happened.
    It is private to trio (checked on 0.35): if it is missing, the order stays
    unseeded and ``seeded`` says so. trio's supported way to a deterministic
    order is its Hypothesis plugin, which also only seeds this generator.

    With an explorer's chooser on the world (``kernels.choice``), the chooser
    draws the whole batch instead (``ready``). trio's own Hypothesis mode is
    the way in: with ``_ALLOW_DETERMINISTIC_SCHEDULING`` set, trio sorts each
    batch by spawn order and hands it to ``_r.shuffle``, so any permutation
    of a batch is an order trio itself runs (its scheduler's comment: the
    batch is randomized "to avoid assumptions about scheduling order sneaking
    in"). For the run only, the flag is set and ``_r`` is a generator, seeded
    as above, whose ``shuffle`` asks the chooser; both are put back after.
    Index 0 everywhere runs each batch in spawn order. If trio's scheduler no
    longer has that shape, the chooser is not used (``chosen`` is False) and
    the batch order is seeded as without one."""

    def __init__(self, trio, world, chooser=None):
        core = sys.modules.get("trio._core._run")
        rng = getattr(core, "_r", None)
        self.core = core
        self.rng = rng if hasattr(rng, "getstate") and hasattr(rng, "seed") else None
        self.seed = f"{world.seed}:trio"
        self.saved = None
        self.chooser = chooser
        self.chosen = (chooser is not None and self.rng is not None
                       and type(getattr(core, "_ALLOW_DETERMINISTIC_SCHEDULING", None)) is bool
                       and _trio_shuffles(core))
        self.replaced = None

    @property
    def seeded(self) -> bool:
        return self.rng is not None

    def __enter__(self):
        if self.chosen:
            chooser_rng = _ChosenBatches(self.chooser, self.seed)
            self.replaced = (self.core._r, self.core._ALLOW_DETERMINISTIC_SCHEDULING)
            self.core._r = chooser_rng
            self.core._ALLOW_DETERMINISTIC_SCHEDULING = True
        elif self.rng is not None:
            self.saved = self.rng.getstate()
            self.rng.seed(self.seed)
        return self

    def __exit__(self, *exc):
        if self.replaced is not None:
            self.core._r, self.core._ALLOW_DETERMINISTIC_SCHEDULING = self.replaced
            self.replaced = None
        elif self.rng is not None:
            self.rng.setstate(self.saved)


def _trio_shuffles(core) -> bool:
    """Whether trio's scheduler loop (``unrolled_run``) reads the flag and calls
    ``_r.shuffle``, as trio 0.35 does."""
    run = getattr(core, "unrolled_run", None)
    code = getattr(run, "__code__", None)
    return code is not None and {"_ALLOW_DETERMINISTIC_SCHEDULING", "_r", "shuffle"} <= \
        _code_names(code)


class _ChosenBatches(random.Random):
    """trio's ``_r`` under an explorer: seeded draws for everything else (a
    clock's offset), and ``shuffle(batch)`` in the order the chooser picks.
    trio pops the batch from its end, so the chosen order is stored reversed."""

    def __init__(self, chooser, seed):
        super().__init__(seed)
        self._choose = chooser.choose

    def shuffle(self, x):
        x[:] = _choice.permute(self._choose, _choice.READY, list(x))[::-1]


def trio_socket(sock):
    """A trio socket for ``sock``: a ``SimTrioSocket`` if it is simulated,
    else ``trio.socket.from_stdlib_socket(sock)``."""
    simnet = sys.modules.get("kernels.simnet")     # no simulated socket without it
    if simnet is not None and isinstance(sock, simnet.SimSocket):
        return _trio_socket_class()(sock)
    return _library("trio").socket.from_stdlib_socket(sock)


@functools.cache
def _trio_clock_class():
    trio = _library("trio")
    from kernels import simnet

    class SimClock(trio.abc.Clock):
        """trio's clock on a world. trio calls ``deadline_to_sleep_time`` exactly
        when every task is blocked: the clock then runs the world up to the first
        event that readies a task waiting on a ``SimTrioSocket`` (or up to trio's
        next deadline) and answers "don't sleep"."""

        def __init__(self, world):
            self.world = world
            self.waiters: dict = {}       # task -> (SimSocket, mask)
            self.idle = 0
            self.kicked = False           # something outside the waiters woke a task
            # The world's error (a deadlock, a livelock, a stop, the watchdog) is
            # not raised inside trio's scheduler, which would abandon every task
            # (TrioInternalError, and trio's complaints on stderr): the run is
            # cancelled (on_failure) and unwinds without the world, and
            # run_trio raises the error once trio.run has returned.
            self.failure = None
            self.on_failure = None

        def start_clock(self):
            pass

        def current_time(self):
            return self.world.now

        def _wake_ready(self):
            woke = False
            for task, (sock, mask) in list(self.waiters.items()):
                ev = sock.readiness()
                if ev & mask or ev & simnet.ERR or sock.closed:
                    del self.waiters[task]
                    trio.lowlevel.reschedule(task)
                    woke = True
            return woke

        def _spurious(self):
            """The seam's ``spurious-ready`` point (``kernels.simnet``) where
            trio's epoll would be: a task waiting on a socket that is not ready
            is woken anyway, and its call gets EAGAIN and waits again."""
            world = self.world
            if not (world.buggify_on and "spurious-ready" in world.buggify_on):
                return False
            from kernels.simnet.constants import CONNECTED, LISTENING
            task = world.buggify_pick([t for t, (sock, mask) in self.waiters.items()
                                       if not sock.closed
                                       and sock._state in (CONNECTED, LISTENING)])
            if task is None:
                return False
            del self.waiters[task]
            trio.lowlevel.reschedule(task)
            return True

        def deadline_to_sleep_time(self, deadline):
            if self.failure is not None:
                # unwinding after the world's error: tasks only finish now; one
                # that keeps waiting for ever (a shielded wait) ends the run the
                # hard way
                self.idle += 1
                if self.idle > 10_000:
                    raise self.failure
                return 0
            try:
                return self._advance(deadline)
            except RuntimeError as exc:
                if not str(exc).startswith("simnet:") or self.on_failure is None:
                    raise
                self.failure = exc
                self.idle = 0
                self.on_failure()
                return 0

        def _advance(self, deadline):
            world = self.world
            while True:
                world._run_due()
                if self._wake_ready() or self.kicked or self._spurious():
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
                            # whoever watches (an explorer) looks at the tasks first
                            hook = getattr(world, "on_deadlock", None)
                            if hook is not None:
                                hook()
                            raise simnet.SimDeadlock(f"simnet: trio is blocked at "
                                                     f"t={world.now:.6f}s with nothing scheduled")
                        return 0
                    if deadline > world.now:
                        world.now = deadline
                        self.idle = 0
                    return 0
                world.now = t

    return _named(SimClock)


@functools.cache
def _trio_socket_class():
    trio = _library("trio")
    from kernels import simnet

    class SimTrioSocket(trio.socket.SocketType):
        """The part of ``trio.socket.SocketType`` that trio's ``SocketStream`` and
        ``SocketListener`` use, over a ``SimSocket``. A wait parks the task with
        the run's ``SimClock`` instead of in trio's epoll."""

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
                return int(self._sock.listening)
            return self._sock.getsockopt(level, option, *a)

        def shutdown(self, how):
            self._sock.shutdown(how)
            if how in (_socket.SHUT_WR, _socket.SHUT_RDWR):
                self._shut_wr = True

        def close(self):
            self._sock.close()

        def is_readable(self):
            return bool(self._sock.readiness() & (simnet.READ | simnet.ERR))

        async def bind(self, address):
            await trio.lowlevel.checkpoint()
            self._sock.bind(address)

        def listen(self, backlog=128):
            self._sock.listen(backlog)

        async def _wait(self, mask):
            clock = trio.lowlevel.current_clock()
            if not isinstance(clock, _trio_clock_class()):
                raise RuntimeError("a simulated trio socket waits only under "
                                   "protocols.simports.run_trio (its clock runs the world)")
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

    return _named(SimTrioSocket)


# ---------------------------------------------------------------------------
# curio

class WakeSocket:
    """A ``SimWaker`` with the socket methods curio uses on its wake-up pair
    (and a ``curio.io.Socket`` watcher can wait on): ``send`` wakes, ``recv``
    drains (``BlockingIOError`` when nothing is pending)."""

    def __init__(self, waker):
        self._waker = waker

    def fileno(self):
        return self._waker.fileno()

    def setblocking(self, flag):
        pass

    def send(self, data, flags=0):
        self._waker.wake()
        return len(data)

    def recv(self, n, flags=0):
        data = self._waker.drain()
        if not data:
            raise BlockingIOError(errno.EAGAIN, "nothing to read")
        return data[:n]

    def close(self):
        self._waker.close()


# What curio's kernel takes from its module's globals, and what the simulated
# kernel gives it instead (curio 1.6, curio/kernel.py, Kernel._make_kernel_runtime).
_CURIO_GLOBALS = {"time": ("monotonic",), "socket": ("socketpair",)}


def _code_names(code) -> set:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


@functools.cache
def _curio_kernel_class():
    curio = _library("curio")
    make = getattr(curio.Kernel, "_make_kernel_runtime", None)
    code = getattr(make, "__code__", None)
    wanted = {n for k, v in _CURIO_GLOBALS.items() for n in (k, *v)}
    if code is None or not wanted <= _code_names(code) or make.__closure__:
        raise Unavailable(f"curio {getattr(curio, '__version__', '?')}: Kernel._make_kernel_runtime "
                          "does not read time.monotonic and socket.socketpair the way curio 1.6 "
                          "does, so its clock and wake-up cannot be put on the simulated network")

    class SimKernel(curio.Kernel):
        """A curio kernel on a simulated network: ``selector=SimSelector``, and
        curio's own kernel runtime with the virtual clock and a ``SimWaker``."""

        def __init__(self, io, **kw):
            self._sim_io = io
            super().__init__(selector=io.world.selector(), **kw)

        def _make_kernel_runtime(self):
            io = self._sim_io
            scope = dict(make.__globals__)
            scope["time"] = types.SimpleNamespace(monotonic=io.time)
            scope["socket"] = types.SimpleNamespace(
                socketpair=lambda: (lambda w: (w, w))(WakeSocket(io.waker())))
            runtime = types.FunctionType(code, scope, make.__name__, make.__defaults__)
            return runtime(self)

    return _named(SimKernel)


def curio_kernel(io, **kw):
    """A ``curio.Kernel(**kw)`` on the simulated network of ``io``."""
    return _curio_kernel_class()(io, **kw)
