"""Named presets, their measured costs, and the one function that turns a preset and overrides into a run's settings.

Every preset is a set of overrides on top of the fields' defaults (the
``default`` preset has none). :func:`resolve_config` is where every entry
point (the command line, a sweep cell, the pipeline, the dashboard) makes a
run's configuration. What each preset costs on 2 CPU cores is data, not code:
``preset_costs.json`` beside this module, read into :data:`PRESET_COSTS`.
"""

from __future__ import annotations

import importlib.resources
import json
from dataclasses import dataclass
from typing import Any

from bsi.config.fields import PROTOCOL_NAMES, check_choice, flat_fields
from bsi.config.methods import METHOD_SPECS
from bsi.config.protocols import PROTOCOLS
from bsi.config.settings import NESTED, SECTIONS, PipelineConfig
from bsi.errors import BSIError
from bsi.units import duration

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
    # (100 problems, paired 95% interval of the difference +2 to +14 points) in 8 min 58 s with the
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
    # The quick demo: 1.31x at 75% against 84% in 3 min 25 s, fine-tune cached (2 cores, 2026-11-28).
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

    ``warm_seconds`` is the wall time with the task fine-tune and the
    conversion (:mod:`bsi.pipeline.bases_cache`) already in the cache
    (``$BSI_CACHE``): any run after the first of the same model and data;
    ``cached_seconds`` with the fine-tune alone cached, ``uncached_seconds``
    with an empty cache (the fine-tune included); ``None`` where it was not measured: no figure here is
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
    #: with the fine-tune and the conversion cached (:mod:`bsi.pipeline.bases_cache`): a run after the first
    warm_seconds: float | None = None
    #: the dashboard's What-if *Prepare* of this preset's saved run (its compression stage again, and the
    #: references measured), both caches warm
    prepare_seconds: float | None = None

    def time_text(self) -> str:
        """``1 min 40 s with the fine-tune and the conversion cached, 2 min 8 s with the fine-tune cached, 5 min 1 s
        with an empty cache (bsi compress, 2 cores, 2026-11-28)``."""
        parts = [f"{duration(self.warm_seconds)} with the fine-tune and the conversion cached"
                 if self.warm_seconds else None,
                 f"{duration(self.cached_seconds)} with the fine-tune cached" if self.cached_seconds else None,
                 f"{duration(self.uncached_seconds)} with an empty cache" if self.uncached_seconds else None]
        shown = ", ".join(p for p in parts if p)
        return f"{shown} ({self.command}, 2 cores, {self.measured})" if shown else "not measured"


def read_preset_costs() -> dict[str, PresetCost]:
    """Every preset's measured cost on 2 CPU cores, from ``preset_costs.json`` (docs/benchmarks.md)."""
    text = importlib.resources.files("bsi.config").joinpath("preset_costs.json").read_text(encoding="utf-8")
    return {name: PresetCost(**fields) for name, fields in json.loads(text)["presets"].items()}


#: Every preset's measured cost on 2 CPU cores (docs/benchmarks.md): one stated value per figure.
PRESET_COSTS: dict[str, PresetCost] = read_preset_costs()


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
                   sizes: tuple[float, ...] | list[float] | None = None) -> PipelineConfig:
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
        check_choice(protocol, "--protocol", PROTOCOL_NAMES)
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
