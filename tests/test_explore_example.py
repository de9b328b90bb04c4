"""The worked example of docs/explore.md, run as the page shows it: each command
again, and the page must still say what the command says (the simulated
network is deterministic, so these are not snapshots)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "explore.md")
PROGRAM = "examples/explore/lostwakeup.py"


def _page() -> str:
    return open(PAGE, encoding="utf-8").read()


def _run(cwd, *args, code=None, timeout=300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=timeout)
    if code is not None:
        assert r.returncode == code, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def _looplab(cwd, *args, code=0):
    return _run(cwd, "-m", "bench", *args, code=code).stdout


def _example_section(page: str) -> str:
    return page.split("## A worked example", 1)[1].split("## The command", 1)[0]


def test_the_page_shows_the_program_as_it_is():
    page = _example_section(_page())
    source = open(os.path.join(ROOT, PROGRAM), encoding="utf-8").read()
    shown = page.split("```python\n", 1)[1].split("```", 1)[0]
    assert shown.strip() in source            # the code shown is the file's, verbatim
    code = [ln for ln in source.split('"""', 2)[2].splitlines() if ln.strip()]
    assert f"a plain asyncio program, {len(code)} lines of code" in page.replace("\n", " ")


@pytest.mark.timeout(600)
def test_found_shrunk_replayed_from_the_file_alone_and_the_fix_proved(tmp_path):
    page = _example_section(_page())
    flat = " ".join(page.split())
    # the default order passes
    out = _looplab(ROOT, "explore", f"{PROGRAM}:main", "--strategy", "delays:0")
    assert out.count("proved: no failing schedule within 0 delays (1 schedules)") == 2
    assert "(`proved: no failing schedule within 0 delays (1 schedules)`)" in page
    # found with one delay, on both loops, shrunk to one deviation
    ex = tmp_path / "ex"
    out = _looplab(ROOT, "explore", f"{PROGRAM}:main", "--strategy", "delays:1", "--out",
                   str(ex), code=1)
    found = dict(re.findall(r"lostwakeup\.py:main (asyncio|looplab) main delays:1: FAILED at "
                            r"schedule (\d+)", out))
    assert set(found) == {"asyncio", "looplab"}
    assert out.count("shrunk to 1 (1 delays") == 2 and out.count("replay exact: yes") == 2
    assert (f"It is found at schedule {found['asyncio']} on asyncio's loop and "
            f"{found['looplab']} on looplab's, and shrinks to 1 deviation on both") in flat
    for rt in ("asyncio", "looplab"):
        assert f"main {rt} main delays:1: FAILED at schedule {found[rt]} (" in page
    # the pending lines and the deciding choice, as the page prints them
    for line in re.findall(r"pending: Task-\d+ (\(\w+\): waits at \S+ in \w+)", out)[:3]:
        assert line in page, line
    # the deciding choice names the connection (its local role and the peer) and the task
    label = re.search(r">> step \d+: io-order 1/2  ((?:read|write|event) (?:server|client) \S+ "
                      r"(?:<-|->) peer \S+ -> task \w+)", out).group(1)
    assert label in page
    # replayed from the file alone, from another folder
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = _looplab(str(elsewhere), "explore", "--replay",
                   str(ex / "failing-lostwakeup.py_main_asyncio_main.json"))
    assert "(sha256 as recorded)" in out and "same choice points: yes; exact: yes" in out
    # the fix, proved within 2 delays on both loops
    out = _looplab(ROOT, "explore", f"{PROGRAM}:fixed", "--strategy", "delays:2")
    proofs = dict(re.findall(r"fixed (asyncio|looplab) fixed delays:2: no failing schedule "
                             r"\((\d+) schedules", out))
    assert set(proofs) == {"asyncio", "looplab"}
    for rt, n in proofs.items():
        assert f"fixed {rt} fixed delays:2: no failing schedule ({n} schedules" in page
        assert f"proved: no failing schedule within 2 delays ({n} schedules)" in page
    assert f"{proofs['asyncio']} on asyncio's loop and {proofs['looplab']} on looplab's" in flat


@pytest.mark.timeout(600)
def test_the_same_as_a_marked_pytest_test(tmp_path):
    page = _example_section(_page())
    flat = " ".join(page.split())
    shown = page.split("`examples/explore/test_lostwakeup.py`:", 1)[1]
    shown = shown.split("```python\n", 1)[1].split("```", 1)[0]
    assert shown.strip() in open(os.path.join(ROOT, "examples/explore/test_lostwakeup.py")).read()
    junit = tmp_path / "junit.xml"
    r = _run(ROOT, "-m", "pytest", "-o", "addopts=", "-p", "no:cacheprovider",
             "examples/explore/test_lostwakeup.py", f"--junitxml={junit}",
             "--looplab-replay-dir", str(tmp_path / "replays"), code=1)
    assert "1 failed, 1 passed" in r.stdout and "1 failed, 1 passed" in page
    cases = {c.get("name"): c.find("failure") for c in ET.parse(junit).getroot().iter("testcase")}
    assert cases["test_take_gets_the_job_fixed"] is None
    message = cases["test_take_gets_the_job"].get("message")
    assert "\n" not in message and f"`{message}`" in flat, message
    at = re.search(r"fails at schedule (\d+)", message).group(1)
    assert f"finds the bug at schedule {at}" in flat
    # its schedule file replays without pytest
    replay = re.search(r"\(looplab explore --replay (\S+)\)", r.stdout).group(1)
    out = _looplab(str(tmp_path), "explore", "--replay", replay)
    assert "exact: yes" in out
