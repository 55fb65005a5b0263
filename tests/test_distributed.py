"""Two CPU processes (gloo): one compression, FSDP's sharded bases, a sweep; the same results on both ranks.

* **Replicated** (DDP-style): one smoke compression on both processes, the
  same pruning on both ranks, one writer.
* **Sharded** (``fsdp``): the same pruning and export as the replicated run
  on the same number of processes, resume from a checkpoint. Each rank reads
  its own batches, so "the same seed and batches" means the same number of
  processes: the sharded run is compared with the unsharded run on two
  processes, which the replicated run's test checks is identical on both ranks.
* **Sweep**: the sweep's engine cells run the default recovery (factors,
  after the bases are gathered) under FSDP.

The three run in one ``torchrun`` launch (:func:`runs`), one after another,
each in its own folder with its own bsi cache, as each ran when it had a
launch of its own: a launch costs its three processes' imports of torch,
transformers and bsi and a rendezvous (about 10 s on 2 cores), paid once
instead of three times.
"""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
from conftest import run_two_processes

from bsi.pipeline.export import load_compressed

SCRIPT = textwrap.dedent('''
    import json, os, sys
    import torch
    torch.set_num_threads(1)
    from bsi.config import SweepConfig, make_config
    from bsi.method.surgery import basis_layers
    from bsi.pipeline.fsdp import local_tensor
    from bsi.pipeline.runner import Pipeline
    from bsi.pipeline.sweep import CellReport, Sweep
    from bsi.reports import DoneReport, EvalReport, RoundReport, SizeReport


    def dump(folder, record):
        with open(os.path.join(folder, "rank" + os.environ["RANK"] + ".json"), "w") as f:
            json.dump(record, f)


    def replicated(folder):
        """One smoke compression on both processes; rank 1 is given an output folder of its own."""
        out = os.path.join(folder, "out")
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
        dump(folder, {"ranks": summary["ranks"], "pruned": pruned, "weights": weights,
                      "world": pipeline.dist.world_size})


    def sharded(folder):
        """Three smoke runs: unsharded, sharded, sharded and resumed after round 1."""
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
        dump(folder, results)


    def sweep(folder):
        """Two methods at one size under FSDP; what each process computed in every cell, and the rows."""
        config = make_config("smoke", {"eval_examples": 4, "max_new_tokens": 8, "fsdp": True,
                                       "finetune": {"steps": 2}, "recover": {"steps": 2}})
        settings = SweepConfig(methods=("svd", "basel"), targets=(0.6,), speed_repeats=1, speed_tokens=4,
                               baseline={"allocation": "sensitivity", "sensitivity_shares": (0.3, 0.6, 0.9)})
        cells, rows = [], []
        for report in Sweep(config, settings, os.path.join(folder, "sweep")).run():
            if isinstance(report, SizeReport):
                cells.append({"params": report.params_total, "compressible": report.params_compressible})
            if isinstance(report, EvalReport) and report.when == "recovered":
                cells[-1].update(accuracy=report.accuracy, loss=round(report.loss, 5))
            if isinstance(report, CellReport):
                rows.append(report.row.to_dict())
        dump(folder, {"cells": cells, "rows": rows})


    RUNS = {"replicated": replicated, "sharded": sharded, "sweep": sweep}
    root = sys.argv[1]
    for name in sys.argv[2:]:
        folder = os.path.join(root, name)
        os.makedirs(folder, exist_ok=True)
        os.environ["BSI_CACHE"] = os.path.join(folder, "cache")  # its own cache: no run reuses another's fine-tune
        RUNS[name](folder)
        torch.distributed.barrier()  # both ranks done (and rank 0's files written) before the next run starts
''')

RUNS = ("replicated", "sharded", "sweep")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The folder of the three two-process runs (:data:`RUNS`), each in its sub-folder with ``rank0/1.json``."""
    root = tmp_path_factory.mktemp("two-processes")
    run_two_processes(SCRIPT, [str(root), *RUNS], root / "cache", root, timeout=900)
    return root


def _ranks(folder):
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in (0, 1)]


# ------------------------------------------------------------------ replicated: one compression, one writer

def test_two_cpu_processes_prune_identically_and_only_rank0_writes(runs):
    folder = runs / "replicated"
    ranks = _ranks(folder)
    assert all(r["world"] == 2 for r in ranks)
    # Summed statistics are identical on both ranks, so both prune the very same bases ...
    assert ranks[0]["pruned"] == ranks[1]["pruned"]
    assert ranks[0]["ranks"] == ranks[1]["ranks"]
    assert any(p for round_ in ranks[0]["pruned"] for p in round_.values())  # something was pruned
    # ... and averaged gradients keep the trained weights identical although the batches differ.
    assert ranks[0]["weights"] == pytest.approx(ranks[1]["weights"], rel=1e-6)
    # One writer: rank 0's output is complete, and rank 1, given a folder of its own, wrote nothing there
    # (no result, no round checkpoint, no half-written temporary folder beside it).
    out = folder / "out"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ranks"] == ranks[0]["ranks"]
    assert (out / "model.safetensors").is_file()
    assert not [p.name for p in folder.iterdir() if "out-rank1" in p.name]


# ------------------------------------------------------------------ sharded: FSDP against the replicated run

@pytest.fixture(scope="module")
def compressed(runs):
    """The sharded runs' folder and each rank's record: unsharded, sharded, sharded and resumed after round 1."""
    return runs / "sharded", _ranks(runs / "sharded")


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


# ------------------------------------------------------------------ a sweep across processes

def test_sweep_on_two_processes_gives_the_same_cells_on_both(runs):
    folder = runs / "sweep"
    ranks = _ranks(folder)
    # What each process computed itself: the same sizes and metrics in every cell ...
    assert len(ranks[0]["cells"]) == 2 and ranks[0]["cells"] == ranks[1]["cells"]
    assert all("loss" in c for c in ranks[0]["cells"])
    assert ranks[0]["cells"][0]["params"] != ranks[0]["cells"][1]["params"]  # two methods, two allocations
    # ... and one writer: rank 0's rows (with its speed timings) are the file's and every process's.
    assert ranks[0]["rows"] == ranks[1]["rows"] and all("speedup" in row for row in ranks[0]["rows"])
    written = [json.loads(line) for line in (folder / "sweep" / "results.jsonl").read_text().splitlines()]
    assert [r["method"] for r in written] == ["dense", "svd", "basel"]
    assert written[1:] == ranks[0]["rows"]
