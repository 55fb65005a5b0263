"""Two CPU processes run one compression (gloo): same pruning on both ranks, one writer."""

from __future__ import annotations

import json
import textwrap

import pytest
from conftest import run_two_processes

WORKER = textwrap.dedent('''
    import json, os, sys
    import torch
    torch.set_num_threads(1)
    from bsi.config import make_config
    from bsi.pipeline.runner import Pipeline
    from bsi.reports import DoneReport, RoundReport

    out, results = sys.argv[1], sys.argv[2]
    if os.environ["RANK"] != "0":  # a folder of its own: anything rank 1 writes would show there
        out += "-rank" + os.environ["RANK"]
    config = make_config("smoke", {"eval_examples": 0, "finetune": {"steps": 2}, "recover": {"steps": 3}})
    pipeline = Pipeline(config, out_dir=out)
    summary, pruned = None, []
    for report in pipeline.run():
        if isinstance(report, RoundReport):
            pruned.append({layer.name: layer.pruned.tolist() for layer in report.layers})
        if isinstance(report, DoneReport):
            summary = report.summary
    weights = sum(float(p.detach().double().abs().sum()) for p in pipeline.model.parameters())
    rank = pipeline.dist.rank
    with open(os.path.join(results, f"rank{rank}.json"), "w") as f:
        json.dump({"ranks": summary["ranks"], "pruned": pruned, "weights": weights,
                   "world": pipeline.dist.world_size}, f)
''')


def test_two_cpu_processes_prune_identically_and_only_rank0_writes(tmp_path, isolated_cache):
    results = tmp_path / "results"
    results.mkdir()
    out = tmp_path / "out"
    run_two_processes(WORKER, [str(out), str(results)], isolated_cache, tmp_path)
    ranks = [json.loads((results / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert all(r["world"] == 2 for r in ranks)
    # Summed statistics are identical on both ranks, so both prune the very same bases ...
    assert ranks[0]["pruned"] == ranks[1]["pruned"]
    assert ranks[0]["ranks"] == ranks[1]["ranks"]
    assert any(p for round_ in ranks[0]["pruned"] for p in round_.values())  # something was pruned
    # ... and averaged gradients keep the trained weights identical although the batches differ.
    assert ranks[0]["weights"] == pytest.approx(ranks[1]["weights"], rel=1e-6)
    # One writer: rank 0's output is complete, and rank 1, given a folder of its own, wrote nothing there
    # (no result, no round checkpoint, no half-written temporary folder beside it).
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ranks"] == ranks[0]["ranks"]
    assert (out / "model.safetensors").is_file()
    assert not [p.name for p in tmp_path.iterdir() if "out-rank1" in p.name]
