"""Chat tab: the compressed model and its dense reference side by side, streaming; a prompts file, marked.

Both models answer the same message greedily (so a difference comes from the
weights, not from sampling). Their replies stream at once: the two
:meth:`bsi.chat.ChatSession.stream_reply` generators, each generating in its
own thread, are read in turn, and every new piece updates both panels.
:func:`prompts_table` runs a whole prompts file through both models at once
and marks each answer against the prompt's answer, as a run's evaluation does.

The models come from the session: the last finished run of the Compress tab
(the reference being the dense model just before compression, i.e. the run's
fine-tuned model), or a run folder loaded here, whose reference is again the
run's own fine-tuned dense model, found in the fine-tune cache by the run's
configuration (:func:`run_reference`); when it cannot be found the source
model stands in and the page says it is not fine-tuned. Chat takes no part
in the server's job board, so it works whether or not a compression is running.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from bsi.app.answers import final_number, mark
from bsi.app.format import in_app_words, number_text
from bsi.app.state import LoadedModel, Session, Visitors, session_hash_of, with_request
from bsi.chat import ChatSession
from bsi.errors import BSIError
from bsi.method.surgery import model_parameters
from bsi.models import TINY_MODEL
from bsi.pipeline.export import read_meta

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
        parts.append(f"{session.original.label}: {session.original.params:,} parameters "
                     f"({number_text(ratio)}x larger)")
    text = " · ".join(parts)
    return f"{text}\n\n{TINY_NOTE}" if is_tiny(session) else text


def run_reference(meta: dict, folder: Path) -> tuple[str | None, str]:
    """Where the fair reference of the run in ``folder`` is: (model spec or None, what the page says about it).

    The fair reference is the run's own fine-tuned dense model: the model the
    run compressed, with the same task training. The pipeline caches it under
    a hash of its inputs (:func:`bsi.pipeline.runner.finetune_cache_key`), so
    the run's configuration (``bsi_config.json``'s ``settings``) finds it
    again. A run that skipped the fine-tune compressed the source model
    itself, which is then the reference; without the configuration, or with
    the fine-tune no longer cached, the source model stands in and the page
    says it is not fine-tuned.
    """
    import json

    import torch

    from bsi.config import PipelineConfig
    from bsi.models import resolve_autocast, resolve_device, resolve_dtype
    from bsi.pipeline.runner import finetune_cache_folder, finetune_cache_key, saved_run_finetune_key

    source = meta.get("source_model")
    settings = meta.get("settings")
    if not isinstance(settings, dict):
        return source, (f"reference: the source model `{source}`, **not fine-tuned** (this folder does not record its "
                        "run's settings, so its fine-tuned dense model cannot be found): not an equal reference")
    try:
        config = PipelineConfig.from_dict(settings)
    except (BSIError, TypeError, ValueError) as err:
        raise BSIError(f"'{folder}': its bsi_config.json settings are not a run configuration ({err})") from None
    if config.skip_finetune or config.finetune.steps == 0:
        return config.model, f"reference: the source model `{config.model}` (the run compressed it without a fine-tune)"
    summary_file, summary = folder / "summary.json", {}
    if summary_file.is_file():
        try:
            summary = json.loads(summary_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            summary = {}
    if isinstance(summary, dict) and isinstance(summary.get("dtype"), str) and hasattr(torch, summary["dtype"]):
        key = saved_run_finetune_key(config, summary)
    else:  # no summary (yet): the precision the configuration resolves to here
        device = resolve_device(config.device)
        dtype = resolve_dtype(config.dtype, device)
        key = finetune_cache_key(config, dtype, resolve_autocast(config.autocast, dtype))
    cached = finetune_cache_folder(key)
    if (cached / "config.json").is_file():
        return str(cached), "reference: **the run's fine-tuned dense model** (the model it compressed, from the fine-tune cache)"
    return source, (f"reference: the source model `{source}`, **not fine-tuned**: the run's fine-tuned dense model is "
                    f"not in this machine's cache (`{cached}`); run `bsi compress` once with the run's settings to "
                    "cache it, then load again for an equal reference")


def load_folder(session: Session, folder: str) -> str:
    """Load a compressed run folder (``bsi compress --out``, or *Save to folder*) and its reference into the session.

    The reference is the run's fine-tuned dense model when it can be found
    (:func:`run_reference`); the sizes line says which model it is.
    """
    from bsi.models import load_model_and_tokenizer

    if session.closed:
        raise BSIError("this session has ended; reload the page")
    folder = (folder or "").strip()
    if not folder:
        raise BSIError("type the folder of a compressed model (one the Compress tab's 'Save to folder' or "
                       "`bsi compress` wrote)")
    path = Path(folder).expanduser()
    if not path.is_dir():
        raise BSIError(f"'{folder}' is not a folder: type the folder a run saved its compressed model to")
    meta = read_meta(path)
    spec, said = run_reference(meta, path)
    model, tokenizer = load_model_and_tokenizer(str(path))
    session.compressed = LoadedModel(model, tokenizer, "compressed", model_parameters(model),
                                     source=meta.get("source_model") or "")
    session.original = None
    if spec:
        original, original_tok = load_model_and_tokenizer(spec)
        session.original = LoadedModel(original, original_tok, said, model_parameters(original), source=spec)
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


PROMPTS_FILE = "examples/prompts.jsonl"
"""The prompts file Chat proposes: the repository's own, with an answer to mark each reply against."""


def default_prompts_file() -> str:
    """:data:`PROMPTS_FILE` of this checkout (so it is found whatever folder the app was started in)."""
    from bsi.shipped import DATA

    path = DATA.parent / PROMPTS_FILE
    return str(path) if path.is_file() else PROMPTS_FILE
PROMPT_HEADERS = ["#", "prompt", "task's answer", "compressed answer", "compressed", "reference answer", "reference"]


def prompt_examples(path: str) -> list[tuple[str, str | None]]:
    """(question, answer or None) per prompt of a prompts file, checked as ``bsi compare`` checks it.

    :func:`bsi.analysis.compare.read_marked_prompts` reads it: a line's
    ``answer``, when it has one, must end with the number it is marked
    against (``"... #### 42"`` or ``"42"``), else a one-line error names the line.
    """
    from bsi.analysis.compare import read_marked_prompts

    return [(prompt.text, prompt.answer) for prompt in read_marked_prompts(path)]


def prompts_table(session: Session, path: str, max_new_tokens: int = 96) -> Iterator[tuple[str, list[list]]]:
    """Answer every prompt of ``path`` with both loaded models, greedily; yields (status line, marked rows).

    Both models answer with the task's prompt format and are marked as a
    run's evaluation marks them (:func:`bsi.pipeline.evaluate.evaluate`: the
    final number against the prompt's answer); a prompt without an answer is
    answered and left unmarked. The status line names the reference.
    """
    from bsi.data import Example
    from bsi.pipeline.evaluate import evaluate

    path = (path or "").strip() or default_prompts_file()
    prompts = prompt_examples(path)  # the file first: its errors need no model
    if session.compressed is None:
        raise BSIError("no compressed model yet: run a compression first, or load a saved folder")
    if session.chatting:
        raise BSIError("a reply is still streaming in this tab: wait for it to finish, then run the prompts")
    examples = [Example(question, answer or "") for question, answer in prompts]
    sides = [("compressed", session.compressed), ("reference", session.original)]
    session.chatting = True
    try:
        answered: dict[str, list] = {}
        for name, loaded in sides:
            if loaded is None:
                continue
            yield f"Answering {len(examples)} prompts with the {name} model…", []
            outcomes = evaluate(loaded.model, loaded.tokenizer, examples, max_new_tokens=int(max_new_tokens),
                                batch_size=8).outcomes
            answered[name] = [(o.prediction or "", o.correct if answer else None)
                              for o, (_, answer) in zip(outcomes, prompts)]
    finally:
        session.chatting = False
    rows = []
    for i, (question, answer) in enumerate(prompts):
        cells = [i, question, final_number(answer)]
        for name, _ in sides:
            text, correct = answered.get(name, [("", None)] * len(prompts))[i]
            cells += [text, mark(correct)]
        rows.append(cells)
    marked = sum(answer is not None for _, answer in prompts)
    right = ", ".join(f"{name} {sum(bool(c) for _, c in answered[name])}/{marked}" for name, _ in sides
                      if name in answered)
    reference = session.original.label if session.original is not None else "no reference model loaded"
    yield (f"{len(prompts)} prompts of `{Path(path).name}`, {marked} with an answer · right: "
           f"{right} · {reference}"), rows


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
        right = gr.Chatbot(label="Reference: dense model (the sizes line says which)", height=380,
                           elem_id="chat-original")
    with gr.Row():
        message = gr.Textbox(placeholder="Ask both models, e.g. 'Amy has 12 apples and buys 7 more. How many now?'",
                             show_label=False, scale=5, elem_id="chat-input")
        send = gr.Button("Send", variant="primary", scale=1, elem_id="chat-send")
    with gr.Row():
        max_tokens = gr.Slider(8, 256, value=64, step=8, label="max new tokens")
        clear_button = gr.Button("Clear", size="sm")
    with gr.Accordion("Load a saved compressed model", open=False):
        folder = gr.Textbox(label="Folder written by the Compress tab's 'Save to folder' (or by `bsi compress`); "
                                  "the reference becomes that run's fine-tuned dense model", elem_id="chat-folder")
        load_button = gr.Button("Load", size="sm", elem_id="chat-load")
    gr.Markdown("**A whole prompts file through both models at once**, each answer marked against the prompt's "
                "answer (greedy, the task's prompt format, as a run's evaluation).")
    with gr.Row():
        prompts_path = gr.Textbox(value=default_prompts_file(), label="Prompts file (.jsonl: question, answer)", scale=4,
                                  elem_id="chat-prompts-file")
        prompts_button = gr.Button("Answer every prompt with both", scale=1, elem_id="chat-prompts-run")
    prompts_status = gr.Markdown(elem_id="chat-prompts-status")
    prompts_frame = gr.Dataframe(headers=PROMPT_HEADERS, value=[], interactive=False, wrap=True, max_height=600,
                                 label="Both models' answers, marked", elem_id="chat-prompts-table",
                                 column_widths=["4%", "30%", "7%", "23%", "6%", "24%", "6%"])

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
    @with_request
    def on_prompts(request, session, path, tokens):
        visitors.register(session_hash_of(request), session)
        try:
            for status, rows in prompts_table(session, path, max(int(tokens), 96)):
                yield status, {"data": rows, "headers": PROMPT_HEADERS}
        except BSIError as err:
            yield f"**Error:** {in_app_words(str(err))}", {"data": [], "headers": PROMPT_HEADERS}

    prompts_button.click(on_prompts, [session_state, prompts_path, max_tokens], [prompts_status, prompts_frame],
                         concurrency_limit=1, api_name="prompts")
    clear_button.click(clear, session_state, [left, right])
    load_button.click(on_load, [session_state, folder], [sizes, left, right], concurrency_limit=1)
    return sizes
