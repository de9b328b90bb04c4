"""Schedule exploration (``looplab explore``): run one target under many
schedules of its scheduling choices, find the order that breaks it, shrink
that order, and prove a fix within a bound of delays.

* ``search``  -- the legality model (which choices a runtime's contract
  leaves open), the per-run chooser (``Recorder``) and the strategies
  (random walk, PCT, delay-bounded search);
* ``targets`` -- what runs: simulated cells (scenarios, variants, zoo
  entries) through the world hook of ``bench.scenarios.simulated``, and asyncio
  programs; their properties and the liveness phase;
* ``bugs``    -- the benchmark list and three interleaving bugs from real
  threads as small programs;
* ``checks``  -- declared properties (``always``, ``eventually``,
  ``sometimes``: ``bench.scenarios.properties``) checked during a run, the labelled trace
  of a failing run beside the nearest passing one, and the tasks of a
  deadlocked cell;
* ``exploration`` -- one exploration: strategy loop, shrinking, replay files;
* ``verb``    -- the command line (``explore``, ``explore --bench``).

* ``programs`` -- a user's program as a target (``file.py:NAME``,
  ``package.module:NAME``) and how one run of a program goes;
* ``where``   -- task lines and choice labels in the user's terms (file:line,
  task, connection);
* ``pytest_marker`` -- ``@pytest.mark.looplab``, imported by the plugin only
  for a marked test.

The choice points themselves live in the kernels (``kernels.choice``).

Public: ``Bug`` (a program in two versions, ``Bug(naive=..., fixed=...)``) and
``Context`` (what a program that takes one argument gets), imported on first use.
"""

__all__ = ["Bug", "Context"]


def __getattr__(name):
    if name in ("Bug", "Context"):
        from bench.explore import bugs
        return getattr(bugs, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
