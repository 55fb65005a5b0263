"""One table of tiny causal-LM architectures, each run through the whole method.

convert (every linear layer becomes a `BasisLinear`) -> profile (gradient and
curvature statistics) -> prune (rounds of the engine) -> export (two factors
or dense per layer) -> reload, with bsi's loader and with plain transformers
(the folder's own code): the logits are identical at every reload.

The models are built from configs offline with random weights. GPT-2 is not
in the table: its projections are ``Conv1D`` modules, not ``nn.Linear``, so it
has nothing bsi compresses (tests/test_cli.py checks its clear error).
"""

from __future__ import annotations

import pytest
import torch
from conftest import lm_loss, token_batches
from torch import nn
from transformers import (
    AutoModelForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    MistralConfig,
    Phi3Config,
    Qwen2Config,
)

from bsi.config import CompressConfig, SizeRule
from bsi.method.engine import Compressor
from bsi.method.layers import BasisLinear, LowRankLinear
from bsi.method.surgery import compressible_linear_names, compressible_parameters
from bsi.pipeline.export import load_compressed, save_compressed
from bsi.reports import RoundReport, StepReport

VOCAB = 97
SIZES = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False)

ARCHITECTURES = {
    "llama": lambda: LlamaConfig(**SIZES),
    "qwen2": lambda: Qwen2Config(**SIZES),  # q/k/v projections with bias
    "mistral": lambda: MistralConfig(**SIZES, sliding_window=None),
    "phi3": lambda: Phi3Config(**SIZES, pad_token_id=0),  # fused qkv_proj and gate_up_proj
    "llama-tied": lambda: LlamaConfig(**{**SIZES, "tie_word_embeddings": True}),  # the tied head stays dense
    # Gemma 3 (gemma3-270m's family): head_dim apart from hidden/heads, q/k norms, sliding and full attention, tied head
    "gemma3-tied": lambda: Gemma3TextConfig(**{**SIZES, "tie_word_embeddings": True}, head_dim=16, sliding_window=8,
                                            layer_types=["sliding_attention", "full_attention"]),
}


def build(name: str) -> nn.Module:
    config = ARCHITECTURES[name]()
    config._attn_implementation = "eager"
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()


def logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_convert_profile_prune_export_reload(name, tmp_path):
    model = build(name)
    original_class = type(model)
    targets = compressible_linear_names(model)
    assert targets, f"{name} has no compressible linear layers"
    before, _ = compressible_parameters(model)

    config = CompressConfig(size=SizeRule.keep(0.5), rounds=2, iters_per_epoch=6, sampling_ratio=0.5,
                            aux_rank=2)
    compressor = Compressor(model, token_batches(vocab=VOCAB), config, lm_loss)
    reports = list(compressor.run())

    # convert: exactly the compressible layers became basis layers
    assert sorted(compressor.layers) == sorted(targets)
    assert all(isinstance(model.get_submodule(n), BasisLinear) for n in targets)
    # profile: statistics steps ran and every round saw every layer
    assert any(isinstance(r, StepReport) and r.stage == "profile" for r in reports)
    rounds = [r for r in reports if isinstance(r, RoundReport)]
    assert len(rounds) == 2 and all(sorted(layer.name for layer in r.layers) == sorted(targets) for r in rounds)
    # prune: bases were removed, the layers got smaller
    assert sum(layer.rank_after for layer in rounds[-1].layers) < sum(layer.rank_before for layer in rounds[0].layers)
    after, dense = compressible_parameters(model)
    assert dense == before and after < before

    # export and reload: identical logits with bsi's loader and with plain transformers
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    folder = save_compressed(model, None, tmp_path / name)
    exported = logits(model, ids)  # the model in memory is now the exported form
    assert any(isinstance(m, LowRankLinear) for m in model.modules())
    ours, _ = load_compressed(folder)
    ours.set_attn_implementation("eager")
    assert type(ours) is original_class
    assert torch.equal(logits(ours, ids), exported)
    theirs = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, attn_implementation="eager")
    assert type(theirs).__name__ == original_class.__name__
    assert torch.equal(logits(theirs, ids), exported)
    assert compressible_parameters(ours)[0] == after
