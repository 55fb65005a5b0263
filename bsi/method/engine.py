"""The pruning stage (METHOD.md sec. 5) as a generator of typed reports.

:class:`Compressor` owns one model in Basel form and runs Algorithm 1::

    for each round t = 1..T:
        tune sigma and the auxiliary vectors for (IterPerPruning - NumProfilingIter) steps
        profile NumProfilingIter batches: accumulate E[dl/dsigma] and the
            Hessian-diagonal estimate over each layer's candidate pool
        score every basis, prune each pool by the importance-mass rule
        physically shrink the layers; yield a RoundReport

``Compressor.run()`` yields a :class:`~bsi.reports.StepReport` per iteration
and a :class:`~bsi.reports.RoundReport` per round; the caller drives it (and
can stop early simply by not asking for more). The engine prints nothing and
knows nothing about tokenisation: batches come from any iterator of dicts.

Target-size mode (``CompressConfig.target_ratio``) keeps the same loop but
replaces the fixed ``KeepRatioPerPruning`` with a per-round *parameter budget*
``B_t = dense * target_ratio ** (t / T)``: the candidate pools are widened if
they are too small to reach the budget, and the mass rule's keep fraction is
found by bisection so that the parameters after the round land on ``B_t``.
Bases are still removed in order of importance, only the amount is set by size.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from bsi.config import CompressConfig
from bsi.errors import BSIError
from bsi.method.curvature import LossFn, profile_batch
from bsi.method.scores import (
    candidate_pool,
    eps_rule,
    importance_scores,
    kept_positions,
    mass_rule_keep_count,
    select_pruned,
)
from bsi.method.layers import BasisLinear
from bsi.method.surgery import compressible_parameters, largest_singular_value, model_parameters, to_basis_form
from bsi.reports import LayerRound, RoundReport, StepReport

Reducer = Callable[[torch.Tensor], torch.Tensor]


def slice_optimizer_state(optimizer: torch.optim.Optimizer, param: nn.Parameter, keep: torch.Tensor) -> None:
    """After ``param.data = param.data[keep]``, slice its per-element optimizer state the same way."""
    state = optimizer.state.get(param)
    if not state:
        return
    for key, value in list(state.items()):
        if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] != param.shape[0]:
            state[key] = value[keep.to(value.device)].contiguous()


def stored_params_at_rank(layer: BasisLinear, rank: int) -> int:
    """Exported parameters of ``layer`` if it kept ``rank`` bases: min(factors, dense)."""
    bias = layer.out_features if layer.bias is not None else 0
    factors = (rank + layer.aux_rank) * (layer.in_features + layer.out_features) + bias
    return min(factors, layer.dense_parameters())


@dataclass
class _LayerStats:
    """Running sums over a round's profiling batches for one layer."""

    grad: torch.Tensor  # (r,) sum of dl/dsigma
    hessian: torch.Tensor  # (r,) sum of Hessian-diagonal estimates
    pool: torch.Tensor  # (p,) candidate positions


class Compressor:
    """Runs the pruning rounds on one model; iterate :meth:`run` to drive it.

    Args:
        model: a causal LM (converted to Basel form here if it is not yet).
        batches: an iterator of mini-batches (dicts accepted by ``loss_fn``).
        config: the schedule and scoring settings.
        loss_fn: ``loss_fn(model, batch) -> scalar`` (answer-token cross-entropy).
        compute_dtype: dtype the layers compute in (for the eps rule).
        reduce: sums a tensor across processes (identity on one process); used
            for the profiling sums and counts, so every rank prunes alike.
        probe_seed: seed of the probe generator (default ``config.seed``); give
            each process its own so that its probes are independent extra probes
            (see :mod:`bsi.pipeline.distributed`).
    """

    def __init__(
        self,
        model: nn.Module,
        batches: Iterator[dict],
        config: CompressConfig,
        loss_fn: LossFn,
        *,
        compute_dtype: torch.dtype | None = None,
        reduce: Reducer | None = None,
        probe_seed: int | None = None,
    ) -> None:
        self.model = model
        self.batches = batches
        self.config = config
        self.loss_fn = loss_fn
        self.layers = to_basis_form(model, aux_rank=config.aux_rank, seed=config.seed)
        self.names = list(self.layers)
        self.device = next(iter(self.layers.values())).sigma.device
        self.compute_dtype = compute_dtype or next(iter(self.layers.values())).U.dtype
        self.reduce = reduce or (lambda t: t)
        _, self.dense_before = compressible_parameters(model)
        self.eps = config.eps if config.eps is not None else eps_rule(
            largest_singular_value(self.layers), self.compute_dtype, config.eps_alpha, config.eps_max
        )
        self.generator = torch.Generator().manual_seed(config.seed if probe_seed is None else probe_seed)
        self.optimizer = self._make_optimizer()
        self.iteration = 0  # iterations done so far
        self.skipped = 0
        self._round_losses: list[float] = []
        self._stats: dict[str, _LayerStats] | None = None
        self._profiled = 0
        self._start = time.perf_counter()

    def _make_optimizer(self) -> torch.optim.Optimizer:
        groups = [{"params": [layer.sigma for layer in self.layers.values()], "lr": self.config.lr}]
        aux = [p for layer in self.layers.values() for p in (layer.aux_u, layer.aux_v) if p.numel()]
        if aux:
            groups.append({"params": aux, "lr": self.config.aux_lr})
        for layer in self.layers.values():
            for name in BasisLinear.TRAINABLE_PARAMETERS:
                getattr(layer, name).requires_grad_(True)
        return torch.optim.AdamW(groups, weight_decay=0.0)

    # ------------------------------------------------------------------ loop
    def run(self) -> Iterator[StepReport | RoundReport]:
        """Run the remaining iterations; yields a StepReport each, a RoundReport per round."""
        cfg = self.config
        total = cfg.round_length * cfg.rounds
        while self.iteration < total:
            self.iteration += 1
            k = (self.iteration - 1) % cfg.round_length + 1  # position within the round
            batch = next(self.batches)
            if k <= cfg.round_length - cfg.profiling_iters:
                yield self._train_step(batch, total)
            else:
                if self._stats is None:
                    self._stats = self._open_round()
                yield self._profile_step(batch, total)
            if k == cfg.round_length:
                yield self._close_round()

    def _check_skips(self) -> None:
        if self.skipped > self.config.max_skipped_batches:
            raise BSIError(
                f"{self.skipped} batches gave a non-finite loss or gradient (limit "
                f"max_skipped_batches={self.config.max_skipped_batches}); lower the learning rate or check the data/model dtype"
            )

    def _train_step(self, batch: dict, total: int) -> StepReport:
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.model, batch)
        # Backward even for a non-finite loss: under several processes the gradient
        # hooks all-reduce, so every rank must take part (its NaN then makes every
        # rank skip this step together). Alone, the step is skipped as before.
        if loss.requires_grad:
            loss.backward()
        grads = [p.grad for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]
        checks = [torch.isfinite(loss).all()] + [torch.isfinite(g).all() for g in grads]
        finite = bool(torch.stack(checks).all())  # one host-device sync, not one per tensor
        if finite:
            self.optimizer.step()
            self._round_losses.append(float(loss.detach()))
        else:
            self.skipped += 1
            self._check_skips()
        self.optimizer.zero_grad(set_to_none=True)
        return StepReport("train", self.iteration, total, float(loss.detach()), self._elapsed(), skipped=not finite)

    def _profile_step(self, batch: dict, total: int) -> StepReport:
        assert self._stats is not None
        layers = [self.layers[n] for n in self.names]
        pools = [self._stats[n].pool for n in self.names]
        result = profile_batch(
            self.model, layers, pools, batch, self.loss_fn, eps=self.eps,
            scope=self.config.probe_scope, method=self.config.hessian_method,
            probes=self.config.probes_per_batch, generator=self.generator,
            center=self.config.center_gradient,
        )
        if result is None:
            self.skipped += 1
            self._check_skips()
            return StepReport("profile", self.iteration, total, float("nan"), self._elapsed(), skipped=True)
        for name, g, h in zip(self.names, result.grads, result.hessians):
            self._stats[name].grad.add_(g)
            self._stats[name].hessian.add_(h)
        self._profiled += 1
        return StepReport("profile", self.iteration, total, result.loss, self._elapsed())

    # -------------------------------------------------------------- rounds
    @property
    def round_index(self) -> int:
        """1-based index of the round the current iteration belongs to."""
        return (max(self.iteration, 1) - 1) // self.config.round_length + 1

    def round_budget(self, round_index: int) -> int | None:
        """Target-size mode: compressible parameters allowed after round t (None otherwise)."""
        ratio = self.config.target_ratio
        if ratio is None:
            return None
        return round(self.dense_before * ratio ** (round_index / self.config.rounds))

    def _open_round(self) -> dict[str, _LayerStats]:
        """Choose candidate pools (from the tuned sigma) and zero the accumulators."""
        rho = self.config.pool_rho
        budget = self.round_budget(self.round_index)
        pools = self._pools(rho)
        if budget is not None:
            pools = self._widen_pools(rho, pools, budget)
        self._profiled = 0
        return {
            n: _LayerStats(torch.zeros_like(self.layers[n].sigma), torch.zeros_like(self.layers[n].sigma), pools[n])
            for n in self.names
        }

    def _pools(self, rho: float) -> dict[str, torch.Tensor]:
        return {n: candidate_pool(self.layers[n].sigma, rho).to(self.device) for n in self.names}

    def _widen_pools(self, rho: float, pools: dict[str, torch.Tensor], budget: int) -> dict[str, torch.Tensor]:
        """Lower rho until pruning every pool entirely could reach ``budget`` (with margin)."""
        now = sum(layer.stored_parameters() for layer in self.layers.values())

        def floor(p: dict[str, torch.Tensor]) -> int:  # params if every pool were pruned
            return sum(stored_params_at_rank(self.layers[n], self.layers[n].rank - p[n].numel()) for n in self.names)

        need = now - budget
        lo, hi = 0.0, rho
        if need <= 0 or now - floor(pools) >= 1.5 * need:
            return pools
        for _ in range(30):
            mid = (lo + hi) / 2
            if now - floor(self._pools(mid)) >= 1.5 * need:
                lo = mid
            else:
                hi = mid
        return self._pools(lo)

    def _close_round(self) -> RoundReport:
        """Score, prune, shrink, and report the round."""
        assert self._stats is not None
        cfg = self.config
        count = float(self.reduce(torch.tensor(float(self._profiled), device=self.device)))
        if count == 0:
            raise BSIError("every profiling batch of this round was skipped for non-finite values; nothing to score")
        stats = {}
        for n in self.names:
            s = self._stats[n]
            grad = self.reduce(s.grad) / count  # (r,) mean over every process's batches
            hessian = self.reduce(s.hessian) / count
            sigma = self.layers[n].sigma.detach().float()
            stats[n] = (sigma, grad, hessian, importance_scores(sigma, grad, hessian, cfg.score), s.pool)
        budget = self.round_budget(self.round_index)
        if budget is None:
            pruned = {n: select_pruned(stats[n][3], stats[n][4], cfg.keep_per_round) for n in self.names}
        else:
            pruned = self._prune_to_budget(stats, budget)
        reports = []
        for n in self.names:
            layer = self.layers[n]
            sigma, grad, hessian, importance, pool = stats[n]
            before, ids = layer.rank, layer.basis_ids.clone()
            keep = kept_positions(before, pruned[n].cpu()).to(self.device)
            if keep.numel() < before:
                layer.keep(keep)
                slice_optimizer_state(self.optimizer, layer.sigma, keep)
            reports.append(LayerRound(
                name=n, basis_ids=ids.cpu(), sigma=sigma.cpu(), grad=grad.cpu(), hessian=hessian.cpu(),
                importance=importance.cpu(), pool=pool.cpu(), pruned=pruned[n].cpu(),
                rank_before=before, rank_after=layer.rank, params_after=layer.stored_parameters(),
            ))
        now, _ = compressible_parameters(self.model)
        mean_loss = sum(self._round_losses) / len(self._round_losses) if self._round_losses else float("nan")
        report = RoundReport(
            round=self.round_index, total_rounds=cfg.rounds, layers=tuple(reports),
            params_total=model_parameters(self.model), params_compressible=now,
            compressible_before=self.dense_before, eps=self.eps, mean_loss=mean_loss,
            skipped_batches=self.skipped, elapsed=self._elapsed(),
        )
        self._stats, self._round_losses = None, []
        return report

    def _prune_to_budget(self, stats: dict, budget: int) -> dict[str, torch.Tensor]:
        """Bisection on the mass rule's keep fraction q in [0, 2] so params land on ``budget``."""

        def params_at(q: float) -> int:
            total = 0
            for n in self.names:
                layer, pool_importance = self.layers[n], stats[n][3][stats[n][4]]
                kept = mass_rule_keep_count(pool_importance, q) if pool_importance.numel() else 0
                total += stored_params_at_rank(layer, layer.rank - (pool_importance.numel() - kept))
            return total

        lo, hi = 0.0, 2.0
        if params_at(hi) <= budget:
            q = hi
        elif params_at(lo) >= budget:
            q = lo
        else:
            for _ in range(40):  # invariant: params_at(lo) < budget <= params_at(hi)
                mid = (lo + hi) / 2
                if params_at(mid) < budget:
                    lo = mid
                else:
                    hi = mid
            q = lo if abs(params_at(lo) - budget) <= abs(params_at(hi) - budget) else hi
        return {n: select_pruned(stats[n][3], stats[n][4], q) for n in self.names}

    def _elapsed(self) -> float:
        return time.perf_counter() - self._start

    # ------------------------------------------------------------ checkpoint
    @property
    def at_round_boundary(self) -> bool:
        """True between rounds: no profiling statistics are half-accumulated."""
        return self._stats is None and self.iteration % self.config.round_length == 0

    def state_dict(self) -> tuple[dict[str, torch.Tensor], dict]:
        """Everything needed to continue this run: ``(tensors, plain JSON values)``.

        Only valid between rounds (see :attr:`at_round_boundary`): the layers'
        current bases, coefficients and auxiliary vectors, the optimizer's
        moments, the probe generator and the iteration counter.
        """
        if not self.at_round_boundary:
            raise RuntimeError("Compressor state can only be saved between rounds")
        tensors: dict[str, torch.Tensor] = {"generator": self.generator.get_state()}
        for n, layer in self.layers.items():
            for key in ("U", "V", "sigma", "aux_u", "aux_v", "basis_ids"):
                tensors[f"layer.{n}.{key}"] = getattr(layer, key).detach()
        optimizer = self.optimizer.state_dict()
        for index, state in optimizer["state"].items():
            for key, value in state.items():
                tensors[f"optimizer.{index}.{key}"] = value.detach() if isinstance(value, torch.Tensor) else torch.tensor(value)
        plain = {
            "iteration": self.iteration, "skipped": self.skipped, "eps": self.eps,
            "dense_before": self.dense_before, "param_groups": optimizer["param_groups"],
            "config": self.config.to_dict(),
        }
        return {k: v.contiguous().cpu() for k, v in tensors.items()}, plain

    def load_state_dict(self, tensors: dict[str, torch.Tensor], plain: dict) -> None:
        """Continue from :meth:`state_dict`: the layers are shrunk to the saved ranks."""
        for n, layer in self.layers.items():
            get = lambda key: tensors[f"layer.{n}.{key}"].to(self.device)  # noqa: E731
            layer.U, layer.V, layer.basis_ids = get("U"), get("V"), get("basis_ids")
            for key in ("sigma", "aux_u", "aux_v"):
                getattr(layer, key).data = get(key).to(getattr(layer, key).dtype)
        state: dict[int, dict] = {}
        for key, value in tensors.items():
            if key.startswith("optimizer."):
                _, index, name = key.split(".", 2)
                state.setdefault(int(index), {})[name] = value
        self.optimizer.load_state_dict({"state": state, "param_groups": plain["param_groups"]})
        self.generator.set_state(tensors["generator"])
        self.iteration, self.skipped = int(plain["iteration"]), int(plain["skipped"])
        self.eps, self.dense_before = float(plain["eps"]), int(plain["dense_before"])
        self._stats, self._round_losses = None, []
