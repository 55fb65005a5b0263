"""Fine-tuning: a small, readable training loop that reports every step.

:func:`finetune` serves all three training phases of the pipeline: dense
task fine-tuning before compression, tuning the singular values between
prunings (through ``parameters``), and recovery after compression. It is a
generator: each step yields a :class:`bsi.reports.StepReport`, and the caller
decides what to show (a progress bar, a live chart) or when to stop.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator

import torch
from torch import nn

from bsi.data import BatchStream
from bsi.data.batches import batch_tokens
from bsi.errors import BSIError
from bsi.pipeline.losses import answer_token_loss
from bsi.reports import StepReport

FINAL_LR_FRACTION = 0.1
"""The learning rate decays to this fraction of its peak by the last step."""


def lr_factor(step: int, total_steps: int, warmup_steps: int = 0, final: float = FINAL_LR_FRACTION) -> float:
    """Learning-rate multiplier at a 1-based ``step``: linear warmup, then cosine decay.

    During the first ``warmup_steps`` steps the factor climbs linearly to 1;
    afterwards it follows half a cosine from 1 down to ``final``, which it
    reaches at ``total_steps``::

        factor = final + (1 - final) * (1 + cos(pi * progress)) / 2
    """
    if step <= warmup_steps:
        return step / warmup_steps
    decay_steps = total_steps - warmup_steps - 1
    if decay_steps <= 0:
        return 1.0
    progress = min(1.0, (step - warmup_steps - 1) / decay_steps)  # 0 at the first decay step, 1 at the last
    return final + (1.0 - final) * 0.5 * (1.0 + math.cos(math.pi * progress))


def finetune(
    model: nn.Module,
    stream: BatchStream,
    *,
    steps: int,
    lr: float,
    stage: str = "finetune",
    parameters: Iterable[nn.Parameter] | None = None,
    weight_decay: float = 0.0,
    max_grad_norm: float | None = 1.0,
    warmup_steps: int = 0,
    loss_fn: Callable[[nn.Module, dict], torch.Tensor] = answer_token_loss,
) -> Iterator[StepReport]:
    """Train ``model`` on ``steps`` batches from ``stream``, yielding a report per step.

    Each step: ``loss_fn`` (by default the answer-token loss,
    :data:`bsi.pipeline.losses.answer_token_loss`, computed in float32 even for
    a bf16 model; recovery may pass a distillation loss), backward, gradient-norm
    clipping to ``max_grad_norm`` (``None`` or 0: no clipping), one AdamW
    update at ``lr * lr_factor(step)``. A batch whose loss or gradient is not
    finite is skipped: its gradients are dropped, nothing is updated and the
    report says ``skipped=True``.

    A bf16 (or float16) parameter is trained through a float32 *master copy*
    (:class:`FloatMasters`): AdamW updates the copy and the parameter takes
    its rounded value. Updating the bf16 weight itself would lose every update
    below half a bf16 step (about ``2**-9`` of the weight), which at
    fine-tuning learning rates is most of them.

    Args:
        parameters: what to train; by default every parameter with
            ``requires_grad``. Others keep their values.

    The model is in train mode while the loop runs (dropout as its config
    says) and in eval mode once it ends, also when the caller stops early.
    Arguments are checked at the call; the training runs as the returned
    iterator is consumed.
    """
    params = [p for p in (model.parameters() if parameters is None else parameters) if p.requires_grad]
    if not params:
        raise BSIError(f"{stage}: no trainable parameters (all have requires_grad=False)")
    if steps < 0:
        raise BSIError(f"{stage}: steps must be >= 0, got {steps}")
    if lr <= 0:
        raise BSIError(f"{stage}: the learning rate must be positive, got {lr}")
    masters = FloatMasters(params)
    optimizer = torch.optim.AdamW(masters.trained, lr=lr, weight_decay=weight_decay)
    clip = max_grad_norm if max_grad_norm else math.inf  # inf: measure the norm, never scale
    return _steps(model, stream, optimizer, masters, steps, lr, warmup_steps, clip, stage, loss_fn)


class FloatMasters:
    """Float32 master copies of the low-precision parameters among ``params``.

    ``trained`` is what the optimizer updates: a float32 parameter itself, and
    for each bf16/float16 parameter a float32 copy of it. After ``backward``,
    :meth:`gradients_to_masters` moves each low-precision gradient onto its
    copy (in float32); after the optimizer step, :meth:`masters_to_model`
    writes the copies back, rounded to the parameter's dtype. A model that is
    float32 throughout gets no copies and no extra memory.
    """

    def __init__(self, params: list[nn.Parameter]) -> None:
        self.params = params
        self.trained: list[nn.Parameter] = [
            p if p.dtype == torch.float32 or not p.is_floating_point() else nn.Parameter(p.detach().float().clone())
            for p in params
        ]
        self.pairs = [(p, m) for p, m in zip(params, self.trained) if m is not p]

    def gradients_to_masters(self) -> None:
        """Move each low-precision parameter's gradient to its master copy, as float32."""
        for param, master in self.pairs:
            master.grad = None if param.grad is None else param.grad.float()
            param.grad = None

    @torch.no_grad()
    def masters_to_model(self) -> None:
        """Write each master copy back into its parameter (rounded to the parameter's dtype)."""
        for param, master in self.pairs:
            param.copy_(master)

    def zero_grad(self) -> None:
        """Drop the gradients of the parameters and of their master copies."""
        for p in self.params + [m for _, m in self.pairs]:
            p.grad = None


def _steps(
    model: nn.Module,
    stream: BatchStream,
    optimizer: torch.optim.Optimizer,
    masters: FloatMasters,
    steps: int,
    lr: float,
    warmup_steps: int,
    clip: float,
    stage: str,
    loss_fn: Callable[[nn.Module, dict], torch.Tensor],
) -> Iterator[StepReport]:
    """The training loop itself (a generator, so :func:`finetune` can check its arguments eagerly)."""
    start = time.perf_counter()
    model.train()
    try:
        for step in range(1, steps + 1):
            for group in optimizer.param_groups:
                group["lr"] = lr * lr_factor(step, steps, warmup_steps)
            batch = next(stream)
            loss = loss_fn(model, batch)  # float32 scalar
            finite = bool(torch.isfinite(loss))
            if loss.requires_grad:  # also when not finite: multi-process gradient hooks need every rank
                loss.backward()
            masters.gradients_to_masters()
            if finite:
                grad_norm = torch.nn.utils.clip_grad_norm_(masters.trained, clip)
                finite = bool(torch.isfinite(grad_norm))
            if finite:
                optimizer.step()
                masters.masters_to_model()
            masters.zero_grad()
            yield StepReport(
                stage=stage,
                step=step,
                total_steps=steps,
                loss=float(loss.detach()),
                elapsed=time.perf_counter() - start,
                skipped=not finite,
                tokens=batch_tokens(batch),
            )
    finally:
        masters.zero_grad()
        model.eval()
