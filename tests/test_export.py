"""The compressed folder: bsi's loader, plain transformers' loader, the dense export, and their errors."""

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import lm_loss, make_tiny_llama, token_batches
from safetensors.torch import load_file, save_file
from torch import nn

from bsi.cli import main
from bsi.config import CompressConfig, SizeRule
from bsi.errors import BSIError
from bsi.method.engine import Compressor
from bsi.method.layers import LowRankLinear
from bsi.method.surgery import compressible_parameters, model_parameters
from bsi.pipeline.export import export_dense, load_compressed, save_compressed


def compressed_tiny(tied: bool, keep: float = 0.3):
    model = make_tiny_llama(tied=tied)
    config = CompressConfig(size=SizeRule.keep(keep), rounds=2, iters_per_epoch=6, sampling_ratio=0.5, aux_rank=2)
    for _ in Compressor(model, token_batches(), config, lm_loss).run():
        pass
    return model


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.mark.parametrize("tied", [False, True])
def test_save_load_gives_identical_logits(tmp_path, tied):
    model = compressed_tiny(tied)
    ids = torch.randint(0, 97, (2, 10))
    before = logits(model, ids)
    params = model_parameters(model)
    save_compressed(model, None, tmp_path / "out", {"method": "bsi"})
    loaded, _ = load_compressed(tmp_path / "out")
    loaded.set_attn_implementation("eager")  # the same kernel as the original: then bit-identical
    torch.testing.assert_close(logits(loaded, ids), before, atol=1e-5, rtol=1e-5)
    assert torch.equal(logits(loaded, ids), logits(model, ids))
    assert model_parameters(loaded) == params
    assert any(isinstance(m, LowRankLinear) for m in loaded.modules())
    if tied:
        assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    out = loaded.generate(ids[:1, :4], max_new_tokens=3, min_new_tokens=3, do_sample=False)
    assert out.shape == (1, 7)


@pytest.mark.parametrize("tied", [False, True])
def test_plain_transformers_loads_the_same_model_or_refuses(tmp_path, tied):
    """trust_remote_code=True: the folder's own code, the same logits; without it: an error, never random weights."""
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    folder = save_compressed(compressed_tiny(tied), None, tmp_path / f"plain-{tied}")
    ids = torch.randint(0, 97, (2, 10))
    ours, _ = load_compressed(folder)
    theirs = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, attn_implementation="eager")
    ours.set_attn_implementation("eager")
    assert torch.equal(logits(theirs, ids), logits(ours, ids))
    assert model_parameters(theirs) == model_parameters(ours)
    assert sum(type(m).__name__ == "LowRankLinear" for m in theirs.modules()) == \
        sum(isinstance(m, LowRankLinear) for m in ours.modules()) > 0
    assert theirs.generate(ids[:1, :4], max_new_tokens=3, min_new_tokens=3, do_sample=False).shape == (1, 7)

    for kwargs in ({}, {"trust_remote_code": False}):
        with pytest.raises(ValueError, match="trust_remote_code=True"):
            AutoModelForCausalLM.from_pretrained(folder, **kwargs)
    with pytest.raises(Exception, match="trust_remote_code=True.*bsi.load_compressed"):  # the concrete class too
        LlamaForCausalLM.from_pretrained(folder)


def test_shipped_code_needs_no_bsi(tmp_path):
    """The folder's modeling_bsi.py runs in a process where `import bsi` fails."""
    folder = save_compressed(compressed_tiny(False), None, tmp_path / "shipped")
    ids = torch.randint(0, 97, (1, 8))
    ours, _ = load_compressed(folder)
    save_file({"ids": ids, "logits": logits(ours, ids)}, str(tmp_path / "expected.safetensors"))
    script = f"""
import sys
sys.modules["bsi"] = None  # any import of bsi now raises ImportError
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
expected = load_file({str(tmp_path / "expected.safetensors")!r})
model = AutoModelForCausalLM.from_pretrained({str(folder)!r}, trust_remote_code=True)
with torch.no_grad():
    got = model(input_ids=expected["ids"]).logits
torch.testing.assert_close(got, expected["logits"], atol=1e-5, rtol=1e-5)
assert not any(name == "bsi" or name.startswith("bsi.") for name, m in sys.modules.items() if m is not None)
print("ok")
"""
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "hf-modules"), "PYTHONPATH": ""}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300,
                          cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_each_layer_is_stored_in_its_smaller_form(tmp_path):
    """Layers whose two factors would be larger than the dense matrix stay dense; the others become factors."""
    model = compressed_tiny(False, keep=0.7)  # this keep ratio gives both kinds on the tiny model
    save_compressed(model, None, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    loaded, _ = load_compressed(tmp_path / "m")
    stored = load_file(str(tmp_path / "m" / "model.safetensors"))
    kinds, expected_total = set(), 0
    for name, spec in config["bsi_layers"].items():
        factors, dense = spec["rank"] * (spec["in"] + spec["out"]), spec["in"] * spec["out"]
        bias = spec["out"] if spec["bias"] else 0
        assert spec["kind"] == ("lowrank" if factors < dense else "dense"), name
        module = loaded.get_submodule(name)
        assert isinstance(module, LowRankLinear if spec["kind"] == "lowrank" else nn.Linear), name
        size = min(factors, dense) + bias
        assert sum(p.numel() for p in module.parameters()) == size, name
        assert sum(t.numel() for k, t in stored.items() if k.startswith(f"{name}.")) == size, name
        kinds.add(spec["kind"])
        expected_total += size
    assert kinds == {"lowrank", "dense"}
    assert compressible_parameters(loaded)[0] == expected_total


def test_folder_contents_and_file_modes(tmp_path):
    previous = os.umask(0o027)
    try:
        save_compressed(compressed_tiny(False), None, tmp_path / "m")
    finally:
        os.umask(previous)
    folder = tmp_path / "m"
    names = {p.name for p in folder.iterdir()}
    assert names == {"model.safetensors", "config.json", "generation_config.json", "bsi_config.json", "modeling_bsi.py"}
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in folder.iterdir()} == {n: oct(0o640) for n in names}
    assert oct(folder.stat().st_mode & 0o777) == oct(0o750)
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())  # no temporary leftovers


def test_dense_export_reads_as_an_ordinary_model(tmp_path, monkeypatch, capsys):
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("BSI_CACHE", str(tmp_path / "cache"))
    folder = save_compressed(compressed_tiny(False), None, tmp_path / "m")
    ids = torch.randint(0, 97, (2, 10))
    compressed, _ = load_compressed(folder)
    assert main(["export", "--dense", str(folder), "--out", str(tmp_path / "dense")]) == 0
    assert "wrote a dense checkpoint" in capsys.readouterr().out
    dense = AutoModelForCausalLM.from_pretrained(tmp_path / "dense")  # no trust_remote_code: a standard checkpoint
    assert type(dense).__name__ == "LlamaForCausalLM"
    assert not any(isinstance(m, LowRankLinear) for m in dense.modules())
    assert model_parameters(dense) == model_parameters(make_tiny_llama())
    torch.testing.assert_close(logits(dense, ids), logits(compressed, ids), atol=1e-5, rtol=1e-5)
    source = json.loads((tmp_path / "dense" / "bsi_export.json").read_text())
    assert source["dense_from"] == str(folder.resolve()) and source["layers_multiplied"] > 0

    # an existing result is replaced only when asked
    assert main(["export", "--dense", str(folder), "--out", str(tmp_path / "dense")]) == 2
    assert "already holds a result" in capsys.readouterr().err
    half = export_dense(folder, tmp_path / "dense", dtype=torch.bfloat16, force=True)
    assert AutoModelForCausalLM.from_pretrained(half, dtype="auto").model.embed_tokens.weight.dtype == torch.bfloat16
    with pytest.raises(BSIError, match="not a bsi-compressed model folder"):
        export_dense(tmp_path / "dense", tmp_path / "again")


def test_mismatched_shapes_and_damaged_files_are_clear_errors(tmp_path):
    save_compressed(compressed_tiny(False), None, tmp_path / "m")
    folder = tmp_path / "m"
    state = load_file(str(folder / "model.safetensors"))
    name = next(n for n in state if n.endswith(".up.weight"))
    state[name] = state[name][:, :-1].contiguous()
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(BSIError, match="do not belong together"):
        load_compressed(folder)
    (folder / "model.safetensors").write_bytes(b"\x00" * 20)
    with pytest.raises(BSIError, match="safetensors"):
        load_compressed(folder)
    (folder / "bsi_config.json").write_text("{not json")
    with pytest.raises(BSIError, match="not valid JSON"):
        load_compressed(folder)
    with pytest.raises(BSIError, match="not a bsi-compressed"):
        load_compressed(tmp_path)


def test_output_dir_that_is_a_file_a_foreign_folder_or_a_result(tmp_path):
    target = tmp_path / "file.txt"
    target.write_text("keep me")
    model = compressed_tiny(False)
    with pytest.raises(BSIError, match="is a file"):
        save_compressed(model, None, target)
    assert target.read_text() == "keep me"
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("x")
    with pytest.raises(BSIError, match="not empty"):
        save_compressed(model, None, foreign)
    save_compressed(model, None, tmp_path / "done")
    again = compressed_tiny(False, keep=0.5)
    with pytest.raises(BSIError, match="already holds a result"):
        save_compressed(again, None, tmp_path / "done")
    assert load_compressed(tmp_path / "done")[0].lm_head.rank == model.lm_head.rank  # untouched
    assert save_compressed(again, None, tmp_path / "done", force=True) == tmp_path / "done"
    assert load_compressed(tmp_path / "done")[0].lm_head.rank == again.lm_head.rank != model.lm_head.rank
