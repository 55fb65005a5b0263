"""What bf16 does to bsi's training steps, on the CPU (torch computes bf16 there too): issue 43's bf16 questions.

A GPU run defaults to bf16 (``--dtype auto``). The engine keeps sigma and
its statistics in float32; the fine-tune and the recovery train the model's
own bf16 parameters with AdamW.
"""

from __future__ import annotations

import pytest
import torch
from conftest import lm_loss, make_tiny_llama, token_batches

from bsi.config import PipelineConfig
from bsi.pipeline.training import finetune


def changed_share(dtype: torch.dtype, lr: float, steps: int = 4) -> float:
    """The share of the tiny model's weight entries that any of ``steps`` AdamW steps at ``lr`` changed."""
    model = make_tiny_llama().to(dtype)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for _ in finetune(model, token_batches(), steps=steps, lr=lr, loss_fn=lm_loss):
        pass
    changed = sum(int((p.detach() != before[n]).sum()) for n, p in model.named_parameters())
    return changed / sum(p.numel() for p in model.parameters())


def test_float32_recovery_steps_move_every_weight():
    assert changed_share(torch.float32, PipelineConfig().recover.lr) > 0.95


@pytest.mark.xfail(strict=True, reason="finetune() runs AdamW on the bf16 parameters themselves, with no float32 "
                                       "master copy: an update below half a bf16 step (2^-9 of the weight) rounds "
                                       "away, and at the default recovery lr (2e-5) most do (28% of the entries "
                                       "changed in 4 steps, 99% in float32; 2026-11-26)")
def test_bf16_recovery_steps_move_every_weight_at_the_default_learning_rate():
    assert changed_share(torch.bfloat16, PipelineConfig().recover.lr) > 0.95
