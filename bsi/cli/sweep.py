"""``bsi sweep``: every method at every target size (see :mod:`bsi.pipeline.sweep`)."""

from __future__ import annotations

import argparse

from bsi.cli.commands import build_config
from bsi.cli.flags import add_config_flags

METHOD_NAMES = ("svd", "svd-llm", "fwsvd", "asvd", "basel", "bsi-grad", "bsi")

#: set per cell, so not flags of the sweep
PER_CELL = ("compress.score", "compress.size_mode", "compress.target_ratio", "compress.keep_ratio", "preset")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from bsi.config import PRESETS, SWEEP_PRESETS, SWEEP_TARGETS

    by_preset = "; ".join(f"{name}: {','.join(map(str, values['targets']))}" for name, values in SWEEP_PRESETS.items())
    p.add_argument("--methods", default=",".join(METHOD_NAMES), help="comma-separated methods")
    p.add_argument("--targets", default=None,
                   help="comma-separated target ratios of the compressible layers' parameters (default: the "
                        f"preset's, {by_preset}; else {','.join(map(str, SWEEP_TARGETS))})")
    p.add_argument("--out", required=True, help="output folder (an existing sweep folder resumes)")
    p.add_argument("--preset", choices=list(PRESETS), help="starting configuration (default: default)")
    p.add_argument("--config", help="a JSON PipelineConfig file as the starting configuration instead of --preset (default: none, "
                                        "the preset)")
    p.add_argument("--alpha", type=float, default=0.5, help="ASVD exponent")
    p.add_argument("--allocation", default="uniform", choices=("uniform", "sensitivity"),
                   help="rank allocation of the SVD family")
    p.add_argument("--baseline-recover-steps", type=int, default=None,
                   help="recovery steps of the truncation baselines (svd, svd-llm, fwsvd, asvd) when they should "
                        "differ from --recover-steps: they start far from the task (default: the preset's, "
                        f"{_baseline_defaults('baseline_recover_steps')}; else the shared value)")
    p.add_argument("--baseline-recover-lr", type=float, default=None,
                   help="peak recovery learning rate of the truncation baselines (default: the preset's, "
                        f"{_baseline_defaults('baseline_recover_lr')}; else the shared --recover-lr)")
    p.add_argument("--speed-tokens", type=int, default=32, help="new tokens per speed timing")
    p.add_argument("--speed-repeats", type=int, default=3, help="speed timings per model (0: skip speed)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    add_config_flags(p, exclude=PER_CELL)


def _baseline_defaults(key: str) -> str:
    """``"sweep-cpu: 64"``: the presets that set a sweep key, for the flags' help."""
    from bsi.config import SWEEP_PRESETS

    return ", ".join(f"{name}: {values[key]:g}" for name, values in SWEEP_PRESETS.items() if key in values) or "none"


def given_or_preset(args: argparse.Namespace) -> dict:
    """The sweep settings in force: each flag given, else the preset's (:func:`bsi.config.sweep_defaults`).

    A ``--config`` file names no preset, so it takes the general defaults.
    """
    from bsi.config import sweep_defaults

    defaults = sweep_defaults(None if args.config else (args.preset or "default"))
    given = {"targets": args.targets, "baseline_recover_steps": args.baseline_recover_steps,
             "baseline_recover_lr": args.baseline_recover_lr}
    out = {key: defaults[key] if value is None else value for key, value in given.items()}
    if isinstance(out["targets"], tuple):
        out["targets"] = ",".join(map(str, out["targets"]))
    return out


def run(args: argparse.Namespace) -> int:
    from bsi.pipeline.methods import BaselineConfig
    from bsi.pipeline.sweep import CellReport, Sweep, _fmt, cell_key, parse_methods, parse_targets
    from bsi.progress import ProgressPrinter

    settings = given_or_preset(args)
    sweep = Sweep(build_config(args), parse_methods(args.methods), parse_targets(settings["targets"]), args.out,
                  BaselineConfig(alpha=args.alpha, allocation=args.allocation,
                                 recover_steps=settings["baseline_recover_steps"],
                                 recover_lr=settings["baseline_recover_lr"]),
                  speed_tokens=args.speed_tokens, speed_repeats=args.speed_repeats)
    speaks = sweep.dist.is_main  # under several processes, the first one prints
    printer = ProgressPrinter(enabled=not args.quiet and speaks)
    for report in sweep.run():
        if isinstance(report, CellReport):
            if not speaks:
                continue
            printer.close()
            r = report.row
            state = "already done" if report.skipped else f"{r['seconds']:.0f} s"
            acc = f"{100 * r['accuracy']:.1f}%" if r.get("accuracy") is not None else "-"
            print(f"[{report.index}/{report.total}] {cell_key(r['method'], r['target'])}: {r['params_total']:,} params, "
                  f"accuracy {acc}, loss {_fmt(r.get('loss'), '.4f')} ({state})", flush=True)
        else:
            printer.show(report)
    printer.close()
    if not speaks:
        return 0
    print((sweep.out_dir / "results.md").read_text(encoding="utf-8"))
    print(f"wrote {sweep.out_dir / 'results.jsonl'}, results.md and figure.html")
    return 0


