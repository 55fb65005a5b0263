"""The truncation baselines: plain SVD, SVD-LLM, Fisher-weighted SVD, activation-aware SVD.

Each baseline decides *which rank-k approximation* of a weight ``W`` (out, in)
to keep, by choosing what error the truncation should be small in (the bases
themselves are computed in :mod:`bsi.method.bases`):

* **SVD** keeps the top-k singular triplets of ``W``: smallest ``||W - W_k||_F``.
* **SVD-LLM** truncates the SVD of ``W S``, ``S`` the Cholesky factor of the
  layer's input covariance on task batches: the smallest *output* error
  ``||X (W - W_k)^T||_F`` on those inputs (:func:`bsi.method.bases.whitened_bases`).
* **FWSVD** (Fisher-weighted SVD) weights each output row ``i`` by
  ``d_i = sqrt(sum_j F_ij)``, where ``F_ij`` is the squared gradient of the task
  loss w.r.t. ``W_ij`` accumulated over task batches (an empirical Fisher
  diagonal). It truncates ``diag(d) W`` and undoes the weights afterwards, so it
  minimises ``||diag(d) (W - W_k)||_F``: rows the task is sensitive to are kept
  more faithfully.
* **ASVD** (activation-aware SVD) scales each input channel ``j`` by
  ``s_j = mean|x_j| ** alpha`` measured on calibration batches of the task, and
  truncates ``W diag(s)``: it minimises ``||(W - W_k) diag(s)||_F``, which
  approximates the output error on real inputs, where a few large-activation
  channels dominate.

All of them give ``(U, sigma, V)`` with ``W ~= U diag(sigma) V^T`` and the
weighting undone. :func:`install_bases` keeps the top-k bases of a
:class:`~bsi.method.layers.BasisLinear` layer, so every baseline goes through
*the same* recovery stage and the same export and size accounting as BSI.

Rank allocation decides ``k`` per layer: :func:`uniform_ranks` gives every
layer the same share of its parameters (the usual choice for SVD baselines),
:func:`sensitivity_ranks` is ASVD's allocation, which spends the budget where
truncating a layer hurts the loss most. Both land within one basis per layer
of a target parameter count.

The functions here are pure tensor math; gathering statistics from a model is
:func:`input_statistics` and :func:`fisher_information`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence

import torch
from torch import nn

from bsi.errors import BSIError
from bsi.method.bases import InputStatistics
from bsi.method.layers import BasisLinear
from bsi.method.schedule import LayerShape
from bsi.reports import StepReport

# --------------------------------------------------------------------- math


def fisher_row_weights(row_information: torch.Tensor, floor: float = 1e-6) -> torch.Tensor:
    """FWSVD row weights ``d_i = sqrt(sum_j F_ij)`` from each row's summed Fisher information.

    Args:
        row_information: (out,) ``sum_j F_ij``, the squared task gradients of
            row ``i`` summed over examples (:func:`fisher_row_information`).
        floor: rows with (near) zero information get ``floor * max(d)`` so the
            weighting stays invertible.

    Returns:
        (out,) positive float32 row weights.
    """
    d = row_information.float().clamp_min(0).sqrt()  # (out,)
    top = float(d.max()) if d.numel() else 0.0
    if not math.isfinite(top) or top <= 0:
        return torch.ones_like(d)
    return d.clamp_min(floor * top)


def activation_scales(abs_mean: torch.Tensor, alpha: float = 0.5, floor: float = 1e-6) -> torch.Tensor:
    """ASVD input-channel scales ``s_j = mean|x_j| ** alpha``.

    Args:
        abs_mean: (in,) mean absolute activation of each input channel.
        alpha: strength of the scaling (0: plain SVD, 1: full magnitude).
        floor: channels that never fire get ``floor * max(s)`` (invertibility).

    Returns:
        (in,) positive float32 scales.
    """
    s = abs_mean.float().clamp_min(0).pow(alpha)  # (in,)
    top = float(s.max()) if s.numel() else 0.0
    if not math.isfinite(top) or top <= 0:
        return torch.ones_like(s)
    return s.clamp_min(floor * top)


def _fill_to_budget(shapes: Mapping[str, LayerShape], ranks: dict[str, int], budget: int,
                    priority: Callable[[str], float]) -> dict[str, int]:
    """Add one basis at a time (highest ``priority`` first) while the total stays <= budget,
    then take the single closest total: within one basis of one layer of ``budget``."""
    total = sum(shapes[n].cost(ranks[n]) for n in shapes)
    for name in sorted(shapes, key=priority, reverse=True):
        shape = shapes[name]
        while ranks[name] < shape.rank:
            step = shape.cost(ranks[name] + 1) - shape.cost(ranks[name])
            if total + step > budget:
                break
            ranks[name] += 1
            total += step
    # one more basis somewhere may land closer to the budget than staying under it
    best, best_gap = None, budget - total
    for name, shape in shapes.items():
        if ranks[name] < shape.rank:
            over = total + shape.cost(ranks[name] + 1) - shape.cost(ranks[name]) - budget
            if 0 <= over < best_gap:
                best, best_gap = name, over
    if best is not None:
        ranks[best] += 1
    return ranks


def uniform_ranks(shapes: Mapping[str, LayerShape], target_ratio: float) -> dict[str, int]:
    """Ranks giving every layer about the same share ``target_ratio`` of its dense size.

    The common share is the target; rounding leftovers go to the layers whose
    exact share was cut most, one basis at a time, so the total lands within
    one basis of one layer of ``target_ratio * dense``.
    """
    if not 0 < target_ratio <= 1:
        raise BSIError(f"target ratio must be in (0, 1], got {target_ratio}")
    budget = round(target_ratio * sum(s.dense for s in shapes.values()))
    exact = {n: max(0.0, target_ratio * s.dense / (s.in_features + s.out_features) - s.aux_rank)
             for n, s in shapes.items()}
    ranks = {n: min(shapes[n].rank, int(exact[n])) for n in shapes}
    if sum(shapes[n].cost(ranks[n]) for n in shapes) > budget:  # aux vectors alone overshoot: shrink
        ranks = {n: 0 for n in shapes}
    return _fill_to_budget(shapes, ranks, budget, priority=lambda n: exact[n] - ranks[n])


def sensitivity_ranks(shapes: Mapping[str, LayerShape], target_ratio: float,
                      sensitivity: Mapping[str, Mapping[float, float]]) -> dict[str, int]:
    """ASVD's allocation: each layer gets the smallest share whose loss stays under a common threshold.

    Args:
        shapes: the layers.
        target_ratio: parameters after / before, over all these layers.
        sensitivity: ``{layer: {share: loss}}``, the task loss measured with only
            that layer truncated to that share of its parameters (shares in (0, 1]).

    A threshold ``tau`` on the loss is found by bisection over the measured
    losses; each layer takes the smallest share with loss <= tau (its full size
    if none), so sensitive layers keep more. Leftover budget is filled one
    basis at a time, most sensitive layers first.
    """
    if not 0 < target_ratio <= 1:
        raise BSIError(f"target ratio must be in (0, 1], got {target_ratio}")
    missing = [n for n in shapes if not sensitivity.get(n)]
    if missing:
        raise BSIError(f"no sensitivity measured for layer '{missing[0]}'")
    budget = round(target_ratio * sum(s.dense for s in shapes.values()))

    def rank_at(shape: LayerShape, share: float) -> int:
        exact = share * shape.dense / (shape.in_features + shape.out_features) - shape.aux_rank
        return min(shape.rank, max(0, int(exact)))

    def ranks_for(tau: float) -> dict[str, int]:
        out = {}
        for n, shape in shapes.items():
            ok = [share for share, loss in sensitivity[n].items() if loss <= tau]
            out[n] = rank_at(shape, min(ok)) if ok else shape.rank
        return out

    levels = sorted({loss for table in sensitivity.values() for loss in table.values()})
    lo, hi = 0, len(levels) - 1  # find the smallest tau whose allocation fits the budget
    if sum(shapes[n].cost(r) for n, r in ranks_for(levels[hi]).items()) > budget:
        ranks = {n: 0 for n in shapes}
    else:
        while lo < hi:
            mid = (lo + hi) // 2
            if sum(shapes[n].cost(r) for n, r in ranks_for(levels[mid]).items()) <= budget:
                hi = mid
            else:
                lo = mid + 1
        ranks = ranks_for(levels[lo])
    worst = {n: max(sensitivity[n].values()) for n in shapes}
    return _fill_to_budget(shapes, ranks, budget, priority=lambda n: worst[n])


def install_bases(layer: BasisLinear, u: torch.Tensor, sigma: torch.Tensor, v: torch.Tensor, rank: int) -> None:
    """Replace ``layer``'s bases by ``(U, sigma, V)`` and keep the first ``rank`` of them.

    Args:
        u: (out, r) left factors, ``sigma`` (r,) descending, ``v`` (in, r).
        rank: bases to keep (``0 <= rank <= r``).
    """
    if u.shape != layer.U.shape or v.shape != layer.V.shape or sigma.shape != layer.sigma.shape:
        raise BSIError(f"bases of shape {tuple(u.shape)}/{tuple(v.shape)} do not fit layer {layer.extra_repr()}")
    with torch.no_grad():
        layer.U.copy_(u.to(layer.U.dtype))
        layer.V.copy_(v.to(layer.V.dtype))
        layer.sigma.copy_(sigma)
        layer.basis_ids.copy_(torch.arange(sigma.numel(), device=layer.basis_ids.device))
    layer.keep(torch.arange(rank))


# --------------------------------------------------------- model statistics


def input_statistics(model: nn.Module, modules: Mapping[str, nn.Module], batches: Iterator[dict], count: int,
                     covariance: bool = False) -> Generator[StepReport, None, InputStatistics]:
    """Run ``count`` batches through ``model`` (no gradient), yielding a StepReport each; returns the statistics.

    See :class:`bsi.method.bases.InputStatistics`: ``abs_mean()`` for ASVD's
    scales, ``covariance()`` (if asked) for SVD-LLM's whitening.
    """
    device = next(model.parameters()).device
    stats = InputStatistics(modules, covariance=covariance)
    start = _now()
    with stats, torch.inference_mode():
        for step in range(1, count + 1):
            batch = next(batches)
            mask = batch.get("attention_mask")
            stats.start_batch(mask)
            model(input_ids=batch["input_ids"].to(device), attention_mask=mask.to(device) if mask is not None else None,
                  use_cache=False)
            yield StepReport("calibrate", step, count, float("nan"), _now() - start)
    return stats


def example_row_norms(inputs: torch.Tensor, output_grads: torch.Tensor) -> torch.Tensor:
    """Squared row norms of every example's weight gradient, summed over examples, without forming the gradients.

    For a linear layer ``y = x W^T`` run on a batch, example ``b``'s gradient
    is ``G_b = E_b^T X_b`` (out, in), with ``X_b`` (T, in) its inputs and
    ``E_b`` (T, out) the loss gradient at its outputs. Row ``i`` of ``G_b``
    has the squared norm ``e_i^T (X_b X_b^T) e_i``, so a (T, T) Gram matrix
    per example gives all of them: ``T^2 (in + out)`` operations instead of
    ``T in out``.

    Args:
        inputs: (B, T, in) layer inputs.
        output_grads: (B, T, out) loss gradients at the layer's outputs.

    Returns:
        (out,) float32: ``sum_b sum_j (G_b)_ij^2``.
    """
    x, e = inputs.float(), output_grads.float()
    gram = x @ x.transpose(1, 2)  # (B, T, T)
    return (e * (gram @ e)).sum(dim=(0, 1))  # (out,)


def fisher_row_information(model: nn.Module, modules: Mapping[str, nn.Module], batches: Iterator[dict], count: int,
                           loss_fn: Callable, *, per_example: bool = True
                           ) -> Generator[StepReport, None, dict[str, torch.Tensor]]:
    """FWSVD's Fisher information of each weight row, ``sum_j F_ij``, over ``count`` batches.

    ``per_example`` (the published FWSVD): ``F = sum over examples of the
    squared gradient of that example's loss`` (``loss_fn.per_example``), all
    from one backward pass per batch (:func:`example_row_norms`). Otherwise
    the squared gradient of each *batch's* mean loss (a cheaper stand-in
    whose per-example noise cancels inside the batch).

    Yields a StepReport per batch; returns ``{name: (out,)}`` float32.
    Non-finite batches are skipped (and reported so); ``requires_grad`` flags
    are restored afterwards.
    """
    flags = {id(p): p.requires_grad for p in model.parameters()}
    for p in model.parameters():
        p.requires_grad_(False)
    for m in modules.values():
        m.weight.requires_grad_(True)
    sums = {n: torch.zeros(m.weight.shape[0], dtype=torch.float32, device=m.weight.device) for n, m in modules.items()}
    seen: dict[str, list[torch.Tensor]] = {}

    def capture(name: str):
        def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
            x = args[0].detach()
            output.register_hook(lambda grad: seen.setdefault(name, []).extend([x, grad.detach()]))
        return hook

    handles = [m.register_forward_hook(capture(n)) for n, m in modules.items()] if per_example else []
    start = _now()
    was_training = model.training
    model.eval()
    try:
        for step in range(1, count + 1):
            batch = next(batches)
            seen.clear()
            if per_example:
                losses = loss_fn.per_example(model, batch)  # (B,)
                finite = bool(torch.isfinite(losses).all())
                loss = losses.sum()
            else:
                loss = loss_fn(model, batch)
                finite = bool(torch.isfinite(loss))
            if finite:
                loss.backward()
                grads = [m.weight.grad for m in modules.values()]
                finite = all(g is not None and bool(torch.isfinite(g).all()) for g in grads)
            if finite:
                for n, m in modules.items():
                    if per_example:
                        x, grad = seen[n]
                        sums[n] += example_row_norms(x, grad)
                    else:
                        sums[n] += m.weight.grad.float().square().sum(dim=1)
            for m in modules.values():
                m.weight.grad = None
            seen.clear()
            shown = float(loss.detach()) / (len(losses) if per_example else 1)
            yield StepReport("calibrate", step, count, shown, _now() - start, skipped=not finite)
    finally:
        for h in handles:
            h.remove()
        for p in model.parameters():
            p.requires_grad_(flags[id(p)])
        model.train(was_training)
    return sums


class SuffixLoss:
    """The answer-token loss on fixed batches when one layer changes, running only the blocks from that layer's on.

    ASVD's sensitivity search evaluates the loss once per layer and share with
    only that layer truncated. Everything before the layer's transformer block
    computes exactly what it did, so the block's inputs are recorded once per
    batch (one full forward pass) and each evaluation runs the rest: on
    average half the model. This needs the usual decoder layout
    (``model.model.layers``, ``model.model.norm``, ``model.lm_head``); any
    other model, or a layer outside the blocks, gets a full forward pass.

    Call as ``loss(layer_name)``: the mean over the batches of the
    answer-token loss, as :data:`bsi.pipeline.losses.answer_token_loss`
    computes it.
    """

    def __init__(self, model: nn.Module, batches: Sequence[dict], loss_fn: Callable[[nn.Module, dict], torch.Tensor]) -> None:
        self.model, self.batches, self.loss_fn = model, list(batches), loss_fn
        decoder = getattr(model, "model", None)
        self.blocks = getattr(decoder, "layers", None)
        self.norm = getattr(decoder, "norm", None)
        self.head = getattr(model, "lm_head", None)
        self.inputs: list[list[tuple[tuple, dict]]] = []  # per batch, per block: the block's (args, kwargs)
        if self.blocks is not None and self.norm is not None and self.head is not None:
            self._record()

    def _record(self) -> None:
        device = next(self.model.parameters()).device
        for batch in self.batches:
            seen: list[tuple[tuple, dict]] = []
            hooks = [block.register_forward_pre_hook(lambda m, a, k, record=seen.append: record((a, k)), with_kwargs=True)
                     for block in self.blocks]
            try:
                with torch.inference_mode():
                    self.model(input_ids=batch["input_ids"].to(device), use_cache=False,
                               attention_mask=batch["attention_mask"].to(device) if "attention_mask" in batch else None)
            finally:
                for hook in hooks:
                    hook.remove()
            if len(seen) != len(self.blocks):  # blocks not called once each: not the layout assumed
                self.inputs = []
                return
            self.inputs.append(seen)

    def __call__(self, layer: str | None = None) -> float:
        from bsi.data import IGNORE_INDEX
        from bsi.method.names import layer_block

        block = layer_block(layer) if layer is not None else None
        if not self.inputs or block is None or not 0 <= block < len(self.blocks):
            with torch.inference_mode():
                return sum(float(self.loss_fn(self.model, b)) for b in self.batches) / len(self.batches)
        total = 0.0
        with torch.inference_mode():
            for batch, recorded in zip(self.batches, self.inputs):
                hidden = recorded[block][0][0]  # (B, T, d): the block's input, as the full pass gave it
                for index in range(block, len(self.blocks)):
                    args, kwargs = recorded[index]  # the rest of the block's inputs: masks, positions
                    out = self.blocks[index](hidden, *args[1:], **kwargs)
                    hidden = out[0] if isinstance(out, tuple) else out
                labels = batch["labels"].to(hidden.device)
                keep = labels[:, 1:] != IGNORE_INDEX  # (B, T-1): position t predicts token t+1
                logits = self.head(self.norm(hidden)[:, :-1][keep]).float()  # (N, V)
                total += float(torch.nn.functional.cross_entropy(logits, labels[:, 1:][keep]))
        return total / len(self.batches)


def truncation_sensitivity(model: nn.Module, layers: Mapping[str, BasisLinear], shares: Sequence[float],
                           loss_of: Callable[[str], float]) -> Generator[StepReport, None, dict[str, dict[float, float]]]:
    """ASVD's sensitivity table: the loss with one layer at a time cut to each share of its size.

    ``layers`` already hold the bases to truncate (sorted, most important
    first). Cutting is done by zeroing sigma beyond the rank and restoring it,
    so the model is unchanged afterwards. ``loss_of(name)`` is the loss with
    layer ``name`` changed (:class:`SuffixLoss`). Yields a StepReport per
    layer; returns ``{name: {share: loss}}``.
    """
    table: dict[str, dict[float, float]] = {}
    start = _now()
    for step, (name, layer) in enumerate(layers.items(), start=1):
        shape = LayerShape(layer.in_features, layer.out_features, layer.rank, layer.aux_rank, layer.bias is not None)
        saved = layer.sigma.detach().clone()
        row = {}
        for share in shares:
            rank = min(shape.rank, max(0, int(share * shape.dense / (shape.in_features + shape.out_features)
                                                  - shape.aux_rank)))
            with torch.no_grad():
                layer.sigma[rank:] = 0
            row[float(share)] = loss_of(name)
            with torch.no_grad():
                layer.sigma.copy_(saved)
        table[name] = row
        yield StepReport("sensitivity", step, len(layers), min(row.values()), _now() - start)
    return table


def _now() -> float:
    return time.perf_counter()
