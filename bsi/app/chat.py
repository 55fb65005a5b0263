"""Chat tab: the compressed model and the original side by side, streaming.

Both models answer the same message greedily (so a difference comes from the
weights, not from sampling). Their replies stream at once: the two
:meth:`bsi.chat.ChatSession.stream_reply` generators, each generating in its
own thread, are read in turn, and every new piece updates both panels.

The models come from the session: the last finished run of the Compress tab
(the original being the dense model just before compression, i.e. after the
task fine-tune), or a compressed folder loaded here (the original then being
the source model named in its ``bsi_config.json``). Chat takes no part in
the server's job board, so it works whether or not a compression is running.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from bsi.chat import ChatSession
from bsi.errors import BSIError
from bsi.pipeline.export import read_meta
from bsi.method.surgery import model_parameters
from bsi.app.format import in_app_words, number_text
from bsi.app.state import LoadedModel, Session, Visitors, session_hash_of, with_request
from bsi.models import TINY_MODEL

SIDES = ("compressed", "original")
EMPTY_REPLY = "(no text: the model ended its turn at once or produced only special tokens)"
TINY_NOTE = ("The tiny random Llama has untrained, random weights: it is here to try the app in seconds (a run, "
             "the plots, the Inspect table, this chat's streaming), and its replies are meaningless tokens, or "
             "nothing at all. For real answers, compress the embedded SmolLM2-135M-Instruct.")
TINY_EMPTY_REPLY = "(no text: the tiny random model produced only special tokens; its weights are random, see above)"


def is_tiny(session: Session) -> bool:
    """True when the loaded models are the tiny random Llama (for tests and trying the app)."""
    return session.compressed is not None and session.compressed.source == TINY_MODEL


def sizes_text(session: Session) -> str:
    """Which models are loaded and how large each is (and, for the tiny random model, what it is for)."""
    if session.compressed is None:
        return "No compressed model yet: run a compression (Compress tab) or load a saved folder below."
    parts = [f"**compressed**: {session.compressed.params:,} parameters"]
    if session.original is not None:
        ratio = session.original.params / max(session.compressed.params, 1)
        parts.append(f"**{session.original.label}**: {session.original.params:,} parameters "
                     f"({number_text(ratio)}x larger)")
    text = " · ".join(parts)
    return f"{text}\n\n{TINY_NOTE}" if is_tiny(session) else text


def load_folder(session: Session, folder: str) -> str:
    """Load a compressed folder (``bsi compress --out``) and its source model into the session."""
    from bsi.models import load_model_and_tokenizer

    if session.closed:
        raise BSIError("this session has ended; reload the page")
    folder = (folder or "").strip()
    if not folder:
        raise BSIError("type the folder of a compressed model (one the Compress tab's 'Save to folder' or "
                       "`bsi compress` wrote)")
    path = Path(folder).expanduser()
    meta = read_meta(path)
    model, tokenizer = load_model_and_tokenizer(str(path))
    source = meta.get("source_model")
    session.compressed = LoadedModel(model, tokenizer, "compressed", model_parameters(model), source=source or "")
    session.original = None
    if source:
        original, original_tok = load_model_and_tokenizer(source)
        session.original = LoadedModel(original, original_tok, f"original ({source}, not fine-tuned)",
                                       model_parameters(original), source=source)
    session.chats = {}
    return sizes_text(session)


def _history(chat: ChatSession | None, pending: tuple[str, str] | None = None, empty: str = EMPTY_REPLY) -> list[dict]:
    messages = [dict(m) for m in chat.history] if chat is not None else []
    for m in messages:
        if m["role"] == "assistant" and not m["content"].strip():  # nothing visible: say so
            m["content"] = empty
    if pending is not None:
        messages += [{"role": "user", "content": pending[0]}, {"role": "assistant", "content": pending[1]}]
    return messages


def respond(session: Session, message: str, max_new_tokens: int = 64) -> Iterator[tuple[list[dict], list[dict]]]:
    """Stream both replies to ``message``; yields ``(compressed history, original history)``.

    Raises BSIError when no model is loaded, the message is empty, or this
    session's previous reply is still streaming (two replies at once would
    interleave their turns in the same conversation).
    """
    if session.compressed is None:
        raise BSIError("no compressed model yet: run a compression first, or load a saved folder")
    if not message or not message.strip():
        raise BSIError("empty message: type something to send")
    if session.chatting:
        raise BSIError("a reply is still streaming in this tab: wait for it to finish, then send again")
    session.chatting = True
    try:
        yield from _stream(session, message, max_new_tokens)
    finally:  # also when Gradio closes the stream (client gone)
        session.chatting = False


def _stream(session: Session, message: str, max_new_tokens: int) -> Iterator[tuple[list[dict], list[dict]]]:
    loaded = {"compressed": session.compressed, "original": session.original}
    for side, model in loaded.items():
        chat = session.chats.get(side)
        if model is not None and (chat is None or chat.model is not model.model):
            session.chats[side] = ChatSession(model.model, model.tokenizer, max_new_tokens=int(max_new_tokens))
        if model is not None:
            session.chats[side].max_new_tokens = int(max_new_tokens)
    streams = {side: session.chats[side].stream_reply(message) for side in SIDES if side in session.chats}
    replies = {side: "" for side in streams}
    empty = TINY_EMPTY_REPLY if is_tiny(session) else EMPTY_REPLY
    while streams:
        for side in list(streams):
            try:
                replies[side] += next(streams[side])
            except StopIteration:
                del streams[side]
        yield tuple(_history(session.chats.get(side), (message, replies[side]) if side in streams else None, empty)
                    for side in SIDES)  # type: ignore[misc]
    yield tuple(_history(session.chats.get(side), empty=empty) for side in SIDES)  # type: ignore[misc]


def clear(session: Session) -> tuple[list, list]:
    """Forget both conversations (the models stay loaded)."""
    session.chats = {}
    return [], []


def render(session_state, visitors: Visitors | None = None):
    """Lay out the Chat tab and wire it; returns the sizes line (refreshed when a job ends)."""
    import gradio as gr

    visitors = Visitors() if visitors is None else visitors

    sizes = gr.Markdown(elem_id="chat-sizes")
    with gr.Row():
        left = gr.Chatbot(label="Compressed model", height=380, elem_id="chat-compressed")
        right = gr.Chatbot(label="Original model", height=380, elem_id="chat-original")
    with gr.Row():
        message = gr.Textbox(placeholder="Ask both models, e.g. 'Amy has 12 apples and buys 7 more. How many now?'",
                             show_label=False, scale=5, elem_id="chat-input")
        send = gr.Button("Send", variant="primary", scale=1, elem_id="chat-send")
    with gr.Row():
        max_tokens = gr.Slider(8, 256, value=64, step=8, label="max new tokens")
        clear_button = gr.Button("Clear", size="sm")
    with gr.Accordion("Load a saved compressed model", open=False):
        folder = gr.Textbox(label="Folder written by the Compress tab's 'Save to folder' (or by `bsi compress`)")
        load_button = gr.Button("Load", size="sm")

    @with_request
    def on_send(request, session, text, tokens):
        visitors.register(session_hash_of(request), session)
        try:
            for histories in respond(session, text, tokens):
                yield histories[0], histories[1], sizes_text(session)
        except BSIError as err:
            yield gr.skip(), gr.skip(), f"**Error:** {in_app_words(str(err))}"

    @with_request
    def on_load(request, session, path):
        visitors.register(session_hash_of(request), session)
        try:
            return load_folder(session, path), [], []
        except BSIError as err:
            return f"**Error:** {in_app_words(str(err))}", gr.skip(), gr.skip()

    send.click(on_send, [session_state, message, max_tokens], [left, right, sizes], concurrency_limit=4,
               api_name="chat").then(lambda: "", None, message)
    message.submit(on_send, [session_state, message, max_tokens], [left, right, sizes], concurrency_limit=4
                   ).then(lambda: "", None, message)
    clear_button.click(clear, session_state, [left, right])
    load_button.click(on_load, [session_state, folder], [sizes, left, right], concurrency_limit=1)
    return sizes
