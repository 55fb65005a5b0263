"""The dashboard: formatting helpers, handlers and figure builders called directly, then a real server.

Everything runs on the tiny random Llama with the smoke preset (seconds).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import socket
from dataclasses import astuple
from pathlib import Path

import plotly.graph_objects as go
import pytest
import torch
from conftest import load_script, smoke_app

from bsi.analysis import figures
from bsi.app import chat, compare, inspect, spectra
from bsi.app.form import (
    KNOBS,
    RATIOS,
    SIZE_MODES,
    Form,
    build_config,
    checkpoint_progress,
    compute_eps_rule,
    eps_note,
    eps_rule_text,
    size_mode_line,
    validate_upload,
)
from bsi.app.format import in_app_words, number_text, significant
from bsi.app.job import cancel_job, run_job
from bsi.app.layout import startup_lines
from bsi.app.state import JobBoard, LoadedModel, Session
from bsi.config import PRESETS, CompressConfig, RecoverConfig, SizeRule, field_help, flat_fields, make_config
from bsi.errors import BSIError
from bsi.method import theory
from bsi.method.scores import eps_rule
from bsi.method.surgery import sigma_max
from bsi.models import load_model_and_tokenizer
from bsi.reports import LayerRound, RoundReport

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """One smoke run through the job generator, shared by the tests that read its results."""
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BSI_CACHE", str(tmp_path_factory.mktemp("app-cache")))
        session, board = Session(), JobBoard()
        views = list(run_job(board, session, Form.for_preset("smoke"), min_interval=0))
    return session, board, views


# ------------------------------------------------------------------ formatting
def test_numbers_have_four_significant_figures():
    assert significant(0.000123456) == 0.0001235
    assert significant(-98765.4321) == -98770.0
    assert significant(1.23456789e-9) == pytest.approx(1.235e-9, rel=1e-12)
    assert significant(None) is None and significant(0.0) == 0.0 and math.isnan(significant(float("nan")))
    assert number_text(0.000123456) == "0.0001235"
    assert number_text(2.0 / 3.0) == "0.6667"
    assert number_text(1.23456789e-7) == "1.235e-07"
    assert number_text(1234567) == "1,234,567" and number_text(1234567.0) == "1,234,567"
    assert number_text(None) == "" and number_text(5.0) == "5"


def test_messages_speak_the_apps_language():
    message = "output directory '/x' is a file; pass a folder path to --out"
    assert in_app_words(message) == "output directory '/x' is a file; pass a folder path to 'Save to folder'"
    assert "--" not in in_app_words("cannot write under '/proc'; choose a writable --out folder")
    assert in_app_words("no checkpoint here; start with --resume or --max-length 9") == \
        "no checkpoint here; start with Resume or the maximum length 9"
    assert in_app_words("target_ratio must be in (0, 1], got 1.5", {"target_ratio": "Target ratio"}) == \
        "Target ratio must be in (0, 1], got 1.5"
    assert in_app_words("limit max_skipped_batches=20", {"max_skipped_batches": "Skips"}) == "limit Skips = 20"
    labels = {"gamma": "gamma (pool exponent)"}
    once = in_app_words("gamma must be > 0", labels)
    assert once == "gamma (pool exponent) must be > 0" and in_app_words(once, labels) == once


# ------------------------------------------------------------------ the form
def test_form_is_built_from_the_config_fields():
    sections = {"compress": CompressConfig, "recover": RecoverConfig}
    for knob in (*KNOBS, *RATIOS.values()):
        spec = {f.name: f for f in flat_fields(sections[knob.section])}[knob.name]  # probe_scope: the hutchinson part
        assert knob.help == field_help(sections[knob.section], knob.name) and knob.help
        assert knob.choices == spec.metadata.get("choices")
    assert {k.attr for k in KNOBS} >= {"size_mode", "rounds", "gamma", "score", "bases", "curvature", "probe_scope",
                                       "eps", "recover_train", "recover_distill"}
    assert KNOBS[[k.attr for k in KNOBS].index("curvature")].choices == ("fisher", "mc-fisher", "hutchinson")
    for preset in PRESETS:  # every preset fills the form with its own values, and a first click is valid
        config = make_config(preset)
        form = Form.for_preset(preset)
        assert SizeRule(form.size_mode, form.size_value) == config.compress.size
        assert (form.rounds, form.bases, form.curvature) == (config.compress.rounds, config.compress.bases,
                                                             config.compress.curvature)
        assert build_config(form).compress == config.compress


def test_form_values_reach_the_config():
    form = Form.for_preset("smoke")
    form.size_mode, form.size_value, form.eps, form.curvature = "keep", 0.4, 0.01, "hutchinson"
    form.bases, form.probe_scope, form.recover_train, form.recover_distill = "svd", "layer", "sigma", 0.5
    config = build_config(form)
    assert config.compress.size == SizeRule.keep(0.4)  # the ratio implies the mode
    probes = config.compress.hutchinson
    assert (probes.eps, config.compress.curvature, config.compress.bases, probes.probe_scope) == \
        (0.01, "hutchinson", "svd", "layer")
    assert (config.recover.train, config.recover.distill) == ("sigma", 0.5)
    form.eps = 0
    assert build_config(form).compress.hutchinson.eps is None  # 0: the rule
    with pytest.raises(BSIError, match="hub id"):
        build_config(Form(model_source="hub", model_name=""))
    assert not build_config(Form(model_source="hub", model_name="org/model")).trust_remote_code


@pytest.mark.parametrize("field,value,words", [
    ("size_value", 1.5, "Target ratio must be in (0, 1], got 1.5"),
    ("size_value", None, "Target ratio: type a number"),
    ("rounds", 2.5, "Rounds T must be a whole number, got 2.5"),
    ("rounds", 8, "Rounds T: 8 rounds do not fit the smoke preset"),
    ("curvature", "exact", "Curvature: choose one of fisher, mc-fisher, hutchinson"),
    ("gamma", -1, "gamma (pool exponent) must be > 0"),
])
def test_a_bad_field_gets_one_message_before_the_board(field, value, words):
    board = JobBoard()
    form = dataclasses.replace(Form.for_preset("smoke"), **{field: value})
    views = list(run_job(board, Session(), form))
    assert len(views) == 1 and words in views[0].status, views[0].status
    assert views[0].loss is None and views[0].ranks is None  # the figures are left alone
    assert "--" not in views[0].status and not board.busy


def test_rounds_the_schedule_cannot_run_are_refused_naming_the_apps_fields():
    form = dataclasses.replace(Form.for_preset("smoke"), rounds=8)
    with pytest.raises(BSIError) as err:
        build_config(form)
    text = str(err.value)
    assert "Rounds T" in text and "choose at most" in text and "iters_per_epoch" not in text
    most = int(text.split("choose at most ")[1].split()[0])
    assert build_config(dataclasses.replace(form, rounds=most)).compress.rounds == most  # the limit itself runs


def test_output_folder_errors_in_the_apps_words(tmp_path):
    file = tmp_path / "a-file"
    file.write_text("x")
    form = dataclasses.replace(Form.for_preset("smoke"), out_dir=str(file))
    views = list(run_job(JobBoard(), Session(), form))
    assert "Save to folder" in views[0].status and "--out" not in views[0].status
    views = list(run_job(JobBoard(), Session(), dataclasses.replace(form, out_dir=str(tmp_path / "new")),
                         resume=True))
    assert "holds no interrupted run" in views[0].status


def test_upload_validation_names_the_line(tmp_path):
    good = tmp_path / "ok.jsonl"
    good.write_text("".join(json.dumps({"question": f"q{i}", "answer": f"a\n#### {i}"}) + "\n" for i in range(5)))
    assert validate_upload(str(good)) == 5
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "a"}\n{"question": "q2", "answer": \n')
    with pytest.raises(BSIError, match=r"bad\.jsonl, line 2: malformed JSON") as err:
        validate_upload(str(bad))
    assert str(tmp_path) not in str(err.value)  # the server's temporary path is not shown
    missing = tmp_path / "fields.jsonl"
    missing.write_text('{"q": "x"}\n')
    with pytest.raises(BSIError, match="line 1: missing field 'question'"):
        validate_upload(str(missing))
    with pytest.raises(BSIError, match="not a .jsonl"):
        validate_upload(str(tmp_path / "data.csv"))


def test_eps_rule_text_states_the_floor_and_the_cap():
    compress = make_config("default").compress
    text = eps_rule_text(compress, torch.float32)
    assert "2^-24" in text and "0.0001" in text and "whitened" in text and "press" in text
    assert "no floor" in eps_rule_text(make_config("default", {"protocol": "paper"}).compress)
    value = 82.0
    shown = eps_rule_text(compress, torch.float32, value, eps_rule(value, torch.float32, 0.01, 0.1, 1e-4))
    assert f"**{number_text(eps_rule(value, torch.float32, 0.01, 0.1, 1e-4))}**" in shown and "82" in shown


def test_eps_rule_is_what_the_run_uses(tmp_path, monkeypatch):
    """*Compute the rule* gives the eps the run then reports: the whitened bases of the fine-tuned model, the floor."""
    from bsi.pipeline.runner import Pipeline

    monkeypatch.setenv("BSI_CACHE", str(tmp_path))
    form = dataclasses.replace(Form.for_preset("smoke"), curvature="hutchinson")
    before = list(compute_eps_rule(form))[-1]
    assert "before* its task fine-tune" in before  # nothing cached yet: said so
    assert "floor 0.0001" in before
    config = build_config(form)  # without the floor, so that the value is the whitened sigma_max's own
    floorless = dataclasses.replace(config.compress.hutchinson, eps_floor=0.0)
    config = dataclasses.replace(config, compress=dataclasses.replace(config.compress, hutchinson=floorless))
    rounds = [r for r in Pipeline(config).run() if isinstance(r, RoundReport)]
    lines = list(compute_eps_rule(config))  # the fine-tune is cached now
    assert any("Calibrating the whitened bases" in line for line in lines[:-1])
    assert f"= **{number_text(rounds[0].eps)}**" in lines[-1] and "fine-tuned model" in lines[-1], lines[-1]
    dense, _ = load_model_and_tokenizer("tiny-random-llama")
    assert number_text(eps_rule(sigma_max(dense), torch.float32)) != number_text(rounds[0].eps)  # not the dense one
    assert "switch **Curvature** to hutchinson" in eps_note("fisher") and "0 takes the rule" in eps_note("hutchinson")


def test_size_modes_name_the_papers_rule():
    assert dict((value, label) for label, value in SIZE_MODES)["keep"] == "the paper's size rule (KeepRatio)"
    assert "KeepRatio^(1/T)" in size_mode_line("keep") and "paper's size rule" in size_mode_line("target")


# ------------------------------------------------------------------ the job
def test_job_streams_rounds_and_frees_the_board(finished):
    session, board, views = finished
    assert views[-1].status.startswith("**Done**"), views[-1].status
    assert [r.round for r in session.rounds] == [1, 2]
    seen = {tuple(v.rounds) for v in views}
    assert (1,) in seen and (1, 2) in seen  # each round reached the UI as it finished
    assert not board.busy and not session.running
    assert session.compressed.params < session.original.params  # the chat models are in place
    assert session.summary["params_after"] == session.compressed.params
    last = views[-1]
    layers = session.rounds[0].layers
    cells = [row for trace in last.ranks.data for row in trace.text if row[0]]
    assert len(cells) == len(layers)  # every layer is one row of its kind's panel
    assert all(len(row) == 3 for row in cells)  # before, round 1, round 2
    assert last.params.data[0].y[-1] == session.rounds[-1].params_total
    assert {"train", "profile", "recover"} <= {t.name for t in last.loss.data}
    assert last.eps_text.startswith("eps: not used (fisher")  # the smoke preset's curvature is fisher
    newest = last.log.splitlines()[0]
    assert "evaluate recovered" in newest and "start: model" in last.log.splitlines()[-1]  # newest first


def test_busy_board_refuses_a_second_job():
    board = JobBoard()
    assert board.try_acquire("someone else's job")
    views = list(run_job(board, Session(), Form.for_preset("smoke")))
    assert len(views) == 1 and "Busy" in views[0].status and "someone else's job" in views[0].status
    board.release()
    assert not board.busy


def test_cancel_stops_within_a_step(tmp_path, monkeypatch):
    monkeypatch.setenv("BSI_CACHE", str(tmp_path))
    session, board = Session(), JobBoard()
    jobs = run_job(board, session, Form.for_preset("smoke"), min_interval=0)
    first = next(jobs)
    assert "Starting" in first.status and board.busy
    steps_seen, views = None, [first]
    for view in jobs:
        views.append(view)
        if session.steps and steps_seen is None:
            assert "Cancelling" in cancel_job(session)
            steps_seen = len(session.steps)
    view = views[-1]
    assert view.status.startswith("**Cancelled.**") and "Resume" not in view.status  # nothing was saved
    assert len(session.steps) <= steps_seen + 1  # at most the step already under way
    assert not board.busy and not session.running and session.compressed is None
    assert "Nothing to cancel" in cancel_job(session)


def test_cancelled_run_offers_resume_and_resume_finishes_it(tmp_path, monkeypatch):
    monkeypatch.setenv("BSI_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    form = dataclasses.replace(Form.for_preset("smoke"), out_dir=str(out))
    session, board = Session(), JobBoard()
    views = []
    for view in run_job(board, session, form, min_interval=0):
        views.append(view)
        if session.rounds and not session.cancel_requested:
            cancel_job(session)  # after round 1, inside round 2
    view = views[-1]
    assert "Cancelled** after round 1 of 2" in view.status and "Resume" in view.status, view.status
    assert checkpoint_progress(out) == (1, 2)
    refused = list(run_job(board, Session(), form))  # Start would throw the checkpoint away: refused
    assert "interrupted run (1 of 2 rounds done)" in refused[0].status and "Resume" in refused[0].status
    views = list(run_job(board, session, form, min_interval=0, resume=True))
    assert views[-1].status.startswith("**Done**"), views[-1].status
    assert [r.round for r in session.rounds] == [2]  # it went on from the checkpoint
    assert (out / "summary.json").is_file() and checkpoint_progress(out) is None
    assert not board.busy


# ------------------------------------------------------------------ inspect
def test_inspect_rows_read_the_scores_terms(finished, tmp_path):
    session, _, _ = finished
    layer = session.rounds[0].layers[0]
    rows = inspect.basis_rows(layer)
    assert list(rows[0]) == ["basis", "sigma", "gradient", "curvature", "gradient term", "curvature term",
                             "importance", "status"]
    assert len(rows) == layer.rank_before
    pool = set(layer.pool.tolist())
    for i, row in enumerate(rows):
        assert row["gradient term"] == pytest.approx(float(layer.terms["gradient"][i]))
        if row["gradient term"] != 0:  # kept whole, or dropped by the significance test (gradient_z)
            assert row["gradient term"] == pytest.approx(-row["sigma"] * row["gradient"], rel=1e-5, abs=1e-12)
        if i in pool:
            assert row["importance"] == pytest.approx(row["gradient term"] + row["curvature term"], abs=1e-6)
        else:  # not measured outside the pool: blank, not 0
            assert row["curvature"] is None and row["curvature term"] is None and row["status"] == "protected"
    statuses = [r["status"] for r in rows]
    assert statuses.count("pruned") == layer.pruned.numel() == layer.rank_before - layer.rank_after
    assert statuses.count("protected") == layer.rank_before - layer.pool.numel() > 0
    text, fig, table, path = inspect.view(session.rounds, 1, layer.name, tmp_path)
    assert layer.name in text and len(table["data"]) == len(rows) and isinstance(fig, go.Figure)
    share = session.rounds[0].significant_gradients  # the round's gradient test, stated as the share that passed
    assert (f"{100 * share:.1f}% of the candidate bases" in text) if share == share else "no gradient test" in text
    assert table["headers"][-2:] == ["importance", "status"]
    shown = [v for row in table["data"] for v in row if isinstance(v, float) and v != 0]
    assert all(v == significant(v) for v in shown)  # four significant figures in the table
    parsed = list(csv.DictReader(io.StringIO(open(path).read())))
    assert len(parsed) == len(rows) and float(parsed[3]["sigma"]) == pytest.approx(rows[3]["sigma"], rel=1e-12)
    assert inspect.view(session.rounds, 9, layer.name, tmp_path)[2]["data"] == []
    again = inspect.view(session.rounds, 1, layer.name, tmp_path)[3]
    assert again != path and Path(again).name == Path(path).name  # each view its own file, under one readable name
    assert open(again).read() == open(path).read()


def test_the_apps_csv_downloads_go_under_one_folder_removed_with_the_app(tmp_path, monkeypatch):
    """Inspect writes its CSV files under the app's own folder (not a new temporary folder per view), and
    the folder goes with the app."""
    monkeypatch.setenv("BSI_CACHE", str(tmp_path / "cache"))
    from bsi.app import build_app

    demo = build_app(preset="smoke")
    folder = Path(demo.csv_folder)
    assert folder.is_dir() and list(folder.rglob("*.csv"))  # the opening view of the run shipped in data/
    demo.remove_files()
    assert not folder.exists()


def test_inspect_columns_follow_the_score():
    def layer(score_terms, grad, hessian):
        r = 4
        return LayerRound(name="l", basis_ids=torch.arange(r), sigma=torch.ones(r), grad=grad, hessian=hessian,
                          importance=torch.ones(r), pool=torch.tensor([2, 3]), pruned=torch.tensor([3]),
                          rank_before=r, rank_after=r - 1, params_after=1, terms=score_terms)

    basel = inspect.basis_rows(layer({"magnitude": torch.ones(4)}, None, None))
    assert list(basel[0]) == ["basis", "sigma", "magnitude term", "importance", "status"]
    grad_only = inspect.basis_rows(layer({"gradient": torch.ones(4)}, torch.ones(4), None))
    assert list(grad_only[0]) == ["basis", "sigma", "gradient", "gradient term", "importance", "status"]
    assert [r["status"] for r in grad_only] == ["protected", "protected", "pool (kept)", "pruned"]


# ------------------------------------------------------------------ chat
def test_chat_streams_both_models_and_says_what_the_tiny_model_is_for(finished):
    session, _, _ = finished
    updates = list(chat.respond(session, "What is 2 + 3?", max_new_tokens=12))
    assert len(updates) >= 2
    compressed, original = updates[-1]
    for history in (compressed, original):
        assert [m["role"] for m in history] == ["user", "assistant"] and history[1]["content"]
    expected = session.chats["compressed"].history[-1]["content"]
    assert compressed[1]["content"] in (expected, chat.TINY_EMPTY_REPLY)
    sizes = chat.sizes_text(session)
    assert "compressed" in sizes and f"{session.original.params:,}" in sizes
    assert chat.TINY_NOTE in sizes and "random weights" in sizes
    with pytest.raises(BSIError, match="empty message"):
        list(chat.respond(session, "  "))
    assert chat.clear(session) == ([], [])
    with pytest.raises(BSIError, match="no compressed model"):
        list(chat.respond(Session(), "hi"))


def test_chat_replies_with_text():
    model, tokenizer = load_model_and_tokenizer("tiny-random-llama")
    session = Session(compressed=LoadedModel(model, tokenizer, "compressed", 1))
    *_, (history, other) = chat.respond(session, "hi", max_new_tokens=16)
    assert other == [] and history[1]["content"] not in ("", chat.EMPTY_REPLY)
    assert chat.TINY_NOTE not in chat.sizes_text(session)  # no source recorded: no claim about it
    conversation = session.chats["compressed"]
    conversation.history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": " \n "}]
    assert chat._history(conversation)[1]["content"] == chat.EMPTY_REPLY  # a blank reply is said, not shown empty


# ------------------------------------------------------------------ spectra
def test_spectrum_of_the_last_run_leaves_the_model_as_it_was(finished):
    session, _, _ = finished
    form = Form.for_preset("smoke")
    names = spectra.layer_names(session, form)
    before = {name: type(module) for name, module in session.original.model.named_modules()}
    result = spectra.compute(session, form, names[-1], 5, 2)
    layer = result.layers[0]
    assert layer.k == 5 and len(layer.eigenvalues) == 5
    assert layer.lambda_1 == pytest.approx(max(abs(v) for v in layer.eigenvalues))
    assert {name: type(module) for name, module in session.original.model.named_modules()} == before
    assert layer.name in spectra.spectrum_text(result)
    fig = figures.spectrum_figure(result)
    assert fig.layout.xaxis.type == "log" and len(fig.data) == 6  # 2 line styles' key; |lambda_k|, relative, envelope, fit


def test_calculator_is_the_theory_modules_bound():
    n, lam, trace, e, delta = 64, 2.0, 10.0, 0.1, 0.05
    expected = math.ceil(theory.sample_complexity(lam, 1.0, trace, n, e, delta))
    text = spectra.calculator_text(n, 1.0, lam, trace, e, delta)
    assert f"s > {expected:,} probes" in text
    assert f"s > {math.ceil(theory.sample_complexity_psd(n, 1.0, e, delta)):,}" in text
    assert "Any s >= 1" in spectra.calculator_text(n, 1.0, 0.1, trace, e, delta)
    assert "No bound" in spectra.calculator_text(n, 1.0, lam, 0.0, e, delta)
    assert spectra.calculator_text(n, 1.0, lam, trace, None, delta) == "Type a number for e."
    assert spectra.calculator_text(n, 1.0, lam, trace, 0.1, 1.5).startswith("Error: delta")


def test_inspect_measures_a_layers_candidates_in_the_model_of_that_round(finished):
    session, _, _ = finished
    report = session.rounds[-1]
    layer = next(layer for layer in report.layers if layer.pool.numel() >= 4)
    views = list(inspect.measure(session, report.round, layer.name, count=4))
    assert all("Measuring" in text and fig is None for text, fig in views[:-1]) and len(views) == 5
    text, fig = views[-1]
    assert "Spearman" in text and f"round {report.round}" in text
    assert len(fig.data) == 4 and all(len(trace.x) == 4 for trace in fig.data)  # four rankings, four bases each
    # the measured changes are real: removing nothing-like-noise bases moves the held-out loss
    assert any(abs(y) > 0 for y in fig.data[0].y)
    text, fig = list(inspect.measure(session, 99, layer.name))[-1]
    assert fig is None and "choose a round" in text


# ------------------------------------------------------------------ compare
def _write_sweep(folder, outcomes=True):
    """A sweep folder as bsi sweep writes it: rows, and each row's per-problem outcomes (20 problems, one seed)."""
    rows = []
    quality = {("dense", 1.0): 0.9, ("bsi", 0.5): 0.8, ("bsi", 0.3): 0.6, ("svd", 0.5): 0.5, ("svd", 0.3): 0.1}
    for (method, target), share in quality.items():
        correct = [i < round(20 * share) for i in range(20)]
        row = {"method": method, "target": target, "seed": 0, "params_total": int(2e6 * target),
               "compression_ratio": 1 / target, "accuracy": share, "loss": 2 - 2 * share,
               "protocol": {"dense": "dense", "svd": "published"}.get(method, "tuned")}
        if outcomes:
            row["outcomes"] = f"outcomes/{method}-{target}.json"
            (folder / "outcomes").mkdir(exist_ok=True)
            (folder / row["outcomes"]).write_text(json.dumps(
                {"correct": correct, "loss_sum": [10 * (2 - 2 * share)] * 20, "tokens": [10] * 20}))
        rows.append(row)
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def test_compare_loads_a_sweep_with_intervals_and_differences_from_bsi(tmp_path):
    _write_sweep(tmp_path)
    status, fig, table, headers = compare.view(str(tmp_path))
    assert "5 evaluated models" in status and "95% bootstrap" in status
    lines = {(t.name, t.xaxis) for t in fig.data if t.name}
    assert lines == {("bsi", "x"), ("svd (published)", "x"), ("bsi", "x2"), ("svd (published)", "x2")}  # accuracy and loss per method
    bands = [t for t in fig.data if t.fill == "toself"]
    assert len(bands) == 4  # one interval band per line
    bsi_accuracy = next(t for t in fig.data if t.name == "bsi" and t.xaxis == "x")
    assert list(bsi_accuracy.x) == pytest.approx([2.0, 1.0, 0.6]) and bsi_accuracy.y[0] == pytest.approx(90.0)
    rows = {(r[1], r[2]): r for r in table}
    assert rows[("bsi", 0.5)][4] == 80.0 and rows[("bsi", 0.5)][8] == ""  # bsi is the anchor
    svd = rows[("svd", 0.3)]
    assert svd[0] == "tuned" and svd[4] == 10.0 and svd[8].startswith("+50") and svd[8].endswith("*")
    assert not (tmp_path / "stats.json").exists()  # computed from the outcomes, nothing written


def test_compare_names_the_sweeps_model_and_lists_the_shipped_sweeps(tmp_path):
    from bsi.shipped import FIRST_SWEEP, shipped_sweep_names

    _write_sweep(tmp_path)
    assert compare.sweep_model(str(tmp_path)) is None and compare.view(str(tmp_path))[0].startswith("5 evaluated")
    (tmp_path / "sweep.json").write_text(json.dumps({"config": {"model": "some/model"}}))
    assert compare.view(str(tmp_path))[0].startswith("`some/model`: 5 evaluated models")
    (tmp_path / "sweep.json").write_text("{not json")
    assert compare.sweep_model(str(tmp_path)) is None  # an unreadable sweep.json costs the name, not the view
    names = shipped_sweep_names()
    assert names[0] == FIRST_SWEEP and "gemma3-270m-study-quick" in names and names[1:] == sorted(names[1:])
    (tmp_path / "sweeps" / "b").mkdir(parents=True)
    (tmp_path / "sweeps" / "a").mkdir()
    (tmp_path / "sweeps" / "b" / "results.jsonl").write_text("")
    assert shipped_sweep_names(tmp_path) == ["b"]  # only folders holding results.jsonl
    assert shipped_sweep_names(tmp_path / "nowhere") == []


def test_compare_reads_an_older_sweep_without_intervals_and_names_bad_lines(tmp_path):
    rows = _write_sweep(tmp_path, outcomes=False)
    status, fig, table, headers = compare.view(str(tmp_path))
    assert "no per-problem outcomes" in status and len(table) == 5
    (tmp_path / "results.jsonl").write_text(json.dumps(rows[0]) + "\n" + '{"method": "x"}\n')
    with pytest.raises(BSIError, match="line 2: missing field"):
        compare.load_results(str(tmp_path))
    with pytest.raises(BSIError, match="does not exist"):
        compare.load_results(str(tmp_path / "nope"))


# ------------------------------------------------------------------ figures
def test_figure_builders_on_empty_and_real_data(finished):
    session, _, _ = finished
    for empty in (figures.loss_figure([]), figures.params_figure([]), figures.rank_heatmap([]),
                  figures.basis_figure([]), figures.spectrum_figure(None), figures.results_figure([])):
        assert isinstance(empty, go.Figure) and empty.layout.annotations  # a message instead of a blank plot
    fig = figures.loss_figure([("train", 1, 2.0), ("train", 2, 1.5), ("profile", 3, 1.6)])
    assert [t.name for t in fig.data] == ["train", "profile"] and list(fig.data[0].y) == [2.0, 1.5]
    heat = figures.rank_heatmap(session.rounds)
    for trace in heat.data:
        ranks = [[int(v) for v in row] for row in trace.text if row[0]]  # (blank: no such layer in this panel)
        assert all(row[0] >= row[1] >= row[2] for row in ranks)  # ranks only shrink
        assert all(0 <= v <= 1 for row in trace.z for v in row if v is not None)  # coloured by the share kept


def _round(number: int, names: list[str], ranks: list[int]) -> RoundReport:
    layers = tuple(LayerRound(name=n, basis_ids=torch.arange(2), sigma=torch.ones(2), grad=None, hessian=None,
                              importance=torch.ones(2), pool=torch.arange(2), pruned=torch.arange(0),
                              rank_before=r + 8, rank_after=r, params_after=r) for n, r in zip(names, ranks))
    return RoundReport(round=number, total_rounds=4, layers=layers, params_total=1, params_compressible=1,
                       compressible_before=1, eps=0.0, mean_loss=1.0, skipped_batches=0, elapsed=1.0)


def test_rank_heatmap_stays_readable_for_a_30_block_model():
    kinds = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
             "mlp.up_proj", "mlp.down_proj"]
    names = [f"model.layers.{b}.{kind}" for b in range(30) for kind in kinds]
    assert len(names) == 210
    rounds = [_round(t, names, [500 - 50 * t - i % 7 for i in range(210)]) for t in (1, 2, 3, 4)]
    fig = figures.rank_heatmap(rounds)
    assert [t.name for t in fig.data] == kinds  # one panel per kind
    for trace in fig.data:
        assert list(trace.y) == [str(b) for b in range(30)] and len(trace.z[0]) == 5  # rows: blocks
    assert fig.layout.height <= 700  # 30 rows, not 210
    block7_down = fig.data[6].text[7]
    assert block7_down == [str(r) for r in [500 - 50 + 8 - 6, 450 - 6, 400 - 6, 350 - 6, 300 - 6]]
    resumed = figures.rank_heatmap(rounds[2:])  # a resumed run starts after round 2
    assert list(resumed.data[0].x) == ["2", "3", "4"]


# ------------------------------------------------------------------ server
@pytest.fixture
def server(tmp_path, monkeypatch):
    with smoke_app(tmp_path, monkeypatch) as demo:
        yield demo


def test_server_streams_rounds_and_chats(server):
    from gradio_client import Client

    client = Client(server.local_url, verbose=False)
    job = client.submit(*astuple(Form.for_preset("smoke")), api_name="/start")
    outputs = list(job)
    statuses = [out[0] for out in outputs]
    rounds = {s.split("round ")[1][:3] for s in statuses if "**Running**" in s}
    assert {"1/2", "2/2"} <= rounds, statuses  # at least two round updates streamed
    assert statuses[-1].startswith("**Done**")
    round_updates = [out[5] for out in outputs if isinstance(out[5], dict) and out[5].get("choices")]
    assert len(round_updates) >= 2
    chat_job = client.submit("What is 2 + 3?", 16, api_name="/chat")
    compressed, original, sizes = list(chat_job)[-1]
    assert compressed[0]["content"][0]["text"] == "What is 2 + 3?"
    assert compressed[1]["role"] == "assistant" and original[1]["role"] == "assistant"
    assert "parameters" in sizes

    # a bad field: one message in the status line, no error anywhere else
    bad = astuple(dataclasses.replace(Form.for_preset("smoke"), size_value=-1))
    status, loss, *_ = client.predict(*bad, api_name="/start")
    assert status == "**Error:** Target ratio must be in (0, 1], got -1.0"

    # a second visitor while a job runs sees "busy"; the first can cancel
    other = Client(server.local_url, verbose=False)
    assert server.board.try_acquire("test holder")
    try:
        busy = list(other.submit(*astuple(Form.for_preset("smoke")), api_name="/start"))
        assert "Busy" in busy[-1][0]
    finally:
        server.board.release()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_stop_while_the_address_prints_closes_the_app_without_a_traceback(tmp_path, monkeypatch):
    """SIGTERM (taken as Ctrl-C) can land inside the print that shows the address, before the server loop runs.

    Three test workers on two cores made it happen (the app exited 1 with a
    traceback); here the interrupt is raised from the address lines
    themselves, so the moment is always the same.
    """
    import signal

    import bsi.app.layout

    def interrupted(*_):
        raise KeyboardInterrupt

    monkeypatch.setenv("BSI_CACHE", str(tmp_path))
    monkeypatch.setattr(bsi.app.layout, "startup_lines", interrupted)
    monkeypatch.setattr(signal, "signal", lambda *_: None)  # the app's SIGTERM handler stays out of pytest
    port = _free_port()
    try:
        load_script(ROOT / "app.py", "bsi_app_script").main(["--preset", "smoke", "--port", str(port), "--run-dir", ""])
    except KeyboardInterrupt:  # caught here: escaping, it would stop the whole test session
        pytest.fail("app.py let a stop during its address lines escape as a KeyboardInterrupt traceback")
    with socket.socket() as s:  # returned normally, and the server let its port go
        s.bind(("127.0.0.1", port))


def test_app_py_names_its_own_share_switch():
    """The lines app.py prints once it listens: the address, then the switch for a public link or the link itself.

    ``app.py`` as a process (these lines on its output, exit code 0 on SIGTERM,
    its temporary folder removed) is run once, by the browser test that opens
    its first page (``tests/test_app_browser.py``).
    """
    assert "--share" in startup_lines("http://127.0.0.1:7860")[1]
    assert "https://x.gradio.live" in startup_lines("http://127.0.0.1:7860", "https://x.gradio.live")[1]
