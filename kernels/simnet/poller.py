"""The seam on the simulated network: poller, waker, ``SimIO`` and ``SimSelector``.

``SimPoller.wait`` never blocks: it runs the world's due events and, when no
registered fd is ready, moves the virtual clock to the next event (see the
package's docstring). ``SimIO`` hands a kernel the poller, the wake-up pair,
the clock and the sockets, as ``RealIO`` does on the real network;
``SimSelector`` is a ``selectors.BaseSelector`` over the same poller.

A poller sees a file (a ``SimSocket`` or a ``SimWaker``) through three names
only: ``fileno()``, ``readiness()`` and the ``poll_marks`` slot, where it
puts a ``_Marks`` that the file calls after every change of its readiness.
"""
from __future__ import annotations

import errno
import heapq
import math
import selectors
import socket as _socket
from collections.abc import Mapping

from kernels import choice as _choice

from . import constants as _c
from .constants import BOTH, ERR, READ, WRITE, SimDeadlock
from .sockets import SimSocket, socketpair


class SimPoller:
    """The seam's poller over the world. ``wait`` never blocks: it advances the
    virtual clock instead (see the module docstring).

    ``wait`` asks a registered fd for its readiness again only when it may have
    changed: each registered file's ``poll_marks`` (which a socket calls after
    every ``_changed``) marks it, and so do a waker's ``wake`` and
    ``register``/``modify``; an fd that was ready at the last look is asked
    again every time (its reader may have drained it). So every change that
    can make a socket ready must go through ``_changed``, as the peers already
    need. An fd nobody marked was not ready and still is not, so the events
    that only concern others -- the peers' deliveries, ACKs and timers -- cost
    no look at all. The events come out in registration order, as from a full
    scan (``ready()``)."""
    __slots__ = ("_world", "_fds", "_closed", "_spin_at", "_spins", "_dirty", "_recheck")

    #: Tests set this to check every wait's answer against a full scan.
    verify_skips = False

    def __init__(self, world):
        self._world = world
        self._fds = {}
        self._closed = False
        self._spin_at = -1.0
        self._spins = 0
        self._dirty = set()           # fds marked since the last look
        self._recheck = set()         # fds that were ready at the last look
        world._pollers.append(self)

    def register(self, fd, mask) -> None:
        self._check(fd)
        if fd in self._fds:
            raise FileExistsError(errno.EEXIST, f"fd {fd} is already registered")
        self._fds[fd] = mask
        self._watch(fd)

    def modify(self, fd, mask) -> None:
        self._check(fd)
        if fd not in self._fds:
            raise FileNotFoundError(errno.ENOENT, f"fd {fd} is not registered")
        self._fds[fd] = mask
        self._watch(fd)

    def _watch(self, fd):
        self._dirty.add(fd)
        obj = self._world._files[fd]
        m = obj.poll_marks
        if m is None:
            obj.poll_marks = m = _Marks(fd)
        if self not in m.pollers:
            m.pollers.append(self)

    def unregister(self, fd) -> None:
        if self._closed:
            raise ValueError("I/O operation on closed poller")
        if self._fds.pop(fd, None) is None:
            raise FileNotFoundError(errno.ENOENT, f"fd {fd} is not registered")

    def forget(self, fd) -> None:
        """Drop ``fd`` if registered (it was closed, or a selector let it go)."""
        self._fds.pop(fd, None)

    def _check(self, fd):
        if self._closed:
            raise ValueError("I/O operation on closed poller")
        if fd not in self._world._files:
            raise OSError(errno.EBADF, f"fd {fd} is not an open simulated file")

    def ready(self) -> list:
        """What ``wait(0)`` would report, without running any event."""
        files = self._world._files
        out = []
        for fd, interest in self._fds.items():
            ev = files[fd].readiness()
            if ev & ERR:
                out.append((fd, BOTH))
            elif ev & interest:
                out.append((fd, ev & interest))
        return out

    def _look(self) -> list:
        """``ready()`` asking only the fds that may have changed (see the class)."""
        ask = self._dirty
        ask |= self._recheck
        self._dirty = set()
        files = self._world._files
        out = []
        if len(ask) == 1:
            fd = next(iter(ask))
            interest = self._fds.get(fd)
            if interest is not None:
                ev = files[fd].readiness()
                if ev & ERR:
                    out.append((fd, BOTH))
                elif ev & interest:
                    out.append((fd, ev & interest))
        else:
            for fd, interest in self._fds.items():
                if fd in ask:
                    ev = files[fd].readiness()
                    if ev & ERR:
                        out.append((fd, BOTH))
                    elif ev & interest:
                        out.append((fd, ev & interest))
        self._recheck = {fd for fd, _ in out}
        return out

    def wait(self, timeout=None) -> list:
        if self._closed:
            raise ValueError("I/O operation on closed poller")
        world = self._world
        cpu = world.params["cpu_per_wait_s"]
        if cpu:
            # The program ran since its last wait: that long passes first,
            # events happening at their own times meanwhile.
            world.run(until=world.now + world._cpu_rng.random() * 2 * cpu)
        if timeout is None or timeout < 0:       # epoll: negative means forever
            deadline = math.inf
        else:
            deadline = world.now + timeout
        heap = world._heap
        heappop = heapq.heappop
        run_due = world._run_due
        # a late notification is hidden from one look only, so a second look (the
        # check's full scan) may rightly differ: no check with fault points on
        verify = self.verify_skips and not world.buggify_on
        if world.buggify_on and "spurious-ready" in world.buggify_on:
            extra = self._spurious()
            if extra is not None:
                run_due()
                events = self._look() if self._dirty or self._recheck else []
                return _merge(events, extra)
        while True:
            run_due()
            if self._dirty or self._recheck:
                events = self._look()
                if verify and events != self.ready():
                    raise AssertionError(f"simnet: the poller saw {events}, a full scan "
                                         f"{self.ready()} at t={world.now:.6f}s (a change "
                                         f"without _changed())")
                if events:
                    if world.now != self._spin_at:
                        self._spin_at = world.now
                        self._spins = 0
                    else:
                        # level-triggered readiness nobody consumes never lets time move
                        self._spins += 1
                        if self._spins >= _c.MAX_EVENTS_AT_ONE_TIME:
                            raise RuntimeError(
                                f"simnet: livelock: {self._spins} waits at t={world.now:.6f}s "
                                f"returned ready fds without time moving (e.g. {events[0]})")
                    return events
            elif verify and self.ready():
                raise AssertionError(f"simnet: the poller skipped {self.ready()} at "
                                     f"t={world.now:.6f}s (a change without _changed())")
            while heap and heap[0][2].fn is None:
                heappop(heap)
            if not heap:
                if deadline == math.inf:
                    # whoever watches (an explorer) looks at what waits before it unwinds
                    hook = getattr(world, "on_deadlock", None)
                    if hook is not None:
                        hook()
                    raise SimDeadlock(f"simnet: wait(None) at t={world.now:.6f}s with nothing "
                                      f"ready and nothing scheduled: it would block forever")
                world.now = deadline
                return []
            t = heap[0][0]
            if t > deadline:
                world.now = deadline
                return []
            world.now = t

    def _spurious(self):
        """``spurious-ready``: one registered socket (connected or listening)
        that is not ready for all it is registered for, reported ready for the
        rest at once, so the program's recv, send or accept gets EAGAIN
        (select(2), BUGS; accept(2), NOTES). ``(fd, mask)`` or None."""
        files = self._world._files
        candidates = []
        for fd, interest in self._fds.items():
            obj = files.get(fd)
            if isinstance(obj, SimSocket) and obj._state in (_c.CONNECTED, _c.LISTENING):
                ev = obj._raw_events()
                if not ev & ERR and interest & ~ev & BOTH:
                    candidates.append((fd, interest & ~ev & BOTH))
        return self._world.buggify_pick(candidates)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._fds.clear()
            try:
                self._world._pollers.remove(self)
            except ValueError:
                pass


def _merge(events, extra):
    """A poll's events with one spurious ``(fd, mask)`` added to them."""
    fd, mask = extra
    out = [(f, m | mask) if f == fd else (f, m) for f, m in events]
    if all(f != fd for f, _ in events):
        out.append(extra)
    return out


class _Marks:
    """The ``poll_marks`` of a socket or waker that pollers watch: marks its fd
    in each of them (``SimPoller._look``)."""
    __slots__ = ("fd", "pollers")

    def __init__(self, fd):
        self.fd = fd
        self.pollers = []

    def __call__(self):
        for poller in self.pollers:
            poller._dirty.add(self.fd)


class SimWaker:
    """The seam's wake-up pair, simulated: ``wake()`` makes ``fileno()``
    readable until ``drain()``. No signal can reach it (``signal_fd()`` is None)."""
    __slots__ = ("_world", "_fd", "_pending", "poll_marks")

    def __init__(self, world):
        self._world = world
        self._fd = world._new_fd(self)
        self._pending = bytearray()
        self.poll_marks = None        # set by the pollers that watch it

    def fileno(self) -> int:
        return self._fd

    def signal_fd(self):
        return None

    def wake(self) -> None:
        if self._fd >= 0:
            self._pending += b"\0"
            self._world._gen += 1
            if self.poll_marks is not None:
                self.poll_marks()

    def drain(self) -> bytes:
        data = bytes(self._pending)
        self._pending.clear()
        return data

    def readiness(self) -> int:
        return READ if self._pending else 0

    def close(self) -> None:
        if self._fd >= 0:
            self._world._release_fd(self._fd)
            self._fd = -1


class SimIO:
    """The I/O-and-time seam backed by a ``World``: hand it to a kernel in
    place of ``RealIO``."""

    def __init__(self, world, owner="app"):
        self.world = world
        self.owner = owner
        self.time = world.time

    @property
    def chooser(self):
        """The world's explorer, if one is installed (``kernels.choice``)."""
        return self.world.chooser

    def poller(self) -> SimPoller:
        return SimPoller(self.world)

    def waker(self) -> SimWaker:
        return SimWaker(self.world)

    def socket(self, family=_socket.AF_INET, type=_socket.SOCK_STREAM, proto=0) -> SimSocket:
        sock = SimSocket(self.world, family, type, proto)
        sock.owner = self.owner
        return sock

    def socketpair(self, family=None, type=_socket.SOCK_STREAM, proto=0):
        """Two connected simulated sockets (a connection of its own in the log)."""
        fam = _socket.AF_UNIX if family is None else family
        return socketpair(self.world, self.owner, fam, type, proto)

    @staticmethod
    def getaddrinfo(host, port, family=0, type=0, proto=0, flags=0):
        if host in (None, ""):
            host = "0.0.0.0"
        elif host == "localhost":
            host = "127.0.0.1"
        try:
            _socket.inet_aton(host)
        except OSError:
            raise _socket.gaierror(_socket.EAI_NONAME,
                                   f"simulated network knows no host {host!r}") from None
        return [(_socket.AF_INET, _socket.SOCK_STREAM, _socket.IPPROTO_TCP, "",
                 (host, int(port or 0)))]

    @staticmethod
    def read_check(sock):
        """``check(timeout)`` true when ``sock`` has something to read now."""
        def check(timeout=0):
            return bool(sock.readiness() & (READ | ERR))
        return check

    def __repr__(self):
        return f"SimIO(seed={self.world.seed!r})"


class SimSelector(selectors.BaseSelector):
    """A ``selectors`` selector over the world, for code built on selectors
    (asyncio's selector event loop): ``select(timeout)`` advances the virtual
    clock as ``SimPoller.wait`` does."""

    #: Whether ``select`` lets the world's explorer order one call's events
    #: (``io-order``). A loop that orders them itself sets it False
    #: (``protocols.simports``' asyncio loop, in ``_process_events``), so no
    #: runtime is asked twice.
    orders_events = True

    def __init__(self, world):
        self._world = world
        self._poller = SimPoller(world)
        self._keys = {}
        self._map = _KeyMap(self._keys)

    def _fd(self, fileobj):
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        if not isinstance(fd, int) or fd < 0:
            raise ValueError(f"invalid file object {fileobj!r}")
        return fd

    def register(self, fileobj, events, data=None):
        if not events or events & ~(selectors.EVENT_READ | selectors.EVENT_WRITE):
            raise ValueError(f"invalid events: {events!r}")
        fd = self._fd(fileobj)
        if fd in self._keys:
            raise KeyError(f"{fileobj!r} (FD {fd}) is already registered")
        self._poller.register(fd, (READ if events & selectors.EVENT_READ else 0)
                              | (WRITE if events & selectors.EVENT_WRITE else 0))
        key = selectors.SelectorKey(fileobj, fd, events, data)
        self._keys[fd] = key
        return key

    def unregister(self, fileobj):
        fd = self._fd(fileobj)
        key = self._keys.pop(fd, None)
        if key is None:
            raise KeyError(f"{fileobj!r} is not registered")
        self._poller.forget(fd)
        return key

    def select(self, timeout=None):
        if timeout is not None and timeout < 0:
            timeout = 0
        out = []
        for fd, mask in self._poller.wait(timeout):
            key = self._keys.get(fd)
            if key is None:
                continue
            ev = ((selectors.EVENT_READ if mask & READ else 0)
                  | (selectors.EVENT_WRITE if mask & WRITE else 0)) & key.events
            if ev:
                out.append((key, ev))
        chooser = self._world.chooser
        if chooser is not None and len(out) > 1 and self.orders_events:
            # readiness across file descriptors carries no order (epoll's is its own)
            out = _choice.permute(chooser.choose, _choice.IO_ORDER, out)
        return out

    def close(self):
        self._poller.close()
        self._keys.clear()

    def get_map(self):
        return self._map


class _KeyMap(Mapping):
    __slots__ = ("_keys",)

    def __init__(self, keys):
        self._keys = keys

    def __len__(self):
        return len(self._keys)

    def __getitem__(self, fileobj):
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        return self._keys[fd]

    def __iter__(self):
        return iter(self._keys)


# ---------------------------------------------------------------------------
# Peers: sans-IO participants that count the truth
