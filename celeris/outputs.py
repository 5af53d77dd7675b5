"""What the engine hands back: StepEvent per denoising step, GenerationResult at the end.

Plain frozen dataclasses of Python values (no tensors, no torch import) so that the server,
the UI, bench and batch can consume them without touching the engine's internals.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, Sequence


class FinishReason(str, Enum):
    STOP = "stop"        # EOS committed or a stop string matched
    LENGTH = "length"    # the canvas filled up without EOS
    ABORT = "abort"      # the request was aborted (client gone, Stop button, deadline)
    ERROR = "error"      # internal: a step failed for it; its client gets the exception

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class StepEvent:
    """One denoising step of one request.

    canvas:      token ids of the answer canvas (gen_length long; ``mask_id`` where masked).
    committed:   canvas positions (0-based, relative to the answer) committed in this step.
    confidences: the confidence of each committed position, aligned with ``committed``.
    text:        decoded text of the contiguous committed prefix, cut at the first EOS/EoT.
    edited:      those ``committed`` positions that replaced an earlier token (token
                 editing, LLaDA2.1) instead of a mask.
    draft:       positions whose ``canvas`` token is the sampler's current draft, not accepted
                 yet (DiffusionGemma's uniform-noise canvas: tokens that change from step to
                 step, then are accepted at once); they count as masked in ``num_masked``
                 and are not part of ``text``.
    forced:      those ``committed`` positions the grammar wrote without the model choosing
                 them (structured output's jump-forward: a fixed key, a closing brace).
    """

    request_id: str
    step: int
    block: int
    canvas: tuple[int, ...]
    committed: tuple[int, ...]
    confidences: tuple[float, ...]
    nfe: int
    elapsed: float
    text: str
    mask_id: int
    block_length: int
    finished: bool = False
    edited: tuple[int, ...] = ()
    draft: tuple[int, ...] = ()
    forced: tuple[int, ...] = ()

    @property
    def num_masked(self) -> int:
        """Positions not yet final: masks, and draft tokens."""
        return sum(1 for t in self.canvas if t == self.mask_id) + len(self.draft)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["canvas"] = list(self.canvas)
        out["committed"] = list(self.committed)
        out["confidences"] = list(self.confidences)
        out["edited"] = list(self.edited)
        out["draft"] = list(self.draft)
        out["forced"] = list(self.forced)
        return out


@dataclass(frozen=True)
class Timings:
    total_s: float
    first_block_s: float | None = None   # time until the first block was fully committed
    queue_s: float = 0.0                 # time spent waiting for admission


@dataclass
class StepTiming:
    """Running totals over denoising steps: wall time of each step and, inside it, the model
    forward. step_s - forward_s is what the engine itself costs (host time: building inputs,
    choosing tokens, bookkeeping); on CPU the forward is synchronous, so the split is exact."""

    steps: int = 0
    step_s: float = 0.0
    forward_s: float = 0.0

    def add(self, step_s: float, forward_s: float) -> None:
        self.steps += 1
        self.step_s += step_s
        self.forward_s += forward_s

    def add_between(self, before: "StepTiming", after: "StepTiming") -> None:
        """Add the steps another timing counted between two of its snapshots."""
        self.steps += after.steps - before.steps
        self.step_s += after.step_s - before.step_s
        self.forward_s += after.forward_s - before.forward_s

    def snapshot(self) -> "StepTiming":
        return StepTiming(self.steps, self.step_s, self.forward_s)

    def since(self, before: "StepTiming") -> dict[str, float]:
        """Per-step means since ``before`` (ms), and the step count."""
        n = self.steps - before.steps
        step = (self.step_s - before.step_s) / n if n else 0.0
        fwd = (self.forward_s - before.forward_s) / n if n else 0.0
        return {"steps": n, "step_ms": 1e3 * step, "forward_ms": 1e3 * fwd,
                "host_ms": 1e3 * (step - fwd)}


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int   # generated tokens before the first EOS (docs/DESIGN.md)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def to_dict(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "total_tokens": self.total_tokens}


@dataclass(frozen=True)
class TokenLogprob:
    """One answer token's log-probability (``logprobs``): from the distribution of the step
    that committed it, with that step's ``top`` most likely (token, logprob) pairs. A token
    the grammar wrote (jump-forward) has logprob 0.0 and itself as its only alternative."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


LOGPROB_FLOOR = -9999.0   # log(0) as JSON can carry it


@dataclass(frozen=True)
class GenerationResult:
    """The final outcome of one request.

    token_ids: generated ids before the first EOS/EoT (no padding, no prompt).
    canvas:    the whole final answer canvas, EOS padding included.
    """

    request_id: str
    text: str
    token_ids: tuple[int, ...]
    canvas: tuple[int, ...]
    finish_reason: FinishReason
    nfe: int
    steps: int
    timings: Timings
    usage: Usage
    seed: int
    params: dict[str, Any] = field(default_factory=dict)
    logprobs: tuple[TokenLogprob, ...] | None = None   # aligned with token_ids, if asked

    @property
    def tokens_per_forward(self) -> float:
        return self.usage.completion_tokens / self.nfe if self.nfe else 0.0

    @property
    def tokens_per_s(self) -> float:
        t = self.timings.total_s
        return self.usage.completion_tokens / t if t > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "text": self.text,
            "token_ids": list(self.token_ids),
            "finish_reason": str(self.finish_reason),
            "nfe": self.nfe,
            "steps": self.steps,
            "tokens_per_forward": round(self.tokens_per_forward, 4),
            "elapsed_s": round(self.timings.total_s, 6),
            "first_block_s": self.timings.first_block_s,
            "tokens_per_s": round(self.tokens_per_s, 3),
            "usage": self.usage.to_dict(),
            "seed": self.seed,
            **({} if self.logprobs is None else {"logprobs": [
                {"token": t.token, "logprob": t.logprob, "top": [list(p) for p in t.top]}
                for t in self.logprobs]}),
        }


def settled_text(text: str, stops: Sequence[str]) -> str:
    """The part of a growing answer text that later steps can no longer change: without a
    trailing partial UTF-8 character (decoded as U+FFFD) and without a tail that could still
    grow into one of ``stops`` (a stop string, which would be cut off; a tool call's opening
    marker). A text built from it as the answer grows is always a prefix of the final text.
    The engine's step events, the server's stream and the tool-call reader all use it."""
    text = text.rstrip("\ufffd")
    hold = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), hold, -1):
            if text.endswith(stop[:k]):
                hold = k
                break
    return text[:len(text) - hold]
