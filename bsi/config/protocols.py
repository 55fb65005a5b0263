"""Protocols: which engine settings make a run "the published method" and which are bsi's tuned defaults.

A run states its protocol (``PipelineConfig.protocol``); when a flag
overrides part of it, :func:`protocol_deviations` names exactly what, so a row
is never called the published method when it is not.
"""

from __future__ import annotations

from typing import Any

from bsi.config.settings import CompressConfig, PipelineConfig

#: The engine methods' settings under each protocol (``PipelineConfig.protocol``). ``paper`` is the
#: published BSI and Basel (docs/method.md, "Protocols"); ``tuned`` is bsi's defaults, each deviation
#: measured there. Schedules (rounds, iterations) are the preset's. The truncation baselines are the
#: published methods under both (:class:`bsi.config.BaselineConfig`).
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

# One deviation at a time from ``paper``, each named for what it changes (docs/method.md, "Protocols"): a row of
# either says which single choice of the published method it tests.
PROTOCOLS["paper-whitened"] = {
    "description": "the published method with one change: whitened bases (SVD of W S) instead of plain SVD bases",
    "compress": PROTOCOLS["paper"]["compress"] | {"bases": "whitened"},
}
PROTOCOLS["paper-layer-probes"] = {
    "description": "the published method with its curvature probed one layer at a time, as its pseudo-code draws "
                   "(1 + 2L gradient passes per profiling batch) instead of one joint probe over the model",
    "compress": PROTOCOLS["paper"]["compress"] | {"probe_scope": "layer"},
}


def protocol_deviations(config: PipelineConfig) -> list[str]:
    """The ``compress`` settings of ``config`` that differ from its protocol's, as ``field=value`` (empty: none).

    A run states its protocol; when a flag overrode part of it, the run's
    notes say exactly what, so a row is never called the published method
    when it is not.
    """
    wanted = PROTOCOLS[config.protocol]["compress"]
    have = config.compress.to_dict()
    return [f"{key}={have[key]}" for key, value in wanted.items() if have[key] != value]
