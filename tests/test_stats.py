"""Paired bootstrap intervals (bsi.analysis.stats) and the study's tables (bsi.analysis.study)."""

from __future__ import annotations

import math
import random
import statistics

import pytest
import torch

from bsi.analysis.stats import (
    Outcomes,
    _stack,
    paired_difference,
    per_seed_differences,
    pooled_value,
    seed_interval,
    stratified_resamples,
    value_interval,
)
from bsi.analysis.study import study_markdown, study_stats
from bsi.results import StudyRow


def outcomes(correct, losses, tokens=None):
    tokens = tokens or [10] * len(losses)
    return Outcomes(tuple(correct), tuple(loss * t for loss, t in zip(losses, tokens)), tuple(tokens))


def noisy(n, accuracy, loss, seed):
    rng = random.Random(seed)
    return outcomes([rng.random() < accuracy for _ in range(n)], [max(0.0, rng.gauss(loss, loss / 2)) for _ in range(n)])


def test_a_model_against_itself_differs_by_exactly_zero():
    a = [noisy(200, 0.6, 1.0, s) for s in range(3)]
    for stat in ("accuracy", "loss"):
        diff = paired_difference(a, a, stat, resamples=500)
        assert (diff.estimate, diff.low, diff.high) == (0.0, 0.0, 0.0) and not diff.excludes_zero


def test_a_clearly_better_model_has_an_interval_that_excludes_zero():
    worse = [noisy(300, 0.5, 1.0, s) for s in range(2)]
    better = [outcomes([c or random.Random(i).random() < 0.6 for i, c in enumerate(w.correct)],
                       [loss / t * 0.7 for loss, t in zip(w.loss_sum, w.tokens)]) for w in worse]
    acc = paired_difference(better, worse, "accuracy")
    loss = paired_difference(better, worse, "loss")
    assert acc.estimate > 0 and acc.low > 0 and acc.excludes_zero
    assert loss.estimate < 0 and loss.high < 0 and loss.excludes_zero
    assert acc.samples == 600 and acc.low <= acc.estimate <= acc.high


def test_a_small_difference_on_few_problems_is_within_noise():
    a, b = noisy(40, 0.5, 1.0, 1), noisy(40, 0.5, 1.0, 2)  # two unrelated models of the same quality
    diff = paired_difference([a], [b], "accuracy")
    assert diff.low < 0 < diff.high


def test_the_interval_covers_the_truth_about_95_percent_of_the_time():
    """Two models that answer each problem right with probability 0.6 and 0.5: the difference is 0.1."""
    covered = 0
    for trial in range(60):
        rng = random.Random(trial)
        a = outcomes([rng.random() < 0.6 for _ in range(300)], [1.0] * 300)
        b = outcomes([rng.random() < 0.5 for _ in range(300)], [1.0] * 300)
        diff = paired_difference([a], [b], "accuracy", resamples=800, seed=trial)
        covered += diff.low <= 0.1 <= diff.high
    assert covered >= 52  # 95% nominal; binomial(60, 0.95) falls below 52 with probability < 1%


def test_resamples_stay_within_their_seed_and_keep_its_size():
    strata = torch.tensor([0] * 5 + [1] * 3)
    picks = stratified_resamples(strata, 200, torch.Generator().manual_seed(0))
    assert picks.shape == (200, 8)
    assert torch.all(strata[picks] == strata)  # a seed's problems are drawn from that seed only
    assert picks[:, :5].unique().numel() == 5 and picks[:, 5:].unique().numel() == 3


def test_the_shared_resamples_give_the_intervals_of_one_draw_per_pair():
    """Intervals share one resample matrix per layout, summed as draw counts times values: one draw's numbers.

    Against each resample gathered and added up on its own: the same to the
    last bit for whole numbers (accuracy), and to the rounding of the
    additions' order for summed losses.
    """
    a = [noisy(40, 0.6, 0.5, 1), noisy(30, 0.5, 0.7, 2)]
    b = [noisy(40, 0.4, 0.6, 3), noisy(30, 0.5, 0.6, 4)]
    strata = torch.tensor([0] * 40 + [1] * 30)
    scattered = torch.tensor([0, 1] * 35)  # the seeds interleaved: the general, gathering path
    for layout in (strata, scattered):
        picks = stratified_resamples(layout, 500, torch.Generator().manual_seed(7))
        assert torch.all(layout[picks] == layout)
        generator, gathered = torch.Generator().manual_seed(7), torch.empty_like(picks)
        for s in (0, 1):  # the draws written as the general case writes them, a gather per seed
            members = torch.nonzero(layout == s).flatten()
            gathered[:, members] = members[torch.randint(0, members.numel(), (500, members.numel()),
                                                         generator=generator)]
        assert torch.equal(picks, gathered)  # the block path (seeds laid out one after another) draws the same
    picks = stratified_resamples(strata, 500, torch.Generator().manual_seed(7))  # (R, N) drawn for this pair alone
    for statistic in ("accuracy", "loss"):
        num_a, den_a, _ = _stack(a, statistic)
        num_b, den_b, _ = _stack(b, statistic)
        diffs = num_a[picks].sum(1) / den_a[picks].sum(1) - num_b[picks].sum(1) / den_b[picks].sum(1)
        tail = (1 - 0.95) / 2  # as paired_difference computes it (0.025000000000000022)
        low, high = torch.quantile(diffs, torch.tensor([tail, 1 - tail], dtype=torch.float64)).tolist()
        shared = paired_difference(a, b, statistic, resamples=500, seed=7)
        if statistic == "accuracy":
            assert (shared.low, shared.high) == (low, high)  # exactly, not approximately
        else:  # the same sums added in another order: equal to 1e-12, the resampling's own spread being ~1e-1
            assert shared.low == pytest.approx(low, rel=1e-12, abs=0) and shared.high == pytest.approx(high, rel=1e-12,
                                                                                                       abs=0)
            assert shared.high - shared.low > 1e-3
        assert paired_difference(a, b, statistic, resamples=500, seed=8) != shared  # another seed, another draw


def test_pooled_values_weight_tokens_and_skip_loss_only_problems():
    run = Outcomes((True, False, None), (2.0, 4.0, 30.0), (1, 1, 10))
    assert pooled_value([run], "accuracy") == 0.5
    assert pooled_value([run], "loss") == pytest.approx(36.0 / 12)
    band = value_interval([run, run], "accuracy", resamples=300)
    assert band.estimate == 0.5 and 0 <= band.low <= 0.5 <= band.high <= 1 and band.samples == 4
    assert per_seed_differences([run], [Outcomes((True, True, None), (1.0, 1.0, 3.0), (1, 1, 10))], "accuracy") == [-0.5]


def test_pairing_needs_the_same_problems():
    with pytest.raises(ValueError, match="same problems"):
        paired_difference([noisy(10, 0.5, 1, 0)], [noisy(11, 0.5, 1, 0)], "accuracy")
    with pytest.raises(ValueError, match="statistic"):
        paired_difference([noisy(10, 0.5, 1, 0)], [noisy(10, 0.5, 1, 0)], "f1")


def test_study_stats_and_table_mark_the_differences_that_exclude_zero():
    runs = {("dense", 1.0, s): noisy(200, 0.8, 0.1, 10 + s) for s in (0, 1)}
    for s in (0, 1):
        runs[("bsi", 0.4, s)] = noisy(200, 0.7, 0.2, 20 + s)
        strong = runs[("bsi", 0.4, s)]
        runs[("svd", 0.4, s)] = outcomes([False] * 200, [loss / t * 3 for loss, t in zip(strong.loss_sum, strong.tokens)])
    rows = [StudyRow.from_dict({"method": m, "target": t, "seed": s,
                                "protocol": {"dense": "dense", "svd": "published"}.get(m, "tuned"),
                                "outcomes": f"{m}-{t}-{s}", "params_total": 100 if m == "dense" else 50,
                                "compression_ratio": 1.0 if m == "dense" else 2.0}) for m, t, s in runs]
    stats = study_stats(rows, lambda row: runs[(row.method, row.target, row.seed)], ["tuned"], resamples=500)
    svd = stats["protocols"]["tuned"]["methods"]["svd"]["0.4"]
    assert svd["vs_anchor"]["accuracy"]["excludes_zero"] and svd["vs_anchor"]["accuracy"]["estimate"] > 0.6
    assert svd["vs_anchor"]["loss"]["estimate"] < 0 and svd["vs_anchor"]["seeds"] == [0, 1]
    assert "vs_anchor" not in stats["protocols"]["tuned"]["methods"]["bsi"]["0.4"]
    text = study_markdown(stats)
    line = next(row for row in text.splitlines() if row.startswith("| `svd` |") and "**" in row)
    assert line.count("**") == 4  # both differences marked
    # Two seeds agreeing: the t-interval over the seeds' own differences excludes 0 too, marked with a dagger.
    runs_view = svd["vs_anchor"]["over_seeds"]["accuracy"]
    assert runs_view["samples"] == 2 and runs_view["excludes_zero"]
    assert runs_view["estimate"] == pytest.approx(sum(svd["vs_anchor"]["per_seed"]["accuracy"]) / 2)
    assert line.count("\u2020") == 2 and "t-interval over the seeds' own differences" in text
    assert "0.4 (2.00x)" in text and "Dense fine-tuned model (seeds 0, 1)" in text


def test_one_seed_has_no_interval_over_seeds_and_no_dagger():
    runs = {("dense", 1.0, 0): noisy(100, 0.8, 0.1, 1), ("bsi", 0.4, 0): noisy(100, 0.7, 0.2, 2),
            ("svd", 0.4, 0): outcomes([False] * 100, [3.0] * 100)}
    rows = [StudyRow.from_dict({"method": m, "target": t, "seed": s, "protocol": "tuned", "outcomes": m,
                                "params_total": 50, "compression_ratio": 2.0}) for m, t, s in runs]
    stats = study_stats(rows, lambda row: runs[(row.method, row.target, row.seed)], ["tuned"], resamples=200)
    diff = stats["protocols"]["tuned"]["methods"]["svd"]["0.4"]["vs_anchor"]
    assert diff["accuracy"]["excludes_zero"] and "over_seeds" not in diff
    assert "\u2020" not in next(r for r in study_markdown(stats).splitlines() if r.startswith("| `svd` |") and "**" in r)


def test_the_interval_over_seeds_is_students_t_and_wide_for_three_seeds():
    # Three seeds with mean 0 and standard deviation 9: half-width 4.303 * 9 / sqrt(3).
    interval = seed_interval([9.0, 0.0, -9.0])
    assert interval.estimate == 0.0 and interval.samples == 3
    assert interval.high == pytest.approx(4.303 * 9 / math.sqrt(3)) and interval.low == -interval.high
    assert not interval.excludes_zero
    # The same spread around a large mean, over many seeds, excludes 0; an untabulated df takes the wider factor.
    many = seed_interval([10.0 + d for d in (9.0, 0.0, -9.0) * 4])  # 12 seeds: df 11 -> the factor of df 10
    spread = statistics.stdev((9.0, 0.0, -9.0) * 4)
    assert many.excludes_zero and many.high - many.estimate == pytest.approx(2.228 * spread / math.sqrt(12))
    with pytest.raises(ValueError, match="at least 2"):
        seed_interval([1.0, float("nan")])
