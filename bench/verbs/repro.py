"""``looplab repro``: reproduce a famous backpressure or shutdown bug by its name.

``looplab repro uvloop-631`` runs the zoo entry of that name (``bench.zoo``) -- its
naive and fixed programs -- on every available runtime of its port styles plus the
design-option flips that turn the mechanism on or off on our kernels, and says where
the bug showed. ``--list`` lists the entries; ``--all --out DIR`` runs all of them
into a report folder (results.json, report.md, report.html, as ``run`` writes) with
the zoo table: one row per bug, one column per runtime.

``--net sim`` runs the same cells on the simulated network (``bench.run.seeds``, as
``looplab run --net sim`` does), ``--net both`` runs each cell on both networks side
by side, ``--seeds N`` explores N universes per cell and ``--replay FILE`` reruns a
universe an exploration wrote. An entry whose oracle reads the real machine (CPU
time, resident memory) is a skipped cell on the simulated network, with the reason.
"""
from __future__ import annotations

import os
import sys

from bench import report
from bench import results as resmod
from bench import run as matrix
from bench.scenarios import api as scmod
from bench.run import seeds as simruns
from bench.errors import ExitCode, UsageError
from bench.run import describe as docmod
from bench.run.runner import interrupted_line, nothing_measured
from bench.results.tables import fmt, format_table, plural
from bench.verbs.common import add_net_options, positive_int
from bench.zoo import versions as zoo_versions
from bench import runtimes as rtmod

ZOO_MODULE = "bench.zoo"
PRESETS = ("tiny", "quick")
BOTH_NOTE = ("Each cell reads *real / sim*: the naive program's verdict on real sockets, then on "
             "the simulated network (`--net both`); *skipped* where it cannot run there.")


def _ours() -> list[str]:
    return [rid for rid in rtmod.ordered() if rtmod.get(rid).ours]


def columns(summaries=()) -> list[str]:
    """The zoo table's columns: every listed runtime, each subject beside its
    references (``bench.runtimes.ordered``), then any other runtime a summary ran."""
    cols = rtmod.ordered()
    return cols + list(dict.fromkeys(r for s in summaries for r in s["rows"]
                                     if ":" not in r and r not in cols))


def _bug_shown(result: dict) -> bool:
    return bool(result.get("errors")) or bool(result["verdicts"].get("bug_shown"))


def _zoo():
    """Load the zoo as a scenario module, so every cell process loads it too."""
    scmod.load_plugins(modules=(ZOO_MODULE,))
    from bench import zoo
    return zoo


def _entry(zoo, name: str):
    e = zoo.entry(name)
    if e is None:
        raise UsageError(f"unknown bug {name!r}; `looplab repro --list` lists them "
                         f"({', '.join(zoo.ENTRIES)})")
    return e


def knob_specs(knobs) -> list[str]:
    """``OPT=VAL`` -> a runtime spec for each of our kernels that has option OPT,
    validated. A knob no kernel knows, or a bad value, is a UsageError."""
    specs = []
    for knob in knobs or ():
        name, sep, value = knob.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name or not value:
            raise UsageError(f"bad --knob {knob!r}: expected OPT=VAL, e.g. spawn=eager")
        owners = [k for k in _ours() if name in {o.name for o in rtmod.get(k).options}]
        if not owners:
            known = sorted({o.name for k in _ours() for o in rtmod.get(k).options})
            raise UsageError(f"unknown --knob {name!r}: our kernels' options are {', '.join(known)}")
        for k in owners:
            specs.append(rtmod.parse(f"{k}:{name}={value}").spec)    # UsageError on a bad value
    return specs


def _runtimes_for(e, text: str | None, knobs: list[str]) -> list:
    """The entry's runtimes: the named ones, or the runtimes its card names
    (``Entry.expect``) that are available here, plus its option flips and the knob
    runtimes (those of its styles)."""
    if text is not None:
        rts = rtmod.parse_list(text)      # '' is a UsageError there, not "every runtime"
    else:
        rts = [r for r in (rtmod.parse(rid) for rid in e.expect) if r.available()]
        rts += [rtmod.parse(f.spec) for f in e.flips]
    rts += [rtmod.parse(s) for s in knobs]
    seen, out = set(), []
    for r in rts:
        if r.style in e.styles and r.spec not in seen:
            seen.add(r.spec)
            out.append(r)
    return out


def unavailable_named(e) -> list[str]:
    """The runtimes the card names that cannot run here, each with its reason."""
    out = []
    for rid in e.expect:
        why = rtmod.parse(rid).unavailable_reason()
        if why:
            out.append(f"{rid} ({why})")
    return out


def plan(zoo, entries, runtimes_text, knobs, preset) -> list:
    cells = []
    for e in entries:
        rts = _runtimes_for(e, runtimes_text, knobs)
        if rts:
            cells += matrix.plan(e.id, list(rts), "naive,fixed", preset)
    return cells


# ---------------------------------------------------------------------------
# What the results say

def _net(cell) -> str:
    return (cell.get("params") or {}).get("net", "real")


def _by_runtime(e, cells) -> dict:
    """runtime spec -> net -> variant -> cell, in the order the cells came."""
    by: dict = {}
    for c in cells:
        if c["scenario"] == e.id:
            by.setdefault(c["runtime"], {}).setdefault(_net(c), {})[c["variant"]] = c
    return by


def summarize(zoo, e, cells: list[dict], knobs=()) -> dict:
    """Per runtime spec: naive and fixed outcome; the lists the verdict line reads.
    The words are the real network's when it ran, else the simulated one's; with
    both, each row also has ``sim`` and the summary says where the two differ.
    ``flips`` are the entry's declared option flips and the ``--knob`` runtimes
    (``knobs``); every other runtime that ran -- a named spec with options too --
    is in ``shown_on`` or ``not_shown_on``."""
    by = _by_runtime(e, cells)
    nets = sorted({n for v in by.values() for n in v}, key=("real", "sim").index)
    main = nets[0] if nets else "real"
    rows = {}
    for spec, per_net in by.items():
        words = {n: {"naive": zoo_versions.cell_word(v.get("naive")),
                     "fixed": zoo_versions.cell_word(v.get("fixed"))}
                 for n, v in per_net.items()}
        rows[spec] = dict(words.get(main, {"naive": "n/a", "fixed": "n/a"}))
        if len(nets) > 1:
            rows[spec]["sim"] = words.get("sim", {"naive": "n/a", "fixed": "n/a"})
    flips = {f.spec: f for f in e.flips}
    knobbed = set(flips) | set(knobs)
    defaults = [s for s in rows if s not in knobbed]
    out = {
        "id": e.id, "net": "both" if len(nets) > 1 else main, "rows": rows,
        "shown_on": [s for s in defaults if rows[s]["naive"] == "shown"],
        "not_shown_on": [s for s in defaults if rows[s]["naive"] == "not shown"],
        "unmeasured_on": [s for s in defaults if rows[s]["naive"] in ("not measured", "error")],
        "skipped_on": [s for s in rows if rows[s]["naive"] == "skipped"],
        "fix_failed_on": [s for s in rows if rows[s]["fixed"] == "shown"],
        "flips": [{"runtime": s, "naive": rows[s]["naive"], "expected_shown": flips[s].shows
                   if s in flips else None, "meaning": flips[s].meaning if s in flips else "--knob"}
                  for s in rows if s in knobbed],
        "needs": e.needs, "installed": zoo.affected_note(e),
    }
    if "sim" in nets and e.sim_skip():
        out["sim_skipped"] = e.sim_skip()
    if len(nets) > 1:
        ran = [s for s in rows if "skipped" not in (rows[s]["naive"], rows[s]["sim"]["naive"])]
        out["sim"] = {"compared": ran,
                      "differ_on": [s for s in ran if {k: rows[s][k] for k in ("naive", "fixed")}
                                    != rows[s]["sim"]],
                      "skipped_on": [s for s in rows if rows[s]["sim"]["naive"] == "skipped"]}
    out["off_card"] = off_card(e, out)
    return out


def off_card(e, s: dict) -> list[str]:
    """The cells that are not as the card expects (``Entry.expected_on``): the naive
    program's word where the card names the runtime, the fixed program never shown.
    A skipped cell is not judged (it did not run); "not measured" is not as expected."""
    out = []
    for spec, r in s["rows"].items():
        want = e.expected_on(spec)
        if want is None:
            continue
        for net, words in (("", r), (" (sim)", r.get("sim"))):
            if not words or "skipped" in (words["naive"], words["fixed"]):
                continue
            expected = "shown" if want else "not shown"
            # "n/a": that variant did not run (a --replay of one cell)
            if words["naive"] not in (expected, "n/a"):
                out.append(f"{spec}{net}: naive {words['naive']}, the card expects {expected}")
            if words["fixed"] not in ("not shown", "n/a"):
                out.append(f"{spec}{net}: fixed {words['fixed']}, the card expects not shown")
    return out


def verdict_line(s: dict) -> str:
    if s.get("net") == "sim" and s.get("sim_skipped"):
        return f"not run: {s['sim_skipped']}"
    # what was shown where: an empty list is left out (a run of option flips only
    # says just those)
    parts = [f"{label}: {', '.join(s[key])}" for label, key in
             (("shown on", "shown_on"), ("not shown on", "not_shown_on"),
              ("not measured (or an error) on", "unmeasured_on")) if s.get(key)]
    if not parts and not s["flips"] and not s.get("skipped_on"):
        parts = ["shown on: none"]
    if s["flips"]:
        parts.append("option flips: " + ", ".join(f"{f['runtime']} -> {f['naive']}" for f in s["flips"]))
    if s["fix_failed_on"]:
        parts.append(f"the fixed program still shows it on: {', '.join(s['fix_failed_on'])}")
    if s.get("skipped_on"):
        parts.append(f"skipped on: {', '.join(s['skipped_on'])}")
    if s.get("off_card"):
        parts.append("NOT as the card expects: " + "; ".join(s["off_card"]))
    sim = s.get("sim")
    if sim and s.get("sim_skipped"):
        parts.append(f"simulated network: not run ({s['sim_skipped']})")
    elif sim:
        same = len(sim["compared"]) - len(sim["differ_on"])
        text = f"simulated network: the same verdicts on {same} of {len(sim['compared'])} runtimes"
        if sim["differ_on"]:
            text += f", different on {', '.join(sim['differ_on'])}"
        if sim["skipped_on"]:
            text += f", skipped on {', '.join(sim['skipped_on'])}"
        parts.append(text)
    elif s.get("net") == "sim" and parts:
        parts[0] = "on the simulated network: " + parts[0]
    return "; ".join(parts)


def zoo_table(zoo, summaries: list[dict], markdown: bool = False) -> str:
    """One row per bug, one column per runtime: the naive program's verdict ("n/a":
    not that runtime's style); with ``--net both``, "real / sim"."""
    cols = columns(summaries)
    header = ["bug", "framework", "versions", "runs on"] + cols + ["design knobs (naive)", "needs"]
    rows = []

    def word(r, fixed_too=True):
        w = r["naive"]
        return w + (" (fix too)" if fixed_too and r["fixed"] == "shown" else "")
    for s in summaries:
        e = zoo.ENTRIES[s["id"]]
        row = [e.id, zoo_versions.framework_of(e) or "-", zoo_versions.versions_cell(e),
               zoo_versions.runs_on_cell(e, s.get("versions"))]
        for col in cols:
            r = s["rows"].get(col)
            if r is None:
                row.append("n/a")
            else:
                row.append(word(r) + (f" / {word(r['sim'])}" if "sim" in r else ""))
        row.append("; ".join(f"{f['runtime']}: {f['naive']}"
                             + (f" / {s['rows'][f['runtime']]['sim']['naive']}"
                                if "sim" in s["rows"][f["runtime"]] else "")
                             for f in s["flips"]) or "-")
        row.append("option needed" if e.needs else "-")
        rows.append(row)
    return format_table(header, rows, markdown=markdown, align="l" * len(header))


def card(zoo, e) -> str:
    lines = [f"{e.id}: {e.title}",
             f"  thread:    {e.link}",
             f"  also:      {', '.join(e.aliases)}" if e.aliases else None,
             f"  mechanism: {e.mechanism}",
             f"  reported:  {e.reported}",
             f"  fixed in:  {e.fixed_in}",
             f"  framing:   {e.framing}" if e.framing else None,
             f"  scenario:  close to looplab's {e.catalog} (looplab list scenarios)" if e.catalog else None,
             *[f"  installed: {n}" for n in zoo.affected_note(e)],
             f"  expected:  {e.expected}",
             f"  oracle:    {e.oracle}",
             *[f"  knob:      {f.spec} ({f.meaning}): expected {'shown' if f.shows else 'not shown'}"
               for f in e.flips],
             f"  needs:     {e.needs}" if e.needs else None,
             *[f"  {label + ':':<10} {text}" for label, text in e.card_fields() if text],
             _versions_line(e)]
    return "\n".join(line for line in lines if line)


def _versions_line(e) -> str | None:
    """What ``--versions`` would run the entry at (the points found here)."""
    if not zoo_versions.declares_versions(e):
        return None
    pts = zoo_versions.points(e)
    ran = list(dict.fromkeys(f"{p.label} ({p.role})" for p in pts if p.reason is None))
    off = list(dict.fromkeys(f"{p.requirement} ({p.role}): {p.reason}" for p in pts
                             if p.reason is not None))
    return (f"  --versions: {'; '.join(ran) or 'nothing installable here'}"
            + "".join(f"\n  not run:   {line}" for line in off))


def _measure(e, cell) -> str:
    if cell is None:
        return "-"
    if cell.get("errors") and not cell.get("metrics"):
        return "error: " + cell["errors"][0][:60]
    name = e.scenario.metrics[0].name
    return fmt(name, cell.get("metrics", {}).get(name))


def result_table(e, cells) -> str:
    """One row per runtime (and per network, when the cells name one)."""
    by = _by_runtime(e, cells)
    label = e.scenario.metrics[0].label
    with_net = any("net" in (c.get("params") or {}) for c in cells)
    rows = []
    for spec, per_net in by.items():
        for net in sorted(per_net, key=("real", "sim").index):
            v = per_net[net]
            naive, fixed = v.get("naive"), v.get("fixed")
            rows.append([spec] + ([net] if with_net else [])
                        + [zoo_versions.cell_word(naive), zoo_versions.cell_word(fixed),
                           f"{_measure(e, naive)} | {_measure(e, fixed)}"])
    header = ["runtime"] + (["net"] if with_net else []) + ["naive", "fixed", f"{label} (naive | fixed)"]
    return format_table(header, rows, align="l" * len(header))


def _skip_real_only(zoo, cells: list) -> tuple[list, dict]:
    """Split off the simulated cells of entries that only run on the real network:
    (cells to run, {cell id: its skipped result})."""
    run, skipped = [], {}
    for c in cells:
        why = zoo.ENTRIES[c.scenario].sim_skip() if c.params.get("net") == "sim" else None
        if why is None:
            run.append(c)
            continue
        skipped[c.id] = matrix.new_result(c, skipped=why)
    return run, skipped


def _write_folder(zoo, doc, summaries, out_dir, versions: bool = False) -> None:
    """The report folder, with the zoo table (or, with --versions, the version table)
    before the per-scenario sections."""
    paths = report.write_report(doc, out_dir)
    table_md = zoo_table(zoo, summaries, markdown=True)
    both = any(sm["net"] == "both" for sm in summaries)
    zoo_md = _versions_md(zoo, summaries) if versions else "# Bug zoo\n\n" + (
        BOTH_NOTE + "\n\n" if both else "") + table_md + "\n\n" + "\n".join(
        f"- **{s['id']}**: {verdict_line(s)}" for s in summaries) + "\n"
    resmod.write_text(os.path.join(out_dir, "zoo.md"), zoo_md)
    with open(paths["md"]) as f:
        md = f.read()
    head, sep, rest = md.partition("\n## ")
    resmod.write_text(paths["md"], head + "\n" + zoo_md.replace("# Bug zoo", "## Bug zoo", 1)
                      + sep + rest)


def _version_plan(args, entries) -> tuple[list, dict]:
    """``--versions``: the cells of every entry's version runs (``bench.zoo.versions``),
    and {entry id: its plan} for the entries that declare versions."""
    if args.runtimes or args.knob or args.net != "real" or args.seeds or args.replay:
        raise UsageError("--versions picks its own runtimes (one environment per version) and "
                         "runs on the real network: give no --runtimes, --knob, --net sim|both "
                         "or --seeds with it")
    plans = {e.id: zoo_versions.build(zoo_versions.plan(e))
             for e in entries if zoo_versions.declares_versions(e)}
    cells = []
    for eid, planned in plans.items():
        specs = list(dict.fromkeys(spec for _, spec in planned if spec))
        if specs:
            variants = ",".join(getattr(zoo_entry(eid), "version_variants", ("naive", "fixed")))
            cells += matrix.plan(eid, ",".join(specs), variants, args.preset)
    return cells, plans


def zoo_entry(eid):
    from bench import zoo
    return zoo.ENTRIES[eid]


def _versions_lines(zoo, vs) -> list[str]:
    """One verdict line per entry, with where it ran: the real versions or a stand-in."""
    return [f"{v['id']} ({zoo_versions.runs_on_cell(zoo.ENTRIES[v['id']], v)}): "
            f"{zoo_versions.verdict_line(v)}" for v in vs]


def _print_versions(zoo, summaries) -> None:
    """The version table, one verdict line per entry, and the count of entries shown
    at an affected version and at no other."""
    vs = [s["versions"] for s in summaries]
    print()
    print(format_table(zoo_versions.HEADER, zoo_versions.table_rows(vs),
                       align="l" * len(zoo_versions.HEADER)))
    print()
    for line in _versions_lines(zoo, vs):
        print(line)
    pairs = [v["id"] for v in vs if v["shown_pair"]]
    print(f"\nshown at an affected version and not at a fixed or unaffected one: "
          f"{len(pairs)} of {len(vs)} entries" + (f" ({', '.join(pairs)})" if pairs else ""))


def _versions_md(zoo, summaries) -> str:
    vs = [s["versions"] for s in summaries]
    return ("# Bug zoo at pinned versions\n\n"
            + format_table(zoo_versions.HEADER, zoo_versions.table_rows(vs), markdown=True,
                           align="l" * len(zoo_versions.HEADER))
            + "\n\n" + "\n".join(f"- {line}" for line in _versions_lines(zoo, vs)) + "\n")


# ---------------------------------------------------------------------------
# The verb

def cmd_repro(args) -> int:
    zoo = _zoo()
    if args.list:
        if args.bug or args.all:
            raise UsageError("--list takes no bug and no --all")
        rows = [[e.id, ", ".join(e.aliases) or "-", "/".join(e.styles), e.title]
                for e in zoo.ENTRIES.values()]
        print(format_table(["bug", "also", "styles", "title"], rows, align="llll"))
        print(f"\n{len(rows)} bugs. `looplab repro BUG` runs one; `looplab repro --all --out DIR` "
              "runs them all into a report folder.")
        return ExitCode.OK
    version_plans, knobs = {}, []
    if args.faults and not args.seeds:
        raise UsageError("--faults draws faults for each seed: give it with --seeds")
    if args.replay:
        if args.bug or args.all:
            raise UsageError("--replay reruns the universes in its file: give no bug and no --all")
        cells = simruns.cells_for(args, [])
        strangers = sorted({c.scenario for c in cells if c.scenario not in zoo.ENTRIES})
        if strangers:
            raise UsageError(f"--replay {args.replay}: {', '.join(strangers)} is not a zoo entry "
                             "(looplab run --replay reruns scenarios)")
        entries = [zoo.ENTRIES[sid] for sid in dict.fromkeys(c.scenario for c in cells)]
    else:
        if args.all == bool(args.bug):
            raise UsageError("give one bug (looplab repro --list) or --all")
        entries = list(zoo.ENTRIES.values()) if args.all else [_entry(zoo, args.bug)]
        knobs = knob_specs(args.knob)
        if args.versions:
            cells, version_plans = _version_plan(args, entries)
            if not version_plans:          # one entry, and its card names no version
                print(card(zoo, entries[0]))
                print(f"\n{entries[0].id} names no versions: its bug is in the program's own "
                      "code, not in a release of a library or of Python; `looplab repro "
                      f"{entries[0].id}` runs it on the runtimes its card names")
                return ExitCode.OK
            entries = [e for e in entries if e.id in version_plans]
            if not cells:
                return _nothing_to_run(zoo, entries, version_plans)
        else:
            if not args.runtimes:
                for e in entries:
                    missing = unavailable_named(e)
                    if missing:
                        print(f"looplab repro: {e.id}: not run here: {'; '.join(missing)}",
                              file=sys.stderr)
            cells = plan(zoo, entries, args.runtimes, knobs, args.preset)
            if not cells:
                raise UsageError(f"no runtime of {entries[0].id}'s styles "
                                 f"({', '.join(entries[0].styles)}) among --runtimes")
        cells = simruns.cells_for(args, cells)       # --net real|sim|both; checks --seeds
    out_dir = args.out or ("looplab-zoo" if args.all else None)
    if args.seeds and not out_dir:
        out_dir = matrix.default_out_dir()
        print(f"looplab repro: no --out given; writing the exploration to {out_dir}", file=sys.stderr)
    matrix.check_outputs(out_dir, args.json)
    if len(entries) == 1:
        print(card(zoo, entries[0]), flush=True)
    planned = cells
    cells, skipped = _skip_real_only(zoo, cells)
    for cid, r in skipped.items():
        print(f"{cid}: skipped: {r['skipped']}", file=sys.stderr)
    if args.seeds:
        # in the zoo the universe worth keeping is the one where the bug shows:
        # on a naive program it reproduces the report, on a fixed one it breaks the fix
        return simruns.explore_command(cells, args, out_dir, failing=_bug_shown)
    print(f"looplab repro: {plural(len(cells) + len(skipped), 'cell')} ({cells[0].preset if cells else args.preset} "
          f"preset)", file=sys.stderr)

    base, versions = docmod.builder(planned), zoo.installed_versions()

    def document(results, incomplete):
        doc = base(results, incomplete)
        bugs = [summarize(zoo, e, results, knobs) for e in entries]
        for sm, e in zip(bugs, entries):
            if e.id in version_plans:
                sm["versions"] = zoo_versions.summarize(e, version_plans[e.id], results)
        doc["zoo"] = {"versions": versions, "bugs": bugs}
        return doc

    runner = matrix.Runner(cells, document, out_dir=out_dir, jobs=args.jobs, extra_results=skipped)
    doc = runner.run()
    results, summaries = doc["cells"], doc["zoo"]["bugs"]
    if runner.interrupted and not out_dir:
        out_dir = matrix.default_out_dir()      # finished work is kept somewhere, and said where
    if out_dir:
        _write_folder(zoo, doc, summaries, out_dir, versions=bool(version_plans))
    if args.json:
        resmod.write_json(doc, args.json)
    if runner.interrupted:
        print(interrupted_line(len(results), len(cells) + len(skipped),
                               os.path.join(out_dir, "report.md")), file=sys.stderr)
        return ExitCode.INTERRUPTED
    if version_plans:
        _print_versions(zoo, summaries)
    elif args.replay:
        for e in entries:
            print()
            print(result_table(e, results))
        print()
        for r in results:
            print(f"replayed {r['id']}: bug {zoo_versions.cell_word(r)}"
                  + (f" ({r['skipped']})" if r.get("skipped") else ""))
    elif len(entries) > 1:
        print(zoo_table(zoo, summaries))
    else:
        print()
        if entries[0].kind() == "re-enactment":
            print(f"re-enactment: these cells run our program in place of the framework's code "
                  f"({entries[0].stand_in.split(':')[0]})"
                  + ("; `--versions` runs the real releases" if entries[0].version_run else ""))
        print(result_table(entries[0], results))
        print()
        print("verdict: " + verdict_line(summaries[0]))
    if out_dir:
        print(f"\nreport: {os.path.join(out_dir, 'report.md')} (zoo.md, results.json, report.html)")
    errors = [f"{r['id']}: {e}" for r in results for e in r.get("errors", [])]
    for line in errors:
        print(f"error: {line}", file=sys.stderr)
    off = _off_expectations(summaries, bool(version_plans))
    for line in off:
        print(f"not as the card expects: {line}", file=sys.stderr)
    empty = nothing_measured(results)
    if empty:
        print(empty, file=sys.stderr)
    return ExitCode.FAILED if errors or off or empty else ExitCode.OK


def _off_expectations(summaries, versions: bool) -> list[str]:
    """Every cell that is not as its card expects: at a version, the row's ``agrees``;
    otherwise the card's runtimes (``off_card``)."""
    out = []
    for s in summaries:
        if versions:
            out += [f"{s['id']} at {r['runtime']} ({r['role']}): naive {r['naive']}, fixed "
                    f"{r['fixed']}, expected naive {r['expected']}, fixed not shown"
                    for r in s["versions"]["rows"] if r["agrees"] is False]
        else:
            out += [f"{s['id']} on {line}" for line in s.get("off_card", ())]
    return out


def _nothing_to_run(zoo, entries, plans) -> int:
    """``--versions`` where no version the cards name can run here: the rows, each with
    why it is not run, and exit 1 (nothing was measured)."""
    vs = [zoo_versions.summarize(e, plans[e.id], []) for e in entries]
    if len(entries) == 1:
        print(card(zoo, entries[0]))
    _print_versions(zoo, [{"versions": v} for v in vs])
    print("looplab repro: nothing measured: no version the card names can run here "
          "(each row says why)", file=sys.stderr)
    return ExitCode.FAILED


def add_parser(sub) -> None:
    p = sub.add_parser(
        "repro", help="reproduce a famous backpressure or shutdown bug by name (uvloop-548, ...)",
        description="Run a bug zoo entry: its naive and fixed programs on the runtimes its "
                    "card names and on the option flips of our kernels that turn the "
                    "mechanism on or off, judged from measurements. --list lists the bugs; --all "
                    "runs them all into a report folder with the zoo table; --versions runs "
                    "them at the releases the card names. --net sim|both runs "
                    "the cells on the simulated network too, --seeds explores its universes. "
                    "Exit 0 when every cell is as its card expects, 1 a cell failed or is not "
                    "as the card expects, 2 usage, 130 interrupted.")
    p.add_argument("bug", nargs="?", help="an entry id or alias, e.g. uvloop-631, aiohttp-1367, C6")
    p.add_argument("--list", action="store_true", help="list the bugs")
    p.add_argument("--all", action="store_true", help="run every bug (into --out, default looplab-zoo)")
    p.add_argument("--runtimes", default=None,
                   help="comma list of runtime specs (default: the runtimes the bug's card "
                        "names that are available here, plus its option flips)")
    p.add_argument("--knob", action="append", default=[], metavar="OPT=VAL",
                   help="also run our kernels that have design option OPT with value VAL "
                        "(repeatable), e.g. --knob write=defer")
    p.add_argument("--versions", action="store_true",
                   help="run the naive and fixed programs at the versions the card names "
                        "(affected, fixed, unaffected): real interpreters and pinned library "
                        "releases, one environment each; the verdict per version")
    p.add_argument("--preset", choices=PRESETS, default="tiny", help="tiny (default) or quick")
    p.add_argument("--jobs", type=positive_int, default=1, help="cells run at once (default 1)")
    p.add_argument("--out", default=None, metavar="DIR", help="write a report folder here")
    p.add_argument("--json", default=None, metavar="PATH", help="write the results JSON here")
    add_net_options(p, skipped=", and so are the entries whose oracle reads CPU time or memory",
                    explored="count how often the bug showed; the first universe where it showed "
                             "(or a cell failed) is shrunk and written to --out for --replay")
    p.set_defaults(func=cmd_repro)
