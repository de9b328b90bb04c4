"""Scenarios: the public scenario API, the built-in scenarios S1-S8, and the processes
a scenario's cell runs in.

``from bench.scenarios import Scenario, Metric, ...`` is the public API a user's
scenario file imports (``bench.scenario``, the first release's path, still works).
The names load on first use, so importing a module of this package costs nothing
else.

* ``api``        -- ``Scenario``, ``Metric``, verdicts and their evidence, presets, the
  scenario registry and its plugins;
* ``properties`` -- ``always``, ``eventually``, ``sometimes``, ``observe``: what a run
  must keep, checked by ``looplab explore``;
* ``context``    -- what a scenario's ``run`` gets (``CellContext``, ``Job``) and the
  app process it starts (``serve_app``, ``run_program``, ``AppProcess``);
* ``appside``    -- that app process itself (``python -m bench.scenarios.appside``);
* ``simulated``  -- a cell in a simulated world (``--net sim``);
* ``catalog``    -- S1-S8, registered like any user's scenario; ``programs`` and
  ``causality`` hold their programs.
"""

__all__ = ["Scenario", "Metric", "Minimum", "Bars", "Lines", "Series", "Job", "CellContext", "Outcome", "Served",
           "Ran", "APP", "STYLES", "UNITS", "CRASH_KEY", "NOT_MEASURED", "register", "get",
           "scenarios", "load_scenario_file", "load_plugins", "plugin_spec", "serve_app",
           "run_program", "AppProcess", "abort_running", "Property", "always", "eventually",
           "sometimes", "observe"]


def __getattr__(name):
    # The face loads the API on first use: a module of this package (the app process,
    # the catalog) imports without dragging in the registry and the peers.
    if name in __all__:
        from bench.scenarios import api
        return getattr(api, name)
    raise AttributeError(f"module 'bench.scenarios' has no attribute {name!r}")
