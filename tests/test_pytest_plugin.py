"""looplab's pytest plugin, seen from a user's project (pytester, in a subprocess).

Each run is a fresh pytest process so that runtimes a user's module registers
never reach this process's registry; each is bounded by a timeout.
"""
from __future__ import annotations

import textwrap

import pytest

pytest_plugins = ["pytester"]

RUN_S = 240

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
