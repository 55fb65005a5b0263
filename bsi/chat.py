"""Streaming chat with a (compressed or original) model, for the terminal and the app.

Generation is greedy, so the same prompt gives the same answer, which is what
a side-by-side comparison of models needs.
"""

from __future__ import annotations

from collections.abc import Iterator
from threading import Thread
from typing import Any

import torch
from transformers import TextIteratorStreamer

from bsi.errors import BSIError


def chat_prompt(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    """The conversation as the model expects it (its chat template, else plain turns)."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    turns = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
    return "\n".join(turns) + "\nAssistant:"


def context_length(model: Any) -> int:
    """The longest sequence the model accepts (``max_position_embeddings``), or 2048."""
    return int(getattr(model.config, "max_position_embeddings", 2048) or 2048)


class ChatSession:
    """One conversation with one model: history plus greedy streaming replies."""

    def __init__(self, model: Any, tokenizer: Any, max_new_tokens: int = 128) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.history: list[dict[str, str]] = []

    def encode(self, message: str) -> dict[str, torch.Tensor]:
        """Validate ``message`` and encode history + message; raises BSIError for bad input."""
        if not message or not message.strip():
            raise BSIError("empty message: type something to send")
        prompt = chat_prompt(self.tokenizer, self.history + [{"role": "user", "content": message}])
        # a chat template writes its own special tokens; plain turns get the tokenizer's (Gemma's <bos>: without it
        # the base model degenerates)
        inputs = self.tokenizer(prompt, return_tensors="pt",
                                add_special_tokens=not getattr(self.tokenizer, "chat_template", None))
        limit = context_length(self.model) - self.max_new_tokens
        if inputs["input_ids"].shape[1] > limit:
            raise BSIError(
                f"message too long: the conversation is {inputs['input_ids'].shape[1]} tokens and this model "
                f"takes {limit} before its reply; shorten the message or start a new chat"
            )
        device = next(self.model.parameters()).device
        return {k: v.to(device) for k, v in inputs.items()}

    def stream_reply(self, message: str) -> Iterator[str]:
        """Yield the reply in pieces as they are generated; the history is updated at the end."""
        inputs = self.encode(message)
        streamer = TextIteratorStreamer(self.tokenizer, skip_prompt=True, skip_special_tokens=True)
        kwargs = dict(**inputs, streamer=streamer, max_new_tokens=self.max_new_tokens, do_sample=False,
                      pad_token_id=self.tokenizer.pad_token_id)
        errors: list[BaseException] = []

        def target() -> None:
            try:
                with torch.inference_mode():
                    self.model.generate(**kwargs)
            except BaseException as err:  # re-raised in the caller's thread
                errors.append(err)
                streamer.end()

        thread = Thread(target=target, daemon=True)
        thread.start()
        reply = ""
        for piece in streamer:
            reply += piece
            yield piece
        thread.join()
        if errors:
            raise errors[0]
        self.history += [{"role": "user", "content": message}, {"role": "assistant", "content": reply.strip()}]

    def reply(self, message: str) -> str:
        """The whole reply at once."""
        return "".join(self.stream_reply(message))
