"""The method's theory results as calculators: the variance and sample complexity of the Hessian estimator.

Everything here is a small pure function of numbers or tensors: no model.
Notation: ``H`` is the (n x n) Hessian of the loss over the probed
coefficients sigma, ``lambda_1`` its eigenvalue of largest magnitude, ``s`` the
number of Rademacher probes averaged by the Hutchinson estimator
``D_s(H) = (1/s) sum_t z_t * (H z_t)``, whose expectation is ``diag(H)``.

* **Variance.** For Rademacher probes the variance of entry ``i`` of one probe
  is ``sum_{j != i} H_ij^2``, so the total variance of ``D_s`` is
  ``(||H||_F^2 - ||diag H||^2) / s`` (:func:`hutchinson_variance`). That is at
  most ``||H||_F^2 / s`` for any matrix (:func:`variance_bound_frobenius`), and
  under a power-law spectrum ``|lambda_k| <= |lambda_1| k^-a`` with ``a > 1/2``
  at most ``|lambda_1|^2 zeta(2a) / s`` (:func:`variance_bound_power_law`),
  which does not grow with ``n``.
* **Sample complexity.** Probes enough for
  ``P(||D_s - diag H|| <= e ||diag H||) >= 1 - delta``:
  :func:`sample_complexity` (general) and :func:`sample_complexity_psd`;
  :func:`probes_needed` evaluates the bound from a *measured* spectrum.
* **Loss change.** How far the true loss change of pruning one basis can be
  from the importance score: :func:`loss_change_bound` and, with an estimated
  Hessian diagonal of relative error ``e``, :func:`loss_change_bound_estimated`.
* **Perturbation intensity.** :func:`eps_rule` (the same function as
  :func:`bsi.method.scores.eps_rule`, re-exported here so that all the method's
  formulas sit in one place).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar

import numpy as np
import torch

from bsi.errors import BSIError
from bsi.method.scores import eps_rule

__all__ = [
    "eps_rule", "generalized_harmonic", "hutchinson_variance", "loss_change_bound", "loss_change_bound_estimated",
    "probes_needed", "relative_error_by_probes", "sample_complexity", "sample_complexity_psd",
    "variance_bound_frobenius", "variance_bound_power_law", "zeta",
]

#: What the loss-change bounds work on, elementwise: plain numbers, or tensors of one shape.
_Values = TypeVar("_Values", float, torch.Tensor)


# ------------------------------------------------------------ special sums
def zeta(p: float, terms: int = 64) -> float:
    """Riemann zeta ``zeta(p) = sum_{k>=1} k^-p`` for real ``p > 1`` (no scipy needed).

    Sums the first ``terms - 1`` terms exactly and replaces the tail
    ``sum_{k>=N} k^-p`` by its Euler-Maclaurin expansion
    ``N^(1-p)/(p-1) + N^-p/2 + p N^(-p-1)/12 - p(p+1)(p+2) N^(-p-3)/720``,
    accurate to about 1e-12 relative with the default ``N = 64`` (even for p
    close to 1, where the plain truncated sum would need millions of terms).

    >>> round(zeta(2.0), 10) == round(math.pi ** 2 / 6, 10)
    True
    """
    if not p > 1:
        raise BSIError(f"zeta(p) diverges for p <= 1, got p={p} (a power-law exponent must exceed 1/2)")
    n = int(terms)
    head = math.fsum(k ** -p for k in range(1, n))
    # int ** float is typed Any (it would be complex for a negative base; n >= 1 here)
    tail: float = (n ** (1 - p) / (p - 1) + 0.5 * n ** -p + p * n ** (-p - 1) / 12
                   - p * (p + 1) * (p + 2) * n ** (-p - 3) / 720)
    return head + tail


def generalized_harmonic(n: int, p: float) -> float:
    """``H_{n,p} = sum_{k=1..n} k^-p`` (exact float64 sum; any real ``p``).

    For ``p > 1`` it increases to :func:`zeta` ``(p)`` as ``n`` grows.
    """
    if n < 1:
        raise BSIError(f"n must be >= 1, got {n}")
    k = np.arange(1, int(n) + 1, dtype=np.float64)
    return float(np.sum(np.sort(k ** -float(p))))  # smallest first: least rounding


# ---------------------------------------------------------------- variance
def hutchinson_variance(hessian: torch.Tensor, probes: int = 1) -> float:
    """Exact total variance ``sum_i Var(D_s(H)_i)`` of the Rademacher estimator.

    Entry ``i`` of one probe is ``z_i (H z)_i = H_ii + sum_{j != i} H_ij z_i z_j``;
    the products ``z_i z_j`` are independent +-1 signs, so its variance is
    ``sum_{j != i} H_ij^2``. Averaging ``s`` probes divides by ``s``.

    Args:
        hessian: (n, n) matrix (need not be symmetric).
        probes: s >= 1.
    """
    _check_probes(probes)
    h = hessian.double()
    return float((h.square().sum() - torch.diagonal(h).square().sum()) / probes)


def variance_bound_frobenius(hessian_or_frobenius_sq: torch.Tensor | float, probes: int = 1) -> float:
    """``||H||_F^2 / s``: a bound on the total variance valid for any matrix.

    Pass the (n, n) Hessian or directly ``||H||_F^2`` (for a symmetric H, the
    sum of its squared eigenvalues).
    """
    _check_probes(probes)
    if isinstance(hessian_or_frobenius_sq, torch.Tensor) and hessian_or_frobenius_sq.dim() == 2:
        frobenius_sq = float(hessian_or_frobenius_sq.double().square().sum())
    else:
        frobenius_sq = float(hessian_or_frobenius_sq)
    return frobenius_sq / probes


def variance_bound_power_law(lambda_1: float, alpha: float, probes: int = 1) -> float:
    """``|lambda_1|^2 zeta(2 alpha) / s``: the variance bound under a power-law spectrum.

    If ``|lambda_k| <= |lambda_1| k^-alpha`` with ``alpha > 1/2``, then
    ``||H||_F^2 = sum_k lambda_k^2 <= |lambda_1|^2 sum_k k^(-2 alpha) <=
    |lambda_1|^2 zeta(2 alpha)``: the bound does not depend on how many sigmas
    are probed.
    """
    _check_probes(probes)
    return float(lambda_1) ** 2 * zeta(2 * alpha) / probes


# ------------------------------------------------------- sample complexity
def sample_complexity(lambda_1: float, alpha: float, trace: float, n: int, error: float, delta: float) -> float:
    """Probes ``s`` beyond which ``||D_s - diag H|| <= e ||diag H||`` with probability ``1 - delta``.

    ``s > 2 (|lambda_1|^2 H_{n,2a} / (Tr(H)^2 / n) - 1) ln(2n / delta) / e^2``
    for a Hessian whose spectrum lies under ``|lambda_1| k^-a``. The ratio
    compares the spectrum's energy (at most ``|lambda_1|^2 H_{n,2a}``) with the
    smallest possible ``||diag H||^2`` (``Tr(H)^2 / n``, by Cauchy-Schwarz):
    a Hessian whose diagonal is small compared to its off-diagonal mass needs
    many probes. Returns the threshold (a float); ``inf`` if ``Tr(H) = 0``.
    """
    _check_error_delta(error, delta, n)
    if trace == 0:
        return math.inf
    ratio = float(lambda_1) ** 2 * generalized_harmonic(n, 2 * alpha) / (float(trace) ** 2 / n)
    return 2 * (ratio - 1) * math.log(2 * n / delta) / error**2


def sample_complexity_psd(n: int, alpha: float, error: float, delta: float) -> float:
    """The same threshold when H is positive semidefinite: ``2 (n zeta(2a) - 1) ln(2n/delta) / e^2``.

    No spectrum scale is needed: for a PSD matrix ``Tr(H) >= |lambda_1|``.
    """
    _check_error_delta(error, delta, n)
    return 2 * (n * zeta(2 * alpha) - 1) * math.log(2 * n / delta) / error**2


def probes_needed(
    eigenvalues: Sequence[float] | torch.Tensor, error: float = 0.1, delta: float = 0.1, alpha: float | None = None
) -> float:
    """Probes for relative error ``error`` with probability ``1 - delta``, from a measured spectrum.

    Args:
        eigenvalues: the (n,) eigenvalues of a layer's Hessian block (any order, signed).
        error, delta: the (e, delta) guarantee.
        alpha: if given, the power-law form of :func:`sample_complexity`
            (``|lambda_1|^2 H_{n,2a}`` for the spectrum's energy); if None, the
            measured energy ``sum_k lambda_k^2`` is used instead (tighter, no
            power-law assumption):
            ``s > 2 (n sum_k lambda_k^2 / Tr(H)^2 - 1) ln(2n/delta) / e^2``.

    Returns:
        The smallest whole number of probes satisfying the bound (at least 1),
        or ``inf`` when the trace is zero (the relative guarantee is then void).
    """
    lam = torch.as_tensor(eigenvalues, dtype=torch.float64).flatten()
    n = lam.numel()
    _check_error_delta(error, delta, n)
    trace = float(lam.sum())
    if trace == 0:
        return math.inf
    if alpha is not None:
        threshold = sample_complexity(float(lam.abs().max()), alpha, trace, n, error, delta)
    else:
        ratio = n * float(lam.square().sum()) / trace**2
        threshold = 2 * (ratio - 1) * math.log(2 * n / delta) / error**2
    return max(1, math.floor(threshold) + 1)


def relative_error_by_probes(estimates: torch.Tensor, exact: torch.Tensor, probes: Sequence[int]) -> dict[int, float]:
    """Mean relative error ``||mean of s single-probe estimates - exact|| / ||exact||`` for each ``s``.

    Args:
        estimates: (P, n) independent single-probe estimates of ``exact``.
        exact: (n,) the true Hessian diagonal.
        probes: the ``s`` values to evaluate; each must divide into P (the P
            estimates are split into ``P // s`` disjoint groups of ``s``, and the
            group errors are averaged, so every estimate is used once).

    For an unbiased estimator the error falls as ``1 / sqrt(s)``.
    """
    total, n = estimates.shape
    reference = exact.double().norm()
    out: dict[int, float] = {}
    for s in probes:
        if not 1 <= s <= total:
            raise BSIError(f"probes {s} must be between 1 and the {total} estimates available")
        groups = estimates[: (total // s) * s].double().reshape(total // s, s, n).mean(dim=1)  # (G, n)
        out[int(s)] = float(((groups - exact.double()).norm(dim=1) / reference).mean())
    return out


# -------------------------------------------------------------- loss change
def loss_change_bound(grad: _Values, hessian_diag: _Values, step: _Values, rho: float) -> _Values:
    """Bound on ``|dl|`` when coefficient ``i`` moves by ``step`` (pruning: ``step = sigma_i``).

    ``|dl| <= | -g_i s_i + 1/2 H_ii s_i^2 | + rho/6 |s_i|^3`` if the Hessian is
    ``rho``-Lipschitz: the first term is the importance score itself, the
    second the Taylor remainder. Works elementwise on floats or tensors.
    """
    if rho < 0:
        raise BSIError(f"the Lipschitz constant rho must be >= 0, got {rho}")
    return abs(-grad * step + 0.5 * hessian_diag * step**2) + rho / 6 * abs(step) ** 3


def loss_change_bound_estimated(grad: _Values, hessian_estimate: _Values, step: _Values, rho: float,
                                error: float) -> _Values:
    """:func:`loss_change_bound` with an *estimated* diagonal ``H^_ii`` of relative error ``e < 1``.

    ``|H_ii - H^_ii| <= e |H_ii|`` implies ``|H_ii| <= |H^_ii| / (1 - e)`` and
    so ``|H_ii - H^_ii| <= e/(1-e) |H^_ii|``: the bound gains
    ``e / (2 (1 - e)) |H^_ii| s_i^2``.
    """
    if not 0 <= error < 1:
        raise BSIError(f"relative error must be in [0, 1), got {error}")
    extra = error / (2 * (1 - error)) * abs(hessian_estimate) * step**2
    return loss_change_bound(grad, hessian_estimate, step, rho) + extra


# ------------------------------------------------------------------ checks
def _check_probes(probes: int) -> None:
    if probes < 1:
        raise BSIError(f"probes must be >= 1, got {probes}")


def _check_error_delta(error: float, delta: float, n: int) -> None:
    if not error > 0:
        raise BSIError(f"relative error must be > 0, got {error}")
    if not 0 < delta < 1:
        raise BSIError(f"delta must be in (0, 1), got {delta}")
    if n < 1:
        raise BSIError(f"the spectrum must have at least one eigenvalue, got n={n}")
