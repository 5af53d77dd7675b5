"""OpenAI-compatible request schemas and response shapes.

Requests are validated strictly: a wrong type is an error, not a coercion, and an unknown field
is refused rather than silently ignored, because it would most likely have changed the output
(a misspelt ``temprature``). OpenAI fields that Celeris does not implement are accepted only at
their neutral value. The diffusion knobs ride along as extra body fields (the SDK's
``extra_body``). Schemas only: reading bodies and mapping them onto GenerationParams is in
``bodies.py``, response shapes in ``shaping.py``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from .errors import invalid
from .structured import structured_of

# Request fields that map 1:1 onto GenerationParams fields (every one but ``stop``, whose
# request form may be a single string): the one body schema of the routes and batch jobs.
KNOBS = ("gen_length", "temperature", "top_p", "top_k", "seed", "steps", "block_length",
         "decoding", "threshold", "factor", "remasking", "cache", "cfg_scale", "suppress_eos",
         "defer_eos", "early_stop", "first_token", "edit_threshold", "max_post_edit_steps",
         "confidence_dtype")
LENGTH_FIELDS = ("max_tokens", "max_completion_tokens", "gen_length")
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
    gen_length: int | None = None          # GenerationParams' name for max_tokens
    first_token: str | None = None
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
    edit_threshold: float | None = None
    max_post_edit_steps: int | None = None
    confidence_dtype: str | None = None
    celeris_denoise_events: bool = False   # also stream canvas snapshots (SSE extension)
    # structured output (server/structured.py): OpenAI's, and vLLM's extra-body spellings
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
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

    def generation_fields(self) -> dict[str, Any]:
        """The request_params fields of this request (None: not given)."""
        fields: dict[str, Any] = {k: getattr(self, k) for k in KNOBS}
        fields.update(max_tokens=self.max_tokens, stop=self.stop,
                      max_completion_tokens=getattr(self, "max_completion_tokens", None),
                      structured=structured_of(self)[0])
        return fields

    def length_field(self) -> str | None:
        """The name under which the request gave its length cap, if it did."""
        return next((k for k in LENGTH_FIELDS if getattr(self, k, None) is not None), None)

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
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | None = None
    parallel_tool_calls: bool | None = None

    def to_prompt(self) -> list[dict[str, str]]:
        if not self.messages:
            raise invalid("messages must be a non-empty list of {role, content} objects",
                          "messages")
        out = []
        for i, m in enumerate(self.messages):
            role = "system" if m.role == "developer" else m.role
            content = m.content if isinstance(m.content, str) or m.content is None else \
                "".join(part.text for part in m.content)
            if content is None:
                raise invalid(f"messages[{i}].content is required", f"messages[{i}].content")
            out.append({"role": role, "content": content})
        return out
