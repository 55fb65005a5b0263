"""The Compress tab's form: its inputs, their validation, and the run configuration they make.

The form's method inputs are *knobs* (:class:`Knob`), each bound to one field
of the configuration: its help text, its choices and its preset value come
from the field's metadata (:func:`bsi.config.field_help`, ``metadata["choices"]``),
so a setting added to :mod:`bsi.config` needs one line here, not a hand-made
list. :func:`build_config` turns the form into a validated
:class:`~bsi.config.PipelineConfig` through :func:`bsi.config.make_config`
(giving a ratio sets the size mode, see :func:`bsi.config.implied_updates`),
and words every refusal with the form's own labels. :func:`output_folder`
checks the *Save to folder* input, :func:`size_mode_line` says what the size
mode does, and :func:`eps_note`, :func:`eps_rule_text` and
:func:`compute_eps_rule` explain the hutchinson step next to its field
(computed by the engine, as the run computes it).

No Gradio here: the tab's layout is :mod:`bsi.app.compress`, the running job
:mod:`bsi.app.job`; both read the form from this module.
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bsi.app.format import in_app_words, number_text
from bsi.config import (
    PRESETS,
    CompressConfig,
    PipelineConfig,
    RecoverConfig,
    field_help,
    flat_fields,
    flat_value,
    make_config,
)
from bsi.data import EMBEDDED_TASK, WIKITEXT_2, WIKITEXT_2_RELEASE, is_text_task, read_jsonl, read_text_corpus
from bsi.errors import BSIError
from bsi.files import check_output_dir
from bsi.method.scores import fraction_bits
from bsi.models import (
    EMBEDDED_MODEL,
    GEMMA_MODEL,
    TINY_MODEL,
    check_model_spec,
    gemma_available,
    resolve_device,
    resolve_dtype,
)

MAX_UPLOAD_BYTES = 20 * 1024 * 1024
"""Largest upload accepted (20 MB); the server also refuses bigger files."""


def gemma_source(installed: bool) -> tuple[str, str]:
    """The optional second model's entry: its name when installed, else how to install it (choosing it then says so)."""
    if installed:
        return "Gemma 3 270M, a base model (opt-in install; Gemma's terms of use apply)", "gemma"
    return "Gemma 3 270M: not installed; `make gemma` installs it (Gemma's terms of use apply)", "gemma"


MODEL_SOURCES = [
    ("Embedded default: SmolLM2-135M-Instruct", "embedded"),
    gemma_source(gemma_available()),
    ("Tiny random Llama (seconds; for trying the app, its answers are noise)", "tiny"),
    ("Hugging Face hub id", "hub"),
    ("Local folder", "path"),
]
DATA_SOURCES = [("Embedded task: generated math word problems (accuracy)", "embedded"),
                (f"Text: WikiText-2, packaged ({WIKITEXT_2_RELEASE}; perplexity)", "wikitext-2"),
                ("Upload a file: question/answer JSONL, or text (.txt, or JSONL with a 'text' field)", "upload")]
#: The text settings' inputs: Form attribute -> (configuration field, label).
TEXT_INPUTS = {"window": ("window", "Window (tokens)"), "eval_windows": ("eval_windows", "Held-out windows scored")}
SECTIONS = {"compress": CompressConfig, "recover": RecoverConfig}


@dataclass(frozen=True)
class Knob:
    """One input of the form, bound to field ``name`` of config section ``section``."""

    attr: str  # the Form attribute
    section: str  # "compress" or "recover"
    name: str  # the field in that section's dataclass
    label: str

    @property
    def spec(self) -> dataclasses.Field:
        return {f.name: f for f in flat_fields(SECTIONS[self.section])}[self.name]

    @property
    def help(self) -> str:
        return field_help(SECTIONS[self.section], self.name)

    @property
    def choices(self) -> tuple | None:
        return self.spec.metadata.get("choices")

    @property
    def integer(self) -> bool:
        return str(self.spec.type).startswith("int")

    def value_in(self, config: PipelineConfig) -> Any:
        return flat_value(getattr(config, self.section), self.name)


#: The method's inputs, in the order the form shows them (after the preset).
KNOBS = (
    Knob("size_mode", "compress", "size_mode", "Size mode"),
    Knob("rounds", "compress", "rounds", "Rounds T"),
    Knob("gamma", "compress", "gamma", "gamma (pool exponent)"),
    Knob("score", "compress", "score", "Score"),
    Knob("bases", "compress", "bases", "Bases"),
    Knob("curvature", "compress", "curvature", "Curvature"),
    Knob("probe_scope", "compress", "probe_scope", "Probe scope"),
    Knob("eps", "compress", "eps", "eps (0 = the rule)"),
    Knob("recover_train", "recover", "train", "Recovery trains"),
    Knob("recover_distill", "recover", "distill", "Recovery distillation weight"),
)
KNOB = {knob.attr: knob for knob in KNOBS}
#: The ratio each size mode reads (the form's one "ratio" input writes the one that applies).
RATIOS = {"target": Knob("size_value", "compress", "target_ratio", "Target ratio"),
          "keep": Knob("size_value", "compress", "keep_ratio", "KeepRatio")}
#: The size mode's radio: (label, value). The paper's rule by its name, one click away.
SIZE_MODES = (("Target ratio: the final size (bsi's default)", "target"), ("the paper's size rule (KeepRatio)", "keep"))
HUTCHINSON_ONLY = ("probe_scope", "eps")
#: Configuration field -> the form's label for it (for messages, :func:`bsi.app.format.in_app_words`).
LABELS = {knob.name: knob.label for knob in (*KNOBS, *RATIOS.values())} | dict(TEXT_INPUTS.values())


@dataclass
class Form:
    """The Compress tab's inputs, in the order the UI lists them (the API's argument order)."""

    model_source: str = "embedded"
    model_name: str = ""
    trust_remote_code: bool = False
    data_source: str = "embedded"
    data_file: str | None = None
    window: int = 512  # text task: tokens per window
    eval_windows: int = 0  # text task: held-out windows scored for perplexity; 0: all of them
    preset: str = "default"
    size_mode: str = "target"
    size_value: float = 0.7
    rounds: int = 4
    gamma: float = 1.0
    score: str = "bsi"
    bases: str = "whitened"
    curvature: str = "fisher"
    probe_scope: str = "layer"
    eps: float = 0.0  # 0: the rule
    recover_train: str = "factors"
    recover_distill: float = 0.0
    out_dir: str = ""

    @classmethod
    def for_preset(cls, preset: str) -> Form:
        """The form as a preset fills it (the tiny model for ``smoke``, else the embedded one)."""
        if preset not in PRESETS:
            raise BSIError(f"unknown preset '{preset}': use one of {', '.join(PRESETS)}")
        config = make_config(preset)
        values = {knob.attr: knob.value_in(config) for knob in KNOBS}
        values["eps"] = values["eps"] or 0.0
        model = "tiny" if PRESETS[preset].get("model") == TINY_MODEL else "embedded"
        data = "wikitext-2" if config.data == WIKITEXT_2 else "embedded"
        return cls(model_source=model, data_source=data, window=config.window, eval_windows=config.eval_windows or 0,
                   preset=preset, size_value=float(config.compress.size.ratio), **values)


QUICK_PRESET = "tour"
"""The preset the form offers first: a whole run of the embedded model in under two minutes (caches warm)."""


def preset_order() -> list[str]:
    """The presets as the menu lists them: the quick tour first, then the rest in :data:`bsi.config.PRESETS` order."""
    return sorted(PRESETS, key=lambda name: name != QUICK_PRESET)


def preset_label(name: str) -> str:
    """The menu's entry for a preset: its name and its measured times on 2 cores, with both caches warm (the
    fine-tune and the conversion), the fine-tune alone cached and an empty cache (``not measured`` when none was)."""
    from bsi.config import PRESET_COSTS
    from bsi.units import duration

    cost = PRESET_COSTS.get(name)
    times = [] if cost is None else [f"{duration(seconds)} {what}" for seconds, what in (
        (cost.warm_seconds, "caches warm"), (cost.cached_seconds, "fine-tune cached"),
        (cost.uncached_seconds, "empty cache")) if seconds]
    return f"{name} · " + (" / ".join(times) if times else "not measured")


def preset_line(name: str) -> str:
    """One line under the menu: the preset's measured cost on 2 cores and what it gives up for it."""
    from bsi.config import PRESET_COSTS
    from bsi.shipped import general_text_costs, general_text_sentence

    cost = PRESET_COSTS.get(name)
    if cost is None:
        return f"**{name}**: not measured."
    text = general_text_costs().get(name)
    tail = f" {general_text_sentence(text)}" if text else ""
    return f"**{name}**: {cost.time_text()}. Gives up: {cost.gives_up}.{tail}"


def size_mode_line(mode: str) -> str:
    """One line under the size inputs: what the chosen size mode does."""
    if mode == "keep":
        return ("**KeepRatio** (the paper's size rule): every round, each layer keeps its most important bases "
                "that hold KeepRatio^(1/T) of its pool's positive importance; the final size follows from the "
                "scores, it is not fixed in advance.")
    return ("**Target ratio** (bsi's default): the compressible layers end at this share of their parameters, cut "
            "in even steps over the rounds. For the paper's rule, choose *the paper's size rule (KeepRatio)*.")


# ------------------------------------------------------------------ validation
def model_spec(form: Form) -> str:
    """The model spec :func:`bsi.models.load_model_and_tokenizer` understands."""
    if form.model_source == "embedded":
        return EMBEDDED_MODEL
    if form.model_source == "tiny":
        return TINY_MODEL
    if form.model_source == "gemma":
        try:
            check_model_spec(GEMMA_MODEL)  # not installed: one line that says how
        except BSIError as err:
            raise BSIError(f"Model: {err}") from None
        return GEMMA_MODEL
    name = (form.model_name or "").strip()
    if form.model_source == "hub":
        if not name:
            raise BSIError("Model: type a Hugging Face hub id such as HuggingFaceTB/SmolLM2-360M-Instruct")
        return name
    if form.model_source == "path":
        if not name:
            raise BSIError("Model: type the path of a local model folder")
        path = Path(name).expanduser()
        if not path.is_dir():
            raise BSIError(f"Model: local folder '{name}' does not exist")
        return str(path)
    raise BSIError(f"Model: choose one of {', '.join(label for label, _ in MODEL_SOURCES)}")


def validate_upload(path: str | None) -> int:
    """Check an uploaded file; returns its number of examples (a text: of documents).

    A question/answer JSONL file, or a text: a ``.txt`` file, or a JSONL file
    whose records hold ``text`` and no ``question``
    (:func:`bsi.data.is_text_task`). Refuses files over
    :data:`MAX_UPLOAD_BYTES` and reports malformed content through
    :func:`bsi.data.read_jsonl` or :func:`bsi.data.read_text_corpus`, whose
    messages name the line; the server's temporary path in them is replaced by
    the file's name.
    """
    if not path:
        raise BSIError("data: upload a .jsonl file (one JSON object with 'question' and 'answer' per line) or a text "
                       "(.txt)")
    file = Path(path)
    if file.suffix.lower() not in (".jsonl", ".txt"):
        raise BSIError(f"data: '{file.name}' is not a .jsonl file or a .txt text")
    size = file.stat().st_size
    if size > MAX_UPLOAD_BYTES:
        raise BSIError(f"data: '{file.name}' is {size / 2**20:.1f} MB; the limit is {MAX_UPLOAD_BYTES // 2**20} MB")
    try:
        if is_text_task(str(file)):
            return len(read_text_corpus(str(file)).train_documents)
        return len(read_jsonl(file))
    except BSIError as err:
        raise BSIError(str(err).replace(str(file), file.name)) from None


def upload_message(path: str | None) -> str:
    """The status line shown under the upload widget: what the file is and how much it holds."""
    if not path:
        return ""
    try:
        count = validate_upload(path)
    except BSIError as err:
        return f"Error: {err}"
    if is_text_task(path):
        return f"OK: a text of {count} document(s) in {Path(path).name}: trained on every token, measured by perplexity"
    return f"OK: {count} examples in {Path(path).name}"


def read_whole(label: str, value: Any, minimum: int) -> int:
    """A whole-number input of the form, at least ``minimum`` (BSIError naming its label)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BSIError(f"{label}: type a whole number")
    if float(value) != int(value) or value < minimum:
        raise BSIError(f"{label} must be a whole number >= {minimum}, got {number_text(value)}")
    return int(value)


def read_knob(knob: Knob, value: Any) -> Any:
    """The form's value for ``knob``, checked against the field's type and choices (BSIError naming the label)."""
    if knob.choices is not None:
        if value not in knob.choices:
            raise BSIError(f"{knob.label}: choose one of {', '.join(map(str, knob.choices))}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BSIError(f"{knob.label}: type a number")
    if knob.integer:
        if float(value) != int(value):
            raise BSIError(f"{knob.label} must be a whole number, got {number_text(value)}")
        return int(value)
    return float(value)


def most_rounds(compress: CompressConfig) -> int:
    """The most rounds the schedule of ``compress`` can run (every round needs at least 2 iterations)."""
    trial = copy.copy(compress)  # the config's own schedule arithmetic, without re-validating
    best = 1
    for rounds in range(1, compress.total_iters + 1):
        trial.rounds = rounds
        if trial.round_length < 2:
            break
        best = rounds
    return best


def check_rounds(preset: str, rounds: int) -> None:
    """Refuse more rounds than the preset's pruning stage has room for, naming the form's fields."""
    if preset not in PRESETS:
        raise BSIError(f"Preset: choose one of {', '.join(PRESETS)}")
    compress = make_config(preset).compress
    most = most_rounds(compress)
    if rounds > most:
        longer = [name for name in PRESETS if make_config(name).compress.total_iters > compress.total_iters]
        hint = f", or a preset with a longer pruning stage ({', '.join(longer)})" if longer else ""
        raise BSIError(f"Rounds T: {rounds} rounds do not fit the {preset} preset, whose pruning stage has "
                       f"{compress.total_iters} iterations and every round needs at least 2: choose at most "
                       f"{most} rounds{hint}")


def build_config(form: Form) -> PipelineConfig:
    """A validated :class:`PipelineConfig` from the form (raises BSIError naming the form's field)."""
    data = EMBEDDED_TASK
    if form.data_source == "upload":
        validate_upload(form.data_file)
        data = str(form.data_file)
    elif form.data_source == "wikitext-2":
        data = WIKITEXT_2
    elif form.data_source != "embedded":
        raise BSIError(f"Task data: choose one of {', '.join(label for label, _ in DATA_SOURCES)}")
    text = {"window": read_whole(TEXT_INPUTS["window"][1], form.window, 2),
            "eval_windows": read_whole(TEXT_INPUTS["eval_windows"][1], form.eval_windows, 0) or None}  # 0: all
    values = {knob.attr: read_knob(knob, getattr(form, knob.attr)) for knob in KNOBS}
    ratio = RATIOS[values["size_mode"]]
    sections: dict[str, dict[str, Any]] = {"compress": {}, "recover": {}}
    for knob in KNOBS:
        if knob.attr != "size_mode":  # the ratio given implies it (bsi.config.implied_updates)
            sections[knob.section][knob.name] = values[knob.attr]
    sections["compress"][ratio.name] = read_knob(ratio, form.size_value)
    sections["compress"]["eps"] = values["eps"] or None  # 0: the rule
    check_rounds(form.preset, values["rounds"])
    overrides = {"model": model_spec(form), "data": data, "trust_remote_code": bool(form.trust_remote_code),
                 **text, **sections}
    try:
        return make_config(form.preset, overrides)
    except BSIError as err:
        raise BSIError(in_app_words(str(err), LABELS)) from None


# ------------------------------------------------------------ output folder
def checkpoint_progress(folder: Path) -> tuple[int, int] | None:
    """(rounds done, rounds in all) of the interrupted run checkpointed in ``folder``, or None."""
    from bsi.pipeline.checkpoint import PLAIN
    from bsi.pipeline.runner import CHECKPOINT

    state = folder / CHECKPOINT / PLAIN
    if not state.is_file():
        return None
    try:
        plain = json.loads(state.read_text(encoding="utf-8"))
        return len(plain["rounds"]), int(plain["pipeline_config"]["compress"]["rounds"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0, 0  # unreadable: Resume reports the damage


def output_folder(out_dir: str, resume: bool = False) -> Path | None:
    """The 'Save to folder' input, checked before any work (None when empty).

    A folder holding an interrupted run is refused for a new run (press
    Resume instead); for Resume it must hold one.
    """
    text = (out_dir or "").strip()
    if not text:
        if resume:
            raise BSIError("Resume: type the folder of the interrupted run in 'Save to folder'")
        return None
    try:
        folder = check_output_dir(text)
    except BSIError as err:
        raise BSIError(in_app_words(str(err), LABELS)) from None
    progress = checkpoint_progress(folder)
    if resume and progress is None:
        raise BSIError(f"Resume: '{text}' holds no interrupted run to continue")
    if not resume and progress is not None:
        raise BSIError(f"'Save to folder' {text} holds an interrupted run ({progress[0]} of {progress[1]} rounds "
                       "done): press Resume to continue it, or choose another folder")
    return folder


# ------------------------------------------------------------------ eps rule
def eps_note(curvature: str) -> str:
    """One line under the eps field: what eps does for ``curvature``, and how to use it when it does nothing."""
    if curvature == "hutchinson":
        return ("eps: the hutchinson curvature moves every sigma by +eps and -eps and differences the gradients; "
                "0 takes the rule below.")
    return (f"eps is not used now: the {curvature} curvature reads gradients only, it perturbs nothing. To set eps, "
            "switch **Curvature** to hutchinson.")


def eps_rule_text(compress: CompressConfig, dtype: torch.dtype = torch.float32, value_of_sigma_max: float | None = None,
                  eps: float | None = None, source: str = "") -> str:
    """The eps rule of ``compress`` in ``dtype``, with its value once the run's ``sigma_max`` is known.

    The hutchinson curvature perturbs sigma by ``eps``; the rule picks the
    smallest step whose rounding error stays below ``alpha`` of the change,
    at most ``eps_max`` and at least the protocol's ``eps_floor``:
    ``max(min(2^-(f+1) * sigma_max / alpha, eps_max), eps_floor)`` with ``f``
    the dtype's fraction bits (:func:`bsi.method.scores.eps_rule`).
    ``sigma_max`` is the largest coefficient of the bases the run prunes
    (whitened ones by default), and ``eps`` the value the engine computed
    from it (:func:`compute_eps_rule`); ``source`` says which model they are for.
    """
    f = fraction_bits(dtype)
    name = str(dtype).removeprefix("torch.")
    probes = compress.hutchinson
    formula = (f"max(min(2^-{f + 1} * sigma_max / {number_text(probes.eps_alpha)}, {number_text(probes.eps_max)}), "
               f"{number_text(probes.eps_floor)})")
    floor = (f"floor {number_text(probes.eps_floor)}: bsi's, the gradients' round-off" if probes.eps_floor
             else "no floor: the method's rule")
    if value_of_sigma_max is None or eps is None:
        return (f"eps rule ({name}, {floor}): {formula}, sigma_max the largest coefficient of the run's "
                f"{compress.bases} bases; press *Compute the rule* to evaluate it as the run will.")
    text = formula.replace("sigma_max", number_text(value_of_sigma_max))
    return (f"eps rule ({name}, {floor}): {text} = **{number_text(eps)}**, sigma_max = "
            f"{number_text(value_of_sigma_max)} the largest coefficient of the {compress.bases} bases{source}")


def rule_text(form: Form) -> str:
    """The eps rule for the form as it stands (before *Compute the rule*); the preset's when a field is invalid."""
    try:
        config = build_config(form)
    except BSIError:
        config = make_config(form.preset if form.preset in PRESETS else "default")
    return eps_rule_text(config.compress, resolve_dtype(config.dtype, resolve_device(config.device)))


def compute_eps_rule(form: Form | PipelineConfig) -> Iterator[str]:
    """The eps the run of ``form`` (or of a configuration) will use, as the pipeline computes it; yields progress, then the text.

    The pipeline does the work (:meth:`bsi.pipeline.runner.Pipeline.preview_eps`:
    the model loaded as the run loads it, its cached fine-tune, the engine's
    own conversion of the layers); this formats what it reports.
    """
    from bsi.pipeline.runner import Pipeline
    from bsi.reports import StepReport

    config = build_config(form) if isinstance(form, Form) else form
    yield f"Loading `{config.model}` as the run does…"
    pipeline = Pipeline(config)
    try:
        previewing = pipeline.preview_eps()
        while True:
            try:
                report = next(previewing)
            except StopIteration as done:
                preview = done.value
                break
            if isinstance(report, StepReport) and report.stage == "calibrate":
                yield (f"Calibrating the {config.compress.bases} bases on the run's batches: {report.step} of "
                       f"{report.total_steps}…")
    finally:
        del pipeline  # the model goes with it, before the text is shown
        gc.collect()
    source = (" of the model *before* its task fine-tune (not cached yet: the run computes the rule after it; its log "
              "says 'eps used')" if preview.before_finetune else " of the fine-tuned model, as the run computes it")
    yield eps_rule_text(config.compress, resolve_dtype(config.dtype, resolve_device(config.device)),
                        preview.sigma_max, preview.eps, source)


__all__ = ["Form", "Knob", "KNOBS", "RATIOS", "LABELS", "MAX_UPLOAD_BYTES", "MODEL_SOURCES", "DATA_SOURCES", "TEXT_INPUTS",
           "build_config", "validate_upload", "upload_message", "output_folder", "checkpoint_progress",
           "eps_rule_text", "eps_note", "rule_text", "compute_eps_rule", "SIZE_MODES", "size_mode_line",
           "QUICK_PRESET", "preset_order", "preset_label", "preset_line"]
