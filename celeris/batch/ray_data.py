"""Batch jobs on Ray Data: the same validation, store and output records, many engines.

``celeris batch IN --ray [--address A] [--replicas N] [--gpus-per-replica G]`` validates the
whole file in the driver (the same ``read_jobs`` + engine check as in-process), then streams
the jobs still to do through ``map_batches`` over an actor pool: each actor loads one
``Engine`` once and runs every batch it is given through the in-process ``LocalRunner``.
Outcomes come back to the driver, which writes them through the one ``ResultStore``, so a
Ray run resumes, reports and records exactly like an in-process one.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any, Callable, Iterable, Sequence

from .jobs import Job
from .runners import LocalRunner, Outcome

RAY_MISSING = ("--ray needs Ray, an optional dependency: pip install -r requirements-ray.txt "
               "(or run without --ray)")


def import_ray() -> Any:
    try:
        import ray
        import ray.data  # noqa: F401  (ray[data] extra)
    except ImportError:
        raise ValueError(RAY_MISSING) from None
    return ray


def job_to_json(job: Job) -> str:
    return json.dumps(asdict(job))


def job_from_json(text: str) -> Job:
    return Job(**json.loads(text))


def outcome_to_json(outcome: Outcome) -> str:
    return json.dumps({"custom_id": outcome.job.custom_id, "status": outcome.status,
                       "body": outcome.body, "error": outcome.error,
                       "retries": outcome.retries})


def outcome_from_json(text: str, jobs: dict[str, Job]) -> Outcome:
    row = json.loads(text)
    return Outcome(jobs[row["custom_id"]], row["status"], row["body"], row["error"],
                   row["retries"])


class EngineReplica:
    """A Ray Data actor: one Engine per actor, loaded once, used for every batch."""

    def __init__(self, model: str | None, device: str, dtype: str) -> None:
        from celeris import Engine

        self.runner = LocalRunner(Engine.from_pretrained(model, device=device, dtype=dtype))

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[str]]:
        jobs = [job_from_json(str(text)) for text in batch["job"]]
        return {"outcome": [outcome_to_json(o) for o in self.runner.run(jobs)]}


class RayRunner:
    """Validates with an engine in the driver (on CPU) and generates on Ray actors."""

    def __init__(self, validator: LocalRunner, *, model: str | None, device: str, dtype: str,
                 replicas: int, gpus_per_replica: float, cpus_per_replica: float,
                 address: str | None) -> None:
        checks = (("--replicas", replicas, 1), ("--gpus-per-replica", gpus_per_replica, 0),
                  ("--cpus-per-replica", cpus_per_replica, 0))
        for flag, value, low in checks:
            if value < low:
                raise ValueError(f"{flag} must be >= {low}, got {value}")
        self.validator, self.base = validator, validator.base
        self.model, self.device, self.dtype = model, device, dtype
        self.replicas, self.gpus, self.cpus = replicas, gpus_per_replica, cpus_per_replica
        self.address = address

    def check(self, job: Job, params: Any) -> None:
        self.validator.check(job, params)

    def run(self, todo: Sequence[Job], batch_size: int,
            record: Callable[[Outcome], None]) -> None:
        """Generate ``todo`` on the actor pool; ``record`` each outcome as it arrives."""
        if not todo:
            return
        ray = import_ray()
        started = self._connect(ray)
        try:
            by_id = {job.custom_id: job for job in todo}
            for text in self._outcomes(ray, todo, batch_size):
                record(outcome_from_json(text, by_id))
        finally:
            if started:
                ray.shutdown()

    def _connect(self, ray: Any) -> bool:
        """Join the given cluster, reuse a connection already made, or start a local Ray.
        True when this run started (and so must stop) it."""
        if ray.is_initialized():
            return False
        ray.init(address=self.address, include_dashboard=False, log_to_driver=False)
        return True

    def _outcomes(self, ray: Any, todo: Sequence[Job], batch_size: int) -> Iterable[str]:
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False       # the batch's own bar reports progress
        context.print_on_execution_start = False
        dataset = ray.data.from_items([{"job": job_to_json(job)} for job in todo])
        dataset = dataset.map_batches(
            EngineReplica, batch_size=batch_size, batch_format="numpy",
            compute=ray.data.ActorPoolStrategy(size=self.replicas),
            fn_constructor_kwargs={"model": self.model, "device": self.device,
                                   "dtype": self.dtype},
            num_cpus=self.cpus, num_gpus=self.gpus)
        for row in dataset.iter_rows():
            yield row["outcome"]
