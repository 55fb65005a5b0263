"""Task data: math word problems, prompts, token labels and mini-batches.

A task is a list of :class:`Example` (a question and a worked answer whose
last line is ``#### <number>``, the GSM8K format) split into train and test.
:func:`load_task` reads one from

* ``"embedded-math"``: grade-school word problems generated on the fly
  (:func:`generate_math_problems`), so bsi runs with no download;
* a local ``.jsonl`` file, one JSON object per line (GSM8K's own
  ``train.jsonl`` works as it is);
* a ``datasets`` hub name such as ``"openai/gsm8k"`` (needs network access).

Training and evaluation see the same text: :func:`build_prompt` wraps the
question in the model's chat template, :func:`encode_example` appends the
answer and the end-of-turn token and masks the prompt out of the loss, and
:class:`BatchStream` serves shuffled, padded mini-batches forever, in an order
fixed by its seed and resumable from its ``state_dict``.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from bsi.errors import BSIError

EMBEDDED_TASK = "embedded-math"
"""Spec of the built-in task: generated grade-school math word problems."""

IGNORE_INDEX = -100
"""Label value of tokens that carry no loss (prompt and padding); PyTorch's convention."""

MAX_LINE_BYTES = 1_000_000
"""Longest JSONL line :func:`load_task` accepts (1 MB); longer lines are refused unparsed."""

DEFAULT_TRAIN_SIZE = 2000
"""Training examples generated for the embedded task when no size is given."""


@dataclass(frozen=True)
class Example:
    """One task example: a question and its worked answer.

    ``answer`` is a short solution whose last line is ``#### <number>``, as in
    GSM8K: ``"She has 12 + 7 = 19 apples.\\n#### 19"``.
    """

    question: str
    answer: str


@dataclass
class TaskData:
    """A named task with its training and test examples."""

    name: str
    train: list[Example]
    test: list[Example]


# ---------------------------------------------------------------------------
# Generated math word problems
# ---------------------------------------------------------------------------

_NAMES = (
    ("Amy", "she"), ("Ben", "he"), ("Carla", "she"), ("David", "he"), ("Emma", "she"),
    ("Farid", "he"), ("Grace", "she"), ("Hugo", "he"), ("Ines", "she"), ("Jack", "he"),
    ("Kira", "she"), ("Liam", "he"), ("Maya", "she"), ("Noah", "he"), ("Olivia", "she"),
    ("Pablo", "he"), ("Rosa", "she"), ("Sam", "he"), ("Tara", "she"), ("Victor", "he"),
)  # fmt: skip
_ITEMS = (
    "apples", "pencils", "stickers", "cookies", "marbles", "books", "oranges",
    "cards", "balloons", "shells", "stamps", "candies", "eggs", "toy cars",
)  # fmt: skip
_PRICED = (("notebook", "notebooks"), ("pen", "pens"), ("sandwich", "sandwiches"),
           ("ticket", "tickets"), ("toy", "toys"), ("cupcake", "cupcakes"), ("kite", "kites"))  # fmt: skip
_CONTAINERS = ("boxes", "bags", "baskets", "packs", "jars")
_VEHICLES = (("car", "km"), ("train", "km"), ("bike", "km"), ("bus", "km"), ("boat", "miles"))


def _person(rng: random.Random) -> tuple[str, str]:
    """A random first name and its pronoun."""
    return rng.choice(_NAMES)


def _two_people(rng: random.Random) -> tuple[tuple[str, str], tuple[str, str]]:
    """Two different random people."""
    first, second = rng.sample(_NAMES, 2)
    return first, second


def _cap(word: str) -> str:
    return word[0].upper() + word[1:]


def _gather(rng: random.Random) -> Example:
    # one addition: "has a, finds b more"
    (name, pron), item = _person(rng), rng.choice(_ITEMS)
    a, b = rng.randint(2, 20), rng.randint(2, 10)
    return Example(
        f"{name} has {a} {item}. {_cap(pron)} finds {b} more {item}. How many {item} does {name} have now?",
        f"{name} has {a} + {b} = {a + b} {item} now.\n#### {a + b}",
    )


def _give_away(rng: random.Random) -> Example:
    # one subtraction
    (name, pron), item = _person(rng), rng.choice(_ITEMS)
    b = rng.randint(2, 10)
    a = b + rng.randint(1, 10)
    return Example(
        f"{name} had {a} {item} and gave {b} of them to a friend. How many {item} does {name} have left?",
        f"{name} has {a} - {b} = {a - b} {item} left.\n#### {a - b}",
    )


def _shopping(rng: random.Random) -> Example:
    # one multiplication: quantity x unit price
    (name, pron), (_, many) = _person(rng), rng.choice(_PRICED)
    count, price = rng.randint(2, 5), rng.randint(2, 5)
    return Example(
        f"{name} buys {count} {many} for ${price} each. How much money does {pron} spend?",
        f"{_cap(pron)} spends {count} x {price} = ${count * price}.\n#### {count * price}",
    )


def _change(rng: random.Random) -> Example:
    # two steps: cost, then change from a payment
    (name, pron), (_, many) = _person(rng), rng.choice(_PRICED)
    count, price = rng.randint(2, 3), rng.randint(2, 5)
    cost = count * price
    paid = 20
    return Example(
        f"{name} buys {count} {many} at ${price} each and pays with a ${paid} bill. How much change does {pron} get?",
        f"The {many} cost {count} x {price} = ${cost}.\n{_cap(pron)} gets {paid} - {cost} = ${paid - cost} back.\n#### {paid - cost}",
    )


def _sharing(rng: random.Random) -> Example:
    # one exact division
    (name, pron), item = _person(rng), rng.choice(_ITEMS)
    friends, each = rng.randint(2, 5), rng.randint(2, 5)
    total = friends * each
    return Example(
        f"{name} shares {total} {item} equally among {friends} friends. How many {item} does each friend get?",
        f"Each friend gets {total} / {friends} = {each} {item}.\n#### {each}",
    )


def _containers(rng: random.Random) -> Example:
    # one multiplication: groups x size
    item, box = rng.choice(_ITEMS), rng.choice(_CONTAINERS)
    groups, size = rng.randint(2, 5), rng.randint(2, 6)
    return Example(
        f"There are {groups} {box} with {size} {item} in each. How many {item} are there in total?",
        f"There are {groups} x {size} = {groups * size} {item}.\n#### {groups * size}",
    )


def _ages(rng: random.Random) -> Example:
    # two additions: an age difference, then years ahead
    (name, _), (other, _) = _two_people(rng)
    age, gap, years = rng.randint(5, 15), rng.randint(2, 5), rng.randint(2, 5)
    now = age + gap
    return Example(
        f"{name} is {age} years old. {other} is {gap} years older than {name}. How old will {other} be in {years} years?",
        f"{other} is {age} + {gap} = {now} years old.\nIn {years} years {other} will be {now} + {years} = {now + years}.\n#### {now + years}",
    )


def _distance(rng: random.Random) -> Example:
    # one multiplication: speed x time (speeds are round tens)
    (name, pron), (vehicle, unit) = _person(rng), rng.choice(_VEHICLES)
    speed, hours = rng.randint(1, 9) * 10, rng.randint(2, 4)
    return Example(
        f"{name} travels by {vehicle} at {speed} {unit} per hour for {hours} hours. How many {unit} does {pron} travel?",
        f"{_cap(pron)} travels {speed} x {hours} = {speed * hours} {unit}.\n#### {speed * hours}",
    )


def _savings(rng: random.Random) -> Example:
    # two steps: weekly savings, then a purchase
    (name, pron) = _person(rng)
    weekly, weeks = rng.randint(2, 5), rng.randint(2, 3)
    saved = weekly * weeks
    spent = rng.randint(1, saved - 1)
    return Example(
        f"{name} saves ${weekly} every week for {weeks} weeks, then spends ${spent} on a game. How much money does {pron} have left?",
        f"{_cap(pron)} saves {weekly} x {weeks} = ${saved}.\n{_cap(pron)} has {saved} - {spent} = ${saved - spent} left.\n#### {saved - spent}",
    )


_TEMPLATES: tuple[Callable[[random.Random], Example], ...] = (
    _gather, _give_away, _shopping, _change, _sharing, _containers, _ages, _distance, _savings,
)  # fmt: skip


def _problem_stream(rng: random.Random, exclude: frozenset[str] = frozenset()) -> Iterator[Example]:
    """Endless distinct problems from ``rng``, skipping questions in ``exclude``."""
    seen = set(exclude)
    misses = 0
    while True:
        example = rng.choice(_TEMPLATES)(rng)
        if example.question in seen:
            misses += 1
            if misses > 100_000:  # the templates cannot produce that many distinct problems
                raise BSIError("cannot generate that many distinct math problems: ask for fewer")
            continue
        seen.add(example.question)
        yield example


def generate_math_problems(n: int, seed: int) -> list[Example]:
    """``n`` distinct grade-school math word problems, the same for the same seed.

    Nine templates (collecting, giving away, shopping, change, sharing,
    boxes, ages, distance, savings) with one or two arithmetic steps on small
    numbers (sums within 30, times tables up to 5 x 6, round-ten speeds):
    easy enough that SmolLM2-135M learns the task in a few dozen fine-tuning
    steps, while it gets few of them right before. Answers are short worked solutions in GSM8K's style, e.g.::

        Sam has 12 + 7 = 19 apples now.
        #### 19

    Only ``random.Random(seed)`` is used, so the global random state is not
    touched.
    """
    if n < 0:
        raise BSIError(f"cannot generate {n} problems: the count must be >= 0")
    stream = _problem_stream(random.Random(seed))
    return [next(stream) for _ in range(n)]


def _embedded_task(test_size: int, train_size: int | None, seed: int) -> TaskData:
    """Generated train and test splits from different seeds, with no shared question."""
    train_size = DEFAULT_TRAIN_SIZE if train_size is None else train_size
    test = generate_math_problems(test_size, seed=2 * seed + 1)
    stream = _problem_stream(random.Random(2 * seed), exclude=frozenset(e.question for e in test))
    train = [next(stream) for _ in range(train_size)]
    return TaskData(name=EMBEDDED_TASK, train=train, test=test)


# ---------------------------------------------------------------------------
# Loading a task
# ---------------------------------------------------------------------------


def load_task(
    spec: str = EMBEDDED_TASK,
    *,
    question_field: str = "question",
    answer_field: str = "answer",
    test_size: int = 100,
    train_size: int | None = None,
    seed: int = 0,
    split: str | None = None,
) -> TaskData:
    """Load a task's train and test examples.

    Args:
        spec: ``"embedded-math"``, a ``.jsonl`` file, or a ``datasets`` hub
            name (``"openai/gsm8k"``; ``"name:config"`` picks a config).
        question_field, answer_field: the JSON fields holding the two texts.
        test_size: number of test examples.
        train_size: cap on training examples (``None``: all of them; 2000
            for the embedded task).
        seed: fixes the generated problems and the shuffle before splitting.
        split: for hub datasets, the split to read; by default its ``train``
            split trains and its ``test`` split (if any) tests.

    A file (or a single hub split) is shuffled with ``seed`` and its first
    ``test_size`` examples become the test set.
    """
    if test_size < 0:
        raise BSIError(f"test_size must be >= 0, got {test_size}")
    if train_size is not None and train_size < 1:
        raise BSIError(f"train_size must be >= 1, got {train_size}")
    if spec == EMBEDDED_TASK:
        return _embedded_task(test_size, train_size, seed)
    path = Path(spec).expanduser()
    if spec.endswith(".jsonl") or path.exists():
        examples = read_jsonl(path, question_field, answer_field)
        train, test = _split(examples, test_size, seed, source=str(path))
        return TaskData(name=path.name, train=_cap_size(train, train_size), test=test)
    return _load_hub_task(spec, question_field, answer_field, test_size, train_size, seed, split)


def read_jsonl(path: Path, question_field: str = "question", answer_field: str = "answer") -> list[Example]:
    """Read examples from a JSON-lines file, with one-line errors naming the line.

    Blank lines are skipped. A line longer than :data:`MAX_LINE_BYTES` is
    refused before it reaches the JSON parser.
    """
    if not path.exists():
        raise BSIError(f"data file '{path}' does not exist")
    if not path.is_file():
        raise BSIError(f"data path '{path}' is not a file: give a .jsonl file")
    examples = []
    with path.open("rb") as handle:
        for number, raw in enumerate(_bounded_lines(handle, path), start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise BSIError(f"{path}, line {number}: not UTF-8 text (byte {err.start}); save the file as UTF-8") from err
            if not line.strip():
                continue
            examples.append(_parse_line(line, number, path, question_field, answer_field))
    if not examples:
        raise BSIError(f"data file '{path}' holds no examples: expected one JSON object per line")
    return examples


def _bounded_lines(handle, path: Path) -> Iterator[bytes]:
    """The file's lines as bytes, refusing any line longer than MAX_LINE_BYTES.

    ``readline(limit)`` never reads more than ``limit`` bytes, so a huge line
    is detected without loading it into memory.
    """
    number = 0
    while True:
        raw = handle.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        number += 1
        if len(raw) > MAX_LINE_BYTES:
            raise BSIError(f"{path}, line {number}: longer than {MAX_LINE_BYTES} bytes; is this really a JSONL file?")
        yield raw


def _parse_line(line: str, number: int, path: Path, question_field: str, answer_field: str) -> Example:
    """One JSONL line to an Example, or a BSIError that says what is wrong with it."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise BSIError(f"{path}, line {number}: malformed JSON ({err.msg} at column {err.colno})") from err
    if not isinstance(record, dict):
        raise BSIError(f"{path}, line {number}: expected a JSON object, got {type(record).__name__}")
    values = []
    for field in (question_field, answer_field):
        if field not in record:
            have = ", ".join(repr(k) for k in record) or "none"
            raise BSIError(f"{path}, line {number}: missing field '{field}' (fields present: {have}); choose fields with --question-field/--answer-field")
        if not isinstance(record[field], str):
            raise BSIError(f"{path}, line {number}: field '{field}' must be a string, got {type(record[field]).__name__}")
        values.append(record[field])
    return Example(question=values[0], answer=values[1])


def _split(examples: list[Example], test_size: int, seed: int, source: str) -> tuple[list[Example], list[Example]]:
    """Seeded shuffle, then the first ``test_size`` examples are the test set."""
    if test_size >= len(examples):
        raise BSIError(f"{source} has {len(examples)} examples, too few for test_size={test_size}: lower the test size")
    order = list(examples)
    random.Random(seed).shuffle(order)
    return order[test_size:], order[:test_size]


def _cap_size(examples: list[Example], size: int | None) -> list[Example]:
    return examples if size is None else examples[:size]


def _load_hub_task(
    spec: str, question_field: str, answer_field: str, test_size: int, train_size: int | None, seed: int, split: str | None
) -> TaskData:
    """Load a task from the ``datasets`` hub (``name`` or ``name:config``)."""
    import datasets  # lazy: importing datasets takes a second

    name, _, config = spec.partition(":")
    try:
        try:
            dataset = datasets.load_dataset(name, config or None)
        except ValueError as err:  # e.g. gsm8k: "Config name is missing"
            if config or "config" not in str(err).lower():
                raise
            dataset = datasets.load_dataset(name, "main")
    except Exception as err:  # datasets raises many types (network, file, value errors)
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise BSIError(f"unknown task '{spec}': not '{EMBEDDED_TASK}', not a .jsonl file, and not loadable from the Hugging Face hub ({first})") from err

    def rows(split_name: str) -> list[Example]:
        part = dataset[split_name]
        for field in (question_field, answer_field):
            if field not in part.column_names:
                raise BSIError(f"dataset '{spec}' has no field '{field}' (fields: {', '.join(part.column_names)})")
        return [Example(str(q), str(a)) for q, a in zip(part[question_field], part[answer_field])]

    if split is not None:
        if split not in dataset:
            raise BSIError(f"dataset '{spec}' has no split '{split}' (splits: {', '.join(dataset)})")
        train, test = _split(rows(split), test_size, seed, source=spec)
    elif "train" in dataset and "test" in dataset:
        train, test = rows("train"), rows("test")
        random.Random(seed).shuffle(test)
        test = test[:test_size]
    else:
        first_split = "train" if "train" in dataset else next(iter(dataset))
        train, test = _split(rows(first_split), test_size, seed, source=spec)
    return TaskData(name=spec, train=_cap_size(train, train_size), test=test)


# ---------------------------------------------------------------------------
# Prompts and token labels
# ---------------------------------------------------------------------------


def build_prompt(tokenizer: PreTrainedTokenizerBase, question: str) -> str:
    """The text the model sees before its answer.

    With a chat template (instruct models), the question is the user's turn
    and the prompt ends with the opening of the assistant's turn
    (``...<|im_start|>assistant\\n`` in ChatML). Without one, a plain
    ``"Question: ...\\nAnswer:"`` format is used.
    """
    if tokenizer.chat_template:
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
        )
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
        rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception:  # templates may reject unusual conversations; fall back to eos
        return eos
    if marker not in rendered:
        return eos
    closing = rendered.split(marker, 1)[1].strip()
    if not closing:
        return eos
    for token in tokenizer.all_special_tokens:  # e.g. "<|im_end|>" out of "<|im_end|>\n"
        if closing.startswith(token):
            return token
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
    return tokenizer.encode(text, add_special_tokens=not tokenizer.chat_template)


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
    separator = "" if tokenizer.chat_template else " "  # "Answer:" + " 42", as text would read
    answer = tokenizer.encode(separator + example.answer + end_of_turn_text(tokenizer), add_special_tokens=False)
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


def pad_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The padding id to collate with (the eos id if the tokenizer has no pad token)."""
    value = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if value is None:
        raise BSIError("the tokenizer has neither a padding nor an end-of-sequence token")
    return value


class BatchStream:
    """An endless, reproducible stream of training mini-batches.

    Examples are tokenized once, when the stream is built. Each epoch visits
    them in a fresh random order drawn from ``(seed, epoch)`` alone, so the
    whole sequence of batches is fixed by the seed; ``state_dict()`` records
    where the stream is, and ``load_state_dict()`` on a new stream over the
    same examples continues with exactly the batches the old one would have
    served. An epoch has ``steps_per_epoch`` full batches; the few examples
    that do not fill a last batch sit that epoch out (the next epoch's
    reshuffle gives them their turn).

    >>> stream = BatchStream(task.train, tokenizer, batch_size=8)  # doctest: +SKIP
    >>> batch = next(stream)  # {"input_ids", "attention_mask", "labels"}: (8, T)
    """

    def __init__(
        self,
        examples: Sequence[Example],
        tokenizer: PreTrainedTokenizerBase,
        batch_size: int = 8,
        max_length: int = 256,
        seed: int = 0,
    ) -> None:
        if not examples:
            raise BSIError("no training examples: the batch stream needs at least one")
        if batch_size < 1:
            raise BSIError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        self.max_length = max_length
        self.seed = seed
        self.pad_id = pad_id(tokenizer)
        self._encoded = [encode_example(tokenizer, e, max_length) for e in examples]
        self.epoch = 0
        self.position = 0  # index of the next batch within the epoch
        self._order = self._epoch_order(self.epoch)

    @property
    def steps_per_epoch(self) -> int:
        """Batches per epoch (at least 1, a short batch when there are few examples)."""
        return max(1, len(self._encoded) // self.batch_size)

    def _epoch_order(self, epoch: int) -> list[int]:
        """Permutation of the examples for one epoch, from ``(seed, epoch)`` only."""
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(len(self._encoded), generator=generator).tolist()

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


# ---------------------------------------------------------------------------
# Answers
# ---------------------------------------------------------------------------

_NUMBER = re.compile(r"(?:(?<![\w)])-)?\$?\d[\d,]*(?:\.\d+)?")  # "-" only as a sign, not "20-14"


def _normalise(number: str) -> str:
    """``"$1,200.00"`` -> ``"1200"``; ``"3.50"`` -> ``"3.5"``; ``"-$4"`` -> ``"-4"``."""
    text = number.replace(",", "").replace("$", "").replace(" ", "").rstrip(".")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    if text in ("-0", ""):
        text = "0"
    return text


def extract_answer(text: str) -> str | None:
    """The final numeric answer in a solution, normalised; ``None`` if there is none.

    The number right after the last ``####`` wins; without ``####``, the last
    number in the text. Commas, ``$`` and a trailing period go, and so do
    zero decimals: ``"#### $1,200.00"`` gives ``"1200"``.
    """
    if "####" in text:
        found = _NUMBER.search(text.rsplit("####", 1)[1])
        if found:
            return _normalise(found.group())
    numbers = _NUMBER.findall(text)
    return _normalise(numbers[-1]) if numbers else None


def answers_match(pred: str | None, gold: str) -> bool:
    """Whether a predicted answer equals the gold one (numerically when both are numbers).

    Both sides go through the same normalisation as :func:`extract_answer`,
    so ``"19.0"`` matches ``"19"`` and ``"1,200"`` matches ``"1200"``.
    """
    if pred is None:
        return False
    a, b = _normalise(pred.strip()), _normalise(gold.strip())
    try:
        return Decimal(a) == Decimal(b)
    except InvalidOperation:
        return a == b
