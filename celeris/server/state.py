"""What the routes share: the engine (once loaded), readiness, draining and the metrics.

The engine may be handed over loaded, or as a loader that runs in a background thread while
the server already answers: until it is loaded and a warm-up generation has run, /ready says
503 and the API routes answer 503 "loading". A failed warm-up is tried again with exponential
backoff; after WARMUP_ATTEMPTS failures ``on_fatal`` is called (``serve`` then exits non-zero so
that a supervisor restarts it). While the engine is idle but not ready (failed steps, a failed
warm-up), /ready runs a one-step probe generation and answers from its outcome, so a replica
comes back by itself once the fault has passed (SGLang's health_generate does the same).
While unhealthy, new generation requests get a fast 503 with Retry-After instead of a step
that would fail them; each refusal starts such a probe in the background (one at a time).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any, Callable

from .. import AsyncEngine, CelerisError, Engine, GenerationParams, memory_info
from .errors import APIError, unavailable
from .metrics import ServerMetrics

log = logging.getLogger("celeris.server")
UNHEALTHY_AFTER = 3   # consecutive failed denoising steps that turn /ready to 503
WARMUP_ATTEMPTS = 3   # warm-up generations tried before giving up (on_fatal)
WARMUP_BACKOFF_S = 2.0   # wait before the second attempt; doubled before each later one
PROBE_INTERVAL_S = 1.0   # /ready runs at most one probe generation per interval
PROBE_TIMEOUT_S = 30.0
UNHEALTHY_RETRY_AFTER_S = 2   # Retry-After of a request refused while unhealthy

EngineSource = Engine | Callable[[], Engine]


class ServerState:
    def __init__(self, engine: EngineSource, *, model_name: str | None = None,
                 max_body_bytes: int = 1_000_000, warmup: bool = True,
                 on_fatal: Callable[[], None] | None = None) -> None:
        self.model_name = model_name or ""
        self.max_body_bytes = max_body_bytes
        self.aengine: AsyncEngine | None = None
        self.ready = False
        self.draining = False
        self.failure: str | None = None
        self.warmup_failed = False   # loaded, but the warm-up generation kept failing
        self.warmup_error = ""       # the type of its last exception
        self.on_fatal = on_fatal
        self.created = int(time.time())
        self.metrics = ServerMetrics(self.stats)
        self._probe_lock = asyncio.Lock()
        self._probed_at = -PROBE_INTERVAL_S
        self._probe_task: asyncio.Future | None = None
        self._context_length: int | None = None
        if isinstance(engine, Engine):
            self._attach(engine, warmup)
        else:
            threading.Thread(target=self._load, args=(engine, warmup), name="celeris-load",
                             daemon=True).start()

    # ------------------------------------------------------------ loading
    def _load(self, loader: Callable[[], Engine], warmup: bool) -> None:
        try:
            engine = loader()
        except Exception as exc:   # noqa: BLE001 - reported by /ready, details in the log
            self.failure = f"loading the model failed: {exc}"
            log.error(self.failure, exc_info=not isinstance(exc, (CelerisError, OSError)))
            if self.on_fatal is not None:
                self.on_fatal()
            return
        self._attach(engine, warmup)

    def _attach(self, engine: Engine, warmup: bool) -> None:
        self.model_name = self.model_name or engine.model_dir.name
        self.aengine = AsyncEngine(engine)          # starts the background scheduler
        if warmup:
            threading.Thread(target=self._warm_up, name="celeris-warmup", daemon=True).start()
        else:
            self.ready = True

    def _warm_up(self) -> None:
        """One short generation so the first real request does not pay for lazy setup;
        a failure is tried again after WARMUP_BACKOFF_S, 2x, 4x... seconds."""
        engine = self.aengine.engine
        for attempt in range(1, WARMUP_ATTEMPTS + 1):
            try:
                engine.generate("Hello", probe_params(engine.default_params()))
            except Exception as exc:   # noqa: BLE001 - the cause goes to the log and /ready
                kind, cause = type(exc).__name__, f"{type(exc).__name__}: {exc}"
                log.warning("warm-up generation failed (attempt %d of %d): %s", attempt,
                            WARMUP_ATTEMPTS, cause, exc_info=attempt == WARMUP_ATTEMPTS)
                if attempt < WARMUP_ATTEMPTS:
                    time.sleep(WARMUP_BACKOFF_S * 2 ** (attempt - 1))
                continue
            self.ready = True
            log.info("model %s is ready", self.model_name)
            return
        self.warmup_failed, self.warmup_error = True, kind
        self.failure = f"the warm-up generation failed {WARMUP_ATTEMPTS} times; last: {cause}"
        log.error(self.failure)
        if self.on_fatal is not None:
            self.on_fatal()

    # ------------------------------------------------------------ for the routes
    def require_engine(self) -> AsyncEngine:
        if self.draining:
            raise unavailable("the server is shutting down and takes no new requests",
                              "draining")
        if self.aengine is None:
            if self.failure:
                raise APIError(503, "the model could not be loaded", None, "model_unavailable")
            raise unavailable("the model is still loading; retry shortly", "model_loading")
        if self.warmup_failed:
            raise APIError(503, "the model is loaded but its warm-up generation failed; see "
                           "/ready", None, "model_unavailable")
        if not self.ready:
            raise unavailable("the model is warming up; retry shortly", "model_loading")
        return self.aengine

    def admit(self) -> AsyncEngine:
        """``require_engine()`` for a new generation, refused with 503 while the engine is
        unhealthy (its recent steps failed); the refusal starts a probe in the background, so
        the engine is admitted again once a probe step succeeds. Call from the event loop."""
        aengine = self.require_engine()
        if self.readiness()[0] == "unhealthy":
            if self._probe_task is None or self._probe_task.done():
                self._probe_task = asyncio.ensure_future(self.check_readiness())
            raise unavailable("the engine is unhealthy: its recent denoising steps failed; "
                              "retry shortly (/ready says when it has recovered)",
                              "engine_unhealthy", UNHEALTHY_RETRY_AFTER_S)
        return aengine

    def readiness(self) -> tuple[str, str]:
        if self.draining:
            return "draining", "the server is shutting down"
        if self.warmup_failed:   # the exception's type, not its text (paths stay in the log)
            return "failed", (f"the model loaded, but the warm-up generation failed "
                              f"{WARMUP_ATTEMPTS} times ({self.warmup_error}); see the server "
                              f"log")
        if self.failure:   # details (paths, exceptions) stay in the server log
            return "failed", "the model could not be loaded; see the server log"
        if not self.ready:
            return "loading", ("loading the model" if self.aengine is None
                               else "running the warm-up generation")
        failures = self.aengine.stats().get("step_failures", 0)
        if failures >= UNHEALTHY_AFTER:
            return "unhealthy", (f"the last {failures} denoising steps failed; see the "
                                 "server log")
        return "ready", self.model_name

    async def check_readiness(self) -> tuple[str, str]:
        """``readiness()``, after a probe generation when the engine is idle but not ready
        (a probe that succeeds clears the failed state: its good step resets the count)."""
        status, detail = self.readiness()
        if status in ("unhealthy", "failed") and self._probe_worth_it():
            async with self._probe_lock:
                if time.monotonic() - self._probed_at >= PROBE_INTERVAL_S:
                    await self._probe()
            status, detail = self.readiness()
        return status, detail

    def _probe_worth_it(self) -> bool:
        if self.aengine is None or self.draining:
            return False
        stats = self.aengine.stats()
        return not stats.get("running") and not stats.get("queued")

    async def _probe(self) -> None:
        engine = self.aengine.engine
        try:
            await asyncio.wait_for(self.aengine.generate("Hello", probe_params(
                engine.default_params())), PROBE_TIMEOUT_S)
        except Exception as exc:   # noqa: BLE001 - /ready stays 503; the step log has details
            log.warning("readiness probe failed: %s: %s", type(exc).__name__, exc)
        else:
            if self.warmup_failed:
                log.info("readiness probe succeeded: model %s is ready", self.model_name)
            self.warmup_failed, self.failure, self.ready = False, None, True
        finally:
            self._probed_at = time.monotonic()

    def abort_error(self) -> APIError:
        """The error for a generation that ended with finish_reason "abort"."""
        if self.draining or self.aengine is None:
            return unavailable("the server shut down before the request finished", "draining")
        timeout = self.aengine.engine.config.request_timeout_s
        return APIError(504, f"the request did not finish within the server's timeout of "
                        f"{timeout:g} s", None, "timeout")

    def context_length(self) -> int | None:
        """The served model's context in tokens (read once)."""
        if self._context_length is None and self.aengine is not None:
            self._context_length = int(self.aengine.engine.info()["context_length"])
        return self._context_length

    def model_card(self) -> dict[str, Any]:
        self.require_engine()
        info = self.aengine.engine.info()
        return {"id": self.model_name, "object": "model", "created": self.created,
                "owned_by": "celeris", "context_length": info["context_length"],
                "architecture": info["architecture"], "dtype": info["dtype"],
                "quantize": info.get("quantize"), "weight_bytes": info.get("weight_bytes")}

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.aengine is not None:
            engine = self.aengine.engine
            out.update(engine.stats())
            out.update(memory_info(engine.device))
        out["ready"] = int(self.readiness()[0] == "ready")
        return out

    async def drain(self, timeout: float | None) -> bool:
        """Stop admitting (503), let running requests finish; True if all did in time."""
        self.draining = True
        if self.aengine is None:
            return True
        return await self.aengine.drain(timeout)

    def drain_sync(self, timeout: float | None) -> bool:
        self.draining = True
        return True if self.aengine is None else self.aengine.engine.drain(timeout)


def probe_params(defaults: GenerationParams) -> GenerationParams:
    """The cheapest real generation: one block, one step, greedy, fixed seed."""
    return defaults.replace(gen_length=defaults.block_length, steps=1, seed=0, stop=(),
                            temperature=0.0)
