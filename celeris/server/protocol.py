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
# request form may be a single string; ``logit_bias``'s string keys become token ids in
# request_params): the one body schema of the routes and batch jobs.
KNOBS = ("gen_length", "temperature", "top_p", "top_k", "seed", "steps", "block_length",
         "decoding", "threshold", "factor", "remasking", "cache", "cfg_scale", "suppress_eos",
         "defer_eos", "early_stop", "first_token", "edit_threshold", "max_post_edit_steps",
         "confidence_dtype", "logit_bias", "presence_penalty", "frequency_penalty")
LENGTH_FIELDS = ("max_tokens", "max_completion_tokens", "gen_length")
# Fields a batch-job line takes only at the value that means "off" (one answer per line,
# no scores): the HTTP routes take them all.
BATCH_NEUTRAL: dict[str, Any] = {"n": 1, "logprobs": False, "echo": False, "best_of": 1,
                                 "suffix": None, "top_logprobs": 0}
MAX_N = 64              # samples per prompt (n, best_of)
MAX_CHOICES = 128       # prompts x samples in one request
MAX_COMPLETION_LOGPROBS = 20
ROLES = ("system", "developer", "user", "assistant", "tool")
# Messages for fields whose type is a union (pydantic would report every member).
TYPE_HINTS = {"prompt": "a string, a list of token ids, or a list of either (a batch)",
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
    logit_bias: dict[str, float] | None = None     # token id (as a string) -> [-100, 100]
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
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
    n: int | None = None                   # samples per prompt (sample i: seed + i)

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
        """Batch jobs: the fields of BATCH_NEUTRAL only at their neutral value."""
        for name, neutral in BATCH_NEUTRAL.items():
            value = getattr(self, name, None)
            if value is None or value == neutral or (not neutral and not value):
                continue
            raise invalid(f"{name}={value!r} is not supported in a batch job (only "
                          f"{neutral!r}: one answer per line)", name, "unsupported_parameter")

    def samples(self) -> tuple[int, int]:
        """(n, samples to draw): best_of (completions) draws more and keeps the n best."""
        n = 1 if self.n is None else _count("n", self.n, 1, MAX_N)
        best_of = getattr(self, "best_of", None)
        if best_of is None:
            return n, n
        drawn = _count("best_of", best_of, n, MAX_N)
        if drawn > n and self.stream:
            raise invalid("best_of > n cannot be streamed (the best are known only at the "
                          "end)", "best_of")
        return n, drawn

    def top_logprobs_asked(self) -> int | None:
        """None: no log-probabilities; k: each token's and its k best alternatives'."""
        return None


class CompletionRequest(_Knobs):
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool | None = None
    best_of: int | None = None
    suffix: str | None = None
    logprobs: int | None = None

    def to_prompt(self) -> str | list[int]:
        """The one prompt of a request that gives one (batch-job lines)."""
        prompts = self.to_prompts()
        if len(prompts) != 1:
            raise invalid(f"a batch-job line takes one prompt, got {len(prompts)}", "prompt")
        return prompts[0]

    def to_prompts(self) -> list[str | list[int]]:
        """The request's prompts, as OpenAI reads ``prompt``: a string, a list of token ids,
        or a list of strings or of token-id lists (a batch: one choice per prompt)."""
        prompt = self.prompt
        if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
            prompts = [prompt]
        else:
            prompts = list(prompt)
        if not prompts:
            raise invalid("prompt must not be empty", "prompt")
        for i, p in enumerate(prompts):
            if not p:
                where = "prompt" if len(prompts) == 1 else f"prompt[{i}]"
                raise invalid(f"{where} must not be empty", where)
        if len(prompts) > MAX_CHOICES:
            raise invalid(f"prompt may hold at most {MAX_CHOICES} prompts, got "
                          f"{len(prompts)}", "prompt")
        return prompts

    def top_logprobs_asked(self) -> int | None:
        if self.logprobs is None:
            return None
        return _count("logprobs", self.logprobs, 0, MAX_COMPLETION_LOGPROBS)


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

    def top_logprobs_asked(self) -> int | None:
        top = self.top_logprobs
        if not self.logprobs:
            if top is not None:
                raise invalid("top_logprobs needs logprobs: true", "top_logprobs")
            return None
        return 0 if top is None else _count("top_logprobs", top, 0, MAX_COMPLETION_LOGPROBS)

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


def _count(name: str, value: int, lo: int, hi: int) -> int:
    if not lo <= value <= hi:
        raise invalid(f"{name} must be in [{lo}, {hi}], got {value}", name)
    return value
