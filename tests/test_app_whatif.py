"""The dashboard's What-if tab (bsi.app.whatif) on the tiny model, its handlers called as the page calls them.

* a run made in the Compress tab is planned at once and measured at once: the plan's figure and size, the
  measurement's answers beside the dense model's, the curve with the run's own path, the shown size equal
  to the model physically cut to it;
* a saved run plans from its records, says that measuring needs *Prepare* and how long that takes, and
  Prepare rebuilds its round models (the same rounds as the saved ones), after which Measure works;
* the eps study of one layer: Hutchinson's error against the exact diagonal, a second eps reuses the setup;
* bad input and a busy server answer in one line.
"""

from __future__ import annotations

import copy
import dataclasses
import re

import plotly.graph_objects as go
import pytest
import torch

from bsi.app import whatif as tab
from bsi.app.form import Form
from bsi.app.job import run_job
from bsi.app.saved import read_saved_run
from bsi.app.state import JobBoard, Session
from bsi.method.surgery import basis_layers, model_parameters


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """A smoke run made through the Compress tab's job, saved to a folder (so it can be prepared again)."""
    torch.set_num_threads(1)
    folder = tmp_path_factory.mktemp("whatif") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BSI_CACHE", str(folder.parent / "cache"))
        session = Session()
        form = Form.for_preset("smoke")
        form = dataclasses.replace(form, out_dir=str(folder))
        views = list(run_job(JobBoard(), session, form, min_interval=0))
        assert views[-1].status.startswith("**Done**"), views[-1].status
        yield session, folder


def test_a_run_of_this_session_plans_and_measures_at_once(live):
    session, _ = live
    ids, first = tab.round_choices(session)
    assert ids == [1, 2] and first == 1
    assert "in memory" in tab.source_text(session)
    text, fig = tab.plan_view(session, 1, "target", 0.6, "bsi", "auto")
    assert "smaller" in text and "predicted loss rise" in text and isinstance(fig, go.Figure)
    assert sum(len(trace.y) for trace in fig.data) == len(session.rounds[0].layers)
    steps = list(tab.measure(session, 1, "target", 0.6, "bsi", "auto"))
    tables = [table for _, table, _ in steps if table is not None]
    curves = [curve for _, _, curve in steps if curve is not None]
    assert tables and "dense, fine-tuned" in tables[-1] and "measured rise" in tables[-1]
    assert len(re.findall(r"^\| .* \| .* \| .* \| .* \|$", tables[-1], re.M)) >= 2 + tab.ANSWERED
    names = {trace.name for trace in curves[-1].data}
    assert {"bsi", "the run (rounds + tuning)"} <= names
    whatif = tab.explorer(session)
    assert [p.round for p in whatif.path] == [1, 2] and len(whatif.points) == 1


def test_the_shown_size_is_the_model_physically_cut_to_it(live):
    session, _ = live
    whatif = tab.explorer(session)
    cut = tab.plan(session, 2, "keep", 0.9, "magnitude", "per-layer")
    text, _ = tab.plan_view(session, 2, "keep", 0.9, "magnitude", "per-layer")
    model = copy.deepcopy(whatif.model_at(2))
    for name, layer in basis_layers(model).items():
        kept = torch.tensor(sorted(set(range(layer.rank)) - set(cut.pruned[name].tolist())), dtype=torch.long)
        layer.keep(kept)
    shown = int(re.search(r"\(([\d,]+) of [\d,]+ parameters", text).group(1).replace(",", ""))
    assert shown == cut.params_total == model_parameters(model)


def test_a_saved_run_plans_says_how_long_prepare_takes_then_prepares(live, monkeypatch):
    session, folder = live
    monkeypatch.setenv("BSI_CACHE", str(folder.parent / "cache"))
    saved = read_saved_run(folder)
    visitor = Session()
    saved.fill(visitor)
    assert not tab.explorer(visitor).can_measure
    text = tab.source_text(visitor, saved)
    assert "Prepare" in text and "preset `smoke`" in text and "the fine-tune is cached" in text
    assert "the conversion is cached" in text  # the live run converted once and kept it
    refused = list(tab.measure(visitor, 1, "target", 0.6, "bsi", "auto"))
    assert len(refused) == 1 and "press **Prepare** first" in refused[0][0]
    board = JobBoard()
    assert board.try_acquire("someone else")
    busy = list(tab.prepare(board, visitor, saved))
    assert len(busy) == 1 and "Busy" in busy[0][0] and not tab.explorer(visitor).can_measure
    board.release()
    steps = list(tab.prepare(board, visitor, saved))
    assert steps[-1][1] == [1, 2] and "Prepared in" in steps[-1][0] and 'progress value="1.000"' in steps[-1][0]
    assert not board.busy
    whatif = tab.explorer(visitor)
    assert whatif.can_measure and [p.round for p in whatif.path] == [1, 2]
    for mine, shipped in zip(whatif.rounds, saved.rounds):  # the rounds made again are the saved ones
        assert mine.removed == shipped.removed and mine.params_total == shipped.params_total
    again = list(tab.prepare(board, visitor, saved))
    assert len(again) == 1 and "Prepared already" in again[0][0]
    measured = list(tab.measure(visitor, 2, "target", 0.5, "random", "auto"))
    assert any(table for _, table, _ in measured)


def test_the_eps_study_of_one_layer(live):
    session, _ = live
    name = session.rounds[0].layers[-1].name
    first = list(tab.eps_view(session, 1, name, -2, "target", 0.6, "bsi", "auto"))
    assert "Fisher and its exact diagonal" in first[0][0]
    text, fig = first[-1]
    assert "error at the" in text and "kept bases" in text and isinstance(fig, go.Figure)
    study = session.eps_studies[(1, name)]
    assert 0 < study.points[0.01].error and study.exact.numel() == min(8, study.sigma.numel())
    second = list(tab.eps_view(session, 1, name, -4, "target", 0.6, "bsi", "auto"))
    assert not any("exact diagonal at" in t for t, _ in second[:-1])  # the layer's setup is reused
    assert set(study.points) == {0.01, 1e-4}
    bad = list(tab.eps_view(session, 1, name, 0.5, "target", 0.6, "bsi", "auto"))
    assert bad[-1][0] == "**Error:** eps must be in (0, 1), got 3.16228"


def test_bad_controls_answer_in_one_line(live):
    session, _ = live
    text, fig = tab.plan_view(session, 1, "target", 1.5, "bsi", "auto")
    assert text.startswith("**Error:**") and "must be in (0, 1]" in text
    text, _ = tab.plan_view(session, 7, "target", 0.5, "bsi", "auto")
    assert "no round 7" in text
    empty = Session()
    assert "No run yet" in tab.plan_view(empty, None, "target", 0.5, "bsi", "auto")[0]
    assert "No run to measure" in next(tab.measure(empty, None, "target", 0.5, "bsi", "auto"))[0]
    assert tab.slider_settings("keep", 0.7)["minimum"] == tab.KEEP_RANGE[0]
    assert tab.slider_settings("target", 0.7)["value"] == 0.7
