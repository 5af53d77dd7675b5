"""The step loop: running requests, grouped and advanced one denoising step at a time.

``StepLoop`` holds one ``DenoiseBatch`` per (cache, block_length) group and advances one group
by one step per call, round-robin. Requests join and leave between steps: a joining row is
right-aligned into its batch and gets a cache refresh, a finished or aborted row leaves at
once. ``RequestState`` turns each row's ``StepOutput``s into ``StepEvent``s and finally a
``GenerationResult``. The engine's inline path drives a private StepLoop in the caller's
thread; the ``Scheduler`` drives a shared one from its background thread — both share this code.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import torch

from .cache import SlotKVCache
from .outputs import FinishReason, GenerationResult, StepEvent, StepTiming, Timings, Usage
from .sampler import (BlockBatch, DenoiseBatch, NonFiniteLogitsError, SamplerRequest,
                      SpecialTokens, StepOutput, new_slot_cache)

log = logging.getLogger(__name__)

Item = StepEvent | GenerationResult | BaseException
Sink = Callable[[Item], None]


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """Cut ``text`` at the first occurrence of any stop string."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


@dataclass(eq=False)
class RequestState:
    """Per-request bookkeeping that turns StepOutputs into StepEvents and a result."""

    request: SamplerRequest
    tokenizer: Any = field(repr=False)
    mask_id: int
    started: float                       # perf_counter() when the request was admitted
    sink: Sink | None = None             # where the scheduler delivers items
    events: bool = True                  # deliver StepEvents, not only the result
    deadline: float = math.inf
    queue_s: float = 0.0
    text: str = ""
    prefix_len: int = -1
    first_block_s: float | None = None
    stopped_by_string: bool = False
    last: StepOutput | None = None
    group: tuple = ()                    # the batch it runs in (set by StepLoop.add)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    def event(self, out: StepOutput) -> StepEvent:
        params = self.request.params
        now = time.perf_counter() - self.started
        self.last = out
        if self.first_block_s is None and (out.block > 0 or out.finish):
            self.first_block_s = now
        answer = self.tokenizer.answer_ids(out.canvas)
        if len(answer) != self.prefix_len:
            self.prefix_len = len(answer)
            self.text, self.stopped_by_string = cut_at_stop(self.tokenizer.decode(answer),
                                                            params.stop)
        return StepEvent(self.request_id, out.step, out.block, out.canvas, out.committed,
                         out.confidences, out.nfe, now, self.text, self.mask_id,
                         params.block_length, out.finish is not None)

    def result(self, finish: FinishReason) -> GenerationResult:
        out, params = self.last, self.request.params
        canvas = out.canvas if out else ()
        answer = self.tokenizer.answer_ids(canvas)
        if len(answer) > params.gen_length:          # a canvas of whole blocks: cut at the cap
            answer, finish = answer[:params.gen_length], FinishReason.LENGTH
        text, cut = cut_at_stop(self.tokenizer.decode(answer), params.stop)
        ids = (tuple(answer) if not cut
               else tuple(self.tokenizer.encode(text, add_special_tokens=False)))
        if cut:
            finish = FinishReason.STOP
        total = time.perf_counter() - self.started
        return GenerationResult(
            request_id=self.request_id, text=text, token_ids=ids, canvas=tuple(canvas),
            finish_reason=finish, nfe=out.nfe if out else 0, steps=out.step if out else 0,
            timings=Timings(total_s=total, first_block_s=self.first_block_s,
                            queue_s=self.queue_s),
            usage=Usage(prompt_tokens=len(self.request.prompt_ids),
                        completion_tokens=len(ids)),
            seed=self.request.seed, params=params.to_dict())


class StepLoop:
    """The running requests, stepped one group (one forward) per ``step()`` call."""

    def __init__(self, model: Any, tokenizer: Any, special: SpecialTokens,
                 device: torch.device, shift: int = 0, kv: SlotKVCache | None = None,
                 timing: StepTiming | None = None) -> None:
        self.model, self.tokenizer, self.special = model, tokenizer, special
        self.timing = timing if timing is not None else StepTiming()
        self.device, self.shift = device, shift
        self.block_causal = bool(getattr(model.config, "block_causal", False))
        self.kv = kv                     # block-causal models: one KV cache for the loop (slots grow on demand)
        self._groups: dict[tuple, Any] = {}
        self._states: dict[str, RequestState] = {}
        self._aborts: set[str] = set()
        self._abort_lock = threading.Lock()
        self._turn = 0

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._states

    def new_state(self, request: SamplerRequest, started: float, timeout_s: float,
                  sink: Sink | None = None, events: bool = True) -> RequestState:
        return RequestState(request, self.tokenizer, self.special.mask, started, sink, events,
                            started + timeout_s)

    def add(self, states: Iterable[RequestState]) -> list[tuple[RequestState, Item]]:
        """Join requests to their groups; a group that rejects them fails only them."""
        by_group: dict[tuple, list[RequestState]] = {}
        for st in states:
            st.group = self._group_of(st.request.params)
            by_group.setdefault(st.group, []).append(st)
        failed: list[tuple[RequestState, Item]] = []
        for key, group in by_group.items():
            batch = self._groups.get(key)
            if batch is None:
                batch = self._new_batch(key)
            try:
                batch.add([st.request for st in group])
            except Exception as exc:   # e.g. an infill canvas of the wrong length
                failed.extend((st, exc) for st in group)
                continue
            self._groups[key] = batch
            self._states.update((st.request_id, st) for st in group)
        return failed

    def _group_of(self, params: Any) -> tuple:
        """Requests that can share a forward: block-causal ones all do (any block, any
        prompt length), except the cache-less reference path; full-canvas ones need the same
        cache policy and block length."""
        if self.block_causal:
            return ("block", params.cache != "none")
        return (params.cache, params.block_length)

    def _new_batch(self, key: tuple) -> Any:
        if not self.block_causal:
            return DenoiseBatch(self.model, self.special, self.device, cache=key[0],
                                shift=self.shift)
        kv = None
        if key[1]:
            if self.kv is None:
                self.kv = new_slot_cache(self.model)
            kv = self.kv
        return BlockBatch(self.model, self.special, self.device, kv, bool(self.shift))

    def abort(self, request_id: str) -> None:
        """Mark a running request; it leaves (finish "abort") at the next ``step()``."""
        with self._abort_lock:
            self._aborts.add(request_id)

    def step(self) -> list[tuple[RequestState, Item]]:
        """Reap aborted and expired requests, then advance the next group by one step."""
        items = self._reap(time.perf_counter())
        if self._groups:
            keys = list(self._groups)
            key = keys[self._turn % len(keys)]
            self._turn += 1
            items += self._step_group(key)
        return items

    def clear(self) -> list[RequestState]:
        """Drop every running request (without results); returns their states."""
        states = list(self._states.values())
        self._groups.clear()
        self._states.clear()
        return states

    def fail_all(self, exc: BaseException) -> list[tuple[RequestState, Item]]:
        return [(st, exc) for st in self.clear()]

    def _reap(self, now: float) -> list[tuple[RequestState, Item]]:
        with self._abort_lock:
            aborts, self._aborts = self._aborts, set()
        gone = [st for st in self._states.values()
                if st.request_id in aborts or now >= st.deadline]
        for st in gone:
            self._leave(st)
        return [(st, st.result(FinishReason.ABORT)) for st in gone]

    def _leave(self, st: RequestState) -> None:
        del self._states[st.request_id]
        batch = self._groups[st.group]
        batch.remove([st.request_id])
        if not len(batch):
            del self._groups[st.group]

    def _step_group(self, key: tuple[str, int]) -> list[tuple[RequestState, Item]]:
        batch = self._groups[key]
        items: list[tuple[RequestState, Item]] = []
        try:
            start = time.perf_counter()
            outs = batch.step()
            self.timing.add(time.perf_counter() - start, batch.forward_s)
            for out in outs:
                st = self._states[out.request_id]
                event = st.event(out)
                if st.events:
                    items.append((st, event))
                finish = out.finish
                if finish == "error":
                    del self._states[st.request_id]
                    items.append((st, NonFiniteLogitsError([st.request_id])))
                    continue
                if finish is None and st.stopped_by_string:
                    batch.remove([st.request_id])
                    finish = "stop"
                if finish is not None:
                    del self._states[st.request_id]
                    items.append((st, st.result(FinishReason(finish))))
        except Exception as exc:   # the whole group fails; other groups carry on
            log.exception("denoising step failed")
            del self._groups[key]
            failed = [st for st in self._states.values() if st.group == key]
            for st in failed:
                del self._states[st.request_id]
            return items + [(st, exc) for st in failed]
        if not len(batch):
            del self._groups[key]
        return items


def is_final(item: Item) -> bool:
    return isinstance(item, (GenerationResult, BaseException))
