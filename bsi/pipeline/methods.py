"""The compression methods, behind one interface, through one pipeline.

A *method* is a small object with a ``name``, a one-line ``description`` and
``compress(pipeline)``: a generator that turns ``pipeline.model`` (already
task-fine-tuned) into a model of :class:`~bsi.method.layers.BasisLinear`
layers of the size the configuration asks for. Everything else, task
fine-tuning (cached, so a sweep does it once), the recovery stage, export,
size accounting and evaluation, is :class:`~bsi.pipeline.runner.Pipeline`'s
and identical for every method.

==========  ==================================================================
name        what it keeps
==========  ==================================================================
svd         each layer's top-k singular triplets
svd-llm     top-k of the SVD of the whitened weight ``W S`` (output error on task inputs)
fwsvd       top-k of the Fisher-row-weighted SVD (weights undone after)
asvd        top-k of the activation-scaled SVD (scales undone after)
basel       engine: prune the smallest re-learned ``|sigma_i|``
bsi-grad    engine: BSI without the curvature term, ``-sigma_i E[dl/dsigma_i]``
bsi         engine: BSI, gradient plus curvature term
==========  ==================================================================

The engine methods run :meth:`Pipeline.run_engine` with their score (the
bases, plain or whitened, are ``compress.bases`` for all three). Add a method
by adding an entry to :data:`METHODS`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from bsi.errors import BSIError
from bsi.method.bases import weighted_svd, whitened_bases
from bsi.method.schedule import LayerShape
from bsi.method.surgery import Bases, compressible_linear_names, to_basis_form
from bsi.pipeline.baselines import (
    activation_scales,
    fisher_information,
    fisher_row_weights,
    input_statistics,
    sensitivity_ranks,
    truncation_sensitivity,
    uniform_ranks,
)
from bsi.pipeline.losses import answer_token_loss

if TYPE_CHECKING:
    from bsi.pipeline.runner import Pipeline, Report

ALLOCATIONS = ("uniform", "sensitivity")


@dataclass
class BaselineConfig:
    """Settings of the truncation baselines (the engine methods ignore them).

    Their calibration batches are ``compress.calibration_batches``, the same
    number the engine's whitened bases use.

    Args:
        alpha: ASVD's exponent in ``s_j = mean|x_j| ** alpha``.
        allocation: ``uniform`` (every layer keeps the same share of its size)
            or ``sensitivity`` (ASVD's loss-driven allocation; one loss
            evaluation per layer and share, slow on big models).
        sensitivity_shares: the shares of a layer's size tried by ``sensitivity``.
        sensitivity_batches: batches the sensitivity loss is measured on.
        recover_steps, recover_lr: in a sweep, the truncation baselines'
            recovery steps and peak learning rate when they should differ
            from the shared ``recover`` section (None: the shared value).
            A one-shot truncation starts its recovery far from the task,
            where the engine methods (gradual, re-tuned between rounds) start
            close to it: on the embedded task at 0.6, plain SVD starts at
            loss 12.0 and reaches 6.5 after 8 steps at 2e-5, 2.0 after 32
            steps at 1e-4 and 0.87 after 64 (accuracy 0%, 2%, 8% of 50),
            while an lr fit for it costs the engine methods accuracy
            (docs/benchmarks.md).
    """

    alpha: float = 0.5
    allocation: str = "uniform"
    sensitivity_shares: tuple[float, ...] = (0.1, 0.2, 0.35, 0.5, 0.7, 0.9)
    sensitivity_batches: int = 2
    recover_steps: int | None = None
    recover_lr: float | None = None

    def __post_init__(self) -> None:
        self.sensitivity_shares = tuple(float(s) for s in self.sensitivity_shares)
        if not self.alpha >= 0:
            raise BSIError(f"alpha must be >= 0, got {self.alpha}")
        if self.allocation not in ALLOCATIONS:
            raise BSIError(f"allocation must be one of {', '.join(ALLOCATIONS)}, got '{self.allocation}'")
        if not self.sensitivity_shares or not all(0 < s <= 1 for s in self.sensitivity_shares):
            raise BSIError(f"sensitivity_shares must be values in (0, 1], got {self.sensitivity_shares}")
        if self.sensitivity_batches < 1:
            raise BSIError(f"sensitivity_batches must be >= 1, got {self.sensitivity_batches}")
        if self.recover_steps is not None and not (isinstance(self.recover_steps, int) and self.recover_steps >= 0):
            raise BSIError(f"the baselines' recover_steps must be an integer >= 0, got {self.recover_steps}")
        if self.recover_lr is not None and not self.recover_lr > 0:
            raise BSIError(f"the baselines' recover_lr must be positive, got {self.recover_lr}")

    def recover_overrides(self) -> dict[str, Any]:
        """The ``recover`` fields a truncation baseline's cell overrides (empty: the shared recovery)."""
        return {k: v for k, v in (("steps", self.recover_steps), ("lr", self.recover_lr)) if v is not None}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class Method(Protocol):
    """What a compression method provides."""

    name: str
    description: str

    def compress(self, pipeline: "Pipeline") -> Iterator["Report"]: ...


# ------------------------------------------------------------ engine methods
@dataclass(frozen=True)
class EngineMethod:
    """One of the engine's scores, run by :meth:`Pipeline.run_engine` (checkpoints, processes and all)."""

    name: str
    score: str
    description: str

    def compress(self, pipeline: "Pipeline") -> Iterator["Report"]:
        yield from pipeline.run_engine(score=self.score)


# ---------------------------------------------------------------- SVD family
#: a generator that may report calibration steps and returns the bases of each layer
BasesOf = Callable[["Pipeline", Mapping[str, nn.Linear]], Generator["Report", None, Callable[[str, nn.Linear], Bases] | None]]


def _plain(pipeline: "Pipeline", dense: Mapping[str, nn.Linear]):
    return None  # the plain SVD
    yield  # pragma: no cover - makes this a generator


def _whitened(pipeline: "Pipeline", dense: Mapping[str, nn.Linear]):
    cfg = pipeline.config.compress
    stats = yield from input_statistics(pipeline.model, dense, pipeline.stream(4), cfg.calibration_batches,
                                        covariance=True)
    stats.reduce(pipeline.dist.reduce)
    covariance = stats.covariance()
    return lambda name, linear: whitened_bases(linear.weight, covariance[name], cfg.whitening_damping)


def _fisher_weighted(pipeline: "Pipeline", dense: Mapping[str, nn.Linear]):
    sums = yield from fisher_information(pipeline.model, dense, pipeline.stream(4),
                                         pipeline.config.compress.calibration_batches, answer_token_loss)
    weights = {n: fisher_row_weights(pipeline.dist.reduce(sums[n])) for n in dense}
    return lambda name, linear: weighted_svd(linear.weight, weights[name], None)


def _activation_scaled(pipeline: "Pipeline", dense: Mapping[str, nn.Linear]):
    stats = yield from input_statistics(pipeline.model, dense, pipeline.stream(4),
                                        pipeline.config.compress.calibration_batches)
    stats.reduce(pipeline.dist.reduce)
    scales = {n: activation_scales(m, pipeline.baseline.alpha) for n, m in stats.abs_mean().items()}
    return lambda name, linear: weighted_svd(linear.weight, None, scales[name])


@dataclass(frozen=True)
class TruncationMethod:
    """Write every layer in the method's bases, then keep each layer's first k at ranks set by an allocation rule.

    ``bases_of(pipeline, dense_layers)`` is a generator that may report
    calibration steps and returns ``(name, linear) -> (U, sigma, V)`` (None:
    the plain SVD).
    """

    name: str
    description: str
    bases_of: BasesOf = field(default=_plain)

    def compress(self, pipeline: "Pipeline") -> Iterator["Report"]:
        cfg, model = pipeline.config.compress, pipeline.model
        if cfg.size_mode != "target":
            raise BSIError(f"method '{self.name}' needs a target size: give target_ratio (--target-ratio), not keep_ratio")
        dense = {n: model.get_submodule(n) for n in compressible_linear_names(model)}
        bases = yield from self.bases_of(pipeline, dense)
        layers = to_basis_form(model, aux_rank=cfg.aux_rank, seed=cfg.seed, bases=bases)
        shapes = {n: LayerShape(layer.in_features, layer.out_features, layer.rank, layer.aux_rank,
                                layer.bias is not None) for n, layer in layers.items()}
        if pipeline.baseline.allocation == "sensitivity":
            sensitivity = yield from truncation_sensitivity(
                model, layers, pipeline.baseline.sensitivity_shares, calibration_loss(pipeline))
            ranks = sensitivity_ranks(shapes, cfg.target_ratio, sensitivity)
        else:
            ranks = uniform_ranks(shapes, cfg.target_ratio)
        for name, layer in layers.items():
            layer.keep(torch.arange(ranks[name]))


def calibration_loss(pipeline: "Pipeline") -> Callable[[], float]:
    """A closure: mean answer-token loss on a few fixed training batches (no gradient).

    Under several processes each measures on its own batches and the mean of
    all of them is returned everywhere, so that every process allocates the
    same ranks (a collective: all call it together).
    """
    stream = pipeline.stream(5)
    batches = [next(stream) for _ in range(pipeline.baseline.sensitivity_batches)]

    def loss() -> float:
        with torch.inference_mode():
            mine = sum(float(answer_token_loss(pipeline.model, b)) for b in batches) / len(batches)
        return pipeline.dist.mean(mine)

    return loss


#: name -> method. The registry the CLI, the sweep and the dashboard read.
METHODS: dict[str, Method] = {
    "svd": TruncationMethod("svd", "plain SVD: each layer keeps its top-k singular triplets"),
    "svd-llm": TruncationMethod("svd-llm", "SVD-LLM: top-k of the SVD of the weight on whitened task inputs",
                                _whitened),
    "fwsvd": TruncationMethod("fwsvd", "Fisher-weighted SVD (row weights from squared task gradients)",
                              _fisher_weighted),
    "asvd": TruncationMethod("asvd", "activation-aware SVD (input channels scaled by mean|x|^alpha)",
                             _activation_scaled),
    "basel": EngineMethod("basel", "basel", "Basel: prune the smallest re-learned |sigma|"),
    "bsi-grad": EngineMethod("bsi-grad", "bsi-grad", "BSI without the curvature term: first-order loss change"),
    "bsi": EngineMethod("bsi", "bsi", "BSI: first- plus second-order loss change"),
}


def get_method(name: str) -> Method:
    """The registered method called ``name`` (a clear error lists the valid names)."""
    try:
        return METHODS[name]
    except KeyError:
        raise BSIError(f"unknown method '{name}': use one of {', '.join(METHODS)}") from None


def engine_method(score: str) -> Method:
    """The engine method that prunes with ``score``."""
    for method in METHODS.values():
        if getattr(method, "score", None) == score:
            return method
    raise BSIError(f"no engine method uses score '{score}'")
