"""Progress for the CLI, fed by the engine's reports, on stderr: bars on a terminal, plain lines elsewhere.

On a terminal each stage gets a tqdm bar. A bar is opened by the first step
report of a stage and starts at that report's step: a resumed run shows
``201/320``, not ``1/320``. The step that opens the bar ran before the bar
existed, so it is not counted in the rate: until a second report has been
timed the bar shows its position and elapsed time only (no ``?it/s``), and
from then on a rate and the time left measured between reports.

When stderr is not a terminal (a log file, a pipe, CI) there are no bars and
no carriage returns, only whole lines (:class:`StepLines`):

* a stage's first step: ``compress: step 201/320 (resumed), train loss 0.4321``;
* then a line whenever another tenth of the stage is done, or
  :data:`PLAIN_EVERY_S` seconds have passed since the last line, whichever
  comes first, with the rate and the time left measured since the stage's
  first report (``... 62%, 2.1 s/step, about 4 min left``);
* its last step: ``compress: 320 steps done in 4 min 10 s``.

A stage of 3000 steps writes about a dozen lines, however fast it runs. Round,
evaluation, cached-stage and save lines are the same in both modes.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import TextIO

from tqdm.auto import tqdm

from bsi.reports import DoneReport, EvalReport, RoundReport, StageReport, StepReport
from bsi.units import duration

PLAIN_EVERY_S = 60.0
"""Longest quiet time of a stage in plain-line mode: a line at least this often (seconds)."""

PLAIN_PARTS = 10
"""Plain-line mode writes a line each time another 1/PLAIN_PARTS of a stage is done."""

_WAITING_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"
_RATE_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"


def is_terminal(stream: TextIO) -> bool:
    """True when ``stream`` is an interactive terminal (a bar can redraw itself there)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def stage_of(report: StepReport) -> str:
    """The bar a step belongs to: the engine's train and profile steps share the ``compress`` stage."""
    return "compress" if report.stage in ("train", "profile") else report.stage


def step_detail(report: StepReport) -> str:
    """``train loss 0.4321``; a forward-only step (NaN loss, e.g. ASVD's statistics) shows its name only."""
    if math.isnan(report.loss) and not report.skipped:
        return report.stage
    return f"{report.stage} loss {report.loss:.4f}" + (" (skipped)" if report.skipped else "")


def pace(steps: int, seconds: float) -> str:
    """``2.1 s/step`` or ``8.3 steps/s``: whichever reads as a number above 1."""
    if steps <= 0 or seconds <= 0:
        return ""
    per_step = seconds / steps
    return f"{per_step:.1f} s/step" if per_step >= 1 else f"{1 / per_step:.1f} steps/s"


class StepLines:
    """One stage's steps as a few whole lines (see the module docstring); ``clock`` is injectable for tests."""

    def __init__(self, first: StepReport, write: Callable[[str], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stage = stage_of(first)
        self.total = first.total_steps
        self.write = write
        self.clock = clock
        self.first_step = first.step
        self.first_time = self.last_time = clock()
        self.step = first.step
        self.next_part = self._part(first.step) + 1
        resumed = " (resumed)" if first.step > 1 else ""
        self.write(f"{self.stage}: step {first.step}/{self.total}{resumed}, {step_detail(first)}")

    def _part(self, step: int) -> int:
        return step * PLAIN_PARTS // max(self.total, 1)

    def show(self, report: StepReport) -> None:
        self.step = report.step
        now = self.clock()
        if report.step >= self.total:
            return  # the closing line says it
        if self._part(report.step) < self.next_part and now - self.last_time < PLAIN_EVERY_S:
            return
        self.next_part = self._part(report.step) + 1
        self.last_time = now
        done, spent = report.step - self.first_step, now - self.first_time
        timing = ""
        if done > 0 and spent > 0:
            left = (self.total - report.step) * spent / done
            timing = f", {pace(done, spent)}, about {duration(left)} left"
        self.write(f"{self.stage}: step {report.step}/{self.total} ({100 * report.step // self.total}%), "
                   f"{step_detail(report)}{timing}")

    def close(self) -> None:
        if self.step >= self.total:
            spent = self.clock() - self.first_time
            ran = self.step - self.first_step + 1
            self.write(f"{self.stage}: {self.total} steps done" +
                       (f" ({ran} in this run)" if ran < self.total else "") + f" in {duration(spent)}")
        else:
            self.write(f"{self.stage}: stopped at step {self.step}/{self.total}")


class ProgressPrinter:
    """Turns a stream of reports into progress: one bar (or a few lines) per stage plus one line per round.

    Args:
        enabled: False prints nothing (``--quiet``).
        stream: where to write (default: ``sys.stderr`` at the time of the call).
        interactive: bars (True) or plain lines (False); None: bars exactly when ``stream`` is a terminal.
        clock: the time source of plain-line mode (seconds, monotonic).
    """

    def __init__(self, enabled: bool = True, stream: TextIO | None = None, *, interactive: bool | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.enabled = enabled
        self.stream = sys.stderr if stream is None else stream
        self.interactive = is_terminal(self.stream) if interactive is None else interactive
        self.clock = clock
        self.bar: tqdm | None = None
        self.bar_stage: str | None = None
        self.lines: StepLines | None = None

    def _write(self, text: str) -> None:
        if not self.enabled:
            return
        if self.interactive:
            tqdm.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def show(self, report) -> None:
        if isinstance(report, StepReport):
            self._step(report)
        elif isinstance(report, RoundReport):
            ranks = sum(layer.rank_after for layer in report.layers)
            self._write(
                f"round {report.round}/{report.total_rounds}: compressible layers at "
                f"{100 * report.compressible_ratio:.1f}% ({report.params_compressible:,} params), "
                f"{ranks:,} bases kept, mean tuning loss {report.mean_loss:.4f}, eps {report.eps:.3g}"
            )
        elif isinstance(report, EvalReport):
            self.close()
            if report.perplexity is not None:
                self._write(f"eval [{report.when}]: perplexity {report.perplexity:.3f}, mean next-token loss "
                            f"{report.loss:.4f} on {report.examples} held-out windows ({report.seconds:.0f} s)")
            else:
                self._write(f"eval [{report.when}]: accuracy {100 * report.accuracy:.1f}%, loss {report.loss:.4f} "
                            f"on {report.examples} examples ({report.seconds:.0f} s)")
        elif isinstance(report, StageReport):
            if report.event == "end":
                self.close()
                if report.cached or report.detail == "skipped":
                    self._write(f"{report.stage}: {'cached ' + report.detail if report.cached else 'skipped'}")
            elif report.event == "resume":
                self._write(f"{report.stage}: resumed {report.detail}")
        elif isinstance(report, DoneReport) and report.out_dir:
            self.close()
            self._write(f"saved to {report.out_dir}")

    def _step(self, report: StepReport) -> None:
        if not self.enabled:
            return
        stage = stage_of(report)
        if self.interactive:
            self._bar_step(report, stage)
        elif self.lines is None or self.lines.stage != stage or report.step < self.lines.step:
            self.close()
            self.lines = StepLines(report, self._write, self.clock)
        else:
            self.lines.show(report)

    def _bar_step(self, report: StepReport, stage: str) -> None:
        if self.bar is None or self.bar_stage != stage or report.step < self.bar.n:
            self.close()
            self.bar = tqdm(total=report.total_steps, initial=report.step, desc=stage, file=self.stream,
                            leave=False, bar_format=_WAITING_FORMAT)
            self.bar_stage = stage
        elif report.step > self.bar.n:
            if self.bar.bar_format == _WAITING_FORMAT:
                self.bar.bar_format = _RATE_FORMAT  # a second report: now there is a rate to show
            self.bar.update(report.step - self.bar.n)
        self.bar.set_postfix_str(step_detail(report))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
            self.bar_stage = None
        if self.lines is not None:
            self.lines.close()
            self.lines = None
