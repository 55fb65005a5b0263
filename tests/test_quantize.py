"""Compressed layers as ordinary linears: the two-`nn.Linear` layout, older exports, int8 with optimum-quanto, LoRA.

Tiny random models (tests/conftest.py); each test takes seconds.
"""

import json

import pytest
import torch
from conftest import make_tiny_llama
from safetensors.torch import load_file, save_file
from test_export import compressed_tiny, logits
from torch import nn

from bsi.cli import main
from bsi.errors import BSIError
from bsi.method.layers import LowRankLinear
from bsi.pipeline.export import load_compressed, save_compressed

pytest.importorskip("optimum.quanto", reason="optimum-quanto is part of the test extra: pip install -e '.[test]'")


@pytest.fixture
def folder(tmp_path):
    return save_compressed(compressed_tiny(False), None, tmp_path / "m", {"method": "bsi"})


def low_rank_names(model) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, LowRankLinear)]


def test_a_low_rank_layer_is_two_linears_and_computes_what_its_factors_did():
    layer = LowRankLinear(12, 10, 3, bias=True)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_()
    assert isinstance(layer.down, nn.Linear) and isinstance(layer.up, nn.Linear)
    assert (layer.down.in_features, layer.down.out_features, layer.up.out_features) == (12, 3, 10)
    assert layer.A is layer.up.weight and layer.B is layer.down.weight and layer.bias is layer.up.bias
    x = torch.randn(4, 12)
    expected = nn.functional.linear(nn.functional.linear(x, layer.B), layer.A, layer.bias)  # the former arithmetic
    assert torch.equal(layer(x), expected)
    torch.testing.assert_close(layer.to_linear()(x), expected, atol=1e-5, rtol=1e-5)
    state = torch.get_rng_state()
    LowRankLinear(500, 400, 50, bias=False)
    assert torch.equal(state, torch.get_rng_state())  # building one draws no random numbers (training stays as it was)


def test_older_exports_with_factor_tensors_a_b_still_load(folder, tmp_path):
    """A folder written before the two-linear layout (tensors L.A, L.B, L.bias; format 2) loads with both loaders."""
    from transformers import AutoModelForCausalLM

    ids = torch.randint(0, 97, (2, 9))
    new, _ = load_compressed(folder)
    state = load_file(str(folder / "model.safetensors"))
    old_names = {".up.weight": ".A", ".down.weight": ".B", ".up.bias": ".bias"}
    renamed = {}
    for key, tensor in state.items():
        suffix = next((s for s in old_names if key.endswith(s)), None)
        renamed[key[: -len(suffix)] + old_names[suffix] if suffix else key] = tensor
    assert any(k.endswith(".A") for k in renamed) and not any(".up." in k for k in renamed)
    save_file(renamed, str(folder / "model.safetensors"), metadata={"format": "pt"})
    meta = json.loads((folder / "bsi_config.json").read_text())
    (folder / "bsi_config.json").write_text(json.dumps({**meta, "version": 2}))

    old, _ = load_compressed(folder)
    theirs = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    assert torch.equal(logits(old, ids), logits(new, ids))
    assert torch.equal(logits(theirs, ids), logits(new, ids))
    assert low_rank_names(old) == low_rank_names(new) != []


def test_a_weight_only_int8_quantizer_sees_the_factors(folder):
    """optimum-quanto's quantize() acts on nn.Linear modules: both factors of every low-rank layer become int8."""
    from optimum.quanto import QLinear, freeze, qint8, quantize

    model, _ = load_compressed(folder)
    ids = torch.randint(0, 97, (4, 16))
    before = logits(model, ids)
    quantize(model, weights=qint8)
    freeze(model)
    for name in low_rank_names(model):
        layer = model.get_submodule(name)
        assert isinstance(layer.up, QLinear) and isinstance(layer.down, QLinear)
        assert layer.down.weight._data.dtype == torch.int8
    after = logits(model, ids)
    assert (after - before).norm() / before.norm() < 0.05  # int8 per-channel weights: close, not equal
    assert not torch.equal(after, before)


def test_a_lora_adapter_targets_the_factors_and_trains(folder):
    peft = pytest.importorskip("peft")
    model, _ = load_compressed(folder)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters()}
    adapted = peft.get_peft_model(model, peft.LoraConfig(r=2, lora_alpha=4, target_modules=["up", "down"]))
    lora = [n for n, _ in adapted.named_modules() if n.endswith((".up", ".down")) and hasattr(
        adapted.get_submodule(n), "lora_A")]
    assert len(lora) == 2 * len(low_rank_names(model)) > 0
    trainable = [p for p in adapted.parameters() if p.requires_grad]
    assert trainable and all(".lora_" in n for n, p in adapted.named_parameters() if p.requires_grad)
    optimizer = torch.optim.AdamW(trainable, lr=1e-2)
    batch = torch.randint(0, 97, (4, 16), generator=torch.Generator().manual_seed(3))
    losses = []
    for _ in range(12):
        loss = adapted(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.05  # the adapter learns the batch
    merged = adapted.merge_and_unload()
    changed = [n for n, p in merged.named_parameters() if not torch.equal(p, frozen[n])]
    assert changed and all(n.endswith((".up.weight", ".down.weight")) for n in changed)


def test_bsi_export_quantize_writes_an_int8_folder_that_loads_both_ways(folder, tmp_path, capsys):
    from optimum.quanto import QLinear
    from transformers import AutoModelForCausalLM

    out = tmp_path / "int8"
    assert main(["export", "--model", str(folder), "--quantize", "int8", "--out", str(out)]) == 0
    assert "wrote int8 weights" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    assert config["bsi_quantization"]["library"] == "optimum-quanto" and config["bsi_quantization"]["map"]
    stored, original = load_file(str(out / "model.safetensors")), load_file(str(folder / "model.safetensors"))
    int8 = {k.removesuffix("._data"): t for k, t in stored.items() if k.endswith("weight._data")}
    assert int8 and all(t.dtype == torch.int8 for t in int8.values())
    assert set(int8) == {k for k in original if k.endswith("weight") and "norm" not in k and "embed" not in k}
    assert all(int8[k].shape == original[k].shape for k in int8)  # one byte per weight instead of four
    assert (out / "model.safetensors").stat().st_size < (folder / "model.safetensors").stat().st_size

    ids = torch.randint(0, 97, (2, 11))
    source, _ = load_compressed(folder)
    ours, _ = load_compressed(out)
    theirs = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
    assert torch.equal(logits(ours, ids), logits(theirs, ids))
    assert (logits(ours, ids) - logits(source, ids)).norm() / logits(source, ids).norm() < 0.05
    assert all(isinstance(ours.get_submodule(n).up, QLinear) for n in low_rank_names(ours))
    assert ours.generate(ids[:1, :3], max_new_tokens=3, min_new_tokens=3, do_sample=False).shape == (1, 6)
    from bsi.method.surgery import model_parameters

    assert model_parameters(ours) == model_parameters(source)  # an int8 weight is still one parameter each
    with pytest.raises(BSIError, match="float32"):
        load_compressed(out, dtype=torch.bfloat16)

    # a dense folder (any transformers checkpoint) is written the same way: the dense int8 reference
    from bsi.models import TINY_MODEL, load_model_and_tokenizer

    dense = tmp_path / "dense"
    make_tiny_llama(tied=True).save_pretrained(dense)  # tied, as the embedded model is
    load_model_and_tokenizer(TINY_MODEL)[1].save_pretrained(dense)
    assert main(["export", "--model", str(dense), "--quantize", "int8", "--out", str(tmp_path / "dense-int8")]) == 0
    quantized, _ = load_compressed(tmp_path / "dense-int8")
    assert quantized.lm_head.weight.data_ptr() == quantized.model.embed_tokens.weight.data_ptr()  # tied, unquantized
    assert isinstance(quantized.model.layers[0].mlp.up_proj, QLinear)


def test_quantize_refusals_come_before_loading_and_leave_nothing_behind(folder, tmp_path, monkeypatch, capsys):
    out = tmp_path / "q"
    cases = [
        (["--model", str(folder), "--out", str(out)], "goes with --quantize int8"),
        (["--dense", str(folder), "--quantize", "int8", "--out", str(out)], "not --dense"),
        (["--model", str(folder), "--quantize", "int4", "--out", str(out)], "int8"),
        (["--model", str(tmp_path / "none"), "--quantize", "int8", "--out", str(out)], "is not a folder"),
        (["--model", str(folder), "--quantize", "int8", "--dtype", "bfloat16", "--out", str(out)], "--dtype is for"),
    ]
    for flags, message in cases:
        assert main(["export", *flags]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err, err
    assert not out.exists()

    monkeypatch.setitem(__import__("sys").modules, "optimum.quanto", None)  # as if optimum-quanto were missing
    assert main(["export", "--model", str(tmp_path / "none"), "--quantize", "int8", "--out", str(out)]) == 2
    assert "pip install 'bsi[quantize]'" in capsys.readouterr().err  # said before the (missing) model is looked at
    monkeypatch.undo()

    from bsi.pipeline import quantize as quantize_module

    with pytest.raises(BSIError, match="cpu or cuda"):
        quantize_module.check_quantization("int8", "mps")

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("bsi.pipeline.export.save_file", disk_full)
    with pytest.raises(OSError):
        quantize_module.export_quantized(folder, out)
    assert not out.exists() and not any(p.name.startswith(".") for p in tmp_path.iterdir())  # never half-written


def test_loading_options_of_a_spread_model_are_accepted_and_a_wrong_load_refused(folder):
    """What lm-eval and accelerate pass: a one-device map and spread-only options load; a real spread or quantizing while loading is refused."""
    from transformers import AutoModelForCausalLM

    ids = torch.randint(0, 97, (1, 7))
    reference = logits(AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True), ids)
    for kwargs in ({"device_map": {"": "cpu"}}, {"device_map": {"": torch.device("cpu")}},
                   {"device_map": "auto", "max_memory": {}, "offload_folder": "./offload"},
                   {"device_map": {"model": "cpu", "lm_head": "cpu"}}, {"offload_state_dict": True}):
        model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, **kwargs)
        assert torch.equal(logits(model, ids), reference), kwargs
    refused = [({"device_map": {"model.layers.0": "cpu", "model.layers.1": "cuda:0"}}, "one device"),
               ({"device_map": "disk"}, "cannot be loaded onto 'disk'"),
               ({"load_in_8bit": True}, "does not quantize while loading"),
               ({"quantization_config": {"quant_method": "bitsandbytes"}}, "does not quantize while loading")]
    for kwargs, message in refused:
        with pytest.raises((ValueError, TypeError), match=message):
            AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, **kwargs)
