"""Per-session state and the server-wide job board.

Two kinds of state, kept strictly apart:

* :class:`Session` belongs to one browser tab (Gradio keeps one copy per
  visitor in a ``gr.State``): the last run's reports, its compressed and dense
  models, the chat histories, and the cancel flag. Nothing about one visitor
  leaks into another's.
* :class:`JobBoard` belongs to one server (one is made per
  :func:`bsi.app.build_app` call, never at import): a non-blocking lock that
  lets a single compression run at a time. A second visitor pressing Start
  sees "busy" instead of waiting silently or starting a second model in the
  same memory.

The session holds no threading primitives on purpose: Gradio deep-copies the
initial state for each new visitor, and locks cannot be copied. The cancel
flag is a plain boolean, written by the Cancel handler and read by the
running job between two reports.
"""

from __future__ import annotations

import gc
import threading
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class LoadedModel:
    """A model ready to answer, its tokenizer, a label and its parameter count."""

    model: Any
    tokenizer: Any
    label: str
    params: int


@dataclass
class Session:
    """Everything one visitor's tab remembers between events.

    ``steps`` holds ``(stage, global step, loss)`` triples for the loss curve;
    ``rounds`` the :class:`~bsi.reports.RoundReport` objects of the last run
    (detached CPU tensors, so the Inspect tab can scrub through them after the
    models are gone); ``compressed``/``original`` the two chat models.
    """

    steps: list = field(default_factory=list)
    rounds: list = field(default_factory=list)
    evals: list = field(default_factory=list)
    log: list = field(default_factory=list)
    initial_ranks: dict = field(default_factory=dict)
    params_before: int | None = None
    compressible_before: int | None = None
    summary: dict | None = None
    config: Any = None
    running: bool = False
    cancel_requested: bool = False
    compressed: LoadedModel | None = None
    original: LoadedModel | None = None
    spectrum_model: LoadedModel | None = None
    chats: dict = field(default_factory=dict)

    def reset_run(self) -> None:
        """Forget the previous run (reports and its models) before a new one starts."""
        self.steps, self.rounds, self.evals, self.log = [], [], [], []
        self.initial_ranks, self.summary = {}, None
        self.params_before = self.compressible_before = None
        self.compressed = self.original = None
        self.chats = {}
        self.cancel_requested = False
        gc.collect()

    def add_log(self, line: str) -> None:
        self.log.append(f"[{time.strftime('%H:%M:%S')}] {line}")


class JobBoard:
    """One compression at a time per server.

    ``try_acquire(owner)`` returns True and records the owner when the board
    is free, else False at once (no waiting); ``release()`` frees it. ``owner``
    is a short description shown to the visitors who find the board busy.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.owner: str | None = None
        self.since: float | None = None

    def try_acquire(self, owner: str) -> bool:
        if not self._lock.acquire(blocking=False):
            return False
        self.owner, self.since = owner, time.time()
        return True

    def release(self) -> None:
        self.owner = self.since = None
        if self._lock.locked():
            self._lock.release()

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    def busy_message(self) -> str:
        """What a visitor who cannot start a job is told."""
        started = f", running for {time.time() - self.since:.0f} s" if self.since else ""
        return (f"Busy: another compression ({self.owner or 'unknown'}{started}) is using this server. "
                "Only one job runs at a time; press Start again when it has finished.")
