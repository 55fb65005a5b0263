"""Sharding the Basel form across processes with FSDP (``fsdp=True``, ``bsi compress --fsdp``).

Under a launcher with N processes (see :mod:`bsi.pipeline.distributed`), the
pruning stage normally keeps a whole copy of the model on every process. The
Basel form is bigger than the dense model it replaces (``U`` is (out, r) and
``V`` (in, r) with ``r = min(in, out)``: twice the dense weight for a square
layer), so that copy is what stops a 13B-70B model from being compressed on
GPUs of 80 GB. With ``fsdp=True`` each process keeps only a shard of every
layer's bases, about ``1/N`` of them, through PyTorch's FSDP2
(``torch.distributed.fsdp.fully_shard``): a block's full bases exist only
while that block computes (gathered just before its forward, and again for
its backward, freed right after).

What is sharded and what is not:

* sharded, along their first dimension: the weights of linear layers, that
  is ``U``, ``V`` and the bias of each :class:`~bsi.method.layers.BasisLinear`
  (frozen while pruning), and the frozen ``nn.Linear`` weights of the
  distillation teacher;
* replicated: ``sigma``, the auxiliary vectors and ``basis_ids`` (small: what
  trains, and whose gradients :meth:`DistContext.sync_gradients` averages
  exactly as without FSDP), the embeddings and the norms.

The unit FSDP gathers at once is a *block*: an element of the model's list of
transformer blocks (any ``nn.ModuleList``), or a layer outside them (an
untied ``lm_head``). Each block is wrapped in a thin :class:`ShardedGroup`
that passes its calls through, so removing FSDP again is just unwrapping.

How the method's operations work on shards (:class:`Sharding`):

* **conversion** (:meth:`Sharding.convert`): block by block, the layers are
  written in the Basel form and the block is sharded at once, so the whole
  Basel form never exists on one process (it is
  :func:`~bsi.method.surgery.to_basis_form` itself, sharding from its
  ``after_layer`` hook: the same bases, the same random auxiliary start);
  a resumed run converts from the checkpoint's bases the same way;
* **pruning** (:meth:`Sharding.keep`): a layer's ``U`` and ``V`` are
  gathered, their pruned columns dropped (:meth:`BasisLinear.keep`), and
  sharded again, one layer at a time;
* **checkpoints**: the engine gathers each tensor on every process
  (:meth:`~bsi.method.engine.Compressor.state_dict`) and rank 0 writes;
* **the end of the Basel form** (:meth:`Sharding.gather`, before the layers
  are exported: before recovery with ``recover.train="factors"``, after it
  with ``"sigma"``): every process gets the whole, now compressed, model back
  as ordinary tensors; evaluation and export run as without FSDP.

Only the engine methods shard; the truncation baselines (``svd``,
``svd-llm``, ...) convert and truncate the whole model on every process.

On one process nothing of this happens: ``fsdp=True`` changes nothing there.

Limits: exact Hessian-vector products (``hessian_method="hvp"``) need a
double backward through bases that FSDP has freed after the first one (the
gradient's graph holds ``grad_y @ U``; torch 2.13 fails with "setStorage: ...
out of bounds for storage of size 0", see ``bench/fsdp_double_backward.py``),
so they are refused under FSDP (finite differences and the Fisher sources work).
Every process loads the whole dense model before converting it, and gets
the whole compressed model back at the end: the dense model must fit one
device (the memory plan in ``docs/cli.md``).
Re-sharding a pruned layer uses FSDP2's per-parameter initialisation
(``FSDPParam._init_sharded_param``), an internal of torch, checked against
torch 2.13.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence

import torch
from torch import nn

from bsi.errors import BSIError
from bsi.method.engine_state import whole
from bsi.method.layers import BasisLinear
from bsi.method.surgery import (
    Bases,
    basis_layers,
    compressible_linear_names,
    freeze_all_but_coefficients,
    replace_module,
    to_basis_form,
)


def _fsdp():
    """``torch.distributed.fsdp`` with FSDP2 (``fully_shard``, torch >= 2.6), or a clear error."""
    try:
        from torch.distributed import fsdp
        _ = fsdp.fully_shard, fsdp.FSDPModule  # present from torch 2.6
    except (ImportError, AttributeError):
        raise BSIError(f"fsdp needs torch >= 2.6 (torch.distributed.fsdp.fully_shard); this is torch "
                       f"{torch.__version__}: upgrade torch or run without --fsdp") from None
    return fsdp


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The part of ``tensor`` this process holds (all of it unless it is a DTensor)."""
    local = getattr(tensor, "to_local", None)
    return local() if local is not None else tensor


def sharded_parameters(module: nn.Module) -> list[nn.Parameter]:
    """The parameters FSDP shards: ``U``, ``V`` and bias of each `BasisLinear`, weight and bias of each ``nn.Linear``."""
    out: list[nn.Parameter] = []
    for m in module.modules():
        names = ("U", "V", "bias") if isinstance(m, BasisLinear) else ("weight", "bias") if isinstance(m, nn.Linear) else ()
        out += [p for p in (getattr(m, n) for n in names) if p is not None]
    return out


def shard_groups(model: nn.Module, names: list[str]) -> dict[str, list[str]]:
    """Which block each layer is sharded with, ``{block: [layers]}`` in the order of ``names``.

    A layer's block is the outermost element of an ``nn.ModuleList`` that
    holds it (``model.layers.3`` for ``model.layers.3.mlp.up_proj``); a layer
    in no list is its own block (``lm_head``).
    """
    lists = {n for n, m in model.named_modules() if isinstance(m, nn.ModuleList)}
    groups: dict[str, list[str]] = {}
    for name in names:
        parts = name.split(".")
        block = next((".".join(parts[: i + 1]) for i in range(1, len(parts) - 1)
                      if ".".join(parts[:i]) in lists and parts[i].isdigit()), name)
        groups.setdefault(block, []).append(name)
    return groups


class ShardedGroup(nn.Module):
    """A pass-through shell around one block: the unit FSDP shards, gathers and frees as one.

    Calls go to the block unchanged, and so do attribute reads the shell
    does not have itself (``layer.attention_type`` and the like).
    """

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *args, **kwargs):
        return self.inner(*args, **kwargs)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "inner":
                raise
            return getattr(self.inner, name)


def _fsdp_params(shell: nn.Module) -> Iterator:
    """The FSDP2 parameter records (``FSDPParam``) of one sharded shell."""
    for group in shell._get_fsdp_state()._fsdp_param_groups:
        yield from group.fsdp_params


def _reshard_parameter(record, full: nn.Parameter) -> None:
    """Point an FSDP2 parameter record at a new full tensor of another shape and shard that.

    FSDP2 fixes a parameter's shape when it shards it; a pruned layer's bases
    have fewer columns, so the record's sharded data and size metadata are
    built again from ``full`` (sharded along dim 0 as before), and the gather
    buffers of the old shape are dropped (the next gather makes new ones).
    """
    init = record._init_sharded_param
    if "mesh_info" in inspect.signature(init).parameters:
        init(full, record.device, None, record.mesh_info)
    else:  # torch < 2.12
        init(full, record.device, None)
    if record.post_forward_mesh_info is not None:
        record._init_sharded_post_forward_param_metadata(full)
    record.init_dtype_attrs(record.mp_policy)
    record.all_gather_outputs = []
    record.__dict__.pop("_unsharded_param", None)


def refuse_double_backward(hessian_method: str | None) -> None:
    """Exact Hessian-vector products cannot run on sharded bases: a clear error says what to change."""
    if hessian_method == "hvp":
        raise BSIError("fsdp cannot run hessian_method hvp (its double backward needs the gathered bases that FSDP "
                       "frees after the first backward): use hessian_method fd or curvature fisher; in bfloat16 or "
                       "float16 also give eps >= 0.05 so that the engine keeps finite differences")


class Sharding:
    """One model sharded block by block with FSDP2, and the operations that must know it.

    Every method that gathers is a collective: every process calls it, in
    the same order, with the same arguments (the engine's rounds do, since
    all processes prune the same bases).
    """

    def __init__(self, model: nn.Module) -> None:
        _fsdp()
        self.model = model
        self.shells: dict[str, ShardedGroup] = {}  # block name -> its shell, in the model now
        self._owner: dict[int, ShardedGroup] = {}  # id(module) -> shell holding it

    # ----------------------------------------------------------- shard
    def shard_block(self, name: str) -> None:
        """Wrap block ``name`` in a :class:`ShardedGroup` and shard its linear weights (the rest stays replicated)."""
        fsdp = _fsdp()
        block = self.model.get_submodule(name)
        sharded = {id(p) for p in sharded_parameters(block)}
        if not sharded:
            return
        shell = ShardedGroup(block)
        replace_module(self.model, name, shell)
        ignored = {p for p in shell.parameters() if id(p) not in sharded}
        fsdp.fully_shard(shell, ignored_params=ignored, reshard_after_forward=True)
        self.shells[name] = shell
        for m in block.modules():
            self._owner[id(m)] = shell

    def shard(self) -> None:
        """Shard a model as it is: converted (its `BasisLinear` layers) or dense (its compressible linear layers)."""
        names = list(basis_layers(self.model)) or compressible_linear_names(self.model)
        for block in shard_groups(self.model, names):
            self.shard_block(block)

    def convert(self, model: nn.Module, *, aux_rank: int = 8, seed: int = 0, names: Sequence[str] | None = None,
                bases: Mapping[str, Bases] | Callable[[str, nn.Linear], Bases] | None = None) -> dict[str, BasisLinear]:
        """:func:`~bsi.method.surgery.to_basis_form`, sharding each block as soon as its last layer is converted.

        A drop-in for it (the engine's ``convert_layers``): the same bases, the
        same random auxiliary start, the same frozen flags; but at most one
        block's full Basel form exists at a time. Returns the layers by their
        names in the unsharded model.
        """
        if model is not self.model:
            raise ValueError("Sharding.convert converts the model the Sharding was made for")
        targets = compressible_linear_names(model) if names is None else list(names)
        last = {layers[-1]: block for block, layers in shard_groups(model, targets).items()}
        freeze_all_but_coefficients(model, [])  # frozen before FSDP sees them; to_basis_form thaws the coefficients

        def shard_when_done(name: str) -> None:
            if name in last:
                self.shard_block(last[name])

        return to_basis_form(model, aux_rank=aux_rank, seed=seed, names=targets, bases=bases,
                             after_layer=shard_when_done)

    # ----------------------------------------------------------- prune
    @torch.no_grad()
    def keep(self, layer: BasisLinear, positions: torch.Tensor) -> None:
        """:meth:`BasisLinear.keep` on a sharded layer: gather its bases, drop columns, shard them again."""
        shell = self._owner.get(id(layer))
        if shell is None:  # not sharded
            layer.keep(positions)
            return
        shell.reshard()  # every parameter at rest in its shards
        records = {r._module_info.param_name: r for r in _fsdp_params(shell) if r._module_info.module is layer}
        for name in ("U", "V"):
            setattr(layer, name, nn.Parameter(whole(getattr(layer, name)), requires_grad=False))
        layer.keep(positions)
        for name in ("U", "V"):
            _reshard_parameter(records[name], getattr(layer, name))

    # ---------------------------------------------------------- gather
    @torch.no_grad()
    def gather(self) -> None:
        """Undo the sharding: every process gets every tensor whole, and the shells go.

        Afterwards the model is an ordinary module again (no FSDP hooks, no
        DTensors), identical on every process.
        """
        for name, shell in list(self.shells.items()):
            shell.reshard()
            for record in list(_fsdp_params(shell)):
                param = nn.Parameter(whole(record.sharded_param).clone(),
                                     requires_grad=record.sharded_param.requires_grad)
                info = record._module_info
                for module, attr in [(info.module, info.param_name), *zip(info.shared_modules, info.shared_param_names)]:
                    setattr(module, attr, param)
                record._post_load_hook_handle.remove()
            for m in shell.inner.modules():
                for flag in ("_is_fsdp_managed_module", "_fsdp_use_orig_params"):
                    m.__dict__.pop(flag, None)
            replace_module(self.model, name, shell.inner)
            del self.shells[name]
        self._owner.clear()
