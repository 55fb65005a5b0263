import math

import pytest
import torch
from conftest import lm_loss, make_tiny_llama, token_batches

from bsi.config import CompressConfig, HutchinsonConfig, SizeRule
from bsi.errors import BSIError
from bsi.method.engine import Compressor
from bsi.method.surgery import (
    compressible_linear_names,
    compressible_parameters,
    layer_ranks,
    model_parameters,
    to_basis_form,
)
from bsi.reports import RoundReport, StepReport


def run(compressor):
    """(pruning steps, rounds) of a whole run; the calibration steps of whitened bases are left out."""
    steps, rounds = [], []
    for report in compressor.run():
        if isinstance(report, RoundReport):
            rounds.append(report)
        elif report.stage != "calibrate":
            steps.append(report)
    return steps, rounds


def test_conversion_is_exact_and_leaves_tied_head_alone():
    model = make_tiny_llama(tied=True)
    ids = torch.randint(0, 97, (2, 12))
    reference = model(input_ids=ids).logits
    assert "lm_head" not in compressible_linear_names(model)
    layers = to_basis_form(model, aux_rank=4)
    assert len(layers) == 14 and "lm_head" not in layers
    torch.testing.assert_close(model(input_ids=ids).logits, reference, atol=1e-5, rtol=1e-5)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(n.rsplit(".", 1)[1] in ("sigma", "aux_u", "aux_v") for n in trainable)


def test_untied_head_is_compressed():
    model = make_tiny_llama(tied=False)
    assert "lm_head" in compressible_linear_names(model)


def test_model_without_linear_layers_is_rejected_before_any_change():
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4))
    with pytest.raises(BSIError, match="no nn.Linear"):
        to_basis_form(model)


def test_rounds_follow_schedule_and_shrink_layers():
    model = make_tiny_llama()
    config = CompressConfig(size=SizeRule.keep(0.5), rounds=3, iters_per_epoch=12, sampling_ratio=0.5, aux_rank=2)
    compressor = Compressor(model, token_batches(), config, lm_loss)
    full = {n: min(model.get_submodule(n).weight.shape) for n in compressible_linear_names(model)}
    steps, rounds = run(compressor)
    assert len(steps) == 12 and len(rounds) == 3
    assert [s.stage for s in steps[:4]] == ["train", "train", "profile", "profile"]
    params = [r.params_compressible for r in rounds]
    assert params == sorted(params, reverse=True) and params[-1] < rounds[0].compressible_before
    for r in rounds:
        for layer in r.layers:
            assert layer.rank_before - layer.rank_after == layer.pruned.numel()
            assert set(layer.pruned.tolist()) <= set(layer.pool.tolist())
            assert layer.sigma.shape == layer.grad.shape == layer.importance.shape == (layer.rank_before,)
    ranks = layer_ranks(model)
    assert all(ranks[n] <= full[n] for n in full) and sum(ranks.values()) < sum(full.values())
    # the physically removed bases are gone from the modules
    layer = compressor.layers["model.layers.0.mlp.up_proj"]
    assert layer.U.shape[1] == layer.V.shape[1] == layer.sigma.numel() == ranks["model.layers.0.mlp.up_proj"]
    assert model_parameters(model) == rounds[-1].params_total


@pytest.mark.parametrize("target", [0.6, 0.3])
def test_target_size_mode_hits_target_within_one_percent(target):
    model = make_tiny_llama()
    config = CompressConfig(size=SizeRule.target(target), rounds=3, iters_per_epoch=9, sampling_ratio=0.34,
                            aux_rank=2)
    _, rounds = run(Compressor(model, token_batches(), config, lm_loss))
    now, dense = compressible_parameters(model)
    assert abs(now / dense - target) <= 0.01
    assert rounds[-1].compressible_ratio == pytest.approx(now / dense)


@pytest.mark.parametrize("scope,score", [("layer", "bsi"), ("model", "bsi"), ("model", "bsi-grad"), ("model", "basel")])
def test_same_seed_same_result(scope, score):
    """Hutchinson's random probes (the only curvature source that reads probe_scope) are seeded: same seed, same
    importance to the last bit and the same pruning. Without auxiliary vectors the seed draws nothing but the
    probes: another seed changes bsi's importance (its curvature term) and nothing else's."""
    def once(seed=0, probe_scope=scope):
        model = make_tiny_llama()
        config = CompressConfig(size=SizeRule.keep(0.4), rounds=2, iters_per_epoch=6, sampling_ratio=0.5, aux_rank=0,
                                curvature="hutchinson", hutchinson=HutchinsonConfig(probe_scope=probe_scope), score=score)
        _, rounds = run(Compressor(model, token_batches(), config, lm_loss, seed=seed))
        return layer_ranks(model), [layer.importance for layer in rounds[0].layers]

    def equal(a, b):
        return all(torch.equal(x, y) for x, y in zip(a, b))

    (ranks, importance), (again, importance_again) = once(), once()
    assert ranks == again and equal(importance, importance_again)
    assert equal(importance, once(seed=1)[1]) == (score != "bsi")  # only bsi's score has a curvature term
    if score == "bsi":  # and the scope decides how the probes are drawn
        assert not equal(importance, once(probe_scope={"layer": "model", "model": "layer"}[scope])[1])


def test_the_seed_reaches_the_auxiliary_vectors_and_the_probes():
    """Compressor(seed=...) draws the auxiliary vectors' start; the probes follow it unless given their own seed."""
    def start(seed, probe_seed=None):
        model = make_tiny_llama()
        config = CompressConfig(size=SizeRule.keep(0.5), rounds=1, iters_per_epoch=4, aux_rank=2)
        compressor = Compressor(model, token_batches(), config, lm_loss, seed=seed, probe_seed=probe_seed)
        list(compressor.convert())
        return [layer.aux_v.detach().clone() for layer in compressor.layers.values()], compressor.generator.get_state()

    (aux0, probes0), (aux0b, _), (aux1, probes1) = start(0), start(0), start(1)
    assert all(torch.equal(a, b) for a, b in zip(aux0, aux0b))
    assert not any(torch.equal(a, b) for a, b in zip(aux0, aux1)) and not torch.equal(probes0, probes1)
    aux_own, probes_own = start(0, probe_seed=5)
    assert all(torch.equal(a, b) for a, b in zip(aux0, aux_own)) and not torch.equal(probes0, probes_own)


def test_importance_is_what_the_score_says():
    model = make_tiny_llama()
    config = CompressConfig(size=SizeRule.keep(0.5), rounds=1, iters_per_epoch=4, sampling_ratio=0.5, aux_rank=1,
                            gradient_z=0)
    _, (report,) = run(Compressor(model, token_batches(), config, lm_loss))
    assert math.isnan(report.significant_gradients)  # z = 0: no test ran
    for layer in report.layers:
        expected = -layer.sigma * layer.grad + 0.5 * layer.sigma**2 * layer.hessian
        torch.testing.assert_close(layer.importance, expected)


@pytest.mark.parametrize("z", [1.0, 100.0])
def test_first_order_terms_are_kept_only_where_the_gradient_is_significant(z):
    model = make_tiny_llama()
    config = CompressConfig(size=SizeRule.keep(0.5), rounds=1, iters_per_epoch=4, sampling_ratio=0.5, aux_rank=1,
                            gradient_z=z)
    _, (report,) = run(Compressor(model, token_batches(), config, lm_loss))
    kept = tested = 0
    for layer in report.layers:
        full = -layer.sigma * layer.grad
        term = layer.terms["gradient"]
        zeroed = term == 0
        torch.testing.assert_close(term[~zeroed], full[~zeroed])  # a term is either kept whole or dropped
        torch.testing.assert_close(layer.importance, term + 0.5 * layer.sigma**2 * layer.hessian)
        kept += int((~zeroed[layer.pool]).sum())
        tested += layer.pool.numel()
    assert report.significant_gradients == pytest.approx(kept / tested)
    if z == 100.0:
        assert kept == 0  # no mini-batch gradient stands 100 standard errors above its noise
    else:
        assert 0 < kept < tested


def test_the_ablations_score_bsis_own_measurement_with_one_term_left_out():
    """Same seed, same batches: bsi-curvature's round measures what bsi's does and scores only its curvature term;
    bsi-grad-tested's scores only bsi's tested gradient term (the same gradient, the same z-test)."""
    def first_round(score: str):
        config = CompressConfig(size=SizeRule.keep(0.5), rounds=1, iters_per_epoch=4, sampling_ratio=0.5, aux_rank=1,
                                gradient_z=1.0, score=score)
        _, (report,) = run(Compressor(make_tiny_llama(), token_batches(), config, lm_loss))
        return report

    bsi, curvature, gradient = first_round("bsi"), first_round("bsi-curvature"), first_round("bsi-grad-tested")
    assert 0 < bsi.significant_gradients < 1 and gradient.significant_gradients == bsi.significant_gradients
    assert math.isnan(curvature.significant_gradients)  # no gradient term, nothing tested
    for ours, only_h, only_g in zip(bsi.layers, curvature.layers, gradient.layers):
        torch.testing.assert_close(only_h.hessian, ours.hessian)
        torch.testing.assert_close(only_h.importance, ours.terms["curvature"])
        torch.testing.assert_close(only_g.grad, ours.grad)
        torch.testing.assert_close(only_g.hessian, ours.hessian)
        torch.testing.assert_close(only_g.importance, ours.terms["gradient"])


def test_non_finite_batches_are_skipped_counted_and_capped():
    model = make_tiny_llama()

    def poisoned(batches, every):
        for i, batch in enumerate(batches):
            yield {"input_ids": batch["input_ids"], "poison": i % every == 1}

    def loss(model, batch):
        value = lm_loss(model, batch)
        return value * float("nan") if batch["poison"] else value

    loss.count = lm_loss.count  # the fisher curvature's token count

    config = CompressConfig(size=SizeRule.keep(0.5), rounds=2, iters_per_epoch=8, sampling_ratio=0.5, aux_rank=1,
                            max_skipped_batches=10, bases="svd")
    steps, rounds = run(Compressor(model, poisoned(token_batches(), 4), config, loss))
    skipped = [s for s in steps if s.skipped]
    assert len(skipped) == 2 and rounds[-1].skipped_batches == 2
    for layer in rounds[-1].layers:
        assert torch.isfinite(layer.importance).all()
    strict = CompressConfig(size=SizeRule.keep(0.5), rounds=2, iters_per_epoch=8, sampling_ratio=0.5, aux_rank=1,
                            max_skipped_batches=1, bases="svd")
    with pytest.raises(BSIError, match="non-finite"):
        run(Compressor(make_tiny_llama(), poisoned(token_batches(), 2), strict, loss))


def test_training_steps_lower_the_loss_and_only_touch_sigma_and_aux():
    model = make_tiny_llama()
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if "embed" in n or "norm" in n}
    batch = next(token_batches())
    config = CompressConfig(size=SizeRule.keep(1.0), rounds=1, iters_per_epoch=30, sampling_ratio=0.05, aux_rank=2, lr=1e-2,
                            aux_lr=1e-2)
    compressor = Compressor(model, iter(lambda: batch, None), config, lm_loss)
    steps, _ = run(compressor)
    train = [s.loss for s in steps if s.stage == "train"]
    assert train[-1] < train[0] - 0.05
    for n, p in model.named_parameters():
        if n in frozen:
            assert torch.equal(p.detach(), frozen[n])


def test_step_reports_are_typed():
    model = make_tiny_llama()
    config = CompressConfig(size=SizeRule.keep(0.5), rounds=1, iters_per_epoch=2, sampling_ratio=0.5, aux_rank=0)
    steps, rounds = run(Compressor(model, token_batches(), config, lm_loss))
    assert all(isinstance(s, StepReport) and s.total_steps == 2 for s in steps)
    d = rounds[0].to_dict()
    assert d["kind"] == "RoundReport" and isinstance(d["layers"][0]["sigma"], list)


@pytest.mark.parametrize("score", ["bsi", "bsi-grad"])
def test_round_window_averages_the_tuning_steps_with_the_profiling_batches(score):
    """score_window round: a round's gradient and Fisher curvature are means over all its batches.

    With learning rates 0 sigma never moves, so a round whose 4 tuning steps see
    batch X and whose 2 profiling steps see batch Y must score with
    (4 * stat(X) + 2 * stat(Y)) / 6, where stat(X) is what profiling X alone gives.
    """
    x, y = next(token_batches(seed=3)), next(token_batches(seed=4))

    def first_round(stream, window):
        model = make_tiny_llama()
        config = CompressConfig(size=SizeRule.keep(0.5), rounds=1, iters_per_epoch=6, sampling_ratio=0.34,
                                aux_rank=0, bases="svd", score=score, score_window=window, gradient_z=0,
                                lr=0.0, aux_lr=0.0)
        assert config.profiling_iters == 2
        _, (report,) = run(Compressor(model, iter(stream), config, lm_loss))
        return report

    only_x = first_round([x] * 7, "profiling")
    only_y = first_round([y] * 7, "profiling")
    mixed = first_round([x] * 5 + [y] * 2, "round")  # monitor batch, 4 tuning steps, 2 profiling steps
    for a, b, m in zip(only_x.layers, only_y.layers, mixed.layers):
        torch.testing.assert_close(m.grad, (4 * a.grad + 2 * b.grad) / 6, rtol=1e-4, atol=1e-7)
        if score == "bsi":
            torch.testing.assert_close(m.hessian, (4 * a.hessian + 2 * b.hessian) / 6, rtol=1e-4, atol=1e-9)
    assert not torch.allclose(mixed.layers[0].grad, only_y.layers[0].grad)  # the tuning steps did count


def test_a_path_lands_on_every_stop_at_the_end_of_a_round():
    """stops: one run passes each size (reported by RoundReport.stop), then ends on the target."""
    model = make_tiny_llama()
    config = CompressConfig(size=SizeRule.target(0.3, stops=(0.7, 0.5)), rounds=6, iters_per_epoch=12, sampling_ratio=0.5,
                            aux_rank=1)
    _, rounds = run(Compressor(model, token_batches(), config, lm_loss))
    assert len(rounds) == 6
    reached = [(r.round, r.stop) for r in rounds if r.stop is not None]
    assert [stop for _, stop in reached] == [0.7, 0.5, 0.3] and reached[-1][0] == 6
    for report in rounds:
        if report.stop is not None:
            assert report.compressible_ratio == pytest.approx(report.stop, rel=0.03)
    sizes = [r.compressible_ratio for r in rounds]
    assert all(a >= b for a, b in zip(sizes, sizes[1:]))  # never grows back
    with pytest.raises(BSIError, match="at least 3 rounds"):
        Compressor(make_tiny_llama(), token_batches(), CompressConfig(size=SizeRule.target(0.3, stops=(0.7, 0.5)), rounds=2,
                                                                      iters_per_epoch=4), lm_loss)


def test_open_round_gives_each_layer_its_pool_and_the_sums_profiling_adds_to():
    """What bench/common.py and bench/gpu.py profile from: a round opened by hand, right after conversion."""
    config = CompressConfig(size=SizeRule.keep(0.5), rounds=2, iters_per_epoch=8, sampling_ratio=0.5,
                            aux_rank=2, bases="svd")
    compressor = Compressor(make_tiny_llama(), token_batches(), config, lm_loss)
    for _ in compressor.convert():
        pass
    stats = compressor._open_round()
    assert list(stats) == compressor.names and all(stats[n].pool.numel() > 0 for n in compressor.names)
    report = compressor._profile_step(next(token_batches()), 1)
    assert not report.skipped and any(float(stats[n].grad.abs().sum()) > 0 for n in compressor.names)
