"""Measuring a model on a task: answer-token loss and exact-match accuracy, problem by problem.

One pass per batch of held-out problems gives both numbers:

1. **Teacher-forced forward.** The prompt (left-padded) and the gold answer
   (right-padded) run through the model together. The logits at the answer
   positions give each problem's answer-token cross-entropy, the same loss
   training minimises (:data:`bsi.pipeline.losses.answer_token_loss`).
2. **Greedy answer from the same pass.** The logits at the last prompt
   position are the model's first greedy token, and the logits at every
   answer position hold the model's greedy choice after that prefix of the
   gold answer. Where those choices reproduce the gold tokens, the greedy
   answer *is* the gold answer so far, and its key-value cache is already
   computed: each row accepts its longest such prefix (a *gold draft*,
   :func:`accepted_draft_lengths`) and :func:`greedy_decode` continues token
   by token only after it. The prompt and the agreeing part of the answer are
   processed once for both numbers; a model that answers as the gold answer
   does needs hardly any decode step. A row stops at the end-of-turn token,
   or as soon as its first answer line (``#### <number>`` and one character
   after it) is complete: what follows cannot change the answer, and on a
   CPU, decoding dominates the cost of evaluating a damaged model that
   rambles. Finished rows leave the batch.

   The answers are the greedy decode loop's in exact arithmetic. In floating
   point, an accepted token's logits come from one batched pass instead of
   one pass per token, so an arg-max between two logits equal to rounding
   could differ; ``evaluate(..., gold_draft=False)`` decodes every token
   from the prompt on (the cache cropped back to the prompt) for comparison.

:func:`evaluate` returns an :class:`Evaluation`: one :class:`ProblemOutcome`
per problem (correct or not, summed loss, token count) and the aggregate
:class:`Metrics`. The outcomes are what paired confidence intervals are
computed from (:mod:`bsi.analysis.stats`). Evaluation never truncates: the
whole question and the whole gold answer are scored.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedTokenizerBase

from bsi.data import Example, answers_match, encode_answer, encode_prompt, extract_answer, pad_id, stop_token_ids
from bsi.pipeline.losses import accepts_logits_to_keep, device_of
from bsi.results import Metrics as Metrics  # defined with the other result records; importable from here too


@dataclass(frozen=True)
class ProblemOutcome:
    """What the model did on one held-out problem.

    ``loss_sum`` is the cross-entropy summed over the problem's ``tokens``
    answer tokens (so a set's loss is ``sum(loss_sum) / sum(tokens)``).
    ``correct`` is None for a problem scored for its loss only.
    """

    loss_sum: float
    tokens: int
    correct: bool | None = None
    prediction: str | None = None

    @property
    def loss(self) -> float:
        """The mean answer-token loss of this problem alone."""
        return self.loss_sum / self.tokens if self.tokens else float("nan")


@dataclass(frozen=True)
class Evaluation:
    """One :class:`ProblemOutcome` per problem, in the order the problems were given.

    ``text``: the outcomes are a text task's held-out windows, in stream
    order (``loss_sum`` a window's summed next-token NLL over its ``tokens``
    scored tokens, nothing answered, see :mod:`bsi.pipeline.perplexity`), and
    the metrics carry the perplexity.
    """

    outcomes: tuple[ProblemOutcome, ...]
    text: bool = False

    @property
    def metrics(self) -> Metrics:
        answered = [o for o in self.outcomes if o.correct is not None]
        tokens = sum(o.tokens for o in self.outcomes)
        accuracy = sum(bool(o.correct) for o in answered) / len(answered) if answered else float("nan")
        loss = sum(o.loss_sum for o in self.outcomes) / tokens if tokens else float("nan")
        scored = len(self.outcomes)
        perplexity = (math.exp(loss) if math.isfinite(loss) else float("nan")) if self.text else None
        return Metrics(accuracy=accuracy, loss=loss, examples=len(answered),
                       loss_examples=None if scored == len(answered) else scored, perplexity=perplexity)

    def columns(self) -> dict[str, list]:
        """The outcomes as aligned columns: ``correct`` (None: not answered), ``loss_sum``, ``tokens``, ``prediction``."""
        return {"correct": [o.correct for o in self.outcomes], "loss_sum": [o.loss_sum for o in self.outcomes],
                "tokens": [o.tokens for o in self.outcomes], "prediction": [o.prediction for o in self.outcomes]}


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Put ``model`` in eval mode for a block and restore its previous mode after."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


_COMPLETE_ANSWER = re.compile(r"####\s*-?\s*\$?\s*\d[\d,]*(?:\.\d+)?[^\d,.]")


def answer_line_complete(text: str) -> bool:
    """True once ``text`` holds an answer line ``#### <number>`` followed by a character that ends the number.

    >>> answer_line_complete("3 + 4 = 7\\n#### 7"), answer_line_complete("#### 7\\n")
    (False, True)
    """
    return _COMPLETE_ANSWER.search(text) is not None


# ----------------------------------------------------------------- batching
def _left_pad(rows: Sequence[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ``(ids, mask)``, both (B, P) int64: every row ends at the same position."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row):] = torch.tensor(row, dtype=torch.long)
        mask[i, width - len(row):] = 1
    return ids, mask


def _right_pad(rows: Sequence[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``(ids, mask)``, both (B, A) int64."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1
    return ids, mask


def positions_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """Position of every token counting real tokens only: ``cumsum(mask) - 1``, 0 on left padding. (B, T) int64."""
    return (mask.cumsum(dim=-1) - 1).clamp(min=0)


@dataclass
class _ScoredBatch:
    """The teacher-forced pass over ``prompt + gold answer`` for one batch (see :func:`_score_batch`)."""

    loss_sums: torch.Tensor  # (B,) summed answer-token cross-entropy, on the CPU
    counts: torch.Tensor  # (B,) answer tokens, on the CPU
    logits: torch.Tensor  # (B, A + 1, V) float32: position P-1+j predicts answer token j
    answer_ids: torch.Tensor  # (B, A) right-padded gold answers, on the model's device
    answer_mask: torch.Tensor  # (B, A) 1 on real answer tokens, on the model's device
    prompt_mask: torch.Tensor  # (B, P) 0 on left padding, on the model's device
    cache: object  # the key-value cache of all P + A positions (None unless kept)


def _score_batch(model: nn.Module, prompts: Sequence[list[int]], answers: Sequence[list[int]], pad: int,
                 keep_cache: bool) -> _ScoredBatch:
    """The teacher-forced pass over ``prompt + gold answer`` for a batch: losses, logits and (if asked) the cache."""
    device = device_of(model)
    prompt_ids, prompt_mask = _left_pad(prompts, pad)  # (B, P)
    answer_ids, answer_mask = _right_pad(answers, pad)  # (B, A)
    ids = torch.cat([prompt_ids, answer_ids], dim=1).to(device)  # (B, P + A)
    mask = torch.cat([prompt_mask, answer_mask], dim=1).to(device)  # (B, P + A)
    width = answer_ids.shape[1]
    kwargs = dict(input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask), use_cache=keep_cache)
    if accepts_logits_to_keep(model):
        output = model(**kwargs, logits_to_keep=width + 1)
        logits = output.logits[:, :width + 1]  # positions P-1 .. P+A-1
    else:
        output = model(**kwargs)
        logits = output.logits[:, -(width + 1):]
    logits = logits.float()  # (B, A + 1, V): position P-1+j predicts answer token j
    targets = answer_ids.to(device)  # (B, A)
    per_token = F.cross_entropy(logits[:, :width].transpose(1, 2), targets, reduction="none")  # (B, A)
    valid = answer_mask.to(device).bool()  # (B, A)
    loss_sums = (per_token * valid).sum(dim=1)  # (B,)
    counts = valid.sum(dim=1)  # (B,)
    return _ScoredBatch(loss_sums.cpu(), counts.cpu(), logits, targets, answer_mask.to(device),
                        prompt_mask.to(device), output.past_key_values if keep_cache else None)


def accepted_draft_lengths(greedy: torch.Tensor, answer_ids: torch.Tensor, answer_mask: torch.Tensor) -> torch.Tensor:
    """How many leading gold tokens each row's greedy choices reproduce: the accepted part of the gold draft.

    Args:
        greedy: (B, A + 1) the arg-max of the teacher-forced logits; column
            ``j`` is the model's greedy choice after the prompt and the first
            ``j`` gold tokens.
        answer_ids: (B, A) the right-padded gold answers.
        answer_mask: (B, A) 1 on real answer tokens.

    Returns:
        (B,) int64 ``k``: the greedy choices equal the gold tokens at columns
        ``0 .. k-1`` and not at column ``k`` (or the answer ends there).

    >>> accepted_draft_lengths(torch.tensor([[5, 6, 9, 1]]), torch.tensor([[5, 6, 7]]), torch.ones(1, 3))
    tensor([2])
    """
    agree = (greedy[:, : answer_ids.shape[1]] == answer_ids) & answer_mask.bool()  # (B, A)
    return agree.long().cumprod(dim=1).sum(dim=1)  # (B,) leading agreements


def _draft_decoding_inputs(scored: _ScoredBatch) -> tuple[list[list[int]], torch.Tensor, torch.Tensor]:
    """Each row's accepted draft tokens, the logits right after them (B, V) and the mask of the cache (B, P + A).

    The cache keeps every gold position; those beyond a row's accepted prefix
    are masked out, so decoding attends to the prompt and the accepted tokens
    only, and the next token's position is the count of unmasked ones.
    """
    greedy = scored.logits.argmax(dim=-1)  # (B, A + 1)
    accepted = accepted_draft_lengths(greedy, scored.answer_ids, scored.answer_mask)  # (B,)
    rows = torch.arange(greedy.shape[0], device=greedy.device)
    after_draft = scored.logits[rows, accepted]  # (B, V): the logits after each row's accepted prefix
    columns = torch.arange(scored.answer_ids.shape[1], device=greedy.device)  # (A,)
    accepted_columns = (columns[None, :] < accepted[:, None]).long()  # (B, A)
    mask = torch.cat([scored.prompt_mask, accepted_columns], dim=1)  # (B, P + A)
    drafts = [ids[:k].tolist() for ids, k in zip(scored.answer_ids.cpu(), accepted.tolist())]
    return drafts, after_draft, mask


def _take_tokens(tokens: list[int], new: Sequence[int], tokenizer: PreTrainedTokenizerBase, stops: set[int], *,
                 max_new_tokens: int, stop_at_answer_line: bool) -> bool:
    """Append ``new`` to a row's ``tokens`` one at a time, as the decode loop would; False once the row is done.

    A row is done at a stop token (not appended), at ``max_new_tokens``
    tokens, or with ``stop_at_answer_line`` once its first answer line is
    complete; tokens after that point are not appended.
    """
    for token in new:
        if token in stops:
            return False
        tokens.append(token)
        if len(tokens) >= max_new_tokens:
            return False
        if stop_at_answer_line and answer_line_complete(tokenizer.decode(tokens, skip_special_tokens=True)):
            return False
    return True


@torch.inference_mode()
def greedy_decode(model: nn.Module, tokenizer: PreTrainedTokenizerBase, first_logits: torch.Tensor, cache,
                  prompt_mask: torch.Tensor, *, max_new_tokens: int, stop_at_answer_line: bool = True,
                  drafts: Sequence[list[int]] | None = None) -> list[str]:
    """Greedy continuation of a batch of prompts already in ``cache``; returns each row's decoded text.

    Args:
        first_logits: (B, V) logits after each prompt (and its draft): they choose the next token.
        cache: the key-value cache holding the left-padded prompts (and whatever ``prompt_mask`` masks out).
        prompt_mask: (B, K) attention mask of what the cache holds: 1 on the tokens a row attends to.
        drafts: tokens each row is known to produce greedily first (the accepted gold draft,
            :func:`accepted_draft_lengths`), already in the cache and unmasked in ``prompt_mask``;
            they pass the same stop checks as decoded tokens.

    Each row stops at the end-of-turn or end-of-sequence token (not part of
    its text), at ``max_new_tokens``, or with ``stop_at_answer_line`` once its
    first ``#### <number>`` line is complete (:func:`answer_line_complete`).
    Rows that stop leave the batch, so the remaining steps cost less.
    """
    stops = set(stop_token_ids(tokenizer))
    rows = first_logits.shape[0]
    tokens: list[list[int]] = [[] for _ in range(rows)]
    if max_new_tokens < 1:
        return ["" for _ in range(rows)]
    active = torch.arange(rows)  # batch position -> original row
    mask = prompt_mask
    position = mask.sum(dim=1)  # (b,) the next token's position: real tokens so far
    logits = first_logits
    pending = [list(d) for d in drafts] if drafts is not None else [[] for _ in range(rows)]
    while True:
        chosen = logits.argmax(dim=-1)  # (b,)
        keep = []
        for i, (row, token) in enumerate(zip(active.tolist(), chosen.tolist())):
            if _take_tokens(tokens[row], [*pending[row], token], tokenizer, stops, max_new_tokens=max_new_tokens,
                            stop_at_answer_line=stop_at_answer_line):
                keep.append(i)
            pending[row] = []
        if not keep:
            break
        if len(keep) < len(active):
            index = torch.tensor(keep, device=mask.device)
            cache.batch_select_indices(index)
            active, mask, position, chosen = active[keep], mask[index], position[index], chosen[index]
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)  # (b, K + steps)
        output = model(input_ids=chosen[:, None], attention_mask=mask, position_ids=position[:, None],
                       past_key_values=cache, use_cache=True)
        logits = output.logits[:, -1].float()  # (b, V)
        position = position + 1
    return [tokenizer.decode(t, skip_special_tokens=True).strip() for t in tokens]


def _answer_batch(model: nn.Module, tokenizer: PreTrainedTokenizerBase, scored: _ScoredBatch, *,
                  max_new_tokens: int, gold_draft: bool) -> list[str]:
    """The greedy answers of a scored batch (its cache kept): after the accepted gold draft, or from the prompt on."""
    if gold_draft:
        drafts, after_draft, mask = _draft_decoding_inputs(scored)
        return greedy_decode(model, tokenizer, after_draft, scored.cache, mask, max_new_tokens=max_new_tokens,
                             drafts=drafts)
    scored.cache.crop(-scored.answer_ids.shape[1])  # type: ignore[attr-defined]  # back to the prompt
    return greedy_decode(model, tokenizer, scored.logits[:, 0], scored.cache, scored.prompt_mask,
                         max_new_tokens=max_new_tokens)


def _length_order(lengths: Sequence[int]) -> list[int]:
    """Indices from the longest item to the shortest (batches of similar length pad less)."""
    return sorted(range(len(lengths)), key=lambda i: -lengths[i])


def generate_answers(model: nn.Module, tokenizer: PreTrainedTokenizerBase, questions: Sequence[str], *,
                     max_new_tokens: int = 96, batch_size: int = 16, stop_at_answer_line: bool = True) -> list[str]:
    """Greedy answers to ``questions``, in order, as decoded text.

    Prompts come from :func:`bsi.data.build_prompt` (the model's chat
    template). Questions are batched by prompt length and padded on the
    left; see :func:`greedy_decode` for where an answer stops.
    """
    pad = pad_id(tokenizer)
    prompts = [encode_prompt(tokenizer, q) for q in questions]
    answers: list[str] = [""] * len(prompts)
    order = _length_order([len(p) for p in prompts])
    device = device_of(model)
    with eval_mode(model), torch.inference_mode():
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            ids, mask = _left_pad([prompts[i] for i in chunk], pad)
            ids, mask = ids.to(device), mask.to(device)
            last_only = {"logits_to_keep": 1} if accepts_logits_to_keep(model) else {}  # not the whole prompt's
            output = model(input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask), use_cache=True,
                           **last_only)
            texts = greedy_decode(model, tokenizer, output.logits[:, -1].float(), output.past_key_values, mask,
                                  max_new_tokens=max_new_tokens, stop_at_answer_line=stop_at_answer_line)
            for i, text in zip(chunk, texts):
                answers[i] = text
    return answers


def evaluate(model: nn.Module, tokenizer: PreTrainedTokenizerBase, examples: Sequence[Example], *,
             answered: int | None = None, batch_size: int = 16, max_new_tokens: int = 96,
             gold_draft: bool = True) -> Evaluation:
    """Answer-token loss of every problem in ``examples``, and greedy answers to the first ``answered`` of them.

    Accuracy: the share of answered problems whose generated answer ends with
    the right number (:func:`bsi.data.extract_answer`, compared by
    :func:`bsi.data.answers_match` with the gold ``####`` number). Loss: the
    cross-entropy of the gold answer tokens given the question, per problem
    and token-weighted over the set. ``answered`` None answers every problem.
    ``gold_draft``: decode only after the part of the gold answer the model
    reproduces greedily (the module's docstring); False decodes every answer
    token by token from the prompt on. The model is evaluated in eval mode
    and left in the mode it came in.
    """
    answered = len(examples) if answered is None else min(answered, len(examples))
    pad = pad_id(tokenizer)
    prompts = [encode_prompt(tokenizer, e.question) for e in examples]
    golds = [encode_answer(tokenizer, e.answer) for e in examples]
    outcomes: list[ProblemOutcome | None] = [None] * len(examples)
    with eval_mode(model), torch.inference_mode():
        for group, generate in ((range(answered), True), (range(answered, len(examples)), False)):
            group = list(group)
            order = [group[i] for i in _length_order([len(prompts[j]) + len(golds[j]) for j in group])]
            for start in range(0, len(order), batch_size):
                chunk = order[start : start + batch_size]
                scored = _score_batch(model, [prompts[i] for i in chunk], [golds[i] for i in chunk], pad,
                                      keep_cache=generate)
                texts: list[str] | list[None] = _answer_batch(
                    model, tokenizer, scored, max_new_tokens=max_new_tokens, gold_draft=gold_draft
                ) if generate else [None] * len(chunk)
                for i, loss_sum, count, text in zip(chunk, scored.loss_sums.tolist(), scored.counts.tolist(), texts):
                    correct = None if text is None else \
                        answers_match(extract_answer(text), extract_answer(examples[i].answer) or "")
                    outcomes[i] = ProblemOutcome(loss_sum, int(count), correct, text)
    return Evaluation(tuple(outcomes))  # type: ignore[arg-type]


def dataset_loss(model: nn.Module, tokenizer: PreTrainedTokenizerBase, examples: Sequence[Example], *,
                 batch_size: int = 16) -> float:
    """Answer-token cross-entropy over a whole set, weighted by tokens (no gradient, no generation)."""
    return evaluate(model, tokenizer, examples, answered=0, batch_size=batch_size).metrics.loss
