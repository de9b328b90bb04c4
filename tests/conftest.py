"""Shared fixtures: the runtime parametrization and the leak check.

Every test runs under ``no_leaks``: after it, the process's open file
descriptors, threads and child processes must be back to what they were before
(a kernel that stops releases its selector, wake-up socketpair and sockets).
"""
from __future__ import annotations

import gc
import os
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


@pytest.fixture(autouse=True)
def no_leaks(request):
    if request.node.get_closest_marker("allow_leaks"):
        yield
        return
    fds, threads, children = _fds(), set(threading.enumerate()), _children()
    yield
    problems = leaks_since(fds, threads, children)
    if problems:
        pytest.fail("leaked after the test: " + "; ".join(problems), pytrace=False)


def pytest_configure(config):
    config.addinivalue_line("markers", "allow_leaks: skip the fd/thread/child leak check")
