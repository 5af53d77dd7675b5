"""lengths: short / medium / long answers, repeated, median and spread; invariance: the same
requests at batch 1 and batch 16 must give identical tokens."""

from __future__ import annotations

from typing import Any

from .common import (BenchContext, SuiteSkipped, messages, section, spread, story_prompt,
                     task_examples, timed_batches)
from .decode import DEFAULT_BEST, fast_changes

TARGETS = (("short", 64), ("medium", 256), ("long", 1024))
LENGTH_COLUMNS = (("system", "system", "s"), ("length", "length", "s"),
                  ("gen_length", "gen len", "d"), ("tokens_median", "tokens", ".0f"),
                  ("tokens_per_s_median", "tok/s median", ".2f"),
                  ("tokens_per_s_min", "min", ".2f"), ("tokens_per_s_max", "max", ".2f"),
                  ("latency_s_median", "latency s", ".3f"))


def _fit(target: int, room: int, block: int) -> int:
    """The target gen length, or the largest multiple of ``block`` that fits the context."""
    return target if target <= room else (room // block) * block


def length_plan(ctx: BenchContext, prompt_len: int, context: int
                ) -> tuple[list[tuple[str, int]], list[str]]:
    """[(label, gen_length)] and notes on what the model's context capped or dropped."""
    plan: list[tuple[str, int]] = []
    notes = []
    for label, target in TARGETS:
        gen = _fit(target, context - prompt_len, ctx.block_length_for_model())
        if plan and gen <= plan[-1][1]:
            notes.append(f"{label} ({target}) dropped: the {context}-token context is full")
            continue
        if gen != target:
            notes.append(f"{label}: gen_length {target} capped to {gen} by the "
                         f"{context}-token context")
        plan.append((label, gen))
    return plan, notes


def _repeat(run, repeats: int, bar: Any, system: str
            ) -> tuple[list[float], list[int], list[float]]:
    tps, tokens, walls = [], [], []
    for _ in range(repeats):
        (tok,), (wall,) = timed_batches(lambda chunk: [run()], [None], 1)
        tokens.append(tok)
        walls.append(wall)
        tps.append(tok / wall if wall > 0 else 0.0)
        bar.update(1, system=system)
    return tps, tokens, walls


def _length_row(system: str, label: str, gen: int, tps, tokens, walls) -> dict[str, Any]:
    s, w = spread(tps), spread(walls)
    return {"system": system, "length": label, "gen_length": gen,
            "tokens_median": spread(tokens)["median"], "tokens": tokens,
            "tokens_per_s_median": s["median"], "tokens_per_s_min": s["min"],
            "tokens_per_s_max": s["max"], "tokens_per_s_rel_stdev": s["rel_stdev"],
            "latency_s_median": w["median"], "latencies_s": walls}


def run_lengths(ctx: BenchContext) -> dict[str, Any]:
    engine = ctx.engine
    prompt = messages(story_prompt())
    prompt_len = len(engine.prepare(prompt, ctx.base_params()).prompt_ids)
    best = ctx.results.get("decode", {}).get("best", DEFAULT_BEST)
    params = ctx.base_params(**fast_changes(best))
    plan, cap_notes = length_plan(ctx, prompt_len, engine.info()["context_length"])
    try:
        ar = ctx.ar
    except SuiteSkipped as exc:
        ar, ar_note = None, str(exc)
    else:
        ar_note = f"AR twin: {ctx.ar_path()} (transformers generate, greedy, KV cache)"
    engine.generate(prompt, params.replace(gen_length=plan[0][1]))        # warm-up
    rows = []
    bar = ctx.bar(len(plan) * ctx.repeats * (2 if ar else 1),
                  f"{len(plan)} answer lengths, {ctx.repeats} repeats each")
    for label, gen in plan:
        p = params.replace(gen_length=gen)
        system = f"Celeris ({best})"
        runs = _repeat(lambda: engine.generate(prompt, p).usage.completion_tokens,
                       ctx.repeats, bar, f"{system}, {label}")
        rows.append(_length_row(system, label, gen, *runs))
        if ar is not None:
            runs = _repeat(lambda: ar.generate_batch([prompt], gen)[0]["completion_tokens"],
                           ctx.repeats, bar, f"AR twin, {label}")
            rows.append(_length_row("AR twin", label, gen, *runs))
    bar.close()
    notes = [f"story prompt {prompt[0]['content']!r} ({prompt_len} tokens), {ctx.repeats} "
             "repeats each, batch 1; the answer may end (EOS) before gen_length: 'tokens' is "
             "what was generated", ar_note,
             "the reference sampler is left out here (one forward per token at 1024 is minutes)",
             *cap_notes]
    settings = {"model": engine.info()["path"], "dtype": engine.info()["dtype"],
                "block_length": ctx.block_length_for_model(), "repeats": ctx.repeats, "batch": 1,
                "config": best, "params": params.to_dict()}
    return section("lengths", "Short / medium / long answers", LENGTH_COLUMNS, rows, settings,
                   notes)


# ---------------------------------------------------------------------- invariance
INVARIANCE_CONFIGS = (("fixed / none", dict(decoding="fixed", cache="none")),
                      ("threshold 0.9 / prefix", dict(decoding="threshold", cache="prefix")),
                      ("threshold 0.9 / dual", dict(decoding="threshold", cache="dual")))
INVARIANCE_BATCH = 16
INVARIANCE_TEMPERATURE = 0.8
INVARIANCE_COLUMNS = (("config", "config", "s"), ("requests", "requests", "d"),
                      ("identical", "identical", "d"), ("different", "different", "d"),
                      ("first_difference", "first difference", "s"))


def _requests(ctx: BenchContext, changes: dict[str, Any], n: int) -> list[Any]:
    """Even requests greedy, odd ones sampled at T > 0 with a per-request seed."""
    return [ctx.base_params(**changes, temperature=0.0 if i % 2 == 0 else
                            INVARIANCE_TEMPERATURE, seed=1000 + i) for i in range(n)]


def _difference(i: int, a: Any, b: Any) -> str:
    pos = next((k for k, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y),
               min(len(a.token_ids), len(b.token_ids)))
    return (f"request {i} (T={a.params['temperature']}): token {pos} differs "
            f"({len(a.token_ids)} vs {len(b.token_ids)} tokens)")


def run_invariance(ctx: BenchContext) -> dict[str, Any]:
    engine = ctx.engine
    examples = task_examples(-(-INVARIANCE_BATCH // 6))[:INVARIANCE_BATCH]
    prompts = [messages(ex.prompt) for ex in examples]
    rows = []
    bar = ctx.bar(len(INVARIANCE_CONFIGS) * (len(prompts) + 1),
                  f"{len(prompts)} requests alone, then in one batch")
    for name, changes in INVARIANCE_CONFIGS:
        params = _requests(ctx, changes, len(prompts))
        alone = []
        for p, q in zip(prompts, params):
            alone.append(engine.generate(p, q))
            bar.update(1, system=f"{name}, alone")
        together = engine.generate_batch(prompts, params)
        bar.update(1, system=f"{name}, batched")
        diffs = [_difference(i, a, b) for i, (a, b) in enumerate(zip(alone, together))
                 if a.token_ids != b.token_ids]
        rows.append({"config": name, "requests": len(prompts),
                     "identical": len(prompts) - len(diffs), "different": len(diffs),
                     "first_difference": diffs[0] if diffs else "-", "differences": diffs})
    bar.close()
    notes = [f"the same {len(prompts)} requests one at a time (batch 1) and in one "
             f"generate_batch (batch {len(prompts)}); even requests T=0, odd ones "
             f"T={INVARIANCE_TEMPERATURE} with seed 1000+i; prompts of different lengths, so "
             "the batch is left-padded"]
    settings = {"model": engine.info()["path"], "dtype": engine.info()["dtype"],
                "gen_length": ctx.gen_length, "block_length": ctx.block_length_for_model(),
                "batch_sizes": [1, len(prompts)]}
    return section("invariance", "Batch invariance (batch 1 vs batch 16)", INVARIANCE_COLUMNS,
                   rows, settings, notes)
