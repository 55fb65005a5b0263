"""Saving the pruning engine between rounds and continuing from there: :class:`RoundCheckpoint`.

Kept apart from :class:`bsi.method.engine.Compressor` (which inherits it) so
that the algorithm class reads as the algorithm. A checkpoint is taken only
between rounds, where no statistics are half-accumulated: the layers' bases,
coefficients and auxiliary vectors, the optimizer's moments, the probe
generator, the monitor batch and the counters.
"""

from __future__ import annotations

import torch

from bsi.method.surgery import compressible_linear_names


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``, or all of it when it is sharded across processes (a DTensor under FSDP; every process must call)."""
    gather = getattr(tensor, "full_tensor", None)
    return gather() if gather is not None else tensor


class RoundCheckpoint:
    """State saving for :class:`~bsi.method.engine.Compressor` (a mix-in: it reads the compressor's fields)."""

    @property
    def at_round_boundary(self) -> bool:
        """True between rounds: no profiling statistics are half-accumulated."""
        return self.converted and self._round is None and self.steps_into_round == 0

    def state_dict(self) -> tuple[dict[str, torch.Tensor], dict]:
        """Everything needed to continue this run: ``(tensors, plain JSON values)``.

        Only valid between rounds (see :attr:`at_round_boundary`): the layers'
        current bases, coefficients and auxiliary vectors, the optimizer's
        moments, the probe generator, the monitor batch and the counters.
        """
        if not self.at_round_boundary:
            raise RuntimeError("Compressor state can only be saved between rounds")
        tensors = self.process_state()
        for n, layer in self.layers.items():
            for key in ("U", "V", "sigma", "aux_u", "aux_v", "basis_ids"):
                tensors[f"layer.{n}.{key}"] = whole(getattr(layer, key).detach()).cpu()
        optimizer = self.optimizer.state_dict()
        for index, state in optimizer["state"].items():
            for key, value in state.items():
                tensors[f"optimizer.{index}.{key}"] = value.detach() if isinstance(value, torch.Tensor) else torch.tensor(value)
        plain = {
            "iteration": self.iteration, "skipped": self.skipped, "eps": self.eps, "notes": self.notes,
            "dense_before": self.dense_before, "factor_start": self.factor_start,
            "param_groups": optimizer["param_groups"], "config": self.config.to_dict(),
        }
        return {k: v.contiguous().cpu() for k, v in tensors.items()}, plain

    def process_state(self) -> dict[str, torch.Tensor]:
        """The part of :meth:`state_dict` that is this process's own: the probe generator and the monitor batch.

        Under several processes each has its own (its probe seed, its
        batches); everything else is identical on all of them.
        """
        tensors = {"generator": self.generator.get_state()}
        return tensors | {f"monitor.{key}": value for key, value in (self._monitor or {}).items()}

    def load_state_dict(self, tensors: dict[str, torch.Tensor], plain: dict) -> None:
        """Continue from :meth:`state_dict`: the layers are rebuilt at the saved ranks (no SVD, no calibration)."""
        def saved(name: str, key: str) -> torch.Tensor:
            return tensors[f"layer.{name}.{key}"]

        if not self.converted:  # written in the saved bases (and sharded as it goes, under FSDP)
            def bases(name, linear):
                return saved(name, "U").to(linear.weight), saved(name, "sigma"), saved(name, "V").to(linear.weight)

            names = sorted({k.split(".", 1)[1].rsplit(".", 1)[0] for k in tensors if k.startswith("layer.")},
                           key=compressible_linear_names(self.model).index)
            self._adopt(self.convert_layers(self.model, aux_rank=self.config.aux_rank, seed=self.seed,
                                            names=names, bases=bases))
        else:
            for n, layer in self.layers.items():
                layer.U.data, layer.V.data = saved(n, "U").to(layer.U), saved(n, "V").to(layer.V)
        for n, layer in self.layers.items():
            layer.basis_ids = saved(n, "basis_ids").to(self.device)
            for key in ("sigma", "aux_u", "aux_v"):
                getattr(layer, key).data = saved(n, key).to(device=self.device, dtype=getattr(layer, key).dtype)
        monitor = {k.split(".", 1)[1]: v for k, v in tensors.items() if k.startswith("monitor.")}
        self._monitor = monitor or None
        state: dict[int, dict] = {}
        for key, value in tensors.items():
            if key.startswith("optimizer."):
                _, index, name = key.split(".", 2)
                state.setdefault(int(index), {})[name] = value
        self.optimizer.load_state_dict({"state": state, "param_groups": plain["param_groups"]})
        self.generator.set_state(tensors["generator"])
        self.iteration, self.skipped = int(plain["iteration"]), int(plain["skipped"])
        self.rounds_done = self.iteration // self.config.round_length  # saved between rounds only
        self.eps, self.dense_before = float(plain["eps"]), int(plain["dense_before"])
        self.factor_start = int(plain.get("factor_start", self.factor_start))
        self.notes = list(plain.get("notes", self.notes))
        self._round = None
