"""Admission and the running batch: queues, capacity, abort; no threads.

Admission counts requests, not work: an id is *reserved* before its prompt is tokenised, so a
flood of long prompts is refused before any work is spent on it. Up to ``max_running``
requests run, up to ``max_queue`` more wait; beyond that ``reserve()`` raises
``EngineBusyError`` at once. ``schedule()`` gives the step its batch: waiting requests join in
arrival order as soon as a seat is free (first done, first out: a request that finished in the
last step has already left), and requests that were aborted or passed their deadline are
handed back to be finished. Callers from any thread meet under ``cond``.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from typing import Any

from ..config import EngineBusyError, EngineClosedError, EngineConfig
from .request import Request, Status


class Scheduler:
    def __init__(self, config: EngineConfig) -> None:
        self.max_running, self.max_queue = config.max_running, config.max_queue
        self.cond = threading.Condition()
        self.reserved: dict[str, Request | None] = {}   # None: still being tokenised
        self.early_aborts: set[str] = set()
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.closed = False
        self.latency_s = 1.0                 # moving average of request time, for Retry-After

    # ------------------------------------------------------------ admission
    def reserve(self, request_id: str) -> None:
        """Hold capacity for one request, or raise at once (before any tokenisation)."""
        with self.cond:
            if self.closed:
                raise EngineClosedError("the engine is shutting down and takes no new requests")
            if request_id in self.reserved:
                raise ValueError(f"request_id {request_id!r} is already in use")
            if len(self.reserved) >= self.max_running + self.max_queue:
                raise EngineBusyError(
                    f"the engine is at capacity ({self.max_running} running, "
                    f"{self.max_queue} queued); retry later", retry_after=self.retry_after())
            self.reserved[request_id] = None

    def release(self, request_id: str) -> None:
        """Give back a reservation whose request never got submitted (it failed validation)."""
        with self.cond:
            self.reserved.pop(request_id, None)
            self.early_aborts.discard(request_id)
            self.cond.notify_all()

    def submit(self, req: Request) -> None:
        """Queue a tokenised request on its reservation (an abort that came first holds)."""
        with self.cond:
            if req.request_id in self.early_aborts:
                req.abort_requested = True
            self.reserved[req.request_id] = req
            self.waiting.append(req)
            self.cond.notify_all()

    def abort(self, request_id: str) -> bool:
        """Mark a request aborted; the next ``schedule()`` finishes it."""
        with self.cond:
            if request_id not in self.reserved:
                return False
            req = self.reserved[request_id]
            if req is None:
                self.early_aborts.add(request_id)
            else:
                req.abort_requested = True
            self.cond.notify_all()
            return True

    # ------------------------------------------------------------ the step's batch
    def schedule(self, now: float, stops_at_eos: Any) -> tuple[list[Request], list[Request],
                                                                 list[Request]]:
        """(the running batch, the requests that joined it now, the requests that ended
        without a step: aborted or past their deadline)."""
        with self.cond:
            ended = [r for r in (*self.waiting, *self.running)
                     if r.check_finish(now, stops_at_eos(r)) is not None]
            if ended:
                self.waiting = deque(r for r in self.waiting if not r.finished)
                self.running = [r for r in self.running if not r.finished]
            joined = []
            while self.waiting and len(self.running) < self.max_running:
                req = self.waiting.popleft()
                req.status, req.queue_s = Status.RUNNING, now - req.arrival
                self.running.append(req)
                joined.append(req)
            return list(self.running), joined, ended

    def retire(self, done: list[Request]) -> None:
        """Finished requests leave: their seats are free for the next step."""
        if not done:
            return
        with self.cond:
            gone = {id(r) for r in done}
            self.running = [r for r in self.running if id(r) not in gone]
            for r in done:
                if self.reserved.get(r.request_id) is r:
                    del self.reserved[r.request_id]
                if r.finish is not None and r.finish.value in ("stop", "length"):
                    self.latency_s = 0.8 * self.latency_s + 0.2 * (time.perf_counter()
                                                                   - r.arrival)
            self.cond.notify_all()

    def take_all(self) -> list[Request]:
        """Empty the scheduler (engine stop): every admitted request, to be aborted."""
        with self.cond:
            reqs = list(self.waiting) + self.running
            self.waiting, self.running = deque(), []
            self.reserved.clear()
            self.early_aborts.clear()
            self.cond.notify_all()
            return reqs

    # ------------------------------------------------------------ numbers
    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def busy(self) -> bool:
        return bool(self.reserved)

    def stats(self) -> dict[str, Any]:
        with self.cond:
            n = len(self.reserved)
            running = min(n, self.max_running)
            return {"running": running, "queued": n - running,
                    "max_running": self.max_running, "max_queue": self.max_queue,
                    "draining": self.closed}

    def retry_after(self) -> float:
        queued = max(0, len(self.reserved) - self.max_running)
        return float(min(60, max(1, math.ceil(self.latency_s * (1 + queued)
                                             / self.max_running))))

    def wait_idle(self, timeout: float | None) -> bool:
        """Close admission and wait until nothing is reserved; True if that happened."""
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        with self.cond:
            self.closed = True
            while self.busy and time.monotonic() < deadline:
                self.cond.wait(min(1.0, max(deadline - time.monotonic(), 0.0)))
            return not self.busy
