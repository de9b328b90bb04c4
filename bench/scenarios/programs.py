"""The client-side programs of S3, S7 and S8: the application half of a shutdown story.

Each program connects to a peer (in the scenarios a blocking ``reader`` in
another process, ``bench.peers``), writes, and then ends the way the scenario
says -- closes and returns, times out, or returns while a background task is
still sending. What it returns is the *app side* of the story: what the write
API accepted (``bytes_accepted``, from the runtime's probe), what the exit policy
did with the leftovers (``exit_report``), what the runtime printed or logged on
the way out (``warnings``) and a ``note`` where the style could not do what the
variant names. The other half, what actually arrived, is the peer's to say --
the difference between the two is the data a program lost.

Programs are written once per style, against the port API, and every runtime
accepts every variant name:

S3 ``s3_shutdown`` variants
  stream:   naive     write; close; return                  (asyncio.run ends)
            drain     write; await drain(); close; return
            limits0   set_write_buffer_limits(0); write; drain; close; return
            fixed     write; close; await wait_closed(); return
            stop-2016 limits0 + drain + close, then the loop is *stopped* -- not closed,
                      its transports untouched -- and the process lives on: the close
                      never ran (the 2016 shape)
  callback: naive     transport.write; close; stop at once
            fixed     write; close; stop in connection_lost
            drain     write; close once resume_writing came (or at once if never paused);
                      stop at once -- the callback spelling of "await drain()"
            limits0   set_write_buffer_limits(0); then as drain (resume comes at empty)
            stop-2016 limits0, stop at once, the loop left stopped and unclosed
  task:     every variant is ``send_all; aclose`` -- the same code (the post's point)

S7 ``s7_timeout``: write, time out after ``timeout_s``, close. Stream: the
``wait_for(drain())`` times out but the bytes stay in the transport, which keeps
sending after the close (a "zombie write"); task: ``move_on_after`` around
``send_all`` stops the write, and curio (and our coro) say how far it got in the
exception's ``bytes_sent``; callback: ``call_later(timeout_s, close)``.

S8 ``s8_background``: main starts a background sender and returns after 0.1 s.
Stream: ``create_task`` (asyncio.run cancels it); task: a spawn nobody joins where
the library has one (curio, coro: cancelled, silently), a nursery where it
doesn't (trio: the nursery waits -- it cannot lose); callback: a timer-driven
writer chain, the loop stopped by main after 0.1 s.

The 2016 shape leaves a port open on purpose, so a caller can keep the process
alive and let the peer see that EOF never comes. Such ports are kept in
``HELD``; ``release_held()`` closes them (and runs at interpreter exit).

Hazards. The peer must be slow enough for a shutdown to find bytes in flight:
S3 and S8 need a reader that starts late (0.3 s and more) or is rate limited,
otherwise a fast loopback reader empties every buffer before the program ends
and nothing can be lost. Every program is bounded by ``max_s``; a program that
hits the bound returns ``error`` rather than hanging.
"""
from __future__ import annotations

import atexit
import contextlib
import gc
import io
import logging
import sys
import time
import warnings

from bench.errors import CRASH_KEY
from bench.scenarios.properties import observe
from bench import runtimes

__all__ = ["s3_shutdown", "s7_timeout", "s8_background", "S3_VARIANTS", "HELD", "release_held",
           "capture_output", "own_garbage"]

S3_VARIANTS = ("naive", "drain", "limits0", "fixed", "stop-2016")
SOCKBUF = 64 * 1024
CHUNK = 64 * 1024                 # the background writers' write size
SAME_CODE_NOTE = "task port: every variant is the same code (send_all; aclose): send_all blocks"
HELD: list = []                   # ports the 2016 shape left stopped and open


# ---------------------------------------------------------------------------
# What a runtime says on the way out.

class _ListHandler(logging.Handler):
    def __init__(self, lines: list):
        super().__init__(logging.WARNING)
        self.lines = lines

    def emit(self, record):
        try:
            text = f"{record.levelname} {record.name}: {record.getMessage()}"
        except Exception:   # noqa: BLE001 -- a malformed record must not break the program
            text = f"{record.levelname} {record.name}: {record.msg!r}"
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None:
            text += f" [{type(exc).__name__}: {exc}]"
        self.lines.append(text)


class capture_output:
    """Collect what a runtime prints or logs while a program runs, as lines:
    warnings (``ResourceWarning: unclosed ...``), log records at WARNING and above
    (asyncio's "Task was destroyed but it is pending!", curio's timeout notes) and
    whatever is written to ``sys.stderr`` (our kernels' one-line reports,
    unraisable-exception reports). A ``gc.collect()`` runs before the capture
    ends, so destructor warnings land inside it; inside ``own_garbage()`` that
    collection walks only the objects allocated since it began.

    Hazard: it swaps ``sys.stderr`` and the warnings filters process-wide for its
    duration (not thread-safe, as ``warnings.catch_warnings`` is not); writes
    that bypass ``sys.stderr`` (C code writing to fd 2) are not seen.
    """

    def __enter__(self):
        self.lines: list[str] = []
        self._warn = warnings.catch_warnings(record=True)
        self._records = self._warn.__enter__()
        warnings.simplefilter("always")
        self._handler = _ListHandler(self.lines)
        logging.getLogger().addHandler(self._handler)
        self._stderr, sys.stderr = sys.stderr, io.StringIO()
        return self

    def __exit__(self, *exc):
        try:
            gc.collect()
        finally:
            text = sys.stderr.getvalue()
            sys.stderr = self._stderr
            logging.getLogger().removeHandler(self._handler)
            self._warn.__exit__(*exc)
            self.lines.extend(f"{w.category.__name__}: {w.message}" for w in self._records)
            self.lines.extend(line for line in text.splitlines() if line.strip())
        return False


_FROZEN = []     # own_garbage() frames that froze the heap (at most one: nested ones don't)


@contextlib.contextmanager
def own_garbage(collect: bool = False):
    """Make ``gc.collect()`` look only at objects allocated from here on.

    capture_output collects so that the destructor reports of a program's own
    cyclic garbage (a task destroyed while pending, an exception never
    retrieved, an unclosed transport) land inside the capture. A full
    collection walks the whole heap instead: every module, and in a ``looplab
    run --net sim`` process every earlier cell's leftovers too -- 5 to 15 ms,
    more than all the rest of a short simulated cell. Entered before the
    runtime is opened, this freezes what exists (``gc.freeze``), so the
    collection walks only the port and what the program made, and older
    garbage no longer shows up among this program's warnings.

    Nested inside another ``own_garbage`` it does nothing: the outer one's
    objects count as new. (looplab freezes the heap nowhere else; asking
    ``gc.get_freeze_count()`` would walk the frozen objects, which is what
    this avoids.)

    ``collect=True`` collects the new garbage at the end, before the rest of
    the heap is unfrozen: a sim cell (``bench.scenarios.simulated.cell_heap``) cleans up
    after itself at the cost of its own objects, not the heap's."""
    if _FROZEN:
        yield
        return
    gc.freeze()
    _FROZEN.append(True)
    try:
        yield
    finally:
        try:
            if collect:
                gc.collect()
        finally:
            _FROZEN.pop()
            gc.unfreeze()


# ---------------------------------------------------------------------------
# Shared plumbing

_ZEROS: list = []                 # [the last payload made]: at most one is kept


def _zeros(n: int) -> bytes:
    """``bytes(n)``, the payload a program writes. bytes are immutable, so one
    object serves every program of that size: a process that runs many
    programs (``looplab run --net sim``) does not zero 8 MB again for each,
    which cost more than the rest of a short simulated cell."""
    if not _ZEROS or len(_ZEROS[0]) != n:
        _ZEROS[:] = [bytes(n)]
    return _ZEROS[0]


def _check(runtime_spec, addr, total_bytes, sockbuf, max_s):
    rt = runtimes.as_runtime(runtime_spec)
    if isinstance(addr, str) or not hasattr(addr, "__len__") or len(addr) != 2:
        raise TypeError(f"addr must be a (host, port) pair, got {addr!r}")
    host, port = addr
    if not isinstance(host, str) or isinstance(port, bool) or not isinstance(port, int):
        raise TypeError(f"addr must be a (host, port) pair of str and int, got {addr!r}")
    if not 0 < port < 65536:
        raise ValueError(f"port must be 1..65535, got {port}")
    if isinstance(total_bytes, bool) or not isinstance(total_bytes, int):
        raise TypeError(f"total_bytes must be an int, got {type(total_bytes).__name__}")
    if total_bytes <= 0:
        raise ValueError(f"total_bytes must be > 0, got {total_bytes}")
    if sockbuf is not None and (isinstance(sockbuf, bool) or not isinstance(sockbuf, int)
                                or sockbuf <= 0):
        raise ValueError(f"sockbuf must be a positive int or None, got {sockbuf!r}")
    if not isinstance(max_s, (int, float)) or isinstance(max_s, bool) or max_s <= 0:
        raise ValueError(f"max_s must be a positive number of seconds, got {max_s!r}")
    return rt, (host, port)


def _result(program, rt, port, captured, note="", **extra) -> dict:
    probe = port.probe()
    out = {"program": program, "runtime": rt.spec, "style": rt.style,
           "bytes_accepted": probe.get("accepted_bytes"),
           "probe": probe, "exit_report": probe.get("exit", {}),
           "warnings": captured.lines, "note": note}
    out.update(extra)
    error = out.pop("error", None)
    if error is not None:       # the program failed: the cell is an error
        out[CRASH_KEY] = error
    return out


class _Proto:
    """A plain callback-port protocol (the six asyncio methods) for the programs:
    it remembers its transport, whether it is paused, and calls hooks."""

    def __init__(self):
        self.transport = None
        self.paused = False
        self.lost = False
        self.lost_exc = None
        self.on_resume = None
        self.on_lost = None

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        pass

    def eof_received(self):
        return None

    def connection_lost(self, exc):
        self.lost, self.lost_exc = True, exc
        if self.on_lost is not None:
            self.on_lost()

    def pause_writing(self):
        self.paused = True

    def resume_writing(self):
        self.paused = False
        hook, self.on_resume = self.on_resume, None
        if hook is not None:
            hook()


def _callback_program(port, addr, sockbuf, max_s, start, main_s=None):
    """Run a callback-port program: connect a _Proto and call ``start(port,
    transport, proto, state)`` from the loop. The loop runs until the program
    stops it, or ``main_s`` passes (S8's main stops it), or ``max_s`` passes (an
    error). Returns the state dict: ``error`` (None when all went well),
    ``proto`` (the connection's protocol) and whatever ``start`` put there."""
    state: dict = {"error": None, "proto": None}
    timers = []

    def setup(port):
        def bound():
            state["error"] = f"the program did not finish within {max_s} s"
            port.stop()
        timers.append(port.call_later(max_s, bound))
        if main_s is not None:
            timers.append(port.call_later(main_s, port.stop))

        def done(transport, proto, exc):
            if exc is not None:
                state["error"] = f"connect failed: {exc!r}"
                port.stop()
                return
            state["proto"] = proto
            start(port, transport, proto, state)
        port.connect(_Proto, addr[0], addr[1], done, sockbuf=sockbuf)

    port.run(setup)
    for t in timers:
        t.cancel()
    return state


def release_held() -> int:
    """Close the ports the 2016 shape left open (each gets the loop pass its
    close was waiting for first). Returns how many were closed."""
    n = 0
    while HELD:
        port = HELD.pop()
        try:
            if port.style == "callback":
                if not port.loop.is_closed():
                    port.call_soon(port.stop)
                    port.run(lambda port: None)
            port.close()
        finally:
            n += 1
    return n


atexit.register(release_held)


# ---------------------------------------------------------------------------
# S3

def s3_shutdown(runtime_spec: str, addr, total_bytes: int, variant: str, *,
                sockbuf: int | None = SOCKBUF, max_s: float = 30.0) -> dict:
    """Connect to ``addr``, write ``total_bytes``, close, end the loop -- the way
    ``variant`` says (see the module docstring) -- on a fresh port of
    ``runtime_spec``. Returns {"bytes_accepted", "probe", "exit_report",
    "warnings", "note", ...}; ``error`` if the program could not run.

    ``stop-2016`` returns with the loop stopped and the port still open (in
    ``HELD``): the caller keeps the process alive and asks its peer whether EOF
    ever came, then calls ``release_held()`` (or lets the process exit)."""
    rt, addr = _check(runtime_spec, addr, total_bytes, sockbuf, max_s)
    if variant not in S3_VARIANTS:
        raise ValueError(f"unknown S3 variant {variant!r}; valid variants: {', '.join(S3_VARIANTS)}")
    held = False
    with own_garbage():
        port = rt.open()
        with capture_output() as captured:
            try:
                if rt.style == "callback":
                    extra, held = _s3_callback(port, addr, total_bytes, variant, sockbuf, max_s)
                elif rt.style == "stream":
                    extra, held = _s3_stream(port, addr, total_bytes, variant, sockbuf, max_s)
                else:
                    extra = _s3_task(port, addr, total_bytes, sockbuf, max_s)
            finally:
                if held:
                    HELD.append(port)
                else:
                    port.close()
    extra.setdefault("note", "")
    return _result("s3_shutdown", rt, port, captured, variant=variant,
                   loop_stopped_at=extra.pop("stopped_at", None), held_open=held, **extra)


def _s3_callback(port, addr, total, variant, sockbuf, max_s):
    notes = {"drain": "callback port: drain = close once resume_writing came (no drain() here)",
             "limits0": "callback port: set_write_buffer_limits(0), close once resume_writing came",
             "stop-2016": "callback port: limits0, close after resume, stop at once; "
                          "the loop is left stopped and unclosed"}
    stopped = {}

    def stop():
        stopped["at"] = time.monotonic()
        port.stop()

    def start(port, transport, proto, state):
        if variant in ("limits0", "stop-2016"):
            transport.set_write_buffer_limits(0)
        observe(s3_written_bytes=total, s3_protocol=proto)   # what S3's properties read
        transport.write(_zeros(total))

        def close():
            state["buffered_at_close_bytes"] = transport.get_write_buffer_size()
            transport.close()
            if variant == "fixed":
                proto.on_lost = stop
            else:
                stop()
        if variant in ("drain", "limits0", "stop-2016") and proto.paused:
            # Close on the pass after resume_writing, as a task resumed by drain()
            # would: asyncio's transport calls resume_writing from its write-ready
            # handler, and a close() made inside it runs connection_lost twice.
            proto.on_resume = lambda: port.call_soon(close)
        else:
            close()

    state = _callback_program(port, addr, sockbuf, max_s, start)
    held = variant == "stop-2016" and state["error"] is None
    extra = {"note": notes.get(variant, ""), "error": state["error"],
             "stopped_at": stopped.get("at"),
             "buffered_at_close_bytes": state.get("buffered_at_close_bytes")}
    return extra, held


async def _s3_stream_main(port, addr, total, variant, sockbuf, state):
    reader, writer = await port.open_connection(addr[0], addr[1], sockbuf=sockbuf)
    if variant in ("limits0", "stop-2016"):
        writer.transport.set_write_buffer_limits(0)
    # what S3's properties read (the protocol: whether a drain() waiter is parked)
    observe(s3_written_bytes=total, s3_protocol=getattr(writer, "_protocol", None))
    writer.write(_zeros(total))
    if variant in ("drain", "limits0", "stop-2016"):
        await writer.drain()
    state["buffered_at_close_bytes"] = writer.transport.get_write_buffer_size()
    writer.close()
    if variant == "fixed":
        await writer.wait_closed()
    state["stopped_at"] = time.monotonic()


def _s3_stream(port, addr, total, variant, sockbuf, max_s):
    state: dict = {}
    if variant != "stop-2016":
        async def main(port):
            try:
                async with port.timeout(max_s):
                    await _s3_stream_main(port, addr, total, variant, sockbuf, state)
            except TimeoutError:
                state["error"] = f"the program did not finish within {max_s} s"
            except OSError as exc:
                state["error"] = f"{type(exc).__name__}: {exc}"
        port.run(main)
        return {"error": state.get("error"), "stopped_at": state.get("stopped_at"),
                "buffered_at_close_bytes": state.get("buffered_at_close_bytes")}, False

    # The 2016 shape: run_forever, the coroutine stops the loop itself right
    # after close(); the close's connection_lost is still queued when it stops.
    # Both stream ports' runners (asyncio.Runner, our hybrid Runner) hand out
    # their loop with get_loop(); both loops have run_forever() and stop().
    loop = port.runner.get_loop()
    tasks = []

    async def main_2016():
        try:
            await _s3_stream_main(port, addr, total, variant, sockbuf, state)
        except OSError as exc:
            state["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            loop.stop()

    def bound():
        state["error"] = f"the program did not finish within {max_s} s"
        loop.stop()

    watchdog = loop.call_later(max_s, bound)
    loop.call_soon(lambda: tasks.append(port.create_task(main_2016())))
    loop.run_forever()
    watchdog.cancel()
    held = state.get("error") is None
    return {"note": "stream port: the loop was stopped from the coroutine right after close() "
                    "and left unclosed (run_forever + loop.stop(), as in 2016); no exit report: "
                    "the loop was never closed",
            "error": state.get("error"), "stopped_at": state.get("stopped_at"),
            "buffered_at_close_bytes": state.get("buffered_at_close_bytes")}, held


def _s3_task(port, addr, total, sockbuf, max_s):
    state: dict = {}

    async def main(port):
        async with port.move_on_after(max_s) as scope:
            try:
                stream = await port.open_tcp_stream(addr[0], addr[1], sockbuf=sockbuf)
            except OSError as exc:
                state["error"] = f"{type(exc).__name__}: {exc}"
                return
            try:
                observe(s3_written_bytes=total)      # what S3's properties read
                await stream.send_all(_zeros(total))
            except Exception as exc:  # noqa: BLE001 -- trio's BrokenResourceError is no OSError
                state["error"] = f"{type(exc).__name__}: {exc}"
            finally:
                await stream.aclose()
            state["stopped_at"] = time.monotonic()
        if scope.cancelled_caught:
            state["error"] = f"the program did not finish within {max_s} s"
    port.run(main)
    return {"note": SAME_CODE_NOTE, "error": state.get("error"), "stopped_at": state.get("stopped_at")}


# ---------------------------------------------------------------------------
# S7

def s7_timeout(runtime_spec: str, addr, total_bytes: int, timeout_s: float = 0.2, *,
               sockbuf: int | None = SOCKBUF, max_s: float = 30.0) -> dict:
    """Write ``total_bytes`` to a slow peer under a ``timeout_s`` timeout, then
    close (and, on the stream port, wait for the close, bounded by ``max_s``).
    Returns the common fields plus ``timed_out``, ``sent_at_timeout_bytes``
    (what the OS had taken when the timeout fired, where the app can know it)
    and ``bytes_sent_known`` (the task style's ``bytes_sent`` from the
    cancellation, if the library puts it there; None otherwise)."""
    rt, addr = _check(runtime_spec, addr, total_bytes, sockbuf, max_s)
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or timeout_s <= 0:
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    with own_garbage():
        port = rt.open()
        with capture_output() as captured:
            try:
                fn = {"callback": _s7_callback, "stream": _s7_stream, "task": _s7_task}[rt.style]
                extra = fn(port, addr, total_bytes, timeout_s, sockbuf, max_s)
            finally:
                port.close()
    return _result("s7_timeout", rt, port, captured, timeout_s=timeout_s, **extra)


def _s7_callback(port, addr, total, timeout_s, sockbuf, max_s):
    out: dict = {}

    def start(port, transport, proto, state):
        transport.write(_zeros(total))

        def on_timeout():
            out["timed_out"] = True
            out["sent_at_timeout_bytes"] = total - transport.get_write_buffer_size()
            transport.close()
            proto.on_lost = port.stop
        port.call_later(timeout_s, on_timeout)

    state = _callback_program(port, addr, sockbuf, max_s, start)
    proto = state["proto"]
    return {"error": state["error"], "timed_out": out.get("timed_out", False),
            "sent_at_timeout_bytes": out.get("sent_at_timeout_bytes"),
            "close_completed": bool(proto and proto.lost),
            "bytes_sent_known": None,
            "note": "callback port: write(all); call_later(timeout, close) -- close() flushes "
                    "the buffer, so the write goes on after the timeout"}


def _s7_stream(port, addr, total, timeout_s, sockbuf, max_s):
    out: dict = {}

    async def main(port):
        try:
            reader, writer = await port.open_connection(addr[0], addr[1], sockbuf=sockbuf)
        except OSError as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"
            return
        writer.write(_zeros(total))
        try:
            await port.wait_for(writer.drain(), timeout_s)
            out["timed_out"] = False
        except port.TimeoutError:
            out["timed_out"] = True
        out["sent_at_timeout_bytes"] = total - writer.transport.get_write_buffer_size()
        writer.close()
        try:
            await port.wait_for(writer.wait_closed(), max_s)
            out["close_completed"] = True
        except port.TimeoutError:
            out["close_completed"] = False
            out["error"] = f"wait_closed() did not return within {max_s} s"
        except ConnectionError as exc:
            out["close_completed"] = True
            out["close_error"] = f"{type(exc).__name__}: {exc}"
    port.run(main)
    out.setdefault("timed_out", False)
    out.update(bytes_sent_known=None,
               note="stream port: wait_for(drain(), timeout) timed out but the bytes stay in "
                    "the transport, which keeps sending after close() (a zombie write)")
    return out


def _s7_task(port, addr, total, timeout_s, sockbuf, max_s):
    out: dict = {}

    async def main(port):
        try:
            stream = await port.open_tcp_stream(addr[0], addr[1], sockbuf=sockbuf)
        except OSError as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"
            return
        try:
            async with port.move_on_after(timeout_s) as scope:
                try:
                    await stream.send_all(_zeros(total))
                except (port.Cancelled, TimeoutError) as exc:   # coro's TaskTimeout is a TimeoutError
                    out["bytes_sent_known"] = getattr(exc, "bytes_sent", None)
                    out["cancelled_with"] = type(exc).__name__
                    raise
            out["timed_out"] = bool(scope.cancelled_caught)
        finally:
            try:
                await stream.aclose()
            except Exception as exc:  # noqa: BLE001 -- a broken stream may complain; report it
                out["close_error"] = f"{type(exc).__name__}: {exc}"
    port.run(main)
    known = out.setdefault("bytes_sent_known", None)
    out.setdefault("timed_out", False)
    out["note"] = ("task port: move_on_after(timeout) around send_all; the write stops there" +
                   ("" if known is not None or not out["timed_out"]
                    else "; the library does not say how much of it was sent"))
    return out


# ---------------------------------------------------------------------------
# S8

def s8_background(runtime_spec: str, addr, total_bytes: int, *, sockbuf: int | None = SOCKBUF,
                  main_s: float = 0.1, max_s: float = 30.0) -> dict:
    """Main starts a background sender of ``total_bytes`` and returns after
    ``main_s``; the runtime's exit policy decides the sender's fate. Returns the
    common fields plus ``background_sent_bytes`` (what the sender had handed to
    the write API when main returned, as far as the program knows)."""
    rt, addr = _check(runtime_spec, addr, total_bytes, sockbuf, max_s)
    if isinstance(main_s, bool) or not isinstance(main_s, (int, float)) or main_s < 0:
        raise ValueError(f"main_s must be a number of seconds >= 0, got {main_s!r}")
    with own_garbage():
        port = rt.open()
        with capture_output() as captured:
            try:
                fn = {"callback": _s8_callback, "stream": _s8_stream, "task": _s8_task}[rt.style]
                extra = fn(port, rt, addr, total_bytes, sockbuf, main_s, max_s)
            finally:
                port.close()
    return _result("s8_background", rt, port, captured, **extra)


def _s8_callback(port, rt, addr, total, sockbuf, main_s, max_s):
    progress = {"written": 0, "finished": False}
    data = memoryview(_zeros(total))

    def start(port, transport, proto, state):
        def write_next():
            if proto.lost:
                return
            if progress["written"] >= total:
                progress["finished"] = True
                transport.close()
                return
            if proto.paused:                # honour flow control: resume continues the chain
                proto.on_resume = write_next
                return
            n = min(CHUNK, total - progress["written"])
            transport.write(data[progress["written"]:progress["written"] + n])
            progress["written"] += n
            port.call_soon(write_next)
        write_next()

    state = _callback_program(port, addr, sockbuf, max_s, start, main_s=main_s)
    return {"error": state["error"], "background_sent_bytes": progress["written"],
            "background_finished": progress["finished"],
            "note": "callback port: a call_soon-driven writer chain (honouring pause_writing); "
                    f"main stops the loop after {main_s} s"}


def _s8_stream(port, rt, addr, total, sockbuf, main_s, max_s):
    progress = {"written": 0, "finished": False}

    async def background():
        reader, writer = await port.open_connection(addr[0], addr[1], sockbuf=sockbuf)
        data = memoryview(_zeros(total))
        while progress["written"] < total:
            n = min(CHUNK, total - progress["written"])
            writer.write(data[progress["written"]:progress["written"] + n])
            progress["written"] += n
            await writer.drain()
        writer.close()
        await writer.wait_closed()
        progress["finished"] = True

    async def main(port):
        port.create_task(background())
        await port.sleep(main_s)

    port.run(main)
    return {"background_sent_bytes": progress["written"], "background_finished": progress["finished"],
            "note": f"stream port: create_task(writer with drain); main returns after {main_s} s"}


def _s8_task(port, rt, addr, total, sockbuf, main_s, max_s):
    progress = {"finished": False}
    spawn = port.detached_spawn      # curio's and coro's spawn-without-join; trio has none

    async def background():
        stream = await port.open_tcp_stream(addr[0], addr[1], sockbuf=sockbuf)
        try:
            await stream.send_all(_zeros(total))
            progress["finished"] = True
        finally:
            await stream.aclose()

    async def main(port):
        if spawn is not None:
            await spawn(background)
            await port.sleep(main_s)
        else:
            async with port.move_on_after(max_s):
                async with port.open_nursery() as n:
                    await n.spawn(background)
                    await port.sleep(main_s)
                    # main's body ends here; the nursery waits for the sender.

    port.run(main)
    if spawn is not None:
        note = f"task port: spawned, never joined; main returns after {main_s} s"
    else:
        note = (f"task port ({rt.id}): no spawn without a nursery; main's body returns after "
                f"{main_s} s and the nursery waits for the sender -- it cannot lose")
    return {"background_sent_bytes": None, "background_finished": progress["finished"], "note": note}
