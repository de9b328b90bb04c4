"""Port conformance on the built-in runtimes: the shipped suite, run here.

The suite itself lives in ``protocols.conformance`` so that a third-party
runtime can be held to the same contract with one command; this module only
collects it for looplab's own test run, where the autouse leak check in
``conftest.py`` also runs after every test. Declared differences (on each
``RuntimeInfo``) show up as xfails with their reasons.
"""
from __future__ import annotations

from protocols.conformance.test_data import *          # noqa: F401,F403
from protocols.conformance.test_errors import *        # noqa: F401,F403
from protocols.conformance.test_task_misuse import *   # noqa: F401,F403
