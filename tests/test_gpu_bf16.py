"""What bf16 does to bsi's training steps, on the CPU (torch computes bf16 there too): issue 43's bf16 questions.

A GPU run defaults to bf16 (``--dtype auto``). The engine keeps sigma and
its statistics in float32; the fine-tune and the recovery train the model's
bf16 parameters through float32 master copies (:class:`bsi.pipeline.training.FloatMasters`).
Without them, AdamW on the bf16 weights themselves lost every update below
half a bf16 step: at the default recovery learning rate the weights moved
about half as far as in float32 (ratio 0.54 after 8 steps; 2026-11-26).
"""

from __future__ import annotations

import torch
from conftest import lm_loss, make_tiny_llama, token_batches

from bsi.config import PipelineConfig
from bsi.pipeline.training import FloatMasters, finetune


def displacement(dtype: torch.dtype, steps: int = 8) -> float:
    """How far ``steps`` AdamW steps at the default recovery lr move the tiny model's weights (Frobenius norm).

    Both dtypes start from the same bf16-representable weights, so the
    comparison measures the updates, not the rounding of the start.
    """
    torch.manual_seed(0)
    model = make_tiny_llama().to(torch.bfloat16).to(dtype)
    before = {n: p.detach().float().clone() for n, p in model.named_parameters()}
    for _ in finetune(model, token_batches(), steps=steps, lr=PipelineConfig().recover.lr, loss_fn=lm_loss):
        pass
    moved = sum(float((p.detach().float() - before[n]).pow(2).sum()) for n, p in model.named_parameters())
    return moved**0.5


def test_bf16_training_moves_the_weights_as_far_as_float32():
    ratio = displacement(torch.bfloat16) / displacement(torch.float32)
    assert 0.8 < ratio < 1.25, f"bf16 moved the weights {ratio:.2f}x as far as float32"


def test_float32_parameters_get_no_master_copy_and_bf16_ones_a_float32_copy():
    weight32 = torch.nn.Parameter(torch.randn(4, 4))
    weight16 = torch.nn.Parameter(torch.randn(4, 4).to(torch.bfloat16))
    masters = FloatMasters([weight32, weight16])
    assert masters.trained[0] is weight32
    assert masters.trained[1].dtype == torch.float32 and masters.trained[1] is not weight16
    assert [p for p, _ in masters.pairs] == [weight16]


def test_the_bf16_weight_is_its_master_rounded_after_every_step():
    weight = torch.nn.Parameter(torch.full((64,), 0.02, dtype=torch.bfloat16))
    masters = FloatMasters([weight])
    optimizer = torch.optim.AdamW(masters.trained, lr=2e-5, weight_decay=0.0)
    for _ in range(5):
        (weight.float() * torch.linspace(-1, 1, 64)).sum().backward()
        masters.gradients_to_masters()
        assert weight.grad is None and masters.trained[0].grad.dtype == torch.float32
        optimizer.step()
        masters.masters_to_model()
        masters.zero_grad()
        assert torch.equal(weight.detach(), masters.trained[0].detach().to(torch.bfloat16))
    # five updates of 2e-5 are each below half a bf16 step at 0.02 (3.9e-5), yet together they move the weight
    assert (weight.detach().float() != 0.02).float().mean() > 0.5
