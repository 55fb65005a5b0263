"""The answer-token loss, greedy generation and task evaluation (on the tiny model)."""

from __future__ import annotations

import json

import pytest
import torch

from bsi.data import BatchStream, Example, collate, encode_example, encode_prompt, stop_token_ids
from bsi.models import TINY_MODEL, load_model_and_tokenizer
from bsi.pipeline.evaluate import (
    Metrics,
    accepted_draft_lengths,
    answer_line_complete,
    dataset_loss,
    evaluate,
    generate_answers,
)
from bsi.pipeline.losses import answer_token_loss
from bsi.pipeline.training import finetune

EXAMPLES = [
    Example("What is 2 + 3?", "2 + 3 = 5\n#### 5"),
    Example("What is 4 + 4?", "4 + 4 = 8\n#### 8"),
    Example("Tom has 7 pens and loses 1. How many are left?", "7 - 1 = 6\n#### 6"),
    Example("What is 3 x 3?", "3 x 3 = 9\n#### 9"),
]


def _batch(tokenizer, examples=EXAMPLES[:2]):
    return collate([encode_example(tokenizer, e, max_length=128) for e in examples], tokenizer.pad_token_id)


def test_answer_token_loss_matches_a_hand_computation(tiny):
    model, tokenizer = tiny
    batch = _batch(tokenizer)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    terms = []
    for row in range(batch["input_ids"].shape[0]):
        for t in range(1, batch["input_ids"].shape[1]):
            target = int(batch["labels"][row, t])
            if target != -100:  # token t is predicted from position t - 1
                terms.append(-torch.log_softmax(logits[row, t - 1].double(), dim=-1)[target])
    expected = torch.stack(terms).mean()
    loss = answer_token_loss(model, batch)
    assert loss.dtype == torch.float32 and loss.requires_grad
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)


def test_answer_token_loss_weights_tokens_and_ignores_padding(tiny):
    model, tokenizer = tiny
    encoded = [encode_example(tokenizer, e, max_length=128) for e in EXAMPLES[1:3]]  # different lengths
    counts = [sum(t != -100 for t in e["labels"]) for e in encoded]
    with torch.no_grad():
        alone = [answer_token_loss(model, collate([e], tokenizer.pad_token_id)).item() for e in encoded]
        together = answer_token_loss(model, collate(encoded, tokenizer.pad_token_id)).item()
    weighted = sum(loss * n for loss, n in zip(alone, counts)) / sum(counts)
    assert together == pytest.approx(weighted, rel=1e-5)


def test_answer_token_loss_is_float32_for_a_bfloat16_model():
    model, tokenizer = load_model_and_tokenizer(TINY_MODEL, dtype=torch.bfloat16)
    loss = answer_token_loss(model, _batch(tokenizer))
    assert loss.dtype == torch.float32 and torch.isfinite(loss)


def test_generation_is_batch_independent_and_restores_padding_side(tiny):
    model, tokenizer = tiny
    questions = [e.question for e in EXAMPLES]
    one_by_one = generate_answers(model, tokenizer, questions, max_new_tokens=12, batch_size=1)
    batched = generate_answers(model, tokenizer, questions, max_new_tokens=12, batch_size=4)
    assert batched == one_by_one  # left padding does not change what a row generates
    assert len(batched) == 4 and all(isinstance(a, str) for a in batched)
    assert tokenizer.padding_side == "right"


def test_generation_stops_at_end_of_turn_and_drops_special_tokens(tiny):
    model, tokenizer = tiny
    with torch.no_grad():  # make <|im_end|> the only likely token
        model.lm_head.weight.zero_()
        model.lm_head.weight[tokenizer.convert_tokens_to_ids("<|im_end|>")] = 1.0
    assert generate_answers(model, tokenizer, ["What is 2 + 3?"], max_new_tokens=20) == [""]


def _overfit(model, tokenizer, examples, steps=120):
    stream = BatchStream(examples, tokenizer, batch_size=len(examples), max_length=64, seed=0)
    for _ in finetune(model, stream, steps=steps, lr=1e-2, warmup_steps=5):
        pass


def test_evaluate_after_overfitting_four_examples(tiny):
    model, tokenizer = tiny
    before = evaluate(model, tokenizer, EXAMPLES, max_new_tokens=24).metrics
    _overfit(model, tokenizer, EXAMPLES)
    model.train()  # evaluate must restore whatever mode it was given
    after = evaluate(model, tokenizer, EXAMPLES, max_new_tokens=24).metrics
    assert model.training
    assert before.accuracy == 0.0 and after.accuracy == 1.0
    assert after.loss < 0.05 * before.loss
    assert after.examples == 4
    assert generate_answers(model, tokenizer, [EXAMPLES[0].question])[0] == EXAMPLES[0].answer

    # accuracy counts the answers that match: the same question with a wrong gold answer scores 4 of 5,
    # whatever the batch size; the loss is the token-weighted one of the whole set; to_dict is plain JSON
    wrong = Example(EXAMPLES[0].question, "2 + 3 = 6\n#### 6")
    mixed = [evaluate(model, tokenizer, [*EXAMPLES, wrong], batch_size=size, max_new_tokens=24).metrics
             for size in (1, 2)]
    expected = {"accuracy": 0.8, "loss": pytest.approx(dataset_loss(model, tokenizer, [*EXAMPLES, wrong]), rel=1e-4),
                "examples": 5, "loss_examples": None}
    for metrics in mixed:
        assert isinstance(metrics, Metrics) and metrics.to_dict() == expected
        assert json.loads(json.dumps(metrics.to_dict())) == metrics.to_dict()


def test_each_problems_loss_is_the_answer_token_loss_of_that_example_alone(tiny):
    model, tokenizer = tiny
    for size in (1, 3):
        evaluation = evaluate(model, tokenizer, EXAMPLES, batch_size=size, max_new_tokens=4)
        for example, outcome in zip(EXAMPLES, evaluation.outcomes):
            batch = collate([encode_example(tokenizer, example, max_length=128)], tokenizer.pad_token_id)
            with torch.no_grad():
                alone = answer_token_loss(model, batch).item()
            assert outcome.tokens == int((batch["labels"][:, 1:] != -100).sum())
            assert outcome.loss == pytest.approx(alone, rel=1e-4)


def test_answers_are_those_of_transformers_generate(tiny):
    """The cached teacher-forced pass and greedy loop answer exactly as model.generate does."""
    model, tokenizer = tiny
    _overfit(model, tokenizer, EXAMPLES, steps=40)  # half-trained: answers of mixed lengths
    ours = evaluate(model, tokenizer, EXAMPLES, batch_size=4, max_new_tokens=20).outcomes
    for example, outcome in zip(EXAMPLES, ours):
        ids = torch.tensor([encode_prompt(tokenizer, example.question)])
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=20,
                                 do_sample=False, eos_token_id=stop_token_ids(tokenizer),
                                 pad_token_id=tokenizer.pad_token_id)
        reference = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip()
        assert reference.startswith(outcome.prediction)
        if not answer_line_complete(reference):  # no answer line to stop at: the whole text
            assert outcome.prediction == reference


@pytest.mark.parametrize("training_steps", [0, 40, 150])
def test_gold_draft_gives_the_decode_loops_answers_in_fewer_steps(tiny, training_steps):
    """Untrained (no draft accepted), half-trained (parts) and overfit (whole answers): the same outcomes as
    decoding every token from the prompt, and never more one-token decode calls."""
    model, tokenizer = tiny
    if training_steps:
        _overfit(model, tokenizer, EXAMPLES, steps=training_steps)
    calls: list[int] = []
    hook = model.register_forward_pre_hook(lambda m, a, k: calls.append(k["input_ids"].shape[1]), with_kwargs=True)
    plain = evaluate(model, tokenizer, EXAMPLES, batch_size=3, max_new_tokens=24, gold_draft=False)
    plain_steps, calls[:] = calls.count(1), []
    drafted = evaluate(model, tokenizer, EXAMPLES, batch_size=3, max_new_tokens=24)
    hook.remove()
    assert drafted.outcomes == plain.outcomes
    assert calls.count(1) <= plain_steps
    if training_steps == 150:  # the model writes most gold answers: their tokens need no decode step
        assert drafted.metrics.accuracy >= 0.75 and calls.count(1) < plain_steps


def test_accepted_draft_stops_at_the_first_disagreement_and_the_answers_end():
    greedy = torch.tensor([[5, 6, 9, 1], [5, 6, 7, 2], [4, 6, 7, 3], [5, 0, 0, 0]])  # (B, A + 1)
    gold = torch.tensor([[5, 6, 7], [5, 6, 7], [5, 6, 7], [5, 0, 0]])  # (B, A), row 3 one token long
    mask = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 0, 0]])
    assert accepted_draft_lengths(greedy, gold, mask).tolist() == [2, 3, 0, 1]


def test_an_answer_stops_after_its_answer_line(tiny):
    model, tokenizer = tiny
    chatty = [Example(e.question, e.answer + "\nand then some more words") for e in EXAMPLES[:2]]
    _overfit(model, tokenizer, chatty, steps=150)
    questions = [e.question for e in chatty]
    full = generate_answers(model, tokenizer, questions, max_new_tokens=60, stop_at_answer_line=False)
    stopped = generate_answers(model, tokenizer, questions, max_new_tokens=60)
    for example, whole, short in zip(chatty, full, stopped):
        assert short == example.answer.split("\nand then")[0]  # learned up to the answer line, and stopped there
        assert whole.startswith(short + "\n") and len(whole) > len(short) + 5  # without the stop it goes on


def test_answer_line_complete():
    assert not answer_line_complete("3 + 4 = 7")
    assert not answer_line_complete("3 + 4 = 7\n#### 7")  # 7 could still become 71
    assert not answer_line_complete("#### 1,2")
    assert answer_line_complete("#### 7\n") and answer_line_complete("#### $1,200 dollars")
    assert answer_line_complete("#### -4.5 ") and not answer_line_complete("####\n")


def test_answered_and_loss_only_problems(tiny):
    model, tokenizer = tiny
    evaluation = evaluate(model, tokenizer, EXAMPLES, answered=2, max_new_tokens=4)
    assert [o.correct is not None for o in evaluation.outcomes] == [True, True, False, False]
    assert [o.prediction is None for o in evaluation.outcomes] == [False, False, True, True]
    metrics = evaluation.metrics
    assert metrics.examples == 2 and metrics.loss_examples == 4
    assert metrics.loss == pytest.approx(dataset_loss(model, tokenizer, EXAMPLES), rel=1e-6)
    columns = evaluation.columns()
    assert columns["correct"][2:] == [None, None] and len(columns["tokens"]) == 4
