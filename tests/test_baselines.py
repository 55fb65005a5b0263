"""Baselines: weighted SVD math, rank allocation, and every method through the pipeline."""

from __future__ import annotations

import pytest
import torch

from bsi.config import make_config
from bsi.errors import BSIError
from bsi.method.bases import weighted_svd
from bsi.method.layers import BasisLinear
from bsi.method.schedule import LayerShape
from bsi.models import load_model_and_tokenizer
from bsi.pipeline.baselines import (
    activation_scales,
    example_row_norms,
    fisher_row_information,
    fisher_row_weights,
    install_bases,
    sensitivity_ranks,
    uniform_ranks,
)
from bsi.pipeline.losses import answer_token_loss
from bsi.pipeline.methods import METHODS, BaselineConfig, get_method
from bsi.pipeline.runner import Pipeline
from bsi.reports import SizeReport


def truncate(u, s, v, k):
    return (u[:, :k] * s[:k]) @ v[:, :k].T  # (out, in)


def test_full_rank_weighted_svd_reproduces_the_weight():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(24, 40, generator=g)
    d = torch.rand(24, generator=g) * 10 + 0.1
    s = torch.rand(40, generator=g) * 10 + 0.1
    for rows, cols in ((None, None), (d, None), (None, s), (d, s)):
        u, sigma, v = weighted_svd(w, rows, cols)
        assert torch.all(sigma[:-1] >= sigma[1:])
        torch.testing.assert_close(truncate(u, sigma, v, sigma.numel()), w, atol=1e-4, rtol=1e-4)


def test_fwsvd_has_lower_fisher_weighted_error_than_svd():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(32, 24, generator=g)
    d = torch.exp(2 * torch.randn(32, generator=g))  # some rows matter far more to the task
    rows = fisher_row_weights(d**2)  # each row's summed information d^2
    torch.testing.assert_close(rows, d, rtol=1e-4, atol=1e-6)
    for k in (2, 4, 8):
        plain = truncate(*weighted_svd(w), k)
        fisher = truncate(*weighted_svd(w, row_weights=rows), k)
        err_plain = (d[:, None] * (w - plain)).norm()
        err_fisher = (d[:, None] * (w - fisher)).norm()
        assert err_fisher < 0.9 * err_plain


def test_asvd_has_lower_activation_weighted_output_error_than_svd():
    g = torch.Generator().manual_seed(2)
    w = torch.randn(32, 24, generator=g)
    channel = torch.exp(1.5 * torch.randn(24, generator=g))  # a few outlier channels, as in LLMs
    x = torch.randn(512, 24, generator=g) * channel  # (N, in) calibration inputs
    scales = activation_scales(x.abs().mean(dim=0), alpha=0.5)
    test = torch.randn(512, 24, generator=g) * channel  # fresh inputs from the same distribution
    for k in (2, 4, 8):
        plain = truncate(*weighted_svd(w), k)
        aware = truncate(*weighted_svd(w, col_scales=scales), k)
        assert (test @ (w - aware).T).norm() < 0.9 * (test @ (w - plain).T).norm()


def test_example_row_norms_are_those_of_each_examples_own_gradient():
    g = torch.Generator().manual_seed(3)
    x, e = torch.randn(3, 5, 7, generator=g), torch.randn(3, 5, 4, generator=g)  # (B, T, in), (B, T, out)
    expected = sum((e[b].T @ x[b]).square().sum(dim=1) for b in range(3))  # G_b = E_b^T X_b, (out, in)
    torch.testing.assert_close(example_row_norms(x, e), expected, rtol=1e-5, atol=1e-5)


def test_fisher_information_sums_squared_per_example_gradients(isolated_cache):
    """One backward pass per batch gives exactly what a backward pass per example gives."""
    from bsi.data import BatchStream, load_task

    model, tokenizer = load_model_and_tokenizer("tiny-random-llama")
    task = load_task("embedded-math", test_size=2, train_size=8, seed=0)
    stream = BatchStream(task.train, tokenizer, batch_size=4, max_length=96, seed=0)
    names = ["model.layers.0.mlp.down_proj", "model.layers.1.self_attn.k_proj"]
    modules = {n: model.get_submodule(n) for n in names}
    gen = fisher_row_information(model, modules, iter([next(stream)]), 1, answer_token_loss)
    try:
        while True:
            next(gen)
    except StopIteration as done:
        rows = done.value
    batch = BatchStream(task.train, tokenizer, batch_size=4, max_length=96, seed=0).__next__()
    expected = {n: torch.zeros(m.weight.shape[0]) for n, m in modules.items()}
    for b in range(4):
        single = {k: v[b : b + 1] for k, v in batch.items()}
        model.zero_grad()
        for m in modules.values():
            m.weight.requires_grad_(True)
        answer_token_loss(model, single).backward()
        for n, m in modules.items():
            expected[n] += m.weight.grad.square().sum(dim=1)
    for n in names:
        torch.testing.assert_close(rows[n], expected[n], rtol=1e-3, atol=1e-7)


def test_weights_are_positive_even_for_dead_rows_and_channels():
    assert fisher_row_weights(torch.zeros(3)).min() > 0
    rows = fisher_row_weights(torch.tensor([1.0, 0.0]))
    assert rows.min() > 0 and rows[0] == 1
    assert activation_scales(torch.tensor([0.0, 4.0])).min() > 0


SHAPES = {f"l{i}": LayerShape(i_, o, min(i_, o), aux_rank=4)
          for i, (i_, o) in enumerate([(576, 576), (576, 192), (576, 1536), (1536, 576), (64, 64)] * 3)}


@pytest.mark.parametrize("target", [0.9, 0.6, 0.3, 0.15, 0.05])
def test_uniform_allocation_hits_the_target_within_one_percent(target):
    ranks = uniform_ranks(SHAPES, target)
    dense = sum(s.dense for s in SHAPES.values())
    total = sum(SHAPES[n].cost(r) for n, r in ranks.items())
    assert abs(total / dense - target) <= 0.01 * target
    assert all(0 <= r <= SHAPES[n].rank for n, r in ranks.items())
    shares = [SHAPES[n].cost(r) / SHAPES[n].dense for n, r in ranks.items() if SHAPES[n].in_features > 64]
    assert max(shares) - min(shares) < 0.05  # uniform: every big layer keeps about the same share


def test_sensitivity_allocation_favours_sensitive_layers_and_hits_the_target():
    shares = (0.1, 0.3, 0.5, 0.7, 0.9)
    table = {n: {s: (1 - s) * (10.0 if n == "l0" else 1.0) for s in shares} for n in SHAPES}
    ranks = sensitivity_ranks(SHAPES, 0.4, table)
    dense = sum(s.dense for s in SHAPES.values())
    total = sum(SHAPES[n].cost(r) for n, r in ranks.items())
    assert abs(total / dense - 0.4) <= 0.004
    assert SHAPES["l0"].cost(ranks["l0"]) / SHAPES["l0"].dense > SHAPES["l5"].cost(ranks["l5"]) / SHAPES["l5"].dense
    with pytest.raises(BSIError, match="no sensitivity"):
        sensitivity_ranks(SHAPES, 0.4, {})


def test_install_bases_keeps_the_leading_bases():
    torch.manual_seed(0)
    linear = torch.nn.Linear(12, 8)
    layer = BasisLinear.from_linear(linear, aux_rank=0)
    u, s, v = weighted_svd(linear.weight, col_scales=torch.linspace(0.5, 3, 12))
    install_bases(layer, u, s, v, rank=3)
    assert layer.rank == 3
    torch.testing.assert_close(layer.dense_weight(), truncate(u, s, v, 3))
    with pytest.raises(BSIError):
        install_bases(layer, u, s, v, rank=2)  # shapes no longer fit the shrunk layer


def run_method(name, target, **over):
    config = make_config("smoke", {"skip_finetune": True, "eval_examples": 0, "recover": {"steps": 0},
                                   "compress": {"target_ratio": target}, **over})
    pipeline = Pipeline(config, method=name)
    *_, done = pipeline.run()
    return pipeline, done.summary


@pytest.mark.parametrize("name", list(METHODS))
def test_each_method_hits_its_target_size_within_one_percent(name, isolated_cache):
    pipeline, summary = run_method(name, 0.4)
    assert summary["method"] == name
    assert abs(summary["compressible_ratio"] - 0.4) <= 0.004
    assert summary["params_after"] < summary["params_before"]


def test_a_runs_streams_share_one_tokenization_of_the_examples_they_serve(isolated_cache):
    from bsi.data import BatchUse

    pipeline, _ = run_method("bsi", 0.6)
    tokens = pipeline.stream(BatchUse.COMPRESS).tokens
    assert all(pipeline.stream(use).tokens is tokens for use in BatchUse)
    compress = pipeline.config.compress
    served = (compress.rounds * compress.iters_per_epoch + compress.calibration_batches) * pipeline.config.batch_size
    assert 0 < tokens.tokenized <= served < len(pipeline.task.train)  # the batches served, not the whole set


def test_bsi_mag_keeps_bsi_budgets_and_removes_the_smallest_sigma_inside_each_layer(isolated_cache):
    """The named variant: round 1 splits the cut across layers exactly as bsi does (same state, same scores);
    inside every layer it removes the pool's smallest |sigma|, and its config records the choice."""
    plain, _ = run_method("bsi", 0.4)
    variant, summary = run_method("bsi-mag", 0.4)
    assert summary["method"] == "bsi-mag" and variant.config.compress.within_layer == "magnitude"
    assert plain.config.compress.within_layer == "score"
    first = {r.name: r for r in plain.rounds[0].layers}
    assert {r.name: len(r.pruned) for r in variant.rounds[0].layers} == {n: len(r.pruned) for n, r in first.items()}
    for report in variant.rounds:
        for layer in report.layers:
            if len(layer.pruned) == 0:
                continue
            size = layer.sigma.abs()
            kept = sorted(set(layer.pool.tolist()) - set(layer.pruned.tolist()))
            assert set(layer.pruned.tolist()) <= set(layer.pool.tolist())
            if kept:
                assert size[layer.pruned].max() <= size[kept].min()
    chosen = {r.name: set(r.pruned.tolist()) for r in variant.rounds[0].layers}
    # bsi's score does not order a layer by |sigma| (else the variant would test nothing)
    assert any(set(layer.pruned.tolist()) != chosen[n] for n, layer in first.items())


def test_sensitivity_allocation_through_the_pipeline(isolated_cache):
    config = make_config("smoke", {"skip_finetune": True, "eval_examples": 0, "recover": {"steps": 0},
                                   "compress": {"target_ratio": 0.3}})
    pipeline = Pipeline(config, method="asvd", baseline=BaselineConfig(allocation="sensitivity",
                                                                       sensitivity_shares=(0.2, 0.5, 0.8)))
    *_, done = pipeline.run()
    assert abs(done.summary["compressible_ratio"] - 0.3) <= 0.003
    assert len(set(done.summary["ranks"].values())) > 2  # not a uniform allocation


def sizes_of(name, target, stops=()):
    """{target: state dict} at every SizeReport of a truncation run (no fine-tune, no recovery)."""
    config = make_config("smoke", {"skip_finetune": True, "eval_examples": 0, "recover": {"steps": 0},
                                   "compress": {"target_ratio": target, "stops": list(stops)}})
    pipeline, states = Pipeline(config, method=name), {}
    for report in pipeline.run():
        if isinstance(report, SizeReport):
            assert abs(report.compressible_ratio - report.target) <= 0.01 * report.target
            states[report.target] = {k: v.clone() for k, v in pipeline.model.state_dict().items()}
    return states


@pytest.mark.parametrize("name", ["svd", "fwsvd", "asvd"])
def test_one_truncation_run_gives_every_size_as_separate_runs_would(name, isolated_cache):
    """Bases once, a truncated copy per size: the same models as one run per size, and no auxiliary vectors."""
    path = sizes_of(name, 0.3, stops=(0.7, 0.5))
    assert list(path) == [0.7, 0.5, 0.3]
    alone = sizes_of(name, 0.5)[0.5]
    assert path[0.5].keys() == alone.keys()
    for key, value in alone.items():
        torch.testing.assert_close(path[0.5][key], value)
        if key.endswith("aux_u"):
            assert value.shape[1] == 0  # as published: no auxiliary vectors


@pytest.mark.parametrize("name", ["svd", "svd-llm", "fwsvd", "asvd"])
def test_full_rank_baselines_reproduce_the_model(name, isolated_cache):
    original, tokenizer = load_model_and_tokenizer("tiny-random-llama")
    pipeline, summary = run_method(name, 1.0, compress={"target_ratio": 1.0, "aux_rank": 0})
    ids = tokenizer("Tom has 3 apples.", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(pipeline.model(ids).logits, original(ids).logits, atol=1e-4, rtol=1e-4)


def test_svd_family_needs_a_target_and_unknown_methods_are_named(isolated_cache):
    config = make_config("smoke", {"skip_finetune": True, "eval_examples": 0, "compress": {"keep_ratio": 0.5}})
    with pytest.raises(BSIError, match="target size"):
        list(Pipeline(config, method="svd").run())
    with pytest.raises(BSIError, match="unknown method 'pca'.*svd, svd-llm, fwsvd, asvd, basel, bsi-grad, bsi"):
        get_method("pca")
    with pytest.raises(BSIError, match="allocation"):
        BaselineConfig(allocation="greedy")


def test_suffix_loss_equals_the_full_forward_with_the_changed_layer(isolated_cache):
    """Running only the blocks from the changed layer's on gives the loss of the whole model, and falls back when
    the name is outside the blocks."""
    from bsi.data import BatchStream, load_task
    from bsi.method.surgery import to_basis_form
    from bsi.pipeline.baselines import SuffixLoss

    model, tokenizer = load_model_and_tokenizer("tiny-random-llama")
    task = load_task("embedded-math", test_size=2, train_size=8, seed=0)
    stream = BatchStream(task.train, tokenizer, batch_size=4, max_length=96, seed=0)
    batches = [next(stream), next(stream)]
    layers = to_basis_form(model, aux_rank=0)
    suffix = SuffixLoss(model, batches, answer_token_loss)
    assert len(suffix.inputs) == 2  # the decoder layout was recognised: block inputs recorded per batch

    def full() -> float:
        with torch.no_grad():
            return sum(float(answer_token_loss(model, b)) for b in batches) / 2

    untouched = full()
    for name in ("model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj"):
        saved = layers[name].sigma.detach().clone()
        with torch.no_grad():
            layers[name].sigma[2:] = 0  # truncate this layer only: the recorded inputs are the untouched model's
        truncated = full()
        assert suffix(name) == pytest.approx(truncated, rel=1e-5) and truncated != pytest.approx(untouched, rel=1e-6)
        with torch.no_grad():
            layers[name].sigma.copy_(saved)
    assert suffix(None) == pytest.approx(full(), rel=1e-6) and suffix("lm_head") == pytest.approx(full(), rel=1e-6)
