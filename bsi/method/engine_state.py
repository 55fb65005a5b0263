"""Saving the pruning engine between rounds and continuing from there: a :class:`RoundCheckpoint` of named parts.

A checkpoint is taken only between rounds, where no statistics are
half-accumulated. It holds the layers' bases, coefficients and auxiliary
vectors, the optimizer's moments, the probe generator, the monitor batch and
where the run stands (:class:`RoundCounters`). The engine
(:class:`bsi.method.engine.Compressor`) hands these parts over by name and
takes them back; this module reads nothing else of it, so the algorithm class
reads as the algorithm and the file format lives here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from bsi.method.layers import BasisLinear

#: The tensors of a layer a checkpoint stores, under ``layer.<name>.<key>``.
LAYER_TENSORS = ("U", "V", "sigma", "aux_u", "aux_v", "basis_ids")


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``, or all of it when it is sharded across processes (a DTensor under FSDP; every process must call)."""
    gather = getattr(tensor, "full_tensor", None)
    full: torch.Tensor = gather() if gather is not None else tensor
    return full


@dataclass
class RoundCounters:
    """Where an engine run stands between rounds: the plain values a checkpoint stores beside its tensors.

    ``iteration``: pruning iterations done; ``skipped``: steps skipped for a
    non-finite loss; ``eps``: the perturbation intensity in use;
    ``dense_before`` and ``factor_start``: the sizes the budgets are measured
    from; ``notes``: what the run's report should state.
    """

    iteration: int = 0
    skipped: int = 0
    eps: float = math.nan
    dense_before: int = 0
    factor_start: int = 0
    notes: list[str] = field(default_factory=list)


def process_tensors(generator: torch.Generator, monitor: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
    """The part of a checkpoint that is one process's own: its probe generator and its monitor batch.

    Under several processes each has its own (its probe seed, its batches);
    everything else is identical on all of them.
    """
    tensors = {"generator": generator.get_state()}
    return tensors | {f"monitor.{key}": value for key, value in (monitor or {}).items()}


@dataclass
class RoundCheckpoint:
    """An engine's state between two rounds: ``tensors`` (layers, optimizer, generator, monitor) and ``plain`` values.

    :meth:`take` reads the parts it is given; :meth:`restore` writes them
    back into parts of the same shapes (the layers rebuilt at the saved
    ranks by the engine first: :meth:`layer_names`, :meth:`saved_bases`).
    ``plain`` also records the compress settings the state was made with.
    """

    tensors: dict[str, torch.Tensor]
    plain: dict[str, Any]

    @classmethod
    def take(cls, *, layers: dict[str, BasisLinear], optimizer: torch.optim.Optimizer, generator: torch.Generator,
             monitor: dict[str, torch.Tensor] | None, counters: RoundCounters,
             settings: dict[str, Any]) -> RoundCheckpoint:
        """A checkpoint of these parts (``settings``: the compress settings, as their JSON)."""
        tensors = process_tensors(generator, monitor)
        for n, layer in layers.items():
            for key in LAYER_TENSORS:
                tensors[f"layer.{n}.{key}"] = whole(getattr(layer, key).detach()).cpu()
        state = optimizer.state_dict()
        for index, moments in state["state"].items():
            for key, value in moments.items():
                tensors[f"optimizer.{index}.{key}"] = value.detach() if isinstance(value, torch.Tensor) \
                    else torch.tensor(value)
        plain = {
            "iteration": counters.iteration, "skipped": counters.skipped, "eps": counters.eps,
            "notes": counters.notes, "dense_before": counters.dense_before, "factor_start": counters.factor_start,
            "param_groups": state["param_groups"], "config": settings,
        }
        return cls({k: v.contiguous().cpu() for k, v in tensors.items()}, plain)

    def saved(self, name: str, key: str) -> torch.Tensor:
        """Layer ``name``'s saved tensor ``key`` (one of :data:`LAYER_TENSORS`)."""
        return self.tensors[f"layer.{name}.{key}"]

    def layer_names(self) -> set[str]:
        """The names of the layers the checkpoint holds."""
        return {k.split(".", 1)[1].rsplit(".", 1)[0] for k in self.tensors if k.startswith("layer.")}

    def saved_bases(self, name: str, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(U, sigma, V)`` of layer ``name`` as saved, U and V on ``like``'s device and dtype: to rebuild it."""
        return self.saved(name, "U").to(like), self.saved(name, "sigma"), self.saved(name, "V").to(like)

    def restore(self, *, layers: dict[str, BasisLinear], optimizer: torch.optim.Optimizer,
                generator: torch.Generator, device: torch.device, bases_restored: bool, current: RoundCounters
                ) -> tuple[RoundCounters, dict[str, torch.Tensor] | None]:
        """Write the saved tensors into ``layers``, ``optimizer`` and ``generator``; returns the counters and monitor.

        ``bases_restored``: the layers were rebuilt from :meth:`saved_bases`
        (else their U and V are overwritten here). ``current``: the engine's
        counters, which stand for values an older checkpoint did not store.
        """
        if not bases_restored:
            for n, layer in layers.items():
                layer.U.data, layer.V.data = self.saved(n, "U").to(layer.U), self.saved(n, "V").to(layer.V)
        for n, layer in layers.items():
            layer.basis_ids = self.saved(n, "basis_ids").to(device)
            for key in ("sigma", "aux_u", "aux_v"):
                getattr(layer, key).data = self.saved(n, key).to(device=device, dtype=getattr(layer, key).dtype)
        moments: dict[int, dict[str, torch.Tensor]] = {}
        for key, value in self.tensors.items():
            if key.startswith("optimizer."):
                _, index, name = key.split(".", 2)
                moments.setdefault(int(index), {})[name] = value
        optimizer.load_state_dict({"state": moments, "param_groups": self.plain["param_groups"]})
        generator.set_state(self.tensors["generator"])
        monitor = {k.split(".", 1)[1]: v for k, v in self.tensors.items() if k.startswith("monitor.")}
        plain = self.plain
        counters = RoundCounters(iteration=int(plain["iteration"]), skipped=int(plain["skipped"]),
                                 eps=float(plain["eps"]), dense_before=int(plain["dense_before"]),
                                 factor_start=int(plain.get("factor_start", current.factor_start)),
                                 notes=list(plain.get("notes", current.notes)))
        return counters, monitor or None
