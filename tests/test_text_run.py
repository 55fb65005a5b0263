"""Text tasks through the whole tool: `bsi compress`, resume, `bsi sweep` with rows before recovery, the app.

Everything runs on the tiny random Llama (byte-level tokenizer: one token per
byte, context 512) with the smoke preset and the packaged WikiText-2, in
windows of 64 tokens.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from bsi.analysis.study import folder_loader, study_stats
from bsi.app import compare, spectra
from bsi.app.form import Form, build_config, upload_message, validate_upload
from bsi.app.job import run_job
from bsi.app.state import JobBoard, Session
from bsi.cli import main
from bsi.config import PRESETS, SWEEP_PRESETS, make_config, make_sweep_config
from bsi.data import WIKITEXT_2, set_aside_windows, wikitext_2_folder
from bsi.errors import BSIError
from bsi.models import build_tiny_model
from bsi.pipeline.perplexity import measure_perplexity
from bsi.pipeline.runner import Pipeline, finetune_cache_key
from bsi.reports import RoundReport
from bsi.results import read_study_rows

TEXT = ["--preset", "smoke", "--data", "wikitext-2", "--window", "64", "--eval-windows", "8", "--quiet"]


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# ------------------------------------------------------------------ bsi compress on WikiText-2


def test_compress_on_wikitext_2_records_the_perplexity_and_its_protocol(tmp_path, isolated_cache, capsys):
    out = tmp_path / "wt2"
    assert main(["compress", *TEXT, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    before, after = summary["metrics_before"], summary["metrics_after"]
    assert summary["task"] == "text" and math.isnan(before["accuracy"]) and before["examples"] == 0
    for metrics in (before, after):  # the loss is the mean next-token NLL, the perplexity exp of it
        assert metrics["loss_examples"] == 8 and metrics["perplexity"] == pytest.approx(math.exp(metrics["loss"]))
    perplexity = summary["perplexity"]
    assert (perplexity["before"], perplexity["after"]) == (before["perplexity"], after["perplexity"])
    protocol = perplexity["protocol"]
    assert protocol["release"].startswith("WikiText-2, tokenized release") and protocol["held_out_part"] == "test.txt"
    assert (protocol["window"], protocol["stride"], protocol["windows"]) == (64, 64, 8)
    assert protocol["tokens_scored"] == 8 * 63  # each window's first token is context only
    assert "first token is context only" in protocol["first_token"] and "no BOS" in protocol["document_boundaries"]
    assert protocol["windows_in_stream"] > 1000 and "exp(loss)" in perplexity["loss"]
    assert perplexity["text_task"]["train_part"] == "valid.txt" and perplexity["text_task"]["validation_windows"] == 0

    # one outcome per held-out window and evaluated model, adding up to the loss
    outcomes = _lines(out / "outcomes.jsonl")
    recovered = [o for o in outcomes if o["model"] == "recovered"]
    assert len(recovered) == 8 and {o["tokens"] for o in recovered} == {63} and {o["correct"] for o in outcomes} == {None}
    assert sum(o["loss_sum"] for o in recovered) / (8 * 63) == pytest.approx(after["loss"])

    # it ships without its weights, its per-window losses checked (a text run answers nothing)
    from bsi.shipped import ship_run

    shipped = ship_run(out, "wt2", "bsi compress --preset text", root=tmp_path / "data")
    assert (shipped / "outcomes.jsonl").read_text() == (out / "outcomes.jsonl").read_text()
    assert not list(shipped.glob("*.safetensors")) and (shipped / "command.txt").is_file()
    broken = tmp_path / "broken"  # the compressed model's windows missing
    shutil.copytree(out, broken, ignore=shutil.ignore_patterns("*.safetensors"))
    (broken / "outcomes.jsonl").write_text("".join(line + "\n" for line in (out / "outcomes.jsonl").read_text()
                                                   .splitlines() if '"recovered"' not in line))
    with pytest.raises(BSIError, match="not a readable text outcome file"):
        ship_run(broken, "wt2-broken", "bsi compress --preset text", root=tmp_path / "data")

    # the closing table speaks perplexity and states the protocol
    assert "perplexity" in printed and "accuracy" not in printed and "mean next-token loss" in printed
    assert "tokenized release" in printed and "504 tokens scored in the first 8 of" in printed

    # the saved model scores the same with `bsi eval --perplexity` on the same windows
    assert main(["eval", "--perplexity", "--model", str(out), "--window", "64", "--max-windows", "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["perplexity"] == pytest.approx(after["perplexity"], rel=1e-5)

    # stage 1 lowered the held-out loss: the dense model before fine-tuning, on the same windows, scores worse
    model, tokenizer = build_tiny_model()
    text = (wikitext_2_folder() / "test.txt").read_text(encoding="utf-8")
    stream = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"])
    base = measure_perplexity(model, stream, window=64, max_windows=8)
    assert base.tokens_scored == protocol["tokens_scored"] and before["loss"] < base.mean_nll


def test_the_text_preset_is_wikitext_2_with_a_stated_evaluation_and_every_method_in_its_sweep():
    config = make_config("text")
    assert (config.data, config.window, config.eval_windows, config.model) == (WIKITEXT_2, 128, 256,
                                                                               "smollm2-135m-instruct")
    study = make_sweep_config("text")
    assert study.targets == (0.8, 0.6, 0.4) and len(study.methods) == 7 and study.also_unrecovered
    assert "text" in PRESETS and "text" in SWEEP_PRESETS


def test_the_fine_tune_cache_key_follows_what_makes_the_training_windows():
    text = make_config("smoke", {"data": "wikitext-2", "window": 64})
    key = finetune_cache_key(text, torch.float32)
    for change in ({"window": 32}, {"held_out_fraction": 0.2}, {"validation_size": 4}, {"train_size": 100},
                   {"text_field": "body"}, {"seed": 1}):
        assert finetune_cache_key(make_config("smoke", {"data": "wikitext-2", "window": 64, **change}),
                                  torch.float32) != key, change
    # a question/answer task's key does not move with the text settings
    qa = finetune_cache_key(make_config("smoke"), torch.float32)
    assert finetune_cache_key(make_config("smoke", {"window": 64, "eval_windows": 3}), torch.float32) == qa != key


def test_validation_windows_are_the_last_training_windows_never_held_out_text(isolated_cache):
    windows = torch.arange(40).view(10, 4)
    train, validation = set_aside_windows(windows, 3, cap=5)
    assert train.tolist() == windows[:5].tolist() and validation.tolist() == windows[7:].tolist()
    with pytest.raises(BSIError, match="too few to set 10 aside"):
        set_aside_windows(windows, 10)

    pipeline = Pipeline(make_config("smoke", {"data": "wikitext-2", "window": 64, "validation_size": 5}))
    pipeline.load()
    all_windows = pipeline.text.train_windows
    assert torch.equal(pipeline.validation_windows, all_windows[-5:])
    assert torch.equal(pipeline.train_windows, all_windows[:-5])
    assert torch.equal(next(pipeline.stream(1))["labels"], next(pipeline.stream(1))["input_ids"])
    loss, count = pipeline.validation_loss()  # the mean next-token loss of those windows, each scored on its own
    assert count == 5
    expected = measure_perplexity(pipeline.model, all_windows[-5:].reshape(-1), window=64).mean_nll
    assert loss == pytest.approx(expected)


# ------------------------------------------------------------------ resume


def test_an_interrupted_text_run_resumes_to_the_same_result(tmp_path, isolated_cache):
    args = [*TEXT, "--rounds", "3", "--iters-per-epoch", "12"]
    assert main(["compress", *args, "--out", str(tmp_path / "whole")]) == 0
    expected = json.loads((tmp_path / "whole" / "summary.json").read_text())

    out = tmp_path / "stopped"
    config = make_config("smoke", {"data": "wikitext-2", "window": 64, "eval_windows": 8,
                                   "compress": {"rounds": 3, "iters_per_epoch": 12}})
    reports = Pipeline(config, out_dir=out).run()
    for report in reports:
        if isinstance(report, RoundReport):
            next(reports)  # the checkpoint of round 1 is written as the run goes on
            break
    reports.close()  # stopped inside round 2
    state = json.loads((out / "checkpoint" / "state.json").read_text())
    assert len(state["rounds"]) == 1 and set(state["stream"]) == {"epoch", "position", "seed"}
    assert state["perplexity"]["finetuned"]["windows"] == 8  # the protocol of the evaluation before is kept

    assert main(["compress", "--resume", str(out), "--quiet"]) == 0
    resumed = json.loads((out / "summary.json").read_text())
    assert resumed["ranks"] == expected["ranks"] and resumed["params_after"] == expected["params_after"]
    assert resumed["perplexity"]["after"] == pytest.approx(expected["perplexity"]["after"], rel=1e-5)
    assert resumed["perplexity"]["before"] == pytest.approx(expected["perplexity"]["before"], rel=1e-9)
    assert not (out / "checkpoint").exists() and len((out / "rounds.jsonl").read_text().splitlines()) == 3


# ------------------------------------------------------------------ bsi sweep on WikiText-2


@pytest.fixture(scope="module")
def text_sweep(tmp_path_factory):
    """A text sweep of svd and bsi at 0.6, with rows before recovery and a learning rate chosen on validation windows."""
    import os

    root = tmp_path_factory.mktemp("text-sweep")
    old = os.environ.get("BSI_CACHE")
    os.environ["BSI_CACHE"] = str(root / "cache")
    args = ["sweep", "--preset", "smoke", "--data", "wikitext-2", "--window", "64", "--eval-windows", "12",
            "--methods", "svd,bsi", "--targets", "0.6", "--also-unrecovered", "--validation-size", "4",
            "--lr-grid", "0.001,0.0001", "--quiet", "--out", str(root / "sweep")]
    try:
        assert main(args) == 0
        rows = _lines(root / "sweep" / "results.jsonl")
        assert main(args) == 0  # the same command again: every cell is found done, nothing runs twice
        assert _lines(root / "sweep" / "results.jsonl") == rows
    finally:
        if old is None:
            os.environ.pop("BSI_CACHE")
        else:
            os.environ["BSI_CACHE"] = old
    return root / "sweep"


def test_a_text_sweep_has_rows_before_and_after_recovery_with_per_window_outcomes(text_sweep):
    rows = _lines(text_sweep / "results.jsonl")
    dense = rows[0]
    assert dense["method"] == "dense" and dense["perplexity_protocol"]["windows"] == 12
    cells = {(r["method"], r["recover_steps"]): r for r in rows[1:]}
    assert set(cells) == {("svd", 0), ("svd", 4), ("bsi", 0), ("bsi", 4)}
    for (_, steps), row in cells.items():
        assert row["perplexity"] == pytest.approx(math.exp(row["loss"])) and row["loss_examples"] == 12
        outcomes = json.loads((text_sweep / row["outcomes"]).read_text())
        assert len(outcomes["tokens"]) == 12 and set(outcomes["correct"]) == {None} and set(outcomes["tokens"]) == {63}
        assert row["loss"] == pytest.approx(sum(outcomes["loss_sum"]) / sum(outcomes["tokens"]))
        if steps:  # the learning rate came from the validation windows, never from the held-out text
            assert row["lr_choice"]["validation_examples"] == 4 and row["recover_lr"] in (0.001, 0.0001)
        else:
            assert row["recover_lr"] is None and row["outcomes"].endswith("-no-recovery.json")
    # the model before recovery is the same model the recovery then trained: same size, another loss
    assert cells[("bsi", 0)]["params_total"] == cells[("bsi", 4)]["params_total"]
    assert cells[("bsi", 0)]["loss"] != cells[("bsi", 4)]["loss"]


def test_a_text_sweeps_tables_give_perplexity_with_intervals_and_a_no_recovery_table(text_sweep):
    stats = json.loads((text_sweep / "stats.json").read_text())
    assert stats["task"] == "text" and stats["perplexity_protocol"]["release"].startswith("WikiText-2, tokenized")
    block = stats["protocols"]["tuned"]
    for group in ("methods", "no_recovery"):
        svd = block[group]["svd"]["0.6"]
        for key in ("estimate", "low", "high"):  # exp of the loss interval, exactly
            assert svd["perplexity"][key] == pytest.approx(math.exp(svd["loss"][key]))
        assert svd["perplexity"]["low"] <= svd["perplexity"]["estimate"] <= svd["perplexity"]["high"]
        ratio, diff = svd["vs_anchor"]["perplexity_ratio"], svd["vs_anchor"]["loss"]
        assert ratio["estimate"] == pytest.approx(math.exp(diff["estimate"])) and diff["samples"] == 12
    assert block["no_recovery"]["svd"]["0.6"]["recover_steps"] == 0
    table = (text_sweep / "results.md").read_text()
    for phrase in ("mean next-token NLL", "perplexity is exp of it", "Protocol: wikitext-2: test.txt (WikiText-2, "
                   "tokenized release", "### With recovery (4 steps)", "### No recovery", "| `svd` |",
                   "`bsi`'s perplexity / the method's"):
        assert phrase in table, phrase
    assert "Accuracy in %" not in table

    # the Compare tab shows the same sweep with perplexity columns
    status, figure, rows, headers = compare.view(str(text_sweep))
    assert headers == compare.TEXT_HEADERS and "perplexity" in status and "tokenized release" in status
    by_name = {(r[1], r[2]): r for r in rows}
    assert set(by_name) == {("svd", 0.6), ("bsi", 0.6), ("svd (no recovery)", 0.6), ("bsi (no recovery)", 0.6)}
    assert by_name[("svd", 0.6)][4] == pytest.approx(block["methods"]["svd"]["0.6"]["perplexity"]["estimate"], rel=1e-3)
    assert {t.name for t in figure.data if t.showlegend} == {"svd (published)", "bsi", "svd (published, no recovery)", "bsi (no recovery)"}
    assert figure.layout.yaxis.title.text == "perplexity"
    recomputed = study_stats(read_study_rows(text_sweep / "results.jsonl"), folder_loader(text_sweep), ["tuned"],
                             resamples=200)
    assert recomputed["protocols"]["tuned"]["no_recovery"]["bsi"]["0.6"]["loss"]["estimate"] == \
        pytest.approx(block["no_recovery"]["bsi"]["0.6"]["loss"]["estimate"])


# ------------------------------------------------------------------ the app


def test_the_compress_tab_runs_a_text_task_and_shows_perplexity(tmp_path, monkeypatch):
    monkeypatch.setenv("BSI_CACHE", str(tmp_path / "cache"))
    form = dataclasses.replace(Form.for_preset("smoke"), data_source="wikitext-2", window=64, eval_windows=8)
    config = build_config(form)
    assert (config.data, config.window, config.eval_windows) == (WIKITEXT_2, 64, 8)
    assert build_config(dataclasses.replace(form, eval_windows=0)).eval_windows is None  # the form's 0: every window
    session, board = Session(), JobBoard()
    views = list(run_job(board, session, form, min_interval=0))
    assert views[-1].status.startswith("**Done**") and "perplexity" in views[-1].status, views[-1].status
    assert "tokenized release" in views[-1].status and "accuracy" not in views[-1].status
    assert session.summary["perplexity"]["after"] == pytest.approx(session.evals[-1].perplexity)
    assert any("evaluate finetuned: perplexity" in line and "8 held-out windows" in line for line in session.log)
    assert not board.busy
    names = spectra.layer_names(session, form)  # the Spectra tab measures on a batch of training windows
    result = spectra.compute(session, form, names[-1], 4, 2)
    assert result.layers[0].k == 4 and all(math.isfinite(v) for v in result.layers[0].eigenvalues)
    form = Form.for_preset("text")  # the text preset fills the form with its data and settings
    assert (form.data_source, form.window, form.eval_windows) == ("wikitext-2", 128, 256)


def test_an_uploaded_text_is_a_text_task_and_a_bad_one_is_refused_in_the_apps_words(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("The quick brown fox jumps over the lazy dog. " * 40)
    assert validate_upload(str(notes)) == 1 and "a text of 1 document" in upload_message(str(notes))
    records = tmp_path / "docs.jsonl"
    records.write_text("".join(json.dumps({"text": f"document {i} " * 30}) + "\n" for i in range(3)))
    assert validate_upload(str(records)) == 3 and "perplexity" in upload_message(str(records))
    form = dataclasses.replace(Form.for_preset("smoke"), data_source="upload", data_file=str(notes), window=64)
    assert build_config(form).data == str(notes)
    binary = tmp_path / "blob.txt"
    binary.write_bytes(b"\x00\x01\x02" * 100)
    assert upload_message(str(binary)).startswith("Error: 'blob.txt' holds NUL bytes")
    views = list(run_job(JobBoard(), Session(), dataclasses.replace(form, window=1)))
    assert len(views) == 1 and "Window (tokens) must be a whole number >= 2" in views[0].status, views[0].status


# ------------------------------------------------------------------ bad input


def _bad_text(kind: str, tmp_path: Path) -> tuple[list[str], str]:
    """The flags that give the bad text input ``kind``, and what its one line must say."""
    if kind == "empty":
        (tmp_path / "empty.txt").write_bytes(b"")
        return ["--data", str(tmp_path / "empty.txt")], "is empty"
    if kind == "shorter than a window":
        (tmp_path / "short.txt").write_text("only a few words here")
        return ["--data", str(tmp_path / "short.txt")], "fewer than one window of 64"
    if kind == "binary":
        (tmp_path / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" * 50)
        return ["--data", str(tmp_path / "image.png")], "holds NUL bytes"
    if kind == "jsonl without the text field":
        (tmp_path / "docs.jsonl").write_text(json.dumps({"body": "some text " * 50}) + "\n")
        return ["--data", str(tmp_path / "docs.jsonl")], "and no 'text' (a text task) either"
    if kind == "jsonl without the named text field":
        (tmp_path / "docs.jsonl").write_text(json.dumps({"body": "some text " * 50}) + "\n")
        return ["--data", str(tmp_path / "docs.jsonl"), "--task", "text"], "missing field 'text'"
    if kind == "window longer than the context":
        return ["--data", "wikitext-2", "--window", "1024"], "longer than the model's context (max_position_embeddings 512)"
    if kind == "window of one token":
        return ["--data", "wikitext-2", "--window", "1"], "--window must be an integer >= 2"
    if kind == "text task on the embedded problems":
        return ["--task", "text"], "task text needs text data"
    if kind == "stride longer than the window":
        return ["--data", "wikitext-2", "--eval-stride", "65"], "--eval-stride must be a whole number of tokens in [1, window]"
    raise AssertionError(kind)


BAD_TEXT = ["empty", "shorter than a window", "binary", "jsonl without the text field",
            "jsonl without the named text field", "window longer than the context", "window of one token",
            "text task on the embedded problems", "stride longer than the window"]


@pytest.mark.parametrize("command", ["compress", "sweep"])
@pytest.mark.parametrize("kind", BAD_TEXT)
def test_bad_text_input_is_one_line_before_any_work(kind, command, tmp_path, isolated_cache, capsys):
    flags, message = _bad_text(kind, tmp_path)
    base = ["--preset", "smoke", "--quiet", "--window", "64", "--eval-windows", "4", *flags]
    extra = ["--methods", "svd", "--targets", "0.5"] if command == "sweep" else []
    assert main([command, *base, *extra, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and "Traceback" not in err, err
    assert err.startswith(f"bsi {command}: error: ")
    assert not (isolated_cache / "finetuned").exists()  # nothing was trained
    assert not (tmp_path / "out" / "summary.json").exists() and not (tmp_path / "out" / "results.jsonl").exists()


def test_a_sweep_on_text_must_evaluate_and_recover_to_add_rows_before_recovery(tmp_path, capsys):
    base = ["sweep", *TEXT, "--methods", "svd", "--targets", "0.5", "--out", str(tmp_path / "s")]
    assert main([*base, "--eval-windows", "0"]) == 2
    assert "eval_windows must not be 0" in capsys.readouterr().err
    assert main([*base, "--also-unrecovered", "--recover-steps", "0"]) == 2
    assert "every row is already unrecovered" in capsys.readouterr().err


def test_a_text_sweep_ships_with_its_per_window_losses_and_its_tables_recompute(text_sweep, tmp_path):
    """`python -m bsi.shipped sweep` on a text sweep: no answers or problems to copy, every window's loss instead."""
    from bsi.config import PipelineConfig, SweepConfig
    from bsi.errors import BSIError
    from bsi.pipeline.sweep import Sweep
    from bsi.shipped import ship_sweep, study_tables

    shipped = ship_sweep(text_sweep, "text", "bsi sweep --preset text", root=tmp_path / "data")
    rows = _lines(shipped / "results.jsonl")
    assert sorted(p.name for p in (shipped / "outcomes").iterdir()) == sorted(Path(r["outcomes"]).name for r in rows)
    assert not list((shipped / "outcomes").glob("problems-*")) and not (shipped / "figure.html").exists()
    saved = json.loads((shipped / "sweep.json").read_text())
    copy = tmp_path / "again"
    shutil.copytree(shipped, copy)
    Sweep(PipelineConfig.from_dict(saved["config"]), SweepConfig.from_dict(saved["settings"]), copy).write()
    assert (copy / "results.md").read_text() == (shipped / "results.md").read_text()  # from the shipped files alone
    assert study_tables("text", tmp_path / "data") == (shipped / "results.md").read_text().strip()

    broken = tmp_path / "broken"
    shutil.copytree(text_sweep, broken)
    (broken / rows[-1]["outcomes"]).write_text('{"loss_sum": [1.0]}')
    with pytest.raises(BSIError, match="not a readable text outcome file"):
        ship_sweep(broken, "text", "bsi sweep --preset text", root=tmp_path / "data2")
