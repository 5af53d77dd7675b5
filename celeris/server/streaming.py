"""Server-Sent Events for ``stream: true``, in OpenAI's chunk shapes.

Deltas are append-only: each chunk carries the new part of the *stable* committed-prefix text
(see ``outputs.settled_text``), so a client that concatenates deltas ends with exactly the
final text. With ``celeris_denoise_events`` every denoising step is also sent as a separate
``event: celeris.denoise`` carrying the canvas. An error after the stream started is sent as a
final ``data: {"error": ...}`` event (the OpenAI SDK raises it), then ``data: [DONE]``.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

from fastapi.responses import StreamingResponse

from ..outputs import GenerationResult, StepEvent, settled_text
from .errors import from_exception
from .shaping import Shapes
from .tools import finish_with_calls

DONE = "data: [DONE]\n\n"


def sse(data: dict[str, Any], event: str | None = None) -> str:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"


class EventStream(StreamingResponse):
    """A StreamingResponse that calls ``on_close`` however it ends (finished, failed, or the
    client went away), so an abandoned request is aborted at once rather than at GC; and
    ``on_disconnect`` when it ended before its last event was sent."""

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None],
                 on_disconnect: Callable[[], None] | None = None) -> None:
        super().__init__(self._tracked(content), media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.on_close, self.on_disconnect = on_close, on_disconnect
        self.completed = False

    async def _tracked(self, content: AsyncIterator[str]) -> AsyncIterator[str]:
        async for chunk in content:
            yield chunk
        self.completed = True

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()
            if not self.completed and self.on_disconnect is not None:
                self.on_disconnect()


@dataclass
class ChoiceStream:
    """One choice's items: ``head`` (already received), then ``items``; ``calls`` (the
    family's ``CallStream``) turns its text into content and tool-call deltas."""

    index: int
    head: list[Any]
    items: AsyncIterator[Any]
    calls: Any = None
    echo: str = ""
    result: GenerationResult | None = None
    final_text: Callable[[GenerationResult], str] | None = None   # suffix: the gap's fill


async def sse_events(streams: list[ChoiceStream], shapes: Shapes, stops: tuple[str, ...],
                     include_usage: bool, denoise: bool,
                     finish: Callable[[GenerationResult], str],
                     logprobs: Callable[[int, GenerationResult], Any] = lambda i, r: None,
                     prompt_tokens: Callable[[], int] = lambda: 0) -> AsyncIterator[str]:
    """The SSE chunks of every choice, interleaved as their steps come; ``finish(result)``
    returns the OpenAI finish_reason or raises an APIError; ``logprobs(index, result)`` the
    choice's logprobs object (sent with its last chunk), None when not asked."""
    try:
        async for event, chunk in _merged([
                _choice_chunks(s, shapes, stops, include_usage, denoise, finish, logprobs)
                for s in streams]):
            yield sse(chunk, event=event)
        if include_usage:
            results = [s.result for s in sorted(streams, key=lambda s: s.index)]
            yield sse(shapes.usage_chunk(results, prompt_tokens()))
    except asyncio.CancelledError:
        raise
    except Exception as exc:   # noqa: BLE001 - every failure becomes an error event
        yield sse(from_exception(exc).body())
    finally:
        for s in streams:
            await s.items.aclose()
    yield DONE


async def _choice_chunks(s: ChoiceStream, shapes: Shapes, stops: tuple[str, ...],
                         include_usage: bool, denoise: bool,
                         finish: Callable[[GenerationResult], str],
                         logprobs: Callable[[int, GenerationResult], Any]
                         ) -> AsyncIterator[tuple[str | None, dict[str, Any]]]:
    """(event name, chunk) of one choice: its opening, the stable text's deltas as the
    steps come (and the canvas, with ``denoise``), its last chunk with the finish reason."""
    pending, sent = list(s.head), ""
    if shapes.chat:
        yield None, shapes.chunk(None, first=True, include_usage=include_usage, index=s.index)
    if s.echo:
        yield None, shapes.chunk(s.echo, include_usage=include_usage, index=s.index)
    item = pending.pop(0) if pending else await s.items.__anext__()
    while not isinstance(item, GenerationResult):
        if isinstance(item, StepEvent):
            if denoise:
                yield "celeris.denoise", {**shapes.denoise(item), "index": s.index}
            stable = settled_text(item.text, stops)
            if s.calls is not None:
                new, deltas = s.calls.feed(stable)
                if new or deltas:
                    yield None, shapes.chunk(new, include_usage=include_usage,
                                             tool_calls=deltas, index=s.index)
            elif s.final_text is None and len(stable) > len(sent) and stable.startswith(sent):
                yield None, shapes.chunk(stable[len(sent):], include_usage=include_usage,
                                         index=s.index)
                sent = stable
        item = pending.pop(0) if pending else await s.items.__anext__()
    reason = finish(item)
    s.result = item
    if s.calls is not None:
        tail, deltas = s.calls.feed(item.text, final=True)
        reason = finish_with_calls(reason, bool(s.calls.ids))
    else:
        text = item.text if s.final_text is None else s.final_text(item)
        tail, deltas = (text[len(sent):] if text.startswith(sent) else ""), []
    yield None, shapes.chunk(tail, reason, include_usage=include_usage, tool_calls=deltas,
                             index=s.index, logprobs=logprobs(s.index, item))


_END = object()


async def _merged(gens: list[AsyncIterator[Any]]) -> AsyncIterator[Any]:
    """The items of several async generators as they come; the first error is raised."""
    if len(gens) == 1:
        async for item in gens[0]:
            yield item
        return
    box: asyncio.Queue = asyncio.Queue()

    async def pump(gen: AsyncIterator[Any]) -> None:
        try:
            async for item in gen:
                await box.put(item)
        except BaseException as exc:   # noqa: BLE001 - handed to the reader
            await box.put(exc)
        finally:
            await box.put(_END)

    tasks = [asyncio.ensure_future(pump(g)) for g in gens]
    left = len(gens)
    try:
        while left:
            item = await box.get()
            if item is _END:
                left -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for t in tasks:
            t.cancel()
