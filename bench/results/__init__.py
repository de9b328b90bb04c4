"""Results: the document every run writes (``document``: JSON, CSV, merge, shards,
checked against ``schema.json``), the tables and units that format it (``tables``),
and the gates that compare two documents (``compare``).

``from bench import results`` gives the document's public names, as in the first
release, when this was one module.
"""
from bench.results.document import *  # noqa: F401,F403 -- the package's face
from bench.results.document import __all__  # noqa: F401
