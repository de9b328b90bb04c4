"""Micro-benchmarks: spawn+join, yield, ping-pong and timers, and the Python
counterparts of tokio's scheduler benchmarks (chained_spawn, yield_many, many_timers), on
every runtime whose port they apply to, and the runner that times them in fresh pinned
worker processes.

A run body builds nothing: ``Micro`` opens the port and binds the listening socket
outside the timed region, and the body times only the operations, inside the loop, with
``time.perf_counter``, counting each one (a run that did fewer than asked is an error,
not a fast result). ``run_micro_matrix`` runs each measurement in a fresh worker process
pinned to one CPU, growing the operation count until a run lasts at least ``min_time``
(the shorter runs before it are the warm-up). The pytest suite runs the same bodies once
each as correctness tests.

This module is also the worker's entry point::

    python -m bench.perf.micro worker --op OP --runtime SPEC [--min-time S] [--n N]
"""
from __future__ import annotations

import argparse
import json
import platform
import random
import subprocess
import sys
import time
from functools import partial

from bench.host import envs
from bench.host import procs
from bench import results
from bench.perf.machine import (Interrupted, MeasureError, bench_runtime, check_stop,
                           cpu_plan, pin, progress, run_interruptibly)
from bench.results.tables import fmt_rate, format_table
from bench import runtimes
from protocols.common import set_event

__all__ = ["MICRO_OPS", "MICRO_STYLES", "MICRO_START_N", "MICRO_TIMEOUT_S", "micro_supported",
           "Micro", "MicroResult", "micro", "micro_calibrated", "run_micro_matrix",
           "micro_table", "MICRO_NOTES"]

MICRO_OPS = ("spawn_join", "yield", "pingpong", "timers", "chained_spawn", "yield_many",
             "many_timers")
# Which port styles each operation applies to (callback: no tasks, so no spawn_join, and
# none of tokio's scheduler benchmarks, which are about tasks).
MICRO_STYLES = {"spawn_join": ("stream", "task"), "yield": ("callback", "stream", "task"),
                "pingpong": ("callback", "stream", "task"),
                "timers": ("callback", "stream", "task"),
                "chained_spawn": ("stream", "task"), "yield_many": ("stream", "task"),
                "many_timers": ("stream", "task")}
MICRO_START_N = {"spawn_join": 2000, "yield": 5000, "pingpong": 1000, "timers": 2000,
                 "chained_spawn": 2000, "yield_many": 50, "many_timers": 2000}
# yield_many: this many tasks, each yielding n times (tokio's yield_many: 200 x 1000).
YIELD_MANY_TASKS = 100
MICRO_TIMEOUT_S = 60.0

MICRO_NOTES = [
    "each value is one fresh worker process pinned to one CPU; the operation count grows "
    "until a run lasts --min-time, the earlier runs being the warm-up",
    "pingpong runs over a 127.0.0.1 TCP connection made through the port (not a socketpair): "
    "every runtime pays the same kernel cost per round trip",
    "timers on the stream and task ports are sleeping tasks (spawn + sleep)",
    "spawn_join: create_task + await (stream port), spawn + join (coro, curio), a nursery per "
    "child (trio, which has no join)",
    "chained_spawn (tokio's): each task spawns the next and ends, n deep; the library's own "
    "spawn (create_task; coro's and curio's spawn, as daemon tasks nobody joins), a nursery "
    "on trio",
    f"yield_many (tokio's): {YIELD_MANY_TASKS} tasks each yielding n times; one operation "
    "is one yield",
    "many_timers: n sleeping tasks with staggered deadlines (1 ms down to 1 ms/n), made "
    "latest-first, so every new timer goes to the front of the queue",
]


def micro_supported(op: str, rt) -> bool:
    """Whether ``op`` makes sense on ``rt``'s port (callback: no tasks, so no spawn_join)."""
    if op not in MICRO_STYLES:
        raise ValueError(f"unknown micro-benchmark {op!r}; valid: {', '.join(MICRO_OPS)}")
    return rt.style in MICRO_STYLES[op]


class MicroResult:
    """What one timed run did: ``ops`` operations completed (checked, not assumed) in
    ``elapsed_s`` seconds of the timed region."""
    __slots__ = ("op", "runtime", "n", "ops", "elapsed_s", "error")

    def __init__(self, op, runtime, n, ops, elapsed_s, error=None):
        self.op, self.runtime, self.n, self.ops = op, runtime, n, ops
        self.elapsed_s, self.error = elapsed_s, error

    @property
    def ops_per_s(self) -> float:
        return self.ops / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def as_dict(self) -> dict:
        return {"op": self.op, "runtime": self.runtime, "n": self.n, "ops": self.ops,
                "elapsed_s": self.elapsed_s, "ops_per_s": self.ops_per_s, "error": self.error}

    def __repr__(self):
        return (f"MicroResult({self.op} on {self.runtime}: {self.ops}/{self.n} ops in "
                f"{self.elapsed_s:.4f} s{', ' + self.error if self.error else ''})")


class _Box:
    """Where a run body leaves its count and timestamps."""
    __slots__ = ("ops", "t0", "t1", "error", "closed")

    def __init__(self):
        self.ops = 0
        self.t0 = self.t1 = None
        self.error = None
        self.closed = 0


# --- callback style: call_soon chains, two protocols, call_later -----------------------

def _cb_yield(port, n, box):
    call_soon = port.loop.call_soon
    left = [n, n]

    def step(i):
        box.ops += 1
        left[i] -= 1
        if left[i] > 0:
            call_soon(step, i)
        elif left[1 - i] == 0:
            box.t1 = time.perf_counter()
            port.stop()
    box.t0 = time.perf_counter()
    call_soon(step, 0)
    call_soon(step, 1)


def _cb_timers(port, n, box, delays):
    loop = port.loop

    def fire():
        box.ops += 1
        if box.ops == n:
            box.t1 = time.perf_counter()
            port.stop()
    box.t0 = time.perf_counter()
    call_later = loop.call_later
    for d in delays:
        call_later(d, fire)


class _PingServer:
    """Echoes every byte back; the run stops once both ends have closed."""
    transport = None

    def __init__(self, port, box):
        self.port, self.box = port, box

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.transport.write(data)

    def eof_received(self):
        return False

    def connection_lost(self, exc):
        if exc is not None and self.box.error is None:
            self.box.error = f"connection lost: {exc!r}"
        self.box.closed += 1
        if self.box.closed == 2:
            self.port.stop()

    def pause_writing(self):
        pass

    def resume_writing(self):
        pass


class _PingClient(_PingServer):
    def __init__(self, port, n, box, server):
        super().__init__(port, box)
        self.n, self.server = n, server

    def connection_made(self, transport):
        self.transport = transport
        self.box.t0 = time.perf_counter()
        transport.write(b"x")

    def data_received(self, data):
        box = self.box
        box.ops += len(data)
        if box.ops >= self.n:
            box.t1 = time.perf_counter()
            self.transport.close()
            self.server.close()
        else:
            self.transport.write(b"x")


def _cb_pingpong(port, n, box, listener):
    server = port.listen(lambda: _PingServer(port, box), listener)
    host, p = listener.getsockname()[:2]

    def connected(transport, protocol, exc):
        if exc is not None:
            box.error = f"connect failed: {exc!r}"
            server.close()
            port.stop()
    port.connect(lambda: _PingClient(port, n, box, server), host, p, connected)


# --- stream style ----------------------------------------------------------------------

async def _st_spawn_join(port, n, box):
    async def child():
        box.ops += 1
    create = port.create_task
    box.t0 = time.perf_counter()
    for _ in range(n):
        await create(child())
    box.t1 = time.perf_counter()


async def _st_yielders(port, n, box, tasks):
    # yield: two tasks; yield_many: YIELD_MANY_TASKS; each yields n times
    sleep = port.sleep

    async def worker():
        for _ in range(n):
            await sleep(0)
            box.ops += 1
    box.t0 = time.perf_counter()
    await port.gather(*[worker() for _ in range(tasks)])
    box.t1 = time.perf_counter()


async def _st_timers(port, n, box, delays):
    sleep = port.sleep

    async def sleeper(d):
        await sleep(d)
        box.ops += 1
    box.t0 = time.perf_counter()
    tasks = [port.create_task(sleeper(d)) for d in delays]
    await port.gather(*tasks)
    box.t1 = time.perf_counter()


async def _st_chained_spawn(port, n, box):
    done = port.Event()
    create = port.create_task

    async def link(i):
        box.ops += 1
        if i < n:
            create(link(i + 1))
        else:
            done.set()
    box.t0 = time.perf_counter()
    create(link(1))
    await done.wait()
    box.t1 = time.perf_counter()


async def _st_pingpong(port, n, box, listener):
    async def handle(reader, writer):
        try:
            while data := await reader.read(1024):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        writer.close()
    server = await port.start_server(handle, sock=listener)
    host, p = listener.getsockname()[:2]
    reader, writer = await port.open_connection(host, p)
    try:
        box.t0 = time.perf_counter()
        for _ in range(n):
            writer.write(b"x")
            await writer.drain()
            data = await reader.read(1024)
            if not data:
                box.error = "server closed the connection"
                break
            box.ops += len(data)
        box.t1 = time.perf_counter()
    finally:
        writer.close()
        server.close()
        for _ in range(3):       # let both sides' close callbacks run
            await port.sleep(0)


# --- task style ------------------------------------------------------------------------

def _native_spawn(port):
    """The library's own ``spawn`` where it has spawn-and-join (coro, curio): that is the
    operation the goals name. trio has no join; its idiom is a nursery per child."""
    return port.detached_spawn


async def _tk_spawn_join(port, n, box):
    async def child():
        box.ops += 1
    spawn = _native_spawn(port)
    box.t0 = time.perf_counter()
    if spawn is not None:
        for _ in range(n):
            task = await spawn(child)
            await task.join()
    else:
        open_nursery = port.open_nursery
        for _ in range(n):
            async with open_nursery() as nursery:
                await nursery.spawn(child)
    box.t1 = time.perf_counter()


async def _tk_yielders(port, n, box, tasks):
    # yield: two tasks; yield_many: YIELD_MANY_TASKS; each yields n times
    sleep = port.sleep

    async def worker():
        for _ in range(n):
            await sleep(0)
            box.ops += 1
    box.t0 = time.perf_counter()
    async with port.open_nursery() as nursery:
        for _ in range(tasks):
            await nursery.spawn(worker)
    box.t1 = time.perf_counter()


async def _tk_timers(port, n, box, delays):
    sleep = port.sleep

    async def sleeper(d):
        await sleep(d)
        box.ops += 1
    box.t0 = time.perf_counter()
    async with port.open_nursery() as nursery:
        for d in delays:
            await nursery.spawn(sleeper, d)
    box.t1 = time.perf_counter()


async def _tk_chained_spawn(port, n, box):
    spawn = _native_spawn(port)
    box.t0 = time.perf_counter()
    if spawn is not None:
        done = port.Event()

        # daemon: nobody joins these (tokio's detached spawn); curio prints a line for
        # every non-daemon task that ends unjoined, which would be most of what it timed.
        async def link(i):
            box.ops += 1
            if i < n:
                await spawn(link, i + 1, daemon=True)
            else:
                await set_event(done)
        await spawn(link, 1, daemon=True)
        await done.wait()
        box.t1 = time.perf_counter()
        return
    async with port.open_nursery() as nursery:
        async def nlink(i):
            box.ops += 1
            if i < n:
                await nursery.spawn(nlink, i + 1)
        await nursery.spawn(nlink, 1)
    box.t1 = time.perf_counter()


async def _tk_pingpong(port, n, box, listener):
    lst = port.listen(listener)
    host, p = listener.getsockname()[:2]

    async def serve_one():
        stream = await lst.accept()
        try:
            while data := await stream.receive_some(1024):
                await stream.send_all(data)
        except ConnectionError:
            pass
        await stream.aclose()

    async with port.open_nursery() as nursery:
        await nursery.spawn(serve_one)
        client = await port.open_tcp_stream(host, p)
        try:
            box.t0 = time.perf_counter()
            for _ in range(n):
                await client.send_all(b"x")
                data = await client.receive_some(1024)
                if not data:
                    box.error = "server closed the connection"
                    break
                box.ops += len(data)
            box.t1 = time.perf_counter()
        finally:
            await client.aclose()
    await lst.aclose()


_BODIES = {
    "callback": {"yield": _cb_yield, "timers": _cb_timers, "pingpong": _cb_pingpong},
    "stream": {"spawn_join": _st_spawn_join, "yield": partial(_st_yielders, tasks=2),
               "timers": _st_timers, "pingpong": _st_pingpong,
               "chained_spawn": _st_chained_spawn, "many_timers": _st_timers,
               "yield_many": partial(_st_yielders, tasks=YIELD_MANY_TASKS)},
    "task": {"spawn_join": _tk_spawn_join, "yield": partial(_tk_yielders, tasks=2),
             "timers": _tk_timers, "pingpong": _tk_pingpong,
             "chained_spawn": _tk_chained_spawn, "many_timers": _tk_timers,
             "yield_many": partial(_tk_yielders, tasks=YIELD_MANY_TASKS)},
}


async def _bounded_stream(port, body, args, box):
    try:
        await port.wait_for(body(port, *args), MICRO_TIMEOUT_S)
    except TimeoutError:
        box.error = f"timed out after {MICRO_TIMEOUT_S:.0f} s"


async def _bounded_task(port, body, args, box):
    async with port.move_on_after(MICRO_TIMEOUT_S) as scope:
        await body(port, *args)
    if scope.cancelled_caught:
        box.error = f"timed out after {MICRO_TIMEOUT_S:.0f} s"


class Micro:
    """One prepared micro-benchmark run: the port is open and the listening socket bound
    (outside any timed region); ``run()`` does the operations once; ``close()`` releases
    everything (idempotent). A Micro runs once -- make a new one per round.

    ``op``: spawn_join (spawn a task and wait for it, ``n`` times: ``create_task`` +
    ``await`` on the stream port; ``spawn`` + ``join`` on coro and curio, a nursery per
    child on trio, which has no join), yield (two tasks or
    call_soon chains each yielding ``n`` times: 2n operations), pingpong (``n`` 1-byte
    round trips over a 127.0.0.1 TCP connection made through the port's own
    connect/accept), timers (``n`` timers -- sleeping tasks on the task and stream ports --
    with seeded random delays up to 1 ms, all awaited); and tokio's scheduler benchmarks:
    chained_spawn (each task spawns the next, ``n`` deep), yield_many
    (``YIELD_MANY_TASKS`` tasks each yielding ``n`` times), many_timers (``n`` sleeping
    tasks with staggered deadlines from 1 ms down, made latest-first)."""

    def __init__(self, op: str, runtime, n: int, seed: int = 1):
        if isinstance(runtime, str):
            runtime = runtimes.parse(runtime)
        if op not in MICRO_STYLES:
            raise ValueError(f"unknown micro-benchmark {op!r}; valid: {', '.join(MICRO_OPS)}")
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"n must be a positive int, not {n!r}")
        if not micro_supported(op, runtime):
            raise ValueError(f"micro-benchmark {op} does not apply to {runtime.id} "
                             f"({runtime.style} port)")
        self.op, self.n = op, n
        self.runtime = bench_runtime(runtime)
        self.expected = (2 * n if op == "yield" else YIELD_MANY_TASKS * n
                         if op == "yield_many" else n)
        self.box = _Box()
        self.listener = None
        self.port = None
        self._ran = False
        rng = random.Random(seed)
        self.delays = ([rng.random() * 0.001 for _ in range(n)] if op == "timers" else
                       [0.001 * (n - i) / n for i in range(n)] if op == "many_timers" else None)
        try:
            if op == "pingpong":
                self.listener = runtimes.bind_listener("127.0.0.1", 0)
            self.port = self.runtime.open()
        except BaseException:
            self.close()
            raise

    def run(self) -> MicroResult:
        if self._ran:
            raise RuntimeError("a Micro runs once; make a new one")
        self._ran = True
        port, box, op, n = self.port, self.box, self.op, self.n
        body = _BODIES[port.style][op]
        extra = ((self.delays,) if self.delays is not None else
                 (self.listener,) if op == "pingpong" else ())
        if port.style == "callback":
            def setup(p):
                p.call_later(MICRO_TIMEOUT_S, self._timeout)
                body(p, n, box, *extra)
            port.run(setup)
        elif port.style == "stream":
            port.run(_bounded_stream, body, (n, box, *extra), box)
        else:
            port.run(_bounded_task, body, (n, box, *extra), box)
        elapsed = (box.t1 - box.t0) if box.t0 is not None and box.t1 is not None else 0.0
        error = box.error
        if error is None and box.ops != self.expected:
            error = f"{box.ops} of {self.expected} operations completed"
        return MicroResult(op, self.runtime.spec, n, box.ops, elapsed, error)

    def _timeout(self):
        self.box.error = f"timed out after {MICRO_TIMEOUT_S:.0f} s"
        self.port.stop()

    def close(self) -> None:
        if self.port is not None:
            port, self.port = self.port, None
            port.close()
        if self.listener is not None:
            self.listener.close()
            self.listener = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def micro(op: str, runtime, n: int, seed: int = 1) -> MicroResult:
    """Prepare, run once, close. The port is built outside the timed region."""
    with Micro(op, runtime, n, seed) as m:
        return m.run()


def micro_calibrated(op: str, runtime, min_time: float = 0.2, n: int | None = None,
                     max_rounds: int = 6) -> MicroResult:
    """pyperf-style: grow ``n`` until one run lasts ``min_time``; the runs before the
    last are the warm-up. Always at least one warm-up run."""
    n = n or MICRO_START_N[op]
    warmed = False
    for _ in range(max_rounds):
        res = micro(op, runtime, n)
        if res.error:
            return res
        if res.elapsed_s >= min_time and warmed:
            return res
        warmed = True
        if res.elapsed_s < min_time:
            grow = min_time * 1.2 / max(res.elapsed_s, 1e-6)
            n = int(min(max(n * 2, n * grow), n * 50, 5_000_000))
    return res


# ---------------------------------------------------------------------------
# The runner: one fresh pinned worker process per measurement

def _worker_main(argv) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.perf.micro worker")
    p.add_argument("--op", required=True, choices=MICRO_OPS)
    p.add_argument("--runtime", required=True)
    p.add_argument("--min-time", type=float, default=0.2)
    p.add_argument("--n", type=int, default=None)
    a = p.parse_args(argv)
    try:
        out = micro_calibrated(a.op, a.runtime, a.min_time, a.n).as_dict()
        out["python"] = platform.python_version()
    except Exception as exc:
        out = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(out), flush=True)
    return 0


def _micro_in_worker(op: str, rt, min_time: float, cpu: int | None,
                     timeout_s: float = 180.0) -> dict:
    spec = bench_runtime(rt).spec      # the worker runs in the runtime's own interpreter (@)
    cmd = procs.python_command("bench.perf.micro", "worker", "--op", op, "--runtime",
                               spec, "--min-time", repr(min_time),
                               python=envs.interpreter_for(spec))
    proc = procs.spawn(cmd)
    pin(proc.pid, cpu)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise MeasureError(f"micro worker timed out after {timeout_s:.0f} s") from None
    except BaseException:         # Ctrl-C/SIGTERM: the worker goes with us
        proc.kill()
        proc.communicate()
        raise
    lines = out.decode(errors="replace").strip().splitlines()
    try:
        res = json.loads(lines[-1])
    except (IndexError, ValueError):
        raise MeasureError(f"micro worker failed: {err.decode(errors='replace').strip()[-300:]}") from None
    if res.get("error"):
        raise MeasureError(res["error"])
    return res


def run_micro_matrix(units, repeat: int, min_time: float, pinned: bool = True,
                     progress=progress) -> list[dict]:
    """Every (op, runtime) unit ``repeat`` times, interleaved across runtimes in rounds
    whose order rotates, each in a fresh worker process pinned to one CPU."""
    cpu, _ = cpu_plan(pinned)
    units = [(op, rt) for op, rt in units if micro_supported(op, rt)]
    # Every interpreter found and environment built before the first measurement.
    envs.prepare(list({rt.spec: rt for _, rt in units}.values()))
    ops = list(dict.fromkeys(op for op, _ in units))
    store = {(op, rt.spec): {"ops_per_s": [], "n": [], "rounds": [], "errors": [], "python": None}
             for op, rt in units}
    total, done = len(units) * repeat, 0

    def measure_all():
        nonlocal done
        for r in range(repeat):
            for op in ops:
                rts_op = [rt for o, rt in units if o == op]
                k = r % len(rts_op)
                for rt in rts_op[k:] + rts_op[:k]:
                    check_stop()
                    done += 1
                    entry = store[(op, rt.spec)]
                    label = f"[{done}/{total}] round {r + 1}/{repeat} {op} {rt.spec}"
                    try:
                        res = _micro_in_worker(op, rt, min_time, cpu)
                    except MeasureError as exc:
                        entry["errors"].append(f"round {r + 1}: {exc}")
                        progress(f"{label}: FAILED: {exc}")
                        continue
                    entry["ops_per_s"].append(res["ops_per_s"])
                    entry["n"].append(res["n"])
                    entry["rounds"].append(r)
                    entry["python"] = res.get("python")
                    progress(f"{label}: {fmt_rate(res['ops_per_s'], ' ops/s')} (n={res['n']})")

    interrupted = run_interruptibly(measure_all)
    cells = []
    for op, rt in units:
        e = store[(op, rt.spec)]
        cell = results.new_cell("micro", rt.spec, op, {},
                                samples={"ops_per_s": e["ops_per_s"]} if e["ops_per_s"] else {},
                                errors=e["errors"],
                                details={"n": e["n"], "rounds": e["rounds"], "min_time_s": min_time,
                                         "runtime_benchmarked": bench_runtime(rt).spec,
                                         "python": e["python"]})
        cell["repeats"] = len(e["rounds"])
        cells.append(cell)
    if interrupted:
        raise Interrupted([c for c in cells if c["repeats"] or c["errors"]])
    return cells


def micro_table(cells: list[dict], markdown: bool = False) -> str:
    ops = list(dict.fromkeys(c["variant"] for c in cells))
    specs = list(dict.fromkeys(c["runtime"] for c in cells))
    by = {(c["variant"], c["runtime"]): c for c in cells}
    rows = []
    for spec in specs:
        row = [spec]
        for op in ops:
            c = by.get((op, spec))
            if c is None:
                row.append("n/a")
                continue
            v = c["metrics"].get("ops_per_s")
            iqr = c.get("spread", {}).get("ops_per_s", {}).get("iqr")
            row.append("failed" if v is None else
                       fmt_rate(v, "") + (f" ±{fmt_rate(iqr / 2, '')}" if iqr else ""))
        rows.append(row)
    title = "micro-benchmarks, operations per second (median over repeats; ± is half the IQR)"
    return ("### " if markdown else "") + title + "\n\n" + format_table(["runtime"] + ops, rows,
                                                                        markdown)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "worker":
        return _worker_main(argv[1:])
    print("usage: python -m bench.perf.micro worker --op OP --runtime SPEC [--min-time S] [--n N] "
          "(the worker process of `looplab bench micro`)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
