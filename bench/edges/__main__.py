"""``python -m bench.edges RUNTIME[:OPTIONS] [NAME,...]``: run one runtime's probes."""
from __future__ import annotations

import sys

from bench.edges.worker import STYLE_OF, parse_runtime, run_probes


def main(argv) -> int:
    try:
        if len(argv) < 1:
            raise ValueError("a runtime is needed")
        rid, opts = parse_runtime(argv[0])
    except ValueError as exc:
        print(f"usage: python -m bench.edges RUNTIME[:OPTIONS] [NAME,...]; RUNTIME is one "
              f"of {', '.join(STYLE_OF)} ({exc})", file=sys.stderr)
        return 2
    wanted = set(argv[1].split(",")) if len(argv) > 1 and argv[1] else None
    run_probes(rid, wanted, options=opts)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
