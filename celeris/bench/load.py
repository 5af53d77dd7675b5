"""Load for the serving benchmark: aggregate tokens/s at several concurrencies against sequential requests.

``bench_serve(engine_or_url)`` sends the same ``n_requests`` at each concurrency (a thread per
in-flight request, as a user would) and reports, per level, aggregate generated tokens/s, time
to first block and end-to-end latency (p50/p95), and the speed-up over the sequential run
(concurrency 1), all measured in one run. Against an Engine it measures the scheduler without
HTTP; against a URL it measures the whole server through streaming /v1/completions.
"""

from __future__ import annotations

import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Sequence

from .. import Engine, EngineBusyError
from ..request_params import request_params

DEFAULT_PROMPT = "Once upon a time"


@dataclass(frozen=True)
class Sample:
    tokens: int
    first_block_s: float | None
    e2e_s: float
    retries: int = 0


def bench_serve(target: Engine | str, concurrencies: Sequence[int] = (1, 4, 8, 16),
                n_requests: int | None = None, *, prompt: str = DEFAULT_PROMPT,
                max_tokens: int = 64, api_key: str | None = None, model: str | None = None,
                timeout_s: float = 600.0, **knobs: Any) -> dict[str, Any]:
    """knobs: GenerationParams fields (Engine) or extra body fields (URL), e.g. steps,
    block_length, temperature, decoding, cache. Request i uses seed i."""
    levels = sorted(set(int(c) for c in concurrencies) | {1})
    n = n_requests or max(2 * max(levels), 8)
    if isinstance(target, str):
        send = _http_sender(target.rstrip("/"), prompt, max_tokens, api_key, model, timeout_s,
                            knobs)
        where = target
    else:
        send = _engine_sender(target.start(), prompt, max_tokens, knobs)
        where = "engine"
    send(0)   # warm-up, not measured
    rows = [_level(send, c, n) for c in levels]
    base = rows[0]["tokens_per_s"]
    for row in rows:
        row["speedup_vs_sequential"] = round(row["tokens_per_s"] / base, 3) if base else None
    return {"suite": "serve", "target": where, "requests_per_level": n,
            "max_tokens": max_tokens, "knobs": knobs, "sequential": rows[0],
            "levels": rows}


def _level(send: Any, concurrency: int, n: int) -> dict[str, Any]:
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        samples = list(pool.map(send, range(n)))
    wall = time.perf_counter() - start
    tokens = sum(s.tokens for s in samples)
    firsts = [s.first_block_s for s in samples if s.first_block_s is not None]
    e2e = [s.e2e_s for s in samples]
    return {"concurrency": concurrency, "requests": n, "wall_s": round(wall, 4),
            "tokens": tokens, "tokens_per_s": round(tokens / wall, 3) if wall else 0.0,
            "first_block_p50_s": _pct(firsts, 50), "first_block_p95_s": _pct(firsts, 95),
            "e2e_p50_s": _pct(e2e, 50), "e2e_p95_s": _pct(e2e, 95),
            "retries": sum(s.retries for s in samples)}


def _pct(values: list[float], q: int) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return round(values[0], 5)
    return round(statistics.quantiles(values, n=100, method="inclusive")[q - 1], 5)


def _engine_sender(engine: Engine, prompt: str, max_tokens: int, knobs: dict[str, Any]) -> Any:
    params = request_params({**knobs, "max_tokens": max_tokens}, engine.default_params())

    def send(i: int) -> Sample:
        retries = 0
        while True:
            try:
                result = engine.generate(prompt, params.replace(seed=i))
                break
            except EngineBusyError as exc:
                retries += 1
                time.sleep(min(exc.retry_after, 0.5))
        return Sample(result.usage.completion_tokens, result.timings.first_block_s,
                      result.timings.total_s, retries)

    return send


def _http_sender(url: str, prompt: str, max_tokens: int, api_key: str | None,
                 model: str | None, timeout_s: float, knobs: dict[str, Any]) -> Any:
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def send(i: int) -> Sample:
        body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True, "seed": i,
                "stream_options": {"include_usage": True}, **knobs}
        if model:
            body["model"] = model
        retries = 0
        while True:
            start = time.perf_counter()
            with httpx.stream("POST", f"{url}/v1/completions", json=body, headers=headers,
                              timeout=timeout_s) as response:
                if response.status_code == 429:
                    retries += 1
                    time.sleep(min(float(response.headers.get("retry-after", "1")), 0.5))
                    continue
                response.raise_for_status()
                return _read_stream(response, start, retries)

    return send


def _read_stream(response: Any, start: float, retries: int) -> Sample:
    first, tokens = None, 0
    for line in response.iter_lines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        data = json.loads(line[6:])
        if "error" in data:
            raise RuntimeError(data["error"].get("message", "stream error"))
        if first is None and any(c.get("text") for c in data.get("choices", [])):
            first = time.perf_counter() - start
        if data.get("usage"):
            tokens = data["usage"]["completion_tokens"]
    return Sample(tokens, first, time.perf_counter() - start, retries)
