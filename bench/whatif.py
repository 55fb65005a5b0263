"""How fast is a what-if? Each latency of the dashboard's What-if tab, and its ratio to a full run of the same size.

Runs the tab's own functions (:mod:`bsi.app.whatif`, no browser) on the
shipped ``tour`` run, in one process, one after the other:

* **rule redraw**: the size, the predicted loss and the kept-share figure for
  a set of sizes, rankings and rules (what moving the slider does; the
  slowest and the median);
* **prepare**: the saved run's round models rebuilt (its compression stage
  again, then the dense model, round 1's uncut model and the run's own model
  after each round measured); the fine-tune and the conversion cached or not,
  as this machine's cache has them (printed);
* **measure**: until the cut's loss and answers are on screen; a cut of
  round 1 (its uncut model measured during prepare), then a cut of the last
  round (its uncut model measured too: the first measure of a round);
* **eps**: the first value on a layer (its Fisher and exact diagonal at the
  8 largest coefficients included), then a second value;
* **full run**: the ``tour`` preset from start to end, in the same process
  (`Pipeline.run`, evaluation and recovery included), to the same size as
  the what-if's first cut: the baseline of every ratio.

    python bench/whatif.py                    # prints the table; --json FILE keeps it (data/speed/)

Nothing else should run on the machine meanwhile (2 cores: a second torch
process makes both several times slower).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from common import machine  # noqa: E402

SIZES = ((("target", 0.7), ("target", 0.5), ("target", 0.3), ("keep", 0.995), ("keep", 0.99)))
RANKINGS = ("bsi", "magnitude", "gradient", "random")


def drain(generator):
    """Run a generator to its end; returns its last item."""
    items = iter(generator)
    last = None
    for item in items:
        last = item
    return last


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default=str(ROOT / "data" / "runs" / "tour"), help="saved run (default: shipped tour)")
    parser.add_argument("--layer", default="model.layers.15.mlp.down_proj", help="layer of the eps study")
    parser.add_argument("--json", default=None, help="write the figures to this JSON file too")
    parser.add_argument("--skip-full-run", action="store_true", help="leave out the baseline (for a quick look)")
    args = parser.parse_args(argv)

    from bsi.app.saved import read_saved_run
    from bsi.app.state import JobBoard, Session
    from bsi.app.whatif import eps_view, explorer, measure, plan_view, prepare, saved_config
    from bsi.pipeline.runner import Pipeline

    saved = read_saved_run(args.run)
    config = saved_config(saved)
    probe = Pipeline(config)
    caches = {"finetune": (probe.finetune_folder / "config.json").is_file(), "conversion": probe.bases_cache.present}
    print(f"caches before: fine-tune {'cached' if caches['finetune'] else 'not cached'}, conversion "
          f"{'cached' if caches['conversion'] else 'not cached'}", flush=True)
    out: dict = {"machine": machine(), "date": time.strftime("%Y-%m-%d"), "run": str(args.run), "caches": caches}

    session = Session()
    saved.fill(session)
    redraws = []
    for rule, value in SIZES:
        for rank_by in RANKINGS:
            start = time.perf_counter()
            text, _ = plan_view(session, 1, rule, value, rank_by, "auto")
            redraws.append(time.perf_counter() - start)
            assert not text.startswith("**Error"), text
    out["redraw_s"] = {"median": statistics.median(redraws), "max": max(redraws), "count": len(redraws)}
    print(f"rule redraw: median {out['redraw_s']['median'] * 1000:.0f} ms, slowest {max(redraws) * 1000:.0f} ms "
          f"({len(redraws)} settings)", flush=True)

    start = time.perf_counter()
    last = drain(prepare(JobBoard(), session, saved))
    out["prepare_s"] = time.perf_counter() - start
    assert explorer(session).can_measure, last
    print(f"prepare: {out['prepare_s']:.1f} s", flush=True)

    whatif = explorer(session)
    last_round = whatif.round_ids[-1]
    first_size = SIZES[0]
    measures = {}
    for label, round_index in (("round 1 (uncut measured in prepare)", 1),
                               (f"round {last_round} (its uncut model measured too)", last_round)):
        start = time.perf_counter()
        for _, table, _ in measure(session, round_index, *first_size, "bsi", "auto"):
            if table is not None and label not in measures:  # the cut's loss and answers are on screen
                measures[label] = time.perf_counter() - start
        assert label in measures, "the measurement showed no answers"
    out["measure_s"] = measures
    for label, seconds in measures.items():
        print(f"measure, {label}: {seconds:.1f} s", flush=True)
    point, own = whatif.points[0], whatif.path[-1]
    out["first_point"] = {"compression": point.cut.compression, "loss": point.measurement.loss,
                          "uncut_loss": point.uncut_loss, "predicted": point.cut.predicted,
                          "measured_rise": point.rise().to_dict(),
                          "one_shot_minus_the_run": point.measurement.loss_minus(own.measurement).to_dict(),
                          "dense_loss": whatif.dense_measurement().loss,
                          "path": [{"round": p.round, "compression": p.compression, "loss": p.measurement.loss}
                                   for p in whatif.path]}
    gap = out["first_point"]["one_shot_minus_the_run"]
    print(f"one shot from round 1 at {point.cut.compression:.2f}x: loss {point.measurement.loss:.4f}; the run's own "
          f"model after its last round: {own.measurement.loss:.4f}; difference {gap['estimate']:+.4f} "
          f"[{gap['low']:+.4f}, {gap['high']:+.4f}] (paired, {gap['samples']} problems)", flush=True)

    eps_times = []
    for log_eps in (-1.8, -4.0):
        start = time.perf_counter()
        text, _ = drain(eps_view(session, 1, args.layer, log_eps, *first_size, "bsi", "auto"))
        eps_times.append(time.perf_counter() - start)
        assert not text.startswith("**Error"), text
    out["eps_s"] = {"first value (Fisher and exact diagonal included)": eps_times[0], "another value": eps_times[1]}
    print(f"eps: first value {eps_times[0]:.1f} s (the layer's Fisher and exact diagonal included), another value "
          f"{eps_times[1]:.1f} s", flush=True)
    del session, whatif

    if not args.skip_full_run:
        start = time.perf_counter()
        pipeline = Pipeline(config)
        drain(pipeline.run())
        out["full_run_s"] = time.perf_counter() - start
        full = out["full_run_s"]
        print(f"full run of the same size ({config.preset}, evaluation and recovery included): {full:.1f} s",
              flush=True)
        out["ratios_to_full_run"] = {
            "rule redraw (median)": out["redraw_s"]["median"] / full,
            "measure (round 1)": list(measures.values())[0] / full,
            "measure (first of a round)": list(measures.values())[1] / full,
            "eps, another value": eps_times[1] / full,
            "prepare": out["prepare_s"] / full,
        }
        for label, ratio in out["ratios_to_full_run"].items():
            print(f"  {label}: {ratio:.4f} of a full run ({1 / ratio:,.0f}x faster)", flush=True)
    if args.json:
        from bsi.files import atomic_write_text

        atomic_write_text(args.json, json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    main()
