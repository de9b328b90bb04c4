"""Port contracts: what a driver may rely on, per style, written as ``typing.Protocol``.

A driver is written once per port style and runs unchanged on every runtime of
that style, so these classes are the whole of what it may assume. Each method's
docstring says what the call promises and what it never does; the conformance
suite (``protocols.conformance``) measures those promises on every runtime, and
a runtime that keeps one differently declares it (``RuntimeInfo.differences``).
The reference for each style is a library: asyncio for callback and stream,
trio for task. Nothing here is an implementation; ``protocols.ports`` has base
classes a port may subclass.

Every port also has the lifecycle in ``Port``: ``run`` (once), ``probe`` and
``close``. Counters in ``probe()`` use the results vocabulary (``*_bytes``,
``*_count``) and are ``None`` where the runtime cannot show them -- never a
made-up zero.
"""
from __future__ import annotations

from typing import Any, Awaitable, Callable, Protocol, runtime_checkable

__all__ = ["Port", "CallbackPort", "CallbackProtocol", "Transport", "Server", "TimerHandle",
           "StreamPort", "StreamReader", "StreamWriter", "TaskPort", "Stream", "Listener",
           "Nursery", "CONTRACTS"]


@runtime_checkable
class Port(Protocol):
    """What every port has, whatever its style."""
    style: str
    runtime: Any

    def run(self, main: Callable, *args) -> Any:
        """Run ``main(port, *args)`` to its end under the runtime's exit policy and
        return its result. SIGINT/SIGTERM end the run and then raise
        KeyboardInterrupt in the caller. Never leaves the loop or kernel running."""

    def probe(self) -> dict:
        """A snapshot of counters, plus ``source`` saying where they came from.
        Never invents a value: what the runtime cannot see is ``None``."""

    def close(self) -> None:
        """Release the loop or kernel and everything it owns; idempotent. Never
        raises for work left over: that is counted in the probe's exit report."""

    def __enter__(self) -> "Port":
        """Return the port itself."""

    def __exit__(self, *exc) -> None:
        """``close()``; never swallows the exception."""


# ---------------------------------------------------------------------------
# callback style (asyncio's Protocol/Transport)

@runtime_checkable
class CallbackProtocol(Protocol):
    """What a driver hands the port (through a factory) for each connection."""

    def connection_made(self, transport: "Transport") -> None:
        """Called once, first, with the connection's transport."""

    def data_received(self, data: bytes) -> None:
        """Called with each chunk that arrives, in order; never with ``b""``."""

    def eof_received(self) -> bool | None:
        """The peer sent EOF. Return true to keep the write direction open; a
        false answer makes the transport close itself."""

    def connection_lost(self, exc: BaseException | None) -> None:
        """Called once, last: ``None`` for a clean close or abort, the error for a
        failed connection (a reset: a ConnectionError)."""

    def pause_writing(self) -> None:
        """The transport's buffer went above its high-water mark. Advisory: writes
        are still accepted."""

    def resume_writing(self) -> None:
        """The buffer drained to the low-water mark after a ``pause_writing``."""


@runtime_checkable
class Transport(Protocol):
    """One connection as the callback and stream ports show it."""

    def write(self, data: bytes) -> None:
        """Accept all of ``data``: send what the socket takes now and buffer the
        rest. Never blocks and never raises for a broken connection (that arrives
        in ``connection_lost``). After ``close()`` the contract (asyncio's) drops a
        write made on an empty buffer and still sends one made while bytes are
        buffered; either way it counts it (``writes_after_close_count``)."""

    def writelines(self, seq) -> None:
        """``write`` of the concatenation."""

    def write_eof(self) -> None:
        """Send EOF once buffered bytes are out; reading goes on."""

    def close(self) -> None:
        """Close after the buffered bytes are sent; ``connection_lost(None)``
        follows. Returns at once: the connection is not closed yet when it returns."""

    def abort(self) -> None:
        """Close now, dropping the buffer (counted as ``lost_on_abort_bytes``).
        Never sends what was buffered."""

    def is_closing(self) -> bool:
        """True from ``close()``/``abort()`` or the connection's loss on."""

    def get_write_buffer_size(self) -> int:
        """Bytes accepted by ``write`` and not yet handed to the socket."""

    def pause_reading(self) -> None:
        """Stop calling ``data_received`` until ``resume_reading``; bytes wait in
        the socket, where TCP's window pushes back on the peer."""

    def resume_reading(self) -> None:
        """Undo ``pause_reading``."""

    def get_extra_info(self, name: str, default=None) -> Any:
        """``"socket"``, ``"peername"``, ``"sockname"`` as asyncio has them."""


@runtime_checkable
class Server(Protocol):
    def close(self) -> None:
        """Stop accepting; connections already made stay open. Idempotent."""


@runtime_checkable
class TimerHandle(Protocol):
    def cancel(self) -> None:
        """The callback will not run (no effect if it already has)."""


@runtime_checkable
class CallbackPort(Port, Protocol):
    """A reactor: callbacks and protocols, no coroutines. ``run(setup, *args)``
    calls ``setup(port, *args)`` inside the loop and runs until ``stop()``."""

    def listen(self, factory: Callable[[], CallbackProtocol], sock) -> Server:
        """Accept connections on the listening socket ``sock``, one protocol from
        ``factory`` each. Returns at once; never closes ``sock`` (its owner does)."""

    def connect(self, factory: Callable[[], CallbackProtocol], host: str, port: int,
                on_done: Callable, sockbuf: int | None = None) -> None:
        """Start a connection; later call ``on_done(transport, protocol, None)`` or
        ``on_done(None, None, exc)``. ``sockbuf`` pins both socket buffers before
        connecting. Never blocks."""

    def call_soon(self, callback: Callable, *args) -> Any:
        """Run ``callback(*args)`` on a later pass, FIFO with other call_soon
        callbacks. Never runs it before returning."""

    def call_later(self, delay: float, callback: Callable, *args) -> TimerHandle:
        """Run ``callback(*args)`` no earlier than ``delay`` seconds from now."""

    def time(self) -> float:
        """The loop's clock (monotonic seconds)."""

    def stop(self) -> None:
        """End ``run`` after the current callback; callbacks already due may run."""


# ---------------------------------------------------------------------------
# stream style (asyncio's streams and task functions)

@runtime_checkable
class StreamReader(Protocol):
    async def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes (``-1``: to EOF); ``b""`` at EOF, and again after.
        A reset raises ConnectionError."""

    async def readexactly(self, n: int) -> bytes:
        """Exactly ``n`` bytes, or IncompleteReadError at EOF."""

    async def readline(self) -> bytes:
        """Up to and including ``b"\\n"``, or what is left at EOF."""

    def at_eof(self) -> bool:
        """True once EOF arrived and the buffer is empty."""


@runtime_checkable
class StreamWriter(Protocol):
    transport: Transport

    def write(self, data: bytes) -> None:
        """As ``Transport.write``: never blocks, never waits for the peer. Only
        ``drain()`` applies backpressure."""

    def writelines(self, seq) -> None:
        """``write`` of the concatenation."""

    async def drain(self) -> None:
        """Return at once unless writing is paused, else when the buffer is back at
        the low-water mark. Raises the connection's error if it broke. Any number
        of tasks may wait here at once; all wake."""

    def write_eof(self) -> None:
        """As ``Transport.write_eof``."""

    def close(self) -> None:
        """As ``Transport.close``: returns before the connection is closed."""

    async def wait_closed(self) -> None:
        """Return once the connection is closed (``connection_lost`` ran)."""

    def is_closing(self) -> bool:
        """As ``Transport.is_closing``."""

    def get_extra_info(self, name: str, default=None) -> Any:
        """As ``Transport.get_extra_info``."""


@runtime_checkable
class StreamPort(Port, Protocol):
    """Coroutines on an event loop. Besides the methods below, the port carries
    asyncio's names as attributes: ``sleep``, ``create_task``, ``gather``,
    ``wait_for``, ``Event``, ``Queue``, ``CancelledError``, ``current_task``,
    ``all_tasks``, ``timeout``, ``TimeoutError``."""
    sleep: Callable[..., Awaitable]
    create_task: Callable
    gather: Callable
    wait_for: Callable
    Event: type
    CancelledError: type

    async def open_connection(self, host: str, port: int, *, limit: int = 65536,
                              sockbuf: int | None = None) -> tuple[StreamReader, StreamWriter]:
        """Connect and return the pair; ``sockbuf`` pins both socket buffers
        first. Raises OSError when the connection fails."""

    async def start_server(self, client_connected_cb: Callable, host=None, port=None, *,
                           sock=None, limit: int = 65536) -> Server:
        """Serve: ``client_connected_cb(reader, writer)`` (a coroutine function is
        run as a task) per connection. Returns once listening."""


# ---------------------------------------------------------------------------
# task style (trio's Stream and nurseries)

@runtime_checkable
class Stream(Protocol):
    async def receive_some(self, max_bytes: int = 65536) -> bytes:
        """Wait for at least one byte and return up to ``max_bytes``; ``b""`` at
        EOF. Never returns ``b""`` otherwise. One receiver at a time."""

    async def send_all(self, data: bytes) -> None:
        """Return once the kernel holds all of ``data``: blocks while the peer
        does not read. Never leaves bytes in user space. One sender at a time;
        a reset raises an error that is a ``port.StreamError``."""

    async def send_eof(self) -> None:
        """Half-close: the peer sees EOF; receiving goes on. Sending after it fails."""

    async def aclose(self) -> None:
        """Close; idempotent. A task blocked on this stream is woken with an error."""


@runtime_checkable
class Listener(Protocol):
    async def accept(self) -> Stream:
        """The next connection, as a Stream."""

    async def aclose(self) -> None:
        """Stop listening; never closes streams already accepted."""


@runtime_checkable
class Nursery(Protocol):
    """``async with port.open_nursery() as n:`` -- the block ends when every
    child has; a child's error cancels the rest and propagates."""

    async def spawn(self, fn: Callable, *args) -> None:
        """Start ``fn(*args)`` as a child. Whether it has run when this returns
        is the runtime's ``child_ran_before_spawn_returned`` fact."""

    async def cancel(self) -> None:
        """Cancel every child and the body."""


@runtime_checkable
class TaskPort(Port, Protocol):
    """Structured tasks over blocking-style streams. Attributes: ``sleep``,
    ``Event``, ``Cancelled`` (the cancellation exception), ``StreamError`` (a
    tuple: what a broken or closed stream raises, for ``except``) and
    ``detached_spawn`` (the library's spawn-without-join, or None). ``Event().set()``
    is a coroutine on curio and a plain call elsewhere: call it through
    ``protocols.common.set_event`` so one driver serves every library."""
    sleep: Callable[..., Awaitable]
    Event: type
    StreamError: tuple
    detached_spawn: Callable | None

    async def open_tcp_stream(self, host: str, port: int, sockbuf: int | None = None) -> Stream:
        """Connect; raises OSError when the connection fails."""

    def listen(self, sock) -> Listener:
        """A Listener over the listening socket ``sock``."""

    def open_nursery(self) -> Nursery:
        """A nursery (async context manager)."""

    def move_on_after(self, seconds: float):
        """An async context manager that cancels its body after ``seconds``;
        ``cancelled_caught`` tells whether it did. Never raises the timeout."""

    def fail_after(self, seconds: float):
        """As ``move_on_after``, but raises when the time runs out."""


# The contract each style's ports are held to.
CONTRACTS = {"callback": CallbackPort, "stream": StreamPort, "task": TaskPort}
