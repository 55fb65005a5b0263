"""bsi.teaching: the helpers the notebooks call, checked against independent computations."""

from __future__ import annotations

import pytest
import torch

from bsi.config import CompressConfig
from bsi.method.engine import Compressor
from bsi.errors import BSIError
from bsi.method.curvature import sigma_gradients
from bsi.method.scores import probe_vector
from bsi.method.layers import BasisLinear
from bsi.models import EMBEDDED_MODEL, TINY_MODEL
from bsi.method.surgery import basis_layers, compressible_linear_names, to_basis_form, to_exported_form
from bsi.teaching import (
    NOTEBOOK_MODEL_ENV,
    basel_form_error,
    block_index,
    break_even_rank,
    capture_inputs,
    convert_layer,
    doc_markdown,
    exact_hessian,
    factor_cost,
    layer_kind,
    loss_change_when_dropped,
    mean_gradient,
    model_sigma_max,
    notebook_settings,
    rank_history,
    rank_table,
    single_probe_estimates,
    summary_row,
)
from tests.conftest import lm_loss, make_tiny_llama, token_batches

LAYER = "model.layers.1.mlp.down_proj"


def _batch(seed: int = 1) -> dict:
    return next(token_batches(batch=2, length=12, seed=seed))


def test_settings_follow_the_environment_variable():
    assert notebook_settings({}).model == EMBEDDED_MODEL and not notebook_settings({}).quick
    assert notebook_settings({NOTEBOOK_MODEL_ENV: "embedded"}).model == EMBEDDED_MODEL
    tiny = notebook_settings({NOTEBOOK_MODEL_ENV: TINY_MODEL})
    assert tiny.model == TINY_MODEL and tiny.quick and tiny.spectrum_k < notebook_settings({}).spectrum_k
    other = notebook_settings({NOTEBOOK_MODEL_ENV: "/some/folder"})
    assert other.model == "/some/folder" and other.spectrum_k == notebook_settings({}).spectrum_k
    overrides = tiny.pipeline_overrides()
    assert overrides["model"] == TINY_MODEL and overrides["compress"]["rounds"] == tiny.compress["rounds"]


def test_factor_cost_meets_dense_cost_at_the_break_even_rank():
    assert factor_cost(6, 3, rank=2) == 6 * 3 == factor_cost(6, 3, rank=1, aux_rank=1)
    assert break_even_rank(6, 3) == 2 and break_even_rank(6, 3, aux_rank=1) == 1
    assert factor_cost(576, 1536, rank=int(break_even_rank(576, 1536, 8)), aux_rank=8) < 576 * 1536
    assert factor_cost(576, 1536, rank=int(break_even_rank(576, 1536, 8)) + 1, aux_rank=8) > 576 * 1536


def test_layer_names_are_split_into_kind_and_block():
    assert layer_kind(LAYER) == "down_proj" and block_index(LAYER) == 1
    assert block_index("lm_head") is None and block_index("transformer.h.11.attn.c_attn") == 11


def test_rank_table_follows_dense_basis_and_exported_forms():
    model = make_tiny_llama(tied=True)
    dense = rank_table(model)
    assert [row["layer"] for row in dense] == compressible_linear_names(model)  # tied lm_head left out
    assert all(row["rank"] == row["full_rank"] and row["params"] == row["dense_params"] for row in dense)
    layers = to_basis_form(model, aux_rank=2)
    layers[LAYER].keep(torch.arange(5))
    row = {r["layer"]: r for r in rank_table(model)}[LAYER]
    assert row["rank"] == 5 and row["params"] == min((5 + 2) * (64 + 32), 64 * 32)
    to_exported_form(model)
    row = {r["layer"]: r for r in rank_table(model)}[LAYER]
    assert row["rank"] == 7 and row["params"] == 7 * (64 + 32)


def test_convert_layer_swaps_one_layer_exactly_and_trains_only_it():
    model = make_tiny_llama()
    ids = _batch()["input_ids"]
    with torch.no_grad():
        before = model(input_ids=ids).logits
    layer = convert_layer(model, LAYER)
    assert list(basis_layers(model)) == [LAYER] and convert_layer(model, LAYER) is layer
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, before, atol=1e-5, rtol=1e-5)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {f"{LAYER}.sigma", f"{LAYER}.aux_u", f"{LAYER}.aux_v"}
    with pytest.raises(BSIError, match="not a linear layer"):
        convert_layer(model, "model.layers.1.mlp")


def test_capture_inputs_and_basel_form_error_on_real_activations():
    model = make_tiny_llama()
    batch = _batch()
    inputs = capture_inputs(model, LAYER, batch)
    assert inputs.shape == (2, 12, 64)
    linear = model.get_submodule(LAYER)
    errors = basel_form_error(linear, inputs)
    assert errors["weight"] < 1e-5 and errors["output"] < 1e-5 * max(errors["scale"], 1.0)
    with torch.no_grad():
        assert errors["scale"] == pytest.approx(float(linear(inputs).abs().max()))


def test_model_sigma_max_is_the_largest_singular_value_before_and_after_conversion():
    model = make_tiny_llama()
    expected = max(float(torch.linalg.svdvals(model.get_submodule(n).weight.detach()).max())
                   for n in compressible_linear_names(model))
    assert model_sigma_max(model) == pytest.approx(expected, rel=1e-5)
    convert_layer(model, LAYER)  # one layer in Basel form, the others dense: still the model-wide maximum
    assert model_sigma_max(model) == pytest.approx(expected, rel=1e-5)
    to_basis_form(model)
    assert model_sigma_max(model) == pytest.approx(expected, rel=1e-5)


def test_mean_gradient_averages_per_batch_gradients():
    model = make_tiny_llama()
    layer = convert_layer(model, LAYER)
    batches = [_batch(1), _batch(2)]
    loss, grad = mean_gradient(model, layer, batches, lm_loss)
    parts = [sigma_gradients(model, [layer], b, lm_loss) for b in batches]
    torch.testing.assert_close(grad, (parts[0][1][0] + parts[1][1][0]) / 2)
    assert loss == pytest.approx((float(parts[0][0]) + float(parts[1][0])) / 2)
    with pytest.raises(BSIError):
        mean_gradient(model, layer, [], lm_loss)


def _float64_model():
    model = make_tiny_llama().double()
    return model, convert_layer(model, LAYER)


def test_exact_hessian_matches_central_differences_of_gradients():
    model, layer = _float64_model()
    batch = _batch()
    positions = torch.tensor([0, 5, 17, 31])
    hessian = exact_hessian(model, layer, batch, lm_loss, positions)
    assert hessian.shape == (4, 4) and torch.equal(hessian, hessian.T)
    # sigma and its gradient are float32 (even in a float64 model), so round-off, ~ulp(g) / step,
    # dominates a small step: at 1e-3 it is ~2.8e-7 here, at 4e-3 ~5e-8, against |H| ~ 2e-4.
    step = 4e-3
    sigma = layer.sigma.data.clone()
    for col, j in enumerate(positions.tolist()):
        e = torch.zeros(layer.rank)
        e[j] = step
        layer.sigma.data = sigma + e
        _, (g_plus,) = sigma_gradients(model, [layer], batch, lm_loss)
        layer.sigma.data = sigma - e
        _, (g_minus,) = sigma_gradients(model, [layer], batch, lm_loss)
        layer.sigma.data = sigma.clone()
        taken = float((sigma + e)[j].double() - (sigma - e)[j].double())  # the step float32 really took
        column = (g_plus.double() - g_minus.double())[positions] / taken
        torch.testing.assert_close(hessian[:, col], column, atol=1e-3 * float(hessian.abs().max()), rtol=1e-3)


def test_single_probe_estimates_are_z_times_hz_and_average_to_the_diagonal():
    model, layer = _float64_model()
    batch = _batch()
    pool = torch.tensor([1, 4, 9, 20, 30])
    hessian = exact_hessian(model, layer, batch, lm_loss, pool)
    rows = single_probe_estimates(model, layer, batch, lm_loss, pool, eps=1e-4, probes=200,
                                  generator=torch.Generator().manual_seed(3))
    assert rows.shape == (200, layer.rank)
    outside = torch.ones(layer.rank, dtype=torch.bool)
    outside[pool] = False
    assert torch.all(rows[:, outside] == 0)
    replay = torch.Generator().manual_seed(3)
    for row in rows[:3]:
        z = probe_vector(layer.rank, pool, replay)[pool].double()
        torch.testing.assert_close(row[pool].double(), z * (hessian @ z), atol=1e-5, rtol=1e-3)
    diag = hessian.diagonal()
    one = float((rows[0, pool].double() - diag).norm() / diag.norm())
    many = float((rows[:, pool].double().mean(0) - diag).norm() / diag.norm())
    assert many < 0.2 and many < one


def test_loss_change_when_dropped_measures_and_restores():
    model = make_tiny_llama()
    layer = convert_layer(model, LAYER)
    batches = [_batch(1), _batch(2)]
    sigma = layer.sigma.detach().clone()
    changes = loss_change_when_dropped(model, layer, batches, lm_loss, [0, 7])
    assert torch.equal(layer.sigma.detach(), sigma)
    with torch.no_grad():
        base = sum(float(lm_loss(model, b)) for b in batches) / 2
        layer.sigma.data[7] = 0
        dropped = sum(float(lm_loss(model, b)) for b in batches) / 2
        layer.sigma.data.copy_(sigma)
    assert float(changes[1]) == pytest.approx(dropped - base, abs=1e-6)


def test_rank_history_follows_a_real_compression():
    model = make_tiny_llama()
    config = CompressConfig(size_mode="keep", keep_ratio=0.5, rounds=2, iters_per_epoch=4, sampling_ratio=0.5, aux_rank=1)
    rounds = [r for r in Compressor(model, token_batches(), config, lm_loss).run() if hasattr(r, "layers")]
    history = rank_history(rounds)
    assert list(history) == list(basis_layers(model))
    for name, layer in basis_layers(model).items():
        assert len(history[name]) == 3 and history[name][-1] == layer.rank
        assert history[name][0] == min(layer.in_features, layer.out_features)
        assert history[name] == sorted(history[name], reverse=True)
    assert rank_history(rounds, {LAYER: 99})[LAYER][0] == 99


def test_doc_markdown_fences_literal_blocks():
    text = doc_markdown(BasisLinear)
    assert text.startswith("**`bsi.method.layers.BasisLinear(") and "``" not in text
    module_text = doc_markdown(__import__("bsi.method.layers", fromlist=["x"]))
    assert module_text.startswith("**`bsi.method.layers`**") and "```\nW~ = U diag(sigma) V^T" in module_text
    assert module_text.count("```") % 2 == 0

    def undocumented():
        pass

    with pytest.raises(BSIError, match="no docstring"):
        doc_markdown(undocumented)


def test_summary_row_has_the_sweep_schema():
    from bsi.pipeline.sweep import results_figure, results_table

    summary = {"params_before": 200, "params_after": 100, "compressible_ratio": 0.5, "seconds": 3.0,
               "metrics_after": {"accuracy": 0.25, "loss": 1.5, "examples": 4}}
    row = summary_row("bsi", 0.5, summary)
    assert row["compression_ratio"] == 2.0 and row["accuracy"] == 0.25 and row["params_total"] == 100
    dense = summary_row("dense", 1.0, summary | {"params_after": 200, "compressible_ratio": 1.0})
    assert "| bsi | 0.50 |" in results_table([dense, row], ["bsi"])
    assert len(results_figure([dense, row]).data) == 2  # accuracy and loss lines of one method
