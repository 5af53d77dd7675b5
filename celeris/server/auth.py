"""Access control: the API key, and Host-header checks against DNS rebinding.

The key is compared in constant time (``hmac.compare_digest`` on SHA-256 digests, so not even
its length leaks) and is never logged or exported. A server bound to a loopback address is
only reachable from this machine, but a web page could still reach it through a DNS name that
resolves to 127.0.0.1 (DNS rebinding); the browser then sends that name as Host, so such
requests are refused.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
from typing import Any, Callable

from fastapi import Request

from .errors import APIError

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def is_loopback(host: str) -> bool:
    """True for localhost and loopback IP literals (127.0.0.0/8, ::1)."""
    name = host.strip().lower().strip("[]")
    if name in LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The host part of a Host header: "127.0.0.1:8000" -> "127.0.0.1", "[::1]:80" -> "::1"."""
    header = header.strip()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


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


class LoopbackHostGuard:
    """ASGI middleware: refuse HTTP and websocket requests whose Host is not a loopback name.

    Installed only for loopback binds; it covers every route of the app, including a UI
    mounted on it.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        host = headers.get(b"host", b"").decode("latin-1")
        if host and is_loopback(host_name(host)):
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        error = APIError(403, "this server only accepts requests addressed to a loopback "
                         "host (localhost, 127.0.0.1, [::1])", None, "invalid_host")
        body = json.dumps(error.body()).encode()
        await send({"type": "http.response.start", "status": 403,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
