"""The port conformance suite: one set of contract tests, run on any runtime.

A driver is written once per port style and trusted on every runtime of that
style, so what a port promises (``protocols.contracts``) is checked on all of
them with the same code, through the port API only. The suite ships with
looplab so a kernel written outside it can be held to the same contract::

    pytest --pyargs protocols.conformance \
        --looplab-runtime-module mypkg.kernel --looplab-runtimes mykernel

(The plugin is loaded by its ``pytest11`` entry point; where plugin autoloading
is off, add ``-p looplab``, the entry point's name.)
``--looplab-runtime-module`` imports the module that registers the runtime;
``--looplab-runtimes`` picks what to test (default: every registered runtime).
Each test applies to one style or to all of them, so a runtime only runs the
tests of its own style.

Where a runtime behaves differently on purpose, it says so in
``RuntimeInfo.differences``; those tests end as xfail with the declared reason,
and the end of the run lists every declared difference it saw. A difference
that no longer happens fails, so a declaration cannot go stale. See
``protocols.conformance.contract`` for the contract table itself.

Modules: ``contract`` (the table and the judge), ``harness`` (peers and bounded
runs), ``test_data`` (round trips, half-close, close with data buffered),
``test_errors`` (resets, aborts, writes after close, concurrent drains) and
``test_task_misuse`` (closing under a blocked task, concurrent use).
"""
