"""Who answers the jobs: the in-process Engine, or a remote OpenAI-compatible server.

Both hand back ``Outcome``s in the OpenAI batch output shape. The remote runner retries 429,
5xx, timeouts and dropped connections with exponential backoff and full jitter, and waits at
least what a Retry-After header asks for.
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import random
import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from celeris.params import GenerationParams

from .jobs import Job, resolve_params


@dataclass
class Outcome:
    job: Job
    status: int                       # HTTP-style status code; 0 = no response at all
    body: dict[str, Any] | None
    error: str | None = None
    retries: int = 0

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None

    @property
    def completion_tokens(self) -> int:
        usage = (self.body or {}).get("usage") or {}
        return int(usage.get("completion_tokens") or 0) if self.ok else 0


def _short_hash(text: str, n: int = 24) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:n]


def output_record(outcome: Outcome) -> dict[str, Any]:
    job = outcome.job
    response = None if outcome.status == 0 else {
        "status_code": outcome.status, "request_id": f"req_{_short_hash(job.custom_id)}",
        "body": outcome.body}
    error = None if outcome.ok else {"code": "request_failed" if outcome.status else
                                     "no_response", "message": outcome.error}
    return {"id": f"batch_req_{_short_hash(job.custom_id)}", "custom_id": job.custom_id,
            "response": response, "error": error}


# ---------------------------------------------------------------------- in-process
class LocalRunner:
    """Jobs in batches of ``concurrency`` through ``engine.generate_batch`` (inline)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.base = engine.default_params()
        self.model_name = engine.info()["model"]

    def check(self, job: Job, params: GenerationParams) -> None:
        """Validation hook: tokenise and check the context exactly as generation will."""
        self.engine.prepare(job.prompt, params)

    def run(self, jobs: Sequence[Job]) -> list[Outcome]:
        resolved = [resolve_params(j.overrides, self.base, j.custom_id) for j in jobs]
        try:
            results = self.engine.generate_batch(
                [j.prompt for j in jobs], [p for p, _ in resolved],
                [f"req_{_short_hash(j.custom_id)}" for j in jobs])
        except Exception:
            if len(jobs) == 1:
                raise
            return [o for j in jobs for o in self._one(j)]     # find the one that fails
        return [self._outcome(j, r, m) for j, (_, m), r in zip(jobs, resolved, results)]

    def _one(self, job: Job) -> list[Outcome]:
        try:
            return self.run([job])
        except Exception as exc:
            return [Outcome(job, 500, None, f"{type(exc).__name__}: {exc}")]

    def _outcome(self, job: Job, result: Any, max_tokens: int | None) -> Outcome:
        ids, text, finish = list(result.token_ids), result.text, str(result.finish_reason)
        if max_tokens is not None and len(ids) > max_tokens:
            ids = ids[:max_tokens]
            text, finish = self.engine.tokenizer.decode(ids), "length"
        if finish == "abort":
            return Outcome(job, 500, None, "the request was aborted")
        return Outcome(job, 200, completion_body(job, text, finish, len(ids),
                                                 result.usage.prompt_tokens, self.model_name,
                                                 {"seed": result.seed, "nfe": result.nfe,
                                                  "steps": result.steps,
                                                  "elapsed_s": round(result.timings.total_s, 4)}))


def completion_body(job: Job, text: str, finish: str, completion: int, prompt: int,
                    model: str, extra: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI chat.completion / text_completion object."""
    h = _short_hash(job.custom_id)
    if job.is_chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "finish_reason": finish}
        head = {"id": f"chatcmpl-{h}", "object": "chat.completion"}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        head = {"id": f"cmpl-{h}", "object": "text_completion"}
    return {**head, "created": int(time.time()), "model": model, "choices": [choice],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion}, "celeris": extra}


# ---------------------------------------------------------------------- remote
RETRY_STATUS = (408, 409, 429)


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None
    return max(0.0, when - (time.time() if now is None else now))


class RemoteRunner:
    def __init__(self, url: str, api_key: str | None, max_retries: int = 6,
                 timeout_s: float = 600.0, backoff_s: float = 0.5, max_backoff_s: float = 60.0,
                 sleep: Callable[[float], None] = time.sleep,
                 rng: random.Random | None = None) -> None:
        self.base = url.rstrip("/")
        if self.base.endswith("/v1"):
            self.base = self.base[:-3]
        self.api_key, self.max_retries, self.timeout_s = api_key, max_retries, timeout_s
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self.sleep, self.rng = sleep, rng or random.Random()

    def body(self, job: Job) -> dict[str, Any]:
        """The line's body as written, plus the id-derived seed when it has none."""
        body = dict(job.body)
        body.setdefault("seed", resolve_params(job.overrides, GenerationParams(),
                                               job.custom_id)[0].seed)
        return body

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Full jitter (uniform in [0, base x 2^attempt]), at least Retry-After."""
        cap = min(self.max_backoff_s, self.backoff_s * 2 ** attempt)
        jittered = self.rng.uniform(0, cap)
        return max(jittered, retry_after) if retry_after is not None else jittered

    def run_one(self, job: Job) -> Outcome:
        data = json.dumps(self.body(job)).encode("utf-8")
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        attempt = 0
        while True:
            status, body, error, retry_after = self._post(job.endpoint, data, headers)
            retryable = status == 0 or status in RETRY_STATUS or status >= 500
            if status == 200 or not retryable or attempt >= self.max_retries:
                return Outcome(job, status, body, error, attempt)
            self.sleep(self.delay(attempt, retry_after))
            attempt += 1

    def _post(self, endpoint: str, data: bytes, headers: dict[str, str]
              ) -> tuple[int, dict | None, str | None, float | None]:
        req = urllib.request.Request(self.base + endpoint, data, headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return resp.status, json.loads(resp.read() or b"{}"), None, None
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                body = json.loads(raw) if raw else None
            except json.JSONDecodeError:
                body = {"raw": raw.decode("utf-8", "replace")[:2000]}
            return (exc.code, body, f"HTTP {exc.code}: {exc.reason}",
                    retry_after_s(exc.headers.get("Retry-After")))
        except (urllib.error.URLError, socket.timeout, ConnectionError, TimeoutError) as exc:
            return 0, None, f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}", None
        except json.JSONDecodeError as exc:
            return 502, None, f"the server answered with invalid JSON: {exc}", None
