"""Real generation speed: tokens per second and per-token latency, side by side.

Low-rank factors cut multiply-adds, but a two-matmul layer can still be slower
than one dense matmul when the rank is high or the matrices are small, so the
only honest number is a measured one. :func:`measure_speeds` times greedy
generation of a fixed number of new tokens (end-of-sequence suppressed, batch
of one, KV cache on) for several models, *interleaving* the repetitions
(model A, model B, model A, ...) so that a change in machine load hits all of
them alike, and reports medians:

* ``tokens_per_s``: new tokens / wall time of the whole call (prefill included);
* ``ms_per_token``: decode latency, ``(t(n tokens) - t(1 token)) / (n - 1)``,
  i.e. the cost of one more token once the prompt is processed.

Compare numbers only within one call: absolute speeds depend on the machine.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from bsi.data import build_prompt, pad_id
from bsi.errors import BSIError

DEFAULT_PROMPT = "Tom has 12 apples and buys 7 more. How many apples does he have now?"


@dataclass(frozen=True)
class Speed:
    """Median generation speed of one model (batch of one, greedy)."""

    tokens_per_s: float  # new tokens per second, prefill included
    ms_per_token: float  # decode latency of one more token, milliseconds
    new_tokens: int
    repeats: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _timed_generate(model: nn.Module, input_ids: torch.Tensor, new_tokens: int, pad: int) -> float:
    """Seconds to generate exactly ``new_tokens`` greedy tokens after ``input_ids`` (1, P)."""
    if input_ids.device.type == "cuda":
        torch.cuda.synchronize(input_ids.device)
    start = time.perf_counter()
    model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=new_tokens,
                   min_new_tokens=new_tokens, do_sample=False, num_beams=1, pad_token_id=pad, use_cache=True)
    if input_ids.device.type == "cuda":
        torch.cuda.synchronize(input_ids.device)
    return time.perf_counter() - start


def measure_speeds(models: Mapping[str, nn.Module], tokenizer: Any, prompt: str = DEFAULT_PROMPT,
                   new_tokens: int = 32, repeats: int = 3) -> dict[str, Speed]:
    """Time greedy fixed-length generation of every model on the same prompt, interleaved.

    Args:
        models: name -> model (all must accept the tokenizer's ids).
        tokenizer: builds the prompt (chat template if any).
        new_tokens: tokens generated per timing (>= 2).
        repeats: timings per model (after one untimed warm-up each); medians are reported.
    """
    if new_tokens < 2:
        raise BSIError(f"speed measurement needs at least 2 new tokens, got {new_tokens}")
    if repeats < 1:
        raise BSIError(f"speed measurement needs at least 1 repetition, got {repeats}")
    ids = tokenizer(build_prompt(tokenizer, prompt), add_special_tokens=not tokenizer.chat_template,
                    return_tensors="pt")["input_ids"]  # (1, P)
    pad = pad_id(tokenizer)
    full: dict[str, list[float]] = {n: [] for n in models}
    one: dict[str, list[float]] = {n: [] for n in models}
    with torch.inference_mode():
        for model in models.values():  # warm-up: allocator, kernels, caches
            _timed_generate(model.eval(), ids.to(_device(model)), 2, pad)
        for _ in range(repeats):
            for name, model in models.items():
                x = ids.to(_device(model))
                full[name].append(_timed_generate(model, x, new_tokens, pad))
                one[name].append(_timed_generate(model, x, 1, pad))
    out = {}
    for name in models:
        t_full, t_one = statistics.median(full[name]), statistics.median(one[name])
        out[name] = Speed(tokens_per_s=new_tokens / t_full, ms_per_token=max(t_full - t_one, 0.0) / (new_tokens - 1) * 1e3,
                          new_tokens=new_tokens, repeats=repeats)
    return out


def _device(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")
