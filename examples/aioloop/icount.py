"""Instructions per echo request on asyncio loops: CPython's, looplab's (with
options), uvloop's and rloop's, for a streams echo and a Protocol echo.

``bench.perf.icount`` measures a runtime's ``looplab serve echo``; this measures an
asyncio echo on any loop factory the same way (the same blocking client,
``bench.perf.icount._client``, and the same difference of two instrumented runs)::

    python examples/aioloop/icount.py streams,asyncio streams,looplab \\
        streams,looplab,write=defer protocol,uvloop protocol,rloop

Each argument is ``KIND,LOOP[,OPTION=VALUE...]``: KIND is ``streams`` or
``protocol``; LOOP is ``asyncio``, ``looplab`` (``kernels.callback.new_event_loop``
with the options), ``uvloop`` or ``rloop``. Needs valgrind on PATH; run from the
repository root with it on PYTHONPATH. ``--serve KIND LOOP [OPTIONS]`` is the
server it runs under callgrind (prints ``listening on HOST:PORT``, stops on SIGINT).
"""
from __future__ import annotations

import asyncio
import functools
import importlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time


def _factory(loop, options):
    if loop == "asyncio":
        return asyncio.new_event_loop
    if loop in ("uvloop", "rloop"):
        return importlib.import_module(loop).new_event_loop
    if loop == "looplab":
        import kernels.callback as cb
        return functools.partial(cb.new_event_loop, **options)
    raise SystemExit(f"unknown loop {loop!r}: asyncio, looplab, uvloop or rloop")


async def _stream_echo(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    writer.close()


class _Echo(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.transport.write(data)


def serve(kind, loop, options) -> None:
    # a process started in the background may inherit SIGINT ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)

    async def main():
        if kind == "streams":
            server = await asyncio.start_server(_stream_echo, "127.0.0.1", 0)
        else:
            server = await asyncio.get_running_loop().create_server(_Echo, "127.0.0.1", 0)
        print("listening on 127.0.0.1:%d" % server.sockets[0].getsockname()[1], flush=True)
        await asyncio.Event().wait()
    try:
        with asyncio.Runner(loop_factory=_factory(loop, options)) as runner:
            runner.run(main())
    except KeyboardInterrupt:
        pass


def instructions(args, requests, out_dir, conns=10, size=1024) -> int:
    from bench.perf import icount
    out = os.path.join(out_dir, "cg.%s.%d.out" % ("_".join(args).replace("=", "-"), requests))
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
           f"--callgrind-out-file={out}", sys.executable, os.path.abspath(__file__),
           "--serve", *args]
    proc = subprocess.Popen(cmd, env=dict(os.environ, PYTHONHASHSEED="0"),
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        m = re.match(r"listening on ([\d.]+):(\d+)", proc.stdout.readline())
        if not m:
            raise RuntimeError(f"the server for {args} did not start")
        icount._client(m.group(1), int(m.group(2)), conns, size, requests, proc.pid, 0.0)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        proc.wait(300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with open(out) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise RuntimeError(f"no totals in {out}")


def main(argv) -> int:
    if argv[:1] == ["--serve"]:
        kind, loop, *rest = argv[1:]
        serve(kind, loop, dict(item.split("=", 1) for item in rest))
        return 0
    out_dir = tempfile.mkdtemp(prefix="icount-aioloop-")
    small, large = 2000, 10000
    for spec in argv:
        args = spec.split(",")
        a, b = instructions(args, small, out_dir), instructions(args, large, out_dir)
        print(f"{spec:36s} instr/request={(b - a) / (large - small):8.0f}  "
              f"({a} @ {small}, {b} @ {large})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
