"""The settings of a comparison study (``bsi sweep``): methods, sizes, seeds, protocols, and its presets."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from bsi.config.fields import PROTOCOL_NAMES, JsonConfig, check, is_integer, is_number, option
from bsi.config.methods import METHOD_NAMES, VARIANT_NAMES, is_engine_method


@dataclass
class SweepConfig(JsonConfig):
    """A comparison study: which methods, sizes, seeds and protocols, and how recovery is budgeted.

    Every method gets the same recovery steps (the ``recover`` section of the
    pipeline configuration). With an ``lr_grid``, each method's recovery
    learning rate is chosen from it by the answer-token loss on a validation
    set carved from the *training* data (``validation_size`` of the pipeline
    configuration; never the test problems) at each of ``lr_targets`` (every
    target when empty), by the first seed that runs there; every other target
    and every later seed (in the same command or a later one on the same
    folder) uses the choice made at the nearest of them (in log size). Choices and
    their validation losses are recorded in the results. On a text task the
    validation set is the last ``validation_size`` windows of the training
    part (never the held-out part) and its loss the mean next-token loss.

    ``also_unrecovered`` adds, for every method and size, the model as the
    method left it, before any recovery (rows with ``recover_steps`` 0): one
    sweep then shows every method with no training after compression and
    with the same recovery budget.
    """

    methods: tuple[str, ...] = option(METHOD_NAMES, "methods compared; a named variant ("
                                                    + ", ".join(VARIANT_NAMES) + ") runs only when named")
    targets: tuple[float, ...] = option((0.6, 0.4, 0.25), "target ratios of the compressible layers' parameters, "
                                                          "for every method")
    extra_targets: dict[str, Any] = option(default_factory=dict, help="more targets for some methods only, e.g. "
                                                            "bsi:0.02,basel:0.02 ({\"bsi\": [0.02], ...} in JSON)")
    seeds: tuple[int, ...] = option((0,), "run seeds: each its own splits, fine-tune, batches and probes")
    protocols: tuple[str, ...] = option(("tuned",), "protocols of the engine methods (see PROTOCOLS)")
    protocol_settings: dict[str, Any] = option(default_factory=dict, help="per protocol, pipeline settings its engine runs "
                                                                "need on top (e.g. a longer schedule for paper)")
    protocol_targets: dict[str, Any] = option(default_factory=dict, help="per protocol, the only targets its engine methods "
                                                               "run at, e.g. paper:0.6,paper:0.4 (none: every target; "
                                                               "a preset's keep the targets still given)")
    lr_grid: tuple[float, ...] = option((), "recovery learning rates to choose from by validation loss, which "
                                            "needs validation_size (--validation-size) (none: the recover "
                                            "section's lr for every method)")
    lr_targets: tuple[float, ...] = option((), "targets where the learning rate is chosen, by the first seed run "
                                               "(none: every target; a preset's follow narrowed --targets to "
                                               "the nearest)")
    match_training: str = option("", "an engine method (e.g. bsi) whose training every truncation is given: a "
                                     "truncation recovers for that method's own steps up to the size (its row of the "
                                     "same seed and size, first protocol, run first) plus the common recovery (empty: "
                                     "the same recovery for every method, and the engine methods train more)")
    baseline: dict[str, Any] = option(default_factory=dict, help="settings of the truncation baselines (BaselineConfig "
                                                       "fields; the defaults are the published methods)")
    budgets: tuple[int, ...] = option((), "total optimizer steps after the task fine-tune, one model per budget and "
                                          "size (a budget curve): an engine method recovers for a budget less its "
                                          "own tuning steps up to the size, a truncation for the whole budget, and "
                                          "the fine-tuned dense model is trained for each budget too (none: every "
                                          "method recovers for the recover section's steps)")
    budget_targets: tuple[float, ...] = option((), "with budgets: the sizes evaluated at every budget; the engine "
                                                   "methods still pass every target on their path, so it is the path "
                                                   "of the same sweep without budgets (none: every target)")
    also_unrecovered: bool = option(False, "also evaluate every method's model of every size before recovery: extra "
                                           "rows with recover_steps 0, in a table of their own (the truncation "
                                           "baselines are usually published without training)")
    speed_repeats: int = option(0, "decode-speed timings per model against the dense one (0: none)")
    speed_tokens: int = option(32, "new tokens per speed timing")

    def __post_init__(self) -> None:
        self.methods = tuple(self.methods)
        self.targets = tuple(float(t) for t in self.targets)
        self.seeds = tuple(int(x) for x in self.seeds)
        self.protocols = tuple(self.protocols)
        self.lr_grid = tuple(float(x) for x in self.lr_grid)
        self.lr_targets = tuple(float(x) for x in self.lr_targets)
        self.extra_targets = {m: tuple(float(t) for t in ts) for m, ts in dict(self.extra_targets).items()}
        self.protocol_targets = {p: tuple(float(t) for t in ts) for p, ts in dict(self.protocol_targets).items()}
        check(all(is_integer(b) and b > 0 for b in self.budgets), f"budgets must be positive integers, got "
                                                                    f"{list(self.budgets)}")
        self.budgets = tuple(sorted({int(b) for b in self.budgets}))
        self.budget_targets = tuple(sorted({float(t) for t in self.budget_targets}, reverse=True))
        known = (*METHOD_NAMES, *VARIANT_NAMES)
        check(bool(self.methods), f"name at least one method: {', '.join(known)}")
        for name in self.methods:
            check(name in known, f"methods must be among {', '.join(known)}, got '{name}'")
        for name in self.extra_targets:
            check(name in known, f"extra_targets must name methods among {', '.join(known)}, got '{name}'")
        check(len(set(self.methods)) == len(self.methods), f"methods has duplicates: {', '.join(self.methods)}")
        check(bool(self.targets), "name at least one target")
        for t in (*self.targets, *(t for ts in self.extra_targets.values() for t in ts), *self.lr_targets):
            check(is_number(t) and 0 < t <= 1, f"targets must be numbers in (0, 1], got {t}")
        check(len(set(self.targets)) == len(self.targets), f"targets has duplicates: {list(self.targets)}")
        check(bool(self.seeds) and len(set(self.seeds)) == len(self.seeds),
               f"seeds must be distinct integers, got {list(self.seeds)}")
        check(bool(self.protocols), "name at least one protocol")
        for name, ts in self.protocol_targets.items():
            check(bool(ts) and all(t in self.targets for t in ts),
                   f"protocol_targets of {name} must be among the targets {list(self.targets)}, got {list(ts)}")
        for name in (*self.protocols, *self.protocol_settings, *self.protocol_targets):
            check(name in PROTOCOL_NAMES, f"protocols must be among {', '.join(PROTOCOL_NAMES)}, got '{name}'")
        check(all(is_number(x) and x > 0 for x in self.lr_grid), f"lr_grid must be positive numbers, got {self.lr_grid}")
        check(all(t in self.targets for t in self.lr_targets),
               f"lr_targets must be among the targets {list(self.targets)}, got {list(self.lr_targets)}")
        if self.match_training:
            check(is_engine_method(self.match_training) and self.match_training in self.methods,
                  f"match_training must name an engine method among the methods ({', '.join(self.methods)}), "
                  f"got '{self.match_training}'")
        if self.budget_targets:
            check(bool(self.budgets), "budget_targets chooses the sizes of a budget curve: give --budgets too, or "
                                      "leave --budget-targets out")
            check(all(t in self.targets for t in self.budget_targets),
                  f"budget_targets must be among the targets {list(self.targets)}, got {list(self.budget_targets)}")
        if self.budgets:
            check(not self.lr_grid, "budgets train every model once, at the recover section's learning rate: pass "
                                    "--lr-grid none (and --recover-lr R), or leave --budgets out")
            check(not self.match_training, "budgets already give every method the same total training: leave "
                                           "--match-training out")
            check(not self.also_unrecovered, "budgets name each model's whole training: leave --also-unrecovered "
                                             "out (a budget equal to a method's own tuning steps is its "
                                             "unrecovered model)")
        check(isinstance(self.also_unrecovered, bool),
               f"also_unrecovered must be true or false, got {self.also_unrecovered}")
        check(is_integer(self.speed_repeats) and self.speed_repeats >= 0, f"speed_repeats must be >= 0, got {self.speed_repeats}")
        check(is_integer(self.speed_tokens) and self.speed_tokens >= 2, f"speed_tokens must be >= 2, got {self.speed_tokens}")

    def targets_of(self, method: str, protocol: str | None = None) -> tuple[float, ...]:
        """The sizes ``method`` is run at (under ``protocol``, for an engine method), largest first."""
        if is_engine_method(method) and protocol in self.protocol_targets:
            return tuple(sorted(self.protocol_targets[protocol], reverse=True))
        return tuple(sorted({*self.targets, *self.extra_targets.get(method, ())}, reverse=True))

    def evaluated_targets_of(self, method: str, protocol: str | None = None) -> tuple[float, ...]:
        """The sizes ``method`` is evaluated at: :meth:`targets_of`, narrowed to ``budget_targets`` when given."""
        targets = self.targets_of(method, protocol)
        return tuple(t for t in targets if t in self.budget_targets) if self.budget_targets else targets

    def lr_target_for(self, target: float) -> float:
        """The target whose learning-rate choice ``target`` uses: itself when chosen there, else the nearest in log size."""
        chosen = self.lr_targets or self.targets
        if target in chosen:
            return target
        return min(chosen, key=lambda t: (abs(math.log(t / target)), -t))


#: What ``bsi sweep --preset NAME`` sets beyond the pipeline preset (fields of :class:`SweepConfig`).
SWEEP_PRESETS: dict[str, dict[str, Any]] = {
    "sweep-cpu": {"targets": (0.6, 0.4, 0.25)},
    # The published engine settings collapse on this model already at 0.6 with a CPU-sized schedule (their
    # schedule search and its cost: docs/benchmarks.md), so the study runs them at the three mildest sizes.
    "study": {"targets": (0.6, 0.4, 0.25, 0.15, 0.1, 0.05), "extra_targets": {"bsi": (0.02,), "basel": (0.02,)},
              "seeds": (0, 1, 2), "protocols": ("tuned", "paper"), "protocol_targets": {"paper": (0.6, 0.4, 0.25),
              "paper-whitened": (0.6, 0.4, 0.25), "paper-layer-probes": (0.6, 0.4, 0.25)},
              "lr_grid": (2e-5, 1e-4, 5e-4), "lr_targets": (0.4, 0.1)},
    # Learning rates chosen at two sizes: bsi's choice at 0.15 (5e-4) used at 0.4 left it at 10.7% against basel's
    # 37% there; a mild cut wants a smaller rate than a deep one (docs/benchmarks.md, 2026-11-25).
    # Only the methods the study can tell apart: plain `svd`, `fwsvd` and `asvd` answer at most 10.5% at any size on
    # every seed of `study` (docs/benchmarks.md), and `asvd`'s sensitivity search alone took 18 of the seven-method
    # study-quick's 80 minutes on 2 cores (2026-11-25); without the three it takes 43 min 4 s with an empty cache,
    # fine-tune included (2026-11-26; `--methods` adds them back).
    "study-quick": {"methods": ("bsi", "basel", "svd-llm", "bsi-grad"),
                    "targets": (0.4, 0.15, 0.05), "extra_targets": {"bsi": (0.02,), "basel": (0.02,)},
                    "seeds": (0,), "protocols": ("tuned",), "lr_grid": (2e-5, 1e-4, 5e-4), "lr_targets": (0.4, 0.15)},
    "text": {"targets": (0.8, 0.6, 0.4), "also_unrecovered": True},  # every method (the default)
}


def make_sweep_config(preset: str | None, overrides: dict[str, Any] | None = None) -> SweepConfig:
    """The :class:`SweepConfig` of a preset (:data:`SWEEP_PRESETS`; the defaults where it has none) with overrides.

    The overrides are what the user asked for; the preset's settings that
    depend on them follow them (:func:`narrow_to_overrides`) instead of
    refusing a setting the user never gave.
    """
    overrides = dict(overrides or {})
    settings = {**SWEEP_PRESETS.get(preset or "", {}), **overrides}
    return SweepConfig.from_dict(narrow_to_overrides(settings, overrides))


def _nearest_in_log(value: float, among: tuple[float, ...]) -> float:
    return min(among, key=lambda t: (abs(math.log(t / value)), -t))


def narrow_to_overrides(settings: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """A preset's dependent settings narrowed to the targets and protocols the user gave.

    A preset names its targets, protocols, the targets each protocol runs at
    (``protocol_targets``) and where the learning rate is chosen
    (``lr_targets``). When the user narrows the targets or the protocols but
    not these, they follow: a protocol that does not run drops its
    ``protocol_targets``; a protocol's targets keep those still given; each
    ``lr_targets`` value moves to the nearest given target (in log size).
    Given ``budgets`` (a budget curve, one learning rate), the preset's
    learning-rate grid is dropped unless the user gave one.
    A protocol left with none of its targets is refused with the flag that
    fixes it. Settings the user gave are never changed (and are checked as given).
    """
    out = dict(settings)
    targets = tuple(float(t) for t in out.get("targets", SweepConfig().targets))
    protocols = tuple(out.get("protocols", SweepConfig().protocols))
    if "protocol_targets" not in overrides and ({"targets", "protocols"} & set(overrides)):
        narrowed = {}
        for name, ts in dict(out.get("protocol_targets", {})).items():
            if name not in protocols:
                continue
            kept = tuple(float(t) for t in ts if float(t) in targets)
            check(bool(kept), f"protocol {name} runs only at {', '.join(f'{float(t):g}' for t in ts)} in this preset, "
                              f"none of the targets given: add --protocol-targets {name}:R,... with the targets "
                              f"it should run at, or leave {name} out of --protocols")
            narrowed[name] = kept
        out["protocol_targets"] = narrowed
    if overrides.get("budgets") and "lr_grid" not in overrides:  # a budget curve trains each model at one rate
        out["lr_grid"], out["lr_targets"] = (), ()
    if "lr_targets" not in overrides and "targets" in overrides and out.get("lr_targets"):
        out["lr_targets"] = tuple(sorted({_nearest_in_log(float(t), targets) for t in out["lr_targets"]},
                                         reverse=True))
    return out
