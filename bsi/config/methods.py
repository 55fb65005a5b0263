"""The method registry as the configuration knows it: each method's name, what it is and the settings it fixes.

:data:`bsi.pipeline.methods.METHODS` adds what each one runs (torch code);
this module imports no torch, so the command line can list the methods fast.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MethodSpec:
    """One compression method as the configuration knows it: its name, what it is, what it fixes.

    ``score`` set makes it an *engine* method (the pruning rounds of
    :class:`bsi.method.engine.Compressor` with that score; the protocols apply
    to it); None, a *truncation* method (each layer keeps its first k bases;
    the published method under every protocol). ``within_layer`` set makes a
    named engine variant fix how each layer picks the bases it loses.
    ``variant``: not a published method, so not in a sweep's default list.
    :data:`bsi.pipeline.methods.METHODS` adds what each one runs (torch code).
    """

    name: str
    description: str
    score: str | None = None
    within_layer: str | None = None
    variant: bool = False

    @property
    def is_engine(self) -> bool:
        return self.score is not None

    @property
    def compress_settings(self) -> dict[str, str]:
        """The ``compress`` settings an engine method fixes (empty for a truncation method); the rest are the run's."""
        if self.score is None:
            return {}
        return {"score": self.score} | ({} if self.within_layer is None else {"within_layer": self.within_layer})


#: name -> method, in the order tables list them. The one place a method is named.
METHOD_SPECS: dict[str, MethodSpec] = {spec.name: spec for spec in (
    MethodSpec("svd", "plain SVD: each layer keeps its top-k singular triplets"),
    MethodSpec("svd-llm", "SVD-LLM: top-k of the SVD of the weight on whitened task inputs"),
    MethodSpec("fwsvd", "Fisher-weighted SVD (row weights from per-example squared task gradients)"),
    MethodSpec("asvd", "activation-aware SVD (input channels scaled by mean|x|^alpha), ranks by sensitivity"),
    MethodSpec("basel", "Basel: prune the smallest re-learned |sigma|", score="basel"),
    MethodSpec("bsi-grad", "BSI without the curvature term: first-order loss change", score="bsi-grad"),
    MethodSpec("bsi", "BSI: first- plus second-order loss change", score="bsi"),
    # bsi's score splits each round's cut across layers, |sigma| picks the bases inside each layer: in the
    # ranking test this pair left the lowest held-out loss every round (docs/benchmarks.md)
    MethodSpec("bsi-mag", "BSI's per-layer budgets, the smallest |sigma| removed inside each layer (a variant, not a "
                          "published method)", score="bsi", within_layer="magnitude", variant=True),
    # the score's two parts, each alone, everything else bsi's (the z-test, the measurement, the selection)
    MethodSpec("bsi-curvature", "BSI's curvature term alone, 1/2 sigma^2 h (an ablation, not a published method)",
               score="bsi-curvature", variant=True),
    MethodSpec("bsi-grad-tested", "BSI's gradient term alone, under BSI's z-test (an ablation, not a published "
                                  "method)", score="bsi-grad-tested", variant=True),
)}

METHOD_NAMES = tuple(name for name, spec in METHOD_SPECS.items() if not spec.variant)
"""The compared methods, a sweep's default."""

VARIANT_NAMES = tuple(name for name, spec in METHOD_SPECS.items() if spec.variant)
"""Named variants a sweep runs when asked (``--methods bsi,bsi-mag``): not published methods, not in the default."""

ENGINE_METHODS = tuple(name for name, spec in METHOD_SPECS.items() if spec.is_engine)
"""The methods the protocols apply to (the truncation methods are the published ones under every protocol)."""


def is_engine_method(name: str) -> bool:
    """Whether the registered method ``name`` runs the engine (and so takes a protocol's settings)."""
    spec = METHOD_SPECS.get(name)
    return spec is not None and spec.is_engine
