"""The ``looplab`` verbs, one module each group: ``run`` (run, list, trace, report),
``results`` (compare, merge, validate) and ``serve``.

A verb module exposes ``add_parser(subparsers) -> None``, which adds its sub-parsers;
each sets ``func(args) -> ExitCode``. User mistakes raise ``UsageError``. The CLI
(``bench.cli``) imports the verb modules; nothing imports the CLI.
"""
