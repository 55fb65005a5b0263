"""What makes compressed models work: whitened bases, gradual cuts, recovery, distillation, the Fisher curvature.

Each test checks a property against an independent computation on tiny models
built from configs.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import lm_loss, make_tiny_llama, token_batches

from bsi.config import CompressConfig, HutchinsonConfig, SizeRule, make_config
from bsi.method.bases import InputStatistics, svd_bases, whitened_bases
from bsi.method.curvature import Fisher, profile_batch, sigma_gradients
from bsi.method.engine import Compressor
from bsi.method.layers import BasisLinear, LowRankLinear, SigmaGradientRecorder, factor_cost, stored_cost
from bsi.method.schedule import cut_caps, gradual_budgets, path_budgets, split_rounds
from bsi.method.surgery import compressible_linear_names, to_basis_form
from bsi.pipeline.losses import DistillationLoss, answer_token_loss, distillation_kl
from bsi.pipeline.runner import Pipeline
from bsi.pipeline.stages import recovery_parameters
from bsi.reports import RoundReport


def covariances(model, batches):
    modules = {n: model.get_submodule(n) for n in compressible_linear_names(model)}
    stats = InputStatistics(modules)
    with stats, torch.no_grad():
        for batch in batches:
            stats.start_batch(None)
            model(input_ids=batch["input_ids"])
    return stats, stats.covariance()


def test_input_statistics_match_a_direct_computation_and_share_sibling_inputs():
    model = make_tiny_llama()
    batches = [next(token_batches(seed=s)) for s in range(2)]
    stats, cov = covariances(model, batches)
    # q, k and v read the same normalised hidden states: one accumulator
    attn = "model.layers.1.self_attn"
    assert cov[f"{attn}.q_proj"] is cov[f"{attn}.k_proj"] is cov[f"{attn}.v_proj"]
    assert cov[f"{attn}.o_proj"] is not cov[f"{attn}.q_proj"]
    captured = []
    handle = model.get_submodule(f"{attn}.o_proj").register_forward_pre_hook(lambda m, a: captured.append(a[0]))
    with torch.no_grad():
        for batch in batches:
            model(input_ids=batch["input_ids"])
    handle.remove()
    x = torch.cat([c.reshape(-1, c.shape[-1]) for c in captured]).double()  # (N, in)
    torch.testing.assert_close(cov[f"{attn}.o_proj"].double(), x.T @ x / x.shape[0], rtol=1e-5, atol=1e-6)


def test_whitened_bases_are_exact_at_start_and_truncate_with_less_output_error():
    model = make_tiny_llama()
    batches = [next(token_batches(seed=s)) for s in range(3)]
    _, cov = covariances(model, batches)
    name = "model.layers.0.mlp.down_proj"
    weight = model.get_submodule(name).weight.detach()
    u, s, v = whitened_bases(weight, cov[name])
    torch.testing.assert_close((u * s) @ v.T, weight, atol=1e-5, rtol=1e-4)
    # truncation error on the inputs: whitened bases minimise it (Eckart-Young in the whitened space)
    c = cov[name].double()
    for k in (4, 12, 20):
        for bases, better in ((whitened_bases(weight, c), True), (svd_bases(weight), False)):
            bu, bs, bv = bases
            delta = (weight.double() - (bu[:, :k] * bs[:k]).double() @ bv[:, :k].T.double())  # (out, in)
            error = float(torch.einsum("oi,ij,oj->", delta, c, delta))  # E ||x delta^T||^2
            if better:
                whitened_error = error
            else:
                assert whitened_error <= error * (1 + 1e-6)
        # sigma^2 of the dropped bases is exactly the output error (up to the damping)
        assert whitened_error == pytest.approx(float(s[k:].double().square().sum()), rel=2e-2)
    # the whole model converted in whitened bases computes what it did
    ids = batches[0]["input_ids"]
    with torch.no_grad():
        reference = model(input_ids=ids).logits
        to_basis_form(model, aux_rank=2, bases=lambda n, lin: whitened_bases(lin.weight, cov[n]))
        torch.testing.assert_close(model(input_ids=ids).logits, reference, atol=1e-4, rtol=1e-4)


def test_gradual_budgets_shrink_evenly_and_end_on_the_target():
    budgets = gradual_budgets(1500, 500, 4)
    assert [m for _, m in budgets] == ["factor", "factor", "factor", "stored"] and budgets[-1][0] == 500
    ratios = [b / a for a, b in zip([1500] + [b for b, _ in budgets[:-1]], [b for b, _ in budgets[:-1]])]
    assert max(ratios) - min(ratios) < 0.01  # the same share every round
    assert cut_caps({"a": 100, "b": 7}, 0.1, 2.0) == {"a": 20, "b": 2}
    assert cut_caps({"a": 100}, 0.1, 0) is None


@pytest.mark.parametrize("size", [SizeRule.target(0.5), SizeRule.keep(0.4)])
def test_no_round_removes_far_more_than_its_share(size):
    model = make_tiny_llama()
    factor = 1.5
    config = CompressConfig(rounds=3, iters_per_epoch=12, sampling_ratio=0.5, aux_rank=1, max_cut_factor=factor,
                            gamma=2.0, bases="svd", size=size)
    shapes = {n: model.get_submodule(n).weight.shape for n in compressible_linear_names(model)}  # (out, in)
    start = sum(min(shape) for shape in shapes.values())
    rounds = [r for r in Compressor(model, token_batches(), config, lm_loss).run() if isinstance(r, RoundReport)]
    assert len(rounds) == 3
    budgets = gradual_budgets(sum(factor_cost(i, o, min(o, i), 1) for o, i in shapes.values()),
                              round(config.size.ratio * sum(o * i for o, i in shapes.values())), config.rounds)
    for r, (budget, measure) in zip(rounds, budgets):
        active = sum(layer.rank_before for layer in r.layers)
        share = r.removed / active
        if size.mode == "keep":
            limit = 1 - config.keep_per_round
        else:  # the round's even share of the size it must shed, in the budget's own measure
            cost = factor_cost if measure == "factor" else stored_cost
            now = sum(cost(shapes[layer.name][1], shapes[layer.name][0], layer.rank_before, 1) for layer in r.layers)
            limit = max(0.0, 1 - budget / now)
        for layer in r.layers:  # every layer within the cap of its own bases
            assert layer.rank_before - layer.rank_after <= math.ceil(factor * limit * layer.rank_before), layer.name
        assert 0 < r.removed and share < 0.75
        assert math.isfinite(r.loss_before) and math.isfinite(r.loss_after)
    assert sum(r.removed for r in rounds) < start


def test_distillation_loss_is_the_task_loss_when_teacher_and_student_agree_and_kl_has_its_value():
    from bsi.data import BatchStream, generate_math_problems
    from bsi.models import build_tiny_model

    model, tokenizer = build_tiny_model()
    batch = next(BatchStream(generate_math_problems(8, seed=0), tokenizer, batch_size=4, max_length=96))
    distill = DistillationLoss(build_tiny_model()[0], weight=0.7, temperature=2.0)
    torch.testing.assert_close(distill(model, batch), answer_token_loss(model, batch))
    # a hand-made case: p = (1/2, 1/2) for the teacher, q = (1/4, 3/4) for the student, T = 1
    teacher = torch.log(torch.tensor([[0.5, 0.5]]))
    student = torch.log(torch.tensor([[0.25, 0.75]]))
    expected = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    assert float(distillation_kl(student, teacher, 1.0)) == pytest.approx(expected, rel=1e-6)
    assert float(distillation_kl(student, student, 3.0)) == pytest.approx(0.0, abs=1e-7)


def test_fisher_curvature_equals_per_example_gradients_computed_one_by_one():
    model = make_tiny_llama()
    layers = to_basis_form(model, aux_rank=0)
    chosen = [layers["model.layers.0.mlp.up_proj"], layers["model.layers.1.self_attn.v_proj"]]
    batch = next(token_batches(batch=3))
    pools = [torch.arange(layer.rank) for layer in chosen]
    result = profile_batch(model, chosen, pools, batch, lm_loss, source=Fisher())
    count = lm_loss.count(batch)
    expected = [torch.zeros(layer.rank) for layer in chosen]
    total = [torch.zeros(layer.rank) for layer in chosen]
    for b in range(3):  # the gradient of example b's share of the mean loss, by its own backward
        one = {"input_ids": batch["input_ids"][b:b + 1]}
        _, grads = sigma_gradients(model, chosen, one, lambda m, x: lm_loss(m, x) * lm_loss.count(x) / count)
        for e, t, g in zip(expected, total, grads):
            e += g.square()
            t += g
    for got, e in zip(result.curvatures, expected):
        torch.testing.assert_close(got, count * e, rtol=1e-3, atol=1e-6)
    for got, t in zip(result.grads, total):  # the per-example gradients add up to the batch gradient
        torch.testing.assert_close(got, t, rtol=1e-3, atol=1e-6)


def test_per_example_squares_predict_the_spread_of_batch_gradients():
    """The standard error the bsi score tests against is the real batch-to-batch spread of the gradient."""
    from bsi.method.curvature import Fisher, evaluation_mode

    model = make_tiny_llama()
    layers = list(to_basis_form(model, aux_rank=0).values())
    pools = [torch.arange(layer.rank) for layer in layers]
    grads, predicted = [], []
    stream = token_batches(batch=8, length=16, seed=5)
    with evaluation_mode(model):
        for _ in range(60):
            batch = next(stream)
            result = Fisher().profile(model, layers, pools, batch, lm_loss, None)
            grads.append(torch.cat(result.grads))
            # centred per batch: sum_b c_b^2 - g^2 / B, the unbiased-in-spirit variance of the batch gradient
            predicted.append(torch.cat(result.grad_squares) - torch.cat(result.grads).square() / 8)
    observed = torch.stack(grads).var(dim=0)  # (n,) across batches
    ratio = torch.stack(predicted).mean(dim=0) / observed.clamp(min=1e-30)
    assert 0.7 < float(ratio.median()) < 1.3


def test_recorder_is_detached_after_profiling():
    model = make_tiny_llama()
    layers = list(to_basis_form(model, aux_rank=0).values())
    with SigmaGradientRecorder().attach(layers):
        assert all(layer.recorder is not None for layer in layers)
    assert all(layer.recorder is None for layer in layers)


@pytest.mark.parametrize("train", ["factors", "sigma"])
def test_recovery_trains_exactly_the_parameters_it_says(train, isolated_cache):
    config = make_config("smoke", {"skip_finetune": True, "eval_examples": 0,
                                   "recover": {"steps": 3, "train": train, "lr": 1e-2, "warmup_steps": 0}})
    pipeline = Pipeline(config)
    trainable, first, last = None, None, None
    for report in pipeline.run():
        if getattr(report, "stage", None) == "recover" and getattr(report, "step", None) in (1, 3):
            model = pipeline.model
            trainable = {n for n, p in model.named_parameters() if p.requires_grad}
            params = {n: p.detach().clone() for n, p in model.named_parameters()}
            first, last = (params, None) if report.step == 1 else (first, params)
    changed = {n for n, p in last.items() if not torch.equal(p, first[n])}
    assert changed and changed <= trainable
    assert not any("embed_tokens" in n for n in trainable)
    if train == "factors":
        expected = {n for n, p in pipeline.model.named_parameters()
                    if id(p) in {id(q) for q in recovery_parameters(pipeline.model)}}
        assert trainable == expected
        assert any(n.endswith(".up.weight") for n in changed) and any("norm" in n for n in changed)
    else:
        assert all(n.rsplit(".", 1)[1] in BasisLinear.TRAINABLE_PARAMETERS for n in trainable)
    assert any(isinstance(m, LowRankLinear) for m in pipeline.model.modules())  # exported either way


def test_curvature_term_in_bf16_is_within_ten_percent_of_float32_with_the_same_probes():
    """sigma and its perturbation stay fp32 inside the layer, so finite differences survive bf16 compute."""
    import copy

    from bsi.method.curvature import Hutchinson
    from bsi.method.scores import eps_rule

    base = make_tiny_llama()
    batch = next(token_batches(batch=4, length=24))
    terms = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = copy.deepcopy(base).to(dtype)
        layers = list(to_basis_form(model, aux_rank=0).values())
        eps = eps_rule(max(float(layer.sigma.detach().max()) for layer in layers), torch.bfloat16)  # the bf16 rule: 0.1
        source = Hutchinson(eps=eps, scope="model", method="fd", probes=4)
        result = profile_batch(model, layers, [torch.arange(layer.rank) for layer in layers], batch, lm_loss,
                               source=source, generator=torch.Generator().manual_seed(3))
        terms[dtype] = torch.cat([0.5 * layer.sigma.detach().float() ** 2 * h
                                  for layer, h in zip(layers, result.curvatures)])
    error = float((terms[torch.bfloat16] - terms[torch.float32]).norm() / terms[torch.float32].norm())
    assert error < 0.10


def test_half_precision_finite_differences_at_a_tiny_eps_switch_to_exact_products_and_say_so():
    model = make_tiny_llama().to(torch.bfloat16)
    config = CompressConfig(curvature="hutchinson", hutchinson=HutchinsonConfig(hessian_method="fd", eps=1e-3),
                            bases="svd", rounds=1, iters_per_epoch=4, sampling_ratio=0.5)
    compressor = Compressor(model, token_batches(), config, lm_loss)
    for _ in compressor.convert():
        pass
    assert compressor.source.method == "hvp" and "hvp" in compressor.notes[0]
    fine = Compressor(make_tiny_llama().to(torch.bfloat16), token_batches(),
                      CompressConfig(curvature="hutchinson", hutchinson=HutchinsonConfig(hessian_method="fd"),
                                     bases="svd"), lm_loss)
    for _ in fine.convert():
        pass
    assert fine.source.method == "fd" and not fine.notes  # the rule's eps (0.1) is safe in bf16


def test_split_rounds_gives_each_segment_one_and_the_rest_by_weight():
    assert split_rounds([1, 1, 2], 8) == [2, 2, 4]
    assert split_rounds([5, 0.001], 2) == [1, 1]  # every segment gets a round
    assert sum(split_rounds([0.3, 1.7, 0.9, 2.2], 17)) == 17
    with pytest.raises(ValueError):
        split_rounds([1, 1, 1], 2)


def test_path_budgets_land_on_each_stop_and_shrink_evenly():
    budgets = path_budgets(2000, [600, 300, 30], 12)
    assert len(budgets) == 12
    stops = [(i, b) for i, b in enumerate(budgets) if b[2] is not None]
    assert [(b[0], b[1], b[2]) for _, b in stops] == [(600, "stored", 0), (300, "stored", 1), (30, "stored", 2)]
    assert stops[-1][0] == 11
    first = [b for b in budgets[: stops[0][0]]]
    assert all(m == "factor" for _, m, _ in first)  # the first segment budgets factors
    assert all(m == "stored" for _, m, _ in budgets[stops[0][0] + 1:])
    values = [2000] + [b[0] for b in budgets]
    shares = [b / a for a, b in zip(values, values[1:])]
    assert max(shares) / min(shares) < 1.5  # about the same share goes every round
    assert path_budgets(1500, [500], 4) == [(p, m, 0 if m == "stored" else None) for p, m in gradual_budgets(1500, 500, 4)]
