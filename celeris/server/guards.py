"""ASGI guards for an app mounted next to the API (the playground): calls checked before the
app sees them.

``CallCheck`` reads the JSON body of the POST requests it is told to check and refuses with
422 (a plain message in OpenAI's error shape, one log line without the body) those its
``check`` function finds malformed; the others reach the app with their body replayed.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Callable

from .errors import APIError

log = logging.getLogger("celeris.server")
MAX_CALL_BYTES = 1_000_000   # a checked call's body (uploads go through their own route)

# check(path, body) -> None (let it through) or (what was called, why it is refused)
Check = Callable[[str, Any], "tuple[str, str] | None"]


class CallCheck:
    def __init__(self, app: Any, wants: Callable[[str], bool], check: Check) -> None:
        self.app, self.wants, self.check = app, wants, check

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not self.wants(scope["path"]):
            return await self.app(scope, receive, send)
        body = await _read_body(receive, MAX_CALL_BYTES)
        if body is GONE:
            return
        if body is None:
            error = APIError(413, f"the request body is over {MAX_CALL_BYTES} bytes", None,
                             "body_too_large")
            return await error.response()(scope, receive, send)
        try:
            refusal = self.check(scope["path"], json.loads(body))
        except ValueError:   # not JSON: the app answers that in its own words
            refusal = None
        if refusal is not None:
            name, why = refusal
            log.warning("refused a call to %s: %s", name, why)
            error = APIError(422, f"{name}: {why}", "data", "invalid_inputs",
                             type="invalid_request_error")
            return await error.response()(scope, receive, send)
        await self.app(scope, _replay(body, receive), send)


GONE = object()   # the client left before its body was read


async def _read_body(receive: Callable, limit: int) -> Any:
    """The whole body, None when it is over ``limit`` bytes, or GONE."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return GONE
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if size > limit:
            return None
        if not message.get("more_body"):
            return b"".join(chunks)


def _replay(body: bytes, receive: Callable) -> Callable:
    sent = False

    async def replay() -> dict:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay
