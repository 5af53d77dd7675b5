"""Read timeouts for uvicorn's h11 protocol: slow or stalled clients are closed.

uvicorn times out only an idle keep-alive connection between requests; a client that opens a
connection and sends half a request head (or a body that never ends) holds it, and a task,
for as long as it likes ("slowloris"). ``TimedH11Protocol`` adds the two timeouts web servers
have: the request head must arrive whole within ``head_timeout_s`` of its first byte (or of
the connection opening), an absolute deadline that trickling bytes does not extend; and a
request body may pause at most ``body_timeout_s`` between chunks. Pauses that uvicorn makes
itself (reading paused while the app has not consumed the body yet) do not count.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEAD_TIMEOUT_S = 10.0   # a request head, from its first byte (nginx: client_header_timeout)
BODY_TIMEOUT_S = 30.0   # the longest pause between two pieces of a request body


class TimedH11Protocol(H11Protocol):
    head_timeout_s = HEAD_TIMEOUT_S
    body_timeout_s = BODY_TIMEOUT_S

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        self._read_timer: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._arm(self.head_timeout_s)   # the first request's head

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow_request()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow_request()          # a pipelined request may be under way

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        self._disarm()                  # the websocket protocol takes the connection over
        super().handle_websocket_upgrade(event)

    # ------------------------------------------------------------------ timers
    def _follow_request(self) -> None:
        """Head in progress: keep its deadline (arm it at its first byte). Body in progress:
        restart the pause timer. Request complete: nothing to wait for."""
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            self._arm(self.body_timeout_s)
        elif state is h11.IDLE:
            if self._read_timer is None and self.conn.trailing_data[0]:
                self._arm(self.head_timeout_s)
        else:
            self._disarm()

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._read_timer = self.loop.call_later(seconds, self._expired, seconds)

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _expired(self, seconds: float) -> None:
        self._read_timer = None
        if self.transport.is_closing():
            return
        if self.flow.read_paused:       # our own back-pressure, not the client's slowness
            self._arm(seconds)
            return
        self.logger.info("closing a connection whose request did not arrive within %g s",
                         seconds)
        self.transport.close()


def timed_h11(head_timeout_s: float = HEAD_TIMEOUT_S,
              body_timeout_s: float = BODY_TIMEOUT_S) -> type[TimedH11Protocol]:
    """The protocol class for ``uvicorn.Config(http=...)`` with these timeouts."""
    for name, value in (("head_timeout_s", head_timeout_s), ("body_timeout_s", body_timeout_s)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    return type("TimedH11Protocol", (TimedH11Protocol,),
                {"head_timeout_s": float(head_timeout_s),
                 "body_timeout_s": float(body_timeout_s)})
