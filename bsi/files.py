"""Safe file writing: nothing half-written, nothing overwritten by surprise.

* :func:`atomic_write_text` writes a file through a temporary sibling and
  ``os.replace``, so readers see the old file or the new one, never a mix.
* :func:`check_output_dir` validates an output folder *before* any work
  starts, including a real test write; :func:`refuse_to_replace` keeps a
  finished result from being overwritten unless asked (``--force``).
* :func:`atomic_directory` builds a whole output folder in a temporary sibling
  and swaps it into place only when everything in it was written.

Every file written this way gets the mode a plain ``open()`` would give it
(``0666`` minus the umask), whatever the writer used (safetensors writes
``0600``).
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
BSI_MARKERS = ("bsi_config.json", "summary.json", "results.jsonl", "spectrum.json", "compare.json", "checkpoint",
               "bsi_export.json", "sweep.lock")


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def json_object(line: str, number: int, path: str | Path) -> dict[str, Any]:
    """Line ``number`` of the JSONL file ``path`` as a dict, or a BSIError naming the line and what is wrong.

    The one JSONL line reader: task files, sweep results and prompt files all go through it.
    """
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise BSIError(f"{path}, line {number}: malformed JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(record, dict):
        raise BSIError(f"{path}, line {number}: expected a JSON object, got {type(record).__name__}")
    return record


def set_default_mode(path: str | Path) -> None:
    """Give ``path`` and everything under it the modes a plain ``open()``/``mkdir()`` would.

    Files get ``0666`` minus the umask, folders ``0777`` minus the umask
    (temporary files and folders start private, and safetensors writes ``0600``).
    """
    path = Path(path)
    umask = _umask()
    for item in [path, *(path.rglob("*") if path.is_dir() else [])]:
        if item.is_symlink():
            continue
        os.chmod(item, (0o777 if item.is_dir() else 0o666) & ~umask)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temporary file in the same folder, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        set_default_mode(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, as UTF-8 (see :func:`atomic_write_bytes`)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, data: Any) -> None:
    """JSON version of :func:`atomic_write_text` (indented, keys sorted)."""
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def check_output_dir(path: str | Path) -> Path:
    """Validate an output folder before any work: it must be new, empty, or a previous bsi output, and writable.

    Writability is tested by writing: a small temporary file is created and
    removed in the folder (or in its nearest existing parent, where the
    folder will be created), so a read-only disk or a pseudo file system such
    as ``/proc`` is refused now rather than after an hour of work.

    Raises:
        BSIError: when ``path`` is a file, a non-empty folder bsi did not write,
            or a place where nothing can be written.
    """
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise BSIError(f"output directory '{path}' is a file; pass a folder path to --out")
    if path.is_dir() and any(path.iterdir()) and not existing_output(path):
        raise BSIError(f"output directory '{path}' is not empty and was not written by bsi; choose a new folder")
    probe_dir = path
    while not probe_dir.is_dir():
        probe_dir = probe_dir.parent
    try:
        fd, probe = tempfile.mkstemp(prefix=".bsi-write-test-", dir=probe_dir)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise BSIError(f"cannot write in '{probe_dir}' ({err.strerror or err}); choose a writable --out folder") from None
    return path


def existing_output(path: str | Path) -> list[str]:
    """The bsi output files and folders (:data:`BSI_MARKERS`) that ``path`` holds; empty for a new folder."""
    path = Path(path).expanduser()
    return [m for m in BSI_MARKERS if (path / m).exists()] if path.is_dir() else []


def refuse_to_replace(path: str | Path, force: bool) -> None:
    """Raise unless ``path`` holds no bsi result yet or ``force`` allows replacing it.

    Raises:
        BSIError: naming what the folder holds and the two ways on.
    """
    found = existing_output(path)
    if found and not force:
        raise BSIError(f"'{path}' already holds a result ({', '.join(found)}); choose a new output folder, "
                       "or replace it with --force")


@contextmanager
def folder_lock(folder: str | Path, what: str, name: str = "sweep.lock") -> Iterator[None]:
    """Hold ``folder`` for one writer: a second process that asks while it is held gets a one-line error.

    A sweep reads its folder's rows, adds to them and rewrites the files; two
    sweeps on one folder would each rewrite ``results.jsonl`` without the
    other's rows. The lock is an advisory ``flock`` on ``folder/name``, which
    holds the owner's process id (named in the error). The operating system
    releases it when the process ends, however it ends, so a killed run
    leaves no stale lock behind. Where ``fcntl`` does not exist (Windows) the
    folder is not locked.

    Raises:
        BSIError: when another process holds the folder.
    """
    try:
        import fcntl
    except ImportError:  # no advisory locks here: run one writer per folder by hand
        yield
        return
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    handle = open(folder / name, "a+", encoding="utf-8")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            owner = handle.read().strip() or "unknown"
            raise BSIError(f"'{folder}' is in use by another {what} (process {owner}): wait for it to end, "
                           "or give another --out folder") from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
    finally:
        handle.close()


@contextmanager
def atomic_directory(path: str | Path) -> Iterator[Path]:
    """Yield a temporary folder; on success it replaces ``path`` whole, on error it vanishes.

    The previous content of ``path`` (a bsi output, see :func:`check_output_dir`)
    is removed only after the new folder is complete.
    """
    path = check_output_dir(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent))
    try:
        yield tmp
        set_default_mode(tmp)
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
