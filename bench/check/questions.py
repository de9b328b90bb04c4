"""The four questions ``looplab check`` asks of a server, and how each verdict is judged.

Each question is a few phases of ``check_client`` peers (``bench.check.roles``) run
through a rig (``bench.check.drive.RealRig`` or ``bench.check.sim.SimRig``), and a
judgement from what they and the rig measured. A verdict is ``True`` (holds),
``False`` (fails) or ``None`` (not measured, with the reason); its ``evidence`` lines
name the measurements that decided it.

- **backpressure** (per endpoint): ``slow`` clients that read slowly (or never) are held
  for ``window_s`` while the server's memory is sampled: RSS on real sockets, the
  Python heap on the simulated network. It holds when the growth per slow client stays
  within the budget and has stopped rising (the growth in the window's second half is
  at most a quarter of the peak growth, or at most half the budget). Measured
  only when the server had more to send than the slow client took: its answer still
  unfinished at the window's end, or the server closed the slow client itself.
- **fairness** (per endpoint): ``healthy`` clients' waits (``latencies_s``) alone, then
  beside the slow clients. It holds when p99 beside them is at most ``latency_factor``
  times p99 alone (alone taken as at least ``latency_floor_s``: a floor under timer
  noise) and every answer was 2xx (or a 101 upgrade).
- **shutdown**: one client reading an answer of declared size slowly; ``stop_after_s``
  later the server is told to stop (SIGTERM; in the simulated network the framework's
  shutdown). It holds when the client got every promised byte and the server stopped
  within ``grace_s``; it reports FIN or RST. Measured only when the answer was in
  flight when the stop was sent.
- **faults** (real sockets): ``looplab faults``' matrix, with a healthy client of the
  first endpoint; it holds when every fault was survived and the fds came back.

A server that died is data: the question under way fails with the cause, and the
questions after it are not measured.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from bench.results import quantile
from bench.results.tables import fmt_bytes

__all__ = ["Plan", "PRESETS", "ask", "QUESTIONS", "backpressure", "judge_memory",
           "judge_latency"]

QUESTIONS = ("backpressure", "fairness", "shutdown", "faults")
MIN_LATENCIES = 10          # samples each side before p99 means anything


@dataclass(frozen=True)
class Plan:
    alone_s: float = 1.5
    window_s: float = 3.0
    healthy: int = 3
    slow: int = 2
    slow_rate_Bps: float = 16384.0        # 0: never read
    slow_sockbuf: int = 16384
    sample_bytes: int = 16384
    budget_bytes: int = 1_000_000
    latency_factor: float = 3.0
    latency_floor_s: float = 0.005
    read_s: float = 2.0                   # the shutdown client's answer spans this long
    stop_after_s: float = 1.0
    grace_s: float = 5.0
    faults: tuple = ("reset", "half-frame", "garbage", "long-line", "half-close", "stall",
                     "idle", "burst", "idle-many")
    burst: int = 100
    idle_many: int = 200
    hold_s: float = 0.5
    settle_s: float = 2.0
    fault_timeout_s: float = 5.0


PRESETS = {
    "default": Plan(),
    "small": Plan(alone_s=0.8, window_s=1.6, healthy=2, slow=1, read_s=1.5,
                  stop_after_s=0.8, grace_s=4.0,
                  faults=("reset", "garbage", "stall", "idle", "burst"), burst=30,
                  idle_many=30, hold_s=0.3, settle_s=1.0, fault_timeout_s=4.0),
}


@dataclass
class Answer:
    """One question's verdict, its evidence and its numbers."""
    verdict: bool | None = None
    evidence: list = field(default_factory=list)
    reason: str | None = None
    metrics: dict = field(default_factory=dict)
    parts: list = field(default_factory=list)      # per endpoint

    def to_data(self) -> dict:
        return {"verdict": self.verdict, "evidence": list(self.evidence), "reason": self.reason,
                "metrics": dict(self.metrics), "parts": list(self.parts)}


def _pct(vals, q):
    return quantile(sorted(vals), q) if vals else None


def _ms(s):
    return "-" if s is None else f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"


# ---------------------------------------------------------------------------
# Judgements (pure: tests feed them numbers)

def judge_memory(series, base: int | None, slow: int, budget: int, t0: float, t1: float):
    """(verdict, per-client growth, still rising, evidence) from (t, bytes) samples."""
    pts = [(t, v) for t, v in series if t0 <= t <= t1 and v is not None]
    if base is None or len(pts) < 4:
        return None, None, None, f"too few memory samples ({len(pts)}) in the window"
    mid = t0 + (t1 - t0) / 2
    first = max((v for t, v in pts if t <= mid), default=base) - base
    peak = max(v for _, v in pts) - base
    late = peak - max(first, 0)
    rising = late > max(0.25 * peak, 0.5 * budget * slow)
    per = max(peak, 0) / slow
    ok = per <= budget and not rising
    text = (f"+{fmt_bytes(per)} per slow client at peak ({fmt_bytes(max(peak, 0))} over "
            f"{slow} in {t1 - t0:.1f} s), "
            + (f"still rising (+{fmt_bytes(late)} in the second half)" if rising else "flat by the end")
            + f"; budget {fmt_bytes(budget)}")
    return ok, per, rising, text


def judge_latency(alone, beside, factor: float, floor_s: float):
    """(verdict, p50/p99 figures, evidence) for healthy waits alone and beside the slow."""
    figs = {"alone_p50_s": _pct(alone, 0.5), "alone_p99_s": _pct(alone, 0.99),
            "slow_p50_s": _pct(beside, 0.5), "slow_p99_s": _pct(beside, 0.99),
            "alone_count": len(alone), "slow_count": len(beside)}
    if len(alone) < MIN_LATENCIES:
        return None, figs, (f"only {len(alone)} healthy waits measured alone "
                            f"(need {MIN_LATENCIES}): the endpoint answers too slowly or rarely")
    limit = factor * max(figs["alone_p99_s"], floor_s)
    worst = max(beside) if beside else None
    if len(beside) < MIN_LATENCIES and not (worst is not None and worst > limit):
        return None, figs, (f"only {len(beside)} healthy waits measured beside the slow "
                            f"client(s) (need {MIN_LATENCIES})")
    p99 = figs["slow_p99_s"]
    ok = p99 <= limit
    text = (f"healthy p99 {_ms(figs['alone_p99_s'])} alone, {_ms(p99)} beside the slow "
            f"client(s) (p50 {_ms(figs['alone_p50_s'])} -> {_ms(figs['slow_p50_s'])}; "
            f"limit x{factor:g} = {_ms(limit)}; {len(alone)}+{len(beside)} waits)")
    return ok, figs, text


# ---------------------------------------------------------------------------
# Phases

def _role(name, endpoint, mode, **fields):
    return {"name": name, "role": "check_client", **endpoint.role_fields(), "mode": mode,
            **fields}


def probe(rig, endpoint, plan: Plan) -> dict:
    spec = _role(f"probe-{_slug(endpoint)}", endpoint, "probe", duration_s=2.0,
                 sample_bytes=plan.sample_bytes, max_s=5.0)
    return rig.run_clients([spec], bound_s=8.0)[spec["name"]]


def _slug(endpoint) -> str:
    return "".join(c if c.isalnum() else "_" for c in endpoint.target)[:24] or "x"


def _status_problem(res) -> str | None:
    if res.get("error"):
        return f"the client failed: {res['error'][:160]}"
    if not res.get("connected"):
        return "the client could not connect"
    if res.get("protocol_error"):
        return f"the answer was not understood: {res['protocol_error']}"
    st = res.get("status")
    if res.get("kind_raw"):
        return None
    if st is not None and not (200 <= st < 300 or st == 101):
        return f"it answered HTTP {st}"
    return None


def _latencies(results, prefix) -> tuple[list, list]:
    waits, problems = [], []
    for name, r in results.items():
        if name.startswith(prefix):
            waits += r.get("latencies_s") or []
            p = _status_problem({**r, "kind_raw": r.get("status") is None and r.get("connected")})
            if p:
                problems.append(p)
    return waits, problems


def _unfinished(r) -> bool:
    """The server had more for the slow client than it took: an answer still going."""
    if r.get("server_closed"):
        return True
    declared = r.get("declared_bytes")
    took = (r.get("body_bytes") or 0) + (r.get("unread_bytes") or 0)
    return declared is None or took < declared


def backpressure(rig, endpoint, plan: Plan, tag: str = "", healthy=None) -> dict:
    """Probe, healthy alone, then slow clients with healthy ones beside them; the raw
    measurements for ``judge_endpoint``. ``healthy``: the healthy clients' endpoint
    (default: the slow clients')."""
    out = {"endpoint": endpoint.label}
    well = healthy or endpoint
    first = probe(rig, endpoint, plan)
    out["probe"] = {k: first.get(k) for k in ("status", "declared_bytes", "streaming",
                                             "body_bytes", "ended", "error")}
    problem = _status_problem({**first, "kind_raw": endpoint.kind == "raw"})
    if problem is None and not first.get("body_bytes"):
        problem = "it sent no answer within 2 s"
    if problem:
        out["problem"] = problem
        return out
    alone = [_role(f"{tag}alone{i}-{_slug(endpoint)}", well, "healthy",
                   duration_s=plan.alone_s, sample_bytes=plan.sample_bytes,
                   max_s=plan.alone_s + 10) for i in range(plan.healthy)]
    res = rig.run_clients(alone, bound_s=plan.alone_s + 12)
    out["alone"], out["alone_problems"] = _latencies(res, f"{tag}alone")
    if rig.dead():
        out["died"] = rig.dead()
        return out
    base = rig.mark()
    read = {"read": False} if not plan.slow_rate_Bps else {"rate_Bps": plan.slow_rate_Bps}
    specs = [_role(f"{tag}slow{i}-{_slug(endpoint)}", endpoint, "slow", hold_s=plan.window_s,
                   sockbuf=plan.slow_sockbuf, max_s=plan.window_s + 10, **read)
             for i in range(plan.slow)]
    lead = 0.2 * plan.window_s     # connected at once, asking from here: in the first half
    specs += [_role(f"{tag}beside{i}-{_slug(endpoint)}", well, "healthy",
                    start_after_s=lead, duration_s=0.6 * plan.window_s,
                    sample_bytes=plan.sample_bytes, max_s=plan.window_s + 10)
              for i in range(plan.healthy)]
    t0 = rig.now()
    res = rig.run_clients(specs, bound_s=plan.window_s + 12, mark_after_s=0.9 * plan.window_s)
    t1 = rig.now()
    held = res.pop("mark", None)
    slow = [r for n, r in res.items() if n.startswith(f"{tag}slow")]
    starts = [r["connected_at"] for r in slow if r.get("connected_at") is not None]
    ends = [r["connected_at"] + r["ran_s"] - r.get("connected_after_s", 0) for r in slow
            if r.get("connected_at") is not None and r.get("ran_s") is not None]
    w0 = min(starts) if starts else t0
    w1 = max(ends) if ends else t1
    out.update(base=base, window=[w0, w1], memory=rig.memory(w0, w1),
               buffered=rig.buffered(w0, w1), held=held, after=rig.mark(),
               slow=[{k: r.get(k) for k in ("connected", "body_bytes", "unread_bytes", "ended",
                                            "server_closed", "declared_bytes", "error", "status")}
                     for r in slow])
    out["beside"], out["beside_problems"] = _latencies(res, f"{tag}beside")
    if rig.dead():
        out["died"] = rig.dead()
    return out


def judge_endpoint(raw: dict, plan: Plan) -> tuple[Answer, Answer]:
    """The backpressure and fairness answers for one endpoint's measurements."""
    bp, fair = Answer(), Answer()
    label = raw["endpoint"]
    if raw.get("problem"):
        why = f"{label}: {raw['problem']}"
        return Answer(None, reason=why), Answer(None, reason=why)
    died = raw.get("died")
    if died and "memory" not in raw:
        return Answer(False, [f"{label}: {died} while healthy clients ran alone"]), \
            Answer(False, [f"{label}: {died}"])
    slow = raw["slow"]
    base = raw["base"]["memory_bytes"]
    got = sum((s.get("body_bytes") or 0) + (s.get("unread_bytes") or 0) for s in slow)
    w0, w1 = raw["window"]
    ok, per, rising, text = judge_memory(raw["memory"], base, plan.slow, plan.budget_bytes, w0, w1)
    what = "RSS" if raw["base"].get("memory_kind") == "rss" else "Python heap (tracemalloc)"
    bp.metrics.update(memory_per_slow_client_bytes=per, memory_rising=rising,
                      slow_received_bytes=got)
    buffered = max((s["buffered_bytes"] for s in raw["buffered"]), default=None)
    largest = max((s["largest_buffer_bytes"] for s in raw["buffered"]), default=None)
    if buffered is not None:
        bp.metrics["transports_buffered_peak_bytes"] = buffered
    detail = []
    if largest is not None:
        detail.append(f"largest transport buffer {fmt_bytes(largest)}")
    held = raw.get("held") or {}
    if "queues_count" in held:
        bp.metrics["queued_bytes"] = held.get("queued_bytes")
        detail.append(f"asyncio queues near the end: {held['queued_items_count']:,} items, "
                      f"{fmt_bytes(held.get('queued_bytes') or 0)} "
                      f"({held['unbounded_queues_count']} of {held['queues_count']} unbounded)")
    if died:
        bp.verdict, bp.evidence = False, [f"{label}: {died} with {plan.slow} slow client(s)"]
        fair.verdict, fair.evidence = False, [f"{label}: {died}"]
        return bp, fair
    errors = [s.get("error") for s in slow if s.get("error")]
    if errors or not any(s.get("connected") for s in slow):
        bp.reason = f"{label}: the slow client failed: {(errors or ['no connection'])[0][:160]}"
    elif got == 0:
        bp.reason = f"{label}: the slow client got no byte of the answer"
    elif not all(_unfinished(s) for s in slow):
        bp.reason = (f"{label}: the whole answer ({fmt_bytes(slow[0].get('declared_bytes') or 0)})"
                     " fit in the socket buffers, so the server never waited on the slow "
                     "client: name an endpoint with a longer answer")
    elif ok is None:
        bp.reason = f"{label}: {text}"
    else:
        bp.verdict = ok
        closed = sum(1 for s in slow if s.get("server_closed"))
        bp.evidence = [f"{label}: {what} " + text
                       + (f"; the server closed {closed} slow client(s) itself" if closed else "")
                       + (f"; {'; '.join(detail)}" if detail else "")]
    fok, figs, ftext = judge_latency(raw.get("alone") or [], raw.get("beside") or [],
                                     plan.latency_factor, plan.latency_floor_s)
    fair.metrics.update({f"healthy_{k}": v for k, v in figs.items()})
    problems = (raw.get("alone_problems") or []) + (raw.get("beside_problems") or [])
    if raw.get("alone_problems"):
        fair.reason = f"{label}: healthy clients alone: {raw['alone_problems'][0]}"
    elif raw.get("beside_problems"):
        fair.verdict = False
        fair.evidence = [f"{label}: healthy clients beside the slow: {problems[0]}"]
    elif fok is None:
        fair.reason = f"{label}: {ftext}"
    else:
        fair.verdict, fair.evidence = fok, [f"{label}: {ftext}"]
    return bp, fair


def combine(answers: list) -> Answer:
    """Per-endpoint answers -> one: fails if any fails, holds only if all hold."""
    out = Answer()
    for a in answers:
        out.evidence += a.evidence
        if a.reason:
            out.evidence.append("not measured: " + a.reason)
        out.parts.append(a.to_data())
        for k, v in a.metrics.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out.metrics[k] = v if out.metrics.get(k) is None else max(out.metrics[k], v)
            elif k not in out.metrics:
                out.metrics[k] = v
    verdicts = [a.verdict for a in answers]
    if any(v is False for v in verdicts):
        out.verdict = False
    elif verdicts and all(v is True for v in verdicts):
        out.verdict = True
    else:
        out.reason = "; ".join(a.reason for a in answers if a.reason) or "nothing was measured"
    return out


def shutdown(rig, endpoint, declared: int | None, plan: Plan) -> Answer:
    label = endpoint.label
    if declared is None:
        return Answer(None, reason=f"{label}: the answer declares no size (no Content-Length; "
                                   "for raw requests give REQUEST::BYTES)")
    rate = max(declared / plan.read_s, 4096.0)
    spec = _role("shutdown", endpoint, "shutdown", rate_Bps=rate, sockbuf=plan.slow_sockbuf,
                 max_s=plan.stop_after_s + plan.grace_s + plan.read_s + 15)
    res, stop = rig.shutdown_run(spec, plan.stop_after_s, plan.grace_s)
    body, ended = res.get("body_bytes") or 0, res.get("ended")
    at = res.get("connected_at")
    promised = res.get("declared_bytes") or declared
    a = Answer(metrics={"shutdown_promised_bytes": promised, "shutdown_received_bytes": body,
                        "shutdown_stop_s": stop.get("stop_s")})
    if res.get("error") or not res.get("connected"):
        a.reason = f"{label}: the client failed: {(res.get('error') or 'no connection')[:160]}"
        return a
    if at is None or stop["sent_at"] is None or at > stop["sent_at"]:
        a.reason = f"{label}: the client connected only after the stop was sent"
        return a
    before = 0
    for t, n in res.get("body_series") or []:
        if at + t <= stop["sent_at"]:
            before = n
    a.metrics["shutdown_received_before_stop_bytes"] = before
    if before >= promised:
        a.reason = (f"{label}: the answer ({fmt_bytes(promised)}) was complete before the stop "
                    "was sent: nothing was in flight")
        return a
    how = {"eof": "FIN", "reset": "RST"}.get(ended, ended)
    stopped = stop["exited"]
    a.metrics["shutdown_fin"] = ended == "eof"
    text = (f"{label}: got {body:,} of {promised:,} promised bytes "
            f"({before:,} before the stop), then {how}; ")
    text += (f"the server stopped {stop['stop_s']:.2f} s after the stop"
             if stopped else f"the server did not stop within {plan.grace_s:g} s (killed)")
    if stop.get("exit_code") not in (None, 0):
        rc = stop["exit_code"]
        text += f", exit {'signal ' + str(-rc) if rc < 0 else rc}"
    a.verdict = body >= promised and bool(stopped)
    a.evidence = [text]
    kernel = _kernel_send_buffer() if getattr(rig, "pinned", True) is False else None
    if a.verdict and kernel and promised <= kernel:
        a.evidence.append(f"the answer ({fmt_bytes(promised)}) fits in this kernel's send buffer "
                          f"(tcp_wmem max {fmt_bytes(kernel)}): a server that exits at once can "
                          "still deliver it; ask for a larger one to see user-space buffers")
    return a


def _kernel_send_buffer() -> int | None:
    """The most a socket's send buffer grows to here (tcp_wmem's maximum), or None."""
    try:
        with open("/proc/sys/net/ipv4/tcp_wmem") as f:
            return int(f.read().split()[2])
    except (OSError, ValueError, IndexError):
        return None


def faults(rig, endpoint, plan: Plan, log=None) -> Answer:
    if rig.net != "real":
        return Answer(None, reason="the fault matrix runs on real sockets only (its peers are "
                                   "plain sockets); run without --net sim")
    from bench.peers import faults as faultpeers
    limits = faultpeers.Limits(burst=plan.burst, idle_many=plan.idle_many, hold_s=plan.hold_s,
                               health_timeout_s=plan.fault_timeout_s,
                               eof_timeout_s=plan.fault_timeout_s)
    names = [f for f in plan.faults if not (f == "half-close")]    # raw: no reply is owed
    try:
        result = rig.faults(endpoint, names, limits, plan.settle_s, log=log)
    except Exception as exc:     # noqa: BLE001 -- _NotServing and the like: data
        return Answer(False, [f"the fault matrix could not start: {exc}"])
    rows = result["rows"]
    bad = [r for r in rows if not r["survived"]]
    tracebacks = result.get("tracebacks_count")
    base, final = result["baseline_fds"], result["final_fds"]
    fds_back = base is None or (final is not None and final <= base)
    a = Answer(metrics={"faults_survived_count": len(rows) - len(bad),
                        "faults_count": len(rows)})
    a.verdict = not bad and fds_back
    a.evidence = [f"{len(rows) - len(bad)} of {len(rows)} faults survived"
                  + (f"; fds {final} at the end, baseline {base}" if base is not None else "")]
    for r in bad:
        a.evidence.append(f"{r['fault']}: NOT survived ({'; '.join(r['notes'])[:160]})")
    if tracebacks:
        a.evidence.append(f"{tracebacks} traceback(s) on the server's stderr during the faults "
                          "(not counted against it: frameworks log a client that vanished)")
    a.parts = rows
    return a


def ask(new_rig, endpoints, plan: Plan, questions, *, shutdown_endpoint=None, log=None,
        tag: str = "", into: dict | None = None, healthy=None) -> dict:
    """Every question asked (in order: per endpoint backpressure and fairness, then
    faults, then shutdown, which ends the server). {question: Answer}, plus "raw";
    filled into ``into`` as each answer is known (an interrupt keeps those).

    ``new_rig()`` starts a server. Each endpoint gets a fresh one: a process keeps
    the memory it freed and hands it out again, so RSS after one endpoint's slow
    clients would hide the next one's growth. Faults and shutdown use the last."""
    answers: dict = {} if into is None else into
    raw_all, bps, fairs = [], [], []
    declared = None
    died = None
    rig = None
    wants_load = "backpressure" in questions or "fairness" in questions
    answers["raw"] = raw_all
    try:
        for ep in endpoints if wants_load else ():
            if rig is not None:
                rig.close()
            rig = new_rig()
            if log:
                log(f"{ep.label}: healthy clients alone, then {plan.slow} slow client(s) "
                    "beside them")
            raw = backpressure(rig, ep, plan, tag, healthy)
            raw_all.append(raw)
            bp, fair = judge_endpoint(raw, plan)
            bps.append(bp)
            fairs.append(fair)
            if "backpressure" in questions:
                answers["backpressure"] = combine(bps)
            if "fairness" in questions:
                answers["fairness"] = combine(fairs)
            if declared is None and raw.get("probe", {}).get("declared_bytes") is not None \
                    and shutdown_endpoint is None:
                declared = (ep, raw["probe"]["declared_bytes"])
            died = raw.get("died") or rig.dead()
            if died:
                break
        for q in ("backpressure", "fairness"):
            if q in questions and q not in answers:
                answers[q] = Answer(None, reason=died or "no endpoint")
        if ("faults" in questions or "shutdown" in questions) and not died and rig is None:
            rig = new_rig()
        if "faults" in questions:
            if died:
                answers["faults"] = Answer(None, reason=f"not run: {died}")
            else:
                if log:
                    log(f"faults: {', '.join(plan.faults)}")
                answers["faults"] = faults(rig, healthy or (endpoints[0] if endpoints else
                                                             shutdown_endpoint), plan, log)
                died = rig.dead()
                if died:
                    answers["faults"].verdict = False
                    answers["faults"].evidence.append(died)
        if "shutdown" in questions:
            if died:
                answers["shutdown"] = Answer(None, reason=f"not run: {died}")
            else:
                ep, size = _shutdown_target(rig, endpoints, shutdown_endpoint, declared, plan)
                if log:
                    log(f"shutdown: {ep.label} in flight, then the stop")
                answers["shutdown"] = shutdown(rig, ep, size, plan)
    finally:
        if rig is not None:
            rig.close()
    return answers


def _shutdown_target(rig, endpoints, chosen, declared, plan):
    if chosen is not None:
        if chosen.kind == "raw":
            return chosen, chosen.declared
        first = probe(rig, chosen, plan)
        return chosen, first.get("declared_bytes")
    if declared is not None:
        return declared
    for ep in endpoints:
        if ep.kind == "raw" and ep.declared is not None:
            return ep, ep.declared
    if not endpoints:
        return _NoEndpoint(), None
    first = probe(rig, endpoints[0], plan)
    return endpoints[0], first.get("declared_bytes")


class _NoEndpoint:
    label = "(no endpoint)"
    kind = "http"


def smaller(plan: Plan, **changes) -> Plan:
    return replace(plan, **changes)
