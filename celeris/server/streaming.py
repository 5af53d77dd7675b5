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
from typing import Any, AsyncIterator, Callable

from fastapi.responses import StreamingResponse

from ..outputs import GenerationResult, StepEvent, settled_text
from .errors import from_exception
from .shaping import Shapes

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


async def sse_events(head: list[Any], items: AsyncIterator[Any], shapes: Shapes,
                     stops: tuple[str, ...], include_usage: bool, denoise: bool,
                     finish: Callable[[GenerationResult], str], calls: Any = None
                     ) -> AsyncIterator[str]:
    """The SSE chunks of ``head`` (the items already received) and then of ``items``;
    ``finish(result)`` returns the OpenAI finish_reason or raises an APIError. ``calls``
    (the family's ``CallStream``) turns the text into content and tool-call deltas."""
    sent = ""
    pending = list(head)
    try:
        if shapes.chat:
            yield sse(shapes.chunk(None, first=True, include_usage=include_usage))
        item = pending.pop(0) if pending else await items.__anext__()
        while not isinstance(item, GenerationResult):
            if isinstance(item, StepEvent):
                if denoise:
                    yield sse(shapes.denoise(item), event="celeris.denoise")
                stable = settled_text(item.text, stops)
                if calls is not None:
                    new, deltas = calls.feed(stable)
                    if new or deltas:
                        yield sse(shapes.chunk(new, include_usage=include_usage,
                                               tool_calls=deltas))
                elif len(stable) > len(sent) and stable.startswith(sent):
                    yield sse(shapes.chunk(stable[len(sent):], include_usage=include_usage))
                    sent = stable
            item = pending.pop(0) if pending else await items.__anext__()
        reason = finish(item)
        if calls is not None:
            tail, deltas = calls.feed(item.text, final=True)
            reason = "tool_calls" if calls.ids and reason == "stop" else reason
        else:
            tail, deltas = (item.text[len(sent):] if item.text.startswith(sent) else ""), []
        yield sse(shapes.chunk(tail, reason, include_usage=include_usage, tool_calls=deltas))
        if include_usage:
            yield sse(shapes.usage_chunk(item))
    except asyncio.CancelledError:
        raise
    except Exception as exc:   # noqa: BLE001 - every failure becomes an error event
        yield sse(from_exception(exc).body())
    finally:
        await items.aclose()
    yield DONE
