"""``looplab serve``: one app on one runtime, as a plain server for outside clients."""
from __future__ import annotations

import errno
import os
import signal
import socket
import sys

from bench.errors import ExitCode, Unavailable, UsageError
from bench.verbs.common import positive_int
from bench.verbs.run import APPS, _variants_for
from protocols.common import driver
from bench import runtimes as rtmod


def parse_addr(text: str, resolve: bool = False) -> tuple[str, int]:
    """HOST:PORT. With ``resolve`` a host name becomes its IPv4 address here and now:
    the callback and hybrid kernels take numeric addresses only, and a name they
    cannot use must be refused before the first client, not after."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not (0 <= int(port) <= 65535):
        raise UsageError(f"bad address {text!r}: expected HOST:PORT, e.g. 127.0.0.1:9000")
    host = host or "127.0.0.1"
    if resolve:
        try:
            infos = socket.getaddrinfo(host, int(port), socket.AF_INET, socket.SOCK_STREAM)
        except OSError as exc:
            raise UsageError(f"bad address {text!r}: cannot resolve {host!r}: "
                             f"{exc.strerror or exc}") from None
        host = infos[0][4][0]
    return host, int(port)


def _sigterm_as_sigint(signum, frame):
    # Re-deliver as SIGINT so every runtime ends the way it ends on Ctrl-C (trio
    # installs its own SIGINT handling; raising KeyboardInterrupt from here would
    # land at an arbitrary point inside its run loop).
    os.kill(os.getpid(), signal.SIGINT)


def _argv(args) -> list[str]:
    """The command line of ``args`` again, for the runtime's own interpreter."""
    out = [args.app, "--runtime", args.runtime, "--listen", args.listen, "--variant", args.variant,
           "--response-bytes", str(args.response_bytes)]
    for flag, value in (("--upstream", args.upstream), ("--sockbuf", args.sockbuf),
                        ("--frame-bytes", args.frame_bytes)):
        if value is not None:
            out += [flag, str(value)]
    return out + [f for f, on in (("--forever", args.forever), ("--two-way", args.two_way)) if on]


def cmd_serve(args) -> int:
    rt = rtmod.parse(args.runtime)
    from bench.host import envs
    if rt.interpreter is not None and not envs._inside_env():
        # the server runs in the runtime's own interpreter (@): hand over to it
        exe = envs.interpreter_for(rt)
        if os.path.abspath(exe) != os.path.abspath(sys.executable):
            import subprocess
            child = subprocess.Popen([exe, "-m", "bench", "serve", *_argv(args)])
            try:
                return child.wait()
            except KeyboardInterrupt:
                child.send_signal(signal.SIGINT)     # it ends the way it ends on Ctrl-C
                try:
                    child.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
                return ExitCode.INTERRUPTED
    reason = envs.unavailable_reason(rt)
    if reason:
        raise Unavailable(f"runtime {rt.id} is unavailable here: {reason}")
    variants = _variants_for(args.app)
    if args.variant not in variants:
        raise UsageError(f"unknown variant {args.variant!r} for {args.app}; valid: {', '.join(variants)}")
    if args.app == "proxy" and not args.upstream:
        raise UsageError("serve proxy needs --upstream HOST:PORT")
    host, port = parse_addr(args.listen)
    params = {"sockbuf": args.sockbuf, "forever": args.forever, "two_way": args.two_way,
              "response_bytes": args.response_bytes, "frame_bytes": args.frame_bytes}
    if args.upstream:
        params["upstream"] = parse_addr(args.upstream, resolve=True)
    try:
        sock = rtmod.bind_listener(host, port, sockbuf=args.sockbuf)
    except OSError as exc:
        what = "port in use" if exc.errno == errno.EADDRINUSE else exc.strerror
        raise UsageError(f"cannot listen on {host}:{port}: {what}") from None
    h, p = sock.getsockname()[:2]
    print(f"listening on {h}:{p}", flush=True)
    if rt.style == "task" and args.variant in ("naive", "fixed"):
        print("note: on the task port naive and fixed are the same code", file=sys.stderr)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:   # started with SIGINT ignored (nohup, &)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _sigterm_as_sigint)
    port_obj = rt.open()
    interrupted = False
    try:
        try:
            driver(rt.style).serve(port_obj, args.app, sock, args.variant, params)
        except* KeyboardInterrupt:   # trio delivers it inside an exception group
            interrupted = True
    finally:
        port_obj.close()
        sock.close()
    # stopped by SIGINT or SIGTERM: 130 and one line, as every verb (README, exit
    # codes); the one-shot proxy that ended by itself after its connection: 0
    if interrupted:
        print(f"looplab: interrupted: the {args.app} server on {h}:{p} stopped", file=sys.stderr)
        return ExitCode.INTERRUPTED
    return ExitCode.OK


def add_parser(sub) -> None:
    sv = sub.add_parser("serve", help="run one app as a plain server for outside clients",
                        description="Run one app on one runtime. With port 0 the first stdout "
                        "line is 'listening on HOST:PORT'. SIGINT/SIGTERM end it with exit 130. "
                        "The proxy serves one connection then exits, as in the 2016 post, unless "
                        "--forever. On the task port (coro, trio, curio) naive and fixed are the "
                        "same code: send_all blocks, so there is nothing to fix. Exit 3 when the "
                        "runtime's library is missing here.")
    sv.add_argument("app", choices=APPS)
    sv.add_argument("--runtime", required=True, help="runtime spec, e.g. coro or callback:write=defer")
    sv.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT (default 127.0.0.1:0)")
    sv.add_argument("--upstream", default=None,
                    help="HOST:PORT for the proxy (a host name is resolved once, at start)")
    sv.add_argument("--variant", default="naive", help="naive|fixed (push: unbounded|block|drop|disconnect)")
    sv.add_argument("--sockbuf", type=positive_int, default=None, metavar="BYTES",
                    help="pin SO_SNDBUF/SO_RCVBUF on every socket it opens")
    sv.add_argument("--forever", action="store_true", help="proxy: keep serving after the first connection")
    sv.add_argument("--two-way", action="store_true", help="proxy: relay both ways, propagating half-close")
    sv.add_argument("--response-bytes", type=positive_int, default=65536, help="reqresp: bytes per response")
    sv.add_argument("--frame-bytes", type=positive_int, default=None,
                    help="sink: check fixed-size looplab frames of this size; a malformed stream "
                         "closes that connection only")
    sv.set_defaults(func=cmd_serve)
