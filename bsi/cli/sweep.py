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
from bsi.config import METHOD_NAMES, PROTOCOL_NAMES, VARIANT_NAMES

#: set per cell or per run, so not flags of the sweep
PER_CELL = ("compress.score", "compress.size_mode", "compress.target_ratio", "compress.keep_ratio", "preset",
            "seed", "protocol")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from bsi.config import PRESETS, SWEEP_PRESETS

    def preset_value(key: str) -> str:
        given = [f"{name}: {_text(values[key])}" for name, values in SWEEP_PRESETS.items() if key in values]
        return "; ".join(given) or "none"

    p.add_argument("--out", required=True, help="output folder (an existing sweep folder resumes or extends)")
    p.add_argument("--preset", choices=list(PRESETS), help="starting configuration, pipeline and study (default: default)")
    p.add_argument("--config", help="a JSON PipelineConfig file as the starting configuration instead of --preset "
                                    "(default: none, the preset)")
    p.add_argument("--methods", help=f"comma-separated methods (default: the preset's, {preset_value('methods')}; "
                                     f"else all: {','.join(METHOD_NAMES)}; named variants, only when named: "
                                     f"{','.join(VARIANT_NAMES)})")
    p.add_argument("--targets", help="comma-separated target ratios of the compressible layers' parameters, for every "
                                     f"method (default: the preset's, {preset_value('targets')}; else 0.6,0.4,0.25)")
    p.add_argument("--extra-targets", metavar="METHOD:R,...",
                   help="targets for some methods only, e.g. bsi:0.02,basel:0.02 (default: the preset's, "
                        f"{preset_value('extra_targets')})")
    p.add_argument("--seeds", help=f"comma-separated run seeds (default: the preset's, {preset_value('seeds')}; else 0)")
    p.add_argument("--protocols", help=f"comma-separated protocols of the engine methods, {' or '.join(PROTOCOL_NAMES)} "
                                       f"(default: the preset's, {preset_value('protocols')}; else tuned)")
    p.add_argument("--lr-grid", help="comma-separated recovery learning rates; each method's is chosen from them by "
                                     "validation loss, which needs --validation-size (default: the preset's, "
                                     f"{preset_value('lr_grid')}; else none: --recover-lr for every method)")
    p.add_argument("--lr-targets", help="comma-separated targets where the learning rate is chosen, by the first seed run "
                                        f"(default: the preset's, {preset_value('lr_targets')}; else every target)")
    p.add_argument("--alpha", type=float, help="ASVD's exponent (default: 0.5)")
    p.add_argument("--allocation", choices=("published", "uniform", "sensitivity"),
                   help="rank allocation of the truncation methods: published (sensitivity for asvd, uniform for "
                        "the others), uniform or sensitivity (default: published)")
    p.add_argument("--also-unrecovered", action=argparse.BooleanOptionalAction, default=None,
                   help="also evaluate every method's model of every size before recovery (rows with recover_steps 0, "
                        "a table of their own) (default: the preset's, "
                        f"{preset_value('also_unrecovered')}; else off)")
    p.add_argument("--speed-repeats", type=int, help="decode-speed timings per model against the dense one, 0 for "
                                                     "none (default: 0)")
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


def parse_extra_targets(text: str) -> dict[str, list[float]]:
    """``"bsi:0.02,basel:0.02"`` -> ``{"bsi": [0.02], "basel": [0.02]}``."""
    from bsi.errors import BSIError

    out: dict[str, list[float]] = {}
    for item in (t.strip() for t in text.split(",") if t.strip()):
        method, sep, value = item.partition(":")
        try:
            out.setdefault(method.strip(), []).append(float(value))
        except ValueError:
            sep = ""
        if not sep:
            raise BSIError(f"--extra-targets takes METHOD:RATIO items separated by commas, got '{item}'")
    return out


def settings_from_args(args: argparse.Namespace):
    """The study's :class:`~bsi.config.SweepConfig`: the preset's sweep settings, then the flags given."""
    from bsi.config import make_sweep_config
    from bsi.errors import BSIError
    from bsi.pipeline.sweep import parse_list

    given: dict = {}
    if args.methods is not None:
        given["methods"] = parse_list(args.methods, str, "--methods")
    if args.targets is not None:
        given["targets"] = parse_list(args.targets, float, "--targets")
    if args.extra_targets is not None:
        given["extra_targets"] = parse_extra_targets(args.extra_targets)
    if args.seeds is not None:
        given["seeds"] = parse_list(args.seeds, int, "--seeds")
    if args.protocols is not None:
        given["protocols"] = parse_list(args.protocols, str, "--protocols")
    if args.lr_grid is not None:
        given["lr_grid"] = parse_list(args.lr_grid, float, "--lr-grid")
    if args.lr_targets is not None:
        given["lr_targets"] = parse_list(args.lr_targets, float, "--lr-targets")
    if args.speed_repeats is not None:
        given["speed_repeats"] = args.speed_repeats
    if args.also_unrecovered is not None:
        given["also_unrecovered"] = args.also_unrecovered
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
    from bsi.errors import BSIError
    from bsi.pipeline.methods import BaselineConfig
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
        r = report.row
        lr = f", lr {r['recover_lr']:g}" if r.get("recover_lr") is not None else ", no recovery"
        state = "already done" if report.skipped else \
            f"{r.get('recover_seconds', 0) + r.get('eval_seconds', 0):.0f} s{lr}"
        if r.get("perplexity") is not None:
            value = f"perplexity {r['perplexity']:.3f}, mean next-token loss {r['loss']:.4f}"
        else:
            acc = f"{100 * r['accuracy']:.1f}%" if r.get("accuracy") is not None and math.isfinite(r["accuracy"]) else "-"
            value = f"accuracy {acc}, loss {r['loss']:.4f}"
        return f"[{report.index}/{report.total}] {row_key(r)}: {r['params_total']:,} params, {value} ({state})"
    losses = ", ".join(f"{lr:g}: {loss:.4f}" for lr, loss in report.losses.items())
    return (f"learning rate for {report.method} ({report.protocol}) near {report.target:g}: {report.chosen:g} "
            f"(validation loss {losses})")


def _duration(sweep) -> str:
    import time

    seconds = time.perf_counter() - sweep.started
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min this session"
