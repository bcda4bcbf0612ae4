"""Text in and out of the server: prompts (text, token ids, chat messages) to token ids with the
checkpoint's tokenizer, and generated blocks back to text, incrementally for streaming."""
from __future__ import annotations

from typing import Any


class PromptError(ValueError):
    """A prompt the server cannot turn into token ids (HTTP 400)."""


def prompt_ids(tokenizer: Any, prompt: str | list[int]) -> list[int]:
    if isinstance(prompt, list):
        return list(prompt)
    if tokenizer is None:
        raise PromptError("this model has no tokenizer: send the prompt as a list of token ids")
    return list(tokenizer(prompt, add_special_tokens=False)["input_ids"])


def chat_ids(tokenizer: Any, messages: list[dict]) -> list[int]:
    """The chat template with the generation prompt, tokenized (as `generate --chat` does)."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise PromptError("this model has no chat template: use /v1/completions")
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


class Detokenizer:
    """Text of the tokens so far, handed out as deltas whose concatenation is the text of all
    tokens. Each delta is the new suffix of decode(all tokens): a block boundary can split a
    word piece or a UTF-8 sequence, so blocks are not decoded on their own, and a trailing
    replacement character (a sequence cut in half) is held back until the next block."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.emitted = ""

    def decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def add(self, ids: list[int], final: bool = False) -> str:
        self.ids.extend(ids)
        text = self.decode(self.ids)
        if not final:
            text = text.rstrip("\ufffd")
        if not text.startswith(self.emitted):  # a re-segmented boundary: send only what is new
            common = 0
            for a, b in zip(text, self.emitted):
                if a != b:
                    break
                common += 1
            self.emitted = self.emitted[:common]
        delta = text[len(self.emitted):]
        self.emitted += delta
        return delta
