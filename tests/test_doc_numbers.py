"""Numbers in the docs that a cheap command reproduces exactly are re-measured here.

The simulated network is deterministic, so its figures are not snapshots: each test runs
the command the page prints beside a number and checks that the page still says what the
command says now. (Real-socket timings drift; those pages carry the date and interpreter
of their run instead.)
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIMNET_MD = os.path.join(ROOT, "docs", "simnet.md")


def _looplab(tmp_path, *args, timeout=300, exit_code=0) -> str:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-m", "bench", *args], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == exit_code, r.stderr[-2000:]
    return r.stdout


def _page() -> str:
    return re.sub(r"\s+", " ", open(SIMNET_MD, encoding="utf-8").read())


@pytest.mark.timeout(300)
def test_the_fault_shrinking_example(tmp_path):
    out = _looplab(tmp_path, "run", "--net", "sim", "--seeds", "100", "--faults", "3",
                   "--scenarios", "S3", "--variants", "fixed", "--runtimes", "callback,coro",
                   "--preset", "tiny", "--out", "ex", exit_code=1)   # some universes: not measured
    cb = out.split("S3/callback/fixed/tiny/sim:", 1)[1].split("S3/coro", 1)[0]
    outcomes = {why: int(n) for n, why in re.findall(r"^\s+(\d+)\s+[\d.]+ %\s+(.*)$", cb, re.M)}
    failing = sum(n for why, n in outcomes.items() if why != "close_completed=yes, no_loss=yes")
    hung = sum(n for why, n in outcomes.items() if "did not finish" in why)
    unmeasured = sum(n for why, n in outcomes.items() if "not measured" in why)
    failed = sum(n for why, n in outcomes.items() if why.startswith("close_completed=NO"))
    first = re.search(r"first failing seed (\d+): faults (\d+) -> (\d+)", cb)
    assert first, cb
    universe = json.loads((tmp_path / "ex" / "failing-S3_callback_fixed_tiny_sim.json").read_text())
    faults = universe["net"]["faults"]
    assert len(faults) == int(first.group(3)) == 1
    page = _page()
    assert f"finds {failing} failing seeds in 100" in page, failing
    assert (f"{_words(hung)} of them end as an error" in page or f"{hung} of them end as an error" in page), hung
    assert f"{unmeasured} are not measured" in page and f"and {failed} fail their verdicts" in page
    assert f"The first, seed {first.group(1)}, had a schedule of {_words(int(first.group(2)))} faults" in page
    assert f"`{faults[0]['kind']}` of the reader's side at {faults[0]['at']:.3f} s" in page


@pytest.mark.timeout(300)
def test_the_s3_drain_race_frequency(tmp_path):
    out = _looplab(tmp_path, "run", "--net", "sim", "--seeds", "1000", "--scenarios", "S3",
                   "--variants", "drain", "--runtimes", "callback", "--preset", "blog",
                   "--out", "race")
    lost = sum(int(n) for n in re.findall(r"^\s+(\d+)\s+[\d.]+ %\s+.*no_loss=NO", out, re.M))
    assert re.search(r"lost_bytes min 0, median 0, max 1203\b", out), out
    assert f"| callback | {lost} of 1000 seeds ({lost / 10:.1f} %) | 0 / 0 / 1,203 |" in _page()


@pytest.mark.timeout(300)
def test_the_short_write_drain_losses(tmp_path):
    out = _looplab(tmp_path, "run", "--net", "sim", "--seeds", "200", "--buggify", "short-write",
                   "--scenarios", "S3", "--variants", "drain", "--preset", "tiny",
                   "--runtimes", "callback,hybrid,asyncio-protocol", "--out", "bg")
    lost = []
    for rt in ("callback", "hybrid", "asyncio-protocol"):
        part = out.split(f"S3/{rt}/drain/tiny/sim:", 1)[1].split("exploration:", 1)[0]
        part = part.split("S3/", 1)[0]
        lost.append(sum(int(n) for n in re.findall(r"^\s+(\d+)\s+[\d.]+ %\s+.*no_loss=NO",
                                                    part, re.M)))
    assert (f"counted {lost[0]}, {lost[1]} and {lost[2]} losing seeds of 200 on callback, "
            f"hybrid and asyncio-protocol") in _page(), lost


def _words(n: int) -> str:
    return {1: "one", 2: "two", 3: "three", 4: "four", 5: "five"}.get(n, str(n))
