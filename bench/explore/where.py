"""Answers in the user's terms: where a task waits, where a failure was raised,
and what a scheduling choice picked.

* **Frames.** A frame is the user's unless its file lies in the standard
  library (asyncio, contextlib, ...), in looplab's kernels and ports
  (``kernels/``, ``protocols/``) or in a runtime or framework library (trio,
  curio, anyio, uvloop, aiohttp, ...). ``innermost`` picks the innermost frame
  of the user's; where there is none (looplab's own benchmark programs in
  ``bench/``), the innermost of ``bench/``; else the innermost of all. A
  location reads ``file.py:LINE in function`` (the path relative to the
  current folder when it lies below it).
* **Tasks.** ``task_line`` names a task (its name, and its coroutine when
  the name is the default ``Task-N``) and where it waits; ``await_chain``
  lists the frames of its await chain, outermost first, and what the
  innermost awaits (another task, by name).
* **Choice labels.** ``describe`` names what a choice picked: the task (by
  its own name, or by its coroutine when the name is the default, since
  ``Task-N`` counts over the whole process) and, for an I/O event, the
  connection (the local role and the peer's address, read from the simulated
  socket behind the fd) with the task or protocol its readiness goes to.
  Labels are run-independent: the same choice reads the same in two runs.

Reads private attributes of asyncio's tasks, futures and handles
(``_callbacks``, ``_fut_waiter``, ``_callback``/``_args``) and of the simulated
world (``_files``): labels and task lines only, never a verdict, and each
lookup that finds nothing falls back to a plainer name.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import re
import sys
import sysconfig

__all__ = ["machinery", "innermost", "location", "frames_of", "await_chain", "task_line", "task_name",
           "describe", "connection", "exception_site", "is_user_file"]

#: Libraries whose frames are never the user's (when installed): the frameworks a
#: user's server is built on, their helpers and the test runner, besides every
#: registered runtime's own library (``RuntimeInfo.library``: trio, curio, ...).
LIBRARIES = ("anyio", "sniffio", "outcome", "exceptiongroup", "uvloop",
             "rloop", "aiohttp", "aiosignal", "multidict", "yarl", "frozenlist", "uvicorn",
             "starlette", "websockets", "h11", "httpcore", "httpx", "_pytest", "pytest",
             "pluggy")

_TASK_N = re.compile(r"Task-\d+$")
USER, LAB, LIBRARY = 0, 1, 2


_EXTRA: set = set()          # libraries of plugin runtimes (RuntimeInfo.library)


def add_library(name: str) -> None:
    """Count a plugin runtime's library (a top-level package) as a library."""
    if name and name not in LIBRARIES and name not in _EXTRA:
        _EXTRA.add(name)
        _roots.cache_clear()
        _tier.cache_clear()


_PACKAGES = "-packages" + os.sep      # site-packages, dist-packages: installed packages


def _dir(path: str) -> str:
    return os.path.realpath(path).rstrip(os.sep) + os.sep


@functools.lru_cache(maxsize=None)
def _roots() -> tuple:
    """(the libraries' folders, looplab's own kernels and ports, ``bench/``, the
    standard library's folders), as real paths with a trailing slash. Inside an
    installed-packages folder only the libraries named count: the user's own
    installed packages live there too."""
    from bench.host.procs import ROOT
    from bench import runtimes as rtmod
    registered = {info.library for info in rtmod.RUNTIMES.values()
                  if info.library and info.library != "python"}
    libs = set()
    for name in LIBRARIES + tuple(sorted(_EXTRA | registered)):
        try:
            spec = importlib.util.find_spec(name)      # a top-level name: nothing is imported
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            continue
        if spec.submodule_search_locations:
            libs.update(_dir(p) for p in spec.submodule_search_locations)
        elif spec.origin:
            libs.add(os.path.realpath(spec.origin))
    own = (_dir(os.path.join(str(ROOT), "kernels")), _dir(os.path.join(str(ROOT), "protocols")))
    stdlib = tuple({_dir(p) for p in (sysconfig.get_paths().get(k)
                                     for k in ("stdlib", "platstdlib")) if p})
    return tuple(sorted(libs)), own, _dir(os.path.join(str(ROOT), "bench")), stdlib


@functools.lru_cache(maxsize=4096)
def _tier(filename: str) -> int:
    if not filename or filename.startswith("<"):
        return LIBRARY if filename.startswith("<frozen") else USER
    real = os.path.realpath(filename)
    libs, own, lab, stdlib = _roots()
    if real.startswith(libs) or real.startswith(own):
        return LIBRARY
    if real.startswith(lab):
        return LAB
    if _PACKAGES not in real and real.startswith(stdlib):
        return LIBRARY
    return USER


def is_user_file(filename: str) -> bool:
    return _tier(filename) == USER


def _display(filename: str) -> str:
    """A library's file by its package (``asyncio/locks.py``, ``trio/_core/_run.py``);
    any other file relative to the current folder when it lies below it, else as it is."""
    real = os.path.realpath(filename)
    if _tier(filename) == LIBRARY:
        libs, own, _, stdlib = _roots()
        for d in libs + own:
            if real.startswith(d):
                return os.path.relpath(real, os.path.dirname(d.rstrip(os.sep)))
        for d in stdlib:
            if real.startswith(d):
                return os.path.relpath(real, d)
    try:
        rel = os.path.relpath(filename)
    except ValueError:
        return filename
    return filename if rel == ".." or rel.startswith(".." + os.sep) else rel


def location(frame_or_code, lineno: int | None = None) -> str:
    """``file.py:LINE in function`` for a frame (or a code object and a line)."""
    code = getattr(frame_or_code, "f_code", frame_or_code)
    line = lineno if lineno is not None else getattr(frame_or_code, "f_lineno", 0)
    return f"{_display(code.co_filename)}:{line} in {code.co_name}"


def key_location(loc: str) -> str:
    """A location as a failure's key holds it: the file's name without its folder,
    so the key is the same from any current folder and on any machine."""
    return os.path.basename(loc) if loc else ""


def innermost(frames):
    """The innermost frame of the best tier present (user, then ``bench/``, then any)."""
    frames = list(frames)
    if not frames:
        return None
    best = min(_tier(f.f_code.co_filename) for f in frames)
    return [f for f in frames if _tier(f.f_code.co_filename) == best][-1]


def frames_of(coro) -> tuple:
    """A suspended coroutine's await chain: its frames, outermost first, and the
    object the innermost one awaits (None when that is a frame of the chain)."""
    frames, obj = [], coro
    while obj is not None and len(frames) < 64:
        f = getattr(obj, "cr_frame", None) or getattr(obj, "gi_frame", None) \
            or getattr(obj, "ag_frame", None)
        if f is None:
            break
        frames.append(f)
        obj = getattr(obj, "cr_await", None) or getattr(obj, "gi_yieldfrom", None) \
            or getattr(obj, "ag_await", None)
    return frames, (obj if frames and obj is not None and not hasattr(obj, "cr_frame") else None)


def exception_site(exc) -> str | None:
    """Where ``exc`` was raised, in the user's code when its traceback passes there."""
    tb = exc.__traceback__
    entries = []
    while tb is not None:
        entries.append((tb.tb_frame, tb.tb_lineno))
        tb = tb.tb_next
    if not entries:
        return None
    best = min(_tier(f.f_code.co_filename) for f, _ in entries)
    frame, line = [e for e in entries if _tier(e[0].f_code.co_filename) == best][-1]
    return location(frame.f_code, line)


# ---------------------------------------------------------------------------
# Tasks

def _coro_of(task):
    get = getattr(task, "get_coro", None)
    if get is not None:
        return get()
    try:
        return task.coro            # trio's, curio's and our coro kernel's tasks
    except AttributeError:
        return None


def _coro_name(coro) -> str:
    return getattr(coro, "__name__", None) or getattr(coro, "__qualname__", None) \
        or type(coro).__name__


def task_name(task, stable: bool = False) -> str:
    """A task's name; with ``stable``, its coroutine where the name is the
    default ``Task-N`` (a process-wide count: not the same in two runs)."""
    get = getattr(task, "get_name", None)
    name = get() if get is not None else getattr(task, "name", None)
    coro = _coro_of(task)
    cname = _coro_name(coro) if coro is not None else None
    if not isinstance(name, str) or (stable and _TASK_N.match(name)) or \
            (name and cname and name.endswith(cname) and "." in name):
        return cname or str(name)
    return name


def _awaits(task, awaited) -> str:
    """What the innermost frame awaits, when it is a task (by name)."""
    waiter = getattr(task, "_fut_waiter", None) if task is not None else None
    for obj in (awaited, waiter):
        if _is_task(obj):
            name, cname = task_name(obj), _coro_name(_coro_of(obj))
            return f"task {name}" + (f" ({cname})" if cname != name else "")
    return ""


def task_line(task=None, coro=None, label: str | None = None) -> tuple:
    """``(line, chain)``: ``NAME (coroutine): waits at file.py:LINE in fn``, and
    the await chain's lines (outermost first) for ``--await-chain``."""
    if coro is None:
        coro = _coro_of(task)
    if label is None:
        name = task_name(task) if task is not None else _coro_name(coro)
        cname = _coro_name(coro)
        label = name if name == cname else f"{name} ({cname})"
    frames, awaited = frames_of(coro)
    if not frames:
        return f"{label}: not started" if coro is not None and \
            getattr(coro, "cr_frame", 1) is not None else f"{label}: done", []
    where = location(innermost(frames))
    waits_for = _awaits(task, awaited)
    chain = [location(f) for f in frames if not _wrapper(f)] + \
        ([f"awaits {waits_for}"] if waits_for else [])
    return f"{label}: waits at {where}" + (f", for {waits_for}" if waits_for else ""), chain


def machinery(task=None, coro=None) -> bool:
    """A task of the runtime's own (a kernel's task, a port's watcher): every frame
    of its await chain lies in a library or in looplab's kernels and ports."""
    frames, _ = frames_of(coro if coro is not None else _coro_of(task))
    return bool(frames) and all(_tier(f.f_code.co_filename) == LIBRARY for f in frames)


#: The explorer's own wrappers around a program (the pytest marker's adapter, the
#: trio run's bound and root task): left out of an await chain.
_WRAPPERS = ("bench/explore/pytest_marker.py", "bench/explore/programs.py",
             "protocols/simports.py")


def _wrapper(frame) -> bool:
    return frame.f_code.co_filename.replace(os.sep, "/").endswith(_WRAPPERS)


def await_chain(coro) -> list:
    return [location(f) for f in frames_of(coro)[0] if not _wrapper(f)]


# ---------------------------------------------------------------------------
# Choice labels

def _world_socket(world, fd):
    files = getattr(world, "_files", None)
    return files.get(fd) if isinstance(files, dict) else None


def _addr(a) -> str:
    if isinstance(a, tuple) and len(a) >= 2:
        return f"{a[0]}:{a[1]}"
    return str(a)


def connection(sock) -> str:
    """A socket by its role and addresses: ``listener 127.0.0.1:8000``,
    ``server 127.0.0.1:8000 <- peer 127.0.0.1:40001``, ``client 127.0.0.1:40001
    -> peer 127.0.0.1:8000``; a connection a program context named, by its name."""
    named = getattr(sock, "looplab_name", None)
    if named:
        return named
    local = getattr(sock, "_local", None)
    remote = getattr(sock, "_remote", None)
    if getattr(sock, "_queue", None) is not None:
        return f"listener {_addr(local)}"
    side = getattr(sock, "_side", None)
    fam = getattr(sock, "family", None)
    if remote is None:
        return f"socket {_addr(local)}" if local else "an unconnected socket"
    import socket as _socket
    if fam == getattr(_socket, "AF_UNIX", None):
        return f"socketpair end {_addr(local)} (peer {_addr(remote)})"
    if side == "server":
        return f"server {_addr(local)} <- peer {_addr(remote)}"
    return f"client {_addr(local)} -> peer {_addr(remote)}"


def _parts(cb):
    """(function, bound object, args) of a handle, partial or bound method."""
    args = ()
    for _ in range(6):
        if hasattr(cb, "_callback") and hasattr(cb, "_args"):       # a loop Handle
            args = tuple(cb._args or ()) + args
            cb = cb._callback
        elif isinstance(cb, functools.partial):                      # a bound reader (_no_args), an app's partial
            args = tuple(cb.args) + args
            cb = cb.func
        else:
            break
    return cb, getattr(cb, "__self__", None), args


def _is_task(obj) -> bool:
    """An asyncio or hybrid task (a future with a coroutine), or trio's."""
    return obj is not None and not isinstance(obj, type) and _coro_of(obj) is not None \
        and (hasattr(obj, "done") or hasattr(obj, "child_nurseries"))


def _waiting_task(fut):
    """The task parked on future ``fut`` (through its callbacks)."""
    for entry in list(getattr(fut, "_callbacks", None) or ()):
        cb = entry[0] if isinstance(entry, tuple) else entry
        fn, owner, args = _parts(cb)
        for cand in (owner, *args[:1]):
            if _is_task(cand):
                return cand
    return None


def _protocol_waiter(transport) -> str:
    """Who a transport's readiness goes to: the task reading its stream, or its protocol."""
    proto = getattr(transport, "_protocol", None)
    if proto is None:
        get = getattr(transport, "get_protocol", None)
        proto = get() if get is not None else None
    if proto is None:
        return ""
    reader = getattr(proto, "_stream_reader", None)
    waiter = getattr(reader, "_waiter", None) if reader is not None else None
    task = _waiting_task(waiter) if waiter is not None else None
    if task is not None:
        return f"task {task_name(task, stable=True)}"
    if reader is not None:
        return "a stream nobody reads yet"
    return f"protocol {type(proto).__qualname__}"


def _callback_target(cb) -> str:
    """The task or protocol a callback wakes, else the callback's own name."""
    fn, owner, args = _parts(cb)
    if _is_task(owner):
        return f"task {task_name(owner, stable=True)}"
    for a in args:
        if _is_task(a):
            return f"task {task_name(a, stable=True)}"
    for a in args:
        if hasattr(a, "add_done_callback") and hasattr(a, "done"):       # a future
            task = _waiting_task(a)
            if task is not None:
                return f"task {task_name(task, stable=True)}"
    if owner is not None and (hasattr(owner, "_protocol") or hasattr(owner, "get_protocol")):
        return _protocol_waiter(owner) or type(owner).__qualname__
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    if "accept" in name.lower():
        return "accept"
    return name


def _io_label(item, world) -> str:
    key, mask = item
    fd = getattr(key, "fd", key)
    what = {1: "read", 2: "write", 3: "read+write"}.get(mask & 3, "event")
    sock = getattr(key, "fileobj", None)
    if not hasattr(sock, "_local"):
        sock = _world_socket(world, fd) if isinstance(fd, int) else None
    if sock is None:
        return f"{what} on a non-socket file"
    conn = connection(sock) if hasattr(sock, "_local") else "the loop's wake-up"
    to = ""
    data = getattr(key, "data", None)           # asyncio's selector key: (reader, writer)
    if isinstance(data, tuple) and len(data) == 2:
        handle = data[0] if mask & 1 else data[1]
        if handle is not None:
            to = _callback_target(handle)
    else:                                       # our callback loop: its (reader, writer)
        loop = _running_callback_loop()
        entry = getattr(loop, "_fds", {}).get(fd) if loop is not None else None
        if entry:
            cb = entry[0] if mask & 1 else entry[1]
            if cb is not None:
                to = _callback_target(cb)
    return f"{what} {conn}" + (f" -> {to}" if to else "")


def _running_callback_loop():
    if "kernels.callback.loop" not in sys.modules:
        return None
    from kernels.callback.loop import get_running_loop
    try:
        return get_running_loop()
    except RuntimeError:
        return None


def describe(item, world=None) -> str:
    """A ready callback or task, an I/O event, a timer: by the task it runs or
    wakes and the connection it concerns, never by an fd number or an address."""
    if isinstance(item, tuple):
        if len(item) == 2:
            return _io_label(item, world)
        if len(item) >= 3:                      # a timer heap entry (when, seq, what)
            return "timer: " + describe(item[2], world)
    if _is_task(item):                          # asyncio, hybrid or trio's task itself
        return f"task {task_name(item, stable=True)}"
    name = getattr(item, "name", None)
    if isinstance(name, str) and hasattr(item, "daemon"):    # our coro kernel's Task
        return f"task {name}"
    if hasattr(item, "_callback"):
        return _callback_target(item)
    if callable(item):
        return _callback_target(item)
    return type(item).__name__
