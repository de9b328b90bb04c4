"""Measured advice: for a verdict that fails, the smallest knob setting shown to fix it.

For a failing question, each knob that can change it (``bench.check.target.KNOBS``,
the loop's ``high_water`` on looplab's loop, and the app factory's own numeric
keyword parameters) is tried up its ladder, smallest value first; every try is a fresh
server, asked that question again (for backpressure, with fairness beside it). The
first value that makes the question hold -- for backpressure: memory per slow client
within the budget and flat, *and* healthy p99 beside the slow clients within the
latency factor of the p99 alone measured before any change -- is the advice, printed
with the measured before and after. When no knob does it, the advice says what was
tried and, from the evidence, where the memory is (a transport buffered far above its
high-water mark: the app does not stop writing when ``pause_writing()`` comes).
"""
from __future__ import annotations

from bench.results.tables import fmt_bytes

__all__ = ["candidates", "search"]


def candidates(question: str, kind: str, params: dict, loop, endpoints, chosen: list):
    """[(knob name, values)] to try for ``question``: ``chosen`` (from ``--advise``,
    already checked) if given, else the defaults for this app."""
    from bench.check import target as tg
    if chosen:
        return [(k.name, vals) for k, vals in chosen if question in k.questions]
    out = []
    for name, default in params.items() if question != "shutdown" else ():
        if default is None or (isinstance(default, int) and not isinstance(default, bool)):
            out.append((f"app.{name}", tg.APP_LADDER))
    if question == "backpressure":
        if loop is not None and loop.name == "looplab":
            out.append(("loop.high_water", tg.KNOBS["loop.high_water"].ladder))
        if kind == "aiohttp" and any(e.kind == "ws" for e in endpoints):
            out.append(("aiohttp.heartbeat", tg.KNOBS["aiohttp.heartbeat"].ladder))
    if question == "shutdown":
        for name in ("aiohttp.shutdown_timeout", "uvicorn.timeout_graceful_shutdown"):
            if kind in tg.KNOBS[name].kinds:
                out.append((name, tg.KNOBS[name].ladder))
    return out


def _show(name: str, value) -> str:
    if isinstance(value, int) and ("water" in name or "size" in name or "limit" in name
                                   and "concurrency" not in name):
        return f"{name}={fmt_bytes(value)}"
    return f"{name}={value:g}" if isinstance(value, float) else f"{name}={value}"


def _mem(ans) -> str:
    m = ans.metrics.get("memory_per_slow_client_bytes")
    return "-" if m is None else fmt_bytes(m)


def _p99(ans, key="healthy_slow_p99_s") -> str:
    v = ans.metrics.get(key)
    return "-" if v is None else f"{v * 1e3:.1f} ms"


def _accepts(question, trial: dict, before: dict, plan) -> tuple[bool, str]:
    got = trial.get(question)
    if got is None or got.verdict is not True:
        why = (got.evidence[0] if got and got.evidence else
               (got.reason if got else "not measured")) or "not measured"
        return False, why
    if question == "backpressure":
        fair = trial.get("fairness")
        alone = (before.get("fairness").metrics.get("healthy_alone_p99_s")
                 if before.get("fairness") else None)
        p99 = fair.metrics.get("healthy_slow_p99_s") if fair else None
        if fair is None or fair.verdict is False:
            return False, "healthy clients suffer: " + (fair.evidence[0] if fair and fair.evidence
                                                        else "fairness not measured")
        if alone is not None and p99 is not None and \
                p99 > plan.latency_factor * max(alone, plan.latency_floor_s):
            return False, (f"healthy p99 {p99 * 1e3:.1f} ms is over x{plan.latency_factor:g} "
                           f"the {alone * 1e3:.1f} ms measured before")
    return True, ""


def search(question: str, before: dict, tries, run, plan, log=None) -> dict:
    """Climb each knob's ladder; ``run(name, value)`` asks the question again with that
    setting and returns the answers. The advice as a dict for the document."""
    tried = []
    for name, values in tries:
        for value in values:
            if log:
                log(f"advice for {question}: trying {_show(name, value)}")
            trial = run(name, value)
            ok, why = _accepts(question, trial, before, plan)
            if ok:                    # once may be luck: it must hold a second time
                again = run(name, value)
                ok, why = _accepts(question, again, before, plan)
                why = why and "held once, not twice: " + why
            tried.append({"setting": _show(name, value), "holds": ok, "why": why[:200],
                          "memory_per_slow_client_bytes":
                              trial.get("backpressure").metrics.get("memory_per_slow_client_bytes")
                              if trial.get("backpressure") else None})
            if ok:
                return {"question": question, "setting": _show(name, value), "knob": name,
                        "value": value, "text": _before_after(question, before, trial, plan),
                        "tried": tried}
    text = ("no setting tried fixes it" + (f" (tried {', '.join(t['setting'] for t in tried)})"
                                           if tried else " (no knob of this app applies)"))
    hint = _hint(question, before)
    return {"question": question, "setting": None, "text": text + (f"; {hint}" if hint else ""),
            "tried": tried}


def _before_after(question, before, trial, plan) -> str:
    b, a = before.get(question), trial.get(question)
    if question == "backpressure":
        fb, fa = before.get("fairness"), trial.get("fairness")
        return (f"memory per slow client {_mem(b)} -> {_mem(a)} (budget "
                f"{fmt_bytes(plan.budget_bytes)}); healthy p99 beside the slow "
                f"{_p99(fb) if fb else '-'} -> {_p99(fa) if fa else '-'} (alone before "
                f"{_p99(fb, 'healthy_alone_p99_s') if fb else '-'}, limit x{plan.latency_factor:g})")
    if question == "shutdown":
        mb, ma = b.metrics, a.metrics
        return (f"got {mb.get('shutdown_received_bytes')} -> {ma.get('shutdown_received_bytes')} "
                f"of {ma.get('shutdown_promised_bytes')} bytes; stopped in "
                f"{mb.get('shutdown_stop_s') or 0:.2f} -> {ma.get('shutdown_stop_s') or 0:.2f} s")
    return f"{question}: " + (a.evidence[0] if a.evidence else "holds")


def _hint(question, before) -> str:
    if question != "backpressure":
        return ""
    m = before["backpressure"].metrics
    buffered = m.get("transports_buffered_peak_bytes")
    queued = m.get("queued_bytes")
    if buffered and buffered > 1 << 20:
        return (f"the transports held {fmt_bytes(buffered)}: the app keeps writing after "
                "pause_writing(); stop producing until resume_writing() (or await drain())")
    if queued and queued > 1 << 20:
        return (f"asyncio queues held {fmt_bytes(queued)}: bound them (Queue(maxsize=...)) and "
                "decide what happens to a subscriber that falls behind")
    return ""
