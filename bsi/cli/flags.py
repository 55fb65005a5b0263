"""Command-line flags: the configuration's, generated from its dataclasses, and the model commands' shared ones.

Every field of :class:`~bsi.config.PipelineConfig` and of its sections that is
marked for the command line (:func:`bsi.config.option`) becomes a flag:

* top-level fields: ``--model``, ``--batch-size``, ...;
* ``compress`` fields: their own name, ``--keep-ratio``, ``--rounds``, ...;
* ``finetune`` and ``recover`` fields: prefixed, ``--finetune-steps``, ``--recover-lr``, ...

Each flag's help is the field's help plus the value it takes in the chosen
preset, so ``--help`` shows every default. A flag the user does not give is
``None`` in the namespace and leaves the preset's value alone;
:func:`overrides_from_args` turns the given ones into nested overrides. The
configuration checks the values together (before any model loads), and
:func:`in_flag_words` names the flag the user typed in its message.

The commands that take a model without running the pipeline (``eval``,
``chat``, ``compare``, ``spectrum``) share the flags of :data:`MODEL_FLAGS`,
defined once here: each takes the help text (and choices) of the
configuration field of the same name and checks its value as it is read, so
``--dtype fp16`` or ``--batch-size 0`` is a one-line error before anything
loads. The same checks read those fields' flags in ``compress`` and ``sweep``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bsi.config import NESTED, SECTIONS, PipelineConfig, flat_fields, make_config

#: flags kept for compatibility or brevity: field -> extra option strings
ALIASES = {("compress", "probes_per_batch"): ("--probes",)}


# ------------------------------------------------------------------ reading and checking one value
def whole_number(minimum: int | None = None) -> Callable[[str], int]:
    """An argparse ``type``: an integer, at least ``minimum`` when given."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, got '{text}'") from None
        if minimum is not None and value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def number_in(low: float, high: float | None = None, *, include_low: bool = False,
              include_high: bool = False) -> Callable[[str], float]:
    """An argparse ``type``: a finite number in the interval from ``low`` to ``high`` (None: no upper end)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got '{text}'") from None
        above = value >= low if include_low else value > low
        below = high is None or (value <= high if include_high else value < high)
        if not (math.isfinite(value) and above and below):
            interval = (f"{'[' if include_low else '('}{low:g}, {high:g}{']' if include_high else ')'}"
                        if high is not None else None)
            wanted = f"in {interval}" if interval else f"{'>=' if include_low else '>'} {low:g}"
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text}")
        return value

    return parse


DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")


def device_name(text: str) -> str:
    """An argparse ``type``: ``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``mps`` (whether it exists is checked at run)."""
    if not DEVICE.match(text):
        raise argparse.ArgumentTypeError(f"must be auto, cpu, cuda or cuda:N (N a GPU index), got '{text}'")
    return text


# ------------------------------------------------------------------ the model commands' shared flags
REQUIRED = object()
"""A default that is no default: the flag must be given."""


@dataclass(frozen=True)
class ModelFlag:
    """A flag that means what the run configuration's field ``name`` means: its help text and its choices.

    ``parse`` reads and checks the value (None: an on/off switch).
    """

    name: str
    parse: Callable[[str], Any] | None
    metavar: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def field(self) -> dataclasses.Field:
        return {f.name: f for f in dataclasses.fields(PipelineConfig)}[self.name]


#: The flags that every command loading a model spells, reads and checks the same way.
MODEL_FLAGS: dict[str, ModelFlag] = {f.name: f for f in (
    ModelFlag("model", str, "MODEL"),
    ModelFlag("data", str, "DATA"),
    ModelFlag("question_field", str, "FIELD"),
    ModelFlag("answer_field", str, "FIELD"),
    ModelFlag("batch_size", whole_number(1), "N"),
    ModelFlag("max_length", whole_number(16), "N"),
    ModelFlag("max_new_tokens", whole_number(1), "N"),
    ModelFlag("device", device_name, "DEVICE"),
    ModelFlag("dtype", str),
    ModelFlag("seed", whole_number(), "N"),
    ModelFlag("trust_remote_code", None),
)}


def add_model_flags(parser: argparse.ArgumentParser, defaults: dict[str, Any],
                    helps: dict[str, str] | None = None) -> None:
    """Add the :data:`MODEL_FLAGS` named in ``defaults``, in that order, with those defaults.

    A default of :data:`REQUIRED` makes the flag required. The help is the
    configuration field's unless ``helps`` words it for this command (eval's
    ``--batch-size`` counts generation batches, not training ones).
    """
    helps = helps or {}
    for name, default in defaults.items():
        spec = MODEL_FLAGS[name]
        help_text = helps.get(name) or spec.field.metadata["help"]
        if spec.parse is None:
            parser.add_argument(spec.flag, action="store_true", help=help_text)
            continue
        parser.add_argument(spec.flag, type=spec.parse, choices=spec.field.metadata.get("choices"), metavar=spec.metavar,
                            required=default is REQUIRED, default=None if default is REQUIRED else default,
                            help=help_text.replace("%", "%%"))


# ------------------------------------------------------------------ the configuration's flags
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
    return [f for f in flat_fields(cls) if f.metadata.get("cli", True) and f.name not in SECTIONS]


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
            help_text = meta.get("help", "")  # choices: argparse shows them as the metavar, {a,b}
            value = values.get(f.name)
            if "(default" not in help_text:  # a help that states its own default keeps it
                shown_value = ("on" if value else "off") if isinstance(value, bool) else value
                help_text += f" (default: {shown_value})"
            names = [_flag_name(section, f.name), *ALIASES.get((section or "", f.name), ())]
            kind = _kind(f.type)
            if kind is None:
                group.add_argument(*names, dest=_dest(section, f.name), action=argparse.BooleanOptionalAction,
                                   default=None, help=help_text)
                continue
            shared = MODEL_FLAGS.get(f.name) if not section else None  # read and checked as every command does
            metavar = meta.get("metavar") or (shared.metavar if shared else None) or kind.__name__.upper()
            group.add_argument(*names, dest=_dest(section, f.name), type=shared.parse if shared else kind,
                               default=None, choices=meta.get("choices"),
                               metavar=None if meta.get("choices") else metavar, help=help_text.replace("%", "%%"))


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


def in_flag_words(message: str, args: argparse.Namespace) -> str:
    """A configuration message that starts with a field's name, reworded with the flag the user gave for it.

    ``"keep_ratio must be in (0, 1], got 0"`` becomes ``"--keep-ratio must be
    in (0, 1], got 0"`` when ``--keep-ratio`` was given. A name that no given
    flag (or more than one, ``steps`` of ``--finetune-steps`` and
    ``--recover-steps``) matches is left as it is: the value came from the
    preset or a ``--config`` file.
    """
    match = re.match(r"[a-z_]+\b", message)
    if not match:
        return message
    given = [(section, f.name) for section in ("", *SECTIONS) for f in config_fields(section)
             if f.name == match.group() and getattr(args, _dest(section, f.name), None) is not None]
    if len(given) != 1:
        return message
    return _flag_name(*given[0]) + message[match.end():]
