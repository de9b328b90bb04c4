"""``python -m bench`` is the ``looplab`` command."""
import sys

from bench.cli import main

sys.exit(main())
