"""Running a matrix: the planner (``plan``: verbs and axes become cells carrying
their Scenario and Runtime), one cell on its network (``cells``, ``net``: the
real loopback and the simulated world behind one interface), and the runner
(``runner``: jobs, progress, signals, finished cells flushed as they come).

The pipeline reads: verb -> ``plan`` -> ``Runner`` -> results document
(``bench.results``) -> rendering (``bench.report``), which reads only the document.
"""
from bench.run.repeats import new_result, run_cell
from bench.run.plan import Cell, plan, split, with_net
from bench.run.plan import why_empty as plan_why_empty
from bench.run.runner import (Runner, check_outputs, default_out_dir, exit_code, outputs_checked,
                              progress_printer, run_matrix)

__all__ = ["Cell", "plan", "plan_why_empty", "split", "with_net", "run_cell", "new_result", "run_matrix",
           "Runner", "check_outputs", "outputs_checked", "default_out_dir", "exit_code",
           "progress_printer"]
