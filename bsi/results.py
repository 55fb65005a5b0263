"""What a run ends with, typed: :class:`Metrics` of each evaluated model, the :class:`RunSummary` and the :class:`StudyRow`.

``bsi compress`` writes a :class:`RunSummary` as ``summary.json``; the CLI's
table, the dashboard's status line and its saved-run view read one back with
:meth:`RunSummary.from_dict`. ``bsi sweep`` writes one :class:`StudyRow` per
evaluated model as a line of ``results.jsonl``; the study's statistics, its
figure, the answers view, the dashboard's Compare tab and the sweep's
progress lines read them back with :func:`read_study_rows`. Both carry the
same :class:`Metrics`, so a field is named in one place and a reader never
guesses a key. Files written before a field existed read with its default.
This module imports nothing heavy (no torch), so reading a result is fast.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bsi.errors import BSIError
from bsi.files import json_object


@dataclass(frozen=True)
class Metrics:
    """Task metrics: ``accuracy`` in [0, 1] over ``examples`` answered problems, and the mean answer-token ``loss``.

    ``loss_examples`` is how many problems the loss averages over (token-weighted);
    None when it is the same set as the accuracy's.

    On a text task nothing is answered (``accuracy`` NaN, ``examples`` 0), the
    "problems" are the held-out windows (``loss_examples``), ``loss`` is the
    mean next-token NLL over their scored tokens and ``perplexity`` is
    ``exp(loss)``; None for a question/answer task.
    """

    accuracy: float
    loss: float
    examples: int
    loss_examples: int | None = None
    perplexity: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The metrics as a plain dict (JSON-serialisable); ``perplexity`` only on a text task."""
        data = asdict(self)
        if self.perplexity is None:
            del data["perplexity"]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Metrics | None:
        """The metrics of a ``to_dict`` (None stays None)."""
        if data is None:
            return None
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})


#: How the two size ratios of a summary are defined (written beside them in ``summary.json``).
COMPRESSION_RATIO_OF = "whole model parameters before / after (tied weights counted once)"
COMPRESSIBLE_RATIO_OF = "parameters of the compressed linear layers after / before"


@dataclass(frozen=True)
class RunSummary:
    """One ``bsi compress`` run's result: sizes, metrics, protocol, timing and settings (``summary.json``).

    Args:
        method: the method's registered name.
        model, data: what was compressed, on which task (as given).
        params_before, params_after: whole-model parameters (tied weights once).
        compressible_params_before, compressible_params_after: parameters of
            the linear layers the method may compress.
        task: ``qa`` (accuracy) or ``text`` (perplexity).
        metrics_before: the fine-tuned dense model's (None when not evaluated).
        metrics_after: the compressed, recovered model's.
        metrics_dense_recovered: the dense model given the same recovery steps
            (``dense_recovery``); None without it.
        paired: paired bootstrap intervals of the compressed model against
            each dense one (:func:`bsi.pipeline.runner.paired_differences`).
        perplexity: on a text task, the figures' protocol; None otherwise.
        protocol, protocol_deviations: the engine settings' protocol and the
            ``compress`` settings that differ from it.
        eps: the perturbation intensity the last round used (None: no round).
        ranks: each compressed layer's rank in the export.
        seconds: the whole run's wall time.
        device, dtype: where and in what precision it ran.
        autocast: the dtype of the training steps' matrix products when they
            ran under autocast (``bfloat16``), None when they ran in ``dtype``.
        config: the full run configuration (``PipelineConfig.to_dict()``).
        notes: what a reader of the result should know.
        bytes_on_disk, bytes_before: the saved weights' size and the dense
            model's in the same dtype (None until the run is saved).
    """

    method: str
    model: str
    data: str
    params_before: int
    params_after: int
    compressible_params_before: int
    compressible_params_after: int
    task: str = "qa"
    metrics_before: Metrics | None = None
    metrics_after: Metrics | None = None
    metrics_dense_recovered: Metrics | None = None
    paired: dict[str, Any] = field(default_factory=dict)
    perplexity: dict[str, Any] | None = None
    protocol: str = "tuned"
    protocol_deviations: tuple[str, ...] = ()
    eps: float | None = None
    ranks: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    device: str = ""
    dtype: str = ""
    autocast: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    bytes_on_disk: int | None = None
    bytes_before: int | None = None

    @property
    def compression_ratio(self) -> float:
        """Whole-model parameters before / after."""
        return self.params_before / self.params_after

    @property
    def compressible_ratio(self) -> float:
        """Parameters of the compressible layers after / before."""
        return self.compressible_params_after / self.compressible_params_before

    @property
    def recover_steps(self) -> int | None:
        """The recovery steps the run's configuration gave (None where the config does not say)."""
        return (self.config.get("recover") or {}).get("steps")

    def to_dict(self) -> dict[str, Any]:
        """``summary.json``: every field, the two ratios with their definitions; the optional parts only when set."""
        out: dict[str, Any] = {
            "method": self.method, "model": self.model, "data": self.data,
            "params_before": self.params_before, "params_after": self.params_after,
            "compression_ratio": self.compression_ratio, "compression_ratio_of": COMPRESSION_RATIO_OF,
            "compressible_params_before": self.compressible_params_before,
            "compressible_params_after": self.compressible_params_after,
            "compressible_ratio": self.compressible_ratio, "compressible_ratio_of": COMPRESSIBLE_RATIO_OF,
            "task": self.task,
            "metrics_before": None if self.metrics_before is None else self.metrics_before.to_dict(),
            "metrics_after": None if self.metrics_after is None else self.metrics_after.to_dict(),
        }
        if self.metrics_dense_recovered is not None:
            out["metrics_dense_recovered"] = self.metrics_dense_recovered.to_dict()
        out["paired"] = self.paired
        if self.perplexity is not None:
            out["perplexity"] = self.perplexity
        out |= {"protocol": self.protocol, "protocol_deviations": list(self.protocol_deviations), "eps": self.eps,
                "ranks": self.ranks, "seconds": self.seconds, "device": self.device, "dtype": self.dtype,
                **({"autocast": self.autocast} if self.autocast else {}),
                "config": self.config, "notes": list(self.notes)}
        if self.bytes_on_disk is not None:
            out["bytes_on_disk"] = self.bytes_on_disk
        if self.bytes_before is not None:
            out["bytes_before"] = self.bytes_before
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunSummary:
        """A summary read back from ``summary.json`` (or a ``DoneReport``); keys written later default when absent.

        Raises:
            BSIError: when a size field is missing (not a run's summary).
        """
        needed = ("params_before", "params_after", "compressible_params_before", "compressible_params_after")
        missing = [key for key in needed if key not in data]
        if missing:
            raise BSIError(f"not a run summary: it has no {', '.join(missing)} (a `bsi compress` summary.json has them)")
        plain = {f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data}
        for key in ("metrics_before", "metrics_after", "metrics_dense_recovered"):
            plain[key] = Metrics.from_dict(plain.get(key))
        plain["protocol_deviations"] = tuple(plain.get("protocol_deviations") or ())
        plain["notes"] = tuple(plain.get("notes") or ())
        plain.setdefault("method", "")
        plain.setdefault("model", "")
        plain.setdefault("data", "")
        return cls(**plain)


#: The method name of a study's dense reference rows (one per seed: the fine-tuned model, uncompressed).
REFERENCE = "dense"
#: The method name of a budget curve's dense rows: the fine-tuned model trained further for a budget, uncompressed.
DENSE_TRAINED = "dense-trained"


@dataclass(frozen=True)
class MethodRun:
    """How a study's compressed model was made: the method's run, then its recovery (absent on the dense rows).

    Args:
        recover_steps: the recovery's steps (0: the model as its method left
            it, evaluated before recovery).
        recover_lr: its learning rate (None without recovery).
        lr_choice: how that rate was chosen from the sweep's grid (None without
            a grid): ``chosen_at``, ``chosen_here`` and, where chosen, the
            validation loss at each rate.
        compress_seconds, recover_seconds: wall times of the method's whole
            run (every size at once) and of this size's recovery.
        notes: what the method said about its run.
        path_steps, path_tokens: the optimizer steps and tokens the method's
            own run trained the model on up to this size, after the task
            fine-tune (an engine method's tuning between rounds; 0 for a
            truncation, whose bases are computed, not trained). None: a row
            written before they were recorded.
        recover_tokens: the tokens the recovery trained on (None: not recorded).
        gradient_passed: the share of candidate bases whose gradient term
            passed bsi's significance test, over the rounds up to this size
            (None: no test ran, or not recorded); near 0, the score ranked by
            curvature alone.

    Together: the training a model saw after the fine-tune is
    ``path_steps + recover_steps`` optimizer steps (:attr:`training_steps`).
    """

    recover_steps: int
    recover_lr: float | None = None
    lr_choice: dict[str, Any] | None = None
    compress_seconds: float = 0.0
    recover_seconds: float = 0.0
    notes: tuple[str, ...] = ()
    path_steps: int | None = None
    path_tokens: int | None = None
    recover_tokens: int | None = None
    gradient_passed: float | None = None

    @property
    def training_steps(self) -> int | None:
        """Optimizer steps after the task fine-tune: the method's path to this size plus the recovery (None: unknown)."""
        return None if self.path_steps is None else self.path_steps + self.recover_steps

    @property
    def training_tokens(self) -> int | None:
        """Tokens trained on after the task fine-tune (None: not recorded)."""
        if self.path_tokens is None or (self.recover_steps and self.recover_tokens is None):
            return None
        return self.path_tokens + (self.recover_tokens or 0)


@dataclass(frozen=True)
class DecodeSpeed:
    """Decode speed measured side by side with the dense model: ms per generated token, and the speed-up."""

    ms_per_token: float
    dense_ms_per_token: float

    @property
    def speedup(self) -> float:
        """The dense model's ms per token / this model's (above 1: faster).

        NaN when this model's ms per token is 0: on a loaded machine the
        timing of one more token can fall below the noise
        (:func:`bsi.analysis.speed.measure_speeds` clamps it at 0), and a
        ratio to it says nothing.
        """
        return self.dense_ms_per_token / self.ms_per_token if self.ms_per_token > 0 else float("nan")


#: The keys of a ``results.jsonl`` line that :class:`StudyRow` names (the rest are kept in ``extra``).
_METRIC_KEYS = ("accuracy", "loss", "examples", "loss_examples", "perplexity")
_RUN_KEYS = tuple(f.name for f in dataclasses.fields(MethodRun))
#: MethodRun keys written only where recorded (rows made before them lack them).
_RECORDED_LATER = ("path_steps", "path_tokens", "recover_tokens", "gradient_passed")
_SPEED_KEYS = ("ms_per_token", "dense_ms_per_token", "speedup")
_OPTIONAL_KEYS = ("fingerprint", "params_before", "compression_ratio", "compressible_ratio", "outcomes",
                  "eval_seconds", "device", "dtype", "perplexity_protocol", "budget")
#: What a line must hold to be read as a row.
STUDY_ROW_NEEDS = ("method", "target", "params_total")


@dataclass(frozen=True)
class StudyRow:
    """One evaluated model of a comparison study: a line of a sweep's ``results.jsonl``.

    Args:
        method, protocol, target, seed: the cell (protocol ``published`` for
            a truncation method, ``dense`` for the reference of a seed).
        params_total: the model's parameters (tied weights once).
        metrics: its task metrics (flat in the file: ``accuracy``, ``loss``, ...).
        fingerprint: the sweep's settings hash (:meth:`bsi.pipeline.sweep.Sweep.fingerprint`).
        params_before: the dense model's parameters.
        compression_ratio: ``params_before / params_total``.
        compressible_ratio: the compressible layers' parameters kept.
        outcomes: the per-problem outcome file, relative to the sweep folder.
        eval_seconds: the evaluation's wall time.
        device, dtype: where and in what precision it was computed.
        run: how a compressed model was made (None on a dense row).
        speed: its decode speed (None unless the sweep timed it).
        perplexity_protocol: on a text task's dense row, how perplexity was measured.
        budget: in a budget curve (``bsi sweep --budgets``), the model's total
            optimizer steps after the task fine-tune (None: not a budget curve).
        extra: keys this version does not name, kept so that a rewrite loses nothing.

    ``None`` means "not in the file": :meth:`to_dict` leaves such keys out, so
    a row reads back and writes out unchanged.
    """

    method: str
    target: float
    params_total: int
    metrics: Metrics
    protocol: str | None = None
    seed: int = 0
    fingerprint: str | None = None
    params_before: int | None = None
    compression_ratio: float | None = None
    compressible_ratio: float | None = None
    outcomes: str | None = None
    eval_seconds: float | None = None
    device: str | None = None
    dtype: str | None = None
    run: MethodRun | None = None
    speed: DecodeSpeed | None = None
    perplexity_protocol: dict[str, Any] | None = None
    budget: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def is_reference(self) -> bool:
        """Whether this is a seed's dense reference row."""
        return self.method == REFERENCE

    @property
    def recovered(self) -> bool:
        """Whether the model was recovered (False: evaluated as its method left it; dense rows count as recovered)."""
        return self.run is None or self.run.recover_steps != 0

    @property
    def recover_steps(self) -> int | None:
        return None if self.run is None else self.run.recover_steps

    @property
    def recover_lr(self) -> float | None:
        return None if self.run is None else self.run.recover_lr

    @property
    def is_text(self) -> bool:
        """Whether the row is of a text task (its metrics carry a perplexity)."""
        return self.metrics.perplexity is not None

    def to_dict(self) -> dict[str, Any]:
        """The ``results.jsonl`` line: flat keys, the ones that are None left out."""
        out: dict[str, Any] = dict(self.extra)
        out |= {"method": self.method, "target": self.target, "seed": self.seed, "params_total": self.params_total,
                **self.metrics.to_dict()}
        if self.protocol is not None:
            out["protocol"] = self.protocol
        out |= {key: getattr(self, key) for key in _OPTIONAL_KEYS if getattr(self, key) is not None}
        if self.run is not None:  # the training counts only where recorded, so an older row writes out unchanged
            out |= {k: v for k, v in asdict(self.run).items() if v is not None or k not in _RECORDED_LATER}
            out["notes"] = list(self.run.notes)
        if self.speed is not None:
            out |= {"ms_per_token": self.speed.ms_per_token, "dense_ms_per_token": self.speed.dense_ms_per_token,
                    "speedup": self.speed.speedup}
        return out

    def result(self) -> dict[str, Any]:
        """What the row says about the model, without its wall times: two computations of a cell agree on this."""
        return {k: v for k, v in self.to_dict().items() if not k.endswith("_seconds")}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], needs: Sequence[str] = STUDY_ROW_NEEDS) -> StudyRow:
        """A row read back from a ``results.jsonl`` line (keys written later default when absent).

        Raises:
            BSIError: a line without one of ``needs`` (default: ``method``,
                ``target`` and ``params_total``), or non-numeric sizes and metrics.
        """
        missing = [key for key in needs if key not in data]
        if missing:
            raise BSIError(f"missing field(s) {', '.join(missing)} (a sweep's results.jsonl line has them)")
        numbers = ("target", "params_total", "accuracy", "loss")
        if any(key in data and not _is_number(data[key]) for key in numbers):
            raise BSIError(f"{', '.join(k for k in numbers if k in data)} must be numbers")
        metrics = Metrics(accuracy=data.get("accuracy", math.nan), loss=data.get("loss", math.nan),
                          examples=data.get("examples", 0), loss_examples=data.get("loss_examples"),
                          perplexity=data.get("perplexity"))
        run = None
        if "recover_steps" in data:
            run = MethodRun(**{key: data[key] for key in _RUN_KEYS if key in data and key != "notes"},
                            notes=tuple(data.get("notes") or ()))
        speed = None
        if data.get("ms_per_token") is not None and data.get("dense_ms_per_token") is not None:
            speed = DecodeSpeed(data["ms_per_token"], data["dense_ms_per_token"])
        named = {"method", "target", "seed", "params_total", "protocol", *_METRIC_KEYS, *_OPTIONAL_KEYS,
                 *(_RUN_KEYS if run else ()), *(_SPEED_KEYS if speed else ())}
        return cls(method=str(data["method"]), target=data["target"], params_total=data["params_total"],
                   metrics=metrics, protocol=data.get("protocol"), seed=data.get("seed", 0),
                   **{key: data.get(key) for key in _OPTIONAL_KEYS}, run=run, speed=speed,
                   extra={k: v for k, v in data.items() if k not in named})


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_study_rows(path: str | Path, needs: Sequence[str] = STUDY_ROW_NEEDS) -> list[StudyRow]:
    """Every row of a ``results.jsonl`` file, in file order; a BSIError naming the line of a bad one.

    ``needs``: the keys every line must hold (:meth:`StudyRow.from_dict`).
    """
    path = Path(path)
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        data = json_object(line, number, path)  # its errors name the line already
        try:
            rows.append(StudyRow.from_dict(data, needs))
        except BSIError as err:
            raise BSIError(f"{path}, line {number}: {err}") from None
    return rows
