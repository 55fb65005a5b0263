"""What if the whole model were cut at once? A size rule over one round's scores, and what that cut measures.

A run scores every basis at the end of each round and then removes a
round's worth of them. The scores are predictions: basis ``i``'s importance
``I_i`` is the rise in task loss its removal is predicted to cause. So one
round's scores already answer, for *any* size, which bases a cut of that size
would take and what it is predicted to cost. This module asks that question
for the whole model at once, in two parts kept apart on purpose:

* **the rule** (instant, a pure function of the scores, :func:`plan_cut`):
  a size (the paper's KeepRatio mass rule, or a target share of the
  compressible layers), a ranking (bsi's importance, ``|sigma|``, the
  gradient term alone, or random) and a selection (across layers or one
  keep fraction per layer) give the bases removed, every layer's kept rank,
  the parameters, and the predicted loss rise, the sum of the removed
  bases' importance;
* **the measurement** (seconds, :mod:`bsi.pipeline.whatif`, which measures
  models as the run does): the same bases removed from the round's model
  (``sigma_i = 0``, undone afterwards), its answer-token loss on held-out
  problems and a few greedy answers.

Every ranking is compared at *the same size*: the rule sets the budget in
stored parameters (KeepRatio through bsi's own scores, or the target), and
the chosen ranking fills it (:func:`plan_cut`). So a difference between
rankings is which bases go, not how many.

A one-shot cut is not what a run does. The run removes a little per round,
tunes the coefficients in between and scores again, protects each layer's
largest bases (the candidate pool) and caps each round's share. The run's own
model after each cut (:func:`path_cut`) is the reference a one-shot cut is
set against, at the same size: what the rounds buy.

Which bases a round scored: with the Fisher curvature (bsi's default) every
basis (the round's ``curvature_scope`` is ``"all"``); with Hutchinson's
probes only the candidate pool, so a cut from such a round may take only
pool bases (:attr:`WhatIfLayer.candidates`), and :func:`largest_cut` says how
far that reaches. Scores that read no curvature (basel, bsi-grad) cover every
basis.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from bsi.errors import BSIError
from bsi.method.schedule import LayerShape, mass_selection, parameters_after, select_to_budget
from bsi.reports import RoundReport

#: The rankings a cut can be filled by: ``bsi`` (the run's importance, the predicted loss rise), ``magnitude``
#: (``|sigma|``, what basel keeps), ``gradient`` (the first-order term ``-sigma g`` alone, untested: what
#: ``bsi-grad`` ranks by) and ``random``.
RANK_BY = ("bsi", "magnitude", "gradient", "random")
RANK_LABELS = {"bsi": "bsi (importance)", "magnitude": "|sigma|", "gradient": "gradient term only", "random": "random"}
#: ``keep``: the paper's KeepRatio mass rule, once (each layer keeps the most important bases holding KeepRatio of
#: its positive importance); ``target``: the compressible layers at a share of their dense size.
RULES = ("keep", "target")
#: ``auto``: across layers for the loss-unit rankings (bsi, gradient), one keep fraction per layer for the others
#: (the engine's ``selection auto``); ``global``: least value per parameter across all layers; ``per-layer``: one
#: keep fraction shared by every layer (the mass rule to a budget, the engine's ``mass``).
SELECTIONS = ("auto", "global", "per-layer")
LOSS_UNITS = ("bsi", "gradient")


@dataclass(frozen=True)
class WhatIfLayer:
    """One layer's scores at the end of a round: what a cut of the whole model reads.

    All vectors are indexed by the layer's active bases at the start of the
    round (``rank`` of them), as in :class:`~bsi.reports.LayerRound`.
    """

    name: str
    shape: LayerShape
    sigma: torch.Tensor  # (r,) the coefficients as tuned
    importance: torch.Tensor  # (r,) predicted loss rise of removing each basis alone
    gradient: torch.Tensor | None  # (r,) -sigma * g, untested; None when the round measured no gradient
    candidates: torch.Tensor  # (c,) int64 positions a cut may take: every basis, or the pool where only it was scored

    @property
    def rank(self) -> int:
        return self.shape.rank


@dataclass(frozen=True)
class WhatIfScores:
    """A round's scores for the whole model, and the sizes a cut is measured against.

    ``other_parameters``: the parameters no cut touches (embeddings, norms);
    ``compressible_before``: the compressible layers as dense matrices before
    compression, what a target share is a share of.
    """

    round: int
    layers: dict[str, WhatIfLayer]
    compressible_before: int
    other_parameters: int
    scope: str  # "all": every basis was scored; "pool": only the candidate pools (see the module docstring)

    @classmethod
    def from_round(cls, report: RoundReport) -> WhatIfScores:
        """The scores a :class:`~bsi.reports.RoundReport` recorded (a live run's or a saved run's).

        Raises:
            BSIError: the records predate the layers' geometry (runs recorded before 2026-11-28).
        """
        scored_everywhere = report.curvature_scope == "all" or all(layer.hessian is None for layer in report.layers)
        layers = {}
        for layer in report.layers:
            if not layer.in_features or not layer.out_features:
                raise BSIError(f"round {report.round}'s records hold no layer shapes (a run recorded before "
                               "2026-11-28): run it again to plan a cut from its scores")
            gradient = -layer.sigma.float() * layer.grad.float() if layer.grad is not None else None
            candidates = torch.arange(layer.rank_before) if scored_everywhere else layer.pool.clone()
            shape = LayerShape(layer.in_features, layer.out_features, layer.rank_before, layer.aux_rank, layer.bias)
            layers[layer.name] = WhatIfLayer(layer.name, shape, layer.sigma.float(), layer.importance.float(),
                                             gradient, candidates)
        return cls(report.round, layers, report.compressible_before,
                   report.params_total - report.params_compressible, "all" if scored_everywhere else "pool")

    @property
    def shapes(self) -> dict[str, LayerShape]:
        return {n: layer.shape for n, layer in self.layers.items()}

    @property
    def parameters_now(self) -> int:
        """Stored parameters of the compressible layers with every basis of this round (before any cut)."""
        return parameters_after(self.shapes, {n: layer.candidates[:0] for n, layer in self.layers.items()}, "stored")

    @property
    def parameters_before(self) -> int:
        """The whole model's parameters before compression."""
        return self.other_parameters + self.compressible_before


@dataclass(frozen=True)
class WhatIfCut:
    """The bases a whole-model cut removes, and what the rule alone says of it (no model needed)."""

    rule: str  # "keep" or "target"
    value: float  # the KeepRatio or the target share
    rank_by: str
    selection: str  # the selection in force ("global" or "per-layer"; "mass rule" for keep with bsi)
    pruned: dict[str, torch.Tensor]  # per layer: (q,) int64 positions removed, ascending
    kept: dict[str, int]  # per layer: bases kept
    ranks: dict[str, int]  # per layer: bases before the cut
    params_compressible: int  # stored parameters of the compressible layers after the cut
    compressible_before: int
    params_total: int  # the whole model after the cut
    params_before: int  # the whole model before compression
    predicted: float  # the predicted loss rise: the sum of the removed bases' importance (bsi's scores)
    removed: int  # bases removed
    notes: tuple[str, ...] = ()  # what the reader should know (a size the candidates could not reach, ...)

    @property
    def compressible_ratio(self) -> float:
        """Compressible layers after / before (dense), as the run's target counts it."""
        return self.params_compressible / max(self.compressible_before, 1)

    @property
    def compression(self) -> float:
        """How many times smaller the whole model is than before compression."""
        return self.params_before / max(self.params_total, 1)

    def summary(self) -> dict[str, Any]:
        """Plain numbers for a table or a JSON file."""
        return {"rule": self.rule, "value": self.value, "rank_by": self.rank_by, "selection": self.selection,
                "params_total": self.params_total, "params_compressible": self.params_compressible,
                "compressible_ratio": self.compressible_ratio, "compression": self.compression,
                "predicted": self.predicted, "removed": self.removed}


def ranking_values(scores: WhatIfScores, rank_by: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """Each layer's (r,) values under one ranking of :data:`RANK_BY`; low values go first.

    ``random`` draws uniform values from a generator seeded ``seed`` (the same
    seed, the same draw). ``gradient`` needs a round that measured the
    gradient.
    """
    if rank_by == "bsi":
        return {n: layer.importance for n, layer in scores.layers.items()}
    if rank_by == "magnitude":
        return {n: layer.sigma.abs() for n, layer in scores.layers.items()}
    if rank_by == "gradient":
        missing = [n for n, layer in scores.layers.items() if layer.gradient is None]
        if missing:
            raise BSIError(f"round {scores.round} measured no gradient (its score reads none): rank by bsi, "
                           "magnitude or random")
        return {n: layer.gradient for n, layer in scores.layers.items() if layer.gradient is not None}
    if rank_by == "random":
        generator = torch.Generator().manual_seed(seed)
        return {n: torch.rand(layer.rank, generator=generator) for n, layer in scores.layers.items()}
    raise BSIError(f"unknown ranking '{rank_by}': use one of {', '.join(RANK_BY)}")


def selection_in_force(selection: str, rank_by: str) -> str:
    """``auto`` resolved as the engine resolves it: ``global`` for loss-unit rankings, else ``per-layer``."""
    if selection not in SELECTIONS:
        raise BSIError(f"unknown selection '{selection}': use one of {', '.join(SELECTIONS)}")
    if selection != "auto":
        return selection
    return "global" if rank_by in LOSS_UNITS else "per-layer"


def check_rule(rule: str, value: float) -> None:
    """A one-line error for a rule or a value out of range (before anything is computed)."""
    if rule not in RULES:
        raise BSIError(f"unknown size rule '{rule}': use keep (the paper's KeepRatio) or target (a share of the "
                       "compressible layers)")
    if not 0 < value <= 1:
        what = "KeepRatio" if rule == "keep" else "the target share of the compressible layers"
        raise BSIError(f"{what} must be in (0, 1], got {value:g}")


def plan_cut(scores: WhatIfScores, rule: str, value: float, rank_by: str = "bsi", selection: str = "auto",
             seed: int = 0) -> WhatIfCut:
    """The bases a one-shot cut of the whole model removes, and what the rule predicts of it (pure, milliseconds).

    The size comes from the rule: ``keep`` applies the paper's mass rule once
    to bsi's importance, each layer keeping the most important bases that
    hold ``value`` of its positive importance (bases of negative importance
    always go); ``target`` asks for the compressible layers at ``value`` of
    their dense size (stored parameters: a layer above break-even rank stays
    dense). The ranking then fills that size: bsi's own cut for ``bsi`` with
    ``keep``; otherwise :func:`~bsi.method.schedule.select_to_budget` with the
    ranking's values and the selection in force (:func:`selection_in_force`).
    Only a layer's :attr:`~WhatIfLayer.candidates` can go.

    Args:
        scores: one round's scores (:meth:`WhatIfScores.from_round`).
        rule: ``keep`` or ``target``.
        value: KeepRatio, or the target share, in (0, 1].
        rank_by: one of :data:`RANK_BY`.
        selection: one of :data:`SELECTIONS`.
        seed: the ``random`` ranking's draw.
    """
    check_rule(rule, value)
    values = ranking_values(scores, rank_by, seed)
    in_force = selection_in_force(selection, rank_by)
    shapes = scores.shapes
    candidates = {n: layer.candidates for n, layer in scores.layers.items()}
    importance = {n: layer.importance for n, layer in scores.layers.items()}
    notes: list[str] = []
    if rule == "keep":
        by_rule = mass_selection(importance, candidates, value)  # bsi's cut: the rule's own size
        budget = parameters_after(shapes, by_rule, "stored")
    else:
        budget = round(value * scores.compressible_before)
    if rule == "keep" and rank_by == "bsi":
        pruned, in_force = by_rule, "mass rule, each layer"
    else:
        pruned = select_to_budget(shapes, values, candidates, budget, "stored",
                                  "global" if in_force == "global" else "mass")
    params = parameters_after(shapes, pruned, "stored")
    if params > budget * 1.001 + 1:
        notes.append(f"the candidates reach {params / max(scores.compressible_before, 1):.1%} of the compressible "
                     f"layers at most, not {budget / max(scores.compressible_before, 1):.1%}"
                     + (": this round scored its candidate pools only (Hutchinson)" if scores.scope == "pool" else ""))
    predicted = float(sum(importance[n][p].double().sum() for n, p in pruned.items() if p.numel()))
    return WhatIfCut(
        rule=rule, value=value, rank_by=rank_by, selection=in_force, pruned=pruned,
        kept={n: shapes[n].rank - p.numel() for n, p in pruned.items()}, ranks={n: s.rank for n, s in shapes.items()},
        params_compressible=params, compressible_before=scores.compressible_before,
        params_total=scores.other_parameters + params, params_before=scores.parameters_before,
        predicted=predicted, removed=sum(p.numel() for p in pruned.values()), notes=tuple(notes))


def largest_cut(scores: WhatIfScores) -> float:
    """The smallest share of the compressible layers any cut from these scores can reach (every candidate removed)."""
    everything = {n: layer.candidates for n, layer in scores.layers.items()}
    return parameters_after(scores.shapes, everything, "stored") / max(scores.compressible_before, 1)


def path_cut(report: RoundReport) -> dict[str, torch.Tensor]:
    """The cut the run itself made at the end of ``report``'s round, per layer (positions, as a plan's)."""
    return {layer.name: layer.pruned for layer in report.layers}


def path_predicted(rounds: Sequence[RoundReport], upto: int) -> float:
    """The run's own predicted loss rise up to round ``upto``: each round's removed importance, summed over rounds."""
    return float(sum(layer.importance[layer.pruned].double().sum() for report in rounds if report.round <= upto
                     for layer in report.layers if layer.pruned.numel()))
