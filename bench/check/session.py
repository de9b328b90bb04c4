"""One run of the questions: a server started, asked, and ended -- whatever happens.

A ``Job`` is everything one run needs (the app or command, the loop, the network, the
knobs, the endpoints, the plan); ``run_job`` starts the server on the right rig
(``bench.check.drive`` on real sockets, ``bench.check.sim`` on the simulated network),
asks the questions (``bench.check.questions.ask``, which closes every rig it started in a
``finally``),
so an interrupt or a crash leaves nothing running. The answers land in the dict the
caller passes, question by question, so what was measured before an interrupt is kept.
"""
from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass, field, replace

from bench.check import questions as qs
from bench.check import target as tg

__all__ = ["Job", "run_job", "make_rig"]


@dataclass(frozen=True)
class Job:
    app: tg.AppRef | None
    command: tg.Command | None
    kind: str
    loop: tg.LoopChoice | None
    net: str
    endpoints: tuple
    plan: qs.Plan
    questions: tuple
    knobs: dict = field(default_factory=dict)
    shutdown_endpoint: tg.Endpoint | None = None
    healthy_endpoint: tg.Endpoint | None = None
    port: int | None = None
    sockbuf: int | None = 65536
    seed: int = 0
    start_timeout_s: float = 10.0

    @property
    def where(self) -> str:
        """The cell's runtime column: the loop, or ``command``."""
        return "command" if self.command is not None else f"loop={self.loop.label}"

    @property
    def label(self) -> str:
        base = self.command.label() if self.command is not None else self.app.ref
        if self.knobs:
            base += " [" + ", ".join(f"{k}={v}" for k, v in sorted(self.knobs.items())) + "]"
        return base

    def with_knob(self, name: str, value) -> "Job":
        if name.startswith("loop."):
            return replace(self, loop=self.loop.with_option(name[5:], value))
        return replace(self, knobs={**self.knobs, name: value})


def make_rig(job: Job):
    """The started server on its rig; ``drive.StartFailed`` when it never served."""
    from bench.check import drive
    if job.net == "sim":
        from bench.check import sim
        return sim.SimRig(job.app, job.loop, job.knobs, job.plan.grace_s, seed=job.seed,
                          sockbuf=job.sockbuf)
    if job.command is not None:
        port = job.port or drive.free_port()
        server = drive.CommandServer(job.command, port, job.start_timeout_s)
    else:
        server = drive.AppChild(job.app, job.loop, job.knobs, job.plan.grace_s,
                                port=job.port or 0, sockbuf=job.sockbuf,
                                start_timeout_s=max(job.start_timeout_s, 20.0))
    return drive.RealRig(server)


def run_job(job: Job, answers: dict, log=None, questions=None) -> dict:
    """Ask ``questions`` (default: the job's) of a fresh server; fills ``answers``."""
    quiet = io.StringIO()
    # On the simulated network the app shares this process: what it logs (a framework's
    # "Error handling request" when a client vanishes) is kept out of the table.
    hush = contextlib.redirect_stderr(quiet) if job.net == "sim" else contextlib.nullcontext()
    with hush:
        qs.ask(lambda: make_rig(job), list(job.endpoints), job.plan, questions or job.questions,
               shutdown_endpoint=job.shutdown_endpoint, log=log, into=answers,
               healthy=job.healthy_endpoint)
    return answers
