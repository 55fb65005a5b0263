"""Loading a task: the embedded problems, a local JSONL file, or a ``datasets`` hub name."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from bsi.data.examples import Example, TaskData
from bsi.data.problems import EMBEDDED_TASK, embedded_task
from bsi.errors import BSIError
from bsi.files import json_object

MAX_LINE_BYTES = 1_000_000
"""Longest JSONL line :func:`load_task` accepts (1 MB); longer lines are refused unparsed."""

def load_task(
    spec: str = EMBEDDED_TASK,
    *,
    question_field: str = "question",
    answer_field: str = "answer",
    test_size: int = 100,
    train_size: int | None = None,
    seed: int = 0,
    split: str | None = None,
    validation_size: int = 0,
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
        validation_size: examples held out of training as a validation set
            (from the held-out problem generator for the embedded task; the
            first training examples after the shuffle otherwise).

    A file (or a single hub split) is shuffled with ``seed`` and its first
    ``test_size`` examples become the test set.
    """
    if test_size < 0:
        raise BSIError(f"test_size must be >= 0, got {test_size}")
    if train_size is not None and train_size < 1:
        raise BSIError(f"train_size must be >= 1, got {train_size}")
    if validation_size < 0:
        raise BSIError(f"validation_size must be >= 0, got {validation_size}")
    if spec == EMBEDDED_TASK:
        return embedded_task(test_size, train_size, seed, validation_size)
    path = Path(spec).expanduser()
    if spec.endswith(".jsonl") or path.exists():
        examples = read_jsonl(path, question_field, answer_field)
        train, test = _split(examples, test_size, seed, source=str(path))
        task = TaskData(name=path.name, train=train, test=test)
    else:
        task = _load_hub_task(spec, question_field, answer_field, test_size, seed, split)
    return _set_aside(task, validation_size, train_size, source=spec)


def _set_aside(task: TaskData, validation_size: int, train_size: int | None, source: str) -> TaskData:
    """The first ``validation_size`` training examples become the validation set; the rest, capped, train."""
    if validation_size >= len(task.train):
        raise BSIError(f"{source} has {len(task.train)} training examples, too few to set {validation_size} aside "
                       "for validation: lower the validation size")
    return TaskData(task.name, _cap_size(task.train[validation_size:], train_size), task.test,
                    task.train[:validation_size])


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


def _bounded_lines(handle: BinaryIO, path: Path) -> Iterator[bytes]:
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
    record = json_object(line, number, path)
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
    spec: str, question_field: str, answer_field: str, test_size: int, seed: int, split: str | None
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
    return TaskData(name=spec, train=train, test=test)


