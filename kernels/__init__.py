"""looplab's event-loop kernels, written from scratch on the standard library.

Three kernels retrace the history of Python async I/O, each built on the last idea:

* ``kernels.callback`` -- a reactor. A ``selectors`` loop runs callbacks; socket
  transports accept every ``write()`` and hide what the socket can't take in a
  user-space buffer, telling the protocol ``pause_writing()`` when it is too full.
* ``kernels.hybrid`` -- Futures, Tasks and streams layered on *that same* loop and
  those same transports. ``await writer.drain()`` is opt-in; ``close()`` returns
  before the close happens. It inherits the callback kernel's buffers on purpose.
* ``kernels.coro`` -- a trap kernel. The loop only ever does ``coro.send(value)``
  or ``coro.throw(exc)``; a task suspends by yielding a trap. ``await
  sock.sendall()`` returns when the OS has the bytes: there is no hidden buffer.

The callback and coro kernels reach the OS only through ``kernels.io``, the
I/O-and-time seam (poller, wake-up pair, clock, sockets), which a simulated
network can replace. Each kernel declares its options once, as a
``kernels.options.Schema`` exported as ``OPTIONS``.

The package name ``kernels`` is also taken on the package index by unrelated
projects; ``LOOPLAB_KERNELS`` lets callers check they imported ours.
"""

LOOPLAB_KERNELS = True


def check_ours(module) -> None:
    """Fail loudly if ``module`` (the imported ``kernels``) is not looplab's."""
    if not getattr(module, "LOOPLAB_KERNELS", False):
        raise ImportError(
            f"the 'kernels' package imported from {getattr(module, '__file__', '?')} "
            "is not looplab's; uninstall the other 'kernels' distribution or run "
            "from a looplab checkout")
