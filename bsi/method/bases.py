"""Which bases a layer is written in: plain SVD, weighted SVD, or SVD of the whitened weight.

Every function returns ``(U, sigma, V)`` with ``W = U diag(sigma) V^T``
(``U`` (out, r), ``sigma`` (r,) descending, ``V`` (in, r), ``r = min(out, in)``),
so the layer stays *exact* whatever the choice; what changes is which
truncation keeping the first k bases gives:

* :func:`svd_bases`, the plain SVD: the smallest ``||W - W_k||_F``. Blind to
  the data: a direction of ``W`` the task's inputs never excite costs as
  much to drop as one they use all the time.
* :func:`whitened_bases`, the SVD of ``W S`` where ``S S^T = X^T X / N`` is the
  covariance of the layer's inputs ``X`` on task batches (a Cholesky factor),
  with ``S^{-1}`` folded back into ``V``: the smallest *output* error on those
  inputs, ``||X (W - W_k)^T||_F``, since ``||X D^T||_F^2 = N ||D S||_F^2`` for
  any ``D``. In these bases ``sigma_i^2`` is the mean squared change of the
  layer's output on those inputs when basis ``i`` is dropped: exactly at zero
  damping, a slight overestimate with the damping of :func:`whitening_factor`,
  and an estimate on any other inputs. (This is the truncation-aware whitening
  of SVD-LLM, Wang et al. 2024.)
* :func:`weighted_svd`: the SVD of ``diag(d) W diag(s)`` with the weights
  folded back out, for the FWSVD and ASVD baselines.

``U`` stays orthonormal in the whitened bases; ``V`` does not, which nothing
in bsi assumes. The input statistics are gathered by
:class:`InputStatistics` from forward passes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from bsi.errors import BSIError

SVD_TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-9}
"""The largest relative reconstruction error ``||U S V^T - W||_F / ||W||_F`` accepted from the fast CUDA SVD."""


def thin_svd(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``torch.linalg.svd(w, full_matrices=False)``, with the fastest accurate driver on a GPU.

    On CUDA, torch's default driver for square and wide matrices (``gesvdj``,
    Jacobi) took 1.1 s per 4096 x 11008 float32 matrix on an H100 and
    reconstructed it to a relative error of only ``1e-3``; ``gesvda`` took
    0.14 s with ``1.3e-6`` (bench/gpu.py ``--sections svd``, 2026-11-26).
    ``gesvda`` is an approximate method whose accuracy the cuSOLVER manual
    does not promise, so its result is checked: above :data:`SVD_TOLERANCE`
    the matrix is factorised again with ``gesvd`` (QR-based, 1.6 s, ``1.3e-5``).
    On the CPU there is one driver (LAPACK's ``gesdd``), and it is faster on a
    tall matrix than on the same matrix lying down: a wide ``w`` (fewer rows
    than columns, such as a ``down_proj``) is factorised as ``w^T = V S U^T``
    and the factors handed back swapped (576 x 1536 in float64 on one thread:
    228 ms as it is, 117 ms transposed; the embedded model's 210 float64 SVDs
    17.4 s -> 14.1 s; ``python bench/speed.py --sections svd``,
    ``data/speed/svd-2026-12-02-intel-xeon-1t.json``). Either way the result
    is an SVD of ``w``; singular vectors are unique only up to their signs,
    and these may differ from ``torch.linalg.svd(w)``'s.

    Args:
        w: (out, in) float32 or float64.

    Returns:
        ``U`` (out, r), ``sigma`` (r,) descending, ``Vh`` (r, in), ``r = min(out, in)``.
    """
    u: torch.Tensor
    s: torch.Tensor
    vh: torch.Tensor
    if not w.is_cuda:
        if w.shape[0] < w.shape[1]:
            ut, s, vht = torch.linalg.svd(w.T, full_matrices=False)  # (in, r), (r,), (r, out)
            return vht.T.contiguous(), s, ut.T.contiguous()
        u, s, vh = torch.linalg.svd(w, full_matrices=False)
        return u, s, vh
    u, s, vh = torch.linalg.svd(w, full_matrices=False, driver="gesvda")  # (out, r), (r,), (r, in)
    error = torch.linalg.matrix_norm((u * s) @ vh - w) / torch.linalg.matrix_norm(w).clamp_min(1e-30)
    if bool(torch.isfinite(error)) and float(error) <= SVD_TOLERANCE.get(w.dtype, 1e-4):
        return u, s, vh
    u, s, vh = torch.linalg.svd(w, full_matrices=False, driver="gesvd")
    return u, s, vh


def svd_bases(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Thin SVD of a weight matrix, computed in fp32.

    Args:
        weight: (out, in) dense weight.

    Returns:
        ``U`` (out, r), ``sigma`` (r,), ``V`` (in, r) with ``r = min(out, in)``,
        sigma sorted descending, such that ``weight ~= U @ diag(sigma) @ V.T``.
    """
    w = weight.detach().to(torch.float32)
    u, s, vh = thin_svd(w)  # (out, r), (r,), (r, in)
    return u, s, vh.T.contiguous()


def whitening_factor(covariance: torch.Tensor, damping: float = 1e-3) -> torch.Tensor:
    """Lower-triangular ``S`` with ``S S^T = C + damping * mean(diag C) * I`` (Cholesky, float64).

    The damping keeps ``S`` invertible when some input directions never occur
    (a rank-deficient covariance); it is relative, so it means the same for
    any scale of activations.

    Args:
        covariance: (in, in) symmetric positive semi-definite ``X^T X / N``.
    """
    c = covariance.detach().double()  # (in, in); the very tensor when it is float64 already: not written to
    # 0.5 (C + C^T), element for element, from a contiguous C^T: adding the strided view C.T costs 2.7x more
    # at 1536 x 1536 (17.6 -> 6.6 ms, medians of 20, one thread; data/speed/suite-tries-2026-12-06-amd-epyc.json); the sum
    # is the same either way round, to the bit
    symmetric = c.T.contiguous().add_(c).mul_(0.5)  # (in, in)
    scale = float(symmetric.diagonal().mean()) if symmetric.numel() else 1.0
    scale = scale if scale > 0 else 1.0
    jitter = max(damping, 1e-10)
    factor: torch.Tensor
    info: torch.Tensor
    for _ in range(8):  # more damping until the factorisation succeeds (round-off can make C indefinite)
        damped = symmetric.clone()
        damped.diagonal().add_(jitter * scale)  # C + jitter * scale * I, to the bit, without building I
        factor, info = torch.linalg.cholesky_ex(damped)
        if int(info) == 0:
            return factor
        jitter *= 10
    raise BSIError(f"the covariance of a layer's inputs is not positive definite even with damping {jitter / 10:g} "
                   "(its activations are probably not finite): run in float32 (--dtype float32), or use plain "
                   "SVD bases (--bases svd)")


def whitened_bases(weight: torch.Tensor, covariance: torch.Tensor, damping: float = 1e-3,
                   factor: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Bases in which truncation minimises the output error on the calibration inputs.

    With ``S`` from :func:`whitening_factor`, ``W S = U' diag(s) V'^T`` (SVD), so
    ``W = U' diag(s) (S^{-T} V')^T``: returns ``U = U'``, ``sigma = s`` and
    ``V = S^{-T} V'`` (a triangular solve, no explicit inverse).

    Args:
        weight: (out, in).
        covariance: (in, in) second moment of the layer's inputs.
        damping: see :func:`whitening_factor`.
        factor: ``whitening_factor(covariance, damping)`` when the caller has it
            already (layers that share an input share it: :func:`whitened_bases_by`);
            computed here otherwise.

    Returns:
        ``U`` (out, r), ``sigma`` (r,) descending, ``V`` (in, r), float32, on
        the weight's device, with ``U diag(sigma) V^T == weight`` up to rounding.
    """
    device = weight.device
    s_factor = (whitening_factor(covariance.to(device), damping) if factor is None
                else factor.to(device))  # (in, in) lower, float64
    w = weight.detach().double()  # (out, in)
    u, sigma, vh = thin_svd(w @ s_factor)  # (out, r), (r,), (r, in)
    v = torch.linalg.solve_triangular(s_factor.T, vh.T, upper=True)  # (in, r) = S^{-T} V'
    return u.float().contiguous(), sigma.float(), v.float().contiguous()


def whitened_bases_by(covariance: Mapping[str, torch.Tensor], damping: float = 1e-3
                      ) -> Callable[[str, nn.Linear], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """``(name, linear) -> whitened_bases(linear.weight, covariance[name], damping)``, each input's factor made once.

    Layers that read the same input (a block's query, key and value
    projections; its gate and up projections) get the same covariance tensor
    from :meth:`InputStatistics.covariance`, and so the same Cholesky factor:
    it is computed for the first of them and handed to the next ones while
    they follow each other, as they do when a model is converted in its
    modules' order. Only the last factor is held (a 7B model's ``down_proj``
    factor alone is 11008 x 11008 in float64, 0.97 GB), so layers asked for
    in another order get their factors made again, with the same bases.
    The sharing saves little on the embedded model: its 120 factors take
    4.50 s against 4.54 s for all 210 (one thread), since the 30 unshared
    ``down_proj`` factors (1536 x 1536) are most of the work; the formula of
    :func:`whitening_factor` took them from 5.9 s to 4.5 s, and the whole
    conversion's bases, SVDs included, went from 37.2 s to 35.4 s, inside
    the repeats' spread (``python bench/speed.py --sections whitening``,
    ``data/speed/whitening-2026-12-06-amd-epyc-1t.json``, medians of 3).

    Args:
        covariance: layer name -> (in, in) second moment of its inputs.
        damping: see :func:`whitening_factor`.
    """
    last: list[tuple[torch.Tensor, torch.Tensor]] = []  # [(covariance, its factor)], the latest only

    def bases(name: str, linear: nn.Linear) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        moment = covariance[name]  # (in, in)
        if not last or last[0][0] is not moment:
            last[:] = [(moment, whitening_factor(moment.to(linear.weight.device), damping))]
        return whitened_bases(linear.weight, moment, damping, factor=last[0][1])

    return bases


def weighted_svd(
    weight: torch.Tensor, row_weights: torch.Tensor | None = None, col_scales: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SVD of ``diag(d) W diag(s)``, with ``d`` and ``s`` folded back out of the factors.

    Truncating the result to its first k triplets gives the rank-k matrix that
    minimises ``||diag(d) (W - W_k) diag(s)||_F`` (Eckart-Young on the weighted
    matrix). With no weights it is the plain SVD.

    Args:
        weight: (out, in) dense weight.
        row_weights: (out,) positive weights ``d`` or None.
        col_scales: (in,) positive scales ``s`` or None.

    Returns:
        ``U`` (out, r), ``sigma`` (r,) descending, ``V`` (in, r), float32, with
        ``U diag(sigma) V^T == W`` up to rounding and ``r = min(out, in)``.
    """
    w = weight.detach().float()  # (out, in)
    d = row_weights.float().to(w.device) if row_weights is not None else None
    s = col_scales.float().to(w.device) if col_scales is not None else None
    if d is not None:
        w = d[:, None] * w
    if s is not None:
        w = w * s[None, :]
    u, sigma, vh = thin_svd(w)  # (out, r), (r,), (r, in)
    v = vh.T  # (in, r)
    if d is not None:
        u = u / d[:, None]
    if s is not None:
        v = v / s[:, None]
    return u.contiguous(), sigma, v.contiguous()


class InputStatistics:
    """Statistics of the inputs of some linear layers, gathered from forward passes.

    Use as a context manager around forward passes; positions where
    :attr:`mask` is 0 (padding) are left out. Two statistics per layer:

    * ``covariance()``: the second moment ``X^T X / N`` (in, in), for
      :func:`whitened_bases`;
    * ``abs_mean()``: the mean absolute value of each input channel (in,), for
      ASVD's scales.

    Sibling layers (same parent module) that receive the *same* input tensor
    (the query, key and value projections; the gate and up projections) share
    one accumulator, so a transformer block costs four covariances, not seven.

    Args:
        modules: name -> linear module.
        covariance: gather the (in, in) second moments (memory: in^2 per distinct input).
    """

    def __init__(self, modules: Mapping[str, nn.Module], covariance: bool = True) -> None:
        self.modules = dict(modules)
        self.with_covariance = covariance
        self.mask: torch.Tensor | None = None  # (B, T) of the batch being run
        self._owner: dict[str, str] = {}  # layer -> layer whose accumulator it shares
        # (data_ptr, shape, strides) -> (input, first layer), one parent at a time
        self._seen: dict[tuple[int, tuple[int, ...], tuple[int, ...]], tuple[torch.Tensor, str]] = {}
        self._parent: str | None = None
        self._sq: dict[str, torch.Tensor] = {}
        self._abs: dict[str, torch.Tensor] = {}
        self._count: dict[str, int] = {}
        self._handles: list[RemovableHandle] = []

    def _hook(self, name: str) -> Callable[[nn.Module, tuple[Any, ...]], None]:
        parent = name.rpartition(".")[0]

        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            x: torch.Tensor = args[0].detach()
            owner = self._owner.get(name)
            if owner is None:  # first time this layer runs: does a sibling already see this very tensor?
                if parent != self._parent:  # the references held below are for one parent module at a time
                    self._seen, self._parent = {}, parent
                key = (x.data_ptr(), tuple(x.shape), tuple(x.stride()))
                seen = self._seen.get(key)  # holding the tensor keeps its memory from being reused meanwhile
                owner = seen[1] if seen is not None else name
                self._seen[key] = (x, owner)
                self._owner[name] = owner
            if owner != name:
                return
            if self.mask is not None and x.dim() == 3 and x.shape[:2] == self.mask.shape:
                x = x[self.mask.to(x.device).bool()]  # (N, in)
            x = x.reshape(-1, x.shape[-1]).float()  # (N, in)
            if name not in self._count:
                self._abs[name] = torch.zeros(x.shape[-1], device=x.device)
                self._count[name] = 0
                if self.with_covariance:
                    self._sq[name] = torch.zeros(x.shape[-1], x.shape[-1], device=x.device)
            self._abs[name] += x.abs().sum(dim=0)
            self._count[name] += x.shape[0]
            if self.with_covariance:
                self._sq[name].addmm_(x.T, x)  # (in, in) += X^T X

        return hook

    def start_batch(self, attention_mask: torch.Tensor | None) -> None:
        """Call before each forward pass: the padding mask of its batch."""
        self.mask = attention_mask
        self._seen, self._parent = {}, None

    def __enter__(self) -> InputStatistics:
        self._handles = [m.register_forward_pre_hook(self._hook(n)) for n, m in self.modules.items()]
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def reduce(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Apply ``fn`` (e.g. a sum over processes) to the raw sums and counts, before they are normalised."""
        for store in (self._sq, self._abs):
            for key in list(store):
                store[key] = fn(store[key])
        for key in list(self._count):
            device = self._abs[key].device
            self._count[key] = int(fn(torch.tensor(float(self._count[key]), device=device)).item())

    def _per_layer(self, values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        normalised: dict[str, torch.Tensor] = {}  # one tensor per distinct input, shared by its layers
        out = {}
        for name in self.modules:
            owner = self._owner.get(name, name)
            if owner not in values:
                raise BSIError(f"layer '{name}' saw no input in the calibration batches: it is not on the model's "
                               "forward path, or no batch ran (give a task with training examples and "
                               "--calibration-batches >= 1), or use plain SVD bases (--bases svd)")
            if owner not in normalised:
                normalised[owner] = values[owner] / max(self._count[owner], 1)
            out[name] = normalised[owner]
        return out

    def covariance(self) -> dict[str, torch.Tensor]:
        """``{name: X^T X / N}``, (in, in) float32; layers with a shared input share the tensor."""
        return self._per_layer(self._sq)

    def abs_mean(self) -> dict[str, torch.Tensor]:
        """``{name: mean |x_j|}``, (in,) float32."""
        return self._per_layer(self._abs)
