"""``bsi sweep``: every method at every target size, one table, one figure.

A sweep is a grid of *cells* (method, target ratio). Each cell runs the same
three-stage pipeline (:class:`~bsi.pipeline.runner.Pipeline` with the cell's method); the task
fine-tune is cached by hash, so it runs once for the whole grid, and the
fine-tuned dense model is evaluated once, as the ``dense`` reference row.
After each cell the compressed model's generation speed is measured against
the dense model *in the same call* (:mod:`bsi.analysis.speed`).

Outputs in ``--out DIR``, all rewritten atomically after every cell:

* ``results.jsonl`` — one JSON object per finished cell (the reference first);
* ``results.md`` — the markdown table;
* ``figure.html`` — accuracy and answer-token loss against model size, one
  line per method (standalone plotly HTML, opens offline).

Resuming: cells already in ``results.jsonl`` are skipped, so an interrupted
sweep continues where it stopped. Every row records a fingerprint of the
settings; a folder holding a sweep with other settings is refused rather than
mixed. Seeds are fixed (``--seed``, recorded), so on CPU the same sweep gives
the same accuracies and losses (times and speeds vary, of course).

Several processes (``torchrun ... -m bsi sweep``, see
:mod:`bsi.pipeline.distributed`): every cell is an ordinary
:class:`~bsi.pipeline.runner.Pipeline`, so all processes compress it together
(summed statistics, averaged gradients, their own probes; ``--fsdp`` shards the
bases) and end with the same model. Rank 0 measures the speeds and writes the
files; its rows are every process's rows.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bsi.config import CompressConfig, PipelineConfig, deep_update
from bsi.errors import BSIError
from bsi.pipeline.evaluate import Metrics
from bsi.files import atomic_write_text, check_output_dir, json_object
from bsi.pipeline.methods import METHODS, BaselineConfig, get_method
from bsi.models import load_model_and_tokenizer
from bsi.pipeline.distributed import from_environment
from bsi.pipeline.runner import Pipeline, Report
from bsi.method.surgery import compressible_parameters
from bsi.reports import DoneReport, StageReport
from bsi.analysis.figures import results_figure  # drawn in bsi.analysis.figures, re-exported here
from bsi.analysis.speed import measure_speeds

REFERENCE = "dense"


@dataclass(frozen=True)
class CellReport:
    """One cell of the grid finished (or was found finished: ``skipped``)."""

    index: int  # 1-based position in the grid
    total: int
    row: dict
    skipped: bool = False


def cell_key(method: str, target: float) -> str:
    return f"{method}@{target:g}"


def parse_targets(text: str) -> list[float]:
    """``"0.8,0.6"`` -> [0.8, 0.6]; each in (0, 1], no duplicates."""
    try:
        values = [float(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise BSIError(f"--targets must be comma-separated numbers in (0, 1], got '{text}'") from None
    if not values or not all(0 < v <= 1 for v in values):
        raise BSIError(f"--targets must be numbers in (0, 1], got '{text}'")
    if len(set(values)) != len(values):
        raise BSIError(f"--targets has duplicates: '{text}'")
    return values


def parse_methods(text: str) -> list[str]:
    names = [m.strip() for m in text.split(",") if m.strip()]
    if not names:
        raise BSIError(f"--methods must name at least one of {', '.join(METHODS)}")
    for name in names:
        get_method(name)
    if len(set(names)) != len(names):
        raise BSIError(f"--methods has duplicates: '{text}'")
    return names


class Sweep:
    """The grid of (method, target) cells over one model, task and schedule.

    Args:
        config: the shared pipeline settings (its ``compress`` size mode is
            replaced per cell by the cell's ``target_ratio``).
        methods: registered method names.
        targets: target ratios of the compressible layers' parameters.
        out_dir: where the three outputs go (new, or a previous sweep to resume).
        baseline: settings of the SVD-family methods.
        speed_tokens, speed_repeats: generation-speed measurement (repeats 0: skip it).
    """

    def __init__(self, config: PipelineConfig, methods: Sequence[str], targets: Sequence[float],
                 out_dir: str | Path, baseline: BaselineConfig | None = None, *, speed_tokens: int = 32,
                 speed_repeats: int = 3, cache_dir: str | Path | None = None) -> None:
        self.config = config
        self.methods = [get_method(m).name for m in methods]
        self.targets = list(targets)
        if not self.methods or not self.targets:
            raise BSIError("a sweep needs at least one method and one target")
        if not all(0 < t <= 1 for t in self.targets):
            raise BSIError(f"targets must be in (0, 1], got {self.targets}")
        if speed_repeats and speed_tokens < 2:
            raise BSIError(f"speed_tokens must be >= 2, got {speed_tokens}")
        self.out_dir = check_output_dir(out_dir)
        self.baseline = baseline or BaselineConfig()
        self.speed_tokens, self.speed_repeats = speed_tokens, speed_repeats
        self.cache_dir = cache_dir
        self.dist = from_environment()  # several processes: see bsi.pipeline.distributed
        self.rows: list[dict] = self._read_rows()
        self._check_fingerprint()

    # ---------------------------------------------------------------- files
    @property
    def results_path(self) -> Path:
        return self.out_dir / "results.jsonl"

    def fingerprint(self) -> str:
        """Hash of everything except the grid: rows with another fingerprint belong to another sweep."""
        baseline = {k: v for k, v in self.baseline.to_dict().items() if v is not None}  # unset: as before they existed
        settings = {"config": self.config.to_dict() | {"compress": None}, "compress": self._shared_compress(),
                    "baseline": baseline, "version": 1}
        return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]

    def _shared_compress(self) -> dict:
        return {k: v for k, v in self.config.compress.to_dict().items()
                if k not in ("score", "size_mode", "keep_ratio", "target_ratio")}

    def _read_rows(self) -> list[dict]:
        if not self.results_path.is_file():
            return []
        rows = []
        for number, line in enumerate(self.results_path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            rows.append(json_object(line, number, self.results_path))  # a bad line: fix or delete the file
        return rows

    def _check_fingerprint(self) -> None:
        mine = self.fingerprint()
        for row in self.rows:
            if row.get("fingerprint") != mine:
                raise BSIError(
                    f"'{self.out_dir}' holds a sweep made with other settings (model, data, schedule or seed); "
                    "use a new --out folder to run this one"
                )

    def write(self) -> None:
        """Rewrite results.jsonl, results.md and figure.html from the rows (each atomically; rank 0 only)."""
        if not self.dist.is_main:
            return
        atomic_write_text(self.results_path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in self.rows))
        atomic_write_text(self.out_dir / "results.md", results_table(self.rows, self.methods))
        atomic_write_text(self.out_dir / "figure.html", results_figure(self.rows).to_html(include_plotlyjs=True,
                                                                                           full_html=True))

    # ----------------------------------------------------------------- grid
    def cells(self) -> list[tuple[str, float]]:
        """Target-major order (every method at the first target, then the next), so a
        partial sweep still compares all methods at the targets it reached."""
        return [(m, t) for t in self.targets for m in self.methods]

    def done(self) -> set[str]:
        return {cell_key(r["method"], r["target"]) for r in self.rows}

    def config_for(self, method: str, target: float) -> PipelineConfig:
        comp: dict[str, Any] = {"target_ratio": target, "size_mode": "target"}
        score = getattr(get_method(method), "score", None)
        cell: dict[str, Any] = {"compress": comp}
        if score is not None:
            comp["score"] = score
        else:  # a truncation baseline: its own recovery, where one is set
            cell["recover"] = self.baseline.recover_overrides()
        return PipelineConfig.from_dict(deep_update(self.config.to_dict(), cell))

    def _row(self, method: str, target: float, summary: dict, speeds: dict) -> dict:
        after = summary.get("metrics_after") or {}
        row = {
            "method": method, "target": target, "fingerprint": self.fingerprint(), "seed": self.config.seed,
            "params_total": summary["params_after"], "params_before": summary["params_before"],
            "compression_ratio": summary["params_before"] / summary["params_after"],
            "compressible_ratio": summary["compressible_ratio"],
            "accuracy": after.get("accuracy"), "loss": after.get("loss"), "examples": after.get("examples"),
            "seconds": summary["seconds"],
        }
        if speeds:
            dense, mine = speeds[REFERENCE], speeds["model"]
            row.update(tokens_per_s=mine.tokens_per_s, ms_per_token=mine.ms_per_token,
                       dense_tokens_per_s=dense.tokens_per_s, dense_ms_per_token=dense.ms_per_token,
                       speedup=mine.tokens_per_s / dense.tokens_per_s)
        return row

    # ------------------------------------------------------------------ run
    def run(self) -> Iterator[Report | CellReport]:
        """Run the missing cells; yields every pipeline report and a CellReport per cell."""
        reference = next((r for r in self.rows if r["method"] == REFERENCE), None)
        if reference is None:
            reference = yield from self._reference()
        finetuned = Metrics(reference["accuracy"], reference["loss"], reference["examples"]) \
            if reference.get("accuracy") is not None else None
        speed_model = None
        if self.speed_repeats and self.dist.is_main:  # one process times decoding; the others would disturb it
            speed_model, speed_tokenizer = self._plain_model()
        cells = self.cells()
        for index, (method, target) in enumerate(cells, start=1):
            if cell_key(method, target) in self.done():
                row = next(r for r in self.rows if cell_key(r["method"], r["target"]) == cell_key(method, target))
                yield CellReport(index, len(cells), row, skipped=True)
                continue
            pipeline = Pipeline(self.config_for(method, target), cache_dir=self.cache_dir, method=method,
                                baseline=self.baseline, reference=finetuned)
            summary = None
            for report in pipeline.run():
                if isinstance(report, DoneReport):
                    summary = report.summary
                yield report
            assert summary is not None
            speeds = {}
            if speed_model is not None:
                yield StageReport("speed", "start", cell_key(method, target))
                speeds = measure_speeds({REFERENCE: speed_model, "model": pipeline.model}, speed_tokenizer,
                                        new_tokens=self.speed_tokens, repeats=self.speed_repeats)
                yield StageReport("speed", "end")
            row = self.dist.from_main(self._row(method, target, summary, speeds))  # rank 0's timings everywhere
            self.rows.append(row)
            self.write()
            yield CellReport(index, len(cells), row)
        self.dist.barrier()  # the files are complete when any process returns

    def _reference(self) -> Iterator[Report]:
        """Fine-tune (cached) and evaluate the dense model once: the grid's reference row."""
        pipeline = Pipeline(self.config, cache_dir=self.cache_dir)
        yield from pipeline.reference_stage()
        metrics = pipeline.reference
        now, dense = compressible_parameters(pipeline.model)
        row = {
            "method": REFERENCE, "target": 1.0, "fingerprint": self.fingerprint(), "seed": self.config.seed,
            "params_total": pipeline.params_before, "params_before": pipeline.params_before, "compression_ratio": 1.0,
            "compressible_ratio": now / dense, "accuracy": metrics.accuracy if metrics else None,
            "loss": metrics.loss if metrics else None, "examples": metrics.examples if metrics else None,
            "seconds": 0.0, "settings": {"config": self.config.to_dict(), "baseline": self.baseline.to_dict(),
                                         "speed_tokens": self.speed_tokens, "speed_repeats": self.speed_repeats},
        }
        row = self.dist.from_main(row)
        self.rows.insert(0, row)
        self.write()
        return row

    def _plain_model(self):
        """The original dense model, the speed reference (weights do not change speed)."""
        from bsi.models import resolve_device, resolve_dtype

        device = resolve_device(self.config.device)
        return load_model_and_tokenizer(self.config.model, dtype=resolve_dtype(self.config.dtype, device),
                                        device=device, cache_dir=self.cache_dir)


# ----------------------------------------------------------------- outputs
def _fmt(value: Any, spec: str, scale: float = 1.0) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value * scale, spec)


def results_table(rows: Sequence[dict], methods: Sequence[str] | None = None) -> str:
    """The markdown table of a sweep: reference first, then each method from large to small."""
    order = {m: i for i, m in enumerate([REFERENCE, *(methods or METHODS)])}
    ordered = sorted(rows, key=lambda r: (order.get(r["method"], len(order)), -r["target"]))
    head = ["method", "target", "params (M)", "compression", "compressible kept", "accuracy", "loss",
            "ms/token", "tokens/s", "speed vs dense", "time (s)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in ordered:
        # one speed: decode latency; tokens/s and the ratio are derived from it (stated under the table)
        ms, dense_ms = r.get("ms_per_token"), r.get("dense_ms_per_token")
        per_s = 1000.0 / ms if ms else None
        vs_dense = dense_ms / ms if ms and dense_ms else None
        lines.append("| " + " | ".join([
            r["method"], _fmt(r["target"], ".2f"), _fmt(r["params_total"], ".2f", 1e-6),
            _fmt(r["compression_ratio"], ".2f") + "x", _fmt(r["compressible_ratio"], ".1%"),
            _fmt(r.get("accuracy"), ".1%"), _fmt(r.get("loss"), ".4f"), _fmt(ms, ".2f"), _fmt(per_s, ".1f"),
            _fmt(vs_dense, ".2f") + ("x" if vs_dense else ""), _fmt(r.get("seconds"), ".0f"),
        ]) + " |")
    ref = next((r for r in rows if r["method"] == REFERENCE), None)
    notes = []
    if ref is not None:
        cfg = ref.get("settings", {}).get("config", {})
        notes.append(f"Model `{cfg.get('model')}` on `{cfg.get('data')}`, preset `{cfg.get('preset')}`, "
                     f"seed {ref.get('seed')}, {ref.get('examples')} test examples.")
        if cfg.get("compress"):
            notes.append(schedule_note(cfg, ref.get("settings", {}).get("baseline")))
    notes.append("`target`: parameters of the compressible layers after / before; `compression`: whole model "
                 "before / after. Speed is decode speed, measured side by side with the dense model (greedy, "
                 "batch 1, median): `ms/token` is the time of one more token once the prompt is processed, "
                 "`tokens/s` = 1000 / ms/token, `speed vs dense` = the dense model's ms/token / this model's.")
    return "\n".join(notes) + "\n\n" + "\n".join(lines) + "\n"


def schedule_note(config: dict, baseline: dict | None = None) -> str:
    """One sentence on the engine methods' schedule and the recovery stage of a sweep's config and baseline dicts."""
    comp = CompressConfig.from_dict(config["compress"])
    recover = config["recover"]
    if comp.curvature == "hutchinson":
        eps = "the dtype's rule" if comp.eps is None else f"{comp.eps:g}"
        curvature = (f"hutchinson curvature, {comp.probes_per_batch} probe(s) per batch ({comp.probe_scope} scope, "
                     f"{comp.hessian_method}, eps {eps})")
    else:
        curvature = f"{comp.curvature} curvature"
    distill = f", distillation weight {recover.get('distill', 0):g}" if recover.get("distill") else ""
    selection = ("global selection for bsi and bsi-grad, mass for basel" if comp.selection == "auto"
                 else f"{comp.selection} selection")
    window = "every batch of a round" if comp.score_window == "round" else "the profiling batches"
    return (f"Engine methods (basel, bsi-grad, bsi): {comp.bases} bases, {comp.rounds} rounds of {comp.round_length} "
            f"iterations, the last {comp.profiling_iters} of each profiling ({curvature}; {selection}; bsi scores "
            f"{window}, first-order terms kept beyond {comp.gradient_z:g} standard errors). "
            f"Every method: {recover['steps']} recovery steps training {recover.get('train', 'sigma')}{distill}"
            f"{baseline_recovery_note(baseline or {}, recover)}.")


def baseline_recovery_note(baseline: dict, recover: dict) -> str:
    """``"; the truncation baselines (svd, ...) instead: 64 steps at lr 0.0001"`` when theirs differs, else ``""``."""
    steps, lr = baseline.get("recover_steps"), baseline.get("recover_lr")
    if steps is None and lr is None:
        return ""
    names = ", ".join(name for name, method in METHODS.items() if getattr(method, "score", None) is None)
    return (f"; the truncation baselines ({names}) instead: {recover['steps'] if steps is None else steps}"
            f" steps at lr {recover['lr'] if lr is None else lr:g}")
