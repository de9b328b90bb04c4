"""What ``looplab check`` is pointed at, parsed and checked before anything is measured.

- the **app** (``AppRef``): ``module:NAME`` or ``path/to/file.py:NAME``, where NAME is an
  aiohttp ``web.Application``, an ASGI app (served by uvicorn), or a factory of either
  or of an asyncio server (``FACTORY`` below); or a **command** (``-- COMMAND ...``)
  that listens on ``{port}``, a black box;
- the **loop** an in-process app runs on (``LoopChoice``): ``asyncio``, ``uvloop``,
  ``rloop``, ``looplab`` (with its knobs: ``looplab:high_water=16KiB,write=defer``) or
  ``MODULE:FACTORY``;
- the **endpoints** (``Endpoint``): ``--path /feed`` (HTTP GET), ``--ws /ws``
  (WebSocket), ``--send 'LINE\\n'`` (raw bytes; ``LINE\\n::N`` declares an N-byte answer);
- the **knobs** (``Knob``): settings a framework, the loop or the app exposes, that
  ``--set`` applies and the advice (``bench.check.advice``) searches.

A factory is called inside the running loop, with the keyword arguments ``host`` and
``port`` if it takes them (the address to listen on) and ``app.NAME`` knobs as keyword
arguments; it may be ``async``. It returns an ``aiohttp.web.Application``, an ASGI app,
or an asyncio server: an ``asyncio.Server`` (its address is read from ``sockets``) or
``(host, port)``. A server object may have ``async def shutdown()``: ``check`` awaits it
when it stops the server; without one it calls ``close()`` and then does what
``asyncio.run`` does when its main coroutine returns (tasks cancelled, loop closed).
"""
from __future__ import annotations

import codecs
import importlib
import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass

from bench.errors import Unavailable, UsageError

__all__ = ["AppRef", "LoopChoice", "Endpoint", "Knob", "KNOBS", "parse_endpoint",
           "parse_loop", "parse_knobs", "load_object", "classify", "factory_params",
           "Command", "kind_of"]

KINDS = ("aiohttp", "asgi", "factory")


# ---------------------------------------------------------------------------
# The app

@dataclass(frozen=True)
class AppRef:
    """``module:NAME`` or ``file.py:NAME`` (``asgi``: serve it with uvicorn even when
    it does not look like an ASGI app)."""
    ref: str
    asgi: bool = False

    @property
    def module(self) -> str:
        return self.ref.rpartition(":")[0]

    @property
    def name(self) -> str:
        return self.ref.rpartition(":")[2]

    def to_data(self) -> dict:
        return {"ref": self.ref, "asgi": self.asgi}


def _module_from_file(path: str):
    full = os.path.abspath(path)
    name = "looplab_check_" + os.path.splitext(os.path.basename(full))[0].replace("-", "_")
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) == full:
        return sys.modules[name]
    folder = os.path.dirname(full)
    if folder not in sys.path:
        sys.path.insert(0, folder)       # the app's own sibling imports
    spec = importlib.util.spec_from_file_location(name, full)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def load_object(ref: str):
    """The object ``module:NAME`` or ``file.py:NAME`` names. Anything that goes wrong
    (no colon, no file, an import that raises, no such name) is one UsageError."""
    where, sep, name = ref.rpartition(":")
    if not sep or not where or not name.replace(".", "").replace("_", "").isalnum():
        raise UsageError(f"APP {ref!r}: expected module:NAME or path/to/file.py:NAME "
                         "(or -- COMMAND ... for a server process)")
    try:
        if where.endswith(".py") or os.sep in where:
            if not os.path.isfile(where):
                raise UsageError(f"APP {ref!r}: no file {where}")
            module = _module_from_file(where)
        else:
            if os.getcwd() not in sys.path and "" not in sys.path:
                sys.path.insert(0, os.getcwd())
            module = importlib.import_module(where)
    except UsageError:
        raise
    except BaseException as exc:     # SystemExit from an app's import included
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise UsageError(f"APP {ref!r} does not import: {type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": ")) from None
    obj = module
    for part in name.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UsageError(f"APP {ref!r}: {where} has no {name}") from None
    return obj


def _is_aiohttp_app(obj) -> bool:
    web = sys.modules.get("aiohttp.web")
    return web is not None and isinstance(obj, web.Application)


def _asgi_shaped(obj) -> bool:
    """An ASGI app: ``async def app(scope, receive, send)`` or an object whose
    ``__call__`` is one (starlette, FastAPI, ...)."""
    fn = obj if inspect.isfunction(obj) or inspect.ismethod(obj) else getattr(obj, "__call__", None)
    if fn is None or not inspect.iscoroutinefunction(fn):
        return False
    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        return False
    return len(params) == 3


def kind_of(obj, asgi: bool = False) -> str:
    """"aiohttp" (an Application), "asgi" (an ASGI app) or "factory" (to be called in
    the loop; what it returns decides). Anything else is a UsageError."""
    if _is_aiohttp_app(obj):
        return "aiohttp"
    if _asgi_shaped(obj):
        return "asgi"
    if asgi:
        if not callable(obj):
            raise UsageError(f"--asgi: {obj!r} is not callable")
        return "factory"           # of an ASGI app (its result is served with uvicorn)
    if callable(obj):
        return "factory"
    raise UsageError(f"{obj!r} is neither an aiohttp Application, an ASGI app nor a "
                     "factory (a callable returning one, or an asyncio server)")


def classify(app: AppRef) -> str:
    return kind_of(load_object(app.ref), app.asgi)


def factory_params(obj) -> dict:
    """A factory's keyword parameters besides host and port: {name: default}."""
    try:
        params = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):
        return {}
    return {p.name: (None if p.default is p.empty else p.default) for p in params
            if p.name not in ("host", "port") and p.kind in (p.POSITIONAL_OR_KEYWORD,
                                                             p.KEYWORD_ONLY)}


@dataclass(frozen=True)
class Command:
    """A server process (``-- COMMAND ...``): ``{port}`` in any argument is replaced by
    the port it must listen on."""
    argv: tuple

    def render(self, port: int) -> list[str]:
        return [a.replace("{port}", str(port)) for a in self.argv]

    @property
    def has_port(self) -> bool:
        return any("{port}" in a for a in self.argv)

    def label(self) -> str:
        import shlex
        return shlex.join(self.argv)


# ---------------------------------------------------------------------------
# The loop

@dataclass(frozen=True)
class LoopChoice:
    """``name`` is a key of ``protocols.asyncio_ports.LOOPS`` or ``MODULE:FACTORY``;
    ``options`` the knobs of looplab's loop (``kernels.callback.LOOP_OPTIONS``)."""
    name: str = "asyncio"
    options: tuple = ()

    @property
    def label(self) -> str:
        if not self.options:
            return self.name
        return self.name + ":" + ",".join(f"{k}={v}" for k, v in self.options)

    def kwargs(self) -> dict:
        return dict(self.options)

    def with_option(self, name: str, value) -> "LoopChoice":
        opts = dict(self.options)
        opts[name] = value
        return LoopChoice(self.name, tuple(sorted(opts.items())))

    @property
    def sim_capable(self) -> bool:
        return self.name in ("asyncio", "looplab")

    def to_data(self) -> dict:
        return {"name": self.name, "options": [list(o) for o in self.options]}

    @classmethod
    def from_data(cls, data: dict) -> "LoopChoice":
        return cls(data["name"], tuple(tuple(o) for o in data["options"]))


def parse_loop(text: str) -> LoopChoice:
    """``asyncio``, ``uvloop``, ``rloop``, ``looplab[:NAME=VALUE,...]`` or
    ``MODULE:FACTORY``; a loop that does not import is ``Unavailable`` (exit 3)."""
    from protocols import asyncio_ports
    text = text.strip()
    head, sep, rest = text.partition(":")
    options: tuple = ()
    if head in asyncio_ports.LOOPS:
        name = head
        if sep:
            if head != "looplab":
                raise UsageError(f"--loop {text}: only looplab's loop takes options "
                                 "(looplab:high_water=16KiB,write=defer)")
            import kernels.callback as cb
            from kernels.options import OptionError
            given = {}
            for item in filter(None, (p.strip() for p in rest.split(","))):
                key, eq, value = item.partition("=")
                if not eq:
                    raise UsageError(f"--loop {text}: an option is NAME=VALUE, got {item!r}")
                given[key.strip()] = value.strip()
            try:
                cb.LOOP_OPTIONS.validate(given)
            except OptionError as exc:
                raise UsageError(f"--loop {text}: {exc}") from None
            options = tuple(sorted(given.items()))
    elif sep and rest:
        name = text                   # MODULE:FACTORY
    else:
        raise UsageError(f"--loop {text!r}: expected one of {', '.join(asyncio_ports.LOOPS)} "
                         "(looplab:NAME=VALUE,... for its knobs) or MODULE:FACTORY")
    try:
        asyncio_ports.resolve_loop(name)
    except (ImportError, AttributeError) as exc:
        raise Unavailable(f"--loop {name}: {exc}") from None
    return LoopChoice(name, options)


# ---------------------------------------------------------------------------
# Endpoints

@dataclass(frozen=True)
class Endpoint:
    """One endpoint a client of the app uses: ``kind`` http|ws|raw, ``target`` the
    path or the raw request's text, ``declared`` a raw answer's size (bytes)."""
    kind: str
    target: str
    declared: int | None = None

    @property
    def label(self) -> str:
        if self.kind == "http":
            return f"GET {self.target}"
        if self.kind == "ws":
            return f"WS {self.target}"
        shown = self.target.encode("unicode_escape").decode("ascii")
        return f"send '{shown}'" + (f" ({self.declared:,} B)" if self.declared is not None else "")

    def role_fields(self) -> dict:
        return {"kind": self.kind, "target": self.target, "declared": self.declared}

    def to_data(self) -> dict:
        return {"kind": self.kind, "target": self.target, "declared": self.declared}


def _unescape(text: str, what: str) -> str:
    try:
        return codecs.decode(text.encode("latin-1", "backslashreplace"), "unicode_escape")
    except (UnicodeDecodeError, UnicodeEncodeError, ValueError) as exc:
        raise UsageError(f"{what} {text!r}: bad escape ({exc})") from None


def parse_endpoint(kind: str, text: str, what: str) -> Endpoint:
    """``--path /feed``, ``--ws /ws``, ``--send 'GET 4096\\n::4096'``; and the generic
    form of ``--healthy``/``--shutdown``: a path, ``ws:/path`` or ``raw:TEXT``."""
    if kind == "any":
        if text.startswith("ws:"):
            kind, text = "ws", text[3:]
        elif text.startswith("raw:"):
            kind, text = "raw", text[4:]
        else:
            kind = "http"
    if kind in ("http", "ws"):
        if not text.startswith("/") or any(c in text for c in " \r\n"):
            raise UsageError(f"{what} {text!r}: a path starts with '/' and has no spaces")
        return Endpoint(kind, text)
    declared = None
    body, sep, size = text.rpartition("::")
    if sep and size.strip().isdigit():
        text, declared = body, int(size)
    raw = _unescape(text, what)
    if not raw:
        raise UsageError(f"{what}: the request is empty")
    try:
        raw.encode("latin-1")
    except UnicodeEncodeError:
        raise UsageError(f"{what} {text!r}: only bytes 0-255 (latin-1) can be sent") from None
    return Endpoint("raw", raw, declared)


# ---------------------------------------------------------------------------
# Knobs

@dataclass(frozen=True)
class Knob:
    """A setting ``check`` can apply: ``name`` (``scope.setting``), the app kinds it
    applies to, how a value is parsed, the ladder the advice climbs, and which
    questions it can change."""
    name: str
    kinds: tuple
    parse: object
    ladder: tuple
    questions: tuple = ("backpressure",)
    note: str = ""


def _bytes(v):
    from kernels.options import nbytes
    return nbytes(v)


def _secs(v):
    x = float(v)
    if not x > 0:
        raise ValueError("must be > 0 seconds")
    return x


def _count(v):
    n = int(v)
    if n < 0:
        raise ValueError("must be >= 0")
    return n


K = 1024
KNOBS = {k.name: k for k in (
    Knob("loop.high_water", ("aiohttp", "asgi", "factory"), _bytes,
         (4 * K, 16 * K, 64 * K, 256 * K), note="looplab's loop: every transport's write-buffer limit"),
    Knob("aiohttp.heartbeat", ("aiohttp",), _secs, (0.5, 1.0, 2.0, 5.0),
         note="WebSocketResponse(heartbeat=): a client that does not answer pings is closed"),
    Knob("aiohttp.max_msg_size", ("aiohttp",), _bytes, (64 * K, 1024 * K, 4096 * K),
         note="WebSocketResponse(max_msg_size=): the largest message read from a client"),
    Knob("aiohttp.writer_limit", ("aiohttp",), _bytes, (4 * K, 16 * K, 64 * K),
         note="WebSocketResponse(writer_limit=): bytes buffered before send waits"),
    Knob("aiohttp.shutdown_timeout", ("aiohttp",), _secs, (0.5, 1.0, 2.0, 5.0),
         ("shutdown",), note="AppRunner(shutdown_timeout=): how long shutdown waits for handlers"),
    Knob("uvicorn.limit_concurrency", ("asgi",), _count, (1, 2, 4, 8, 32),
         ("backpressure", "fairness"), note="--limit-concurrency: connections beyond it get 503"),
    Knob("uvicorn.timeout_graceful_shutdown", ("asgi",), _secs, (0.5, 1.0, 2.0, 5.0),
         ("shutdown",), note="--timeout-graceful-shutdown: then in-flight tasks are cancelled"),
    Knob("uvicorn.ws_max_queue", ("asgi",), _count, (1, 4, 16, 32)),
    Knob("uvicorn.ws_max_size", ("asgi",), _bytes, (64 * K, 1024 * K, 16384 * K)),
)}
#: an app's own setting: a keyword parameter of its factory with a number (or None) as
#: its default, e.g. ``def make_app(queue_max=0)``
APP_LADDER = (1, 4, 16, 64, 256, 1024)


def knob_for(name: str, kind: str, params: dict) -> Knob:
    """The knob ``name`` for an app of ``kind`` whose factory takes ``params``."""
    if name.startswith("app."):
        key = name[4:]
        if kind == "command" or key not in params:
            where = ("a factory's keyword parameter" if kind != "command" else
                     "a factory's parameter (a command has none)")
            have = ", ".join(f"app.{p}" for p in params) or "none"
            raise UsageError(f"knob {name}: not {where} of this app (it has: {have})")
        default = params[key]
        if default is not None and not isinstance(default, (int, float)):
            return Knob(name, (kind,), str, (), ("backpressure", "fairness", "shutdown"))
        return Knob(name, (kind,), _count if isinstance(default, int) or default is None
                    else float, APP_LADDER, ("backpressure", "fairness", "shutdown"))
    knob = KNOBS.get(name)
    if knob is None:
        raise UsageError(f"unknown knob {name!r}; knobs: {', '.join(KNOBS)}, app.PARAM "
                         "(a factory's keyword parameter)")
    if kind not in knob.kinds:
        raise UsageError(f"knob {name} is for {' or '.join(knob.kinds)} apps, not {kind}")
    return knob


def parse_knobs(items, kind: str, params: dict, loop: LoopChoice | None) -> dict:
    """``--set NAME=VALUE`` items -> {name: value}, each checked."""
    out = {}
    for item in items or ():
        name, eq, value = item.partition("=")
        name = name.strip()
        if not eq or not name:
            raise UsageError(f"--set {item!r}: expected NAME=VALUE, e.g. app.queue_max=64")
        if name.startswith("loop."):
            raise UsageError(f"--set {name}: a loop's knobs go with it: "
                             f"--loop looplab:{name[5:]}={value}")
        knob = knob_for(name, kind, params)
        try:
            out[name] = knob.parse(value.strip())
        except (TypeError, ValueError) as exc:
            raise UsageError(f"--set {item}: {exc}") from None
    return out


def parse_ladder(text: str, kind: str, params: dict, loop: LoopChoice | None) -> tuple:
    """``--advise NAME[=V1,V2,...]`` -> (knob, candidate values)."""
    name, eq, values = text.partition("=")
    name = name.strip()
    knob = knob_for(name, kind, params)
    if name.startswith("loop.") and (loop is None or loop.name != "looplab"):
        raise UsageError(f"--advise {name}: a loop knob needs --loop looplab")
    if not eq:
        if not knob.ladder:
            raise UsageError(f"--advise {name}: give the values to try, {name}=A,B,C")
        return knob, tuple(knob.ladder)
    try:
        vals = tuple(knob.parse(v.strip()) for v in values.split(",") if v.strip())
    except (TypeError, ValueError) as exc:
        raise UsageError(f"--advise {text}: {exc}") from None
    if not vals:
        raise UsageError(f"--advise {text}: no values")
    return knob, vals
