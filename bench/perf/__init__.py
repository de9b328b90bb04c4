"""The benchmarks (``looplab bench``) and the tools that explain them: echo matrices
and goals (``echo``, ``goals``, ``loadgen`` with the C client ``echo_client.c``),
micro-benchmarks (``micro``, ``nokernel``: spawn+join with no kernel at all), the
machine's accounting (``machine``), and the counters a developer runs by hand
(``python -m bench.perf.icount`` instructions, ``opcodes``, ``syscalls``,
``simshare``).
"""
