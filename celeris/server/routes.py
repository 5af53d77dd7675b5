"""The HTTP routes: thin handlers over ``ServerState`` (engine access, metrics, lifecycle).

``/health`` and ``/ready`` are public; every other route requires the API key (when one is
set): protection is the default, publicness is the listed exception.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any, Awaitable, Callable, TypeVar

from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.responses import JSONResponse

from ..outputs import FinishReason, GenerationResult
from .auth import api_key_dependency
from .errors import APIError, from_exception, invalid
from .protocol import ChatCompletionRequest, CompletionRequest, Shapes, parse, to_params
from .state import ServerState
from .streaming import EventStream, sse_events

T = TypeVar("T")
PUBLIC_PATHS = frozenset({"/health", "/ready"})


def create_router(state: ServerState, api_key: str | None = None) -> APIRouter:
    """All Celeris routes on an APIRouter (for apps that prefer ``include_router``)."""
    router = APIRouter()
    register_routes(router, state, api_key)
    return router


def register_routes(target: FastAPI | APIRouter, state: ServerState,
                    api_key: str | None = None) -> None:
    """Add every route to ``target``; all but PUBLIC_PATHS require the API key, so a route
    added to ``_endpoints`` is protected unless it is listed there explicitly."""
    auth = [Depends(api_key_dependency(api_key))]
    for (method, path), endpoint in _endpoints(state).items():
        target.add_api_route(path, endpoint, methods=[method],
                             dependencies=[] if path in PUBLIC_PATHS else auth)


def _endpoints(state: ServerState) -> dict[tuple[str, str], Callable[..., Any]]:
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    async def ready() -> JSONResponse:
        status, detail = state.readiness()
        return JSONResponse({"status": status, "detail": detail},
                            status_code=200 if status == "ready" else 503)

    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [state.model_card()]}

    async def get_model(model_id: str) -> dict[str, Any]:
        card = state.model_card()
        if model_id != card["id"]:
            raise _unknown_model(model_id, card["id"])
        return card

    async def completions(request: Request) -> Response:
        return await _complete(state, request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await _complete(state, request, chat=True)

    async def metrics() -> Response:
        body, content_type = state.metrics.render()
        return Response(body, media_type=content_type)

    return {("GET", "/health"): health, ("GET", "/ready"): ready,
            ("GET", "/v1/models"): list_models, ("GET", "/v1/models/{model_id:path}"): get_model,
            ("POST", "/v1/completions"): completions,
            ("POST", "/v1/chat/completions"): chat_completions, ("GET", "/metrics"): metrics}


# ----------------------------------------------------------------------- completions
async def _complete(state: ServerState, request: Request, chat: bool) -> Response:
    body = await read_json(request, state.max_body_bytes)
    req = parse(ChatCompletionRequest if chat else CompletionRequest, body)
    aengine = state.require_engine()
    if req.model is not None and req.model != state.model_name:
        raise _unknown_model(req.model, state.model_name)
    prompt_param = "messages" if chat else "prompt"
    prompt = req.to_prompt()
    params = to_params(req, aengine.engine.default_params())
    request_id = uuid.uuid4().hex[:16]
    shapes = Shapes(chat, request_id, state.model_name)
    items = aengine.stream(prompt, params, request_id, events=req.stream)
    try:
        first = await until_disconnect(request, items.__anext__())
    except Exception as exc:
        await items.aclose()
        raise _request_error(exc, prompt_param, req.max_tokens, params.gen_length) from None
    if first is None:   # the client went away while queued
        return Response(status_code=499)

    def finish(result: GenerationResult) -> str:
        if result.finish_reason is FinishReason.ABORT:
            raise state.abort_error()
        state.metrics.observe(result)
        return str(result.finish_reason)

    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        events = sse_events(first, items, shapes, params.stop, include_usage,
                            req.celeris_denoise_events, finish)
        return EventStream(events, on_close=lambda: aengine.abort(request_id))
    await items.aclose()
    return JSONResponse(shapes.response(first, finish(first)))


def _request_error(exc: Exception, prompt_param: str, max_tokens: int | None,
                   gen_length: int) -> APIError:
    """Engine exception -> APIError; a context overflow names the prompt and max_tokens."""
    error = from_exception(exc, prompt_param)
    if error.code == "context_length_exceeded" and getattr(exc, "gen_length", 0):
        asked = (f"max_tokens ({max_tokens}" + (f", rounded up to {gen_length} for whole "
                                                f"blocks)" if max_tokens != gen_length else ")")
                 if max_tokens is not None else f"the default gen_length ({gen_length})")
        error.message = (f"prompt ({exc.prompt_tokens} tokens) + {asked} = "
                         f"{exc.prompt_tokens + gen_length} tokens exceeds the model's context "
                         f"of {exc.limit} tokens")
    return error


def _unknown_model(asked: str, served: str) -> APIError:
    return APIError(404, f"model {asked!r} does not exist; this server serves {served!r}",
                    "model", "model_not_found")


async def until_disconnect(request: Request, work: Awaitable[T]) -> T | None:
    """Await ``work`` unless the client disconnects first (then cancel it: that aborts the
    request in the engine) and return None."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
    if task in done:
        return task.result()
    try:
        await task
    except (asyncio.CancelledError, StopAsyncIteration, Exception):
        pass
    return None


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


# ----------------------------------------------------------------------- request bodies
async def read_json(request: Request, max_bytes: int) -> Any:
    """The body as JSON: 413 beyond ``max_bytes``, 400 for bad UTF-8 or bad JSON."""
    length = request.headers.get("content-length", "")
    too_large = APIError(413, f"the request body exceeds the limit of {max_bytes} bytes", None,
                         "request_too_large")
    if length.isdigit() and int(length) > max_bytes:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise too_large
        chunks.append(chunk)
    try:
        text = b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise invalid(f"the request body is not valid UTF-8 (at byte {exc.start})", None,
                      "invalid_utf8") from None
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise invalid(f"the request body is not valid JSON: {exc.msg} (line {exc.lineno}, "
                      f"column {exc.colno})", None, "invalid_json") from None
    except RecursionError:
        raise invalid("the request body is nested too deeply", None, "invalid_json") from None
    _check_strings(body, "")
    return body


def _check_strings(value: Any, path: str) -> None:
    """Reject lone surrogates (``"\\ud800"`` is valid JSON but not valid Unicode text)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise invalid(f"{path or 'body'} contains an unpaired surrogate (not valid UTF-8)",
                          path or None, "invalid_utf8") from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_strings(key, path)
            _check_strings(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_strings(item, f"{path}[{i}]")

