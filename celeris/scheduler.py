"""Request scheduling: admission with backpressure and step-level continuous batching.

One background thread runs a shared ``StepLoop`` (celeris/steploop.py): new requests join it
between steps, finished or aborted ones leave at once, so concurrent callers share batches.

Admission counts *slots*. A slot is reserved before the prompt is tokenised, so a flood of long
prompts is refused before any work is spent on it: up to ``max_running`` slots run, up to
``max_queue`` more wait, and beyond that ``reserve()`` raises ``EngineBusyError`` at once.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from .config import EngineBusyError, EngineClosedError, EngineConfig, EngineOutOfMemoryError
from .outputs import FinishReason, GenerationResult
from .sampler import SamplerRequest
from .steploop import Item, RequestState, Sink, StepLoop, is_final

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Slot:
    running: bool                        # holds a running slot (else a queue slot)
    request_id: str | None = None
    reserved: float = field(default_factory=time.perf_counter)
    state: RequestState | None = None    # set by submit()
    aborted: bool = False                # aborted before it was submitted
    freed: bool = False


class Scheduler:
    """One background thread that runs a shared StepLoop; requests join between steps."""

    def __init__(self, loop: StepLoop, config: EngineConfig,
                 model_lock: threading.Lock | None = None) -> None:
        self.loop = loop
        self.max_running, self.max_queue = config.max_running, config.max_queue
        self.timeout_s = config.request_timeout_s
        self._model_lock = model_lock or threading.Lock()
        self._cond = threading.Condition()
        self._run_slots = 0                          # <= max_running
        self._queued: deque[_Slot] = deque()         # <= max_queue, oldest first
        self._ready: list[RequestState] = []         # running slots not yet in the loop
        self._slots: dict[str, _Slot] = {}           # submitted, result not yet delivered
        self._closed = self._stopping = False
        self._latency_s = 1.0                        # moving average, for Retry-After
        self.step_failures = 0                       # consecutive failed steps (0 after a good one)
        self.step_failures_total = 0
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ lifecycle
    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    @property
    def closed(self) -> bool:
        return self._closed

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="celeris-scheduler",
                                            daemon=True)
            self._thread.start()

    def drain(self, timeout: float | None = None) -> bool:
        """Refuse new requests and wait for admitted ones; True if all finished in time.
        Those still running at the timeout are aborted."""
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._closed = True
            while self._busy() and time.monotonic() < deadline:
                self._cond.wait(min(1.0, max(deadline - time.monotonic(), 0.0)))
            drained = not self._busy()
        if not drained:
            for rid in list(self._slots):
                self.abort(rid)
        return drained

    def stop(self) -> None:
        """Stop the thread; requests still admitted get finish_reason "abort"."""
        with self._cond:
            self._closed = self._stopping = True
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        with self._cond:
            states = self.loop.clear() + self._ready + [s.state for s in self._queued
                                                              if s.state is not None]
            for slot in list(self._slots.values()) + list(self._queued):
                slot.freed = True
            self._ready, self._queued, self._run_slots = [], deque(), 0
            self._slots.clear()
            self._cond.notify_all()
        for st in states:
            _send(st, st.result(FinishReason.ABORT))

    # ------------------------------------------------------------ admission
    def reserve(self, request_id: str | None = None) -> _Slot:
        """Hold a slot for one request, or raise at once (before any tokenisation). With a
        request_id, an abort that arrives before ``submit`` is honoured too."""
        with self._cond:
            if self._closed:
                raise EngineClosedError("the engine is shutting down and takes no new requests")
            if request_id is not None and request_id in self._slots:
                raise ValueError(f"request_id {request_id!r} is already in use")
            if self._run_slots < self.max_running:
                self._run_slots += 1
                slot = _Slot(running=True, request_id=request_id)
            elif len(self._queued) < self.max_queue:
                slot = _Slot(running=False, request_id=request_id)
                self._queued.append(slot)
            else:
                raise EngineBusyError(
                    f"the engine is at capacity ({self.max_running} running, "
                    f"{self.max_queue} queued); retry later", retry_after=self._retry_after())
            if request_id is not None:
                self._slots[request_id] = slot
            return slot

    def release(self, slot: _Slot) -> None:
        """Give back a slot whose request never got submitted (e.g. it failed validation)."""
        with self._cond:
            self._free(slot)

    def submit(self, slot: _Slot, request: SamplerRequest, sink: Sink,
               events: bool = True) -> None:
        """Queue a request on its reserved slot. On error the slot stays reserved: the
        caller releases it."""
        rid = request.request_id
        with self._cond:
            if self._stopping:
                raise EngineClosedError("the engine is shutting down and takes no new requests")
            if self._slots.get(rid, slot) is not slot:
                raise ValueError(f"request_id {rid!r} is already in use")
            st = slot.state = self.loop.new_state(request, slot.reserved, self.timeout_s, sink,
                                                  events)
            slot.request_id = rid
            self._slots[rid] = slot
            if slot.aborted:
                self._free(slot)
            elif slot.running:
                self._ready.append(st)
                self._cond.notify_all()
        if slot.aborted:
            _send(st, st.result(FinishReason.ABORT))

    def abort(self, request_id: str) -> bool:
        """Abort a queued or running request; its slot is free within one step."""
        with self._cond:
            slot = self._slots.get(request_id)
            if slot is None:
                return False
            if slot.state is None:   # still being tokenised: answered at submit()
                slot.aborted = True
                return True
            st = slot.state
            waiting = not slot.running or st in self._ready
            if waiting:
                if st in self._ready:
                    self._ready.remove(st)
                self._free(slot)
            else:
                self.loop.abort(request_id)
        if waiting:
            _send(st, st.result(FinishReason.ABORT))
        return True

    # ------------------------------------------------------------ numbers
    def stats(self) -> dict[str, Any]:
        with self._cond:
            return {"running": self._run_slots, "queued": len(self._queued),
                    "max_running": self.max_running, "max_queue": self.max_queue,
                    "draining": self._closed, "step_failures": self.step_failures,
                    "step_failures_total": self.step_failures_total}

    # ------------------------------------------------------------ internals (hold _cond)
    def _busy(self) -> bool:
        return bool(self._run_slots or self._queued)

    def _retry_after(self) -> float:
        return float(min(60, max(1, math.ceil(self._latency_s * (1 + len(self._queued))
                                             / self.max_running))))

    def _free(self, slot: _Slot) -> None:
        if slot.freed:
            return
        slot.freed = True
        if slot.request_id is not None and self._slots.get(slot.request_id) is slot:
            del self._slots[slot.request_id]
        if slot.running:
            self._run_slots = max(0, self._run_slots - 1)
        elif slot in self._queued:
            self._queued.remove(slot)
        while self._run_slots < self.max_running and self._queued:   # promote, oldest first
            waiting = self._queued.popleft()
            waiting.running = True
            self._run_slots += 1
            if waiting.state is not None:
                self._ready.append(waiting.state)
        self._cond.notify_all()

    def _expire_queued(self, now: float) -> list[RequestState]:
        late = [s for s in self._queued if s.state is not None and now >= s.state.deadline]
        for slot in late:
            self._free(slot)
        return [s.state for s in late]

    # ------------------------------------------------------------ the thread
    def _run(self) -> None:
        while True:
            with self._cond:
                while not (self._stopping or self._ready or len(self.loop)):
                    self._cond.wait(1.0)
                    for st in self._expire_queued(time.perf_counter()):
                        _send(st, st.result(FinishReason.ABORT))
                if self._stopping:
                    return
                admitted, self._ready = self._ready, []
            try:
                items = self._step(admitted)
            except Exception as exc:    # never let the loop die; fail what it held
                log.exception("scheduler step failed")
                self._count_step(failed=True)
                items = self.loop.fail_all(exc)
            self._deliver(items)

    def _step(self, admitted: list[RequestState]) -> list[tuple[RequestState, Item]]:
        now = time.perf_counter()
        for st in admitted:
            st.queue_s = now - st.started
        with self._model_lock, torch.inference_mode():
            items = self.loop.add(admitted)
            forward = len(self.loop) > 0          # step() runs a forward for some group
            stepped = self.loop.step()
        if forward:
            self._count_step(any(isinstance(item, BaseException) for _, item in stepped))
        items += stepped
        with self._cond:
            expired = self._expire_queued(now)
        return items + [(st, st.result(FinishReason.ABORT)) for st in expired]

    def _count_step(self, failed: bool) -> None:
        """Consecutive and total failed steps (the server's /ready and /metrics read them)."""
        self.step_failures = self.step_failures + 1 if failed else 0
        self.step_failures_total += int(failed)

    def _deliver(self, items: list[tuple[RequestState, Item]]) -> None:
        for st, item in items:
            if isinstance(item, BaseException):
                item = capacity_error(item, self._retry_after())
            if is_final(item):   # free the slot before the client sees the result
                with self._cond:
                    slot = self._slots.get(st.request_id)
                    if slot is not None:
                        self._free(slot)
                    if isinstance(item, GenerationResult):
                        self._latency_s = 0.8 * self._latency_s + 0.2 * item.timings.total_s
            _send(st, item)


def capacity_error(exc: BaseException, retry_after: float) -> BaseException:
    """Out of memory is a capacity problem, not a bug: EngineOutOfMemoryError (the server
    answers 503 with Retry-After); any other exception is returned as it is."""
    if not isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return exc
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    error = EngineOutOfMemoryError("the engine ran out of memory for the running batch; "
                                   "retry later or with a shorter request",
                                   retry_after=retry_after)
    error.__cause__ = exc
    return error


def _send(st: RequestState, item: Item) -> None:
    if st.sink is None:
        return
    try:
        st.sink(item)
    except Exception:   # a consumer that went away must not stop the loop
        log.debug("dropping an item for request %s", st.request_id, exc_info=True)
