"""What a run ends with, typed: :class:`Metrics` of each evaluated model and the :class:`RunSummary`.

``bsi compress`` writes a :class:`RunSummary` as ``summary.json``; the CLI's
table, the dashboard's status line and its saved-run view read one back with
:meth:`RunSummary.from_dict`, so a field is named in one place and a reader
never guesses a key. Files written before a field existed read with its
default. This module imports nothing heavy (no torch), so reading a result
is fast.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from bsi.errors import BSIError


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

    def to_dict(self) -> dict:
        """The metrics as a plain dict (JSON-serialisable); ``perplexity`` only on a text task."""
        data = asdict(self)
        if self.perplexity is None:
            del data["perplexity"]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> "Metrics | None":
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
    paired: dict = field(default_factory=dict)
    perplexity: dict | None = None
    protocol: str = "tuned"
    protocol_deviations: tuple[str, ...] = ()
    eps: float | None = None
    ranks: dict = field(default_factory=dict)
    seconds: float = 0.0
    device: str = ""
    dtype: str = ""
    config: dict = field(default_factory=dict)
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
                "config": self.config, "notes": list(self.notes)}
        if self.bytes_on_disk is not None:
            out["bytes_on_disk"] = self.bytes_on_disk
        if self.bytes_before is not None:
            out["bytes_before"] = self.bytes_before
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RunSummary":
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
