"""Who answers the jobs: the in-process Engine, or a remote OpenAI-compatible server.

Both hand back ``Outcome``s in the OpenAI batch output shape. The remote runner is the
``openai`` client, whose own retries cover 408/409/429/5xx, timeouts and dropped connections
(exponential backoff with jitter, Retry-After honoured). A failure that may pass with time
(429, 503, 504, a timeout, no answer, out of memory) is recorded as retryable: a rerun of the
job tries that line again instead of counting it as done. A chat line's ``tools``,
``tool_choice`` and ``parallel_tool_calls`` (or tool turns in its history) go through the
server's own ``ToolPlan`` in-process: the prompt in the family's syntax, the call grammar, and
an answer with calls recorded as ``tool_calls`` with finish reason "tool_calls".
"""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass
from typing import Any, Sequence

from celeris.params import GenerationParams

from .jobs import Job, check_body, resolve_params

RETRYABLE_STATUS = frozenset({0, 408, 429, 503, 504})


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
    def retryable(self) -> bool:
        return not self.ok and self.status in RETRYABLE_STATUS

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
    error = None if outcome.ok else {"code": error_code(outcome), "message": outcome.error,
                                     "retryable": outcome.retryable}
    return {"id": f"batch_req_{_short_hash(job.custom_id)}", "custom_id": job.custom_id,
            "response": response, "error": error}


def error_code(outcome: Outcome) -> str:
    """The server's own error code when it sent one (e.g. context_length_exceeded)."""
    if not outcome.status:
        return "no_response"
    body = outcome.body or {}
    error = body.get("error", body)   # the openai client hands over the inner error object
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) and code else "request_failed"


# ---------------------------------------------------------------------- in-process
class LocalRunner:
    """Jobs in batches of ``concurrency`` through ``engine.generate_batch`` (inline)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.base = engine.default_params()
        self.model_name = engine.info()["model"]

    def check(self, job: Job, params: GenerationParams) -> None:
        """Validation hook: the model name as the server checks it, then tokenise and check
        the context exactly as generation will (the message in the server's words)."""
        from celeris import ContextLengthError
        from celeris.server.errors import context_message

        check_model(job, [self.model_name])
        prompt, params, _ = self.request(job, params)
        try:
            self.engine.prepare(prompt, params)
        except ContextLengthError as exc:
            if not exc.gen_length:
                raise
            raise ValueError(context_message(exc.prompt_tokens, exc.gen_length, exc.limit,
                                             job.length_field)) from None

    def request(self, job: Job, params: GenerationParams) -> tuple[Any, GenerationParams, Any]:
        """(prompt, params, the server's ToolPlan or None) of a job: a chat line that gives
        tools or has tool turns is rendered and constrained as /v1/chat/completions does it
        (a refusal is a ValueError with the server's message)."""
        if not job.is_chat:
            return job.prompt, params, None
        from celeris.server.errors import APIError
        from celeris.server.tools import ToolPlan

        req = check_body(job.endpoint, job.body)
        try:
            plan = ToolPlan.of(req, self.engine)
            if plan is None:
                return job.prompt, params, None
            return (plan.prompt(self.engine, job.prompt),
                    plan.params(params, req.parallel_tool_calls), plan)
        except APIError as exc:
            raise ValueError(exc.message) from None

    def run(self, jobs: Sequence[Job]) -> list[Outcome]:
        """One batch; when it fails, each job alone (a smaller batch), to find the one
        that fails or to fit in memory. A job that fails alone is an error outcome: the
        run goes on with the next one."""
        try:
            asked = [self.request(j, resolve_params(j.overrides, self.base, j.custom_id))
                     for j in jobs]
            results = self.engine.generate_batch(
                [prompt for prompt, _, _ in asked], [params for _, params, _ in asked],
                [f"req_{_short_hash(j.custom_id)}" for j in jobs])
        except Exception as exc:   # noqa: BLE001 - recorded on the job's line
            if len(jobs) == 1:
                return [failure_outcome(jobs[0], exc)]
            return [o for j in jobs for o in self.run([j])]
        return [self._outcome(j, r, plan) for j, r, (_, _, plan) in zip(jobs, results, asked)]

    def _outcome(self, job: Job, result: Any, tools: Any = None) -> Outcome:
        text, finish = result.text, str(result.finish_reason)
        if finish == "abort":
            return Outcome(job, 504, None, "the request was aborted (timeout)")
        calls = None
        if tools is not None and tools.reads_calls():     # as the server reads them
            calls = tools.answer(result)
            from celeris.server.tools import finish_with_calls
            finish = finish_with_calls(finish, bool(calls[1]))
        return Outcome(job, 200, completion_body(job, text, finish, len(result.token_ids),
                                                 result.usage.prompt_tokens, self.model_name,
                                                 {"seed": result.seed, "nfe": result.nfe,
                                                  "steps": result.steps,
                                                  "elapsed_s": round(result.timings.total_s, 4)},
                                                 calls))


def failure_outcome(job: Job, exc: BaseException) -> Outcome:
    """The outcome of a job whose generation raised: out of memory is a retryable 503."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return Outcome(job, 503, None, f"out of memory: {exc}")
    return Outcome(job, 500, None, f"{type(exc).__name__}: {exc}")


def check_model(job: Job, served: Sequence[str]) -> None:
    """The line's model must be one the server serves (or absent), as the server demands."""
    if job.model is not None and job.model not in served:
        raise ValueError(f"model {job.model!r} does not exist; this server serves "
                         f"{', '.join(map(repr, served))}")


def completion_body(job: Job, text: str, finish: str, completion: int, prompt: int,
                    model: str, extra: dict[str, Any],
                    calls: tuple[str | None, list[dict[str, Any]]] | None = None
                    ) -> dict[str, Any]:
    """An OpenAI chat.completion / text_completion object; ``calls``: (content, tool_calls)
    of an answer read for tool calls (content None beside calls, as the server sends it)."""
    h = _short_hash(job.custom_id)
    if job.is_chat:
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if calls is not None:
            message["content"] = calls[0] if calls[1] else calls[0] or ""
            if calls[1]:
                message["tool_calls"] = calls[1]
        choice = {"index": 0, "message": message, "finish_reason": finish}
        head = {"id": f"chatcmpl-{h}", "object": "chat.completion"}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        head = {"id": f"cmpl-{h}", "object": "text_completion"}
    return {**head, "created": int(time.time()), "model": model, "choices": [choice],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion}, "celeris": extra}


# ---------------------------------------------------------------------- remote
class RemoteRunner:
    """Jobs sent one request each to a server's /v1 routes through the ``openai`` client."""

    def __init__(self, url: str, api_key: str | None, max_retries: int = 6,
                 timeout_s: float = 600.0) -> None:
        import openai

        base = url.rstrip("/")
        base = base if base.endswith("/v1") else base + "/v1"
        self.url, self.base_url, self.api_key = url, base, api_key
        self._sent = threading.local()     # requests sent for the job of this thread
        http = openai.DefaultHttpxClient(event_hooks={"request": [self._count]})
        self.client = openai.OpenAI(base_url=base, api_key=api_key or "none",
                                    max_retries=max_retries, timeout=timeout_s,
                                    http_client=http)
        self._served: list[str] | None = None

    def check_reachable(self, timeout_s: float = 10.0) -> None:
        """One GET of /v1/models, before any line is validated: no answer at all raises
        ServerUnreachable (any HTTP status, 401 and 404 included, means someone answered)."""
        import httpx

        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            httpx.get(f"{self.base_url}/models", headers=headers, timeout=timeout_s)
        except httpx.TimeoutException:
            raise ServerUnreachable(self.url, f"no answer within {timeout_s:g} s") from None
        except (httpx.TransportError, httpx.InvalidURL, ValueError) as exc:
            raise ServerUnreachable(self.url, _reason(exc)) from None

    def _count(self, request: Any) -> None:
        self._sent.n = getattr(self._sent, "n", 0) + 1

    def check(self, job: Job, params: GenerationParams) -> None:
        """Validation hook: the line's model against the server's /v1/models."""
        if job.model is None:
            return
        if self._served is None:
            self._served = [m.id for m in self.client.models.list().data]
        check_model(job, self._served)

    def body(self, job: Job) -> dict[str, Any]:
        """The line's body as written, plus the id-derived seed when it has none."""
        body = dict(job.body)
        body.setdefault("seed", resolve_params(job.overrides, GenerationParams(),
                                               job.custom_id).seed)
        return body

    def run_one(self, job: Job) -> Outcome:
        import openai

        self._sent.n = 0
        path = job.endpoint.removeprefix("/v1")
        try:
            body = self.client.post(path, cast_to=object, body=self.body(job))
        except openai.APIStatusError as exc:
            body = exc.body if isinstance(exc.body, dict) else {"raw": str(exc.body)[:2000]}
            return Outcome(job, exc.status_code, body, f"HTTP {exc.status_code}: {exc.message}",
                           self._retries())
        except openai.APITimeoutError as exc:
            return Outcome(job, 0, None, f"timeout: {exc}", self._retries())
        except openai.APIConnectionError as exc:
            return Outcome(job, 0, None, f"no response: {exc}", self._retries())
        if not isinstance(body, dict):
            return Outcome(job, 502, None, "the server answered 200 without a JSON object",
                           self._retries())
        return Outcome(job, 200, body, None, self._retries())

    def _retries(self) -> int:
        return max(0, getattr(self._sent, "n", 1) - 1)


class ServerUnreachable(ConnectionError):
    """Nothing answered at the batch's --url."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"cannot reach the server at {url} ({reason}): check that it is "
                         f"running and that --url (scheme, host and port) is right")


def _reason(exc: BaseException) -> str:
    """The innermost cause of a connection failure, e.g. "[Errno 111] Connection refused"."""
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__
    return str(exc) or type(exc).__name__
