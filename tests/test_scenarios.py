"""S1, S3, S4 and S5 at small scale on every runtime, judged by generous oracles.

The expected verdicts depend only on the *style* and the variant: that is the
claim looplab makes (callback and hybrid behave as asyncio does, coro as curio and
trio do). Each cell runs its app in its own process and its peers in another; the
scenario code bounds every wait, so a broken kernel fails here instead of hanging.
"""
from __future__ import annotations

import pytest

from bench import scenarios

KiB, MiB = 1024, 1024 * 1024

# (scenario, style, variant) -> verdicts that must hold.
EXPECTED = {
    ("S1", "callback", "naive"): {"bounded": False},
    ("S1", "callback", "fixed"): {"bounded": True},
    ("S1", "stream", "naive"): {"bounded": False},
    ("S1", "stream", "fixed"): {"bounded": True},
    ("S1", "task", "naive"): {"bounded": True},
    ("S1", "task", "fixed"): {"bounded": True},
    ("S3", "callback", "naive"): {"no_loss": False},
    ("S3", "callback", "fixed"): {"no_loss": True, "close_completed": True},
    ("S3", "stream", "naive"): {"no_loss": False},
    ("S3", "stream", "fixed"): {"no_loss": True, "close_completed": True},
    ("S3", "task", "naive"): {"no_loss": True, "close_completed": True},
    ("S3", "task", "fixed"): {"no_loss": True, "close_completed": True},
    ("S5", "callback", "naive"): {"bounded": False},
    ("S5", "callback", "fixed"): {"bounded": True},
    ("S5", "stream", "naive"): {"bounded": False},
    ("S5", "stream", "fixed"): {"bounded": True},
    ("S5", "task", "naive"): {"bounded": True},
    ("S5", "task", "fixed"): {"bounded": True},
}

SMALL = {
    "S1": {"duration_s": 1.2, "grace_s": 0.8},
    "S3": {"total_bytes": 2 * MiB, "start_after_s": 0.3},
    "S5": {"hold_s": 0.8},
}


def _cell(sid, runtime, variant):
    [cell] = scenarios.plan(sid, runtime.spec, variant, "quick")
    cell.params.update(SMALL.get(sid, {}))
    return cell


def _run(sid, runtime, variant):
    result = scenarios.run_cell(_cell(sid, runtime, variant))
    assert not result["errors"], result["errors"]
    return result


@pytest.mark.parametrize("sid, variant", [(s, v) for s in ("S1", "S3", "S5") for v in ("naive", "fixed")])
def test_verdicts_follow_the_style(runtime, sid, variant):
    result = _run(sid, runtime, variant)
    expected = EXPECTED[(sid, runtime.style, variant)]
    got = {k: result["verdicts"][k] for k in expected}
    assert got == expected, (result["metrics"], result["notes"])


def test_s1_naive_buffer_grows_where_the_style_buffers(runtime):
    m = _run("S1", runtime, "naive")["metrics"]
    if runtime.style == "task":
        assert m["peak_user_buffer_bytes"] in (0, None)
    else:
        # 3 MB/s in, 1 MB/s out for 1.2 s: about 2.4 MB piles up in user space.
        assert m["peak_user_buffer_bytes"] > 1 * MiB
        assert m["pause_writing_count"] in (None,) or m["pause_writing_count"] >= 1


def test_s3_lost_bytes_are_what_was_not_delivered(runtime):
    m = _run("S3", runtime, "naive")["metrics"]
    assert m["bytes_lost"] == 2 * MiB - m["bytes_delivered"]
    assert 0 <= m["bytes_delivered"] <= 2 * MiB


def test_s4_fingerprint_matches_its_declared_column(runtime):
    result = _run("S4", runtime, "naive")
    assert result["verdicts"]["matches_declared"], result["notes"]
