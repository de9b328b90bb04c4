"""Pipes and child processes for ``AioLoop`` (the callback kernel as an asyncio
loop): ``connect_read_pipe``/``connect_write_pipe`` transports, the subprocess
transport behind ``subprocess_exec``/``subprocess_shell`` (and so behind
``asyncio.create_subprocess_exec``), and the child watcher that tells it when
its process exits.

The pipe transports are small and follow asyncio's Unix pipe transports edge for
edge: a read pipe calls ``eof_received`` and then ``connection_lost`` at EOF
whatever the protocol answers; a write pipe buffers what ``os.write`` refuses,
advises ``pause_writing``/``resume_writing`` at the loop's ``high_water`` and
``low_water`` marks, and watches its own fd for readability, which for the
write end of a pipe means the reader went away. They are not the kernel's
``SocketTransport``: a pipe has no ``send``/``recv``/``shutdown``, one direction
only, and a different end-of-stream rule.

The process side reuses ``asyncio.base_subprocess.BaseSubprocessTransport``, the
standard library's protocol-level bookkeeping (which pipe belongs to which fd,
``process_exited`` after the pipes closed, ``_wait``): it asks the loop only for
``connect_read_pipe``, ``connect_write_pipe``, ``call_soon``, ``create_task``,
``create_future`` and ``get_debug``, as ``SSLProtocol`` does for TLS. What is
the loop's own is starting the process (``subprocess.Popen``) and reaping it:
on Linux 5.3+ a *pidfd* (``os.pidfd_open``) registered with the reactor like any
reader, so an exit is one more readiness event and no thread or signal handler
is involved; where pidfds are missing, one thread per child blocks in
``os.waitpid`` and hands the status to the loop with ``call_soon_threadsafe``.
"""
from __future__ import annotations

import asyncio
import errno
import logging
import os
import stat
import subprocess
import threading

from asyncio import base_subprocess, futures

from .transports import call_protocol

__all__ = ["AioProcesses", "ReadPipeTransport", "WritePipeTransport",
           "SubprocessTransport", "watch_child"]

logger = logging.getLogger("asyncio")

_MAX_READ = 256 * 1024              # asyncio's max_size per os.read
_WARN_AFTER_LOST_WRITES = 5         # asyncio's LOG_THRESHOLD_FOR_CONNLOST_WRITES


def _pipe_mode(fileno):
    mode = os.fstat(fileno).st_mode
    return stat.S_ISFIFO(mode), stat.S_ISSOCK(mode), stat.S_ISCHR(mode)


class _PipeTransport:
    """What both directions share: the pipe, the protocol, closing once."""

    def _init_pipe(self, loop, pipe, protocol):
        self._loop = loop
        self._pipe = pipe
        self._fileno = pipe.fileno()
        self._protocol = protocol
        self._closing = False
        self._extra["pipe"] = pipe
        fifo, sock, char = _pipe_mode(self._fileno)
        if not (fifo or sock or char):
            self._pipe = None
            raise ValueError(self._kind_error)
        os.set_blocking(self._fileno, False)
        loop._pipes.add(self)
        return fifo, sock

    def __repr__(self):
        state = "closed" if self._pipe is None else "closing" if self._closing else "open"
        return f"<{type(self).__name__} fd={self._fileno} {state}>"

    def is_closing(self):
        return self._closing

    def set_protocol(self, protocol):
        self._protocol = protocol

    def get_protocol(self):
        return self._protocol

    def _fatal_error(self, exc, message):
        # EIO on a pipe is how a pty says its other side closed: not a bug
        if not (isinstance(exc, OSError) and exc.errno == errno.EIO):
            self._loop.call_exception_handler({
                "message": message, "exception": exc, "transport": self,
                "protocol": self._protocol})
        self._close(exc)

    def _call_connection_lost(self, exc):
        try:
            self._protocol.connection_lost(exc)
        finally:
            self._release()

    def _release(self):
        pipe, self._pipe = self._pipe, None
        if pipe is not None:
            pipe.close()
        self._loop._pipes.discard(self)

    def _abandon_at_exit(self):
        """``loop.close()``: close the pipe without telling the protocol."""
        self._closing = True
        self._release()
        return 0


class ReadPipeTransport(_PipeTransport, asyncio.ReadTransport):
    """The read end of a pipe (or a socket or character device) for a protocol."""
    _kind_error = "Pipe transport is for pipes/sockets only."

    def __init__(self, loop, pipe, protocol, waiter=None):
        super().__init__({})
        self._paused = False
        self._init_pipe(loop, pipe, protocol)
        loop.call_soon(protocol.connection_made, self)
        loop.call_soon(self._start_reading)
        if waiter is not None:
            loop.call_soon(futures._set_result_unless_cancelled, waiter, None)

    def _start_reading(self):
        if not self._closing and not self._paused:
            self._loop._add_reader(self._fileno, self._read_ready, ())

    def _read_ready(self):
        try:
            data = os.read(self._fileno, _MAX_READ)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._fatal_error(exc, "Fatal read error on pipe transport")
            return
        if data:
            self._protocol.data_received(data)
            return
        # EOF: asyncio's pipe closes whatever eof_received() answers
        self._closing = True
        self._loop._remove_reader(self._fileno)
        self._loop.call_soon(self._protocol.eof_received)
        self._loop.call_soon(self._call_connection_lost, None)

    def pause_reading(self):
        if self._closing or self._paused:
            return
        self._paused = True
        self._loop._remove_reader(self._fileno)

    def resume_reading(self):
        if self._closing or not self._paused:
            return
        self._paused = False
        self._loop._add_reader(self._fileno, self._read_ready, ())

    def is_reading(self):
        return not self._paused and not self._closing

    def close(self):
        if not self._closing:
            self._close(None)

    def _close(self, exc):
        self._closing = True
        self._loop._remove_reader(self._fileno)
        self._loop.call_soon(self._call_connection_lost, exc)


class WritePipeTransport(_PipeTransport, asyncio.Transport):
    """The write end of a pipe (or a socket or character device) for a
    protocol: ``write`` never blocks, the rest as the module says. An
    ``asyncio.Transport``, as asyncio's write pipe is, so ``pause_reading()``
    raises ``NotImplementedError``."""
    _kind_error = "Pipe transport is only for pipes, sockets and character devices"

    def __init__(self, loop, pipe, protocol, waiter=None):
        super().__init__({})
        self._buffer = bytearray()
        self._lost = 0
        self._protocol_paused = False
        self._high_water = loop.options["high_water"]
        self._low_water = loop.options["low_water"]
        fifo, sock = self._init_pipe(loop, pipe, protocol)
        loop.call_soon(protocol.connection_made, self)
        if sock or fifo:
            # readable write end: the reader closed it
            loop.call_soon(self._watch_peer)
        if waiter is not None:
            loop.call_soon(futures._set_result_unless_cancelled, waiter, None)

    def _watch_peer(self):
        if self._pipe is not None and not (self._closing and not self._buffer):
            self._loop._add_reader(self._fileno, self._peer_closed, ())

    def _peer_closed(self):
        self._close(BrokenPipeError() if self._buffer else None)

    def get_write_buffer_size(self):
        return len(self._buffer)

    def get_write_buffer_limits(self):
        return (self._low_water, self._high_water)

    def set_write_buffer_limits(self, high=None, low=None):
        if high is None:
            high = 4 * low if low is not None else 64 * 1024
        if low is None:
            low = high // 4
        if not high >= low >= 0:
            raise ValueError(f"high ({high!r}) must be >= low ({low!r}) must be >= 0")
        self._high_water, self._low_water = high, low
        self._maybe_pause()

    def write(self, data):
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"data argument must be a bytes-like object, "
                            f"not {type(data).__name__!r}")
        if isinstance(data, bytearray):
            data = memoryview(data)
        if not data:
            return
        if self._lost or self._closing:
            if self._lost >= _WARN_AFTER_LOST_WRITES:
                logger.warning("pipe closed by peer or os.write(pipe, data) raised exception.")
            self._lost += 1
            return
        if not self._buffer:
            try:
                n = os.write(self._fileno, data)
            except (BlockingIOError, InterruptedError):
                n = 0
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as exc:
                self._lost += 1
                self._fatal_error(exc, "Fatal write error on pipe transport")
                return
            if n == len(data):
                return
            if n:
                data = memoryview(data)[n:]
            self._loop._add_writer(self._fileno, self._write_ready, ())
        self._buffer += data
        self._maybe_pause()

    def writelines(self, list_of_data):
        self.write(b"".join(list_of_data))

    def _write_ready(self):
        buf = self._buffer
        try:
            n = os.write(self._fileno, buf)
        except (BlockingIOError, InterruptedError):
            return
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            buf.clear()
            self._lost += 1
            self._loop._remove_writer(self._fileno)
            self._fatal_error(exc, "Fatal write error on pipe transport")
            return
        del buf[:n]
        if buf:
            return
        self._loop._remove_writer(self._fileno)
        if self._protocol_paused and len(buf) <= self._low_water:
            self._protocol_call("resume_writing")
        if self._closing and not buf:
            self._loop._remove_reader(self._fileno)
            self._call_connection_lost(None)

    def _maybe_pause(self):
        if len(self._buffer) > self._high_water and not self._protocol_paused:
            self._protocol_call("pause_writing")

    def _protocol_call(self, name):
        self._protocol_paused = name == "pause_writing"
        call_protocol(self, name)

    def can_write_eof(self):
        return True

    def write_eof(self):
        if self._closing:
            return
        self._closing = True
        if not self._buffer:
            self._loop._remove_reader(self._fileno)
            self._loop.call_soon(self._call_connection_lost, None)

    def close(self):
        if self._pipe is not None and not self._closing:
            self.write_eof()

    def abort(self):
        self._close(None)

    def _close(self, exc):
        self._closing = True
        if self._buffer:
            self._loop._remove_writer(self._fileno)
            self._buffer.clear()
        self._loop._remove_reader(self._fileno)
        self._loop.call_soon(self._call_connection_lost, exc)

    def _call_connection_lost(self, exc):
        if self._pipe is not None:      # a second _close() scheduled a second call
            super()._call_connection_lost(exc)


class SubprocessTransport(base_subprocess.BaseSubprocessTransport):
    """A child process for a ``SubprocessProtocol``: ``subprocess.Popen`` starts
    it, the standard library's ``BaseSubprocessTransport`` connects its pipes
    through the loop's pipe transports, ``watch_child`` reports its exit."""

    def _start(self, args, shell, stdin, stdout, stderr, bufsize, **kwargs):
        self._proc = subprocess.Popen(args, shell=shell, stdin=stdin, stdout=stdout,
                                      stderr=stderr, universal_newlines=False,
                                      bufsize=bufsize, **kwargs)


def watch_child(loop, pid, callback):
    """Call ``callback(returncode)`` on ``loop`` once process ``pid`` exits, and
    reap it: a pidfd registered with the reactor where the OS has them, else a
    thread waiting in ``waitpid``. Returns a function that stops watching (the
    loop is closing)."""
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is not None:
        try:
            pidfd = pidfd_open(pid)
        except OSError as exc:
            if exc.errno == errno.ESRCH:      # already reaped by someone else
                loop.call_soon(callback, 255)
                return lambda: None
            pidfd = None                      # ENOSYS, EPERM (seccomp): fall back
        if pidfd is not None:
            def exited():
                loop._remove_reader(pidfd)
                os.close(pidfd)
                loop._children.pop(pid, None)
                callback(_reap(pid))

            def stop():
                loop._remove_reader(pidfd)
                os.close(pidfd)

            loop._add_reader(pidfd, exited, ())
            loop._children[pid] = stop
            return stop
    return _watch_with_thread(loop, pid, callback)


def _reap(pid):
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:
        return 255                            # reaped elsewhere: asyncio's answer
    return os.waitstatus_to_exitcode(status)


def _watch_with_thread(loop, pid, callback):
    def wait():
        code = _reap(pid)
        try:
            loop.call_soon_threadsafe(_delivered, pid, callback, code)
        except RuntimeError:                  # the loop closed meanwhile
            pass

    def _delivered(pid, callback, code):
        loop._children.pop(pid, None)
        callback(code)

    thread = threading.Thread(target=wait, name=f"asyncio-waitpid-{pid}", daemon=True)
    loop._children[pid] = lambda: None       # the thread ends with the child
    thread.start()
    return loop._children[pid]


class AioProcesses:
    """The pipes-and-processes half of ``AioLoop`` (a base class; never used
    alone): ``connect_read_pipe``, ``connect_write_pipe``, ``subprocess_exec``,
    ``subprocess_shell``. It relies on the loop's ``_pipes`` and ``_children``."""
    __slots__ = ()

    async def connect_read_pipe(self, protocol_factory, pipe):
        """Read ``pipe`` (a file object of a pipe, socket or character device)
        for the protocol ``protocol_factory()`` makes; ``(transport, protocol)``."""
        protocol = protocol_factory()
        waiter = self.create_future()
        transport = ReadPipeTransport(self, pipe, protocol, waiter)
        return await self._connected(transport, protocol, waiter)

    async def connect_write_pipe(self, protocol_factory, pipe):
        """Write to ``pipe`` through a transport that buffers what would block."""
        protocol = protocol_factory()
        waiter = self.create_future()
        transport = WritePipeTransport(self, pipe, protocol, waiter)
        return await self._connected(transport, protocol, waiter)


    async def subprocess_exec(self, protocol_factory, program, *args,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, universal_newlines=False, shell=False,
                              bufsize=0, encoding=None, errors=None, text=None, **kwargs):
        """Start ``program`` with ``args`` (no shell); ``(transport, protocol)``
        once its pipes are connected. asyncio's argument rules."""
        _check_subprocess_args(universal_newlines, bufsize, text, encoding, errors)
        if shell:
            raise ValueError("shell must be False")
        protocol = protocol_factory()
        transport = await self._make_subprocess_transport(
            protocol, (program, *args), False, stdin, stdout, stderr, bufsize, **kwargs)
        return transport, protocol

    async def subprocess_shell(self, protocol_factory, cmd, *, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               universal_newlines=False, shell=True, bufsize=0,
                               encoding=None, errors=None, text=None, **kwargs):
        """Run ``cmd`` (str or bytes) in the shell; ``(transport, protocol)``."""
        if not isinstance(cmd, (bytes, str)):
            raise ValueError("cmd must be a string")
        _check_subprocess_args(universal_newlines, bufsize, text, encoding, errors)
        if not shell:
            raise ValueError("shell must be True")
        protocol = protocol_factory()
        transport = await self._make_subprocess_transport(
            protocol, cmd, True, stdin, stdout, stderr, bufsize, **kwargs)
        return transport, protocol

    async def _make_subprocess_transport(self, protocol, args, shell, stdin, stdout, stderr,
                                         bufsize, extra=None, **kwargs):
        self._check_closed()
        waiter = self.create_future()
        transport = SubprocessTransport(
            self, protocol, args, shell, stdin, stdout, stderr, bufsize, waiter=waiter,
            extra=extra, **kwargs)
        watch_child(self, transport.get_pid(), transport._process_exited)
        try:
            await waiter
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException:
            transport.close()
            await transport._wait()
            raise
        return transport


def _check_subprocess_args(universal_newlines, bufsize, text, encoding, errors):
    # asyncio's rules: the pipes carry bytes, unbuffered
    if universal_newlines:
        raise ValueError("universal_newlines must be False")
    if bufsize != 0:
        raise ValueError("bufsize must be 0")
    if text:
        raise ValueError("text must be False")
    if encoding is not None:
        raise ValueError("encoding must be None")
    if errors is not None:
        raise ValueError("errors must be None")
