"""``looplab env``: the environments the interpreter axis runs cells in (``bench.host.envs``).

``list`` shows the interpreters found and the environments built; ``build SPEC...``
builds the environments those runtime specs need (progress on stderr); ``clear``
removes them (all, or those the given specs use) and any abandoned half-build.
"""
from __future__ import annotations

from bench.host import envs
from bench.errors import ExitCode, UsageError
from bench.verbs.common import add_plugin_options, load_plugins
from bench import runtimes as rtmod


def _specs(args) -> list:
    rts = rtmod.parse_list(",".join(args.specs)) if args.specs else []
    bound = [rt for rt in rts if rt.interpreter is not None]
    for rt in rts:
        if rt.interpreter is None:
            print(f"{rt.spec}: no @INTERPRETER, runs in looplab's own interpreter (no environment)")
    return bound


def cmd_env(args) -> int:
    load_plugins(args)
    if args.action == "list":
        print(f"interpreters found ({', '.join(('PATH', 'pyenv', 'uv python find'))}):")
        for it in envs.found():
            print(f"  {it.version:10} {it.path} [{it.found_by}]")
        built = envs.cached()
        print(f"\nenvironments in {envs.cache_root()}: {len(built) or 'none'}")
        for e in built:
            if e.get("bare"):      # below looplab's minimum: the pins, no looplab
                what = "bare (no looplab): " + (", ".join(e.get("requirements") or []) or "no pins")
            else:
                what = (", ".join(e.get("requirements") or []) or "looplab only") + \
                    f"; source {e.get('source')}"
            print(f"  {e['name']}  Python {e['python']} ({e['interpreter']}); {what}; "
                  f"built {e.get('built_at')}")
        return ExitCode.OK
    if args.action == "build":
        rts = _specs(args)
        if not args.specs:
            raise UsageError("env build needs runtime specs, e.g. looplab env build asyncio-streams@3.12")
        envs.prepare(rts)
        for rt in rts:
            print(f"{rt.spec}: {envs.ensure(rt).dir}")
        return ExitCode.OK
    names = None
    if args.specs:
        names = [envs.env_name(rt) for rt in _specs(args)]
    gone = envs.clear(names)
    print(f"removed {len(gone)} environment(s) from {envs.cache_root()}"
          + "".join(f"\n  {g}" for g in gone))
    return ExitCode.OK


def add_parser(sub) -> None:
    p = sub.add_parser("env", help="list, build or clear the per-interpreter environments",
                       description="Cells of a runtime spec with @VERSION or @PATH run in an "
                       "environment built for that interpreter: venv + pip, looplab installed "
                       "editable from this source, plus the runtime's loop (uvloop, rloop). "
                       f"They are cached in {envs.cache_root()} ($XDG_CACHE_HOME/looplab/envs) "
                       "and reused. `run` builds missing ones itself. See docs/axes.md.")
    p.add_argument("action", choices=("list", "build", "clear"),
                   help="list: interpreters found and environments built; build SPEC...: build "
                        "what those runtime specs need; clear [SPEC...]: remove all (or those)")
    p.add_argument("specs", nargs="*", metavar="SPEC",
                   help="runtime specs, e.g. asyncio-streams@3.12 trio@3.13 "
                        "asyncio-streams@3.12:loop=uvloop")
    add_plugin_options(p)
    p.set_defaults(func=cmd_env)
