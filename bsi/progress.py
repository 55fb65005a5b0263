"""Progress bars for the CLI, fed by the engine's reports (tqdm, on stderr).

A bar is opened by the first step report of a stage and starts at that
report's step: a resumed run shows ``201/320``, not ``1/320``. The step that
opens the bar ran before the bar existed, so it is not counted in the rate;
the rate (and the time left) shows from the second report on, measured
between reports, instead of one step divided by the microseconds since the
bar was opened.
"""

from __future__ import annotations

import math
import sys

from tqdm.auto import tqdm

from bsi.reports import DoneReport, EvalReport, RoundReport, StageReport, StepReport


class ProgressPrinter:
    """Turns a stream of reports into one progress bar per stage plus one line per round."""

    def __init__(self, enabled: bool = True, stream=sys.stderr) -> None:
        self.enabled = enabled
        self.stream = stream
        self.bar: tqdm | None = None
        self.bar_stage: str | None = None

    def _write(self, text: str) -> None:
        if self.enabled:
            tqdm.write(text, file=self.stream)

    def show(self, report) -> None:
        if isinstance(report, StepReport):
            stage = "compress" if report.stage in ("train", "profile") else report.stage
            if self.enabled and (self.bar is None or self.bar_stage != stage or report.step < self.bar.n):
                self.close()
                self.bar = tqdm(total=report.total_steps, initial=report.step, desc=stage, file=self.stream,
                                leave=False)
                self.bar_stage = stage
            elif self.bar is not None and report.step > self.bar.n:
                self.bar.update(report.step - self.bar.n)
            if self.bar is not None:
                if math.isnan(report.loss) and not report.skipped:  # a forward-only step (e.g. ASVD's statistics)
                    self.bar.set_postfix_str(report.stage)
                else:
                    self.bar.set_postfix_str(f"{report.stage} loss {report.loss:.4f}" + (" (skipped)" if report.skipped else ""))
        elif isinstance(report, RoundReport):
            ranks = sum(layer.rank_after for layer in report.layers)
            self._write(
                f"round {report.round}/{report.total_rounds}: compressible layers at "
                f"{100 * report.compressible_ratio:.1f}% ({report.params_compressible:,} params), "
                f"{ranks:,} bases kept, mean tuning loss {report.mean_loss:.4f}, eps {report.eps:.3g}"
            )
        elif isinstance(report, EvalReport):
            self.close()
            self._write(f"eval [{report.when}]: accuracy {100 * report.accuracy:.1f}%, loss {report.loss:.4f} "
                        f"on {report.examples} examples ({report.seconds:.0f} s)")
        elif isinstance(report, StageReport):
            if report.event == "end":
                self.close()
                if report.cached or report.detail == "skipped":
                    self._write(f"{report.stage}: {'cached ' + report.detail if report.cached else 'skipped'}")
        elif isinstance(report, DoneReport) and report.out_dir:
            self.close()
            self._write(f"saved to {report.out_dir}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
            self.bar_stage = None
