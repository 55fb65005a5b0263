"""Hessian spectra in sigma-space: is the curvature really power-law shaped?

The theory of BSI's Hessian estimator (METHOD.md sec. 7, :mod:`bsi.method.theory`)
assumes that, per layer, the eigenvalues of the Hessian of the task loss with
respect to the coefficients sigma decay like a power law,
``|lambda_k| <= |lambda_1| k^-alpha`` with ``alpha > 1/2``. This module
measures it.

For each chosen layer it computes, *exactly*, the (k x k) Hessian of the task
loss (:func:`bsi.pipeline.evaluate.answer_token_loss`) with respect to that layer's
top-k sigmas, every other coefficient fixed (so the model-wide matrix is
treated as block-diagonal: no cross-layer entries), averaged over a few
mini-batches. Column ``j`` of a block is the Hessian-vector product ``H e_j``
obtained by double backward: one forward pass and one ``create_graph``
backward per batch serve every layer, then each column costs one second-order
backward pass (this is :func:`bsi.method.curvature.hessian_vector_product` with a
one-hot vector, without redoing the forward pass for every column).

Double backward needs a differentiable attention kernel, so the model is
switched to eager attention while the spectrum runs
(:func:`eager_attention`), and switched back afterwards.

Per layer it reports the eigenvalues sorted by magnitude, a least-squares
power-law fit on log-log axes, the envelope check, ``|lambda_1|``, the trace,
the share of negative eigenvalues, and the number of Hutchinson probes the
sample-complexity bound asks for (:func:`bsi.method.theory.probes_needed`).

CLI::

    bsi spectrum --model smollm2-135m-instruct --data embedded-math \\
        --layers mlp.down_proj@-1 self_attn.q_proj@0,-1 --top-k 128 --batches 2 --out runs/spectrum

writes ``spectrum.json``, ``summary.txt`` and ``spectrum.html`` (standalone,
log-log plots) into ``--out``.
"""

from __future__ import annotations

import fnmatch
import math
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from bsi.errors import BSIError
from bsi.method.curvature import evaluation_mode
from bsi.method.layers import BasisLinear
from bsi.method.surgery import tied_output_names
from bsi.method.theory import probes_needed

LossFn = Callable[[nn.Module, dict], torch.Tensor]


# --------------------------------------------------------- choosing layers
def layer_kind(name: str) -> str:
    """The layer's type: its name after the last block index (``model.layers.3.mlp.up_proj`` -> ``mlp.up_proj``)."""
    return re.split(r"\.\d+\.", name)[-1]


def candidate_layers(model: nn.Module) -> list[str]:
    """Names of the layers whose sigma-space can be measured: linear or `BasisLinear`, not a tied output layer."""
    tied = tied_output_names(model)
    return [n for n, m in model.named_modules() if isinstance(m, (nn.Linear, BasisLinear)) and n not in tied]


def default_layer_specs(model: nn.Module) -> list[str]:
    """First, middle and last layer of each kind (``kind@0,mid,-1``), in module order."""
    by_kind: dict[str, list[str]] = {}
    for name in candidate_layers(model):
        by_kind.setdefault(layer_kind(name), []).append(name)
    specs = []
    for kind, names in by_kind.items():
        picks = sorted({0, len(names) // 2, len(names) - 1})
        specs += [names[i] for i in picks]
    return specs


def select_layers(model: nn.Module, specs: Sequence[str] | None = None) -> list[str]:
    """Resolve layer specs to layer names (module order, no duplicates).

    Each spec is one of:

    * an exact module name: ``model.layers.3.mlp.down_proj``;
    * a pattern: a substring (``mlp.down_proj``) or a glob (``*.layers.1?.*proj``),
      selecting every matching layer;
    * a pattern with an index selection ``PATTERN@I,J,...``: the I-th, J-th ...
      of its matches in module order; negative indices count from the end
      (``mlp.down_proj@0,-1``: the first and last down-projections).

    ``None`` or an empty list selects :func:`default_layer_specs`.
    """
    candidates = candidate_layers(model)
    if not candidates:
        raise BSIError(f"{type(model).__name__} has no linear layers to measure")
    if not specs:
        return default_layer_specs(model)
    chosen: list[str] = []
    for spec in specs:
        pattern, _, selection = spec.partition("@")
        if any(c in pattern for c in "*?["):
            matches = [n for n in candidates if fnmatch.fnmatchcase(n, pattern)]
        elif pattern in candidates:
            matches = [pattern]
        else:
            matches = [n for n in candidates if pattern in n]
        if not matches:
            raise BSIError(f"no layer matches '{pattern}'; layer names look like '{candidates[0]}' "
                           f"(kinds: {', '.join(sorted({layer_kind(n) for n in candidates}))})")
        if selection:
            try:
                indices = [int(i) for i in selection.split(",")]
            except ValueError:
                raise BSIError(f"bad index selection in '{spec}': use comma-separated integers, e.g. '{pattern}@0,-1'") from None
            bad = [i for i in indices if not -len(matches) <= i < len(matches)]
            if bad:
                raise BSIError(f"'{spec}': index {bad[0]} out of range; '{pattern}' matches {len(matches)} layers")
            matches = [matches[i] for i in indices]
        chosen += [m for m in matches if m not in chosen]
    order = {n: i for i, n in enumerate(candidates)}
    return sorted(chosen, key=order.__getitem__)


def prepare_layers(model: nn.Module, names: Sequence[str]) -> list[BasisLinear]:
    """The named layers as `BasisLinear` (plain ``nn.Linear`` ones are converted in place, exactly).

    Every parameter of the model is frozen except the chosen layers' sigma,
    so backward passes compute nothing else. The conversion changes no output
    (the SVD is exact); it does change the module tree, so pass a model you
    own.
    """
    modules = dict(model.named_modules())
    missing = [n for n in names if n not in modules]
    if missing:
        raise BSIError(f"model has no layer '{missing[0]}'")
    wrong = [n for n in names if not isinstance(modules[n], (nn.Linear, BasisLinear))]
    if wrong:
        raise BSIError(f"layer '{wrong[0]}' is a {type(modules[wrong[0]]).__name__}, not a linear layer")
    for p in model.parameters():
        p.requires_grad_(False)
    layers = []
    for name in names:
        layer = modules[name]
        if not isinstance(layer, BasisLinear):
            parent_name, _, attr = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            layer = BasisLinear.from_linear(layer, aux_rank=0)
            setattr(parent, attr, layer)
        layer.sigma.requires_grad_(True)
        layers.append(layer)
    return layers


def top_positions(sigma: torch.Tensor, k: int) -> torch.Tensor:
    """(min(k, r),) int64 positions of the k largest ``|sigma|``, largest first."""
    return torch.argsort(sigma.detach().abs(), descending=True)[: min(k, sigma.numel())].cpu()


@contextmanager
def eager_attention(model: nn.Module) -> Iterator[nn.Module]:
    """Run the block with eager attention (double backward through SDPA/flash kernels fails).

    Uses ``model.set_attn_implementation`` (transformers >= 5); the previous
    implementation is restored afterwards. A model without an attention
    config (a plain ``nn.Module``) is left as it is.
    """
    config = getattr(model, "config", None)
    previous = getattr(config, "_attn_implementation", None)
    if config is None or previous in (None, "eager"):
        yield model
        return
    if not hasattr(model, "set_attn_implementation"):
        raise BSIError(f"cannot switch {type(model).__name__} to eager attention; load it with attn_implementation='eager'")
    model.set_attn_implementation("eager")
    try:
        yield model
    finally:
        model.set_attn_implementation(previous)


# ------------------------------------------------------------- the Hessian
def hessian_blocks(
    model: nn.Module, layers: Sequence[BasisLinear], positions: Sequence[torch.Tensor], batch: dict, loss_fn: LossFn
) -> tuple[float, list[torch.Tensor]]:
    """Exact per-layer Hessian blocks ``d2l / dsigma[pos] dsigma[pos]`` on one batch.

    One forward pass and one first-order backward with ``create_graph=True``
    give ``g_l = dl/dsigma_l`` for every layer as a differentiable graph;
    column ``j`` of layer ``l``'s block is then ``d g_l[pos_j] / dsigma_l``
    restricted to ``pos`` (one second-order backward each). Other layers'
    coefficients stay fixed: no cross-layer entries are computed.

    Args:
        layers: `BasisLinear` layers whose sigma requires grad.
        positions: per layer, (k_l,) int64 positions in its sigma.

    Returns:
        (loss, blocks) with blocks[l] of shape (k_l, k_l), float64, as computed
        (not symmetrised).
    """
    sigmas = [layer.sigma for layer in layers]
    loss = loss_fn(model, batch)
    if not torch.isfinite(loss):
        raise BSIError("the loss of a spectrum batch is not finite (no answer tokens left after truncation?); "
                       "raise --max-length")
    grads = torch.autograd.grad(loss, sigmas, create_graph=True, allow_unused=True)
    blocks = []
    for sigma, pos, grad in zip(sigmas, positions, grads):
        k = pos.numel()
        block = torch.zeros(k, k, dtype=torch.float64)  # (k, k)
        if grad is not None and grad.requires_grad:
            for j in range(k):
                (column,) = torch.autograd.grad(grad[pos[j]], sigma, retain_graph=True, allow_unused=True)
                if column is not None:
                    block[:, j] = column.detach()[pos.to(column.device)].double().cpu()
        blocks.append(block)
    return float(loss.detach()), blocks


def sorted_eigenvalues(hessian: torch.Tensor) -> torch.Tensor:
    """Eigenvalues of the symmetric part of ``hessian``, signed, sorted by decreasing magnitude, (k,) float64."""
    sym = 0.5 * (hessian.double() + hessian.double().T)  # (k, k)
    values = torch.linalg.eigvalsh(sym)  # (k,) ascending
    return values[torch.argsort(values.abs(), descending=True, stable=True)]


@dataclass(frozen=True)
class PowerLawFit:
    """A power law ``|lambda_k| ~ c k^-alpha`` fitted to a magnitude-sorted spectrum.

    * ``alpha``, ``log_c``, ``r2``: least squares of ``log |lambda_k|`` on
      ``log k`` (eigenvalues below ``1e-12 |lambda_1|`` are left out).
    * ``envelope_share``: share of ``k`` with ``|lambda_k| <= |lambda_1| k^-alpha``
      (the theory's envelope, anchored at ``lambda_1``, with the fitted alpha).
    * ``alpha_envelope``: the largest exponent whose envelope holds for every
      k, ``min_k log(|lambda_1| / |lambda_k|) / log k``; the theory needs an
      envelope with exponent > 1/2, so ``alpha_envelope > 0.5`` confirms its
      assumption for this block.
    """

    alpha: float
    log_c: float
    r2: float
    envelope_share: float
    alpha_envelope: float
    points: int


def fit_power_law(magnitudes: Sequence[float] | torch.Tensor) -> PowerLawFit:
    """Fit ``|lambda_k| ~ c k^-alpha`` to magnitudes sorted in decreasing order (see :class:`PowerLawFit`)."""
    m = torch.as_tensor(magnitudes, dtype=torch.float64).abs().flatten()  # (n,)
    m = m.sort(descending=True).values
    n = m.numel()
    if n == 0 or m[0] <= 0:
        return PowerLawFit(math.nan, math.nan, math.nan, math.nan, math.nan, 0)
    k = torch.arange(1, n + 1, dtype=torch.float64)
    valid = m > 1e-12 * m[0]
    x, y = k[valid].log(), m[valid].log()
    if x.numel() < 2:
        return PowerLawFit(math.nan, float(y[0]), math.nan, math.nan, math.nan, int(x.numel()))
    xc, yc = x - x.mean(), y - y.mean()
    slope = float((xc * yc).sum() / xc.square().sum())
    intercept = float(y.mean() - slope * x.mean())
    residual = y - (intercept + slope * x)
    total = float(yc.square().sum())
    r2 = 1 - float(residual.square().sum()) / total if total > 0 else 1.0
    alpha = -slope
    envelope = m[0] * k.pow(-alpha)
    share = float((m <= envelope * (1 + 1e-9)).double().mean())
    rest = valid & (k > 1)
    alpha_env = float((torch.log(m[0] / m[rest]) / k[rest].log()).min()) if rest.any() else math.inf
    return PowerLawFit(alpha, intercept, r2, share, alpha_env, int(x.numel()))


# ------------------------------------------------------------------ results
@dataclass
class LayerSpectrum:
    """One layer's measured Hessian block and what it says.

    ``eigenvalues`` are signed and sorted by decreasing magnitude;
    ``lambda_1`` is the largest magnitude; ``negative_share`` the share of
    negative eigenvalues; ``probes`` the Hutchinson probes the measured
    spectrum asks for (relative error ``error`` with probability ``1 - delta``,
    :func:`bsi.method.theory.probes_needed`); ``asymmetry`` = ``||H - H^T|| / ||H||``
    of the computed block (rounding only: the exact Hessian is symmetric).
    """

    name: str
    kind: str
    k: int
    positions: list[int]
    sigma: list[float]
    eigenvalues: list[float]
    diagonal: list[float]
    fit: PowerLawFit
    lambda_1: float
    trace: float
    negative_share: float
    frobenius: float
    asymmetry: float
    probes: float
    error: float
    delta: float
    hessian: torch.Tensor | None = field(default=None, repr=False)

    @classmethod
    def from_hessian(cls, name: str, positions: torch.Tensor, sigma: torch.Tensor, hessian: torch.Tensor,
                     error: float = 0.1, delta: float = 0.1) -> LayerSpectrum:
        """Summarise a (k, k) Hessian block of layer ``name`` (its symmetric part)."""
        h = hessian.double()
        sym = 0.5 * (h + h.T)  # (k, k)
        eig = sorted_eigenvalues(sym)  # (k,)
        norm = float(h.norm())
        return cls(
            name=name, kind=layer_kind(name), k=int(positions.numel()), positions=positions.tolist(),
            sigma=sigma.detach().double().cpu()[positions].tolist(), eigenvalues=eig.tolist(),
            diagonal=torch.diagonal(sym).tolist(), fit=fit_power_law(eig.abs()),
            lambda_1=float(eig.abs().max()) if eig.numel() else 0.0, trace=float(eig.sum()),
            negative_share=float((eig < 0).double().mean()) if eig.numel() else 0.0,
            frobenius=float(sym.norm()), asymmetry=float((h - h.T).norm()) / norm if norm > 0 else 0.0,
            probes=probes_needed(eig, error, delta) if eig.numel() else math.nan,
            error=error, delta=delta, hessian=sym,
        )

    def to_dict(self) -> dict:
        """JSON-ready dict (without the matrix itself)."""
        out = {k: v for k, v in asdict(self).items() if k != "hessian"}
        out["fit"] = asdict(self.fit)
        return out


@dataclass(frozen=True)
class SpectrumProgress:
    """One layer of one batch done (the spectrum's progress report)."""

    batch: int
    batches: int
    layer: str
    layer_index: int
    layers: int
    loss: float
    seconds: float


@dataclass
class SpectrumResult:
    """All measured layers plus how they were measured."""

    layers: list[LayerSpectrum]
    top_k: int
    batches: int
    losses: list[float]
    seconds: float
    meta: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "top_k": self.top_k, "batches": self.batches, "losses": self.losses, "seconds": self.seconds,
            **self.meta, "layers": [layer.to_dict() for layer in self.layers],
        }

    def summary_rows(self) -> list[dict]:
        """Per layer: alpha, |lambda_1|, trace, share of negative eigenvalues (and the rest of the summary)."""
        return [
            {"layer": s.name, "kind": s.kind, "k": s.k, "alpha": s.fit.alpha, "alpha_envelope": s.fit.alpha_envelope,
             "r2": s.fit.r2, "envelope_share": s.fit.envelope_share, "lambda_1": s.lambda_1, "trace": s.trace,
             "negative_share": s.negative_share, "probes": s.probes}
            for s in self.layers
        ]

    def summary_table(self) -> str:
        """The per-layer summary as a Markdown table."""
        if not self.layers:
            return "(no layers)"
        e, d = self.layers[0].error, self.layers[0].delta
        head = ("| layer | k | alpha (fit) | R^2 | alpha (envelope) | share under envelope | abs(lambda_1) | trace "
                f"| negative share | probes (e={e:g}, delta={d:g}) |")
        lines = [head, "|" + "---|" * 10]
        for r in self.summary_rows():
            probes = "inf" if math.isinf(r["probes"]) else f"{int(r['probes']):,}"
            lines.append(
                f"| {r['layer']} | {r['k']} | {r['alpha']:.2f} | {r['r2']:.2f} | {r['alpha_envelope']:.2f} "
                f"| {r['envelope_share']:.2f} | {r['lambda_1']:.3g} | {r['trace']:.3g} | {r['negative_share']:.2f} "
                f"| {probes} |"
            )
        return "\n".join(lines)

    def save(self, out_dir: str | Path) -> Path:
        """Write ``spectrum.json``, ``summary.txt`` (Markdown table) and ``spectrum.html`` atomically."""
        from bsi.files import atomic_directory, atomic_write_json, atomic_write_text

        with atomic_directory(out_dir) as tmp:
            atomic_write_json(tmp / "spectrum.json", self.to_dict())
            atomic_write_text(tmp / "summary.txt", self.summary_table() + "\n")
            spectrum_figure(self).write_html(tmp / "spectrum.html", include_plotlyjs=True, full_html=True)
        return Path(out_dir)


def spectrum_figure(result: SpectrumResult):
    """Log-log plots of ``|lambda_k|`` against ``k``: raw (left) and divided by ``|lambda_1|`` with envelopes (right).

    Filled markers are positive eigenvalues, open markers negative ones; the
    dashed line on the right is the layer's envelope ``k^-alpha`` (fitted alpha).
    """
    import plotly.graph_objects as go
    from plotly.colors import qualitative
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("|eigenvalue| by rank", "relative to |lambda_1|, with envelope k^-alpha"))
    kinds = sorted({s.kind for s in result.layers})
    palette = {kind: qualitative.Plotly[i % len(qualitative.Plotly)] for i, kind in enumerate(kinds)}
    for s in result.layers:
        eig = torch.tensor(s.eigenvalues, dtype=torch.float64)
        mag = eig.abs()
        keep = mag > 0
        k = torch.arange(1, eig.numel() + 1)[keep].tolist()
        symbols = ["circle" if v > 0 else "circle-open" for v in eig[keep].tolist()]
        color = palette[s.kind]
        label = f"{s.name} (alpha {s.fit.alpha:.2f})"
        common = dict(mode="markers+lines", line=dict(width=1, color=color), legendgroup=s.name,
                      marker=dict(symbol=symbols, size=5, color=color))
        fig.add_trace(go.Scatter(x=k, y=mag[keep].tolist(), name=label, **common), row=1, col=1)
        fig.add_trace(go.Scatter(x=k, y=(mag[keep] / s.lambda_1).tolist(), name=label, showlegend=False, **common),
                      row=1, col=2)
        if math.isfinite(s.fit.alpha):
            kk = torch.arange(1, eig.numel() + 1, dtype=torch.float64)
            fig.add_trace(go.Scatter(x=kk.tolist(), y=kk.pow(-s.fit.alpha).tolist(), mode="lines", showlegend=False,
                                     legendgroup=s.name, line=dict(dash="dash", width=1, color=color),
                                     hoverinfo="skip"), row=1, col=2)
    fig.update_xaxes(type="log", title_text="k (rank by magnitude)")
    fig.update_yaxes(type="log")
    fig.update_yaxes(title_text="|lambda_k|", row=1, col=1)
    fig.update_yaxes(title_text="|lambda_k| / |lambda_1|", row=1, col=2)
    fig.update_layout(title=f"Hessian spectra in sigma-space (top-{result.top_k} sigmas, {result.batches} batches)",
                      height=560, legend=dict(font=dict(size=10)))
    return fig


# ------------------------------------------------------------ orchestration
class SpectrumAnalysis:
    """Measure the Hessian spectrum of chosen layers, averaged over batches.

    Args:
        model: a causal LM (or any module whose ``loss_fn`` is differentiable
            twice); chosen ``nn.Linear`` layers are converted to `BasisLinear`
            in place and every parameter is frozen except their sigma.
        layer_names: names from :func:`select_layers`.
        batches: the mini-batches to average over.
        loss_fn: ``loss_fn(model, batch) -> scalar``, by default the answer-token loss.
        top_k: sigmas per layer (the k largest).
        error, delta: the (e, delta) guarantee for the probes-needed column.

    :meth:`run` is a generator: it yields a :class:`SpectrumProgress` after
    each layer of each batch, then one :class:`SpectrumResult`.
    """

    def __init__(self, model: nn.Module, layer_names: Sequence[str], batches: Sequence[dict],
                 loss_fn: LossFn | None = None, top_k: int = 128, error: float = 0.1, delta: float = 0.1,
                 meta: dict | None = None) -> None:
        if top_k < 1:
            raise BSIError(f"top-k must be >= 1, got {top_k}")
        if not batches:
            raise BSIError("the spectrum needs at least one batch")
        if not layer_names:
            raise BSIError("no layer chosen for the spectrum")
        if not error > 0 or not 0 < delta < 1:
            raise BSIError(f"need error > 0 and 0 < delta < 1, got error={error}, delta={delta}")
        if loss_fn is None:
            from bsi.pipeline.losses import answer_token_loss

            loss_fn = answer_token_loss
        self.model, self.names, self.batches, self.loss_fn = model, list(layer_names), list(batches), loss_fn
        self.top_k, self.error, self.delta, self.meta = top_k, error, delta, dict(meta or {})

    def run(self) -> Iterator[SpectrumProgress | SpectrumResult]:
        start = time.perf_counter()
        layers = prepare_layers(self.model, self.names)
        positions = [top_positions(layer.sigma, self.top_k) for layer in layers]
        sums = [torch.zeros(p.numel(), p.numel(), dtype=torch.float64) for p in positions]
        losses = []
        with eager_attention(self.model), evaluation_mode(self.model):
            for b, batch in enumerate(self.batches):
                for i, layer in enumerate(layers):
                    # one layer at a time keeps one graph in memory and lets progress flow
                    loss, (block,) = hessian_blocks(self.model, [layer], [positions[i]], batch, self.loss_fn)
                    sums[i] += block
                    yield SpectrumProgress(b + 1, len(self.batches), self.names[i], i + 1, len(layers), loss,
                                           time.perf_counter() - start)
                losses.append(loss)
        spectra = [
            LayerSpectrum.from_hessian(name, pos, layer.sigma, total / len(self.batches), self.error, self.delta)
            for name, layer, pos, total in zip(self.names, layers, positions, sums)
        ]
        yield SpectrumResult(spectra, self.top_k, len(self.batches), losses, time.perf_counter() - start, self.meta)


def compute_spectra(*args, **kwargs) -> SpectrumResult:
    """Run :class:`SpectrumAnalysis` to the end and return its result (same arguments)."""
    result = None
    for report in SpectrumAnalysis(*args, **kwargs).run():
        result = report
    assert isinstance(result, SpectrumResult)
    return result
