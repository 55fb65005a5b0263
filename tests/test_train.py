"""The fine-tuning loop (on the tiny model)."""

from __future__ import annotations

import math

import pytest
import torch

from bsi.data import BatchStream, generate_math_problems
from bsi.errors import BSIError
from bsi.models import TINY_MODEL, load_model_and_tokenizer
from bsi.pipeline.training import finetune, lr_factor


@pytest.fixture(scope="module")
def examples():
    return generate_math_problems(64, seed=0)


def test_finetune_lowers_the_loss_and_reports_every_step(tiny, examples):
    model, tokenizer = tiny
    stream = BatchStream(examples, tokenizer, batch_size=8, max_length=128, seed=0)
    reports = list(finetune(model, stream, steps=40, lr=3e-3, warmup_steps=4, stage="recover"))
    assert [r.step for r in reports] == list(range(1, 41))
    assert {r.total_steps for r in reports} == {40} and {r.stage for r in reports} == {"recover"}
    assert not any(r.skipped for r in reports)
    assert all(b.elapsed >= a.elapsed for a, b in zip(reports, reports[1:]))
    first, last = (sum(r.loss for r in part) / 5 for part in (reports[:5], reports[-5:]))
    assert last < 0.6 * first
    assert not model.training


def test_finetune_trains_only_the_given_parameters(tiny, examples):
    model, tokenizer = tiny
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    stream = BatchStream(examples, tokenizer, batch_size=4, max_length=128)
    list(finetune(model, stream, steps=3, lr=1e-3, parameters=model.lm_head.parameters()))
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed == {"lm_head.weight"}


def test_finetune_skips_non_finite_batches(tiny, examples):
    model, tokenizer = tiny
    with torch.no_grad():
        model.lm_head.weight[0, 0] = math.nan  # every logit row becomes NaN
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    stream = BatchStream(examples, tokenizer, batch_size=4, max_length=128)
    reports = list(finetune(model, stream, steps=2, lr=1e-3))
    assert all(r.skipped and math.isnan(r.loss) for r in reports)
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(p, before[n]) or n == "lm_head.weight" for n, p in model.named_parameters())
    assert torch.equal(model.model.embed_tokens.weight, before["model.embed_tokens.weight"])


def test_finetune_works_in_bfloat16(examples):
    model, tokenizer = load_model_and_tokenizer(TINY_MODEL, dtype=torch.bfloat16)
    before = model.lm_head.weight.detach().clone()
    stream = BatchStream(examples, tokenizer, batch_size=4, max_length=128)
    reports = list(finetune(model, stream, steps=3, lr=1e-2))
    assert all(math.isfinite(r.loss) and not r.skipped for r in reports)
    assert model.lm_head.weight.dtype == torch.bfloat16
    assert not torch.equal(model.lm_head.weight, before)


def test_stopping_early_leaves_the_model_in_eval_mode(tiny, examples):
    model, tokenizer = tiny
    steps = finetune(model, BatchStream(examples, tokenizer, batch_size=4), steps=10, lr=1e-3)
    next(steps)
    assert model.training
    steps.close()
    assert not model.training


def test_finetune_checks_its_arguments_at_once(tiny, examples):
    model, tokenizer = tiny
    stream = BatchStream(examples, tokenizer, batch_size=4)
    with pytest.raises(BSIError, match="learning rate"):
        finetune(model, stream, steps=1, lr=0.0)
    for p in model.parameters():
        p.requires_grad_(False)
    with pytest.raises(BSIError, match="no trainable parameters"):
        finetune(model, stream, steps=1, lr=1e-3)


def test_lr_schedule_warms_up_then_decays_to_a_tenth():
    factors = [lr_factor(step, 20, warmup_steps=4) for step in range(1, 21)]
    assert factors[:4] == [0.25, 0.5, 0.75, 1.0]
    assert factors[4] == 1.0 and factors[-1] == pytest.approx(0.1)
    assert all(b <= a for a, b in zip(factors[4:], factors[5:]))
    assert lr_factor(1, 1) == 1.0 and lr_factor(1, 2) == 1.0 and lr_factor(2, 2) == pytest.approx(0.1)


# --------------------------------------------------------------- bf16 autocast of the training steps
def test_autocast_is_off_unless_asked_and_only_for_a_float32_model():
    from bsi.models import resolve_autocast

    assert resolve_autocast("off", torch.float32) is None
    assert resolve_autocast("on", torch.float32) is torch.bfloat16
    assert resolve_autocast("on", torch.bfloat16) is None  # a bf16 model computes in bf16 already
    with pytest.raises(BSIError, match="unknown autocast 'auto': use off, on"):
        resolve_autocast("auto", torch.float32)


def test_matmul_autocast_multiplies_in_bf16_and_keeps_float32_weights_and_loss(tiny, examples):
    from bsi.pipeline.losses import MatmulAutocast, answer_token_loss

    model, tokenizer = tiny
    batch = next(BatchStream(examples, tokenizer, batch_size=4, max_length=128))
    seen = []
    hook = model.model.layers[0].mlp.up_proj.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    loss = MatmulAutocast(answer_token_loss, "cpu")
    mixed = loss(model, batch)
    with torch.no_grad():
        exact = float(answer_token_loss(model, batch))
    hook.remove()
    assert seen == [torch.bfloat16, torch.float32]  # the wrapped call multiplied in bf16, the plain one did not
    assert mixed.dtype == torch.float32 and abs(float(mixed.detach()) - exact) < 0.02 * exact
    mixed.backward()
    assert all(p.grad is None or p.grad.dtype == torch.float32 for p in model.parameters())
    assert loss.count(batch) == answer_token_loss.count(batch)  # what a curvature source asks is the wrapped loss's


def test_a_run_records_its_autocast_and_keeps_the_float32_fine_tune_apart(isolated_cache):
    from bsi.config import make_config
    from bsi.pipeline.runner import Pipeline, finetune_cache_key, saved_run_finetune_key

    config = make_config("smoke", {"autocast": "on"})
    pipeline = Pipeline(config)
    assert pipeline.autocast is torch.bfloat16
    mixed = finetune_cache_key(config, torch.float32, pipeline.autocast)
    assert mixed != finetune_cache_key(config, torch.float32)
    assert saved_run_finetune_key(config, {"dtype": "float32", "autocast": "bfloat16"}) == mixed
    assert saved_run_finetune_key(config, {"dtype": "float32"}) == finetune_cache_key(config, torch.float32)
    assert repr(pipeline.train_loss(0.0)).startswith("MatmulAutocast(")
    assert Pipeline(make_config("smoke", {"autocast": "off"})).train_loss(0.0).__class__.__name__ == "AnswerTokenLoss"
