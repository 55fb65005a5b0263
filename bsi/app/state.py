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

A third, :class:`Visitors`, maps Gradio's session hash to the visitor's
:class:`Session` (weakly), so the server can act when a visitor leaves.
Gradio itself closes a streaming handler whose client drops its event stream
or cancels the event (the job's ``finally`` then frees the board), but a
client that only ends its *session* (a closed ``gradio_client.Client``; a
browser tab whose heartbeat stops) would otherwise leave the job running to
its end and the models in memory for the hour Gradio keeps a closed
session's state. The app's ``unload`` handler calls :meth:`Visitors.leave`,
which raises the cancel flag and drops the models (:meth:`Session.close`).
"""

from __future__ import annotations

import gc
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any


@dataclass
class LoadedModel:
    """A model ready to answer, its tokenizer, a label, its parameter count and the model spec it came from."""

    model: Any
    tokenizer: Any
    label: str
    params: int
    source: str = ""


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
    chatting: bool = False
    closed: bool = False
    #: the last run's models of every round before its cut (bsi.analysis.ranking.RoundSnapshots), the held-out
    #: problems and the tokenizer: what Inspect's "Measure candidates" needs
    snapshots: Any = None
    held_out: list = field(default_factory=list)
    tokenizer: Any = None
    #: the What-if tab's explorer of the rounds shown (bsi.analysis.whatif.WhatIf, made on first use) and its
    #: eps study of one layer ((round, layer) -> bsi.analysis.whatif.EpsStudy, one at a time)
    whatif: Any = None
    eps_studies: dict = field(default_factory=dict)

    def holds_models(self) -> bool:
        """Whether this session still holds a model or a model's snapshots (what a garbage collection would free)."""
        return any(x is not None for x in (self.compressed, self.original, self.spectrum_model, self.snapshots,
                                           self.whatif)) or bool(self.chats or self.eps_studies)

    def reset_run(self) -> None:
        """Forget the previous run (reports and its models) before a new one starts.

        Its models are freed at once (a garbage collection, for the reference
        cycles a model's hooks make) only when the session held some: a full
        collection walks every object of the process, about 0.3 s in the
        dashboard's server and more beside a test suite's, a wait for nothing
        on a session's first run.
        """
        held = self.holds_models()
        self.steps, self.rounds, self.evals, self.log = [], [], [], []
        self.summary = None
        self.params_before = self.compressible_before = None
        self.compressed = self.original = None
        self.snapshots, self.held_out, self.tokenizer = None, [], None
        self.whatif, self.eps_studies = None, {}
        self.chats = {}
        self.cancel_requested = False
        if held:
            gc.collect()

    def close(self) -> None:
        """The visitor left: stop its job at the next report and free its models.

        A closed session starts no new job and loads no model; the running
        job (if any) sees ``cancel_requested`` and frees the board itself.
        """
        self.closed = True
        if self.running:
            self.cancel_requested = True
        held = self.holds_models()
        self.compressed = self.original = self.spectrum_model = None
        self.whatif, self.eps_studies = None, {}
        self.chats = {}
        if held:  # a visitor who ran nothing leaves nothing to collect (see reset_run)
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


class Visitors:
    """The sessions of one server, by Gradio session hash (weak references).

    ``register(hash, session)`` is called by every handler that runs a job or
    loads a model (they receive the request, hence the hash); ``leave(hash)``
    by the app's ``unload`` event. Entries vanish with their sessions, so the
    map never keeps a visitor's models alive.
    """

    def __init__(self) -> None:
        self._sessions: weakref.WeakValueDictionary[str, Session] = weakref.WeakValueDictionary()
        self._lock = threading.Lock()

    def register(self, session_hash: str | None, session: Session) -> Session:
        if session_hash:
            with self._lock:
                self._sessions[session_hash] = session
        return session

    def get(self, session_hash: str) -> Session | None:
        with self._lock:
            return self._sessions.get(session_hash)

    def leave(self, session_hash: str | None) -> bool:
        """Close the session of ``session_hash``; True when there was one."""
        with self._lock:
            session = self._sessions.pop(session_hash, None) if session_hash else None
        if session is None:
            return False
        session.close()
        return True

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)


def with_request(fn):
    """Mark ``fn``'s first parameter, ``request``, as a ``gr.Request`` so Gradio passes it.

    Gradio finds the parameter by its type hint; the modules here postpone
    annotations (and import gradio lazily), so the hint is set on the
    function object instead.
    """
    import gradio as gr

    fn.__annotations__ = {**fn.__annotations__, "request": gr.Request}
    return fn


def session_hash_of(request) -> str | None:
    """The session hash of a Gradio request (None outside a server, e.g. in direct calls)."""
    return getattr(request, "session_hash", None)
