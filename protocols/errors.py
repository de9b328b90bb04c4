"""The errors a user's mistake or a missing library turns into, for every layer.

``UsageError``: the user named something that does not exist or gave a bad value;
its message is one line that says what was wrong and lists what is valid.
``Unavailable``: a runtime's library is missing here. Both are leaves: they import
nothing, so kernels' callers, protocols and bench can all raise them.
"""

__all__ = ["UsageError", "Unavailable"]


class UsageError(ValueError):
    """A user named something that doesn't exist; the message lists what does."""


class Unavailable(Exception):
    """A runtime's library is missing here (exit code 3, not a crash)."""
