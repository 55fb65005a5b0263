"""Small helpers the teaching notebooks call (``notebooks/``): no new method, only views of it.

The notebooks hold no engine logic. What a cell needs beyond the engine's own
API lives here, as small functions with tests:

* :func:`notebook_settings`: which model and how much work, chosen by the
  ``BSI_NOTEBOOK_MODEL`` environment variable (unset: the embedded model with
  settings that run in a few minutes on a laptop CPU; ``tiny-random-llama``:
  seconds, for CI).
* sizes: :func:`factor_cost`, :func:`break_even_rank`, :func:`rank_table`;
* one layer in Basel form: :func:`convert_layer`, :func:`basel_form_error`;
* derivatives with respect to one layer's sigma: :func:`mean_gradient`,
  :func:`exact_hessian` (double backward, the ground truth) and
  :func:`single_probe_estimates` (the method's symmetric-perturbation
  estimator, one row per Rademacher probe);
* pruning history and comparisons: :func:`rank_history`, :func:`layer_kind`,
  :func:`block_index`, :func:`summary_row`;
* :func:`doc_markdown`: a docstring as Markdown, so notebooks quote the code's
  own explanations instead of copies that drift.
"""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from bsi.errors import BSIError
from bsi.method.curvature import LossFn, evaluation_mode, hessian_vector_product, shifted_sigma, sigma_gradients
from bsi.method.scores import probe_vector, symmetric_difference_hessian
from bsi.method.layers import BasisLinear, LowRankLinear
from bsi.models import EMBEDDED_MODEL, TINY_MODEL
from bsi.method.surgery import parent_and_attr, tied_output_names
from bsi.reports import RoundReport

NOTEBOOK_MODEL_ENV = "BSI_NOTEBOOK_MODEL"
"""Environment variable naming the model the notebooks use (unset: the embedded model)."""


# ------------------------------------------------------------------ settings
@dataclass(frozen=True)
class NotebookSettings:
    """How much work each notebook does; one instance per model size.

    The embedded values are chosen so each notebook runs in a few minutes on
    two CPU cores; the tiny values so that all of them run in about a minute.
    """

    model: str = EMBEDDED_MODEL
    quick: bool = False  # True for the tiny CI model
    batch_size: int = 4
    max_length: int = 128
    test_size: int = 32
    eval_examples: int = 16
    max_new_tokens: int = 48
    exact_positions: int = 12  # bases whose exact Hessian diagonal notebook 02 computes
    probes: int = 16  # single-probe estimates drawn in notebook 02
    profile_batches: int = 2  # notebook 02: mini-batches averaged for E[g] and E[h]
    profile_batch_size: int = 2  # notebook 02: examples per mini-batch (gradients of the whole model: keep small)
    eps_values: tuple[float, ...] = (1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 0.5)
    finetune: dict = field(default_factory=lambda: {"steps": 40, "lr": 2e-4, "warmup_steps": 4})
    compress: dict = field(default_factory=lambda: {
        "rounds": 4, "iters_per_epoch": 16, "sampling_ratio": 0.25, "keep_ratio": 0.6})
    recover: dict = field(default_factory=lambda: {"steps": 8, "lr": 5e-4, "warmup_steps": 1})
    spectrum_k: int = 32  # notebook 04: size of each layer's exact Hessian block
    spectrum_layers: int = 3  # notebook 04: layers whose spectrum is computed
    sweep_targets: tuple[float, ...] = (0.6,)  # notebook 05: target sizes (bsi sweep runs the full grid)
    sweep_methods: tuple[str, ...] = ("svd", "basel", "bsi")  # notebook 05: methods compared
    sweep_compress: dict = field(default_factory=lambda: {"rounds": 2, "iters_per_epoch": 8, "sampling_ratio": 0.5})
    chat_prompts: tuple[str, ...] = (
        "Tom has 12 apples and buys 7 more. How many apples does he have now?",
        "A book costs 8 dollars. How much do 3 books cost?",
    )

    def pipeline_overrides(self) -> dict[str, Any]:
        """Overrides for :func:`bsi.config.make_config` that give these settings."""
        return {
            "model": self.model, "batch_size": self.batch_size, "max_length": self.max_length,
            "test_size": self.test_size, "eval_examples": self.eval_examples,
            "max_new_tokens": self.max_new_tokens, "finetune": dict(self.finetune),
            "compress": dict(self.compress), "recover": dict(self.recover),
        }


TINY_SETTINGS = NotebookSettings(
    model=TINY_MODEL, quick=True, batch_size=4, max_length=96, test_size=8, eval_examples=4,
    max_new_tokens=12, exact_positions=8, probes=16, profile_batches=2, profile_batch_size=4,
    finetune={"steps": 4, "lr": 1e-3, "warmup_steps": 0},
    compress={"rounds": 2, "iters_per_epoch": 8, "sampling_ratio": 0.5, "keep_ratio": 0.5, "aux_rank": 2},
    recover={"steps": 2, "lr": 1e-3, "warmup_steps": 0},
    spectrum_k=8, spectrum_layers=2, sweep_targets=(0.7,),
    sweep_methods=("svd", "fwsvd", "asvd", "basel", "bsi-grad", "bsi"),
    sweep_compress={"rounds": 2, "iters_per_epoch": 4, "sampling_ratio": 0.5},
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


# ---------------------------------------------------------------------- sizes
def factor_cost(in_features: int, out_features: int, rank: int, aux_rank: int = 0) -> int:
    """Parameters of ``rank`` bases plus ``aux_rank`` auxiliary vectors stored as factors: ``(r + a)(in + out)``.

    Each basis ``sigma_i u_i v_i^T`` needs its two vectors (``out + in``
    numbers; sigma folds into ``u_i`` on export), and so does each auxiliary pair.
    """
    return (rank + aux_rank) * (in_features + out_features)


def break_even_rank(in_features: int, out_features: int, aux_rank: int = 0) -> float:
    """The rank at which factors cost as much as the dense matrix: ``in*out/(in+out) - a``.

    Keeping fewer bases than this saves parameters; keeping more would not, so
    such a layer is stored dense (the exported form picks the cheaper one).
    """
    return in_features * out_features / (in_features + out_features) - aux_rank


def layer_kind(name: str) -> str:
    """The layer's role from its qualified name: ``model.layers.3.mlp.down_proj`` -> ``down_proj``."""
    return name.rsplit(".", 1)[-1]


def block_index(name: str) -> int | None:
    """The transformer block a layer sits in (``...layers.3...`` -> 3), or None outside the blocks."""
    match = re.search(r"\.(?:layers|h|blocks)\.(\d+)\.", f".{name}.")
    return int(match.group(1)) if match else None


def rank_table(model: nn.Module) -> list[dict[str, Any]]:
    """One row per compressible layer: shape, full and current rank, stored and dense parameters.

    Works on a dense model (every rank full), on a model in Basel form
    (:class:`~bsi.method.layers.BasisLinear`: the active bases) and on an exported one
    (:class:`~bsi.method.layers.LowRankLinear`). A tied output layer is left out, as
    the engine leaves it alone.
    """
    tied = tied_output_names(model)
    rows = []
    for name, module in model.named_modules():
        if name in tied or not isinstance(module, (nn.Linear, BasisLinear, LowRankLinear)):
            continue
        full = min(module.in_features, module.out_features)
        dense = module.in_features * module.out_features
        if isinstance(module, BasisLinear):
            rank, stored = module.rank, module.stored_parameters() - (module.out_features if module.bias is not None else 0)
        elif isinstance(module, LowRankLinear):
            rank, stored = module.rank, module.A.numel() + module.B.numel()
        else:
            rank, stored = full, dense
        rows.append({
            "layer": name, "kind": layer_kind(name), "block": block_index(name),
            "in": module.in_features, "out": module.out_features, "full_rank": full, "rank": rank,
            "params": stored, "dense_params": dense,
        })
    return rows


# ------------------------------------------------------------- one layer
def convert_layer(model: nn.Module, name: str, aux_rank: int = 0) -> BasisLinear:
    """Swap the single linear layer ``name`` for its exact `BasisLinear`, in place; return it.

    Only this layer's sigma (and auxiliary vectors) require gradients afterwards;
    every other parameter of the model is frozen. Use it to study one layer
    without paying for the SVD of all of them.
    """
    module = dict(model.named_modules()).get(name)
    if isinstance(module, BasisLinear):
        return module
    if not isinstance(module, nn.Linear):
        raise BSIError(f"'{name}' is not a linear layer of this model")
    layer = BasisLinear.from_linear(module, aux_rank=aux_rank)
    parent, attr = parent_and_attr(model, name)
    for p in model.parameters():
        p.requires_grad_(False)
    setattr(parent, attr, layer)
    for p in (layer.sigma, layer.aux_u, layer.aux_v):
        p.requires_grad_(True)
    return layer


@torch.no_grad()
def basel_form_error(linear: nn.Linear, inputs: torch.Tensor, aux_rank: int = 8) -> dict[str, float]:
    """How exactly the Basel form reproduces ``linear`` at start.

    Args:
        linear: the dense layer (left unchanged).
        inputs: (..., in) activations to push through both forms.

    Returns:
        ``weight``: max |W~ - W| over the matrix; ``output``: max |y~ - y| on
        ``inputs``; ``scale``: max |y| (so the errors can be read relative to it).
        Both errors are float32 round-off: the SVD reproduces ``W`` and the
        auxiliary term starts at zero.
    """
    layer = BasisLinear.from_linear(linear, aux_rank=aux_rank)
    y = linear(inputs)
    return {
        "weight": float((layer.dense_weight() - linear.weight.float()).abs().max()),
        "output": float((layer(inputs) - y).abs().max()),
        "scale": float(y.abs().max()),
    }


@torch.no_grad()
def capture_inputs(model: nn.Module, name: str, batch: dict) -> torch.Tensor:
    """The activations entering layer ``name`` when ``model`` reads ``batch``, (B, T, in).

    A forward hook records them during one forward pass and is removed after.
    """
    module = dict(model.named_modules()).get(name)
    if module is None:
        raise BSIError(f"'{name}' is not a module of this model")
    seen: list[torch.Tensor] = []
    handle = module.register_forward_hook(lambda _m, args, _out: seen.append(args[0].detach()))
    try:
        model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"))
    finally:
        handle.remove()
    return seen[0]


@torch.no_grad()
def model_sigma_max(model: nn.Module) -> float:
    """The largest singular value over all compressible layers (the eps rule's ``sigma_max``).

    Layers already in Basel form contribute their largest ``|sigma|``, dense
    ones their spectral norm, so the value does not depend on how many layers
    have been converted.
    """
    from bsi.method.surgery import compressible_linear_names

    values = []
    modules = dict(model.named_modules())
    for name, module in modules.items():
        if isinstance(module, BasisLinear) and module.rank:
            values.append(float(module.sigma.abs().max()))
    for name in compressible_linear_names(model):
        values.append(float(torch.linalg.matrix_norm(modules[name].weight.float(), ord=2)))
    if not values:
        raise BSIError(f"{type(model).__name__} has no linear layer")
    return max(values)


# --------------------------------------------------- derivatives in sigma
def mean_gradient(model: nn.Module, layer: BasisLinear, batches: Iterable[dict], loss_fn: LossFn
                  ) -> tuple[float, torch.Tensor]:
    """Mean loss and ``E[dl/dsigma]`` (r,) of one layer over ``batches`` (dropout off)."""
    losses, total, count = 0.0, torch.zeros_like(layer.sigma, dtype=torch.float32), 0
    with evaluation_mode(model):
        for batch in batches:
            loss, (grad,) = sigma_gradients(model, [layer], batch, loss_fn)
            losses, total, count = losses + float(loss), total + grad, count + 1
    if count == 0:
        raise BSIError("mean_gradient needs at least one batch")
    return losses / count, total / count


def exact_hessian(model: nn.Module, layer: BasisLinear, batch: dict, loss_fn: LossFn,
                  positions: torch.Tensor) -> torch.Tensor:
    """The exact Hessian ``d2l / dsigma_i dsigma_j`` over ``positions`` of one layer, (k, k) float64.

    Column ``j`` is the Hessian-vector product ``H e_j`` from one double
    backward (:func:`bsi.method.curvature.hessian_vector_product`); k columns cost k
    double backwards, so keep k small. The diagonal is the ground truth the
    symmetric-perturbation estimator approximates. The model must use eager
    attention (``load_model_and_tokenizer(..., attn_implementation="eager")``).
    """
    positions = torch.as_tensor(positions, dtype=torch.long)
    columns = []
    with evaluation_mode(model):
        for j in positions.tolist():
            e_j = torch.zeros(layer.rank, device=layer.sigma.device)  # (r,)
            e_j[j] = 1.0
            _, _, (hv,) = hessian_vector_product(model, [layer], batch, loss_fn, [e_j])
            columns.append(hv[positions.to(hv.device)].double().cpu())  # (k,)
    hessian = torch.stack(columns, dim=1)  # (k, k)
    return 0.5 * (hessian + hessian.T)  # remove round-off asymmetry


def single_probe_estimates(model: nn.Module, layer: BasisLinear, batch: dict, loss_fn: LossFn,
                           pool: torch.Tensor, eps: float, probes: int,
                           generator: torch.Generator | None = None) -> torch.Tensor:
    """``probes`` independent one-probe Hessian-diagonal estimates on one batch, (probes, r) float32.

    Each row is the method's estimator for a fresh Rademacher ``z`` (zero
    outside ``pool``): gradients at ``sigma +- (eps/2) z`` on the same batch,
    then ``(g+ - g-) * z / eps`` (:func:`bsi.method.scores.symmetric_difference_hessian`).
    The mean of the first ``s`` rows is the ``s``-probe estimate.
    """
    pool = torch.as_tensor(pool, dtype=torch.long)
    rows = []
    with evaluation_mode(model):
        for _ in range(probes):
            z = probe_vector(layer.rank, pool, generator).to(layer.sigma.device)  # (r,)
            with shifted_sigma([layer], [0.5 * eps * z]):
                _, (g_plus,) = sigma_gradients(model, [layer], batch, loss_fn)
            with shifted_sigma([layer], [-0.5 * eps * z]):
                _, (g_minus,) = sigma_gradients(model, [layer], batch, loss_fn)
            rows.append(symmetric_difference_hessian(g_plus, g_minus, z, eps).cpu())
    return torch.stack(rows)  # (probes, r)


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


def summary_row(method: str, target: float, summary: Mapping[str, Any]) -> dict[str, Any]:
    """One row of a comparison, in the schema of ``bsi sweep``'s ``results.jsonl``, from a pipeline summary.

    ``bsi.pipeline.sweep.results_table`` and ``results_figure`` draw a list of such
    rows; the dense reference row is ``summary_row("dense", 1.0, ...)`` with
    equal sizes before and after.
    """
    metrics = summary.get("metrics_after") or {}
    return {
        "method": method, "target": target, "params_total": summary["params_after"],
        "params_before": summary["params_before"],
        "compression_ratio": summary["params_before"] / summary["params_after"],
        "compressible_ratio": summary["compressible_ratio"], "accuracy": metrics.get("accuracy"),
        "loss": metrics.get("loss"), "examples": metrics.get("examples"), "seconds": summary.get("seconds", 0.0),
    }


# ------------------------------------------------------------ pruning history
def rank_history(rounds: Sequence[RoundReport], initial: Mapping[str, int] | None = None) -> dict[str, list[int]]:
    """Each layer's rank before round 1 and after every round: name -> [r_0, r_1, ..., r_T].

    ``r_0`` comes from ``initial`` when given, else from round 1's ``rank_before``.
    """
    history = {name: [int(rank)] for name, rank in (initial or {}).items()}
    for report in rounds:
        for layer in report.layers:
            history.setdefault(layer.name, [layer.rank_before]).append(layer.rank_after)
    return history


# ------------------------------------------------------------------- docs
def doc_markdown(obj: Any, title: bool = True) -> str:
    """``obj``'s docstring as Markdown: a bold signature line, then the text with code kept verbatim.

    Indented blocks after a ``::`` line (reStructuredText literal blocks) become
    fenced code, and double back-quotes become single ones.
    """
    doc = inspect.getdoc(obj)
    if not doc:
        raise BSIError(f"{getattr(obj, '__qualname__', obj)!r} has no docstring")
    out: list[str] = []
    in_code = False

    def close() -> None:
        while out and not out[-1].strip():
            out.pop()
        out.extend(["```", ""])

    for line in doc.splitlines():
        if in_code and line.strip() and not line.startswith(" "):
            close()
            in_code = False
        if in_code:
            if line.strip() or out[-1] != "```":  # no blank first line inside the fence
                out.append(line[4:] if line.startswith("    ") else line)
            continue
        text = line.replace("``", "`")
        if text.rstrip().endswith("::"):
            out.extend([text.rstrip()[:-1], "", "```"])
            in_code = True
            continue
        out.append(text)
    if in_code:
        close()
    body = "\n".join(out).strip()
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
