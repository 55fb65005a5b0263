"""The pruning stage as a generator of typed reports.

:class:`Compressor` owns one model and runs the method's Algorithm 1::

    write every linear layer in the Basel form (bases: SVD, or whitened on task inputs)
    for each round t = 1..T:
        tune sigma and the auxiliary vectors for (IterPerPruning - NumProfilingIter) steps
        profile NumProfilingIter batches: accumulate what the score needs,
            E[dl/dsigma] and a curvature estimate over each layer's candidate pool
        score every basis, prune (size mode keep: the importance-mass rule;
            target: a per-round parameter budget), physically shrink the layers
        yield a RoundReport

``Compressor.run()`` yields a :class:`~bsi.reports.StepReport` per iteration
(and per calibration batch) and a :class:`~bsi.reports.RoundReport` per round;
the caller drives it (and can stop early simply by not asking for more). The
engine prints nothing and knows nothing about tokenisation: batches come from
any iterator, and the two loss callables are given to it.

How much a round removes and which bases go is :mod:`bsi.method.schedule`;
the scores are :mod:`bsi.method.scores`, the curvature sources
:mod:`bsi.method.curvature`, the bases :mod:`bsi.method.bases`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, overload

import torch
from torch import nn

from bsi.config import CompressConfig
from bsi.data.batches import batch_tokens
from bsi.errors import BSIError
from bsi.method.bases import InputStatistics, whitened_bases_by
from bsi.method.curvature import (
    Batch,
    CurvatureSource,
    GradientOnly,
    LossFn,
    NothingToMeasure,
    curvature_source,
    evaluation_mode,
    inside_pool,
)
from bsi.method.engine_state import RoundCheckpoint, RoundCounters, process_tensors
from bsi.method.layers import BasisLinear, SigmaGradientRecorder
from bsi.method.schedule import (
    LayerShape,
    cut_caps,
    even_share,
    mass_selection,
    parameters_after,
    path_budgets,
    select_to_budget,
    smallest_within,
    widen_pools,
)
from bsi.method.scores import candidate_pool, eps_rule, get_score, kept_positions
from bsi.method.surgery import (
    basis_layers,
    compressible_linear_names,
    compressible_parameters,
    freeze_all_but_coefficients,
    model_parameters,
    sigma_max,
    to_basis_form,
)
from bsi.reports import LayerRound, RoundReport, StepReport

Reducer = Callable[[torch.Tensor], torch.Tensor]

HALF_PRECISION_MIN_EPS = 0.05
"""Smallest eps at which finite differences of bf16/fp16 gradients stay meaningful.

Measured on the tiny model (sigma multiplied in fp32, 8 probes): the curvature
term in bf16 differs from fp32's by 1.7% at eps 0.1 (the rule's value in bf16),
11% at 0.01 and 69% at 0.001. Below this the engine uses exact Hessian-vector
products instead, and says so in the run's notes."""


def slice_optimizer_state(optimizer: torch.optim.Optimizer, param: nn.Parameter, keep: torch.Tensor) -> None:
    """After ``param.data = param.data[keep]``, slice its per-element optimizer state the same way."""
    state = optimizer.state.get(param)
    if not state:
        return
    for key, value in list(state.items()):
        if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] != param.shape[0]:
            state[key] = value[keep.to(value.device)].contiguous()


@overload
def _cpu_copy(tensor: torch.Tensor) -> torch.Tensor: ...


@overload
def _cpu_copy(tensor: None) -> None: ...


def _cpu_copy(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """A detached float32 copy on the CPU, for a round's report (None stays None)."""
    return None if tensor is None else tensor.detach().float().cpu()


@dataclass
class _LayerStats:
    """Running sums over a round's profiling batches for one layer."""

    grad: torch.Tensor  # (r,) sum of dl/dsigma
    curvature: torch.Tensor  # (r,) sum of curvature estimates
    pool: torch.Tensor  # (p,) candidate positions
    grad_squares: torch.Tensor | None  # (r,) sum of the batches' gradient variances; None once a batch lacked them


@dataclass
class RoundSums:
    """One round's statistics so far, in one place: per-layer sums and how many batches went into them.

    The round's tuning steps add their per-example gradients (score window
    ``round``) before the candidate pools exist; the first profiling step
    chooses the pools (``profiling`` True from then on) and the profiling
    steps add theirs. ``losses`` are the tuning steps' losses.
    """

    layers: dict[str, _LayerStats]
    gradient_batches: int = 0  # batches in the gradient sums
    curvature_batches: int = 0  # batches in the curvature sums
    losses: list[float] = field(default_factory=list)
    profiling: bool = False


@dataclass
class LayerScores:
    """One layer's scores for the round now ending (tensors on the model's device)."""

    sigma: torch.Tensor  # (r,) the coefficients as tuned
    grad: torch.Tensor | None  # (r,) mean dl/dsigma over the round's batches; None when the score does not read it
    curvature: torch.Tensor | None  # (r,) mean curvature estimate; None when the score does not read it
    terms: dict[str, torch.Tensor]  # the score's terms, each (r,)
    importance: torch.Tensor  # (r,) their sum: the predicted loss increase of dropping each basis
    pool: torch.Tensor  # (p,) the candidate positions this round may remove


@dataclass
class RoundScores:
    """A round's scores, before its cut (:meth:`Compressor.score_round`).

    ``layers[name]`` is each layer's :class:`LayerScores`; ``budget`` is the
    round's ``(parameters, measure)`` (None in size mode keep) and ``caps``
    the most bases each layer may lose.
    """

    layers: dict[str, LayerScores]
    budget: tuple[int, str] | None
    caps: dict[str, int] | None
    significant: tuple[int, int]  # pool bases whose first-order term passed the test, pool bases tested

    @property
    def importance(self) -> dict[str, torch.Tensor]:
        """(r,) float32 CPU importance of every layer."""
        return {n: st.importance.cpu() for n, st in self.layers.items()}

    @property
    def pools(self) -> dict[str, torch.Tensor]:
        """(p,) int64 CPU candidate positions of every layer."""
        return {n: st.pool.cpu() for n, st in self.layers.items()}


class Compressor:
    """Runs the pruning rounds on one model; iterate :meth:`run` to drive it.

    Saving and continuing a run between rounds (``state_dict``, ``load_state_dict``)
    hands the engine's parts to a :class:`~bsi.method.engine_state.RoundCheckpoint`,
    which holds the format, apart from the algorithm.

    Args:
        model: a causal LM (converted to Basel form by :meth:`run` if it is not yet).
        batches: an iterator of mini-batches (dicts accepted by the losses).
        config: the schedule and scoring settings.
        loss_fn: ``loss_fn(model, batch) -> scalar``, the task loss whose
            increase the scores predict (profiling, calibration, monitoring).
            The ``fisher`` curvature also needs ``loss_fn.count(batch)`` and
            ``mc-fisher`` ``loss_fn.sampled(model, batch, generator)``
            (see :class:`bsi.pipeline.losses.AnswerTokenLoss`).
        train_loss_fn: the loss of the tuning steps (default ``loss_fn``; the
            pipeline passes a distillation loss here when asked to).
        compute_dtype: dtype the layers compute in (for the eps rule and the
            curvature source's safety check).
        reduce: sums a tensor across processes (identity on one process); used
            for the calibration statistics and the profiling sums, so every
            rank converts and prunes alike.
        seed: seed of the auxiliary vectors' random start (the same on every
            process) and, by default, of the probes.
        probe_seed: seed of the probe generator (default ``seed``); give
            each process its own so that its probes are independent extra probes.
        convert_layers: writes the model's layers in the Basel form, with the
            signature of :func:`~bsi.method.surgery.to_basis_form` (the default);
            under FSDP the pipeline passes one that shards each block as it goes.
        prune_layer: ``prune_layer(layer, positions)`` keeps only those bases
            (default :meth:`BasisLinear.keep`); under FSDP, one that re-shards them.
        before_cut: called as ``before_cut(compressor, scores, pruned)`` at the end of
            every round, after scoring and choosing and before anything is removed: the
            model still has every basis, so a caller can measure other cuts of the same
            size (:mod:`bsi.analysis.ranking`) or keep a copy. It must leave the model as it found it.
    """

    def __init__(
        self,
        model: nn.Module,
        batches: Iterator[Batch],
        config: CompressConfig,
        loss_fn: LossFn,
        *,
        train_loss_fn: LossFn | None = None,
        compute_dtype: torch.dtype | None = None,
        reduce: Reducer | None = None,
        seed: int = 0,
        probe_seed: int | None = None,
        convert_layers: Callable[..., dict[str, BasisLinear]] = to_basis_form,
        prune_layer: Callable[[BasisLinear, torch.Tensor], None] = BasisLinear.keep,
        before_cut: Callable[[Compressor, RoundScores, dict[str, torch.Tensor]], None] | None = None,
    ) -> None:
        self.model = model
        self.batches = batches
        self.config = config
        self.loss_fn = loss_fn
        self.train_loss_fn = train_loss_fn or loss_fn
        self.score = get_score(config.score)
        self.reduce = reduce or (lambda t: t)
        self.compute_dtype = compute_dtype
        self.seed = seed
        self.generator = torch.Generator().manual_seed(seed if probe_seed is None else probe_seed)
        self.convert_layers, self.prune_layer, self.before_cut = convert_layers, prune_layer, before_cut
        self.notes: list[str] = []  # decisions the run's report should state (e.g. a switched curvature mode)
        self.iteration = 0  # pruning iterations done so far
        self.rounds_done = 0  # rounds closed so far
        self.skipped = 0
        self.layers: dict[str, BasisLinear] = {}
        self.names: list[str] = []
        self.factor_start = 0  # factor parameters of the layers at full rank (start of the gradual budgets)
        self.dense_before = 0
        self.eps = float("nan")
        self._round: RoundSums | None = None  # the statistics of the round in progress
        self._monitor: Batch | None = None
        self._start = time.perf_counter()
        if config.rounds < len(config.size.sizes):
            raise BSIError(f"{config.rounds} rounds cannot reach {len(config.size.sizes)} sizes ({len(config.size.stops)} "
                           f"stops and the target): give at least {len(config.size.sizes)} rounds")
        if not compressible_linear_names(model) and not basis_layers(model):
            raise BSIError(f"{type(model).__name__} has no nn.Linear layers to compress (only embeddings or custom layers)")
        if basis_layers(model):  # converted already (by the caller, or a notebook)
            self._adopt(basis_layers(model))

    # --------------------------------------------------------- checkpoints
    @property
    def at_round_boundary(self) -> bool:
        """True between rounds: no profiling statistics are half-accumulated."""
        return self.converted and self._round is None and self.steps_into_round == 0

    def counters(self) -> RoundCounters:
        """Where the run stands (the plain part of a checkpoint)."""
        return RoundCounters(iteration=self.iteration, skipped=self.skipped, eps=self.eps,
                             dense_before=self.dense_before, factor_start=self.factor_start, notes=self.notes)

    def state_dict(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Everything needed to continue this run: ``(tensors, plain JSON values)`` (a :class:`RoundCheckpoint`).

        Only valid between rounds (see :attr:`at_round_boundary`): the layers'
        current bases, coefficients and auxiliary vectors, the optimizer's
        moments, the probe generator, the monitor batch and the counters.
        """
        if not self.at_round_boundary:
            raise RuntimeError("Compressor state can only be saved between rounds")
        checkpoint = RoundCheckpoint.take(layers=self.layers, optimizer=self.optimizer, generator=self.generator,
                                          monitor=self._monitor, counters=self.counters(),
                                          settings=self.config.to_dict())
        return checkpoint.tensors, checkpoint.plain

    def process_state(self) -> dict[str, torch.Tensor]:
        """The part of :meth:`state_dict` that is this process's own: the probe generator and the monitor batch."""
        return process_tensors(self.generator, self._monitor)

    def load_state_dict(self, tensors: dict[str, torch.Tensor], plain: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`: the layers are rebuilt at the saved ranks (no SVD, no calibration)."""
        checkpoint = RoundCheckpoint(tensors, plain)
        rebuild = not self.converted
        if rebuild:  # written in the saved bases (and sharded as it goes, under FSDP)
            def bases(name: str, linear: nn.Linear) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
                return checkpoint.saved_bases(name, linear.weight)

            names = sorted(checkpoint.layer_names(), key=compressible_linear_names(self.model).index)
            self._adopt(self.convert_layers(self.model, aux_rank=self.config.aux_rank, seed=self.seed,
                                            names=names, bases=bases))
        counters, self._monitor = checkpoint.restore(layers=self.layers, optimizer=self.optimizer,
                                                     generator=self.generator, device=self.device,
                                                     bases_restored=rebuild, current=self.counters())
        self.iteration, self.skipped, self.eps = counters.iteration, counters.skipped, counters.eps
        self.dense_before, self.factor_start, self.notes = counters.dense_before, counters.factor_start, counters.notes
        self.rounds_done = self.iteration // self.config.round_length  # saved between rounds only
        self._round = None

    # --------------------------------------------------------- conversion
    @property
    def converted(self) -> bool:
        return bool(self.layers)

    def convert(self, known_bases: Callable[[str, nn.Linear], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
                | None = None) -> Iterator[StepReport]:
        """Write every compressible layer in the Basel form; with whitened bases, calibrate first.

        Whitened bases need the covariance of each layer's inputs: the first
        ``calibration_batches`` batches run forward (no gradient), yielding a
        ``calibrate`` StepReport each. Summed across processes, so every rank
        computes the same bases.

        ``known_bases``: each layer's bases as an earlier conversion of the
        same model made them (:mod:`bsi.pipeline.bases_cache`); the
        calibration batches are then drawn and left unused, so the batches
        after them are the ones a conversion from scratch would leave.
        """
        cfg = self.config
        bases = None
        if known_bases is not None:
            for _ in range(cfg.calibration_batches if cfg.bases == "whitened" else 0):
                next(self.batches)
            bases = known_bases
        elif cfg.bases == "whitened":
            modules = {n: self.model.get_submodule(n) for n in compressible_linear_names(self.model)}
            stats = InputStatistics(modules)
            with stats, evaluation_mode(self.model), torch.no_grad():
                for step in range(1, cfg.calibration_batches + 1):
                    batch = next(self.batches)
                    stats.start_batch(batch.get("attention_mask"))
                    loss = float(self.loss_fn(self.model, batch))
                    yield StepReport("calibrate", step, cfg.calibration_batches, loss, self._elapsed())
            stats.reduce(self.reduce)
            bases = whitened_bases_by(stats.covariance(), cfg.whitening_damping)
        self._adopt(self.convert_layers(self.model, aux_rank=cfg.aux_rank, seed=self.seed, bases=bases))

    def _adopt(self, layers: dict[str, BasisLinear]) -> None:
        """Take over converted layers: trainable flags, sizes, eps, optimizer, curvature source."""
        cfg = self.config
        self.layers = layers
        self.names = list(layers)
        first = next(iter(layers.values()))
        self.device = first.sigma.device
        self.compute_dtype = self.compute_dtype or first.U.dtype
        freeze_all_but_coefficients(self.model, layers.values())
        _, self.dense_before = compressible_parameters(self.model)
        self.factor_start = sum(layer.factor_parameters() for layer in layers.values())
        probes = cfg.hutchinson  # the perturbation's settings (used by the hutchinson curvature only)
        self.eps = probes.eps if probes.eps is not None else eps_rule(
            sigma_max(self.model), self.compute_dtype, probes.eps_alpha, probes.eps_max, probes.eps_floor)
        self.optimizer = self._make_optimizer()
        self.source = self._curvature_source()

    def _make_optimizer(self) -> torch.optim.Optimizer:
        groups = [{"params": [layer.sigma for layer in self.layers.values()], "lr": self.config.lr}]
        aux = [p for layer in self.layers.values() for p in (layer.aux_u, layer.aux_v) if p.numel()]
        if aux:
            groups.append({"params": aux, "lr": self.config.aux_lr})
        return torch.optim.AdamW(groups, weight_decay=0.0)

    def _curvature_source(self) -> CurvatureSource:
        """What each profiling step measures: only what the score reads (see :class:`~bsi.method.scores.Score`)."""
        cfg = self.config
        if not self.score.needs_gradient:
            return NothingToMeasure()
        if not self.score.needs_curvature:
            return GradientOnly()
        probes = cfg.hutchinson
        method = probes.hessian_method
        half = self.compute_dtype in (torch.bfloat16, torch.float16)
        if cfg.curvature == "hutchinson" and method == "fd" and half and self.eps < HALF_PRECISION_MIN_EPS:
            method = "hvp"
            self.notes.append(
                f"curvature: finite differences at eps {self.eps:.3g} of gradients computed in "
                f"{str(self.compute_dtype).removeprefix('torch.')} are dominated by round-off (below "
                f"{HALF_PRECISION_MIN_EPS:g}); using exact Hessian-vector products (hessian_method hvp) instead")
        return curvature_source(cfg.curvature, eps=self.eps, scope=probes.probe_scope, method=method,
                                probes=probes.probes_per_batch, center=probes.center_gradient)

    # ------------------------------------------------------------------ loop
    @property
    def total_iterations(self) -> int:
        return self.config.round_length * self.config.rounds

    def run(self) -> Iterator[StepReport | RoundReport]:
        """Algorithm 1, round after round: tune, profile, score, select, cut, report.

        Converts the model first if needed. Each round has ``round_length``
        iterations: the first ``round_length - profiling_iters`` tune sigma
        and the auxiliary vectors (:meth:`_train_step`), the rest profile
        gradients and curvature on the round's candidate pools
        (:meth:`_profile_step`); then :meth:`_close_round` scores every basis
        (:meth:`score_round`), chooses the cut (:meth:`select`), removes it
        and reports. Yields a StepReport per iteration and a RoundReport per
        round; a run stopped inside a round continues where it stood.
        """
        cfg = self.config
        if not self.converted:
            yield from self.convert()
        if self._monitor is None:
            self._monitor = next(self.batches)  # a fixed batch: the loss before and after each cut
        total, tuning_steps = self.total_iterations, cfg.round_length - cfg.profiling_iters
        while self.iteration < total:
            while self.steps_into_round < tuning_steps:  # 1. tune
                yield self._train_step(self._next_batch(), total)
            while self.steps_into_round < cfg.round_length:  # 2. profile
                yield self._profile_step(self._next_batch(), total)
            yield self._close_round()  # 3-6. score, select, cut, report

    @property
    def steps_into_round(self) -> int:
        """Iterations of the round in progress done so far (0 between rounds)."""
        return self.iteration - self.rounds_done * self.config.round_length

    def _next_batch(self) -> Batch:
        """Count one more iteration and take its batch."""
        self.iteration += 1
        return next(self.batches)

    def _sums(self) -> RoundSums:
        """The round's statistics, begun at its first step (empty sums, no pools yet)."""
        if self._round is None:
            self._round = RoundSums(self._empty_stats({n: torch.empty(0, dtype=torch.long) for n in self.names}))
        return self._round

    def _check_skips(self) -> None:
        if self.skipped > self.config.max_skipped_batches:
            raise BSIError(
                f"{self.skipped} batches gave a non-finite loss or gradient (limit "
                f"max_skipped_batches={self.config.max_skipped_batches}); lower the learning rate or check the data/model dtype"
            )

    @property
    def _scores_tuning_steps(self) -> bool:
        """score_window round: the tuning steps' per-example gradients join the round's sums."""
        return self.config.score_window == "round" and self.score.needs_gradient

    def _train_step(self, batch: Batch, total: int) -> StepReport:
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        layers = [self.layers[n] for n in self.names]
        with SigmaGradientRecorder().attach(layers if self._scores_tuning_steps else []) as recorder:
            loss = self.train_loss_fn(self.model, batch)
            # Backward even for a non-finite loss: under several processes the gradient
            # hooks all-reduce, so every rank must take part (its NaN then makes every
            # rank skip this step together). Alone, the step is skipped as before.
            if loss.requires_grad:
                loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
        grads = [p.grad for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]
        checks = [torch.isfinite(loss).all()] + [torch.isfinite(g).all() for g in grads]
        finite = bool(torch.stack(checks).all())  # one host-device sync, not one per tensor
        if finite:
            if self._scores_tuning_steps:
                self._add_tuning_statistics(recorder, batch)
            self.optimizer.step()
            self._sums().losses.append(float(loss.detach()))
        else:
            self.skipped += 1
            self._check_skips()
        self.optimizer.zero_grad(set_to_none=True)
        return StepReport("train", self.iteration, total, float(loss.detach()), self._elapsed(), skipped=not finite,
                          tokens=batch_tokens(batch))

    def _empty_stats(self, pools: dict[str, torch.Tensor]) -> dict[str, _LayerStats]:
        """Zero gradient, curvature and variance sums (r,) float32 per layer, with the given pools."""
        def zeros(n: str) -> torch.Tensor:
            return torch.zeros_like(self.layers[n].sigma, dtype=torch.float32)

        return {n: _LayerStats(zeros(n), zeros(n), pools[n], zeros(n)) for n in self.names}

    def _add_tuning_statistics(self, recorder: SigmaGradientRecorder, batch: Batch) -> None:
        """Add a tuning step's per-example sigma-gradients to the round's sums (before sigma moves).

        The gradient is that of the tuning loss (the task loss, or task plus
        distillation); the Fisher curvature is ``N * sum_b g_b^2`` as in
        :class:`~bsi.method.curvature.Fisher`, with ``N`` the batch's loss terms.
        """
        fisher = self.score.needs_curvature and self.source.name == "fisher"
        count = self.loss_fn.count(batch) if fisher else 0  # type: ignore[attr-defined]  # fisher's loss has .count
        sums = self._sums()
        for n in self.names:
            layer, stats = self.layers[n], sums.layers[n]
            squares = recorder.squares(layer).float()
            stats.grad.add_(recorder.gradient(layer).float())
            assert stats.grad_squares is not None, "only a profiling step, after the tuning steps, drops the variances"
            stats.grad_squares.add_(squares)
            if fisher:
                stats.curvature.add_(squares * count)
        sums.gradient_batches += 1
        sums.curvature_batches += int(fisher)

    def _profile_step(self, batch: Batch, total: int) -> StepReport:
        sums = self._sums()
        if not sums.profiling:
            self._open_round(sums)
        layers = [self.layers[n] for n in self.names]
        pools = [sums.layers[n].pool for n in self.names]
        with evaluation_mode(self.model):
            result = self.source.profile(self.model, layers, pools, batch, self.loss_fn, self.generator)
        if result is None:
            self.skipped += 1
            self._check_skips()
            return StepReport("profile", self.iteration, total, float("nan"), self._elapsed(), skipped=True)
        for i, name in enumerate(self.names):
            stats = sums.layers[name]
            if result.grads is not None:
                stats.grad.add_(result.grads[i])
            if result.curvatures is not None:
                stats.curvature.add_(result.curvatures[i])
            if result.grad_squares is None:
                stats.grad_squares = None
            elif stats.grad_squares is not None:
                stats.grad_squares.add_(result.grad_squares[i])
        sums.gradient_batches += 1
        sums.curvature_batches += result.curvatures is not None
        return StepReport("profile", self.iteration, total, result.loss, self._elapsed())

    # -------------------------------------------------------------- rounds
    @property
    def round_index(self) -> int:
        """1-based index of the round the current iteration belongs to."""
        return (max(self.iteration, 1) - 1) // self.config.round_length + 1

    def shapes(self) -> dict[str, LayerShape]:
        return {n: LayerShape(layer.in_features, layer.out_features, layer.rank, layer.aux_rank,
                              layer.bias is not None) for n, layer in self.layers.items()}

    def round_budget(self, round_index: int) -> tuple[int, str] | None:
        """Size mode target: ``(parameters, measure)`` allowed after round t (None in size mode keep).

        The budgets of :func:`bsi.method.schedule.path_budgets`: shrinking
        evenly from the full-rank factors, and landing on the stored size
        ``ratio * dense`` of each stop and of ``target_ratio`` at the end of
        the rounds that reach them.
        """
        plan = self._path()
        return None if plan is None else plan[round_index - 1][:2]

    def round_stop(self, round_index: int) -> float | None:
        """The size (a stop or ``target_ratio``) that round t lands on, or None for a round in between."""
        plan = self._path()
        if plan is None:
            return self.config.size.ratio if round_index == self.config.rounds else None
        stop = plan[round_index - 1][2]
        return None if stop is None else self.config.size.sizes[stop]

    def _path(self) -> list[tuple[int, str, int | None]] | None:
        size = self.config.size
        if size.mode != "target":
            return None
        return path_budgets(self.factor_start, [round(self.dense_before * r) for r in size.sizes], self.config.rounds)

    def _pools(self, rho: float) -> dict[str, torch.Tensor]:
        return {n: candidate_pool(self.layers[n].sigma, rho).to(self.device) for n in self.names}

    def _open_round(self, sums: RoundSums | None = None) -> dict[str, _LayerStats]:
        """Choose the round's candidate pools (from the tuned sigma), widened if its budget needs it.

        The tuning steps' sums (score window ``round``) carry over; their
        curvature only where profiling measures it too: inside the pools, or
        everywhere for a source that measures every basis (the Fisher).
        Returns the per-layer sums, pools set (benchmarks profile from here).
        """
        sums = self._sums() if sums is None else sums
        rho = self.config.pool_rho
        budget = self.round_budget(self.round_index)
        if budget is not None:
            rho = widen_pools(rho, lambda r: {n: p.cpu() for n, p in self._pools(r).items()}, self.shapes(), *budget)
        pools = self._pools(rho)
        everywhere = self.source.measures_every_basis  # else the probes measure the pool only: keep the sums alike
        for n in self.names:
            tuned = sums.layers[n]
            curvature = tuned.curvature if everywhere else inside_pool(tuned.curvature, pools[n])
            sums.layers[n] = _LayerStats(tuned.grad, curvature, pools[n], tuned.grad_squares)
        sums.profiling = True
        return sums.layers

    @torch.no_grad()
    def _monitor_loss(self) -> float:
        """The task loss on the fixed monitor batch, averaged over processes (eval mode)."""
        assert self._monitor is not None, "run() takes the monitor batch before the first round"
        with evaluation_mode(self.model):
            loss = self.loss_fn(self.model, self._monitor).detach().float().reshape(1)
        return float(self.reduce(loss.to(self.device)) / self.reduce(torch.ones(1, device=self.device)))

    def score_round(self) -> RoundScores:
        """Every layer's score for the round now ending, from the sums of its batches (no model change).

        Per layer: sigma, the mean gradient and curvature over the round's
        batches (when the score reads them), the score's terms and their sum,
        the importance, and the candidate pool; plus the round's size budget
        and per-layer caps, so that :meth:`select` (or a study of other cuts
        of the same size, :mod:`bsi.analysis.ranking`) can choose bases.
        """
        assert self._round is not None and self._round.profiling, "score_round ends a round that has profiled"
        sums, cfg = self._round, self.config
        count = float(self.reduce(torch.tensor(float(sums.gradient_batches), device=self.device)))
        curvature_count = float(self.reduce(torch.tensor(float(sums.curvature_batches), device=self.device)))
        if count == 0 and self.score.needs_gradient:
            raise BSIError("every profiling batch of this round was skipped for non-finite values; nothing to score")
        stats: dict[str, LayerScores] = {}
        tested = [0, 0]  # pool bases whose first-order term passed the test, pool bases tested
        for n in self.names:
            s = sums.layers[n]
            sigma = self.layers[n].sigma.detach().float()
            grad = self.reduce(s.grad) / count if self.score.needs_gradient else None  # (r,) mean over all batches
            curvature = self.reduce(s.curvature) / max(curvature_count, 1.0) if self.score.needs_curvature else None
            # standard error of the mean gradient: summed batch variances / count^2
            grad_se = (self.reduce(s.grad_squares).sqrt() / count
                       if self.score.tests_gradient and s.grad_squares is not None else None)
            terms = self.score.terms(sigma, grad, curvature, grad_se=grad_se, gradient_z=cfg.gradient_z)
            importance = sum(terms.values())
            assert isinstance(importance, torch.Tensor), "a score has at least one term"
            stats[n] = LayerScores(sigma, grad, curvature, terms, importance, s.pool)
            if grad_se is not None and cfg.gradient_z > 0:
                kept = terms["gradient"][s.pool] != 0
                tested[0] += int(kept.sum())
                tested[1] += s.pool.numel()
        ranks = {n: self.layers[n].rank for n in self.names}
        budget = self.round_budget(self.round_index)
        if budget is None:
            caps = cut_caps(ranks, 1 - cfg.keep_per_round, cfg.max_cut_factor)
        else:
            now = parameters_after(self.shapes(), {n: stats[n].pool[:0].cpu() for n in self.names}, budget[1])
            caps = cut_caps(ranks, even_share(now, budget[0]), cfg.max_cut_factor)
        return RoundScores(stats, budget, caps, (tested[0], tested[1]))

    def select(self, scores: RoundScores, importance: Mapping[str, torch.Tensor] | None = None,
               rule: str | None = None) -> dict[str, torch.Tensor]:
        """The pool positions this round removes, per layer: under the round's budget and caps.

        By default with the round's own importance and selection rule (and
        ``within_layer``); ``importance`` and ``rule`` (``mass`` or
        ``global``) choose another cut of the same size, e.g. by magnitude.
        """
        cfg = self.config
        values = scores.importance if importance is None else {n: v.cpu() for n, v in importance.items()}
        pools = scores.pools
        if scores.budget is None:
            pruned = mass_selection(values, pools, cfg.keep_per_round, scores.caps)
        else:
            pruned = select_to_budget(self.shapes(), values, pools, scores.budget[0], scores.budget[1],
                                      rule or cfg.selection_rule, scores.caps)
        if importance is None and rule is None and cfg.within_layer == "magnitude":
            pruned = smallest_within(pruned, {n: scores.layers[n].sigma.abs().cpu() for n in self.names}, pools)
        return pruned

    def _close_round(self) -> RoundReport:
        """Score, choose, (let ``before_cut`` look), cut, and report the round."""
        cfg = self.config
        scores = self.score_round()
        pruned = self.select(scores)
        if self.before_cut is not None:
            self.before_cut(self, scores, pruned)
        stats, pools, tested = scores.layers, scores.pools, scores.significant
        loss_before = self._monitor_loss()
        reports = []
        for n in self.names:
            layer, st = self.layers[n], stats[n]
            before, ids = layer.rank, layer.basis_ids.clone()
            keep = kept_positions(before, pruned[n]).to(self.device)
            if keep.numel() < before:
                self.prune_layer(layer, keep)
                slice_optimizer_state(self.optimizer, layer.sigma, keep)
            reports.append(LayerRound(
                name=n, basis_ids=ids.cpu(), sigma=_cpu_copy(st.sigma), grad=_cpu_copy(st.grad),
                hessian=_cpu_copy(st.curvature), importance=_cpu_copy(st.importance),
                terms={k: _cpu_copy(v) for k, v in st.terms.items()}, pool=pools[n], pruned=pruned[n].cpu(),
                rank_before=before, rank_after=layer.rank, params_after=layer.stored_parameters(),
                in_features=layer.in_features, out_features=layer.out_features, aux_rank=layer.aux_rank,
                bias=layer.bias is not None,
            ))
        loss_after = self._monitor_loss()
        now, _ = compressible_parameters(self.model)
        assert self._round is not None, "the round closes here"
        losses = self._round.losses
        mean_loss = sum(losses) / len(losses) if losses else float("nan")
        report = RoundReport(
            round=self.round_index, total_rounds=cfg.rounds, layers=tuple(reports),
            params_total=model_parameters(self.model), params_compressible=now,
            compressible_before=self.dense_before, eps=self.eps, mean_loss=mean_loss,
            skipped_batches=self.skipped, elapsed=self._elapsed(),
            removed=sum(r.rank_before - r.rank_after for r in reports), loss_before=loss_before,
            loss_after=loss_after, curvature=self.source.name, score=self.score.name,
            curvature_scope=("all" if self.source.measures_every_basis else "pool") if self.score.needs_curvature else "",
            significant_gradients=tested[0] / tested[1] if tested[1] else float("nan"),
            stop=self.round_stop(self.round_index),
        )
        self._round = None
        self.rounds_done += 1
        return report

    def _elapsed(self) -> float:
        return time.perf_counter() - self._start
