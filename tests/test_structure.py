"""The shape of the code: dependencies point one way, and the seams stay where they are.

These read the source (ast), so they see function-local imports too: an import hidden
inside a function still makes a cycle a reader has to untangle.
"""
from __future__ import annotations

import ast
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("kernels", "protocols", "bench")


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _resolve(name: str, modules: dict) -> str | None:
    """The longest known module that ``name`` names or lies inside."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        is_pkg = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod.split(".")
                    base = base if is_pkg else base[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    prefix = ".".join(base + ([node.module] if node.module else []))
                else:
                    prefix = node.module or ""
                targets = [f"{prefix}.{a.name}" for a in node.names] or [prefix]
            for t in targets:
                dep = _resolve(t, modules)
                if dep and dep != mod:
                    graph[mod].add(dep)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "import cycles (function-local imports included): " + "; ".join(
        " <-> ".join(c) for c in found)


def test_layers_point_down():
    """kernels import nothing of protocols or bench; protocols nothing of bench;
    nothing imports the CLI."""
    graph = import_graph()
    for mod, deps in graph.items():
        for dep in deps:
            if mod.startswith("kernels"):
                assert not dep.startswith(("protocols", "bench")), (mod, dep)
            if mod.startswith("protocols"):
                assert not dep.startswith("bench"), (mod, dep)
            assert dep != "bench.cli" or mod == "bench.__main__", (mod, dep)


def _git_grep(pattern: str) -> list[str]:
    """Lines of bench/, protocols/ and kernels/ matching ``pattern`` (git grep -E).
    git grep exits 1 when nothing matches; anything else is an error, never a pass."""
    out = subprocess.run(["git", "grep", "-nE", pattern, "--", "bench", "protocols", "kernels"],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode in (0, 1), f"git grep failed ({out.returncode}): {out.stderr.strip()}"
    return out.stdout.splitlines()


@pytest.mark.parametrize("pattern", [r"rid ==", r"runtime\.id ==", r"rt\.id ==", r"\.id in \("])
def test_no_dispatch_on_runtime_ids(pattern):
    """Behaviour that depends on a runtime lives on its RuntimeInfo, not in if-chains."""
    hits = [line for line in _git_grep(pattern) if "bench/runtimes/registry.py" not in line]
    assert not hits, "\n".join(hits)


def test_git_grep_failure_is_not_a_pass():
    with pytest.raises(AssertionError, match="git grep failed"):
        _git_grep("(")          # an invalid regular expression: git grep exits 128


# ---------------------------------------------------------------------------
# Runtime ids are spelled in bench/runtimes/builtin.py only.

#: calls whose first argument is a module or distribution name ("trio" the library,
#: not the runtime): importing it, its logger, its installed version
_MODULE_CALLS = {"import_module", "_library", "getLogger", "find_spec", "version", "lib_version"}
#: A bug zoo entry (bench/zoo/) is a bug report: the runtimes its bug shows on
#: (``show_on=``) and the option flips that turn its mechanism on or off on our
#: kernels (``Flip(SPEC, ...)``) are facts about the bug, named as the report names them.
#: ``not_on=`` (where it was measured not to show) and ``stand_in=`` (the option flip that
#: plays an uninstalled version) are the same kind of fact, and so is ``version_runtimes=``
#: (the runtimes that run the framework's program at the versions the card pins), and so
#: are a card's expectations (bench/zoo/expected.py: ``_card(shown=, not_shown=)``).
_BUG_REPORT_CALL, _BUG_REPORT_KEYWORDS = ("Flip", ("show_on", "not_on", "stand_in",
                                                   "version_runtimes", "shown", "not_shown"))


def _builtin_ids() -> tuple[set, set]:
    """(runtime ids a literal must not equal, every built-in id for spec prefixes).
    A style name that is also a runtime id ("callback") names the style when alone."""
    from bench import runtimes
    ids = {rid for rid, info in runtimes.RUNTIMES.items() if info.origin == "builtin"}
    return ids - set(runtimes.STYLES), ids


def runtime_literals(source: str, filename: str = "<string>", own: str | None = None) -> list:
    """(line, text) of every string literal in ``source`` that is a runtime id or a
    runtime spec (``ID:OPTIONS``, ``ID+...``). Docstrings and module names handed
    to import or metadata calls do not count; ``own`` is a name the file may use
    (a kernel package naming itself)."""
    bare, every = _builtin_ids()
    tree = ast.parse(source, filename)
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                skip.add(id(body[0].value))
        elif isinstance(node, ast.Call) and node.args:
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name in _MODULE_CALLS or name == _BUG_REPORT_CALL:
                skip.add(id(node.args[0]))
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg in _BUG_REPORT_KEYWORDS:
                    skip.update(id(n) for n in ast.walk(kw.value))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or not isinstance(node.value, str) or id(node) in skip:
            continue
        text = node.value
        if own and (text == own or text.startswith(own + ":")):
            continue
        if text in bare or any(text.startswith(rid + sep) for rid in every for sep in ":+"):
            found.append((node.lineno, text))
    return found


def _checked_files():
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == "bench/runtimes/builtin.py":
                continue
            # a kernel package may name itself (its option schema's owner, say)
            own = path.relative_to(ROOT).parts[1] if pkg == "kernels" and len(
                path.relative_to(ROOT).parts) > 2 else None
            yield rel, path, own


def test_no_runtime_id_literals_outside_builtin():
    """Every fact about a runtime hangs off its RuntimeInfo: code asks the registry
    (references, libraries, probe sides, tracing, goals), so a runtime registered from
    outside takes part like a built-in one."""
    hits = []
    for rel, path, own in _checked_files():
        for line, text in runtime_literals(path.read_text(), rel, own):
            hits.append(f"{rel}:{line}: {text!r}")
    assert not hits, "runtime ids spelled outside bench/runtimes/builtin.py:\n" + "\n".join(hits)


@pytest.mark.parametrize("planted, caught", [
    ('PAIRS = {"coro": ("curio", "trio")}', ["coro", "curio", "trio"]),
    ('SPEC = "hybrid:exit=wait"', ["hybrid:exit=wait"]),
    ('TWIN = "trio+trace"', ["trio+trace"]),
    ('SIDES = {"callback": 1, "uvloop-streams": 2}', ["uvloop-streams"]),
    ('import logging\nlogging.getLogger("curio")', []),
    ('Entry(show_on=("coro", "trio"), flips=(Flip("coro:spawn=eager", True),))', []),
    ('Entry(affects={"trio": 1}, flips=(Flip("x", True, "coro:spawn=eager"),))',
     ["trio", "coro:spawn=eager"]),
    ('def f():\n    """The coro kernel."""\n    return "task"', []),
])
def test_runtime_literal_checker_catches_planted_ids(planted, caught):
    assert [t for _, t in runtime_literals(planted)] == caught


def test_runtime_literal_checker_fails_on_a_planted_file(tmp_path, monkeypatch):
    """A copy of a checked module with one planted id makes the whole check fail."""
    rel = "bench/verbs/repro.py"
    copy = tmp_path / rel
    copy.parent.mkdir(parents=True)
    copy.write_text((ROOT / rel).read_text() + '\nPLANTED = ("asyncio-streams",)\n')
    monkeypatch.setattr(sys.modules[__name__], "_checked_files",
                        lambda: iter([(rel, copy, None)]), raising=True)
    with pytest.raises(AssertionError, match="asyncio-streams"):
        test_no_runtime_id_literals_outside_builtin()


# ---------------------------------------------------------------------------
# Rooms: bench/ by stage, modules of a readable size, the suite free of the lab.

#: ``module.path:Name`` or a dotted module path inside a string (a port class, a probe
#: side, ``python -m`` targets, docstrings naming a module)
_MODULE_REF = re.compile(r"\b((?:kernels|protocols|bench)(?:\.[A-Za-z_]\w*)+)")


def string_references(path: pathlib.Path, commands: bool = True) -> set[str]:
    """The modules of this tree that a file's string literals (docstrings included) name.
    ``commands=False`` leaves out ``python -m MODULE``, a command a reader runs (a kernel's
    essay citing the tool that measured it), not a module it depends on."""
    modules = _modules()
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            for m in _MODULE_REF.finditer(node.value):
                if not commands and node.value[:m.start()].endswith("python -m "):
                    continue
                dep = _resolve(m.group(1), modules)
                if dep:
                    found.add(dep)
    return found


def test_string_references_point_down_too():
    """A string naming a module (``"pkg.mod:Class"``, a docstring's reference) is an
    arrow a reader follows: the protocol suite names no module of the lab, the
    kernels none of either (beyond the measuring command their essays cite)."""
    modules = _modules()
    hits = []
    for mod, path in modules.items():
        for dep in string_references(path, commands=not mod.startswith("kernels")):
            if (mod.startswith("kernels") and dep.startswith(("protocols", "bench"))) or \
                    (mod.startswith("protocols") and dep.startswith("bench")):
                hits.append(f"{path.relative_to(ROOT)} names {dep}")
    assert not hits, "\n".join(sorted(hits))


def test_the_string_reference_reader_sees_a_planted_one(tmp_path):
    planted = tmp_path / "x.py"
    planted.write_text('"""Measured by bench.scenarios.causality (python -m bench.perf.icount)."""\n'
                       'PORT = "bench.runtimes.registry:RuntimeInfo"\n')
    assert string_references(planted) == {"bench.scenarios.causality", "bench.runtimes.registry",
                                          "bench.perf.icount"}
    assert string_references(planted, commands=False) == {"bench.scenarios.causality",
                                                          "bench.runtimes.registry"}


def test_benchs_top_holds_the_command_line_alone():
    top = sorted(p.name for p in (ROOT / "bench").glob("*.py"))
    assert top == ["__init__.py", "__main__.py", "cli.py", "errors.py"]


def test_every_room_says_what_it_is():
    """Each folder of bench/ is a package whose __init__ opens with what it holds."""
    for folder in sorted(p for p in (ROOT / "bench").iterdir() if p.is_dir()
                         and p.name != "__pycache__" and any(p.glob("*.py"))):
        init = folder / "__init__.py"
        assert init.exists(), f"{folder.relative_to(ROOT)} has no __init__.py"
        assert ast.get_docstring(ast.parse(init.read_text())), f"{init.relative_to(ROOT)} says nothing"


@pytest.mark.parametrize("pkg, limit", [("bench", 750), ("protocols", 750), ("kernels", 850)])
def test_no_module_too_long_to_read(pkg, limit):
    long = [f"{p.relative_to(ROOT)}: {n} lines" for p in sorted((ROOT / pkg).rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > limit]
    assert not long, "\n".join(long)


def test_the_protocol_suite_declares_no_runtime():
    """The registry, and every field that describes a runtime to the lab, live on the
    lab's side: nothing in protocols/ defines RuntimeInfo or a register()."""
    for path in sorted((ROOT / "protocols").rglob("*.py")):
        tree = ast.parse(path.read_text())
        names = {n.name for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
        assert not names & {"RuntimeInfo", "register", "PerformanceGoal", "Tracing"}, path


def test_importing_the_packages_registers_nothing():
    """Discovery happens when a registry is first asked, never as an import's side effect."""
    code = ("import protocols, kernels, bench, bench.runtimes, bench.scenarios, bench.zoo.registry\n"
            "from bench.runtimes import registry\n"
            "from bench.scenarios import api\n"
            "print(dict.__len__(registry.RUNTIMES), len(api._REGISTRY))\n"
            "print(len(registry.RUNTIMES) >= 9, len(api.scenarios()) >= 8)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "0", "True", "True"]


@pytest.mark.parametrize("old, new", [("bench.scenario", "bench.scenarios.api"),
                                      ("bench.builtin", "bench.scenarios.catalog"),
                                      ("protocols.runtimes", "bench.runtimes")])
def test_first_release_paths_still_import(old, new):
    """User scenario files and kernels written against the first release's modules run
    unchanged: an old name is the module that now holds it."""
    import importlib
    import bench  # noqa: F401 -- the old names resolve once looplab is loaded
    assert importlib.import_module(old) is importlib.import_module(new)
