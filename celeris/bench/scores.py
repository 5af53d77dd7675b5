"""``bench --suite scores``: what samples, log-probabilities and scoring cost.

Three comparisons, each measured side by side in this process, alternately, ``--repeats``
times:

- ``n = 4`` at temperature 0.8: one batch of four samples of a story request (what the
  server runs for ``n: 4``: four rows, seeds seed..seed+3) against the same four requests one
  after another;
- ``logprobs`` on (top 5) against off, at batch 1 and 16 (the tokens must be the same);
- scoring a 256-token text (``echo`` + ``logprobs``: ``Engine.score``) against generating 256
  tokens (EOS suppressed, so the answer has that length) after the same request.
"""

from __future__ import annotations

import time
from typing import Any

from .common import BenchContext, messages, section, story_prompt

COLUMNS = [("config", "config", "s"), ("batch", "batch", "d"), ("tokens", "tokens", "d"),
           ("seconds", "s", ".2f"), ("tokens_per_s", "tok/s", ".1f"), ("ratio", "x", ".2f"),
           ("check", "check", "s")]
SCORED_TOKENS = 256
TOP = 5


def _timed(run: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    out = run()
    return out, time.perf_counter() - start


def _tokens(results: list[Any]) -> int:
    return sum(r.usage.completion_tokens for r in results)


def _row(config: str, batch: int, tokens: int, seconds: float, **extra: Any) -> dict[str, Any]:
    return {"config": config, "batch": batch, "tokens": tokens, "seconds": round(seconds, 2),
            "tokens_per_s": round(tokens / seconds, 1) if seconds else None, **extra}


def _samples(ctx: BenchContext) -> list[dict[str, Any]]:
    engine = ctx.engine
    prompt = messages(story_prompt(0)) if engine.tokenizer.has_chat_template else story_prompt(0)
    params = [ctx.base_params(temperature=0.8, seed=7 + i) for i in range(4)]
    tally = {"batch": [0, 0.0], "sequential": [0, 0.0]}
    texts: list[str] = []
    for _ in range(ctx.repeats):
        batch, t = _timed(lambda: engine.generate_batch([prompt] * 4, params))
        tally["batch"][0] += _tokens(batch)
        tally["batch"][1] += t
        alone, t = _timed(lambda: [engine.generate(prompt, p) for p in params])
        tally["sequential"][0] += _tokens(alone)
        tally["sequential"][1] += t
        same = [a.token_ids for a in alone] == [b.token_ids for b in batch]
        texts = [r.text for r in batch]
    rows = [_row("4 requests one after another", 1, *tally["sequential"]),
            _row("n = 4 (one batch)", 4, *tally["batch"],
                 check=f"{len(set(texts))} distinct of 4; same as alone: {same}")]
    if rows[0]["tokens_per_s"] and rows[1]["tokens_per_s"]:
        rows[1]["ratio"] = round(rows[1]["tokens_per_s"] / rows[0]["tokens_per_s"], 2)
    return rows


def _logprob_rows(ctx: BenchContext, batch: int) -> list[dict[str, Any]]:
    engine = ctx.engine
    chat = engine.tokenizer.has_chat_template
    prompts = [messages(story_prompt(i)) if chat else story_prompt(i) for i in range(batch)]
    base = ctx.base_params()
    tally = {"off": [0, 0.0], "on": [0, 0.0]}
    same = True
    for _ in range(ctx.repeats):
        off, t = _timed(lambda: engine.generate_batch(prompts, base))
        tally["off"][0] += _tokens(off)
        tally["off"][1] += t
        on, t = _timed(lambda: engine.generate_batch(prompts, base.replace(logprobs=TOP)))
        tally["on"][0] += _tokens(on)
        tally["on"][1] += t
        same &= [r.token_ids for r in on] == [r.token_ids for r in off]
    rows = [_row("logprobs off", batch, *tally["off"]),
            _row(f"logprobs on (top {TOP})", batch, *tally["on"],
                 check=f"same tokens: {same}")]
    if rows[0]["tokens_per_s"] and rows[1]["tokens_per_s"]:
        rows[1]["ratio"] = round(rows[1]["tokens_per_s"] / rows[0]["tokens_per_s"], 3)
    return rows


def scoring_text(engine: Any, n: int = SCORED_TOKENS) -> list[int]:
    """``n`` token ids of held-out stories (the text a harness would score)."""
    from celeris.synthetic.corpus import heldout_stories

    ids: list[int] = []
    for story in heldout_stories():
        ids += engine.tokenizer.encode(story, add_special_tokens=not ids)
        if len(ids) >= n:
            return ids[:n]
    return ids


def _scoring_rows(ctx: BenchContext) -> list[dict[str, Any]]:
    engine = ctx.engine
    room = engine.model.config.max_position_embeddings - 8     # the generation's prompt: 8
    ids = scoring_text(engine, min(SCORED_TOKENS, room))
    n = len(ids)
    params = ctx.base_params(gen_length=n, suppress_eos=True)
    prompt = ids[:8]
    score_s = gen_s = 0.0
    gen_tokens = 0
    for _ in range(ctx.repeats):
        _, t = _timed(lambda: engine.score(ids, top=1))
        score_s += t
        (result,), t = _timed(lambda: engine.generate_batch([prompt], params))
        gen_s += t
        gen_tokens += result.usage.completion_tokens
    r = ctx.repeats
    return [_row(f"generate {n} tokens", 1, gen_tokens, gen_s),
            _row(f"score a {n}-token text (echo + logprobs)", 1, n * r, score_s,
                 ratio=round(score_s / gen_s, 2) if gen_s else None,
                 check="x = time / generation's")]


def run_scores(ctx: BenchContext) -> dict[str, Any]:
    engine = ctx.engine
    rows = _samples(ctx)
    for batch in (1, 16):
        rows += _logprob_rows(ctx, batch)
    rows += _scoring_rows(ctx)
    settings = {"model": engine.model_dir.name, "max_tokens": ctx.gen_length,
                "repeats": ctx.repeats, "top_logprobs": TOP}
    notes = ["tok/s = completion tokens / wall time of the calls, summed over the repeats; "
             "the two configurations of a pair alternate call by call",
             "n = 4: temperature 0.8, seeds 7-10, the story request of seed 0; x = tok/s over "
             "the sequential requests'",
             "logprobs: greedy story requests (one per row); x = tok/s with over without",
             f"scoring: {SCORED_TOKENS} tokens of held-out stories, Engine.score (each "
             "token's log p(x_i | x_<i), i and what follows masked); x = its time over "
             f"generating {SCORED_TOKENS} tokens (EOS suppressed) after 8 of them"]
    return section("scores", "Samples, log-probabilities and scoring", COLUMNS, rows,
                   settings, notes)
