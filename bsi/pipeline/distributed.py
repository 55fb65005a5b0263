"""Running one compression on several processes (data parallel, DDP-style).

Launch the ordinary command under a launcher; nothing else changes::

    accelerate launch --num_processes 2 --cpu -m bsi compress --preset smoke --out runs/ddp
    torchrun --nproc_per_node 8 -m bsi compress --preset paper --out runs/paper   # 8 GPUs

The launcher sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` (and the rendezvous
address); :func:`from_environment` reads them and joins the process group
(``nccl`` on CUDA, ``gloo`` on CPU). How the work is split:

* every rank holds the whole model and reads its *own* stream of batches
  (the stream's seed is offset by the rank);
* training steps average the gradients of all ranks before each optimizer
  step (:meth:`DistContext.sync_gradients`), so the weights stay identical;
* profiling steps draw probes from a per-rank seed and the per-round sums of
  gradients, Hessian estimates and batch counts are *summed* across ranks
  (:meth:`DistContext.reduce`) before the means are taken: each rank's
  independent probes count as extra probes;
* since every rank then holds the same statistics, every rank prunes the
  same bases, and only rank 0 writes files;
* with ``fsdp=True`` the Basel form's bases are moreover sharded across the
  ranks while pruning (:mod:`bsi.pipeline.fsdp`).

Every entry point runs a method through
:meth:`~bsi.pipeline.runner.Pipeline.compress`, whose
:class:`~bsi.pipeline.methods.MethodContext` carries this process's
:class:`DistContext` and probe seed, so ``bsi compress``, each cell of ``bsi
sweep`` and the dashboard get the same reduce, gradient sync and per-rank
probe seeds; the truncation baselines sum their calibration statistics the
same way.

One process (no launcher) gives a context whose ``reduce`` is the identity
and whose gradient sync does nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class DistContext:
    """Where this process stands among its peers."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        """True when more than one process takes part."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that writes files."""
        return self.rank == 0

    def reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over all processes (a new tensor; identity on one process)."""
        if not self.enabled:
            return tensor
        out = tensor.detach().clone()
        torch.distributed.all_reduce(out, op=torch.distributed.ReduceOp.SUM)
        return out

    @contextmanager
    def sync_gradients(self, parameters: Iterable[nn.Parameter]) -> Iterator[None]:
        """While open, average each parameter's ``.grad`` over the processes as soon as backward has filled it.

        ``with dist.sync_gradients(params): train()``. Registers a
        post-accumulate-grad hook per parameter (so any training loop works
        unchanged: the engine's tuning steps, fine-tuning, recovery), removed
        on leaving. A non-finite gradient on one rank becomes non-finite on
        every rank, so all of them skip that step together. Profiling uses
        ``torch.autograd.grad``, which fills no ``.grad``, so it is not
        affected. One process: nothing to do.
        """
        world = float(self.world_size)

        def hook(param: torch.Tensor) -> None:
            if param.grad is not None:
                torch.distributed.all_reduce(param.grad, op=torch.distributed.ReduceOp.SUM)
                param.grad.div_(world)

        hooks = [p.register_post_accumulate_grad_hook(hook) for p in parameters if p.requires_grad] \
            if self.enabled else []
        try:
            yield
        finally:
            for handle in hooks:
                handle.remove()

    def device(self, requested: torch.device) -> torch.device:
        """On CUDA, each local rank gets its own GPU (``cuda:LOCAL_RANK``)."""
        if self.enabled and requested.type == "cuda" and requested.index is None:
            return torch.device("cuda", self.local_rank)
        return requested

    def mean(self, value: float) -> float:
        """The mean of ``value`` over the processes (each passes its own; ``value`` itself on one process)."""
        if not self.enabled:
            return value
        device = torch.device("cuda", self.local_rank) if torch.distributed.get_backend() == "nccl" else torch.device("cpu")
        return float(self.reduce(torch.tensor([value], dtype=torch.float64, device=device))) / self.world_size

    def all_true(self, flag: bool) -> bool:
        """True when ``flag`` is true on every process (each passes its own); e.g. "every process sees the cache"."""
        return self.mean(float(flag)) == 1.0

    def from_main(self, value: object) -> object:
        """Rank 0's ``value`` on every process (any picklable object; e.g. a result row rank 0 measured)."""
        if not self.enabled:
            return value
        box = [value]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, value: object) -> list | None:
        """Every process's ``value`` (any picklable object), as a list by rank on rank 0; None on the others."""
        if not self.enabled:
            return [value]
        values = [None] * self.world_size if self.is_main else None
        torch.distributed.gather_object(value, values, dst=0)
        return values

    def barrier(self) -> None:
        if self.enabled:
            torch.distributed.barrier()


def from_environment(backend: str | None = None) -> DistContext:
    """The context a launcher set up through ``WORLD_SIZE``/``RANK``/``LOCAL_RANK``.

    Joins the default process group when ``WORLD_SIZE > 1`` and it is not
    joined yet (``backend``: ``nccl`` when CUDA is available, else ``gloo``).
    Without those variables: a single-process context.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistContext()
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", str(rank)))
    if not torch.distributed.is_initialized():
        if backend is None:
            use_cuda = torch.cuda.is_available() and os.environ.get("ACCELERATE_USE_CPU", "").lower() not in ("1", "true")
            backend = "nccl" if use_cuda else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(local)
        torch.distributed.init_process_group(backend=backend, rank=rank, world_size=world)
    return DistContext(rank=rank, world_size=world, local_rank=local)
