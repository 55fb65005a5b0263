"""Small helpers the teaching notebooks call (``notebooks/``): views of the library, no method of their own.

The notebooks hold no logic. Everything they compute comes from the library
itself (the Basel form and its bases from :mod:`bsi.method`, the runs from
:class:`bsi.pipeline.runner.Pipeline`); what a cell needs beyond that lives
here, as small functions with tests:

* :func:`notebook_settings`: which model and how much work, chosen by the
  ``BSI_NOTEBOOK_MODEL`` environment variable (unset: the embedded model with
  settings that run in a few minutes on a laptop CPU; ``tiny-random-llama``:
  seconds, for CI). The pipeline runs start from the library's presets
  (notebook 06's from the ``text`` preset, WikiText-2).
* tables: :func:`rank_table`, :func:`rank_history`, :func:`block_index` (:func:`bsi.method.names.layer_block`),
  :func:`markdown_rows` (rows of text as a Markdown table);
  notebook 05's study grid is :meth:`NotebookSettings.study`;
* one layer: :func:`truncation_errors` (the output error of keeping the first
  k bases, on inputs of a given second moment), :func:`profile_rows` (a
  curvature source's statistics, one row per batch) and
  :func:`loss_change_when_dropped` (what the importance score predicts, measured);
* :func:`result_of`: the value a report generator returns (its reports dropped);
* :func:`doc_markdown`: a docstring as Markdown, so notebooks quote the code's
  own explanations instead of copies that drift;
* :func:`defaults_table_markdown`: the table "the paper and bsi's defaults",
  its values read from :mod:`bsi.config` (notebook 02, the README and the
  dashboard's help show it); :data:`FURTHER_READING`: the papers, cited.
"""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from bsi.config import PROTOCOLS, CompressConfig, PipelineConfig, SweepConfig, deep_update, make_config
from bsi.errors import BSIError
from bsi.method.curvature import LossFn, evaluation_mode, profile_batch, shifted_sigma
from bsi.method.layers import BasisLinear, LowRankLinear, stored_cost
from bsi.method.names import layer_block as block_index  # the notebooks' name for it
from bsi.method.names import layer_kind
from bsi.method.surgery import Bases, factor_linear_names, tied_output_names
from bsi.models import EMBEDDED_MODEL, TINY_MODEL
from bsi.reports import RoundReport

NOTEBOOK_MODEL_ENV = "BSI_NOTEBOOK_MODEL"
"""Environment variable naming the model the notebooks use (unset: the embedded model)."""


# ------------------------------------------------------------------ settings
@dataclass(frozen=True)
class NotebookSettings:
    """How much work each notebook does; one instance per model size.

    Notebooks 01, 02 and 04 study single layers on a few batches (the sizes
    below). Notebooks 03, 05 and 06 run the pipeline from a preset of
    :data:`bsi.config.PRESETS` (``preset``, ``sweep_preset``, ``text_preset``),
    with only the amount of work cut (``work``, ``sweep_work``, ``text_work``:
    fewer test questions, held-out windows and calibration batches, and a
    shorter fine-tune: 20 steps for 02, 03 and 05, which share it, and 16
    for 06, against the presets' 50 and 60; notebook 06 also fewer pruning
    and recovery steps), never the method's settings (on the tiny model,
    notebook 06 runs the ``smoke`` preset on WikiText-2 in windows of 64
    tokens). The fine-tune is the cost of a notebook's first run: 50 steps
    took 159 s of the 5 minutes a notebook may take on 2 cores. The embedded values
    are chosen so each notebook runs in a few minutes on two CPU cores; the
    tiny values so that all of them run in about a minute.
    """

    model: str = EMBEDDED_MODEL
    quick: bool = False  # True for the tiny CI model
    batch_size: int = 4  # notebooks 01 and 04: examples per batch
    max_length: int = 128
    test_size: int = 32
    calibration_batches: int = 4  # 01, 02: batches whose inputs set the whitened bases (01 holds as many out)
    tail_windows: int = 8  # notebook 01, section 4: WikiText-2 validation windows the tail cuts are measured on
    tail_window: int = 256  # notebook 01, section 4: tokens per window
    exact_positions: int = 12  # bases whose exact Hessian diagonal notebook 02 computes
    probes: int = 16  # single-probe Hutchinson estimates drawn in notebook 02
    profile_batches: int = 2  # notebook 02: mini-batches averaged for E[g] and E[h]
    profile_batch_size: int = 2  # notebook 02: examples per mini-batch (gradients through the model: keep small)
    ranking_singles: int = 8  # notebook 02, section 6: candidates removed one at a time (last round)
    #: notebook 02, section 6: its short run, on top of ``work`` (the fine-tune notebooks 03 and 05 share): two rounds
    #: of a few iterations, held-out loss on ``validation_size`` problems, no recovery, no evaluation
    ranking_work: dict = field(default_factory=lambda: {
        "eval_examples": 0, "validation_size": 16, "recover": {"steps": 0},
        "compress": {"score": "bsi", "rounds": 2, "iters_per_epoch": 8, "calibration_batches": 4}})
    eps_values: tuple[float, ...] = (1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 0.5)
    spectrum_k: int = 32  # notebook 04: size of each layer's exact Hessian block
    spectrum_layers: int = 3  # notebook 04: layers whose spectrum is computed
    preset: str = "demo"  # notebook 03's run (the quick demo; `default` is the 12-minute best trade)
    #: notebooks 02 and 03: the preset's run with fewer test questions and a 20-step fine-tune (notebook 05 the same)
    work: dict = field(default_factory=lambda: {"eval_examples": 16, "finetune": {"steps": 20, "warmup_steps": 2}})
    sweep_preset: str = "sweep-cpu"  # notebook 05's runs (the same stage 1 as ``preset``, so its cache is shared)
    sweep_work: dict = field(default_factory=lambda: {"eval_examples": 16, "finetune": {"steps": 20, "warmup_steps": 2},
                                                      "compress": {"calibration_batches": 8}})
    #: notebook 05: one size and two methods (the shipped data/sweeps/study-quick carries the full comparison)
    sweep_targets: tuple[float, ...] = (0.4,)
    sweep_methods: tuple[str, ...] = ("svd-llm", "bsi")
    text_preset: str = "text"  # notebook 06's run: WikiText-2, the text preset's settings with text_work's less work
    #: notebook 06: a shorter run than the preset's (its own shorter fine-tune too), so that it takes about 5 minutes
    text_work: dict = field(default_factory=lambda: {"eval_windows": 64, "finetune": {"steps": 16},
                                                     "recover": {"steps": 8, "warmup_steps": 1},
                                                     "compress": {"calibration_batches": 4, "iters_per_epoch": 12}})
    chat_prompts: tuple[str, ...] = (
        "Tom has 12 apples and buys 7 more. How many apples does he have now?",
        "A book costs 8 dollars. How much do 3 books cost?",
    )

    def pipeline_config(self, overrides: Mapping[str, Any] | None = None) -> PipelineConfig:
        """Notebook 03's run: ``preset`` with ``work`` (and ``overrides``) on top."""
        return make_config(self.preset, deep_update({"model": self.model, **self.work}, dict(overrides or {})))

    def sweep_config(self, overrides: Mapping[str, Any] | None = None) -> PipelineConfig:
        """Notebook 05's runs: ``sweep_preset`` with ``sweep_work`` (and ``overrides``) on top."""
        return make_config(self.sweep_preset,
                           deep_update({"model": self.model, **self.sweep_work}, dict(overrides or {})))

    def text_config(self, overrides: Mapping[str, Any] | None = None) -> PipelineConfig:
        """Notebook 06's run, a text task: ``text_preset`` with ``text_work`` (and ``overrides``) on top."""
        return make_config(self.text_preset, deep_update({"model": self.model, **self.text_work}, dict(overrides or {})))

    def study(self) -> SweepConfig:
        """Notebook 05's grid: ``sweep_methods`` at ``sweep_targets``, one seed, the tuned protocol."""
        return SweepConfig(methods=self.sweep_methods, targets=self.sweep_targets, seeds=(0,), protocols=("tuned",))


TINY_SETTINGS = NotebookSettings(
    model=TINY_MODEL, quick=True, batch_size=4, max_length=96, test_size=8, calibration_batches=2,
    tail_windows=2, tail_window=64,
    exact_positions=8, probes=16, profile_batches=2, profile_batch_size=4, ranking_singles=4, spectrum_k=8, spectrum_layers=2,
    preset="smoke", work={"eval_examples": 4}, sweep_preset="smoke", sweep_work={"eval_examples": 4},
    sweep_targets=(0.7, 0.5), text_preset="smoke", text_work={"data": "wikitext-2", "window": 64, "eval_windows": 16},
)


def notebook_settings(environ: Mapping[str, str] | None = None) -> NotebookSettings:
    """Settings for the notebooks, from ``BSI_NOTEBOOK_MODEL`` in ``environ`` (default: ``os.environ``).

    * unset or empty, ``embedded`` or ``smollm2-135m-instruct``: the embedded model;
    * ``tiny-random-llama``: the tiny random model with short settings (CI);
    * anything else (a local folder, a hub id): that model with the embedded settings.
    """
    environ = os.environ if environ is None else environ
    spec = environ.get(NOTEBOOK_MODEL_ENV, "").strip()
    if spec in ("", "embedded", EMBEDDED_MODEL):
        return NotebookSettings()
    if spec == TINY_MODEL:
        return TINY_SETTINGS
    return replace(NotebookSettings(), model=spec)


# --------------------------------------------------------------------- tables
def markdown_rows(rows: Sequence[Mapping[str, Any]]) -> str:
    """Rows of already formatted values as a Markdown table, the first row's keys as its header.

    >>> print(markdown_rows([{"eps": "1e-4", "error": "0.3"}]))
    | eps | error |
    |---|---|
    | 1e-4 | 0.3 |
    """
    if not rows:
        return ""
    head = list(rows[0])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(str(row[h]) for h in head) + " |" for row in rows])


def rank_table(model: nn.Module) -> list[dict[str, Any]]:
    """One row per compressible layer: shape, full and current rank, stored and dense parameters (biases aside).

    Works on a dense model (every rank full), on a model in Basel form
    (:class:`~bsi.method.layers.BasisLinear`: the active bases, priced by
    :func:`~bsi.method.layers.stored_cost`) and on an exported one
    (:class:`~bsi.method.layers.LowRankLinear`: its two factors). A tied
    output layer is left out, as the engine leaves it alone.
    """
    tied = tied_output_names(model) | factor_linear_names(model)  # a low-rank layer is one row, not three
    rows = []
    for name, module in model.named_modules():
        if name in tied or not isinstance(module, (nn.Linear, BasisLinear, LowRankLinear)):
            continue
        full = min(module.in_features, module.out_features)
        dense = module.in_features * module.out_features
        if isinstance(module, BasisLinear):
            rank = module.rank
            stored = stored_cost(module.in_features, module.out_features, rank, module.aux_rank)
        elif isinstance(module, LowRankLinear):
            rank, stored = module.rank, module.A.numel() + module.B.numel()
        else:
            rank, stored = full, dense
        rows.append({
            "layer": name, "kind": layer_kind(name), "block": block_index(name), "type": type(module).__name__,
            "in": module.in_features, "out": module.out_features, "full_rank": full, "rank": rank,
            "params": stored, "dense_params": dense,
        })
    return rows


def rank_history(rounds: Sequence[RoundReport], initial: Mapping[str, int] | None = None) -> dict[str, list[int]]:
    """Each layer's rank before round 1 and after every round: name -> [r_0, r_1, ..., r_T].

    ``r_0`` comes from ``initial`` when given, else from round 1's ``rank_before``.
    """
    history = {name: [int(rank)] for name, rank in (initial or {}).items()}
    for report in rounds:
        for layer in report.layers:
            history.setdefault(layer.name, [layer.rank_before]).append(layer.rank_after)
    return history


# ------------------------------------------------------------- one layer
@torch.no_grad()
def truncation_errors(weight: torch.Tensor, bases: Bases, covariance: torch.Tensor) -> torch.Tensor:
    """Relative output error of keeping only the first k bases, for every k = 0..r, on inputs of second moment C.

    With ``W_k = sum_{i<k} sigma_i u_i v_i^T`` and inputs ``x`` whose second
    moment is ``C = E[x x^T]`` (what :class:`bsi.method.bases.InputStatistics`
    gathers), the mean squared output error is
    ``E||x (W - W_k)^T||^2 = tr((W - W_k) C (W - W_k)^T)``. Returned relative
    to ``E||x W^T||^2 = tr(W C W^T)``, as a square root. Nothing assumes the
    bases are orthonormal or exact: entry ``r`` is the error of all bases, the
    round-off of ``U diag(sigma) V^T`` against ``W``. With ``a_i = sigma_i u_i``::

        tr(W_k C W_k^T) = sum_{i,j<k} (a_i . a_j)(v_i^T C v_j)
        tr(W_k C W^T)   = sum_{i<k}  a_i^T W C v_i

    so the whole curve costs two (r, r) products and their prefix sums.

    Args:
        weight: (out, in) dense weight.
        bases: ``(U, sigma, V)``: (out, r), (r,), (in, r), as from :mod:`bsi.method.bases`.
        covariance: (in, in) second moment of the inputs the error is measured on.

    Returns:
        (r + 1,) float64; entry k is the relative error with k bases kept.
    """
    u, s, v = (t.detach().double().cpu() for t in bases)
    w, c = weight.detach().double().cpu(), covariance.detach().double().cpu()
    a = u * s  # (out, r)
    cv = c @ v  # (in, r)
    pairs = (a.T @ a) * (v.T @ cv)  # (r, r): (a_i . a_j)(v_i^T C v_j)
    cross = (a * (w @ cv)).sum(dim=0)  # (r,): a_i^T W C v_i
    total = float(((w @ c) * w).sum())  # tr(W C W^T)
    if total <= 0:
        raise BSIError("the inputs give this layer no output (tr(W C W^T) = 0): measure on other batches")
    kept = pairs.cumsum(0).cumsum(1).diagonal()  # (r,): sum over i, j <= k
    squares = total + torch.cat([torch.zeros(1, dtype=torch.float64), kept - 2 * cross.cumsum(0)])  # (r + 1,)
    return (squares.clamp_min(0) / total).sqrt()


def profile_rows(source: Any, model: nn.Module, layer: BasisLinear, pool: torch.Tensor, batches: Sequence[dict],
                 loss_fn: LossFn, generator: torch.Generator | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """What a curvature source measures on one layer, one row per batch: ``(losses, grads, curvatures)``.

    Each row is one profiling step of ``source`` (``Fisher()``,
    ``Hutchinson(eps)``, ``GradientOnly()``, see :mod:`bsi.method.curvature`),
    exactly as the engine takes it (:func:`bsi.method.curvature.profile_batch`),
    on this layer alone with candidate ``pool``. Repeating a batch gives
    independent draws of a random source (a fresh probe each time). Returns
    (n,) losses and (n, r) float32 CPU gradients and curvatures (None when the
    source does not measure them).

    Raises:
        BSIError: when a batch gives a non-finite value.
    """
    pool = torch.as_tensor(pool, dtype=torch.long).to(layer.sigma.device)
    losses, grads, curvatures = [], [], []
    for n, batch in enumerate(batches):
        result = profile_batch(model, [layer], [pool], batch, loss_fn, source=source, generator=generator)
        if result is None:
            raise BSIError(f"batch {n} gave a non-finite loss or gradient; use other batches")
        losses.append(result.loss)
        if result.grads is not None:
            grads.append(result.grads[0].detach().float().cpu())
        if result.curvatures is not None:
            curvatures.append(result.curvatures[0].detach().float().cpu())
    if not losses:
        raise BSIError("profile_rows needs at least one batch")
    return (torch.tensor(losses), torch.stack(grads) if grads else None,
            torch.stack(curvatures) if curvatures else None)


@torch.no_grad()
def loss_change_when_dropped(model: nn.Module, layer: BasisLinear, batches: Sequence[dict], loss_fn: LossFn,
                             positions: Sequence[int]) -> torch.Tensor:
    """The measured loss increase of dropping each basis alone (``sigma_i := 0``), averaged over ``batches``.

    This is what the importance score ``I_i`` predicts; one forward pass per
    basis and batch, no gradients. Returns (len(positions),) float32.
    """
    changes = torch.zeros(len(positions))
    with evaluation_mode(model):
        base = [float(loss_fn(model, b)) for b in batches]
        for n, i in enumerate(positions):
            delta = torch.zeros_like(layer.sigma)  # (r,)
            delta[i] = -layer.sigma[i]
            with shifted_sigma([layer], [delta]):
                changes[n] = sum(float(loss_fn(model, b)) - l0 for b, l0 in zip(batches, base)) / len(batches)
    return changes


def result_of(reports: Generator[Any, None, Any]) -> Any:
    """Run a generator of reports to its end and return its return value (its reports are dropped).

    The library's long loops report progress as they go and hand back their
    result at the end (``stats = yield from input_statistics(...)`` inside a
    generator); a notebook cell, which is no generator, writes
    ``stats = result_of(input_statistics(...))``.
    """
    while True:
        try:
            next(reports)
        except StopIteration as stop:
            return stop.value


# ------------------------------------------------------------------- docs
#: A cross-reference role of reStructuredText: ``:func:`~a.b.c``` and its kin.
_ROLE = re.compile(r":(?:func|class|meth|mod|data|attr|exc|obj|const):`(~?)([^`<]+?)(?:\s*<([^`>]+)>)?`")
#: A rule of a reStructuredText simple table: runs of "=" separated by spaces.
_TABLE_RULE = re.compile(r"^\s*=+(?:\s+=+)+\s*$")


def _role_text(match: re.Match) -> str:
    """``:func:`~bsi.a.b``` -> ```b```; ``:class:`bsi.a.B``` -> ```bsi.a.B```; explicit titles kept."""
    tilde, name, target = match.groups()
    if target is not None:  # :func:`title <target>`
        return f"`{name.strip()}`"
    return f"`{name.rsplit('.', 1)[-1] if tilde else name}`"


def _inline(text: str) -> str:
    """RST inline markup to Markdown: roles become code, double back-quotes single ones."""
    return _ROLE.sub(_role_text, text.replace("``", "`"))


def _rst_table(lines: list[str]) -> list[str]:
    """A reStructuredText simple table (its rule lines included) as Markdown table rows.

    Columns are the runs of ``=`` in the first rule; the last column takes
    the rest of its line. Rows between the first two rules are the header
    (with only two rules, the first row is). A line whose first column is
    blank continues the row above.
    """
    spans = [m.span() for m in re.finditer(r"=+", lines[0])]
    starts = [a for a, _ in spans]
    rules = [n for n, line in enumerate(lines) if _TABLE_RULE.match(line)]
    rows: list[list[str]] = []
    for n, line in enumerate(lines):
        if n in rules or not line.strip():
            continue
        cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], len(line) + 1])]
        if rows and not cells[0] and n - 1 not in rules:
            rows[-1] = [f"{old} {new}".strip() for old, new in zip(rows[-1], cells)]
        else:
            rows.append(cells)
    header = len([n for n in range(rules[0], rules[1]) if n not in rules and lines[n].strip()]) if len(rules) > 2 else 1
    header = max(1, header)
    head = [" ".join(c for c in column if c) for column in zip(*rows[:header])]
    out = ["| " + " | ".join(_inline(c) for c in head) + " |", "|" + "---|" * len(starts)]
    out += ["| " + " | ".join(_inline(c).replace("|", "\\|") for c in row) + " |" for row in rows[header:]]
    return out


def _source_path(obj: Any) -> str:
    """The file that defines ``obj``, relative to the repository's root (``bsi/method/layers.py``)."""
    target = inspect.unwrap(obj)
    if isinstance(target, property):
        target = target.fget
    try:
        path = inspect.getsourcefile(target if inspect.ismodule(target) or inspect.isclass(target)
                                     or inspect.isroutine(target) else type(target))
    except TypeError:
        path = None
    if path is None:
        raise BSIError(f"cannot tell which file defines {getattr(obj, '__qualname__', obj)!r}")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the folder that holds bsi/
    return os.path.relpath(path, root).replace(os.sep, "/")


def _first_paragraphs(body: str, count: int, obj: Any, root: str) -> str:
    """The first ``count`` paragraphs of Markdown ``body`` (fenced code counts as one), then a link to the rest.

    Nothing is cut (and no link added) when ``body`` has no more paragraphs than that.
    """
    blocks: list[list[str]] = [[]]
    fenced = False
    for line in body.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if not line.strip() and not fenced:
            if blocks[-1]:
                blocks.append([])
            continue
        blocks[-1].append(line)
    blocks = [b for b in blocks if b]
    if len(blocks) <= count:
        return body
    path = _source_path(obj)
    name = obj.__name__ if inspect.ismodule(obj) else getattr(obj, "__qualname__", getattr(obj, "__name__", str(obj)))
    kept = "\n\n".join("\n".join(b) for b in blocks[:count])
    return f"{kept}\n\n*The rest of `{name}`'s docstring: [`{path}`]({root}{path}).*"


def doc_markdown(obj: Any, title: bool = True, paragraphs: int | None = None, root: str = "../") -> str:
    """``obj``'s docstring as Markdown: a bold signature line, then the text with code kept verbatim.

    What reStructuredText the library's docstrings use becomes Markdown:

    * literal blocks (indented after a ``::`` line) and doctest examples
      (``>>>`` lines and their output) become fenced code;
    * simple tables (columns under rules of ``=``) become Markdown tables;
    * cross-references (``:func:``, ``:class:``, ``:meth:``, ``:mod:``,
      ``:data:`` and their kin) become code, a leading ``~`` keeping the last
      name only; double back-quotes become single ones.

    ``title=False`` leaves out the signature line. ``paragraphs=n`` quotes
    the first ``n`` paragraphs only (a code block or a table counts as one)
    and ends with a link to the file that holds the rest, written from
    ``root``, the repository's root as seen from where the Markdown is read
    (``../`` from ``notebooks/``; the rendered copies rewrite it for their
    own folder)::

        doc_markdown(bsi.method.layers, paragraphs=1)
        # **`bsi.method.layers`** / its first paragraph /
        # *The rest of `bsi.method.layers`'s docstring: [`bsi/method/layers.py`](../bsi/method/layers.py).*
    """
    if paragraphs is not None and paragraphs < 1:
        raise BSIError(f"paragraphs must be at least 1 (or None for the whole docstring), not {paragraphs}")
    doc = inspect.getdoc(obj)
    if not doc:
        raise BSIError(f"{getattr(obj, '__qualname__', obj)!r} has no docstring")
    lines = doc.splitlines()
    out: list[str] = []
    n = 0
    while n < len(lines):
        line = lines[n]
        if _TABLE_RULE.match(line):  # a simple table: up to its last rule
            rules = [k for k in range(n, len(lines)) if _TABLE_RULE.match(lines[k])]
            last = rules[2] if len(rules) > 2 and all(lines[k].strip() for k in range(rules[1], rules[2])) \
                else rules[1] if len(rules) > 1 else None
            if last is not None:
                out.extend(_rst_table(lines[n:last + 1]))
                n = last + 1
                continue
        if line.lstrip().startswith(">>>"):  # a doctest: its lines and their output, up to a blank line
            block = []
            while n < len(lines) and lines[n].strip():
                block.append(lines[n].replace("  # doctest: +SKIP", "").rstrip())
                n += 1
            out.extend(["```python", *block, "```"])
            continue
        if line.rstrip().endswith("::"):  # a literal block follows: "text::" -> "text:", a lone "::" vanishes
            text = _inline(line.rstrip()[:-2].rstrip())
            if text:
                out.append(text + (":" if not line.rstrip()[:-2].endswith(" ") else ""))
            n += 1
            block = []
            while n < len(lines) and (not lines[n].strip() or lines[n].startswith(" ")):
                block.append(lines[n][4:] if lines[n].startswith("    ") else lines[n].strip())
                n += 1
            while block and not block[0].strip():
                block.pop(0)
            while block and not block[-1].strip():
                block.pop()
            out.extend([*([""] if out and out[-1].strip() else []), "```", *block, "```", ""])
            continue
        out.append(_inline(line))
        n += 1
    body = "\n".join(out).strip()
    if paragraphs is not None:
        body = _first_paragraphs(body, paragraphs, obj, root)
    if not title:
        return body
    if inspect.ismodule(obj):
        return f"**`{obj.__name__}`**\n\n{body}"
    name = getattr(obj, "__qualname__", getattr(obj, "__name__", str(obj)))
    try:
        signature = str(inspect.signature(obj))
    except (TypeError, ValueError):
        signature = ""
    return f"**`{obj.__module__}.{name}{signature}`**\n\n{body}"


# ------------------------------------------------------ the paper and bsi
#: The two papers the project implements, as Markdown list items.
FURTHER_READING = (
    "Daniel Agyei Asante, Ernie Chang, Yang Li. *Importance-Guided Basis Selection for Low-Rank "
    "Decomposition of Large Language Models* (BSI). arXiv:2605.01627, 2026. "
    "<https://arxiv.org/abs/2605.01627>",
    "Yang Li, Daniel Agyei Asante, Changsheng Zhao, Ernie Chang, Yangyang Shi, Vikas Chandra. *Basis "
    "Selection: Low-Rank Decomposition of Pretrained Large Language Models for Target Applications* "
    "(Basel). arXiv:2405.15877. <https://arxiv.org/abs/2405.15877>",
)

#: docs/method.md anchors the defaults table links to (tests check each heading exists).
METHOD_SECTIONS = {
    "bases": "2-which-bases-plain-or-whitened-svd",
    "scores": "3-importance-scores",
    "curvature": "4-curvature-sources",
    "size": "6-how-much-goes-size-modes",
    "selection": "7-which-bases-go-selection",
    "cap": "8-the-cut-cap",
    "schedule": "9-the-pruning-stage-round-by-round",
    "protocols": "14-protocols-the-published-methods-and-bsis-tuned-defaults",
}


def _code(value: Any) -> str:
    return f"`{value}`"


def defaults_rows() -> list[dict[str, str]]:
    """The rows of :func:`defaults_table_markdown`: setting, the paper's choice, bsi's default, why, where measured.

    The two value columns are read from :data:`bsi.config.PROTOCOLS` (``paper``)
    and from :class:`bsi.config.CompressConfig`'s defaults (bsi's ``tuned``
    protocol), so they cannot drift from the code; the size rule and the
    schedule, which no protocol sets, come from the defaults and from the
    original method's rule (size mode ``keep``).
    """
    paper, ours = PROTOCOLS["paper"]["compress"], CompressConfig()
    link = METHOD_SECTIONS

    def where(*keys: str) -> str:
        return ", ".join(f"[method.md §{link[k].split('-')[0]}](method.md#{link[k]})" for k in keys)

    return [
        {"setting": "bases", "paper": f"{_code(paper['bases'])}: SVD of W",
         "bsi": f"{_code(ours.bases)}: SVD of W S (S S^T the inputs' covariance)",
         "why": "keeping the first k whitened bases minimises the layer's output error on the task's inputs, "
                "not its weight error; at bsi's schedule plain bases collapsed (the deviations bench)",
         "measured": where("bases", "protocols")},
        {"setting": "curvature", "paper": f"{_code(paper['curvature'])}: symmetric perturbations, probe scope "
                                          f"{_code(paper['probe_scope'])}, {_code(paper['hessian_method'])}",
         "bsi": f"{_code(ours.curvature)}: the empirical Fisher from per-example gradients",
         "why": "free (the backward pass already holds the per-example gradients) and never negative; "
                "one Hutchinson probe per batch is noisy and lost accuracy (the deviations bench)",
         "measured": where("curvature", "protocols")},
        {"setting": "eps floor", "paper": f"{_code(paper['eps_floor'])} (the eps rule alone)",
         "bsi": f"{_code(ours.hutchinson.eps_floor)}",
         "why": "below it, fp32 round-off of the two gradients swamps their difference (matters only for hutchinson)",
         "measured": where("curvature")},
        {"setting": "first-order terms", "paper": f"gradient_z {_code(paper['gradient_z'])}: always kept",
         "bsi": f"gradient_z {_code(ours.gradient_z)}: kept where the gradient exceeds that many standard errors",
         "why": "near a fine-tuned minimum the mean gradient is mostly noise; untested, it raised the loss after "
                "recovery (the deviations bench)",
         "measured": where("scores", "protocols")},
        {"setting": "score window", "paper": f"{_code(paper['score_window'])}: the last iterations of a round",
         "bsi": f"{_code(ours.score_window)}: every batch of the round",
         "why": "the tuning steps' per-example gradients come free, so the scores average more batches",
         "measured": where("scores", "protocols")},
        {"setting": "size rule", "paper": "`keep`: each layer's importance-mass rule with KeepRatio",
         "bsi": f"{_code(ours.size.mode)}: the compressible layers end at {_code(ours.size.ratio)} of their "
                "dense size",
         "why": "a size stated in advance, so that methods compare at equal size; the mass rule's size follows "
                "from the scores",
         "measured": where("size")},
        {"setting": "selection", "paper": f"{_code(paper['selection'])}: one keep fraction for every layer",
         "bsi": f"{_code(ours.selection)}: global (least importance per parameter across layers) for "
                "bsi's loss-unit scores",
         "why": "scores in loss units can weigh a basis of one layer against one of another; the mass rule gave a "
                "higher loss on each of three seeds",
         "measured": where("selection", "protocols")},
        {"setting": "cut cap", "paper": f"max_cut_factor {_code(paper['max_cut_factor'])}: none",
         "bsi": f"max_cut_factor {_code(ours.max_cut_factor)}: at most twice a round's even share of a layer",
         "why": "keeps one round from emptying a layer on a noisy score; within noise over three seeds, kept as "
                "a guard",
         "measured": where("cap", "protocols")},
        {"setting": "schedule", "paper": "long: tens of thousands of iterations",
         "bsi": f"{ours.rounds} rounds of {ours.round_length} iterations ({ours.profiling_iters} profiling each), "
                f"{ours.total_iters} in all",
         "why": "what two CPU cores afford; each method in a comparison gets the same schedule",
         "measured": where("schedule", "protocols")},
    ]


def defaults_table_markdown(docs: str = "docs/") -> str:
    """The table "the paper and bsi's defaults" as Markdown, links relative to ``docs`` (the docs folder).

    One row per setting where bsi's default (the ``tuned`` protocol,
    :data:`bsi.config.PROTOCOLS`) departs from the published method: its
    choice in the paper, bsi's, why bsi differs and where the difference was
    measured. Values come from :func:`defaults_rows`. Give ``docs="../docs/"``
    from a notebook, ``""`` from a page inside docs/.
    """
    lines = ["| setting | the paper | bsi's default | why bsi differs | measured in |", "|---|---|---|---|---|"]
    for row in defaults_rows():
        measured = row["measured"].replace("](method.md", f"]({docs}method.md")
        lines.append(f"| {row['setting']} | {row['paper']} | {row['bsi']} | {row['why']} | {measured} |")
    return "\n".join(lines)
