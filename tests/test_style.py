"""The code's style, checked by the tools that keep it: ruff over the whole checkout, mypy --strict where it is typed.

Both read their settings from ``pyproject.toml`` (``[tool.ruff]``, ``[tool.mypy]``),
so ``ruff check .`` and ``mypy`` at the command line say what these tests say.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bsi.models import cache_root

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    """The tool installed beside this Python (``make setup`` puts both there), or a skip when it is missing."""
    path = BIN / name
    if path.is_file():
        return str(path)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: `make setup` installs the test tools (pip install -e '.[test]')")
    return found


def test_ruff_finds_nothing():
    result = subprocess.run([tool("ruff"), "check", "--no-cache", "--output-format", "concise", "."], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, f"ruff check . (fix with `ruff check --fix .`):\n{result.stdout}{result.stderr}"


def test_mypy_strict_finds_nothing_in_the_typed_packages():
    """Layers 0 to 3 (the foundation modules, ``bsi/config``, ``bsi/data``, ``bsi/method``): strict.

    ``pyproject.toml`` names the scope. mypy keeps its incremental cache in
    bsi's cache folder (``$MYPY_CACHE_DIR`` when set), not in the checkout:
    most of a cold run is spent reading torch's types (about 7 s on 2 cores;
    45 s while it also read transformers', 14 s while it also read
    huggingface_hub's, which ``pyproject.toml`` now reads as untyped), which
    a fresh clone on the same machine would otherwise read again. mypy re-checks every module whose source changed
    since the cached run (it compares their hashes), so the cache saves time
    and never hides an error.
    """
    cache = os.environ.get("MYPY_CACHE_DIR") or str(cache_root() / "mypy")
    result = subprocess.run([tool("mypy"), "--cache-dir", cache], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, f"mypy:\n{result.stdout}{result.stderr}"
