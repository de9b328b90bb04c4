"""Runtimes: a kernel plus the port it is driven through, named for users.

A *runtime spec* is ``ID[:OPT=VALUE,OPT=VALUE...]``, e.g. ``coro:ready_order=random-7``.
``parse()`` turns it into a ``Runtime``; ``Runtime.open()`` makes a fresh *port*:

* ``CallbackPort`` (style ``callback``): an asyncio ``Protocol``/``Transport`` subset.
  Drivers hand it protocol factories; ``listen``/``connect`` are callback-shaped so the
  same driver runs on our reactor and on asyncio's or uvloop's loop.
* ``StreamPort`` (style ``stream``): asyncio's streams and task functions
  (``open_connection``, ``start_server``, ``sleep``, ``create_task``, ``wait_for`` ...).
* ``TaskPort`` (style ``task``): trio's ``Stream`` (``receive_some``, ``send_all``,
  ``send_eof``, ``aclose``) plus ``open_nursery`` (``await n.spawn(fn, *args)``,
  ``n.cancel()``), ``sleep``, ``move_on_after`` (an *async* context manager here, since
  curio's timeouts trap) and ``Event``.

Every port has ``run(main, *args)`` (``main`` receives the port first), ``probe()``
(counters in the results vocabulary; ``None`` for what can't be seen) and ``close()``.

Reference libraries are imported lazily, inside ``open()``: a missing one makes its
runtime unavailable with a reason (``available()``), never an import-time crash.
They are measured through public APIs only -- a transport proxy that reads
``get_write_buffer_size()`` after every write, trio's ``Instrument``, curio's
``Activation`` -- so their numbers come from the same place ours would if we could not
see inside.
"""
from __future__ import annotations

import importlib
import socket
from dataclasses import dataclass, field

__all__ = ["RUNTIMES", "Runtime", "UsageError", "Unavailable", "parse", "parse_list", "available_runtimes",
           "bind_listener"]


from protocols.errors import Unavailable, UsageError


# ---------------------------------------------------------------------------
# Option schema. Each kernel exposes its design choices as options whose
# defaults reproduce the reference library's behaviour.

def _int_bytes(text: str) -> int:
    t = text.strip().lower()
    mult = 1
    for suffix, m in (("kib", 1024), ("k", 1024), ("mib", 1 << 20), ("m", 1 << 20)):
        if t.endswith(suffix):
            t, mult = t[: -len(suffix)], m
            break
    value = int(t) * mult
    if value < 0:
        raise ValueError("must be >= 0")
    return value


def _bool(text: str) -> bool:
    t = text.strip().lower()
    if t in ("1", "true", "yes", "on"):
        return True
    if t in ("0", "false", "no", "off"):
        return False
    raise ValueError("must be true or false")


def _choice(*values):
    def parse_choice(text: str) -> str:
        if text not in values:
            raise ValueError("must be one of " + "|".join(values))
        return text
    parse_choice.values = values
    return parse_choice


def _ready_order(text: str) -> str:
    if text == "fifo":
        return text
    if text.startswith("random-") and text[7:].lstrip("-").isdigit():
        return text
    raise ValueError("must be fifo or random-SEED (e.g. random-7)")


@dataclass(frozen=True)
class Option:
    name: str
    default: object
    parse: object
    doc: str

    def describe(self) -> str:
        values = getattr(self.parse, "values", None)
        shown = str(self.default).lower() if isinstance(self.default, bool) else self.default
        kind = "|".join(values) if values else {
            _int_bytes: "bytes", _bool: "true|false", _ready_order: "fifo|random-SEED"}.get(self.parse, "")
        return f"{self.name}={shown} ({kind}) {self.doc}"


_EXIT = Option("exit", "cancel", _choice("cancel", "wait", "raise"),
               "what run(main) does with leftover tasks and unsent bytes")
_TRACE = Option("trace", False, _bool, "record Chrome trace events")
_CALLBACK_OPTS = [
    Option("high_water", 65536, _int_bytes, "pause_writing above this many buffered bytes"),
    Option("low_water", 16384, _int_bytes, "resume_writing at or below this"),
    Option("write", "try-send", _choice("try-send", "defer"),
           "try-send: send at once, buffer the rest (asyncio); defer: always buffer (Twisted)"),
    _EXIT, _TRACE,
]
_HYBRID_OPTS = _CALLBACK_OPTS[:3] + [
    Option("spawn", "lazy", _choice("lazy", "eager"), "lazy: child runs after the parent yields"),
    Option("drain", "asyncio", _choice("asyncio", "empty"),
           "asyncio: return unless paused (resumes at low water); empty: wait for an empty buffer"),
    _EXIT, _TRACE,
]
_CORO_OPTS = [
    Option("io_schedule_point", False, _bool, "every I/O call yields (trio) or only blocking ones (curio)"),
    Option("spawn", "lazy", _choice("lazy", "eager"), "lazy: child runs after the parent yields"),
    Option("cancel", "edge", _choice("edge", "level"), "edge: delivered once (curio); level: until exit (trio)"),
    Option("ready_order", "fifo", _ready_order, "order of a batch of ready tasks"),
    _EXIT, _TRACE,
]
_REF_OPTS = [Option("instrument", True, _bool,
                    "measure write buffers through a transport proxy (off for benchmarks)")]


@dataclass(frozen=True)
class RuntimeInfo:
    id: str
    kernel: str             # "looplab" or the library's import name
    style: str              # callback | stream | task
    options: tuple
    compared_with: tuple = ()
    requires: tuple = ()    # modules that must import
    summary: str = ""


RUNTIMES: dict[str, RuntimeInfo] = {r.id: r for r in [
    RuntimeInfo("callback", "looplab", "callback", tuple(_CALLBACK_OPTS),
                ("asyncio-protocol", "uvloop-protocol"), (), "our reactor, Protocol/Transport"),
    RuntimeInfo("hybrid", "looplab", "stream", tuple(_HYBRID_OPTS),
                ("asyncio-streams", "uvloop-streams"), (), "our Futures/Tasks/streams on the reactor"),
    RuntimeInfo("coro", "looplab", "task", tuple(_CORO_OPTS),
                ("curio", "trio"), (), "our trap kernel, send_all blocks"),
    RuntimeInfo("asyncio-protocol", "asyncio", "callback", tuple(_REF_OPTS), (), ("asyncio",),
                "stdlib asyncio, Protocol/Transport"),
    RuntimeInfo("asyncio-streams", "asyncio", "stream", tuple(_REF_OPTS), (), ("asyncio",),
                "stdlib asyncio, StreamReader/StreamWriter"),
    RuntimeInfo("uvloop-protocol", "uvloop", "callback", tuple(_REF_OPTS), (), ("uvloop",),
                "uvloop, Protocol/Transport"),
    RuntimeInfo("uvloop-streams", "uvloop", "stream", tuple(_REF_OPTS), (), ("uvloop",),
                "uvloop, asyncio streams"),
    RuntimeInfo("curio", "curio", "task", tuple(_REF_OPTS), (), ("curio",),
                "curio, recv/sendall through a thin Stream shim"),
    RuntimeInfo("trio", "trio", "task", tuple(_REF_OPTS), (), ("trio",), "trio, SocketStream"),
]}

OURS = ("callback", "hybrid", "coro")


def _import_reason(module: str) -> str | None:
    try:
        importlib.import_module(module)
    except Exception as exc:  # ImportError, or curio on 3.12+ failing inside
        return f"{module} is not importable ({type(exc).__name__}: {exc}); pip install 'looplab[all]'"
    return None


@dataclass
class Runtime:
    info: RuntimeInfo
    options: dict = field(default_factory=dict)

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def style(self) -> str:
        return self.info.style

    @property
    def ours(self) -> bool:
        return self.info.kernel == "looplab"

    @property
    def spec(self) -> str:
        """Canonical spec: the id plus the options that differ from their defaults."""
        changed = [f"{o.name}={_show(self.options[o.name])}" for o in self.info.options
                   if self.options[o.name] != o.default]
        return self.id + (":" + ",".join(changed) if changed else "")

    def unavailable_reason(self) -> str | None:
        for module in self.info.requires:
            reason = _import_reason(module)
            if reason:
                return reason
        return None

    def available(self) -> bool:
        return self.unavailable_reason() is None

    def open(self, **overrides):
        """A fresh port (a new loop or kernel). The caller must ``close()`` it."""
        opts = dict(self.options)
        opts.update(overrides)
        reason = self.unavailable_reason()
        if reason:
            raise Unavailable(f"runtime {self.id} is unavailable: {reason}")
        from protocols import ports
        return ports.open_port(self, opts)


def _show(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def parse(spec: str) -> Runtime:
    """``ID[:OPT=VALUE,...]`` -> Runtime. Unknown ids and options raise UsageError
    with the valid choices in the message."""
    ident, _, rest = spec.strip().partition(":")
    info = RUNTIMES.get(ident)
    if info is None:
        raise UsageError(f"unknown runtime {ident!r}; valid runtimes: {', '.join(RUNTIMES)}")
    options = {o.name: o.default for o in info.options}
    by_name = {o.name: o for o in info.options}
    given = set()
    for item in filter(None, (p.strip() for p in rest.split(","))):
        name, eq, value = item.partition("=")
        given.add(name)
        opt = by_name.get(name)
        if opt is None:
            raise UsageError(f"unknown option {name!r} for runtime {ident}; valid options: "
                             f"{', '.join(by_name) or 'none'}")
        if not eq:
            raise UsageError(f"option {name!r} of runtime {ident} needs a value: {name}=VALUE")
        try:
            options[name] = opt.parse(value)
        except ValueError as exc:
            raise UsageError(f"bad value {value!r} for {ident} option {name}: {exc}") from None
    if "high_water" in given and "low_water" not in given:   # asyncio's rule
        options["low_water"] = options["high_water"] // 4
    elif "low_water" in given and "high_water" not in given:
        options["high_water"] = max(options["high_water"], 4 * options["low_water"])
    if info.id in ("callback", "hybrid") and options["low_water"] > options["high_water"]:
        raise UsageError(f"{ident}: low_water ({options['low_water']}) must not exceed "
                         f"high_water ({options['high_water']})")
    return Runtime(info, options)


def parse_list(text: str | None, default: list[str] | None = None) -> list[Runtime]:
    """A comma list of runtime specs. Options are joined to their runtime with ``:`` and
    separated by ``,``, so runtimes are split where a token starts with a known id;
    ``all`` and ``ours`` expand."""
    if not text:
        return [parse(s) for s in (default or list(RUNTIMES))]
    specs: list[str] = []
    for token in (t.strip() for t in text.split(",") if t.strip()):
        head = token.partition(":")[0]
        if token == "all":
            specs.extend(RUNTIMES)
        elif token == "ours":
            specs.extend(OURS)
        elif head in RUNTIMES or "=" not in token or not specs:
            specs.append(token)
        else:
            specs[-1] += ("," if ":" in specs[-1] else ":") + token
    return [parse(s) for s in specs]


def available_runtimes(runtimes: list[Runtime] | None = None) -> tuple[list[Runtime], dict[str, str]]:
    """Split into (available, {id: reason unavailable})."""
    ok, missing = [], {}
    for rt in runtimes if runtimes is not None else parse_list(None):
        reason = rt.unavailable_reason()
        if reason:
            missing[rt.spec] = reason
        else:
            ok.append(rt)
    return ok, missing


def bind_listener(host: str = "127.0.0.1", port: int = 0, sockbuf: int | None = None,
                  backlog: int = 128) -> socket.socket:
    """A listening TCP socket. ``sockbuf`` pins SO_SNDBUF/SO_RCVBUF, which accepted
    sockets inherit on Linux. A port in use raises OSError (EADDRINUSE)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if sockbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sockbuf)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, sockbuf)
        sock.bind((host, port))
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock

