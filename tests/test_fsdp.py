"""FSDP on two CPU processes (gloo): sharded bases, the same pruning and export, resume; a sweep across processes.

Each rank reads its own batches, so "the same seed and batches" means the same
number of processes: the sharded run is compared with the unsharded
(DDP-style) run on two processes, which :mod:`test_distributed` checks is
identical on both ranks. The sweep's engine cells run the default recovery
(factors, after the bases are gathered) under FSDP.
"""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
from conftest import run_two_processes

from bsi.pipeline.export import load_compressed

COMPRESS = textwrap.dedent('''
    import json, os, sys
    import torch
    torch.set_num_threads(1)
    from bsi.config import make_config
    from bsi.method.surgery import basis_layers
    from bsi.pipeline.fsdp import local_tensor
    from bsi.pipeline.runner import Pipeline
    from bsi.reports import DoneReport, RoundReport

    folder = sys.argv[1]
    # distilling from a (sharded) teacher, recovering sigma while still sharded: every sharded path
    overrides = {"eval_examples": 0, "finetune": {"steps": 2}, "compress": {"distill": 0.5},
                 "recover": {"steps": 3, "train": "sigma", "distill": 0.5}}

    def held(model):
        """(elements of all U and V this process holds, elements of all U and V)"""
        tensors = [t for layer in basis_layers(model).values() for t in (layer.U, layer.V)]
        return sum(local_tensor(t).numel() for t in tensors), sum(t.numel() for t in tensors)

    def run(pipeline, stop_after=None):
        record = {"pruned": [], "held": []}
        for report in pipeline.run():
            if isinstance(report, RoundReport):
                record["pruned"].append({layer.name: layer.pruned.tolist() for layer in report.layers})
                record["held"].append(held(pipeline.model))
                if len(record["pruned"]) == stop_after:
                    return record  # interrupted after a checkpointed round
            if isinstance(report, DoneReport):
                record["ranks"] = report.summary["ranks"]
        record["plain_tensors"] = all(type(p) is torch.nn.Parameter for p in pipeline.model.parameters())
        record["world"] = pipeline.dist.world_size
        return record

    results = {}
    for name, fsdp in (("plain", False), ("fsdp", True)):
        config = make_config("smoke", overrides | {"fsdp": fsdp})
        results[name] = run(Pipeline(config, out_dir=os.path.join(folder, name)))
    config = make_config("smoke", overrides | {"fsdp": True})
    results["interrupted"] = run(Pipeline(config, out_dir=os.path.join(folder, "resumed")), stop_after=1)
    torch.distributed.barrier()  # rank 0 has written the checkpoint
    results["resumed"] = run(Pipeline.resume(os.path.join(folder, "resumed")))
    rank = torch.distributed.get_rank()
    with open(os.path.join(folder, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
''')


@pytest.fixture(scope="module")
def compressed(tmp_path_factory):
    """Three smoke runs on 2 processes: unsharded, sharded, sharded and resumed after round 1."""
    folder = tmp_path_factory.mktemp("fsdp")
    run_two_processes(COMPRESS, [str(folder)], folder / "cache", folder)
    return folder, [json.loads((folder / f"rank{r}.json").read_text()) for r in (0, 1)]


def logits(folder, ids: torch.Tensor) -> torch.Tensor:
    model, _ = load_compressed(folder)
    with torch.no_grad():
        return model(ids).logits  # (B, T, vocab)


def test_fsdp_shards_each_basis_about_half_per_rank(compressed):
    _, ranks = compressed
    assert all(r["fsdp"]["world"] == 2 for r in ranks)
    for round_ in range(len(ranks[0]["fsdp"]["held"])):
        (held0, total), (held1, total1) = (r["fsdp"]["held"][round_] for r in ranks)
        assert total == total1 and held0 + held1 == total  # together the ranks hold each element once
        assert 0.45 < held0 / total < 0.55
    assert all(held == total for held, total in ranks[0]["plain"]["held"])  # without fsdp: all of it
    # Pruning shrinks the sharded bases (re-sharded at the new size) ...
    assert ranks[0]["fsdp"]["held"][-1][1] < ranks[0]["fsdp"]["held"][0][1]
    # ... and afterwards the model is whole again, ordinary tensors on every rank.
    assert all(r["fsdp"]["plain_tensors"] for r in ranks)


def test_fsdp_prunes_the_same_bases_as_the_unsharded_run(compressed):
    _, ranks = compressed
    for r in ranks:
        assert r["fsdp"]["pruned"] == r["plain"]["pruned"]
        assert r["fsdp"]["ranks"] == r["plain"]["ranks"] == ranks[0]["fsdp"]["ranks"]
    assert any(p for round_ in ranks[0]["fsdp"]["pruned"] for p in round_.values())  # something was pruned


def test_fsdp_export_gives_the_unsharded_logits(compressed):
    folder, _ = compressed
    ids = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    plain = logits(folder / "plain", ids)
    torch.testing.assert_close(logits(folder / "fsdp", ids), plain, rtol=1e-5, atol=1e-5)


def test_fsdp_resume_from_a_gathered_checkpoint_ends_like_the_whole_run(compressed):
    folder, ranks = compressed
    for r in ranks:
        assert len(r["interrupted"]["pruned"]) == 1 and 0.45 < r["interrupted"]["held"][0][0] / r["interrupted"]["held"][0][1] < 0.55
        assert r["interrupted"]["pruned"] + r["resumed"]["pruned"] == r["fsdp"]["pruned"]
        assert r["resumed"]["ranks"] == r["fsdp"]["ranks"]
        assert 0.45 < r["resumed"]["held"][0][0] / r["resumed"]["held"][0][1] < 0.55  # re-sharded on resume
    ids = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(logits(folder / "resumed", ids), logits(folder / "fsdp", ids), rtol=1e-5, atol=1e-5)


SWEEP = textwrap.dedent('''
    import json, os, sys
    import torch
    torch.set_num_threads(1)
    from bsi.config import make_config
    from bsi.config import SweepConfig
    from bsi.pipeline.sweep import CellReport, Sweep
    from bsi.reports import EvalReport, SizeReport

    folder = sys.argv[1]
    config = make_config("smoke", {"eval_examples": 4, "max_new_tokens": 8, "fsdp": True,
                                   "finetune": {"steps": 2}, "recover": {"steps": 2}})
    settings = SweepConfig(methods=("svd", "basel"), targets=(0.6,), speed_repeats=1, speed_tokens=4,
                           baseline={"allocation": "sensitivity", "sensitivity_shares": (0.3, 0.6, 0.9)})
    sweep = Sweep(config, settings, os.path.join(folder, "sweep"))
    cells, rows = [], []
    for report in sweep.run():
        if isinstance(report, SizeReport):
            cells.append({"params": report.params_total, "compressible": report.params_compressible})
        if isinstance(report, EvalReport) and report.when == "recovered":
            cells[-1].update(accuracy=report.accuracy, loss=round(report.loss, 5))
        if isinstance(report, CellReport):
            rows.append(report.row.to_dict())
    with open(os.path.join(folder, f"rank{sweep.dist.rank}.json"), "w") as f:
        json.dump({"cells": cells, "rows": rows}, f)
''')


def test_sweep_on_two_processes_gives_the_same_cells_on_both(tmp_path):
    run_two_processes(SWEEP, [str(tmp_path)], tmp_path / "cache", tmp_path)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    # What each process computed itself: the same sizes and metrics in every cell ...
    assert len(ranks[0]["cells"]) == 2 and ranks[0]["cells"] == ranks[1]["cells"]
    assert all("loss" in c for c in ranks[0]["cells"])
    assert ranks[0]["cells"][0]["params"] != ranks[0]["cells"][1]["params"]  # two methods, two allocations
    # ... and one writer: rank 0's rows (with its speed timings) are the file's and every process's.
    assert ranks[0]["rows"] == ranks[1]["rows"] and all("speedup" in row for row in ranks[0]["rows"])
    written = [json.loads(line) for line in (tmp_path / "sweep" / "results.jsonl").read_text().splitlines()]
    assert [r["method"] for r in written] == ["dense", "svd", "basel"]
    assert written[1:] == ranks[0]["rows"]
