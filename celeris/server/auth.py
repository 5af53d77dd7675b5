"""Access control: the API key, and Host-header checks against DNS rebinding.

The key is compared in constant time (``hmac.compare_digest`` on SHA-256 digests, so not even
its length leaks) and is never logged or exported. A server bound to a loopback address is
only reachable from this machine, but a web page could still reach it through a DNS name that
resolves to 127.0.0.1 (DNS rebinding); the browser then sends that name as Host, so Starlette's
``TrustedHostMiddleware`` refuses every Host but the loopback names (400).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from typing import Any, Callable

from fastapi import FastAPI, Request
from starlette.middleware.trustedhost import TrustedHostMiddleware

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
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=list(LOOPBACK_HOSTS),
                       www_redirect=False)
