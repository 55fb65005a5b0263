"""The conversion cache: every layer's bases, kept on disk as the fine-tune is, so a run's first round comes sooner.

Converting a model to the Basel form costs, with whitened bases, a few
forward passes to gather each layer's input statistics and one SVD per
layer (about 22 s for the embedded model on 2 CPU cores: 7 s of
calibration, 15 s of SVDs). The result depends on nothing but the model
being converted (the fine-tuned model, itself cached under its own key), the
calibration batches (the run's seed, batch size, sequence length and data,
all in the fine-tune's key) and the conversion's own settings. So it is
cached under a hash of exactly those: ``<cache>/bases/<key>/``, holding
``bases.safetensors`` (each layer's ``U``, ``sigma``, ``V`` at full rank,
as the conversion made them) and ``inputs.json`` (what the key hashes, the
file's size, how long the conversion took).

A run that finds its key converts from the file and skips the calibration
passes and the SVDs; it still draws the calibration batches from its stream,
so every later batch is the one an uncached run draws, and the run is the
same, bit for bit (tested). The file is large: the embedded model's bases
take 632 MB in float32 (every layer at full rank, its two factors), about the
fine-tuned model's size times 1.2. Runs on several processes, sharded runs
and resumed runs neither read nor write it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bsi.method.layers import BasisLinear
from bsi.method.surgery import Bases

FILE = "bases.safetensors"
INPUTS = "inputs.json"
VERSION = 1


def bases_cache_inputs(finetune_key: str, finetuned: bool, compress: Any, device: str) -> dict[str, Any]:
    """What determines a conversion: the model it converts and the conversion's settings (the key's inputs).

    ``finetune_key``: the fine-tune cache's key of the run
    (:func:`bsi.pipeline.runner.finetune_cache_key`), which holds the model,
    the data, the seed, the batch shape and the dtype; ``finetuned``: whether
    the converted model is that fine-tune or the model as loaded;
    ``compress``: the run's :class:`~bsi.config.CompressConfig`.
    """
    whitened = compress.bases == "whitened"
    return {"finetune": finetune_key, "finetuned": finetuned, "bases": compress.bases, "device": device,
            "calibration_batches": compress.calibration_batches if whitened else 0,
            "whitening_damping": compress.whitening_damping if whitened else 0.0, "version": VERSION}


def bases_cache_key(inputs: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(dict(inputs), sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class BasesCache:
    """One conversion's place in the cache: :meth:`load` what an earlier run saved, :meth:`save` this one's."""

    folder: Path
    inputs: dict[str, Any]

    @classmethod
    def under(cls, root: Path, inputs: dict[str, Any]) -> BasesCache:
        """The cache entry for ``inputs`` under the cache root ``root`` (``<root>/bases/<key>``)."""
        return cls(Path(root) / "bases" / bases_cache_key(inputs), dict(inputs))

    @property
    def present(self) -> bool:
        return (self.folder / FILE).is_file() and (self.folder / INPUTS).is_file()

    def load(self) -> dict[str, Bases] | None:
        """Every layer's ``(U, sigma, V)`` as saved, or None when this conversion is not cached (or is unreadable)."""
        if not self.present:
            return None
        from safetensors.torch import load_file

        try:
            tensors = load_file(str(self.folder / FILE))
        except (OSError, ValueError, RuntimeError):  # a damaged file: convert again (and save over it)
            return None
        names = sorted({key.rsplit(".", 1)[0] for key in tensors})
        return {n: (tensors[f"{n}.U"], tensors[f"{n}.sigma"], tensors[f"{n}.V"]) for n in names}

    def save(self, layers: Mapping[str, BasisLinear], seconds: float) -> None:
        """Keep the bases of freshly converted ``layers`` (full rank), atomically; another run's copy wins a race."""
        from safetensors.torch import save_file

        tensors = {}
        for name, layer in layers.items():
            tensors[f"{name}.U"] = layer.U.detach().cpu().contiguous()
            tensors[f"{name}.sigma"] = layer.sigma.detach().cpu().contiguous()
            tensors[f"{name}.V"] = layer.V.detach().cpu().contiguous()
        self.folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".partial-", dir=self.folder.parent))
        try:
            save_file(tensors, str(tmp / FILE))
            size = (tmp / FILE).stat().st_size
            info = {"inputs": self.inputs, "bytes": size, "conversion_seconds": round(seconds, 1),
                    "layers": len(layers), "saved": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            (tmp / INPUTS).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
            if self.folder.exists():
                shutil.rmtree(self.folder, ignore_errors=True)  # an unreadable copy
            tmp.replace(self.folder)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)  # another run won the race, or the disk is full: keep going

    def info(self) -> dict[str, Any]:
        """``inputs.json`` (size and time included), or {} when absent."""
        try:
            return dict(json.loads((self.folder / INPUTS).read_text(encoding="utf-8")))
        except (OSError, ValueError):
            return {}


def bases_by_name(saved: Mapping[str, Bases]):
    """The ``bases`` argument of :func:`~bsi.method.surgery.to_basis_form` for saved bases (moved to each weight)."""
    def bases(name: str, linear: torch.nn.Linear) -> Bases:
        u, s, v = saved[name]
        return u.to(linear.weight), s.to(torch.float32), v.to(linear.weight)
    return bases
