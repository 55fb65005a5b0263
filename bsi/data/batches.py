"""From examples to tokens: prompts, answer labels, padded mini-batches and the batch stream.

Training and evaluation see the same text: :func:`build_prompt` wraps the
question in the model's chat template, :func:`encode_example` appends the
answer and the end-of-turn token and masks the prompt out of the loss, and
:class:`BatchStream` serves shuffled, padded mini-batches forever, in an order
fixed by its seed and resumable from its ``state_dict``.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum
from typing import cast, overload

import torch
from transformers import PreTrainedTokenizerBase

from bsi.data.examples import Example
from bsi.errors import BSIError


class BatchUse(IntEnum):
    """What a stream of training batches is for: each use draws its own order, seeded ``run seed + use``.

    A run draws several streams from one training set: the fine-tune's, the
    pruning rounds', the recovery's, the baselines' calibration and ASVD's
    sensitivity batches. Their values offset the seed, so they are part of
    every result's reproducibility (a cached fine-tune, a resumed run, a
    shipped sweep): never renumber them.
    """

    FINETUNE = 1
    COMPRESS = 2
    RECOVER = 3
    CALIBRATE = 4
    SENSITIVITY = 5


#: Seeds of different processes of one run lie this far apart (process ``rank`` adds ``rank * stride``), so each
#: process draws its own batches; far more than the uses above, so no two streams of a run share a seed.
PROCESS_SEED_STRIDE = 1000

IGNORE_INDEX = -100
"""Label value of tokens that carry no loss (prompt and padding); PyTorch's convention."""

def build_prompt(tokenizer: PreTrainedTokenizerBase, question: str) -> str:
    """The text the model sees before its answer.

    With a chat template (instruct models), the question is the user's turn
    and the prompt ends with the opening of the assistant's turn
    (``...<|im_start|>assistant\\n`` in ChatML). Without one, a plain
    ``"Question: ...\\nAnswer:"`` format is used.
    """
    if tokenizer.chat_template:
        return cast(str, tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
        ))
    return f"Question: {question}\nAnswer:"


def end_of_turn_text(tokenizer: PreTrainedTokenizerBase) -> str:
    """The text that closes the model's answer (``<|im_end|>`` for ChatML).

    Found by rendering a conversation whose assistant turn is a marker and
    reading what the chat template writes right after the marker (trailing
    whitespace aside). Without a chat template, or when the template writes
    nothing there, it is the tokenizer's end-of-sequence token.
    """
    eos = tokenizer.eos_token or ""
    if not tokenizer.chat_template:
        return eos
    marker = "\x00BSI-ANSWER\x00"
    messages = [{"role": "user", "content": "?"}, {"role": "assistant", "content": marker}]
    try:
        rendered = cast(str, tokenizer.apply_chat_template(messages, tokenize=False))
    except Exception:  # templates may reject unusual conversations; fall back to eos
        return eos
    if marker not in rendered:
        return eos
    closing = rendered.split(marker, 1)[1].strip()
    if not closing:
        return eos
    for token in tokenizer.all_special_tokens:  # e.g. "<|im_end|>" out of "<|im_end|>\n"
        if closing.startswith(token):
            return str(token)
    return closing


def stop_token_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Token ids that end generation: the end-of-turn token and the eos token."""
    ids = []
    turn = tokenizer.encode(end_of_turn_text(tokenizer), add_special_tokens=False)
    if len(turn) == 1:
        ids.append(turn[0])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


def encode_prompt(tokenizer: PreTrainedTokenizerBase, question: str) -> list[int]:
    """Token ids of :func:`build_prompt`'s text, exactly as generation feeds them.

    A chat template writes its own special tokens (a BOS, if the model uses
    one), so they are not added a second time; the plain format gets the
    tokenizer's usual special tokens.
    """
    text = build_prompt(tokenizer, question)
    ids: list[int] = tokenizer.encode(text, add_special_tokens=not tokenizer.chat_template)
    return ids


def encode_answer(tokenizer: PreTrainedTokenizerBase, answer: str) -> list[int]:
    """Token ids of a worked answer as the model should produce it: the answer, then the end-of-turn token.

    Tokenized apart from the prompt, exactly as generation will see it (in the
    plain format after a space: ``"Answer: 42"``). Training labels and the
    evaluation's answer-token loss both use these ids.
    """
    separator = "" if tokenizer.chat_template else " "  # "Answer:" + " 42", as text would read
    ids: list[int] = tokenizer.encode(separator + answer + end_of_turn_text(tokenizer), add_special_tokens=False)
    return ids


def encode_example(tokenizer: PreTrainedTokenizerBase, example: Example, max_length: int) -> dict[str, list[int]]:
    """Token ids and labels for training on one example.

    ``input_ids`` is prompt + answer + end-of-turn token. ``labels`` repeats
    the ids but holds -100 on the prompt, so the loss only asks the model to
    produce the answer and to stop afterwards. The answer is tokenized
    separately from the prompt, exactly as generation will see it (in the
    plain format, after a space: ``"Answer: 42"``).

    Longer than ``max_length``: the end is cut off, but at least a quarter of
    ``max_length`` (or the whole answer, if shorter) stays answer tokens, the
    prompt losing its beginning instead.
    """
    if max_length < 2:
        raise BSIError(f"max_length must be at least 2, got {max_length}")
    prompt = encode_prompt(tokenizer, example.question)
    answer = encode_answer(tokenizer, example.answer)
    min_answer = min(len(answer), max(1, max_length // 4))
    answer_keep = min(len(answer), max(max_length - len(prompt), min_answer))
    prompt_keep = max_length - answer_keep
    prompt = prompt[len(prompt) - prompt_keep :] if prompt_keep < len(prompt) else prompt
    answer = answer[:answer_keep]
    return {
        "input_ids": prompt + answer,
        "labels": [IGNORE_INDEX] * len(prompt) + answer,
    }


def collate(encoded: Sequence[dict[str, list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad encoded examples into a batch of ``(B, T)`` tensors.

    Returns ``input_ids`` (padding = ``pad_id``), ``attention_mask`` (1 on
    real tokens) and ``labels`` (-100 on padding), all int64 of shape
    ``(B, T)`` with ``T`` the longest example.
    """
    if not encoded:
        raise BSIError("cannot collate an empty batch")
    width = max(len(e["input_ids"]) for e in encoded)
    input_ids = torch.full((len(encoded), width), pad_id, dtype=torch.long)  # (B, T)
    labels = torch.full((len(encoded), width), IGNORE_INDEX, dtype=torch.long)  # (B, T)
    attention_mask = torch.zeros((len(encoded), width), dtype=torch.long)  # (B, T)
    for row, item in enumerate(encoded):
        n = len(item["input_ids"])
        input_ids[row, :n] = torch.tensor(item["input_ids"], dtype=torch.long)
        labels[row, :n] = torch.tensor(item["labels"], dtype=torch.long)
        attention_mask[row, :n] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def batch_tokens(batch: dict[str, torch.Tensor]) -> int:
    """The tokens a model reads in ``batch``: the ones of its ``attention_mask`` (every input id without one)."""
    mask = batch.get("attention_mask")
    return int(mask.sum()) if mask is not None else int(batch["input_ids"].numel())


def pad_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The padding id to collate with (the eos id if the tokenizer has no pad token)."""
    value: int | None = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if value is None:
        raise BSIError("the tokenizer has neither a padding nor an end-of-sequence token")
    return value


def epoch_permutation(count: int, seed: int, epoch: int) -> list[int]:
    """The order in which a batch stream visits its ``count`` items in one epoch.

    A permutation of ``range(count)`` drawn from ``(seed, epoch)`` alone (a
    private generator; the global random state is not touched), so a stream
    can jump to any epoch and serve exactly the batches it would have served.
    :class:`BatchStream` and :class:`bsi.data.text.TextBatchStream` share it.
    """
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(count, generator=generator).tolist()


class EncodedExamples(Sequence[dict[str, list[int]]]):
    """A task's examples as :func:`encode_example` tokenizes them, each tokenized the first time it is asked for.

    Tokenizing is not free: through a chat template it took about 0.6 ms an
    example on one core, and a run builds a stream for each use (fine-tune,
    rounds, recovery, calibration) over the whole training set while serving
    only a few hundred of its examples. Shared by those streams (a
    :class:`~bsi.pipeline.runner.Pipeline` holds one), each example is tokenized at
    most once per run, and only if some batch serves it. The ids are exactly
    :func:`encode_example`'s, so the batches are the same as if every example
    had been tokenized up front.

    >>> encoded = EncodedExamples(task.train, tokenizer, max_length=160)  # doctest: +SKIP
    >>> encoded[3]["input_ids"]  # tokenized now; later calls return the same lists
    """

    def __init__(self, examples: Sequence[Example], tokenizer: PreTrainedTokenizerBase, max_length: int) -> None:
        if max_length < 2:
            raise BSIError(f"max_length must be at least 2, got {max_length}")
        self.examples = examples
        self.tokenizer = tokenizer
        self.max_length = max_length
        self._encoded: dict[int, dict[str, list[int]]] = {}

    def __len__(self) -> int:
        return len(self.examples)

    @overload
    def __getitem__(self, index: int) -> dict[str, list[int]]: ...

    @overload
    def __getitem__(self, index: slice) -> list[dict[str, list[int]]]: ...

    def __getitem__(self, index: int | slice) -> dict[str, list[int]] | list[dict[str, list[int]]]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        index = range(len(self))[index]  # negative indices as a list takes them; out of range: IndexError
        found = self._encoded.get(index)
        if found is None:
            found = self._encoded[index] = encode_example(self.tokenizer, self.examples[index], self.max_length)
        return found

    @property
    def tokenized(self) -> int:
        """How many examples have been tokenized so far."""
        return len(self._encoded)


class BatchStream:
    """An endless, reproducible stream of training mini-batches.

    Each epoch visits the examples in a fresh random order drawn from
    ``(seed, epoch)`` alone, so the whole sequence of batches is fixed by the
    seed; ``state_dict()`` records where the stream is, and
    ``load_state_dict()`` on a new stream over the same examples continues
    with exactly the batches the old one would have served. An epoch has
    ``steps_per_epoch`` full batches; the few examples that do not fill a
    last batch sit that epoch out (the next epoch's reshuffle gives them
    their turn). An example is tokenized when a batch first serves it
    (:class:`EncodedExamples`; pass one to share the tokens between streams
    over the same examples).

    >>> stream = BatchStream(task.train, tokenizer, batch_size=8)  # doctest: +SKIP
    >>> batch = next(stream)  # {"input_ids", "attention_mask", "labels"}: (8, T)
    """

    def __init__(
        self,
        examples: Sequence[Example] | EncodedExamples,
        tokenizer: PreTrainedTokenizerBase,
        batch_size: int = 8,
        max_length: int = 256,
        seed: int = 0,
    ) -> None:
        if not examples:
            raise BSIError("no training examples: the batch stream needs at least one")
        if batch_size < 1:
            raise BSIError(f"batch_size must be >= 1, got {batch_size}")
        if isinstance(examples, EncodedExamples) and (examples.tokenizer is not tokenizer
                                                      or examples.max_length != max_length):
            raise BSIError("the encoded examples were tokenized with another tokenizer or max_length than this "
                           "stream's: build the stream from the examples themselves")
        self.batch_size = batch_size
        self.max_length = max_length
        self.seed = seed
        self.pad_id = pad_id(tokenizer)
        self._encoded = examples if isinstance(examples, EncodedExamples) else \
            EncodedExamples(examples, tokenizer, max_length)
        self.epoch = 0
        self.position = 0  # index of the next batch within the epoch
        self._order = self._epoch_order(self.epoch)

    @property
    def steps_per_epoch(self) -> int:
        """Batches per epoch (at least 1, a short batch when there are few examples)."""
        return max(1, len(self._encoded) // self.batch_size)

    @property
    def tokens(self) -> EncodedExamples:
        """The examples' tokens this stream serves from (shared with the streams built over the same object)."""
        return self._encoded

    def _epoch_order(self, epoch: int) -> list[int]:
        """Permutation of the examples for one epoch, from ``(seed, epoch)`` only."""
        return epoch_permutation(len(self._encoded), self.seed, epoch)

    def __iter__(self) -> BatchStream:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        if self.position >= self.steps_per_epoch:
            self.epoch, self.position = self.epoch + 1, 0
            self._order = self._epoch_order(self.epoch)
        start = self.position * self.batch_size
        chosen = self._order[start : start + self.batch_size]
        self.position += 1
        return collate([self._encoded[i] for i in chosen], self.pad_id)

    def state_dict(self) -> dict[str, int]:
        """Where the stream stands: ``{"epoch", "position", "seed"}``."""
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from a :meth:`state_dict` (of a stream over the same examples)."""
        self.seed, self.epoch, self.position = int(state["seed"]), int(state["epoch"]), int(state["position"])
        self._order = self._epoch_order(self.epoch)


