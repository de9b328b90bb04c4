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
* ``runner``  -- one exploration: strategy loop, shrinking, replay files;
* ``verb``    -- the command line (``explore``, ``explore --bench``).

The choice points themselves live in the kernels (``kernels.choice``).
"""
