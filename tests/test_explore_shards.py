"""Explorations in parts (``looplab explore --shard I/N``) joined by ``--merge``:
two parts on two processes give one process's proof and count, and a part
missing or of another exploration is no proof (small targets: seconds)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bench import cli
from bench.explore import shards, verb
from bench.host.procs import ROOT

PROGRAM = ["explore", "cpython-23812", "--variant", "fixed", "--runtimes", "callback",
           "--strategy", "delays:2"]


def _parts(tmp_path, argv, count, env=None):
    """Run the ``count`` parts of ``argv`` as separate processes at once."""
    procs = []
    for i in range(1, count + 1):
        out = tmp_path / f"m{i}"
        procs.append((out, subprocess.Popen(
            [sys.executable, "-m", "bench", *argv, "--shard", f"{i}/{count}", "--out", str(out)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, **(env or {})})))
    dirs = []
    for out, p in procs:
        stdout, stderr = p.communicate(timeout=120)
        assert p.returncode == 0, stderr
        assert "exhausted" in stdout and "proved:" not in stdout   # a part proves nothing alone
        dirs.append(out)
    return dirs


def _proof(text: str) -> str:
    return next(line.strip() for line in text.splitlines() if "proved:" in line)


@pytest.mark.parametrize("argv", [PROGRAM, ["explore", "S3", "--variant", "fixed", "--preset",
                                            "tiny", "--runtimes", "callback", "--strategy",
                                            "delays:1"]])
def test_two_parts_on_two_processes_merge_to_one_processs_proof(tmp_path, capsys, argv):
    assert cli.main(argv) == 0
    whole = _proof(capsys.readouterr().out)
    dirs = _parts(tmp_path, argv, 2)
    assert cli.main(["explore", "--merge", *map(str, dirs), "--out", str(tmp_path / "all")]) == 0
    out = capsys.readouterr().out
    count = whole.split("(")[1].split(" ")[0]
    assert _proof(out).startswith(whole.split(" (")[0]) and f"({count} schedules, 2 parts)" in out
    doc = json.loads((tmp_path / "all" / "explore.json").read_text())
    assert [e["schedules"] for e in doc["explorations"]] == [int(count)]
    # the parts are disjoint: together they ran the space once, plus the
    # default schedule that every part runs to learn its choice points
    parts = [json.loads(next(d.glob("explore-part-*.json")).read_text()) for d in dirs]
    assert sum(p["results"][0]["schedules"] for p in parts) == int(count) + 1


def test_a_missing_part_is_no_proof_in_one_line(tmp_path, capsys):
    dirs = _parts(tmp_path, PROGRAM, 3)
    assert cli.main(["explore", "--merge", str(dirs[0]), str(dirs[2])]) == 1
    out = capsys.readouterr().out
    assert "proved:" not in out
    assert out.strip().splitlines()[-1] == "not a proof: part 2 of 3 missing"
    assert "    not a proof: part 2 of 3 missing" in out       # the unit's own line


def test_parts_of_another_exploration_are_not_merged(tmp_path, capsys):
    dirs = _parts(tmp_path, PROGRAM, 2)
    other = json.loads(next(dirs[1].glob("explore-part-*.json")).read_text())
    other["exploration"]["strategy"] = "delays:1"
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps(other))
    assert cli.main(["explore", "--merge", str(dirs[0]), str(odd)]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert "proved:" not in "\n".join(lines)
    assert lines[-1].startswith("not a proof: the parts are not of one exploration")
    # another code version is another exploration too
    other = json.loads(next(dirs[1].glob("explore-part-*.json")).read_text())
    other["code"] = "0123456789ab"
    odd.write_text(json.dumps(other))
    assert cli.main(["explore", "--merge", str(dirs[0]), str(odd)]) == 1
    assert "code 0123456789ab" in capsys.readouterr().out


def test_a_part_that_did_not_exhaust_its_space_is_no_proof():
    merged, reason = shards.merge_parts([
        ("a", _part_doc(1, 2, proved=True)), ("b", _part_doc(2, 2, proved=False))])
    assert reason is None and "proved" not in merged[0]
    assert merged[0]["not_proved"] == "not a proof: a part did not exhaust its space"
    merged, _ = shards.merge_parts([("a", _part_doc(1, 2)), ("b", _part_doc(2, 2))])
    assert merged[0]["proved"].endswith("(19 schedules, 2 parts)")


def _part_doc(index, count, proved=True):
    r = {"target": "t", "runtime": "callback", "variant": "fixed", "strategy": "delays:2",
         "schedules": 10, "wall_s": 1.0, "cpu_s": 1.0, "found": False,
         "strategy_info": {"D": 2}}
    if proved:
        r["proved"] = "proved: no failing schedule within 2 delays (10 schedules)"
    return {"model": shards.MODEL, "version": 1, "code": "c", "part": index,
            "exploration": {"target": "t", "strategy": "delays:2", "budget": 10, "count": count},
            "results": [r]}


def test_shard_with_jobs_is_the_space_cut_into_n_times_j_parts():
    units = [{"strategy": "delays:2", "budget": 100, "seed": 0},
             {"strategy": "random", "budget": 100, "seed": 3}]
    got = shards.split(units, 4, (2, 3))
    assert [g["shard"] for g in got if g["unit"] == 0] == [(1, 6), (4, 6)]
    assert [(g["seed"], g["budget"]) for g in got if g["unit"] == 1] == [(3001, 17), (3004, 17)]
    # without --shard, what --jobs always did
    assert verb._shard(units, 4) == shards.split(units, 4)
    assert [g["shard"] for g in shards.split(units, 4) if g["unit"] == 0] == [(0, 2), (1, 2)]
    assert shards.split(units, 1) == [dict(u, unit=i) for i, u in enumerate(units)]


@pytest.mark.parametrize("argv", [
    ["explore", "cpython-23812", "--shard", "3/2", "--out", "x"],
    ["explore", "cpython-23812", "--shard", "0/2", "--out", "x"],
    ["explore", "cpython-23812", "--shard", "1/2"],
    ["explore", "--bench", "--shard", "1/2", "--out", "x"],
    ["explore", "--merge", "/nonexistent/part.json"],
    ["explore", "--merge", "x", "--shard", "1/2"],
])
def test_bad_shard_and_merge_input_is_one_line_and_exit_2(argv, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("looplab: ")


def test_merging_a_file_that_is_not_a_part_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "explore.json").write_text(json.dumps({"explorations": []}))
    assert cli.main(["explore", "--merge", str(tmp_path / "explore.json")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"looplab: --merge {tmp_path / 'explore.json'}: not an explore part (model "
        "looplab.explore.part, written by looplab explore --shard I/N --out DIR)")
    assert cli.main(["explore", "--merge", str(tmp_path)]) == 2     # a directory without parts
    assert "no explore part" in capsys.readouterr().err
    doc = _part_doc(1, 2)
    for name in ("a.json", "b.json"):
        (tmp_path / name).write_text(json.dumps(doc))
    assert cli.main(["explore", "--merge", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 2
    assert "part 1/2 given twice" in capsys.readouterr().err
