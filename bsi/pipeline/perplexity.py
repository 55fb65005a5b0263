"""Perplexity of a causal language model on a token stream, with its protocol stated.

::

    perplexity = exp(mean NLL)
    mean NLL   = sum over scored tokens t of -log p(x_t | the tokens before t in its window)
                 / number of scored tokens                                   (natural log, nats)

The protocol, exactly as :func:`window_spans` and :func:`measure_perplexity`
implement it:

* **One stream.** The text is one token stream of ``M`` tokens; for a text
  task, its held-out part, documents joined by the task's separator with no
  BOS added (:func:`bsi.data.text.tokenize_corpus`). Document boundaries are
  not special: a window may hold the end of one document, the separator and
  the start of the next, as the stream does.
* **Windows.** Window ``k`` covers tokens ``[k * stride, min(k * stride +
  window, M))``. The model sees each window on its own, from its first
  token: nothing before a window's start is context, and no state carries
  over from one window to the next.
* **Which tokens are scored.** Window ``k`` scores the tokens
  ``[max(start_k + 1, end_{k-1}), end_k)``: the tokens no earlier window
  scored, except its own first token, which has no context inside the
  window. Hence:

  - the first token of the stream is never scored;
  - ``stride == window`` (the default): non-overlapping windows, the
    field's usual protocol. Each window's first token is context only, so a
    full window scores ``window - 1`` tokens and the stream ``M - ceil(M /
    window)`` tokens;
  - ``stride < window``: sliding windows. The first window scores all its
    tokens but the first; every later window scores only its last ``stride``
    tokens, each with at least ``window - stride`` tokens of context before
    it. Every token but the stream's first is scored exactly once.
* **The end.** The last window stops at the end of the stream and may be
  shorter; it is scored as it is, in a batch of its own, so nothing is ever
  padded. A window that would score no token is left out.
* ``max_windows`` keeps only the first ``N`` windows (the start of the
  stream); the result says how many windows the whole stream has.
* **A context token.** For a model trained always to start from a
  beginning-of-sequence token (Gemma's ``<bos>``;
  :func:`bsi.data.text.context_token`), each window is that token followed
  by ``window - 1`` tokens of the stream, and the window's first stream
  token is scored too, with the token as its context. Window ``k`` then
  covers stream tokens ``[k * stride, min(k * stride + window - 1, M))``,
  the default stride is ``window - 1``, and non-overlapping windows score
  every token of the stream. A model without one (SmolLM2) is scored as
  above.

The result, :class:`PerplexityResult`, keeps each window's NLL sum and token
count, the per-window outcomes a paired bootstrap resamples. Logits are
computed only at scored positions where the model supports it (see
:func:`bsi.pipeline.losses.answer_logits`), in float32; the cross-entropy is
summed in float64. No gradient, no generation.

>>> result = text_task_perplexity(model, task, window=512)  # doctest: +SKIP
>>> print(result.summary_line())
perplexity 21.07 (mean NLL 3.0481 nats) on wikitext-2: test.txt (WikiText-2, tokenized release ...): window 512, ...
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bsi.data import IGNORE_INDEX
from bsi.data.text import TextTask, check_window
from bsi.errors import BSIError
from bsi.pipeline.losses import answer_logits

DEFAULT_BATCH_SIZE = 4
"""Windows per forward pass when none is given."""

_CONTEXT_FIELDS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
_CROSS_ENTROPY_ROWS = 2048  # scored positions per cross-entropy call: bounds the memory beside the logits


@dataclass(frozen=True)
class WindowSpan:
    """One window of the protocol: tokens ``[start, end)`` of the stream are its input, ``[first_scored, end)`` are scored."""

    start: int
    end: int
    first_scored: int

    @property
    def scored(self) -> int:
        """How many tokens this window scores."""
        return self.end - self.first_scored


def check_stride(stride: int, window: int) -> None:
    """Refuse a stride below 1 or above the window (which would leave tokens unscored and unseen).

    Raises:
        BSIError: saying which ``--stride`` to use.
    """
    if isinstance(stride, bool) or not isinstance(stride, int) or stride < 1:
        raise BSIError(f"the stride must be at least 1 token, got {stride}: use a --stride between 1 and the window ({window})")
    if stride > window:
        raise BSIError(f"a stride of {stride} is larger than the window ({window}) and would skip tokens: "
                       f"use --stride {window} or less")


def window_spans(total_tokens: int, window: int, stride: int | None = None, *,
                 context: bool = False) -> list[WindowSpan]:
    """The windows of a stream of ``total_tokens`` tokens, exactly as the module docstring states.

    Args:
        total_tokens: ``M``, the stream's length.
        window: tokens per window, at least 2.
        stride: tokens between two windows' starts, in ``[1, window]``
            (``[1, window - 1]`` with ``context``); ``None``: non-overlapping windows.
        context: each window starts with a context token from outside the
            stream, so it holds ``window - 1`` stream tokens, the first of
            them scored too.

    Returns:
        The windows in stream order (spans of the stream), each scoring at
        least one token; empty when nothing can be scored.
    """
    check_window(window)
    length = window - 1 if context else window  # stream tokens per window
    stride = length if stride is None else stride
    check_stride(stride, length)
    spans, start, previous_end = [], 0, 0
    while previous_end < total_tokens:
        end = min(start + length, total_tokens)
        # without a context token a window's own first token has no context; earlier windows scored the rest
        first = max(start if context else start + 1, previous_end)
        if first < end:
            spans.append(WindowSpan(start, end, first))
        previous_end, start = end, start + stride
    return spans


@dataclass(frozen=True)
class PerplexityResult:
    """A perplexity and the protocol that produced it.

    Attributes:
        perplexity: ``exp(mean_nll)``.
        mean_nll: mean negative log-likelihood per scored token, in nats.
        tokens_scored: tokens whose NLL counts.
        windows: windows scored.
        window: tokens per window.
        stride: tokens between window starts (``== window``: non-overlapping).
        stream_tokens: tokens in the whole stream.
        windows_in_stream: windows the whole stream has (more than
            ``windows`` when ``max_windows`` cut it short).
        window_nll_sums: each scored window's summed NLL (nats), in stream order.
        window_token_counts: each scored window's number of scored tokens.
        source: what was scored, in words (for a text task
            :attr:`bsi.data.text.TextTask.held_out_source`, which names the
            release); empty when not given.
    """

    perplexity: float
    mean_nll: float
    tokens_scored: int
    windows: int
    window: int
    stride: int
    stream_tokens: int
    windows_in_stream: int
    window_nll_sums: tuple[float, ...]
    window_token_counts: tuple[int, ...]
    source: str = ""
    context_token: int | None = None

    @property
    def non_overlapping(self) -> bool:
        """Whether the windows did not overlap (the stride is every stream token of a window)."""
        return self.stride == self.window - (self.context_token is not None)

    def protocol(self) -> str:
        """The protocol in one phrase: window, stride, tokens scored, windows."""
        if self.context_token is not None:
            kind = (f"each window token {self.context_token} (the model's BOS) then {self.window - 1} stream tokens, "
                    + ("non-overlapping, every token scored" if self.non_overlapping else
                       f"sliding, each window after the first scores its last {self.stride} tokens"))
        else:
            kind = ("non-overlapping, each window's first token context only" if self.non_overlapping
                    else f"sliding, each window after the first scores its last {self.stride} tokens")
        which = (f"the first {self.windows:,} of {self.windows_in_stream:,} windows" if self.windows < self.windows_in_stream
                 else f"{self.windows:,} windows")
        return (f"window {self.window}, stride {self.stride} ({kind}), {self.tokens_scored:,} tokens scored "
                f"in {which} of a {self.stream_tokens:,}-token stream")

    def summary_line(self) -> str:
        """The figure with its protocol, in one line: what a report prints."""
        where = f" on {self.source}" if self.source else ""
        return f"perplexity {self.perplexity:.3f} (mean NLL {self.mean_nll:.4f} nats){where}: {self.protocol()}"

    def to_dict(self, per_window: bool = True) -> dict:
        """The result as plain values (JSON-serialisable); ``per_window=False`` leaves out the two per-window lists."""
        data = asdict(self)
        data["window_nll_sums"], data["window_token_counts"] = list(self.window_nll_sums), list(self.window_token_counts)
        if self.context_token is None:  # the key appears only where a context token was used
            del data["context_token"]
        if not per_window:
            del data["window_nll_sums"], data["window_token_counts"]
        return data


LOSS_MEANING = "mean next-token NLL in nats (natural log) over the scored tokens; perplexity = exp(loss)"
"""What a text task's loss and perplexity are, in one line (summary.json, results.md)."""


def protocol_record(result: PerplexityResult, task: TextTask | None = None) -> dict:
    """A perplexity's full protocol as plain values (what ``summary.json`` and a sweep record beside the figure).

    Everything that decides the number: what was scored (the source, with
    its release), the window and stride, how a window's first token and the
    document boundaries are handled, that nothing is padded, and how many
    tokens and windows were scored out of how many. ``task`` adds the text
    task's own protocol (its parts, separator, token counts).
    """
    if result.context_token is not None:
        first = (f"each window starts with token {result.context_token}, the model's beginning-of-sequence token, "
                 f"as context, then {result.window - 1} stream tokens; every stream token is scored "
                 + ("once" if result.non_overlapping else
                    f"once (each window after the first scores its last {result.stride} tokens)"))
    elif result.non_overlapping:
        first = ("each window's first token is context only, never scored (so a full window scores window - 1 "
                 "tokens and the stream's first token is never scored)")
    else:
        first = (f"the first window scores every token but its first; each later window scores only its last "
                 f"{result.stride} tokens, the {result.window - result.stride} before them are context")
    record = {
        "source": result.source, "window": result.window, "stride": result.stride,
        "windows": result.windows, "windows_in_stream": result.windows_in_stream,
        "tokens_scored": result.tokens_scored, "stream_tokens": result.stream_tokens,
        "first_token": first,
        "padding": "none: each window is scored on its own, the last one may be shorter",
        "loss": LOSS_MEANING,
        "description": result.protocol(),
    }
    if task is not None:
        record |= {
            "data": task.name, "release": task.release, "held_out_part": task.held_out_part,
            "train_part": task.train_part,
            "document_boundaries": f"between two documents: {task.separator}; "
                                   + ("no BOS token" if task.context_token is None else
                                      "the BOS token only at each window's start") + "; a window may span a "
                                   "document boundary",
        }
    return record


def model_context(model: nn.Module) -> int | None:
    """The longest input the model was built for (``max_position_embeddings`` or its kin), or None if it says none."""
    config = getattr(model, "config", None)
    for field in _CONTEXT_FIELDS:
        value = getattr(config, field, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def window_nll(model: nn.Module, windows: torch.Tensor, first_scored: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed NLL and count of the scored tokens of each window (no gradient; the caller sets eval mode).

    Args:
        windows: ``(B, T)`` token ids, one window per row, no padding.
        first_scored: ``(B,)`` offset in its row of each window's first
            scored token (>= 1: position 0 has no context).

    Returns:
        ``(B,)`` float64 NLL sums (nats) and ``(B,)`` int64 counts of scored tokens.
    """
    positions = torch.arange(windows.shape[1], device=windows.device)  # (T,)
    scored = positions[None, :] >= first_scored.to(windows.device)[:, None]  # (B, T): token t of the row is scored
    labels = torch.where(scored, windows, torch.full_like(windows, IGNORE_INDEX))  # (B, T)
    logits, targets = answer_logits(model, {"input_ids": windows, "labels": labels})  # (N, V) float32, (N,)
    rows = scored[:, 1:].nonzero()[:, 0].to(logits.device)  # (N,) row of each scored token, in the same order
    nll = torch.cat([F.cross_entropy(logits[i : i + _CROSS_ENTROPY_ROWS], targets[i : i + _CROSS_ENTROPY_ROWS],
                                     reduction="none") for i in range(0, targets.numel(), _CROSS_ENTROPY_ROWS)])  # (N,)
    sums = torch.zeros(windows.shape[0], dtype=torch.float64, device=logits.device).index_add_(0, rows, nll.double())
    return sums.cpu(), scored[:, 1:].sum(dim=1).cpu()


def _batches(spans: list[WindowSpan], batch_size: int) -> Iterator[list[int]]:
    """Indices of spans in batches of up to ``batch_size`` windows of equal length (so nothing is padded)."""
    batch: list[int] = []
    for index, span in enumerate(spans):
        if batch and (len(batch) == batch_size or span.end - span.start != spans[batch[0]].end - spans[batch[0]].start):
            yield batch
            batch = []
        batch.append(index)
    if batch:
        yield batch


def measure_perplexity(
    model: nn.Module,
    tokens: torch.Tensor,
    *,
    window: int,
    stride: int | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    max_windows: int | None = None,
    source: str = "",
    progress: Callable[[int, int], None] | None = None,
    context_token: int | None = None,
) -> PerplexityResult:
    """Perplexity of ``model`` on a token stream, by the protocol of the module docstring.

    Args:
        tokens: ``(M,)`` token ids, the stream (at least 2 tokens).
        window: tokens per window, at least 2 and at most the model's context.
        stride: tokens between window starts, in ``[1, window]``; ``None``:
            ``window`` (non-overlapping windows).
        batch_size: windows per forward pass (memory grows with
            ``batch_size * window * vocabulary``).
        max_windows: score only the first this many windows; ``None``: all.
        source: what the stream is, in words (kept in the result and printed
            by :meth:`PerplexityResult.summary_line`).
        progress: called as ``progress(windows_done, windows_total)`` after
            each forward pass.
        context_token: the token each window starts from as context
            (:func:`bsi.data.text.context_token`); ``None``: windows of the stream alone.

    The model runs in eval mode under ``torch.inference_mode`` and is left in
    the mode it came in.

    Raises:
        BSIError: before any forward pass, for a bad window (or longer than
            :func:`model_context`), stride, batch size or ``max_windows``, or
            a stream shorter than 2 tokens.
    """
    context = context_token is not None
    stride = window - context if stride is None else stride
    check_window(window, model_context(model))
    check_stride(stride, window - context)
    if batch_size < 1:
        raise BSIError(f"the batch size must be at least 1 window, got {batch_size}")
    if max_windows is not None and max_windows < 1:
        raise BSIError(f"max_windows must be at least 1 (or None for all), got {max_windows}: raise --max-windows")
    if tokens.dim() != 1:
        raise BSIError(f"the token stream must be one-dimensional, got shape {tuple(tokens.shape)}")
    if tokens.shape[0] < 2 - context:
        raise BSIError(f"the text holds {tokens.shape[0]} token(s): perplexity needs at least {2 - context}")
    tokens = tokens.long()
    all_spans = window_spans(tokens.shape[0], window, stride, context=context)
    spans = all_spans if max_windows is None else all_spans[:max_windows]
    sums, counts = [0.0] * len(spans), [0] * len(spans)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            done = 0
            for batch in _batches(spans, batch_size):
                windows = torch.stack([tokens[spans[i].start : spans[i].end] for i in batch])  # (B, T)
                first = torch.tensor([spans[i].first_scored - spans[i].start for i in batch])  # (B,)
                if context:  # the context token before each window: (B, T + 1), offsets one further
                    windows = torch.cat([torch.full_like(windows[:, :1], context_token), windows], dim=1)
                    first = first + 1
                batch_sums, batch_counts = window_nll(model, windows, first)
                for row, index in enumerate(batch):
                    sums[index], counts[index] = float(batch_sums[row]), int(batch_counts[row])
                done += len(batch)
                if progress is not None:
                    progress(done, len(spans))
    finally:
        model.train(was_training)
    scored = sum(counts)
    mean = math.fsum(sums) / scored
    return PerplexityResult(
        perplexity=math.exp(mean), mean_nll=mean, tokens_scored=scored, windows=len(spans), window=window,
        stride=stride, stream_tokens=int(tokens.shape[0]), windows_in_stream=len(all_spans),
        window_nll_sums=tuple(sums), window_token_counts=tuple(counts), source=source, context_token=context_token,
    )


def text_task_perplexity(
    model: nn.Module,
    task: TextTask,
    *,
    window: int | None = None,
    stride: int | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    max_windows: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> PerplexityResult:
    """Perplexity on a text task's held-out part (:func:`measure_perplexity` on ``task.held_out_tokens``).

    ``window`` defaults to the task's training window; the result's
    ``source`` names the task, its held-out part and its release
    (:attr:`~bsi.data.text.TextTask.held_out_source`); the task's
    :attr:`~bsi.data.text.TextTask.context_token` starts every window.
    """
    return measure_perplexity(model, task.held_out_tokens, window=task.window if window is None else window,
                              stride=stride, batch_size=batch_size, max_windows=max_windows,
                              source=task.held_out_source, progress=progress, context_token=task.context_token)
