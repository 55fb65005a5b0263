"""Paired bootstrap confidence intervals for differences between compressed models.

Two models evaluated on the *same* held-out problems give paired outcomes:
problem ``i`` was answered right or wrong by both, and each has an
answer-token loss on it. A difference between the models is a finding only
if it stands out from the variation of which problems happened to be drawn.
The paired bootstrap measures that variation directly:

1. resample the problems with replacement (within each seed, when several
   seeds, each with its own test problems, are pooled: a *stratified*
   bootstrap, so every resample keeps each seed's share of problems);
2. recompute the statistic, the difference of the two models' accuracies
   (or token-weighted losses) on the resample, with both models on the same
   resampled problems (pairing removes the between-problem variation the two
   share, which is most of it);
3. the 2.5th and 97.5th percentiles of those differences are the 95%
   interval (percentile bootstrap).

An interval that excludes 0 marks a difference the test set supports. It
covers the sampling of test problems, not the randomness of training: the
per-seed differences, reported beside it, show that part, and with two or
more seeds :func:`seed_interval` turns them into an interval over runs.

Everything here is plain numerics on lists and tensors: no model, no files.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

STATISTICS = ("accuracy", "loss")


@dataclass(frozen=True)
class Outcomes:
    """A model's per-problem results on one seed's test problems (aligned lists, one entry per problem).

    ``correct`` holds 1/0 for answered problems and None for problems scored
    for the loss only; ``loss_sum`` and ``tokens`` give the token-weighted loss.
    """

    correct: tuple[bool | None, ...]
    loss_sum: tuple[float, ...]
    tokens: tuple[int, ...]

    @classmethod
    def from_columns(cls, columns: Mapping[str, Sequence]) -> Outcomes:
        out = cls(tuple(columns["correct"]), tuple(float(v) for v in columns["loss_sum"]),
                  tuple(int(v) for v in columns["tokens"]))
        if not len(out.correct) == len(out.loss_sum) == len(out.tokens):
            raise ValueError("outcome columns must have the same length")
        return out

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def answered(self) -> torch.Tensor:
        """(n,) bool: the problems with an accuracy outcome."""
        return torch.tensor([c is not None for c in self.correct], dtype=torch.bool)

    def accuracy(self) -> float:
        values = [bool(c) for c in self.correct if c is not None]
        return sum(values) / len(values) if values else float("nan")

    def loss(self) -> float:
        total = sum(self.tokens)
        return sum(self.loss_sum) / total if total else float("nan")


@dataclass(frozen=True)
class Interval:
    """A statistic with its 95% bootstrap interval; ``excludes_zero`` marks a difference the data support."""

    estimate: float
    low: float
    high: float
    samples: int  # problems the statistic is computed over (pooled over seeds)

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0

    def to_dict(self) -> dict:
        return {"estimate": self.estimate, "low": self.low, "high": self.high, "samples": self.samples,
                "excludes_zero": self.excludes_zero}


def _stack(runs: Sequence[Outcomes], statistic: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per problem of every seed: ``(numerator, denominator, stratum)``, (N,) float64, float64, int64.

    For accuracy, numerator = correct (0/1) and denominator = 1 on answered
    problems only; for loss, numerator = summed loss and denominator = tokens.
    """
    nums, dens, strata = [], [], []
    for s, run in enumerate(runs):
        if statistic == "accuracy":
            keep = [i for i, c in enumerate(run.correct) if c is not None]
            nums.append(torch.tensor([float(run.correct[i]) for i in keep], dtype=torch.float64))
            dens.append(torch.ones(len(keep), dtype=torch.float64))
        else:
            nums.append(torch.tensor(run.loss_sum, dtype=torch.float64))
            dens.append(torch.tensor(run.tokens, dtype=torch.float64))
        strata.append(torch.full((nums[-1].numel(),), s, dtype=torch.long))
    return torch.cat(nums), torch.cat(dens), torch.cat(strata)


def stratified_resamples(strata: torch.Tensor, count: int, generator: torch.Generator) -> torch.Tensor:
    """``count`` bootstrap resamples of positions, each drawn with replacement within its stratum.

    Args:
        strata: (N,) int64 stratum (seed) of every position.

    Returns:
        (count, N) int64 positions; each row keeps every stratum's size.
    """
    rows = torch.empty((count, strata.numel()), dtype=torch.long)
    for s in torch.unique(strata).tolist():
        members = torch.nonzero(strata == s).flatten()  # (n_s,)
        picks = torch.randint(0, members.numel(), (count, members.numel()), generator=generator)
        start, size = int(members[0]), members.numel()
        if int(members[-1]) == start + size - 1:  # a block of consecutive positions (as _stack lays the seeds out)
            rows[:, start:start + size] = picks + start  # the same numbers as the general case, without its gather
        else:
            rows[:, members] = members[picks]
    return rows


def _seeded_resamples(strata: tuple[int, ...], count: int, seed: int) -> torch.Tensor:
    """(count, N) int64: :func:`stratified_resamples` from a fresh generator seeded with ``seed``."""
    return stratified_resamples(torch.tensor(strata, dtype=torch.long), count, torch.Generator().manual_seed(seed))


@functools.lru_cache(maxsize=4)
def _seeded_counts(strata: tuple[int, ...], count: int, seed: int) -> torch.Tensor:
    """(count, N) float64: how many times each position is drawn in each resample of :func:`_seeded_resamples`.

    Computed once per layout: every interval of a table draws from the same
    seed over the same seeds' problems, so all of them share one matrix
    (drawing it again for each pair of models gave the same numbers at many
    times the cost). It is only read, never written.
    """
    picks = _seeded_resamples(strata, count, seed)  # (R, N)
    return torch.zeros(picks.shape, dtype=torch.float64).scatter_add_(1, picks, torch.ones(picks.shape,
                                                                                          dtype=torch.float64))


def _resample_sums(values: torch.Tensor, strata: tuple[int, ...], count: int, seed: int) -> torch.Tensor:
    """(count,) float64: the sum of ``values`` (N,) over each bootstrap resample.

    Summed as draw counts times values, one matrix-vector product, rather
    than by gathering each resample's values and adding them up. For whole
    numbers (right or wrong, token counts) the two are the same to the last
    bit; for summed losses they differ only in the order of the additions
    (at most 5e-16 of a sum), and the product is 15x faster at 500 problems
    and 21x at 2,000 (4,000 resamples on one thread: 13.2 -> 0.9 ms and
    55.4 -> 2.6 ms; the shipped study's statistics 7.3 -> 1.1 s;
    ``python bench/speed.py --sections bootstrap``,
    ``data/speed/bootstrap-2026-12-02-intel-xeon-1t.json``).
    """
    return _seeded_counts(strata, count, seed) @ values  # (R, N) @ (N,)


def pooled_value(runs: Sequence[Outcomes], statistic: str) -> float:
    """Accuracy (share of answered problems right) or token-weighted loss, pooled over the seeds' problems."""
    num, den, _ = _stack(runs, statistic)
    return float(num.sum() / den.sum()) if den.sum() > 0 else float("nan")


def paired_difference(a: Sequence[Outcomes], b: Sequence[Outcomes], statistic: str, *, resamples: int = 4000,
                      seed: int = 0, level: float = 0.95) -> Interval:
    """``statistic(a) - statistic(b)`` pooled over seeds, with a stratified paired bootstrap interval.

    ``a[s]`` and ``b[s]`` are two models' outcomes on seed ``s``'s test
    problems (the same problems, in the same order). Accuracy differences are
    in [-1, 1]; loss differences in loss units (negative: ``a`` has the lower,
    better loss).
    """
    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be one of {', '.join(STATISTICS)}, got '{statistic}'")
    if len(a) != len(b) or not a:
        raise ValueError("give the same number (>= 1) of seeds for both models")
    for x, y in zip(a, b):
        if len(x) != len(y) or (statistic == "accuracy" and not torch.equal(x.answered, y.answered)):
            raise ValueError("paired outcomes must cover the same problems")
    num_a, den_a, strata = _stack(a, statistic)
    num_b, den_b, _ = _stack(b, statistic)
    if num_a.numel() == 0:
        return Interval(float("nan"), float("nan"), float("nan"), 0)
    estimate = float(num_a.sum() / den_a.sum() - num_b.sum() / den_b.sum())
    layout = tuple(strata.tolist())
    sums = [_resample_sums(values, layout, resamples, seed) for values in (num_a, den_a, num_b, den_b)]  # each (R,)
    diffs = sums[0] / sums[1] - sums[2] / sums[3]  # (R,)
    tail = (1 - level) / 2
    low, high = torch.quantile(diffs, torch.tensor([tail, 1 - tail], dtype=torch.float64)).tolist()
    return Interval(estimate, low, high, int(num_a.numel()))


def value_interval(runs: Sequence[Outcomes], statistic: str, *, resamples: int = 4000, seed: int = 0,
                   level: float = 0.95) -> Interval:
    """One model's pooled accuracy or loss with its stratified bootstrap interval (for the figure's bands)."""
    num, den, strata = _stack(runs, statistic)
    if num.numel() == 0:
        return Interval(float("nan"), float("nan"), float("nan"), 0)
    layout = tuple(strata.tolist())
    values = _resample_sums(num, layout, resamples, seed) / _resample_sums(den, layout, resamples, seed)  # (R,)
    tail = (1 - level) / 2
    low, high = torch.quantile(values, torch.tensor([tail, 1 - tail], dtype=torch.float64)).tolist()
    return Interval(float(num.sum() / den.sum()), low, high, int(num.numel()))


def per_seed_differences(a: Sequence[Outcomes], b: Sequence[Outcomes], statistic: str) -> list[float]:
    """The difference ``statistic(a[s]) - statistic(b[s])`` of each seed alone (the training-noise view)."""
    values = []
    for x, y in zip(a, b):
        value = (x.accuracy() - y.accuracy()) if statistic == "accuracy" else (x.loss() - y.loss())
        values.append(value if math.isfinite(value) else float("nan"))
    return values


#: Student's t, 97.5th percentile, by degrees of freedom (seeds - 1): the half-width factor of a 95% interval.
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         15: 2.131, 20: 2.086, 30: 2.042}


def seed_interval(values: Sequence[float]) -> Interval:
    """The mean of per-seed values with a 95% Student-t interval over seeds: the run-to-run view.

    Each seed is one independent run (its own split, fine-tune, batches and
    probes), so the spread of its values measures training noise, which the
    problem bootstrap of :func:`paired_difference` leaves out. With few seeds
    the interval is wide by design: three seeds give a half-width of 4.3
    standard errors. Needs at least two finite values; ``samples`` counts seeds.
    """
    finite = [float(v) for v in values if math.isfinite(v)]
    if len(finite) < 2:
        raise ValueError(f"an interval over seeds needs at least 2 finite values, got {len(finite)}")
    n = len(finite)
    mean = sum(finite) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in finite) / (n - 1))
    factor = T_975[max(k for k in T_975 if k <= n - 1)]  # between tabulated values: the wider (conservative) one
    half = factor * sd / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n)
