"""The dashboard: handlers and plot builders called directly, then a real server.

Everything runs on the tiny random Llama with the smoke preset (seconds).
"""

from __future__ import annotations

import csv
import io
import json
import math
import threading
from dataclasses import astuple

import plotly.graph_objects as go
import pytest
from conftest import smoke_app
import torch

from bsi.app import chat, compare, inspect, plots, spectra
from bsi.app.compress import Form, build_config, cancel_job, eps_rule_text, run_job, sigma_max_of, validate_upload
from bsi.app.state import JobBoard, Session
from bsi.config import make_config
from bsi.errors import BSIError
from bsi.pipeline.losses import answer_token_loss
from bsi.method.scores import eps_rule
from bsi.models import load_model_and_tokenizer


@pytest.fixture(scope="module")
def finished():
    """One smoke run through the job generator, shared by the tests that read its results."""
    import os
    import tempfile

    cache = tempfile.mkdtemp(prefix="bsi-app-cache-")
    old = os.environ.get("BSI_CACHE")
    os.environ["BSI_CACHE"] = cache
    torch.set_num_threads(1)
    try:
        session, board = Session(), JobBoard()
        views = list(run_job(board, session, Form.for_preset("smoke"), min_interval=0))
    finally:
        if old is None:
            os.environ.pop("BSI_CACHE")
        else:
            os.environ["BSI_CACHE"] = old
    return session, board, views


# ------------------------------------------------------------------ compress
def test_job_streams_rounds_and_frees_the_board(finished):
    session, board, views = finished
    assert views[-1].status.startswith("**Done**"), views[-1].status
    assert [r.round for r in session.rounds] == [1, 2]
    seen = {tuple(v.rounds) for v in views}
    assert (1,) in seen and (1, 2) in seen  # each round reached the UI as it finished
    assert not board.busy and not session.running
    assert session.compressed.params < session.original.params  # the chat models are in place
    assert session.summary["params_after"] == session.compressed.params
    # the figures hold what the session recorded
    last = views[-1]
    assert len(last.ranks.data[0].z) == len(session.rounds[0].layers)
    assert len(last.ranks.data[0].z[0]) == 3  # before, round 1, round 2
    assert last.params.data[0].y[-1] == session.rounds[-1].params_total
    stages = {t.name for t in last.loss.data}
    assert {"train", "profile", "recover"} <= stages
    assert "eps used" in last.eps_text


def test_busy_board_refuses_a_second_job():
    board = JobBoard()
    assert board.try_acquire("someone else's job")
    views = list(run_job(board, Session(), Form.for_preset("smoke")))
    assert len(views) == 1 and "Busy" in views[0].status and "someone else's job" in views[0].status
    board.release()
    assert not board.busy


def test_bad_form_is_reported_before_taking_the_board():
    board = JobBoard()
    form = Form.for_preset("smoke")
    form.size_value = 1.5
    views = list(run_job(board, Session(), form))
    assert "target_ratio must be in (0, 1]" in views[-1].status and not board.busy


def test_cancel_stops_within_a_step(tmp_path, monkeypatch):
    monkeypatch.setenv("BSI_CACHE", str(tmp_path))
    session, board = Session(), JobBoard()
    jobs = run_job(board, session, Form.for_preset("smoke"), min_interval=0)
    first = next(jobs)
    assert "Starting" in first.status and board.busy
    steps_seen = None
    for view in jobs:
        if session.steps and steps_seen is None:
            assert "Cancelling" in cancel_job(session)
            steps_seen = len(session.steps)
    assert "Cancelled" in view.status
    assert len(session.steps) <= steps_seen + 1  # at most the step already under way
    assert not board.busy and not session.running and session.compressed is None
    assert "Nothing to cancel" in cancel_job(session)


def test_form_defaults_and_config():
    default = Form.for_preset("default")
    assert default.model_source == "embedded" and default.preset == "default"
    config = build_config(default)  # a first click with nothing changed is valid
    assert config.model == "smollm2-135m-instruct" and config == make_config("default")
    target = Form.for_preset("smoke")
    target.size_mode, target.size_value, target.eps = "target", 0.4, 0.01
    config = build_config(target)
    assert config.compress.target_ratio == 0.4 and config.compress.size_mode == "target" and config.compress.eps == 0.01
    hub = Form(model_source="hub", model_name="")
    with pytest.raises(BSIError, match="hub id"):
        build_config(hub)
    assert not build_config(Form(model_source="hub", model_name="org/model")).trust_remote_code


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


def test_upload_size_limit(tmp_path, monkeypatch):
    import bsi.app.compress as compress

    monkeypatch.setattr(compress, "MAX_UPLOAD_BYTES", 100)
    big = tmp_path / "big.jsonl"
    big.write_text(json.dumps({"question": "x" * 200, "answer": "#### 1"}) + "\n")
    with pytest.raises(BSIError, match="the limit is"):
        compress.validate_upload(str(big))


def test_eps_rule_display_matches_the_rule():
    model, _ = load_model_and_tokenizer("tiny-random-llama")
    sigma_max = sigma_max_of(model)
    weights = [m.weight for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    assert sigma_max == pytest.approx(max(float(torch.linalg.svdvals(w.detach())[0]) for w in weights), rel=1e-5)
    text = eps_rule_text(sigma_max, torch.float32)
    assert f"{eps_rule(sigma_max, torch.float32):.3g}" in text
    assert "0.1" in eps_rule_text(82.0, torch.bfloat16)  # capped in bf16
    assert "press" in eps_rule_text(None)


# ------------------------------------------------------------------ inspect
def test_inspect_rows_table_and_csv(finished, tmp_path):
    session, _, _ = finished
    layer = session.rounds[0].layers[0]
    rows = inspect.basis_rows(layer)
    assert len(rows) == layer.rank_before
    for row in rows:
        assert row["importance"] == pytest.approx(row["grad_term"] + row["hessian_term"], abs=1e-6)  # score bsi
        assert row["grad_term"] == pytest.approx(-row["sigma"] * row["grad"], rel=1e-5, abs=1e-12)
    statuses = [r["status"] for r in rows]
    assert statuses.count("pruned") == layer.pruned.numel() == layer.rank_before - layer.rank_after
    assert statuses.count("protected") == layer.rank_before - layer.pool.numel()
    assert all(r["hessian"] == 0 for r in rows if r["status"] == "protected")  # probes are 0 outside the pool
    text, fig, table, path = inspect.view(session.rounds, 1, layer.name)
    assert layer.name in text and len(table) == len(rows) and isinstance(fig, go.Figure)
    parsed = list(csv.DictReader(io.StringIO(open(path).read())))
    assert len(parsed) == len(rows) and float(parsed[3]["sigma"]) == pytest.approx(rows[3]["sigma"])
    assert inspect.view(session.rounds, 9, layer.name)[2] == []


# ------------------------------------------------------------------ chat
def test_chat_streams_both_models(finished):
    session, _, _ = finished
    updates = list(chat.respond(session, "What is 2 + 3?", max_new_tokens=12))
    assert len(updates) >= 2
    compressed, original = updates[-1]
    for history in (compressed, original):
        assert [m["role"] for m in history] == ["user", "assistant"] and history[1]["content"]
    # the streamed reply is the model's own greedy answer
    expected = session.chats["compressed"].history[-1]["content"]
    assert compressed[1]["content"] in (expected, chat.EMPTY_REPLY)
    assert "compressed" in chat.sizes_text(session) and f"{session.original.params:,}" in chat.sizes_text(session)
    with pytest.raises(BSIError, match="empty message"):
        list(chat.respond(session, "  "))
    assert chat.clear(session) == ([], [])
    with pytest.raises(BSIError, match="no compressed model"):
        list(chat.respond(Session(), "hi"))


def test_chat_replies_with_text():
    model, tokenizer = load_model_and_tokenizer("tiny-random-llama")
    from bsi.app.state import LoadedModel

    session = Session(compressed=LoadedModel(model, tokenizer, "compressed", 1))
    *_, (history, other) = chat.respond(session, "hi", max_new_tokens=16)
    assert other == [] and history[1]["content"] not in ("", chat.EMPTY_REPLY)


# ------------------------------------------------------------------ spectra
def test_power_law_fit_and_probe_bound():
    ks = torch.arange(1, 41, dtype=torch.float64)
    c, a = spectra.power_law_fit((3.0 * ks ** -1.3).flip(0))
    assert c == pytest.approx(3.0, rel=1e-9) and a == pytest.approx(1.3, rel=1e-9)
    assert spectra.harmonic(3, 2) == pytest.approx(1 + 1 / 4 + 1 / 9)
    assert spectra.zeta(2.0) == pytest.approx(math.pi ** 2 / 6, rel=1e-9)
    n, lam, tr, e, d = 64, 2.0, 10.0, 0.1, 0.05
    expected = 2 * (lam ** 2 * spectra.harmonic(n, 2.0) / (tr ** 2 / n) - 1) * math.log(2 * n / d) / e ** 2
    assert spectra.probes_needed(n, 1.0, lam, tr, e, d) == pytest.approx(expected)
    assert spectra.probes_needed(n, 1.0, lam, tr, e / 2, d) == pytest.approx(4 * expected)
    assert spectra.probes_needed_psd(n, 1.0, e, d) == pytest.approx(
        2 * (n * math.pi ** 2 / 6 - 1) * math.log(2 * n / d) / e ** 2, rel=1e-6)
    with pytest.raises(BSIError, match="relative error"):
        spectra.probes_needed(n, 1.0, lam, tr, 1.5, d)
    assert "probes" in spectra.calculator_text(n, 1.0, lam, tr, e, d)


def test_exact_layer_hessian_matches_finite_differences():
    from bsi.data import BatchStream, load_task
    from bsi.method.curvature import sigma_gradients

    model, tokenizer = load_model_and_tokenizer("tiny-random-llama", dtype=torch.float64)
    task = load_task("embedded-math", test_size=1, train_size=4)
    batch = next(iter(BatchStream(task.train, tokenizer, batch_size=2, max_length=64)))
    name = "model.layers.1.mlp.down_proj"
    before = dict(model.named_modules())[name]
    hessian = spectra.layer_hessian(model, name, batch, answer_token_loss, 6)
    assert dict(model.named_modules())[name] is before  # the layer is put back
    assert model.config._attn_implementation == "sdpa"
    assert hessian.shape == (6, 6) and torch.allclose(hessian, hessian.T)
    with spectra.basis_form_of(model, name) as layer:  # column 2 by central differences of the gradient
        h = 1e-2  # sigma is fp32: a larger step keeps rounding out of the difference
        cols = []
        for sign in (1, -1):
            with torch.no_grad():
                layer.sigma[2] += sign * h
            layer.sigma.requires_grad_(True)
            _, grads = sigma_gradients(model, [layer], batch, answer_token_loss)
            cols.append(grads[0][:6].double())
            with torch.no_grad():
                layer.sigma[2] -= sign * h
    fd = (cols[0] - cols[1]) / (2 * h)
    assert torch.allclose(hessian[:, 2], fd, rtol=1e-2, atol=1e-6)


def test_spectrum_of_the_last_run(finished):
    session, _, _ = finished
    names = spectra.layer_names(session, Form.for_preset("smoke"))
    eigenvalues, fit, info = spectra.compute(session, Form.for_preset("smoke"), names[0], 5, 2)
    assert eigenvalues.shape == (5,) and info["n"] == 5 and info["lambda1"] == pytest.approx(float(eigenvalues.abs().max()))
    fig = plots.spectrum_figure(eigenvalues.tolist(), fit)
    assert fig.layout.xaxis.type == "log" and len(fig.data) == 3


# ------------------------------------------------------------------ compare
def test_compare_loads_a_sweep(tmp_path):
    rows = [{"method": m, "target": t, "params_total": int(1e6 * t), "accuracy": a, "loss": 1.0 - a, "seconds": 3}
            for m, pts in {"bsi": [(0.5, 0.4), (0.3, 0.3)], "svd": [(0.5, 0.35), (0.3, 0.1)]}.items() for t, a in pts]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    status, fig, table = compare.view(str(tmp_path))
    assert "4 runs" in status and {t.name for t in fig.data} == {"bsi", "svd"}
    assert table[0] == ["bsi", 0.5, 500000, 40.0, pytest.approx(0.6)]
    (tmp_path / "results.jsonl").write_text(json.dumps(rows[0]) + "\n" + '{"method": "x"}\n')
    with pytest.raises(BSIError, match="line 2: missing field"):
        compare.load_results(str(tmp_path))
    with pytest.raises(BSIError, match="does not exist"):
        compare.load_results(str(tmp_path / "nope"))


# ------------------------------------------------------------------ plots
def test_plot_builders_on_empty_and_real_data(finished):
    session, _, _ = finished
    for empty in (plots.loss_figure([]), plots.params_figure([]), plots.rank_heatmap([]), plots.basis_figure([]),
                  plots.spectrum_figure([]), plots.compare_figure([])):
        assert isinstance(empty, go.Figure) and empty.layout.annotations  # a message instead of a blank plot
    fig = plots.loss_figure([("train", 1, 2.0), ("train", 2, 1.5), ("profile", 3, 1.6)])
    assert [t.name for t in fig.data] == ["train", "profile"] and list(fig.data[0].y) == [2.0, 1.5]
    heat = plots.rank_heatmap(session.rounds)
    z = heat.data[0].z
    assert all(row[0] >= row[1] >= row[2] for row in z)  # ranks only shrink


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

    # a second visitor while a job runs sees "busy"; the first can cancel
    other = Client(server.local_url, verbose=False)
    assert server.board.try_acquire("test holder")
    try:
        busy = list(other.submit(*astuple(Form.for_preset("smoke")), api_name="/start"))
        assert "Busy" in busy[-1][0]
    finally:
        server.board.release()
