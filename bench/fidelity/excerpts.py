"""The excerpts of the asyncio docs that the loop probes quote
(``docs/sources/asyncio-MINOR/PAGE.rst``): checking every quote against them, and
writing them from a CPython checkout. Kept apart from ``bench.fidelity.promises`` so
that ``python -m bench.fidelity.excerpts`` runs it on its own.

    python -m bench.fidelity.excerpts check
    python -m bench.fidelity.excerpts write MINOR DOC_LIBRARY_DIR [repository=URL] [tag=TAG] ['copied from=WHERE']

``write`` keeps, for each quote of that release, the paragraph it is found in (verbatim,
with its line number) and the directive line it belongs to; nothing else of the page.
"""
from __future__ import annotations

import os
import sys

from bench.fidelity import promises
from bench.fidelity.promises import _DIRECTIVE, RELEASES, SOURCES, _root, normalize, paragraphs


def all_probes() -> dict:
    """Every registered probe (the worker imports every probe module)."""
    from bench.fidelity import worker  # noqa: F401
    from bench.fidelity.registry import PROBES
    return PROBES


def check() -> list[str]:
    """Every quote of every probe against its release's excerpt (``promises.check``)."""
    return promises.check(all_probes())


def probe_promises() -> dict:
    return promises.probe_promises(all_probes())



def write_excerpts(minor: str, library_dir: str, origin: dict) -> list[str]:
    """Rewrite ``docs/sources/asyncio-MINOR/*.rst`` from ``library_dir`` (a CPython
    ``Doc/library`` of release ``RELEASES[minor]``): each quoted paragraph verbatim,
    after the directive line it belongs to. ``origin``: ``repository``, ``tag``,
    ``commit``, ``copied from`` (where the text was read). Returns the files written."""
    wanted: dict = {}
    for name, pr in probe_promises().items():
        if minor in pr.texts:
            wanted.setdefault(pr.page, []).append((name, pr.texts[minor]))
    folder = os.path.join(SOURCES, f"asyncio-{minor}")
    os.makedirs(folder, exist_ok=True)
    written = []
    for page, quotes in sorted(wanted.items()):
        with open(os.path.join(library_dir, f"{page}.rst"), encoding="utf-8") as f:
            full = f.read()
        lines = full.splitlines()
        keep = set()
        for name, text in quotes:
            q = normalize(text)
            hits = [(start, ls) for start, ls in paragraphs(full) if q in normalize("\n".join(ls))]
            if not hits:
                raise ValueError(f"{name}: quote not found in {page}.rst of {minor}: {text!r}")
            start, ls = hits[0]
            keep.add((start, len(ls)))
            for j in range(start - 2, -1, -1):       # the directive it belongs to
                if _DIRECTIVE.match(lines[j]) and len(lines[j]) - len(lines[j].lstrip()) < \
                        len(ls[0]) - len(ls[0].lstrip()):
                    keep.add((j + 1, 1))
                    break
        out = [f".. looplab: paragraphs of CPython's Doc/library/{page}.rst that looplab's probes",
               "   quote (bench/fidelity), verbatim; '.. [...]' marks what is left out.",
               f".. release: {RELEASES[minor]}",
               f".. repository: {origin.get('repository', 'https://github.com/python/cpython')}",
               f".. tag: {origin.get('tag', 'v' + RELEASES[minor])}",
               f".. path: Doc/library/{page}.rst",
               f".. copied from: {origin.get('copied from', library_dir)}", ""]
        last = None
        for start, n in sorted(keep):
            if last is not None and start > last + 1:
                out += [".. [...]", ""]
            out += [f".. line {start}"] + lines[start - 1:start - 1 + n] + [""]
            last = start + n
        path = os.path.join(folder, f"{page}.rst")
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(out))
        written.append(path)
    return written


def main(argv: list[str]) -> int:
    if argv[:1] == ["check"]:
        problems = check()
        for p in problems:
            print(p)
        n = sum(len(p.texts) for p in probe_promises().values())
        print(f"{n} quotes in {len(probe_promises())} documented probes; {len(problems)} problems")
        return 1 if problems else 0
    if argv[:1] == ["write"] and len(argv) >= 3:
        minor, library = argv[1], argv[2]
        origin = dict(kv.split("=", 1) for kv in argv[3:] if "=" in kv)
        for path in write_excerpts(minor, library, origin):
            print(f"wrote {os.path.relpath(path, _root())}")
        return 0
    print("usage: python -m bench.fidelity.excerpts check | write MINOR DOC_LIBRARY_DIR "
          "[repository=URL] [tag=TAG] ['copied from=WHERE']", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
