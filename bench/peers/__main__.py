"""``python -m bench.peers SPEC_JSON``: the peer process (``bench/peers/child.py``)."""
import sys

from bench.peers.child import main

sys.exit(main())
