"""Load for the serving benchmark: mixed chat requests at several concurrencies vs sequential.

``bench_serve(engine_or_url)`` sends the same requests at each concurrency (a thread per
in-flight request, as a user's clients would) and reports, per level, aggregate generated
tokens/s, time to first block and end-to-end latency (p50/p95), wall time, the speed-up over
the sequential run (concurrency 1, measured in the same run) and the quality of the answers:
exact-match accuracy on the checkable tasks, and the story checker's grammar and
request-honoured rates on the stories. The default requests alternate held-out story requests
and held-out task problems, each a one-turn chat. Against an Engine it measures the engine's
background loop without HTTP; against a URL the whole server through streamed
/v1/chat/completions. Without knobs every request runs with the serving defaults.
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


@dataclass(frozen=True)
class LoadRequest:
    prompt: str
    example: Any = None     # a checkable task problem (celeris.synthetic.tasks.Example)
    story: Any = None       # a story request (celeris.synthetic.corpus.StoryRequest)

    @property
    def messages(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": self.prompt}]


@dataclass(frozen=True)
class Sample:
    text: str
    tokens: int
    first_block_s: float | None
    e2e_s: float
    retries: int = 0


def mixed_requests(n: int) -> list[LoadRequest]:
    """``n`` requests alternating held-out story requests and held-out task problems."""
    from celeris.synthetic.tasks import TASKS, eval_examples
    from celeris.synthetic.corpus import heldout_long_requests
    stories = heldout_long_requests((n + 1) // 2)
    per_task = -(-(n // 2) // len(TASKS))
    tasks = [ex for i in range(per_task) for ex in
             (eval_examples(t, per_task)[i] for t in TASKS)][:n // 2]
    out = []
    for i in range(n):
        out.append(LoadRequest(stories[i // 2].text, story=stories[i // 2]) if i % 2 == 0
                   else LoadRequest(tasks[i // 2].prompt, example=tasks[i // 2]))
    return out


def bench_serve(target: Engine | str, concurrencies: Sequence[int] = (1, 16),
                n_requests: int | None = None, *, requests: Sequence[LoadRequest] | None = None,
                max_tokens: int | None = None, api_key: str | None = None,
                model: str | None = None, timeout_s: float = 600.0,
                **knobs: Any) -> dict[str, Any]:
    """knobs: GenerationParams fields (Engine) or extra body fields (URL); none = the serving
    defaults. Request i uses seed i."""
    levels = sorted(set(int(c) for c in concurrencies) | {1})
    n = n_requests or max(2 * max(levels), 8)
    reqs = list(requests) if requests is not None else mixed_requests(n)
    if isinstance(target, str):
        send = _http_sender(target.rstrip("/"), reqs, max_tokens, api_key, model, timeout_s,
                            knobs)
        where = target
    else:
        send = _engine_sender(target.start(), reqs, max_tokens, knobs)
        where = "engine"
    send(0)   # warm-up, not measured
    rows = [_level(send, c, n, reqs) for c in levels]
    base = rows[0]["tokens_per_s"]
    for row in rows:
        row["speedup_vs_sequential"] = round(row["tokens_per_s"] / base, 3) if base else None
    return {"suite": "serve", "target": where, "requests_per_level": n,
            "max_tokens": max_tokens, "knobs": knobs, "sequential": rows[0],
            "levels": rows}


def _level(send: Any, concurrency: int, n: int, reqs: Sequence[LoadRequest]
           ) -> dict[str, Any]:
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
            "retries": sum(s.retries for s in samples),
            **quality([reqs[i % len(reqs)] for i in range(n)], [s.text for s in samples])}


def quality(reqs: Sequence[LoadRequest], texts: Sequence[str]) -> dict[str, Any]:
    """Task accuracy (exact match) and the story checker's rates over one level's answers."""
    out: dict[str, Any] = {}
    tasks = [(r.example, t) for r, t in zip(reqs, texts) if r.example is not None]
    if tasks:
        from celeris.synthetic.tasks import score
        out["task_accuracy"] = round(sum(score(ex.task, t, ex.answer) for ex, t in tasks)
                                     / len(tasks), 4)
    stories = [(r.story, t) for r, t in zip(reqs, texts) if r.story is not None]
    if stories:
        from celeris.synthetic.longcheck import long_score
        q = long_score([t for _, t in stories], [s for s, _ in stories])
        out["story_grammatical"] = round(q["grammatical"], 4)
        out["story_request_honoured"] = round(q["request_honoured"], 4)
    return out


def _pct(values: list[float], q: int) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return round(values[0], 5)
    return round(statistics.quantiles(values, n=100, method="inclusive")[q - 1], 5)


def _engine_sender(engine: Engine, reqs: Sequence[LoadRequest], max_tokens: int | None,
                   knobs: dict[str, Any]) -> Any:
    params = request_params({**knobs, "max_tokens": max_tokens}, engine.default_params())
    chat = engine.tokenizer.has_chat_template

    def send(i: int) -> Sample:
        req, retries = reqs[i % len(reqs)], 0
        while True:
            try:
                result = engine.generate(req.messages if chat else req.prompt,
                                         params.replace(seed=i))
                break
            except EngineBusyError as exc:
                retries += 1
                time.sleep(min(exc.retry_after, 0.5))
        return Sample(result.text, result.usage.completion_tokens,
                      result.timings.first_block_s, result.timings.total_s, retries)

    return send


def _http_sender(url: str, reqs: Sequence[LoadRequest], max_tokens: int | None,
                 api_key: str | None, model: str | None, timeout_s: float,
                 knobs: dict[str, Any]) -> Any:
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def send(i: int) -> Sample:
        body = {"messages": reqs[i % len(reqs)].messages, "stream": True, "seed": i,
                "stream_options": {"include_usage": True}, **knobs}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        if model:
            body["model"] = model
        retries = 0
        while True:
            start = time.perf_counter()
            with httpx.stream("POST", f"{url}/v1/chat/completions", json=body,
                              headers=headers, timeout=timeout_s) as response:
                if response.status_code == 429:
                    retries += 1
                    time.sleep(min(float(response.headers.get("retry-after", "1")), 0.5))
                    continue
                response.raise_for_status()
                return _read_stream(response, start, retries)

    return send


def _read_stream(response: Any, start: float, retries: int) -> Sample:
    first, tokens, text = None, 0, ""
    for line in response.iter_lines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        data = json.loads(line[6:])
        if "error" in data:
            raise RuntimeError(data["error"].get("message", "stream error"))
        for choice in data.get("choices", []):
            piece = (choice.get("delta") or {}).get("content") or ""
            if piece and first is None:
                first = time.perf_counter() - start
            text += piece
        if data.get("usage"):
            tokens = data["usage"]["completion_tokens"]
    return Sample(text, tokens, first, time.perf_counter() - start, retries)
