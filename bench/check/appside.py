"""The app's process on real sockets: ``python -m bench.check.appside SPEC_JSON``.

``looplab check`` runs an in-process app (aiohttp, ASGI, an asyncio server factory)
here, in a process of its own, so that the resident memory ``/proc`` reports is the
app's and a crash takes only this process down. The spec names the app, the loop,
the knobs, the port and the shutdown grace (``bench.check.drive.AppChild`` writes it).

It speaks JSON lines on the stdout it was started with; the app's own prints go to
stderr (fd 1 is pointed there first). Events:

- ``{"event": "listening", "addr", "kind", "loop"}`` once it serves;
- ``{"event": "error", "error"}`` when the app cannot start (then exit 2);
- ``{"event": "sample", "t", "transports_count", "buffered_bytes", ...}`` every 50 ms:
  the transports' write buffers (``bench.check.host.Sampler``);
- ``{"event": "scan", ...}`` in answer to a ``scan`` line on stdin: the queues;
- ``{"event": "stopping", "t"}`` when SIGTERM arrived, ``{"event": "stopped",
  "stopped_s", "note"}`` when the framework's shutdown returned (then the loop ends
  as ``asyncio.run`` ends it, and the process exits 0).

EOF on stdin (the parent is gone) stops the app the same way.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
import time
import traceback

from bench.check import host as hostmod
from bench.check import target as tg


class _Out:
    def __init__(self, fd: int):
        self.fd = fd
        self.lock = threading.Lock()

    def __call__(self, event: dict) -> None:
        data = (json.dumps(event) + "\n").encode()
        with self.lock:
            try:
                while data:
                    data = data[os.write(self.fd, data):]
            except OSError:
                os._exit(1)             # nobody reads us any more


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(argv[0])
    emit = _Out(os.dup(1))
    os.dup2(2, 1)                      # the app's prints must not corrupt our events
    app = tg.AppRef(spec["app"]["ref"], spec["app"]["asgi"])
    choice = tg.LoopChoice.from_data(spec["loop"])
    try:
        loop = hostmod.make_loop(choice)
    except Exception as exc:       # noqa: BLE001 -- one line for the parent
        emit({"event": "error", "error": f"loop {choice.label}: {exc}"})
        return 2
    asyncio.set_event_loop(loop)
    hosted = hostmod.Hosted(app, spec["knobs"], spec["grace_s"], port=spec["port"],
                            sockbuf=spec["sockbuf"])
    try:
        loop.run_until_complete(hosted.start())
    except BaseException as exc:   # noqa: BLE001 -- the app's own failure, reported
        why = f"{type(exc).__name__}: {exc}".strip().rstrip(":")
        if isinstance(exc, OSError) and exc.errno == 98:
            why = f"port {spec['port']} is in use"
        emit({"event": "error", "error": why,
              "traceback": traceback.format_exc(limit=8)})
        try:
            hostmod.finish_loop(loop)
        except BaseException:      # noqa: BLE001
            pass
        return 2
    sampler = hostmod.Sampler(loop)
    stop = loop.create_future()

    def request_stop(why):
        if not stop.done():
            emit({"event": "stopping", "t": time.monotonic(), "why": why})
            stop.set_result(why)
    try:
        loop.add_signal_handler(signal.SIGTERM, request_stop, "SIGTERM")
    except (NotImplementedError, RuntimeError, AttributeError):
        signal.signal(signal.SIGTERM,
                      lambda *_: loop.call_soon_threadsafe(request_stop, "SIGTERM"))

    def scan():
        emit({"event": "scan", "t": time.monotonic(), **sampler.queues(), **sampler.buffered()})

    def commands():
        for line in sys.stdin:
            if line.strip() == "scan":
                loop.call_soon_threadsafe(scan)
        try:
            loop.call_soon_threadsafe(request_stop, "stdin closed")
        except RuntimeError:
            pass                   # the loop is closed: we are on our way out
    threading.Thread(target=commands, name="check-commands", daemon=True).start()

    async def sample_forever():
        while True:
            emit({"event": "sample", **sampler.sample()})
            await asyncio.sleep(0.05)
    ticker = loop.create_task(sample_forever())
    emit({"event": "listening", "addr": list(hosted.address), "kind": hosted.kind,
          "loop": choice.label, "pid": os.getpid()})
    loop.run_until_complete(stop)
    ticker.cancel()
    t0 = time.monotonic()
    try:
        note = loop.run_until_complete(hosted.stop())
    except BaseException as exc:   # noqa: BLE001
        note = f"the shutdown raised {type(exc).__name__}: {exc}"
    emit({"event": "stopped", "stopped_s": time.monotonic() - t0, "note": note})
    hostmod.finish_loop(loop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
