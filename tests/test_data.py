"""Task data: generated problems, JSONL loading, prompts, labels, batches, answers."""

from __future__ import annotations

import json
import re

import pytest
import torch

from bsi.data import (
    EMBEDDED_TASK,
    IGNORE_INDEX,
    MAX_LINE_BYTES,
    BatchStream,
    EncodedExamples,
    Example,
    answers_match,
    build_prompt,
    collate,
    encode_example,
    end_of_turn_text,
    epoch_permutation,
    extract_answer,
    generate_math_problems,
    load_task,
)
from bsi.errors import BSIError
from bsi.models import build_tiny_tokenizer

_STEP = re.compile(r"(\d+) ([-+x/]) (\d+) = \$?(\d+)")
_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "x": lambda a, b: a * b, "/": lambda a, b: a / b}


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def problems() -> list[Example]:
    return generate_math_problems(300, seed=3)


def _write_jsonl(path, records) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


# --------------------------------------------------------------- generation


def test_generation_is_deterministic_per_seed(problems):
    assert generate_math_problems(300, seed=3) == problems
    assert generate_math_problems(300, seed=4) != problems
    assert generate_math_problems(10, seed=3) == problems[:10]


def test_generated_questions_are_distinct_and_varied(problems):
    assert len({p.question for p in problems}) == len(problems)
    openings = {p.question.split(" ")[1] for p in problems}  # verbs/nouns differ across templates
    assert len(openings) >= 5


def test_generated_arithmetic_is_correct(problems):
    for problem in problems:
        steps = _STEP.findall(problem.answer)
        assert 1 <= len(steps) <= 2, problem.answer
        for a, op, b, result in steps:
            assert _OPS[op](int(a), int(b)) == int(result), problem.answer
        assert problem.answer.splitlines()[-1] == f"#### {steps[-1][3]}"
        assert extract_answer(problem.answer) == steps[-1][3]


def test_generated_solutions_are_short(problems):
    assert max(len(p.answer) for p in problems) < 130
    assert all(p.question.endswith("?") for p in problems)


def test_embedded_task_splits_are_disjoint_and_sized():
    task = load_task(EMBEDDED_TASK, test_size=50, train_size=500, seed=1)
    assert task.name == EMBEDDED_TASK
    assert (len(task.train), len(task.test)) == (500, 50)
    assert not {e.question for e in task.train} & {e.question for e in task.test}
    assert load_task(EMBEDDED_TASK, test_size=50, train_size=500, seed=1) == task


def test_embedded_task_default_train_size():
    assert len(load_task().train) == 2000


# --------------------------------------------------------------- JSONL files


def test_jsonl_loads_shuffles_and_splits(tmp_path):
    path = tmp_path / "task.jsonl"
    records = [{"q": f"What is {i} + 1?", "a": f"{i} + 1 = {i + 1}\n#### {i + 1}", "extra": i} for i in range(30)]
    _write_jsonl(path, records)
    with path.open("a", encoding="utf-8") as f:
        f.write("\n   \n")  # blank lines are skipped
    task = load_task(str(path), question_field="q", answer_field="a", test_size=5, seed=7)
    assert task.name == "task.jsonl"
    assert (len(task.train), len(task.test)) == (25, 5)
    everything = {(e.question, e.answer) for e in task.train + task.test}
    assert everything == {(r["q"], r["a"]) for r in records}
    assert [e.question for e in task.test] != [r["q"] for r in records[:5]]  # shuffled
    assert load_task(str(path), question_field="q", answer_field="a", test_size=5, seed=7) == task
    capped = load_task(str(path), question_field="q", answer_field="a", test_size=5, seed=7, train_size=10)
    assert capped.train == task.train[:10] and capped.test == task.test


def _error_for(tmp_path, content: bytes, **kwargs) -> str:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    with pytest.raises(BSIError) as info:
        load_task(str(path), test_size=0, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


GOOD = json.dumps({"question": "q?", "answer": "#### 1"}).encode() + b"\n"


def test_jsonl_missing_file(tmp_path):
    with pytest.raises(BSIError, match="does not exist"):
        load_task(str(tmp_path / "absent.jsonl"))


def test_jsonl_empty_file(tmp_path):
    assert "no examples" in _error_for(tmp_path, b"\n\n")


def test_jsonl_malformed_line(tmp_path):
    message = _error_for(tmp_path, GOOD + b'{"question": "q?", "answer": \n')
    assert "line 2" in message and "malformed JSON" in message


def test_jsonl_line_that_is_not_an_object(tmp_path):
    message = _error_for(tmp_path, GOOD + GOOD + b'["q", "a"]\n')
    assert "line 3" in message and "JSON object" in message and "list" in message


def test_jsonl_missing_field_lists_the_fields_present(tmp_path):
    message = _error_for(tmp_path, GOOD + json.dumps({"problem": "q?", "answer": "#### 1"}).encode())
    assert "line 2" in message and "missing field 'question'" in message and "'problem'" in message


def test_jsonl_non_string_value(tmp_path):
    message = _error_for(tmp_path, json.dumps({"question": "q?", "answer": 7}).encode())
    assert "line 1" in message and "'answer'" in message and "string" in message


def test_jsonl_not_utf8(tmp_path):
    message = _error_for(tmp_path, GOOD + '{"question": "caf\u00e9", "answer": "#### 1"}\n'.encode("latin-1"))
    assert "line 2" in message and "UTF-8" in message


def test_jsonl_line_too_long(tmp_path):
    huge = json.dumps({"question": "x" * MAX_LINE_BYTES, "answer": "#### 1"}).encode()
    message = _error_for(tmp_path, GOOD + huge + b"\n")
    assert "line 2" in message and "longer than" in message


def test_jsonl_test_size_too_large(tmp_path):
    path = tmp_path / "small.jsonl"
    path.write_bytes(GOOD * 3)
    with pytest.raises(BSIError, match="3 examples"):
        load_task(str(path), test_size=3)


def test_gsm8k_style_answers_keep_their_final_number(tmp_path):
    path = tmp_path / "gsm.jsonl"
    answer = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips.\n#### 72"
    _write_jsonl(path, [{"question": "How many clips?", "answer": answer}] * 2)
    task = load_task(str(path), test_size=1)
    assert extract_answer(task.test[0].answer) == "72"


# --------------------------------------------------------------- prompts and labels


def test_build_prompt_uses_the_chat_template(tokenizer):
    prompt = build_prompt(tokenizer, "What is 2 + 3?")
    assert prompt == "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"


def test_build_prompt_without_a_chat_template():
    plain = build_tiny_tokenizer()
    plain.chat_template = None
    assert build_prompt(plain, "What is 2 + 3?") == "Question: What is 2 + 3?\nAnswer:"
    assert end_of_turn_text(plain) == plain.eos_token


def test_encode_example_in_the_plain_format_ends_with_eos():
    plain = build_tiny_tokenizer()
    plain.chat_template = None
    encoded = encode_example(plain, Example("What is 2 + 3?", "#### 5"), max_length=128)
    answered = [t for t in encoded["labels"] if t != IGNORE_INDEX]
    assert plain.decode(encoded["input_ids"]) == "Question: What is 2 + 3?\nAnswer: #### 5" + plain.eos_token
    assert plain.decode(answered) == " #### 5" + plain.eos_token
    assert answered[-1] == plain.eos_token_id


def test_end_of_turn_is_read_from_the_template(tokenizer):
    assert end_of_turn_text(tokenizer) == "<|im_end|>"


def test_encode_example_masks_the_prompt_and_ends_with_end_of_turn(tokenizer):
    example = Example("What is 2 + 3?", "2 + 3 = 5\n#### 5")
    encoded = encode_example(tokenizer, example, max_length=256)
    ids, labels = encoded["input_ids"], encoded["labels"]
    prompt_ids = tokenizer.encode(build_prompt(tokenizer, example.question), add_special_tokens=False)
    assert len(ids) == len(labels)
    assert ids[: len(prompt_ids)] == prompt_ids
    assert labels[: len(prompt_ids)] == [IGNORE_INDEX] * len(prompt_ids)
    assert labels[len(prompt_ids) :] == ids[len(prompt_ids) :]
    assert labels[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.decode(labels[len(prompt_ids) :]) == example.answer + "<|im_end|>"


def test_encode_example_truncates_but_keeps_answer_tokens(tokenizer):
    example = Example("A long question? " * 20, "1 + 1 = 2\n#### 2")
    encoded = encode_example(tokenizer, example, max_length=40)
    answered = [t for t in encoded["labels"] if t != IGNORE_INDEX]
    assert len(encoded["input_ids"]) == 40
    assert len(answered) == 10  # a quarter of max_length stays answer
    assert tokenizer.decode(answered) == "1 + 1 = 2\n"
    assert tokenizer.decode(encoded["input_ids"]).endswith("<|im_start|>assistant\n1 + 1 = 2\n")


def test_collate_pads_on_the_right(tokenizer):
    examples = [Example("Short?", "#### 1"), Example("A longer question here?", "2 + 2 = 4\n#### 4")]
    encoded = [encode_example(tokenizer, e, max_length=256) for e in examples]
    batch = collate(encoded, pad_id=tokenizer.pad_token_id)
    lengths = [len(e["input_ids"]) for e in encoded]
    assert {k: tuple(v.shape) for k, v in batch.items()} == {k: (2, max(lengths)) for k in batch}
    assert batch["attention_mask"].sum(1).tolist() == lengths
    short = lengths[0]
    assert batch["input_ids"][0, short:].eq(tokenizer.pad_token_id).all()
    assert batch["labels"][0, short:].eq(IGNORE_INDEX).all()
    assert batch["input_ids"][1].tolist() == encoded[1]["input_ids"]


# --------------------------------------------------------------- batch stream


def _take(stream: BatchStream, n: int) -> list[dict[str, torch.Tensor]]:
    return [next(stream) for _ in range(n)]


def _same(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(torch.equal(x["input_ids"], y["input_ids"]) for x, y in zip(a, b))


def test_batch_stream_is_reproducible_and_reshuffles(tokenizer, problems):
    examples = problems[:20]
    stream = BatchStream(examples, tokenizer, batch_size=4, max_length=128, seed=5)
    assert stream.steps_per_epoch == 5
    batches = _take(stream, 10)  # two epochs
    assert _same(_take(BatchStream(examples, tokenizer, batch_size=4, max_length=128, seed=5), 10), batches)
    assert not _same(_take(BatchStream(examples, tokenizer, batch_size=4, max_length=128, seed=6), 10), batches)
    first, second = (torch.cat([b["input_ids"][:, :8] for b in batches[i : i + 5]]) for i in (0, 5))
    assert not torch.equal(first, second)  # a new order in epoch 2
    assert stream.state_dict() == {"epoch": 1, "position": 5, "seed": 5}
    assert all(b["input_ids"].shape[0] == 4 for b in batches)


def test_batch_stream_resumes_from_its_state(tokenizer, problems):
    examples = problems[:18]
    stream = BatchStream(examples, tokenizer, batch_size=4, max_length=128, seed=2)
    _take(stream, 6)  # past the first epoch boundary (4 steps per epoch)
    state = stream.state_dict()
    expected = _take(stream, 7)
    resumed = BatchStream(examples, tokenizer, batch_size=4, max_length=128, seed=99)
    resumed.load_state_dict(state)
    assert _same(_take(resumed, 7), expected)


def test_batch_stream_with_fewer_examples_than_a_batch(tokenizer, problems):
    stream = BatchStream(problems[:3], tokenizer, batch_size=8)
    assert stream.steps_per_epoch == 1
    assert next(stream)["input_ids"].shape[0] == 3


def test_batch_stream_tokenizes_only_what_it_serves_and_streams_share_the_tokens(tokenizer, problems):
    """Lazy tokens change nothing: the batches are those of every example tokenized up front, by encode_example."""
    examples = problems[:40]
    shared = EncodedExamples(examples, tokenizer, max_length=128)
    stream = BatchStream(shared, tokenizer, batch_size=4, max_length=128, seed=5)
    batches = _take(stream, 3)
    assert shared.tokenized == 12  # three batches of four, nothing else
    up_front = [encode_example(tokenizer, e, max_length=128) for e in examples]
    order = epoch_permutation(len(examples), seed=5, epoch=0)
    for b, batch in enumerate(batches):
        expected = collate([up_front[i] for i in order[4 * b : 4 * b + 4]], tokenizer.pad_token_id)
        assert all(torch.equal(batch[k], expected[k]) for k in expected)
    assert _same(_take(BatchStream(examples, tokenizer, batch_size=4, max_length=128, seed=5), 3), batches)
    again = BatchStream(shared, tokenizer, batch_size=4, max_length=128, seed=5)  # another use of the same tokens
    assert _same(_take(again, 3), batches) and shared.tokenized == 12
    assert shared[-1] == up_front[-1] and shared[1:3] == up_front[1:3] and len(shared) == 40
    with pytest.raises(IndexError):
        shared[40]
    with pytest.raises(BSIError, match="another tokenizer or max_length"):
        BatchStream(shared, tokenizer, batch_size=4, max_length=64)
    with pytest.raises(BSIError, match="max_length must be at least 2"):
        BatchStream(examples, tokenizer, max_length=1)  # refused when built, before any batch


def test_batch_stream_rejects_no_examples(tokenizer):
    with pytest.raises(BSIError):
        BatchStream([], tokenizer)


# --------------------------------------------------------------- answers


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("She has 12 + 7 = 19 apples.\n#### 19", "19"),
        ("#### 1,200", "1200"),
        ("#### $42.", "42"),
        ("#### 3.50", "3.5"),
        ("#### 7.00", "7"),
        ("#### -5", "-5"),
        ("first #### 3 then #### 4", "4"),
        ("So the answer is 20-14 = 6.", "6"),
        ("It costs $1,000.0", "1000"),
        ("The answer is -3.", "-3"),
        ("no number here", None),
        ("#### 12 apples, then 8 more", "12"),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    ("pred", "gold", "match"),
    [("19", "19", True), ("19.0", "19", True), ("1,200", "1200", True), ("$5", "5", True),
     ("18", "19", False), (None, "19", False), ("0.5", ".5", True), ("abc", "abc", True)],
)  # fmt: skip
def test_answers_match(pred, gold, match):
    assert answers_match(pred, gold) is match


def test_the_batch_streams_keep_their_numbers():
    """Each use's value seeds its stream: a cached fine-tune, a resumed run and a shipped sweep depend on them."""
    from bsi.data import PROCESS_SEED_STRIDE, BatchUse

    assert {use.name: int(use) for use in BatchUse} == {"FINETUNE": 1, "COMPRESS": 2, "RECOVER": 3, "CALIBRATE": 4,
                                                         "SENSITIVITY": 5}
    assert PROCESS_SEED_STRIDE > max(BatchUse)  # two processes never draw one stream's order
