"""stories: long-story requests, Celeris at the model's default settings against the AR twin.

The checkable tasks have answers of 3-40 tokens, too short to show what parallel decoding does
on long outputs. This suite sends held-out long-story requests (answers of 150-400 tokens) to
both systems, in one process, and scores every answer with ``longcheck.long_score``: sentences
in shapes the story grammar writes, the hero kept by name from start to end, the request
honoured, a found object kept the same object ("found a coin ... the coin was"), and the
fraction of sentences that repeat an earlier one of their story (lower is better; the corpus
itself: ~0.5%). Two request sets (``SETS``):

- ``phrasings`` (batch 1 and 8): freely phrased requests that each hold a part of the request
  grammar no training request uses (``phrasing.heldout_free_requests``: "Can you make up a
  tale about Pip, a brave fox who got a key?"), how visitors ask;
- ``templates`` (batch 1): new texts of the corpus's ten request sentences
  (``corpus.heldout_long_requests``: "Tell me a story about a brave fox named Pip."), the set
  earlier figures were measured on.

The systems run request by request in turn (``timed_side_by_side``), and each row reports the
spread of the per-chunk speed ratio against the twin beside the ratio of the totals.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

from .common import (BenchContext, ar_params, messages, section, spread, timed_batches,
                     timed_side_by_side)
from .decode import (AR_ENGINE_NOTE, AR_ENGINE_SYSTEM, AR_SYSTEM, DEFAULT_SYSTEM,
                     add_ratios)

STORY_COLUMNS = (("prompts", "requests", "s"), ("system", "system", "s"),
                 ("batch", "batch", "d"),
                 ("tokens_per_s", "tok/s", ".2f"), ("tokens_per_forward", "TPF", ".2f"),
                 ("grammatical", "grammar", ".3f"), ("hero_kept", "hero", ".3f"),
                 ("request_honoured", "request", ".3f"), ("objects_kept", "objects", ".3f"),
                 ("repeated_sentences", "repeats", ".3f"),
                 ("distinct_sentences", "distinct", ".3f"), ("vs_ar", "x AR", ".2f"),
                 ("vs_ar_engine", "x AR(C)", ".2f"),
                 ("seed_stories", "5 seeds", ".2f"),
                 ("vs_ar_chunks", "x AR per chunk", "s"),
                 ("completion_tokens", "tokens", "d"), ("mean_tokens", "tokens/answer", ".1f"),
                 ("wall_s", "wall s", ".2f"),
                 ("request_by_field", "request by field", "s"))
SETS = (("phrasings", (1, 8)), ("templates", (1,)))      # request set, batch sizes
MAX_NEW_TOKENS = 448          # a cap above the longest story (400 tokens) and its EOS
REQUESTS_PER_N = 8            # --n 5 -> 40 requests
PROMPT_ROOM = 48              # context kept for the chat-templated request (at least)
SEED_REQUESTS, SEEDS, SEED_TEMPERATURE = 4, 5, 0.8   # "5 seeds": one request, five samples
CANVAS_BATCH = 8              # the full-attention sibling's rows: chunks of 8, timed alone


def requests_for(ctx: BenchContext, which: str = "phrasings") -> list[Any]:
    """The held-out requests of set ``which`` ("phrasings" or "templates"), 8 per ``--n``."""
    return list(_held_out(which, REQUESTS_PER_N * ctx.n))


@functools.lru_cache(maxsize=None)
def _held_out(which: str, n: int) -> tuple[Any, ...]:
    from celeris.synthetic.corpus import heldout_long_requests
    from celeris.synthetic.phrasing import heldout_free_requests
    held = heldout_free_requests if which == "phrasings" else heldout_long_requests
    return tuple(held(n))


def chunk_ratios(tokens: Sequence[int], walls: Sequence[float], ref_tokens: Sequence[int],
                 ref_walls: Sequence[float], batch: int) -> list[float]:
    """The speed ratio (tokens/s over the reference's) chunk by chunk: the chunks of ``batch``
    requests each system ran back to back, so each ratio compares the same requests at the
    same moment of the machine."""
    out = []
    for k, (wall, ref_wall) in enumerate(zip(walls, ref_walls)):
        mine, ref = (sum(t[k * batch:(k + 1) * batch]) for t in (tokens, ref_tokens))
        if wall > 0 and ref_wall > 0 and ref:
            out.append((mine / wall) / (ref / ref_wall))
    return out


def _spread_text(ratios: Sequence[float]) -> str:
    s = spread(ratios)
    if s["median"] is None:
        return ""
    return f"{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})"


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
    """MAX_NEW_TOKENS, or less when the model's context leaves less room after the longest
    chat-templated request of the sets."""
    context = int(ctx.engine.info().get("context_length") or MAX_NEW_TOKENS + PROMPT_ROOM)
    longest = max(len(ctx.engine.prompt_ids(messages(r.text)))
                  for which, _ in SETS for r in requests_for(ctx, which))
    return max(8, min(MAX_NEW_TOKENS, context - max(PROMPT_ROOM, longest)))


def celeris_params(ctx: BenchContext) -> Any:
    """The model's defaults with gen_length the story cap (a full-attention model keeps its
    default steps per block)."""
    from celeris.synthetic.longcheck import long_params
    return long_params(ctx.engine.default_params(), max_new_tokens(ctx)).replace(
        seed=0, stop=())


def measure(ctx: BenchContext, requests: Sequence[Any], batch: int, label: str = "phrasings",
            seeds: bool = True) -> list[dict[str, Any]]:
    """[AR twin row, (same-engine AR row,) Celeris row] over the same requests in chunks of
    ``batch``, measured side by side (``timed_side_by_side``: every chunk by each system in
    turn); ``seeds``: sample the "5 seeds" diversity at batch 1."""
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
    ar_tokens = [r["completion_tokens"] for r in ar_results]
    rows = [_row(AR_SYSTEM, batch, [r["text"] for r in ar_results], ar_tokens, None, ar_walls,
                 requests, ar_params(cap))]
    for name, (eng, p) in engines.items():
        results, walls = out[name]
        tokens = [r.usage.completion_tokens for r in results]
        rows.append(_row(name, batch, [r.text for r in results], tokens,
                         [r.nfe for r in results], walls, requests, p.to_dict()))
        rows[-1]["vs_ar_chunks"] = _spread_text(
            chunk_ratios(tokens, walls, ar_tokens, ar_walls, batch))
        if batch == 1 and seeds:       # sampled diversity, outside the timed runs
            ctx.say(f"{name}: {SEEDS} samples of {SEED_REQUESTS} requests at T "
                    f"{SEED_TEMPERATURE} (untimed)")
            rows[-1]["seed_stories"] = seed_stories(eng, p, requests)
    for row in rows:
        row["prompts"] = label
    return rows


def measure_canvas(ctx: BenchContext, requests: Sequence[Any], label: str) -> list[dict[str, Any]]:
    """The full-attention sibling (``ctx.canvas``: what the Infill tab and the Race's canvas
    column run) at its own defaults, gen length included, over the same requests in chunks of
    CANVAS_BATCH, timed alone (no ratio: the twin does not run beside it); [] without one."""
    canvas = ctx.canvas
    if canvas is None:
        return []
    params = canvas.default_params().replace(seed=0, stop=())
    bar = ctx.bar(len(requests), f"{label}, full-attention model at its defaults")
    results, walls = timed_batches(_engine_run(canvas, params), requests, CANVAS_BATCH, bar)
    bar.close()
    name = f"full-attention {canvas.info()['model']} (its defaults)"
    row = _row(name, CANVAS_BATCH, [r.text for r in results],
               [r.usage.completion_tokens for r in results], [r.nfe for r in results], walls,
               requests, params.to_dict())
    row["prompts"] = label
    return [row]


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
    sets = {which: requests_for(ctx, which) for which, _ in SETS}
    warm = [messages(sets["phrasings"][0].text)]
    ctx.say("loading the models and warming up")
    ctx.ar.generate_batch(warm, 8)                       # skips early when the twin is missing
    ctx.engine.generate_batch(warm, celeris_params(ctx).replace(gen_length=16, steps=None))
    rows = []
    for which, batches in SETS:
        for batch in batches:
            batch_rows = measure(ctx, sets[which], batch, which, seeds=which == "phrasings")
            add_ratios(batch_rows)
            rows += batch_rows
        rows += measure_canvas(ctx, sets[which], which)
    info = ctx.engine.info()
    settings = {"model": info["path"], "dtype": info["dtype"], "device": info["device"],
                "ar_model": ctx.ar.info(), "requests": len(sets["phrasings"]),
                "sets": {which: list(batches) for which, batches in SETS},
                "max_new_tokens": max_new_tokens(ctx),
                "celeris_params": celeris_params(ctx).to_dict(),
                "prompt_source": "phrasings: celeris.synthetic.phrasing.heldout_free_requests "
                                 "(held-out parts); templates: "
                                 "celeris.synthetic.corpus.heldout_long_requests (held-out "
                                 "texts); as chat messages"}
    cap = max_new_tokens(ctx)
    notes = ["the systems ran side by side: each chunk of requests by each in turn, the "
             "order rotating; x AR per chunk = median (min-max) over the chunks of the "
             "chunk's tokens/s over the twin's on the same chunk (at batch 1: request by "
             "request); x AR = total tokens / total wall over the twin's",
             "phrasings = freely phrased requests, each holding a part of the request "
             "grammar no training request uses; templates = new texts of the corpus's ten "
             "request sentences",
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
             "corpus's stories for 40 held-out requests ~0.65; one story told to every request "
             "scores low) (celeris.synthetic.longcheck)",
             f"5 seeds = distinct stories among {SEEDS} samples of one request at temperature "
             f"{SEED_TEMPERATURE} (seeds 0-{SEEDS - 1}), mean over the first {SEED_REQUESTS} "
             "requests; engine systems, batch-1 rows (the HF twin's generate() is greedy)",
             "TPF = completion tokens / model forwards (Celeris only)", AR_ENGINE_NOTE,
             "full-attention rows: the full-canvas model the playground runs beside the "
             "block model (the Infill tab, the Race's canvas column; --canvas-model) at its "
             f"own generation_config.json, gen length included, in chunks of {CANVAS_BATCH}, "
             "timed alone (no x AR)"]
    return section("stories", "Long-story requests: Celeris vs the autoregressive twin",
                   STORY_COLUMNS, rows, settings, notes)
