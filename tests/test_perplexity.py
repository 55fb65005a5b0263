"""Perplexity: its windows, and its value against an independent token-by-token computation.

The reference computation runs the tiny random Llama once per scored token,
on exactly the context the stated protocol gives that token.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from bsi.data import TextBatchStream, check_window, cut_windows
from bsi.errors import BSIError
from bsi.models import build_tiny_model
from bsi.pipeline.losses import answer_token_loss
from bsi.pipeline.perplexity import (
    PerplexityResult,
    measure_perplexity,
    window_spans,
)


@pytest.fixture(scope="module")
def tiny():
    """The tiny random Llama (vocabulary 259, context 512) and its byte-level tokenizer."""
    return build_tiny_model()


def _stream(length: int, seed: int = 0, vocab: int = 259) -> torch.Tensor:
    return torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------ perplexity against an independent computation


def _reference_windows(model, tokens: torch.Tensor, window: int, stride: int) -> list[tuple[float, int]]:
    """Per-window (NLL sum, tokens) by the stated rules, one forward pass per scored token.

    Windows start every ``stride`` tokens and stop at the end of the stream;
    a window scores each of its tokens after its first that no earlier
    window scored, from the model's logits given the window's earlier tokens
    only.
    """
    scored: set[int] = set()
    windows, start, total = [], 0, tokens.shape[0]
    with torch.no_grad():
        while True:
            end = min(start + window, total)
            nll, count = 0.0, 0
            for t in range(start + 1, end):
                if t in scored:
                    continue
                scored.add(t)
                logits = model(input_ids=tokens[None, start:t]).logits[0, -1].double()  # (V,)
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


# ------------------------------------------------------------------ bad windows and strides


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


def test_the_result_states_its_protocol(tiny):
    model, _ = tiny
    result = measure_perplexity(model, _stream(100), window=16, source="something")
    assert isinstance(result, PerplexityResult)
    line = result.summary_line()
    assert "on something" in line and "window 16, stride 16 (non-overlapping" in line
    assert f"{result.tokens_scored:,} tokens scored in {result.windows} windows of a 100-token stream" in line
    plain = result.to_dict(per_window=False)
    assert "window_nll_sums" not in plain and json.loads(json.dumps(result.to_dict()))["windows"] == result.windows
