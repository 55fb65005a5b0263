import json
import math

import pytest
import torch
from conftest import lm_loss, make_tiny_llama, token_batches
from torch import nn

from bsi.analysis import spectrum
from bsi.cli import main
from bsi.data import BatchStream, load_task
from bsi.errors import BSIError
from bsi.method import theory
from bsi.method.curvature import eager_attention, hessian_vector_product, profile_batch, sigma_gradients
from bsi.method.layers import BasisLinear
from bsi.method.names import layer_block, layer_kind
from bsi.method.surgery import to_basis_form
from bsi.models import build_tiny_model, load_model_and_tokenizer
from bsi.pipeline.losses import answer_token_loss


def _linear_model(seed=0, n_in=10, n_out=8) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(n_in, n_out))


def test_spectrum_of_a_known_quadratic_loss_is_recovered_exactly():
    model = _linear_model()
    g = torch.Generator().manual_seed(0)
    r = 8
    q, _ = torch.linalg.qr(torch.randn(r, r, generator=g, dtype=torch.float64))
    eigenvalues = torch.tensor([5.0, -3.0, 2.0, 1.0, -0.5, 0.25, 0.1, -0.05], dtype=torch.float64)
    a = (q @ torch.diag(eigenvalues) @ q.T).float()  # (r, r), the Hessian by construction

    def quadratic(m, batch):
        s = m[0].sigma
        return 0.5 * s @ a @ s + batch["b"] @ s

    batches = [{"b": torch.randn(r, generator=g)} for _ in range(2)]
    result = spectrum.compute_spectra(model, ["0"], batches, quadratic, top_k=r)
    (layer,) = result.layers
    expected = eigenvalues[torch.argsort(eigenvalues.abs(), descending=True)]
    torch.testing.assert_close(torch.tensor(layer.eigenvalues, dtype=torch.float64), expected, atol=1e-5, rtol=1e-5)
    assert layer.trace == pytest.approx(float(eigenvalues.sum()), abs=1e-5)
    assert layer.negative_share == pytest.approx(3 / 8)
    assert layer.lambda_1 == pytest.approx(5.0, rel=1e-6)
    assert type(model[0]) is nn.Linear  # in Basel form only while measured

    # top-k < r: the block is the principal submatrix at the k largest sigmas (the SVD's first k)
    result = spectrum.compute_spectra(model, ["0"], batches, quadratic, top_k=3)
    assert result.layers[0].positions == [0, 1, 2]
    torch.testing.assert_close(result.layers[0].hessian, a.double()[:3, :3], atol=1e-5, rtol=1e-5)


def test_least_squares_layer_has_its_analytic_diagonal_hessian():
    # l = 1/(2N) sum ||W~ x - y||^2 with W~ = U diag(sigma) V^T: H = diag(mean_n (V^T x_n)^2) since U^T U = I
    model = _linear_model(n_in=6, n_out=9)
    g = torch.Generator().manual_seed(2)
    batch = {"x": torch.randn(32, 6, generator=g), "y": torch.randn(32, 9, generator=g)}

    def mse(m, b):
        return 0.5 * (m(b["x"]) - b["y"]).square().sum(dim=1).mean()

    result = spectrum.compute_spectra(model, ["0"], [batch], mse, top_k=6)
    v = torch.linalg.svd(model[0].weight.detach(), full_matrices=False).Vh.T  # (in, r), the Basel form's V up to signs
    expected = (batch["x"] @ v).square().mean(dim=0).double()  # (r,)
    torch.testing.assert_close(torch.tensor(result.layers[0].diagonal, dtype=torch.float64), expected, atol=1e-5, rtol=1e-4)
    off = result.layers[0].hessian - torch.diag(torch.diagonal(result.layers[0].hessian))
    assert float(off.abs().max()) < 1e-5
    assert result.layers[0].negative_share == 0.0


def test_hessian_columns_match_hessian_vector_products_on_a_tiny_llama():
    model = make_tiny_llama()
    layers = to_basis_form(model, aux_rank=0)
    batch = next(token_batches())
    for name in ("model.layers.0.mlp.down_proj", "lm_head"):
        layer = layers[name]
        positions = spectrum.top_positions(layer.sigma, 6)
        loss, block = spectrum.layer_hessian(model, layer, batch, lm_loss, positions)
        assert loss == pytest.approx(float(lm_loss(model, batch).detach()), rel=1e-6)
        for j in (0, 3):
            e = torch.zeros(layer.rank)
            e[positions[j]] = 1.0
            _, _, (hv,) = hessian_vector_product(model, [layer], batch, lm_loss, [e])
            torch.testing.assert_close(block[:, j], hv[positions].double(), atol=1e-6, rtol=1e-4)
        torch.testing.assert_close(block, block.T)


def test_measured_layer_hessian_matches_finite_differences_and_puts_the_layer_back():
    model, tokenizer = load_model_and_tokenizer("tiny-random-llama", dtype=torch.float64)
    task = load_task("embedded-math", test_size=1, train_size=4)
    batch = next(iter(BatchStream(task.train, tokenizer, batch_size=2, max_length=64)))
    name = "model.layers.1.mlp.down_proj"
    before = model.get_submodule(name)
    flags = [p.requires_grad for p in model.parameters()]
    with spectrum.measured_layers(model, [name]) as (layer,), eager_attention(model):
        assert isinstance(layer, BasisLinear) and model.get_submodule(name) is layer
        assert model.config._attn_implementation == "eager"
        _, hessian = spectrum.layer_hessian(model, layer, batch, answer_token_loss, torch.arange(6))
        h = 1e-2  # column 2 by central differences of the gradient (sigma is fp32: a larger step keeps rounding out)
        cols = []
        for sign in (1, -1):
            with torch.no_grad():
                layer.sigma[2] += sign * h
            _, (grad,) = sigma_gradients(model, [layer], batch, answer_token_loss)
            cols.append(grad[:6].double())
            with torch.no_grad():
                layer.sigma[2] -= sign * h
    assert model.get_submodule(name) is before  # the original layer is back
    assert model.config._attn_implementation == "sdpa"
    assert [p.requires_grad for p in model.parameters()] == flags
    assert hessian.shape == (6, 6) and torch.allclose(hessian, hessian.T)
    torch.testing.assert_close(hessian[:, 2], (cols[0] - cols[1]) / (2 * h), rtol=1e-2, atol=1e-6)


def test_layer_spectrum_refuses_a_non_finite_loss():
    model = _linear_model()
    with pytest.raises(BSIError, match="not finite"):
        spectrum.compute_spectra(model, ["0"], [{}], lambda m, b: m[0].sigma.sum() * float("nan"), top_k=2)
    assert type(model[0]) is nn.Linear


def test_power_law_fit_recovers_a_synthetic_exponent():
    k = torch.arange(1, 129, dtype=torch.float64)
    exact = spectrum.fit_power_law(7.0 * k**-0.8)
    assert exact.alpha == pytest.approx(0.8, abs=1e-9)
    assert exact.log_c == pytest.approx(math.log(7.0), abs=1e-9)
    assert exact.r2 == pytest.approx(1.0)
    assert exact.envelope_share == 1.0
    assert exact.alpha_envelope == pytest.approx(0.8, abs=1e-9)
    g = torch.Generator().manual_seed(0)
    noisy = 7.0 * k**-1.3 * torch.exp(0.2 * torch.randn(128, generator=g, dtype=torch.float64))
    signed = noisy * torch.where(torch.rand(128, generator=g) < 0.3, -1.0, 1.0).double()
    fit = spectrum.fit_power_law(signed[torch.randperm(128, generator=g)])  # any order, any signs
    assert fit.alpha == pytest.approx(1.3, abs=0.05)
    assert 0 < fit.envelope_share <= 1
    reversed_order = spectrum.fit_power_law((3.0 * k**-1.3).flip(0))  # increasing order: sorted first
    assert reversed_order.alpha == pytest.approx(1.3, abs=1e-9)
    assert math.exp(reversed_order.log_c) == pytest.approx(3.0, rel=1e-9)


def test_layer_selection_by_name_pattern_and_index():
    model = make_tiny_llama()
    assert spectrum.select_layers(model, ["mlp.down_proj"]) == [
        "model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"]
    assert spectrum.select_layers(model, ["mlp.down_proj@-1", "model.layers.0.self_attn.q_proj"]) == [
        "model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj"]
    assert spectrum.select_layers(model, ["*.layers.1.*_proj@0"]) == ["model.layers.1.self_attn.q_proj"]
    default = spectrum.select_layers(model)  # the last layer of each kind: the cheapest to differentiate twice
    assert [layer_kind(n) for n in default] == [
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "lm_head"]
    assert {layer_block(n) for n in default} == {1, None}
    assert layer_block("model.layers.12.mlp.up_proj") == 12 and layer_block("lm_head") is None
    with pytest.raises(BSIError, match="no layer matches"):
        spectrum.select_layers(model, ["nope"])
    with pytest.raises(BSIError, match="out of range"):
        spectrum.select_layers(model, ["mlp.up_proj@5"])
    tied = make_tiny_llama(tied=True)
    assert "lm_head" not in spectrum.candidate_layers(tied)  # a tied head is the embedding


def test_spectrum_switches_to_eager_attention_and_back():
    model, _ = build_tiny_model()
    before = model.config._attn_implementation
    seen = []

    def loss(m, batch):
        seen.append(m.config._attn_implementation)
        return lm_loss(m, batch)

    spectrum.compute_spectra(model, ["model.layers.1.mlp.up_proj"], [next(token_batches(vocab=64))], loss, top_k=4)
    assert set(seen) == {"eager"}
    assert model.config._attn_implementation == before


def test_estimator_error_falls_as_one_over_sqrt_probes_against_the_exact_diagonal():
    model = make_tiny_llama()
    layers = to_basis_form(model, aux_rank=0)
    chosen = [layers["model.layers.0.self_attn.o_proj"], layers["model.layers.1.mlp.up_proj"]]
    positions = [spectrum.top_positions(layer.sigma, 12) for layer in chosen]
    batch = next(token_batches())
    blocks = [spectrum.layer_hessian(model, layer, batch, lm_loss, pos)[1] for layer, pos in zip(chosen, positions)]
    exact = torch.cat([torch.diagonal(b) for b in blocks])  # (24,)
    singles = []
    for seed in range(64):
        result = profile_batch(model, chosen, positions, batch, lm_loss, eps=1e-3, scope="model", method="hvp",
                               generator=torch.Generator().manual_seed(seed))
        singles.append(torch.cat([h[p] for h, p in zip(result.hessians, positions)]))
    errors = theory.relative_error_by_probes(torch.stack(singles), exact, [1, 4, 16, 64])
    ratio = errors[1] / errors[16]  # ideal: sqrt(16) = 4
    assert 2.5 < ratio < 6.5
    assert errors[64] < errors[16] < errors[4] < errors[1]


def test_bsi_spectrum_cli_on_the_tiny_model(tmp_path, capsys):
    out = tmp_path / "spec"
    code = main(["spectrum", "--model", "tiny-random-llama", "--layers", "mlp.down_proj@-1", "self_attn.v_proj@0",
                 "--top-k", "8", "--batches", "2", "--batch-size", "2", "--max-length", "128", "--out", str(out),
                 "--quiet"])
    assert code == 0
    data = json.loads((out / "spectrum.json").read_text())
    assert [layer["name"] for layer in data["layers"]] == ["model.layers.0.self_attn.v_proj", "model.layers.1.mlp.down_proj"]
    for layer in data["layers"]:
        assert len(layer["eigenvalues"]) == 8 and layer["k"] == 8
        magnitudes = [abs(v) for v in layer["eigenvalues"]]
        assert magnitudes == sorted(magnitudes, reverse=True)
        assert layer["trace"] == pytest.approx(sum(layer["diagonal"]), rel=1e-6, abs=1e-12)
    assert data["batches"] == 2 and len(data["losses"]) == 2
    html = (out / "spectrum.html").read_text()
    assert "plotly" in html and "model.layers.1.mlp.down_proj" in html
    table = capsys.readouterr().out
    assert "| model.layers.1.mlp.down_proj | 8 |" in table
    assert (out / "summary.txt").read_text().startswith("| layer |")


def test_bsi_spectrum_cli_rejects_bad_layers_before_work(tmp_path, capsys):
    code = main(["spectrum", "--model", "tiny-random-llama", "--layers", "attn.nothing", "--out", str(tmp_path / "x")])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no layer matches 'attn.nothing'" in err[0]
    assert not (tmp_path / "x").exists()
    assert main(["spectrum", "--model", "tiny-random-llama", "--top-k", "0", "--out", str(tmp_path / "y")]) == 2


def test_bsi_spectrum_defaults_are_the_quick_ones(tmp_path, capsys):
    from bsi.cli import build_parser

    args = build_parser().parse_args(["spectrum", "--out", str(tmp_path / "s")])
    assert (args.top_k, args.batches, args.batch_size, args.layers) == (16, 1, 4, None)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["spectrum", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "about a minute" in help_text and "last block's layer of each kind" in help_text
