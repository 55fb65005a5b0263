"""One short compression of the real embedded model (SmolLM2-135M-Instruct), end to end."""

import json

import pytest
import torch

from bsi.cli import main
from bsi.models import EMBEDDED_MODEL, load_model_and_tokenizer
from bsi.pipeline.export import load_compressed

pytestmark = pytest.mark.slow


def test_embedded_model_compresses_saves_and_reloads(tmp_path, capsys):
    out = tmp_path / "smol"
    args = ["compress", "--model", EMBEDDED_MODEL, "--skip-finetune", "--target-ratio", "0.7", "--rounds", "2",
            "--iters-per-epoch", "4", "--sampling-ratio", "0.5", "--recover-steps", "2", "--batch-size", "2",
            "--max-length", "96", "--calibration-batches", "4", "--eval-examples", "4", "--max-new-tokens", "8", "--quiet",
            "--out", str(out)]
    assert main(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert abs(summary["compressible_ratio"] - 0.7) <= 0.01
    assert summary["params_before"] == 134_515_008  # tied embedding counted once
    assert summary["params_after"] < summary["params_before"]
    # the fp32 rule on whitened bases (sigma_max about 2,800 here): far above the floor, below eps_max
    assert 1e-2 < summary["eps"] < 2.5e-2
    assert len(summary["ranks"]) == 210  # every linear layer but the tied lm_head
    assert "accuracy" in capsys.readouterr().out

    model, tokenizer = load_compressed(out)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    ids = tokenizer("Tom has 3 apples and buys 4 more.", return_tensors="pt")["input_ids"]
    again, _ = load_compressed(out)
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, again(input_ids=ids).logits)
    original, _ = load_model_and_tokenizer(EMBEDDED_MODEL)
    with torch.no_grad():
        assert not torch.allclose(model(input_ids=ids).logits, original(input_ids=ids).logits)
