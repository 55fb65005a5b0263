"""The comparison study (bsi sweep): grid, seeds, protocols, learning-rate choice, outcomes, resume; bsi compare."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from bsi.analysis.speed import measure_speeds
from bsi.cli import main
from bsi.config import SweepConfig, make_config, make_sweep_config
from bsi.errors import BSIError
from bsi.models import load_model_and_tokenizer
from bsi.pipeline.runner import Pipeline
from bsi.pipeline.sweep import CellReport, LearningRateReport, Sweep
from bsi.reports import StageReport


def tiny_config(**over):
    return make_config("smoke", {"eval_examples": 4, "test_size": 6, "eval_loss_examples": 6, "max_new_tokens": 8,
                                 "compress": {"rounds": 3, "iters_per_epoch": 6}, **over})


def make_sweep(out, config=None, **settings):
    grid = {"methods": ("svd", "bsi"), "targets": (0.6, 0.4), **settings}
    return Sweep(config or tiny_config(), SweepConfig.from_dict(grid), out)


def rows_of(out):
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def test_sweep_writes_rows_outcomes_and_intervals_then_resumes_and_grows(tmp_path, isolated_cache):
    out = tmp_path / "sweep"
    reports = list(make_sweep(out, seeds=(0, 1)).run())
    cells = [r for r in reports if isinstance(r, CellReport)]
    assert [(c.row.method, c.row.target, c.row.seed) for c in cells] == [
        ("svd", 0.6, 0), ("svd", 0.4, 0), ("bsi", 0.6, 0), ("bsi", 0.4, 0),
        ("svd", 0.6, 1), ("svd", 0.4, 1), ("bsi", 0.6, 1), ("bsi", 0.4, 1)]
    # one compression per method and seed passes both sizes
    starts = [r.detail for r in reports if isinstance(r, StageReport) and r.stage == "compress" and r.event == "start"]
    assert starts == ["svd", "bsi (tuned)", "svd", "bsi (tuned)"]
    rows = rows_of(out)
    assert [(r["method"], r["seed"]) for r in rows[:2]] == [("dense", 0), ("dense", 1)]
    for r in rows[2:]:
        assert abs(r["compressible_ratio"] - r["target"]) <= 0.01 * r["target"]
        assert r["protocol"] == ("published" if r["method"] == "svd" else "tuned")
        outcomes = json.loads((out / r["outcomes"]).read_text())
        assert len(outcomes["tokens"]) == 6 and outcomes["correct"][4:] == [None, None]  # 4 answered, 6 scored
        assert r["examples"] == 4 and r["loss_examples"] == 6
        assert r["loss"] == pytest.approx(sum(outcomes["loss_sum"]) / sum(outcomes["tokens"]))
    stats = json.loads((out / "stats.json").read_text())
    svd = stats["protocols"]["tuned"]["methods"]["svd"]["0.4"]
    assert svd["seeds"] == [0, 1] and svd["accuracy"]["samples"] == 8 and svd["loss"]["samples"] == 12
    diff = svd["vs_anchor"]
    assert diff["loss"]["low"] <= diff["loss"]["estimate"] <= diff["loss"]["high"] and len(diff["per_seed"]["loss"]) == 2
    assert diff["over_seeds"]["loss"]["samples"] == 2  # the run-to-run view beside the problem bootstrap
    table = (out / "results.md").read_text()
    assert "## Protocol `tuned`" in table and "| `svd` |" in table and "`bsi` minus each method" in table
    assert '"name":"svd (published)"' in (out / "figure.html").read_text()

    # every cell done but the summaries lost (a run stopped as it wrote them): a re-run writes them, computing nothing
    (out / "results.md").unlink()
    rerun = list(make_sweep(out, seeds=(0, 1)).run())
    assert all(c.skipped for c in rerun if isinstance(c, CellReport)) and (out / "results.md").read_text() == table

    # the same sweep again, one method more: finished cells are skipped, only the new method runs
    again = list(make_sweep(out, seeds=(0, 1), methods=("svd", "bsi", "basel")).run())
    assert [c.row.method for c in again if isinstance(c, CellReport) and not c.skipped] == ["basel"] * 4
    starts = [r.detail for r in again if isinstance(r, StageReport) and r.stage == "compress" and r.event == "start"]
    assert starts == ["basel (tuned)", "basel (tuned)"]
    assert rows_of(out)[: len(rows)] == rows


def test_same_sweep_twice_gives_the_same_numbers_and_seeds_differ(tmp_path, isolated_cache):
    keys = ("method", "target", "seed", "params_total", "accuracy", "loss", "compressible_ratio")
    runs = []
    for name in ("a", "b"):
        list(make_sweep(tmp_path / name, methods=("fwsvd", "bsi"), targets=(0.5,), seeds=(0, 1)).run())
        runs.append([[r[k] for k in keys] for r in rows_of(tmp_path / name)])
    assert runs[0] == runs[1]
    by_seed = {(r[0], r[2]): r for r in runs[0]}
    assert by_seed[("bsi", 0)][5] != by_seed[("bsi", 1)][5]  # another seed: other splits, batches, probes


def test_learning_rate_is_chosen_on_validation_data_by_the_first_seed(tmp_path, isolated_cache):
    out = tmp_path / "s"
    config = tiny_config(validation_size=6)
    reports = list(make_sweep(out, config, targets=(0.6, 0.4, 0.2), seeds=(0, 1), lr_grid=(1e-4, 1e-2),
                              lr_targets=(0.6, 0.2)).run())
    choices = [r for r in reports if isinstance(r, LearningRateReport)]
    assert [(c.method, c.target) for c in choices] == [("svd", 0.6), ("svd", 0.2), ("bsi", 0.6), ("bsi", 0.2)]
    for c in choices:
        assert set(c.losses) == {1e-4, 1e-2} and c.chosen == min(c.losses, key=c.losses.get)
    rows = {(r["method"], r["target"], r["seed"]): r for r in rows_of(out)}
    for (method, target, seed), row in rows.items():
        if method == "dense":
            continue
        chosen_at = 0.6 if target >= 0.4 else 0.2  # 0.4 is nearer 0.6 in log size
        expected = next(c.chosen for c in choices if (c.method, c.target) == (method, chosen_at))
        assert row["recover_lr"] == expected
        assert row["lr_choice"]["chosen_here"] == (seed == 0 and target == chosen_at)
    # a later command for another seed alone reuses the choices recorded in the folder: it chooses nothing
    later = list(make_sweep(out, config, targets=(0.6, 0.4, 0.2), seeds=(2,), lr_grid=(1e-4, 1e-2),
                            lr_targets=(0.6, 0.2)).run())
    assert not [r for r in later if isinstance(r, LearningRateReport)]
    seed2 = [r for r in rows_of(out) if r["seed"] == 2 and r["method"] != "dense"]
    assert len(seed2) == 6 and not any(r["lr_choice"]["chosen_here"] for r in seed2)
    assert all(r["recover_lr"] == rows[(r["method"], r["target"], 0)]["recover_lr"] for r in seed2)
    with pytest.raises(Exception, match="validation set"):
        make_sweep(tmp_path / "t", tiny_config(), lr_grid=(1e-3,))


def test_protocols_give_the_engine_methods_their_settings_and_share_the_truncations(tmp_path, isolated_cache):
    out = tmp_path / "s"
    sweep = make_sweep(out, methods=("svd", "bsi"), targets=(0.5,), protocols=("tuned", "paper"))
    paper, tuned = sweep.config_for(0, "bsi", "paper"), sweep.config_for(0, "bsi", "tuned")
    assert (paper.compress.bases, paper.compress.selection_rule, paper.compress.curvature) == ("svd", "mass", "hutchinson")
    assert (tuned.compress.bases, tuned.compress.selection_rule, tuned.compress.curvature) == ("whitened", "global", "fisher")
    list(sweep.run())
    rows = rows_of(out)
    assert sorted((r["method"], r["protocol"]) for r in rows) == [
        ("bsi", "paper"), ("bsi", "tuned"), ("dense", "dense"), ("svd", "published")]  # svd once, in both tables
    table = (out / "results.md").read_text()
    assert table.count("| `svd` |") == 6  # per protocol: accuracy and loss, differences, training
    # every row records the training its model saw after the fine-tune: the engine's tuning path, then recovery
    made = {r["method"] + "/" + r["protocol"]: r for r in rows if r["method"] != "dense"}
    assert made["svd/published"]["path_steps"] == made["svd/published"]["path_tokens"] == 0  # computed, not trained
    config = sweep.config_for(0, "bsi", "tuned")
    assert 0 < made["bsi/tuned"]["path_steps"] <= config.compress.total_iters
    assert made["bsi/tuned"]["path_tokens"] > made["bsi/tuned"]["path_steps"]  # several tokens a step
    assert all(r["recover_tokens"] > r["recover_steps"] > 0 for r in made.values())
    assert f"| `bsi` | {made['bsi/tuned']['path_steps']} + {config.recover.steps} (" in table
    few = make_sweep(tmp_path / "few", methods=("svd", "bsi"), targets=(0.6, 0.4), protocols=("tuned", "paper"),
                     protocol_targets={"paper": (0.6,)})
    assert [c for c in few.cells() if c.startswith("paper/")] == ["paper/bsi@0.6/s0"]
    assert sum(c.startswith("tuned/") for c in few.cells()) == 2 and few.config_for(0, "bsi", "paper").compress.size.stops == ()
    assert "## Protocol `paper`" in table and "svd bases" in table


def test_a_named_variant_joins_an_existing_sweep_as_its_own_engine_method(tmp_path, isolated_cache):
    """bsi-mag is not in the default methods; named, it runs under the protocol with its within-layer choice,
    and an earlier sweep folder takes it without re-running what it holds."""
    assert "bsi-mag" not in SweepConfig().methods
    out = tmp_path / "s"
    list(make_sweep(out, methods=("bsi",), targets=(0.5,)).run())
    grown = make_sweep(out, methods=("bsi", "bsi-mag"), targets=(0.5,))
    assert grown.config_for(0, "bsi-mag", "tuned").compress.within_layer == "magnitude"
    assert grown.config_for(0, "bsi", "tuned").compress.within_layer == "score"
    reports = list(grown.run())
    ran = [r.row.method for r in reports if isinstance(r, CellReport) and not r.skipped]
    assert ran == ["bsi-mag"]
    assert sorted((r["method"], r["protocol"]) for r in rows_of(out)) == [
        ("bsi", "tuned"), ("bsi-mag", "tuned"), ("dense", "dense")]
    assert "| `bsi-mag` |" in (out / "results.md").read_text()


def test_a_folder_with_another_sweep_is_refused(tmp_path, isolated_cache):
    out = tmp_path / "sweep"
    list(make_sweep(out, methods=("svd",), targets=(0.5,)).run())
    with pytest.raises(Exception, match="other settings"):
        make_sweep(out, tiny_config(recover={"steps": 3}), methods=("svd",), targets=(0.5,))
    make_sweep(out, methods=("svd",), targets=(0.5,), seeds=(0, 1))  # more seeds: the same sweep, grown
    # where a seed runs is not the sweep's identity: rows record it, and one folder holds one precision
    assert {(r["device"], r["dtype"]) for r in rows_of(out)} == {("cpu", "float32")}
    make_sweep(out, tiny_config(dtype="float32"), methods=("svd",), targets=(0.5,), seeds=(1,))
    with pytest.raises(Exception, match="computed in float32, and this run would compute in bfloat16"):
        make_sweep(out, tiny_config(dtype="bfloat16"), methods=("svd",), targets=(0.5,), seeds=(1,))


def test_seeds_run_in_copies_of_a_folder_merge_back(tmp_path, isolated_cache):
    here, there = tmp_path / "here", tmp_path / "there"
    list(make_sweep(here, methods=("svd",), targets=(0.5,)).run())
    shutil.copytree(here, there)
    list(make_sweep(there, methods=("svd",), targets=(0.5,), seeds=(1,)).run())  # "another machine" runs seed 1
    merged = make_sweep(here, methods=("svd",), targets=(0.5,), seeds=(0, 1)).merge(there)
    assert merged == ["dense/dense@1/s1", "published/svd@0.5/s1"]
    assert rows_of(here) == rows_of(there)  # same rows, the dense references first
    assert (here / "outcomes" / "published-svd-0.5-s1.json").read_text() == \
        (there / "outcomes" / "published-svd-0.5-s1.json").read_text()
    stats = json.loads((here / "stats.json").read_text())
    assert stats["protocols"]["tuned"]["methods"]["svd"]["0.5"]["seeds"] == [0, 1]
    assert "Computed in float32: seeds 0, 1 on cpu." in (here / "results.md").read_text()
    assert make_sweep(here, methods=("svd",), targets=(0.5,)).merge(there) == []  # twice: nothing new

    rows = rows_of(there)  # the same cell recomputed elsewhere: other wall times, the same result
    rows[-1]["eval_seconds"] += 1.0
    (there / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert make_sweep(here, methods=("svd",), targets=(0.5,)).merge(there) == []

    before = (here / "results.jsonl").read_text()
    outcome = there / rows[-1]["outcomes"]
    kept = outcome.read_text()
    problems = json.loads(kept)
    problems["correct"][0] = not problems["correct"][0]  # one problem's outcome differs
    outcome.write_text(json.dumps(problems))
    with pytest.raises(Exception, match="is in both folders with different results"):
        make_sweep(here, methods=("svd",), targets=(0.5,)).merge(there)
    outcome.write_text(kept)
    rows[-1]["loss"] += 1.0
    (there / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(Exception, match="is in both folders with different results"):
        make_sweep(here, methods=("svd",), targets=(0.5,)).merge(there)
    other = tmp_path / "other"
    list(make_sweep(other, tiny_config(recover={"steps": 3}), methods=("svd",), targets=(0.5,), seeds=(2,)).run())
    with pytest.raises(Exception, match="other settings"):
        make_sweep(here, methods=("svd",), targets=(0.5,)).merge(other)
    assert (here / "results.jsonl").read_text() == before  # refused merges write nothing


def test_one_sweep_at_a_time_writes_a_folder_and_keeps_the_others_rows(tmp_path, isolated_cache):
    out = tmp_path / "sweep"
    late = make_sweep(out, methods=("svd",), targets=(0.5,))  # made before the other run writes anything
    first = make_sweep(out, methods=("svd",), targets=(0.5,)).run()
    next(first)  # the first run holds the folder from its first report on
    with pytest.raises(Exception, match=r"is in use by another bsi sweep \(process \d+\)"):
        next(make_sweep(out, methods=("svd",), targets=(0.5,)).run())
    with pytest.raises(Exception, match="is in use by another bsi sweep"):
        late.merge(out)
    list(first)  # it finishes and lets go
    written = rows_of(out)
    assert [r["method"] for r in written] == ["dense", "svd"]
    cells = [r for r in late.run() if isinstance(r, CellReport)]  # reads the folder again: nothing left to run
    assert cells and all(r.skipped for r in cells)
    assert rows_of(out) == written


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
    # the run compressed its source model (no fine-tune stage): that model, named here too, is its reference
    assert [m["name"] for m in result["models"]] == ["tiny-random-llama (reference)", str(folder)]
    assert all(len(m["outputs"]) == 2 for m in result["models"])
    assert result["models"][1]["params"] < result["models"][0]["params"]
    lines = (out / "compare.md").read_text().splitlines()
    assert lines[0].startswith("Reference: `tiny-random-llama`, the dense model") and "no fine-tune stage" in lines[0]
    header = lines[2]
    assert header.count("|") == 4 and "M params" in header  # prompt column + one column per model
    assert "What is 2 + 3?" in capsys.readouterr().out


def test_sweep_flags_and_the_preset_set_the_study(tmp_path, isolated_cache):
    from bsi.cli import build_parser
    from bsi.cli.sweep import settings_from_args

    def settings(*flags):
        return settings_from_args(build_parser().parse_args(["sweep", "--out", "x", *flags]))

    assert settings("--preset", "sweep-cpu") == make_sweep_config("sweep-cpu")
    given = settings("--preset", "sweep-cpu", "--targets", "0.5", "--seeds", "0,2", "--extra-targets", "bsi:0.1",
                     "--protocols", "paper", "--lr-grid", "1e-4,1e-3", "--allocation", "uniform")
    assert (given.targets, given.seeds, given.extra_targets, given.protocols, given.lr_grid) == (
        (0.5,), (0, 2), {"bsi": (0.1,)}, ("paper",), (1e-4, 1e-3))
    assert given.baseline == {"allocation": "uniform"} and given.targets_of("bsi") == (0.5, 0.1)
    base = tiny_config()
    config_file = tmp_path / "base.json"
    config_file.write_text(base.to_json())
    out = tmp_path / "s"
    assert main(["sweep", "--config", str(config_file), "--methods", "bsi", "--targets", "0.6", "--probes", "3",
                 "--sampling-ratio", "0.5", "--calibration-batches", "1", "--quiet", "--curvature", "hutchinson",
                 "--out", str(out)]) == 0
    compress = json.loads((out / "sweep.json").read_text())["config"]["compress"]
    assert (compress["probes_per_batch"], compress["sampling_ratio"], compress["calibration_batches"]) == (3, 0.5, 1)
    assert "hutchinson curvature" in (out / "results.md").read_text()


def test_match_training_gives_a_truncation_the_engine_paths_steps(tmp_path, isolated_cache):
    """Equal training: svd recovers for bsi's own tuning steps up to the size plus the common recovery."""
    out = tmp_path / "s"
    sweep = make_sweep(out, methods=("svd", "bsi"), targets=(0.6, 0.4), match_training="bsi")
    assert [m for _, m, _ in sweep.runs()] == ["bsi", "svd"]  # the matched method first, whatever the order asked
    list(sweep.run())
    rows = {(r["method"], r["target"]): r for r in rows_of(out) if r["method"] != "dense"}
    common = sweep.config.recover.steps
    for target in (0.6, 0.4):
        bsi, svd = rows[("bsi", target)], rows[("svd", target)]
        assert bsi["recover_steps"] == common and bsi["path_steps"] > 0 and svd["path_steps"] == 0
        assert svd["recover_steps"] == common + bsi["path_steps"]  # the same optimizer steps after the fine-tune
        assert svd["recover_tokens"] > bsi["recover_tokens"]
    assert rows[("bsi", 0.4)]["path_steps"] > rows[("bsi", 0.6)]["path_steps"]  # a deeper size: a longer path
    assert "also recovers for bsi's own tuning steps" in (out / "results.md").read_text()
    assert sweep.fingerprint() != make_sweep(tmp_path / "t", methods=("svd", "bsi"), targets=(0.6, 0.4)).fingerprint()
    with pytest.raises(BSIError, match="match_training must name an engine method"):
        SweepConfig(methods=("svd",), match_training="svd")
    # a size bsi does not run at has no path to match: said, not guessed
    alone = make_sweep(tmp_path / "u", methods=("svd", "bsi"), targets=(0.6,), extra_targets={"svd": (0.3,)},
                       match_training="bsi")
    with pytest.raises(BSIError, match="svd at 0.3 needs bsi's own training up to that size"):
        list(alone.run())


def test_a_budget_curve_gives_every_model_the_same_total_training(tmp_path, isolated_cache):
    """Budgets: own tuning + recovery = the budget for every row; the dense model trained too; bsi's path unchanged."""
    out = tmp_path / "curve"
    sweep = make_sweep(out, methods=("svd", "bsi"), targets=(0.6, 0.4), budgets=(12, 8), budget_targets=(0.4,))
    assert sweep.settings.budgets == (8, 12)
    reports = list(sweep.run())
    rows = rows_of(out)
    curve = {(r["method"], r["budget"]): r for r in rows if "budget" in r}
    assert sorted(curve) == [("bsi", 8), ("bsi", 12), ("dense-trained", 8), ("dense-trained", 12),
                             ("svd", 8), ("svd", 12)]
    for (method, budget), row in curve.items():
        assert row["path_steps"] + row["recover_steps"] == budget  # the same total training for every model
        assert row["target"] == (1.0 if method == "dense-trained" else 0.4)  # only the asked size is evaluated
    assert curve[("bsi", 8)]["path_steps"] > 0 and curve[("svd", 8)]["path_steps"] == 0
    assert curve[("dense-trained", 8)]["params_total"] == curve[("dense-trained", 8)]["params_before"]
    # more training moved the models: the two budgets' losses differ
    assert curve[("svd", 8)]["loss"] != curve[("svd", 12)]["loss"]
    # bsi's path is the one of the same sweep without budgets (0.6 is passed on the way, not evaluated)
    plain = make_sweep(tmp_path / "plain", methods=("bsi",), targets=(0.6, 0.4))
    list(plain.run())
    bsi_plain = next(r for r in rows_of(tmp_path / "plain") if r["method"] == "bsi" and r["target"] == 0.4)
    assert curve[("bsi", 8)]["path_steps"] == bsi_plain["path_steps"]
    assert curve[("bsi", 8)]["params_total"] == bsi_plain["params_total"]
    stats = json.loads((out / "stats.json").read_text())
    assert stats["budgets"] == [8, 12] and stats["targets"] == [0.4]
    svd = stats["curves"]["12"]["svd"]["0.4"]
    assert svd["training_steps"] == 12 and "vs_anchor" in svd
    assert stats["curves"]["8"]["dense-trained"]["1"]["training_steps"] == 8
    table = (out / "results.md").read_text()
    assert "### 0.4 of the linear layers kept" in table and "| 12 |" in table and "(0 + 12)" in table
    assert "a recovery up to each budget (8, 12 optimizer steps" in table
    assert "budget %{x} steps" in (out / "figure.html").read_text()
    # the dashboard's Compare tab and the answers view tell the budgets apart
    from bsi.analysis.answers import SweepAnswers
    from bsi.app.compare import view

    status, _, shown, headers = view(str(out))
    assert "budget curve" in status and headers[0] == "budget"
    assert {(r[0], r[1]) for r in shown} >= {("8 steps", "dense-trained"), ("12 steps", "svd"), ("12 steps", "bsi")}
    labels = [a.label for a in SweepAnswers(out).problem(0).answers]
    assert len(labels) == len(set(labels)) == 7 and any(label.endswith(", 12 steps)") for label in labels)
    # resumes: nothing computed again
    again = list(make_sweep(out, methods=("svd", "bsi"), targets=(0.6, 0.4), budgets=(8, 12),
                            budget_targets=(0.4,)).run())
    assert all(c.skipped for c in again if isinstance(c, CellReport))
    assert len([c for c in reports if isinstance(c, CellReport)]) == 6
    # a budget below a method's own tuning is refused before any of that size's models trains, with the fix
    with pytest.raises(BSIError, match=r"budget 4 is below bsi at 0.4's own 6 training steps .* at least 6"):
        sweep._budget_recovery(4, 6, "bsi at 0.4")
    assert sweep._budget_recovery(6, 6, "bsi at 0.4").steps == 0  # the model as its method left it


def test_budget_settings_refuse_what_a_curve_cannot_mean():
    with pytest.raises(BSIError, match="budgets must be positive integers"):
        SweepConfig(budgets=(0,))
    with pytest.raises(BSIError, match="give --budgets too"):
        SweepConfig(budget_targets=(0.4,))
    with pytest.raises(BSIError, match="budget_targets must be among the targets"):
        SweepConfig(targets=(0.6,), budgets=(8,), budget_targets=(0.4,))
    with pytest.raises(BSIError, match="pass --lr-grid none"):
        SweepConfig(budgets=(8,), lr_grid=(1e-4,))
    with pytest.raises(BSIError, match="leave --match-training out"):
        SweepConfig(methods=("svd", "bsi"), budgets=(8,), match_training="bsi")
    # a preset's learning-rate grid gives way to the budgets the user asked for
    settings = make_sweep_config("study", {"budgets": (16, 32), "targets": (0.6, 0.4), "budget_targets": (0.6, 0.4)})
    assert settings.lr_grid == () and settings.lr_targets == () and settings.budgets == (16, 32)


def test_narrowing_a_presets_sweep_narrows_what_depends_on_it():
    """Fewer targets or protocols than the preset's: its protocol targets and lr targets follow, never refuse."""
    from bsi.cli import build_parser
    from bsi.cli.sweep import settings_from_args

    def settings(*flags):
        return settings_from_args(build_parser().parse_args(["sweep", "--out", "x", "--preset", "study", *flags]))

    # the contest issue's command: one truncation, two sizes, one seed, the tuned protocol, no grid
    one = settings("--methods", "svd-llm", "--targets", "0.6,0.4", "--seeds", "0", "--protocols", "tuned",
                   "--lr-grid", "none")
    assert (one.protocol_targets, one.lr_grid, one.lr_targets, one.targets_of("svd-llm")) == ({}, (), (0.4,), (0.6, 0.4))
    both = settings("--targets", "0.25,0.15")  # paper keeps its one target still given; lr moves to the nearest
    assert both.protocol_targets == {"paper": (0.25,)} and both.lr_targets == (0.25, 0.15)
    assert both.targets_of("bsi", "paper") == (0.25,) and both.targets_of("bsi", "tuned") == (0.25, 0.15, 0.02)
    assert settings("--lr-targets", "0.6", "--targets", "0.6,0.4").lr_targets == (0.6,)  # what the user gave stays
    with pytest.raises(BSIError, match="--protocol-targets paper:R"):  # paper would run nowhere: the flag that fixes it
        settings("--targets", "0.15,0.05")
    assert settings("--targets", "0.15,0.05", "--protocols", "tuned").protocol_targets == {}


@pytest.mark.parametrize("args, message", [
    (["--methods", "svd,pca"], "--methods must be among"),
    (["--targets", "0.5,1.5"], "--targets must be numbers in (0, 1]"),
    (["--targets", "0.5,0.5"], "duplicates"),
    (["--seeds", "0,0"], "seeds must be distinct"),
    (["--seeds", "one"], "--seeds must be comma-separated int values"),
    (["--protocols", "mine"], "--protocols must be among tuned, paper"),
    (["--lr-grid", "1e-3"], "needs a validation set"),
    (["--lr-grid", "1e-3", "--validation-size", "4", "--lr-targets", "0.3"], "--lr-targets must be among the targets"),
    (["--extra-targets", "bsi=0.1"], "--extra-targets takes METHOD:RATIO"),
    (["--merge", "nowhere"], "--merge: 'nowhere' holds no sweep results"),
])
def test_sweep_bad_inputs_give_one_line(tmp_path, capsys, args, message):
    assert main(["sweep", "--preset", "smoke", "--out", str(tmp_path / "s"), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "s").exists()


def test_compare_needs_an_existing_prompts_file(tmp_path, capsys):
    assert main(["compare", "--models", "tiny-random-llama", "--prompts", str(tmp_path / "none.txt")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_every_study_setting_is_a_flag_generated_from_its_field():
    from bsi.cli import build_parser
    from bsi.cli.sweep import _LIST_KINDS, _PAIR_KEYS, NOT_FLAGS, settings_from_args, study_fields
    from bsi.config import SweepConfig

    fields = study_fields()
    assert {f.name for f in fields} | set(NOT_FLAGS) == {f.name for f in dataclasses.fields(SweepConfig)}
    for f in fields:  # each field's type has a flag form: a new field of another type needs one
        kind = str(f.type).replace(" ", "")
        assert kind in _LIST_KINDS or kind in ("bool", "int", "str") or f.name in _PAIR_KEYS, f.name
    args = build_parser().parse_args(["sweep", "--out", "x", "--preset", "study", "--protocol-targets",
                                      "paper:0.6,paper:0.4", "--speed-tokens", "8", "--no-also-unrecovered",
                                      "--match-training", "bsi"])
    settings = settings_from_args(args)
    assert settings.protocol_targets == {"paper": (0.6, 0.4)} and settings.speed_tokens == 8
    assert settings.match_training == "bsi"
    assert settings.also_unrecovered is False and settings.seeds == (0, 1, 2)  # the rest: the preset's


@pytest.mark.parametrize("name", ["study-quick", "text"])
def test_a_shipped_sweep_keeps_its_fingerprint_and_merges_with_a_copy_of_itself(name, tmp_path):
    """Rows written before the typed record (``StudyRow``) merge with this code: same fingerprint, same results.

    The text sweep's rows carry a NaN accuracy: the merge must still find each cell equal to itself.
    """
    from pathlib import Path

    from bsi.config import PipelineConfig

    shipped = Path(__file__).resolve().parents[1] / "data" / "sweeps" / name
    saved = json.loads((shipped / "sweep.json").read_text())
    here, there = tmp_path / "here", tmp_path / "there"
    for folder in (here, there):
        shutil.copytree(shipped, folder)
    before = (here / "results.jsonl").read_text()
    sweep = Sweep(PipelineConfig.from_dict(saved["config"]), SweepConfig.from_dict(saved["settings"]), here)
    assert sweep.fingerprint() == saved["fingerprint"] and all(r["fingerprint"] == saved["fingerprint"]
                                                               for r in map(json.loads, before.splitlines()))
    assert sweep.merge(there) == []  # every cell is in both folders with the same result
    assert (here / "results.jsonl").read_text() == before  # rewritten through the typed rows, byte for byte
