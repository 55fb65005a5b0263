"""The comparison sweep, its resume, the speed measurement and `bsi compare`, on the tiny model."""

from __future__ import annotations

import json

import pytest

from bsi.cli import main
from bsi.config import make_config
from bsi.pipeline.methods import BaselineConfig
from bsi.pipeline.runner import Pipeline
from bsi.models import load_model_and_tokenizer
from bsi.reports import StageReport
from bsi.analysis.speed import measure_speeds
from bsi.pipeline.sweep import CellReport, Sweep


def tiny_config(**over):
    return make_config("smoke", {"compress": {"target_ratio": 1.0}, "eval_examples": 4, "test_size": 4,
                                 "max_new_tokens": 8, **over})


def make_sweep(out, methods=("svd", "bsi"), targets=(0.5,)):
    return Sweep(tiny_config(), list(methods), list(targets), out, BaselineConfig(),
                 speed_tokens=3, speed_repeats=1)


def test_sweep_writes_table_jsonl_and_figure_then_resumes(tmp_path, isolated_cache):
    out = tmp_path / "sweep"
    reports = list(make_sweep(out).run())
    cells = [r for r in reports if isinstance(r, CellReport)]
    assert [(c.row["method"], c.skipped) for c in cells] == [("svd", False), ("bsi", False)]
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["method"] for r in rows] == ["dense", "svd", "bsi"]
    for r in rows[1:]:
        assert abs(r["compressible_ratio"] - 0.5) <= 0.005
        assert r["params_total"] < rows[0]["params_total"]
        assert r["tokens_per_s"] > 0 and r["dense_tokens_per_s"] > 0 and r["speedup"] > 0
        assert 0 <= r["accuracy"] <= 1 and r["loss"] > 0 and r["seed"] == 0
    table = (out / "results.md").read_text()
    assert table.count("\n| svd |") == 1 and table.count("\n| bsi |") == 1 and "speed vs dense" in table
    html = (out / "figure.html").read_text()
    assert "plotly" in html and '"name":"svd"' in html and '"name":"bsi"' in html

    # the same sweep again, one cell more: finished cells are skipped, not recomputed
    again = list(make_sweep(out, methods=("svd", "bsi", "basel")).run())
    cells = [r for r in again if isinstance(r, CellReport)]
    assert [(c.row["method"], c.skipped) for c in cells] == [("svd", True), ("bsi", True), ("basel", False)]
    compress_starts = [r for r in again if isinstance(r, StageReport) and r.stage == "compress" and r.event == "start"]
    assert [r.detail for r in compress_starts] == ["basel"]
    rows2 = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert rows2[:3] == rows and rows2[3]["method"] == "basel"


def test_same_sweep_twice_gives_the_same_numbers(tmp_path, isolated_cache):
    a, b = tmp_path / "a", tmp_path / "b"
    for out in (a, b):
        list(make_sweep(out, methods=("fwsvd",)).run())
    rows = [[json.loads(line) for line in (d / "results.jsonl").read_text().splitlines()] for d in (a, b)]
    keys = ("method", "target", "params_total", "accuracy", "loss", "compressible_ratio")
    assert [[r[k] for k in keys] for r in rows[0]] == [[r[k] for k in keys] for r in rows[1]]


def test_a_folder_with_another_sweep_is_refused(tmp_path, isolated_cache):
    out = tmp_path / "sweep"
    list(make_sweep(out, methods=("svd",)).run())
    with pytest.raises(Exception, match="other settings"):
        Sweep(tiny_config(seed=1), ["svd"], [0.5], out)


def test_speed_is_measured_for_every_model(isolated_cache):
    model, tokenizer = load_model_and_tokenizer("tiny-random-llama")
    speeds = measure_speeds({"a": model, "b": model}, tokenizer, new_tokens=4, repeats=2)
    assert set(speeds) == {"a", "b"}
    assert all(s.tokens_per_s > 0 and s.ms_per_token >= 0 and s.new_tokens == 4 for s in speeds.values())


def test_compare_writes_one_column_per_model(tmp_path, isolated_cache, capsys):
    folder = tmp_path / "svd-model"
    config = make_config("smoke", {"skip_finetune": True, "eval_examples": 0, "recover": {"steps": 0},
                                   "compress": {"target_ratio": 0.5}})
    list(Pipeline(config, folder, method="svd").run())
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"question": "What is 2 + 3?"}\n{"prompt": "Name a color."}\n')
    out = tmp_path / "cmp"
    assert main(["compare", "--models", f"tiny-random-llama,{folder}", "--prompts", str(prompts),
                 "--out", str(out), "--max-new-tokens", "6"]) == 0
    result = json.loads((out / "compare.json").read_text())
    assert [m["name"] for m in result["models"]] == ["tiny-random-llama", str(folder)]
    assert all(len(m["outputs"]) == 2 for m in result["models"])
    assert result["models"][1]["params"] < result["models"][0]["params"]
    header = (out / "compare.md").read_text().splitlines()[0]
    assert header.count("|") == 4 and "M params" in header  # prompt column + one column per model
    assert "What is 2 + 3?" in capsys.readouterr().out


def test_sweep_flags_and_config_file_set_the_shared_schedule(tmp_path, isolated_cache):
    base = tiny_config(test_size=4)
    base.compress.rounds = 1
    config_file = tmp_path / "base.json"
    config_file.write_text(base.to_json())
    out = tmp_path / "s"
    assert main(["sweep", "--config", str(config_file), "--methods", "bsi", "--targets", "0.6", "--probes", "3",
                 "--sampling-ratio", "0.5", "--speed-repeats", "0", "--calibration-batches", "1", "--quiet",
                 "--curvature", "hutchinson",
                 "--out", str(out)]) == 0
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    compress = rows[0]["settings"]["config"]["compress"]
    assert (compress["rounds"], compress["probes_per_batch"], compress["sampling_ratio"]) == (1, 3, 0.5)
    assert rows[1]["method"] == "bsi" and abs(rows[1]["compressible_ratio"] - 0.6) <= 0.006
    assert compress["calibration_batches"] == 1 and compress["curvature"] == "hutchinson"
    assert "1 rounds of 8 iterations, the last 4 of each profiling (hutchinson curvature, 3 probe(s) per batch" \
        in (out / "results.md").read_text()


def test_truncation_baselines_recover_with_their_own_steps_and_lr(tmp_path, isolated_cache):
    """``--baseline-recover-*`` changes the truncation cells' recovery only, and the sweep says so."""
    out = tmp_path / "s"
    own = BaselineConfig(recover_steps=2, recover_lr=1e-2)
    sweep = Sweep(tiny_config(), ["svd", "basel"], [0.5], out, own, speed_repeats=0)
    assert (sweep.config_for("svd", 0.5).recover.steps, sweep.config_for("svd", 0.5).recover.lr) == (2, 1e-2)
    shared = tiny_config().recover
    assert sweep.config_for("basel", 0.5).recover == shared and shared.steps == 4
    starts = [r.detail for r in sweep.run() if isinstance(r, StageReport) and r.stage == "recover" and r.event == "start"]
    assert starts == ["2 steps, training factors", "4 steps, training factors"]  # svd's cell, then basel's
    assert "the truncation baselines (svd, svd-llm, fwsvd, asvd) instead: 2 steps at lr 0.01" in (out / "results.md").read_text()
    with pytest.raises(Exception, match="other settings"):  # another baseline recovery is another sweep
        Sweep(tiny_config(), ["svd"], [0.5], out, BaselineConfig(recover_steps=3))
    Sweep(tiny_config(), ["svd"], [0.5], out, own)  # the same one resumes


def test_sweep_settings_come_from_the_preset_unless_a_flag_gives_them():
    """``bsi sweep --preset sweep-cpu`` is the short CPU sweep: its grid and the baselines' recovery come with it."""
    from bsi.cli import build_parser
    from bsi.cli.sweep import given_or_preset
    from bsi.config import SWEEP_TARGETS

    def settings(*flags):
        return given_or_preset(build_parser().parse_args(["sweep", "--out", "x", *flags]))

    assert settings("--preset", "sweep-cpu") == {"targets": "0.6,0.4,0.25", "baseline_recover_steps": 64,
                                                 "baseline_recover_lr": 1e-4}
    assert settings("--preset", "sweep-cpu", "--targets", "0.5", "--baseline-recover-steps", "3") == {
        "targets": "0.5", "baseline_recover_steps": 3, "baseline_recover_lr": 1e-4}
    general = {"targets": ",".join(map(str, SWEEP_TARGETS)), "baseline_recover_steps": None,
               "baseline_recover_lr": None}
    assert settings() == general and settings("--preset", "smoke") == general
    assert settings("--config", "any.json") == general  # a config file names no preset


@pytest.mark.parametrize("args, message", [
    (["--methods", "svd,pca"], "unknown method 'pca'"),
    (["--baseline-recover-lr", "-1"], "the baselines' recover_lr must be positive"),
    (["--baseline-recover-steps", "-2"], "the baselines' recover_steps must be an integer >= 0"),
    (["--targets", "0.5,1.5"], "--targets must be numbers in (0, 1]"),
    (["--targets", "0.5,0.5"], "duplicates"),
])
def test_sweep_bad_inputs_give_one_line(tmp_path, capsys, args, message):
    assert main(["sweep", "--preset", "smoke", "--out", str(tmp_path / "s"), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "s").exists()


def test_compare_needs_an_existing_prompts_file(tmp_path, capsys):
    assert main(["compare", "--models", "tiny-random-llama", "--prompts", str(tmp_path / "none.txt")]) == 2
    assert "does not exist" in capsys.readouterr().err
