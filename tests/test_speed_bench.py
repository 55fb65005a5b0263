"""bench/stage_profile.py and bench/speed.py: every stage profiled, and the length-sorted batches hold the same examples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import load_script

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load(name: str):
    return load_script(BENCH / f"{name}.py", f"bench_{name}")


def test_length_sorted_batches_hold_the_same_examples_with_less_padding():
    speed = load("speed")
    from bsi.data import collate

    rows = [{"input_ids": list(range(1, n + 1)), "labels": [-100] * (n // 2) + list(range(n // 2 + 1, n + 1))}
            for n in (9, 3, 7, 2, 8, 4, 6, 5)]
    batches = [collate(rows[i:i + 2], 0) for i in range(0, len(rows), 2)]
    grouped = speed.length_sorted(batches, 0)

    def examples(bs):
        out = []
        for b in bs:
            for ids, labels, mask in zip(b["input_ids"], b["labels"], b["attention_mask"]):
                n = int(mask.sum())
                out.append((tuple(ids[:n].tolist()), tuple(labels[:n].tolist())))
        return sorted(out)

    assert examples(grouped) == examples(batches)
    assert [b["input_ids"].shape[0] for b in grouped] == [2, 2, 2, 2]
    assert speed.padding_share(grouped) < speed.padding_share(batches)
    assert speed.padding_share(grouped) == pytest.approx(4 / 44)  # one padded position per pair of lengths


def test_stage_profile_covers_every_stage(tmp_path, capsys):
    profile = load("stage_profile")
    out = tmp_path / "profile.json"
    torch.manual_seed(0)
    profile.main(["--model", "tiny-random-llama", "--preset", "smoke", "--steps", "1", "--eval-problems", "2",
                  "--json", str(out)])
    result = json.loads(out.read_text())
    stages = {row["stage"]: row for row in result["stages"]}
    assert list(stages) == ["finetune", "evaluate", "calibrate", "convert", "compress-train", "compress-profile",
                            "close-round", "export", "recover"]
    for name, row in stages.items():
        assert row["seconds"] > 0, name
        if name != "export":  # the export is timed, not profiled
            assert 0 < row["ops_share"] <= 1.05 and 0 <= row["matmul_share"] <= row["ops_share"], name
            assert row["top"], name
    for name in ("finetune", "calibrate", "compress-train", "compress-profile", "recover"):
        assert stages[name]["padding_share"] is not None and stages[name]["padding_share"] >= 0, name
    assert stages["evaluate"]["parts"]["scoring pass"]["calls"] == 1  # two problems: one batch
    table = capsys.readouterr().out
    assert all(f"\n{name} " in table for name in stages)



def test_gold_draft_evaluation_gives_the_decode_loops_answers():
    """Drafts accepted whole (the model's own greedy tokens), in part (their first half) or not at all (the
    task's answer): the same answers and losses as today's scoring pass and decode loop, in fewer decode steps."""
    from bsi.data import encode_answer, encode_prompt, load_task, pad_id
    from bsi.models import load_model_and_tokenizer
    from bsi.pipeline.evaluate import _length_order, _score_batch, eval_mode, greedy_decode

    speed = load("speed")
    model, tokenizer = load_model_and_tokenizer("tiny-random-llama")
    examples = load_task("embedded-math", test_size=100, seed=0).test[:12]
    prompts = [encode_prompt(tokenizer, e.question) for e in examples]
    with torch.inference_mode():
        own = [model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                              max_new_tokens=24, do_sample=False)[0, len(p):].tolist() for p in prompts]
    golds = [encode_answer(tokenizer, e.answer) if i % 3 == 0 else own[i][: len(own[i]) // (i % 3)]
             for i, e in enumerate(examples)]

    def today(prompts, golds):  # bsi.pipeline.evaluate.evaluate's loop, on token ids
        out = [None] * len(prompts)
        order = _length_order([len(p) + len(g) for p, g in zip(prompts, golds)])
        with eval_mode(model), torch.inference_mode():
            for start in range(0, len(order), 8):
                chunk = order[start:start + 8]
                sums, counts, first, cache, mask = _score_batch(model, [prompts[i] for i in chunk],
                                                                [golds[i] for i in chunk], pad_id(tokenizer), True)
                texts = greedy_decode(model, tokenizer, first, cache, mask, max_new_tokens=24)
                for i, loss_sum, count, text in zip(chunk, sums.tolist(), counts.tolist(), texts):
                    out[i] = (loss_sum, int(count), text)
        return out

    calls = []
    hook = model.register_forward_pre_hook(lambda m, a, k: calls.append(k["input_ids"].shape[1]), with_kwargs=True)
    reference = today(prompts, golds)
    steps_today, calls[:] = calls.count(1), []
    assert speed.drafted_answers(model, tokenizer, prompts, golds, batch_size=8, max_new_tokens=24) == reference
    assert calls.count(1) <= steps_today

    calls[:] = []
    whole = speed.drafted_answers(model, tokenizer, prompts, own, batch_size=8, max_new_tokens=24)
    hook.remove()
    assert whole == today(prompts, own)
    assert calls.count(1) < 6  # every draft accepted: hardly a decode step (today: up to 23 per batch)
