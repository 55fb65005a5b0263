"""The settings of one run: each stage's dataclass, the whole pipeline's, and the truncation baselines'.

Three levels:

* :class:`CompressConfig`: the pruning stage (the method's Algorithm 1):
  schedule, size, bases, score, curvature source, learning rates; the size
  rule as one choice, :class:`SizeRule` (a target size or the paper's
  KeepRatio), and the Hutchinson curvature's own settings nested in
  :class:`HutchinsonConfig`.
* :class:`FinetuneConfig`: stage 1, task fine-tuning of the dense model;
  :class:`RecoverConfig`: stage 3, fine-tuning the compressed model.
* :class:`PipelineConfig`: the whole run: model, data, the three stages,
  evaluation and numerics.

:class:`BaselineConfig` holds what only the truncation methods read. The
fields' defaults *are* the ``default`` preset (:mod:`bsi.config.presets`
gives it no overrides), so ``PipelineConfig()`` in Python and ``bsi
compress`` run the same job.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from bsi.config.fields import (
    AUTOCAST_CHOICES,
    BASES,
    CENTER_GRADIENTS,
    CURVATURES,
    DTYPES,
    HESSIAN_METHODS,
    PROBE_SCOPES,
    PROTOCOL_NAMES,
    RECOVER_TARGETS,
    SCORE_WINDOWS,
    SCORES,
    SELECTIONS,
    SIZE_MODES,
    TASK_KINDS,
    WITHIN_LAYER,
    JsonConfig,
    check,
    check_choice,
    is_integer,
    is_number,
    option,
)
from bsi.errors import BSIError


@dataclass
class HutchinsonConfig(JsonConfig):
    """The settings of the Hutchinson curvature source only (``CompressConfig.curvature="hutchinson"``).

    The method's own estimate of the Hessian diagonal: gradients at ``+eps``
    and ``-eps`` symmetric random perturbations of the coefficients, one probe
    per layer or one over the whole model, their difference over ``2 eps``.
    ``eps`` is the perturbation intensity; left unset it follows the eps rule,
    ``max(min(2^-(f+1) * sigma_max / eps_alpha, eps_max), eps_floor)`` with
    ``f`` the dtype's fraction bits (:func:`bsi.method.scores.eps_rule`). The
    Fisher sources read none of these. In files and flags the fields stay
    flat: ``--probe-scope``, ``"probe_scope"`` in a ``compress`` section.
    """

    probe_scope: str = option("layer", "hutchinson: one probe per layer (1 + 2L passes: 421 for a 210-layer model; "
                                       "3x less error at equal time on the embedded model) or one joint probe "
                                       "over the model (3 passes per probe, cross-layer noise)",
                              choices=PROBE_SCOPES)
    hessian_method: str = option("fd", "hutchinson: fd (finite differences of gradients) or hvp (exact "
                                       "Hessian-vector products by double backward)", choices=HESSIAN_METHODS)
    probes_per_batch: int = option(1, "hutchinson: probes averaged on each profiling batch")
    center_gradient: str = option("exact", "hutchinson fd, model scope: exact (own pass) or average "
                                           "((g+ + g-)/2, one pass fewer)", choices=CENTER_GRADIENTS)
    eps: float | None = option(None, "perturbation intensity in (0, 1) (default: the rule for the dtype)")
    eps_alpha: float = option(0.01, "eps rule: allowed relative rounding error alpha")
    eps_max: float = option(0.1, "eps rule: upper bound eps_max < 1")
    eps_floor: float = option(1e-4, "eps rule: lower bound (fp32 round-off of the gradients swamps smaller "
                                     "steps); 0 keeps the method's rule")

    def __post_init__(self) -> None:
        check_choice(self.probe_scope, "probe_scope", PROBE_SCOPES)
        check_choice(self.hessian_method, "hessian_method", HESSIAN_METHODS)
        check_choice(self.center_gradient, "center_gradient", CENTER_GRADIENTS)
        if self.eps is not None:
            check(is_number(self.eps) and 0 < self.eps < 1, f"eps must be in (0, 1), got {self.eps}")
        check(is_number(self.eps_alpha) and self.eps_alpha > 0, f"eps_alpha must be > 0, got {self.eps_alpha}")
        check(is_number(self.eps_max) and 0 < self.eps_max < 1, f"eps_max must be in (0, 1), got {self.eps_max}")
        check(is_number(self.eps_floor) and 0 <= self.eps_floor <= self.eps_max,
               f"eps_floor must be in [0, eps_max], got {self.eps_floor}")
        check(is_integer(self.probes_per_batch) and self.probes_per_batch >= 1,
               f"probes_per_batch must be an integer >= 1, got {self.probes_per_batch}")


#: The ratio each size mode starts from: the ``default`` preset's target, and the KeepRatio of the paper's rule.
DEFAULT_RATIOS: dict[str, float] = {"target": 0.43, "keep": 0.6}


@dataclass
class _SizeRuleKeys:
    """How files and flags spell a :class:`SizeRule`: the four keys every version of bsi has written.

    Only the chosen mode's ratio is read; the other is written as its default.
    The command line's ``--target-ratio``, ``--keep-ratio`` and ``--size-mode``
    and the help texts are generated from these fields.
    """

    size_mode: str = option("target", "what sets the amount pruned: target (final size) or keep (the "
                                      "importance-mass rule)", choices=SIZE_MODES)
    target_ratio: float = option(DEFAULT_RATIOS["target"], "final parameters of the compressible layers / before, "
                                                           "in (0, 1] (size mode target)",
                                 sets={"size_mode": "target"}, metavar="R")
    keep_ratio: float = option(DEFAULT_RATIOS["keep"], "KeepRatio of the importance-mass rule, in (0, 1] (size mode "
                                                       "keep)", sets={"size_mode": "keep"}, metavar="K")
    stops: tuple[float, ...] = option((), "size mode target: larger target ratios the run passes on its way to "
                                          "target_ratio; each is reached at the end of a round, which names it "
                                          "(RoundReport.stop), so one run yields a model of every size (bsi sweep)",
                                      cli=False)


@dataclass(frozen=True)
class SizeRule(JsonConfig):
    """How much of the compressible layers a run removes: one rule, one ratio.

    * ``SizeRule.target(0.43)``: the compressible layers end at 43% of their
      dense parameters, reached through per-round budgets that shrink evenly
      (:func:`bsi.method.schedule.path_budgets`). ``stops`` are larger sizes
      the run passes on its way, each at the end of a round, so one run
      yields a model of every size (``bsi sweep`` relies on it):
      ``SizeRule.target(0.25, stops=(0.6, 0.4))``.
    * ``SizeRule.keep(0.6)``: the paper's rule. Each round keeps, in every
      layer's candidate pool, the most important bases whose importance
      adds up to ``KeepRatio ** (1/T)`` of the pool's total *positive*
      importance (a basis of negative importance always goes, and so does
      a pool whose scores are all negative), so the final size follows
      from the scores rather than being stated in advance.

    Files and flags spell the rule with the keys bsi has always written
    (``size_mode``, ``target_ratio``, ``keep_ratio``, ``stops``; see
    :class:`_SizeRuleKeys`): ``--keep-ratio 0.4`` means ``SizeRule.keep(0.4)``.
    Only the chosen mode's ratio is read; the other is written as its
    default (:data:`DEFAULT_RATIOS`) so that files keep their shape.
    """

    mode: str = "target"
    ratio: float = DEFAULT_RATIOS["target"]
    stops: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        check_choice(self.mode, "size_mode", SIZE_MODES)
        check(is_number(self.ratio) and 0 < self.ratio <= 1, f"{self.mode}_ratio must be in (0, 1], got {self.ratio}")
        check(isinstance(self.stops, (list, tuple)) and all(is_number(x) for x in self.stops),
               f"stops must be a list of numbers, got {self.stops}")
        object.__setattr__(self, "stops", tuple(sorted({float(x) for x in self.stops}, reverse=True)))
        if self.stops:
            check(self.mode == "target", "stops need size mode target (a target_ratio), not keep_ratio")
            check(all(self.ratio < x <= 1 for x in self.stops),
                   f"every stop must lie in (target_ratio, 1] = ({self.ratio}, 1], got {list(self.stops)}")

    @classmethod
    def target(cls, ratio: float, stops: tuple[float, ...] | list[float] = ()) -> SizeRule:
        """End at ``ratio`` of the dense size, passing the larger sizes ``stops`` on the way."""
        return cls("target", ratio, tuple(stops))

    @classmethod
    def keep(cls, ratio: float) -> SizeRule:
        """The paper's importance-mass rule with KeepRatio ``ratio``."""
        return cls("keep", ratio)

    @classmethod
    def file_keys(cls) -> type:
        """Files and flags write the rule with :class:`_SizeRuleKeys`' four keys."""
        return _SizeRuleKeys

    @property
    def sizes(self) -> tuple[float, ...]:
        """Every size the run lands on, largest first: the stops, then the ratio."""
        return (*self.stops, self.ratio)

    def to_dict(self) -> dict[str, Any]:
        """The rule as files write it: the mode, a ratio per mode (the other mode's at its default), the stops."""
        ratios = {f"{mode}_ratio": self.ratio if mode == self.mode else DEFAULT_RATIOS[mode] for mode in SIZE_MODES}
        return {"size_mode": self.mode, **ratios, "stops": self.stops}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SizeRule:
        """The rule a file or the flags spell: ``size_mode`` picks which of the two ratios is read.

        Both ratios are checked, so a mistyped value is an error even when its
        mode is not the one chosen.
        """
        if not isinstance(data, dict):
            raise BSIError(f"the size rule must be a JSON object of its keys, got {type(data).__name__}")
        keys: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(cls.file_keys())}
        unknown = sorted(set(data) - set(keys))
        check(not unknown, f"unknown size rule key(s) {', '.join(unknown)}; valid keys: {', '.join(keys)}")
        values = keys | data
        for mode in SIZE_MODES:
            ratio = values[f"{mode}_ratio"]
            check(is_number(ratio) and 0 < ratio <= 1, f"{mode}_ratio must be in (0, 1], got {ratio}")
        check_choice(values["size_mode"], "size_mode", SIZE_MODES)
        return cls(values["size_mode"], values[f"{values['size_mode']}_ratio"], values["stops"])


@dataclass
class CompressConfig(JsonConfig):
    """The pruning stage: the method's Algorithm 1, with the target-size mode and gradual cuts.

    Schedule (the method's names in brackets)::

        total iterations  = iters_per_epoch [NumIterPerEpoch] * pruning_epochs [PruningEpochs]
        per round         = round(total / rounds [PruningRounds T])               [IterPerPruning]
        profiling / round = round(sampling_ratio [SamplingIterRatio] * per round) [NumProfilingIter]
        keep per round    = KeepRatio ** (1 / rounds)                             [KeepRatioPerPruning]

    ``size`` is the one rule that decides how much goes (:class:`SizeRule`):
    a target size stated in advance (``SizeRule.target(0.43)``, the final size
    of the compressible layers as a share of their dense size, reached through
    per-round budgets that shrink evenly) or the paper's importance-mass rule
    (``SizeRule.keep(0.6)``, KeepRatio). Files and flags spell it as before:
    ``--target-ratio 0.43``, ``"keep_ratio": 0.6``.

    ``curvature`` names the source of the second-order term; the settings only
    the Hutchinson source reads (its probes, the perturbation intensity
    ``eps`` and its rule) sit under it in ``hutchinson``
    (:class:`HutchinsonConfig`). Files and flags keep them flat
    (``--probe-scope``; ``"probe_scope"`` in the ``compress`` section).
    """

    #: keys of earlier versions, accepted and ignored when reading JSON: ``seed`` (the run's one seed,
    #: ``PipelineConfig.seed``, now seeds the probes and auxiliary vectors too).
    LEGACY_KEYS = ("seed",)

    @classmethod
    def section_types(cls) -> dict[str, type[JsonConfig]]:
        """The two sections of the pruning stage, both written flat: the Hutchinson settings and the size rule."""
        return {"hutchinson": HutchinsonConfig, "size": SizeRule}

    score: str = option("bsi", "importance score: bsi (gradient + curvature), bsi-grad (gradient only), "
                               "basel (|sigma|); two one-change ablations of bsi: bsi-curvature (its curvature "
                               "term alone) and bsi-grad-tested (its gradient term alone, under its z-test)",
                        choices=SCORES)
    size: SizeRule = option(default_factory=SizeRule, flat=True,
                            help="how much is pruned: a target size or the paper's KeepRatio (SizeRule); "
                                 "flat in files and flags (size_mode, target_ratio, keep_ratio, stops)")
    rounds: int = option(8, "PruningRounds T: pruning rounds")
    iters_per_epoch: int = option(120, "NumIterPerEpoch: iterations of the pruning stage per epoch")
    pruning_epochs: float = option(1.0, "PruningEpochs")
    sampling_ratio: float = option(0.25, "SamplingIterRatio: share of each round spent profiling, in (0, 1]")
    gamma: float = option(1.0, "candidate-pool exponent: rho = ratio ** (gamma / rounds) of the sigma mass is "
                               "protected; larger gamma, larger pools")
    selection: str = option("auto", "size mode target: which bases meet a round's budget: global (least "
                                    "importance per parameter across layers; bsi and bsi-grad, whose scores "
                                    "are loss changes), mass (one keep fraction shared by every layer's mass "
                                    "rule) or auto (global for bsi and bsi-grad, mass for basel)",
                            choices=SELECTIONS)
    within_layer: str = option("score", "once a round's budget is split across layers, which bases each layer loses: "
                                        "score (its lowest score, the method's) or magnitude (its smallest |sigma|: the "
                                        "score decides only how many)", choices=WITHIN_LAYER)
    max_cut_factor: float = option(2.0, "a round removes at most this multiple of its even share of any "
                                        "layer's bases (0: no limit, the paper's rule)")
    bases: str = option("whitened", "bases of the Basel form: whitened (SVD of W S, S S^T the covariance of "
                                    "the layer's inputs on task batches) or svd (SVD of W)", choices=BASES)
    calibration_batches: int = option(16, "task batches whose inputs set the whitened bases")
    whitening_damping: float = option(1e-3, "added to the input covariance, times its mean diagonal, before "
                                            "the Cholesky factorisation")
    curvature: str = option("fisher", "curvature source for the second-order term: fisher (per-example "
                                      "gradients, free), mc-fisher (labels sampled from the model, one "
                                      "extra backward), hutchinson (the method's symmetric perturbations)",
                            choices=CURVATURES)
    hutchinson: HutchinsonConfig = option(default_factory=HutchinsonConfig, flat=True,
                                          help="settings of the hutchinson curvature only (probes, perturbation "
                                               "intensity eps); flat in files and flags")
    score_window: str = option("round", "which batches a round's scores average: round (also the tuning "
                                        "steps' per-example gradients, free; the fisher curvature too) or "
                                        "profiling (the last iterations only, the method's)",
                               choices=SCORE_WINDOWS)
    gradient_z: float = option(5.0, "bsi: keep a basis's first-order term only where its gradient exceeds this "
                                    "many standard errors (from the per-example gradients); 0: always (the "
                                    "method's estimate)", metavar="Z")
    aux_rank: int = option(8, "auxiliary vectors per layer")
    lr: float = option(1e-3, "learning rate of sigma while pruning")
    aux_lr: float = option(2e-4, "learning rate of the auxiliary vectors while pruning")
    distill: float = option(0.0, "weight w of the distillation term in the tuning steps: task loss + w * KL to "
                                 "the fine-tuned dense model (0: the task loss only)")
    max_skipped_batches: int = option(20, "stop after this many batches with non-finite values", cli=False)

    def __post_init__(self) -> None:
        if isinstance(self.hutchinson, dict):
            self.hutchinson = HutchinsonConfig.from_dict(self.hutchinson)
        if isinstance(self.size, dict):
            self.size = SizeRule.from_dict(self.size)
        check(isinstance(self.size, SizeRule), f"size must be a SizeRule, got {type(self.size).__name__}")
        check_choice(self.score, "score", SCORES)
        check_choice(self.selection, "selection", SELECTIONS)
        check_choice(self.within_layer, "within_layer", WITHIN_LAYER)
        check(self.selection != "global" or self.score != "basel",
               "selection global compares importance across layers, which basel's |sigma| cannot do; use selection mass")
        check_choice(self.bases, "bases", BASES)
        check_choice(self.curvature, "curvature", CURVATURES)
        check_choice(self.score_window, "score_window", SCORE_WINDOWS)
        check(is_integer(self.rounds) and self.rounds >= 1, f"rounds must be an integer >= 1, got {self.rounds}")
        check(is_number(self.pruning_epochs) and self.pruning_epochs > 0, f"pruning_epochs must be > 0, got {self.pruning_epochs}")
        check(is_integer(self.iters_per_epoch) and self.iters_per_epoch >= 1,
               f"iters_per_epoch must be an integer >= 1, got {self.iters_per_epoch}")
        check(is_number(self.sampling_ratio) and 0 < self.sampling_ratio <= 1,
               f"sampling_ratio must be in (0, 1], got {self.sampling_ratio}")
        check(is_number(self.gamma) and self.gamma > 0, f"gamma must be > 0, got {self.gamma}")
        check(is_number(self.max_cut_factor) and (self.max_cut_factor == 0 or self.max_cut_factor >= 1),
               f"max_cut_factor must be 0 (no limit) or >= 1, got {self.max_cut_factor}")
        check(is_integer(self.calibration_batches) and self.calibration_batches >= 1,
               f"calibration_batches must be an integer >= 1, got {self.calibration_batches}")
        check(is_number(self.whitening_damping) and self.whitening_damping >= 0,
               f"whitening_damping must be >= 0, got {self.whitening_damping}")
        check(is_number(self.gradient_z) and 0 <= self.gradient_z <= 100, f"gradient_z must be in [0, 100], got {self.gradient_z}")
        check(is_integer(self.aux_rank) and self.aux_rank >= 0, f"aux_rank must be an integer >= 0, got {self.aux_rank}")
        check(is_number(self.lr) and is_number(self.aux_lr) and self.lr >= 0 and self.aux_lr >= 0,
               "learning rates must be >= 0")
        check(is_number(self.distill) and 0 <= self.distill <= 100, f"distill must be in [0, 100], got {self.distill}")
        check(self.max_skipped_batches >= 0, "max_skipped_batches must be >= 0")
        if self.round_length < 2:
            raise BSIError(
                f"each pruning round has {self.round_length} iteration(s); raise iters_per_epoch or "
                "pruning_epochs, or lower rounds, so every round has at least 2"
            )

    # Derived schedule -----------------------------------------------------
    @property
    def total_iters(self) -> int:
        """NumIterPerEpoch * PruningEpochs."""
        return max(1, round(self.iters_per_epoch * self.pruning_epochs))

    @property
    def round_length(self) -> int:
        """IterPerPruning: iterations per pruning round (tuning then profiling)."""
        return max(1, round(self.iters_per_epoch * self.pruning_epochs / self.rounds))

    @property
    def selection_rule(self) -> str:
        """The selection in force: ``auto`` resolved (``global`` for loss-unit scores, ``mass`` for basel)."""
        if self.selection != "auto":
            return self.selection
        return "mass" if self.score == "basel" else "global"

    @property
    def profiling_iters(self) -> int:
        """NumProfilingIter: the last iterations of each round, used for statistics only (>= 1)."""
        return min(self.round_length, max(1, round(self.sampling_ratio * self.round_length)))

    @property
    def keep_per_round(self) -> float:
        """KeepRatioPerPruning = KeepRatio ** (1/T) (size mode keep)."""
        return float(self.size.ratio ** (1 / self.rounds))

    @property
    def pool_rho(self) -> float:
        """rho = ratio ** (gamma / T): share of sigma mass protected from the pool (the size rule's ratio)."""
        return float(self.size.ratio ** (self.gamma / self.rounds))


@dataclass
class FinetuneConfig(JsonConfig):
    """Stage 1, task fine-tuning of the dense model: ``steps`` AdamW steps at peak learning rate ``lr``."""

    steps: int = option(50, "AdamW steps (0: skip the stage)")
    lr: float = option(2e-4, "peak learning rate (linear warm-up, then cosine decay to a tenth)")
    warmup_steps: int = option(5, "steps of linear warm-up")
    weight_decay: float = option(0.0, "AdamW weight decay", cli=False)
    max_grad_norm: float = option(1.0, "gradient-norm clipping", cli=False)

    def __post_init__(self) -> None:
        check(is_integer(self.steps) and self.steps >= 0, f"steps must be an integer >= 0, got {self.steps}")
        check(is_number(self.lr) and self.lr >= 0, f"lr must be >= 0, got {self.lr}")
        check(is_integer(self.warmup_steps) and self.warmup_steps >= 0, f"warmup_steps must be >= 0, got {self.warmup_steps}")
        check(is_number(self.max_grad_norm) and self.max_grad_norm > 0, f"max_grad_norm must be > 0, got {self.max_grad_norm}")


@dataclass
class RecoverConfig(FinetuneConfig):
    """Stage 3, recovery: fine-tune the compressed model on the task again.

    ``train="factors"`` trains the compressed model's own parameters: the two
    factors of every low-rank layer (``U diag(sigma)`` and ``V``), the layers
    kept dense, and the norms (and the embeddings if asked). ``train="sigma"``
    trains only the coefficients and auxiliary vectors, as the method's
    pruning stage does (the paper-faithful ablation).
    """

    steps: int = option(96, "AdamW steps (0: skip the stage)")
    lr: float = option(2e-5, "peak learning rate (linear warm-up, then cosine decay to a tenth)")
    warmup_steps: int = option(6, "steps of linear warm-up")
    train: str = option("factors", "what recovery trains: factors (the low-rank factors, dense layers and "
                                   "norms) or sigma (coefficients and auxiliary vectors only)", choices=RECOVER_TARGETS)
    train_embeddings: bool = option(False, "recovery also trains the embeddings (factors only)")
    distill: float = option(0.0, "weight w of the distillation term: task loss + w * KL to the fine-tuned dense "
                                 "model (0: the task loss only)")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice(self.train, "train", RECOVER_TARGETS)
        check(is_number(self.distill) and 0 <= self.distill <= 100, f"distill must be in [0, 100], got {self.distill}")


@dataclass
class PipelineConfig(JsonConfig):
    """The three-stage pipeline: (1) task fine-tune, (2) compress, (3) recovery fine-tune."""

    @classmethod
    def section_types(cls) -> dict[str, type[JsonConfig]]:
        """The three stages' sections, nested in files: ``finetune``, ``recover``, ``compress``."""
        return {"finetune": FinetuneConfig, "recover": RecoverConfig, "compress": CompressConfig}

    model: str = option("smollm2-135m-instruct", "model: smollm2-135m-instruct (embedded), gemma3-270m (after "
                                                 "`make gemma`; Gemma's terms apply), tiny-random-llama, a local "
                                                 "folder or a hub id")
    data: str = option("embedded-math", "task data: embedded-math, a local .jsonl file or a datasets hub name; "
                                         "text (perplexity): wikitext-2 (packaged), a .txt file, a folder of .txt files, "
                                         "a .jsonl file with a text field")
    task: str = option("auto", "kind of task: qa (question/answer, accuracy) or text (every token trained, perplexity "
                               "on a held-out part); auto: text for wikitext-2, .txt files, folders and .jsonl files "
                               "whose records have text_field but no question_field, qa otherwise (a hub id: give "
                               "text for a hub text dataset)", choices=TASK_KINDS)
    text_field: str = option("text", "text task: JSON field (or hub column) holding the text")
    window: int = option(512, "text task: tokens per window, for training and for perplexity (at most the model's "
                              "context)")
    held_out_fraction: float = option(0.1, "text task: share of the tokens held out for perplexity, the tail after a "
                                           "seeded shuffle of the documents, when the text states no held-out part "
                                           "(wikitext-2 always holds out test.txt)")
    question_field: str = option("question", "JSON field holding the question")
    answer_field: str = option("answer", "JSON field holding the worked answer (last line '#### <number>')")
    train_size: int | None = option(None, "cap on training examples (text task: training windows) (default: all; "
                                          "2000 generated for the embedded task)")
    test_size: int = option(100, "held-out test examples")
    batch_size: int = option(8, "examples per mini-batch")
    max_length: int = option(160, "longest tokenised example (prompt + answer)")
    finetune: FinetuneConfig = option(default_factory=FinetuneConfig, help="stage 1")
    compress: CompressConfig = option(default_factory=CompressConfig, help="stage 2")
    recover: RecoverConfig = option(default_factory=RecoverConfig, help="stage 3")
    skip_finetune: bool = option(False, "start from the model as given (no stage 1)")
    dense_recovery: bool = option(False, "the equal-budget reference: also train the fine-tuned dense model with the "
                                         "recovery's steps and settings (no compression) and evaluate it on the same "
                                         "problems, so the compressed model is compared with a dense model that had "
                                         "the same training")
    distill_temperature: float = option(1.0, "softmax temperature of the distillation loss")
    validation_size: int = option(0, "training examples (text task: the last training windows) set aside as a "
                                     "validation set, never trained on (bsi sweep chooses each method's recovery "
                                     "learning rate by its loss there)")
    eval_examples: int = option(100, "test examples answered and scored for accuracy (0: skip evaluation)")
    eval_loss_examples: int | None = option(None, "test examples scored for the answer-token loss, the first "
                                                  "eval_examples of them also answered (default: eval_examples)")
    eval_windows: int | None = option(None, "text task: held-out windows scored for perplexity, the first N of the "
                                            "held-out stream, 0 to skip the evaluation (default: all of them)")
    eval_stride: int | None = option(None, "text task: tokens between the starts of two evaluation windows; below the "
                                           "window, each window scores only its last eval_stride tokens (default: "
                                           "the window, non-overlapping windows)")
    eval_batch_size: int = option(16, "examples (text task: windows) per evaluation batch")
    max_new_tokens: int = option(48, "longest generated answer")
    dtype: str = option("auto", "auto (bfloat16 on CUDA, float32 on CPU) | float32 | bfloat16 | float16",
                        choices=("auto",) + DTYPES)
    autocast: str = option("off", "on: bfloat16 matrix products in the training steps (fine-tune, tuning, recovery) "
                                  "of a float32 model, weights, optimizer, scores, calibration and evaluation in "
                                  "float32. Off by default: on 2 CPU cores it cost the fine-tuned model 12 points "
                                  "and saved no time end to end (docs/log.md)", choices=AUTOCAST_CHOICES)
    device: str = option("auto", "auto | cpu | cuda[:N]")
    trust_remote_code: bool = option(False, "allow custom model code from the hub")
    gradient_checkpointing: bool = option(False, "recompute activations in backward (less memory)")
    fsdp: bool = option(False, "under a launcher with several processes, shard the Basel form's bases across "
                               "them with FSDP (each holds about 1/N) while pruning; one process: no effect")
    seed: int = option(0, "seed of everything random: test/validation splits, batch order, calibration batches, "
                          "probes, the auxiliary vectors' start")
    protocol: str = option("tuned", "settings of the engine methods: tuned (bsi's improved defaults) or paper (the "
                                    "published method: plain SVD bases, per-layer mass rule, symmetric-perturbation "
                                    "curvature), or paper with one change (paper-whitened: whitened bases; "
                                    "paper-layer-probes: one curvature probe per layer); applied after the preset, "
                                    "before the other flags", choices=PROTOCOL_NAMES)
    preset: str | None = option(None, "the preset this configuration started from", cli=False)

    def __post_init__(self) -> None:
        for name, kind in (("finetune", FinetuneConfig), ("recover", RecoverConfig), ("compress", CompressConfig)):
            if isinstance(getattr(self, name), dict):
                setattr(self, name, kind.from_dict(getattr(self, name)))
        check(bool(self.model), "model must not be empty")
        check(bool(self.data), "data must not be empty")
        check(is_integer(self.batch_size) and self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}")
        check(is_integer(self.max_length) and self.max_length >= 16, f"max_length must be >= 16, got {self.max_length}")
        check(is_integer(self.test_size) and self.test_size >= 1, f"test_size must be >= 1, got {self.test_size}")
        check(is_integer(self.eval_examples) and self.eval_examples >= 0, f"eval_examples must be >= 0, got {self.eval_examples}")
        check(is_integer(self.eval_batch_size) and self.eval_batch_size >= 1,
               f"eval_batch_size must be >= 1, got {self.eval_batch_size}")
        check(is_integer(self.max_new_tokens) and self.max_new_tokens >= 1,
               f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        check(is_number(self.distill_temperature) and self.distill_temperature > 0,
               f"distill_temperature must be > 0, got {self.distill_temperature}")
        check_choice(self.dtype, "dtype", ("auto",) + DTYPES)
        check(is_integer(self.validation_size) and self.validation_size >= 0,
               f"validation_size must be an integer >= 0, got {self.validation_size}")
        check(self.eval_loss_examples is None or (is_integer(self.eval_loss_examples) and self.eval_loss_examples >= 0),
               f"eval_loss_examples must be an integer >= 0, got {self.eval_loss_examples}")
        check(self.scored_examples <= self.test_size,
               f"the evaluation scores {self.scored_examples} test examples but test_size is {self.test_size}: "
               "raise test_size or lower eval_examples / eval_loss_examples")
        check_choice(self.protocol, "protocol", PROTOCOL_NAMES)
        check(isinstance(self.dense_recovery, bool), f"dense_recovery must be true or false, got {self.dense_recovery}")
        check(not self.dense_recovery or (self.recover.steps > 0 and self.recover.train == "factors"),
               "dense_recovery trains the dense model as recovery trains the compressed one: it needs recovery steps "
               "(recover_steps > 0) training factors (recover_train factors), or leave it off")
        check(self.train_size is None or (is_integer(self.train_size) and self.train_size >= 1),
               f"train_size must be >= 1, got {self.train_size}")
        check_choice(self.task, "task", TASK_KINDS)
        check(self.task != "text" or self.data != "embedded-math",
               "task text needs text data (embedded-math is a question/answer task): give --data wikitext-2 or a text")
        check(isinstance(self.text_field, str) and bool(self.text_field), "text_field must not be empty")
        check(is_integer(self.window) and self.window >= 2,
               f"window must be an integer >= 2 tokens (one of context, one to predict), got {self.window}")
        check(is_number(self.held_out_fraction) and 0 < self.held_out_fraction <= 1,
               f"held_out_fraction must be in (0, 1], got {self.held_out_fraction}")
        check(self.eval_windows is None or (is_integer(self.eval_windows) and self.eval_windows >= 0),
               f"eval_windows must be an integer >= 0 (0: no evaluation; leave it out for all), got {self.eval_windows}")
        check(self.eval_stride is None or (is_integer(self.eval_stride) and 1 <= self.eval_stride <= self.window),
               f"eval_stride must be a whole number of tokens in [1, window] = [1, {self.window}], got {self.eval_stride}")

    @property
    def scored_examples(self) -> int:
        """Test examples the evaluation scores: the loss's set, which contains the answered ones."""
        return max(self.eval_examples, self.eval_loss_examples or 0)

    @property
    def needs_teacher(self) -> bool:
        """True when a stage distils from the fine-tuned dense model (a frozen copy is kept)."""
        return self.compress.distill > 0 or self.recover.distill > 0


#: (class name, field) -> the settings class of a nested section (each class's :meth:`~JsonConfig.section_types`).
NESTED: dict[tuple[str, str], type[JsonConfig]] = {
    (owner.__name__, name): section for owner in (PipelineConfig, CompressConfig)
    for name, section in owner.section_types().items()}
#: A nested section whose files and flags use other keys than its fields -> the dataclass naming those keys.
FILE_KEYS: dict[type, type] = {SizeRule: SizeRule.file_keys()}
#: The stages' sections of a :class:`PipelineConfig`, in the order files write them.
SECTIONS = ("finetune", "compress", "recover")

#: How the truncation baselines share a size among layers, and which Fisher information FWSVD weighs rows with.
ALLOCATIONS = ("published", "uniform", "sensitivity")
FISHER = ("example", "batch")


@dataclass
class BaselineConfig(JsonConfig):
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
