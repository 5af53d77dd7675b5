"""What the routes share: the engine (once loaded), readiness, draining and the metrics.

The engine may be handed over loaded, or as a loader that runs in a background thread while
the server already answers: until it is loaded and a warm-up generation has run, /ready says
503 and the API routes answer 503 "loading".
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from .. import AsyncEngine, CelerisError, Engine, memory_info
from .errors import APIError, unavailable
from .metrics import ServerMetrics

log = logging.getLogger("celeris.server")
UNHEALTHY_AFTER = 3   # consecutive failed denoising steps that turn /ready to 503

EngineSource = Engine | Callable[[], Engine]


class ServerState:
    def __init__(self, engine: EngineSource, *, model_name: str | None = None,
                 max_body_bytes: int = 1_000_000, warmup: bool = True) -> None:
        self.model_name = model_name or ""
        self.max_body_bytes = max_body_bytes
        self.aengine: AsyncEngine | None = None
        self.ready = False
        self.draining = False
        self.failure: str | None = None
        self.created = int(time.time())
        self.metrics = ServerMetrics(self.stats)
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
        """One short generation so the first real request does not pay for lazy setup."""
        engine = self.aengine.engine
        p = engine.default_params()
        try:
            engine.generate("Hello", p.replace(gen_length=p.block_length, steps=1, seed=0,
                                               stop=()))
        except Exception as exc:   # noqa: BLE001
            log.exception("warm-up generation failed")
            self.failure = f"warm-up generation failed: {exc}"
            return
        self.ready = True
        log.info("model %s is ready", self.model_name)

    # ------------------------------------------------------------ for the routes
    def require_engine(self) -> AsyncEngine:
        if self.draining:
            raise unavailable("the server is shutting down and takes no new requests",
                              "draining")
        if self.aengine is None:
            if self.failure:
                raise APIError(503, "the model could not be loaded", None, "model_unavailable")
            raise unavailable("the model is still loading; retry shortly", "model_loading")
        if not self.ready:
            raise unavailable("the model is warming up; retry shortly", "model_loading")
        return self.aengine

    def readiness(self) -> tuple[str, str]:
        if self.draining:
            return "draining", "the server is shutting down"
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

    def abort_error(self) -> APIError:
        """The error for a generation that ended with finish_reason "abort"."""
        if self.draining or self.aengine is None:
            return unavailable("the server shut down before the request finished", "draining")
        timeout = self.aengine.engine.config.request_timeout_s
        return APIError(504, f"the request did not finish within the server's timeout of "
                        f"{timeout:g} s", None, "timeout")

    def model_card(self) -> dict[str, Any]:
        self.require_engine()
        info = self.aengine.engine.info()
        return {"id": self.model_name, "object": "model", "created": self.created,
                "owned_by": "celeris", "context_length": info["context_length"],
                "architecture": info["architecture"], "dtype": info["dtype"]}

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
