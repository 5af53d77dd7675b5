"""Reading and validating a batch input file, all of it, before anything is generated.

Two line formats:
  OpenAI batch: {"custom_id", "method": "POST", "url": "/v1/chat/completions" | "/v1/completions",
                 "body": {"messages" | "prompt", "max_tokens", "temperature", ...}}
  simple:       {"id", "prompt" | "messages", ...GenerationParams fields or max_tokens}
A body (or a simple line without its id) is checked by the server's own request schema
(``celeris.server.protocol``): the fields, types and messages are the ones /v1 uses, so a line
means the same in-process and with ``--url`` (a chat line's ``tools``, ``tool_choice`` and
``parallel_tool_calls`` included: runners.py). Every problem is reported with its line number.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from celeris.params import GenerationParams
from celeris.request_params import request_params

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
ENDPOINTS = (CHAT, COMPLETIONS)
LENGTH_FIELDS = ("max_tokens", "max_completion_tokens", "gen_length")


@dataclass(frozen=True)
class Job:
    line: int
    custom_id: str
    endpoint: str
    prompt: Any                      # str (completions) or a list of messages (chat)
    overrides: dict[str, Any]        # GenerationParams fields + max_tokens, as written
    body: dict[str, Any] = field(default_factory=dict)   # what a remote server receives
    model: str | None = None         # the model the line asks for (None: the served one)

    @property
    def is_chat(self) -> bool:
        return self.endpoint == CHAT

    @property
    def length_field(self) -> str | None:
        """The name under which the line gave its length cap, if it did."""
        return next((k for k in LENGTH_FIELDS if k in self.overrides), None)


@dataclass(frozen=True)
class Invalid:
    line: int
    custom_id: str | None
    message: str

    @property
    def key(self) -> str:
        return self.custom_id if self.custom_id is not None else f"@line{self.line}"

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


def stable_seed(custom_id: str) -> int:
    """A seed from the id alone (sha256, not Python's salted hash): reruns are identical."""
    return int.from_bytes(hashlib.sha256(custom_id.encode("utf-8")).digest()[:8], "big") >> 2


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# ---------------------------------------------------------------------- one line
def _openai_line(obj: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    cid = obj.get("custom_id")
    if not isinstance(cid, str) or not cid:
        raise ValueError("custom_id must be a non-empty string")
    if obj.get("method", "POST") != "POST":
        raise ValueError(f"method must be POST, got {obj.get('method')!r}")
    url = obj.get("url")
    if url not in ENDPOINTS:
        raise ValueError(f"url must be one of {', '.join(ENDPOINTS)}; got {url!r}")
    body = obj.get("body")
    if not isinstance(body, dict):
        raise ValueError("body must be a JSON object")
    key = "messages" if url == CHAT else "prompt"
    if key not in body:
        raise ValueError(f"body.{key} is required for {url}")
    extra = sorted(set(obj) - {"custom_id", "method", "url", "body"})
    if extra:
        raise ValueError(f"unknown top-level field(s): {', '.join(extra)}")
    return cid, url, body


def _simple_line(obj: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    cid = obj.get("id")
    if isinstance(cid, int) and not isinstance(cid, bool):
        cid = str(cid)
    if not isinstance(cid, str) or not cid:
        raise ValueError("id must be a non-empty string")
    has = [k for k in ("prompt", "messages") if k in obj]
    if len(has) != 1:
        raise ValueError("give exactly one of prompt or messages")
    url = CHAT if has[0] == "messages" else COMPLETIONS
    return cid, url, {k: v for k, v in obj.items() if k != "id"}


def check_body(url: str, body: dict[str, Any]) -> Any:
    """The body validated by the server's own request schema (so a line that passes here
    passes there, and the other way round); ValueError with the server's message."""
    from pydantic import ValidationError

    from celeris.server.bodies import validation_error
    from celeris.server.errors import APIError
    from celeris.server.protocol import ChatCompletionRequest, CompletionRequest

    schema = ChatCompletionRequest if url == CHAT else CompletionRequest
    try:
        req = schema.model_validate_json(json.dumps(body))
        if req.stream or req.stream_options is not None:
            raise ValueError("stream must be false in a batch job (each line gets one "
                             "answer)")
        req.check_neutral()
        req.to_prompt()
    except ValidationError as exc:
        raise ValueError(validation_error(exc).message) from None
    except APIError as exc:
        raise ValueError(exc.message) from None
    return req


def _overrides(req: Any) -> dict[str, Any]:
    """The generation fields a request gives (request_params names), as the server maps
    them."""
    return {k: v for k, v in req.generation_fields().items() if v is not None}


# ---------------------------------------------------------------------- params
def resolve_params(overrides: dict[str, Any], base: GenerationParams, custom_id: str
                   ) -> GenerationParams:
    """GenerationParams for a line through the mapping the server uses (max_tokens is the
    cap, never rounded); the seed comes from the id unless the line gives one."""
    return request_params({"seed": stable_seed(custom_id), **overrides}, base)


# ---------------------------------------------------------------------- the file
def read_jobs(path: Path, base: GenerationParams,
              check: Callable[[Job, GenerationParams], None] | None = None) -> tuple[list[Job], list[Invalid], int]:
    """(valid jobs, invalid lines, total non-blank lines). ``check`` may reject a job with a
    ValueError (the engine's own tokenising/context check in local mode)."""
    jobs: list[Job] = []
    invalid: list[Invalid] = []
    first_line: dict[str, int] = {}
    total = 0
    with open(path, encoding="utf-8") as f:
        for number, text in enumerate(f, start=1):
            if not text.strip():
                continue
            total += 1
            result = _parse_line(number, text, base, first_line, check)
            (jobs if isinstance(result, Job) else invalid).append(result)
    return jobs, invalid, total


def _parse_line(number: int, text: str, base: GenerationParams, first_line: dict[str, int],
                check: Callable[[Job, GenerationParams], None] | None) -> Job | Invalid:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        return Invalid(number, None, f"malformed JSON: {exc.msg} (column {exc.colno})")
    if not isinstance(obj, dict):
        return Invalid(number, None, "each line must be a JSON object")
    cid = obj.get("custom_id", obj.get("id"))
    cid = str(cid) if isinstance(cid, (str, int)) and not isinstance(cid, bool) and cid != "" \
        else None
    if cid is not None and cid in first_line:
        return Invalid(number, None, f"duplicate id {cid!r} (first on line {first_line[cid]})")
    if cid is not None:
        first_line[cid] = number
    try:
        openai = any(k in obj for k in ("custom_id", "url", "body", "method"))
        cid, url, body = (_openai_line if openai else _simple_line)(obj)
        req = check_body(url, body)
        job = Job(number, cid, url, req.to_prompt(), _overrides(req), body, req.model)
        params = resolve_params(job.overrides, base, cid)
        if check is not None:
            check(job, params)
    except ValueError as exc:
        return Invalid(number, cid, str(exc))
    return job
