"""The losses everything optimises: answer-token cross-entropy, and distillation from the dense model.

* :class:`AnswerTokenLoss` (the instance :data:`answer_token_loss`) is *the*
  loss of bsi: the mean cross-entropy of the answer tokens given everything
  before them. Fine-tuning minimises it, the importance scores are its
  derivatives, evaluation reports it. It also offers what the curvature
  sources need: how many tokens it averages over (:meth:`AnswerTokenLoss.count`)
  and the same loss with labels drawn from the model itself
  (:meth:`AnswerTokenLoss.sampled`).
* :class:`DistillationLoss` adds the KL divergence from a frozen teacher (the
  fine-tuned dense model) on the same answer tokens::

      loss = CE(student, labels) + w * T^2 * KL(softmax(t / T) || softmax(s / T))

  With the teacher equal to the student the KL term is zero and the loss *is*
  the task loss; the ``T^2`` factor keeps the gradient's size independent of
  the temperature. The KL term carries far more signal per token than the
  labels (the teacher's whole distribution, not one token), which is why
  compressed models recover faster with it.
* :class:`MatmulAutocast` wraps either loss so that its forward pass runs
  the matrix products in bfloat16 (``torch.autocast``) while the weights,
  their gradients, the optimizer and the loss itself stay float32: mixed
  precision for the training steps, off unless asked for (``--autocast on``).

Only the logits of labelled positions are computed: the output layer (a fifth
of a small model's compute) runs on the answer tokens alone when the model
supports a boolean ``logits_to_keep`` mask (transformers >= 5.x), and on every
position otherwise.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bsi.data import IGNORE_INDEX


@functools.cache
def _mask_slicing_supported() -> bool:
    """Whether this transformers slices hidden states with a boolean (B, T) ``logits_to_keep`` mask."""
    try:
        from transformers.modeling_utils import slice_logits_to_keep
    except ImportError:
        return False
    try:
        kept = slice_logits_to_keep(torch.zeros(1, 2, 3), torch.tensor([[True, False]]))
    except Exception:  # any failure means: not supported
        return False
    return tuple(kept.shape) == (1, 3)


def accepts_logits_to_keep(model: nn.Module) -> bool:
    """Whether ``model.forward`` takes ``logits_to_keep`` (transformers causal LMs do: only those logits are computed)."""
    try:
        return "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def device_of(model: nn.Module) -> torch.device:
    """The device of the model's first parameter (CPU for a parameterless module)."""
    parameter = next(model.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


def answer_logits(model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits at the labelled positions and their targets: ``(N, V)`` float32 and ``(N,)``.

    A causal LM's logits at position ``t`` predict token ``t + 1``, so the
    target of position ``t`` is ``labels[t + 1]``; positions whose target is
    -100 (prompt, padding) are left out.
    """
    device = device_of(model)
    input_ids = batch["input_ids"].to(device)  # (B, T)
    labels = batch["labels"].to(device)  # (B, T)
    attention_mask = batch.get("attention_mask")
    if attention_mask is not None:
        attention_mask = attention_mask.to(device)  # (B, T)
    keep = torch.zeros_like(labels, dtype=torch.bool)  # (B, T): position t predicts a labelled token t+1
    keep[:, :-1] = labels[:, 1:] != IGNORE_INDEX
    targets = labels[:, 1:][keep[:, :-1]]  # (N,)
    if _mask_slicing_supported() and accepts_logits_to_keep(model):
        logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                       logits_to_keep=keep).logits  # (N, V)
        if logits.dim() == 2 and logits.shape[0] == targets.numel():
            return logits.float(), targets
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits  # (B, T, V)
    return logits[keep].float(), targets


class AnswerTokenLoss:
    """Mean cross-entropy of the answer tokens: the loss of the whole project.

    ``batch`` holds ``input_ids``, ``attention_mask`` and ``labels``, each
    ``(B, T)``, as made by :func:`bsi.data.collate`; labels are -100 where no
    loss is wanted. Calling it returns a float32 scalar with a gradient graph
    (NaN if no token is labelled).
    """

    def __call__(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        logits, targets = answer_logits(model, batch)
        if not targets.numel():
            return logits.sum() * float("nan")
        return F.cross_entropy(logits, targets)

    def per_example(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Each example's own mean answer-token loss, (B,) float32 with a gradient graph (NaN for a row with no label).

        Their sum is what FWSVD differentiates to get per-example gradients
        in one backward pass (:func:`bsi.pipeline.baselines.fisher_row_information`).
        """
        device = device_of(model)
        mask = batch.get("attention_mask")
        # every position's logits, so that each layer's inputs keep their (B, T) layout (the per-example
        # gradients need it; the output layer too sees every position)
        logits = model(input_ids=batch["input_ids"].to(device), use_cache=False,
                       attention_mask=None if mask is None else mask.to(device)).logits[:, :-1].float()  # (B, T-1, V)
        targets = batch["labels"].to(device)[:, 1:]  # (B, T-1)
        per_token = F.cross_entropy(logits.transpose(1, 2), targets, ignore_index=IGNORE_INDEX, reduction="none")
        counts = (targets != IGNORE_INDEX).sum(dim=1)  # (B,)
        return per_token.sum(dim=1) / counts

    @staticmethod
    def count(batch: dict[str, torch.Tensor]) -> int:
        """How many tokens the loss averages over on ``batch``."""
        return int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())

    def sampled(self, model: nn.Module, batch: dict[str, torch.Tensor],
                generator: torch.Generator | None = None) -> torch.Tensor:
        """The same loss with each target drawn from the model's own prediction at that position.

        Its per-example gradients give an unbiased estimate of the Fisher (the
        Gauss-Newton matrix of the cross-entropy), see
        :class:`bsi.method.curvature.Fisher`.
        """
        logits, targets = answer_logits(model, batch)
        if not targets.numel():
            return logits.sum() * float("nan")
        probs = torch.softmax(logits.detach(), dim=-1)  # (N, V)
        device_generator = None
        if generator is not None:
            seed = int(torch.randint(0, 2**62, (1,), generator=generator))
            device_generator = torch.Generator(device=probs.device).manual_seed(seed)
        drawn = torch.multinomial(probs, 1, generator=device_generator).squeeze(1)  # (N,)
        return F.cross_entropy(logits, drawn)

    def __repr__(self) -> str:
        return "AnswerTokenLoss()"


answer_token_loss = AnswerTokenLoss()
"""The task loss (an :class:`AnswerTokenLoss`); call it as ``answer_token_loss(model, batch)``."""


class MatmulAutocast:
    """A loss whose forward pass multiplies matrices in bfloat16: mixed precision for the training steps.

    Inside ``torch.autocast`` every matrix product (the linear layers,
    attention) rounds its two inputs to bfloat16 (8 significant bits) and
    accumulates in float32; the weights stay float32, so do their gradients,
    the optimizer's state and the loss (the logits are cast back to float32
    before the cross-entropy). The backward pass is called outside the
    context, as PyTorch asks; it follows the forward pass's precision per
    operation.

    A faster step is not a faster or equally good run. On 2 CPU cores with
    AVX-512 BF16 (``docs/log.md``, "bf16 autocast of the training steps"),
    an isolated step of the embedded model ran 2.2x (dense) to 2.6x (Basel
    form) faster and a batch's loss moved by 0.3%, yet the ``default``
    preset end to end took as long as in float32 (the fine-tune was 2.1x
    faster, pruning 1.07x, recovery 0.79x: slower), and its fine-tuned model
    answered 12 points fewer problems correctly. Hence
    ``PipelineConfig.autocast`` is off unless asked for.

    Everything else the object is asked (``count``, ``sampled``, ...) is the
    wrapped loss's, so a curvature source can still read it; bsi wraps only
    the losses of the training steps (fine-tune, tuning, recovery), never
    the ones the scores, the calibration or the evaluation measure with.
    """

    def __init__(self, loss: Any, device_type: str, dtype: torch.dtype = torch.bfloat16) -> None:
        self.loss = loss
        self.device_type = device_type
        self.dtype = dtype

    def __call__(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        with torch.autocast(self.device_type, dtype=self.dtype):
            return self.loss(model, batch)

    def __getattr__(self, name: str) -> Any:
        if name == "loss":  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.loss, name)

    def __repr__(self) -> str:
        return f"MatmulAutocast({self.loss!r}, {self.device_type}, {str(self.dtype).removeprefix('torch.')})"


class DistillationLoss:
    """Task loss plus ``weight`` times the KL divergence from a frozen teacher on the answer tokens.

    Args:
        teacher: the fine-tuned dense model (kept in eval mode, no gradient).
        weight: ``w`` >= 0; 0 is the task loss alone.
        temperature: ``T`` > 0 of both softmaxes.
    """

    def __init__(self, teacher: nn.Module, weight: float, temperature: float = 1.0) -> None:
        if not weight >= 0:
            raise ValueError(f"distillation weight must be >= 0, got {weight}")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.teacher, self.weight, self.temperature = teacher, weight, temperature
        self.teacher.eval()
        for p in self.teacher.parameters():
            p.requires_grad_(False)
        self.task = answer_token_loss

    def __call__(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        logits, targets = answer_logits(model, batch)  # (N, V), (N,)
        task = F.cross_entropy(logits, targets) if targets.numel() else logits.sum() * float("nan")
        if self.weight == 0:
            return task
        with torch.no_grad():
            teacher_logits, _ = answer_logits(self.teacher, batch)  # (N, V)
        return task + self.weight * distillation_kl(logits, teacher_logits, self.temperature)

    count = staticmethod(AnswerTokenLoss.count)


def distillation_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``T^2 * mean over tokens of KL(softmax(t/T) || softmax(s/T))``, a float32 scalar.

    Args:
        student_logits, teacher_logits: (N, V) logits at the same N positions.
    """
    t = temperature
    student = F.log_softmax(student_logits.float() / t, dim=-1)  # (N, V)
    teacher = F.log_softmax(teacher_logits.float() / t, dim=-1)  # (N, V)
    kl = F.kl_div(student, teacher, log_target=True, reduction="batchmean")  # mean over the N tokens
    return kl * t * t
