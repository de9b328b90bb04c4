"""The interpreter axis: find Pythons, build one environment per (interpreter,
requirements), and say which Python runs a cell and what it ran with.

A runtime spec's ``@3.12`` or ``@/path/to/python`` (``bench.runtimes``) names the
interpreter its cells run in. Nothing is assumed about where Pythons live: an
interpreter is *found* -- on PATH (``python3.N``, ``python3``, ``python``), in pyenv's
versions directory, through ``uv python find`` where uv exists, or at the path given
-- and asked for its exact version. A pyenv shim that is not active fails that
question and is not an interpreter.

For each (interpreter, requirement set) ``ensure`` builds one environment with
``venv`` and pip: looplab installed *editable* from the source checkout this module
belongs to, plus the libraries the runtime needs beyond looplab's own dependencies
(a loop: uvloop, rloop). Editable, because a copy would go stale the moment the
source changes and cells would silently measure old code; the environment's key
includes the source directory, so two checkouts never share one. Environments live
under ``$XDG_CACHE_HOME/looplab/envs`` (``~/.cache/looplab/envs``), one directory each,
named by Python version and a hash of what went into it (interpreter path and
version, source directory, looplab's dependencies, the extra requirements), and are
reused until ``looplab env clear``. A build goes into a temporary directory that is
renamed into place only when pip succeeded and the marker file is written, so a cell
never runs in a half-built environment (and two concurrent builders race harmlessly:
the loser throws its copy away).

A spec's ``+DIST==VERSION`` pins (``uvloop-streams@3.11+uvloop==0.22.1``) are
requirements like the loop's: they go into the key, so each pinned set of releases
has its own environment.

An interpreter below looplab's minimum (``requires-python``) cannot hold looplab. A
spec that names one (``asyncio-streams@3.6+aiohttp==1.2.0+...``) gets a *bare*
environment (``build_bare``): ``venv`` plus exactly the pins, nothing else.
Only a scenario that ships a standalone program for it (``Scenario.program_file``:
the zoo's version rows) runs a cell there; ``looplab run`` refuses such a spec as
before (``prepare``).

``describe(runtime)`` runs ``python -m bench.host.envs describe SPEC`` in the runtime's
interpreter: the exact Python, the loop with its version, the requirements its
environment was built with, and the version of every distribution whose modules the
opened port had imported. Each cell records it.

Failures are ``UsageError`` (one line, exit 2): no such interpreter (with the ones
found), a version below looplab's minimum (``requires-python``), an environment that
fails to build (pip's last line).
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from bench.errors import UsageError
from bench.host import procs
from bench import runtimes as rtmod
from bench.runtimes.spec import dist_name

__all__ = ["Interpreter", "Env", "cache_root", "found", "find", "locate", "is_bare", "requirements", "ensure",
           "interpreter_for", "describe", "prepare", "cached", "clear", "SOURCE", "unavailable_reason"]

#: The checkout looplab runs from: what every environment installs (editable).
SOURCE = procs.ROOT
MARKER = "looplab-env.json"

_lock = threading.RLock()
_found: list | None = None
_envs: dict = {}
_described: dict = {}


@dataclass(frozen=True)
class Interpreter:
    path: str            # the executable, as the interpreter reports it (sys.executable)
    version: str         # exact, e.g. "3.12.1"
    implementation: str  # e.g. "CPython"
    found_by: str        # "PATH python3.12", "pyenv", "uv", "given path"

    def describe(self) -> str:
        return f"{self.implementation} {self.version} ({self.path}, {self.found_by})"


@dataclass(frozen=True)
class Env:
    dir: str
    interpreter: Interpreter
    requirements: tuple

    @property
    def python(self) -> str:
        return os.path.join(self.dir, "bin", "python")


def cache_root() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "looplab", "envs")


def _inside_env() -> bool:
    """True in a Python running from one of our environments (a cell, a describe)."""
    return os.path.exists(os.path.join(sys.prefix, MARKER))


# ---------------------------------------------------------------------------
# Finding interpreters

_ASK = ("import json, platform, sys; print(json.dumps([sys.executable, "
        "platform.python_version(), platform.python_implementation()]))")


def _ask(exe: str, how: str) -> Interpreter | None:
    try:
        out = subprocess.run([exe, "-c", _ASK], capture_output=True, text=True, timeout=20,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None           # e.g. a pyenv shim for a version that is not active
    try:
        path, version, impl = json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    return Interpreter(path or exe, version, impl, how)


def _pyenv_root() -> str | None:
    root = os.environ.get("PYENV_ROOT")
    if not root and shutil.which("pyenv"):
        try:
            root = subprocess.run(["pyenv", "root"], capture_output=True, text=True,
                                  timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            root = None
    root = root or os.path.join(os.path.expanduser("~"), ".pyenv")
    return root if os.path.isdir(os.path.join(root, "versions")) else None


def _candidates() -> list[tuple[str, str]]:
    out = []
    for name in [f"python3.{n}" for n in range(20, 7, -1)] + ["python3", "python"]:
        exe = shutil.which(name)
        if exe:
            out.append((exe, f"PATH {name}"))
    root = _pyenv_root()
    if root:
        versions = os.path.join(root, "versions")
        for v in sorted(os.listdir(versions)):
            exe = os.path.join(versions, v, "bin", "python")
            if os.access(exe, os.X_OK):
                out.append((exe, "pyenv"))
    return out


def found() -> list[Interpreter]:
    """Every Python 3 found on PATH and in pyenv, one per executable, newest first."""
    global _found
    with _lock:
        if _found is None:
            seen: dict[str, Interpreter] = {}
            for exe, how in _candidates():
                it = _ask(exe, how)
                if it is None or not it.version.startswith("3."):
                    continue
                key = os.path.realpath(it.path)
                if key not in seen:
                    seen[key] = it
            _found = sorted(seen.values(), key=lambda i: _vtuple(i.version), reverse=True)
        return list(_found)


def _vtuple(version: str) -> tuple:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


def _minimum() -> tuple[str, tuple]:
    """looplab's requires-python, from the source's pyproject.toml: (text, minimum)."""
    text = ">=3.11"
    try:
        import tomllib
        with open(os.path.join(SOURCE, "pyproject.toml"), "rb") as f:
            text = tomllib.load(f)["project"]["requires-python"]
    except (OSError, KeyError, ImportError, ValueError):
        pass
    m = re.search(r">=\s*([\d.]+)", text)
    return text, _vtuple(m.group(1)) if m else (3,)


def locate(token: str) -> Interpreter:
    """The interpreter ``@token`` names (a version X.Y[.Z] or a path), whatever its
    version. UsageError if there is none."""
    with _lock:
        if os.sep in token:
            it = _ask(token, "given path") if os.access(token, os.X_OK) else None
            if it is None:
                raise UsageError(f"no Python interpreter at {token} (not an executable that runs)")
            return it
        want = _vtuple(token)
        it = next((i for i in found() if _vtuple(i.version)[:len(want)] == want), None)
        if it is None and shutil.which("uv"):
            try:
                path = subprocess.run(["uv", "python", "find", token], capture_output=True,
                                      text=True, timeout=30).stdout.strip()
            except (OSError, subprocess.SubprocessError):
                path = ""
            it = _ask(path, "uv") if path else None
        if it is None:
            have = ", ".join(f"{i.version} ({i.path})" for i in found()) or "none"
            where = "on PATH, in pyenv" + (" or through uv" if shutil.which("uv") else "")
            raise UsageError(f"no Python {token} found {where}; found: {have}")
        return it


def below_minimum(it: Interpreter) -> bool:
    return _vtuple(it.version) < _minimum()[1]


def find(token: str) -> Interpreter:
    """The interpreter ``@token`` names (a version X.Y[.Z] or a path). UsageError if
    there is none, or it is older than looplab supports."""
    it = locate(token)
    if below_minimum(it):
        raise UsageError(f"Python {it.version} ({it.path}) is below looplab's minimum "
                         f"(requires-python {_minimum()[0]})")
    return it


def is_bare(rt) -> bool:
    """Whether runtime ``rt`` runs in a *bare* environment: its interpreter is below
    looplab's minimum, so its environment holds the spec's pins and nothing of
    looplab, and a cell there runs its scenario's ``program_file`` (a standalone
    program), not looplab's cell process. An interpreter that is not found is not
    bare (``find`` says why it is missing)."""
    if rt.interpreter is None or _inside_env():
        return False
    try:
        return below_minimum(locate(rt.interpreter))
    except UsageError:
        return False


# ---------------------------------------------------------------------------
# Environments

def requirements(rt) -> tuple:
    """What an environment for runtime ``rt`` installs beside looplab
    (``Runtime.requirements``: its port's needs, then the spec's pins)."""
    return rt.requirements()


def _deps() -> list:
    try:
        import tomllib
        with open(os.path.join(SOURCE, "pyproject.toml"), "rb") as f:
            return list(tomllib.load(f)["project"].get("dependencies", []))
    except (OSError, KeyError, ImportError, ValueError):
        return []


def _name(it: Interpreter, reqs: tuple) -> str:
    key = json.dumps({"path": os.path.realpath(it.path), "version": it.version, "source": SOURCE,
                      "deps": _deps(), "requirements": sorted(reqs)}, sort_keys=True)
    return f"py{it.version}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def _say(text: str) -> None:
    print(f"looplab env: {text}", file=sys.stderr, flush=True)


def _pip_failure(output: str) -> str:
    lines = [ln.strip() for ln in output.splitlines()
             if ln.strip() and not ln.lstrip().startswith("WARNING: Location")
             and "is ignored: it is neither a file nor a directory" not in ln]
    return lines[-1] if lines else "no output"


def build(it: Interpreter, reqs: tuple) -> Env:
    """The environment for (it, reqs), built now if it is not in the cache."""
    root = cache_root()
    final = os.path.join(root, _name(it, reqs))
    env = Env(final, it, tuple(reqs))
    if os.path.exists(os.path.join(final, MARKER)):
        return env
    if not os.path.exists(os.path.join(SOURCE, "pyproject.toml")):
        raise UsageError(f"cannot build an environment: looplab's source (pyproject.toml) is not "
                         f"at {SOURCE}; run looplab from a source checkout")
    os.makedirs(root, exist_ok=True)
    tmp = os.path.join(root, f".building-{os.path.basename(final)}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    t0 = time.monotonic()
    _say(f"building {os.path.basename(final)}: Python {it.version} ({it.path}) with looplab "
         f"(editable, {SOURCE}){''.join(', ' + r for r in reqs)}")
    try:
        _say("  creating the virtual environment ...")
        out = subprocess.run([it.path, "-m", "venv", tmp], capture_output=True, text=True,
                             stdin=subprocess.DEVNULL, timeout=300)
        if out.returncode != 0:
            raise UsageError(f"the environment for Python {it.version} failed to build: venv: "
                             f"{_pip_failure(out.stdout + out.stderr)}")
        _say("  installing with pip (a minute or two the first time) ...")
        # A pinned release comes as a wheel or not at all: building an old release from
        # source for an interpreter it predates is slow and rarely what ran in the field.
        binary = [f"--only-binary={dist_name(r)}" for r in reqs if "==" in r]
        pip = subprocess.Popen([os.path.join(tmp, "bin", "python"), "-m", "pip", "install",
                                "--disable-pip-version-check", *binary, "-e", SOURCE, *reqs],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               stdin=subprocess.DEVNULL)
        lines = []
        for line in pip.stdout:
            lines.append(line)
            if line.startswith(("Collecting", "Successfully", "ERROR")):
                _say(f"  pip: {line.strip()}")
        if pip.wait() != 0:
            raise UsageError(f"the environment for Python {it.version} failed to build: pip: "
                             f"{_pip_failure(''.join(lines))}")
        _publish(tmp, final, it, {"source": SOURCE, "requirements": list(reqs)})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _say(f"  ready in {time.monotonic() - t0:.0f} s: {final}")
    return env


def _publish(tmp: str, final: str, it, fields: dict) -> None:
    """Mark a built environment (what it was built from) and move it into place in
    one rename, so a half-built one is never found."""
    with open(os.path.join(tmp, MARKER), "w") as f:
        json.dump({"python": it.version, "interpreter": it.path, "implementation":
                   it.implementation, **fields,
                   "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, f)
    try:
        os.rename(tmp, final)
    except OSError:       # another process finished the same environment first
        if not os.path.exists(os.path.join(final, MARKER)):
            raise


def check_loop(rt) -> None:
    """A ``loop=MODULE:FACTORY`` whose module cannot be found -- installed, on
    PYTHONPATH or in the current folder -- is a user's mistake: one UsageError,
    before any environment is built for it (a bare name that is no known loop is
    refused when the spec is parsed)."""
    import importlib.machinery
    import importlib.util
    loop = rt.loop
    if not isinstance(loop, str) or ":" not in loop:
        return
    top = loop.partition(":")[0].split(".")[0]
    try:
        found = importlib.util.find_spec(top) is not None or \
            importlib.machinery.PathFinder.find_spec(top, [os.getcwd()]) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise UsageError(f"runtime {rt.spec}: loop {loop!r}: no module {top!r} can be imported "
                         "(a loop of your own must be installed, on PYTHONPATH or in this folder)")


def ensure(rt) -> Env | None:
    """The built environment runtime ``rt`` runs in; None for no ``@`` (looplab's own).
    A bare runtime (``is_bare``) gets a bare environment: its pins only."""
    if isinstance(rt, str):     # the perf tools hand specs as text
        rt = rtmod.parse(rt)
    check_loop(rt)
    if rt.interpreter is None:
        return None
    with _lock:
        it = locate(rt.interpreter)
        if below_minimum(it):
            key = (rt.interpreter, "bare", rt.pins)
            if key not in _envs:
                _envs[key] = build_bare(it, rt.pins)
            return _envs[key]
        reqs = requirements(rt)
        key = (rt.interpreter, reqs)
        if key not in _envs:
            _envs[key] = build(find(rt.interpreter), reqs)
        return _envs[key]


def bare_env_vars() -> dict:
    """The environment variables a bare environment's processes get: ours without
    PYTHONPATH and PYTHONHOME (nothing of looplab's checkout on their path)."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def build_bare(it: Interpreter, pins: tuple) -> Env:
    """A bare environment for an interpreter below looplab's minimum: ``venv`` plus
    exactly ``pins``, one at a time in their order (``pip install --no-deps``: the pins are the whole set, every
    dependency named at its release, so nothing newer slips in from an index that
    does not say which Python a release needs), a wheel where one exists and the
    source release otherwise (compiled here where it has C code). ``pip check``
    then refuses a set with a missing or conflicting dependency. No looplab: a cell
    there runs its scenario's standalone ``program_file``."""
    root = cache_root()
    key = json.dumps({"path": os.path.realpath(it.path), "version": it.version, "bare": True,
                      "pins": sorted(pins)}, sort_keys=True)
    final = os.path.join(root, f"bare-py{it.version}-{hashlib.sha256(key.encode()).hexdigest()[:12]}")
    env = Env(final, it, tuple(pins))
    if os.path.exists(os.path.join(final, MARKER)):
        return env
    os.makedirs(root, exist_ok=True)
    tmp = os.path.join(root, f".building-{os.path.basename(final)}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    t0 = time.monotonic()
    _say(f"building {os.path.basename(final)}: Python {it.version} ({it.path}), bare (below "
         f"looplab's minimum: no looplab){''.join(', ' + p for p in pins)}")
    what = f"the bare environment for Python {it.version}" + (f" with {' '.join(pins)}" if pins else "")
    # Run from the cache, with no PYTHONPATH: a checkout in the working directory (its
    # looplab.egg-info) must not look installed to pip there.
    clean = {"cwd": root, "env": bare_env_vars()}
    try:
        out = subprocess.run([it.path, "-m", "venv", tmp], capture_output=True, text=True,
                             stdin=subprocess.DEVNULL, timeout=300, **clean)
        if out.returncode != 0:
            raise UsageError(f"{what} failed to build: venv: {_pip_failure(out.stdout + out.stderr)}")
        py = os.path.join(tmp, "bin", "python")
        # One pin at a time: an old source release's setup_requires (Twisted's
        # incremental) must find its pinned release installed, or setuptools fetches
        # today's, which may not run on this Python. A pin that fails is tried again
        # once the others are in.
        if _vtuple(it.version) < (3, 7):
            # Python 3.6's venv brings pip 18, which cannot find an old sdist under its
            # normalized name (zope-interface for zope.interface-4.3.3.tar.gz); 21.3.1 is
            # the last pip for 3.6 and can
            _say("  pip: pip==21.3.1 (the last release for Python 3.6) ...")
            out = subprocess.run([py, "-m", "pip", "install", "--disable-pip-version-check",
                                  "pip==21.3.1"], capture_output=True, text=True,
                                 stdin=subprocess.DEVNULL, timeout=300, **clean)
            if out.returncode != 0:
                raise UsageError(f"{what} failed to build: pip (pip==21.3.1): "
                                 f"{_pip_failure(out.stdout + out.stderr)}")
        pending, failures = list(pins), {}
        for _ in range(2):
            failures = {}
            for pin in pending:
                _say(f"  pip: {pin} (a wheel where one exists, else built from source) ...")
                try:
                    out = subprocess.run([py, "-m", "pip", "install", "--disable-pip-version-check",
                                          "--no-deps", "--prefer-binary", pin],
                                         capture_output=True, text=True,
                                         stdin=subprocess.DEVNULL, timeout=600, **clean)
                except subprocess.TimeoutExpired:
                    failures[pin] = "pip took over 600 s"
                    continue
                if out.returncode != 0:
                    failures[pin] = _pip_failure(out.stdout + out.stderr)
            pending = list(failures)
            if not pending:
                break
        if failures:
            pin, why = next(iter(failures.items()))
            raise UsageError(f"{what} failed to build: pip ({pin}): {why}")
        out = subprocess.run([py, "-m", "pip", "check", "--disable-pip-version-check"],
                             capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120,
                             **clean)
        if out.returncode != 0:
            raise UsageError(f"{what} is incomplete: pip check: {_pip_failure(out.stdout + out.stderr)}")
        _publish(tmp, final, it, {"bare": True, "requirements": list(pins)})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _say(f"  ready in {time.monotonic() - t0:.0f} s: {final}")
    return env


def interpreter_for(runtime) -> str:
    """The Python executable a cell of ``runtime`` (a Runtime or spec) runs in."""
    env = ensure(runtime)
    return sys.executable if env is None else env.python


def prepare(rts) -> None:
    """Before a run: find every interpreter and build every missing environment,
    so a failure is one line before anything is measured. Eager tasks before
    3.12, and interpreters below looplab's minimum (only a zoo entry's standalone
    program runs there, through ``looplab repro ID --versions``), are refused here too."""
    for rt in rts:
        check_loop(rt)
        if rt.interpreter is not None:
            find(rt.interpreter)
    for rt in rts:
        env = ensure(rt)
        version = env.interpreter.version if env else platform.python_version()
        if rt.options.get("eager") and _vtuple(version) < (3, 12):
            raise UsageError(f"runtime {rt.spec}: eager=true needs Python 3.12+ "
                             f"(asyncio.eager_task_factory); this interpreter is {version}")


def describe(rt) -> dict:
    """What a cell of ``rt`` runs with: {"interpreter", "loop", "libraries"}, plus
    "unavailable" (why it cannot run, or None). Measured in the cell's interpreter."""
    if isinstance(rt, str):     # the perf tools hand specs as text
        rt = rtmod.parse(rt)
    with _lock:
        if rt.spec not in _described:
            exe = interpreter_for(rt)
            cmd = [exe, "-m", "bench.host.envs", "describe", json.dumps(rt.to_data()),
                   ",".join(rtmod.plugin_modules())]
            if is_bare(rt):
                cmd = [exe, "-c", _DESCRIBE_BARE, json.dumps(list(rt.pins))]

            bare = is_bare(rt)
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                                 stdin=subprocess.DEVNULL,
                                 **({"cwd": cache_root(), "env": bare_env_vars()} if bare else {}))
            try:
                _described[rt.spec] = json.loads(out.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
                _described[rt.spec] = {"unavailable": f"its interpreter {exe} failed to describe "
                                                      f"it: {tail}"}
        return dict(_described[rt.spec])


# What a bare environment's interpreter says about itself: standard library only, and
# Python 3.6 syntax (importlib.metadata came with 3.8; setuptools' pkg_resources is in
# every venv before that).
_DESCRIBE_BARE = """
import json, platform, sys
pins = json.loads(sys.argv[1])
def version(dist):
    try:
        from importlib import metadata
        return metadata.version(dist)
    except ImportError:
        import pkg_resources
        return pkg_resources.get_distribution(dist).version
    except Exception:
        return None
libs = {}
for pin in pins:
    dist = pin.partition("==")[0]
    libs[dist] = None
    # a pin's name is normalized (zope-interface); old pkg_resources wants the project's
    for name in (dist, dist.replace("-", "."), dist.replace("-", "_")):
        try:
            libs[dist] = version(name)
        except Exception:
            continue
        if libs[dist]:
            break
print(json.dumps({"interpreter": {"version": platform.python_version(),
                                  "implementation": platform.python_implementation(),
                                  "path": sys.executable},
                  "loop": None, "libraries": libs, "requirements": pins, "bare": True,
                  "unavailable": None}))
"""


def unavailable_reason(rt) -> str | None:
    """Why runtime ``rt`` cannot run where its spec says, or None: a runtime bound to
    another interpreter (``@``) is asked in that interpreter (built first, if need
    be); any other is ``rt.unavailable_reason()``, here. A loop that names no
    module to import is a UsageError (``check_loop``), not a reason."""
    check_loop(rt)
    if rt.interpreter is None or _inside_env():
        return rt.unavailable_reason()
    try:
        return describe(rt).get("unavailable")
    except UsageError as exc:
        return str(exc)


def _describe_here(data: dict) -> dict:
    """The ``describe`` child: open the port as a cell would, then list what was imported."""
    from importlib import metadata
    rt = rtmod.from_data(data)
    out = {"interpreter": {"version": platform.python_version(),
                           "implementation": platform.python_implementation(),
                           "path": sys.executable},
           "loop": None, "libraries": {}, "requirements": list(requirements(rt)),
           "unavailable": rt.unavailable_reason()}
    if out["unavailable"] is None:
        port = rt.open()
        try:
            name = getattr(port, "loop_name", None)
            if name:
                from protocols.asyncio_ports import loop_identity
                out["loop"] = loop_identity(name)
        finally:
            port.close()
    dists = metadata.packages_distributions()
    if out["loop"] is None and out["unavailable"] is None:
        # Not an asyncio port: the runtime's own library is its loop (trio, curio),
        # or looplab's kernel.
        module = (rt.info.requires or (rt.id,))[0]
        top = module.split(".")[0]
        dist = (dists.get(top) or ["looplab"])[0]
        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:
            version = None
        out["loop"] = {"name": module, "target": rt.info.port, "version": version}
    tops = {m.split(".")[0] for m in list(sys.modules)} - set(sys.stdlib_module_names)
    for top in sorted(tops):
        for dist in dists.get(top, ()):
            try:
                out["libraries"][dist] = metadata.version(dist)
            except metadata.PackageNotFoundError:
                pass
    # A pinned distribution is recorded as installed, whether or not opening the port
    # imported it (a zoo program imports its framework only when it runs).
    for pin in getattr(rt, "pins", ()) or ():
        dist = pin.partition("==")[0]
        try:
            out["libraries"][dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    try:
        out["libraries"].setdefault("looplab", metadata.version("looplab"))
    except metadata.PackageNotFoundError:
        pass
    return out


# ---------------------------------------------------------------------------
# The cache, for ``looplab env``

def cached() -> list[dict]:
    """The built environments: their marker's facts plus "dir" and "name"."""
    root = cache_root()
    out = []
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        try:
            with open(os.path.join(root, name, MARKER)) as f:
                meta = json.load(f)
        except (OSError, ValueError):
            continue
        out.append({**meta, "name": name, "dir": os.path.join(root, name)})
    return out


def clear(names=None) -> list[str]:
    """Remove the named environments (all when None), and any abandoned half-builds.
    Returns what was removed."""
    root = cache_root()
    gone = []
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        if (names is None and (name.startswith(".building-") or
                               os.path.exists(os.path.join(root, name, MARKER)))) \
                or (names is not None and name in names):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
            gone.append(name)
    with _lock:
        _envs.clear()
        _described.clear()
    return gone


def env_name(rt) -> str | None:
    """The cache directory name ``rt``'s environment has (built or not); None without ``@``."""
    if rt.interpreter is None:
        return None
    return _name(find(rt.interpreter), requirements(rt))


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[1] == "describe":
        if len(argv) > 3 and argv[3]:
            rtmod.load_plugins(argv[3])
        print(json.dumps(_describe_here(json.loads(argv[2]))))
        return 0
    print("usage: python -m bench.host.envs describe RUNTIME_JSON [RUNTIME_MODULES]",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
