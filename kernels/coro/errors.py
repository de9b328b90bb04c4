"""The exceptions of the coro kernel: what a task sees when it is cancelled,
times out, joins a task that failed, or misuses a resource.

The cancellation family follows curio: ``Cancelled`` is the base;
``TaskTimeout`` is what arrives at the blocking call when a timeout block's
deadline passes, and what leaves that block; ``TimeoutCancellationError`` is
what leaves an *inner* timeout block that an enclosing block's timeout passed
through (the inner block did not time out; it is being cancelled because time
ran out elsewhere). All three are ``BaseException``\\ s, so ``except Exception``
(or ``except OSError``) around an await does not swallow a timeout.

The kernel option ``cancel_base="exception"`` makes the kernel raise
subclasses of the same names that are also ``Exception``\\ s (asyncio before
3.8, or any code that wants ``except Exception`` to see cancellations):
``flavour(cls, "exception")`` gives them. ``except Cancelled`` catches both
flavours.
"""
from __future__ import annotations

__all__ = ["Cancelled", "TaskTimeout", "TimeoutCancellationError", "TaskError",
           "BusyResourceError", "ClosedResourceError", "flavour"]


class Cancelled(BaseException):
    """Thrown into a task at a blocking trap when the task, or a cancel scope it
    is inside, is cancelled (curio's ``CancelledError``, trio's ``Cancelled``).

    A ``BaseException`` so that ``except Exception`` cleanup code lets it pass.
    ``scope`` is the ``CancelScope`` being cancelled, or ``None`` for
    ``task.cancel()``. ``bytes_sent`` is set by ``sendall``/``send_all`` when the
    cancellation interrupted them: that many bytes reached the OS."""
    bytes_sent = None

    def __init__(self, message: str = "cancelled", scope=None):
        super().__init__(message)
        self.scope = scope


class TaskTimeout(Cancelled):
    """Raised at a blocking trap when a timeout block's deadline passed, and
    out of ``timeout_after``. Carries ``scope`` (the block whose deadline
    passed) and, from a send, ``bytes_sent``."""

    def __init__(self, message: str = "timed out", scope=None):
        super().__init__(message, scope)


class TimeoutCancellationError(Cancelled):
    """Raised out of a cancel scope or timeout block when a timeout of an
    *enclosing* block passed through it (curio's rule). ``scope`` is the
    enclosing block that timed out; it turns this back into ``TaskTimeout``
    (``timeout_after``) or swallows it (``move_on_after``)."""


class TaskError(Exception):
    """``join()`` on a task that ended with an exception (its cancellation
    included): the task's exception is ``__cause__`` (curio's ``TaskError``).
    ``task.result()`` and ``task.exception()`` give the exception itself."""


class BusyResourceError(RuntimeError):
    """Two tasks tried to use the same direction of one resource at once (two
    receivers on a stream, two tasks waiting to read one socket)."""


class ClosedResourceError(Exception):
    """The socket or stream was closed -- by this task earlier, or by another task
    while this one was waiting on it."""


def _exception_subclass(cls):
    return type(cls.__name__, (cls, Exception), {
        "__module__": cls.__module__, "__qualname__": cls.__qualname__,
        "__doc__": f"{cls.__name__} that is also an Exception (cancel_base='exception')."})


_FLAVOURS = {"base": {}, "exception": {}}
for _cls in (Cancelled, TaskTimeout, TimeoutCancellationError):
    _FLAVOURS["base"][_cls] = _cls
    _FLAVOURS["exception"][_cls] = _exception_subclass(_cls)
del _cls


def flavour(cls, cancel_base: str):
    """The class a kernel with option ``cancel_base`` raises for ``cls``."""
    return _FLAVOURS[cancel_base][cls]
