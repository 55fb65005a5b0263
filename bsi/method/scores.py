"""The method's math as small pure functions and callables on tensors (no model, no state).

Notation: a layer's active bases have coefficients ``sigma`` (r,), the loss
gradient ``g = E[dl/dsigma]`` (r,) and a curvature estimate
``h ~= E[d2l/dsigma^2]`` (r,) (the Hessian diagonal or a stand-in for it, see
:mod:`bsi.method.curvature`). Every function here can be tested with
hand-made vectors, and the notebooks call them directly.

Scores are small callables (:class:`Score`) that say what they need, so the
engine estimates only that: ``basel`` needs neither gradient nor curvature,
``bsi-grad`` the gradient only, ``bsi`` both. Each score also exposes its
*terms*, the parts it adds up, which the dashboard's Inspect tab shows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from bsi.config import SCORES as SCORE_NAMES
from bsi.errors import BSIError

#: Fraction (mantissa) bits of each floating-point format.
FRACTION_BITS = {torch.float32: 23, torch.bfloat16: 7, torch.float16: 10, torch.float64: 52}


# ----------------------------------------------------------------- importance
@dataclass(frozen=True)
class Score:
    """An importance score: the predicted cost of dropping each basis (large = keep).

    Dropping basis ``i`` moves ``sigma_i`` by ``-sigma_i``. A second-order
    Taylor expansion of the loss gives its predicted increase::

        bsi:       I_i = -sigma_i * g_i + 1/2 * sigma_i^2 * h_i
        bsi-grad:  I_i = -sigma_i * g_i                  (first-order term only)
        basel:     I_i = |sigma_i|                       (magnitude after re-learning)

    The gradient ``g`` is a mean over a few mini-batches. Near a fine-tuned
    minimum its expectation is about zero, so for most bases ``-sigma_i g_i``
    is batch noise, and noise larger than the second-order term: measured on
    the embedded model, half the pool then has negative importance and the
    ranking of two independent halves of the data agrees at Spearman 0.02.
    ``bsi`` therefore keeps the first-order term of a basis only where its
    gradient is distinguishable from that noise, ``|g_i| > z * se_i``, with
    ``se_i`` the standard error from the per-example gradients (see
    :func:`significant_gradient`; ``z = 0`` keeps every term, the method's
    plain estimate). ``bsi-grad`` is the first-order term alone and is never
    tested (nothing would be left to rank).

    Attributes:
        name: the registry name (``--score``).
        needs_gradient: the score reads ``g`` (the engine profiles gradients).
        needs_curvature: the score reads ``h`` (the engine estimates curvature).
        loss_units: the values are predicted loss changes, comparable across
            layers (``basel``'s magnitudes are not).
        tests_gradient: the first-order term of a basis counts only if its
            gradient passes the significance test (when a standard error is given).
    """

    name: str
    needs_gradient: bool
    needs_curvature: bool
    loss_units: bool
    description: str
    tests_gradient: bool = False  # the first-order term is kept only where significant (given se and z > 0)

    def terms(self, sigma: torch.Tensor, grad: torch.Tensor | None = None,
              curvature: torch.Tensor | None = None, *, grad_se: torch.Tensor | None = None,
              gradient_z: float = 0.0) -> dict[str, torch.Tensor]:
        """The named parts of the score, each (r,) float32; the score is their sum.

        ``grad_se`` (r,) is the standard error of ``grad``; with ``gradient_z > 0``
        a ``tests_gradient`` score keeps only the significant first-order terms.
        """
        sigma = sigma.detach().float()
        if self.needs_gradient and grad is None or self.needs_curvature and curvature is None:
            raise BSIError(f"score '{self.name}' needs the gradient{' and the curvature' if self.needs_curvature else ''}")
        out: dict[str, torch.Tensor] = {}
        if self.needs_gradient:
            assert grad is not None  # checked above
            if self.tests_gradient and grad_se is not None and gradient_z > 0:
                grad = significant_gradient(grad, grad_se, gradient_z)
            out["gradient"] = -sigma * grad.float()  # first-order term
        if self.needs_curvature:
            assert curvature is not None  # checked above
            out["curvature"] = 0.5 * sigma.square() * curvature.float()  # second-order term
        if not out:
            out["magnitude"] = sigma.abs()
        return out

    def __call__(self, sigma: torch.Tensor, grad: torch.Tensor | None = None,
                 curvature: torch.Tensor | None = None, *, grad_se: torch.Tensor | None = None,
                 gradient_z: float = 0.0) -> torch.Tensor:
        """(r,) float32 importance; bases with small or negative values go first."""
        total = sum(self.terms(sigma, grad, curvature, grad_se=grad_se, gradient_z=gradient_z).values())
        assert isinstance(total, torch.Tensor), "a score has at least one term"
        return total


@dataclass(frozen=True)
class OneTermScore(Score):
    """``bsi`` with one of its two terms left out: a one-change ablation, named as such.

    It measures exactly what ``bsi`` measures (the same batches, per-example
    gradients and curvature, the same z-test on the gradient) and sums the
    other term alone, so that a sweep can say what each term does::

        bsi-curvature:    I_i = 1/2 * sigma_i^2 * h_i    (the gradient term left out)
        bsi-grad-tested:  I_i = -sigma_i * g_i           (where the z-test passes it, else 0;
                                                          the curvature term left out)

    ``bsi-grad`` differs from ``bsi-grad-tested`` in two things: it measures
    no curvature, and its gradient term is never tested.

    Attributes:
        leaves_out: the term ``bsi`` has and this score does not (``gradient`` or ``curvature``).
    """

    leaves_out: str = "gradient"

    def __post_init__(self) -> None:
        if self.leaves_out not in ("gradient", "curvature") or not (self.needs_gradient and self.needs_curvature):
            raise BSIError(f"an ablation of bsi leaves out 'gradient' or 'curvature' and measures both, got "
                           f"leaves_out={self.leaves_out!r}")

    def terms(self, sigma: torch.Tensor, grad: torch.Tensor | None = None,
              curvature: torch.Tensor | None = None, *, grad_se: torch.Tensor | None = None,
              gradient_z: float = 0.0) -> dict[str, torch.Tensor]:
        """``bsi``'s terms (:meth:`Score.terms`) without :attr:`leaves_out`, each (r,) float32."""
        every = super().terms(sigma, grad, curvature, grad_se=grad_se, gradient_z=gradient_z)
        return {name: term for name, term in every.items() if name != self.leaves_out}


#: name -> score. The registry the config, the CLI and the dashboard read.
SCORES: dict[str, Score] = {
    "bsi": Score("bsi", True, True, True, "BSI: first- plus second-order predicted loss increase",
                 tests_gradient=True),
    "bsi-grad": Score("bsi-grad", True, False, True, "BSI without the second-order term"),
    "basel": Score("basel", False, False, False, "Basel: the re-learned |sigma|"),
    "bsi-curvature": OneTermScore("bsi-curvature", True, True, True, "BSI's curvature term alone (an ablation)",
                                  leaves_out="gradient"),
    "bsi-grad-tested": OneTermScore("bsi-grad-tested", True, True, True,
                                    "BSI's gradient term alone, under BSI's z-test (an ablation)",
                                    tests_gradient=True, leaves_out="curvature"),
}
assert tuple(SCORES) == SCORE_NAMES, "bsi.config.SCORES must list the registry's names"


def get_score(name: str) -> Score:
    """The registered score ``name`` (a clear error lists the valid names)."""
    try:
        return SCORES[name]
    except KeyError:
        raise BSIError(f"unknown score '{name}': use one of {', '.join(SCORES)}") from None


def significant_gradient(grad: torch.Tensor, grad_se: torch.Tensor, z: float) -> torch.Tensor:
    """``grad`` where ``|grad| > z * grad_se``, zero elsewhere (a two-sided test per basis).

    ``grad_se`` is the standard error of the mini-batch mean gradient. With
    per-example contributions ``c_b`` (summing to one batch's gradient),
    ``se^2 ~= sum_b c_b^2`` per batch, and a mean over ``K`` batches divides
    the summed variances by ``K^2`` (see
    :class:`bsi.method.layers.SigmaGradientRecorder`). The sum of squares is
    not centred, so the test is slightly conservative where the gradient is
    real. At ``z = 2`` a pure-noise gradient survives about 5% of the time.

    All arguments (r,); returns (r,) float32.
    """
    grad = grad.float()
    return torch.where(grad.abs() > z * grad_se.float(), grad, torch.zeros_like(grad))


def importance_scores(
    sigma: torch.Tensor, grad: torch.Tensor, hessian: torch.Tensor, score: str = "bsi"
) -> torch.Tensor:
    """Predicted loss increase of dropping each basis under score ``score`` (see :class:`Score`).

    Args:
        sigma, grad, hessian: (r,) tensors of the same layer.
        score: one of ``SCORES``.

    Returns:
        (r,) float32 importance. Bases with small or negative values go first.
    """
    return get_score(score)(sigma, grad, hessian)


# ----------------------------------------------------- perturbation intensity
def fraction_bits(dtype: torch.dtype) -> int:
    """Number of fraction bits f of a float format (fp32: 23, bf16: 7, fp16: 10)."""
    if dtype not in FRACTION_BITS:
        raise BSIError(f"no eps rule for dtype {dtype}: use float32, bfloat16 or float16")
    return FRACTION_BITS[dtype]


def eps_rule(sigma_max: float, dtype: torch.dtype, alpha: float = 0.01, eps_max: float = 0.1,
             eps_floor: float = 0.0) -> float:
    """Perturbation intensity for the Hessian estimate: ``min(2^-(f+1) * sigma_max / alpha, eps_max)``, at least ``eps_floor``.

    Adding ``eps`` to a coefficient of size ``sigma_max`` stored with ``f``
    fraction bits rounds it by up to ``2^-(f+1) * sigma_max``. Asking that this
    rounding be at most a fraction ``alpha`` of ``eps`` gives the lower bound;
    ``eps_max`` (< 1) keeps eps small enough that higher-order Taylor terms stay
    negligible. One eps serves every layer, so ``sigma_max`` is the largest
    coefficient over the whole model.

    ``eps_floor`` is bsi's addition to the method's rule: the rule guards the
    rounding of ``sigma + eps`` but not the round-off of the two *gradients*,
    whose difference ``g+ - g- ~ eps * H z`` must stand above it. In fp32 the
    rule gives ~1e-6 for a model whose largest coefficient is ~1 (or ~5e-4 for
    one of ~82), where that round-off swamps the difference; a floor of 1e-4
    keeps it small (see ``docs/curvature.md``). ``eps_floor=0`` is the method's rule.

    Example: fp32 (f=23), sigma_max=82, alpha=0.01 gives eps ~ 4.9e-4; bf16
    (f=7) would need ~32, so it is capped at ``eps_max``.
    """
    if not 0 < alpha:
        raise BSIError(f"eps alpha must be > 0, got {alpha}")
    if not 0 < eps_max < 1:
        raise BSIError(f"eps_max must be in (0, 1), got {eps_max}")
    rule = min(2.0 ** -(fraction_bits(dtype) + 1) * float(sigma_max) / alpha, eps_max)
    return max(rule, min(eps_floor, eps_max))


# -------------------------------------------------------------- Hutchinson
def rademacher(n: int, generator: torch.Generator | None = None,
               device: torch.device | str | None = None) -> torch.Tensor:
    """A vector of n independent +1/-1 entries, each with probability 1/2, (n,) float32."""
    bits = torch.randint(0, 2, (n,), generator=generator, dtype=torch.int8)
    return (bits.float() * 2 - 1).to(device)


def probe_vector(rank: int, pool: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Rademacher probe ``z`` over a layer's active bases, zero outside the candidate pool.

    Args:
        rank: number of active bases r.
        pool: (p,) int64 positions of the candidate pool.

    Returns:
        (r,) float32 with ``z[pool]`` in {-1, +1} and 0 elsewhere.
    """
    z = torch.zeros(rank)
    z[pool] = rademacher(pool.numel(), generator)
    return z


def symmetric_difference_hessian(
    grad_plus: torch.Tensor, grad_minus: torch.Tensor, z: torch.Tensor, eps: float
) -> torch.Tensor:
    """One-probe estimate of the Hessian diagonal from two gradients.

    With ``g+ = dl/dsigma`` at ``sigma + (eps/2) z`` and ``g-`` at
    ``sigma - (eps/2) z`` on the *same* mini-batch, a Taylor expansion gives
    ``g+ - g- = eps * H z + O(eps^3)``, so ``(g+ - g-) * z / eps`` is
    ``z * (H z)``, whose expectation over Rademacher ``z`` is ``diag(H)``
    (because ``E[z_i z_j] = 1`` if ``i = j`` and 0 otherwise). Needs only
    first-order gradients: no double backward, any attention kernel.

    All arguments are (r,); returns (r,) float32, zero where ``z`` is zero.
    """
    return (grad_plus.float() - grad_minus.float()) * z.float() / eps


# ------------------------------------------------------------ candidate pool
def candidate_pool(sigma: torch.Tensor, rho: float) -> torch.Tensor:
    """Positions of the bases that may be pruned this round.

    ``K`` is the smallest set of largest-``|sigma|`` bases whose summed
    ``|sigma|`` reaches ``rho`` times the layer's total; the pool is everything
    else. Large bases are thus protected without spending Hessian probes on
    them. ``rho = KeepRatio ** (gamma / T)``: a larger ``gamma`` gives a smaller
    ``rho`` and so a larger pool.

    Args:
        sigma: (r,) coefficients of the active bases.
        rho: in [0, 1]; 1 protects (almost) everything, 0 pools everything.

    Returns:
        (p,) int64 positions, sorted ascending.
    """
    magnitude = sigma.detach().float().abs()
    order = torch.argsort(magnitude, descending=True)  # (r,)
    mass = torch.cumsum(magnitude[order], dim=0)  # (r,)
    total = mass[-1] if mass.numel() else torch.tensor(0.0)
    if total <= 0:
        return torch.arange(sigma.numel())
    # number of protected bases: first index where the running mass reaches rho * total
    protected = int(torch.searchsorted(mass, rho * total * (1 - 1e-7)).item()) + 1
    protected = min(protected, sigma.numel()) if rho > 0 else 0
    return order[protected:].sort().values


def pool_rho(keep_ratio: float, gamma: float, rounds: int) -> float:
    """``rho = KeepRatio ** (gamma / T)``: the sigma-mass share protected from pruning."""
    rho: float = keep_ratio ** (gamma / rounds)  # float ** float is typed Any (it is complex for a negative base)
    return rho


# ------------------------------------------------------------------- pruning
def mass_rule_keep_count(importance: torch.Tensor, keep_fraction: float) -> int:
    """How many of a pool's bases (taken in descending importance) to keep.

    The paper's rule: keep the fewest, most important bases whose summed
    importance reaches ``keep_fraction`` times the pool's total *positive*
    importance; bases with negative importance (removing them is predicted to
    *lower* the loss) are therefore always pruned, and if no importance is
    positive the whole pool goes.

    For ``keep_fraction`` in (1, 2] (used only by target-size mode) the rule is
    extended monotonically: all positive bases are kept plus a share
    ``keep_fraction - 1`` of the negative ones, least negative first, so that
    ``keep_fraction = 2`` keeps the whole pool.
    """
    values = importance.detach().float().sort(descending=True).values  # (p,)
    positive = values.clamp(min=0)
    n_positive = int((values > 0).sum())
    if keep_fraction > 1:
        n_rest = values.numel() - n_positive
        return n_positive + math.ceil(min(keep_fraction - 1, 1.0) * n_rest - 1e-9)
    total = positive.sum()
    if total <= 0 or keep_fraction <= 0:
        return 0
    reached = torch.cumsum(positive, dim=0) >= keep_fraction * total * (1 - 1e-6)
    return int(torch.nonzero(reached)[0].item()) + 1


def select_pruned(importance: torch.Tensor, pool: torch.Tensor, keep_fraction: float) -> torch.Tensor:
    """Positions (subset of ``pool``) pruned by the importance-mass rule.

    Args:
        importance: (r,) importance of every active basis of the layer.
        pool: (p,) int64 candidate positions; only these can be pruned.
        keep_fraction: ``KeepRatio ** (1/T)`` in the paper's schedule.

    Returns:
        (q,) int64 positions, sorted ascending.
    """
    if pool.numel() == 0:
        return pool.clone()
    pool_importance = importance[pool]  # (p,)
    keep = mass_rule_keep_count(pool_importance, keep_fraction)
    order = torch.argsort(pool_importance, descending=True, stable=True)  # (p,)
    return pool[order[keep:]].sort().values


def kept_positions(rank: int, pruned: torch.Tensor) -> torch.Tensor:
    """Complement of ``pruned`` within ``range(rank)``, (r - q,) int64 ascending."""
    mask = torch.ones(rank, dtype=torch.bool)
    mask[pruned] = False
    return torch.nonzero(mask).flatten()
