"""Building the FastAPI app: routes, error handlers, access control, metrics.

``create_app`` makes a fresh app; ``add_routes`` puts the same routes on an existing one (the
playground's app.py calls ``create_app`` and then mounts Gradio at "/": the routes must exist
before that mount, which catches every path).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

from fastapi import FastAPI

from . import errors
from .auth import add_loopback_host_check, is_loopback
from .metrics import StatusCounter
from .routes import register_routes
from .state import EngineSource, ServerState

log = logging.getLogger("celeris.server")
MAX_HEADERS = 64              # header lines per request
MAX_HEADER_BYTES = 16 * 1024  # their names and values together


def create_app(engine: EngineSource, *, api_key: str | None = None, host: str = "127.0.0.1",
               cors_origins: Sequence[str] = (), max_body_bytes: int = 1_000_000,
               model_name: str | None = None, warmup: bool = True,
               on_fatal: Callable[[], None] | None = None) -> FastAPI:
    """The OpenAI-compatible API for ``engine`` (an Engine, or a zero-argument loader run in
    the background while /ready says 503). No docs routes: nothing is served unprotected
    beyond /health and /ready. ``on_fatal`` is called when loading or warming up the model
    has failed for good."""
    app = FastAPI(title="Celeris", docs_url=None, redoc_url=None, openapi_url=None)
    add_routes(app, engine, api_key=api_key, host=host, cors_origins=cors_origins,
               max_body_bytes=max_body_bytes, model_name=model_name, warmup=warmup,
               on_fatal=on_fatal)
    return app


def add_routes(app: FastAPI, engine: EngineSource, *, api_key: str | None = None,
               host: str = "127.0.0.1", cors_origins: Sequence[str] = (),
               max_body_bytes: int = 1_000_000, model_name: str | None = None,
               warmup: bool = True, on_fatal: Callable[[], None] | None = None
               ) -> ServerState:
    """Add the Celeris routes, error handlers and middleware to ``app``; returns the shared
    state (also at ``app.state.celeris``), whose ``drain()`` the shutdown path calls."""
    if not isinstance(max_body_bytes, int) or max_body_bytes < 1:
        raise ValueError(f"max_body_bytes must be a positive integer, got {max_body_bytes!r}")
    state = ServerState(engine, model_name=model_name, max_body_bytes=max_body_bytes,
                        warmup=warmup, on_fatal=on_fatal)
    before = len(app.routes)
    register_routes(app, state, api_key)
    errors.install(app)
    paths = frozenset(r.path for r in app.routes[before:] if "{" not in r.path)
    app.add_middleware(StatusCounter, metrics=state.metrics, paths=paths)
    app.add_middleware(HeaderLimit, max_headers=MAX_HEADERS, max_bytes=MAX_HEADER_BYTES)
    _add_cors(app, cors_origins)
    loopback = is_loopback(host)
    if loopback:
        add_loopback_host_check(app)   # outermost: checked before anything else
    elif not api_key:
        log.warning("serving on %s, which is reachable from other machines, without an API "
                    "key: anyone who can connect can use the model (set --api-key or "
                    "CELERIS_API_KEY)", host)
    app.state.celeris = state
    return state


def _add_cors(app: FastAPI, origins: Sequence[str]) -> None:
    """CORS only for origins named explicitly (none by default)."""
    origins = list(origins)
    if not origins:
        return
    from fastapi.middleware.cors import CORSMiddleware

    if "*" in origins:
        log.warning("CORS allows every origin: any web page can call this API from a browser")
    app.add_middleware(CORSMiddleware, allow_origins=origins, allow_credentials=False,
                       allow_methods=["GET", "POST"],
                       allow_headers=["Authorization", "Content-Type"])


class HeaderLimit:
    """ASGI middleware: 431 for an HTTP request with more than ``max_headers`` headers or more
    than ``max_bytes`` of them (uvicorn caps only a request head that arrives in pieces)."""

    def __init__(self, app: Any, max_headers: int, max_bytes: int) -> None:
        self.app, self.max_headers, self.max_bytes = app, max_headers, max_bytes

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        headers = scope.get("headers") or ()
        size = sum(len(k) + len(v) for k, v in headers)
        if scope["type"] != "http" or (len(headers) <= self.max_headers and
                                       size <= self.max_bytes):
            return await self.app(scope, receive, send)
        error = errors.APIError(431, f"the request headers are too large ({len(headers)} "
                                f"headers, {size} bytes; the limits are {self.max_headers} "
                                f"and {self.max_bytes} bytes)", None, "headers_too_large",
                                type="invalid_request_error")
        await error.response()(scope, receive, send)
