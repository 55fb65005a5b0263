"""``bsi sweep``: a comparison study of every method at every size (see :mod:`bsi.pipeline.sweep`).

The study's own settings (methods, targets, seeds, protocols, learning-rate
grid) come from the preset's entry in :data:`bsi.config.SWEEP_PRESETS` and
the flags below; the pipeline settings (schedule, recovery, evaluation) from
the preset and the configuration flags, as in ``bsi compress``.
"""

from __future__ import annotations

import argparse
import math

from bsi.cli.commands import build_config
from bsi.cli.flags import add_config_flags, overrides_from_args

#: set per cell or per run, so not flags of the sweep
PER_CELL = ("compress.score", "compress.size_mode", "compress.target_ratio", "compress.keep_ratio", "preset",
            "seed", "protocol")


#: SweepConfig fields that are no flag of their own: per-protocol pipeline settings (a preset sets them), and the
#: truncation baselines' settings (their flags are --alpha and --allocation, BaselineConfig's own fields).
NOT_FLAGS = ("protocol_settings", "baseline")

#: List flags whose empty value means something (``--lr-grid none``: no grid, the recover section's lr).
MAY_BE_EMPTY = ("lr_grid", "lr_targets")

#: What a flag's value looks like, by the field's type: comma-separated values, or KEY:VALUE pairs.
_LIST_KINDS = {"tuple[str,...]": str, "tuple[float,...]": float, "tuple[int,...]": int}
_PAIR_KEYS = {"extra_targets": "METHOD", "protocol_targets": "PROTOCOL"}


def study_fields() -> list:
    """The :class:`~bsi.config.SweepConfig` fields that are flags of ``bsi sweep``, in declaration order."""
    import dataclasses

    from bsi.config import SweepConfig

    return [f for f in dataclasses.fields(SweepConfig) if f.name not in NOT_FLAGS]


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``bsi sweep``'s flags: the run's, one per study setting (generated from SweepConfig), and the pipeline's."""
    from bsi.config import PRESETS, SWEEP_PRESETS, SweepConfig

    defaults = SweepConfig().to_dict()

    def default_text(key: str) -> str:
        given = [f"{name}: {_text(values[key])}" for name, values in SWEEP_PRESETS.items() if key in values]
        fallback = _text(defaults[key]) if defaults[key] not in ((), {}) else "none"
        return f"the preset's, {'; '.join(given)}; else {fallback}" if given else fallback

    p.add_argument("--out", required=True, help="output folder (an existing sweep folder resumes or extends)")
    p.add_argument("--preset", choices=list(PRESETS), help="starting configuration, pipeline and study (default: default)")
    p.add_argument("--config", help="a JSON PipelineConfig file as the starting configuration instead of --preset "
                                    "(default: none, the preset)")
    study = p.add_argument_group("the study (SweepConfig)")
    for f in study_fields():
        help_text = f"{f.metadata.get('help', '')} (default: {default_text(f.name)})".replace("%", "%%")
        kind = str(f.type).replace(" ", "")
        if kind == "bool":
            study.add_argument(_flag(f.name), action=argparse.BooleanOptionalAction, default=None, help=help_text)
        elif kind == "int":
            study.add_argument(_flag(f.name), type=int, metavar="N", help=help_text)
        elif kind == "str":
            study.add_argument(_flag(f.name), metavar="METHOD", help=help_text)
        elif f.name in _PAIR_KEYS:
            study.add_argument(_flag(f.name), metavar=f"{_PAIR_KEYS[f.name]}:R,...", help=help_text)
        else:
            study.add_argument(_flag(f.name), metavar="A,B,...", help=help_text)
    p.add_argument("--alpha", type=float, help="ASVD's exponent (default: 0.5)")
    p.add_argument("--allocation", choices=("published", "uniform", "sensitivity"),
                   help="rank allocation of the truncation methods: published (sensitivity for asvd, uniform for "
                        "the others), uniform or sensitivity (default: published)")
    p.add_argument("--merge", metavar="FOLDER", action="append",
                   help="add the finished cells of FOLDER, the --out folder of this same sweep run on another machine "
                        "(repeatable), rewrite the tables and stop without running anything (default: none)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    add_config_flags(p, exclude=PER_CELL)


def _text(value) -> str:
    if isinstance(value, dict):
        return ",".join(f"{k}:{t:g}" for k, ts in value.items() for t in ts)
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (list, tuple)):
        return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
    return str(value)


def parse_pairs(text: str, flag: str = "--extra-targets", key: str = "METHOD") -> dict[str, list[float]]:
    """``"bsi:0.02,basel:0.02"`` -> ``{"bsi": [0.02], "basel": [0.02]}``, with a one-line error naming ``flag``."""
    from bsi.errors import BSIError

    out: dict[str, list[float]] = {}
    for item in (t.strip() for t in text.split(",") if t.strip()):
        name, sep, value = item.partition(":")
        try:
            out.setdefault(name.strip(), []).append(float(value))
        except ValueError:
            sep = ""
        if not sep:
            raise BSIError(f"{flag} takes {key}:RATIO items separated by commas, got '{item}'")
    return out


def settings_from_args(args: argparse.Namespace):
    """The study's :class:`~bsi.config.SweepConfig`: the preset's sweep settings, then the flags given."""
    from bsi.config import make_sweep_config
    from bsi.errors import BSIError
    from bsi.pipeline.sweep import parse_list

    given: dict = {}
    for f in study_fields():
        value = getattr(args, f.name, None)
        if value is None:
            continue
        kind = str(f.type).replace(" ", "")
        if kind in _LIST_KINDS:
            value = parse_list(value, _LIST_KINDS[kind], _flag(f.name), may_be_empty=f.name in MAY_BE_EMPTY)
        elif f.name in _PAIR_KEYS:
            value = parse_pairs(value, _flag(f.name), _PAIR_KEYS[f.name])
        given[f.name] = value
    preset = None if args.config else (args.preset or "default")
    try:
        settings = make_sweep_config(preset, given)
    except BSIError as err:  # "targets must be ..." -> "--targets must be ..." when the flag gave it
        field = str(err).split(" ", 1)[0]
        raise BSIError("--" + str(err).replace("_", "-", 1) if field in given else str(err)) from None
    baseline = dict(settings.baseline)
    if args.alpha is not None:
        baseline["alpha"] = args.alpha
    if args.allocation is not None:
        baseline["allocation"] = args.allocation
    if baseline != settings.baseline:
        settings = make_sweep_config(preset, given | {"baseline": baseline})
    return settings


def run(args: argparse.Namespace) -> int:
    from bsi.config import BaselineConfig
    from bsi.errors import BSIError
    from bsi.pipeline.sweep import CellReport, LearningRateReport, Sweep, sweep_results
    from bsi.progress import ProgressPrinter

    settings = settings_from_args(args)
    BaselineConfig.from_dict(settings.baseline)  # a bad baseline setting answers before any model loads
    for folder in args.merge or ():  # before --out is created
        try:
            sweep_results(folder)
        except BSIError as err:
            raise BSIError(f"--merge: {err}") from None
    sweep = Sweep(build_config(args), settings, args.out, overrides=overrides_from_args(args))
    speaks = sweep.dist.is_main  # under several processes, the first one prints
    if args.merge:
        merged = {folder: sweep.merge(folder) for folder in args.merge}
        if speaks:
            print((sweep.out_dir / "results.md").read_text(encoding="utf-8"))
            for folder, cells in merged.items():
                print(f"merged {len(cells)} cells from {folder} into {sweep.out_dir}")
        return 0
    printer = ProgressPrinter(enabled=not args.quiet and speaks)
    for report in sweep.run():
        if isinstance(report, (CellReport, LearningRateReport)):
            if not speaks:
                continue
            printer.close()
            print(describe(report), flush=True)
        else:
            printer.show(report)
    printer.close()
    if not speaks:
        return 0
    print((sweep.out_dir / "results.md").read_text(encoding="utf-8"))
    print(f"wrote {sweep.out_dir / 'results.jsonl'}, results.md, stats.json, figure.html and outcomes/ "
          f"({_duration(sweep)})")
    return 0


def describe(report) -> str:
    """One line for a finished cell or a learning-rate choice."""
    from bsi.pipeline.sweep import CellReport, row_key

    if isinstance(report, CellReport):
        r, metrics = report.row, report.row.metrics
        lr = f", lr {r.recover_lr:g}" if r.recover_lr is not None else ", no recovery"
        seconds = (r.run.recover_seconds if r.run else 0.0) + (r.eval_seconds or 0.0)
        state = "already done" if report.skipped else f"{seconds:.0f} s{lr}"
        if metrics.perplexity is not None:
            value = f"perplexity {metrics.perplexity:.3f}, mean next-token loss {metrics.loss:.4f}"
        else:
            acc = f"{100 * metrics.accuracy:.1f}%" if math.isfinite(metrics.accuracy) else "-"
            value = f"accuracy {acc}, loss {metrics.loss:.4f}"
        return f"[{report.index}/{report.total}] {row_key(r)}: {r.params_total:,} params, {value} ({state})"
    losses = ", ".join(f"{lr:g}: {loss:.4f}" for lr, loss in report.losses.items())
    return (f"learning rate for {report.method} ({report.protocol}) near {report.target:g}: {report.chosen:g} "
            f"(validation loss {losses})")


def _duration(sweep) -> str:
    import time

    seconds = time.perf_counter() - sweep.started
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min this session"
