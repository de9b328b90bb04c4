"""Quoted promises: the sentence of the asyncio documentation that a *documented* loop
probe relies on, quoted from the docs of each interpreter the probe runs on.

A probe is documented only when a sentence of the asyncio docs promises what it checks;
``loop_probe(promise=doc(PAGE, ANCHOR, TEXT))`` carries that sentence. A probe without
one is de-facto: CPython does it, nothing promises it. The docs change between
releases, so a promise holds one text for every documented release (``TEXT``) or one per
release (``{"3.11": ..., "3.13": ...}``), and ``since`` names the first release that
documents the API (``Server.close_clients``: 3.13).

The texts are checked, not trusted: ``docs/sources/asyncio-MINOR/PAGE.rst`` keeps the
paragraphs quoted, copied verbatim from CPython's ``Doc/library/PAGE.rst`` of that
release, each file naming its origin. ``check()`` (and ``tests/test_promises.py``)
finds every quote in its release's excerpt, compared as the reader sees it: markup
removed (``:meth:`close``` reads ``close()``), whitespace collapsed.

``python -m bench.fidelity.excerpts check`` lists the quotes that are not found, and
``... excerpts write MINOR DOC_LIBRARY_DIR ORIGIN...`` rewrites one release's excerpts
from a CPython checkout's ``Doc/library`` (``bench.fidelity.excerpts``).
"""
from __future__ import annotations

import os
import re

#: the releases whose docs are quoted: one per interpreter minor the observatory runs
#: (the interpreters installed here; docs/observatory.md)
RELEASES = {"3.11": "3.11.7", "3.12": "3.12.1", "3.13": "3.13.0"}
#: the pages of Doc/library quoted (asyncio-eventloop.rst, ...)
PAGES = tuple(f"asyncio-{p}" for p in ("eventloop", "protocol", "stream", "task", "subprocess",
                                       "dev", "future", "runner", "policy", "sync",
                                       "exceptions", "platforms"))


def _root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


SOURCES = os.path.join(_root(), "docs", "sources")


def _minor(version: str | None) -> str | None:
    parts = str(version or "").split(".")
    return ".".join(parts[:2]) if len(parts) >= 2 and all(p.isdigit() for p in parts[:2]) else None


def _vt(minor: str) -> tuple:
    return tuple(int(x) for x in minor.split("."))


class Promise:
    """What the asyncio docs promise for one probe: the page (``asyncio-eventloop``),
    the anchor of the entry (``asyncio.loop.time``), the quoted text per release, and
    the first release that documents it."""
    __slots__ = ("page", "anchor", "texts", "since")

    def __init__(self, page: str, anchor: str, text, since: str | None = None):
        self.page = page if page.startswith("asyncio") else f"asyncio-{page}"
        if self.page not in PAGES:
            raise ValueError(f"unknown asyncio docs page {page!r}")
        self.anchor, self.since = anchor, since
        minors = [m for m in RELEASES if since is None or _vt(m) >= _vt(since)]
        if isinstance(text, dict):
            missing = [m for m in minors if m not in text]
            if missing:
                raise ValueError(f"promise {anchor}: no text for {', '.join(missing)}")
            self.texts = {m: text[m] for m in minors}
        else:
            self.texts = {m: text for m in minors}

    def applies(self, python: str | None) -> bool:
        """Does the promise hold on this interpreter (its docs document the API)?"""
        m = _minor(python)
        return m is None or self.since is None or _vt(m) >= _vt(self.since)

    def release_for(self, python: str | None) -> str | None:
        """The minor release whose quote speaks for ``python``: its own, else the
        nearest earlier one quoted, else the first one quoted (None if it does not apply)."""
        if not self.applies(python):
            return None
        m = _minor(python)
        if m in self.texts:
            return m
        quoted = sorted(self.texts, key=_vt)
        if m is None:
            return quoted[-1]
        earlier = [q for q in quoted if _vt(q) <= _vt(m)]
        return earlier[-1] if earlier else quoted[0]

    def url(self, minor: str) -> str:
        return f"https://docs.python.org/{minor}/library/{self.page}.html#{self.anchor}"

    def quote(self, python: str | None = None) -> dict | None:
        """``{"text", "docs" (the release quoted), "page", "url"}`` for ``python``, or
        None where the API is not documented."""
        m = self.release_for(python)
        if m is None:
            return None
        return {"text": self.texts[m], "docs": RELEASES[m], "page": self.page,
                "url": self.url(m)}


def doc(page: str, anchor: str, text, since: str | None = None) -> Promise:
    """A promise quoted from ``Doc/library/asyncio-PAGE.rst`` (``page`` may omit the
    ``asyncio-`` prefix)."""
    return Promise(page, anchor, text, since)


# ---------------------------------------------------------------------------
# Reading the docs as a reader sees them

def _role(m) -> str:
    kind, body = m.group(2), m.group(3).strip()
    if not body.startswith("<"):
        body = re.sub(r"\s*<[^>]*>$", "", body)
    if body.startswith(("~", "!")):
        body = body[1:]
        if m.group(3).strip().startswith("~"):
            body = body.rsplit(".", 1)[-1]
    if kind in ("meth", "func") and not body.endswith(")"):
        body += "()"
    return body


def normalize(text: str) -> str:
    """reStructuredText as rendered: roles to their text (``:meth:`x``` -> ``x()``, a
    ``~`` keeps the last name), literals, links and emphasis unmarked, whitespace
    collapsed."""
    t = text.replace("\\*", "\x00")          # an escaped asterisk is no emphasis
    t = re.sub(r":(\w+:)?(\w+):`([^`]+)`", _role, t)
    t = re.sub(r"``([^`]+)``", r"\1", t)
    t = re.sub(r"`([^`<]+?)\s*<[^>]+>`__?", r"\1", t)
    t = re.sub(r"`([^`]+)`__?", r"\1", t)
    t = re.sub(r"\*\*([^*]+)\*\*", r"\1", t)
    t = re.sub(r"(?<![\w*])\*([^*\s][^*]*)\*(?![\w*])", r"\1", t)
    t = t.replace("\\ ", "").replace("\\", "").replace("\x00", "*")
    return " ".join(t.split())


def paragraphs(text: str) -> list[tuple[int, list[str]]]:
    """(first line number, lines) of each block of non-blank lines."""
    out, cur, start = [], [], 0
    for i, ln in enumerate(text.splitlines() + [""], 1):
        if ln.strip():
            if not cur:
                start = i
            cur.append(ln)
        elif cur:
            out.append((start, cur))
            cur = []
    return out


_DIRECTIVE = re.compile(r"^\s*\.\. (\w+:)?(method|function|class|coroutinemethod|attribute|"
                        r"coroutinefunction|exception|data|decorator)::")


def excerpt_path(minor: str, page: str) -> str:
    return os.path.join(SOURCES, f"asyncio-{minor}", f"{page}.rst")


def read_excerpt(minor: str, page: str) -> tuple[dict, str] | None:
    """(its origin header as a dict, its text), or None when there is no excerpt."""
    path = excerpt_path(minor, page)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        text = f.read()
    header = {}
    for ln in text.splitlines():
        m = re.match(r"^\.\. (release|repository|tag|path|copied from|commit): (.*)$", ln)
        if m:
            header[m.group(1)] = m.group(2).strip()
    return header, text


def found_in(quote: str, rst_text: str) -> bool:
    """Is ``quote`` in one paragraph of ``rst_text``, as a reader sees both?"""
    q = normalize(quote)
    return any(q in normalize("\n".join(lines)) for _, lines in paragraphs(rst_text))


def probe_promises(probes: dict) -> dict:
    """probe name -> Promise, for every documented probe of ``probes`` (name -> EdgeProbe)."""
    return {n: p.documented for n, p in probes.items() if isinstance(p.documented, Promise)}


def check(probes: dict) -> list[str]:
    """Every quote of ``probes`` against its release's excerpt: one line per quote not
    found (or excerpt missing, or whose header does not name its release)."""
    problems = []
    for name, pr in probe_promises(probes).items():
        for minor, text in pr.texts.items():
            got = read_excerpt(minor, pr.page)
            if got is None:
                problems.append(f"{name}: no excerpt {os.path.relpath(excerpt_path(minor, pr.page), _root())}")
                continue
            header, body = got
            if header.get("release") != RELEASES[minor]:
                problems.append(f"{name}: the {minor} excerpt of {pr.page} says release "
                                f"{header.get('release')!r}, not {RELEASES[minor]}")
            if not found_in(text, body):
                problems.append(f"{name}: not in the {RELEASES[minor]} docs ({pr.page}): {text!r}")
    return problems
