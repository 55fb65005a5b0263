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


def test_each_ablation_is_one_of_bsis_two_terms_as_bsi_computes_it():
    """bsi-curvature: bsi's second-order term, the first-order one left out; bsi-grad-tested: its first-order term
    under the same z-test, the second-order one left out."""
    from bsi.method.scores import get_score

    sigma = torch.tensor([2.0, 1.0, -0.5])
    grad, hess, se = torch.tensor([0.1, -0.2, 0.3]), torch.tensor([1.0, 2.0, 4.0]), torch.tensor([0.1, 0.01, 0.1])
    terms = get_score("bsi").terms(sigma, grad, hess, grad_se=se, gradient_z=2.0)
    curvature = get_score("bsi-curvature").terms(sigma, grad, hess, grad_se=se, gradient_z=2.0)
    gradient = get_score("bsi-grad-tested").terms(sigma, grad, hess, grad_se=se, gradient_z=2.0)
    assert set(curvature) == {"curvature"} and set(gradient) == {"gradient"}
    torch.testing.assert_close(curvature["curvature"], terms["curvature"])
    torch.testing.assert_close(gradient["gradient"], terms["gradient"])
    torch.testing.assert_close(gradient["gradient"], torch.tensor([0.0, 0.2, 0.15]))  # basis 0 fails the test
    # each measures what bsi measures (gradient and curvature, the gradient tested); only the sum differs
    for name in ("bsi-curvature", "bsi-grad-tested"):
        score = get_score(name)
        assert (score.needs_gradient, score.needs_curvature, score.loss_units) == (True, True, True)
    assert get_score("bsi-grad-tested").tests_gradient and not get_score("bsi-curvature").tests_gradient
    from bsi.method.scores import OneTermScore

    with pytest.raises(BSIError, match="leaves out 'gradient' or 'curvature'"):
        OneTermScore("odd", True, True, True, "an ablation of nothing", leaves_out="magnitude")


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


# ------------------------------------------------- budgets: the sorted-once bisections against the plain rule
def _plain_mass_to_budget(shapes, importance, pools, budget, measure, caps=None):
    """The budget bisection as first written: the whole mass rule at every step (the oracle)."""
    from bsi.method.schedule import mass_selection, parameters_after

    def at(q):
        return mass_selection(importance, pools, q, caps)

    lo, hi = 0.0, 2.0
    if parameters_after(shapes, at(hi), measure) <= budget:
        return at(hi)
    if parameters_after(shapes, at(lo), measure) >= budget:
        return at(lo)
    for _ in range(40):
        mid = (lo + hi) / 2
        if parameters_after(shapes, at(mid), measure) < budget:
            lo = mid
        else:
            hi = mid
    a, b = at(lo), at(hi)
    return a if abs(parameters_after(shapes, a, measure) - budget) <= abs(parameters_after(shapes, b, measure) - budget) else b


def _plain_global_to_budget(shapes, importance, pools, budget, measure, caps=None):
    """The global selection as first written: every prefix materialised (the oracle)."""
    from bsi.method.schedule import parameters_after

    names = list(pools)
    values, owners, positions = [], [], []
    for i, n in enumerate(names):
        pool = pools[n]
        if pool.numel() == 0:
            continue
        imp = importance[n][pool].float()
        order = torch.argsort(imp, stable=True)
        if caps is not None:
            order = order[: caps[n]]
        values.append(imp[order] / shapes[n].per_basis)
        owners.append(torch.full((order.numel(),), i, dtype=torch.long))
        positions.append(pool[order])
    value, owner, position = torch.cat(values), torch.cat(owners), torch.cat(positions)
    order = torch.argsort(value, stable=True)
    owner, position = owner[order], position[order]

    def at(k):
        return {n: position[:k][owner[:k] == i].sort().values for i, n in enumerate(names)}

    lo, hi = 0, owner.numel()
    if parameters_after(shapes, at(hi), measure) >= budget:
        return at(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if parameters_after(shapes, at(mid), measure) > budget:
            lo = mid
        else:
            hi = mid
    gap_lo = abs(parameters_after(shapes, at(lo), measure) - budget)
    gap_hi = abs(parameters_after(shapes, at(hi), measure) - budget)
    return at(lo) if gap_lo < gap_hi else at(hi)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("measure", ["stored", "factor"])
def test_budget_selections_equal_the_plain_rule(seed, measure):
    from bsi.method.schedule import LayerShape, global_to_budget, mass_to_budget

    generator = torch.Generator().manual_seed(seed)
    shapes, importance, pools = {}, {}, {}
    for i, (d_in, d_out) in enumerate([(24, 24), (24, 8), (8, 24), (40, 16), (16, 16)]):
        r = min(d_in, d_out)
        n = f"layer{i}"
        shapes[n] = LayerShape(d_in, d_out, r, aux_rank=seed % 2, bias=bool(i % 2))
        values = torch.randn(r, generator=generator) ** 3
        values[torch.rand(r, generator=generator) < 0.1] = 0.0  # ties
        importance[n] = values
        pools[n] = torch.nonzero(torch.rand(r, generator=generator) < 0.7).flatten() if i != 4 else torch.arange(0)
    full = sum(s.cost(s.rank, measure) for s in shapes.values())
    caps = {n: max(1, pools[n].numel() // 3) for n in pools} if seed % 3 == 0 else None
    for share in (0.98, 0.8, 0.6, 0.4, 0.1):
        budget = round(share * full)
        for fast, plain in ((mass_to_budget, _plain_mass_to_budget), (global_to_budget, _plain_global_to_budget)):
            got = fast(shapes, importance, pools, budget, measure, caps)
            want = plain(shapes, importance, pools, budget, measure, caps)
            assert set(got) == set(want)
            assert all(torch.equal(got[n], want[n]) for n in want), (fast.__name__, share)
