"""Gradients and curvature estimates with respect to the coefficients sigma.

One *profiling step* takes one mini-batch and returns, for every layer,
``grad`` = dl/dsigma at the current sigma (r,) and ``curvature``, an estimate
of the Hessian diagonal d2l/dsigma^2 over the layer's candidate pool (r,),
zero outside it; or ``None`` when a loss or gradient it computed was not
finite (the caller skips such a batch). What is computed depends on the score
(:class:`bsi.method.scores.Score`): nothing for ``basel``, the gradient for
``bsi-grad``, both for ``bsi``.

Three curvature sources (``CompressConfig.curvature``):

* ``hutchinson``, the method's estimator. With a Rademacher probe ``z`` and the
  *same* batch, ``g+ - g- = eps H z + O(eps^3)`` for gradients at
  ``sigma +- (eps/2) z``, so ``z * (g+ - g-) / eps`` has expectation
  ``diag(H)``. Unbiased, but its variance is the sum of the squared
  off-diagonal Hessian entries that ``z`` mixes in: with thousands of bases per
  layer and one probe per batch, the estimate of one basis is mostly noise.
  ``scope="layer"`` probes each layer alone (the paper's pseudo-code: 1 + 2L
  gradient passes, each stopping at its layer); ``scope="model"`` probes all
  layers jointly (3 passes, more cross-layer noise). ``method="hvp"`` gets
  ``H z`` exactly by double backward instead of finite differences.
* ``fisher`` (an extension beyond the method): the empirical Fisher diagonal
  from *per-example* gradients, ``F_ii = N * sum_b g_{b,i}^2`` for a loss
  averaged over ``N`` tokens and per-example gradients ``g_b`` of that mean.
  The per-example gradients come from the same backward pass as the gradient
  (:class:`~bsi.method.layers.SigmaGradientRecorder`), so it costs nothing
  extra; it is positive, and its noise is that of averaging over examples,
  not over probes.
* ``mc-fisher`` (an extension too): the same with labels drawn from the model's
  own predictions, one more backward pass. Its expectation is the Gauss-Newton
  diagonal, which is positive and close to the Hessian near a fine-tuned
  minimum.

The model is put in eval mode (dropout off) so that every pass of a step sees
the same network function, and restored afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn
from torch.autograd import forward_ad

from bsi.errors import BSIError
from bsi.method.layers import BasisLinear, SigmaGradientRecorder
from bsi.method.scores import probe_vector, symmetric_difference_hessian

Batch = dict[str, torch.Tensor]  # a mini-batch: input_ids, attention_mask, labels, ... (what a loss reads)
LossFn = Callable[[nn.Module, Batch], torch.Tensor]


@dataclass
class ProfileResult:
    """Per-layer statistics from one profiling mini-batch."""

    loss: float
    grads: list[torch.Tensor] | None  # each (r_l,) float32 on the layer's device; None if not measured
    #: each (r_l,) float32; zero outside the pool unless the source ``measures_every_basis``; None if not measured
    curvatures: list[torch.Tensor] | None
    #: each (r_l,) float32: sum over the batch's examples of their gradient contribution squared, the
    #: variance of ``grads`` (see :class:`~bsi.method.layers.SigmaGradientRecorder`); None if not measured
    grad_squares: list[torch.Tensor] | None = None

    @property
    def hessians(self) -> list[torch.Tensor] | None:
        """The curvature estimates (the name the method gives them when they estimate the Hessian)."""
        return self.curvatures


class CurvatureSource(Protocol):
    """What a profiling step measures and how (:class:`Hutchinson`, :class:`Fisher`, :class:`GradientOnly`, ...).

    ``measures_every_basis``: the curvature comes for every active basis at
    no extra cost (the Fisher's per-example gradients cover them all), not
    only for the candidate pool the probes are spent on. The pool still
    limits what a round may remove; the scores outside it let a whole-model
    cut be planned from one round (:mod:`bsi.analysis.whatif`).
    """

    @property
    def name(self) -> str: ...

    @property
    def measures_every_basis(self) -> bool: ...

    def profile(self, model: nn.Module, layers: Sequence[BasisLinear], pools: Sequence[torch.Tensor], batch: Batch,
                loss_fn: LossFn, generator: torch.Generator | None) -> ProfileResult | None: ...


def _finite(*tensors: torch.Tensor) -> bool:
    if not tensors:
        return True
    return bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all())  # one host sync


@contextmanager
def evaluation_mode(model: nn.Module) -> Iterator[None]:
    """Dropout off inside the block; the previous train/eval mode is restored after."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


@contextmanager
def eager_attention(model: nn.Module) -> Iterator[nn.Module]:
    """Run the block with eager attention: double backward through SDPA or flash kernels fails.

    Uses ``model.set_attn_implementation`` (transformers >= 5); the previous
    implementation is restored afterwards. A model without an attention
    config (a plain ``nn.Module``) is left as it is.
    """
    config = getattr(model, "config", None)
    previous = getattr(config, "_attn_implementation", None)
    if config is None or previous in (None, "eager"):
        yield model
        return
    set_implementation = getattr(model, "set_attn_implementation", None)
    if set_implementation is None:
        raise BSIError(f"cannot switch {type(model).__name__} to eager attention; load it with attn_implementation='eager'")
    set_implementation("eager")
    try:
        yield model
    finally:
        set_implementation(previous)


@contextmanager
def shifted_sigma(layers: Sequence[BasisLinear], deltas: Sequence[torch.Tensor | None]) -> Iterator[None]:
    """Temporarily evaluate at ``sigma + delta`` for each layer (None: unchanged).

    The original values are copied back exactly afterwards (no ``+d -d``
    rounding drift).
    """
    saved = [layer.sigma.data.clone() if d is not None else None for layer, d in zip(layers, deltas)]
    try:
        for layer, delta in zip(layers, deltas):
            if delta is not None:
                layer.sigma.data.add_(delta.to(layer.sigma.device))
        yield
    finally:
        for layer, original in zip(layers, saved):
            if original is not None:
                layer.sigma.data.copy_(original)


def sigma_gradients(
    model: nn.Module, layers: Sequence[BasisLinear], batch: Batch, loss_fn: LossFn
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Loss and dl/dsigma for the given layers only (other parameters get no gradient).

    Uses ``torch.autograd.grad`` so the backward pass stops as soon as every
    requested sigma is reached: asking for one deep layer is cheaper than
    asking for all.
    """
    loss = loss_fn(model, batch)
    found = torch.autograd.grad(loss, [layer.sigma for layer in layers], allow_unused=True)
    grads = [torch.zeros_like(layer.sigma) if g is None else g.float() for layer, g in zip(layers, found)]
    return loss.detach(), grads


def hessian_vector_product(
    model: nn.Module, layers: Sequence[BasisLinear], batch: Batch, loss_fn: LossFn, vectors: Sequence[torch.Tensor]
) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """Exact ``H v`` in sigma-space by double backward; returns (loss, grads, Hv per layer)."""
    sigmas = [layer.sigma for layer in layers]
    loss = loss_fn(model, batch)
    first = torch.autograd.grad(loss, sigmas, create_graph=True, allow_unused=True)
    grads = [torch.zeros_like(s) if g is None else g for s, g in zip(sigmas, first)]
    dot = sum((g * v.to(g.device)).sum() for g, v in zip(grads, vectors))
    assert isinstance(dot, torch.Tensor), "a Hessian-vector product needs at least one layer"
    second = torch.autograd.grad(dot, sigmas, allow_unused=True)
    hv = [torch.zeros_like(s) if h is None else h.detach().float() for s, h in zip(sigmas, second)]
    return loss.detach(), [g.detach().float() for g in grads], hv


def exact_hessian(model: nn.Module, layer: BasisLinear, batch: Batch, loss_fn: LossFn,
                  positions: torch.Tensor) -> torch.Tensor:
    """The exact (k, k) Hessian of the loss over the sigmas at ``positions`` of one layer, float64.

    One forward and one ``create_graph`` backward, then one second-order
    backward per column (``H e_j``); symmetrised (``(H + H^T)/2``) to remove
    round-off asymmetry. Needs a differentiable attention kernel (eager).
    The ground truth that the estimators, the spectra and the notebooks are
    checked against.
    """
    positions = torch.as_tensor(positions, dtype=torch.long)
    with evaluation_mode(model), eager_attention(model):
        loss = loss_fn(model, batch)
        (grad,) = torch.autograd.grad(loss, [layer.sigma], create_graph=True)
        columns = []
        for j in positions.tolist():
            (column,) = torch.autograd.grad(grad[j], [layer.sigma], retain_graph=True)
            columns.append(column.detach()[positions.to(column.device)].double().cpu())  # (k,)
    hessian = torch.stack(columns, dim=1)  # (k, k)
    return 0.5 * (hessian + hessian.T)


def exact_hessian_diagonal(model: nn.Module, layers: Sequence[BasisLinear], positions: Sequence[torch.Tensor],
                           batch: Batch, loss_fn: LossFn) -> list[torch.Tensor]:
    """The exact Hessian diagonal ``d2 l / d sigma_i^2`` at ``positions`` (k_l,) of each layer, float64.

    One forward and one ``create_graph`` backward for all the layers, then
    one second-order backward per coefficient (the ``i``-th entry of
    ``H e_i``). The ground truth the curvature sources are measured against
    when a whole Hessian (:func:`exact_hessian`) is too large.
    """
    with evaluation_mode(model), eager_attention(model):
        loss = loss_fn(model, batch)
        grads = torch.autograd.grad(loss, [layer.sigma for layer in layers], create_graph=True)
        out = []
        for layer, grad, pos in zip(layers, grads, positions):
            values = [torch.autograd.grad(grad[j], [layer.sigma], retain_graph=True)[0][j].detach()
                      for j in torch.as_tensor(pos).tolist()]
            out.append(torch.stack(values).double().cpu() if values else torch.zeros(0, dtype=torch.float64))
    return out


@contextmanager
def dual_sigma(layer: BasisLinear, tangent: torch.Tensor) -> Iterator[None]:
    """Inside a ``forward_ad.dual_level``: the layer's sigma carries ``tangent`` (r,) as its forward derivative."""
    parameter = layer._parameters.pop("sigma")
    assert parameter is not None, "a BasisLinear layer's sigma is a parameter"
    try:
        # a plain attribute inside (torch leaves make_dual unannotated)
        layer.sigma = forward_ad.make_dual(parameter.detach(), tangent.to(parameter))  # type: ignore[no-untyped-call]
        yield
    finally:
        del layer.sigma
        layer.register_parameter("sigma", parameter)


def exact_gauss_newton_diagonal(model: nn.Module, layers: Sequence[BasisLinear], positions: Sequence[torch.Tensor],
                                batch: Batch, logits_fn: Callable[[nn.Module, Batch], torch.Tensor]
                                ) -> list[torch.Tensor]:
    """The exact Gauss-Newton diagonal of a mean cross-entropy at ``positions`` (k_l,) of each layer, float64.

    ``logits_fn(model, batch)`` gives the ``(N, V)`` logits the loss averages
    its ``N`` cross-entropy terms over. With ``p_t = softmax(z_t)`` and the
    forward-mode derivative ``J_t = d z_t / d sigma_i`` (V,), one pass per
    coefficient::

        G_ii = (1/N) sum_t [ sum_k p_tk J_tk^2 - (sum_k p_tk J_tk)^2 ]

    the Hessian of the cross-entropy in the logits, ``diag(p) - p p^T``, seen
    through the network's Jacobian. It is non-negative, it is what
    ``mc-fisher`` estimates without bias, and it equals the Hessian diagonal
    wherever the logits are linear in ``sigma_i`` (the output layer).
    """
    out = []
    with evaluation_mode(model), eager_attention(model), torch.no_grad():
        probs = torch.softmax(logits_fn(model, batch).double(), dim=-1)  # (N, V)
        count = probs.shape[0]
        for layer, pos in zip(layers, positions):
            values = []
            for j in torch.as_tensor(pos).tolist():
                tangent = torch.zeros_like(layer.sigma)  # (r,)
                tangent[j] = 1.0
                with forward_ad.dual_level(), dual_sigma(layer, tangent):
                    jac = forward_ad.unpack_dual(  # type: ignore[no-untyped-call]  # unannotated, as make_dual
                        logits_fn(model, batch)).tangent.double()  # (N, V)
                mean = (probs * jac).sum(dim=-1)  # (N,)
                values.append(((probs * jac.square()).sum(dim=-1) - mean.square()).sum() / count)
            out.append(torch.stack(values).cpu() if values else torch.zeros(0, dtype=torch.float64))
    return out


# ------------------------------------------------------------------ sources
def inside_pool(values: torch.Tensor, pool: torch.Tensor) -> torch.Tensor:
    """``values`` (r,) at the pool's positions (p,), zero elsewhere: curvature is estimated for the pool only."""
    mask = torch.zeros_like(values)
    mask[pool.to(values.device)] = 1.0
    return values * mask


def loss_count(loss_fn: LossFn, batch: Batch) -> int:
    """How many terms the loss averages over on ``batch`` (tokens), from ``loss_fn.count``."""
    count = getattr(loss_fn, "count", None)
    if count is None:
        raise BSIError("the fisher curvature needs a loss that can count its terms (loss.count(batch)); "
                       "use bsi.pipeline.losses.AnswerTokenLoss or choose --curvature hutchinson")
    return int(count(batch))


@dataclass(frozen=True)
class Hutchinson:
    """The method's estimator: symmetric perturbations (``fd``) or exact products (``hvp``) with Rademacher probes."""

    eps: float
    scope: str = "model"
    method: str = "fd"
    probes: int = 1
    center: str = "exact"
    name: str = "hutchinson"
    measures_every_basis: bool = False  # probes are spent on the pool only

    def profile(self, model: nn.Module, layers: Sequence[BasisLinear], pools: Sequence[torch.Tensor], batch: Batch,
                loss_fn: LossFn, generator: torch.Generator | None) -> ProfileResult | None:
        if self.method == "hvp":
            with eager_attention(model):
                return _profile_hvp(model, layers, pools, batch, loss_fn, self.scope, self.probes, generator)
        if self.center == "average" and self.scope == "model":
            return _profile_fd_averaged_center(model, layers, pools, batch, loss_fn, self.eps, self.probes, generator)
        with SigmaGradientRecorder().attach(list(layers)) as recorder:
            loss, grads = sigma_gradients(model, layers, batch, loss_fn)
            grad_squares = [recorder.squares(layer).clone() for layer in layers]
        if not _finite(loss, *grads):
            return None
        curvatures = [torch.zeros_like(g) for g in grads]
        for _ in range(self.probes):
            if self.scope == "model":
                zs = [probe_vector(layer.rank, pool, generator).to(layer.sigma.device)
                      for layer, pool in zip(layers, pools)]
                est = _fd_joint(model, layers, batch, loss_fn, zs, self.eps)
                if est is None:
                    return None
                for h, e in zip(curvatures, est):
                    h.add_(e / self.probes)
            else:
                for i, (layer, pool) in enumerate(zip(layers, pools)):
                    if pool.numel() == 0:
                        continue
                    z = probe_vector(layer.rank, pool, generator).to(layer.sigma.device)
                    est = _fd_joint(model, [layer], batch, loss_fn, [z], self.eps)
                    if est is None:
                        return None
                    curvatures[i].add_(est[0] / self.probes)
        return ProfileResult(float(loss), grads, curvatures, grad_squares)


@dataclass(frozen=True)
class Fisher:
    """Fisher diagonal from per-example gradients: true labels (``sampled=False``) or the model's own (``True``)."""

    sampled: bool = False
    measures_every_basis: bool = True  # per-example gradients exist for every basis: no reason to mask them

    @property
    def name(self) -> str:
        return "mc-fisher" if self.sampled else "fisher"

    def profile(self, model: nn.Module, layers: Sequence[BasisLinear], pools: Sequence[torch.Tensor], batch: Batch,
                loss_fn: LossFn, generator: torch.Generator | None) -> ProfileResult | None:
        with SigmaGradientRecorder().attach(list(layers)) as recorder:
            loss, grads = sigma_gradients(model, layers, batch, loss_fn)  # true labels
            grad_squares = [recorder.squares(layer).clone() for layer in layers]  # (r,) each
        if not _finite(loss, *grads):
            return None
        count = loss_count(loss_fn, batch)
        if self.sampled:
            sampled = getattr(loss_fn, "sampled", None)
            if sampled is None:
                raise BSIError("the mc-fisher curvature needs a loss with labels drawn from the model "
                               "(loss.sampled(model, batch, generator)); use bsi.pipeline.losses.AnswerTokenLoss")
            with SigmaGradientRecorder().attach(list(layers)) as recorder:
                mc_loss = sampled(model, batch, generator)
                torch.autograd.grad(mc_loss, [layer.sigma for layer in layers], allow_unused=True)
                squares = [recorder.squares(layer) for layer in layers]
        else:
            squares = grad_squares
        curvatures = [square * count for square in squares]  # N * sum_b g_b^2, every basis (the pool limits the cut)
        if not self.measures_every_basis:  # as the pool-only sources report it
            curvatures = [inside_pool(c, pool) for c, pool in zip(curvatures, pools)]
        if not _finite(*curvatures):
            return None
        return ProfileResult(float(loss), grads, curvatures, grad_squares)


@dataclass(frozen=True)
class GradientOnly:
    """The gradient alone (for scores without a curvature term)."""

    name: str = "gradient"
    measures_every_basis: bool = False  # no curvature at all

    def profile(self, model: nn.Module, layers: Sequence[BasisLinear], pools: Sequence[torch.Tensor], batch: Batch,
                loss_fn: LossFn, generator: torch.Generator | None) -> ProfileResult | None:
        loss, grads = sigma_gradients(model, layers, batch, loss_fn)
        if not _finite(loss, *grads):
            return None
        return ProfileResult(float(loss), grads, None)


@dataclass(frozen=True)
class NothingToMeasure:
    """For scores that read only sigma (basel): a profiling step measures nothing and costs nothing."""

    name: str = "none"
    measures_every_basis: bool = False

    def profile(self, model: nn.Module, layers: Sequence[BasisLinear], pools: Sequence[torch.Tensor], batch: Batch,
                loss_fn: LossFn, generator: torch.Generator | None) -> ProfileResult | None:
        return ProfileResult(float("nan"), None, None)


def curvature_source(name: str, *, eps: float, scope: str = "model", method: str = "fd", probes: int = 1,
                     center: str = "exact") -> Hutchinson | Fisher:
    """The curvature source called ``name`` (``fisher``, ``mc-fisher`` or ``hutchinson``)."""
    if name == "hutchinson":
        return Hutchinson(eps=eps, scope=scope, method=method, probes=probes, center=center)
    if name in ("fisher", "mc-fisher"):
        return Fisher(sampled=name == "mc-fisher")
    raise BSIError(f"unknown curvature source '{name}': use fisher, mc-fisher or hutchinson")


def profile_batch(
    model: nn.Module,
    layers: Sequence[BasisLinear],
    pools: Sequence[torch.Tensor],
    batch: Batch,
    loss_fn: LossFn,
    *,
    eps: float = 1e-3,
    scope: str = "model",
    method: str = "fd",
    probes: int = 1,
    generator: torch.Generator | None = None,
    center: str = "exact",
    source: CurvatureSource | None = None,
) -> ProfileResult | None:
    """Gradient and curvature estimate for every layer on one mini-batch.

    Args:
        layers: the `BasisLinear` layers, in a fixed order.
        pools: per layer, (p_l,) int64 candidate-pool positions; curvature is zero elsewhere.
        source: a curvature source (:func:`curvature_source`, :class:`GradientOnly`,
            :class:`NothingToMeasure`); default: :class:`Hutchinson` with the
            ``eps``, ``scope``, ``method``, ``probes`` and ``center`` given.

    Returns:
        A :class:`ProfileResult`, or None if a non-finite value appeared anywhere.
    """
    if source is None:
        source = Hutchinson(eps=eps, scope=scope, method=method, probes=probes, center=center)
    with evaluation_mode(model):
        return source.profile(model, layers, pools, batch, loss_fn, generator)


def _fd_pair(
    model: nn.Module, layers: Sequence[BasisLinear], batch: Batch, loss_fn: LossFn,
    zs: Sequence[torch.Tensor], eps: float,
) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor, list[torch.Tensor]] | None:
    """Losses and gradients at ``sigma + (eps/2) z`` and ``sigma - (eps/2) z``; None if not finite."""
    with shifted_sigma(layers, [0.5 * eps * z for z in zs]):
        loss_plus, grads_plus = sigma_gradients(model, layers, batch, loss_fn)
    with shifted_sigma(layers, [-0.5 * eps * z for z in zs]):
        loss_minus, grads_minus = sigma_gradients(model, layers, batch, loss_fn)
    if not _finite(loss_plus, loss_minus, *grads_plus, *grads_minus):
        return None
    return loss_plus, grads_plus, loss_minus, grads_minus


def _fd_joint(
    model: nn.Module, layers: Sequence[BasisLinear], batch: Batch, loss_fn: LossFn,
    zs: Sequence[torch.Tensor], eps: float,
) -> list[torch.Tensor] | None:
    """``z * (g+ - g-) / eps`` for the given layers, all perturbed together."""
    pair = _fd_pair(model, layers, batch, loss_fn, zs, eps)
    if pair is None:
        return None
    _, grads_plus, _, grads_minus = pair
    return [symmetric_difference_hessian(gp, gm, z, eps) for gp, gm, z in zip(grads_plus, grads_minus, zs)]


def _profile_fd_averaged_center(model: nn.Module, layers: Sequence[BasisLinear], pools: Sequence[torch.Tensor],
                                batch: Batch, loss_fn: LossFn, eps: float, probes: int,
                                generator: torch.Generator | None) -> ProfileResult | None:
    """Model scope with the centre gradient taken as the mean of the probe gradients (2 passes per probe).

    Unbiased up to O(eps^2): ``g(s + e z/2) + g(s - e z/2) = 2 g(s) + O(eps^2)``
    because the first-order terms ``+-(eps/2) H z`` cancel exactly.
    """
    grads = [torch.zeros(layer.rank, device=layer.sigma.device) for layer in layers]
    curvatures = [torch.zeros_like(g) for g in grads]
    loss = 0.0
    for _ in range(probes):
        zs = [probe_vector(layer.rank, pool, generator).to(layer.sigma.device) for layer, pool in zip(layers, pools)]
        pair = _fd_pair(model, layers, batch, loss_fn, zs, eps)
        if pair is None:
            return None
        loss_plus, grads_plus, loss_minus, grads_minus = pair
        loss += 0.5 * float(loss_plus + loss_minus) / probes
        for g, h, gp, gm, z in zip(grads, curvatures, grads_plus, grads_minus, zs):
            g.add_(0.5 * (gp + gm) / probes)  # (r,)
            h.add_(symmetric_difference_hessian(gp, gm, z, eps) / probes)  # (r,)
    return ProfileResult(loss, grads, curvatures)


def _profile_hvp(model: nn.Module, layers: Sequence[BasisLinear], pools: Sequence[torch.Tensor], batch: Batch,
                 loss_fn: LossFn, scope: str, probes: int, generator: torch.Generator | None) -> ProfileResult | None:
    grads: list[torch.Tensor] | None = None
    curvatures = [torch.zeros(layer.rank, device=layer.sigma.device) for layer in layers]
    loss = torch.tensor(0.0)
    for _ in range(probes):
        zs = [probe_vector(layer.rank, pool, generator).to(layer.sigma.device) for layer, pool in zip(layers, pools)]
        groups = [list(range(len(layers)))] if scope == "model" else [[i] for i in range(len(layers)) if pools[i].numel()]
        for group in groups:
            loss, g, hv = hessian_vector_product(
                model, [layers[i] for i in group], batch, loss_fn, [zs[i] for i in group]
            )
            if not _finite(loss, *g, *hv):
                return None
            for i, h in zip(group, hv):
                curvatures[i].add_(h * zs[i] / probes)
            if scope == "model" and grads is None:
                grads = g
    if grads is None:  # layer scope: one plain gradient for all layers
        loss, grads = sigma_gradients(model, layers, batch, loss_fn)
        if not _finite(loss, *grads):
            return None
    return ProfileResult(float(loss), grads, curvatures)
