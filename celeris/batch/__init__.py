"""JSONL batch jobs: ``python -m celeris batch INPUT.jsonl --output OUT.jsonl [...]``.

The whole input is validated before anything is generated; each result is appended to OUT
(or the error file) as one fsync'd line the moment it is ready; a rerun resumes where the last
one stopped. Seeds come from the ids, so a resumed job writes what an uninterrupted one would.
Jobs run in-process, on a remote server (``--url``) or on Ray Data actors (``--ray``); all
three share the validation, the store and the output records.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from .jobs import Invalid, Job, file_sha256, read_jobs
from .ray_data import RayRunner, import_ray
from .runners import LocalRunner, Outcome, RemoteRunner, ServerUnreachable, output_record
from .store import ResultStore

DEFAULT_CONCURRENCY = 8


@dataclass
class Summary:
    total: int = 0
    completed: int = 0
    failed: int = 0
    resumed: int = 0
    retried: int = 0
    tokens: int = 0
    seconds: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def line(self) -> str:
        return (f"total {self.total}, completed {self.completed}, failed {self.failed}, "
                f"already done before this run {self.resumed}, retried {self.retried}, "
                f"tokens {self.tokens} in {self.seconds:.1f} s ({self.tokens_per_s:.1f} tok/s)")


def _logger(path: Path) -> logging.Logger:
    log = logging.getLogger(f"celeris.batch.{path}")
    log.setLevel(logging.INFO)
    log.propagate = False
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log.addHandler(handler)
    return log


def invalid_record(item: Invalid) -> dict[str, Any]:
    return {"id": None, "custom_id": item.custom_id, "line": item.line, "response": None,
            "error": {"code": "invalid_request", "message": str(item)}}


def _bar(total: int, initial: int) -> Any:
    from tqdm import tqdm
    return tqdm(total=total, initial=initial, unit="req", dynamic_ncols=True, file=sys.stderr,
                disable=None, desc="batch")


def _chunks(items: Sequence[Job], size: int) -> Iterable[list[Job]]:
    for i in range(0, len(items), size):
        yield list(items[i:i + size])


def _record(store: ResultStore, outcome: Outcome, summary: Summary, log: logging.Logger
            ) -> None:
    kind = "ok" if outcome.ok else "failed"
    store.write(kind, output_record(outcome))
    summary.retried += outcome.retries
    summary.tokens += outcome.completion_tokens
    if outcome.ok:
        log.info("done %s (line %d, %d tokens, %d retries)", outcome.job.custom_id,
                 outcome.job.line, outcome.completion_tokens, outcome.retries)
    else:
        log.warning("failed %s (line %d): %s", outcome.job.custom_id, outcome.job.line,
                    outcome.error)


def _run_local(runner: LocalRunner, todo: list[Job], concurrency: int, store: ResultStore,
               summary: Summary, log: logging.Logger, bar: Any) -> None:
    for chunk in _chunks(todo, concurrency):
        for outcome in runner.run(chunk):
            _record(store, outcome, summary, log)
            bar.update(1)


def _run_remote(runner: RemoteRunner, todo: list[Job], concurrency: int, store: ResultStore,
                summary: Summary, log: logging.Logger, bar: Any) -> None:
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        for future in as_completed([pool.submit(runner.run_one, job) for job in todo]):
            _record(store, future.result(), summary, log)
            bar.update(1)


def _run_ray(runner: RayRunner, todo: list[Job], concurrency: int, store: ResultStore,
             summary: Summary, log: logging.Logger, bar: Any) -> None:
    def record(outcome: Outcome) -> None:
        _record(store, outcome, summary, log)
        bar.update(1)

    runner.run(todo, concurrency, record)


def _ray_runner(args: argparse.Namespace, validator: LocalRunner) -> RayRunner:
    model = args.model
    if model and Path(model).exists():
        model = str(Path(model).resolve())    # actors may not share the driver's cwd
    given = {name: getattr(args, name, None) for name in
             ("replicas", "gpus_per_replica", "cpus_per_replica", "address")}
    return RayRunner(validator, model=model, device=getattr(args, "device", "auto"),
                     dtype=getattr(args, "dtype", "auto"),
                     replicas=2 if given["replicas"] is None else given["replicas"],
                     gpus_per_replica=given["gpus_per_replica"] or 0.0,
                     cpus_per_replica=1.0 if given["cpus_per_replica"] is None
                     else given["cpus_per_replica"], address=given["address"])


def _check_mode(args: argparse.Namespace) -> bool:
    """True for a Ray run; refuses flags that belong to another mode."""
    ray = bool(getattr(args, "ray", False))
    if args.url and (args.model or ray):
        raise ValueError("--url (remote) cannot be combined with --model or --ray")
    ray_only = [flag for flag, dest in (("--address", "address"), ("--replicas", "replicas"),
                                        ("--gpus-per-replica", "gpus_per_replica"),
                                        ("--cpus-per-replica", "cpus_per_replica"))
                if getattr(args, dest, None) is not None]
    if ray_only and not ray:
        raise ValueError(f"{', '.join(ray_only)} only apply with --ray")
    return ray


def _make_runner(args: argparse.Namespace) -> tuple[Any, Any, dict[str, Any]]:
    """(runner, base params for validation, facts for the sidecar)."""
    from celeris import Engine, GenerationParams

    ray = _check_mode(args)
    if ray:
        import_ray()            # a missing Ray is reported before the model is loaded
    if args.url:
        if args.model:
            raise ValueError("give either --model (in-process) or --url (remote), not both")
        api_key = args.api_key or os.environ.get("CELERIS_API_KEY") or None
        retries = getattr(args, "max_retries", None)
        try:
            runner = RemoteRunner(args.url, api_key,
                                  max_retries=6 if retries is None else retries)
        except Exception as exc:    # httpx's InvalidURL, from the client the runner builds
            if "InvalidURL" not in type(exc).__name__:
                raise
            raise ValueError(f"--url {args.url!r} is not a valid URL: {exc}") from None
        runner.check_reachable()   # before validating (which may ask it for its models)
        return runner, GenerationParams(), {"url": args.url}
    device = "cpu" if ray else getattr(args, "device", "auto")   # Ray: the driver only checks
    engine = Engine.from_pretrained(args.model, device=device,
                                    dtype=getattr(args, "dtype", "auto"))
    runner = LocalRunner(engine)
    facts = {"model": engine.info()["path"]}
    if ray:
        return _ray_runner(args, runner), runner.base, {**facts, "ray": True}
    return runner, runner.base, facts


def _validate(input_path: Path, runner: Any, base: Any, skip_invalid: bool
              ) -> tuple[list[Job], list[Invalid], int]:
    jobs, invalid, total = read_jobs(input_path, base, runner.check)
    if invalid and not skip_invalid:
        listed = "\n  ".join(str(i) for i in invalid[:50])
        more = f"\n  ... and {len(invalid) - 50} more" if len(invalid) > 50 else ""
        raise ValueError(f"{len(invalid)} invalid line(s) in {input_path}; nothing was "
                         f"generated (fix them, or pass --skip-invalid to send them to the "
                         f"error file):\n  {listed}{more}")
    return jobs, invalid, total


def run_job(args: argparse.Namespace) -> Summary:
    input_path = Path(args.input)
    if not input_path.is_file():
        raise FileNotFoundError(f"input file not found: {input_path}")
    output = Path(args.output or input_path.with_name(input_path.stem + ".out.jsonl"))
    errors = Path(args.errors or output.with_name(output.stem + ".errors.jsonl"))
    concurrency = DEFAULT_CONCURRENCY if args.concurrency is None else args.concurrency
    if concurrency < 1:
        raise ValueError(f"--concurrency must be >= 1, got {concurrency}")
    runner, base, facts = _make_runner(args)
    jobs, invalid, total = _validate(input_path, runner, base, args.skip_invalid)
    log = _logger(Path(getattr(args, "log", None) or output.with_name(output.name + ".log")))
    with ResultStore(output, errors, file_sha256(input_path), args.restart,
                     {"input": str(input_path), **facts}) as store:
        summary = Summary(total=total)
        summary.resumed = sum(store.is_done(k) for k in [j.custom_id for j in jobs] +
                              [i.key for i in invalid])
        log.info("start: %s -> %s, %d lines, %d invalid, %d already done", input_path, output,
                 total, len(invalid), summary.resumed)
        for item in invalid:
            if not store.is_done(item.key):
                store.write("failed", invalid_record(item))
                log.warning("invalid %s", item)
        todo = [j for j in jobs if not store.is_done(j.custom_id)]
        bar = _bar(total, total - len(todo))
        start = time.perf_counter()
        try:
            run = {LocalRunner: _run_local, RemoteRunner: _run_remote,
                   RayRunner: _run_ray}[type(runner)]
            run(runner, todo, concurrency, store, summary, log, bar)
        finally:
            bar.close()
            summary.seconds = time.perf_counter() - start
            summary.completed, summary.failed = len(store.done_ok), store.num_failed
            log.info("summary: %s", summary.line())
            for handler in list(log.handlers):
                log.removeHandler(handler)
                handler.close()
    return summary


def main(args: argparse.Namespace) -> int:
    try:
        summary = run_job(args)
    except ServerUnreachable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"batch: {summary.line()}")
    return 0 if summary.failed == 0 else 1


__all__ = ["main", "run_job", "Summary"]
