"""Exit codes and the user-facing errors every bench layer raises or returns.

A leaf module: the CLI maps these to one line on stderr and an exit code; no layer
below it prints or exits on its own.
"""
import os
import sysconfig
import traceback
from enum import IntEnum

from protocols.errors import Unavailable, UsageError

__all__ = ["ExitCode", "UsageError", "Unavailable", "CRASH_KEY", "one_line"]

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


_LIBRARY = tuple(os.path.realpath(p) + os.sep for p in
                 {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")})


def one_line(exc: BaseException) -> str:
    """An error of a cell as one line that still says where: ``Type: message (at
    file.py:LINE in function)``, the innermost frame of code that is neither the
    standard library nor an installed package (a scenario's ``run``, its program,
    looplab itself). A message that already says where is left as it is."""
    text = f"{type(exc).__name__}: {exc}"
    if " (at " in text:
        return text
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if not os.path.realpath(f.filename).startswith(_LIBRARY)
            and not f.filename.endswith(".pyx") and not f.filename.startswith("<")] or frames
    if not ours:
        return text
    last = ours[-1]
    return f"{text} (at {os.path.basename(last.filename)}:{last.lineno} in {last.name})"
