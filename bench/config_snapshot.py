"""Everything the configuration decides, as one JSON: compare it before and after a refactor of ``bsi.config``.

Written for the split of ``bsi/config.py`` into a package, where every file,
flag and fingerprint had to stay as it was. It records, for every preset and
sweep preset: the configuration as files write it, the fine-tune cache key and
the sweep fingerprint; every field's flag, help, choices and default; the
protocols, the method registry, the measured costs and how the menu states
them; the baselines' settings; the text of ``bsi compress --help`` and ``bsi
sweep --help``; and the public names of ``bsi.config``.

    python bench/config_snapshot.py > /tmp/before.json   # on the old code
    python bench/config_snapshot.py > /tmp/after.json    # on the new code
    diff /tmp/before.json /tmp/after.json && echo unchanged
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import bsi.config as config_module
from bsi.cli import build_parser
from bsi.cli.commands import build_config
from bsi.cli.sweep import settings_from_args
from bsi.config import (
    METHOD_SPECS,
    PRESET_COSTS,
    PRESETS,
    PROTOCOLS,
    SWEEP_PRESETS,
    BaselineConfig,
    CompressConfig,
    FinetuneConfig,
    PipelineConfig,
    RecoverConfig,
    SweepConfig,
    flat_fields,
    make_config,
)
from bsi.pipeline.runner import finetune_cache_key
from bsi.pipeline.sweep import Sweep


def fields_of(cls: type) -> list[dict]:
    """Each field as files and flags name it: its name, default, help, choices and flags' metadata."""
    out = []
    for f in flat_fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        if dataclasses.is_dataclass(default):
            default = default.to_dict()
        out.append({"name": f.name, "type": str(f.type), "default": default,
                    **{k: v for k, v in f.metadata.items() if k != "sets"}, "sets": f.metadata.get("sets")})
    return out


def help_text(*argv: str) -> str:
    """What ``bsi <argv> --help`` prints, at a fixed width."""
    os.environ["COLUMNS"] = "120"
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), contextlib.suppress(SystemExit):
        build_parser().parse_args([*argv, "--help"])
    return buffer.getvalue()


def main() -> None:
    snapshot: dict = {"presets": {}, "sweep_presets": {}}
    for name in PRESETS:
        config = make_config(name)
        snapshot["presets"][name] = {"config": config.to_dict(),
                                     "finetune_key_float32": finetune_cache_key(config, torch.float32),
                                     "finetune_key_bfloat16": finetune_cache_key(config, torch.bfloat16)}
    with tempfile.TemporaryDirectory() as tmp:
        for name in SWEEP_PRESETS:
            args = build_parser().parse_args(["sweep", "--preset", name, "--out", f"{tmp}/{name}"])
            settings = settings_from_args(args)
            sweep = Sweep(build_config(args), settings, args.out)
            snapshot["sweep_presets"][name] = {"settings": settings.to_dict(), "fingerprint": sweep.fingerprint(),
                                               "config": sweep.config.to_dict()}
    snapshot["fields"] = {cls.__name__: fields_of(cls) for cls in
                          (PipelineConfig, CompressConfig, FinetuneConfig, RecoverConfig, SweepConfig)}
    snapshot["protocols"] = PROTOCOLS
    snapshot["methods"] = {name: dataclasses.asdict(spec) for name, spec in METHOD_SPECS.items()}
    snapshot["costs"] = {name: {**dataclasses.asdict(cost), "described": cost.time_text()}
                         for name, cost in PRESET_COSTS.items()}
    snapshot["baseline"] = BaselineConfig().to_dict()
    snapshot["help"] = {"compress": help_text("compress"), "sweep": help_text("sweep")}
    snapshot["names"] = sorted(n for n in dir(config_module) if not n.startswith("__"))
    print(json.dumps(snapshot, indent=1, sort_keys=True, default=str))


if __name__ == "__main__":
    main()
