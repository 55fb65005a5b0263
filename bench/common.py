"""Shared pieces of the benchmarks: loading, real batches, interleaved timing, medians.

Every benchmark measures a *ratio* against a baseline timed in the same run,
interleaved with it (baseline, candidate, baseline, candidate, ...), so a
neighbour process that steals the CPU for a while slows both sides alike.
Each figure is the median over the repeats.
"""

from __future__ import annotations

import copy
import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch


@dataclass
class Timings:
    """Seconds per call for several named variants, measured interleaved."""

    seconds: dict[str, list[float]] = field(default_factory=dict)

    def add(self, name: str, value: float) -> None:
        self.seconds.setdefault(name, []).append(value)

    def median(self, name: str) -> float:
        return statistics.median(self.seconds[name])

    def to_dict(self) -> dict[str, dict[str, float | list[float]]]:
        return {n: {"median_s": self.median(n), "runs_s": v} for n, v in self.seconds.items()}


def timed(fn: Callable[[], object]) -> float:
    """Wall-clock seconds of one call."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def interleave(variants: dict[str, Callable[[int], object]], repeats: int, warmup: int = 1) -> Timings:
    """Call every variant once per repeat, in turn; ``fn(i)`` gets the repeat index.

    The first ``warmup`` rounds are run but not recorded (allocator and
    optimizer-state warm-up).
    """
    import sys

    out = Timings()
    for i in range(warmup + repeats):
        for name, fn in variants.items():
            seconds = timed(lambda: fn(i))
            print(f"  [{'warm-up' if i < warmup else f'repeat {i - warmup + 1}'}] {name}: {seconds:.2f} s",
                  file=sys.stderr, flush=True)
            if i >= warmup:
                out.add(name, seconds)
    return out


def load_embedded(dtype: torch.dtype = torch.float32, attn_implementation: str | None = None):
    """The embedded model and tokenizer (offline, from bsi's cache)."""
    from bsi.models import EMBEDDED_MODEL, load_model_and_tokenizer

    return load_model_and_tokenizer(EMBEDDED_MODEL, dtype=dtype, attn_implementation=attn_implementation)


def real_batches(tokenizer, batch_size: int, max_length: int, count: int, seed: int = 0) -> list[dict]:
    """``count`` mini-batches of the embedded task, exactly as the pipeline makes them."""
    from bsi.data import BatchStream, load_task

    task = load_task("embedded-math", test_size=100, seed=0)
    stream = BatchStream(task.train, tokenizer, batch_size=batch_size, max_length=max_length, seed=seed)
    return [next(stream) for _ in range(count)]


@dataclass
class FirstRound:
    """Round 1 of a compression opened exactly as the engine opens it: bases converted, pools drawn."""

    config: object  # the PipelineConfig of the preset
    compressor: object  # the bsi.method.engine.Compressor
    tokenizer: object
    names: list[str]
    layers: list  # the BasisLinear layers, in ``names`` order
    pools: list[torch.Tensor]  # per layer, (p_l,) candidate-pool positions


def open_first_round(model_spec: str, preset: str) -> FirstRound:
    """Load ``model_spec`` in fp32, convert it with ``preset``'s bases and open round 1 (its candidate pools)."""
    from bsi.config import make_config
    from bsi.method.engine import Compressor
    from bsi.models import load_model_and_tokenizer
    from bsi.pipeline.losses import answer_token_loss

    config = make_config(preset, {"model": model_spec})
    comp = config.compress
    model, tokenizer = load_model_and_tokenizer(model_spec, dtype=torch.float32)
    calibration = real_batches(tokenizer, config.batch_size, config.max_length, comp.calibration_batches, seed=7)
    compressor = Compressor(model, iter(calibration), comp, answer_token_loss)
    for _ in compressor.convert():
        pass
    stats = compressor._open_round()
    names = list(compressor.names)
    return FirstRound(config, compressor, tokenizer, names, [compressor.layers[n] for n in names],
                      [stats[n].pool for n in names])


def tokens_in(batch: dict) -> int:
    """Real (non-padding) tokens of a batch."""
    return int(batch["attention_mask"].sum()) if "attention_mask" in batch else batch["input_ids"].numel()


def clone_model(model: torch.nn.Module) -> torch.nn.Module:
    return copy.deepcopy(model)


def machine() -> dict[str, object]:
    """What the figures were measured on."""
    import os
    import platform

    info: dict[str, object] = {
        "cpu": platform.processor() or platform.machine(),
        "cores_visible": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
        info["load_average_1m"] = os.getloadavg()[0]
    except OSError:
        pass
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def peak_rss_mib() -> float:
    """Peak resident memory of this process so far, in MiB.

    Linux's ``VmHWM`` belongs to the current address space, so it starts afresh
    at ``exec``; ``ru_maxrss`` does not (it keeps the forking parent's peak),
    which would credit a worker with the memory of the benchmark that spawned it.
    """
    try:
        with open("/proc/self/status", encoding="utf-8") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
