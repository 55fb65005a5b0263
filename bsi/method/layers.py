"""`BasisLinear`: a linear layer written as a sum of bases (the Basel form), and its exported form.

A dense layer computes ``y = x W^T + b`` with ``W`` of shape (out, in). Any
factorisation ``W = sum_i sigma_i u_i v_i^T`` (the SVD, or the whitened one of
:mod:`bsi.method.bases`) splits it into rank-one *bases* ``u_i v_i^T``, each
scaled by a coefficient ``sigma_i``. `BasisLinear` keeps the bases fixed and
makes the coefficients learnable::

    W~ = U diag(sigma) V^T  +  U_aux V_aux^T
         (out, r)(r)(r, in)    (out, a)(a, in)

* ``U`` (out, r) and ``V`` (in, r) are the bases: parameters that do not
  train while pruning (``requires_grad=False``). Being parameters rather than
  buffers, they are sharded by FSDP like any weight.
* ``sigma`` (r,) is a learnable fp32 parameter, initialised to the singular
  values, so the layer is *exact at start*: it computes what the dense layer did.
* ``U_aux`` (out, a) and ``V_aux`` (in, a) are a few learnable auxiliary vectors
  that can pick up task features the pre-trained bases lack. ``U_aux`` starts at
  zero (as LoRA's second factor does), so they add nothing at first.

The forward pass never rebuilds ``W~``: it runs ``x -> x V -> * sigma -> U^T``,
which costs ``r * (in + out)`` multiply-adds per token instead of ``in * out``.
Pruning basis ``i`` means ``sigma_i := 0``; :meth:`BasisLinear.keep` goes further
and physically removes the pruned columns of ``U``, ``V`` and ``sigma``, so
compute and storage shrink with the rank.

Sigma always lives in fp32, even when ``U`` and ``V`` are bf16 or fp16, and the
multiplication by sigma happens in fp32 too: the small updates and the
perturbations of the curvature estimator (``sigma +- eps/2``) are therefore
never lost to bf16 rounding.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn


def factor_cost(in_features: int, out_features: int, rank: int, aux_rank: int = 0, bias: bool = False) -> int:
    """Parameters of a layer stored as two factors: ``(r + a)(in + out)``, plus the bias.

    Each basis ``sigma_i u_i v_i^T`` needs its two vectors (``out + in``
    numbers; sigma folds into ``u_i`` on export), and so does each auxiliary pair.
    """
    return (rank + aux_rank) * (in_features + out_features) + (out_features if bias else 0)


def stored_cost(in_features: int, out_features: int, rank: int, aux_rank: int = 0, bias: bool = False) -> int:
    """Parameters a layer costs once exported: its factors, or the dense matrix if that is smaller."""
    dense = in_features * out_features + (out_features if bias else 0)
    return min(factor_cost(in_features, out_features, rank, aux_rank, bias), dense)


def break_even_rank(in_features: int, out_features: int, aux_rank: int = 0) -> float:
    """The rank at which factors cost as much as the dense matrix: ``in*out/(in+out) - a``.

    Keeping fewer bases than this saves parameters; keeping more does not, so
    such a layer is exported dense.
    """
    return in_features * out_features / (in_features + out_features) - aux_rank


class FactoredLinear(nn.Module):
    """What the two factored forms share: a dense weight they stand for, and merging back into ``nn.Linear``.

    A subclass sets ``in_features``, ``out_features`` and ``bias`` (a
    parameter or None), defines :meth:`dense_weight`, and names in
    ``STORAGE`` the factor whose dtype and device the merged layer takes.
    """

    STORAGE = ""  # the parameter whose dtype and device the dense layer gets

    in_features: int
    out_features: int
    bias: nn.Parameter | None

    def dense_weight(self) -> torch.Tensor:
        """The dense weight ``W`` (out, in), fp32, that this layer computes ``x W^T + b`` with."""
        raise NotImplementedError

    def to_linear(self) -> nn.Linear:
        """Merge back into a plain dense ``nn.Linear`` (same outputs up to rounding)."""
        storage = getattr(self, self.STORAGE)
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None,
                           dtype=storage.dtype, device=storage.device)
        with torch.no_grad():
            linear.weight.copy_(self.dense_weight())
            if self.bias is not None:
                linear.bias.copy_(self.bias)
        return linear


class BasisLinear(FactoredLinear):
    """A linear layer re-parameterised as learnable coefficients over fixed bases.

    Build one from an existing ``nn.Linear`` with :meth:`from_linear`. While
    pruning only ``sigma``, ``aux_u`` and ``aux_v`` train (``TRAINABLE_PARAMETERS``);
    ``U``, ``V`` and the bias are frozen parameters.
    """

    TRAINABLE_PARAMETERS = ("sigma", "aux_u", "aux_v")
    FROZEN_PARAMETERS = ("U", "V", "bias")
    STORAGE = "U"

    basis_ids: torch.Tensor  # a buffer (registered in __init__), so that it moves and saves with the layer

    def __init__(
        self,
        in_features: int,
        out_features: int,
        rank: int,
        aux_rank: int = 0,
        bias: bool = False,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.U = nn.Parameter(torch.zeros(out_features, rank, dtype=dtype, device=device), requires_grad=False)
        self.V = nn.Parameter(torch.zeros(in_features, rank, dtype=dtype, device=device), requires_grad=False)
        self.sigma = nn.Parameter(torch.zeros(rank, dtype=torch.float32, device=device))
        # basis_ids[i] = index of active basis i in the original factorisation (0 = largest sigma).
        self.register_buffer("basis_ids", torch.arange(rank, device=device))
        self.aux_u = nn.Parameter(torch.zeros(out_features, aux_rank, dtype=dtype, device=device))
        self.aux_v = nn.Parameter(torch.zeros(in_features, aux_rank, dtype=dtype, device=device))
        if bias:
            self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device), requires_grad=False)
        else:
            self.bias = None
        self.recorder: SigmaGradientRecorder | None = None  # set by the Fisher curvature sources

    # ------------------------------------------------------------------ build
    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        aux_rank: int = 8,
        generator: torch.Generator | None = None,
        bases: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    ) -> BasisLinear:
        """Re-parameterise ``linear`` exactly: same outputs, now as bases and coefficients.

        Args:
            bases: ``(U, sigma, V)`` with ``U diag(sigma) V^T == weight``; by
                default the plain SVD (:func:`bsi.method.bases.svd_bases`).

        ``aux_v`` gets small random values and ``aux_u`` zeros, so the auxiliary
        term ``x V_aux U_aux^T`` is zero at start but receives gradients.
        """
        from bsi.method.bases import svd_bases

        weight = linear.weight
        out_features, in_features = weight.shape
        u, s, v = bases if bases is not None else svd_bases(weight)  # (out, r), (r,), (in, r)
        layer = cls(in_features, out_features, rank=s.numel(), aux_rank=aux_rank, bias=linear.bias is not None,
                    dtype=weight.dtype, device=weight.device)
        with torch.no_grad():
            layer.U.copy_(u)
            layer.V.copy_(v)
            layer.sigma.copy_(s)
            if aux_rank:
                noise = torch.randn(in_features, aux_rank, generator=generator)
                layer.aux_v.copy_(noise / in_features**0.5)
            if linear.bias is not None:
                assert layer.bias is not None, "a layer built from a linear layer with a bias has one"
                layer.bias.copy_(linear.bias.detach())
        return layer

    # ---------------------------------------------------------------- compute
    @property
    def rank(self) -> int:
        """Number of active bases r."""
        return self.sigma.numel()

    @property
    def aux_rank(self) -> int:
        return self.aux_u.shape[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (..., in)
        h = (x @ self.V).float()  # (..., r), fp32 so that sigma and its perturbations keep their precision
        scaled = h * self.sigma  # (..., r)
        if self.recorder is not None and scaled.requires_grad:
            self.recorder.watch(self, h, scaled)
        y = scaled.to(x.dtype) @ self.U.T  # (..., out)
        if self.aux_rank:
            y = y + (x @ self.aux_v) @ self.aux_u.T  # (..., a) -> (..., out)
        if self.bias is not None:
            y = y + self.bias
        return y

    def dense_weight(self) -> torch.Tensor:
        """The effective dense weight ``U diag(sigma) V^T + U_aux V_aux^T``, (out, in), fp32."""
        u, v = self.U.detach().float(), self.V.detach().float()
        w = (u * self.sigma.detach()) @ v.T  # (out, in)
        if self.aux_rank:
            w = w + self.aux_u.detach().float() @ self.aux_v.detach().float().T
        return w

    # ---------------------------------------------------------------- pruning
    @torch.no_grad()
    def keep(self, positions: torch.Tensor) -> None:
        """Keep only the active bases at ``positions`` (int64, any order); drop the rest.

        The columns of ``U``/``V`` and entries of ``sigma`` are physically
        removed, so later forwards are cheaper. Every parameter stays the same
        ``nn.Parameter`` object (its ``.data`` is replaced), so an optimizer that
        holds ``sigma`` keeps working once its state is sliced the same way (see
        :func:`bsi.method.engine.slice_optimizer_state`).
        """
        positions = torch.as_tensor(positions, dtype=torch.long, device=self.sigma.device).sort().values
        self.U.data = self.U.data[:, positions].contiguous()
        self.V.data = self.V.data[:, positions].contiguous()
        self.basis_ids = self.basis_ids[positions]
        self.sigma.data = self.sigma.data[positions].contiguous()
        if self.sigma.grad is not None:
            self.sigma.grad = self.sigma.grad[positions].contiguous()

    # ------------------------------------------------------------------- size
    def factor_parameters(self) -> int:
        """Parameters when stored as factors: ``(r + a) * (in + out)`` plus the bias (see :func:`factor_cost`)."""
        return factor_cost(self.in_features, self.out_features, self.rank, self.aux_rank, self.bias is not None)

    def dense_parameters(self) -> int:
        """Parameters of the same layer stored as a dense matrix (plus bias)."""
        return self.in_features * self.out_features + (self.out_features if self.bias is not None else 0)

    def stored_parameters(self, rank: int | None = None) -> int:
        """Parameters this layer costs once exported (with ``rank`` bases if given): factors, or dense if smaller."""
        return stored_cost(self.in_features, self.out_features, self.rank if rank is None else rank,
                           self.aux_rank, self.bias is not None)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"rank={self.rank}, aux_rank={self.aux_rank}, bias={self.bias is not None}"
        )


class SigmaGradientRecorder:
    """Per-example gradients with respect to sigma, captured during an ordinary backward pass.

    For one layer, ``scaled = h * sigma`` with ``h = x V`` (B, T, r). If ``e``
    is the gradient of the loss with respect to ``scaled`` (what backward
    computes anyway), the gradient with respect to ``sigma_i`` contributed by
    example ``b`` is::

        g_{b,i} = sum_t h_{b,t,i} * e_{b,t,i}

    two small tensors already in memory, so per-example gradients cost no extra
    backward pass. The recorder keeps ``sum_b g_b**2`` per layer (an empirical
    Fisher numerator) and ``sum_b g_b`` (the ordinary gradient).

    Attach it with ``layer.recorder = recorder`` (see :meth:`attach`); a layer
    records once per backward.
    """

    def __init__(self) -> None:
        self.square_sums: dict[int, torch.Tensor] = {}  # id(layer) -> (r,) sum over examples of g_b**2
        self.sums: dict[int, torch.Tensor] = {}  # id(layer) -> (r,) sum over examples of g_b
        self.layers: list[BasisLinear] = []

    def attach(self, layers: list[BasisLinear]) -> SigmaGradientRecorder:
        self.layers = list(layers)
        for layer in self.layers:
            layer.recorder = self
        return self

    def detach(self) -> None:
        for layer in self.layers:
            layer.recorder = None
        self.layers = []

    def __enter__(self) -> SigmaGradientRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()

    def reset(self) -> None:
        self.square_sums.clear()
        self.sums.clear()

    def watch(self, layer: BasisLinear, h: torch.Tensor, scaled: torch.Tensor) -> None:
        """Called by the layer's forward: hook the gradient of ``scaled`` (fired once, in backward)."""
        h = h.detach()
        key = id(layer)

        def hook(e: torch.Tensor) -> None:
            per_example = (h * e.float()).reshape(h.shape[0], -1, h.shape[-1]).sum(dim=1) if h.dim() > 1 \
                else (h * e.float())[None]  # (B, r)
            squares = per_example.square().sum(dim=0)  # (r,)
            total = per_example.sum(dim=0)  # (r,)
            if key in self.square_sums:
                self.square_sums[key] += squares
                self.sums[key] += total
            else:
                self.square_sums[key], self.sums[key] = squares, total

        scaled.register_hook(hook)  # type: ignore[no-untyped-call]  # torch leaves Tensor.register_hook unannotated

    def squares(self, layer: BasisLinear) -> torch.Tensor:
        """``sum_b g_b**2`` of ``layer`` since the last reset (zeros if it saw no backward), (r,)."""
        return self.square_sums.get(id(layer), torch.zeros_like(layer.sigma.detach()))

    def gradient(self, layer: BasisLinear) -> torch.Tensor:
        """``sum_b g_b`` of ``layer`` since the last reset, the batch's dl/dsigma (zeros if no backward), (r,)."""
        return self.sums.get(id(layer), torch.zeros_like(layer.sigma.detach()))


def _zero_linear(in_features: int, out_features: int, bias: bool, dtype: torch.dtype,
                 device: torch.device | str | None) -> nn.Linear:
    """An ``nn.Linear`` filled with zeros, built without drawing its random initialisation (the RNG stays as it was)."""
    linear = nn.Linear(in_features, out_features, bias=bias, dtype=dtype, device="meta")
    linear.to_empty(device=torch.get_default_device() if device is None else device)
    with torch.no_grad():
        for p in linear.parameters():
            p.zero_()
    return linear


class LowRankLinear(FactoredLinear):
    """The exported form of a compressed layer: two linear layers in a row, ``y = (x B^T) A^T + b``.

    ``A`` is (out, k) and ``B`` is (k, in); it is what a `BasisLinear` becomes
    on export (``A = [U diag(sigma), U_aux]``, ``B = [V, V_aux]^T``), a plain
    two-matmul layer whose factors can be fine-tuned directly. The factors
    live in two ordinary ``nn.Linear`` modules, ``down`` (in -> k, holding
    ``B``) and ``up`` (k -> out, holding ``A`` and the bias), so tools that act
    on linear layers (weight-only quantizers, PEFT's LoRA) see them; ``A``,
    ``B`` and ``bias`` name their tensors.
    """

    STORAGE = "A"

    def __init__(self, in_features: int, out_features: int, rank: int, bias: bool,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        # registered before `down`: the parameters keep the order A, (bias), B of format 2's one-module layer
        self.up = _zero_linear(rank, out_features, bias, dtype, device)
        self.down = _zero_linear(in_features, rank, False, dtype, device)

    @property
    def A(self) -> nn.Parameter:
        """The left factor, (out, k): ``up``'s weight."""
        return cast(nn.Parameter, self.up.weight)  # torch's stubs declare nn.Linear.weight a plain Tensor

    @property
    def B(self) -> nn.Parameter:
        """The right factor, (k, in): ``down``'s weight."""
        return cast(nn.Parameter, self.down.weight)  # as for A

    @property
    def bias(self) -> nn.Parameter | None:  # type: ignore[override]
        """The layer's bias, (out,) or None: ``up``'s bias."""
        return self.up.bias

    @classmethod
    def from_basis(cls, layer: BasisLinear) -> LowRankLinear:
        """Fold ``sigma`` into the left factor and append the auxiliary vectors."""
        a = torch.cat([layer.U.detach().float() * layer.sigma.detach(), layer.aux_u.detach().float()], dim=1)
        b = torch.cat([layer.V.detach().float(), layer.aux_v.detach().float()], dim=1).T
        out = cls(layer.in_features, layer.out_features, a.shape[1], layer.bias is not None,
                  dtype=layer.U.dtype, device=layer.U.device)
        with torch.no_grad():
            out.A.copy_(a)
            out.B.copy_(b)
            if layer.bias is not None:
                assert out.bias is not None, "built with a bias when the layer has one"
                out.bias.copy_(layer.bias)
        return out

    @property
    def rank(self) -> int:
        return self.A.shape[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (..., in) -> (..., k) -> (..., out); the same F.linear calls as a two-factor layer
        y: torch.Tensor = self.up(self.down(x))
        return y

    def dense_weight(self) -> torch.Tensor:
        """``A B``, (out, in), fp32."""
        return self.A.detach().float() @ self.B.detach().float()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, rank={self.rank}"
