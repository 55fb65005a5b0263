"""Configuration: validated dataclasses, serialised to JSON, plus named presets.

Three levels:

* :class:`CompressConfig` — the pruning stage (the method's Algorithm 1):
  schedule, size, bases, score, curvature source, learning rates; the size
  rule as one choice, :class:`SizeRule` (a target size or the paper's
  KeepRatio), and the Hutchinson curvature's own settings nested in
  :class:`HutchinsonConfig`.
* :class:`FinetuneConfig` — stage 1, task fine-tuning of the dense model;
  :class:`RecoverConfig` — stage 3, fine-tuning the compressed model.
* :class:`PipelineConfig` — the whole run: model, data, the three stages,
  evaluation and numerics.

Every field carries its help text in its metadata (:func:`option`). The
command line (``bsi compress --help``), the sweep's flags and the dashboard's
form are all built from these fields, so a new setting needs to be written
once, here. Every dataclass validates itself in ``__post_init__`` and raises
:class:`~bsi.errors.BSIError` with a one-line message naming the field, so a
bad value is caught before any model is loaded or any file is touched.
``from_dict`` rejects unknown keys, so a typo in a JSON config fails loudly.

The fields' defaults *are* the ``default`` preset (:data:`PRESETS` gives it no
overrides), so ``PipelineConfig()`` in Python and ``bsi compress`` run the same
job; every other preset is a set of overrides on top of the defaults.

This module imports nothing heavy (no torch), so ``bsi --help`` stays fast.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from .errors import BSIError

SCORES = ("bsi", "bsi-grad", "basel")
SIZE_MODES = ("target", "keep")
SELECTIONS = ("auto", "mass", "global")
BASES = ("whitened", "svd")
CURVATURES = ("fisher", "mc-fisher", "hutchinson")
PROBE_SCOPES = ("layer", "model")
HESSIAN_METHODS = ("fd", "hvp")
CENTER_GRADIENTS = ("exact", "average")
SCORE_WINDOWS = ("profiling", "round")
RECOVER_TARGETS = ("factors", "sigma")
TASK_KINDS = ("auto", "qa", "text")
DTYPES = ("float32", "bfloat16", "float16")
AUTOCAST_CHOICES = ("off", "on")
PROTOCOL_NAMES = ("tuned", "paper")
WITHIN_LAYER = ("score", "magnitude")

T = TypeVar("T")


def option(default: Any = dataclasses.MISSING, help: str = "", *, choices: tuple | None = None,
           sets: dict[str, Any] | None = None, cli: bool = True, default_factory: Any = dataclasses.MISSING,
           metavar: str | None = None, flat: bool = False) -> Any:
    """A dataclass field with the metadata the CLI and the dashboard are generated from.

    Args:
        help: one line shown by ``--help`` and next to the dashboard's input.
        choices: the allowed values (validated, listed in the help).
        sets: other fields this one implies when a user gives it, e.g.
            ``keep_ratio`` sets ``size_mode="keep"`` (see :func:`implied_updates`).
        cli: False hides the field from the command line (still settable in JSON).
        flat: the field is a nested section whose fields are written flat, as
            the parent's own keys, in files, flags and overrides
            (``CompressConfig.hutchinson``: ``probe_scope``, not
            ``hutchinson.probe_scope``), so nesting it changed no file or flag.
    """
    meta = {"help": help, "choices": choices, "sets": dict(sets or {}), "cli": cli, "metavar": metavar, "flat": flat}
    if default_factory is not dataclasses.MISSING:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise BSIError(message)


def _check_choice(value: Any, name: str, choices: tuple) -> None:
    _check(value in choices, f"{name} must be one of {', '.join(map(str, choices))}, got '{value}'")


class _JsonConfig:
    """Mixin: ``to_dict``/``from_dict``/``to_json``/``from_json`` with unknown-key rejection."""

    def to_dict(self) -> dict[str, Any]:
        """The settings as plain JSON values: nested sections as dicts, a ``flat`` section's keys in its place."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if isinstance(value, _JsonConfig):
                if f.metadata.get("flat"):
                    out |= value.to_dict()
                    continue
                out[f.name] = value.to_dict()
            else:
                out[f.name] = copy.deepcopy(value)
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls: type[T], data: dict[str, Any]) -> T:
        if not isinstance(data, dict):
            raise BSIError(f"{cls.__name__} must be a JSON object, got {type(data).__name__}")
        fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        data = {k: v for k, v in data.items() if k not in getattr(cls, "LEGACY_KEYS", ())}
        for f in fields.values():  # a flat section's keys, as files and flags write them, go into the section
            if f.metadata.get("flat"):
                names = {g.name for g in flat_fields(NESTED[(cls.__name__, f.name)])}
                given = data.get(f.name) or {}
                if not isinstance(given, (dict, _JsonConfig)):
                    raise BSIError(f"{f.name} must be a JSON object of its settings, got {type(given).__name__}")
                given = given.to_dict() if isinstance(given, _JsonConfig) else dict(given)
                data = {k: v for k, v in data.items() if k not in names} | {
                    f.name: given | {k: v for k, v in data.items() if k in names}}
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise BSIError(
                f"unknown {cls.__name__} key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(fields))}"
            )
        kwargs = {}
        for name, value in data.items():
            sub = NESTED.get((cls.__name__, name))
            kwargs[name] = sub.from_dict(value) if sub is not None and isinstance(value, dict) else value
        try:
            return cls(**kwargs)  # type: ignore[call-arg]
        except TypeError as err:
            raise BSIError(f"bad {cls.__name__}: {err}") from None

    @classmethod
    def from_json(cls: type[T], path: str | Path) -> T:
        path = Path(path)
        if not path.is_file():
            raise BSIError(f"config file '{path}' does not exist")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise BSIError(f"config file '{path}' is not valid JSON: {err}") from None
        return cls.from_dict(data)  # type: ignore[attr-defined]


@dataclass
class HutchinsonConfig(_JsonConfig):
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
        _check_choice(self.probe_scope, "probe_scope", PROBE_SCOPES)
        _check_choice(self.hessian_method, "hessian_method", HESSIAN_METHODS)
        _check_choice(self.center_gradient, "center_gradient", CENTER_GRADIENTS)
        if self.eps is not None:
            _check(_number(self.eps) and 0 < self.eps < 1, f"eps must be in (0, 1), got {self.eps}")
        _check(_number(self.eps_alpha) and self.eps_alpha > 0, f"eps_alpha must be > 0, got {self.eps_alpha}")
        _check(_number(self.eps_max) and 0 < self.eps_max < 1, f"eps_max must be in (0, 1), got {self.eps_max}")
        _check(_number(self.eps_floor) and 0 <= self.eps_floor <= self.eps_max,
               f"eps_floor must be in [0, eps_max], got {self.eps_floor}")
        _check(_integer(self.probes_per_batch) and self.probes_per_batch >= 1,
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
class SizeRule(_JsonConfig):
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
        _check_choice(self.mode, "size_mode", SIZE_MODES)
        _check(_number(self.ratio) and 0 < self.ratio <= 1, f"{self.mode}_ratio must be in (0, 1], got {self.ratio}")
        _check(isinstance(self.stops, (list, tuple)) and all(_number(x) for x in self.stops),
               f"stops must be a list of numbers, got {self.stops}")
        object.__setattr__(self, "stops", tuple(sorted({float(x) for x in self.stops}, reverse=True)))
        if self.stops:
            _check(self.mode == "target", "stops need size mode target (a target_ratio), not keep_ratio")
            _check(all(self.ratio < x <= 1 for x in self.stops),
                   f"every stop must lie in (target_ratio, 1] = ({self.ratio}, 1], got {list(self.stops)}")

    @classmethod
    def target(cls, ratio: float, stops: "tuple[float, ...] | list[float]" = ()) -> "SizeRule":
        """End at ``ratio`` of the dense size, passing the larger sizes ``stops`` on the way."""
        return cls("target", ratio, tuple(stops))

    @classmethod
    def keep(cls, ratio: float) -> "SizeRule":
        """The paper's importance-mass rule with KeepRatio ``ratio``."""
        return cls("keep", ratio)

    @property
    def sizes(self) -> tuple[float, ...]:
        """Every size the run lands on, largest first: the stops, then the ratio."""
        return (*self.stops, self.ratio)

    def to_dict(self) -> dict[str, Any]:
        """The rule as files write it: the mode, a ratio per mode (the other mode's at its default), the stops."""
        ratios = {f"{mode}_ratio": self.ratio if mode == self.mode else DEFAULT_RATIOS[mode] for mode in SIZE_MODES}
        return {"size_mode": self.mode, **ratios, "stops": self.stops}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SizeRule":
        """The rule a file or the flags spell: ``size_mode`` picks which of the two ratios is read.

        Both ratios are checked, so a mistyped value is an error even when its
        mode is not the one chosen.
        """
        if not isinstance(data, dict):
            raise BSIError(f"the size rule must be a JSON object of its keys, got {type(data).__name__}")
        keys = {f.name: f.default for f in dataclasses.fields(_SizeRuleKeys)}
        unknown = sorted(set(data) - set(keys))
        _check(not unknown, f"unknown size rule key(s) {', '.join(unknown)}; valid keys: {', '.join(keys)}")
        values = keys | data
        for mode in SIZE_MODES:
            ratio = values[f"{mode}_ratio"]
            _check(_number(ratio) and 0 < ratio <= 1, f"{mode}_ratio must be in (0, 1], got {ratio}")
        _check_choice(values["size_mode"], "size_mode", SIZE_MODES)
        return cls(values["size_mode"], values[f"{values['size_mode']}_ratio"], values["stops"])


@dataclass
class CompressConfig(_JsonConfig):
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

    score: str = option("bsi", "importance score: bsi (gradient + curvature), bsi-grad (gradient only), "
                               "basel (|sigma|)", choices=SCORES)
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
        _check(isinstance(self.size, SizeRule), f"size must be a SizeRule, got {type(self.size).__name__}")
        _check_choice(self.score, "score", SCORES)
        _check_choice(self.selection, "selection", SELECTIONS)
        _check_choice(self.within_layer, "within_layer", WITHIN_LAYER)
        _check(self.selection != "global" or self.score != "basel",
               "selection global compares importance across layers, which basel's |sigma| cannot do; use selection mass")
        _check_choice(self.bases, "bases", BASES)
        _check_choice(self.curvature, "curvature", CURVATURES)
        _check_choice(self.score_window, "score_window", SCORE_WINDOWS)
        _check(_integer(self.rounds) and self.rounds >= 1, f"rounds must be an integer >= 1, got {self.rounds}")
        _check(_number(self.pruning_epochs) and self.pruning_epochs > 0, f"pruning_epochs must be > 0, got {self.pruning_epochs}")
        _check(_integer(self.iters_per_epoch) and self.iters_per_epoch >= 1,
               f"iters_per_epoch must be an integer >= 1, got {self.iters_per_epoch}")
        _check(_number(self.sampling_ratio) and 0 < self.sampling_ratio <= 1,
               f"sampling_ratio must be in (0, 1], got {self.sampling_ratio}")
        _check(_number(self.gamma) and self.gamma > 0, f"gamma must be > 0, got {self.gamma}")
        _check(_number(self.max_cut_factor) and (self.max_cut_factor == 0 or self.max_cut_factor >= 1),
               f"max_cut_factor must be 0 (no limit) or >= 1, got {self.max_cut_factor}")
        _check(_integer(self.calibration_batches) and self.calibration_batches >= 1,
               f"calibration_batches must be an integer >= 1, got {self.calibration_batches}")
        _check(_number(self.whitening_damping) and self.whitening_damping >= 0,
               f"whitening_damping must be >= 0, got {self.whitening_damping}")
        _check(_number(self.gradient_z) and 0 <= self.gradient_z <= 100, f"gradient_z must be in [0, 100], got {self.gradient_z}")
        _check(_integer(self.aux_rank) and self.aux_rank >= 0, f"aux_rank must be an integer >= 0, got {self.aux_rank}")
        _check(_number(self.lr) and _number(self.aux_lr) and self.lr >= 0 and self.aux_lr >= 0,
               "learning rates must be >= 0")
        _check(_number(self.distill) and 0 <= self.distill <= 100, f"distill must be in [0, 100], got {self.distill}")
        _check(self.max_skipped_batches >= 0, "max_skipped_batches must be >= 0")
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
        return self.size.ratio ** (1 / self.rounds)

    @property
    def pool_rho(self) -> float:
        """rho = ratio ** (gamma / T): share of sigma mass protected from the pool (the size rule's ratio)."""
        return float(self.size.ratio) ** (self.gamma / self.rounds)


@dataclass
class FinetuneConfig(_JsonConfig):
    """Stage 1, task fine-tuning of the dense model: ``steps`` AdamW steps at peak learning rate ``lr``."""

    steps: int = option(50, "AdamW steps (0: skip the stage)")
    lr: float = option(2e-4, "peak learning rate (linear warm-up, then cosine decay to a tenth)")
    warmup_steps: int = option(5, "steps of linear warm-up")
    weight_decay: float = option(0.0, "AdamW weight decay", cli=False)
    max_grad_norm: float = option(1.0, "gradient-norm clipping", cli=False)

    def __post_init__(self) -> None:
        _check(_integer(self.steps) and self.steps >= 0, f"steps must be an integer >= 0, got {self.steps}")
        _check(_number(self.lr) and self.lr >= 0, f"lr must be >= 0, got {self.lr}")
        _check(_integer(self.warmup_steps) and self.warmup_steps >= 0, f"warmup_steps must be >= 0, got {self.warmup_steps}")
        _check(_number(self.max_grad_norm) and self.max_grad_norm > 0, f"max_grad_norm must be > 0, got {self.max_grad_norm}")


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
        _check_choice(self.train, "train", RECOVER_TARGETS)
        _check(_number(self.distill) and 0 <= self.distill <= 100, f"distill must be in [0, 100], got {self.distill}")


@dataclass
class PipelineConfig(_JsonConfig):
    """The three-stage pipeline: (1) task fine-tune, (2) compress, (3) recovery fine-tune."""

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
                                    "curvature); applied after the preset, before the other flags", choices=PROTOCOL_NAMES)
    preset: str | None = option(None, "the preset this configuration started from", cli=False)

    def __post_init__(self) -> None:
        for name, kind in (("finetune", FinetuneConfig), ("recover", RecoverConfig), ("compress", CompressConfig)):
            if isinstance(getattr(self, name), dict):
                setattr(self, name, kind.from_dict(getattr(self, name)))
        _check(bool(self.model), "model must not be empty")
        _check(bool(self.data), "data must not be empty")
        _check(_integer(self.batch_size) and self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}")
        _check(_integer(self.max_length) and self.max_length >= 16, f"max_length must be >= 16, got {self.max_length}")
        _check(_integer(self.test_size) and self.test_size >= 1, f"test_size must be >= 1, got {self.test_size}")
        _check(_integer(self.eval_examples) and self.eval_examples >= 0, f"eval_examples must be >= 0, got {self.eval_examples}")
        _check(_integer(self.eval_batch_size) and self.eval_batch_size >= 1,
               f"eval_batch_size must be >= 1, got {self.eval_batch_size}")
        _check(_integer(self.max_new_tokens) and self.max_new_tokens >= 1,
               f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        _check(_number(self.distill_temperature) and self.distill_temperature > 0,
               f"distill_temperature must be > 0, got {self.distill_temperature}")
        _check_choice(self.dtype, "dtype", ("auto",) + DTYPES)
        _check(_integer(self.validation_size) and self.validation_size >= 0,
               f"validation_size must be an integer >= 0, got {self.validation_size}")
        _check(self.eval_loss_examples is None or (_integer(self.eval_loss_examples) and self.eval_loss_examples >= 0),
               f"eval_loss_examples must be an integer >= 0, got {self.eval_loss_examples}")
        _check(self.scored_examples <= self.test_size,
               f"the evaluation scores {self.scored_examples} test examples but test_size is {self.test_size}: "
               "raise test_size or lower eval_examples / eval_loss_examples")
        _check_choice(self.protocol, "protocol", PROTOCOL_NAMES)
        _check(isinstance(self.dense_recovery, bool), f"dense_recovery must be true or false, got {self.dense_recovery}")
        _check(not self.dense_recovery or (self.recover.steps > 0 and self.recover.train == "factors"),
               "dense_recovery trains the dense model as recovery trains the compressed one: it needs recovery steps "
               "(recover_steps > 0) training factors (recover_train factors), or leave it off")
        _check(self.train_size is None or (_integer(self.train_size) and self.train_size >= 1),
               f"train_size must be >= 1, got {self.train_size}")
        _check_choice(self.task, "task", TASK_KINDS)
        _check(self.task != "text" or self.data != "embedded-math",
               "task text needs text data (embedded-math is a question/answer task): give --data wikitext-2 or a text")
        _check(isinstance(self.text_field, str) and bool(self.text_field), "text_field must not be empty")
        _check(_integer(self.window) and self.window >= 2,
               f"window must be an integer >= 2 tokens (one of context, one to predict), got {self.window}")
        _check(_number(self.held_out_fraction) and 0 < self.held_out_fraction <= 1,
               f"held_out_fraction must be in (0, 1], got {self.held_out_fraction}")
        _check(self.eval_windows is None or (_integer(self.eval_windows) and self.eval_windows >= 0),
               f"eval_windows must be an integer >= 0 (0: no evaluation; leave it out for all), got {self.eval_windows}")
        _check(self.eval_stride is None or (_integer(self.eval_stride) and 1 <= self.eval_stride <= self.window),
               f"eval_stride must be a whole number of tokens in [1, window] = [1, {self.window}], got {self.eval_stride}")

    @property
    def scored_examples(self) -> int:
        """Test examples the evaluation scores: the loss's set, which contains the answered ones."""
        return max(self.eval_examples, self.eval_loss_examples or 0)

    @property
    def needs_teacher(self) -> bool:
        """True when a stage distils from the fine-tuned dense model (a frozen copy is kept)."""
        return self.compress.distill > 0 or self.recover.distill > 0


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _integer(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


#: (class name, field) -> the dataclass of a nested section.
NESTED: dict[tuple[str, str], type] = {
    ("PipelineConfig", "finetune"): FinetuneConfig,
    ("PipelineConfig", "recover"): RecoverConfig,
    ("PipelineConfig", "compress"): CompressConfig,
    ("CompressConfig", "hutchinson"): HutchinsonConfig,
    ("CompressConfig", "size"): SizeRule,
}
#: A nested section whose files and flags use other keys than its fields -> the dataclass naming those keys.
FILE_KEYS: dict[type, type] = {SizeRule: _SizeRuleKeys}
SECTIONS = ("finetune", "compress", "recover")


def flat_fields(cls: type) -> list[dataclasses.Field]:
    """The fields of a config dataclass as files and flags name them: a ``flat`` section's fields in its place.

    ``flat_fields(CompressConfig)`` lists ``score``, then ``size_mode``,
    ``target_ratio``, ``keep_ratio``, ``stops`` (how files spell the
    :class:`SizeRule`), ..., ``curvature``, then ``probe_scope``,
    ``hessian_method``, ... (:class:`HutchinsonConfig`'s), then ``score_window``.
    """
    out: list[dataclasses.Field] = []
    for f in dataclasses.fields(FILE_KEYS.get(cls, cls)):
        out += flat_fields(NESTED[(cls.__name__, f.name)]) if f.metadata.get("flat") else [f]
    return out


def flat_value(config: Any, name: str) -> Any:
    """The value a file or flag calls ``name`` in ``config`` (a section), as the section's file writes it."""
    return config.to_dict()[name]


def field_help(cls: type, name: str) -> str:
    """The help text of a config field (for the CLI and the dashboard); a flat section's fields by their own names."""
    return {f.name: f for f in flat_fields(cls)}[name].metadata.get("help", "")


# -------------------------------------------------------------- protocols
#: The engine methods' settings under each protocol (``PipelineConfig.protocol``). ``paper`` is the
#: published BSI and Basel (docs/method.md, "Protocols"); ``tuned`` is bsi's defaults, each deviation
#: measured there. Schedules (rounds, iterations) are the preset's. The truncation baselines are the
#: published methods under both (:class:`bsi.pipeline.methods.BaselineConfig`).
#: The settings a protocol fixes for the engine methods; ``tuned`` takes each from :class:`CompressConfig`'s
#: defaults (they are written once, there), ``paper`` its own values and two Hutchinson-only settings.
TUNED_FIELDS = ("bases", "selection", "max_cut_factor", "curvature", "score_window", "gradient_z", "eps_floor")

PROTOCOLS: dict[str, dict[str, Any]] = {
    "tuned": {
        "description": "bsi's defaults: whitened bases, global selection for loss-unit scores, a per-round cut cap, "
                       "the Fisher curvature over every batch of the round, first-order terms tested against noise",
        "compress": {name: CompressConfig().to_dict()[name] for name in TUNED_FIELDS},
    },
    "paper": {
        "description": "the published method: plain SVD bases, each layer's importance-mass rule, no cut cap, "
                       "symmetric-perturbation (Hutchinson) curvature on the profiling batches, the plain Taylor "
                       "estimate, the eps rule",
        "compress": {"bases": "svd", "selection": "mass", "max_cut_factor": 0.0, "curvature": "hutchinson",
                     "probe_scope": "model", "hessian_method": "fd", "score_window": "profiling",
                     "gradient_z": 0.0, "eps_floor": 0.0},
    },
}


def protocol_deviations(config: "PipelineConfig") -> list[str]:
    """The ``compress`` settings of ``config`` that differ from its protocol's, as ``field=value`` (empty: none).

    A run states its protocol; when a flag overrode part of it, the run's
    notes say exactly what, so a row is never called the published method
    when it is not.
    """
    wanted = PROTOCOLS[config.protocol]["compress"]
    have = config.compress.to_dict()
    return [f"{key}={have[key]}" for key, value in wanted.items() if have[key] != value]


# ---------------------------------------------------------------- presets
#: What every CPU preset of the embedded model shares, the fine-tune included (so its cache is shared).
_EMBEDDED_CPU: dict[str, Any] = {
    "test_size": 100,
    "eval_examples": 100,
    "batch_size": 8,
    "max_length": 160,
    "max_new_tokens": 48,
    "finetune": {"steps": 50, "lr": 2e-4, "warmup_steps": 5},
}

#: Named starting points; flags and overrides go on top. Values are nested
#: dicts of PipelineConfig fields.
PRESETS: dict[str, dict[str, Any]] = {
    # Seconds, on the tiny random model: for tests and smoke runs.
    "smoke": {
        "model": "tiny-random-llama",
        "test_size": 8,
        "eval_examples": 8,
        "batch_size": 4,
        "max_length": 128,
        "max_new_tokens": 16,
        "finetune": {"steps": 4, "lr": 1e-3, "warmup_steps": 0},
        "compress": {"rounds": 2, "iters_per_epoch": 8, "sampling_ratio": 0.5, "target_ratio": 0.6, "aux_rank": 2,
                     "calibration_batches": 2},
        "recover": {"steps": 4, "lr": 1e-3, "warmup_steps": 0},
    },
    # The best trade on the embedded model (2 cores): 1.82x whole model at 92% against the dense model's 84%
    # (100 problems, paired 95% interval of the difference +2 to +14 points) in 9 min 16 s with the
    # fine-tune cached (PRESET_COSTS, docs/benchmarks.md). The dataclasses' own defaults, so that the Python API
    # (PipelineConfig()) and `bsi compress` run the same job. Change a default above, not here.
    "default": {},
    # The first look, about 90 seconds to 2 minutes on 2 cores with the fine-tune cached (PRESET_COSTS): the embedded
    # presets' fine-tune (the same cache, so only the compression runs), then 4 rounds of 3 iterations to 70% of the
    # linear layers, 8 recovery steps and 20 test problems. 4 rounds of 3 rather than 2 of 6, at the same cost (171 s
    # and 169 s of one thread): smaller cuts; 70% / loss 0.0343 against 55% / 0.0465 on its 20 problems (dense 80% /
    # 0.0232; 2026-11-26, data/runs/tour).
    "tour": {
        **_EMBEDDED_CPU,
        "eval_examples": 20,
        "compress": {"rounds": 4, "iters_per_epoch": 12, "sampling_ratio": 0.25, "target_ratio": 0.7,
                     "calibration_batches": 4},
        "recover": {"steps": 8, "lr": 2e-5, "warmup_steps": 1},
    },
    # The quick demo (the default until 2026-11-25): 1.31x at 75% against 84% in 4 min 7 s, fine-tune cached.
    "demo": {
        **_EMBEDDED_CPU,
        "compress": {"rounds": 4, "iters_per_epoch": 32, "target_ratio": 0.7},
        "recover": {"steps": 16, "lr": 2e-5, "warmup_steps": 2},
    },
    # A longer CPU run on the embedded model for a smaller model that still works (about 1.6x whole model).
    "quality": {
        **_EMBEDDED_CPU,
        "compress": {"rounds": 4, "iters_per_epoch": 64, "sampling_ratio": 0.25, "target_ratio": 0.52},
        "recover": {"steps": 48, "lr": 2e-5, "warmup_steps": 4},
    },
    # A comparison sweep of the embedded model on a 2-core CPU (the default preset's cached fine-tune);
    # `bsi sweep` adds its grid and the truncation baselines' recovery (SWEEP_PRESETS).
    # 4 rounds of 3 iterations rather than 2 of 6, at the same cost: smaller cuts, which the scores'
    # local (Taylor) estimate predicts better; at 0.25 bsi went from 11% / loss 0.81 to 16% / 0.52
    # (basel: 11% / 0.82 and 0.83) on 100 problems (docs/benchmarks.md).
    "sweep-cpu": {
        **_EMBEDDED_CPU,
        "compress": {"rounds": 4, "iters_per_epoch": 12, "sampling_ratio": 0.25},
        "recover": {"steps": 8, "lr": 2e-5, "warmup_steps": 1},
    },
    # The comparison study (`bsi sweep --preset study`; SWEEP_PRESETS adds its grid): the sweep-cpu fine-tune,
    # every method down to 2-5% of the linear layers along one pruning path per method and seed, the same
    # recovery for every method (its learning rate chosen on held-out training problems), and test sets big
    # enough for paired intervals. Two auxiliary vectors per layer: the paper's 8 on a 4096-wide model are
    # 0.2% of a layer's rank, 8 here would be 1.4% and, at 2% of the linear layers, more than the whole budget.
    "study": {
        **_EMBEDDED_CPU,
        "test_size": 400, "eval_examples": 200, "eval_loss_examples": 400, "eval_batch_size": 50,
        "validation_size": 64,
        "compress": {"rounds": 24, "iters_per_epoch": 72, "sampling_ratio": 0.34, "aux_rank": 2},
        "recover": {"steps": 16, "lr": 1e-4, "warmup_steps": 2},
    },
    # The same on fewer sizes and one seed: `bsi sweep --preset study-quick`, 43 min 4 s on 2 cores with an empty
    # cache, fine-tune included (2026-11-26; the seven-method version of 2026-11-25 took 80 minutes).
    "study-quick": {
        **_EMBEDDED_CPU,
        "test_size": 500, "eval_examples": 300, "eval_loss_examples": 500, "eval_batch_size": 50,
        "validation_size": 64,
        "compress": {"rounds": 16, "iters_per_epoch": 48, "sampling_ratio": 0.34, "aux_rank": 2},
        "recover": {"steps": 16, "lr": 1e-4, "warmup_steps": 2},
    },
    # Language modelling on the embedded model (2 CPU cores, 14 min 32 s with an uncached fine-tune; measured in
    # docs/benchmarks.md): WikiText-2 (packaged, tokenized release), windows of 128 tokens, perplexity on the first 256
    # windows of test.txt. `bsi sweep` adds every method at 0.8, 0.6 and 0.4, with and without recovery.
    "text": {
        "data": "wikitext-2",
        "window": 128,
        "eval_windows": 256,
        "finetune": {"steps": 60, "lr": 1e-4, "warmup_steps": 5},
        "compress": {"rounds": 4, "iters_per_epoch": 48, "target_ratio": 0.7},  # 4 rounds of 12 iterations
        "recover": {"steps": 32, "warmup_steps": 2},
    },
    # The paper's scale (GPU): long schedules, many profiling batches (with --protocol paper, the published method).
    "paper-scale": {
        "test_size": 1000,
        "eval_examples": 1000,
        "batch_size": 16,
        "max_length": 512,
        "max_new_tokens": 256,
        "finetune": {"steps": 3000, "lr": 2e-5, "warmup_steps": 100},
        "compress": {"rounds": 10, "iters_per_epoch": 500, "pruning_epochs": 2.0, "sampling_ratio": 0.1,
                     "size_mode": "keep", "keep_ratio": 0.3, "aux_rank": 8, "calibration_batches": 64},
        "recover": {"steps": 1000, "lr": 1e-5, "warmup_steps": 50},
    },
}


@dataclass(frozen=True)
class PresetCost:
    """What one preset costs on a 2-core CPU, as measured, and what it gives up for that time.

    ``cached_seconds`` is the wall time with the task fine-tune already in
    the cache (``$BSI_CACHE``), ``uncached_seconds`` with an empty cache (the
    fine-tune included); ``None`` where it was not measured: no figure here is
    an estimate. ``command`` is what was timed (``bsi compress`` or ``bsi
    sweep``), ``measured`` the date, ``source`` where the measurement is
    written up. The dashboard's preset menu, the README and the docs read
    these, so a figure is stated once.
    """

    command: str
    cached_seconds: float | None
    uncached_seconds: float | None
    measured: str | None
    gives_up: str
    source: str | None = None

    def time_text(self) -> str:
        """``9 min 16 s with the fine-tune cached, 11 min 42 s with an empty cache (2 cores, 2026-11-27)``."""
        from .progress import duration

        parts = [f"{duration(self.cached_seconds)} with the fine-tune cached" if self.cached_seconds else None,
                 f"{duration(self.uncached_seconds)} with an empty cache" if self.uncached_seconds else None]
        shown = ", ".join(p for p in parts if p)
        return f"{shown} ({self.command}, 2 cores, {self.measured})" if shown else "not measured"


#: Every preset's measured cost on 2 CPU cores (docs/benchmarks.md): one stated value per figure.
PRESET_COSTS: dict[str, PresetCost] = {
    "smoke": PresetCost("bsi compress", None, None, None,
                        "everything: a tiny random model for tests, its answers are noise"),
    "tour": PresetCost("bsi compress", 102, None, "2026-11-27",
                       "accuracy you can trust and size: 20 test problems (a paired interval 40 points wide), 4 pruning "
                       "rounds of 3 iterations and 8 recovery steps, a mild 70% of the linear layers (1.31x; 80% -> 70%)"),
    "default": PresetCost("bsi compress", 556, 702, "2026-11-27",
                          "nothing: the best trade found on 2 cores (1.82x at 92%, against the dense model's 84% "
                          "and its 95% with the same 96 recovery steps)",
                          "docs/log.md#make-compress-timed-9-min-16-s-with-the-fine-tune-cached-2026-11-27"),
    "demo": PresetCost("bsi compress", 247, None, "2026-11-25",
                       "size and accuracy: 1.31x at 75% against the dense 84% (4 rounds of 8 iterations, "
                       "16 recovery steps)", "docs/log.md#the-presets-with-todays-code-2026-11-25"),
    "quality": PresetCost("bsi compress", 359, None, "2026-11-25",
                          "size: 1.61x instead of the default's 1.82x, at the dense model's 84%",
                          "docs/log.md#the-presets-with-todays-code-2026-11-25"),
    "sweep-cpu": PresetCost("bsi sweep", None, None, None,
                            "depth of schedule: 4 rounds of 3 iterations and 8 recovery steps per method, "
                            "a ranking check rather than usable models"),
    "study": PresetCost("bsi sweep", None, None, None,
                        "nothing: the full study (seven methods, six sizes, three seeds); about 7 hours of compute "
                        "on 2 cores summed from its rows, never timed in one piece",
                        "docs/log.md#the-study-three-seeds-2026-11-26"),
    "study-quick": PresetCost("bsi sweep", None, 2584, "2026-11-26",
                              "seeds and methods: one seed, four methods (bsi, basel, svd-llm, bsi-grad), four sizes",
                              "docs/log.md#study-quick-in-43-minutes-2026-11-26"),
    "text": PresetCost("bsi compress", None, 872, "2026-11-25",
                       "nothing of its task: language modelling on WikiText-2, perplexity on 256 held-out windows; "
                       "a mild 1.31x", "docs/log.md#text-and-perplexity-2026-11-25"),
    "paper-scale": PresetCost("bsi compress", None, None, None,
                              "nothing: the paper's schedule, for GPUs (hours on a CPU)"),
}


@dataclass(frozen=True)
class MethodSpec:
    """One compression method as the configuration knows it: its name, what it is, what it fixes.

    ``score`` set makes it an *engine* method (the pruning rounds of
    :class:`bsi.method.engine.Compressor` with that score; the protocols apply
    to it); None, a *truncation* method (each layer keeps its first k bases;
    the published method under every protocol). ``within_layer`` set makes a
    named engine variant fix how each layer picks the bases it loses.
    ``variant``: not a published method, so not in a sweep's default list.
    :data:`bsi.pipeline.methods.METHODS` adds what each one runs (torch code).
    """

    name: str
    description: str
    score: str | None = None
    within_layer: str | None = None
    variant: bool = False

    @property
    def is_engine(self) -> bool:
        return self.score is not None

    @property
    def compress_settings(self) -> dict[str, str]:
        """The ``compress`` settings an engine method fixes (empty for a truncation method); the rest are the run's."""
        if not self.is_engine:
            return {}
        return {"score": self.score} | ({} if self.within_layer is None else {"within_layer": self.within_layer})


#: name -> method, in the order tables list them. The one place a method is named.
METHOD_SPECS: dict[str, MethodSpec] = {spec.name: spec for spec in (
    MethodSpec("svd", "plain SVD: each layer keeps its top-k singular triplets"),
    MethodSpec("svd-llm", "SVD-LLM: top-k of the SVD of the weight on whitened task inputs"),
    MethodSpec("fwsvd", "Fisher-weighted SVD (row weights from per-example squared task gradients)"),
    MethodSpec("asvd", "activation-aware SVD (input channels scaled by mean|x|^alpha), ranks by sensitivity"),
    MethodSpec("basel", "Basel: prune the smallest re-learned |sigma|", score="basel"),
    MethodSpec("bsi-grad", "BSI without the curvature term: first-order loss change", score="bsi-grad"),
    MethodSpec("bsi", "BSI: first- plus second-order loss change", score="bsi"),
    # bsi's score splits each round's cut across layers, |sigma| picks the bases inside each layer: in the
    # ranking test this pair left the lowest held-out loss every round (docs/benchmarks.md)
    MethodSpec("bsi-mag", "BSI's per-layer budgets, the smallest |sigma| removed inside each layer (a variant, not a "
                          "published method)", score="bsi", within_layer="magnitude", variant=True),
)}

METHOD_NAMES = tuple(name for name, spec in METHOD_SPECS.items() if not spec.variant)
"""The compared methods, a sweep's default."""

VARIANT_NAMES = tuple(name for name, spec in METHOD_SPECS.items() if spec.variant)
"""Named variants a sweep runs when asked (``--methods bsi,bsi-mag``): not published methods, not in the default."""

ENGINE_METHODS = tuple(name for name, spec in METHOD_SPECS.items() if spec.is_engine)
"""The methods the protocols apply to (the truncation methods are the published ones under every protocol)."""


def is_engine_method(name: str) -> bool:
    """Whether the registered method ``name`` runs the engine (and so takes a protocol's settings)."""
    spec = METHOD_SPECS.get(name)
    return spec is not None and spec.is_engine


@dataclass
class SweepConfig(_JsonConfig):
    """A comparison study: which methods, sizes, seeds and protocols, and how recovery is budgeted.

    Every method gets the same recovery steps (the ``recover`` section of the
    pipeline configuration). With an ``lr_grid``, each method's recovery
    learning rate is chosen from it by the answer-token loss on a validation
    set carved from the *training* data (``validation_size`` of the pipeline
    configuration; never the test problems) at each of ``lr_targets`` (every
    target when empty), by the first seed that runs there; every other target
    and every later seed (in the same command or a later one on the same
    folder) uses the choice made at the nearest of them (in log size). Choices and
    their validation losses are recorded in the results. On a text task the
    validation set is the last ``validation_size`` windows of the training
    part (never the held-out part) and its loss the mean next-token loss.

    ``also_unrecovered`` adds, for every method and size, the model as the
    method left it, before any recovery (rows with ``recover_steps`` 0): one
    sweep then shows every method with no training after compression and
    with the same recovery budget.
    """

    methods: tuple[str, ...] = option(METHOD_NAMES, "methods compared; a named variant ("
                                                    + ", ".join(VARIANT_NAMES) + ") runs only when named")
    targets: tuple[float, ...] = option((0.6, 0.4, 0.25), "target ratios of the compressible layers' parameters, "
                                                          "for every method")
    extra_targets: dict = option(default_factory=dict, help="more targets for some methods only, e.g. "
                                                            "bsi:0.02,basel:0.02 ({\"bsi\": [0.02], ...} in JSON)")
    seeds: tuple[int, ...] = option((0,), "run seeds: each its own splits, fine-tune, batches and probes")
    protocols: tuple[str, ...] = option(("tuned",), "protocols of the engine methods (see PROTOCOLS)")
    protocol_settings: dict = option(default_factory=dict, help="per protocol, pipeline settings its engine runs "
                                                                "need on top (e.g. a longer schedule for paper)")
    protocol_targets: dict = option(default_factory=dict, help="per protocol, the only targets its engine methods "
                                                               "run at, e.g. paper:0.6,paper:0.4 (none: every target)")
    lr_grid: tuple[float, ...] = option((), "recovery learning rates to choose from by validation loss, which "
                                            "needs validation_size (--validation-size) (empty: the recover "
                                            "section's lr for every method)")
    lr_targets: tuple[float, ...] = option((), "targets where the learning rate is chosen, by the first seed run "
                                               "(empty: every target)")
    baseline: dict = option(default_factory=dict, help="settings of the truncation baselines (BaselineConfig "
                                                       "fields; the defaults are the published methods)")
    also_unrecovered: bool = option(False, "also evaluate every method's model of every size before recovery: extra "
                                           "rows with recover_steps 0, in a table of their own (the truncation "
                                           "baselines are usually published without training)")
    speed_repeats: int = option(0, "decode-speed timings per model against the dense one (0: none)")
    speed_tokens: int = option(32, "new tokens per speed timing")

    def __post_init__(self) -> None:
        self.methods = tuple(self.methods)
        self.targets = tuple(float(t) for t in self.targets)
        self.seeds = tuple(int(x) for x in self.seeds)
        self.protocols = tuple(self.protocols)
        self.lr_grid = tuple(float(x) for x in self.lr_grid)
        self.lr_targets = tuple(float(x) for x in self.lr_targets)
        self.extra_targets = {m: tuple(float(t) for t in ts) for m, ts in dict(self.extra_targets).items()}
        self.protocol_targets = {p: tuple(float(t) for t in ts) for p, ts in dict(self.protocol_targets).items()}
        known = (*METHOD_NAMES, *VARIANT_NAMES)
        _check(bool(self.methods), f"name at least one method: {', '.join(known)}")
        for name in self.methods:
            _check(name in known, f"methods must be among {', '.join(known)}, got '{name}'")
        for name in self.extra_targets:
            _check(name in known, f"extra_targets must name methods among {', '.join(known)}, got '{name}'")
        _check(len(set(self.methods)) == len(self.methods), f"methods has duplicates: {', '.join(self.methods)}")
        _check(bool(self.targets), "name at least one target")
        for t in (*self.targets, *(t for ts in self.extra_targets.values() for t in ts), *self.lr_targets):
            _check(_number(t) and 0 < t <= 1, f"targets must be numbers in (0, 1], got {t}")
        _check(len(set(self.targets)) == len(self.targets), f"targets has duplicates: {list(self.targets)}")
        _check(bool(self.seeds) and len(set(self.seeds)) == len(self.seeds),
               f"seeds must be distinct integers, got {list(self.seeds)}")
        _check(bool(self.protocols), "name at least one protocol")
        for name, ts in self.protocol_targets.items():
            _check(bool(ts) and all(t in self.targets for t in ts),
                   f"protocol_targets of {name} must be among the targets {list(self.targets)}, got {list(ts)}")
        for name in (*self.protocols, *self.protocol_settings, *self.protocol_targets):
            _check(name in PROTOCOL_NAMES, f"protocols must be among {', '.join(PROTOCOL_NAMES)}, got '{name}'")
        _check(all(_number(x) and x > 0 for x in self.lr_grid), f"lr_grid must be positive numbers, got {self.lr_grid}")
        _check(all(t in self.targets for t in self.lr_targets),
               f"lr_targets must be among the targets {list(self.targets)}, got {list(self.lr_targets)}")
        _check(isinstance(self.also_unrecovered, bool),
               f"also_unrecovered must be true or false, got {self.also_unrecovered}")
        _check(_integer(self.speed_repeats) and self.speed_repeats >= 0, f"speed_repeats must be >= 0, got {self.speed_repeats}")
        _check(_integer(self.speed_tokens) and self.speed_tokens >= 2, f"speed_tokens must be >= 2, got {self.speed_tokens}")

    def targets_of(self, method: str, protocol: str | None = None) -> tuple[float, ...]:
        """The sizes ``method`` is run at (under ``protocol``, for an engine method), largest first."""
        if is_engine_method(method) and protocol in self.protocol_targets:
            return tuple(sorted(self.protocol_targets[protocol], reverse=True))
        return tuple(sorted({*self.targets, *self.extra_targets.get(method, ())}, reverse=True))

    def lr_target_for(self, target: float) -> float:
        """The target whose learning-rate choice ``target`` uses: itself when chosen there, else the nearest in log size."""
        chosen = self.lr_targets or self.targets
        if target in chosen:
            return target
        return min(chosen, key=lambda t: (abs(math.log(t / target)), -t))


#: What ``bsi sweep --preset NAME`` sets beyond the pipeline preset (fields of :class:`SweepConfig`).
SWEEP_PRESETS: dict[str, dict[str, Any]] = {
    "sweep-cpu": {"targets": (0.6, 0.4, 0.25)},
    # The published engine settings collapse on this model already at 0.6 with a CPU-sized schedule (their
    # schedule search and its cost: docs/benchmarks.md), so the study runs them at the three mildest sizes.
    "study": {"targets": (0.6, 0.4, 0.25, 0.15, 0.1, 0.05), "extra_targets": {"bsi": (0.02,), "basel": (0.02,)},
              "seeds": (0, 1, 2), "protocols": ("tuned", "paper"), "protocol_targets": {"paper": (0.6, 0.4, 0.25)},
              "lr_grid": (2e-5, 1e-4, 5e-4), "lr_targets": (0.4, 0.1)},
    # Learning rates chosen at two sizes: bsi's choice at 0.15 (5e-4) used at 0.4 left it at 10.7% against basel's
    # 37% there; a mild cut wants a smaller rate than a deep one (docs/benchmarks.md, 2026-11-25).
    # Only the methods the study can tell apart: plain `svd`, `fwsvd` and `asvd` answer at most 10.5% at any size on
    # every seed of `study` (docs/benchmarks.md), and `asvd`'s sensitivity search alone took 18 of the seven-method
    # study-quick's 80 minutes on 2 cores (2026-11-25); without the three it takes 43 min 4 s with an empty cache,
    # fine-tune included (2026-11-26; `--methods` adds them back).
    "study-quick": {"methods": ("bsi", "basel", "svd-llm", "bsi-grad"),
                    "targets": (0.4, 0.15, 0.05), "extra_targets": {"bsi": (0.02,), "basel": (0.02,)},
                    "seeds": (0,), "protocols": ("tuned",), "lr_grid": (2e-5, 1e-4, 5e-4), "lr_targets": (0.4, 0.15)},
    "text": {"targets": (0.8, 0.6, 0.4), "also_unrecovered": True},  # every method (the default)
}


def make_sweep_config(preset: str | None, overrides: dict[str, Any] | None = None) -> SweepConfig:
    """The :class:`SweepConfig` of a preset (:data:`SWEEP_PRESETS`; the defaults where it has none) with overrides."""
    return SweepConfig.from_dict({**SWEEP_PRESETS.get(preset or "", {}), **(overrides or {})})


def deep_update(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``base`` with ``override`` merged in, recursing into nested dicts."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_update(out[key], value)
        else:
            out[key] = value
    return out


def implied_updates(overrides: dict[str, Any]) -> dict[str, Any]:
    """``overrides`` plus the fields they imply (an option's ``sets`` metadata), unless given explicitly.

    ``{"compress": {"keep_ratio": 0.4}}`` becomes
    ``{"compress": {"keep_ratio": 0.4, "size_mode": "keep"}}``: a user who
    gives a KeepRatio means the importance-mass rule. This is the one place
    where one setting implies another; the CLI, the sweep and the dashboard
    all go through it.
    """
    out = dict(overrides)
    for section, cls in (("", PipelineConfig), *((s, NESTED[("PipelineConfig", s)]) for s in SECTIONS)):
        values = out if not section else out.get(section)
        if not isinstance(values, dict):
            continue
        values = dict(values)
        for f in flat_fields(cls):
            for key, implied in f.metadata.get("sets", {}).items() if f.name in values else ():
                values.setdefault(key, implied)
        if section:
            out[section] = values
        else:
            out = values
    return out


def make_config(preset: str | None = None, overrides: dict[str, Any] | None = None,
                base: PipelineConfig | None = None) -> PipelineConfig:
    """Build a validated :class:`PipelineConfig` from a preset (or a ``base`` config) and nested overrides.

    Order: the preset, then the protocol's settings when a protocol is named
    (in the overrides or the preset, :data:`PROTOCOLS`), then the overrides.
    Overrides may imply other fields (see :func:`implied_updates`). The same
    as :func:`resolve_config` without a method or sizes.
    """
    return resolve_config(preset, overrides, base=base)


def resolve_config(preset: str | None = None, overrides: dict[str, Any] | None = None, *,
                   base: PipelineConfig | None = None, method: str | None = None, protocol: str | None = None,
                   protocol_settings: dict[str, Any] | None = None,
                   sizes: "tuple[float, ...] | list[float] | None" = None) -> PipelineConfig:
    """The one function that makes a run's configuration: every entry point (CLI, sweep cell, pipeline) comes here.

    The layers, each over the one before:

    1. the field defaults, or ``base`` (a configuration made before, e.g. a
       sweep's shared one), then the ``preset``'s settings;
    2. the protocol's ``compress`` settings (:data:`PROTOCOLS`), when one is
       named: in ``overrides``, as ``protocol`` (a sweep cell's) or by the preset;
    3. ``protocol_settings``: more pipeline settings of that protocol (a sweep's ``protocol_settings``);
    4. ``overrides``, the settings the user gave, with what they imply (:func:`implied_updates`);
    5. what ``method`` fixes when it is an engine method (:attr:`MethodSpec.compress_settings`:
       its score, a variant's ``within_layer``), so a run never says one method and runs another;
    6. ``sizes``: every size the run must reach, as ``target_ratio`` (the smallest) and ``stops``.

    Raises:
        BSIError: on an unknown preset, protocol or method, or any invalid value (one line).
    """
    if base is not None and preset is not None:
        raise BSIError("give a preset or a base config, not both")
    data: dict[str, Any] = (base or PipelineConfig()).to_dict()
    overrides = overrides or {}
    if preset is not None:
        if preset not in PRESETS:
            raise BSIError(f"unknown preset '{preset}': use one of {', '.join(PRESETS)}")
        data = deep_update(data, implied_updates(PRESETS[preset]))
        data["preset"] = preset
    protocol = overrides.get("protocol") or protocol or (PRESETS.get(preset or "", {}).get("protocol") if preset else None)
    if protocol is not None:  # named explicitly: its settings go on the preset's, the flags on both
        _check_choice(protocol, "--protocol", PROTOCOL_NAMES)
        data = deep_update(data, {"protocol": protocol, "compress": PROTOCOLS[protocol]["compress"]})
    data = deep_update(data, protocol_settings or {})
    data = deep_update(data, implied_updates(overrides))
    if method is not None:
        if method not in METHOD_SPECS:
            raise BSIError(f"unknown method '{method}': use one of {', '.join(METHOD_SPECS)}")
        data = deep_update(data, {"compress": METHOD_SPECS[method].compress_settings})
    if sizes:
        ordered = sorted(sizes, reverse=True)
        data = deep_update(data, {"compress": {"size_mode": "target", "target_ratio": ordered[-1],
                                               "stops": list(ordered[:-1])}})
    return PipelineConfig.from_dict(data)


def is_finite_number(x: Any) -> bool:
    return _number(x)
