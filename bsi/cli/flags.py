"""Command-line flags generated from the configuration dataclasses.

Every field of :class:`~bsi.config.PipelineConfig` and of its sections that is
marked for the command line (:func:`bsi.config.option`) becomes a flag:

* top-level fields: ``--model``, ``--batch-size``, ...;
* ``compress`` fields: their own name, ``--keep-ratio``, ``--rounds``, ...;
* ``finetune`` and ``recover`` fields: prefixed, ``--finetune-steps``, ``--recover-lr``, ...

Each flag's help is the field's help plus the value it takes in the chosen
preset, so ``--help`` shows every default. A flag the user does not give is
``None`` in the namespace and leaves the preset's value alone;
:func:`overrides_from_args` turns the given ones into nested overrides.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from bsi.config import NESTED, SECTIONS, PipelineConfig, make_config

#: flags kept for compatibility or brevity: field -> extra option strings
ALIASES = {("compress", "probes_per_batch"): ("--probes",)}


def _flag_name(section: str, name: str) -> str:
    prefix = "" if section in ("", "compress") else f"{section}-"
    return "--" + prefix + name.replace("_", "-")


def _dest(section: str, name: str) -> str:
    return f"{section}__{name}" if section else name


def _kind(annotation: Any) -> type | None:
    """The argparse type of a field from its annotation string ('float | None' -> float; bool -> None)."""
    text = str(annotation).replace(" ", "")
    if text.startswith("bool"):
        return None
    for name, kind in (("int", int), ("float", float), ("str", str)):
        if text.split("|")[0] == name:
            return kind
    return str


def config_fields(section: str = "") -> list[dataclasses.Field]:
    """The command-line fields of one section (``""``: the top level) in declaration order."""
    cls = PipelineConfig if not section else NESTED[("PipelineConfig", section)]
    return [f for f in dataclasses.fields(cls) if f.metadata.get("cli", True) and f.name not in SECTIONS]


def add_config_flags(parser: argparse.ArgumentParser, *, preset: str = "default",
                     exclude: tuple[str, ...] = ()) -> None:
    """Add one flag per command-line config field, grouped by section, defaults read from ``preset``.

    ``exclude`` names fields to leave out, as ``"name"`` (top level) or ``"section.name"``.
    """
    shown = make_config(preset).to_dict()
    for section in ("", *SECTIONS):
        title = {"": "run", "finetune": "stage 1: task fine-tune", "compress": "stage 2: compression",
                 "recover": "stage 3: recovery"}[section]
        group = parser.add_argument_group(title)
        values = shown if not section else shown[section]
        for f in config_fields(section):
            if (f"{section}.{f.name}" if section else f.name) in exclude:
                continue
            meta = f.metadata
            help_text = meta.get("help", "")
            if meta.get("choices"):
                help_text += f" {{{', '.join(map(str, meta['choices']))}}}"
            value = values.get(f.name)
            if "(default" not in help_text:  # a help that states its own default keeps it
                help_text += f" (default: {value})"
            names = [_flag_name(section, f.name), *ALIASES.get((section or "", f.name), ())]
            kind = _kind(f.type)
            if kind is None:
                group.add_argument(*names, dest=_dest(section, f.name), action=argparse.BooleanOptionalAction,
                                   default=None, help=help_text)
            else:
                group.add_argument(*names, dest=_dest(section, f.name), type=kind, default=None,
                                   metavar=meta.get("metavar") or kind.__name__.upper(), help=help_text.replace("%", "%%"))


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """Nested config overrides from the flags the user actually gave (None = not given)."""
    out: dict[str, Any] = {}
    for section in ("", *SECTIONS):
        for f in config_fields(section):
            value = getattr(args, _dest(section, f.name), None)
            if value is None:
                continue
            if section:
                out.setdefault(section, {})[f.name] = value
            else:
                out[f.name] = value
    return out
