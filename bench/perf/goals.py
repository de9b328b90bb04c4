"""The performance goals: what each kernel should reach against which reference, and
how a run of ``looplab bench goals`` judges them. Each goal is declared on its
runtime (``RuntimeInfo.goals``, ``bench.runtimes.builtin`` for ours).

Goals are benchmarks, not tests. Each is judged on the median of per-round *paired*
ratios (subject and reference measured in the same round), and reported with the range
of those ratios, met or not. The echo goals against uvloop are stated in server CPU per
request (the reference's over ours, so > 1 means ours is cheaper): at ~100k req/s the load
client saturates before uvloop does, which squeezes req/s ratios toward 1. Every echo row
shows the req/s ratio, the CPU ratio and the CPU ratio without system time side by side,
whichever one it is judged on. On loopback the system time (the kernel's TCP work, a
large share of every request and much the same for every runtime) squeezes the CPU ratios
too: for a CPU goal not met, ``budget_lines`` says what user time the goal leaves.
``count_instructions`` (``bench goals --instructions``) adds each goal's instruction
counts under callgrind, with every runtime served as the timed goals serve it.

The interpreter axis: ``run_goals(pythons=["3.12", "3.13"])`` measures every goal's
runtimes once per interpreter (``coro@3.12`` against ``curio@3.12``), and each goal is
judged per interpreter, against the reference on the same one: a goal row carries its
``python`` (None: the interpreter looplab runs in).
"""
from __future__ import annotations

import shutil
import statistics
import tempfile
from dataclasses import dataclass

from bench.errors import UsageError
from bench.perf.echo import KiB, by_round, echo_units, paired, run_echo_matrix
from bench.perf import icount
from bench.perf.machine import Interrupted, bench_runtime, check_stop, progress, split_available
from bench.perf.micro import run_micro_matrix
from bench.results.tables import MISSING, fmt_seconds, format_table
from bench import runtimes

__all__ = ["Goal", "GOALS", "GOAL_ECHO_RUNTIMES", "GOAL_MICRO_OPS", "GOAL_MICRO_RUNTIMES",
           "evaluate_goals", "goals_table", "budget_lines", "goal_runtimes", "run_goals",
           "icount_missing", "count_instructions", "attach_instructions", "ICOUNT_ECHO",
           "ICOUNT_MICRO"]

RATE, CPU = "req/s", "server CPU/req"


@dataclass(frozen=True)
class Goal:
    kind: str           # "echo", or the micro-benchmark op
    subject: str
    reference: str
    target: float
    what: str
    judged_on: str = RATE   # echo goals: RATE or CPU; micro goals: operations per second
    beside: tuple = ()      # references shown next to the judged ratio, not judged

    @property
    def text(self) -> str:
        return f"{self.subject} {self.what} >= {self.target:g}x {self.reference}"


def declared_goals() -> list[Goal]:
    """Every registered runtime's goals (``RuntimeInfo.goals``), in registry order."""
    return [Goal(g.kind, info.id, g.reference, g.target, g.what, g.judged_on, tuple(g.beside))
            for info in runtimes.RUNTIMES.values() for g in info.goals]


def _runtimes_of(goals, echo: bool) -> list[str]:
    out: list[str] = []
    for g in goals:
        if (g.kind == "echo") == echo:
            out += [r for r in (g.subject, g.reference, *g.beside) if r not in out]
    return out


# The goals and the runtimes they measure, as registered when this module was
# imported (built-ins and plugins loaded by then).
GOALS = declared_goals()
GOAL_ECHO_RUNTIMES = _runtimes_of(GOALS, echo=True)
GOAL_MICRO_OPS = ["yield", "spawn_join", "pingpong"]
GOAL_MICRO_RUNTIMES = _runtimes_of(GOALS, echo=False)


def _summary(ratios: list[float]) -> dict:
    if not ratios:
        return {"ratio": None, "min": None, "max": None, "n": 0}
    return {"ratio": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
            "n": len(ratios)}


def _status(s: dict, target: float) -> str:
    if s["ratio"] is None:
        return "not measured"
    status = "met" if s["ratio"] >= target else f"not met (gap {1 - s['ratio'] / target:.0%})"
    if s["n"] > 1 and s["min"] < target <= s["max"]:
        status += " (borderline)"
    return status


NOT_JUDGED = "not judged (interrupted run)"


def unjudged_if_interrupted(rows: list[dict], interrupted: bool) -> list[dict]:
    """An interrupted run's rounds were cut short and its machine was busy being
    stopped: a goal it did not reach is not judged from it (one it met stays met)."""
    if not interrupted:
        return rows
    return [{**r, "status": NOT_JUDGED} if str(r.get("status", "")).startswith("not met") else r
            for r in rows]



def evaluate_goals(cells: list[dict], pythons=(None,)) -> list[dict]:
    """One row per goal::

        {"goal", "kind", "subject", "reference", "target", "judged_on",
         "ratio", "min", "max", "n", "status",
         "rate": {ratio, min, max, n}, "cpu": {ratio, min, max, n},
         "user": {ratio, min, max, n},      # echo rows only; user: CPU without system time
         "user_budget": {user_s, over_s, now_user_s, system_s, reference_user_s,
                         reference_system_s, n}}   # echo goals judged on CPU

    ``ratio``/``min``/``max`` are those of the metric the goal is judged on: the median
    of paired per-round ratios and their range. "met" when the median reaches the
    target; "borderline" when the range straddles it. One row per goal and interpreter
    of ``pythons`` (each row also has ``python``)."""
    by = {}
    for c in cells:
        key = "echo" if c["scenario"] == "echo" else c["variant"]
        by[(key, c["runtime"])] = c
    rows = []
    for python in pythons:
        for g in GOALS:
            rows.append(_goal_row(g, python, by))
    return rows


def _goal_row(g: Goal, python: str | None, by: dict) -> dict:
    a = by.get((g.kind, runtimes.on_interpreter(g.subject, python)))
    b = by.get((g.kind, runtimes.on_interpreter(g.reference, python)))
    row = {"goal": g.text, "kind": g.kind, "subject": g.subject, "reference": g.reference,
           "target": g.target, "judged_on": g.judged_on, "python": python}
    if g.kind == "echo":
        rate = _summary(paired(a, b, "requests_per_s") if a and b else [])
        # The reference's CPU per request over ours: > 1 means ours is cheaper.
        cpu = _summary(paired(b, a, "server_cpu_per_request_s") if a and b else [])
        # The same with the system time left out (shown, not judged): on loopback the
        # kernel's TCP work is a large share of every request and differs little
        # between runtimes, so this is closer to the ratio of what the runtimes do.
        user = _summary(paired(b, a, "server_user_cpu_per_request_s") if a and b else [])
        row.update(rate=rate, cpu=cpu, user=user)
        if g.judged_on == CPU and a and b:
            budget = _user_budget(a, b, g.target)
            if budget is not None:
                row["user_budget"] = budget
        judged = cpu if g.judged_on == CPU else rate
        beside = {}
        for spec in g.beside:
            c = by.get((g.kind, runtimes.on_interpreter(spec, python)))
            pairs = (paired(c, a, "server_cpu_per_request_s") if g.judged_on == CPU
                     else paired(a, c, "requests_per_s")) if a and c else []
            beside[spec] = _summary(pairs)
        if beside:
            row["beside"] = beside
    else:
        judged = _summary(paired(a, b, "ops_per_s") if a and b else [])
    row.update(judged, status=_status(judged, g.target))
    return row


def _user_budget(subject: dict, reference: dict, target: float) -> dict | None:
    """What a CPU goal leaves the subject for its own (user) work, per paired round:
    the reference's CPU per request over the target, less the subject's system time
    (mostly the kernel's TCP work, which differs little between runtimes). Medians
    over the rounds: ``user_s`` (the most the subject may spend; <= 0: its system time
    alone is over what the goal allows), ``over_s`` (how much more it spends; > 0 in
    the rounds the goal was missed, so its sign agrees with the judged median),
    ``now_user_s``, ``system_s``, ``reference_user_s``, ``reference_system_s``."""
    if not target > 0:
        return None
    u, y = "server_user_cpu_per_request_s", "server_system_cpu_per_request_s"
    su, ss, ru, rs = (by_round(c, k) for c in (subject, reference) for k in (u, y))
    rounds = [r for r in su if r in ss and r in ru and r in rs
              and None not in (su[r], ss[r], ru[r], rs[r])]
    if not rounds:
        return None
    allowed = {r: (ru[r] + rs[r]) / target - ss[r] for r in rounds}
    med = statistics.median
    return {"user_s": med(allowed.values()), "over_s": med(su[r] - allowed[r] for r in rounds),
            "now_user_s": med(su[r] for r in rounds), "system_s": med(ss[r] for r in rounds),
            "reference_user_s": med(ru[r] for r in rounds),
            "reference_system_s": med(rs[r] for r in rounds), "n": len(rounds)}


def budget_lines(rows: list[dict]) -> list[str]:
    """One line per CPU goal not met: the user CPU per request the subject may
    spend for the goal to hold, against what it spends."""
    out = []
    for r in rows:
        b = r.get("user_budget")
        if not b or not str(r.get("status", "")).startswith("not met"):
            continue
        sub, ref = r["subject"], r["reference"]
        where = f" on {r['python']}" if r.get("python") else ""
        head = (f"{r['goal']}{where}: {ref} spends {fmt_seconds(b['reference_user_s'])} user + "
                f"{fmt_seconds(b['reference_system_s'])} system per request, {sub} "
                f"{fmt_seconds(b['system_s'])} system")
        if b["user_s"] <= 0:
            out.append(f"{head}: {sub}'s system time alone is over what the goal allows")
        else:
            # The median excess of the paired rounds, not the difference of the two
            # medians: only it has the sign of the judged median.
            out.append(f"{head}, so {sub}'s user time must be at most "
                       f"{fmt_seconds(b['user_s'])} per request (it is "
                       f"{fmt_seconds(b['now_user_s'])}; round by round, the median excess is "
                       f"{fmt_seconds(b['over_s'])})")
    return out


# Instruction counts (``--instructions``): the same counts as ``python -m
# bench.perf.icount``, taken once per runtime. Echo: requests spread over 10
# connections with a pause between rounds, so every round takes the same path;
# micro: whole processes of ``small`` and ``large`` operations.
ICOUNT_ECHO = (2000, 10000, 0.005)
ICOUNT_MICRO = (300, 1500)


def icount_missing() -> str | None:
    """Why instructions cannot be counted here (valgrind's callgrind), or None."""
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            return f"{tool} is not on PATH (install valgrind to count instructions)"
    return None


def _canonical(spec: str) -> str:
    """The spec as the registry spells it (an interpreter path resolved and so on),
    so that the counts and the goal rows meet on one key."""
    try:
        return runtimes.parse(spec).spec
    except UsageError:
        return spec


def count_instructions(pythons=(None,), progress=progress) -> dict:
    """Instructions per echo request or per micro operation of every goal's
    subject and reference (not the runtimes shown beside), under callgrind:
    ``{(kind, spec): count or "error: ..."}``, a count per runtime and kind."""
    wanted = []
    for python in pythons:
        for g in GOALS:
            for spec in (g.subject, g.reference):
                key = (g.kind, _canonical(runtimes.on_interpreter(spec, python)))
                if key not in wanted:
                    wanted.append(key)
    rts, _skipped = split_available(runtimes.parse_list(",".join(dict.fromkeys(s for _, s in wanted))))
    available = {rt.spec for rt in rts}
    out = {}
    with tempfile.TemporaryDirectory(prefix="looplab-icount-") as tmp:
        for i, (kind, spec) in enumerate(wanted, 1):
            check_stop()
            if spec not in available:
                continue
            progress(f"[{i}/{len(wanted)}] instructions: {kind} on {spec}")
            try:
                served = bench_runtime(runtimes.parse(spec)).spec
                if kind == "echo":
                    small, large, pause = ICOUNT_ECHO
                    out[(kind, spec)] = icount.per_request(served, 10, KiB, small, large, tmp,
                                                           pause=pause)[0][0]
                else:
                    out[(kind, spec)] = icount.per_operation(kind, served, *ICOUNT_MICRO, tmp)[0]
            except Exception as exc:          # one runtime's failure is its cell's, not the run's
                text = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
                out[(kind, spec)] = f"error ({spec}): {text[:200]}"
    return out


def attach_instructions(rows: list[dict], counts: dict) -> None:
    """Each goal row gets ``instructions``: ``{"subject", "reference", "ratio"}``
    (the reference's count over ours, > 1: ours executes fewer), or the error."""
    for r in rows:
        kind = r["kind"]
        a = counts.get((kind, _canonical(runtimes.on_interpreter(r["subject"], r.get("python")))))
        b = counts.get((kind, _canonical(runtimes.on_interpreter(r["reference"], r.get("python")))))
        entry = {"subject": a, "reference": b, "ratio": None}
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a > 0:
            entry["ratio"] = b / a
        r["instructions"] = entry


def _instructions_text(r: dict) -> str:
    i = r.get("instructions")
    if not i:
        return MISSING
    if i["ratio"] is None:
        err = next((v for v in (i["subject"], i["reference"]) if isinstance(v, str)), None)
        return err or MISSING
    return f"{i['ratio']:.2f} ({i['subject']:,.0f} vs {i['reference']:,.0f})"


def _ratio_text(s: dict | None) -> str:
    if not s or s.get("ratio") is None:
        return MISSING
    if s["n"] > 1:
        return f"{s['ratio']:.2f} ({s['min']:.2f}-{s['max']:.2f})"
    return f"{s['ratio']:.2f}"


def _beside_text(beside: dict | None) -> str:
    if not beside:
        return ""
    return "; ".join(f"{spec}: {_ratio_text(s)}" for spec, s in beside.items())


def goals_table(rows: list[dict], markdown: bool = False) -> str:
    """The goal table: judged ratio beside the echo ratios (req/s, server CPU per
    request, and its user part alone), each a median (range)."""
    table = [[r["goal"], r["judged_on"], _ratio_text(r), _ratio_text(r.get("rate")),
              _ratio_text(r.get("cpu")), _ratio_text(r.get("user")), r["n"], r["status"],
              _beside_text(r.get("beside"))]
             for r in rows]
    head = ["goal", "judged on", "median (range)", "req/s ratio", "server CPU/req ratio",
            "user CPU/req ratio", "rounds", "status", "same ratio against (not judged)"]
    align = "llrrrrrll"
    if any(r.get("instructions") for r in rows):
        # reference over ours, ours and the reference per request or operation
        table = [line + [_instructions_text(r)] for r, line in zip(rows, table)]
        head, align = head + ["instructions: reference over ours (ours vs reference)"], align + "r"
    if any(r.get("python") for r in rows):
        table = [[r.get("python") or "looplab's"] + line for r, line in zip(rows, table)]
        head, align = ["python"] + head, "l" + align
    return format_table(head, table, markdown, align=align)


def goal_runtimes(pythons=(None,)) -> list:
    """Every runtime the goals measure, once per interpreter of ``pythons``."""
    return runtimes.parse_list(",".join(runtimes.on_interpreter(spec, python) for python in pythons
                                        for spec in GOAL_ECHO_RUNTIMES))


def run_goals(repeat: int = 5, duration: float = 2.0, warmup: float = 1.0, min_time: float = 0.3,
              client=None, pinned: bool = True, progress=progress,
              pythons=(None,)) -> tuple[list[dict], list[dict], dict]:
    """Exactly the measurements behind GOALS, once per interpreter of ``pythons`` (None:
    looplab's own). Returns (cells, goal rows, skipped); on SIGINT/SIGTERM raises
    Interrupted with the cells measured so far."""
    rts, skipped = split_available(goal_runtimes(pythons))
    cells = []
    if rts:
        cells += run_echo_matrix(echo_units(rts, [1 * KiB], [10]), duration, warmup, repeat,
                                 client, pinned, progress)
    units = [(op, rt) for op in GOAL_MICRO_OPS for rt in rts if rt.id in GOAL_MICRO_RUNTIMES]
    if units:
        try:
            cells += run_micro_matrix(units, repeat, min_time, pinned, progress)
        except Interrupted as exc:
            raise Interrupted(cells + exc.cells) from None
    return cells, evaluate_goals(cells, pythons), skipped
