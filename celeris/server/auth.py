"""Access control: the API key, and Host-header checks against DNS rebinding.

The key is compared in constant time (``hmac.compare_digest`` on SHA-256 digests, so not even
its length leaks) and is never logged or exported. A server bound to a loopback address is
only reachable from this machine, but a web page could still reach it through a DNS name that
resolves to 127.0.0.1 (DNS rebinding); the browser then sends that name as Host, so
``LoopbackHostCheck`` refuses every Host but the loopback names: 403 in OpenAI's error shape.
A browser app behind a login (the playground) is guarded by ``LoginGate`` (only its login page
answers without a session) and ``same_origin_only`` (no cross-origin access).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from typing import Any, Callable

from fastapi import FastAPI, Request

from .errors import APIError

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})
# Host headers a loopback server answers (Starlette keeps the brackets of IPv6 literals).
LOOPBACK_HOSTS = ("localhost", "*.localhost", "localhost.localdomain", "ip6-localhost",
                  "127.0.0.1", "[::1]")


def is_loopback(host: str) -> bool:
    """True for localhost and loopback IP literals (127.0.0.0/8, ::1)."""
    name = host.strip().lower().strip("[]")
    if name in LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8")).digest()


def api_key_dependency(api_key: str | None) -> Callable[[Request], Any]:
    """A FastAPI dependency that demands ``Authorization: Bearer <key>`` (no-op without key)."""
    expected = _digest(api_key) if api_key else None

    async def require_api_key(request: Request) -> None:
        if expected is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        ok = scheme.lower() == "bearer" and hmac.compare_digest(_digest(token.strip()),
                                                                expected)
        if not ok:
            raise APIError(401, "missing or invalid API key: send 'Authorization: Bearer "
                           "<key>'", None, "invalid_api_key", {"WWW-Authenticate": "Bearer"})

    return require_api_key


def add_loopback_host_check(app: FastAPI) -> None:
    """Refuse HTTP and websocket requests whose Host is not a loopback name (every route of
    the app, a UI mounted on it included). Add it last: it must run first."""
    app.add_middleware(LoopbackHostCheck)


def loopback_host(host_header: str) -> bool:
    """Whether a Host header names this machine's loopback (port and case ignored)."""
    host = host_header.strip().lower()
    if host.startswith("["):   # an IPv6 literal: "[::1]" or "[::1]:8000"
        name = host[:host.find("]") + 1] if "]" in host else host
    else:
        name = host.split(":", 1)[0]
    return any(name == allowed or (allowed.startswith("*.") and name.endswith(allowed[1:]))
               for allowed in LOOPBACK_HOSTS)


class LoopbackHostCheck:
    """ASGI middleware: 403 (OpenAI's error shape) for a request whose Host is not a loopback
    name; a websocket is closed before it is accepted."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or ())
        host = headers.get(b"host", b"").decode("latin-1")
        if loopback_host(host):
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        shown = host[:100] or "none"
        error = APIError(403, f"Host {shown!r} is not allowed: this server listens on a "
                         "loopback address and answers only localhost, 127.0.0.1 or [::1]",
                         None, "host_not_allowed")
        await error.response()(scope, receive, send)


class LoginGate:
    """ASGI middleware for a browser app behind a login (the playground with a key set): a
    request whose session is not ``logged_in(scope)`` gets 401, unless ``public(method,
    path)`` says the login page itself needs it (its HTML, scripts, styles, fonts); a
    websocket is closed before it is accepted."""

    def __init__(self, app: Any, public: Callable[[str, str], bool],
                 logged_in: Callable[[dict], bool]) -> None:
        self.app, self.public, self.logged_in = app, public, logged_in

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket") or self.logged_in(scope) or (
                kind == "http" and self.public(scope["method"], scope["path"])):
            return await self.app(scope, receive, send)
        if kind == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        error = APIError(401, "log in first: open the playground's page and enter the API key "
                         "as the password", None, "login_required")
        await error.response()(scope, receive, send)


def same_origin_only(app: FastAPI) -> None:
    """No cross-origin access to ``app``: a CORS policy that names no origin (a mounted
    Gradio app then adds none of its own, which would allow any localhost origin with
    credentials); the app's own pages need no CORS."""
    from fastapi.middleware.cors import CORSMiddleware

    app.add_middleware(CORSMiddleware, allow_origins=[], allow_credentials=False)
