"""looplab's pytest plugin, seen from a user's project (pytester, in a subprocess).

Each run is a fresh pytest process so that runtimes a user's module registers
never reach this process's registry; each is bounded by a timeout.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET

import pytest

pytest_plugins = ["pytester"]

RUN_S = 240
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A user's kernel: coro's kernel under another id. It keeps coro's two
# deliberate differences from the task contract, so it must declare them.
KERNEL = '''
from bench import runtimes
from bench.runtimes import Difference, RuntimeInfo

_OS_ERROR = "resets surface as the OS error (as in coro)"
runtimes.register(RuntimeInfo(
    "mykernel", "task", "protocols.ports:CoroPort", runtimes.get("coro").options,
    differences={
        "reset_send": Difference("send_all raises ConnectionError; then receive_some returns b''",
                                 _OS_ERROR),
        "reset_receive": Difference("receive_some raises ConnectionError", _OS_ERROR),
    }))
runtimes.register(RuntimeInfo(
    "needslib", "stream", "protocols.ports:HybridPort", runtimes.get("hybrid").options,
    requires=("looplab_no_such_lib",)))
'''

USER_TESTS = '''
import pytest
from bench.verbs.pytest_plugin import run_program


@pytest.mark.looplab_style("task")
def test_task_only(looplab_runtime):
    async def main(port):
        await port.sleep(0)
        return port.runtime.id
    outcome = run_program(looplab_runtime, main)
    assert outcome.result == looplab_runtime.id
    assert outcome.probe["source"]


@pytest.mark.looplab_style("callback")
def test_callback_only(looplab_runtime):
    pass


def test_every_style(looplab_runtime, looplab_port):
    assert looplab_port.style == looplab_runtime.style
'''


def _run(pytester, *args):
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rsx", *args, timeout=RUN_S)


def test_looplab_runtime_follows_styles_selection_and_a_runtime_module(pytester):
    pytester.makepyfile(mykernel=KERNEL)
    pytester.makepyfile(test_user=USER_TESTS)
    result = _run(pytester, "--looplab-runtime-module", "mykernel",
                  "--looplab-runtimes", "mykernel,coro:spawn=eager,hybrid,needslib", "-v")
    result.assert_outcomes(passed=5, skipped=2)
    out = result.stdout.str()
    for test_id in ("test_task_only[mykernel] PASSED", "test_task_only[coro:spawn=eager] PASSED",
                    "test_every_style[hybrid] PASSED", "test_every_style[mykernel] PASSED"):
        assert test_id in out, out
    assert "test_task_only[hybrid]" not in out
    # a style nobody selected, and a missing library: skips with their reasons
    result.stdout.fnmatch_lines(["*no selected runtime has the callback style*",
                                 "*needslib: looplab_no_such_lib is not importable*"])


def test_bad_selection_is_one_usage_line(pytester):
    pytester.makepyfile(test_user=USER_TESTS)
    result = _run(pytester, "--looplab-runtimes", "coro,nosuch")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*looplab: unknown runtime 'nosuch'; valid runtimes: callback, *"])
    result = _run(pytester, "--looplab-runtime-module", "looplab_not_a_module")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*looplab: runtime module 'looplab_not_a_module' does not import*"])


def test_conformance_suite_runs_on_a_third_party_runtime_with_one_command(pytester):
    """The documented command, on a kernel registered from the user's module:
    the task contract passes apart from the two declared differences, which are
    xfails listed with their reason at the end."""
    pytester.makepyfile(mykernel=KERNEL)
    result = _run(pytester, "--pyargs", "protocols.conformance",
                  "--looplab-runtime-module", "mykernel", "--looplab-runtimes", "mykernel")
    outcomes = result.parseoutcomes()
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert outcomes.get("xfailed") == 2 and outcomes.get("passed", 0) >= 10, outcomes
    assert "failed" not in outcomes
    # pytest-benchmark's empty storage folder does not stay behind in the user's folder
    assert not (pytester.path / ".benchmarks").exists()
    result.stdout.fnmatch_lines([
        "*looplab: declared contract differences*",
        "*test_task_peer_reset[[]mykernel-send[]]*resets surface as the OS error (as in coro)*",
    ])


def test_an_undeclared_difference_fails_and_a_stale_one_too(pytester):
    """Without its declarations the same kernel fails those two tests; a
    declaration for something it does not do fails as well."""
    pytester.makepyfile(mykernel=textwrap.dedent('''
        from bench import runtimes
        from bench.runtimes import Difference, RuntimeInfo
        runtimes.register(RuntimeInfo(
            "bare", "task", "protocols.ports:CoroPort", runtimes.get("coro").options,
            differences={"send_after_eof": Difference("BrokenPipeError", "claimed, not true")}))
        '''))
    result = _run(pytester, "--pyargs", "protocols.conformance", "-k", "reset or after_send_eof",
                  "--looplab-runtime-module", "mykernel", "--looplab-runtimes", "bare")
    result.assert_outcomes(failed=3, skipped=2)
    result.stdout.fnmatch_lines([
        "*bare reset_receive: measured 'receive_some raises ConnectionError', "
        "contract 'receive_some raises BrokenResourceError'*",
        "*bare send_after_eof: meets the contract 'ClosedResourceError' now, but declares*",
    ], consecutive=False)


# ---------------------------------------------------------------------------
# @pytest.mark.looplab: a test explored as `looplab explore` explores a program

MARKED_TESTS = '''
import asyncio

import pytest


async def serve(fixed):
    jobs, wake = [], asyncio.Event()

    async def handle(reader, writer):
        if await reader.readline() == b"job\\n":
            jobs.append(b"done\\n")
            wake.set()
        else:
            if fixed:
                wake.clear()
            if not jobs:
                await asyncio.sleep(0)
                if not fixed:
                    wake.clear()
                await wake.wait()                       # WAIT
            writer.write(jobs.pop())
        writer.close()

    async def client(request):
        reader, writer = await asyncio.open_connection("127.0.0.1", 8000)
        writer.write(request)
        reply = await reader.readline()
        writer.close()
        return reply

    async with await asyncio.start_server(handle, "127.0.0.1", 8000):
        await asyncio.gather(client(b"job\\n"), client(b"take\\n"))


@pytest.mark.looplab(strategy="pct:d=3", budget=500)
async def test_lost_wakeup():
    await serve(fixed=False)


@pytest.mark.looplab(strategy="delays:2", budget=5000)
async def test_fixed():
    await serve(fixed=True)


@pytest.mark.looplab(budget=5, strategy="bogus")
async def test_bad_option():
    pass
'''


def test_the_looplab_marker_explores_a_test_and_fails_it_once_with_a_replay(pytester):
    pytester.makepyfile(test_marked=MARKED_TESTS)
    result = _run(pytester, "--junitxml=junit.xml", "--looplab-replay-dir", "replays")
    result.assert_outcomes(passed=1, failed=2)
    out = result.stdout.str()
    wait = next(i for i, ln in enumerate(MARKED_TESTS.splitlines()) if "# WAIT" in ln)
    # the report: the shrunk schedule, the pending tasks at the test's own line, the replay
    assert re.search(r"shrunk to [12] \([12] delays", out), out
    assert re.search(rf"pending: Task-\d+ \(handle\): waits at \S*test_marked\.py:{wait} "
                     r"in handle", out), out
    # choice labels name the connection by its role and peer, never a bare fd
    assert re.search(r"(read|write|event) (server|client) 127\.0\.0\.1:\d+ (<-|->) peer "
                     r"127\.0\.0\.1:\d+", out), out
    assert not re.search(r"\bfd \d+", out)
    replay = re.search(r"\(looplab explore --replay (\S+)\)", out).group(1)
    # junit: one failure per test, and its message is one line
    junit = ET.parse(pytester.path / "junit.xml").getroot()
    failures = {case.get("name"): case.find("failure") for case in junit.iter("testcase")}
    assert failures["test_fixed"] is None
    lost = failures["test_lost_wakeup"].get("message")
    assert "\n" not in lost and lost.startswith(
        "looplab: test_marked.py:test_lost_wakeup on asyncio (pct:d=3): fails at schedule ")
    assert "shrunk to" in lost and lost.endswith("hang: tasks still pending at t=5s "
                                                 "(liveness bound)")
    assert "--strategy must be random, pct:d=N or delays:D" in \
        failures["test_bad_option"].get("message")
    # the schedule file replays the test from the command line alone
    r = subprocess.run([sys.executable, "-m", "bench", "explore", "--replay", replay],
                       cwd=pytester.path, capture_output=True, text=True, timeout=RUN_S,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 0 and "exact: yes" in r.stdout, r.stdout + r.stderr


def test_a_run_without_the_marker_does_not_import_the_explorer(pytester):
    pytester.makepyfile(test_plain='''
        import sys

        def test_nothing_of_the_explorer():
            assert not [m for m in sys.modules if m.startswith("bench.explore")]
        ''')
    result = _run(pytester)
    result.assert_outcomes(passed=1)
