"""The three-stage pipeline: task fine-tune, compress, recovery fine-tune.

Every method is compared through the same three stages, so that a difference
in accuracy comes from the choice of bases and nothing else:

1. **fine-tune** the dense model on the task (skippable; the result is cached
   under ``$BSI_CACHE/finetuned/<hash of its inputs>`` so a re-run, or a sweep
   of several methods, does it once);
2. **compress** with a method (:mod:`bsi.pipeline.methods`): the engine's
   pruning rounds (:class:`~bsi.method.engine.Compressor`) or a truncation
   baseline, given a :class:`~bsi.pipeline.methods.MethodContext` (the model,
   the batches, and what the engine borrows from the run: checkpoints, resume,
   sharding);
3. **recover**: fine-tune the compressed model on the task again, by default
   its own low-rank factors, dense layers and norms
   (:class:`~bsi.config.RecoverConfig`), optionally distilling from the
   fine-tuned dense model.

The task is a question/answer task (:mod:`bsi.data.tasks`: trained on the
answer tokens, evaluated by accuracy and answer-token loss) or a *text task*
(:mod:`bsi.data.text`, ``config.task``: trained on every token of windows of
``config.window`` tokens, evaluated by perplexity on the held-out part,
:mod:`bsi.pipeline.perplexity`). Only :meth:`Pipeline.load`,
:meth:`Pipeline.stream` and the evaluation know the difference: a text batch
has the keys of a task batch with labels equal to its inputs, so the loss,
every curvature source, every method and the recovery run on it unchanged.

The stages themselves are functions of a model (:mod:`bsi.pipeline.stages`:
fine-tune, recover, evaluate; compression is the method's). A
:class:`Pipeline` holds what one configuration loads (the task, the model,
the tokenizer, the batch streams) and composes them: :meth:`Pipeline.run`
for ``bsi compress``, and, one size at a time, :class:`~bsi.pipeline.sweep.Sweep`.

:meth:`Pipeline.run` is a generator of typed reports (stage boundaries, steps,
rounds, evaluations, and a final :class:`~bsi.reports.DoneReport`). Nothing is
written to ``out_dir`` until the end, and then atomically.
"""

from __future__ import annotations

import copy
import dataclasses
import gzip
import hashlib
import json
import shlex
import shutil
import tempfile
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bsi.config import (
    BaselineConfig,
    PipelineConfig,
    RecoverConfig,
    is_engine_method,
    protocol_deviations,
    resolve_config,
)
from bsi.data import (
    EMBEDDED_TASK,
    EOS_SEPARATOR,
    PROCESS_SEED_STRIDE,
    BatchStream,
    BatchUse,
    EncodedExamples,
    Example,
    TaskData,
    TextBatchStream,
    TextTask,
    is_text_run,
    load_task,
    read_text_corpus,
    set_aside_windows,
    tokenize_corpus,
)
from bsi.errors import BSIError
from bsi.files import atomic_directory, atomic_write_json, atomic_write_text, check_output_dir, refuse_to_replace
from bsi.method.engine import Compressor
from bsi.method.surgery import compressible_linear_names, compressible_parameters, model_parameters, sigma_max
from bsi.models import (
    cache_root,
    enable_checkpointing,
    load_model_and_tokenizer,
    model_id,
    resolve_autocast,
    resolve_device,
    resolve_dtype,
)
from bsi.pipeline.checkpoint import load_checkpoint, save_checkpoint
from bsi.pipeline.distributed import from_environment
from bsi.pipeline.evaluate import Evaluation, Metrics, evaluate
from bsi.pipeline.export import WEIGHTS, write_model_files
from bsi.pipeline.losses import DistillationLoss, MatmulAutocast, answer_token_loss
from bsi.pipeline.methods import EngineResume, EngineRun, MethodContext, engine_method, get_method
from bsi.pipeline.perplexity import LOSS_MEANING, measure_perplexity, model_context
from bsi.pipeline.stages import DENSE_RECOVERY, SkipLimit, eval_report, evaluate_model, recover_model, train_dense
from bsi.reports import DoneReport, Report, RoundReport, StageReport, StepReport
from bsi.results import RunSummary

CHECKPOINT = "checkpoint"  # sub-folder of out_dir holding the last complete round
ROUND_RECORDS = "rounds-layers.jsonl.gz"  # every round's full per-layer record (RoundReport.to_dict(), one a line)
#: The probe seeds of a run's processes lie this far apart (a prime, unlike the batch streams' PROCESS_SEED_STRIDE),
#: so that no process's probes repeat another's batches' seed; part of every engine run's reproducibility.
PROBE_SEED_STRIDE = 7919


@dataclass(frozen=True)
class DenseReference:
    """What the reference stage measured of the fine-tuned dense model: what every compressed model is compared with.

    ``params``: all its parameters. ``evaluation``: its per-problem (or
    per-window) outcomes; None when it was not evaluated here (the run
    evaluates nothing, a sweep measured it before, or a resumed run measured
    it before the interruption). ``perplexity_protocol``: on a text task, how
    its perplexity was measured. ``test_problems``: the problems its
    evaluation scored, in order (empty on a text task or without evaluation).
    """

    params: int
    evaluation: Evaluation | None = None
    perplexity_protocol: dict[str, Any] | None = None
    test_problems: tuple[Example, ...] = ()


@dataclass(frozen=True)
class EpsPreview:
    """The perturbation intensity a run will use, computed as its compress stage computes it (:meth:`Pipeline.preview_eps`).

    ``sigma_max`` is the largest coefficient of the bases the run prunes and
    ``eps`` the engine's value of the eps rule from it. ``before_finetune``:
    the run fine-tunes first and its fine-tuned model was not cached, so both
    are of the model *before* that fine-tune (the run's own values come after
    it; its log says "eps used").
    """

    sigma_max: float
    eps: float
    before_finetune: bool


def compact_round(report: RoundReport) -> dict[str, Any]:
    """A round's scalars and per-layer ranks (what ``rounds.jsonl`` records)."""
    plain = {k: v for k, v in report.to_dict().items() if k != "layers"}
    return plain | {"ranks": {layer.name: layer.rank_after for layer in report.layers}}


def outcome_lines(evaluations: dict[str, Evaluation], task: TaskData | None) -> str:
    """``outcomes.jsonl``: one line per evaluated model and test problem, in test order.

    Each line: ``model`` (``finetuned``, ``recovered``, or ``dense_recovered``
    with ``dense_recovery``), ``index`` in the test set, the question, its
    ``reference_answer`` (the task's worked answer), the generated answer
    ``prediction`` (null: scored for the loss only), ``correct``, and the
    answer-token ``loss_sum`` over ``tokens``. (Older files may lack
    ``reference_answer``; :mod:`bsi.analysis.answers` reads both kinds.)
    On a text task (``task`` None) a line is a held-out window, ``index`` its
    place in the stream, ``loss_sum`` its summed next-token NLL over its
    ``tokens`` scored tokens, and nothing is answered.
    """
    lines = []
    for when, evaluation in evaluations.items():
        for index, outcome in enumerate(evaluation.outcomes):
            lines.append(json.dumps({
                "model": when, "index": index, "question": task.test[index].question if task else None,
                "reference_answer": task.test[index].answer if task else None, "prediction": outcome.prediction, "correct": outcome.correct, "loss_sum": outcome.loss_sum,
                "tokens": outcome.tokens}))
    return "".join(line + "\n" for line in lines)


#: The pairs of evaluated models a run's summary gives paired intervals for: (compressed, reference).
PAIRS = (("recovered", "finetuned"), ("recovered", "dense_recovered"))


def paired_differences(evaluations: dict[str, Evaluation], *, text: bool = False) -> dict[str, dict[str, dict]]:
    """``summary.json``'s ``paired``: each pair of :data:`PAIRS` evaluated here, the compressed minus the reference.

    Keys ``"recovered - finetuned"`` (against the fine-tuned dense model) and
    ``"recovered - dense_recovered"`` (against the dense model given the same
    recovery steps, ``dense_recovery``); each holds the accuracy difference (a
    share, not points) and the answer-token loss difference with their paired
    bootstrap 95% intervals (:func:`bsi.analysis.stats.paired_difference`, on
    the same test problems), the loss only on a text task. A pair with a
    model not evaluated in this process (a resumed run keeps the reference's
    metrics, not its outcomes) is left out.
    """
    from bsi.analysis.stats import Outcomes, paired_difference

    out: dict[str, dict[str, dict]] = {}
    for mine, reference in PAIRS:
        if mine in evaluations and reference in evaluations:
            a = Outcomes.from_columns(evaluations[mine].columns())
            b = Outcomes.from_columns(evaluations[reference].columns())
            out[f"{mine} - {reference}"] = {stat: paired_difference([a], [b], stat).to_dict()
                                            for stat in (("loss",) if text else ("accuracy", "loss"))}
    return out


def check_run_folder(out_dir: str | Path, *, force: bool = False) -> Path:
    """Validate a run's ``out_dir`` before any work: never lose a result or an interrupted run by surprise.

    The folder must be new or empty, writable (:func:`bsi.files.check_output_dir`
    writes a test file), and hold no earlier result: a folder with an
    interrupted run's ``checkpoint/`` is refused with the command that
    continues it, a folder with a finished result is refused too; ``force``
    allows replacing either (the old content goes only when the new result is
    complete, or when the first new round overwrites the checkpoint).

    Raises:
        BSIError: naming what the folder holds and the ways on.
    """
    path = check_output_dir(out_dir)
    if not force and (path / CHECKPOINT).is_dir():
        raise BSIError(f"'{path}' holds an interrupted run (its {CHECKPOINT}/ folder): continue it with "
                       f"`bsi compress --resume {shlex.quote(str(path))}`, or start over with --force")
    refuse_to_replace(path, force)
    return path


def finetune_cache_key(config: PipelineConfig, dtype: torch.dtype, autocast: torch.dtype | None = None) -> str:
    """Hash of everything that determines the stage-1 result.

    ``autocast``: the dtype of the training steps' matrix products when they
    are autocast (:class:`~bsi.pipeline.losses.MatmulAutocast`); a float32
    fine-tune keeps the key it had before autocast existed.

    On a text task: the text (spec and field), how it becomes windows (the
    window, the held-out share, the separator, the seed's document order) and
    which windows train (``train_size``, ``validation_size``); question/answer
    tasks keep the key they always had.
    """
    if is_text_run(config):
        inputs = {
            "model": model_id(config.model), "data": config.data, "task": "text", "text_field": config.text_field,
            "window": config.window, "held_out_fraction": config.held_out_fraction, "separator": EOS_SEPARATOR,
            "train_size": config.train_size, "validation_size": config.validation_size, "seed": config.seed,
            "batch_size": config.batch_size, "dtype": str(dtype), "finetune": config.finetune.to_dict(), "version": 1,
            **({"autocast": str(autocast)} if autocast is not None else {}),
        }
        return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]
    inputs = {
        "model": model_id(config.model), "data": config.data, "fields": [config.question_field, config.answer_field],
        "train_size": config.train_size, "test_size": config.test_size, "seed": config.seed,
        # a validation set comes out of a file's training examples (the embedded task draws it elsewhere)
        **({"validation_size": config.validation_size}
           if config.validation_size and config.data != EMBEDDED_TASK else {}),
        "batch_size": config.batch_size, "max_length": config.max_length, "dtype": str(dtype),
        "finetune": config.finetune.to_dict(), "version": 1,
        **({"autocast": str(autocast)} if autocast is not None else {}),
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def finetune_cache_folder(key: str, cache_dir: str | Path | None = None) -> Path:
    """Where the fine-tuned dense model of cache key ``key`` lives (:func:`finetune_cache_key`): ``<cache>/finetuned/<key>``.

    ``cache_dir``: the cache's root (default ``$BSI_CACHE`` or ``~/.cache/bsi``). The one place the path is spelled.
    """
    return cache_root(cache_dir) / "finetuned" / key


def saved_run_finetune_key(config: PipelineConfig, summary: dict[str, Any]) -> str:
    """:func:`finetune_cache_key` of a saved run, from the precision its ``summary.json`` records.

    ``dtype`` (float32 when a summary predates it) and ``autocast`` (absent:
    the training steps ran in ``dtype``).
    """
    dtype = getattr(torch, summary.get("dtype") or "float32")
    autocast = summary.get("autocast")
    return finetune_cache_key(config, dtype, getattr(torch, autocast) if autocast else None)


class Pipeline:
    """One run of the three stages for one configuration and one method.

    Args:
        config: the validated run configuration.
        out_dir: where the compressed model, ``summary.json`` and ``rounds.jsonl``
            go (validated now, written only at the end); None keeps the result in memory.
        cache_dir: root of the model and fine-tune caches (default ``$BSI_CACHE`` or ``~/.cache/bsi``).
        method: a registered method name or a :class:`~bsi.pipeline.methods.Method`;
            default: the engine with ``config.compress.score``.
        baseline: settings of the truncation baselines (:class:`~bsi.config.BaselineConfig`).
        reference: metrics of the fine-tuned dense model measured before (a sweep
            measures them once); its evaluation is then skipped.
        force: replace what ``out_dir`` holds (a finished result, or an
            interrupted run's checkpoint); without it such a folder is refused
            (:func:`check_run_folder`).
    """

    def __init__(self, config: PipelineConfig, out_dir: str | Path | None = None,
                 cache_dir: str | Path | None = None, *, method: Any = None, baseline: Any = None,
                 reference: Metrics | None = None, force: bool = False) -> None:
        self.method = engine_method(config.compress.score) if method is None else \
            get_method(method) if isinstance(method, str) else method
        if is_engine_method(self.method.name):  # the config says what runs: its score (a variant's more)
            config = resolve_config(base=config, method=self.method.name)
        self.config = config
        self.out_dir = check_run_folder(out_dir, force=force) if out_dir is not None else None
        self.cache_dir = cache_dir
        self.baseline = baseline or BaselineConfig()
        self.reference = reference
        self.dist = from_environment()  # several processes under accelerate/torchrun: see bsi.pipeline.distributed
        self.device = self.dist.device(resolve_device(config.device))
        self.dtype = resolve_dtype(config.dtype, self.device)
        #: the dtype of the training steps' matrix products (bf16 autocast), None when they run in ``dtype``
        self.autocast = resolve_autocast(config.autocast, self.dtype)
        self.model: nn.Module | None = None
        self.teacher: nn.Module | None = None
        self.tokenizer: Any = None
        self.is_text = is_text_run(config)
        self.task: TaskData | None = None  # a question/answer task (None on a text task)
        self.text: TextTask | None = None  # a text task, tokenized (None on a question/answer task)
        self.train_windows: torch.Tensor | None = None  # (W, window): the text windows that train
        self.validation_windows: torch.Tensor | None = None  # (V, window): the last training windows, set aside
        self._train_tokens: EncodedExamples | None = None  # the training examples' tokens, shared by every stream
        self.perplexities: dict[str, dict] = {}  # text task: each evaluation's protocol (protocol_record)
        self.rounds: list[RoundReport] = []
        self.metrics: dict[str, Metrics] = {}
        self.evaluations: dict[str, Evaluation] = {}  # per-problem outcomes of each evaluated model
        self.table: dict[str, dict] = {}
        self.notes: list[str] = []
        self.round_log: list[dict[str, Any]] = []  # compact_round of every finished round
        self.step_log: list[dict[str, Any]] = []  # every step's stage, step and loss, as run() passes it on
        self.params_before = self.compressible_before = 0
        self._resume: tuple[dict[str, torch.Tensor], dict[str, Any]] | None = None
        self.skips = SkipLimit(config.compress.max_skipped_batches)  # non-finite steps, over the training stages
        self.sharding: Any = None  # a bsi.pipeline.fsdp.Sharding while the Basel form is sharded (fsdp=True)
        #: called before every cut of the engine's rounds (see Compressor's before_cut): a study of the
        #: ranking (bench/ranking.py) or the dashboard's round snapshots hook in here
        self.before_cut: Any = None

    @classmethod
    def resume(cls, out_dir: str | Path, cache_dir: str | Path | None = None) -> Pipeline:
        """A pipeline that continues the interrupted run whose ``--out`` was ``out_dir``.

        The run's own configuration is read back from the checkpoint; stage 1
        comes from the fine-tune cache (or is recomputed identically), and the
        pruning rounds continue after the last complete one.
        """
        tensors, plain = load_checkpoint(Path(out_dir).expanduser() / CHECKPOINT)
        pipeline = cls(PipelineConfig.from_dict(plain["pipeline_config"]), out_dir, cache_dir,
                       method=plain.get("method"), force=True)  # the folder is this run's own
        pipeline._resume = (tensors, plain)
        return pipeline

    @property
    def method_name(self) -> str:
        return self.method.name

    @property
    def method_is_engine(self) -> bool:
        """True for the engine methods (the protocol's settings apply to them only)."""
        return is_engine_method(self.method_name)

    # --------------------------------------------------------------- stages
    def load(self) -> None:
        """Load the task and the model (validating both before any training).

        A text is read and checked before the model loads (an empty, binary
        or field-less file answers at once), then tokenized with the model's
        tokenizer and cut into windows, the window checked against the
        model's context (:func:`bsi.pipeline.perplexity.model_context`).
        """
        cfg = self.config
        corpus = None
        if self.is_text:
            corpus = read_text_corpus(cfg.data, text_field=cfg.text_field)
        else:
            self.task = load_task(
                cfg.data, question_field=cfg.question_field, answer_field=cfg.answer_field,
                test_size=cfg.test_size, train_size=cfg.train_size, seed=cfg.seed, validation_size=cfg.validation_size,
            )
            if not self.task.train:
                raise BSIError(f"dataset '{cfg.data}' has no training examples left after the test split")
        self.model, self.tokenizer = load_model_and_tokenizer(
            cfg.model, dtype=self.dtype, device=self.device, trust_remote_code=cfg.trust_remote_code,
            cache_dir=self.cache_dir,
        )
        if corpus is not None:
            self.text = tokenize_corpus(corpus, self.tokenizer, window=cfg.window,
                                        held_out_fraction=cfg.held_out_fraction, seed=cfg.seed,
                                        max_context=model_context(self.model))
            self.train_windows, self.validation_windows = set_aside_windows(
                self.text.train_windows, cfg.validation_size, cfg.train_size, name=self.text.name)
        if not compressible_linear_names(self.model):
            raise BSIError(f"model '{cfg.model}' has no linear layers to compress (tied output layers are left alone)")
        if cfg.gradient_checkpointing:
            enable_checkpointing(self.model)

    def stream(self, use: BatchUse) -> BatchStream | TextBatchStream:
        """A fresh stream of this process's training batches for one :class:`~bsi.data.BatchUse`.

        Seeded ``run seed + use + PROCESS_SEED_STRIDE * rank``: each use and
        each process draws its own order. On a text task, batches of training
        windows (:class:`~bsi.data.TextBatchStream`). The streams of one run
        share their examples' tokens (:class:`~bsi.data.EncodedExamples`): an
        example is tokenized once, when a batch first serves it.
        """
        seed = self.config.seed + int(use) + PROCESS_SEED_STRIDE * self.dist.rank
        if self.train_windows is not None:
            return TextBatchStream(self.train_windows, batch_size=self.config.batch_size, seed=seed)
        assert self.task is not None
        tokens = self._train_tokens
        if tokens is None or tokens.examples is not self.task.train or tokens.tokenizer is not self.tokenizer:
            tokens = self._train_tokens = EncodedExamples(self.task.train, self.tokenizer, self.config.max_length)
        return BatchStream(tokens, self.tokenizer, batch_size=self.config.batch_size,
                           max_length=self.config.max_length, seed=seed)

    @property
    def evaluates(self) -> bool:
        """Whether the run evaluates its models: ``eval_windows`` not 0 (text), ``eval_examples`` or ``eval_loss_examples``."""
        cfg = self.config
        return cfg.eval_windows != 0 if self.is_text else bool(cfg.eval_examples or cfg.eval_loss_examples)

    @property
    def finetune_folder(self) -> Path:
        """Where this run's fine-tuned dense model is cached: under its :func:`finetune_cache_key`."""
        return finetune_cache_folder(finetune_cache_key(self.config, self.dtype, self.autocast), self.cache_dir)

    @property
    def bases_cache(self) -> Any:
        """Where this run's conversion is cached (:mod:`bsi.pipeline.bases_cache`): keyed on the model it converts."""
        from bsi.pipeline.bases_cache import BasesCache, bases_cache_inputs

        cfg = self.config
        finetuned = not (cfg.skip_finetune or cfg.finetune.steps == 0)
        key = finetune_cache_key(cfg, self.dtype, self.autocast)
        return BasesCache.under(cache_root(self.cache_dir),
                                bases_cache_inputs(key, finetuned, cfg.compress, self.device.type))

    def finetune_stage(self) -> Iterator[Report]:
        """Stage 1: dense task fine-tuning, cached by a hash of its inputs."""
        cfg = self.config
        if cfg.skip_finetune or cfg.finetune.steps == 0:
            yield StageReport("finetune", "end", "skipped")
            return
        folder = self.finetune_folder
        if self.dist.all_true((folder / "config.json").is_file()):  # all processes load it, or none
            self.model, _ = load_model_and_tokenizer(str(folder), dtype=self.dtype, device=self.device)
            yield StageReport("finetune", "end", str(folder), cached=True)
            return
        yield StageReport("finetune", "start", f"{cfg.finetune.steps} steps")
        yield from train_dense(self.model, self.stream(BatchUse.FINETUNE), cfg.finetune, dist=self.dist, skips=self.skips,
                               loss_fn=self.training_precision(answer_token_loss))
        if self.dist.is_main:  # rank 0 writes the cache; the others hold the same weights
            folder.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=".partial-", dir=folder.parent))
            try:
                self.model.save_pretrained(tmp)
                self.tokenizer.save_pretrained(tmp)
                tmp.replace(folder)
            except OSError:
                shutil.rmtree(tmp, ignore_errors=True)  # another run won the race; keep its copy
        self.dist.barrier()  # the next pipeline (a sweep's next cell) finds it on every process
        yield StageReport("finetune", "end", str(folder))

    def preview_eps(self) -> Generator[Report, None, EpsPreview]:
        """The eps the compress stage will use, computed by the pipeline and the engine themselves, without pruning.

        The eps rule reads the largest coefficient of the bases the run prunes,
        so the preview takes what the run takes: the model, loaded as the run
        loads it; its task fine-tune when the cache holds it (a preview never
        trains: without it the values are of the model before the fine-tune);
        and the engine's own conversion of the layers
        (:meth:`bsi.method.engine.Compressor.convert`: with whitened bases,
        calibration on the run's first batches of its ``COMPRESS`` stream),
        after which the engine holds the rule's value. An ``eps`` given in the
        settings is set aside: the preview shows the rule. Yields the stages'
        reports; returns an :class:`EpsPreview`.
        """
        cfg = self.config
        self.load()
        no_finetune = cfg.skip_finetune or cfg.finetune.steps == 0
        fine_tuned = no_finetune or (self.finetune_folder / "config.json").is_file()
        if fine_tuned:
            yield from self.finetune_stage()  # loads the cached fine-tune (or skips, as the run does)
        rule = dataclasses.replace(cfg.compress.hutchinson, eps=None)
        compressor = Compressor(self.model, self.stream(BatchUse.COMPRESS),
                                dataclasses.replace(cfg.compress, hutchinson=rule), answer_token_loss,
                                compute_dtype=self.dtype, seed=cfg.seed)
        yield from compressor.convert()
        return EpsPreview(sigma_max(self.model), compressor.eps, before_finetune=not fine_tuned)

    def reference_stage(self) -> Generator[Report, None, DenseReference]:
        """Load, fine-tune (cached) and evaluate the dense model: what every compressed model is compared with.

        Sets :attr:`reference` (the metrics) and the size counts, and returns
        what it measured (:class:`DenseReference`). ``bsi sweep`` runs this
        once for its whole grid; :meth:`run` runs it first.
        """
        yield StageReport("load", "start", self.config.model)
        self.load()
        yield StageReport("load", "end")
        yield from self.finetune_stage()
        if self._resume is not None:
            plain = self._resume[1]
            self.params_before, self.compressible_before = plain["params_before"], plain["compressible_before"]
            self.metrics = {k: Metrics(**m) for k, m in plain["metrics"].items()}
            self.perplexities = dict(plain.get("perplexity", {}))
            self.round_log = list(plain["rounds"])
            self.reference = self.metrics.get("finetuned")
            return DenseReference(self.params_before, None, self.perplexities.get("finetuned"))
        self.params_before = model_parameters(self.model)
        self.compressible_before, _ = compressible_parameters(self.model)
        if self.reference is None:
            yield from self.evaluate_stage("finetuned")
            self.reference = self.metrics.get("finetuned")
        elif self.evaluates:  # measured before (a sweep measures it once)
            self.metrics["finetuned"] = self.reference
            yield eval_report("finetuned", self.reference, self.params_before, 0.0)
        evaluation = self.evaluations.get("finetuned")
        scored = tuple(self.task.test[: len(evaluation.outcomes)]) if self.task is not None and evaluation else ()
        return DenseReference(self.params_before, evaluation, self.perplexities.get("finetuned"), scored)

    def keep_teacher(self) -> None:
        """Keep a frozen copy of the fine-tuned dense model when a stage distils from it (once, before compression)."""
        if self.config.needs_teacher and self.teacher is None:
            self.teacher = copy.deepcopy(self.model).eval()  # the fine-tuned dense model, frozen
            for p in self.teacher.parameters():
                p.requires_grad_(False)

    def dense_recovery_stage(self) -> Iterator[Report]:
        """The equal-budget reference (``config.dense_recovery``): the dense model given the compressed one's recovery.

        Recovery trains the compressed model for ``recover.steps`` more steps
        on the task, past where the dense model's fine-tune stopped, so a
        compressed model can end *above* the dense one it came from. This stage
        trains a copy of the fine-tuned dense model with exactly those steps
        and settings (learning rate and schedule, the same batches, the same
        loss, everything but the embeddings unless recovery trains them too)
        and no compression, then evaluates it on the same test problems as
        ``dense_recovered``: the reference that had the same training budget.
        The random state is restored afterwards, so the compressed model comes
        out exactly as in a run without this stage; the fine-tuned model
        itself is left as it was.
        """
        if not self.config.dense_recovery or "dense_recovered" in self.metrics:
            return
        self.keep_teacher()  # a distilling recovery distils the dense copy from the fine-tuned model too
        dense = copy.deepcopy(self.model)
        with torch.random.fork_rng(devices=[]):
            yield from self.recover(dense, stage=DENSE_RECOVERY)
            yield from self.evaluate(dense, "dense_recovered")

    def compress(self) -> Iterator[Report]:
        """Stage 2: the method turns the fine-tuned model into a model of `BasisLinear` layers of the asked size.

        The method sees a :class:`~bsi.pipeline.methods.MethodContext`; after
        each of its reports :attr:`model` is the context's model (after a
        :class:`~bsi.reports.SizeReport`, the model of that size).
        """
        self.keep_teacher()
        deviations = protocol_deviations(self.config) if self.method_is_engine else []
        if deviations:
            note = f"protocol {self.config.protocol}, except {', '.join(deviations)}"
            self.notes.append(note)
            yield StageReport("compress", "note", note)
        context = self.method_context()
        for report in self.method.compress(context):
            self.model = context.model
            yield report
        self.model = context.model

    def method_context(self) -> MethodContext:
        """What the method works with: the model, this process's batches, and for the engine what the run lends it.

        For an engine method the run lends the tuning loss, the dtype, this
        process's probe seed, the ``before_cut`` hook, the shards (``fsdp`` on
        several processes: sharding starts here), the state of a resumed run
        and :meth:`record_round` (every round recorded and checkpointed).
        """
        cfg = self.config.compress
        engine = EngineRun(train_loss=self.train_loss(cfg.distill), compute_dtype=self.dtype,
                           probe_seed=self.config.seed + PROBE_SEED_STRIDE * self.dist.rank, before_cut=self.before_cut,
                           after_round=self.record_round)
        if self.method_is_engine:
            if self._start_sharding(cfg):
                engine.sharding = self.sharding
            if self._resume is not None:
                tensors, position = self._own_state(*self._resume)
                engine.resume = EngineResume(tensors, self._resume[1]["compressor"], position, len(self.round_log))
            elif engine.sharding is None and not self.dist.enabled:
                engine.bases_cache = self.bases_cache
        return MethodContext(self.model, cfg, self.config.seed, self.stream, self.dist, self.baseline, engine,
                             self.notes)

    def record_round(self, compressor: Compressor, stream: BatchStream | TextBatchStream, report: RoundReport) -> None:
        """Keep a finished round (:attr:`rounds`, :attr:`round_log`) and checkpoint the run after it."""
        self.rounds.append(report)
        self.round_log.append(compact_round(report))
        self.checkpoint(compressor, stream)

    def train_loss(self, weight: float) -> Any:
        """The loss of a tuning stage: the task loss, or distillation from the teacher with ``weight``.

        In the run's training precision (:meth:`training_precision`).
        """
        if weight > 0:
            assert self.teacher is not None, "a distilling stage needs the teacher (see compress())"
            return self.training_precision(DistillationLoss(self.teacher, weight, self.config.distill_temperature))
        return self.training_precision(answer_token_loss)

    def training_precision(self, loss: Any) -> Any:
        """``loss`` as the training steps compute it: under bf16 autocast when :attr:`autocast` says so."""
        return loss if self.autocast is None else MatmulAutocast(loss, self.device.type, self.autocast)

    def checkpoint(self, compressor: Compressor, stream: BatchStream | TextBatchStream) -> None:
        """Save the state after a complete round into ``out_dir/checkpoint`` (atomic; rank 0 writes).

        Under several processes each also sends rank 0 what is its own, its
        stream position, probe generator and monitor batch
        (:meth:`Compressor.process_state`), so that a resumed run continues
        every process where it stood; with sharded bases every process takes
        part in gathering them.
        """
        if self.out_dir is None:
            return
        tensors, compressor_plain = compressor.state_dict() if self.dist.is_main or self.sharding is not None else ({}, {})
        own = None
        if self.dist.enabled:
            own = self.dist.gather(({k: v.cpu() for k, v in compressor.process_state().items()}, stream.state_dict()))
        if not self.dist.is_main:
            return
        plain = {
            "pipeline_config": self.config.to_dict(), "compressor": compressor_plain,
            "stream": stream.state_dict(), "rounds": self.round_log,
            "params_before": self.params_before, "compressible_before": self.compressible_before,
            "metrics": {k: m.to_dict() for k, m in self.metrics.items()}, "method": self.method_name,
            "perplexity": self.perplexities,
        }
        if own is not None:
            plain["streams"] = [position for _, position in own]
            for rank, (state, _) in enumerate(own):
                tensors |= {f"rank{rank}.{key}": value for key, value in state.items()}
        save_checkpoint(self.out_dir / CHECKPOINT, tensors, plain)

    def _own_state(self, tensors: dict[str, torch.Tensor], plain: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict]:
        """This process's view of a checkpoint: its own generator, monitor batch and stream position where saved.

        A process the checkpoint has nothing of its own for (one process, or
        more processes than when it was saved) continues from rank 0's.
        """
        prefix = f"rank{self.dist.rank}."
        own = {k.removeprefix(prefix): v for k, v in tensors.items() if k.startswith(prefix)}
        if not own:
            return tensors, plain["stream"]
        shared = {k: v for k, v in tensors.items() if k != "generator" and not k.startswith("monitor.")}
        return shared | own, plain["streams"][self.dist.rank]

    def _start_sharding(self, cfg: Any) -> bool:
        """With ``fsdp`` on several processes: shard from now on (the teacher at once, the Basel form as it is made).

        See :mod:`bsi.pipeline.fsdp`; returns False (nothing sharded) on one process.
        """
        if not (self.config.fsdp and self.dist.enabled):
            return False
        from bsi.pipeline.fsdp import Sharding, refuse_double_backward

        if cfg.curvature == "hutchinson":
            refuse_double_backward(cfg.hutchinson.hessian_method)
        if self.teacher is not None:
            Sharding(self.teacher).shard()  # frozen and dense: sharded for good, dropped after the run
        self.sharding = Sharding(self.model)
        return True

    def unshard(self) -> None:
        """Every process gets the whole model back, as ordinary tensors (after sharded pruning; else nothing)."""
        if self.sharding is not None:
            self.sharding.gather()
            self.sharding = None

    def recover_stage(self, recover: RecoverConfig | None = None, *, stage: str = "recover") -> Iterator[Report]:
        """Stage 3 on the run's model (:meth:`recover`); keeps its export table for ``summary.json``."""
        self.table = yield from self.recover(self.model, recover, stage=stage)

    def recover(self, model: nn.Module, recover: RecoverConfig | None = None, *,
                stage: str = "recover") -> Generator[Report, None, dict]:
        """Recover ``model`` in place with this run's batches and loss (:func:`bsi.pipeline.stages.recover_model`).

        ``recover`` replaces the configuration's section (a sweep tries
        several learning rates); ``stage`` names the reports
        (:meth:`dense_recovery_stage` trains a copy of the dense model through
        here as ``dense-recover``). Returns the export table.
        """
        cfg = recover or self.config.recover
        return (yield from recover_model(model, lambda: self.stream(BatchUse.RECOVER), cfg,
                                         loss_fn=self.train_loss(cfg.distill) if cfg.steps else None,
                                         dist=self.dist, skips=self.skips, unshard=self.unshard, stage=stage))

    def evaluate_stage(self, when: str) -> Iterator[Report]:
        """Evaluate the run's model as ``when`` (:meth:`evaluate`)."""
        yield from self.evaluate(self.model, when)

    def evaluate(self, model: nn.Module, when: str) -> Generator[Report, None, Evaluation | None]:
        """Evaluate ``model`` as ``when`` on this run's test set (:func:`bsi.pipeline.stages.evaluate_model`).

        Keeps the per-problem (per-window) outcomes in :attr:`evaluations`,
        the aggregate in :attr:`metrics` and on a text task the protocol in
        :attr:`perplexities`, all under ``when``; returns the outcomes (None
        when the run evaluates nothing).
        """
        if not self.evaluates:
            return None
        evaluation, protocol = yield from evaluate_model(model, self.config, tokenizer=self.tokenizer, task=self.task,
                                                         text=self.text, when=when)
        self.evaluations[when], self.metrics[when] = evaluation, evaluation.metrics
        if protocol is not None:
            self.perplexities[when] = protocol
        return evaluation

    def evaluate_on(self, examples, answered: int | None = None, model: nn.Module | None = None) -> Evaluation:
        """The outcomes of ``model`` (default: the run's) on ``examples`` (the first ``answered`` answered; 0: loss only)."""
        return evaluate(self.model if model is None else model, self.tokenizer, examples, answered=answered,
                        batch_size=self.config.eval_batch_size, max_new_tokens=self.config.max_new_tokens)

    def validation_loss(self, model: nn.Module | None = None) -> tuple[float, int]:
        """The loss of ``model`` (default: the run's) on the validation set carved from the training data, and its size.

        Question/answer task: the answer-token loss of the validation
        problems. Text task: the mean next-token loss of the validation
        windows (the last ``validation_size`` windows of the training part),
        each scored on its own from its first token, as a training batch is.
        """
        if self.text is not None:
            windows = self.validation_windows
            if windows is None or not windows.shape[0]:
                raise BSIError("no validation windows: give validation_size (--validation-size N)")
            context = self.text.context_token
            stream = windows if context is None else windows[:, 1:]  # the context token starts every window
            result = measure_perplexity(self.model if model is None else model, stream.reshape(-1),
                                        window=windows.shape[1], batch_size=self.config.eval_batch_size,
                                        context_token=context)
            return result.mean_nll, int(windows.shape[0])
        assert self.task is not None
        return self.evaluate_on(self.task.validation, answered=0, model=model).metrics.loss, len(self.task.validation)

    # ------------------------------------------------------------------ run
    def run(self) -> Iterator[Report]:
        """All stages in order; ends with a DoneReport whose summary is ``summary.json``.

        Every step's loss is kept on the way (:attr:`step_log`, saved as
        ``steps.jsonl``), so a saved run can redraw its training curves.
        """
        for report in self._stages():
            if isinstance(report, StepReport):
                self.step_log.append({"stage": report.stage, "step": report.step, "loss": report.loss})
            yield report

    def _stages(self) -> Iterator[Report]:
        start = time.perf_counter()
        torch.manual_seed(self.config.seed)
        yield from self.reference_stage()
        yield from self.dense_recovery_stage()
        params_before, compressible_before = self.params_before, self.compressible_before
        yield StageReport("compress", "start", self.method_name)
        yield from self.compress()
        yield StageReport("compress", "end")
        yield from self.recover_stage()
        self.teacher = None  # free its memory before the evaluation
        yield from self.evaluate_stage("recovered")
        compressible_after, _ = compressible_parameters(self.model)
        result = RunSummary(
            method=self.method_name, model=self.config.model, data=self.config.data,
            params_before=params_before, params_after=model_parameters(self.model),
            compressible_params_before=compressible_before, compressible_params_after=compressible_after,
            task="text" if self.is_text else "qa", metrics_before=self.metrics.get("finetuned"),
            metrics_after=self.metrics.get("recovered"), metrics_dense_recovered=self.metrics.get("dense_recovered"),
            paired=paired_differences(self.evaluations, text=self.is_text),
            perplexity=self.perplexity_summary() if self.is_text else None, protocol=self.config.protocol,
            protocol_deviations=tuple(protocol_deviations(self.config) if self.method_is_engine else ()),
            eps=self.round_log[-1]["eps"] if self.round_log else None,
            ranks={name: spec["rank"] for name, spec in self.table.items()}, seconds=time.perf_counter() - start,
            device=str(self.device), dtype=str(self.dtype).removeprefix("torch."),
            autocast=None if self.autocast is None else str(self.autocast).removeprefix("torch."),
            config=self.config.to_dict(),
            notes=tuple(self.notes))
        if self.out_dir is not None and self.dist.is_main:  # one writer when several processes run
            yield StageReport("save", "start", str(self.out_dir))
            result = self.save(result)
            yield StageReport("save", "end", str(self.out_dir))
        yield DoneReport(result.to_dict(), str(self.out_dir) if self.out_dir is not None else None)

    def perplexity_summary(self) -> dict[str, Any]:
        """``summary.json``'s ``perplexity``: before and after, what the loss is, and the protocol of the figures."""
        def value(when: str) -> float | None:
            metrics = self.metrics.get(when)
            return None if metrics is None else metrics.perplexity

        protocol = self.perplexities.get("recovered") or self.perplexities.get("finetuned")
        return {"before": value("finetuned"), "after": value("recovered"), "loss": LOSS_MEANING,
                "protocol": protocol,
                "text_task": self.text.describe() | {"validation_windows": int(self.validation_windows.shape[0]),
                                                     "training_windows_used": int(self.train_windows.shape[0])}
                if self.text is not None else None}

    def save(self, result: RunSummary) -> RunSummary:
        """Write model, summary.json, rounds.jsonl and the records below into ``out_dir`` in one atomic swap.

        Besides the model: ``rounds.jsonl`` (each round's scalars and ranks),
        ``rounds-layers.jsonl.gz`` (each round's full record, every layer's
        per-basis coefficients, gradients, curvatures, scores and cuts: what
        the dashboard's Inspect tab reads back; one ``RoundReport.to_dict()``
        a line, gzip-compressed, a few MB), ``steps.jsonl`` (every step's
        loss) and ``outcomes.jsonl`` (:func:`outcome_lines`).

        Returns ``result`` with ``bytes_on_disk`` (size of the saved weights)
        and ``bytes_before`` (the dense model's weights in the same dtype). The
        folder was checked when the pipeline was made (:func:`check_run_folder`);
        its earlier content, this run's checkpoint included, is replaced only
        once the new folder is complete.

        Raises:
            BSIError: when the disk refuses the write (the checkpoint, if any, is kept).
        """
        assert self.out_dir is not None
        try:
            with atomic_directory(self.out_dir) as tmp:
                write_model_files(self.model, self.tokenizer, tmp, {
                    "method": self.method_name, "source_model": self.config.model,
                    "params_total": result.params_after, "settings": self.config.to_dict(),
                }, table=self.table)
                result = dataclasses.replace(
                    result, bytes_on_disk=(tmp / WEIGHTS).stat().st_size,  # the compressed weights file
                    bytes_before=result.params_before * torch.finfo(self.dtype).bits // 8)  # dense, same dtype
                atomic_write_text(tmp / "rounds.jsonl", "".join(json.dumps(r) + "\n" for r in self.round_log))
                if self.rounds:  # this process's rounds (a resumed run has those after its checkpoint)
                    # level 6 (zlib's default), not gzip's 9: a quarter of the time for 2% more bytes (10.8 MB of
                    # records: 0.38 s and 1.89 MB against 1.37 s and 1.86 MB; bench/suite_costs.py)
                    with gzip.open(tmp / ROUND_RECORDS, "wt", compresslevel=6, encoding="utf-8") as handle:
                        handle.writelines(json.dumps(r.to_dict()) + "\n" for r in self.rounds)
                atomic_write_text(tmp / "steps.jsonl", "".join(json.dumps(s) + "\n" for s in self.step_log))
                atomic_write_text(tmp / "outcomes.jsonl", outcome_lines(self.evaluations, self.task))
                atomic_write_json(tmp / "summary.json", result.to_dict())
        except OSError as err:
            raise BSIError(f"cannot write the result into '{self.out_dir}' ({err.strerror or err}); "
                           "free some space or choose another --out folder") from None
        return result
