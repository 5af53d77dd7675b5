"""Errors in the OpenAI shape: ``{"error": {"message", "type", "param", "code"}}``.

Every failure a client can see goes through ``APIError``; engine exceptions are mapped onto it
in one place (``from_exception``). Bodies carry a message meant for the user and never a stack
trace or a file path: anything unexpected becomes a generic 500 and is logged server-side.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from .. import ContextLengthError, EngineBusyError, EngineClosedError, EngineOutOfMemoryError
from ..params import GenerationParams

log = logging.getLogger("celeris.server")

TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
         404: "not_found_error", 405: "invalid_request_error", 413: "invalid_request_error",
         429: "rate_limit_error", 500: "server_error", 503: "server_error",
         504: "server_error"}


REQUEST_FIELDS = frozenset(GenerationParams.field_names()) | {
    "prompt", "messages", "max_tokens", "max_completion_tokens", "model", "stream",
    "stream_options"}


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None,
                 type: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type or TYPES.get(status, "server_error")
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def invalid(message: str, param: str | None, code: str = "invalid_value") -> APIError:
    return APIError(400, message, param, code)


def unavailable(message: str, code: str, retry_after: int = 5) -> APIError:
    return APIError(503, message, None, code, {"Retry-After": str(retry_after)})


def from_exception(exc: BaseException, param: str | None = None) -> APIError:
    """Map an engine exception onto the API error a client sees."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, EngineBusyError):
        seconds = max(1, math.ceil(exc.retry_after))
        return APIError(429, str(exc), None, "engine_overloaded",
                        {"Retry-After": str(seconds)})
    if isinstance(exc, EngineOutOfMemoryError):
        log.warning("out of memory: %s", exc.__cause__ or exc)
        return unavailable(str(exc), "out_of_memory", max(1, math.ceil(exc.retry_after)))
    if isinstance(exc, EngineClosedError):
        return unavailable(str(exc), "draining")
    if isinstance(exc, ContextLengthError):
        return invalid(str(exc), param, "context_length_exceeded")
    if isinstance(exc, ValueError):
        return invalid(str(exc), param_of(str(exc), param))
    if isinstance(exc, ClientDisconnect):   # nobody is left to answer: not a server fault
        log.info("the client disconnected before its request was read")
        return APIError(499, "the client disconnected", None, "client_disconnected")
    log.error("internal error", exc_info=(type(exc), exc, exc.__traceback__))
    return APIError(500, "internal server error", None, "internal_error")


def context_message(prompt_tokens: int, gen_length: int, limit: int,
                    length_field: str | None) -> str:
    """Why prompt + answer does not fit, with the largest length that would. The rule:
    prompt tokens + max_tokens may equal the context (exactly at the limit is accepted)."""
    name = length_field or "max_tokens"
    asked = f"{name} ({gen_length})" if length_field else f"the default gen_length ({gen_length})"
    room = limit - prompt_tokens
    fix = (f"{name} can be at most {room} for this prompt (prompt + {name} may equal the "
           f"context)" if room >= 1 else "shorten the prompt")
    return (f"prompt ({prompt_tokens} tokens) + {asked} = {prompt_tokens + gen_length} tokens "
            f"exceeds the model's context of {limit} tokens; {fix}")


def param_of(message: str, fallback: str | None) -> str | None:
    """The request parameter a validation message is about: GenerationParams and the
    tokenizer start their messages with the field's name ("temperature must be ...")."""
    head = message.split(" ", 1)[0].rstrip(":")
    root = head.split("[", 1)[0].split(".", 1)[0]
    if root == "gen_length":
        return "max_tokens"
    return head if root in REQUEST_FIELDS else fallback


# ----------------------------------------------------------------------- app handlers
async def handle_api_error(request: Request, exc: APIError) -> JSONResponse:
    return exc.response()


async def handle_http_error(request: Request, exc: HTTPException) -> JSONResponse:
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    message = {404: f"no route {request.url.path}",
               405: f"method {request.method} is not allowed on {request.url.path}"}.get(
        exc.status_code, str(exc.detail))
    return APIError(exc.status_code, message, None, code, dict(exc.headers or {})).response()


async def handle_unexpected(request: Request, exc: Exception) -> JSONResponse:
    return from_exception(exc).response()


def install(app: Any) -> None:
    app.add_exception_handler(APIError, handle_api_error)
    app.add_exception_handler(HTTPException, handle_http_error)
    app.add_exception_handler(Exception, handle_unexpected)
