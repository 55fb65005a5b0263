"""Configuration: validated dataclasses, serialised to JSON, plus named presets; one concept per module.

* :mod:`bsi.config.fields`: how a setting is declared (:func:`option`, whose
  metadata the command line and the dashboard's form are built from), checked,
  and written to JSON (:class:`JsonConfig`, the one scheme of every class);
  the allowed values of the named settings.
* :mod:`bsi.config.settings`: the settings of a run, :class:`PipelineConfig`
  with its three stages (:class:`FinetuneConfig`, :class:`CompressConfig`
  with :class:`SizeRule` and :class:`HutchinsonConfig`,
  :class:`RecoverConfig`), and the truncation baselines'
  (:class:`BaselineConfig`).
* :mod:`bsi.config.protocols`: the published method's engine settings and
  bsi's tuned ones (:data:`PROTOCOLS`).
* :mod:`bsi.config.methods`: the method registry (:data:`METHOD_SPECS`).
* :mod:`bsi.config.presets`: the named presets, their measured costs (a data
  file, ``preset_costs.json``) and :func:`resolve_config`, the one function
  that makes a run's configuration.
* :mod:`bsi.config.sweep`: a comparison study's settings
  (:class:`SweepConfig`) and its presets.

Every dataclass validates itself in ``__post_init__`` and raises
:class:`~bsi.errors.BSIError` with a one-line message naming the field, so a
bad value is caught before any model is loaded or any file is touched;
``from_dict`` rejects unknown keys, so a typo in a JSON config fails loudly.
The fields' defaults *are* the ``default`` preset, so ``PipelineConfig()`` in
Python and ``bsi compress`` run the same job. Everything is importable from
``bsi.config`` itself. The package imports nothing heavy (no torch), so ``bsi
--help`` stays fast.
"""

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
    field_help,
    flat_fields,
    flat_value,
    option,
)
from bsi.config.methods import (
    ENGINE_METHODS,
    METHOD_NAMES,
    METHOD_SPECS,
    VARIANT_NAMES,
    MethodSpec,
    is_engine_method,
)
from bsi.config.presets import (
    PRESET_COSTS,
    PRESETS,
    PresetCost,
    deep_update,
    implied_updates,
    make_config,
    resolve_config,
)
from bsi.config.protocols import PROTOCOLS, TUNED_FIELDS, protocol_deviations
from bsi.config.settings import (
    ALLOCATIONS,
    DEFAULT_RATIOS,
    FILE_KEYS,
    FISHER,
    NESTED,
    SECTIONS,
    BaselineConfig,
    CompressConfig,
    FinetuneConfig,
    HutchinsonConfig,
    PipelineConfig,
    RecoverConfig,
    SizeRule,
)
from bsi.config.sweep import SWEEP_PRESETS, SweepConfig, make_sweep_config

__all__ = [
    "AUTOCAST_CHOICES", "BASES", "CENTER_GRADIENTS", "CURVATURES", "DTYPES", "HESSIAN_METHODS", "PROBE_SCOPES",
    "PROTOCOL_NAMES", "RECOVER_TARGETS", "SCORE_WINDOWS", "SCORES", "SELECTIONS", "SIZE_MODES", "TASK_KINDS",
    "WITHIN_LAYER", "JsonConfig", "field_help", "flat_fields", "flat_value", "option",
    "ENGINE_METHODS", "METHOD_NAMES", "METHOD_SPECS", "VARIANT_NAMES", "MethodSpec", "is_engine_method",
    "PRESET_COSTS", "PRESETS", "PresetCost", "deep_update", "implied_updates", "make_config", "resolve_config",
    "PROTOCOLS", "TUNED_FIELDS", "protocol_deviations",
    "ALLOCATIONS", "DEFAULT_RATIOS", "FILE_KEYS", "FISHER", "NESTED", "SECTIONS", "BaselineConfig", "CompressConfig",
    "FinetuneConfig", "HutchinsonConfig", "PipelineConfig", "RecoverConfig", "SizeRule",
    "SWEEP_PRESETS", "SweepConfig", "make_sweep_config",
]
