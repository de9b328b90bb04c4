"""looplab's pytest plugin: run your own tests across runtimes, the way anyio's
``anyio_backend`` fixture runs them across backends.

Installed with looplab (``pytest11`` entry point ``looplab``), so it is active
in any pytest run in that environment. It adds:

``looplab_runtime`` fixture
    A parsed ``bench.runtimes.Runtime``. A test that asks for it runs once
    per selected runtime (the test id is the runtime spec). A runtime whose
    library is missing here is a *skip* whose reason says what to install.
``@pytest.mark.looplab_style("task", ...)``
    Restricts ``looplab_runtime`` to runtimes of those port styles (callback,
    stream, task). Without the marker a test runs on every style, so it must
    branch on ``looplab_runtime.style`` itself. A style none of the selected
    runtimes has becomes one skipped test saying so.
``--looplab-runtimes SPECS``
    A comma list of runtime specs (``coro,coro:spawn=eager,trio``; ``all`` and
    ``ours`` expand). Default: every registered runtime.
``--looplab-runtime-module MOD`` (repeatable)
    Imports a module that registers a runtime, before anything is selected:
    how a kernel that is not installed as a package joins the run.
``looplab_port`` fixture
    A fresh port of ``looplab_runtime``, closed after the test.
``@pytest.mark.looplab(strategy="pct:d=3", budget=500, ...)``
    On an ``async def`` test: run it under schedule exploration, as ``looplab
    explore`` runs a program (``bench.explore.pytest_marker`` lists the
    options). It passes when every schedule explored passes; its first failing
    schedule fails it once, with a one-line message, the shrunk schedule, the
    pending tasks and the replay command. The schedule file goes to
    ``--looplab-replay-dir`` (default ``.looplab/replays`` under the rootdir).
    A parameter named ``looplab_ctx`` receives the run's context.
Helpers ``open_port(runtime_or_spec, **overrides)``, ``run_program(runtime,
main, *args)`` and ``read_probe(port)`` do the same from plain code.

Example::

    import pytest

    @pytest.mark.looplab_style("task")
    def test_sleep_returns(looplab_runtime):
        async def main(port):
            await port.sleep(0)
            return "done"
        outcome = run_program(looplab_runtime, main)
        assert outcome.result == "done" and outcome.probe["source"]

(with ``from bench.verbs.pytest_plugin import run_program``). The port
conformance suite (``protocols.conformance``) is built on these fixtures.
Bad option values are pytest usage errors: one line, exit code 4.
"""
from __future__ import annotations

import os
from typing import NamedTuple

import pytest


__all__ = ["looplab_runtime", "looplab_port", "looplab_ctx", "open_port", "run_program",
           "read_probe", "Outcome", "selected_specs"]



def pytest_addoption(parser):
    group = parser.getgroup("looplab", "looplab runtimes")
    group.addoption("--looplab-runtimes", default=None, metavar="SPECS",
                    help="comma list of runtime specs for the looplab_runtime fixture "
                         "(default: every registered runtime)")
    group.addoption("--looplab-runtime-module", action="append", default=[], metavar="MOD",
                    help="import MOD, which registers a looplab runtime (repeatable)")
    group.addoption("--looplab-replay-dir", default=None, metavar="DIR",
                    help="where @pytest.mark.looplab tests write a failing schedule "
                         "(default: .looplab/replays under the rootdir)")


def pytest_configure(config):
    # pytest-benchmark (a looplab dependency) makes ./.benchmarks at every start, even
    # when nothing is benchmarked; remember whether it was there, so that a run which
    # left it empty (the conformance command in a user's folder) takes it away again.
    import os
    config._looplab_benchmarks_dir = None if os.path.exists(".benchmarks") else os.path.abspath(".benchmarks")
    config.addinivalue_line(
        "markers", "looplab_style(*styles): run looplab_runtime only over runtimes of these "
                   "port styles (callback, stream, task)")
    config.addinivalue_line(
        "markers", "looplab(strategy='random', budget=1000, runtimes=None, seed=0, "
                   "buggify=None, T=5.0, properties=(), net=None): explore this async def "
                   "test's schedules on the simulated network (looplab explore)")
    modules = config.getoption("looplab_runtime_module", default=[])
    text = config.getoption("looplab_runtimes", default=None)
    if not modules and not text:
        return      # nothing to check: don't import looplab into every pytest run
    from bench import runtimes
    try:
        runtimes.load_plugins(modules)
        runtimes.parse_list(text)
    except runtimes.UsageError as exc:
        raise pytest.UsageError(f"looplab: {exc}") from None


def pytest_unconfigure(config):
    import os
    path = getattr(config, "_looplab_benchmarks_dir", None)
    if path and os.path.isdir(path) and not os.listdir(path):
        os.rmdir(path)


def selected_specs(config, styles=None) -> list[str]:
    """The specs ``looplab_runtime`` runs over: ``--looplab-runtimes`` (or every
    registered runtime), keeping those of ``styles`` when given."""
    from bench import runtimes
    chosen = runtimes.parse_list(config.getoption("looplab_runtimes", default=None))
    return [rt.spec for rt in chosen if styles is None or rt.style in styles]


def _styles_of(definition) -> tuple | None:
    marker = definition.get_closest_marker("looplab_style")
    if marker is None:
        return None
    from protocols.apps import STYLES
    bad = [s for s in marker.args if s not in STYLES]
    if bad or not marker.args:
        raise pytest.UsageError(f"looplab_style on {definition.nodeid}: styles must be among "
                                f"{', '.join(STYLES)}, got {marker.args!r}")
    return marker.args


def pytest_generate_tests(metafunc):
    if "looplab_runtime" not in metafunc.fixturenames:
        return
    styles = _styles_of(metafunc.definition)
    specs = selected_specs(metafunc.config, styles)
    if specs:
        metafunc.parametrize("looplab_runtime", specs, indirect=True, ids=specs)
    else:
        reason = (f"no selected runtime has the {'/'.join(styles)} style" if styles
                  else "no runtime selected")
        metafunc.parametrize("looplab_runtime", [pytest.param(None, marks=pytest.mark.skip(
            reason=reason))], indirect=True, ids=["none"])


def runtime_or_skip(spec: str):
    """``parse(spec)``, skipping the test (with the reason) if it is unavailable here."""
    from bench import runtimes
    rt = runtimes.parse(spec)
    elsewhere = _other_interpreter(rt)
    if elsewhere:
        pytest.skip(f"{rt.spec}: {elsewhere}")
    reason = rt.unavailable_reason()
    if reason:
        pytest.skip(f"{rt.id}: {reason}")
    return rt


def _other_interpreter(rt) -> str | None:
    """Why a runtime bound to another interpreter (``@3.12``) cannot open here: the
    fixtures open ports in the test's own process. None when ``@`` names this one."""
    import os
    import platform
    import sys
    if rt.interpreter is None:
        return None
    if os.sep in rt.interpreter:
        same = os.path.abspath(rt.interpreter) == os.path.abspath(sys.executable)
    else:
        same = (platform.python_version() + ".").startswith(rt.interpreter + ".")
    if same:
        return None
    return (f"runs in Python {rt.interpreter}, and these fixtures open ports in this process "
            f"(Python {platform.python_version()}); run pytest with that interpreter "
            "(looplab env list shows its environment)")


@pytest.fixture
def looplab_ctx():
    """In a ``@pytest.mark.looplab`` test: the run's context (each schedule passes
    its own: ``ctx.io``, ``ctx.world``, ``ctx.now``, ``ctx.observe``,
    ``ctx.connection``). Outside one: None."""
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    marker = pyfuncitem.get_closest_marker("looplab")
    if marker is None:
        return None            # not ours: nothing of the explorer is imported
    from bench.errors import UsageError
    from bench.explore import pytest_marker
    config = pyfuncitem.config
    out = config.getoption("looplab_replay_dir", default=None) or \
        os.path.join(str(config.rootpath), ".looplab", "replays")
    try:
        lines = pytest_marker.run_item(pyfuncitem, marker, out)
    except UsageError as exc:
        mistake = str(exc)
    except pytest_marker.LooplabFailure as exc:
        pyfuncitem._looplab_failure = exc
        raise
    else:
        mistake = None
    if mistake is not None:     # outside the except: one line, no chained traceback
        pytest.fail(mistake if mistake.startswith("looplab") else f"looplab: {mistake}",
                    pytrace=False)
    for line in lines:
        pyfuncitem.user_properties.append(("looplab", line))
    return True


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    failure = getattr(item, "_looplab_failure", None)
    if failure is None or call.when != "call":
        return
    report = outcome.get_result()
    if report.failed:
        # one failure per test: the report's text, and a one-line message for junit
        report.longrepr = _Failure(failure.summary, failure.text)


class _Failure:
    """A failing schedule's report: ``reprcrash.message`` is its one line (junit's
    ``message``); the terminal shows the whole text."""

    class _Crash:
        def __init__(self, message):
            self.message = message
            self.path, self.lineno = "", 0

    def __init__(self, summary: str, text: str):
        self.reprcrash = self._Crash(summary)
        self.text = text

    def toterminal(self, tw) -> None:
        for line in self.text.splitlines():
            tw.line(line)

    def __str__(self) -> str:
        return self.text


@pytest.fixture
def looplab_runtime(request):
    """A parsed ``bench.runtimes.Runtime``; see the module docstring."""
    return runtime_or_skip(request.param)


@pytest.fixture
def looplab_port(looplab_runtime):
    """A fresh port of ``looplab_runtime``, closed after the test."""
    port = looplab_runtime.open()
    try:
        yield port
    finally:
        port.close()


# ---------------------------------------------------------------------------
# Helpers for plain code

class Outcome(NamedTuple):
    result: object     # what main returned
    probe: dict        # the port's counters after the run (None: can't be seen)


def open_port(runtime, **overrides):
    """A fresh port of ``runtime`` (a ``Runtime`` or a spec); close it (or use ``with``)."""
    if isinstance(runtime, str):
        from bench import runtimes
        runtime = runtimes.parse(runtime)
    return runtime.open(**overrides)


def run_program(runtime, main, *args, **overrides) -> Outcome:
    """Run ``main(port, *args)`` on a fresh port of ``runtime`` (stream/task:
    an async function; callback: a setup function that ends with ``port.stop()``),
    close the port, and return what main returned with the port's probe."""
    with open_port(runtime, **overrides) as port:
        result = port.run(main, *args)
        return Outcome(result, read_probe(port))


def read_probe(port) -> dict:
    """The port's counters, in the results vocabulary (``*_bytes``, ``*_count``,
    ``None`` for what the runtime cannot show) plus ``source``."""
    return port.probe()


def pytest_terminal_summary(terminalreporter):
    """List the contract differences runtimes declared, so an xfail is never silent."""
    xfailed = terminalreporter.stats.get("xfailed", [])
    if not xfailed:
        return
    from protocols.conformance.contract import DIFFERENCE_PREFIX
    seen = []
    for report in xfailed:
        reason = getattr(report, "wasxfail", "").removeprefix("reason: ")
        if reason.startswith(DIFFERENCE_PREFIX):
            seen.append(f"{report.nodeid}: {reason}")
    if seen:
        terminalreporter.section("looplab: declared contract differences")
        for line in seen:
            terminalreporter.line(line)
