"""Is the ranking right? Predicted against measured loss changes of removing bases, apart from recovery.

A score predicts how much the task loss rises when a basis goes. Whether a
method wins after recovery mixes two things: which bases it removes and how
well the remaining model re-learns. This module measures the first alone,
on the model of a real run at the end of a round (the engine's
``before_cut`` hook, :class:`~bsi.method.engine.Compressor`), with the loss on
held-out problems, no training in between:

* **single bases**: remove one candidate at a time; the measured loss change
  against each ranking's prediction (Spearman's rank correlation);
* **the k lowest of a layer**: remove a layer's k lowest-ranked candidates
  under each ranking; the measured loss change;
* **whole cuts**: remove the round's whole budget. A cut answers two
  questions, how many bases each layer loses and which ones inside each
  layer; the cuts below cross the answers of ``bsi`` and of magnitude
  (basel's ``|sigma|``), so that each can be judged apart.

The rankings: ``bsi`` (the run's importance, first-order terms tested against
their noise, plus the curvature term), ``bsi-grad`` (the untested first-order
term ``-sigma g``), ``magnitude`` (``|sigma|``) and ``random``. A removal is
``sigma_i = 0`` (exactly what a cut computes before the columns are dropped),
undone after each measurement, so the model is left as it was found.

Why a joint cut can disagree with the single-basis ranking: the score adds
single-basis estimates. Removing many bases of one layer changes that layer's
output by the sum of their contributions, and the loss responds to the sum
(and to its interaction with other layers' changes), not to the sum of the
separate responses; the second-order term sees each basis alone (the diagonal
of the Hessian), never the pairs.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from bsi.method.layers import BasisLinear
from bsi.method.schedule import least_important, smallest_within

RANKINGS = ("bsi", "bsi-grad", "magnitude", "random")


@contextmanager
def removed(layers: Mapping[str, BasisLinear], positions: Mapping[str, torch.Tensor]) -> Iterator[None]:
    """Inside the block, the bases at ``positions`` (per layer) have sigma 0; afterwards sigma is as before."""
    saved = {n: layers[n].sigma.detach().clone() for n in positions if positions[n].numel()}
    try:
        with torch.no_grad():
            for n in saved:
                layers[n].sigma[positions[n].to(layers[n].sigma.device)] = 0.0
        yield
    finally:
        with torch.no_grad():
            for n, values in saved.items():
                layers[n].sigma.copy_(values)


def rankings(layer: Any, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Each ranking's predicted value of every basis of one layer, (r,) float32 CPU; low = removed first.

    ``layer`` has the layer's ``sigma``, ``importance`` and ``grad`` (None
    when not measured): a :class:`bsi.method.engine.LayerScores` of a run
    whose score reads the gradient (``bsi`` for all four), or a recorded
    :class:`bsi.reports.LayerRound`.
    """
    sigma = layer.sigma.float().cpu()
    out = {"bsi": layer.importance.float().cpu(), "magnitude": sigma.abs(),
           "random": torch.rand(sigma.numel(), generator=generator)}
    if layer.grad is not None:
        out["bsi-grad"] = -sigma * layer.grad.float().cpu()
    return out


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman's rank correlation of two (n,) vectors (ties broken by position)."""
    if a.numel() < 2:
        return float("nan")
    ra = torch.argsort(torch.argsort(a.double())).double()
    rb = torch.argsort(torch.argsort(b.double())).double()
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra * rb).sum() / (ra.norm() * rb.norm()))


def spread_sample(order: torch.Tensor, count: int) -> torch.Tensor:
    """``count`` positions taken evenly along ``order`` (lowest to highest), so every part of a ranking is measured."""
    if order.numel() <= count:
        return order.clone()
    picks = torch.linspace(0, order.numel() - 1, count).round().long()
    return order[picks]


def single_removals(layers: Mapping[str, BasisLinear], name: str, positions: Sequence[int],
                    loss: Callable[[], float], base: float) -> Iterator[tuple[int, float]]:
    """For each position of layer ``name``: ``(position, measured loss change)`` of removing that basis alone."""
    for position in positions:
        with removed(layers, {name: torch.tensor([int(position)])}):
            yield int(position), loss() - base


def measure_round(layers: Mapping[str, BasisLinear], scores: Any, select: Callable, pruned: Mapping[str, torch.Tensor],
                  loss: Callable[[], float], *, probe_layers: Sequence[str], singles: int = 16,
                  shares: Sequence[float] = (0.1, 0.25, 0.5), seed: int = 0) -> dict[str, Any]:
    """Every measurement of the module docstring for one round; plain JSON values.

    Args:
        layers: the run's layers in Basel form (``compressor.layers``).
        scores: the round's :class:`~bsi.method.engine.RoundScores`.
        select: ``select(scores, importance=..., rule=...)`` -> a cut of the round's size
            (:meth:`bsi.method.engine.Compressor.select`).
        pruned: the cut the run makes.
        loss: the held-out loss of the model as it is (no gradient); called first for the model with every
            basis and last once per cut, in the order of the result's ``cuts``.
        probe_layers: layers whose candidates are measured one by one and k at a time.
        singles: candidates measured one by one per probed layer, spread along the bsi ranking.
        shares: the k of "the k lowest", as shares of the layer's pool.
    """
    generator = torch.Generator().manual_seed(seed)
    base = loss()
    pools = scores.pools
    ranked = {n: rankings(scores.layers[n], generator) for n in scores.layers}
    out: dict[str, Any] = {"loss": base, "layers": {}, "cuts": {}}
    for name in probe_layers:
        pool = pools[name]
        if pool.numel() == 0:
            continue
        values = ranked[name]
        order = pool[torch.argsort(values["bsi"][pool], stable=True)]
        chosen = spread_sample(order, singles)
        measured = [delta for _, delta in single_removals(layers, name, chosen.tolist(), loss, base)]
        measured_t = torch.tensor(measured)
        entry: dict[str, Any] = {"pool": int(pool.numel()), "rank": int(layers[name].rank),
                                 "positions": chosen.tolist(), "measured": measured,
                                 "predicted": {r: v[chosen].tolist() for r, v in values.items()},
                                 "spearman": {r: spearman(v[chosen], measured_t) for r, v in values.items()},
                                 "k_lowest": {}}
        for share in shares:
            k = max(1, round(share * pool.numel()))
            row = {}
            for r, v in values.items():
                with removed(layers, {name: least_important(v, pool, k)}):
                    row[r] = loss() - base
            entry["k_lowest"][f"{share:g}"] = {"k": k, **row}
        out["layers"][name] = entry
    sigma = {n: scores.layers[n].sigma.abs().cpu() for n in scores.layers}
    magnitude_cut = select(scores, importance=sigma, rule="mass")  # basel's rule on these layers
    cuts = {
        "bsi": pruned,
        "magnitude": magnitude_cut,
        "bsi budgets, magnitude inside": smallest_within(pruned, sigma, pools),
        "magnitude budgets, bsi inside": smallest_within(magnitude_cut, scores.importance, pools),
        "bsi budgets, random inside": smallest_within(pruned, {n: v["random"] for n, v in ranked.items()}, pools),
    }
    if all("bsi-grad" in v for v in ranked.values()):
        cuts["bsi-grad"] = select(scores, importance={n: v["bsi-grad"] for n, v in ranked.items()}, rule="global")
    for label, cut in cuts.items():
        with removed(layers, cut):
            out["cuts"][label] = {"loss": loss(), "removed": int(sum(p.numel() for p in cut.values()))}
    return out


class RoundSnapshots:
    """The model of every past round, before its cut, rebuilt on demand from one copy and a little per round.

    Pruning only removes bases and changes the trainable coefficients and
    auxiliary vectors; everything else stays as converted. So one copy of
    the model at its first round (every basis) plus, per round, each layer's
    surviving basis ids, sigma and auxiliary vectors is enough to rebuild the
    model any round scored (:meth:`model_at`): the dashboard's Inspect tab
    measures a past round's candidates this way. Use :meth:`capture` as the
    engine's ``before_cut`` hook.
    """

    def __init__(self) -> None:
        self.base: torch.nn.Module | None = None
        self.rounds: dict[int, dict[str, dict[str, torch.Tensor]]] = {}

    def capture(self, compressor: Any, scores: Any = None, pruned: Any = None) -> None:
        """Record the model as it is now (before this round's cut)."""
        if self.base is None:
            self.base = copy.deepcopy(compressor.model).cpu()
        self.rounds[compressor.round_index] = {
            name: {key: getattr(layer, key).detach().cpu().clone() for key in ("basis_ids", "sigma", "aux_u", "aux_v")}
            for name, layer in compressor.layers.items()}

    def model_at(self, round_index: int) -> torch.nn.Module:
        """A new model equal to the run's at the end of round ``round_index``, before its cut (CPU, eval mode)."""
        if self.base is None or round_index not in self.rounds:
            raise KeyError(f"round {round_index} was not recorded")
        from bsi.method.surgery import basis_layers

        model = copy.deepcopy(self.base)
        for name, layer in basis_layers(model).items():
            saved = self.rounds[round_index][name]
            where = {int(b): i for i, b in enumerate(layer.basis_ids.tolist())}
            layer.keep(torch.tensor([where[int(b)] for b in saved["basis_ids"].tolist()], dtype=torch.long))
            for key in ("sigma", "aux_u", "aux_v"):
                getattr(layer, key).data = saved[key].to(getattr(layer, key).dtype)
        return model.eval()
