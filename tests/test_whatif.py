"""What-if cuts: the rule over one round's scores (bsi.analysis.whatif), the masked model it measures
(bsi.pipeline.whatif), and the conversion cache that lets a live run show its first round sooner.

* the rule, on hand-made scores: KeepRatio's mass rule is the engine's, a target lands on its budget, every
  ranking fills the same size, the predicted rise is the removed importance, only candidates go, bad input
  answers in one line;
* the engine: the Fisher scores every basis while its cuts stay as they were (the same pruned sets and the same
  importance in the pools as a Fisher masked to the pools), and a cut made by zeroing coefficients in a round's
  rebuilt model gives the loss the engine's own cut gave (the monitor batch's loss after the cut);
* the measurement on a tiny model with a real tokenizer: the model is left as found, the points accumulate.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import lm_loss, make_tiny_llama, token_batches

from bsi.analysis.ranking import RoundSnapshots, removed
from bsi.analysis.whatif import (
    RANK_BY,
    WhatIfLayer,
    WhatIfScores,
    largest_cut,
    path_cut,
    path_predicted,
    plan_cut,
)
from bsi.config import CompressConfig, SizeRule
from bsi.errors import BSIError
from bsi.method import curvature
from bsi.method.engine import Compressor
from bsi.method.schedule import LayerShape, mass_selection, parameters_after
from bsi.method.surgery import basis_layers
from bsi.pipeline.whatif import WhatIf
from bsi.reports import RoundReport


def hand_made(scope: str = "all", seed: int = 0) -> WhatIfScores:
    """Three layers of different shapes with random scores (every basis a candidate, or the first half)."""
    generator = torch.Generator().manual_seed(seed)
    layers = {}
    for name, (d_in, d_out) in {"a": (16, 16), "b": (16, 48), "c": (48, 16)}.items():
        r = min(d_in, d_out)
        sigma = torch.rand(r, generator=generator).sort(descending=True).values * 10
        importance = torch.rand(r, generator=generator) ** 3 - 0.05  # a few negative
        gradient = torch.randn(r, generator=generator) * 0.01
        candidates = torch.arange(r) if scope == "all" else torch.arange(r // 2, r)
        layers[name] = WhatIfLayer(name, LayerShape(d_in, d_out, r, 0, False), sigma, importance, gradient, candidates)
    dense = sum(s.shape.dense for s in layers.values())
    return WhatIfScores(1, layers, dense, 1000, scope)


def test_keep_rule_is_the_engines_mass_rule_once():
    scores = hand_made()
    cut = plan_cut(scores, "keep", 0.6)
    importance = {n: layer.importance for n, layer in scores.layers.items()}
    expected = mass_selection(importance, {n: layer.candidates for n, layer in scores.layers.items()}, 0.6)
    assert all(torch.equal(cut.pruned[n], expected[n]) for n in expected)
    for n, layer in scores.layers.items():  # negative importance always goes
        assert set(torch.nonzero(layer.importance < 0).flatten().tolist()) <= set(cut.pruned[n].tolist())
        assert cut.kept[n] == layer.rank - cut.pruned[n].numel()
    assert cut.predicted == pytest.approx(sum(float(importance[n][p].sum()) for n, p in cut.pruned.items()), rel=1e-6)
    assert cut.params_compressible == parameters_after(scores.shapes, cut.pruned, "stored")
    assert cut.params_total == cut.params_compressible + 1000 and cut.compression > 1
    assert plan_cut(scores, "keep", 0.3).removed > cut.removed > plan_cut(scores, "keep", 0.9).removed


@pytest.mark.parametrize("target", [0.9, 0.6, 0.35])
def test_every_ranking_fills_the_same_size(target):
    scores = hand_made()
    cuts = {r: plan_cut(scores, "target", target, rank_by=r) for r in RANK_BY}
    budget = target * scores.compressible_before
    step = max(s.per_basis for s in scores.shapes.values())  # one basis more or less
    for rank_by, cut in cuts.items():
        assert abs(cut.params_compressible - budget) <= step, rank_by
        assert cut.compressible_ratio == pytest.approx(target, abs=step / scores.compressible_before)
    assert cuts["bsi"].selection == "global" and cuts["magnitude"].selection == "per-layer"
    # bsi's own importance predicts its own cut to cost the least (it removes the least importance per parameter)
    assert cuts["bsi"].predicted <= min(c.predicted for c in cuts.values()) + 1e-9
    keep = plan_cut(scores, "keep", 0.5)
    by_sigma = plan_cut(scores, "keep", 0.5, rank_by="magnitude")  # the same size, filled by |sigma|
    assert abs(by_sigma.params_compressible - keep.params_compressible) <= step


def test_selection_can_be_forced_and_random_is_seeded():
    scores = hand_made()
    per_layer = plan_cut(scores, "target", 0.5, selection="per-layer")
    across = plan_cut(scores, "target", 0.5, selection="global")
    assert per_layer.selection == "per-layer" and across.selection == "global"
    assert any(not torch.equal(per_layer.pruned[n], across.pruned[n]) for n in scores.layers)
    one, same, other = (plan_cut(scores, "target", 0.5, rank_by="random", seed=s) for s in (1, 1, 2))
    assert all(torch.equal(one.pruned[n], same.pruned[n]) for n in scores.layers)
    assert any(not torch.equal(one.pruned[n], other.pruned[n]) for n in scores.layers)


def test_only_candidates_go_and_an_unreachable_size_says_so():
    scores = hand_made(scope="pool")
    cut = plan_cut(scores, "target", 0.2)
    for n, layer in scores.layers.items():
        assert set(cut.pruned[n].tolist()) <= set(layer.candidates.tolist())
    floor = largest_cut(scores)
    assert floor > 0.2 and cut.compressible_ratio == pytest.approx(floor)
    assert cut.notes and "candidate pools only" in cut.notes[0]
    assert not plan_cut(scores, "target", floor + 0.05).notes


@pytest.mark.parametrize("call, message", [
    (lambda s: plan_cut(s, "size", 0.5), "unknown size rule 'size'"),
    (lambda s: plan_cut(s, "keep", 1.5), r"KeepRatio must be in \(0, 1\], got 1.5"),
    (lambda s: plan_cut(s, "target", 0), "target share of the compressible layers must be in"),
    (lambda s: plan_cut(s, "target", 0.5, rank_by="sigma"), "unknown ranking 'sigma'"),
    (lambda s: plan_cut(s, "target", 0.5, selection="each"), "unknown selection 'each'"),
])
def test_bad_input_is_one_line_before_any_work(call, message):
    with pytest.raises(BSIError, match=message):
        call(hand_made())


def test_a_round_without_gradients_cannot_rank_by_them():
    scores = hand_made()
    scores.layers["a"] = dataclasses.replace(scores.layers["a"], gradient=None)
    with pytest.raises(BSIError, match="measured no gradient"):
        plan_cut(scores, "target", 0.5, rank_by="gradient")


# ------------------------------------------------------------------ the engine
class PoolOnlyFisher(Compressor):
    """The engine with its Fisher measured inside the candidate pools only (as before 2026-11-28)."""

    def _curvature_source(self):
        return dataclasses.replace(curvature.Fisher(), measures_every_basis=False)


def engine_run(engine=Compressor, rounds=3):
    """A tiny model pruned by the engine with Fisher scores; every round's model kept before its cut."""
    model = make_tiny_llama()
    config = CompressConfig(size=SizeRule.target(0.5), rounds=rounds, iters_per_epoch=3 * rounds, sampling_ratio=0.34,
                            aux_rank=2)
    snapshots = RoundSnapshots()
    compressor = engine(model, token_batches(), config, lm_loss, before_cut=snapshots.capture)
    reports = [r for r in compressor.run() if isinstance(r, RoundReport)]
    return compressor, reports, snapshots


def test_the_fisher_scores_every_basis_and_cuts_as_before():
    _, everywhere, _ = engine_run()
    _, pooled, _ = engine_run(PoolOnlyFisher)
    for a, b in zip(everywhere, pooled):
        assert a.curvature_scope == "all" and b.curvature_scope == "pool"
        for la, lb in zip(a.layers, b.layers):
            assert torch.equal(la.pruned, lb.pruned) and torch.equal(la.pool, lb.pool)
            torch.testing.assert_close(la.importance[la.pool], lb.importance[lb.pool])
            outside = torch.ones(la.rank_before, dtype=torch.bool)
            outside[la.pool] = False
            assert (lb.hessian[outside] == 0).all()
            if outside.any():
                assert (la.hessian[outside] > 0).all()  # measured there too, for free
            assert (la.in_features, la.out_features) != (0, 0)


def test_a_masked_cut_of_a_rebuilt_round_gives_the_engines_loss_after_its_cut():
    compressor, reports, snapshots = engine_run()
    monitor = compressor._monitor
    for report in reports:
        model = snapshots.model_at(report.round)
        layers = basis_layers(model)
        with torch.no_grad():
            before = float(lm_loss(model, monitor))
            with removed(layers, path_cut(report)):
                after = float(lm_loss(model, monitor))
            assert float(lm_loss(model, monitor)) == before  # left as found
        assert before == pytest.approx(report.loss_before, rel=1e-5)
        assert after == pytest.approx(report.loss_after, rel=1e-5)
    # the rule reproduces the size of the engine's own first cut when asked for it
    scores = WhatIfScores.from_round(reports[0])
    assert scores.scope == "all" and scores.parameters_now == pytest.approx(reports[0].compressible_before, rel=0.01)
    cut = plan_cut(scores, "target", reports[0].compressible_ratio)
    assert cut.compressible_ratio == pytest.approx(reports[0].compressible_ratio, abs=0.02)
    assert path_predicted(reports, 1) == pytest.approx(
        sum(float(layer.importance[layer.pruned].sum()) for layer in reports[0].layers), rel=1e-6)


def test_records_without_shapes_are_refused_with_what_to_do():
    _, reports, _ = engine_run(rounds=2)
    old = dataclasses.replace(reports[0], layers=tuple(dataclasses.replace(layer, in_features=0)
                                                      for layer in reports[0].layers))
    with pytest.raises(BSIError, match="no layer shapes.*run it again"):
        WhatIfScores.from_round(old)


# ------------------------------------------------------------------ the conversion cache
def test_a_cached_conversion_gives_the_same_run_bit_for_bit(tmp_path):
    """The smoke preset twice on one cache: the second run converts from the file and every round is the same."""
    from bsi.config import resolve_config
    from bsi.pipeline.runner import Pipeline
    from bsi.reports import StageReport

    config = resolve_config("smoke", {"compress": {"calibration_batches": 2}})

    def run():
        pipeline = Pipeline(config, cache_dir=tmp_path / "cache")
        reports = list(pipeline.run())
        cached = [r.detail for r in reports if isinstance(r, StageReport) and r.stage == "convert" and r.cached]
        return pipeline, [r for r in reports if isinstance(r, RoundReport)], cached

    first, rounds_first, notes_first = run()
    cache = first.bases_cache
    assert cache.present and not notes_first
    info = cache.info()
    assert info["bytes"] == (cache.folder / "bases.safetensors").stat().st_size > 0
    assert info["inputs"]["bases"] == "whitened" and info["inputs"]["calibration_batches"] == 2
    second, rounds_second, notes_second = run()
    assert notes_second == [str(cache.folder)]
    assert len(rounds_first) == len(rounds_second) > 0
    for a, b in zip(rounds_first, rounds_second):
        assert (a.loss_before, a.loss_after, a.mean_loss) == (b.loss_before, b.loss_after, b.mean_loss)
        for la, lb in zip(a.layers, b.layers):
            assert torch.equal(la.importance, lb.importance) and torch.equal(la.pruned, lb.pruned)
    assert first.metrics["recovered"].loss == second.metrics["recovered"].loss
    # another calibration is another entry
    other = Pipeline(resolve_config("smoke", {"compress": {"calibration_batches": 3}}), cache_dir=tmp_path / "cache")
    assert other.bases_cache.folder != cache.folder and not other.bases_cache.present


# ------------------------------------------------------------------ measuring
@pytest.fixture(scope="module")
def tiny_whatif():
    """A smoke run of the tiny model with its round models kept: the What-if of a run made in this process."""
    from bsi.config import resolve_config
    from bsi.pipeline.runner import Pipeline

    pipeline = Pipeline(resolve_config("smoke"))
    snapshots = RoundSnapshots()
    pipeline.before_cut = snapshots.capture
    list(pipeline.run())
    return WhatIf(pipeline.rounds, snapshots, pipeline.task.test[:6], pipeline.tokenizer, answered=2,
                  max_new_tokens=8), pipeline


def test_a_measured_cut_is_the_masked_basis_model_merged_and_leaves_it_as_found(tiny_whatif):
    from bsi.pipeline.whatif import measure_cut

    whatif, _ = tiny_whatif
    cut = whatif.plan(1, "target", 0.6)
    model = whatif.model_at(1)
    sigmas = {n: layer.sigma.detach().clone() for n, layer in basis_layers(model).items()}
    point = whatif.measure(cut, 1)
    direct = measure_cut(model, cut.pruned, whatif.tokenizer, whatif.examples, answered=2, max_new_tokens=8)
    assert point.measurement.loss == pytest.approx(direct.loss, rel=1e-4)
    assert [a.prediction for a in point.measurement.answers] == [a.prediction for a in direct.answers]
    assert all(torch.equal(layer.sigma, sigmas[n]) for n, layer in basis_layers(model).items())
    assert point.uncut_loss == pytest.approx(whatif.uncut(1).loss) and len(point.measurement.answers) == 2
    assert point.measurement.problems == 6 and point.measured == pytest.approx(point.measurement.loss - point.uncut_loss)
    # the run's own model after its first cut, merged, gives the engine's cut measured directly
    path = whatif.path_point(1)
    engine_cut = measure_cut(model, path_cut(whatif.report(1)), whatif.tokenizer, whatif.examples, answered=0)
    assert path.measurement.loss == pytest.approx(engine_cut.loss, rel=1e-4)
    assert path.compressible_ratio == pytest.approx(whatif.report(1).compressible_ratio)
    assert whatif.points == [point] and whatif.path == [path]


def test_a_run_without_its_round_models_plans_but_does_not_measure(tiny_whatif):
    whatif, pipeline = tiny_whatif
    plans_only = WhatIf(pipeline.rounds)
    assert not plans_only.can_measure
    assert plans_only.plan(1, "target", 0.6).removed == whatif.plan(1, "target", 0.6).removed
    with pytest.raises(BSIError, match="prepare them first"):
        plans_only.uncut(1)
    with pytest.raises(BSIError, match="no round 9"):
        plans_only.plan(9, "target", 0.6)
