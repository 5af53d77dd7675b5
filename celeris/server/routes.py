"""The HTTP routes: thin handlers over ``ServerState`` (engine access, metrics, lifecycle).

``/health`` and ``/ready`` are public; every other route requires the API key (when one is
set): protection is the default, publicness is the listed exception.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, AsyncIterator, Awaitable, Callable, TypeVar

from fastapi import Depends, FastAPI, Request, Response
from fastapi.responses import JSONResponse

from ..outputs import FinishReason, GenerationResult, StepEvent
from .auth import api_key_dependency
from .bodies import ClientGone, generation_params, read_request
from .errors import APIError, context_message, from_exception
from .protocol import ChatCompletionRequest, CompletionRequest
from .shaping import Shapes
from .state import ServerState
from .streaming import EventStream, sse_events
from .structured import structured_of
from .tools import ToolPlan

T = TypeVar("T")
PUBLIC_PATHS = frozenset({"/health", "/ready"})
ABORT_WAIT_S = 5.0   # how long an aborted request's last item is awaited after a disconnect


def register_routes(target: FastAPI, state: ServerState,
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
        status, detail = await state.check_readiness()
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
    try:
        req = await read_request(request, ChatCompletionRequest if chat else CompletionRequest,
                                 state.max_body_bytes)
    except ClientGone:
        state.metrics.disconnects.labels("sending").inc()
        return Response(status_code=ClientGone.STATUS)
    aengine = state.admit()
    if req.model is not None and req.model != state.model_name:
        raise _unknown_model(req.model, state.model_name)
    prompt_param = "messages" if chat else "prompt"
    prompt = req.to_prompt()
    params = generation_params(req, aengine.engine.default_params(), state.context_length())
    tools = ToolPlan.of(req, aengine.engine)
    if tools is not None:
        prompt = tools.prompt(aengine.engine, prompt)
        params = tools.params(params, req.parallel_tool_calls)
    request_id = uuid.uuid4().hex[:16]
    shapes = Shapes(chat, request_id, state.model_name)
    items = aengine.stream(prompt, params, request_id, events=req.stream)
    held: list[StepEvent] = []
    try:   # the status is decided by the first denoising step (or the result)
        first = await until_disconnect(request, _first_step(items, held),
                                       lambda: aengine.abort(request_id))
    except Exception as exc:
        await items.aclose()
        error = _request_error(exc, prompt_param, req.length_field(), params.gen_length)
        if error.param == "structured":             # the request's own name for it
            error.param = "tools" if tools is not None else structured_of(req)[1]
        raise error from None
    if isinstance(first, Disconnected):   # the client went away before its first byte
        await items.aclose()
        state.metrics.disconnects.labels(first.stage).inc()
        return Response(status_code=ClientGone.STATUS)

    def finish(result: GenerationResult) -> str:
        if result.finish_reason is FinishReason.ABORT:
            raise state.abort_error()
        state.metrics.observe(result)
        return str(result.finish_reason)

    reading = tools is not None and tools.reads_calls()
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        events = sse_events([*held, first], items, shapes, params.stop, include_usage,
                            req.celeris_denoise_events, finish,
                            tools.syntax.stream() if reading else None)
        return EventStream(events, on_close=lambda: aengine.abort(request_id),
                           on_disconnect=lambda: state.metrics.disconnects.labels(
                               "streaming").inc())
    await items.aclose()
    reason = finish(first)
    if not reading:
        return JSONResponse(shapes.response(first, reason))
    content, calls = tools.answer(first)
    reason = "tool_calls" if calls and reason == "stop" else reason
    return JSONResponse(shapes.response(first, reason, (content, calls)))


def _request_error(exc: Exception, prompt_param: str, length_field: str | None,
                   gen_length: int) -> APIError:
    """Engine exception -> APIError; a context overflow names the prompt, the length field
    and the largest value that fits."""
    error = from_exception(exc, prompt_param)
    if error.code == "context_length_exceeded" and getattr(exc, "gen_length", 0):
        error.message = context_message(exc.prompt_tokens, gen_length, exc.limit, length_field)
    return error


def _unknown_model(asked: str, served: str) -> APIError:
    return APIError(404, f"model {asked!r} does not exist; this server serves {served!r}",
                    "model", "model_not_found")


class Disconnected:
    """The client went away before ``until_disconnect``'s work was done; ``stage`` says
    whether its request was still waiting for a slot or already being denoised."""

    def __init__(self, stage: str) -> None:
        self.stage = stage


async def until_disconnect(request: Request, work: Awaitable[T],
                           abort: Callable[[], None]) -> T | Disconnected:
    """Await ``work`` (the request's first item) unless the client disconnects first: then
    ``abort()`` the request, whose item then comes within a step and tells how far it got."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watch.cancel()
    if task in done:
        return task.result()
    abort()
    try:
        item = await asyncio.wait_for(task, ABORT_WAIT_S)
    except (asyncio.TimeoutError, asyncio.CancelledError, StopAsyncIteration, Exception):
        return Disconnected("waiting")
    return Disconnected("running" if _denoised(item) else "waiting")


def _denoised(item: Any) -> bool:
    """Whether a request's item shows at least one model forward."""
    return getattr(item, "nfe", 0) > 0


async def _first_step(items: AsyncIterator[Any], held: list[StepEvent]) -> Any:
    """The request's first item that shows a denoising step, or its result; the events
    before it (the canvas as admitted, no forward yet) are appended to ``held``, so that an
    error in the first step is still an HTTP error rather than an event in a started stream."""
    while True:
        item = await items.__anext__()
        if not isinstance(item, StepEvent) or _denoised(item):
            return item
        held.append(item)


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
