import json

import pytest
import torch
from conftest import lm_loss, make_tiny_llama, token_batches
from safetensors.torch import load_file, save_file

from bsi.config import CompressConfig
from bsi.method.engine import Compressor
from bsi.errors import BSIError
from bsi.pipeline.export import load_compressed, save_compressed
from bsi.method.layers import LowRankLinear
from bsi.method.surgery import compressible_parameters, model_parameters


def compressed_tiny(tied: bool, keep: float = 0.3):
    model = make_tiny_llama(tied=tied)
    config = CompressConfig(size_mode="keep", keep_ratio=keep, rounds=2, iters_per_epoch=6, sampling_ratio=0.5, aux_rank=2)
    for _ in Compressor(model, token_batches(), config, lm_loss).run():
        pass
    return model


@pytest.mark.parametrize("tied", [False, True])
def test_save_load_gives_identical_logits(tmp_path, tied):
    model = compressed_tiny(tied)
    ids = torch.randint(0, 97, (2, 10))
    with torch.no_grad():
        before = model(input_ids=ids).logits
    params = model_parameters(model)
    save_compressed(model, None, tmp_path / "out", {"method": "bsi"})
    loaded, _ = load_compressed(tmp_path / "out")
    loaded.set_attn_implementation("eager")  # the same kernel as the original: then bit-identical
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, before, atol=1e-5, rtol=1e-5)
        assert torch.equal(loaded(input_ids=ids).logits, model(input_ids=ids).logits)
    assert model_parameters(loaded) == params
    assert any(isinstance(m, LowRankLinear) for m in loaded.modules())
    if tied:
        assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    out = loaded.generate(ids[:1, :4], max_new_tokens=3, do_sample=False)
    assert out.shape == (1, 7)


def test_small_rank_becomes_factors_large_rank_stays_dense(tmp_path):
    model = compressed_tiny(False, keep=1.0)  # keeps most bases: factors would be bigger than dense
    save_compressed(model, None, tmp_path / "m")
    meta = json.loads((tmp_path / "m" / "bsi_config.json").read_text())
    for spec in meta["layers"].values():
        factors = spec["rank"] * (spec["in"] + spec["out"])
        dense = spec["in"] * spec["out"]
        assert (spec["kind"] == "lowrank") == (factors < dense)
    now, dense = compressible_parameters(model)
    assert now <= dense


def test_only_safetensors_and_json_written(tmp_path):
    save_compressed(compressed_tiny(False), None, tmp_path / "m")
    names = {p.name for p in (tmp_path / "m").iterdir()}
    assert names <= {"model.safetensors", "config.json", "generation_config.json", "bsi_config.json"}
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())  # no temporary leftovers


def test_mismatched_shapes_and_damaged_files_are_clear_errors(tmp_path):
    save_compressed(compressed_tiny(False), None, tmp_path / "m")
    folder = tmp_path / "m"
    state = load_file(str(folder / "model.safetensors"))
    name = next(n for n in state if n.endswith(".A"))
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


def test_output_dir_that_is_a_file_is_refused_before_writing(tmp_path):
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
