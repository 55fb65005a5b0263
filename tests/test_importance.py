import pytest
import torch

from bsi.errors import BSIError
from bsi.method.scores import (
    candidate_pool,
    eps_rule,
    importance_scores,
    kept_positions,
    mass_rule_keep_count,
    probe_vector,
    select_pruned,
    significant_gradient,
    symmetric_difference_hessian,
)


def test_importance_scores_by_formula():
    sigma = torch.tensor([2.0, 1.0, 0.5])
    grad = torch.tensor([0.1, -0.2, 0.3])
    hess = torch.tensor([1.0, 2.0, -4.0])
    bsi = importance_scores(sigma, grad, hess, "bsi")
    torch.testing.assert_close(bsi, torch.tensor([-0.2 + 2.0, 0.2 + 1.0, -0.15 - 0.5]))
    torch.testing.assert_close(importance_scores(sigma, grad, hess, "bsi-grad"), torch.tensor([-0.2, 0.2, -0.15]))
    torch.testing.assert_close(importance_scores(-sigma, grad, hess, "basel"), sigma)
    with pytest.raises(BSIError, match="unknown score"):
        importance_scores(sigma, grad, hess, "magnitude")


def test_significant_gradient_keeps_only_values_beyond_z_standard_errors():
    grad = torch.tensor([0.3, -0.3, 0.1, -0.5, 0.0])
    se = torch.tensor([0.1, 0.2, 0.1, 0.1, 0.0])
    torch.testing.assert_close(significant_gradient(grad, se, 2.0), torch.tensor([0.3, 0.0, 0.0, -0.5, 0.0]))
    torch.testing.assert_close(significant_gradient(grad, se, 0.5), grad)


def test_bsi_drops_insignificant_first_order_terms_and_bsi_grad_never_does():
    from bsi.method.scores import get_score

    sigma = torch.tensor([2.0, 1.0])
    grad, hess, se = torch.tensor([0.1, -0.2]), torch.tensor([1.0, 2.0]), torch.tensor([0.1, 0.01])
    gated = get_score("bsi")(sigma, grad, hess, grad_se=se, gradient_z=2.0)
    torch.testing.assert_close(gated, torch.tensor([0.0 + 2.0, 0.2 + 1.0]))  # basis 0: |0.1| < 2 * 0.1
    torch.testing.assert_close(get_score("bsi")(sigma, grad, hess, grad_se=se, gradient_z=0.0),
                               importance_scores(sigma, grad, hess, "bsi"))
    torch.testing.assert_close(get_score("bsi-grad")(sigma, grad, grad_se=se, gradient_z=2.0),
                               torch.tensor([-0.2, 0.2]))


@pytest.mark.parametrize(
    "dtype,bits", [(torch.float32, 23), (torch.bfloat16, 7), (torch.float16, 10)]
)
def test_eps_rule_per_dtype(dtype, bits):
    sigma_max, alpha = 82.0, 0.01
    expected = min(2.0 ** -(bits + 1) * sigma_max / alpha, 0.1)
    assert eps_rule(sigma_max, dtype, alpha=alpha, eps_max=0.1) == pytest.approx(expected)


def test_eps_rule_values():
    assert eps_rule(82.0, torch.float32) == pytest.approx(82.0 * 2**-24 / 0.01)  # ~4.9e-4
    assert eps_rule(82.0, torch.bfloat16) == 0.1  # capped at eps_max
    assert eps_rule(1.0, torch.float16, alpha=0.5, eps_max=0.9) == pytest.approx(2**-11 / 0.5)
    with pytest.raises(BSIError):
        eps_rule(1.0, torch.int8)


def test_candidate_pool_protects_largest_mass():
    sigma = torch.tensor([1.0, 8.0, 0.5, 4.0, 2.0])  # total 15.5
    # rho = 0.7 -> need 10.85: 8 + 4 = 12 >= 10.85, so K = {1, 3}; pool = the rest
    assert candidate_pool(sigma, 0.7).tolist() == [0, 2, 4]
    assert candidate_pool(sigma, 0.5).tolist() == [0, 2, 3, 4]  # 8 >= 7.75
    assert candidate_pool(sigma, 1.0).tolist() == []
    assert candidate_pool(sigma, 0.0).tolist() == [0, 1, 2, 3, 4]
    assert candidate_pool(-sigma, 0.7).tolist() == [0, 2, 4]  # magnitudes count


def test_mass_rule_keeps_fewest_reaching_fraction_of_positive_mass():
    imp = torch.tensor([5.0, -1.0, 3.0, 2.0])  # positive mass 10
    assert mass_rule_keep_count(imp, 0.5) == 1  # 5 >= 5
    assert mass_rule_keep_count(imp, 0.7) == 2  # 5 + 3 = 8 >= 7
    assert mass_rule_keep_count(imp, 1.0) == 3  # all positives, never the negative
    assert mass_rule_keep_count(imp, 0.0) == 0
    assert mass_rule_keep_count(imp, 2.0) == 4  # target-size extension keeps everything


def test_select_pruned_within_pool_only():
    imp = torch.tensor([9.0, 0.1, 5.0, -1.0, 3.0, 2.0])
    pool = torch.tensor([1, 3, 4, 5])  # positive mass in pool: 0.1 + 3 + 2 = 5.1
    pruned = select_pruned(imp, pool, 0.5)  # keep 3 (3 >= 2.55), prune 2, 1, and the negative 3
    assert pruned.tolist() == [1, 3, 5]
    assert kept_positions(6, pruned).tolist() == [0, 2, 4]


def test_all_negative_pool_is_pruned_whole():
    imp = torch.tensor([4.0, -0.5, -2.0, -0.1])
    pool = torch.tensor([1, 2, 3])
    assert select_pruned(imp, pool, 0.9).tolist() == [1, 2, 3]
    assert select_pruned(imp, torch.tensor([], dtype=torch.long), 0.9).numel() == 0


def test_probe_vector_is_rademacher_inside_pool_zero_outside():
    g = torch.Generator().manual_seed(0)
    z = probe_vector(10, torch.tensor([2, 5, 7]), g)
    assert set(z[[2, 5, 7]].tolist()) <= {-1.0, 1.0}
    assert torch.count_nonzero(z[[0, 1, 3, 4, 6, 8, 9]]) == 0


def test_symmetric_difference_exact_for_quadratic():
    # l(s) = 1/2 s^T A s  ->  grad = A s, so (g+ - g-) = eps A z and z*(A z) has mean diag(A)
    a = torch.tensor([[2.0, 0.5], [0.5, 3.0]], dtype=torch.float64)
    s = torch.tensor([1.0, -1.0], dtype=torch.float64)
    z = torch.tensor([1.0, -1.0])
    eps = 1e-2
    h = symmetric_difference_hessian(a @ (s + eps / 2 * z), a @ (s - eps / 2 * z), z, eps)
    torch.testing.assert_close(h, (z * (a.float() @ z)), atol=1e-4, rtol=1e-4)
