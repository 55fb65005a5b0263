"""Perplexity: its windows, its value against an independent token-by-token computation, `bsi eval --perplexity`.

The reference computation runs the tiny random Llama once per scored token,
on exactly the context the stated protocol gives that token.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bsi.cli import main
from bsi.data import WIKITEXT_2, TextBatchStream, check_window, cut_windows, load_text_task
from bsi.errors import BSIError
from bsi.models import build_tiny_model, build_tiny_tokenizer
from bsi.pipeline.losses import answer_token_loss
from bsi.pipeline.perplexity import (
    PerplexityResult,
    measure_perplexity,
    text_task_perplexity,
    window_spans,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny():
    """The tiny random Llama (vocabulary 259, context 512) and its byte-level tokenizer."""
    return build_tiny_model()


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def wikitext(tokenizer):
    """The packaged WikiText-2 with the byte-level tokenizer (one token per byte), windows of 64."""
    return load_text_task(WIKITEXT_2, tokenizer, window=64)


def _stream(length: int, seed: int = 0, vocab: int = 259) -> torch.Tensor:
    return torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------ perplexity against an independent computation


def _reference_windows(model, tokens: torch.Tensor, window: int, stride: int,
                       context: int | None = None) -> list[tuple[float, int]]:
    """Per-window (NLL sum, tokens) by the stated rules, one forward pass per scored token.

    Windows start every ``stride`` tokens and stop at the end of the stream;
    a window scores each of its tokens after its first that no earlier
    window scored, from the model's logits given the window's earlier tokens
    only. With a ``context`` token, that token precedes each window of
    ``window - 1`` stream tokens and the window's first token is scored too.
    """
    scored: set[int] = set()
    windows, start, total = [], 0, tokens.shape[0]
    prefix = torch.tensor([] if context is None else [context], dtype=tokens.dtype)
    length, first = (window, 1) if context is None else (window - 1, 0)
    with torch.no_grad():
        while True:
            end = min(start + length, total)
            nll, count = 0.0, 0
            for t in range(start + first, end):
                if t in scored:
                    continue
                scored.add(t)
                seen = torch.cat([prefix, tokens[start:t]])
                logits = model(input_ids=seen[None]).logits[0, -1].double()  # (V,)
                nll -= float(torch.log_softmax(logits, dim=-1)[tokens[t]])
                count += 1
            if count:
                windows.append((nll, count))
            if end == total:
                return windows
            start += stride


@pytest.mark.parametrize("length,window,stride,batch_size", [
    (61, 16, 16, 3),   # non-overlapping; a short last window of 13 tokens, batched alone
    (49, 16, 16, 2),   # the last window would hold 1 token and score none: left out
    (61, 16, 5, 4),    # sliding: each later window scores its last 5 tokens
    (61, 16, 15, 2),   # stride window - 1: windows overlap by one token, every token but the first scored
    (16, 16, 16, 1),   # exactly one window
    (10, 16, 4, 2),    # a stream shorter than the window: one short window
], ids=["non-overlapping", "one-token-tail", "sliding", "overlap-one", "one-window", "short-stream"])
def test_perplexity_equals_exp_of_an_independent_token_by_token_mean_nll(tiny, length, window, stride, batch_size):
    model, _ = tiny
    tokens = _stream(length, seed=length + stride)
    result = measure_perplexity(model, tokens, window=window, stride=stride, batch_size=batch_size)
    reference = _reference_windows(model, tokens, window, stride)
    assert list(result.window_token_counts) == [count for _, count in reference]
    assert result.window_nll_sums == pytest.approx([nll for nll, _ in reference], rel=1e-5, abs=1e-4)
    total_nll, total_count = sum(n for n, _ in reference), sum(c for _, c in reference)
    assert result.tokens_scored == total_count and result.windows == len(reference)
    assert result.mean_nll == pytest.approx(total_nll / total_count, rel=1e-6)
    assert result.perplexity == pytest.approx(math.exp(total_nll / total_count), rel=1e-5)
    assert (result.window, result.stride, result.stream_tokens) == (window, stride, length)


def test_batching_and_max_windows_do_not_change_any_window(tiny):
    model, _ = tiny
    tokens = _stream(200, seed=3)
    one = measure_perplexity(model, tokens, window=32, stride=8, batch_size=1)
    many = measure_perplexity(model, tokens, window=32, stride=8, batch_size=7)
    assert one.window_token_counts == many.window_token_counts
    assert one.window_nll_sums == pytest.approx(many.window_nll_sums, rel=1e-5)
    first = measure_perplexity(model, tokens, window=32, stride=8, batch_size=7, max_windows=5)
    assert first.windows == 5 and first.windows_in_stream == one.windows
    assert first.window_token_counts == one.window_token_counts[:5]
    assert first.window_nll_sums == pytest.approx(one.window_nll_sums[:5], rel=1e-5)
    assert "the first 5 of" in first.protocol()


def test_the_model_comes_back_in_the_mode_it_came_in(tiny):
    model, _ = tiny
    model.train()
    try:
        trained_mode = measure_perplexity(model, _stream(40), window=16)
        assert model.training
    finally:
        model.eval()
    assert trained_mode.window_nll_sums == pytest.approx(measure_perplexity(model, _stream(40), window=16).window_nll_sums)


def test_non_overlapping_perplexity_is_the_exp_of_the_training_loss_on_the_same_windows(tiny):
    """The eval metric and the training loss agree: one protocol for both."""
    model, _ = tiny
    tokens = _stream(4 * 24, seed=5)
    result = measure_perplexity(model, tokens, window=24)
    batch = next(TextBatchStream(cut_windows(tokens, 24), batch_size=4, seed=0))  # the same 4 windows, shuffled
    with torch.no_grad():
        loss = answer_token_loss(model, batch)
    assert result.mean_nll == pytest.approx(float(loss), rel=1e-5)


# ------------------------------------------------------------------ the windows of the protocol


@pytest.mark.parametrize("length", [0, 1, 2, 15, 16, 17, 33, 100])
@pytest.mark.parametrize("window,stride", [(16, 16), (16, 15), (16, 8), (16, 1), (2, 2), (2, 1), (5, 3)])
def test_windows_cover_the_stream_as_documented(length, window, stride):
    spans = window_spans(length, window, stride)
    times = [0] * length
    for k, span in enumerate(spans):
        assert span.start == k * stride and span.end == min(span.start + window, length)
        assert span.start < span.first_scored < span.end  # its own first token is context; it scores at least one
        if k:  # after the first window, a scored token has window - stride tokens of context at least
            assert span.first_scored - span.start >= window - stride
        for t in range(span.first_scored, span.end):
            times[t] += 1
    if length:
        assert times[0] == 0  # the stream's first token is never scored
    if stride < window:
        assert times[1:] == [1] * (length - 1)  # every other token exactly once
    else:  # non-overlapping: each window's first token is context only
        assert times == [0 if t % window == 0 else 1 for t in range(length)]
        assert sum(times) == length - math.ceil(length / window)
    if length >= 2:  # the windows reach the end of the stream, but for a last token that would be context only
        assert spans[-1].end == length or (stride == window and spans[-1].end == length - 1)


# ------------------------------------------------------------------ a context token (Gemma's <bos>)


@pytest.mark.parametrize("length,window,stride", [(61, 16, 15), (61, 16, 6), (15, 16, 15)],
                         ids=["non-overlapping", "sliding", "one-window"])
def test_with_a_context_token_every_stream_token_is_scored_once_from_it(tiny, length, window, stride):
    model, _ = tiny
    tokens = _stream(length, seed=3 * length + stride)
    result = measure_perplexity(model, tokens, window=window, stride=stride, batch_size=2, context_token=258)
    reference = _reference_windows(model, tokens, window, stride, context=258)
    assert list(result.window_token_counts) == [count for _, count in reference]
    assert result.tokens_scored == length  # the stream's first token too: the context token precedes it
    assert result.window_nll_sums == pytest.approx([nll for nll, _ in reference], rel=1e-5, abs=1e-4)
    assert result.to_dict()["context_token"] == 258 and "token 258" in result.protocol()
    assert "context_token" not in measure_perplexity(model, tokens, window=window).to_dict()  # unchanged files


def test_the_context_token_is_the_bos_a_tokenizer_puts_before_every_text(tokenizer):
    """Gemma's tokenizer starts every text with <bos>; SmolLM2's and the tiny one add nothing."""
    from tokenizers.processors import TemplateProcessing

    from bsi.data import context_token

    assert context_token(tokenizer) is None
    with_bos = build_tiny_tokenizer()
    with_bos.add_special_tokens({"bos_token": "<bos>"})
    bos = with_bos.bos_token_id
    with_bos.backend_tokenizer.post_processor = TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", bos)])
    assert with_bos("ab")["input_ids"][0] == bos and context_token(with_bos) == bos
    task = load_text_task(WIKITEXT_2, with_bos, window=64)
    windows = task.train_windows  # (W, 64): the token, then 63 tokens of the stream
    assert task.context_token == bos and windows.shape[1] == 64 and bool((windows[:, 0] == bos).all())
    assert torch.equal(windows[:, 1:], cut_windows(task.train_tokens, 63))
    assert task.describe()["context_token"] == bos and "context_token" not in load_text_task(
        WIKITEXT_2, tokenizer, window=64).describe()


# ------------------------------------------------------------------ bsi eval --perplexity


def test_bsi_eval_perplexity_prints_the_figure_and_its_protocol_in_one_line(capsys, wikitext, tiny):
    assert main(["eval", "--perplexity", "--model", "tiny-random-llama", "--window", "64", "--stride", "32",
                 "--max-windows", "3"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    line = lines[0]
    for phrase in ("perplexity ", "wikitext-2: test.txt", "tokenized release", "not raw", "window 64, stride 32",
                   "tokens scored", "the first 3 of"):
        assert phrase in line, phrase
    expected = text_task_perplexity(tiny[0], wikitext, stride=32, max_windows=3)
    assert f"perplexity {expected.perplexity:.3f}" in line and f"{expected.tokens_scored:,} tokens scored" in line


def test_bsi_eval_perplexity_json_holds_the_protocol_and_the_per_window_outcomes(capsys, tmp_path):
    path = tmp_path / "mine.txt"
    path.write_text("Some text of my own, long enough for a few windows. " * 20, encoding="utf-8")
    assert main(["eval", "--perplexity", "--model", "tiny-random-llama", "--data", str(path), "--window", "100",
                 "--held-out-fraction", "1", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    tokens = path.stat().st_size  # one token per byte
    assert result["data"] == str(path) and result["task"]["held_out_part"] == "all of it"
    assert (result["window"], result["stride"], result["stream_tokens"]) == (100, 100, tokens)
    assert result["windows"] == math.ceil(tokens / 100) and result["tokens_scored"] == tokens - math.ceil(tokens / 100)
    assert len(result["window_nll_sums"]) == len(result["window_token_counts"]) == result["windows"]
    assert sum(result["window_token_counts"]) == result["tokens_scored"]
    assert result["perplexity"] == pytest.approx(math.exp(sum(result["window_nll_sums"]) / result["tokens_scored"]))
    assert result["params_total"] > 0


def test_bsi_eval_without_perplexity_on_text_says_to_add_it(capsys):
    assert main(["eval", "--model", "tiny-random-llama", "--data", WIKITEXT_2]) == 2
    assert "add --perplexity" in capsys.readouterr().err


# ------------------------------------------------------------------ bad input: one line each, before any work

NO_MODEL = "./no-such-model"  # a data error must come first: the model is loaded only after the text is read


def _bad(kind: str, tmp_path: Path) -> tuple[list[str], str]:
    """The arguments of `bsi eval --perplexity` that give the bad input ``kind``, and a phrase its error holds."""
    def write(name: str, data: bytes) -> str:
        (tmp_path / name).write_bytes(data)
        return str(tmp_path / name)

    model = ["--model", NO_MODEL]
    tiny = ["--model", "tiny-random-llama"]
    text = write("ok.txt", b"plenty of text " * 100)
    return {
        "empty-file": ([*model, "--data", write("e.txt", b"")], "is empty"),
        "white-space-file": ([*model, "--data", write("w.txt", b" \n\n \t")], "only white space"),
        "shorter-than-a-window": ([*tiny, "--data", write("s.txt", b"too short"), "--window", "64"],
                                  "fewer than one window of 64"),
        "held-out-shorter-than-a-window": ([*tiny, "--data", text, "--window", "512", "--held-out-fraction", "0.1"],
                                           "held-out part"),
        "binary-file": ([*model, "--data", write("b.txt", bytes(range(256)) * 4)], "binary"),
        "not-utf8": ([*model, "--data", write("l.txt", "caf\xe9 au lait".encode("latin-1"))], "not UTF-8"),
        "jsonl-without-text-field": ([*model, "--data", write("q.jsonl", b'{"question": "x", "answer": "y"}\n')],
                                     "missing field 'text'"),
        "window-longer-than-context": ([*tiny, "--data", text, "--window", "1024"], "max_position_embeddings 512"),
        "folder-without-txt": ([*model, "--data", str(tmp_path / "nothing-here")], "holds no .txt files"),
        "missing-file": ([*model, "--data", str(tmp_path / "gone.txt")], "does not exist"),
        "stride-larger-than-window": ([*model, "--window", "64", "--stride", "65"], "larger than the window"),
        "stride-zero": ([*model, "--window", "64", "--stride", "0"], "at least 1"),
        "window-one": ([*model, "--window", "1"], "at least 2 tokens"),
        "max-windows-zero": ([*model, "--max-windows", "0"], "--max-windows"),
        "held-out-fraction-zero": ([*model, "--held-out-fraction", "0"], "--held-out-fraction"),
        "batch-size-zero": ([*model, "--batch-size", "0"], "--batch-size"),
    }[kind]


BAD_KINDS = ["empty-file", "white-space-file", "shorter-than-a-window", "held-out-shorter-than-a-window",
             "binary-file", "not-utf8", "jsonl-without-text-field", "window-longer-than-context",
             "folder-without-txt", "missing-file", "stride-larger-than-window", "stride-zero", "window-one",
             "max-windows-zero", "held-out-fraction-zero", "batch-size-zero"]


@pytest.mark.parametrize("kind", BAD_KINDS)
def test_bad_text_input_is_one_line_before_any_work(kind, tmp_path, capsys):
    (tmp_path / "nothing-here").mkdir()
    (tmp_path / "nothing-here" / "readme.md").write_text("no .txt here")
    args, phrase = _bad(kind, tmp_path)
    assert main(["eval", "--perplexity", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert phrase in err, err
    assert "no-such-model" not in err  # the data or the flags were refused first


def test_bad_windows_and_strides_are_refused_by_the_api_too(tiny):
    model, _ = tiny
    with pytest.raises(BSIError, match="max_position_embeddings 512"):
        measure_perplexity(model, _stream(600), window=513)
    with pytest.raises(BSIError, match="larger than the window"):
        window_spans(100, 16, 17)
    with pytest.raises(BSIError, match="at least 1"):
        measure_perplexity(model, _stream(100), window=16, stride=0)
    with pytest.raises(BSIError, match="at least 2"):
        measure_perplexity(model, _stream(1), window=16)
    with pytest.raises(BSIError, match="at least 2 tokens"):
        check_window(1)


def test_a_hub_dataset_in_offline_mode_is_one_line(tmp_path):
    """Offline mode (HF_HUB_OFFLINE=1): datasets reads only its cache, which lacks it."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "BSI_CACHE": str(tmp_path / "cache"),
           "HF_HOME": str(tmp_path / "hf"), "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "bsi", "eval", "--perplexity", "--model", NO_MODEL,
                           "--data", "nobody/no-such-text"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    err = done.stderr.strip()
    assert len(err.splitlines()) == 1 and "not loadable from the Hugging Face hub" in err, err


def test_the_result_states_its_protocol(tiny):
    model, _ = tiny
    result = measure_perplexity(model, _stream(100), window=16, source="something")
    assert isinstance(result, PerplexityResult)
    line = result.summary_line()
    assert "on something" in line and "window 16, stride 16 (non-overlapping" in line
    assert f"{result.tokens_scored:,} tokens scored in {result.windows} windows of a 100-token stream" in line
    plain = result.to_dict(per_window=False)
    assert "window_nll_sums" not in plain and json.loads(json.dumps(result.to_dict()))["windows"] == result.windows
