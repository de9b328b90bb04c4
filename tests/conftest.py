"""looplab's own suite: the leak check, and aliases for the plugin's runtime fixtures.

Every test runs under ``no_leaks``: after it, the process's open file
descriptors, threads and child processes must be back to what they were before
(a kernel that stops releases its selector, wake-up socketpair and sockets),
and so must the signal dispositions and mask: a SIGINT left ignored is
inherited by every process the worker starts later, which then cannot be
interrupted.
Once per session, nothing new may sit at the top of the checkout.
"""
from __future__ import annotations

import gc
import os
import signal
import threading
import time

import pytest


def _fds() -> set[int]:
    try:
        return {int(n) for n in os.listdir("/proc/self/fd")}
    except FileNotFoundError:  # not Linux: nothing to compare
        return set()


def _children() -> set[int]:
    me = os.getpid()
    found = set()
    try:
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    with open(f"/proc/{pid}/stat") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if int(fields[1]) == me and fields[0] != "Z":
                    found.add(int(pid))
    except FileNotFoundError:
        pass
    return found


def leaks_since(fds: set[int], threads: set, children: set[int], grace_s: float = 2.0) -> list[str]:
    """What is open now that was not before; waits up to ``grace_s`` for
    stragglers (threads finishing, children being reaped) before judging."""
    deadline = time.monotonic() + grace_s
    while True:
        gc.collect()
        new_fds = _fds() - fds
        new_threads = [t for t in threading.enumerate() if t not in threads and t.is_alive()]
        new_children = _children() - children
        if not (new_fds or new_threads or new_children) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    problems = []
    if new_fds:
        desc = []
        for fd in sorted(new_fds):
            try:
                desc.append(f"{fd}->{os.readlink(f'/proc/self/fd/{fd}')}")
            except OSError:
                desc.append(str(fd))
        problems.append("file descriptors: " + ", ".join(desc))
    if new_threads:
        problems.append("threads: " + ", ".join(t.name for t in new_threads))
    if new_children:
        problems.append("child processes: " + ", ".join(map(str, sorted(new_children))))
    return problems


def _open_process_wide_resources() -> None:
    """uvloop (libuv) opens a signal pipe once per process, the first time any loop
    is made; open it before any baseline so the leak check doesn't count it."""
    try:
        import uvloop
    except ImportError:
        return
    uvloop.new_event_loop().close()


_open_process_wide_resources()


# SIGALRM is pytest-timeout's while a test runs
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGCHLD)

# A suite started from a background job (`pytest &`, nohup) inherits SIGINT
# ignored, and so would every verb it starts; the walk's Ctrl-C rows would then
# pass or fail by test order. The suite's processes take Ctrl-C as a terminal's do.
if (threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGINT) is signal.SIG_IGN):
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _signal_state() -> tuple:
    """What a child started now would inherit (dispositions and mask), and what
    a Ctrl-C in this process would run."""
    if threading.current_thread() is not threading.main_thread():
        return ()
    return (tuple(signal.getsignal(s) for s in _SIGNALS),
            frozenset(signal.pthread_sigmask(signal.SIG_BLOCK, [])))


def _signal_changes(before: tuple) -> list[str]:
    after = _signal_state()
    if after == before:
        return []
    changed = [f"{s.name} {b!r} -> {a!r}" for s, b, a in zip(_SIGNALS, before[0], after[0])
               if a != b]
    if before[1] != after[1]:
        changed.append(f"blocked {sorted(before[1])} -> {sorted(after[1])}")
        signal.pthread_sigmask(signal.SIG_SETMASK, before[1])
    for s, b in zip(_SIGNALS, before[0]):
        if b is not None:
            signal.signal(s, b)       # put back, so one culprit does not fail the rest
    return ["signal state: " + ", ".join(changed)]


@pytest.fixture(autouse=True)
def no_leaks(request):
    if request.node.get_closest_marker("allow_leaks"):
        yield
        return
    fds, threads, children = _fds(), set(threading.enumerate()), _children()
    signals = _signal_state()
    yield
    problems = leaks_since(fds, threads, children) + (_signal_changes(signals) if signals else [])
    if problems:
        pytest.fail("leaked after the test: " + "; ".join(problems), pytrace=False)


@pytest.fixture(autouse=True)
def scenario_files_loaded_in_a_test_leave_with_it():
    """A scenario file a test loads in-process would otherwise stay registered for
    every later test of the worker: a user scenario without the default preset
    once made an unrelated ``run --replay`` refuse. Built-ins and zoo entries,
    loaded lazily by whichever test asks first, stay."""
    import sys
    api = sys.modules.get("bench.scenarios.api")
    before = set(api._REGISTRY) if api else set()
    files = set(api._FILE_MODULES) if api else set()
    yield
    api = sys.modules.get("bench.scenarios.api")
    if api is None:
        return
    for sid in [s for s, sc in api._REGISTRY.items()
                if s not in before and sc.origin.startswith("file ")]:
        del api._REGISTRY[sid]
    for path in set(api._FILE_MODULES) - files:
        del api._FILE_MODULES[path]


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPORT_FOLDERS = ("looplab-runs", "looplab-report", "looplab-zoo")


def _checkout() -> set[str]:
    """The checkout's top-level names (hidden ones aside: pytest's cache) and what
    the default report folders hold."""
    names = {n for n in os.listdir(ROOT) if not n.startswith(".")}
    for folder in REPORT_FOLDERS:
        if os.path.isdir(os.path.join(ROOT, folder)):
            names |= {f"{folder}/{n}" for n in os.listdir(os.path.join(ROOT, folder))}
    return names


@pytest.fixture(scope="session", autouse=True)
def nothing_left_in_the_checkout():
    """A command run from the checkout (a subprocess's default working directory)
    must not write there: a user's mistake once left an empty looplab-runs/ folder
    this way, from every test that made it. Checked once per session (per worker):
    a test of one worker can't be told from another's while both run."""
    before = _checkout()
    yield
    left = sorted(_checkout() - before)
    if left:
        pytest.fail(f"left in the checkout by this session's tests: {', '.join(left)}",
                    pytrace=False)


def pytest_configure(config):
    config.addinivalue_line("markers", "allow_leaks: skip the fd/thread/child leak check")
    if config.getoption("--runtimes") and not config.getoption("looplab_runtimes"):
        config.option.looplab_runtimes = config.getoption("--runtimes")


# ---------------------------------------------------------------------------
# Runtimes come from looplab's pytest plugin (bench/verbs/pytest_plugin.py):
# ``looplab_runtime``, ``@pytest.mark.looplab_style`` and ``--looplab-runtimes``.
# This suite's older spellings stay as aliases: ``--runtimes`` and a ``runtime``
# fixture over every style.

def pytest_addoption(parser):
    parser.addoption("--runtimes", default=None,
                     help="alias of --looplab-runtimes for looplab's own suite")


def pytest_generate_tests(metafunc):
    if "runtime" in metafunc.fixturenames:
        from bench.verbs.pytest_plugin import selected_specs
        metafunc.parametrize("runtime", selected_specs(metafunc.config), indirect=True)


@pytest.fixture
def runtime(request):
    """A parsed ``bench.runtimes.Runtime``; skips when its library is missing."""
    from bench.verbs.pytest_plugin import runtime_or_skip
    return runtime_or_skip(request.param)
