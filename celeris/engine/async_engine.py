"""The one thread that drives the engine, and the asyncio face of a started engine.

``EngineLoop`` steps the engine whenever the scheduler holds work and sleeps on its condition
otherwise; every caller (``Engine.generate``/``stream`` from any thread, ``AsyncEngine`` from
an event loop, the server, the playground) submits requests and waits on its own sink.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any, AsyncIterator, Sequence

from ..config import EngineClosedError
from ..outputs import GenerationResult, StepEvent
from ..params import GenerationParams
from .llm_engine import Engine, Prompt, new_request_id

log = logging.getLogger(__name__)


class EngineLoop:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="celeris-engine", daemon=True)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        cond = self.engine.scheduler.cond
        with cond:
            self._stopping = True
            cond.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        scheduler = self.engine.scheduler
        while True:
            with scheduler.cond:
                while not (self._stopping or scheduler.has_work):
                    scheduler.cond.wait(1.0)
                if self._stopping:
                    return
            try:
                self.engine.run_step()
            except Exception:       # never let the loop die (a step fails its requests itself)
                log.exception("engine step failed")


class AsyncEngine:
    """The asyncio face of an Engine whose background loop runs (started here).

    ``async for item in aengine.stream(prompt, params)`` yields StepEvents, then the
    GenerationResult; ``await aengine.generate(...)``. Admission errors (EngineBusyError,
    EngineClosedError) and validation errors (ValueError) are raised by the first ``__anext__``,
    before anything was generated. Leaving the loop early, or cancelling the task (a client
    that disconnected), aborts the request.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine.start()

    async def stream(self, prompt: Prompt, params: GenerationParams | None = None,
                     request_id: str | None = None, canvas: Sequence[int] | None = None, *,
                     events: bool = True) -> AsyncIterator[StepEvent | GenerationResult]:
        """events=False yields only the GenerationResult."""
        if not self.engine.started:
            raise EngineClosedError("the engine's background loop was stopped")
        loop = asyncio.get_running_loop()
        box: asyncio.Queue = asyncio.Queue()

        def sink(item: Any) -> None:
            loop.call_soon_threadsafe(box.put_nowait, item)

        request_id = request_id or new_request_id()
        # tokenising a long prompt must not block the event loop
        await asyncio.to_thread(self.engine.submit, prompt, params, request_id, canvas, sink,
                                events)
        finished = False
        try:
            while not finished:
                item = await box.get()
                finished = isinstance(item, (GenerationResult, BaseException))
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            if not finished:
                self.engine.abort(request_id)

    async def generate(self, prompt: Prompt, params: GenerationParams | None = None,
                       request_id: str | None = None) -> GenerationResult:
        result = None
        async for item in self.stream(prompt, params, request_id, events=False):
            result = item
        assert isinstance(result, GenerationResult)
        return result

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)

    async def drain(self, timeout: float | None = 30.0) -> bool:
        return await asyncio.to_thread(self.engine.drain, timeout)

    @property
    def queue_depth(self) -> int:
        return self.engine.stats()["queued"]

    @property
    def running(self) -> int:
        return self.engine.stats()["running"]

    def stats(self) -> dict[str, Any]:
        return self.engine.stats()
