"""Results documents: compare (and its exit code), merge of shards, CSV, loading, export."""
from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys

import pytest

from bench import results
from bench.cli import Usage


def _cells(scale: float = 1.0, latency_scale: float = 1.0) -> list[dict]:
    cells = []
    for rt in ("asyncio-protocol", "callback", "trio"):
        for m in (1024, 10240):
            cells.append(results.new_cell(
                "echo", rt, "naive", {"message_bytes": m, "connections": 10},
                samples={"requests_per_s": [v * scale for v in (1000.0, 1100.0, 900.0)],
                         "latency_p99_s": [v * latency_scale for v in (0.002, 0.003, 0.0025)],
                         "server_cpu_fraction": [0.9, 0.95, 0.92]},
                metrics={"peak_user_buffer_bytes": 4096}, verdicts={"bounded": True}))
    return cells


def _doc(cells, run_id="run-a") -> dict:
    return results.new_document(cells, run_id=run_id, env={"python": "3.11"})


def _cli(argv) -> int:
    parser = argparse.ArgumentParser(prog="looplab")
    sub = parser.add_subparsers(dest="verb")
    results.register(sub)
    args = parser.parse_args(argv)
    return args.fn(args)


def test_new_cell_summarizes_samples_with_median_and_spread():
    cell = results.new_cell("echo", "trio", "naive", {"connections": 10, "message_bytes": 1024},
                            samples={"requests_per_s": [3.0, 1.0, 2.0, 10.0]})
    assert cell["id"] == "echo/trio/naive/connections=10,message_bytes=1024"
    assert cell["metrics"]["requests_per_s"] == 2.5
    assert cell["repeats"] == 4
    s = cell["spread"]["requests_per_s"]
    assert (s["min"], s["max"]) == (1.0, 10.0)
    assert s["q1"] == pytest.approx(1.75) and s["q3"] == pytest.approx(4.75)


def test_cell_id_ignores_param_order():
    a = results.cell_id("echo", "coro", "naive", {"b": 1, "a": 2})
    b = results.cell_id("echo", "coro", "naive", {"a": 2, "b": 1})
    assert a == b == "echo/coro/naive/a=2,b=1"


def test_compare_flags_a_planted_throughput_regression(tmp_path):
    old, new = _doc(_cells()), _doc(_cells(scale=0.8), "run-b")
    rows, regressions = results.compare(old, new, "median:10%")
    assert {r["metric"] for r in regressions} == {"requests_per_s"}
    assert len(regressions) == len(old["cells"])
    assert all(r["change"] == pytest.approx(-0.2) for r in regressions)
    # sizes and fractions have no direction: shown as info, never a regression
    assert all(r["status"] == "info" for r in rows if r["metric"] in
               ("peak_user_buffer_bytes", "server_cpu_fraction"))


def test_compare_latency_rise_is_a_regression_and_fall_an_improvement():
    old = _doc(_cells())
    _, worse = results.compare(old, _doc(_cells(latency_scale=1.5)), "median:10%")
    assert {r["metric"] for r in worse} == {"latency_p99_s"}
    rows, better = results.compare(old, _doc(_cells(latency_scale=0.5)), "median:10%")
    assert better == []
    assert {r["status"] for r in rows if r["metric"] == "latency_p99_s"} == {"improvement"}


def test_compare_threshold_and_statistic():
    old, new = _doc(_cells()), _doc(_cells(scale=0.95))
    assert results.compare(old, new, "median:10%")[1] == []
    assert len(results.compare(old, new, "median:3%")[1]) == len(old["cells"])
    assert len(results.compare(old, new, "min:3%")[1]) == len(old["cells"])


def test_compare_reports_cells_only_on_one_side():
    old = _doc(_cells())
    new = _doc(_cells()[:-1] + [results.new_cell("echo", "coro", "naive", {},
                                                samples={"requests_per_s": [1.0]})])
    rows, _ = results.compare(old, new)
    statuses = {r["cell"]: r["status"] for r in rows if r["status"].startswith("only")}
    assert statuses == {old["cells"][-1]["id"]: "only-old", "echo/coro/naive": "only-new"}


def test_compare_cli_exit_codes(tmp_path, capsys):
    base, same, worse = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    results.write_json(_doc(_cells()), str(base))
    results.write_json(_doc(_cells(scale=1.02), "b"), str(same))
    results.write_json(_doc(_cells(scale=0.5), "c"), str(worse))
    assert _cli(["compare", str(base), str(worse), "--fail", "median:10%"]) == 1
    assert "regression" in capsys.readouterr().out
    assert _cli(["compare", str(base), str(same), "--fail", "median:10%"]) == 0
    # without --fail a regression is shown but does not fail
    assert _cli(["compare", str(base), str(worse)]) == 0
    assert "regression" in capsys.readouterr().out


@pytest.mark.parametrize("rule", ["median", "10", "avg:10%", "median:ten%", "median:-5%"])
def test_bad_rule_is_a_usage_error(rule):
    with pytest.raises(Usage, match="rule"):
        results.parse_rule(rule)


def test_merge_of_shards_equals_the_unsharded_cell_set():
    cells = _cells()
    full = _doc(cells, "full")
    shards = [_doc(results.shard(cells, f"{i}/3"), f"s{i}") for i in (1, 2, 3)]
    assert sum(len(s["cells"]) for s in shards) == len(cells)
    merged = results.merge(shards)
    assert sorted(c["id"] for c in merged["cells"]) == sorted(c["id"] for c in full["cells"])
    by_id = {c["id"]: c for c in merged["cells"]}
    for cell in full["cells"]:
        assert by_id[cell["id"]]["metrics"] == cell["metrics"]
        assert by_id[cell["id"]]["samples"] == cell["samples"]
    assert [e["python"] for e in merged["env"]] == ["3.11"] * 3
    assert merged["merged_from"] == ["s1", "s2", "s3"]


def test_merge_same_cell_pools_repeats_and_ands_verdicts():
    a = results.new_cell("s1", "trio", "naive", {}, samples={"rate_Bps": [1.0, 2.0, 3.0]},
                         verdicts={"bounded": True}, errors=["a"])
    b = results.new_cell("s1", "trio", "naive", {}, samples={"rate_Bps": [10.0, 20.0]},
                         verdicts={"bounded": False}, errors=["b"])
    merged = results.merge([_doc([a], "ra"), _doc([b], "rb")])
    (cell,) = merged["cells"]
    assert cell["samples"]["rate_Bps"] == [1.0, 2.0, 3.0, 10.0, 20.0]
    assert cell["metrics"]["rate_Bps"] == 3.0
    assert cell["repeats"] == 5
    assert cell["verdicts"] == {"bounded": False}
    assert cell["errors"] == ["a", "b"]
    assert cell["merged_from"] == ["ra", "rb"]


def test_merge_cli_writes_json_csv_and_pytest_benchmark(tmp_path):
    cells = _cells()
    paths = []
    for i in (1, 2):
        p = tmp_path / f"s{i}.json"
        results.write_json(_doc(results.shard(cells, f"{i}/2"), f"s{i}"), str(p))
        paths.append(str(p))
    out, out_csv, out_pb = tmp_path / "m.json", tmp_path / "m.csv", tmp_path / "pb.json"
    assert _cli(["merge", *paths, "--out", str(out), "--csv", str(out_csv),
                 "--pytest-benchmark", str(out_pb)]) == 0
    assert len(results.load_json(str(out))["cells"]) == len(cells)
    assert out_csv.exists() and json.loads(out_pb.read_text())["benchmarks"]


def test_csv_has_one_row_per_cell_and_metric(tmp_path):
    doc = _doc(_cells(), "run-csv")
    path = tmp_path / "r.csv"
    results.write_csv(doc, str(path))
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0].keys()) == results.CSV_COLUMNS
    per_cell = len(doc["cells"][0]["metrics"]) + len(doc["cells"][0]["verdicts"])
    assert len(rows) == len(doc["cells"]) * per_cell
    assert {r["run_id"] for r in rows} == {"run-csv"}
    first = rows[0]
    assert json.loads(first["params"]) == {"connections": 10, "message_bytes": 1024}
    assert first["metric"] == "requests_per_s" and float(first["value"]) == 1000.0
    assert any(r["metric"] == "verdict:bounded" and r["value"] == "true" for r in rows)


def test_load_json_round_trip(tmp_path):
    doc = _doc(_cells())
    path = tmp_path / "r.json"
    results.write_json(doc, str(path))
    assert results.load_json(str(path)) == json.loads(json.dumps(doc))


@pytest.mark.parametrize("content, message", [
    ('{"benchmarks": []}', "not a looplab results file"),
    ("[1, 2, 3]", "not a looplab results file"),
    ("this is not json", "not JSON"),
    ('{"schema": 99, "cells": []}', "schema 99"),
    ('{"schema": 1, "cells": [{"metrics": {}}]}', "cell 0 is malformed"),
])
def test_load_json_rejects_other_files_with_one_clear_line(tmp_path, content, message):
    path = tmp_path / "other.json"
    path.write_text(content)
    with pytest.raises(Usage) as info:
        results.load_json(str(path))
    text = str(info.value)
    assert message in text and "\n" not in text
    if "schema 99" not in message:
        assert str(path) in text


def test_load_json_missing_file_is_a_usage_error(tmp_path):
    with pytest.raises(Usage, match="cannot read"):
        results.load_json(str(tmp_path / "nope.json"))


def test_compare_cli_on_a_non_looplab_file_is_a_usage_error(tmp_path):
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    results.write_json(_doc(_cells()), str(good))
    bad.write_text('{"machine_info": {}, "benchmarks": []}')
    with pytest.raises(Usage, match="bad.json is not a looplab results file"):
        _cli(["compare", str(good), str(bad)])


def test_shard_slices_interleaved_and_validates():
    items = list(range(10))
    assert results.shard(items, "1/3") == [0, 3, 6, 9]
    assert results.shard(items, "3/3") == [2, 5, 8]
    assert results.shard(items, None) == items
    for bad in ("0/3", "4/3", "3", "a/b", "1/0", ""):
        with pytest.raises(Usage, match="bad shard"):
            results.shard(items, bad)


def test_environment_records_what_changes_numbers():
    env = results.environment()
    for key in ("python", "implementation", "platform", "cpu", "cpu_count", "libraries",
                "allocator_env", "socket_buffers", "loadavg"):
        assert key in env
    assert set(env["libraries"]) >= {"trio", "curio", "uvloop", "pytest-benchmark"}
    bufs = env["socket_buffers"]
    assert bufs["pinned_request_bytes"] == 65536 and bufs["pinned_sndbuf_bytes"] >= 65536


def test_environment_records_allocator_variables(monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "1048576")
    assert results.environment()["allocator_env"]["MALLOC_MMAP_THRESHOLD_"] == "1048576"


def test_pytest_benchmark_export_is_readable_by_pytest_benchmark_compare(tmp_path):
    micro = results.new_cell("micro", "coro", "yield", {}, samples={"ops_per_s": [1e5, 2e5, 4e5]})
    doc = _doc(_cells() + [micro])
    pb = results.to_pytest_benchmark(doc)
    names = {b["name"] for b in pb["benchmarks"]}
    assert "micro/coro/yield:ops_per_s" in names
    bench = next(b for b in pb["benchmarks"] if b["name"] == "micro/coro/yield:ops_per_s")
    # rates become seconds per operation
    assert bench["stats"]["min"] == pytest.approx(1 / 4e5)
    assert bench["stats"]["median"] == pytest.approx(1 / 2e5)
    assert bench["stats"]["rounds"] == 3
    assert not any(n.endswith(":throughput_Bps") for n in names)
    path = tmp_path / "0001_looplab.json"
    path.write_text(json.dumps(pb))
    proc = subprocess.run([sys.executable, "-m", "pytest_benchmark", "compare", str(path),
                           "--columns", "min,median,ops"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "micro/coro/yield:ops_per_s" in proc.stdout
