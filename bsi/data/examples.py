"""The unit of task data: an :class:`Example` (question and worked answer) and a :class:`TaskData` split."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Example:
    """One task example: a question and its worked answer.

    ``answer`` is a short solution whose last line is ``#### <number>``, as in
    GSM8K: ``"She has 12 + 7 = 19 apples.\\n#### 19"``.
    """

    question: str
    answer: str


@dataclass
class TaskData:
    """A named task with its training and test examples, and a validation set held out of training."""

    name: str
    train: list[Example]
    test: list[Example]
    validation: list[Example] = field(default_factory=list)  # never trained on; chooses settings (never the test)


