"""bsi: compress causal language models with Basis Selection with Importance.

Every linear layer becomes a sum of its SVD bases with learnable coefficients
(:class:`~bsi.method.layers.BasisLinear`); the coefficients are tuned on task data;
each basis is scored by the loss increase its removal is predicted to cause
(gradient plus a Hessian diagonal estimated from symmetric perturbations,
:mod:`bsi.method.scores`, :mod:`bsi.method.curvature`); the least important bases are
pruned over several rounds (:class:`~bsi.method.engine.Compressor`); and the result is
exported as an ordinary transformers model (:mod:`bsi.pipeline.export`).

Quick tour::

    from bsi import make_config, Pipeline
    for report in Pipeline(make_config("smoke"), out_dir="out").run():
        print(report)
"""

from bsi.config import CompressConfig, FinetuneConfig, PipelineConfig, make_config
from bsi.method.engine import Compressor
from bsi.errors import BSIError
from bsi.pipeline.export import load_compressed, save_compressed
from bsi.method.layers import BasisLinear, LowRankLinear
from bsi.pipeline.runner import Pipeline

__version__ = "0.1.0"

__all__ = [
    "BSIError", "BasisLinear", "CompressConfig", "Compressor", "FinetuneConfig", "LowRankLinear",
    "Pipeline", "PipelineConfig", "load_compressed", "make_config", "save_compressed",
]
