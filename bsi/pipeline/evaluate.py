"""Measuring a model on a task: the loss that everything optimises, and accuracy.

* the loss, :data:`bsi.pipeline.losses.answer_token_loss`, lives in
  :mod:`bsi.pipeline.losses`;
* :func:`generate_answers` lets the model answer questions greedily.
* :func:`evaluate` combines both on a test set: exact-match accuracy of the
  final number, and the token-weighted answer loss.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from bsi.pipeline.losses import answer_token_loss, device_of

from bsi.data import (
    Example,
    answers_match,
    build_prompt,
    collate,
    encode_example,
    extract_answer,
    pad_id,
    stop_token_ids,
)


@dataclass(frozen=True)
class Metrics:
    """Task metrics: ``accuracy`` in [0, 1], mean answer-token ``loss``, test-set size."""

    accuracy: float
    loss: float
    examples: int

    def to_dict(self) -> dict:
        """The metrics as a plain dict (JSON-serialisable)."""
        return asdict(self)


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Put ``model`` in eval mode for a block and restore its previous mode after."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


@contextmanager
def _left_padding(tokenizer: PreTrainedTokenizerBase) -> Iterator[PreTrainedTokenizerBase]:
    """Pad on the left for a block: batched generation continues every row at its end."""
    previous = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        yield tokenizer
    finally:
        tokenizer.padding_side = previous


def generate_answers(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    questions: Sequence[str],
    *,
    max_new_tokens: int = 96,
    batch_size: int = 16,
) -> list[str]:
    """Greedy answers to ``questions``, in order, as decoded text.

    Prompts come from :func:`bsi.data.build_prompt`. Questions are batched
    by prompt length (less padding) and padded on the left, so every row's
    new tokens start at the same position. Generation stops at the
    end-of-turn or end-of-sequence token; only the new tokens are decoded,
    without special tokens.
    """
    device = device_of(model)
    prompts = [build_prompt(tokenizer, q) for q in questions]
    add_special = not tokenizer.chat_template  # a chat template writes its own special tokens
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    answers: list[str] = [""] * len(prompts)
    with eval_mode(model), _left_padding(tokenizer), torch.inference_mode():
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            encoded = tokenizer(
                [prompts[i] for i in chunk], add_special_tokens=add_special, padding=True, return_tensors="pt"
            )
            output = model.generate(
                input_ids=encoded["input_ids"].to(device),  # (b, P)
                attention_mask=encoded["attention_mask"].to(device),  # (b, P)
                max_new_tokens=max_new_tokens,
                do_sample=False,
                num_beams=1,
                eos_token_id=stop_token_ids(tokenizer),
                pad_token_id=pad_id(tokenizer),
            )  # (b, P + new)
            new_tokens = output[:, encoded["input_ids"].shape[1] :]  # (b, new)
            texts = tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
            for i, text in zip(chunk, texts):
                answers[i] = text.strip()
    return answers


def evaluate(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[Example],
    *,
    batch_size: int = 16,
    max_new_tokens: int = 96,
    max_length: int = 256,
) -> Metrics:
    """Accuracy and answer-token loss of ``model`` on ``examples``.

    Accuracy: the share of questions whose generated answer ends with the
    right number (:func:`bsi.data.extract_answer`, compared with
    :func:`bsi.data.answers_match` to the gold ``####`` number). Loss: the
    answer-token cross-entropy averaged over every answer token of the set
    (long answers weigh more, as in training). The model is evaluated in eval
    mode and left in the mode it came in.
    """
    if not examples:
        return Metrics(accuracy=float("nan"), loss=float("nan"), examples=0)
    with eval_mode(model):
        predictions = generate_answers(
            model, tokenizer, [e.question for e in examples], max_new_tokens=max_new_tokens, batch_size=batch_size
        )
        correct = sum(
            answers_match(extract_answer(p), extract_answer(e.answer) or "") for p, e in zip(predictions, examples)
        )
        loss = dataset_loss(model, tokenizer, examples, batch_size=batch_size, max_length=max_length)
    return Metrics(accuracy=correct / len(examples), loss=loss, examples=len(examples))


def dataset_loss(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[Example],
    *,
    batch_size: int = 16,
    max_length: int = 256,
) -> float:
    """Answer-token cross-entropy over a whole set, weighted by tokens (no gradient)."""
    encoded = [encode_example(tokenizer, e, max_length) for e in examples]
    total, count = 0.0, 0
    with torch.inference_mode():
        for start in range(0, len(encoded), batch_size):
            batch = collate(encoded[start : start + batch_size], pad_id(tokenizer))
            batch_sum, batch_count = answer_token_loss.sum_and_count(model, batch)
            total, count = total + float(batch_sum), count + batch_count
    return total / count if count else float("nan")


