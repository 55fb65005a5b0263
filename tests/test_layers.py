import pytest
import torch
from torch import nn

from bsi.method import bases as bases_module
from bsi.method.bases import svd_bases, thin_svd, whitened_bases, whitened_bases_by, whitening_factor
from bsi.method.layers import BasisLinear, LowRankLinear


@pytest.mark.parametrize("shape,bias", [((24, 40), True), ((40, 24), False), ((32, 32), True)])
def test_full_rank_basis_linear_equals_linear(shape, bias):
    torch.manual_seed(0)
    linear = nn.Linear(shape[1], shape[0], bias=bias)
    layer = BasisLinear.from_linear(linear, aux_rank=4)
    x = torch.randn(3, 5, shape[1])
    assert layer.rank == min(shape)
    torch.testing.assert_close(layer(x), linear(x), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(layer.dense_weight(), linear.weight.detach(), atol=1e-5, rtol=1e-5)


def test_svd_bases_sorted_and_reconstruct():
    w = torch.randn(10, 7)
    u, s, v = svd_bases(w)
    assert u.shape == (10, 7) and s.shape == (7,) and v.shape == (7, 7)
    assert torch.all(s[:-1] >= s[1:])
    torch.testing.assert_close(u @ torch.diag(s) @ v.T, w, atol=1e-5, rtol=1e-5)


def test_keep_removes_bases_and_preserves_kept_outputs():
    torch.manual_seed(1)
    linear = nn.Linear(20, 12)
    layer = BasisLinear.from_linear(linear, aux_rank=0)
    with torch.no_grad():
        layer.sigma.mul_(torch.linspace(0.5, 1.5, layer.rank))  # "learned" coefficients
    keep = torch.tensor([0, 3, 4, 9])
    expected_w = (layer.U[:, keep] * layer.sigma.detach()[keep]) @ layer.V[:, keep].T
    x = torch.randn(6, 20)
    expected = x @ expected_w.T + linear.bias.detach()
    layer.keep(keep)
    assert layer.rank == 4 and layer.U.shape == (12, 4) and layer.V.shape == (20, 4)
    assert layer.basis_ids.tolist() == [0, 3, 4, 9]
    torch.testing.assert_close(layer(x), expected, atol=1e-5, rtol=1e-5)
    layer.keep(torch.tensor([2, 0]))  # positions are relative to the current active set
    assert layer.basis_ids.tolist() == [0, 4]


def test_aux_vectors_start_silent_but_learn():
    linear = nn.Linear(16, 8, bias=False)
    layer = BasisLinear.from_linear(linear, aux_rank=3)
    x = torch.randn(4, 16)
    layer(x).square().sum().backward()
    assert layer.aux_u.grad is not None and layer.aux_u.grad.abs().sum() > 0
    assert torch.count_nonzero(layer.aux_u) == 0


def test_sigma_stays_fp32_in_bf16_layer():
    linear = nn.Linear(16, 8).to(torch.bfloat16)
    layer = BasisLinear.from_linear(linear, aux_rank=2)
    assert layer.sigma.dtype == torch.float32 and layer.U.dtype == torch.bfloat16
    x = torch.randn(2, 16, dtype=torch.bfloat16)
    y = layer(x)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), linear(x).float(), atol=0.05, rtol=0.05)


def test_low_rank_export_matches_basis_layer_and_sizes():
    torch.manual_seed(2)
    layer = BasisLinear.from_linear(nn.Linear(30, 20), aux_rank=2)
    with torch.no_grad():
        layer.aux_u.normal_()
    layer.keep(torch.arange(5))
    low = LowRankLinear.from_basis(layer)
    x = torch.randn(3, 30)
    torch.testing.assert_close(low(x), layer(x), atol=1e-5, rtol=1e-5)
    assert low.rank == 7
    assert layer.factor_parameters() == 7 * 50 + 20
    assert layer.stored_parameters() == min(7 * 50 + 20, 30 * 20 + 20)
    for dense in (layer.to_linear(), low.to_linear()):  # both forms merge back into the same dense layer
        assert type(dense) is nn.Linear and dense.bias is not None
        torch.testing.assert_close(dense(x), layer(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("bias", [False, True])
def test_merged_layers_keep_the_factors_dtype(bias):
    layer = BasisLinear.from_linear(nn.Linear(16, 8, bias=bias).to(torch.bfloat16), aux_rank=2)
    for form in (layer, LowRankLinear.from_basis(layer)):
        dense = form.to_linear()
        assert dense.weight.dtype == torch.bfloat16 and (dense.bias is not None) == bias
        torch.testing.assert_close(dense.weight.float(), form.dense_weight(), atol=0.05, rtol=0.02)


@pytest.mark.parametrize("bias", [False, True])
def test_shipped_low_rank_layer_matches_the_library_one(bias):
    """The copy in the exported folder's modeling_bsi.py: same tensor names, shapes and outputs as bsi's."""
    from bsi.pipeline.modeling_bsi import LowRankLinear as Shipped

    torch.manual_seed(3)
    ours = LowRankLinear(30, 20, 5, bias)
    with torch.no_grad():
        for p in ours.parameters():
            p.normal_()
    shipped = Shipped(30, 20, 5, bias)
    assert {k: v.shape for k, v in shipped.state_dict().items()} == {k: v.shape for k, v in ours.state_dict().items()}
    shipped.load_state_dict(ours.state_dict())
    x = torch.randn(3, 7, 30)
    assert torch.equal(shipped(x), ours(x))


def test_thin_svd_on_the_cpu_is_torch_svd_of_the_tall_way_round():
    tall = torch.randn(20, 12, generator=torch.Generator().manual_seed(1))  # (out, in)
    for got, want in zip(thin_svd(tall), torch.linalg.svd(tall, full_matrices=False)):
        assert torch.equal(got, want)
    for dtype, tolerance in ((torch.float32, 1e-5), (torch.float64, 1e-12)):
        wide = tall.T.to(dtype).contiguous()  # (12, 20): factorised as its transpose
        u, s, vh = thin_svd(wide)  # (12, 12), (12,), (12, 20)
        assert u.shape == (12, 12) and s.shape == (12,) and vh.shape == (12, 20)
        assert u.is_contiguous() and vh.is_contiguous() and u.dtype == s.dtype == vh.dtype == dtype
        assert torch.equal(s, torch.linalg.svd(tall.to(dtype), full_matrices=False)[1])
        assert torch.all(s[:-1] >= s[1:])
        eye = torch.eye(12, dtype=dtype)
        assert torch.allclose(u.T @ u, eye, atol=tolerance * 10) and torch.allclose(vh @ vh.T, eye, atol=tolerance * 10)
        assert torch.linalg.matrix_norm((u * s) @ vh - wide) / torch.linalg.matrix_norm(wide) < tolerance
        # the same singular triplets as torch's own factorisation of the wide matrix, up to each pair's sign
        u_direct, _, vh_direct = torch.linalg.svd(wide, full_matrices=False)
        signs = torch.sign((u * u_direct).sum(0))  # (12,)
        assert torch.allclose(u, u_direct * signs, atol=tolerance * 1e3)
        assert torch.allclose(vh, vh_direct * signs[:, None], atol=tolerance * 1e3)


def _moment(n: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A second moment ``X^T X / N`` (n, n) of inputs with unequal channel scales, made slightly asymmetric."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(64, n, generator=g) * torch.rand(n, generator=g) * 3  # (N, n)
    c = (x.T @ x / 64).to(dtype)  # (n, n)
    c[0, 1] += 1e-3  # round-off leaves a gathered moment a little asymmetric; the factor must not care
    return c


def test_whitening_factor_is_the_cholesky_factor_of_the_damped_symmetric_part_to_the_bit():
    for dtype in (torch.float32, torch.float64):
        c = _moment(24, 0, dtype)
        kept = c.clone()
        factor = whitening_factor(c, 1e-3)  # (24, 24) lower, float64
        symmetric = 0.5 * (c.double() + c.double().T)
        shift = 1e-3 * float(symmetric.diagonal().mean()) * torch.eye(24, dtype=torch.float64)  # the damping
        assert factor.dtype == torch.float64 and torch.equal(factor, torch.linalg.cholesky(symmetric + shift))
        assert torch.equal(c, kept)  # the caller's moment is read, never written (float64 is not copied by .double())
        assert torch.equal(torch.tril(factor), factor) and torch.allclose(factor @ factor.T - symmetric, shift, atol=1e-12)
    indefinite = torch.diag(torch.tensor([1.0, 1.0, -0.05]))  # (3, 3): damping 1e-3 and 1e-2 fail, 0.1 succeeds
    factor = whitening_factor(indefinite, 1e-3)
    scale = float(indefinite.double().diagonal().mean())
    tenfold_twice = 1e-3 * 10 * 10  # the damping grown as the function grows it (not quite 0.1 in binary)
    assert torch.equal(factor, torch.linalg.cholesky(indefinite.double() + tenfold_twice * scale * torch.eye(3, dtype=torch.float64)))


def test_whitened_bases_by_shares_each_inputs_factor_while_its_layers_follow_each_other(monkeypatch):
    first, second = _moment(12, 1), _moment(12, 2)
    covariance = {"0.q": first, "0.k": first, "0.o": second, "1.q": first}  # 1.q's input is 0.q's, but not next
    linears = {name: nn.Linear(12, 8 if name.endswith("k") else 12) for name in covariance}
    made = []
    monkeypatch.setattr(bases_module, "whitening_factor",
                        lambda c, d: made.append(c) or whitening_factor(c, d))  # the calls, then the real factor
    bases = whitened_bases_by(covariance, 1e-3)
    got = {name: bases(name, linear) for name, linear in linears.items()}
    assert [c is first for c in made] == [True, False, True]  # 0.k reused 0.q's; 1.q came after another input
    monkeypatch.undo()
    for name, linear in linears.items():  # the very bases each layer gets alone
        for shared, alone in zip(got[name], whitened_bases(linear.weight, covariance[name], 1e-3)):
            assert torch.equal(shared, alone)
