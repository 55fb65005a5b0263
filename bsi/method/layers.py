"""`BasisLinear`: a linear layer written as a sum of SVD bases (the Basel form).

A dense layer computes ``y = x W^T + b`` with ``W`` of shape (out, in). Its SVD
``W = sum_i sigma_i u_i v_i^T`` splits it into rank-one *bases* ``u_i v_i^T``,
each scaled by a coefficient ``sigma_i``. `BasisLinear` keeps the bases fixed
and makes the coefficients learnable::

    W~ = U diag(sigma) V^T  +  U_aux V_aux^T
         (out, r)(r)(r, in)    (out, a)(a, in)

* ``U`` (out, r) and ``V`` (in, r) are frozen buffers: the singular vectors.
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

Sigma always lives in fp32, even when ``U`` and ``V`` are bf16 or fp16, so that
the small updates and perturbations of the importance estimator are not lost to
rounding in storage; the forward casts it to the compute dtype.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


def svd_bases(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Thin SVD of a weight matrix, computed in fp32 (float64 for tiny matrices is not needed).

    Args:
        weight: (out, in) dense weight.

    Returns:
        ``U`` (out, r), ``sigma`` (r,), ``V`` (in, r) with ``r = min(out, in)``,
        sigma sorted descending, such that ``weight ~= U @ diag(sigma) @ V.T``.
    """
    w = weight.detach().to(torch.float32)
    u, s, vh = torch.linalg.svd(w, full_matrices=False)  # (out, r), (r,), (r, in)
    return u, s, vh.T.contiguous()


class BasisLinear(nn.Module):
    """A linear layer re-parameterised as learnable coefficients over fixed SVD bases.

    Build one from an existing ``nn.Linear`` with :meth:`from_linear`. Only
    ``sigma``, ``aux_u`` and ``aux_v`` are trainable (see
    ``TRAINABLE_PARAMETERS``); the bases and the bias are frozen buffers.
    """

    TRAINABLE_PARAMETERS = ("sigma", "aux_u", "aux_v")

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
        self.register_buffer("U", torch.zeros(out_features, rank, dtype=dtype, device=device))
        self.register_buffer("V", torch.zeros(in_features, rank, dtype=dtype, device=device))
        self.sigma = nn.Parameter(torch.zeros(rank, dtype=torch.float32, device=device))
        # basis_ids[i] = index of active basis i in the original SVD (0 = largest).
        self.register_buffer("basis_ids", torch.arange(rank, device=device))
        self.aux_u = nn.Parameter(torch.zeros(out_features, aux_rank, dtype=dtype, device=device))
        self.aux_v = nn.Parameter(torch.zeros(in_features, aux_rank, dtype=dtype, device=device))
        if bias:
            self.register_buffer("bias", torch.zeros(out_features, dtype=dtype, device=device))
        else:
            self.bias = None

    # ------------------------------------------------------------------ build
    @classmethod
    def from_linear(
        cls, linear: nn.Linear, aux_rank: int = 8, generator: torch.Generator | None = None
    ) -> "BasisLinear":
        """Re-parameterise ``linear`` exactly: same outputs, now as bases and coefficients.

        ``aux_v`` gets small random values and ``aux_u`` zeros, so the auxiliary
        term ``x V_aux U_aux^T`` is zero at start but receives gradients.
        """
        weight = linear.weight
        out_features, in_features = weight.shape
        u, s, v = svd_bases(weight)  # (out, r), (r,), (in, r)
        layer = cls(
            in_features,
            out_features,
            rank=s.numel(),
            aux_rank=aux_rank,
            bias=linear.bias is not None,
            dtype=weight.dtype,
            device=weight.device,
        )
        with torch.no_grad():
            layer.U.copy_(u)
            layer.V.copy_(v)
            layer.sigma.copy_(s)
            if aux_rank:
                noise = torch.randn(in_features, aux_rank, generator=generator)
                layer.aux_v.copy_(noise / in_features**0.5)
            if linear.bias is not None:
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
        h = x @ self.V  # (..., r)
        h = h * self.sigma.to(h.dtype)  # (..., r)
        y = h @ self.U.T  # (..., out)
        if self.aux_rank:
            y = y + (x @ self.aux_v) @ self.aux_u.T  # (..., a) -> (..., out)
        if self.bias is not None:
            y = y + self.bias
        return y

    def dense_weight(self) -> torch.Tensor:
        """The effective dense weight ``U diag(sigma) V^T + U_aux V_aux^T``, (out, in), fp32."""
        u, v = self.U.float(), self.V.float()
        w = (u * self.sigma.detach()) @ v.T  # (out, in)
        if self.aux_rank:
            w = w + self.aux_u.detach().float() @ self.aux_v.detach().float().T
        return w

    def to_linear(self) -> nn.Linear:
        """Merge back into a plain dense ``nn.Linear`` (same outputs)."""
        linear = nn.Linear(
            self.in_features, self.out_features, bias=self.bias is not None,
            dtype=self.U.dtype, device=self.U.device,
        )
        with torch.no_grad():
            linear.weight.copy_(self.dense_weight())
            if self.bias is not None:
                linear.bias.copy_(self.bias)
        return linear

    # ---------------------------------------------------------------- pruning
    @torch.no_grad()
    def keep(self, positions: torch.Tensor) -> None:
        """Keep only the active bases at ``positions`` (int64, any order); drop the rest.

        The columns of ``U``/``V`` and entries of ``sigma`` are physically
        removed, so later forwards are cheaper. ``sigma`` stays the same
        ``nn.Parameter`` object (its ``.data`` is replaced), so an optimizer that
        holds it keeps working once its state is sliced the same way (see
        :func:`bsi.method.engine.slice_optimizer_state`).
        """
        positions = torch.as_tensor(positions, dtype=torch.long, device=self.sigma.device).sort().values
        self.U = self.U[:, positions].contiguous()
        self.V = self.V[:, positions].contiguous()
        self.basis_ids = self.basis_ids[positions]
        self.sigma.data = self.sigma.data[positions].contiguous()
        if self.sigma.grad is not None:
            self.sigma.grad = self.sigma.grad[positions].contiguous()

    # ------------------------------------------------------------------- size
    def factor_parameters(self) -> int:
        """Parameters when stored as factors: ``(r + a) * (in + out)`` plus the bias.

        The coefficients fold into ``U`` on export, so ``sigma`` costs nothing extra.
        """
        bias = self.out_features if self.bias is not None else 0
        return (self.rank + self.aux_rank) * (self.in_features + self.out_features) + bias

    def dense_parameters(self) -> int:
        """Parameters of the same layer stored as a dense matrix (plus bias)."""
        bias = self.out_features if self.bias is not None else 0
        return self.in_features * self.out_features + bias

    def stored_parameters(self) -> int:
        """Parameters this layer costs once exported: factors, or dense if that is smaller."""
        return min(self.factor_parameters(), self.dense_parameters())

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"rank={self.rank}, aux_rank={self.aux_rank}, bias={self.bias is not None}"
        )


class LowRankLinear(nn.Module):
    """The exported form of a compressed layer: ``y = (x B^T) A^T + b``.

    ``A`` is (out, k) and ``B`` is (k, in); it is what a `BasisLinear` becomes
    on export (``A = [U diag(sigma), U_aux]``, ``B = [V, V_aux]^T``), a plain
    two-matmul layer with no coefficients left to learn.
    """

    def __init__(self, in_features: int, out_features: int, rank: int, bias: bool,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.A = nn.Parameter(torch.zeros(out_features, rank, dtype=dtype, device=device))
        self.B = nn.Parameter(torch.zeros(rank, in_features, dtype=dtype, device=device))
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device)) if bias else None

    @classmethod
    def from_basis(cls, layer: BasisLinear) -> "LowRankLinear":
        """Fold ``sigma`` into the left factor and append the auxiliary vectors."""
        a = torch.cat([layer.U.float() * layer.sigma.detach(), layer.aux_u.detach().float()], dim=1)
        b = torch.cat([layer.V.float(), layer.aux_v.detach().float()], dim=1).T
        out = cls(layer.in_features, layer.out_features, a.shape[1], layer.bias is not None,
                  dtype=layer.U.dtype, device=layer.U.device)
        with torch.no_grad():
            out.A.copy_(a)
            out.B.copy_(b)
            if layer.bias is not None:
                out.bias.copy_(layer.bias)
        return out

    @property
    def rank(self) -> int:
        return self.A.shape[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (..., in) -> (..., k) -> (..., out)
        return F.linear(F.linear(x, self.B), self.A, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, rank={self.rank}"
