"""Shared fixtures: tiny models built from configs, and an isolated bsi cache."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM


@pytest.fixture(autouse=True)
def _few_threads():
    """Two cores on CI: keep each test on one thread so parallel work does not thrash."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def isolated_cache(tmp_path, monkeypatch):
    """A private BSI_CACHE (fine-tune cache, tiny-model artefacts) for one test."""
    monkeypatch.setenv("BSI_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@contextmanager
def smoke_app(tmp_path, monkeypatch):
    """The dashboard on the smoke preset, served in-process on 127.0.0.1 (closed afterwards)."""
    monkeypatch.setenv("BSI_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("GRADIO_ANALYTICS_ENABLED", "False")
    from bsi.app import build_app

    demo = build_app(preset="smoke")
    demo.queue().launch(server_name="127.0.0.1", prevent_thread_lock=True, quiet=True)
    try:
        yield demo
    finally:
        demo.close()


def make_tiny_llama(tied: bool = False, vocab: int = 97, seed: int = 0) -> LlamaForCausalLM:
    """A 2-layer Llama with random weights (hidden 32), optionally with tied embeddings."""
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        tie_word_embeddings=tied, attn_implementation="eager",
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return LlamaForCausalLM(config).eval()


class LMLoss:
    """Next-token cross-entropy over all positions (a stand-in task loss for engine tests).

    Like bsi's answer-token loss it can count its terms (for the fisher
    curvature) and draw its labels from the model (for mc-fisher).
    """

    @staticmethod
    def _logits(model, batch):
        ids = batch["input_ids"]
        return model(input_ids=ids).logits[:, :-1].float(), ids[:, 1:]  # (B, T-1, V), (B, T-1)

    def __call__(self, model, batch):
        logits, targets = self._logits(model, batch)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    @staticmethod
    def count(batch):
        ids = batch["input_ids"]
        return ids.shape[0] * (ids.shape[1] - 1)

    def sampled(self, model, batch, generator=None):
        logits, _ = self._logits(model, batch)
        flat = logits.reshape(-1, logits.shape[-1])
        drawn = torch.multinomial(torch.softmax(flat.detach(), -1), 1, generator=generator).squeeze(1)
        return torch.nn.functional.cross_entropy(flat, drawn)


lm_loss = LMLoss()


def token_batches(vocab: int = 97, batch: int = 4, length: int = 16, seed: int = 1):
    """An endless, seeded stream of random token batches."""
    generator = torch.Generator().manual_seed(seed)
    while True:
        yield {"input_ids": torch.randint(0, vocab, (batch, length), generator=generator)}
