"""Safe file writing: nothing half-written, nothing overwritten by surprise.

* :func:`atomic_write_text` writes a file through a temporary sibling and
  ``os.replace``, so readers see the old file or the new one, never a mix.
* :func:`check_output_dir` validates an output folder *before* any work starts.
* :func:`atomic_directory` builds a whole output folder in a temporary sibling
  and swaps it into place only when everything in it was written.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bsi.errors import BSIError

#: A folder holding any of these was written by bsi and may be replaced.
BSI_MARKERS = ("bsi_config.json", "summary.json", "results.jsonl", "spectrum.json", "compare.json", "checkpoint")


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temporary file in the same folder, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: str | Path, data: Any) -> None:
    """JSON version of :func:`atomic_write_text` (indented, keys sorted)."""
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def check_output_dir(path: str | Path) -> Path:
    """Validate an output folder before any work: it must be new, empty, or a previous bsi output.

    Raises:
        BSIError: when ``path`` is a file, or a non-empty folder bsi did not write.
    """
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise BSIError(f"output directory '{path}' is a file; pass a folder path to --out")
    if path.is_dir() and any(path.iterdir()) and not any((path / m).exists() for m in BSI_MARKERS):
        raise BSIError(f"output directory '{path}' is not empty and was not written by bsi; choose a new folder")
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not os.access(parent, os.W_OK):
        raise BSIError(f"cannot write under '{parent}'; choose a writable --out folder")
    return path


@contextmanager
def atomic_directory(path: str | Path) -> Iterator[Path]:
    """Yield a temporary folder; on success it replaces ``path`` whole, on error it vanishes.

    The previous content of ``path`` (a bsi output, see :func:`check_output_dir`)
    is removed only after the new folder is complete.
    """
    path = check_output_dir(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent))
    os.chmod(tmp, 0o777 & ~_umask())
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if path.exists():
        old = path.parent / f".{path.name}.old-{os.getpid()}"
        os.replace(path, old)
    os.replace(tmp, path)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
