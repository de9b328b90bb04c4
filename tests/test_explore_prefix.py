"""``delays:D`` with shared prefixes (``bench.explore.prefix``): a forked
universe runs exactly the schedules a re-run would, with the same choices and
outcomes; no zombie, no descriptor left; no fork where it would not be sound."""
from __future__ import annotations

import os
import re
import threading

import pytest

from bench import cli
from bench.explore import exploration, prefix, search, targets
from bench.explore.targets import RunResult

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is not available here")


def _zombies() -> list:
    me, found = os.getpid(), []
    for pid in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == me and fields[0] == "Z":
                found.append(int(pid))
    return found


def _rerun(t, rt, variant, D):
    """Every schedule of DelayBounded: {deviations: (choices digest, outcome)}."""
    legal = search.legal_kinds(rt)
    strat = search.DelayBounded(D, max_queue=10 ** 6)
    out = {}
    while (decide := strat.next()) is not None:
        rec = exploration.recorder(t, rt, variant, legal, decide)
        r = exploration.execute(t, rt, variant, rec)
        out[tuple(sorted(strat.current[0].items()))] = (search.points_digest(rec.points), r.outcome)
        strat.done(rec, r.failed)
    return out, strat


def _forked(t, rt, variant, D, budget=10 ** 6, how="always"):
    legal = search.legal_kinds(rt)
    res = prefix.search(t, rt, variant, legal, D, budget, keep_log=True, how=how,
                        make_recorder=lambda d: exploration.recorder(t, rt, variant, legal, d),
                        execute=lambda rec: exploration.execute(t, rt, variant, rec))
    return {devs: (digest, outcome) for devs, digest, outcome in res.tally.log}, res


@pytest.mark.parametrize("name,preset,rt,D", [
    ("cpython-23812", "tiny", "asyncio", 2),       # asyncio's running loop in the child
    ("cpython-23812", "tiny", "callback", 2),
    ("S3", "tiny", "callback", 1),                  # a cell, with its declared property
])
def test_forked_universes_run_the_same_schedules_as_reruns(name, preset, rt, D):
    t = targets.resolve(name, preset)
    variant = t.variants[-1]
    want, strat = _rerun(t, rt, variant, D)
    got, res = _forked(t, rt, variant, D)
    assert got == want            # each schedule once, same choices, same outcome
    assert res.runs == strat.runs and res.exhausted and strat.exhausted
    assert res.summary["forks"] == res.runs - 1 and res.children_cpu > 0
    assert not _zombies()


def test_a_failure_found_in_a_forked_child_stops_the_search_and_replays():
    t = targets.resolve("cpython-27585")
    got, res = _forked(t, "asyncio", "naive", 2)
    index, failing, r = res.first
    assert r.failed and r.outcome.startswith("hang") and not res.exhausted
    # after it only the runs of its chain of parents ended (at most one per delay)
    assert index < res.runs <= index + 2 and res.runs < 20
    # the failing child's deviations replay to the same failure in this process
    legal = search.legal_kinds("asyncio")
    _, again = exploration._run(t, "asyncio", "naive", legal, failing.deviations())
    assert again.outcome == r.outcome
    assert not _zombies()


def test_a_budget_too_small_is_no_proof_and_is_kept():
    t = targets.resolve("cpython-23812")
    _, res = _forked(t, "callback", "fixed", 2, budget=40)
    assert res.runs <= 40 and not res.exhausted
    r = exploration.explore(t, "callback", "fixed", "delays:2", 40)
    assert "proved" not in r and r["schedules"] <= 40


def test_auto_forks_only_where_a_fork_costs_less_than_the_prefix(monkeypatch):
    t = targets.resolve("cpython-23812")
    want, _ = _rerun(t, "callback", "fixed", 2)
    costs = []
    real = prefix.Costs.pays

    def pays(self, step):
        costs.append(self.fork_cost())
        return real(self, step)
    monkeypatch.setattr(prefix.Costs, "pays", pays)
    got, res = _forked(t, "callback", "fixed", 2, how="auto")
    assert got == want
    # a program's universe costs well under a fork: after the runs that measure,
    # a fork happens only while the estimate is below a prefix, and stops after
    assert res.summary["reruns"] > res.summary["forks"]
    assert res.summary["run_cpu_s"] > 0


def test_the_verb_proves_the_same_bound_forked_or_not(monkeypatch, capsys):
    argv = ["explore", "cpython-23812", "--variant", "fixed", "--runtimes", "callback",
            "--strategy", "delays:2"]
    proofs = []
    for how in ("never", "always"):
        monkeypatch.setenv(prefix.ENV, how)
        assert cli.main(argv) == 0
        proofs.append(next(l for l in capsys.readouterr().out.splitlines() if "proved:" in l))
    assert proofs[0] == proofs[1]
    assert re.fullmatch(r"    proved: no failing schedule within 2 delays \(\d+ schedules\)", proofs[0])


def test_no_fork_with_a_thread_alive_or_a_real_descriptor_opened():
    base = prefix._open_fds()
    assert prefix.fork_safe(base) is None
    r, w = os.pipe()
    try:
        assert "real file descriptors" in prefix.fork_safe(base)
        assert prefix.fork_safe(base, own=(r, w)) is None
    finally:
        os.close(r)
        os.close(w)
    stop = threading.Event()
    th = threading.Thread(target=stop.wait, args=(5,))
    th.start()
    try:
        assert "thread" in prefix.fork_safe(base)
    finally:
        stop.set()
        th.join()


class _Opens:
    """A target whose run opens a real descriptor before its choice points."""
    name, kind, variants, properties, params = "opens", "program", ("v",), (), {}

    def run(self, runtime, variant, chooser):
        r, w = os.pipe()
        try:
            seen = [chooser.choose("net", 2) for _ in range(4)]
        finally:
            os.close(r)
            os.close(w)
        return RunResult(False, f"ok {seen}")


def test_a_run_holding_a_real_descriptor_is_rerun_not_forked():
    t = _Opens()
    legal = frozenset({"net"})
    res = prefix.search(t, "x", "v", legal, 2, 100, keep_log=True, how="always",
                        make_recorder=lambda d: search.Recorder(legal, d),
                        execute=lambda rec: t.run("x", "v", rec))
    assert res.summary["forks"] == 0 and res.runs == 1 + 4 + 6 and res.exhausted
    assert "real file descriptors" in res.summary["line"]


class _Dies:
    """A target whose forked schedules die without a word."""
    name, kind, variants, properties, params = "dies", "program", ("v",), (), {}

    def __init__(self):
        self.root = os.getpid()

    def run(self, runtime, variant, chooser):
        seen = [chooser.choose("net", 2) for _ in range(3)]
        if os.getpid() != self.root:
            os._exit(3)
        return RunResult(False, f"ok {seen}")


def test_a_forked_schedule_that_dies_without_its_report_is_no_proof():
    t = _Dies()
    legal = frozenset({"net"})
    res = prefix.search(t, "x", "v", legal, 1, 100, how="always",
                        make_recorder=lambda d: search.Recorder(legal, d),
                        execute=lambda rec: t.run("x", "v", rec))
    assert not res.exhausted and "exit status 3" in res.lost
    assert not _zombies()


def test_without_fork_the_prefixes_are_rerun(monkeypatch):
    monkeypatch.delattr(os, "fork")
    assert prefix.mode() == "never"
    monkeypatch.undo()
    monkeypatch.setenv(prefix.ENV, "rerun")
    assert prefix.mode() == "never"
    t = targets.resolve("cpython-23812")
    r = exploration.explore(t, "callback", "fixed", "delays:1", 100)
    assert r["proved"] == f"proved: no failing schedule within 1 delay ({r['schedules']} schedules)"
    assert r["schedules"] > 1 and "forks" not in r["strategy_info"]
