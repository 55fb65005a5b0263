"""Typed reports: what the engine tells the outside world.

The engine prints nothing. Every long-running loop in bsi (task fine-tuning,
the pruning rounds, recovery fine-tuning, evaluation) is a *generator* that
yields these small frozen dataclasses. The CLI turns them into progress bars
and tables, the notebooks into plots, the dashboard into live charts; all three
consume exactly the same objects.

Tensors inside reports are detached CPU float32 copies, so a consumer can keep
them (for example to scrub back through rounds) without holding the model.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch


def _plain(value: Any) -> Any:
    """Turn tensors (and containers of them) into JSON-friendly Python values."""
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class _Report:
    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict of this report (tensors become lists)."""
        out: dict[str, Any] = {"kind": type(self).__name__}
        out.update(_plain(asdict(self)))  # type: ignore[call-overload]  # every subclass is a dataclass
        return out


@dataclass(frozen=True)
class StepReport(_Report):
    """One optimisation or profiling step.

    ``stage`` is one of ``"finetune"`` (stage 1, dense task fine-tuning),
    ``"train"`` (stage 2, tuning sigma and auxiliary vectors between prunings),
    ``"profile"`` (stage 2, gradient/Hessian statistics, no update) and
    ``"recover"`` (stage 3, fine-tuning the compressed model); the baselines
    add ``"calibrate"`` (FWSVD's gradients, ASVD's activation statistics).
    """

    stage: str
    step: int  # 1-based position within the stage
    total_steps: int
    loss: float  # answer-token cross-entropy on this mini-batch (NaN for a forward-only step, e.g. "calibrate" of ASVD)
    elapsed: float  # seconds since the stage started
    skipped: bool = False  # True when the batch gave a non-finite loss/gradient and was ignored
    tokens: int = 0  # tokens in the step's batch (attention-mask ones) on a step that trains; 0 on one that does not


#: The stages whose steps update the model (a profiling or calibration step only measures).
TRAINING_STAGES = ("finetune", "train", "recover", "dense-recover")


@dataclass
class TrainingTally:
    """Optimizer steps and tokens a model was trained on, counted from the :class:`StepReport` s of its stages.

    A skipped step (non-finite loss or gradient) updated nothing and is not
    counted. ``stages`` narrows what counts (a sweep counts a method's
    ``train`` steps up to a size, then the size's ``recover`` steps apart).

    >>> tally = TrainingTally(stages=("recover",))
    >>> tally.count(StepReport("recover", 1, 2, 0.5, 0.1, tokens=300))
    >>> tally.count(StepReport("profile", 1, 1, 0.5, 0.1))
    >>> (tally.steps, tally.tokens)
    (1, 300)
    """

    stages: tuple[str, ...] = TRAINING_STAGES
    steps: int = 0
    tokens: int = 0

    def count(self, report: object) -> None:
        """Add ``report`` when it is a step of a counted stage that updated the model."""
        if isinstance(report, StepReport) and report.stage in self.stages and not report.skipped:
            self.steps += 1
            self.tokens += report.tokens

    def through(self, reports: Generator[Any, Any, Any]) -> Generator[Any, Any, Any]:
        """``yield from tally.through(stage())``: pass every report on, counting it; returns what ``stage`` returns."""
        try:
            report = next(reports)
            while True:
                self.count(report)
                report = reports.send((yield report))
        except StopIteration as stop:
            return stop.value


@dataclass(frozen=True)
class LayerRound(_Report):
    """What one pruning round saw and decided for one layer.

    All vectors are indexed by the layer's *active* bases at the start of the
    round (length ``rank_before``). ``basis_ids`` maps each position to the
    basis' index in the original factorisation (0 = largest coefficient), so a
    basis can be followed across rounds. ``grad`` and ``hessian`` are None when
    the score does not read them (``basel`` reads neither, ``bsi-grad`` no curvature).
    """

    name: str
    basis_ids: torch.Tensor  # (r,) int64, original index of each active basis
    sigma: torch.Tensor  # (r,) learned coefficient sigma_i
    grad: torch.Tensor | None  # (r,) E[dl/dsigma_i] over the profiling batches
    #: (r,) curvature estimate of E[d2l/dsigma_i^2]; 0 outside the pool when the round's ``curvature_scope`` is "pool"
    hessian: torch.Tensor | None
    importance: torch.Tensor  # (r,) the score: predicted loss increase I_i of dropping basis i
    pool: torch.Tensor  # (p,) int64 positions of the candidate pool
    pruned: torch.Tensor  # (q,) int64 positions removed this round (subset of pool)
    rank_before: int
    rank_after: int
    params_after: int  # parameters of this layer after the round
    terms: dict[str, torch.Tensor] = field(
        default_factory=dict)  # name -> (r,): the parts of the score ("gradient", "curvature", ...)
    #: the layer's geometry, so that the cost of any rank can be computed from the record alone (a what-if cut,
    #: bsi.analysis.whatif); 0 in records written before 2026-11-28
    in_features: int = 0
    out_features: int = 0
    aux_rank: int = 0
    bias: bool = False


@dataclass(frozen=True)
class RoundReport(_Report):
    """The end of one pruning round: statistics and decisions for every layer."""

    round: int  # 1-based
    total_rounds: int
    layers: tuple[LayerRound, ...]
    params_total: int  # whole model, after the round
    params_compressible: int  # the re-parameterised layers, after the round
    compressible_before: int  # the same layers as dense matrices, before compression
    eps: float  # perturbation intensity of the hutchinson estimator
    mean_loss: float  # mean training loss over the round's tuning steps
    skipped_batches: int  # batches ignored for non-finite values so far
    elapsed: float  # seconds since compression started
    removed: int = 0  # bases removed this round, all layers
    loss_before: float = float("nan")  # task loss on the fixed monitor batch just before the cut
    loss_after: float = float("nan")  # the same just after it
    curvature: str = ""  # what the profiling measured: a curvature source, "gradient" or "none"
    score: str = ""
    #: share of pool bases whose first-order term passed the significance test (bsi with gradient_z > 0);
    #: nan when no test ran (another score, z = 0, or a source without per-example gradients)
    significant_gradients: float = float("nan")
    #: the size this round landed on (a stop of the run's path, or its target_ratio; KeepRatio in keep mode,
    #: last round only); None for a round in between. A consumer that wants the model of that size copies it now.
    stop: float | None = None
    #: where the curvature was measured: "all" (every active basis: the Fisher, free from per-example gradients),
    #: "pool" (the candidate pool only: Hutchinson's probes; and every run recorded before 2026-11-28) or ""
    #: (the score reads no curvature). The scores cover every basis, and a whole-model cut can be planned from
    #: them (bsi.analysis.whatif), only where it is "all" or the score needs no curvature.
    curvature_scope: str = "pool"

    @property
    def compressible_ratio(self) -> float:
        """Compressible-layer parameters now / before (1.0 = nothing removed)."""
        return self.params_compressible / max(self.compressible_before, 1)


@dataclass(frozen=True)
class SizeReport(_Report):
    """Stage 2 reached one of the run's sizes (``SizeRule.sizes``): the model has that size now.

    A run with stops yields one per size, largest first; the pipeline's model
    has this size until the generator resumes, so a consumer that wants it
    (``bsi sweep``) copies it on receipt.
    """

    target: float  # compressible parameters after / before, as asked
    params_total: int
    params_compressible: int
    compressible_before: int

    @property
    def compressible_ratio(self) -> float:
        return self.params_compressible / max(self.compressible_before, 1)


@dataclass(frozen=True)
class EvalReport(_Report):
    """Task metrics of the model at one point of the pipeline."""

    when: str  # "base", "finetuned", "compressed", "recovered"
    accuracy: float  # exact-match accuracy of the extracted final answer, in [0, 1] (NaN on a text task)
    loss: float  # mean answer-token cross-entropy on the test split (text task: mean next-token NLL, held-out windows)
    examples: int  # test problems answered (text task: held-out windows scored)
    params_total: int
    seconds: float
    perplexity: float | None = None  # text task: exp(loss) on the held-out windows; None on a question/answer task


@dataclass(frozen=True)
class StageReport(_Report):
    """A pipeline stage started or finished (``event`` is "start" or "end")."""

    stage: str  # "finetune", "compress", "recover", "evaluate", "save"
    event: str
    detail: str = ""
    cached: bool = False  # True when the stage's result came from cache


@dataclass(frozen=True)
class DoneReport(_Report):
    """The pipeline finished; ``summary`` is what ``summary.json`` holds."""

    summary: dict[str, Any] = field(default_factory=dict)
    out_dir: str | None = None


#: Any report a stage of the pipeline yields.
Report = StageReport | StepReport | RoundReport | SizeReport | EvalReport | DoneReport
