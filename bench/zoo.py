"""The bug zoo: famous backpressure and shutdown bugs, one small reproduction each.

Every entry is an ordinary scenario (``bench.scenario.Scenario``) registered through
the public API -- its programs run on the runtime under test in a cell process, its
peers (``bench.peers``) count what really crossed the wire -- plus what a user who
searched for the bug by name wants to know: the thread, the mechanism in two
sentences, the versions it was reported against and fixed in, what to expect where,
and which of our kernels' design options turns it on or off.

Each entry has two variants: ``naive`` is the program as the report wrote it,
``fixed`` the program with the fix the thread settled on. Its one verdict,
``bug_shown``, is computed from measurements (bytes lost, buffer peak against its
bound, requests answered, seconds to EOF, whether a parked task was released...),
never from the runtime's name. So the same entry says "shown" on a library that
still has the bug and "not shown" on one that fixed it, and a version that is not
installed here is represented by one of our kernels with the option that
reproduces it (``flips``); where no such option exists yet the entry says which
option it needs (``needs``).

``looplab repro`` (``bench.verbs.repro``) runs entries and writes the zoo table.
"""
from __future__ import annotations

import dataclasses
import gc
import importlib.metadata
import platform
import time
from dataclasses import dataclass, field

from bench import peers, programs
from bench.scenario import APP, Metric, Scenario, register, run_program, serve_app

__all__ = ["Entry", "Flip", "ENTRIES", "entry", "installed_versions", "affected_note"]

KiB, MiB = 1024, 1024 * 1024
SOCKBUF = 64 * KiB
_CAP = 4096          # bound on every synchronous fill loop (a dead transport never fills)
VERDICT = {"bug_shown": "the measurements show the bug's symptom (see the entry's oracle)"}


# ---------------------------------------------------------------------------
# What an entry carries besides its scenario

@dataclass(frozen=True)
class Flip:
    """A design option of one of our kernels that turns the mechanism on or off.
    ``shows``: whether the bug is expected to show on the naive program with it."""
    spec: str
    shows: bool
    meaning: str


@dataclass
class Entry:
    id: str
    title: str
    link: str
    mechanism: str                 # two sentences
    reported: str                  # versions it was reported against
    fixed_in: str                  # versions that fixed it (or "not a library bug: ...")
    expected: str                  # what to expect where
    oracle: str                    # what "bug shown" means, in measurements
    styles: tuple
    scenario: Scenario = None
    aliases: tuple = ()
    catalog: str = ""              # the scenario it relates to (S1..S8), if any
    flips: tuple = ()
    needs: str = ""                # an option our kernels lack to show an uninstalled version
    framing: str = ""              # how the original (HTTP, TLS, ...) was reduced
    affects: dict = field(default_factory=dict)   # library -> (first affected, first fixed|None)
    show_on: tuple = ()            # runtimes where the tests expect naive=shown, fixed=not

    def names(self) -> tuple:
        return (self.id,) + tuple(self.aliases)


ENTRIES: dict[str, Entry] = {}
_ALIASES: dict[str, str] = {}


def _add(e: Entry, run, metrics, presets, programs_=None) -> Entry:
    e.scenario = register(Scenario(
        id=e.id, title=e.title, run=run, summary=e.mechanism, variants=("naive", "fixed"),
        presets=presets, programs=programs_ or {}, styles=e.styles, verdicts=VERDICT,
        metrics=tuple(metrics)))
    e.scenario.origin = "bench.zoo"
    ENTRIES[e.id] = e
    for name in e.names():
        _ALIASES[name.lower()] = e.id
    return e


def entry(name: str) -> Entry | None:
    """The entry called ``name`` (its id or an alias, any case), or None."""
    return ENTRIES.get(_ALIASES.get(name.strip().lower(), ""))


# ---------------------------------------------------------------------------
# Versions: what is installed, and whether it falls in an entry's affected range

_DISTS = {"python": None, "uvloop": "uvloop", "trio": "trio", "curio": "curio"}
LIB_OF = {"asyncio-protocol": "python", "asyncio-streams": "python", "uvloop-protocol": "uvloop",
          "uvloop-streams": "uvloop", "trio": "trio", "curio": "curio"}


def installed_versions() -> dict:
    out = {"python": platform.python_version()}
    for lib, dist in _DISTS.items():
        if dist:
            try:
                out[lib] = importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                out[lib] = None
    return out


def _vt(text: str) -> tuple:
    return tuple(int(p) for p in text.split(".") if p.isdigit())


def affected_note(e: Entry, versions: dict | None = None) -> list[str]:
    """One line per library the entry names: installed version, range, verdict."""
    versions = versions or installed_versions()
    out = []
    for lib, (first, fixed) in e.affects.items():
        have = versions.get(lib)
        rng = f"{first} up to {'before ' + fixed if fixed else 'today (not fixed)'}"
        if have is None:
            out.append(f"{lib}: not installed (affected: {rng})")
            continue
        inside = _vt(have) >= _vt(first) and (fixed is None or _vt(have) < _vt(fixed))
        out.append(f"{lib} {have} installed: {'inside' if inside else 'outside'} the affected "
                   f"range ({rng})")
    return out


# ---------------------------------------------------------------------------
# Program plumbing, one helper per port style

def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class _P:
    """A callback-port protocol with hooks: remembers pause state and loss."""

    def __init__(self):
        self.transport = None
        self.paused = False
        self.lost = False
        self.lost_at = None
        self.eof = False
        self.received = 0
        self.on_resume = None
        self.on_lost = None
        self.on_eof = None
        self.on_data = None
        self.pauses = 0

    def connection_made(self, t):
        self.transport = t

    def data_received(self, data):
        self.received += len(data)
        if self.on_data:
            self.on_data(data)

    def eof_received(self):
        self.eof = True
        if self.on_eof:
            self.on_eof()
        return True

    def connection_lost(self, exc):
        self.lost, self.lost_at = True, time.monotonic()
        hook, self.on_lost = self.on_lost, None
        if hook:
            hook()

    def pause_writing(self):
        self.paused = True
        self.pauses += 1

    def resume_writing(self):
        self.paused = False
        hook, self.on_resume = self.on_resume, None
        if hook:
            hook()


def _callback(job, addr, start, max_s):
    """Connect a ``_P`` to ``addr`` and call ``start(port, transport, proto, out)``
    in the loop; runs until ``port.stop()`` or ``max_s`` (then ``out["error"]``)."""
    port = job.runtime.open()
    out: dict = {}
    try:
        def setup(port):
            def bound():
                out["error"] = f"did not finish within {max_s} s"
                port.stop()
            port.call_later(max_s, bound)

            def done(t, p, exc):
                if exc is not None:
                    out["error"] = f"connect failed: {exc!r}"
                    port.stop()
                    return
                start(port, t, p, out)
            port.connect(_P, addr[0], addr[1], done, sockbuf=SOCKBUF)
        port.run(setup)
    finally:
        out["probe_peak_bytes"] = port.probe().get("peak_user_buffer_bytes")
        port.close()
    return out


def _stream(job, main, max_s):
    """Run ``main(port, out)`` on a stream port, bounded by ``max_s``."""
    port = job.runtime.open()
    out: dict = {}

    async def outer(port):
        try:
            async with port.timeout(max_s):
                await main(port, out)
        except TimeoutError:
            out.setdefault("error", f"did not finish within {max_s} s")
    try:
        port.run(outer)
    finally:
        out["probe_peak_bytes"] = port.probe().get("peak_user_buffer_bytes")
        port.close()
    return out


def _task(job, main, max_s):
    port = job.runtime.open()
    out: dict = {}

    async def outer(port):
        async with port.move_on_after(max_s) as scope:
            await main(port, out)
        if scope.cancelled_caught:
            out.setdefault("error", f"did not finish within {max_s} s")
    try:
        port.run(outer)
    finally:
        port.close()
    return out


async def _open(port, addr, sockbuf=SOCKBUF):
    return await port.open_connection(addr[0], addr[1], sockbuf=sockbuf)


async def _open_task(port, addr):
    return await port.open_tcp_stream(addr[0], addr[1], sockbuf=SOCKBUF)


def _by_style(cb=None, st=None, tk=None) -> dict:
    return {k: v for k, v in (("callback", cb), ("stream", st), ("task", tk)) if v}


def _notes(app: dict) -> list:
    return [f"program: {app['error']}"] if app.get("error") else []


def _presets(tiny: dict, quick: dict | None = None) -> dict:
    return {"tiny": dict(tiny), "quick": dict(quick or tiny)}


# ===========================================================================
# The entries
# ===========================================================================

# ---------------------------------------------------------------------------
# Twisted 8868: pipelined requests answered into an unbounded buffer (S5)

def _run_pipelining(ctx):
    p = ctx.params
    served = serve_app(ctx, "reqresp", timeout_s=p["hold_s"] + 15,
                       params={"response_bytes": p["response_bytes"], "sockbuf": SOCKBUF},
                       peers=[peers.pipeline_client(connect=APP, count=p["count"], hold_s=p["hold_s"],
                                                    sockbuf=SOCKBUF, max_s=p["hold_s"] + 5)])
    handled = served.app["counters"].get("requests_handled_count", 0)
    m = {"requests_handled_count": handled, "rss_growth_bytes": served.app.get("rss_growth_bytes"),
         "peak_user_buffer_bytes": served.app["probe"].get("peak_user_buffer_bytes")}
    return m, {"bug_shown": handled >= p["count"] // 2}, []


_add(Entry(
    id="twisted-8868", aliases=("twisted-4891", "C1"), catalog="S5",
    title="pipelined requests answered into an unbounded write buffer",
    link="https://github.com/twisted/twisted/issues/8868",
    mechanism="A client pipelines many small requests for large responses and never reads. "
              "A server that answers each request with a non-blocking write builds every "
              "response in its user-space buffer instead of stopping when the socket is full.",
    reported="Twisted (all versions: a property of transport.write)",
    fixed_in="not a library fix: the server must stop reading while its transport is paused",
    expected="shown on every callback and stream runtime with the naive server; never on "
             "the task port (send_all blocks, so naive and fixed are the same code)",
    oracle="bug shown when at least half of the pipelined requests were answered",
    styles=("callback", "stream", "task"),
    show_on=("callback", "hybrid", "asyncio-protocol")),
    _run_pipelining,
    [Metric("requests_handled_count", "lower", "requests answered"),
     Metric("rss_growth_bytes", None, "RSS growth"),
     Metric("peak_user_buffer_bytes", "lower", "user buffer peak")],
    _presets({"count": 100, "response_bytes": 64 * KiB, "hold_s": 0.8},
             {"count": 300, "response_bytes": 64 * KiB, "hold_s": 1.0}))


# ---------------------------------------------------------------------------
# aiohttp 1367 / websockets 10: push without drain to a client that never reads

def _run_push(ctx):
    p = ctx.params
    app_variant = "unbounded" if ctx.variant == "naive" else "drop"
    served = serve_app(
        dataclasses.replace(ctx, variant=app_variant), "push", timeout_s=p["duration_s"] + 15,
        params={"message_bytes": p["message_bytes"], "interval_s": p["interval_s"],
                "sockbuf": SOCKBUF, "queue_limit": 16},
        peers=[peers.push_client(name, connect=APP, mode=name, duration_s=p["duration_s"],
                                 sockbuf=SOCKBUF, max_s=p["duration_s"] + 5)
               for name in ("healthy", "stalled")])
    c = served.app["counters"]
    backlog = max(served.app["probe"].get("peak_user_buffer_bytes") or 0,
                  c.get("app_queue_peak_bytes", 0))
    m = {"backlog_peak_bytes": backlog, "rss_growth_bytes": served.app.get("rss_growth_bytes"),
         "dropped_count": c.get("dropped_count", 0)}
    bound = 4 * 16 * p["message_bytes"]      # 4 x what the bounded policy may queue
    return m, {"bug_shown": backlog > bound}, [f"served with the push app's {app_variant!r} policy"]


_add(Entry(
    id="aiohttp-1367", aliases=("websockets-10", "C4"), catalog="S6",
    title="push to a subscriber that never reads: the backlog grows without bound",
    link="https://github.com/aio-libs/aiohttp/issues/1367",
    mechanism="A server pushes messages to every subscriber with a write that never blocks. "
              "One subscriber stops reading, and everything meant for it piles up in the "
              "server's memory.",
    reported="aiohttp 1.x websockets; websockets 1.x (issue 10)",
    fixed_in="an application policy: a bounded per-client queue that drops (or blocks, or "
             "disconnects); aiohttp and websockets later made send() drain",
    expected="shown with the unbounded policy on every runtime (the task port's per-client "
             "mailbox grows instead of a transport buffer); the bounded dropping queue "
             "keeps the backlog small everywhere",
    oracle="bug shown when the stalled client's backlog (transport buffer or app queue) "
           "passes 4 x what the bounded policy may queue (16 messages)",
    styles=("callback", "stream", "task"),
    show_on=("callback", "hybrid", "asyncio-streams")),
    _run_push,
    [Metric("backlog_peak_bytes", "lower", "backlog peak"),
     Metric("rss_growth_bytes", None, "RSS growth"),
     Metric("dropped_count", None, "dropped")],
    _presets({"message_bytes": 10_000, "interval_s": 0.005, "duration_s": 1.5},
             {"message_bytes": 10_000, "interval_s": 0.005, "duration_s": 2.0}))


# ---------------------------------------------------------------------------
# asyncio 141 / bpo-32391 and asyncio 466: shutdown (S3 programs)

def _s3_program(variant_map):
    def program(job):
        p = job.params
        return programs.s3_shutdown(job.runtime.spec, job.peer("reader"), p["total_bytes"],
                                    variant_map[job.variant], sockbuf=SOCKBUF)
    return program


def _run_loss(ctx):
    p = ctx.params
    ran = run_program(ctx, max_s=10, linger_s=0.3,
                      peers=[peers.reader(sockbuf=SOCKBUF, start_after_s=p["start_after_s"], max_s=10)])
    got = ran.peers["reader"].get("received_bytes", 0)
    m = {"delivered_bytes": got, "lost_bytes": p["total_bytes"] - got}
    return m, {"bug_shown": got < p["total_bytes"]}, _notes(ran.app)


_add(Entry(
    id="cpython-32391", aliases=("bpo-32391", "asyncio-141", "C6"), catalog="S3",
    title="close() returns at once: exiting right after it loses the buffered data",
    link="https://bugs.python.org/issue32391",
    mechanism="A stream's close() only asks the transport to flush and close later. A "
              "program that writes, closes and returns from main ends the loop with the "
              "unsent bytes still in user space, and they are lost.",
    reported="asyncio 3.4-3.7 (asyncio issue 141: no way to wait for the close)",
    fixed_in="Python 3.7 added StreamWriter.wait_closed(); the program must await it",
    expected="shown on every callback and stream runtime with write; close; return; never on "
             "the task port (send_all returns when the OS has the bytes)",
    oracle="bug shown when the reader received fewer bytes than were written",
    styles=("callback", "stream", "task"), flips=(Flip("hybrid:exit=wait", False,
                                                     "exit=wait flushes what is buffered "
                                                     "before run() returns"),),
    show_on=("hybrid", "asyncio-streams", "callback")),
    _run_loss, [Metric("delivered_bytes", "higher", "delivered"), Metric("lost_bytes", "lower", "lost")],
    _presets({"total_bytes": 1 * MiB, "start_after_s": 0.3}, {"total_bytes": 4 * MiB, "start_after_s": 0.5}),
    {"*": _s3_program({"naive": "naive", "fixed": "fixed"})})


def _run_no_eof(ctx):
    p = ctx.params
    ran = run_program(ctx, max_s=10, linger_s=p["eof_within_s"] + 0.5,
                      peers=[peers.reader(sockbuf=SOCKBUF, start_after_s=0.0, max_s=10)])
    r = ran.peers["reader"]
    after = None
    if r.get("ended") == "eof" and r.get("eof_at") is not None and ran.stopped_at is not None:
        after = max(0.0, r["eof_at"] - ran.stopped_at)
    m = {"eof_after_stop_s": after, "delivered_bytes": r.get("received_bytes", 0)}
    shown = after is None or after > p["eof_within_s"]
    return m, {"bug_shown": shown}, _notes(ran.app)


_add(Entry(
    id="asyncio-466", aliases=("C7",), catalog="S3",
    title="the close completes on a later loop pass: stop the loop first and EOF never comes",
    link="https://github.com/python/asyncio/issues/466",
    mechanism="transport.close() schedules connection_lost for a later pass of the loop. A "
              "program that stops its loop right after close() (the 2016 run_forever shape) "
              "leaves the socket open while the process lives, so the peer never sees EOF.",
    reported="asyncio 3.5/3.6 (the `await asyncio.sleep(0)` idiom)",
    fixed_in="not a library fix: await writer.wait_closed() (3.7+) before stopping",
    expected="shown on asyncio and on our callback and hybrid kernels with close; "
             "loop.stop(); not on uvloop, whose close() of an empty transport completes at "
             "once (measured); never on the task port, whose aclose() completes before it "
             "returns",
    oracle="bug shown when the reader saw no EOF within eof_within_s of the loop's stop while "
           "the process was still alive",
    styles=("callback", "stream", "task"),
    show_on=("hybrid", "asyncio-streams", "callback")),
    _run_no_eof, [Metric("eof_after_stop_s", "lower", "EOF after stop"),
                  Metric("delivered_bytes", None, "delivered")],
    _presets({"total_bytes": 256 * KiB, "eof_within_s": 1.0}),
    {"*": _s3_program({"naive": "stop-2016", "fixed": "fixed"})})


# ---------------------------------------------------------------------------
# aiohttp 1368: the receive side reads ahead while the handler is busy

def _readahead_cb(job):
    p = job.params
    limit, fixed = p["limit_bytes"], job.variant == "fixed"

    def start(port, t, proto, out):
        queue = []
        state = {"queued": 0, "peak": 0, "consumed": 0, "paused": False}

        def on_data(data):
            queue.append(data)
            state["queued"] += len(data)
            state["peak"] = max(state["peak"], state["queued"])
            if fixed and state["queued"] > limit and not state["paused"]:
                state["paused"] = True
                t.pause_reading()

        def consume():
            if queue:
                data = queue.pop(0)
                state["queued"] -= len(data)
                state["consumed"] += len(data)
                if state["paused"] and state["queued"] <= limit // 2:
                    state["paused"] = False
                    t.resume_reading()
            if proto.eof and not queue:
                out.update(app_queue_peak_bytes=state["peak"], consumed_bytes=state["consumed"])
                t.close()
                port.stop()
                return
            port.call_later(p["tick_s"], consume)
        proto.on_data = on_data
        port.call_later(p["tick_s"], consume)
    return _callback(job, job.peer("source"), start, p["max_s"])


def _readahead_stream(job):
    p = job.params
    limit, fixed = p["limit_bytes"], job.variant == "fixed"

    async def main(port, out):
        reader, writer = await _open(port, job.peer("source"))
        q = port.Queue(maxsize=max(1, limit // (64 * KiB)) if fixed else 0)
        state = {"queued": 0, "peak": 0, "consumed": 0}

        async def pump():
            while data := await reader.read(64 * KiB):
                await q.put(data)
                state["queued"] += len(data)
                state["peak"] = max(state["peak"], state["queued"])
            await q.put(b"")

        task = port.create_task(pump())
        while True:
            data = await q.get()
            if not data:
                break
            state["queued"] -= len(data)
            state["consumed"] += len(data)
            await port.sleep(p["tick_s"])      # the handler is busy
        await task
        writer.close()
        await writer.wait_closed()
        out.update(app_queue_peak_bytes=state["peak"], consumed_bytes=state["consumed"])
    return _stream(job, main, p["max_s"])


def _readahead_task(job):
    p = job.params
    limit, fixed = p["limit_bytes"], job.variant == "fixed"

    async def main(port, out):
        stream = await _open_task(port, job.peer("source"))
        queue, state = [], {"queued": 0, "peak": 0, "consumed": 0, "eof": False}

        async def pump():
            while True:
                while fixed and state["queued"] > limit:
                    await port.sleep(p["tick_s"] / 4)
                data = await stream.receive_some(64 * KiB)
                if not data:
                    state["eof"] = True
                    return
                queue.append(data)
                state["queued"] += len(data)
                state["peak"] = max(state["peak"], state["queued"])

        async with port.open_nursery() as n:
            await n.spawn(pump)
            while not (state["eof"] and not queue):
                if queue:
                    data = queue.pop(0)
                    state["queued"] -= len(data)
                    state["consumed"] += len(data)
                await port.sleep(p["tick_s"])
        await stream.aclose()
        out.update(app_queue_peak_bytes=state["peak"], consumed_bytes=state["consumed"])
    return _task(job, main, p["max_s"])


def _run_readahead(ctx):
    p = ctx.params
    ran = run_program(ctx, max_s=p["max_s"] + 2, peers=[peers.source(
        listen="127.0.0.1:0", total_bytes=p["total_bytes"], frame_bytes=32 * KiB, finish="close",
        sockbuf=SOCKBUF, max_s=p["max_s"])])
    peak = ran.app.get("app_queue_peak_bytes")
    m = {"app_queue_peak_bytes": peak, "consumed_bytes": ran.app.get("consumed_bytes"),
         "source_sent_bytes": ran.peers["source"].get("sent_bytes")}
    return m, {"bug_shown": peak is not None and peak > 4 * p["limit_bytes"]}, _notes(ran.app)


_add(Entry(
    id="aiohttp-1368", aliases=("C3",),
    title="the parser reads ahead while the handler is busy: the receive side is unbounded",
    link="https://github.com/aio-libs/aiohttp/issues/1368",
    mechanism="The protocol feeds every chunk that arrives into a queue for the handler and "
              "never pauses reading. A client that sends faster than the handler consumes "
              "fills the server's memory instead of its own socket.",
    reported="aiohttp 1.1 (HTTP request bodies)",
    fixed_in="aiohttp 1.2: the payload parser pauses the transport above a limit",
    framing="no HTTP: the client sends a raw stream and the handler consumes 64 KiB per tick",
    expected="shown on every runtime with an unbounded queue between reader and handler; a "
             "bounded one (pause_reading, a bounded Queue, not reading) holds the client back",
    oracle="bug shown when the queue between reader and handler peaks above 4 x the limit",
    styles=("callback", "stream", "task"),
    show_on=("callback", "hybrid", "coro")),
    _run_readahead,
    [Metric("app_queue_peak_bytes", "lower", "read-ahead peak"),
     Metric("consumed_bytes", None, "consumed"), Metric("source_sent_bytes", None, "client sent")],
    _presets({"total_bytes": 2 * MiB, "limit_bytes": 128 * KiB, "tick_s": 0.01, "max_s": 8},
             {"total_bytes": 4 * MiB, "limit_bytes": 128 * KiB, "tick_s": 0.01, "max_s": 12}),
    _by_style(_readahead_cb, _readahead_stream, _readahead_task))


# ---------------------------------------------------------------------------
# asyncio 248: a file pushed into a dead connection

def _deadpush_cb(job):
    p = job.params
    fixed = job.variant == "fixed"

    def start(port, t, proto, out):
        st = {"n": 0, "after": 0}

        def step():
            dead = proto.lost or t.is_closing()
            if fixed and dead:
                return finish()
            if st["n"] >= p["total_bytes"]:
                return finish()
            try:
                t.write(bytes(p["chunk_bytes"]))
            except RuntimeError as exc:        # uvloop: "the handler is closed"
                out["error_seen"] = f"RuntimeError: {exc}"
                return finish()
            st["n"] += p["chunk_bytes"]
            if dead:
                st["after"] += p["chunk_bytes"]
            port.call_later(p["tick_s"], step)

        def finish():
            out.update(written_bytes=st["n"], written_after_lost_bytes=st["after"])
            t.close()
            port.stop()
        step()
    return _callback(job, job.peer("reset"), start, p["max_s"])


def _deadpush_stream(job):
    p = job.params
    fixed = job.variant == "fixed"

    async def main(port, out):
        reader, writer = await _open(port, job.peer("reset"))
        n = after = 0
        error = None
        try:
            while n < p["total_bytes"]:
                if fixed and writer.is_closing():
                    break
                dead = writer.is_closing()
                writer.write(bytes(p["chunk_bytes"]))
                n += p["chunk_bytes"]
                if dead:
                    after += p["chunk_bytes"]
                await writer.drain()
                await port.sleep(p["tick_s"])
        except (ConnectionError, RuntimeError) as exc:   # uvloop raises RuntimeError
            error = type(exc).__name__
        writer.close()
        out.update(written_bytes=n, written_after_lost_bytes=after, error_seen=error)
    return _stream(job, main, p["max_s"])


def _run_deadpush(ctx):
    p = ctx.params
    ran = run_program(ctx, max_s=p["max_s"] + 2, peers=[peers.reset_peer(
        listen="127.0.0.1:0", after_bytes=64 * KiB, sockbuf=SOCKBUF, max_s=p["max_s"])])
    after = ran.app.get("written_after_lost_bytes")
    m = {"written_after_lost_bytes": after, "written_bytes": ran.app.get("written_bytes")}
    notes = _notes(ran.app) + ([f"error seen: {ran.app['error_seen']}"] if ran.app.get("error_seen") else [])
    return m, {"bug_shown": after is not None and after >= p["total_bytes"] // 4}, notes


_add(Entry(
    id="asyncio-248", aliases=("C9", "aiohttp-370"),
    title="writes to a closing transport keep succeeding: a whole file pushed into a dead connection",
    link="https://github.com/python/asyncio/issues/248",
    mechanism="Once the peer has gone, transport.write() drops the data without an error and "
              "drain() has nothing to wait for. A handler that streams a file chunk by chunk "
              "pushes all of it into the dead connection.",
    reported="asyncio 3.4 (aiohttp static files, aiohttp issue 370)",
    fixed_in="Python 3.4.4/3.5.0 added transport.is_closing(); later drain() raises once the "
             "connection is lost",
    expected="shown on asyncio's and our callback port (writes are dropped silently, the "
             "program must ask is_closing()); not on uvloop, whose write() to a closed "
             "transport raises RuntimeError, nor on today's stream ports, whose drain() raises "
             "ConnectionResetError",
    oracle="bug shown when at least a quarter of the file was written after the connection "
           "was already lost",
    styles=("callback", "stream"),
    show_on=("callback", "asyncio-protocol")),
    _run_deadpush,
    [Metric("written_after_lost_bytes", "lower", "written after loss"),
     Metric("written_bytes", None, "written")],
    _presets({"total_bytes": 2 * MiB, "chunk_bytes": 64 * KiB, "tick_s": 0.004, "max_s": 8}),
    _by_style(_deadpush_cb, _deadpush_stream))


# ---------------------------------------------------------------------------
# asyncio 263 and CPython 80982: drain() that never yields on a dead transport

def _spin_stream(closed_by_us):
    def program(job):
        p = job.params
        fixed = job.variant == "fixed"

        async def main(port, out):
            reader, writer = await _open(port, job.peer("reset" if not closed_by_us else "reader"))
            if closed_by_us:
                writer.write(b"x" * 100)
                writer.close()
            else:
                await port.sleep(p["settle_s"])      # the peer has reset by now
            n = after = 0
            error = None
            try:
                while n < p["iterations"]:
                    if fixed and writer.is_closing():
                        break
                    dead = writer.is_closing()
                    writer.write(b"x" * 1024)
                    n += 1
                    after += dead
                    await writer.drain()
            except (ConnectionError, RuntimeError) as exc:   # uvloop raises RuntimeError
                error = type(exc).__name__
            if not closed_by_us:
                writer.close()
            out.update(iterations_count=n, iterations_after_closing_count=after, error_seen=error)
        return _stream(job, main, p["max_s"])
    return program


def _run_spin(peer):
    def run(ctx):
        p = ctx.params
        role = (peers.reset_peer(listen="127.0.0.1:0", after_bytes=None, after_s=0.05,
                                 sockbuf=SOCKBUF, max_s=p["max_s"]) if peer == "reset"
                else peers.reader(sockbuf=SOCKBUF, max_s=p["max_s"]))
        ran = run_program(ctx, max_s=p["max_s"] + 2, peers=[role])
        after = ran.app.get("iterations_after_closing_count")
        m = {"iterations_after_closing_count": after, "iterations_count": ran.app.get("iterations_count")}
        notes = _notes(ran.app) + ([f"error seen: {ran.app['error_seen']}"] if ran.app.get("error_seen") else [])
        return m, {"bug_shown": after is not None and after >= p["iterations"] // 2}, notes
    return run


_SPIN_METRICS = [Metric("iterations_after_closing_count", "lower", "write+drain after closing"),
                 Metric("iterations_count", None, "iterations")]
_DRAIN_FLIP = Flip("hybrid:drain_on_closing=return", True,
                   "drain() returns at once on a closing or lost transport without yielding or "
                   "raising, so a write(); drain() loop never lets connection_lost run")

_add(Entry(
    id="asyncio-263", aliases=("C8",),
    title="drain() never yields after the peer disconnected: the write loop spins",
    link="https://github.com/python/asyncio/issues/263",
    mechanism="After the peer resets, writes are dropped and the transport is never paused, "
              "so drain() returned without yielding. A write(); drain() loop then never gave "
              "the loop a pass to deliver connection_lost, and spun without seeing the error.",
    reported="asyncio 3.4.3",
    fixed_in="asyncio 3.5 (drain() yields on a closing transport and raises after the loss)",
    expected="not shown on the installed asyncio and uvloop nor on hybrid (all raise "
             "ConnectionResetError within a pass); shown with hybrid:drain_on_closing=return",
    oracle="bug shown when more than half of the loop's iterations ran after the transport "
           "was already closing",
    styles=("stream",), flips=(_DRAIN_FLIP,), affects={"python": ("3.4.0", "3.5.0")},
    show_on=("hybrid:drain_on_closing=return",)),
    _run_spin("reset"), _SPIN_METRICS,
    _presets({"iterations": 2000, "settle_s": 0.2, "max_s": 6}),
    {"stream": _spin_stream(False)})

_add(Entry(
    id="cpython-80982", aliases=("bpo-36801",),
    title="write(); drain() on a closing transport never sees the error",
    link="https://github.com/python/cpython/issues/80982",
    mechanism="After writer.close(), writes are dropped and drain() found nothing to wait for, "
              "so it returned without yielding. A loop of write(); drain() never let the loop "
              "run connection_lost and never learned that the stream was gone.",
    reported="Python 3.7",
    fixed_in="Python 3.8 (drain() yields once on a closing transport, then raises)",
    expected="not shown on the installed Python, uvloop or hybrid; the 3.7 behaviour is "
             "shown with hybrid:drain_on_closing=return",
    oracle="bug shown when more than half of the iterations completed after close()",
    styles=("stream",), flips=(_DRAIN_FLIP,), affects={"python": ("3.7.0", "3.8.0")},
    show_on=("hybrid:drain_on_closing=return",)),
    _run_spin("reader"), _SPIN_METRICS,
    _presets({"iterations": 2000, "settle_s": 0.0, "max_s": 6}),
    {"stream": _spin_stream(True)})


# ---------------------------------------------------------------------------
# CPython 74116: two tasks draining one writer

def _twodrain_stream(job):
    p = job.params
    fixed = job.variant == "fixed"

    async def main(port, out):
        reader, writer = await _open(port, job.peer("reader"))
        errors = []
        chunk = bytes(p["chunk_bytes"])

        async def producer(q=None):
            for _ in range(p["writes"]):
                if q is not None:
                    await q.put(chunk)
                    continue
                writer.write(chunk)
                try:
                    await writer.drain()
                except AssertionError as exc:
                    errors.append(f"AssertionError: {exc}")
                except RuntimeError as exc:
                    errors.append(f"RuntimeError: {exc}")

        if fixed:    # one writer task owns write+drain; producers hand it chunks
            q = port.Queue(maxsize=2)

            async def owner():
                for _ in range(2 * p["writes"]):
                    writer.write(await q.get())
                    await writer.drain()
            tasks = [port.create_task(owner()), port.create_task(producer(q)),
                     port.create_task(producer(q))]
        else:
            tasks = [port.create_task(producer()), port.create_task(producer())]
        await port.gather(*tasks, return_exceptions=True)
        writer.close()
        await writer.wait_closed()
        out.update(drain_errors_count=len(errors), first_error=errors[0] if errors else None)
    return _stream(job, main, p["max_s"])


def _run_twodrain(ctx):
    p = ctx.params
    ran = run_program(ctx, max_s=p["max_s"] + 2, peers=[peers.reader(
        sockbuf=SOCKBUF, start_after_s=0.2, max_s=p["max_s"])])
    n = ran.app.get("drain_errors_count")
    notes = _notes(ran.app) + ([ran.app["first_error"]] if ran.app.get("first_error") else [])
    return {"drain_errors_count": n}, {"bug_shown": bool(n)}, notes


_add(Entry(
    id="cpython-74116", aliases=("bpo-29930", "C10"),
    title="two tasks awaiting drain() on one writer: AssertionError",
    link="https://github.com/python/cpython/issues/74116",
    mechanism="The stream protocol kept a single drain waiter. When a second task awaited "
              "drain() while the first was still parked, asyncio hit an assertion instead of "
              "parking both.",
    reported="Python 3.6 to 3.10",
    fixed_in="2022: a queue of drain waiters (Python 3.11.0, backported to 3.10)",
    expected="not shown on the installed Python 3.11 asyncio and uvloop streams nor on hybrid, "
             "which all keep a list of waiters; shown with hybrid:drain_waiters=one (the "
             "single waiter and its assertion)",
    oracle="bug shown when any drain() raised",
    styles=("stream",), affects={"python": ("3.6.0", "3.11.0")},
    flips=(Flip("hybrid:drain_waiters=one", True,
                "one drain waiter per writer; a second drain() asserts (before 3.11)"),),
    show_on=("hybrid:drain_waiters=one",)),
    _run_twodrain, [Metric("drain_errors_count", "lower", "drain() errors")],
    _presets({"writes": 8, "chunk_bytes": 128 * KiB, "max_s": 8}),
    {"stream": _twodrain_stream})


# ---------------------------------------------------------------------------
# Write loops and flow control: CPython 116279, 127655; asyncio 140

def _flood_stream(mode):
    """mode: 'sleep0' (116279), 'writelines' (127655)."""
    def program(job):
        p = job.params
        fixed = job.variant == "fixed"

        async def main(port, out):
            reader, writer = await _open(port, job.peer("reader"))
            t = writer.transport
            chunk, peak, n = bytes(p["chunk_bytes"]), 0, 0
            while n < p["total_bytes"]:
                if mode == "writelines" and not fixed:
                    writer.writelines([chunk[: len(chunk) // 2], chunk[len(chunk) // 2:]])
                else:
                    writer.write(chunk)
                n += len(chunk)
                peak = max(peak, t.get_write_buffer_size())
                if mode == "sleep0" and not fixed:
                    await port.sleep(0)
                else:
                    await writer.drain()
            writer.close()
            await writer.wait_closed()
            out.update(peak_buffer_bytes=peak, high_water_bytes=t.get_write_buffer_limits()[1])
        return _stream(job, main, p["max_s"])
    return program


def _flood_cb(mode):
    def program(job):
        p = job.params
        fixed = job.variant == "fixed"

        def start(port, t, proto, out):
            st = {"n": 0, "peak": 0}
            chunk = bytes(p["chunk_bytes"])

            def step():
                if st["n"] >= p["total_bytes"]:
                    out.update(peak_buffer_bytes=st["peak"], high_water_bytes=t.get_write_buffer_limits()[1])
                    proto.on_lost = port.stop
                    t.close()
                    return
                if proto.paused and (fixed or mode == "writelines"):
                    proto.on_resume = step          # honour flow control
                    return
                if mode == "writelines" and not fixed:
                    t.writelines([chunk[: len(chunk) // 2], chunk[len(chunk) // 2:]])
                else:
                    t.write(chunk)
                st["n"] += len(chunk)
                st["peak"] = max(st["peak"], t.get_write_buffer_size())
                port.call_soon(step)
            step()
        return _callback(job, job.peer("reader"), start, p["max_s"])
    return program


def _run_flood(ctx):
    p = ctx.params
    ran = run_program(ctx, max_s=p["max_s"] + 2, peers=[peers.reader(
        sockbuf=SOCKBUF, start_after_s=p["start_after_s"], max_s=p["max_s"])])
    peak, high = ran.app.get("peak_buffer_bytes"), ran.app.get("high_water_bytes") or 64 * KiB
    m = {"peak_buffer_bytes": peak, "delivered_bytes": ran.peers["reader"].get("received_bytes")}
    return m, {"bug_shown": peak is not None and peak > high + 4 * p["chunk_bytes"]}, _notes(ran.app)


_FLOOD_METRICS = [Metric("peak_buffer_bytes", "lower", "write buffer peak"),
                  Metric("delivered_bytes", None, "delivered")]

_add(Entry(
    id="cpython-116279", aliases=("C14",), catalog="S1",
    title="a write loop with sleep(0) but no drain(): memory climbs",
    link="https://github.com/python/cpython/issues/116279",
    mechanism="`await asyncio.sleep(0)` lets other tasks run but waits for nothing, so a loop "
              "of write(); sleep(0) to a slow reader queues everything in the transport. Only "
              "drain() (or honouring pause_writing) ties the writer to the socket.",
    reported="Python 3.12 (a user report; the behaviour is as old as asyncio)",
    fixed_in="not a library bug: await writer.drain() after each write",
    expected="shown on every callback and stream runtime; the task port has no buffer to fill",
    oracle="bug shown when the write buffer peaks above high water + 4 writes",
    styles=("callback", "stream"),
    show_on=("hybrid", "asyncio-streams", "callback")),
    _run_flood, _FLOOD_METRICS,
    _presets({"total_bytes": 2 * MiB, "chunk_bytes": 32 * KiB, "start_after_s": 0.4, "max_s": 8}),
    _by_style(_flood_cb("sleep0"), _flood_stream("sleep0")))

_add(Entry(
    id="cpython-127655", aliases=("GHSA-fw89-6wjj-8j95", "C12"),
    title="writelines() skipped the flow-control check",
    link="https://github.com/python/cpython/issues/127655",
    mechanism="On 3.12 and 3.13 the selector transport's writelines() appended to the buffer "
              "without calling the pause check that write() makes. A writer using writelines() "
              "and drain() was never paused, so its buffer grew without bound.",
    reported="Python 3.12.0-3.12.8, 3.13.0-3.13.1",
    fixed_in="Python 3.12.9, 3.13.2 (security advisory GHSA-fw89-6wjj-8j95)",
    expected="not shown on the installed Python 3.11 (writelines joins and calls write) nor on "
             "our kernels at their defaults; shown with callback:writelines=unchecked and "
             "hybrid:writelines=unchecked",
    oracle="bug shown when a writelines()+drain() writer's buffer peaks above high water + 4 writes",
    styles=("callback", "stream"), affects={"python": ("3.12.0", "3.12.9")},
    flips=(Flip("callback:writelines=unchecked", True,
                "writelines() buffers without the pause check (3.12.0-3.12.8)"),
           Flip("hybrid:writelines=unchecked", True, "the same on the stream kernel")),
    show_on=("callback:writelines=unchecked", "hybrid:writelines=unchecked")),
    _run_flood, _FLOOD_METRICS,
    _presets({"total_bytes": 1 * MiB, "chunk_bytes": 32 * KiB, "start_after_s": 0.4, "max_s": 8}),
    _by_style(_flood_cb("writelines"), _flood_stream("writelines")))


def _limits_cb(job):
    p = job.params
    fixed = job.variant == "fixed"

    def start(port, t, proto, out):
        def fill():
            # Write until the kernel buffers are full and some bytes wait in user space,
            # then a bit more: the buffer ends below the default high-water mark.
            for _ in range(_CAP):
                if t.get_write_buffer_size() or t.is_closing():
                    break
                t.write(bytes(8 * KiB))
            t.write(bytes(p["extra_bytes"]))
            before = t.get_write_buffer_size()
            paused_before = proto.paused
            t.set_write_buffer_limits(high=p["new_high"])
            held = proto.paused or (fixed and t.get_write_buffer_size() > p["new_high"])
            out.update(buffer_at_lowering_bytes=before, paused_before=paused_before,
                       went_ahead=not held and t.get_write_buffer_size() > p["new_high"])
            t.abort()
            port.stop()
        port.call_later(0.05, fill)
    return _callback(job, job.peer("reader"), start, p["max_s"])


def _limits_stream(job):
    p = job.params
    fixed = job.variant == "fixed"

    async def main(port, out):
        reader, writer = await _open(port, job.peer("reader"))
        t = writer.transport
        await port.sleep(0.05)
        for _ in range(_CAP):
            if t.get_write_buffer_size() or t.is_closing():
                break
            writer.write(bytes(8 * KiB))
        writer.write(bytes(p["extra_bytes"]))
        before = t.get_write_buffer_size()
        t.set_write_buffer_limits(high=p["new_high"])
        # drain() is the gate the program writes behind; it waits only if paused.
        try:
            await port.wait_for(writer.drain(), 0.2)
            drained_at_once = True
        except TimeoutError:
            drained_at_once = False
        held = not drained_at_once or (fixed and t.get_write_buffer_size() > p["new_high"])
        out.update(buffer_at_lowering_bytes=before,
                   went_ahead=not held and t.get_write_buffer_size() > p["new_high"])
        t.abort()
    return _stream(job, main, p["max_s"])


def _run_limits(ctx):
    p = ctx.params
    ran = run_program(ctx, max_s=p["max_s"] + 2, peers=[peers.reader(
        sockbuf=SOCKBUF, start_after_s=1.0, max_s=p["max_s"])])
    m = {"buffer_at_lowering_bytes": ran.app.get("buffer_at_lowering_bytes"),
         "went_ahead": ran.app.get("went_ahead")}
    return m, {"bug_shown": bool(ran.app.get("went_ahead"))}, _notes(ran.app)


_add(Entry(
    id="asyncio-140", aliases=("C20",),
    title="lowering the write-buffer limits below the current size did not pause",
    link="https://github.com/python/asyncio/issues/140",
    mechanism="set_write_buffer_limits() stored the new marks but did not re-check the buffer "
              "against them. A writer that lowered its high-water mark below what was already "
              "buffered was not paused until its next write.",
    reported="asyncio 3.4.0",
    fixed_in="asyncio 3.4.1 (set_write_buffer_limits calls the pause check)",
    expected="not shown on the installed Python, uvloop or our kernels at their defaults; "
             "shown with callback:limits_recheck=false and hybrid:limits_recheck=false",
    oracle="bug shown when, right after lowering the mark below the buffered size, the "
           "program's gate (pause_writing / drain) let it write on",
    styles=("callback", "stream"), affects={"python": ("3.4.0", "3.4.1")},
    flips=(Flip("callback:limits_recheck=false", True,
                "set_write_buffer_limits() stores the marks without the pause check (asyncio 3.4.0)"),
           Flip("hybrid:limits_recheck=false", True, "the same on the stream kernel")),
    show_on=("callback:limits_recheck=false", "hybrid:limits_recheck=false")),
    _run_limits,
    [Metric("buffer_at_lowering_bytes", None, "buffered when lowered"),
     Metric("went_ahead", None, "writer went ahead", unit="flag")],
    _presets({"extra_bytes": 24 * KiB, "new_high": 4 * KiB, "max_s": 5}),
    _by_style(_limits_cb, _limits_stream))


# ---------------------------------------------------------------------------
# CPython 146507: an O(n) get_write_buffer_size() under write pressure

def _cost_program(job):
    p = job.params
    n, group = p["writes"], p["group"]
    chunk = bytes(p["chunk_bytes"])

    coalesce = job.variant == "fixed"

    def measure(t, write):
        times = []
        for g in range(n // group):
            t0 = time.perf_counter()
            if coalesce:        # the fix on the application side: one write per batch
                write(b"".join([chunk] * group))
                t.get_write_buffer_size()
            else:
                for _ in range(group):
                    write(chunk)
                    t.get_write_buffer_size()
            times.append(time.perf_counter() - t0)
        first, last = sorted(times[:3])[1], sorted(times[-3:])[1]
        return {"cost_ratio_fraction": last / first if first else None,
                "chunks_buffered_count": n, "buffer_bytes": t.get_write_buffer_size()}

    if job.runtime.style == "callback":
        def start(port, t, proto, out):
            out.update(measure(t, t.write))
            t.abort()
            port.stop()
        return _callback(job, job.peer("reader"), start, p["max_s"])

    async def main(port, out):
        reader, writer = await _open(port, job.peer("reader"))
        out.update(measure(writer.transport, writer.write))
        writer.transport.abort()
    return _stream(job, main, p["max_s"])


def _run_cost(ctx):
    p = ctx.params
    ran = run_program(ctx, max_s=p["max_s"] + 2, peers=[peers.reader(
        sockbuf=SOCKBUF, start_after_s=0.5, max_s=p["max_s"])])
    r = ran.app.get("cost_ratio_fraction")
    notes = _notes(ran.app)
    if ctx.variant == "fixed":
        notes.append("fixed: the same bytes coalesced into one write per batch of messages")
    return ({"cost_ratio_fraction": r, "buffer_bytes": ran.app.get("buffer_bytes")},
            {"bug_shown": r is not None and r > p["ratio"]}, notes)


_add(Entry(
    id="cpython-146507", aliases=("C15",),
    title="get_write_buffer_size() summed a deque on every write: O(n^2) under pressure",
    link="https://github.com/python/cpython/issues/146507",
    mechanism="The selector transport's write buffer became a deque of chunks, and "
              "get_write_buffer_size() (called by the pause check after every write) summed "
              "it each time. When small chunks pile up faster than they drain, each write "
              "costs more than the last.",
    reported="Python 3.12 and later (the deque buffer)",
    fixed_in="a running total (CPython PR 146518, 2026); on the application side, coalesce "
             "small messages into fewer writes",
    expected="not shown on the installed Python 3.11 (one bytearray) nor on our kernels "
             "(a bytearray, O(1) len); shown with callback:write_buffer=deque (3.12's deque, "
             "summed on every write; hybrid:write_buffer=deque is the same transport: add it "
             "with --knob write_buffer=deque)",
    oracle="bug shown when a group of writes late in the run costs more than "
           "`ratio` x a group at the start (a scaling ratio, not a wall-clock limit)",
    styles=("callback", "stream"), affects={"python": ("3.12.0", None)},
    flips=(Flip("callback:write_buffer=deque", True,
                "a deque of chunks whose size is summed on every write (3.12+)"),),
    show_on=("callback:write_buffer=deque",)),
    _run_cost,
    [Metric("cost_ratio_fraction", "lower", "late/early cost"), Metric("buffer_bytes", None, "buffered")],
    _presets({"writes": 20000, "group": 1000, "chunk_bytes": 100, "ratio": 5.0, "max_s": 20}),
    _by_style(_cost_program, _cost_program))


# ---------------------------------------------------------------------------
# uvloop 548: buffer memory kept after connection_lost

def _memory_program(job):
    p = job.params
    fixed = job.variant == "fixed"
    size = p["flood_bytes"]

    def start(port, t, proto, out):
        gc.collect()
        out["rss_before_bytes"] = _rss()
        st = {"n": 0}

        def flood():
            while st["n"] < size and not proto.lost and not (fixed and proto.paused):
                t.write(bytes(256 * KiB))
                st["n"] += 256 * KiB
            if fixed and proto.paused and st["n"] < size:
                proto.on_resume = flood
            out["buffered_peak_bytes"] = max(out.get("buffered_peak_bytes", 0), t.get_write_buffer_size())

        def after_lost():
            out["buffered_at_loss_bytes"] = out.get("buffered_peak_bytes", 0)
            port.call_later(0.2, measure)

        def measure():
            gc.collect()
            out["rss_kept_bytes"] = _rss() - out["rss_before_bytes"]
            port.stop()
        proto.on_lost = after_lost
        flood()
    return _callback(job, job.peer("reset"), start, p["max_s"])


def _run_memory(ctx):
    p = ctx.params
    # The client takes one byte and resets: the flood is already buffered by then.
    ran = run_program(ctx, max_s=p["max_s"] + 2, peers=[peers.reset_peer(
        listen="127.0.0.1:0", after_bytes=1, sockbuf=SOCKBUF, max_s=p["max_s"])])
    kept, peak = ran.app.get("rss_kept_bytes"), ran.app.get("buffered_peak_bytes")
    m = {"rss_kept_bytes": kept, "buffered_peak_bytes": peak}
    shown = kept is not None and kept > p["flood_bytes"] // 2
    return m, {"bug_shown": shown}, _notes(ran.app)


_add(Entry(
    id="uvloop-548", aliases=("C16",),
    title="transport buffer memory not released after connection_lost",
    link="https://github.com/MagicStack/uvloop/issues/548",
    mechanism="A protocol floods transport.write() to a client that stops reading; the client "
              "goes away. uvloop kept the flooded buffer's memory resident after "
              "connection_lost, where asyncio freed it at once.",
    reported="uvloop 0.17.0 (Python 3.11.4)",
    fixed_in="open in the thread; the installed uvloop is measured",
    expected="asyncio and our callback kernel release the buffer at once; the installed "
             "uvloop is measured (0.23.0 here: released); callback:buffer_on_loss=keep shows "
             "the reported behaviour; honouring pause_writing never builds the buffer in the "
             "first place",
    oracle="bug shown when, 0.2 s after connection_lost and a gc, the process still holds "
           "more than half the flooded bytes above its starting RSS",
    styles=("callback",), affects={"uvloop": ("0.17.0", None)},
    flips=(Flip("callback:buffer_on_loss=keep", True,
                "the lost transport's buffer stays referenced, as uvloop 0.17 was reported to do"),),
    show_on=("callback:buffer_on_loss=keep",)),
    _run_memory,
    [Metric("rss_kept_bytes", "lower", "RSS kept after loss"),
     Metric("buffered_peak_bytes", None, "buffered at peak")],
    _presets({"flood_bytes": 48 * MiB, "max_s": 8}),
    {"callback": _memory_program})


# ---------------------------------------------------------------------------
# trio 412: close with unread inbound data sends RST

def _rst_cb(job):
    """naive: answer after the first chunk of the request and close; fixed: read the
    request to its EOF first, then answer and close."""
    p = job.params
    fixed = job.variant == "fixed"

    def start(port, t, proto, out):
        proto.on_lost = port.stop

        def answer():
            t.write(bytes(p["response_bytes"]))
            t.close()
        if fixed:
            proto.on_eof = answer
        else:
            proto.on_data = lambda data: (setattr(proto, "on_data", None), answer())
    return _callback(job, job.peer("source"), start, p["max_s"])


def _rst_stream(job):
    p = job.params

    async def main(port, out):
        reader, writer = await _open(port, job.peer("source"))
        await reader.read(64 * KiB)                 # the request's head
        if job.variant == "fixed":
            while await reader.read(64 * KiB):       # the rest of the request, to EOF
                pass
        writer.write(bytes(p["response_bytes"]))
        writer.close()
        try:
            await writer.wait_closed()
        except ConnectionError:
            pass
    return _stream(job, main, p["max_s"])


def _rst_task(job):
    p = job.params

    async def main(port, out):
        stream = await _open_task(port, job.peer("source"))
        try:
            await stream.receive_some(64 * KiB)
            if job.variant == "fixed":
                while await stream.receive_some(64 * KiB):
                    pass
            await stream.send_all(bytes(p["response_bytes"]))
        except port.StreamError as exc:
            out["send_error"] = type(exc).__name__
        finally:
            await stream.aclose()
    return _task(job, main, p["max_s"])


def _run_rst(ctx):
    p = ctx.params
    ran = run_program(ctx, max_s=p["max_s"] + 2, peers=[peers.source(
        listen="127.0.0.1:0", total_bytes=p["request_bytes"], frame_bytes=32 * KiB,
        finish="shutdown", eof_wait_s=p["max_s"], sockbuf=SOCKBUF, max_s=p["max_s"] + 1)])
    s = ran.peers["source"]
    got = s.get("received_bytes", 0)
    m = {"response_received_bytes": got, "response_lost_bytes": p["response_bytes"] - got,
         "peer_end": s.get("ended")}
    return m, {"bug_shown": got < p["response_bytes"]}, _notes(ran.app)


_add(Entry(
    id="trio-412", aliases=("C17",),
    title="close with unread inbound data sends RST: the peer loses the response",
    link="https://github.com/python-trio/trio/issues/412",
    mechanism="Closing a TCP socket whose receive queue still holds unread bytes makes the "
              "kernel send RST instead of FIN. A server that answers after the request's head "
              "and closes while the client is still uploading resets the connection, and the "
              "client never gets to read the answer.",
    reported="trio 0.2 (a property of TCP on Linux, every runtime)",
    fixed_in="not a library fix: read the request to its end (or shut down the write side "
             "and drain the input) before closing",
    framing="no HTTP: the client uploads a 1 MiB request, then reads the answer until EOF",
    expected="shown on every runtime when the server answers after the first chunk and "
             "closes; not shown when it reads the request to EOF first",
    oracle="bug shown when the client received less than the whole response",
    styles=("callback", "stream", "task"),
    show_on=("coro", "trio", "hybrid")),
    _run_rst,
    [Metric("response_received_bytes", "higher", "response received"),
     Metric("response_lost_bytes", "lower", "response lost"),
     Metric("peer_end", None, "client saw", unit="text")],
    _presets({"response_bytes": 64 * KiB, "request_bytes": 1 * MiB, "max_s": 6}),
    _by_style(_rst_cb, _rst_stream, _rst_task))


# ---------------------------------------------------------------------------
# curio 164: spawn runs the child later than the docs said

async def _until(port, flag, limit=1000):
    """Yield until the child has signalled (a list it appends to): the fix."""
    for _ in range(limit):
        if flag:
            return
        await port.sleep(0)


def _spawn_stream(job):
    p = job.params

    async def main(port, out):
        not_yet = 0
        for _ in range(p["trials"]):
            ran = []

            async def child():
                ran.append(True)
            task = port.create_task(child())
            if job.variant == "fixed":
                await _until(port, ran)
            not_yet += not ran
            await task
        out["child_not_run_fraction"] = not_yet / p["trials"]
    return _stream(job, main, p["max_s"])


def _spawn_task(job):
    p = job.params

    async def main(port, out):
        not_yet = 0
        for _ in range(p["trials"]):
            ran = []

            async def child():
                ran.append(True)
            async with port.open_nursery() as n:
                await n.spawn(child)
                if job.variant == "fixed":
                    await _until(port, ran)
                not_yet += not ran
        out["child_not_run_fraction"] = not_yet / p["trials"]
    return _task(job, main, p["max_s"])


def _run_spawn(ctx):
    ran = run_program(ctx, max_s=ctx.params["max_s"] + 2)
    f = ran.app.get("child_not_run_fraction")
    return {"child_not_run_fraction": f}, {"bug_shown": f is not None and f > 0.5}, _notes(ran.app)


_add(Entry(
    id="curio-164", aliases=("C18",), catalog="S4",
    title="the docs said spawn runs the child first; the code did not",
    link="https://github.com/dabeaz/curio/issues/164",
    mechanism="curio's documentation promised that a spawned task starts running before "
              "spawn() returns, but the kernel only queued it. A parent that relies on the "
              "child having started (an Event set, a listener bound) races ahead of it.",
    reported="curio 0.8 docs",
    fixed_in="the docs were corrected; wait for an Event the child sets",
    expected="shown everywhere with the default (lazy) spawn, including trio and asyncio; "
             "coro:spawn=eager and hybrid:spawn=eager run the child inside spawn, as the "
             "docs described",
    oracle="bug shown when, in more than half of the trials, the child had not run when the "
           "parent's next statement ran",
    styles=("stream", "task"),
    flips=(Flip("coro:spawn=eager", False, "the child's first step runs inside spawn"),
           Flip("hybrid:spawn=eager", False, "the child's first step runs inside create_task")),
    show_on=("coro", "curio", "hybrid")),
    _run_spawn, [Metric("child_not_run_fraction", "lower", "child not yet run")],
    _presets({"trials": 20, "max_s": 5}),
    _by_style(None, _spawn_stream, _spawn_task))


# ---------------------------------------------------------------------------
# CPython 113538 / 104344: Server.wait_closed() waits for every handler (3.12)

def _waitclosed_stream(job):
    p = job.params
    fixed = job.variant == "fixed"

    async def main(port, out):
        handlers = []
        started = port.Event()

        async def handler(reader, writer):
            handlers.append(writer)
            started.set()
            await reader.read()          # idle client: waits for EOF

        server = await port.start_server(handler, "127.0.0.1", 0)
        host, tcp = server.sockets[0].getsockname()[:2]
        creader, cwriter = await port.open_connection(host, tcp)
        await port.wait_for(started.wait(), 2)
        server.close()
        if fixed:                         # close the connections you accepted (3.13: close_clients)
            for w in handlers:
                w.close()
        t0 = time.monotonic()
        try:
            await port.wait_for(server.wait_closed(), p["bound_s"])
            out["wait_closed_s"] = time.monotonic() - t0
            out["hung"] = False
        except TimeoutError:
            out["wait_closed_s"] = None
            out["hung"] = True
        cwriter.close()
        try:
            await cwriter.wait_closed()
        except ConnectionError:
            pass
        for w in handlers:
            w.close()
    return _stream(job, main, p["max_s"])


def _run_waitclosed(ctx):
    ran = run_program(ctx, max_s=ctx.params["max_s"] + 2)
    hung = ran.app.get("hung")
    m = {"wait_closed_s": ran.app.get("wait_closed_s"), "hung": hung}
    return m, {"bug_shown": bool(hung)}, _notes(ran.app) + [
        "the idle client is opened by the program itself on the same loop (no peer can "
        "connect to a server a program starts)"]


_add(Entry(
    id="cpython-113538", aliases=("cpython-104344",),
    title="Server.wait_closed() waits for every handler: shutdown hangs on an idle client",
    link="https://github.com/python/cpython/issues/113538",
    mechanism="From 3.12.1 Server.wait_closed() returns only once every accepted connection "
              "is gone (3.11 returned as soon as the listener closed). A shutdown that closes "
              "the server and awaits wait_closed() hangs while a client sits idle in read().",
    reported="Python 3.12.1+ (CPython 104344 changed it; 113538 reports the hang)",
    fixed_in="Python 3.13 added Server.close_clients()/abort_clients(); close the handlers' "
             "writers first",
    expected="not shown on the installed Python 3.11 (wait_closed returns at once) nor on "
             "hybrid, whose Server follows the running Python; shown with "
             "hybrid:wait_closed=3.12; closing the accepted writers fixes it everywhere",
    oracle="bug shown when wait_closed() did not return within bound_s",
    styles=("stream",), affects={"python": ("3.12.1", None)},
    flips=(Flip("hybrid:wait_closed=3.12", True,
                "Server.wait_closed() also waits for every accepted connection (3.12.1+)"),),
    show_on=("hybrid:wait_closed=3.12",)),
    _run_waitclosed,
    [Metric("wait_closed_s", None, "wait_closed took"), Metric("hung", None, "hung", unit="flag")],
    _presets({"bound_s": 1.0, "max_s": 6}),
    {"stream": _waitclosed_stream})


# ---------------------------------------------------------------------------
# CPython 115514: writes after close() dropped while data is buffered

def _afterclose_cb(job):
    p = job.params

    def start(port, t, proto, out):
        t.write(bytes(p["first_bytes"]))
        if job.variant == "fixed":
            t.write(bytes(p["late_bytes"]))
            t.close()
        else:
            buffered = t.get_write_buffer_size()
            t.close()
            t.write(bytes(p["late_bytes"]))    # scheduled after close(), bytes still buffered
            out["buffered_at_close_bytes"] = buffered
        proto.on_lost = port.stop
    return _callback(job, job.peer("reader"), start, p["max_s"])


def _afterclose_stream(job):
    p = job.params

    async def main(port, out):
        reader, writer = await _open(port, job.peer("reader"))
        writer.write(bytes(p["first_bytes"]))
        if job.variant == "fixed":
            writer.write(bytes(p["late_bytes"]))
            writer.close()
        else:
            out["buffered_at_close_bytes"] = writer.transport.get_write_buffer_size()
            writer.close()
            writer.write(bytes(p["late_bytes"]))
        await writer.wait_closed()
    return _stream(job, main, p["max_s"])


def _run_afterclose(ctx):
    p = ctx.params
    ran = run_program(ctx, max_s=p["max_s"] + 2, peers=[peers.reader(
        sockbuf=SOCKBUF, start_after_s=0.3, max_s=p["max_s"])])
    got = ran.peers["reader"].get("received_bytes", 0)
    total = p["first_bytes"] + p["late_bytes"]
    m = {"delivered_bytes": got, "lost_bytes": total - got,
         "buffered_at_close_bytes": ran.app.get("buffered_at_close_bytes")}
    return m, {"bug_shown": got < total}, _notes(ran.app)


_add(Entry(
    id="cpython-115514",
    title="writes made after close() are dropped while data is still buffered",
    link="https://github.com/python/cpython/issues/115514",
    mechanism="asyncio's transport accepts write() after close() as long as earlier bytes "
              "are still buffered, and flushes them before closing. After the 3.12 writev "
              "change those late writes were silently dropped, truncating the stream.",
    reported="Python 3.12.0-3.12.8, 3.13.0-3.13.1 (after gh-106503)",
    fixed_in="Python 3.12.9, 3.13.2 (gh-128037)",
    expected="not shown on the installed Python 3.11 asyncio, nor on our callback and hybrid "
             "kernels, which reproduce 3.11 (a late write is flushed while bytes are buffered); "
             "shown with callback:write_after_close=drop and hybrid:write_after_close=drop; "
             "writing everything before close() avoids it everywhere",
    oracle="bug shown when the reader received less than everything written (including the "
           "write made after close())",
    styles=("callback", "stream"), affects={"python": ("3.12.0", "3.12.9")},
    flips=(Flip("callback:write_after_close=drop", True,
                "a write after close() is dropped even while bytes are buffered (3.12.0-3.12.8)"),
           Flip("hybrid:write_after_close=drop", True, "the same on the stream kernel")),
    show_on=("callback:write_after_close=drop", "hybrid:write_after_close=drop")),
    _run_afterclose,
    [Metric("delivered_bytes", "higher", "delivered"), Metric("lost_bytes", "lower", "lost"),
     Metric("buffered_at_close_bytes", None, "buffered at close")],
    _presets({"first_bytes": 1 * MiB, "late_bytes": 64 * KiB, "max_s": 6}),
    _by_style(_afterclose_cb, _afterclose_stream))


# ---------------------------------------------------------------------------
# uvloop 631: a small write deferred to a loop pass that never comes

def _deferred_cb(job):
    p = job.params

    def start(port, t, proto, out):
        t.write(b"x" * p["write_bytes"])
        out["written_at"] = time.monotonic()

        def block():
            time.sleep(p["block_s"])       # the program blocks without giving the loop a pass
            out["unblocked_at"] = time.monotonic()
            proto.on_lost = port.stop
            t.close()
        if job.variant == "fixed":
            port.call_later(0.02, block)   # give the loop its pass first
        else:
            block()
    return _callback(job, job.peer("reader"), start, p["max_s"])


def _deferred_stream(job):
    p = job.params

    async def main(port, out):
        reader, writer = await _open(port, job.peer("reader"))
        writer.write(b"x" * p["write_bytes"])
        out["written_at"] = time.monotonic()
        if job.variant == "fixed":
            await port.sleep(0.02)
        time.sleep(p["block_s"])
        out["unblocked_at"] = time.monotonic()
        writer.close()
        await writer.wait_closed()
    return _stream(job, main, p["max_s"])


def _run_deferred(ctx):
    p = ctx.params
    ran = run_program(ctx, max_s=p["max_s"] + 2, peers=[peers.reader(sockbuf=SOCKBUF, max_s=p["max_s"])])
    r = ran.peers["reader"]
    first = None
    if r.get("first_byte_after_s") is not None and r.get("connected_at") is not None:
        first = r["connected_at"] + r["first_byte_after_s"]
    unblocked = ran.app.get("unblocked_at")
    delay = None if first is None or ran.app.get("written_at") is None else max(0.0, first - ran.app["written_at"])
    shown = first is None or (unblocked is not None and first >= unblocked - 0.01)
    return ({"first_byte_after_write_s": delay}, {"bug_shown": bool(shown)}, _notes(ran.app))


_add(Entry(
    id="uvloop-631", aliases=("uvloop-619",),
    title="a small write is deferred to a loop pass that never comes",
    link="https://github.com/MagicStack/uvloop/issues/631",
    mechanism="uvloop queued a write below the high-water mark and sent it from a later loop "
              "pass, where asyncio tries the send at once. A program that writes and then "
              "blocks (or waits on something outside the loop) never sends the bytes.",
    reported="uvloop 0.19-0.20",
    fixed_in="uvloop 0.21 (PR 619: try the send at once when nothing is buffered)",
    expected="measured on the installed uvloop; not shown on asyncio or on our kernels with "
             "write=try-send; shown with callback:write=defer and hybrid:write=defer",
    oracle="bug shown when the reader's first byte arrived only after the program stopped "
           "blocking (the write waited for a loop pass)",
    styles=("callback", "stream"), affects={"uvloop": ("0.15.0", "0.21.0")},
    flips=(Flip("callback:write=defer", True, "every write waits for the writable callback "
                                                "(a later loop pass)"),
           Flip("hybrid:write=defer", True, "the same on the stream kernel")),
    show_on=("callback:write=defer", "hybrid:write=defer")),
    _run_deferred, [Metric("first_byte_after_write_s", "lower", "first byte after write")],
    _presets({"write_bytes": 100, "block_s": 0.4, "max_s": 5}),
    _by_style(_deferred_cb, _deferred_stream))


# ---------------------------------------------------------------------------
# sanic 2921: close() then abort() on a timer truncates the response

def _abort_cb(job):
    p = job.params

    def start(port, t, proto, out):
        t.write(bytes(p["response_bytes"]))
        t.close()
        proto.on_lost = port.stop
        grace = p["abort_after_s"] if job.variant == "naive" else p["generous_s"]

        def fallback():
            if not proto.lost:
                out["aborted_with_bytes"] = t.get_write_buffer_size()
                t.abort()
        port.call_later(grace, fallback)
    return _callback(job, job.peer("reader"), start, p["max_s"])


def _abort_stream(job):
    p = job.params

    async def main(port, out):
        reader, writer = await _open(port, job.peer("reader"))
        writer.write(bytes(p["response_bytes"]))
        writer.close()
        grace = p["abort_after_s"] if job.variant == "naive" else p["generous_s"]
        try:
            await port.wait_for(writer.wait_closed(), grace)
        except TimeoutError:
            out["aborted_with_bytes"] = writer.transport.get_write_buffer_size()
            writer.transport.abort()
    return _stream(job, main, p["max_s"])


def _run_abort(ctx):
    p = ctx.params
    ran = run_program(ctx, max_s=p["max_s"] + 2, peers=[peers.reader(
        sockbuf=SOCKBUF, rate_Bps=p["reader_Bps"], max_s=p["max_s"])])
    got = ran.peers["reader"].get("received_bytes", 0)
    m = {"delivered_bytes": got, "lost_bytes": p["response_bytes"] - got,
         "aborted_with_bytes": ran.app.get("aborted_with_bytes")}
    return m, {"bug_shown": got < p["response_bytes"]}, _notes(ran.app)


_add(Entry(
    id="sanic-2921", aliases=("sanic-2973",),
    title="close() then abort() on a timer truncates a large response",
    link="https://github.com/sanic-org/sanic/issues/2921",
    mechanism="transport.close() with bytes still buffered keeps the connection open until "
              "they are sent. Sanic called abort() a fixed moment later as a fallback, which "
              "drops whatever a slow client had not yet taken.",
    reported="sanic 23.x on uvloop (the close/abort fallback)",
    fixed_in="sanic PR 2973: abort only once the buffer is empty or after a generous timeout",
    framing="no HTTP: the response is a raw 1 MiB body to a client reading at 2 MB/s",
    expected="shown on every callback and stream runtime with the short fallback; not with "
             "the generous one",
    oracle="bug shown when the client received less than the whole response",
    styles=("callback", "stream"),
    show_on=("callback", "uvloop-protocol", "hybrid")),
    _run_abort,
    [Metric("delivered_bytes", "higher", "delivered"), Metric("lost_bytes", "lower", "lost"),
     Metric("aborted_with_bytes", None, "buffered at abort")],
    _presets({"response_bytes": 1 * MiB, "reader_Bps": 2_000_000, "abort_after_s": 0.1,
              "generous_s": 4.0, "max_s": 7}),
    _by_style(_abort_cb, _abort_stream))


# ---------------------------------------------------------------------------
# uvicorn 2754: a task parked in drain() never released after the disconnect

def _parked_cb(job):
    """uvicorn's FlowControl shape: the writer parks until resume_writing(); the
    naive protocol forgets to release it in connection_lost."""
    p = job.params

    def start(port, t, proto, out):
        state = {"parked_at": None}

        def writer_step():
            if proto.lost:
                out.update(released=True, release_reason="error")
                return done()
            for _ in range(_CAP):     # a lost transport drops writes and never pauses
                if proto.paused or proto.lost or t.is_closing():
                    break
                t.write(bytes(64 * KiB))
            state["parked_at"] = time.monotonic()
            proto.on_resume = lambda: (out.update(released=True, release_reason="resume"), done())

        def on_lost():
            out["lost_at"] = time.monotonic()
            if job.variant == "fixed" and proto.on_resume is not None:
                proto.on_resume = None
                out.update(released=True, release_reason="connection_lost")
                done()
            else:
                port.call_later(p["bound_s"], done)

        def done():
            out.setdefault("released", False)
            port.stop()
        proto.on_lost = on_lost
        writer_step()
    return _callback(job, job.peer("reset"), start, p["max_s"])


def _parked_stream(job):
    p = job.params

    async def main(port, out):
        reader, writer = await _open(port, job.peer("reset"))
        for _ in range(_CAP):
            if writer.transport.get_write_buffer_size() > 256 * KiB or writer.is_closing():
                break
            writer.write(bytes(64 * KiB))
        try:
            # Both variants are the same code here: the library's drain() is woken by
            # connection_lost; the bug lived in a hand-written flow control (callback port).
            await port.wait_for(writer.drain(), p["bound_s"])
            out.update(released=True, release_reason="resume")
        except TimeoutError:
            out.update(released=False)
        except ConnectionError:
            out.update(released=True, release_reason="error")
        writer.transport.abort()
    return _stream(job, main, p["max_s"])


def _run_parked(ctx):
    p = ctx.params
    # The client takes one byte and resets. The writer has parked by then: it fills
    # the buffer to a pause in the same callback that saw the connection.
    ran = run_program(ctx, max_s=p["max_s"] + 2, peers=[peers.reset_peer(
        listen="127.0.0.1:0", after_bytes=1, sockbuf=SOCKBUF, max_s=p["max_s"])])
    released = ran.app.get("released")
    m = {"released": released, "release_reason": ran.app.get("release_reason")}
    return m, {"bug_shown": released is False}, _notes(ran.app)


_add(Entry(
    id="uvicorn-2754",
    title="a task parked in drain() is never released after the client disconnects",
    link="https://github.com/Kludex/uvicorn/issues/2754",
    mechanism="uvicorn's own flow control parks a sender until resume_writing() and its "
              "connection_lost did not wake it. When a client disconnects mid-stream the "
              "sender stays parked forever, leaking the task and its buffers.",
    reported="uvicorn 0.38 on Python 3.13",
    fixed_in="wake the drain waiters in connection_lost (asyncio's own drain() does)",
    framing="no HTTP: a raw stream to a client that stops reading and disconnects",
    expected="shown on every callback runtime with the naive protocol (an application bug); "
             "asyncio's, uvloop's and hybrid's drain() are released by the loss",
    oracle="bug shown when the parked writer was still parked bound_s after the connection "
           "was lost",
    styles=("callback", "stream"),
    show_on=("callback", "asyncio-protocol")),
    _run_parked,
    [Metric("released", None, "released", unit="flag"),
     Metric("release_reason", None, "released by", unit="text")],
    _presets({"bound_s": 1.0, "max_s": 6}),
    _by_style(_parked_cb, _parked_stream))


# ---------------------------------------------------------------------------
# starlette 1012: an unbounded queue between producer and socket

def _queue_program(job):
    p = job.params
    fixed = job.variant == "fixed"
    task_style = job.runtime.style == "task"

    async def main(port, out):
        if task_style:
            stream = await _open_task(port, job.peer("reader"))
            send = stream.send_all
        else:
            reader, writer = await _open(port, job.peer("reader"))

            async def send(data):
                writer.write(data)
                await writer.drain()
        queue, st = [], {"queued": 0, "peak": 0, "done": False}
        chunk = bytes(p["chunk_bytes"])

        async def producer():
            for _ in range(p["chunks"]):
                while fixed and len(queue) >= p["maxsize"]:
                    await port.sleep(p["interval_s"] / 2)
                queue.append(chunk)
                st["queued"] += len(chunk)
                st["peak"] = max(st["peak"], st["queued"])
                await port.sleep(p["interval_s"])
            st["done"] = True

        async def sender():
            while not (st["done"] and not queue):
                if not queue:
                    await port.sleep(p["interval_s"] / 2)
                    continue
                data = queue.pop(0)
                st["queued"] -= len(data)
                await send(data)

        if task_style:
            async with port.open_nursery() as n:
                await n.spawn(producer)
                await n.spawn(sender)
            await stream.aclose()
        else:
            await port.gather(port.create_task(producer()), port.create_task(sender()))
            writer.close()
            await writer.wait_closed()
        out["app_queue_peak_bytes"] = st["peak"]
    runner = _task if task_style else _stream
    return runner(job, main, p["max_s"])


def _run_queue(ctx):
    p = ctx.params
    ran = run_program(ctx, max_s=p["max_s"] + 2, peers=[peers.reader(
        sockbuf=SOCKBUF, rate_Bps=p["reader_Bps"], max_s=p["max_s"])])
    peak = ran.app.get("app_queue_peak_bytes")
    return ({"app_queue_peak_bytes": peak, "delivered_bytes": ran.peers["reader"].get("received_bytes")},
            {"bug_shown": peak is not None and peak > 1 * MiB}, _notes(ran.app))


_add(Entry(
    id="starlette-1012",
    title="an unbounded queue between producer and socket: a slow client grows memory",
    link="https://github.com/encode/starlette/issues/1012",
    mechanism="A streaming response put every chunk the producer made into an unbounded "
              "queue and a second task sent them. Backpressure on the socket stops the sender, "
              "not the producer, so a slow client makes the queue grow without bound.",
    reported="starlette 0.13 (StreamingResponse / BaseHTTPMiddleware)",
    fixed_in="a bounded queue (or no queue): the producer waits when it is full",
    framing="no HTTP: a producer task, a sender task and a raw socket",
    expected="shown on every stream and task runtime with the unbounded queue, even though "
             "the sender uses drain() or send_all; a bounded queue holds the producer back",
    oracle="bug shown when the queue peaks above 1 MiB",
    styles=("stream", "task"),
    show_on=("hybrid", "coro", "trio")),
    _run_queue,
    [Metric("app_queue_peak_bytes", "lower", "queue peak"), Metric("delivered_bytes", None, "delivered")],
    _presets({"chunks": 120, "chunk_bytes": 32 * KiB, "interval_s": 0.005, "maxsize": 4,
              "reader_Bps": 1_000_000, "max_s": 10}),
    {"stream": _queue_program, "task": _queue_program})


# ---------------------------------------------------------------------------
# home-assistant 89905 / aiohttp 9572: a drain limit that is too strict

def _strict_stream(job):
    p = job.params

    async def main(port, out):
        reader, writer = await _open(port, job.peer("reader"), p["sockbuf"])
        t = writer.transport
        high = p["strict_high"] if job.variant == "naive" else p["roomy_high"]
        t.set_write_buffer_limits(high=high)
        msg = bytes(p["message_bytes"])
        held = waits = 0
        worst = 0.0
        for _ in range(p["bursts"]):
            for _ in range(p["burst_messages"]):
                writer.write(msg)
            if t.get_write_buffer_size() > high:
                held += 1
            t0 = time.monotonic()
            await writer.drain()
            worst = max(worst, time.monotonic() - t0)
            waits += 1
            await port.sleep(p["interval_s"])
        writer.close()
        await writer.wait_closed()
        out.update(held_back_fraction=held / waits, worst_drain_s=worst)
    return _stream(job, main, p["max_s"])


def _run_strict(ctx):
    p = ctx.params
    ran = run_program(ctx, max_s=p["max_s"] + 2, peers=[peers.reader(
        sockbuf=p["sockbuf"], rate_Bps=p["reader_Bps"], max_s=p["max_s"])])
    f = ran.app.get("held_back_fraction")
    return ({"held_back_fraction": f, "worst_drain_s": ran.app.get("worst_drain_s")},
            {"bug_shown": f is not None and f > 0.25}, _notes(ran.app))


_add(Entry(
    id="home-assistant-89905", aliases=("aiohttp-9572",),
    title="a drain limit that is too strict: latency spikes under load",
    link="https://github.com/home-assistant/core/issues/89905",
    mechanism="With a 16 KiB high-water mark every burst of messages pauses the writer and "
              "drain() waits for the buffer to fall to the low-water mark, even though the "
              "client keeps up on average. Each burst then waits for the slowest moment of "
              "the socket: latency spikes without any overload.",
    reported="aiohttp 3.8 websockets in Home Assistant 2023.3",
    fixed_in="aiohttp raised the writer's limit (aiohttp 9572); the writer must be sized to "
             "its bursts",
    framing="no websocket framing: bursts of 8 KiB messages to a client reading at 4 MB/s "
            "with small socket buffers",
    expected="shown on every stream runtime with a 16 KiB mark; not with a mark that holds "
             "one burst",
    oracle="bug shown when more than a quarter of the bursts left the buffer above the mark "
           "(drain() had to wait) while the client reads faster than the average offered rate",
    styles=("stream",),
    show_on=("hybrid", "asyncio-streams")),
    _run_strict,
    [Metric("held_back_fraction", "lower", "bursts held back"),
     Metric("worst_drain_s", "lower", "worst drain", timing=True)],
    _presets({"strict_high": 16 * KiB, "roomy_high": 256 * KiB, "message_bytes": 8 * KiB,
              "burst_messages": 12, "bursts": 30, "interval_s": 0.04, "reader_Bps": 4_000_000,
              "sockbuf": 8 * KiB, "max_s": 8}),
    {"stream": _strict_stream})


# ---------------------------------------------------------------------------
# trio 1626: a send under fail_after(0) fails even when it would not block

def _zero_task(job):
    p = job.params

    async def main(port, out):
        stream = await _open_task(port, job.peer("reader"))
        failed = 0
        for _ in range(p["trials"]):
            try:
                if job.variant == "naive":
                    async with port.fail_after(0):
                        await stream.send_all(b"x" * p["send_bytes"])
                else:
                    # The deadline is checked by the program, not by the checkpoint in send.
                    await stream.send_all(b"x" * p["send_bytes"])
            except (TimeoutError, port.Cancelled) as exc:
                failed += 1
                out["raised"] = type(exc).__name__
            except Exception as exc:   # noqa: BLE001 -- trio's TooSlowError is not a TimeoutError
                failed += 1
                out["raised"] = type(exc).__name__
        await stream.aclose()
        out["failed_fraction"] = failed / p["trials"]
    return _task(job, main, p["max_s"])


def _run_zero(ctx):
    p = ctx.params
    ran = run_program(ctx, max_s=p["max_s"] + 2, peers=[peers.reader(sockbuf=SOCKBUF, max_s=p["max_s"])])
    f = ran.app.get("failed_fraction")
    notes = _notes(ran.app) + ([f"raised {ran.app['raised']}"] if ran.app.get("raised") else [])
    return {"failed_fraction": f}, {"bug_shown": f is not None and f > 0.5}, notes


_add(Entry(
    id="trio-1626",
    title="a send under fail_after(0) fails even when it would not block",
    link="https://github.com/python-trio/trio/issues/1626",
    mechanism="In trio every send is a checkpoint, and a checkpoint inside an expired cancel "
              "scope raises, whether or not the operation would have had to wait. A send "
              "wrapped in fail_after(0) (\"only if it is free\") therefore always fails.",
    reported="trio 0.16 (memory channels; the same for stream sends)",
    fixed_in="by design: use the non-blocking spelling (send_nowait) or check the deadline "
             "yourself",
    expected="shown on trio; not on curio or coro, where an expired deadline is delivered "
             "only when a task blocks (coro:io_schedule_point=true makes the send yield, but "
             "the deadline is still not checked there: measured); shown on coro with "
             "deadline_check=at-checkpoint and io_schedule_point=true (trio's two rules)",
    oracle="bug shown when more than half of the small sends to a reading peer failed",
    styles=("task",),
    flips=(Flip("coro:io_schedule_point=true,deadline_check=at-checkpoint", True,
                "every send is a checkpoint and a checkpoint checks the deadline (trio)"),
           Flip("coro:io_schedule_point=true", False,
                "every send is a checkpoint, but the deadline is delivered only when the "
                "task blocks (deadline_check=when-blocked, the default)")),
    show_on=("trio",)),
    _run_zero, [Metric("failed_fraction", "lower", "sends failed")],
    _presets({"trials": 20, "send_bytes": 100, "max_s": 5}),
    {"task": _zero_task})
