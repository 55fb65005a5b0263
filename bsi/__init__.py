"""bsi: compress causal language models with Basis Selection with Importance.

Every linear layer becomes a sum of its SVD bases with learnable coefficients
(:class:`~bsi.method.layers.BasisLinear`); the coefficients are tuned on task
data; each basis is scored by the loss increase its removal is predicted to
cause (gradient plus a curvature term, :mod:`bsi.method.scores`,
:mod:`bsi.method.curvature`); the least important bases are pruned over
several rounds (:class:`~bsi.method.engine.Compressor`); and the result is
exported as an ordinary transformers model (:mod:`bsi.pipeline.export`).

The package has three layers: :mod:`bsi.method` (the method core, tensors
only), :mod:`bsi.pipeline` (the run around it: data, training, evaluation,
methods, files) and the surfaces (:mod:`bsi.cli`, :mod:`bsi.app`,
:mod:`bsi.teaching`), plus :mod:`bsi.analysis` (spectra, speed, side-by-side
generations).

Quick tour::

    from bsi import make_config, Pipeline
    for report in Pipeline(make_config("smoke"), out_dir="out").run():
        print(report)

Names are imported on first use, so ``import bsi`` (and ``bsi --help``) does
not load torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

#: public name -> module that defines it
_EXPORTS = {
    "BSIError": "bsi.errors",
    "CompressConfig": "bsi.config", "FinetuneConfig": "bsi.config", "RecoverConfig": "bsi.config",
    "PipelineConfig": "bsi.config", "SizeRule": "bsi.config", "make_config": "bsi.config",
    "Compressor": "bsi.method.engine",
    "BasisLinear": "bsi.method.layers", "LowRankLinear": "bsi.method.layers",
    "Pipeline": "bsi.pipeline.runner",
    "load_compressed": "bsi.pipeline.export", "save_compressed": "bsi.pipeline.export",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'bsi' has no attribute '{name}'")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
