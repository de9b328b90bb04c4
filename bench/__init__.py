"""looplab's harness: the lab around the kernels and the protocol suite.

A folder per stage (docs/layout.md): ``runtimes`` (the registry), ``scenarios``,
``run``, ``host``, ``results``, ``report``, ``verbs`` (the command line and the
pytest plugin), and the rooms for ``peers``, ``zoo``, ``explore``, ``fidelity`` and
``perf``. Only ``cli``, ``errors`` and ``__main__`` sit at the top.

Modules that moved keep their first-release names for code written against them
(a user's scenario file importing ``bench.scenario``, a kernel importing
``protocols.runtimes``): ``MOVED`` maps each old name to its home, and an import
of an old name gives that very module. The lookup answers only names nothing
else finds, so it never shadows a module that exists.
"""
import importlib
import importlib.abc
import importlib.util
import sys

#: first-release module name -> where it lives now (docs/api.md, "Moved")
MOVED = {
    "bench.builtin": "bench.scenarios.catalog",
    "bench.causality": "bench.scenarios.causality",
    "bench.cell": "bench.scenarios.appside",
    "bench.cellrun": "bench.scenarios.context",
    "bench.programs": "bench.scenarios.programs",
    "bench.props": "bench.scenarios.properties",
    "bench.scenario": "bench.scenarios.api",
    "bench.simcells": "bench.scenarios.simulated",
    "bench.simruns": "bench.run.seeds",
    "bench.compare": "bench.results.compare",
    "bench.tables": "bench.results.tables",
    "bench.envs": "bench.host.envs",
    "bench.procs": "bench.host.procs",
    "bench.faults": "bench.verbs.faults",
    "bench.tracing": "bench.fidelity.tracing",
    "protocols.runtimes": "bench.runtimes",
    "protocols.builtin": "bench.runtimes.builtin",
    "protocols.pytest_plugin": "bench.verbs.pytest_plugin",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers an old module name with the module that now holds it."""

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name in MOVED else None

    def create_module(self, spec):
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module):
        pass


if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
    sys.meta_path.append(_MovedModules())
