"""serve: mixed chat requests at rising concurrency against the sequential rate, quality beside.

The measuring is ``load.bench_serve``: against ``--url`` it drives a running server through
streamed /v1/chat/completions; without it, the in-process Engine's background loop (the
server's batching path, minus HTTP). Every request runs with the serving defaults (the
model's own generation config), unless ``--serve-knobs`` names the decode suite's best
configuration instead. The requests alternate held-out story requests and task problems.
"""

from __future__ import annotations

from typing import Any

from .common import BenchContext, section
from .load import bench_serve

SERVE_COLUMNS = (("concurrency", "conc", "d"), ("requests", "requests", "d"),
                 ("succeeded", "ok", "d"), ("tokens_per_s", "tok/s", ".2f"),
                 ("speedup_vs_sequential", "x seq", ".2f"),
                 ("first_block_p50_s", "first blk p50", ".3f"),
                 ("e2e_p50_s", "e2e p50", ".3f"), ("e2e_p95_s", "e2e p95", ".3f"),
                 ("wall_s", "wall s", ".1f"), ("task_accuracy", "tasks", ".3f"),
                 ("story_grammatical", "story grammar", ".3f"),
                 ("story_request_honoured", "requests honoured", ".3f"),
                 ("retries", "429 retries", "d"))
KNOB_FIELDS = ("block_length", "decoding", "threshold", "factor", "cache", "steps",
               "temperature")


def run_serve(ctx: BenchContext) -> dict[str, Any]:
    target = ctx.url or ctx.engine
    try:
        out = bench_serve(target, ctx.concurrency, ctx.serve_requests, api_key=ctx.api_key)
    finally:
        if not ctx.url:
            ctx.engine.stop()          # later suites batch inline again
    rows = [dict(r) for r in out["levels"]]
    for row in rows:                   # bench_serve raises on a failed request
        row.setdefault("succeeded", row["requests"])
    mode = (f"HTTP server at {ctx.url} (streamed /v1/chat/completions)" if ctx.url else
            "in-process engine: background loop fed by client threads, no HTTP")
    notes = [f"ran against: {mode}",
             f"serving defaults (no knobs, no max_tokens: the model's generation config); "
             f"{out.get('requests_per_level')} requests per level, alternating held-out story "
             "requests and task problems as one-turn chats, request i with seed i",
             "a level only completes when every request succeeded (a failure aborts the suite); "
             "429 answers are retried and counted"]
    settings = {"mode": mode, "knobs": {}, "concurrency": [r["concurrency"] for r in rows],
                "requests_per_level": out.get("requests_per_level")}
    if not ctx.url:
        info = ctx.engine.info()
        settings |= {"model": info["path"], "dtype": info["dtype"],
                     "max_running": info.get("scheduler_max_running"),
                     "defaults": info.get("defaults")}
    return section("serve", "Serving: throughput and latency vs concurrency", SERVE_COLUMNS,
                   rows, settings, notes)
