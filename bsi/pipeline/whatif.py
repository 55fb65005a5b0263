"""What-if cuts measured: a round's model with a planned cut, its held-out loss and answers, and eps on one layer.

:mod:`bsi.analysis.whatif` plans a cut of the whole model from one round's
scores (a pure function, milliseconds). This module measures it, as the run
measures its models (:func:`bsi.pipeline.evaluate.evaluate`): the round's
model is rebuilt (:class:`~bsi.analysis.ranking.RoundSnapshots`), the cut's
coefficients set to zero, the model merged into dense layers
(:class:`DenseCopy`) and scored on held-out problems, a few of them answered.
:class:`WhatIf` holds one run's rounds and keeps every measurement;
:class:`EpsStudy` estimates one layer's curvature by Hutchinson's method at
any eps, beside the Fisher and the exact diagonal.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from bsi.analysis.ranking import removed, spearman
from bsi.analysis.stats import Interval, Outcomes, paired_difference
from bsi.analysis.whatif import RANK_LABELS, WhatIfCut, WhatIfScores, path_cut, path_predicted, plan_cut
from bsi.errors import BSIError
from bsi.method.curvature import Fisher, Hutchinson, exact_hessian_diagonal, profile_batch
from bsi.method.surgery import basis_layers, replace_module
from bsi.pipeline.evaluate import evaluate  # the run's own evaluation: the same losses and answers
from bsi.reports import RoundReport


@dataclass(frozen=True)
class Answer:
    """One held-out problem answered greedily: the question, the task's answer, the model's, and whether it is right."""

    question: str
    reference: str
    prediction: str
    correct: bool | None


@dataclass(frozen=True)
class Measurement:
    """A model measured on held-out problems: its answer-token loss, a few greedy answers, and the time it took."""

    loss: float  # token-weighted answer-token cross-entropy over ``problems`` problems
    problems: int
    answers: tuple[Answer, ...]
    seconds: float
    outcomes: Outcomes  # per problem: the loss sum and tokens (and right or wrong where answered)

    def loss_minus(self, other: Measurement) -> Interval:
        """This loss minus ``other``'s on the same problems, with its paired bootstrap 95% interval."""
        return paired_difference([self.outcomes], [other.outcomes], "loss")


def measure_model(model: nn.Module, tokenizer: Any, examples: Sequence[Any], *, answered: int = 3,
                  batch_size: int = 16, max_new_tokens: int = 48) -> Measurement:
    """The model as it is: loss on every problem of ``examples``, greedy answers to the first ``answered``.

    One call of :func:`bsi.pipeline.evaluate.evaluate`: the loss passes are
    batched, the answers decoded after the part of the task's answer the
    model already predicts (the same answers as plain greedy decoding).
    """
    start = time.perf_counter()
    evaluation = evaluate(model, tokenizer, examples, answered=answered, batch_size=batch_size,
                          max_new_tokens=max_new_tokens)
    answers = tuple(Answer(e.question, e.answer, o.prediction or "", o.correct)
                    for e, o in zip(examples[:answered], evaluation.outcomes[:answered]))
    return Measurement(evaluation.metrics.loss, len(examples), answers, time.perf_counter() - start,
                       Outcomes.from_columns(evaluation.columns()))


def measure_cut(model: nn.Module, pruned: Mapping[str, torch.Tensor], tokenizer: Any, examples: Sequence[Any],
                **options: Any) -> Measurement:
    """:func:`measure_model` with the bases at ``pruned`` removed (``sigma_i = 0``); the model is left as found.

    ``model`` must have the active bases the cut's positions refer to: the
    run's model at the round the cut was planned from (before its own cut).
    Setting a coefficient to zero computes exactly what removing the basis'
    columns computes (:meth:`~bsi.method.layers.BasisLinear.keep`), up to
    the order of floating-point sums. (:class:`DenseCopy` measures the same
    model merged into dense layers, which is faster while a layer keeps
    more than half its rank.)
    """
    layers = basis_layers(model)
    _check_layers(pruned, layers)
    with removed(layers, pruned):
        return measure_model(model, tokenizer, examples, **options)


def _check_layers(pruned: Mapping[str, torch.Tensor], layers: Mapping[str, Any]) -> None:
    unknown = sorted(set(pruned) - set(layers))
    if unknown:
        raise BSIError(f"the cut names layers this model does not have ({unknown[0]}, ...): plan it from this "
                       "model's round")


class DenseCopy:
    """A plain dense model that a round's model, cut or not, is written into before it is measured.

    A layer in the Basel form at rank ``r`` costs ``r (in + out)``
    multiply-adds per token, the dense layer ``in * out``: at a round's full
    rank the basis form is 1.4 to 2 times slower than the dense model (on
    the embedded model's shapes). A cut keeps most bases, so the fastest way
    to measure it is to merge each layer's kept bases into a dense weight,
    ``W = U diag(sigma * kept) V^T + U_aux V_aux^T`` (about half a second for
    the embedded model), and run the dense model: the same function up to
    the order of floating-point sums (tested). The copy is made once, from
    the first model written (its embeddings, norms and biases are the
    converted model's, which the rounds never train), and overwritten by each
    later one.
    """

    def __init__(self) -> None:
        self.model: nn.Module | None = None
        self.linears: dict[str, nn.Linear] = {}

    @torch.no_grad()
    def write(self, model: nn.Module, pruned: Mapping[str, torch.Tensor]) -> nn.Module:
        """This copy as ``model`` with the bases at ``pruned`` removed (``model`` is left as found)."""
        layers = basis_layers(model)
        _check_layers(pruned, layers)
        if self.model is None or set(self.linears) != set(layers):
            skeleton = copy.deepcopy(model)
            self.linears = {}
            for name, layer in basis_layers(skeleton).items():
                self.linears[name] = layer.to_linear()
                replace_module(skeleton, name, self.linears[name])
            self.model = skeleton.eval()
        with removed(layers, pruned):
            for name, layer in layers.items():
                self.linears[name].weight.copy_(layer.dense_weight())
        return self.model


@dataclass(frozen=True)
class MeasuredCut:
    """A cut and what it measured: the point a predicted-against-measured plot adds."""

    cut: WhatIfCut
    round: int
    label: str
    measurement: Measurement
    uncut: Measurement  # the same round's model with every basis, on the same problems

    @property
    def uncut_loss(self) -> float:
        return self.uncut.loss

    @property
    def measured(self) -> float:
        """The measured loss rise over the round's uncut model."""
        return self.measurement.loss - self.uncut.loss

    def rise(self) -> Interval:
        """The measured rise with its paired bootstrap 95% interval over the problems."""
        return self.measurement.loss_minus(self.uncut)


@dataclass(frozen=True)
class PathPoint:
    """The run's own model after one round's cut (the gradual schedule and its tuning, no recovery), measured."""

    round: int
    compressible_ratio: float
    compression: float  # whole model, times smaller than before compression
    predicted: float  # the run's predictions summed over its rounds so far (:func:`path_predicted`)
    measurement: Measurement
    rise: float  # measured loss over the first round's uncut model (where the run's predictions start)


class WhatIf:
    """One run's what-ifs: plan a cut of any round at once, measure it in seconds, compare with the run's own path.

    Holds the run's round records, and, to measure, what rebuilds the model of
    any round (a :class:`~bsi.analysis.ranking.RoundSnapshots`), the held-out
    problems and the tokenizer (and the dense model, for its answers). Plans
    need only the records; everything measured is kept, so asking again is
    free. One model is rebuilt at a time.

    Args:
        rounds: the run's :class:`~bsi.reports.RoundReport` objects, in order.
        snapshots: rebuilds the model of a round before its cut (None: plans only).
        examples: held-out problems the measurements score (not trained on).
        tokenizer: the run's tokenizer.
        dense: the run's fine-tuned dense model (None: no dense answers).
        answered: problems answered greedily per measurement (the rest are scored for the loss only).
    """

    def __init__(self, rounds: Sequence[RoundReport], snapshots: Any = None, examples: Sequence[Any] = (),
                 tokenizer: Any = None, dense: nn.Module | None = None, *, answered: int = 3,
                 max_new_tokens: int = 48, batch_size: int = 16) -> None:
        self.rounds = list(rounds)
        self.snapshots = snapshots
        self.examples = list(examples)
        self.tokenizer = tokenizer
        self.dense = dense
        self.options = {"answered": answered, "max_new_tokens": max_new_tokens, "batch_size": batch_size}
        self.points: list[MeasuredCut] = []  # every measurement so far, in order
        self._scores: dict[int, WhatIfScores] = {}
        self._uncut: dict[int, Measurement] = {}
        self._path: dict[int, PathPoint] = {}
        self._dense: Measurement | None = None
        self._model: tuple[int, nn.Module] | None = None
        self._dense_copy = DenseCopy()

    # ------------------------------------------------------------ instant
    @property
    def round_ids(self) -> list[int]:
        return [r.round for r in self.rounds]

    def report(self, round_index: int) -> RoundReport:
        for report in self.rounds:
            if report.round == round_index:
                return report
        raise BSIError(f"the run has no round {round_index}: choose one of {self.round_ids}")

    def scores(self, round_index: int) -> WhatIfScores:
        if round_index not in self._scores:
            self._scores[round_index] = WhatIfScores.from_round(self.report(round_index))
        return self._scores[round_index]

    def plan(self, round_index: int, rule: str, value: float, rank_by: str = "bsi", selection: str = "auto",
             seed: int = 0) -> WhatIfCut:
        """:func:`plan_cut` on round ``round_index``'s scores."""
        return plan_cut(self.scores(round_index), rule, value, rank_by, selection, seed)

    # ------------------------------------------------------------ measured
    @property
    def can_measure(self) -> bool:
        """Whether this run's round models can be rebuilt and measured (a run of this session, or prepared)."""
        return (self.snapshots is not None and bool(self.examples) and self.tokenizer is not None
                and all(r in self.snapshots.rounds for r in self.round_ids))

    def _check_measurable(self) -> None:
        if not self.can_measure:
            raise BSIError("this run's round models are not in memory (a saved run keeps no weights): prepare them "
                           "first, or run a compression")

    def model_at(self, round_index: int) -> nn.Module:
        """The run's model at the end of round ``round_index``, before its cut (rebuilt once, kept until another)."""
        self._check_measurable()
        if self._model is None or self._model[0] != round_index:
            self._model = None  # free the previous one first
            self._model = (round_index, self.snapshots.model_at(round_index))
        return self._model[1]

    def _measure(self, round_index: int, pruned: Mapping[str, torch.Tensor], answered: int | None = None) -> Measurement:
        """Round ``round_index``'s model with ``pruned`` removed, merged into dense layers and measured."""
        model = self._dense_copy.write(self.model_at(round_index), pruned)
        options = self.options if answered is None else {**self.options, "answered": answered}
        return measure_model(model, self.tokenizer, self.examples, **options)

    def uncut(self, round_index: int) -> Measurement:
        """Round ``round_index``'s model with every basis, measured once (its loss: no answers)."""
        if round_index not in self._uncut:
            self._uncut[round_index] = self._measure(round_index, {}, answered=0)
        return self._uncut[round_index]

    def dense_measurement(self) -> Measurement | None:
        """The fine-tuned dense model, measured once (None without it)."""
        if self._dense is None and self.dense is not None:
            self._dense = measure_model(self.dense, self.tokenizer, self.examples, **self.options)
        return self._dense

    def measure_only(self, cut: WhatIfCut, round_index: int) -> Measurement:
        """The cut model's loss and answers, nothing else (the first thing a user waits for)."""
        return self._measure(round_index, cut.pruned)

    def measure(self, cut: WhatIfCut, round_index: int, measurement: Measurement | None = None) -> MeasuredCut:
        """Measure ``cut`` (planned from round ``round_index``; ``measurement``: done already) and keep it as a point.

        The point's rise is over the same round's model with every basis,
        measured once per round.
        """
        measurement = measurement if measurement is not None else self.measure_only(cut, round_index)
        uncut = self.uncut(round_index)
        label = f"{RANK_LABELS[cut.rank_by]}, {cut.rule} {cut.value:g}, round {round_index}"
        point = MeasuredCut(cut, round_index, label, measurement, uncut)
        self.points.append(point)
        return point

    def path_point(self, round_index: int) -> PathPoint:
        """The run's own model after round ``round_index``'s cut, measured once."""
        if round_index not in self._path:
            report = self.report(round_index)
            start = self.uncut(self.round_ids[0]).loss  # first: it may rebuild the first round's model
            measurement = self._measure(round_index, path_cut(report), answered=0)
            scores = self.scores(round_index)
            self._path[round_index] = PathPoint(round_index, report.compressible_ratio,
                                                scores.parameters_before / max(report.params_total, 1),
                                                path_predicted(self.rounds, round_index), measurement,
                                                measurement.loss - start)
        return self._path[round_index]

    @property
    def path(self) -> list[PathPoint]:
        """The run's path points measured so far, in round order."""
        return [self._path[r] for r in sorted(self._path)]

    def measured_uncut(self) -> dict[int, Measurement]:
        return dict(self._uncut)


# ------------------------------------------------------------------ eps, one layer
@dataclass(frozen=True)
class EpsPoint:
    """Hutchinson's curvature of one layer at one eps, and what it changes against the Fisher's."""

    eps: float
    curvature: torch.Tensor  # (r,) the Hutchinson estimate, averaged over the batches and probes
    error: float  # relative error against the exact diagonal at the largest coefficients
    kept_changed: int  # bases the Hutchinson ranking keeps that the Fisher ranking does not (the same count kept)
    spearman: float  # rank correlation of the two importances over the layer
    seconds: float


class EpsStudy:
    """One layer of one round's model: Hutchinson's estimate at any eps, beside the Fisher and the exact diagonal.

    What the score reads for the layer's bases is ``I_i = gradient term +
    1/2 sigma_i^2 h_i``; only ``h`` depends on the curvature source. The
    Fisher ``h`` (free from per-example gradients, bsi's default) and the
    exact diagonal at the ``top`` largest coefficients (double backward, the
    ground truth) are computed once; :meth:`at` estimates ``h`` by symmetric
    perturbations of size ``eps`` (the paper's estimator) on the same batches
    and compares. Small eps: the two gradients differ by less than float32
    resolves (round-off grows like 1/eps); large eps: third-order terms enter
    (the error grows like eps^2). The layer's kept set is the ``keep`` most
    important bases under each estimate.

    Args:
        model: the round's model (before its cut), e.g. :meth:`WhatIf.model_at`.
        name: the layer.
        batches: a few task batches (the same for every estimate).
        loss_fn: the task loss.
        gradient_term: (r,) the round's first-order term for the layer (zeros for none).
        keep: bases the layer keeps (a cut's :attr:`WhatIfCut.kept` for it).
        top: coefficients whose exact diagonal is computed.
        probes: Rademacher probes per batch for each eps.
    """

    def __init__(self, model: nn.Module, name: str, batches: Sequence[dict], loss_fn: Any,
                 gradient_term: torch.Tensor, keep: int, *, top: int = 8, probes: int = 1, seed: int = 0) -> None:
        layers = basis_layers(model)
        if name not in layers:
            raise BSIError(f"the model has no layer '{name}': choose one of its {len(layers)} layers")
        if not batches:
            raise BSIError("the eps study needs at least one batch")
        self.model, self.name, self.layer = model, name, layers[name]
        self.batches, self.loss_fn, self.probes, self.seed = list(batches), loss_fn, probes, seed
        self.sigma = self.layer.sigma.detach().float().cpu()  # (r,)
        self.gradient_term = gradient_term.float().cpu()
        self.keep = max(0, min(int(keep), self.sigma.numel()))
        self.every = torch.arange(self.sigma.numel())
        start = time.perf_counter()
        self.fisher = self._mean_curvature(Fisher(), None)  # (r,)
        self.top = torch.argsort(self.sigma.abs(), descending=True)[: max(1, top)].sort().values  # (k,)
        exact = [exact_hessian_diagonal(model, [self.layer], [self.top], b, loss_fn)[0] for b in self.batches]
        self.exact = torch.stack(exact).mean(0).float()  # (k,)
        self.setup_seconds = time.perf_counter() - start
        self.fisher_error = self.relative_error(self.fisher)
        self.points: dict[float, EpsPoint] = {}

    def _mean_curvature(self, source: Any, generator: torch.Generator | None) -> torch.Tensor:
        """(r,) the layer's curvature from ``source``, averaged over the study's batches (as the engine profiles)."""
        total = torch.zeros(self.sigma.numel())
        for n, batch in enumerate(self.batches):
            result = profile_batch(self.model, [self.layer], [self.every], batch, self.loss_fn, source=source,
                                   generator=generator)
            if result is None or result.curvatures is None:
                raise BSIError(f"batch {n} gave a non-finite loss or gradient; the eps study needs other batches")
            total += result.curvatures[0].detach().float().cpu()
        return total / len(self.batches)

    def relative_error(self, curvature: torch.Tensor) -> float:
        """``||h[top] - exact|| / ||exact||`` for an estimate ``h`` (r,)."""
        return float((curvature[self.top] - self.exact).norm() / self.exact.norm().clamp_min(1e-30))

    def importance(self, curvature: torch.Tensor) -> torch.Tensor:
        """(r,) the score with curvature ``curvature``: the gradient term plus ``1/2 sigma^2 h``."""
        return self.gradient_term + 0.5 * self.sigma**2 * curvature

    def kept(self, curvature: torch.Tensor) -> set[int]:
        """The ``keep`` most important positions under ``curvature``."""
        order = torch.argsort(self.importance(curvature), descending=True, stable=True)
        return set(order[: self.keep].tolist())

    def at(self, eps: float) -> EpsPoint:
        """Hutchinson's estimate at ``eps`` on the study's batches (kept: asking again is free)."""
        if not 0 < eps < 1:
            raise BSIError(f"eps must be in (0, 1), got {eps:g}")
        if eps not in self.points:
            start = time.perf_counter()
            generator = torch.Generator().manual_seed(self.seed)
            curvature = self._mean_curvature(Hutchinson(eps=float(eps), scope="layer", probes=self.probes), generator)
            changed = len(self.kept(curvature) - self.kept(self.fisher))
            self.points[eps] = EpsPoint(float(eps), curvature, self.relative_error(curvature), changed,
                                        spearman(self.importance(curvature), self.importance(self.fisher)),
                                        time.perf_counter() - start)
        return self.points[eps]
