"""The run's training and evaluation stages as functions of a model: fine-tune, recover, evaluate.

Each function takes the model and what it needs (its batches, its settings,
its loss) and yields typed reports (:mod:`bsi.reports`); none keeps state of
its own, so the same function serves every caller.
:class:`~bsi.pipeline.runner.Pipeline` composes them for ``bsi compress``
(fine-tune, compress, recover, evaluate); :class:`~bsi.pipeline.sweep.Sweep`
composes the same ones for every size of a method's run. The second stage,
compression, is the method's own (:mod:`bsi.pipeline.methods`).

* :func:`train_dense`: stage 1's training, every weight of the dense model on
  the task (the pipeline caches its result);
* :func:`recover_model`: stage 3, the compressed model trained again on the
  task, its own factors (or, as the paper does, only its coefficients);
* :func:`evaluate_model`: accuracy and answer-token loss on the test
  problems, or perplexity on a text task's held-out windows, with every
  problem's outcome kept for the paired intervals.

A training stage's non-finite steps are skipped by the training loop and
counted across the run's stages by a :class:`SkipLimit`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any

from torch import nn

from bsi.config import FinetuneConfig, PipelineConfig, RecoverConfig
from bsi.data import TaskData, TextTask
from bsi.errors import BSIError
from bsi.method.surgery import basis_layers, model_parameters, to_exported_form
from bsi.pipeline.evaluate import Evaluation, Metrics, ProblemOutcome, evaluate
from bsi.pipeline.losses import answer_token_loss
from bsi.pipeline.perplexity import protocol_record, text_task_perplexity
from bsi.pipeline.training import finetune
from bsi.reports import EvalReport, Report, StageReport, StepReport

DENSE_RECOVERY = "dense-recover"  # the stage training the dense model with the recovery's budget (dense_recovery)
#: The stages whose skipped steps a :class:`SkipLimit` counts.
TRAINING_STAGES = ("finetune", "recover", DENSE_RECOVERY)


class SkipLimit:
    """Counts the training steps a run skipped for a non-finite loss or gradient, over all its stages.

    Past ``limit`` (``compress.max_skipped_batches``) the run stops with a
    one-line error instead of training on: the learning rate or the dtype is
    wrong, and more steps would not fix it.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.skipped = 0

    def watch(self, reports: Iterable[Report]) -> Iterator[Report]:
        """Pass ``reports`` on, counting the skipped steps of :data:`TRAINING_STAGES`; BSIError past the limit."""
        for report in reports:
            if isinstance(report, StepReport) and report.skipped and report.stage in TRAINING_STAGES:
                self.skipped += 1
                if self.skipped > self.limit:
                    raise BSIError(
                        f"{self.skipped} {report.stage} batches gave a non-finite loss or gradient (limit "
                        f"max_skipped_batches={self.limit}); lower the learning rate or check the data/model dtype"
                    )
            yield report


def recovery_parameters(model: nn.Module, train_embeddings: bool = False) -> list[nn.Parameter]:
    """What factor recovery trains: every parameter of the exported model except the embeddings (unless asked).

    That is the two factors of each `LowRankLinear`, the layers kept dense,
    the biases and the norms; an output layer tied to the embedding counts as
    the embedding.
    """
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    unique: dict[int, nn.Parameter] = {}
    for p in model.parameters():
        if (train_embeddings or id(p) not in embeddings) and id(p) not in unique:
            unique[id(p)] = p
    return list(unique.values())


def train_dense(model: nn.Module, batches: Iterator[dict], settings: FinetuneConfig, *, dist: Any,
                skips: SkipLimit, loss_fn: Any = answer_token_loss) -> Iterator[Report]:
    """Stage 1's training: every weight of the dense ``model`` on the task's ``batches``, in place.

    ``loss_fn``: the answer-token loss, or the same under bf16 autocast
    (:class:`~bsi.pipeline.losses.MatmulAutocast`).

    ``dist`` (:mod:`bsi.pipeline.distributed`) averages the gradients across
    processes when there are several.
    """
    for p in model.parameters():
        p.requires_grad_(True)
    with dist.sync_gradients(model.parameters()):
        yield from skips.watch(finetune(
            model, batches, steps=settings.steps, lr=settings.lr, stage="finetune",
            weight_decay=settings.weight_decay, max_grad_norm=settings.max_grad_norm,
            warmup_steps=settings.warmup_steps, loss_fn=loss_fn))


def recover_model(model: nn.Module, open_batches: Callable[[], Iterator[dict]], settings: RecoverConfig, *,
                  loss_fn: Any, dist: Any, skips: SkipLimit, unshard: Callable[[], None] = lambda: None,
                  stage: str = "recover") -> Generator[Report, None, dict]:
    """Stage 3: fine-tune a compressed ``model`` in place; afterwards it is in its exported form. Returns its export table.

    ``settings.train="factors"``: the model is exported first (two-factor
    `LowRankLinear` layers, or dense where that is smaller) and its own
    parameters train: the factors, the dense layers, the norms (the
    embeddings if asked). ``"sigma"``: only the coefficients and auxiliary
    vectors train, in the Basel form, as while pruning (the paper-faithful
    ablation). Either way with ``loss_fn``: the task loss, or distillation
    from the fine-tuned dense model (``settings.distill``).

    Args:
        open_batches: opens the training batches (called only when there are
            steps to run).
        unshard: gives every process the whole model back before it is
            exported (after sharded pruning; see :mod:`bsi.pipeline.fsdp`).
        stage: the reports' stage name (the dense model given the same
            budget trains through here as ``dense-recover``).
    """
    if settings.steps == 0 or settings.train == "factors":
        unshard()
    if settings.steps == 0:
        table = to_exported_form(model)
        yield StageReport(stage, "end", "skipped")
        return table
    table: dict = {}
    if settings.train == "factors":
        table = to_exported_form(model)
        params = recovery_parameters(model, train_embeddings=settings.train_embeddings)
    else:
        params = [p for layer in basis_layers(model).values()
                  for p in (layer.sigma, layer.aux_u, layer.aux_v) if p.numel()]
    for p in model.parameters():
        p.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    yield StageReport(stage, "start", f"{settings.steps} steps, training {settings.train}")
    with dist.sync_gradients(params):
        yield from skips.watch(finetune(
            model, open_batches(), steps=settings.steps, lr=settings.lr, stage=stage, parameters=params,
            loss_fn=loss_fn, weight_decay=settings.weight_decay, max_grad_norm=settings.max_grad_norm,
            warmup_steps=settings.warmup_steps))
    if settings.train == "sigma":
        unshard()
        table = to_exported_form(model)
    yield StageReport(stage, "end")
    return table


def window_outcomes(nll_sums: Any, token_counts: Any) -> Evaluation:
    """A text evaluation as per-problem outcomes: one per held-out window, its NLL sum over its scored tokens.

    So a sweep's outcomes files, the paired bootstrap and the tables treat a
    window as they treat a test problem (with nothing answered).
    """
    return Evaluation(tuple(ProblemOutcome(float(s), int(c)) for s, c in zip(nll_sums, token_counts)), text=True)


def eval_report(when: str, metrics: Metrics, params_total: int, seconds: float) -> EvalReport:
    """The :class:`EvalReport` of ``metrics``: on a text task it counts windows and carries the perplexity."""
    text = metrics.perplexity is not None
    examples = (metrics.loss_examples or 0) if text else metrics.examples
    return EvalReport(when, metrics.accuracy, metrics.loss, examples, params_total, seconds,
                      perplexity=metrics.perplexity)


def evaluate_model(model: nn.Module, settings: PipelineConfig, *, tokenizer: Any, task: TaskData | None,
                   text: TextTask | None, when: str) -> Generator[Report, None, tuple[Evaluation, dict | None]]:
    """Evaluate ``model`` as ``when``; returns its per-problem outcomes and, on a text task, the perplexity's protocol.

    A question/answer ``task``: the first ``settings.scored_examples`` test
    problems scored for the answer-token loss, the first
    ``settings.eval_examples`` of them answered (greedy, at most
    ``max_new_tokens``) and marked right or wrong. A text task (``text``):
    perplexity on the held-out part, ``eval_windows`` windows of ``window``
    tokens every ``eval_stride`` tokens
    (:func:`bsi.pipeline.perplexity.text_task_perplexity`), one outcome per
    window, and its protocol record
    (:func:`bsi.pipeline.perplexity.protocol_record`).
    """
    yield StageReport("evaluate", "start", when)
    start = time.perf_counter()
    protocol = None
    if text is not None:
        result = text_task_perplexity(model, text, window=settings.window, stride=settings.eval_stride,
                                      batch_size=settings.eval_batch_size, max_windows=settings.eval_windows)
        evaluation = window_outcomes(result.window_nll_sums, result.window_token_counts)
        protocol = protocol_record(result, text)
    else:
        assert task is not None, "a question/answer evaluation needs the task"
        evaluation = evaluate(model, tokenizer, task.test[: settings.scored_examples], answered=settings.eval_examples,
                              batch_size=settings.eval_batch_size, max_new_tokens=settings.max_new_tokens)
    yield eval_report(when, evaluation.metrics, model_parameters(model), time.perf_counter() - start)
    return evaluation, protocol
