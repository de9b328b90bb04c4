"""The runner: planned cells in, finished results out, for every verb that runs cells
(``run``, the main report, ``repro``, and any verb that hands it cells).

What it does for all of them, once: runs ``jobs`` cells at a time; prints a
progress line per finished cell; treats SIGTERM as SIGINT; and writes each
finished cell at once to ``OUT/results.json``, so an interrupt keeps it. An
interrupted run's document says so (``incomplete``: how many of the planned
cells finished), and so does every report rendered from it. The verb supplies
the document around the cells (``document(results, incomplete)``); output paths
are checked up front (``check_outputs``) before anything runs.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

from bench.results.tables import plural
from bench import results as resmod
from bench.scenarios import api as scmod
from bench.errors import ExitCode, UsageError
from bench.run.repeats import run_cell

__all__ = ["Terminated", "signals_interrupt", "run_matrix", "Runner", "check_outputs",
           "outputs_checked", "default_out_dir", "progress_printer", "exit_code",
           "interrupted_line", "nothing_measured"]


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where SIGINT would be, so both keep the finished cells."""


def _on_sigterm(signum, frame):
    raise Terminated()


@contextlib.contextmanager
def signals_interrupt():
    """Inside: SIGTERM raises KeyboardInterrupt (``Terminated``) as SIGINT does.
    Only the main thread may set handlers; elsewhere this changes nothing."""
    try:
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:          # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def default_out_dir() -> str:
    return os.path.join("looplab-runs", time.strftime("%Y%m%d-%H%M%S", time.localtime()))


def check_outputs(out_dir: str | None = None, json_path: str | None = None) -> None:
    """Before the first cell: every output path can be written (UsageError if not).
    Checking creates nothing (``bench.results.check_output``): the folders are made
    when the first file is written, so a run that stops before that leaves none."""
    if json_path:
        resmod.check_output(json_path, "--json")
    if out_dir:
        resmod.check_output(out_dir, "--out", folder=True)


@contextlib.contextmanager
def outputs_checked(out_dir: str | None, json_path: str | None):
    """``check_outputs``, then the block (the checks that must come after it, such as
    building environments)."""
    check_outputs(out_dir, json_path)
    yield


def progress_printer(stream=None):
    # bound now: a simulated cell's program captures sys.stderr while it runs
    out = stream or sys.stderr
    start = time.monotonic()

    def show(i, n, result):
        status = "skipped" if result.get("skipped") else (
            "ERROR" if result["errors"] and all(v is None for v in result["verdicts"].values())
            else "ok")
        out.write(f"[{i}/{n}] {time.monotonic() - start:5.1f}s {result['id']:<60} {status}\n")
        out.flush()
    return show


def run_matrix(cells: list, jobs: int = 1, progress=None) -> tuple[list[dict], bool]:
    """Run cells, ``jobs`` at a time; returns (finished results in plan order,
    interrupted). ``progress(i, n, result)`` is called as each finishes (the caller
    flushes it to disk there). KeyboardInterrupt or SIGTERM stops the matrix:
    running cells are killed and dropped, finished ones are kept."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise UsageError(f"--jobs must be a whole number >= 1, got {jobs!r}")
    cores = os.cpu_count() or 1
    if jobs > cores:
        # Each cell is a runtime process plus a peer process with deadlines: more of
        # them than cores starves cells (they then end "not measured", never a pass).
        print(f"looplab: warning: --jobs {jobs} is more than this machine's {cores} cores; "
              "cells may be starved (each records the load average)", file=sys.stderr)
    results: list[dict | None] = [None] * len(cells)
    interrupted = False
    with signals_interrupt():
        pool = ThreadPoolExecutor(max_workers=jobs)
        futures = {pool.submit(run_cell, c): i for i, c in enumerate(cells)}
        done = 0
        try:
            try:
                for fut in as_completed(futures):
                    i = futures[fut]
                    results[i] = fut.result()
                    done += 1
                    if progress:
                        progress(done, len(cells), results[i])
            except KeyboardInterrupt:
                interrupted = True
                for f in futures:
                    f.cancel()
                scmod.abort_running()
            finally:
                pool.shutdown(wait=True, cancel_futures=True)
        except KeyboardInterrupt:     # a second signal while the running cells were stopped
            interrupted = True
    return [r for r in results if r is not None], interrupted


def interrupted_line(done: int, planned: int, where: str) -> str:
    return f"looplab: interrupted: {done} of {plural(planned, 'cell')} finished, kept in {where}"


class Runner:
    """One run of planned cells into a results document.

    ``document(results, incomplete)`` builds the document around the finished
    results (``incomplete`` is None, or ``{"finished": n, "planned": m}``). With
    ``out_dir``, each finished cell is flushed to ``out_dir/results.json`` as it
    completes."""

    def __init__(self, cells: list, document, *, out_dir: str | None = None, jobs: int = 1,
                 extra_results: dict | None = None):
        self.cells = cells
        self.document = document
        self.out_dir = out_dir
        self.jobs = jobs
        self.extra = dict(extra_results or {})     # results decided without running (skips)
        self.finished: list[dict] = []
        self.interrupted = False

    def _ordered(self, results):
        order = {c.id: i for i, c in enumerate(self.cells)}
        for i, cid in enumerate(self.extra):
            order.setdefault(cid, len(self.cells) + i)
        return sorted(results, key=lambda r: order.get(r["id"], 0))

    def incomplete(self):
        if not self.interrupted:
            return None
        return {"finished": len(self.finished) + len(self.extra),
                "planned": len(self.cells) + len(self.extra), "reason": "interrupted"}

    def doc(self) -> dict:
        return self.document(self._ordered(self.finished + list(self.extra.values())),
                             self.incomplete())

    def run(self) -> dict:
        """Run every cell; returns the document (``self.interrupted`` says whether
        it stopped early)."""
        show = progress_printer()

        def progress(i, n, result):
            self.finished.append(result)
            show(i, n, result)
            if self.out_dir:
                self.flush()

        try:
            _, self.interrupted = run_matrix(self.cells, self.jobs, progress)
        except KeyboardInterrupt:      # landed outside the matrix's own handler
            self.interrupted = True
        return self.doc()

    def flush(self, doc: dict | None = None) -> str:
        path = os.path.join(self.out_dir, "results.json")
        resmod.write_json(doc or self.doc(), path)
        return path


def nothing_measured(cells: list[dict]) -> str | None:
    """The line a run prints when no cell measured anything (every cell skipped),
    else None: such a run must not pass a CI gate on nothing."""
    if any(not r.get("skipped") for r in cells):
        return None
    reasons = list(dict.fromkeys(str(r["skipped"]) for r in cells))
    why = f": {reasons[0]}" + (f" (and {plural(len(reasons) - 1, 'other reason')})"
                               if len(reasons) > 1 else "") if reasons else ""
    return (f"looplab: no cell measured anything: {'all ' if len(cells) > 1 else ''}"
            f"{plural(len(cells), 'cell')} skipped{why}")


def exit_code(doc: dict) -> int:
    """A finished run's exit: 1 when a cell errored (every cell erroring included)
    or when no cell measured anything (every cell skipped), else 0."""
    cells = doc["cells"]
    if any(r.get("errors") for r in cells) or nothing_measured(cells):
        return ExitCode.FAILED
    return ExitCode.OK
