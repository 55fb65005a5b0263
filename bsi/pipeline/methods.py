"""The compression methods, behind one interface, through one pipeline.

A *method* is a small object with a ``name``, a one-line ``description`` and
``compress(pipeline)``: a generator that turns ``pipeline.model`` (already
task-fine-tuned) into a model of :class:`~bsi.method.layers.BasisLinear`
layers of every size the configuration asks for (``compress.sizes``: the
stops, then ``target_ratio``). Each time the model has one of those sizes it
yields a :class:`~bsi.reports.SizeReport`; until the generator resumes,
``pipeline.model`` *is* the model of that size (``bsi sweep`` copies it
there, so one run gives every size). Everything else, task fine-tuning
(cached, so a sweep does it once), the recovery stage, export, size
accounting and evaluation, is :class:`~bsi.pipeline.runner.Pipeline`'s and
identical for every method.

==========  ==================================================================
name        what it keeps
==========  ==================================================================
svd         each layer's top-k singular triplets
svd-llm     top-k of the SVD of the whitened weight ``W S`` (output error on task inputs)
fwsvd       top-k of the Fisher-row-weighted SVD (weights undone after)
asvd        top-k of the activation-scaled SVD (scales undone after), ranks by sensitivity
basel       engine: prune the smallest re-learned ``|sigma_i|``
bsi-grad    engine: BSI without the curvature term, ``-sigma_i E[dl/dsigma_i]``
bsi         engine: BSI, gradient plus curvature term
==========  ==================================================================

The truncation methods run as published: no auxiliary vectors (so at a given
size they keep the rank the published method keeps), ASVD with its
sensitivity rank search, FWSVD with per-example Fisher information
(:class:`BaselineConfig` can switch each back, for ablations). The engine
methods run :meth:`Pipeline.run_engine` with their score; their bases and
schedule are the ``compress`` section's (see :data:`bsi.config.PROTOCOLS`
for the published and the tuned settings). Add a method by adding its
:class:`bsi.config.MethodSpec` to :data:`bsi.config.METHOD_SPECS` and, for
a truncation method, its bases to :data:`TRUNCATIONS`.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from bsi.config import METHOD_SPECS, MethodSpec
from bsi.errors import BSIError
from bsi.method.bases import weighted_svd, whitened_bases
from bsi.method.schedule import LayerShape
from bsi.method.surgery import Bases, compressible_linear_names, size_report, to_basis_form
from bsi.pipeline.baselines import (
    activation_scales,
    fisher_row_information,
    fisher_row_weights,
    input_statistics,
    SuffixLoss,
    sensitivity_ranks,
    truncation_sensitivity,
    uniform_ranks,
)
from bsi.pipeline.losses import answer_token_loss

if TYPE_CHECKING:
    from bsi.pipeline.runner import Pipeline, Report

ALLOCATIONS = ("published", "uniform", "sensitivity")
FISHER = ("example", "batch")


@dataclass
class BaselineConfig:
    """Settings of the truncation baselines (the engine methods ignore them).

    Their calibration batches are ``compress.calibration_batches``, the same
    number the engine's whitened bases use. The defaults are the published
    methods; the other values exist to measure what each shortcut changes
    (docs/method.md, "Protocols").

    Args:
        alpha: ASVD's exponent in ``s_j = mean|x_j| ** alpha``.
        allocation: ``published`` (each method's own: sensitivity for ASVD,
            uniform for the others), ``uniform`` (every layer keeps the same
            share of its size) or ``sensitivity`` (ASVD's loss-driven
            allocation: one loss evaluation per layer and share).
        sensitivity_shares: the shares of a layer's size ``sensitivity`` tries (one loss evaluation each, per layer);
            a target below the smallest share cannot be reached by it.
        sensitivity_batches: batches the sensitivity loss is measured on.
        fisher: FWSVD's information, ``example`` (per-example squared
            gradients, published) or ``batch`` (squared batch-mean gradients).
        aux_rank: auxiliary vectors per layer, paid out of the rank (0, as
            published: none).
    """

    alpha: float = 0.5
    allocation: str = "published"
    sensitivity_shares: tuple[float, ...] = (0.02, 0.05, 0.1, 0.2, 0.4, 0.7)
    sensitivity_batches: int = 1
    fisher: str = "example"
    aux_rank: int = 0

    def __post_init__(self) -> None:
        self.sensitivity_shares = tuple(sorted(float(s) for s in self.sensitivity_shares))
        if not self.alpha >= 0:
            raise BSIError(f"alpha must be >= 0, got {self.alpha}")
        if self.allocation not in ALLOCATIONS:
            raise BSIError(f"allocation must be one of {', '.join(ALLOCATIONS)}, got '{self.allocation}'")
        if not self.sensitivity_shares or not all(0 < s <= 1 for s in self.sensitivity_shares):
            raise BSIError(f"sensitivity_shares must be values in (0, 1], got {self.sensitivity_shares}")
        if self.sensitivity_batches < 1:
            raise BSIError(f"sensitivity_batches must be >= 1, got {self.sensitivity_batches}")
        if self.fisher not in FISHER:
            raise BSIError(f"fisher must be one of {', '.join(FISHER)}, got '{self.fisher}'")
        if not (isinstance(self.aux_rank, int) and self.aux_rank >= 0):
            raise BSIError(f"the baselines' aux_rank must be an integer >= 0, got {self.aux_rank}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "BaselineConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise BSIError(f"unknown baseline setting(s) {', '.join(unknown)}; valid: {', '.join(sorted(known))}")
        return cls(**dict(data))


class Method(Protocol):
    """What a compression method provides."""

    name: str
    description: str

    def compress(self, pipeline: "Pipeline") -> Iterator["Report"]: ...


# ------------------------------------------------------------ engine methods
@dataclass(frozen=True)
class EngineMethod:
    """One of the engine's scores, run by :meth:`Pipeline.run_engine` (checkpoints, processes and all).

    ``within_layer`` set makes a named variant: the method fixes how each
    layer chooses its share of a round's cut (``"magnitude"``: the smallest
    |sigma|), where ``None`` leaves the run's ``within_layer`` setting.
    """

    name: str
    score: str
    description: str
    within_layer: str | None = None

    @property
    def compress_settings(self) -> dict[str, str]:
        """The ``compress`` settings this method fixes; every other one is the run's."""
        return MethodSpec(self.name, self.description, self.score, self.within_layer).compress_settings

    def compress(self, pipeline: "Pipeline") -> Iterator["Report"]:
        yield from pipeline.run_engine()  # the pipeline's config holds compress_settings (Pipeline.__init__)


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
    rows = yield from fisher_row_information(pipeline.model, dense, pipeline.stream(4),
                                             pipeline.config.compress.calibration_batches, answer_token_loss,
                                             per_example=pipeline.baseline.fisher == "example")
    weights = {n: fisher_row_weights(pipeline.dist.reduce(rows[n])) for n in dense}
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
    the plain SVD). ``allocation`` is the published method's rank rule
    (``uniform`` or ``sensitivity``). The bases are computed once; each size
    of the run is a truncated copy of the full-rank model.
    """

    name: str
    description: str
    bases_of: BasesOf = field(default=_plain)
    allocation: str = "uniform"

    def compress(self, pipeline: "Pipeline") -> Iterator["Report"]:
        cfg, model = pipeline.config.compress, pipeline.model
        if cfg.size_mode != "target":
            raise BSIError(f"method '{self.name}' needs a target size: give target_ratio (--target-ratio), not keep_ratio")
        allocation = self.allocation if pipeline.baseline.allocation == "published" else pipeline.baseline.allocation
        dense = {n: model.get_submodule(n) for n in compressible_linear_names(model)}
        bases = yield from self.bases_of(pipeline, dense)
        layers = to_basis_form(model, aux_rank=pipeline.baseline.aux_rank, seed=pipeline.config.seed, bases=bases)
        shapes = {n: LayerShape(layer.in_features, layer.out_features, layer.rank, layer.aux_rank,
                                layer.bias is not None) for n, layer in layers.items()}
        sensitivity = None
        if allocation == "sensitivity":
            sensitivity = yield from truncation_sensitivity(
                model, layers, pipeline.baseline.sensitivity_shares, calibration_loss(pipeline))
        full = model
        for index, target in enumerate(cfg.sizes):
            ranks = sensitivity_ranks(shapes, target, sensitivity) if sensitivity is not None \
                else uniform_ranks(shapes, target)
            last = index == len(cfg.sizes) - 1
            pipeline.model = full if last else copy.deepcopy(full)  # the full-rank bases serve the next size
            for name in layers:
                pipeline.model.get_submodule(name).keep(torch.arange(ranks[name]))
            yield size_report(pipeline.model, target)


def calibration_loss(pipeline: "Pipeline") -> Callable[[str | None], float]:
    """``loss(layer)``: mean answer-token loss on a few fixed training batches with layer ``layer`` changed.

    Only the blocks from that layer's on run again (:class:`bsi.pipeline.baselines.SuffixLoss`).
    Under several processes each measures on its own batches and the mean of
    all of them is returned everywhere, so that every process allocates the
    same ranks (a collective: all call it together).
    """
    stream = pipeline.stream(5)
    suffix = SuffixLoss(pipeline.model, [next(stream) for _ in range(pipeline.baseline.sensitivity_batches)],
                        answer_token_loss)

    def loss(layer: str | None = None) -> float:
        return pipeline.dist.mean(suffix(layer))

    return loss


#: What each truncation method computes: its bases (None: the plain SVD) and its published rank rule.
TRUNCATIONS: dict[str, tuple[BasesOf, str]] = {
    "svd": (_plain, "uniform"),
    "svd-llm": (_whitened, "uniform"),
    "fwsvd": (_fisher_weighted, "uniform"),
    "asvd": (_activation_scaled, "sensitivity"),
}


def _method_of(spec: MethodSpec) -> Method:
    if spec.is_engine:
        return EngineMethod(spec.name, spec.score, spec.description, spec.within_layer)
    bases_of, allocation = TRUNCATIONS[spec.name]
    return TruncationMethod(spec.name, spec.description, bases_of, allocation)


#: name -> method, one for each entry of :data:`bsi.config.METHOD_SPECS` (names, descriptions and what an
#: engine method fixes are there). The registry the CLI, the sweep and the dashboard read.
METHODS: dict[str, Method] = {name: _method_of(spec) for name, spec in METHOD_SPECS.items()}


def get_method(name: str) -> Method:
    """The registered method called ``name`` (a clear error lists the valid names)."""
    try:
        return METHODS[name]
    except KeyError:
        raise BSIError(f"unknown method '{name}': use one of {', '.join(METHODS)}") from None


def engine_method(score: str) -> Method:
    """The engine method that prunes with ``score`` (the plain one, not a variant)."""
    for method in METHODS.values():
        if getattr(method, "score", None) == score and getattr(method, "within_layer", None) is None:
            return method
    raise BSIError(f"no engine method uses score '{score}'")
