"""Exit codes and the user-facing errors every bench layer raises or returns.

A leaf module: the CLI maps these to one line on stderr and an exit code; no layer
below it prints or exits on its own.
"""
from enum import IntEnum

from protocols.errors import Unavailable, UsageError

__all__ = ["ExitCode", "UsageError", "Unavailable", "CRASH_KEY"]

# A scenario program's result key that means "the program failed": its cell is an error.
# Namespaced, so a program can return data under any plain name (``error`` included).
CRASH_KEY = "looplab.error"


class ExitCode(IntEnum):
    OK = 0              # everything ran, every gate held
    FAILED = 1          # a verdict or regression gate failed, or a fault was not survived
    USAGE = 2           # a user mistake: one line on stderr, nothing measured is lost
    ENVIRONMENT = 3     # a library or tool this needs is missing here
    NOT_EXHAUSTED = 4   # explore: a delays:D search ran out of budget before its proof
    INTERRUPTED = 130   # SIGINT/SIGTERM: what finished is kept, and the line says where
