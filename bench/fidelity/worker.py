"""The probe worker: runs the probes of one runtime's style in this process, one JSON
line per probe, each under a time limit and in a fresh copy of the context.

Which side runs the probes is the runtime's own declaration: ``RuntimeInfo.probe_side``
names its adapter, else a stream-style runtime is reached through its port
(``PortStreamSide``). Nothing here looks at a runtime id.

``python -m bench.fidelity.worker RUNTIME[:OPTIONS] [NAME,...]`` runs one runtime's
probes (the fidelity verb starts one such process per runtime; runtime modules named
in ``LOOPLAB_RUNTIME_MODULES`` are loaded first, as in every cell process).
"""
from __future__ import annotations

import contextvars
import gc
import json
import re
import signal
import sys
import time

from bench.fidelity import callback, coro, streams, tasks  # noqa: F401  (their probes, in this order)
# the loop-conformance probes come last, by theme
from bench.fidelity import (loops, loopstate, looptransport, loophandler, loopsock,  # noqa: F401,I001
                            loopsignal, loopcontext, loopdgram, loopproc, looptls)
from bench.fidelity.registry import PROBES
from bench.fidelity.streams import PortStreamSide
from bench import runtimes as rtmod

PROBE_TIMEOUT_S = 5.0

#: port style -> the side that reaches a runtime of that style through its port, for
#: a runtime that declares no adapter; the probes of the other styles need one
PORT_SIDES = {PortStreamSide.style: PortStreamSide}


class _ProbeTimeout(BaseException):
    pass


def _alarm(signum, frame):
    raise _ProbeTimeout()


def _jsonable(value):
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def failure(exc) -> str:
    """An exception as one line: its type and message, addresses and ports masked (the
    message says why: ``'RLoop' object has no attribute '_is_main_thread'``)."""
    text = re.sub(r"0x[0-9a-f]+|(?<=', )\d+(?=\))|(?<=fd=)\d+", "N", str(exc)).splitlines()
    return f"{type(exc).__name__}: {text[0][:160]}" if text and text[0] else type(exc).__name__


def side_class(info):
    """The side class that runs the probes on a runtime, or None: how the probes
    reach it is declared on its RuntimeInfo."""
    if info.probe_side:
        return rtmod.load_object(info.probe_side)
    return PORT_SIDES.get(info.style)


def no_side_reason(info) -> str:
    return (f"{info.id} declares no probe adapter (RuntimeInfo.probe_side), and a "
            f"{info.style}-style port does not run the probes as is")


def _make_side(cls, rt, options):
    if issubclass(cls, PortStreamSide):
        return cls(options, runtime=rt)
    return cls(options)


def parse_runtime(spec: str):
    """``RUNTIME[:OPTIONS]`` -> (Runtime, options changed from their defaults)."""
    rt = rtmod.parse(spec)
    defaults = rt.info.options.defaults()
    opts = {k: v for k, v in rt.options.items() if defaults.get(k) != v}
    # the loop factory's keywords travel with the options a side is made with
    opts.update({f"loop.{k}": v for k, v in rt.loop_options.items()})
    return rt, opts


def meta(rt) -> dict:
    """What this worker runs with: the exact Python and the loop with its version."""
    import platform

    from protocols.asyncio_ports import loop_identity
    out = {"python": platform.python_version(), "implementation": platform.python_implementation()}
    loop = rt.loop
    if loop:
        out["loop"] = loop_identity(loop)
    return out


def run_probes(rt, names=None, out=sys.stdout, options=None):
    """Run the probes of ``rt``'s style (or only ``names``), one JSON line each:
    ``{"probe", "obs"}``, ``{"probe", "skip"}``, or ``{"probe", "error"}`` when the
    probe itself failed. ``options``: the runtime options a side is made with (the
    option-flip checks use them)."""
    if isinstance(rt, str):
        rt, parsed = parse_runtime(rt)
        options = parsed if options is None else options
    options = options or {}
    cls = side_class(rt.info)
    try:
        out.write(json.dumps({"meta": meta(rt)}, sort_keys=True) + "\n")
    except Exception:     # a loop whose identity cannot be read still runs its probes
        pass
    signal.signal(signal.SIGALRM, _alarm)
    for p in PROBES.values():
        if p.style != rt.style or (names and p.name not in names):
            continue
        if cls is None:
            rec = {"probe": p.name, "skip": no_side_reason(rt.info)}
        elif cls.__name__ in p.skip:
            rec = {"probe": p.name, "skip": "API does not map"}
        else:
            signal.setitimer(signal.ITIMER_REAL, PROBE_TIMEOUT_S)
            began = time.monotonic()
            try:
                # each probe in a fresh copy of the context: contextvar probes
                # must not see each other's values
                obs = contextvars.copy_context().run(
                    lambda: _make_side(cls, rt, options).run(p.fn))
                rec = {"probe": p.name, "obs": _jsonable(obs)}
            except _ProbeTimeout:
                rec = {"probe": p.name, "error": f"timed out after {PROBE_TIMEOUT_S:g} s"}
            except BaseException as exc:
                if isinstance(exc, KeyboardInterrupt):
                    raise
                rec = {"probe": p.name, "error": f"probe failed: {failure(exc)}"}
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            # how long it took: not part of the observation, a hint for slow probes
            rec["s"] = round(time.monotonic() - began, 3)
        out.write(json.dumps(rec, sort_keys=True) + "\n")
        out.flush()
        gc.collect()


def main(argv) -> int:
    try:
        if len(argv) < 1:
            raise rtmod.UsageError("a runtime is needed")
        rt, opts = parse_runtime(argv[0])
    except rtmod.UsageError as exc:
        print(f"usage: python -m bench.fidelity.worker RUNTIME[:OPTIONS] [NAME,...]; RUNTIME is "
              f"one of {', '.join(rtmod.ordered())} ({exc})", file=sys.stderr)
        return 2
    wanted = set(argv[1].split(",")) if len(argv) > 1 and argv[1] else None
    run_probes(rt, wanted, options=opts)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
