"""Progress on stderr: tqdm bars on a terminal, a few whole lines anywhere else (a log, a pipe, CI)."""

from __future__ import annotations

import io
import time

import pytest

from bsi.progress import PLAIN_EVERY_S, ProgressPrinter, duration, is_terminal
from bsi.reports import DoneReport, StageReport, StepReport


class FakeClock:
    """A clock the test moves by hand: plain-line mode's time rule, without sleeping."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def steps(stage: str, first: int, last: int, total: int, clock: FakeClock | None = None, seconds: float = 1.0):
    for step in range(first, last + 1):
        if clock is not None:
            clock.now += seconds
        yield StepReport(stage, step, total, 0.5, 0.0)


# ------------------------------------------------------------------ on a terminal
def test_bar_names_forward_only_steps_without_a_nan_loss():
    """ASVD's calibration runs forward only: its bar shows the stage, not 'loss nan'."""
    printer = ProgressPrinter(stream=io.StringIO(), interactive=True)
    printer.show(StepReport("calibrate", 1, 2, float("nan"), 0.1))
    assert printer.bar.postfix == "calibrate"
    printer.show(StepReport("recover", 1, 2, 0.5, 0.1))
    assert printer.bar.postfix == "recover loss 0.5000"
    printer.show(StepReport("recover", 2, 2, float("nan"), 0.2, skipped=True))
    assert printer.bar.postfix == "recover loss nan (skipped)"
    printer.close()


def test_bar_of_a_resumed_stage_starts_at_its_step_and_shows_a_rate_only_once_measured():
    printer = ProgressPrinter(stream=io.StringIO(), interactive=True)
    printer.show(StepReport("train", 201, 320, 0.5, 30.0))  # the first step after --resume
    shown = str(printer.bar)
    assert printer.bar.n == 201 and "201/320" in shown
    assert "it/s" not in shown and "?" not in shown, shown  # no empty rate, and not 1 step / 30 microseconds
    for step in (202, 203):
        time.sleep(0.12)  # a step of 0.12 s
        printer.show(StepReport("profile", step, 320, 0.4, 30.0))
    rate = printer.bar.format_dict["rate"] or (printer.bar.n - printer.bar.initial) / printer.bar.format_dict["elapsed"]
    assert printer.bar.n == 203 and 2 < rate < 12, rate  # about 8 steps a second
    assert "it/s" in str(printer.bar) and "?" not in str(printer.bar)
    printer.show(StepReport("recover", 1, 4, 0.3, 0.1))  # a new stage: a new bar from its own step
    assert printer.bar.n == 1 and printer.bar.total == 4
    printer.close()


def test_a_terminal_gets_bars_and_anything_else_lines():
    assert is_terminal(Terminal()) and not is_terminal(io.StringIO())
    assert ProgressPrinter(stream=Terminal()).interactive
    assert not ProgressPrinter(stream=io.StringIO()).interactive


# ------------------------------------------------------------------ in a log or a pipe
def test_plain_lines_a_few_per_stage_and_never_a_carriage_return():
    stream, clock = io.StringIO(), FakeClock()
    printer = ProgressPrinter(stream=stream, clock=clock)  # a StringIO is not a terminal
    printer.show(StageReport("finetune", "end", "/cache/ft", cached=True))
    for report in steps("train", 1, 300, 300, clock, seconds=0.5):  # a fast stage: 150 s in all
        printer.show(report)
    printer.show(StageReport("compress", "end"))
    printer.show(DoneReport({}, "runs/x"))
    text = stream.getvalue()
    assert "\r" not in text and "\x1b" not in text
    lines = text.splitlines()
    assert lines[0] == "finetune: cached /cache/ft"
    assert lines[1] == "compress: step 1/300, train loss 0.5000"
    progress = [line for line in lines if line.startswith("compress: step ") and "%" in line]
    assert len(progress) == 9  # one per tenth of the stage, however many steps
    assert progress[0].startswith("compress: step 30/300 (10%)") and "2.0 steps/s" in progress[0]
    assert "about 2 min 15 s left" in progress[0]  # 270 steps at 0.5 s
    assert lines[-2] == "compress: 300 steps done in 2 min 30 s"
    assert lines[-1] == "saved to runs/x"


def test_plain_lines_of_a_slow_stage_come_every_minute():
    stream, clock = io.StringIO(), FakeClock()
    printer = ProgressPrinter(stream=stream, clock=clock)
    for report in steps("finetune", 1, 8, 1000, clock, seconds=25.0):  # 25 s a step: a tenth takes 42 min
        printer.show(report)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 + 2  # the first step, then a line once PLAIN_EVERY_S have passed: steps 4 and 7
    assert PLAIN_EVERY_S == 60 and lines[1].startswith("finetune: step 4/1000 (0%)")
    assert "25.0 s/step" in lines[1]


def test_a_resumed_stage_starts_at_its_step_and_times_only_what_it_ran():
    stream, clock = io.StringIO(), FakeClock()
    printer = ProgressPrinter(stream=stream, clock=clock)
    printer.show(StageReport("compress", "resume", "after round 2"))
    for report in steps("profile", 201, 320, 320, clock, seconds=2.0):
        printer.show(report)
    printer.close()
    lines = stream.getvalue().splitlines()
    assert lines[0] == "compress: resumed after round 2"
    assert lines[1] == "compress: step 201/320 (resumed), profile loss 0.5000"
    assert not any("step 1/" in line for line in lines)
    assert "2.0 s/step" in lines[2]  # measured from step 201, not from step 0
    assert lines[-1] == "compress: 320 steps done (120 in this run) in 3 min 58 s"


def test_quiet_prints_nothing_and_a_stopped_stage_says_where():
    stream = io.StringIO()
    quiet = ProgressPrinter(enabled=False, stream=stream)
    for report in steps("train", 1, 5, 5):
        quiet.show(report)
    quiet.close()
    assert stream.getvalue() == ""
    printer = ProgressPrinter(stream=stream, clock=FakeClock())
    for report in steps("recover", 1, 3, 10):
        printer.show(report)
    printer.close()  # Ctrl-C
    assert stream.getvalue().splitlines()[-1] == "recover: stopped at step 3/10"


@pytest.mark.parametrize("seconds,text", [(0.4, "0 s"), (45, "45 s"), (250, "4 min 10 s"), (7500, "2 h 5 min")])
def test_durations_read_like_a_person_writes_them(seconds, text):
    assert duration(seconds) == text
