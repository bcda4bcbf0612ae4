"""The OpenAI-compatible request and response bodies of `dllm-bench server`, as pydantic models.

Requests follow OpenAI's `/v1/completions` and `/v1/chat/completions` plus the diffusion knobs
of LLaDA's `generate` (`block_length`, `steps`, `remasking`), the engine's parallel decoding
(`threshold`, `factor`, `entropy`: at most one, engine.decoding) and vLLM's `return_token_ids`. Unknown fields are rejected, as OpenAI's API does, so a misspelt knob is an
error rather than a silently ignored option; so is a field of the wrong JSON type (strict models); OpenAI fields the engine cannot honour are accepted
only at their neutral value (docs/SERVER.md).
"""
from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from engine.decoding import Decoding

# OpenAI's default for /v1/completions; rounded up to whole blocks like every max_tokens.
DEFAULT_MAX_TOKENS = 16
DECODING_FIELDS = ("threshold", "factor", "entropy")


class _Body(BaseModel):
    # strict: a field of the wrong JSON type is a 400, never coerced ("0.5" is no temperature, true
    # no max_tokens); an integer is still a number where the API takes a float (OpenAI's too).
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None
    max_tokens: int | None = None
    temperature: float = Field(0.0, ge=0)
    seed: int | None = Field(None, ge=0)
    stream: bool = False
    stream_options: dict[str, Any] | None = None   # usage always ends a stream (include_usage)
    user: str | None = None
    # OpenAI knobs the engine has no counterpart for: accepted at their neutral value only.
    n: int = 1
    top_p: float | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    # dLLM extras (LLaDA's generate arguments); None = the server's defaults.
    block_length: int | None = Field(None, gt=0)
    steps: int | None = Field(None, gt=0)
    remasking: Literal["low_confidence", "random"] = "low_confidence"
    # Parallel decoding (engine.decoding), at most one; none = the fixed schedule over `steps`.
    threshold: float | None = Field(None, gt=0, le=1, allow_inf_nan=False,
                                    description="commit every position whose confidence is >= τ (and the best)")
    factor: float | None = Field(None, gt=0, allow_inf_nan=False, description="Fast-dLLM's factor rule")
    entropy: float | None = Field(None, ge=0, allow_inf_nan=False,
                                  description="commit in confidence order while the summed entropy stays <= γ")
    return_token_ids: bool = False

    @model_validator(mode="after")
    def _neutral(self) -> _Body:
        for name, neutral in (("n", (1,)), ("top_p", (None, 1)), ("stop", (None, [])),
                              ("presence_penalty", (None, 0)), ("frequency_penalty", (None, 0))):
            if getattr(self, name) not in neutral:
                raise ValueError(f"{name} is not supported by this server (only {neutral[-1]!r})")
        return self

    @model_validator(mode="after")
    def _one_rule(self) -> _Body:
        given = [k for k in DECODING_FIELDS if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"{' and '.join(given)} are parallel-decoding rules: give one")
        return self

    def decoding(self) -> Decoding:
        """The engine.decoding policy the body asks for (fixed when none; ValueError if out of range)."""
        for k in DECODING_FIELDS:
            v = getattr(self, k)
            if v is not None:
                return Decoding.parse(f"{k}:{v!r}")
        return Decoding()

    def gen_max_tokens(self) -> int:
        return DEFAULT_MAX_TOKENS if self.max_tokens is None else self.max_tokens


class CompletionRequest(_Body):
    # OpenAI's four prompt shapes; a list of prompts is a batch, one choice per prompt.
    prompt: str | list[int] | list[str] | list[list[int]] = Field(
        ..., description="text, token ids, or a list of either (one choice each)")
    echo: Literal[False] = False
    logprobs: None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_shape(cls, v: Any) -> Any:
        def ids(x: Any) -> bool:
            return isinstance(x, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in x)
        if isinstance(v, str) or ids(v):
            return v
        if isinstance(v, list) and (all(isinstance(p, str) for p in v) or all(ids(p) for p in v)):
            return v
        raise ValueError("prompt must be a string, a list of token ids, a list of strings or a list of "
                         "token-id lists (not mixed)")

    def prompts(self) -> list[str | list[int]]:
        """The prompts of the request in choice order (a single prompt is a batch of one)."""
        p = self.prompt
        if isinstance(p, str) or not p or isinstance(p[0], int):
            return [p]
        return list(p)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]]
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        parts = []
        for p in self.content:
            if p.get("type") != "text" or not isinstance(p.get("text"), str):
                raise ValueError("only text content parts are supported")
            parts.append(p["text"])
        return "".join(parts)


class ChatCompletionRequest(_Body):
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_completion_tokens: int | None = None
    logprobs: Literal[False] | None = None

    def gen_max_tokens(self) -> int:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return super().gen_max_tokens()


# ---------------------------------------------------------------- responses (plain dicts)
def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: int | None = None) -> dict:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def choice(chat: bool, text: str, finish_reason: str | None, token_ids: list[int] | None,
           delta: bool, first: bool = False, index: int = 0) -> dict:
    """One choice of a response (delta=False) or of a stream chunk (delta=True); `index` is its
    prompt's place in the request."""
    c: dict[str, Any] = {"index": index}
    if not chat:
        c.update(text=text, logprobs=None)
    elif delta:
        c["delta"] = {"role": "assistant", "content": text} if first else {"content": text}
        c["logprobs"] = None
    else:
        c["message"] = {"role": "assistant", "content": text}
        c["logprobs"] = None
    c["finish_reason"] = finish_reason
    if token_ids is not None:
        c["token_ids"] = token_ids
    return c


def envelope(chat: bool, rid: str, model: str, created: int, *, chunk: bool, choices: list[dict],
             **extra: Any) -> dict:
    obj = ("chat.completion.chunk" if chunk else "chat.completion") if chat else "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": choices, **extra}


def model_card(name: str, root: str, max_model_len: int) -> dict:
    return {"id": name, "object": "model", "created": int(time.time()), "owned_by": "dllm-bench",
            "root": root, "max_model_len": max_model_len}
