"""How a setting is declared, checked and written: the field helper, the checks, one JSON scheme for every class.

Every field carries its help text in its metadata (:func:`option`). The
command line (``bsi compress --help``), the sweep's flags and the dashboard's
form are all built from these fields, so a new setting needs to be written
once. Every settings class validates itself in ``__post_init__`` with
:func:`check` and :func:`check_choice`, which raise
:class:`~bsi.errors.BSIError` with a one-line message naming the field, so a
bad value is caught before any model is loaded or any file is touched.
:class:`JsonConfig` writes and reads them; ``from_dict`` rejects unknown keys,
so a typo in a JSON config fails loudly.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from dataclasses import field
from pathlib import Path
from typing import Any, TypeVar

from bsi.errors import BSIError

#: The allowed values of the settings that take a name (validated, listed in the help).
SCORES = ("bsi", "bsi-grad", "basel", "bsi-curvature", "bsi-grad-tested")
SIZE_MODES = ("target", "keep")
SELECTIONS = ("auto", "mass", "global")
BASES = ("whitened", "svd")
CURVATURES = ("fisher", "mc-fisher", "hutchinson")
PROBE_SCOPES = ("layer", "model")
HESSIAN_METHODS = ("fd", "hvp")
CENTER_GRADIENTS = ("exact", "average")
SCORE_WINDOWS = ("profiling", "round")
RECOVER_TARGETS = ("factors", "sigma")
TASK_KINDS = ("auto", "qa", "text")
DTYPES = ("float32", "bfloat16", "float16")
AUTOCAST_CHOICES = ("off", "on")
PROTOCOL_NAMES = ("tuned", "paper", "paper-whitened", "paper-layer-probes")
WITHIN_LAYER = ("score", "magnitude")

T = TypeVar("T", bound="JsonConfig")


def option(default: Any = dataclasses.MISSING, help: str = "", *, choices: tuple[Any, ...] | None = None,
           sets: dict[str, Any] | None = None, cli: bool = True, default_factory: Any = dataclasses.MISSING,
           metavar: str | None = None, flat: bool = False) -> Any:
    """A dataclass field with the metadata the CLI and the dashboard are generated from.

    Args:
        help: one line shown by ``--help`` and next to the dashboard's input.
        choices: the allowed values (validated, listed in the help).
        sets: other fields this one implies when a user gives it, e.g.
            ``keep_ratio`` sets ``size_mode="keep"`` (see :func:`implied_updates`).
        cli: False hides the field from the command line (still settable in JSON).
        flat: the field is a nested section whose fields are written flat, as
            the parent's own keys, in files, flags and overrides
            (``CompressConfig.hutchinson``: ``probe_scope``, not
            ``hutchinson.probe_scope``), so nesting it changed no file or flag.
    """
    meta = {"help": help, "choices": choices, "sets": dict(sets or {}), "cli": cli, "metavar": metavar, "flat": flat}
    if default_factory is not dataclasses.MISSING:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


def check(condition: bool, message: str) -> None:
    """Raise a one-line :class:`~bsi.errors.BSIError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise BSIError(message)


def check_choice(value: Any, name: str, choices: tuple[Any, ...]) -> None:
    """Raise a one-line error naming ``name`` and its allowed values unless ``value`` is one of ``choices``."""
    check(value in choices, f"{name} must be one of {', '.join(map(str, choices))}, got '{value}'")


class JsonConfig:
    """Mixin: ``to_dict``/``from_dict``/``to_json``/``from_json`` with unknown-key rejection.

    The one serialization of every settings class. A field holding another
    settings class (a *section*) is written as a nested object, or, for a
    ``flat`` field, as the parent's own keys; :meth:`section_types` names
    those classes. A class whose files spell it with other keys than its
    fields (:class:`~bsi.config.SizeRule`) overrides ``to_dict`` and
    ``from_dict`` and names those keys in :meth:`file_keys`. ``LEGACY_KEYS``
    (a class attribute) are keys old files hold that are read and ignored.
    """

    @classmethod
    def section_types(cls) -> dict[str, type[JsonConfig]]:
        """Field name -> the settings class of each nested section (none here; a class with sections says)."""
        return {}

    @classmethod
    def file_keys(cls) -> type:
        """The dataclass whose fields are the keys files and flags write for this class (itself, unless it says)."""
        return cls

    def to_dict(self) -> dict[str, Any]:
        """The settings as plain JSON values: nested sections as dicts, a ``flat`` section's keys in its place."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if isinstance(value, JsonConfig):
                if f.metadata.get("flat"):
                    out |= value.to_dict()
                    continue
                out[f.name] = value.to_dict()
            else:
                out[f.name] = copy.deepcopy(value)
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls: type[T], data: dict[str, Any]) -> T:
        if not isinstance(data, dict):
            raise BSIError(f"{cls.__name__} must be a JSON object, got {type(data).__name__}")
        fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        data = {k: v for k, v in data.items() if k not in getattr(cls, "LEGACY_KEYS", ())}
        for f in fields.values():  # a flat section's keys, as files and flags write them, go into the section
            if f.metadata.get("flat"):
                names = {g.name for g in flat_fields(cls.section_types()[f.name])}
                given = data.get(f.name) or {}
                if not isinstance(given, (dict, JsonConfig)):
                    raise BSIError(f"{f.name} must be a JSON object of its settings, got {type(given).__name__}")
                given = given.to_dict() if isinstance(given, JsonConfig) else dict(given)
                data = {k: v for k, v in data.items() if k not in names} | {
                    f.name: given | {k: v for k, v in data.items() if k in names}}
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise BSIError(
                f"unknown {cls.__name__} key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(fields))}"
            )
        kwargs = {}
        for name, value in data.items():
            sub = cls.section_types().get(name)
            kwargs[name] = sub.from_dict(value) if sub is not None and isinstance(value, dict) else value
        try:
            return cls(**kwargs)
        except TypeError as err:
            raise BSIError(f"bad {cls.__name__}: {err}") from None

    @classmethod
    def from_json(cls: type[T], path: str | Path) -> T:
        path = Path(path)
        if not path.is_file():
            raise BSIError(f"config file '{path}' does not exist")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise BSIError(f"config file '{path}' is not valid JSON: {err}") from None
        return cls.from_dict(data)


def is_number(x: Any) -> bool:
    """A finite int or float, not a bool (JSON's ``true`` is no number of steps)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def is_integer(x: Any) -> bool:
    """An int, not a bool."""
    return isinstance(x, int) and not isinstance(x, bool)


def flat_fields(cls: type[JsonConfig]) -> list[dataclasses.Field[Any]]:
    """The fields of a config dataclass as files and flags name them: a ``flat`` section's fields in its place.

    ``flat_fields(CompressConfig)`` lists ``score``, then ``size_mode``,
    ``target_ratio``, ``keep_ratio``, ``stops`` (how files spell the
    :class:`SizeRule`), ..., ``curvature``, then ``probe_scope``,
    ``hessian_method``, ... (:class:`HutchinsonConfig`'s), then ``score_window``.
    """
    out: list[dataclasses.Field[Any]] = []
    for f in dataclasses.fields(cls.file_keys()):
        out += flat_fields(cls.section_types()[f.name]) if f.metadata.get("flat") else [f]
    return out


def flat_value(config: Any, name: str) -> Any:
    """The value a file or flag calls ``name`` in ``config`` (a section), as the section's file writes it."""
    return config.to_dict()[name]


def field_help(cls: type[JsonConfig], name: str) -> str:
    """The help text of a config field (for the CLI and the dashboard); a flat section's fields by their own names."""
    return str({f.name: f for f in flat_fields(cls)}[name].metadata.get("help", ""))
