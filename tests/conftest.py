"""Shared fixtures: tiny models built from configs, an isolated bsi cache, a two-process launcher."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # torch and transformers are imported where they are used: pytest-xdist's controller loads this
    # file before it starts the workers and runs no test, and their imports would hold every worker back
    # (`python bench/suite_costs.py --parts startup`: data/speed/suite-costs-2026-12-02-startup.json)
    from transformers import LlamaForCausalLM

#: The test tiers, one pytest marker each (``make test-fast``, ``make test-integration``, ``make test-e2e``; ``make
#: test`` runs them all). ``unit``: maths, statistics, configuration, data and docs, on tensors and text, no model
#: beyond a few toy layers (under a minute on 2 cores). ``e2e``: a real browser, executed notebooks, the real
#: embedded model, a GPU (also every test marked ``slow`` or ``gpu``). ``integration``: the rest, on tiny models
#: built from configs.
UNIT_FILES = frozenset({"test_theory.py", "test_stats.py", "test_estimator.py", "test_importance.py", "test_layers.py",
                        "test_imports.py", "test_config.py", "test_progress.py", "test_data.py", "test_docs.py",
                        "test_text.py", "test_results.py", "test_links.py", "test_style.py"})
E2E_FILES = frozenset({"test_app_browser.py", "test_notebooks.py", "test_walkthroughs.py", "test_real_model.py"})
TIERS = ("unit", "integration", "e2e")


#: what in an HTML page would fetch from the network: a script, stylesheet or image from another host, a CSS import
NETWORK = re.compile(r"""(?:<script[^>]*\bsrc|<link[^>]*\bhref|<img[^>]*\bsrc)\s*=\s*["']?\s*(?:https?:)?//"""
                     r"""|@import\s+(?:url\()?\s*["']?(?:https?:)?//|url\(\s*["']?(?:https?:)?//""", re.I)


def markdown_images(markdown: str) -> list[str]:
    """The targets of a Markdown page's images (``![alt](target)``), in order."""
    return re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", markdown)


def load_script(path: Path, name: str | None = None):
    """A Python file that is not in a package (a bench script, a notebook's source) loaded as a module.

    The module is registered in ``sys.modules`` under ``name`` (the file's stem when not given) before it runs,
    so dataclasses and pickling inside it can look it up.
    """
    name = name or path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def tier_of(item: pytest.Item) -> str:
    """The tier of one collected test: by its file, and ``e2e`` for anything marked ``slow`` or ``gpu``."""
    name = Path(str(item.fspath)).name
    if name in E2E_FILES or item.get_closest_marker("slow") or item.get_closest_marker("gpu"):
        return "e2e"
    return "unit" if name in UNIT_FILES else "integration"


#: where bench/test_durations.py's records are kept
SPEED_DATA = Path(__file__).resolve().parents[1] / "data" / "speed"


def recorded_file_seconds(folder: Path = SPEED_DATA) -> dict[str, float]:
    """Each test file's seconds in the newest recorded suite run on workers (``bench/test_durations.py``), or {}.

    Newest by the record's date and time (records before times were kept
    count as that day's earliest), a run on several workers (as ``make
    test`` runs) before one on one process; an unreadable record is passed over.
    """
    import json

    newest: tuple[str, str, bool, str] | None = None
    files: dict[str, float] = {}
    for path in folder.glob("test-durations-*.json"):
        try:
            record = json.loads(path.read_text())
            key = (str(record["date"]), str(record.get("time_utc", "")), int(record["workers"]) > 1, path.name)
            if newest is None or key > newest:
                newest, files = key, {Path(name).name: float(s) for name, s in record["files"].items()}
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return files


#: the thread settings a process reads when it starts (torch's OpenMP pool, MKL's)
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def pytest_configure(config):
    """On a pytest-xdist worker, every process a test starts (a CLI run, the app, lm-eval, a rank) gets one thread.

    The worker itself runs each test on one thread (:func:`_threads_per_test`),
    but a child process reads its thread count from the environment when it
    starts and would take every core: beside the other worker's test that is
    three threads on two cores, and they slow each other down. A value the user
    set is kept.
    """
    if os.environ.get("PYTEST_XDIST_WORKER"):
        for name in THREAD_VARIABLES:
            os.environ.setdefault(name, "1")


def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(getattr(pytest.mark, tier_of(item)))
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # only on workers: a one-process run keeps the files' own order
        return
    # pytest-xdist (``--dist loadfile --no-loadscope-reorder``, as make test runs it) hands the files to the workers
    # in this order: the longest first, so that no long file is left for the end while the other worker idles
    # (longest-processing-time first). Without --no-loadscope-reorder it would put the files with most tests first.
    seconds = recorded_file_seconds()

    def start(item: pytest.Item) -> tuple[float, str]:
        return -seconds.get(Path(str(item.fspath)).name, 0.0), str(item.fspath)

    items.sort(key=start)  # stable: each file keeps its own order


@pytest.fixture(scope="session")
def _session_threads() -> int:
    """torch's threads when the session starts (a core each), read before any test or fixture lowers them."""
    import torch

    return torch.get_num_threads()


@pytest.fixture(autouse=True)
def _threads_per_test(_session_threads):
    """One process: every test on all the cores; pytest-xdist workers: one thread each, so that they do not thrash.

    On 2 cores the one-process suite took 10 min 49 s with every test on
    one thread and 9 min 25 s on both, 11 s of it one lm-eval process fewer
    (2026-11-28, data/speed/test-durations-2026-11-28-*.json; the real
    embedded model's test 64 s -> 39 s, the sweeps 49 s -> 37 s). Several
    fixtures set one thread for a whole file, so the count is set here for
    every test rather than inherited.
    """
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else _session_threads)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def isolated_cache(tmp_path, monkeypatch):
    """A private BSI_CACHE (fine-tune cache, tiny-model artefacts) for one test."""
    monkeypatch.setenv("BSI_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture()
def tiny():
    """The tiny random Llama and its tokenizer, as ``bsi`` loads them (a fresh copy for each test: tests train it)."""
    from bsi.models import TINY_MODEL, load_model_and_tokenizer

    return load_model_and_tokenizer(TINY_MODEL)


@contextmanager
def smoke_app(tmp_path, monkeypatch):
    """The dashboard on the smoke preset, served in-process on 127.0.0.1 (closed afterwards)."""
    monkeypatch.setenv("BSI_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("GRADIO_ANALYTICS_ENABLED", "False")
    from bsi.app import build_app

    demo = build_app(preset="smoke")
    demo.queue().launch(server_name="127.0.0.1", prevent_thread_lock=True, quiet=True)
    try:
        yield demo
    finally:
        demo.close()


def make_tiny_llama(tied: bool = False, vocab: int = 97, seed: int = 0) -> LlamaForCausalLM:
    """A 2-layer Llama with random weights (hidden 32), optionally with tied embeddings."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        tie_word_embeddings=tied, attn_implementation="eager",
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return LlamaForCausalLM(config).eval()


class LMLoss:
    """Next-token cross-entropy over all positions (a stand-in task loss for engine tests).

    Like bsi's answer-token loss it can count its terms (for the fisher
    curvature) and draw its labels from the model (for mc-fisher).
    """

    @staticmethod
    def _logits(model, batch):
        ids = batch["input_ids"]
        return model(input_ids=ids).logits[:, :-1].float(), ids[:, 1:]  # (B, T-1, V), (B, T-1)

    def __call__(self, model, batch):
        import torch

        logits, targets = self._logits(model, batch)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    @staticmethod
    def count(batch):
        ids = batch["input_ids"]
        return ids.shape[0] * (ids.shape[1] - 1)

    def sampled(self, model, batch, generator=None):
        import torch

        logits, _ = self._logits(model, batch)
        flat = logits.reshape(-1, logits.shape[-1])
        drawn = torch.multinomial(torch.softmax(flat.detach(), -1), 1, generator=generator).squeeze(1)
        return torch.nn.functional.cross_entropy(flat, drawn)


lm_loss = LMLoss()


def token_batches(vocab: int = 97, batch: int = 4, length: int = 16, seed: int = 1):
    """An endless, seeded stream of random token batches."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    while True:
        yield {"input_ids": torch.randint(0, vocab, (batch, length), generator=generator)}


def run_two_processes(script: str, args: list[str], cache: Path, folder: Path, timeout: int = 300) -> None:
    """Run python ``script`` (source text) as 2 CPU processes under torchrun (gloo), on this checkout's bsi.

    The script is written into ``folder``; ``args`` follow it on the command
    line. Fails the test with the processes' last output when one exits non-zero.
    """
    worker = folder / "worker.py"
    worker.write_text(script)
    root = str(Path(__file__).resolve().parents[1])  # this checkout's bsi, not an installed one
    env = dict(os.environ, BSI_CACHE=str(cache), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(worker), *args],
        env=env, capture_output=True, text=True, timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
