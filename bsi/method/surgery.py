"""Model surgery: finding a model's linear layers, swapping them into and out of the Basel form, counting size.

Which layers are compressible: every ``nn.Linear`` inside the model, except an
output layer whose weight *is* the input embedding (tied weights: compressing
it would compress the embedding). Embeddings are ``nn.Embedding``, never
touched.

Replacement follows the usual "validate, then mutate" order: the list of
targets is computed and checked first (a model without linear layers raises
before anything changes), then each layer is swapped through its parent's
``setattr`` (:func:`replace_module`). This module is the one place that does
it: the engine, the baselines, the export, the spectra and the notebooks all
call :func:`to_basis_form` (or its temporary form :func:`basis_form`),
:func:`to_exported_form` and :func:`replace_module`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import torch
from torch import nn

from bsi.errors import BSIError
from bsi.method.layers import BasisLinear, LowRankLinear
from bsi.reports import SizeReport

#: (U, sigma, V) of one layer, ``U diag(sigma) V^T == W``
Bases = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def parent_and_attr(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    """The module holding submodule ``name`` and the attribute it is stored under."""
    parent_name, _, attr = name.rpartition(".")
    return (model.get_submodule(parent_name) if parent_name else model), attr


def replace_module(model: nn.Module, name: str, new: nn.Module) -> nn.Module:
    """Put ``new`` where submodule ``name`` is; returns the module it replaced."""
    parent, attr = parent_and_attr(model, name)
    old: nn.Module = getattr(parent, attr)
    setattr(parent, attr, new)
    return old


def tied_output_names(model: nn.Module) -> set[str]:
    """Names of linear layers whose weight is shared with an input embedding."""
    embedding_weights = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    return {
        name
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and id(m.weight) in embedding_weights
    }


def factor_linear_names(model: nn.Module) -> set[str]:
    """Names of the ``nn.Linear`` modules that are the two factors (``down``, ``up``) of a `LowRankLinear`."""
    return {f"{name}.{part}" for name, m in model.named_modules() if isinstance(m, LowRankLinear)
            for part in ("down", "up")}


def compressible_linear_names(model: nn.Module) -> list[str]:
    """Names of the ``nn.Linear`` layers to re-parameterise, in module order (factors of a low-rank layer aside)."""
    skip = tied_output_names(model) | factor_linear_names(model)
    return [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n not in skip]


def basis_layers(model: nn.Module) -> dict[str, BasisLinear]:
    """All `BasisLinear` layers of a converted model, by qualified name, in module order."""
    return {n: m for n, m in model.named_modules() if isinstance(m, BasisLinear)}


def freeze_all_but_coefficients(model: nn.Module, layers: Iterable[BasisLinear]) -> None:
    """Only the layers' ``TRAINABLE_PARAMETERS`` (sigma, auxiliary vectors) require gradients afterwards."""
    for p in model.parameters():
        p.requires_grad_(False)
    for layer in layers:
        for name in BasisLinear.TRAINABLE_PARAMETERS:
            getattr(layer, name).requires_grad_(True)


def to_basis_form(
    model: nn.Module,
    aux_rank: int = 8,
    seed: int = 0,
    names: Sequence[str] | None = None,
    bases: Mapping[str, Bases] | Callable[[str, nn.Linear], Bases] | None = None,
    after_layer: Callable[[str], None] | None = None,
) -> dict[str, BasisLinear]:
    """Replace compressible linear layers by exact `BasisLinear` layers, in place.

    Args:
        aux_rank: auxiliary vectors per layer.
        seed: seed of the auxiliary vectors' random start.
        names: the layers to convert (default: every compressible one).
        bases: per layer, the ``(U, sigma, V)`` to write it in, as a mapping or
            a function ``(name, linear) -> bases``; default: the plain SVD.
        after_layer: called with each layer's name as soon as it is converted
            (FSDP shards a block there, :class:`bsi.pipeline.fsdp.Sharding`).

    Freezes every other parameter of the model (only sigma and the auxiliary
    vectors train afterwards). Returns the converted `BasisLinear` layers by
    name; for a model already converted (and no ``names``), all of its own.

    Raises:
        BSIError: when the model has no compressible linear layer, or a name is not one.
    """
    existing = basis_layers(model)
    if existing and names is None:
        return existing
    targets = compressible_linear_names(model) if names is None else list(names)
    modules = dict(model.named_modules())
    if not targets:
        raise BSIError(
            f"{type(model).__name__} has no nn.Linear layers to compress (only embeddings or custom layers)"
        )
    for name in targets:
        if not isinstance(modules.get(name), nn.Linear):
            raise BSIError(f"'{name}' is not a linear layer of this model")
    generator = torch.Generator().manual_seed(seed)
    layers: dict[str, BasisLinear] = {}
    for name in targets:
        linear = modules.pop(name)  # held no longer than needed: its dense weight goes once it is replaced
        given = bases(name, linear) if callable(bases) else (bases or {}).get(name)
        layers[name] = BasisLinear.from_linear(linear, aux_rank=aux_rank, generator=generator, bases=given)
        replace_module(model, name, layers[name])
        del linear, given
        if after_layer is not None:
            after_layer(name)
    freeze_all_but_coefficients(model, basis_layers(model).values())
    return layers


@contextmanager
def basis_form(model: nn.Module, names: Sequence[str], aux_rank: int = 0) -> Iterator[dict[str, BasisLinear]]:
    """Temporarily write layers ``names`` in Basel form; the original modules come back afterwards.

    For studying a few layers without converting (or paying the SVD of) the
    whole model: the Hessian spectra and the notebooks use it. Inside the
    block only the converted layers' coefficients require gradients; the
    previous ``requires_grad`` flags are restored after it::

        with basis_form(model, ["model.layers.0.mlp.down_proj"]) as layers:
            ...  # layers["model.layers.0.mlp.down_proj"].sigma
    """
    flags = {id(p): p.requires_grad for p in model.parameters()}
    originals = {name: model.get_submodule(name) for name in names}
    try:
        yield to_basis_form(model, aux_rank=aux_rank, names=names)
    finally:
        for name, module in originals.items():
            replace_module(model, name, module)
        for p in model.parameters():
            p.requires_grad_(flags.get(id(p), p.requires_grad))


def to_exported_form(model: nn.Module) -> dict[str, dict[str, str | int | bool]]:
    """Swap each `BasisLinear` for its cheapest plain form, in place; return the layer table.

    A layer becomes a two-factor `LowRankLinear` when ``(rank + aux) * (in +
    out)`` is smaller than ``in * out``, else a dense ``nn.Linear``. The returned
    table (name -> {"kind", "rank", "in", "out", "bias"}) is what the export's
    JSON records so that loading can rebuild the same modules.
    """
    table: dict[str, dict[str, str | int | bool]] = {}
    for name, layer in basis_layers(model).items():
        new: nn.Module
        if layer.factor_parameters() < layer.dense_parameters():
            low_rank = LowRankLinear.from_basis(layer)
            new, kind, rank = low_rank, "lowrank", low_rank.rank
        else:
            new = layer.to_linear()
            kind, rank = "dense", min(layer.in_features, layer.out_features)
        replace_module(model, name, new)
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
        pointer = t.data_ptr() if t.device.type != "meta" else 0
        key = pointer or id(t)  # no storage of its own (meta, or a wrapper such as an int8 weight): itself
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
    skip = tied_output_names(model) | factor_linear_names(model)
    now = dense = 0
    for name, m in model.named_modules():
        if name in skip:
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


@torch.no_grad()
def sigma_max(model: nn.Module) -> float:
    """The largest coefficient over all compressible layers (the eps rule's ``sigma_max``).

    Layers in Basel form contribute their largest ``|sigma|``; layers still
    dense their spectral norm (their largest singular value), so the value does
    not depend on how many layers have been converted (with plain SVD bases).

    Raises:
        BSIError: for a model with no linear layer.
    """
    values = [float(layer.sigma.abs().max()) for layer in basis_layers(model).values() if layer.rank]
    modules = dict(model.named_modules())
    values += [float(torch.linalg.matrix_norm(modules[n].weight.detach().float(), ord=2))
               for n in compressible_linear_names(model)]
    if not values:
        raise BSIError(f"{type(model).__name__} has no linear layer")
    return max(values)


def size_report(model: nn.Module, target: float) -> SizeReport:
    """A :class:`~bsi.reports.SizeReport`: ``model``'s size now, reached for the target ratio ``target``."""
    now, dense = compressible_parameters(model)
    return SizeReport(target, model_parameters(model), now, dense)
