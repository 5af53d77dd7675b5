"""Request bodies: read (size limit, JSON only), validate with pydantic, map onto
GenerationParams through the mapping that batch jobs and the bench share.

Every failure is a 400 (413 for size) naming the parameter it is about.
"""

from __future__ import annotations

from fastapi import Request
from pydantic import ValidationError
from starlette.requests import ClientDisconnect

from ..params import GenerationParams
from ..request_params import request_params
from .errors import APIError, invalid, param_of
from .protocol import (TYPE_HINTS, ChatCompletionRequest, ChatMessage, CompletionRequest,
                       FunctionDef, FunctionIn, NamedChoice, StreamOptions, TextPart, ToolCallIn,
                       ToolDef, _Knobs)

JSON_TYPES = ("application/json",)


class ClientGone(Exception):
    """The client disconnected while sending its body (answered with nginx's 499)."""

    STATUS = 499


async def read_request(request: Request, model: type[_Knobs], max_bytes: int) -> _Knobs:
    """The body validated as ``model``: 400 for a non-JSON content type, bad UTF-8, bad JSON
    or a bad field; 413 beyond ``max_bytes``."""
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media not in JSON_TYPES:
        raise invalid(f"Content-Type must be application/json, got {media or 'none'!r}",
                      "Content-Type", "invalid_content_type")
    raw = await _read_limited(request, max_bytes)
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise invalid(f"the request body is not valid UTF-8 (at byte {exc.start})", None,
                      "invalid_utf8") from None
    try:
        req = model.model_validate_json(raw)
    except ValidationError as exc:
        raise validation_error(exc) from None
    if req.stream_options is not None and not req.stream:
        raise invalid("stream_options is only allowed with stream: true", "stream_options")
    return req


async def _read_limited(request: Request, max_bytes: int) -> bytes:
    too_large = APIError(413, f"the request body exceeds the limit of {max_bytes} bytes", None,
                         "request_too_large")
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > max_bytes:
        raise too_large
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise too_large
            chunks.append(chunk)
    except ClientDisconnect:
        raise ClientGone() from None
    return b"".join(chunks)


def validation_error(exc: ValidationError) -> APIError:
    """A pydantic error on a request body as the 400 a client sees (also used by batch)."""
    err = exc.errors()[0]
    if err["type"] == "json_invalid":
        detail = err["msg"].removeprefix("Invalid JSON: ")
        return invalid(f"the request body is not valid JSON: {detail}", None, "invalid_json")
    if err["type"] == "model_type" and not err["loc"]:
        return invalid("the request body must be a JSON object", None, "invalid_json")
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
    models = (CompletionRequest, ChatCompletionRequest, ChatMessage, TextPart, StreamOptions,
              FunctionIn, ToolCallIn, FunctionDef, ToolDef, NamedChoice)
    return {name for m in models for name in m.model_fields}


def generation_params(req: _Knobs, defaults: GenerationParams,
                      context_length: int | None = None) -> GenerationParams:
    """GenerationParams for a validated request (the shared request_params mapping). With
    ``context_length`` a length cap outside [1, context - 1] is refused with those numbers;
    prompt tokens + max_tokens may equal the context (the engine checks that per prompt)."""
    fields = req.generation_fields()
    field = req.length_field()
    asked = fields.get(field) if field else None
    if context_length and isinstance(asked, int) and not 1 <= asked < context_length:
        raise invalid(f"{field} must be in [1, {context_length - 1}] for this model (its "
                      f"context of {context_length} tokens holds the prompt and the answer; "
                      f"prompt + {field} may equal it), got {asked}", field)
    try:
        return request_params(fields, defaults)
    except ValueError as exc:
        raise invalid(str(exc), param_of(str(exc), "max_tokens")) from None
