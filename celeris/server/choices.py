"""The choices of one request: prompts x samples, each an engine request of its own.

OpenAI reads ``prompt`` as one prompt or a batch of them and ``n`` (``best_of``) as samples
per prompt; choice ``index`` = prompt x n + sample. The samples of a prompt are rows of the
engine's running batch like any other requests (their prompts are prefilled per row); sample
i is seeded ``seed + i`` when the request gives a seed. ``echo`` puts the prompt in front of
the text, and with ``logprobs`` scores its tokens (``Engine.score``: log p(x_i | x_<i), the
first None); ``suffix`` makes the answer the gap between prompt and suffix (the Infill path).
Log-probabilities are shaped here too: the completions (legacy) and chat forms.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..outputs import GenerationResult, TokenLogprob
from ..params import MAX_SEED, GenerationParams
from .errors import invalid
from .protocol import MAX_CHOICES, CompletionRequest


@dataclass
class Choice:
    index: int                       # in the response (best_of: set once the best are known)
    prompt: Any                      # text, token ids or messages (rendered with tools)
    params: GenerationParams
    request_id: str
    canvas: list[int] | None = None  # suffix: the gap and the pinned suffix
    echo: str = ""                   # the prompt's text, in front of the answer (echo)
    scores: list[TokenLogprob | None] | None = None   # the prompt's tokens (echo + logprobs)
    result: GenerationResult | None = None
    gap: int = 0                     # suffix: the gap's width (the answer is its fill)
    first: int = 0                   # the echoed prompt's first token (it has no score)

    def text(self, decode: Callable[[Sequence[int]], str]) -> str:
        """The answer's text: a suffix request's is the gap's fill only."""
        assert self.result is not None
        if self.canvas is None:
            return self.echo + self.result.text
        return self.echo + decode(list(self.result.token_ids[:self.gap]))

    def logprobs(self) -> list[tuple[int, TokenLogprob | None]]:
        """(token, its entry) for the echoed prompt's tokens (if scored; the first has no
        entry) and the answer's."""
        answer = list(self.result.logprobs or ()) if self.result is not None else []
        if self.canvas is not None:
            answer = answer[:self.gap]
        head = [(t.token if t else self.first, t) for t in self.scores or []]
        return [*head, *((t.token, t) for t in answer)]

    def mean_logprob(self) -> float:
        """best_of's ranking: the answer's mean log-probability per token."""
        lps = [t.logprob for t in (self.result.logprobs or ())] if self.result else []
        return sum(lps) / len(lps) if lps else float("-inf")


@dataclass
class Plan:
    """What a request asks beyond one answer: how many, scored or not, echoed or not."""

    n: int = 1
    drawn: int = 1
    top: int | None = None           # logprobs asked: k alternatives; None: not asked
    echo: bool = False
    score_only: bool = False         # echo with max_tokens 0: the prompt and its scores
    suffix: str | None = None
    prompts: list[Any] = field(default_factory=list)

    @classmethod
    def of(cls, req: Any) -> "Plan":
        completion = isinstance(req, CompletionRequest)
        n, drawn = req.samples()
        prompts = req.to_prompts() if completion else [req.to_prompt()]
        if len(prompts) * drawn > MAX_CHOICES:
            raise invalid(f"prompts x samples must be at most {MAX_CHOICES}, got "
                          f"{len(prompts)} x {drawn}", "n")
        echo = bool(completion and req.echo)
        score_only = echo and req.max_tokens == 0
        suffix = req.suffix if completion else None
        if score_only and req.stream:
            raise invalid("max_tokens 0 (scoring the prompt) cannot be streamed", "max_tokens")
        if suffix is not None and echo:
            raise invalid("suffix cannot be combined with echo", "suffix")
        return cls(n, drawn, req.top_logprobs_asked(), echo, score_only, suffix, prompts)

    def params(self, params: GenerationParams) -> GenerationParams:
        """The engine's log-probabilities: asked, or needed to rank best_of's samples."""
        if self.top is not None:
            return params.replace(logprobs=self.top)
        return params.replace(logprobs=0) if self.drawn > self.n else params

    def seeded(self, params: GenerationParams, sample: int) -> GenerationParams:
        """Sample i of a prompt: seed + i (a given seed), its own random seed otherwise."""
        if params.seed is None or sample == 0:
            return params
        return params.replace(seed=(params.seed + sample) % (MAX_SEED + 1))

    def keep(self, choices: list[Choice]) -> list[Choice]:
        """best_of: the n samples of each prompt with the highest mean logprob per token;
        indexes renumbered prompt x n + rank. Otherwise every choice as it is."""
        if self.drawn == self.n:
            return choices
        kept: list[Choice] = []
        for p in range(len(self.prompts)):
            mine = choices[p * self.drawn:(p + 1) * self.drawn]
            best = sorted(mine, key=lambda c: -c.mean_logprob())[:self.n]
            for rank, c in enumerate(best):
                c.index = p * self.n + rank
                kept.append(c)
        return kept


# ----------------------------------------------------------------------- shapes
def completion_logprobs(pairs: list[tuple[int, TokenLogprob | None]], strings: Callable
                        ) -> dict[str, Any]:
    """The completions endpoint's (legacy) logprobs object for (token, entry) pairs."""
    tokens = strings([t for t, _ in pairs])
    entries = [e for _, e in pairs]
    offsets, at = [], 0
    for s in tokens:
        offsets.append(at)
        at += len(s)
    return {"tokens": tokens,
            "token_logprobs": [None if e is None else e.logprob for e in entries],
            "top_logprobs": [None if e is None else _top_dict(e, strings) for e in entries],
            "text_offset": offsets}


def _top_dict(entry: TokenLogprob, strings: Callable) -> dict[str, float]:
    names = strings([t for t, _ in entry.top])
    return {name: lp for name, (_, lp) in zip(names, entry.top)}


def chat_logprobs(pairs: list[tuple[int, TokenLogprob | None]], strings: Callable
                  ) -> dict[str, Any]:
    """The chat endpoint's logprobs object: content tokens with bytes and top lists."""
    content = []
    for _, e in pairs:
        if e is None:
            continue
        (s,) = strings([e.token])
        alts = strings([t for t, _ in e.top])
        content.append({"token": s, "logprob": e.logprob, "bytes": list(s.encode()),
                        "top_logprobs": [{"token": a, "logprob": lp, "bytes": list(a.encode())}
                                         for a, (_, lp) in zip(alts, e.top)]})
    return {"content": content, "refusal": None}


# ---------------------------------------------------------------------- engine requests
async def make_choices(engine: Any, plan: Plan, params: GenerationParams, request_id: str
                       ) -> list[Choice]:
    """One Choice per prompt and sample (suffix: the gap's canvas, refused where the
    family writes left to right)."""
    choices = []
    for p, prompt in enumerate(plan.prompts):
        for i in range(plan.drawn):
            rid = request_id if len(plan.prompts) * plan.drawn == 1 else \
                f"{request_id}-{p}-{i}"
            c = Choice(p * plan.drawn + i, prompt, plan.seeded(params, i), rid)
            if plan.suffix is not None:
                await _suffixed(engine, plan, c)
            choices.append(c)
    return choices


async def _suffixed(engine: Any, plan: Plan, c: Choice) -> None:
    if not isinstance(c.prompt, str):
        raise invalid("suffix needs a text prompt (not token ids)", "suffix")
    try:
        c.prompt, c.canvas, c.params = await asyncio.to_thread(
            engine.suffix_request, c.prompt, plan.suffix, c.params)
    except ValueError as exc:
        raise invalid(f"suffix: {exc}", "suffix") from None
    c.gap = sum(1 for t in c.canvas if t == engine.special.mask)


async def echo_prompts(engine: Any, plan: Plan, choices: list[Choice]) -> None:
    """The prompts' text in front of their answers; with logprobs, their tokens' scores
    (computed once per prompt, between denoising steps)."""
    done: dict[int, tuple[str, int, Any]] = {}
    for c in choices:
        p = c.index // plan.drawn
        if p not in done:
            try:
                ids = await asyncio.to_thread(engine.prompt_ids, c.prompt)
                scores = None if plan.top is None else await asyncio.to_thread(
                    engine.score, ids, plan.top)
            except ValueError as exc:
                raise invalid(str(exc), "logprobs" if plan.top is not None else "prompt"
                              ) from None
            text = c.prompt if isinstance(c.prompt, str) else engine.tokenizer.decode(ids)
            done[p] = text, ids[0], scores
        c.echo, c.first, c.scores = done[p]


def settle_text(engine: Any, c: Choice, result: GenerationResult) -> str:
    """Keep ``result`` as the choice's and give its text (the suffix gap's, when any)."""
    c.result = result
    return c.text(engine.tokenizer.decode)


def choice_logprobs(engine: Any, c: Choice, chat: bool, plan: Plan) -> dict[str, Any] | None:
    """The choice's log-probabilities in the endpoint's shape, None when not asked."""
    if plan.top is None:
        return None
    pairs = c.logprobs()
    shape = chat_logprobs if chat else completion_logprobs
    return shape(pairs, engine.token_strings)
