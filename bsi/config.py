"""Configuration: validated dataclasses, serialised to JSON, plus named presets.

Three levels:

* :class:`CompressConfig` — the pruning stage (METHOD.md sec. 5): schedule,
  score, perturbation intensity, candidate pool, learning rates.
* :class:`FinetuneConfig` — a plain fine-tuning stage (stage 1 on the dense
  model, stage 3 on the compressed one).
* :class:`PipelineConfig` — the whole run: model, data, the three stages,
  evaluation and numerics.

Every dataclass validates itself in ``__post_init__`` and raises
:class:`~bsi.errors.BSIError` with a one-line message naming the field, so a
bad value is caught before any model is loaded or any file is touched.
``from_dict`` rejects unknown keys, so a typo in a JSON config fails loudly.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from bsi.errors import BSIError
from bsi.method.scores import SCORES

PROBE_SCOPES = ("model", "layer")
HESSIAN_METHODS = ("fd", "hvp")
CENTER_GRADIENTS = ("exact", "average")
DTYPES = ("float32", "bfloat16", "float16")

T = TypeVar("T")


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise BSIError(message)


class _JsonConfig:
    """Mixin: ``to_dict``/``from_dict``/``to_json``/``from_json`` with unknown-key rejection."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls: type[T], data: dict[str, Any]) -> T:
        if not isinstance(data, dict):
            raise BSIError(f"{cls.__name__} must be a JSON object, got {type(data).__name__}")
        fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise BSIError(
                f"unknown {cls.__name__} key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(fields))}"
            )
        kwargs = {}
        for name, value in data.items():
            sub = _NESTED.get((cls.__name__, name))
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
class CompressConfig(_JsonConfig):
    """The pruning stage: Algorithm 1 of METHOD.md, plus the target-size mode.

    Schedule (paper names in brackets)::

        total iterations  = iters_per_epoch [NumIterPerEpoch] * pruning_epochs [PruningEpochs]
        per round         = round(total / rounds [PruningRounds T])           [IterPerPruning]
        profiling / round = round(sampling_ratio [SamplingIterRatio] * per round) [NumProfilingIter]
        keep per round    = keep_ratio [KeepRatio] ** (1 / rounds)            [KeepRatioPerPruning]

    Exactly one of ``keep_ratio`` (the paper's importance-mass rule) and
    ``target_ratio`` (final parameters of the compressible layers / before)
    drives how much is pruned.
    """

    score: str = "bsi"
    keep_ratio: float | None = 0.5
    target_ratio: float | None = None
    rounds: int = 4
    pruning_epochs: float = 1.0
    iters_per_epoch: int = 40
    sampling_ratio: float = 0.25
    gamma: float = 1.0
    eps: float | None = None  # None: the rule for the run's dtype (see bsi.method.scores.eps_rule)
    eps_alpha: float = 0.01
    eps_max: float = 0.1
    probe_scope: str = "model"
    hessian_method: str = "fd"
    probes_per_batch: int = 1
    center_gradient: str = "exact"  # "average": (g+ + g-)/2 replaces the centre pass (model scope, fd)
    aux_rank: int = 8
    lr: float = 1e-3  # learning rate of sigma
    aux_lr: float = 2e-4  # learning rate of the auxiliary vectors
    max_skipped_batches: int = 20
    seed: int = 0

    def __post_init__(self) -> None:
        _check(self.score in SCORES, f"score must be one of {', '.join(SCORES)}, got '{self.score}'")
        _check(
            (self.keep_ratio is None) != (self.target_ratio is None),
            "give exactly one of keep_ratio (--keep-ratio) and target_ratio (--target-ratio)",
        )
        if self.keep_ratio is not None:
            _check(0 < self.keep_ratio <= 1, f"keep_ratio must be in (0, 1], got {self.keep_ratio}")
        if self.target_ratio is not None:
            _check(0 < self.target_ratio <= 1, f"target_ratio must be in (0, 1], got {self.target_ratio}")
        _check(isinstance(self.rounds, int) and self.rounds >= 1, f"rounds must be an integer >= 1, got {self.rounds}")
        _check(self.pruning_epochs > 0, f"pruning_epochs must be > 0, got {self.pruning_epochs}")
        _check(self.iters_per_epoch >= 1, f"iters_per_epoch must be >= 1, got {self.iters_per_epoch}")
        _check(0 < self.sampling_ratio <= 1, f"sampling_ratio must be in (0, 1], got {self.sampling_ratio}")
        _check(self.gamma > 0, f"gamma must be > 0, got {self.gamma}")
        if self.eps is not None:
            _check(0 < self.eps < 1, f"eps must be in (0, 1), got {self.eps}")
        _check(self.eps_alpha > 0, f"eps_alpha must be > 0, got {self.eps_alpha}")
        _check(0 < self.eps_max < 1, f"eps_max must be in (0, 1), got {self.eps_max}")
        _check(self.probe_scope in PROBE_SCOPES, f"probe_scope must be one of {', '.join(PROBE_SCOPES)}, got '{self.probe_scope}'")
        _check(self.hessian_method in HESSIAN_METHODS, f"hessian_method must be one of {', '.join(HESSIAN_METHODS)}, got '{self.hessian_method}'")
        _check(self.center_gradient in CENTER_GRADIENTS,
               f"center_gradient must be one of {', '.join(CENTER_GRADIENTS)}, got '{self.center_gradient}'")
        _check(self.probes_per_batch >= 1, f"probes_per_batch must be >= 1, got {self.probes_per_batch}")
        _check(self.aux_rank >= 0, f"aux_rank must be >= 0, got {self.aux_rank}")
        _check(self.lr >= 0 and self.aux_lr >= 0, "learning rates must be >= 0")
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
    def profiling_iters(self) -> int:
        """NumProfilingIter: the last iterations of each round, used for statistics only (>= 1)."""
        return min(self.round_length, max(1, round(self.sampling_ratio * self.round_length)))

    @property
    def keep_per_round(self) -> float:
        """KeepRatioPerPruning = KeepRatio ** (1/T) (importance-mass mode)."""
        return (self.keep_ratio if self.keep_ratio is not None else 1.0) ** (1 / self.rounds)

    @property
    def pool_rho(self) -> float:
        """rho = KeepRatio ** (gamma / T): share of sigma mass protected from the pool."""
        ratio = self.keep_ratio if self.keep_ratio is not None else self.target_ratio
        return float(ratio) ** (self.gamma / self.rounds)


@dataclass
class FinetuneConfig(_JsonConfig):
    """A fine-tuning stage: ``steps`` AdamW steps at peak learning rate ``lr``."""

    steps: int = 100
    lr: float = 1e-4
    warmup_steps: int = 10
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0

    def __post_init__(self) -> None:
        _check(isinstance(self.steps, int) and self.steps >= 0, f"fine-tune steps must be an integer >= 0, got {self.steps}")
        _check(self.lr >= 0, f"fine-tune lr must be >= 0, got {self.lr}")
        _check(self.warmup_steps >= 0, f"warmup_steps must be >= 0, got {self.warmup_steps}")
        _check(self.max_grad_norm > 0, f"max_grad_norm must be > 0, got {self.max_grad_norm}")


@dataclass
class PipelineConfig(_JsonConfig):
    """The three-stage pipeline: (1) task fine-tune, (2) compress, (3) recovery fine-tune."""

    model: str = "smollm2-135m-instruct"
    data: str = "embedded-math"
    question_field: str = "question"
    answer_field: str = "answer"
    train_size: int | None = None
    test_size: int = 100
    batch_size: int = 8
    max_length: int = 256
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    compress: CompressConfig = field(default_factory=CompressConfig)
    recover: FinetuneConfig = field(default_factory=lambda: FinetuneConfig(steps=40, lr=5e-4, warmup_steps=4))
    skip_finetune: bool = False
    eval_examples: int = 100
    eval_batch_size: int = 16
    max_new_tokens: int = 96
    dtype: str = "auto"  # auto: bfloat16 on CUDA, float32 on CPU
    device: str = "auto"  # auto: cuda if available
    trust_remote_code: bool = False
    gradient_checkpointing: bool = False
    seed: int = 0
    preset: str | None = None

    def __post_init__(self) -> None:
        for name in ("finetune", "recover"):
            if isinstance(getattr(self, name), dict):
                setattr(self, name, FinetuneConfig.from_dict(getattr(self, name)))
        if isinstance(self.compress, dict):
            self.compress = CompressConfig.from_dict(self.compress)
        _check(bool(self.model), "model must not be empty")
        _check(bool(self.data), "data must not be empty")
        _check(self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}")
        _check(self.max_length >= 16, f"max_length must be >= 16, got {self.max_length}")
        _check(self.test_size >= 1, f"test_size must be >= 1, got {self.test_size}")
        _check(self.eval_examples >= 0, f"eval_examples must be >= 0, got {self.eval_examples}")
        _check(self.eval_batch_size >= 1, f"eval_batch_size must be >= 1, got {self.eval_batch_size}")
        _check(self.max_new_tokens >= 1, f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        _check(self.dtype in ("auto",) + DTYPES, f"dtype must be auto or one of {', '.join(DTYPES)}, got '{self.dtype}'")
        _check(self.train_size is None or self.train_size >= 1, f"train_size must be >= 1, got {self.train_size}")


_NESTED: dict[tuple[str, str], type] = {
    ("PipelineConfig", "finetune"): FinetuneConfig,
    ("PipelineConfig", "recover"): FinetuneConfig,
    ("PipelineConfig", "compress"): CompressConfig,
}


# ---------------------------------------------------------------- presets
#: Named starting points; CLI flags override them. Values are nested dicts of
#: PipelineConfig fields.
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
        "compress": {"rounds": 2, "iters_per_epoch": 8, "sampling_ratio": 0.5, "keep_ratio": 0.5, "aux_rank": 2},
        "recover": {"steps": 4, "lr": 1e-3, "warmup_steps": 0},
    },
    # The CPU demo on the embedded model: about 10 minutes on 2 cores (8 to 10 min measured, fine-tune included).
    "default": {
        "test_size": 100,
        "eval_examples": 100,
        "batch_size": 8,
        "max_length": 160,
        "max_new_tokens": 48,
        "finetune": {"steps": 50, "lr": 2e-4, "warmup_steps": 5},
        "compress": {"rounds": 4, "iters_per_epoch": 32, "sampling_ratio": 0.25, "keep_ratio": 0.6},
        "recover": {"steps": 16, "lr": 5e-4, "warmup_steps": 2},
    },
    # A comparison sweep of the embedded model on a 2-core CPU (two to three minutes a cell). Stage 1
    # is the default preset's, so its cached fine-tune is shared; compression is 2 short rounds and
    # recovery 8 steps, with 50 test examples. Shows trends, not the paper's numbers.
    "sweep-cpu": {
        "test_size": 100,
        "eval_examples": 50,
        "batch_size": 8,
        "max_length": 160,
        "max_new_tokens": 48,
        "finetune": {"steps": 50, "lr": 2e-4, "warmup_steps": 5},
        "compress": {"rounds": 2, "iters_per_epoch": 12, "sampling_ratio": 0.25, "keep_ratio": 0.6},
        "recover": {"steps": 8, "lr": 5e-4, "warmup_steps": 1},
    },
    # The paper's scale (GPU): long schedules, many profiling batches.
    "paper": {
        "test_size": 1000,
        "eval_examples": 1000,
        "batch_size": 16,
        "max_length": 512,
        "max_new_tokens": 256,
        "finetune": {"steps": 3000, "lr": 2e-5, "warmup_steps": 100},
        "compress": {"rounds": 10, "iters_per_epoch": 500, "pruning_epochs": 2.0, "sampling_ratio": 0.1,
                     "keep_ratio": 0.3, "aux_rank": 8},
        "recover": {"steps": 1000, "lr": 1e-4, "warmup_steps": 50},
    },
}


def deep_update(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``base`` with ``override`` merged in, recursing into nested dicts."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_update(out[key], value)
        else:
            out[key] = value
    return out


def make_config(preset: str | None = None, overrides: dict[str, Any] | None = None) -> PipelineConfig:
    """Build a validated :class:`PipelineConfig` from a preset name and nested overrides.

    ``overrides`` may set ``compress.target_ratio``; the preset's
    ``keep_ratio`` is then dropped, since the two modes exclude each other.
    """
    data: dict[str, Any] = PipelineConfig().to_dict()
    if preset is not None:
        if preset not in PRESETS:
            raise BSIError(f"unknown preset '{preset}': use one of {', '.join(PRESETS)}")
        data = deep_update(data, PRESETS[preset])
        data["preset"] = preset
    overrides = overrides or {}
    comp = overrides.get("compress", {})
    if comp.get("target_ratio") is not None and "keep_ratio" not in comp:
        data["compress"]["keep_ratio"] = None
    if comp.get("keep_ratio") is not None and "target_ratio" not in comp:
        data["compress"]["target_ratio"] = None
    data = deep_update(data, overrides)
    return PipelineConfig.from_dict(data)


def is_finite_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)
