"""Finding a model's linear layers, swapping them for `BasisLinear`, and counting size.

Which layers are compressible: every ``nn.Linear`` inside the model, except an
output layer whose weight *is* the input embedding (tied weights: compressing
it would compress the embedding). Embeddings are ``nn.Embedding``, never
touched.

Replacement follows the usual "validate, then mutate" order: the list of
targets is computed and checked first (a model without linear layers raises
before anything changes), then each layer is swapped through its parent's
``setattr``.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from bsi.errors import BSIError
from bsi.method.layers import BasisLinear, LowRankLinear


def _parent_and_attr(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    parent_name, _, attr = name.rpartition(".")
    return (model.get_submodule(parent_name) if parent_name else model), attr


def tied_output_names(model: nn.Module) -> set[str]:
    """Names of linear layers whose weight is shared with an input embedding."""
    embedding_weights = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    return {
        name
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and id(m.weight) in embedding_weights
    }


def compressible_linear_names(model: nn.Module) -> list[str]:
    """Names of the ``nn.Linear`` layers to re-parameterise, in module order."""
    tied = tied_output_names(model)
    return [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n not in tied]


def basis_layers(model: nn.Module) -> dict[str, BasisLinear]:
    """All `BasisLinear` layers of a converted model, by qualified name, in module order."""
    return {n: m for n, m in model.named_modules() if isinstance(m, BasisLinear)}


def to_basis_form(model: nn.Module, aux_rank: int = 8, seed: int = 0) -> dict[str, BasisLinear]:
    """Replace every compressible linear layer by an exact `BasisLinear`, in place.

    Freezes every other parameter of the model (only sigma and the auxiliary
    vectors train afterwards). Returns the new layers by name.

    Raises:
        BSIError: when the model has no compressible linear layer.
    """
    existing = basis_layers(model)
    if existing:
        return existing
    names = compressible_linear_names(model)
    if not names:
        raise BSIError(
            f"{type(model).__name__} has no nn.Linear layers to compress (only embeddings or custom layers)"
        )
    generator = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.requires_grad_(False)
    layers: dict[str, BasisLinear] = {}
    for name in names:
        parent, attr = _parent_and_attr(model, name)
        layer = BasisLinear.from_linear(getattr(parent, attr), aux_rank=aux_rank, generator=generator)
        setattr(parent, attr, layer)
        layers[name] = layer
    return layers


def to_exported_form(model: nn.Module) -> dict[str, dict]:
    """Swap each `BasisLinear` for its cheapest plain form, in place; return the layer table.

    A layer becomes a two-factor `LowRankLinear` when ``(rank + aux) * (in +
    out)`` is smaller than ``in * out``, else a dense ``nn.Linear``. The returned
    table (name -> {"kind", "rank", "in", "out", "bias"}) is what the export's
    JSON records so that loading can rebuild the same modules.
    """
    table: dict[str, dict] = {}
    for name, layer in basis_layers(model).items():
        parent, attr = _parent_and_attr(model, name)
        if layer.factor_parameters() < layer.dense_parameters():
            new: nn.Module = LowRankLinear.from_basis(layer)
            kind, rank = "lowrank", new.rank
        else:
            new = layer.to_linear()
            kind, rank = "dense", min(layer.in_features, layer.out_features)
        setattr(parent, attr, new)
        table[name] = {
            "kind": kind, "rank": rank, "bases": layer.rank, "aux_rank": layer.aux_rank,
            "in": layer.in_features, "out": layer.out_features, "bias": layer.bias is not None,
        }
    return table


# ---------------------------------------------------------------------- size
def unique_parameters(tensors: Iterable[torch.Tensor]) -> int:
    """Number of elements, counting tensors that share storage once (tied weights)."""
    seen: set[int] = set()
    total = 0
    for t in tensors:
        key = t.data_ptr() if t.device.type != "meta" else id(t)
        if key in seen:
            continue
        seen.add(key)
        total += t.numel()
    return total


def model_parameters(model: nn.Module) -> int:
    """Parameters the model stores once exported, tied weights counted once.

    `BasisLinear` layers count as :meth:`BasisLinear.stored_parameters` (their
    factors, or dense if smaller); every other parameter counts as it is.
    """
    basis = basis_layers(model)
    inside = {id(t) for layer in basis.values() for t in list(layer.parameters()) + list(layer.buffers())}
    others = [p for p in model.parameters() if id(p) not in inside]
    return unique_parameters(others) + sum(layer.stored_parameters() for layer in basis.values())


def compressible_parameters(model: nn.Module) -> tuple[int, int]:
    """(now, dense) parameters of the compressible layers.

    ``now`` counts `BasisLinear` layers as stored, and `LowRankLinear` or plain
    linear layers as they are; ``dense`` is the same layers as full matrices.
    For a model that is not converted yet both are the dense count.
    """
    basis = basis_layers(model)
    if basis:
        return (
            sum(layer.stored_parameters() for layer in basis.values()),
            sum(layer.dense_parameters() for layer in basis.values()),
        )
    tied = tied_output_names(model)
    now = dense = 0
    for name, m in model.named_modules():
        if name in tied:
            continue
        bias = m.out_features if getattr(m, "bias", None) is not None else 0
        if isinstance(m, LowRankLinear):
            now += m.A.numel() + m.B.numel() + bias
            dense += m.in_features * m.out_features + bias
        elif isinstance(m, nn.Linear):
            now += m.weight.numel() + bias
            dense += m.weight.numel() + bias
    return now, dense


def layer_ranks(model: nn.Module) -> dict[str, int]:
    """Active bases per `BasisLinear` layer."""
    return {name: layer.rank for name, layer in basis_layers(model).items()}


def largest_singular_value(layers: dict[str, BasisLinear]) -> float:
    """sigma_max over all layers (the eps rule's scale)."""
    return max(float(layer.sigma.detach().abs().max()) for layer in layers.values() if layer.rank)
