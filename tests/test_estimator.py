import pytest
import torch
from torch import nn

from bsi.method import curvature
from bsi.method.curvature import hessian_vector_product, profile_batch, sigma_gradients
from bsi.method.layers import BasisLinear


def toy_model(seed: int = 0) -> nn.Sequential:
    """Three BasisLinear layers with tanh in between: small enough for an exact Hessian."""
    torch.manual_seed(seed)
    dims = [12, 10, 8, 5]
    layers = []
    for i in range(3):
        layers.append(BasisLinear.from_linear(nn.Linear(dims[i], dims[i + 1]), aux_rank=1))
        if i < 2:
            layers.append(nn.Tanh())
    return nn.Sequential(*layers)


def toy_loss(model, batch):
    return nn.functional.cross_entropy(model(batch["x"]), batch["y"])


def exact_hessian_diagonal(model, layers, batch):
    sigmas = [layer.sigma for layer in layers]
    grads = torch.autograd.grad(toy_loss(model, batch), sigmas, create_graph=True)
    flat = torch.cat(grads)  # (n,)
    diag = []
    for i in range(flat.numel()):
        row = torch.autograd.grad(flat[i], sigmas, retain_graph=True)
        diag.append(torch.cat(row)[i])
    return torch.stack(diag).detach()


@pytest.fixture
def toy():
    model = toy_model()
    layers = [m for m in model if isinstance(m, BasisLinear)]
    g = torch.Generator().manual_seed(3)
    batch = {"x": torch.randn(32, 12, generator=g), "y": torch.randint(0, 5, (32,), generator=g)}
    pools = [torch.arange(layer.rank) for layer in layers]
    return model, layers, batch, pools


def relative_error(model, layers, batch, pools, exact, probes, scope, method="fd", seed=0):
    result = profile_batch(model, layers, pools, batch, toy_loss, eps=1e-2, scope=scope, method=method,
                           probes=probes, generator=torch.Generator().manual_seed(seed))
    estimate = torch.cat(result.hessians)
    return float((estimate - exact).norm() / exact.norm())


@pytest.mark.parametrize("scope", ["layer", "model"])
def test_estimator_converges_to_exact_hessian_diagonal(toy, scope):
    model, layers, batch, pools = toy
    exact = exact_hessian_diagonal(model, layers, batch)
    few = sum(relative_error(model, layers, batch, pools, exact, 4, scope, seed=s) for s in range(4)) / 4
    many = relative_error(model, layers, batch, pools, exact, 1024, scope)
    assert many < 0.2
    assert many < 0.35 * few  # error falls roughly as 1/sqrt(probes): 16x the probes -> ~1/4


def test_layer_scope_has_less_variance_than_model_scope(toy):
    model, layers, batch, pools = toy
    exact = exact_hessian_diagonal(model, layers, batch)
    layer = sum(relative_error(model, layers, batch, pools, exact, 8, "layer", seed=s) for s in range(6))
    joint = sum(relative_error(model, layers, batch, pools, exact, 8, "model", seed=s) for s in range(6))
    assert layer < joint


def test_hvp_method_matches_finite_differences(toy):
    model, layers, batch, pools = toy
    exact = exact_hessian_diagonal(model, layers, batch)
    assert relative_error(model, layers, batch, pools, exact, 1024, "model", method="hvp") < 0.2
    # with the same probes, fd and hvp agree up to O(eps^2)
    fd = profile_batch(model, layers, pools, batch, toy_loss, eps=1e-2, probes=8,
                       generator=torch.Generator().manual_seed(5))
    hvp = profile_batch(model, layers, pools, batch, toy_loss, eps=1e-2, probes=8, method="hvp",
                        generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(torch.cat(fd.hessians), torch.cat(hvp.hessians), atol=2e-3, rtol=2e-2)


def test_gradient_and_pool_masking(toy):
    model, layers, batch, _ = toy
    pools = [torch.tensor([0, 2]), torch.tensor([], dtype=torch.long), torch.tensor([4])]
    result = profile_batch(model, layers, pools, batch, toy_loss, eps=1e-2, probes=2)
    _, grads = sigma_gradients(model, layers, batch, toy_loss)
    for g, expected in zip(result.grads, grads):
        torch.testing.assert_close(g, expected)
    for layer, pool, h in zip(layers, pools, result.hessians):
        outside = torch.ones(layer.rank, dtype=torch.bool)
        outside[pool] = False
        assert torch.count_nonzero(h[outside]) == 0


def test_sigma_restored_exactly_and_training_mode_kept(toy):
    model, layers, batch, pools = toy
    model.train()
    before = [layer.sigma.detach().clone() for layer in layers]
    profile_batch(model, layers, pools, batch, toy_loss, eps=0.05, probes=3)
    assert model.training
    for layer, b in zip(layers, before):
        assert torch.equal(layer.sigma.detach(), b)


def test_non_finite_batch_returns_none(toy):
    model, layers, _, pools = toy
    bad = {"x": torch.full((4, 12), float("nan")), "y": torch.zeros(4, dtype=torch.long)}
    assert profile_batch(model, layers, pools, bad, toy_loss, eps=1e-2) is None
    assert profile_batch(model, layers, pools, bad, toy_loss, eps=1e-2, method="hvp") is None


def test_hessian_vector_product_against_exact_row(toy):
    model, layers, batch, _ = toy
    exact = exact_hessian_diagonal(model, layers, batch)
    e0 = [torch.zeros(layer.rank) for layer in layers]
    e0[0][0] = 1.0
    _, _, hv = hessian_vector_product(model, layers, batch, toy_loss, e0)
    assert float(hv[0][0]) == pytest.approx(float(exact[0]), rel=1e-4, abs=1e-6)


def test_averaged_center_gradient_matches_exact_gradient_and_hessian(toy):
    """center="average" takes dl/dsigma as (g+ + g-)/2: equal to the exact gradient up to O(eps^2)."""
    model, layers, batch, pools = toy
    kwargs = dict(eps=1e-2, scope="model", probes=3)
    exact = profile_batch(model, layers, pools, batch, toy_loss, generator=torch.Generator().manual_seed(5), **kwargs)
    avg = profile_batch(model, layers, pools, batch, toy_loss, generator=torch.Generator().manual_seed(5),
                        center="average", **kwargs)
    g_exact, g_avg = torch.cat(exact.grads), torch.cat(avg.grads)
    assert float((g_avg - g_exact).norm() / g_exact.norm()) < 1e-3  # eps^2 = 1e-4 scale
    assert not torch.equal(g_avg, g_exact)  # it really is a different computation
    torch.testing.assert_close(torch.cat(avg.hessians), torch.cat(exact.hessians))  # same probes, same estimate
    assert avg.loss == pytest.approx(exact.loss, rel=1e-4)


def toy_logits(model, batch):
    return model(batch["x"])  # (N, V): the logits toy_loss averages its cross-entropy over


def test_library_hessian_diagonal_matches_the_full_hessian(toy):
    model, layers, batch, pools = toy
    picked = [pool[::2] for pool in pools]
    diagonal = curvature.exact_hessian_diagonal(model, layers, picked, batch, toy_loss)
    full = exact_hessian_diagonal(model, layers, batch).split([layer.rank for layer in layers])
    for d, f, pos in zip(diagonal, full, picked):
        assert d.dtype == torch.float64 and d.shape == pos.shape
        torch.testing.assert_close(d.float(), f[pos], rtol=1e-5, atol=1e-7)


def test_gauss_newton_diagonal_against_jacobian_and_hessian(toy):
    """G = J^T (diag p - p p^T) J / N from the full Jacobian; G = H where the logits are linear in sigma."""
    model, layers, batch, pools = toy
    gauss_newton = curvature.exact_gauss_newton_diagonal(model, layers, pools, batch, toy_logits)
    hessian = curvature.exact_hessian_diagonal(model, layers, pools, batch, toy_loss)
    # the output layer: logits are linear in its sigma, so the Hessian *is* the Gauss-Newton matrix
    torch.testing.assert_close(gauss_newton[-1], hessian[-1], rtol=1e-4, atol=1e-8)
    # the first layer, through a tanh: from the full Jacobian, and different from the Hessian
    sigma = layers[0].sigma.detach().double()
    double = toy_model().double()
    jacobian = torch.autograd.functional.jacobian(
        lambda s: torch.func.functional_call(double, {"0.sigma": s}, (batch["x"].double(),)), sigma)  # (N, V, r)
    probs = torch.softmax(toy_logits(double, batch | {"x": batch["x"].double()}), dim=-1).detach()  # (N, V)
    curvature_in_logits = torch.diag_embed(probs) - probs[:, :, None] * probs[:, None, :]  # (N, V, V)
    expected = torch.einsum("nvr,nvw,nwr->r", jacobian, curvature_in_logits, jacobian) / probs.shape[0]  # (r,)
    torch.testing.assert_close(gauss_newton[0], expected, rtol=1e-4, atol=1e-8)
    assert bool((gauss_newton[0] >= 0).all())
    assert float((gauss_newton[0] - hessian[0]).norm()) > 1e-3 * float(hessian[0].norm())
    # the parameters are back: sigma is a trainable parameter again
    assert isinstance(layers[0].sigma, nn.Parameter) and layers[0].sigma.requires_grad
