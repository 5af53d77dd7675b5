"""stories: long-story requests, Celeris at the model's default settings against the AR twin.

The checkable tasks have answers of 3-40 tokens, too short to show what parallel decoding does
on long outputs. This suite sends held-out long-story requests ("Tell me a story about a brave
fox named Pip.", answers of 150-400 tokens) to both systems at batch 1 and batch 8, in one
process, and scores every answer with ``longcheck.long_score``: sentences in shapes the story
grammar writes, the hero kept by name from start to end, the request honoured, a found object
kept the same object ("found a coin ... the coin was"), and the fraction of sentences that
repeat an earlier one of their story (lower is better; the corpus itself: ~0.5%).
"""

from __future__ import annotations

from typing import Any, Sequence

from .common import BenchContext, ar_params, messages, section, timed_side_by_side
from .decode import (AR_ENGINE_NOTE, AR_ENGINE_SYSTEM, AR_SYSTEM, DEFAULT_SYSTEM,
                     add_ratios)

STORY_COLUMNS = (("system", "system", "s"), ("batch", "batch", "d"),
                 ("tokens_per_s", "tok/s", ".2f"), ("tokens_per_forward", "TPF", ".2f"),
                 ("grammatical", "grammar", ".3f"), ("hero_kept", "hero", ".3f"),
                 ("request_honoured", "request", ".3f"), ("objects_kept", "objects", ".3f"),
                 ("repeated_sentences", "repeats", ".3f"),
                 ("distinct_sentences", "distinct", ".3f"), ("vs_ar", "x AR", ".2f"),
                 ("vs_ar_engine", "x AR(C)", ".2f"),
                 ("seed_stories", "5 seeds", ".2f"),
                 ("completion_tokens", "tokens", "d"), ("wall_s", "wall s", ".2f"),
                 ("request_by_field", "request by field", "s"))
MAX_NEW_TOKENS = 448          # a cap above the longest story (400 tokens) and its EOS
REQUESTS_PER_N = 8            # --n 5 -> 40 requests
PROMPT_ROOM = 48              # context kept for the chat-templated request
SEED_REQUESTS, SEEDS, SEED_TEMPERATURE = 4, 5, 0.8   # "5 seeds": one request, five samples


def requests_for(ctx: BenchContext) -> list[Any]:
    from celeris.synthetic.corpus import heldout_long_requests
    return heldout_long_requests(REQUESTS_PER_N * ctx.n)


def _row(system: str, batch: int, texts: list[str], tokens: list[int], nfe: list[int] | None,
         walls: list[float], requests: Sequence[Any], params: dict[str, Any]
         ) -> dict[str, Any]:
    from celeris.synthetic.longcheck import fields_line, long_score

    quality = long_score(texts, list(requests))
    total, wall = sum(tokens), sum(walls)
    row = {"system": system, "batch": batch, "requests": len(texts),
           "completion_tokens": total, "wall_s": wall,
           "tokens_per_s": total / wall if wall > 0 else 0.0,
           "mean_tokens": total / len(texts) if texts else 0.0, "params": params,
           **{k: quality[k] for k in ("grammatical", "hero_kept", "request_honoured",
                                      "objects_kept", "repeated_sentences",
                                      "distinct_sentences", "request_fields")},
           "request_by_field": fields_line(quality["request_fields"]),
           "quality": quality, "samples": texts[:2]}
    if nfe is not None:
        row["tokens_per_forward"] = total / sum(nfe) if sum(nfe) else 0.0
    return row


def max_new_tokens(ctx: BenchContext) -> int:
    """MAX_NEW_TOKENS, or less when the model's context leaves less room after a prompt."""
    context = int(ctx.engine.info().get("context_length") or MAX_NEW_TOKENS + PROMPT_ROOM)
    return max(8, min(MAX_NEW_TOKENS, context - PROMPT_ROOM))


def celeris_params(ctx: BenchContext) -> Any:
    """The model's defaults with gen_length the story cap (a full-attention model keeps its
    default steps per block)."""
    from celeris.synthetic.longcheck import long_params
    return long_params(ctx.engine.default_params(), max_new_tokens(ctx)).replace(
        seed=0, stop=())


def measure(ctx: BenchContext, requests: Sequence[Any], batch: int
            ) -> list[dict[str, Any]]:
    """[AR twin row, (same-engine AR row,) Celeris row] over the same requests in chunks of
    ``batch``, measured side by side (``timed_side_by_side``: every chunk by each system in
    turn)."""
    engine, ar, cap = ctx.engine, ctx.ar, max_new_tokens(ctx)
    params = celeris_params(ctx)
    runs = {"ar": lambda chunk: ar.generate_batch([messages(r.text) for r in chunk], cap)}
    engines = {}
    if ctx.ar_engine is not None:
        engines[AR_ENGINE_SYSTEM] = (ctx.ar_engine, ctx.ar_engine_params(cap))
    engines[DEFAULT_SYSTEM] = (engine, params)
    for name, (eng, p) in engines.items():
        runs[name] = _engine_run(eng, p)
    bar = ctx.bar(len(runs) * len(requests), f"batch {batch}, {len(runs)} systems")
    out = timed_side_by_side(runs, requests, batch, bar)
    bar.close()
    ar_results, ar_walls = out["ar"]
    rows = [_row(AR_SYSTEM, batch, [r["text"] for r in ar_results],
                 [r["completion_tokens"] for r in ar_results], None, ar_walls, requests,
                 ar_params(cap))]
    for name, (eng, p) in engines.items():
        results, walls = out[name]
        rows.append(_row(name, batch, [r.text for r in results],
                         [r.usage.completion_tokens for r in results],
                         [r.nfe for r in results], walls, requests, p.to_dict()))
        if batch == 1:                 # sampled diversity, outside the timed runs
            ctx.say(f"{name}: {SEEDS} samples of {SEED_REQUESTS} requests at T "
                    f"{SEED_TEMPERATURE} (untimed)")
            rows[-1]["seed_stories"] = seed_stories(eng, p, requests)
    return rows


def seed_stories(engine: Any, params: Any, requests: Sequence[Any]) -> float:
    """Distinct stories among SEEDS samples of one request at temperature SEED_TEMPERATURE,
    averaged over the first SEED_REQUESTS requests (a model that tells one story: 1)."""
    reqs = list(requests)[:SEED_REQUESTS]
    prompts = [messages(r.text) for r in reqs for _ in range(SEEDS)]
    plist = [params.replace(temperature=SEED_TEMPERATURE, seed=s)
             for _ in reqs for s in range(SEEDS)]
    texts = [r.text for r in engine.generate_batch(prompts, plist)]
    return sum(len(set(texts[i * SEEDS:(i + 1) * SEEDS])) for i in range(len(reqs))) / len(reqs)


def _engine_run(engine: Any, params: Any):
    """A chunk runner: one engine batch of the chunk's requests as chat messages."""
    return lambda chunk: engine.generate_batch([messages(r.text) for r in chunk], params)


def run_stories(ctx: BenchContext) -> dict[str, Any]:
    requests = requests_for(ctx)
    warm = [messages(requests[0].text)]
    ctx.say("loading the models and warming up")
    ctx.ar.generate_batch(warm, 8)                       # skips early when the twin is missing
    ctx.engine.generate_batch(warm, celeris_params(ctx).replace(gen_length=16, steps=None))
    rows = []
    for batch in (1, 8):
        batch_rows = measure(ctx, requests, batch)
        add_ratios(batch_rows)
        rows += batch_rows
    info = ctx.engine.info()
    settings = {"model": info["path"], "dtype": info["dtype"], "device": info["device"],
                "ar_model": ctx.ar.info(), "requests": len(requests), "batches": [1, 8],
                "max_new_tokens": max_new_tokens(ctx),
                "celeris_params": celeris_params(ctx).to_dict(),
                "prompt_source": "celeris.synthetic.corpus.heldout_long_requests (held-out), "
                                 "as chat messages"}
    cap = max_new_tokens(ctx)
    notes = ["the two systems ran side by side: each chunk of requests by both in turn",
             "Celeris runs the model's own defaults (generation_config.json) with gen_length "
             f"a cap of {cap}; the AR twin runs greedy generate() with "
             f"max_new_tokens = {cap}",
             "grammar = fraction of sentences in shapes the story grammar writes; hero = "
             "fraction of stories whose named hero is kept to the end; request = fraction "
             "whose hero/place/object is the one asked for, and by field how many of the "
             "requests asking for it got it; objects = fraction whose found "
             "objects stay the same object; repeats = fraction of sentences repeating an "
             "earlier one of the same story (corpus ~0.005); distinct = fraction of all the "
             "answers' sentences that are distinct, names replaced by one placeholder (the "
             "corpus's stories for the 40 held-out requests 0.65; one story told to every request "
             "scores low) (celeris.synthetic.longcheck)",
             f"5 seeds = distinct stories among {SEEDS} samples of one request at temperature "
             f"{SEED_TEMPERATURE} (seeds 0-{SEEDS - 1}), mean over the first {SEED_REQUESTS} "
             "requests; engine systems, batch-1 rows (the HF twin's generate() is greedy)",
             "TPF = completion tokens / model forwards (Celeris only)", AR_ENGINE_NOTE]
    return section("stories", "Long-story requests: Celeris vs the autoregressive twin",
                   STORY_COLUMNS, rows, settings, notes)
