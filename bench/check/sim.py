"""``looplab check`` on the simulated network: the app, its peers and the wires in one world.

An in-process app runs on asyncio's selector loop over the world, or on looplab's loop
on the world's seam (``bench.check.host.make_loop``); the ``check_client`` roles are
in-world peers (``bench.peers.sim``), the very cores the peer process runs on real
sockets. Time is virtual: a phase of three seconds costs what its events cost, and one
seed gives one run -- the same bytes, the same verdicts -- so a failing order can be
run again (``--net sim --seed N``).

``SimRig`` drives the world by running the app's loop: between phases the loop is not
running and the world stands still. The server's memory here is the Python heap as
``tracemalloc`` counts it (the world and the peers share the process; their buffers
are bounded by the simulated sockets), beside the transports' write buffers and the
queues. The end of the server's process after its shutdown is ``finish_loop`` (what
``asyncio.run`` does) and then ``World.exit_process("app")``, which closes whatever
the app still held as the OS would.
"""
from __future__ import annotations

import asyncio
import gc

from bench.check import host as hostmod
from bench.check import target as tg
from bench.check.drive import StartFailed
from bench.peers import check_role
from bench.peers.sim import make_role
from bench.scenarios.simulated import WATCHDOG_S, SimCell, new_world

__all__ = ["SimRig"]


class SimRig:
    """The questions' operations in a simulated world (see bench.check.drive.RealRig)."""
    net = "sim"

    def __init__(self, app: tg.AppRef, loop: tg.LoopChoice, knobs: dict, grace_s: float,
                 seed: int = 0, sockbuf: int | None = 65536):
        self.seed = seed
        self.world = new_world(seed)
        self.world.watchdog(WATCHDOG_S)
        self.cell = SimCell(self.world)
        self.io = self.world.io("app")
        self.loop = hostmod.make_loop(loop, io=self.io)
        self.sampler = hostmod.Sampler(self.loop, heap=True)
        self.hosted = hostmod.Hosted(app, knobs, grace_s, io=self.io, sockbuf=sockbuf)
        self.samples: list[dict] = []
        self._closed = False
        self._n = 0
        try:
            self.loop.run_until_complete(self.hosted.start())
        except BaseException as exc:
            self.close()
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise StartFailed(f"the app did not start: {type(exc).__name__}: {exc}") from None
        self.address = self.hosted.address
        self.kind = self.hosted.kind
        self._ticker = self.loop.create_task(self._sample_forever())

    async def _sample_forever(self):
        while True:
            self.samples.append(self.sampler.sample())
            await asyncio.sleep(0.05)

    def now(self) -> float:
        return self.world.now

    def dead(self) -> str | None:
        return None

    def memory(self, t0: float, t1: float) -> list[tuple]:
        return [(s["t"], s["heap_bytes"]) for s in self.samples if t0 <= s["t"] <= t1]

    def buffered(self, t0: float, t1: float) -> list[dict]:
        return [s for s in self.samples if t0 <= s["t"] <= t1]

    def mark(self) -> dict:
        gc.collect()
        return {"t": self.world.now, "memory_bytes": self.sampler.heap_bytes(),
                "memory_kind": "heap", **self.sampler.queues(), **self.sampler.buffered()}

    def _place(self, spec: dict, bound_s: float):
        self._n += 1
        cfg = dict(spec, name=f"{spec['name']}#{self._n}", deferred=True)
        cfg.pop("connect", None)
        role = make_role(self.cell, check_role(cfg, bound_s))
        role.connect(tuple(self.address))
        return spec["name"], role

    def run_clients(self, specs: list[dict], bound_s: float, mark_after_s=None) -> dict:
        placed = [self._place(s, bound_s) for s in specs]
        marks = []
        if mark_after_s is not None:
            self.loop.call_later(mark_after_s, lambda: marks.append(self.mark()))

        async def until_all_ended():
            deadline = self.loop.time() + bound_s + 5
            while any(r.ended is None for _, r in placed) and self.loop.time() < deadline:
                await asyncio.sleep(0.02)
        self.loop.run_until_complete(until_all_ended())
        out = {name: role.result() for name, role in placed}
        if marks:
            out["mark"] = marks[0]
        return out

    def shutdown_run(self, spec: dict, stop_after_s: float, grace_s: float) -> tuple[dict, dict]:
        name, role = self._place(spec, stop_after_s + grace_s + 60)
        stop = {"sent_at": None, "exited": None, "exit_code": None, "stop_s": None}

        async def stop_it():
            await asyncio.sleep(stop_after_s)
            stop["sent_at"] = self.loop.time()
            task = asyncio.ensure_future(self.hosted.stop())
            done, _ = await asyncio.wait({task}, timeout=grace_s)
            stop["stop_s"] = self.loop.time() - stop["sent_at"]
            stop["exited"] = task in done
            if task in done:
                stop["exit_code"] = 0
                stop["note"] = task.result() if not task.exception() else \
                    f"the shutdown raised {task.exception()!r}"
            else:
                self.hosted.force()
        self._ticker.cancel()
        self.loop.run_until_complete(stop_it())
        self._end_process()
        self.cell.run_until_peers_end(self.world.now + stop_after_s + grace_s + 60)
        return role.result(), stop

    def _end_process(self) -> None:
        if not self.loop.is_closed():
            try:
                hostmod.finish_loop(self.loop)
            finally:
                self.world.exit_process("app")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._end_process()
        finally:
            self.hosted.release()
            self.sampler.close()
