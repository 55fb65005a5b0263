"""The six compression methods, behind one interface, through one pipeline.

A *method* is a small object with a ``name``, a one-line ``description`` and
``compress(pipeline)``: a generator that turns ``pipeline.model`` (already
task-fine-tuned) into a model of :class:`~bsi.method.layers.BasisLinear` layers of
the size ``pipeline.config.compress.target_ratio`` asks for. Everything else,
task fine-tuning (cached, so a sweep does it once), the recovery fine-tune of
sigma and the auxiliary vectors, export, size accounting and evaluation, is
:class:`~bsi.pipeline.runner.Pipeline`'s and identical for every method.

==========  ==================================================================
name        what it keeps
==========  ==================================================================
svd         each layer's top-k singular triplets
fwsvd       top-k of the Fisher-row-weighted SVD (weights undone after)
asvd        top-k of the activation-scaled SVD (scales undone after)
basel       engine: prune the smallest re-learned ``|sigma_i|``
bsi-grad    engine: BSI without Hessian, ``-sigma_i E[dl/dsigma_i]``
bsi         engine: BSI, gradient plus Hessian-diagonal term
==========  ==================================================================

Add a method by adding an entry to :data:`METHODS`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from bsi.pipeline.baselines import (
    LayerShape,
    activation_scales,
    activation_statistics,
    fisher_information,
    fisher_row_weights,
    install_bases,
    sensitivity_ranks,
    truncation_sensitivity,
    uniform_ranks,
    weighted_svd,
)
from bsi.config import PipelineConfig
from bsi.method.engine import Compressor
from bsi.errors import BSIError
from bsi.pipeline.evaluate import Metrics, answer_token_loss
from bsi.pipeline.runner import Pipeline, Report
from bsi.method.surgery import compressible_linear_names, model_parameters, to_basis_form
from bsi.reports import EvalReport, RoundReport

ALLOCATIONS = ("uniform", "sensitivity")


@dataclass
class BaselineConfig:
    """Settings of the SVD-family baselines (the engine methods ignore them).

    Args:
        alpha: ASVD's exponent in ``s_j = mean|x_j| ** alpha``.
        calibration_batches: task batches for activation / Fisher statistics.
        allocation: ``uniform`` (every layer keeps the same share of its size)
            or ``sensitivity`` (ASVD's loss-driven allocation; one loss
            evaluation per layer and share, slow on big models).
        sensitivity_shares: the shares of a layer's size tried by ``sensitivity``.
        sensitivity_batches: batches the sensitivity loss is measured on.
    """

    alpha: float = 0.5
    calibration_batches: int = 8
    allocation: str = "uniform"
    sensitivity_shares: tuple[float, ...] = (0.1, 0.2, 0.35, 0.5, 0.7, 0.9)
    sensitivity_batches: int = 2

    def __post_init__(self) -> None:
        self.sensitivity_shares = tuple(float(s) for s in self.sensitivity_shares)
        if not self.alpha >= 0:
            raise BSIError(f"alpha must be >= 0, got {self.alpha}")
        if self.calibration_batches < 1:
            raise BSIError(f"calibration_batches must be >= 1, got {self.calibration_batches}")
        if self.allocation not in ALLOCATIONS:
            raise BSIError(f"allocation must be one of {', '.join(ALLOCATIONS)}, got '{self.allocation}'")
        if not self.sensitivity_shares or not all(0 < s <= 1 for s in self.sensitivity_shares):
            raise BSIError(f"sensitivity_shares must be values in (0, 1], got {self.sensitivity_shares}")
        if self.sensitivity_batches < 1:
            raise BSIError(f"sensitivity_batches must be >= 1, got {self.sensitivity_batches}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class Method(Protocol):
    """What a compression method provides."""

    name: str
    description: str

    def compress(self, pipeline: "MethodPipeline") -> Iterator[Report]: ...


# ------------------------------------------------------------ engine methods
@dataclass(frozen=True)
class EngineMethod:
    """One of the engine's scores (METHOD.md sec. 3), run by :class:`~bsi.method.engine.Compressor`."""

    name: str
    score: str
    description: str

    def compress(self, pipeline: "MethodPipeline") -> Iterator[Report]:
        config = dataclasses.replace(pipeline.config.compress, score=self.score)
        compressor = Compressor(pipeline.model, pipeline.stream(2), config, answer_token_loss,
                                compute_dtype=pipeline.dtype)
        for report in compressor.run():
            if isinstance(report, RoundReport):
                pipeline.rounds.append(report)
            yield report


# ---------------------------------------------------------------- SVD family
Weights = dict[str, tuple[torch.Tensor | None, torch.Tensor | None]]  # name -> (row weights, column scales)


def _no_weights(pipeline: "MethodPipeline", dense: Mapping[str, nn.Linear]) -> Generator[Report, None, Weights]:
    return {}
    yield  # pragma: no cover - makes this a generator


def _fisher_weights(pipeline: "MethodPipeline", dense: Mapping[str, nn.Linear]) -> Generator[Report, None, Weights]:
    sums = yield from fisher_information(pipeline.model, dense, pipeline.stream(4),
                                         pipeline.baseline.calibration_batches, answer_token_loss)
    return {n: (fisher_row_weights(sums[n]), None) for n in dense}


def _activation_weights(pipeline: "MethodPipeline", dense: Mapping[str, nn.Linear]) -> Generator[Report, None, Weights]:
    means = yield from activation_statistics(pipeline.model, dense, pipeline.stream(4),
                                             pipeline.baseline.calibration_batches)
    return {n: (None, activation_scales(means[n], pipeline.baseline.alpha)) for n in dense}


@dataclass(frozen=True)
class SVDFamilyMethod:
    """Truncated (weighted) SVD of every layer at ranks set by an allocation rule.

    ``weighting(pipeline, dense_layers)`` is a generator that may report
    calibration steps and returns ``{name: (row_weights, col_scales)}``
    (empty: plain SVD).
    """

    name: str
    description: str
    weighting: Callable[["MethodPipeline", Mapping[str, nn.Linear]], Generator[Report, None, Weights]] = field(
        default=_no_weights)

    def compress(self, pipeline: "MethodPipeline") -> Iterator[Report]:
        cfg, model = pipeline.config.compress, pipeline.model
        target = cfg.target_ratio
        if target is None:
            raise BSIError(f"method '{self.name}' needs a target size: give target_ratio (--target-ratio), not keep_ratio")
        dense = {n: model.get_submodule(n) for n in compressible_linear_names(model)}
        weights = yield from self.weighting(pipeline, dense)
        layers = to_basis_form(model, aux_rank=cfg.aux_rank, seed=cfg.seed)
        bases = {}
        for name, layer in layers.items():
            d, s = weights.get(name, (None, None))
            bases[name] = (layer.U, layer.sigma.detach(), layer.V) if d is None and s is None else \
                weighted_svd(dense[name].weight, d, s)
        shapes = {n: LayerShape.of(layer) for n, layer in layers.items()}
        if pipeline.baseline.allocation == "sensitivity":
            for name, layer in layers.items():  # full rank, new bases: truncation is by zeroing sigma
                install_bases(layer, *bases[name], rank=layer.rank)
            sensitivity = yield from truncation_sensitivity(
                model, layers, pipeline.baseline.sensitivity_shares, pipeline.calibration_loss())
            ranks = sensitivity_ranks(shapes, target, sensitivity)
        else:
            ranks = uniform_ranks(shapes, target)
        for name, layer in layers.items():
            install_bases(layer, *[t.clone() for t in bases[name]], rank=ranks[name])


#: name -> method. The registry the CLI, the sweep and the dashboard read.
METHODS: dict[str, Method] = {
    "svd": SVDFamilyMethod("svd", "plain SVD: each layer keeps its top-k singular triplets"),
    "fwsvd": SVDFamilyMethod("fwsvd", "Fisher-weighted SVD (row weights from squared task gradients)", _fisher_weights),
    "asvd": SVDFamilyMethod("asvd", "activation-aware SVD (input channels scaled by mean|x|^alpha)", _activation_weights),
    "basel": EngineMethod("basel", "basel", "Basel: prune the smallest re-learned |sigma|"),
    "bsi-grad": EngineMethod("bsi-grad", "bsi-grad", "BSI without Hessian: first-order loss change"),
    "bsi": EngineMethod("bsi", "bsi", "BSI: first- plus second-order loss change (Hessian by perturbation)"),
}


def get_method(name: str) -> Method:
    """The registered method called ``name`` (a clear error lists the valid names)."""
    try:
        return METHODS[name]
    except KeyError:
        raise BSIError(f"unknown method '{name}': use one of {', '.join(METHODS)}") from None


class MethodPipeline(Pipeline):
    """The three-stage pipeline with the compression stage done by a named method.

    Args:
        config: the run configuration (``compress.target_ratio`` sets the size).
        method: a registered method name or a :class:`Method` object.
        baseline: settings of the SVD-family methods.
        finetuned_metrics: metrics of the fine-tuned dense model measured
            before (a sweep measures them once); the evaluation is then skipped.
    """

    def __init__(self, config: PipelineConfig, method: str | Method, out_dir: str | Path | None = None,
                 cache_dir: str | Path | None = None, baseline: BaselineConfig | None = None,
                 finetuned_metrics: Metrics | None = None) -> None:
        super().__init__(config, out_dir=out_dir, cache_dir=cache_dir)
        self.method = get_method(method) if isinstance(method, str) else method
        self.baseline = baseline or BaselineConfig()
        self.finetuned_metrics = finetuned_metrics

    @property
    def method_name(self) -> str:
        return self.method.name

    def compress(self) -> Iterator[Report]:
        yield from self.method.compress(self)

    def evaluate_stage(self, when: str) -> Iterator[Report]:
        if when == "finetuned" and self.finetuned_metrics is not None and self.config.eval_examples:
            m = self.finetuned_metrics
            self.metrics[when] = m
            yield EvalReport(when, m.accuracy, m.loss, m.examples, model_parameters(self.model), 0.0)
            return
        yield from super().evaluate_stage(when)

    def calibration_loss(self) -> Callable[[], float]:
        """A closure: mean answer-token loss on a few fixed training batches (no gradient)."""
        stream = self.stream(5)
        batches = [next(stream) for _ in range(self.baseline.sensitivity_batches)]

        def loss() -> float:
            with torch.inference_mode():
                return sum(float(answer_token_loss(self.model, b)) for b in batches) / len(batches)

        return loss
