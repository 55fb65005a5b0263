"""Hessian spectra in sigma-space: is the curvature really power-law shaped?

The theory of BSI's Hessian estimator (:mod:`bsi.method.theory`)
assumes that, per layer, the eigenvalues of the Hessian of the task loss with
respect to the coefficients sigma decay like a power law,
``|lambda_k| <= |lambda_1| k^-alpha`` with ``alpha > 1/2``. This module
measures it.

For each chosen layer it computes, *exactly*, the (k x k) Hessian of the task
loss (:func:`bsi.pipeline.losses.answer_token_loss`) with respect to that
layer's top-k sigmas, every other coefficient fixed (so the model-wide matrix
is treated as block-diagonal: no cross-layer entries), averaged over a few
mini-batches. The matrix is :func:`bsi.method.curvature.exact_hessian` (one
double backward per column); a plain linear layer is written in Basel form
only while it is measured (:func:`measured_layers`, through
:func:`bsi.method.surgery.basis_form`), so the model comes back unchanged.

Double backward needs a differentiable attention kernel, so the model is
switched to eager attention while the spectrum runs
(:func:`bsi.method.curvature.eager_attention`), and switched back afterwards.

Per layer it reports the eigenvalues sorted by magnitude, a least-squares
power-law fit on log-log axes, the envelope check, ``|lambda_1|``, the trace,
the share of negative eigenvalues, and the number of Hutchinson probes the
sample-complexity bound asks for (:func:`bsi.method.theory.probes_needed`).
The figure is :func:`bsi.analysis.figures.spectrum_figure`.

CLI::

    bsi spectrum --out runs/spectrum                      # the defaults: about a minute on a 2-core CPU
    bsi spectrum --layers mlp.down_proj@0,-1 self_attn.q_proj@0 --top-k 64 --batches 2 --out runs/spectrum

By default it measures the last block's layer of each kind (the cheapest to
differentiate twice: the second backward stops at the layer) with ``--top-k
16`` on one batch. It writes ``spectrum.json``, ``summary.txt`` and
``spectrum.html`` (standalone, log-log plots) into ``--out``.
"""

from __future__ import annotations

import fnmatch
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from bsi.analysis.figures import spectrum_figure  # SpectrumResult.save draws it; notebooks import it from here
from bsi.errors import BSIError
from bsi.method.curvature import eager_attention, exact_hessian
from bsi.method.layers import BasisLinear
from bsi.method.names import layer_kind
from bsi.method.surgery import basis_form, tied_output_names
from bsi.method.theory import probes_needed

LossFn = Callable[[nn.Module, dict], torch.Tensor]


# --------------------------------------------------------- choosing layers
def candidate_layers(model: nn.Module) -> list[str]:
    """Names of the layers whose sigma-space can be measured: linear or `BasisLinear`, not a tied output layer."""
    tied = tied_output_names(model)
    return [n for n, m in model.named_modules() if isinstance(m, (nn.Linear, BasisLinear)) and n not in tied]


def default_layer_specs(model: nn.Module) -> list[str]:
    """The last layer of each kind (``kind@-1``), in module order.

    The last block's layers are the cheapest to measure: each column of the
    Hessian is one second backward, which stops at the layer, so a layer of
    block 0 costs a full-depth backward per column (about ten times more on
    a 30-block model).
    """
    last: dict[str, str] = {}
    for name in candidate_layers(model):
        last[layer_kind(name)] = name
    return list(last.values())


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


@contextmanager
def measured_layers(model: nn.Module, names: Sequence[str]) -> Iterator[list[BasisLinear]]:
    """The named layers as `BasisLinear` for the duration of the block, only their sigma requiring grad.

    Plain ``nn.Linear`` layers are written in Basel form (exact SVD, no
    auxiliary vectors) by :func:`bsi.method.surgery.basis_form` and put back
    afterwards; layers already in Basel form are used as they are. Every
    parameter's ``requires_grad`` flag is restored on the way out, so the
    model leaves the block as it came in.
    """
    modules = dict(model.named_modules())
    missing = [n for n in names if n not in modules]
    if missing:
        raise BSIError(f"model has no layer '{missing[0]}'")
    wrong = [n for n in names if not isinstance(modules[n], (nn.Linear, BasisLinear))]
    if wrong:
        raise BSIError(f"layer '{wrong[0]}' is a {type(modules[wrong[0]]).__name__}, not a linear layer")
    plain = [n for n in names if not isinstance(modules[n], BasisLinear)]
    flags = [(p, p.requires_grad) for p in model.parameters()]
    with basis_form(model, plain) if plain else nullcontext():
        layers = [model.get_submodule(n) for n in names]
        for p in model.parameters():
            p.requires_grad_(False)
        for layer in layers:
            layer.sigma.requires_grad_(True)
        try:
            yield layers
        finally:
            for p, flag in flags:
                p.requires_grad_(flag)


def top_positions(sigma: torch.Tensor, k: int) -> torch.Tensor:
    """(min(k, r),) int64 positions of the k largest ``|sigma|``, largest first."""
    return torch.argsort(sigma.detach().abs(), descending=True)[: min(k, sigma.numel())].cpu()


# ------------------------------------------------------------- the Hessian
def layer_hessian(model: nn.Module, layer: BasisLinear, batch: dict, loss_fn: LossFn,
                  positions: torch.Tensor) -> tuple[float, torch.Tensor]:
    """(loss, the exact (k, k) Hessian over ``layer.sigma[positions]``) on one batch, float64.

    :func:`bsi.method.curvature.exact_hessian` with the batch's loss recorded,
    and a clear error instead of a NaN matrix when that loss is not finite.
    """
    losses: list[float] = []

    def checked(m: nn.Module, b: dict) -> torch.Tensor:
        loss = loss_fn(m, b)
        if not torch.isfinite(loss):
            raise BSIError("the loss of a spectrum batch is not finite (no answer tokens left after truncation?); "
                           "raise the maximum length")
        losses.append(float(loss.detach()))
        return loss

    hessian = exact_hessian(model, layer, batch, checked, positions)
    return losses[0], hessian


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
    * ``envelope_share``: share of ``k`` with ``|lambda_k| <= |lambda_1| k^-alpha``,
      the *fitted* exponent's line anchored at ``lambda_1``: how much of the
      spectrum lies under the fitted line, not the envelope (the envelope,
      with ``alpha_envelope``, lies above every point by construction). The
      name stays for the ``spectrum.json`` files already written.
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
    :func:`bsi.method.theory.probes_needed`); ``asymmetry`` is
    ``||H - H^T|| / ||H||`` of the measured block, a check of the measurement
    (an exact Hessian is symmetric, so it should sit at round-off level).
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
        return cls(
            name=name, kind=layer_kind(name), k=int(positions.numel()), positions=positions.tolist(),
            sigma=sigma.detach().double().cpu()[positions].tolist(), eigenvalues=eig.tolist(),
            diagonal=torch.diagonal(sym).tolist(), fit=fit_power_law(eig.abs()),
            lambda_1=float(eig.abs().max()) if eig.numel() else 0.0, trace=float(eig.sum()),
            negative_share=float((eig < 0).double().mean()) if eig.numel() else 0.0,
            frobenius=float(sym.norm()),
            asymmetry=float((h - h.T).norm() / h.norm()) if h.norm() > 0 else 0.0,
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
        head = ("| layer | k | alpha (fit) | R^2 | alpha (envelope) | share under fitted line | abs(lambda_1) | trace "
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


# ------------------------------------------------------------ orchestration
class SpectrumAnalysis:
    """Measure the Hessian spectrum of chosen layers, averaged over batches.

    Args:
        model: a causal LM (or any module whose ``loss_fn`` is differentiable
            twice); the chosen ``nn.Linear`` layers are in Basel form only
            while they are measured (:func:`measured_layers`), and the model
            comes back as it was.
        layer_names: names from :func:`select_layers`.
        batches: the mini-batches to average over.
        loss_fn: ``loss_fn(model, batch) -> scalar``: the task loss, such as
            :func:`bsi.pipeline.losses.answer_token_loss` (the surfaces pass it).
        top_k: sigmas per layer (the k largest).
        error, delta: the (e, delta) guarantee for the probes-needed column.

    :meth:`run` is a generator: it yields a :class:`SpectrumProgress` after
    each layer of each batch, then one :class:`SpectrumResult`.
    """

    def __init__(self, model: nn.Module, layer_names: Sequence[str], batches: Sequence[dict],
                 loss_fn: LossFn, top_k: int = 16, error: float = 0.1, delta: float = 0.1,
                 meta: dict | None = None) -> None:
        if top_k < 1:
            raise BSIError(f"top-k must be >= 1, got {top_k}")
        if not batches:
            raise BSIError("the spectrum needs at least one batch")
        if not layer_names:
            raise BSIError("no layer chosen for the spectrum")
        if not error > 0 or not 0 < delta < 1:
            raise BSIError(f"need error > 0 and 0 < delta < 1, got error={error}, delta={delta}")
        self.model, self.names, self.batches, self.loss_fn = model, list(layer_names), list(batches), loss_fn
        self.top_k, self.error, self.delta, self.meta = top_k, error, delta, dict(meta or {})

    def run(self) -> Iterator[SpectrumProgress | SpectrumResult]:
        start = time.perf_counter()
        with measured_layers(self.model, self.names) as layers, eager_attention(self.model):
            positions = [top_positions(layer.sigma, self.top_k) for layer in layers]
            sums = [torch.zeros(p.numel(), p.numel(), dtype=torch.float64) for p in positions]
            losses = []
            for b, batch in enumerate(self.batches):
                for i, layer in enumerate(layers):
                    # one layer at a time keeps one graph in memory and lets progress flow
                    loss, block = layer_hessian(self.model, layer, batch, self.loss_fn, positions[i])
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
