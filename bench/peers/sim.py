"""The simulated-world driver: one role core as a participant of a ``kernels.simnet`` world.

``SimPeer`` plays one role spec (any role of ``bench.peers.spec.ROLES``) as a
``kernels.simnet.Peer`` of a ``bench.scenarios.simulated.SimCell``, with virtual times
where the real driver reports ``time.monotonic()``. Like the real driver it
carries out the core's actions and reports what the socket did; it decides
nothing about the role. ``make_role(cell, cfg)`` builds one; ``play(world,
spec, ...)`` puts a role in a bare world (tests, ``docs/simnet.md``).

What differs from the real driver is what a world can see: there is no idle
time to sample (the core gets no ``tick``), and a wait is a timer or the
socket's next change (the world's poke), never a blocking call.
"""
from __future__ import annotations

import os
import socket as _socket
import struct

from protocols.ports import pin_buffers
from kernels import simnet
from kernels.simnet import Peer

from bench.peers.core import Duplex, End, Hold, Recv, Send, Shutdown, Sleep, UnknownAction
from bench.peers.spec import ROLES, check_role

__all__ = ["SimPeer", "SimRole", "make_role", "play", "Stage"]

_READ_OR_ERR = simnet.READ | simnet._ERR


class SimPeer(Peer):
    """One role spec played in the world by the role's core."""

    def __init__(self, cell, cfg: dict):
        super().__init__(cell.world, cfg["name"])
        self.cell = cell
        self.cfg = cfg
        self.core = ROLES[cfg["role"]](cfg, cell.world.now)
        self._report = None
        self._up = False              # the core has been told the connection is up
        self._dialed = None
        cell.roles[cfg["name"]] = self
        self._deadline = cell.world.call_at(self.core.began + cfg["max_s"], self._timeout)
        self._idle_gen = -1
        self._rest_until = -1.0       # waiting for time alone until then (see _poked)

    # the connection --------------------------------------------------------------

    def listen(self, address, backlog=1):
        super().listen(address, backlog)
        pin_buffers(self._lsock, self.cfg.get("sockbuf"))   # accepted sockets inherit them
        self.core.listening(address)
        return self

    def connect(self, address, at=0.0):
        self._dialed = address
        return super().connect(address, at)

    def _attach(self, s):
        pin_buffers(s, self.cfg.get("sockbuf"))
        if self._dialed is None:          # accepted: up from this instant
            self._established(s, self.world.now)
        super()._attach(s)
        s._watcher = self._poked

    def _established(self, s, now) -> bool:
        """Tell the core once the connection is up, as a real ``connect()``
        returns after the handshake (an accepted socket is up at once); a
        refused connection is the real driver's error. False while dialing."""
        err = s.getsockopt(_socket.SOL_SOCKET, _socket.SO_ERROR)
        if err:
            host, port = self._dialed
            self.core.on_error(f"[Errno {err}] connect to {host}:{port}: {os.strerror(err)}")
            return True
        try:
            peer = s.getpeername()[:2]
        except OSError:
            return False
        self._up = True
        self.core.connected(now, peer=peer, sockbuf=[s.sndbuf, s.rcvbuf])
        return True

    def _poked(self):
        """The socket changed (the world's poke). Two pokes would find nothing
        to do, and are not passed on to ``_act``:

        * ``_act`` runs until the core waits, and its own reads and sends poke
          it again at once: if nothing in the world changed since it finished
          (``world._gen``, bumped by every change of readiness), that poke
          finds the same nothing at the same instant.
        * A core that asked to ``Sleep`` until ``_rest_until`` ignores its
          socket until then: ``_act`` would only set the same timer again."""
        world = self.world
        if world.now < self._rest_until:
            return
        if world._gen != self._idle_gen:
            self._act()
            self._idle_gen = world._gen

    def _on_timer(self):
        super()._on_timer()
        self._idle_gen = self.world._gen

    def _timeout(self):
        if self.ended is None:
            self.core.expire(self.world.now)
            self._finish(self.core.next(self.world.now))

    # the loop ------------------------------------------------------------------

    def _act(self):
        """Carry out the core's actions until it waits (no time passes in here)."""
        if self.ended is not None or self.sock is None:
            return
        core, s, now = self.core, self.sock, self.world.now
        if not self._up and not self._established(s, now):
            return
        self._rest_until = -1.0
        ask = False         # the first read after a poke finds data: don't ask first
        while True:
            act = core.next(now)
            kind = type(act)
            if kind is Recv:
                ask, asked = True, ask
                if not self._read(act.max_bytes, asked, now):
                    if act.until is not None:
                        self._wake_at(act.until)
                    return
            elif kind is Send:
                n = self._send(act.data)
                if n == 0:
                    return
                if n is not None:
                    core.on_sent(n, now)
            elif kind is Sleep:
                self._wake_at(act.until)
                self._rest_until = act.until
                return
            elif kind is Hold:
                if s.peer_reset:
                    core.on_reset(now)
                elif s.peer_eof:
                    core.on_eof(now)
                else:
                    self._wake_at(act.until)
                    return
            elif kind is Duplex:
                n = self._send(act.data)
                if n:
                    core.on_sent(n, now)
                    continue
                if not core.ended and not self._read(act.max_bytes, True, now):
                    return
            elif kind is Shutdown:
                try:
                    s.shutdown(_socket.SHUT_WR)
                except OSError:
                    core.on_shutdown_failed(now)
            elif kind is End:
                return self._finish(act)
            else:
                raise UnknownAction(f"the simulated peer driver has no action {act!r}")

    def _read(self, n, ask, now) -> bool:
        """One read, told to the core; False when there was nothing to read
        (the core waits), True when it has something new to decide on."""
        data = self._recv(n, ask)
        if data is None:
            return self.core.ended
        if data:
            self.core.on_data(data, now)
        else:
            self.core.on_eof(now)
        return True

    def _finish(self, act: End):
        """Close the role's sockets (an RST with ``act.reset``) and end it."""
        if not isinstance(act, End):
            raise UnknownAction(f"a role that ended must answer End, not {act!r}")
        if self.sock is not None and self.core.wants_unread:
            self.core.on_unread(self.sock.unread_bytes)
        for s in (self.sock, self._lsock):
            if s is not None:
                try:
                    if act.reset:
                        s.setsockopt(_socket.SOL_SOCKET, _socket.SO_LINGER,
                                     struct.pack("ii", 1, 0))
                    s.close()
                except OSError:
                    pass
        self._lsock = None
        self._end(act.how)

    def _end(self, how):
        first = self.ended is None
        super()._end(how)
        if first:
            self._deadline.cancel()
            if self.sock is not None:
                self.sock._watcher = None
            self.cell.role_ended(self)

    def result(self) -> dict:
        """The core's report, at the role's end (or now, if it still runs)."""
        if self._report is None:
            now = self.ended_at if self.ended_at is not None else self.world.now
            self._report = self.core.report(now)
        return self._report

    # the socket, with the real driver's error mapping ------------------------------

    def _send(self, data):
        """The bytes the socket took, 0 when it is full, None after an error
        (which the core has been told)."""
        try:
            return self.sock.send(data)
        except BlockingIOError:
            return 0
        except (ConnectionResetError, BrokenPipeError):
            self.core.on_reset(self.world.now)
        except OSError as e:
            self.core.on_error(f"{e.strerror} [errno {e.errno}]")
        return None

    def _recv(self, n, ask=True):
        """Data, b"" at EOF, None when nothing is there or after an error. ``ask``:
        look at the socket's readiness first instead of letting recv raise
        BlockingIOError -- the exception costs more than the read."""
        sock = self.sock
        # _raw_events, not _events: asking must not count as waiting (wake_s)
        if ask and not sock._raw_events() & _READ_OR_ERR:
            return None
        try:
            return sock.recv(n)
        except BlockingIOError:
            return None
        except (ConnectionResetError, BrokenPipeError):
            self.core.on_reset(self.world.now)
        except OSError as e:
            self.core.on_error(f"{e.strerror} [errno {e.errno}]")
        return None


SimRole = SimPeer     # the name bench.scenarios.simulated and older code use


def make_role(cell, cfg: dict) -> SimPeer:
    """The in-world peer for the checked role spec ``cfg``."""
    return SimPeer(cell, cfg)


class Stage:
    """The least a ``SimPeer`` needs from its cell: the world and the roles in
    it by name (``bench.scenarios.simulated.SimCell`` is the full one)."""

    def __init__(self, world):
        self.world = world
        self.roles: dict[str, SimPeer] = {}

    def role_ended(self, role) -> None:
        pass


def play(world, spec: dict, *, listen=None, connect=None, at: float = 0.0,
         max_s: float = 60.0, stage: Stage | None = None) -> SimPeer:
    """Role ``spec`` (``bench.peers.sink(...)`` and the like) in ``world``,
    listening on ``listen`` or dialing ``connect`` at virtual time ``at``.
    ``max_s`` is the role's default bound; ``stage`` collects the roles of one
    world (one is made per role without it)."""
    if (listen is None) == (connect is None):
        raise ValueError("play: give exactly one of listen= and connect=")
    spec = {k: v for k, v in spec.items() if k not in ("listen", "connect")}
    cfg = check_role({**spec, "deferred": True}, max_s)
    role = SimPeer(stage if stage is not None else Stage(world), cfg)
    if listen is not None:
        return role.listen(tuple(listen))
    return role.connect(tuple(connect), at)
