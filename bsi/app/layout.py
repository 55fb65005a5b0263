"""Compose the tabs into one Gradio app.

:func:`build_app` makes everything one server needs: the
:class:`~bsi.app.state.JobBoard` (one compression at a time), a ``gr.State``
holding a fresh :class:`~bsi.app.state.Session` per visitor, the seven
tabs (Compress, Inspect, Spectra, Chat, Answers, Compare, Help), opened on
the run and sweep shipped in ``data/`` (:mod:`bsi.app.saved`: read once per
server, shown before any click), and the :class:`~bsi.app.state.Visitors`
map with the ``unload`` event that stops a leaving visitor's job and frees
its models. Nothing here runs at import; ``app.py`` launches the result.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import weakref

from bsi.app import answers, chat, compare, compress, guide, inspect, spectra, whatif
from bsi.app.form import Form
from bsi.app.saved import opening_folders, opening_view, read_saved_run, shipped_spectrum
from bsi.app.state import JobBoard, Session, Visitors, with_request
from bsi.errors import BSIError

TITLE = "bsi: live compression studio"


def startup_lines(local_url: str, share_url: str | None = None) -> list[str]:
    """What ``app.py`` prints once the server listens: where to open it, and the switch for a public link."""
    lines = [f"{TITLE} on {local_url}"]
    if share_url:
        lines.append(f"public link (anyone who has it can use this server): {share_url}")
    else:
        lines.append("Only this machine can open it; to share a public gradio.live link, start it again with --share.")
    return lines


def build_app(preset: str = "tour", sweep_dir: str | None = None, run_dir: str | None = None,
              board: JobBoard | None = None):
    """The dashboard as a ``gr.Blocks`` (not launched).

    Args:
        preset: the preset the Compress form starts from (``tour``: the
            embedded model in under two minutes; ``smoke``: the tiny
            random model, seconds — what the tests use).
        sweep_dir: the sweep the Compare tab and the Answers tab's sweep view
            open on (default: the sweep shipped in ``data/``; ``""``: none).
        run_dir: the finished run the dashboard opens on (default: the runs
            of the embedded model shipped in ``data/``,
            :func:`bsi.app.saved.opening_folders`; ``""``: none).
        board: the job board to share (a new one by default: one per server).
    """
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    import gradio as gr

    board = board or JobBoard()
    visitors = Visitors()
    csv_folder = tempfile.mkdtemp(prefix="bsi-inspect-")  # the Inspect tab's CSV downloads, removed with the app
    defaults = Form.for_preset(preset)
    shipped_plots, shipped_answers, shipped_sweep = opening_folders()  # data/ ("" where this checkout has none)
    answers_dir = shipped_answers if run_dir is None else run_dir
    run_dir = shipped_plots if run_dir is None else run_dir
    sweep_dir = shipped_sweep if sweep_dir is None else sweep_dir
    saved, error = None, None
    if run_dir:
        try:
            saved = read_saved_run(run_dir)  # read once; every visitor's session shares it
        except BSIError as err:
            error = str(err)
    opening_spectrum = shipped_spectrum(run_dir)
    with gr.Blocks(title=TITLE) as demo:
        gr.Markdown(f"## {TITLE}\nCompress a causal LM with Basis Selection with Importance, watch every round, "
                    "inspect each basis' importance, chat with the result next to its dense reference, and read what "
                    "the models answered, problem by problem.")
        session_state = gr.State(Session())
        with gr.Tabs() as tabs:
            with gr.Tab("Compress", id="compress"):
                tab = compress.render(board, session_state, defaults, visitors, opening_view(saved, error))
            with gr.Tab("Inspect", id="inspect"):
                tab.connect(*inspect.render(session_state, csv_folder, saved.rounds if saved else ()))
            with gr.Tab("What if", id="whatif") as whatif_tab:
                explore = whatif.render(session_state, board, visitors, saved)
            with gr.Tab("Spectra", id="spectra"):
                spectra.render(session_state, tab.form, visitors, opening_spectrum)
            with gr.Tab("Chat", id="chat") as chat_tab:
                sizes = chat.render(session_state, visitors)
            with gr.Tab("Answers", id="answers"):
                opening = answers.render(answers_dir or "", sweep_dir or "")
            with gr.Tab("Compare", id="compare"):
                compare.render(sweep_dir or "")
            with gr.Tab("Help", id="help"):
                guide.render()
        chat_tab.select(chat.sizes_text, session_state, sizes)
        whatif_tab.select(*explore["refresh"])

        def to_eps(eps_value):  # the form's eps (or the rule's, left as the run used it) shown on one layer
            shown = gr.skip() if not eps_value or eps_value <= 0 else round(math.log10(float(eps_value)), 1)
            return gr.Tabs(selected="whatif"), shown

        tab.eps_link.click(to_eps, tab.eps_input, [tabs, explore["eps"]])
        if saved is not None:  # the visitor's session holds the saved run, so Inspect can scrub through it
            demo.load(saved.fill, session_state, None)
        for handler, inputs, outputs in opening.values():  # the Answers views open on the shipped data
            demo.load(handler, inputs, outputs)

        @with_request
        def on_unload(request):  # the tab closed, or a client ended its session
            visitors.leave(request.session_hash)

        demo.unload(on_unload)
    # the CSV folder goes when the app is garbage-collected or the process exits (weakref.finalize runs at exit);
    # demo.remove_files() removes it at once
    demo.remove_files = weakref.finalize(demo, shutil.rmtree, csv_folder, ignore_errors=True)
    demo.csv_folder = csv_folder
    demo.board = board  # for tests and for app.py's status line
    demo.visitors = visitors
    return demo
