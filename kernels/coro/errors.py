"""The exceptions of the coro kernel: what a task sees when it is cancelled,
times out, or misuses a resource."""
from __future__ import annotations

__all__ = ["Cancelled", "TaskTimeout", "BusyResourceError", "ClosedResourceError"]


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


class TaskTimeout(TimeoutError):
    """Raised at a blocking trap when the innermost timeout block's deadline
    passed, and out of ``timeout_after``. Carries ``scope`` and, from a send,
    ``bytes_sent``."""
    bytes_sent = None

    def __init__(self, message: str = "timed out", scope=None):
        super().__init__(message)
        self.scope = scope


class BusyResourceError(RuntimeError):
    """Two tasks tried to use the same direction of one resource at once (two
    receivers on a stream, two tasks waiting to read one socket)."""


class ClosedResourceError(Exception):
    """The socket or stream was closed -- by this task earlier, or by another task
    while this one was waiting on it."""
