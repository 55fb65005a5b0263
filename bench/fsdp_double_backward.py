"""Why ``hessian_method hvp`` is refused with ``--fsdp``: a double backward through FSDP2-sharded bases.

    torchrun --standalone --nproc_per_node 2 bench/fsdp_double_backward.py

One Basel-form product ``tanh(U diag(s) V^T x)`` with ``U``, ``V`` frozen and
sharded (``fully_shard(..., reshard_after_forward=True)``, as
:mod:`bsi.pipeline.fsdp` does) and ``s`` replicated; a Hessian-vector product
in ``s`` (``autograd.grad`` with ``create_graph=True``, then again). With torch
2.13 (gloo, CPU) the second backward fails on every rank with::

    RuntimeError: setStorage: sizes [8, 8], strides [1, 8], storage offset 0, and itemsize 4
    requiring a storage size of 256 are out of bounds for storage of size 0

The gradient's graph holds ``g_y @ U``; FSDP frees the gathered ``U``
(storage resized to 0) when the first backward ends, so the second one reads
freed memory. Without sharding the same product runs; keeping the bases
gathered through backward would hold the whole Basel form, which is what FSDP
is for avoiding. Prints, per rank, whether it ran and matched the unsharded result.
"""

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

dist.init_process_group("gloo")
torch.manual_seed(0)

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.V = nn.Parameter(torch.randn(8, 8), requires_grad=False)  # (in, r), sharded
        self.U = nn.Parameter(torch.randn(8, 8), requires_grad=False)  # (out, r), sharded
        self.s = nn.Parameter(torch.ones(8))                           # (r,), replicated
    def forward(self, x):  # the Basel form's product: U diag(s) V^T x
        return torch.tanh(((x @ self.V) * self.s) @ self.U.T)

def hvp(model):
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    loss = (model(x) ** 2).sum()
    (g,) = torch.autograd.grad(loss, model.s, create_graph=True)
    (hv,) = torch.autograd.grad(g @ torch.ones(8), model.s)
    return hv

ref = hvp(Block())
torch.manual_seed(0)
model = Block()
fully_shard(model, ignored_params={model.s}, reshard_after_forward=True)
try:
    out = hvp(model)
    print("rank", dist.get_rank(), "hvp ran; equal to unsharded:", torch.allclose(out, ref), flush=True)
except Exception as err:
    print("rank", dist.get_rank(), "hvp failed:", type(err).__name__, str(err).splitlines()[0][:300], flush=True)
dist.destroy_process_group()
