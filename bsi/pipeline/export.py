"""Saving a compressed model, loading it back, and multiplying it back into a dense checkpoint.

On disk a compressed model is a folder with

* ``model.safetensors`` — every tensor (tied weights stored once); never pickle;
* ``config.json`` — model type ``bsi_compressed``: the original transformers
  config (``base_config``) and which layers became two-factor
  ``LowRankLinear`` modules, with their rank (``bsi_layers``); such a layer
  holds two ``nn.Linear`` modules, ``down`` and ``up``, so its tensors are
  ``<layer>.down.weight`` (k, in), ``<layer>.up.weight`` (out, k) and
  ``<layer>.up.bias`` (folders of format 2 named them ``A``, ``B``, ``bias``:
  they load too);
* ``modeling_bsi.py`` — the code that lets plain transformers load the folder
  (:mod:`bsi.pipeline.modeling_bsi`, copied verbatim; it needs no bsi);
* tokenizer files and ``generation_config.json``;
* ``bsi_config.json`` — how the model was made (method, source model, settings).

Three ways to use it:

* ``bsi.load_compressed(folder)`` returns ``(model, tokenizer)``;
* ``AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)``
  returns the same model (same logits) without bsi; without
  ``trust_remote_code`` transformers refuses the folder with an error (it
  never builds the model with random weights);
* ``bsi export --dense FOLDER --out DIR`` (:func:`export_dense`) multiplies
  the factors back into an ordinary dense checkpoint, for tools that read only
  standard models. It is as large as the original model: the compression
  then shows in nothing but the changed weights.

Either loader rebuilds the original architecture without allocating its
dense weights, swaps in ``LowRankLinear`` modules where the table says so,
checks every tensor's shape against what the config implies (a clear error
names the first mismatch), and loads the safetensors file. The result is an
ordinary ``PreTrainedModel`` of the original class: ``generate``, ``forward``
and the tokenizer work as usual.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from bsi.errors import BSIError
from bsi.files import atomic_directory, atomic_write_json, atomic_write_text, check_output_dir, refuse_to_replace
from bsi.method.layers import LowRankLinear
from bsi.method.surgery import basis_layers, replace_module, to_exported_form
from bsi.pipeline import modeling_bsi
from bsi.pipeline.modeling_bsi import MODEL_TYPE, MODULE_FILE, WEIGHTS, CompressedFolderError

FORMAT = "bsi-compressed"
FORMAT_VERSION = 3  # 1: config.json was the original config, the layer table lived in bsi_config.json;
# 2: a low-rank layer's tensors were L.A, L.B, L.bias (now L.up.weight, L.down.weight, L.up.bias; both load)
META = "bsi_config.json"
DENSE_META = "bsi_export.json"


def _deduplicated_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """State dict with tensors that share storage (tied weights) kept once, contiguous."""
    seen: set[tuple[int, tuple]] = set()
    out: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        key = (tensor.data_ptr(), tuple(tensor.shape))
        if key in seen:
            continue
        seen.add(key)
        out[name] = tensor.detach().contiguous()
    return out


def write_model_files(
    model: nn.Module, tokenizer: Any, folder: Path, meta: dict[str, Any], table: dict[str, dict] | None = None,
    quantization: dict[str, Any] | None = None,
) -> dict[str, dict]:
    """Export ``model`` into an existing ``folder``; returns the layer table (``bsi_layers`` of ``config.json``).

    `BasisLinear` layers are converted in place first. A model converted
    earlier (by :func:`bsi.method.surgery.to_exported_form`) must come with that
    call's ``table``. ``quantization``: how its weights were quantized
    (:mod:`bsi.pipeline.quantize`), written into ``config.json``.
    """
    if basis_layers(model):
        table = to_exported_form(model)
    elif table is None:
        raise ValueError("model has no BasisLinear layers left: pass the table from to_exported_form")
    save_file(_deduplicated_state(model), str(folder / WEIGHTS), metadata={"format": "pt"})
    atomic_write_json(folder / "config.json", modeling_bsi.compressed_config(model.config, table, quantization))
    atomic_write_text(folder / MODULE_FILE, Path(modeling_bsi.__file__).read_text(encoding="utf-8"))
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    atomic_write_json(folder / META, {**meta, "format": FORMAT, "version": FORMAT_VERSION})
    return table


def save_compressed(model: nn.Module, tokenizer: Any, out_dir: str | Path, meta: dict[str, Any] | None = None,
                    *, force: bool = False) -> Path:
    """Save a compressed model to ``out_dir`` atomically (all files or none); returns the folder.

    `BasisLinear` layers are converted in place to their exported form first
    (two factors, or dense when factors would be larger), so the model in memory
    afterwards is exactly what was written.

    Raises:
        BSIError: ``out_dir`` already holds a bsi result and ``force`` is False,
            or cannot be written (see :func:`bsi.files.check_output_dir`).
    """
    out_dir = Path(out_dir)
    refuse_to_replace(out_dir, force)
    with atomic_directory(out_dir) as tmp:
        write_model_files(model, tokenizer, tmp, dict(meta or {}))
    return out_dir


def read_meta(path: str | Path) -> dict[str, Any]:
    """Read and check ``bsi_config.json`` of a compressed-model folder; returns its content."""
    file = Path(path) / META
    try:
        meta = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BSIError(f"'{path}' is not a bsi-compressed model folder (no {META})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BSIError(f"{file} is not valid JSON ({err}); the folder is damaged, re-export the model") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise BSIError(f"{file} is not a {FORMAT} description; the folder is damaged, re-export the model")
    if meta.get("version", 0) > FORMAT_VERSION:
        raise BSIError(f"{file} has format version {meta.get('version')}; upgrade bsi to load it")
    return meta


def _architecture(path: Path, meta: dict[str, Any]) -> tuple[Any, dict[str, dict], dict[str, Any] | None]:
    """The original model's config, the layer table and the quantization (None if none) of a folder (any version)."""
    file = path / "config.json"
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BSIError(f"'{file}' cannot be read ({err}); the folder is damaged, re-export the model") from None
    if config.get("model_type") == MODEL_TYPE:
        model_type, base, layers = config.get("base_model_type"), config.get("base_config"), config.get("bsi_layers")
    else:  # format 1
        model_type, base, layers = config.get("model_type"), config, meta.get("layers")
    if not isinstance(base, dict) or not isinstance(layers, dict):
        raise BSIError(f"'{file}' lacks the original config or the layer table; re-export the model")
    return modeling_bsi.base_config(model_type, base), layers, config.get("bsi_quantization")


def load_compressed(
    path: str | Path, *, dtype: torch.dtype | None = None, device: str | torch.device = "cpu"
) -> tuple[nn.Module, Any]:
    """Load a folder written by :func:`save_compressed`.

    Returns:
        ``(model, tokenizer)``: the original architecture's ``PreTrainedModel``
        with ``LowRankLinear`` layers where the folder says so, in eval mode on
        ``device`` (cast to ``dtype`` if given, else in the stored dtype), and
        the folder's tokenizer (None if it has none).

    Raises:
        BSIError: for a missing or damaged folder, or tensors whose shapes do not
            match the config (the message names the first offending tensor).
    """
    from transformers import AutoTokenizer, GenerationConfig

    path = Path(path)
    meta = read_meta(path)
    weights = path / WEIGHTS
    if not weights.is_file():
        raise BSIError(f"'{path}' has no {WEIGHTS}; the folder is incomplete, re-export the model")
    try:
        base, layers, quantization = _architecture(path, meta)  # an unknown model type is a CompressedFolderError
        model = modeling_bsi.build_model(base, layers, layer_class=LowRankLinear)
        state = modeling_bsi.current_names(modeling_bsi.read_weights(str(weights)), layers)
        if quantization:
            if dtype not in (None, torch.float32):
                raise BSIError(f"'{path}' holds int8 weights with float32 scales and float32 embeddings: load it "
                               "in float32 (--dtype float32)")
            dtype = None  # stored as it is
            modeling_bsi.load_quantized_weights(model, state, quantization, torch.device(device))
        else:
            modeling_bsi.load_weights(model, state)
    except CompressedFolderError as err:
        raise BSIError(f"'{path}': {err}") from None
    if (path / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(path)
    model = model.to(device=device, dtype=dtype) if dtype is not None else model.to(device)
    model.eval()
    # given the original config, the tokenizer never reads config.json (whose code bsi does not run)
    tokenizer = AutoTokenizer.from_pretrained(path, config=base) if (path / "tokenizer_config.json").exists() else None
    return model, tokenizer


def to_dense(model: nn.Module) -> int:
    """Multiply every ``LowRankLinear`` of ``model`` back into an ``nn.Linear`` in place; returns how many."""
    names = [name for name, module in model.named_modules() if isinstance(module, LowRankLinear)]
    for name in names:
        replace_module(model, name, model.get_submodule(name).to_linear())
    return len(names)


def export_dense(folder: str | Path, out_dir: str | Path, *, dtype: torch.dtype | None = None,
                 force: bool = False) -> Path:
    """Write the compressed model in ``folder`` as an ordinary dense transformers checkpoint in ``out_dir``.

    Every low-rank layer becomes the dense matrix ``A B`` (computed in fp32,
    stored in the model's dtype, or ``dtype``); any tool that reads standard
    models (plain ``from_pretrained``, converters, servers) reads the result.
    The logits equal the compressed model's up to float rounding. The folder
    also holds ``bsi_export.json``, naming where it came from. Returns ``out_dir``.

    Raises:
        BSIError: ``folder`` is not a compressed-model folder, or ``out_dir``
            already holds a result and ``force`` is False, or cannot be written.
    """
    out_dir = check_output_dir(out_dir)  # before the model loads: a bad --out answers at once
    refuse_to_replace(out_dir, force)
    model, tokenizer = load_compressed(folder, dtype=dtype)
    meta = read_meta(folder)
    converted = to_dense(model)
    with atomic_directory(out_dir) as tmp:
        model.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        atomic_write_json(tmp / DENSE_META, {
            "format": "bsi-dense", "version": 1, "dense_from": str(Path(folder).expanduser().resolve()),
            "layers_multiplied": converted, "method": meta.get("method"), "source_model": meta.get("source_model"),
        })
    return out_dir
