import math

import pytest
import torch

from bsi.errors import BSIError
from bsi.method import scores as importance
from bsi.method import theory


def test_zeta_and_harmonic_numbers_match_closed_forms():
    assert theory.zeta(2.0) == pytest.approx(math.pi**2 / 6, rel=1e-12)
    assert theory.zeta(4.0) == pytest.approx(math.pi**4 / 90, rel=1e-12)
    assert theory.zeta(1.5) == pytest.approx(2.612375348685488, rel=1e-12)
    assert theory.generalized_harmonic(3, 2.0) == pytest.approx(1 + 1 / 4 + 1 / 9, rel=1e-15)
    assert theory.generalized_harmonic(100_000, 2.0) < theory.zeta(2.0)
    with pytest.raises(BSIError, match="diverges"):
        theory.zeta(1.0)


def test_variance_bounds_by_hand():
    assert theory.variance_bound_power_law(2.0, 1.0, probes=4) == pytest.approx(4 * (math.pi**2 / 6) / 4)
    h = torch.tensor([[1.0, 2.0], [2.0, -3.0]])
    assert theory.variance_bound_frobenius(h, probes=2) == pytest.approx((1 + 4 + 4 + 9) / 2)
    assert theory.variance_bound_frobenius(18.0, probes=2) == pytest.approx(9.0)
    assert theory.hutchinson_variance(h, probes=2) == pytest.approx((4 + 4) / 2)  # off-diagonal mass only


def test_hutchinson_variance_is_exact_and_below_the_bounds():
    g = torch.Generator().manual_seed(0)
    n, alpha = 12, 0.9
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    lam = 3.0 * torch.arange(1, n + 1, dtype=torch.float64) ** -alpha * torch.tensor([1.0, -1.0]).repeat(n // 2).double()
    h = q @ torch.diag(lam) @ q.T  # power-law spectrum, mixed signs
    z = (torch.randint(0, 2, (20000, n), generator=g) * 2 - 1).double()  # (S, n)
    single = z * (z @ h)  # (S, n): z * (H z) per probe (H symmetric)
    monte_carlo = float(single.var(dim=0).sum())
    exact = theory.hutchinson_variance(h)
    assert monte_carlo == pytest.approx(exact, rel=0.05)
    assert exact <= theory.variance_bound_frobenius(h) <= theory.variance_bound_power_law(3.0, alpha) + 1e-12


def test_sample_complexity_by_hand():
    # lambda_1 = 2, a = 1, Tr = 3, n = 2, e = 0.5, delta = 0.1: H_{2,2} = 1.25
    expected = 2 * (4 * 1.25 / (9 / 2) - 1) * math.log(2 * 2 / 0.1) / 0.5**2
    assert theory.sample_complexity(2.0, 1.0, 3.0, 2, 0.5, 0.1) == pytest.approx(expected)
    assert theory.sample_complexity(2.0, 1.0, 0.0, 2, 0.5, 0.1) == math.inf
    psd = 2 * (10 * math.pi**2 / 6 - 1) * math.log(2 * 10 / 0.05) / 0.1**2
    assert theory.sample_complexity_psd(10, 1.0, 0.1, 0.05) == pytest.approx(psd)
    with pytest.raises(BSIError, match="delta"):
        theory.sample_complexity_psd(10, 1.0, 0.1, 1.5)


def test_probes_needed_from_a_spectrum():
    # a multiple of the identity: Hutchinson is exact with one probe
    assert theory.probes_needed([1.0, 1.0, 1.0, 1.0], 0.1, 0.1) == 1
    # eigenvalues 2 and -1: n sum(l^2) / Tr^2 = 2 * 5 / 1 = 10
    threshold = 2 * (10 - 1) * math.log(4 / 0.1) / 0.1**2
    assert theory.probes_needed([2.0, -1.0], 0.1, 0.1) == math.floor(threshold) + 1
    # the power-law form uses |lambda_1|^2 H_{n,2a} instead of the measured energy
    threshold = theory.sample_complexity(2.0, 1.0, 1.0, 2, 0.1, 0.1)
    assert theory.probes_needed([2.0, -1.0], 0.1, 0.1, alpha=1.0) == math.floor(threshold) + 1
    assert theory.probes_needed([1.0, -1.0], 0.1, 0.1) == math.inf


def test_loss_change_bounds_by_hand():
    assert theory.loss_change_bound(0.5, 2.0, 1.0, rho=3.0) == pytest.approx(abs(-0.5 + 1.0) + 0.5)
    assert theory.loss_change_bound_estimated(0.5, 2.0, 1.0, rho=3.0, error=0.2) == pytest.approx(1.0 + 0.2 / 1.6 * 2.0)
    g, h, s = torch.tensor([0.5, -1.0]), torch.tensor([2.0, -4.0]), torch.tensor([1.0, 0.5])
    bound = theory.loss_change_bound(g, h, s, rho=0.0)
    torch.testing.assert_close(bound, importance.importance_scores(s, g, h).abs())
    with pytest.raises(BSIError):
        theory.loss_change_bound_estimated(0.5, 2.0, 1.0, rho=0.0, error=1.0)


def test_eps_rule_is_the_engines():
    assert theory.eps_rule is importance.eps_rule
    assert theory.eps_rule(82.0, torch.float32) == pytest.approx(2.0**-24 * 82 / 0.01)


def test_relative_error_by_probes_falls_as_one_over_sqrt_probes():
    g = torch.Generator().manual_seed(1)
    exact = torch.linspace(1, 2, 50)
    estimates = exact + torch.randn(256, 50, generator=g)  # (P, n), unbiased unit noise
    errors = theory.relative_error_by_probes(estimates, exact, [1, 4, 16, 64])
    assert errors[1] / errors[16] == pytest.approx(4.0, rel=0.1)
    assert errors[4] / errors[64] == pytest.approx(4.0, rel=0.15)


def test_sample_complexity_scales_as_one_over_e_squared_and_grows_with_the_spectrum():
    # the Spectra tab's calculator is this function: the properties a reader relies on
    n, lam, trace, e, delta = 64, 2.0, 10.0, 0.1, 0.05
    base = theory.sample_complexity(lam, 1.0, trace, n, e, delta)
    expected = 2 * (lam**2 * theory.generalized_harmonic(n, 2.0) / (trace**2 / n) - 1) * math.log(2 * n / delta) / e**2
    assert base == pytest.approx(expected)
    assert theory.sample_complexity(lam, 1.0, trace, n, e / 2, delta) == pytest.approx(4 * base)
    assert theory.sample_complexity(2 * lam, 1.0, trace, n, e, delta) > base  # more off-diagonal energy, more probes
    assert theory.sample_complexity(lam, 2.0, trace, n, e, delta) < base  # a faster-decaying spectrum, fewer
    assert theory.sample_complexity(0.1, 1.0, trace, n, e, delta) < 0  # diagonal-dominated: any s >= 1 will do
    with pytest.raises(BSIError, match="relative error"):
        theory.sample_complexity(lam, 1.0, trace, n, 0.0, delta)
