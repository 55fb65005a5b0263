"""bsi: compress causal language models with Basis Selection with Importance.

Every linear layer becomes a sum of its SVD bases with learnable coefficients
(:class:`~bsi.layers.BasisLinear`); the coefficients are tuned on task data;
each basis is scored by the loss increase its removal is predicted to cause
(gradient plus a Hessian diagonal estimated from symmetric perturbations,
:mod:`bsi.importance`, :mod:`bsi.estimator`); the least important bases are
pruned over several rounds (:class:`~bsi.engine.Compressor`); and the result is
exported as an ordinary transformers model (:mod:`bsi.export`).

Quick tour::

    from bsi import make_config, Pipeline
    for report in Pipeline(make_config("smoke"), out_dir="out").run():
        print(report)
"""

from .config import CompressConfig, FinetuneConfig, PipelineConfig, make_config
from .engine import Compressor
from .errors import BSIError
from .export import load_compressed, save_compressed
from .layers import BasisLinear, LowRankLinear
from .pipeline import Pipeline

__version__ = "0.1.0"

__all__ = [
    "BSIError", "BasisLinear", "CompressConfig", "Compressor", "FinetuneConfig", "LowRankLinear",
    "Pipeline", "PipelineConfig", "load_compressed", "make_config", "save_compressed",
]
