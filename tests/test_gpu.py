"""CUDA paths: bf16 weights with fp32 sigma and statistics. Skipped cleanly without a GPU."""

import pytest
import torch
from conftest import lm_loss, make_tiny_llama, token_batches

from bsi.config import CompressConfig, HutchinsonConfig, SizeRule
from bsi.method.engine import Compressor
from bsi.pipeline.export import load_compressed, save_compressed

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def cuda_batches():
    for batch in token_batches():
        yield {k: v.cuda() for k, v in batch.items()}


@pytest.mark.parametrize("scope", ["model", "layer"])
def test_bf16_compression_on_cuda_keeps_sigma_fp32(tmp_path, scope):
    """The hutchinson source, the only one that reads probe_scope, in bf16 on the GPU."""
    model = make_tiny_llama().to("cuda", torch.bfloat16)
    config = CompressConfig(size=SizeRule.keep(0.5), rounds=2, iters_per_epoch=8, sampling_ratio=0.5, aux_rank=2,
                            curvature="hutchinson", hutchinson=HutchinsonConfig(probe_scope=scope))
    compressor = Compressor(model, cuda_batches(), config, lm_loss, compute_dtype=torch.bfloat16)
    assert compressor.eps == 0.1  # bf16 has 7 fraction bits: the rule caps eps at eps_max
    rounds = [r for r in compressor.run() if type(r).__name__ == "RoundReport"]
    assert all(r.curvature == "hutchinson" for r in rounds)
    assert any(float(layer.hessian.abs().sum()) > 0 for layer in rounds[0].layers)  # the probes measured something
    layer = compressor.layers["model.layers.0.mlp.up_proj"]
    assert layer.sigma.dtype == torch.float32 and layer.sigma.is_cuda and layer.U.dtype == torch.bfloat16
    assert rounds[-1].params_compressible < rounds[-1].compressible_before
    assert all(torch.isfinite(lr.importance).all() for lr in rounds[-1].layers)
    ids = torch.randint(0, 97, (2, 8), device="cuda")
    with torch.no_grad():
        before = model(input_ids=ids).logits.float()
    save_compressed(model, None, tmp_path / "m")
    loaded, _ = load_compressed(tmp_path / "m", device="cuda")
    loaded.set_attn_implementation("eager")
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits.float(), before, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("shape", [(96, 96), (64, 160), (160, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_thin_svd_on_cuda_reconstructs_the_matrix_and_matches_the_cpu_singular_values(shape, dtype):
    from bsi.method.bases import SVD_TOLERANCE, thin_svd
    w = torch.randn(*shape, generator=torch.Generator().manual_seed(0), dtype=dtype)  # (out, in)
    u, s, vh = thin_svd(w.cuda())  # (out, r), (r,), (r, in)
    error = torch.linalg.matrix_norm((u * s) @ vh - w.cuda()) / torch.linalg.matrix_norm(w.cuda())
    assert float(error) <= SVD_TOLERANCE[dtype]
    assert torch.allclose(s.cpu(), torch.linalg.svdvals(w), rtol=1e-4)
    assert torch.all(s[:-1] >= s[1:])
