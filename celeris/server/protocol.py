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
                           "suffix": None, "top_logprobs": 0}
ROLES = ("system", "developer", "user", "assistant", "tool")
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


class FunctionIn(_Strict):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCallIn(_Strict):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionIn


class FunctionDef(_Strict):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(_Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedChoice(_Strict):
    type: Literal["function"]
    function: dict[str, str]


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: str
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None      # an assistant turn's calls (history)
    tool_call_id: str | None = None                # a tool turn: the call it answers


class ChatCompletionRequest(_Knobs):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[ToolDef] | None = None
    tool_choice: str | NamedChoice | None = None
    parallel_tool_calls: bool | None = None

    def to_prompt(self) -> list[dict[str, Any]]:
        """The messages as the engine takes them; tool turns (an assistant's ``tool_calls``,
        ``role: tool`` results) keep their fields for the tool-call syntax to render."""
        if not self.messages:
            raise invalid("messages must be a non-empty list of {role, content} objects",
                          "messages")
        out: list[dict[str, Any]] = []
        called: set[str | None] = set()      # the call ids a tool turn may answer
        for i, m in enumerate(self.messages):
            role = "system" if m.role == "developer" else m.role
            if role not in ROLES:
                raise invalid(f"messages[{i}].role must be one of {', '.join(ROLES)}, "
                              f"got {m.role!r}", f"messages[{i}].role")
            if role == "tool" and not (called and (m.tool_call_id in called
                                                   or m.tool_call_id is None)):
                raise invalid(f"messages[{i}] is a tool result that answers no earlier "
                              f"assistant tool call (tool_call_id {m.tool_call_id!r})",
                              f"messages[{i}].role")
            called |= {c.id for c in m.tool_calls or []}
            content = m.content if isinstance(m.content, str) or m.content is None else \
                "".join(part.text for part in m.content)
            message: dict[str, Any] = {"role": role, "content": content}
            if m.tool_calls:
                if role != "assistant":
                    raise invalid(f"messages[{i}].tool_calls is only allowed on an assistant "
                                  f"message, got role {role!r}", f"messages[{i}].tool_calls")
                message["tool_calls"] = [c.model_dump() for c in m.tool_calls]
            elif content is None:
                raise invalid(f"messages[{i}].content is required", f"messages[{i}].content")
            if role == "tool":
                message["tool_call_id"] = m.tool_call_id
            out.append(message)
        return out

    def tool_choice_name(self) -> str | None:
        """tool_choice as one string: none, auto, required or the named function."""
        choice = self.tool_choice
        if choice is None or isinstance(choice, str):
            if choice not in (None, "none", "auto", "required"):
                raise invalid(f"tool_choice must be 'none', 'auto', 'required' or "
                              f"{{type: function, function: {{name}}}}, got {choice!r}",
                              "tool_choice")
            return choice
        name = choice.function.get("name")
        if not name:
            raise invalid("tool_choice.function.name is required", "tool_choice.function.name")
        return name
