"""Response shapes: OpenAI completion / chat objects and stream chunks for one request."""

from __future__ import annotations

import time
from typing import Any

from ..outputs import GenerationResult, StepEvent


def usage(result: GenerationResult) -> dict[str, int]:
    return result.usage.to_dict()


def celeris_stats(result: GenerationResult) -> dict[str, Any]:
    """Diffusion-specific numbers, next to the OpenAI fields."""
    return {"nfe": result.nfe, "steps": result.steps, "seed": result.seed,
            "tokens_per_forward": round(result.tokens_per_forward, 4),
            "elapsed_s": round(result.timings.total_s, 6),
            "first_block_s": result.timings.first_block_s,
            "queue_s": round(result.timings.queue_s, 6)}


class Shapes:
    """Builds the response and chunk dicts of one request (completion or chat)."""

    def __init__(self, chat: bool, request_id: str, model: str) -> None:
        self.chat, self.model = chat, model
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{request_id}"
        self.created = int(time.time())

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def response(self, result: GenerationResult, finish: str,
                 calls: tuple[str | None, list[dict[str, Any]]] | None = None
                 ) -> dict[str, Any]:
        """``calls``: (content, tool_calls) of an answer read for tool calls."""
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": result.text}
            if calls is not None:      # the text outside the calls, as streaming sends it
                message["content"] = calls[0] if calls[1] else calls[0] or ""
                if calls[1]:
                    message["tool_calls"] = calls[1]
            choice = {"index": 0, "message": message, "logprobs": None,
                      "finish_reason": finish}
            out = self._head("chat.completion")
        else:
            choice = {"index": 0, "text": result.text, "logprobs": None,
                      "finish_reason": finish}
            out = self._head("text_completion")
        return {**out, "choices": [choice], "usage": usage(result),
                "celeris": celeris_stats(result)}

    def chunk(self, text: str | None, finish: str | None = None, first: bool = False,
              include_usage: bool = False, tool_calls: list[dict[str, Any]] | None = None
              ) -> dict[str, Any]:
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
            if text:
                delta["content"] = text
            if tool_calls:
                delta["tool_calls"] = tool_calls
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            out = self._head("chat.completion.chunk")
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
            out = self._head("text_completion")
        out["choices"] = [choice]
        if include_usage:
            out["usage"] = None
        return out

    def usage_chunk(self, result: GenerationResult) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._head(obj), "choices": [], "usage": usage(result),
                "celeris": celeris_stats(result)}

    def denoise(self, event: StepEvent) -> dict[str, Any]:
        """A canvas snapshot (the ``celeris.denoise`` SSE event): ``edited`` lists the
        committed positions that replaced a token (token editing), ``draft`` the positions
        whose canvas token is a draft not accepted yet (DiffusionGemma)."""
        return {**self._head("celeris.denoise"), "choices": [], "step": event.step,
                "block": event.block, "block_length": event.block_length,
                "canvas": list(event.canvas), "mask_id": event.mask_id,
                "committed": list(event.committed),
                "confidences": [round(c, 5) for c in event.confidences],
                "edited": list(event.edited), "draft": list(event.draft),
                "nfe": event.nfe, "elapsed_s": round(event.elapsed, 6), "text": event.text}
