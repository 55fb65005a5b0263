"""How much each pruning round removes, and which bases: pure functions over per-layer vectors.

Two size modes (``SizeRule.mode``, the configuration's ``size``):

* ``keep`` (the method's rule): every layer keeps the most important bases of
  its candidate pool that hold a share ``KeepRatio ** (1/T)`` of the pool's
  positive importance (:func:`bsi.method.scores.mass_rule_keep_count`).
* ``target``: a parameter *budget* per round. A layer's stored size only falls
  below its dense size once it keeps fewer than its break-even rank
  ``in * out / (in + out) - a`` bases (factors cost ``r (in + out)``): half
  the rank of a square layer, 73-75% of it for the embedded model's others.
  Budgets in stored parameters would therefore force the first round to
  remove a quarter to a half of every layer at once. The rounds therefore budget in
  *factor* parameters, shrinking geometrically from the full-rank factors to
  the final size (:func:`gradual_budgets`), and only the last round's budget
  is the stored-size target itself. Each round then removes about the same
  share of the bases. A run may pass several sizes on its way
  (``SizeRule.stops``, :func:`path_budgets`): one run, one model per size.

Which bases go within a budget (``selection``):

* ``mass``: one keep fraction ``q`` shared by all layers, found by bisection,
  each layer applying the mass rule with it (the method's per-layer rule, with
  the amount set by size);
* ``global``: bases ranked across layers by importance per parameter they
  cost, least valuable first, until the budget is met. Meaningful only for
  scores in loss units (``bsi``, ``bsi-grad``), whose values are predicted
  loss changes and compare across layers.

In both modes no round may remove far more than its share: a layer loses at
most ``max_cut_factor`` times the round's even share of its bases
(:func:`cut_caps`), the least important first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from bsi.method.layers import factor_cost, stored_cost
from bsi.method.scores import mass_rule_keep_count


@dataclass(frozen=True)
class LayerShape:
    """What the schedule needs to know about one layer."""

    in_features: int
    out_features: int
    rank: int  # active bases now
    aux_rank: int = 0
    bias: bool = False

    def cost(self, rank: int, measure: str = "stored") -> int:
        """Parameters at ``rank`` bases: ``stored`` (min of factors and dense) or ``factor``."""
        fn = stored_cost if measure == "stored" else factor_cost
        return fn(self.in_features, self.out_features, rank, self.aux_rank, self.bias)

    @property
    def dense(self) -> int:
        return self.in_features * self.out_features + (self.out_features if self.bias else 0)

    @property
    def per_basis(self) -> int:
        """Factor parameters one basis costs: ``in + out``."""
        return self.in_features + self.out_features


def gradual_budgets(start_factor: int, final_stored: int, rounds: int) -> list[tuple[int, str]]:
    """Per-round budgets ``[(parameters, measure), ...]``: factor budgets shrinking geometrically, then the target.

    Round ``t < T`` aims at ``start * (final / start) ** (t / T)`` *factor*
    parameters; round ``T`` at ``final_stored`` *stored* parameters. With
    ``start`` the full-rank factor size of the layers, every round removes
    about the same share ``1 - (final / start) ** (1 / T)`` of the bases.
    (A path with one stop, see :func:`path_budgets`.)
    """
    return [(parameters, measure) for parameters, measure, _ in path_budgets(start_factor, [final_stored], rounds)]


def split_rounds(weights: Sequence[float], rounds: int) -> list[int]:
    """``rounds`` split into one whole share per weight, each >= 1, proportional to the weights otherwise.

    Largest remainders get the leftover rounds. ``split_rounds([1, 1, 2], 8) == [2, 2, 4]``.
    """
    if rounds < len(weights):
        raise ValueError(f"{rounds} rounds cannot cover {len(weights)} segments: give at least one round each")
    total = sum(weights) or 1.0
    spare = rounds - len(weights)
    ideal = [spare * w / total for w in weights]
    shares = [1 + math.floor(x) for x in ideal]
    leftovers = sorted(range(len(weights)), key=lambda i: ideal[i] - math.floor(ideal[i]), reverse=True)
    for i in leftovers[: rounds - sum(shares)]:
        shares[i] += 1
    return shares


def path_budgets(start_factor: int, stops_stored: Sequence[int], rounds: int) -> list[tuple[int, str, int | None]]:
    """Per-round budgets of a pruning *path* through several sizes: ``[(parameters, measure, stop), ...]``.

    ``stops_stored`` are stored-parameter sizes, largest first; the last is
    the final target. The path is cut into segments, from the full-rank
    factors to the first stop, then from each stop to the next. Each segment
    gets a share of the ``rounds`` proportional to how far it shrinks the
    model (the log of its size ratio, at least one round), so every round
    removes about the same share of what is left. Inside a segment the
    budgets shrink geometrically; its last round lands on the stop itself,
    in stored parameters, and names it (``stop`` = its index in
    ``stops_stored``; None for the rounds in between).

    The first segment's intermediate rounds budget *factor* parameters: a
    layer's stored size only falls below its dense size below its break-even
    rank (:func:`~bsi.method.layers.break_even_rank`), so stored budgets would
    make one round remove a quarter to a half of every layer. Later segments start below that point, so they budget
    stored parameters throughout.
    """
    stops = [int(s) for s in stops_stored]
    if not stops:
        raise ValueError("a path needs at least one stop")
    if any(b >= a for a, b in zip(stops, stops[1:])):
        raise ValueError(f"the stops of a path must shrink strictly, got {stops}")
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    starts = [max(int(start_factor), 1)] + stops[:-1]
    weights = [max(math.log(max(a, 1) / max(b, 1)), 1e-6) for a, b in zip(starts, stops)]
    budgets: list[tuple[int, str, int | None]] = []
    for k, (a, b, n) in enumerate(zip(starts, stops, split_rounds(weights, rounds))):
        ratio = min(1.0, b / a)
        measure = "factor" if k == 0 else "stored"
        budgets += [(round(a * ratio ** (t / n)), measure, None) for t in range(1, n)]
        budgets.append((b, "stored", k))
    return budgets


def cut_caps(ranks: Mapping[str, int], share: float, factor: float) -> dict[str, int] | None:
    """The most bases each layer may lose this round: ``ceil(factor * share * rank)``; None: no limit.

    Args:
        ranks: active bases per layer.
        share: the round's even share of the bases (e.g. ``1 - KeepRatio ** (1/T)``).
        factor: ``max_cut_factor``; 0 switches the limit off.
    """
    if factor <= 0:
        return None
    return {n: min(r, math.ceil(factor * max(share, 0.0) * r)) for n, r in ranks.items()}


def least_important(importance: torch.Tensor, pool: torch.Tensor, count: int) -> torch.Tensor:
    """The ``count`` lowest-importance positions of ``pool`` (ties: lower position first), sorted ascending."""
    if count <= 0 or pool.numel() == 0:
        return pool[:0].clone()
    order = torch.argsort(importance[pool].float(), stable=True)  # (p,) ascending
    return pool[order[:count]].sort().values


def mass_selection(importance: Mapping[str, torch.Tensor], pools: Mapping[str, torch.Tensor], keep_fraction: float,
                   caps: Mapping[str, int] | None = None) -> dict[str, torch.Tensor]:
    """Per layer, the pool positions the mass rule prunes at ``keep_fraction`` (at most ``caps[n]`` of them)."""
    out = {}
    for n, pool in pools.items():
        kept = mass_rule_keep_count(importance[n][pool], keep_fraction) if pool.numel() else 0
        count = pool.numel() - kept
        if caps is not None:
            count = min(count, caps[n])
        out[n] = least_important(importance[n], pool, count)
    return out


def parameters_after(shapes: Mapping[str, LayerShape], pruned: Mapping[str, torch.Tensor], measure: str) -> int:
    """Total parameters of the layers once ``pruned`` is removed, in ``measure`` (stored or factor)."""
    return sum(s.cost(s.rank - pruned[n].numel(), measure) for n, s in shapes.items())


class _LayerOrder:
    """One layer's pool sorted once, so that a budget's bisection asks only for counts.

    ``ascending``: the pool's positions from the least important up (stable,
    as :func:`least_important` takes them); ``mass``: the running sum of the
    positive importance in descending order, and ``total`` its end, as
    :func:`bsi.method.scores.mass_rule_keep_count` computes them.
    """

    def __init__(self, importance: torch.Tensor, pool: torch.Tensor) -> None:
        values = importance[pool].float()  # (p,)
        self.pool = pool
        self.size = pool.numel()
        self.ascending = pool[torch.argsort(values, stable=True)]  # (p,)
        descending = values.sort(descending=True).values
        positive = descending.clamp(min=0)
        self.mass = torch.cumsum(positive, dim=0)  # (p,)
        self.total = positive.sum()
        self.positives = int((descending > 0).sum())

    def kept_by_mass(self, keep_fraction: float) -> int:
        """:func:`~bsi.method.scores.mass_rule_keep_count` of the pool, from the sorted sums (the same count)."""
        if self.size == 0:
            return 0
        if keep_fraction > 1:
            rest = self.size - self.positives
            return self.positives + math.ceil(min(keep_fraction - 1, 1.0) * rest - 1e-9)
        if self.total <= 0 or keep_fraction <= 0:
            return 0
        threshold = keep_fraction * self.total * (1 - 1e-6)
        return int(torch.searchsorted(self.mass, threshold.reshape(1)).item()) + 1

    def lowest(self, count: int) -> torch.Tensor:
        """:func:`least_important`: the ``count`` least important pool positions, ascending by position."""
        return self.ascending[: max(count, 0)].sort().values


def mass_to_budget(shapes: Mapping[str, LayerShape], importance: Mapping[str, torch.Tensor],
                   pools: Mapping[str, torch.Tensor], budget: int, measure: str,
                   caps: Mapping[str, int] | None = None) -> dict[str, torch.Tensor]:
    """Bisection on the shared keep fraction ``q`` in [0, 2] so the parameters land on ``budget``.

    ``q`` in (1, 2] keeps every positive basis and a share ``q - 1`` of the
    negative ones (see :func:`bsi.method.scores.mass_rule_keep_count`), so the
    family reaches from pruning every pool (q = 0) to pruning nothing (q = 2).
    The cut at each ``q`` is :func:`mass_selection`'s; each layer's pool is
    sorted once, so a step of the bisection only counts.
    """
    orders = {n: _LayerOrder(importance[n], pool) for n, pool in pools.items()}

    def removed_at(q: float) -> dict[str, int]:
        counts = {n: o.size - o.kept_by_mass(q) for n, o in orders.items()}
        return counts if caps is None else {n: min(c, caps[n]) for n, c in counts.items()}

    def params(counts: Mapping[str, int]) -> int:
        return sum(shapes[n].cost(shapes[n].rank - counts[n], measure) for n in counts)

    def at(counts: Mapping[str, int]) -> dict[str, torch.Tensor]:
        return {n: orders[n].lowest(c) for n, c in counts.items()}

    lo, hi = 0.0, 2.0
    if params(removed_at(hi)) <= budget:
        return at(removed_at(hi))
    if params(removed_at(lo)) >= budget:
        return at(removed_at(lo))
    for _ in range(40):  # invariant: params(lo) < budget <= params(hi)
        mid = (lo + hi) / 2
        if params(removed_at(mid)) < budget:
            lo = mid
        else:
            hi = mid
    best_lo, best_hi = removed_at(lo), removed_at(hi)
    gap_lo = abs(params(best_lo) - budget)
    gap_hi = abs(params(best_hi) - budget)
    return at(best_lo) if gap_lo <= gap_hi else at(best_hi)


def global_to_budget(shapes: Mapping[str, LayerShape], importance: Mapping[str, torch.Tensor],
                     pools: Mapping[str, torch.Tensor], budget: int, measure: str,
                     caps: Mapping[str, int] | None = None) -> dict[str, torch.Tensor]:
    """Prune the pool bases with the least importance per parameter, across all layers, until ``budget``.

    The candidates are ordered by ``importance / (in + out)`` ascending; a
    layer's candidates beyond its cap are skipped. The smallest prefix of that
    order that reaches the budget is pruned (or, if the budget lies between two
    prefixes, the one closer to it). The bisection over the prefix length
    counts each layer's removals (a ``bincount``); the positions are gathered
    once, for the prefix chosen.
    """
    names = list(pools)
    values, owners, positions = [], [], []
    for i, n in enumerate(names):
        pool = pools[n]
        if pool.numel() == 0:
            continue
        imp = importance[n][pool].float()  # (p,)
        order = torch.argsort(imp, stable=True)
        if caps is not None:
            order = order[: caps[n]]
        values.append(imp[order] / shapes[n].per_basis)
        owners.append(torch.full((order.numel(),), i, dtype=torch.long))
        positions.append(pool[order])
    if not values:
        return {n: pools[n][:0].clone() for n in names}
    value, owner, position = torch.cat(values), torch.cat(owners), torch.cat(positions)
    order = torch.argsort(value, stable=True)  # global, least valuable first
    owner, position = owner[order], position[order]
    full = [shapes[n].cost(shapes[n].rank, measure) for n in names]
    per_rank = {n: [shapes[n].cost(shapes[n].rank - c, measure) for c in range(shapes[n].rank + 1)]
                if pools[n].numel() else [] for n in names}

    def params(k: int) -> int:
        counts = torch.bincount(owner[:k], minlength=len(names)).tolist()
        return sum(per_rank[n][c] if c else full[i] for i, (n, c) in enumerate(zip(names, counts)))

    def at(k: int) -> dict[str, torch.Tensor]:
        return {n: position[:k][owner[:k] == i].sort().values for i, n in enumerate(names)}

    lo, hi = 0, owner.numel()  # params(at(k)) decreases with k
    if params(hi) >= budget:
        return at(hi)
    while hi - lo > 1:  # invariant: params(at(lo)) > budget >= params(at(hi))
        mid = (lo + hi) // 2
        if params(mid) > budget:
            lo = mid
        else:
            hi = mid
    gap_lo = abs(params(lo) - budget)
    gap_hi = abs(params(hi) - budget)
    return at(lo) if gap_lo < gap_hi else at(hi)


def select_to_budget(shapes: Mapping[str, LayerShape], importance: Mapping[str, torch.Tensor],
                     pools: Mapping[str, torch.Tensor], budget: int, measure: str, selection: str = "mass",
                     caps: Mapping[str, int] | None = None) -> dict[str, torch.Tensor]:
    """Which bases to prune so the layers land on ``budget`` (``selection``: ``mass`` or ``global``).

    If the caps make the budget unreachable they are doubled until it is (or
    dropped): the size target wins over the even spread.
    """
    choose = global_to_budget if selection == "global" else mass_to_budget
    while True:
        pruned = choose(shapes, importance, pools, budget, measure, caps)
        if caps is None or parameters_after(shapes, pruned, measure) <= budget:
            return pruned
        if all(caps[n] >= pools[n].numel() for n in pools):
            return pruned
        caps = {n: min(pools[n].numel(), max(1, 2 * c)) for n, c in caps.items()}


def widen_pools(rho: float, pool_at: Callable[[float], Mapping[str, torch.Tensor]], shapes: Mapping[str, LayerShape],
                budget: int, measure: str, margin: float = 1.5) -> float:
    """The largest ``rho`` <= the given one whose pools, pruned entirely, could reach ``budget`` with ``margin``.

    ``pool_at(rho) -> {name: positions}`` gives the pools at a rho. Returns
    ``rho`` itself when its pools are already large enough.
    """
    now = sum(s.cost(s.rank, measure) for s in shapes.values())
    need = now - budget

    def reach(r: float) -> int:
        pools = pool_at(r)
        return now - parameters_after(shapes, pools, measure)

    if need <= 0 or reach(rho) >= margin * need:
        return rho
    lo, hi = 0.0, rho
    for _ in range(30):
        mid = (lo + hi) / 2
        if reach(mid) >= margin * need:
            lo = mid
        else:
            hi = mid
    return lo


def smallest_within(pruned: Mapping[str, torch.Tensor], magnitude: Mapping[str, torch.Tensor],
                    pools: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Keep each layer's number of removals, but remove its pool's smallest ``magnitude`` instead.

    A selection answers two questions at once: how many bases each layer
    loses (the budget's split across layers) and which ones inside the layer.
    This keeps the first answer of ``pruned`` and replaces the second by
    magnitude (``within_layer="magnitude"``), so the two can be judged apart
    (:mod:`bsi.analysis.ranking`).

    Args:
        pruned: per layer, the positions a selection removes (their count is kept).
        magnitude: per layer, (r,) the values ranked inside it (e.g. ``|sigma|``).
        pools: per layer, (p,) the candidate positions.
    """
    return {n: least_important(magnitude[n], pools[n], pruned[n].numel()) for n in pruned}


def even_share(before: Sequence[int] | int, after: int) -> float:
    """The share ``1 - after / before`` a round must remove (0 when nothing is to go)."""
    before_total = sum(before) if not isinstance(before, int) else before
    return max(0.0, 1.0 - after / max(before_total, 1))
