"""Compose the tabs into one Gradio app.

:func:`build_app` makes everything one server needs: the
:class:`~bsi.app.state.JobBoard` (one compression at a time), a ``gr.State``
holding a fresh :class:`~bsi.app.state.Session` per visitor, and the five
tabs, and the :class:`~bsi.app.state.Visitors` map with the ``unload``
event that stops a leaving visitor's job and frees its models. Nothing here
runs at import; ``app.py`` launches the result.
"""

from __future__ import annotations

import os

from bsi.app import chat, compare, compress, inspect, spectra
from bsi.app.form import Form
from bsi.app.state import JobBoard, Session, Visitors, with_request

TITLE = "bsi: live compression studio"


def startup_lines(local_url: str, share_url: str | None = None) -> list[str]:
    """What ``app.py`` prints once the server listens: where to open it, and the switch for a public link."""
    lines = [f"{TITLE} on {local_url}"]
    if share_url:
        lines.append(f"public link (anyone who has it can use this server): {share_url}")
    else:
        lines.append("Only this machine can open it; to share a public gradio.live link, start it again with --share.")
    return lines


def build_app(preset: str = "default", sweep_dir: str = "runs/sweep", board: JobBoard | None = None):
    """The dashboard as a ``gr.Blocks`` (not launched).

    Args:
        preset: the preset the Compress form starts from (``default``: the
            embedded model; ``smoke``: the tiny random model, seconds — what
            the tests use, so a first click on Start finishes quickly).
        sweep_dir: the folder the Compare tab proposes.
        board: the job board to share (a new one by default: one per server).
    """
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    import gradio as gr

    board = board or JobBoard()
    visitors = Visitors()
    defaults = Form.for_preset(preset)
    with gr.Blocks(title=TITLE) as demo:
        gr.Markdown(f"## {TITLE}\nCompress a causal LM with Basis Selection with Importance, watch every round, "
                    "inspect each basis' importance, and chat with the result next to the original.")
        session_state = gr.State(Session())
        with gr.Tabs():
            with gr.Tab("Compress", id="compress"):
                tab = compress.render(board, session_state, defaults, visitors)
            with gr.Tab("Inspect", id="inspect"):
                tab.connect(*inspect.render(session_state))
            with gr.Tab("Spectra", id="spectra"):
                spectra.render(session_state, tab.form, visitors)
            with gr.Tab("Chat", id="chat") as chat_tab:
                sizes = chat.render(session_state, visitors)
            with gr.Tab("Compare", id="compare"):
                compare.render(sweep_dir)
        chat_tab.select(chat.sizes_text, session_state, sizes)

        @with_request
        def on_unload(request):  # the tab closed, or a client ended its session
            visitors.leave(request.session_hash)

        demo.unload(on_unload)
    demo.board = board  # for tests and for app.py's status line
    demo.visitors = visitors
    return demo
