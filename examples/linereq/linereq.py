"""A user's scenario in one file: a line-based request/response service whose handler
is slower than its client sends.

The client pipelines many short request lines (``REQ 17\\n``) as fast as the OS
takes them and never reads a response. Every request costs the handler
``handler_s`` seconds (a stand-in for a database call) and is answered with
``response_bytes``. The question: on which runtimes do the requests pile up in user
space, and where does backpressure hold them at the socket, so that the client
itself is slowed down?

The same service is written once per port style, as a user would write it:

callback  a Protocol whose ``data_received`` queues the lines; a timer chain answers
          them one at a time with ``transport.write``. ``naive`` ignores flow
          control; ``fixed`` pauses reading while its queue is full and stops
          answering between ``pause_writing`` and ``resume_writing``.
stream    a ``reader.readline()`` loop that sleeps, then ``writer.write``s the
          answer; ``fixed`` adds ``await writer.drain()``.
task      ``receive_some`` + ``send_all``: naive and fixed are the same code.

Ground truth comes from the client peer: how many requests the OS took from it
(``requests_sent_count``). The service counts the requests it has read and not yet
answered; the port's probe gives the response bytes waiting in the write buffer and,
on the stream style, the reader's read-ahead, which is user space too. Requests in
user space is the service's own peak plus the read-ahead peak: an upper bound, as the
two peaks need not coincide. ``rss_growth_bytes`` counts from before the program opens
its port, so on the reference libraries it includes importing them (2-4 MB).

Run it with the unmodified CLI (``--scenarios LINEREQ`` keeps the built-in S1-S8 out
of the run)::

    looplab run --scenario-file examples/linereq/linereq.py --scenarios LINEREQ \
        --runtimes all --preset tiny

Why the service dials the client: ``run_program`` hands a program the addresses of
*listening* peers, so the client peer listens and the service connects to it. The
bytes flow exactly as they would if the service had accepted the connection.
"""
from __future__ import annotations

import collections

from bench import peers
from bench.scenarios import Bars, Metric, Outcome, Scenario, run_program

KiB = 1024


class _Held:
    """What the service holds in user space: requests read and not yet answered."""

    def __init__(self):
        self.count = self.bytes = 0
        self.peak_count = self.peak_bytes = 0
        self.handled = 0
        self.ended = "running"

    def add(self, n_requests: int, n_bytes: int) -> None:
        self.count += n_requests
        self.bytes += n_bytes
        self.peak_count = max(self.peak_count, self.count)
        self.peak_bytes = max(self.peak_bytes, self.bytes)

    def answered(self, n_bytes: int) -> None:
        self.count -= 1
        self.bytes -= n_bytes
        self.handled += 1

    def result(self, port) -> dict:
        probe = port.probe()
        return {"handled": self.handled, "held_peak_count": self.peak_count,
                "held_peak_bytes": self.peak_bytes, "ended": self.ended,
                "peak_user_buffer_bytes": probe.get("peak_user_buffer_bytes"),
                "reader_buffer_peak_bytes": probe.get("reader_buffer_peak_bytes")}


# ---------------------------------------------------------------------------
# callback style: asyncio's Protocol and Transport

class LineService:
    """One connection. ``data_received`` splits lines into a queue; ``_next`` answers
    the oldest after ``handler_s``, one at a time."""

    def __init__(self, port, held: _Held, p: dict, fixed: bool):
        self.port, self.held, self.p, self.fixed = port, held, p, fixed
        self.partial = b""
        self.queue: collections.deque = collections.deque()
        self.transport = None
        self.busy = self.write_paused = self.read_paused = False

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        self.held.add(0, len(data))
        for line in lines:
            self.queue.append(line)           # the request, kept until it is answered
            self.held.add(1, 0)
        if self.fixed and len(self.queue) >= self.p["queue_limit"] and not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()    # the rest waits in the socket
        self._kick()

    def _kick(self):
        if not self.busy and self.queue and not self.write_paused:
            self.busy = True
            self.port.call_later(self.p["handler_s"], self._next)

    def _next(self):
        self.busy = False
        if self.transport is None or self.transport.is_closing() or not self.queue:
            return
        self.transport.write(b"x" * self.p["response_bytes"])
        self.held.answered(len(self.queue.popleft()) + 1)
        if self.read_paused and len(self.queue) <= self.p["queue_limit"] // 2:
            self.read_paused = False
            self.transport.resume_reading()
        self._kick()

    def pause_writing(self):
        if self.fixed:          # naive carries on: pause_writing is advisory
            self.write_paused = True

    def resume_writing(self):
        self.write_paused = False
        self._kick()

    def eof_received(self):
        return True

    def connection_lost(self, exc):
        if self.held.ended == "running":      # not our own abort at the end of the run
            self.held.ended = "reset" if exc else "closed"
        self.transport = None


def callback_program(job):
    p, held, fixed = job.params, _Held(), job.variant != "naive"
    host, tcp_port = job.peer("client")
    port = job.runtime.open()
    state = {}

    def on_done(transport, protocol, exc):
        if exc is not None:
            held.ended = f"connect failed: {exc}"
            port.stop()
            return
        state["transport"] = transport

    def finish():
        held.ended = "timeout"
        transport = state.get("transport")
        if transport is not None and not transport.is_closing():
            transport.abort()            # drop the backlog: the client never reads it
        port.stop()

    def setup(port):
        port.connect(lambda: LineService(port, held, p, fixed), host, tcp_port, on_done,
                     sockbuf=p["sockbuf"])
        port.call_later(p["duration_s"], finish)

    try:
        port.run(setup)
        return held.result(port)
    finally:
        port.close()


# ---------------------------------------------------------------------------
# stream style: asyncio's StreamReader and StreamWriter

async def stream_main(port, host, tcp_port, p, held, fixed):
    reader, writer = await port.open_connection(host, tcp_port, sockbuf=p["sockbuf"])

    async def serve():
        try:
            while line := await reader.readline():
                held.add(1, len(line))
                await port.sleep(p["handler_s"])
                writer.write(b"x" * p["response_bytes"])
                held.answered(len(line))
                if fixed:
                    await writer.drain()
            held.ended = "eof"
        except ConnectionError:
            held.ended = "reset"

    task = port.create_task(serve())
    try:
        await port.wait_for(task, p["duration_s"])
    except (TimeoutError, port.TimeoutError):
        held.ended = "timeout"
    writer.transport.abort()


def stream_program(job):
    held = _Held()
    port = job.runtime.open()
    try:
        port.run(stream_main, *job.peer("client"), job.params, held, job.variant != "naive")
        return held.result(port)
    finally:
        port.close()


# ---------------------------------------------------------------------------
# task style: trio's Stream

async def task_main(port, host, tcp_port, p, held):
    stream = await port.open_tcp_stream(host, tcp_port, sockbuf=p["sockbuf"])
    partial = b""
    async with port.move_on_after(p["duration_s"]):
        try:
            while data := await stream.receive_some(p["read_bytes"]):
                lines = (partial + data).split(b"\n")
                partial = lines.pop()
                held.add(len(lines), len(data))
                for line in lines:
                    await port.sleep(p["handler_s"])
                    await stream.send_all(b"x" * p["response_bytes"])
                    held.answered(len(line) + 1)
            held.ended = "eof"
        except port.StreamError:
            held.ended = "reset"
    if held.ended == "running":
        held.ended = "timeout"
    await stream.aclose()


def task_program(job):
    held = _Held()
    port = job.runtime.open()
    try:
        port.run(task_main, *job.peer("client"), job.params, held)
        return held.result(port)
    finally:
        port.close()


# ---------------------------------------------------------------------------
# The scenario: the client peer, the numbers, the oracles

def run(ctx) -> Outcome:
    p = ctx.params
    client = peers.pipeline_client("client", listen="127.0.0.1:0", count=p["count"],
                                   hold_s=p["duration_s"] + 2, sockbuf=p["sockbuf"],
                                   max_s=p["duration_s"] + 8)
    ran = run_program(ctx, peers=[client], max_s=p["duration_s"] + 10)
    app, peer = ran.app, ran.peers["client"]
    reader_peak = app.get("reader_buffer_peak_bytes")
    in_user_space = app["held_peak_bytes"] + (reader_peak or 0)
    metrics = {
        "requests_sent_count": peer.get("requests_sent"),
        "requests_handled_count": app["handled"],
        "waiting_peak_count": app["held_peak_count"],
        "requests_in_user_space_peak_bytes": in_user_space,
        "reader_buffer_peak_bytes": reader_peak,
        "peak_user_buffer_bytes": app.get("peak_user_buffer_bytes"),
        "rss_growth_bytes": app.get("rss_growth_bytes"),
        "client_unread_bytes": peer.get("unread_bytes"),
    }
    notes = []
    if ctx.style == "task" and ctx.variant in ("naive", "fixed"):
        notes.append("task port: naive and fixed are the same code (send_all blocks)")
    if app["ended"] not in ("timeout", "running"):
        notes.append(f"the connection ended early: {app['ended']}")
    if peer.get("requests_sent") == p["count"]:
        notes.append(f"the client sent all {p['count']} requests without blocking")
    buffered = metrics["peak_user_buffer_bytes"]
    responses_ok = buffered is None or buffered <= p["response_bound_bytes"]
    if buffered is None:
        notes.append("the write buffer is not observable on this runtime")
    verdicts = {"bounded": in_user_space <= p["bound_bytes"],
                "responses_bounded": responses_ok}
    return Outcome(metrics, verdicts, notes)


_BASE = {"sockbuf": 64 * KiB, "handler_s": 0.001, "response_bytes": 4 * KiB,
         "read_bytes": 65536, "queue_limit": 64,
         # Requests held in user space may reach a stream reader's read-ahead: twice
         # its 64 KiB limit plus one recv, which the pinned socket buffer keeps under
         # 128 KiB. More means the service kept reading while it could not keep up.
         "bound_bytes": 256 * KiB,
         # Responses buffered in user space: high water (64 KiB) plus a response or two.
         "response_bound_bytes": 64 * KiB + 2 * 4 * KiB}

SCENARIO = Scenario(
    id="LINEREQ", title="pipelined lines to a slow handler", run=run,
    programs={"callback": callback_program, "stream": stream_program, "task": task_program},
    summary="A client pipelines short request lines much faster than the service's handler "
            "answers them, and never reads. Do the requests pile up in user space, or does "
            "backpressure leave them in the socket and slow the client down?",
    variants=("naive", "fixed"), peers=("pipeline_client",),
    presets={"tiny": {**_BASE, "count": 150_000, "duration_s": 2.0},
             "quick": {**_BASE, "count": 200_000, "duration_s": 3.0},
             "blog": {**_BASE, "count": 400_000, "duration_s": 10.0}},
    metrics=(
        Metric("requests_sent_count", None, "client sent"),
        Metric("requests_handled_count", None, "handled"),
        Metric("waiting_peak_count", "lower", "waiting (app queue) peak"),
        Metric("requests_in_user_space_peak_bytes", "lower", "requests in user space"),
        Metric("reader_buffer_peak_bytes", "lower", "reader read-ahead"),
        Metric("peak_user_buffer_bytes", "lower", "response buffer peak"),
        Metric("rss_growth_bytes", None, "RSS growth"),
        Metric("client_unread_bytes", None, "responses at the client"),
    ),
    verdicts={"bounded": "request bytes held in user space stay within a stream reader's "
                         "read-ahead (bound_bytes, 256 KiB)",
              "responses_bounded": "responses buffered in user space stay within high water "
                                   "plus two responses"},
    columns=("requests_sent_count", "requests_handled_count", "waiting_peak_count",
             "requests_in_user_space_peak_bytes", "peak_user_buffer_bytes", "rss_growth_bytes"),
    plots=(Bars("requests_in_user_space_peak_bytes", "request bytes held in user space (MB)", 1e-6),))
