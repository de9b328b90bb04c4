"""Your own program under exploration: ``looplab explore path/to/file.py:NAME``
(or ``package.module:NAME``), and how one run of a program goes.

NAME is one of:

* an ``async def`` that takes no arguments, or one: the run's ``Context``
  (``bench.explore.bugs.Context``: the simulated network ``ctx.io``, its
  ``ctx.world``, the virtual clock ``ctx.now``, ``ctx.observe(...)`` and
  scripted connections ``ctx.connection(...)``). Its one variant is named
  after it;
* a ``Bug`` (``bench.explore.Bug(naive=..., fixed=...)``), or any object with
  ``naive`` and ``fixed`` coroutine functions (and optionally ``properties``,
  ``T``, ``net``, ``context``, ``library``): two variants.

A program runs on a simulated world with the explorer's chooser installed:
an asyncio program on asyncio's own selector loop over the world
(``asyncio``) and on looplab's loop, the callback kernel as an asyncio loop
(``looplab``, also ``looplab:OPTION=VALUE,...`` with the kernel's options;
``callback`` is the same loop). A program whose module imports a registered
runtime's library and not asyncio (trio: ``RuntimeInfo.library``) runs on that
runtime's port over the world (``run_program`` through ``port.run``, trio's on
the simulated clock). Its sockets, servers, connections and timers are the
world's: ``asyncio.sleep`` and ``asyncio.start_server("127.0.0.1", 8000)``
run in virtual time.

A run fails on a plain ``assert`` (``violated: ...``), any other exception
out of the program (``error: ...``), an exception a task raised that nobody
retrieved or an exception in a callback (``error: unhandled ...``), and a
hang: a task still pending at ``T`` virtual seconds (5 s), listed with where
it waits. Each failure has a *key*, its kind and where it happened (the
user's ``file.py:LINE``), that the shrinker keeps and the replay compares.

A user's program is recorded in a replay file by its source (``source``: the
file, its sha256, the name); ``check_source`` refuses a replay whose source
changed or is missing.
"""
from __future__ import annotations

import functools
import gc
import hashlib
import importlib
import importlib.util
import inspect
import os
import re
import sys

from bench.errors import UsageError
from bench.explore import where
from bench.explore.checks import RunResult

__all__ = ["load", "UserProgram", "run", "source_of", "check_source", "for_file", "arity",
           "library_of", "library_runtimes", "is_program_spec", "loop_options",
           "ASYNCIO_LOOPS"]

#: The loops an asyncio program runs on: asyncio's, and looplab's (the callback
#: kernel's asyncio loop; ``callback`` is its older name here).
ASYNCIO_LOOPS = ("asyncio", "looplab", "callback")

_LOADED: dict = {}          # (real path, mtime) -> module: a file loaded once per process
#: The module name a file is loaded under (unique per path), left out where trio names
#: a task by its module: ``looplab_program_1a2b3c4d_prog.main`` reads ``prog.main``.
_LOADED_NAME = re.compile(r"looplab_program_[0-9a-f]{8}_")


# ---------------------------------------------------------------------------
# Loading a user's program

def _looks_like_file(left: str) -> bool:
    return left.endswith(".py") or os.sep in left or (os.altsep or os.sep) in left


def is_program_spec(name: str, known=()) -> bool:
    """Whether ``name`` names a user's program (``file.py:NAME``,
    ``package.module:NAME``) rather than a scenario variant (``S3:drain``)."""
    left, sep, right = name.rpartition(":")
    if not sep or not left or not right:
        return False
    if _looks_like_file(left):
        return True
    return "." in left and left not in known


def _import_file(path: str, spec: str):
    real = os.path.realpath(path)
    key = (real, os.stat(real).st_mtime_ns)
    module = _LOADED.get(key)
    if module is not None:
        return module
    stem = os.path.splitext(os.path.basename(real))[0]
    modname = f"looplab_program_{hashlib.sha1(real.encode()).hexdigest()[:8]}_{stem}"
    mspec = importlib.util.spec_from_file_location(modname, real)
    module = importlib.util.module_from_spec(mspec)
    folder = os.path.dirname(real)
    if folder not in sys.path:
        sys.path.insert(0, folder)     # as `python file.py` would: its neighbours import
    sys.modules[modname] = module
    try:
        mspec.loader.exec_module(module)
    except BaseException as exc:
        sys.modules.pop(modname, None)
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise UsageError(f"{spec}: importing {path} failed: {type(exc).__name__}: {exc}"
                         + _at(exc)) from None
    _LOADED[key] = module
    return module


def _at(exc) -> str:
    site = getattr(exc, "filename", None) and getattr(exc, "lineno", None)
    if isinstance(exc, SyntaxError) and site:
        return ""
    where_ = where.exception_site(exc)
    return f" (at {where_})" if where_ else ""


def _import_module(name: str, spec: str):
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())     # as `python -m` would
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and name.startswith(exc.name):
            raise UsageError(f"{spec}: no module {exc.name!r} (not a file either: a file "
                             "target ends in .py)") from None
        raise UsageError(f"{spec}: importing {name} failed: {exc}") from None
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        raise UsageError(f"{spec}: importing {name} failed: {type(exc).__name__}: {exc}"
                         + _at(exc)) from None


def source_of(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def load(spec: str) -> "UserProgram":
    """The program ``spec`` names; a UsageError of one line for a file or module
    that does not import, a missing NAME, or a NAME that is not a program."""
    left, _, name = spec.rpartition(":")
    if _looks_like_file(left):
        if not os.path.isfile(left):
            raise UsageError(f"{spec}: no file {left}")
        module = _import_file(left, spec)
        path, modname = os.path.realpath(left), None
    else:
        module = _import_module(left, spec)
        path, modname = getattr(module, "__file__", None), left
        if not path:
            raise UsageError(f"{spec}: module {left} has no source file")
    obj = getattr(module, name, None)
    if obj is None:
        progs = sorted(n for n, v in vars(module).items()
                       if inspect.iscoroutinefunction(v) or _is_pair(v))
        raise UsageError(f"{spec}: {left} has no {name!r}"
                         + (f"; its programs: {', '.join(progs)}" if progs else ""))
    source = {"file": os.path.realpath(path), "sha256": source_of(path), "name": name,
              "module": modname}
    return UserProgram(spec, obj, source)


def _is_pair(obj) -> bool:
    return callable(getattr(obj, "naive", None)) and callable(getattr(obj, "fixed", None))


def arity(fn, what: str) -> int:
    """0 or 1: whether ``fn`` takes the context. A UsageError otherwise."""
    if not inspect.iscoroutinefunction(inspect.unwrap(fn)) and not \
            inspect.iscoroutinefunction(getattr(fn, "__call__", None)):
        raise UsageError(f"{what} is not an async def (a program is a coroutine function)")
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 1
    required = [p for p in params if p.default is p.empty
                and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(required) > 1:
        raise UsageError(f"{what} takes {len(required)} arguments; a program takes none, or one "
                         "(the context: ctx.io, ctx.world, ctx.now, ctx.observe)")
    return len(required)


def library_runtimes(library: str) -> tuple:
    """The registered runtimes built on ``library`` (``RuntimeInfo.library``) that
    run on the simulated network: where a program of that library runs."""
    from bench import runtimes as rtmod
    return tuple(rid for rid, info in rtmod.RUNTIMES.items()
                 if info.library == library and info.variant_of is None
                 and info.real_network_only is None)


def library_of(fn) -> str:
    """The library a program is written for: ``asyncio`` when its module imports
    asyncio, else the library of a registered runtime it imports (trio), else
    ``asyncio``."""
    names = set()
    for value in getattr(inspect.unwrap(fn), "__globals__", {}).values():
        mod = getattr(value, "__name__", None) if inspect.ismodule(value) else \
            getattr(value, "__module__", None)
        if isinstance(mod, str):
            names.add(mod.split(".")[0])
    if "asyncio" in names:
        return "asyncio"
    return next((lib for lib in sorted(names) if lib != "python" and library_runtimes(lib)),
                "asyncio")


class UserProgram:
    """A program as the explorer's targets see a ``Bug``: ``id``, its variants and
    their functions, ``T``, ``net``, ``context``, ``properties``, ``library``."""

    def __init__(self, spec: str, obj, source: dict):
        from bench.explore import bugs
        self.id = spec
        self.source = source
        if _is_pair(obj):
            self.functions = {"naive": obj.naive, "fixed": obj.fixed}
        elif callable(obj):
            self.functions = {source["name"]: obj}
        else:
            raise UsageError(f"{spec}: {source['name']} is a {type(obj).__name__}; give an async "
                             "def (no arguments, or one: the context) or a "
                             "Bug(naive=..., fixed=...)")
        self.arity = {v: arity(fn, f"{spec} ({v})" if len(self.functions) > 1 else spec)
                      for v, fn in self.functions.items()}
        self.variants = tuple(self.functions)
        self.T = float(getattr(obj, "T", bugs.Bug.T))
        self.net = dict(getattr(obj, "net", None) or bugs.DEFAULT_NET)
        self.context = getattr(obj, "context", None) or functools.partial(bugs.Context,
                                                                          messages=())
        self.properties = tuple(getattr(obj, "properties", ()) or ())
        self.library = getattr(obj, "library", None) or library_of(next(iter(
            self.functions.values())))


def check_source(program: dict, base: str, allow_changed: bool = False) -> tuple:
    """Where a replay file's program is and whether it is the recorded one:
    ``(absolute path, note)``. ``program["file"]`` is relative to ``base``
    (the replay file's folder). Missing: a UsageError. Changed: a UsageError,
    or with ``allow_changed`` the note that the replay cannot be exact."""
    rel = program.get("file")
    if not isinstance(rel, str) or not rel:
        raise UsageError("the schedule file names no program file")
    path = os.path.normpath(os.path.join(base, rel))
    if not os.path.isfile(path):
        raise UsageError(f"the program {rel} (recorded relative to the schedule file) is not "
                         f"at {path}")
    now = source_of(path)
    if now != program.get("sha256"):
        if not allow_changed:
            raise UsageError(f"the program {path} changed since the schedule was recorded "
                             f"(sha256 {str(program.get('sha256'))[:12]}... then, {now[:12]}... "
                             "now); --allow-changed replays it anyway, marked exact: NO")
        return path, "the program's source changed since the schedule was recorded"
    return path, None


def for_file(doc: dict, path: str) -> dict:
    """``doc`` as written to ``path``: its program's file relative to that file's
    folder (a replay file travels with the program beside it, not with this
    machine's paths)."""
    prog = doc.get("program") if isinstance(doc, dict) else None
    if not prog or not os.path.isabs(prog.get("file", "")):
        return doc
    base = os.path.dirname(os.path.abspath(path))
    return dict(doc, program=dict(prog, file=os.path.relpath(prog["file"], base)))


# ---------------------------------------------------------------------------
# One run of a program

def run(bug, runtime: str, variant: str, chooser, net_params: dict, takes_ctx=None):
    """One run of ``bug``'s ``variant`` on ``runtime`` under ``chooser``: a
    ``checks.RunResult``."""
    from kernels import simnet
    fn = bug.functions[variant] if hasattr(bug, "functions") else \
        (bug.naive if variant == "naive" else bug.fixed)
    if takes_ctx is None:
        given = getattr(bug, "arity", None)
        takes_ctx = given[variant] if given else arity(fn, f"{bug.id} ({variant})")
    world = simnet.World(0, log=False, **{**bug.net, **net_params})
    world.install_chooser(chooser)
    attach = getattr(chooser, "attach", None)
    if attach is not None:
        attach(world)
    io = world.io()
    ctx = bug.context(world, io)
    # A run is a function of its choices: no cyclic garbage collection inside it, whose
    # finalizers (a transport's __del__ closing its socket) would act at moments that
    # depend on the process's allocations so far.
    collecting = gc.isenabled()
    gc.disable()
    try:
        if runtime.partition(":")[0] not in ASYNCIO_LOOPS:
            return _run_port(bug, fn, ctx, takes_ctx, world, io, runtime, chooser)
        return _run_asyncio(bug, fn, ctx, takes_ctx, world, io, runtime, chooser)
    finally:
        ctx.close()
        if collecting:
            gc.enable()


def freeze(chooser) -> None:
    """The run is decided: later choices (its clean-up) are answered 0 and not
    recorded, and a watching recorder takes its final look now."""
    freeze_ = getattr(chooser, "freeze", None)
    if freeze_ is not None:
        freeze_()
    elif hasattr(chooser, "limit") and hasattr(chooser, "points"):
        chooser.limit = len(chooser.points)


def loop_options(runtime: str) -> dict:
    """``looplab:write=defer,...``'s options, validated (a UsageError names the valid ones)."""
    base, _, text = runtime.partition(":")
    if not text:
        return {}
    if base not in ("looplab", "callback"):
        raise UsageError("only looplab's loop takes options here")
    opts = dict(kv.partition("=")[::2] for kv in text.split(",") if kv)
    from kernels.callback.aioloop import LOOP_OPTIONS
    from kernels.options import OptionError
    try:
        LOOP_OPTIONS.validate(opts)
    except OptionError as exc:
        raise UsageError(str(exc)) from None
    return opts


def _run_asyncio(bug, fn, ctx, takes_ctx, world, io, runtime, chooser):
    import asyncio

    from kernels import simnet
    if runtime == "asyncio":
        from protocols import simports
        loop = simports.SimSelectorEventLoop(io)
    else:
        from kernels.callback import new_event_loop
        loop = new_event_loop(io=io, **loop_options(runtime))
    created: list = []

    def factory(loop_, coro, **kw):
        task = asyncio.Task(coro, loop=loop_, **kw)
        created.append(task)
        return task
    loop.set_task_factory(factory)
    handled: list = []          # what the loop's exception handler was given
    loop.set_exception_handler(lambda _loop, context: handled.append(context))
    failure = key = None
    pending, chains = [], []
    try:
        task = loop.create_task(fn(ctx) if takes_ctx else fn())
        task.add_done_callback(lambda t: loop.stop())
        bound = loop.call_at(bug.T, loop.stop)
        try:
            loop.run_forever()
        except simnet.SimDeadlock as exc:
            failure, key = f"hang: {exc}", "hang"
        except Exception as exc:         # out of the loop itself (a world event's error)
            failure = f"error: {type(exc).__name__}: {exc}"
            key = f"error:{type(exc).__name__}@{where.key_location(where.exception_site(exc))}"
        bound.cancel()
        freeze(chooser)
        at = world.now
        if failure is None and task.done() and not task.cancelled() and task.exception():
            failure, key = _exception_outcome(task.exception())
        if failure is None:
            failure, key = _unhandled(created, handled, task)
        if failure is None and not task.done():
            failure = f"hang: tasks still pending at t={bug.T:g}s (liveness bound)"
        waiting = [t for t in asyncio.all_tasks(loop) if not t.done()]
        if failure and (failure.startswith("hang") or waiting and not task.done()):
            entries = sorted(where.task_line(t) for t in waiting)
            pending = [line for line, _ in entries]
            chains = [chain for _, chain in entries]
            if key is None or key == "hang":
                key = "hang@" + ";".join(sorted({_waits_at(line) for line in pending}))
        _cancel_all(loop)
        for t in created:       # silence what was reported (or belongs to a cancelled run)
            if t.done() and not t.cancelled():
                t.exception()
    finally:
        loop.close()
    if failure:
        return RunResult(True, failure, pending, {"liveness": failure.startswith("hang"),
                                                  "at": at, "chains": chains}, key=key)
    return RunResult(False, "ok")


def _waits_at(line: str) -> str:
    return where.key_location(line.split(": waits at ", 1)[-1].split(", for ")[0])


def _exception_outcome(exc) -> tuple:
    """``(outcome, key)`` for an exception out of the program."""
    exc = _leaf(exc)
    site = where.exception_site(exc)
    at = where.key_location(site)
    if isinstance(exc, AssertionError):
        # the program's own message (its first line: under pytest, assertion rewriting
        # appends reprs that no replay reproduces), else the assert statement itself
        text = str(exc).splitlines()[0] if str(exc) else _statement(exc) or "assertion"
        return f"violated: {text}" + (f" (at {site})" if site else ""), f"violated@{at}"
    return (f"error: {type(exc).__name__}: {str(exc)[:200]}" + (f" (at {site})" if site else ""),
            f"error:{type(exc).__name__}@{at}")


def _leaf(exc):
    """The first leaf of an exception group (trio's nurseries raise them)."""
    for _ in range(16):
        inner = getattr(exc, "exceptions", None)
        if not inner or not isinstance(exc, BaseException):
            break
        exc = inner[0]
    return exc


def _statement(exc) -> str:
    import linecache
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return ""
    line = linecache.getline(tb.tb_frame.f_code.co_filename, tb.tb_lineno).strip()
    for i, ch in enumerate(line):           # without a comment after it
        if ch == "#":
            try:
                compile(line[:i], "<assert>", "exec")
            except SyntaxError:
                continue
            return line[:i].rstrip()
    return line


def _unhandled(created, handled, main) -> tuple:
    """An exception a task raised that nobody retrieved, or one in a callback."""
    for t in created:
        if t is main or not t.done() or t.cancelled():
            continue
        if getattr(t, "_log_traceback", False):
            exc = t.exception()
            outcome, key = _exception_outcome(exc)
            kind, _, rest = outcome.partition(": ")
            return (f"error: unhandled {type(_leaf(exc)).__name__} in task "
                    f"{where.task_name(t, stable=True)}: {rest.partition(': ')[2] or rest}",
                    "unhandled:" + key)
    for context in handled:
        exc = context.get("exception")
        if exc is not None:
            outcome, key = _exception_outcome(exc)
            return (f"error: unhandled {type(exc).__name__} ({context.get('message', '')}): "
                    f"{outcome.partition(': ')[2]}", "unhandled:" + key)
    return None, None


def _cancel_all(loop) -> None:
    """Unwind whatever a failed run left (bounded: the world may be stuck)."""
    import asyncio
    left = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for t in left:
        t.cancel()
    if left:
        try:
            loop.run_until_complete(asyncio.wait(left, timeout=1.0))
        except Exception:
            pass


def _run_port(bug, fn, ctx, takes_ctx, world, io, runtime, chooser):
    """A program of a runtime's library (trio) on that runtime's port over the
    world. The tasks still pending at ``T`` are read then (a world event, inside
    the run), and the run is cancelled as a simulated SIGINT cancels it."""
    from bench import runtimes as rtmod
    from bench.explore import checks
    from protocols import ports
    seen: list = []
    state = {"done": False}

    def at_bound():
        if not state["done"]:
            seen.extend(checks.running_task_entries())
            freeze(chooser)          # what the cancellation does is clean-up
            state["stopped"] = True
            for stop in list(ports.sim_sigint()):
                stop()
    world.call_at(bug.T, at_bound)
    # a deadlock (every task waits, nothing is scheduled) is looked at before it unwinds
    world.on_deadlock = lambda: seen or seen.extend(checks.running_task_entries())

    async def entry(_port):
        await (fn(ctx) if takes_ctx else fn())
        state["done"] = True
    with ports.using_io(io):
        port = rtmod.parse(runtime).open()
    failure = key = None
    try:
        port.run(entry)
    except KeyboardInterrupt:
        if not state.get("stopped"):
            raise                    # a real Ctrl-C, not the bound's simulated one
    except Exception as exc:
        from kernels import simnet
        if isinstance(exc, simnet.SimDeadlock):
            failure, key = f"hang: {exc}", "hang"
        else:
            failure, key = _exception_outcome(exc)
    finally:
        port.close()
    freeze(chooser)
    at = min(world.now, bug.T)
    if failure is None and not state["done"]:
        failure = f"hang: tasks still pending at t={bug.T:g}s (liveness bound)"
    if failure and failure.startswith("hang"):
        entries = sorted((_own_names(line, fn), chain) for line, chain in seen)
        pending = [line for line, _ in entries]
        chains = [chain for _, chain in entries]
        key = "hang@" + ";".join(sorted({_waits_at(line) for line in pending}))
        return RunResult(True, failure, pending, {"liveness": True, "at": at, "chains": chains},
                         key=key)
    if failure:
        return RunResult(True, failure, [], {"at": at}, key=key)
    return RunResult(False, "ok")


#: A task named by looplab's own code (the port's root task, its wrapper around the
#: program): it goes by the program's name.
_WRAPPER_NAME = re.compile(r"(?<![\w.])(?:protocols\.[\w.<>]+|[\w.<>]*_run_port\.<locals>\.entry)")


def _own_names(line: str, fn) -> str:
    label, sep, rest = line.partition(": waits at ")
    label = _LOADED_NAME.sub("", _WRAPPER_NAME.sub(fn.__name__, label))
    return label + sep + rest
