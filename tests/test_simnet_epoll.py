"""The simulated poller's order against Linux's epoll, program by program.

Each program here has an outcome that depends on the order in which a poll
reports ready sockets: which of two connections is read first, whether an
item written before a stop is handled before it, whether a listener's new
connection is accepted before a client's data is read, and (at the poller
itself) the level-triggered re-report, ``maxevents`` and ``EPOLL_CTL_MOD``.
Each runs twice with the same script: on loopback under the real epoll, and
on the simulated network, and the two default-order outcomes must be equal.
So "passes the simulated default order" means what a real run does.

The real runs are deterministic because nothing races: every step of a
script (a peer's send, a connect) is followed by a wait until the socket it
targets is ready (``poll`` on that socket alone, bounded), so the readiness
order is the script's order before the program polls. The simulated runs
wait the same way on the virtual clock.
"""
from __future__ import annotations

import asyncio
import select
import socket
import time

import pytest

import kernels.callback
import kernels.coro
from kernels import io as real_io
from kernels.simnet import READ, WRITE, World

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not hasattr(select, "epoll"),
                                 reason="the real side of the comparison is Linux's epoll")]

SETTLE_S = 2.0          # a readiness on loopback that takes longer is a failure
GUARD_S = 5.0           # a program still running after this (either clock) stopped early


class Real:
    """Loopback TCP; ``settle`` waits until the socket is ready."""
    name = "real"

    def __init__(self):
        self.io = real_io.REAL
        self._socks = []

    def _keep(self, *socks):
        self._socks.extend(socks)
        return socks

    def pair(self):
        ls = socket.socket()
        try:
            ls.bind(("127.0.0.1", 0))
            ls.listen(1)
            peer = socket.create_connection(ls.getsockname(), timeout=SETTLE_S)
            app, _ = ls.accept()
        finally:
            ls.close()
        app.setblocking(False)
        return self._keep(app, peer)

    def listener(self):
        ls = socket.socket()
        self._keep(ls)
        ls.setblocking(False)
        ls.bind(("127.0.0.1", 0))
        ls.listen(4)
        return ls

    def connect(self, listener):
        peer = socket.create_connection(listener.getsockname(), timeout=SETTLE_S)
        self._keep(peer)

    def settle(self, sock, writable=False):
        p = select.poll()
        p.register(sock.fileno(), select.POLLOUT if writable else select.POLLIN)
        deadline = time.monotonic() + SETTLE_S
        while not p.poll(50):
            assert time.monotonic() < deadline, f"{sock!r} not ready within {SETTLE_S} s"
        # the readiness is there; give the callback that queued it (another CPU's
        # softirq, if any) a moment to finish, so the next step cannot overtake it
        time.sleep(0.002)

    def poller(self):
        return real_io.EpollPoller()

    def close(self):
        for s in self._socks:
            s.close()


class Sim:
    """The simulated network; ``settle`` runs the virtual clock until ready."""
    name = "sim"

    def __init__(self):
        self.world = World(seed=1)
        self.io = self.world.io()
        self._peer_io = self.world.io("peer")
        self._socks = []

    def pair(self):
        app, peer = self.io.socketpair()
        app.setblocking(False)
        self._socks += [app, peer]
        return app, peer

    def listener(self):
        ls = self.io.socket()
        self._socks.append(ls)
        ls.setblocking(False)
        ls.bind(("127.0.0.1", 9000))
        ls.listen(4)
        return ls

    def connect(self, listener):
        peer = self._peer_io.socket()
        self._socks.append(peer)
        peer.setblocking(False)
        peer.connect_ex(listener.getsockname())

    def settle(self, sock, writable=False):
        want = WRITE if writable else READ
        for _ in range(1000):
            if sock._raw_events() & want:
                return
            self.world.run(until=self.world.now + 1e-4)
        raise AssertionError(f"{sock!r} not ready within 0.1 s of virtual time")

    def poller(self):
        return self.io.poller()

    def close(self):
        for s in self._socks:
            s.close()


def _both(run):
    """``run(net)`` on the real and the simulated network: (real, sim)."""
    out = []
    for cls in (Real, Sim):
        n = cls()
        try:
            out.append(run(n))
        finally:
            n.close()
    return tuple(out)


def _drain(sock):
    while True:
        try:
            if not sock.recv(65536):
                return
        except BlockingIOError:
            return


# -- the poller itself: epoll's ready list -----------------------------------

def _poller_script(steps):
    """A function of a net that plays ``steps`` on one poller over three
    connections and returns what each ``wait`` reported, by name and mask."""
    def run(n):
        conns = [n.pair() for _ in range(3)]
        names = {app.fileno(): f"c{i}" for i, (app, _) in enumerate(conns)}
        poller = n.poller()
        seen = []
        try:
            for step in steps:
                op, *args = step
                if op == "send":
                    app, peer = conns[args[0]]
                    peer.send(b"x")
                    n.settle(app)
                elif op == "drain":
                    _drain(conns[args[0]][0])
                elif op in ("register", "modify"):
                    getattr(poller, op)(conns[args[0]][0].fileno(), args[1])
                elif op == "wait":
                    got = poller.wait(0, *args)
                    seen.append([names[fd] + ("r" if mask & READ else "") + ("w" if mask & WRITE else "")
                                 for fd, mask in got])
        finally:
            poller.close()
        return seen
    return run


R, W = READ, WRITE
POLLER_SCRIPTS = {
    # an fd registered while ready joins the ready list then (ep_insert)
    "ready-before-registered": [("send", 0), ("send", 1), ("register", 1, R), ("register", 0, R),
                                ("wait",)],
    # the order the fds became ready in, not the order they were registered in
    "readiness-order": [("register", 0, R), ("register", 1, R), ("register", 2, R),
                        ("send", 2), ("send", 0), ("send", 1), ("wait",)],
    # a reported fd still ready goes back at the tail; one drained leaves the list
    "level-triggered-tail": [("register", 0, R), ("register", 1, R), ("register", 2, R),
                             ("send", 2), ("wait",), ("send", 0), ("wait",), ("drain", 2),
                             ("send", 1), ("wait",), ("send", 2), ("wait",), ("wait",)],
    # maxevents: the rest stay at the head, so successive waits go round
    "maxevents-round-robin": [("register", 0, R), ("register", 1, R), ("register", 2, R),
                              ("send", 0), ("send", 1), ("send", 2),
                              ("wait", 2), ("wait", 2), ("wait", 2), ("wait", 1)],
    # EPOLL_CTL_MOD: a listed fd keeps its place, an unlisted one that is ready joins the tail
    "modify": [("register", 0, R), ("register", 1, R), ("register", 2, R),
               ("send", 0), ("send", 1), ("wait",), ("modify", 0, R | W), ("wait",),
               ("modify", 2, W), ("wait",)],
}


@pytest.mark.parametrize("script", sorted(POLLER_SCRIPTS))
def test_the_simulated_poller_reports_in_epolls_order(script):
    real, sim = _both(_poller_script(POLLER_SCRIPTS[script]))
    assert sim == real
    assert any(len(w) > 1 for w in real)          # an order was there to get wrong


def test_the_scripts_pin_down_the_order():
    """What the real epoll reported, written out: the scripts above tell
    registration order, readiness order and the re-report rule apart."""
    real, _ = _both(_poller_script(POLLER_SCRIPTS["level-triggered-tail"]))
    assert real == [["c2r"], ["c2r", "c0r"], ["c0r", "c1r"], ["c0r", "c1r", "c2r"],
                    ["c0r", "c1r", "c2r"]]
    real, _ = _both(_poller_script(POLLER_SCRIPTS["maxevents-round-robin"]))
    assert real == [["c0r", "c1r"], ["c2r", "c0r"], ["c1r", "c2r"], ["c0r"]]


# -- programs on the kernels: the order decides the outcome ------------------

def _program(kernel, sources, script, expect):
    """A function of a net: a program on ``kernel`` that watches one socket per
    entry of ``sources`` ("conn": a connection's app end, "listener": a
    listening socket), registers them in that order, then plays ``script``
    (``("send", i)`` or ``("connect", i)``, each waited for) and handles each
    readiness once: a read or an accept. Returns the names in the order the
    program handled them."""
    def run(n):
        socks, peers = [], []
        for kind in sources:
            if kind == "conn":
                app, peer = n.pair()
            else:
                app, peer = n.listener(), None
            socks.append(app)
            peers.append(peer)
        handled = []

        def handle(i):
            sock = socks[i]
            if sources[i] == "listener":
                conn, _ = sock.accept()
                conn.close()
            else:
                _drain(sock)
            handled.append(i)
            return len(handled) == expect

        def drive():
            for op, i in script:
                if op == "send":
                    peers[i].send(b"m%d" % i)
                else:
                    n.connect(socks[i])
                n.settle(socks[i])

        RUNS[kernel](n, socks, handle, drive)
        return handled
    return run


def _run_callback(n, socks, handle, drive):
    loop = kernels.callback.Loop(io=n.io)
    try:
        def on_ready(i):
            loop.remove_reader(socks[i].fileno())
            if handle(i):
                loop.stop()
        for i, s in enumerate(socks):
            loop.add_reader(s.fileno(), on_ready, i)
        loop.call_soon(drive)
        loop.call_later(GUARD_S, loop.stop)
        loop.run_forever()
    finally:
        for s in socks:
            loop.remove_reader(s.fileno())
        loop.close()


def _run_asyncio(n, socks, handle, drive):
    if isinstance(n, Sim):
        from protocols import simports
        loop = simports.SimSelectorEventLoop(n.io)
    else:
        loop = asyncio.SelectorEventLoop()        # EpollSelector on Linux
    try:
        def on_ready(i):
            loop.remove_reader(socks[i].fileno())
            if handle(i):
                loop.stop()
        for i, s in enumerate(socks):
            loop.add_reader(s.fileno(), on_ready, i)
        loop.call_soon(drive)
        loop.call_later(GUARD_S, loop.stop)
        loop.run_forever()
    finally:
        for s in socks:
            loop.remove_reader(s.fileno())
        loop.close()


def _run_coro(n, socks, handle, drive):
    c = kernels.coro

    async def reader(i):
        await c.read_wait(socks[i])
        handle(i)

    async def main():
        async with c.move_on_after(GUARD_S):
            async with c.TaskGroup() as g:
                for i in range(len(socks)):
                    g.start_soon(reader, i)
                await c.sleep(0)      # each reader parks on its socket (registers it)
                drive()

    with c.Kernel(io=n.io) as kernel:
        kernel.run(main)


RUNS = {"callback": _run_callback, "asyncio": _run_asyncio, "coro": _run_coro}

PROGRAMS = {
    # two connections, read in the order their data arrived
    "two-reads": (["conn", "conn"], [("send", 1), ("send", 0)], lambda h: h),
    "two-reads-in-order": (["conn", "conn"], [("send", 0), ("send", 1)], lambda h: h),
    # an item on connection 0 must be handled before the stop on connection 1;
    # the peer's two writes swapped make the program lose the item
    "writes-in-order": (["conn", "conn"], [("send", 0), ("send", 1)],
                        lambda h: "pass" if h.index(0) < h.index(1) else "fail: item lost"),
    "writes-swapped": (["conn", "conn"], [("send", 1), ("send", 0)],
                       lambda h: "pass" if h.index(0) < h.index(1) else "fail: item lost"),
    # a listener and a client socket both ready: accept first or read first
    "accept-then-read": (["listener", "conn"], [("connect", 0), ("send", 1)], lambda h: h),
    "read-then-accept": (["listener", "conn"], [("send", 1), ("connect", 0)], lambda h: h),
}


@pytest.mark.parametrize("kernel", sorted(RUNS))
@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_a_programs_default_order_outcome_is_the_real_one(kernel, program):
    sources, script, outcome = PROGRAMS[program]
    real, sim = _both(_program(kernel, sources, script, expect=len(sources)))
    assert len(real) == len(sources), f"the real run handled only {real}"
    assert outcome(sim) == outcome(real)
    # the script's order is the outcome: the first socket made ready is handled first
    assert real[0] == script[0][1]


def test_the_swapped_writes_fail_on_both_networks():
    """The issue's case: the peer's two writes swapped. It fails on the real
    network, and now on the simulated default order too (registration order
    had it pass)."""
    sources, script, outcome = PROGRAMS["writes-swapped"]
    real, sim = _both(_program("callback", sources, script, expect=2))
    assert outcome(real) == outcome(sim) == "fail: item lost"
    sources, script, outcome = PROGRAMS["writes-in-order"]
    real, sim = _both(_program("callback", sources, script, expect=2))
    assert outcome(real) == outcome(sim) == "pass"
