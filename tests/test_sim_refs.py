"""The reference runtimes on the simulated network (``protocols.simports``).

asyncio, trio and curio get onto a world through what their ports build
explicitly -- a loop factory, a clock and trio sockets, a kernel with a
selector -- so running a sim cell must leave every module of those libraries
exactly as it was. Whether a runtime can run there at all is what its
``RuntimeInfo`` declares (``real_network_only``); one that cannot is skipped
with its reason. curio runs with ``Kernel(selector=SimSelector)`` and the
virtual clock, and its verdicts equal its real-socket verdicts.
"""
from __future__ import annotations

import importlib
import json
import os
import pathlib
import socket
import subprocess
import sys

import pytest

from bench import run as matrix
from bench.scenarios import simulated as simcells
from bench.run import seeds
from kernels.simnet import World
from protocols import ports, simports
from bench import runtimes
from protocols.errors import Unavailable

pytestmark = pytest.mark.timeout(120)

REFERENCES = ("asyncio-protocol", "asyncio-streams", "trio", "curio")


def sim_cells(sids, runtime_specs, variants=None, preset="tiny"):
    cells = matrix.plan(sids, runtime_specs, variants, preset)
    for c in cells:
        c.params["net"] = "sim"
    return cells


def _available(ids=REFERENCES) -> str:
    return ",".join(i for i in ids if runtimes.parse(i).available())


# ---------------------------------------------------------------------------
# Nothing is patched

_MODULES = ("socket", "selectors", "time", "asyncio", "asyncio.events", "asyncio.base_events",
            "asyncio.selector_events", "asyncio.unix_events", "trio", "trio.socket",
            "trio.lowlevel", "curio", "curio.kernel", "curio.io")


def _snapshot() -> dict:
    """Every attribute of those modules, and of the classes the adapters
    subclass, by identity."""
    snap = {}
    for name in _MODULES:
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        snap.update({(name, k): v for k, v in vars(mod).items()})
        for cls_name in ("SelectorEventLoop", "Kernel", "SocketType"):
            cls = vars(mod).get(cls_name)
            if isinstance(cls, type):
                snap.update({(name, cls_name, k): v for k, v in vars(cls).items()})
    return snap


def test_a_sim_cell_of_a_reference_replaces_no_attribute_of_any_module():
    before = _snapshot()
    cells = sim_cells("S1,S3", _available(), "naive")
    assert len(cells) >= 4
    for cell in cells:
        r = matrix.run_cell(cell)
        assert not r["errors"] and not r.get("skipped"), (cell.id, r["errors"], r.get("skipped"))
        assert r["metrics"]["sim_s"] > 0.5, cell.id
    after = _snapshot()
    changed = sorted(str(k) for k, v in before.items() if after.get(k) is not v)
    assert not changed, f"replaced by a sim cell: {changed}"


def test_asyncio_and_curio_sim_cells_open_no_real_socket(monkeypatch):
    """Their loop, kernel and wake-ups are the world's: a real socket or
    socketpair opened during the cell is a failure. (trio always makes its
    own epoll and wake-up socketpair, which carry none of the cell's bytes.)"""
    opened = []

    def refuse(*a, **kw):
        opened.append(a)
        raise AssertionError("a real socket was opened in a sim cell")
    cells = sim_cells("S1,S3", _available(("asyncio-protocol", "asyncio-streams", "curio")),
                      "naive")
    monkeypatch.setattr(socket, "socket", refuse)
    monkeypatch.setattr(socket, "socketpair", refuse)
    results = [matrix.run_cell(c) for c in cells]
    monkeypatch.undo()
    assert not opened
    for cell, r in zip(cells, results):
        assert not r["errors"], (cell.id, r["errors"])


def test_adapters_are_used_only_on_a_simulated_network():
    assert simports.sim_io() is None
    world = World(0)
    with ports.using_io(world.io()):
        assert simports.sim_io().world is world
    pytest.importorskip("trio")
    real = socket.socket()
    try:
        wrapped = simports.trio_socket(real)
        assert not isinstance(wrapped, simports.SimTrioSocket)
        assert isinstance(simports.trio_socket(world.io().socket()), simports.SimTrioSocket)
    finally:
        real.close()


def test_trio_high_level_networking_runs_on_the_world():
    """``trio.open_tcp_stream`` and ``trio.open_tcp_listeners`` make their sockets
    through trio's per-run socket factory and resolver, which ``run_trio`` sets."""
    trio = pytest.importorskip("trio")
    from bench import peers
    from bench.peers.sim import play
    world = World(0, log=False)
    sink = play(world, peers.sink(rate_Bps=1_000_000), listen=("127.0.0.1", 9001))
    play(world, peers.source(rate_Bps=1_000_000, duration_s=1.0), connect=("127.0.0.1", 9002),
         at=0.5)

    async def main():
        out = await trio.open_tcp_stream("127.0.0.1", 9001)
        await out.send_all(b"x" * 300_000)
        await out.aclose()
        (listener,) = await trio.open_tcp_listeners(9002, host="127.0.0.1")
        conn = await listener.accept()
        got = 0
        while data := await conn.receive_some(65536):
            got += len(data)
        await conn.aclose()
        await listener.aclose()
        return got, trio.current_time()

    got, now = simports.run_trio(world.io(), main)
    assert sink.result()["received_bytes"] == 300_000
    assert 0.9e6 <= got <= 1.1e6          # 1 s at 1 MB/s, in frames
    assert now == world.now and 1.4 < now < 1.6


# ---------------------------------------------------------------------------
# Declared on the runtime

@pytest.fixture
def throwaway():
    made = []

    def make(rid, **kw):
        info = runtimes.register(runtimes.RuntimeInfo(
            rid, "task", "protocols.ports:CoroPort", runtimes.get("coro").options, **kw))
        made.append(rid)
        return info
    yield make
    for rid in made:
        runtimes.unregister(rid)


def test_a_runtime_declaring_it_runs_only_on_the_real_network_is_skipped_with_its_reason(throwaway):
    throwaway("real-only-demo", real_network_only="it talks to a NIC directly")
    throwaway("undeclared-demo")
    for rid, reason in (("real-only-demo", "it talks to a NIC directly"),
                        ("undeclared-demo", "does not declare")):
        cell = sim_cells("S3", rid, "naive")[0]
        r = matrix.run_cell(cell)
        assert r["skipped"].startswith(f"{rid} runs only on the real network: ")
        assert reason in r["skipped"] and not r["errors"]
        assert simcells.sim_capable(runtimes.parse(rid)) == r["skipped"]
        # and the port is never opened on a world, whoever asks
        with ports.using_io(World(0).io()), pytest.raises(Unavailable, match="real network"):
            runtimes.parse(rid).open()
    # the same runtimes on real sockets open as usual
    runtimes.parse("real-only-demo").open().close()


def test_the_built_in_declarations():
    declared = {rid: info.real_network_only for rid, info in runtimes.RUNTIMES.items()
                if info.origin == "builtin"}
    assert {rid for rid, why in declared.items() if why is None} == {
        "callback", "hybrid", "coro", "asyncio-protocol", "asyncio-streams", "trio", "curio"}
    for rid in ("uvloop-protocol", "uvloop-streams"):
        assert "uvloop polls real file descriptors in C" in declared[rid]


@pytest.mark.parametrize("bad", ["", "  ", 3])
def test_a_bad_declaration_is_refused(bad):
    with pytest.raises(runtimes.UsageError, match="real_network_only"):
        runtimes.register(runtimes.RuntimeInfo("bad-demo", "task", "protocols.ports:CoroPort",
                                               runtimes.get("coro").options,
                                               real_network_only=bad))
    assert "bad-demo" not in runtimes.RUNTIMES


# ---------------------------------------------------------------------------
# curio

def test_curio_runs_in_virtual_time_on_its_own_kernel():
    curio = pytest.importorskip("curio")
    world = World(0)
    with ports.using_io(world.io()):
        port = runtimes.parse("curio").open()
    assert isinstance(port.kernel, simports.SimKernel)

    async def main(port):
        t0 = await curio.clock()
        await curio.sleep(5)
        t1 = await curio.clock()
        async with curio.ignore_after(2) as late:
            await curio.sleep(100)
        return t0, t1, await curio.clock(), late.expired

    try:
        t0, t1, t2, expired = port.run(main)
    finally:
        port.close()
    assert (t0, t1, t2) == (0.0, 5.0, 7.0) and expired
    assert world.now == 7.0


def test_a_curio_whose_kernel_differs_is_unavailable_on_the_world_with_the_reason(monkeypatch):
    """SimKernel relies on Kernel._make_kernel_runtime reading time.monotonic and
    socket.socketpair from its globals: a curio without that is refused, never
    run on the real clock."""
    class Kernel:
        def _make_kernel_runtime(self):
            return lambda coro: None
    fake = type("curio", (), {"Kernel": Kernel, "__version__": "9.9"})
    monkeypatch.setattr(simports, "_library", lambda name: fake)
    simports._curio_kernel_class.cache_clear()
    try:
        with pytest.raises(Unavailable, match=r"curio 9.9: Kernel._make_kernel_runtime"):
            simports.curio_kernel(World(0).io())
    finally:
        simports._curio_kernel_class.cache_clear()


def test_curio_stops_when_its_peers_are_done():
    """A serving cell ends by the simulated SIGINT, as the real one ends by
    the orchestrator's: the pipelining client holds 0.8 s."""
    pytest.importorskip("curio")
    r = matrix.run_cell(sim_cells("S5", "curio", "naive")[0])
    assert not r["errors"], r["errors"]
    assert 0.8 <= r["metrics"]["sim_s"] < 1.0


def test_a_reference_sim_cell_is_a_function_of_its_universe():
    for cell in sim_cells("S1,S3", _available(), "naive"):
        a, b = matrix.run_cell(cell), matrix.run_cell(cell)
        assert not a["errors"], a["errors"]
        for r in (a, b):
            for k in seeds.WALL_CLOCK:
                r["metrics"].pop(k, None)
                r["samples"].pop(k, None)
        assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sid", ["S1", "S3"])
def test_curio_verdicts_under_sim_equal_its_verdicts_on_real_sockets(sid):
    pytest.importorskip("curio")
    real = {c.id: matrix.run_cell(c) for c in matrix.plan(sid, "curio", None, "tiny")}
    cells = sim_cells(sid, "curio")
    assert len(cells) == len(real) >= 2
    for cell in cells:
        sim = matrix.run_cell(cell)
        assert not sim["errors"], (cell.id, sim["errors"])
        twin = real[cell.id.rsplit("/", 1)[0]]
        assert not twin["errors"], (cell.id, twin["errors"])
        assert sim["verdicts"] == twin["verdicts"], (cell.id, sim["verdicts"], twin["verdicts"])


# ---------------------------------------------------------------------------
# trio: the world's errors, and a seeded task order (issue 23)

def test_a_trio_deadlock_on_the_world_is_the_worlds_deadlock_error():
    """trio wraps what its clock raises in TrioInternalError; run_trio hands
    back the world's own error."""
    trio = pytest.importorskip("trio")
    from kernels.simnet import SimDeadlock
    world = World(0, log=False)

    async def main():
        await trio.sleep_forever()

    with pytest.raises(SimDeadlock):
        simports.run_trio(world.io(), main)


def _trio_order(seed):
    trio = pytest.importorskip("trio")
    world = World(seed, log=False)
    order = []

    async def main():
        async def task(i):
            await trio.sleep(0)
            order.append(i)
        async with trio.open_nursery() as n:
            for i in range(6):
                n.start_soon(task, i)
    simports.run_trio(world.io(), main)
    return order


def test_trios_task_order_on_the_world_is_a_function_of_the_seed():
    """Before, trio's batch order came from an unseeded generator: the same seed
    gave [0..5] in some runs and [5..0] in others, in one process or across
    processes. Seeded from the world, every run of a seed agrees, and trio's
    generator is left as it was."""
    pytest.importorskip("trio")
    import trio._core._run as trio_run
    before = trio_run._r.getstate()
    orders = [_trio_order(7) for _ in range(8)]
    assert all(o == orders[0] for o in orders), orders
    assert sorted(orders[0]) == list(range(6))
    assert trio_run._r.getstate() == before
    code = ("import json, sys; sys.path[:0] = [sys.argv[1], sys.argv[1] + '/tests']; "
            "import test_sim_refs as t; print(json.dumps(t._trio_order(7)))")
    root = str(pathlib.Path(__file__).resolve().parent.parent)
    # Across processes: two fresh ones agree. (This process is not compared with them:
    # trio breaks ties between equal deadlines by id(), which follows this process's
    # allocation history -- a documented limit of the seeding, docs/simnet.md.)
    env = dict(os.environ, PYTHONHASHSEED="0")
    fresh = [subprocess.run([sys.executable, "-c", code, root], capture_output=True, text=True,
                            timeout=60, check=True, env=env) for _ in range(2)]
    got = [json.loads(r.stdout.strip().splitlines()[-1]) for r in fresh]
    assert got[0] == got[1] and sorted(got[0]) == list(range(6)), got


# ---------------------------------------------------------------------------
# asyncio: an unmodified app with host and port (issue 23)

def test_an_unmodified_asyncio_streams_app_with_host_and_port_runs_on_the_world():
    """``asyncio.start_server(handler, host, 0)`` and ``open_connection(host,
    port)`` -- no ``sock=`` -- make their sockets on the world, not on the real
    network (which failed at once with EBADF)."""
    import asyncio
    world = World(0, log=False)
    loop = simports.SimSelectorEventLoop(world.io())

    async def handle(reader, writer):                  # an echo server, as written for asyncio
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()
        await writer.wait_closed()

    async def main():
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("localhost", port)
        writer.write(b"echo" * 50_000)
        await writer.drain()
        writer.write_eof()
        got = bytearray()
        while data := await reader.read(65536):
            got += data
        writer.close()
        await writer.wait_closed()
        server.close()
        await server.wait_closed()
        return bytes(got), asyncio.get_running_loop().time()

    try:
        got, now = loop.run_until_complete(main())
    finally:
        loop.close()
    assert got == b"echo" * 50_000
    assert now == world.now and 0 < now < 1.0          # virtual time: a few round trips
    with pytest.raises(ConnectionRefusedError):
        loop2 = simports.SimSelectorEventLoop(world.io())
        try:
            loop2.run_until_complete(asyncio.open_connection("127.0.0.1", port_nobody_listens_on()))
        finally:
            loop2.close()


def port_nobody_listens_on():
    return 9
