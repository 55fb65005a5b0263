"""Answers problem by problem, the equal-budget dense reference, fair and marked comparisons, and the shipped data.

Real runs of the tiny random Llama (the smoke preset, seconds): a run with
``dense_recovery`` and one without, a small sweep of two seeds, and the
folders ``bsi.shipped`` copies them to. The tiny model answers nothing right,
so the category tests check that the categories follow from the marks; the
marks themselves are checked against hand-made answers.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from bsi.analysis import answers
from bsi.analysis.answers import CATEGORIES, SweepAnswers, category, read_run_answers, rebuild_problems
from bsi.analysis.compare import Prompt, comparison_markdown, read_marked_prompts
from bsi.cli import main
from bsi.cli.commands import summary_table
from bsi.config import PRESET_COSTS, PRESETS, make_config, make_sweep_config
from bsi.errors import BSIError
from bsi.pipeline.compare import find_reference, run_reference
from bsi.pipeline.runner import Pipeline
from bsi.pipeline.sweep import Sweep, problems_file
from bsi.shipped import ship_run, ship_sweep, shipped_run, shipped_sweep
from bsi.units import duration

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def folders():
    """Two smoke runs (with and without the equal-budget dense reference) and a two-seed smoke sweep, one cache."""
    root = Path(tempfile.mkdtemp(prefix="bsi-answers-"))
    old = os.environ.get("BSI_CACHE")
    os.environ["BSI_CACHE"] = str(root / "cache")
    torch.set_num_threads(1)
    try:
        for name, overrides in (("same", {"dense_recovery": True}), ("plain", {})):
            for _ in Pipeline(make_config("smoke", overrides), out_dir=root / name).run():
                pass
        settings = {"methods": ("bsi", "basel"), "targets": (0.6,)}
        for seed in (0, 1):
            sweep = Sweep(make_config("smoke"), make_sweep_config(None, settings | {"seeds": (seed,)}),
                          root / f"sweep-s{seed}")
            for _ in sweep.run():
                pass
        yield root
    finally:
        if old is None:
            os.environ.pop("BSI_CACHE")
        else:
            os.environ["BSI_CACHE"] = old
        shutil.rmtree(root, ignore_errors=True)


# ------------------------------------------------------------------ the equal-budget dense reference
def test_dense_recovery_adds_the_reference_and_leaves_the_compressed_model_alone(folders):
    same = json.loads((folders / "same" / "summary.json").read_text())
    plain = json.loads((folders / "plain" / "summary.json").read_text())
    assert same["metrics_after"] == plain["metrics_after"]  # the random state is restored around the extra training
    assert same["metrics_before"] == plain["metrics_before"]
    assert "metrics_dense_recovered" in same and "metrics_dense_recovered" not in plain
    assert same["metrics_dense_recovered"]["loss"] != same["metrics_before"]["loss"]  # it trained
    assert set(same["paired"]) == {"recovered - finetuned", "recovered - dense_recovered"}
    assert set(plain["paired"]) == {"recovered - finetuned"}
    entry = same["paired"]["recovered - dense_recovered"]["loss"]
    assert entry["low"] <= entry["estimate"] <= entry["high"]
    assert entry["estimate"] == pytest.approx(same["metrics_after"]["loss"] - same["metrics_dense_recovered"]["loss"])
    lines = [json.loads(line) for line in (folders / "same" / "outcomes.jsonl").read_text().splitlines()]
    assert {line["model"] for line in lines} == {"finetuned", "dense_recovered", "recovered"}
    assert all(line["reference_answer"].rstrip().rsplit("\n", 1)[-1].startswith("####") for line in lines)
    import gzip

    with gzip.open(folders / "same" / "rounds-layers.jsonl.gz", "rt") as handle:
        records = [json.loads(line) for line in handle]
    ranks = [json.loads(line)["ranks"] for line in (folders / "same" / "rounds.jsonl").read_text().splitlines()]
    assert [{layer["name"]: layer["rank_after"] for layer in r["layers"]} for r in records] == ranks
    steps = [json.loads(line) for line in (folders / "same" / "steps.jsonl").read_text().splitlines()]
    recover = same["config"]["recover"]["steps"]
    assert [s["step"] for s in steps if s["stage"] == "dense-recover"] == list(range(1, recover + 1))
    assert [s["step"] for s in steps if s["stage"] == "recover"] == list(range(1, recover + 1))
    table = summary_table(same)
    steps = same["config"]["recover"]["steps"]
    assert f"dense + {steps} steps" in table and f"after - dense + {steps} steps: accuracy" in table


def test_dense_recovery_needs_recovery_steps_training_factors():
    for overrides in ({"recover": {"steps": 0}}, {"recover": {"train": "sigma"}}):
        with pytest.raises(BSIError, match="dense_recovery trains the dense model as recovery"):
            make_config("smoke", {"dense_recovery": True, **overrides})
    with pytest.raises(BSIError, match="a setting of `bsi compress`"):
        Sweep(make_config("smoke", {"dense_recovery": True}), make_sweep_config(None), tempfile.mkdtemp())


# ------------------------------------------------------------------ a run's answers
def test_categories_follow_from_the_two_marks():
    assert [category(d, c) for d, c in ((True, False), (False, True), (True, True), (False, False))] == list(CATEGORIES)
    assert category(None, True) is None and category(True, None) is None


def test_a_runs_answers_with_both_references(folders):
    run = read_run_answers(folders / "same")
    lines = [json.loads(line) for line in (folders / "same" / "outcomes.jsonl").read_text().splitlines()]
    compressed = {line["index"]: line for line in lines if line["model"] == "recovered"}
    assert len(run.rows) == len(compressed) and sum(run.counts().values()) == len(run.rows)
    for row in run.rows:
        assert row.answer == compressed[row.index]["prediction"] and row.correct == compressed[row.index]["correct"]
        assert row.question == compressed[row.index]["question"] and row.reference_answer.endswith(
            row.reference_answer.rsplit("#### ", 1)[1])
        assert row in run.only(row.category)
    assert sum(len(run.only(c)) for c in CATEGORIES) == len(run.rows)
    assert "same recovery steps" in read_run_answers(folders / "same", "dense_recovered").reference_label
    with pytest.raises(BSIError, match="run it again with --dense-recovery"):
        read_run_answers(folders / "plain", "dense_recovered")
    with pytest.raises(BSIError, match="unknown category 'lots'"):
        run.only("lots")


def test_an_old_run_without_reference_answers_still_reads(folders, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(folders / "plain", old)
    lines = [json.loads(line) for line in (old / "outcomes.jsonl").read_text().splitlines()]
    (old / "outcomes.jsonl").write_text("".join(json.dumps({k: v for k, v in line.items() if k != "reference_answer"})
                                                + "\n" for line in lines))
    rows = read_run_answers(old).rows
    assert rows and all(row.reference_answer is None and row.question for row in rows)


def test_folders_that_hold_no_answers_say_what_to_give(folders, tmp_path):
    with pytest.raises(BSIError, match="holds no outcomes.jsonl .*finished `bsi compress` run"):
        read_run_answers(tmp_path)
    with pytest.raises(BSIError, match="a sweep: use --problem N"):
        read_run_answers(folders / "sweep-s0")
    with pytest.raises(BSIError, match="no results.jsonl.*a run: use `bsi answers RUN`"):
        SweepAnswers(folders / "plain")
    text = tmp_path / "text"  # a sweep whose outcomes hold losses only (a text task)
    shutil.copytree(folders / "sweep-s0", text)
    for path in (p for p in (text / "outcomes").glob("*-s0.json") if not p.name.startswith("problems")):
        columns = json.loads(path.read_text())
        path.write_text(json.dumps(columns | {"correct": [None] * len(columns["correct"]),
                                              "prediction": [None] * len(columns["correct"])}))
    with pytest.raises(BSIError, match="holds no answers"):
        SweepAnswers(text)


# ------------------------------------------------------------------ a sweep's answers
def test_a_sweep_stores_its_problems_and_shows_every_models_answer(folders):
    sweep = SweepAnswers(folders / "sweep-s0")
    config = json.loads((folders / "sweep-s0" / "sweep.json").read_text())["config"]
    stored = json.loads((folders / "sweep-s0" / problems_file(0)).read_text())
    assert stored == {k: v[: len(stored["question"])] for k, v in rebuild_problems(config, 0).items()}
    problem = sweep.problem(3)
    assert problem.question == stored["question"][3] and problem.reference_answer == stored["answer"][3]
    assert [a.label.split(" @")[0] for a in problem.answers] == ["dense", "bsi", "basel"]
    for a in problem.answers:
        row = next(r for r in sweep.rows if r.method == a.method and r.target == a.target)
        columns = json.loads((folders / "sweep-s0" / row.outcomes).read_text())
        assert a.answer == columns["prediction"][3] and a.correct == columns["correct"][3]
    wins = sweep.beats("bsi", ["basel"], 0.6)
    bsi, basel = (sweep.columns(sweep._row(m, 0.6, 0))["correct"] for m in ("bsi", "basel"))
    assert wins == [i for i in range(len(bsi)) if bsi[i] and basel[i] is False]
    with pytest.raises(BSIError, match="is not among seed 0's"):
        sweep.problem(10_000)
    with pytest.raises(BSIError, match="holds no method 'svd'"):
        sweep.beats("bsi", ["svd"], 0.6)
    with pytest.raises(BSIError, match=r"holds no bsi model at 0.4 for seed 0 \(bsi.s sizes: 0.6\)"):
        sweep.beats("bsi", ["basel"], 0.4)


# ------------------------------------------------------------------ the shipped data
def test_shipping_a_sweep_then_merging_a_seed_into_it(folders, tmp_path):
    source = tmp_path / "old-sweep"  # a sweep made before sweeps stored their problems
    shutil.copytree(folders / "sweep-s0", source)
    stored = json.loads((source / problems_file(0)).read_text())
    (source / problems_file(0)).unlink()
    shipped = ship_sweep(source, "tiny", "bsi sweep --preset smoke", root=tmp_path / "data")
    assert shipped_sweep("tiny", tmp_path / "data") == shipped
    assert json.loads((shipped / problems_file(0)).read_text()) == stored  # rebuilt from the configuration
    assert not (shipped / "figure.html").exists() and not (shipped / "sweep.lock").exists()
    assert (shipped / "command.txt").read_text().startswith("bsi sweep --preset smoke\n")
    settings = make_sweep_config(None, {"methods": ("bsi", "basel"), "targets": (0.6,), "seeds": (0, 1)})
    added = Sweep(make_config("smoke"), settings, shipped).merge(folders / "sweep-s1")
    assert sorted(added) == ["dense/dense@1/s1", "tuned/basel@0.6/s1", "tuned/bsi@0.6/s1"]
    merged = SweepAnswers(shipped)
    assert merged.seeds == [0, 1] and merged.problem(2, seed=1).question is not None
    assert "Seeds 0, 1;" in (shipped / "results.md").read_text()  # the tables were rewritten over both seeds


def test_shipping_a_run_keeps_no_weights(folders, tmp_path):
    shipped = ship_run(folders / "same", "smoke", "bsi compress --preset smoke --dense-recovery", root=tmp_path)
    assert shipped_run("smoke", tmp_path) == shipped
    assert sorted(p.name for p in shipped.iterdir()) == ["command.txt", "outcomes.jsonl", "rounds-layers.jsonl.gz",
                                                         "rounds.jsonl", "steps.jsonl", "summary.json"]
    import gzip

    with gzip.open(folders / "same" / "rounds-layers.jsonl.gz", "rt") as full, \
            gzip.open(shipped / "rounds-layers.jsonl.gz", "rt") as short:
        for a, b in zip(full, short):
            a, b = json.loads(a), json.loads(b)
            assert [x["name"] for x in a["layers"]] == [x["name"] for x in b["layers"]]
            assert a["layers"][0]["basis_ids"] == b["layers"][0]["basis_ids"]  # integers stay exact
            assert b["layers"][0]["sigma"] == pytest.approx(a["layers"][0]["sigma"], rel=1e-3)
    assert read_run_answers(shipped).counts() == read_run_answers(folders / "same").counts()
    with pytest.raises(BSIError, match="is not a finished run"):
        ship_run(tmp_path, "nothing", "-", root=tmp_path / "data")


# ------------------------------------------------------------------ the command line
def test_bsi_answers_on_a_run_and_a_sweep(folders, capsys):
    assert main(["answers", str(folders / "same"), "--only", "both-wrong"]) == 0
    out = capsys.readouterr().out
    counts = read_run_answers(folders / "same").counts()
    assert "reference: the run's fine-tuned dense model" in out
    assert f"both-wrong {counts['both-wrong']:>4}" in out and f"{counts['both-wrong']} problem(s) of category" in out
    assert main(["answers", str(folders / "same"), "--reference", "dense_recovered"]) == 0
    assert "trained with the same recovery steps" in capsys.readouterr().out
    assert main(["answers", str(folders / "sweep-s0"), "--problem", "1"]) == 0
    out = capsys.readouterr().out
    assert "seed 0, problem #1:" in out and "task's answer:" in out and "bsi @ 0.6" in out
    assert main(["answers", str(folders / "sweep-s0"), "--method", "bsi", "--beats", "basel", "--size", "0.6"]) == 0
    assert "problem(s) that bsi answers right and basel all answer wrong" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["--only", "lost"], "--only filters a run's answers"),
    ([], "is a sweep (methods bsi, basel; seeds 0;"),
    (["--method", "bsi", "--size", "0.6"], "go together: add --beats"),
])
def test_bsi_answers_on_a_sweep_says_what_to_give(folders, capsys, args, message):
    assert main(["answers", str(folders / "sweep-s0"), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------ bsi compare: reference and marks
def test_the_example_prompts_carry_their_answers():
    prompts = read_marked_prompts(ROOT / "examples" / "prompts.jsonl")
    by_hand = [6 * 14 - 59, 180 // 12, 40 - (27 - 9), 20 - (3 * 4 + 2), 8 * 15 - 8 * 15 // 3]
    assert [p.gold for p in prompts if p.answer is not None] == [str(n) for n in by_hand]
    assert [p.gold for p in prompts if p.answer is None] == [None, None]  # the open prompts stay unmarked
    first = prompts[0]
    assert first.marks("6 x 14 = 84, 84 - 59 = 25\n#### 25") is True and first.marks("#### 24") is False
    assert Prompt("open question").marks("anything") is None


@pytest.mark.parametrize("line, message", [
    ('{"question": "q", "answer": "about half"}', "line 1: the answer \"about half\" has no final number"),
    ('{"question": "q", "answer": true}', "line 1: the answer true has no final number"),
    ('{"answer": "#### 3"}', "line 1 has no 'question' or 'prompt' text"),
])
def test_malformed_prompt_files_answer_in_one_line(tmp_path, line, message):
    path = tmp_path / "prompts.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(BSIError, match=message.replace("(", r"\(")):
        read_marked_prompts(path)


def test_compare_uses_the_runs_fine_tuned_model_as_reference(folders, capsys):
    reference = run_reference(folders / "plain")
    assert Path(reference.model).parent.name == "finetuned" and (Path(reference.model) / "config.json").is_file()
    assert find_reference([str(folders / "plain"), "tiny-random-llama"]) == reference
    assert find_reference(["tiny-random-llama"]) is None
    assert main(["compare", "--models", str(folders / "plain"), "--prompts", str(ROOT / "examples" / "prompts.jsonl"),
                 "--max-new-tokens", "4"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"Reference: the fine-tuned dense model of `{folders / 'plain'}`")
    assert "task's answer" in out and out.count("**wrong**") + out.count("**right**") == 10
    assert "| marked prompts |  | **" in out
    result = {"reference": None, "prompts": ["q"], "answers": [None],
              "models": [{"name": "m", "params": 1e6, "outputs": ["a"], "correct": [None]}]}
    assert comparison_markdown(result).startswith("Reference: none (no run folder among the models)")


def test_compare_refuses_a_reference_that_is_not_a_run_before_loading(folders, tmp_path, capsys):
    code = main(["compare", "--models", "tiny-random-llama", "--reference", str(tmp_path), "--prompts",
                 str(ROOT / "examples" / "prompts.jsonl")])
    err = capsys.readouterr().err
    assert code == 2 and "is not a run folder (no summary.json)" in err and len(err.strip().splitlines()) == 1
    empty_cache = tmp_path / "cache"
    with pytest.raises(BSIError, match="is not in this machine's cache"):
        run_reference(folders / "plain", cache_dir=empty_cache)


# ------------------------------------------------------------------ what each preset costs
def test_every_preset_states_its_measured_cost_or_none():
    assert set(PRESET_COSTS) == set(PRESETS)
    for cost in PRESET_COSTS.values():
        assert cost.command in ("bsi compress", "bsi sweep") and cost.gives_up
        measured = [s for s in (cost.warm_seconds, cost.cached_seconds, cost.uncached_seconds) if s is not None]
        assert all(s > 0 for s in measured) and (cost.measured is not None) == bool(measured)
        assert measured == sorted(measured)  # each cache takes work away: warm <= fine-tune cached <= empty
        assert (cost.time_text() == "not measured") == (not measured)
    tour = PRESET_COSTS["tour"]
    assert tour.time_text().startswith(f"{duration(tour.warm_seconds)} with the fine-tune and the conversion cached, "
                                       f"{duration(tour.cached_seconds)} with the fine-tune cached, ")
    assert tour.prepare_seconds and tour.prepare_seconds < tour.cached_seconds


def test_the_answers_module_needs_no_torch():
    import subprocess
    import sys

    code = "import sys, bsi.analysis.answers, bsi.shipped; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
    assert answers.SWEEP_REFERENCE == __import__("bsi.analysis.study", fromlist=["REFERENCE"]).REFERENCE


# ------------------------------------------------------------------ what data/ holds
SHIPPED_SWEEPS = sorted(p.name for p in (ROOT / "data" / "sweeps").glob("*") if (p / "results.jsonl").is_file())
SHIPPED_RUNS = sorted(p.name for p in (ROOT / "data" / "runs").glob("*") if (p / "summary.json").is_file())


def assert_same_numbers(got, shipped, path: str = "stats", rel: float = 1e-12) -> None:
    """Two JSON trees alike: the same keys, strings and whole numbers, and floats equal to ``rel`` (NaN to NaN).

    A bootstrap sum of losses is one matrix-vector product (``bsi.analysis.stats._resample_sums``), and BLAS
    adds its terms in an order that depends on the CPU's vector kernels: the same rows give intervals that differ
    in the last one or two bits on an Intel Xeon and an AMD EPYC (20.890270974364874 against ...892). Whole
    numbers (right-or-wrong marks) are exact everywhere, and so are the tables, rounded to a few decimals.
    """
    if isinstance(shipped, dict):
        assert isinstance(got, dict) and got.keys() == shipped.keys(), path
        for key in shipped:
            assert_same_numbers(got[key], shipped[key], f"{path}.{key}", rel)
    elif isinstance(shipped, list):
        assert isinstance(got, list) and len(got) == len(shipped), path
        for i, (a, b) in enumerate(zip(got, shipped)):
            assert_same_numbers(a, b, f"{path}[{i}]", rel)
    elif isinstance(shipped, float) and not isinstance(got, bool):
        assert isinstance(got, (int, float)), path
        assert (math.isnan(got) and math.isnan(shipped)) or math.isclose(got, shipped, rel_tol=rel), (path, got, shipped)
    else:
        assert type(got) is type(shipped) and got == shipped, (path, got, shipped)


@pytest.mark.parametrize("name", SHIPPED_SWEEPS)
def test_a_shipped_sweeps_tables_come_from_its_rows_and_outcomes(name, tmp_path):
    """The statistics and tables shipped (and generated into docs/results/) are what the rows and outcomes give."""
    from bsi.config import PipelineConfig, SweepConfig
    from bsi.shipped import study_tables

    shipped = ROOT / "data" / "sweeps" / name
    copy = tmp_path / name
    shutil.copytree(shipped, copy)
    saved = json.loads((shipped / "sweep.json").read_text())
    here = saved["config"] | {"device": "cpu"}  # rows made on a GPU are recomputed here from their files alone
    sweep = Sweep(PipelineConfig.from_dict(here), SweepConfig.from_dict(saved["settings"]), copy)
    sweep.write()  # statistics and tables again, from the shipped rows and outcome files
    assert_same_numbers(json.loads((copy / "stats.json").read_text()), json.loads((shipped / "stats.json").read_text()))
    assert (copy / "results.md").read_text() == (shipped / "results.md").read_text()
    assert study_tables(name) == (shipped / "results.md").read_text().strip()
    if any(json.loads(line).get("perplexity") is not None for line in (shipped / "results.jsonl").open()):
        return  # a text sweep: per-window losses, which the tables above were recomputed from; no answers
    answers = SweepAnswers(shipped)
    for seed in answers.seeds:  # every seed's problems, every row's answers
        problem = answers.problem(answers.problem_count(seed) - 1, seed)
        assert problem.question and problem.reference_answer and len(problem.answers) == sum(
            r.seed == seed and bool(r.outcomes) for r in answers.rows)


@pytest.mark.parametrize("name", SHIPPED_RUNS)
def test_a_shipped_run_reads_back_as_its_summary_says(name):
    folder = ROOT / "data" / "runs" / name
    summary = json.loads((folder / "summary.json").read_text())
    assert not list(folder.glob("*.safetensors"))  # no weights ship
    if summary["task"] == "text":  # per-window losses, no answers: they add up to each model's mean loss
        lines = [json.loads(line) for line in (folder / "outcomes.jsonl").read_text().splitlines()]
        for model, metrics in (("finetuned", "metrics_before"), ("recovered", "metrics_after"),
                               ("dense_recovered", "metrics_dense_recovered")):
            windows = [line for line in lines if line["model"] == model]
            assert len(windows) == summary[metrics]["loss_examples"]
            mean = sum(w["loss_sum"] for w in windows) / sum(w["tokens"] for w in windows)
            assert mean == pytest.approx(summary[metrics]["loss"], rel=1e-6)
        return
    run = read_run_answers(folder)
    dense, compressed = run.accuracy()
    assert dense == pytest.approx(summary["metrics_before"]["accuracy"])
    assert compressed == pytest.approx(summary["metrics_after"]["accuracy"])
    counts = run.counts()
    assert counts["gained"] - counts["lost"] == round((compressed - dense) * len(run.rows))
    assert not list(folder.glob("*.safetensors"))  # no weights ship


def test_the_shipped_study_quick_has_every_method_on_both_seeds_and_views_open_on_the_fullest():
    """Seeds 0 (2-core CPU, resumed) and 1 (H200) each hold the four methods; a view across methods finds them all."""
    sweep = answers.read_sweep_answers(ROOT / "data" / "sweeps" / "study-quick")
    assert sweep.seeds == [0, 1]
    assert all(set(sweep.methods_of(seed)) == set(sweep.methods) for seed in sweep.seeds)
    assert set(sweep.methods) == {"bsi", "basel", "svd-llm", "bsi-grad"}
    assert sweep.fullest_seed == 0  # a tie: the first seed
    wins = sweep.beats("bsi", ["basel", "svd-llm"], 0.4, sweep.fullest_seed)  # every method is there to compare
    assert all(0 <= i < sweep.problem_count(0) for i in wins)


def test_a_partly_run_seed_is_not_where_a_view_across_methods_opens(tmp_path):
    """Without seed 0's svd-llm rows (as the sweep stood when stopped) the views open on seed 1, which has them all."""
    shipped = ROOT / "data" / "sweeps" / "study-quick"
    partial = tmp_path / "partial"
    shutil.copytree(shipped, partial)
    rows = [line for line in (partial / "results.jsonl").read_text().splitlines() if line.strip()]
    kept = [line for line in rows if not (json.loads(line)["method"] == "svd-llm" and json.loads(line)["seed"] == 0)]
    assert len(kept) < len(rows)
    (partial / "results.jsonl").write_text("\n".join(kept) + "\n")
    sweep = answers.read_sweep_answers(partial)
    assert "svd-llm" not in sweep.methods_of(0) and sweep.fullest_seed == 1
