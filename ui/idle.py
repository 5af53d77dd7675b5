"""Gradio's event queue without its idle polling: an idle playground costs no CPU.

Gradio 6.31's queue runs two loops for as long as the server lives: one looks for an event
to start every millisecond, the other for progress to send every 10 ms, visitor or not
(about 45 ms of CPU a second on a small VM with nothing to do). ``QuietQueue`` keeps
Gradio's own dispatch and progress code and only changes when the loops wake up: they wait
for a signal, set when an event is queued and when a running one ends (which frees its
concurrency slot), and run at Gradio's pace only while there is work. A one-second timeout
on the wait is a safety net against a wake-up this class does not know of, not a poll that
matters (one cheap wake-up a second).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import gradio as gr
from gradio.queueing import Queue
from gradio.utils import run_coro_in_background, set_task_name

SAFETY_WAKE_S = 1.0


class QuietQueue(Queue):
    """Gradio's Queue whose loops sleep on a wake-up signal instead of polling when idle."""

    def _wake(self) -> asyncio.Event:
        event = self.__dict__.get("_celeris_wake")
        if event is None:
            event = self.__dict__["_celeris_wake"] = asyncio.Event()
        return event

    def _work(self) -> None:
        self._wake().set()

    async def _until_work(self) -> None:
        """Sleep until an event is queued or a running one ended (or the safety timeout)."""
        wake = self._wake()
        try:
            await asyncio.wait_for(wake.wait(), SAFETY_WAKE_S)
        except asyncio.TimeoutError:
            pass
        wake.clear()

    async def push(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().push(*args, **kwargs)
        finally:
            self._work()

    async def process_events(self, *args: Any, **kwargs: Any) -> None:
        try:
            await super().process_events(*args, **kwargs)
        finally:
            self._work()   # a concurrency slot is free: a waiting event may start

    async def start_processing(self) -> None:
        """Gradio's dispatch loop, waiting for a wake-up where Gradio sleeps 1 ms."""
        try:
            while not self.stopped:
                batch = None
                if len(self) and None in self.active_jobs:
                    async with self.delete_lock:
                        batch = self.get_events()
                if batch is None:   # nothing queued, no free worker, or every group full
                    await self._until_work()
                    continue
                self._launch(*batch)
        finally:
            self.stopped = True
            self._cancel_asyncio_tasks()

    def _launch(self, events: list[Any], batch: bool, concurrency_id: str) -> None:
        """Start ``events`` as Gradio 6.31's ``Queue.start_processing`` does."""
        self.active_jobs[self.active_jobs.index(None)] = events
        event_queue = self.event_queue_per_concurrency_id[concurrency_id]
        event_queue.current_concurrency += 1
        start_time = time.time()
        fn = events[0].fn
        event_queue.start_times_per_fn[fn].add(start_time)
        for event in events:
            if (a := self.event_analytics.get(event._id)) is not None:
                a["status"] = "processing"
        task = run_coro_in_background(self.process_events, events, batch, start_time, fn)
        set_task_name(task, events[0].session_hash, fn._id, events[0]._id, batch)
        self._asyncio_tasks.add(task)
        task.add_done_callback(self._asyncio_tasks.discard)
        if self.live_updates:
            self.broadcast_estimations(concurrency_id)

    async def start_progress_updates(self) -> None:
        """Gradio's progress loop, entered only while an event runs."""
        while not self.stopped:
            if not any(self.active_jobs):
                await self._until_work()
                continue
            for event in [e for job in self.active_jobs if job is not None for e in job]:
                if event.progress_pending and event.progress:
                    event.progress_pending = False
                    self.send_message(event, event.progress)
            await asyncio.sleep(self.progress_update_sleep_when_free)


def quiet_queue(demo: gr.Blocks, **options: Any) -> gr.Blocks:
    """``demo.queue(**options)`` with a queue that sleeps while idle (see QuietQueue)."""
    demo.queue(**options)
    demo._queue.__class__ = QuietQueue
    return demo
