"""serve: time to first block, end-to-end latency, tokens/s and successes at rising concurrency.

The measuring is ``load.bench_serve``: against ``--url`` it drives a running server through streamed /v1/completions; without it, the in-process Engine's background
scheduler (the server's batching path, minus HTTP). This suite picks the decoding
configuration, runs it, and files the rows with the others.
"""

from __future__ import annotations

from typing import Any

from .common import BenchContext, section
from .decode import DEFAULT_BEST, fast_changes
from .load import bench_serve

SERVE_COLUMNS = (("concurrency", "conc", "d"), ("requests", "requests", "d"),
                 ("succeeded", "ok", "d"), ("tokens_per_s", "tok/s", ".2f"),
                 ("speedup_vs_sequential", "x seq", ".2f"),
                 ("first_block_p50_s", "first blk p50", ".3f"),
                 ("e2e_p50_s", "e2e p50", ".3f"), ("e2e_p95_s", "e2e p95", ".3f"),
                 ("retries", "429 retries", "d"))
KNOB_FIELDS = ("block_length", "decoding", "threshold", "factor", "cache", "steps",
               "temperature")


def run_serve(ctx: BenchContext) -> dict[str, Any]:
    best = ctx.results.get("decode", {}).get("best", DEFAULT_BEST)
    params = ctx.base_params(remote=bool(ctx.url), **fast_changes(best))
    knobs = {k: v for k, v in params.to_dict().items() if k in KNOB_FIELDS}
    target = ctx.url or ctx.engine
    try:
        out = bench_serve(target, ctx.concurrency, api_key=ctx.api_key,
                          max_tokens=ctx.gen_length, **knobs)
    finally:
        if not ctx.url:
            ctx.engine.stop()          # later suites batch inline again
    rows = [dict(r) for r in out["levels"]]
    for row in rows:                   # bench_serve raises on a failed request
        row.setdefault("succeeded", row["requests"])
    mode = (f"HTTP server at {ctx.url} (streamed /v1/completions)" if ctx.url else
            "in-process engine: background scheduler fed by client threads, no HTTP")
    notes = [f"ran against: {mode}",
             f"decoding: {best}, max_tokens {ctx.gen_length}, request i uses seed i; "
             f"{out.get('requests_per_level')} requests per level (same prompt)",
             "a level only completes when every request succeeded (a failure aborts the suite); "
             "429 answers are retried and counted"]
    settings = {"mode": mode, "config": best, "knobs": knobs,
                "concurrency": [r["concurrency"] for r in rows],
                "max_tokens": out.get("max_tokens"),
                "requests_per_level": out.get("requests_per_level")}
    if not ctx.url:
        info = ctx.engine.info()
        settings |= {"model": info["path"], "dtype": info["dtype"]}
    return section("serve", "Serving: throughput and latency vs concurrency", SERVE_COLUMNS,
                   rows, settings, notes)
