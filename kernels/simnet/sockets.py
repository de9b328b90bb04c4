"""The simulated TCP socket: the socket API, the connection's life, readiness.

``SimSocket`` is the part of Python's socket API the kernels use, on a
``World``: bind, listen, connect and accept (with the handshake, the accept
queue and SYN retries), send and recv (with the fault gates), shutdown and
close (FIN or RST), and the readiness a poller reports. The buffer, window and
ACK accounting is its ``_model``'s (``model.py``, ``linux.py``), chosen by the
world. ``Link`` is one direction of a connection's wire.

What a poller sees of a socket (the same for a ``SimWaker``) is four names:
``fileno()``, ``readiness()`` (the mask a poll reports now: ``READ``,
``WRITE``, or ``ERR`` for an error or a hang-up), ``_raw_events()`` (the same
before the program's wake-up latency and a late notification, with no side
effect: what epoll's callback sees) and ``poll_marks``, a callable that
pollers set and that the socket calls, synchronously and deciding nothing,
after every change that may alter its readiness (``_changed``). A
sans-IO peer hears the socket through ``_watcher`` instead, which the world
runs after the event that changed it.
"""
from __future__ import annotations

import errno
import socket as _socket
import struct
from collections import deque

from .constants import (
    BOTH, CLOSED, CONNECTED, CONNECTING, ERR, LISTENING, MSG_PEEK, NEW, READ, SLOW_SLICE_S,
    STATE_NAMES, WRITE, SimBlockingError, error_exc, oserror,
)
from .model import ByteModel
from .constants import RTO_MAX_S, RTO_MIN_S      # the loss fault's retransmissions


class Link:
    """One direction of a connection: serialization and propagation, and the
    wire's faults (``World._fault``): ``faults`` is ``None`` or a list of
    ``(kind, start, end, p)``, "hold" (a clog or a partition: what would
    arrive in [start, end) arrives at ``end``) or "loss" (a segment that leaves
    in [start, end) is lost with probability ``p`` and sent again after an
    RTO, doubling). ``sock`` is the end that sends on it, for the log;
    ``resent`` how much later than sent the last data segment's delivered try
    left (an RTT sample is taken from that try, as TCP timestamps do)."""
    __slots__ = ("latency", "bandwidth", "jitter", "free_at", "last_arrival", "dead",
                 "faults", "sock", "resent")

    def __init__(self, p):
        self.latency = p["latency_s"]
        self.bandwidth = p["bandwidth_Bps"]
        self.jitter = p["jitter_s"]
        self.free_at = 0.0
        self.last_arrival = 0.0
        self.dead = False
        self.faults = None
        self.sock = None
        self.resent = 0.0

    def arrival(self, world, nbytes) -> float:
        start = world.now if world.now > self.free_at else self.free_at
        if self.bandwidth is not None and nbytes:
            start += nbytes / self.bandwidth
            self.free_at = start
        t = start + self.latency
        if self.jitter:
            t += world._rng.random() * self.jitter
        if self.faults is not None:
            t = self._faulted(world, start, t, nbytes)
        if t < self.last_arrival:
            t = self.last_arrival          # a direction never reorders
        self.last_arrival = t
        return t

    def ack_at(self, world) -> float:
        """When an ACK or window update sent now arrives (held, never lost)."""
        t = world.now + self.latency
        return t if self.faults is None else self._held(t)

    def _held(self, t) -> float:
        moved = True
        while moved:
            moved = False
            for kind, start, end, _ in self.faults:
                if kind == "hold" and start <= t < end:
                    t, moved = end, True
        return t

    def _faulted(self, world, sent, t, nbytes) -> float:
        """A data segment leaving at ``sent`` under a loss window: each try is
        lost with probability ``p`` (drawn from the world's stream: under an
        explorer, choice 0 is "delivered"), and the next one leaves an RTO
        later, the RTO doubling (TCP's in-order delivery keeps the segments
        behind it waiting: ``last_arrival``)."""
        if nbytes:
            rto = RTO_MIN_S
            tries = 0
            go = sent
            while True:
                p = 0.0
                for kind, start, end, q in self.faults:
                    if kind == "loss" and start <= go < end and q > p:
                        p = q
                if not p or world._rng.random() < 1.0 - p:
                    break
                tries += 1
                s = self.sock
                world.record("loss", s._conn, s._side, tries)
                go += rto
                rto = rto * 2 if rto * 2 < RTO_MAX_S else RTO_MAX_S
            self.resent = go - sent
            t += go - sent
        return self._held(t)


class SimSocket:
    """A TCP socket on the simulated network, with the part of the socket API
    the kernels use. Non-blocking calls that would block raise
    ``BlockingIOError``; in blocking mode they raise ``SimBlockingError``."""

    def __init__(self, world, family=_socket.AF_INET, type=_socket.SOCK_STREAM, proto=0,
                 *, _fd=True):
        if type != _socket.SOCK_STREAM:
            raise oserror(errno.EPROTONOSUPPORT)
        self._world = world
        self.owner = None                 # which program holds it (World.exit_process)
        self.family = family
        self.type = type
        self.proto = proto
        self._fd = world._new_fd(self) if _fd else -1
        self._blocking = True
        self._state = NEW
        self._local = None
        self._remote = None
        self._conn = None                 # connection index
        self._side = None                 # "client" | "server"
        self._peer = None
        self._link = Link(world.params)
        self.sndbuf = world.params["sndbuf"]
        self.rcvbuf = world.params["rcvbuf"]
        self._opts = {}
        self._owns_addr = False
        self._linger_abort = False
        # sending
        self._unsent = bytearray()
        self._unacked = 0
        self._sent_total = 0
        self._fin_queued = False
        self._fin_sent = False
        self._wr_shut = False
        # receiving
        self._rcv = bytearray()
        self._read_total = 0
        self._eof = False
        self._rd_shut = False
        # errors and faults
        self._err = 0                     # pending error, reported once (SO_ERROR, recv, send)
        self._reset = False               # an RST arrived (or we sent one)
        self._app_closed = False
        self._vanished = False
        self._gate_until = 0.0            # stall: nothing readable before this
        self._slow_rate = None
        self._slow_until = 0.0
        self._slow_due = 0.0
        # listening
        self._queue = None
        self._backlog = 0
        self._watcher = None
        self._poke_pending = False
        # wake_s: when readiness that appeared becomes visible to a waiting program
        self._late = None                 # late-notify: the mask one poll still reports
        self._wake = world.params["wake_s"]
        self._asleep = 0                  # READ/WRITE a program found missing and waits for
        self._read_at = 0.0
        self._write_at = 0.0
        # pollers (poll_marks) and a sans-IO peer (_watcher) hear every change
        self.poll_marks = None
        # buffers, window and ACKs: the world's TCP model
        self._model = world.tcp_model(self)

    def __repr__(self):
        where = f" conn={self._conn} {self._side}" if self._conn is not None else ""
        return f"<SimSocket fd={self._fd} {STATE_NAMES[self._state]}{where}>"

    # -- readiness -------------------------------------------------------

    def _changed(self):
        world = self._world
        world._gen += 1
        wake = self._wake
        # with nothing awaited (``_asleep``) no edge can rise; the slow fault's
        # expiry, which a look at readiness clears, is left to the look as before
        if wake and (self._asleep or self._slow_rate is not None):
            self._wake_edges(world, wake)
        m = self.poll_marks
        if m is not None:
            # a poller's mark costs nothing and decides nothing: the poller asks
            # readiness(), which applies wake_s itself (a busy program sees the
            # change at once, a sleeping one after its wake-up)
            m()
        if self._watcher is not None and not self._poke_pending:
            self._poke_pending = True
            if wake:
                world.call_at(world.now + wake, self._poke)
            else:
                world._pokes.append(self)

    def _wake_edges(self, world, wake):
        """``wake_s``: a program that found this socket not readable (or not
        writable) waits for it; when that changes, the kernel wakes it, and it
        runs that much later (the scheduler's wake-up latency) -- by which time
        the stack may have moved on. A program that was busy meanwhile sees the
        change at once, as ``poll`` does (Linux: SOCK_NOSPACE, sk_data_ready)."""
        rising = self._raw_events() & self._asleep
        if rising:
            self._asleep &= ~rising
            at = world.now + wake
            if rising & READ:
                self._read_at = at
            if rising & WRITE:
                self._write_at = at
            world.call_at(at, self._woken)

    def _woken(self):
        self._world._gen += 1
        m = self.poll_marks
        if m is not None:
            m()                       # what the program waited for is now visible

    def _poke(self):
        self._poke_pending = False
        if self._watcher is not None:
            self._watcher()

    def _gated(self) -> bool:
        now = self._world.now
        if now < self._gate_until:
            return True
        if self._slow_rate is not None:
            if now >= self._slow_until:
                self._slow_rate = None
            elif now < self._slow_due:
                return True
        return False

    def readiness(self) -> int:
        """What a poll reports now: ``READ``, ``WRITE``, or ``ERR`` (an error or
        a hang-up). Asking counts as waiting for what is missing (``wake_s``)."""
        ev = self._raw_events()
        if self._late is not None:
            ev = self._late_report()
        if self._wake and not ev & ERR:
            self._asleep |= ~ev & BOTH       # whoever asks waits for what is missing
            if ev:
                now = self._world.now
                if now < self._read_at:
                    ev &= ~READ
                if now < self._write_at:
                    ev &= ~WRITE
        return ev

    def _raw_events(self) -> int:
        state = self._state
        if state == CONNECTED:
            if self._err or self._reset:
                return ERR
            ev = 0
            if (self._rcv or self._eof or self._rd_shut) and not self._gated():
                ev = READ
            if self._wr_shut:
                ev |= WRITE
            else:
                used = self._model.send_used()
                if self.sndbuf - used >= used >> 1 and self.sndbuf > used:
                    ev |= WRITE
            if self._eof and self._wr_shut:
                ev |= ERR                 # both directions shut: a hang-up
            return ev
        if state == LISTENING:
            return READ if self._queue else 0
        if state == CONNECTING:
            return 0
        if self._err or self._conn is not None:
            return ERR                    # a failed connect: error, then hang-up
        return ERR if state == CLOSED else 0

    # -- plain socket calls ------------------------------------------------

    def fileno(self) -> int:
        return self._fd

    def setblocking(self, flag) -> None:
        self._blocking = bool(flag)

    def getblocking(self) -> bool:
        return self._blocking

    def settimeout(self, value) -> None:
        self._blocking = value is None or value > 0

    def gettimeout(self):
        return None if self._blocking else 0.0

    def _would_block(self, what):
        if self._blocking:
            raise SimBlockingError(f"simulated socket fd {self._fd} is in blocking mode and "
                                   f"{what} would block; call setblocking(False)")
        raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable (simulated)")

    def _check_open(self):
        if self._app_closed:
            raise oserror(errno.EBADF)

    def bind(self, address) -> None:
        self._check_open()
        host, port = _address(address)
        if self._local is not None:
            raise oserror(errno.EINVAL)
        if port == 0:
            addr = self._world._ephemeral(host)
        else:
            addr = (host, port)
            if addr in self._world._bound:
                raise oserror(errno.EADDRINUSE)
        self._world._bound.add(addr)
        self._local = addr
        self._owns_addr = True

    def listen(self, backlog=128) -> None:
        self._check_open()
        if self._state not in (NEW, LISTENING):
            raise oserror(errno.EINVAL)
        if self._local is None:
            self.bind(("0.0.0.0", 0))
        self._backlog = max(0, int(backlog))
        if self._state == NEW:
            self._state = LISTENING
            self._queue = deque()
            self._world._listeners[self._local] = self
        self._changed()

    def getsockname(self):
        return self._local if self._local is not None else ("0.0.0.0", 0)

    def getpeername(self):
        if self._state != CONNECTED or self._remote is None:
            raise oserror(errno.ENOTCONN)
        return self._remote

    def setsockopt(self, level, option, value, *rest) -> None:
        self._check_open()
        if level == _socket.SOL_SOCKET and option == _socket.SO_SNDBUF:
            self.sndbuf = max(self._model.min_sndbuf,
                              int(value) * self._world.params["sockbuf_scale"])
            self._changed()
        elif level == _socket.SOL_SOCKET and option == _socket.SO_RCVBUF:
            self.rcvbuf = max(self._model.min_rcvbuf,
                              int(value) * self._world.params["sockbuf_scale"])
            if self._peer is not None:
                self._peer._pump()
        elif level == _socket.SOL_SOCKET and option == _socket.SO_LINGER:
            onoff, secs = struct.unpack("ii", value)
            self._linger_abort = bool(onoff) and secs == 0
            self._opts[(level, option)] = value
        else:
            self._opts[(level, option)] = value     # TCP_NODELAY, SO_REUSEADDR, ...: no effect

    def getsockopt(self, level, option, buflen=None):
        self._check_open()
        if level == _socket.SOL_SOCKET:
            if option == _socket.SO_ERROR:
                err, self._err = self._err, 0
                return err
            if option == _socket.SO_SNDBUF:
                return self.sndbuf
            if option == _socket.SO_RCVBUF:
                return self.rcvbuf
        value = self._opts.get((level, option), 0)
        return value

    # -- connecting and accepting ----------------------------------------------

    def connect_ex(self, address) -> int:
        self._check_open()
        if self._state == CONNECTING:
            return errno.EALREADY
        if self._state == CONNECTED:
            return errno.EISCONN
        if self._state != NEW:
            return errno.EINVAL
        if self._err:                        # an earlier connect failed
            err, self._err = self._err, 0
            return err
        world = self._world
        host, port = _address(address)
        if self._local is None:
            self._local = world._ephemeral("127.0.0.1")
            world._bound.add(self._local)
            self._owns_addr = True
        self._remote = (host, port)
        self._state = CONNECTING
        self._conn = len(world._conns)
        self._side = "client"
        world._conns.append([self, None])
        world.record("syn", self._conn, "client", port)
        world.call_at(self._link.arrival(world, 0), self._syn_arrives, 0)
        return errno.EINPROGRESS

    def connect(self, address) -> None:
        err = self.connect_ex(address)
        if err == errno.EINPROGRESS:
            if self._blocking:
                raise SimBlockingError(f"simulated socket fd {self._fd} is in blocking mode "
                                       "and connect would block; call setblocking(False)")
            raise BlockingIOError(errno.EINPROGRESS, "Operation now in progress (simulated)")
        if err:
            raise oserror(err)

    def _syn_arrives(self, attempt):
        world = self._world
        if self._state != CONNECTING:
            return
        host, port = self._remote
        lsock = world._listeners.get((host, port)) or world._listeners.get(("0.0.0.0", port))
        if lsock is None or lsock._state != LISTENING:
            world.call_at(world.now + self._link.latency, self._connect_failed,
                          errno.ECONNREFUSED)
            return
        if len(lsock._queue) > lsock._backlog:
            world.record("syn-drop", self._conn, "client", attempt)
            if attempt >= world.params["syn_retries"]:
                self._connect_failed(errno.ETIMEDOUT)
            else:
                world.call_at(world.now + world.params["syn_retry_s"] * 2 ** attempt,
                              self._syn_arrives, attempt + 1)
            return
        server = SimSocket(world, self.family, self.type, self.proto, _fd=False)
        server._state = CONNECTED
        server._local = lsock._local if lsock._local[0] != "0.0.0.0" else (host, port)
        server._remote = self._local
        server._conn = self._conn
        server._side = "server"
        server.sndbuf = lsock.sndbuf          # accepted sockets inherit the listener's sizes
        server.rcvbuf = lsock.rcvbuf
        server._peer = self
        self._peer = server
        self._model.handshake(server._model)
        world._conns[self._conn][1] = server
        # the SYN-ACK goes first on the way back: server data can't overtake it
        synack = server._link.arrival(world, 0)
        world.call_at(synack, self._established)
        lsock._queue.append(server)
        world.record("accept-queued", self._conn, "server", len(lsock._queue))
        lsock._changed()

    def _established(self):
        if self._state != CONNECTING:
            return
        self._state = CONNECTED
        self._world.record("established", self._conn, "client", None)
        self._changed()

    def _connect_failed(self, err):
        if self._state != CONNECTING:
            return
        self._state = NEW
        self._err = err
        self._world.record("connect-failed", self._conn, "client", errno.errorcode.get(err))
        self._changed()

    def accept(self):
        self._check_open()
        if self._state != LISTENING:
            raise oserror(errno.EINVAL)
        if not self._queue:
            self._would_block("accept")
        conn = self._queue.popleft()
        conn._fd = self._world._new_fd(conn)
        conn.owner = self.owner
        self._world.record("accept", conn._conn, "server", conn._fd)
        self._changed()
        return conn, conn._remote

    # -- data -----------------------------------------------------------

    def send(self, data, flags=0) -> int:
        self._check_open()
        if self._state != CONNECTED:
            if self._state == CONNECTING:
                self._would_block("send")
            if self._err:                      # a failed connect
                raise error_exc(self._take_err())
            raise oserror(errno.ENOTCONN)
        if self._err:
            raise error_exc(self._take_err())
        if self._wr_shut or self._reset:
            raise BrokenPipeError(errno.EPIPE, "Broken pipe (simulated)")
        if self._world.buggify_on and "short-write" in self._world.buggify_on \
                and self.owner is not None:
            data = self._short_write(data)
        return self._model.send(data)

    def sendmsg(self, buffers, ancdata=(), flags=0, address=None) -> int:
        """A gather write (asyncio's selector transport on 3.12+ writes its
        buffer with it): the buffers in order, as one ``send`` of them joined,
        which takes what fits exactly as ``send`` does. No ancillary data."""
        if ancdata or address is not None:
            raise oserror(errno.EOPNOTSUPP)
        return self.send(b"".join(buffers), flags)

    def recv(self, bufsize, flags=0) -> bytes:
        n = self._recv_size(bufsize, flags)
        if n is None:
            return b""
        rcv = self._rcv
        data = memoryview(rcv)[:n].tobytes()       # one copy, not a slice and then bytes
        if flags & MSG_PEEK:
            return data
        del rcv[:n]
        self._consumed(n)
        return data

    def recv_into(self, buffer, nbytes=0, flags=0) -> int:
        view = memoryview(buffer).cast("B")
        size = nbytes or len(view)
        n = self._recv_size(size, flags)
        if n is None:
            return 0
        view[:n] = memoryview(self._rcv)[:n]
        if not flags & MSG_PEEK:
            del self._rcv[:n]
            self._consumed(n)
        return n

    def _recv_size(self, bufsize, flags):
        """How many bytes a recv of ``bufsize`` returns now; ``None`` for EOF.
        Raises what Linux's tcp_recvmsg would."""
        self._check_open()
        if bufsize < 0:
            raise ValueError("negative buffersize in recv")
        if self._state != CONNECTED:
            if self._state == CONNECTING:
                self._would_block("recv")
            if self._err:
                raise error_exc(self._take_err())
            raise oserror(errno.ENOTCONN)
        # A pending error or an RST is reported before a fault's gate: poll
        # reports them at once (ERR), and a recv that said "try again" then
        # would have a reader that trusts poll spin for ever.
        if not (self._err or self._reset) and self._gated():
            self._would_block("recv")
        rcv = self._rcv
        if rcv and not self._rd_shut:
            n = bufsize if bufsize < len(rcv) else len(rcv)
            if n > 1 and self._world.buggify_on and "short-read" in self._world.buggify_on \
                    and self.owner is not None \
                    and self._world.buggify("short-read", self._conn, self._side):
                n = self._world.buggify_size(n)
            if self._slow_rate is not None:
                cap = max(1, int(self._slow_rate * SLOW_SLICE_S))
                if n > cap:
                    n = cap
                now = self._world.now
                self._slow_due = max(self._slow_due, now) + n / self._slow_rate
                self._world.call_at(self._slow_due, self._changed)
            return n
        if self._eof or self._rd_shut:
            return None
        if self._err:
            raise error_exc(self._take_err())
        if self._reset:
            return None
        if bufsize == 0:
            return 0
        self._would_block("recv")

    # -- the seam's fault points (World.buggify; docs/simnet.md) ---------------

    def _short_write(self, data):
        """``short-write``: offer the model only part of ``data`` (send(2) may
        take fewer bytes than it could; POSIX: "the number of bytes sent")."""
        view = memoryview(data).cast("B")
        n = len(view)
        # a send that will say EAGAIN anyway is no site (a retry loop would
        # otherwise meet it at every spurious wake-up)
        if n > 1 and self.sndbuf > self._model.send_used() \
                and self._world.buggify("short-write", self._conn, self._side):
            return view[:self._world.buggify_size(n)]
        return data

    def _late_site(self):
        """``late-notify`` at a FIN or RST arriving now: the mask a poll reported
        before it, which the next look still gets (None: on time)."""
        world = self._world
        if "late-notify" in world.buggify_on and self.owner is not None and self._fd >= 0 \
                and world.buggify("late-notify", self._conn, self._side):
            return self._raw_events()
        return None

    def _late_report(self) -> int:
        """One look at a socket whose FIN or RST is late: the old mask, and a
        mark at this instant so that the next look reports the news (a
        waiting poll is not left blocked by it)."""
        hidden, self._late = self._late, None
        world = self._world
        world.call_at(world.now, self._changed)
        return hidden

    def _consumed(self, n):
        if not n:
            return
        self._read_total += n
        self._model.consumed(n)

    def _take_err(self):
        err, self._err = self._err, 0
        return err

    # -- the wire ---------------------------------------------------------

    def _pump(self):
        """Move unsent bytes onto the link as far as the peer's window allows,
        then the FIN if one is queued behind them."""
        if not self._unsent and (self._fin_sent or not self._fin_queued):
            return
        peer = self._peer
        if peer is None or self._reset or self._state != CONNECTED:
            return
        self._model.pump(peer)

    def _accepts(self, data) -> bool:
        """A segment arrives: whether it is kept (the model then takes it).
        Nothing crosses a vanished host or reaches a reset socket; data for a
        socket nobody will read is answered with an RST (Linux)."""
        if self._peer._link.dead or self._vanished or self._reset:
            return False
        if self._app_closed:
            self._world.record("rst-on-data", self._conn, self._side, len(data))
            self._send_rst()
            return False
        return True

    def _on_fin(self):
        if self._reset or self._vanished or self._peer._link.dead:
            return
        late = self._late_site() if self._world.buggify_on else None
        self._eof = True
        self._late = late
        self._world.record("fin", self._conn, self._side, None)
        self._changed()

    def _send_rst(self):
        """Abort: tell the peer, drop what we had not sent."""
        world = self._world
        peer = self._peer
        self._unsent.clear()
        self._unacked = 0
        self._model.drop()
        self._reset = True
        if peer is not None and not self._link.dead:
            world.call_at(self._link.arrival(world, 0), peer._rst_arrives)
        self._changed()

    def _rst_arrives(self):
        if not self._peer._link.dead:
            self._on_rst()

    def _on_rst(self):
        if self._reset or self._vanished:
            return
        late = self._late_site() if self._world.buggify_on else None
        self._reset = True
        self._late = late
        if not self._app_closed and self._state == CONNECTED:
            # Linux's tcp_reset: in CLOSE_WAIT (the peer's FIN arrived, ours not
            # sent) the error is EPIPE, elsewhere ECONNRESET. Checked on loopback
            # (6.18): after the peer's FIN and then its RST, recv returns b"",
            # and send and SO_ERROR give EPIPE, whether or not the EOF was read.
            self._err = errno.EPIPE if self._eof and not self._wr_shut else errno.ECONNRESET
        self._unsent.clear()
        self._unacked = 0
        self._model.drop()
        self._world.record("rst", self._conn, self._side, len(self._rcv))
        self._changed()

    # -- faults (World._fault) ------------------------------------------------

    def fault_stall(self, duration):
        """Nothing readable for ``duration`` (data keeps arriving)."""
        world = self._world
        self._gate_until = max(self._gate_until, world.now + duration)
        world.call_at(self._gate_until, self._changed)
        self._changed()

    def fault_slow(self, rate, duration):
        """Reads get at most ``rate`` bytes per second for ``duration``."""
        world = self._world
        self._slow_rate = rate
        self._slow_until = world.now + duration
        self._slow_due = world.now
        world.call_at(self._slow_until, self._changed)
        self._changed()

    def fault_reset(self):
        """An RST reaches this end now."""
        self._on_rst()
        self._changed()

    def fault_vanish(self):
        """This end's host disappears: nothing more crosses in either direction."""
        self._vanished = True
        self._link.dead = True
        if self._peer is not None:
            self._peer._link.dead = True
        self._changed()

    # -- endings ----------------------------------------------------------

    def shutdown(self, how) -> None:
        self._check_open()
        if self._state != CONNECTED:
            raise oserror(errno.ENOTCONN)
        if how in (_socket.SHUT_RD, _socket.SHUT_RDWR):
            self._rd_shut = True
        if how in (_socket.SHUT_WR, _socket.SHUT_RDWR) and not self._wr_shut:
            self._wr_shut = True
            self._fin_queued = True
            self._world.record("shutdown", self._conn, self._side, len(self._unsent))
            self._pump()
        self._changed()

    def close(self) -> None:
        if self._app_closed:
            return
        world = self._world
        self._app_closed = True
        if self._state == LISTENING:
            world._listeners.pop(self._local, None)
            for conn in self._queue:           # never accepted: reset them
                conn._app_closed = True
                conn._send_rst()
            self._queue.clear()
        elif self._state == CONNECTED and not self._reset:
            if self._rcv or self._linger_abort:
                world.record("close-rst", self._conn, self._side, len(self._rcv))
                self._send_rst()
            else:
                world.record("close", self._conn, self._side, len(self._unsent))
                if not self._fin_queued:
                    self._fin_queued = True
                    self._wr_shut = True
                    self._pump()
        elif self._state == CONNECTING:
            self._state = CLOSED
        if self._owns_addr:
            world._bound.discard(self._local)
        if self._fd >= 0:
            world._release_fd(self._fd)
        self._fd = -1
        self._watcher = None
        self.poll_marks = None

    def detach(self):
        raise OSError("simulated sockets cannot be detached")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- introspection for tests and peers -------------------------------------

    @property
    def unread_bytes(self) -> int:
        """Bytes received and not yet read (FIONREAD)."""
        return len(self._rcv)

    @property
    def peer_eof(self) -> bool:
        """A FIN arrived (POLLRDHUP: seen without reading)."""
        return self._eof

    @property
    def peer_reset(self) -> bool:
        """An RST arrived or was sent."""
        return self._reset

    @property
    def listening(self) -> bool:
        """``listen()`` was called (SO_ACCEPTCONN)."""
        return self._state == LISTENING

    @property
    def closed(self) -> bool:
        """The application closed it."""
        return self._app_closed

    @property
    def queued_bytes(self) -> int:
        """Bytes in the send buffer: unsent plus unacknowledged."""
        return len(self._unsent) + self._unacked



def _address(address):
    if not (isinstance(address, tuple) and len(address) >= 2):
        raise TypeError(f"simulated sockets take (host, port) addresses, got {address!r}")
    host, port = address[0], address[1]
    if host in ("", None):
        host = "0.0.0.0"
    elif host == "localhost":
        host = "127.0.0.1"
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise OverflowError(f"port must be 0-65535, got {port!r}")
    return (host, port)


def socketpair(world, owner, family, type, proto):
    """Two connected sockets (a connection of its own in the log). They keep
    exact byte counts whatever the world's accounting: AF_UNIX has no window."""
    a = SimSocket(world, family, type, proto)
    b = SimSocket(world, family, type, proto)
    a.owner = b.owner = owner
    a._local, b._local = world._ephemeral("127.0.0.1"), world._ephemeral("127.0.0.1")
    a._remote, b._remote = b._local, a._local
    a._state = b._state = CONNECTED
    a._peer, b._peer = b, a
    a._model, b._model = ByteModel(a), ByteModel(b)
    a._conn = b._conn = len(world._conns)
    a._side, b._side = "client", "server"
    world._conns.append([a, b])
    world.record("socketpair", a._conn, None, None)
    return a, b
