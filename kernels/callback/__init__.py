"""The callback kernel: a reactor in the style of asyncio's selector loop.

This is the first idea in looplab's history of Python async I/O, and the one
the other two react to. A ``Loop`` waits in ``select`` and calls whatever was
registered: reader and writer callbacks for file descriptors, timers, and
callbacks queued with ``call_soon``. Networking goes through *transports* and
*protocols*: the transport owns the socket, the protocol owns the application's
logic and is told what happened (``connection_made``, ``data_received``,
``eof_received``, ``connection_lost``).

Why it is built this way, and what it costs:

* **Every call returns at once.** ``transport.write()`` cannot block, so it
  buffers what the socket refuses in user space and returns. The buffer has no
  bound: the transport only *advises* the protocol with ``pause_writing()``
  above ``high_water`` and ``resume_writing()`` at ``low_water``. A proxy that
  ignores the advice grows the buffer for as long as the source outpaces the
  sink (scenario S1); the probe counts the advice given and the bytes written
  while it was in force.
* **Effects complete later.** ``close()`` returns before the socket is closed;
  ``connection_lost`` runs on a later pass. Stop the loop in between and the
  buffered bytes are gone (S3) -- what exactly happens is the ``exit`` option,
  reported in ``probe.exit_report`` either way.
* **Errors surface in callbacks.** A reset peer is not an exception at the
  ``write()`` call; it is ``connection_lost(exc)`` some passes later, and the
  writes in between are silently dropped (counted).
* **It is fast.** No coroutines, no futures: an echo round trip is one select
  event, one ``recv``, one ``send``. The loop calls I/O callbacks directly
  from the select results instead of queueing handles, and a read is a single
  ``recv(65536)`` whose ``bytes`` go to ``data_received`` as they are (no copy
  out of a shared buffer).

Options reproduce asyncio by default and let one design choice flip at a time;
they are declared once in ``OPTIONS``:
``Loop(high_water=65536, low_water=16384, write="try-send"|"defer",
write_after_close="flush-if-buffered"|"drop", limits_recheck=True,
writelines="checked"|"unchecked", write_buffer="bytearray"|"deque",
buffer_on_loss="free"|"keep",
exit="cancel"|"wait"|"raise", trace=False, io=None)``. ``io`` is the
I/O-and-time seam (``kernels.io``) that a simulated network can replace.

Four of them bring back one library version's bug each, so that ``looplab repro``
can show a bug the installed libraries no longer have (and show it gone with the
default): ``write_after_close="drop"`` drops a ``write()`` made after ``close()``
even while bytes are still buffered (Python 3.12.0-3.12.8, CPython 115514);
``limits_recheck=false`` makes ``set_write_buffer_limits()`` store the marks
without pausing (asyncio 3.4.0, asyncio issue 140); ``writelines="unchecked"``
buffers without the pause check (3.12.0-3.12.8, CPython 127655);
``buffer_on_loss="keep"`` holds a lost transport's buffer in memory until the loop
goes away (uvloop 548). They are read only on those rare paths -- close, limits,
writelines, loss -- so the per-write path costs the same at every value. A fifth,
``write_buffer="deque"``, swaps the bytearray for 3.12's deque of chunks whose
size is summed by the pause check after every write (CPython 146507: O(n) per
write under pressure); the transport picks its buffer and its writable callback
once, when it is made, so the default transport's write path is untouched.

Where the loop is: ``Loop.run_forever`` in ``loop.py``; its ``while`` loop is
the event loop.

Speed decisions, each with what it measured. Figures are CPU instructions of
the server process per 1 KiB echo request (callgrind, CPython 3.11, 10
connections; ``python -m bench.perf.icount RUNTIME``), which unlike wall time do not
move with the machine's load; repeated runs agree within ~2-4 %:

* I/O callbacks are called straight from the poll results, with no Handle per
  event and no trip through the ready queue (asyncio queues a Handle per
  readiness). With the poller's own ``poll`` bound to a local and a flat deque
  of Handles, an echo request costs 11.4k instructions here against 23.8k in
  asyncio's Protocol loop and 12.0k in uvloop's.
* One read of 65536 bytes per readiness, no ``recv_into`` a reused buffer: that
  needed two more objects and a copy per read (~4 % of a round trip). On a real
  socket the read and the send are ``os.read``/``os.write`` on its descriptor,
  argument-clinic calls that skip ``socket.recv``/``send``'s tuple parsing and
  timeout machinery: 11,042 -> 10,110 instructions per request (2026-11-28).
* ``write()`` tests one flag (open, try-send, no trace, not paused, nothing
  buffered) before its send, and counts one byte total (``accepted_bytes`` is
  derived from the sent, buffered and lost counts); the reactor counts
  callbacks once per pass and indexes its fd table: 10,110 -> 9,216.
* Writes are not batched per pass. An echo already makes exactly one send per
  request (strace, when reads were ``recvfrom``: 1.00 ``sendto`` and 1.00
  ``recvfrom`` per request, 0.17 ``epoll_wait``; uvloop 1.00 / 1.00 / 0.11), so a per-pass write list could
  only add work; it would pay only for several small writes to one connection
  in one pass, which ``writelines`` already joins.
* No cliff in the loop's own work: 11,350 instructions per request at 10
  connections and 11,441 at 1,000 (asyncio's Protocol loop: 23,837 and 23,514).
  Registrations are never churned (the poller is touched only when an fd's
  mask changes, and an echo connection's never does), timers are not involved,
  and the per-connection objects are made once at accept. What grows with the
  connection count is outside the interpreter: the cache footprint of the
  connections' objects and the kernel's socket work.

uvloop's compiled loop still executes fewer instructions: 5,477 per request for
its Protocol echo against our 9,216 (2026-11-28, ``python -m bench.perf.icount
callback asyncio-protocol:loop=uvloop,instrument=false --pause 0.005``); most of
what is left here is the interpreter's own work and the C under the three syscalls
(docs/aioloop.md, "Speed III").

Module map: ``loop`` (Loop, Handle, TimerHandle, OPTIONS, get_running_loop,
UnsentDataError), ``network`` (Server, create_server/create_connection) and
``transports`` (SocketTransport, Protocol). The ``hybrid`` kernel builds
Futures, Tasks and streams on these very classes. The same reactor and
transports are also an asyncio event loop: ``aioloop`` (AioLoop,
new_event_loop, LOOP_OPTIONS), ``aionet`` (its servers, connections, UDP,
TLS), ``aiotransports`` and ``aioprocess`` (pipes, subprocesses; docs/aioloop.md).
"""
def new_event_loop(**options):
    """The callback kernel as an ``asyncio`` event loop (``aioloop.AioLoop``),
    with this kernel's options: ``asyncio.run(main(),
    loop_factory=functools.partial(new_event_loop, write="defer"))``. Imported
    on first use, so the kernel itself never imports asyncio."""
    from .aioloop import new_event_loop as factory
    return factory(**options)


def __getattr__(name):
    if name in ("AioLoop", "LOOP_OPTIONS"):
        from . import aioloop
        return getattr(aioloop, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


from .loop import OPTIONS, Handle, Loop, Server, TimerHandle, UnsentDataError, get_running_loop
from .transports import Protocol, SocketTransport

__all__ = ["Loop", "OPTIONS", "Protocol", "Handle", "TimerHandle", "Server", "SocketTransport",
           "get_running_loop", "UnsentDataError", "new_event_loop", "AioLoop", "LOOP_OPTIONS"]
