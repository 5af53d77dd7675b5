"""Reading and validating a batch input file, all of it, before anything is generated.

Two line formats:
  OpenAI batch: {"custom_id", "method": "POST", "url": "/v1/chat/completions" | "/v1/completions",
                 "body": {"messages" | "prompt", "max_tokens", "temperature", ...}}
  simple:       {"id", "prompt" | "messages", ...GenerationParams fields or max_tokens}
Generation knobs in a body may also be any ``GenerationParams`` field (e.g. "decoding").
Every problem is reported with its line number; ``GenerationParams`` supplies the messages.
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
OPENAI_PASSTHROUGH = ("temperature", "top_p", "seed", "stop", "max_tokens",
                      "max_completion_tokens")
IGNORED = ("model", "user", "metadata", "store")
# OpenAI fields accepted only at their no-op value.
NOOP_DEFAULTS = {"n": 1, "stream": False, "frequency_penalty": 0, "presence_penalty": 0,
                 "logprobs": None}


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
def _openai_line(obj: dict[str, Any]) -> tuple[str, str, Any, dict[str, Any], dict]:
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
    rest = {k: v for k, v in body.items() if k != key}
    return cid, url, body[key], _knobs(rest, "body."), body


def _simple_line(obj: dict[str, Any]) -> tuple[str, str, Any, dict[str, Any], dict]:
    cid = obj.get("id")
    if isinstance(cid, int) and not isinstance(cid, bool):
        cid = str(cid)
    if not isinstance(cid, str) or not cid:
        raise ValueError("id must be a non-empty string")
    has = [k for k in ("prompt", "messages") if k in obj]
    if len(has) != 1:
        raise ValueError("give exactly one of prompt or messages")
    url = CHAT if has[0] == "messages" else COMPLETIONS
    rest = {k: v for k, v in obj.items() if k not in ("id", has[0])}
    knobs = _knobs(rest, "")
    body = {has[0]: obj[has[0]], **knobs}
    if "model" in obj:
        body["model"] = obj["model"]
    return cid, url, obj[has[0]], knobs, body


def _knobs(fields: dict[str, Any], where: str) -> dict[str, Any]:
    """Generation knobs of a line; unknown fields are an error naming them."""
    out, unknown = {}, []
    allowed = set(GenerationParams.field_names()) | set(OPENAI_PASSTHROUGH)
    for name, value in fields.items():
        if name in IGNORED:
            continue
        if name in NOOP_DEFAULTS:
            if value != NOOP_DEFAULTS[name]:
                raise ValueError(f"{where}{name} must be {json.dumps(NOOP_DEFAULTS[name])} "
                                 f"(not supported), got {json.dumps(value)}")
            continue
        if name in allowed:
            out[name] = value
        else:
            unknown.append(name)
    if unknown:
        raise ValueError(f"unsupported parameter(s) {', '.join(where + u for u in unknown)}; "
                         f"allowed: {', '.join(sorted(allowed))}")
    return out


def _check_prompt(job: Job) -> None:
    if job.is_chat:
        if not isinstance(job.prompt, list) or not job.prompt:
            raise ValueError("messages must be a non-empty list of {role, content} objects")
    elif not isinstance(job.prompt, str) or not job.prompt:
        raise ValueError("prompt must be a non-empty string")


# ---------------------------------------------------------------------- params
def resolve_params(overrides: dict[str, Any], base: GenerationParams, custom_id: str
                   ) -> GenerationParams:
    """GenerationParams for a line through the mapping the server uses (max_tokens is the
    cap, never rounded); the seed comes from the id unless the line gives one."""
    return request_params({"seed": stable_seed(custom_id), **overrides}, base)


def model_of(obj: dict[str, Any], where: str) -> str | None:
    model = obj.get("model")
    if model is not None and not isinstance(model, str):
        raise ValueError(f"{where}model must be a string, got {model!r}")
    return model


# ---------------------------------------------------------------------- the file
def read_jobs(path: Path, base: GenerationParams,
              check: Callable[[Job, GenerationParams], None] | None = None
              ) -> tuple[list[Job], list[Invalid], int]:
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
        cid, url, prompt, knobs, body = (_openai_line if openai else _simple_line)(obj)
        job = Job(number, cid, url, prompt, knobs, body,
                  model_of(body, "body." if openai else ""))
        _check_prompt(job)
        params = resolve_params(knobs, base, cid)
        if check is not None:
            check(job, params)
    except ValueError as exc:
        return Invalid(number, cid, str(exc))
    return job
