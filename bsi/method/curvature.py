"""Gradients and Hessian-diagonal estimates with respect to the coefficients sigma.

One *profiling step* takes one mini-batch and returns, for every layer,

* ``grad``: dl/dsigma at the current sigma (r,), and
* ``hessian``: a one-probe estimate of diag(d2l/dsigma^2) over the layer's
  candidate pool (r,), zero outside the pool,

or ``None`` when any loss or gradient it computed was not finite (the caller
skips such a batch; it never enters the statistics).

Two probe scopes:

* ``"layer"`` (the paper's pseudo-code): each layer gets its own probe; the
  other layers stay at sigma*. Cost: 1 + 2 L gradient evaluations, but each
  backward stops at the probed layer.
* ``"model"``: one joint probe over all layers at once. Cost: 3 gradient
  evaluations whatever the depth. Still unbiased (cross-layer terms
  ``E[z_i z_j] = 0`` cancel) but with more variance per probe.

Two ways to get ``H z``:

* ``"fd"``: symmetric finite differences of gradients at ``sigma +- (eps/2) z``
  (:func:`bsi.method.scores.symmetric_difference_hessian`), first-order autograd
  only, works with any attention kernel and with gradient checkpointing.
* ``"hvp"``: exact Hessian-vector product by double backward (needs eager
  attention; see :func:`bsi.models.load_model_and_tokenizer`).

Where the gradient at sigma* comes from (``center``, ``fd`` with ``"model"``
scope only):

* ``"exact"``: its own forward and backward (3 passes per profiling step).
* ``"average"``: ``(g+ + g-) / 2``, free from the two probe passes (2 passes).
  Unbiased up to O(eps^2): ``g(s + e z/2) + g(s - e z/2) = 2 g(s) + O(eps^2)``
  because the first-order terms ``+-(eps/2) H z`` cancel exactly; with the
  rule's eps (~1e-6 in fp32, 0.1 in bf16) the difference is far below the
  noise between mini-batches.

The model is put in eval mode (dropout off) so that ``g+`` and ``g-`` see the
very same network function, and restored afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from bsi.method.scores import probe_vector, symmetric_difference_hessian
from bsi.method.layers import BasisLinear

LossFn = Callable[[nn.Module, dict], torch.Tensor]


@dataclass
class ProfileResult:
    """Per-layer statistics from one profiling mini-batch."""

    loss: float
    grads: list[torch.Tensor]  # each (r_l,) float32, CPU-free: on the layer's device
    hessians: list[torch.Tensor]  # each (r_l,) float32, zero outside the pool


def _finite(*tensors: torch.Tensor) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in tensors)


@contextmanager
def evaluation_mode(model: nn.Module):
    """Dropout off inside the block; the previous train/eval mode is restored after."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


@contextmanager
def shifted_sigma(layers: Sequence[BasisLinear], deltas: Sequence[torch.Tensor | None]):
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
    model: nn.Module, layers: Sequence[BasisLinear], batch: dict, loss_fn: LossFn
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Loss and dl/dsigma for the given layers only (other parameters get no gradient).

    Uses ``torch.autograd.grad`` so the backward pass stops as soon as every
    requested sigma is reached: asking for one deep layer is cheaper than
    asking for all.
    """
    loss = loss_fn(model, batch)
    grads = torch.autograd.grad(loss, [layer.sigma for layer in layers], allow_unused=True)
    grads = [torch.zeros_like(layer.sigma) if g is None else g.float() for layer, g in zip(layers, grads)]
    return loss.detach(), grads


def hessian_vector_product(
    model: nn.Module, layers: Sequence[BasisLinear], batch: dict, loss_fn: LossFn, vectors: Sequence[torch.Tensor]
) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """Exact ``H v`` in sigma-space by double backward; returns (loss, grads, Hv per layer)."""
    sigmas = [layer.sigma for layer in layers]
    loss = loss_fn(model, batch)
    grads = torch.autograd.grad(loss, sigmas, create_graph=True, allow_unused=True)
    grads = [torch.zeros_like(s) if g is None else g for s, g in zip(sigmas, grads)]
    dot = sum((g * v.to(g.device)).sum() for g, v in zip(grads, vectors))
    hv = torch.autograd.grad(dot, sigmas, allow_unused=True)
    hv = [torch.zeros_like(s) if h is None else h.detach().float() for s, h in zip(sigmas, hv)]
    return loss.detach(), [g.detach().float() for g in grads], hv


def profile_batch(
    model: nn.Module,
    layers: Sequence[BasisLinear],
    pools: Sequence[torch.Tensor],
    batch: dict,
    loss_fn: LossFn,
    *,
    eps: float,
    scope: str = "model",
    method: str = "fd",
    probes: int = 1,
    generator: torch.Generator | None = None,
    center: str = "exact",
) -> ProfileResult | None:
    """Gradient and Hessian-diagonal estimate for every layer on one mini-batch.

    Args:
        layers: the `BasisLinear` layers, in a fixed order.
        pools: per layer, (p_l,) int64 candidate-pool positions; probes are zero elsewhere.
        eps: perturbation intensity (``fd`` only): gradients are taken at sigma +- (eps/2) z.
        scope: ``"model"`` (one joint probe) or ``"layer"`` (one probe per layer).
        method: ``"fd"`` (finite differences of gradients) or ``"hvp"`` (double backward).
        probes: independent probes averaged on this batch.
        center: ``"exact"`` or ``"average"`` (the mean of the probe gradients,
            one pass fewer; used only with ``method="fd"`` and ``scope="model"``).

    Returns:
        A :class:`ProfileResult`, or None if a non-finite value appeared anywhere.
    """
    with evaluation_mode(model):
        if method == "hvp":
            return _profile_hvp(model, layers, pools, batch, loss_fn, scope, probes, generator)
        if center == "average" and scope == "model":
            return _profile_fd_averaged_center(model, layers, pools, batch, loss_fn, eps, probes, generator)
        loss, grads = sigma_gradients(model, layers, batch, loss_fn)
        if not _finite(loss, *grads):
            return None
        hessians = [torch.zeros_like(g) for g in grads]
        for _ in range(probes):
            if scope == "model":
                zs = [probe_vector(layer.rank, pool, generator).to(layer.sigma.device) for layer, pool in zip(layers, pools)]
                est = _fd_joint(model, layers, batch, loss_fn, zs, eps)
                if est is None:
                    return None
                for h, e in zip(hessians, est):
                    h.add_(e / probes)
            else:
                for i, (layer, pool) in enumerate(zip(layers, pools)):
                    if pool.numel() == 0:
                        continue
                    z = probe_vector(layer.rank, pool, generator).to(layer.sigma.device)
                    est = _fd_joint(model, [layer], batch, loss_fn, [z], eps)
                    if est is None:
                        return None
                    hessians[i].add_(est[0] / probes)
        return ProfileResult(float(loss), grads, hessians)


def _fd_pair(
    model: nn.Module, layers: Sequence[BasisLinear], batch: dict, loss_fn: LossFn,
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
    model: nn.Module, layers: Sequence[BasisLinear], batch: dict, loss_fn: LossFn,
    zs: Sequence[torch.Tensor], eps: float,
) -> list[torch.Tensor] | None:
    """``z * (g+ - g-) / eps`` for the given layers, all perturbed together."""
    pair = _fd_pair(model, layers, batch, loss_fn, zs, eps)
    if pair is None:
        return None
    _, grads_plus, _, grads_minus = pair
    return [symmetric_difference_hessian(gp, gm, z, eps) for gp, gm, z in zip(grads_plus, grads_minus, zs)]


def _profile_fd_averaged_center(model, layers, pools, batch, loss_fn, eps, probes, generator) -> ProfileResult | None:
    """Model scope with the centre gradient taken as the mean of the probe gradients (2 passes per probe)."""
    grads = [torch.zeros(layer.rank, device=layer.sigma.device) for layer in layers]
    hessians = [torch.zeros_like(g) for g in grads]
    loss = 0.0
    for _ in range(probes):
        zs = [probe_vector(layer.rank, pool, generator).to(layer.sigma.device) for layer, pool in zip(layers, pools)]
        pair = _fd_pair(model, layers, batch, loss_fn, zs, eps)
        if pair is None:
            return None
        loss_plus, grads_plus, loss_minus, grads_minus = pair
        loss += 0.5 * float(loss_plus + loss_minus) / probes
        for g, h, gp, gm, z in zip(grads, hessians, grads_plus, grads_minus, zs):
            g.add_(0.5 * (gp + gm) / probes)  # (r,)
            h.add_(symmetric_difference_hessian(gp, gm, z, eps) / probes)  # (r,)
    return ProfileResult(loss, grads, hessians)


def _profile_hvp(model, layers, pools, batch, loss_fn, scope, probes, generator) -> ProfileResult | None:
    grads: list[torch.Tensor] | None = None
    hessians = [torch.zeros(layer.rank, device=layer.sigma.device) for layer in layers]
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
                hessians[i].add_(h * zs[i] / probes)
            if scope == "model" and grads is None:
                grads = g
    if grads is None:  # layer scope: one plain gradient for all layers
        loss, grads = sigma_gradients(model, layers, batch, loss_fn)
        if not _finite(loss, *grads):
            return None
    return ProfileResult(float(loss), grads, hessians)
