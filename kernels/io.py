"""The I/O-and-time seam: everything the callback and coro kernels ask of the OS
about readiness and time, behind one small object.

A kernel gets one ``IO`` object (``Loop(io=...)``, ``Kernel(io=...)``; ``None``
means ``RealIO()``) and from it:

* ``io.poller()`` -- a ``Poller``: ``register(fd, mask)``, ``modify(fd, mask)``,
  ``unregister(fd)``, ``wait(timeout) -> [(fd, mask), ...]``, ``close()``.
  ``mask`` is made of ``READ`` and ``WRITE``. A returned mask counts as
  readable when ``mask & READABLE`` and writable when ``mask & WRITABLE``; an
  error or hang-up counts as both (the recv/send that follows reports it).
  ``timeout`` is seconds (0: don't block; ``None``: until an event).
  ``register`` of a registered fd raises ``FileExistsError``, ``modify`` and
  ``unregister`` of an unknown fd raise ``OSError`` (epoll's behaviour).
* ``io.waker()`` -- a ``Waker``, the loop's wake-up pair: ``fileno()`` (what
  the loop registers for ``READ``), ``wake()`` (safe from other threads and
  from signal handlers), ``drain() -> bytes`` (consume pending wake-ups;
  non-zero bytes are signal numbers), ``signal_fd()`` (the fd for
  ``signal.set_wakeup_fd``, or ``None`` if signals can't reach this waker),
  ``close()``.
* ``io.time()`` -- the clock, float seconds, monotonic.
* ``io.socket(family, type, proto=0)`` and ``io.getaddrinfo(...)`` -- where
  every socket the kernels open comes from. The kernels touch a socket only
  through its methods (fileno, setblocking, send, recv, recv_into, accept,
  connect, connect_ex, shutdown, close, getsockopt/setsockopt,
  getpeername/getsockname, bind, listen), never through ``os`` on its fd.
* ``io.read_check(sock)`` -- a callable ``check(0)`` that is true when ``sock``
  has something to read right now (a hint the coro kernel uses to skip a
  ``recv`` that would fail with EAGAIN).

A simulated network implements the same names; with a virtual clock its
``Poller.wait(timeout)`` returns at once, after advancing ``time()`` to the next
delivery or to now + timeout, whichever comes first.

Why the poller is epoll itself on Linux: ``selectors`` builds a key tuple per
event and rounds the timeout in Python, a few microseconds per event -- a
visible share of an echo round trip. ``EpollPoller`` hands out the epoll
object's own bound methods, so ``wait = poller.wait`` in a kernel's loop is a
direct call into C. Elsewhere ``SelectorsPoller`` gives the same calls over
``selectors`` (slower, same behaviour).

The time rules both kernels share live here too: ``MAX_WAIT_S`` caps a wait
(a far timer just re-polls; epoll's millisecond int overflows far beyond it)
and ``heap_needs_compaction`` says when lazily cancelled timer entries are
numerous enough to rebuild the heap.

Standard library only, and no imports from the rest of looplab.
"""
from __future__ import annotations

import select
import selectors
import socket
import time as _time

__all__ = ["RealIO", "EpollPoller", "SelectorsPoller", "SocketWaker", "READ", "WRITE",
           "READABLE", "WRITABLE", "MAX_WAIT_S", "COMPACT_MIN_DEAD", "wait_timeout",
           "heap_needs_compaction"]

if hasattr(select, "epoll"):
    READ, WRITE = select.EPOLLIN, select.EPOLLOUT
    # errors and hang-ups wake both sides: the next recv/send reports them
    READABLE = select.EPOLLIN | select.EPOLLPRI | select.EPOLLERR | select.EPOLLHUP
    WRITABLE = select.EPOLLOUT | select.EPOLLERR | select.EPOLLHUP
else:  # pragma: no cover - macOS/BSD/Windows only
    READ, WRITE = 1, 4
    READABLE, WRITABLE = READ, WRITE

#: The longest single wait; a timer further away just causes another wait.
MAX_WAIT_S = 3600.0

#: A timer heap is rebuilt once it holds more than this many dead entries and
#: they are more than half of it: a long-lived server running many short
#: timeouts around fast operations must not accumulate them.
COMPACT_MIN_DEAD = 64


def wait_timeout(deadline: float, now: float) -> float:
    """How long a poller may wait for a timer due at ``deadline``."""
    timeout = deadline - now
    if timeout < 0:
        return 0
    if timeout > MAX_WAIT_S:
        return MAX_WAIT_S
    return timeout


def heap_needs_compaction(dead: int, size: int) -> bool:
    """True when ``dead`` lazily cancelled entries of a heap of ``size`` should
    go. Callers may skip the call while ``dead <= COMPACT_MIN_DEAD``. (What makes
    an entry dead is the kernel's business; each rebuilds its heap with its own
    test inline and ``heapq.heapify``.)"""
    return dead > COMPACT_MIN_DEAD and dead * 2 > size


class EpollPoller:
    """``select.epoll`` under the seam's names. The methods are the epoll
    object's own bound methods (no Python frame per call)."""
    __slots__ = ("register", "modify", "unregister", "wait", "close", "_epoll")

    def __init__(self):
        ep = self._epoll = select.epoll()
        self.register = ep.register
        self.modify = ep.modify
        self.unregister = ep.unregister
        self.wait = ep.poll
        self.close = ep.close


class SelectorsPoller:
    """The seam's poller over ``selectors.DefaultSelector``, for platforms
    without epoll; raises what epoll raises for unknown or duplicate fds."""
    __slots__ = ("_selector",)

    def __init__(self):
        self._selector = selectors.DefaultSelector()

    @staticmethod
    def _events(mask):
        return ((selectors.EVENT_READ if mask & READ else 0)
                | (selectors.EVENT_WRITE if mask & WRITE else 0))

    def register(self, fd, mask):
        try:
            self._selector.register(fd, self._events(mask))
        except KeyError:
            raise FileExistsError(f"fd {fd} is already registered") from None

    def modify(self, fd, mask):
        try:
            self._selector.modify(fd, self._events(mask))
        except KeyError:
            raise FileNotFoundError(f"fd {fd} is not registered") from None

    def unregister(self, fd):
        try:
            self._selector.unregister(fd)
        except (KeyError, ValueError):
            raise FileNotFoundError(f"fd {fd} is not registered") from None

    def wait(self, timeout=None):
        return [(key.fd, (READ if events & selectors.EVENT_READ else 0)
                 | (WRITE if events & selectors.EVENT_WRITE else 0))
                for key, events in self._selector.select(timeout)]

    def close(self):
        self._selector.close()


class SocketWaker:
    """A socketpair: the loop polls one end, ``wake()`` writes a byte to the
    other. A full pair means a wake-up is already pending, so ``wake`` ignores
    errors."""
    __slots__ = ("_r", "_w")

    def __init__(self):
        self._r, self._w = socket.socketpair()
        try:
            self._r.setblocking(False)
            self._w.setblocking(False)
        except BaseException:
            self.close()
            raise

    def fileno(self) -> int:
        return self._r.fileno()

    def signal_fd(self) -> int:
        return self._w.fileno()

    def wake(self) -> None:
        try:
            self._w.send(b"\0")
        except OSError:
            pass

    def drain(self) -> bytes:
        chunks = []
        while True:
            try:
                data = self._r.recv(4096)
            except (BlockingIOError, InterruptedError):
                break
            if not data:
                break
            chunks.append(data)
            if len(data) < 4096:
                break
        return b"".join(chunks)

    def close(self) -> None:
        self._r.close()
        self._w.close()


def _readable_anyway(timeout):
    return True


class RealIO:
    """The operating system: epoll (or selectors), a socketpair waker, the
    monotonic clock and real sockets."""

    time = staticmethod(_time.monotonic)
    getaddrinfo = staticmethod(socket.getaddrinfo)
    socket = staticmethod(socket.socket)

    @staticmethod
    def poller():
        return EpollPoller() if hasattr(select, "epoll") else SelectorsPoller()

    @staticmethod
    def waker():
        return SocketWaker()

    @staticmethod
    def read_check(sock):
        fd = sock.fileno()
        if fd < 0 or not hasattr(select, "poll"):
            return _readable_anyway       # closed behind our back: let recv say so
        poller = select.poll()            # holds no fd of its own
        poller.register(fd, select.POLLIN)
        return poller.poll

    def __repr__(self):
        return "RealIO()"


#: The shared default (it holds no state).
REAL = RealIO()
