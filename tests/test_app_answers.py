"""The dashboard's Answers, Chat-reference, Help and first-visit handlers, called directly (no server).

A smoke run saved to a folder (the tiny random Llama, seconds) stands for a
run; the study shipped in ``data/`` for a sweep. Each bad input gets one line
that says what to change and no half-filled view.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from bsi.analysis.answers import CATEGORIES
from bsi.app import answers, chat, compare, guide
from bsi.app.form import preset_label, preset_line, preset_order
from bsi.app.state import Session
from bsi.config import PRESET_COSTS, PRESETS, make_config
from bsi.errors import BSIError
from bsi.pipeline.runner import Pipeline


@contextmanager
def private_root(prefix: str):
    """A temporary folder whose ``cache/`` is BSI_CACHE while it lasts (for module-scoped fixtures)."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    old = os.environ.get("BSI_CACHE")
    os.environ["BSI_CACHE"] = str(root / "cache")
    try:
        yield root
    finally:
        if old is None:
            os.environ.pop("BSI_CACHE")
        else:
            os.environ["BSI_CACHE"] = old
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def saved_run():
    """A finished smoke run saved to a folder, and the cache holding its fine-tune."""
    torch.set_num_threads(1)
    with private_root("bsi-app-answers-") as root:
        for _ in Pipeline(make_config("smoke"), out_dir=root / "run").run():
            pass
        yield root / "run", root / "cache"


# ------------------------------------------------------------------ a run's answers
def test_run_answers_side_by_side_with_counts_and_filters(saved_run):
    folder, _ = saved_run
    status, rows, choices = answers.run_view(str(folder))
    outcomes = [json.loads(line) for line in (folder / "outcomes.jsonl").read_text().splitlines()]
    answered = [o for o in outcomes if o["model"] == "recovered" and o["correct"] is not None]
    assert len(rows) == len(answered) and choices[0] == (f"all ({len(rows)})", "all")
    counted = {value: int(label.split("(")[1].rstrip(")")) for label, value in choices[1:]}
    assert sum(counted.values()) == len(rows) and set(counted) == set(CATEGORIES)
    assert "reference: **the run's fine-tuned dense model**" in status
    for row in rows:  # both marks, and the category they make
        assert row[4] in ("✓ right", "✗ wrong") and row[6] in ("✓ right", "✗ wrong")
        dense, mine = row[4].startswith("✓"), row[6].startswith("✓")
        assert row[7] == ("both-right" if dense and mine else "lost" if dense else "gained" if mine else "both-wrong")
    for name, count in counted.items():
        filtered = answers.run_view(str(folder), "finetuned", name)[1]
        assert len(filtered) == count and all(r[7] == name for r in filtered)


def test_run_answers_bad_inputs_say_what_to_change(saved_run, tmp_path):
    folder, _ = saved_run
    with pytest.raises(BSIError, match="holds no outcomes.jsonl"):
        answers.run_view(str(tmp_path))
    with pytest.raises(BSIError, match="--dense-recovery"):
        answers.run_view(str(folder), "dense_recovered")
    with pytest.raises(BSIError, match="type the folder"):
        answers.run_view("  ")


# ------------------------------------------------------------------ the chat's reference
def test_chat_reference_is_the_runs_fine_tuned_dense_model(saved_run, monkeypatch, tmp_path):
    folder, cache = saved_run
    session = Session()
    sizes = chat.load_folder(session, str(folder))
    assert "the run's fine-tuned dense model" in sizes and "not fine-tuned" not in sizes
    tuned = [p for p in (cache / "finetuned").iterdir() if (p / "config.json").is_file()]
    assert session.original.source == str(tuned[0])  # the cached fine-tune the run compressed
    monkeypatch.setenv("BSI_CACHE", str(tmp_path / "empty"))  # the fine-tune gone: said plainly
    sizes = chat.load_folder(Session(), str(folder))
    assert "**not fine-tuned**" in sizes and "bsi compress" in sizes
    with pytest.raises(BSIError, match="not a bsi-compressed model folder"):
        chat.load_folder(Session(), str(tmp_path))


# ------------------------------------------------------------------ presets, help
def test_every_preset_shows_its_measured_time():
    assert preset_order()[0] == "tour" and sorted(preset_order()) == sorted(PRESETS)
    for name in PRESETS:
        cost = PRESET_COSTS[name]
        label = preset_label(name)
        assert label.startswith(name)
        if cost.warm_seconds or cost.cached_seconds or cost.uncached_seconds:
            assert "not measured" not in label and " s" in label
            assert ("caches warm" in label) == bool(cost.warm_seconds)  # with and without the caches, as measured
            assert ("fine-tune cached" in label) == bool(cost.cached_seconds)
        else:
            assert label.endswith("not measured")
        assert cost.time_text() in preset_line(name) and cost.gives_up in preset_line(name)


def test_a_preset_whose_general_text_cost_was_measured_states_it(tmp_path):
    """From data/general-text.json (bench/general_text.py): the menu's line and the guide say what general text lost."""
    from bsi.shipped import DATA, general_text_costs, general_text_sentence

    record = {"articles": 3, "runs": [{"preset": "demo", "dense": {"word_perplexity": 31.64},
                                       "compressed": {"word_perplexity": 43765.2}}]}
    (tmp_path / "general-text.json").write_text(json.dumps(record))
    row = general_text_costs(tmp_path)["demo"]
    assert general_text_sentence(row) == ("On general text (WikiText-2, lm-eval word perplexity, 3 articles): 31.6 "
                                          "before compressing, 43,765.2 after.")
    assert general_text_costs(tmp_path / "absent") == {}
    for name, shipped in general_text_costs(DATA).items():  # what ships is shown in the menu and the guide
        assert general_text_sentence(shipped) in preset_line(name) and general_text_sentence(shipped) in \
            guide.presets_markdown()


def test_help_shows_the_defaults_table_and_the_presets():
    from bsi.teaching import defaults_rows

    text = guide.help_markdown()
    assert "| setting | the paper | bsi's default |" in text
    for row in defaults_rows():
        assert f"| {row['setting']} |" in text
    assert "](" not in guide.defaults_markdown()  # the app serves no files: paths, not dead links
    for name in PRESETS:
        assert f"| `{name}` | {PRESET_COSTS[name].time_text()} |" in text


# ------------------------------------------------------------------ a saved run opens the dashboard
def test_a_saved_run_reads_back_for_the_plots_and_inspect(tmp_path, monkeypatch):
    from bsi.app import inspect
    from bsi.app.saved import ROUND_RECORDS, opening_view, read_saved_run
    from bsi.reports import StepReport

    monkeypatch.setenv("BSI_CACHE", str(tmp_path / "cache"))
    pipeline = Pipeline(make_config("smoke"), out_dir=tmp_path / "run")
    steps = [r for r in pipeline.run() if isinstance(r, StepReport)]
    saved = read_saved_run(tmp_path / "run")
    assert [r.round for r in saved.rounds] == [1, 2] and len(saved.steps) == len(steps)
    original, back = pipeline.rounds[1].layers[3], saved.rounds[1].layers[3]
    assert back.name == original.name and torch.equal(back.pool, original.pool) and torch.equal(back.pruned, original.pruned)
    assert torch.equal(back.importance, original.importance) and back.terms.keys() == original.terms.keys()
    assert inspect.basis_rows(back) == inspect.basis_rows(original)  # Inspect shows the saved run as it showed the live one
    view = opening_view(saved)
    assert "Showing a finished run" in view.status and view.rounds == [1, 2]
    assert {t.name for t in view.loss.data} >= {"train", "recover"}
    session = Session()
    saved.fill(session)
    assert session.rounds == saved.rounds and session.summary["params_after"] == saved.summary["params_after"]
    session.summary = None  # a visitor's own run is never replaced by the saved one
    session.rounds = ["mine"]
    saved.fill(session)
    assert session.rounds == ["mine"]
    (tmp_path / "run" / ROUND_RECORDS).unlink()  # a run without per-layer records: its scalars still draw
    plain = read_saved_run(tmp_path / "run")
    assert plain.rounds == [] and list(opening_view(plain).params.data[0].y)[-1] == plain.compact[-1]["params_total"]
    with pytest.raises(BSIError, match="no finished run"):
        read_saved_run(tmp_path)


def test_compare_opens_on_a_folder_or_says_why_not(tmp_path):
    status, figure, table = compare.opening(str(tmp_path))
    assert status.startswith("**Error:**") and "results.jsonl" in status and table["data"] == []


def test_chat_runs_a_prompts_file_through_both_models_marked(saved_run, tmp_path):
    folder, _ = saved_run
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"question": "What is 2 + 3?", "answer": "2 + 3 = 5\\n#### 5"}\n'
                       '{"question": "Name a colour."}\n')
    session = Session()
    chat.load_folder(session, str(folder))
    updates = list(chat.prompts_table(session, str(prompts), 8))
    assert "compressed" in updates[0][0] and updates[0][1] == []  # progress first, no half table
    status, rows = updates[-1]
    assert len(rows) == 2 and rows[0][2] == "5" and rows[1][2] == ""
    assert rows[0][4] in ("✓ right", "✗ wrong") and rows[0][6] in ("✓ right", "✗ wrong")
    assert rows[1][4] == rows[1][6] == ""  # nothing to mark against
    assert "1 with an answer" in status and "the run's fine-tuned dense model" in status and not session.chatting
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "What is 4 + 4?", "answer": "eight"}\n')
    with pytest.raises(BSIError, match='line 1: the answer "eight" has no final number'):
        list(chat.prompts_table(session, str(bad)))
    with pytest.raises(BSIError, match="no compressed model yet"):
        list(chat.prompts_table(Session(), str(prompts)))


# ------------------------------------------------------------------ a sweep's answers
@pytest.fixture(scope="module")
def tiny_sweep():
    """A sweep of two methods at two sizes on the tiny model (seconds), with answers kept."""
    from bsi.config import SweepConfig
    from bsi.pipeline.sweep import Sweep

    with private_root("bsi-app-sweep-") as root:
        config = make_config("smoke", {"eval_examples": 6, "test_size": 6, "max_new_tokens": 8,
                                       "compress": {"rounds": 3, "iters_per_epoch": 6}})
        for _ in Sweep(config, SweepConfig.from_dict({"methods": ("svd", "bsi", "basel"), "targets": (0.6, 0.4)}),
                       root / "sweep").run():
            pass
        yield root / "sweep"


def test_sweep_answers_one_problem_across_methods_and_sizes(tiny_sweep):
    from bsi.analysis.answers import read_sweep_answers

    sweep = read_sweep_answers(tiny_sweep)
    offer = answers.sweep_choices(sweep)
    assert offer["methods"] == ["svd", "bsi", "basel"] and offer["targets"] == [0.6, 0.4] and offer["count"] == 6
    text, rows = answers.problem_view(sweep, 2)
    assert text.startswith("**Problem 2** (seed 0)") and "task's answer" in text
    labels = [row[0] for row in rows]
    assert labels[0] == "dense" and len(rows) == 1 + 3 * 2  # the dense model, then every method at both sizes
    assert any(label.startswith("bsi @ 0.4") for label in labels)
    assert all(row[2] in ("✓ right", "✗ wrong") for row in rows)
    with pytest.raises(BSIError, match="give 0 to 5"):
        answers.problem_view(sweep, 6)
    text, rows, headers = answers.beats_view(sweep, "bsi", ["svd", "basel"], 0.4)
    wins = sweep.beats("bsi", ["svd", "basel"], 0.4)
    assert [row[0] for row in rows] == wins and f"**{len(wins)}** of 6 problems" in text
    assert headers == ["#", "question", "task's answer", "bsi answer", "svd answer", "basel answer"]
    with pytest.raises(BSIError, match="at least one other method"):
        answers.beats_view(sweep, "bsi", ["bsi"], 0.4)


def test_a_sweep_without_answers_says_so(tiny_sweep, tmp_path):
    from bsi.analysis.answers import read_sweep_answers

    rows = [json.loads(line) for line in (tiny_sweep / "results.jsonl").read_text().splitlines()]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if k != "outcomes"}) + "\n"
                                                    for r in rows))
    with pytest.raises(BSIError, match="no per-problem outcomes"):
        read_sweep_answers(tmp_path)
    with pytest.raises(BSIError, match="no sweep results"):
        read_sweep_answers(tmp_path / "nothing")
