"""The one record of an in-flight request, and the one place that decides it is finished.

A ``Request`` carries everything about one generation from admission to result: the prompt and
its knobs, its noise generator, its status (waiting, running, finished), the sequence under
construction (prompt + answer, ``mask`` where not yet committed), the unit of positions the
next step may commit, its KV slot, where its output goes (``sink``), its timings and, once it
is over, its finish reason. The family layout (``layouts.py``) moves its pointers; the runner
commits tokens into it; ``check_finish`` alone ends it. Public outputs are made here too:
``event()`` a ``StepEvent`` per step, ``result()`` the ``GenerationResult``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Sequence

import torch

from ..config import NonFiniteLogitsError
from ..outputs import (LOGPROB_FLOOR, FinishReason, GenerationResult, StepEvent, Timings,
                       TokenLogprob, Usage, settled_text)
from ..params import GenerationParams

Item = StepEvent | GenerationResult | BaseException
Sink = Callable[[Item], None]


class Status(Enum):
    WAITING = "waiting"      # admitted, not yet in the running batch
    RUNNING = "running"
    FINISHED = "finished"


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """Cut ``text`` at the first occurrence of any stop string."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_ids: tuple[int, ...]
    params: GenerationParams
    seed: int
    canvas: tuple[int, ...] | None = None   # infill: an initial answer canvas (full attention)
    sink: Sink | None = None                # where the driver delivers events and the result
    decode: Callable[[Sequence[int]], str] = field(default=lambda ids: "", repr=False)
    events: bool = True                     # deliver a StepEvent per step, not only the result
    arrival: float = field(default_factory=time.perf_counter)
    deadline: float = math.inf
    status: Status = Status.WAITING
    # --- decoding state (``start`` and the family layout set it) ---
    seq: list[int] = field(default_factory=list)   # prompt + answer, mask where uncommitted
    end: int = 0                 # positions [P, end) are the answer the request may commit
    todo: int = 0                # answer positions still masked
    lo: int = 0                  # the unit the next step commits in: positions [lo, hi)
    hi: int = 0
    block_start: int = 0         # block-causal: the current model block's first position
    unit: int = -1               # index of the current block (full) / sub-block (block-causal)
    blocks_done: int = 0
    schedule: list[int] = field(default_factory=list)   # commits per step left in the unit
    fresh: bool = True           # full attention: the next step is its block's first (refresh)
    cached: int = 0              # block-causal: leading positions final in the KV slot
    slot: int = -1               # KV slot; ``uncond_slot``: the CFG twin's
    uncond_slot: int = -1
    generator: torch.Generator | None = None
    step: int = 0
    nfe: int = 0
    committed: tuple[int, ...] = ()          # this step's commits (answer positions)
    confidences: tuple[float, ...] = ()
    edited: tuple[int, ...] = ()             # those of them that replaced a token (editing)
    draft: tuple[int, ...] = ()   # tokens the sampler holds for the unit, not accepted yet
    grammar: Any = None           # structured output: the row's grammar state (GrammarRow)
    forced: tuple[int, ...] = ()  # this step's commits the grammar wrote (answer positions)
    # ``logprobs``: answer position -> (logprob, top pairs) from the step that committed it
    logprobs: dict[int, tuple[float, tuple[tuple[int, float], ...]]] = field(
        default_factory=dict)
    settling: bool = False       # token editing: the unit may still change (no advance/end)
    post_edits: int = 0          # forwards spent editing the unit after its last mask went
    prefix: int = 0              # end of the contiguous committed prefix (absolute)
    stop_at: int = -1            # absolute position of the first stop token in that prefix
    # --- delivery and the end ---
    text: str = ""
    _text_len: int = -1
    queue_s: float = 0.0
    first_block_s: float | None = None
    _full_text: str = ""
    pending: StepEvent | None = None         # this step's event, until delivered
    abort_requested: bool = False
    failure: BaseException | None = None     # set by a failed step; ends the request
    finish: FinishReason | None = None

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    def start(self, device: torch.device) -> None:
        """Set up the generator (one per request: its noise never depends on the batch)."""
        p = self.params
        if p.temperature > 0 or p.remasking == "random":
            self.generator = torch.Generator(device=device).manual_seed(self.seed)
        self.prefix = self.prompt_len

    # ------------------------------------------------------------ after a step
    def commit(self, ids: Sequence[float], take: Sequence[float], conf: Sequence[float],
               mask: int, stop: Sequence[int]) -> None:
        """Write this step's tokens (``take`` over the unit [lo, lo + len(take))): masked
        positions committed and, with token editing, committed ones replaced."""
        lo, P, seq, editing = self.lo, self.prompt_len, self.seq, self.params.edits
        picked = [j for j, t in enumerate(take) if t]
        had_masks = editing and mask in seq[lo:self.hi]
        # without token editing only masked positions are taken
        edits = [lo + j for j in picked if seq[lo + j] != mask] if editing else []
        for j in picked:
            seq[lo + j] = int(ids[j])
        self.committed = tuple(lo + j - P for j in picked)
        self.confidences = tuple(float(conf[j]) for j in picked)
        self.edited = tuple(i - P for i in edits)
        self.todo -= len(picked) - len(edits)
        self.step += 1
        if self.schedule:
            self.schedule.pop(0)
        if editing:
            self.post_edits += not had_masks
            self.settling = mask in seq[lo:self.hi] or \
                (bool(picked) and self.post_edits < self.params.max_post_edit_steps)
        if edits and edits[0] <= self.prefix:     # an edit inside the committed prefix
            self.prefix, self.stop_at, self._text_len = edits[0], -1, -1
        n = min(len(seq), self.end)
        while self.stop_at < 0 and self.prefix < n and seq[self.prefix] != mask:
            if seq[self.prefix] in stop:
                self.stop_at = self.prefix
            else:
                self.prefix += 1

    def note_logprobs(self, columns: Sequence[Sequence[float]]) -> None:
        """Record this step's commits' log-probabilities (``logprobs``) from the unit's
        columns, each [chosen logprob, k top logprobs, k top ids] (before ``lo`` moves)."""
        k, P, forced = self.params.logprobs, self.prompt_len, set(self.forced)
        for pos in self.committed:
            if pos in forced:        # written by the grammar, not chosen by the model
                tok = self.seq[P + pos]
                self.logprobs[pos] = (0.0, ((tok, 0.0),) if k else ())
                continue
            col = columns[pos + P - self.lo]
            width = (len(col) - 1) // 2
            top = tuple((int(t), max(v, LOGPROB_FLOOR))
                        for v, t in zip(col[1:1 + k], col[1 + width:1 + width + k]))
            self.logprobs[pos] = (max(col[0], LOGPROB_FLOOR), top)

    def check_finish(self, now: float, stops_at_eos: bool) -> FinishReason | None:
        """The one place that ends a request, in this order: abort, non-finite logits (an
        error), deadline, a stop string in the text, a stop token with everything before it
        committed (block-causal models always; full attention with ``early_stop``), every
        answer position committed. A stop token past ``gen_length`` ends it as "length"."""
        if self.finish is not None:
            return self.finish
        p, P = self.params, self.prompt_len
        finish = None
        if self.abort_requested or now >= self.deadline:
            finish = FinishReason.ABORT
        elif self.status is Status.WAITING:
            return None
        elif self.failure is not None:
            finish = FinishReason.ERROR
        elif self.settling:          # token editing may still change the unit
            return None
        elif p.stop and cut_at_stop(self._decoded(), p.stop)[1]:
            finish = FinishReason.STOP
        elif self.stop_at >= 0 and (stops_at_eos or self.todo == 0):
            finish = (FinishReason.STOP if self.stop_at - P <= p.gen_length
                      else FinishReason.LENGTH)
        elif self.todo == 0:
            finish = FinishReason.LENGTH
        if finish is not None:
            self.finish, self.status = finish, Status.FINISHED
        return finish

    # ------------------------------------------------------------ outputs
    def answer_ids(self) -> list[int]:
        """The committed answer before the first stop token or mask, at most gen_length
        (and, while token editing may still change the unit, only what precedes it)."""
        P = self.prompt_len
        end = min(self.prefix, P + self.params.gen_length)
        if self.settling:
            end = min(end, self.lo)
        return self.seq[P:end] if self.seq else []

    def _decoded(self) -> str:
        """The decoded answer prefix (re-decoded only when it grew)."""
        ids = self.answer_ids()
        if len(ids) != self._text_len:
            self._text_len, self._full_text = len(ids), self.decode(ids)
        return self._full_text

    def canvas_view(self) -> tuple[int, ...]:
        return tuple(self.seq[self.prompt_len:self.end])

    def _drafted(self, mask_id: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The canvas with the unit's draft tokens in its masked positions, and those
        positions (answer-relative)."""
        canvas = self.canvas_view()
        if not self.draft or self.finished:
            return canvas, ()
        P, cells = self.prompt_len, list(canvas)
        where = tuple(i - P for i in range(self.lo, self.hi) if self.seq[i] == mask_id)
        for j in where:
            cells[j] = self.draft[j + P - self.lo]
        return tuple(cells), where

    def note_progress(self) -> float:
        """Seconds since arrival; the first time a block is done (or the request ended) is
        its time to first block."""
        now = time.perf_counter() - self.arrival
        if self.first_block_s is None and (self.blocks_done > 0 or self.finished):
            self.first_block_s = now
        return now

    def event(self, mask_id: int, block_length: int) -> StepEvent:
        now = self.note_progress()
        text, _ = cut_at_stop(self._decoded(), self.params.stop)
        self.text = text if self.finished else settled_text(text, self.params.stop)
        canvas, draft = self._drafted(mask_id)
        return StepEvent(self.request_id, self.step, self.blocks_done, canvas,
                         self.committed, self.confidences, self.nfe, now, self.text, mask_id,
                         block_length, self.finished, self.edited, draft, self.forced)

    def result(self, encode: Callable[[str], list[int]]) -> GenerationResult:
        ids = self.answer_ids()
        text, cut = cut_at_stop(self._decoded(), self.params.stop) if self.seq else ("", False)
        token_ids = tuple(encode(text)) if cut else tuple(ids)
        return GenerationResult(
            request_id=self.request_id, text=text, token_ids=token_ids,
            canvas=self.canvas_view(), finish_reason=self.finish or FinishReason.ABORT,
            nfe=self.nfe, steps=self.step,
            timings=Timings(total_s=time.perf_counter() - self.arrival,
                            first_block_s=self.first_block_s, queue_s=self.queue_s),
            usage=Usage(prompt_tokens=self.prompt_len, completion_tokens=len(token_ids)),
            seed=self.seed, params=self.params.to_dict(),
            logprobs=None if self.params.logprobs is None else self._token_logprobs(
                token_ids, cut))

    def _token_logprobs(self, token_ids: Sequence[int], cut: bool) -> tuple[TokenLogprob, ...]:
        """The answer tokens' entries, and the stop token that ended the answer, if one did
        (as OpenAI's servers report it: a last token whose text is empty)."""
        out = [TokenLogprob(t, *self.logprobs.get(i, (0.0, ())))
               for i, t in enumerate(token_ids)]
        end = len(token_ids)
        if not cut and self.stop_at - self.prompt_len == end and end in self.logprobs:
            out.append(TokenLogprob(self.seq[self.stop_at], *self.logprobs[end]))
        return tuple(out)

    def outcome(self, encode: Callable[[str], list[int]]) -> Item:
        """What the client gets at the end: the result, or the error that ended it."""
        return self.failure if self.failure is not None else self.result(encode)
