"""Response shapes: OpenAI completion / chat objects and stream chunks for one request."""

from __future__ import annotations

import time
from typing import Any

from ..outputs import GenerationResult, StepEvent
from ..synthetic.world import prompt_unknown_words


def usage(results: list[GenerationResult], prompt_tokens: int) -> dict[str, int]:
    """OpenAI's usage of a request: each prompt counted once, every sample's answer."""
    completion = sum(r.usage.completion_tokens for r in results)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion}


def celeris_stats(results: list[GenerationResult]) -> dict[str, Any]:
    """Diffusion-specific numbers, next to the OpenAI fields: the first choice's, and each
    choice's when there are several."""
    if not results:
        return {}
    out = _stats(results[0])
    if len(results) > 1:
        out["choices"] = [_stats(r) for r in results]
    return out


def _stats(result: GenerationResult) -> dict[str, Any]:
    return {"nfe": result.nfe, "steps": result.steps, "seed": result.seed,
            "tokens_per_forward": round(result.tokens_per_forward, 4),
            "elapsed_s": round(result.timings.total_s, 6),
            "first_block_s": result.timings.first_block_s,
            "queue_s": round(result.timings.queue_s, 6)}


def world_notes(family: str, prompts: list[Any]) -> dict[str, Any]:
    """``{"unknown_words": [...]}`` for a shipped celeris model (family "celeris": the demo
    world's models): the prompts' words and characters its story grammar and tasks never use
    (``synthetic.world.unknown_words``), [] when all are known. Other families: {} (nothing
    is computed)."""
    if family != "celeris":
        return {}
    found: dict[str, None] = {}
    for prompt in prompts:
        found.update(dict.fromkeys(prompt_unknown_words(prompt)))
    return {"unknown_words": list(found)}


class Shapes:
    """Builds the response and chunk dicts of one request (completion or chat); ``notes``
    join the ``celeris`` object of the response and of the usage chunk."""

    def __init__(self, chat: bool, request_id: str, model: str,
                 notes: dict[str, Any] | None = None) -> None:
        self.chat, self.model = chat, model
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{request_id}"
        self.created = int(time.time())
        self.notes = notes or {}

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def choice(self, index: int, text: str, finish: str,
               calls: tuple[str | None, list[dict[str, Any]]] | None = None,
               logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
        """One choice of a response; ``calls``: (content, tool_calls) of an answer read for
        tool calls."""
        if not self.chat:
            return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if calls is not None:      # the text outside the calls, as streaming sends it
            message["content"] = calls[0] if calls[1] else calls[0] or ""
            if calls[1]:
                message["tool_calls"] = calls[1]
        return {"index": index, "message": message, "logprobs": logprobs,
                "finish_reason": finish}

    def response(self, choices: list[dict[str, Any]], results: list[GenerationResult],
                 prompt_tokens: int) -> dict[str, Any]:
        out = self._head("chat.completion" if self.chat else "text_completion")
        return {**out, "choices": choices, "usage": usage(results, prompt_tokens),
                "celeris": {**celeris_stats(results), **self.notes}}

    def chunk(self, text: str | None, finish: str | None = None, first: bool = False,
              include_usage: bool = False, tool_calls: list[dict[str, Any]] | None = None,
              index: int = 0, logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
            if text:
                delta["content"] = text
            if tool_calls:
                delta["tool_calls"] = tool_calls
            choice = {"index": index, "delta": delta, "logprobs": logprobs,
                      "finish_reason": finish}
            out = self._head("chat.completion.chunk")
        else:
            choice = {"index": index, "text": text or "", "logprobs": logprobs,
                      "finish_reason": finish}
            out = self._head("text_completion")
        out["choices"] = [choice]
        if include_usage:
            out["usage"] = None
        return out

    def usage_chunk(self, results: list[GenerationResult], prompt_tokens: int
                    ) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._head(obj), "choices": [], "usage": usage(results, prompt_tokens),
                "celeris": {**celeris_stats(results), **self.notes}}

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
