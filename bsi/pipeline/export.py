"""Saving a compressed model and loading it back as a working transformers model.

On disk a compressed model is a folder with

* ``model.safetensors`` — every tensor (tied weights stored once); never pickle;
* ``config.json`` — the original transformers config (architecture, sizes);
* tokenizer files;
* ``bsi_config.json`` — which layers became two-factor ``LowRankLinear``
  modules (with their rank) and which stayed dense, plus how the model was made.

:func:`load_compressed` rebuilds the transformers model from ``config.json``
without allocating its dense weights, swaps in ``LowRankLinear`` modules where
the table says so, checks every tensor's shape against what the config implies
(a clear error names the first mismatch), and loads the safetensors file. The
result is an ordinary ``PreTrainedModel``: ``generate``, ``forward`` and the
tokenizer work as usual.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from bsi.errors import BSIError
from bsi.files import atomic_directory, atomic_write_json
from bsi.method.layers import LowRankLinear
from bsi.method.surgery import parent_and_attr, basis_layers, to_exported_form

FORMAT = "bsi-compressed"
FORMAT_VERSION = 1
WEIGHTS = "model.safetensors"
META = "bsi_config.json"


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
    model: nn.Module, tokenizer: Any, folder: Path, meta: dict[str, Any], table: dict[str, dict] | None = None
) -> dict[str, dict]:
    """Export ``model`` into an existing ``folder``; returns the layer table of ``bsi_config.json``.

    `BasisLinear` layers are converted in place first. A model converted
    earlier (by :func:`bsi.method.surgery.to_exported_form`) must come with that
    call's ``table``.
    """
    if basis_layers(model):
        table = to_exported_form(model)
    elif table is None:
        raise ValueError("model has no BasisLinear layers left: pass the table from to_exported_form")
    save_file(_deduplicated_state(model), str(folder / WEIGHTS), metadata={"format": "pt"})
    model.config.save_pretrained(folder)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    atomic_write_json(folder / META, {**meta, "format": FORMAT, "version": FORMAT_VERSION, "layers": table})
    return table


def save_compressed(model: nn.Module, tokenizer: Any, out_dir: str | Path, meta: dict[str, Any] | None = None) -> Path:
    """Save a compressed model to ``out_dir`` atomically (all files or none).

    `BasisLinear` layers are converted in place to their exported form first
    (two factors, or dense when factors would be larger), so the model in memory
    afterwards is exactly what was written.
    """
    out_dir = Path(out_dir)
    with atomic_directory(out_dir) as tmp:
        write_model_files(model, tokenizer, tmp, dict(meta or {}))
    return out_dir


def read_meta(path: str | Path) -> dict[str, Any]:
    """Read and check ``bsi_config.json`` of a compressed-model folder."""
    file = Path(path) / META
    try:
        meta = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BSIError(f"'{path}' is not a bsi-compressed model folder (no {META})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BSIError(f"{file} is not valid JSON ({err}); the folder is damaged, re-export the model") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or not isinstance(meta.get("layers"), dict):
        raise BSIError(f"{file} is not a {FORMAT} description; the folder is damaged, re-export the model")
    if meta.get("version", 0) > FORMAT_VERSION:
        raise BSIError(f"{file} has format version {meta.get('version')}; upgrade bsi to load it")
    return meta


def load_compressed(
    path: str | Path, *, dtype: torch.dtype | None = None, device: str | torch.device = "cpu"
) -> tuple[nn.Module, Any]:
    """Load a folder written by :func:`save_compressed`; returns ``(model, tokenizer)``.

    Raises:
        BSIError: for a missing or damaged folder, or tensors whose shapes do not
            match the config (the message names the first offending tensor).
    """
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    meta = read_meta(path)
    weights = path / WEIGHTS
    if not weights.is_file():
        raise BSIError(f"'{path}' has no {WEIGHTS}; the folder is incomplete, re-export the model")
    try:
        config = AutoConfig.from_pretrained(path)
    except Exception as err:  # noqa: BLE001 - transformers raises many kinds
        raise BSIError(f"'{path}/config.json' cannot be read as a transformers config: {err}") from None
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config)
    for name, spec in meta["layers"].items():
        if spec.get("kind") != "lowrank":
            continue
        try:
            parent, attr = parent_and_attr(model, name)
            getattr(parent, attr)
        except AttributeError:
            raise BSIError(f"{META} names layer '{name}' that the config's model does not have") from None
        with init_empty_weights(include_buffers=False):
            setattr(parent, attr, LowRankLinear(spec["in"], spec["out"], spec["rank"], spec["bias"]))
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as err:
        raise BSIError(f"'{weights}' is not a readable safetensors file ({err}); re-export the model") from None
    expected = model.state_dict()
    for name, tensor in state.items():
        if name not in expected:
            raise BSIError(f"'{weights}' holds tensor '{name}' that the model built from config.json does not have")
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise BSIError(
                f"tensor '{name}' has shape {tuple(tensor.shape)} in {WEIGHTS} but config.json/{META} imply "
                f"{tuple(expected[name].shape)}; the files do not belong together"
            )
    model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    missing = [n for n, p in model.named_parameters() if p.device.type == "meta"]
    if missing:
        raise BSIError(f"'{weights}' lacks tensor '{missing[0]}' (and {len(missing) - 1} more); re-export the model")
    model = model.to(device=device, dtype=dtype) if dtype is not None else model.to(device)
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(path) if (path / "tokenizer_config.json").exists() else None
    return model, tokenizer
