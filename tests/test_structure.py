"""The shape of the code: dependencies point one way, and the seams stay where they are.

These read the source (ast), so they see function-local imports too: an import hidden
inside a function still makes a cycle a reader has to untangle.
"""
from __future__ import annotations

import ast
import pathlib
import subprocess

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


@pytest.mark.parametrize("pattern", [r"rid ==", r"runtime\.id ==", r"rt\.id ==", r"\.id in \("])
def test_no_dispatch_on_runtime_ids(pattern):
    """Behaviour that depends on a runtime lives on its RuntimeInfo, not in if-chains."""
    out = subprocess.run(["git", "grep", "-nE", pattern, "--", "bench", "protocols", "kernels"],
                         cwd=ROOT, capture_output=True, text=True)
    hits = [line for line in out.stdout.splitlines() if "protocols/runtimes.py" not in line]
    assert not hits, "\n".join(hits)
