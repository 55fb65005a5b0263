"""The stages as functions of a model (:mod:`bsi.pipeline.stages`), called without a Pipeline, on the tiny model."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from bsi.config import FinetuneConfig, PipelineConfig, RecoverConfig
from bsi.data import BatchStream, TaskData, generate_math_problems
from bsi.errors import BSIError
from bsi.method.layers import BasisLinear
from bsi.method.surgery import compressible_linear_names, to_basis_form
from bsi.models import TINY_MODEL
from bsi.pipeline.distributed import from_environment
from bsi.pipeline.losses import answer_token_loss
from bsi.pipeline.stages import SkipLimit, evaluate_model, recover_model, train_dense
from bsi.reports import EvalReport, StageReport, StepReport


@pytest.fixture(scope="module")
def examples():
    return generate_math_problems(48, seed=0)


def drain(generator):
    """Every report of a stage, and what the stage returned."""
    reports = []
    while True:
        try:
            reports.append(next(generator))
        except StopIteration as stop:
            return reports, stop.value


def test_the_skip_limit_counts_the_training_stages_only_and_stops_past_it():
    def step(stage: str, skipped: bool) -> StepReport:
        return StepReport(stage, 1, 1, math.nan if skipped else 1.0, 0.0, skipped)

    limit = SkipLimit(2)
    passed = list(limit.watch([step("finetune", True), step("profile", True), step("recover", False),
                               step("dense-recover", True)]))
    assert len(passed) == 4 and limit.skipped == 2  # the engine's own stages count elsewhere
    with pytest.raises(BSIError, match="3 recover batches gave a non-finite loss .* max_skipped_batches=2"):
        list(limit.watch([step("recover", True)]))


def test_recovering_the_coefficients_trains_only_them_then_exports(tiny, examples):
    model, tokenizer = tiny
    compressed = set(compressible_linear_names(model))
    to_basis_form(model, aux_rank=2)
    untouched = copy.deepcopy(model)  # the same model exported with no training: what recovery starts from
    drain(recover_model(untouched, never, RecoverConfig(steps=0), loss_fn=None, dist=from_environment(),
                        skips=SkipLimit(0)))
    opened = []

    def open_batches():
        opened.append(True)
        return BatchStream(examples, tokenizer, batch_size=4, max_length=128, seed=0)

    settings = RecoverConfig(steps=3, lr=1e-2, train="sigma", warmup_steps=0)
    reports, table = drain(recover_model(model, open_batches, settings, loss_fn=answer_token_loss,
                                         dist=from_environment(), skips=SkipLimit(0)))
    assert opened == [True]
    assert [r.step for r in reports if isinstance(r, StepReport)] == [1, 2, 3]
    assert [(r.stage, r.event) for r in reports if isinstance(r, StageReport)] == [("recover", "start"),
                                                                                ("recover", "end")]
    assert table and not any(isinstance(m, BasisLinear) for m in model.modules())  # exported afterwards
    trained, start = dict(model.named_parameters()), dict(untouched.named_parameters())
    assert trained.keys() == start.keys()
    changed = {n for n in trained if not torch.equal(trained[n], start[n])}
    assert changed and {n.rsplit(".", 1)[0] for n in changed} <= compressed  # sigma lives in their factors


def never():
    raise AssertionError("batches opened for a recovery of 0 steps")


def test_recovery_with_no_steps_only_exports_and_never_opens_the_batches(tiny):
    model, _ = tiny
    to_basis_form(model, aux_rank=0)
    reports, table = drain(recover_model(model, never, RecoverConfig(steps=0), loss_fn=None,
                                         dist=from_environment(), skips=SkipLimit(0)))
    assert [(r.stage, r.event, r.detail) for r in reports] == [("recover", "end", "skipped")]
    assert table and not any(isinstance(m, BasisLinear) for m in model.modules())


def test_training_the_dense_model_moves_every_weight(tiny, examples):
    model, tokenizer = tiny
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    stream = BatchStream(examples, tokenizer, batch_size=4, max_length=128, seed=0)
    settings = FinetuneConfig(steps=2, lr=1e-3, warmup_steps=0)
    reports = list(train_dense(model, stream, settings, dist=from_environment(), skips=SkipLimit(0)))
    assert [r.stage for r in reports] == ["finetune", "finetune"]
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert "lm_head.weight" in moved and any(n.endswith("q_proj.weight") for n in moved)


def test_evaluation_scores_the_first_problems_and_answers_the_first_of_those(tiny, examples):
    model, tokenizer = tiny
    task = TaskData("math", train=examples[:8], test=examples[8:20])
    settings = PipelineConfig(model=TINY_MODEL, eval_examples=3, eval_loss_examples=6, max_new_tokens=4)
    reports, (evaluation, protocol) = drain(evaluate_model(model, settings, tokenizer=tokenizer, task=task,
                                                           text=None, when="finetuned"))
    assert protocol is None  # a question/answer task has no perplexity protocol
    assert len(evaluation.outcomes) == 6 and [o.correct is not None for o in evaluation.outcomes] == [True] * 3 + [False] * 3
    report = reports[-1]
    assert isinstance(report, EvalReport) and report.when == "finetuned" and report.examples == 3
    assert report.loss == pytest.approx(evaluation.metrics.loss) and math.isfinite(report.loss)
