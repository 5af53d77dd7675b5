"""decode: the reference sampler against each fast configuration; ar: Celeris against its
autoregressive twin. Same held-out checkable-task prompts (sent as chat messages), same run.

The reference is LLaDA's sampler as published (Nie et al. 2025, Alg. 4): a fixed schedule of
one token per step (steps = gen_length), no cache and no early stop. ``fixed+early-stop``
separates what early stop alone buys from what parallel decoding and the cache add.
"""

from __future__ import annotations

from typing import Any, Sequence

from celeris.outputs import StepTiming

from .common import (BenchContext, accuracy, ar_params, messages, section, task_examples,
                     timed_side_by_side)

# (name, GenerationParams changes); steps=None means steps = gen_length.
REFERENCE = ("reference", dict(decoding="fixed", steps=None, cache="none", early_stop=False))
FAST_CONFIGS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("fixed+early-stop", dict(decoding="fixed", cache="none", early_stop=True)),
    *((f"threshold {t} / {c}", dict(decoding="threshold", threshold=t, cache=c, early_stop=True))
      for t in (0.7, 0.8, 0.9) for c in ("none", "prefix", "dual")),
    *((f"factor 1.0 / {c}", dict(decoding="factor", factor=1.0, cache=c, early_stop=True))
      for c in ("none", "prefix", "dual")),
)
DEFAULT_BEST = "threshold 0.9 / prefix"
MODEL_DEFAULTS: dict[str, Any] = {}       # no changes: the model's generation_config.json
ACCURACY_TOLERANCE = 0.02     # a fast configuration counts when within 2 points

DECODE_COLUMNS = (("config", "config", "s"), ("tokens_per_s", "tok/s", ".2f"),
                  ("nfe_mean", "NFE", ".1f"), ("tokens_per_forward", "TPF", ".2f"),
                  ("host_ms_per_step", "host ms/step", ".2f"),
                  ("forward_ms_per_step", "fwd ms/step", ".2f"),
                  ("accuracy", "accuracy", ".3f"), ("speedup", "speed-up", ".2f"),
                  ("completion_tokens", "tokens", "d"), ("wall_s", "wall s", ".2f"))
AR_COLUMNS = (("system", "system", "s"), ("batch", "batch", "d"),
              ("tokens_per_s", "tok/s", ".2f"), ("accuracy", "accuracy", ".3f"),
              ("tokens_per_forward", "TPF", ".2f"), ("vs_ar", "x AR", ".2f"),
              ("vs_ar_engine", "x AR(C)", ".2f"), ("completion_tokens", "tokens", "d"),
              ("wall_s", "wall s", ".2f"))
AR_ENGINE_NOTE = ("x AR = tok/s over the AR twin's through transformers generate(); "
                  "x AR(C) = over the same twin's weights decoded by Celeris's "
                  "own engine as a block-causal model with blocks of one position (greedy "
                  "autoregressive decoding with the same kernels, KV cache and host loop): "
                  "what parallel decoding buys beyond the engine's kernels")


def add_ratios(rows: Sequence[dict[str, Any]]) -> None:
    """vs_ar and vs_ar_engine of every row of one batch size, against the twin's rows."""
    base = {r["system"]: r["tokens_per_s"] for r in rows}
    for key, system in (("vs_ar", AR_SYSTEM), ("vs_ar_engine", AR_ENGINE_SYSTEM)):
        tps = base.get(system)
        for row in rows:
            row[key] = row["tokens_per_s"] / tps if tps else None


AR_SYSTEM = "AR twin (transformers generate)"
AR_ENGINE_SYSTEM = "AR twin (Celeris engine, block 1)"
# The Celeris systems, named by what differs: LLaDA's published sampler, the configuration the
# decode suite chose, and the model's own generation_config.json (what users get by default).
REFERENCE_SYSTEM = "Celeris reference (fixed, no cache)"
DEFAULT_SYSTEM = "Celeris default (generation_config.json)"


def tuned_system(config: str) -> str:
    return f"Celeris tuned ({config})"


def measure(ctx: BenchContext, systems: Sequence[tuple[str, Any]], examples: Sequence[Any],
            batch: int, ar_max_new: int | None = None) -> list[dict[str, Any]]:
    """One row per Celeris configuration (name, params) and, when ``ar_max_new`` is given, a
    first row for the AR twin, all over the same examples in chunks of ``batch``, measured
    side by side (``timed_side_by_side``: every chunk by every system in turn)."""
    engine = ctx.engine
    runs: dict[str, Any] = {}
    systems = list(systems)
    if ar_max_new is not None:
        runs[AR_SYSTEM] = lambda chunk: ctx.ar.generate_batch(
            [messages(ex.prompt) for ex in chunk], ar_max_new)
    engines = {name: engine for name, _ in systems}
    if ar_max_new is not None and ctx.ar_engine is not None:
        systems.insert(0, (AR_ENGINE_SYSTEM, ctx.ar_engine_params(ar_max_new)))
        engines[AR_ENGINE_SYSTEM] = ctx.ar_engine
    timings = {name: StepTiming() for name, _ in systems}
    for name, params in systems:
        runs[name] = _counting_steps(engines[name], timings[name], params)
    bar = ctx.bar(len(examples) * len(runs), f"batch {batch}, {len(runs)} systems")
    out = timed_side_by_side(runs, examples, batch, bar)
    bar.close()
    rows = []
    if ar_max_new is not None:
        results, walls = out[AR_SYSTEM]
        rows.append(_row(AR_SYSTEM, [r["text"] for r in results],
                         [r["completion_tokens"] for r in results], None, walls, examples,
                         batch, latencies=[r["elapsed_s"] for r in results],
                         params=ar_params(ar_max_new),
                         finish=[r["finish_reason"] for r in results]))
    for name, params in systems:
        results, walls = out[name]
        steps = timings[name].since(StepTiming())
        row = _row(name, [r.text for r in results], [r.usage.completion_tokens for r in results],
                   [r.nfe for r in results], walls, examples, batch,
                   latencies=[r.timings.total_s for r in results], params=params.to_dict(),
                   finish=[str(r.finish_reason) for r in results])
        rows.append(row | {"host_ms_per_step": steps["host_ms"],
                           "forward_ms_per_step": steps["forward_ms"], "steps": steps["steps"]})
    return rows


def _counting_steps(engine: Any, timing: StepTiming, params: Any):
    """A chunk runner for one configuration that adds its own steps to ``timing`` (the
    engine's counters are shared by every configuration measured side by side)."""
    def run(chunk: list[Any]) -> list[Any]:
        before = engine.step_timing.snapshot()
        results = engine.generate_batch([messages(ex.prompt) for ex in chunk], params)
        timing.add_between(before, engine.step_timing)
        return results
    return run


def _row(name: str, texts: list[str], tokens: list[int], nfe: list[int] | None,
         walls: list[float], examples: Sequence[Any], batch: int, latencies: list[float],
         params: dict[str, Any], finish: list[str]) -> dict[str, Any]:
    acc, by_task = accuracy(examples, texts)
    total, wall = sum(tokens), sum(walls)
    finish_counts = {k: finish.count(k) for k in sorted(set(finish))}
    row = {"config": name, "batch": batch, "requests": len(texts), "completion_tokens": total,
           "wall_s": wall, "tokens_per_s": total / wall if wall > 0 else 0.0,
           "accuracy": acc, "accuracy_by_task": by_task, "latencies_s": latencies,
           "finish_reasons": finish_counts, "params": params}
    if nfe is not None:
        row["nfe_mean"] = sum(nfe) / len(nfe)
        row["tokens_per_forward"] = total / sum(nfe) if sum(nfe) else 0.0
    return row


def _warm_up(ctx: BenchContext, example: Any, configs: Sequence[tuple[str, dict]]) -> None:
    """One untimed one-block request per configuration (first-call allocations, lazy
    imports, thread pools), so that no configuration pays them inside its timing."""
    for _, changes in configs:
        params = ctx.base_params(**{**changes, "gen_length": ctx.block_length_for_model(),
                                    "steps": None})
        ctx.engine.generate_batch([messages(example.prompt)], params)


def configs_for(ctx: BenchContext) -> tuple[tuple[str, dict[str, Any]], ...]:
    """The fast configurations to measure. A block-causal model's cache is exact, so "prefix"
    and "dual" are the same thing there: only "prefix" (cached) and "none" (recompute) run."""
    if not ctx.block_causal:
        return FAST_CONFIGS
    return tuple(c for c in FAST_CONFIGS if c[1]["cache"] != "dual")


def run_decode(ctx: BenchContext) -> dict[str, Any]:
    examples = task_examples(ctx.n)
    configs = configs_for(ctx)
    ctx.say("loading the model and warming up")
    _warm_up(ctx, examples[0], (REFERENCE, *configs))
    rows = measure(ctx, [(name, ctx.base_params(**changes)) for name, changes in
                         (REFERENCE, *configs)], examples, ctx.batch)
    ref = rows[0]["tokens_per_s"]
    for row in rows:
        row["speedup"] = row["tokens_per_s"] / ref if ref else None
    best = best_config(rows)
    notes = [f"best fast configuration (highest tok/s with accuracy within "
             f"{ACCURACY_TOLERANCE * 100:.0f} points of the reference): {best}",
             "tok/s = completion tokens before the first EOS / wall time around "
             "engine.generate_batch; the reference is fixed, steps = gen_length, no cache, "
             "no early stop",
             "host ms/step = wall time of a denoising step minus its model forward (what the "
             "engine itself costs per step)"]
    return section("decode", "Reference sampler vs fast decoding", DECODE_COLUMNS, rows,
                   _settings(ctx, examples), notes) | {"best": best}


def best_config(rows: Sequence[dict[str, Any]]) -> str:
    ref_acc = rows[0]["accuracy"]
    ok = [r for r in rows[1:] if r["accuracy"] >= ref_acc - ACCURACY_TOLERANCE - 1e-9]
    return max(ok, key=lambda r: r["tokens_per_s"])["config"] if ok else DEFAULT_BEST


def fast_changes(name: str) -> dict[str, Any]:
    return dict(FAST_CONFIGS)[name]


def _reusable(decode: dict[str, Any], name: str, batch: int) -> dict[str, Any] | None:
    """A row the decode suite measured in this run on the same prompts and batch size."""
    if decode.get("status") != "ok" or decode["settings"]["batch"] != batch:
        return None
    row = next((r for r in decode["rows"] if r["config"] == name), None)
    return None if row is None else dict(row, measured_in="decode suite, same run")


def run_ar(ctx: BenchContext) -> dict[str, Any]:
    ctx.ar                                             # skip early when the twin is missing
    examples = task_examples(ctx.n)
    decode = ctx.results.get("decode", {})
    best = decode.get("best", DEFAULT_BEST)
    ctx.say("loading the models and warming up")
    _warm_up(ctx, examples[0], (REFERENCE, (best, fast_changes(best))))
    ctx.ar.generate_batch([messages(examples[0].prompt)], 4)
    systems = [(REFERENCE_SYSTEM, REFERENCE), (tuned_system(best), (best, fast_changes(best)))]
    if ctx.block_causal:     # what a user gets: the model's own generation_config.json
        systems.append((DEFAULT_SYSTEM, ("model defaults", MODEL_DEFAULTS)))
    labels = {name: label for label, (name, _) in systems}
    rows = []
    for batch in (1, 8):
        reused = {name: _reusable(decode, name, batch) for name in labels}
        todo = [(name, ctx.base_params(**changes)) for _, (name, changes) in systems
                if reused[name] is None]
        measured = {r["config"]: r for r in measure(ctx, todo, examples, batch, ctx.gen_length)}
        ar_row = measured.pop(AR_SYSTEM) | {"system": AR_SYSTEM}
        batch_rows = [ar_row] + [(reused[name] or measured[name]) | {"system": labels[name]}
                                 for name in labels]
        if AR_ENGINE_SYSTEM in measured:
            batch_rows.insert(1, measured.pop(AR_ENGINE_SYSTEM) | {"system": AR_ENGINE_SYSTEM})
        add_ratios(batch_rows)
        rows += batch_rows
    notes = [f"AR twin: {ctx.ar_path()} via transformers generate(), greedy, KV cache, "
             f"max_new_tokens = gen_length = {ctx.gen_length}", AR_ENGINE_NOTE,
             f"{tuned_system(best)}: " + (
                 "the decode suite's fastest configuration within "
                 f"{ACCURACY_TOLERANCE * 100:.0f} points of the reference's accuracy" if decode
                 else "a preset configuration (--suite decode,ar chooses it by measurement)"),
             f"{REFERENCE_SYSTEM}: LLaDA's sampler as published" + (
                 f"; {DEFAULT_SYSTEM}: the model's own decoding settings, what generate, "
                 "serve and the playground use" if ctx.block_causal else ""),
             "each batch's systems ran side by side, chunk by chunk in turn; Celeris rows at "
             "the decode suite's batch size are its measurements (same run, same prompts), "
             "not repeated"]
    settings = _settings(ctx, examples) | {"ar_model": ctx.ar.info(), "batches": [1, 8]}
    return section("ar", "Celeris vs the autoregressive twin", AR_COLUMNS, rows, settings,
                   notes)


def _settings(ctx: BenchContext, examples: Sequence[Any]) -> dict[str, Any]:
    info = ctx.engine.info()
    return {"model": info["path"], "dtype": info["dtype"], "device": info["device"],
            "gen_length": ctx.gen_length, "block_length": ctx.block_length_for_model(),
            "batch": ctx.batch, "prompts": len(examples), "prompts_per_task": ctx.n,
            "prompt_source": "celeris.train eval_examples (held-out), as chat messages"}
