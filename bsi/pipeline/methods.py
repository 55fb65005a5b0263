"""The compression methods, behind one interface, through one pipeline.

A *method* is a small object with a ``name``, a one-line ``description`` and
``compress(context)``: a generator that turns ``context.model`` (already
task-fine-tuned) into a model of :class:`~bsi.method.layers.BasisLinear`
layers of every size the configuration asks for (``context.config.size.sizes``:
the stops, then the target ratio). Each time the model has one of those sizes
it yields a :class:`~bsi.reports.SizeReport`; until the generator resumes,
``context.model`` *is* the model of that size (``bsi sweep`` copies it there,
so one run gives every size). A method sees only its :class:`MethodContext`:
the model, the batches, the seed, the reduction across processes, and for
the engine methods what the run lends the rounds (:class:`EngineRun`). Task
fine-tuning, the recovery stage, export, size accounting and evaluation are
:class:`~bsi.pipeline.runner.Pipeline`'s and identical for every method.

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
methods build a :class:`~bsi.method.engine.Compressor` with their score; its
bases and schedule are the ``compress`` section's (see :data:`bsi.config.PROTOCOLS`
for the published and the tuned settings). Add a method by adding its
:class:`bsi.config.MethodSpec` to :data:`bsi.config.METHOD_SPECS` and, for
a truncation method, its bases to :data:`TRUNCATIONS`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from bsi.config import METHOD_SPECS, BaselineConfig, CompressConfig, MethodSpec
from bsi.data import BatchUse
from bsi.errors import BSIError
from bsi.method.bases import weighted_svd, whitened_bases_by
from bsi.method.engine import Compressor
from bsi.method.schedule import LayerShape
from bsi.method.surgery import Bases, compressible_linear_names, size_report, to_basis_form
from bsi.pipeline.baselines import (
    SuffixLoss,
    activation_scales,
    fisher_row_information,
    fisher_row_weights,
    input_statistics,
    sensitivity_ranks,
    truncation_sensitivity,
    uniform_ranks,
)
from bsi.pipeline.distributed import DistContext
from bsi.pipeline.losses import answer_token_loss
from bsi.reports import Report, RoundReport, StageReport


@dataclass
class EngineResume:
    """Where an interrupted run's engine continues: its state after the last complete round.

    ``tensors`` and ``state`` are :meth:`Compressor.state_dict`'s two parts
    (this process's own generator and monitor batch included), ``stream`` the
    batch stream's position, ``rounds_done`` how many rounds are behind.
    """

    tensors: dict[str, torch.Tensor]
    state: dict[str, Any]
    stream: dict[str, Any]
    rounds_done: int


@dataclass
class EngineRun:
    """What the run lends an engine method's rounds, beyond the model and the batches.

    Args:
        train_loss: the loss of the tuning steps (the task loss, or distillation from the dense model).
        compute_dtype: the model's dtype (sets the eps rule).
        probe_seed: this process's seed for the Hutchinson probes.
        before_cut: called before every cut (:class:`~bsi.method.engine.Compressor`'s ``before_cut``).
        sharding: a :class:`bsi.pipeline.fsdp.Sharding` when the Basel form is sharded across processes.
        resume: the state to continue from, or None for a fresh start.
        after_round: called with the compressor, its batch stream and each round's report before anyone
            else sees the report (the run records and checkpoints it there).
        bases_cache: where this conversion's bases are kept (:class:`~bsi.pipeline.bases_cache.BasesCache`);
            None: convert from scratch and keep nothing.
    """

    train_loss: Callable[[nn.Module, dict], torch.Tensor] = answer_token_loss
    compute_dtype: torch.dtype = torch.float32
    probe_seed: int = 0
    before_cut: Callable[..., None] | None = None
    sharding: Any = None
    resume: EngineResume | None = None
    after_round: Callable[[Compressor, Any, RoundReport], None] | None = None
    bases_cache: Any = None


@dataclass
class MethodContext:
    """Everything a method may use: the model to compress and what compressing it needs, nothing of the run.

    Args:
        model: the fine-tuned dense model. The method rewrites it; after each
            :class:`~bsi.reports.SizeReport` ``model`` is the model of that size
            (a truncation method puts a copy there for every size but the last).
        config: the ``compress`` settings (sizes, schedule, bases, score).
        seed: the run's seed.
        batches: ``batches(use)``, a fresh stream of this process's training
            batches for one :class:`~bsi.data.BatchUse` (``COMPRESS``: the engine's rounds,
            ``CALIBRATE``: the baselines' calibration, ``SENSITIVITY``: ASVD's sensitivity).
        dist: the processes taking part (``reduce`` sums a tensor over them, ``mean`` averages a number).
        baseline: the truncation methods' settings.
        engine: what the engine methods need of the run (:class:`EngineRun`).
        notes: the method adds what the reader of its result should know.
    """

    model: nn.Module
    config: CompressConfig
    seed: int
    batches: Callable[[BatchUse], Iterator[dict]]
    dist: DistContext = field(default_factory=DistContext)
    baseline: BaselineConfig = field(default_factory=BaselineConfig)
    engine: EngineRun = field(default_factory=EngineRun)
    notes: list[str] = field(default_factory=list)


class Method(Protocol):
    """What a compression method provides."""

    name: str
    description: str

    def compress(self, context: MethodContext) -> Iterator[Report]: ...


# ------------------------------------------------------------ engine methods
@dataclass(frozen=True)
class EngineMethod:
    """One of the engine's scores: the pruning rounds of a :class:`~bsi.method.engine.Compressor`.

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

    def compress(self, context: MethodContext) -> Iterator[Report]:
        """Convert the model to the Basel form, then prune it round by round with this method's score.

        ``context.config`` already holds :attr:`compress_settings` (the
        pipeline applies them). Every process takes part (gradients averaged,
        statistics summed, each its own probes); with ``context.engine.resume``
        the rounds continue after the last complete one.
        """
        cfg, run = context.config, context.engine
        stream = context.batches(BatchUse.COMPRESS)
        on_shards = {"convert_layers": run.sharding.convert, "prune_layer": run.sharding.keep} if run.sharding else {}
        compressor = Compressor(context.model, stream, cfg, answer_token_loss, train_loss_fn=run.train_loss,
                                compute_dtype=run.compute_dtype, reduce=context.dist.reduce, seed=context.seed,
                                probe_seed=run.probe_seed, before_cut=run.before_cut, **on_shards)
        if run.resume is not None:
            compressor.load_state_dict(run.resume.tensors, run.resume.state)
            stream.load_state_dict(run.resume.stream)
            yield StageReport("compress", "resume", f"after round {run.resume.rounds_done}")
        else:
            yield from _convert(compressor, run.bases_cache)
        if run.sharding is not None:
            from bsi.pipeline.fsdp import refuse_double_backward

            refuse_double_backward(getattr(compressor.source, "method", None))  # the engine may have switched to hvp
        for note in compressor.notes:
            yield StageReport("compress", "note", note)
        with context.dist.sync_gradients(p for layer in compressor.layers.values()
                                         for p in (layer.sigma, layer.aux_u, layer.aux_v)):
            for report in compressor.run():
                if isinstance(report, RoundReport) and run.after_round is not None:
                    run.after_round(compressor, stream, report)  # saved before anyone sees it: a consumer may stop
                yield report
                if isinstance(report, RoundReport) and report.stop is not None:
                    yield size_report(context.model, report.stop)
        context.notes.extend(compressor.notes)


def _convert(compressor: Compressor, cache: Any) -> Iterator[Report]:
    """The engine's conversion, from the conversion cache when it holds this one (and kept there when it did not)."""
    import time

    from bsi.pipeline.bases_cache import bases_by_name

    saved = cache.load() if cache is not None else None
    if saved is not None:
        yield from compressor.convert(known_bases=bases_by_name(saved))
        yield StageReport("convert", "end", str(cache.folder), cached=True)  # "convert: cached <folder>"
        return
    start = time.perf_counter()
    yield from compressor.convert()
    if cache is not None:
        cache.save(compressor.layers, time.perf_counter() - start)


# ---------------------------------------------------------------- SVD family
#: a generator that may report calibration steps and returns the bases of each layer
BasesOf = Callable[[MethodContext, Mapping[str, nn.Linear]], Generator[Report, None, Callable[[str, nn.Linear], Bases] | None]]


def _plain(context: MethodContext, dense: Mapping[str, nn.Linear]):
    return None  # the plain SVD
    yield  # pragma: no cover - makes this a generator


def _whitened(context: MethodContext, dense: Mapping[str, nn.Linear]):
    cfg = context.config
    stats = yield from input_statistics(context.model, dense, context.batches(BatchUse.CALIBRATE),
                                        cfg.calibration_batches, covariance=True)
    stats.reduce(context.dist.reduce)
    covariance = stats.covariance()
    return whitened_bases_by(covariance, cfg.whitening_damping)


def _fisher_weighted(context: MethodContext, dense: Mapping[str, nn.Linear]):
    rows = yield from fisher_row_information(context.model, dense, context.batches(BatchUse.CALIBRATE),
                                             context.config.calibration_batches, answer_token_loss,
                                             per_example=context.baseline.fisher == "example")
    weights = {n: fisher_row_weights(context.dist.reduce(rows[n])) for n in dense}
    return lambda name, linear: weighted_svd(linear.weight, weights[name], None)


def _activation_scaled(context: MethodContext, dense: Mapping[str, nn.Linear]):
    stats = yield from input_statistics(context.model, dense, context.batches(BatchUse.CALIBRATE),
                                        context.config.calibration_batches)
    stats.reduce(context.dist.reduce)
    scales = {n: activation_scales(m, context.baseline.alpha) for n, m in stats.abs_mean().items()}
    return lambda name, linear: weighted_svd(linear.weight, None, scales[name])


@dataclass(frozen=True)
class TruncationMethod:
    """Write every layer in the method's bases, then keep each layer's first k at ranks set by an allocation rule.

    ``bases_of(context, dense_layers)`` is a generator that may report
    calibration steps and returns ``(name, linear) -> (U, sigma, V)`` (None:
    the plain SVD). ``allocation`` is the published method's rank rule
    (``uniform`` or ``sensitivity``). The bases are computed once; each size
    of the run is a truncated copy of the full-rank model.
    """

    name: str
    description: str
    bases_of: BasesOf = field(default=_plain)
    allocation: str = "uniform"

    def compress(self, context: MethodContext) -> Iterator[Report]:
        cfg, model, baseline = context.config, context.model, context.baseline
        if cfg.size.mode != "target":
            raise BSIError(f"method '{self.name}' needs a target size: give target_ratio (--target-ratio), not keep_ratio")
        allocation = self.allocation if baseline.allocation == "published" else baseline.allocation
        dense = {n: model.get_submodule(n) for n in compressible_linear_names(model)}
        bases = yield from self.bases_of(context, dense)
        layers = to_basis_form(model, aux_rank=baseline.aux_rank, seed=context.seed, bases=bases)
        shapes = {n: LayerShape(layer.in_features, layer.out_features, layer.rank, layer.aux_rank,
                                layer.bias is not None) for n, layer in layers.items()}
        sensitivity = None
        if allocation == "sensitivity":
            sensitivity = yield from truncation_sensitivity(
                model, layers, baseline.sensitivity_shares, calibration_loss(context))
        full = model
        for index, target in enumerate(cfg.size.sizes):
            ranks = sensitivity_ranks(shapes, target, sensitivity) if sensitivity is not None \
                else uniform_ranks(shapes, target)
            last = index == len(cfg.size.sizes) - 1
            context.model = full if last else copy.deepcopy(full)  # the full-rank bases serve the next size
            for name in layers:
                context.model.get_submodule(name).keep(torch.arange(ranks[name]))
            yield size_report(context.model, target)


def calibration_loss(context: MethodContext) -> Callable[[str | None], float]:
    """``loss(layer)``: mean answer-token loss on a few fixed training batches with layer ``layer`` changed.

    Only the blocks from that layer's on run again (:class:`bsi.pipeline.baselines.SuffixLoss`).
    Under several processes each measures on its own batches and the mean of
    all of them is returned everywhere, so that every process allocates the
    same ranks (a collective: all call it together).
    """
    stream = context.batches(BatchUse.SENSITIVITY)
    suffix = SuffixLoss(context.model, [next(stream) for _ in range(context.baseline.sensitivity_batches)],
                        answer_token_loss)

    def loss(layer: str | None = None) -> float:
        return context.dist.mean(suffix(layer))

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
