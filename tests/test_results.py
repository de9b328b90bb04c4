"""Results documents: compare (verdicts, noise-aware gates, exit codes), merge and its
refusals, CSV, the JSON Schema, loading, export."""
from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys

import pytest

from bench.results import compare as cmpmod
from bench import results
from bench.errors import UsageError as Usage
from bench.verbs import results as results_verbs


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
    results_verbs.add_parser(sub)
    args = parser.parse_args(argv)
    return args.func(args)


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
    a = results.new_cell("echo", "coro", "naive", {"b": 1, "a": 2})["id"]
    b = results.new_cell("echo", "coro", "naive", {"a": 2, "b": 1})["id"]
    assert a == b == "echo/coro/naive/a=2,b=1"


def test_one_spelling_of_a_cell_id_for_scenario_and_benchmark_cells():
    from bench.run.plan import Cell
    assert Cell("S1", "coro", "naive", "quick").id == results.cell_id("S1", "coro", "naive", "quick") \
        == "S1/coro/naive/quick"
    assert Cell("S1", "coro", "naive", "quick", {"net": "sim"}).id == "S1/coro/naive/quick/sim"


def test_compare_flags_a_planted_throughput_regression(tmp_path):
    old, new = _doc(_cells()), _doc(_cells(scale=0.6), "run-b")
    rows, regressions = cmpmod.compare(old, new, "median:10%")
    assert {r["metric"] for r in regressions} == {"requests_per_s"}
    assert len(regressions) == len(old["cells"])
    assert all(r["change"] == pytest.approx(-0.4) for r in regressions)
    # sizes and fractions have no direction: shown as info, never a regression
    assert all(r["status"] == "info" for r in rows if r["metric"] in
               ("peak_user_buffer_bytes", "server_cpu_fraction"))


def test_compare_latency_rise_is_a_regression_and_fall_an_improvement():
    old = _doc(_cells())
    _, worse = cmpmod.compare(old, _doc(_cells(latency_scale=2.0)), "median:10%")
    assert {r["metric"] for r in worse} == {"latency_p99_s"}
    rows, better = cmpmod.compare(old, _doc(_cells(latency_scale=0.5)), "median:10%")
    assert better == []
    assert {r["status"] for r in rows if r["metric"] == "latency_p99_s"} == {"improvement"}


def test_compare_threshold_and_statistic():
    old, new = _doc(_cells()), _doc(_cells(scale=0.6))
    assert len(cmpmod.compare(old, new, "median:10%")[1]) == len(old["cells"])
    assert cmpmod.compare(old, new, "median:50%")[1] == []
    assert len(cmpmod.compare(old, new, "min:10%")[1]) == len(old["cells"])


def test_a_shift_inside_the_spread_is_noise_not_a_regression():
    old, new = _doc(_cells()), _doc(_cells(scale=0.95))
    rows, failures = cmpmod.compare(old, new, "median:3%")
    assert failures == []
    assert {r["status"] for r in rows if r["metric"] == "requests_per_s"} == {"noise"}

    def tight(k):   # the same 5 % shift with tight samples is beyond the noise
        return _doc([results.new_cell("echo", "coro", "naive", {}, samples={
            "requests_per_s": [k * v for v in (1000, 1001, 1002, 999, 1000)]})])
    _, failures = cmpmod.compare(tight(1.0), tight(0.95), "median:3%")
    assert [r["metric"] for r in failures] == ["requests_per_s"]
    assert "Mann-Whitney" in failures[0]["spread"]


def test_back_to_back_runs_of_the_same_code_pass_the_timing_gate():
    import random
    rng = random.Random(7)

    def run(name):
        cells = []
        for rt in ("asyncio-protocol", "callback", "trio", "coro", "hybrid", "curio"):
            cells.append(results.new_cell("echo", rt, "naive", {}, samples={
                "requests_per_s": [rng.gauss(10000, 900) for _ in range(3)],
                "latency_p99_s": [abs(rng.gauss(0.003, 0.0005)) for _ in range(3)],
                "latency_max_s": [abs(rng.gauss(0.01, 0.01)) for _ in range(3)]}))
        return _doc(cells, name)
    rows, failures = cmpmod.compare(run("a"), run("b"), "median:10%", gates=("timing",))
    assert failures == []
    assert {r["status"] for r in rows if r["metric"] == "latency_max_s"} == {"info"}


def test_a_lone_timing_sample_is_no_verdict():
    """One sample a side has no spread to tell noise by: a timing that doubled is
    shown as one-sample, never a regression (nor, halved, an improvement); a
    behaviour metric keeps its 50 % rule."""
    def doc(k, n=1):
        return _doc([results.new_cell("echo", "coro", "naive", {}, samples={
            "latency_p99_s": [0.002 * k] * n, "requests_per_s": [1000.0 / k] * n})])
    for k in (2.0, 0.5):
        rows, failures = cmpmod.compare(doc(1.0), doc(k), "median:10%")
        assert failures == []
        assert {r["status"] for r in rows if r["metric"] != ""} <= {"one-sample", "same", "info"}
        assert all("one sample: no verdict" in r["spread"] for r in rows if r["status"] == "one-sample")
        assert "regression" not in cmpmod.format_compare(rows)
        assert "improvement" not in cmpmod.format_compare(rows)
    _, failures = cmpmod.compare(doc(1.0, 3), doc(2.0, 3), "median:10%")   # three a side: judged
    assert {r["metric"] for r in failures} == {"latency_p99_s", "requests_per_s"}


def test_mann_whitney_p_value():
    assert cmpmod.mann_whitney_p([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) < 0.05
    assert cmpmod.mann_whitney_p([1, 3, 5, 7, 9], [2, 4, 6, 8, 10]) > 0.5


def _scenario_doc(verdicts, peak, delivered, run_id):
    from bench.scenarios import api
    cell = results.new_cell("S1", "callback", "fixed", {"duration_s": 1.0},
                            metrics={"peak_user_buffer_bytes": peak, "delivered_bytes": delivered,
                                     "max_frame_latency_s": 0.1},
                            verdicts=verdicts)
    return results.new_document([cell], run_id=run_id, env={"node": "m"},
                                scenarios={"S1": api.get("S1").describe()})


def test_compare_verdict_regression_fails_the_verdict_gate(tmp_path, capsys):
    old = _scenario_doc({"bounded": True}, 100_000, 1_000_000, "a")
    new = _scenario_doc({"bounded": False}, 100_000, 1_000_000, "b")
    rows, failures = cmpmod.compare(old, new, gates=("verdict",))
    assert [(r["metric"], r["status"]) for r in failures] == [("verdict:bounded", "regression")]
    rows, _ = cmpmod.compare(new, old)
    assert [r["status"] for r in rows if r["kind"] == "verdict"] == ["fix"]
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    results.write_json(old, str(a))
    results.write_json(new, str(b))
    assert _cli(["compare", str(a), str(b), "--fail", "verdict"]) == 1
    assert "verdict:bounded" in capsys.readouterr().out
    assert _cli(["compare", str(b), str(a), "--fail", "verdict"]) == 0


def test_compare_gates_behavioural_metrics_by_declared_direction():
    old = _scenario_doc({"bounded": True}, 100_000, 1_000_000, "a")
    new = _scenario_doc({"bounded": True}, 2_000_000, 0, "b")       # buffer x20, delivered -100 %
    rows, failures = cmpmod.compare(old, new, gates=("behaviour",))
    assert {r["metric"] for r in failures} == {"peak_user_buffer_bytes", "delivered_bytes"}
    # latency maxima are information, never a gate
    assert [r["status"] for r in rows if r["metric"] == "max_frame_latency_s"] == ["info"]


def test_compare_with_nothing_matched_is_an_error():
    old = _doc(_cells())
    other = _doc([results.new_cell("other", "x", "naive", {}, metrics={"a_count": 1})])
    with pytest.raises(Usage, match="nothing to compare"):
        cmpmod.compare(old, other)
    with pytest.raises(Usage, match="no cell has requests_per_sec"):
        cmpmod.compare(old, old, metrics=["requests_per_sec"])


def test_compare_reports_cells_only_on_one_side():
    old = _doc(_cells())
    new = _doc(_cells()[:-1] + [results.new_cell("echo", "coro", "naive", {},
                                                samples={"requests_per_s": [1.0]})])
    rows, _ = cmpmod.compare(old, new)
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
        cmpmod.parse_rule(rule)


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
    pb = cmpmod.to_pytest_benchmark(doc)
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


# ---------------------------------------------------------------------------
# merge refuses what would pool the wrong things

def _sharded(n=3, node="m1"):
    cells = _cells()
    plan_ids = [c["id"] for c in cells]
    return [results.new_document(results.shard(cells, f"{i}/{n}"), run_id=f"s{i}",
                                 env={"node": node, "cpu": "x"},
                                 shard=results.shard_info(plan_ids, f"{i}/{n}"))
            for i in range(1, n + 1)]


def test_merge_refuses_the_same_input_twice():
    doc = _doc(_cells())
    with pytest.raises(Usage, match="same results"):
        results.merge([doc, doc], ["a.json", "b.json"])


def test_merge_refuses_conflicting_params_for_one_cell_id():
    a = results.new_cell("S1", "trio", "naive", {}, metrics={"x_count": 1})
    b = dict(a, params={"duration_s": 9})
    with pytest.raises(Usage, match="different parameters"):
        results.merge([_doc([a], "ra"), _doc([b], "rb")])


def test_merge_names_the_missing_shards():
    s1, s2, s3 = _sharded()
    with pytest.raises(Usage, match=r"missing shard\(s\) 2/3"):
        results.merge([s1, s3])
    merged = results.merge([s1, s2, s3], ["1.json", "2.json", "3.json"])
    assert [i["file"] for i in merged["inputs"]] == ["1.json", "2.json", "3.json"]
    assert {i["machine"] for i in merged["inputs"]} == {"m1 (x)"}


def test_merge_needs_a_flag_to_pool_machines():
    a = _doc(_cells()[:2], "ra")
    b = _doc(_cells()[2:], "rb")
    a["env"], b["env"] = {"node": "m1", "cpu": "x"}, {"node": "m2", "cpu": "x"}
    with pytest.raises(Usage, match="different machines"):
        results.merge([a, b])
    assert len(results.merge([a, b], allow_mixed_machines=True)["cells"]) == len(_cells())


# ---------------------------------------------------------------------------
# the JSON Schema

def test_the_schema_is_shipped_and_every_document_kind_validates(tmp_path):
    assert os.path.exists(results.SCHEMA_FILE)
    docs = [_doc(_cells()), results.merge(_sharded()), _scenario_doc({"bounded": True}, 1, 2, "x")]
    for doc in docs:
        path = tmp_path / "r.json"
        results.write_json(doc, str(path))
        assert results.validate(json.loads(path.read_text())) == []


def test_validate_reports_where_a_file_departs(tmp_path, capsys):
    doc = json.loads(json.dumps(_doc(_cells())))
    doc["cells"][0]["verdicts"]["bounded"] = "yes"
    del doc["run_id"]
    problems = results.validate(doc)
    assert any(p.startswith("cells/0/verdicts/bounded") for p in problems)
    assert any("run_id" in p for p in problems)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    assert _cli(["validate", str(path)]) == 1
    assert "INVALID" in capsys.readouterr().out


def test_one_rule_for_output_paths_missing_folders_are_made_when_written(tmp_path):
    """Every verb's --out and --json: a missing folder on the way is made when the
    first file is written there, and checking the path creates nothing, so a
    command that stops before writing leaves no empty folder (faults included)."""
    from bench.verbs import faults
    nested = tmp_path / "a" / "b"
    assert results.check_output(str(nested / "x.json"), "--json") == str(nested / "x.json")
    results.check_output(str(nested / "out"), "--out", folder=True)
    assert faults._json_path(str(nested / "f.json")) == str(nested / "f.json")
    assert list(tmp_path.iterdir()) == []
    results.write_json({"a": 1}, str(nested / "x.json"))
    faults._write_json(str(nested / "c" / "f.json"), {"a": 1})
    assert sorted(p.name for p in nested.iterdir()) == ["c", "x.json"]


def test_outputs_are_checked_first_and_writes_leave_no_temp_files(tmp_path):
    with pytest.raises(Usage, match="cannot write"):
        results.check_output("/proc/looplab/x.json", "--out")
    with pytest.raises(Usage, match="is a folder"):
        results.check_output(str(tmp_path), "--json")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(Usage, match="not a folder"):
        results.check_output(str(blocker), "--out", folder=True)
    with pytest.raises(ValueError):      # NaN is not JSON: the write fails half-way
        results.write_json({"bad": float("nan")}, str(tmp_path / "r.json"))
    results.write_csv(_doc(_cells()), str(tmp_path / "r.csv"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "r.csv"]
