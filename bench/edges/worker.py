"""The probe worker: runs the probes of one runtime's style in this process, one JSON
line per probe, each under a time limit and in a fresh copy of the context.

``SIDES`` is the one place a runtime id is looked at: it picks the side class that
runs the probes there, and a side's class knows everything that differs between
libraries of one style.
"""
from __future__ import annotations

import contextvars
import gc
import importlib
import json
import logging
import signal
import sys

from bench.edges.callback import AsyncioCallbackSide, OurCallbackSide, UvloopCallbackSide
from bench.edges.coro import CoroSide, CurioSide, TrioSide
from bench.edges.registry import PROBES
from bench.edges.streams import AsyncioStreamSide, HybridSide, UvloopStreamSide
from bench.edges import tasks  # noqa: F401  (registers the stream-style task probes)

PROBE_TIMEOUT_S = 5.0

#: runtime id -> the side class that runs its probes
SIDES = {
    "callback": OurCallbackSide, "asyncio-protocol": AsyncioCallbackSide,
    "uvloop-protocol": UvloopCallbackSide,
    "hybrid": HybridSide, "asyncio-streams": AsyncioStreamSide, "uvloop-streams": UvloopStreamSide,
    "coro": CoroSide, "curio": CurioSide, "trio": TrioSide,
}

#: runtime id -> probe style
STYLE_OF = {rid: side.style for rid, side in SIDES.items()}


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


def _run_one(rid, p, options):
    return SIDES[rid](options).run(p.fn)


def parse_runtime(spec: str) -> tuple[str, dict]:
    """``RUNTIME[:OPTIONS]`` -> (runtime, options). Options apply to our kernels
    (``coro:cancel_base=exception``), checked by the kernel's schema, and to asyncio's
    two runtimes as their loop (``asyncio-streams:loop=looplab,loop.write=defer``):
    then the options are ``{"loop": NAME, "loop_options": {...}}``."""
    rid, _, text = spec.partition(":")
    if rid not in SIDES:
        raise ValueError(f"unknown runtime {rid!r}; choose from {', '.join(SIDES)}")
    if not text:
        return rid, {}
    if getattr(SIDES[rid], "takes_loop", False):
        from protocols import runtimes
        try:
            rt = runtimes.parse(spec)
        except runtimes.UsageError as exc:
            raise ValueError(str(exc)) from None
        changed = rt.info.options.changed(rt.options)
        if rt.id != rid or [c for c in changed if not c.startswith("loop=")]:
            raise ValueError(f"{rid} takes only loop=NAME and loop.NAME=VALUE here, not {text!r}")
        return rid, {"loop": rt.options["loop"], "loop_options": dict(rt.loop_options)}
    kernel = SIDES[rid].kernel
    if kernel is None:
        raise ValueError(f"{rid} takes no options here; only our kernels and asyncio's loop do")
    schema = importlib.import_module(kernel).OPTIONS
    return rid, schema.parse(text)


def run_probes(rid, names=None, out=sys.stdout, options=None):
    """Run the probes of ``rid``'s style (or only ``names``), one JSON line each:
    ``{"probe", "obs"}``, or ``{"probe", "error"}`` when the probe itself failed.
    ``options``: kernel options for our kernels (the option-flip checks use them)."""
    style = STYLE_OF[rid]
    options = options or {}
    signal.signal(signal.SIGALRM, _alarm)
    # curio logs crashes and our kernel prints them; TaskSide counts both, and neither
    # reaches this process's stderr.
    logging.getLogger("curio").propagate = False
    for p in PROBES.values():
        if p.style != style or (names and p.name not in names):
            continue
        if rid in p.skip:
            rec = {"probe": p.name, "skip": "API does not map"}
        else:
            signal.setitimer(signal.ITIMER_REAL, PROBE_TIMEOUT_S)
            try:
                # each probe in a fresh copy of the context: contextvar probes
                # must not see each other's values
                obs = contextvars.copy_context().run(_run_one, rid, p, options)
                rec = {"probe": p.name, "obs": _jsonable(obs)}
            except _ProbeTimeout:
                rec = {"probe": p.name, "error": f"timed out after {PROBE_TIMEOUT_S:g} s"}
            except BaseException as exc:
                if isinstance(exc, KeyboardInterrupt):
                    raise
                rec = {"probe": p.name, "error": f"probe failed: {type(exc).__name__}"}
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        out.write(json.dumps(rec, sort_keys=True) + "\n")
        out.flush()
        gc.collect()
