"""Round checkpoints: a run that crashes resumes from its last complete round.

A checkpoint is a folder with ``state.safetensors`` (tensors) and
``state.json`` (plain values). It is written to a temporary sibling and
renamed over the previous one, so a crash while saving leaves the previous
checkpoint intact; nothing is ever pickled. Its files get the usual mode
(``0666`` minus the umask, see :func:`bsi.files.set_default_mode`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from bsi.errors import BSIError
from bsi.files import atomic_write_json, set_default_mode

TENSORS = "state.safetensors"
PLAIN = "state.json"


def save_checkpoint(folder: str | Path, tensors: dict[str, torch.Tensor], plain: dict) -> None:
    """Write (or atomically replace) the checkpoint ``folder``.

    Raises:
        BSIError: when the disk refuses the write (full, read-only, removed).
    """
    folder = Path(folder)
    try:
        _write(folder, tensors, plain)
    except (OSError, SafetensorError) as err:
        raise BSIError(f"cannot write the checkpoint '{folder}' ({getattr(err, 'strerror', None) or err}); "
                       "free some space or choose another --out folder") from None


def _write(folder: Path, tensors: dict[str, torch.Tensor], plain: dict) -> None:
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        save_file(tensors, str(tmp / TENSORS))
        atomic_write_json(tmp / PLAIN, plain)
        set_default_mode(tmp)
        old = folder.parent / f".{folder.name}.old"
        if folder.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(folder, old)
        os.replace(tmp, folder)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def load_checkpoint(folder: str | Path) -> tuple[dict[str, torch.Tensor], dict]:
    """Read a checkpoint written by :func:`save_checkpoint`."""
    folder = Path(folder)
    if not (folder / PLAIN).is_file() or not (folder / TENSORS).is_file():
        raise BSIError(f"no checkpoint in '{folder}': nothing to resume (was the run started with this --out?)")
    try:
        plain = json.loads((folder / PLAIN).read_text(encoding="utf-8"))
        tensors = load_file(str(folder / TENSORS))
    except (json.JSONDecodeError, UnicodeDecodeError, SafetensorError, OSError) as err:
        raise BSIError(f"checkpoint in '{folder}' is damaged ({err}); start the run again") from None
    return tensors, plain
