"""The ranking tested apart from recovery (bsi.analysis.ranking) and the within-layer selection variant."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import LMLoss, make_tiny_llama

from bsi.analysis.ranking import RoundSnapshots, measure_round, removed, spearman, spread_sample
from bsi.config import CompressConfig, SizeRule
from bsi.method.engine import Compressor
from bsi.method.schedule import smallest_within
from bsi.method.surgery import basis_layers

lm_loss = LMLoss()


def token_batches(seed=0):
    g = torch.Generator().manual_seed(seed)
    while True:
        yield {"input_ids": torch.randint(0, 97, (4, 16), generator=g)}


def held_out_loss(model):
    batch = {"input_ids": torch.randint(0, 97, (8, 16), generator=torch.Generator().manual_seed(99))}
    with torch.no_grad():
        return float(lm_loss(model, batch))


def run(config, hook=None):
    model = make_tiny_llama()
    compressor = Compressor(model, token_batches(), config, lm_loss, before_cut=hook)
    return compressor, [r for r in compressor.run() if type(r).__name__ == "RoundReport"]


def test_removed_zeroes_sigma_inside_and_restores_it_exactly():
    model = make_tiny_llama()
    from bsi.method.surgery import to_basis_form

    layers = to_basis_form(model, aux_rank=1)
    name = next(iter(layers))
    before = layers[name].sigma.detach().clone()
    with removed(layers, {name: torch.tensor([0, 3])}):
        assert layers[name].sigma[0] == 0 and layers[name].sigma[3] == 0 and layers[name].sigma[1] == before[1]
    assert torch.equal(layers[name].sigma, before)


def test_spearman_and_spread_sample():
    assert spearman(torch.tensor([1.0, 2, 3, 4]), torch.tensor([10.0, 20, 30, 40])) == pytest.approx(1.0)
    assert spearman(torch.tensor([1.0, 2, 3, 4]), torch.tensor([4.0, 3, 2, 1])) == pytest.approx(-1.0)
    order = torch.arange(100)
    picked = spread_sample(order, 5)
    assert picked.tolist() == [0, 25, 50, 74, 99] and spread_sample(order[:3], 5).tolist() == [0, 1, 2]


def test_smallest_within_keeps_each_layers_count():
    pruned = {"a": torch.tensor([0, 1]), "b": torch.tensor([4])}
    magnitude = {"a": torch.tensor([5.0, 4, 3, 0.1, 0.2]), "b": torch.tensor([1.0, 0.5, 3, 4, 9])}
    pools = {"a": torch.tensor([0, 1, 3, 4]), "b": torch.tensor([1, 2, 3, 4])}
    assert {k: v.tolist() for k, v in smallest_within(pruned, magnitude, pools).items()} == {"a": [3, 4], "b": [1]}


def test_the_measured_bsi_cut_is_the_cut_the_engine_makes():
    """Zeroing the chosen bases gives the loss of the model the engine prunes (physical removal of the columns)."""
    results = []

    def hook(compressor, scores, pruned):
        calls = []

        def loss():
            calls.append(held_out_loss(compressor.model))
            return calls[-1]

        result = measure_round(compressor.layers, scores, compressor.select, pruned, loss,
                               probe_layers=list(compressor.layers)[:1], singles=4, shares=(0.5,))
        cut = copy.deepcopy(compressor.model)
        for name, layer in basis_layers(cut).items():
            keep = torch.tensor([i for i in range(layer.rank) if i not in set(pruned[name].tolist())], dtype=torch.long)
            layer.keep(keep)
        results.append((result, held_out_loss(cut), held_out_loss(compressor.model), calls))

    config = CompressConfig(size=SizeRule.target(0.4), rounds=2, iters_per_epoch=8, sampling_ratio=0.5, aux_rank=1,
                            curvature="hutchinson")
    run(config, hook)
    assert len(results) == 2
    for result, physical, untouched, calls in results:
        # the documented order of the loss calls: the model as it is first, the cuts last, in the order of "cuts"
        assert calls[0] == result["loss"] and calls[-len(result["cuts"]):] == [c["loss"] for c in result["cuts"].values()]
        assert result["cuts"]["bsi"]["loss"] == pytest.approx(physical, rel=1e-5)
        assert result["loss"] == pytest.approx(untouched, rel=1e-6)  # every measurement was undone
        removed_counts = {k: v["removed"] for k, v in result["cuts"].items()}
        assert removed_counts["bsi budgets, magnitude inside"] == removed_counts["bsi"]
        layer = next(iter(result["layers"].values()))
        assert len(layer["measured"]) == 4 and set(layer["spearman"]) == {"bsi", "bsi-grad", "magnitude", "random"}
        assert set(layer["k_lowest"]["0.5"]) >= {"k", "bsi", "magnitude"}


def test_within_layer_magnitude_keeps_the_scores_budgets_but_removes_the_smallest():
    seen = {}

    def hook(compressor, scores, pruned):
        by_score = compressor.select.__func__(compressor, scores, importance=scores.importance,
                                              rule=compressor.config.selection_rule)
        seen[compressor.round_index] = (scores, pruned, by_score)

    config = CompressConfig(size=SizeRule.target(0.4), rounds=2, iters_per_epoch=8, sampling_ratio=0.5, aux_rank=1,
                            within_layer="magnitude")
    run(config, hook)
    for scores, pruned, by_score in seen.values():
        for name, positions in pruned.items():
            assert positions.numel() == by_score[name].numel()  # the score decided how many
            sigma = scores.layers[name].sigma.abs().cpu()
            pool = scores.pools[name]
            if positions.numel():  # and magnitude which: nothing kept in the pool is smaller than what went
                kept = torch.tensor([p for p in pool.tolist() if p not in set(positions.tolist())], dtype=torch.long)
                assert kept.numel() == 0 or sigma[positions].max() <= sigma[kept].min()


def test_round_snapshots_rebuild_each_rounds_model_before_its_cut():
    snapshots, copies = RoundSnapshots(), {}

    def hook(compressor, scores, pruned):
        snapshots.capture(compressor)
        copies[compressor.round_index] = copy.deepcopy(compressor.model)

    config = CompressConfig(size=SizeRule.target(0.4), rounds=3, iters_per_epoch=9, sampling_ratio=0.4, aux_rank=2)
    run(config, hook)
    ids = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(5))
    for round_index, original in copies.items():
        rebuilt = snapshots.model_at(round_index)
        with torch.no_grad():
            torch.testing.assert_close(rebuilt(input_ids=ids).logits, original.eval()(input_ids=ids).logits,
                                       rtol=1e-5, atol=1e-5)
    with pytest.raises(KeyError):
        snapshots.model_at(9)
