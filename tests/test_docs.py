"""The documentation under docs/ is tested: every code block of the tutorial and of the
API page runs, and every page's relative links resolve.

A page's blocks run in order in an empty folder, in one child process (so the
runtimes and scenarios the tutorial registers never leak into this one):
``python`` blocks in one namespace (``# file: NAME`` also writes the block to NAME,
``# file: NAME (continued)`` appends), ``sh`` blocks as commands with a time limit
each, where ``looplab`` is this venv's ``python -m bench`` and ``python`` this venv's
interpreter. A ``text`` block right after a ``python`` block is that block's expected
output (a line with ``...`` matches any line starting with what precedes it). A block
preceded by ``<!-- not run: REASON -->`` is skipped, and counted: they must stay rare.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
TUTORIAL = os.path.join(DOCS, "tutorial.md")
LANGS = ("python", "sh", "text")
NOT_RUN = re.compile(r"<!--\s*not run:\s*(\S.*?)\s*-->\s*$")
# Pages other people are writing; a link to one is fine before it lands.
PAGES_OF_OTHERS: set = set()
SH_TIMEOUT_S = 150
PY_TIMEOUT_S = 60


def blocks(path: str) -> list[dict]:
    """Fenced blocks: [{"lang", "code", "line", "skip"}], in page order."""
    lines = open(path, encoding="utf-8").read().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = re.match(r"^```(\S*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        start, lang = i, m.group(1)
        i += 1
        body = []
        while i < len(lines) and lines[i].rstrip() != "```":
            body.append(lines[i])
            i += 1
        if i >= len(lines):
            raise AssertionError(f"{path}:{start + 1}: unclosed code block")
        j = start - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        skip = NOT_RUN.search(lines[j]) if j >= 0 else None
        out.append({"lang": lang, "code": "\n".join(body) + "\n", "line": start + 1,
                    "skip": skip.group(1) if skip else None})
        i += 1
    return out


def test_the_tutorial_blocks_are_known_and_rarely_skipped():
    found = blocks(TUTORIAL)
    assert [b for b in found if b["lang"] not in LANGS] == []
    runnable = [b for b in found if b["lang"] != "text"]
    assert len(runnable) >= 15
    assert sum(1 for b in runnable if b["skip"]) <= 2
    for b in runnable:
        if b["lang"] == "sh" and not b["skip"]:
            words = b["code"].split()
            assert words[0] in ("looplab", "python"), (b["line"], words[0])
            if words[:2] == ["looplab", "run"]:
                assert "--preset tiny" in b["code"], f"tutorial.md:{b['line']}: runs at the tiny preset"


# The child process: runs the blocks in order and reports one JSON line per block.
DRIVER = textwrap.dedent(r'''
    import contextlib, io, json, os, shlex, signal, subprocess, sys, traceback
    blocks = json.load(open(sys.argv[1]))
    namespace = {"__name__": "__tutorial__"}
    env = dict(os.environ)

    def on_alarm(signum, frame):
        raise TimeoutError("the block ran out of time")

    signal.signal(signal.SIGALRM, on_alarm)
    for b in blocks:
        rep = {"line": b["line"], "lang": b["lang"], "ok": True, "out": ""}
        if b["lang"] == "python":
            first = b["code"].splitlines()[0]
            if first.startswith("# file: "):
                name = first[len("# file: "):].strip()
                mode = "w"
                if name.endswith("(continued)"):
                    name, mode = name[:-len("(continued)")].strip(), "a"
                with open(name, mode) as f:
                    f.write(b["code"] if mode == "w" else b["code"].split("\n", 1)[1])
            buf = io.StringIO()
            signal.alarm(int(b["timeout"]))
            try:
                with contextlib.redirect_stdout(buf):
                    exec(compile(b["code"], f"{b['page']}:{b['line']}", "exec"), namespace)
            except BaseException:
                rep.update(ok=False, error=traceback.format_exc(limit=6))
            finally:
                signal.alarm(0)
            rep["out"] = buf.getvalue()
        else:
            argv = shlex.split(b["code"].replace("\\\n", " "))
            head = {"looplab": [sys.executable, "-m", "bench"], "python": [sys.executable]}[argv[0]]
            try:
                r = subprocess.run(head + argv[1:], capture_output=True, text=True,
                                   timeout=b["timeout"], env=env)
                rep.update(ok=r.returncode == 0, code=r.returncode, out=r.stdout[-3000:],
                           error=r.stderr[-3000:])
            except subprocess.TimeoutExpired:
                rep.update(ok=False, error=f"timed out after {b['timeout']} s")
        print(json.dumps(rep), flush=True)
        if not rep["ok"]:
            break
''')


def _matches(expected: str, actual: str) -> bool:
    want, got = expected.strip("\n").splitlines(), actual.strip("\n").splitlines()
    if len(want) != len(got):
        return False
    for w, g in zip(want, got):
        if "..." in w:
            if not g.startswith(w.split("...", 1)[0].rstrip().rstrip(",")):
                return False
        elif w.rstrip() != g.rstrip():
            return False
    return True


@pytest.mark.timeout(900)
@pytest.mark.parametrize("page", ["tutorial.md", "api.md"])
def test_every_block_runs(tmp_path, page):
    found = blocks(os.path.join(DOCS, page))
    plan, expected = [], {}
    for k, b in enumerate(found):
        if b["lang"] == "text":
            if k and found[k - 1]["lang"] == "python":
                expected[found[k - 1]["line"]] = b["code"]
            continue
        if b["skip"]:
            continue
        plan.append({**b, "page": page,
                     "timeout": SH_TIMEOUT_S if b["lang"] == "sh" else PY_TIMEOUT_S})
    (tmp_path / "blocks.json").write_text(json.dumps(plan))
    (tmp_path / "driver.py").write_text(DRIVER)
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("LOOPLAB_RUNTIME_MODULES", None)
    r = subprocess.run([sys.executable, str(tmp_path / "driver.py"), str(tmp_path / "blocks.json")],
                       cwd=work, env=env, capture_output=True, text=True,
                       timeout=sum(b["timeout"] for b in plan) + 30)
    reports = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    for rep in reports:
        assert rep["ok"], (f"{page}:{rep['line']} ({rep['lang']}) failed:\n"
                           f"{rep.get('error')}\n{rep.get('out')}")
        if rep["line"] in expected:
            assert _matches(expected[rep["line"]], rep["out"]), (
                f"{page}:{rep['line']}: printed\n{rep['out']}\nthe page shows\n"
                f"{expected[rep['line']]}")
    assert len(reports) == len(plan), r.stderr[-3000:]
    if page == "tutorial.md":
        assert (work / "burst-report" / "results.json").exists()


def _slug(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _prose(path: str) -> str:
    """The page without its fenced blocks (fences open and close at a line's start)."""
    keep, fenced = [], False
    for line in open(path, encoding="utf-8").read().splitlines():
        if re.match(r"^```", line):
            fenced = not fenced
        elif not fenced:
            keep.append(line)
    return "\n".join(keep)


def _anchors(path: str) -> set[str]:
    text = _prose(path)
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.*)$", text, re.M)}


PAGES = sorted(f for f in os.listdir(DOCS) if f.endswith(".md"))


@pytest.mark.parametrize("page", PAGES)
def test_links_resolve(page):
    path = os.path.join(DOCS, page)
    text = _prose(path)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        where = os.path.normpath(os.path.join(DOCS, file)) if file else path
        if os.path.basename(where) in PAGES_OF_OTHERS and not os.path.exists(where):
            continue
        assert os.path.exists(where), f"{page}: broken link {target}"
        if anchor and where.endswith(".md"):
            assert anchor in _anchors(where), f"{page}: no heading for #{anchor} in {file or page}"


@pytest.mark.parametrize("page", ["README.md", "concepts.md", "ports.md", "scenarios.md",
                                  "benchmarking.md", "api.md", "tutorial.md"])
def test_the_pages_exist_and_stand_alone(page):
    text = open(os.path.join(DOCS, page), encoding="utf-8").read()
    assert text.startswith("# ")
    # Users have only the repository: nothing may point at the team's private notes.
    for private in ("../shared", "DESIGN.md", "SCENARIOS.md", "BENCHMARKING.md", "STYLE.md"):
        assert private not in text, f"{page} mentions {private}"


def test_the_index_links_every_page():
    index = open(os.path.join(DOCS, "README.md"), encoding="utf-8").read()
    for page in PAGES:
        if page != "README.md":
            assert f"({page})" in index, f"docs/README.md does not link {page}"


README = os.path.join(ROOT, "README.md")


def test_the_readme_is_short_and_leads_with_the_three_jobs():
    text = open(README, encoding="utf-8").read()
    words = len(_prose(README).split()) + sum(len(b["code"].split()) for b in blocks(README))
    assert words <= 1500, f"README.md has {words} words; the rest belongs in docs/"
    # The first screen (about 40 lines): what looplab is, then the three jobs with a command each.
    first_screen = "\n".join(text.splitlines()[:40])
    for verb in ("looplab run --scenarios", "looplab repro ", "callback:write=defer"):
        assert verb in first_screen, f"the first screen of README.md lacks {verb!r}"


def test_the_readme_links_resolve():
    for m in re.finditer(r"\]\(([^)#\s]+)(#[^)]*)?\)", _prose(README)):
        target = m.group(1)
        if "://" in target:
            continue
        assert os.path.exists(os.path.join(ROOT, target)), f"README.md: broken link {target}"


def test_ci_runs_the_readmes_test_command():
    """.ci/run must do the README's set-up and then run exactly its test command."""
    readme = open(README, encoding="utf-8").read()
    ci = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read()
    tests = [b["code"].strip() for b in blocks(README) if "pytest" in b["code"]]
    assert len(tests) == 1, "README.md should have exactly one test command"
    assert tests[0] in ci, ".ci/run does not run the README's test command"
    assert "set -e" in ci
