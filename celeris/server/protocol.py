"""OpenAI-compatible request schemas and response shapes.

Requests are validated strictly: a wrong type is an error, not a coercion, and an unknown field
is refused rather than silently ignored, because it would most likely have changed the output
(a misspelt ``temprature``). OpenAI fields that Celeris does not implement are accepted only at
their neutral value. The diffusion knobs ride along as extra body fields (the SDK's
``extra_body``); ``max_tokens`` becomes ``gen_length``, rounded up to a whole block.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from ..outputs import GenerationResult, StepEvent
from ..params import MAX_GEN_LENGTH, GenerationParams
from .errors import APIError, invalid, param_of

# Request fields that map 1:1 onto GenerationParams fields.
KNOBS = ("temperature", "top_p", "top_k", "seed", "steps", "block_length", "decoding",
         "threshold", "factor", "remasking", "cache", "cfg_scale", "suppress_eos",
         "defer_eos", "early_stop")
# OpenAI fields Celeris does not implement, with the value that means "off".
NEUTRAL: dict[str, Any] = {"n": 1, "presence_penalty": 0, "frequency_penalty": 0,
                           "logit_bias": {}, "logprobs": False, "echo": False, "best_of": 1,
                           "suffix": None, "top_logprobs": 0, "tools": [],
                           "tool_choice": "none"}
# Messages for fields whose type is a union (pydantic would report every member).
TYPE_HINTS = {"prompt": "a string, a list holding one string, or a list of token ids",
              "stop": "a string or a list of strings",
              "content": "a string or a list of {type: text, text} parts"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    include_usage: bool = False


class _Knobs(_Strict):
    model: str | None = None
    max_tokens: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    # diffusion knobs (extra_body)
    steps: int | None = None
    block_length: int | None = None
    decoding: str | None = None
    threshold: float | None = None
    factor: float | None = None
    remasking: str | None = None
    cache: str | None = None
    cfg_scale: float | None = None
    suppress_eos: bool | None = None
    defer_eos: bool | None = None
    early_stop: bool | None = None
    celeris_denoise_events: bool = False   # also stream canvas snapshots (SSE extension)
    # accepted and ignored: they do not change the output
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    # accepted only at their neutral value
    n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None

    def check_neutral(self) -> None:
        for name, neutral in NEUTRAL.items():
            value = getattr(self, name, None)
            if value is None or value == neutral or (not neutral and not value):
                continue
            raise invalid(f"{name}={value!r} is not supported by this server (only "
                          f"{neutral!r})", name, "unsupported_parameter")


class CompletionRequest(_Knobs):
    prompt: str | list[str] | list[int]
    echo: bool | None = None
    best_of: int | None = None
    suffix: str | None = None
    logprobs: int | None = None

    def to_prompt(self) -> str | list[int]:
        prompt = self.prompt
        if isinstance(prompt, list):
            if not prompt:
                raise invalid("prompt must not be empty", "prompt")
            if isinstance(prompt[0], str):
                if len(prompt) != 1:
                    raise invalid(f"only one prompt per request is supported, got "
                                  f"{len(prompt)}", "prompt")
                prompt = prompt[0]
        if prompt == "":
            raise invalid("prompt must not be empty", "prompt")
        return prompt


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: str
    content: str | list[TextPart] | None = None
    name: str | None = None


class ChatCompletionRequest(_Knobs):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    response_format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | None = None
    parallel_tool_calls: bool | None = None

    def to_prompt(self) -> list[dict[str, str]]:
        if not self.messages:
            raise invalid("messages must be a non-empty list of {role, content} objects",
                          "messages")
        fmt = (self.response_format or {}).get("type", "text")
        if fmt != "text":
            raise invalid(f"response_format type {fmt!r} is not supported (only 'text')",
                          "response_format", "unsupported_parameter")
        out = []
        for i, m in enumerate(self.messages):
            role = "system" if m.role == "developer" else m.role
            content = m.content if isinstance(m.content, str) or m.content is None else \
                "".join(part.text for part in m.content)
            if content is None:
                raise invalid(f"messages[{i}].content is required", f"messages[{i}].content")
            out.append({"role": role, "content": content})
        return out


def parse(model: type[_Knobs], body: Any) -> _Knobs:
    """Validate a decoded JSON body; every failure is a 400 naming the parameter."""
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object", None, "invalid_json")
    try:
        request = model.model_validate(body)
    except ValidationError as exc:
        raise _validation_error(exc) from None
    alias = getattr(request, "max_completion_tokens", None)
    if request.max_tokens is None and alias is not None:
        request.max_tokens = alias
    request.check_neutral()
    return request


def _validation_error(exc: ValidationError) -> APIError:
    err = exc.errors()[0]
    names = _field_names()   # loc also holds union members ("str", "list[int]"): drop them
    path = [p for p in err["loc"] if isinstance(p, int) or p in names or
            err["type"] == "extra_forbidden"]
    param = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")
    if err["type"] == "extra_forbidden":
        return invalid(f"unknown parameter {param!r}: not supported by this server", param,
                       "unknown_parameter")
    if err["type"] == "missing":
        return invalid(f"{param} is required", param, "missing_required_parameter")
    field = next((p for p in reversed(path) if isinstance(p, str)), "")
    if field in TYPE_HINTS:
        return invalid(f"{param} must be {TYPE_HINTS[field]}", param, "invalid_type")
    return invalid(f"{param}: {err['msg']}", param, "invalid_type")


def _field_names() -> set[str]:
    models = (CompletionRequest, ChatCompletionRequest, ChatMessage, TextPart, StreamOptions)
    return {name for m in models for name in m.model_fields}


# ----------------------------------------------------------------------- knobs -> params
def to_params(req: _Knobs, defaults: GenerationParams) -> GenerationParams:
    """GenerationParams for a request: the model's defaults, overridden by the body."""
    changes: dict[str, Any] = {k: getattr(req, k) for k in KNOBS if getattr(req, k) is not None}
    if req.stop is not None:
        changes["stop"] = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop)
    if req.max_tokens is not None and not 1 <= req.max_tokens <= MAX_GEN_LENGTH:
        raise invalid(f"max_tokens must be in [1, {MAX_GEN_LENGTH}], got {req.max_tokens}",
                      "max_tokens")
    bl = changes.get("block_length", defaults.block_length)
    if isinstance(bl, int) and bl >= 1:
        wanted = req.max_tokens if req.max_tokens is not None else defaults.gen_length
        changes["gen_length"] = min(-(-wanted // bl) * bl, max(bl, MAX_GEN_LENGTH // bl * bl))
        if "steps" not in changes and defaults.steps is not None:
            changes["steps"] = _scaled_steps(defaults, changes["gen_length"], bl)
    try:
        return GenerationParams.from_dict(changes, defaults)
    except ValueError as exc:
        raise invalid(str(exc), param_of(str(exc), "max_tokens")) from None


def _scaled_steps(defaults: GenerationParams, gen_length: int, bl: int) -> int:
    """Keep the default's tokens per step when max_tokens changes the canvas length."""
    blocks = gen_length // bl
    per_block = max(1, round(defaults.steps * gen_length / defaults.gen_length / blocks))
    return min(per_block, bl) * blocks


# ----------------------------------------------------------------------- responses
def usage(result: GenerationResult) -> dict[str, int]:
    return result.usage.to_dict()


def celeris_stats(result: GenerationResult) -> dict[str, Any]:
    """Diffusion-specific numbers, next to the OpenAI fields."""
    return {"nfe": result.nfe, "steps": result.steps, "seed": result.seed,
            "tokens_per_forward": round(result.tokens_per_forward, 4),
            "elapsed_s": round(result.timings.total_s, 6),
            "first_block_s": result.timings.first_block_s,
            "queue_s": round(result.timings.queue_s, 6)}


class Shapes:
    """Builds the response and chunk dicts of one request (completion or chat)."""

    def __init__(self, chat: bool, request_id: str, model: str) -> None:
        self.chat, self.model = chat, model
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{request_id}"
        self.created = int(time.time())

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def response(self, result: GenerationResult, finish: str) -> dict[str, Any]:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": result.text},
                      "logprobs": None, "finish_reason": finish}
            out = self._head("chat.completion")
        else:
            choice = {"index": 0, "text": result.text, "logprobs": None,
                      "finish_reason": finish}
            out = self._head("text_completion")
        return {**out, "choices": [choice], "usage": usage(result),
                "celeris": celeris_stats(result)}

    def chunk(self, text: str | None, finish: str | None = None, first: bool = False,
              include_usage: bool = False) -> dict[str, Any]:
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
            if text:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            out = self._head("chat.completion.chunk")
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
            out = self._head("text_completion")
        out["choices"] = [choice]
        if include_usage:
            out["usage"] = None
        return out

    def usage_chunk(self, result: GenerationResult) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._head(obj), "choices": [], "usage": usage(result),
                "celeris": celeris_stats(result)}

    def denoise(self, event: StepEvent) -> dict[str, Any]:
        """A canvas snapshot (the ``celeris.denoise`` SSE event)."""
        return {**self._head("celeris.denoise"), "choices": [], "step": event.step,
                "block": event.block, "block_length": event.block_length,
                "canvas": list(event.canvas), "mask_id": event.mask_id,
                "committed": list(event.committed),
                "confidences": [round(c, 5) for c in event.confidences],
                "nfe": event.nfe, "elapsed_s": round(event.elapsed, 6), "text": event.text}


def stable_text(text: str, stops: tuple[str, ...]) -> str:
    """The part of a committed-prefix text that later steps cannot change: without trailing
    U+FFFD (a UTF-8 character split across tokens) and without a tail that could still grow
    into a stop string (which would then be cut off)."""
    text = text.rstrip("\ufffd")
    hold = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), hold, -1):
            if text.endswith(stop[:k]):
                hold = k
                break
    return text[:len(text) - hold]

