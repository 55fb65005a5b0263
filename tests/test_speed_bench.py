"""bench/stage_profile.py, bench/run_profile.py, bench/speed.py, bench/test_durations.py and bench/suite_costs.py: every stage profiled,
every part of a recorded run counted inside its parent, the length-sorted batches hold the same examples, the
evaluation section compares the decode loop with the gold draft, the SVD section times every layer shape, and pytest's durations are read back whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"


def load(name: str):
    return load_script(BENCH / f"{name}.py", f"bench_{name}")


def test_length_sorted_batches_hold_the_same_examples_with_less_padding():
    speed = load("speed")
    from bsi.data import collate

    rows = [{"input_ids": list(range(1, n + 1)), "labels": [-100] * (n // 2) + list(range(n // 2 + 1, n + 1))}
            for n in (9, 3, 7, 2, 8, 4, 6, 5)]
    batches = [collate(rows[i:i + 2], 0) for i in range(0, len(rows), 2)]
    grouped = speed.length_sorted(batches, 0)

    def examples(bs):
        out = []
        for b in bs:
            for ids, labels, mask in zip(b["input_ids"], b["labels"], b["attention_mask"]):
                n = int(mask.sum())
                out.append((tuple(ids[:n].tolist()), tuple(labels[:n].tolist())))
        return sorted(out)

    assert examples(grouped) == examples(batches)
    assert [b["input_ids"].shape[0] for b in grouped] == [2, 2, 2, 2]
    assert speed.padding_share(grouped) < speed.padding_share(batches)
    assert speed.padding_share(grouped) == pytest.approx(4 / 44)  # one padded position per pair of lengths


def test_stage_profile_covers_every_stage(tmp_path, capsys):
    profile = load("stage_profile")
    out = tmp_path / "profile.json"
    torch.manual_seed(0)
    profile.main(["--model", "tiny-random-llama", "--preset", "smoke", "--steps", "1", "--eval-problems", "2",
                  "--json", str(out)])
    result = json.loads(out.read_text())
    stages = {row["stage"]: row for row in result["stages"]}
    assert list(stages) == ["finetune", "evaluate", "calibrate", "convert", "compress-train", "compress-profile",
                            "close-round", "export", "recover"]
    for name, row in stages.items():
        assert row["seconds"] > 0, name
        if name != "export":  # the export is timed, not profiled
            assert 0 < row["ops_share"] <= 1.05 and 0 <= row["matmul_share"] <= row["ops_share"], name
            assert row["top"], name
    for name in ("finetune", "calibrate", "compress-train", "compress-profile", "recover"):
        assert stages[name]["padding_share"] is not None and stages[name]["padding_share"] >= 0, name
    assert stages["evaluate"]["parts"]["scoring pass"]["calls"] == 1  # two problems: one batch
    table = capsys.readouterr().out
    assert all(f"\n{name} " in table for name in stages)


def test_speed_bench_evaluation_section_on_the_tiny_model(tmp_path, capsys):
    speed = load("speed")
    out = tmp_path / "speed.json"
    speed.main(["--model", "tiny-random-llama", "--preset", "smoke", "--sections", "evaluate", "--repeats", "1",
                "--eval-problems", "4", "--eval-batch-sizes", "2", "--json", str(out)])
    result = json.loads(out.read_text())["evaluate"]
    assert result["problems"] == 4
    base = next(name for name in result["timings"] if name.endswith("decode loop"))
    assert result["quality"][base]["answers_differ"] == 0
    assert set(result["ratios"]) == set(result["timings"]) - {base}
    draft = next(name for name in result["quality"] if name.endswith("gold draft"))
    assert result["quality"][draft]["loss_difference"] == pytest.approx(0, abs=1e-6)
    assert "gold draft" in capsys.readouterr().out


def test_speed_bench_svd_section_times_every_layer_shape_and_thin_svd_is_exact(tmp_path, capsys):
    speed = load("speed")
    out = tmp_path / "speed.json"
    speed.main(["--model", "tiny-random-llama", "--preset", "smoke", "--sections", "svd", "--repeats", "1",
                "--json", str(out)])
    result = json.loads(out.read_text())["svd"]
    from bsi.models import load_model_and_tokenizer

    model, _ = load_model_and_tokenizer("tiny-random-llama")
    linear = [m.weight.shape for n, m in model.named_modules()
              if isinstance(m, torch.nn.Linear) and not n.endswith("lm_head")]
    by_dtype = {dtype: [r for r in result["rows"] if r["dtype"] == dtype] for dtype in ("float32", "float64")}
    for dtype, rows in by_dtype.items():
        assert sorted(tuple(r["shape"]) for r in rows) == sorted({tuple(shape) for shape in linear})
        assert sum(r["layers"] for r in rows) == len(linear)  # every layer counted once, by its shape
        assert any(r["shape"][0] < r["shape"][1] for r in rows)  # a wide matrix: the transposed path is timed
        for r in rows:
            assert r["sigma_max_difference"] < (1e-5 if dtype == "float32" else 1e-12)
            assert r["reconstruction_error"] < (1e-5 if dtype == "float32" else 1e-12)
        assert result["conversion_s"][dtype]["thin_svd"] == pytest.approx(
            sum(r["layers"] * r["timings"]["thin_svd"]["median_s"] for r in rows))
    assert "every layer, float64:" in capsys.readouterr().out


def test_speed_bench_whitening_section_times_both_factorisations_and_they_agree_to_the_bit(tmp_path, capsys):
    speed = load("speed")
    out = tmp_path / "speed.json"
    speed.main(["--model", "tiny-random-llama", "--preset", "smoke", "--sections", "whitening", "--repeats", "1",
                "--calibration-batches", "2", "--json", str(out)])
    result = json.loads(out.read_text())["whitening"]
    from bsi.models import load_model_and_tokenizer

    model, _ = load_model_and_tokenizer("tiny-random-llama")
    blocks = len(model.model.layers)
    assert result["layers"] == 7 * blocks and result["distinct_inputs"] == 4 * blocks  # q/k/v and gate/up share
    assert result["calibration_batches"] == 2 and result["factors_identical"] and result["bases_identical"]
    assert set(result["factors"]["timings"]) == {"before", "today's formula, one per layer", "today"}
    assert set(result["conversion"]["timings"]) == {"before", "today"}
    assert all(v["median_s"] > 0 for part in ("factors", "conversion") for v in result[part]["timings"].values())
    assert "the same to the bit: factors True, bases True" in capsys.readouterr().out


def test_speed_bench_bootstrap_section_times_both_sums_and_leaves_the_shipped_sweep_alone(tmp_path, capsys):
    speed = load("speed")
    out = tmp_path / "speed.json"
    shipped = ROOT / "data" / "sweeps" / "study-quick-equal-training" / "stats.json"
    before = shipped.read_bytes()
    speed.main(["--sections", "bootstrap", "--repeats", "1", "--bootstrap-problems", "60",
                "--bootstrap-sweep", "study-quick-equal-training", "--json", str(out)])
    result = json.loads(out.read_text())["bootstrap"]
    rows = {r["values"]: r for r in result["rows"]}
    assert sorted(rows) == ["losses", "marks"] and all(r["problems"] == 60 for r in rows.values())
    assert rows["marks"]["largest_relative_difference"] == 0  # whole numbers: the same sums to the last bit
    assert 0 <= rows["losses"]["largest_relative_difference"] < 1e-14  # another order of the same additions
    for r in rows.values():
        assert set(r["ms_per_call"]) == {"before", "counted"} and all(v > 0 for v in r["ms_per_call"].values())
    study = result["study_statistics"]
    assert study["sweep"] == "study-quick-equal-training" and study["speed_up"] > 0
    assert shipped.read_bytes() == before  # the statistics were written into a copy
    from bsi.analysis import stats

    assert stats._resample_sums.__module__ == "bsi.analysis.stats"  # the baseline swapped in was swapped back
    assert "the shipped sweep study-quick-equal-training's statistics" in capsys.readouterr().out


def test_run_profile_counts_each_part_inside_its_parent_only(tmp_path, capsys):
    """A recording of three stacks: shares are inclusive, the dense evaluation counts only inside the dense
    model's stage, the compressed one only outside it, and the rest of the process falls outside the pipeline."""
    profile = load("run_profile")
    run = "<module> (bsi/__main__.py:3);Pipeline.run (bsi/pipeline/runner.py:1);Pipeline._stages (x.py:2)"
    raw = tmp_path / "profile.raw"
    raw.write_text("\n".join([
        f"{run};Pipeline.reference_stage (r.py:1);Pipeline.evaluate_stage (r.py:2);_score_batch (e.py:3) 10",
        f"{run};Pipeline.compress (r.py:4);Compressor.run (e.py:1);Compressor._train_step (e.py:2) 60",
        f"{run};Pipeline.evaluate_stage (r.py:2);greedy_decode (e.py:9) 20",
        "<module> (bsi/__main__.py:3);import torch (t.py:1) 10",
    ]) + "\n")
    profile.main(["--raw", str(raw), "--json", str(tmp_path / "p.json"), "--rate", "10"])
    parts = json.loads((tmp_path / "p.json").read_text())["parts"]
    assert parts["dense evaluation"]["samples"] == 10 and parts["compressed evaluation"]["samples"] == 20
    assert parts["tuning steps"]["samples"] == 60 and parts["pruning stage"]["share"] == pytest.approx(0.6)
    assert parts["outside the pipeline (start, imports, summary)"]["samples"] == 10
    assert parts["both evaluations' decode steps"]["seconds"] == pytest.approx(2.0)
    assert "| &nbsp;&nbsp;tuning steps | 6 | 60.0% |" in capsys.readouterr().out


def test_test_durations_reads_every_phase_of_every_test_and_sums_them_by_file(tmp_path, capsys):
    """A pytest output with a parametrized id holding spaces, three phases of one test and the summary line."""
    durations = load("test_durations")
    output = tmp_path / "pytest.txt"
    output.write_text("\n".join([
        "....s.                                      [100%]",
        "============================= slowest durations ==============================",
        "12.50s call     tests/test_a.py::test_one[close the client]",
        "2.00s setup    tests/test_a.py::test_one[close the client]",
        "0.25s teardown tests/test_a.py::test_one[close the client]",
        "3.10s call     tests/test_b.py::test_two",
        "(12 durations < 0.005s hidden.  Use -vv to show these durations.)",
        "5 passed, 1 skipped, 3 warnings in 20.75s (0:00:20)",
    ]) + "\n")
    assert durations.main(["--read", str(output), "--out", str(tmp_path / "d.json"), "--label", "a label",
                           "--workers", "1"]) == 0
    record = json.loads((tmp_path / "d.json").read_text())
    assert record["wall_s"] == 20.75 and record["summary"] == "5 passed, 1 skipped, 3 warnings"
    assert record["tests"]["tests/test_a.py::test_one[close the client]"] == {"call": 12.5, "setup": 2.0,
                                                                            "teardown": 0.25}
    assert record["files"] == {"tests/test_a.py": 14.75, "tests/test_b.py": 3.1}  # longest first
    assert list(record["files"]) == ["tests/test_a.py", "tests/test_b.py"] and record["seconds_in_tests"] == 17.85
    assert record["label"] == "a label" and record["workers"] == 1
    assert "| tests/test_a.py | 14.8 |" in capsys.readouterr().out
    # kept per machine: the default name says the date, the CPU and the workers
    for cpu, name in (("AMD EPYC", "amd-epyc"), ("Intel(R) Xeon(R) CPU @ 2.20GHz", "intel-xeon"), ("", "cpu")):
        assert durations.default_name({**record, "machine": {"cpu": cpu}, "workers": 2}) == \
            f"test-durations-{record['date']}-{name}-2w.json"
    output.write_text("no summary here\n")
    with pytest.raises(SystemExit, match="no pytest summary line"):
        durations.main(["--read", str(output), "--out", str(tmp_path / "e.json")])
    assert not (tmp_path / "e.json").exists()


def test_the_workers_take_the_files_longest_first_from_the_newest_record(tmp_path):
    """tests/conftest.py orders the files by the newest record on workers; one unreadable record changes nothing."""
    from conftest import recorded_file_seconds

    def record(name, date, workers, files, time=None):
        kept = {"date": date, "workers": workers, "files": files} | ({"time_utc": time} if time else {})
        (tmp_path / name).write_text(json.dumps(kept))

    assert recorded_file_seconds(tmp_path) == {}
    record("test-durations-2026-11-27-amd-epyc-2w.json", "2026-11-27", 2, {"tests/test_a.py": 9.0})
    record("test-durations-2026-11-28-one-process.json", "2026-11-28", 1, {"tests/test_b.py": 1.0})
    record("test-durations-2026-11-28-amd-epyc-2w.json", "2026-11-28", 2, {"tests/test_c.py": 5.0,
                                                                            "tests/test_d.py": 7.0}, "20:40")
    record("test-durations-2026-11-28-two-workers.json", "2026-11-28", 2, {"tests/test_e.py": 3.0})  # no time
    (tmp_path / "test-durations-2026-11-29-broken.json").write_text("{not json")
    assert recorded_file_seconds(tmp_path) == {"test_c.py": 5.0, "test_d.py": 7.0}


def test_suite_costs_gzip_levels_trade_seconds_for_bytes_on_a_shipped_runs_records(tmp_path):
    """bench/suite_costs.py's gzip part: the records read whole, a higher level never larger; folders compared by digest."""
    import gzip

    costs = load("suite_costs")
    result = costs.gzip_levels()
    with gzip.open(costs.RECORDS, "rb") as handle:
        assert result["raw_bytes"] == len(handle.read())
    sizes = [result["levels"][level]["bytes"] for level in ("1", "6", "9")]
    assert sizes[0] >= sizes[1] >= sizes[2] > 0 and all(s < result["raw_bytes"] for s in sizes)
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "x.json").write_text("{}")
    assert costs.folder_digests(tmp_path / "a") == costs.folder_digests(tmp_path / "b")
    (tmp_path / "b" / "x.json").write_text("[]")
    assert costs.folder_digests(tmp_path / "a") != costs.folder_digests(tmp_path / "b")


def test_suite_costs_takes_only_the_parts_it_knows_and_its_eager_imports_are_what_the_tests_no_longer_import(tmp_path):
    """A bad --parts is one line naming the parts and writes nothing; the "before" plugin imports what conftest did."""
    costs = load("suite_costs")
    out = tmp_path / "costs.json"
    for parts in ("gzip,nope", " , "):
        with pytest.raises(SystemExit, match="--parts takes names from conversion, kaleido, gzip, startup, launches"):
            costs.main(["--parts", parts, "--out", str(out)])
    assert not out.exists()
    assert costs.main(["--parts", "gzip", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["command"] == "python bench/suite_costs.py --parts gzip" and set(record) >= {"gzip", "machine"}
    # the "before" side imports exactly the heavy modules that tests/conftest.py and the notebook tests now import
    # only inside their functions (so that pytest-xdist's controller and every worker's collection skip them)
    import ast

    def top_modules(tree) -> set[str]:
        return {(alias.name if isinstance(node, ast.Import) else node.module).split(".")[0]
                for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom)) and not getattr(node, "level", 0)
                for alias in node.names}

    heavy = {"torch", "transformers", "nbformat", "nbclient"}
    trees = [ast.parse((BENCH.parent / "tests" / name).read_text()) for name in
             ("conftest.py", "test_notebooks.py", "test_walkthroughs.py")]
    inside = {(alias.name if isinstance(node, ast.Import) else node.module).split(".")[0]
              for tree in trees for function in ast.walk(tree) if isinstance(function, ast.FunctionDef)
              for node in ast.walk(function) if isinstance(node, (ast.Import, ast.ImportFrom)) and not getattr(node, "level", 0)
              for alias in node.names}
    assert not heavy & set().union(*map(top_modules, trees))  # none of them at the top of the three files
    assert top_modules(ast.parse(costs.EAGER_IMPORTS)) == heavy & inside == heavy  # the plugin: all, and only, those
