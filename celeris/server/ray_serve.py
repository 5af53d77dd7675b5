"""``python -m celeris serve --ray``: the same API app, served by Ray Serve replicas.

Each replica loads one ``Engine`` and builds the app with ``create_app`` (the routes, auth,
errors, streaming, /health and /metrics of the plain server: nothing is re-implemented here).
Ray Serve's proxy spreads requests over the replicas and starts a new replica when one dies.
Metrics are per replica: a scrape of /metrics reads whichever replica answers it.

Autoscaling: ``--autoscale MIN:MAX`` replaces ``--replicas N`` with Ray Serve's autoscaler
(replicas are added while more than ``AUTOSCALE_TARGET`` requests are in flight per replica).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from typing import Any

from .. import Engine, EngineConfig
from .app import create_app

log = logging.getLogger("celeris.server")
RAY_MISSING = ("--ray needs Ray Serve, an optional dependency: pip install -r "
               "requirements-ray.txt (or run without --ray)")
APP_NAME, DEPLOYMENT_NAME = "celeris", "Celeris"
AUTOSCALE_TARGET = 4            # in-flight requests per replica before the autoscaler adds one
REPLICA_HEADER = "x-celeris-replica"
MAX_ONGOING = 64                # per replica; the engine's own scheduler queues and sheds load


def import_serve() -> Any:
    try:
        from ray import serve
    except ImportError:
        raise ValueError(RAY_MISSING) from None
    return serve


class CelerisReplica:
    """One Ray Serve replica: an Engine and the FastAPI app built around it."""

    def __init__(self, model: str | None, api_key: str | None, host: str,
                 engine_options: dict[str, Any]) -> None:
        self.engine = Engine.from_pretrained(model, **engine_options)
        self.api_key, self.host = api_key, host
        self.state: Any = None

    def __serve_build_asgi_app__(self) -> Any:   # Ray Serve calls this after __init__
        from ray import serve

        app = create_app(self.engine, api_key=self.api_key, host=self.host)
        self.state = app.state.celeris
        app.add_middleware(ReplicaHeader, replica=serve.get_replica_context().replica_id.unique_id)
        return app

    def check_health(self) -> None:
        """Ray Serve's health check: a replica whose warm-up failed is replaced."""
        if self.state is not None and self.state.failure:
            raise RuntimeError(self.state.failure)


class ReplicaHeader:
    """ASGI middleware: every HTTP response names the replica that answered it (a plain ASGI
    wrapper, so streamed responses and client disconnects pass through untouched)."""

    def __init__(self, app: Any, replica: str) -> None:
        self.app, self.header = app, (REPLICA_HEADER.encode(), replica.encode())

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_named(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), self.header]}
            await send(message)

        await self.app(scope, receive, send_named)


def parse_autoscale(text: str) -> tuple[int, int]:
    """"MIN:MAX" -> (MIN, MAX) with 0 <= MIN <= MAX and MAX >= 1."""
    try:
        low, high = (int(part) for part in text.split(":"))
    except ValueError:
        raise ValueError(f"--autoscale must be MIN:MAX (two integers), got {text!r}") from None
    if not 0 <= low <= high or high < 1:
        raise ValueError(f"--autoscale MIN:MAX needs 0 <= MIN <= MAX and MAX >= 1, got {text!r}")
    return low, high


def scaling(replicas: int | None, autoscale: str | None) -> dict[str, Any]:
    """The deployment options for a fixed replica count or an autoscaling range."""
    if replicas is not None and autoscale is not None:
        raise ValueError("give either --replicas or --autoscale, not both")
    if autoscale is not None:
        low, high = parse_autoscale(autoscale)
        return {"autoscaling_config": {"min_replicas": low, "max_replicas": high,
                                       "initial_replicas": max(low, 1),
                                       "target_ongoing_requests": AUTOSCALE_TARGET}}
    count = 2 if replicas is None else replicas
    if count < 1:
        raise ValueError(f"--replicas must be >= 1, got {count}")
    return {"num_replicas": count}


def application(model: str | None = None, *, api_key: str | None = None,
                host: str = "127.0.0.1", replicas: int | None = None,
                autoscale: str | None = None, cpus_per_replica: float = 1.0,
                gpus_per_replica: float = 0.0, **engine_options: Any) -> Any:
    """The Ray Serve application (``serve.run`` it): the Celeris API on N replicas."""
    serve = import_serve()
    EngineConfig(**engine_options)                       # bad options fail before deploying
    for flag, value in (("--cpus-per-replica", cpus_per_replica),
                        ("--gpus-per-replica", gpus_per_replica)):
        if value < 0:
            raise ValueError(f"{flag} must be >= 0, got {value}")
    deployment = serve.deployment(name=DEPLOYMENT_NAME)(serve.ingress()(CelerisReplica))
    deployment = deployment.options(
        ray_actor_options={"num_cpus": cpus_per_replica, "num_gpus": gpus_per_replica},
        max_ongoing_requests=MAX_ONGOING, health_check_period_s=2,
        **scaling(replicas, autoscale))
    return deployment.bind(model, api_key, host, engine_options)


def main(args: argparse.Namespace) -> int:
    """Start (or join, with --address) Ray, deploy, and serve until Ctrl+C."""
    serve = import_serve()
    import ray

    engine_options = {k: v for k in ("max_running", "max_queue", "device", "dtype", "compile",
                                     "quantize")
                      if (v := getattr(args, k, None)) is not None}
    app = application(
        getattr(args, "model", None),
        api_key=getattr(args, "api_key", None) or os.environ.get("CELERIS_API_KEY") or None,
        host=args.host, replicas=getattr(args, "replicas", None),
        autoscale=getattr(args, "autoscale", None),
        cpus_per_replica=_or(getattr(args, "cpus_per_replica", None), 1.0),
        gpus_per_replica=_or(getattr(args, "gpus_per_replica", None), 0.0), **engine_options)
    started = not ray.is_initialized()
    if started:
        ray.init(address=getattr(args, "address", None), include_dashboard=False)
    signal.signal(signal.SIGTERM, _interrupt)    # docker stop / kill: the same clean exit
    try:
        serve.start(http_options={"host": args.host, "port": args.port})
        serve.run(app, name=APP_NAME, route_prefix="/")
        print(f"Celeris on Ray Serve: http://{args.host}:{args.port}/v1   (Ctrl+C to stop)",
              flush=True)
        threading.Event().wait()
    except KeyboardInterrupt:
        log.info("stopping: deleting the Serve application")
    finally:
        _stop(serve, ray, started)
    return 0


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _stop(serve: Any, ray: Any, started: bool) -> None:
    """Delete the app; a Ray this command started is shut down with it (Serve included)."""
    try:
        serve.delete(APP_NAME)
    finally:
        if started:
            serve.shutdown()
            ray.shutdown()


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value
