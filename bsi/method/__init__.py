"""The method core: the Basel form, importance scores, curvature estimates and the pruning engine.

Everything here works on tensors and ``nn.Module`` objects only: no files, no
tokenizer, no printing. The modules, from the bottom up:

* :mod:`~bsi.method.layers`: `BasisLinear` (a linear layer as coefficients over
  fixed bases) and `LowRankLinear` (its exported two-factor form);
* :mod:`~bsi.method.bases`: which bases a layer is written in (plain SVD, or
  the SVD of the weight seen through its whitened inputs);
* :mod:`~bsi.method.surgery`: swapping a model's linear layers into and out of
  the Basel form, and counting parameters;
* :mod:`~bsi.method.scores`: the importance scores and the pruning rules, as
  small pure functions;
* :mod:`~bsi.method.curvature`: gradients and Hessian-diagonal estimates with
  respect to the coefficients;
* :mod:`~bsi.method.engine`: :class:`~bsi.method.engine.Compressor`, the
  pruning rounds as a generator of reports;
* :mod:`~bsi.method.theory`: the theory's bounds as calculators.
"""
