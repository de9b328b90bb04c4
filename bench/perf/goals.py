"""The performance goals: what each kernel should reach against which reference, and
how a run of ``looplab bench goals`` judges them. Each goal is declared on its
runtime (``RuntimeInfo.goals``, ``bench.runtimes.builtin`` for ours).

Goals are benchmarks, not tests, and are judged in one of two ways.

* **On instructions** (``judged_on`` "instructions", the kernel goals): the subject's
  instructions per echo request or per operation under callgrind
  (``count_instructions``, the counts of ``python -m bench.perf.icount``), over the
  reference's, should stay at or under the target. Every runtime is served as the
  timed goals serve it (references without their measuring proxy). A count does not
  move with the machine's load, but an echo count moves with how many of a round's
  ten requests one pass of the server finds (about 1 % either way), so each echo
  count is taken ``ICOUNT_ECHO_REPEAT`` times, subject and reference alternating, and
  judged as the timed goals are: the median of the paired ratios, the range beside
  it, "borderline" when the range straddles the target. A micro-benchmark count is a
  whole process and repeats exactly: it is taken once. A count that failed or was
  not taken leaves the goal "not measured", never met. Beside it: the timed CPU ratios, ours over the reference's,
  as information only, and the Python opcodes by function of both sides
  (``count_opcodes``, ``bench.perf.opcodes``), so a reader sees where the rest goes.
* **Timed**: the median of per-round *paired* ratios (subject and reference measured
  in the same round), with their range, "borderline" when the range straddles the
  target. Echo goals on server CPU per request (the reference's over ours, so > 1
  means ours is cheaper) or on req/s; micro goals on operations per second. Every
  echo row shows the req/s ratio, the CPU ratio and the CPU ratio without system time
  side by side, whichever it is judged on; for a CPU goal not met, ``budget_lines``
  says what user time the goal leaves.

The interpreter axis: ``run_goals(pythons=["3.12", "3.13"])`` measures every goal's
runtimes once per interpreter (``coro@3.12`` against ``curio@3.12``), and
``count_instructions``/``count_opcodes`` count on each; a goal is judged per
interpreter, against the reference on the same one: a goal row carries its
``python`` (None: the interpreter looplab runs in).
"""
from __future__ import annotations

import itertools
import math
import platform
import shutil
import statistics
import tempfile
from dataclasses import dataclass

from bench.errors import UsageError
from bench.host import envs
from bench.perf.echo import KiB, by_round, echo_units, paired, run_echo_matrix
from bench.perf import icount, opcodes
from bench.perf.machine import Interrupted, bench_runtime, check_stop, progress, split_available
from bench.perf.micro import run_micro_matrix
from bench.results.tables import MISSING, fmt_seconds, format_table
from bench import runtimes

__all__ = ["Goal", "GOALS", "GOAL_ECHO_RUNTIMES", "GOAL_MICRO_OPS", "GOAL_MICRO_RUNTIMES",
           "GOAL_MICRO_UNITS", "INSTRUCTIONS", "FLOOR", "NOT_MEASURED", "evaluate_goals",
           "goals_table", "instruction_table", "instruction_cells", "INSTRUCTION_HEAD",
           "breakdown", "breakdown_tables", "count_problems", "counting_note", "budget_lines",
           "goal_sections", "goal_runtimes", "run_goals", "icount_missing", "count_instructions",
           "attach_instructions", "count_opcodes", "attach_opcodes", "counting_config",
           "ICOUNT_ECHO", "ICOUNT_ECHO_REPEAT", "ICOUNT_MICRO", "OPCODES_ECHO", "OPCODES_MICRO",
           "OPCODES_TOP"]

RATE, CPU, OPS, INSTRUCTIONS = "req/s", "server CPU/req", "ops/s", "instructions"
FLOOR = runtimes.FLOOR
_CPU_S, _USER_S = "server_cpu_per_request_s", "server_user_cpu_per_request_s"


@dataclass(frozen=True)
class Goal:
    kind: str           # "echo", or the micro-benchmark op
    subject: str
    reference: str
    target: float
    what: str
    judged_on: str = RATE   # INSTRUCTIONS; timed: RATE or CPU (echo), OPS (micro)
    beside: tuple = ()      # references shown next to the goal in the timed rounds, not judged

    @property
    def counted(self) -> bool:
        """Judged on instruction counts: at most ``target`` times the reference's."""
        return self.judged_on == INSTRUCTIONS

    @property
    def text(self) -> str:
        bound = "<=" if self.counted else ">="
        return f"{self.subject} {self.what} {bound} {self.target:g}x {self.reference}"


def declared_goals() -> list[Goal]:
    """Every registered runtime's goals (``RuntimeInfo.goals``), in registry order; a
    goal's subject is the spec it declares, else the runtime itself."""
    return [Goal(g.kind, g.subject or info.id, g.reference, g.target, g.what, g.judged_on,
                 tuple(g.beside))
            for info in runtimes.RUNTIMES.values() for g in info.goals]


def _timed(goals) -> tuple[list[str], list[tuple[str, str]]]:
    """What the timed rounds measure: the echo runtimes, and the (op, runtime) micro
    units, of every goal's subject, reference and runtimes beside (not the floor,
    which is only counted)."""
    echo: list[str] = []
    micro: list[tuple[str, str]] = []
    for g in goals:
        for spec in (g.subject, g.reference, *g.beside):
            if spec == FLOOR:
                continue
            if g.kind == "echo":
                echo += [spec] if spec not in echo else []
            elif (g.kind, spec) not in micro:
                micro.append((g.kind, spec))
    return echo, micro


# The goals and the runtimes they measure, as registered when this module was
# imported (built-ins and plugins loaded by then).
GOALS = declared_goals()
GOAL_ECHO_RUNTIMES, GOAL_MICRO_UNITS = _timed(GOALS)
GOAL_MICRO_OPS = list(dict.fromkeys(op for op, _ in GOAL_MICRO_UNITS))
GOAL_MICRO_RUNTIMES = list(dict.fromkeys(spec for _, spec in GOAL_MICRO_UNITS))


def _is_floor(spec: str) -> bool:
    return spec == FLOOR or spec.startswith(FLOOR + "@")


def _canonical(spec: str) -> str:
    """The spec as the registry spells it (an interpreter path resolved and so on),
    so that cells, counts and goal rows meet on one key; the floor as it is."""
    if _is_floor(spec):
        return spec
    try:
        return runtimes.parse(spec).spec
    except UsageError:
        return spec


def _on(spec: str, python: str | None) -> str:
    return _canonical(runtimes.on_interpreter(spec, python))


def _summary(ratios: list[float]) -> dict:
    if not ratios:
        return {"ratio": None, "min": None, "max": None, "n": 0}
    return {"ratio": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
            "n": len(ratios)}


NOT_MEASURED = "not measured"


def _status(s: dict, target: float) -> str:
    if s["ratio"] is None:
        return NOT_MEASURED
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
    of ``pythons`` (each row also has ``python``).

    A goal judged on instructions has ``cost`` and ``beside`` (``_counted_row``) in
    place of ``rate``/``cpu``/``user``, and stays "not measured" until
    ``attach_instructions`` judges it on its counts."""
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
    a = by.get((g.kind, _on(g.subject, python)))
    b = by.get((g.kind, _on(g.reference, python)))
    row = {"goal": g.text, "kind": g.kind, "subject": g.subject, "reference": g.reference,
           "target": g.target, "judged_on": g.judged_on, "python": python}
    if g.counted:
        return _counted_row(g, python, by, a, b, row)
    if g.kind == "echo":
        rate = _summary(paired(a, b, "requests_per_s") if a and b else [])
        # The reference's CPU per request over ours: > 1 means ours is cheaper.
        cpu = _summary(paired(b, a, _CPU_S) if a and b else [])
        # The same with the system time left out (shown, not judged): on loopback the
        # kernel's TCP work is a large share of every request and differs little
        # between runtimes, so this is closer to the ratio of what the runtimes do.
        user = _summary(paired(b, a, _USER_S) if a and b else [])
        row.update(rate=rate, cpu=cpu, user=user)
        if g.judged_on == CPU and a and b:
            budget = _user_budget(a, b, g.target)
            if budget is not None:
                row["user_budget"] = budget
        judged = cpu if g.judged_on == CPU else rate
        beside = {}
        for spec in g.beside:
            c = by.get((g.kind, _on(spec, python)))
            pairs = (paired(c, a, _CPU_S) if g.judged_on == CPU
                     else paired(a, c, "requests_per_s")) if a and c else []
            beside[spec] = _summary(pairs)
        if beside:
            row["beside"] = beside
    else:
        judged = _summary(paired(a, b, "ops_per_s") if a and b else [])
    row.update(judged, status=_status(judged, g.target))
    return row


def _counted_row(g: Goal, python: str | None, by: dict, a, b, row: dict) -> dict:
    """A goal judged on instructions, before its counts arrive (``attach_instructions``):
    not measured, with the timed rounds' ratios as information, each ours over theirs
    (the direction of the instruction ratio, < 1: ours cheaper): ``cost`` (server CPU
    and user CPU per request against the reference) and ``beside`` (the CPU per
    request, or the time per operation, against each runtime beside)."""
    if g.kind == "echo":
        row["cost"] = {"cpu": _summary(paired(a, b, _CPU_S) if a and b else []),
                       "user": _summary(paired(a, b, _USER_S) if a and b else [])}
    beside = {}
    for spec in g.beside:
        c = by.get((g.kind, _on(spec, python)))
        if g.kind == "echo":
            pairs = paired(a, c, _CPU_S) if a and c else []
        else:       # their operations per second over ours: our time per operation over theirs
            pairs = paired(c, a, "ops_per_s") if a and c else []
        beside[spec] = _summary(pairs)
    if beside:
        row["beside"] = beside
    row.update(ratio=None, min=None, max=None, n=0, counts={"subject": None, "reference": None},
               status=NOT_MEASURED)
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


# Instruction counts and opcode breakdowns: the same counts as ``python -m
# bench.perf.icount`` and ``python -m bench.perf.opcodes``, taken once per runtime.
# Echo: requests spread over 10 connections with a pause between rounds, so every
# round takes the same path; micro: whole processes (operation loops, for the opcodes)
# of ``small`` and ``large`` operations, the difference divided.
ICOUNT_ECHO = (2000, 10000, 0.005)
ICOUNT_ECHO_REPEAT = 3
ICOUNT_MICRO = (300, 1500)
OPCODES_ECHO = (500, 10)        # counted requests, connections (2 ms between rounds)
OPCODES_MICRO = (200, 1000)
OPCODES_TOP = 6


def icount_missing() -> str | None:
    """Why instructions cannot be counted here (valgrind's callgrind), or None."""
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            return f"{tool} is not on PATH (install valgrind to count instructions)"
    return None


def _counted_specs(pythons, goals) -> tuple[list[tuple[str, str]], dict]:
    """The (kind, spec) pairs the goals judged on instructions count, each once, and
    ``{pair: why not}`` for those that cannot run here."""
    wanted: list[tuple[str, str]] = []
    for python in pythons:
        for g in goals:
            if g.counted:
                for spec in (g.subject, g.reference):
                    key = (g.kind, _on(spec, python))
                    wanted += [key] if key not in wanted else []
    real = list(dict.fromkeys(s for _, s in wanted if not _is_floor(s)))
    skipped = split_available([runtimes.parse(s) for s in real])[1]
    return wanted, {(k, s): f"unavailable ({s}): {skipped[s]}" for k, s in wanted if s in skipped}


def _error(spec: str, exc: BaseException) -> str:
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
    return f"error ({spec}): {text[:200]}"


def count_instructions(pythons=(None,), progress=progress, goals=None, echo=ICOUNT_ECHO,
                       micro=ICOUNT_MICRO, echo_repeat=ICOUNT_ECHO_REPEAT) -> dict:
    """Instructions per echo request or per micro operation of the subject and the
    reference of every goal judged on them (``goals``: all declared), under callgrind:
    ``{(kind, spec): count, or "error (...)" / "unavailable (...)"}``; an echo count is
    a list of ``echo_repeat`` counts, taken in rounds (every runtime once a round)."""
    wanted, unavailable = _counted_specs(pythons, GOALS if goals is None else goals)
    out = dict(unavailable)
    rounds = max(echo_repeat if any(k == "echo" for k, _ in wanted) else 1, 1)
    with tempfile.TemporaryDirectory(prefix="looplab-icount-") as tmp:
        for rnd in range(rounds):
            for i, (kind, spec) in enumerate(wanted, 1):
                check_stop()
                if (kind == "echo" and rnd >= echo_repeat) or (kind != "echo" and rnd) \
                        or isinstance(out.get((kind, spec)), str):
                    continue                 # counted enough, or failed: not again
                which = f" (count {rnd + 1} of {echo_repeat})" if kind == "echo" else ""
                progress(f"[{i}/{len(wanted)}] instructions: {kind} on {spec}{which}")
                try:
                    served = spec if _is_floor(spec) else bench_runtime(runtimes.parse(spec)).spec
                    if kind == "echo":
                        small, large, pause = echo
                        n = icount.per_request(served, 10, KiB, small, large, tmp,
                                               pause=pause)[0][0]
                        out.setdefault((kind, spec), []).append(n)
                    else:
                        out[(kind, spec)] = icount.per_operation(kind, served, *micro, tmp)[0]
                except Exception as exc:      # one runtime's failure is its cell's, not the run's
                    out[(kind, spec)] = _error(spec, exc)
    return out


def count_opcodes(pythons=(None,), progress=progress, goals=None, top=OPCODES_TOP) -> dict:
    """Python opcodes per echo request or per micro operation by function, of the same
    runtimes as ``count_instructions`` (``bench.perf.opcodes``, in a child on each
    runtime's interpreter): ``{(kind, spec): {"functions", "other", "total", "python"},
    or "error (...)" / "unavailable (...)"}``."""
    wanted, unavailable = _counted_specs(pythons, GOALS if goals is None else goals)
    out = dict(unavailable)
    for i, (kind, spec) in enumerate(wanted, 1):
        check_stop()
        if (kind, spec) in out:
            continue
        progress(f"[{i}/{len(wanted)}] opcodes by function: {kind} on {spec}")
        try:
            out[(kind, spec)] = opcodes.breakdown(kind, spec, top, *OPCODES_ECHO, *OPCODES_MICRO)
        except Exception as exc:
            out[(kind, spec)] = _error(spec, exc)
    return out


def counting_config(pythons, stopped: bool) -> dict:
    """How the counts were taken, for the results' ``config["instructions"]``: the
    request and operation counts, each interpreter's version, whether it was stopped."""
    versions = {}
    for python in pythons:
        try:
            versions[python or "looplab's"] = (envs.find(python).version if python
                                               else platform.python_version())
        except UsageError:
            versions[python] = None
    return {"echo": list(ICOUNT_ECHO), "echo_repeat": ICOUNT_ECHO_REPEAT,
            "micro": list(ICOUNT_MICRO), "stopped": stopped,
            "interpreters": versions,
            "opcodes": {"echo": list(OPCODES_ECHO), "micro": list(OPCODES_MICRO),
                        "top": OPCODES_TOP}}


def _is_count(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def _count_list(v) -> list | None:
    """A count or a list of repeated counts as a list; None unless every one is a count."""
    vs = v if isinstance(v, list) else [v]
    return vs if vs and all(_is_count(x) for x in vs) else None


def attach_instructions(rows: list[dict], counts: dict) -> None:
    """Judge every goal judged on instructions on ``counts``: ``counts`` gets the
    subject's and the reference's count (the median of repeated ones, each repeat in
    ``repeats``), or why there is none; ``ratio`` is the first over the second (the
    median of the paired ratios of repeated counts, with ``min`` and ``max``); "met"
    at or under the target, "not met (N% over)" above it, "(borderline)" after either
    when the range straddles the target, "not measured" without both counts. Timed
    goals are left as they are."""
    for r in rows:
        if r.get("judged_on") != INSTRUCTIONS:
            continue
        a = counts.get((r["kind"], _on(r["subject"], r.get("python"))))
        b = counts.get((r["kind"], _on(r["reference"], r.get("python"))))
        la, lb = _count_list(a), _count_list(b)
        if la is None or lb is None:
            r["counts"] = {"subject": a, "reference": b}
            r.update(ratio=None, min=None, max=None, n=0, status=NOT_MEASURED)
            continue
        r["counts"] = {"subject": statistics.median(la), "reference": statistics.median(lb)}
        if len(la) > 1 or len(lb) > 1:
            r["repeats"] = {"subject": la, "reference": lb}
        if len(la) == len(lb):
            ratios = [x / y for x, y in zip(la, lb)]
        else:                                # unpaired: each side's median
            ratios = [r["counts"]["subject"] / r["counts"]["reference"]]
        s = _summary(ratios)
        target = r["target"]
        status = "met" if s["ratio"] <= target else f"not met ({s['ratio'] / target - 1:.0%} over)"
        if s["n"] > 1 and s["min"] <= target < s["max"]:
            status += " (borderline)"
        r.update(s, status=status)


def attach_opcodes(rows: list[dict], breakdowns: dict) -> None:
    """Each goal judged on instructions gets ``opcodes``: the subject's and the
    reference's breakdown by function (``count_opcodes``), or why there is none."""
    for r in rows:
        if r.get("judged_on") == INSTRUCTIONS:
            r["opcodes"] = {side: breakdowns.get((r["kind"], _on(r[side], r.get("python"))))
                            for side in ("subject", "reference")}


# ---------------------------------------------------------------------------
# Tables: the goals judged on instructions, each with its opcode breakdown, then the
# timed goals.

def _ratio_text(s: dict | None) -> str:
    if not s or s.get("ratio") is None:
        return MISSING
    if s["n"] > 1:
        return f"{s['ratio']:.2f} ({s['min']:.2f}-{s['max']:.2f})"
    return f"{s['ratio']:.2f}"


def _beside_text(beside: dict | None, what: str = "") -> str:
    if not beside:
        return ""
    return "; ".join(f"{spec}: {what}{_ratio_text(s)}" for spec, s in beside.items())


def _count_text(v) -> str:
    if _is_count(v):
        return f"{v:,.0f}"
    return MISSING if v is None else str(v).split(" ", 1)[0]      # "error", "unavailable"


def _python_column(rows, table, head, align):
    if any(r.get("python") for r in rows):
        table = [[r.get("python") or "looplab's"] + line for r, line in zip(rows, table)]
        head, align = ["python"] + head, "l" + align
    return table, head, align


INSTRUCTION_HEAD = ["goal", "ours", "reference", "ours/reference", "status",
                    "CPU/req, ours/ref (info)", "user CPU/req, ours/ref (info)",
                    "timed against (info)"]


def instruction_cells(r: dict) -> list[str]:
    """One goal judged on instructions as text cells under ``INSTRUCTION_HEAD``."""
    c, cost = r.get("counts") or {}, r.get("cost") or {}
    return [r["goal"], _count_text(c.get("subject")), _count_text(c.get("reference")),
            _ratio_text(r), r["status"],
            _ratio_text(cost.get("cpu")), _ratio_text(cost.get("user")),
            _beside_text(r.get("beside"), "CPU/req " if r["kind"] == "echo" else "time/op ")]


def instruction_table(rows: list[dict], markdown: bool = False) -> str:
    """The goals judged on instructions: both counts, ours over the reference's, the
    status, and the timed ratios beside as information (ours over theirs too)."""
    rows = [r for r in rows if r.get("judged_on") == INSTRUCTIONS]
    table, head, align = _python_column(rows, [instruction_cells(r) for r in rows],
                                        INSTRUCTION_HEAD, "lrrrlrrl")
    return format_table(head, table, markdown, align=align)


def count_problems(rows: list[dict]) -> list[str]:
    """One line per count or breakdown that is missing for a reason: the reason."""
    out: list[str] = []
    for r in rows:
        for part in ("counts", "opcodes"):
            for v in (r.get(part) or {}).values():
                if isinstance(v, str) and v not in out:
                    out.append(v)
    return out


def breakdown(r: dict) -> tuple[str, list[str], list[list[str]]] | None:
    """(title, head, rows) of a goal's opcode breakdown: the subject's and the
    reference's top functions side by side, opcodes per request or operation, with
    what the other functions add up to and the total; None without one."""
    o = r.get("opcodes")
    if r.get("judged_on") != INSTRUCTIONS or not o:
        return None
    sides = [o.get("subject"), o.get("reference")]
    if not any(isinstance(v, dict) for v in sides):
        return None
    tops, ends = [], []
    for v in sides:
        if not isinstance(v, dict):
            tops.append([(MISSING if v is None else str(v).split(" ", 1)[0], "")])
            ends.append([("", ""), ("", "")])
            continue
        tops.append([(name, f"{n:,.1f}") for name, n in v["functions"]])
        ends.append([("(the other functions)", f"{v['other']:,.1f}"),
                     ("total", f"{v['total']:,.1f}")])
    # the functions side by side, then the rest and the totals on rows of their own
    table = [[*(left or ("", "")), *(right or ("", ""))]
             for left, right in [*itertools.zip_longest(*tops), *zip(*ends)]]
    unit = "request" if r["kind"] == "echo" else "operation"
    where = f" (Python {r['python']})" if r.get("python") else ""
    title = f"{r['goal']}{where}: Python opcodes per {unit} by function"
    return title, [f"{r['subject']}: function", "opcodes", f"{r['reference']}: function",
                   "opcodes"], table


def breakdown_tables(rows: list[dict], markdown: bool = False) -> list[str]:
    """``breakdown`` of every goal judged on instructions that has one, as text."""
    out = []
    for r in rows:
        b = breakdown(r)
        if b is not None:
            title, head, table = b
            body = format_table(head, table, markdown, align="lrlr")
            out.append(f"**{title}**\n\n{body}" if markdown else f"{title}\n{body}")
    return out


def counting_note(how: dict | None) -> str | None:
    """How the instruction counts and opcode breakdowns were taken, in one paragraph,
    from the run's ``config["instructions"]`` (None when it records none)."""
    if not isinstance(how, dict):
        return None
    try:
        small, large, pause = how["echo"]
        msmall, mlarge = how["micro"]
    except (KeyError, TypeError, ValueError):
        return None
    text = (f"Instructions counted under valgrind's callgrind, each runtime served as the "
            f"timed goals serve it (references without their measuring proxy): per echo "
            f"request, the difference between {small:,} and {large:,} requests in lock-step "
            f"rounds over 10 connections, {pause * 1000:g} ms apart; per micro-benchmark "
            f"operation, between whole runs of {msmall:,} and {mlarge:,} operations.")
    versions = {k: v for k, v in (how.get("interpreters") or {}).items() if v}
    if versions:
        text += " Interpreter: " + ", ".join(
            v if k == "looplab's" else f"{k} ({v})" for k, v in versions.items()) + "."
    op = how.get("opcodes")
    if isinstance(op, dict):
        try:
            (requests, conns), (osmall, olarge) = op["echo"], op["micro"]
            text += (f" Opcodes by function under sys.settrace: {requests:,} echo requests over "
                     f"{conns} connections, or the difference between {osmall:,} and "
                     f"{olarge:,} operations; the top {op['top']} functions of each side.")
        except (KeyError, TypeError, ValueError):
            pass
    repeat = how.get("echo_repeat")
    if isinstance(repeat, int) and repeat > 1:
        text += (f" An echo count moves with how many requests one pass finds: each was taken "
                 f"{repeat} times, subject and reference alternating; the counts are medians "
                 f"and the ratio the median of the paired ratios, range in brackets. A "
                 f"micro-benchmark count repeats exactly and was taken once.")
    else:
        text += " Each count was taken once."
    if how.get("stopped"):
        text += " The counting was stopped before it ended: a missing count is not measured."
    return text


def goals_table(rows: list[dict], markdown: bool = False) -> str:
    """The timed goals: the judged ratio beside the echo ratios (req/s, server CPU per
    request, and its user part alone), each a median (range)."""
    rows = [r for r in rows if r.get("judged_on") != INSTRUCTIONS]
    table = [[r["goal"], r["judged_on"], _ratio_text(r), _ratio_text(r.get("rate")),
              _ratio_text(r.get("cpu")), _ratio_text(r.get("user")), r["n"], r["status"],
              _beside_text(r.get("beside"))]
             for r in rows]
    head = ["goal", "judged on", "median (range)", "req/s ratio", "server CPU/req ratio",
            "user CPU/req ratio", "rounds", "status", "same ratio against (not judged)"]
    table, head, align = _python_column(rows, table, head, "llrrrrrll")
    return format_table(head, table, markdown, align=align)


_INSTRUCTION_HEAD = ("Goals judged on instructions per echo request or per operation "
                     "(callgrind): ours at most the target times the reference's; floor: "
                     "spawn+join with no kernel at all (bench.perf.nokernel). The timed "
                     "ratios beside are information only, ours over theirs (< 1: ours cheaper)")
_TIMED_HEAD = ("Timed goals (medians of per-round paired ratios, range in brackets; "
               "server CPU/req ratio: the reference's server CPU per request over ours, "
               "> 1 is cheaper)")


def goal_sections(rows: list[dict], how: dict | None, cpu_only: bool = False,
                  markdown: bool = False) -> list[str]:
    """What ``looplab bench goals`` prints and writes to bench.md: the goals judged on
    instructions, what kept a count out, how they were counted (``how``: the run's
    ``config["instructions"]``) and each one's opcode breakdown; then the timed goals
    and, for each CPU goal not met, the user time it leaves."""
    problems = count_problems(rows)
    note = ("--cpu-only: no instructions were counted, so these goals are not measured"
            if cpu_only else counting_note(how))
    if markdown:
        counted = [f"### {_INSTRUCTION_HEAD}", instruction_table(rows, True),
                   "\n".join(f"- {p}" for p in problems), note or ""]
        timed = [f"### {_TIMED_HEAD}", goals_table(rows, True)]
    else:
        counted = [f"{_INSTRUCTION_HEAD}:\n{instruction_table(rows)}", "\n".join(problems),
                   note or ""]
        timed = [f"{_TIMED_HEAD}:\n{goals_table(rows)}"]
    budget = budget_lines(rows)
    if budget:
        timed.append("User CPU per request each CPU goal not met leaves the runtime: the "
                      "reference's CPU over the target, less the runtime's own system time "
                      "(mostly the kernel's TCP work); medians over the paired rounds:\n"
                      + "\n".join(f"- {line}" for line in budget))
    return [*filter(None, counted), *breakdown_tables(rows, markdown), *timed]


def goal_runtimes(pythons=(None,)) -> list:
    """Every runtime the timed goals measure, once per interpreter of ``pythons``."""
    out: dict = {}
    for python in pythons:
        for spec in [*GOAL_ECHO_RUNTIMES, *(s for _, s in GOAL_MICRO_UNITS)]:
            rt = runtimes.parse(runtimes.on_interpreter(spec, python))
            out.setdefault(rt.spec, rt)
    return list(out.values())


def run_goals(repeat: int = 5, duration: float = 2.0, warmup: float = 1.0, min_time: float = 0.3,
              client=None, pinned: bool = True, progress=progress,
              pythons=(None,)) -> tuple[list[dict], list[dict], dict]:
    """Exactly the timed measurements behind GOALS, once per interpreter of ``pythons``
    (None: looplab's own). Returns (cells, goal rows, skipped); the goals judged on
    instructions are "not measured" until ``attach_instructions``. On SIGINT/SIGTERM
    raises Interrupted with the cells measured so far."""
    rts, skipped = split_available(goal_runtimes(pythons))
    ok = {rt.spec: rt for rt in rts}
    echo = list(dict.fromkeys(_on(s, p) for p in pythons for s in GOAL_ECHO_RUNTIMES))
    echo_rts = [ok[s] for s in echo if s in ok]
    units = [(op, ok[s]) for op, s in dict.fromkeys((op, _on(spec, p)) for p in pythons
                                                    for op, spec in GOAL_MICRO_UNITS) if s in ok]
    cells = []
    if echo_rts:
        cells += run_echo_matrix(echo_units(echo_rts, [1 * KiB], [10]), duration, warmup, repeat,
                                 client, pinned, progress)
    if units:
        try:
            cells += run_micro_matrix(units, repeat, min_time, pinned, progress)
        except Interrupted as exc:
            raise Interrupted(cells + exc.cells) from None
    return cells, evaluate_goals(cells, pythons), skipped
