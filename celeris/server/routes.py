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
from .choices import Plan, choice_logprobs, echo_prompts, make_choices, settle_text
from .errors import APIError, context_message, from_exception
from .protocol import ChatCompletionRequest, CompletionRequest
from .shaping import Shapes, world_notes
from .state import ServerState
from .streaming import ChoiceStream, EventStream, sse_events
from .structured import structured_of
from .tools import ToolPlan, finish_with_calls

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
    engine = aengine.engine
    if req.model is not None and req.model != state.model_name:
        raise _unknown_model(req.model, state.model_name)
    prompt_param = "messages" if chat else "prompt"
    plan = Plan.of(req)
    notes = world_notes(engine.family.name, plan.prompts)    # before tools rewrite them
    if plan.score_only:        # echo with max_tokens 0: the length fields are not asked
        req = req.model_copy(update={"max_tokens": 1})
    params = plan.params(generation_params(req, engine.default_params(),
                                           state.context_length()))
    tools = ToolPlan.of(req, engine)
    if tools is not None:
        plan.prompts = [tools.prompt(engine, plan.prompts[0])]
        params = tools.params(params, req.parallel_tool_calls)
    request_id = uuid.uuid4().hex[:16]
    shapes = Shapes(chat, request_id, state.model_name, notes)
    choices = await make_choices(engine, plan, params, request_id)
    if plan.echo:
        await echo_prompts(engine, plan, choices)
    if plan.score_only:
        return JSONResponse(shapes.response(
            [shapes.choice(c.index, c.echo, "length", logprobs=choice_logprobs(engine, c, chat, plan))
             for c in choices], [], sum(len(c.scores or ()) for c in choices)))
    streams: list[ChoiceStream] = []

    def abort_all() -> None:
        for c in choices:
            aengine.abort(c.request_id)

    try:
        for c in choices:
            items = aengine.stream(c.prompt, c.params, c.request_id, c.canvas,
                                   events=req.stream)
            streams.append(ChoiceStream(c.index, [], items, echo=c.echo if req.stream else "",
                                        final_text=None if c.canvas is None else
                                        (lambda r, c=c: settle_text(engine, c, r))))
        for s in streams:   # the status is decided by the first denoising step (or result)
            first = await until_disconnect(request, _first_step(s.items, s.head), abort_all)
            if isinstance(first, Disconnected):   # gone before its first byte
                await _close(streams)
                state.metrics.disconnects.labels(first.stage).inc()
                return Response(status_code=ClientGone.STATUS)
            s.head.append(first)
    except Exception as exc:
        abort_all()
        await _close(streams)
        error = _request_error(exc, prompt_param, req.length_field(), params.gen_length)
        if error.param == "structured":             # the request's own name for it
            error.param = "tools" if tools is not None else structured_of(req)[1]
        raise error from None

    def finish(result: GenerationResult) -> str:
        if result.finish_reason is FinishReason.ABORT:
            raise state.abort_error()
        state.metrics.observe(result)
        return str(result.finish_reason)

    def prompt_tokens() -> int:    # each prompt once (its first sample's count)
        return sum(s.result.usage.prompt_tokens for s in streams[::plan.drawn] if s.result)

    reading = tools is not None and tools.reads_calls()
    by_index = {c.index: c for c in choices}
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        if reading:
            streams[0].calls = tools.syntax.stream()

        def logprobs(index: int, result: GenerationResult) -> Any:
            c = by_index[index]
            c.result = result
            return choice_logprobs(engine, c, chat, plan)

        events = sse_events(streams, shapes, params.stop, include_usage,
                            req.celeris_denoise_events, finish, logprobs, prompt_tokens)
        return EventStream(events, on_close=abort_all,
                           on_disconnect=lambda: state.metrics.disconnects.labels(
                               "streaming").inc())
    await _close(streams)
    for c, s in zip(choices, streams):
        c.result, s.result = s.head[-1], s.head[-1]
    reasons = {id(c): finish(c.result) for c in choices}
    out = []
    for c in plan.keep(choices):
        reason, calls = reasons[id(c)], None
        if reading:
            content, found = tools.answer(c.result)
            reason = finish_with_calls(reason, bool(found))
            calls = (content, found)
        out.append(shapes.choice(c.index, c.text(engine.tokenizer.decode), reason, calls,
                                 choice_logprobs(engine, c, chat, plan)))
    results = [c.result for c in choices]
    return JSONResponse(shapes.response(out, results, prompt_tokens()))


async def _close(streams: list[ChoiceStream]) -> None:
    for s in streams:
        await s.items.aclose()


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
