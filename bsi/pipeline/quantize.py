"""Low-rank plus quantization: int8 weight-only quantization of a model folder with optimum-quanto.

``bsi export --model FOLDER --quantize int8 --out DIR`` quantizes every
linear layer of a model (a compressed folder's two factors ``down`` and
``up`` included, since they are ordinary ``nn.Linear`` modules) to int8 with
one fp32 scale per output channel (optimum-quanto's ``qint8`` weights,
activations left in floating point), and writes a folder in bsi's format:
``config.json`` gains ``bsi_quantization`` (the library, the scheme and the
map of quantized modules) and ``model.safetensors`` holds the int8 data and
the scales. It loads like any bsi folder, with ``bsi.load_compressed`` or
``AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)``;
loading needs optimum-quanto installed (``pip install "bsi[quantize]"``).

A dense folder (the fine-tuned model, any transformers checkpoint) is
written the same way, with no low-rank layers in its table: the
"dense int8" reference beside the compressed model.

What stays in floating point: the embeddings (and an output layer tied to
them), the norms, and the biases. An output layer of its own (not tied) is
quantized like any linear layer.

Why optimum-quanto rather than torchao: both quantize ``nn.Linear`` weights
to int8 on CPU, but on the embedded model's architecture torchao 0.18's
int8 layers decoded 3.5 times slower than float32 while optimum-quanto's
kept its speed (docs/ecosystem.md), and torchao's wheel, once installed, is
imported by transformers at every start and prints load errors for its GPU
kernels on a CPU machine. optimum-quanto also serialises to safetensors with
its own map, which the folder's loader reads back.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bsi.errors import BSIError

#: scheme name -> optimum-quanto weight type
SCHEMES = {"int8": "qint8"}
LIBRARY = "optimum-quanto"
INSTALL_HINT = "pip install 'bsi[quantize]' (optimum-quanto 0.2.7)"


def check_quantization(scheme: str, device: str | torch.device = "cpu") -> str:
    """Refuse, before any model loads, a scheme, library or device that cannot quantize; returns the library version.

    Raises:
        BSIError: an unknown scheme, optimum-quanto missing, or a device it
            has no int8 kernels for (it runs on CPU and CUDA).
    """
    if scheme not in SCHEMES:
        raise BSIError(f"--quantize {scheme}: bsi quantizes to {', '.join(SCHEMES)} (weight-only); choose one of them")
    try:
        importlib.import_module("optimum.quanto")
    except ImportError:
        raise BSIError(f"--quantize needs optimum-quanto, which is not installed: {INSTALL_HINT}") from None
    kind = torch.device(device).type
    if kind not in ("cpu", "cuda"):
        raise BSIError(f"optimum-quanto's int8 weights run on cpu or cuda, not on '{kind}': pass --device cpu")
    return importlib.metadata.version(LIBRARY)


def quantize_linears(model: nn.Module, scheme: str = "int8") -> dict[str, dict[str, str]]:
    """Quantize every ``nn.Linear`` of ``model`` in place (weights only) except a tied output layer.

    Returns optimum-quanto's quantization map (module name -> its weight and
    activation types), which a loader needs to rebuild the quantized modules.
    """
    from optimum.quanto import freeze, quantization_map, quantize

    from bsi.method.surgery import tied_output_names

    # a tied output layer is the embedding, which stays float
    quantize(model, weights=SCHEMES[scheme], exclude=sorted(tied_output_names(model)) or None)
    freeze(model)  # int8 data and scales replace the float weights
    return quantization_map(model)


def model_bytes(model: nn.Module) -> int:
    """Bytes of every tensor the model holds (parameters and buffers, shared ones once; int8 data and scales)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for tensor in model.state_dict().values():
        key = (tensor.data_ptr(), tensor.nbytes)
        if key not in seen:
            seen.add(key)
            total += tensor.nbytes
    return total


def weights_bytes(folder: str | Path) -> int:
    """Bytes of a model folder's weight files on disk (``*.safetensors``, ``*.bin``)."""
    root = Path(folder).expanduser()
    return sum(f.stat().st_size for pattern in ("*.safetensors", "*.bin") for f in root.glob(pattern))


def _read_source(folder: Path) -> tuple[nn.Module, Any, dict[str, dict], dict[str, Any]]:
    """The model, tokenizer, layer table and description of a bsi folder or of an ordinary transformers folder."""
    from bsi.pipeline.export import _architecture, load_compressed, read_meta

    if (folder / "bsi_config.json").is_file():
        meta = read_meta(folder)
        _, layers, quantization = _architecture(folder, meta)
        if quantization:
            raise BSIError(f"'{folder}' is quantized already: give the folder it was exported from")
        model, tokenizer = load_compressed(folder)
        return model, tokenizer, layers, {k: v for k, v in meta.items() if k not in ("format", "version")}
    from bsi.models import check_model_spec, load_model_and_tokenizer

    check_model_spec(str(folder))
    if not (folder / "config.json").is_file():
        raise BSIError(f"'{folder}' holds no model (no config.json): give a bsi output folder or a model folder")
    model, tokenizer = load_model_and_tokenizer(str(folder), dtype=torch.float32)
    return model, tokenizer, {}, {"method": "dense", "source_model": str(folder)}


def export_quantized(folder: str | Path, out_dir: str | Path, *, scheme: str = "int8", force: bool = False) -> Path:
    """Write ``folder``'s model with int8 weights into ``out_dir`` (atomically: all files or none); returns ``out_dir``.

    Raises:
        BSIError: the scheme or library cannot quantize, ``folder`` holds no
            model or is quantized already, or ``out_dir`` holds a result and
            ``force`` is False; all checked before the model loads where
            they can be.
    """
    from bsi.files import atomic_directory, check_output_dir, refuse_to_replace
    from bsi.pipeline.export import write_model_files

    version = check_quantization(scheme)
    source = Path(folder).expanduser()
    if not source.is_dir():
        raise BSIError(f"--model '{folder}' is not a folder: give a bsi output folder or a model folder")
    out_dir = check_output_dir(out_dir)
    refuse_to_replace(out_dir, force)
    model, tokenizer, table, meta = _read_source(source)
    before = model_bytes(model)
    qmap = quantize_linears(model, scheme)
    quantization = {"library": LIBRARY, "version": version, "scheme": scheme, "weights": SCHEMES[scheme],
                    "map": qmap}
    meta |= {"quantized_from": str(source.resolve()), "quantization": {k: v for k, v in quantization.items()
                                                                        if k != "map"},
             "bytes_in_memory": {"before": before, "after": model_bytes(model)}}
    with atomic_directory(out_dir) as tmp:
        write_model_files(model, tokenizer, tmp, meta, table=table, quantization=quantization)
    return out_dir
