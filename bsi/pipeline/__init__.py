"""The run around the method: stages, methods, training, evaluation, files.

* :mod:`~bsi.pipeline.runner`: :class:`~bsi.pipeline.runner.Pipeline`, the
  three stages (task fine-tune, compress, recover) as one report generator;
* :mod:`~bsi.pipeline.methods` and :mod:`~bsi.pipeline.baselines`: every
  compression method behind one interface;
* :mod:`~bsi.pipeline.training`, :mod:`~bsi.pipeline.evaluate`: the training
  loop and the task metrics;
* :mod:`~bsi.pipeline.export`, :mod:`~bsi.pipeline.checkpoint`: files;
* :mod:`~bsi.pipeline.distributed`: several processes;
* :mod:`~bsi.pipeline.sweep`: the grid of methods and sizes.
"""
